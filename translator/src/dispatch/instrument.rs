//! The dispatcher's side of instrumented translation (#21 stage 2; docs/paths-design.md,
//! "Step 3c decided"): the monitor's plans, the instrumented translations of this code cache
//! generation and their links, and the hand-over that turns a thread's instrumented
//! activations cold.
//!
//! A plan set arrives as `Command::InstrumentFunctions`; each function's block 0 is translated
//! at once, and cold code's direct calls of the function are linked to its announcing head
//! (those linked before, and every one linked after). Nothing else reaches the head: the block
//! map, the lookup table and jumps keep the cold entry, so that whatever enters the function's
//! entry by guest address — a jump back to it from a cold activation of the function, a signal
//! handler returning there — goes on cold, as the monitor expects. Other blocks are translated
//! when an instrumented edge to them is first taken, and only instrumented exits link to them. While the dispatcher handles an exit of instrumented code
//! that may go on instrumented, `pending` holds where the top activation is; anything that
//! makes it go on by guest address instead (a signal, a kick, a flush, single-stepping) hands
//! the hole over first.

use std::collections::HashMap;
use std::sync::Arc;

use hotpath_events::{
    BorderEvent, EdgeStep, HandOver, HandedActivation, HandedAt, IdKind, NewBlock, PathPlan,
    MAX_NUMBERING, MAX_PLAN_PATHS,
};
use hotpath_ir::{BlockId, GuestAddr, HostAddr, Terminator};

use super::{lock, Next, Stop, Translator, EXIT_SPECIAL_BASE, MAX_BLOCK_INSTRUCTIONS};
use crate::code_cache::ExitKind;
use crate::emit::EmitContext;
use crate::instrumented::{emit_instrumented, EntryHeads};
use crate::TranslateError;

/// Code cache room (bytes) an install wants: block 0 of a plan fits in far less.
const INSTALL_ROOM: u64 = 64 * 1024;

/// Hand-overs at edges its numbering lacks, or at calls of functions that cannot be entered
/// instrumented, after which a plan is dropped for the thread (its function runs cold until a
/// new numbering comes). Renumbering makes them rare, unless the
/// function no longer qualifies once the monitor knows the edge (it calls cold code there):
/// python3 then handed over 17 000 times in a second, each an exit and a replay.
const HAND_OVERS_BEFORE_DROP: u32 = 256;

/// Times a cold back edge may refuse to hand its activation in (the activation runs in
/// another function's context, past the depth cap, or was called from a site the plan does
/// not let in) before its exit is linked like any other, in this generation: each refusal
/// is a trip through the dispatcher.
const HAND_IN_REFUSALS: u32 = 64;

/// Hand-ins a function takes per thread, whatever its numbering; past them its cold back
/// edges are linked as usual. Each hand-in starts a run subtree of its own in the guest's run
/// trie (under a new hand-in root: the guest does not know the run before it), where the
/// monitor's trie shares prefixes: the strings sample, whose plans kept handing over at edges
/// their numberings lacked and back in at the next back edge, filled the guest's 4 Mi run
/// nodes with 554 hand-ins and abandoned runs the monitor kept; with 16 per numbering, under
/// CPU contention (later plans, more renumberings), it still did in 1 run of 6. Activations
/// live when a plan comes are few, and a numbering found to lack an edge hands in no more
/// (its activation would come back at its next back edge and hand over at the same edge).
const HAND_INS_PER_FUNCTION: u32 = 16;

/// What a cold jump does about handing its activation in (`Translator::hand_in`).
pub(super) enum HandIn {
    /// It is no back edge of a current plan: linked as usual.
    NotASite,
    /// It is one, but this activation goes on cold: not linked, so that the next may.
    Refused,
    /// The activation went on instrumented: go on at `Next`.
    Done(Next),
}

/// A plan's translations in this generation.
#[derive(Clone, Copy, Debug)]
struct Installed {
    heads: EntryHeads,
    /// The announcing event's id (`IdKind::InstrumentedEntry`).
    announce: BlockId,
}

/// One thread's instrumented translation state.
#[derive(Default)]
pub(crate) struct Instrumentation {
    /// The current plan of each instrumented function, by its entry's guest address.
    plans: HashMap<u64, Arc<PathPlan>>,
    /// Every plan this thread took, by numbering (exits name their plan by it).
    by_numbering: HashMap<u32, Arc<PathPlan>>,
    /// Plans this thread gave up (the counter arena was full): never installed again.
    disabled: std::collections::HashSet<u32>,
    /// This generation: each installed plan's entry points.
    installed: HashMap<u32, Installed>,
    /// This generation: `(numbering, block)` → the instrumented block's body entry.
    blocks: HashMap<(u32, u32), HostAddr>,
    /// This generation: host address of a reload stub → `(numbering, call block)` (what a
    /// frame whose host it is stands for).
    reloads: HashMap<u64, (u32, u32)>,
    /// This generation: host address of a border reload stub (a call out's) → `(numbering,
    /// call block)`: a frame whose host it is is a suspended hole's call out.
    borders: HashMap<u64, (u32, u32)>,
    /// Return points of the plans' calls out: a superblock does not run one inline after a
    /// `ret` (the return must reach the frame's host, the border reload stub).
    border_returns: std::collections::HashSet<u64>,
    /// While an exit of instrumented code is handled: the top activation's position if the
    /// thread does not go on in instrumented code (`None` inside: a call not yet entered, or
    /// a `ret` that ended its activation).
    pending: Option<Option<(u32, HandedAt)>>,
    /// A plan could not be installed without flushing the code cache, which the dispatcher
    /// does where it is safe (after its commands).
    pub(super) flush_wanted: bool,
    /// Hand-overs at edges each numbering lacks.
    new_edges: HashMap<u32, u32>,
    /// Loop heads of the plans' functions (the targets of their back edges, entries aside)
    /// → the entries of the functions with a back edge there.
    loop_heads: HashMap<u64, Vec<u64>>,
    /// This generation: refusals to hand in, by exit index ([`HAND_IN_REFUSALS`]).
    hand_in_refusals: HashMap<u32, u32>,
    /// Hand-ins each function took, by its entry ([`HAND_INS_PER_FUNCTION`]).
    hand_ins: HashMap<u64, u32>,
    /// Numberings that handed an activation over at an edge they lack: no activation is
    /// handed in under them (it would hand over there again; the monitor renumbers).
    lacking: std::collections::HashSet<u32>,
}

