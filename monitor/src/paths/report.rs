//! Path profiles as reported: Ball-Larus ids of the recorded paths under each function's final
//! CFG, PAP traces of hot functions' runs, k-iteration paths, per-function CFGs with edge
//! counts (for DOT) and folded call stacks (for flame graphs).
//!
//! Numbering (Ball-Larus lecture steps 1–4): for each function a DAG is built with a virtual
//! entry and exit; a back edge `u -> h` (retreating in address order, see `paths`) appears as
//! the two dummies `entry -> h` and `u -> exit`, one pair per back edge, as the lecture cuts
//! back edges; the activation's own start is `entry -> first block` and its end
//! `last block -> exit`. `BallLarus::number` then gives every recorded path its id, the sum of
//! the edge values along it. PAP (Wang, Li, Zhou 2012, §1.1–1.2) encodes a hot function's
//! activation runs on the cyclic CFG (real back edges) with `Pap::encode_walk`, breakpoints
//! included.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;

use hotpath_pathprof::{BallLarus, Cfg, EdgeId, NodeId, Pap, PapConfig, PathId};
use hotpath_report::{
    Addr, BlRun, Breakpoint, Count, Function, FunctionEdge, KPath, NumberingError, PapRun, PathEnd,
    PathEntry, PathKind, PathProfile, PathStart, Stack,
};

use super::frames::{Resync, DEEPER};
use super::ids::{FxHasher, NONE};
use super::recorder::PathRecorder;
use super::trie::{END_EXIT, START_ENTRY};

/// k-iteration paths listed per function and length.
pub const K_PATHS_TOP: usize = 10;
/// PAP runs listed in the profile (the most executed blocks first).
pub const PAP_PATHS_TOP: usize = 200;
/// Blocks (`blocks`), run-length entries (`bl_runs`) and breakpoints listed per PAP run; a
/// longer run (a main loop, or a loop whose iterations follow the data) lists its first ones
/// and its sizes (`len`, `run_paths`, `breakpoints_total`). Keeps the report of a sort of a few
/// megabytes a few megabytes too, not 150 (and the monitor's memory while it writes it, not a
/// gigabyte).
pub const PAP_LISTED: usize = 1000;

/// DAG edge tags (distinguish parallel edges).
const TAG_PLAIN: u64 = 0;
const TAG_HEAD: u64 = 1;

/// One function's graph for pathprof: virtual entry 0, exit 1, used blocks from 2.
struct Graph {
    /// Function node → graph node.
    map: HashMap<u32, u32>,
    addrs: Vec<u64>,
    edges: BTreeMap<(u32, u32, u64), u32>,
}

impl Graph {
    fn new() -> Graph {
        Graph {
            map: HashMap::new(),
            addrs: vec![0, 0],
            edges: BTreeMap::new(),
        }
    }
    fn node(&mut self, n: u32, addr: u64) -> u32 {
        let next = self.addrs.len() as u32;
        *self.map.entry(n).or_insert_with(|| {
            self.addrs.push(addr);
            next
        })
    }
    fn edge(&mut self, s: u32, d: u32, tag: u64) {
        self.edges.entry((s, d, tag)).or_insert(0);
    }
    /// The Cfg, edges added in key order; fills the edge ids.
    fn cfg(&mut self) -> hotpath_pathprof::Result<Cfg> {
        let mut cfg = Cfg::new(self.addrs.len() as u32, NodeId(0), NodeId(1))?;
        for (&(s, d, _), id) in self.edges.iter_mut() {
            *id = cfg.add_edge(NodeId(s), NodeId(d))?.0;
        }
        Ok(cfg)
    }
    fn id(&self, s: u32, d: u32, tag: u64) -> EdgeId {
        EdgeId(self.edges[&(s, d, tag)])
    }
}

