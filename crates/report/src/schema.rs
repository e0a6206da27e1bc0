//! The report's types: one serde struct per JSON object of schema [`SCHEMA`]
//! (docs/report-schema.md), written by `hotpath run --report` and read back by every renderer.
//!
//! Reading is strict: a file whose `schema` is not [`SCHEMA`] is refused before anything else
//! is read, and a missing or mistyped field is an error naming its line and column, never a
//! zero.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ReportError;

/// The schema name and version written in every report and required when one is read. The
/// version changes when a field changes meaning or goes away; fields may be added within one.
pub const SCHEMA: &str = "hotpath-report/2";

/// A guest virtual address, written `"0x…"` (lowercase hexadecimal) in the JSON.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Addr(pub u64);

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl Serialize for Addr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Formatted by hand into a buffer: every block and edge has addresses, and going
        // through `fmt` and serde_json's escaping of each piece was a sixth of a report's
        // serialisation.
        let mut buf = [0u8; 18];
        let digits = (64 - self.0.leading_zeros()).div_ceil(4).max(1) as usize;
        buf[..2].copy_from_slice(b"0x");
        for i in 0..digits {
            let nibble = (self.0 >> (4 * (digits - 1 - i))) & 0xf;
            buf[2 + i] = b"0123456789abcdef"[nibble as usize];
        }
        s.serialize_str(std::str::from_utf8(&buf[..2 + digits]).unwrap_or("0x0"))
    }
}

impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Addr, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .map(Addr)
            .ok_or_else(|| serde::de::Error::custom(format!("bad address {s:?} (want \"0x…\")")))
    }
}

/// Bytes written as one lowercase hexadecimal string (a block's guest code).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HexBytes(pub Vec<u8>);

impl Serialize for HexBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use fmt::Write;
        let mut out = String::with_capacity(2 * self.0.len());
        for b in &self.0 {
            let _ = write!(out, "{b:02x}");
        }
        s.serialize_str(&out)
    }
}

impl<'de> Deserialize<'de> for HexBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<HexBytes, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let bad = || serde::de::Error::custom("bad hex bytes");
        if s.len() % 2 != 0 || !s.is_ascii() {
            return Err(bad());
        }
        (0..s.len() / 2)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map(HexBytes)
            .map_err(|_| bad())
    }
}

/// A whole report: the run, its totals and every table, plus path profiles when they were
/// recorded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// Absolute path of the guest executable.
    pub program: String,
    /// The guest's arguments, `argv[0]` included.
    pub argv: Vec<String>,
    /// How the guest ended.
    pub ending: Ending,
    pub totals: Totals,
    /// One per guest thread, in the order they started.
    pub threads: Vec<Thread>,
    /// Every executed block, by address.
    pub blocks: Vec<Block>,
    /// Every ELF image mapped into the guest, in mapping order (the program first).
    pub modules: Vec<Module>,
    /// Direct control transfers between blocks, by `(from, to)`.
    pub edges: Vec<Edge>,
    /// Indirect branch sites, by address.
    pub indirect_jumps: Vec<IndirectSite>,
    /// System calls, by number.
    pub syscalls: Vec<Syscall>,
    /// Superblocks built, most entered first.
    pub superblocks: Vec<Superblock>,
    /// Path profiles (`--paths`), else null.
    pub path_profile: Option<PathProfile>,
}

/// How the guest ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Ending {
    /// It exited with this status.
    Exited { code: i32 },
    /// A signal killed it.
    Signaled { signal: i32, name: String },
    /// hotpath stopped it (a translator error or an unsupported request).
    Error { message: String },
    /// It replaced itself with another program (`execve`).
    Exec,
}

/// Totals over the run, all threads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Block executions.
    pub blocks_executed: u64,
    /// Guest instructions executed: Σ over blocks of count × instructions.
    pub guest_instructions: u64,
    /// Entries of [`Report::blocks`].
    pub distinct_blocks: u64,
    /// Translations made (a block translated again after a flush counts twice).
    pub blocks_translated: u64,
    /// Of those, blocks placed from the persisted translation cache instead of decoded and
    /// emitted (0 in reports written before it existed).
    #[serde(default)]
    pub blocks_loaded: u64,
    /// Translation cache files this run could not write, or 1 for a cache directory it could
    /// not use (not private to the user, not creatable): the run went on without it.
    #[serde(default)]
    pub translation_cache_errors: u64,
    /// Wall time spent translating, all threads, in nanoseconds.
    pub translation_ns: u64,
    /// Events the monitor read (fewer than blocks by what superblocks saved).
    pub events: u64,
    /// Times a guest thread found its ring full and waited for the monitor.
    pub ring_waits: u64,
    /// Time of those waits, in nanoseconds.
    pub ring_wait_ns: u64,
    /// Time the monitor spent on events (not polling an empty ring), in nanoseconds.
    pub monitor_busy_ns: u64,
}

