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
//!   cache at the next block boundary (DynamoRIO-style delivery at a safe point): the handler
//!   points every chained branch back at its exit stub and empties the indirect branch
//!   lookup table, so the next control transfer leaves the cache (the links are made again,
//!   lazily, as the exits are taken). A blocking system call made on
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
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::cache::code_cache::{Exit, RegionTable};
use crate::host::guest_mem;
use crate::host::syscall::raw_syscall;
use crate::host::thread_area::ThreadArea;

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

/// Empties the queues of the signals in `pending` (bit `sig - 1`; a queue holds something only
/// while its bit is set): each queue has pages of its own, still the zero page (or the
/// parent's after a `fork`) until touched, so reading or writing every `len` cost a forked
/// child or a new thread 64 page faults (about 0.1 ms).
fn clear_pending_queues(queues: &mut [SigQueue; NSIG], pending: u64) {
    for (i, q) in queues.iter_mut().enumerate() {
        if pending & (1 << i) != 0 {
            q.len = 0;
        }
    }
}

/// One queue per signal (512 KiB) in an anonymous mapping of its own, so its pages stay the
/// kernel's zero page until a signal arrives: allocated zeroed from the heap (which never
/// maps: `M_MMAP_MAX` is 0), `calloc` cleared all of it, a tenth of a `busybox true`'s
/// start-up. (Built on the stack and moved, it cost as much.)
struct Queues(memmap2::MmapMut);

impl Queues {
    /// Empty queues.
    ///
    /// # Panics
    /// If 512 KiB cannot be mapped (hotpath cannot start a thread without them).
    fn new() -> Queues {
        let map = memmap2::MmapMut::map_anon(std::mem::size_of::<[SigQueue; NSIG]>())
            .expect("mapping the signal queues");
        Queues(map)
    }
}

impl std::ops::Deref for Queues {
    type Target = [SigQueue; NSIG];
    fn deref(&self) -> &Self::Target {
        // SAFETY: the mapping is page-aligned and as large as the array; all-zero bytes (a
        // fresh mapping) are valid queues: `len` 0, no pending instance.
        unsafe { &*(self.0.as_ptr() as *const [SigQueue; NSIG]) }
    }
}

impl std::ops::DerefMut for Queues {
    fn deref_mut(&mut self) -> &mut Self::Target {
        // SAFETY: as in `deref`; `&mut self` is the only access.
        unsafe { &mut *(self.0.as_mut_ptr() as *mut [SigQueue; NSIG]) }
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

/// What the kernel records about the last trap besides `siginfo`, and shows in the
/// `sigcontext` of a signal frame: the trap number, the error code and (page faults) CR2.
/// A signal that is not a fault shows the thread's last values, as the kernel's do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapDetails {
    /// The x86 exception vector (`X86_TRAP_*`: 0 #DE, 1 #DB, 3 #BP, 6 #UD, 13 #GP, 14 #PF...).
    pub trapno: u64,
    /// The exception's error code (for #PF: bit 0 present, bit 1 write, bit 2 user, bit 4
    /// instruction fetch; for #GP: the selector or IDT entry at fault, or 0).
    pub err: u64,
    /// The faulting data address of a page fault (guest address).
    pub cr2: u64,
    /// EFLAGS.RF in the frame: set for faults (the instruction is restarted), clear for traps.
    pub rf: bool,
}

/// A guest fault raised by the dispatcher (not by a host instruction): what the kernel would
/// deliver for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestFault {
    /// The signal (SIGSEGV, SIGILL, SIGTRAP...).
    pub sig: i32,
    /// `si_code`.
    pub code: i32,
    /// `si_addr` (guest address, or 0).
    pub addr: u64,
    /// Guest RIP the guest's handler sees: the instruction for a fault, the next one for a trap.
    pub rip: u64,
    /// Trap number, error code, CR2 and RF.
    pub trap: TrapDetails,
}

/// A fault the host handler mapped to a guest instruction, waiting for the dispatcher.
#[derive(Clone, Copy)]
struct SyncFault {
    sig: i32,
    info: [u8; 128],
    /// Guest RIP the fault is reported at.
    rip: u64,
    /// Trap number, error code, CR2 and RF of the fault.
    trap: TrapDetails,
    /// The side-exit event of the superblock block it happened in (see
    /// [`HostLayout::trace_exit`](crate::cache::code_cache::HostLayout::trace_exit)).
    trace_exit: Option<u32>,
}

impl SyncFault {
    /// `rip` of a signal the kernel forced during the guest's system call: it is reported
    /// where the guest goes on after the call.
    const AFTER_SYSCALL: u64 = u64::MAX;
}

/// `si_code` of a signal sent to one thread with `tgkill` or `tkill`.
const SI_TKILL: i32 = -6;

/// `si_code` of a seccomp filter's SIGSYS (`SYS_SECCOMP`), whose `si_call_addr` (bytes 16..24
/// of the siginfo) is the address after the `syscall` instruction.
const SYS_SECCOMP: i32 = 1;

/// The `SECCOMP_RET_DATA` (SIGSYS's `si_errno`) of the `SECCOMP_RET_TRAP` that stands for a
/// guest filter's kill action (`seccomp.rs`): the guest then ends by SIGSYS, whatever its
/// disposition, after hotpath has written its report.
pub const SECCOMP_KILL_DATA: u16 = 0xdead;

