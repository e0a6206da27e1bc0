//! The crate's single error type.

use crate::{EdgeId, NodeId, PathId};

/// Everything that can go wrong in this crate.
///
/// Variants carry the ids and numbers needed to point at the offending part
/// of the input. Every variant is caused by input (a graph, a walk, an id, a
/// trace or a parameter); none means a bug in this crate, which panics on a
/// broken internal invariant instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A node id that the graph does not have.
    #[error("node {node} does not exist (the graph has {node_count} nodes)")]
    NoSuchNode {
        /// The id that was passed.
        node: NodeId,
        /// How many nodes the graph has.
        node_count: u32,
    },

    /// An edge id that the graph does not have.
    #[error("edge {edge} does not exist (the graph has {edge_count} edges)")]
    NoSuchEdge {
        /// The id that was passed.
        edge: EdgeId,
        /// How many edges the graph has.
        edge_count: u32,
    },

    /// The graph would need more than `u32::MAX - 1` nodes or edges.
    #[error("too many {what}: ids are u32 and {limit} is the limit")]
    TooManyIds {
        /// `"nodes"` or `"edges"`.
        what: &'static str,
        /// The largest count allowed.
        limit: u32,
    },

    /// The entry node has a predecessor reachable from it, so it is not a
    /// single entry; [`Cfg::normalize`](crate::Cfg::normalize) fixes this.
    #[error("entry {entry} has predecessor edge {edge}; normalise the CFG first")]
    EntryHasPredecessor {
        /// The entry node.
        entry: NodeId,
        /// One edge into it.
        edge: EdgeId,
    },

    /// The exit node has a successor, so it is not a single exit;
    /// [`Cfg::normalize`](crate::Cfg::normalize) fixes this.
    #[error("exit {exit} has successor edge {edge}; normalise the CFG first")]
    ExitHasSuccessor {
        /// The exit node.
        exit: NodeId,
        /// One edge out of it.
        edge: EdgeId,
    },

    /// A node reachable from the entry has no successors and is not the exit;
    /// [`Cfg::normalize`](crate::Cfg::normalize) joins such nodes to one exit.
    #[error("node {node} has no successors but is not the exit {exit}; normalise the CFG first")]
    DeadEnd {
        /// The node without successors.
        node: NodeId,
        /// The graph's exit.
        exit: NodeId,
    },

    /// The number of acyclic paths from `node` to the exit does not fit in a
    /// `u64`, so Ball-Larus ids would wrap. Reported instead of wrapping.
    #[error("more than u64::MAX acyclic paths lead from node {node} to the exit")]
    PathCountOverflow {
        /// The first node (in reverse topological order) whose count overflowed.
        node: NodeId,
    },

    /// A path id at or above the number of paths of the numbering.
    #[error("path id {id} is out of range: the routine has {num_paths} paths")]
    PathIdOutOfRange {
        /// The id that was passed.
        id: PathId,
        /// The number of paths `N`; valid ids are `[0, N)`.
        num_paths: u64,
    },

    /// An edge of a walk does not start where the previous edge ended (or, for
    /// the first edge, at the entry).
    #[error("walk step {step}: edge {edge} leaves {edge_src}, but the walk is at {at}")]
    DiscontinuousWalk {
        /// Index of the edge in the walk.
        step: usize,
        /// The edge.
        edge: EdgeId,
        /// Where the edge starts.
        edge_src: NodeId,
        /// Where the walk was.
        at: NodeId,
    },

    /// A walk ended somewhere other than the exit.
    #[error("the walk ends at {at}, not at the exit {exit}")]
    WalkEndsAwayFromExit {
        /// Where the walk stopped.
        at: NodeId,
        /// The exit.
        exit: NodeId,
    },

    /// An edge that lies on no entry-to-exit path (its source is unreachable
    /// from the entry), so it has no probe.
    #[error("edge {edge} is not reachable from the entry")]
    UnreachableEdge {
        /// The edge.
        edge: EdgeId,
    },

    /// A path said to start or end with a back edge names a forward edge.
    #[error("edge {edge} is not a back edge")]
    NotABackEdge {
        /// The edge.
        edge: EdgeId,
    },

    /// A per-edge table of the wrong length.
    #[error("expected {expected} edge weights (one per edge), got {got}")]
    WeightCountMismatch {
        /// The graph's edge count.
        expected: usize,
        /// The table's length.
        got: usize,
    },

    /// A PAP word width outside `1..=64` bits.
    #[error("PAP word width must be 1..=64 bits, got {bits}")]
    InvalidWordBits {
        /// The requested width.
        bits: u32,
    },

    /// The PAP word cannot hold the in-edge index of a merge node, so even a
    /// freshly reset probe value would overflow.
    #[error(
        "a {bits}-bit PAP word cannot hold remainder {remainder} of node {node} (fan-in {fan_in})"
    )]
    WordTooNarrow {
        /// The word width.
        bits: u32,
        /// The merge node.
        node: NodeId,
        /// Its fan-in `s`.
        fan_in: u64,
        /// The largest remainder `s - 1`.
        remainder: u64,
    },

    /// A PAP trace that no walk of this graph produces.
    #[error("PAP trace segment {segment} cannot be walked back: {reason}")]
    CorruptPapTrace {
        /// Index of the segment (0 = from the entry to the first breakpoint).
        segment: usize,
        /// What went wrong.
        reason: &'static str,
    },

    /// `k` must be at least 1 for k-iteration paths.
    #[error("k must be at least 1 for k-iteration paths, got {k}")]
    InvalidK {
        /// The requested k.
        k: usize,
    },

    /// PPP needs at least one interesting path.
    #[error("PPP needs at least one interesting path")]
    NoInterestingPaths,

    /// The same path was listed twice as interesting.
    #[error("path {id} is listed twice as interesting")]
    DuplicateInterestingPath {
        /// The repeated Ball-Larus id.
        id: PathId,
    },

    /// PPP weights left the `i64` range.
    #[error("PPP identifiers do not fit in i64 at node {node}")]
    PppOverflow {
        /// The node being processed.
        node: NodeId,
    },
}

/// The crate's `Result`.
pub type Result<T> = std::result::Result<T, Error>;
