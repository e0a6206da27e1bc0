//! Summing the reports of many runs of one program (`hotpath merge`), the unit of fleet
//! profiling.
//!
//! Runs of one program are the same program file with the same build id. Its libraries and
//! a position-independent program load at other addresses in every run, so before anything is
//! summed each later report's addresses are moved into the first report's address space:
//! an address inside a module goes to the same offset in the first report's module with the
//! same path and build id (a module the first run did not map keeps its addresses and is
//! added to the module list). Addresses in no module (JIT code) are summed as they are.
//!
//! Then every count is summed by what identifies it: blocks by address, edges by
//! `(from, to, kind)`, indirect targets by `(site, target)`, system calls by number and site,
//! superblocks by their trace, paths by `(kind, function, blocks, start, end)`, function CFGs
//! by entry, block and edge, folded stacks by their frames. Per-run facts are kept from the
//! first report (`ending`, `argv`), concatenated (`threads`), or kept only where every run
//! agrees (a path's Ball-Larus id, a function's path count: each run numbers paths under its
//! own final CFG, so an id two runs disagree on becomes null).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::{
    most_frequent_first, Addr, Block, Count, Edge, EdgeKind, Function, FunctionEdge, IndirectSite,
    KPath, Module, PathEnd, PathEntry, PathKind, PathProfile, PathStart, Report, ReportError,
    Stack, Superblock, Syscall,
};

/// Moves addresses of one report into the merged report's address space.
struct Rebase {
    /// `(start, end, delta)` per module of the report being merged.
    ranges: Vec<(u64, u64, u64)>,
}

impl Rebase {
    fn addr(&self, a: Addr) -> Addr {
        self.ranges
            .iter()
            .rev()
            .find(|(s, e, _)| (*s..*e).contains(&a.0))
            .map_or(a, |(_, _, d)| Addr(a.0.wrapping_add(*d)))
    }
    fn count(&self, c: &Count) -> Count {
        Count {
            addr: self.addr(c.addr),
            count: c.count,
        }
    }
}

/// A path's identity across runs.
type PathKey = (PathKind, Addr, Vec<Addr>, PathStart, PathEnd);

/// Sums `reports` (file name, report) into one report. The first report's program, argv,
/// ending and addresses are the merged one's.
///
/// # Errors
/// [`ReportError::Mismatch`] when the reports are of different programs (path or build id),
/// or when some were recorded with `--paths` and others without, or with different `--k`.
///
/// # Panics
/// When `reports` is empty.
pub fn merge(reports: Vec<(PathBuf, Report)>) -> Result<Report, ReportError> {
    let mut it = reports.into_iter();
    let (first_path, first) = it.next().expect("at least one report");
    let mut m = Merger::new(first);
    for (path, r) in it {
        m.check(&first_path, &path, &r)?;
        m.add(r);
    }
    Ok(m.finish())
}

/// The running sum.
struct Merger {
    base: Report,
    modules: Vec<Module>,
    blocks: BTreeMap<Addr, Block>,
    edges: BTreeMap<(Addr, Addr, EdgeKind), u64>,
    indirect: BTreeMap<Addr, (crate::Terminator, HashMap<Addr, u64>)>,
    syscalls: BTreeMap<u32, (String, u64, HashMap<Addr, u64>)>,
    superblocks: Vec<Superblock>,
    /// Index in `superblocks` by trace.
    superblock_index: HashMap<Vec<Addr>, usize>,
    paths: Option<PathSum>,
}

/// The running sum of path profiles.
/// One function summed over the reports: itself, its block counts by address, its edge counts
/// by (from, to, taken).
type FunctionSum = (
    Function,
    BTreeMap<Addr, u64>,
    BTreeMap<(Addr, Addr, bool), u64>,
);

#[derive(Default)]
struct PathSum {
    k: usize,
    paths: Vec<PathEntry>,
    index: HashMap<PathKey, usize>,
    k_paths: BTreeMap<(String, Vec<Option<u64>>), u64>,
    functions: BTreeMap<Addr, FunctionSum>,
    stacks: BTreeMap<String, (u64, u64)>,
    stats: crate::PathStats,
}