/// The DAG edges of a recorded path key `[f, start, nodes.., end]` (graph nodes already
/// created).
fn dag_walk(g: &Graph, key: &[u32]) -> Vec<EdgeId> {
    let nodes: Vec<u32> = key[2..key.len() - 1].iter().map(|n| g.map[n]).collect();
    let mut walk = Vec::with_capacity(nodes.len() + 1);
    walk.push(g.id(
        0,
        nodes[0],
        if key[1] == START_ENTRY {
            TAG_PLAIN
        } else {
            TAG_HEAD
        },
    ));
    for w in nodes.windows(2) {
        walk.push(g.id(w[0], w[1], TAG_PLAIN));
    }
    let end = key[key.len() - 1];
    let tag = if end == END_EXIT {
        TAG_PLAIN
    } else {
        TAG_HEAD + 1 + g.map[&end] as u64
    };
    walk.push(g.id(*nodes.last().expect("a path has a block"), 1, tag));
    walk
}

/// Walks the PAP run made of paths `run` on a function's cyclic graph, calling `step(from,
/// to)` for each edge (graph nodes from `node(function node)`): the virtual entry to its first
/// block, each path's blocks, and each path's end — the back edge to the next path's head, or
/// the exit.
fn pap_steps(
    rec: &PathRecorder,
    run: &[u32],
    mut node: impl FnMut(u32) -> u32,
    mut step: impl FnMut(u32, u32),
) {
    for (i, &p) in run.iter().enumerate() {
        let key = &rec.paths[p as usize].key;
        let nodes = &key[2..key.len() - 1];
        let first = node(nodes[0]);
        if i == 0 {
            step(0, first);
        }
        let mut last = first;
        for &n in &nodes[1..] {
            let g = node(n);
            step(last, g);
            last = g;
        }
        let end = key[key.len() - 1];
        if end == END_EXIT {
            step(last, 1);
        } else {
            let h = node(end);
            step(last, h);
        }
    }
}

/// `ids` run-length encoded as `(id, repeats)`, the first [`PAP_LISTED`] entries.
fn run_length(ids: impl Iterator<Item = Option<u64>>) -> Vec<BlRun> {
    let mut out: Vec<BlRun> = Vec::new();
    for id in ids {
        let full = out.len() == PAP_LISTED;
        match out.last_mut() {
            Some(last) if last.id == id => last.repeat += 1,
            _ if full => break,
            _ => out.push(BlRun { id, repeat: 1 }),
        }
    }
    out
}

/// Where a recorded path starts, from its key's start tag.
fn path_start(tag: u32) -> PathStart {
    if tag == START_ENTRY {
        PathStart::Entry
    } else {
        PathStart::BackEdge
    }
}

/// Where a recorded path ends, from its key's end tag.
fn path_end(tag: u32) -> PathEnd {
    if tag == END_EXIT {
        PathEnd::Exit
    } else {
        PathEnd::BackEdge
    }
}

/// The `names` of a path's `blocks` in function `function` (entered at `entry`): each block
/// by its own module and symbol as `name_of` gives it (`function+0xOFF` for the function's own
/// blocks; `libc.so.6!memmove+0x40` for code of another module the function jumped into, such
/// as the function a PLT stub leads to; `libc.so.6+0x16d800` in a library without a symbol
/// there), or as [`PathEntry::block_names`] does where no module or symbol covers it.
fn block_names(
    function: &str,
    entry: u64,
    blocks: &[Addr],
    name_of: &dyn Fn(u64) -> String,
) -> Vec<String> {
    PathEntry::block_names(function, Addr(entry), blocks)
        .into_iter()
        .zip(blocks)
        .map(|(name, a)| {
            let own = name_of(a.0);
            if own.starts_with("sub_") {
                name
            } else {
                own
            }
        })
        .collect()
}