/// [`HandlerShared::critical`]: nobody holds the thread's exits (it runs translated code).
const FREE: u8 = 0;
/// [`HandlerShared::critical`]: the thread's dispatcher holds them (it is outside the cache).
const OWNER: u8 = 1;
/// [`HandlerShared::critical`]: another thread, or the thread's handler, is unlinking them.
const BORROWED: u8 = 2;

/// Takes a thread's `critical` ([`HandlerShared::critical`]) from [`FREE`] to [`BORROWED`] for
/// a kick, waiting while another thread has it borrowed (its holds are short and wait on
/// nothing); false, at once, when the thread's own dispatcher holds it (the dispatcher reads
/// `kicked` before it enters the cache again, so the kick needs no unlinking).
fn borrow_for_kick(critical: &std::sync::atomic::AtomicU8) -> bool {
    loop {
        match critical.compare_exchange(FREE, BORROWED, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return true,
            Err(OWNER) => return false,
            Err(_) => std::hint::spin_loop(),
        }
    }
}

/// What the host handler shares with the dispatcher: one per guest thread, found by the
/// handler through the thread's GS base ([`ThreadArea::handler`]). Written by the handler on
/// its guest thread while the dispatcher is interrupted, and by the dispatcher with every
/// signal blocked: never concurrently. Another thread touches only the atomics (`kick`).
pub struct HandlerShared {
    /// Bit `sig - 1` set: an asynchronous `sig` is pending.
    pending: AtomicU64,
    /// The `siginfo` of each pending signal: one per standard signal (they coalesce, as in
    /// the kernel), a queue per real-time signal (each instance is delivered).
    infos: UnsafeCell<Queues>,
    sync: UnsafeCell<Option<SyncFault>>,
    area: *mut ThreadArea,
    /// The thread's code cache as the handler sees it; replaced only by the dispatcher, with
    /// every signal blocked, when the cache moves ([`SignalState::move_cache`]).
    view: UnsafeCell<CacheView>,
    fsgsbase: bool,
    /// Who holds the thread's exits ([`FREE`], [`OWNER`], [`BORROWED`]). The dispatcher holds
    /// them ([`OWNER`]) while it is outside the code cache, where it changes the exit table and
    /// the code cache: the handler must not unlink then (the dispatcher checks for pending
    /// signals and kicks before it enters). Another thread that unlinks this thread's code
    /// (`kick`, `kick_at`), or the thread's own handler for a caught write, borrows them
    /// meanwhile ([`BORROWED`], briefly), so the dispatcher waits for it on its way out of
    /// the cache, and a kick waits for it too (see [`HandlerShared::kick`]).
    critical: std::sync::atomic::AtomicU8,
    /// Set by the handler before it looks at `critical` to unlink the thread's code: a
    /// thread that held `critical` to unlink some of it (`kick_at`) looks at this after it
    /// lets go and unlinks it all, so that a signal or a store into translated code that
    /// came meanwhile still makes the thread leave the cache.
    unlink_wanted: std::sync::atomic::AtomicBool,
    /// The dispatcher's exit table (`Exit` array, its length), published outside critical
    /// sections.
    exits: AtomicPtr<Exit>,
    exits_len: AtomicU64,
    /// The dispatcher's list of linked exits (`CacheIndex::linked`: guest target, exit
    /// index), published with the exit table: its entries, where its sorted runs start, and
    /// where its unsorted tail starts (`SortedRuns::view`).
    linked: AtomicPtr<(u64, u32)>,
    linked_len: AtomicU64,
    linked_starts: AtomicPtr<usize>,
    linked_starts_len: AtomicU64,
    linked_sorted: AtomicU64,
    /// The code cache's regions: which PCs are translated code, and where each region's
    /// writable view is (replaced only by the dispatcher when the cache moves).
    regions: AtomicPtr<RegionTable>,
    /// Guest pages write-protected because code was translated from them (the process's).
    smc: std::sync::Arc<crate::cache::smc::ProtectedPages>,
    /// Set by another thread that needs this one out of the code cache (see `kick`).
    kicked: std::sync::atomic::AtomicBool,
    /// The guest address of the last write fault the handler found stale
    /// ([`crate::cache::smc::CaughtWrite::Stale`]) and how many times in a row: a store that
    /// keeps faulting there is the guest's own fault after all (a bound against a hang if a
    /// page's protection were not what the set says).
    pub(crate) stale_at: AtomicU64,
    pub(crate) stale_count: AtomicU64,
    /// Set by the handler when the guest did something hotpath refuses (it single-stepped
    /// with EFLAGS.TF): the dispatcher stops with this message instead of delivering.
    refused: UnsafeCell<Option<(&'static str, u64)>>,
}

// SAFETY: the raw pointers name the owning thread's area (mapped for the process's life); the
// cells are touched only by the owning thread (see the type's doc); the rest is atomic.
unsafe impl Sync for HandlerShared {}
unsafe impl Send for HandlerShared {}

/// What the handler needs to know of its thread's code cache.
#[derive(Clone, Copy)]
pub(super) struct CacheView {
    /// The gateway's `exit_from_signal` routine (host address).
    pub(super) exit_from_signal: u64,
    /// The layouts of every block in the cache.
    pub(super) blocks: &'static crate::cache::code_cache::BlockMap,
}

impl HandlerShared {
    /// The code cache's regions as they are now (any thread).
    pub(super) fn regions(&self) -> &'static RegionTable {
        // SAFETY: always a leaked table of this thread's current or an earlier cache (tables
        // are never freed).
        unsafe { &*self.regions.load(Ordering::Acquire) }
    }

