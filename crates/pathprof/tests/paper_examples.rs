//! Worked examples from the sources, reproduced where the text gives the numbers.

use hotpath_pathprof::{
    BallLarus, Breakpoint, Cfg, EdgeId, KSlabForest, NodeId, Pap, PapConfig, PathEnd, PathId,
    PathStart, Ppp, PppHit, StreamItem,
};

fn edges_of(g: &Cfg, nodes: &[u32]) -> Vec<EdgeId> {
    nodes
        .windows(2)
        .map(|w| g.find_edge(NodeId(w[0]), NodeId(w[1])).unwrap())
        .collect()
}

/// PPP paper Fig. 3: the DAG s, a, b, c, d, t with six paths.
/// Nodes: s=0 a=1 b=2 c=3 d=4 t=5; out-edges in the figure's order
/// (s: a, b; a: c, b; c: d, t).
fn ppp_dag() -> Cfg {
    Cfg::from_edges(
        6,
        NodeId(0),
        NodeId(5),
        &[
            (0, 1),
            (0, 2),
            (1, 3),
            (1, 2),
            (2, 3),
            (3, 4),
            (3, 5),
            (4, 5),
        ],
    )
    .unwrap()
}

const S: u32 = 0;
const A: u32 = 1;
const B: u32 = 2;
const C: u32 = 3;
const D: u32 = 4;
const T: u32 = 5;

#[test]
fn ppp_paper_ball_larus_ids_of_fig3() {
    // §2.3: "The Ball-Larus identifiers for the paths sacdt, sact, sbct are
    // 0, 1 and 5", and sbcdt has Ball-Larus id 4; 6 paths in all.
    let g = ppp_dag();
    let bl = BallLarus::number(&g).unwrap();
    assert_eq!(bl.num_paths(), 6);
    let id = |p: &[u32]| bl.encode_walk(&edges_of(&g, p)).unwrap()[0];
    assert_eq!(id(&[S, A, C, D, T]), PathId(0));
    assert_eq!(id(&[S, A, C, T]), PathId(1));
    assert_eq!(id(&[S, B, C, T]), PathId(5));
    assert_eq!(id(&[S, B, C, D, T]), PathId(4));
    // §4.2's pathEncoder on the same model also yields 4 for sbcdt.
}