impl PathRecorder {
    /// The reported path profile of a finished recorder (see [`PathRecorder::finish`]);
    /// `name_of(addr)` names a function entry, or any guest address (`symbol+0xOFF`, `sub_…`
    /// where no symbol covers it).
    pub fn profile(&self, name_of: &dyn Fn(u64) -> String) -> PathProfile {
        let rec = self;
        let mut out = PathProfile {
            k: rec.config.k,
            ..Default::default()
        };
        out.stats.shadow_stack_resyncs = rec.resyncs;
        out.stats.pap_abandoned = rec.pap_runs.abandoned;
        (out.stats.pap_runs, out.stats.pap_distinct_runs) = rec.pap_runs.totals();
        out.stats.shadow_stack_dropped_frames = rec.dropped_frames;
        out.stats.resyncs_by_cause = Resync::ALL
            .iter()
            .map(|&r| (r.name().to_string(), rec.resync_kinds[r as usize]))
            .collect();
        let names: Vec<String> = rec.funcs.iter().map(|f| name_of(f.entry)).collect();
        let mut by_func: Vec<Vec<u32>> = vec![Vec::new(); rec.funcs.len()];
        for (p, path) in rec.paths.iter().enumerate() {
            by_func[path.key[0] as usize].push(p as u32);
        }
        let mut bl_id: Vec<Option<u64>> = vec![None; rec.paths.len()];
        // The heaviest PAP runs, by function, each with its rank in the listing; the others
        // stay counted in the run trie, unlisted.
        let path_blocks = |p: u32| (rec.paths[p as usize].key.len() - 3) as u64;
        // What a path is, not the order it was met in: its start, its blocks' addresses and
        // its end.
        let path_hash = |p: u32| {
            let key = &rec.paths[p as usize].key;
            let fun = &rec.funcs[key[0] as usize];
            let mut h = FxHasher::default();
            h.write_u32(key[1]);
            for &n in &key[2..] {
                h.write_u64(if n == END_EXIT {
                    u64::MAX
                } else {
                    fun.node_addr[n as usize]
                });
            }
            h.finish()
        };
        let heaviest = rec
            .pap_runs
            .heaviest(&rec.funcs, path_blocks, path_hash, PAP_PATHS_TOP);
        let mut pap_by_func: Vec<Vec<(usize, &[u32], u64)>> = vec![Vec::new(); rec.funcs.len()];
        for (rank, (f, run, count)) in heaviest.iter().enumerate() {
            pap_by_func[*f as usize].push((rank, run, *count));
        }
        // Paths that start a run: the PAP graph's virtual entry leads to their first blocks.
        let mut run_start = vec![false; rec.paths.len()];
        for p in rec.pap_runs.first_paths() {
            run_start[p as usize] = true;
        }
        let mut pap_entries = Vec::new();

        for (f, fun) in rec.funcs.iter().enumerate() {
            let addr_of = |n: u32| fun.node_addr[n as usize];
            // In an order that depends on what the paths are, not on the order they were met
            // in (recorders intern them in different orders): the graph's nodes, its edges'
            // order and so the ids follow from it.
            let mut paths = by_func[f].clone();
            if paths.is_empty() {
                continue;
            }
            paths.sort_by_cached_key(|&p| {
                let key = &rec.paths[p as usize].key;
                let addrs: Vec<u64> = key[2..]
                    .iter()
                    .map(|&n| if n == END_EXIT { u64::MAX } else { addr_of(n) })
                    .collect();
                (key[1], addrs)
            });
            let paths = &paths;
            // The DAG.
            let mut g = Graph::new();
            for &p in paths {
                let key = &rec.paths[p as usize].key;
                let nodes = &key[2..key.len() - 1];
                let gn: Vec<u32> = nodes.iter().map(|&n| g.node(n, addr_of(n))).collect();
                g.edge(
                    0,
                    gn[0],
                    if key[1] == START_ENTRY {
                        TAG_PLAIN
                    } else {
                        TAG_HEAD
                    },
                );
                for w in gn.windows(2) {
                    g.edge(w[0], w[1], TAG_PLAIN);
                }
                let end = key[key.len() - 1];
                let tag = if end == END_EXIT {
                    TAG_PLAIN
                } else {
                    TAG_HEAD + 1 + g.node(end, addr_of(end)) as u64
                };
                g.edge(*gn.last().expect("a path has a block"), 1, tag);
            }
            // Back-edge heads must be graph nodes too (they are: every back edge's head starts
            // the next path of the same activation, which is recorded).
            let numbered = g
                .cfg()
                .and_then(|cfg| BallLarus::number(&cfg).map(|bl| (cfg, bl)));
            let mut num_paths = None;
            match &numbered {
                Ok((_, bl)) => {
                    num_paths = Some(bl.num_paths());
                    for &p in paths {
                        let walk = dag_walk(&g, &rec.paths[p as usize].key);
                        let mut r = bl.start_value();
                        for e in walk {
                            r = r.wrapping_add(bl.probe(e).add);
                        }
                        bl_id[p as usize] = Some(r);
                    }
                }
                Err(e) => out.stats.numbering_errors.push(NumberingError {
                    function: names[f].clone(),
                    error: e.to_string(),
                }),
            }
            // Edge counts and block counts of the observed CFG.
            let mut edges: BTreeMap<(u64, u64), (u64, bool)> = BTreeMap::new();
            let mut blocks: BTreeMap<u64, u64> = BTreeMap::new();
            for &p in paths {
                let rec_p = &rec.paths[p as usize];
                let key = &rec_p.key;
                let nodes = &key[2..key.len() - 1];
                for &n in nodes {
                    *blocks.entry(addr_of(n)).or_insert(0) += rec_p.count;
                }
                for w in nodes.windows(2) {
                    edges
                        .entry((addr_of(w[0]), addr_of(w[1])))
                        .or_insert((0, false))
                        .0 += rec_p.count;
                }
                let end = key[key.len() - 1];
                if end != END_EXIT {
                    let e = edges
                        .entry((addr_of(*nodes.last().expect("a block")), addr_of(end)))
                        .or_insert((0, true));
                    e.0 += rec_p.count;
                    e.1 = true;
                }
            }
            out.functions.push(Function {
                name: names[f].clone(),
                entry: Addr(fun.entry),
                blocks: blocks
                    .into_iter()
                    .map(|(a, count)| Count {
                        addr: Addr(a),
                        count,
                    })
                    .collect(),
                edges: edges
                    .into_iter()
                    .map(|((from, to), (count, back))| FunctionEdge {
                        from: Addr(from),
                        to: Addr(to),
                        count,
                        back,
                    })
                    .collect(),
                paths_seen: paths.len() as u64,
                num_paths,
            });

            // PAP runs on the cyclic CFG: real back edges, the activation start, the exit. The
            // graph has every recorded path of the function, whatever runs are listed.
            if !pap_by_func[f].is_empty() {
                let mut cg = Graph::new();
                for &p in paths {
                    let mut steps = Vec::new();
                    pap_steps(
                        rec,
                        &[p],
                        |n| cg.node(n, fun.node_addr[n as usize]),
                        |s, d| steps.push((s, d)),
                    );
                    let skip = usize::from(!run_start[p as usize]);
                    for &(s, d) in &steps[skip..] {
                        cg.edge(s, d, TAG_PLAIN);
                    }
                }
                let pap = cg
                    .cfg()
                    .and_then(|cfg| Pap::new(&cfg, PapConfig::default()));
                // One run at a time: a main loop's run can be millions of steps.
                for &(rank, run, count) in &pap_by_func[f] {
                    let (mut walk, mut blocks, mut steps) = (Vec::new(), Vec::new(), 0usize);
                    let mut complete = true;
                    pap_steps(
                        rec,
                        run,
                        |n| cg.map[&n],
                        |s, d| {
                            match cg.edges.get(&(s, d, TAG_PLAIN)) {
                                Some(&id) => walk.push(EdgeId(id)),
                                None => complete = false,
                            }
                            // Every step but the virtual entry's starts at a block.
                            if steps > 0 && blocks.len() < PAP_LISTED {
                                blocks.push(cg.addrs[s as usize]);
                            }
                            steps += 1;
                        },
                    );
                    let trace = pap
                        .as_ref()
                        .ok()
                        .filter(|_| complete)
                        .and_then(|pap| pap.encode_walk(&walk).ok());
                    drop(walk);
                    let len = steps.saturating_sub(1).max(1) as u64;
                    let blocks: Vec<Addr> = blocks.into_iter().map(Addr).collect();
                    pap_entries.push((
                        rank,
                        PathEntry {
                            function: names[f].clone(),
                            function_addr: Addr(fun.entry),
                            kind: PathKind::Pap,
                            id: trace.as_ref().map(|t| t.last),
                            count,
                            names: block_names(&names[f], fun.entry, &blocks, name_of),
                            blocks,
                            len,
                            start: PathStart::Entry,
                            end: PathEnd::Exit,
                            pap: Some(PapRun {
                                breakpoints: trace
                                    .as_ref()
                                    .map(|t| {
                                        t.breakpoints
                                            .iter()
                                            .take(PAP_LISTED)
                                            .map(|b| Breakpoint {
                                                block: Addr(cg.addrs[b.node.index()]),
                                                r: b.r,
                                            })
                                            .collect()
                                    })
                                    .unwrap_or_default(),
                                breakpoints_total: trace
                                    .as_ref()
                                    .map_or(0, |t| t.breakpoints.len() as u64),
                                bl_runs: run_length(run.iter().map(|&p| bl_id[p as usize])),
                                run_paths: run.len() as u64,
                            }),
                        },
                    ));
                }
                if let Err(e) = pap {
                    out.stats.numbering_errors.push(NumberingError {
                        function: names[f].clone(),
                        error: format!("PAP: {e}"),
                    });
                }
            }
        }

        // Ball-Larus paths, most executed blocks first.
        for (p, path) in rec.paths.iter().enumerate() {
            let key = &path.key;
            let f = key[0] as usize;
            let fun = &rec.funcs[f];
            let blocks: Vec<Addr> = key[2..key.len() - 1]
                .iter()
                .map(|&n| Addr(fun.node_addr[n as usize]))
                .collect();
            out.paths.push(PathEntry {
                function: names[f].clone(),
                function_addr: Addr(fun.entry),
                kind: PathKind::Bl,
                id: bl_id[p],
                count: path.count,
                names: block_names(&names[f], fun.entry, &blocks, name_of),
                blocks,
                len: (key.len() - 3) as u64,
                start: path_start(key[1]),
                end: path_end(key[key.len() - 1]),
                pap: None,
            });
        }
        out.paths.sort_by(PathEntry::report_order);
        // PAP runs in `heaviest`'s order: most executed blocks first.
        pap_entries.sort_by_key(|&(rank, _)| rank);
        out.paths.extend(pap_entries.into_iter().map(|(_, e)| e));

        // k-iteration paths, function by function in address order (function ids are handed
        // out as the recorder meets functions, which may depend on when it learns new ids).
        let mut by_entry: Vec<usize> = (0..rec.funcs.len()).collect();
        by_entry.sort_by_key(|&f| rec.funcs[f].entry);
        for f in by_entry {
            let fun = &rec.funcs[f];
            let Some(ks) = &fun.kslab else { continue };
            let ipf = ks.to_ipf();
            for len in 2..=rec.config.k {
                for (seq, count) in ipf.hottest(len, K_PATHS_TOP) {
                    let ids = seq
                        .iter()
                        .map(|&PathId(p)| bl_id.get(p as usize).copied().flatten())
                        .collect();
                    out.k_paths.push(KPath {
                        function: names[f].clone(),
                        ids,
                        count,
                    });
                }
            }
        }

        // Folded stacks.
        let mut stacks: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for node in rec.calltree.iter() {
            if node.blocks == 0 || node.func == NONE {
                continue;
            }
            let mut frames = Vec::new();
            let mut n = node;
            while n.func != NONE {
                frames.push(if n.func == DEEPER {
                    "[deeper]"
                } else {
                    names[n.func as usize].as_str()
                });
                n = &rec.calltree[n.parent as usize];
            }
            frames.reverse();
            let s = stacks.entry(frames.join(";")).or_insert((0, 0));
            s.0 += node.blocks;
            s.1 += node.instructions;
        }
        out.stacks = stacks
            .into_iter()
            .map(|(stack, (blocks, instructions))| Stack {
                stack,
                blocks,
                instructions,
            })
            .collect();
        out.functions.sort_by(|a, b| {
            let wa: u64 = a.blocks.iter().map(|b| b.count).sum();
            let wb: u64 = b.blocks.iter().map(|b| b.count).sum();
            wb.cmp(&wa).then(a.entry.cmp(&b.entry))
        });
        out
    }
}
