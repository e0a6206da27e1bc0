//! Reducible acyclic subgraphs (RAS) of a CFG, where PAP can number paths Ball-Larus style with fewer probes.
//!
//! Source: PAP paper §1.4 ("使用 EPP 改进", improving PAP with EPP). A RAS is
//! a subgraph that
//! 1. has a single entry `h` and single exit `x`: `h` reaches all its nodes
//!    and all of them reach `x`; edges come in only at `h` and leave only
//!    from `x`;
//! 2. contains no back edge;
//! 3. `h` dominates `x` and `x` post-dominates `h`.
//!
//! Inside such a region the `n` acyclic `h -> x` paths get Ball-Larus ids
//! `r'` in `[0, n)`, and from the outside the region looks like one node with
//! `n` in-edges: PAP combines `r := r*n + r'` (Algorithm 2). Applying it
//! saves probes when the PAP probes on the region's merge nodes outnumber the
//! Ball-Larus increments plus the one probe the reduction needs (the paper's
//! Fig. 3: 8 PAP probes become 5 plus 1, saving 2).
//!
//! This crate needs no second register for `r'`: [`Pap`](crate::Pap)
//! scales on entry, `r := r*n` when the head is entered, and the region's
//! edges then add their values to `r` itself, so at the tail
//! `r = R*n + r'`. The scaling is the one reduction probe; when the head is a
//! merge node it even folds into the head's in-edge probes
//! (`r := r*(s*n) + i*n`), so the count of one is an upper bound.
//!
//! **Search.** For every node `h`, the candidate exits are `h`'s
//! post-dominators, nearest first; the region grows along that chain while
//! `h` dominates the candidate and the region stays single-entry,
//! single-exit and acyclic, and the largest one is kept. Candidates that
//! save probes are then taken greedily, most savings first, skipping any
//! that shares a node with one already taken (so taken regions are
//! disjoint). Complexity: O(nodes · chain length · region size) in the worst
//! case; the dominator trees cost O(nodes · edges) worst case.

use crate::cfg::Cfg;
use crate::dfs::Dfs;
use crate::dominators::DomTree;
use crate::ids::{EdgeId, NodeId};

/// One reducible acyclic region chosen for Ball-Larus numbering inside PAP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EppRegion {
    /// The region's entry node `h` (its in-edges stay PAP probes).
    pub head: NodeId,
    /// The region's exit node `x`.
    pub tail: NodeId,
    /// All nodes of the region, `head` first.
    pub nodes: Vec<NodeId>,
    /// Number `n` of acyclic `head -> tail` paths: region ids are `[0, n)`.
    pub paths: u64,
    /// PAP probes the region's merge nodes would need (sum of their fan-in;
    /// the head's in-edges are outside the region and are not counted).
    pub pap_probes: usize,
    /// Ball-Larus increments inside the region (edges with non-zero value).
    pub epp_probes: usize,
}

impl EppRegion {
    /// Probes saved: `pap_probes - epp_probes - 1`, the 1 being the
    /// `r := r*n + r'` combination the reduction adds (PAP paper §1.4).
    pub fn saved(&self) -> usize {
        self.pap_probes
            .saturating_sub(self.epp_probes + REDUCTION_PROBES)
    }
}

/// Probes the reduction of one region to a node adds: the `r := r*n + r'`
/// combination (PAP paper §1.4, Algorithm 2), done here as `r := r*n` on
/// entering the head. An upper bound (see the module doc).
pub const REDUCTION_PROBES: usize = 1;

/// A region plus the Ball-Larus value of each of its internal edges.
#[derive(Debug, Clone)]
pub(crate) struct Region {
    pub info: EppRegion,
    /// Internal edges and their values; for each node, its out-edges appear
    /// in increasing value order.
    pub edges: Vec<(EdgeId, u64)>,
}

