//! Ball-Larus acyclic path numbering: per-edge increments, online tracing and path regeneration.
//!
//! Source: the Ball-Larus lecture slides (steps 1–4 and "Convert arbitrary
//! CFGs to DAGs") and the PPP paper §2.2 (Fig. 1, `computeBLIncrements`).
//!
//! **Paths.** A *Ball-Larus path* is an acyclic piece of an execution: it
//! starts at the routine entry or just after a back edge, and ends at the
//! routine exit or at a back edge. Back edges are found by DFS from the entry
//! ([`Cfg::back_edges`]), so irreducible graphs are handled too.
//!
//! **DAG.** Each back edge `v -> w` is replaced by two dummy edges,
//! `entry -> w` (the register restarts along the back edge) and
//! `v -> exit` (the path is recorded along the back edge). Every back edge
//! gets its own pair, so an id also tells which back edge started and which
//! ended the path; parallel edges stay distinguishable.
//!
//! **Numbering** (lecture step 1). In reverse topological order,
//! `NumPaths(exit) = 1`, and each other node's out-edges, in insertion order,
//! get `Val(e) = NumPaths(v)` so far while `NumPaths(v) += NumPaths(dst(e))`.
//! With `N = NumPaths(entry)`, every path has exactly one [`PathId`] in
//! `[0, N)` (its sum of values) and every id in `[0, N)` names one path. `N`
//! must fit in a `u64`; otherwise numbering fails with
//! [`Error::PathCountOverflow`] instead of wrapping.
//!
//! **Instrumentation** (lecture steps 2–3). Each CFG edge carries an
//! [`EdgeProbe`]. A walker keeps one `u64` register `r`, sets
//! `r = start_value()` on routine entry, and on every edge does
//! `r = r.wrapping_add(probe.add)`; if `probe.ends_path`, `r` is a finished
//! path id, and the register restarts at `probe.restart`. Back edges and
//! edges into the exit end paths. Without weights the increments are the
//! values themselves (lecture slide: `r=0; r+=1; r=2; count[r]++`). With edge
//! weights (execution counts) the lecture's placement is used: add an edge
//! `exit -> entry`, take a maximum-weight spanning tree, and move the values
//! onto the chords: with potentials `phi(entry) = 0` and
//! `phi(v) = phi(u) + Val(u -> v)` along tree edges, `Inc(e) = Val(e) +
//! phi(src) - phi(dst)` is 0 on the tree, the register starts at
//! `phi(exit)`, and every path still sums to its id, so the hottest edges
//! carry no addition. Increments are taken modulo 2^64: intermediate
//! register values may wrap, finished ids are exact.
//!
//! **Regeneration** (lecture step 4). From the entry, repeatedly take the
//! out-edge with the largest value not above the remainder.
//!
//! **Renumbering.** The CFG may grow; [`BallLarus::renumber`] recomputes
//! everything in O(nodes + edges) (O(E log E) with weights), reusing this
//! value's buffers. Adding an edge can change every id, so ids of the old
//! numbering must be regenerated with the old numbering.

use crate::cfg::Cfg;
use crate::dag::{Dag, DagEdge};
use crate::error::{Error, Result};
use crate::ids::{EdgeId, NodeId, PathId, NONE};
use crate::spanning::{Scratch, SpanningTree};

/// What a walker does on one CFG edge.
///
/// `r = r.wrapping_add(add)`; then, if `ends_path`, `r` is the id of the path
/// that just finished and `r = restart`. Increments are taken modulo 2^64, so
/// intermediate register values may wrap; finished ids are exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EdgeProbe {
    /// Added to the register when the edge is taken (mod 2^64).
    pub add: u64,
    /// The register's value after a path ends on this edge.
    pub restart: u64,
    /// The edge is a back edge or enters the exit: a path ends here.
    pub ends_path: bool,
}

/// Where a Ball-Larus path starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathStart {
    /// At the routine entry.
    Entry,
    /// At the head of this back edge, just after it was taken.
    AfterBackEdge(EdgeId),
}

