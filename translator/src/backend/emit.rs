//! Emitting host code for one IR block into the code cache.
//!
//! Layout of a translated block (host addresses grow downward):
//!
//! ```text
//! hot part (the code cache's hot area):
//! ring_slow:  jmp cold_slow                                                     (stub on only)
//! entry:      enqueue stub: lap check (cursor 0: jrcxz ring_slow), entries_end[cursor++] = block id
//!             (stub on only; the guest's RCX waits in a GS scratch slot, or in a register the
//!             block overwrites before reading it, or nowhere when that register is RCX)
//!             body: the guest instructions, re-encoded at their new address (RIP-relative
//!                   operands keep pointing at the same guest addresses)
//!             terminator: jcc/jmp rel32 to exit stubs (patched later to chain), or the operand
//!                   load + jump to the indirect branch lookup
//! cold part (the code cache's cold area; code that runs only on the way to the dispatcher):
//! cold_slow:  lea rcx,[entry]; mov gs:[resume],rcx; mov ecx,RING_FULL; jmp exit (stub on only)
//! exit stubs: mov gs:[scratch_rcx],rcx; mov ecx,EXIT_INDEX; jmp exit
//! ```
//!
//! Code assembled without a cold area (superblocks, jump-table stubs, tests) keeps its slow
//! path and exit stubs in line, around the hot code, as one part.
//!
//! Nothing emitted here writes the guest's flags, registers or stack below RSP, except what the
//! guest instruction itself would do, and registers the guest overwrites before it reads them
//! (`hotpath_ir::scratch_register`): RCX is borrowed through a GS scratch slot or one of those.

use dynasmrt::{dynasm, x64::X64Relocation, DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler};
use iced_x86::{
    Code, Encoder, Instruction, InstructionInfoFactory, MemoryOperand, Mnemonic, OpKind, Register,
};

use hotpath_ir::{Block, BlockId, Cond, GuestAddr, HostAddr, Inst, Terminator};

use crate::backend::gateway::{emit_ibl, emit_ibl_call, emit_ibl_in, Gateway, GS};
use crate::backend::relocs::{RelocKind, Relocs, Routine};
pub(crate) use crate::backend::stubs::{
    align_patchable, enqueue_stub, enqueue_stub_cold, gpr, ColdCode, RcxSave, Slow,
};
use crate::cache::code_cache::{Exit, ExitKind, HostLayout};
pub(crate) use crate::frontend::decode::return_pop;
use crate::host::thread_area::off;
use crate::TranslateError;

/// A block's host code, assembled for a known address, not yet in the cache.
pub struct EmittedBlock {
    /// The machine code, to be inserted at the address it was assembled for.
    pub code: Vec<u8>,
    /// Its cold part (exit stubs, the ring's slow path), to be inserted into the cold area
    /// at `cold_at`, the address it was assembled for; empty when emitted without one.
    pub cold: Vec<u8>,
    /// Host address of the cold part.
    pub cold_at: HostAddr,
    /// Host address of the block's entry (after the ring slow path).
    pub entry: HostAddr,
    /// Exits, in the order of their indices `first_exit..`.
    pub exits: Vec<Exit>,
    /// Where each guest instruction landed, for mapping faults back to the guest.
    pub layout: HostLayout,
    /// The fields that depend on where the code sits and what it was given (id, exits,
    /// gateway, the guest's address): what the persisted store patches to reuse it.
    pub relocs: Relocs,
}

/// What the emitter needs to know besides the block.
#[derive(Clone, Copy, Debug)]
pub struct EmitContext {
    /// `Some(ring entries)`: emit the enqueue stub at the block head, for a ring of that many
    /// entries (the monitor is on). `None`: no stub.
    pub enqueue: Option<u64>,
    /// The gateway routines' addresses.
    pub gateway: Gateway,
    /// The jump-table site (`jump_table`) a block (a superblock's last) ending in a `switch`'s
    /// dispatch is translated as; `None`: through the lookup.
    pub jump_table: Option<u32>,
    /// Host address in the code cache's cold area where a basic block's cold part goes (see
    /// the module doc); `None`: in line.
    pub cold: Option<HostAddr>,
}

/// A growing run of machine code assembled for consecutive host addresses, and the cold part
/// that goes with it (when it has one: see the module doc).
pub(crate) struct Code_ {
    pub base: u64,
    pub bytes: Vec<u8>,
    pub cold: Option<ColdCode>,
}

impl Code_ {
    /// Code from host address `base`, with its cold part from `cold` if given.
    pub fn new(base: u64, cold: Option<HostAddr>) -> Code_ {
        Code_ {
            base,
            bytes: Vec::with_capacity(256),
            cold: cold.map(|c| ColdCode {
                base: c.0,
                bytes: Vec::new(),
            }),
        }
    }

    pub fn addr(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }

    pub fn append(&mut self, chunk: Vec<u8>) {
        self.bytes.extend(chunk);
    }

    /// The bytes appended since host address `from` (an address of this code).
    pub fn bytes_from(&self, from: u64) -> &[u8] {
        &self.bytes[(from - self.base) as usize..]
    }
}

pub(crate) fn assembled(
    ops: VecAssembler<X64Relocation>,
    what: &'static str,
) -> Result<Vec<u8>, TranslateError> {
    ops.finalize().map_err(|e| TranslateError::Assemble {
        what,
        reason: format!("{e:?}"),
    })
}

/// Emits `block` (id `id`) for host address `at`; its exits get indices from `first_exit`.
///
/// # Errors
/// [`TranslateError::Assemble`] / [`TranslateError::Encode`] if a guest instruction cannot be
/// re-encoded at its new address (e.g. a RIP-relative operand out of ±2 GiB reach).
pub fn emit_block(
    block: &Block,
    id: BlockId,
    at: HostAddr,
    first_exit: u32,
    cx: &EmitContext,
) -> Result<EmittedBlock, TranslateError> {
    emit_block_with(block, id, at, first_exit, cx, None)
}

/// What follows a block's body in its translation, in place of its terminator's
/// ([`emit_terminator`]): appends its code, records its parts in the layout and relocations,
/// and returns its exits (indices from the `u32`).
pub(crate) type Tail<'a> = &'a mut dyn FnMut(
    &mut Code_,
    u32,
    &mut HostLayout,
    &mut Relocs,
) -> Result<Vec<Exit>, TranslateError>;

/// [`emit_block`], with `tail` (when given) emitting what follows the body.
pub(crate) fn emit_block_with(
    block: &Block,
    id: BlockId,
    at: HostAddr,
    first_exit: u32,
    cx: &EmitContext,
    tail: Option<Tail<'_>>,
) -> Result<EmittedBlock, TranslateError> {
    let exit_addr = cx.gateway.exit.0 as usize;
    let mut code = Code_::new(at.0, cx.cold);

    // Monitor on: the ring slow path and the enqueue stub, which exits at the block entry when
    // the ring's lap is full. A pending signal unlinks the blocks instead (see `signals`).
    let mut layout = HostLayout {
        code_start: at.0,
        ..HostLayout::default()
    };
    let mut relocs = Relocs {
        complete: true,
        ..Relocs::default()
    };
    let entry = match cx.enqueue {
        Some(ring_entries) => {
            let save = RcxSave::for_body(&block.body);
            head_stub(&mut code, id.0, ring_entries, save, exit_addr, &mut relocs)?
        }
        None => HostAddr(code.base),
    };
    layout.entry = entry.0;
    layout.guest_start = block.start.0;

    append_body(block, &mut code, &mut layout, &mut relocs)?;

    // Terminator and exit stubs.
    let mut exits = match tail {
        Some(tail) => tail(&mut code, first_exit, &mut layout, &mut relocs)?,
        None => emit_terminator(
            block,
            id,
            &mut code,
            first_exit,
            cx,
            &mut layout,
            &mut relocs,
        )?,
    };
    layout.code_end = code.addr();
    resolve_exit_stubs(&mut exits, &code);
    let (cold, cold_at) = match code.cold {
        Some(c) => (c.bytes, HostAddr(c.base)),
        None => (Vec::new(), HostAddr(0)),
    };
    Ok(EmittedBlock {
        code: code.bytes,
        cold,
        cold_at,
        entry,
        exits,
        layout,
        relocs,
    })
}

