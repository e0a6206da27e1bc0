//! Online path recording: functions and their dynamic CFGs, the shadow call stack, and the
//! Ball-Larus paths, PAP runs and k-slab forests of every activation, fed from the block stream.
//!
//! **Functions.** A function is entered by a `call` (its entry is the call target) or is the
//! ELF function symbol containing a block reached otherwise (the first block, a resynchronised
//! return, an indirect jump out of the current function). Its CFG nodes are keyed by guest
//! address: a block translated twice (before and after a code-cache flush) is one node. A
//! per-block-id cache maps an id to its node in the function it was last seen in, so the
//! per-event work is array lookups.
//!
//! **Shadow stack.** `call`/indirect `call` terminators push an activation that remembers its
//! guest return address; `ret` pops the activation whose return address is the target —
//! normally the top one. A return to a deeper frame (longjmp through `ret`, exceptions) pops
//! everything above it; a return to no frame on the stack, an indirect jump into a function
//! found deeper in the stack (longjmp), or a jump to another function's entry (a tail call)
//! replaces activations. An indirect jump to the return address of a frame on the stack
//! (`pop reg; jmp *reg`) is a return to that frame; a `call` to the very next instruction (the
//! get-pc idiom, `call 1f; 1: pop reg`) is no call at all. Every case other than the plain
//! return counts one [`PathRecorder::resyncs`].
//!
//! **Bounded memory.** Nothing the recorder keeps grows with the length of the run alone:
//! the shadow stack holds at most [`SHADOW_STACK_MAX`] frames (a deeper stack, or calls that
//! never return, drop the bottom half: their paths end there, as at an exit, and a later
//! return to one of them resynchronises); the call tree behind the flame graph is cut at
//! [`CALL_TREE_MAX_DEPTH`] frames; in-flight and stored PAP runs are capped by
//! [`PAP_MAX_PATHS`] and [`PAP_STORE_MAX`]. What remains grows with the program's code
//! (functions, blocks, distinct paths, memoised transitions), not with its run time.
//!
//! **Paths** (Ball-Larus lecture; DESIGN.md "Monitor"). A path runs inside one activation: it
//! starts at the function's entry or just after a back edge, and ends at a back edge or when
//! the activation ends (return, tail call, unwinding, end of the guest). Back edges are the
//! *retreating edges in address order* (`dst.addr <= src.addr`, DynamoRIO's backward-branch
//! rule): the forward edges then form a DAG whatever else is discovered later, so the back
//! edge set never changes as the CFG grows and a recorded path stays a Ball-Larus path of the
//! grown CFG. Calls do not end the caller's path: its next block is the return point.
//!
//! **Counts keyed by block sequence.** During the run each activation's current path is a
//! node of a prefix tree (trie) of the paths seen so far: a block steps to a child, found
//! through the parent's one-entry cache of its last child (a hash probe only when the path
//! differs from the last one taken through that prefix); a path end maps the trie node and
//! the end to a dense path number the same way. So the per-event work is array lookups and
//! compares, never a hash of a whole sequence. A path's block sequence is spelled once, when
//! it is first seen; the Ball-Larus ids are derived from the final CFG with
//! `hotpath_pathprof::BallLarus` when the profile is taken (see `pathreport`), so CFG growth
//! never loses or mixes counts. The k-slab forests are fed those dense path numbers (a
//! one-to-one relabelling of Ball-Larus ids), and PAP runs are the sequences of path numbers of
//! one activation of a hot function, kept in a second trie (a run steps to a child per path
//! end and is counted at its node when the activation ends) and encoded with
//! `hotpath_pathprof::Pap` at the end.
//!
//! **Per event, not per block.** The ring carries one event per superblock run; stepping the
//! shadow stack and the trie once per basic block would cost the monitor far more per event
//! than the tables do. `path_memo` memoises what a run of a superblock's blocks does to the
//! current path (see there); [`PathConfig::per_block`] keeps the plain per-block stepping of
//! this file as the reference the memoised recorder is tested against.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use hotpath_events::SYSCALL_EVENT;
use hotpath_ir::Terminator;
use hotpath_pathprof::{KSlabForest, PathId};

use crate::pap_runs::PapRuns;
use crate::path_memo::MemoState;
use crate::tables::Expander;
use crate::Tables;

/// No block, node, function or path.
pub(crate) const NONE: u32 = u32::MAX;

/// Path ends (of any activation) after which a function is hot and its new activations also
/// record PAP runs. Default; `--pap-threshold` overrides it.
pub const DEFAULT_PAP_THRESHOLD: u64 = 1000;

/// Shadow-stack frames kept (about 48 bytes each: 12 MiB). An 8 MiB guest stack of the
/// smallest frames (a bare return address) is 1 Mi frames deep, so a real recursion can pass
/// it, and a guest whose calls never return (`call` used as a jump) passes it in a loop: then
/// the bottom half of the frames is dropped (their paths end there, counted as exits) and
/// [`PathRecorder::dropped_frames`] counts them.
pub const SHADOW_STACK_MAX: usize = 1 << 18;

