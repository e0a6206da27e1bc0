//! Emitting the calling-context steps of `call` and `ret` translations (`hotpath_contexts`,
//! rules 1 and 2; docs/paths-design.md, "Stage 1 as it will be built").
//!
//! A call, after the guest's push of its return address:
//!
//! ```text
//! borrow RCX, RAX (and RDX: an indirect call's callee, or a callee past ±2 GiB)
//! frame_top == FRAMES_END ? ──────────────────────────────────────────▶ exit "frames full"
//! frames[top] = { [rsp] (the return address just pushed), ctx, -, landing }; top += 1
//! node(ctx).cache[probes].key == !callee ? ctx = .child : ───────────▶ exit "cache miss"
//! give the registers back; go on to the callee (the chained jump, or the lookup)
//! ```
//!
//! An indirect jump checks the top frame the same way, merged with its lookup: its return
//! address is the target → exit "jump return" (rule 4, `pop; jmp *reg`).
//!
//! A return, merged with its lookup (one save of RAX and RDX for both, measured cheaper than
//! two sequences): the top frame's return address is the target → pop it and restore its
//! context, else exit "not the top frame"; then on to the frame's host address, or, when it
//! has none (0), the lookup. An empty stack's top frame is the sentinel, whose non-canonical
//! return address no `ret` that goes on can have (its host address is 0: the lookup misses
//! and the dispatcher raises the fault at the `ret`).
//!
//! A call stores as the frame's host address its *landing* (see [`Landing`]): a `lea` whose
//! rel32 is linked like a direct exit's `jmp` — first to an exit stub for the return point,
//! then to the return point's translation — so that the `ret` goes on at the caller's own
//! translation of the return point without probing the lookup table (a return stack, as
//! DynamoRIO's and QEMU's). A superblock's inlined calls have their stubs after its side exits.
//! Frames the runtime pushes hold 0 (the lookup), and so does every frame after a code cache
//! flush.
//!
//! Every compare is `lea`/`jrcxz`: the guest's flags are live across calls and returns. The
//! exits leave the guest's registers as at the end of the guest instruction (RCX in its scratch
//! slot, as every exit stub does) and the target in `ibl_target` where the dispatcher cannot
//! know it; the dispatcher runs the rule's slow path (`hotpath_contexts::Contexts`) and goes on
//! at the target. Nothing here can fault: the guest stack slot was just written by the push,
//! the frames are in the thread area, the nodes in the context arena.

use dynasmrt::{dynasm, x64::X64Relocation, DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler};
use hotpath_contexts::{ContextArea, Frame, Node, MAX_DEPTH};
use hotpath_events::ContextEvent;
use hotpath_ir::{GuestAddr, HostAddr};

use crate::gateway::{emit_ibl_lookup, Gateway, GS};
use crate::stubs;
use crate::thread_area::off;

/// GS offset of `frames[top]` when `frame_top` is in RAX: `CONTEXTS + RAX`.
const FRAME: i32 = off::CONTEXTS;

/// `frame_top` of a full stack.
const FRAMES_END: i32 = ContextArea::FRAMES_END as i32;

/// Bytes of a frame, and its fields' offsets ([`Frame`]).
const FRAME_BYTES: i32 = std::mem::size_of::<Frame>() as i32;
const RETURN_TO: i32 = std::mem::offset_of!(Frame, return_to) as i32;
const CALLER: i32 = std::mem::offset_of!(Frame, caller) as i32;
const HOST: i32 = std::mem::offset_of!(Frame, host) as i32;

/// Where a call's frame says its `ret` goes on (the frame's host address; module doc). The
/// RIP-relative `lea` that makes it is a patchable site, as a direct exit's `jmp` is: its
/// rel32 (4-byte aligned) first aims at the call's landing stub, an exit stub for the return
/// point, and the dispatcher links it to the return point's translation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Landing {
    /// Host address of the assembler's offset 0 (to align the rel32).
    pub base: u64,
    /// The landing stub's label in the same assembler, or `None`: the rel32 is left 0 for the
    /// caller to aim.
    pub stub: Option<DynamicLabel>,
}