/// Where a Ball-Larus path ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathEnd {
    /// At the routine exit (the last block is the exit).
    Exit,
    /// By taking this back edge (the last block is its source).
    BackEdge(EdgeId),
}

/// A regenerated Ball-Larus path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlPath {
    /// How it starts.
    pub start: PathStart,
    /// How it ends.
    pub end: PathEnd,
    /// Its blocks, first to last.
    pub blocks: Vec<NodeId>,
    /// Its forward edges, in order (the back edges at either end are in
    /// `start` and `end`); `edges.len() + 1 == blocks.len()`.
    pub edges: Vec<EdgeId>,
}

impl Default for BlPath {
    fn default() -> Self {
        BlPath {
            start: PathStart::Entry,
            end: PathEnd::Exit,
            blocks: Vec::new(),
            edges: Vec::new(),
        }
    }
}

impl BlPath {
    /// Appends the edges this path contributes to a walk: its forward edges,
    /// then the back edge that ends it, if any. Concatenating this over the
    /// paths of one routine invocation gives back the invocation's walk.
    pub fn append_walk(&self, walk: &mut Vec<EdgeId>) {
        walk.extend_from_slice(&self.edges);
        if let PathEnd::BackEdge(b) = self.end {
            walk.push(b);
        }
    }
}

/// A Ball-Larus numbering of one CFG, with per-edge probes.
///
/// A snapshot: it keeps its own copy of the edge endpoints, so the CFG may
/// grow afterwards; edges added later have no probe until
/// [`renumber`](BallLarus::renumber). Memory: O(nodes + edges) words.
#[derive(Debug, Clone, Default)]
pub struct BallLarus {
    pub(crate) dag: Dag,
    pub(crate) tree: SpanningTree,
    inc: Vec<u64>,
    start: u64,
    probes: Vec<EdgeProbe>,
    cfg_src: Vec<NodeId>,
    cfg_dst: Vec<NodeId>,
    dag_weight: Vec<u64>,
    scratch: Scratch,
}

impl BallLarus {
    /// Numbers `cfg` with the plain Ball-Larus edge values as increments.
    /// O(nodes + edges).
    ///
    /// # Errors
    ///
    /// [`Error::EntryHasPredecessor`], [`Error::ExitHasSuccessor`] or
    /// [`Error::DeadEnd`] if `cfg` is not single-entry, single-exit (see
    /// [`Cfg::normalize`]); [`Error::PathCountOverflow`] if it has more than
    /// `u64::MAX` acyclic paths.
    pub fn number(cfg: &Cfg) -> Result<BallLarus> {
        let mut bl = BallLarus::default();
        bl.renumber(cfg, None)?;
        Ok(bl)
    }

    /// Numbers `cfg` and places the increments on the chords of a
    /// maximum-weight spanning tree; `weights[e]` is edge `e`'s execution
    /// count (a back edge's weight goes to both of its dummies). Path ids are
    /// the same as [`BallLarus::number`]'s. O(E log E).
    ///
    /// # Errors
    ///
    /// As [`BallLarus::number`], and [`Error::WeightCountMismatch`] if
    /// `weights` does not have one entry per edge.
    pub fn number_weighted(cfg: &Cfg, weights: &[u64]) -> Result<BallLarus> {
        let mut bl = BallLarus::default();
        bl.renumber(cfg, Some(weights))?;
        Ok(bl)
    }