/// Appends the enqueue stub for `event` at the head of `code` (a block or superblock about to
/// be emitted there), its slow path in `code`'s cold part when it has one, and records its
/// fields in `relocs`. Returns its entry.
///
/// # Errors
/// [`TranslateError::Assemble`] if dynasm rejects the stub (a bug in hotpath).
pub(crate) fn head_stub(
    code: &mut Code_,
    event: u32,
    ring_entries: u64,
    save: RcxSave,
    exit_addr: usize,
    relocs: &mut Relocs,
) -> Result<HostAddr, TranslateError> {
    let base = code.addr();
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(base as usize);
    let (entry, event_at) = match &mut code.cold {
        Some(cold) => {
            let stub =
                enqueue_stub_cold(&mut ops, base, cold, event, ring_entries, save, exit_addr);
            cold.bytes.extend(assembled(stub.cold, "ring slow path")?);
            let to_slow = RelocKind::Local {
                target: stub.cold_at,
            };
            relocs.add(stub.slow_at, to_slow);
            let to_entry = RelocKind::Local {
                target: base + stub.entry,
            };
            relocs.add(stub.lea_at, to_entry);
            relocs.add(stub.cold_exit_at, RelocKind::Gateway(Routine::Exit));
            (stub.entry, stub.event_at)
        }
        None => {
            let stub = enqueue_stub(&mut ops, event, ring_entries, Slow::Resume, save, exit_addr);
            relocs.add(base + stub.exit_at, RelocKind::Gateway(Routine::Exit));
            (stub.entry, stub.event_at)
        }
    };
    relocs.add(base + event_at, RelocKind::BlockId);
    code.append(assembled(ops, "enqueue stub")?);
    Ok(HostAddr(base + entry))
}

/// Appends `block`'s body, moved to its new address, and records where each instruction
/// landed in `layout` (with where the terminator's code will start) and its relocated fields
/// in `relocs`.
pub(crate) fn append_body(
    block: &Block,
    code: &mut Code_,
    layout: &mut HostLayout,
    relocs: &mut Relocs,
) -> Result<(), TranslateError> {
    if !block.body.is_empty() {
        let base = code.addr();
        let mut mover = Relocator::new(base, block.body.len());
        for inst in &block.body {
            let off = inst.inst.ip().wrapping_sub(block.start.0) as usize;
            let guest = block.code.get(off..off + inst.inst.len());
            mover.relocate(inst, guest)?;
        }
        let encoded = mover.finish();
        layout.body = encoded
            .offsets
            .iter()
            .zip(&block.body)
            .map(|(&o, i)| (base + o, i.inst.ip()))
            .collect();
        layout
            .far_borrows
            .extend(encoded.borrows.iter().map(|&(o, r)| (base + o, r)));
        relocs.add_all(base, &encoded.relocs);
        code.append(encoded.bytes);
    }
    layout.term_start = code.addr();
    layout.term_guest = block
        .term_inst
        .as_ref()
        .map(|i| i.inst.ip())
        .unwrap_or(block.end().0);
    Ok(())
}

/// Records, for each direct exit, the stub its rel32 points at until it is chained, so the
/// link can be undone.
pub(crate) fn resolve_exit_stubs(exits: &mut [Exit], code: &Code_) {
    for e in exits {
        if let ExitKind::Direct { site, stub, .. } = &mut e.kind {
            // The site is in the hot part, or (a superblock's side exit) in the cold one.
            let (base, bytes) = match &code.cold {
                Some(c) if site.0 >= c.base && site.0 < c.addr() => (c.base, &c.bytes),
                _ => (code.base, &code.bytes),
            };
            let off = (site.0 - base) as usize;
            let rel = i32::from_le_bytes(bytes[off..off + 4].try_into().expect("4 bytes"));
            *stub = HostAddr((site.0 as i64 + 4 + rel as i64) as u64);
        }
    }
}

/// Guest instructions moved to the code cache (see [`Relocator`]).
pub(crate) struct Encoded {
    /// The host code.
    pub bytes: Vec<u8>,
    /// For each guest instruction, the offset in `bytes` of the host instruction that does
    /// its work (and where it faults, if it does): the instruction itself, or its rewritten
    /// form after the setup of a far operand.
    pub offsets: Vec<u64>,
    /// `(offset, register number)` of each rewritten instruction that runs with a borrowed
    /// register holding its far operand's address; the guest's value waits in the thread
    /// area's `scratch_far` slot.
    pub borrows: Vec<(u64, u8)>,
    /// `(offset, what)` of each field holding a guest address: patched displacements and the
    /// addresses of rewritten far operands.
    pub relocs: Vec<(u64, RelocKind)>,
}

/// How far (bytes) a RIP-relative operand may be from the instruction's host address and
/// still be encoded as such: the ±2 GiB of a 32-bit displacement, less the instruction's
/// length.
const RIP_REACH: u64 = (1 << 31) - 64;

/// `rdgsbase` and friends run in user mode (the kernel set CR4.FSGSBASE: HWCAP2_FSGSBASE).
fn host_fsgsbase() -> bool {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(libc::AT_HWCAP2) & 2 != 0 }
}

/// Moves guest body instructions (no control transfers) one after another to host addresses
/// from `rip`, keeping every RIP-relative operand pointing at the same absolute guest address.
///
/// An instruction whose guest bytes are at hand is copied as it is: nothing in a body
/// instruction depends on where it sits but a RIP-relative displacement, which is patched in
/// the copy. Only the others go through iced's encoder (created on first use: most blocks need
/// none), each on its own: iced's `BlockEncoder` would treat a RIP-relative operand that
/// happens to address one of the block's own instructions as a reference into the block and
/// move it along with the code, which is wrong for data accesses (`lea rcx, [rip]`).
///
/// An operand out of the ±2 GiB a displacement reaches from the code cache (code in a library
/// far from the cache, the vDSO) is rewritten, as DynamoRIO mangles it: `lea reg, [rip+d]`
/// becomes `mov reg, imm`; any other instruction borrows a register it does not use
/// (its guest value saved in the thread area's `scratch_far` slot, through GS), loads the
/// address into it, runs with `[reg]` as its operand, and gives the register back. None of
/// these touch the flags.
pub(crate) struct Relocator {
    rip: u64,
    encoder: Option<Encoder>,
    out: Encoded,
}

impl Relocator {
    /// A relocator for about `count` instructions placed from host address `rip`.
    pub fn new(rip: u64, count: usize) -> Relocator {
        Relocator {
            rip,
            encoder: None,
            out: Encoded {
                bytes: Vec::with_capacity(count * 5),
                offsets: Vec::with_capacity(count),
                borrows: Vec::new(),
                relocs: Vec::new(),
            },
        }
    }

    /// Host address the next instruction lands at.
    fn at(&self) -> u64 {
        self.rip + self.out.bytes.len() as u64
    }

