//! Dense index newtypes for CFG nodes and edges, and the `u64` path identifier.
//!
//! Nodes and edges are numbered densely from 0 in the order they are added to
//! a [`Cfg`](crate::Cfg), so every per-node or per-edge table in this crate is a
//! plain `Vec` indexed by the id, never a hash map.

use std::fmt;

/// A CFG node (a basic block), dense from 0 in insertion order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct NodeId(pub u32);

/// A CFG edge (a control transfer), dense from 0 in insertion order.
///
/// Edges are directed and a graph may hold several edges between the same
/// pair of nodes (a multigraph), so an edge is named by its id, not by its
/// endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EdgeId(pub u32);

/// A Ball-Larus acyclic path identifier.
///
/// For a routine with `N` acyclic paths (see
/// [`BallLarus::num_paths`](crate::BallLarus::num_paths)), every path that starts at
/// the routine entry or just after a back edge, and ends at the routine exit or
/// at a back edge, has exactly one id in `[0, N)`, and every id in `[0, N)`
/// names exactly one such path. `N` is at most `u64::MAX`; a routine with more
/// paths is rejected with [`Error::PathCountOverflow`](crate::Error::PathCountOverflow)
/// rather than numbered modulo 2^64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PathId(pub u64);

impl NodeId {
    /// The id as a `usize` table index.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl EdgeId {
    /// The id as a `usize` table index.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

impl fmt::Display for EdgeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

impl fmt::Display for PathId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

/// Sentinel for "no index" in the crate's internal `u32` tables.
pub(crate) const NONE: u32 = u32::MAX;
