//! Throughput of the online parts: Ball-Larus and PAP encoding per edge, k-slab forest updates per item.
//!
//! Workload: a 64-block routine full of loops (irreducible ones included),
//! and random walks through it of at least `WALK_EDGES` edges. The main walk
//! is *biased* like real branches: each block has a preferred successor
//! taken with probability `1 - 1/BIAS_ODDS`. A second, *uniform* walk picks
//! successors uniformly: its Ball-Larus stream has thousands of distinct
//! successors per path and stresses the k-SF's wide nodes. The k-SF input
//! is the Ball-Larus id stream of a walk. Criterion reports `elem/s`
//! (edges/s, or items/s for the k-SF); a summary of medians in edges/s and
//! items/s is printed at the end.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use hotpath_pathprof::{BallLarus, Cfg, EdgeId, KSlabForest, NodeId, Pap, PapConfig, PathId};

/// Edges in the benchmark walk (the issue asks for at least 10^7).
const WALK_EDGES: usize = 10_000_000;
/// Blocks in the benchmark routine.
const BLOCKS: u32 = 64;
/// Extra random edges (forward and backward) on top of the spine.
const EXTRA_EDGES: u32 = 48;
/// Blocks in the large routine used to time renumbering.
const LARGE_BLOCKS: u32 = 4096;
/// A biased walk leaves the preferred successor once in this many steps.
const BIAS_ODDS: u64 = 8;
/// Timed repetitions for the printed medians.
const SUMMARY_RUNS: usize = 7;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// A routine: entry 0, exit `BLOCKS - 1`, a spine `i -> i + 1`, an outer
/// loop back from the last block to block 1, and random extra edges (never
/// into the entry or out of the exit).
fn routine() -> Cfg {
    let mut rng = Rng(0x5eed);
    let exit = BLOCKS - 1;
    let mut g = Cfg::new(BLOCKS, NodeId(0), NodeId(exit)).unwrap();
    for i in 0..exit {
        g.add_edge(NodeId(i), NodeId(i + 1)).unwrap();
    }
    g.add_edge(NodeId(exit - 1), NodeId(1)).unwrap();
    for _ in 0..EXTRA_EDGES {
        let a = rng.below(exit as u64) as u32;
        let b = 1 + rng.below(exit as u64) as u32;
        g.add_edge(NodeId(a), NodeId(b)).unwrap();
    }
    g
}

/// A large routine: a chain of `LARGE_BLOCKS` blocks with a small loop every
/// 8 blocks and a forward branch every 128 (few enough that the number of
/// acyclic paths fits in a `u64`).
fn large_routine() -> Cfg {
    let exit = LARGE_BLOCKS - 1;
    let mut g = Cfg::new(LARGE_BLOCKS, NodeId(0), NodeId(exit)).unwrap();
    for i in 0..exit {
        g.add_edge(NodeId(i), NodeId(i + 1)).unwrap();
        if i % 8 == 7 {
            g.add_edge(NodeId(i), NodeId(i - 4)).unwrap();
        }
        if i % 128 == 5 && i + 3 < exit {
            g.add_edge(NodeId(i), NodeId(i + 3)).unwrap();
        }
    }
    g
}

/// A random walk of at least `WALK_EDGES` edges that avoids the exit until
/// then, and then takes the shortest way out; `biased` as in the module doc.
fn walk(g: &Cfg, biased: bool) -> Vec<EdgeId> {
    let mut dist = vec![u32::MAX; g.node_count() as usize];
    let mut queue = std::collections::VecDeque::from([g.exit()]);
    dist[g.exit().index()] = 0;
    while let Some(v) = queue.pop_front() {
        for &e in g.preds(v) {
            if dist[g.src(e).index()] == u32::MAX {
                dist[g.src(e).index()] = dist[v.index()] + 1;
                queue.push_back(g.src(e));
            }
        }
    }
    let mut rng = Rng(42);
    let mut w = Vec::with_capacity(WALK_EDGES + 64);
    let mut at = g.entry();
    while at != g.exit() {
        let succs = g.succs(at);
        let e = if w.len() < WALK_EDGES {
            let stay: Vec<EdgeId> = succs
                .iter()
                .copied()
                .filter(|&e| g.dst(e) != g.exit())
                .collect();
            let pool = if stay.is_empty() { succs } else { &stay[..] };
            let preferred = (at.0 as usize).wrapping_mul(2_654_435_761) % pool.len();
            if biased && rng.below(BIAS_ODDS) != 0 {
                pool[preferred]
            } else {
                pool[rng.below(pool.len() as u64) as usize]
            }
        } else {
            *succs
                .iter()
                .min_by_key(|&&e| dist[g.dst(e).index()])
                .unwrap()
        };
        w.push(e);
        at = g.dst(e);
    }
    w
}

fn bl_encode(bl: &BallLarus, walk: &[EdgeId]) -> u64 {
    let mut t = bl.tracer();
    let mut sum = 0u64;
    for &e in walk {
        if let Some(PathId(id)) = t.step(e) {
            sum = sum.wrapping_add(id);
        }
    }
    sum
}

fn pap_encode(pap: &Pap, walk: &[EdgeId]) -> usize {
    let mut t = pap.tracer();
    for &e in walk {
        t.step(e);
    }
    t.finish().breakpoints.len()
}

fn kslab(k: usize, ids: &[PathId]) -> usize {
    let mut f = KSlabForest::new(k).unwrap();
    for &id in ids {
        f.push(id);
    }
    f.node_count()
}

struct Workload {
    walk: Vec<EdgeId>,
    bl: BallLarus,
    pap64: Pap,
    pap16: Pap,
    ids: Vec<PathId>,
    uniform_walk: Vec<EdgeId>,
    uniform_ids: Vec<PathId>,
}

