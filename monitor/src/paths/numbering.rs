//! A function's Ball-Larus numbering for instrumented translation (#21 stage 2;
//! docs/paths-design.md, "Stage 2 as it will be built", item 2): the increments translated code
//! adds to its path register on each edge, and the regeneration of a counted id into its blocks.
//!
//! Source: the Ball-Larus lecture, steps 1–4 ("Convert arbitrary CFGs to DAGs" for the back
//! edges; step 2's spanning tree for the placement), by way of `hotpath_pathprof::BallLarus`.
//!
//! **The graph.** The blocks of a function as the monitor knows it, block 0 its entry, with a
//! virtual entry `E` and exit `X`. Back edges are the retreating edges in address order
//! (`to <= from`, as everywhere in `paths`); each back edge `u -> h` is cut into the dummies
//! `E -> h` (a path starts after it) and `u -> X` (a path ends on it), one pair per back edge.
//! Every block also has an edge `u -> X`: an activation may end after any block — a return, a
//! tail call, an unwinding past a call, the end of the guest — and its path ends there, as the
//! recorder ends it. `E -> block 0` starts an activation's first path. Forward edges keep their
//! address order, so the graph is a DAG whatever else is learnt later.
//!
//! **What translated code does.** An activation starts with `r = start`; a forward edge adds
//! its `add`; a back edge counts path `r + end` and restarts `r = restart`; the activation's end
//! after block `u` counts path `r + exits[u]`. Every path of the graph gets exactly one id in
//! `0..num_paths` (the sum telescopes, Ball-Larus step 2, modulo 2^64). The increments sit on
//! the chords of a maximum spanning tree weighted by the recorded counts: the hottest edges add
//! nothing and are not instrumented.

use std::collections::BTreeMap;

use hotpath_events::{PlanBackEdge, PlanEdge};
use hotpath_pathprof::{BallLarus, Cfg, EdgeId, NodeId, PathId};

use super::recorder::PathRecorder;
use super::trie::{END_EXIT, START_ENTRY};

/// An edge of the known CFG, between numbered blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CfgEdge {
    /// Source block (index into the function's blocks).
    pub from: u32,
    /// Destination block.
    pub to: u32,
    /// Times it was taken so far (the spanning tree's weight; 0 when unknown).
    pub count: u64,
}

/// Where a numbered path starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NumberedStart {
    /// At the activation's start (block 0).
    Entry,
    /// After a back edge to this block.
    AfterBackEdge(u32),
}

/// Where a numbered path ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NumberedEnd {
    /// When the activation ends after its last block.
    Exit,
    /// On the back edge from its last block to this block.
    BackEdge(u32),
}

/// A path of a [`Numbering`]: its start, its blocks (indices) and its end.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NumberedPath {
    /// How it starts.
    pub start: NumberedStart,
    /// Its blocks, first to last (forward edges between them).
    pub blocks: Vec<u32>,
    /// How it ends.
    pub end: NumberedEnd,
}

/// DAG edge tags (tell the parallel edges `u -> X` apart).
const TAG_PLAIN: u64 = 0;
/// `E -> h` after a back edge; `u -> X` on the back edge to `h` is `TAG_BACK + h`.
const TAG_BACK: u64 = 1;

/// A function's Ball-Larus numbering (module doc).
#[derive(Clone, Debug)]
pub struct Numbering {
    /// Guest address of each numbered block; block 0 is the function's entry.
    pub blocks: Vec<u64>,
    /// The register's value when an activation starts (before block 0).
    pub start: u64,
    /// Forward edges and their increments (added mod 2^64; 0 on spanning-tree edges), in
    /// `(from, to)` order: the plan's own type, sent as they are.
    pub edges: Vec<PlanEdge>,
    /// Back edges (the ending path's id is `r + end`, then `r = restart`), in `(from, to)`
    /// order.
    pub back_edges: Vec<PlanBackEdge>,
    /// Per block: the path that ends when the activation ends after it has id `r + exits[u]`.
    pub exits: Vec<u64>,
    /// Number of paths: ids are `0..num_paths`.
    pub num_paths: u64,
    bl: BallLarus,
    /// DAG edge id → `(source, destination, tag)` in graph nodes (`E` 0, `X` 1, block `b` at
    /// `b + 2`).
    dag_edges: Vec<(u32, u32, u64)>,
}

