//! Guest signals: emulated dispositions, hotpath's host handler, and delivery to guest handlers
//! with the frame the kernel would build.
//!
//! # How a signal reaches the guest
//!
//! The kernel's disposition of every signal the guest handles, and of every signal whose
//! default action ends the process, is hotpath's [`host_handler`] (so a profile can be written
//! before the process dies). Signals the guest ignores are `SIG_IGN` in the kernel and those
//! whose default is to ignore or stop stay `SIG_DFL`, so SIGCHLD, job control and ignored
//! signals keep their kernel semantics (and survive `execve` as they would natively). The
//! thread's kernel signal mask *is* the guest's mask: `rt_sigprocmask`, `rt_sigpending`,
//! `rt_sigsuspend` and `rt_sigtimedwait` pass through.
//!
//! * An asynchronous signal is recorded as pending and the thread is made to leave the code
//!   cache at the next block entry (DynamoRIO-style delivery at a safe point): the handler
//!   zeroes the safe-point budget that every block entry checks. A blocking system call made on
//!   the guest's behalf returns EINTR instead. The dispatcher then builds the guest's frame.
//! * A synchronous fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP raised by a guest
//!   instruction in the cache) is mapped back to the faulting guest instruction through the
//!   block's [`HostLayout`]; the guest's registers are taken from the host context, and the
//!   thread is sent out of the cache through the gateway's `exit_from_signal`.
//!
//! The frame (kernel `rt_sigframe`: return address = `sa_restorer`, `ucontext`, `siginfo`,
//! XSAVE image) goes on the guest's stack below the red zone, or on its alternate stack; the
//! guest's `rt_sigreturn` is emulated by reading that frame back, including any change the
//! handler made to it.

use std::cell::UnsafeCell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::emit::{Exit, ExitKind, HostLayout};
use crate::guest_mem;
use crate::syscalls::raw_syscall;
use crate::thread_area::{self, ThreadArea};

/// Highest signal number.
pub const NSIG: usize = 64;

/// Size of hotpath's own alternate signal stack, in bytes.
const HOST_ALTSTACK_SIZE: usize = 256 << 10;

const SIG_DFL: u64 = 0;
const SIG_IGN: u64 = 1;
const SA_SIGINFO: u64 = 4;
const SA_ONSTACK: u64 = 0x0800_0000;
const SA_RESTART: u64 = 0x1000_0000;
const SA_NODEFER: u64 = 0x4000_0000;
const SA_RESETHAND: u64 = 0x8000_0000;
const SA_RESTORER: u64 = 0x0400_0000;
const SS_ONSTACK: i32 = 1;
const SS_DISABLE: i32 = 2;
const MINSIGSTKSZ: u64 = 2048;

/// A guest `struct sigaction` as the kernel ABI has it (handler, flags, restorer, mask).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestAction {
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}

/// The guest's alternate signal stack (`stack_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AltStack {
    pub sp: u64,
    pub flags: i32,
    pub size: u64,
}

/// Instances of one real-time signal that may wait at once; more are dropped (the kernel's
/// own queue limit, RLIMIT_SIGPENDING, is usually far larger, but a guest that queues this many
/// without ever reaching a safe point is not realistic).
const RT_QUEUE: usize = 64;

/// Pending instances of one signal, oldest first.
struct SigQueue {
    len: usize,
    items: [[u8; 128]; RT_QUEUE],
}

impl Default for SigQueue {
    fn default() -> SigQueue {
        SigQueue { len: 0, items: [[0; 128]; RT_QUEUE] }
    }
}

impl SigQueue {
    /// Records an instance: standard signals keep one (they coalesce), real-time ones queue.
    fn push(&mut self, sig: i32, info: [u8; 128]) {
        if sig < libc::SIGRTMIN() {
            self.items[0] = info;
            self.len = 1;
        } else if self.len < RT_QUEUE {
            self.items[self.len] = info;
            self.len += 1;
        }
    }

