//! Emitting a function's blocks with its Ball-Larus path register kept in code (#21 stage 2;
//! docs/paths-design.md, "Step 3c decided"): instrumented translations, which write nothing to
//! the ring and count each path's end in the current context's counters instead.
//!
//! An instrumented block is a cold one's body with its terminator's edges doing the plan's
//! register steps (`path_steps`) and linked only to instrumented translations of the same plan
//! (`ExitKind::PathEdge`, `ExitKind::PathCall`):
//!
//! ```text
//! block 0 only:  announce: enqueue stub of the function's announcing id (cold code's way in)
//!                quiet:    path_start (instrumented calls' way in)
//! every block:   body:     the guest instructions, as in the cold translation
//!                edges:    jump / fall-through  step; patchable jmp
//!                          branch               jcc to a tail when the taken edge has a step;
//!                                               not-taken step; patchable jmp; tail: step; jmp
//!                          call                 push the return address; context step saving r
//!                                               in the frame; patchable jmp to the callee's quiet
//!                                               entry; reload stub (the frame's host): r = the
//!                                               frame's r + the call edge's add; patchable jmp
//!                          ret                  path_end(exits[u]), the run counted; the return's
//!                                               frame check and pop, on to the frame's host (never
//!                                               the lookup)
//!                          call out             the call-out event (site, caller's context); push
//!                          (`calls_out`)        the return address; context step saving r; on to
//!                                               the callee as a cold call goes (direct: linked;
//!                                               indirect: the lookup); border reload stub: the
//!                                               return-in event, then as a reload stub
//!                          tail call out        path_end(exits[u]), the run counted; the tail-out
//!                          (`tails_out`)        event; patchable jmp, linked through the target's
//!                                               jump entry as a cold jump
//!                edge the plan lacks:           exit to the runtime's hand-over
//! ```
//!
//! Back edges into block 0 go to its body, after the activation's start. The plan's calls must
//! go to instrumented functions of the region or call out, and it may have no system call,
//! trap or indirect jump: the dispatcher checks before it translates anything. Border events
//! (docs/paths-design.md, "Step 3g as built") write the ring in the middle of a terminator; a
//! full lap there resumes at the word's stub, never at the block's start.

use dynasmrt::{dynasm, x64::X64Relocation, DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler};
use hotpath_events::{BorderEvent, EdgeStep, PathPlan};
use hotpath_ir::{Block, BlockId, Cond, GuestAddr, HostAddr, Terminator};
use iced_x86::Code;

use crate::code_cache::{Exit, ExitKind, HostLayout};
use crate::context_steps;
use crate::emit::{
    append_body, assembled, enqueue_stub, enqueue_words, exit_stub, jcc, load_indirect_target,
    patchable_jcc, patchable_jmp, push_return_address, rcx_branch, resolve_exit_stubs, return_pop,
    return_through_lookup, Code_, EmitContext, EmittedBlock, RcxSave, RingWord, Slow,
};
use crate::gateway::{emit_ibl, GS};
use crate::path_steps::{path_add, path_end, path_start};
use crate::relocs::Relocs;
use crate::thread_area::off;
use crate::TranslateError;

/// Where block 0 of a plan is entered from outside the function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHeads {
    /// Cold code's way in (the block map, the lookup table, cold links): writes the
    /// function's announcing event, then runs `quiet`.
    pub announce: HostAddr,
    /// Instrumented calls' way in: the activation's start (`path_start`), then the body.
    pub quiet: HostAddr,
}

/// One instrumented block, assembled for a known address.
pub struct InstrumentedBlock {
    /// The code, its body entry (`entry`: where edges inside the function go), its exits and
    /// its layout.
    pub block: EmittedBlock,
    /// Block 0's ways in from outside the function.
    pub heads: Option<EntryHeads>,
    /// A call block's reload stub (the host address its frames hold).
    pub reload: Option<HostAddr>,
    /// The call calls out of the region: its reload stub writes the return-in event first.
    pub calls_out: bool,
}