impl Numbering {
    /// Numbers the function whose blocks are at guest addresses `blocks` (block 0 its entry)
    /// with the known edges `edges` (an edge listed twice counts once, with both counts);
    /// `starts` activations were seen to start, and `ends[u]` to end after block `u` (the
    /// weights of the edges from `E` and into `X`; `ends` may be shorter than `blocks`: 0).
    /// Blocks the entry does not reach through `edges` are numbered too (no path goes through
    /// them).
    ///
    /// # Errors
    /// [`hotpath_pathprof::Error::PathCountOverflow`] when the function has more than
    /// `u64::MAX` paths; any other error means a bug here.
    ///
    /// # Panics
    /// If `blocks` is empty or an edge names a block it does not have.
    pub fn new(
        blocks: &[u64],
        edges: &[CfgEdge],
        starts: u64,
        ends: &[u64],
    ) -> hotpath_pathprof::Result<Numbering> {
        assert!(!blocks.is_empty(), "a function has its entry block");
        let n = blocks.len() as u32;
        let back = |e: &CfgEdge| blocks[e.to as usize] <= blocks[e.from as usize];
        // (source, destination, tag) → weight, in key order: the numbering does not depend on
        // the order edges were learnt in.
        let mut dag: BTreeMap<(u32, u32, u64), u64> = BTreeMap::new();
        let mut add = |s: u32, d: u32, tag: u64, w: u64| {
            let e = dag.entry((s, d, tag)).or_insert(0);
            *e = e.saturating_add(w);
        };
        add(0, 2, TAG_PLAIN, starts);
        for u in 0..n {
            add(
                u + 2,
                1,
                TAG_PLAIN,
                ends.get(u as usize).copied().unwrap_or(0),
            );
        }
        for e in edges {
            assert!(e.from < n && e.to < n, "an edge between known blocks");
            if back(e) {
                add(0, e.to + 2, TAG_BACK, e.count);
                add(e.from + 2, 1, TAG_BACK + e.to as u64, e.count);
            } else {
                add(e.from + 2, e.to + 2, TAG_PLAIN, e.count);
            }
        }
        let mut cfg = Cfg::new(n + 2, NodeId(0), NodeId(1))?;
        let mut dag_edges = Vec::with_capacity(dag.len());
        let mut weights = Vec::with_capacity(dag.len());
        for (&(s, d, tag), &w) in &dag {
            cfg.add_edge(NodeId(s), NodeId(d))?;
            dag_edges.push((s, d, tag));
            weights.push(w);
        }
        let bl = BallLarus::number_weighted(&cfg, &weights)?;
        let id = |key: (u32, u32, u64)| {
            EdgeId(dag_edges.binary_search(&key).expect("an edge of the DAG") as u32)
        };
        let sv = bl.start_value();
        let inc = |key| bl.probe(id(key)).add;
        let mut forward = Vec::new();
        let mut backs = Vec::new();
        for &(s, d, tag) in &dag_edges {
            if s >= 2 && d >= 2 {
                forward.push(PlanEdge {
                    from: s - 2,
                    to: d - 2,
                    add: inc((s, d, tag)),
                });
            } else if s >= 2 && d == 1 && tag >= TAG_BACK {
                let to = (tag - TAG_BACK) as u32;
                backs.push(PlanBackEdge {
                    from: s - 2,
                    to,
                    end: inc((s, d, tag)),
                    restart: sv.wrapping_add(inc((0, to + 2, TAG_BACK))),
                });
            }
        }
        backs.sort_by_key(|b| (b.from, b.to));
        Ok(Numbering {
            blocks: blocks.to_vec(),
            start: sv.wrapping_add(inc((0, 2, TAG_PLAIN))),
            edges: forward,
            back_edges: backs,
            exits: (0..n).map(|u| inc((u + 2, 1, TAG_PLAIN))).collect(),
            num_paths: bl.num_paths(),
            bl,
            dag_edges,
        })
    }

