//! Path-profiling algorithms over a control-flow graph: Ball-Larus, PAP, k-iteration paths and PPP.
//!
//! A standalone library (it depends on nothing of hotpath's) implementing
//! intraprocedural path profiling as described by its sources:
//!
//! | module | algorithm | source |
//! |---|---|---|
//! | [`Cfg`] | CFG, DFS back edges, single-entry/single-exit normalisation | PAP paper §1; Ball-Larus lecture |
//! | [`BallLarus`] | acyclic path ids in `[0, N)`, per-edge increments, chord placement, regeneration | Ball-Larus lecture steps 1–4; PPP paper §2.2 |
//! | [`Pap`] | cyclic paths of any length: `r := r*s + i`, backwalk, breakpoints, Ball-Larus on acyclic regions | Wang, Li, Zhou 2012, §1.1–1.4 |
//! | [`KSlabForest`], [`KIterationForest`] | all runs of up to `k` Ball-Larus paths, with counts | D'Elia, Demetrescu, Finocchi 2013, §2 |
//! | [`Ppp`] | compact ids for chosen interesting paths, alias check by Ball-Larus id | Vaswani, Nori, Chilimbi 2007, §2.3, §3 |
//!
//! ```text
//!              Cfg ──normalize──▶ single entry, single exit
//!               │
//!     ┌─────────┼───────────────────────────┐
//!     ▼         ▼                           ▼
//! BallLarus    Pap (r := r*s+i, breakpoints) Ppp (interesting paths, via BallLarus ids)
//!     │ BlTracer: r += inc[e] per edge       │ PapTracer → PapTrace → backwalk → walk
//!     ▼ PathId at back edges and exit
//! stream of PathIds + routine-entry markers ──▶ KSlabForest ──to_ipf──▶ KIterationForest
//! ```
//!
//! **Shapes.** Nodes and edges are dense `u32` ids ([`NodeId`], [`EdgeId`]),
//! so every table is an array. A Ball-Larus [`PathId`] is a `u64` in
//! `[0, N)` where `N` = [`BallLarus::num_paths`]; numbering fails with
//! [`Error::PathCountOverflow`] when `N` exceeds `u64::MAX` rather than
//! wrapping. A PAP register is `word_bits` wide (1..=64) and never
//! overflows: it records a [`Breakpoint`] instead. PPP ids are `i64`
//! (uninteresting paths may get negative ids).
//!
//! **Online use.** [`BallLarus::probes`] gives, per edge, the value to add
//! to a one-register walker and whether a path ends there (back edges and
//! edges into the exit); [`BallLarus::renumber`] recomputes in linear time
//! when the CFG grows, reusing buffers.
//!
//! # Example
//!
//! A loop whose body branches, its Ball-Larus numbering, the id of each
//! path of one run, and the block sequence of a path regenerated from its id:
//!
//! ```
//! use hotpath_pathprof::{BallLarus, Cfg, NodeId, PathEnd, PathId, PathStart};
//!
//! // 0 (entry) -> 1 (loop head) -> {2, 3} -> 4 -> 1 (back edge) | 5 (exit)
//! let cfg = Cfg::from_edges(
//!     6,
//!     NodeId(0),
//!     NodeId(5),
//!     &[(0, 1), (1, 2), (1, 3), (2, 4), (3, 4), (4, 1), (4, 5)],
//! )?;
//! let bl = BallLarus::number(&cfg)?;
//! // Paths start at the entry or after the back edge 4 -> 1, and end at the
//! // exit or at the back edge: 2 starts x 2 branches x 2 ends.
//! assert_eq!(bl.num_paths(), 8);
//!
//! // One run: around the loop through 2, then through 3 and out.
//! let e = |s, d| cfg.find_edge(NodeId(s), NodeId(d)).unwrap();
//! let walk = [e(0, 1), e(1, 2), e(2, 4), e(4, 1), e(1, 3), e(3, 4), e(4, 5)];
//! let ids = bl.encode_walk(&walk)?;
//! assert_eq!(ids.len(), 2);
//!
//! // The same ids, online: one add per edge, an id at each path's end.
//! let mut tracer = bl.tracer();
//! let online: Vec<PathId> = walk.iter().filter_map(|&edge| tracer.step(edge)).collect();
//! assert_eq!(online, ids);
//!
//! // Regenerate the second path: it starts after the back edge.
//! let path = bl.regenerate(ids[1])?;
//! assert_eq!(path.start, PathStart::AfterBackEdge(e(4, 1)));
//! assert_eq!(path.end, PathEnd::Exit);
//! assert_eq!(path.blocks, [1, 3, 4, 5].map(NodeId));
//! # Ok::<(), hotpath_pathprof::Error>(())
//! ```

#![warn(missing_docs)]

pub mod ball_larus;
pub mod cfg;
mod dag;
mod dfs;
mod dominators;
pub mod error;
mod hash;
pub mod ids;
pub mod kipf;
pub mod kslab;
pub mod pap;
pub mod ppp;
pub mod ras;
mod spanning;

pub use ball_larus::{BallLarus, BlPath, BlTracer, EdgeProbe, PathEnd, PathStart};
pub use cfg::{Cfg, Normalization};
pub use error::{Error, Result};
pub use ids::{EdgeId, NodeId, PathId};
pub use kipf::{IpfNode, KIterationForest};
pub use kslab::{KSlabForest, StreamItem, SCAN_LIMIT};
pub use pap::{
    Breakpoint, Pap, PapConfig, PapStats, PapTrace, PapTracer, DEFAULT_WORD_BITS,
    INIT_AND_RECORD_PROBES,
};
pub use ppp::{Ppp, PppHit, PppProfile, PppTracer};
pub use ras::{EppRegion, REDUCTION_PROBES};
