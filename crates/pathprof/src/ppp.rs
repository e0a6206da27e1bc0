//! PPP (preferential path profiling): compact ids for a chosen set of interesting paths, plus a Ball-Larus counter to resolve aliases.
//!
//! Source: Vaswani, Nori, Chilimbi, "Preferential path profiling: compactly
//! numbering interesting paths", POPL 2007: §2.3 (the example and the second
//! counter), §3 (Problem A, compactness), §3.1 (`computePPPIncrements`,
//! Fig. 10), §3.2 (the worked example) and §5 (implementation: paths and
//! prefixes named by Ball-Larus ids and partial sums; both counters updated
//! on the same edges).
//!
//! **Numbering.** Nodes of the Ball-Larus DAG are processed in reverse
//! topological order, keeping a partial id `pid(p)` per interesting path
//! (the sum of weights on its suffix). At node `v`, the interesting paths
//! through an out-edge `e` are grouped by their prefix `q` up to `v`; each
//! group's partial ids form an interval starting at `min(e, q)`. With
//! `cis(q)` the cumulative interval size already used by prefix `q` on
//! earlier out-edges of `v`, the edge gets the smallest weight that keeps
//! every group's interval clear of the earlier ones,
//! `W(e) = max over q of (cis(q) - min(e, q))` (the *join*), the partial ids
//! through `e` grow by `W(e)`, and `cis(q) = max pid + 1`. Edges no
//! interesting path uses get weight 0. Interesting paths end up with
//! distinct ids, the first at 0. Cost: O(|E| · |I|) plus the paths' lengths.
//!
//! **Compactness** (§3, Problem A): `(max id - min id + 1) / |I|`, 1 when
//! the interesting paths are numbered `0..|I|` exactly. Not always reachable
//! (Lemma 3), and PPP is not always optimal (§3.3), but it is on the
//! paper's example.
//!
//! **Aliases.** An uninteresting path can get an interesting path's id (or
//! one outside the range, even negative). So the profiler also runs the
//! Ball-Larus register, and stores the Ball-Larus id of each interesting
//! path beside its counter: a hit counts only if both agree ([`PppProfile`]).
//!
//! **Instrumentation.** PPP weights are placed on the chords of the same
//! spanning tree as the [`BallLarus`] numbering they come from, so the
//! two registers change on the same edges (§5).

use crate::ball_larus::{BallLarus, EdgeProbe};
use crate::error::{Error, Result};
use crate::hash::FastMap;
use crate::ids::{EdgeId, PathId, NONE};
use crate::spanning::Scratch;

/// A PPP numbering of a set of interesting Ball-Larus paths.
#[derive(Debug, Clone)]
pub struct Ppp {
    /// `W(e)` per DAG edge of the Ball-Larus numbering.
    weights: Vec<i64>,
    of_cfg: Vec<u32>,
    entry_dummy: Vec<u32>,
    start: u64,
    probes: Vec<EdgeProbe>,
    /// Interesting paths in the order given, with their PPP ids.
    interesting: Vec<(PathId, i64)>,
    /// Ball-Larus id -> index into `interesting`.
    index: FastMap<PathId, usize>,
    min: i64,
    max: i64,
}

