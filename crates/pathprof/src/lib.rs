//! Path-profiling algorithms: Ball-Larus, PAP, k-iteration paths and PPP over a CFG.

mod ball_larus;
mod cfg;
mod dag;
mod dfs;
mod dominators;
mod error;
mod ids;
mod spanning;

pub use ball_larus::{BallLarus, BlPath, BlTracer, EdgeProbe, PathEnd, PathStart};
pub use cfg::{Cfg, Normalization};
pub use error::{Error, Result};
pub use ids::{EdgeId, NodeId, PathId};