/// The path profiles of one run's threads summed as `merge` sums runs (paths keyed by what
/// they are, functions by entry, stacks by their frames, statistics added); `None` for none.
pub fn sum_path_profiles(profiles: Vec<PathProfile>) -> Option<PathProfile> {
    let mut it = profiles.into_iter();
    let first = it.next()?;
    let mut sum = PathSum {
        k: first.k,
        ..PathSum::default()
    };
    let same = Rebase { ranges: Vec::new() };
    sum.add(first, &same);
    for p in it {
        sum.add(p, &same);
    }
    Some(sum.finish())
}

fn key(p: &PathEntry) -> PathKey {
    (p.kind, p.function_addr, p.blocks.clone(), p.start, p.end)
}

impl Merger {
    fn new(first: Report) -> Merger {
        let mut m = Merger {
            modules: first.modules.clone(),
            blocks: BTreeMap::new(),
            edges: BTreeMap::new(),
            indirect: BTreeMap::new(),
            syscalls: BTreeMap::new(),
            superblocks: Vec::new(),
            superblock_index: HashMap::new(),
            paths: first.path_profile.as_ref().map(|p| PathSum {
                k: p.k,
                ..PathSum::default()
            }),
            base: Report {
                threads: Vec::new(),
                totals: Default::default(),
                ..first.clone()
            },
        };
        m.sum(first, &Rebase { ranges: Vec::new() });
        m
    }

    /// Refuses a report of another program, or with other path options.
    fn check(&self, first: &Path, other: &Path, r: &Report) -> Result<(), ReportError> {
        let mismatch = |reason: String| ReportError::Mismatch {
            first: first.to_path_buf(),
            other: other.to_path_buf(),
            reason,
        };
        if r.program != self.base.program {
            return Err(mismatch(format!(
                "different programs ({} and {})",
                self.base.program, r.program
            )));
        }
        let id = |rep: &Report| rep.modules.first().and_then(|m| m.build_id.clone());
        if let (Some(a), Some(b)) = (id(&self.base), id(r)) {
            if a != b {
                return Err(mismatch(format!(
                    "different builds of {} (build ids {a} and {b})",
                    r.program
                )));
            }
        }
        match (&self.paths, &r.path_profile) {
            (Some(_), None) | (None, Some(_)) => Err(mismatch(
                "one was recorded with --paths and the other without".into(),
            )),
            (Some(a), Some(b)) if a.k != b.k => Err(mismatch(format!(
                "recorded with different --k ({} and {})",
                a.k, b.k
            ))),
            _ => Ok(()),
        }
    }

    /// Adds a later report: its modules matched to the merged ones, then its counts.
    fn add(&mut self, r: Report) {
        let mut ranges = Vec::new();
        for m in &r.modules {
            let same = self
                .modules
                .iter()
                .find(|k| k.path == m.path && k.build_id == m.build_id && k.size == m.size);
            match same {
                Some(k) => {
                    ranges.push((m.base.0, m.base.0 + m.size, k.base.0.wrapping_sub(m.base.0)))
                }
                None => self.modules.push(m.clone()),
            }
        }
        self.sum(r, &Rebase { ranges });
    }