/// Call-tree depth kept for flame graphs, in frames. Deeper calls (deep recursion) are
/// folded into one `[deeper]` frame under the last kept one: folded stacks cost their depth
/// in bytes per distinct stack, and a 100 000-deep recursion would otherwise need
/// 100 000 stacks averaging 50 000 frames.
pub const CALL_TREE_MAX_DEPTH: u32 = 128;

/// Slots of the direct-mapped call-tree cache, a power of two (12 bytes each: 48 KiB).
const CALL_CACHE_SLOTS: usize = 1 << 12;

/// Path-key tag: the path starts at the function's entry.
pub(crate) const START_ENTRY: u32 = 0;
/// Path-key tag: the path starts just after a back edge (or mid-function after a resync).
pub(crate) const START_HEAD: u32 = 1;
/// Path-key end tag: the path ends with its activation (return, tail call, unwinding, exit).
pub(crate) const END_EXIT: u32 = u32::MAX;

/// FxHash-style hasher: path keys are short `u32` sequences hashed once per path end.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// The slot of key `(a, b)` in a direct-mapped cache of `slots` entries (a power of two).
#[inline]
pub(crate) fn cache_slot(a: u32, b: u32, slots: usize) -> usize {
    let h = (((a as u64) << 32) | b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> (64 - slots.trailing_zeros())) as usize
}

/// The call-tree child of `parent` for `func` where it is cached: the child entered last under
/// `parent`, else the direct-mapped cache `call_cache` (a caller that calls several functions in
/// turn); else [`NONE`] (`PathRecorder::call_child` finds or makes it).
#[inline]
pub(crate) fn cached_call_child(
    calltree: &[CallNode],
    call_cache: &[(u32, u32, u32)],
    parent: u32,
    func: u32,
) -> u32 {
    let p = &calltree[parent as usize];
    // `last_func` is a real function only below CALL_TREE_MAX_DEPTH (see `call_child`).
    if p.last_func == func {
        return p.last_child;
    }
    let (cp, cf, c) = call_cache[cache_slot(parent, func, call_cache.len())];
    if cp == parent && cf == func {
        c
    } else {
        NONE
    }
}

/// The number of the path that ends at trie node `t` with its activation ([`END_EXIT`]) where
/// the node caches it (the last path that ended there did so at an exit); else [`NONE`]
/// (`PathRecorder::path_of` finds or interns it).
#[inline]
pub(crate) fn cached_exit_path(trie: &[TrieNode], t: u32) -> u32 {
    let n = &trie[t as usize];
    if n.last_end == END_EXIT {
        n.last_end_path
    } else {
        NONE
    }
}

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

/// What to record besides the tables.
#[derive(Clone, Debug)]
pub struct PathConfig {
    /// Path ends after which a function records PAP runs (0: every function).
    pub pap_threshold: u64,
    /// Ball-Larus paths per k-iteration path (`--k`); 0 keeps no k-slab forest.
    pub k: usize,
    /// Function symbols, sorted by address.
    pub symbols: Vec<FunctionSymbol>,
    /// Step the shadow stack and the trie once per basic block, without memoised
    /// transitions: the reference the memoised recorder is checked against (same profile,
    /// several times slower; `--paths-per-block`).
    pub per_block: bool,
}

impl Default for PathConfig {
    fn default() -> Self {
        PathConfig {
            pap_threshold: DEFAULT_PAP_THRESHOLD,
            k: 0,
            symbols: Vec::new(),
            per_block: false,
        }
    }
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
    /// Static intra-procedural successors of each node, by guest address (from the IR).
    pub static_succs: Vec<Vec<u64>>,
    /// Paths ended in this function.
    pub path_ends: u64,
    /// Activations started.
    pub activations: u64,
    /// The k-slab forest of its Ball-Larus path stream (labels: path numbers).
    pub kslab: Option<KSlabForest>,
    /// Root of its PAP runs in the run trie, or [`NONE`] before its first one.
    pub(crate) pap_root: u32,
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
            static_succs: Vec::new(),
            path_ends: 0,
            activations: 0,
            kslab: None,
            pap_root: NONE,
        }
    }
}

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
    next_root: u32,
}

/// `TrieNode::last_end` before any path ended there (not a node, not [`END_EXIT`]).
const NO_END: u32 = u32::MAX - 1;

/// A node of the path trie: a path prefix `[function, start tag, nodes...]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TrieNode {
    /// The prefix without its last node, or [`NONE`] for a root (a one-node prefix).
    parent: u32,
    /// Its last node (a function CFG node).
    node: u32,
    func: u32,
    start_tag: u32,
    /// The child taken last: its node and trie index.
    last_child_node: u32,
    last_child: u32,
    /// The path that ended here last: its end tag (or [`NO_END`]) and path number.
    last_end: u32,
    last_end_path: u32,
    /// Guest instructions of the prefix's blocks (what a path ending here executed).
    pub(crate) instr: u64,
}

