//! The Ball-Larus DAG: back edges cut into `entry -> head` and `tail -> exit` dummies, with NumPaths and edge values.
//!
//! Ball-Larus lecture, "Convert arbitrary CFGs to DAGs": each back edge
//! `v -> w` is removed and replaced by two dummy edges, `entry -> w` (the
//! register is re-initialised along the back edge) and `v -> exit` (the path
//! is recorded along the back edge). Each back edge gets its own pair, so a
//! path id also says which back edge ended the previous path and which ends
//! this one; parallel back edges stay distinguishable.
//!
//! Then, in reverse topological order (lecture step 1; PPP paper Fig. 1):
//! `NumPaths(exit) = 1`, and for every other node `v`, its out-edges in order
//! get `Val(e) = NumPaths(v)` so far, and `NumPaths(v) += NumPaths(dst(e))`.
//! Every entry-to-exit DAG path then sums to a distinct value in
//! `[0, NumPaths(entry))`. Regeneration (lecture step 4) walks from the
//! entry, each time taking the out-edge with the largest `Val(e) <= r`.

use crate::cfg::Cfg;
use crate::dfs::Dfs;
use crate::error::{Error, Result};
use crate::ids::{EdgeId, NodeId, NONE};

/// What a DAG edge stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DagEdge {
    /// A CFG edge that is not a back edge.
    Real(EdgeId),
    /// The dummy `entry -> dst(b)` of back edge `b`.
    BackEntry(EdgeId),
    /// The dummy `src(b) -> exit` of back edge `b`.
    BackExit(EdgeId),
}

/// The acyclic graph Ball-Larus numbers, with its numbering.
///
/// DAG edges are grouped by source node: the out-edges of `v` are the ids
/// `out_start[v] .. out_start[v + 1]`, in the order `v`'s CFG out-edges were
/// added (a back edge's place is taken by its `-> exit` dummy), and for the
/// entry followed by one `entry -> head` dummy per back edge in id order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Dag {
    pub dfs: Dfs,
    pub entry: NodeId,
    pub exit: NodeId,
    pub src: Vec<NodeId>,
    pub dst: Vec<NodeId>,
    pub kind: Vec<DagEdge>,
    pub out_start: Vec<u32>,
    /// Reachable nodes, entry first, exit last, topologically ordered.
    pub topo: Vec<NodeId>,
    /// Per CFG edge: its DAG edge if forward, its `-> exit` dummy if back,
    /// `NONE` if unreachable.
    pub of_cfg: Vec<u32>,
    /// Per CFG edge: its `entry ->` dummy if back, else `NONE`.
    pub entry_dummy: Vec<u32>,
    /// Per node: number of DAG paths to the exit (0 if unreachable).
    pub num_paths: Vec<u64>,
    /// Per DAG edge: the Ball-Larus value `Val(e)`.
    pub val: Vec<u64>,
}

impl Dag {
    /// Rebuilds the DAG and its numbering for `cfg`, reusing buffers.
    /// O(nodes + edges).
    pub fn rebuild(&mut self, cfg: &Cfg) -> Result<()> {
        self.dfs.rerun(cfg);
        self.entry = cfg.entry();
        self.exit = cfg.exit();
        check_sese(cfg, &self.dfs)?;

        let n = cfg.node_count() as usize;
        let m = cfg.edge_count() as usize;
        self.src.clear();
        self.dst.clear();
        self.kind.clear();
        self.out_start.clear();
        self.of_cfg.clear();
        self.of_cfg.resize(m, NONE);
        self.entry_dummy.clear();
        self.entry_dummy.resize(m, NONE);
        for v in 0..n {
            self.out_start.push(self.src.len() as u32);
            let node = NodeId(v as u32);
            if !self.dfs.reachable[v] {
                continue;
            }
            for &e in cfg.succs(node) {
                self.of_cfg[e.index()] = self.src.len() as u32;
                self.src.push(node);
                if self.dfs.is_back[e.index()] {
                    self.dst.push(self.exit);
                    self.kind.push(DagEdge::BackExit(e));
                } else {
                    self.dst.push(cfg.dst(e));
                    self.kind.push(DagEdge::Real(e));
                }
            }
            if node == self.entry {
                for e in cfg.edges() {
                    if self.dfs.is_back[e.index()] {
                        self.entry_dummy[e.index()] = self.src.len() as u32;
                        self.src.push(self.entry);
                        self.dst.push(cfg.dst(e));
                        self.kind.push(DagEdge::BackEntry(e));
                    }
                }
            }
        }
        self.out_start.push(self.src.len() as u32);
        self.dfs.topological_order_into(self.exit, &mut self.topo);
        self.number()
    }

    /// NumPaths in reverse topological order and `Val(e)` per DAG edge.
    fn number(&mut self) -> Result<()> {
        self.num_paths.clear();
        self.num_paths.resize(self.out_start.len() - 1, 0);
        self.val.clear();
        self.val.resize(self.src.len(), 0);
        for &v in self.topo.iter().rev() {
            if v == self.exit {
                self.num_paths[v.index()] = 1;
                continue;
            }
            let mut np: u64 = 0;
            for d in self.out_range(v) {
                self.val[d] = np;
                np = np
                    .checked_add(self.num_paths[self.dst[d].index()])
                    .ok_or(Error::PathCountOverflow { node: v })?;
            }
            self.num_paths[v.index()] = np;
        }
        Ok(())
    }

    /// DAG out-edges of `v`.
    #[inline]
    pub fn out_range(&self, v: NodeId) -> std::ops::Range<usize> {
        self.out_start[v.index()] as usize..self.out_start[v.index() + 1] as usize
    }

    /// Number of entry-to-exit DAG paths.
    pub fn total_paths(&self) -> u64 {
        self.num_paths[self.entry.index()]
    }

    /// The DAG edges of the path with value `r`, appended to `out`.
    /// Requires `r < total_paths()`.
    pub fn regenerate_into(&self, mut r: u64, out: &mut Vec<u32>) {
        let mut v = self.entry;
        while v != self.exit {
            let range = self.out_range(v);
            let vals = &self.val[range.clone()];
            // Vals at a node strictly increase (each successor has >= 1 path),
            // so the edge with the largest Val <= r is found by bisection.
            let k = vals.partition_point(|&x| x <= r) - 1;
            let d = range.start + k;
            r -= vals[k];
            out.push(d as u32);
            v = self.dst[d];
        }
        debug_assert_eq!(r, 0);
    }
}

/// Checks that the part of `cfg` reachable from the entry is single-entry,
/// single-exit: the entry has no reachable predecessor, the exit has no
/// successor, and every other reachable node has a successor.
pub(crate) fn check_sese(cfg: &Cfg, dfs: &Dfs) -> Result<()> {
    let (entry, exit) = (cfg.entry(), cfg.exit());
    let reach = &dfs.reachable;
    if let Some(&e) = cfg
        .preds(entry)
        .iter()
        .find(|&&e| reach[cfg.src(e).index()])
    {
        return Err(Error::EntryHasPredecessor { entry, edge: e });
    }
    if let Some(&e) = cfg.succs(exit).first() {
        return Err(Error::ExitHasSuccessor { exit, edge: e });
    }
    if let Some(node) = cfg
        .nodes()
        .find(|&v| reach[v.index()] && v != exit && cfg.succs(v).is_empty())
    {
        return Err(Error::DeadEnd { node, exit });
    }
    Ok(())
}