impl Instrumentation {
    /// True when this thread took no plan: its code holds no instrumented translation.
    pub(super) fn is_empty(&self) -> bool {
        self.by_numbering.is_empty()
    }

    /// Forgets this generation's translations (a flush); the plans stay.
    pub(super) fn clear_generation(&mut self) {
        self.installed.clear();
        self.blocks.clear();
        self.reloads.clear();
        self.borders.clear();
        self.hand_in_refusals.clear();
    }

    /// The plan current for the function at `entry` that has the back edge from the block at
    /// `from` to the block at `head`, if it may still hand an activation in there (not dropped,
    /// no edge found lacking, [`HAND_INS_PER_FUNCTION`] not reached): the plan and the two
    /// blocks' indices.
    fn back_edge(&self, entry: u64, from: u64, head: u64) -> Option<(&Arc<PathPlan>, u32, u32)> {
        let plan = self.plans.get(&entry)?;
        if self.disabled.contains(&plan.numbering)
            || self.lacking.contains(&plan.numbering)
            || self.hand_ins.get(&entry) >= Some(&HAND_INS_PER_FUNCTION)
        {
            return None;
        }
        let u = plan.index_of(GuestAddr(from))?;
        let h = plan.index_of(GuestAddr(head))?;
        match plan.step(u, h) {
            Some(EdgeStep::Back { .. }) if h != 0 => Some((plan, u, h)),
            _ => None,
        }
    }

    /// The function with a current plan that has the back edge `from → head` (block starts)
    /// and may still hand in there ([`Instrumentation::back_edge`]), if any: its entry, plan,
    /// and the two blocks' indices.
    fn hand_in_site(&self, from: u64, head: u64) -> Option<(u64, &Arc<PathPlan>, u32, u32)> {
        self.loop_heads.get(&head)?.iter().find_map(|&e| {
            let (plan, u, h) = self.back_edge(e, from, head)?;
            Some((e, plan, u, h))
        })
    }

    /// The installed heads of the plan for the function at `entry`, if any.
    fn heads_at(&self, entry: u64) -> Option<EntryHeads> {
        let plan = self.plans.get(&entry)?;
        self.installed.get(&plan.numbering).map(|i| i.heads)
    }
}

impl Translator {
    /// Takes a plan set from the monitor: checks it against the guest code, then installs every
    /// plan's entry. All or none (a region is closed under its calls).
    pub(super) fn instrument(&mut self, plans: Vec<Arc<PathPlan>>) {
        if self.contexts.is_none() || self.producer.is_none() || !self.closed_region(&plans) {
            self.stats.instrument_dropped += 1;
            return;
        }
        for p in &plans {
            self.inst.plans.insert(p.entry().0, p.clone());
            self.inst.by_numbering.insert(p.numbering, p.clone());
            for b in p.back_edges.iter().filter(|b| b.to != 0) {
                let entries = self
                    .inst
                    .loop_heads
                    .entry(p.blocks[b.to as usize].start.0)
                    .or_default();
                if !entries.contains(&p.entry().0) {
                    entries.push(p.entry().0);
                }
            }
            for &i in &p.calls_out {
                if let Some(rp) = p.blocks[i as usize].terminator.return_address() {
                    self.inst.border_returns.insert(rp.0);
                }
            }
        }
        self.drop_callers_of_dropped();
        for p in &plans {
            // A plan that needs a flush first is installed after it, at the next call.
            if self.install(p.numbering, false).is_none() {
                break;
            }
        }
        self.stats.instrumented += plans.len() as u64;
    }

    /// True if `plans` form a closed region and their blocks still decode as planned.
    fn closed_region(&mut self, plans: &[Arc<PathPlan>]) -> bool {
        // Calls may go to functions of this set or of earlier ones (a renumbered function's),
        // from a call site the callee's plan lets in.
        let mut callees: HashMap<u64, Arc<PathPlan>> = self.inst.plans.clone();
        callees.extend(plans.iter().map(|p| (p.entry().0, p.clone())));
        plans.iter().all(|p| {
            let shape = p.numbering != 0
                && p.numbering < MAX_NUMBERING
                && !p.blocks.is_empty()
                && p.exits.len() == p.blocks.len()
                && p.num_paths > 0
                && p.num_paths <= MAX_PLAN_PATHS
                && match p.entry_sites {
                    // One `ret`, or none known (a function with tail calls out may end
                    // only by them; one planned while it runs may have a `ret` not seen yet).
                    None => p.ret_block().is_some() || p.first_ret_block().is_none(),
                    Some(_) => p.first_ret_block().is_some(),
                }
                && !self.inst.by_numbering.contains_key(&p.numbering);
            shape
                && p.blocks.iter().enumerate().all(|(i, b)| {
                    let returns = |return_to| {
                        matches!(
                            p.step_to(i as u32, return_to),
                            Some((_, EdgeStep::Forward(_)))
                        )
                    };
                    let closed = match b.terminator {
                        Terminator::Jump { .. }
                        | Terminator::FallThrough { .. }
                        | Terminator::Return => true,
                        Terminator::Branch { .. } => true,
                        // A call out: any callee, run cold.
                        Terminator::Call { target, return_to }
                            if target != return_to && p.calls_out(i as u32) =>
                        {
                            returns(return_to)
                        }
                        Terminator::IndirectCall { return_to } if p.calls_out(i as u32) => {
                            returns(return_to)
                        }
                        Terminator::Call { target, return_to } => {
                            target != return_to
                                && callees
                                    .get(&target.0)
                                    .is_some_and(|q| q.enters_in_region(return_to))
                                && matches!(
                                    p.step_to(i as u32, return_to),
                                    Some((_, EdgeStep::Forward(_)))
                                )
                        }
                        _ => false,
                    };
                    closed && self.decode(b.start, MAX_BLOCK_INSTRUCTIONS).summary() == *b
                })
        })
    }