/// One shadow-stack frame.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Activation {
    pub(crate) func: u32,
    /// Guest address its `ret` must go to (0: none known).
    pub(crate) return_to: u64,
    /// The trie node of its current path (the blocks so far).
    pub(crate) cur: u32,
    /// Blocks on its current path so far.
    pub(crate) len: u32,
    /// Blocks on its finished paths, not yet added to its call-tree node.
    pub(crate) blocks: u64,
    /// Guest instructions of those blocks.
    pub(crate) instructions: u64,
    /// Its finished paths, not yet added to its function's `path_ends`.
    pub(crate) path_ends: u64,
    /// Guest address of the last block of its current path.
    pub(crate) last_addr: u64,
    /// Its PAP run so far (a node of the run trie), or [`NONE`] when it records none.
    pub(crate) pap: u32,
    /// Paths in its PAP run so far.
    pub(crate) pap_len: u32,
    /// Its node in the call tree.
    pub(crate) call_node: u32,
    /// While it is not the top frame: the memo that ended with its call, whose successors
    /// predict the memo its path goes on with after the return ([`NONE`]: none; a guess,
    /// checked before use, see `path_memo`).
    pub(crate) resume: u32,
}

/// A call-tree node (for flame graphs): a function under a parent, with the blocks executed
/// directly in it.
#[derive(Clone, Debug)]
pub(crate) struct CallNode {
    pub parent: u32,
    /// The function, [`NONE`] for the root, or [`DEEPER`] for the frames past
    /// [`CALL_TREE_MAX_DEPTH`].
    pub func: u32,
    pub blocks: u64,
    /// Guest instructions of those blocks.
    pub instructions: u64,
    /// Frames from the root (the root is 0).
    pub depth: u32,
    /// The child entered last: its function and node (a one-entry cache before the map).
    last_func: u32,
    last_child: u32,
}

/// Call-tree function of the node standing for every frame past [`CALL_TREE_MAX_DEPTH`].
pub(crate) const DEEPER: u32 = u32::MAX - 1;

/// Why the shadow stack was resynchronised (anything but a `ret` to the top frame's return
/// address, or a call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resync {
    /// A jump (direct or indirect) to another function's entry: the top frame is replaced.
    TailCall,
    /// A `ret` to the return address of a frame below the top: the frames above it are popped
    /// (longjmp or exceptions implemented with `ret`, a callee that dropped frames).
    DeeperReturn,
    /// A `ret` to an address no frame returns to (a forged return address, `push; ret` used as
    /// a jump, a stack switch, a frame dropped from a full stack): the top frame is replaced by
    /// one of the function containing the target.
    OrphanReturn,
    /// An indirect jump to a frame's return address (`pop reg; jmp *reg`): a return.
    JumpReturn,
    /// An indirect jump into a function deeper in the stack (longjmp): the frames above it
    /// are popped.
    Unwind,
    /// An indirect jump into another function that is not on the stack: the top frame is
    /// replaced.
    ForeignJump,
}

impl Resync {
    /// Every cause, in index order.
    pub const ALL: [Resync; 6] = [
        Resync::TailCall,
        Resync::DeeperReturn,
        Resync::OrphanReturn,
        Resync::JumpReturn,
        Resync::Unwind,
        Resync::ForeignJump,
    ];

    /// Its name in the JSON report.
    pub fn name(self) -> &'static str {
        match self {
            Resync::TailCall => "tail_call",
            Resync::DeeperReturn => "deeper_return",
            Resync::OrphanReturn => "orphan_return",
            Resync::JumpReturn => "jump_return",
            Resync::Unwind => "unwind",
            Resync::ForeignJump => "foreign_jump",
        }
    }
}

/// Classification of a block's terminator for the shadow stack.
pub(crate) const K_OTHER: u8 = 0;
pub(crate) const K_CALL: u8 = 1;
pub(crate) const K_RET: u8 = 2;
pub(crate) const K_INDIRECT: u8 = 3;

/// The online path recorder: shadow stack, functions, interned paths.
#[derive(Clone)]
pub struct PathRecorder {
    pub(crate) config: PathConfig,
    pub(crate) funcs: Vec<Function>,
    func_by_entry: FxMap<u64, u32>,
    /// Per block id: guest address, terminator class, return address of calls (placeholders
    /// for superblock and side-exit ids).
    pub(crate) id_addr: Vec<u64>,
    pub(crate) id_kind: Vec<u8>,
    pub(crate) id_ret: Vec<u64>,
    /// Per block id: the function whose entry it is, or NONE.
    pub(crate) id_entry: Vec<u32>,
    /// Per block id: (function, node) where it was last seen.
    pub(crate) id_node: Vec<(u32, u32)>,
    /// Per block id: the trie root of a path of `id_node`'s function starting at it after an
    /// entry (a call, tail call or resync), or [`NONE`].
    pub(crate) id_root: Vec<u32>,
    /// Guest address → block ids with that address (to refresh `id_entry`).
    ids_at: FxMap<u64, Vec<u32>>,
    pub(crate) stack: Vec<Activation>,
    /// The path trie.
    pub(crate) trie: Vec<TrieNode>,
    /// Trie roots by `(function, start tag, node)`.
    roots: FxMap<(u32, u32, u32), u32>,
    /// Trie children by `(parent, node)` (behind `TrieNode::last_child`).
    children: FxMap<(u32, u32), u32>,
    /// Path numbers by `(trie node, end tag)` (behind `TrieNode::last_end`).
    ends: FxMap<(u32, u32), u32>,
    pub(crate) paths: Vec<PathRec>,
    /// The PAP run trie.
    pub(crate) pap_runs: PapRuns,
    pub(crate) calltree: Vec<CallNode>,
    call_child: FxMap<(u32, u32), u32>,
    /// Direct-mapped cache in front of `call_child`: (parent, function, child).
    pub(crate) call_cache: Box<[(u32, u32, u32)]>,
    /// The last basic block stepped.
    pub(crate) prev: u32,
    /// Event-level state (see `path_memo`).
    pub(crate) memo: MemoState,
    /// `per_block` mode: superblock events turned back into blocks.
    expander: Expander,
    expanded: Vec<u32>,
    /// Times the shadow stack had to be resynchronised (returns to another frame, unwinding,
    /// tail calls, returns to no frame).
    pub resyncs: u64,
    /// [`PathRecorder::resyncs`] by cause, indexed by [`Resync`].
    pub resync_kinds: [u64; Resync::ALL.len()],
    /// Shadow-stack frames dropped for exceeding [`SHADOW_STACK_MAX`].
    pub dropped_frames: u64,
}