    /// Recomputes the numbering for `cfg` (which may have grown), reusing
    /// this value's buffers. With `weights`, as [`BallLarus::number_weighted`].
    /// On error, `self` is left in an unspecified but safe state.
    ///
    /// # Errors
    ///
    /// As [`BallLarus::number_weighted`].
    pub fn renumber(&mut self, cfg: &Cfg, weights: Option<&[u64]>) -> Result<()> {
        if let Some(w) = weights {
            if w.len() != cfg.edge_count() as usize {
                return Err(Error::WeightCountMismatch {
                    expected: cfg.edge_count() as usize,
                    got: w.len(),
                });
            }
        }
        self.dag.rebuild(cfg)?;
        match weights {
            None => self.tree.first_out_edges(&self.dag),
            Some(w) => {
                self.dag_weight.clear();
                self.dag_weight
                    .extend(self.dag.kind.iter().map(|k| match *k {
                        DagEdge::Real(e) | DagEdge::BackEntry(e) | DagEdge::BackExit(e) => {
                            w[e.index()]
                        }
                    }));
                let virt = self
                    .dag
                    .out_range(self.dag.entry)
                    .fold(0u64, |acc, d| acc.saturating_add(self.dag_weight[d]));
                self.tree.maximum(&self.dag, &self.dag_weight, virt);
            }
        }
        self.start = match weights {
            // The first-out-edge tree has all potentials 0: the increments
            // are the values and the register starts at 0.
            None => {
                self.inc.clone_from(&self.dag.val);
                0
            }
            Some(_) => {
                self.tree
                    .increments(&self.dag, &self.dag.val, &mut self.inc, &mut self.scratch)
            }
        };

        self.cfg_src.clear();
        self.cfg_dst.clear();
        self.cfg_src.extend(cfg.edges().map(|e| cfg.src(e)));
        self.cfg_dst.extend(cfg.edges().map(|e| cfg.dst(e)));
        let mut probes = std::mem::take(&mut self.probes);
        self.probes_into(&self.inc, self.start, &mut probes);
        self.probes = probes;
        Ok(())
    }

    /// Per-CFG-edge probes for DAG increments `inc` and register start
    /// `start`: forward edges add their increment; back edges add their
    /// `-> exit` dummy's, end the path and restart at `start` plus their
    /// `entry ->` dummy's; edges into the exit end the path and restart at
    /// `start`. Shared with PPP, whose second register uses the same edges.
    pub(crate) fn probes_into(&self, inc: &[u64], start: u64, out: &mut Vec<EdgeProbe>) {
        let dag = &self.dag;
        out.clear();
        out.extend((0..self.cfg_dst.len()).map(|e| {
            let d = dag.of_cfg[e];
            if d == NONE {
                return EdgeProbe::default();
            }
            let add = inc[d as usize];
            let back = dag.entry_dummy[e];
            if back != NONE {
                EdgeProbe {
                    add,
                    restart: start.wrapping_add(inc[back as usize]),
                    ends_path: true,
                }
            } else if self.cfg_dst[e] == dag.exit {
                EdgeProbe {
                    add,
                    restart: start,
                    ends_path: true,
                }
            } else {
                EdgeProbe {
                    add,
                    restart: 0,
                    ends_path: false,
                }
            }
        }));
    }

    /// `N`, the number of Ball-Larus paths; ids are `[0, N)`.
    pub fn num_paths(&self) -> u64 {
        self.dag.total_paths()
    }

    /// `NumPaths(node)`: DAG paths from `node` to the exit (0 if unreachable).
    ///
    /// # Panics
    ///
    /// If `node` was not in the numbered graph.
    pub fn num_paths_from(&self, node: NodeId) -> u64 {
        self.dag.num_paths[node.index()]
    }

    /// The register's value on routine entry.
    pub fn start_value(&self) -> u64 {
        self.start
    }

    /// The probe of every edge, indexed by [`EdgeId`].
    pub fn probes(&self) -> &[EdgeProbe] {
        &self.probes
    }

    /// The probe of edge `e`.
    ///
    /// # Panics
    ///
    /// If `e` was not in the numbered graph.
    pub fn probe(&self, e: EdgeId) -> EdgeProbe {
        self.probes[e.index()]
    }

    /// Whether `e` is a back edge (found by DFS from the entry).
    ///
    /// # Panics
    ///
    /// If `e` was not in the numbered graph.
    pub fn is_back_edge(&self, e: EdgeId) -> bool {
        self.dag.dfs.is_back[e.index()]
    }

