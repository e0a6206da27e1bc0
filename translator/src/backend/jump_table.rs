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
//! Translated (nothing borrowed):
//!
//! ```text
//! cmp dword (rB, rI, 4), 0  ; the probe: reads what the guest's load reads, so a fault
//!                           ; there is the guest's, with every register and flag its own
//! cmp rI, ENTRIES-1 ; ja general
//! cmp rB, gs:[site.base] ; jne mismatch
//! jmp gs:[site.entries + rI*8]
//! mismatch: cmp gs:[site.base], NO_BASE ; jne general
//! fill:     index to `jump_table_index`, the guest's load and `add`, exit `JumpTableFill`
//!           (the dispatcher fills the entry and goes on at the case)
//! general:  the guest's load and `add`, the lookup on rX
//! ```
//!
//! The table jump skips the guest's load and `add`: on that path `rX` holds the index or its
//! old value and the flags are the compares'. An entry is the case's block itself when that
//! block sets `rX` and every status flag before it reads them or can fault
//! (`hotpath_ir::dead_at_entry`, `hotpath_ir::status_flags_dead_at_entry`), else a stub that
//! runs the guest's load and `add` and jumps there (a chained direct exit). Keeping the
//! load and `add` on the table path and entering every case straight measured slower
//! (docs/measurements.md, eleventh session). An entry assumes `rB + table[i]` is the case
//! it was made for, so the dispatcher fills one only for the base the site has seen first
//! (`site.base`) and a table entry in memory that changes only through a system call
//! (`MapsCache::constant`, as for a GOT slot), made a guest byte of the translations so that
//! such a call discards them (which also keeps the skipped load from faulting where the
//! guest's would). To bring the thread out of the cache for a signal, the handler
//! points every entry back at its fill stub (`ThreadArea::unlink_jump_tables`), as it empties
//! the lookup table. The monitor sees the block and then the case, as without the table.
//!
//! A site's translation is persisted like a block's: the three displacements naming its table
//! in the thread area are relocated ([`RelocKind::JumpTableArea`]), so a warm run places it with
//! whichever table is free, and the site keeps its guest load and `add` encoded ([`Dispatch`])
//! for the index stubs; the fill asks the case's persisted record which registers its block
//! may be entered with. A warm run decodes and encodes nothing for its `switch`es.

use dynasmrt::{dynasm, x64::X64Relocation, DynasmApi, DynasmLabelApi, VecAssembler};
use hotpath_ir::{Block, BlockId, GuestAddr, HostAddr, Terminator};
use iced_x86::{Code, Instruction, OpKind, Register};

use crate::backend::emit::{
    assembled, emit_block_with, encode_at, exit_stub, load_indirect_target, patchable_jmp, Code_,
    EmitContext, EmittedBlock,
};
use crate::backend::gateway::{emit_ibl, emit_ibl_in, GS};
use crate::backend::relocs::{RelocKind, Relocs, Routine};
use crate::backend::stubs::gpr;
use crate::cache::code_cache::{Exit, ExitKind, HostLayout};
use crate::host::thread_area::{off, JUMP_TABLE_ENTRIES, JUMP_TABLE_FIRST, JUMP_TABLE_NO_BASE};
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
    pub disp: i32,
}

/// A site in use: what its fill needs to make an index's stub. Made from a [`Pattern`] when
/// the site is translated, or from its persisted record (no decoding: iced's tables are not
/// built for a warm run).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Site {
    /// The table's base register, the `switch` index register and the register the case's
    /// address ends in ([`Pattern`]'s).
    pub base: Register,
    pub index: Register,
    pub target: Register,
    /// The load's displacement (bytes).
    pub disp: i32,
    /// The guest's load and `add`, encoded.
    pub dispatch: Dispatch,
    /// The translation's id (a block's or a superblock's).
    pub id: BlockId,
    /// The guest start of the basic block the dispatch ends.
    pub from: GuestAddr,
    /// The guest address of its `jmp`.
    pub jmp_at: GuestAddr,
    /// Its general path ([`SiteCode::general`]).
    pub general: HostAddr,
}