/// Exit indices of one call's slow paths.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallExits {
    /// The frame stack is full (nothing pushed yet).
    pub full: u32,
    /// The frame is pushed; the node's cache entry did not hold the callee.
    pub miss: u32,
}

/// Appends a direct call's context step for the function entered at `callee`, which probes
/// the cache entries [`Node::direct_probes`]`(callee)` in order; `landing` is where its return
/// goes on. Returns the offset in `ops` of the landing site's rel32.
pub(crate) fn direct_call(
    ops: &mut VecAssembler<X64Relocation>,
    callee: GuestAddr,
    exits: CallExits,
    exit_addr: usize,
    landing: Landing,
) -> usize {
    let near = borrow_registers(ops, callee.0);
    let full = ops.new_dynamic_label();
    let site = push_frame(ops, full, landing);
    let miss = ops.new_dynamic_label();
    let store = ops.new_dynamic_label();
    probe_cache(ops, &Node::direct_probes(callee.0), near, miss, store);
    dynasm!(ops
        ; .arch x64
        ; =>miss
        ; mov ecx, exits.miss as i32
        ; jmp >leave
        ; =>full
        ; mov ecx, exits.full as i32
        ; leave:
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
    );
    restore_rdx(ops, near.is_none());
    dynasm!(ops
        ; .arch x64
        ; jmp extern exit_addr
        ; =>store
        ; .u8 GS ; mov QWORD [off::CTX], rcx
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
    );
    restore_rdx(ops, near.is_none());
    site
}

/// Appends an indirect call's context step (the cache entries of [`Node::indirect_probes`]):
/// the callee in RCX, the guest's RCX in its scratch slot, both as they are after it;
/// `landing` and the result as for [`direct_call`].
pub(crate) fn indirect_call(
    ops: &mut VecAssembler<X64Relocation>,
    exits: CallExits,
    exit_addr: usize,
    landing: Landing,
) -> usize {
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::SCRATCH_RAX], rax
        ; .u8 GS ; mov QWORD [off::SCRATCH_RDX], rdx
        ; mov rdx, rcx
    );
    let full = ops.new_dynamic_label();
    let site = push_frame(ops, full, landing);
    let miss = ops.new_dynamic_label();
    let store = ops.new_dynamic_label();
    probe_cache(ops, &Node::indirect_probes(), None, miss, store);
    dynasm!(ops
        ; .arch x64
        ; =>miss
        ; mov ecx, exits.miss as i32
        ; jmp >leave
        ; =>full
        ; mov ecx, exits.full as i32
        ; leave:
        ; .u8 GS ; mov QWORD [off::IBL_TARGET], rdx
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
        ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
        ; jmp extern exit_addr
        ; =>store
        ; .u8 GS ; mov QWORD [off::CTX], rcx
        ; mov rcx, rdx
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
        ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
    );
    site
}

/// The frame push shared by both calls: RAX and RCX borrowed; jumps to `full` when the stack
/// is full; leaves the current node's host address in RAX. Returns the offset of the landing
/// site's rel32.
fn push_frame(
    ops: &mut VecAssembler<X64Relocation>,
    full: DynamicLabel,
    landing: Landing,
) -> usize {
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov rax, QWORD [off::FRAME_TOP]
        ; lea rcx, [rax - FRAMES_END]
        ; jrcxz >full_hop
        ; jmp >room
        ; full_hop:
        ; jmp =>full
        ; room:
        ; mov rcx, QWORD [rsp]
        ; .u8 GS ; mov QWORD [rax + FRAME + RETURN_TO], rcx
    );
    // `lea rcx, [rip + rel32]`: three bytes before the rel32.
    stubs::align_patchable(ops, landing.base, 3);
    match landing.stub {
        Some(l) => dynasm!(ops ; .arch x64 ; lea rcx, [=>l]),
        None => dynasm!(ops ; .arch x64 ; .u8 0x48 ; .u8 0x8d ; .u8 0x0d ; .u32 0),
    }
    let site = ops.offset().0 - 4;
    dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [rax + FRAME + HOST], rcx);
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov rcx, QWORD [off::CTX]
        ; .u8 GS ; mov QWORD [rax + FRAME + CALLER], rcx
        ; lea rax, [rax + FRAME_BYTES]
        ; .u8 GS ; mov QWORD [off::FRAME_TOP], rax
        ; mov rax, rcx
    );
    site
}