    /// Places `inst`, copying `guest` (its bytes, when known) where that keeps its meaning.
    ///
    /// # Errors
    /// [`TranslateError::Encode`] if the instruction has to be re-encoded and cannot be.
    pub fn relocate(&mut self, inst: &Inst, guest: Option<&[u8]>) -> Result<(), TranslateError> {
        if crate::frontend::decode::gs_memory(&inst.inst) {
            return self.relocate_gs_memory(inst, guest);
        }
        if inst.inst.mnemonic() == iced_x86::Mnemonic::Rdgsbase && host_fsgsbase() {
            // The guest's GS base is 0 (hotpath refuses ARCH_SET_GS): `mov r32, 0`, which
            // zero-extends and leaves the flags alone, as `rdgsbase` does.
            let reg = inst.inst.op0_register().full_register32();
            let mov = Instruction::with2(Code::Mov_r32_imm32, reg, 0u32).map_err(|e| {
                TranslateError::Encode {
                    guest: inst.inst.ip(),
                    reason: e.to_string(),
                }
            })?;
            self.out.offsets.push(self.at() - self.rip);
            return self.encode_one(&mov, &inst.inst);
        }
        let at = self.at();
        if let Some(bytes) = guest.filter(|b| b.len() == inst.inst.len()) {
            match (inst.rip_relative, inst.rip_disp_offset) {
                (None, _) => {
                    self.out.offsets.push(at - self.rip);
                    self.out.bytes.extend_from_slice(bytes);
                    return Ok(());
                }
                (Some(target), Some(disp_at)) => {
                    let next = at + bytes.len() as u64;
                    let disp = target.0.wrapping_sub(next) as i64;
                    if target.0.abs_diff(at) < RIP_REACH && i32::try_from(disp).is_ok() {
                        self.out.offsets.push(at - self.rip);
                        let start = self.out.bytes.len();
                        self.out.bytes.extend_from_slice(bytes);
                        let d = start + disp_at as usize;
                        self.out.bytes[d..d + 4].copy_from_slice(&(disp as i32).to_le_bytes());
                        self.out.relocs.push((
                            d as u64,
                            RelocKind::GuestRel32 {
                                target,
                                end: (bytes.len() - disp_at as usize) as u8,
                            },
                        ));
                        return Ok(());
                    }
                }
                (Some(_), None) => {}
            }
        }
        self.encode(&inst.inst)
    }

    /// Places an instruction with a GS-relative memory operand. The guest's GS base is 0
    /// (hotpath's is its thread area): the `gs` prefix becomes `ds`, which 64-bit mode
    /// ignores, so the operand addresses the same bytes it would natively.
    fn relocate_gs_memory(
        &mut self,
        inst: &Inst,
        guest: Option<&[u8]>,
    ) -> Result<(), TranslateError> {
        let mut plain = inst.clone();
        plain.inst.set_segment_prefix(Register::DS);
        let bytes = guest.filter(|b| b.len() == inst.inst.len()).map(|b| {
            let mut b = b.to_vec();
            // Prefixes come first: legacy ones and REX (one not right before the opcode is
            // ignored, but it may come before a legacy prefix); then VEX/EVEX or the opcode.
            for x in b.iter_mut() {
                match *x {
                    0x65 => *x = 0x3e,
                    0xf0 | 0xf2 | 0xf3 | 0x2e | 0x36 | 0x3e | 0x26 | 0x64 | 0x66 | 0x67 => {}
                    0x40..=0x4f => {}
                    _ => break,
                }
            }
            b
        });
        self.relocate(&plain, bytes.as_deref())
    }

    /// Places `inst` through iced's encoder, rewriting a far RIP-relative operand.
    ///
    /// # Errors
    /// [`TranslateError::Encode`] if iced cannot encode it at its new address, or a far
    /// operand has no register to borrow.
    pub fn encode(&mut self, inst: &Instruction) -> Result<(), TranslateError> {
        let at = self.at();
        let far = inst.is_ip_rel_memory_operand()
            && inst.ip_rel_memory_address().abs_diff(at) >= RIP_REACH;
        if !far {
            self.out.offsets.push(at - self.rip);
            return self.encode_one(inst, inst);
        }
        let mut seq = Vec::with_capacity(4);
        let work = far_operand_sequence(inst, &mut seq)?;
        for (i, part) in seq.iter().enumerate() {
            if i == work.index {
                let here = self.at() - self.rip;
                self.out.offsets.push(here);
                if let Some(reg) = work.borrowed {
                    self.out.borrows.push((here, gpr(reg)));
                }
            }
            self.encode_one(part, inst)?;
        }
        Ok(())
    }

    /// Encodes one host instruction `part` (of guest instruction `guest`) at the end.
    fn encode_one(
        &mut self,
        part: &Instruction,
        guest: &Instruction,
    ) -> Result<(), TranslateError> {
        let at = self.at();
        let encoder = self.encoder.get_or_insert_with(|| Encoder::new(64));
        encoder
            .encode(part, at)
            .map_err(|e| TranslateError::Encode {
                guest: guest.ip(),
                reason: e.to_string(),
            })?;
        let mut bytes = encoder.take_buffer();
        let start = self.out.bytes.len() as u64;
        let end = start + bytes.len() as u64;
        if part.is_ip_rel_memory_operand() {
            let offsets = encoder.get_constant_offsets();
            debug_assert!(offsets.has_displacement() && offsets.displacement_size() == 4);
            let disp = offsets.displacement_offset() as u64;
            let target = GuestAddr(part.ip_rel_memory_address());
            let end = (bytes.len() as u64 - disp) as u8;
            let kind = RelocKind::GuestRel32 { target, end };
            self.out.relocs.push((start + disp, kind));
        } else if let Some(target) = far_address(part, guest) {
            let kind = match part.code() {
                Code::Mov_r64_imm64 => (end - 8, RelocKind::GuestAbs64 { target }),
                _ => (end - 4, RelocKind::GuestLow32 { target }),
            };
            self.out.relocs.push(kind);
        }
        self.out.bytes.extend_from_slice(&bytes);
        bytes.clear();
        encoder.set_buffer(bytes);
        Ok(())
    }

    /// The host code and where each instruction landed.
    pub fn finish(self) -> Encoded {
        self.out
    }
}

/// The guest address `part` (one host instruction of `guest`'s far-operand sequence) loads as
/// an immediate: `mov r64, imm64` or a 32-bit `lea`'s `mov r32, imm32` of `guest`'s far
/// RIP-relative operand (see [`far_operand_sequence`]).
fn far_address(part: &Instruction, guest: &Instruction) -> Option<GuestAddr> {
    if !guest.is_ip_rel_memory_operand() {
        return None;
    }
    let target = guest.ip_rel_memory_address();
    match part.code() {
        Code::Mov_r64_imm64 if part.immediate64() == target => Some(GuestAddr(target)),
        Code::Mov_r32_imm32 if guest.code() == Code::Lea_r32_m => Some(GuestAddr(target)),
        _ => None,
    }
}

/// Re-encodes `insts` one after another from host address `rip` through iced's encoder (see
/// [`Relocator`]).
///
/// # Errors
/// As [`Relocator::encode`].
pub(crate) fn encode_at(insts: &[Instruction], rip: u64) -> Result<Encoded, TranslateError> {
    let mut mover = Relocator::new(rip, insts.len());
    for inst in insts {
        mover.encode(inst)?;
    }
    Ok(mover.finish())
}

/// Which instruction of a far-operand sequence does the guest instruction's work.
struct FarWork {
    /// Its index in the sequence.
    index: usize,
    /// The register it borrows, if any.
    borrowed: Option<Register>,
}