/// Emits block `index` of `plan` (decoded as `block`) for host address `at`; its exits get
/// indices from `first_exit`. `announce` is the function's announcing event id (the
/// [`hotpath_events::IdKind::InstrumentedEntry`]), written by block 0's head when the monitor
/// is on.
///
/// # Errors
/// As [`crate::emit::emit_block`]; [`TranslateError::Assemble`] for a terminator a closed
/// region cannot have (the dispatcher checks plans first, so that is a bug).
pub fn emit_instrumented(
    block: &Block,
    plan: &PathPlan,
    index: u32,
    announce: BlockId,
    at: HostAddr,
    first_exit: u32,
    cx: &EmitContext,
) -> Result<InstrumentedBlock, TranslateError> {
    let exit_addr = cx.gateway.exit.0 as usize;
    let mut code = Code_ {
        base: at.0,
        bytes: Vec::with_capacity(256),
    };
    let mut layout = HostLayout {
        code_start: at.0,
        guest_start: block.start.0,
        path_block: Some((plan.numbering, index)),
        ..HostLayout::default()
    };
    let mut exits = Vec::new();
    let mut heads = None;
    if index == 0 {
        let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(code.addr() as usize);
        let announce_at = match cx.enqueue {
            Some(ring) => {
                let stub = enqueue_stub(
                    &mut ops,
                    announce.0,
                    ring,
                    Slow::Resume,
                    RcxSave::Scratch,
                    exit_addr,
                );
                HostAddr(code.base + stub.entry)
            }
            None => HostAddr(code.base),
        };
        let quiet = HostAddr(code.base + ops.offset().0 as u64);
        exits.push(Exit {
            block: announce,
            kind: ExitKind::PathCounters {
                numbering: plan.numbering,
                quiet,
            },
        });
        path_start(&mut ops, plan.numbering, plan.start, first_exit, exit_addr);
        code.append(assembled(ops, "instrumented entry")?);
        heads = Some(EntryHeads {
            announce: announce_at,
            quiet,
        });
    }
    let entry = HostAddr(code.addr());
    layout.entry = entry.0;
    // Never persisted: its relocations are not kept.
    append_body(block, &mut code, &mut layout, &mut Relocs::default())?;
    let reload = emit_path_terminator(
        block,
        plan,
        index,
        announce,
        &mut code,
        first_exit,
        &mut exits,
        cx,
        &mut layout,
    )?;
    layout.code_end = code.addr();
    resolve_exit_stubs(&mut exits, &code);
    Ok(InstrumentedBlock {
        block: EmittedBlock {
            code: code.bytes,
            entry,
            exits,
            layout,
            relocs: Relocs {
                complete: false,
                ..Relocs::default()
            },
        },
        heads,
        reload,
        calls_out: plan.calls_out(index),
    })
}

/// One edge's way out of an instrumented block, emitted at the current position: its step, then
/// a patchable `jmp` to an exit stub that links it (or, for an edge the plan lacks, the
/// hand-over's exit stub right here).
struct EdgeOut {
    step: Option<(u32, EdgeStep)>,
    to: GuestAddr,
}

impl EdgeOut {
    fn new(plan: &PathPlan, from: u32, to: GuestAddr) -> EdgeOut {
        EdgeOut {
            step: plan.step_to(from, to),
            to,
        }
    }

    /// True when taking the edge runs no step: a `jcc` can be the patchable branch itself.
    fn stepless(&self) -> bool {
        matches!(self.step, Some((_, EdgeStep::Forward(0))))
    }
}

/// The exits of one instrumented block as it is emitted (indices from `first`), all of them
/// the function's announcing id's.
struct BlockExits<'a> {
    list: &'a mut Vec<Exit>,
    first: u32,
    announce: BlockId,
    exit_addr: usize,
}

impl BlockExits<'_> {
    /// Adds an exit; returns its index.
    fn push(&mut self, kind: ExitKind) -> u32 {
        self.list.push(Exit {
            block: self.announce,
            kind,
        });
        self.first + self.list.len() as u32 - 1
    }

    /// Adds an exit and appends its exit stub at `stub`.
    fn push_with_stub(
        &mut self,
        ops: &mut VecAssembler<X64Relocation>,
        stub: DynamicLabel,
        kind: ExitKind,
    ) {
        let index = self.push(kind);
        exit_stub(ops, stub, index, self.exit_addr);
    }
}

/// Appends `out`'s step and way out (an edge of block `from` of `plan`).
fn edge_out(
    ops: &mut VecAssembler<X64Relocation>,
    base: u64,
    out: &EdgeOut,
    plan: &PathPlan,
    from: u32,
    exits: &mut BlockExits,
) {
    let stub = ops.new_dynamic_label();
    let kind = match out.step {
        Some((to, step)) => {
            match step {
                EdgeStep::Forward(add) => path_add(ops, add),
                EdgeStep::Back { end, restart } => {
                    let miss = exits.push(ExitKind::PathRunMiss {
                        numbering: plan.numbering,
                        from,
                        to: Some(to),
                        pop: 0,
                    });
                    path_end(ops, end, Some(restart), miss, exits.exit_addr)
                }
            }
            let site = patchable_jmp(ops, base, stub);
            ExitKind::PathEdge {
                numbering: plan.numbering,
                from,
                to,
                site,
                stub: HostAddr(0),
            }
        }
        None => ExitKind::PathLeave {
            numbering: plan.numbering,
            from,
            to: out.to,
        },
    };
    exits.push_with_stub(ops, stub, kind);
}

