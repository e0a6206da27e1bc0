//! A `switch` compiled to a jump table, translated as one: the guest's index selects a host
//! table entry, so a hot dispatch needs no indirect branch lookup.
//!
//! The guest's pattern (GCC's position-independent jump table) ends a block:
//!
//! ```text
//! movslq (rB, rI, 4), rX     ; the table's entry: an offset from the table's base
//! add    rB, rX              ; the case's address
//! jmp    *rX
//! ```
//!
//! Translated (`R` a register the three do not name, its guest value in `scratch_far`):
//!
//! ```text
//! R := rI                   ; the index, which the load may overwrite (rX = rI is usual)
//! movslq (rB, rI, 4), rX    ; the guest's load, in place: a fault there is the guest's
//! cmp R, ENTRIES-1 ; ja general
//! cmp rB, gs:[site.base] ; jne mismatch
//! add rB, rX                ; the guest's: the flags are the guest's from here on
//! jmp gs:[site.entries + R*8]
//! mismatch: cmp gs:[site.base], NO_BASE ; jne general ; add ; fill:
//! fill:     index to `jump_table_index`, R back, exit `JumpTableFill` (the dispatcher fills
//!           the entry and goes on at the case)
//! general:  R back ; add ; the lookup on rX
//! ```
//!
//! The compares may write the flags: the guest's `add` comes after them on every path and
//! writes every status flag, and the load before them reads none. An entry is the case's block
//! itself when that block overwrites R before it reads it or can fault, else a stub that gives
//! R back and jumps there (a chained direct exit). An entry assumes `rB + table[i]` is the case
//! it was made for, so the dispatcher fills one only for the base the site has seen first
//! (`site.base`) and a table entry in memory that changes only through a system call
//! (`MapsCache::constant`, as for a GOT slot), made a guest byte of the translations so that
//! such a call discards them. To bring the thread out of the cache for a signal, the handler
//! points every entry back at its fill stub (`ThreadArea::unlink_jump_tables`), as it empties
//! the lookup table. The monitor sees the block and then the case, as without the table.

use dynasmrt::{dynasm, x64::X64Relocation, DynasmApi, DynasmLabelApi, VecAssembler};
use hotpath_ir::{Block, BlockId, GuestAddr, HostAddr, Terminator};
use iced_x86::{Code, Instruction, OpKind, Register};

use crate::code_cache::{Exit, ExitKind, HostLayout};
use crate::emit::{
    append_body, assembled, emit_block_with, encode_at, exit_stub, load_indirect_target,
    patchable_jmp, Code_, EmitContext, EmittedBlock,
};
use crate::gateway::{emit_ibl, emit_ibl_in, GS};
use crate::relocs::{RelocKind, Relocs, Routine};
use crate::stubs::gpr;
use crate::thread_area::{off, JUMP_TABLE_ENTRIES, JUMP_TABLE_FIRST, JUMP_TABLE_NO_BASE};
use crate::TranslateError;

/// The guest's jump-table dispatch at the end of a block: the last two body instructions and
/// the registers they name.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    /// `movslq rX, [rB + rI*4 + disp]`.
    pub load: Instruction,
    /// `add rX, rB`.
    pub add: Instruction,
    /// The table's base register.
    pub base: Register,
    /// The `switch` index register.
    pub index: Register,
    /// The register the case's address ends in (the `jmp`'s operand).
    pub target: Register,
    /// The load's displacement (bytes).
    pub disp: i64,
    /// The register the translation borrows to keep the index: not one of the three.
    pub borrowed: Register,
}

/// Registers a site may borrow, in order of preference: the ones compilers allocate last
/// first (GCC takes RAX, RDX, RCX, RSI, RDI, R8–R11 in that order), since the case reads the
/// borrowed register's guest value only after its reload from the thread area, a
/// store-to-load round trip (`gateway::emit_ibl_in`).
const BORROWABLE: [Register; 9] = [
    Register::R11,
    Register::R10,
    Register::R9,
    Register::R8,
    Register::RDI,
    Register::RSI,
    Register::RCX,
    Register::RDX,
    Register::RAX,
];