    /// Translates block 0 of plan `numbering` in this generation (once) and links cold code's
    /// direct calls of the function to its announcing head. `None` when the plan cannot run
    /// here (its code changed, or it is disabled), or the code cache had to be flushed first:
    /// flushed now when `may_flush`, else asked for (`flush_wanted`).
    fn install(&mut self, numbering: u32, may_flush: bool) -> Option<Installed> {
        match self.try_install(numbering, may_flush) {
            Ok(i) => i,
            Err(e) => {
                self.give_up(numbering, &e);
                None
            }
        }
    }

    /// A plan whose code cannot be translated (a block that does not re-encode, a bug: its
    /// cold translation did) is dropped: this thread runs its function cold, and its
    /// instrumented code goes with the next flush, which is asked for.
    fn give_up(&mut self, numbering: u32, e: &TranslateError) {
        if self.trace_translation {
            eprintln!("hotpath: instrumentation of numbering {numbering} dropped: {e}");
        }
        self.drop_plan(numbering);
    }

    /// Drops plan `numbering` for this thread, and with it every current plan that calls a
    /// function whose plan is dropped (a region is closed under its calls: its instrumented
    /// calls to a function that runs cold would hand over at every call). Their code goes
    /// with the next flush, which is asked for.
    fn drop_plan(&mut self, numbering: u32) {
        self.inst.disabled.insert(numbering);
        self.drop_callers_of_dropped();
        self.inst.flush_wanted = true;
    }

    /// Drops every current plan that calls a function whose current plan is dropped, until
    /// none does (a plan may come after its callee's was dropped).
    fn drop_callers_of_dropped(&mut self) {
        loop {
            let cold: std::collections::HashSet<u64> = self
                .inst
                .plans
                .iter()
                .filter(|(_, p)| self.inst.disabled.contains(&p.numbering))
                .map(|(&e, _)| e)
                .collect();
            let callers: Vec<u32> = self
                .inst
                .plans
                .values()
                .filter(|p| !self.inst.disabled.contains(&p.numbering))
                .filter(|p| {
                    p.blocks.iter().any(|b| {
                        matches!(b.terminator, Terminator::Call { target, .. } if cold.contains(&target.0))
                    })
                })
                .map(|p| p.numbering)
                .collect();
            if callers.is_empty() {
                break;
            }
            self.inst.disabled.extend(callers);
        }
    }

    /// [`Self::install`], with the translation's errors.
    fn try_install(
        &mut self,
        numbering: u32,
        may_flush: bool,
    ) -> Result<Option<Installed>, TranslateError> {
        if let Some(&i) = self.inst.installed.get(&numbering) {
            return Ok(Some(i));
        }
        if self.inst.disabled.contains(&numbering) {
            return Ok(None);
        }
        let Some(plan) = self.inst.by_numbering.get(&numbering).cloned() else {
            return Ok(None);
        };
        let entry = plan.entry().0;
        if self.inst.plans.get(&entry).map(|p| p.numbering) != Some(numbering) {
            return Ok(None);
        }
        let room = self.cache.room() >= INSTALL_ROOM;
        let returns_inline = plan.calls_out.iter().any(|&i| {
            plan.blocks[i as usize]
                .terminator
                .return_address()
                .is_some_and(|rp| self.links.inlined.contains(&rp.0))
        });
        // A superblock that runs one of its back edges inline (an unrolled loop) would keep
        // a live cold activation from being handed in there.
        let loops_inline = plan.back_edges.iter().any(|b| {
            b.to != 0
                && self
                    .links
                    .inlined
                    .contains(&plan.blocks[b.to as usize].start.0)
        });
        if self.links.inlined.contains(&entry) || returns_inline || loops_inline || !room {
            // A superblock runs the function's cold code inline after a call (its calls would
            // never reach the head) or returns into it inline from a callee it calls out to
            // (the return would not reach its border reload stub), or the cache is nearly
            // full: the cache goes (rarely: once per region), and the plan is installed at
            // the next call.
            if may_flush {
                self.flush();
            } else {
                self.inst.flush_wanted = true;
            }
            return Ok(None);
        }
        let Some(body) = self.translate_instrumented(&plan, 0)? else {
            return Ok(None);
        };
        let Some(installed) = self.inst.installed.get(&numbering).copied() else {
            return Ok(None);
        };
        debug_assert_eq!(self.inst.blocks.get(&(numbering, 0)), Some(&body));
        // Cold direct calls linked to the cold entry (or to an older numbering's head) go to
        // the announcing head from now on, and instrumented ones to the quiet entry. When only
        // some call sites may enter, cold ones are unlinked instead: the dispatcher decides
        // each at its next run (`call_target`), where the return address is on the stack.
        // Cold back edges linked before are unlinked: they go through the dispatcher again,
        // where a live cold activation of the function is handed in (`hand_in`).
        let heads = installed.heads;
        let some_sites = plan.entry_sites.is_some();
        let patches: Vec<(HostAddr, HostAddr)> = self
            .index
            .exits
            .iter()
            .filter_map(|e| match e.kind {
                ExitKind::Direct {
                    target,
                    site,
                    stub,
                    call: true,
                    ..
                } if target.0 == entry => {
                    Some((site, if some_sites { stub } else { heads.announce }))
                }
                ExitKind::PathCall {
                    numbering: caller,
                    from,
                    callee,
                    site,
                    stub,
                } if callee.0 == entry => {
                    let returns_to =
                        match self.inst.by_numbering[&caller].blocks[from as usize].terminator {
                            Terminator::Call { return_to, .. } => return_to,
                            _ => GuestAddr(0),
                        };
                    Some((
                        site,
                        if plan.enters_in_region(returns_to) {
                            heads.quiet
                        } else {
                            stub
                        },
                    ))
                }
                ExitKind::Direct {
                    target,
                    from,
                    site,
                    stub,
                    call: false,
                } => self
                    .inst
                    .back_edge(entry, from.0, target.0)
                    .map(|_| (site, stub)),
                _ => None,
            })
            .collect();
        for (site, to) in patches {
            self.cache.patch_rel32(site, to);
        }
        Ok(Some(installed))
    }