    fn sum(&mut self, r: Report, rb: &Rebase) {
        let t = &mut self.base.totals;
        let u = &r.totals;
        t.blocks_executed += u.blocks_executed;
        t.guest_instructions += u.guest_instructions;
        t.blocks_translated += u.blocks_translated;
        t.blocks_loaded += u.blocks_loaded;
        t.translation_cache_errors += u.translation_cache_errors;
        t.translation_ns += u.translation_ns;
        t.events += u.events;
        t.ring_waits += u.ring_waits;
        t.ring_wait_ns += u.ring_wait_ns;
        t.monitor_busy_ns += u.monitor_busy_ns;
        for th in r.threads {
            let hottest = th.hottest.iter().map(|c| rb.count(c)).collect();
            // A thread's own path section stays with its run: the merged `path_profile` sums
            // every run's.
            self.base.threads.push(crate::Thread {
                hottest,
                path_profile: None,
                ..th
            });
        }
        for b in r.blocks {
            let addr = rb.addr(b.addr);
            self.blocks
                .entry(addr)
                .and_modify(|k| k.count += b.count)
                .or_insert(Block { addr, ..b });
        }
        for e in r.edges {
            *self
                .edges
                .entry((rb.addr(e.from), rb.addr(e.to), e.kind))
                .or_insert(0) += e.count;
        }
        for s in r.indirect_jumps {
            let site = self
                .indirect
                .entry(rb.addr(s.site))
                .or_insert_with(|| (s.kind, HashMap::new()));
            for t in &s.targets {
                *site.1.entry(rb.addr(t.addr)).or_insert(0) += t.count;
            }
        }
        for s in r.syscalls {
            let e = self
                .syscalls
                .entry(s.nr)
                .or_insert_with(|| (s.name.clone(), 0, HashMap::new()));
            e.1 += s.count;
            for c in &s.sites {
                *e.2.entry(rb.addr(c.addr)).or_insert(0) += c.count;
            }
        }
        for s in r.superblocks {
            let blocks: Vec<Addr> = s.blocks.iter().map(|&a| rb.addr(a)).collect();
            match self.superblock_index.get(&blocks) {
                Some(&i) => {
                    let k = &mut self.superblocks[i];
                    k.entries += s.entries;
                    k.completed += s.completed;
                    for x in &s.side_exits {
                        match k.side_exits.iter_mut().find(|y| y.after == x.after) {
                            Some(y) => y.count += x.count,
                            None => k.side_exits.push(*x),
                        }
                    }
                    k.side_exits.sort_by_key(|x| x.after);
                }
                None => {
                    self.superblock_index
                        .insert(blocks.clone(), self.superblocks.len());
                    self.superblocks.push(Superblock {
                        head: rb.addr(s.head),
                        blocks,
                        ..s
                    });
                }
            }
        }
        if let (Some(sum), Some(p)) = (self.paths.as_mut(), r.path_profile) {
            sum.add(p, rb);
        }
    }

    fn finish(self) -> Report {
        let mut r = self.base;
        r.blocks = self.blocks.into_values().collect();
        r.attribute_modules(self.modules);
        r.totals.distinct_blocks = r.blocks.len() as u64;
        r.edges = self
            .edges
            .into_iter()
            .map(|((from, to, kind), count)| Edge {
                from,
                to,
                kind,
                count,
            })
            .collect();
        r.indirect_jumps = self
            .indirect
            .into_iter()
            .map(|(site, (kind, targets))| IndirectSite::new(site, kind, targets))
            .collect();
        r.syscalls = self
            .syscalls
            .into_iter()
            .map(|(nr, (name, count, sites))| Syscall {
                nr,
                name,
                count,
                sites: most_frequent_first(sites),
            })
            .collect();
        r.superblocks = self.superblocks;
        r.superblocks
            .sort_by(|a, b| b.entries.cmp(&a.entries).then(a.head.cmp(&b.head)));
        r.path_profile = self.paths.map(PathSum::finish);
        r
    }
}

impl PathSum {
    /// The merged name of each of `p`'s functions: the name the merged profile already has
    /// for the function at the rebased entry, else its own (a `sub_<hex>` name, which is its
    /// entry address, follows the entry).
    fn renames(&self, p: &PathProfile, rb: &Rebase) -> HashMap<String, String> {
        p.functions
            .iter()
            .map(|f| {
                let entry = rb.addr(f.entry);
                let name = match self.functions.get(&entry) {
                    Some((known, _, _)) => known.name.clone(),
                    None if f.name == format!("sub_{:x}", f.entry.0) => {
                        format!("sub_{:x}", entry.0)
                    }
                    None => f.name.clone(),
                };
                (f.name.clone(), name)
            })
            .collect()
    }