/// The jump-table dispatch ending `block`, if it ends in one (see the module doc).
pub fn pattern(block: &Block) -> Option<Pattern> {
    if block.terminator != Terminator::IndirectJump || block.body.len() < 2 {
        return None;
    }
    let jmp = &block.term_inst.as_ref()?.inst;
    if jmp.code() != Code::Jmp_rm64 || jmp.op0_kind() != OpKind::Register {
        return None;
    }
    let target = jmp.op0_register();
    let n = block.body.len();
    let (load, add) = (block.body[n - 2].inst, block.body[n - 1].inst);
    let (base, index) = (load.memory_base(), load.memory_index());
    let plain_load = load.code() == Code::Movsxd_r64_rm32
        && load.op0_register() == target
        && load.op1_kind() == OpKind::Memory
        && base.is_gpr64()
        && index.is_gpr64()
        && load.memory_index_scale() == 4
        && load.segment_prefix() == Register::None;
    let adds_base = match add.code() {
        Code::Add_r64_rm64 | Code::Add_rm64_r64 => {
            add.op0_kind() == OpKind::Register
                && add.op1_kind() == OpKind::Register
                && add.op0_register() == target
                && add.op1_register() == base
        }
        _ => false,
    };
    let distinct = base != target && base != index && ![base, target].contains(&Register::RSP);
    if !(plain_load && adds_base && distinct) {
        return None;
    }
    let borrowed = *BORROWABLE
        .iter()
        .find(|r| ![base, index, target].contains(r))?;
    Some(Pattern {
        load,
        add,
        base,
        index,
        target,
        disp: load.memory_displacement64() as i64,
        borrowed,
    })
}

/// Emits `block`, which ends in pattern `p`, for host address `at` with its dispatch as
/// jump-table site `site` (as [`crate::emit::emit_block`] does otherwise). Returns the block
/// and where its fill stub is.
///
/// # Errors
/// As [`crate::emit::emit_block`].
pub fn emit_block(
    block: &Block,
    p: &Pattern,
    id: BlockId,
    at: HostAddr,
    first_exit: u32,
    cx: &EmitContext,
    site: u32,
) -> Result<(EmittedBlock, SiteCode), TranslateError> {
    let mut site_code = None;
    let emitted = emit_block_with(
        &without_dispatch(block),
        id,
        at,
        first_exit,
        cx,
        Some(&mut |code, first_exit, layout, relocs| {
            let (exits, c) = emit_site(block, id, p, site, code, first_exit, cx, layout, relocs)?;
            site_code = Some(c);
            Ok(exits)
        }),
    )?;
    Ok((emitted, site_code.expect("the site was emitted")))
}

/// Appends the body of `block` (the last block of a superblock, ending in pattern `p`) but
/// for its dispatch, then the dispatch as site `site` (see [`emit_block`]).
///
/// # Errors
/// As [`crate::emit::emit_block`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn append_block(
    block: &Block,
    p: &Pattern,
    id: BlockId,
    site: u32,
    code: &mut Code_,
    first_exit: u32,
    cx: &EmitContext,
    layout: &mut HostLayout,
    relocs: &mut Relocs,
) -> Result<(Vec<Exit>, SiteCode), TranslateError> {
    append_body(&without_dispatch(block), code, layout, relocs)?;
    emit_site(block, id, p, site, code, first_exit, cx, layout, relocs)
}

/// `block` without the two body instructions of its dispatch (the site emits them).
fn without_dispatch(block: &Block) -> Block {
    let mut b = block.clone();
    b.body.truncate(b.body.len() - 2);
    b
}

/// Where a site's parts landed.
#[derive(Clone, Copy, Debug)]
pub struct SiteCode {
    /// The fill stub: every table entry's host address until the dispatcher fills it.
    pub fill: HostAddr,
    /// R back and the lookup (the guest's `add` done): where an entry goes whose table entry
    /// in guest memory is not constant.
    pub general: HostAddr,
}