/// Appends to `seq` the instructions that do what `inst` does when its RIP-relative operand
/// is too far from the code cache to stay RIP-relative (see [`encode_at`]).
fn far_operand_sequence(
    inst: &Instruction,
    seq: &mut Vec<Instruction>,
) -> Result<FarWork, TranslateError> {
    let bad = |e: iced_x86::IcedError| TranslateError::Encode {
        guest: inst.ip(),
        reason: e.to_string(),
    };
    let target = inst.ip_rel_memory_address();
    match inst.code() {
        Code::Lea_r64_m => {
            seq.push(
                Instruction::with2(Code::Mov_r64_imm64, inst.op0_register(), target)
                    .map_err(bad)?,
            );
            return Ok(FarWork {
                index: 0,
                borrowed: None,
            });
        }
        Code::Lea_r32_m => {
            seq.push(
                Instruction::with2(Code::Mov_r32_imm32, inst.op0_register(), target as u32)
                    .map_err(bad)?,
            );
            return Ok(FarWork {
                index: 0,
                borrowed: None,
            });
        }
        _ => {}
    }
    // A load into a whole register addresses through its own destination, which the load
    // overwrites, so nothing is restored after it (the reload of a borrowed register is a
    // store-to-load round trip on its dependency chain: 3 % of sqlite3's instructions). Either
    // way the register's guest value waits in `scratch_far` for a fault at the access.
    let (reg, restore) = match loaded_register(inst) {
        Some(dst) => (dst, false),
        None => {
            let free = free_register(inst).ok_or_else(|| TranslateError::Encode {
                guest: inst.ip(),
                reason: "no register is free to address a far RIP-relative operand".into(),
            })?;
            (free, true)
        }
    };
    let slot = scratch_far_slot();
    seq.push(Instruction::with2(Code::Mov_rm64_r64, slot, reg).map_err(bad)?);
    seq.push(Instruction::with2(Code::Mov_r64_imm64, reg, target).map_err(bad)?);
    let mut work = *inst;
    work.set_memory_base(reg);
    work.set_memory_index(Register::None);
    work.set_memory_displacement64(0);
    work.set_memory_displ_size(0);
    seq.push(work);
    if restore {
        seq.push(Instruction::with2(Code::Mov_r64_rm64, reg, slot).map_err(bad)?);
    }
    Ok(FarWork {
        index: 2,
        borrowed: Some(reg),
    })
}

/// `gs:[scratch_far]`, where a far operand's borrowed register keeps its guest value.
fn scratch_far_slot() -> MemoryOperand {
    MemoryOperand::new(
        Register::None,
        Register::None,
        1,
        off::SCRATCH_FAR as i64,
        4,
        false,
        Register::GS,
    )
}

/// The 64-bit register `inst` loads into when it is `mov`/`movzx`/`movsx`/`movsxd` from
/// memory into a 64- or 32-bit general-purpose register (a 32-bit write clears the upper
/// half): the whole register is overwritten and was not read.
fn loaded_register(inst: &Instruction) -> Option<Register> {
    let loads = matches!(
        inst.mnemonic(),
        Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd
    );
    if !loads || inst.op_count() != 2 || inst.op0_kind() != OpKind::Register {
        return None;
    }
    if inst.op1_kind() != OpKind::Memory {
        return None;
    }
    let dst = inst.op0_register();
    ((dst.is_gpr64() || dst.is_gpr32()) && dst.full_register() != Register::RSP)
        .then(|| dst.full_register())
}

/// A 64-bit general-purpose register (never RSP) that `inst` neither reads nor writes, in
/// any width, explicitly or implicitly.
fn free_register(inst: &Instruction) -> Option<Register> {
    let mut used = 1u32 << gpr(Register::RSP);
    let mut factory = InstructionInfoFactory::new();
    for u in factory.info(inst).used_registers() {
        let full = u.register().full_register();
        if full.is_gpr64() {
            used |= 1 << gpr(full);
        }
    }
    (0..16u32)
        .find(|i| used & (1 << i) == 0)
        .map(|i| ALL_GPR64[i as usize])
}

/// The 64-bit general-purpose registers in x86 encoding order.
const ALL_GPR64: [Register; 16] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RBX,
    Register::RSP,
    Register::RBP,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

/// Appends the exit stub for exit index `index` at label `label`. Returns the offsets (from
/// the assembler's start) of its 4-byte index and of its `rel32` to the gateway's exit.
pub(crate) fn exit_stub(
    ops: &mut VecAssembler<X64Relocation>,
    label: DynamicLabel,
    index: u32,
    exit_addr: usize,
) -> (u64, u64) {
    dynasm!(ops
        ; .arch x64
        ; =>label
        ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx
        ; mov ecx, index as i32
    );
    let index_at = ops.offset().0 as u64 - 4;
    dynasm!(ops ; .arch x64 ; jmp extern exit_addr);
    (index_at, ops.offset().0 as u64 - 4)
}

/// Emits `jcc rel32` with condition nibble `cc` to `label`.
/// Emits `jmp rel32` to `label` in code assembled for host address `base`, with its
/// displacement 4-byte aligned (see [`align_patchable`]), and returns the displacement's host
/// address: the site of a chainable direct exit.
pub(crate) fn patchable_jmp(
    ops: &mut VecAssembler<X64Relocation>,
    base: u64,
    label: DynamicLabel,
) -> HostAddr {
    align_patchable(ops, base, 1);
    dynasm!(ops ; .arch x64 ; jmp =>label);
    patch_site(ops, base)
}

/// Emits `jcc rel32` (condition code `cc`) to `label` like [`patchable_jmp`].
pub(crate) fn patchable_jcc(
    ops: &mut VecAssembler<X64Relocation>,
    base: u64,
    cc: u8,
    label: DynamicLabel,
) -> HostAddr {
    align_patchable(ops, base, 2);
    jcc(ops, cc, label);
    patch_site(ops, base)
}

/// The host address of the rel32 just emitted (the last 4 bytes), checked to be aligned.
fn patch_site(ops: &VecAssembler<X64Relocation>, base: u64) -> HostAddr {
    let site = base + ops.offset().0 as u64 - 4;
    debug_assert_eq!(site % 4, 0, "a patchable rel32 at {site:#x} is not aligned");
    HostAddr(site)
}

pub(crate) fn jcc(ops: &mut VecAssembler<X64Relocation>, cc: u8, label: DynamicLabel) {
    match cc {
        0 => dynasm!(ops ; .arch x64 ; jo =>label),
        1 => dynasm!(ops ; .arch x64 ; jno =>label),
        2 => dynasm!(ops ; .arch x64 ; jb =>label),
        3 => dynasm!(ops ; .arch x64 ; jae =>label),
        4 => dynasm!(ops ; .arch x64 ; je =>label),
        5 => dynasm!(ops ; .arch x64 ; jne =>label),
        6 => dynasm!(ops ; .arch x64 ; jbe =>label),
        7 => dynasm!(ops ; .arch x64 ; ja =>label),
        8 => dynasm!(ops ; .arch x64 ; js =>label),
        9 => dynasm!(ops ; .arch x64 ; jns =>label),
        10 => dynasm!(ops ; .arch x64 ; jp =>label),
        11 => dynasm!(ops ; .arch x64 ; jnp =>label),
        12 => dynasm!(ops ; .arch x64 ; jl =>label),
        13 => dynasm!(ops ; .arch x64 ; jge =>label),
        14 => dynasm!(ops ; .arch x64 ; jle =>label),
        _ => dynasm!(ops ; .arch x64 ; jg =>label),
    }
}