/// Emits the terminator of block `index`; returns its reload stub's address for a call.
#[allow(clippy::too_many_arguments)]
fn emit_path_terminator(
    block: &Block,
    plan: &PathPlan,
    index: u32,
    announce: BlockId,
    code: &mut Code_,
    first_exit: u32,
    exits: &mut Vec<Exit>,
    cx: &EmitContext,
    layout: &mut HostLayout,
) -> Result<Option<HostAddr>, TranslateError> {
    let exit_addr = cx.gateway.exit.0 as usize;
    let base = code.addr();
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(base as usize);
    let numbering = plan.numbering;
    let mut reload = None;
    let mut exits = BlockExits {
        list: exits,
        first: first_exit,
        announce,
        exit_addr,
    };
    match block.terminator {
        Terminator::Call { target, return_to } if target != return_to && plan.calls_out(index) => {
            let tail = CallOutTail {
                plan,
                index,
                return_to,
                ring: cx
                    .enqueue
                    .ok_or_else(|| not_closed(block, "a call out without a ring"))?,
                exit_addr,
            };
            let literal = push_return_address(&mut ops, return_to);
            tail.call_out_event(&mut ops);
            let reload_label = ops.new_dynamic_label();
            let calls = tail.call_exits(&mut exits, Some(target));
            let landing = context_steps::Landing {
                base,
                stub: Some(reload_label),
                saves_path: true,
            };
            context_steps::direct_call(&mut ops, target, calls, exit_addr, landing);
            // On to the callee as a cold call goes (its announcing head when it has a plan
            // that lets the call in: a hole of its own).
            let callee_stub = ops.new_dynamic_label();
            let site = patchable_jmp(&mut ops, base, callee_stub);
            exits.push_with_stub(
                &mut ops,
                callee_stub,
                ExitKind::Direct {
                    target,
                    from: block.start,
                    site,
                    stub: HostAddr(0),
                    call: true,
                },
            );
            reload = Some(tail.return_in(&mut ops, base, reload_label, &mut exits)?);
            literal.place(&mut ops);
        }
        Terminator::IndirectCall { return_to } if plan.calls_out(index) => {
            let inst = block
                .term_inst
                .as_ref()
                .expect("an indirect call has its instruction")
                .inst;
            let tail = CallOutTail {
                plan,
                index,
                return_to,
                ring: cx
                    .enqueue
                    .ok_or_else(|| not_closed(block, "a call out without a ring"))?,
                exit_addr,
            };
            load_indirect_target(ops, &inst, code, layout, &mut Relocs::default(), "call out")?;
            let base = code.addr();
            let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(base as usize);
            let literal = push_return_address(&mut ops, return_to);
            // The target waits in `ibl_target` while the event is written with every guest
            // register in place.
            dynasm!(ops
                ; .arch x64
                ; .u8 GS ; mov QWORD [off::IBL_TARGET], rcx
                ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
            );
            tail.call_out_event(&mut ops);
            dynasm!(ops
                ; .arch x64
                ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx
                ; .u8 GS ; mov rcx, QWORD [off::IBL_TARGET]
            );
            let reload_label = ops.new_dynamic_label();
            let calls = tail.call_exits(&mut exits, None);
            let landing = context_steps::Landing {
                base,
                stub: Some(reload_label),
                saves_path: true,
            };
            context_steps::indirect_call(&mut ops, calls, exit_addr, landing);
            emit_ibl(&mut ops, &cx.gateway);
            let reload = tail.return_in(&mut ops, base, reload_label, &mut exits)?;
            literal.place(&mut ops);
            code.append(assembled(ops, "call out")?);
            return Ok(Some(reload));
        }
        Terminator::Jump { target } | Terminator::FallThrough { next: target }
            if plan.tail_out_site(index).is_some() && cx.tail_call =>
        {
            // A tail call out: the activation's last path ends here (its run counted), the
            // tail-out event, then the jump, through the target's jump entry as a cold jump.
            let site = plan.tail_out_site(index).expect("a tail out has a site");
            let ring = cx
                .enqueue
                .ok_or_else(|| not_closed(block, "a tail call out without a ring"))?;
            let miss = exits.push(ExitKind::PathTailMiss {
                numbering,
                from: index,
                target,
            });
            path_end(&mut ops, plan.exits[index as usize], None, miss, exit_addr);
            enqueue_words(
                &mut ops,
                &[RingWord::Const(BorderEvent::tail_out_word(site))],
                ring,
                exit_addr,
            );
            let stub = ops.new_dynamic_label();
            let site = patchable_jmp(&mut ops, base, stub);
            exits.push_with_stub(
                &mut ops,
                stub,
                ExitKind::Direct {
                    target,
                    from: block.start,
                    site,
                    stub: HostAddr(0),
                    call: false,
                },
            );
        }
        Terminator::Jump { target } | Terminator::FallThrough { next: target } => {
            let out = EdgeOut::new(plan, index, target);
            edge_out(&mut ops, base, &out, plan, index, &mut exits);
        }
        Terminator::Branch {
            cond,
            taken,
            not_taken,
        } => {
            let t = EdgeOut::new(plan, index, taken);
            let n = EdgeOut::new(plan, index, not_taken);
            match cond.cc() {
                Some(cc) if t.stepless() => {
                    // The taken direction needs no step: its `jcc` is the patchable branch.
                    let stub = ops.new_dynamic_label();
                    let site = patchable_jcc(&mut ops, base, cc, stub);
                    let (to, _) = t.step.expect("a stepless edge is numbered");
                    edge_out(&mut ops, base, &n, plan, index, &mut exits);
                    let kind = ExitKind::PathEdge {
                        numbering,
                        from: index,
                        to,
                        site,
                        stub: HostAddr(0),
                    };
                    exits.push_with_stub(&mut ops, stub, kind);
                }
                Some(cc) => {
                    let tail = ops.new_dynamic_label();
                    jcc(&mut ops, cc, tail);
                    edge_out(&mut ops, base, &n, plan, index, &mut exits);
                    dynasm!(ops ; .arch x64 ; =>tail);
                    edge_out(&mut ops, base, &t, plan, index, &mut exits);
                }
                None => {
                    // loop/jrcxz have only rel8 forms: branch over the not-taken way out.
                    debug_assert!(matches!(cond, Cond::Loop | Cond::RcxZero));
                    let inst = block
                        .term_inst
                        .as_ref()
                        .map(|i| i.inst.code())
                        .unwrap_or(Code::INVALID);
                    let tail = ops.new_dynamic_label();
                    rcx_branch(&mut ops, inst, tail)?;
                    edge_out(&mut ops, base, &n, plan, index, &mut exits);
                    dynasm!(ops ; .arch x64 ; =>tail);
                    edge_out(&mut ops, base, &t, plan, index, &mut exits);
                }
            }
        }
        Terminator::Call { target, return_to } if target != return_to => {
            let Some((rp, EdgeStep::Forward(add))) = plan.step_to(index, return_to) else {
                return Err(not_closed(
                    block,
                    "a call whose return point the plan lacks",
                ));
            };
            let literal = push_return_address(&mut ops, return_to);
            let reload_label = ops.new_dynamic_label();
            let mut push = |full| {
                exits.push(ExitKind::PathContextCall {
                    numbering,
                    from: index,
                    callee: target,
                    full,
                    // Set below, once the stub's address is known.
                    reload: HostAddr(0),
                })
            };
            let calls = context_steps::CallExits {
                full: push(true),
                miss: push(false),
            };
            let landing = context_steps::Landing {
                base,
                stub: Some(reload_label),
                saves_path: true,
            };
            context_steps::direct_call(&mut ops, target, calls, exit_addr, landing);
            let callee_stub = ops.new_dynamic_label();
            let site = patchable_jmp(&mut ops, base, callee_stub);
            let kind = ExitKind::PathCall {
                numbering,
                from: index,
                callee: target,
                site,
                stub: HostAddr(0),
            };
            exits.push_with_stub(&mut ops, callee_stub, kind);
            dynasm!(ops ; .arch x64 ; =>reload_label);
            let reload_at = HostAddr(base + ops.offset().0 as u64);
            context_steps::reload_path(&mut ops, add);
            let stub = ops.new_dynamic_label();
            let site = patchable_jmp(&mut ops, base, stub);
            let kind = ExitKind::PathEdge {
                numbering,
                from: index,
                to: rp,
                site,
                stub: HostAddr(0),
            };
            exits.push_with_stub(&mut ops, stub, kind);
            literal.place(&mut ops);
            for e in exits.list.iter_mut() {
                if let ExitKind::PathContextCall { reload, .. } = &mut e.kind {
                    *reload = reload_at;
                }
            }
            reload = Some(reload_at);
        }
        Terminator::Return => {
            let inst = &block
                .term_inst
                .as_ref()
                .expect("a return has its instruction")
                .inst;
            let mismatch = exits.push(ExitKind::PathContextReturn { numbering });
            let no_host = exits.push(ExitKind::PathReturnNoHost { numbering });
            let pop = return_pop(inst);
            let miss = exits.push(ExitKind::PathRunMiss {
                numbering,
                from: index,
                to: None,
                pop,
            });
            // The `ret`'s load first: a fault there (an unmapped stack) must find the path not
            // yet counted, as the block's body left it. With several `ret`s, a `ret` that does
            // not return to its frame is not counted either: each context's returns must go
            // back to its one call site.
            if plan.entry_sites.is_some() {
                let early = exits.push(ExitKind::PathReturnElsewhere {
                    numbering,
                    from: index,
                    pop,
                });
                context_steps::return_check(&mut ops, early, exit_addr);
            } else {
                dynasm!(ops
                    ; .arch x64
                    ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx
                    ; mov rcx, QWORD [rsp]
                    ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
                );
            }
            path_end(&mut ops, plan.exits[index as usize], None, miss, exit_addr);
            return_through_lookup(&mut ops, pop, &cx.gateway, Some(mismatch), Some(no_host));
            // From the first instruction on, the guest's RCX is (also) in its scratch slot.
            layout.rcx_borrowed_from = Some(base);
        }
        _ => {
            return Err(not_closed(
                block,
                "a terminator a closed region cannot have",
            ))
        }
    }
    code.append(assembled(ops, "instrumented terminator")?);
    Ok(reload)
}

