//! The profile in callgrind's format, which callgrind_annotate and KCachegrind read.
//!
//! One cost event, `Ir`: guest instructions executed. Positions are guest addresses
//! (`positions: instr`), one cost line per block (its executions × its instructions, at its
//! first instruction). Objects (`ob=`) are the guest's modules; functions (`fn=`) are:
//! - with a path profile (`--paths`): the functions the shadow stack saw, so a block reached
//!   in two functions is split between them by its count in each;
//! - otherwise, and for what the path profile does not cover (other threads): the ELF symbol
//!   covering the block, `???` where none does (as valgrind names them).
//!
//! Calls (`cfn=`, `calls=`) need the shadow call stack, so only a report made with `--paths`
//! has them. A call's count is the caller's exact number of direct and indirect calls to the
//! callee (from the edge and indirect-branch tables); its inclusive cost is the instructions
//! executed in every folded stack where the caller directly calls the callee, counted once per
//! stack (as callgrind counts a recursive cycle's cost once). A function's inclusive cost, as
//! callgrind_annotate adds it up (self + calls), is then exactly the instructions executed
//! while it was on the stack, for functions that do not recurse.
//!
//! Format: valgrind's "Callgrind Format Specification" (docs/cl-format.html), version 1.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use crate::lines::{Run, SourceLines};
use crate::{Addr, Report, ReportError};

/// Name of the function of code no symbol or shadow-stack function covers.
pub const UNKNOWN: &str = "???";

/// A function in the output: its object and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Func {
    ob: String,
    name: String,
}

/// `symbol+0xOFF` without the offset, and `module!symbol` without the module when `module` is
/// the file name of `module_path`; [`UNKNOWN`] for `module+0xOFF` (no symbol covers it).
pub(crate) fn function_of_symbol(symbol: &str, module_path: Option<&str>) -> String {
    function_name(symbol, module_path).to_string()
}

/// [`function_of_symbol`] without allocating: a part of `symbol`, or [`UNKNOWN`] (a report
/// names every block, and the summary sums them by function).
pub(crate) fn function_name<'a>(symbol: &'a str, module_path: Option<&str>) -> &'a str {
    let base = match symbol.rsplit_once('+') {
        Some((f, off)) if off.starts_with("0x") => f,
        _ => symbol,
    };
    if module_path.and_then(|p| p.rsplit('/').next()) == Some(base) {
        return UNKNOWN;
    }
    without_module(base, module_path)
}

/// `name` without a leading `file!` naming the module it is in.
fn strip_module(name: &str, module_path: Option<&str>) -> String {
    without_module(name, module_path).to_string()
}

/// [`strip_module`] without allocating.
fn without_module<'a>(name: &'a str, module_path: Option<&str>) -> &'a str {
    let file = module_path.and_then(|p| p.rsplit('/').next());
    match (name.split_once('!'), file) {
        (Some((m, f)), Some(file)) if m == file => f,
        _ => name,
    }
}

/// Callgrind's name compression for one kind of name (objects, files or functions): `key=(n)
/// name` the first time a name is written, `key=(n)` after.
struct Names<K> {
    ids: HashMap<K, usize>,
}

