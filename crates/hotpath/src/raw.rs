//! The raw profile: a run's tables written as they are (`run --profile FILE`), in a versioned
//! binary file that `hotpath report` renders later, and [`assemble`], the one function that
//! turns the tables into a [`Report`] whether a run renders it at once or `hotpath report`
//! reads it back.
//!
//! What a run writes: the ids' metadata (each id's block summary, what a superblock or side
//! exit stands for), the monitor's [`Counts`] (event pairs, system calls, last events), the
//! run's facts (program, argv, ending, translation and ring-wait totals), the thread rows the
//! monitor made as threads ended, the path profile when paths were recorded (rendered: its
//! function names), and the guest's modules with their files' identities (and the vDSO's
//! bytes, which no file holds). What it leaves to `hotpath report`: reading symbols, summing
//! ids by guest address, and JSON. The file is an 8-byte magic, a little-endian `u32` version,
//! the CRC-32 of the rest, and the rest in [postcard](https://docs.rs/postcard); a reader
//! refuses other versions with an error that names them, and a damaged file by its checksum.

use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use hotpath_events::{IdKind, NewBlock};
use hotpath_ir::{BlockId, BlockSummary};
use hotpath_monitor::{add_code, report_of, thread_row_of, Counts, Rows, RunInfo, Tables};
use hotpath_report::{write_atomically, Ending, PathProfile, Report, ReportError, Thread};
use hotpath_translator::cache::modules::{FileId, GuestModule};
use serde::{Deserialize, Serialize};

use crate::modules::ModuleMap;

/// The first bytes of a raw profile.
pub const MAGIC: &[u8; 8] = b"HPRAWPRF";

/// The format's version: bumped whenever [`RawProfile`]'s layout changes.
pub const VERSION: u32 = 1;

/// What a report says beside the process's tables, as the end of a run knows it.
pub struct Parts {
    /// Program, arguments, ending, translation totals.
    pub run: RunInfo,
    /// Thread rows in the order the threads started; empty when `only_row` is set.
    pub threads: Vec<Thread>,
    /// The process ran one thread: its row is read off the report (`tid`, events, ring
    /// waits, ring wait ns).
    pub only_row: Option<(u32, u64, u64, u64)>,
    /// Ring waits over every thread: how many, and nanoseconds.
    pub ring_waits: u64,
    pub ring_wait_ns: u64,
    /// The monitor threads' busy time, nanoseconds.
    pub monitor_busy_ns: u64,
    /// The process's path profile (the one thread's, or the threads' summed).
    pub path_profile: Option<PathProfile>,
}

/// The report of `tables` (every id's metadata known) and `parts`, blocks named with
/// `modules`' symbols, with the tables' `rows`: what `run --report` writes and what `hotpath
/// report` renders from a raw profile (the same function, so the two agree).
pub fn assemble(tables: &Tables, parts: Parts, modules: &ModuleMap, rows: Rows) -> Report {
    let symbolize = |addr: u64| modules.symbolize(addr);
    let mut report = report_of(tables, &symbolize, parts.run, rows);
    report.threads = match parts.only_row {
        Some((tid, events, w, w_ns)) => vec![thread_row_of(tid, &report, events, w, w_ns)],
        None => parts.threads,
    };
    report.totals.ring_waits = parts.ring_waits;
    report.totals.ring_wait_ns = parts.ring_wait_ns;
    report.totals.monitor_busy_ns = parts.monitor_busy_ns;
    report.attribute_modules(modules.profiles.clone());
    if parts.path_profile.is_some() {
        // The hot paths' listing disassembles their blocks.
        add_code(&mut report, tables.entries());
        report.path_profile = parts.path_profile;
    }
    report
}

/// One id's metadata as the file keeps it.
#[derive(Serialize, Deserialize)]
struct RawId {
    summary: BlockSummary,
    kind: RawKind,
    /// The block's guest bytes, kept only when a path profile needs them (empty otherwise).
    code: Vec<u8>,
}

/// [`IdKind`] as the file keeps it.
#[derive(Serialize, Deserialize)]
enum RawKind {
    Block,
    Superblock(Vec<BlockId>),
    SideExit { superblock: BlockId, after: u32 },
}