/// Appends the translation of `block`'s last two body instructions and its `jmp` as jump-table
/// site `site` (the body before them already appended, `layout.term_start` after it): the
/// load in place, the checks, the table jump, the fill stub and the general path. Returns the
/// exits (indices from `first_exit`: the fill exit) and where the fill stub is.
///
/// # Errors
/// [`TranslateError`] if dynasm or iced rejects the code (a bug in hotpath).
#[allow(clippy::too_many_arguments, clippy::useless_conversion)]
pub(crate) fn emit_site(
    block: &Block,
    id: BlockId,
    p: &Pattern,
    site: u32,
    code: &mut Code_,
    first_exit: u32,
    cx: &EmitContext,
    layout: &mut HostLayout,
    relocs: &mut Relocs,
) -> Result<(Vec<Exit>, SiteCode), TranslateError> {
    // The table's entries are this thread's: the translation is not persisted.
    relocs.complete = false;
    let r = gpr(p.borrowed);
    let i = gpr(p.index);
    let b = gpr(p.base);
    let exit_addr = cx.gateway.exit.0 as usize;
    let table = off::jump_table(site);
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(code.addr() as usize);
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::SCRATCH_FAR], Rq(r)
        ; mov Rq(r), Rq(i)
    );
    code.append(assembled(ops, "jump table")?);
    // The guest's load, where a fault is the guest's (R's guest value in `scratch_far`).
    let load_at = code.addr();
    let load = encode_at(&[p.load], load_at)?;
    layout.body.push((load_at + load.offsets[0], p.load.ip()));
    layout.far_borrows.push((load_at + load.offsets[0], r));
    code.append(load.bytes);

    let base = code.addr();
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(base as usize);
    let add = encode_at(&[p.add], 0)?.bytes;
    let put_add = |ops: &mut VecAssembler<X64Relocation>| {
        for &byte in &add {
            ops.push(byte);
        }
    };
    let fill_exit = first_exit;
    let entries = table + 8 * JUMP_TABLE_FIRST as i32;
    dynasm!(ops
        ; .arch x64
        ; cmp Rq(r), (JUMP_TABLE_ENTRIES - 1) as i32
        ; ja >general
        ; .u8 GS ; cmp Rq(b), QWORD [table]
        ; jne >mismatch
    );
    put_add(&mut ops);
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; jmp QWORD [Rq(r) * 8 + entries]
        ; mismatch:
        ; .u8 GS ; cmp QWORD [table], JUMP_TABLE_NO_BASE as i32
        ; jne >general
    );
    put_add(&mut ops);
    dynasm!(ops ; .arch x64 ; fill:);
    let fill = HostAddr(base + ops.offset().0 as u64);
    let l = ops.new_dynamic_label();
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::JUMP_TABLE_INDEX], Rq(r)
        ; .u8 GS ; mov Rq(r), QWORD [off::SCRATCH_FAR]
        ; jmp =>l
    );
    exit_stub(&mut ops, l, fill_exit, exit_addr);
    // An entry sent to the lookup (the guest's `add` done).
    let general = HostAddr(base + ops.offset().0 as u64);
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov Rq(r), QWORD [off::SCRATCH_FAR]
        ; jmp >lookup
        ; general:
        ; .u8 GS ; mov Rq(r), QWORD [off::SCRATCH_FAR]
    );
    put_add(&mut ops);
    dynasm!(ops ; .arch x64 ; lookup:);
    let exits = vec![Exit {
        block: id,
        kind: ExitKind::JumpTableFill { site },
    }];
    // The general path: the lookup, on the target where it is.
    if p.target == Register::RCX {
        let jmp = block
            .term_inst
            .as_ref()
            .expect("an indirect branch has its instruction")
            .inst;
        load_indirect_target(ops, &jmp, code, layout, relocs, "jump table")?;
        let tail_base = code.addr();
        let mut tail: VecAssembler<X64Relocation> = VecAssembler::new(tail_base as usize);
        emit_ibl(&mut tail, &cx.gateway);
        code.append(assembled(tail, "jump table")?);
    } else {
        dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx);
        layout.rcx_borrowed_from = Some(base + ops.offset().0 as u64);
        let miss = emit_ibl_in(&mut ops, &cx.gateway, p.target, false);
        relocs.add(base + miss, RelocKind::Gateway(Routine::Exit));
        code.append(assembled(ops, "jump table")?);
    }
    Ok((exits, SiteCode { fill, general }))
}

/// The stub of a site's index whose case's block reads R (see the module doc), assembled for
/// host address `at`: R back and a chainable `jmp` to the case at `target` (the direct exit
/// numbered `exit`, for the `jmp` at guest `jmp_at` in the block starting at `from`). Returns
/// its code, its exit and its layout.
///
/// # Errors
/// [`TranslateError`] if dynasm rejects the code (a bug in hotpath).
#[allow(clippy::useless_conversion, clippy::too_many_arguments)]
pub fn emit_index_stub(
    p: &Pattern,
    at: HostAddr,
    target: GuestAddr,
    from: GuestAddr,
    jmp_at: GuestAddr,
    exit: u32,
    exit_addr: usize,
    block: BlockId,
) -> Result<(Vec<u8>, Exit, HostLayout), TranslateError> {
    let r = gpr(p.borrowed);
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(at.0 as usize);
    dynasm!(ops ; .arch x64 ; .u8 GS ; mov Rq(r), QWORD [off::SCRATCH_FAR]);
    let term_at = at.0 + ops.offset().0 as u64;
    let l = ops.new_dynamic_label();
    let site = patchable_jmp(&mut ops, at.0, l);
    let stub_off = ops.offset().0 as u64;
    exit_stub(&mut ops, l, exit, exit_addr);
    let code = assembled(ops, "jump table entry")?;
    let layout = HostLayout {
        code_start: at.0,
        entry: at.0,
        guest_start: jmp_at.0,
        code_end: at.0 + code.len() as u64,
        term_start: term_at,
        term_guest: jmp_at.0,
        ..HostLayout::default()
    };
    let exit = Exit {
        block,
        kind: ExitKind::Direct {
            target,
            from,
            site,
            stub: HostAddr(at.0 + stub_off),
            call: false,
        },
    };
    Ok((code, exit, layout))
}
