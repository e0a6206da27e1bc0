//! Property tests of the k-slab forest and k-iterations path forest against brute-force run counting.

mod common;

use std::collections::HashMap;

use common::{arb_cfg, random_walk};
use hotpath_pathprof::{BallLarus, KIterationForest, KSlabForest, PathId, StreamItem};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Counts every run of 1..=k consecutive ids between markers.
fn brute_force(stream: &[StreamItem], k: usize) -> HashMap<Vec<PathId>, u64> {
    let mut counts = HashMap::new();
    for piece in stream.split(|it| *it == StreamItem::RoutineEntry) {
        let ids: Vec<PathId> = piece
            .iter()
            .map(|it| match it {
                StreamItem::Path(p) => *p,
                StreamItem::RoutineEntry => unreachable!(),
            })
            .collect();
        for start in 0..ids.len() {
            for len in 1..=k.min(ids.len() - start) {
                *counts.entry(ids[start..start + len].to_vec()).or_insert(0) += 1;
            }
        }
    }
    counts
}

fn forest(stream: &[StreamItem], k: usize) -> KIterationForest {
    let mut sf = KSlabForest::new(k).unwrap();
    sf.extend(stream.iter().copied());
    sf.to_ipf()
}

fn check_against_brute_force(stream: &[StreamItem], k: usize) -> Result<(), TestCaseError> {
    let ipf = forest(stream, k);
    let got: HashMap<Vec<PathId>, u64> = ipf.sequences().into_iter().collect();
    let want = brute_force(stream, k);
    prop_assert_eq!(
        got.len(),
        ipf.len(),
        "a sequence appears twice in the forest"
    );
    prop_assert_eq!(&got, &want);
    for (seq, &c) in &want {
        prop_assert_eq!(ipf.count(seq), c);
    }
    // Property 1 of the paper: a node counts at least as much as its children.
    let mut stack: Vec<_> = ipf.roots().collect();
    while let Some(n) = stack.pop() {
        let kids: u64 = ipf.children(n).map(|c| ipf.count_of(c)).sum();
        prop_assert!(ipf.count_of(n) >= kids);
        stack.extend(ipf.children(n));
    }
    Ok(())
}

/// A stream of ids below `alphabet`, with markers. A small alphabet makes
/// runs repeat; a large one gives k-SF nodes more than `SCAN_LIMIT`
/// children.
fn arb_stream(max_len: usize, alphabet: u64) -> impl Strategy<Value = Vec<StreamItem>> {
    proptest::collection::vec(
        prop_oneof![
            1 => Just(StreamItem::RoutineEntry),
            12 => (0..alphabet).prop_map(|x| StreamItem::Path(PathId(x))),
        ],
        0..max_len,
    )
}

proptest! {
    #![proptest_config(Config::with_cases(200))]

    /// The k-IPF holds exactly the runs of up to k ids, with their counts.
    #[test]
    fn ipf_counts_equal_brute_force(stream in arb_stream(400, 6), k in 1usize..8) {
        check_against_brute_force(&stream, k)?;
    }

    /// The same with many distinct ids, so wide nodes use the hash index.
    #[test]
    fn ipf_counts_equal_brute_force_wide(stream in arb_stream(3000, 40), k in 1usize..5) {
        check_against_brute_force(&stream, k)?;
    }

    /// Property 2 of the paper: the k-IPF is the (k+1)-IPF cut at depth k.
    #[test]
    fn ipf_is_monotone_in_k(stream in arb_stream(200, 6), k in 1usize..6) {
        let small: HashMap<_, _> = forest(&stream, k).sequences().into_iter().collect();
        let big: HashMap<_, _> = forest(&stream, k + 1)
            .sequences()
            .into_iter()
            .filter(|(s, _)| s.len() <= k)
            .collect();
        prop_assert_eq!(small, big);
    }

    /// End to end: Ball-Larus ids of several invocations of a random CFG,
    /// with a routine-entry marker before each, fed to the k-SF.
    #[test]
    fn ipf_of_ball_larus_streams(g in arb_cfg(12, 14), seeds in proptest::collection::vec(any::<u64>(), 1..6), k in 1usize..6) {
        let bl = BallLarus::number(&g).unwrap();
        let mut stream = Vec::new();
        for seed in seeds {
            stream.push(StreamItem::RoutineEntry);
            let walk = random_walk(&g, seed, 120);
            let mut t = bl.tracer();
            stream.extend(walk.iter().filter_map(|&e| t.step(e)).map(StreamItem::Path));
        }
        check_against_brute_force(&stream, k)?;
        // The first level is the plain Ball-Larus profile.
        let ipf = forest(&stream, k);
        let ids: Vec<PathId> = stream.iter().filter_map(|it| match it { StreamItem::Path(p) => Some(*p), _ => None }).collect();
        for r in ipf.roots() {
            let id = ipf.label(r);
            prop_assert_eq!(ipf.count_of(r), ids.iter().filter(|&&x| x == id).count() as u64);
        }
    }
}

#[test]
fn hottest_runs_are_sorted() {
    let stream: Vec<StreamItem> = [1u64, 2, 1, 2, 1, 2, 3]
        .iter()
        .map(|&x| StreamItem::Path(PathId(x)))
        .collect();
    let ipf = forest(&stream, 3);
    let hot = ipf.hottest(2, 2);
    assert_eq!(
        hot,
        vec![
            (vec![PathId(1), PathId(2)], 3),
            (vec![PathId(2), PathId(1)], 2)
        ]
    );
}

#[test]
fn long_single_invocation_with_large_k() {
    // 10 000 ids from a short repeating pattern with noise; k = 16.
    let mut rng = common::Rng(7);
    let stream: Vec<StreamItem> = (0..10_000)
        .map(|i| StreamItem::Path(PathId(if rng.below(10) == 0 { 9 } else { i % 3 })))
        .collect();
    let ipf = forest(&stream, 16);
    let want = brute_force(&stream, 16);
    let got: HashMap<_, _> = ipf.sequences().into_iter().collect();
    assert_eq!(got, want);
}