#[test]
fn ppp_paper_three_interesting_paths_numbered_0_1_2() {
    let g = ppp_dag();
    let bl = BallLarus::number(&g).unwrap();
    let id = |p: &[u32]| bl.encode_walk(&edges_of(&g, p)).unwrap()[0];
    let interesting = [id(&[S, A, C, D, T]), id(&[S, A, C, T]), id(&[S, B, C, T])];
    let ppp = Ppp::new(&bl, &interesting).unwrap();
    // §3.2: identifiers 0, 1 and 2 for sacdt, sact and sbct.
    assert_eq!(
        ppp.interesting()
            .iter()
            .map(|&(_, p)| p)
            .collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(ppp.compactness(), 1.0);
    // §3.2 weights: W(d,t) = 0, W(c,d) = 0, W(c,t) = 1, W(b,c) = -1,
    // W(a,c) = 0, W(s,a) = 0, W(s,b) = 2; (a,b) carries no interesting path.
    let w = |a: u32, b: u32| {
        ppp.edge_weight(g.find_edge(NodeId(a), NodeId(b)).unwrap())
            .unwrap()
            .0
    };
    assert_eq!(
        [
            w(D, T),
            w(C, D),
            w(C, T),
            w(B, C),
            w(A, C),
            w(S, A),
            w(S, B),
            w(A, B)
        ],
        [0, 0, 1, -1, 0, 0, 2, 0]
    );
    // §2.3: sabct and sbcdt alias with sacdt and sact; the Ball-Larus
    // counter tells them apart.
    assert_eq!(ppp.ppp_id_of_path(&bl, id(&[S, A, B, C, T])).unwrap(), 0);
    assert_eq!(ppp.ppp_id_of_path(&bl, id(&[S, B, C, D, T])).unwrap(), 1);
    let mut profile = ppp.profile();
    let mut tracer = ppp.tracer(&bl);
    let mut run = |path: &[u32]| {
        tracer.enter();
        let (p, b) = edges_of(&g, path)
            .into_iter()
            .filter_map(|e| tracer.step(e))
            .last()
            .unwrap();
        profile.record(p, b)
    };
    assert_eq!(run(&[S, B, C, D, T]), PppHit::Uninteresting);
    assert_eq!(run(&[S, A, C, T]), PppHit::Interesting { slot: 1 });
    assert_eq!(run(&[S, A, B, C, T]), PppHit::Uninteresting);
    assert_eq!(run(&[S, B, C, T]), PppHit::Interesting { slot: 2 });
    assert_eq!(profile.counts(), &[0, 1, 1]);
    assert_eq!(profile.residual().count(), 2);
}

#[test]
fn lecture_four_paths_and_their_probes() {
    // Slides 14-17: P0..P3 through 1 -> {2,3} -> 4 -> {5,6} -> 7 get 0..3
    // with "r=0, r+=1, r=2, count[r]++".
    let g = Cfg::from_edges(
        8,
        NodeId(1),
        NodeId(7),
        &[
            (1, 2),
            (1, 3),
            (2, 4),
            (3, 4),
            (4, 5),
            (4, 6),
            (5, 7),
            (6, 7),
        ],
    )
    .unwrap();
    let bl = BallLarus::number(&g).unwrap();
    for (want, path) in [
        [1, 2, 4, 5, 7],
        [1, 2, 4, 6, 7],
        [1, 3, 4, 5, 7],
        [1, 3, 4, 6, 7],
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(
            bl.encode_walk(&edges_of(&g, path)).unwrap(),
            vec![PathId(want as u64)]
        );
    }
    let adds: Vec<u64> = bl.probes().iter().map(|p| p.add).collect();
    assert_eq!(adds, vec![0, 2, 0, 0, 0, 1, 0, 0]);
}

#[test]
fn lecture_six_path_graph_num_paths_and_regeneration() {
    // Slides 19-30: A..F with NumPaths F=1, E=1, D=2, C=2, B=4, A=6; slide
    // 50's increments r += 4, r += 2, r += 1 on A->C, B->D, D->F.
    let (a, b, c, d, e, f) = (0, 1, 2, 3, 4, 5);
    let g = Cfg::from_edges(
        6,
        NodeId(a),
        NodeId(f),
        &[
            (a, b),
            (a, c),
            (b, c),
            (b, d),
            (c, d),
            (d, e),
            (d, f),
            (e, f),
        ],
    )
    .unwrap();
    let bl = BallLarus::number(&g).unwrap();
    let np: Vec<u64> = (0..6).map(|n| bl.num_paths_from(NodeId(n))).collect();
    assert_eq!(np, vec![6, 4, 2, 2, 1, 1]);
    let add = |s: u32, t: u32| bl.probe(g.find_edge(NodeId(s), NodeId(t)).unwrap()).add;
    assert_eq!((add(a, c), add(b, d), add(d, f)), (4, 2, 1));
    // Slide 55, "generate path for 5" and "for 3": largest Val <= r at each node.
    assert_eq!(
        bl.regenerate(PathId(5)).unwrap().blocks,
        [a, c, d, f].map(NodeId)
    );
    assert_eq!(
        bl.regenerate(PathId(3)).unwrap().blocks,
        [a, b, d, f].map(NodeId)
    );
}

#[test]
fn lecture_four_kinds_of_paths_with_loops() {
    // Slide 57: with back edge v->w, paths are entry->exit, entry->v (ending
    // with v->w), w->v (around again) and w->exit. Loop 1 -> 2 -> 1.
    let g = Cfg::from_edges(4, NodeId(0), NodeId(3), &[(0, 1), (1, 2), (2, 1), (2, 3)]).unwrap();
    let bl = BallLarus::number(&g).unwrap();
    assert_eq!(bl.num_paths(), 4);
    let kinds: Vec<(PathStart, PathEnd)> = (0..4)
        .map(|i| bl.regenerate(PathId(i)).unwrap())
        .map(|p| (p.start, p.end))
        .collect();
    let back = EdgeId(2);
    for kind in [
        (PathStart::Entry, PathEnd::Exit),
        (PathStart::Entry, PathEnd::BackEdge(back)),
        (PathStart::AfterBackEdge(back), PathEnd::BackEdge(back)),
        (PathStart::AfterBackEdge(back), PathEnd::Exit),
    ] {
        assert!(kinds.contains(&kind), "missing {kind:?}");
    }
}

#[test]
fn pap_paper_fig2a_remainders_at_a_three_way_merge() {
    // §1.1, Fig. 2(a): node B has in-edges AB, CB and GB, GB a back edge; the
    // remainders 0, 1, 2 name CB, GB, AB. Inserting B's in-edges in that
    // order gives that numbering: CB is forward, so it may take 0.
    // Nodes: entry=0, A=1, B=2, C=3, G=4, H=5 (exit).
    let g = Cfg::from_edges(
        6,
        NodeId(0),
        NodeId(5),
        &[(0, 1), (1, 3), (3, 2), (4, 2), (1, 2), (2, 4), (4, 5)],
    )
    .unwrap();
    let pap = Pap::new(
        &g,
        PapConfig {
            word_bits: 64,
            epp_regions: false,
        },
    )
    .unwrap();
    let cb = g.find_edge(NodeId(3), NodeId(2)).unwrap();
    let gb = g.find_edge(NodeId(4), NodeId(2)).unwrap();
    let ab = g.find_edge(NodeId(1), NodeId(2)).unwrap();
    assert!(g.back_edges().contains(&gb));
    assert_eq!(pap.in_edges(NodeId(2)), &[cb, gb, ab]);
    assert_eq!(
        [
            pap.merge_probe(cb),
            pap.merge_probe(gb),
            pap.merge_probe(ab)
        ],
        [Some((3, 0)), Some((3, 1)), Some((3, 2))]
    );
}

#[test]
fn pap_paper_breakpoint_records_the_previous_node_and_resets_to_the_remainder() {
    // §1.2: running up to G without overflow, then taking GB overflows at B:
    // (G, r at G) is recorded and r at B restarts at 1, GB's remainder.
    // Loop: entry=0 -> A=1 -> B=2 -> G=3 -> B (back) | G -> exit=4.
    let g = Cfg::from_edges(
        5,
        NodeId(0),
        NodeId(4),
        &[(0, 1), (1, 2), (2, 3), (3, 2), (3, 4)],
    )
    .unwrap();
    let pap = Pap::new(
        &g,
        PapConfig {
            word_bits: 3,
            epp_regions: false,
        },
    )
    .unwrap();
    let gb = g.find_edge(NodeId(3), NodeId(2)).unwrap();
    assert_eq!(pap.merge_probe(gb), Some((2, 1)));
    let mut t = pap.tracer();
    let walk = edges_of(&g, &[0, 1, 2, 3, 2, 3, 2, 3]);
    // r: 0 -> AB: 0 -> GB: 1 -> GB: 3 -> GB: 7 (the 3-bit maximum).
    for &e in &walk {
        t.step(e);
    }
    assert_eq!(t.register(), 3);
    t.step(gb); // 3*2 + 1 = 7 fits
    assert_eq!(t.register(), 7);
    let bg = g.find_edge(NodeId(2), NodeId(3)).unwrap();
    t.step(bg);
    t.step(gb); // 7*2 + 1 = 15 overflows
    assert_eq!(
        t.breakpoints(),
        &[Breakpoint {
            node: NodeId(3),
            r: 7
        }]
    );
    assert_eq!(t.register(), 1);
    t.step(bg);
    t.step(g.find_edge(NodeId(3), NodeId(4)).unwrap());
    let trace = t.finish();
    let mut full = walk.clone();
    full.extend([gb, bg, gb, bg, EdgeId(4)]);
    assert_eq!(pap.backwalk(&trace).unwrap(), full);
}

#[test]
fn pap_paper_probe_counts_on_a_dag() {
    // §1.3: N_PAP = sum of fan-in over merge nodes + 2, at most 2 N_EPP + 2.
    // On the lecture's six-path graph: merges C (2), D (2), F (2): 8 probes;
    // Ball-Larus needs 3 increments.
    let g = Cfg::from_edges(
        6,
        NodeId(0),
        NodeId(5),
        &[
            (0, 1),
            (0, 2),
            (1, 2),
            (1, 3),
            (2, 3),
            (3, 4),
            (3, 5),
            (4, 5),
        ],
    )
    .unwrap();
    let pap = Pap::new(
        &g,
        PapConfig {
            word_bits: 64,
            epp_regions: false,
        },
    )
    .unwrap();
    let bl = BallLarus::number(&g).unwrap();
    assert_eq!(pap.stats().pap_probes, 8);
    assert_eq!(bl.increment_edge_count(), 3);
    assert!(pap.stats().pap_probes <= 2 * bl.increment_edge_count() + 2);
}

#[test]
fn pap_paper_region_with_three_merge_nodes_saves_probes() {
    // §1.4: a reducible acyclic subgraph with at least 3 merge nodes is worth
    // reducing; in Fig. 3, 8 PAP probes become 5 EPP probes plus 1, saving 2.
    // Here: a loop body of three diamonds and one three-way split, merges of
    // fan-in 2, 2, 2 and 3: PAP 9 probes, Ball-Larus 5 + 1, saving 3.
    let mut edges = vec![(0, 1)];
    for dmd in 0..3 {
        let a = 1 + 3 * dmd;
        edges.extend([(a, a + 1), (a, a + 2), (a + 1, a + 3), (a + 2, a + 3)]);
    }
    edges.extend([(10, 11), (10, 11), (10, 11), (11, 1), (11, 12)]);
    let g = Cfg::from_edges(13, NodeId(0), NodeId(12), &edges).unwrap();
    let pap = Pap::new(&g, PapConfig::default()).unwrap();
    assert_eq!(pap.regions().len(), 1);
    let r = &pap.regions()[0];
    assert_eq!((r.head, r.tail), (NodeId(1), NodeId(11)));
    assert_eq!(r.paths, 24);
    assert_eq!((r.pap_probes, r.epp_probes, r.saved()), (9, 5, 3));
    assert_eq!(pap.stats().saved, 3);
}

#[test]
fn kblpp_one_ipf_is_the_ball_larus_profile() {
    // §2.2: "a 1-IPF includes only acyclic paths and yields exactly the same
    // counters as a Ball-Larus profiler"; deeper levels count concatenations.
    let g = Cfg::from_edges(
        6,
        NodeId(0),
        NodeId(5),
        &[(0, 1), (1, 2), (1, 3), (2, 4), (3, 4), (4, 1), (4, 5)],
    )
    .unwrap();
    let bl = BallLarus::number(&g).unwrap();
    // Five iterations through 2, 2, 3, 2, 2, then out: five Ball-Larus
    // paths, of which the second and fourth are the same.
    let walk = edges_of(&g, &[0, 1, 2, 4, 1, 2, 4, 1, 3, 4, 1, 2, 4, 1, 2, 4, 5]);
    let ids = bl.encode_walk(&walk).unwrap();
    assert_eq!(ids.len(), 5);
    assert_eq!(ids[1], ids[3]);
    let mut sf1 = KSlabForest::new(1).unwrap();
    let mut sf4 = KSlabForest::new(4).unwrap();
    for &id in &ids {
        sf1.process(StreamItem::Path(id));
        sf4.process(StreamItem::Path(id));
    }
    let (ipf1, ipf4) = (sf1.to_ipf(), sf4.to_ipf());
    for &id in &ids {
        let n = ids.iter().filter(|&&x| x == id).count() as u64;
        assert_eq!(ipf1.count(&[id]), n);
        assert_eq!(ipf4.count(&[id]), n);
    }
    assert_eq!(ipf4.count(&ids[1..2]), 2);
    assert_eq!(ipf4.count(&ids[1..3]), 1);
    assert_eq!(ipf4.count(&ids[0..4]), 1);
    assert_eq!(ipf4.count(&ids[0..5]), 0, "longer than k");
}
