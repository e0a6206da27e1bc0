//! Reports: the versioned JSON profile (`hotpath-report/1`, see `docs/report-schema.md`) and
//! the short human summary.

use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

use crate::profile::{IndirectSite, Profile};

/// The schema name and version written in every JSON report.
pub const SCHEMA: &str = "hotpath-report/1";

/// Top-target share at or above which an indirect site is monomorphic.
pub const MONOMORPHIC_SHARE: f64 = 0.9;
/// Top-target share below which an indirect site is megamorphic (between: polymorphic).
pub const MEGAMORPHIC_SHARE: f64 = 0.3;

/// How the guest ended, for the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Exit status.
    Exited(i32),
    /// Killed by this signal number, with its name.
    Signaled(i32, String),
    /// hotpath stopped it (a translator error or an unsupported request).
    Error(String),
    /// The guest replaced itself with another program (`execve`), which runs natively.
    Exec,
}

/// What the report says about the run besides the profile.
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// The guest program's path.
    pub program: String,
    /// Its arguments, argv[0] included.
    pub argv: Vec<String>,
    /// How it ended.
    pub ending: Ending,
    /// Blocks the translator translated (re-translations included).
    pub blocks_translated: u64,
}

/// `0x…` for an address.
fn hex(a: u64) -> String {
    format!("{a:#x}")
}

/// `monomorphic`, `polymorphic` or `megamorphic`, by the top target's share of the site.
pub fn predictability(site: &IndirectSite) -> &'static str {
    let top = site.targets.first().map(|t| t.1).unwrap_or(0) as f64;
    let share = if site.count == 0 { 1.0 } else { top / site.count as f64 };
    if share >= MONOMORPHIC_SHARE {
        "monomorphic"
    } else if share >= MEGAMORPHIC_SHARE {
        "polymorphic"
    } else {
        "megamorphic"
    }
}

/// The JSON document for `profile`.
pub fn to_json(profile: &Profile, run: &RunInfo) -> Value {
    let t = &profile.totals;
    let ending = match &run.ending {
        Ending::Exited(code) => json!({"status": "exited", "code": code}),
        Ending::Signaled(sig, name) => json!({"status": "signaled", "signal": sig, "name": name}),
        Ending::Error(msg) => json!({"status": "error", "message": msg}),
        Ending::Exec => json!({"status": "exec"}),
    };
    json!({
        "schema": SCHEMA,
        "program": run.program,
        "argv": run.argv,
        "ending": ending,
        "totals": {
            "blocks_executed": t.blocks_executed,
            "guest_instructions": t.guest_instructions,
            "distinct_blocks": t.distinct_blocks,
            "blocks_translated": run.blocks_translated,
            "ring_waits": t.ring_waits,
            "ring_wait_ns": t.ring_wait_ns,
        },
        "blocks": profile.blocks.iter().map(|b| json!({
            "addr": hex(b.addr),
            "count": b.count,
            "instructions": b.instructions,
            "bytes": b.len_bytes,
            "terminator": b.terminator.name(),
            "symbol": b.symbol,
        })).collect::<Vec<_>>(),
        "edges": profile.edges.iter().map(|e| json!({
            "from": hex(e.from),
            "to": hex(e.to),
            "kind": e.kind,
            "count": e.count,
        })).collect::<Vec<_>>(),
        "indirect_jumps": profile.indirect.iter().map(|s| json!({
            "site": hex(s.site),
            "kind": s.kind.name(),
            "count": s.count,
            "predictability": predictability(s),
            "targets": s.targets.iter().map(|&(a, c)| json!({"addr": hex(a), "count": c})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "syscalls": profile.syscalls.iter().map(|s| json!({
            "nr": s.nr,
            "name": s.name,
            "count": s.count,
            "sites": s.sites.iter().map(|&(a, c)| json!({"addr": hex(a), "count": c})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// Writes the JSON report to `path`: to a temporary file beside it first, then renamed into
/// place, so a reader never sees half a report.
///
/// # Errors
/// The I/O error, if the file cannot be written or renamed.
pub fn write_json(path: &Path, profile: &Profile, run: &RunInfo) -> std::io::Result<()> {
    let doc = to_json(profile, run);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        serde_json::to_writer_pretty(&mut f, &doc)?;
        f.write_all(b"\n")?;
        f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// The short human summary: totals, the hottest blocks, indirect sites and syscalls.
pub fn summary(profile: &Profile, top: usize) -> String {
    let t = &profile.totals;
    let mut out = format!(
        "hotpath: {} blocks ({} distinct) and {} guest instructions executed; the guest waited for the monitor {} times ({:.3} s)\n",
        t.blocks_executed,
        t.distinct_blocks,
        t.guest_instructions,
        t.ring_waits,
        t.ring_wait_ns as f64 / 1e9
    );
    let mut blocks: Vec<_> = profile.blocks.iter().collect();
    blocks.sort_by(|a, b| b.count.cmp(&a.count).then(a.addr.cmp(&b.addr)));
    if !blocks.is_empty() {
        out.push_str("hotpath: hottest blocks:\n");
        for b in blocks.iter().take(top) {
            let share = 100.0 * b.count as f64 / t.blocks_executed.max(1) as f64;
            out.push_str(&format!(
                "  {:>14} {:5.1}%  {:#x} {:<32} {}\n",
                b.count,
                share,
                b.addr,
                b.symbol.as_deref().unwrap_or("?"),
                b.terminator.name()
            ));
        }
    }
    let mut sites: Vec<_> = profile.indirect.iter().collect();
    sites.sort_by(|a, b| b.count.cmp(&a.count).then(a.site.cmp(&b.site)));
    if !sites.is_empty() {
        out.push_str("hotpath: busiest indirect branches:\n");
        for s in sites.iter().take(top) {
            out.push_str(&format!(
                "  {:>14}  {:#x} {:<13} {} targets, {}\n",
                s.count,
                s.site,
                s.kind.name(),
                s.targets.len(),
                predictability(s)
            ));
        }
    }
    if !profile.syscalls.is_empty() {
        let list: Vec<String> = profile.syscalls.iter().map(|s| format!("{} {}", s.name, s.count)).collect();
        out.push_str(&format!("hotpath: syscalls: {}\n", list.join(", ")));
    }
    out
}