/// Finds disjoint regions worth numbering with Ball-Larus. `fan_in[v]` is
/// PAP's fan-in of `v` (reachable in-edges); regions with more than
/// `max_paths` paths are not used.
pub(crate) fn find(cfg: &Cfg, dfs: &Dfs, fan_in: &[u32], max_paths: u64) -> Vec<Region> {
    let dom = DomTree::forward(cfg);
    let pdom = DomTree::reverse(cfg);
    let mut s = Scratch::new(cfg);
    let mut candidates = Vec::new();
    for h in cfg.nodes() {
        if !dfs.reachable[h.index()] || h == cfg.exit() {
            continue;
        }
        let mut best: Option<Region> = None;
        let mut x = pdom.idom(h);
        while let Some(tail) = x {
            if !dom.dominates(h, tail) {
                break;
            }
            match s.try_region(cfg, dfs, fan_in, h, tail, max_paths) {
                Some(r) => best = Some(r),
                None => break,
            }
            x = pdom.idom(tail);
        }
        // A region that saves a probe has a merge node, hence >= 2 paths,
        // which the backwalk needs (r shrinks by a factor n at each region).
        if let Some(r) = best.filter(|r| r.info.saved() > 0 && r.info.paths >= 2) {
            candidates.push(r);
        }
    }
    candidates.sort_by(|a, b| {
        b.info
            .saved()
            .cmp(&a.info.saved())
            .then(b.info.nodes.len().cmp(&a.info.nodes.len()))
            .then(a.info.head.cmp(&b.info.head))
    });
    let mut taken = vec![false; cfg.node_count() as usize];
    let mut chosen = Vec::new();
    for r in candidates {
        if r.info.nodes.iter().any(|v| taken[v.index()]) {
            continue;
        }
        for v in &r.info.nodes {
            taken[v.index()] = true;
        }
        chosen.push(r);
    }
    chosen.sort_by_key(|r| r.info.head);
    chosen
}

/// Reusable marks for region growth (generation-stamped, so no clearing).
struct Scratch {
    mark: Vec<u32>,
    gen: u32,
    num_paths: Vec<u64>,
}

impl Scratch {
    fn new(cfg: &Cfg) -> Self {
        let n = cfg.node_count() as usize;
        Scratch {
            mark: vec![0; n],
            gen: 0,
            num_paths: vec![0; n],
        }
    }

    /// The region from `h` to `x`, if it is a RAS with at most `max_paths` paths.
    fn try_region(
        &mut self,
        cfg: &Cfg,
        dfs: &Dfs,
        fan_in: &[u32],
        h: NodeId,
        x: NodeId,
        max_paths: u64,
    ) -> Option<Region> {
        self.gen += 1;
        let g = self.gen;
        let mut nodes = vec![h];
        self.mark[h.index()] = g;
        let mut stack = vec![h];
        while let Some(v) = stack.pop() {
            if v == x {
                continue;
            }
            if v == cfg.exit() || cfg.succs(v).is_empty() {
                return None;
            }
            for &e in cfg.succs(v) {
                let d = cfg.dst(e);
                if dfs.is_back[e.index()] || d == h {
                    return None;
                }
                if self.mark[d.index()] != g {
                    self.mark[d.index()] = g;
                    nodes.push(d);
                    stack.push(d);
                }
            }
        }
        if self.mark[x.index()] != g {
            return None;
        }
        // Single entry: every in-edge of a non-head node comes from a non-tail region node.
        for &v in &nodes[1..] {
            for &e in cfg.preds(v) {
                let s = cfg.src(e);
                if dfs.reachable[s.index()] && (self.mark[s.index()] != g || s == x) {
                    return None;
                }
            }
        }
        // Ball-Larus numbering inside the region, tail = sink; reverse
        // topological order from a DFS postorder over internal edges.
        let post = self.postorder(cfg, h, x, &nodes);
        let mut edges = Vec::new();
        let mut epp_probes = 0;
        for &v in &post {
            if v == x {
                self.num_paths[v.index()] = 1;
                continue;
            }
            let mut np: u64 = 0;
            for &e in cfg.succs(v) {
                if np != 0 {
                    epp_probes += 1;
                }
                edges.push((e, np));
                np = np.checked_add(self.num_paths[cfg.dst(e).index()])?;
            }
            self.num_paths[v.index()] = np;
        }
        let paths = self.num_paths[h.index()];
        if paths > max_paths {
            return None;
        }
        let pap_probes = nodes[1..]
            .iter()
            .map(|v| fan_in[v.index()] as usize)
            .filter(|&s| s > 1)
            .sum();
        Some(Region {
            info: EppRegion {
                head: h,
                tail: x,
                nodes,
                paths,
                pap_probes,
                epp_probes,
            },
            edges,
        })
    }