/// Appends a return's frame check and pop merged with its lookup: the target in RCX (the
/// guest's RCX in its scratch slot, RSP already past the return address). A target that is
/// not the top frame's return address exits with index `mismatch` (target in `ibl_target`);
/// else the frame is popped and the return goes on at its host address, or, when it has none,
/// through the lookup.
pub(crate) fn return_and_lookup(
    ops: &mut VecAssembler<X64Relocation>,
    mismatch: u32,
    gateway: &Gateway,
) {
    compare_top_frame(ops);
    pop_and_go(ops, mismatch, gateway);
}

/// The rest of a return after [`compare_top_frame`]: RCX zero iff the top frame's return
/// address is the target (in RDX), RAX `frame_top`, the guest's RAX, RCX and RDX in their
/// scratch slots. See [`return_and_lookup`].
fn pop_and_go(ops: &mut VecAssembler<X64Relocation>, mismatch: u32, gateway: &Gateway) {
    let exit_addr = gateway.exit.0 as usize;
    dynasm!(ops
        ; .arch x64
        ; jrcxz >pop
        ; .u8 GS ; mov QWORD [off::IBL_TARGET], rdx
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
        ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
        ; mov ecx, mismatch as i32
        ; jmp extern exit_addr
        ; pop:
        ; .u8 GS ; mov rcx, QWORD [rax + FRAME - FRAME_BYTES + CALLER]
        ; .u8 GS ; mov QWORD [off::CTX], rcx
        ; .u8 GS ; mov rcx, QWORD [rax + FRAME - FRAME_BYTES + HOST]
        ; lea rax, [rax - FRAME_BYTES]
        ; .u8 GS ; mov QWORD [off::FRAME_TOP], rax
        ; jrcxz >lookup
        ; .u8 GS ; mov QWORD [off::JUMP_TO], rcx
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
        ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
        ; .u8 GS ; jmp QWORD [off::JUMP_TO]
        ; lookup:
    );
    emit_ibl_lookup(ops, gateway);
}

/// Appends an indirect jump's check for rule 4 merged with its lookup: the target in RCX (the
/// guest's RCX in its scratch slot). A target that is the top frame's return address (`pop;
/// jmp *reg` returning for a `ret`) exits with index `jump_return` (target in `ibl_target`),
/// for the runtime to pop to it; any other goes on through the lookup.
pub(crate) fn jump_and_lookup(
    ops: &mut VecAssembler<X64Relocation>,
    jump_return: u32,
    gateway: &Gateway,
) {
    let exit_addr = gateway.exit.0 as usize;
    compare_top_frame(ops);
    dynasm!(ops
        ; .arch x64
        ; jrcxz >ret
        ; jmp >lookup
        ; ret:
        ; .u8 GS ; mov QWORD [off::IBL_TARGET], rdx
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
        ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
        ; mov ecx, jump_return as i32
        ; jmp extern exit_addr
        ; lookup:
    );
    emit_ibl_lookup(ops, gateway);
}

