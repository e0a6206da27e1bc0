//! The path trie: every activation's current path is a node of a prefix tree of the paths seen
//! so far; a path end interns the prefix and its end as a dense path number.

/// Path-key tag: the path starts at the function's entry.
pub(crate) const START_ENTRY: u32 = 0;
/// Path-key tag: the path starts just after a back edge (or mid-function after a resync).
pub(crate) const START_HEAD: u32 = 1;
/// Path-key end tag: the path ends with its activation (return, tail call, unwinding, exit).
pub(crate) const END_EXIT: u32 = u32::MAX;

/// One interned path.
#[derive(Clone, Debug)]
pub(crate) struct PathRec {
    /// `[function, start tag, nodes..., end tag]` (end tag: [`END_EXIT`] or the back edge's
    /// head node).
    pub key: Box<[u32]>,
    /// Times it ran.
    pub count: u64,
    /// For a path ending at a back edge: the trie root of the path that starts at its head,
    /// once known (else [`NONE`]).
    pub(crate) next_root: u32,
}

/// `TrieNode::last_end` before any path ended there (not a node, not [`END_EXIT`]).
pub(crate) const NO_END: u32 = u32::MAX - 1;

/// A node of the path trie: a path prefix `[function, start tag, nodes...]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TrieNode {
    /// The prefix without its last node, or [`NONE`] for a root (a one-node prefix).
    pub(crate) parent: u32,
    /// Its last node (a function CFG node).
    pub(crate) node: u32,
    pub(crate) func: u32,
    pub(crate) start_tag: u32,
    /// The child taken last: its node and trie index.
    pub(crate) last_child_node: u32,
    pub(crate) last_child: u32,
    /// The path that ended here last: its end tag (or [`NO_END`]) and path number.
    pub(crate) last_end: u32,
    pub(crate) last_end_path: u32,
    /// Guest instructions of the prefix's blocks (what a path ending here executed).
    pub(crate) instr: u64,
}
