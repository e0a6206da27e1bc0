//! The human summary of a report: totals, where the time goes (functions by their share of
//! guest instructions), hot source lines (where there is debug information), hot paths named by symbol (with guest disassembly on request), hottest
//! blocks, busiest indirect branches, system calls and superblocks (`hotpath report
//! FILE.json`, and what `hotpath run` prints on stderr).

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use crate::lines::{line_costs, Frame, SourceLines};
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

/// Blocks of a path spelled on its one summary line; a longer path ends in "... (N more)".
const PATH_NAMES_SHOWN: usize = 12;

/// The first `n` of `rows` in the order `cmp` gives, in that order: the rest is left unsorted
/// (a summary shows ten rows of a program's tens of thousands of blocks).
fn top_rows<T>(mut rows: Vec<T>, n: usize, cmp: impl Fn(&T, &T) -> std::cmp::Ordering) -> Vec<T> {
    if n < rows.len() {
        if n == 0 {
            rows.clear();
            return rows;
        }
        rows.select_nth_unstable_by(n - 1, &cmp);
        rows.truncate(n);
    }
    rows.sort_by(cmp);
    rows
}

/// Functions by guest instructions executed: `(name, self, with callees)`, most self first. With a
/// path profile the functions are the shadow stack's and "with callees" counts each folded
/// stack once for every function on it (a recursion once); without one, they are the blocks'
/// symbols and "with callees" is unknown (`None`).
pub fn functions_by_share(r: &Report) -> Vec<(String, u64, Option<u64>)> {
    let mut out: Vec<(String, u64, Option<u64>)> = match &r.path_profile {
        Some(pp) if !pp.stacks.is_empty() => {
            let mut by_name: HashMap<&str, (u64, u64)> = HashMap::new();
            for s in &pp.stacks {
                let frames: Vec<&str> = s.stack.split(';').collect();
                let mut seen = HashSet::new();
                for f in &frames {
                    if seen.insert(*f) {
                        by_name.entry(f).or_default().1 += s.instructions;
                    }
                }
                if let Some(last) = frames.last() {
                    by_name.entry(last).or_default().0 += s.instructions;
                }
            }
            by_name
                .into_iter()
                .map(|(n, (own, total))| (n.to_string(), own, Some(total)))
                .collect()
        }
        _ => {
            // Keyed by the symbol's text: a string is made per function, not per block.
            let mut by_name: HashMap<&str, u64> = HashMap::new();
            for b in &r.blocks {
                let path = b
                    .module
                    .and_then(|m| r.modules.get(m))
                    .map(|m| m.path.as_str());
                let name = b.symbol.as_deref().map_or(crate::callgrind::UNKNOWN, |s| {
                    crate::callgrind::function_name(s, path)
                });
                *by_name.entry(name).or_default() += b.count * b.instructions as u64;
            }
            by_name
                .into_iter()
                .map(|(n, own)| (n.to_string(), own, None))
                .collect()
        }
    };
    out.sort_by(|a, b| (b.1, b.2).cmp(&(a.1, a.2)).then_with(|| a.0.cmp(&b.0)));
    out
}

/// The "hot lines" table: the `top` source lines with the most guest instructions executed
/// (exact: each instruction counted as often as its block ran), as `file:line  function`;
/// empty when no module of `r` has debug information (in the module file, and with
/// `separate_debug` also in a separate debug file: reading glibc's from libc6-dbg costs a short
/// process about 150 ms).
fn hot_lines(r: &Report, top: usize, separate_debug: bool) -> String {
    let lines = SourceLines::load(r, separate_debug);
    let mut out = String::new();
    if !lines.any() || r.totals.guest_instructions == 0 {
        return out;
    }
    let mut rows: Vec<(Frame, (u64, Addr))> = line_costs(r, &lines).into_iter().collect();
    rows.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
    out.push_str("hotpath: hot lines (share of guest instructions, source line, function):\n");
    for (f, (n, _)) in rows.iter().take(top) {
        let _ = writeln!(
            out,
            "  {:5.1}%  {}:{}  {}",
            100.0 * *n as f64 / r.totals.guest_instructions as f64,
            f.file.as_deref().unwrap_or(crate::callgrind::UNKNOWN),
            f.line,
            f.function.as_deref().unwrap_or(crate::callgrind::UNKNOWN),
        );
    }
    out
}

