//! Relocations of a translation's host code: the fields whose value depends on where the code
//! sits, which id and exits it was given, or where its guest code is mapped. The emitter of
//! basic blocks records them as it writes each field, so the persisted translation store
//! (`persist`) can place a block's code at another host address, for another guest address,
//! in another process, by patching these fields alone. A leaf.
//!
//! Every guest address a basic block's code holds is derived from the block's own guest
//! address by a constant (x86-64 direct branches and RIP-relative operands are relative), so a
//! guest field is kept as the block's start plus a delta, and survives ASLR.

use hotpath_ir::GuestAddr;

/// A gateway routine that translated code jumps to with a `rel32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routine {
    /// `Gateway::exit`.
    Exit,
    /// `Gateway::ibl_miss`.
    IblMiss,
}

/// What a relocated field holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelocKind {
    /// 4 bytes: the translation's block id (the enqueue stub's event).
    BlockId,
    /// 4 bytes: the index of the translation's exit number `k` (0-based, in the order of its
    /// exits): the translation's first exit index plus `k`.
    Exit(u32),
    /// 4 bytes: `rel32` to a gateway routine, from the field's end.
    Gateway(Routine),
    /// 4 bytes: the displacement of a RIP-relative operand to guest `target`, from the end of
    /// its instruction, `end` bytes after the field's start.
    GuestRel32 { target: GuestAddr, end: u8 },
    /// 8 bytes: guest address `target`.
    GuestAbs64 { target: GuestAddr },
    /// 4 bytes: the low half of guest address `target` (a 32-bit `lea`'s result).
    GuestLow32 { target: GuestAddr },
    /// 4 bytes, sign-extended by the instruction (`push imm32`): guest address `target`, which
    /// must be below 2^31.
    GuestSigned32 { target: GuestAddr },
    /// 4 bytes: a displacement into the thread area, `offset` bytes from the start of the
    /// translation's jump-table site's table (`thread_area::off::jump_table(site)`).
    JumpTableArea { offset: i32 },
    /// 4 bytes: `rel32`, from the field's end, to host address `target` of the same
    /// translation in its other part (hot code to a cold exit stub or slow path, or back):
    /// the two parts are placed apart, so the distance between them is the placement's.
    Local { target: u64 },
}

/// One relocated field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reloc {
    /// Host address of the field's first byte, where the code was emitted.
    pub at: u64,
    /// What it holds.
    pub kind: RelocKind,
}

/// The relocations of one translation, as its emitter records them.
#[derive(Clone, Debug)]
pub struct Relocs {
    /// Every relocated field, in no particular order.
    pub list: Vec<Reloc>,
    /// False when the code holds something these kinds cannot describe (calling-context
    /// steps): such a translation is never persisted.
    pub complete: bool,
}

impl Default for Relocs {
    fn default() -> Relocs {
        Relocs {
            list: Vec::new(),
            complete: true,
        }
    }
}

impl Relocs {
    /// Records a field at host address `at`.
    pub fn add(&mut self, at: u64, kind: RelocKind) {
        self.list.push(Reloc { at, kind });
    }

    /// Records the fields of `offsets` (offsets from host address `base`).
    pub fn add_all(&mut self, base: u64, offsets: &[(u64, RelocKind)]) {
        self.list.extend(
            offsets
                .iter()
                .map(|&(o, kind)| Reloc { at: base + o, kind }),
        );
    }
}
