//! Dead-register scavenging: a general-purpose register the enqueue stub may use at a block's
//! entry without saving it, because the guest overwrites it before reading it.
//!
//! The rule, decided in [`scratch_register`]: register `R` is free at the entry of a block
//! body if some instruction writes all 64 bits of `R` (a 64-bit write, or a 32-bit write,
//! which zero-extends) before any instruction reads any part of it, and every instruction up to
//! and including that write *cannot fault* (see [`cannot_fault`]). The second half is what
//! keeps hotpath transparent: a fault before the write would hand the guest's signal handler a
//! register that still holds the stub's value instead of the guest's. Asynchronous signals are
//! delivered at block boundaries only, so nothing else can observe `R` in between.

use iced_x86::{InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register};

use crate::Inst;

/// How many body instructions the scan looks at before giving up (the write that frees a
/// register, when there is one, is almost always among a block's first few instructions).
const SCAN_LIMIT: usize = 8;

/// A 64-bit general-purpose register (never RSP) that is dead at the entry of `body` and
/// written before anything in `body` can fault, or `None`. RCX is preferred: the enqueue stub
/// needs its value in RCX for `jrcxz`, so a dead RCX spares it even a register move.
pub fn scratch_register(body: &[Inst]) -> Option<Register> {
    let dead = dead_registers(body);
    if dead == 0 {
        None
    } else if dead & bit(Register::RCX) != 0 {
        Some(Register::RCX)
    } else {
        Some(gpr64(dead.trailing_zeros()))
    }
}

/// True if 64-bit general-purpose register `reg` is dead at the entry of `body` and written
/// before anything in `body` can fault (as [`scratch_register`] finds them): code may enter
/// `body` with any value in it.
pub fn dead_at_entry(body: &[Inst], reg: Register) -> bool {
    dead_registers(body) & bit(reg) != 0
}

/// [`entry_dead`]'s bit saying the status flags are dead at entry (bits 0–15 are GPRs).
pub const FLAGS_DEAD: u32 = 1 << 16;

/// What code may enter `body` with any value in: bit i set for the 64-bit GPR numbered i
/// (RAX = 0 … R15 = 15) where [`dead_at_entry`] holds, and [`FLAGS_DEAD`] where
/// [`status_flags_dead_at_entry`] does. Computed once per translation and persisted with it,
/// so that a warm run answers without decoding the block again.
pub fn entry_dead(body: &[Inst]) -> u32 {
    let flags = if status_flags_dead_at_entry(body) {
        FLAGS_DEAD
    } else {
        0
    };
    dead_registers(body) as u32 | flags
}

/// The status flags (OF, SF, ZF, AF, CF, PF) in iced's `RflagsBits` layout.
const STATUS_FLAGS: u32 = iced_x86::RflagsBits::OF
    | iced_x86::RflagsBits::SF
    | iced_x86::RflagsBits::ZF
    | iced_x86::RflagsBits::AF
    | iced_x86::RflagsBits::CF
    | iced_x86::RflagsBits::PF;

/// True if `body` sets every status flag (OF, SF, ZF, AF, CF, PF) to a defined value before it
/// reads any and before anything in it can fault, within its first [`SCAN_LIMIT`]
/// instructions: code may enter `body` with any status flags. Flags an instruction leaves
/// undefined do not count as set, nor do a shift's or rotate's (a count of 0 keeps them).
pub fn status_flags_dead_at_entry(body: &[Inst]) -> bool {
    use Mnemonic::*;
    let mut set = 0u32;
    for inst in body.iter().take(SCAN_LIMIT) {
        let i = &inst.inst;
        if !cannot_fault(i) || i.rflags_read() & STATUS_FLAGS & !set != 0 {
            return false;
        }
        let counted = matches!(
            i.mnemonic(),
            Shl | Shr | Sar | Sal | Rol | Ror | Rcl | Rcr | Shld | Shrd
        );
        if !counted {
            set |= (i.rflags_written() | i.rflags_cleared() | i.rflags_set()) & STATUS_FLAGS;
        }
        if set == STATUS_FLAGS {
            return true;
        }
    }
    false
}

