//! Emitting a superblock: a single-entry, multiple-exit trace of basic blocks along a hot path.
//!
//! Layout (host addresses grow downward):
//!
//! ```text
//! ring_slow / entry: the enqueue stub for the superblock's id (one event for the whole trace)
//! block 0 body ; inline terminator: nothing (jump, fall-through), the return address push
//!                (call), the branch inverted so the hot direction falls through, its cold
//!                direction jumping to side exit 0, or (ret, indirect jmp or call) a
//!                flag-free compare of the return address or target with the next block's,
//!                a mismatch jumping to side exit 0 (an indirect branch's target waiting in
//!                `ibl_target`; a call pushes its return address after the compare)
//! block 1 body ; inline terminator ...
//! block n-1 body ; its terminator as in a basic block (chained exits, lookup, syscall exit)
//! side exit i: enqueue stub for the side-exit event "ended after block i" (its slow path
//!              exits to the dispatcher, which enqueues it and goes on at the target);
//!              jmp rel32 to the cold target (chained like any direct exit), or for a `ret`,
//!              indirect `jmp` or `call` the branch through the indirect branch lookup
//! ```
//!
//! With a cold area (`EmitContext::cold`), the ring slow path and the last block's exit stubs
//! go there, as a basic block's do (see `emit`). The side exits stay after the trace: they are
//! warm (an unbiased branch or a polymorphic return in the trace takes one on many runs).
//!
//! The event stream stays exact (DESIGN.md, invariant 2): the superblock's event says its
//! trace ran to the end unless a side-exit event follows it; a fault inside block i makes the
//! dispatcher enqueue side exit i (see [`HostLayout::trace_exit`]). Superblocks are built only
//! when the monitor is on (it asks for them), so every stub here enqueues.
//!
//! Policy (after Dynamo's NET traces and DynamoRIO) is the monitor's (`monitor/src/decisions.rs`):
//! a trace starts at the target of a hot backward edge or at a hot exit of another superblock,
//! follows each block's most frequent successor, and a short loop is unrolled so that one event
//! covers several iterations. This module only lays the trace out.

use dynasmrt::{dynasm, x64::X64Relocation, DynasmApi, DynasmLabelApi, VecAssembler};
use hotpath_events::MAX_TRACE_BLOCKS;
use hotpath_ir::{Block, BlockId, GuestAddr, HostAddr, Terminator};

use crate::backend::emit::{
    append_body, assembled, emit_terminator, enqueue_stub, exit_stub, head_stub,
    indirect_call_lookup, jcc, load_indirect_target, patchable_jmp, rcx_branch, resolve_exit_stubs,
    return_pop, return_through_lookup, Code_, EmitContext, RcxSave, Slow,
};
use crate::backend::gateway::{emit_ibl, GS};
use crate::backend::relocs::Relocs;
use crate::backend::stubs::add_to_rcx;
use crate::cache::code_cache::{Exit, ExitKind, HostLayout};
use crate::host::thread_area::off;
use crate::TranslateError;

/// A superblock's host code, assembled for a known address, not yet in the cache.
pub struct EmittedTrace {
    /// The machine code, to be inserted at the address it was assembled for.
    pub code: Vec<u8>,
    /// Its cold part (the ring slow path, side exits, the last block's exit stubs), to be
    /// inserted into the cold area at `cold_at`; empty when emitted without one.
    pub cold: Vec<u8>,
    /// Host address of the cold part.
    pub cold_at: HostAddr,
    /// Host address of the superblock's entry (after the ring slow path).
    pub entry: HostAddr,
    /// Exits, in the order of their indices `first_exit..`.
    pub exits: Vec<Exit>,
    /// One layout per block of the trace, then one per side-exit stub, in address order.
    pub layouts: Vec<HostLayout>,
    /// With a jump-table site (`EmitContext::jump_table`) at its end: where its parts are.
    pub jump_table: Option<crate::backend::jump_table::SiteCode>,
}