    /// Takes the oldest instance.
    fn pop(&mut self) -> [u8; 128] {
        let first = self.items[0];
        if self.len > 0 {
            self.items.copy_within(1..self.len, 0);
            self.len -= 1;
        }
        first
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A fault the host handler mapped to a guest instruction, waiting for the dispatcher.
#[derive(Clone, Copy)]
struct SyncFault {
    sig: i32,
    info: [u8; 128],
    /// Guest RIP the fault is reported at.
    rip: u64,
}

/// What the host handler shares with the dispatcher. One per process (the guest has one
/// thread for now). Written by the handler on the guest thread while the dispatcher is
/// interrupted, and by the dispatcher with every signal blocked: never concurrently.
pub struct HandlerShared {
    /// Bit `sig - 1` set: an asynchronous `sig` is pending.
    pending: AtomicU64,
    /// The `siginfo` of each pending signal: one per standard signal (they coalesce, as in
    /// the kernel), a queue per real-time signal (each instance is delivered).
    infos: UnsafeCell<Box<[SigQueue; NSIG]>>,
    sync: UnsafeCell<Option<SyncFault>>,
    area: *mut ThreadArea,
    cache: (u64, u64),
    exit_from_signal: u64,
    fsgsbase: bool,
    /// Block entries have no budget check (`--no-monitor`): a pending signal unlinks every
    /// chained branch and empties the indirect branch lookup table instead, so the thread
    /// returns to the dispatcher at its next block boundary, and the links are made again,
    /// lazily, as the exits are taken.
    unlink_mode: bool,
    /// Set by the dispatcher while it changes the exit table or the code cache: the handler
    /// must not unlink then (the dispatcher checks for pending signals before it enters).
    critical: std::sync::atomic::AtomicBool,
    /// The dispatcher's exit table (`Exit` array, its length), published outside critical
    /// sections.
    exits: AtomicPtr<Exit>,
    exits_len: AtomicU64,
    /// Executable-view address + `rw_delta` = writable-view address of the same code byte.
    rw_delta: AtomicU64,
    /// Where empty indirect branch lookup slots point.
    ibl_empty: u64,
    /// Host code start → layout of every block in the cache.
    layouts: UnsafeCell<BTreeMap<u64, HostLayout>>,
}

static SHARED: AtomicPtr<HandlerShared> = AtomicPtr::new(std::ptr::null_mut());

/// Signals whose default action is to ignore them.
fn default_ignores(sig: i32) -> bool {
    matches!(sig, libc::SIGCHLD | libc::SIGCONT | libc::SIGURG | libc::SIGWINCH)
}

/// Signals whose default action is to stop the process.
fn default_stops(sig: i32) -> bool {
    matches!(sig, libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU)
}

/// Signals a faulting instruction raises.
fn is_fault_signal(sig: i32) -> bool {
    matches!(sig, libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL | libc::SIGTRAP)
}

fn kernel_sigaction(sig: i32, act: Option<&libc::sigaction>, old: Option<&mut libc::sigaction>) -> i64 {
    let a = act.map_or(0, |a| a as *const _ as u64);
    let o = old.map_or(0, |o| o as *mut _ as u64);
    // SAFETY of the pointers: both are ours or null; libc's `sigaction` struct matches the
    // glibc wrapper, so call the wrapper rather than the raw syscall.
    // SAFETY: sigaction with valid pointers.
    unsafe { libc::sigaction(sig, a as *const libc::sigaction, o as *mut libc::sigaction) as i64 }
}

/// Per-process signal state of the guest, kept by the dispatcher.
pub struct SignalState {
    /// The guest's dispositions, index = signal number.
    pub actions: [GuestAction; NSIG + 1],
    /// The guest's alternate stack.
    pub altstack: AltStack,
    /// Set by an interrupted `rt_sigsuspend`: its temporary mask, under which the pending
    /// signals are delivered (their frames restore the guest's normal mask).
    pub suspend_mask: Option<u64>,
    shared: &'static HandlerShared,
    /// Bytes of XSAVE image copied into frames.
    xsave_size: usize,
    xsave_mask: u64,
}

impl SignalState {
    /// Installs hotpath's host handler and alternate stack for the calling (guest) thread and
    /// takes over the dispositions inherited from hotpath's parent as the guest's.
    ///
    /// # Errors
    /// The OS error when the alternate stack cannot be mapped.
    pub fn install(
        area: *mut ThreadArea,
        cache: (u64, u64),
        exit_from_signal: u64,
        fsgsbase: bool,
        unlink_mode: bool,
        rw_delta: u64,
        ibl_empty: u64,
        xsave_size: usize,
        xsave_mask: u64,
    ) -> std::io::Result<SignalState> {
        let shared = Box::leak(Box::new(HandlerShared {
            pending: AtomicU64::new(0),
            infos: UnsafeCell::new(Box::new(std::array::from_fn(|_| SigQueue::default()))),
            sync: UnsafeCell::new(None),
            area,
            cache,
            exit_from_signal,
            fsgsbase,
            unlink_mode,
            critical: std::sync::atomic::AtomicBool::new(true),
            exits: AtomicPtr::new(std::ptr::null_mut()),
            exits_len: AtomicU64::new(0),
            rw_delta: AtomicU64::new(rw_delta),
            ibl_empty,
            layouts: UnsafeCell::new(BTreeMap::new()),
        }));
        SHARED.store(shared, Ordering::Release);
        install_host_altstack()?;
        let mut state = SignalState {
            actions: [GuestAction::default(); NSIG + 1],
            altstack: AltStack { sp: 0, flags: SS_DISABLE, size: 0 },
            suspend_mask: None,
            shared,
            xsave_size,
            xsave_mask,
        };
        for sig in 1..=NSIG as i32 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            // SAFETY: zeroed sigaction is a valid out-parameter.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            if kernel_sigaction(sig, None, Some(&mut old)) != 0 {
                continue;
            }
            let inherited = if old.sa_sigaction == libc::SIG_IGN { SIG_IGN } else { SIG_DFL };
            // Rust's runtime ignores SIGPIPE before main; the guest must start with the
            // default a shell gives a new program.
            let inherited = if sig == libc::SIGPIPE { SIG_DFL } else { inherited };
            state.actions[sig as usize] = GuestAction { handler: inherited, ..GuestAction::default() };
            state.apply(sig);
        }
        Ok(state)
    }

