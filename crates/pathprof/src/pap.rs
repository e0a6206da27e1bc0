//! PAP (profiling all paths): cyclic paths of any length in one register, with breakpoints and backwalk.
//!
//! Source: Wang, Li, Zhou, "Profiling all paths", Journal of Software 2012,
//! §1.1 (probes and backwalk), §1.2 (breakpoints), §1.3 (probe counts) and
//! §1.4 (Ball-Larus numbering on reducible acyclic subgraphs, see [`crate::ras`],
//! which finds them).
//!
//! **Encoding (§1.1, Algorithm 1).** `r := 0` at the entry. Every node `n`
//! with fan-in `s > 1` numbers its in-edges `0..s`, and taking in-edge number
//! `i` does `r := r*s + i`. The value at the exit is recorded. Different
//! walks give different values because the backwalk inverts the encoding:
//! from the exit, at each node with fan-in `s > 1` the in-edge is
//! `r mod s` and `r := r div s`; a node with one in-edge has it; the walk
//! back ends at the entry. Loops need no special case, natural or not.
//!
//! **Remainder 0 is never on a back edge (§1.2, Fig. 2(c)).** In-edge number
//! 0 of each node is a forward edge (the first one in insertion order); every
//! back edge gets `i >= 1`, so once a segment has gone round a loop `r >= 1`.
//!
//! **Breakpoints (§1.2).** The register is `word_bits` wide (1..=64, a
//! parameter so tests can force overflow). When `r*s + i` would exceed
//! `2^word_bits - 1`, the walker records a [`Breakpoint`] `(node, r)` — the
//! node just left and the value there — and restarts from the edge's
//! remainder: `r := i`, as if `r` had been 0. The trace of a walk is its
//! breakpoints plus the value at the exit, and it identifies the walk. Each
//! segment is walked back on its own, from its breakpoint's node and value
//! back to the previous breakpoint's node, reached with `r = 0` (or to the
//! entry for the first segment); the segments are concatenated. A revisit of
//! the previous breakpoint's node inside a segment needs a cycle, hence a
//! back edge, hence `r >= 1`, so the first `(node, 0)` met walking back is
//! the segment's start.
//!
//! **Regions (§1.4).** Inside a chosen reducible acyclic region with `n`
//! paths, edges add their Ball-Larus value instead, and entering the region
//! scales the register: `r := r*n` (a breakpoint `(head, r)` with restart 0
//! if that would overflow), so that at the region's tail `r = R*n + r'` with
//! `r'` the region path's id. Walking back, the tail splits `r' = r mod n`,
//! regenerates the region path from `r'`, and continues from the head with
//! `r div n`.
//!
//! **Shapes.** The per-walk cost is O(1) per edge; a trace holds one
//! breakpoint per `word_bits / log2(s)` merges or so; the backwalk costs one
//! division per merge node. Paths are unbounded in length, so they have no
//! global id range: a walk is named by its whole [`PapTrace`].

use crate::cfg::Cfg;
use crate::dag::check_sese;
use crate::dfs::Dfs;
use crate::error::{Error, Result};
use crate::ids::{EdgeId, NodeId, NONE};
use crate::ras::{self, EppRegion, Region};

/// Default PAP register width, bits: a machine word.
pub const DEFAULT_WORD_BITS: u32 = 64;

/// Probes PAP adds besides the in-edge probes: `r := 0` at the entry and
/// `record r` at the exit (PAP paper §1.3, the `+ 2`).
pub const INIT_AND_RECORD_PROBES: usize = 2;

/// How to build a [`Pap`] encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PapConfig {
    /// Register width in bits, 1..=64. Narrow widths force breakpoints.
    pub word_bits: u32,
    /// Number reducible acyclic regions with Ball-Larus when that saves
    /// probes (PAP paper §1.4).
    pub epp_regions: bool,
}

impl Default for PapConfig {
    fn default() -> Self {
        PapConfig {
            word_bits: DEFAULT_WORD_BITS,
            epp_regions: true,
        }
    }
}

/// A point where the register would have overflowed: the walker left `node`
/// with register value `r`, recorded both, and restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Breakpoint {
    /// The node the segment ends at (the next segment starts leaving it).
    pub node: NodeId,
    /// The register's value at `node`.
    pub r: u64,
}