/// Emits the RCX-based short branch `inst` (loop/loope/loopne/jrcxz/jecxz) to `label`.
pub(crate) fn rcx_branch(
    ops: &mut VecAssembler<X64Relocation>,
    code: Code,
    label: DynamicLabel,
) -> Result<(), TranslateError> {
    match code {
        Code::Jrcxz_rel8_64 => dynasm!(ops ; .arch x64 ; jrcxz =>label),
        Code::Jecxz_rel8_64 => dynasm!(ops ; .arch x64 ; .u8 0x67 ; jrcxz =>label),
        Code::Loop_rel8_64_RCX => dynasm!(ops ; .arch x64 ; loop =>label),
        Code::Loop_rel8_64_ECX => dynasm!(ops ; .arch x64 ; .u8 0x67 ; loop =>label),
        Code::Loope_rel8_64_RCX => dynasm!(ops ; .arch x64 ; loope =>label),
        Code::Loope_rel8_64_ECX => dynasm!(ops ; .arch x64 ; .u8 0x67 ; loope =>label),
        Code::Loopne_rel8_64_RCX => dynasm!(ops ; .arch x64 ; loopne =>label),
        Code::Loopne_rel8_64_ECX => dynasm!(ops ; .arch x64 ; .u8 0x67 ; loopne =>label),
        other => {
            return Err(TranslateError::Assemble {
                what: "rcx branch",
                reason: format!("unexpected {other:?}"),
            });
        }
    }
    Ok(())
}

/// The 8-byte literal a [`push_return_address`] of a 64-bit address reads, which the caller
/// places with [`ReturnLiteral::place`] where execution never falls through to it (after an
/// unconditional jump) in the same assembler.
#[must_use = "the push reads the literal: place it"]
pub(crate) struct ReturnLiteral {
    /// The literal's label and value, for a push of a 64-bit address.
    literal: Option<(DynamicLabel, u64)>,
    /// For a `push imm32`: its immediate's offset from the assembler's start and the address.
    pub imm: Option<(u64, GuestAddr)>,
}

impl ReturnLiteral {
    /// Emits the literal here, 8-byte aligned (`ops` starts at host address `base`; `int3`
    /// pads it, never run). Returns its offset from the assembler's start and the guest
    /// address it holds.
    ///
    /// Aligned because the `push` that reads it runs with the guest's flags: a guest that
    /// sets EFLAGS.AC (alignment checks; the JVM's CPU probe does) would take a SIGBUS that
    /// its own `call` never raises natively.
    pub(crate) fn place(
        self,
        ops: &mut VecAssembler<X64Relocation>,
        base: u64,
    ) -> Option<(u64, GuestAddr)> {
        let (label, value) = self.literal?;
        align_literal(ops, base);
        let at = ops.offset().0 as u64;
        dynasm!(ops ; .arch x64 ; =>label ; .u64 value);
        Some((at, GuestAddr(value)))
    }
}

/// Pads `ops` (which starts at host address `base`) with `int3`s up to the next multiple of 8
/// bytes: where an 8-byte literal that translated code reads goes. Translated code runs with
/// the guest's EFLAGS.AC, so every load of hotpath's own must be aligned (blocks and
/// superblocks start 16-byte aligned wherever they are placed, so the padding is the same in
/// a persisted record).
pub(crate) fn align_literal(ops: &mut VecAssembler<X64Relocation>, base: u64) {
    let at = base + ops.offset().0 as u64;
    for _ in 0..(8 - at % 8) % 8 {
        dynasm!(ops ; .arch x64 ; int3);
    }
}

/// Pushes the 64-bit guest address `ret` in one instruction, without touching flags or a
/// register: `push imm32` when `ret` is below 2^31 (a non-PIE program; the push sign-extends,
/// so higher addresses would change), else `push qword [rip + literal]`. One 8-byte store, as
/// the guest's `call` makes: the `ret` that loads it gets it by store-to-load forwarding. (Two
/// 4-byte stores cannot forward to one 8-byte load: every return from a short PIE function
/// waited for them to reach the cache.) A fault leaves RSP unchanged.
pub(crate) fn push_return_address(
    ops: &mut VecAssembler<X64Relocation>,
    ret: GuestAddr,
) -> ReturnLiteral {
    if let Ok(imm) = i32::try_from(ret.0) {
        // Always `push imm32` (68 id), whatever the value: the persisted store patches those
        // four bytes.
        dynasm!(ops ; .arch x64 ; .u8 0x68 ; .i32 imm);
        return ReturnLiteral {
            literal: None,
            imm: Some((ops.offset().0 as u64 - 4, ret)),
        };
    }
    let label = ops.new_dynamic_label();
    dynasm!(ops ; .arch x64 ; push QWORD [=>label]);
    ReturnLiteral {
        literal: Some((label, ret.0)),
        imm: None,
    }
}

