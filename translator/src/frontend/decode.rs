//! Decoding guest bytes with iced-x86 and lifting them to an IR [`Block`].
//!
//! A block ends at the first control transfer, `syscall`, trapping instruction, instruction
//! hotpath must not run (one that changes GS, which hotpath owns), unreadable or undecodable bytes,
//! or after [`MAX_BLOCK_INSTRUCTIONS`] instructions; code on pages the guest may write also
//! ends after each instruction that writes memory ([`decode_block_split`]).

use iced_x86::{
    Code, ConditionCode, Decoder, DecoderError, DecoderOptions, FlowControl, Instruction,
    InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register,
};

use hotpath_ir::{Block, Cond, GuestAddr, Inst, Terminator, TrapKind};

use crate::host::guest_mem;

/// Most guest instructions in one block (a size limit, so one block's host code stays small).
pub const MAX_BLOCK_INSTRUCTIONS: usize = 64;

/// Most guest bytes read to decode one block: 64 instructions of up to 15 bytes.
pub(crate) const MAX_BLOCK_BYTES: usize = MAX_BLOCK_INSTRUCTIONS * 15;

/// Decodes the block starting at guest address `start`.
///
/// Never fails: bytes that cannot be read or decoded become a [`Terminator::Trap`] at the
/// address where they start.
pub fn decode_block(start: GuestAddr) -> Block {
    decode_block_from(start, guest_mem::read_partial)
}

/// [`decode_block`] with the guest's bytes read by `fetch(addr, buf)`, which fills `buf` from
/// guest address `addr` up to the first unreadable byte and returns how many it read.
pub fn decode_block_from(start: GuestAddr, fetch: impl FnOnce(u64, &mut [u8]) -> usize) -> Block {
    decode_block_limited(start, MAX_BLOCK_INSTRUCTIONS, fetch)
}

/// [`decode_block_from`] with at most `max` instructions (1..=[`MAX_BLOCK_INSTRUCTIONS`]):
/// single-stepping translates one guest instruction per block.
pub fn decode_block_limited(
    start: GuestAddr,
    max: usize,
    fetch: impl FnOnce(u64, &mut [u8]) -> usize,
) -> Block {
    decode_block_split(start, max, false, fetch)
}

/// [`decode_block_limited`], ending the block after every instruction that may write memory
/// when `split_after_writes`: code on a page the guest may write, so that a store into the
/// running block is seen before its next instruction (the store's write fault sends the
/// thread out of the code cache at the block's end, `smc`).
pub fn decode_block_split(
    start: GuestAddr,
    max: usize,
    split_after_writes: bool,
    fetch: impl FnOnce(u64, &mut [u8]) -> usize,
) -> Block {
    let max = max.clamp(1, MAX_BLOCK_INSTRUCTIONS);
    let mut writes = split_after_writes.then(InstructionInfoFactory::new);
    let mut buf = vec![0u8; MAX_BLOCK_BYTES];
    let readable = fetch(start.0, &mut buf);
    buf.truncate(readable);
    let fetch_cut = readable < MAX_BLOCK_BYTES;

    let mut decoder = Decoder::with_ip(64, &buf, start.0, DecoderOptions::NONE);
    let mut body: Vec<Inst> = Vec::new();
    let mut inst = Instruction::default();
    let finish = |body: Vec<Inst>, term_inst: Option<Inst>, terminator: Terminator, end: u64| {
        let len_bytes = (end - start.0) as u32;
        let code = buf[..len_bytes as usize].to_vec();
        Block {
            start,
            body,
            term_inst,
            terminator,
            len_bytes,
            code,
        }
    };
    loop {
        let ip = decoder.ip();
        if body.len() >= max {
            return finish(
                body,
                None,
                Terminator::FallThrough {
                    next: GuestAddr(ip),
                },
                ip,
            );
        }
        if !decoder.can_decode() {
            let term = if fetch_cut {
                Terminator::Trap {
                    kind: TrapKind::FetchFault,
                    at: GuestAddr(ip),
                }
            } else {
                Terminator::FallThrough {
                    next: GuestAddr(ip),
                }
            };
            return finish(body, None, term, ip);
        }
        decoder.decode_out(&mut inst);
        if inst.is_invalid() {
            let term = match decoder.last_error() {
                DecoderError::NoMoreBytes if fetch_cut => Terminator::Trap {
                    kind: TrapKind::FetchFault,
                    at: GuestAddr(ip),
                },
                DecoderError::NoMoreBytes => Terminator::FallThrough {
                    next: GuestAddr(ip),
                },
                _ => Terminator::Trap {
                    kind: TrapKind::Undefined,
                    at: GuestAddr(ip),
                },
            };
            return finish(body, None, term, ip);
        }
        let next = GuestAddr(inst.next_ip());
        match classify(&inst, next) {
            None => {
                let disp = inst
                    .is_ip_rel_memory_operand()
                    .then(|| decoder.get_constant_offsets(&inst))
                    .filter(|o| o.has_displacement() && o.displacement_size() == 4)
                    .map(|o| o.displacement_offset() as u8);
                body.push(Inst::new(inst).with_rip_disp_offset(disp));
                if writes.as_mut().is_some_and(|f| writes_memory(f, &inst)) {
                    return finish(body, None, Terminator::FallThrough { next }, next.0);
                }
            }
            Some(term) => return finish(body, Some(Inst::new(inst)), term, next.0),
        }
    }
}