    /// The Ball-Larus value `Val(e)` of a forward edge (before any spanning
    /// tree placement); for a back edge, the values of its
    /// `(entry -> head, tail -> exit)` dummies. `None` if unreachable.
    ///
    /// # Panics
    ///
    /// If `e` was not in the numbered graph.
    pub fn edge_value(&self, e: EdgeId) -> Option<(u64, Option<u64>)> {
        let d = self.dag.of_cfg[e.index()];
        if d == NONE {
            return None;
        }
        let dummy = self.dag.entry_dummy[e.index()];
        Some(if dummy == NONE {
            (self.dag.val[d as usize], None)
        } else {
            (self.dag.val[dummy as usize], Some(self.dag.val[d as usize]))
        })
    }

    /// Number of forward edges with a non-zero increment: the edges on which
    /// a walker must add (back edges always act: they record and restart).
    /// For a DAG numbered without weights this is `E - V + 1`, the
    /// `N_EPP` of the PAP paper §1.3.
    pub fn increment_edge_count(&self) -> usize {
        self.probes
            .iter()
            .zip(&self.dag.entry_dummy)
            .filter(|(p, &dummy)| dummy == NONE && p.add != 0)
            .count()
    }

    /// Whether forward edge `e` lies on the spanning tree (and so has
    /// increment 0). `false` for back edges and unreachable edges.
    pub fn in_spanning_tree(&self, e: EdgeId) -> bool {
        let d = self.dag.of_cfg[e.index()];
        d != NONE && self.dag.entry_dummy[e.index()] == NONE && self.tree.in_tree[d as usize]
    }