/// Where a side exit goes.
#[derive(Clone, Copy)]
enum Cold {
    /// The direction of a branch the trace does not follow.
    Direct(GuestAddr),
    /// A `ret` (at guest `at`, popping `pop` bytes) whose return address is not the trace's
    /// next block: it returns through the lookup.
    Return { at: GuestAddr, pop: i32 },
    /// An indirect `jmp` (or `call`, pushing `return_to`) at guest `at` whose target, waiting
    /// in `ibl_target`, is not the trace's next block: it goes on through the lookup.
    Indirect {
        at: GuestAddr,
        return_to: Option<GuestAddr>,
    },
}

/// The id of the side-exit event "superblock `sb` ended after the block at `position`".
pub fn side_exit_id(sb: BlockId, position: usize) -> BlockId {
    BlockId(sb.0 + 1 + position as u32)
}

/// Pushes the 64-bit guest address `ret` as a call does: `push imm32` below 2^31, else `push
/// qword [rip + disp32]` from the trace's literal pool (`literal_sites` gets the displacement's
/// offset in `ops` and the value), as `emit::push_return_address` does within a block.
fn push_return(
    ops: &mut VecAssembler<X64Relocation>,
    ret: GuestAddr,
    literal_sites: &mut Vec<(usize, u64)>,
) {
    match i32::try_from(ret.0) {
        Ok(imm) => dynasm!(ops ; .arch x64 ; push imm),
        Err(_) => {
            dynasm!(ops ; .arch x64 ; .u8 0xff ; .u8 0x35 ; .u32 0);
            literal_sites.push((ops.offset().0 - 4, ret.0));
        }
    }
}

/// Why a trace cannot be laid out: block `position` does not lead to the next one.
fn broken(blocks: &[Block], position: usize) -> TranslateError {
    TranslateError::Superblock {
        head: blocks[0].start.0,
        reason: format!(
            "block {position} at {} does not lead to {}",
            blocks[position].start,
            blocks[position + 1].start
        ),
    }
}