    /// The code cache as it is now.
    ///
    /// # Safety
    /// On the owning thread: from its handler, or from its dispatcher.
    pub(super) unsafe fn view(&self) -> CacheView {
        // SAFETY: see the function's contract: the dispatcher writes it with every signal
        // blocked, so no read on this thread overlaps a write.
        unsafe { *self.view.get() }
    }

    /// From another thread: makes this thread leave the code cache at its next block
    /// boundary (it then reads the process's news: invalidations, the end of the process).
    /// If its dispatcher runs, it sees the flag before it enters the cache again; if it is in
    /// translated code, its links are undone here, as its own handler does for a signal.
    ///
    /// Where another thread has borrowed the exits (the monitor asking for a superblock,
    /// `kick_at`), this waits for it and unlinks them then: left undone, the thread ran on
    /// through its links and lookups after the kick (a write caught in another thread's
    /// handler, whose store then ran, let this one call the code the store replaced).
    pub fn kick(&self) {
        self.kicked.store(true, Ordering::SeqCst);
        if borrow_for_kick(&self.critical) {
            // SAFETY: holding `critical`, so the owner's dispatcher is not changing its exits
            // or code cache; the area lives as long as the process. The owner's translated
            // code may run meanwhile: the stores are the same the owner's handler would make.
            unlink_all(self, unsafe { &mut *self.area });
            self.critical.store(FREE, Ordering::SeqCst);
        }
    }

    /// From another thread: makes this thread come to its dispatcher the next time it goes
    /// to one of the guest addresses `targets` through a link or the lookup table (where the
    /// monitor has just asked for a superblock), so that it reads the request then instead of
    /// at its next ring refill; its other links stay. Nothing when its dispatcher is running
    /// (it reads the requests on its way back to the cache, or at its next exit).
    pub fn kick_at(&self, targets: &[u64]) {
        if self
            .critical
            .compare_exchange(FREE, BORROWED, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            // SAFETY: as in `kick`.
            unlink_into(self, unsafe { &mut *self.area }, targets);
            self.critical.store(FREE, Ordering::SeqCst);
            // The owner's handler may have found `critical` held meanwhile and left its
            // unlinking undone (it sets the flag first): do it for it, unless the owner's
            // dispatcher runs now (it looks at what the handler recorded before it goes on).
            if self.unlink_wanted.swap(false, Ordering::SeqCst)
                && self
                    .critical
                    .compare_exchange(FREE, BORROWED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                // SAFETY: as in `kick`.
                unlink_all(self, unsafe { &mut *self.area });
                self.critical.store(FREE, Ordering::SeqCst);
            }
        }
    }

    /// The handler's unlinking of this thread's code for a store it caught into a page whose
    /// code was translated, before the store runs again: the thread is in translated code, so
    /// its own dispatcher does not hold `critical`, and whoever does (the monitor asking for a
    /// superblock, `kick_at`; another thread's `kick`) lets it go soon. Waiting for it is what
    /// keeps the thread from running on through its links into the page's old translations:
    /// left to the holder (`unlink_wanted`), the links stayed until the holder's next step,
    /// and the calls between the store and it ran the code the store replaced (1 run in 10 of
    /// `jit_pages` with superblocks, a call or two each time).
    pub(super) fn unlink_for_caught_write(&self, area: &mut ThreadArea) {
        while self
            .critical
            .compare_exchange(FREE, BORROWED, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            std::hint::spin_loop();
        }
        unlink_all(self, area);
        self.critical.store(FREE, Ordering::SeqCst);
    }

    /// The handler's unlinking of this thread's code, unless its dispatcher holds `critical`
    /// (see `unlink_wanted`).
    pub(super) fn unlink_from_handler(&self, area: &mut ThreadArea) {
        self.unlink_wanted.store(true, Ordering::SeqCst);
        if self.critical.load(Ordering::SeqCst) == FREE {
            unlink_all(self, area);
        }
    }
}

mod frame;
mod handler;

#[cfg(test)]
pub(crate) use handler::fix_probe_fault;
use handler::{host_handler, unlink_all, unlink_into};

