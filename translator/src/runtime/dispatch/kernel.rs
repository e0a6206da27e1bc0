//! Exits into the kernel's world: system calls, threads started and ended, fork and exec, and a
//! code cache in the way of the guest's mappings.

use super::*;

impl Translator {
    /// Performs the guest's pending `execve` (after [`Stop::Exec`]). Returns only if it
    /// failed; the guest then sees the error and `run` goes on.
    pub fn exec(&mut self) {
        if let Some(r) = self.exec_request.take() {
            let ret =
                crate::linux::exec::exec(&self.process, self.exec_wrapper.as_ref(), r.nr, &r.args);
            if ret == GATE_REFUSED {
                // A signal came before the call (while the profile was written, say): it is
                // delivered first, then the `syscall` instruction runs again, as natively.
                // Made anyway, the new image would never see it.
                self.area.gpr[thread_area::RCX] = r.rcx;
                self.area.gpr[thread_area::R11] = r.r11;
                self.next = Next::Guest(r.at);
            } else {
                self.area.gpr[thread_area::RAX] = ret as u64;
            }
        }
    }

    /// Runs the programs the guest execs under hotpath as `wrapper` says (`None`, the
    /// default: natively).
    pub fn set_exec_wrapper(&mut self, wrapper: Option<crate::linux::exec::ExecWrapper>) {
        self.exec_wrapper = wrapper;
    }

    pub(super) fn syscall(&mut self, next: u64) -> Result<Result<Next, Stop>, TranslateError> {
        self.stats.syscalls += 1;
        let g = &self.area.gpr;
        let nr = g[thread_area::RAX];
        if let Some(p) = &self.producer {
            p.push(SYSCALL_EVENT | (nr as u32 & !SYSCALL_EVENT));
        }
        if self.panic_at_syscall == Some(nr) {
            panic!("injected at system call {nr} (HOTPATH_TEST_PANIC_AT_SYSCALL)");
        }
        let g = &self.area.gpr;
        let args = [
            g[thread_area::RDI],
            g[thread_area::RSI],
            g[thread_area::RDX],
            g[thread_area::R10],
            g[thread_area::R8],
            g[thread_area::R9],
        ];
        let at = next - 2; // `syscall` is 2 bytes
        let (rcx, r11) = (
            self.area.gpr[thread_area::RCX],
            self.area.gpr[thread_area::R11],
        );
        // As the kernel's `sysret` leaves them: RCX = next RIP, R11 = RFLAGS.
        self.area.gpr[thread_area::RCX] = next;
        self.area.gpr[thread_area::R11] = self.area.rflags;
        if nr == special::SYS_URETPROBE {
            // Only the kernel's uretprobe trampoline may make it: from anywhere else the
            // kernel kills the call with SIGILL (and RAX = -1).
            self.area.gpr[thread_area::RAX] = u64::MAX;
            let last = self.process.signals.last_trap();
            self.process.signals.raise(special::uretprobe(next, last));
            return Ok(Ok(Next::Signal));
        }
        self.ctl.set_place(ThreadPlace::InSyscall);
        // Memory the call changes without a store the write fault sees (buffers in protected
        // code pages, /proc/self/mem, madvise): as the guest left it, its code discarded.
        kernel_writes::before_call(&mut self.process, nr, &args);
        // hotpath's messages keep the stderr it started with when the guest's goes.
        crate::host::messages::before_call(nr, &args);
        let mut outcome = syscalls::dispatch(&mut self.process, self.area, nr, &args);
        if matches!(outcome, Outcome::Return(r) if r == -(libc::EFAULT as i64))
            && self.process.signals.protected_pages().any()
        {
            // The fallback for calls `kernel_writes` does not know (see its module doc: a call
            // that consumed input before the copy failed loses it): the kernel may have
            // refused to write into a page hotpath write-protected to watch its code, so every
            // such page gets its protection back and the call is made again.
            let pages = self.process.signals.protected_pages().unprotect_all();
            self.process.invalidate.extend(pages);
            outcome = syscalls::dispatch(&mut self.process, self.area, nr, &args);
        }
        if self.cache_in_the_way(nr, &args, &outcome) {
            // The guest asked for memory where this thread's code cache is: the cache moves
            // away (the guest's memory is the guest's), and the call is made again.
            self.move_cache()?;
            outcome = syscalls::dispatch(&mut self.process, self.area, nr, &args);
        }
        if let Outcome::Return(ret) = outcome {
            kernel_writes::after_call(&mut self.process, nr, &args, ret);
        }
        self.ctl.set_place(ThreadPlace::Running);
        self.process.signals.refresh_gate();
        match outcome {
            Outcome::Return(GATE_REFUSED) => {
                // A signal came before the call: deliver it, then make the call again.
                self.area.gpr[thread_area::RCX] = rcx;
                self.area.gpr[thread_area::R11] = r11;
                Ok(Ok(Next::Guest(at)))
            }
            Outcome::Return(ret)
                if ret == -(libc::EINTR as i64)
                    && syscalls::is_restartable(nr)
                    && self.process.signals.next_restarts() =>
            {
                // The kernel would restart it after the handler (SA_RESTART): the handler's
                // frame returns to the `syscall` instruction with the call number in RAX.
                self.area.gpr[thread_area::RCX] = rcx;
                self.area.gpr[thread_area::R11] = r11;
                Ok(Ok(Next::Guest(at)))
            }
            Outcome::Return(ret) => {
                self.area.gpr[thread_area::RAX] = ret as u64;
                self.apply_invalidations();
                Ok(Ok(Next::Guest(next)))
            }
            Outcome::Resume(rip) => Ok(Ok(Next::Guest(rip))),
            Outcome::Exit(exit) => Ok(Err(Stop::Exit(exit))),
            Outcome::Unsupported(message) => Err(TranslateError::UnsupportedSyscall { message }),
            Outcome::Exec => {
                self.exec_request = Some(ExecRequest {
                    nr,
                    args,
                    at,
                    rcx,
                    r11,
                });
                self.next = Next::Guest(next);
                Ok(Err(Stop::Exec))
            }
            Outcome::Fork(clone) => {
                self.fork_request = Some(clone);
                self.next = Next::Guest(next);
                Ok(Err(Stop::Fork))
            }
            Outcome::Thread(clone) => {
                let ret = self.spawn_thread(clone, next);
                self.area.gpr[thread_area::RAX] = ret as u64;
                Ok(Ok(Next::Guest(next)))
            }
            Outcome::ThreadExit(code) => Ok(Err(self.exit_thread(code))),
        }
    }