    /// The body entry of block `index` of `plan`, translating it if needed. `None` when the
    /// block no longer decodes as planned, or the cache has no room (the caller goes on cold,
    /// handing the hole over; the flush comes where it is safe, `flush_wanted`).
    fn translate_instrumented(
        &mut self,
        plan: &Arc<PathPlan>,
        index: u32,
    ) -> Result<Option<HostAddr>, TranslateError> {
        let numbering = plan.numbering;
        if let Some(&h) = self.inst.blocks.get(&(numbering, index)) {
            return Ok(Some(h));
        }
        if self.inst.disabled.contains(&numbering) {
            return Ok(None);
        }
        let planned = &plan.blocks[index as usize];
        let block = self.decode(planned.start, MAX_BLOCK_INSTRUCTIONS);
        if block.summary() != *planned {
            return Ok(None);
        }
        let pc = planned.start.0;
        self.protect_code(pc, block.end().0.max(pc + 1));
        let tail_call = match block.terminator {
            Terminator::Jump { target } | Terminator::FallThrough { next: target } => {
                self.is_function_entry(target.0)
            }
            _ => false,
        };
        let cx = EmitContext {
            enqueue: Some(self.cfg.ring_entries),
            gateway: self.gateway,
            contexts: true,
            tail_call,
            jump_table: None,
        };
        let shared = self.process.shared.clone();
        let mut registry = lock(&shared.registry);
        // Block 0 announces the function with an id of its own, and its `ret` block's alias.
        let announce = match self.inst.installed.get(&numbering) {
            Some(i) => i.announce,
            None => BlockId(registry.next_id),
        };
        let first_exit = self.index.exits.len() as u32;
        let at = self.cache.next_addr();
        let emitted = emit_instrumented(&block, plan, index, announce, at, first_exit, &cx)?;
        let fits = emitted.block.code.len() as u64 <= self.cache.room()
            && first_exit as u64 + emitted.block.exits.len() as u64 <= EXIT_SPECIAL_BASE as u64;
        if !fits {
            // The caller goes on cold; the cache is flushed where that is safe (the next
            // translation, or after the dispatcher's commands).
            self.inst.flush_wanted = true;
            return Ok(None);
        }
        if let Some(heads) = emitted.heads {
            // (A function that ends only by tail calls out has no `ret`: its alias stands for
            // its entry block, and no pair ends a hole of it: the tail-out event does.)
            let ret = plan.first_ret_block().unwrap_or(0);
            registry.announce(NewBlock {
                id: announce,
                summary: plan.blocks[0],
                kind: IdKind::InstrumentedEntry {
                    numbering,
                    ret: BlockId(announce.0 + 1),
                    ret_edge: plan.entry_sites.is_none() && plan.ret_block().is_some(),
                },
                code: Box::default(),
            });
            registry.announce(NewBlock {
                id: BlockId(announce.0 + 1),
                summary: plan.blocks[ret as usize],
                kind: IdKind::InstrumentedReturn { numbering },
                code: Box::default(),
            });
            registry.next_id += 2;
            self.inst
                .installed
                .insert(numbering, Installed { heads, announce });
        }
        drop(registry);
        if self.trace_translation {
            eprintln!(
                "hotpath: instrumented block {index} of numbering {numbering} at guest {pc:#x} → {}:\n{}",
                emitted.block.entry,
                super::disassemble(&emitted.block.code, at.0)
            );
        }
        self.cache.insert(&emitted.block.code);
        self.index.exits.extend(emitted.block.exits);
        let entry = emitted.block.entry;
        self.note_code(
            &emitted.block.layout,
            crate::code_log::CodeKind::Instrumented,
        );
        self.cache.add_layout(emitted.block.layout);
        let end = block.end().0.max(pc + 1);
        let span = self.index.spans.entry(pc).or_insert(end);
        *span = (*span).max(end);
        if let Some(r) = emitted.reload {
            match emitted.calls_out {
                true => self.inst.borders.insert(r.0, (numbering, index)),
                false => self.inst.reloads.insert(r.0, (numbering, index)),
            };
        }
        self.inst.blocks.insert((numbering, index), entry);
        self.stats.blocks_translated += 1;
        Ok(Some(entry))
    }

    /// The position of the top activation after the instrumented edge `from → to` of plan
    /// `plan` ran its step: what a hand-over says if the thread stops before `to`.
    fn position_after_edge(&self, plan: &PathPlan, from: u32, to: u32) -> HandedAt {
        let r = self.area.contexts.path;
        // A call's (direct or indirect: a call out) edge to its return point: the callee
        // returned.
        let returned = plan.blocks[from as usize].terminator.return_address()
            == Some(plan.blocks[to as usize].start);
        match plan.step(from, to) {
            Some(EdgeStep::Forward(add)) if returned => HandedAt::Returned {
                call: from,
                r: r.wrapping_sub(add),
            },
            Some(EdgeStep::Forward(add)) => HandedAt::Block {
                block: from,
                r: r.wrapping_sub(add),
            },
            Some(EdgeStep::Back { .. }) => HandedAt::Head { head: to },
            None => unreachable!("an instrumented edge is numbered"),
        }
    }

