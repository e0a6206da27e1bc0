//! The profile as reported: the monitor's per-id tables aggregated by guest address into a
//! [`Report`] (a block translated twice, before and after a code cache flush, is one block
//! here).

use std::collections::{BTreeMap, HashMap};

use hotpath_events::{IdKind, NewBlock};
use hotpath_ir::{syscall_name, Terminator, TerminatorKind};
use hotpath_report::{
    most_frequent, most_frequent_first, Addr, Block, Count, Edge, EdgeKind, Ending, IndirectSite,
    Report, SideExit, Superblock, Syscall, Thread, Totals, SCHEMA,
};

use crate::Tables;

/// Names a guest address `symbol+offset`, when a symbol covers it.
pub type Symbolizer<'a> = &'a (dyn Fn(u64) -> Option<(String, u64)> + Sync);

/// Blocks listed per thread in [`Thread::hottest`].
pub const THREAD_HOTTEST: usize = 20;

/// What the report says about the run besides the tables.
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
    /// Of those, blocks placed from the persisted translation cache.
    pub blocks_loaded: u64,
    /// Translation cache files that could not be written, or a cache directory that could
    /// not be used.
    pub translation_cache_errors: u64,
    /// Wall time the translator spent translating them, in nanoseconds (all threads).
    pub translation_ns: u64,
}

/// Which of the tables' rows a report is built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// Every row: what the JSON report and the other files write.
    All,
    /// Every row but the direct edges (`Report::edges` left empty), which the text summary
    /// does not show (54,000 of them, sorted, for `python3 -c pass`).
    NoDirectEdges,
}

/// The report's name for a terminator kind.
fn terminator(kind: TerminatorKind) -> hotpath_report::Terminator {
    use hotpath_report::Terminator as T;
    match kind {
        TerminatorKind::Jump => T::Jump,
        TerminatorKind::Branch => T::Branch,
        TerminatorKind::Call => T::Call,
        TerminatorKind::FallThrough => T::Fallthrough,
        TerminatorKind::IndirectJump => T::IndirectJump,
        TerminatorKind::IndirectCall => T::IndirectCall,
        TerminatorKind::Return => T::Return,
        TerminatorKind::Syscall => T::Syscall,
        TerminatorKind::Trap => T::Trap,
    }
}

/// `(guest address, count)` pairs most frequent first, equal counts by address.
fn sorted_desc(m: HashMap<u64, u64>) -> Vec<Count> {
    most_frequent_first(m.into_iter().map(|(a, c)| (Addr(a), c)))
}

/// `symbol` or `symbol+0xOFF` of `addr`, when `symbolize` knows it.
fn name(symbolize: Symbolizer, addr: u64) -> Option<String> {
    symbolize(addr).map(|(mut s, off)| {
        if off != 0 {
            // Onto the symbol's own string: a report names every block it lists.
            use std::fmt::Write as _;
            let _ = write!(s, "+{off:#x}");
        }
        s
    })
}

/// The share of the thread `tid` whose events `tables` counted (every id known).
pub fn thread_report(tid: u32, tables: &Tables, ring_waits: u64, ring_wait_ns: u64) -> Thread {
    thread_report_with(tid, tables, tables, ring_waits, ring_wait_ns)
}

/// [`thread_report`] with the ids' metadata read from `meta` (tables over the same ids that
/// learned every id `tables` counted).
pub fn thread_report_with(
    tid: u32,
    tables: &Tables,
    meta: &Tables,
    ring_waits: u64,
    ring_wait_ns: u64,
) -> Thread {
    // Fx, not SipHash: a thread that ends while others run is summed here as it ends (python3
    // starting 200 threads one after another: 4 % of the monitor's samples in SipHash).
    let mut by_addr: rustc_hash::FxHashMap<u64, u64> = Default::default();
    let (mut blocks_executed, mut guest_instructions) = (0, 0);
    for (id, c) in tables.counted_blocks_with(meta) {
        let b = known_summary(meta, id);
        blocks_executed += c;
        guest_instructions += c * b.instructions as u64;
        *by_addr.entry(b.start.0).or_insert(0) += c;
    }
    let hottest = most_frequent(
        by_addr.into_iter().map(|(a, c)| (Addr(a), c)),
        THREAD_HOTTEST,
    );
    Thread {
        tid,
        events: tables.events,
        blocks_executed,
        guest_instructions,
        ring_waits,
        ring_wait_ns,
        hottest,
        path_profile: None,
    }
}