    /// Starts a guest thread (`clone` with `CLONE_VM | CLONE_THREAD`) that goes on at guest
    /// `next` on a host thread of its own. Returns its tid, or a negative errno.
    pub(super) fn spawn_thread(&mut self, clone: CloneArgs, next: u64) -> i64 {
        let Some(spawner) = lock(&self.process.shared.spawner).clone() else {
            return -(libc::EAGAIN as i64);
        };
        // A thread maps memory of hotpath's own, which the guest's mappings leave room for
        // under a finite RLIMIT_AS only if its start does too: refused as the kernel refuses
        // a clone it has no memory for, so that the threads already running can still
        // translate (each thread's first translations grow hotpath's heap after its start).
        if crate::linux::syscalls::address_space_short(thread_start_bytes(self.cfg.ring_entries)) {
            return -(libc::EAGAIN as i64);
        }
        self.publish_stats();
        let mut gpr = self.area.gpr;
        gpr[thread_area::RAX] = 0;
        if clone.stack != 0 {
            gpr[thread_area::RSP] = clone.stack;
        }
        let fs_base = if clone.flags & libc::CLONE_SETTLS as u64 != 0 {
            clone.tls
        } else {
            self.area.fs_base
        };
        let (tx, rx) = crossbeam::channel::bounded(1);
        let start = ThreadStart {
            process: self.process.shared.clone(),
            cfg: self.cfg,
            gpr,
            rflags: self.area.rflags,
            fs_base,
            xsave: self.area.xsave.0[..self.host.xsave_size as usize].into(),
            rip: next,
            clone,
            mask: crate::linux::signals::guest_mask(),
            reply: tx,
            tsc_sigsegv: crate::host::cpu::tsc_sigsegv(),
        };
        if let Err(e) = spawner(start) {
            return -(e.raw_os_error().unwrap_or(libc::EAGAIN) as i64);
        }
        match rx.recv() {
            Ok(Ok(tid)) => tid as i64,
            Ok(Err(reason)) => {
                crate::host::messages::write_all(
                    format!("hotpath: cannot start a guest thread: {reason}\n").as_bytes(),
                );
                -(libc::EAGAIN as i64)
            }
            Err(_) => -(libc::EAGAIN as i64),
        }
    }