/// What PAP records for one entry-to-exit walk: the breakpoints in order and
/// the register's value at the exit. Equal traces mean equal walks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PapTrace {
    /// Breakpoints, in the order they happened.
    pub breakpoints: Vec<Breakpoint>,
    /// The register at the exit.
    pub last: u64,
}

/// Probe counts (PAP paper §1.3–1.4).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PapStats {
    /// Nodes with fan-in > 1.
    pub merge_nodes: usize,
    /// Plain PAP: the sum of fan-in over merge nodes, plus 2 (init, record).
    pub pap_probes: usize,
    /// After Ball-Larus numbering of the chosen regions.
    pub probes_with_epp: usize,
    /// `pap_probes - probes_with_epp`.
    pub saved: usize,
}

/// What the walker does on one edge: `r := r*s + i`, or a breakpoint at
/// `src` with restart `i` if `r > limit`; then, if `scale != NONE`, the
/// edge enters the head of region `scale`: `r := r*n`, or a breakpoint at
/// the head with restart 0. The forms of PAP all fit: a merge in-edge has
/// `s > 1`; an edge into a fan-in-1 node is `s = 1, i = 0, limit = max`
/// (identity, never breaks); an edge inside a region adds its Ball-Larus
/// value as `s = 1, i = val, limit = max - val` (never breaks, by the
/// region's scaling). One uniform multiply-add keeps the walker branch-light.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Op {
    s: u64,
    i: u64,
    limit: u64,
    src: NodeId,
    scale: u32,
}

/// Scaling on entry to a region: `r := r*n` unless `r > n_limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scale {
    head: NodeId,
    n: u64,
    n_limit: u64,
}

/// A PAP encoding of one CFG. A snapshot: it keeps its own copy of the edge
/// endpoints. Memory: O(nodes + edges).
#[derive(Debug, Clone)]
pub struct Pap {
    word_bits: u32,
    max: u64,
    entry: NodeId,
    exit: NodeId,
    src: Vec<NodeId>,
    dst: Vec<NodeId>,
    ops: Vec<Op>,
    scales: Vec<Scale>,
    /// Per edge: its source is unreachable from the entry, so it is never taken.
    dead: Vec<bool>,
    /// Per node: in-edges by remainder (CSR).
    in_start: Vec<u32>,
    in_edges: Vec<EdgeId>,
    /// Per node: index into `regions` if the node is a region tail.
    tail_of: Vec<u32>,
    /// Per node: internal region out-edges with values, by value (CSR).
    rout_start: Vec<u32>,
    rout: Vec<(EdgeId, u64)>,
    regions: Vec<EppRegion>,
    stats: PapStats,
}

