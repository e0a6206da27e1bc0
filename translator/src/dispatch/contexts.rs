//! The dispatcher's side of calling contexts (`--guest-contexts`; `crate::context_steps` is
//! the translated side): the runtime steps behind the exits of calls, returns and jumps, the
//! function entries that make a jump a tail call, and their jump entries.

use hotpath_contexts::{Functions, Resync};
use hotpath_events::{ContextChange, ContextEvent};
use hotpath_ir::{GuestAddr, HostAddr, Terminator};

use super::{Next, Stop, Translator};
use crate::code_cache::{Exit, ExitKind, HostLayout};
use crate::context_steps;
use crate::gateway::EXIT_SPECIAL_BASE;
use crate::guest_mem;
use crate::linux::process::{lock, FunctionMap};
use crate::thread_area::{self, IblEntry, ThreadArea};
use crate::TranslateError;

/// Bytes a jump entry takes at most (`context_steps::jump_entry`).
const JUMP_ENTRY_MAX: u64 = 512;

/// Per-thread state of the dispatcher's context work.
#[derive(Default)]
pub(super) struct ContextLinks {
    /// Function entry → its jump entry (this cache generation).
    jump_entries: std::collections::HashMap<u64, HostAddr>,
    /// Target → this generation's direct exits to it that are not calls, to link through
    /// the target's jump entry once it becomes a function entry.
    jumps_to: std::collections::HashMap<u64, Vec<u32>>,
    /// Guest addresses of the blocks superblocks run inline past their head (this generation):
    /// one that becomes a function entry needs the superblock gone.
    pub(super) inlined: std::collections::HashSet<u64>,
    /// A host address in a jump entry `settle_jump_entry` must leave alone: one whose due it
    /// did already (the same pending address may be turned into its guest address more than
    /// once), or the one the dispatcher entered, while the exit is handled.
    settled: Option<u64>,
}

impl ContextLinks {
    /// The dispatcher enters the cache at `host`: until the exit is handled, that address is
    /// spent, not pending (`settle_jump_entry` leaves it alone).
    pub(super) fn entering(&mut self, host: HostAddr) {
        self.settled = Some(host.0);
    }

    /// The exit is handled: the address to go on at is the exit's, not yet settled.
    pub(super) fn exited(&mut self) {
        self.settled = None;
    }

    /// Forgets the code cache's contents (a flush).
    pub(super) fn clear(&mut self) {
        self.jump_entries.clear();
        self.jumps_to.clear();
        self.inlined.clear();
    }
}

impl Translator {
    /// True if `addr` is a function entry: the target of a call translated or made in this
    /// process. (Not every function symbol's start: assembly gives block labels function
    /// symbols, and gcc gives a function's cold part one, which jumps reach.)
    pub(super) fn is_function_entry(&self, addr: u64) -> bool {
        lock(&self.process.shared.function_entries).contains(&addr)
    }

    /// Records `entry` as a function entry (a call to it was translated or made). The first
    /// time, jumps to it that this thread linked straight to its block go through its jump
    /// entry from then on, and a superblock that runs it inline is dropped with the cache.
    pub(super) fn add_function_entry(&mut self, entry: u64) -> Result<(), TranslateError> {
        if self.contexts.is_none() || !lock(&self.process.shared.function_entries).insert(entry) {
            return Ok(());
        }
        if self.links.inlined.contains(&entry) {
            self.flush();
            return Ok(());
        }
        let jumps = self.links.jumps_to.get(&entry).cloned().unwrap_or_default();
        let slot = ThreadArea::ibl_index(entry);
        if jumps.is_empty() && !self.area.ibl[slot].holds(entry) {
            return Ok(());
        }
        let generation = self.index.generation;
        let Some(host) = self.jump_entry(entry)? else {
            return Ok(());
        };
        if generation != self.index.generation {
            return Ok(());
        }
        for index in jumps {
            if let ExitKind::Direct { site, .. } = self.index.exits[index as usize].kind {
                self.cache.patch_rel32(site, host);
                self.note_link(entry, index);
            }
        }
        if self.area.ibl[slot].holds(entry) {
            self.area.ibl[slot] = IblEntry::new(entry, host.0);
        }
        Ok(())
    }