/// Appends to `code` the host code of `block`'s terminator (block or superblock `id`): chained
/// direct exits with their exit stubs, the indirect branch lookup, system call and trap exits.
/// Returns its exits, whose indices start at `first_exit`; `layout` and `relocs` get the
/// terminator's parts.
///
/// # Errors
/// [`TranslateError`] if dynasm or iced rejects the code (a bug in hotpath).
pub(crate) fn emit_terminator(
    block: &Block,
    id: BlockId,
    code: &mut Code_,
    first_exit: u32,
    cx: &EmitContext,
    layout: &mut HostLayout,
    relocs: &mut Relocs,
) -> Result<Vec<Exit>, TranslateError> {
    let mut exit_list = Vec::new();
    let exits = &mut exit_list;
    let exit_addr = cx.gateway.exit.0 as usize;
    let chunk_base = code.addr();
    // Records the fields of exit stub `index`'s stub (at offsets `at` from `base`).
    let stub_fields = |relocs: &mut Relocs, base: u64, index: u32, at: (u64, u64)| {
        relocs.add(base + at.0, RelocKind::Exit(index - first_exit));
        relocs.add(base + at.1, RelocKind::Gateway(Routine::Exit));
    };
    // Records a pushed return address (an immediate, or the literal placed for it).
    let pushed = |relocs: &mut Relocs, base: u64, at: Option<(u64, GuestAddr)>, wide: bool| {
        if let Some((at, target)) = at {
            let kind = match wide {
                true => RelocKind::GuestAbs64 { target },
                false => RelocKind::GuestSigned32 { target },
            };
            relocs.add(base + at, kind);
        }
    };
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(chunk_base as usize);
    let mut exit_cx = ExitStubs {
        base: chunk_base,
        cold: code.cold.as_mut(),
        first_exit,
        exit_addr,
    };
    // The index the next direct exit gets (what `direct` below returns for it).
    let next = |exits: &Vec<Exit>| first_exit + exits.len() as u32;
    // An in-line stub goes after the terminator's code, at its label; its fields are recorded
    // as `exit_branch` records a cold one's.
    let mut inline_stubs = Vec::new();
    let mut place_stub =
        |ops: &mut VecAssembler<X64Relocation>, stub: Option<DynamicLabel>, index: u32| {
            if let Some(l) = stub {
                inline_stubs.push((index, exit_stub(ops, l, index, exit_addr)));
            }
        };
    let direct = |exits: &mut Vec<Exit>, target: GuestAddr, site: HostAddr, call: bool| {
        exits.push(Exit {
            block: id,
            kind: ExitKind::Direct {
                target,
                from: block.start,
                site,
                stub: HostAddr(0),
                call,
            },
        });
        first_exit + exits.len() as u32 - 1
    };
    match block.terminator {
        Terminator::Jump { target } | Terminator::FallThrough { next: target } => {
            let (site, stub) = exit_branch(&mut ops, &mut exit_cx, next(exits), None, relocs)?;
            let index = direct(exits, target, site, false);
            place_stub(&mut ops, stub, index);
        }
        Terminator::Call { target, return_to } => {
            let literal = push_return_address(&mut ops, return_to);
            pushed(relocs, chunk_base, literal.imm, false);
            let (site, stub) = exit_branch(&mut ops, &mut exit_cx, next(exits), None, relocs)?;
            let index = direct(exits, target, site, true);
            place_stub(&mut ops, stub, index);
            let at = literal.place(&mut ops, chunk_base);
            pushed(relocs, chunk_base, at, true);
        }
        Terminator::Branch {
            cond,
            taken,
            not_taken,
        } => {
            let ((it, lt), (in_, ln)) = match cond.cc() {
                Some(cc) => {
                    let (site, lt) =
                        exit_branch(&mut ops, &mut exit_cx, next(exits), Some(cc), relocs)?;
                    let it = direct(exits, taken, site, false);
                    let (site, ln) =
                        exit_branch(&mut ops, &mut exit_cx, next(exits), None, relocs)?;
                    let in_ = direct(exits, not_taken, site, false);
                    ((it, lt), (in_, ln))
                }
                None => {
                    // loop/jrcxz only have rel8 forms: branch over a rel32 jmp to a second one.
                    let inst = block
                        .term_inst
                        .as_ref()
                        .map(|i| i.inst.code())
                        .unwrap_or(Code::INVALID);
                    debug_assert!(matches!(cond, Cond::Loop | Cond::RcxZero));
                    let short_taken = ops.new_dynamic_label();
                    rcx_branch(&mut ops, inst, short_taken)?;
                    let (site, ln) =
                        exit_branch(&mut ops, &mut exit_cx, next(exits), None, relocs)?;
                    let in_ = direct(exits, not_taken, site, false);
                    dynasm!(ops ; .arch x64 ; =>short_taken);
                    let (site, lt) =
                        exit_branch(&mut ops, &mut exit_cx, next(exits), None, relocs)?;
                    let it = direct(exits, taken, site, false);
                    ((it, lt), (in_, ln))
                }
            };
            place_stub(&mut ops, lt, it);
            place_stub(&mut ops, ln, in_);
        }
        Terminator::Syscall { next } => {
            let at = block
                .term_inst
                .as_ref()
                .map(|i| i.addr())
                .unwrap_or(block.start);
            exits.push(Exit {
                block: id,
                kind: ExitKind::Syscall { at, next },
            });
            let l = ops.new_dynamic_label();
            let index = first_exit + exits.len() as u32 - 1;
            let at = exit_stub(&mut ops, l, index, exit_addr);
            stub_fields(relocs, chunk_base, index, at);
        }
        Terminator::Trap { kind, at } => {
            exits.push(Exit {
                block: id,
                kind: ExitKind::Trap {
                    kind,
                    at,
                    next: block.end(),
                },
            });
            let l = ops.new_dynamic_label();
            let index = first_exit + exits.len() as u32 - 1;
            let at = exit_stub(&mut ops, l, index, exit_addr);
            stub_fields(relocs, chunk_base, index, at);
        }
        Terminator::Return => {
            let inst = &block
                .term_inst
                .as_ref()
                .expect("a return has its instruction")
                .inst;
            let (borrowed, miss) = return_through_lookup(&mut ops, return_pop(inst), &cx.gateway);
            layout.rcx_borrowed_from = Some(chunk_base + borrowed);
            relocs.add(chunk_base + miss, RelocKind::Gateway(Routine::Exit));
        }
        // A jump through a register other than RCX and RSP looks its target up where it is,
        // borrowing RCX alone (`emit_ibl_in`). (A jump through memory keeps the lookup below,
        // which loads the target into RCX: with the target loaded into a borrowed R11 instead,
        // sqlite3 ran 6-9 % slower without the monitor, for a reason not found; see
        // docs/measurements.md.)
        Terminator::IndirectJump
            if block.term_inst.as_ref().is_some_and(|i| {
                i.inst.op0_kind() == OpKind::Register
                    && !matches!(i.inst.op0_register(), Register::RCX | Register::RSP)
            }) =>
        {
            let inst = block
                .term_inst
                .as_ref()
                .expect("an indirect branch has its instruction")
                .inst;
            dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx);
            code.append(assembled(ops, "indirect jump")?);
            layout.rcx_borrowed_from = Some(code.addr());
            let tail_base = code.addr();
            let mut tail: VecAssembler<X64Relocation> = VecAssembler::new(tail_base as usize);
            let miss = emit_ibl_in(&mut tail, &cx.gateway, inst.op0_register(), false);
            relocs.add(tail_base + miss, RelocKind::Gateway(Routine::Exit));
            code.append(assembled(tail, "indirect jump")?);
            return Ok(exit_list);
        }
        Terminator::IndirectJump | Terminator::IndirectCall { .. } => {
            let inst = block
                .term_inst
                .as_ref()
                .expect("an indirect branch has its instruction")
                .inst;
            load_indirect_target(ops, &inst, code, layout, relocs, "indirect branch")?;
            let tail_base = code.addr();
            let mut tail: VecAssembler<X64Relocation> = VecAssembler::new(tail_base as usize);
            if let Terminator::IndirectCall { return_to } = block.terminator {
                let lookup = indirect_call_lookup(&mut tail, tail_base, &cx.gateway, return_to);
                for at in lookup.imms {
                    pushed(relocs, tail_base, Some(at), false);
                }
                for miss in lookup.misses {
                    relocs.add(tail_base + miss, RelocKind::Gateway(Routine::IblMiss));
                }
                pushed(relocs, tail_base, lookup.literal, true);
                code.append(assembled(tail, "indirect call")?);
                return Ok(exit_list);
            }
            let miss = emit_ibl(&mut tail, &cx.gateway);
            relocs.add(tail_base + miss, RelocKind::Gateway(Routine::IblMiss));
            code.append(assembled(tail, "indirect branch")?);
            return Ok(exit_list);
        }
    }
    for (index, at) in inline_stubs {
        stub_fields(relocs, chunk_base, index, at);
    }
    code.append(assembled(ops, "terminator")?);
    Ok(exit_list)
}

/// Where a terminator's direct exits get their exit stubs: in `cold` when the translation has
/// a cold part, else in line after the terminator's code.
struct ExitStubs<'a> {
    /// Host address the terminator's assembler starts at.
    base: u64,
    cold: Option<&'a mut ColdCode>,
    first_exit: u32,
    exit_addr: usize,
}

/// Emits the chainable `jmp rel32` (`cc` given: `jcc rel32`) of direct exit `index`, whose
/// `rel32` leads to its exit stub until the exit is linked. With a cold part, the stub is
/// appended to it now (its fields recorded) and the branch's `rel32` is a local relocation;
/// else the stub is for the caller to emit (with [`exit_stub`]) at the returned label, where
/// execution never falls through. Returns the branch's patch site and that label.
///
/// # Errors
/// [`TranslateError::Assemble`] if dynasm rejects the stub (a bug in hotpath).
fn exit_branch(
    ops: &mut VecAssembler<X64Relocation>,
    stubs: &mut ExitStubs<'_>,
    index: u32,
    cc: Option<u8>,
    relocs: &mut Relocs,
) -> Result<(HostAddr, Option<DynamicLabel>), TranslateError> {
    let Some(cold) = stubs.cold.as_deref_mut() else {
        let l = ops.new_dynamic_label();
        let site = match cc {
            Some(cc) => patchable_jcc(ops, stubs.base, cc, l),
            None => patchable_jmp(ops, stubs.base, l),
        };
        return Ok((site, Some(l)));
    };
    let stub_at = cold.addr();
    let mut c: VecAssembler<X64Relocation> = VecAssembler::new(stub_at as usize);
    let l = c.new_dynamic_label();
    let (index_at, exit_at) = exit_stub(&mut c, l, index, stubs.exit_addr);
    relocs.add(
        stub_at + index_at,
        RelocKind::Exit(index - stubs.first_exit),
    );
    relocs.add(stub_at + exit_at, RelocKind::Gateway(Routine::Exit));
    cold.bytes.extend(assembled(c, "exit stub")?);
    let opcode_len = if cc.is_some() { 2 } else { 1 };
    align_patchable(ops, stubs.base, opcode_len);
    let end = stubs.base + ops.offset().0 as u64 + opcode_len + 4;
    let rel = stub_at.wrapping_sub(end) as i64 as i32;
    match cc {
        Some(cc) => dynasm!(ops ; .arch x64 ; .u8 0x0f ; .u8 0x80 | cc ; .i32 rel),
        None => dynasm!(ops ; .arch x64 ; .u8 0xe9 ; .i32 rel),
    }
    let site = patch_site(ops, stubs.base);
    relocs.add(site.0, RelocKind::Local { target: stub_at });
    Ok((site, None))
}