impl PathRecorder {
    /// An empty recorder.
    pub fn new(mut config: PathConfig) -> PathRecorder {
        config.symbols.sort_by_key(|s| s.addr);
        PathRecorder {
            config,
            funcs: Vec::new(),
            func_by_entry: FxMap::default(),
            id_addr: Vec::new(),
            id_kind: Vec::new(),
            id_ret: Vec::new(),
            id_entry: Vec::new(),
            id_node: Vec::new(),
            id_root: Vec::new(),
            ids_at: FxMap::default(),
            stack: Vec::new(),
            trie: Vec::new(),
            roots: FxMap::default(),
            children: FxMap::default(),
            ends: FxMap::default(),
            paths: Vec::new(),
            pap_runs: PapRuns::default(),
            calltree: vec![CallNode {
                parent: NONE,
                func: NONE,
                blocks: 0,
                instructions: 0,
                depth: 0,
                last_func: NONE,
                last_child: NONE,
            }],
            call_child: FxMap::default(),
            call_cache: vec![(NONE, NONE, NONE); CALL_CACHE_SLOTS].into_boxed_slice(),
            prev: NONE,
            memo: MemoState::default(),
            expander: Expander::default(),
            expanded: Vec::new(),
            resyncs: 0,
            resync_kinds: [0; Resync::ALL.len()],
            dropped_frames: 0,
        }
    }

    /// The symbol containing `addr`, if any.
    fn symbol_at(&self, addr: u64) -> Option<usize> {
        let syms = &self.config.symbols;
        let i = syms.partition_point(|s| s.addr <= addr).checked_sub(1)?;
        let s = &syms[i];
        (s.size == 0 || addr < s.addr + s.size).then_some(i)
    }

    /// Takes in the recorder's view of the ids `tables` knows and it does not yet (the
    /// tables learn every id of a piece of events before the recorder sees it).
    #[cold]
    pub(crate) fn learn_known(&mut self, tables: &Tables) {
        for i in self.id_addr.len()..tables.blocks.len() {
            if !self.memo.learn(i as u32, &tables.kinds[i]) {
                // A superblock or a side exit: its blocks carry the metadata.
                self.id_addr.push(0);
                self.id_kind.push(K_OTHER);
                self.id_ret.push(0);
                self.id_node.push((NONE, NONE));
                self.id_root.push(NONE);
                self.id_entry.push(NONE);
                continue;
            }
            let b = &tables.blocks[i];
            let (kind, ret) = match b.terminator {
                // `call 1f; 1:` (get-pc) pushes an address and goes on: no activation.
                Terminator::Call { target, return_to } if target == return_to => (K_OTHER, 0),
                Terminator::Call { return_to, .. } | Terminator::IndirectCall { return_to } => {
                    (K_CALL, return_to.0)
                }
                Terminator::Return => (K_RET, 0),
                Terminator::IndirectJump => (K_INDIRECT, 0),
                _ => (K_OTHER, 0),
            };
            let addr = b.start.0;
            self.id_addr.push(addr);
            self.id_kind.push(kind);
            self.id_ret.push(ret);
            self.id_node.push((NONE, NONE));
            self.id_root.push(NONE);
            let entry = match self.func_by_entry.get(&addr) {
                Some(&f) => f,
                None if self
                    .config
                    .symbols
                    .binary_search_by_key(&addr, |s| s.addr)
                    .is_ok() =>
                {
                    self.function_at(addr)
                }
                None => NONE,
            };
            self.id_entry.push(entry);
            self.ids_at.entry(addr).or_default().push(i as u32);
        }
    }

    /// The function whose entry is `addr`, created if new.
    fn function_at(&mut self, addr: u64) -> u32 {
        if let Some(&f) = self.func_by_entry.get(&addr) {
            return f;
        }
        let f = self.funcs.len() as u32;
        let symbol = self
            .symbol_at(addr)
            .filter(|&i| self.config.symbols[i].addr == addr);
        self.funcs.push(Function::new(addr, symbol));
        self.func_by_entry.insert(addr, f);
        if let Some(ids) = self.ids_at.get(&addr) {
            for &i in ids {
                self.id_entry[i as usize] = f;
            }
            // A block already seen is now a function entry: a jump to it is a tail call, no
            // longer a step of the current path, so no memoised transition may be trusted.
            self.memo.invalidate();
        }
        f
    }

