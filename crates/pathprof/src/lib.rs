//! Path-profiling algorithms: Ball-Larus, PAP, k-iteration paths and PPP over a CFG.

mod ball_larus;
mod cfg;
mod dag;
mod dfs;
mod dominators;
mod error;
mod hash;
mod ids;
mod kipf;
mod kslab;
mod pap;
mod ras;
mod spanning;

pub use ball_larus::{BallLarus, BlPath, BlTracer, EdgeProbe, PathEnd, PathStart};
pub use cfg::{Cfg, Normalization};
pub use error::{Error, Result};
pub use ids::{EdgeId, NodeId, PathId};
pub use pap::{Breakpoint, Pap, PapConfig, PapStats, PapTrace, PapTracer, DEFAULT_WORD_BITS, INIT_AND_RECORD_PROBES};
pub use ras::{EppRegion, REDUCTION_PROBES};
pub use kipf::{IpfNode, KIterationForest};
pub use kslab::{KSlabForest, StreamItem};