impl Site {
    /// The site of dispatch `p` ending the block at guest `from` (its `jmp` at `jmp_at`),
    /// translated as `id` into `code`.
    pub fn of(
        p: &Pattern,
        id: BlockId,
        from: GuestAddr,
        jmp_at: GuestAddr,
        code: &SiteCode,
    ) -> Site {
        Site {
            base: p.base,
            index: p.index,
            target: p.target,
            disp: p.disp,
            dispatch: code.dispatch,
            id,
            from,
            jmp_at,
            general: code.general,
        }
    }
}

/// The jump-table sites of one code cache's translations, by site number (the number the
/// site's code names its table in the thread area by), and the index stubs made for them.
/// They describe translated code, so they go wherever the code cache goes: to the next
/// thread that takes an ended thread's cache, with the thread area whose tables they fill
/// (a thread that took the cache without them found site 0 unknown at its first fill).
#[derive(Default)]
pub(crate) struct Sites {
    /// Site number → the site.
    pub sites: Vec<Site>,
    /// The stubs made for `(site, index)`, kept for the entry's next fill after a signal.
    pub stubs: std::collections::HashMap<(u32, u64), HostAddr>,
}

impl Sites {
    /// Forgets every site (the cache was flushed).
    pub fn clear(&mut self) {
        self.sites.clear();
        self.stubs.clear();
    }
}

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
    Some(Pattern {
        load,
        add,
        base,
        index,
        target,
        disp: i32::try_from(load.memory_displacement64() as i64).ok()?,
    })
}

/// Emits `block`, which ends in pattern `p`, for host address `at` with its dispatch as
/// jump-table site `site` (as [`crate::backend::emit::emit_block`] does otherwise). Returns the block
/// and where its fill stub is.
///
/// # Errors
/// As [`crate::backend::emit::emit_block`].
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

/// `block` without the two body instructions of its dispatch (the site emits them): what a
/// block or a superblock's last block appends before [`emit_site`].
pub(crate) fn without_dispatch(block: &Block) -> Block {
    let mut b = block.clone();
    b.body.truncate(b.body.len() - 2);
    b
}

/// Where a site's parts landed.
#[derive(Clone, Copy, Debug)]
pub struct SiteCode {
    /// The fill stub: every table entry's host address until the dispatcher fills it.
    pub fill: HostAddr,
    /// The guest's load and `add`, then the lookup: where an entry goes whose table entry in
    /// guest memory is not constant.
    pub general: HostAddr,
    /// The guest's load and `add` as the site encoded them.
    pub dispatch: Dispatch,
}

