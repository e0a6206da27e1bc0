//! Property tests of PAP: the backwalk returns exactly the walk, with and without breakpoints and regions.

mod common;

use common::{arb_cfg, arb_cyclic_cfg, arb_loop_of_dag, random_walk};
use hotpath_pathprof::{BallLarus, Cfg, Pap, PapConfig, REDUCTION_PROBES};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

/// Walks in the long-walk test have at least this many edges (the issue's
/// "100 000+ edges").
const LONG_WALK_EDGES: usize = 100_000;

/// Bits needed to hold remainder `s - 1` for the largest fan-in.
fn min_bits(g: &Cfg) -> u32 {
    let max_fan_in = g
        .nodes()
        .map(|v| g.preds(v).len() as u64)
        .max()
        .unwrap_or(1)
        .max(2);
    64 - (max_fan_in - 1).leading_zeros()
}

fn check_roundtrip(pap: &Pap, walk: &[hotpath_pathprof::EdgeId]) -> Result<usize, TestCaseError> {
    let trace = pap.encode_walk(walk).unwrap();
    let back = pap.backwalk(&trace).unwrap();
    prop_assert_eq!(back.len(), walk.len());
    prop_assert!(back == walk, "backwalk differs from the walk");
    // Segments are independent: walking each back on its own and
    // concatenating gives the same walk.
    let mut pieces = Vec::new();
    let mut stop = None;
    for (k, bp) in trace.breakpoints.iter().enumerate() {
        pap.backwalk_segment(k, bp.node, bp.r, stop, &mut pieces)
            .unwrap();
        stop = Some(bp.node);
    }
    pap.backwalk_segment(
        trace.breakpoints.len(),
        pap_exit(walk, pap),
        trace.last,
        stop,
        &mut pieces,
    )
    .unwrap();
    prop_assert!(pieces == walk);
    for bp in &trace.breakpoints {
        prop_assert!(bp.r <= pap.word_max());
    }
    prop_assert!(trace.last <= pap.word_max());
    Ok(trace.breakpoints.len())
}

/// The exit, found from the walk's last edge via the encoding's in-edges.
fn pap_exit(walk: &[hotpath_pathprof::EdgeId], pap: &Pap) -> hotpath_pathprof::NodeId {
    let last = *walk.last().expect("non-empty walk");
    (0..u32::MAX)
        .map(hotpath_pathprof::NodeId)
        .find(|&v| pap.in_edges(v).contains(&last))
        .unwrap()
}

