//! Code pieces every emitter of translated code shares (blocks, superblocks, jump tables): the
//! enqueue stub that writes an event to the ring, and the padding that keeps a patchable
//! branch's rel32 aligned. Below `emit`, which uses them.

use dynasmrt::{dynasm, x64::X64Relocation, DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler};
use iced_x86::Register;

use crate::backend::gateway::{EXIT_RING_FULL, GS};
use crate::host::thread_area::off;

/// The x86 register number (0 = RAX … 15 = R15) of a 64-bit general-purpose register.
pub(crate) fn gpr(r: Register) -> u8 {
    debug_assert!(r.is_gpr64());
    (r as u32 - Register::RAX as u32) as u8
}

/// What an enqueue stub does when the ring's lap is full (`cursor == 0`).
#[derive(Clone, Copy)]
pub(crate) enum Slow {
    /// Exit with `EXIT_RING_FULL`, resuming at the stub's entry afterwards (a block or
    /// superblock head).
    Resume,
    /// Exit through exit index `n` (a superblock's side exit: the dispatcher enqueues the event
    /// itself and goes on at the exit's target).
    Exit(u32),
}

/// Where an enqueue stub keeps the guest's RCX while it uses RCX for the ring's cursor
/// (`jrcxz` is the only flag-free conditional branch, and it tests RCX).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RcxSave {
    /// In the thread area's scratch slot: one store and one load (always possible).
    Scratch,
    /// Nowhere: RCX is dead at the block's entry (see `hotpath_ir::scratch_register`).
    Dead,
    /// In this 64-bit register, dead at the block's entry: two register moves.
    Register(Register),
}

impl RcxSave {
    /// The cheapest way for the stub at the head of `body` (the guest instructions that run
    /// right after it).
    pub(crate) fn for_body(body: &[hotpath_ir::Inst]) -> RcxSave {
        match hotpath_ir::scratch_register(body) {
            None => RcxSave::Scratch,
            Some(Register::RCX) => RcxSave::Dead,
            Some(r) => RcxSave::Register(r),
        }
    }
}

/// Where an enqueue stub's parts are, as offsets from the assembler's start.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EnqueueStub {
    /// The stub's entry (after its slow path).
    pub entry: u64,
    /// The 4-byte event the stub writes.
    pub event_at: u64,
    /// The slow path's `rel32` to the gateway's exit.
    pub exit_at: u64,
}

/// Appends an enqueue stub for event `event` on a ring of `ring_entries` entries: its slow
/// path first, then the entry, which loads the ring's cursor (`jrcxz` to the slow path when
/// the lap is full), stores `event` at `entries_end[cursor]`, advances the cursor and gives
/// RCX back. Flag-free. The guest's RCX is kept as `save` says; with `RcxSave::Dead` or
/// `RcxSave::Register` the stub clobbers a register the guest overwrites before it reads it,
/// so the guest cannot tell (the dispatcher never delivers a signal at a stub's entry after a
/// ring refill, see `Next::Resume`). Returns where its entry and relocated fields are.
///
/// The cursor is the only state and a signal handler never touches it (a pending signal
/// unlinks the blocks instead, see `signals`), so a stub a signal interrupts just finishes.
/// Until its cursor store the stub changes nothing the guest could see, so the slow path
/// resumes at its entry and runs it again after the refill.
// dynasm's `Rq(n)` expands to `n.into()`, which clippy finds useless for a `u8`.
#[allow(clippy::useless_conversion)]
pub(crate) fn enqueue_stub(
    ops: &mut VecAssembler<X64Relocation>,
    event: u32,
    ring_entries: u64,
    slow: Slow,
    save: RcxSave,
    exit_addr: usize,
) -> EnqueueStub {
    let entry_label = ops.new_dynamic_label();
    enqueue_stub_at(ops, entry_label, event, ring_entries, slow, save, exit_addr)
}