/// Whether `inst` may write memory (explicit operands, the stack, string destinations).
fn writes_memory(factory: &mut InstructionInfoFactory, inst: &Instruction) -> bool {
    factory.info(inst).used_memory().iter().any(|m| {
        matches!(
            m.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        )
    })
}

/// Whether `i` is a system instruction whose fault in user mode differs between machines (by
/// vendor, or by hypervisor: `sysenter` is #UD on AMD in 64-bit mode and a compat system call
/// entry on Intel; `vmcall` and `vmmcall` are what the hypervisor makes of them), or that
/// faults without exception on every one (`swapgs`, `sysret`, `sysexit`: #GP), which
/// [`probe_system_instruction`] finds out on this machine.
pub fn is_system_instruction(i: &Instruction) -> bool {
    matches!(
        i.mnemonic(),
        Mnemonic::Swapgs
            | Mnemonic::Sysret
            | Mnemonic::Sysretq
            | Mnemonic::Sysexit
            | Mnemonic::Sysexitq
            | Mnemonic::Sysenter
            | Mnemonic::Vmcall
            | Mnemonic::Vmmcall
    )
}

/// The terminator `inst` ends its block with, or `None` if it belongs in the body.
fn classify(inst: &Instruction, next: GuestAddr) -> Option<Terminator> {
    let at = GuestAddr(inst.ip());
    let trap = |kind| Some(Terminator::Trap { kind, at });
    if writes_gs(inst) {
        return trap(TrapKind::Unsupported);
    }
    if inst.code() == Code::Syscall {
        return Some(Terminator::Syscall { next });
    }
    match inst.flow_control() {
        FlowControl::Next => match inst.mnemonic() {
            Mnemonic::Hlt => trap(TrapKind::Privileged),
            // It may set EFLAGS.TF (single-stepping), which the dispatcher must see before
            // the next instruction runs: it pops the flags itself (see `special`).
            Mnemonic::Popf | Mnemonic::Popfq => trap(TrapKind::Unsupported),
            // With protection keys, PKRU also governs hotpath's own memory (key 0): the
            // dispatcher checks the value first (see `special`). Without them it is #UD.
            Mnemonic::Wrpkru if crate::host::cpu::host_pku() => trap(TrapKind::Unsupported),
            _ if is_system_instruction(inst) => trap(TrapKind::Unsupported),
            // With the time-stamp counter disabled (`PR_SET_TSC`): #GP, as in user mode with
            // CR4.TSD set.
            Mnemonic::Rdtsc | Mnemonic::Rdtscp if crate::host::cpu::tsc_sigsegv() => {
                trap(TrapKind::Privileged)
            }
            _ => None,
        },
        FlowControl::UnconditionalBranch if inst.is_jmp_short_or_near() => Some(Terminator::Jump {
            target: GuestAddr(inst.near_branch_target()),
        }),
        FlowControl::ConditionalBranch => {
            let cond = match inst.mnemonic() {
                Mnemonic::Jrcxz | Mnemonic::Jecxz => Cond::RcxZero,
                Mnemonic::Loop | Mnemonic::Loope | Mnemonic::Loopne => Cond::Loop,
                _ if inst.is_jcc_short_or_near() => jcc_cond(inst.condition_code())?,
                _ => return trap(TrapKind::Unsupported),
            };
            Some(Terminator::Branch {
                cond,
                taken: GuestAddr(inst.near_branch_target()),
                not_taken: next,
            })
        }
        FlowControl::Call if inst.is_call_near() => Some(Terminator::Call {
            target: GuestAddr(inst.near_branch_target()),
            return_to: next,
        }),
        FlowControl::IndirectBranch if inst.is_jmp_near_indirect() => {
            Some(Terminator::IndirectJump)
        }
        FlowControl::IndirectCall if inst.is_call_near_indirect() => {
            Some(Terminator::IndirectCall { return_to: next })
        }
        FlowControl::Return if matches!(inst.code(), Code::Retnq | Code::Retnq_imm16) => {
            Some(Terminator::Return)
        }
        FlowControl::Interrupt => match inst.code() {
            Code::Int3 | Code::Int1 => trap(TrapKind::Breakpoint),
            Code::Int_imm8 if inst.immediate8() == 3 => trap(TrapKind::Breakpoint),
            Code::Int_imm8 if inst.immediate8() == 0x80 => trap(TrapKind::Unsupported),
            _ => trap(TrapKind::Privileged),
        },
        _ if is_system_instruction(inst) => trap(TrapKind::Unsupported),
        FlowControl::Exception => trap(TrapKind::Undefined),
        // Far transfers, iret, xbegin/xabort and anything else that changes control in ways
        // a user-mode x86-64 Linux program does not use.
        _ => trap(TrapKind::Unsupported),
    }
}