fn workload() -> Workload {
    let g = routine();
    let walk = walk(&g, true);
    let bl = BallLarus::number(&g).unwrap();
    let pap64 = Pap::new(
        &g,
        PapConfig {
            word_bits: 64,
            epp_regions: true,
        },
    )
    .unwrap();
    let pap16 = Pap::new(
        &g,
        PapConfig {
            word_bits: 16,
            epp_regions: true,
        },
    )
    .unwrap();
    let ids = bl.encode_walk(&walk).unwrap();
    let uniform_walk = self::walk(&g, false);
    let uniform_ids = bl.encode_walk(&uniform_walk).unwrap();
    Workload {
        walk,
        bl,
        pap64,
        pap16,
        ids,
        uniform_walk,
        uniform_ids,
    }
}

fn benches(c: &mut Criterion, w: &Workload) {
    let edges = w.walk.len() as u64;
    let mut g = c.benchmark_group("encode");
    g.throughput(Throughput::Elements(edges));
    g.bench_function("ball_larus", |b| {
        b.iter(|| bl_encode(&w.bl, black_box(&w.walk)))
    });
    g.bench_function("pap_64bit", |b| {
        b.iter(|| pap_encode(&w.pap64, black_box(&w.walk)))
    });
    g.bench_function("pap_16bit", |b| {
        b.iter(|| pap_encode(&w.pap16, black_box(&w.walk)))
    });
    g.finish();
    let mut g = c.benchmark_group("kslab");
    g.throughput(Throughput::Elements(w.ids.len() as u64));
    for k in [2usize, 8] {
        g.bench_function(format!("k{k}"), |b| b.iter(|| kslab(k, black_box(&w.ids))));
    }
    g.finish();
    let large = large_routine();
    let weights: Vec<u64> = (0..large.edge_count() as u64).map(|e| e % 97).collect();
    let mut g = c.benchmark_group("renumber");
    let mut bl = BallLarus::number(&large).unwrap();
    g.throughput(Throughput::Elements(large.edge_count() as u64));
    g.bench_function("large_plain", |b| {
        b.iter(|| bl.renumber(black_box(&large), None).unwrap())
    });
    g.bench_function("large_weighted", |b| {
        b.iter(|| bl.renumber(black_box(&large), Some(&weights)).unwrap())
    });
    g.finish();
    let mut g = c.benchmark_group("kslab_uniform");
    g.throughput(Throughput::Elements(w.uniform_ids.len() as u64));
    g.bench_function("k8", |b| b.iter(|| kslab(8, black_box(&w.uniform_ids))));
    g.finish();
}

fn median_rate(items: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<Duration> = (0..SUMMARY_RUNS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    items as f64 / times[SUMMARY_RUNS / 2].as_secs_f64()
}

fn summary(w: &Workload) {
    let n = w.walk.len();
    let distinct = |ids: &[PathId]| ids.iter().collect::<std::collections::HashSet<_>>().len();
    println!(
        "\nsummary: biased walk of {n} edges over a {BLOCKS}-block routine with {} Ball-Larus paths; \
         its stream has {} paths, {} distinct (uniform walk: {} edges, {} paths, {} distinct)",
        w.bl.num_paths(),
        w.ids.len(),
        distinct(&w.ids),
        w.uniform_walk.len(),
        w.uniform_ids.len(),
        distinct(&w.uniform_ids),
    );
    println!(
        "  PAP breakpoints: {} with a 64-bit register, {} with 16 bits; EPP regions: {}",
        pap_encode(&w.pap64, &w.walk),
        pap_encode(&w.pap16, &w.walk),
        w.pap64.regions().len()
    );
    let rate = median_rate(n, || {
        black_box(bl_encode(&w.bl, &w.walk));
    });
    println!(
        "  Ball-Larus encoding:        {:>8.1} M edges/s (median of {SUMMARY_RUNS})",
        rate / 1e6
    );
    let rate = median_rate(n, || {
        black_box(pap_encode(&w.pap64, &w.walk));
    });
    println!(
        "  PAP encoding, 64-bit word:  {:>8.1} M edges/s",
        rate / 1e6
    );
    let rate = median_rate(n, || {
        black_box(pap_encode(&w.pap16, &w.walk));
    });
    println!(
        "  PAP encoding, 16-bit word:  {:>8.1} M edges/s",
        rate / 1e6
    );
    for k in [2usize, 8] {
        let rate = median_rate(w.ids.len(), || {
            black_box(kslab(k, &w.ids));
        });
        println!(
            "  k-slab forest, k = {k}:      {:>8.1} M items/s ({} nodes)",
            rate / 1e6,
            kslab(k, &w.ids)
        );
    }
    let large = large_routine();
    let mut bl = BallLarus::number(&large).unwrap();
    let rate = median_rate(1, || bl.renumber(&large, None).unwrap());
    println!(
        "  renumbering a {LARGE_BLOCKS}-block, {}-edge routine ({} paths): {:.0} us",
        large.edge_count(),
        bl.num_paths(),
        1e6 / rate
    );
    let rate = median_rate(w.uniform_ids.len(), || {
        black_box(kslab(8, &w.uniform_ids));
    });
    println!(
        "  k-slab forest, k = 8, uniform stream: {:>5.1} M items/s ({} nodes)",
        rate / 1e6,
        kslab(8, &w.uniform_ids)
    );
}

fn main() {
    let w = workload();
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    benches(&mut c, &w);
    c.final_summary();
    summary(&w);
}

// `criterion_group!` is not used: the workload is built once and shared.
#[allow(unused_imports)]
use criterion_group as _;