    /// Postorder of the region's nodes along internal edges (the tail is a leaf).
    fn postorder(&mut self, cfg: &Cfg, h: NodeId, x: NodeId, nodes: &[NodeId]) -> Vec<NodeId> {
        self.gen += 1;
        let g = self.gen;
        let mut post = Vec::with_capacity(nodes.len());
        let mut stack: Vec<(NodeId, usize)> = vec![(h, 0)];
        self.mark[h.index()] = g;
        while let Some(&mut (v, ref mut i)) = stack.last_mut() {
            let succs = if v == x { &[][..] } else { cfg.succs(v) };
            if let Some(&e) = succs.get(*i) {
                *i += 1;
                let d = cfg.dst(e);
                if self.mark[d.index()] != g {
                    self.mark[d.index()] = g;
                    stack.push((d, 0));
                }
            } else {
                post.push(v);
                stack.pop();
            }
        }
        post
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fan_in(cfg: &Cfg) -> Vec<u32> {
        cfg.nodes().map(|v| cfg.preds(v).len() as u32).collect()
    }

    #[test]
    fn chain_of_three_diamonds_is_one_region() {
        // 0 -> 1; diamonds 1..4, 4..7, 7..10; 10 -> 11 (exit).
        let mut edges = vec![(0, 1)];
        for d in 0..3 {
            let a = 1 + 3 * d;
            edges.extend([(a, a + 1), (a, a + 2), (a + 1, a + 3), (a + 2, a + 3)]);
        }
        edges.push((10, 11));
        let g = Cfg::from_edges(12, NodeId(0), NodeId(11), &edges).unwrap();
        let dfs = Dfs::run(&g);
        let regions = find(&g, &dfs, &fan_in(&g), u64::MAX);
        assert_eq!(regions.len(), 1);
        let r = &regions[0].info;
        assert_eq!(r.paths, 8);
        // Three merge nodes of fan-in 2: PAP needs 6 probes; BL needs 3.
        assert_eq!(r.pap_probes, 6);
        assert_eq!(r.epp_probes, 3);
        assert_eq!(r.saved(), 2);
    }

    #[test]
    fn a_single_diamond_saves_nothing_and_a_loop_body_with_a_back_edge_is_refused() {
        let g = Cfg::from_edges(
            5,
            NodeId(0),
            NodeId(4),
            &[(0, 1), (1, 2), (1, 3), (2, 3), (3, 4)],
        )
        .unwrap();
        let dfs = Dfs::run(&g);
        assert!(find(&g, &dfs, &fan_in(&g), u64::MAX).is_empty());
        // h = 1 with a back edge 3 -> 1 inside any region from 1.
        let g = Cfg::from_edges(
            5,
            NodeId(0),
            NodeId(4),
            &[(0, 1), (1, 2), (1, 3), (2, 3), (3, 1), (3, 4)],
        )
        .unwrap();
        let dfs = Dfs::run(&g);
        let mut s = Scratch::new(&g);
        assert!(s
            .try_region(&g, &dfs, &fan_in(&g), NodeId(1), NodeId(4), u64::MAX)
            .is_none());
    }
}