/// A guest address with a count: a block's executions, an indirect target's, a call site's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    pub addr: Addr,
    pub count: u64,
}

/// One guest thread's share of the totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Thread {
    /// Its kernel thread id.
    pub tid: u32,
    /// Ring events it produced.
    pub events: u64,
    pub blocks_executed: u64,
    pub guest_instructions: u64,
    pub ring_waits: u64,
    /// In nanoseconds.
    pub ring_wait_ns: u64,
    /// Its most executed blocks, most executed first (at most 20).
    pub hottest: Vec<Count>,
    /// Its own path profile, when paths were recorded and the process ran more than one
    /// thread (each thread has its shadow stack; the report's `path_profile` sums them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_profile: Option<PathProfile>,
}

/// A block terminator's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Terminator {
    Jump,
    Branch,
    Call,
    /// Cut by the block size limit.
    Fallthrough,
    IndirectJump,
    IndirectCall,
    Return,
    Syscall,
    Trap,
}

impl Terminator {
    /// Its name in the JSON (`indirect_jump`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Terminator::Jump => "jump",
            Terminator::Branch => "branch",
            Terminator::Call => "call",
            Terminator::Fallthrough => "fallthrough",
            Terminator::IndirectJump => "indirect_jump",
            Terminator::IndirectCall => "indirect_call",
            Terminator::Return => "return",
            Terminator::Syscall => "syscall",
            Terminator::Trap => "trap",
        }
    }
}

/// One executed guest block (all its translations and threads together).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    /// Address of its first instruction.
    pub addr: Addr,
    /// Executions.
    pub count: u64,
    /// Guest instructions per execution.
    pub instructions: u32,
    /// Guest code bytes it covers.
    pub bytes: u32,
    pub terminator: Terminator,
    /// `function+0xOFF` in the program, `module!function+0xOFF` or `module+0xOFF` elsewhere.
    pub symbol: Option<String>,
    /// Index in [`Report::modules`] of the module containing it.
    pub module: Option<usize>,
    /// Its address minus that module's base.
    pub offset: Option<Addr>,
    /// Its guest code at report time (with `--paths`, for disassembly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<HexBytes>,
}

/// One ELF image mapped into the guest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Module {
    /// The mapped file (`[vdso]` for the vDSO).
    pub path: String,
    /// Where its file offset 0 is mapped.
    pub base: Addr,
    /// Bytes of address space it spans.
    pub size: u64,
    /// Its GNU build id, lowercase hex.
    pub build_id: Option<String>,
    /// The guest unmapped it before the report (dlclose).
    pub unloaded: bool,
}

impl Module {
    /// Whether guest address `a` lies in the module.
    pub fn contains(&self, a: Addr) -> bool {
        a.0.wrapping_sub(self.base.0) < self.size
    }
}

/// How a direct edge left its source block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeKind {
    Taken,
    NotTaken,
    Jump,
    Call,
    Fallthrough,
    Syscall,
    /// A transfer the terminator does not explain (a signal, a fault).
    Other,
}

/// A direct control transfer between two blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    pub from: Addr,
    pub to: Addr,
    pub kind: EdgeKind,
    /// Times taken.
    pub count: u64,
}

/// How predictable an indirect site is, by its top target's share of its executions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Predictability {
    /// Top share ≥ [`MONOMORPHIC_SHARE`].
    Monomorphic,
    /// Top share ≥ [`MEGAMORPHIC_SHARE`].
    Polymorphic,
    Megamorphic,
}

/// Top-target share at or above which an indirect site is monomorphic.
pub const MONOMORPHIC_SHARE: f64 = 0.9;
/// Top-target share below which an indirect site is megamorphic (between: polymorphic).
pub const MEGAMORPHIC_SHARE: f64 = 0.3;

