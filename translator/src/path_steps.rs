//! Emitting the path register's steps of instrumented translations (#21 stage 2;
//! docs/paths-design.md, "Step 3 broken down", 3c, and "Step 3d as built"): what an
//! instrumented block does with the Ball-Larus register `r` (`ContextArea::path`), the run
//! register (`ContextArea::run`, a node of the thread's PAP run trie) and the current context's
//! path counters (`Node::counters`) when an activation starts, on a forward edge, and where a
//! path ends (a back edge, the activation's end). The values come from the monitor's numbering
//! of the function (`hotpath_monitor::Numbering`: Ball-Larus lecture steps 1–3).
//!
//! ```text
//! start:  node(ctx).numbering == N ? r = start; run = counters' run root
//!                                  : ──────────────────────────▶ exit "no counters for N"
//! edge:   r += add                       (chords of the spanning tree only)
//! end:    p = r + end
//!         run != 0: run = its child for p: the cached one, the dense array's, or a new first
//!                   child (taken from the area's supply) ──none of those──▶ exit "run step
//!                   missed"   (the activation's end: the child's count += 1)
//!         node(ctx).counters[p] += 1; r = restart     (a back edge; the activation's end: no
//!                                                      restart)
//! ```
//!
//! A missed run step has changed nothing yet: the runtime does the whole path end (and, at an
//! activation's end, the `ret`) and goes on at the next block.
//!
//! Every step runs where all guest registers are live and leaves them so: it borrows RCX (and
//! RAX and RDX for a path's end, RDX for an increment that does not fit 32 bits) through their
//! scratch slots and changes no flag (`mov`, `lea`, `not`, `jrcxz`), since the guest's flags
//! are live across every edge. Nothing here faults: the thread area, the node, its counters
//! and the run trie are hotpath's memory, and a path id is below the array's length by the
//! numbering's construction.

use dynasmrt::{dynasm, x64::X64Relocation, DynasmApi, DynasmLabelApi, VecAssembler};
use hotpath_contexts::{Node, RunNode, RUN_PATHS_MAX, RUN_ROOT_OFFSET};

use crate::gateway::GS;
use crate::stubs::add_to_rcx;
use crate::thread_area::off;

/// Appends an activation's start at its function's entry: the current context's counters
/// must be numbering `numbering`'s, else the step exits with index `miss` — the guest's
/// registers as at the block's start, RCX in its scratch slot, as every exit leaves them — for
/// the runtime to make them (`Contexts::path_counters`) and come back to the block; then
/// `r = start` and the run register is the root in the counters' header.
pub fn path_start(
    ops: &mut VecAssembler<X64Relocation>,
    numbering: u32,
    start: u64,
    miss: u32,
    exit_addr: usize,
) {
    let minus = -(numbering as i32);
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx
        ; .u8 GS ; mov rcx, QWORD [off::CTX]
        ; mov rcx, QWORD [rcx + Node::NUMBERING as i32]
        ; lea rcx, [rcx + minus]
        ; jrcxz >counting
        ; mov ecx, miss as i32
        ; jmp extern exit_addr
        ; counting:
    );
    set_register(ops, start);
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov rcx, QWORD [off::CTX]
        ; mov rcx, QWORD [rcx + Node::COUNTERS as i32]
        ; mov rcx, QWORD [rcx + RUN_ROOT_OFFSET]
        ; .u8 GS ; mov QWORD [off::RUN], rcx
        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
    );
}

/// Appends a forward edge's step: `r += add` (mod 2^64); nothing for 0 (an edge of the
/// spanning tree).
pub fn path_add(ops: &mut VecAssembler<X64Relocation>, add: u64) {
    if add == 0 {
        return;
    }
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx
        ; .u8 GS ; mov rcx, QWORD [off::PATH]
    );
    add_to_rcx(ops, add);
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::PATH], rcx
        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
    );
}