    /// The function a block reached without a call belongs to: the one whose symbol contains
    /// it (entered at the symbol's start), else a new function entered at the block.
    fn function_containing(&mut self, addr: u64) -> u32 {
        let entry = self
            .symbol_at(addr)
            .map(|i| self.config.symbols[i].addr)
            .unwrap_or(addr);
        self.function_at(entry)
    }

    /// Node of block `id` in function `func`, created (with its static successors) if new.
    #[inline]
    fn node_of(&mut self, func: u32, id: u32, tables: &Tables) -> u32 {
        let (f, n) = self.id_node[id as usize];
        if f == func {
            return n;
        }
        self.node_of_slow(func, id, tables)
    }

    #[cold]
    fn node_of_slow(&mut self, func: u32, id: u32, tables: &Tables) -> u32 {
        let addr = self.id_addr[id as usize];
        let fun = &mut self.funcs[func as usize];
        if fun.node_addr.is_empty() && addr != fun.entry {
            // The entry block is node 0 even when an activation starts elsewhere.
            fun.node_addr.push(fun.entry);
            fun.node_instr.push(0);
            fun.nodes.insert(fun.entry, 0);
            fun.static_succs.push(Vec::new());
        }
        let n = match fun.nodes.get(&addr) {
            Some(&n) => n,
            None => {
                let n = fun.node_addr.len() as u32;
                fun.node_addr.push(addr);
                fun.node_instr.push(0);
                fun.nodes.insert(addr, n);
                fun.static_succs.push(Vec::new());
                n
            }
        };
        if fun.static_succs[n as usize].is_empty() {
            let succs = match tables.blocks[id as usize].terminator {
                Terminator::Call { return_to, .. } | Terminator::IndirectCall { return_to } => {
                    vec![return_to.0]
                }
                t => t
                    .static_successors()
                    .into_iter()
                    .map(|a| a.0)
                    .filter(|a| !self.func_by_entry.contains_key(a) || *a == fun.entry)
                    .collect(),
            };
            fun.static_succs[n as usize] = succs;
        }
        fun.node_instr[n as usize] = tables.blocks[id as usize].instructions;
        self.id_node[id as usize] = (func, n);
        self.id_root[id as usize] = NONE;
        n
    }

    /// The trie root of paths of `func` starting with `node` after `start_tag`.
    fn root(&mut self, func: u32, start_tag: u32, node: u32) -> u32 {
        if let Some(&r) = self.roots.get(&(func, start_tag, node)) {
            return r;
        }
        let r = self.new_trie_node(NONE, node, func, start_tag);
        self.roots.insert((func, start_tag, node), r);
        r
    }

    fn new_trie_node(&mut self, parent: u32, node: u32, func: u32, start_tag: u32) -> u32 {
        let t = self.trie.len() as u32;
        let before = match parent {
            NONE => 0,
            p => self.trie[p as usize].instr,
        };
        let instr = before + self.funcs[func as usize].node_instr[node as usize] as u64;
        self.trie.push(TrieNode {
            instr,
            parent,
            node,
            func,
            start_tag,
            last_child_node: NONE,
            last_child: NONE,
            last_end: NO_END,
            last_end_path: NONE,
        });
        t
    }

    /// The trie node of prefix `t` extended by `node`.
    #[inline]
    fn trie_step(&mut self, t: u32, node: u32) -> u32 {
        let n = &self.trie[t as usize];
        if n.last_child_node == node {
            return n.last_child;
        }
        self.trie_step_slow(t, node)
    }

    #[cold]
    fn trie_step_slow(&mut self, t: u32, node: u32) -> u32 {
        let c = match self.children.get(&(t, node)) {
            Some(&c) => c,
            None => {
                let (func, tag) = (self.trie[t as usize].func, self.trie[t as usize].start_tag);
                let c = self.new_trie_node(t, node, func, tag);
                self.children.insert((t, node), c);
                c
            }
        };
        let n = &mut self.trie[t as usize];
        n.last_child_node = node;
        n.last_child = c;
        c
    }

    /// The path number of prefix `t` ended by `end`, interned if new.
    #[inline]
    fn path_of(&mut self, t: u32, end: u32) -> u32 {
        let n = &self.trie[t as usize];
        if n.last_end == end {
            return n.last_end_path;
        }
        self.path_of_slow(t, end)
    }

    #[cold]
    fn path_of_slow(&mut self, t: u32, end: u32) -> u32 {
        let p = match self.ends.get(&(t, end)) {
            Some(&p) => p,
            None => {
                let mut nodes = Vec::new();
                let mut i = t;
                while i != NONE {
                    nodes.push(self.trie[i as usize].node);
                    i = self.trie[i as usize].parent;
                }
                let n = &self.trie[t as usize];
                let mut key = vec![n.func, n.start_tag];
                key.extend(nodes.iter().rev());
                key.push(end);
                let p = self.paths.len() as u32;
                self.paths.push(PathRec {
                    key: key.into(),
                    count: 0,
                    next_root: NONE,
                });
                self.ends.insert((t, end), p);
                p
            }
        };
        let n = &mut self.trie[t as usize];
        n.last_end = end;
        n.last_end_path = p;
        p
    }