impl Predictability {
    /// The class of a site executed `count` times whose most frequent target took `top`.
    pub fn of(top: u64, count: u64) -> Predictability {
        let share = if count == 0 {
            1.0
        } else {
            top as f64 / count as f64
        };
        if share >= MONOMORPHIC_SHARE {
            Predictability::Monomorphic
        } else if share >= MEGAMORPHIC_SHARE {
            Predictability::Polymorphic
        } else {
            Predictability::Megamorphic
        }
    }

    /// `monomorphic`, `polymorphic` or `megamorphic`.
    pub fn name(self) -> &'static str {
        match self {
            Predictability::Monomorphic => "monomorphic",
            Predictability::Polymorphic => "polymorphic",
            Predictability::Megamorphic => "megamorphic",
        }
    }
}

/// An indirect branch site and its targets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndirectSite {
    /// Address of the indirect `jmp`, `call` or `ret`.
    pub site: Addr,
    /// `indirect_jump`, `indirect_call` or `return`.
    pub kind: Terminator,
    /// Executions.
    pub count: u64,
    pub predictability: Predictability,
    /// Most frequent first.
    pub targets: Vec<Count>,
}

impl IndirectSite {
    /// The site at `site` of kind `kind` with `targets` (`(address, count)`, any order): its
    /// count is their sum, its predictability their top share.
    pub fn new(
        site: Addr,
        kind: Terminator,
        targets: impl IntoIterator<Item = (Addr, u64)>,
    ) -> IndirectSite {
        let targets = most_frequent_first(targets);
        let count = targets.iter().map(|t| t.count).sum();
        IndirectSite {
            site,
            kind,
            count,
            predictability: Predictability::of(targets.first().map_or(0, |t| t.count), count),
            targets,
        }
    }
}

/// `(address, count)` pairs as [`Count`]s, most frequent first, equal counts by address.
pub fn most_frequent_first(pairs: impl IntoIterator<Item = (Addr, u64)>) -> Vec<Count> {
    most_frequent(pairs, usize::MAX)
}

/// The `n` most frequent of `pairs`, in [`most_frequent_first`]'s order, without sorting the
/// rest (a thread row's twenty of a run's 38,000 blocks).
pub fn most_frequent(pairs: impl IntoIterator<Item = (Addr, u64)>, n: usize) -> Vec<Count> {
    let mut v: Vec<Count> = pairs
        .into_iter()
        .map(|(addr, count)| Count { addr, count })
        .collect();
    let order = |a: &Count, b: &Count| b.count.cmp(&a.count).then(a.addr.cmp(&b.addr));
    if v.len() > n {
        v.select_nth_unstable_by(n, order);
        v.truncate(n);
    }
    v.sort_by(order);
    v
}

/// One system call number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Syscall {
    /// x86-64 number.
    pub nr: u32,
    /// Name, or `unknown`.
    pub name: String,
    pub count: u64,
    /// The `syscall` instructions that made it, most frequent first.
    pub sites: Vec<Count>,
}

/// Entries that left a superblock after the block at position `after` of its trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SideExit {
    pub after: u32,
    pub count: u64,
}

/// A superblock the translator built on the monitor's request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Superblock {
    /// The loop head it was built for.
    pub head: Addr,
    pub symbol: Option<String>,
    /// Its trace's blocks in order (repeated when unrolled).
    pub blocks: Vec<Addr>,
    /// Guest instructions along the whole trace.
    pub instructions: u64,
    pub entries: u64,
    /// Entries that ran the whole trace.
    pub completed: u64,
    pub side_exits: Vec<SideExit>,
}

/// Everything `--paths` adds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathProfile {
    /// `--k` (0: no k-iteration paths).
    pub k: usize,
    /// Every Ball-Larus path, most executed blocks first, then the top PAP runs.
    pub paths: Vec<PathEntry>,
    /// Top k-iteration paths per function and length.
    pub k_paths: Vec<KPath>,
    /// Per function, most executed blocks first.
    pub functions: Vec<Function>,
    /// Folded shadow call stacks.
    pub stacks: Vec<Stack>,
    pub stats: PathStats,
}

/// `bl` (acyclic Ball-Larus path) or `pap` (a whole activation's cyclic path).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathKind {
    Bl,
    Pap,
}

impl PathKind {
    /// `bl` or `pap`.
    pub fn name(self) -> &'static str {
        match self {
            PathKind::Bl => "bl",
            PathKind::Pap => "pap",
        }
    }
}

