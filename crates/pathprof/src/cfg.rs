//! The control-flow graph: nodes, directed multigraph edges, one entry and one exit.
//!
//! Path profiling in every source is defined on a single-entry, single-exit
//! CFG `G = (N, E, entry, exit)` (PAP paper §1: "other CFGs are turned into
//! single-entry single-exit ones by adding a unified entry and exit node").
//! [`Cfg::normalize`] performs that transformation; the numberings check the
//! shape and report [`Error`] variants naming the offending node or edge.
//!
//! The graph only grows: nodes and edges are appended and keep their ids, so
//! the monitor can add blocks and transitions as it discovers them and then
//! renumber (see [`BallLarus::renumber`](crate::BallLarus::renumber)).

use crate::error::{Error, Result};
use crate::ids::{EdgeId, NodeId, NONE};

/// A directed multigraph with a designated entry and exit node.
///
/// Edges are kept in insertion order per node; that order is the order in
/// which Ball-Larus assigns edge values (PPP paper Fig. 1, line 4) and in
/// which PAP numbers in-edges, so it is part of the numbering's definition.
///
/// Costs: `add_node` and `add_edge` are amortised O(1); memory is
/// O(nodes + edges).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cfg {
    src: Vec<NodeId>,
    dst: Vec<NodeId>,
    succs: Vec<Vec<EdgeId>>,
    preds: Vec<Vec<EdgeId>>,
    entry: NodeId,
    exit: NodeId,
}

/// What [`Cfg::normalize`] added to make a graph single-entry, single-exit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Normalization {
    /// The fresh entry node, if the old entry had predecessors or other
    /// nodes had none.
    pub new_entry: Option<NodeId>,
    /// The fresh exit node, if the old exit had successors or other nodes
    /// reachable from the entry had none.
    pub new_exit: Option<NodeId>,
    /// Every edge added, in order.
    pub added_edges: Vec<EdgeId>,
}

/// Largest number of nodes or edges: ids are `u32` and `u32::MAX` is reserved.
const MAX_IDS: u32 = u32::MAX - 1;

impl Cfg {
    /// A graph with `node_count` nodes (ids `0..node_count`), no edges, and the
    /// given entry and exit. The entry may equal the exit (a routine with one
    /// block and no edges).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchNode`] if `entry` or `exit` is not below `node_count`;
    /// [`Error::TooManyIds`] if `node_count` exceeds `u32::MAX - 1`.
    pub fn new(node_count: u32, entry: NodeId, exit: NodeId) -> Result<Cfg> {
        if node_count > MAX_IDS {
            return Err(Error::TooManyIds {
                what: "nodes",
                limit: MAX_IDS,
            });
        }
        let n = node_count as usize;
        let cfg = Cfg {
            src: Vec::new(),
            dst: Vec::new(),
            succs: vec![Vec::new(); n],
            preds: vec![Vec::new(); n],
            entry,
            exit,
        };
        cfg.check_node(entry)?;
        cfg.check_node(exit)?;
        Ok(cfg)
    }

    /// A graph with `node_count` nodes and the edges `(src, dst)` added in order
    /// (edge `i` of the result is `edges[i]`).
    ///
    /// # Errors
    ///
    /// As [`Cfg::new`] and [`Cfg::add_edge`].
    pub fn from_edges(
        node_count: u32,
        entry: NodeId,
        exit: NodeId,
        edges: &[(u32, u32)],
    ) -> Result<Cfg> {
        let mut cfg = Cfg::new(node_count, entry, exit)?;
        for &(s, d) in edges {
            cfg.add_edge(NodeId(s), NodeId(d))?;
        }
        Ok(cfg)
    }

    /// Appends a node with no edges and returns its id.
    ///
    /// # Panics
    ///
    /// If the graph already has `u32::MAX - 1` nodes.
    pub fn add_node(&mut self) -> NodeId {
        let id = u32::try_from(self.succs.len())
            .ok()
            .filter(|&n| n < MAX_IDS)
            .expect("Cfg node ids exhausted (u32)");
        self.succs.push(Vec::new());
        self.preds.push(Vec::new());
        NodeId(id)
    }

    /// Appends an edge `src -> dst` and returns its id. Self-loops and
    /// parallel edges are allowed.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchNode`] for an unknown endpoint; [`Error::TooManyIds`] if
    /// the graph already has `u32::MAX - 1` edges.
    pub fn add_edge(&mut self, src: NodeId, dst: NodeId) -> Result<EdgeId> {
        self.check_node(src)?;
        self.check_node(dst)?;
        let id = u32::try_from(self.src.len())
            .ok()
            .filter(|&n| n < MAX_IDS)
            .ok_or(Error::TooManyIds {
                what: "edges",
                limit: MAX_IDS,
            })?;
        let e = EdgeId(id);
        self.src.push(src);
        self.dst.push(dst);
        self.succs[src.index()].push(e);
        self.preds[dst.index()].push(e);
        Ok(e)
    }

