//! Property tests of the CFG and Ball-Larus numbering on random graphs and walks.

mod common;

use std::collections::HashSet;

use common::{all_bl_paths, arb_cfg, blocks_of, build_cfg, random_walk, Rng};
use hotpath_pathprof::{BallLarus, Cfg, EdgeId, Error, NodeId, PathEnd, PathId, PathStart};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

/// Enumerate every id when there are at most this many paths.
const ENUMERATE_LIMIT: usize = 3000;

proptest! {
    #![proptest_config(Config::with_cases(256))]

    /// Ids are unique and dense: the brute-force set of Ball-Larus paths has
    /// exactly N members, each encodes to a distinct id below N, and each id
    /// below N regenerates to the path that encodes to it.
    #[test]
    fn ids_are_a_bijection_onto_0_n(g in arb_cfg(12, 14)) {
        let bl = BallLarus::number(&g).unwrap();
        let n = bl.num_paths();
        if let Some(paths) = all_bl_paths(&g, &bl, ENUMERATE_LIMIT) {
            prop_assert_eq!(paths.len() as u64, n);
            let mut seen = HashSet::new();
            for p in &paths {
                let id = bl.encode_path(p).unwrap();
                prop_assert!(id.0 < n);
                prop_assert!(seen.insert(id), "two paths share id {}", id);
                let back = bl.regenerate(id).unwrap();
                prop_assert_eq!(back.start, p.start);
                prop_assert_eq!(back.end, p.end);
                prop_assert_eq!(&back.edges, &p.edges);
                let first = match p.start {
                    PathStart::Entry => g.entry(),
                    PathStart::AfterBackEdge(b) => g.dst(b),
                };
                prop_assert_eq!(back.blocks, blocks_of(&g, first, &p.edges));
            }
        }
        let out_of_range = matches!(bl.regenerate(PathId(n)), Err(Error::PathIdOutOfRange { .. }));
        prop_assert!(out_of_range);
    }

    /// Random walks: every id is below N, the online tracer agrees with
    /// `encode_walk`, and regenerating the ids gives back the walk.
    #[test]
    fn walks_regenerate_exactly(g in arb_cfg(16, 20), seed in any::<u64>(), wander in 0usize..400) {
        let bl = BallLarus::number(&g).unwrap();
        let walk = random_walk(&g, seed, wander);
        let ids = bl.encode_walk(&walk).unwrap();
        let mut t = bl.tracer();
        let online: Vec<PathId> = walk.iter().filter_map(|&e| t.step(e)).collect();
        prop_assert_eq!(&online, &ids);
        let back_edges = walk.iter().filter(|&&e| bl.is_back_edge(e)).count();
        prop_assert_eq!(ids.len(), back_edges + 1);
        let mut again = Vec::new();
        for (k, &id) in ids.iter().enumerate() {
            prop_assert!(id.0 < bl.num_paths());
            let p = bl.regenerate(id).unwrap();
            prop_assert_eq!(p.start == PathStart::Entry, k == 0);
            prop_assert_eq!(p.end == PathEnd::Exit, k + 1 == ids.len());
            p.append_walk(&mut again);
        }
        prop_assert_eq!(again, walk);
    }

    /// Spanning-tree placement: same ids as plain values, increments only on
    /// chords, and the register starts where the tree says.
    #[test]
    fn weighted_placement_preserves_ids(g in arb_cfg(14, 16), seed in any::<u64>(), wseed in any::<u64>()) {
        let mut rng = Rng(wseed);
        let weights: Vec<u64> = g.edges().map(|_| rng.below(1000)).collect();
        let plain = BallLarus::number(&g).unwrap();
        let tree = BallLarus::number_weighted(&g, &weights).unwrap();
        prop_assert_eq!(plain.num_paths(), tree.num_paths());
        let walk = random_walk(&g, seed, 200);
        prop_assert_eq!(plain.encode_walk(&walk).unwrap(), tree.encode_walk(&walk).unwrap());
        for e in g.edges() {
            if tree.in_spanning_tree(e) {
                prop_assert_eq!(tree.probe(e).add, 0, "tree edge {} carries an increment", e);
            }
        }
        if let Some(paths) = all_bl_paths(&g, &plain, ENUMERATE_LIMIT) {
            for p in &paths {
                prop_assert_eq!(plain.encode_path(p).unwrap(), tree.encode_path(p).unwrap());
            }
        }
    }

    /// Renumbering after the CFG grows gives the same numbering as numbering
    /// the grown graph from scratch, and keeps working with the grown graph.
    #[test]
    fn renumber_after_growth_matches_fresh_numbering(g in arb_cfg(12, 10), extra in proptest::collection::vec((any::<u32>(), any::<u32>()), 1..6), seed in any::<u64>()) {
        let mut g = g;
        let mut bl = BallLarus::number(&g).unwrap();
        let n = g.node_count();
        // Grow: a new node spliced between a non-exit node and the exit,
        // plus extra edges among the old non-exit nodes.
        let v = g.add_node();
        g.add_edge(NodeId(extra[0].0 % (n - 1)), v).unwrap();
        g.add_edge(v, g.exit()).unwrap();
        for &(a, b) in &extra {
            g.add_edge(NodeId(a % (n - 1)), NodeId(1 + b % (n - 1))).unwrap();
        }
        bl.renumber(&g, None).unwrap();
        let fresh = BallLarus::number(&g).unwrap();
        prop_assert_eq!(bl.num_paths(), fresh.num_paths());
        prop_assert_eq!(bl.probes(), fresh.probes());
        let walk = random_walk(&g, seed, 100);
        prop_assert_eq!(bl.encode_walk(&walk).unwrap(), fresh.encode_walk(&walk).unwrap());
    }

    /// Any digraph normalises to one that numbers and encodes.
    #[test]
    fn normalised_arbitrary_graphs_number(n in 1u32..10, edges in proptest::collection::vec((any::<u32>(), any::<u32>()), 0..20), entry in any::<u32>(), exit in any::<u32>(), seed in any::<u64>()) {
        let mut g = Cfg::new(n, NodeId(entry % n), NodeId(exit % n)).unwrap();
        for (a, b) in edges {
            g.add_edge(NodeId(a % n), NodeId(b % n)).unwrap();
        }
        g.normalize();
        prop_assert!(g.preds(g.entry()).is_empty());
        prop_assert!(g.succs(g.exit()).is_empty());
        let bl = BallLarus::number(&g).unwrap();
        let walk = random_walk(&g, seed, 50);
        let ids = bl.encode_walk(&walk).unwrap();
        let mut again = Vec::new();
        for id in ids {
            bl.regenerate(id).unwrap().append_walk(&mut again);
        }
        prop_assert_eq!(again, walk);
    }
}