impl Ppp {
    /// Numbers the interesting paths, named by their ids under `bl`.
    ///
    /// # Errors
    ///
    /// [`Error::NoInterestingPaths`] for an empty set;
    /// [`Error::PathIdOutOfRange`] for an id `>= bl.num_paths()`;
    /// [`Error::DuplicateInterestingPath`] for an id listed twice;
    /// [`Error::PppOverflow`] if the weights leave the `i64` range.
    pub fn new(bl: &BallLarus, interesting: &[PathId]) -> Result<Ppp> {
        if interesting.is_empty() {
            return Err(Error::NoInterestingPaths);
        }
        let dag = &bl.dag;
        let mut index: FastMap<PathId, usize> = FastMap::default();
        // through[d]: (interesting path, Ball-Larus partial sum of its prefix at src(d)).
        let mut through: Vec<Vec<(u32, u64)>> = vec![Vec::new(); dag.src.len()];
        let mut edges = Vec::new();
        for (p, &id) in interesting.iter().enumerate() {
            if id.0 >= bl.num_paths() {
                return Err(Error::PathIdOutOfRange {
                    id,
                    num_paths: bl.num_paths(),
                });
            }
            if index.insert(id, p).is_some() {
                return Err(Error::DuplicateInterestingPath { id });
            }
            edges.clear();
            dag.regenerate_into(id.0, &mut edges);
            let mut prefix = 0u64;
            for &d in &edges {
                through[d as usize].push((p as u32, prefix));
                prefix += dag.val[d as usize];
            }
        }

        let mut weights = vec![0i64; dag.src.len()];
        let mut pid = vec![0i64; interesting.len()];
        let mut cis: FastMap<u64, i64> = FastMap::default();
        let mut group: FastMap<u64, (i64, i64)> = FastMap::default();
        for &v in dag.topo.iter().rev() {
            cis.clear();
            for d in dag.out_range(v) {
                let paths = &through[d];
                if paths.is_empty() {
                    continue;
                }
                group.clear();
                for &(p, q) in paths {
                    let x = pid[p as usize];
                    group
                        .entry(q)
                        .and_modify(|m| m.0 = m.0.min(x))
                        .or_insert((x, x));
                }
                let overflow = Error::PppOverflow { node: v };
                let mut w = i64::MIN;
                for (q, &(lo, _)) in &group {
                    let want = cis
                        .get(q)
                        .copied()
                        .unwrap_or(0)
                        .checked_sub(lo)
                        .ok_or(overflow.clone())?;
                    w = w.max(want);
                }
                weights[d] = w;
                for g in group.values_mut() {
                    g.1 = i64::MIN;
                }
                for &(p, q) in paths {
                    let x = pid[p as usize].checked_add(w).ok_or(overflow.clone())?;
                    pid[p as usize] = x;
                    let g = group.get_mut(&q).expect("grouped above");
                    g.1 = g.1.max(x);
                }
                for (&q, &(_, hi)) in &group {
                    cis.insert(q, hi.checked_add(1).ok_or(overflow.clone())?);
                }
            }
        }
        let min = *pid.iter().min().expect("non-empty");
        let max = *pid.iter().max().expect("non-empty");

        let as_u64: Vec<u64> = weights.iter().map(|&w| w as u64).collect();
        let mut inc = Vec::new();
        let start = bl
            .tree
            .increments(dag, &as_u64, &mut inc, &mut Scratch::default());
        let mut probes = Vec::new();
        bl.probes_into(&inc, start, &mut probes);
        Ok(Ppp {
            weights,
            of_cfg: dag.of_cfg.clone(),
            entry_dummy: dag.entry_dummy.clone(),
            start,
            probes,
            interesting: interesting.iter().copied().zip(pid).collect(),
            index,
            min,
            max,
        })
    }

    /// The interesting paths, as given, with their PPP ids.
    pub fn interesting(&self) -> &[(PathId, i64)] {
        &self.interesting
    }

    /// The PPP id of interesting path `bl_id`, if it is one. O(1).
    pub fn id_of(&self, bl_id: PathId) -> Option<i64> {
        self.index.get(&bl_id).map(|&i| self.interesting[i].1)
    }

    /// Smallest and largest PPP id of the interesting paths.
    pub fn id_range(&self) -> (i64, i64) {
        (self.min, self.max)
    }

    /// Compactness `(max - min + 1) / |I|` (PPP paper §3): 1.0 is perfect.
    pub fn compactness(&self) -> f64 {
        (self.max - self.min + 1) as f64 / self.interesting.len() as f64
    }

    /// The PPP weight `W(e)` of a forward edge; for a back edge, the weights
    /// of its `(entry -> head, tail -> exit)` dummies. `None` if unreachable.
    ///
    /// # Panics
    ///
    /// If `e` was not in the numbered graph.
    pub fn edge_weight(&self, e: EdgeId) -> Option<(i64, Option<i64>)> {
        let d = self.of_cfg[e.index()];
        if d == NONE {
            return None;
        }
        let dummy = self.entry_dummy[e.index()];
        Some(if dummy == NONE {
            (self.weights[d as usize], None)
        } else {
            (self.weights[dummy as usize], Some(self.weights[d as usize]))
        })
    }

    /// The PPP id any path gets (interesting or not): the sum of its
    /// weights. Uninteresting paths may alias interesting ones.
    ///
    /// # Errors
    ///
    /// [`Error::PathIdOutOfRange`] if `bl_id >= bl.num_paths()`.
    pub fn ppp_id_of_path(&self, bl: &BallLarus, bl_id: PathId) -> Result<i64> {
        if bl_id.0 >= bl.num_paths() {
            return Err(Error::PathIdOutOfRange {
                id: bl_id,
                num_paths: bl.num_paths(),
            });
        }
        let mut edges = Vec::new();
        bl.dag.regenerate_into(bl_id.0, &mut edges);
        Ok(edges
            .iter()
            .fold(0i64, |acc, &d| acc.wrapping_add(self.weights[d as usize])))
    }