/// The row of a process's only thread, read off the process's `report` (what
/// [`thread_report`] gives for the same tables, without counting the blocks again): its
/// `events`, the report's totals and its hottest blocks.
pub fn thread_row_of(
    tid: u32,
    report: &Report,
    events: u64,
    ring_waits: u64,
    ring_wait_ns: u64,
) -> Thread {
    let hottest = most_frequent(
        report.blocks.iter().map(|b| (b.addr, b.count)),
        THREAD_HOTTEST,
    );
    Thread {
        tid,
        events,
        blocks_executed: report.totals.blocks_executed,
        guest_instructions: report.totals.guest_instructions,
        ring_waits,
        ring_wait_ns,
        hottest,
        path_profile: None,
    }
}

/// The report of `tables` (every thread's counts over one id space) for `run`: blocks, edges,
/// indirect sites, system calls and superblocks aggregated by guest address, blocks named
/// with `symbolize`. Threads, modules and path profiles are left empty for the caller.
pub fn report_of(tables: &Tables, symbolize: Symbolizer, run: RunInfo, rows: Rows) -> Report {
    // The block rows and the edge rows are independent: a long run's are built on two cores
    // when the process may use two (the monitor's is idle by now): 8 ms each for
    // `python3 -c pass`'s 38,000 blocks and 40,000 edges.
    let parallel = std::thread::available_parallelism().is_ok_and(|n| n.get() > 1);
    report_with(tables, symbolize, run, rows, parallel)
}