/// [`enqueue_stub`] with its entry at `entry_label`, for code that jumps over its slow path.
#[allow(clippy::useless_conversion)]
pub(crate) fn enqueue_stub_at(
    ops: &mut VecAssembler<X64Relocation>,
    entry_label: DynamicLabel,
    event: u32,
    ring_entries: u64,
    slow: Slow,
    save: RcxSave,
    exit_addr: usize,
) -> EnqueueStub {
    let slow_label = ops.new_dynamic_label();
    dynasm!(ops ; .arch x64 ; =>slow_label);
    match slow {
        Slow::Resume => {
            rcx_to_scratch(ops, save);
            dynasm!(ops
                ; .arch x64
                ; lea rcx, [=>entry_label]
                ; .u8 GS ; mov QWORD [off::RESUME], rcx
                ; mov ecx, EXIT_RING_FULL as i32
                ; jmp extern exit_addr
            )
        }
        // The guest's RCX is in its scratch slot already, as the exit routine expects.
        Slow::Exit(index) => {
            assert_eq!(save, RcxSave::Scratch, "a side exit's stub saves RCX");
            dynasm!(ops
                ; .arch x64
                ; mov ecx, index as i32
                ; jmp extern exit_addr
            )
        }
    }
    let exit_at = ops.offset().0 as u64 - 4;
    let (entry, event_at) = enqueue_entry(ops, entry_label, slow_label, event, ring_entries, save);
    EnqueueStub {
        entry,
        event_at,
        exit_at,
    }
}

/// The cold part of a translation (`emit::Code_`): code assembled for consecutive host
/// addresses from `base`, for the code cache's cold area.
pub(crate) struct ColdCode {
    pub base: u64,
    pub bytes: Vec<u8>,
}

impl ColdCode {
    /// Host address of the next cold byte.
    pub fn addr(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }
}

/// An enqueue stub whose ring slow path is cold code ([`enqueue_stub_cold`]): where its parts
/// are.
pub(crate) struct ColdEnqueueStub {
    /// The hot part's entry, as an offset from the hot assembler's start.
    pub entry: u64,
    /// The 4-byte event, as an offset from the hot assembler's start.
    pub event_at: u64,
    /// The slow path, assembled for host address `cold_at`.
    pub cold: VecAssembler<X64Relocation>,
    /// Host address of the slow path.
    pub cold_at: u64,
    /// Host address of the hot `jmp`'s `rel32` to the slow path.
    pub slow_at: u64,
    /// Host address of the slow path's `lea` displacement to the stub's entry.
    pub lea_at: u64,
    /// Host address of the slow path's `rel32` to the gateway's exit.
    pub cold_exit_at: u64,
}

/// [`enqueue_stub`] with `Slow::Resume` and its slow path out of line, at `cold`'s next byte:
/// the hot part starts with a `jmp` to it (where the lap check's `jrcxz`, which reaches 127
/// bytes, can land), then the entry. The hot assembler `ops` starts at host address `base`.
/// The caller appends the returned slow path to `cold`.
#[allow(clippy::useless_conversion)]
pub(crate) fn enqueue_stub_cold(
    ops: &mut VecAssembler<X64Relocation>,
    base: u64,
    cold: &ColdCode,
    event: u32,
    ring_entries: u64,
    save: RcxSave,
    exit_addr: usize,
) -> ColdEnqueueStub {
    let cold_at = cold.addr();
    let slow_label = ops.new_dynamic_label();
    let entry_label = ops.new_dynamic_label();
    dynasm!(ops ; .arch x64 ; =>slow_label ; jmp extern cold_at as usize);
    let slow_at = base + ops.offset().0 as u64 - 4;
    let entry_host = base + ops.offset().0 as u64;
    let (entry, event_at) = enqueue_entry(ops, entry_label, slow_label, event, ring_entries, save);
    let mut c: VecAssembler<X64Relocation> = VecAssembler::new(cold_at as usize);
    rcx_to_scratch(&mut c, save);
    // lea rcx, [rip + disp32] to the entry, in the hot part.
    let lea_end = cold_at + c.offset().0 as u64 + 7;
    let disp = entry_host.wrapping_sub(lea_end) as i64 as i32;
    dynasm!(c ; .arch x64 ; .u8 0x48 ; .u8 0x8d ; .u8 0x0d ; .i32 disp);
    let lea_at = lea_end - 4;
    dynasm!(c
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::RESUME], rcx
        ; mov ecx, EXIT_RING_FULL as i32
        ; jmp extern exit_addr
    );
    let cold_exit_at = cold_at + c.offset().0 as u64 - 4;
    ColdEnqueueStub {
        entry,
        event_at,
        cold: c,
        cold_at,
        slow_at,
        lea_at,
        cold_exit_at,
    }
}