    /// The host-side record of block layouts, for mapping faults.
    ///
    /// # Safety
    /// Only the guest thread's dispatcher may call this, and only while it is not inside
    /// translated code (the host handler reads the map only for PCs inside the cache).
    pub unsafe fn layouts(&self) -> &mut BTreeMap<u64, HostLayout> {
        // SAFETY: see the function's contract.
        unsafe { &mut *self.shared.layouts.get() }
    }

    /// Sets the kernel disposition of `sig` from the guest's.
    fn apply(&self, sig: i32) {
        let g = self.actions[sig as usize];
        // SAFETY: zeroed sigaction, then filled.
        let mut k: libc::sigaction = unsafe { std::mem::zeroed() };
        match g.handler {
            SIG_IGN => k.sa_sigaction = libc::SIG_IGN,
            SIG_DFL if default_ignores(sig) || default_stops(sig) => k.sa_sigaction = libc::SIG_DFL,
            _ => {
                k.sa_sigaction = host_handler as *const () as usize;
                k.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                if g.handler != SIG_DFL && g.flags & SA_RESTART != 0 {
                    k.sa_flags |= libc::SA_RESTART;
                }
                // SAFETY: sa_mask is ours.
                unsafe { libc::sigfillset(&mut k.sa_mask) };
            }
        }
        kernel_sigaction(sig, Some(&k), None);
    }