/// Appends the translation of `block`'s last two body instructions and its `jmp` as jump-table
/// site `site` (the body before them already appended, `layout.term_start` after it): the
/// probe, the checks, the table jump, the fill stub and the general path. Returns the exits
/// (indices from `first_exit`: the fill exit) and where the fill stub and the general path
/// are.
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
    let i = gpr(p.index);
    let b = gpr(p.base);
    let exit_addr = cx.gateway.exit.0 as usize;
    let table = off::jump_table(site);
    let entries = table + 8 * JUMP_TABLE_FIRST as i32;
    let dispatch = Dispatch::of(p)?;
    let base = code.addr();
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(base as usize);
    // The probe reads what the guest's load reads: a fault there is the guest's, with every
    // register and flag the guest's.
    layout.body.push((base, p.load.ip()));
    // The three fields naming the site's table in the thread area are relocated: a persisted
    // site is placed with whichever table is free then.
    let mut area_fields = Vec::with_capacity(3);
    dynasm!(ops
        ; .arch x64
        ; cmp DWORD [Rq(b) + Rq(i) * 4 + p.disp], 0
        ; cmp Rq(i), (JUMP_TABLE_ENTRIES - 1) as i32
        ; ja >general
    );
    let from = ops.offset().0;
    dynasm!(ops ; .arch x64 ; .u8 GS ; cmp Rq(b), QWORD [table]);
    area_fields.push((from, ops.offset().0, table, 0));
    dynasm!(ops ; .arch x64 ; jne >mismatch);
    let from = ops.offset().0;
    dynasm!(ops ; .arch x64 ; .u8 GS ; jmp QWORD [Rq(i) * 8 + entries]);
    area_fields.push((from, ops.offset().0, entries, entries - table));
    let from = ops.offset().0;
    dynasm!(ops
        ; .arch x64
        ; mismatch:
        ; .u8 GS ; cmp QWORD [table], JUMP_TABLE_NO_BASE as i32
    );
    area_fields.push((from, ops.offset().0, table, 0));
    dynasm!(ops ; .arch x64 ; jne >general);
    let fill = HostAddr(base + ops.offset().0 as u64);
    dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [off::JUMP_TABLE_INDEX], Rq(i));
    dispatch.put(&mut ops, base, layout);
    let l = ops.new_dynamic_label();
    dynasm!(ops ; .arch x64 ; jmp =>l);
    let (index_at, gateway_at) = exit_stub(&mut ops, l, first_exit, exit_addr);
    // The fill is the first exit of the code appended here.
    relocs.add(base + index_at, RelocKind::Exit(0));
    relocs.add(base + gateway_at, RelocKind::Gateway(Routine::Exit));
    // The general path, also where an entry goes whose table entry is not constant.
    dynasm!(ops ; .arch x64 ; general:);
    let general = HostAddr(base + ops.offset().0 as u64);
    dispatch.put(&mut ops, base, layout);
    let exits = vec![Exit {
        block: id,
        kind: ExitKind::JumpTableFill { site },
    }];
    // Each relocated field's offset: the one place in its instruction holding the table's
    // displacement, found once the site's first part is assembled.
    let mut note_fields = |bytes: &[u8]| -> Result<(), TranslateError> {
        for &(from, to, value, offset) in &area_fields {
            let field =
                field_holding(&bytes[from..to], value).ok_or_else(|| TranslateError::Assemble {
                    what: "jump table",
                    reason: format!("no displacement {value:#x} in the instruction at {from}"),
                })?;
            relocs.add(
                base + (from + field) as u64,
                RelocKind::JumpTableArea { offset },
            );
        }
        Ok(())
    };
    // The lookup, on the target where it is.
    if p.target == Register::RCX {
        let jmp = block
            .term_inst
            .as_ref()
            .expect("an indirect branch has its instruction")
            .inst;
        let mut head = Relocs::default();
        load_indirect_target(ops, &jmp, code, layout, &mut head, "jump table")?;
        note_fields(code.bytes_from(base))?;
        relocs.list.extend(head.list);
        let tail_base = code.addr();
        let mut tail: VecAssembler<X64Relocation> = VecAssembler::new(tail_base as usize);
        let miss = emit_ibl(&mut tail, &cx.gateway);
        relocs.add(tail_base + miss, RelocKind::Gateway(Routine::IblMiss));
        code.append(assembled(tail, "jump table")?);
    } else {
        dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx);
        layout.rcx_borrowed_from = Some(base + ops.offset().0 as u64);
        let miss = emit_ibl_in(&mut ops, &cx.gateway, p.target, false);
        let bytes = assembled(ops, "jump table")?;
        note_fields(&bytes)?;
        relocs.add(base + miss, RelocKind::Gateway(Routine::Exit));
        code.append(bytes);
    }
    Ok((
        exits,
        SiteCode {
            fill,
            general,
            dispatch,
        },
    ))
}

/// The offset in `bytes` (one instruction) of the only 4-byte little-endian field holding
/// `value`, if there is exactly one.
fn field_holding(bytes: &[u8], value: i32) -> Option<usize> {
    let want = value.to_le_bytes();
    let mut found = bytes
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == want)
        .map(|(k, _)| k);
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// Most bytes the guest's load and `add` take encoded (`movslq` with a SIB and a 32-bit
/// displacement is 8, the `add` 3).
pub const DISPATCH_MAX: usize = 16;