/// Where a path starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathStart {
    /// The function's entry.
    Entry,
    /// The head of a back edge (a loop iteration).
    BackEdge,
}

/// Where a path ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathEnd {
    /// The function's return.
    Exit,
    /// A back edge.
    BackEdge,
}

impl PathStart {
    /// `entry` or `back_edge`.
    pub fn name(self) -> &'static str {
        match self {
            PathStart::Entry => "entry",
            PathStart::BackEdge => "back_edge",
        }
    }
}

impl PathEnd {
    /// `exit` or `back_edge`.
    pub fn name(self) -> &'static str {
        match self {
            PathEnd::Exit => "exit",
            PathEnd::BackEdge => "back_edge",
        }
    }
}

/// One path with its count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathEntry {
    /// `symbol`, `symbol+0x…` or `sub_<hex>`.
    pub function: String,
    pub function_addr: Addr,
    pub kind: PathKind,
    /// Ball-Larus id under the function's final CFG (`bl`), the PAP register at the exit
    /// (`pap`); null when the function could not be numbered.
    pub id: Option<u64>,
    /// Times it ran.
    pub count: u64,
    /// Blocks on it, repeats included.
    pub len: u64,
    pub start: PathStart,
    pub end: PathEnd,
    /// Its blocks in order (a PAP run: at most the first 1000).
    pub blocks: Vec<Addr>,
    /// The same, named by symbol (`function+0xOFF`; a block in another module or symbol by
    /// its own, `module!symbol+0xOFF`), see docs/report-schema.md.
    pub names: Vec<String>,
    /// `pap` only: the run's breakpoints and Ball-Larus iterations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pap: Option<PapRun>,
}

impl PathEntry {
    /// The order Ball-Larus paths are listed in: most blocks executed (`count × len`) first,
    /// then by function (address), id (null first), blocks, start and end: an order that
    /// depends on the profile alone, not on the order a recorder met the paths in (where a
    /// function has too many paths to number, every id is null and ties are common).
    pub fn report_order(&self, other: &PathEntry) -> std::cmp::Ordering {
        let weight = |e: &PathEntry| e.count.saturating_mul(e.len);
        weight(other)
            .cmp(&weight(self))
            .then(self.function_addr.cmp(&other.function_addr))
            .then(self.id.cmp(&other.id))
            .then_with(|| {
                (&self.blocks, self.start, self.end).cmp(&(&other.blocks, other.start, other.end))
            })
    }

    /// The `names` of `blocks` on a path of `function` entered at `entry`: `function` for the
    /// entry, `function+0xOFF` after it, the bare address below it.
    pub fn block_names(function: &str, entry: Addr, blocks: &[Addr]) -> Vec<String> {
        blocks
            .iter()
            .map(|a| match a.0.checked_sub(entry.0) {
                Some(0) => function.to_string(),
                Some(off) => format!("{function}+{off:#x}"),
                None => a.to_string(),
            })
            .collect()
    }
}

/// A PAP breakpoint: where the 64-bit path register would have overflowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breakpoint {
    pub block: Addr,
    pub r: u64,
}

/// A run of one Ball-Larus path repeated `repeat` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlRun {
    pub id: Option<u64>,
    pub repeat: u64,
}

/// What a PAP run adds to a path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PapRun {
    /// At most the first 1000.
    pub breakpoints: Vec<Breakpoint>,
    /// All of them.
    pub breakpoints_total: u64,
    /// The activation's Ball-Larus paths, run-length encoded (at most the first 1000).
    pub bl_runs: Vec<BlRun>,
    /// Ball-Larus paths in the run, repeats included.
    pub run_paths: u64,
}

/// Up to k consecutive Ball-Larus paths of one activation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KPath {
    pub function: String,
    pub ids: Vec<Option<u64>>,
    pub count: u64,
}

/// An edge of a function's observed CFG.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionEdge {
    pub from: Addr,
    pub to: Addr,
    pub count: u64,
    /// A back edge (retreating in address order).
    pub back: bool,
}

/// A function's observed CFG and its Ball-Larus path count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Function {
    pub name: String,
    pub entry: Addr,
    /// Distinct Ball-Larus paths seen.
    pub paths_seen: u64,
    /// Its Ball-Larus N (null: not numbered).
    pub num_paths: Option<u64>,
    pub blocks: Vec<Count>,
    pub edges: Vec<FunctionEdge>,
}