    fn add(&mut self, mut p: PathProfile, rb: &Rebase) {
        let renames = self.renames(&p, rb);
        let rename = |n: &mut String| {
            if let Some(r) = renames.get(n.as_str()) {
                n.clone_from(r);
            }
        };
        for f in &mut p.functions {
            rename(&mut f.name);
        }
        for k in &mut p.k_paths {
            rename(&mut k.function);
        }
        for s in &mut p.stacks {
            let frames: Vec<String> = s
                .stack
                .split(';')
                .map(|f| renames.get(f).cloned().unwrap_or_else(|| f.to_string()))
                .collect();
            s.stack = frames.join(";");
        }
        for mut e in p.paths {
            let old = e.function.clone();
            rename(&mut e.function);
            e.function_addr = rb.addr(e.function_addr);
            for a in &mut e.blocks {
                *a = rb.addr(*a);
            }
            // Names made from the function's (and bare addresses) follow it; a block named by
            // its own module and symbol keeps its name.
            let fresh = PathEntry::block_names(&e.function, e.function_addr, &e.blocks);
            for (name, f) in e.names.iter_mut().zip(fresh) {
                if *name == old || name.starts_with(&format!("{old}+")) || name.starts_with("0x") {
                    *name = f;
                }
            }
            if let Some(pap) = &mut e.pap {
                for b in &mut pap.breakpoints {
                    b.block = rb.addr(b.block);
                }
            }
            match self.index.get(&key(&e)) {
                Some(&i) => {
                    let k = &mut self.paths[i];
                    k.count += e.count;
                    if k.id != e.id {
                        k.id = None;
                    }
                }
                None => {
                    self.index.insert(key(&e), self.paths.len());
                    self.paths.push(e);
                }
            }
        }
        for k in p.k_paths {
            *self.k_paths.entry((k.function, k.ids)).or_insert(0) += k.count;
        }
        for f in p.functions {
            let entry = rb.addr(f.entry);
            let e = self.functions.entry(entry).or_insert_with(|| {
                (
                    Function {
                        entry,
                        blocks: Vec::new(),
                        edges: Vec::new(),
                        ..f.clone()
                    },
                    BTreeMap::new(),
                    BTreeMap::new(),
                )
            });
            if e.0.num_paths != f.num_paths {
                e.0.num_paths = None;
            }
            for b in &f.blocks {
                *e.1.entry(rb.addr(b.addr)).or_insert(0) += b.count;
            }
            for x in &f.edges {
                *e.2.entry((rb.addr(x.from), rb.addr(x.to), x.back))
                    .or_insert(0) += x.count;
            }
        }
        for s in p.stacks {
            let e = self.stacks.entry(s.stack).or_insert((0, 0));
            e.0 += s.blocks;
            e.1 += s.instructions;
        }
        let st = &mut self.stats;
        st.shadow_stack_resyncs += p.stats.shadow_stack_resyncs;
        st.pap_abandoned += p.stats.pap_abandoned;
        st.pap_runs += p.stats.pap_runs;
        st.pap_distinct_runs = st.pap_distinct_runs.max(p.stats.pap_distinct_runs);
        st.shadow_stack_dropped_frames += p.stats.shadow_stack_dropped_frames;
        for (cause, n) in p.stats.resyncs_by_cause {
            *st.resyncs_by_cause.entry(cause).or_insert(0) += n;
        }
        for e in p.stats.numbering_errors {
            if !st.numbering_errors.contains(&e) {
                st.numbering_errors.push(e);
            }
        }
    }

