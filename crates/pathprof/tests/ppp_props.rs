//! Property tests of PPP: unique compact ids for interesting paths, same-edge placement, alias resolution.

mod common;

use std::collections::{HashMap, HashSet};

use common::{arb_cfg, random_walk, Rng};
use hotpath_pathprof::{BallLarus, PathId, Ppp, PppHit};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Picks `count` distinct ids below `n` (all of them if `count >= n`).
fn pick(n: u64, count: usize, seed: u64) -> Vec<PathId> {
    if count as u64 >= n {
        return (0..n).map(PathId).collect();
    }
    let mut rng = Rng(seed);
    let mut set = HashSet::new();
    let mut out = Vec::new();
    while out.len() < count {
        let id = PathId(rng.below(n));
        if set.insert(id) {
            out.push(id);
        }
    }
    out
}

proptest! {
    #![proptest_config(Config::with_cases(256))]

    /// Interesting paths get distinct ids, the smallest 0, compactness >= 1;
    /// every path's PPP id (interesting or not) is what the PPP register
    /// computes online; the profile counts interesting paths exactly and
    /// sends the others to the residual table.
    #[test]
    fn ppp_numbers_and_profiles(g in arb_cfg(12, 14), count in 1usize..40, seed in any::<u64>(), wseed in any::<u64>(), weighted in any::<bool>()) {
        let bl = if weighted {
            let mut rng = Rng(wseed);
            let w: Vec<u64> = g.edges().map(|_| rng.below(100)).collect();
            BallLarus::number_weighted(&g, &w).unwrap()
        } else {
            BallLarus::number(&g).unwrap()
        };
        let chosen = pick(bl.num_paths(), count, seed);
        let ppp = Ppp::new(&bl, &chosen).unwrap();
        let ids: HashSet<i64> = ppp.interesting().iter().map(|&(_, p)| p).collect();
        prop_assert_eq!(ids.len(), chosen.len());
        let (lo, hi) = ppp.id_range();
        prop_assert_eq!(lo, 0);
        prop_assert!(ppp.compactness() >= 1.0);
        prop_assert_eq!(ppp.compactness(), (hi - lo + 1) as f64 / chosen.len() as f64);
        for &(b, p) in ppp.interesting() {
            prop_assert_eq!(ppp.ppp_id_of_path(&bl, b).unwrap(), p);
            prop_assert_eq!(ppp.id_of(b), Some(p));
        }
        // Both registers change on the same edges: the Ball-Larus tree's.
        for e in g.edges() {
            if bl.in_spanning_tree(e) {
                prop_assert_eq!(ppp.probes()[e.index()].add, 0);
            }
            prop_assert_eq!(ppp.probes()[e.index()].ends_path, bl.probe(e).ends_path);
        }
        // Online: a walk's paths through both registers.
        let walk = random_walk(&g, seed ^ 1, 150);
        let bl_ids = bl.encode_walk(&walk).unwrap();
        let mut t = ppp.tracer(&bl);
        let pairs: Vec<(i64, PathId)> = walk.iter().filter_map(|&e| t.step(e)).collect();
        prop_assert_eq!(pairs.iter().map(|p| p.1).collect::<Vec<_>>(), bl_ids.clone());
        let mut profile = ppp.profile();
        let interesting: HashSet<PathId> = chosen.iter().copied().collect();
        let mut want: HashMap<PathId, u64> = HashMap::new();
        for &(p, b) in &pairs {
            prop_assert_eq!(p, ppp.ppp_id_of_path(&bl, b).unwrap());
            let hit = profile.record(p, b);
            prop_assert_eq!(matches!(hit, PppHit::Interesting { .. }), interesting.contains(&b));
            *want.entry(b).or_insert(0) += 1;
        }
        for &b in &chosen {
            prop_assert_eq!(profile.count_of(b), want.get(&b).copied().unwrap_or(0));
        }
        let residual: HashMap<PathId, u64> = profile.residual().collect();
        let want_residual: HashMap<PathId, u64> = want.into_iter().filter(|(b, _)| !interesting.contains(b)).collect();
        prop_assert_eq!(residual, want_residual);
    }

    /// With every path interesting, PPP is Ball-Larus: perfect compactness
    /// and the same ids (PPP paper §4.4: Ball-Larus is optimal for I = all paths).
    #[test]
    fn all_paths_interesting_gives_ball_larus(g in arb_cfg(10, 10)) {
        let bl = BallLarus::number(&g).unwrap();
        prop_assume!(bl.num_paths() <= 2000);
        let all: Vec<PathId> = (0..bl.num_paths()).map(PathId).collect();
        let ppp = Ppp::new(&bl, &all).unwrap();
        prop_assert_eq!(ppp.compactness(), 1.0);
        for &(b, p) in ppp.interesting() {
            prop_assert_eq!(b.0 as i64, p);
        }
    }
}