/// Bit i: the 64-bit GPR number i (never RSP) is written whole before it is read, and before
/// any instruction of `body` that can fault, within its first [`SCAN_LIMIT`] instructions.
fn dead_registers(body: &[Inst]) -> u16 {
    let mut factory = InstructionInfoFactory::new();
    // Bit i: the 64-bit GPR with number i has been read (so it is live at entry) / has been
    // completely written before any read (so it is dead at entry).
    let mut read = 0u16;
    let mut dead = 0u16;
    for inst in body.iter().take(SCAN_LIMIT) {
        if !cannot_fault(&inst.inst) {
            break;
        }
        let info = factory.info(&inst.inst);
        // Reads come before writes within one instruction (`add rax, rax` reads rax).
        for used in info.used_registers() {
            if is_read(used.access()) || (is_write(used.access()) && used.register().size() < 4) {
                read |= bit(used.register()) & !dead;
            }
        }
        for used in info.used_registers() {
            if used.access() == OpAccess::Write && used.register().size() >= 4 {
                dead |= bit(used.register()) & !read;
            }
        }
    }
    dead & !bit(Register::RSP)
}

/// True if `inst` can neither fault nor trap: a register-to-register or immediate form of an
/// integer instruction that touches no memory (`lea` and multi-byte `nop`s compute an address
/// but never access it) and only general-purpose registers. Instructions a CPU may lack
/// (BMI's `andn`, `shlx`…, `popcnt`: `#UD` there) are left out; `tzcnt` and `lzcnt` run as
/// `bsf` and `bsr` on such CPUs.
pub fn cannot_fault(inst: &iced_x86::Instruction) -> bool {
    use Mnemonic::*;
    let integer = matches!(
        inst.mnemonic(),
        Mov | Movzx
            | Movsx
            | Movsxd
            | Lea
            | Add
            | Sub
            | Adc
            | Sbb
            | And
            | Or
            | Xor
            | Cmp
            | Test
            | Inc
            | Dec
            | Neg
            | Not
            | Shl
            | Shr
            | Sar
            | Sal
            | Rol
            | Ror
            | Shld
            | Shrd
            | Imul
            | Mul
            | Bswap
            | Bt
            | Bsf
            | Bsr
            | Tzcnt
            | Lzcnt
            | Cdqe
            | Cqo
            | Cdq
            | Cwde
            | Cmova
            | Cmovae
            | Cmovb
            | Cmovbe
            | Cmove
            | Cmovg
            | Cmovge
            | Cmovl
            | Cmovle
            | Cmovne
            | Cmovno
            | Cmovnp
            | Cmovns
            | Cmovo
            | Cmovp
            | Cmovs
            | Seta
            | Setae
            | Setb
            | Setbe
            | Sete
            | Setg
            | Setge
            | Setl
            | Setle
            | Setne
            | Setno
            | Setnp
            | Setns
            | Seto
            | Setp
            | Sets
            | Nop
            | Endbr64
    );
    if !integer {
        return false;
    }
    if inst.mnemonic() == Nop {
        return true;
    }
    (0..inst.op_count()).all(|i| match inst.op_kind(i) {
        OpKind::Register => inst.op_register(i).is_gpr(),
        OpKind::Memory => inst.mnemonic() == Lea,
        OpKind::Immediate8
        | OpKind::Immediate8_2nd
        | OpKind::Immediate16
        | OpKind::Immediate32
        | OpKind::Immediate64
        | OpKind::Immediate8to16
        | OpKind::Immediate8to32
        | OpKind::Immediate8to64
        | OpKind::Immediate32to64 => true,
        _ => false,
    })
}

fn is_read(access: OpAccess) -> bool {
    matches!(
        access,
        OpAccess::Read
            | OpAccess::CondRead
            | OpAccess::ReadWrite
            | OpAccess::ReadCondWrite
            // A conditional write keeps the old value when the condition fails.
            | OpAccess::CondWrite
    )
}

fn is_write(access: OpAccess) -> bool {
    matches!(access, OpAccess::Write)
}

/// The bit of `reg`'s 64-bit register in a 16-bit GPR mask (0 for non-GPRs).
fn bit(reg: Register) -> u16 {
    let full = reg.full_register();
    if full.is_gpr64() {
        1 << (full as u32 - Register::RAX as u32)
    } else {
        0
    }
}

fn gpr64(n: u32) -> Register {
    gpr_numbered(n).expect("16 GPRs")
}

