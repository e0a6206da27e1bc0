//! The human summary of a report: totals, hot paths with guest disassembly, hottest blocks,
//! busiest indirect branches, system calls and superblocks (`hotpath report FILE.json`, and
//! what `hotpath run` prints on stderr).

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use crate::{Addr, Block, PathEntry, Report};

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

/// Blocks executed along `p`'s runs: count × length (what the hot-path order sorts by).
fn weight(p: &PathEntry) -> u64 {
    p.count.saturating_mul(p.len)
}

/// The human report: totals, the top `top` hot paths (count, share of executed blocks, blocks
/// as `symbol+offset`, guest disassembly where the report has code), the hottest blocks, the
/// busiest indirect branches with their targets and predictability, the system calls and the
/// superblocks.
pub fn render(r: &Report, top: usize) -> String {
    let t = &r.totals;
    let executed = t.blocks_executed.max(1);
    let share = |n: u64| 100.0 * n as f64 / executed as f64;
    let mut out = format!(
        "hotpath: {} blocks ({} distinct) and {} guest instructions executed, seen in {} ring events; the guest waited for the monitor {} times ({:.3} s)\n",
        t.blocks_executed,
        t.distinct_blocks,
        t.guest_instructions,
        t.events,
        t.ring_waits,
        t.ring_wait_ns as f64 / 1e9
    );
    let by_addr: HashMap<Addr, &Block> = r.blocks.iter().map(|b| (b.addr, b)).collect();
    let symbol = |a: Addr| by_addr.get(&a).and_then(|b| b.symbol.as_deref());
    let name = |a: Addr| symbol(a).map_or_else(|| a.to_string(), str::to_string);

    if let Some(pp) = &r.path_profile {
        let mut paths: Vec<&PathEntry> = pp.paths.iter().collect();
        paths.sort_by_key(|p| std::cmp::Reverse(weight(p)));
        if !paths.is_empty() {
            out.push_str("hotpath: hot paths (count, share of executed blocks):\n");
        }
        for p in paths.iter().take(top) {
            let _ = writeln!(
                out,
                "  {:>14} {:5.1}%  {} path {} of {} ({} blocks, {} -> {})",
                p.count,
                share(weight(p)),
                p.kind.name(),
                p.id.map_or("?".to_string(), |i| i.to_string()),
                p.function,
                p.len,
                p.start.name(),
                p.end.name(),
            );
            if let Some(pap) = &p.pap {
                let list: Vec<String> = pap
                    .bl_runs
                    .iter()
                    .take(24)
                    .map(|r| {
                        format!(
                            "{}×{}",
                            r.id.map_or("?".into(), |i| i.to_string()),
                            r.repeat
                        )
                    })
                    .collect();
                let more = if pap.bl_runs.len() > list.len() {
                    " ..."
                } else {
                    ""
                };
                let n = match pap.run_paths {
                    1 => "1 path".to_string(),
                    n => format!("{n} paths"),
                };
                let _ = writeln!(
                    out,
                    "      iterations (bl id×repeat, {n}): {}{more}",
                    list.join(" ")
                );
                let _ = writeln!(out, "      {} PAP breakpoints", pap.breakpoints_total);
            }
            // One listing per distinct block, in first-visit order (PAP runs repeat blocks).
            let mut seen = HashSet::new();
            for (i, &a) in p.blocks.iter().enumerate() {
                if !seen.insert(a) {
                    continue;
                }
                let label = symbol(a)
                    .or_else(|| p.names.get(i).map(String::as_str))
                    .map_or_else(|| a.to_string(), str::to_string);
                let _ = writeln!(out, "      {label}");
                if let Some(code) = by_addr.get(&a).and_then(|b| b.code.as_ref()) {
                    for line in disassemble(a.0, &code.0) {
                        let _ = writeln!(out, "          {line}");
                    }
                }
            }
        }
    }

    let mut hot: Vec<&Block> = r.blocks.iter().collect();
    hot.sort_by(|a, b| b.count.cmp(&a.count).then(a.addr.cmp(&b.addr)));
    if !hot.is_empty() {
        out.push_str("hotpath: hottest blocks:\n");
        for b in hot.iter().take(top) {
            let _ = writeln!(
                out,
                "  {:>14} {:5.1}%  {} {:<32} {}",
                b.count,
                share(b.count),
                b.addr,
                b.symbol.as_deref().unwrap_or("?"),
                b.terminator.name()
            );
        }
    }

    let mut sites: Vec<_> = r.indirect_jumps.iter().collect();
    sites.sort_by(|a, b| b.count.cmp(&a.count).then(a.site.cmp(&b.site)));
    if !sites.is_empty() {
        out.push_str("hotpath: busiest indirect branches (site, targets, predictability):\n");
        // Blocks by address, to name the block a site is in.
        let mut starts: Vec<&Block> = r.blocks.iter().collect();
        starts.sort_by_key(|b| b.addr);
        for s in sites.iter().take(top) {
            let i = starts.partition_point(|b| b.addr <= s.site);
            let within = i
                .checked_sub(1)
                .map(|i| starts[i])
                .filter(|b| s.site.0 < b.addr.0 + b.bytes as u64)
                .and_then(|b| b.symbol.as_deref())
                .map(|s| format!("(in {s})"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:>14}  {} {} {} {} targets, {}",
                s.count,
                s.site,
                within,
                s.kind.name(),
                s.targets.len(),
                s.predictability.name()
            );
            for tg in s.targets.iter().take(4) {
                let _ = writeln!(
                    out,
                    "  {:>14}      -> {} {}",
                    tg.count,
                    tg.addr,
                    name(tg.addr)
                );
            }
        }
    }
    if !r.syscalls.is_empty() {
        let list: Vec<String> = r
            .syscalls
            .iter()
            .map(|s| format!("{} {}", s.name, s.count))
            .collect();
        let _ = writeln!(out, "hotpath: syscalls: {}", list.join(", "));
    }
    if !r.superblocks.is_empty() {
        let entries: u64 = r.superblocks.iter().map(|s| s.entries).sum();
        let _ = writeln!(
            out,
            "hotpath: superblocks: {} formed, entered {entries} times",
            r.superblocks.len()
        );
        for s in r.superblocks.iter().take(top.min(5)) {
            let _ = writeln!(
                out,
                "  {:>12}  {} ({} blocks, {} instructions), {} ran to the end",
                s.entries,
                s.symbol.clone().unwrap_or_else(|| s.head.to_string()),
                s.blocks.len(),
                s.instructions,
                s.completed,
            );
        }
    }
    if let Some(pp) = &r.path_profile {
        let _ = writeln!(
            out,
            "hotpath: paths: {} distinct, shadow stack resynchronised {} times",
            pp.paths
                .iter()
                .filter(|p| p.kind == crate::PathKind::Bl)
                .count(),
            pp.stats.shadow_stack_resyncs
        );
    }
    out
}