/// The context step of a `ret` inlined in a superblock, whose return address (at [rsp]) was
/// found to be the next block's, whose negation is `minus_next`: the guest's RCX in its
/// scratch slot, RCX borrowed. Leaves RCX zero iff the top frame returns there too, and then
/// has popped it (and restored its context); RAX (and RDX) are given back either way.
pub(crate) fn inline_return(ops: &mut VecAssembler<X64Relocation>, minus_next: i64) {
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::SCRATCH_RAX], rax
        ; .u8 GS ; mov rax, QWORD [off::FRAME_TOP]
        ; .u8 GS ; mov rcx, QWORD [rax + FRAME - FRAME_BYTES + RETURN_TO]
    );
    match i32::try_from(minus_next) {
        Ok(disp) => dynasm!(ops ; .arch x64 ; lea rcx, [rcx + disp]),
        Err(_) => dynasm!(ops
            ; .arch x64
            ; .u8 GS ; mov QWORD [off::SCRATCH_RDX], rdx
            ; mov rdx, QWORD minus_next
            ; lea rcx, [rcx + rdx]
            ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
        ),
    }
    dynasm!(ops
        ; .arch x64
        ; jrcxz >pop
        ; jmp >done
        ; pop:
        ; .u8 GS ; mov rcx, QWORD [rax + FRAME - FRAME_BYTES + CALLER]
        ; .u8 GS ; mov QWORD [off::CTX], rcx
        ; lea rax, [rax - FRAME_BYTES]
        ; .u8 GS ; mov QWORD [off::FRAME_TOP], rax
        ; mov ecx, 0
        ; done:
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
    );
}

/// Saves RAX and RDX, moves the target from RCX to RDX, loads `frame_top` into RAX and leaves
/// RCX zero iff the top frame's return address is the target.
fn compare_top_frame(ops: &mut VecAssembler<X64Relocation>) {
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::SCRATCH_RAX], rax
        ; .u8 GS ; mov QWORD [off::SCRATCH_RDX], rdx
        ; mov rdx, rcx
        ; .u8 GS ; mov rax, QWORD [off::FRAME_TOP]
        ; .u8 GS ; mov rcx, QWORD [rax + FRAME - FRAME_BYTES + RETURN_TO]
        ; not rcx
        ; lea rcx, [rcx + rdx + 1]
    );
}

/// Emits the *jump entry* of the function entered at `entry` (rule 3), whose block is at
/// `block`: jumps (not calls) to the entry go through it. The current context's function is
/// `entry` (a loop through the entry, or a call that went through the lookup), or the context
/// is the `[deeper]` one (frames past `MAX_DEPTH` are not told apart) → on to the block. Else
/// a tail call: the parent's child cache holds `entry` → that sibling becomes the context
/// (counted in the area's `tail_calls`); else exit with index `tail_call` (the guest's
/// registers as at the jump, RCX in its scratch slot), for the runtime to make it. With
/// `ring_entries` (the monitor is on), a tail call made here writes its context event
/// ([`ContextEvent::TAIL_CALL_WORD`]) before the block's own event.
pub(crate) fn jump_entry(
    ops: &mut VecAssembler<X64Relocation>,
    entry: GuestAddr,
    block: HostAddr,
    tail_call: u32,
    ring_entries: Option<u64>,
    exit_addr: usize,
) {
    let function = Node::FUNCTION as i32;
    let depth = Node::DEPTH as i32;
    let parent = Node::PARENT as i32;
    let deeper = MAX_DEPTH as i32 + 1;
    let near = borrow_registers(ops, entry.0);
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov rax, QWORD [off::CTX]
        ; mov rcx, QWORD [rax + function]
        ; not rcx
    );
    // RCX = entry - function: 0 iff the context's function is the entry.
    match near {
        Some(plus1) => dynasm!(ops ; .arch x64 ; lea rcx, [rcx + plus1]),
        None => dynasm!(ops ; .arch x64 ; lea rcx, [rcx + rdx + 1]),
    }
    let same = ops.new_dynamic_label();
    let slow = ops.new_dynamic_label();
    let store = ops.new_dynamic_label();
    dynasm!(ops
        ; .arch x64
        ; jrcxz >same_hop
        ; mov ecx, DWORD [rax + depth]
        ; lea ecx, [rcx - deeper]
        ; jrcxz >same_hop
        ; mov rax, QWORD [rax + parent]
        ; mov rcx, rax
        ; jrcxz >slow_hop
        ; jmp >probe
        ; same_hop:
        ; jmp =>same
        ; slow_hop:
        ; jmp =>slow
        ; probe:
    );
    probe_cache(ops, &Node::direct_probes(entry.0), near, slow, store);
    dynasm!(ops
        ; .arch x64
        ; =>slow
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
    );
    restore_rdx(ops, near.is_none());
    dynasm!(ops
        ; .arch x64
        ; mov ecx, tail_call as i32
        ; jmp extern exit_addr
        ; =>store
        ; .u8 GS ; mov QWORD [off::CTX], rcx
        ; .u8 GS ; mov rcx, QWORD [off::TAIL_CALLS]
        ; lea rcx, [rcx + 1]
        ; .u8 GS ; mov QWORD [off::TAIL_CALLS], rcx
    );
    if let Some(ring_entries) = ring_entries {
        // Every guest register back, then the event, as a block's head writes its own.
        dynasm!(ops
            ; .arch x64
            ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
            ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
        );
        restore_rdx(ops, near.is_none());
        let stub = ops.new_dynamic_label();
        dynasm!(ops ; .arch x64 ; jmp =>stub);
        stubs::enqueue_stub_at(
            ops,
            stub,
            ContextEvent::TAIL_CALL_WORD,
            ring_entries,
            stubs::Slow::Resume,
            stubs::RcxSave::Scratch,
            exit_addr,
        );
        dynasm!(ops ; .arch x64 ; jmp extern block.0 as usize);
    }
    dynasm!(ops
        ; .arch x64
        ; =>same
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
    );
    restore_rdx(ops, near.is_none());
    dynasm!(ops ; .arch x64 ; jmp extern block.0 as usize);
}