/// The human report: totals; where the time goes (the top `top` functions by their share of
/// guest instructions, self and with callees, most self first); the hot source lines where
/// the program has debug information (`separate_debug`: also from separate debug files); the top hot paths (count, share of executed
/// blocks, blocks as `symbol+offset`, and with `disasm` each block's guest disassembly where
/// the report has code); the hottest blocks; the busiest indirect branches with their targets
/// and predictability; the system calls and the superblocks.
pub fn render(r: &Report, top: usize, disasm: bool, separate_debug: bool) -> String {
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
    // The blocks are in address order as reports write them (a binary search then, not a
    // map of every block: 2 ms of a `python3 -c pass` summary).
    let sorted = r.blocks.windows(2).all(|w| w[0].addr <= w[1].addr);
    let by_addr: HashMap<Addr, &Block> = if sorted {
        HashMap::new()
    } else {
        r.blocks.iter().map(|b| (b.addr, b)).collect()
    };
    let block_at = |a: Addr| -> Option<&Block> {
        if sorted {
            let i = r.blocks.partition_point(|b| b.addr < a);
            r.blocks.get(i).filter(|b| b.addr == a)
        } else {
            by_addr.get(&a).copied()
        }
    };
    let symbol = |a: Addr| block_at(a).and_then(|b| b.symbol.as_deref());
    let name = |a: Addr| symbol(a).map_or_else(|| a.to_string(), str::to_string);

    let functions = functions_by_share(r);
    if !functions.is_empty() && t.guest_instructions > 0 {
        let pct = |n: u64| 100.0 * n as f64 / t.guest_instructions as f64;
        let inclusive = functions.iter().any(|f| f.2.is_some());
        out.push_str(if inclusive {
            "hotpath: where the time goes (share of guest instructions: self, with callees):\n"
        } else {
            "hotpath: where the time goes (share of guest instructions, by symbol):\n"
        });
        for (f, own, total) in functions.iter().take(top) {
            let _ = match total {
                Some(total) => writeln!(out, "  {:5.1}% {:5.1}%  {f}", pct(*own), pct(*total)),
                None => writeln!(out, "  {:5.1}%  {f}", pct(*own)),
            };
        }
    }

    out.push_str(&hot_lines(r, top, separate_debug));

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
            let names: Vec<String> = p
                .blocks
                .iter()
                .enumerate()
                .take(PATH_NAMES_SHOWN)
                .map(|(i, &a)| {
                    symbol(a)
                        .or_else(|| p.names.get(i).map(String::as_str))
                        .map_or_else(|| a.to_string(), str::to_string)
                })
                .collect();
            let more = match p.blocks.len().saturating_sub(PATH_NAMES_SHOWN) {
                0 => String::new(),
                n => format!(" ... ({n} more)"),
            };
            let _ = writeln!(out, "      {}{more}", names.join(" -> "));
            if !disasm {
                continue;
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
                if let Some(code) = block_at(a).and_then(|b| b.code.as_ref()) {
                    for line in disassemble(a.0, &code.0) {
                        let _ = writeln!(out, "          {line}");
                    }
                }
            }
        }
    }

    let hot = top_rows(r.blocks.iter().collect(), top, |a, b| {
        b.count.cmp(&a.count).then(a.addr.cmp(&b.addr))
    });
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

    let sites = top_rows(r.indirect_jumps.iter().collect(), top, |a, b| {
        b.count.cmp(&a.count).then(a.site.cmp(&b.site))
    });
    if !sites.is_empty() {
        out.push_str("hotpath: busiest indirect branches (site, targets, predictability):\n");
        // Blocks by address, to name the block a site is in (a report's blocks are sorted so).
        let mut starts: Vec<&Block> = r.blocks.iter().collect();
        if !starts.is_sorted_by_key(|b| b.addr) {
            starts.sort_by_key(|b| b.addr);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::pie_run;
    use crate::{HexBytes, PathEnd, PathKind, PathProfile, PathStart, Stack};

    /// The sample with a path profile: `main` calls `f` twice; one path of `main` through all
    /// three of its blocks, whose first block's code is `push rbp; ret`.
    fn with_paths() -> Report {
        let mut r = pie_run(0x1000);
        r.blocks[0].code = Some(HexBytes(vec![0x55, 0xc3]));
        let blocks: Vec<Addr> = r.blocks[..3].iter().map(|b| b.addr).collect();
        r.path_profile = Some(PathProfile {
            paths: vec![PathEntry {
                function: "main".into(),
                function_addr: blocks[0],
                kind: PathKind::Bl,
                id: Some(0),
                count: 1,
                len: 3,
                start: PathStart::Entry,
                end: PathEnd::Exit,
                names: PathEntry::block_names("main", blocks[0], &blocks),
                blocks,
                pap: None,
            }],
            stacks: vec![
                Stack {
                    stack: "main".into(),
                    blocks: 5,
                    instructions: 11,
                },
                Stack {
                    stack: "main;f".into(),
                    blocks: 2,
                    instructions: 10,
                },
            ],
            ..PathProfile::default()
        });
        r
    }

    #[test]
    fn functions_are_ranked_by_their_own_instructions_from_symbols_without_paths() {
        // main: 2 x 2 + 2 x 3 + 1 x 1 = 11 instructions, f: 2 x 5 = 10.
        assert_eq!(
            functions_by_share(&pie_run(0x1000)),
            vec![("main".to_string(), 11, None), ("f".to_string(), 10, None)]
        );
    }

    #[test]
    fn functions_with_a_path_profile_count_their_callees_from_the_folded_stacks() {
        assert_eq!(
            functions_by_share(&with_paths()),
            vec![
                ("main".to_string(), 11, Some(21)),
                ("f".to_string(), 10, Some(10))
            ]
        );
        let text = render(&with_paths(), 10, false, false);
        let where_ = text
            .find("where the time goes")
            .expect("a functions section");
        let hot = text.find("hot paths").expect("a hot paths section");
        assert!(where_ < hot, "functions come first:\n{text}");
        assert!(text.contains("   52.4% 100.0%  main\n"), "{text}");
    }

    #[test]
    fn hot_paths_are_named_by_symbol_and_disassembled_only_on_request() {
        let names = "      main -> main+0x8 -> main+0x14\n";
        let plain = render(&with_paths(), 10, false, false);
        assert!(plain.contains(names), "{plain}");
        assert!(!plain.contains("push rbp"), "{plain}");
        let listed = render(&with_paths(), 10, true, false);
        assert!(listed.contains(names), "{listed}");
        assert!(listed.contains(": push rbp\n"), "{listed}");
    }
}
