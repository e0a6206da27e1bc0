//! The explicit terminator of a block: how control leaves it.

use crate::GuestAddr;

/// A condition code of a conditional branch, as the x86 `Jcc` family encodes it
/// (plus the counter-based `loop`/`jrcxz` forms, which test RCX/ECX and do not read flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Cond {
    /// `jo`
    O,
    /// `jno`
    No,
    /// `jb` / `jc`
    B,
    /// `jae` / `jnc`
    Ae,
    /// `je` / `jz`
    E,
    /// `jne` / `jnz`
    Ne,
    /// `jbe`
    Be,
    /// `ja`
    A,
    /// `js`
    S,
    /// `jns`
    Ns,
    /// `jp`
    P,
    /// `jnp`
    Np,
    /// `jl`
    L,
    /// `jge`
    Ge,
    /// `jle`
    Le,
    /// `jg`
    G,
    /// `jrcxz` (64-bit address size) or `jecxz` (32-bit)
    RcxZero,
    /// `loop` / `loope` / `loopne`: decrement RCX, branch on the result (and ZF)
    Loop,
}

impl Cond {
    /// The x86 condition-code nibble (`0x0..=0xf`) for flag-based conditions, `None` for
    /// the RCX-based ones.
    pub fn cc(self) -> Option<u8> {
        use Cond::*;
        Some(match self {
            O => 0,
            No => 1,
            B => 2,
            Ae => 3,
            E => 4,
            Ne => 5,
            Be => 6,
            A => 7,
            S => 8,
            Ns => 9,
            P => 10,
            Np => 11,
            L => 12,
            Ge => 13,
            Le => 14,
            G => 15,
            RcxZero | Loop => return None,
        })
    }
}

/// Why a block traps: what the CPU would raise when it reaches the terminating instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum TrapKind {
    /// `int3`: SIGTRAP, reported after the instruction.
    Breakpoint,
    /// `ud2`, `ud0`, `ud1` and bytes that do not decode: SIGILL at the instruction.
    Undefined,
    /// A privileged or otherwise faulting instruction in user mode (`hlt`, `int n`, `in`, `out`...):
    /// SIGSEGV at the instruction.
    Privileged,
    /// The instruction's bytes cannot be read (unmapped or unreadable page): SIGSEGV.
    FetchFault,
    /// An instruction the translator does not run in the code cache: the dispatcher carries
    /// it out itself (`popf`, a far return or `iretq` to 64-bit code, `xbegin`, `wrpkru` where
    /// protection keys are on) or, when hotpath does not support it (e.g. it writes the GS
    /// segment, which hotpath owns), stops with a message naming the instruction.
    Unsupported,
}

/// How control leaves a block. Targets are guest addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Terminator {
    /// `jmp rel` to a known target.
    Jump { target: GuestAddr },
    /// `jcc`, `loop*`, `jrcxz`: to `taken` if the condition holds, else to `not_taken`.
    Branch {
        cond: Cond,
        taken: GuestAddr,
        not_taken: GuestAddr,
    },
    /// `call rel`: pushes `return_to` (a guest address) and goes to `target`.
    Call {
        target: GuestAddr,
        return_to: GuestAddr,
    },
    /// The block was cut by the size limit (or before an instruction that starts a new block);
    /// control falls through to `next`.
    FallThrough { next: GuestAddr },
    /// `jmp reg/mem`.
    IndirectJump,
    /// `call reg/mem`: pushes `return_to`.
    IndirectCall { return_to: GuestAddr },
    /// `ret` / `ret imm16`.
    Return,
    /// `syscall`; the guest resumes at `next`.
    Syscall { next: GuestAddr },
    /// The terminating instruction raises a signal; `at` is its guest address.
    Trap { kind: TrapKind, at: GuestAddr },
}

/// The class of a terminator as the monitor-thread patent classifies blocks, refined by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TerminatorKind {
    Jump,
    Branch,
    Call,
    FallThrough,
    IndirectJump,
    IndirectCall,
    Return,
    Syscall,
    Trap,
}

impl TerminatorKind {
    /// A short lower-case name, as used in reports (`"branch"`, `"indirect_call"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TerminatorKind::Jump => "jump",
            TerminatorKind::Branch => "branch",
            TerminatorKind::Call => "call",
            TerminatorKind::FallThrough => "fallthrough",
            TerminatorKind::IndirectJump => "indirect_jump",
            TerminatorKind::IndirectCall => "indirect_call",
            TerminatorKind::Return => "return",
            TerminatorKind::Syscall => "syscall",
            TerminatorKind::Trap => "trap",
        }
    }
}

impl Terminator {
    /// The terminator's kind, without its operands.
    pub fn kind(&self) -> TerminatorKind {
        match self {
            Terminator::Jump { .. } => TerminatorKind::Jump,
            Terminator::Branch { .. } => TerminatorKind::Branch,
            Terminator::Call { .. } => TerminatorKind::Call,
            Terminator::FallThrough { .. } => TerminatorKind::FallThrough,
            Terminator::IndirectJump => TerminatorKind::IndirectJump,
            Terminator::IndirectCall { .. } => TerminatorKind::IndirectCall,
            Terminator::Return => TerminatorKind::Return,
            Terminator::Syscall { .. } => TerminatorKind::Syscall,
            Terminator::Trap { .. } => TerminatorKind::Trap,
        }
    }

    /// The return address of a call (direct or indirect), `None` for other terminators.
    pub fn return_address(&self) -> Option<GuestAddr> {
        match *self {
            Terminator::Call { return_to, .. } | Terminator::IndirectCall { return_to } => {
                Some(return_to)
            }
            _ => None,
        }
    }

    /// Statically known successors (guest addresses), in the order taken, not-taken.
    /// A call's successor is its target; its return address is not a successor of the block.
    pub fn static_successors(&self) -> Vec<GuestAddr> {
        match *self {
            Terminator::Jump { target } | Terminator::Call { target, .. } => vec![target],
            Terminator::Branch {
                taken, not_taken, ..
            } => vec![taken, not_taken],
            Terminator::FallThrough { next } | Terminator::Syscall { next } => vec![next],
            Terminator::IndirectJump
            | Terminator::IndirectCall { .. }
            | Terminator::Return
            | Terminator::Trap { .. } => Vec::new(),
        }
    }
}