    /// `rt_sigaction(sig, act, oact, sigsetsize)` for the guest.
    pub fn sigaction(&mut self, sig: u64, act: u64, oact: u64, setsize: u64) -> i64 {
        if setsize != 8 || sig == 0 || sig > NSIG as u64 {
            return -(libc::EINVAL as i64);
        }
        let sig = sig as i32;
        let new = if act != 0 {
            let mut raw = [0u8; 32];
            if let Err(e) = guest_mem::read(act, &mut raw) {
                return e;
            }
            let w = |i: usize| u64::from_le_bytes(raw[8 * i..8 * i + 8].try_into().unwrap());
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                return -(libc::EINVAL as i64);
            }
            Some(GuestAction { handler: w(0), flags: w(1), restorer: w(2), mask: w(3) })
        } else {
            None
        };
        if oact != 0 {
            let o = self.actions[sig as usize];
            let mut raw = Vec::with_capacity(32);
            for w in [o.handler, o.flags, o.restorer, o.mask] {
                raw.extend_from_slice(&w.to_le_bytes());
            }
            if let Err(e) = guest_mem::write(oact, &raw) {
                return e;
            }
        }
        if let Some(mut a) = new {
            // SIGKILL and SIGSTOP can never be blocked by a handler's mask.
            a.mask &= !((1 << (libc::SIGKILL - 1)) | (1 << (libc::SIGSTOP - 1)));
            self.actions[sig as usize] = a;
            self.apply(sig);
        }
        0
    }

    /// `sigaltstack(ss, old_ss)` for the guest, with its current RSP.
    pub fn sigaltstack(&mut self, ss: u64, old: u64, rsp: u64) -> i64 {
        let on = self.on_altstack(rsp);
        if old != 0 {
            let flags = if on { SS_ONSTACK } else { self.altstack.flags & SS_DISABLE };
            let mut raw = Vec::with_capacity(24);
            raw.extend_from_slice(&self.altstack.sp.to_le_bytes());
            raw.extend_from_slice(&(flags as i64).to_le_bytes());
            raw.extend_from_slice(&self.altstack.size.to_le_bytes());
            if let Err(e) = guest_mem::write(old, &raw) {
                return e;
            }
        }
        if ss != 0 {
            let mut raw = [0u8; 24];
            if let Err(e) = guest_mem::read(ss, &mut raw) {
                return e;
            }
            if on {
                return -(libc::EPERM as i64);
            }
            let sp = u64::from_le_bytes(raw[0..8].try_into().unwrap());
            let flags = i32::from_le_bytes(raw[8..12].try_into().unwrap());
            let size = u64::from_le_bytes(raw[16..24].try_into().unwrap());
            if flags & !(SS_DISABLE | SS_ONSTACK | (1 << 31)) != 0 {
                return -(libc::EINVAL as i64);
            }
            if flags & SS_DISABLE != 0 {
                self.altstack = AltStack { sp: 0, flags: SS_DISABLE, size: 0 };
            } else {
                if size < MINSIGSTKSZ {
                    return -(libc::ENOMEM as i64);
                }
                self.altstack = AltStack { sp, flags: 0, size };
            }
        }
        0
    }

    fn on_altstack(&self, rsp: u64) -> bool {
        self.altstack.flags & SS_DISABLE == 0 && rsp > self.altstack.sp && rsp <= self.altstack.sp + self.altstack.size
    }

    /// Marks the start of a dispatcher section that changes the exit table or the code cache
    /// (`critical == true`), or its end, publishing the exit table for the handler.
    pub fn set_critical(&self, critical: bool, exits: &[Exit]) {
        if !critical {
            self.shared.exits.store(exits.as_ptr() as *mut Exit, Ordering::Relaxed);
            self.shared.exits_len.store(exits.len() as u64, Ordering::Relaxed);
        }
        self.shared.critical.store(critical, Ordering::SeqCst);
    }

    /// Updates the writable view's offset (after a forked child adopted its own cache copy).
    pub fn set_rw_delta(&self, delta: u64) {
        self.shared.rw_delta.store(delta, Ordering::Relaxed);
    }

    /// True if a signal waits that the guest's current mask lets through (one load, and a
    /// system call only when something is pending).
    pub fn deliverable(&self) -> bool {
        // SAFETY: read on the guest thread outside translated code.
        if unsafe { (*self.shared.sync.get()).is_some() } {
            return true;
        }
        let pending = self.shared.pending.load(Ordering::Acquire);
        pending != 0 && pending & !self.suspend_mask.unwrap_or_else(get_mask) != 0
    }

    /// True if a signal waits for delivery (cheap: one load).
    pub fn any_pending(&self) -> bool {
        self.shared.pending.load(Ordering::Acquire) != 0 || {
            // SAFETY: read on the guest thread outside translated code.
            unsafe { (*self.shared.sync.get()).is_some() }
        }
    }

    /// Delivers pending signals to the guest, whose state is in `area` and which would resume
    /// at guest `rip`. Returns where the guest goes on, or how it ends.
    pub fn deliver(&mut self, area: &mut ThreadArea, rip: u64) -> Delivery {
        let guard = BlockAll::new();
        let mut rip = rip;
        // The mask a delivered handler's frame restores (`saved`), and the one that decides
        // what is deliverable and that the handler's mask builds on (`base`): they differ only
        // right after `rt_sigsuspend`, whose temporary mask is the one signals arrive under.
        let mut saved = guard.mask();
        let mut base = self.suspend_mask.take().unwrap_or(saved);
        // SAFETY: every signal is blocked: the handler cannot run on this thread now.
        if let Some(f) = unsafe { (*self.shared.sync.get()).take() } {
            rip = f.rip;
            let a = self.actions[f.sig as usize];
            let blocked = base & (1 << (f.sig - 1)) != 0;
            if a.handler == SIG_DFL || a.handler == SIG_IGN || blocked {
                // The kernel forces the default action of a fault that is ignored or blocked.
                return Delivery::Exit(f.sig);
            }
            match self.setup_frame(area, f.sig, &f.info, rip, saved, base) {
                Ok((new_rip, new_mask)) => {
                    rip = new_rip;
                    guard.set_mask(new_mask);
                    (saved, base) = (new_mask, new_mask);
                }
                Err(()) => return Delivery::Exit(libc::SIGSEGV),
            }
        }
        loop {
            let pending = self.shared.pending.load(Ordering::Acquire) & !base;
            if pending == 0 {
                break;
            }
            let sig = pending.trailing_zeros() as i32 + 1;
            // SAFETY: signals are blocked; the queue was written before the pending bit.
            let queue = unsafe { &mut (*self.shared.infos.get())[sig as usize - 1] };
            let info = queue.pop();
            if queue.is_empty() {
                self.shared.pending.fetch_and(!(1u64 << (sig - 1)), Ordering::AcqRel);
            }
            let a = self.actions[sig as usize];
            match a.handler {
                SIG_IGN => continue,
                SIG_DFL if default_ignores(sig) => continue,
                SIG_DFL if default_stops(sig) => {
                    raw_syscall(libc::SYS_kill as u64, &[std::process::id() as u64, libc::SIGSTOP as u64, 0, 0, 0, 0]);
                    continue;
                }
                SIG_DFL => return Delivery::Exit(sig),
                _ => match self.setup_frame(area, sig, &info, rip, saved, base) {
                    Ok((new_rip, new_mask)) => {
                        rip = new_rip;
                        guard.set_mask(new_mask);
                        (saved, base) = (new_mask, new_mask);
                    }
                    Err(()) => return Delivery::Exit(libc::SIGSEGV),
                },
            }
        }
        Delivery::Continue(rip)
    }

    /// Builds the kernel's `rt_sigframe` for `sig` on the guest's stack and points the guest
    /// at its handler; the frame restores mask `saved`, the handler runs with `base` plus its
    /// `sa_mask` (and `sig` itself unless SA_NODEFER). Returns the handler's address and mask.
    fn setup_frame(&mut self, area: &mut ThreadArea, sig: i32, info: &[u8; 128], rip: u64, saved: u64, base: u64) -> Result<(u64, u64), ()> {
        let mask = saved;
        let a = self.actions[sig as usize];
        let rsp = area.gpr[thread_area::RSP];
        let on_alt = self.on_altstack(rsp);
        let mut sp = if a.flags & SA_ONSTACK != 0 && self.altstack.flags & SS_DISABLE == 0 && !on_alt {
            self.altstack.sp + self.altstack.size
        } else {
            rsp - 128
        };
        // XSAVE image, 64-byte aligned, followed by the 4-byte FP_XSTATE_MAGIC2.
        let xsize = self.xsave_size;
        sp -= xsize as u64 + 4;
        sp &= !63;
        let fpstate = sp;
        let mut fp = area.xsave.0[..xsize].to_vec();
        fp[464..468].copy_from_slice(&0x4650_5853u32.to_le_bytes()); // FP_XSTATE_MAGIC1
        fp[468..472].copy_from_slice(&((xsize + 4) as u32).to_le_bytes()); // extended_size
        fp[472..480].copy_from_slice(&self.xsave_mask.to_le_bytes()); // xfeatures
        fp[480..484].copy_from_slice(&(xsize as u32).to_le_bytes()); // xstate_size
        fp.extend_from_slice(&0x4650_5845u32.to_le_bytes()); // FP_XSTATE_MAGIC2
        guest_mem::write(fpstate, &fp).map_err(|_| ())?;

        const FRAME: u64 = 8 + UC_SIZE as u64 + 128;
        sp = ((sp - FRAME) & !15) - 8;
        let frame = sp;
        let mut f = vec![0u8; FRAME as usize];
        let put = |f: &mut Vec<u8>, off: usize, v: u64| f[off..off + 8].copy_from_slice(&v.to_le_bytes());
        put(&mut f, 0, a.restorer);
        let uc = 8;
        put(&mut f, uc + UC_FLAGS, 1 | 2 | 4); // UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS
        put(&mut f, uc + UC_STACK, self.altstack.sp);
        let ss_flags = if on_alt { SS_ONSTACK } else { self.altstack.flags };
        f[uc + UC_STACK + 8..uc + UC_STACK + 12].copy_from_slice(&ss_flags.to_le_bytes());
        put(&mut f, uc + UC_STACK + 16, self.altstack.size);
        for (i, &slot) in SIGCONTEXT_GPR.iter().enumerate() {
            put(&mut f, uc + UC_MCONTEXT + 8 * i, area.gpr[slot]);
        }
        put(&mut f, uc + UC_MCONTEXT + MC_RIP, rip);
        put(&mut f, uc + UC_MCONTEXT + MC_EFLAGS, area.rflags);
        // cs, gs, fs, ss
        put(&mut f, uc + UC_MCONTEXT + MC_CSGSFS, 0x33 | (0x2b << 48));
        let (trapno, err) = trap_info(sig, info);
        put(&mut f, uc + UC_MCONTEXT + MC_ERR, err);
        put(&mut f, uc + UC_MCONTEXT + MC_TRAPNO, trapno);
        put(&mut f, uc + UC_MCONTEXT + MC_OLDMASK, mask);
        let si_addr = u64::from_le_bytes(info[16..24].try_into().unwrap());
        if sig == libc::SIGSEGV || sig == libc::SIGBUS {
            put(&mut f, uc + UC_MCONTEXT + MC_CR2, si_addr);
        }
        put(&mut f, uc + UC_MCONTEXT + MC_FPSTATE, fpstate);
        put(&mut f, uc + UC_SIGMASK, mask);
        f[8 + UC_SIZE..].copy_from_slice(info);
        guest_mem::write(frame, &f).map_err(|_| ())?;

        area.gpr[thread_area::RSP] = frame;
        area.gpr[thread_area::RDI] = sig as u64;
        area.gpr[thread_area::RSI] = frame + 8 + UC_SIZE as u64;
        area.gpr[thread_area::RDX] = frame + 8;
        area.gpr[thread_area::RAX] = 0;
        // The kernel clears DF, TF and RF for the handler and gives it a fresh FPU state.
        area.rflags &= !(0x400 | 0x100 | 0x10000);
        reset_xsave(area);
        let mut new_mask = base | a.mask;
        if a.flags & SA_NODEFER == 0 {
            new_mask |= 1 << (sig - 1);
        }
        if a.flags & SA_RESETHAND != 0 {
            self.actions[sig as usize] = GuestAction::default();
            self.apply(sig);
        }
        let _ = SA_SIGINFO | SA_RESTORER;
        Ok((a.handler, new_mask))
    }

    /// `rt_sigreturn` for the guest: restores the context saved in the frame at `rsp - 8`.
    /// Returns the guest RIP to resume at.
    pub fn sigreturn(&mut self, area: &mut ThreadArea) -> Result<u64, i32> {
        let frame = area.gpr[thread_area::RSP] - 8;
        let mut f = vec![0u8; 8 + UC_SIZE];
        guest_mem::read(frame, &mut f).map_err(|_| libc::SIGSEGV)?;
        let get = |off: usize| u64::from_le_bytes(f[off..off + 8].try_into().unwrap());
        let uc = 8;
        for (i, &slot) in SIGCONTEXT_GPR.iter().enumerate() {
            area.gpr[slot] = get(uc + UC_MCONTEXT + 8 * i);
        }
        let rip = get(uc + UC_MCONTEXT + MC_RIP);
        // Only the flags user code may change (the kernel's FIX_EFLAGS).
        const FIX_EFLAGS: u64 = 0x0004_0dd5 | 0x0001_0000;
        let eflags = get(uc + UC_MCONTEXT + MC_EFLAGS);
        area.rflags = (area.rflags & !FIX_EFLAGS) | (eflags & FIX_EFLAGS) | 0x2;
        let fpstate = get(uc + UC_MCONTEXT + MC_FPSTATE);
        if fpstate != 0 {
            let mut fp = vec![0u8; self.xsave_size];
            guest_mem::read(fpstate, &mut fp).map_err(|_| libc::SIGSEGV)?;
            // Keep the header's reserved bytes zero, as XRSTOR demands.
            fp[464..512].fill(0);
            area.xsave.0[..self.xsave_size].copy_from_slice(&fp);
        } else {
            reset_xsave(area);
        }
        let mask = get(uc + UC_SIGMASK) & !((1 << (libc::SIGKILL - 1)) | (1 << (libc::SIGSTOP - 1)));
        set_mask(mask);
        let ss_sp = get(uc + UC_STACK);
        let ss_flags = i32::from_le_bytes(f[uc + UC_STACK + 8..uc + UC_STACK + 12].try_into().unwrap());
        let ss_size = get(uc + UC_STACK + 16);
        if ss_flags & SS_DISABLE != 0 {
            self.altstack = AltStack { sp: 0, flags: SS_DISABLE, size: 0 };
        } else if ss_size >= MINSIGSTKSZ {
            self.altstack = AltStack { sp: ss_sp, flags: 0, size: ss_size };
        }
        Ok(rip)
    }

    /// Records a trap raised by a terminating instruction hotpath did not run (int3, ud2, hlt,
    /// unreadable code) as a synchronous fault at guest `rip`.
    pub fn raise_trap(&self, sig: i32, code: i32, addr: u64, rip: u64) {
        let mut info = [0u8; 128];
        info[0..4].copy_from_slice(&sig.to_le_bytes());
        info[8..12].copy_from_slice(&code.to_le_bytes());
        info[16..24].copy_from_slice(&addr.to_le_bytes());
        // SAFETY: on the guest thread, outside translated code; the handler never writes
        // `sync` unless the thread runs translated code.
        unsafe { *self.shared.sync.get() = Some(SyncFault { sig, info, rip }) };
    }

    /// Clears what a forked child must not inherit: pending signals (the kernel does not pass
    /// them on either).
    pub fn after_fork_child(&mut self) {
        self.shared.pending.store(0, Ordering::Release);
    }
}

