//! Depth-first search from the entry: reachability, back edges and a topological order.
//!
//! Back edges are the DFS *retreating* edges, whose target is still on the DFS
//! stack (Ball-Larus lecture, "Convert arbitrary CFGs to DAGs"; the PAP paper
//! §1.2 uses the same notion when it forbids remainder 0 on a back edge).
//! Removing them leaves tree, forward and cross edges only, for which the
//! target always finishes before the source, so reverse postorder is a
//! topological order of what remains — for reducible and irreducible graphs alike.

use crate::cfg::Cfg;
use crate::ids::NodeId;

/// The result of one DFS over a [`Cfg`] from its entry.
#[derive(Debug, Clone, Default)]
pub(crate) struct Dfs {
    /// Per node: reachable from the entry.
    pub reachable: Vec<bool>,
    /// Per edge: a retreating (back) edge. Edges from unreachable nodes are `false`.
    pub is_back: Vec<bool>,
    /// Reachable nodes in DFS postorder.
    pub postorder: Vec<NodeId>,
    state: Vec<u8>,
    stack: Vec<(NodeId, u32)>,
}

const WHITE: u8 = 0;
const GREY: u8 = 1;
const BLACK: u8 = 2;

impl Dfs {
    /// Runs a DFS of `cfg` from its entry. O(nodes + edges), iterative.
    pub fn run(cfg: &Cfg) -> Dfs {
        let mut dfs = Dfs::default();
        dfs.rerun(cfg);
        dfs
    }

    /// Runs again, reusing this value's buffers.
    pub fn rerun(&mut self, cfg: &Cfg) {
        let n = cfg.node_count() as usize;
        self.state.clear();
        self.state.resize(n, WHITE);
        self.is_back.clear();
        self.is_back.resize(cfg.edge_count() as usize, false);
        self.postorder.clear();
        self.stack.clear();
        let entry = cfg.entry();
        self.state[entry.index()] = GREY;
        self.stack.push((entry, 0));
        while let Some(&mut (v, ref mut next)) = self.stack.last_mut() {
            let succs = cfg.succs(v);
            if let Some(&e) = succs.get(*next as usize) {
                *next += 1;
                let w = cfg.dst(e);
                match self.state[w.index()] {
                    WHITE => {
                        self.state[w.index()] = GREY;
                        self.stack.push((w, 0));
                    }
                    GREY => self.is_back[e.index()] = true,
                    _ => {}
                }
            } else {
                self.state[v.index()] = BLACK;
                self.postorder.push(v);
                self.stack.pop();
            }
        }
        self.reachable.clear();
        self.reachable
            .extend(self.state.iter().map(|&s| s == BLACK));
    }

    /// Reachable nodes in a topological order of the graph without back
    /// edges, followed by `last` (the exit, a sink), which is always included:
    /// moving a sink to the end keeps the order topological, also for the
    /// dummy `tail -> exit` edges Ball-Larus adds.
    pub fn topological_order_into(&self, last: NodeId, out: &mut Vec<NodeId>) {
        out.clear();
        out.extend(self.postorder.iter().rev().copied().filter(|&v| v != last));
        out.push(last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diamond_has_no_back_edges_and_a_topological_order() {
        let g =
            Cfg::from_edges(4, NodeId(0), NodeId(3), &[(0, 1), (0, 2), (1, 3), (2, 3)]).unwrap();
        let dfs = Dfs::run(&g);
        assert!(dfs.is_back.iter().all(|&b| !b));
        let mut topo = Vec::new();
        dfs.topological_order_into(NodeId(3), &mut topo);
        assert_eq!(topo.first(), Some(&NodeId(0)));
        assert_eq!(topo.last(), Some(&NodeId(3)));
    }

    #[test]
    fn unreachable_nodes_are_marked() {
        let g = Cfg::from_edges(4, NodeId(0), NodeId(1), &[(0, 1), (2, 3), (3, 2)]).unwrap();
        let dfs = Dfs::run(&g);
        assert_eq!(dfs.reachable, vec![true, true, false, false]);
        assert!(dfs.is_back.iter().all(|&b| !b));
    }
}