    /// This guest thread calls `exit`: the last thread ends the process with its status;
    /// any other ends alone, as the kernel ends it (the tid at `CLONE_CHILD_CLEARTID` /
    /// `set_tid_address` is cleared and woken), its ring closed and its resources kept for
    /// the next thread.
    pub(super) fn exit_thread(&mut self, code: i32) -> Stop {
        // The thread takes no more signals (the kernel gives a process's signals to its other
        // threads from here on, as it does when a thread exits); those it took and has not
        // delivered go back to the process.
        crate::linux::signals::block_all();
        self.process.signals.requeue_to_process(self.ctl.tid);
        self.publish_stats();
        let shared = self.process.shared.clone();
        let last = {
            let mut threads = lock(&shared.threads);
            let alone = threads.len() == 1;
            if !alone {
                threads.retain(|t| !Arc::ptr_eq(t, &self.ctl));
                lock(&shared.ended_stats).add(&self.stats);
                shared.smc.leave(
                    self.ctl.handler as *const crate::linux::signals::HandlerShared as *const (),
                );
            }
            alone
        };
        if last {
            return Stop::Exit(GuestExit::Exited(code));
        }
        let ctid = self.process.clear_child_tid;
        if ctid != 0 && guest_mem::write(ctid, &0u32.to_le_bytes()).is_ok() {
            const FUTEX_WAKE: u64 = 1;
            raw_syscall(libc::SYS_futex as u64, &[ctid, FUTEX_WAKE, 1, 0, 0, 0]);
        }
        if let Some(p) = &self.producer {
            p.close();
        }
        Stop::ThreadExit
    }

    /// Gives this thread's resources back to the process for the next thread (after
    /// [`Stop::ThreadExit`]; the translator is gone), with its translations: a program that
    /// starts threads one after another to run the same code translates it once, and its
    /// block ids (so the monitor's tables) stop growing with the threads it starts.
    pub fn recycle(self) {
        crate::linux::signals::block_all();
        let shared = self.process.shared.clone();
        let Translator {
            cache,
            gateway,
            area,
            process,
            index,
            jump_tables,
            ..
        } = self;
        let kept = Some(crate::linux::process::KeptTranslations { index, jump_tables });
        let signals = process.signals;
        lock(&shared.pool).push(ThreadResources {
            cache,
            gateway,
            area,
            signals,
            kept,
        });
    }