    /// [`PathRecorder::call_child`] where it is cached (see [`cached_call_child`]).
    #[inline]
    fn cached_call_child(&self, parent: u32, func: u32) -> u32 {
        cached_call_child(&self.calltree, &self.call_cache, parent, func)
    }

    /// The call-tree child of `parent` for `func`; past [`CALL_TREE_MAX_DEPTH`] frames, the
    /// one [`DEEPER`] node under the last kept frame (its own child).
    fn call_child(&mut self, parent: u32, func: u32) -> u32 {
        let c = self.call_child_uncached(parent, func);
        self.call_cache[cache_slot(parent, func, CALL_CACHE_SLOTS)] = (parent, func, c);
        c
    }

    fn call_child_uncached(&mut self, parent: u32, func: u32) -> u32 {
        let p = &self.calltree[parent as usize];
        let func = if p.depth >= CALL_TREE_MAX_DEPTH {
            if p.func == DEEPER {
                return parent;
            }
            DEEPER
        } else {
            func
        };
        if p.last_func == func {
            return p.last_child;
        }
        let depth = p.depth + 1;
        let c = match self.call_child.get(&(parent, func)) {
            Some(&c) => c,
            None => {
                let c = self.calltree.len() as u32;
                self.calltree.push(CallNode {
                    parent,
                    func,
                    blocks: 0,
                    instructions: 0,
                    depth,
                    last_func: NONE,
                    last_child: NONE,
                });
                self.call_child.insert((parent, func), c);
                c
            }
        };
        let p = &mut self.calltree[parent as usize];
        p.last_func = func;
        p.last_child = c;
        c
    }

    /// Starts an activation of `func` at block `id`. The common case — the block's node and
    /// trie root known, the call-tree child cached under `parent_call`, room on the stack, no
    /// k-slab forest — is a few loads and the frame's store; anything else is prepared by
    /// [`PathRecorder::prepare_activation`] first.
    #[inline]
    fn push_activation(
        &mut self,
        func: u32,
        return_to: u64,
        parent_call: u32,
        id: u32,
        tables: &Tables,
    ) {
        let mut root = self.id_root[id as usize];
        let mut call_node = self.cached_call_child(parent_call, func);
        if root == NONE
            || call_node == NONE
            || self.id_node[id as usize].0 != func
            || self.stack.len() >= SHADOW_STACK_MAX
            || self.config.k > 0
        {
            (root, call_node) = self.prepare_activation(func, parent_call, id, tables);
        }
        let fun = &mut self.funcs[func as usize];
        fun.activations += 1;
        let pap = if fun.path_ends >= self.config.pap_threshold {
            self.pap_runs.root(fun)
        } else {
            NONE
        };
        self.stack.push(Activation {
            func,
            return_to,
            cur: root,
            len: 1,
            blocks: 0,
            instructions: 0,
            path_ends: 0,
            last_addr: self.id_addr[id as usize],
            pap,
            pap_len: 0,
            call_node,
            resume: NONE,
        });
    }

    /// What [`PathRecorder::push_activation`] does outside its common case: makes room on a
    /// full stack, creates the block's node and trie root and the call-tree child if new, and
    /// starts the k-slab forest's routine. Returns the trie root and the call-tree node.
    #[cold]
    #[inline(never)]
    fn prepare_activation(
        &mut self,
        func: u32,
        parent_call: u32,
        id: u32,
        tables: &Tables,
    ) -> (u32, u32) {
        if self.stack.len() >= SHADOW_STACK_MAX {
            self.drop_bottom(SHADOW_STACK_MAX / 2);
        }
        let node = self.node_of(func, id, tables);
        let root = match self.id_root[id as usize] {
            NONE => {
                let r = self.root(func, if node == 0 { START_ENTRY } else { START_HEAD }, node);
                self.id_root[id as usize] = r;
                r
            }
            r => r,
        };
        let call_node = self.call_child(parent_call, func);
        if self.config.k > 0 {
            let k = self.config.k;
            self.funcs[func as usize]
                .kslab
                .get_or_insert_with(|| KSlabForest::new(k).expect("k >= 1"))
                .routine_entry();
        }
        (root, call_node)
    }

    /// Counts one run of activation `a`'s current path ended by `end` (a back edge's head
    /// node, or [`END_EXIT`]): adds the blocks to `a`'s call-tree node and the path to `a`'s
    /// function. Returns its path number.
    #[inline]
    fn count_path(&mut self, a: &Activation, end: u32) -> u32 {
        let p = self.path_of(a.cur, end);
        self.paths[p as usize].count += 1;
        if self.config.k > 0 {
            self.kslab_push(a.func, p);
        }
        p
    }

    /// Feeds path `p` to function `func`'s k-slab forest (`--k`).
    #[cold]
    fn kslab_push(&mut self, func: u32, p: u32) {
        if let Some(k) = self.funcs[func as usize].kslab.as_mut() {
            k.push(PathId(p as u64));
        }
    }

    /// Adds the blocks and path ends an activation has accumulated to its call-tree node and
    /// function (when it ends, or when its frame is dropped), with its current path's when
    /// `with_current` (counted with `count_path` but not `end_path`).
    fn flush_counts(&mut self, a: &Activation, with_current: bool) {
        let (len, instr, ends) = if with_current {
            (a.len as u64, self.path_instructions(a.cur), 1)
        } else {
            (0, 0, 0)
        };
        let node = &mut self.calltree[a.call_node as usize];
        node.blocks += a.blocks + len;
        node.instructions += a.instructions + instr;
        self.funcs[a.func as usize].path_ends += a.path_ends + ends;
    }