impl Pap {
    /// Builds the PAP encoding of `cfg`. O(nodes + edges) without regions;
    /// see [`ras`] for the region search's cost.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidWordBits`] for a width outside 1..=64;
    /// [`Error::EntryHasPredecessor`], [`Error::ExitHasSuccessor`] or
    /// [`Error::DeadEnd`] if `cfg` is not single-entry, single-exit;
    /// [`Error::WordTooNarrow`] if some fan-in `s` has `s - 1` above the
    /// word's maximum.
    pub fn new(cfg: &Cfg, config: PapConfig) -> Result<Pap> {
        let bits = config.word_bits;
        if !(1..=64).contains(&bits) {
            return Err(Error::InvalidWordBits { bits });
        }
        let max = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let dfs = Dfs::run(cfg);
        check_sese(cfg, &dfs)?;
        let n = cfg.node_count() as usize;
        let reach = &dfs.reachable;

        // In-edges by remainder: the first forward in-edge gets 0.
        let mut in_start = Vec::with_capacity(n + 1);
        let mut in_edges = Vec::new();
        let mut remainder = vec![0u64; cfg.edge_count() as usize];
        let mut fan_in = vec![0u32; n];
        for v in cfg.nodes() {
            in_start.push(in_edges.len() as u32);
            if !reach[v.index()] {
                continue;
            }
            let first = in_edges.len();
            in_edges.extend(
                cfg.preds(v)
                    .iter()
                    .copied()
                    .filter(|&e| reach[cfg.src(e).index()]),
            );
            let ins = &mut in_edges[first..];
            if let Some(k) = ins.iter().position(|&e| !dfs.is_back[e.index()]) {
                ins[..=k].rotate_right(1);
            }
            for (i, &e) in ins.iter().enumerate() {
                remainder[e.index()] = i as u64;
            }
            let s = ins.len() as u64;
            fan_in[v.index()] = s as u32;
            if s > 1 && s - 1 > max {
                return Err(Error::WordTooNarrow {
                    bits,
                    node: v,
                    fan_in: s,
                    remainder: s - 1,
                });
            }
        }
        in_start.push(in_edges.len() as u32);

        let regions: Vec<Region> = if config.epp_regions {
            ras::find(cfg, &dfs, &fan_in, max)
        } else {
            Vec::new()
        };
        let mut head_of = vec![NONE; n];
        let mut tail_of = vec![NONE; n];
        let mut inner_val = vec![None; cfg.edge_count() as usize];
        let mut rout_lists: Vec<Vec<(EdgeId, u64)>> = vec![Vec::new(); n];
        for (k, r) in regions.iter().enumerate() {
            head_of[r.info.head.index()] = k as u32;
            tail_of[r.info.tail.index()] = k as u32;
            for &(e, val) in &r.edges {
                inner_val[e.index()] = Some(val);
                rout_lists[cfg.src(e).index()].push((e, val));
            }
        }
        let mut rout_start = Vec::with_capacity(n + 1);
        let mut rout = Vec::new();
        for list in &rout_lists {
            rout_start.push(rout.len() as u32);
            rout.extend_from_slice(list);
        }
        rout_start.push(rout.len() as u32);

        let identity = |src| Op {
            s: 1,
            i: 0,
            limit: max,
            src,
            scale: NONE,
        };
        let ops: Vec<Op> = cfg
            .edges()
            .map(|e| {
                let (s_node, d) = (cfg.src(e), cfg.dst(e));
                if !reach[s_node.index()] {
                    return identity(s_node);
                }
                if let Some(val) = inner_val[e.index()] {
                    return Op {
                        s: 1,
                        i: val,
                        limit: max - val,
                        src: s_node,
                        scale: NONE,
                    };
                }
                let fi = fan_in[d.index()] as u64;
                let (s, i) = if fi > 1 {
                    (fi, remainder[e.index()])
                } else {
                    (1, 0)
                };
                Op {
                    s,
                    i,
                    limit: (max - i) / s,
                    src: s_node,
                    scale: head_of[d.index()],
                }
            })
            .collect();
        let scales = regions
            .iter()
            .map(|r| {
                let n = r.info.paths;
                Scale {
                    head: r.info.head,
                    n,
                    n_limit: (max - (n - 1)) / n,
                }
            })
            .collect();
        let dead = cfg.edges().map(|e| !reach[cfg.src(e).index()]).collect();

        let merge_nodes = fan_in.iter().filter(|&&s| s > 1).count();
        let pap_probes = fan_in
            .iter()
            .filter(|&&s| s > 1)
            .map(|&s| s as usize)
            .sum::<usize>()
            + INIT_AND_RECORD_PROBES;
        let saved: usize = regions.iter().map(|r| r.info.saved()).sum();
        let stats = PapStats {
            merge_nodes,
            pap_probes,
            probes_with_epp: pap_probes - saved,
            saved,
        };
        Ok(Pap {
            word_bits: bits,
            max,
            entry: cfg.entry(),
            exit: cfg.exit(),
            src: cfg.edges().map(|e| cfg.src(e)).collect(),
            dst: cfg.edges().map(|e| cfg.dst(e)).collect(),
            ops,
            scales,
            dead,
            in_start,
            in_edges,
            tail_of,
            rout_start,
            rout,
            regions: regions.into_iter().map(|r| r.info).collect(),
            stats,
        })
    }

    /// The register width in bits.
    pub fn word_bits(&self) -> u32 {
        self.word_bits
    }

    /// The largest register value, `2^word_bits - 1`.
    pub fn word_max(&self) -> u64 {
        self.max
    }

    /// In-edges of `node` by remainder: taking `in_edges(node)[i]` does
    /// `r := r*s + i` with `s = in_edges(node).len()` (if `s > 1`).
    ///
    /// # Panics
    ///
    /// If `node` was not in the encoded graph.
    pub fn in_edges(&self, node: NodeId) -> &[EdgeId] {
        &self.in_edges
            [self.in_start[node.index()] as usize..self.in_start[node.index() + 1] as usize]
    }