    /// Performs the guest's pending `fork` (after [`Stop::Fork`]): the child process goes on
    /// under translation with a copy of everything, and only this thread, as the kernel
    /// makes it. Every process lock is held across the fork, so none is copied held by a
    /// thread the child does not have. If the process is ending meanwhile, this thread stops
    /// instead.
    ///
    /// # Errors
    /// [`TranslateError::CodeCache`] when the code cache cannot be copied for the child.
    pub fn fork(&mut self) -> Result<Forked, TranslateError> {
        let Some(clone) = self.fork_request.take() else {
            return Ok(Forked::Parent);
        };
        let exit_signal = clone.flags & 0xff;
        build_iced_tables();
        let copy = self.cache.snapshot()?;
        let shared = self.process.shared.clone();
        let pid = {
            // No handler runs on this thread while it holds the locks (one that came would
            // find its own lock held); the guest's mask is back after.
            let _blocked = crate::linux::signals::BlockAll::new();
            let hold = shared.hold_for_fork();
            if shared.exiting.load(std::sync::atomic::Ordering::SeqCst) {
                drop(hold);
                drop(_blocked);
                self.park();
            }
            let pid = if exit_signal == libc::SIGCHLD as u64 {
                // glibc's fork resets its allocator's locks in the child, which other host
                // threads (the monitor, other guest threads) may have held.
                // SAFETY: every lock of hotpath's that the child uses is held by this thread
                // (`hold`); the child touches only state this thread owns or holds.
                unsafe { libc::fork() as i64 }
            } else {
                raw_syscall(libc::SYS_clone as u64, &[exit_signal, 0, 0, 0, 0, 0])
            };
            if pid == 0 {
                let tid = raw_syscall(libc::SYS_gettid as u64, &[0; 6]) as u32;
                let ctl = Arc::new(ThreadCtl::new(
                    tid,
                    self.process.signals.handler(),
                    self.ctl.ring,
                ));
                self.ctl = ctl.clone();
                shared.after_fork_child(hold, ctl);
                // The parent's pending signals are not the child's; this is done before the
                // guest's mask is back, so a signal sent to the child from now on stays.
                self.process.signals.after_fork_child();
            }
            pid
        };
        if pid < 0 {
            let err = if pid == -1 {
                -(std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EAGAIN) as i64)
            } else {
                pid
            };
            self.area.gpr[thread_area::RAX] = err as u64;
            return Ok(Forked::Parent);
        }
        if pid > 0 {
            if clone.flags & libc::CLONE_PARENT_SETTID as u64 != 0 {
                let _ = guest_mem::write(clone.parent_tid, &(pid as u32).to_le_bytes());
            }
            self.area.gpr[thread_area::RAX] = pid as u64;
            return Ok(Forked::Parent);
        }
        // The child: its counts start at 0 (its summary is its own work).
        self.stats = Stats::default();
        guest_mem::forget_pid();
        if clone.flags & libc::CLONE_CHILD_SETTID as u64 != 0 {
            let _ = guest_mem::write(clone.child_tid, &self.ctl.tid.to_le_bytes());
        }
        if clone.flags & libc::CLONE_SETTLS as u64 != 0 {
            self.area.fs_base = clone.tls;
        }
        if clone.stack != 0 {
            self.area.gpr[thread_area::RSP] = clone.stack;
        }
        self.area.gpr[thread_area::RAX] = 0;
        self.cache.adopt(copy)?;
        // A fresh, empty ring for the child's own monitor.
        self.area.ring.reset();
        if let Some(p) = &self.producer {
            p.reopen();
        }
        Ok(Forked::Child)
    }

    /// True if the guest's `mmap` (`nr` 9) or `brk` (12) with `args` did not get memory
    /// it would have natively, because this thread's code cache is in the requested range:
    /// `brk` growing into it, or `mmap` at a hint or a fixed address overlapping it.
    pub(super) fn cache_in_the_way(&self, nr: u64, args: &[u64; 6], outcome: &Outcome) -> bool {
        const PAGE: u64 = hotpath_loader::PAGE_SIZE;
        let overlaps = |start: u64, end: u64| self.cache.overlaps(start, end);
        let &Outcome::Return(ret) = outcome else {
            return false;
        };
        match nr {
            12 => {
                let brk = lock(&self.process.shared.memory).brk;
                let want = args[0];
                // Failed growth; the kernel also keeps a page free after the new end.
                ret as u64 != want
                    && want > brk
                    && overlaps(brk.div_ceil(PAGE) * PAGE, want.div_ceil(PAGE) * PAGE + PAGE)
            }
            9 => {
                let (addr, len) = (args[0], args[1].div_ceil(PAGE) * PAGE);
                addr != 0 && ret as u64 != addr && overlaps(addr, addr.saturating_add(len))
            }
            _ => false,
        }
    }

    /// Moves this thread's code cache to wherever the kernel finds room, flushing every
    /// translation (the guest goes on at the guest address it was going to): a new cache and
    /// gateway, the handler pointed at them, the old views unmapped. Far from the guest's
    /// image, translated code reaches its RIP-relative operands through a register
    /// (`emit::encode_at`), as other threads' caches do.
    ///
    /// # Errors
    /// [`TranslateError::CodeCache`] when the new cache cannot be mapped.
    pub(super) fn move_cache(&mut self) -> Result<(), TranslateError> {
        let mut cache = CodeCache::create_anywhere(FIRST_REGION_SIZE)?;
        let gateway = emit_gateway(&mut cache, self.host)?;
        if !matches!(self.next, Next::Signal) {
            self.next = Next::Guest(self.guest_rip_settled(self.next));
        }
        // The dispatcher holds `critical` here: no other thread unlinks this one's code.
        let setup = handler_setup(self.area, &cache, &gateway, self.host);
        self.process.signals.move_cache(&setup);
        let old = std::mem::replace(&mut self.cache, cache);
        self.gateway = gateway;
        self.note_gateway();
        self.flush();
        // SAFETY: this thread is in the dispatcher, its handler and lookup table point at the
        // new cache, and no other thread runs or links into a thread's cache.
        unsafe { old.release() };
        self.stats.cache_moves += 1;
        Ok(())
    }
}

/// What starting a guest thread maps for hotpath's own use at most, in bytes: its thread area
/// (with a ring of `ring_entries` events), its host thread's stack and the code regions a
/// thread of a dynamic program makes first (two, each mapped twice).
fn thread_start_bytes(ring_entries: u64) -> u64 {
    (ThreadArea::map_len(ring_entries) + crate::linux::process::GUEST_THREAD_HOST_STACK) as u64
        + 2 * 2 * crate::cache::code_cache::FIRST_REGION_SIZE
}