    /// Guest instructions of the blocks on prefix `t` (0 for [`NONE`]).
    #[inline]
    pub(crate) fn path_instructions(&self, t: u32) -> u64 {
        self.trie.get(t as usize).map_or(0, |n| n.instr)
    }

    /// Ends the top activation's current path with `end` (a back edge's head node, or
    /// [`END_EXIT`]), counting it. Returns its path number.
    #[inline]
    fn end_path(&mut self, end: u32) -> u32 {
        let a = *self.stack.last().expect("an activation");
        let p = self.count_path(&a, end);
        let instr = self.path_instructions(a.cur);
        let top = self.stack.last_mut().expect("an activation");
        top.blocks += a.len as u64;
        top.instructions += instr;
        top.path_ends += 1;
        if top.pap != NONE {
            self.pap_runs.push(top, p);
        }
        p
    }

    /// Ends the top activation (its path ends at the exit) and pops it: `end_path(END_EXIT)`,
    /// then its counts go to its call-tree node and function and its PAP run is counted.
    #[inline]
    pub(crate) fn pop_activation(&mut self) {
        let mut a = self.stack.pop().expect("an activation");
        let p = self.count_path(&a, END_EXIT);
        let instr = self.path_instructions(a.cur);
        let node = &mut self.calltree[a.call_node as usize];
        node.blocks += a.blocks + a.len as u64;
        node.instructions += a.instructions + instr;
        self.funcs[a.func as usize].path_ends += a.path_ends + 1;
        if a.pap != NONE {
            self.pap_runs.push(&mut a, p);
            self.pap_runs.end(&a);
        }
    }

    /// Drops the `n` bottom frames of the shadow stack (it is full): each one's path ends
    /// there, counted as at an exit, and its PAP run is counted as it stands. A later return
    /// to one of them finds no frame and resynchronises.
    #[cold]
    fn drop_bottom(&mut self, n: usize) {
        let n = n.min(self.stack.len().saturating_sub(1));
        for i in 0..n {
            let mut a = self.stack[i];
            let p = self.count_path(&a, END_EXIT);
            self.flush_counts(&a, true);
            if a.pap != NONE {
                self.pap_runs.push(&mut a, p);
                self.pap_runs.end(&a);
            }
        }
        self.stack.drain(..n);
        self.dropped_frames += n as u64;
    }

    /// Replaces the top activation (if any) by one of `func` starting at `id`, keeping its
    /// return address (a tail call, or a resynchronisation).
    fn replace_activation(&mut self, func: u32, id: u32, tables: &Tables) {
        let (return_to, parent) = match self.stack.last() {
            Some(a) => (a.return_to, self.calltree[a.call_node as usize].parent),
            None => (0, 0),
        };
        if !self.stack.is_empty() {
            self.pop_activation();
        }
        self.push_activation(func, return_to, parent, id, tables);
    }

    /// Continues the top activation with block `id` (an intra-procedural edge): a back edge
    /// (to an address not above the last block's) ends the path and starts the next at `id`.
    /// Returns the number of the path it ended, or [`NONE`].
    #[inline]
    pub(crate) fn step_intra(&mut self, id: u32, tables: &Tables) -> u32 {
        let a = *self.stack.last().expect("an activation");
        let node = self.node_of(a.func, id, tables);
        let addr = self.id_addr[id as usize];
        if addr <= a.last_addr {
            // A back edge: the path ends here and the next starts at its head, `node`.
            let p = self.end_path(node);
            let root = match self.paths[p as usize].next_root {
                NONE => {
                    let r = self.root(a.func, START_HEAD, node);
                    self.paths[p as usize].next_root = r;
                    r
                }
                r => r,
            };
            let top = self.stack.last_mut().expect("an activation");
            top.cur = root;
            top.len = 1;
            top.last_addr = addr;
            p
        } else {
            let cur = self.trie_step(a.cur, node);
            let top = self.stack.last_mut().expect("an activation");
            top.cur = cur;
            top.len += 1;
            top.last_addr = addr;
            NONE
        }
    }

    /// Accounts a run of events in ring order (block, superblock and side-exit ids, and
    /// syscall events), every id of which `tables` knows. A superblock event waits for the
    /// next event to say how far its trace ran (see [`PathRecorder::end_of_stream`]).
    pub fn record(&mut self, events: &[u32], tables: &mut Tables) {
        if self.config.per_block {
            if let Some(&max) = events.iter().filter(|&&e| e & SYSCALL_EVENT == 0).max() {
                if max as usize >= self.id_addr.len() {
                    self.learn_known(tables);
                }
            }
            let mut expanded = std::mem::take(&mut self.expanded);
            expanded.clear();
            self.expander.expand(tables, events, &mut expanded);
            self.record_blocks(&expanded, tables);
            self.expanded = expanded;
        } else {
            self.record_events(events, tables);
        }
    }