    /// The path with id `id`, or `None` when `id >= num_paths`.
    pub fn regenerate(&self, id: u64) -> Option<NumberedPath> {
        let p = self.bl.regenerate(PathId(id)).ok()?;
        // With the back edges cut by hand the DAG is the graph itself: every edge is real.
        let edges: Vec<(u32, u32, u64)> =
            p.edges.iter().map(|e| self.dag_edges[e.index()]).collect();
        let (&(_, first, first_tag), rest) = edges.split_first()?;
        let (&(last, _, last_tag), _) = rest.split_last()?;
        let start = if first_tag == TAG_PLAIN {
            NumberedStart::Entry
        } else {
            NumberedStart::AfterBackEdge(first - 2)
        };
        let end = if last_tag == TAG_PLAIN {
            NumberedEnd::Exit
        } else {
            NumberedEnd::BackEdge((last_tag - TAG_BACK) as u32)
        };
        let mut blocks = vec![first - 2];
        blocks.extend(rest.iter().filter(|e| e.1 >= 2).map(|e| e.1 - 2));
        debug_assert_eq!(blocks.last(), Some(&(last - 2)));
        Some(NumberedPath { start, blocks, end })
    }

    /// The prefix of the path an activation is on when its register is `r` at block `block`
    /// (which has run): its start and blocks, `block` last. A Ball-Larus prefix sum is unique
    /// per block, and the path that leaves after `block` has id `r + exits[block]`, so this
    /// is that path without its end. `None` if `r` is no such sum.
    pub fn prefix(&self, r: u64, block: u32) -> Option<(NumberedStart, Vec<u32>)> {
        let p = self.regenerate(r.wrapping_add(*self.exits.get(block as usize)?))?;
        (p.end == NumberedEnd::Exit && p.blocks.last() == Some(&block))
            .then_some((p.start, p.blocks))
    }

    /// The id translated code computes for `path` (its register's sum), or `None` when the
    /// path uses an edge the numbering does not have.
    pub fn id_of(&self, path: &NumberedPath) -> Option<u64> {
        let mut r = match path.start {
            NumberedStart::Entry if path.blocks.first() == Some(&0) => self.start,
            NumberedStart::Entry => return None,
            NumberedStart::AfterBackEdge(h) if path.blocks.first() == Some(&h) => {
                self.back_edges.iter().find(|b| b.to == h)?.restart
            }
            NumberedStart::AfterBackEdge(_) => return None,
        };
        for w in path.blocks.windows(2) {
            let e = self.edges.iter().find(|e| e.from == w[0] && e.to == w[1])?;
            r = r.wrapping_add(e.add);
        }
        let last = *path.blocks.last()?;
        Some(match path.end {
            NumberedEnd::Exit => r.wrapping_add(self.exits[last as usize]),
            NumberedEnd::BackEdge(h) => {
                let b = self
                    .back_edges
                    .iter()
                    .find(|b| b.from == last && b.to == h)?;
                r.wrapping_add(b.end)
            }
        })
    }
}