    /// The `(s, i)` of edge `e`'s probe `r := r*s + i`, if it has one (its
    /// destination is a merge node; inside a region, edges add instead).
    ///
    /// # Panics
    ///
    /// If `e` was not in the encoded graph.
    pub fn merge_probe(&self, e: EdgeId) -> Option<(u64, u64)> {
        let op = self.ops[e.index()];
        (op.s > 1).then_some((op.s, op.i))
    }

    /// The regions numbered with Ball-Larus (empty unless
    /// [`PapConfig::epp_regions`]), ordered by head.
    pub fn regions(&self) -> &[EppRegion] {
        &self.regions
    }

    /// Probe counts with and without the regions.
    pub fn stats(&self) -> &PapStats {
        &self.stats
    }

    /// A walker at the routine entry.
    pub fn tracer(&self) -> PapTracer<'_> {
        PapTracer {
            pap: self,
            r: 0,
            trace: PapTrace::default(),
        }
    }

    /// The trace of one entry-to-exit walk. O(walk length).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchEdge`], [`Error::UnreachableEdge`],
    /// [`Error::DiscontinuousWalk`] or [`Error::WalkEndsAwayFromExit`] if
    /// `walk` is not an entry-to-exit walk of the encoded graph.
    pub fn encode_walk(&self, walk: &[EdgeId]) -> Result<PapTrace> {
        let mut at = self.entry;
        for (step, &e) in walk.iter().enumerate() {
            let dead = *self.dead.get(e.index()).ok_or(Error::NoSuchEdge {
                edge: e,
                edge_count: self.ops.len() as u32,
            })?;
            if dead {
                return Err(Error::UnreachableEdge { edge: e });
            }
            let s = self.src[e.index()];
            if s != at {
                return Err(Error::DiscontinuousWalk {
                    step,
                    edge: e,
                    edge_src: s,
                    at,
                });
            }
            at = self.dst[e.index()];
        }
        if at != self.exit {
            return Err(Error::WalkEndsAwayFromExit {
                at,
                exit: self.exit,
            });
        }
        let mut t = self.tracer();
        for &e in walk {
            t.step(e);
        }
        Ok(t.finish())
    }

    /// The walk a trace records, by walking each segment back independently
    /// and concatenating (PAP paper §1.1–1.2). O(walk length) divisions.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptPapTrace`] if no walk of this graph has this trace.
    pub fn backwalk(&self, trace: &PapTrace) -> Result<Vec<EdgeId>> {
        let mut out = Vec::new();
        let mut stop = None;
        for (k, bp) in trace.breakpoints.iter().enumerate() {
            if bp.node.index() >= self.tail_of.len() {
                return Err(Error::CorruptPapTrace {
                    segment: k,
                    reason: "breakpoint node is not in the graph",
                });
            }
            self.backwalk_segment(k, bp.node, bp.r, stop, &mut out)?;
            stop = Some(bp.node);
        }
        self.backwalk_segment(
            trace.breakpoints.len(),
            self.exit,
            trace.last,
            stop,
            &mut out,
        )?;
        Ok(out)
    }

    /// Walks one segment back from `node` with register `r` to `stop` reached
    /// with `r = 0` (or to the entry if `stop` is `None`), appending the
    /// segment's edges to `out` in forward order. Segments are independent,
    /// so distinct `(stop, node, r)` triples can be walked back once and
    /// cached, or in parallel. `segment` only labels errors.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptPapTrace`] if the walk back does not end where it should.
    pub fn backwalk_segment(
        &self,
        segment: usize,
        node: NodeId,
        r: u64,
        stop: Option<NodeId>,
        out: &mut Vec<EdgeId>,
    ) -> Result<()> {
        let corrupt = |reason| Error::CorruptPapTrace { segment, reason };
        let first = out.len();
        let (mut v, mut r) = (node, r);
        let mut region_path = Vec::new();
        loop {
            if stop == Some(v) && r == 0 {
                break;
            }
            if v == self.entry {
                if stop.is_some() {
                    return Err(corrupt(
                        "reached the entry before the previous breakpoint's node",
                    ));
                }
                if r != 0 {
                    return Err(corrupt("non-zero register left at the entry"));
                }
                break;
            }
            let k = self.tail_of[v.index()];
            if k != NONE {
                let reg = &self.regions[k as usize];
                let mut rp = r % reg.paths;
                r /= reg.paths;
                region_path.clear();
                let mut u = reg.head;
                while u != reg.tail {
                    let outs = &self.rout[self.rout_start[u.index()] as usize
                        ..self.rout_start[u.index() + 1] as usize];
                    let j = outs.partition_point(|&(_, val)| val <= rp) - 1;
                    let (e, val) = outs[j];
                    rp -= val;
                    region_path.push(e);
                    u = self.dst[e.index()];
                }
                out.extend(region_path.iter().rev());
                v = reg.head;
                continue;
            }
            let ins = self.in_edges(v);
            let e = match ins.len() {
                0 => return Err(corrupt("walked back to a node with no in-edge")),
                1 => ins[0],
                s => {
                    let i = (r % s as u64) as usize;
                    r /= s as u64;
                    ins[i]
                }
            };
            out.push(e);
            v = self.src[e.index()];
        }
        out[first..].reverse();
        Ok(())
    }
}