/// Result of delivering signals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Go on at this guest address (a handler, or where the guest was).
    Continue(u64),
    /// The guest dies of this signal (default action).
    Exit(i32),
}

// Kernel `struct ucontext` layout on x86-64 (offsets in bytes).
const UC_FLAGS: usize = 0;
const UC_STACK: usize = 16;
const UC_MCONTEXT: usize = 40;
const UC_SIGMASK: usize = 296;
const UC_SIZE: usize = 304;
const MC_RIP: usize = 128;
const MC_EFLAGS: usize = 136;
const MC_CSGSFS: usize = 144;
const MC_ERR: usize = 152;
const MC_TRAPNO: usize = 160;
const MC_OLDMASK: usize = 168;
const MC_CR2: usize = 176;
const MC_FPSTATE: usize = 184;
/// `sigcontext` GPR order (r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp) as indices into
/// `ThreadArea::gpr` (x86 encoding order).
const SIGCONTEXT_GPR: [usize; 16] = [8, 9, 10, 11, 12, 13, 14, 15, 7, 6, 5, 3, 2, 0, 1, 4];

/// The trap number and error code the kernel reports in `sigcontext` for a signal.
fn trap_info(sig: i32, info: &[u8; 128]) -> (u64, u64) {
    let code = i32::from_le_bytes(info[8..12].try_into().unwrap());
    match sig {
        libc::SIGTRAP => (3, 0),
        libc::SIGILL => (6, 0),
        libc::SIGFPE => (0, 0),
        libc::SIGSEGV if code == 0x80 => (13, 0),
        libc::SIGSEGV => (14, 4 | 0x10),
        _ => (0, 0),
    }
}