fn jcc_cond(cc: ConditionCode) -> Option<Cond> {
    Some(match cc {
        ConditionCode::o => Cond::O,
        ConditionCode::no => Cond::No,
        ConditionCode::b => Cond::B,
        ConditionCode::ae => Cond::Ae,
        ConditionCode::e => Cond::E,
        ConditionCode::ne => Cond::Ne,
        ConditionCode::be => Cond::Be,
        ConditionCode::a => Cond::A,
        ConditionCode::s => Cond::S,
        ConditionCode::ns => Cond::Ns,
        ConditionCode::p => Cond::P,
        ConditionCode::np => Cond::Np,
        ConditionCode::l => Cond::L,
        ConditionCode::ge => Cond::Ge,
        ConditionCode::le => Cond::Le,
        ConditionCode::g => Cond::G,
        ConditionCode::None => return None,
    })
}

/// True if `inst` changes the GS selector or base (`mov gs, r`, `pop gs`, `lgs`,
/// `wrgsbase`): hotpath keeps its per-thread area there, so such an instruction cannot run.
/// (A GS-relative memory operand runs, with the guest's GS base, 0: see
/// [`crate::backend::emit::Relocator`]; `mov r, gs` and `push gs` read selector 0, as natively;
/// `swapgs` is undefined in user mode.)
pub fn writes_gs(inst: &Instruction) -> bool {
    match inst.mnemonic() {
        Mnemonic::Wrgsbase | Mnemonic::Lgs => true,
        Mnemonic::Mov | Mnemonic::Pop => {
            inst.op_count() > 0
                && inst.op0_kind() == OpKind::Register
                && inst.op0_register() == Register::GS
        }
        _ => false,
    }
}

/// True if `inst` has a `gs:` prefix (on a memory operand, a string instruction's source, or
/// nothing). The guest's GS base is 0 (hotpath refuses `arch_prctl(ARCH_SET_GS)`), so the
/// emitter runs it with the prefix turned into a DS prefix, which 64-bit mode ignores.
pub fn gs_memory(inst: &Instruction) -> bool {
    inst.segment_prefix() == Register::GS
}

/// The 8-byte slot an indirect `jmp` or `call` ending `block` takes its target from, when
/// that is a plain RIP-relative operand (`jmp [rip+disp]`, a PLT entry's jump through its GOT
/// slot; `call [rip+disp]`, a call compiled with `-fno-plt`): no base, index or segment
/// override. Where the slot cannot change without a system call, the translator may take the
/// target read there as constant ([`with_direct_target`]).
pub fn constant_slot(block: &Block) -> Option<GuestAddr> {
    if !matches!(
        block.terminator,
        Terminator::IndirectJump | Terminator::IndirectCall { .. }
    ) {
        return None;
    }
    let inst = &block.term_inst.as_ref()?.inst;
    let plain = matches!(inst.code(), Code::Jmp_rm64 | Code::Call_rm64)
        && inst.op0_kind() == OpKind::Memory
        && inst.memory_base() == Register::RIP
        && inst.memory_index() == Register::None
        && inst.segment_prefix() == Register::None;
    plain.then(|| GuestAddr(inst.ip_rel_memory_address()))
}

/// `block`, whose indirect `jmp` or `call` reads [`constant_slot`], as the direct jump or call
/// to `target`, the slot's value: the block to emit. Its body, bytes and terminating
/// instruction are the same; the monitor still learns the block as decoded (an indirect
/// branch), and sees it go to `target` as it would.
pub fn with_direct_target(block: &Block, target: GuestAddr) -> Block {
    let terminator = match block.terminator {
        Terminator::IndirectCall { return_to } => Terminator::Call { target, return_to },
        _ => Terminator::Jump { target },
    };
    Block {
        terminator,
        ..block.clone()
    }
}

