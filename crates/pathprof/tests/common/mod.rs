//! Shared generators for the property tests: random CFGs, random walks, brute-force path enumeration.
#![allow(dead_code)]

use hotpath_pathprof::{BallLarus, BlPath, Cfg, EdgeId, NodeId, PathEnd, PathStart};
use proptest::prelude::*;

/// A small deterministic PRNG (splitmix64) for walks and streams.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random single-entry, single-exit CFG with `n` nodes: entry 0, exit
/// `n - 1`. Every node gets a predecessor below it (so all are reachable)
/// and every non-exit node a successor above it (so all reach the exit);
/// then extra edges go anywhere except into the entry or out of the exit:
/// backward edges make loops (irreducible ones when they jump into a loop's
/// middle), `a == b` makes self-loops, repeats make parallel edges. With
/// `spine`, node `i` also gets `i -> i + 1`, so every backward edge closes a
/// cycle. With `shuffle`, edges are inserted in a random order (insertion
/// order is what numberings follow, so back edges often come first).
pub fn build_cfg_shuffled(
    n: u32,
    preds: &[u32],
    succs: &[u32],
    extra: &[(u32, u32)],
    spine: bool,
    shuffle: Option<u64>,
) -> Cfg {
    let mut g = Cfg::new(n, NodeId(0), NodeId(n - 1)).unwrap();
    if n == 1 {
        return g;
    }
    let mut edges = Vec::new();
    for i in 1..n {
        edges.push((preds[i as usize] % i, i));
    }
    for i in 0..n - 1 {
        let s = if spine {
            i + 1
        } else {
            i + 1 + succs[i as usize] % (n - 1 - i)
        };
        edges.push((i, s));
    }
    for &(a, b) in extra {
        edges.push((a % (n - 1), 1 + b % (n - 1)));
    }
    if let Some(seed) = shuffle {
        let mut rng = Rng(seed);
        for i in (1..edges.len()).rev() {
            edges.swap(i, rng.below(i as u64 + 1) as usize);
        }
    }
    for (a, b) in edges {
        g.add_edge(NodeId(a), NodeId(b)).unwrap();
    }
    g
}

/// [`build_cfg_shuffled`] in the natural insertion order.
pub fn build_cfg(n: u32, preds: &[u32], succs: &[u32], extra: &[(u32, u32)], spine: bool) -> Cfg {
    build_cfg_shuffled(n, preds, succs, extra, spine, None)
}

/// Strategy: a random CFG of 2..=`max_nodes` nodes with up to `max_extra`
/// extra edges.
pub fn arb_cfg(max_nodes: u32, max_extra: usize) -> impl Strategy<Value = Cfg> {
    (2..=max_nodes, any::<bool>()).prop_flat_map(move |(n, spine)| {
        (
            proptest::collection::vec(any::<u32>(), n as usize),
            proptest::collection::vec(any::<u32>(), n as usize),
            proptest::collection::vec((any::<u32>(), any::<u32>()), 0..=max_extra),
            proptest::option::of(any::<u64>()),
        )
            .prop_map(move |(p, s, x, shuffle)| build_cfg_shuffled(n, &p, &s, &x, spine, shuffle))
    })
}

/// Strategy: a random CFG with a spine and at least one backward edge from
/// `n - 2`, so it has a cycle a walk can go round indefinitely.
pub fn arb_cyclic_cfg(max_nodes: u32, max_extra: usize) -> impl Strategy<Value = Cfg> {
    (3..=max_nodes).prop_flat_map(move |n| {
        (
            proptest::collection::vec(any::<u32>(), n as usize),
            proptest::collection::vec((any::<u32>(), any::<u32>()), 0..=max_extra),
            1..n - 1,
            proptest::option::of(any::<u64>()),
        )
            .prop_map(move |(p, mut x, back_to, shuffle)| {
                x.push((n - 2, back_to - 1));
                build_cfg_shuffled(n, &p, &p, &x, true, shuffle)
            })
    })
}

/// Number of edges from each node to the exit along shortest paths.
fn dist_to_exit(g: &Cfg) -> Vec<u32> {
    let mut dist = vec![u32::MAX; g.node_count() as usize];
    let mut queue = std::collections::VecDeque::new();
    dist[g.exit().index()] = 0;
    queue.push_back(g.exit());
    while let Some(v) = queue.pop_front() {
        for &e in g.preds(v) {
            let s = g.src(e);
            if dist[s.index()] == u32::MAX {
                dist[s.index()] = dist[v.index()] + 1;
                queue.push_back(s);
            }
        }
    }
    dist
}