impl<K> Default for Names<K> {
    fn default() -> Self {
        Names {
            ids: HashMap::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone> Names<K> {
    /// Writes the `key=` line naming `k` (called `name`) to `out`.
    fn write(&mut self, out: &mut String, key: &str, k: &K, name: &str) {
        let n = self.ids.len() + 1;
        match self.ids.get(k) {
            Some(i) => {
                let _ = writeln!(out, "{key}=({i})");
            }
            None => {
                self.ids.insert(k.clone(), n);
                let _ = writeln!(out, "{key}=({n}) {name}");
            }
        }
    }
}

/// Renders `r` in callgrind format.
pub fn render(r: &Report) -> String {
    let ob_of = |module: Option<usize>| {
        module
            .and_then(|m| r.modules.get(m))
            .map_or(UNKNOWN.to_string(), |m| m.path.clone())
    };
    let module_path = |module: Option<usize>| {
        module
            .and_then(|m| r.modules.get(m))
            .map(|m| m.path.as_str())
    };
    let blocks: HashMap<Addr, &crate::Block> = r.blocks.iter().map(|b| (b.addr, b)).collect();

    // Self costs: (function, block address) -> instructions executed.
    let mut costs: BTreeMap<Func, BTreeMap<Addr, u64>> = BTreeMap::new();
    // The shadow-stack functions by name, and each block's function with the most executions
    // of it (who called whom is named by the caller's block).
    let mut by_name: HashMap<&str, Func> = HashMap::new();
    // Shadow-stack functions by entry, and each one's entry.
    let mut by_entry: HashMap<Addr, Func> = HashMap::new();
    let mut entry_of: HashMap<Func, Addr> = HashMap::new();
    let mut owner: HashMap<Addr, (u64, Func)> = HashMap::new();
    let mut covered: HashMap<Addr, u64> = HashMap::new();
    let pp = r.path_profile.as_ref();
    for f in pp.iter().flat_map(|p| &p.functions) {
        let module = r.module_of(f.entry);
        let func = Func {
            ob: ob_of(module),
            name: strip_module(&f.name, module_path(module)),
        };
        by_name.insert(f.name.as_str(), func.clone());
        by_entry.insert(f.entry, func.clone());
        entry_of.insert(func.clone(), f.entry);
        for c in &f.blocks {
            if !blocks.contains_key(&c.addr) {
                continue;
            }
            *covered.entry(c.addr).or_insert(0) += c.count;
            *costs
                .entry(func.clone())
                .or_default()
                .entry(c.addr)
                .or_insert(0) += c.count;
            let o = owner.entry(c.addr).or_insert((0, func.clone()));
            if c.count > o.0 {
                *o = (c.count, func.clone());
            }
        }
    }
    // What the path profile does not cover, by symbol.
    let symbol_func = |b: &crate::Block| Func {
        ob: ob_of(b.module),
        name: b.symbol.as_deref().map_or(UNKNOWN.to_string(), |s| {
            function_of_symbol(s, module_path(b.module))
        }),
    };
    for b in &r.blocks {
        let rest = b
            .count
            .saturating_sub(covered.get(&b.addr).copied().unwrap_or(0));
        if rest > 0 {
            *costs
                .entry(symbol_func(b))
                .or_default()
                .entry(b.addr)
                .or_insert(0) += rest;
        }
    }

    // Calls, from the folded stacks: (caller, callee) -> inclusive instructions.
    let mut inclusive: BTreeMap<(Func, Func), u64> = BTreeMap::new();
    for s in pp.iter().flat_map(|p| &p.stacks) {
        let frames: Vec<Func> = s
            .stack
            .split(';')
            .map(|n| {
                by_name.get(n).cloned().unwrap_or_else(|| Func {
                    ob: UNKNOWN.to_string(),
                    name: n.to_string(),
                })
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        for w in frames.windows(2) {
            if seen.insert((&w[0], &w[1])) {
                *inclusive.entry((w[0].clone(), w[1].clone())).or_insert(0) += s.instructions;
            }
        }
    }
    // Call counts and the hottest call site of each (caller, callee).
    let caller_of = |a: Addr| {
        owner
            .get(&a)
            .map(|o| o.1.clone())
            .or_else(|| blocks.get(&a).map(|b| symbol_func(b)))
    };
    let callee_of = |a: Addr| {
        by_entry
            .get(&a)
            .cloned()
            .or_else(|| blocks.get(&a).map(|b| symbol_func(b)))
    };
    let mut calls: HashMap<(Func, Func), (u64, Addr, u64)> = HashMap::new();
    for (from, to, count) in r.calls() {
        if let (Some(caller), Some(callee)) = (caller_of(from), callee_of(to)) {
            let c = calls.entry((caller, callee)).or_insert((0, from, 0));
            c.0 += count;
            if count > c.2 {
                (c.1, c.2) = (from, count);
            }
        }
    }

    // Each block as runs of instructions of one source line (one run without lines).
    let lines = SourceLines::load(r, true);
    let runs: HashMap<Addr, Vec<Run>> = r
        .blocks
        .iter()
        .filter(|b| b.count > 0)
        .map(|b| (b.addr, lines.runs(b)))
        .collect();
    let runs_of = |a: Addr| runs.get(&a).map_or(&[][..], Vec::as_slice);
    let line_of = |runs: &[Run], last: bool| {
        let run = if last { runs.last() } else { runs.first() };
        run.and_then(|r| r.frames.first()).map_or(0, |f| f.line)
    };

    let mut out = String::new();
    let program = r.argv.join(" ");
    let _ = write!(
        out,
        "# callgrind format\nversion: 1\ncreator: hotpath\npid: 0\ncmd: {program}\npart: 1\n\npositions: instr line\nevents: Ir\nsummary: {}\n\n",
        r.totals.guest_instructions
    );
    // Name compression: every object, file and function named once, then by number.
    let (mut files, mut obs, mut fns) = (Names::default(), Names::default(), Names::default());
    let mut file_ref =
        |out: &mut String, key: &str, file: &str| files.write(out, key, &file.to_string(), file);
    let mut ob_ref =
        |out: &mut String, key: &str, ob: &str| obs.write(out, key, &ob.to_string(), ob);
    let mut fn_ref = |out: &mut String, key: &str, f: &Func| fns.write(out, key, f, &f.name);
    let mut callers: BTreeMap<&Func, Vec<(&Func, u64)>> = BTreeMap::new();
    for ((caller, callee), &incl) in &inclusive {
        callers.entry(caller).or_default().push((callee, incl));
    }
    let mut funcs: Vec<&Func> = costs.keys().chain(callers.keys().copied()).collect();
    funcs.sort();
    funcs.dedup();
    for f in funcs {
        ob_ref(&mut out, "ob", &f.ob);
        // The function's file: where its first line-numbered instruction's function is
        // (the outermost frame); a cost line from an inlined function's file switches to it
        // with `fi=` and back with `fe=`.
        let file_of = |run: &Run| run.frames.last().and_then(|fr| fr.file.clone());
        let home = costs
            .get(f)
            .into_iter()
            .flatten()
            .find_map(|(&a, _)| runs_of(a).iter().find_map(file_of))
            .unwrap_or_else(|| UNKNOWN.to_string());
        file_ref(&mut out, "fl", &home);
        fn_ref(&mut out, "fn", f);
        let mut current = home.clone();
        for (&a, &executions) in costs.get(f).into_iter().flatten() {
            for run in runs_of(a) {
                let (file, line) = run
                    .frames
                    .first()
                    .map_or((None, 0), |fr| (fr.file.clone(), fr.line));
                let file = file.unwrap_or_else(|| home.clone());
                if file != current {
                    file_ref(&mut out, if file == home { "fe" } else { "fi" }, &file);
                    current = file;
                }
                let _ = writeln!(
                    out,
                    "{} {line} {}",
                    run.addr,
                    executions * run.instructions as u64
                );
            }
        }
        if current != home {
            file_ref(&mut out, "fe", &home);
        }
        for &(callee, incl) in callers.get(f).into_iter().flatten() {
            let (count, site, _) =
                calls
                    .get(&(f.clone(), callee.clone()))
                    .copied()
                    .unwrap_or((0, Addr(0), 0));
            let target = entry_of.get(callee).copied().unwrap_or(Addr(0));
            ob_ref(&mut out, "cob", &callee.ob);
            fn_ref(&mut out, "cfn", callee);
            let target_line = line_of(runs_of(target), false);
            let site_runs = runs_of(site);
            let site_line = line_of(site_runs, true);
            let site_addr = site_runs.last().map_or(site, |r| r.addr);
            let _ = writeln!(
                out,
                "calls={count} {target} {target_line}\n{site_addr} {site_line} {incl}"
            );
        }
        out.push('\n');
    }
    out
}

/// Writes `r`'s callgrind file to `path` (atomically, as reports are).
///
/// # Errors
/// [`ReportError::Io`].
pub fn write(r: &Report, path: &Path) -> Result<(), ReportError> {
    crate::write_atomically(path, |w| w.write_all(render(r).as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::pie_run;

    #[test]
    fn symbols_name_functions_without_offsets_or_their_own_module() {
        let libc = Some("/usr/lib/libc.so.6");
        assert_eq!(function_of_symbol("main+0x14", None), "main");
        assert_eq!(function_of_symbol("libc.so.6!memcpy+0x40", libc), "memcpy");
        assert_eq!(function_of_symbol("libc.so.6+0x29d90", libc), UNKNOWN);
        assert_eq!(function_of_symbol("operator+", None), "operator+");
        assert_eq!(function_of_symbol("other.so!f", libc), "other.so!f");
    }

    #[test]
    fn self_costs_without_a_path_profile_are_by_symbol() {
        let r = pie_run(0x1000);
        let text = render(&r);
        assert!(
            text.contains("positions: instr line\nevents: Ir\nsummary: 21\n"),
            "{text}"
        );
        // main: 2 x 2 + 2 x 3 + 1 x 1 instructions at its three blocks; f: 2 x 5. The module
        // file does not exist: no source file, line 0.
        assert!(
            text.contains("fl=(1) ???\nfn=(1) f\n0x1200 0 10\n"),
            "{text}"
        );
        assert!(
            text.contains("fn=(2) main\n0x1100 0 4\n0x1108 0 6\n0x1114 0 1\n"),
            "{text}"
        );
        assert!(
            !text.contains("calls="),
            "no calls without the shadow stack: {text}"
        );
    }
}