    /// Makes `node` the entry.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchNode`] for an unknown node.
    pub fn set_entry(&mut self, node: NodeId) -> Result<()> {
        self.check_node(node)?;
        self.entry = node;
        Ok(())
    }

    /// Makes `node` the exit.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchNode`] for an unknown node.
    pub fn set_exit(&mut self, node: NodeId) -> Result<()> {
        self.check_node(node)?;
        self.exit = node;
        Ok(())
    }

    /// The entry node.
    #[inline]
    pub fn entry(&self) -> NodeId {
        self.entry
    }

    /// The exit node.
    #[inline]
    pub fn exit(&self) -> NodeId {
        self.exit
    }

    /// Number of nodes.
    #[inline]
    pub fn node_count(&self) -> u32 {
        self.succs.len() as u32
    }

    /// Number of edges.
    #[inline]
    pub fn edge_count(&self) -> u32 {
        self.src.len() as u32
    }

    /// Source node of `e`.
    ///
    /// # Panics
    ///
    /// If `e` is not an edge of this graph.
    #[inline]
    pub fn src(&self, e: EdgeId) -> NodeId {
        self.src[e.index()]
    }

    /// Destination node of `e`.
    ///
    /// # Panics
    ///
    /// If `e` is not an edge of this graph.
    #[inline]
    pub fn dst(&self, e: EdgeId) -> NodeId {
        self.dst[e.index()]
    }

    /// Out-edges of `n`, in insertion order.
    ///
    /// # Panics
    ///
    /// If `n` is not a node of this graph.
    #[inline]
    pub fn succs(&self, n: NodeId) -> &[EdgeId] {
        &self.succs[n.index()]
    }

    /// In-edges of `n`, in insertion order.
    ///
    /// # Panics
    ///
    /// If `n` is not a node of this graph.
    #[inline]
    pub fn preds(&self, n: NodeId) -> &[EdgeId] {
        &self.preds[n.index()]
    }

    /// All node ids, in order.
    pub fn nodes(&self) -> impl ExactSizeIterator<Item = NodeId> {
        (0..self.node_count()).map(NodeId)
    }

    /// All edge ids, in order.
    pub fn edges(&self) -> impl ExactSizeIterator<Item = EdgeId> {
        (0..self.edge_count()).map(EdgeId)
    }

    /// The first edge `src -> dst` in insertion order, if any.
    pub fn find_edge(&self, src: NodeId, dst: NodeId) -> Option<EdgeId> {
        self.succs
            .get(src.index())?
            .iter()
            .copied()
            .find(|&e| self.dst(e) == dst)
    }

    /// The edges that close a cycle in a depth-first search from the entry
    /// (retreating edges: their target is on the DFS stack), in id order.
    /// Removing them leaves an acyclic graph, whether or not the CFG is
    /// reducible. Successors are visited in insertion order, so the result is
    /// deterministic. Self-loops are back edges. Complexity O(nodes + edges).
    pub fn back_edges(&self) -> Vec<EdgeId> {
        let dfs = crate::dfs::Dfs::run(self);
        self.edges().filter(|e| dfs.is_back[e.index()]).collect()
    }

    /// Whether the graph (restricted to nodes reachable from the entry) is
    /// reducible: every DFS back edge `u -> v` has `v` dominating `u`.
    /// Complexity O(nodes · edges) worst case, near-linear on real CFGs.
    pub fn is_reducible(&self) -> bool {
        let dfs = crate::dfs::Dfs::run(self);
        let dom = crate::dominators::DomTree::forward(self);
        self.edges()
            .filter(|e| dfs.is_back[e.index()])
            .all(|e| dom.dominates(self.dst(e), self.src(e)))
    }

    /// Turns the graph into a single-entry, single-exit one, in place (PAP
    /// paper §1: add a unified entry and exit node):
    ///
    /// - if the entry has predecessors, or other nodes have none, a fresh
    ///   entry gets an edge to the old entry and to each such node;
    /// - nodes still unreachable from the entry (cycles with no way in) get an
    ///   edge from the entry, lowest id first, until every node is reachable;
    /// - if the exit has successors, or other reachable nodes have none, a
    ///   fresh exit gets an edge from the old exit and from each such node.
    ///
    /// Already-normal graphs are left untouched. Existing ids are kept.
    /// Complexity O(nodes + edges).
    ///
    /// # Panics
    ///
    /// If the added nodes or edges would exceed the `u32` id space.
    pub fn normalize(&mut self) -> Normalization {
        let mut norm = Normalization::default();
        let n = self.node_count();
        let roots: Vec<NodeId> = (0..n)
            .map(NodeId)
            .filter(|&v| v != self.entry && self.preds(v).is_empty())
            .collect();
        if !self.preds(self.entry).is_empty() || !roots.is_empty() {
            let old = self.entry;
            let fresh = self.add_node();
            norm.added_edges
                .push(self.add_edge(fresh, old).expect("nodes exist"));
            for r in roots {
                norm.added_edges
                    .push(self.add_edge(fresh, r).expect("nodes exist"));
            }
            self.entry = fresh;
            norm.new_entry = Some(fresh);
        }

        // Make every node reachable: cycles nothing enters become extra entries.
        let mut seen = vec![false; self.node_count() as usize];
        let mut stack = vec![self.entry];
        self.mark_reachable(&mut seen, &mut stack);
        for v in 0..self.node_count() {
            if !seen[v as usize] {
                let e = self.add_edge(self.entry, NodeId(v)).expect("nodes exist");
                norm.added_edges.push(e);
                stack.push(NodeId(v));
                self.mark_reachable(&mut seen, &mut stack);
            }
        }

        let sinks: Vec<NodeId> = self
            .nodes()
            .filter(|&v| v != self.exit && self.succs(v).is_empty())
            .collect();
        if !self.succs(self.exit).is_empty() || !sinks.is_empty() {
            let old = self.exit;
            let fresh = self.add_node();
            norm.added_edges
                .push(self.add_edge(old, fresh).expect("nodes exist"));
            for s in sinks {
                norm.added_edges
                    .push(self.add_edge(s, fresh).expect("nodes exist"));
            }
            self.exit = fresh;
            norm.new_exit = Some(fresh);
        }
        norm
    }