/// The 64-bit general-purpose register numbered `n` (RAX = 0 … R15 = 15, the numbering of
/// [`entry_dead`]'s bits), or `None` past 15.
pub fn gpr_numbered(n: u32) -> Option<Register> {
    Register::values().find(|r| r.is_gpr64() && *r as u32 - Register::RAX as u32 == n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn body(bytes: &[u8]) -> Vec<Inst> {
        let mut d = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE);
        let mut out = Vec::new();
        while d.can_decode() {
            out.push(Inst::new(d.decode()));
        }
        out
    }

    #[test]
    fn a_register_written_first_is_free() {
        // mov ebx, edi; lea edi, [rbx-1]; sub ebx, 2 (bench_fib's recursive step)
        assert_eq!(
            scratch_register(&body(&[0x89, 0xfb, 0x8d, 0x7b, 0xff, 0x83, 0xeb, 0x02])),
            Some(Register::RBX)
        );
    }

    #[test]
    fn status_flags_set_before_read_are_dead() {
        // lea eax, [rdx-1]; sub edx, 2 (bench_interp's OP_LT case)
        assert!(status_flags_dead_at_entry(&body(&[
            0x8d, 0x42, 0xff, 0x83, 0xea, 0x02
        ])));
        // xor ecx, ecx: OF and CF cleared, SF ZF PF set, AF undefined: not all defined
        assert!(!status_flags_dead_at_entry(&body(&[0x31, 0xc9])));
        // xor ecx, ecx; add eax, 1
        assert!(status_flags_dead_at_entry(&body(&[
            0x31, 0xc9, 0x83, 0xc0, 0x01
        ])));
    }

    #[test]
    fn status_flags_read_first_or_behind_a_fault_are_live() {
        // setl cl; sub edx, 2
        assert!(!status_flags_dead_at_entry(&body(&[
            0x0f, 0x9c, 0xc1, 0x83, 0xea, 0x02
        ])));
        // inc eax; sub edx, 2: sub sets the CF inc leaves, nothing is read
        assert!(status_flags_dead_at_entry(&body(&[
            0xff, 0xc0, 0x83, 0xea, 0x02
        ])));
        // adc eax, 0 reads CF
        assert!(!status_flags_dead_at_entry(&body(&[0x83, 0xd0, 0x00])));
        // mov rax, [rsp+8] can fault before sub edx, 2
        assert!(!status_flags_dead_at_entry(&body(&[
            0x48, 0x8b, 0x44, 0x24, 0x08, 0x83, 0xea, 0x02
        ])));
        // shl eax, cl keeps every flag when CL is 0
        assert!(!status_flags_dead_at_entry(&body(&[0xd3, 0xe0])));
        // inc eax leaves CF as it was
        assert!(!status_flags_dead_at_entry(&body(&[0xff, 0xc0])));
    }

    #[test]
    fn rcx_is_preferred() {
        // xor eax, eax; mov ecx, 5
        assert_eq!(
            scratch_register(&body(&[0x31, 0xc0, 0xb9, 5, 0, 0, 0])),
            Some(Register::RCX)
        );
    }

    #[test]
    fn a_register_read_first_is_live() {
        // add rax, 1; mov eax, 2
        assert_eq!(
            scratch_register(&body(&[0x48, 0x83, 0xc0, 0x01, 0xb8, 2, 0, 0, 0])),
            None
        );
        // lea rax, [rax+8] reads rax through the address
        assert_eq!(scratch_register(&body(&[0x48, 0x8d, 0x40, 0x08])), None);
    }

    #[test]
    fn partial_and_conditional_writes_keep_the_register_live() {
        // mov al, 1 (keeps bits 8..64); cmove eax, edx (keeps eax when not equal)
        assert_eq!(scratch_register(&body(&[0xb0, 0x01])), None);
        assert_eq!(scratch_register(&body(&[0x0f, 0x44, 0xc2])), None);
    }

    #[test]
    fn nothing_is_free_after_an_instruction_that_may_fault() {
        // mov rdx, [rdi]; mov eax, 1: a fault on the load must see the guest's rax
        assert_eq!(
            scratch_register(&body(&[0x48, 0x8b, 0x17, 0xb8, 1, 0, 0, 0])),
            None
        );
        // push rbp; mov ebp, esp
        assert_eq!(scratch_register(&body(&[0x55, 0x89, 0xe5])), None);
        // a load that writes its destination may fault before the write: not free either
        assert_eq!(scratch_register(&body(&[0x48, 0x8b, 0x07])), None);
    }

    #[test]
    fn rsp_is_never_chosen() {
        // mov esp, 0x1000 is a complete write of rsp, but the stub must not touch it
        assert_eq!(scratch_register(&body(&[0xbc, 0, 0x10, 0, 0])), None);
    }
}