    /// A walker over this numbering, at routine entry.
    pub fn tracer(&self) -> BlTracer<'_> {
        BlTracer {
            probes: &self.probes,
            start: self.start,
            r: self.start,
        }
    }

    /// The ids of the paths of one routine invocation, given as its walk of
    /// edges from the entry to the exit. An empty walk is the invocation of
    /// a one-block routine (entry = exit) and gives the single path 0.
    /// O(walk length).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchEdge`], [`Error::UnreachableEdge`],
    /// [`Error::DiscontinuousWalk`] or [`Error::WalkEndsAwayFromExit`] if the
    /// walk is not an entry-to-exit walk of the numbered graph.
    pub fn encode_walk(&self, walk: &[EdgeId]) -> Result<Vec<PathId>> {
        self.check_walk(walk)?;
        let mut out = Vec::new();
        if walk.is_empty() {
            out.push(PathId(self.start));
            return Ok(out);
        }
        let mut t = self.tracer();
        out.extend(walk.iter().filter_map(|&e| t.step(e)));
        Ok(out)
    }

    /// The id of one Ball-Larus path given by how it starts, its forward
    /// edges and how it ends (the inverse of [`BallLarus::regenerate`];
    /// `blocks` is ignored). O(path length).
    ///
    /// # Errors
    ///
    /// [`Error::NotABackEdge`] if `start` or `end` names a forward edge;
    /// [`Error::NoSuchEdge`], [`Error::UnreachableEdge`],
    /// [`Error::DiscontinuousWalk`] or [`Error::WalkEndsAwayFromExit`] if the
    /// edges do not form such a path.
    pub fn encode_path(&self, path: &BlPath) -> Result<PathId> {
        let check = |e: EdgeId| -> Result<()> {
            if e.index() >= self.probes.len() {
                return Err(Error::NoSuchEdge {
                    edge: e,
                    edge_count: self.probes.len() as u32,
                });
            }
            if self.dag.of_cfg[e.index()] == NONE {
                return Err(Error::UnreachableEdge { edge: e });
            }
            Ok(())
        };
        let back = |e: EdgeId| -> Result<()> {
            check(e)?;
            if self.dag.entry_dummy[e.index()] == NONE {
                return Err(Error::NotABackEdge { edge: e });
            }
            Ok(())
        };
        let (mut at, mut r) = match path.start {
            PathStart::Entry => (self.dag.entry, self.start),
            PathStart::AfterBackEdge(b) => {
                back(b)?;
                (self.cfg_dst[b.index()], self.probes[b.index()].restart)
            }
        };
        for (step, &e) in path.edges.iter().enumerate() {
            check(e)?;
            if self.dag.entry_dummy[e.index()] != NONE {
                return Err(Error::DiscontinuousWalk {
                    step,
                    edge: e,
                    edge_src: self.cfg_src[e.index()],
                    at,
                });
            }
            let s = self.cfg_src[e.index()];
            if s != at {
                return Err(Error::DiscontinuousWalk {
                    step,
                    edge: e,
                    edge_src: s,
                    at,
                });
            }
            r = r.wrapping_add(self.probes[e.index()].add);
            at = self.cfg_dst[e.index()];
        }
        match path.end {
            PathEnd::Exit if at == self.dag.exit => Ok(PathId(r)),
            PathEnd::Exit => Err(Error::WalkEndsAwayFromExit {
                at,
                exit: self.dag.exit,
            }),
            PathEnd::BackEdge(b) => {
                back(b)?;
                let s = self.cfg_src[b.index()];
                if s != at {
                    return Err(Error::DiscontinuousWalk {
                        step: path.edges.len(),
                        edge: b,
                        edge_src: s,
                        at,
                    });
                }
                Ok(PathId(r.wrapping_add(self.probes[b.index()].add)))
            }
        }
    }

    pub(crate) fn check_walk(&self, walk: &[EdgeId]) -> Result<()> {
        let mut at = self.dag.entry;
        for (step, &e) in walk.iter().enumerate() {
            if e.index() >= self.probes.len() {
                return Err(Error::NoSuchEdge {
                    edge: e,
                    edge_count: self.probes.len() as u32,
                });
            }
            if self.dag.of_cfg[e.index()] == NONE {
                return Err(Error::UnreachableEdge { edge: e });
            }
            let s = self.cfg_src[e.index()];
            if s != at {
                return Err(Error::DiscontinuousWalk {
                    step,
                    edge: e,
                    edge_src: s,
                    at,
                });
            }
            at = self.cfg_dst[e.index()];
        }
        if at != self.dag.exit {
            return Err(Error::WalkEndsAwayFromExit {
                at,
                exit: self.dag.exit,
            });
        }
        Ok(())
    }

    /// The path named by `id`: its blocks, edges, and how it starts and ends
    /// (lecture step 4: from the entry, repeatedly take the out-edge with the
    /// largest value not above the remainder). O(path length · log fan-out).
    ///
    /// # Errors
    ///
    /// [`Error::PathIdOutOfRange`] if `id >= num_paths()`.
    pub fn regenerate(&self, id: PathId) -> Result<BlPath> {
        let mut p = BlPath::default();
        self.regenerate_into(id, &mut p)?;
        Ok(p)
    }

    /// As [`BallLarus::regenerate`], into an existing value (reusing its buffers).
    ///
    /// # Errors
    ///
    /// [`Error::PathIdOutOfRange`] if `id >= num_paths()`.
    pub fn regenerate_into(&self, id: PathId, path: &mut BlPath) -> Result<()> {
        let n = self.num_paths();
        if id.0 >= n {
            return Err(Error::PathIdOutOfRange { id, num_paths: n });
        }
        let mut dag_edges = Vec::new();
        self.dag.regenerate_into(id.0, &mut dag_edges);
        path.blocks.clear();
        path.edges.clear();
        path.start = PathStart::Entry;
        path.end = PathEnd::Exit;
        path.blocks.push(self.dag.entry);
        for (i, &d) in dag_edges.iter().enumerate() {
            match self.dag.kind[d as usize] {
                DagEdge::Real(e) => {
                    path.edges.push(e);
                    path.blocks.push(self.cfg_dst[e.index()]);
                }
                DagEdge::BackEntry(b) => {
                    debug_assert_eq!(i, 0);
                    path.start = PathStart::AfterBackEdge(b);
                    path.blocks[0] = self.cfg_dst[b.index()];
                }
                DagEdge::BackExit(b) => {
                    path.end = PathEnd::BackEdge(b);
                }
            }
        }
        Ok(())
    }
}

/// An online Ball-Larus walker: one register, one add per edge.
///
/// Call [`step`](BlTracer::step) on every edge taken; it returns the id of
/// each path as it finishes (on back edges and edges into the exit). Call
/// [`enter`](BlTracer::enter) on routine entry (a fresh tracer is already
/// at entry). Cost per edge: one table load, one add, one branch.
#[derive(Debug, Clone)]
pub struct BlTracer<'a> {
    probes: &'a [EdgeProbe],
    start: u64,
    r: u64,
}

