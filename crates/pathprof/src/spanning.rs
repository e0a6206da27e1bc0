//! Spanning trees of the Ball-Larus DAG and the chord increments they induce.
//!
//! Ball-Larus lecture step 2 (after Ball & Larus 1994, Knuth): add an edge
//! `exit -> entry`, take a maximum-weight spanning tree of the undirected
//! graph (weights are edge execution frequencies), and move every edge value
//! onto the chords (non-tree edges) so that each entry-to-exit path still sums
//! to its id. Tree edges then need no instrumentation, and the hottest edges
//! end up in the tree.
//!
//! The increments come from node potentials `phi`: `phi(entry) = 0`, and along
//! every tree edge `u -> v`, `phi(v) = phi(u) + Val(u -> v)` (the virtual edge
//! has value 0). Then `Inc(e) = Val(e) + phi(src) - phi(dst)` is zero on tree
//! edges, and along any entry-to-exit path the potentials telescope:
//! `start + sum(Inc) = phi(exit) + sum(Val) + phi(entry) - phi(exit) = sum(Val)`,
//! where `start = Inc(exit -> entry) = phi(exit)` is the register's initial
//! value (0 when the virtual edge is in the tree). All arithmetic is modulo
//! 2^64: increments may be "negative", intermediate register values may wrap,
//! and the final sum is exact because it lies in `[0, NumPaths)`.

use crate::dag::Dag;
use crate::ids::{NodeId, NONE};

/// A spanning tree of the DAG plus the virtual `exit -> entry` edge.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpanningTree {
    /// Per DAG edge: in the tree.
    pub in_tree: Vec<bool>,
    /// Whether the virtual `exit -> entry` edge is in the tree.
    pub virt_in_tree: bool,
}

impl SpanningTree {
    /// The tree of every non-exit node's first out-edge (the edge plain
    /// Ball-Larus gives value 0); the virtual edge is a chord. With this tree
    /// the potentials are all 0 and `Inc = Val`: the textbook placement.
    pub fn first_out_edges(&mut self, dag: &Dag) {
        self.in_tree.clear();
        self.in_tree.resize(dag.src.len(), false);
        self.virt_in_tree = false;
        for &v in &dag.topo {
            let r = dag.out_range(v);
            if !r.is_empty() {
                self.in_tree[r.start] = true;
            }
        }
    }

    /// A maximum-weight spanning tree (Kruskal; ties broken by lower edge id,
    /// virtual edge first). `weight[d]` is DAG edge `d`'s weight.
    /// O(E log E).
    pub fn maximum(&mut self, dag: &Dag, weight: &[u64], virt_weight: u64) {
        let m = dag.src.len();
        self.in_tree.clear();
        self.in_tree.resize(m, false);
        let mut order: Vec<u32> = (0..=m as u32).collect();
        let w = |d: u32| {
            if d as usize == m {
                virt_weight
            } else {
                weight[d as usize]
            }
        };
        order.sort_by(|&a, &b| {
            w(b).cmp(&w(a)).then_with(|| {
                (a as usize == m)
                    .cmp(&(b as usize == m))
                    .reverse()
                    .then(a.cmp(&b))
            })
        });
        let mut uf = UnionFind::new(dag.out_start.len() - 1);
        self.virt_in_tree = false;
        for d in order {
            let (a, b) = if d as usize == m {
                (dag.exit, dag.entry)
            } else {
                (dag.src[d as usize], dag.dst[d as usize])
            };
            if uf.union(a.0, b.0) {
                if d as usize == m {
                    self.virt_in_tree = true;
                } else {
                    self.in_tree[d as usize] = true;
                }
            }
        }
    }