    /// Acts on an exit of instrumented code (`ExitKind::is_instrumented`).
    pub(super) fn path_exit(
        &mut self,
        kind: ExitKind,
    ) -> Result<Result<Next, Stop>, TranslateError> {
        match kind {
            ExitKind::PathEdge {
                numbering,
                from,
                to,
                site,
                ..
            } => {
                let plan = self.inst.by_numbering[&numbering].clone();
                let at = self.position_after_edge(&plan, from, to);
                self.inst.pending = Some(Some((numbering, at)));
                Ok(Ok(self.go_instrumented(&plan, to, Some(site))))
            }
            ExitKind::PathRunMiss {
                numbering,
                from,
                to,
                pop,
            } => self.run_step_missed(numbering, from, to, pop),
            ExitKind::PathReturnElsewhere {
                numbering,
                from,
                pop,
            } => {
                let r = self.area.contexts.path;
                self.hand_over(Some((numbering, HandedAt::Block { block: from, r })));
                self.pop_return_address(pop);
                self.context_return()
            }
            ExitKind::PathCall {
                numbering,
                callee,
                site,
                ..
            } => {
                // The caller's frame (its host the reload stub) says where it is.
                self.inst.pending = Some(None);
                let generation = self.index.generation;
                let next = self.call_instrumented(callee, Some(site));
                if self.inst.pending.is_none() && generation == self.index.generation {
                    // The callee could not be entered instrumented: the hole was handed
                    // over. A caller whose calls keep doing that goes cold.
                    self.count_hand_over_at(numbering);
                }
                next
            }
            ExitKind::PathLeave {
                numbering,
                from,
                to,
            } => {
                self.stats.hand_overs_new_edge += 1;
                self.inst.lacking.insert(numbering);
                let r = self.area.contexts.path;
                self.hand_over(Some((numbering, HandedAt::Block { block: from, r })));
                self.count_hand_over_at(numbering);
                // A cold jump there would have gone through its jump entry.
                if self.is_function_entry(to.0) {
                    self.context_tail_call(to.0);
                }
                Ok(Ok(Next::Guest(to.0)))
            }
            ExitKind::PathCounters { numbering, quiet } => {
                let entry = self.inst.by_numbering[&numbering].entry().0;
                if self.contexts.as_ref().is_some_and(|c| c.in_deeper()) {
                    // Past the depth cap one context stands for every frame, of any function:
                    // its counters could not tell their activations apart. This one runs cold.
                    self.hand_over(Some((numbering, HandedAt::Start)));
                    return Ok(Ok(Next::Guest(entry)));
                }
                let paths = self.inst.by_numbering[&numbering].num_paths as u32;
                let made = self
                    .contexts
                    .as_mut()
                    .and_then(|c| c.path_counters(numbering, paths));
                if made.is_some() {
                    // Its announcing event is written: if the dispatcher goes on by guest
                    // address instead (a kick, a signal), the start is handed over.
                    self.inst.pending = Some(Some((numbering, HandedAt::Start)));
                    return Ok(Ok(Next::Host(quiet)));
                }
                // The counter arena is full: this thread runs the function cold from now on.
                self.hand_over(Some((numbering, HandedAt::Start)));
                self.drop_plan(numbering);
                self.flush();
                Ok(Ok(Next::Guest(entry)))
            }
            ExitKind::PathContextCall {
                numbering,
                from,
                callee,
                full,
                reload,
            } => {
                if full {
                    // Nothing pushed; dropping frames would lose the hole's: hand it over,
                    // then call cold.
                    let r = self.area.contexts.path;
                    self.hand_over(Some((numbering, HandedAt::Block { block: from, r })));
                    return self.context_call(Some(callee), true);
                }
                self.stats.context_exits += 1;
                if let Some(c) = &mut self.contexts {
                    c.child_slow(false, callee.0);
                }
                // The frame the call pushed keeps its reload stub as its host.
                debug_assert_eq!(
                    self.area.contexts.live_frames().last().map(|f| f.host),
                    Some(reload.0)
                );
                self.inst.pending = Some(None);
                self.call_instrumented(callee, None)
            }
            ExitKind::PathCallOut {
                numbering,
                from,
                callee,
                full,
            } => {
                // Its call-out event is written: the hole is suspended, the callee cold.
                self.inst.pending = None;
                if full {
                    // Nothing pushed; dropping frames would lose the hole's: hand it over
                    // (as the monitor holds it now, suspended), then call cold.
                    let r = self.area.contexts.path;
                    self.hand_over_as(Some((numbering, HandedAt::Block { block: from, r })), true);
                }
                self.context_call(callee, full)
            }
            ExitKind::PathTailMiss {
                numbering,
                from,
                target,
            } => {
                self.stats.run_misses += 1;
                let plan = self.inst.by_numbering[&numbering].clone();
                let child = self.end_path_here(&plan, plan.exits[from as usize]);
                self.contexts
                    .as_mut()
                    .expect("instrumented code keeps contexts")
                    .run_end(child);
                // The hole ended with its root's activation.
                self.inst.pending = None;
                if let (Some(site), Some(prod)) = (plan.tail_out_site(from), &self.producer) {
                    prod.push(BorderEvent::tail_out_word(site));
                }
                match self.jump_target(target.0)? {
                    Some(h) => Ok(Ok(Next::Host(h))),
                    None => {
                        self.context_tail_call(target.0);
                        Ok(Ok(Next::Guest(target.0)))
                    }
                }
            }
            ExitKind::PathContextReturn { .. } => {
                self.hand_over(None);
                self.context_return()
            }
            ExitKind::PathReturnNoHost { .. } => {
                self.hand_over(None);
                self.lookup_miss(self.area.ibl_target)
            }
            _ => unreachable!("path_exit takes instrumented exits"),
        }
    }

