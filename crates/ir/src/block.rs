//! A guest basic block: its decoded body, its terminator, and the summary the monitor keeps.

use iced_x86::Instruction;

use crate::{GuestAddr, Terminator, TerminatorKind};

/// All six arithmetic flags plus DF, in iced-x86's `RflagsBits` layout
/// (OF=1, SF=2, ZF=4, AF=8, CF=0x10, PF=0x20, DF=0x40 — not RFLAGS bit positions).
pub const FLAGS_ALL: u32 = 0x7f;

/// One guest instruction of a block body, with what IR passes need.
#[derive(Clone, Debug)]
pub struct Inst {
    /// The decoded instruction; `ip()` is its guest address.
    pub inst: Instruction,
    /// Flags it reads (iced `RflagsBits` layout, see [`FLAGS_ALL`]).
    pub flags_read: u32,
    /// Flags it writes, sets, clears or leaves undefined (same layout).
    pub flags_written: u32,
    /// The absolute guest address of its RIP-relative memory operand, if it has one. The
    /// emitter must keep that operand pointing at the same guest address.
    pub rip_relative: Option<GuestAddr>,
    /// Where that operand's 32-bit displacement sits in the instruction's bytes (bytes from
    /// its first byte), when the decoder said; the emitter then copies the guest bytes and
    /// patches the displacement instead of re-encoding the instruction.
    pub rip_disp_offset: Option<u8>,
}

impl Inst {
    /// Wraps a decoded instruction, computing its flag sets and RIP-relative target.
    pub fn new(inst: Instruction) -> Inst {
        let rip_relative = if inst.is_ip_rel_memory_operand() {
            Some(GuestAddr(inst.ip_rel_memory_address()))
        } else {
            None
        };
        Inst {
            flags_read: inst.rflags_read(),
            flags_written: inst.rflags_modified(),
            rip_relative,
            rip_disp_offset: None,
            inst,
        }
    }

    /// [`Inst::new`] with the offset of the RIP-relative displacement in the instruction's
    /// bytes, as the decoder reported it (`None` for an instruction without one).
    pub fn with_rip_disp_offset(mut self, offset: Option<u8>) -> Inst {
        self.rip_disp_offset = offset.filter(|_| self.rip_relative.is_some());
        self
    }

    /// Guest address of the instruction.
    pub fn addr(&self) -> GuestAddr {
        GuestAddr(self.inst.ip())
    }
}

/// A translated guest basic block.
///
/// Shape: `body` holds the instructions that execute before the terminator, in address order;
/// `term_inst` is the control-transfer (or syscall/trap) instruction itself, when there is one
/// (a block cut by the size limit, or a trap on unreadable or undecodable bytes, has none).
#[derive(Clone, Debug)]
pub struct Block {
    /// Guest address of the first instruction.
    pub start: GuestAddr,
    /// Body instructions (every instruction but the terminating one).
    pub body: Vec<Inst>,
    /// The terminating instruction, if it decoded.
    pub term_inst: Option<Inst>,
    /// How control leaves the block.
    pub terminator: Terminator,
    /// Length of the guest code covered, in bytes (body plus terminating instruction).
    pub len_bytes: u32,
    /// The guest bytes the block was decoded from, as read at translation time: `len_bytes`
    /// of them from `start` (empty for a block built by hand). The emitter copies body
    /// instructions from them, and the monitor keeps them for reports.
    pub code: Vec<u8>,
}

impl Block {
    /// Number of guest instructions the block executes when it runs to its end
    /// (body plus the terminating instruction; a trap on bytes that do not decode or cannot be
    /// read executes none of its own).
    pub fn instruction_count(&self) -> u32 {
        let term = match (&self.term_inst, self.terminator) {
            (Some(_), Terminator::Trap { .. }) => 0,
            (Some(_), _) => 1,
            (None, _) => 0,
        };
        self.body.len() as u32 + term
    }

    /// Guest address one past the last byte of the block.
    pub fn end(&self) -> GuestAddr {
        self.start.offset(self.len_bytes as u64)
    }

    /// The summary the monitor keeps for this block.
    pub fn summary(&self) -> BlockSummary {
        BlockSummary {
            start: self.start,
            terminator_addr: self
                .term_inst
                .as_ref()
                .map(|i| i.addr())
                .unwrap_or(self.end()),
            len_bytes: self.len_bytes,
            instructions: self.instruction_count(),
            terminator: self.terminator,
        }
    }
}

/// What the monitor needs to know about a block to classify its events: shape and terminator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlockSummary {
    /// Guest address of the first instruction.
    pub start: GuestAddr,
    /// Guest address of the terminating instruction (the site of an indirect branch or
    /// syscall); the block's end when it has none.
    pub terminator_addr: GuestAddr,
    /// Guest bytes covered.
    pub len_bytes: u32,
    /// Guest instructions executed per run of the block.
    pub instructions: u32,
    /// How control leaves the block.
    pub terminator: Terminator,
}

impl BlockSummary {
    /// The terminator's kind.
    pub fn kind(&self) -> TerminatorKind {
        self.terminator.kind()
    }
}
