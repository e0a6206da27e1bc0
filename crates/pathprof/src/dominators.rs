//! Dominator and post-dominator trees, for reducibility and PAP's acyclic regions.
//!
//! The iterative algorithm of Cooper, Harvey and Kennedy ("A Simple, Fast
//! Dominance Algorithm", 2001) over reverse postorder, then an interval
//! numbering of the tree so that `dominates` is O(1). Post-dominators are the
//! same computation on the reversed graph rooted at the exit. Used by
//! [`Cfg::is_reducible`](crate::Cfg::is_reducible) and by the PAP paper §1.4
//! conditions on reducible acyclic subgraphs (entry dominates exit, exit
//! post-dominates entry).

use crate::cfg::Cfg;
use crate::ids::{NodeId, NONE};

/// A dominator (or post-dominator) tree over the nodes reachable from its root.
#[derive(Debug, Clone)]
pub(crate) struct DomTree {
    idom: Vec<u32>,
    pre: Vec<u32>,
    post: Vec<u32>,
}

impl DomTree {
    /// Dominators from the entry along edges.
    pub fn forward(cfg: &Cfg) -> DomTree {
        Self::build(cfg, false)
    }

    /// Post-dominators: dominators from the exit along reversed edges.
    pub fn reverse(cfg: &Cfg) -> DomTree {
        Self::build(cfg, true)
    }

    /// The immediate (post-)dominator of `n`; `None` for the root and for
    /// nodes the root does not reach.
    pub fn idom(&self, n: NodeId) -> Option<NodeId> {
        match self.idom[n.index()] {
            NONE => None,
            d if d == n.0 => None,
            d => Some(NodeId(d)),
        }
    }

    /// Whether `a` (post-)dominates `b` (reflexive). `false` if either is
    /// not reached from the root.
    pub fn dominates(&self, a: NodeId, b: NodeId) -> bool {
        let (pa, pb) = (self.pre[a.index()], self.pre[b.index()]);
        pa != NONE && pb != NONE && pa <= pb && self.post[b.index()] <= self.post[a.index()]
    }

    fn build(cfg: &Cfg, reverse: bool) -> DomTree {
        let n = cfg.node_count() as usize;
        let root = if reverse { cfg.exit() } else { cfg.entry() };
        let next = |v: NodeId| -> Box<dyn Iterator<Item = NodeId> + '_> {
            if reverse {
                Box::new(cfg.preds(v).iter().map(move |&e| cfg.src(e)))
            } else {
                Box::new(cfg.succs(v).iter().map(move |&e| cfg.dst(e)))
            }
        };
        let prev = |v: NodeId| -> Box<dyn Iterator<Item = NodeId> + '_> {
            if reverse {
                Box::new(cfg.succs(v).iter().map(move |&e| cfg.dst(e)))
            } else {
                Box::new(cfg.preds(v).iter().map(move |&e| cfg.src(e)))
            }
        };

        // Postorder numbering by iterative DFS from the root.
        let mut po = vec![NONE; n];
        let mut order = Vec::with_capacity(n);
        let mut visited = vec![false; n];
        let mut stack: Vec<(NodeId, Vec<NodeId>)> = Vec::new();
        visited[root.index()] = true;
        stack.push((root, next(root).collect()));
        while let Some((v, todo)) = stack.last_mut() {
            if let Some(w) = todo.pop() {
                if !visited[w.index()] {
                    visited[w.index()] = true;
                    let succ: Vec<NodeId> = next(w).collect();
                    stack.push((w, succ));
                }
            } else {
                po[v.index()] = order.len() as u32;
                order.push(*v);
                stack.pop();
            }
        }

        let mut idom = vec![NONE; n];
        idom[root.index()] = root.0;
        let mut changed = true;
        while changed {
            changed = false;
            for &v in order.iter().rev() {
                if v == root {
                    continue;
                }
                let mut new = NONE;
                for p in prev(v) {
                    if idom[p.index()] == NONE {
                        continue;
                    }
                    new = if new == NONE {
                        p.0
                    } else {
                        intersect(&idom, &po, p.0, new)
                    };
                }
                if new != NONE && idom[v.index()] != new {
                    idom[v.index()] = new;
                    changed = true;
                }
            }
        }

        // Interval numbering of the tree for O(1) dominance queries.
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); n];
        for &v in &order {
            if v != root {
                children[idom[v.index()] as usize].push(v.0);
            }
        }
        let mut pre = vec![NONE; n];
        let mut post = vec![NONE; n];
        let mut clock = 0u32;
        let mut st: Vec<(u32, usize)> = vec![(root.0, 0)];
        pre[root.index()] = clock;
        clock += 1;
        while let Some(&mut (v, ref mut i)) = st.last_mut() {
            if let Some(&c) = children[v as usize].get(*i) {
                *i += 1;
                pre[c as usize] = clock;
                clock += 1;
                st.push((c, 0));
            } else {
                post[v as usize] = clock;
                clock += 1;
                st.pop();
            }
        }
        DomTree { idom, pre, post }
    }
}

fn intersect(idom: &[u32], po: &[u32], mut a: u32, mut b: u32) -> u32 {
    while a != b {
        while po[a as usize] < po[b as usize] {
            a = idom[a as usize];
        }
        while po[b as usize] < po[a as usize] {
            b = idom[b as usize];
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diamond_dominators_and_postdominators() {
        // 0 -> 1 -> 3, 0 -> 2 -> 3, 3 -> 4
        let g = Cfg::from_edges(
            5,
            NodeId(0),
            NodeId(4),
            &[(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)],
        )
        .unwrap();
        let dom = DomTree::forward(&g);
        assert_eq!(dom.idom(NodeId(3)), Some(NodeId(0)));
        assert!(dom.dominates(NodeId(0), NodeId(4)));
        assert!(!dom.dominates(NodeId(1), NodeId(3)));
        let pdom = DomTree::reverse(&g);
        assert_eq!(pdom.idom(NodeId(0)), Some(NodeId(3)));
        assert!(pdom.dominates(NodeId(3), NodeId(1)));
        assert!(!pdom.dominates(NodeId(1), NodeId(0)));
    }

    #[test]
    fn loop_header_dominates_its_body() {
        let g =
            Cfg::from_edges(4, NodeId(0), NodeId(3), &[(0, 1), (1, 2), (2, 1), (1, 3)]).unwrap();
        let dom = DomTree::forward(&g);
        assert!(dom.dominates(NodeId(1), NodeId(2)));
        assert_eq!(dom.idom(NodeId(2)), Some(NodeId(1)));
    }
}