/// A folded shadow call stack and what ran in its innermost frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stack {
    /// `f;g;h`, outermost first; frames past 128 fold into `[deeper]`.
    pub stack: String,
    /// Blocks executed in the innermost frame.
    pub blocks: u64,
    /// Guest instructions executed in the innermost frame.
    pub instructions: u64,
}

/// A function whose numbering failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumberingError {
    pub function: String,
    pub error: String,
}

/// How path recording went.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathStats {
    /// Times the shadow stack was resynchronised.
    pub shadow_stack_resyncs: u64,
    /// The same by cause (`tail_call`, `deeper_return`, ...).
    pub resyncs_by_cause: BTreeMap<String, u64>,
    /// PAP runs not recorded (too long, or the run store full).
    pub pap_abandoned: u64,
    /// PAP runs recorded: activations whose whole run is counted (listed or not).
    #[serde(default)]
    pub pap_runs: u64,
    /// Distinct PAP runs among them (in a merged report: the most of one of its runs).
    #[serde(default)]
    pub pap_distinct_runs: u64,
    /// Frames dropped because the shadow stack was full.
    pub shadow_stack_dropped_frames: u64,
    pub numbering_errors: Vec<NumberingError>,
}

/// Only the `schema` field: read first, so that another schema is refused before its fields
/// are read as this one's.
#[derive(Deserialize)]
struct SchemaProbe {
    schema: Option<serde_json::Value>,
}

