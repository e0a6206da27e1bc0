//! Shadow-stack frames, call-tree nodes, the resynchronisation causes and the terminator
//! classes the stack steps by (the stack's rules are `stack.rs`).

use super::ids::{cache_slot, NONE};

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

/// `CallNode::last_func` of the one node of a recorder that keeps no call tree
/// (`PathConfig::call_tree` off): every call stays in it.
pub(crate) const ANY_FUNC: u32 = NONE - 1;

/// Slots of the direct-mapped call-tree cache, a power of two (12 bytes each: 48 KiB).
pub(crate) const CALL_CACHE_SLOTS: usize = 1 << 12;

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
    if p.last_func == func || p.last_func == ANY_FUNC {
        return p.last_child;
    }
    let (cp, cf, c) = call_cache[cache_slot(parent, func, call_cache.len())];
    if cp == parent && cf == func {
        c
    } else {
        NONE
    }
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
    /// [`Recorder::Sums`]: its current path's Ball-Larus sum so far (the id of the path that
    /// would end at its last block with the activation), that last block's node, and the
    /// path's guest instructions so far.
    pub(crate) r: u64,
    pub(crate) last_node: u32,
    pub(crate) path_instr: u64,
}

impl Activation {
    /// A frame of `func` just started: returning to `return_to` (0: none known), under
    /// call-tree node `call_node`, recording the PAP run from `pap` ([`NONE`]: none), its path
    /// one block long, at guest address `last_addr`, with no trie node and no sum yet.
    #[inline]
    pub(crate) fn new(
        func: u32,
        return_to: u64,
        call_node: u32,
        pap: u32,
        last_addr: u64,
    ) -> Activation {
        Activation {
            func,
            return_to,
            cur: NONE,
            len: 1,
            blocks: 0,
            instructions: 0,
            path_ends: 0,
            last_addr,
            pap,
            pap_len: 0,
            call_node,
            r: 0,
            last_node: NONE,
            path_instr: 0,
        }
    }
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
    pub(crate) last_func: u32,
    pub(crate) last_child: u32,
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
    /// An indirect jump into a function deeper in the stack (longjmp), or a `ret` there to no
    /// frame's return address (an exception raised by `ret`, as OCaml's): the frames above
    /// it are popped.
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
