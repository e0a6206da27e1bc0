//! Functions: their dynamic CFGs (nodes keyed by guest address) and the ELF symbols that name
//! them.

use hotpath_pathprof::KSlabForest;

use super::ids::{FxMap, NONE};
use super::numbering::Numbering;

/// A guest function symbol, as the loader found it (`.symtab`, else `.dynsym`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSymbol {
    /// Name.
    pub name: String,
    /// Guest address of its first byte.
    pub addr: u64,
    /// Size in bytes (0: unknown).
    pub size: u64,
}

/// One function's dynamic CFG and counters.
#[derive(Clone, Debug)]
pub(crate) struct Function {
    /// Guest address of the entry block.
    pub entry: u64,
    /// The symbol it starts in, if any (index into `PathConfig::symbols`).
    pub symbol: Option<usize>,
    /// Node → guest address of the block; node 0 is the entry block.
    pub node_addr: Vec<u64>,
    /// Node → guest instructions of the block (its latest translation's).
    pub node_instr: Vec<u32>,
    /// Guest address → node.
    pub nodes: FxMap<u64, u32>,
    /// The lowest and highest guest addresses of its nodes (`(u64::MAX, 0)`: none yet): an
    /// address outside is no node of it, without a look at `nodes`.
    pub(crate) node_span: (u64, u64),
    /// Static intra-procedural successors of each node, by guest address (from the IR).
    pub static_succs: Vec<Vec<u64>>,
    /// Paths ended in this function.
    pub path_ends: u64,
    /// Its distinct paths, by the recorder's path number, in the order made (its CFG's edges
    /// as taken can only change when these or its blocks do).
    pub(crate) paths: Vec<u32>,
    /// A call has entered it: from then on a jump to its entry from another function is a tail
    /// call. An entry no call reaches (an ELF symbol that code only jumps or falls into, as
    /// glibc's routines jump between each other's symbols) starts no activation when jumped to.
    pub called: bool,
    /// The k-slab forest of its Ball-Larus path stream (labels: path numbers).
    pub kslab: Option<KSlabForest>,
    /// Root of its PAP runs in the run trie, or [`NONE`] before its first one.
    pub(crate) pap_root: u32,
    /// The Ball-Larus numbering of its edges seen so far ([`Recorder::Sums`]).
    pub(crate) bl: Numbering,
    /// Runs of its paths not yet added to the interned paths' counts, by Ball-Larus id under
    /// `bl` ([`Recorder::Sums`]): ids below `dense_len` in the recorder's dense counters from
    /// `dense_base` on (a block of `dense_cap`), the others here.
    pub(crate) bl_counts: FxMap<u64, u64>,
    /// Path numbers of ids under `bl`, as PAP runs and k-paths looked them up.
    pub(crate) numbers: FxMap<u64, u32>,
    pub(crate) dense_base: u64,
    pub(crate) dense_len: u64,
    pub(crate) dense_cap: u64,
    /// Its numbering needed more than 2^64 ids: its activations keep trie nodes, as the
    /// per-block reference does ([`Recorder::Sums`]).
    pub(crate) spelled: bool,
}

impl Function {
    /// A function entered at guest address `entry`, with no CFG, counts or runs yet.
    pub(crate) fn new(entry: u64, symbol: Option<usize>) -> Function {
        Function {
            entry,
            symbol,
            node_addr: Vec::new(),
            node_instr: Vec::new(),
            nodes: FxMap::default(),
            node_span: (u64::MAX, 0),
            static_succs: Vec::new(),
            path_ends: 0,
            called: false,
            kslab: None,
            pap_root: NONE,
            paths: Vec::new(),
            bl: Numbering::default(),
            bl_counts: FxMap::default(),
            numbers: FxMap::default(),
            dense_base: 0,
            dense_len: 0,
            dense_cap: 0,
            spelled: false,
        }
    }
}