    /// Chord increments for edge values `vals` (one per DAG edge, taken
    /// modulo 2^64) into `inc`; returns the register's start value.
    /// O(nodes + edges), allocation-free once `scratch` has grown.
    pub fn increments(
        &self,
        dag: &Dag,
        vals: &[u64],
        inc: &mut Vec<u64>,
        scratch: &mut Scratch,
    ) -> u64 {
        let n = dag.out_start.len() - 1;
        let virt = self.virt_in_tree && dag.entry != dag.exit;
        // Tree adjacency in CSR form: (DAG edge or NONE for the virtual edge,
        // other node, forward?).
        let Scratch {
            start,
            adj,
            phi,
            seen,
            stack,
        } = scratch;
        start.clear();
        start.resize(n + 1, 0);
        let mut degree = |v: NodeId| start[v.index() + 1] += 1;
        for (d, &t) in self.in_tree.iter().enumerate() {
            if t {
                degree(dag.src[d]);
                degree(dag.dst[d]);
            }
        }
        if virt {
            degree(dag.entry);
            degree(dag.exit);
        }
        for v in 0..n {
            start[v + 1] += start[v];
        }
        adj.clear();
        adj.resize(start[n] as usize, (NONE, NodeId(0), false));
        let mut fill = |v: NodeId, item: (u32, NodeId, bool)| {
            let slot = &mut start[v.index()];
            adj[*slot as usize] = item;
            *slot += 1;
        };
        for (d, &t) in self.in_tree.iter().enumerate() {
            if t {
                fill(dag.src[d], (d as u32, dag.dst[d], true));
                fill(dag.dst[d], (d as u32, dag.src[d], false));
            }
        }
        if virt {
            fill(dag.exit, (NONE, dag.entry, true));
            fill(dag.entry, (NONE, dag.exit, false));
        }
        // `start[v]` now holds the end of v's range: shift back.
        for v in (1..=n).rev() {
            start[v] = start[v - 1];
        }
        start[0] = 0;

        phi.clear();
        phi.resize(n, 0);
        seen.clear();
        seen.resize(n, false);
        stack.clear();
        stack.push(dag.entry);
        seen[dag.entry.index()] = true;
        while let Some(u) = stack.pop() {
            for &(d, w, forward) in &adj[start[u.index()] as usize..start[u.index() + 1] as usize] {
                if seen[w.index()] {
                    continue;
                }
                seen[w.index()] = true;
                let val = if d == NONE { 0 } else { vals[d as usize] };
                phi[w.index()] = if forward {
                    phi[u.index()].wrapping_add(val)
                } else {
                    phi[u.index()].wrapping_sub(val)
                };
                stack.push(w);
            }
        }
        inc.clear();
        inc.extend((0..dag.src.len()).map(|d| {
            vals[d]
                .wrapping_add(phi[dag.src[d].index()])
                .wrapping_sub(phi[dag.dst[d].index()])
        }));
        phi[dag.exit.index()].wrapping_sub(phi[dag.entry.index()])
    }
}

/// Reusable buffers for [`SpanningTree::increments`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Scratch {
    start: Vec<u32>,
    adj: Vec<(u32, NodeId, bool)>,
    phi: Vec<u64>,
    seen: Vec<bool>,
    stack: Vec<NodeId>,
}

/// Disjoint sets over `u32` node ids, with path halving and union by size.
struct UnionFind {
    parent: Vec<u32>,
    size: Vec<u32>,
}

impl UnionFind {
    fn new(n: usize) -> Self {
        UnionFind {
            parent: (0..n as u32).collect(),
            size: vec![1; n],
        }
    }

    fn find(&mut self, mut x: u32) -> u32 {
        while self.parent[x as usize] != x {
            let gp = self.parent[self.parent[x as usize] as usize];
            self.parent[x as usize] = gp;
            x = gp;
        }
        x
    }

    /// Joins the sets of `a` and `b`; `false` if they were already one.
    fn union(&mut self, a: u32, b: u32) -> bool {
        let (mut a, mut b) = (self.find(a), self.find(b));
        if a == b {
            return false;
        }
        if self.size[a as usize] < self.size[b as usize] {
            std::mem::swap(&mut a, &mut b);
        }
        self.parent[b as usize] = a;
        self.size[a as usize] += self.size[b as usize];
        true
    }
}