/// `rdgsbase` is usable (the handler reads the GS base with it instead of `arch_prctl`).
static FSGSBASE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The signal dispositions of the guest process, index = signal number (shared by its
/// threads, as `CLONE_SIGHAND` shares them in the kernel).
pub type Actions = std::sync::Mutex<[GuestAction; NSIG + 1]>;

/// Signals whose default action is to ignore them.
fn default_ignores(sig: i32) -> bool {
    matches!(
        sig,
        libc::SIGCHLD | libc::SIGCONT | libc::SIGURG | libc::SIGWINCH
    )
}

/// Signals whose default action is to stop the process.
fn default_stops(sig: i32) -> bool {
    matches!(
        sig,
        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
    )
}

/// Signals a faulting instruction raises.
fn is_fault_signal(sig: i32) -> bool {
    matches!(
        sig,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL | libc::SIGTRAP
    )
}

fn kernel_sigaction(
    sig: i32,
    act: Option<&libc::sigaction>,
    old: Option<&mut libc::sigaction>,
) -> i64 {
    // The raw call, not glibc's wrapper: the wrapper refuses glibc's own signals (SIGCANCEL
    // and SIGSETXID, 32 and 33), which the guest's glibc uses for its threads.
    let k = act.map(|a| {
        // SAFETY: the first 8 bytes of a sigset_t are signals 1-64.
        let mask = unsafe { *(&a.sa_mask as *const libc::sigset_t as *const u64) };
        [
            a.sa_sigaction as u64,
            a.sa_flags as u64 | SA_RESTORER,
            hotpath_signal_restorer as *const () as u64,
            mask,
        ]
    });
    let mut o = [0u64; 4];
    let r = raw_syscall(
        libc::SYS_rt_sigaction as u64,
        &[
            sig as u64,
            k.as_ref().map_or(0, |k| k.as_ptr() as u64),
            if old.is_some() {
                o.as_mut_ptr() as u64
            } else {
                0
            },
            8,
            0,
            0,
        ],
    );
    if let (Some(old), 0) = (old, r) {
        old.sa_sigaction = o[0] as usize;
        old.sa_flags = o[1] as i32;
        // SAFETY: as above.
        unsafe { *(&mut old.sa_mask as *mut libc::sigset_t as *mut u64) = o[3] };
    }
    r
}

// The return path of hotpath's host handler (the kernel's `sa_restorer`): `rt_sigreturn`.
std::arch::global_asm!(
    ".globl hotpath_signal_restorer",
    "hotpath_signal_restorer:",
    "    mov rax, 15",
    "    syscall",
    "    ud2",
);

extern "C" {
    fn hotpath_signal_restorer();
}

/// What the host handler needs to know about the translator, given once at start-up.
pub struct HandlerSetup {
    /// The guest thread's area (also its GS base).
    pub area: *mut ThreadArea,
    /// The code cache's regions.
    pub regions: &'static RegionTable,
    /// The gateway's `exit_from_signal` routine.
    pub exit_from_signal: u64,
    /// `rdfsbase`/`wrfsbase` are usable.
    pub fsgsbase: bool,
    /// The code cache's block layouts.
    pub blocks: &'static crate::cache::code_cache::BlockMap,
    /// The components the gateway saves (its XSAVE request mask).
    pub xsave_mask: u64,
}

/// One guest thread's signal state, kept by its dispatcher: the process's dispositions
/// (shared), the thread's alternate stack and its pending signals (through `shared`).
pub struct SignalState {
    /// The guest's dispositions (the process's).
    actions: std::sync::Arc<Actions>,
    /// The thread's alternate stack.
    pub altstack: AltStack,
    /// Set by an interrupted `rt_sigsuspend`: its temporary mask, under which the pending
    /// signals are delivered (their frames restore the guest's normal mask).
    pub suspend_mask: Option<u64>,
    shared: &'static HandlerShared,
    /// The components the gateway saves (its XSAVE request mask).
    xsave_mask: u64,
    /// The trap details of the last fault delivered, which the kernel shows in the frames of
    /// later signals that are not faults (its `thread.trap_nr`, `error_code`, `cr2`).
    last_trap: TrapDetails,
}

impl SignalState {
    /// Installs hotpath's host handler and alternate stack for the calling (first guest)
    /// thread and takes over the dispositions inherited from hotpath's parent as the guest's.
    ///
    /// # Errors
    /// The OS error when the alternate stack cannot be mapped.
    pub fn install(
        setup: HandlerSetup,
        smc: std::sync::Arc<crate::cache::smc::ProtectedPages>,
    ) -> std::io::Result<SignalState> {
        let actions =
            std::sync::Arc::new(std::sync::Mutex::new([GuestAction::default(); NSIG + 1]));
        let state = SignalState::for_thread(setup, actions, smc)?;
        for sig in 1..=NSIG as i32 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            // SAFETY: zeroed sigaction is a valid out-parameter.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            if kernel_sigaction(sig, None, Some(&mut old)) != 0 {
                continue;
            }
            let inherited = if old.sa_sigaction == libc::SIG_IGN {
                SIG_IGN
            } else {
                SIG_DFL
            };
            // Rust's runtime ignores SIGPIPE before main; the guest must start with the
            // default a shell gives a new program.
            let inherited = if sig == libc::SIGPIPE {
                SIG_DFL
            } else {
                inherited
            };
            state.set_action(
                sig,
                GuestAction {
                    handler: inherited,
                    ..GuestAction::default()
                },
            );
        }
        Ok(state)
    }

    /// The signal state of a new guest thread of the same process, on the calling (new host)
    /// thread: its own handler state and alternate stack, the process's dispositions
    /// (`actions`) and watched code pages (`smc`). The thread's GS base must already be its
    /// area.
    ///
    /// # Errors
    /// The OS error when the alternate stack cannot be mapped.
    pub fn for_thread(
        setup: HandlerSetup,
        actions: std::sync::Arc<Actions>,
        smc: std::sync::Arc<crate::cache::smc::ProtectedPages>,
    ) -> std::io::Result<SignalState> {
        let HandlerSetup {
            area,
            regions,
            exit_from_signal,
            fsgsbase,
            blocks,
            xsave_mask,
        } = setup;
        let shared = Box::leak(Box::new(HandlerShared {
            pending: AtomicU64::new(0),
            infos: UnsafeCell::new(Queues::new()),
            sync: UnsafeCell::new(None),
            area,
            view: UnsafeCell::new(CacheView {
                exit_from_signal,
                blocks,
            }),
            fsgsbase,
            critical: std::sync::atomic::AtomicU8::new(OWNER),
            unlink_wanted: std::sync::atomic::AtomicBool::new(false),
            exits: AtomicPtr::new(std::ptr::null_mut()),
            exits_len: AtomicU64::new(0),
            linked: AtomicPtr::new(std::ptr::null_mut()),
            linked_len: AtomicU64::new(0),
            linked_starts: AtomicPtr::new(std::ptr::null_mut()),
            linked_starts_len: AtomicU64::new(0),
            linked_sorted: AtomicU64::new(0),
            regions: AtomicPtr::new(regions as *const RegionTable as *mut RegionTable),
            smc,
            kicked: std::sync::atomic::AtomicBool::new(false),
            stale_at: AtomicU64::new(0),
            stale_count: AtomicU64::new(0),
            refused: UnsafeCell::new(None),
        }));
        FSGSBASE.store(fsgsbase, Ordering::Relaxed);
        // SAFETY: the area is this thread's, mapped for the process's life.
        unsafe { (*area).handler = shared as *const HandlerShared as u64 };
        install_host_altstack()?;
        let state = SignalState {
            actions,
            altstack: AltStack {
                sp: 0,
                flags: SS_DISABLE,
                size: 0,
            },
            suspend_mask: None,
            shared,
            xsave_mask,
            last_trap: TrapDetails::default(),
        };
        Ok(state)
    }

    /// Makes this (pooled) state a new thread's, on that thread: nothing pending, no
    /// alternate stack, hotpath's own alternate stack installed for the host thread.
    ///
    /// # Errors
    /// The OS error when the alternate stack cannot be mapped.
    pub fn reset_for_thread(&mut self) -> std::io::Result<()> {
        self.altstack = AltStack {
            sp: 0,
            flags: SS_DISABLE,
            size: 0,
        };
        self.suspend_mask = None;
        let pending = self.shared.pending.swap(0, Ordering::AcqRel);
        self.shared.kicked.store(false, Ordering::SeqCst);
        self.shared.critical.store(OWNER, Ordering::SeqCst);
        // SAFETY: the thread runs no translated code yet; nothing else reads these.
        unsafe {
            *self.shared.sync.get() = None;
            clear_pending_queues(&mut *self.shared.infos.get(), pending);
            (*self.shared.area).handler = self.shared as *const HandlerShared as u64;
            (*self.shared.area).gate_pending = 0;
        }
        install_host_altstack()
    }

    /// The guest pages write-protected to catch code that writes code (see `smc`).
    pub fn protected_pages(&self) -> &crate::cache::smc::ProtectedPages {
        &self.shared.smc
    }

    /// The guest's disposition of `sig` (1..=NSIG).
    pub fn action(&self, sig: i32) -> GuestAction {
        self.actions.lock().unwrap_or_else(|e| e.into_inner())[sig as usize]
    }

    /// The process's dispositions, for a new thread's state.
    pub fn actions(&self) -> std::sync::Arc<Actions> {
        self.actions.clone()
    }

    /// Sets the guest's disposition of `sig` and the kernel's to match.
    fn set_action(&self, sig: i32, a: GuestAction) {
        let mut all = self.actions.lock().unwrap_or_else(|e| e.into_inner());
        all[sig as usize] = a;
        apply(sig, a);
    }
}