proptest! {
    #![proptest_config(Config::with_cases(300))]

    /// Backwalk is exact for any word width that can hold the remainders.
    #[test]
    fn backwalk_returns_the_walk(g in arb_cfg(16, 20), seed in any::<u64>(), wander in 1usize..3000, extra_bits in 0u32..64, regions in any::<bool>()) {
        let bits = (min_bits(&g) + extra_bits).min(64);
        let pap = Pap::new(&g, PapConfig { word_bits: bits, epp_regions: regions }).unwrap();
        let walk = random_walk(&g, seed, wander);
        check_roundtrip(&pap, &walk)?;
    }

    /// Encoding is injective: two different walks never share a trace.
    #[test]
    fn different_walks_have_different_traces(g in arb_cfg(10, 12), s1 in any::<u64>(), s2 in any::<u64>(), bits in 2u32..12) {
        let bits = bits.max(min_bits(&g));
        let pap = Pap::new(&g, PapConfig { word_bits: bits, epp_regions: true }).unwrap();
        let (w1, w2) = (random_walk(&g, s1, 60), random_walk(&g, s2, 60));
        let (t1, t2) = (pap.encode_walk(&w1).unwrap(), pap.encode_walk(&w2).unwrap());
        prop_assert_eq!(w1 == w2, t1 == t2);
    }

    /// Regions only ever reduce the probe count, by the savings they report,
    /// and each region saves at least one probe.
    #[test]
    fn regions_save_what_they_report(g in arb_cfg(24, 12)) {
        let plain = Pap::new(&g, PapConfig { word_bits: 64, epp_regions: false }).unwrap();
        let epp = Pap::new(&g, PapConfig { word_bits: 64, epp_regions: true }).unwrap();
        prop_assert_eq!(plain.stats().pap_probes, epp.stats().pap_probes);
        let saved: usize = epp.regions().iter().map(|r| r.saved()).sum();
        prop_assert_eq!(epp.stats().saved, saved);
        prop_assert_eq!(epp.stats().probes_with_epp + saved, epp.stats().pap_probes);
        for r in epp.regions() {
            prop_assert!(r.saved() >= 1);
            prop_assert!(r.pap_probes > r.epp_probes + REDUCTION_PROBES);
            prop_assert!(r.paths >= 2);
        }
        // Regions are disjoint.
        let mut seen = std::collections::HashSet::new();
        for r in epp.regions() {
            for v in &r.nodes {
                prop_assert!(seen.insert(*v));
            }
        }
    }

    /// PAP paper §1.3 on acyclic graphs: PAP needs the sum of merge fan-ins
    /// plus 2 probes, and at most twice Ball-Larus's plus 2.
    #[test]
    fn probe_count_bound_on_dags(n in 2u32..30, preds in proptest::collection::vec(any::<u32>(), 30), succs in proptest::collection::vec(any::<u32>(), 30), extra in proptest::collection::vec((any::<u32>(), any::<u32>()), 0..30)) {
        // Forward-only extra edges keep the graph acyclic (`build_cfg` maps
        // a destination `b` to node `1 + b`, so `a + k` means node `a + 1 + k`).
        let fwd: Vec<(u32, u32)> = extra.iter().map(|&(a, b)| {
            let a = a % (n - 1);
            (a, a + b % (n - 1 - a))
        }).collect();
        let g = common::build_cfg(n, &preds, &succs, &fwd, false);
        prop_assert!(g.back_edges().is_empty());
        let pap = Pap::new(&g, PapConfig { word_bits: 64, epp_regions: false }).unwrap();
        let bl = BallLarus::number(&g).unwrap();
        let fan_in_sum: usize = g.nodes().map(|v| g.preds(v).len()).filter(|&s| s > 1).sum();
        prop_assert_eq!(pap.stats().pap_probes, fan_in_sum + 2);
        let epp = bl.increment_edge_count();
        prop_assert_eq!(epp as u32, g.edge_count() - g.node_count() + 1);
        prop_assert!(pap.stats().pap_probes <= 2 * epp + 2);
    }
}

proptest! {
    #![proptest_config(Config::with_cases(32))]

    /// Walks of 100 000+ edges with a narrow register: many breakpoints, and
    /// the backwalk still returns every edge.
    #[test]
    fn long_walks_with_many_breakpoints(g in arb_cyclic_cfg(20, 16), seed in any::<u64>(), extra_bits in 0u32..8, regions in any::<bool>()) {
        let bits = min_bits(&g) + extra_bits;
        let pap = Pap::new(&g, PapConfig { word_bits: bits, epp_regions: regions }).unwrap();
        let walk = random_walk(&g, seed, LONG_WALK_EDGES);
        prop_assert!(walk.len() >= LONG_WALK_EDGES);
        let breakpoints = check_roundtrip(&pap, &walk)?;
        // A w-bit register holds about w / log2(s) merges; a 100k walk goes
        // through many more.
        prop_assert!(breakpoints >= 1000, "only {} breakpoints", breakpoints);
    }
}

proptest! {
    #![proptest_config(Config::with_cases(32))]

    /// Long walks round a loop whose body is numbered Ball-Larus style:
    /// region breakpoints (`r := r*n` overflowing) and ordinary ones mix,
    /// and the backwalk is still exact.
    #[test]
    fn long_walks_through_regions(g in arb_loop_of_dag(14, 10), seed in any::<u64>(), extra_bits in 0u32..10) {
        let bits = min_bits(&g) + extra_bits;
        let pap = Pap::new(&g, PapConfig { word_bits: bits, epp_regions: true }).unwrap();
        let walk = random_walk(&g, seed, LONG_WALK_EDGES);
        prop_assert!(walk.len() >= LONG_WALK_EDGES);
        check_roundtrip(&pap, &walk)?;
    }
}

/// The loop-of-DAG generator gives graphs where regions are found, so the
/// test above exercises them.
#[test]
fn loop_bodies_yield_regions() {
    let mut runner = TestRunner::deterministic();
    let strategy = arb_loop_of_dag(14, 10);
    let samples = 200;
    let with_regions = (0..samples)
        .filter(|_| {
            let g = strategy.new_tree(&mut runner).unwrap().current();
            !Pap::new(&g, PapConfig::default())
                .unwrap()
                .regions()
                .is_empty()
        })
        .count();
    assert!(
        with_regions * 2 >= samples,
        "only {with_regions} of {samples} loop bodies had a region"
    );
}
