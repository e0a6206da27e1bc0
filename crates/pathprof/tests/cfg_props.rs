//! Property tests of the CFG analyses: DFS back edges and reducibility, against independent oracles.

mod common;

use std::collections::{BTreeSet, HashMap, HashSet};

use common::arb_cfg;
use hotpath_pathprof::{Cfg, NodeId};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Reducibility by T1/T2 reduction (Hecht and Ullman): repeatedly remove
/// self-loops (T1) and merge a non-entry node with a unique predecessor
/// into it (T2); the graph is reducible iff one node remains.
fn reducible_by_t1_t2(g: &Cfg) -> bool {
    let reach = reachable(g);
    let mut succ: HashMap<u32, BTreeSet<u32>> = HashMap::new();
    let mut pred: HashMap<u32, BTreeSet<u32>> = HashMap::new();
    for v in g.nodes().filter(|v| reach.contains(v)) {
        succ.entry(v.0).or_default();
        pred.entry(v.0).or_default();
    }
    for e in g.edges() {
        let (s, d) = (g.src(e), g.dst(e));
        if reach.contains(&s) {
            succ.get_mut(&s.0).unwrap().insert(d.0);
            pred.get_mut(&d.0).unwrap().insert(s.0);
        }
    }
    let entry = g.entry().0;
    loop {
        let mut changed = false;
        for (v, s) in succ.iter_mut() {
            if s.remove(v) {
                pred.get_mut(v).unwrap().remove(v);
                changed = true;
            }
        }
        let candidate = pred
            .iter()
            .find(|(&v, p)| v != entry && p.len() == 1)
            .map(|(&v, p)| (v, *p.iter().next().unwrap()));
        if let Some((n, m)) = candidate {
            // Merge n into m.
            let n_succ = succ.remove(&n).unwrap();
            pred.remove(&n);
            succ.get_mut(&m).unwrap().remove(&n);
            for s in n_succ {
                pred.get_mut(&s).unwrap().remove(&n);
                pred.get_mut(&s).unwrap().insert(m);
                succ.get_mut(&m).unwrap().insert(s);
            }
            changed = true;
        }
        if !changed {
            return succ.len() == 1;
        }
    }
}

fn reachable(g: &Cfg) -> HashSet<NodeId> {
    let mut seen = HashSet::new();
    let mut stack = vec![g.entry()];
    while let Some(v) = stack.pop() {
        if seen.insert(v) {
            stack.extend(g.succs(v).iter().map(|&e| g.dst(e)));
        }
    }
    seen
}

/// Whether `to` is reachable from `from` in `g`.
fn reaches(g: &Cfg, from: NodeId, to: NodeId) -> bool {
    let mut seen = HashSet::new();
    let mut stack = vec![from];
    while let Some(v) = stack.pop() {
        if v == to {
            return true;
        }
        if seen.insert(v) {
            stack.extend(g.succs(v).iter().map(|&e| g.dst(e)));
        }
    }
    false
}

proptest! {
    #![proptest_config(Config::with_cases(300))]

    #[test]
    fn reducibility_matches_t1_t2(g in arb_cfg(12, 14)) {
        prop_assert_eq!(g.is_reducible(), reducible_by_t1_t2(&g));
    }

    /// Without its back edges the graph is acyclic (Kahn's algorithm drains
    /// it), and each back edge closes a cycle.
    #[test]
    fn back_edges_are_exactly_what_makes_cycles(g in arb_cfg(16, 20)) {
        let back: HashSet<_> = g.back_edges().into_iter().collect();
        let mut indeg = vec![0usize; g.node_count() as usize];
        for e in g.edges().filter(|e| !back.contains(e)) {
            indeg[g.dst(e).index()] += 1;
        }
        let mut ready: Vec<NodeId> = g.nodes().filter(|v| indeg[v.index()] == 0).collect();
        let mut drained = 0;
        while let Some(v) = ready.pop() {
            drained += 1;
            for &e in g.succs(v) {
                if !back.contains(&e) {
                    indeg[g.dst(e).index()] -= 1;
                    if indeg[g.dst(e).index()] == 0 {
                        ready.push(g.dst(e));
                    }
                }
            }
        }
        prop_assert_eq!(drained, g.node_count() as usize);
        for &e in &back {
            prop_assert!(reaches(&g, g.dst(e), g.src(e)));
        }
    }
}
