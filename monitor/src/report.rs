//! Reports: the versioned JSON profile (`hotpath-report/1`, see `docs/report-schema.md`) and
//! the short human summary.

use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

use crate::profile::{IndirectSite, Profile};
use crate::{PathEntry, PathKind};

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
    /// Wall time the translator spent translating them, in nanoseconds (all threads).
    pub translation_ns: u64,
}

/// `0x…` for an address.
fn hex(a: u64) -> String {
    format!("{a:#x}")
}

/// `monomorphic`, `polymorphic` or `megamorphic`, by the top target's share of the site.
pub fn predictability(site: &IndirectSite) -> &'static str {
    let top = site.targets.first().map(|t| t.1).unwrap_or(0) as f64;
    let share = if site.count == 0 {
        1.0
    } else {
        top / site.count as f64
    };
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
    let mut doc = json!({
        "schema": SCHEMA,
        "program": run.program,
        "argv": run.argv,
        "ending": ending,
        "totals": {
            "blocks_executed": t.blocks_executed,
            "guest_instructions": t.guest_instructions,
            "distinct_blocks": t.distinct_blocks,
            "blocks_translated": run.blocks_translated,
            "translation_ns": run.translation_ns,
            "events": t.events,
            "ring_waits": t.ring_waits,
            "ring_wait_ns": t.ring_wait_ns,
            "monitor_busy_ns": t.monitor_busy_ns,
        },
        "threads": profile.threads.iter().map(|th| json!({
            "tid": th.tid,
            "events": th.events,
            "blocks_executed": th.blocks_executed,
            "guest_instructions": th.guest_instructions,
            "ring_waits": th.ring_waits,
            "ring_wait_ns": th.ring_wait_ns,
            "hottest": th.hottest.iter().map(|&(a, c)| json!({"addr": hex(a), "count": c})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "blocks": profile.blocks.iter().map(|b| json!({
            "addr": hex(b.addr),
            "count": b.count,
            "instructions": b.instructions,
            "bytes": b.len_bytes,
            "terminator": b.terminator.name(),
            "symbol": b.symbol,
            "module": b.module.map(|(i, _)| i),
            "offset": b.module.map(|(_, off)| hex(off)),
        })).collect::<Vec<_>>(),
        "modules": profile.modules.iter().map(|m| json!({
            "path": m.path,
            "base": hex(m.base),
            "size": m.size,
            "build_id": m.build_id,
            "unloaded": m.unloaded,
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
    });
    let obj = doc.as_object_mut().expect("an object");
    obj.insert(
        "superblocks".into(),
        profile
            .superblocks
            .iter()
            .map(|s| {
                json!({
                    "head": hex(s.head),
                    "symbol": s.symbol,
                    "blocks": s.blocks.iter().map(|&a| hex(a)).collect::<Vec<_>>(),
                    "instructions": s.instructions,
                    "entries": s.entries,
                    "completed": s.completed,
                    "side_exits": s.side_exits.iter().map(|&(after, c)| json!({"after": after, "count": c})).collect::<Vec<_>>(),
                })
            })
            .collect(),
    );
    for (b, j) in profile
        .blocks
        .iter()
        .zip(obj["blocks"].as_array_mut().expect("an array"))
    {
        if let Some(code) = &b.code {
            j["code"] = Value::String(code.iter().map(|x| format!("{x:02x}")).collect());
        }
    }
    if let Some(p) = &profile.paths {
        obj.insert("paths".into(), p.paths.iter().map(path_json).collect());
        obj.insert("k".into(), json!(p.k));
        obj.insert(
            "k_paths".into(),
            p.k_paths
                .iter()
                .map(|k| json!({"function": k.function, "ids": k.ids, "count": k.count}))
                .collect(),
        );
        obj.insert(
            "functions".into(),
            p.functions
                .iter()
                .map(|f| {
                    json!({
                        "name": f.name,
                        "entry": hex(f.entry),
                        "paths_seen": f.paths_seen,
                        "num_paths": f.num_paths,
                        "blocks": f.blocks.iter().map(|&(a, c)| json!({"addr": hex(a), "count": c})).collect::<Vec<_>>(),
                        "edges": f.edges.iter().map(|&(a, b, c, back)| json!({"from": hex(a), "to": hex(b), "count": c, "back": back})).collect::<Vec<_>>(),
                    })
                })
                .collect(),
        );
        obj.insert(
            "stacks".into(),
            p.stacks
                .iter()
                .map(|(s, n)| json!({"stack": s, "blocks": n}))
                .collect(),
        );
        obj.insert(
            "path_stats".into(),
            json!({
                "shadow_stack_resyncs": p.resyncs,
                "resyncs_by_cause": p.resync_kinds.iter().map(|&(k, n)| (k.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
                "pap_abandoned": p.pap_abandoned,
                "shadow_stack_dropped_frames": p.dropped_frames,
                "numbering_errors": p.numbering_errors.iter().map(|(f, e)| json!({"function": f, "error": e})).collect::<Vec<_>>(),
            }),
        );
    }
    doc
}

fn path_json(p: &PathEntry) -> Value {
    let mut v = json!({
        "function": p.function,
        "function_addr": hex(p.function_addr),
        "kind": p.kind.name(),
        "id": p.id,
        "count": p.count,
        "len": p.len,
        "start": p.start,
        "end": p.end,
        "blocks": p.blocks.iter().map(|&a| hex(a)).collect::<Vec<_>>(),
        "names": p.blocks.iter().map(|&a| match a.checked_sub(p.function_addr) {
            Some(0) => p.function.clone(),
            Some(off) => format!("{}+{off:#x}", p.function),
            None => hex(a),
        }).collect::<Vec<_>>(),
    });
    if p.kind == PathKind::Pap {
        v["breakpoints"] = p
            .breakpoints
            .iter()
            .map(|&(a, r)| json!({"block": hex(a), "r": r}))
            .collect();
        v["breakpoints_total"] = json!(p.breakpoints_total);
        v["bl_runs"] = p
            .bl_runs
            .iter()
            .map(|&(id, n)| json!({"id": id, "repeat": n}))
            .collect();
        v["run_paths"] = json!(p.run_paths);
    }
    v
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

/// The short human summary of `profile` (see [`render_text`]).
pub fn summary(profile: &Profile, top: usize) -> String {
    let run = RunInfo {
        program: String::new(),
        argv: Vec::new(),
        ending: Ending::Exec,
        blocks_translated: 0,
        translation_ns: 0,
    };
    render_text(&to_json(profile, &run), top)
}

fn addr_of(v: &Value) -> u64 {
    v.as_str()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0)
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Guest disassembly (Intel syntax) of `code` at `addr`, one `addr: text` line per instruction.
pub fn disassemble(addr: u64, code: &[u8]) -> Vec<String> {
    use iced_x86::{Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter};
    let mut decoder = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut formatter = IntelFormatter::new();
    let mut inst = Instruction::default();
    let mut out = Vec::new();
    while decoder.can_decode() {
        decoder.decode_out(&mut inst);
        let mut text = String::new();
        formatter.format(&inst, &mut text);
        out.push(format!("{:#x}: {text}", inst.ip()));
    }
    out
}

/// The human report, rendered from a JSON report alone (`hotpath report FILE.json` and the
/// stderr summary): totals, the top `top` hot paths (count, share of executed blocks, blocks
/// as `symbol+offset`, guest disassembly), the hottest blocks, the busiest indirect branches
/// with their targets and predictability, and the syscalls.
pub fn render_text(doc: &Value, top: usize) -> String {
    let t = &doc["totals"];
    let executed = u64_of(&t["blocks_executed"]).max(1);
    let mut out = format!(
        "hotpath: {} blocks ({} distinct) and {} guest instructions executed, seen in {} ring events; the guest waited for the monitor {} times ({:.3} s)\n",
        u64_of(&t["blocks_executed"]),
        u64_of(&t["distinct_blocks"]),
        u64_of(&t["guest_instructions"]),
        u64_of(&t["events"]),
        u64_of(&t["ring_waits"]),
        u64_of(&t["ring_wait_ns"]) as f64 / 1e9
    );
    let empty = Vec::new();
    let blocks = doc["blocks"].as_array().unwrap_or(&empty);
    let by_addr: std::collections::HashMap<u64, &Value> =
        blocks.iter().map(|b| (addr_of(&b["addr"]), b)).collect();
    let name = |a: u64| -> String {
        by_addr
            .get(&a)
            .and_then(|b| b["symbol"].as_str())
            .map(str::to_string)
            .unwrap_or_else(|| format!("{a:#x}"))
    };

    if let Some(paths) = doc["paths"].as_array() {
        let mut paths: Vec<&Value> = paths.iter().collect();
        let weight = |p: &Value| {
            u64_of(&p["count"]).saturating_mul(
                p["len"]
                    .as_u64()
                    .unwrap_or_else(|| p["blocks"].as_array().map_or(0, |b| b.len() as u64)),
            )
        };
        paths.sort_by_key(|p| std::cmp::Reverse(weight(p)));
        if !paths.is_empty() {
            out.push_str("hotpath: hot paths (count, share of executed blocks):\n");
        }
        for p in paths.iter().take(top) {
            let id = p["id"].as_u64().map_or("?".to_string(), |i| i.to_string());
            let b = p["blocks"].as_array().unwrap_or(&empty);
            out.push_str(&format!(
                "  {:>14} {:5.1}%  {} path {} of {} ({} blocks, {} -> {})\n",
                u64_of(&p["count"]),
                100.0 * weight(p) as f64 / executed as f64,
                p["kind"].as_str().unwrap_or("?"),
                id,
                p["function"].as_str().unwrap_or("?"),
                p["len"].as_u64().unwrap_or(b.len() as u64),
                p["start"].as_str().unwrap_or("?"),
                p["end"].as_str().unwrap_or("?"),
            ));
            if let Some(runs) = p["bl_runs"].as_array() {
                let list: Vec<String> = runs
                    .iter()
                    .take(24)
                    .map(|r| {
                        format!(
                            "{}×{}",
                            r["id"].as_u64().map_or("?".into(), |i| i.to_string()),
                            u64_of(&r["repeat"])
                        )
                    })
                    .collect();
                let more = if runs.len() > list.len() { " ..." } else { "" };
                let paths = match p["run_paths"].as_u64() {
                    Some(1) => ", 1 path".to_string(),
                    Some(n) => format!(", {n} paths"),
                    None => String::new(),
                };
                out.push_str(&format!(
                    "      iterations (bl id×repeat{paths}): {}{more}\n",
                    list.join(" ")
                ));
                if let Some(bps) = p["breakpoints"].as_array() {
                    let total = p["breakpoints_total"].as_u64().unwrap_or(bps.len() as u64);
                    out.push_str(&format!("      {total} PAP breakpoints\n"));
                }
            }
            // One listing per distinct block, in first-visit order (PAP runs repeat blocks).
            let mut seen = std::collections::HashSet::new();
            let names = p["names"].as_array().unwrap_or(&empty);
            for (i, a) in b.iter().map(addr_of).enumerate() {
                if !seen.insert(a) {
                    continue;
                }
                let label = by_addr
                    .get(&a)
                    .and_then(|b| b["symbol"].as_str())
                    .or_else(|| names.get(i).and_then(Value::as_str));
                out.push_str(&format!(
                    "      {}\n",
                    label.map(str::to_string).unwrap_or_else(|| name(a))
                ));
                let code = by_addr.get(&a).and_then(|b| b["code"].as_str());
                if let Some(hexcode) = code {
                    let bytes: Vec<u8> = (0..hexcode.len() / 2)
                        .filter_map(|i| u8::from_str_radix(&hexcode[2 * i..2 * i + 2], 16).ok())
                        .collect();
                    for line in disassemble(a, &bytes) {
                        out.push_str(&format!("          {line}\n"));
                    }
                }
            }
        }
    }

    let mut hot: Vec<&Value> = blocks.iter().collect();
    hot.sort_by(|a, b| {
        u64_of(&b["count"])
            .cmp(&u64_of(&a["count"]))
            .then(addr_of(&a["addr"]).cmp(&addr_of(&b["addr"])))
    });
    if !hot.is_empty() {
        out.push_str("hotpath: hottest blocks:\n");
        for b in hot.iter().take(top) {
            let a = addr_of(&b["addr"]);
            out.push_str(&format!(
                "  {:>14} {:5.1}%  {:#x} {:<32} {}\n",
                u64_of(&b["count"]),
                100.0 * u64_of(&b["count"]) as f64 / executed as f64,
                a,
                b["symbol"].as_str().unwrap_or("?"),
                b["terminator"].as_str().unwrap_or("?")
            ));
        }
    }
    let mut sites: Vec<&Value> = doc["indirect_jumps"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .collect();
    sites.sort_by(|a, b| {
        u64_of(&b["count"])
            .cmp(&u64_of(&a["count"]))
            .then(addr_of(&a["site"]).cmp(&addr_of(&b["site"])))
    });
    if !sites.is_empty() {
        out.push_str("hotpath: busiest indirect branches (site, targets, predictability):\n");
        for s in sites.iter().take(top) {
            let site = addr_of(&s["site"]);
            let targets = s["targets"].as_array().unwrap_or(&empty);
            out.push_str(&format!(
                "  {:>14}  {:#x} {} {} {} targets, {}\n",
                u64_of(&s["count"]),
                site,
                name_of_site(&by_addr, site),
                s["kind"].as_str().unwrap_or("?"),
                targets.len(),
                s["predictability"].as_str().unwrap_or("?")
            ));
            for tg in targets.iter().take(4) {
                let a = addr_of(&tg["addr"]);
                out.push_str(&format!(
                    "  {:>14}      -> {:#x} {}\n",
                    u64_of(&tg["count"]),
                    a,
                    name(a)
                ));
            }
        }
    }
    if let Some(sys) = doc["syscalls"].as_array().filter(|s| !s.is_empty()) {
        let list: Vec<String> = sys
            .iter()
            .map(|s| {
                format!(
                    "{} {}",
                    s["name"].as_str().unwrap_or("?"),
                    u64_of(&s["count"])
                )
            })
            .collect();
        out.push_str(&format!("hotpath: syscalls: {}\n", list.join(", ")));
    }
    if let Some(sbs) = doc["superblocks"].as_array().filter(|s| !s.is_empty()) {
        let entries: u64 = sbs.iter().map(|s| u64_of(&s["entries"])).sum();
        out.push_str(&format!(
            "hotpath: superblocks: {} formed, entered {} times\n",
            sbs.len(),
            entries
        ));
        for s in sbs.iter().take(top.min(5)) {
            out.push_str(&format!(
                "  {:>12}  {} ({} blocks, {} instructions), {} ran to the end\n",
                u64_of(&s["entries"]),
                s["symbol"]
                    .as_str()
                    .unwrap_or(s["head"].as_str().unwrap_or("?")),
                s["blocks"].as_array().map_or(0, |b| b.len()),
                u64_of(&s["instructions"]),
                u64_of(&s["completed"]),
            ));
        }
    }
    if let Some(ps) = doc.get("path_stats") {
        out.push_str(&format!(
            "hotpath: paths: {} distinct, shadow stack resynchronised {} times\n",
            doc["paths"]
                .as_array()
                .map_or(0, |p| p.iter().filter(|p| p["kind"] == "bl").count()),
            u64_of(&ps["shadow_stack_resyncs"])
        ));
    }
    out
}

/// `symbol+offset` of an indirect site (the block containing it, or `?`).
fn name_of_site(by_addr: &std::collections::HashMap<u64, &Value>, site: u64) -> String {
    by_addr
        .values()
        .filter(|b| {
            let a = addr_of(&b["addr"]);
            a <= site && site < a + u64_of(&b["bytes"])
        })
        .find_map(|b| b["symbol"].as_str().map(|s| format!("(in {s})")))
        .unwrap_or_default()
}

/// Writes one Graphviz file per function among the `top` hottest (`DIR/<n>-<name>.dot`): the
/// function's observed CFG, blocks labelled `symbol+offset` and count, edges labelled and
/// weighted (pen width) by count, back edges dashed. Returns the files written.
///
/// # Errors
/// The I/O error of creating `dir` or a file.
pub fn write_dot(doc: &Value, dir: &Path, top: usize) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let empty = Vec::new();
    let names: std::collections::HashMap<u64, String> = doc["blocks"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|b| {
            (
                addr_of(&b["addr"]),
                b["symbol"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| hex(addr_of(&b["addr"]))),
            )
        })
        .collect();
    let mut written = Vec::new();
    for (i, f) in doc["functions"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .take(top)
        .enumerate()
    {
        let fname = f["name"].as_str().unwrap_or("?");
        let safe: String = fname
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!("{i:02}-{safe}.dot"));
        let edges = f["edges"].as_array().unwrap_or(&empty);
        let max = edges
            .iter()
            .map(|e| u64_of(&e["count"]))
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let mut s = format!(
            "digraph \"{}\" {{\n  node [shape=box, fontname=monospace];\n",
            fname.replace('"', "'")
        );
        for b in f["blocks"].as_array().unwrap_or(&empty) {
            let a = addr_of(&b["addr"]);
            let label = names
                .get(&a)
                .cloned()
                .unwrap_or_else(|| hex(a))
                .replace('"', "'");
            s.push_str(&format!(
                "  \"{}\" [label=\"{}\\n{}\"];\n",
                hex(a),
                label,
                u64_of(&b["count"])
            ));
        }
        for e in edges {
            let c = u64_of(&e["count"]);
            s.push_str(&format!(
                "  \"{}\" -> \"{}\" [label=\"{}\", weight={}, penwidth={:.2}{}];\n",
                hex(addr_of(&e["from"])),
                hex(addr_of(&e["to"])),
                c,
                c.max(1),
                1.0 + 4.0 * c as f64 / max,
                if e["back"] == true {
                    ", style=dashed"
                } else {
                    ""
                }
            ));
        }
        s.push_str("}\n");
        std::fs::write(&path, s)?;
        written.push(path);
    }
    Ok(written)
}

/// Writes a flame graph SVG of the report's folded call stacks (blocks executed per stack of
/// the shadow call stack) with inferno.
///
/// # Errors
/// The I/O error, or inferno's error, as a message.
pub fn write_flamegraph(doc: &Value, path: &Path) -> Result<(), String> {
    let empty = Vec::new();
    let lines: Vec<String> = doc["stacks"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                s["stack"].as_str().unwrap_or("?"),
                u64_of(&s["blocks"])
            )
        })
        .collect();
    if lines.is_empty() {
        return Err("the report has no call stacks (paths were off?)".into());
    }
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = "hotpath: guest blocks executed by call stack".into();
    opts.count_name = "blocks".into();
    inferno::flamegraph::from_lines(
        &mut opts,
        lines.iter().map(String::as_str),
        std::io::BufWriter::new(file),
    )
    .map_err(|e| format!("{}: {e}", path.display()))
}