    /// A cold jump of exit `exit` from the block at `from` to `head`: when it is a back edge of
    /// a function with a current plan and the activation that runs it may go on instrumented,
    /// hands it in (docs/paths-design.md, "Hand-in as built"): its counters in the current
    /// context, `r` the head's restart value, a new hand-in root as its run register, a
    /// hand-in event, then on at the head's instrumented translation. The monitor ends the
    /// activation's cold path at the back edge and holds the rest of it as a hole.
    pub(super) fn hand_in(
        &mut self,
        exit: u32,
        from: GuestAddr,
        head: GuestAddr,
    ) -> Result<HandIn, TranslateError> {
        if self.inst.loop_heads.is_empty() {
            return Ok(HandIn::NotASite);
        }
        let Some((entry, plan, u, h)) = self.inst.hand_in_site(from.0, head.0) else {
            return Ok(HandIn::NotASite);
        };
        let plan = plan.clone();
        if self.inst.hand_in_refusals.get(&exit) >= Some(&HAND_IN_REFUSALS) {
            return Ok(HandIn::NotASite);
        }
        // The activation is the function's, as the guest's contexts (and so the monitor's
        // stack) see it, called from a site its plan lets in, and not in the one context past
        // the depth cap (which stands for every deeper frame).
        let top = self.area.contexts.live_frames().last().copied();
        let top_return = top.map(|f| f.return_to);
        // A call out's callee runs cold by design (its caller's plan does not enter it), at
        // every call: one hand-in each would fill the run trie.
        let called_out = top.is_some_and(|f| self.inst.borders.contains_key(&f.host));
        let ours = self
            .contexts
            .as_ref()
            .is_some_and(|c| !c.in_deeper() && c.current_function() == entry && c.depth() >= 1);
        let may = ours
            && !called_out
            && !self.stepping
            && self.producer.is_some()
            && !self.is_function_entry(head.0)
            && top_return.is_some_and(|rp| plan.enters_from(GuestAddr(rp)));
        if !may {
            *self.inst.hand_in_refusals.entry(exit).or_insert(0) += 1;
            return Ok(HandIn::Refused);
        }
        let generation = self.index.generation;
        let installed = self.install(plan.numbering, true);
        if installed.is_none() || generation != self.index.generation {
            return Ok(HandIn::Refused);
        }
        let Some(EdgeStep::Back { restart, .. }) = plan.step(u, h) else {
            unreachable!("`back_edge` found the back edge");
        };
        let contexts = self
            .contexts
            .as_mut()
            .expect("instrumented code keeps contexts");
        if contexts
            .path_counters(plan.numbering, plan.num_paths as u32)
            .is_none()
        {
            // The counter arena is full: this thread runs the function cold from now on.
            self.drop_plan(plan.numbering);
            return Ok(HandIn::Refused);
        }
        let run = contexts.hand_in_root(plan.numbering);
        let run_index = contexts.run_index(run);
        self.area.contexts.path = restart;
        self.area.contexts.run = run;
        self.stats.hand_ins += 1;
        *self.inst.hand_ins.entry(entry).or_insert(0) += 1;
        if let Some(p) = &self.producer {
            let e = BorderEvent::HandIn {
                numbering: plan.numbering,
                head: h,
                run: run_index,
            };
            for w in e.encode() {
                p.push(w);
            }
        }
        self.inst.pending = Some(Some((plan.numbering, HandedAt::Head { head: h })));
        Ok(HandIn::Done(self.go_instrumented(&plan, h, None)))
    }

    /// True if `from → to` (block starts) is a back edge of a function with a current plan:
    /// a superblock does not run it inline (it is where a cold activation is handed in).
    pub(super) fn is_hand_in_edge(&self, from: u64, to: u64) -> bool {
        self.inst.hand_in_site(from, to).is_some()
    }

    /// Counts a hand-over that plan `numbering`'s code keeps causing (an edge its numbering
    /// lacks, a call of a function that cannot be entered instrumented); the plan is dropped
    /// for the thread at [`HAND_OVERS_BEFORE_DROP`].
    fn count_hand_over_at(&mut self, numbering: u32) {
        let n = self.inst.new_edges.entry(numbering).or_insert(0);
        *n += 1;
        if *n == HAND_OVERS_BEFORE_DROP {
            self.stats.instrument_dropped += 1;
            self.drop_plan(numbering);
        }
    }

    /// Goes on at the instrumented translation of block `to` of `plan` (linking `site` to it),
    /// where `pending` says the top activation is; or, when it cannot be had, hands the hole
    /// over and goes on at the block's guest address, cold.
    fn go_instrumented(&mut self, plan: &Arc<PathPlan>, to: u32, site: Option<HostAddr>) -> Next {
        let generation = self.index.generation;
        let host = self.translate_instrumented(plan, to).unwrap_or_else(|e| {
            self.give_up(plan.numbering, &e);
            None
        });
        match host {
            Some(h) if generation == self.index.generation => {
                if let (Some(site), false) = (site, self.stepping) {
                    self.cache.patch_rel32(site, h);
                    self.stats.links += 1;
                }
                Next::Host(h)
            }
            _ => {
                self.leave_hole();
                Next::Guest(plan.blocks[to as usize].start.0)
            }
        }
    }

    /// A path end of block `from` of plan `numbering` whose run step missed
    /// (`ExitKind::PathRunMiss`; nothing of it done): the whole path end — path counted, run
    /// stepped (the runtime makes the child and fills the node's cache), and on a back edge to
    /// `to` the next path started, at the activation's end its run counted — then on as the
    /// translation goes: to the head, or through the `ret` popping `pop` bytes.
    fn run_step_missed(
        &mut self,
        numbering: u32,
        from: u32,
        to: Option<u32>,
        pop: i32,
    ) -> Result<Result<Next, Stop>, TranslateError> {
        self.stats.run_misses += 1;
        let plan = self.inst.by_numbering[&numbering].clone();
        let (end, restart) = match to.map(|h| plan.step(from, h)) {
            Some(Some(EdgeStep::Back { end, restart })) => (end, Some(restart)),
            Some(_) => unreachable!("a run step ends a path at a back edge"),
            None => (plan.exits[from as usize], None),
        };
        let child = self.end_path_here(&plan, end);
        let contexts = self
            .contexts
            .as_mut()
            .expect("instrumented code keeps contexts");
        match (to, restart) {
            (Some(head), Some(restart)) => {
                self.area.contexts.run = child;
                self.area.contexts.path = restart;
                self.inst.pending = Some(Some((numbering, HandedAt::Head { head })));
                Ok(Ok(self.go_instrumented(&plan, head, None)))
            }
            _ => {
                contexts.run_end(child);
                self.instrumented_ret(pop)
            }
        }
    }

    /// The runtime's part of a path end of `plan` whose run step missed: the path `r + end`
    /// counted in the current context and the run stepped to its child (made if need be), whose
    /// host address it returns.
    fn end_path_here(&mut self, plan: &PathPlan, end: u64) -> u64 {
        // The area's words are read and written around `contexts`' calls, which take run
        // nodes from it.
        let (r, run) = (self.area.contexts.path, self.area.contexts.run);
        let p = r.wrapping_add(end);
        let contexts = self
            .contexts
            .as_mut()
            .expect("instrumented code keeps contexts");
        contexts.count_path(p);
        // Path ids are below MAX_PLAN_PATHS.
        contexts.run_step(run, p as u32, plan.num_paths as u32)
    }