/// Appends a path's end: path `p = r + end` (mod 2^64) steps the run register to its child
/// for `p` when it has one — through the run node's cache, its dense child array, or, for a
/// node with no child yet, a node taken from the area's supply right here — else the step
/// exits with index `miss`, nothing changed, the guest's registers as at the step's start and
/// RCX in its scratch slot; then `p`'s counter in the current context goes up by one. On a
/// back edge (`restart`), `r = restart` starts the next path; at the activation's end (`None`)
/// the run that ends at the child is counted and the registers are left as they are.
pub fn path_end(
    ops: &mut VecAssembler<X64Relocation>,
    end: u64,
    restart: Option<u64>,
    miss: u32,
    exit_addr: usize,
) {
    let [cache_id, cache_child, count, children, parent, path, depth, made] = [
        RunNode::CACHE_ID,
        RunNode::CACHE_CHILD,
        RunNode::COUNT,
        RunNode::CHILDREN,
        RunNode::PARENT,
        RunNode::PATH,
        RunNode::DEPTH,
        RunNode::MADE,
    ]
    .map(|o| o as i32);
    let deepest = RUN_PATHS_MAX as i32;
    let node_bytes = RunNode::SIZE as i32;
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx
        ; .u8 GS ; mov QWORD [off::SCRATCH_RAX], rax
        ; .u8 GS ; mov rax, QWORD [off::PATH]
    );
    match i32::try_from(end as i64) {
        Ok(0) => {}
        Ok(disp) => dynasm!(ops ; .arch x64 ; lea rax, [rax + disp]),
        Err(_) => dynasm!(ops
            ; .arch x64
            ; mov rcx, QWORD end as i64
            ; lea rax, [rax + rcx]
        ),
    }
    // RAX = p; RDX = the run node; RCX = the child once found.
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov rcx, QWORD [off::RUN]
        ; jrcxz >count
        ; .u8 GS ; mov QWORD [off::SCRATCH_RDX], rdx
        ; mov rdx, rcx
        ; mov rcx, QWORD [rdx + cache_id]
        ; not rcx
        ; lea rcx, [rcx + rax + 2]
        ; jrcxz >hit
        ; jmp >slow
        ; hit:
        ; mov rcx, QWORD [rdx + cache_child]
        ; found:
    );
    if restart.is_some() {
        dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [off::RUN], rcx);
    } else {
        dynasm!(ops
            ; .arch x64
            ; mov rdx, QWORD [rcx + count]
            ; lea rdx, [rdx + 1]
            ; mov QWORD [rcx + count], rdx
        );
    }
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
        ; count:
        ; .u8 GS ; mov rcx, QWORD [off::CTX]
        ; mov rcx, QWORD [rcx + Node::COUNTERS as i32]
        ; lea rcx, [rcx + rax * 8]
        ; mov rax, QWORD [rcx]
        ; lea rax, [rax + 1]
        ; mov QWORD [rcx], rax
    );
    if let Some(restart) = restart {
        set_register(ops, restart);
    }
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
        ; jmp >done
        // Not the cached child: the dense array's, if the node has one.
        ; slow:
        ; mov rcx, QWORD [rdx + children]
        ; jrcxz >no_dense
        ; mov rcx, QWORD [rcx + rax * 8]
        ; jrcxz >miss
        ; jmp <found
        // No child at all yet: make the first one (a node from the supply), unless the run
        // is as long as runs get or no node is left.
        ; no_dense:
        ; mov rcx, QWORD [rdx + cache_id]
        ; jrcxz >first
        ; miss:
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
        ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
        ; mov ecx, miss as i32
        ; jmp extern exit_addr
        ; first:
        ; mov rcx, QWORD [rdx + depth]
        ; lea rcx, [rcx - deepest]
        ; jrcxz <miss
        ; .u8 GS ; mov rcx, QWORD [off::RUN_LEFT]
        ; jrcxz <miss
        ; lea rcx, [rcx - 1]
        ; .u8 GS ; mov QWORD [off::RUN_LEFT], rcx
        ; .u8 GS ; mov rcx, QWORD [off::RUN_NEXT]
        ; mov QWORD [rcx + parent], rdx
        ; mov QWORD [rcx + path], rax
        ; lea rax, [rax + 1]
        ; mov QWORD [rdx + cache_id], rax
        ; mov QWORD [rdx + cache_child], rcx
        ; mov rax, QWORD [rdx + depth]
        ; lea rax, [rax + 1]
        ; mov QWORD [rcx + depth], rax
        ; mov QWORD [rcx + made], 1
        ; lea rax, [rcx + node_bytes]
        ; .u8 GS ; mov QWORD [off::RUN_NEXT], rax
        ; mov rax, QWORD [rcx + path]
        ; jmp <found
        ; done:
    );
}

/// `r = value`, with RCX borrowed.
fn set_register(ops: &mut VecAssembler<X64Relocation>, value: u64) {
    match i32::try_from(value as i64) {
        Ok(imm) => dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [off::PATH], imm),
        Err(_) => dynasm!(ops
            ; .arch x64
            ; mov rcx, QWORD value as i64
            ; .u8 GS ; mov QWORD [off::PATH], rcx
        ),
    }
}