/// The generator covers what the issue asks for: reducible and irreducible
/// graphs, self-loops and parallel edges, each in a good share of cases.
#[test]
fn generator_covers_irreducible_self_loops_and_multi_edges() {
    let mut runner = TestRunner::deterministic();
    let strategy = arb_cfg(16, 20);
    let (mut reducible, mut irreducible, mut self_loops, mut multi) = (0, 0, 0, 0);
    let samples = 400;
    for _ in 0..samples {
        let g = strategy.new_tree(&mut runner).unwrap().current();
        if g.is_reducible() {
            reducible += 1;
        } else {
            irreducible += 1;
        }
        if g.edges().any(|e| g.src(e) == g.dst(e)) {
            self_loops += 1;
        }
        let mut pairs = HashSet::new();
        if g.edges().any(|e| !pairs.insert((g.src(e), g.dst(e)))) {
            multi += 1;
        }
    }
    for (what, count) in [
        ("reducible", reducible),
        ("irreducible", irreducible),
        ("self-loop", self_loops),
        ("multi-edge", multi),
    ] {
        assert!(
            count * 10 >= samples,
            "only {count} of {samples} {what} graphs"
        );
    }
}

/// An irreducible loop entered at two places: both entries give paths that
/// regenerate exactly.
#[test]
fn irreducible_loop_walks_regenerate() {
    // 0 -> 1, 0 -> 2, 1 -> 2, 2 -> 1, 2 -> 3.
    let g = Cfg::from_edges(
        4,
        NodeId(0),
        NodeId(3),
        &[(0, 1), (0, 2), (1, 2), (2, 1), (2, 3)],
    )
    .unwrap();
    assert!(!g.is_reducible());
    let bl = BallLarus::number(&g).unwrap();
    for walk in [vec![0, 2, 3, 2, 3, 2, 4], vec![1, 3, 2, 4]] {
        let walk: Vec<EdgeId> = walk.into_iter().map(EdgeId).collect();
        let mut again = Vec::new();
        for id in bl.encode_walk(&walk).unwrap() {
            bl.regenerate(id).unwrap().append_walk(&mut again);
        }
        assert_eq!(again, walk);
    }
}

/// Parallel edges get different ids although they join the same blocks.
#[test]
fn parallel_edges_are_distinct_paths() {
    let g = build_cfg(2, &[0, 0], &[0, 0], &[(0, 0), (0, 0)], false);
    // Three parallel edges 0 -> 1.
    assert_eq!(g.edge_count(), 4);
    let bl = BallLarus::number(&g).unwrap();
    assert_eq!(bl.num_paths(), 4);
    let ids: HashSet<PathId> = g
        .edges()
        .map(|e| bl.encode_walk(&[e]).unwrap()[0])
        .collect();
    assert_eq!(ids.len(), 4);
}