/// Where the parts of an [`indirect_call_lookup`] that depend on its placement are, as offsets
/// from the assembler's start.
pub(crate) struct IndirectCallLookup {
    /// The two `rel32`s to the gateway's miss routine.
    pub misses: [u64; 2],
    /// Each `push imm32`'s immediate and the address it pushes.
    pub imms: Vec<(u64, GuestAddr)>,
    /// The 64-bit literal a `push qword [rip+literal]` reads, and its address.
    pub literal: Option<(u64, GuestAddr)>,
}

/// The lookup of an indirect call whose target is in RCX (the guest's RCX in its scratch
/// slot), pushing `return_to` after the lookup (nothing is written below RSP for a
/// non-canonical target) on its hit and miss paths, and the literal a 64-bit return address
/// is pushed from placed after it.
pub(crate) fn indirect_call_lookup(
    ops: &mut VecAssembler<X64Relocation>,
    base: u64,
    gateway: &Gateway,
    return_to: GuestAddr,
) -> IndirectCallLookup {
    let mut literal: Option<ReturnLiteral> = None;
    let mut imms = Vec::new();
    let misses = emit_ibl_call(ops, gateway, &mut |ops| {
        let l = match &literal {
            Some(ReturnLiteral {
                literal: Some((label, _)),
                ..
            }) => {
                let label = *label;
                dynasm!(ops ; .arch x64 ; push QWORD [=>label]);
                return;
            }
            _ => push_return_address(ops, return_to),
        };
        imms.extend(l.imm);
        literal.get_or_insert(l);
    });
    let literal = literal.and_then(|l| l.place(ops, base));
    IndirectCallLookup {
        misses,
        imms,
        literal,
    }
}

/// Appends `ops` and then the load of indirect branch `inst`'s target into RCX, with the
/// guest's own operand, before anything moves RSP (`what` names the code in errors): from
/// there on RCX is borrowed, the guest's in its scratch slot, and `layout` says so.
pub(crate) fn load_indirect_target(
    mut ops: VecAssembler<X64Relocation>,
    inst: &Instruction,
    code: &mut Code_,
    layout: &mut HostLayout,
    relocs: &mut Relocs,
    what: &'static str,
) -> Result<(), TranslateError> {
    dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx);
    code.append(assembled(ops, what)?);
    layout.rcx_borrowed_from = Some(code.addr());
    let load = target_load(inst)?;
    let encoded = encode_at(&[load], code.addr())?;
    let base = code.addr();
    layout
        .far_borrows
        .extend(encoded.borrows.iter().map(|&(o, r)| (base + o, r)));
    relocs.add_all(base, &encoded.relocs);
    code.append(encoded.bytes);
    Ok(())
}

/// Appends a `ret` popping `pop` bytes, as a jump through the indirect branch lookup. Returns
/// the assembler offset from which RCX is borrowed (the guest's is in `scratch_rcx`) and the
/// offset of the lookup's `rel32` to the gateway's exit (the return address in a borrowed R11,
/// looked up by [`emit_ibl_in`]).
pub(crate) fn return_through_lookup(
    ops: &mut VecAssembler<X64Relocation>,
    pop: i32,
    gateway: &Gateway,
) -> (u64, u64) {
    dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx);
    let borrowed = ops.offset().0 as u64;
    // The return address into R11 (a fault there leaves R11 the guest's), then the lookup
    // that borrows RCX besides.
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::SCRATCH_R11], r11
        ; mov r11, QWORD [rsp]
        ; lea rsp, [rsp + pop]
    );
    (borrowed, emit_ibl_in(ops, gateway, Register::R11, true))
}