/// Puts the guest's FPU/SSE/AVX state back to its initial state (what a handler starts with).
fn reset_xsave(area: &mut ThreadArea) {
    area.xsave.0[..1024].fill(0);
    area.xsave.0[0..2].copy_from_slice(&0x037fu16.to_le_bytes());
    area.xsave.0[24..28].copy_from_slice(&0x1f80u32.to_le_bytes());
}

fn set_mask(mask: u64) {
    raw_syscall(libc::SYS_rt_sigprocmask as u64, &[libc::SIG_SETMASK as u64, &mask as *const u64 as u64, 0, 8, 0, 0]);
}

fn get_mask() -> u64 {
    let mut old = 0u64;
    raw_syscall(libc::SYS_rt_sigprocmask as u64, &[libc::SIG_BLOCK as u64, 0, &mut old as *mut u64 as u64, 8, 0, 0]);
    old
}

/// Blocks every signal while alive, then sets the guest's mask: the one it had, or the one
/// a delivered handler runs with (`set_mask`).
struct BlockAll {
    mask: std::cell::Cell<u64>,
}

impl BlockAll {
    fn new() -> BlockAll {
        let all = !0u64;
        let mut old = 0u64;
        raw_syscall(libc::SYS_rt_sigprocmask as u64, &[libc::SIG_SETMASK as u64, &all as *const u64 as u64, &mut old as *mut u64 as u64, 8, 0, 0]);
        BlockAll { mask: std::cell::Cell::new(old) }
    }