/// [`report_of`], the block and edge rows built on two threads when `parallel` and there are
/// at least [`PARALLEL_EDGES`] edges.
fn report_with(
    tables: &Tables,
    symbolize: Symbolizer,
    run: RunInfo,
    rows: Rows,
    parallel: bool,
) -> Report {
    let (counts, all_edges) = tables.counts_and_edges();
    let mut totals = Totals {
        blocks_translated: run.blocks_translated,
        blocks_loaded: run.blocks_loaded,
        translation_cache_errors: run.translation_cache_errors,
        translation_ns: run.translation_ns,
        events: tables.events,
        ..Totals::default()
    };
    let (report_blocks, (edges, indirect_jumps)) = if parallel && all_edges.len() >= PARALLEL_EDGES
    {
        std::thread::scope(|s| {
            // A thread that cannot be made (a process limit) leaves the work to this one.
            let edges = std::thread::Builder::new()
                .spawn_scoped(s, || edge_rows(tables, &all_edges, rows))
                .ok();
            let blocks = block_rows(tables, &counts, symbolize, &mut totals);
            let edges = match edges {
                // A panic there is one here.
                Some(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                None => edge_rows(tables, &all_edges, rows),
            };
            (blocks, edges)
        })
    } else {
        let blocks = block_rows(tables, &counts, symbolize, &mut totals);
        (blocks, edge_rows(tables, &all_edges, rows))
    };
    let mut syscalls: Vec<Syscall> = tables
        .syscalls
        .iter()
        .map(|(&nr, s)| {
            let mut sites: HashMap<u64, u64> = HashMap::new();
            for (&id, &c) in &s.sites {
                let addr = tables
                    .summary(tables.last_block(id))
                    .map(|b| b.terminator_addr.0)
                    .unwrap_or(0);
                *sites.entry(addr).or_insert(0) += c;
            }
            Syscall {
                nr,
                name: syscall_name(nr as u64).unwrap_or("unknown").to_string(),
                count: s.count,
                sites: sorted_desc(sites),
            }
        })
        .collect();
    syscalls.sort_by_key(|s| s.nr);

    let mut superblocks: Vec<Superblock> = tables
        .superblock_runs()
        .into_iter()
        .filter_map(|(id, entries, exits)| {
            let trace = tables.trace(id)?;
            let addrs: Vec<u64> = trace
                .iter()
                .map(|b| known_summary(tables, b.0).start.0)
                .collect();
            Some(Superblock {
                head: Addr(addrs[0]),
                symbol: name(symbolize, addrs[0]),
                instructions: trace
                    .iter()
                    .map(|b| known_summary(tables, b.0).instructions as u64)
                    .sum(),
                blocks: addrs.into_iter().map(Addr).collect(),
                entries,
                completed: entries - exits.iter().sum::<u64>(),
                side_exits: exits
                    .iter()
                    .enumerate()
                    .filter(|(_, &c)| c > 0)
                    .map(|(i, &count)| SideExit {
                        after: i as u32,
                        count,
                    })
                    .collect(),
            })
        })
        .collect();
    superblocks.sort_by(|a, b| b.entries.cmp(&a.entries).then(a.head.cmp(&b.head)));

    Report {
        schema: SCHEMA.to_string(),
        program: run.program,
        argv: run.argv,
        ending: run.ending,
        totals,
        threads: Vec::new(),
        blocks: report_blocks,
        modules: Vec::new(),
        edges,
        indirect_jumps,
        syscalls,
        superblocks,
        path_profile: None,
    }
}

/// Edge-list lengths from which [`report_of`] builds the block and edge rows on two threads.
const PARALLEL_EDGES: usize = 8192;

/// The report's block rows from `counts` (by id), sorted by address, blocks of one address
/// summed; adds the executions and instructions to `totals`.
fn block_rows(
    tables: &Tables,
    counts: &[u64],
    symbolize: Symbolizer,
    totals: &mut Totals,
) -> Vec<Block> {
    // Ids counted, by guest address and then id: the blocks of one address (translated again
    // after its code changed) are summed under the first one's metadata. Sorted, not put in
    // a B-tree: a short run's report has a thousand blocks and edges, each a B-tree insert.
    let mut counted: Vec<(u64, usize)> = Vec::with_capacity(tables.known());
    for (id, b) in tables.summaries().enumerate() {
        let c = counts[id];
        totals.blocks_executed += c;
        totals.guest_instructions += c * b.instructions as u64;
        if c != 0 {
            counted.push((b.start.0, id));
        }
    }
    counted.sort_unstable();
    let mut report_blocks: Vec<Block> = Vec::with_capacity(counted.len());
    for &(addr, id) in &counted {
        match report_blocks.last_mut() {
            Some(last) if last.addr.0 == addr => last.count += counts[id],
            _ => {
                let b = known_summary(tables, id as u32);
                report_blocks.push(Block {
                    addr: Addr(addr),
                    count: counts[id],
                    instructions: b.instructions,
                    bytes: b.len_bytes,
                    terminator: terminator(b.kind()),
                    symbol: name(symbolize, addr),
                    module: None,
                    offset: None,
                    code: None,
                });
            }
        }
    }
    totals.distinct_blocks = report_blocks.len() as u64;
    report_blocks
}

/// The summary of id `id`, which `tables` knows (every id a report shows was learnt first).
fn known_summary(tables: &Tables, id: u32) -> &hotpath_ir::BlockSummary {
    tables.summary(id).expect("a known id")
}

/// The report's edge rows (with [`Rows::All`]) and indirect sites from the stream's edges
/// `all_edges` (`(from id, to id, count)`), each sorted by address.
fn edge_rows(
    tables: &Tables,
    all_edges: &[(u32, u32, u64)],
    rows: Rows,
) -> (Vec<Edge>, Vec<IndirectSite>) {
    let direct = rows == Rows::All;
    let mut edge_counts: Vec<((u64, u64, EdgeKind), u64)> =
        Vec::with_capacity(if direct { all_edges.len() } else { 0 });
    let mut indirect: BTreeMap<u64, (TerminatorKind, rustc_hash::FxHashMap<u64, u64>)> =
        BTreeMap::new();
    for &(from, to, c) in all_edges {
        let Some(f) = tables.summary(from) else {
            continue;
        };
        let is_indirect = matches!(
            f.terminator,
            Terminator::IndirectJump | Terminator::IndirectCall { .. } | Terminator::Return
        );
        if !direct && !is_indirect {
            continue;
        }
        let Some(t) = tables.summary(to) else {
            continue;
        };
        let kind = match f.terminator {
            Terminator::Branch { taken, .. } if t.start == taken => EdgeKind::Taken,
            Terminator::Branch { not_taken, .. } if t.start == not_taken => EdgeKind::NotTaken,
            Terminator::Jump { target } if t.start == target => EdgeKind::Jump,
            Terminator::Call { target, .. } if t.start == target => EdgeKind::Call,
            Terminator::FallThrough { next } if t.start == next => EdgeKind::Fallthrough,
            Terminator::Syscall { next } if t.start == next => EdgeKind::Syscall,
            Terminator::IndirectJump | Terminator::IndirectCall { .. } | Terminator::Return => {
                let site = indirect
                    .entry(f.terminator_addr.0)
                    .or_insert_with(|| (f.kind(), Default::default()));
                *site.1.entry(t.start.0).or_insert(0) += c;
                continue;
            }
            _ => EdgeKind::Other,
        };
        edge_counts.push(((f.start.0, t.start.0, kind), c));
    }
    edge_counts.sort_unstable_by_key(|&(key, _)| key);
    let mut edges: Vec<Edge> = Vec::with_capacity(edge_counts.len());
    for ((from, to, kind), count) in edge_counts {
        match edges.last_mut() {
            Some(e) if (e.from.0, e.to.0, e.kind) == (from, to, kind) => e.count += count,
            _ => edges.push(Edge {
                from: Addr(from),
                to: Addr(to),
                kind,
                count,
            }),
        }
    }
    let indirect_jumps = indirect
        .into_iter()
        .map(|(site, (kind, targets))| {
            let targets = targets.into_iter().map(|(a, c)| (Addr(a), c));
            IndirectSite::new(Addr(site), terminator(kind), targets)
        })
        .collect();
    (edges, indirect_jumps)
}

/// Gives every block of `report` its guest code bytes as they were last translated at its
/// address (from `ids`, the ids' metadata in id order; a block retranslated after the guest
/// rewrote its code shows the latest bytes). Nothing is read from the guest's memory, which
/// may be gone by now.
pub fn add_code<'a>(report: &mut Report, ids: impl Iterator<Item = &'a NewBlock>) {
    let mut code: HashMap<u64, &[u8]> = HashMap::new();
    for b in ids {
        if b.kind == IdKind::Block {
            code.insert(b.summary.start.0, &b.code);
        }
    }
    for b in &mut report.blocks {
        if let Some(bytes) = code.get(&b.addr.0).filter(|c| c.len() == b.bytes as usize) {
            b.code = Some(hotpath_report::HexBytes(bytes.to_vec()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hotpath_ir::{BlockId, BlockSummary, GuestAddr};

    /// Tables over `n` blocks of every kind of terminator, fed a pseudo-random stream that
    /// makes more than [`PARALLEL_EDGES`] distinct edges.
    fn busy_tables(n: u32) -> Tables {
        let mut t = Tables::default();
        let addr = |i: u32| GuestAddr(0x40_0000 + 0x20 * i as u64);
        for i in 0..n {
            let start = addr(i);
            let terminator = match i % 5 {
                0 => Terminator::Branch {
                    cond: hotpath_ir::Cond::Ne,
                    taken: addr((i * 7 + 3) % n),
                    not_taken: addr((i + 1) % n),
                },
                1 => Terminator::Jump {
                    target: addr((i * 11) % n),
                },
                2 => Terminator::Return,
                3 => Terminator::IndirectJump,
                _ => Terminator::FallThrough {
                    next: addr((i + 1) % n),
                },
            };
            t.learn(&NewBlock {
                id: BlockId(i),
                summary: BlockSummary {
                    start,
                    terminator_addr: GuestAddr(start.0 + 12),
                    len_bytes: 16,
                    instructions: 1 + i % 4,
                    terminator,
                },
                kind: IdKind::Block,
                code: Box::default(),
            });
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let stream: Vec<u32> = (0..200_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % n as u64) as u32
            })
            .collect();
        for chunk in stream.chunks(4096) {
            t.record(chunk);
        }
        t
    }

    #[test]
    fn rows_built_on_two_threads_equal_rows_built_on_one() {
        let tables = busy_tables(3000);
        assert!(tables.counts_and_edges().1.len() >= PARALLEL_EDGES);
        let symbolize = |a: u64| {
            a.is_multiple_of(3)
                .then(|| (format!("f{}", a >> 8), a & 0xff))
        };
        let run = RunInfo {
            program: "/bin/guest".into(),
            argv: vec!["guest".into()],
            ending: Ending::Exited { code: 0 },
            blocks_translated: 3000,
            blocks_loaded: 0,
            translation_cache_errors: 0,
            translation_ns: 1,
        };
        let one = report_with(&tables, &symbolize, run.clone(), Rows::All, false);
        let two = report_with(&tables, &symbolize, run.clone(), Rows::All, true);
        assert_eq!(one, two);
        assert_eq!(one.totals.blocks_executed, 200_000);
        assert_eq!(one.totals.distinct_blocks, one.blocks.len() as u64);
        assert!(one.edges.len() > 1000 && one.indirect_jumps.len() > 1000);
        // The summary's rows: the same but for the direct edges.
        let summary = report_with(&tables, &symbolize, run, Rows::NoDirectEdges, true);
        assert!(summary.edges.is_empty());
        assert_eq!(
            Report {
                edges: one.edges.clone(),
                ..summary
            },
            one
        );
    }
}