    /// Notes what a newly emitted block or superblock's exits and blocks mean for contexts.
    pub(super) fn note_exits(&mut self, first: usize) {
        if self.contexts.is_none() {
            return;
        }
        for (i, e) in self.index.exits.iter().enumerate().skip(first) {
            if let ExitKind::Direct {
                target,
                call: false,
                ..
            } = e.kind
            {
                self.links
                    .jumps_to
                    .entry(target.0)
                    .or_default()
                    .push(i as u32);
            }
        }
    }

    /// Notes the blocks a superblock runs inline past its head.
    pub(super) fn note_inlined(&mut self, blocks: &[hotpath_ir::Block]) {
        if self.contexts.is_some() {
            self.links
                .inlined
                .extend(blocks.iter().skip(1).map(|b| b.start.0));
        }
    }

    /// Where a jump (not a call) to `target` goes: with contexts kept and `target` a function
    /// entry, its jump entry (`None` when the cache has no room for one: then the dispatcher
    /// checks for a tail call itself and does not link); else the block.
    pub(super) fn jump_target(&mut self, target: u64) -> Result<Option<HostAddr>, TranslateError> {
        if self.contexts.is_some() && self.is_function_entry(target) {
            return self.jump_entry(target);
        }
        self.lookup_or_translate(target).map(Some)
    }

    /// The jump entry of function entry `entry`, emitted the first time (this generation).
    fn jump_entry(&mut self, entry: u64) -> Result<Option<HostAddr>, TranslateError> {
        if let Some(&h) = self.links.jump_entries.get(&entry) {
            return Ok(Some(h));
        }
        let block = self.lookup_or_translate(entry)?;
        if self.cache.room() < JUMP_ENTRY_MAX
            || self.index.exits.len() + 1 >= EXIT_SPECIAL_BASE as usize
        {
            return Ok(None);
        }
        let index = self.index.exits.len() as u32;
        let at = self.cache.next_addr();
        let mut ops = dynasmrt::VecAssembler::new(at.0 as usize);
        context_steps::jump_entry(
            &mut ops,
            GuestAddr(entry),
            block,
            index,
            self.cfg.enqueue.then_some(self.cfg.ring_entries),
            self.gateway.exit.0 as usize,
        );
        let code = ops.finalize().map_err(|e| TranslateError::CodeCache {
            reason: format!("jump entry: {e:?}"),
        })?;
        debug_assert!(code.len() as u64 <= JUMP_ENTRY_MAX);
        self.index.exits.push(Exit {
            block: hotpath_ir::BlockId(u32::MAX),
            kind: ExitKind::ContextTailCall {
                entry: GuestAddr(entry),
            },
        });
        let host = self.cache.insert(&code);
        // A layout, so that the host address maps back to the guest's: the dispatcher goes on
        // at a jump entry (`Next::Host`) and may have to turn it into the guest address first
        // (a signal or another thread's news before it enters the cache). Nothing in the stub
        // faults; its registers are borrowed from the start.
        let layout = HostLayout {
            code_start: host.0,
            entry: host.0,
            guest_start: entry,
            code_end: host.0 + code.len() as u64,
            term_start: host.0,
            term_guest: entry,
            rcx_borrowed_from: Some(host.0),
            ..HostLayout::default()
        };
        self.note_code(&layout, crate::code_log::CodeKind::ContextStub);
        self.cache.add_layout(layout);
        self.links.jump_entries.insert(entry, host);
        Ok(Some(host))
    }

    /// Tells the monitor (when it is on) that the thread's context changed by `change`: a
    /// context event, with the thread's frame count after it, and `function` when the change
    /// names one. Written after the event of the block whose terminator made the change and
    /// before the next block's, as the monitor reads it.
    pub(super) fn push_context_event(&mut self, change: ContextChange, function: u64) {
        if let (Some(p), Some(c)) = (&self.producer, &self.contexts) {
            let e = ContextEvent {
                change,
                depth: c.depth() as u32,
                function,
            };
            let (words, n) = e.encode();
            for &w in &words[..n] {
                p.push(w);
            }
        }
    }