    fn mark_reachable(&self, seen: &mut [bool], stack: &mut Vec<NodeId>) {
        while let Some(v) = stack.pop() {
            if std::mem::replace(&mut seen[v.index()], true) {
                continue;
            }
            for &e in self.succs(v) {
                let d = self.dst(e);
                if !seen[d.index()] {
                    stack.push(d);
                }
            }
        }
    }

    pub(crate) fn check_node(&self, node: NodeId) -> Result<()> {
        if node.0 == NONE || node.index() >= self.succs.len() {
            return Err(Error::NoSuchNode {
                node,
                node_count: self.node_count(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multigraph_edges_keep_their_own_ids() {
        let mut g = Cfg::new(2, NodeId(0), NodeId(1)).unwrap();
        let a = g.add_edge(NodeId(0), NodeId(1)).unwrap();
        let b = g.add_edge(NodeId(0), NodeId(1)).unwrap();
        assert_ne!(a, b);
        assert_eq!(g.succs(NodeId(0)), &[a, b]);
        assert_eq!(g.preds(NodeId(1)), &[a, b]);
        assert_eq!(g.find_edge(NodeId(0), NodeId(1)), Some(a));
    }

    #[test]
    fn unknown_nodes_are_errors() {
        assert_eq!(
            Cfg::new(2, NodeId(0), NodeId(2)).unwrap_err(),
            Error::NoSuchNode {
                node: NodeId(2),
                node_count: 2
            }
        );
        let mut g = Cfg::new(2, NodeId(0), NodeId(1)).unwrap();
        assert!(matches!(
            g.add_edge(NodeId(0), NodeId(7)),
            Err(Error::NoSuchNode { .. })
        ));
    }

    #[test]
    fn self_loop_is_a_back_edge() {
        let g = Cfg::from_edges(3, NodeId(0), NodeId(2), &[(0, 1), (1, 1), (1, 2)]).unwrap();
        assert_eq!(g.back_edges(), vec![EdgeId(1)]);
        assert!(g.is_reducible());
    }

    #[test]
    fn two_entry_loop_is_irreducible() {
        // 0 -> 1, 0 -> 2, 1 <-> 2, 2 -> 3: the loop {1, 2} has two entries.
        let g = Cfg::from_edges(
            4,
            NodeId(0),
            NodeId(3),
            &[(0, 1), (0, 2), (1, 2), (2, 1), (2, 3)],
        )
        .unwrap();
        assert!(!g.is_reducible());
        assert_eq!(g.back_edges().len(), 1);
    }

    #[test]
    fn normalize_adds_unified_entry_and_exit() {
        // Node 0 is the entry but is also a loop target; nodes 2 and 3 are sinks;
        // node 4 has no predecessors; nodes 5 <-> 6 form a cycle nothing enters.
        let mut g = Cfg::from_edges(
            7,
            NodeId(0),
            NodeId(3),
            &[(0, 1), (1, 0), (1, 2), (1, 3), (4, 3), (5, 6), (6, 5)],
        )
        .unwrap();
        let norm = g.normalize();
        let entry = norm.new_entry.unwrap();
        let exit = norm.new_exit.unwrap();
        assert_eq!(g.entry(), entry);
        assert_eq!(g.exit(), exit);
        assert!(g.preds(entry).is_empty());
        assert!(g.succs(exit).is_empty());
        let sinks: Vec<_> = g.nodes().filter(|&v| g.succs(v).is_empty()).collect();
        assert_eq!(sinks, vec![exit]);
        let dfs = crate::dfs::Dfs::run(&g);
        assert!(dfs.reachable.iter().all(|&r| r));
        // Normalising again changes nothing.
        let before = g.clone();
        assert_eq!(g.normalize(), Normalization::default());
        assert_eq!(g, before);
    }
}