/// Bytes a `ret` (at `inst`) takes off the stack: the return address and its `imm16`.
pub(crate) fn return_pop(inst: &Instruction) -> i32 {
    8 + if inst.code() == Code::Retnq_imm16 {
        inst.immediate16() as i32
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_bytes(bytes: &[u8]) -> Block {
        // Put the bytes somewhere readable and decode them in place.
        let leaked: &'static [u8] = Box::leak(bytes.to_vec().into_boxed_slice());
        decode_block(GuestAddr(leaked.as_ptr() as u64))
    }

    /// Only a plain RIP-relative `jmp`/`call` operand is a slot that may be constant.
    #[test]
    fn constant_slots_are_plain_rip_relative_operands() {
        // jmp [rip+0x10]: the slot is 0x10 past the instruction's end.
        let b = decode_bytes(&[0xff, 0x25, 0x10, 0, 0, 0]);
        assert_eq!(constant_slot(&b), Some(GuestAddr(b.start.0 + 6 + 0x10)));
        let direct = with_direct_target(&b, GuestAddr(0x1234));
        assert!(matches!(
            direct.terminator,
            Terminator::Jump {
                target: GuestAddr(0x1234)
            }
        ));
        assert_eq!(
            (direct.body.len(), direct.len_bytes),
            (b.body.len(), b.len_bytes)
        );
        // call [rip-8]
        let b = decode_bytes(&[0xff, 0x15, 0xf8, 0xff, 0xff, 0xff]);
        assert_eq!(constant_slot(&b), Some(GuestAddr(b.start.0 + 6 - 8)));
        let return_to = GuestAddr(b.start.0 + 6);
        assert!(matches!(
            with_direct_target(&b, GuestAddr(0x1234)).terminator,
            Terminator::Call { target: GuestAddr(0x1234), return_to: r } if r == return_to
        ));
        for bytes in [
            &[0xff, 0xe0][..],                  // jmp rax
            &[0xff, 0x20],                      // jmp [rax]
            &[0x64, 0xff, 0x25, 0x10, 0, 0, 0], // jmp fs:[rip+0x10]
            &[0xff, 0x24, 0xc5, 0, 0x10, 0, 0], // jmp [rax*8+0x1000]
            &[0xc3],                            // ret
        ] {
            assert_eq!(constant_slot(&decode_bytes(bytes)), None, "{bytes:x?}");
        }
    }

    #[test]
    fn jcc_ends_block() {
        // add eax, 1 ; jne -4 ; (garbage after)
        let b = decode_bytes(&[0x83, 0xc0, 0x01, 0x75, 0xfb, 0x90]);
        assert_eq!(b.body.len(), 1);
        assert_eq!(b.len_bytes, 5);
        match b.terminator {
            Terminator::Branch {
                cond: Cond::Ne,
                taken,
                not_taken,
            } => {
                assert_eq!(not_taken.0, b.start.0 + 5);
                assert_eq!(taken.0, b.start.0);
            }
            t => panic!("{t:?}"),
        }
    }

    #[test]
    fn syscall_and_traps() {
        assert!(matches!(
            decode_bytes(&[0x0f, 0x05]).terminator,
            Terminator::Syscall { .. }
        ));
        assert!(matches!(
            decode_bytes(&[0x0f, 0x0b]).terminator,
            Terminator::Trap {
                kind: TrapKind::Undefined,
                ..
            }
        ));
        assert!(matches!(
            decode_bytes(&[0xcc]).terminator,
            Terminator::Trap {
                kind: TrapKind::Breakpoint,
                ..
            }
        ));
        assert!(matches!(
            decode_bytes(&[0xf4]).terminator,
            Terminator::Trap {
                kind: TrapKind::Privileged,
                ..
            }
        ));
        // mov rax, gs:[0] runs (GS base 0); mov gs, eax is refused
        let b = decode_bytes(&[0x65, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0, 0x8e, 0xe8]);
        assert_eq!(b.body.len(), 1);
        assert!(matches!(
            b.terminator,
            Terminator::Trap {
                kind: TrapKind::Unsupported,
                ..
            }
        ));
        // ret, call rax, jmp [rip+0]
        assert!(matches!(
            decode_bytes(&[0xc3]).terminator,
            Terminator::Return
        ));
        assert!(matches!(
            decode_bytes(&[0xff, 0xd0]).terminator,
            Terminator::IndirectCall { .. }
        ));
        assert!(matches!(
            decode_bytes(&[0xff, 0x25, 0, 0, 0, 0]).terminator,
            Terminator::IndirectJump
        ));
    }
}