    /// Probes of the PPP register, per CFG edge (same meaning as
    /// [`BallLarus::probes`]; ids are `i64` read from the `u64` register).
    pub fn probes(&self) -> &[EdgeProbe] {
        &self.probes
    }

    /// The PPP register's value on routine entry.
    pub fn start_value(&self) -> u64 {
        self.start
    }

    /// A walker running both registers: `bl` must be the numbering this
    /// PPP was built from.
    pub fn tracer<'a>(&'a self, bl: &'a BallLarus) -> PppTracer<'a> {
        PppTracer {
            ppp: &self.probes,
            bl: bl.probes(),
            ppp_start: self.start,
            bl_start: bl.start_value(),
            r: self.start,
            s: bl.start_value(),
        }
    }

    /// An empty profile: one counter per id in the interesting range.
    pub fn profile(&self) -> PppProfile {
        let mut slot = vec![None; (self.max - self.min + 1) as usize];
        for &(b, p) in &self.interesting {
            slot[(p - self.min) as usize] = Some(b);
        }
        PppProfile {
            min: self.min,
            counts: vec![0; slot.len()],
            slot,
            residual: FastMap::default(),
        }
    }
}

/// An online walker with the PPP register and the Ball-Larus register.
#[derive(Debug, Clone)]
pub struct PppTracer<'a> {
    ppp: &'a [EdgeProbe],
    bl: &'a [EdgeProbe],
    ppp_start: u64,
    bl_start: u64,
    r: u64,
    s: u64,
}

impl PppTracer<'_> {
    /// Takes edge `e`; when a path ends, returns its `(PPP id, Ball-Larus id)`.
    ///
    /// # Panics
    ///
    /// If `e` was not in the numbered graph.
    #[inline]
    pub fn step(&mut self, e: EdgeId) -> Option<(i64, PathId)> {
        let (p, b) = (self.ppp[e.index()], self.bl[e.index()]);
        let (r, s) = (self.r.wrapping_add(p.add), self.s.wrapping_add(b.add));
        if b.ends_path {
            self.r = p.restart;
            self.s = b.restart;
            Some((r as i64, PathId(s)))
        } else {
            self.r = r;
            self.s = s;
            None
        }
    }

    /// Resets both registers for a new routine invocation.
    pub fn enter(&mut self) {
        self.r = self.ppp_start;
        self.s = self.bl_start;
    }
}

/// What [`PppProfile::record`] made of a finished path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PppHit {
    /// An interesting path: its counter (index `ppp id - min id`) was bumped.
    Interesting {
        /// Index into [`PppProfile::counts`].
        slot: usize,
    },
    /// Not an interesting path (its PPP id was out of range or aliased).
    Uninteresting,
}

/// Path counters in an array indexed by PPP id, with the Ball-Larus id of
/// each interesting path stored beside its counter to resolve aliases, and
/// a hash table for the other (residual) paths.
#[derive(Debug, Clone)]
pub struct PppProfile {
    min: i64,
    slot: Vec<Option<PathId>>,
    counts: Vec<u64>,
    residual: FastMap<PathId, u64>,
}

impl PppProfile {
    /// Counts one finished path. O(1): a range check, one compare, one add
    /// (plus a hash-table update for uninteresting paths).
    #[inline]
    pub fn record(&mut self, ppp_id: i64, bl_id: PathId) -> PppHit {
        let idx = ppp_id.wrapping_sub(self.min);
        if idx >= 0 && (idx as usize) < self.slot.len() && self.slot[idx as usize] == Some(bl_id) {
            self.counts[idx as usize] += 1;
            return PppHit::Interesting { slot: idx as usize };
        }
        *self.residual.entry(bl_id).or_insert(0) += 1;
        PppHit::Uninteresting
    }

    /// Counter per slot (`ppp id - min id`).
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// The Ball-Larus id of each slot's interesting path (`None` for holes).
    pub fn slots(&self) -> &[Option<PathId>] {
        &self.slot
    }

    /// How many times interesting path `bl_id` was counted (0 if it is not
    /// interesting). O(slots); use [`Ppp::id_of`] and [`PppProfile::counts`]
    /// for many queries.
    pub fn count_of(&self, bl_id: PathId) -> u64 {
        self.slot
            .iter()
            .position(|&s| s == Some(bl_id))
            .map_or(0, |i| self.counts[i])
    }

    /// Counts of uninteresting paths, by Ball-Larus id.
    pub fn residual(&self) -> impl Iterator<Item = (PathId, u64)> + '_ {
        self.residual.iter().map(|(&k, &v)| (k, v))
    }
}