impl Report {
    /// Parses a report from JSON text; `path` names it in errors.
    ///
    /// # Errors
    /// [`ReportError::NotJson`], [`ReportError::NotAReport`] (no `schema` string),
    /// [`ReportError::Schema`] (another schema or version), [`ReportError::Malformed`] (a
    /// field missing or of the wrong type).
    pub fn from_json(text: &[u8], path: &Path) -> Result<Report, ReportError> {
        let probe: SchemaProbe =
            serde_json::from_slice(text).map_err(|source| ReportError::NotJson {
                path: path.to_path_buf(),
                source,
            })?;
        match probe.schema {
            Some(serde_json::Value::String(s)) if s == SCHEMA => {}
            Some(serde_json::Value::String(s)) if s.starts_with("hotpath-report/") => {
                return Err(ReportError::Schema {
                    path: path.to_path_buf(),
                    found: s,
                })
            }
            _ => {
                return Err(ReportError::NotAReport {
                    path: path.to_path_buf(),
                })
            }
        }
        serde_json::from_slice(text).map_err(|source| ReportError::Malformed {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Reads a report file (see [`Report::from_json`]).
    ///
    /// # Errors
    /// [`ReportError::Io`] if it cannot be read, else those of [`Report::from_json`].
    pub fn read(path: &Path) -> Result<Report, ReportError> {
        let bytes = std::fs::read(path).map_err(|source| ReportError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Report::from_json(&bytes, path)
    }

    /// Writes the report as JSON to `path`: to `path.tmp.<pid>` first, then renamed into
    /// place, so a reader never sees half a report.
    ///
    /// # Errors
    /// [`ReportError::Io`] if the file cannot be written or renamed.
    pub fn write(&self, path: &Path) -> Result<(), ReportError> {
        write_atomically(path, |w| {
            crate::json::write_report(self, w)?;
            w.write_all(b"\n")
        })
    }

    /// Sets the module list and names every block's module and offset from it.
    pub fn attribute_modules(&mut self, modules: Vec<Module>) {
        for b in &mut self.blocks {
            b.module = module_of(&modules, b.addr);
            b.offset = b.module.map(|i| Addr(b.addr.0 - modules[i].base.0));
        }
        self.modules = modules;
    }

    /// The module containing guest address `a`: the latest mapped there that was still
    /// mapped at the end, else the latest.
    pub fn module_of(&self, a: Addr) -> Option<usize> {
        module_of(&self.modules, a)
    }

    /// Every call the tables saw, as `(calling block, callee entry, times)`: the direct call
    /// edges, then each indirect call site's targets, the site given as the block it ends (a
    /// site is an instruction address; its block is the last one starting at or before it).
    pub fn calls(&self) -> Vec<(Addr, Addr, u64)> {
        let mut out: Vec<(Addr, Addr, u64)> = self
            .edges
            .iter()
            .filter(|e| e.kind == EdgeKind::Call)
            .map(|e| (e.from, e.to, e.count))
            .collect();
        let mut starts: Vec<Addr> = self.blocks.iter().map(|b| b.addr).collect();
        starts.sort();
        for s in self
            .indirect_jumps
            .iter()
            .filter(|s| s.kind == Terminator::IndirectCall)
        {
            let i = starts.partition_point(|&a| a <= s.site);
            if let Some(&block) = i.checked_sub(1).and_then(|i| starts.get(i)) {
                out.extend(s.targets.iter().map(|t| (block, t.addr, t.count)));
            }
        }
        out
    }
}

/// The module of `modules` (in mapping order) that contains guest address `a`: the latest one
/// still mapped, else the latest one unloaded (a block of a dlclose'd library).
pub fn module_of(modules: &[Module], a: Addr) -> Option<usize> {
    let mapped = modules.iter().rposition(|m| !m.unloaded && m.contains(a));
    mapped.or_else(|| modules.iter().rposition(|m| m.contains(a)))
}

/// Bytes the writers of [`write_atomically`] buffer before each `write`: with the default
/// 8 KiB, a short run's 225 KB report took 1.2 ms longer to write (28 system calls); a
/// buffer as large as the whole file (8 MB for `python3 -c pass`) costs its fresh pages.
const WRITE_BUFFER: usize = 1 << 20;

/// Writes a file through `write` as a user expects of an output path: a symlink's target is
/// written (followed to the end), a character device or FIFO (`/dev/null`, `/dev/stdout`, a
/// named pipe) is opened and written to, and anything else is written into
/// `<target>.tmp.<pid>` beside it and renamed over it once complete, so readers never see a
/// partial file (no fsync: the rename is what matters here).
///
/// # Errors
/// [`ReportError::Io`] naming `path`.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<(), ReportError> {
    let io = |source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    };
    let target = follow_symlinks(path);
    if is_stream_file(&target) {
        let result = (|| {
            let file = std::fs::OpenOptions::new().write(true).open(&target)?;
            let mut f = std::io::BufWriter::with_capacity(WRITE_BUFFER, file);
            write(&mut f)?;
            f.into_inner().map_err(|e| e.into_error()).map(drop)
        })();
        return result.map_err(io);
    }
    let mut tmp = target.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let mut f = std::io::BufWriter::with_capacity(WRITE_BUFFER, std::fs::File::create(&tmp)?);
        write(&mut f)?;
        f.into_inner().map_err(|e| e.into_error())?;
        replace(&tmp, &target)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// Puts the complete file `tmp` in `target`'s place, atomically: readers see the old file
/// or the new one, never neither. Over an existing regular file the two are exchanged
/// (`RENAME_EXCHANGE`) and the old one, now at `tmp`, removed: renaming over an existing file
/// makes ext4 allocate and start writing the new one at once (`auto_da_alloc`), 0.25 ms of a
/// short run whose report replaces the last one's (the same command run again).
fn replace(tmp: &Path, target: &Path) -> std::io::Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    let is_file = std::fs::symlink_metadata(target).is_ok_and(|m| m.file_type().is_file());
    if is_file && renameat_with(CWD, tmp, CWD, target, RenameFlags::EXCHANGE).is_ok() {
        if std::fs::remove_file(tmp).is_ok() {
            return Ok(());
        }
        // `target` became something else meanwhile (a directory): put it back.
        renameat_with(CWD, tmp, CWD, target, RenameFlags::EXCHANGE)?;
    }
    std::fs::rename(tmp, target)
}

/// Symbolic links followed by [`follow_symlinks`] before it gives up (the kernel's limit).
const MAX_SYMLINKS: usize = 40;

/// `path` with every symbolic link at its end replaced by its target (relative targets taken
/// from the link's directory), so that a link to a file that does not exist yet still names
/// the file to create. Stops after [`MAX_SYMLINKS`] links (a loop: the write then fails
/// where the kernel would).
pub fn follow_symlinks(path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_SYMLINKS {
        match std::fs::read_link(&p) {
            Ok(target) => {
                p = match p.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                }
            }
            Err(_) => break,
        }
    }
    p
}

/// True if `path` (symlinks followed) is a character device or a FIFO: an output there is
/// written to, never replaced, and every process writes to the same one.
pub fn is_stream_file(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path)
        .map(|m| m.file_type().is_char_device() || m.file_type().is_fifo())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::pie_run;