/// An online PAP walker: one register, at most one multiply-add per edge.
///
/// Call [`step`](PapTracer::step) on every edge taken and
/// [`finish`](PapTracer::finish) when the walk reaches the exit.
#[derive(Debug, Clone)]
pub struct PapTracer<'a> {
    pap: &'a Pap,
    r: u64,
    trace: PapTrace,
}

impl PapTracer<'_> {
    /// Takes edge `e`, recording a breakpoint if the register would overflow.
    ///
    /// # Panics
    ///
    /// If `e` was not in the encoded graph.
    #[inline]
    pub fn step(&mut self, e: EdgeId) {
        let op = self.pap.ops[e.index()];
        if self.r > op.limit {
            self.break_at(op.src, op.i);
        } else {
            self.r = self.r * op.s + op.i;
        }
        if op.scale != NONE {
            let sc = self.pap.scales[op.scale as usize];
            if self.r > sc.n_limit {
                self.break_at(sc.head, 0);
            } else {
                self.r *= sc.n;
            }
        }
    }

    /// Records a breakpoint `(node, r)` and restarts the register at `restart`.
    #[cold]
    fn break_at(&mut self, node: NodeId, restart: u64) {
        self.trace.breakpoints.push(Breakpoint { node, r: self.r });
        self.r = restart;
    }

    /// The register's current value.
    #[inline]
    pub fn register(&self) -> u64 {
        self.r
    }

    /// Breakpoints recorded so far in this walk.
    pub fn breakpoints(&self) -> &[Breakpoint] {
        &self.trace.breakpoints
    }

    /// Ends the walk at the exit: returns its trace and resets the walker to
    /// the entry for the next invocation.
    pub fn finish(&mut self) -> PapTrace {
        let mut t = std::mem::take(&mut self.trace);
        t.last = self.r;
        self.r = 0;
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(edges: &[u32]) -> Vec<EdgeId> {
        edges.iter().map(|&e| EdgeId(e)).collect()
    }

    #[test]
    fn back_edge_never_gets_remainder_zero() {
        // Edge 0 is the back edge 2 -> 1 and is node 1's first in-edge by
        // insertion order; PAP must still give it remainder 1 (Fig. 2(c)).
        let g =
            Cfg::from_edges(4, NodeId(0), NodeId(3), &[(2, 1), (0, 1), (1, 2), (1, 3)]).unwrap();
        let pap = Pap::new(
            &g,
            PapConfig {
                word_bits: 2,
                epp_regions: false,
            },
        )
        .unwrap();
        assert_eq!(pap.in_edges(NodeId(1)), &[EdgeId(1), EdgeId(0)]);
        assert_eq!(pap.merge_probe(EdgeId(0)), Some((2, 1)));
        // Loop many times with a 2-bit register: breakpoints, and the
        // backwalk still counts every iteration.
        let mut w = vec![EdgeId(1)];
        for _ in 0..50 {
            w.extend(walk(&[2, 0]));
        }
        w.push(EdgeId(3));
        let trace = pap.encode_walk(&w).unwrap();
        assert!(trace.breakpoints.len() >= 10);
        assert_eq!(pap.backwalk(&trace).unwrap(), w);
    }

    #[test]
    fn remainders_follow_the_paper_example_shape() {
        // Node 1 with three in-edges: forward 0 -> 1, back edges 2 -> 1 and 3 -> 1.
        let g = Cfg::from_edges(
            5,
            NodeId(0),
            NodeId(4),
            &[(0, 1), (1, 2), (2, 1), (2, 3), (3, 1), (3, 4)],
        )
        .unwrap();
        let pap = Pap::new(&g, PapConfig::default()).unwrap();
        assert_eq!(pap.merge_probe(EdgeId(0)), Some((3, 0)));
        assert_eq!(pap.merge_probe(EdgeId(2)), Some((3, 1)));
        assert_eq!(pap.merge_probe(EdgeId(4)), Some((3, 2)));
        // 0-1-2-1-2-3-1-2-3-4: r = 0, *3+1 = 1, *3+2 = 5 at the exit.
        let w = walk(&[0, 1, 2, 1, 3, 4, 1, 3, 5]);
        let t = pap.encode_walk(&w).unwrap();
        assert_eq!(
            t,
            PapTrace {
                breakpoints: vec![],
                last: 5
            }
        );
        assert_eq!(pap.backwalk(&t).unwrap(), w);
    }

    #[test]
    fn corrupt_traces_are_errors_not_panics() {
        let g =
            Cfg::from_edges(4, NodeId(0), NodeId(3), &[(0, 1), (1, 2), (2, 1), (1, 3)]).unwrap();
        let pap = Pap::new(
            &g,
            PapConfig {
                word_bits: 3,
                epp_regions: false,
            },
        )
        .unwrap();
        let bad = PapTrace {
            breakpoints: vec![Breakpoint {
                node: NodeId(2),
                r: 1,
            }],
            last: 0,
        };
        assert!(matches!(
            pap.backwalk(&bad),
            Err(Error::CorruptPapTrace { .. })
        ));
    }

    #[test]
    fn word_too_narrow_for_a_fan_in_is_an_error() {
        let g =
            Cfg::from_edges(3, NodeId(0), NodeId(2), &[(0, 1), (0, 1), (0, 1), (1, 2)]).unwrap();
        assert_eq!(
            Pap::new(
                &g,
                PapConfig {
                    word_bits: 1,
                    epp_regions: false
                }
            )
            .unwrap_err(),
            Error::WordTooNarrow {
                bits: 1,
                node: NodeId(1),
                fan_in: 3,
                remainder: 2
            }
        );
        assert!(matches!(
            Pap::new(
                &g,
                PapConfig {
                    word_bits: 65,
                    epp_regions: false
                }
            ),
            Err(Error::InvalidWordBits { bits: 65 })
        ));
    }

    #[test]
    fn regions_reduce_probes_and_keep_the_backwalk_exact() {
        // A loop whose body is three diamonds in a row: 1 is the header.
        let mut edges = vec![(0, 1)];
        for d in 0..3 {
            let a = 1 + 3 * d;
            edges.extend([(a, a + 1), (a, a + 2), (a + 1, a + 3), (a + 2, a + 3)]);
        }
        edges.extend([(10, 1), (10, 11)]);
        let g = Cfg::from_edges(12, NodeId(0), NodeId(11), &edges).unwrap();
        let plain = Pap::new(
            &g,
            PapConfig {
                word_bits: 8,
                epp_regions: false,
            },
        )
        .unwrap();
        let epp = Pap::new(
            &g,
            PapConfig {
                word_bits: 8,
                epp_regions: true,
            },
        )
        .unwrap();
        assert_eq!(plain.stats().saved, 0);
        assert_eq!(epp.regions().len(), 1);
        assert_eq!(epp.stats().saved, 2);
        assert_eq!(epp.stats().probes_with_epp, plain.stats().pap_probes - 2);
        // Go round the loop taking varied branches.
        let mut w = vec![EdgeId(0)];
        for it in 0..40u32 {
            for d in 0..3u32 {
                let left = (it >> d) & 1 == 0;
                let base = 1 + 4 * d;
                w.extend(if left {
                    [EdgeId(base), EdgeId(base + 2)]
                } else {
                    [EdgeId(base + 1), EdgeId(base + 3)]
                });
            }
            w.push(if it == 39 { EdgeId(14) } else { EdgeId(13) });
        }
        for pap in [&plain, &epp] {
            let t = pap.encode_walk(&w).unwrap();
            assert!(!t.breakpoints.is_empty());
            assert_eq!(pap.backwalk(&t).unwrap(), w);
        }
    }
}