    /// Does what a jump entry at `next` owes before the dispatcher goes on at the guest
    /// address instead (a signal, another thread's news, a flush, single-stepping): the jump
    /// to the entry is done, so a jump entry not yet entered makes its tail call here (rule 3,
    /// as it would have), and a ring refill in one (its tail-call event's enqueue stub, after
    /// the step) writes the event. Else the guest's context would depend on when such news
    /// came.
    pub(super) fn settle_jump_entry(&mut self, next: Next) {
        if self.contexts.is_none() {
            return;
        }
        let (h, resume) = match next {
            Next::Host(h) => (h.0, false),
            Next::Resume(h) => (h.0, true),
            Next::Guest(_) | Next::Signal => return,
        };
        let Some(layout) = self.cache.layouts().floor(h) else {
            return;
        };
        let (start, end, entry) = (layout.code_start, layout.code_end, layout.guest_start);
        if h >= end
            || self.links.jump_entries.get(&entry) != Some(&HostAddr(start))
            || self.links.settled.replace(h) == Some(h)
        {
            return;
        }
        if resume {
            self.push_context_event(ContextChange::TailCall, 0);
        } else if h == start {
            self.context_tail_call(entry);
        }
    }

    /// A jump reached function entry `entry` from another function's context (its jump entry
    /// said so, or the dispatcher found it): rule 3, a tail call.
    pub(super) fn context_tail_call(&mut self, entry: u64) {
        if let Some(c) = &mut self.contexts {
            self.stats.context_exits += 1;
            let before = c.current();
            if c.tail_call(entry) != before {
                self.push_context_event(ContextChange::TailCall, 0);
            }
        }
    }

    /// A call's context step that needs the runtime (see `context_steps`): the frame stack is
    /// `full`, or the node's cache did not hold the callee (`None`: an indirect call's, in
    /// `ibl_target`). Then the call goes on to the callee.
    pub(super) fn context_call(
        &mut self,
        callee: Option<GuestAddr>,
        full: bool,
    ) -> Result<Result<Next, Stop>, TranslateError> {
        let target = callee.map_or(self.area.ibl_target, |c| c.0);
        let rsp = self.area.gpr[thread_area::RSP];
        if let Some(c) = &mut self.contexts {
            self.stats.context_exits += 1;
            if full {
                let mut ret = [0u8; 8];
                // The call's own push wrote it: readable.
                let _ = guest_mem::read(rsp, &mut ret);
                c.call_slow(callee.is_none(), target, u64::from_le_bytes(ret));
            } else {
                c.child_slow(callee.is_none(), target);
            }
        }
        match callee {
            Some(c) => Ok(Ok(Next::Guest(c.0))),
            None => {
                self.add_function_entry(target)?;
                self.lookup_miss(target)
            }
        }
    }

    /// A `ret` whose target (in `ibl_target`) is not the top frame's return address.
    pub(super) fn context_return(&mut self) -> Result<Result<Next, Stop>, TranslateError> {
        let target = self.area.ibl_target;
        if self.contexts.is_some() {
            self.stats.context_exits += 1;
            self.return_step(target, true);
        }
        self.lookup_miss(target)
    }

    /// A `ret` to `target` that the dispatcher makes itself (a superblock's side exit that
    /// found the ring full, the vsyscall page's entries): rule 2 as translated code does it.
    pub(super) fn context_ret(&mut self, target: u64) {
        self.return_step(target, false);
    }

    /// Rule 2 for a `ret` to `target` (`slow`: known not to be the top frame's return
    /// address), and the context event of a deeper or orphan return.
    fn return_step(&mut self, target: u64, slow: bool) {
        let Some(c) = &mut self.contexts else { return };
        let functions = FunctionMap(self.process.shared.function_symbols());
        let before = c.resyncs;
        if slow {
            c.ret_slow(target, &functions);
        } else {
            c.ret(target, &functions);
        }
        let deeper = Resync::DeeperReturn as usize;
        if c.resyncs[deeper] != before[deeper] {
            self.push_context_event(ContextChange::DeeperReturn, 0);
        } else if c.resyncs != before {
            let function = functions.containing(target);
            self.push_context_event(ContextChange::OrphanReturn, function);
        }
    }

    /// An indirect jump to the top frame's return address (in `ibl_target`): rule 4.
    pub(super) fn context_jump_return(&mut self) -> Result<Result<Next, Stop>, TranslateError> {
        let target = self.area.ibl_target;
        if let Some(c) = &mut self.contexts {
            self.stats.context_exits += 1;
            if c.jump(target) {
                self.push_context_event(ContextChange::JumpReturn, 0);
            }
        }
        self.lookup_miss(target)
    }

    /// Called for each block translated: a direct call's target becomes a function entry.
    pub(super) fn note_translated(
        &mut self,
        terminator: &Terminator,
    ) -> Result<(), TranslateError> {
        match *terminator {
            Terminator::Call { target, return_to } if target != return_to => {
                self.add_function_entry(target.0)
            }
            _ => Ok(()),
        }
    }
}