/// Probes the child cache entries `slots` of the node in RAX for the callee whose `entry + 1`
/// is `plus1` (or, with `None`, whose entry is in RDX): on a hit, loads the entry's child into
/// RCX and jumps to `store`; else jumps to `miss`. Clobbers RCX. (`jrcxz` reaches 127 bytes:
/// each hit's load sits right after the probes.)
fn probe_cache(
    ops: &mut VecAssembler<X64Relocation>,
    slots: &[usize],
    plus1: Option<i32>,
    miss: DynamicLabel,
    store: DynamicLabel,
) {
    let hits: Vec<(i32, DynamicLabel)> = slots
        .iter()
        .map(|&slot| (Node::cache_key_offset(slot) as i32, ops.new_dynamic_label()))
        .collect();
    for &(key, hit) in &hits {
        dynasm!(ops ; .arch x64 ; mov rcx, QWORD [rax + key]);
        match plus1 {
            Some(imm) => dynasm!(ops ; .arch x64 ; lea rcx, [rcx + imm]),
            None => dynasm!(ops ; .arch x64 ; lea rcx, [rcx + rdx + 1]),
        }
        dynasm!(ops ; .arch x64 ; jrcxz =>hit);
    }
    dynasm!(ops ; .arch x64 ; jmp =>miss);
    for &(key, hit) in &hits {
        dynasm!(ops ; .arch x64 ; =>hit ; mov rcx, QWORD [rax + key + 8] ; jmp =>store);
    }
}

/// Borrows RCX and RAX (into their scratch slots) for a step that compares with the function
/// entry `entry`. Returns `entry + 1` when it fits an immediate (`!key + entry + 1 == 0` iff
/// the key is `entry`'s); else RDX is borrowed too and holds `entry`, and `None` is returned.
fn borrow_registers(ops: &mut VecAssembler<X64Relocation>, entry: u64) -> Option<i32> {
    let plus1 = i32::try_from(entry.wrapping_add(1) as i64).ok();
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx
        ; .u8 GS ; mov QWORD [off::SCRATCH_RAX], rax
    );
    if plus1.is_none() {
        dynasm!(ops
            ; .arch x64
            ; .u8 GS ; mov QWORD [off::SCRATCH_RDX], rdx
            ; mov rdx, QWORD entry as i64
        );
    }
    plus1
}

/// Gives RDX back when it was borrowed.
fn restore_rdx(ops: &mut VecAssembler<X64Relocation>, borrowed: bool) {
    if borrowed {
        dynasm!(ops ; .arch x64 ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]);
    }
}
