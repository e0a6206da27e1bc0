//! The dispatch loop: entering the code cache, and each exit back to the dispatcher (lookup
//! misses, traps, faults, special instructions).

use super::*;

impl Translator {
    /// Runs the guest until it exits, dies, or needs its embedder (exec, fork).
    ///
    /// # Errors
    /// [`TranslateError`] when the guest needs something hotpath does not support, or a guest
    /// instruction cannot be translated.
    pub fn run(&mut self) -> Result<Stop, TranslateError> {
        self.run_until_stop()
    }

    /// [`Translator::run`]'s loop.
    pub(super) fn run_until_stop(&mut self) -> Result<Stop, TranslateError> {
        loop {
            if self
                .process
                .shared
                .exiting
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                self.park();
            }
            self.process.signals.take_kick();
            self.take_invalidations();
            let mut next = self.next;
            let resuming =
                matches!(next, Next::Resume(_)) || std::mem::take(&mut self.hold_delivery);
            if matches!(next, Next::Signal) || (!resuming && self.process.signals.deliverable()) {
                let rip = self.guest_rip_settled(next);
                self.guest_fpu_ip();
                match self.process.signals.deliver(self.area, rip) {
                    Delivery::Continue(to) => next = Next::Guest(to),
                    Delivery::Exit(sig) => return Ok(Stop::Exit(GuestExit::Signaled(sig))),
                }
            }
            // The signal handler closes the victim table with the lookup table when it brings
            // the thread here; with nothing left to deliver, its entries serve again.
            if self.area.ibl2_open == 0 && !self.process.signals.deliverable() {
                self.area.ibl2_open = 1;
            }
            let written = self.process.signals.protected_pages().take_hits();
            if !written.is_empty() {
                // The guest wrote into pages whose code was translated: resume at the guest
                // address (the host code may be about to go) and discard the translations.
                next = Next::Guest(self.guest_rip_settled(next));
                self.process.invalidate.extend(written);
                self.apply_invalidations();
                self.process.signals.protected_pages().published();
            } else if self.process.signals.protected_pages().wait_published()
                || self.process.shared.invalidation_count() != self.index.invalidations_seen
            {
                // Another thread's dispatcher took writes and has published them now, or did
                // so after this loop's `take_invalidations` above (before `take_hits` found
                // none to take): discard them here too before running anything (as for a
                // caught write). Left to the next loop, a thread sent here by the writer's
                // handler ran the translation the write replaced once more (the
                // `jitversions` sample's reader called an older version once, in a full
                // test run).
                next = Next::Guest(self.guest_rip_settled(next));
                self.next = next;
                self.take_invalidations();
            }
            self.arm_safe_point();
            self.poll_commands();
            if let Next::Guest(pc) = next {
                let last = self.process.signals.last_trap();
                if let Some(action) = special::vsyscall(pc, &mut self.process.maps, self.area, last)
                {
                    self.next = self.act(action)?;
                    continue;
                }
            }
            let tf = self.area.rflags & special::EFLAGS_TF != 0;
            self.stepping = tf;
            let host = match next {
                // EFLAGS.TF: one guest instruction at a time, a SIGTRAP after each.
                Next::Guest(_) | Next::Host(_) if tf => match self.step_entry(next)? {
                    Ok(h) => h,
                    Err(n) => {
                        self.next = n;
                        continue;
                    }
                },
                Next::Guest(pc) => self.lookup_or_translate(pc)?,
                Next::Host(h) | Next::Resume(h) => h,
                Next::Signal => unreachable!("delivery always yields a guest address"),
            };
            // From here to the cache a signal's handler may unlink blocks; a signal that came
            // during the critical section is caught by this check instead.
            self.process.signals.set_critical(false, &self.index);
            if self.process.signals.kicked() {
                // Another thread has news for this one (see `run`'s top).
                self.process.signals.set_critical(true, &self.index);
                self.next = if resuming {
                    next
                } else {
                    Next::Guest(self.guest_rip_settled(Next::Host(host)))
                };
                continue;
            }
            if self.process.signals.deliverable() {
                if resuming {
                    // Run the block to its end, where it leaves the cache unchained.
                    self.process.signals.unlink_now(self.area);
                } else {
                    self.process.signals.set_critical(true, &self.index);
                    self.next = Next::Guest(self.guest_rip_settled(Next::Host(host)));
                    continue;
                }
            }
            self.area.jump_to = host.0;
            if self.stepping {
                // The host does not trap: the dispatcher raises the guest's trap afterwards.
                self.area.rflags &= !special::EFLAGS_TF;
            }
            self.enter();
            if self.stepping {
                self.area.rflags |= special::EFLAGS_TF;
            }
            self.process.signals.set_critical(true, &self.index);
            let exit = self.handle_exit();
            if crate::host::reserve::exhausted() {
                return Err(TranslateError::OutOfMemory);
            }
            let stepped = std::mem::take(&mut self.stepping);
            match exit? {
                Ok(n) => {
                    self.next = n;
                    // The instruction ran (a fault or a ring refill stopped it short otherwise).
                    if stepped && self.step_traps && !matches!(n, Next::Signal | Next::Resume(_)) {
                        let rip = self.guest_rip_settled(n);
                        self.process.signals.raise(special::single_step(rip));
                        self.next = Next::Signal;
                    }
                }
                Err(stop) => return Ok(stop),
            }
        }
    }

    /// Another thread ends the process: stop here for good (the process's end kills this
    /// host thread). The ring is closed first, so the monitor can finish.
    pub(super) fn park(&mut self) -> ! {
        self.publish_stats();
        if let Some(p) = &self.producer {
            p.close();
        }
        crate::linux::signals::block_all();
        self.ctl.set_place(ThreadPlace::Parked);
        loop {
            std::thread::park();
        }
    }

    /// Applies the code invalidations other threads published since this one last looked
    /// (their `munmap`, `mprotect`, code writes...).
    pub(super) fn take_invalidations(&mut self) {
        if let Some((ranges, seen)) = self
            .process
            .shared
            .invalidations_since(self.index.invalidations_seen)
        {
            self.index.invalidations_seen = seen;
            // A host address to go on at (a block just linked or looked up) may be in code the
            // discard flushes: go on at its guest address instead, as after a caught write.
            if !matches!(self.next, Next::Signal) {
                self.next = Next::Guest(self.guest_rip_settled(self.next));
            }
            self.discard(&ranges);
        }
    }

    /// Makes every block entry's check pass again: when the monitor is on and the ring's lap
    /// is full, runs the lap-full hook (which starts a monitor put off), waits for the monitor
    /// to read the lap and starts the next one.
    pub(super) fn arm_safe_point(&mut self) {
        // Once a lap (a million events): the `Arc` is cloned only then.
        if self.producer.as_ref().is_some_and(|p| p.lap_full()) {
            if let Some(hook) = self.lap_full_hook.clone() {
                hook(self);
            }
        }
        if let Some(p) = &self.producer {
            p.refill();
        }
    }

    /// [`Translator::guest_rip`] for a dispatcher that goes on at the guest address instead of
    /// `next`'s host address.
    pub(super) fn guest_rip_settled(&mut self, next: Next) -> u64 {
        if matches!(next, Next::Resume(_)) {
            self.hold_delivery = true;
        }
        self.guest_rip(next)
    }

    /// The guest address the guest would resume at for `next`.
    pub(super) fn guest_rip(&self, next: Next) -> u64 {
        match next {
            Next::Guest(pc) => pc,
            // A resume at a block entry (after a ring refill).
            Next::Host(h) | Next::Resume(h) => self
                .cache
                .layouts()
                .floor(h.0)
                .map(|l| l.guest_start)
                .unwrap_or(0),
            Next::Signal => 0,
        }
    }

    /// Runs translated code from `area.jump_to` until it exits to the dispatcher.
    pub(super) fn enter(&mut self) {
        // SAFETY: `enter` is the gateway routine emitted for this ABI: it saves the host's
        // callee-saved registers, MXCSR and x87 control word, swaps in the guest's FS base and
        // state from this thread's area (GS base), and returns here, with everything restored,
        // when translated code jumps to the exit routine. The code cache is live and only this
        // thread executes it.
        let enter: extern "sysv64" fn() =
            unsafe { std::mem::transmute(self.gateway.enter.0 as usize) };
        enter();
    }

    /// Acts on the exit recorded in the area: `Ok(Ok(next))` to go on, `Ok(Err(stop))` to
    /// return to the embedder.
    pub(super) fn handle_exit(&mut self) -> Result<Result<Next, Stop>, TranslateError> {
        let code = self.area.exit_code as u32;
        match code {
            EXIT_RING_FULL => {
                self.stats.ring_refills += 1;
                Ok(Ok(Next::Resume(HostAddr(self.area.resume))))
            }
            EXIT_SIGNAL => {
                if let Some((what, at)) = self.process.signals.take_refusal() {
                    return Err(TranslateError::UnsupportedGuest { at, what });
                }
                self.correct_fault();
                // A fault inside a superblock ended its trace early: say where, in order.
                if let (Some(p), Some(m)) = (&self.producer, self.process.signals.trace_exit()) {
                    p.push(m);
                }
                Ok(Ok(Next::Signal))
            }
            EXIT_IBL_MISS => {
                self.stats.ibl_misses += 1;
                self.lookup_miss(self.area.ibl_target)
            }
            index => {
                let exit = self.index.exits[index as usize];
                match exit.kind {
                    ExitKind::Direct { target, site, .. } => {
                        let generation = self.index.generation;
                        let host = self.lookup_or_translate(target.0)?;
                        // A single-step block always comes back here.
                        if generation == self.index.generation && !self.stepping {
                            self.cache.patch_rel32(site, host);
                            self.note_link(target.0, index);
                            self.stats.links += 1;
                        }
                        Ok(Ok(Next::Host(host)))
                    }
                    ExitKind::JumpTableFill { site } => Ok(Ok(self.fill_jump_table(site)?)),
                    // A signal that arrived before the `syscall` instruction is delivered
                    // first, as on hardware; the handler returns to the instruction.
                    ExitKind::Syscall { at, .. } if self.process.signals.deliverable() => {
                        Ok(Ok(Next::Guest(at.0)))
                    }
                    ExitKind::Syscall { next, .. } => self.syscall(next.0),
                    ExitKind::SideExit { marker, target } => {
                        if let Some(p) = &self.producer {
                            p.push(marker.0);
                        }
                        Ok(Ok(Next::Guest(target.0)))
                    }
                    ExitKind::SideExitReturn { marker, at, pop } => {
                        if let Some(p) = &self.producer {
                            p.push(marker.0);
                        }
                        let rsp = self.area.gpr[thread_area::RSP];
                        let mut ret = [0u8; 8];
                        match guest_mem::read(rsp, &mut ret) {
                            Ok(()) if !special::canonical(u64::from_le_bytes(ret)) => {
                                let target = u64::from_le_bytes(ret);
                                let fault =
                                    special::noncanonical_branch(None, target, self.area, false);
                                // The `ret` itself faults, with nothing popped.
                                let fault = GuestFault { rip: at.0, ..fault };
                                self.process.signals.raise(fault);
                                Ok(Ok(Next::Signal))
                            }
                            Ok(()) => {
                                self.area.gpr[thread_area::RSP] = rsp.wrapping_add(pop as u64);
                                Ok(Ok(Next::Guest(u64::from_le_bytes(ret))))
                            }
                            // The stack went away since the compare read it: let the `ret`
                            // itself fault.
                            Err(_) => Ok(Ok(Next::Guest(at.0))),
                        }
                    }
                    ExitKind::SideExitIndirect {
                        marker,
                        at,
                        return_to,
                    } => {
                        if let Some(p) = &self.producer {
                            p.push(marker.0);
                        }
                        let target = self.area.ibl_target;
                        if !special::canonical(target) {
                            // The branch itself faults, with nothing pushed.
                            let fault =
                                special::noncanonical_branch(None, target, self.area, false);
                            self.process
                                .signals
                                .raise(GuestFault { rip: at.0, ..fault });
                            return Ok(Ok(Next::Signal));
                        }
                        if let Some(ret) = return_to {
                            let rsp = self.area.gpr[thread_area::RSP].wrapping_sub(8);
                            if guest_mem::write(rsp, &ret.0.to_le_bytes()).is_err() {
                                // The stack cannot take the return address: let the `call`
                                // itself fault.
                                return Ok(Ok(Next::Guest(at.0)));
                            }
                            self.area.gpr[thread_area::RSP] = rsp;
                        }
                        Ok(Ok(Next::Guest(target)))
                    }
                    ExitKind::Trap { kind, at, next } => self.trap(kind, at, next).map(Ok),
                }
            }
        }
    }

    /// An indirect branch to `target` that the lookup table does not hold: fault at a
    /// non-canonical target (at the branch, as the CPU does), else translate it and fill the
    /// table's slot.
    pub(super) fn lookup_miss(
        &mut self,
        target: u64,
    ) -> Result<Result<Next, Stop>, TranslateError> {
        if !special::canonical(target) {
            // The CPU faults at the branch, not at its target.
            let site = self.branch_at(self.area.ibl_site);
            let fault = special::noncanonical_branch(site, target, self.area, false);
            self.process.signals.raise(fault);
            return Ok(Ok(Next::Signal));
        }
        if target >= special::VSYSCALL_PAGE {
            return Ok(Ok(Next::Guest(target)));
        }
        let host = self.lookup_or_translate(target)?;
        self.area.fill_ibl(target, host.0);
        Ok(Ok(Next::Host(host)))
    }

    pub(super) fn trap(
        &mut self,
        kind: TrapKind,
        at: GuestAddr,
        next: GuestAddr,
    ) -> Result<Next, TranslateError> {
        if kind == TrapKind::FetchFault && self.fetchable_now(at.0) {
            // The cache was out of date when the block was decoded: the page is executable
            // now. The block ending here goes, and the guest goes on at `at` (the state is
            // that of `at`), translated again.
            self.flush();
            return Ok(Next::Guest(at.0));
        }
        if kind == TrapKind::FetchFault {
            // Cut by hotpath's own memory (its code cache, binary, heap) before the mappings
            // cut it: there the guest has nothing mapped, natively.
            let guest = guest_run(&self.process.shared, self.vdso, at.0, 15);
            if guest < self.process.maps.executable_len(at.0, 15) {
                let f = special::fetch_fault_unmapped(at.0, at.0 + guest);
                return self.act(special::Action::Raise(f));
            }
        }
        let action = special::trap(kind, at.0, next.0, &mut self.process.maps, self.area);
        if let special::Action::Refuse(text) = action {
            return Err(TranslateError::UnsupportedInstruction { at: at.0, text });
        }
        self.act(action)
    }

    /// True if the instruction at guest `at`, whose block ended in a fetch fault, can be
    /// fetched after all (its page was made executable since the thread's `MapsCache` was
    /// read): the first byte that could not be fetched (`at`, or the start of the next page
    /// when the instruction runs into it) is fetchable under fresh mappings.
    pub(super) fn fetchable_now(&mut self, at: u64) -> bool {
        let (shared, vdso) = (&self.process.shared, self.vdso);
        let maps = &mut self.process.maps;
        maps.refresh();
        let mut fetchable = |a: u64| {
            maps.executable_len(a, 1) == 1
                && guest_run(shared, vdso, a, 1) == 1
                && guest_mem::read_partial(a, &mut [0]) == 1
        };
        let first_cut = if fetchable(at) {
            hotpath_loader::page_floor(at) + hotpath_loader::PAGE_SIZE
        } else {
            at
        };
        fetchable(first_cut)
    }

    /// Carries out what [`special`] decided: raise a fault or go on at a guest address.
    pub(super) fn act(&mut self, action: special::Action) -> Result<Next, TranslateError> {
        match action {
            special::Action::Raise(fault) => {
                self.process.signals.raise(fault);
                Ok(Next::Signal)
            }
            special::Action::Continue(rip) => Ok(Next::Guest(rip)),
            special::Action::Refuse(text) => Err(TranslateError::UnsupportedInstruction {
                at: self.guest_rip(self.next),
                text,
            }),
        }
    }

    /// Puts the guest address of the last x87 instruction into the saved FPU state's FIP,
    /// where the CPU stored the host address of its translation (a signal frame shows it;
    /// the x87 exception handler of a guest reads it).
    pub(super) fn guest_fpu_ip(&mut self) {
        const FIP: usize = 8; // 64-bit FIP in the XSAVE legacy region (XSAVE64 format)
        let fip = u64::from_le_bytes(self.area.xsave.0[FIP..FIP + 8].try_into().unwrap());
        if !self.cache.contains(HostAddr(fip)) {
            return;
        }
        let guest = self.cache.layouts().floor(fip).and_then(|l| {
            let i = l.body.partition_point(|&(h, _)| h <= fip).checked_sub(1)?;
            Some(l.body[i].1)
        });
        if let Some(g) = guest {
            self.area.xsave.0[FIP..FIP + 8].copy_from_slice(&g.to_le_bytes());
        }
    }

    /// Corrects what the host fault says where the guest's instruction differs from what ran:
    ///
    /// * A guest access to memory hotpath reserved (the code cache) faults with SEGV_ACCERR
    ///   on the reservation's PROT_NONE or read-only pages; natively nothing is mapped
    ///   there: SEGV_MAPERR.
    /// * A GS-relative operand runs with a DS prefix, which 64-bit mode ignores, so a
    ///   non-canonical address based on RSP or RBP is a stack-segment fault (#SS, SIGBUS)
    ///   where the guest's GS-relative access is a #GP (SIGSEGV).
    pub(super) fn correct_fault(&mut self) {
        let cache = &self.cache;
        self.process.signals.adjust_fault(|f| {
            let reserved = cache.contains(HostAddr(f.addr));
            if f.sig == libc::SIGSEGV && f.code == special::SEGV_ACCERR && reserved {
                f.code = special::SEGV_MAPERR;
            }
            if f.sig == libc::SIGBUS
                && f.trap.trapno == special::TRAP_SS
                && special::gs_relative(f.rip)
            {
                *f = GuestFault {
                    sig: libc::SIGSEGV,
                    code: special::SI_KERNEL,
                    addr: 0,
                    trap: special::TrapDetails {
                        trapno: special::TRAP_GP,
                        err: 0,
                        ..f.trap
                    },
                    ..*f
                };
            }
        });
    }

    /// Where one single-stepped guest instruction at `next`'s guest address runs: its own
    /// one-instruction block, entered with nothing linked to it so that it comes back to the
    /// dispatcher. `Err` when the dispatcher carried the instruction out itself (`pushf`).
    pub(super) fn step_entry(
        &mut self,
        next: Next,
    ) -> Result<Result<HostAddr, Next>, TranslateError> {
        let pc = self.guest_rip_settled(next);
        if let Some(action) = special::step_here(pc, self.area) {
            return self.act(action).map(Err);
        }
        self.step_traps = special::traps_after_step(pc);
        if special::is_indirect(pc) {
            // Its lookup must miss, whatever the table holds.
            self.area.clear_ibl(self.gateway.ibl_empty.0);
        }
        if let Some(&h) = self.index.step_blocks.get(&pc) {
            return Ok(Ok(h));
        }
        self.translate_limited(pc, 1).map(Ok)
    }

    /// The guest branch whose translation holds host address `site` (a lookup miss), if any.
    pub(super) fn branch_at(&self, site: u64) -> Option<u64> {
        if site == 0 {
            return None;
        }
        let l = self.cache.layouts().floor(site)?;
        (site < l.code_end).then_some(l.term_guest)
    }
}