/// A random entry-to-exit walk: it wanders (avoiding the exit while it can)
/// for about `wander` edges, then heads for the exit along shortest paths.
/// It never enters a node from which the exit cannot be reached.
pub fn random_walk(g: &Cfg, seed: u64, wander: usize) -> Vec<EdgeId> {
    let dist = dist_to_exit(g);
    let mut rng = Rng(seed);
    let mut walk = Vec::new();
    let mut at = g.entry();
    while at != g.exit() {
        let succs: Vec<EdgeId> = g
            .succs(at)
            .iter()
            .copied()
            .filter(|&e| dist[g.dst(e).index()] != u32::MAX)
            .collect();
        let e = if walk.len() < wander {
            let stay: Vec<EdgeId> = succs
                .iter()
                .copied()
                .filter(|&e| g.dst(e) != g.exit())
                .collect();
            let pool = if stay.is_empty() {
                &succs[..]
            } else {
                &stay[..]
            };
            pool[rng.below(pool.len() as u64) as usize]
        } else {
            let best: Vec<EdgeId> = succs
                .iter()
                .copied()
                .filter(|&e| dist[g.dst(e).index()] < dist[at.index()])
                .collect();
            best[rng.below(best.len() as u64) as usize]
        };
        walk.push(e);
        at = g.dst(e);
    }
    walk
}

/// Every Ball-Larus path of `g`, by brute force: for each start (the entry,
/// or the head of each back edge), every sequence of forward edges that ends
/// at the exit or continues with a back edge. `None` if there are more than
/// `limit`.
pub fn all_bl_paths(g: &Cfg, bl: &BallLarus, limit: usize) -> Option<Vec<BlPath>> {
    let mut out = Vec::new();
    let mut starts = vec![(PathStart::Entry, g.entry())];
    for e in g.edges() {
        if bl.is_back_edge(e) {
            starts.push((PathStart::AfterBackEdge(e), g.dst(e)));
        }
    }
    for (start, node) in starts {
        let mut stack: Vec<(NodeId, Vec<EdgeId>)> = vec![(node, Vec::new())];
        while let Some((v, edges)) = stack.pop() {
            if v == g.exit() {
                out.push(BlPath {
                    start,
                    end: PathEnd::Exit,
                    blocks: Vec::new(),
                    edges: edges.clone(),
                });
            }
            for &e in g.succs(v) {
                if bl.is_back_edge(e) {
                    out.push(BlPath {
                        start,
                        end: PathEnd::BackEdge(e),
                        blocks: Vec::new(),
                        edges: edges.clone(),
                    });
                } else {
                    let mut next = edges.clone();
                    next.push(e);
                    stack.push((g.dst(e), next));
                }
            }
            if out.len() > limit {
                return None;
            }
        }
    }
    Some(out)
}

/// The blocks of a path, from its start and edges.
pub fn blocks_of(g: &Cfg, entry: NodeId, edges: &[EdgeId]) -> Vec<NodeId> {
    let mut b = vec![entry];
    b.extend(edges.iter().map(|&e| g.dst(e)));
    b
}

/// A loop whose body is a random acyclic single-entry, single-exit graph:
/// node 0 is the entry, 1 the loop head, `m` the latch, `m + 1` the exit;
/// body edges only go forward, so the body is a reducible acyclic region
/// (PAP paper §1.4) unless `back` adds extra backward edges inside it.
pub fn build_loop_of_dag(
    m: u32,
    preds: &[u32],
    succs: &[u32],
    fwd: &[(u32, u32)],
    back: &[(u32, u32)],
) -> Cfg {
    let exit = m + 1;
    let mut g = Cfg::new(m + 2, NodeId(0), NodeId(exit)).unwrap();
    g.add_edge(NodeId(0), NodeId(1)).unwrap();
    for i in 2..=m {
        g.add_edge(NodeId(1 + preds[i as usize] % (i - 1)), NodeId(i))
            .unwrap();
    }
    for i in 1..m {
        g.add_edge(NodeId(i), NodeId(i + 1 + succs[i as usize] % (m - i)))
            .unwrap();
    }
    for &(a, b) in fwd {
        let a = 1 + a % (m - 1);
        g.add_edge(NodeId(a), NodeId(a + 1 + b % (m - a))).unwrap();
    }
    for &(a, b) in back {
        let a = 1 + a % m;
        g.add_edge(NodeId(a), NodeId(1 + b % a)).unwrap();
    }
    g.add_edge(NodeId(m), NodeId(1)).unwrap();
    g.add_edge(NodeId(m), NodeId(exit)).unwrap();
    g
}

/// Strategy for [`build_loop_of_dag`] with a body of 3..=`max_body` nodes.
pub fn arb_loop_of_dag(max_body: u32, max_extra: usize) -> impl Strategy<Value = Cfg> {
    (3..=max_body).prop_flat_map(move |m| {
        (
            proptest::collection::vec(any::<u32>(), m as usize + 1),
            proptest::collection::vec(any::<u32>(), m as usize + 1),
            proptest::collection::vec((any::<u32>(), any::<u32>()), 0..=max_extra),
            proptest::collection::vec((any::<u32>(), any::<u32>()), 0..=1),
        )
            .prop_map(move |(p, s, f, b)| build_loop_of_dag(m, &p, &s, &f, &b))
    })
}