/// A guest module as the file keeps it.
#[derive(Serialize, Deserialize)]
struct RawModule {
    /// The path's bytes.
    path: Vec<u8>,
    start: u64,
    end: u64,
    unloaded: bool,
    file: Option<FileId>,
    /// The image's bytes when no file holds them (the vDSO).
    image: Option<Vec<u8>>,
}

/// A raw profile's contents (after the magic and version).
#[derive(Serialize, Deserialize)]
struct RawProfile {
    program: String,
    argv: Vec<String>,
    /// [`Ending`] as JSON (its serde form is tagged, which postcard cannot read back).
    ending: String,
    blocks_translated: u64,
    blocks_loaded: u64,
    translation_cache_errors: u64,
    translation_ns: u64,
    ring_waits: u64,
    ring_wait_ns: u64,
    monitor_busy_ns: u64,
    ids: Vec<RawId>,
    counts: Counts,
    /// The thread rows, as JSON (they hold path profiles, whose optional fields postcard
    /// cannot skip).
    threads: String,
    only_row: Option<(u32, u64, u64, u64)>,
    /// The path profile, as JSON.
    path_profile: Option<String>,
    modules: Vec<RawModule>,
}

/// Writes the raw profile of `tables` and `parts` for a guest whose modules are `modules` to
/// `path` (through a temporary file renamed into place, as the JSON report).
///
/// # Errors
/// [`ReportError::Io`] if the file cannot be written or renamed.
pub fn write(
    path: &Path,
    tables: &Tables,
    parts: &Parts,
    modules: &[GuestModule],
) -> Result<(), ReportError> {
    let with_code = parts.path_profile.is_some();
    let ids = tables
        .entries()
        .map(|b| RawId {
            summary: b.summary,
            kind: match &b.kind {
                IdKind::Block => RawKind::Block,
                IdKind::Superblock { blocks } => RawKind::Superblock(blocks.to_vec()),
                IdKind::SideExit { superblock, after } => RawKind::SideExit {
                    superblock: *superblock,
                    after: *after,
                },
            },
            code: if with_code {
                b.code.to_vec()
            } else {
                Vec::new()
            },
        })
        .collect();
    let raw = RawProfile {
        program: parts.run.program.clone(),
        argv: parts.run.argv.clone(),
        ending: json(&parts.run.ending),
        blocks_translated: parts.run.blocks_translated,
        blocks_loaded: parts.run.blocks_loaded,
        translation_cache_errors: parts.run.translation_cache_errors,
        translation_ns: parts.run.translation_ns,
        ring_waits: parts.ring_waits,
        ring_wait_ns: parts.ring_wait_ns,
        monitor_busy_ns: parts.monitor_busy_ns,
        ids,
        counts: tables.counts(),
        threads: json(&parts.threads),
        only_row: parts.only_row,
        path_profile: parts.path_profile.as_ref().map(json),
        modules: modules
            .iter()
            .map(|m| RawModule {
                path: m.path.as_os_str().as_bytes().to_vec(),
                start: m.start,
                end: m.end,
                unloaded: m.unloaded,
                file: m.file.clone(),
                image: (m.path == Path::new("[vdso]"))
                    .then(|| crate::modules::vdso_bytes(m))
                    .flatten(),
            })
            .collect(),
    };
    let body = postcard::to_allocvec(&raw).map_err(|e| ReportError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    write_atomically(path, |w| {
        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        w.write_all(&crc32fast::hash(&body).to_le_bytes())?;
        w.write_all(&body)
    })
}

/// The JSON of a report type a raw profile keeps as text.
fn json<T: Serialize>(value: &T) -> String {
    // Report types serialize to JSON without fail (no maps with non-string keys).
    serde_json::to_string(value).expect("a report type serializes")
}

/// Whether `bytes` start like a raw profile.
pub fn is_raw(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// Renders the raw profile `bytes` (read from `path`) as a report, naming blocks with the
/// symbols of the modules' files if they are still the files the run mapped. Returns the
/// report and the paths of the modules whose file changed or went away since.
///
/// # Errors
/// A one-line reason, naming `path`: not a raw profile, another version, or a damaged file.
pub fn render(bytes: &[u8], path: &Path) -> Result<(Report, Vec<String>), String> {
    let damaged = |why: &str| format!("{}: not a usable raw profile ({why})", path.display());
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| damaged("no magic"))?;
    let version = rest
        .get(..4)
        .map(|v| u32::from_le_bytes(v.try_into().expect("four bytes")))
        .ok_or_else(|| damaged("truncated"))?;
    if version != VERSION {
        return Err(format!(
            "{}: raw profile version {version}, this hotpath reads version {VERSION}: render it with the hotpath that wrote it",
            path.display()
        ));
    }
    let (sum, body) = rest[4..]
        .split_at_checked(4)
        .ok_or_else(|| damaged("truncated"))?;
    if crc32fast::hash(body).to_le_bytes() != sum {
        return Err(damaged("its checksum does not match: truncated or changed"));
    }
    let raw: RawProfile = postcard::from_bytes(body).map_err(|e| damaged(&e.to_string()))?;
    fn from_json<T: serde::de::DeserializeOwned>(what: &str, s: &str) -> Result<T, String> {
        serde_json::from_str(s).map_err(|e| format!("{what}: {e}"))
    }
    let ending: Ending = from_json("ending", &raw.ending).map_err(|e| damaged(&e))?;
    let threads: Vec<Thread> = from_json("threads", &raw.threads).map_err(|e| damaged(&e))?;
    let path_profile: Option<PathProfile> = match &raw.path_profile {
        Some(s) => Some(from_json("path profile", s).map_err(|e| damaged(&e))?),
        None => None,
    };
    let mut tables = Tables::default();
    let known = raw.ids.len();
    // What each id is, checked as the monitor made them: a superblock's trace is of earlier
    // basic blocks, a side exit names an earlier superblock and a position in its trace.
    let mut trace_len: Vec<Option<usize>> = Vec::with_capacity(known);
    for (i, id) in raw.ids.into_iter().enumerate() {
        let block = |b: &BlockId| b.index() < i && trace_len[b.index()].is_none();
        let kind = match id.kind {
            RawKind::Block => IdKind::Block,
            RawKind::Superblock(blocks) if !blocks.is_empty() && blocks.iter().all(block) => {
                IdKind::Superblock {
                    blocks: blocks.into(),
                }
            }
            RawKind::SideExit { superblock, after }
                if superblock.index() < i
                    && trace_len[superblock.index()].is_some_and(|n| (after as usize) < n) =>
            {
                IdKind::SideExit { superblock, after }
            }
            _ => return Err(damaged("an id that stands for no block")),
        };
        trace_len.push(match &kind {
            IdKind::Superblock { blocks } => Some(blocks.len()),
            _ => None,
        });
        tables.learn(&NewBlock {
            id: BlockId(i as u32),
            summary: id.summary,
            kind,
            code: id.code.into(),
        });
    }
    let ids_ok = |e: u32| (e as usize) < known;
    if !raw
        .counts
        .edges
        .iter()
        .all(|&(f, t, _)| ids_ok(f) && ids_ok(t))
        || !raw.counts.last.iter().all(|&e| ids_ok(e))
    {
        return Err(damaged("an event out of range"));
    }
    tables.add_counts(&raw.counts);
    let (modules, images): (Vec<GuestModule>, Vec<Option<Vec<u8>>>) = raw
        .modules
        .into_iter()
        .map(|m| {
            (
                GuestModule {
                    path: PathBuf::from(std::ffi::OsString::from_vec(m.path)),
                    start: m.start,
                    end: m.end,
                    unloaded: m.unloaded,
                    file: m.file,
                },
                m.image,
            )
        })
        .unzip();
    let (map, changed) = ModuleMap::read_recorded(&modules, &images);
    let parts = Parts {
        run: RunInfo {
            program: raw.program,
            argv: raw.argv,
            ending,
            blocks_translated: raw.blocks_translated,
            blocks_loaded: raw.blocks_loaded,
            translation_cache_errors: raw.translation_cache_errors,
            translation_ns: raw.translation_ns,
        },
        threads,
        only_row: raw.only_row,
        ring_waits: raw.ring_waits,
        ring_wait_ns: raw.ring_wait_ns,
        monitor_busy_ns: raw.monitor_busy_ns,
        path_profile,
    };
    Ok((assemble(&tables, parts, &map, Rows::All), changed))
}