/// The guest's load and `add`, encoded (neither is RIP-relative: the bytes run anywhere), with
/// their guest addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch {
    bytes: [u8; DISPATCH_MAX],
    len: u8,
    /// The `add`'s offset in the bytes.
    add_at: u8,
    pub load_ip: u64,
    pub add_ip: u64,
}

impl Dispatch {
    fn of(p: &Pattern) -> Result<Dispatch, TranslateError> {
        let e = encode_at(&[p.load, p.add], 0)?;
        Dispatch::from_parts(&e.bytes, e.offsets[1] as usize, p.load.ip(), p.add.ip()).ok_or_else(
            || TranslateError::Assemble {
                what: "jump table",
                reason: format!("a dispatch of {} bytes", e.bytes.len()),
            },
        )
    }

    /// The dispatch of encoded `bytes` whose `add` starts at `add_at`, the load at guest
    /// `load_ip` and the `add` at `add_ip`; `None` if the parts do not fit.
    pub(crate) fn from_parts(
        bytes: &[u8],
        add_at: usize,
        load_ip: u64,
        add_ip: u64,
    ) -> Option<Dispatch> {
        if bytes.len() > DISPATCH_MAX || add_at == 0 || add_at >= bytes.len() {
            return None;
        }
        let mut b = [0; DISPATCH_MAX];
        b[..bytes.len()].copy_from_slice(bytes);
        Some(Dispatch {
            bytes: b,
            len: bytes.len() as u8,
            add_at: add_at as u8,
            load_ip,
            add_ip,
        })
    }

    /// The encoded load and `add`.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// The `add`'s offset in [`Self::bytes`].
    pub(crate) fn add_at(&self) -> usize {
        self.add_at as usize
    }

    /// Appends the two to `ops` (assembling for host address `base`), each in `layout.body`.
    fn put(&self, ops: &mut VecAssembler<X64Relocation>, base: u64, layout: &mut HostLayout) {
        let at = base + ops.offset().0 as u64;
        layout.body.push((at, self.load_ip));
        layout.body.push((at + self.add_at as u64, self.add_ip));
        for &byte in self.bytes() {
            ops.push(byte);
        }
    }
}

/// The stub of a site's index whose case's block reads the `jmp`'s register or the status
/// flags before it sets them (see the module doc), assembled for host address `at`: the
/// guest's load and `add`, then a chainable `jmp` to the case at `target` (the direct exit
/// numbered `exit`, for the `jmp` at guest `jmp_at` in the block starting at `from`). Returns
/// its code, its exit and its layout.
///
/// # Errors
/// [`TranslateError`] if dynasm or iced rejects the code (a bug in hotpath).
#[allow(clippy::too_many_arguments)]
pub fn emit_index_stub(
    dispatch: &Dispatch,
    at: HostAddr,
    target: GuestAddr,
    from: GuestAddr,
    jmp_at: GuestAddr,
    exit: u32,
    exit_addr: usize,
    block: BlockId,
) -> Result<(Vec<u8>, Exit, HostLayout), TranslateError> {
    let mut layout = HostLayout {
        code_start: at.0,
        entry: at.0,
        guest_start: jmp_at.0,
        term_guest: jmp_at.0,
        ..HostLayout::default()
    };
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(at.0 as usize);
    dispatch.put(&mut ops, at.0, &mut layout);
    layout.term_start = at.0 + ops.offset().0 as u64;
    let l = ops.new_dynamic_label();
    let site = patchable_jmp(&mut ops, at.0, l);
    let stub_off = ops.offset().0 as u64;
    exit_stub(&mut ops, l, exit, exit_addr);
    let code = assembled(ops, "jump table entry")?;
    layout.code_end = at.0 + code.len() as u64;
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
