//! Emitting the path register's steps of instrumented translations (#21 stage 2;
//! docs/paths-design.md, "Step 3 broken down", 3c): what an instrumented block does with the
//! Ball-Larus register `r` (`ContextArea::path`) and the current context's path counters
//! (`Node::counters`) when an activation starts, on a forward edge, and where a path ends (a
//! back edge, the activation's end). The values come from the monitor's numbering of the
//! function (`hotpath_monitor::Numbering`: Ball-Larus lecture steps 1–3).
//!
//! ```text
//! start:  node(ctx).numbering == N ? r = start : ─────────────▶ exit "no counters for N"
//! edge:   r += add                       (chords of the spanning tree only)
//! end:    node(ctx).counters[r + end] += 1; r = restart   (a back edge; the exit: no restart)
//! ```
//!
//! Every step runs where all guest registers are live and leaves them so: it borrows RCX (and
//! RAX for a path's end, RDX for an increment that does not fit 32 bits) through their scratch
//! slots and changes
//! no flag (`mov`, `lea`, `jrcxz`), since the guest's flags are live across every edge. Nothing
//! here faults: the thread area, the node and its counters are hotpath's memory, and a path id
//! is below the array's length by the numbering's construction.

use dynasmrt::{dynasm, x64::X64Relocation, DynasmApi, DynasmLabelApi, VecAssembler};
use hotpath_contexts::Node;

use crate::gateway::GS;
use crate::thread_area::off;

/// Appends an activation's start at its function's entry: the current context's counters
/// must be numbering `numbering`'s, else the step exits with index `miss` — the guest's
/// registers as at the block's start, RCX in its scratch slot, as every exit leaves them — for
/// the runtime to make them (`Contexts::path_counters`) and come back to the block; then
/// `r = start`.
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
    dynasm!(ops ; .arch x64 ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]);
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

/// Appends a path's end: the current context's counter of path `r + end` (mod 2^64) goes up
/// by one; then, on a back edge (`restart`), `r = restart` starts the next path. At the
/// activation's end (`None`) the register is left as it is.
pub fn path_end(ops: &mut VecAssembler<X64Relocation>, end: u64, restart: Option<u64>) {
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx
        ; .u8 GS ; mov QWORD [off::SCRATCH_RAX], rax
        ; .u8 GS ; mov rcx, QWORD [off::PATH]
    );
    add_to_rcx(ops, end);
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov rax, QWORD [off::CTX]
        ; mov rax, QWORD [rax + Node::COUNTERS as i32]
        ; lea rax, [rax + rcx * 8]
        ; mov rcx, QWORD [rax]
        ; lea rcx, [rcx + 1]
        ; mov QWORD [rax], rcx
    );
    if let Some(restart) = restart {
        set_register(ops, restart);
    }
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
    );
}

/// `rcx += value` (mod 2^64), flag-free; RDX is borrowed when `value` does not fit a
/// sign-extended 32-bit displacement.
pub(crate) fn add_to_rcx(ops: &mut VecAssembler<X64Relocation>, value: u64) {
    match i32::try_from(value as i64) {
        Ok(0) => {}
        Ok(disp) => dynasm!(ops ; .arch x64 ; lea rcx, [rcx + disp]),
        Err(_) => dynasm!(ops
            ; .arch x64
            ; .u8 GS ; mov QWORD [off::SCRATCH_RDX], rdx
            ; mov rdx, QWORD value as i64
            ; lea rcx, [rcx + rdx]
            ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
        ),
    }
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