impl BlTracer<'_> {
    /// Takes edge `e`; returns the finished path's id if a path ends on it.
    ///
    /// # Panics
    ///
    /// If `e` was not in the numbered graph.
    #[inline]
    pub fn step(&mut self, e: EdgeId) -> Option<PathId> {
        let p = self.probes[e.index()];
        let v = self.r.wrapping_add(p.add);
        if p.ends_path {
            self.r = p.restart;
            Some(PathId(v))
        } else {
            self.r = v;
            None
        }
    }

    /// Resets the register for a new routine invocation.
    #[inline]
    pub fn enter(&mut self) {
        self.r = self.start;
    }

    /// The register's current value (a partial sum, meaningful only at path ends).
    #[inline]
    pub fn register(&self) -> u64 {
        self.r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lecture's four-path example: 1 -> {2, 3} -> 4 -> {5, 6} -> 7.
    fn lecture_diamonds() -> Cfg {
        Cfg::from_edges(
            8,
            NodeId(1),
            NodeId(7),
            &[
                (1, 2),
                (1, 3),
                (2, 4),
                (3, 4),
                (4, 5),
                (4, 6),
                (5, 7),
                (6, 7),
            ],
        )
        .unwrap()
    }

    #[test]
    fn lecture_four_paths_get_ids_0_to_3() {
        let g = lecture_diamonds();
        let bl = BallLarus::number(&g).unwrap();
        assert_eq!(bl.num_paths(), 4);
        // Instrumentation from the slide: r = 0; r += 2 on 1->3; r += 1 on 4->6.
        assert_eq!(bl.start_value(), 0);
        assert_eq!(bl.probe(EdgeId(1)).add, 2);
        assert_eq!(bl.probe(EdgeId(5)).add, 1);
        assert_eq!(bl.increment_edge_count(), 2);
        let p = |nodes: &[u32]| -> Vec<EdgeId> {
            nodes
                .windows(2)
                .map(|w| g.find_edge(NodeId(w[0]), NodeId(w[1])).unwrap())
                .collect()
        };
        for (id, nodes) in [
            [1, 2, 4, 5, 7],
            [1, 2, 4, 6, 7],
            [1, 3, 4, 5, 7],
            [1, 3, 4, 6, 7],
        ]
        .iter()
        .enumerate()
        {
            assert_eq!(bl.encode_walk(&p(nodes)).unwrap(), vec![PathId(id as u64)]);
            let path = bl.regenerate(PathId(id as u64)).unwrap();
            assert_eq!(
                path.blocks,
                nodes.iter().map(|&n| NodeId(n)).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn out_of_range_id_is_an_error() {
        let bl = BallLarus::number(&lecture_diamonds()).unwrap();
        assert_eq!(
            bl.regenerate(PathId(4)).unwrap_err(),
            Error::PathIdOutOfRange {
                id: PathId(4),
                num_paths: 4
            }
        );
    }

    #[test]
    fn overflow_of_u64_path_count_is_reported() {
        // 65 diamonds in a row: 2^65 paths.
        let mut edges = Vec::new();
        for i in 0..65u32 {
            let (a, b, c, d) = (3 * i, 3 * i + 1, 3 * i + 2, 3 * i + 3);
            edges.extend([(a, b), (a, c), (b, d), (c, d)]);
        }
        let g = Cfg::from_edges(3 * 65 + 1, NodeId(0), NodeId(3 * 65), &edges).unwrap();
        assert!(matches!(
            BallLarus::number(&g),
            Err(Error::PathCountOverflow { .. })
        ));
        // 63 diamonds fit.
        let g = Cfg::from_edges(3 * 63 + 1, NodeId(0), NodeId(3 * 63), &edges[..4 * 63]).unwrap();
        assert_eq!(BallLarus::number(&g).unwrap().num_paths(), 1 << 63);
    }

    #[test]
    fn loop_paths_are_cut_at_the_back_edge() {
        // 0 -> 1 -> 2 -> 1 (back), 2 -> 3.
        let g =
            Cfg::from_edges(4, NodeId(0), NodeId(3), &[(0, 1), (1, 2), (2, 1), (2, 3)]).unwrap();
        let bl = BallLarus::number(&g).unwrap();
        assert!(bl.is_back_edge(EdgeId(2)));
        // Paths: 0-1-2-3, 0-1-2(back), [1]-2-3, [1]-2(back).
        assert_eq!(bl.num_paths(), 4);
        let walk = [
            EdgeId(0),
            EdgeId(1),
            EdgeId(2),
            EdgeId(1),
            EdgeId(2),
            EdgeId(1),
            EdgeId(3),
        ];
        let ids = bl.encode_walk(&walk).unwrap();
        assert_eq!(ids.len(), 3);
        let mut back = Vec::new();
        for id in &ids {
            bl.regenerate(*id).unwrap().append_walk(&mut back);
        }
        assert_eq!(back, walk);
        let mid = bl.regenerate(ids[1]).unwrap();
        assert_eq!(mid.start, PathStart::AfterBackEdge(EdgeId(2)));
        assert_eq!(mid.end, PathEnd::BackEdge(EdgeId(2)));
        assert_eq!(mid.blocks, vec![NodeId(1), NodeId(2)]);
    }

    #[test]
    fn weighted_placement_keeps_ids_and_frees_the_hot_edges() {
        // A loop whose body 1 -> 2 -> 4 is hot and 1 -> 3 -> 4 is cold.
        let g = Cfg::from_edges(
            6,
            NodeId(0),
            NodeId(5),
            &[(0, 1), (1, 2), (1, 3), (2, 4), (3, 4), (4, 1), (4, 5)],
        )
        .unwrap();
        let w = [1, 1000, 1, 1000, 1, 1000, 1];
        let plain = BallLarus::number(&g).unwrap();
        let tree = BallLarus::number_weighted(&g, &w).unwrap();
        for e in [EdgeId(1), EdgeId(3)] {
            assert!(tree.in_spanning_tree(e));
            assert_eq!(tree.probe(e).add, 0);
        }
        let walk: Vec<EdgeId> = [0, 1, 3, 5, 2, 4, 5, 1, 3, 6]
            .iter()
            .map(|&e| EdgeId(e))
            .collect();
        assert_eq!(
            plain.encode_walk(&walk).unwrap(),
            tree.encode_walk(&walk).unwrap()
        );
    }

    #[test]
    fn bad_shapes_are_rejected() {
        let g = Cfg::from_edges(3, NodeId(0), NodeId(2), &[(0, 1), (1, 0), (1, 2)]).unwrap();
        assert_eq!(
            BallLarus::number(&g).unwrap_err(),
            Error::EntryHasPredecessor {
                entry: NodeId(0),
                edge: EdgeId(1)
            }
        );
        let g = Cfg::from_edges(3, NodeId(0), NodeId(2), &[(0, 1), (0, 2)]).unwrap();
        assert_eq!(
            BallLarus::number(&g).unwrap_err(),
            Error::DeadEnd {
                node: NodeId(1),
                exit: NodeId(2)
            }
        );
        let g = Cfg::from_edges(3, NodeId(0), NodeId(1), &[(0, 1), (1, 2)]).unwrap();
        assert_eq!(
            BallLarus::number(&g).unwrap_err(),
            Error::ExitHasSuccessor {
                exit: NodeId(1),
                edge: EdgeId(1)
            }
        );
    }

    #[test]
    fn one_block_routine_has_one_empty_path() {
        let g = Cfg::new(1, NodeId(0), NodeId(0)).unwrap();
        let bl = BallLarus::number(&g).unwrap();
        assert_eq!(bl.num_paths(), 1);
        assert_eq!(bl.encode_walk(&[]).unwrap(), vec![PathId(0)]);
        assert_eq!(bl.regenerate(PathId(0)).unwrap().blocks, vec![NodeId(0)]);
    }
}