/// The parts of a call out of the region (docs/paths-design.md, "Step 3g as built"): block
/// `index` of `plan` calls a function the region does not hold, which runs cold between the
/// call-out event and the return-in event its frame's host (the border reload stub) writes.
struct CallOutTail<'a> {
    plan: &'a PathPlan,
    index: u32,
    return_to: GuestAddr,
    ring: u64,
    exit_addr: usize,
}

impl CallOutTail<'_> {
    /// Writes the call-out event: its site and the caller's context, before the call's
    /// context step (every guest register as it was).
    fn call_out_event(&self, ops: &mut VecAssembler<X64Relocation>) {
        let site = self
            .plan
            .call_out_site(self.index)
            .expect("a call out has a site");
        let words = [
            RingWord::Const(BorderEvent::call_out_word(site)),
            RingWord::ContextId(BorderEvent::context_word(0)),
        ];
        enqueue_words(ops, &words, self.ring, self.exit_addr);
    }

    /// The call's context-step exits (`callee`: `None` for an indirect call).
    fn call_exits(
        &self,
        exits: &mut BlockExits,
        callee: Option<GuestAddr>,
    ) -> context_steps::CallExits {
        let mut push = |full| {
            exits.push(ExitKind::PathCallOut {
                numbering: self.plan.numbering,
                from: self.index,
                callee,
                full,
            })
        };
        context_steps::CallExits {
            full: push(true),
            miss: push(false),
        }
    }

    /// Appends the border reload stub at `label`: the return-in event, the reload of the path
    /// and run registers, and the edge to the return point. Returns its address.
    fn return_in(
        &self,
        ops: &mut VecAssembler<X64Relocation>,
        base: u64,
        label: DynamicLabel,
        exits: &mut BlockExits,
    ) -> Result<HostAddr, TranslateError> {
        let Some((rp, EdgeStep::Forward(add))) = self.plan.step_to(self.index, self.return_to)
        else {
            return Err(TranslateError::Assemble {
                what: "instrumented block",
                reason: format!(
                    "a call out whose return point the plan lacks in numbering {} (bug: plans are checked first)",
                    self.plan.numbering
                ),
            });
        };
        dynasm!(ops ; .arch x64 ; =>label);
        let at = HostAddr(base + ops.offset().0 as u64);
        enqueue_words(
            ops,
            &[RingWord::Const(BorderEvent::RETURN_IN)],
            self.ring,
            self.exit_addr,
        );
        context_steps::reload_path(ops, add);
        let stub = ops.new_dynamic_label();
        let site = patchable_jmp(ops, base, stub);
        exits.push_with_stub(
            ops,
            stub,
            ExitKind::PathEdge {
                numbering: self.plan.numbering,
                from: self.index,
                to: rp,
                site,
                stub: HostAddr(0),
            },
        );
        Ok(at)
    }
}

/// The error for a plan block a closed region cannot have (checked before; a bug).
fn not_closed(block: &Block, what: &str) -> TranslateError {
    TranslateError::Assemble {
        what: "instrumented block",
        reason: format!(
            "{what} at {:#x} (bug: plans are checked first)",
            block.start.0
        ),
    }
}