    /// The stream has ended: a superblock still waiting for its next event ran to its end.
    pub fn end_of_stream(&mut self, tables: &Tables) {
        if self.config.per_block {
            let mut expanded = std::mem::take(&mut self.expanded);
            expanded.clear();
            self.expander.finish(tables, &mut expanded);
            self.record_blocks(&expanded, tables);
        } else {
            self.flush_pending(tables);
        }
    }

    /// Steps every basic block of `blocks` (syscall events are skipped; ids with no
    /// metadata, which only a translator gone mid-run leaves, too).
    fn record_blocks(&mut self, blocks: &[u32], tables: &Tables) {
        for &id in blocks {
            if id & SYSCALL_EVENT == 0 && (id as usize) < self.id_addr.len() {
                self.step(id, tables);
            }
        }
    }

    /// Steps basic block `id` through the shadow stack and the current path.
    #[inline]
    pub(crate) fn step(&mut self, id: u32, tables: &Tables) {
        let prev = std::mem::replace(&mut self.prev, id);
        if prev == NONE || self.stack.is_empty() {
            let f = self.function_containing(self.id_addr[id as usize]);
            self.push_activation(f, 0, 0, id, tables);
            return;
        }
        match self.id_kind[prev as usize] {
            K_CALL => {
                let f = match self.id_entry[id as usize] {
                    NONE => self.function_at(self.id_addr[id as usize]),
                    f => f,
                };
                let caller = self.stack.last_mut().expect("an activation");
                caller.resume = self.memo.last();
                let parent = caller.call_node;
                self.push_activation(f, self.id_ret[prev as usize], parent, id, tables);
            }
            K_RET => self.step_return(id, tables),
            kind => {
                let entry = self.id_entry[id as usize];
                let top = self.stack.last().expect("an activation");
                if entry != NONE && entry != top.func {
                    // A jump to another function's entry: a tail call.
                    self.resync(Resync::TailCall);
                    self.replace_activation(entry, id, tables);
                } else if kind == K_INDIRECT
                    && (self.id_node[id as usize].0 != top.func
                        || self.id_addr[id as usize] == top.return_to)
                {
                    self.step_indirect(id, tables);
                } else {
                    self.step_intra(id, tables);
                }
            }
        }
    }

    /// A `ret` to block `id`: pop the frame that returns there.
    #[cold]
    fn step_return(&mut self, id: u32, tables: &Tables) {
        let target = self.id_addr[id as usize];
        let depth = self.stack.iter().rposition(|a| a.return_to == target);
        match depth {
            Some(i) if i >= 1 => {
                if i + 1 != self.stack.len() {
                    self.resync(Resync::DeeperReturn);
                }
                while self.stack.len() > i {
                    self.pop_activation();
                }
                self.step_intra(id, tables);
            }
            _ => {
                // A return to no frame on the stack (the guest switched stacks, or returned
                // from the outermost activation): go on in the function containing it.
                self.resync(Resync::OrphanReturn);
                let f = self.function_containing(target);
                self.replace_activation(f, id, tables);
            }
        }
    }

    /// An indirect jump to a block not yet seen in the current function: a jump table in the
    /// same function, or a longjmp into a frame deeper in the stack, or a jump elsewhere.
    #[cold]
    fn step_indirect(&mut self, id: u32, tables: &Tables) {
        let addr = self.id_addr[id as usize];
        // `pop reg; jmp *reg` and friends: a jump to a frame's return address returns there.
        if let Some(i) = self
            .stack
            .iter()
            .rposition(|a| a.return_to == addr)
            .filter(|&i| i >= 1)
        {
            self.resync(Resync::JumpReturn);
            while self.stack.len() > i {
                self.pop_activation();
            }
            self.step_intra(id, tables);
            return;
        }
        let owner = |p: &PathRecorder, f: u32| {
            let fun = &p.funcs[f as usize];
            fun.nodes.contains_key(&addr)
                || match fun.symbol {
                    Some(s) => p.symbol_at(addr) == Some(s),
                    None => false,
                }
        };
        let top = self.stack.last().expect("an activation").func;
        if owner(self, top) || self.symbol_at(addr).is_none() {
            self.step_intra(id, tables);
            return;
        }
        if let Some(i) = (0..self.stack.len() - 1)
            .rev()
            .find(|&i| owner(self, self.stack[i].func))
        {
            self.resync(Resync::Unwind);
            while self.stack.len() > i + 1 {
                self.pop_activation();
            }
            self.step_intra(id, tables);
            return;
        }
        self.resync(Resync::ForeignJump);
        let f = self.function_containing(addr);
        self.replace_activation(f, id, tables);
    }

    /// Counts one resynchronisation of the shadow stack.
    #[inline]
    fn resync(&mut self, why: Resync) {
        self.resyncs += 1;
        self.resync_kinds[why as usize] += 1;
    }

    /// Ends every activation (the guest has ended, [`PathRecorder::end_of_stream`] was
    /// called): every block executed is then on a counted path. Adds the runs of memoised
    /// transitions to their paths' counts.
    pub fn finish(&mut self) {
        while !self.stack.is_empty() {
            self.pop_activation();
        }
        self.prev = NONE;
        self.settle_memos();
    }

    /// Distinct paths recorded so far.
    pub fn path_count(&self) -> usize {
        self.paths.len()
    }
}