/// Emits the superblock `sb` over `blocks` (in path order; each must have the next one as a
/// static successor) for host address `at`; its exits get indices from `first_exit`, its
/// side-exit events are [`side_exit_id`]`(sb, i)`.
///
/// # Errors
/// [`TranslateError::Superblock`] if a block does not lead to the next (the guest code changed
/// since the monitor saw the path); the encoding errors of [`crate::backend::emit::emit_block`].
pub fn emit_superblock(
    blocks: &[Block],
    sb: BlockId,
    at: HostAddr,
    first_exit: u32,
    cx: &EmitContext,
) -> Result<EmittedTrace, TranslateError> {
    assert!(
        !blocks.is_empty() && blocks.len() <= MAX_TRACE_BLOCKS,
        "a superblock has 1..={MAX_TRACE_BLOCKS} blocks"
    );
    let exit_addr = cx.gateway.exit.0 as usize;
    let mut code = Code_::new(at.0, cx.cold);
    let mut exits: Vec<Exit> = Vec::new();
    let mut layouts = Vec::with_capacity(blocks.len() + 4);
    // (offset of a rel32 in `code.bytes` to point at side exit i's stub, i, where it goes)
    let mut side_sites: Vec<(usize, usize, Cold)> = Vec::new();
    // (offset of a rel32 in `code.bytes` to point at a literal, the literal): the 64-bit return
    // addresses inlined calls push, placed after the side exits.
    let mut literals: Vec<(usize, u64)> = Vec::new();
    let mut literal_sites: Vec<(usize, u64)> = Vec::new();

    let mut jump_table = None;
    let ring_entries = cx
        .enqueue
        .expect("superblocks are built only when the monitor is on");
    let save = RcxSave::for_body(&blocks[0].body);
    // Never persisted: its relocations are not kept.
    let entry = head_stub(
        &mut code,
        sb.0,
        ring_entries,
        save,
        exit_addr,
        &mut Relocs::default(),
    )?;

    for (i, block) in blocks.iter().enumerate() {
        let start = code.addr();
        let mut layout = HostLayout {
            code_start: if i == 0 { code.base } else { start },
            entry: if i == 0 { entry.0 } else { start },
            guest_start: block.start.0,
            trace_exit: Some(side_exit_id(sb, i).0),
            ..HostLayout::default()
        };
        // Never persisted: its relocations are not kept.
        if i + 1 == blocks.len() {
            let first = first_exit + exits.len() as u32;
            let mut relocs = Relocs::default();
            let last_exits = match cx
                .jump_table
                .zip(crate::backend::jump_table::pattern(block))
            {
                // The trace ends in a `switch`'s dispatch: a jump-table site of its own.
                Some((site, p)) => {
                    let body = crate::backend::jump_table::without_dispatch(block);
                    append_body(&body, &mut code, &mut layout, &mut relocs)?;
                    let (e, c) = crate::backend::jump_table::emit_site(
                        block,
                        sb,
                        &p,
                        site,
                        &mut code,
                        first,
                        cx,
                        &mut layout,
                        &mut relocs,
                    )?;
                    jump_table = Some(c);
                    e
                }
                None => {
                    append_body(block, &mut code, &mut layout, &mut relocs)?;
                    emit_terminator(block, sb, &mut code, first, cx, &mut layout, &mut relocs)?
                }
            };
            exits.extend(last_exits);
        } else {
            append_body(block, &mut code, &mut layout, &mut Relocs::default())?;
            let next = blocks[i + 1].start;
            let chunk = code.addr();
            let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(chunk as usize);
            // Offset (in `ops`) of a rel32 to aim at this block's side exit.
            let mut side_rel32: Option<(usize, Cold)> = None;
            match block.terminator {
                Terminator::Jump { target } | Terminator::FallThrough { next: target }
                    if target == next => {}
                Terminator::Call { target, return_to } if target == next => {
                    push_return(&mut ops, return_to, &mut literal_sites);
                }
                Terminator::Branch {
                    cond,
                    taken,
                    not_taken,
                } if taken == next || not_taken == next => {
                    let hot_taken = taken == next;
                    let cold = if hot_taken { not_taken } else { taken };
                    match cond.cc() {
                        // Both directions lead on: nothing to test.
                        Some(_) if taken == not_taken => {}
                        Some(cc) => {
                            // Jump to the side exit on the cold direction (jcc rel32 to a
                            // placeholder label fixed up below).
                            let cold_cc = if hot_taken { cc ^ 1 } else { cc };
                            let l = ops.new_dynamic_label();
                            jcc(&mut ops, cold_cc, l);
                            side_rel32 = Some((ops.offset().0 - 4, Cold::Direct(cold)));
                            dynasm!(ops ; .arch x64 ; =>l);
                        }
                        None => {
                            // loop/jrcxz: rel8 only, and `loop` writes RCX, so it always runs.
                            let inst = block
                                .term_inst
                                .as_ref()
                                .map(|i| i.inst.code())
                                .ok_or_else(|| broken(blocks, i))?;
                            let short_taken = ops.new_dynamic_label();
                            let cont = ops.new_dynamic_label();
                            rcx_branch(&mut ops, inst, short_taken)?;
                            if hot_taken {
                                dynasm!(ops ; .arch x64 ; jmp =>cont);
                                side_rel32 = Some((ops.offset().0 - 4, Cold::Direct(cold)));
                                dynasm!(ops ; .arch x64 ; =>short_taken ; =>cont);
                            } else {
                                dynasm!(ops ; .arch x64 ; jmp =>cont ; =>short_taken ; jmp =>cont);
                                side_rel32 = Some((ops.offset().0 - 4, Cold::Direct(cold)));
                                dynasm!(ops ; .arch x64 ; =>cont);
                            }
                        }
                    }
                }
                Terminator::Return => {
                    // The return address is compared with the next block's without touching
                    // the flags: RCX = [rsp] + (−next) through LEA, zero on a match. −next is
                    // LEA's displacement when it fits in 32 bits (a non-PIE program); else RAX
                    // lends the 64-bit constant, saved and restored around it.
                    let inst = &block
                        .term_inst
                        .as_ref()
                        .ok_or_else(|| broken(blocks, i))?
                        .inst;
                    let pop = return_pop(inst);
                    dynasm!(ops ; .arch x64 ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx);
                    layout.rcx_borrowed_from = Some(chunk + ops.offset().0 as u64);
                    let l = ops.new_dynamic_label();
                    let minus_next = 0u64.wrapping_sub(next.0) as i64;
                    dynasm!(ops ; .arch x64 ; mov rcx, QWORD [rsp]);
                    add_to_rcx(&mut ops, minus_next as u64);
                    dynasm!(ops
                        ; .arch x64
                        ; jrcxz >hit
                        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
                        ; jmp =>l
                    );
                    side_rel32 = Some((
                        ops.offset().0 - 4,
                        Cold::Return {
                            at: GuestAddr(inst.ip()),
                            pop,
                        },
                    ));
                    dynasm!(ops ; .arch x64 ; =>l ; hit:);
                    dynasm!(ops
                        ; .arch x64
                        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
                        ; lea rsp, [rsp + pop]
                    );
                }
                // The target is compared with the next block's without touching the flags,
                // as for a return; a mismatch leaves it in `ibl_target` for the side exit's
                // lookup.
                Terminator::IndirectJump | Terminator::IndirectCall { .. } => {
                    let inst = block
                        .term_inst
                        .as_ref()
                        .ok_or_else(|| broken(blocks, i))?
                        .inst;
                    let prefix = std::mem::replace(&mut ops, VecAssembler::new(0));
                    load_indirect_target(
                        prefix,
                        &inst,
                        &mut code,
                        &mut layout,
                        &mut Relocs::default(),
                        "superblock indirect branch",
                    )?;
                    ops = VecAssembler::new(code.addr() as usize);
                    let l = ops.new_dynamic_label();
                    add_to_rcx(&mut ops, 0u64.wrapping_sub(next.0));
                    dynasm!(ops ; .arch x64 ; jrcxz >hit);
                    add_to_rcx(&mut ops, next.0);
                    dynasm!(ops
                        ; .arch x64
                        ; .u8 GS ; mov QWORD [off::IBL_TARGET], rcx
                        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
                        ; jmp =>l
                    );
                    let return_to = match block.terminator {
                        Terminator::IndirectCall { return_to } => Some(return_to),
                        _ => None,
                    };
                    side_rel32 = Some((
                        ops.offset().0 - 4,
                        Cold::Indirect {
                            at: GuestAddr(inst.ip()),
                            return_to,
                        },
                    ));
                    dynasm!(ops
                        ; .arch x64
                        ; =>l
                        ; hit:
                        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
                    );
                    if let Some(return_to) = return_to {
                        push_return(&mut ops, return_to, &mut literal_sites);
                    }
                }
                _ => return Err(broken(blocks, i)),
            }
            let base_len = code.bytes.len();
            code.append(assembled(ops, "superblock terminator")?);
            if let Some((off, cold)) = side_rel32 {
                side_sites.push((base_len + off, i, cold));
            }
            literals.extend(literal_sites.drain(..).map(|(off, v)| (base_len + off, v)));
        }
        layout.code_end = code.addr();
        layouts.push(layout);
    }

    // Side exits: enqueue "ended after block i", then a chainable direct exit to the target,
    // or the return through the lookup.
    for (rel32_off, i, cold) in side_sites {
        // After the trace's code, not in the cold area: a trace's side exits are warm (an
        // unbiased branch or a polymorphic return in the trace takes one on many runs), and
        // measured in the cold area they made a compiler 8 % slower.
        let start = code.addr();
        let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(start as usize);
        let slow_index = first_exit + exits.len() as u32;
        let marker = side_exit_id(sb, i);
        exits.push(Exit {
            block: sb,
            kind: match cold {
                Cold::Direct(target) => ExitKind::SideExit { marker, target },
                Cold::Return { at, pop } => ExitKind::SideExitReturn {
                    marker,
                    at,
                    pop: pop as u32,
                },
                Cold::Indirect { at, return_to } => ExitKind::SideExitIndirect {
                    marker,
                    at,
                    return_to,
                },
            },
        });
        let stub = enqueue_stub(
            &mut ops,
            marker.0,
            ring_entries,
            Slow::Exit(slow_index),
            RcxSave::Scratch,
            exit_addr,
        );
        let guest = match cold {
            Cold::Direct(target) => {
                let l = ops.new_dynamic_label();
                let site = patchable_jmp(&mut ops, start, l);
                exits.push(Exit {
                    block: sb,
                    kind: ExitKind::Direct {
                        target,
                        from: blocks[i].start,
                        site,
                        stub: HostAddr(0),
                        call: false,
                    },
                });
                exit_stub(&mut ops, l, first_exit + exits.len() as u32 - 1, exit_addr);
                target.0
            }
            Cold::Return { at, pop } => {
                // The `ret`, as a basic block's terminator does it ([rsp] was just readable).
                return_through_lookup(&mut ops, pop, &cx.gateway);
                at.0
            }
            Cold::Indirect { at, return_to } => {
                // The branch as a basic block's terminator makes it, its target taken back
                // from `ibl_target`; a call's return address pushed after the lookup.
                dynasm!(ops
                    ; .arch x64
                    ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx
                    ; .u8 GS ; mov rcx, QWORD [off::IBL_TARGET]
                );
                match return_to {
                    None => {
                        emit_ibl(&mut ops, &cx.gateway);
                    }
                    Some(ret) => {
                        indirect_call_lookup(&mut ops, start, &cx.gateway, ret);
                    }
                }
                at.0
            }
        };
        code.append(assembled(ops, "side exit")?);
        let end = code.addr();
        let stub_entry = start + stub.entry;
        let rel = stub_entry as i64 - (code.base as i64 + rel32_off as i64 + 4);
        let rel = i32::try_from(rel).expect("a superblock is smaller than 2 GiB");
        code.bytes[rel32_off..rel32_off + 4].copy_from_slice(&rel.to_le_bytes());
        layouts.push(HostLayout {
            code_start: start,
            entry: stub_entry,
            guest_start: guest,
            // Nothing here is a guest instruction: a fault would be hotpath's own.
            term_start: end,
            term_guest: guest,
            code_end: end,
            ..HostLayout::default()
        });
    }
    // The pool 8-byte aligned: the pushes that read it run with the guest's EFLAGS.AC (see
    // `emit::align_literal`).
    if !literals.is_empty() {
        while (code.base + code.bytes.len() as u64) % 8 != 0 {
            code.bytes.push(0xcc);
        }
    }
    for (rel32_off, value) in literals {
        let at = code.bytes.len();
        code.bytes.extend(value.to_le_bytes());
        let rel = i32::try_from(at as i64 - (rel32_off as i64 + 4))
            .expect("a superblock is smaller than 2 GiB");
        code.bytes[rel32_off..rel32_off + 4].copy_from_slice(&rel.to_le_bytes());
    }
    resolve_exit_stubs(&mut exits, &code);
    let (cold, cold_at) = match code.cold {
        Some(c) => (c.bytes, HostAddr(c.base)),
        None => (Vec::new(), HostAddr(0)),
    };
    Ok(EmittedTrace {
        code: code.bytes,
        cold,
        cold_at,
        entry,
        exits,
        layouts,
        jump_table,
    })
}