    /// The `ret` of an instrumented block whose path and run are counted, popping `pop` bytes,
    /// made by the runtime as the translated return does it (`context_steps::return_and_lookup`
    /// and the reload stub after it): to the top frame's host — a caller's reload stub, done
    /// here, or a cold caller's landing — or, with no host or another frame's return address,
    /// cold after a hand-over.
    fn instrumented_ret(&mut self, pop: i32) -> Result<Result<Next, Stop>, TranslateError> {
        let target = self.pop_return_address(pop);
        let top = self.area.contexts.live_frames().last().copied();
        let Some(frame) = top.filter(|f| f.return_to == target) else {
            self.hand_over(None);
            return self.context_return();
        };
        self.context_ret(target);
        if frame.host == 0 {
            self.hand_over(None);
            return self.lookup_miss(target);
        }
        let border = self.inst.borders.get(&frame.host).copied();
        if let (Some(_), Some(p)) = (border, &self.producer) {
            // The hole's root was a call out's callee: the caller's region goes on, as its
            // border reload stub does.
            p.push(BorderEvent::RETURN_IN);
        }
        let Some((caller, call)) = border.or_else(|| self.inst.reloads.get(&frame.host).copied())
        else {
            // The hole's root returns to cold code.
            return Ok(Ok(Next::Guest(target)));
        };
        let plan = self.inst.by_numbering[&caller].clone();
        let Some((point, EdgeStep::Forward(add))) = plan.step_to(call, GuestAddr(target)) else {
            unreachable!("a reload stub's call returns to its return point");
        };
        let area = &mut self.area.contexts;
        area.path = frame.path.wrapping_add(add);
        area.run = frame.run;
        self.inst.pending = Some(Some((
            caller,
            HandedAt::Returned {
                call,
                r: frame.path,
            },
        )));
        Ok(Ok(self.go_instrumented(&plan, point, None)))
    }

    /// Goes on at the quiet entry of the instrumented function at `callee` (its frame pushed
    /// and its context stepped), linking `site` to it; or, when the callee cannot run
    /// instrumented here, hands the hole over and enters it by guest address (its announcing
    /// head, or its cold code).
    fn call_instrumented(
        &mut self,
        callee: GuestAddr,
        site: Option<HostAddr>,
    ) -> Result<Result<Next, Stop>, TranslateError> {
        let generation = self.index.generation;
        let numbering = match self.inst.plans.get(&callee.0) {
            Some(p) if p.entry_sites.is_none() && !p.roots_only() => Some(p.numbering),
            Some(p) => p
                .enters_in_region(GuestAddr(self.guest_return_address()))
                .then_some(p.numbering),
            None => None,
        };
        let installed = match numbering {
            Some(n) => self.install(n, true),
            None => None,
        };
        match installed {
            Some(i) if generation == self.index.generation => {
                if let (Some(site), false) = (site, self.stepping) {
                    self.cache.patch_rel32(site, i.heads.quiet);
                    self.stats.links += 1;
                }
                Ok(Ok(Next::Host(i.heads.quiet)))
            }
            _ => {
                self.leave_hole();
                Ok(Ok(Next::Guest(callee.0)))
            }
        }
    }

    /// A `ret` popping `pop` bytes, made here: its target (also in `ibl_target`). The
    /// translation's load of the return address has just read it.
    fn pop_return_address(&mut self, pop: i32) -> u64 {
        let rsp = self.area.gpr[crate::thread_area::RSP];
        let target = self.guest_return_address();
        self.area.gpr[crate::thread_area::RSP] = rsp.wrapping_add(pop as u64);
        self.area.ibl_target = target;
        target
    }

    /// The guest's return address at a call's exit: the top of its stack (the call pushed it).
    fn guest_return_address(&self) -> u64 {
        let mut bytes = [0u8; 8];
        crate::guest_mem::read_mapped(self.area.gpr[crate::thread_area::RSP], &mut bytes);
        u64::from_le_bytes(bytes)
    }

    /// Drops every plan and, if any was taken, the code cache (a forked child, whose new
    /// monitor numbers its functions afresh). Only where the thread goes on by guest address.
    pub(super) fn forget_instrumentation(&mut self) {
        if self.inst.by_numbering.is_empty() {
            return;
        }
        self.inst = Instrumentation::default();
        if let Some(c) = &mut self.contexts {
            c.forget_abandoned_runs();
        }
        self.flush();
    }

    /// True if the function entered at `pc` has a plan (its entry is not inlined in
    /// superblocks).
    pub(super) fn has_plan(&self, pc: u64) -> bool {
        self.inst.plans.contains_key(&pc)
    }

    /// True if resuming at host address `h` after a ring refill resumes a border event's
    /// words: `h` is past an instrumented block's body entry (its announcing head, before it,
    /// resumes at the block's start like any block's enqueue stub).
    pub(super) fn is_border_resume(&self, h: HostAddr) -> bool {
        self.cache
            .layouts()
            .floor(h.0)
            .is_some_and(|l| l.path_block.is_some() && h.0 >= l.entry && h.0 < l.code_end)
    }

    /// True if `pc` is the return point of a plan's call out (a superblock does not return to
    /// it inline).
    pub(super) fn is_border_return(&self, pc: u64) -> bool {
        self.inst.border_returns.contains(&pc)
    }

    /// Before `enter`: the thread goes on in the cache, the hole with it.
    pub(super) fn entering_hole(&mut self) {
        self.inst.pending = None;
    }

    /// The dispatcher goes on by guest address: if an exit of instrumented code was being
    /// handled, hand its hole over first.
    pub(super) fn leave_hole(&mut self) {
        if let Some(top) = self.inst.pending.take() {
            self.hand_over(top);
        }
    }

    /// A fault in instrumented block `block` of plan `numbering` (the guest's state is at the
    /// faulting instruction: no step of the block's edges has run).
    pub(super) fn fault_in_hole(&mut self, numbering: u32, block: u32) {
        let r = self.area.contexts.path;
        self.inst.pending = None;
        self.hand_over(Some((numbering, HandedAt::Block { block, r })));
    }