impl PathRecorder {
    /// The numbering of the function entered at guest address `entry` as the recorder knows
    /// it: its blocks (block 0 its entry), their static successors in it and the transitions
    /// its recorded paths took, with the paths' counts as the spanning tree's weights. `None`
    /// for a function not seen or without a block yet.
    ///
    /// # Errors
    /// As [`Numbering::new`].
    pub fn numbering(&self, entry: u64) -> Option<hotpath_pathprof::Result<Numbering>> {
        let func = *self.func_by_entry.get(&entry)?;
        let fun = &self.funcs[func as usize];
        if fun.node_addr.is_empty() {
            return None;
        }
        let mut edges = Vec::new();
        for (u, succs) in fun.static_succs.iter().enumerate() {
            for a in succs {
                if let Some(&v) = fun.nodes.get(a) {
                    edges.push(CfgEdge {
                        from: u as u32,
                        to: v,
                        count: 0,
                    });
                }
            }
        }
        let mut starts = 0u64;
        let mut ends = vec![0u64; fun.node_addr.len()];
        for p in fun.paths.iter().map(|&p| &self.paths[p as usize]) {
            let nodes = &p.key[2..p.key.len() - 1];
            if p.key[1] == START_ENTRY {
                starts = starts.saturating_add(p.count);
            }
            for w in nodes.windows(2) {
                edges.push(CfgEdge {
                    from: w[0],
                    to: w[1],
                    count: p.count,
                });
            }
            let last = *nodes.last().expect("a path has a block");
            match p.key[p.key.len() - 1] {
                END_EXIT => ends[last as usize] = ends[last as usize].saturating_add(p.count),
                head => edges.push(CfgEdge {
                    from: last,
                    to: head,
                    count: p.count,
                }),
            }
        }
        Some(Numbering::new(&fun.node_addr, &edges, starts, &ends))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::{PathConfig, PathRecorder};
    use crate::Tables;
    use hotpath_ir::{Cond, GuestAddr, Terminator};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// Every path of the graph, by brute force: from block 0 or after any back edge's head,
    /// along forward edges, ending at the exit or on any back edge from the last block.
    fn all_paths(blocks: &[u64], edges: &[CfgEdge]) -> BTreeSet<NumberedPath> {
        let back = |e: &CfgEdge| blocks[e.to as usize] <= blocks[e.from as usize];
        let fwd: BTreeSet<(u32, u32)> = edges
            .iter()
            .filter(|e| !back(e))
            .map(|e| (e.from, e.to))
            .collect();
        let backs: BTreeSet<(u32, u32)> = edges
            .iter()
            .filter(|e| back(e))
            .map(|e| (e.from, e.to))
            .collect();
        let mut starts = vec![(NumberedStart::Entry, 0)];
        let heads: BTreeSet<u32> = backs.iter().map(|&(_, h)| h).collect();
        starts.extend(heads.iter().map(|&h| (NumberedStart::AfterBackEdge(h), h)));
        let mut out = BTreeSet::new();
        fn walk(
            start: NumberedStart,
            blocks: &mut Vec<u32>,
            fwd: &BTreeSet<(u32, u32)>,
            backs: &BTreeSet<(u32, u32)>,
            out: &mut BTreeSet<NumberedPath>,
        ) {
            let u = *blocks.last().unwrap();
            let path = |end| NumberedPath {
                start,
                blocks: blocks.clone(),
                end,
            };
            out.insert(path(NumberedEnd::Exit));
            for &(_, h) in backs.range((u, 0)..=(u, u32::MAX)) {
                out.insert(path(NumberedEnd::BackEdge(h)));
            }
            for &(_, v) in fwd.range((u, 0)..=(u, u32::MAX)) {
                blocks.push(v);
                walk(start, blocks, fwd, backs, out);
                blocks.pop();
            }
        }
        for (start, first) in starts {
            walk(start, &mut vec![first], &fwd, &backs, &mut out);
        }
        out
    }

    fn check(blocks: &[u64], edges: &[CfgEdge], starts: u64, ends: &[u64]) -> Numbering {
        let num = Numbering::new(blocks, edges, starts, ends).expect("numbers");
        let paths = all_paths(blocks, edges);
        assert_eq!(num.num_paths, paths.len() as u64, "{blocks:?} {edges:?}");
        let mut seen = BTreeSet::new();
        for p in &paths {
            let id = num.id_of(p).expect("an id");
            assert!(id < num.num_paths, "{p:?}: id {id} of {}", num.num_paths);
            assert!(seen.insert(id), "{p:?}: id {id} twice");
            assert_eq!(num.regenerate(id).as_ref(), Some(p), "id {id}");
        }
        assert_eq!(num.regenerate(num.num_paths), None);
        // Every prefix of every path: the register translated code holds at its last block
        // (the start value, then the forward edges' increments) regenerates into that prefix,
        // as a hand-over needs (`prefix`).
        for p in &paths {
            let mut r = match p.start {
                NumberedStart::Entry => num.start,
                NumberedStart::AfterBackEdge(h) => {
                    num.back_edges
                        .iter()
                        .find(|b| b.to == h)
                        .expect("a head")
                        .restart
                }
            };
            for k in 0..p.blocks.len() {
                if k > 0 {
                    let (u, v) = (p.blocks[k - 1], p.blocks[k]);
                    let e = num
                        .edges
                        .iter()
                        .find(|e| (e.from, e.to) == (u, v))
                        .expect("an edge");
                    r = r.wrapping_add(e.add);
                }
                assert_eq!(
                    num.prefix(r, p.blocks[k]),
                    Some((p.start, p.blocks[..=k].to_vec())),
                    "{p:?}, prefix of {} blocks",
                    k + 1
                );
            }
        }
        num
    }

    #[test]
    fn a_loop_with_a_branch_numbers_by_hand() {
        // 0 -> 1 -> {2, 3} -> 4 -> 1 (back) ; 4 exits.
        let blocks = [0x100, 0x110, 0x120, 0x130, 0x140];
        let e = |from, to| CfgEdge { from, to, count: 0 };
        let edges = [e(0, 1), e(1, 2), e(1, 3), e(2, 4), e(3, 4), e(4, 1)];
        let num = check(&blocks, &edges, 0, &[]);
        // From block 0: exit after 0 or 1 (2), or on through 2 or 3 to 4 and exit or loop (4),
        // or exit after 2 or 3 (2): 8; after the back edge, from 1: 1 + 2 + 4 = 7.
        assert_eq!(num.num_paths, 15);
        assert_eq!(num.back_edges.len(), 1);
    }

    #[test]
    fn the_hottest_edges_add_nothing() {
        let blocks = [0x100, 0x110, 0x120, 0x130];
        let e = |from, to, count| CfgEdge { from, to, count };
        let edges = [
            e(0, 1, 1000),
            e(0, 2, 1),
            e(1, 3, 1000),
            e(2, 3, 1),
            e(3, 0, 999),
        ];
        let num = check(&blocks, &edges, 1, &[0, 0, 0, 1]);
        for hot in [(0, 1), (1, 3)] {
            let inc = num.edges.iter().find(|x| (x.from, x.to) == hot).unwrap();
            assert_eq!(inc.add, 0, "{hot:?}");
        }
    }

    proptest! {
        /// Random functions (up to 9 blocks at random addresses, random edges and counts,
        /// self-loops and parallel listings included): every path of the graph has exactly one
        /// id below `num_paths`, there are `num_paths` of them, each id regenerates into its
        /// path, and each prefix's register into the prefix.
        #[test]
        fn every_path_of_random_functions_sums_to_its_id(
            addrs in proptest::collection::btree_set(0u64..64, 1..9),
            raw in proptest::collection::vec((0u32..9, 0u32..9, 0u64..1000), 0..24),
            entry_at in 0usize..9,
            starts in 0u64..1000,
            ends in proptest::collection::vec(0u64..1000, 0..9),
        ) {
            let mut blocks: Vec<u64> = addrs.into_iter().map(|a| 0x1000 + 16 * a).collect();
            // The entry need not be the lowest block.
            let k = entry_at % blocks.len();
            blocks.swap(0, k);
            let n = blocks.len() as u32;
            let edges: Vec<CfgEdge> = raw
                .into_iter()
                .map(|(f, t, count)| CfgEdge { from: f % n, to: t % n, count })
                .collect();
            check(&blocks, &edges, starts, &ends);
        }
    }

    /// The weights put the increment of `E -> block 0` off the spanning tree, so the register
    /// starts away from 0: the start value is exercised, not only the increments.
    #[test]
    fn a_start_away_from_zero_still_sums_to_the_ids() {
        let blocks = [0x100, 0x110, 0x120];
        let e = |from, to, count| CfgEdge { from, to, count };
        let edges = [e(0, 1, 500), e(1, 2, 900), e(2, 1, 800), e(0, 2, 3)];
        let num = check(&blocks, &edges, 1, &[0, 1, 0]);
        assert_ne!(num.start, 0);
    }

    /// The numbered form of a recorded path's key `[function, start tag, nodes.., end tag]`
    /// (function nodes are numbered blocks).
    fn numbered_path(key: &[u32]) -> NumberedPath {
        let nodes = key[2..key.len() - 1].to_vec();
        NumberedPath {
            start: if key[1] == START_ENTRY {
                NumberedStart::Entry
            } else {
                NumberedStart::AfterBackEdge(nodes[0])
            },
            end: match key[key.len() - 1] {
                END_EXIT => NumberedEnd::Exit,
                head => NumberedEnd::BackEdge(head),
            },
            blocks: nodes,
        }
    }

    fn block(t: &mut Tables, id: u32, start: u64, terminator: Terminator) {
        crate::tables::learn_test_block(t, id, start, 1, terminator);
    }

    /// A recorded program: `main` calls `f` in a loop; `f` has a loop with a branch in it and
    /// returns from two places. Every path the recorder counted in `f` (and in `main`) has an
    /// id in the function's numbering that regenerates into the same blocks, start and end —
    /// the counts translated code keeps by id can be turned back into the recorder's paths.
    #[test]
    fn recorded_paths_have_ids_that_regenerate_into_them() {
        let mut t = Tables::default();
        let g = GuestAddr;
        // main: 0x100 calls f, 0x110 loops back to 0x100 or exits.
        block(
            &mut t,
            0,
            0x100,
            Terminator::Call {
                target: g(0x200),
                return_to: g(0x110),
            },
        );
        block(
            &mut t,
            1,
            0x110,
            Terminator::Branch {
                cond: Cond::Ne,
                taken: g(0x100),
                not_taken: g(0x120),
            },
        );
        block(
            &mut t,
            2,
            0x120,
            Terminator::Trap {
                kind: hotpath_ir::TrapKind::Privileged,
                at: g(0x120),
            },
        );
        // f: 0x200 → 0x210 {→ 0x220 | → 0x230} → 0x240 → back to 0x210 or on; 0x250 returns,
        // and 0x220 may return early through 0x260.
        block(&mut t, 3, 0x200, Terminator::FallThrough { next: g(0x210) });
        block(
            &mut t,
            4,
            0x210,
            Terminator::Branch {
                cond: Cond::E,
                taken: g(0x230),
                not_taken: g(0x220),
            },
        );
        block(
            &mut t,
            5,
            0x220,
            Terminator::Branch {
                cond: Cond::E,
                taken: g(0x260),
                not_taken: g(0x240),
            },
        );
        block(&mut t, 6, 0x230, Terminator::FallThrough { next: g(0x240) });
        block(
            &mut t,
            7,
            0x240,
            Terminator::Branch {
                cond: Cond::Ne,
                taken: g(0x210),
                not_taken: g(0x250),
            },
        );
        block(&mut t, 8, 0x250, Terminator::Return);
        block(&mut t, 9, 0x260, Terminator::Return);
        let mut events = Vec::new();
        for round in 0u32..40 {
            events.extend([0, 3]);
            for i in 0..round % 5 {
                events.push(4);
                if (round + i) % 3 == 0 {
                    events.push(6);
                } else {
                    events.push(5);
                    if round % 7 == 6 {
                        events.push(9);
                        break;
                    }
                }
                events.push(7);
            }
            if events.last() != Some(&9) {
                events.extend([4, 6, 7, 8]);
            }
            events.push(1);
        }
        events.push(2);
        for per_block in [false, true] {
            let mut rec = PathRecorder::new(PathConfig {
                per_block,
                ..PathConfig::default()
            });
            t.record(&events);
            rec.record(&events, &t);
            rec.end_of_stream(&t);
            rec.finish();
            let mut checked = 0;
            for f in 0..rec.funcs.len() as u32 {
                let entry = rec.funcs[f as usize].entry;
                let num = rec.numbering(entry).expect("blocks").expect("numbers");
                for p in rec.paths.iter().filter(|p| p.key[0] == f) {
                    let path = numbered_path(&p.key);
                    let id = num
                        .id_of(&path)
                        .unwrap_or_else(|| panic!("{path:?} has no id"));
                    assert_eq!(num.regenerate(id), Some(path), "id {id}");
                    checked += 1;
                }
            }
            assert!(checked >= 8, "{checked} paths");
        }
    }
}