/// The start of an enqueue stub's slow path: the guest's RCX into its scratch slot, where
/// the exit routine expects it, unless it is there already.
#[allow(clippy::useless_conversion)]
fn rcx_to_scratch(ops: &mut VecAssembler<X64Relocation>, save: RcxSave) {
    match save {
        RcxSave::Scratch => {}
        RcxSave::Dead => dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx),
        RcxSave::Register(r) => {
            dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], Rq(gpr(r)))
        }
    }
}

/// The entry part of an enqueue stub (at `entry_label`; `jrcxz` to `slow_label` when the lap
/// is full). Returns the offsets of its entry and of its 4-byte event.
#[allow(clippy::useless_conversion)]
fn enqueue_entry(
    ops: &mut VecAssembler<X64Relocation>,
    entry_label: DynamicLabel,
    slow_label: DynamicLabel,
    event: u32,
    ring_entries: u64,
    save: RcxSave,
) -> (u64, u64) {
    let entry = ops.offset().0 as u64;
    let entries_end = off::entries_end(ring_entries);
    dynasm!(ops ; .arch x64 ; =>entry_label);
    match save {
        RcxSave::Scratch => dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx),
        RcxSave::Dead => {}
        RcxSave::Register(r) => dynasm!(ops ; .arch x64 ; mov Rq(gpr(r)), rcx),
    }
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov rcx, QWORD [off::RING_CURSOR]
        ; jrcxz =>slow_label
        ; .u8 GS ; mov DWORD [rcx * 4 + entries_end], event as i32
    );
    let event_at = ops.offset().0 as u64 - 4;
    dynasm!(ops
        ; .arch x64
        ; lea rcx, [rcx + 1]
        ; .u8 GS ; mov QWORD [off::RING_CURSOR], rcx
    );
    match save {
        RcxSave::Scratch => dynasm!(ops ; .arch x64 ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]),
        RcxSave::Dead => {}
        RcxSave::Register(r) => dynasm!(ops ; .arch x64 ; mov rcx, Rq(gpr(r))),
    }
    (entry, event_at)
}

/// Pads with one NOP of 0–3 bytes so that the rel32 of a branch whose opcode (`opcode_len`
/// bytes) comes next starts at a multiple of 4 bytes. Another thread may unlink the branch
/// while this thread runs it (`kick` → `unlink_all`): an aligned 4-byte store is seen whole by
/// a concurrent instruction fetch, but one that crosses a cache line can be fetched half old,
/// half new. (Seen: a linked self-loop, rel32 `bf ff ff ff`, fetched with the unlinked high
/// byte `00`, jumped 16 MiB into the cache.) DynamoRIO pads its patchable exits the same way.
pub(crate) fn align_patchable(ops: &mut VecAssembler<X64Relocation>, base: u64, opcode_len: u64) {
    let at = base + ops.offset().0 as u64 + opcode_len;
    match (4 - at % 4) % 4 {
        0 => {}
        1 => dynasm!(ops ; .arch x64 ; nop),
        2 => dynasm!(ops ; .arch x64 ; .u8 0x66 ; nop),
        _ => dynasm!(ops ; .arch x64 ; .u8 0x0f ; .u8 0x1f ; .u8 0x00),
    }
}

/// `rcx += value` (mod 2^64), flag-free: `lea` with a 32-bit displacement when `value` fits a
/// sign-extended one, else with RDX lending the 64-bit constant (kept in its scratch slot).
/// Compares a borrowed RCX with a constant (zero on a match, for `jrcxz`).
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