    fn finish(self) -> PathProfile {
        let mut paths = self.paths;
        // Ball-Larus paths in the report's order, then PAP runs by blocks executed (as the
        // monitor lists them).
        paths.sort_by(|a, b| {
            (a.kind == PathKind::Pap)
                .cmp(&(b.kind == PathKind::Pap))
                .then_with(|| a.report_order(b))
        });
        let mut seen: HashMap<Addr, u64> = HashMap::new();
        for p in paths.iter().filter(|p| p.kind == PathKind::Bl) {
            *seen.entry(p.function_addr).or_insert(0) += 1;
        }
        let mut functions: Vec<Function> = self
            .functions
            .into_values()
            .map(|(mut f, blocks, edges)| {
                f.paths_seen = seen.get(&f.entry).copied().unwrap_or(0);
                f.blocks = blocks
                    .into_iter()
                    .map(|(addr, count)| Count { addr, count })
                    .collect();
                f.edges = edges
                    .into_iter()
                    .map(|((from, to, back), count)| FunctionEdge {
                        from,
                        to,
                        count,
                        back,
                    })
                    .collect();
                f
            })
            .collect();
        let executed = |f: &Function| f.blocks.iter().map(|b| b.count).sum::<u64>();
        functions.sort_by(|a, b| executed(b).cmp(&executed(a)).then(a.entry.cmp(&b.entry)));
        PathProfile {
            k: self.k,
            paths,
            k_paths: self
                .k_paths
                .into_iter()
                .map(|((function, ids), count)| KPath {
                    function,
                    ids,
                    count,
                })
                .collect(),
            functions,
            stacks: self
                .stacks
                .into_iter()
                .map(|(stack, (blocks, instructions))| Stack {
                    stack,
                    blocks,
                    instructions,
                })
                .collect(),
            stats: self.stats,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::pie_run;

    #[test]
    fn runs_at_other_bases_sum_at_the_first_runs_addresses() {
        let (a, b) = (pie_run(0x5555_0000_0000), pie_run(0x7777_0000_0000));
        let m = merge(vec![("a".into(), a.clone()), ("b".into(), b)]).unwrap();
        assert_eq!(m.modules, a.modules);
        assert_eq!(m.blocks.len(), a.blocks.len());
        for (x, y) in m.blocks.iter().zip(&a.blocks) {
            assert_eq!(
                (x.addr, x.count, x.module, x.offset),
                (y.addr, 2 * y.count, y.module, y.offset)
            );
        }
        for (x, y) in m.edges.iter().zip(&a.edges) {
            assert_eq!(
                (x.from, x.to, x.kind, x.count),
                (y.from, y.to, y.kind, 2 * y.count)
            );
        }
        assert_eq!(m.indirect_jumps[0].targets[0].count, 4);
        assert_eq!(m.indirect_jumps[0].count, 4);
        assert_eq!(
            m.syscalls[0].sites[0],
            Count {
                addr: a.syscalls[0].sites[0].addr,
                count: 2
            }
        );
        assert_eq!(m.totals.guest_instructions, 2 * a.totals.guest_instructions);
        assert_eq!(m.totals.distinct_blocks, 4);
        assert_eq!(m.threads.len(), 2);
        assert_eq!(m.threads[1].hottest[0].addr, a.threads[0].hottest[0].addr);
    }

    #[test]
    fn other_programs_and_builds_are_refused() {
        let a = pie_run(0x1000);
        let mut b = pie_run(0x1000);
        b.program = "/bin/other".into();
        let e = merge(vec![("a".into(), a.clone()), ("b".into(), b)]).unwrap_err();
        assert!(e.to_string().contains("different programs"), "{e}");
        let mut b = pie_run(0x1000);
        b.modules[0].build_id = Some("ef01".into());
        let e = merge(vec![("a".into(), a.clone()), ("b".into(), b)]).unwrap_err();
        assert!(e.to_string().contains("different builds"), "{e}");
        let mut b = pie_run(0x1000);
        b.path_profile = Some(PathProfile::default());
        let e = merge(vec![("a".into(), a), ("b".into(), b)]).unwrap_err();
        assert!(e.to_string().contains("--paths"), "{e}");
    }
}