/// `mov rcx, <operand of the indirect jmp/call>`, as an iced instruction at the guest's address
/// (the encoder rebases RIP-relative operands).
fn target_load(inst: &Instruction) -> Result<Instruction, TranslateError> {
    let bad = |why: &str| TranslateError::Encode {
        guest: inst.ip(),
        reason: why.to_string(),
    };
    let mut load = match inst.op0_kind() {
        OpKind::Register => {
            Instruction::with2(Code::Mov_r64_rm64, Register::RCX, inst.op0_register())
        }
        OpKind::Memory => {
            let mem = MemoryOperand::new(
                inst.memory_base(),
                inst.memory_index(),
                inst.memory_index_scale(),
                inst.memory_displacement64() as i64,
                inst.memory_displ_size(),
                false,
                inst.segment_prefix(),
            );
            Instruction::with2(Code::Mov_r64_rm64, Register::RCX, mem)
        }
        k => return Err(bad(&format!("indirect branch operand {k:?}"))),
    }
    .map_err(|e| bad(&e.to_string()))?;
    load.set_ip(inst.ip());
    Ok(load)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    /// Decodes `bytes` at `rip` into instructions.
    fn decode_all(bytes: &[u8], rip: u64) -> Vec<Instruction> {
        Decoder::with_ip(64, bytes, rip, DecoderOptions::NONE)
            .into_iter()
            .collect()
    }

    /// A guest instruction decoded at guest address `ip`.
    fn guest(bytes: &[u8], ip: u64) -> Instruction {
        decode_all(bytes, ip)[0]
    }

    const GUEST: u64 = 0x7f00_0000_1000;
    const NEAR: u64 = GUEST + 0x10_0000;
    const FAR: u64 = 0x5555_0000_0000;

    #[test]
    fn near_rip_relative_operands_stay_rip_relative() {
        // mov rax, [rip + 0x100]
        let i = guest(&[0x48, 0x8b, 0x05, 0x00, 0x01, 0, 0], GUEST);
        let e = encode_at(&[i], NEAR).unwrap();
        let out = decode_all(&e.bytes, NEAR);
        assert_eq!(out.len(), 1);
        assert!(out[0].is_ip_rel_memory_operand());
        assert_eq!(out[0].ip_rel_memory_address(), GUEST + 7 + 0x100);
        assert!(e.borrows.is_empty());
    }

    /// A body of `bytes` decoded at `GUEST` as the decoder lifts it (with its guest bytes).
    fn block_of(bytes: &[u8]) -> Block {
        let mut d = Decoder::with_ip(64, bytes, GUEST, DecoderOptions::NONE);
        let mut body = Vec::new();
        while d.can_decode() {
            let i = d.decode();
            let o = d.get_constant_offsets(&i);
            let disp = o.has_displacement().then(|| o.displacement_offset() as u8);
            body.push(Inst::new(i).with_rip_disp_offset(disp));
        }
        Block {
            start: GuestAddr(GUEST),
            body,
            term_inst: None,
            terminator: Terminator::FallThrough {
                next: GuestAddr(GUEST + bytes.len() as u64),
            },
            len_bytes: bytes.len() as u32,
            code: bytes.to_vec(),
        }
    }

    #[test]
    fn body_instructions_are_copied_with_rip_displacements_patched() {
        // add rax, rbx; 66 nop; cmp dword [rip + 0x40], 0x12345678 (an immediate after the
        // displacement); vmovdqu ymm0, [rip - 0x20]; mov rcx, [rsp + 8]
        let bytes = [
            0x48, 0x01, 0xd8, //
            0x66, 0x90, //
            0x81, 0x3d, 0x40, 0, 0, 0, 0x78, 0x56, 0x34, 0x12, //
            0xc5, 0xfe, 0x6f, 0x05, 0xe0, 0xff, 0xff, 0xff, //
            0x48, 0x8b, 0x4c, 0x24, 0x08,
        ];
        let block = block_of(&bytes);
        let mut code = Code_::new(NEAR, None);
        let mut layout = HostLayout::default();
        append_body(&block, &mut code, &mut layout, &mut Relocs::default()).unwrap();
        // Same length, same bytes but the two displacements.
        assert_eq!(code.bytes.len(), bytes.len());
        assert_eq!(code.bytes[..5], bytes[..5]);
        assert_eq!(code.bytes[23..], bytes[23..]);
        let guest_insts = decode_all(&bytes, GUEST);
        let host_insts = decode_all(&code.bytes, NEAR);
        for (g, h) in guest_insts.iter().zip(&host_insts) {
            assert_eq!(g.code(), h.code());
            assert_eq!(g.is_ip_rel_memory_operand(), h.is_ip_rel_memory_operand());
            if g.is_ip_rel_memory_operand() {
                assert_eq!(g.ip_rel_memory_address(), h.ip_rel_memory_address());
            }
        }
        assert_eq!(host_insts[2].immediate32(), 0x1234_5678);
        let starts: Vec<u64> = layout.body.iter().map(|&(h, _)| h - NEAR).collect();
        assert_eq!(starts, [0, 3, 5, 15, 23]);
    }

    #[test]
    fn far_body_operands_are_rewritten_not_copied() {
        // mov rax, [rip + 0x100] from a library far from the cache.
        let block = block_of(&[0x48, 0x8b, 0x05, 0x00, 0x01, 0, 0]);
        let mut code = Code_::new(FAR, None);
        let mut layout = HostLayout::default();
        append_body(&block, &mut code, &mut layout, &mut Relocs::default()).unwrap();
        let out = decode_all(&code.bytes, FAR);
        assert!(out.iter().all(|i| !i.is_ip_rel_memory_operand()));
        assert!(out
            .iter()
            .any(|i| i.code() == Code::Mov_r64_imm64 && i.immediate64() == GUEST + 7 + 0x100));
    }

    #[test]
    fn far_lea_becomes_a_move_of_the_address() {
        // lea rdi, [rip + 0x20]; lea esi, [rip - 0x10]
        let a = guest(&[0x48, 0x8d, 0x3d, 0x20, 0, 0, 0], GUEST);
        let b = guest(&[0x8d, 0x35, 0xf0, 0xff, 0xff, 0xff], GUEST + 7);
        let e = encode_at(&[a, b], FAR).unwrap();
        let out = decode_all(&e.bytes, FAR);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].code(), Code::Mov_r64_imm64);
        assert_eq!(out[0].op0_register(), Register::RDI);
        assert_eq!(out[0].immediate64(), GUEST + 7 + 0x20);
        assert_eq!(out[1].code(), Code::Mov_r32_imm32);
        assert_eq!(
            out[1].immediate32() as u64,
            (GUEST + 13 - 0x10) & 0xffff_ffff
        );
        assert_eq!(e.offsets, vec![0, out[0].len() as u64]);
        assert!(e.borrows.is_empty());
    }

    #[test]
    fn far_memory_operand_borrows_a_register_it_does_not_use() {
        // add [rip + 0x40], eax: uses RAX, so RCX is borrowed.
        let i = guest(&[0x01, 0x05, 0x40, 0, 0, 0], GUEST);
        let e = encode_at(&[i], FAR).unwrap();
        let out = decode_all(&e.bytes, FAR);
        let names: Vec<Mnemonic> = out.iter().map(|i| i.mnemonic()).collect();
        assert_eq!(
            names,
            [Mnemonic::Mov, Mnemonic::Mov, Mnemonic::Add, Mnemonic::Mov]
        );
        // Save RCX to gs:[scratch_far], load the address, the guest's add through [rcx],
        // give RCX back.
        assert_eq!(out[0].segment_prefix(), Register::GS);
        assert_eq!(out[0].memory_displacement64(), off::SCRATCH_FAR as u64);
        assert_eq!(out[0].op1_register(), Register::RCX);
        assert_eq!(out[1].immediate64(), GUEST + 6 + 0x40);
        assert_eq!(out[2].memory_base(), Register::RCX);
        assert_eq!(out[2].memory_displacement64(), 0);
        assert_eq!(out[2].op1_register(), Register::EAX);
        assert_eq!(out[3].op0_register(), Register::RCX);
        assert_eq!(out[3].segment_prefix(), Register::GS);
        // The fault point is the add itself, with RCX borrowed there.
        let add_at = out[2].ip() - FAR;
        assert_eq!(e.offsets, vec![add_at]);
        assert_eq!(e.borrows, vec![(add_at, 1)]);
    }

    #[test]
    fn far_load_into_a_whole_register_addresses_through_it() {
        // mov rdx, [rip + 0x40] (48 8b 15): RDX is the address register; nothing after the
        // load, which overwrites it.
        let i = guest(&[0x48, 0x8b, 0x15, 0x40, 0, 0, 0], GUEST);
        let e = encode_at(&[i], FAR).unwrap();
        let out = decode_all(&e.bytes, FAR);
        let names: Vec<Mnemonic> = out.iter().map(|i| i.mnemonic()).collect();
        assert_eq!(names, [Mnemonic::Mov, Mnemonic::Mov, Mnemonic::Mov]);
        assert_eq!(out[0].segment_prefix(), Register::GS);
        assert_eq!(out[0].op1_register(), Register::RDX);
        assert_eq!(out[1].op0_register(), Register::RDX);
        assert_eq!(out[1].immediate64(), GUEST + 7 + 0x40);
        assert_eq!(out[2].op0_register(), Register::RDX);
        assert_eq!(out[2].memory_base(), Register::RDX);
        // A fault at the load shows RDX's guest value, from scratch_far.
        let load_at = out[2].ip() - FAR;
        assert_eq!(e.borrows, vec![(load_at, 2)]);

        // movzx ecx, byte [rip + 0x40] (0f b6 0d) clears RCX's upper half: through RCX too.
        let i = guest(&[0x0f, 0xb6, 0x0d, 0x40, 0, 0, 0], GUEST);
        let out = decode_all(&encode_at(&[i], FAR).unwrap().bytes, FAR);
        assert_eq!(out.len(), 3);
        assert_eq!(out[2].memory_base(), Register::RCX);

        // mov cx, [rip + 0x40] (66 8b 0d) keeps RCX's upper bytes: another register is
        // borrowed and given back.
        let i = guest(&[0x66, 0x8b, 0x0d, 0x40, 0, 0, 0], GUEST);
        let out = decode_all(&encode_at(&[i], FAR).unwrap().bytes, FAR);
        assert_eq!(out.len(), 4);
        assert_ne!(out[2].memory_base().full_register(), Register::RCX);
    }

    #[test]
    fn implicit_registers_are_never_borrowed() {
        // rep movsb is not RIP-relative; cmpxchg [rip+8], ecx uses RAX implicitly and RCX.
        let i = guest(&[0x0f, 0xb1, 0x0d, 0x08, 0, 0, 0], GUEST);
        let e = encode_at(&[i], FAR).unwrap();
        let out = decode_all(&e.bytes, FAR);
        assert_eq!(out[2].mnemonic(), Mnemonic::Cmpxchg);
        assert_eq!(out[2].memory_base(), Register::RDX);
        assert_eq!(e.borrows[0].1, 2);
    }
}