    /// Turns every live instrumented activation of this thread cold: the callers whose
    /// frames return to a reload stub (their hosts become 0: they return through the lookup),
    /// then `top`, the running one, if it is live. Writes the hand-over for the monitor when
    /// there is one (docs/paths-design.md, "Step 3c decided", item 3).
    pub(super) fn hand_over(&mut self, top: Option<(u32, HandedAt)>) {
        self.hand_over_as(top, false);
    }

    /// [`Translator::hand_over`]; `suspended`: the hole is the innermost suspended one, not
    /// the running one (its call out's event is written: `top` is at the call block).
    fn hand_over_as(&mut self, top: Option<(u32, HandedAt)>, suspended: bool) {
        self.inst.pending = None;
        let mut activations = Vec::new();
        let run_index = |run| self.contexts.as_ref().map_or(0, |c| c.run_index(run));
        let contexts = &mut self.area.contexts;
        let depth = contexts.depth();
        for f in contexts.frames[1..=depth].iter_mut().rev() {
            let Some(&(numbering, call)) = self.inst.reloads.get(&f.host) else {
                break;
            };
            activations.push(HandedActivation {
                numbering,
                at: HandedAt::Block {
                    block: call,
                    r: f.path,
                },
                run: run_index(f.run),
            });
            f.host = 0;
        }
        activations.reverse();
        if let Some((numbering, at)) = top {
            // A start has not set its run register yet.
            let run = match at {
                HandedAt::Start => 0,
                _ => run_index(contexts.run),
            };
            activations.push(HandedActivation { numbering, at, run });
        }
        if activations.is_empty() {
            return;
        }
        self.stats.hand_overs += 1;
        if let Some(p) = &self.producer {
            for w in (HandOver {
                activations,
                suspended,
            })
            .encode()
            {
                p.push(w);
            }
        }
    }

    /// Hands over every suspended hole whose call out's frame is among frames `lowest..=top`
    /// (indices into the frame stack, 1 the bottom; they may be above `frame_top` already,
    /// popped by a rule that has just run, their words intact), the innermost first: each is
    /// its call out's frame (the caller at the call block) and the frames below it whose host
    /// is one of the region's reload stubs (its callers), and their hosts become 0
    /// (docs/paths-design.md, "Step 3g as built").
    pub(super) fn hand_over_suspended(&mut self, lowest: usize, top: usize) {
        if self.inst.borders.is_empty() {
            return;
        }
        let run_index = |run| self.contexts.as_ref().map_or(0, |c| c.run_index(run));
        let frames = &mut self.area.contexts.frames;
        let top = top.min(frames.len() - 1);
        let activation = |numbering, call, f: &hotpath_contexts::Frame| HandedActivation {
            numbering,
            at: HandedAt::Block {
                block: call,
                r: f.path,
            },
            run: run_index(f.run),
        };
        let mut holes = Vec::new();
        let mut i = top;
        while i >= lowest.max(1) {
            let Some(&(numbering, call)) = self.inst.borders.get(&frames[i].host) else {
                i -= 1;
                continue;
            };
            // The call out's frame: its caller, at the call block.
            let mut activations = vec![activation(numbering, call, &frames[i])];
            frames[i].host = 0;
            // The caller's callers in the hole: the frames below whose host is one of the
            // region's reload stubs.
            let mut j = i - 1;
            while j >= 1 {
                let Some(&(n, c)) = self.inst.reloads.get(&frames[j].host) else {
                    break;
                };
                activations.push(activation(n, c, &frames[j]));
                frames[j].host = 0;
                j -= 1;
            }
            activations.reverse();
            holes.push(activations);
            // The hole's root's frame may be another hole's call out.
            i = j;
        }
        for activations in holes {
            self.stats.hand_overs += 1;
            if let Some(p) = &self.producer {
                for w in (HandOver {
                    activations,
                    suspended: true,
                })
                .encode()
                {
                    p.push(w);
                }
            }
        }
    }

    /// After a rule of the runtime popped frames from `depth` frames down to the current
    /// depth: the suspended holes whose call out's frame went are handed over (before the
    /// rule's context event, so that the monitor has their activations to pop).
    pub(super) fn hand_over_popped(&mut self, depth: usize) {
        let now = self.area.contexts.depth();
        if now < depth {
            self.hand_over_suspended(now + 1, depth);
        }
    }

    /// The host address a `ret` to `target` made by the runtime goes on at when the top frame
    /// is a call out's (its border reload stub writes the return-in event), else `None`.
    pub(super) fn border_host(&self, target: u64) -> Option<HostAddr> {
        if self.inst.borders.is_empty() {
            return None;
        }
        let f = self.area.contexts.live_frames().last()?;
        (f.return_to == target && self.inst.borders.contains_key(&f.host))
            .then_some(HostAddr(f.host))
    }

    /// Where a cold direct call of the function entered at `pc` (its return address on the
    /// guest's stack) goes: the announcing head of its instrumented translation when it has a current plan
    /// that lets the call site in (installed in this generation first if need be), else its
    /// block.
    pub(super) fn call_target(&mut self, pc: u64) -> Result<HostAddr, TranslateError> {
        // The return address is read (on the guest's stack) only for a plan that lists sites.
        let enters = match self.inst.plans.get(&pc) {
            None => false,
            Some(p) if p.entry_sites.is_none() => true,
            Some(p) => p.enters_from(GuestAddr(self.guest_return_address())),
        };
        if !enters {
            // No plan, or one that lets this call site in cold only.
            return self.lookup_or_translate(pc);
        }
        if let Some(h) = self.inst.heads_at(pc) {
            return Ok(h.announce);
        }
        if let Some(numbering) = self.inst.plans.get(&pc).map(|p| p.numbering) {
            let generation = self.index.generation;
            if let Some(i) = self.install(numbering, true) {
                if generation == self.index.generation {
                    return Ok(i.heads.announce);
                }
            }
        }
        self.lookup_or_translate(pc)
    }
}