    /// The guest's mask (restored on drop).
    fn mask(&self) -> u64 {
        self.mask.get()
    }

    fn set_mask(&self, mask: u64) {
        self.mask.set(mask);
    }
}

impl Drop for BlockAll {
    fn drop(&mut self) {
        set_mask(self.mask.get());
    }
}

/// The guest's current signal mask (the kernel's mask of this thread).
pub fn guest_mask() -> u64 {
    get_mask()
}

fn install_host_altstack() -> std::io::Result<()> {
    // SAFETY: a fresh anonymous mapping for hotpath's own signal stack.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), HOST_ALTSTACK_SIZE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let ss = libc::stack_t { ss_sp: p, ss_flags: 0, ss_size: HOST_ALTSTACK_SIZE };
    // SAFETY: `ss` describes the mapping just made.
    if unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn read_fs(fsgsbase: bool) -> u64 {
    if fsgsbase {
        let v: u64;
        // SAFETY: FSGSBASE is enabled (checked at start-up).
        unsafe { std::arch::asm!("rdfsbase {}", out(reg) v, options(nomem, nostack)) };
        v
    } else {
        let mut v = 0u64;
        raw_syscall(libc::SYS_arch_prctl as u64, &[0x1003, &mut v as *mut u64 as u64, 0, 0, 0, 0]);
        v
    }
}

fn write_fs(fsgsbase: bool, v: u64) {
    if fsgsbase {
        // SAFETY: FSGSBASE is enabled (checked at start-up); the value is a valid FS base.
        unsafe { std::arch::asm!("wrfsbase {}", in(reg) v, options(nomem, nostack)) };
    } else {
        raw_syscall(libc::SYS_arch_prctl as u64, &[0x1002, v, 0, 0, 0, 0]);
    }
}

// libc's gregs indices.
const REG_R8: usize = 0;
const REG_RDI: usize = 8;
const REG_RSI: usize = 9;
const REG_RBP: usize = 10;
const REG_RBX: usize = 11;
const REG_RDX: usize = 12;
const REG_RAX: usize = 13;
const REG_RCX: usize = 14;
const REG_RSP: usize = 15;
const REG_RIP: usize = 16;
const REG_EFL: usize = 17;

/// hotpath's handler for every signal the kernel hands it. Runs on hotpath's alternate stack
/// with every signal blocked. Allocates nothing and takes no lock.
extern "C" fn host_handler(sig: i32, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let shared = SHARED.load(Ordering::Acquire);
    if shared.is_null() {
        return;
    }
    // SAFETY: set once at start-up and never freed.
    let shared = unsafe { &*shared };
    // SAFETY: the area is never unmapped; this handler runs on the guest thread, which owns it.
    let area = unsafe { &mut *shared.area };
    // SAFETY: the kernel passes a valid ucontext and siginfo.
    let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
    let info_bytes: [u8; 128] = unsafe { std::ptr::read(info as *const [u8; 128]) };
    let gregs = &mut uc.uc_mcontext.gregs;
    let pc = gregs[REG_RIP] as u64;
    let in_cache = pc >= shared.cache.0 && pc < shared.cache.1;

    // Rust's thread-locals live behind the host FS base; translated code runs with the guest's.
    let fs = read_fs(shared.fsgsbase);
    let switched = fs != area.host_fs_base;
    if switched {
        write_fs(shared.fsgsbase, area.host_fs_base);
    }

    let si_code = i32::from_le_bytes(info_bytes[8..12].try_into().unwrap());
    let synchronous = is_fault_signal(sig) && si_code > 0;
    if synchronous {
        if in_cache {
            // SAFETY: the PC is in translated code, so the dispatcher is not touching the map.
            let layouts = unsafe { &*shared.layouts.get() };
            if let Some(rip) = capture_fault(layouts, pc, gregs, area) {
                area.fs_base = fs;
                // SAFETY: the dispatcher is interrupted; only this handler writes `sync` now.
                unsafe { *shared.sync.get() = Some(SyncFault { sig, info: info_bytes, rip }) };
                gregs[REG_RIP] = shared.exit_from_signal as i64;
                if switched {
                    write_fs(shared.fsgsbase, fs);
                }
                return;
            }
        }
        // A fault in hotpath itself: report it and let it happen again with the default
        // action, which ends the process with the same signal.
        let msg = b"hotpath: internal error: fault in hotpath's own code\n";
        raw_syscall(libc::SYS_write as u64, &[2, msg.as_ptr() as u64, msg.len() as u64, 0, 0, 0]);
        // SAFETY: zeroed sigaction with SIG_DFL.
        let mut k: libc::sigaction = unsafe { std::mem::zeroed() };
        k.sa_sigaction = libc::SIG_DFL;
        kernel_sigaction(sig, Some(&k), None);
        return;
    }

    // Asynchronous: record it and make the thread reach a safe point soon.
    // SAFETY: the dispatcher reads a slot only with every signal blocked.
    unsafe { (*shared.infos.get())[sig as usize - 1].push(sig, info_bytes) };
    shared.pending.fetch_or(1 << (sig - 1), Ordering::AcqRel);
    if shared.unlink_mode && !shared.critical.load(Ordering::SeqCst) {
        unlink_all(shared, area);
    }
    area.ring.producer.budget.store(0, Ordering::Relaxed);
    if in_cache {
        // SAFETY: as above, the PC is in translated code.
        let layouts = unsafe { &*shared.layouts.get() };
        if let Some((_, l)) = layouts.range(..=pc).next_back() {
            if pc >= l.stub_window.0 && pc < l.stub_window.1 {
                // The check was between reading and rewriting the budget: run it again from
                // the entry, with the guest's RCX back, so it sees the zero.
                gregs[REG_RCX] = area.scratch_rcx as i64;
                gregs[REG_RIP] = (l.stub_window.0 - STUB_SAVE_RCX_LEN) as i64;
            }
        }
    }
    if switched {
        write_fs(shared.fsgsbase, fs);
    }
}

/// Points every chained direct branch back at its exit stub and empties the indirect branch
/// lookup table, so that translated code returns to the dispatcher at its next block boundary.
/// Runs in the signal handler while the dispatcher is outside its critical sections.
fn unlink_all(shared: &HandlerShared, area: &mut ThreadArea) {
    let ptr = shared.exits.load(Ordering::Relaxed);
    let len = shared.exits_len.load(Ordering::Relaxed) as usize;
    let delta = shared.rw_delta.load(Ordering::Relaxed);
    if !ptr.is_null() {
        // SAFETY: published by the dispatcher, which is not changing it (not critical).
        let exits = unsafe { std::slice::from_raw_parts(ptr, len) };
        for e in exits {
            if let ExitKind::Direct { site, stub, .. } = e.kind {
                let rel = (stub.0 as i64 - (site.0 as i64 + 4)) as i32;
                // SAFETY: the site is a rel32 inside the code cache's writable view; a 4-byte
                // store, and the interrupted code reads it only after the handler returns.
                unsafe { ((site.0.wrapping_add(delta)) as *mut [u8; 4]).write_unaligned(rel.to_le_bytes()) };
            }
        }
    }
    area.clear_ibl(shared.ibl_empty);
}

/// Length in bytes of the entry's first instruction, `mov gs:[scratch_rcx], rcx`, which comes
/// right before the stub window.
const STUB_SAVE_RCX_LEN: u64 = 9;

/// Maps a fault at host `pc` back to the guest: fills the area's GPRs and RFLAGS with the
/// guest's values at the faulting instruction and returns its guest address, or `None` when
/// `pc` is not at a guest instruction (a fault in hotpath's own stubs).
fn capture_fault(layouts: &BTreeMap<u64, HostLayout>, pc: u64, gregs: &[i64; 23], area: &mut ThreadArea) -> Option<u64> {
    let (_, l) = layouts.range(..=pc).next_back()?;
    if pc >= l.code_end {
        return None;
    }
    let mut regs = [0u64; 16];
    let from_gregs = [
        (thread_area::RAX, REG_RAX),
        (thread_area::RCX, REG_RCX),
        (thread_area::RDX, REG_RDX),
        (3, REG_RBX),
        (thread_area::RSP, REG_RSP),
        (5, REG_RBP),
        (thread_area::RSI, REG_RSI),
        (thread_area::RDI, REG_RDI),
    ];
    for (slot, g) in from_gregs {
        regs[slot] = gregs[g] as u64;
    }
    for i in 0..8 {
        regs[8 + i] = gregs[REG_R8 + i] as u64;
    }
    let rip = if let Ok(i) = l.body.binary_search_by_key(&pc, |&(h, _)| h) {
        l.body[i].1
    } else if pc >= l.term_start {
        if l.rcx_borrowed_from.is_some_and(|from| pc >= from) {
            regs[thread_area::RCX] = area.scratch_rcx;
        }
        if l.push_window.is_some_and(|(a, b)| pc >= a && pc < b) {
            regs[thread_area::RSP] += 8;
        }
        l.term_guest
    } else {
        return None;
    };
    area.gpr = regs;
    area.rflags = gregs[REG_EFL] as u64;
    Some(rip)
}