    fn json_of(r: &Report) -> serde_json::Value {
        serde_json::to_value(r).unwrap()
    }

    fn read(v: &serde_json::Value) -> Result<Report, ReportError> {
        Report::from_json(v.to_string().as_bytes(), Path::new("r.json"))
    }

    proptest::proptest! {
        /// The `n` most frequent are the head of the whole order, ties in count included.
        #[test]
        fn the_most_frequent_are_the_head_of_the_whole_order(
            counts in proptest::collection::vec(0u64..6, 0..80),
            n in 0usize..30,
        ) {
            let pairs: Vec<(Addr, u64)> = counts
                .iter()
                .enumerate()
                .map(|(i, &c)| (Addr(0x1000 + 16 * i as u64), c))
                .collect();
            let mut want = most_frequent_first(pairs.clone());
            want.truncate(n);
            proptest::prop_assert_eq!(most_frequent(pairs, n), want);
        }
    }

    #[test]
    fn a_file_is_replaced_whole_and_a_directory_is_not() {
        let dir = std::env::temp_dir().join(format!("hotpath-replace-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (target, other) = (dir.join("r.json"), dir.join("d"));
        for text in ["first", "second, longer"] {
            write_atomically(&target, |w| w.write_all(text.as_bytes())).unwrap();
            assert_eq!(std::fs::read_to_string(&target).unwrap(), text);
        }
        std::fs::create_dir(&other).unwrap();
        assert!(write_atomically(&other, |w| w.write_all(b"x")).is_err());
        assert!(other.is_dir(), "a directory in the way stays where it was");
        let mut left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["d", "r.json"], "no temporary file is left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn addresses_are_written_as_display_writes_them_and_read_back() {
        for a in [
            0,
            1,
            0xf,
            0x10,
            0x40_1000,
            0x7fff_ffff_f000,
            1 << 63,
            u64::MAX,
        ] {
            let json = serde_json::to_string(&Addr(a)).unwrap();
            assert_eq!(json, format!("\"{}\"", Addr(a)));
            assert_eq!(serde_json::from_str::<Addr>(&json).unwrap(), Addr(a));
        }
    }

    #[test]
    fn a_report_reads_back_as_written() {
        let r = pie_run(0x5555_0000_0000);
        let v = json_of(&r);
        assert_eq!(v["blocks"][0]["addr"], "0x555500000100");
        assert_eq!(v["ending"]["status"], "exited");
        assert!(v["path_profile"].is_null());
        assert_eq!(read(&v).unwrap(), r);
    }

    #[test]
    fn other_schemas_and_malformed_files_are_refused() {
        let mut v = json_of(&pie_run(0x1000));
        v["schema"] = "hotpath-report/1".into();
        let e = read(&v).unwrap_err().to_string();
        assert!(
            e.contains("schema hotpath-report/1") && e.contains(SCHEMA),
            "{e}"
        );

        let mut v = json_of(&pie_run(0x1000));
        v["totals"].as_object_mut().unwrap().remove("events");
        let e = read(&v).unwrap_err().to_string();
        assert!(e.contains("malformed") && e.contains("`events`"), "{e}");

        let mut v = json_of(&pie_run(0x1000));
        v["blocks"][1]["addr"] = "4096".into();
        let e = read(&v).unwrap_err().to_string();
        assert!(e.contains("bad address"), "{e}");

        let e = Report::from_json(b"\x7fELF", Path::new("prog")).unwrap_err();
        assert!(
            e.to_string().starts_with("prog: not a hotpath report"),
            "{e}"
        );
        let e = Report::from_json(b"{\"a\": 1}", Path::new("x.json")).unwrap_err();
        assert!(matches!(e, ReportError::NotAReport { .. }), "{e}");
    }

    #[test]
    fn hex_bytes_round_trip() {
        let b = HexBytes(vec![0, 0x0f, 0xff]);
        let s = serde_json::to_string(&b).unwrap();
        assert_eq!(s, "\"000fff\"");
        assert_eq!(serde_json::from_str::<HexBytes>(&s).unwrap(), b);
        assert!(serde_json::from_str::<HexBytes>("\"0g\"").is_err());
        assert!(serde_json::from_str::<HexBytes>("\"abc\"").is_err());
    }
}