/// Sets the kernel disposition of `sig` from the guest's `g`.
fn apply(sig: i32, g: GuestAction) {
    {
        // SAFETY: zeroed sigaction, then filled.
        let mut k: libc::sigaction = unsafe { std::mem::zeroed() };
        match g.handler {
            SIG_IGN => k.sa_sigaction = libc::SIG_IGN,
            SIG_DFL if default_ignores(sig) || default_stops(sig) => k.sa_sigaction = libc::SIG_DFL,
            _ => {
                k.sa_sigaction = host_handler as *const () as usize;
                // Never SA_RESTART in the kernel: the call must come back to the dispatcher so the
                // guest's handler runs; the dispatcher restarts it afterwards when the guest
                // asked for SA_RESTART.
                k.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                // SAFETY: sa_mask is ours.
                unsafe { libc::sigfillset(&mut k.sa_mask) };
            }
        }
        kernel_sigaction(sig, Some(&k), None);
    }
}

impl SignalState {
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
            Some(GuestAction {
                handler: w(0),
                flags: w(1),
                restorer: w(2),
                mask: w(3),
            })
        } else {
            None
        };
        if oact != 0 {
            let o = self.action(sig);
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
            self.set_action(sig, a);
        }
        0
    }

    /// `sigaltstack(ss, old_ss)` for the guest, with its current RSP.
    pub fn sigaltstack(&mut self, ss: u64, old: u64, rsp: u64) -> i64 {
        let on = self.on_altstack(rsp);
        if old != 0 {
            let flags = if on {
                SS_ONSTACK
            } else {
                self.altstack.flags & SS_DISABLE
            };
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
                self.altstack = AltStack {
                    sp: 0,
                    flags: SS_DISABLE,
                    size: 0,
                };
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
        self.altstack.flags & SS_DISABLE == 0
            && rsp > self.altstack.sp
            && rsp <= self.altstack.sp + self.altstack.size
    }

    /// Marks the start of a dispatcher section that changes the exit table or the code cache
    /// (`critical == true`; waits while another thread unlinks this one's code), or its end,
    /// publishing `index`'s exit table and list of linked exits for the handler and for other
    /// threads.
    pub(crate) fn set_critical(
        &self,
        critical: bool,
        index: &crate::cache::code_cache::CacheIndex,
    ) {
        if critical {
            while self
                .shared
                .critical
                .compare_exchange(FREE, OWNER, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                std::hint::spin_loop();
            }
        } else {
            let s = &self.shared;
            s.exits
                .store(index.exits.as_ptr() as *mut Exit, Ordering::Relaxed);
            s.exits_len
                .store(index.exits.len() as u64, Ordering::Relaxed);
            let linked = index.linked.view();
            s.linked
                .store(linked.items.as_ptr() as *mut (u64, u32), Ordering::Relaxed);
            s.linked_len
                .store(linked.items.len() as u64, Ordering::Relaxed);
            s.linked_starts
                .store(linked.starts.as_ptr() as *mut usize, Ordering::Relaxed);
            s.linked_starts_len
                .store(linked.starts.len() as u64, Ordering::Relaxed);
            s.linked_sorted
                .store(linked.sorted as u64, Ordering::Relaxed);
            s.critical.store(FREE, Ordering::SeqCst);
        }
    }

    /// True (once) if another thread asked this one to come out of the code cache (`kick`).
    pub fn take_kick(&self) -> bool {
        self.shared.kicked.load(Ordering::SeqCst)
            && self.shared.kicked.swap(false, Ordering::SeqCst)
    }

    /// True if another thread asked this one to come out of the code cache (not consumed).
    pub fn kicked(&self) -> bool {
        self.shared.kicked.load(Ordering::SeqCst)
    }

    /// This thread's handler state, for other threads to `kick` it.
    pub fn handler(&self) -> &'static HandlerShared {
        self.shared
    }

    /// Undoes every block link and empties the indirect branch lookup table now, as the
    /// handler does for a signal that arrives while translated code runs, so that the code
    /// entered next leaves the cache at its first block boundary. Call it outside a critical
    /// section (the exit table it reads is the one published by `set_critical(false, ..)`).
    pub fn unlink_now(&self, area: &mut ThreadArea) {
        unlink_all(self.shared, area);
    }

    /// Points the handler at the thread's new code cache (`setup`'s cache fields; its area
    /// and host features stay), after the dispatcher moved the cache out of the guest's way.
    /// Call with no translated code of the old cache running on this thread.
    pub fn move_cache(&self, setup: &HandlerSetup) {
        let _blocked = BlockAll::new();
        // SAFETY: every signal is blocked, so this thread's handler cannot be reading it, and
        // no other thread reads it.
        unsafe {
            *self.shared.view.get() = CacheView {
                exit_from_signal: setup.exit_from_signal,
                blocks: setup.blocks,
            }
        };
        self.shared.regions.store(
            setup.regions as *const RegionTable as *mut RegionTable,
            Ordering::Release,
        );
    }

    /// Takes the side-exit event of the superblock a fault just ended, if it happened in one
    /// (the dispatcher enqueues it before the fault is delivered).
    pub fn trace_exit(&mut self) -> Option<u32> {
        // SAFETY: on the guest thread outside translated code: the handler does not run.
        unsafe {
            (*self.shared.sync.get())
                .as_mut()
                .and_then(|f| f.trace_exit.take())
        }
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

    /// Recomputes the syscall gate's flag: set while a signal the guest's mask lets through is
    /// pending (a system call only when something is pending at all).
    pub fn refresh_gate(&self) {
        let v = if self.shared.pending.load(Ordering::Acquire) == 0 {
            0
        } else {
            self.deliverable() as u64
        };
        // SAFETY: the thread's own area; the handler writes the same field only on this thread.
        unsafe { std::ptr::write_volatile(&mut (*self.shared.area).gate_pending, v) };
    }

    /// True if the signal to be delivered next has a handler installed with SA_RESTART (an
    /// interrupted restartable call is then made again after the handler).
    pub fn next_restarts(&self) -> bool {
        let mask = self.suspend_mask.unwrap_or_else(get_mask);
        let pending = self.shared.pending.load(Ordering::Acquire) & !mask;
        if pending == 0 {
            return false;
        }
        let sig = pending.trailing_zeros() as usize + 1;
        let a = self.action(sig as i32);
        a.handler != SIG_DFL && a.handler != SIG_IGN && a.flags & SA_RESTART != 0
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
        if let Some(mut f) = unsafe { (*self.shared.sync.get()).take() } {
            let si_errno = i32::from_le_bytes(f.info[4..8].try_into().unwrap());
            let si_code = i32::from_le_bytes(f.info[8..12].try_into().unwrap());
            if f.rip == SyncFault::AFTER_SYSCALL
                && f.sig == libc::SIGSYS
                && si_code == SYS_SECCOMP
                && si_errno == SECCOMP_KILL_DATA as i32
            {
                // The guest's filter said kill: the kernel would end the process by SIGSYS.
                return Delivery::Exit(libc::SIGSYS);
            }
            if f.rip != SyncFault::AFTER_SYSCALL {
                rip = f.rip;
            } else if f.sig == libc::SIGSYS && si_code == SYS_SECCOMP {
                // The call's address is the guest's `syscall`, not hotpath's.
                f.info[16..24].copy_from_slice(&rip.to_le_bytes());
            }
            let a = self.action(f.sig);
            let blocked = base & (1 << (f.sig - 1)) != 0;
            if a.handler == SIG_DFL || a.handler == SIG_IGN || blocked {
                // The kernel forces the default action of a fault that is ignored or blocked.
                return Delivery::Exit(f.sig);
            }
            let mut trap = if f.rip == SyncFault::AFTER_SYSCALL {
                // A signal the kernel forced at a system call is no fault: its frame shows the
                // last fault's details, as a signal sent to the thread does.
                self.last_trap
            } else {
                f.trap
            };
            if trap.trapno != 14 {
                // CR2 changes only with page faults: other frames show the last one's.
                trap.cr2 = self.last_trap.cr2;
            }
            self.last_trap = TrapDetails { rf: false, ..trap };
            match self.setup_frame(area, f.sig, &f.info, rip, saved, base, trap) {
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
            let queue = unsafe { &mut (&mut *self.shared.infos.get())[sig as usize - 1] };
            let info = queue.pop();
            if queue.is_empty() {
                self.shared
                    .pending
                    .fetch_and(!(1u64 << (sig - 1)), Ordering::AcqRel);
            }
            let a = self.action(sig);
            match a.handler {
                SIG_IGN => continue,
                SIG_DFL if default_ignores(sig) => continue,
                SIG_DFL if default_stops(sig) => {
                    raw_syscall(
                        libc::SYS_kill as u64,
                        &[std::process::id() as u64, libc::SIGSTOP as u64, 0, 0, 0, 0],
                    );
                    continue;
                }
                SIG_DFL => return Delivery::Exit(sig),
                _ => match self.setup_frame(area, sig, &info, rip, saved, base, self.last_trap) {
                    Ok((new_rip, new_mask)) => {
                        rip = new_rip;
                        guard.set_mask(new_mask);
                        (saved, base) = (new_mask, new_mask);
                    }
                    Err(()) => return Delivery::Exit(libc::SIGSEGV),
                },
            }
        }
        drop(guard);
        self.refresh_gate();
        Delivery::Continue(rip)
    }

    /// Records a fault the dispatcher raises for an instruction hotpath did not run (int3,
    /// ud2, hlt, unreadable code, a jump to a non-canonical address...) as a synchronous fault.
    pub fn raise(&self, fault: GuestFault) {
        let mut info = [0u8; 128];
        info[0..4].copy_from_slice(&fault.sig.to_le_bytes());
        info[8..12].copy_from_slice(&fault.code.to_le_bytes());
        info[16..24].copy_from_slice(&fault.addr.to_le_bytes());
        // SAFETY: on the guest thread, outside translated code; the handler never writes
        // `sync` unless the thread runs translated code.
        unsafe {
            *self.shared.sync.get() = Some(SyncFault {
                sig: fault.sig,
                info,
                rip: fault.rip,
                trap: fault.trap,
                trace_exit: None,
            })
        };
    }

    /// Lets `f` correct the fault waiting for delivery (what the handler could not tell:
    /// hotpath's reservations from the guest's memory, a rewritten segment prefix).
    pub fn adjust_fault(&mut self, f: impl FnOnce(&mut GuestFault)) {
        // SAFETY: on the guest thread outside translated code: the handler does not run.
        if let Some(fault) = unsafe { (*self.shared.sync.get()).as_mut() } {
            let mut g = GuestFault {
                sig: fault.sig,
                code: i32::from_le_bytes(fault.info[8..12].try_into().unwrap()),
                addr: u64::from_le_bytes(fault.info[16..24].try_into().unwrap()),
                rip: fault.rip,
                trap: fault.trap,
            };
            f(&mut g);
            fault.sig = g.sig;
            fault.info[0..4].copy_from_slice(&g.sig.to_le_bytes());
            fault.info[8..12].copy_from_slice(&g.code.to_le_bytes());
            fault.info[16..24].copy_from_slice(&g.addr.to_le_bytes());
            fault.trap = g.trap;
        }
    }

    /// The trap details a signal that is not a fault shows now (the last fault's).
    pub fn last_trap(&self) -> TrapDetails {
        self.last_trap
    }

    /// Takes what the handler refused (the guest single-stepped with EFLAGS.TF) and the
    /// guest address it happened at (0 if unknown), if it did.
    pub fn take_refusal(&mut self) -> Option<(&'static str, u64)> {
        // SAFETY: on the guest thread outside translated code: the handler does not run.
        unsafe { (*self.shared.refused.get()).take() }
    }

    /// Gives the process back the asynchronous signals this thread took and has not
    /// delivered, for a thread that ends (call with every signal blocked, after the guest's
    /// last instruction). The kernel sends an exiting thread no more of its process's
    /// signals and leaves them to the others; hotpath's handler may have taken one for this
    /// thread while it was on its way out (in the dispatcher, at its `exit`), and dropping it
    /// there lost it: a real-time signal queued to the process while a raw `clone` thread
    /// exited was never delivered, about 5 in 2,000. Each goes back with its `siginfo`
    /// (`rt_sigqueueinfo` to this thread's own tid queues it to the process); one sent to
    /// this thread alone (`tgkill`, `SI_TKILL`) ends with it, as natively.
    pub fn requeue_to_process(&mut self, tid: u32) {
        let mut pending = self.shared.pending.swap(0, Ordering::AcqRel);
        // SAFETY: every signal is blocked (the caller's contract), so the handler, the only
        // other writer, cannot run on this thread.
        let queues = unsafe { &mut *self.shared.infos.get() };
        while pending != 0 {
            let sig = pending.trailing_zeros() as usize + 1;
            pending &= pending - 1;
            let queue = &mut queues[sig - 1];
            while !queue.is_empty() {
                let info = queue.pop();
                let code = i32::from_le_bytes(info[8..12].try_into().unwrap());
                if code != SI_TKILL {
                    raw_syscall(
                        libc::SYS_rt_sigqueueinfo as u64,
                        &[tid as u64, sig as u64, info.as_ptr() as u64, 0, 0, 0],
                    );
                }
            }
        }
        // SAFETY: as above; the gate's flag is this thread's.
        unsafe { std::ptr::write_volatile(&mut (*self.shared.area).gate_pending, 0) };
    }

    /// Clears what a forked child must not inherit: pending signals (the kernel does not pass
    /// them on either), their queued details and the gate's flag. Call with every signal
    /// blocked: one sent to the child itself must survive it.
    pub fn after_fork_child(&mut self) {
        let pending = self.shared.pending.swap(0, Ordering::AcqRel);
        // SAFETY: every signal is blocked (the caller's contract), so the handler, the only
        // other writer, cannot run on this thread.
        unsafe {
            clear_pending_queues(&mut *self.shared.infos.get(), pending);
            std::ptr::write_volatile(&mut (*self.shared.area).gate_pending, 0);
        }
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

/// Sets the calling thread's signal mask (the guest's: the kernel mask is the guest's).
pub fn set_guest_mask(mask: u64) {
    set_mask(mask);
}

/// The calling thread's signal mask.
pub fn guest_mask() -> u64 {
    get_mask()
}

/// Blocks every signal on the calling thread (one that will run no more guest code).
pub fn block_all() {
    set_mask(!0);
}

fn set_mask(mask: u64) {
    raw_syscall(
        libc::SYS_rt_sigprocmask as u64,
        &[
            libc::SIG_SETMASK as u64,
            &mask as *const u64 as u64,
            0,
            8,
            0,
            0,
        ],
    );
}

fn get_mask() -> u64 {
    let mut old = 0u64;
    raw_syscall(
        libc::SYS_rt_sigprocmask as u64,
        &[
            libc::SIG_BLOCK as u64,
            0,
            &mut old as *mut u64 as u64,
            8,
            0,
            0,
        ],
    );
    old
}

/// Blocks every signal while alive, then sets the guest's mask: the one it had, or the one
/// a delivered handler runs with (`set_mask`).
pub(crate) struct BlockAll {
    mask: std::cell::Cell<u64>,
}

impl BlockAll {
    pub(crate) fn new() -> BlockAll {
        let all = !0u64;
        let mut old = 0u64;
        raw_syscall(
            libc::SYS_rt_sigprocmask as u64,
            &[
                libc::SIG_SETMASK as u64,
                &all as *const u64 as u64,
                &mut old as *mut u64 as u64,
                8,
                0,
                0,
            ],
        );
        BlockAll {
            mask: std::cell::Cell::new(old),
        }
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

fn install_host_altstack() -> std::io::Result<()> {
    // SAFETY: a fresh anonymous mapping for hotpath's own signal stack.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            HOST_ALTSTACK_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let ss = libc::stack_t {
        ss_sp: p,
        ss_flags: 0,
        ss_size: HOST_ALTSTACK_SIZE,
    };
    // SAFETY: `ss` describes the mapping just made.
    if unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU8};
    use std::sync::Arc;

    /// A kick borrows free exits, leaves the owner's alone, and waits out another thread's
    /// borrowing instead of giving up (a kick that gave up left the thread running through
    /// its links after a caught write's store).
    #[test]
    fn a_kick_waits_for_a_borrower_but_not_for_the_owner() {
        let critical = AtomicU8::new(FREE);
        assert!(borrow_for_kick(&critical));
        assert_eq!(critical.load(Ordering::SeqCst), BORROWED);

        critical.store(OWNER, Ordering::SeqCst);
        assert!(!borrow_for_kick(&critical));
        assert_eq!(critical.load(Ordering::SeqCst), OWNER);

        // Another thread (the monitor's `kick_at`) holds them, then lets go.
        let critical = Arc::new(AtomicU8::new(BORROWED));
        let released = Arc::new(AtomicBool::new(false));
        let holder = {
            let (critical, released) = (critical.clone(), released.clone());
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                released.store(true, Ordering::SeqCst);
                critical.store(FREE, Ordering::SeqCst);
            })
        };
        assert!(borrow_for_kick(&critical), "the kick gave up on a borrower");
        assert!(released.load(Ordering::SeqCst));
        assert_eq!(critical.load(Ordering::SeqCst), BORROWED);
        holder.join().unwrap();
    }
}
