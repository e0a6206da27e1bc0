//! `hotpath`: run an x86-64 Linux program under the dynamic binary translator and profile it
//! (see the library's root for the commands).

use std::process::ExitCode;
use std::sync::atomic::{AtomicU8, Ordering};

use clap::Parser;
use hotpath::cli::{Cli, Command};

/// Which of the standard descriptors were closed when the process started (bit `n` for
/// descriptor `n`, 0 to 2). Rust's start-up opens `/dev/null` on each closed one before `main`
/// runs, so they are read earlier, by [`note_closed_std_fds`] from `.init_array`.
static CLOSED_AT_START: AtomicU8 = AtomicU8::new(0);

/// Records which of descriptors 0, 1 and 2 are closed (run by the C runtime before the
/// standard library's own start-up).
extern "C" fn note_closed_std_fds() {
    let mut closed = 0;
    for fd in 0..3 {
        // SAFETY: F_GETFD only reads the descriptor's flags; -1 (EBADF) means it is closed.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            closed |= 1 << fd;
        }
    }
    CLOSED_AT_START.store(closed, Ordering::Relaxed);
}

#[used]
#[link_section = ".init_array"]
static NOTE_CLOSED_STD_FDS: extern "C" fn() = note_closed_std_fds;

/// Takes SIGSEGV and SIGBUS before the standard library's start-up does, so that it installs
/// no stack-overflow handler of its own (it does only for a signal whose disposition is the
/// default). With one, every thread the standard library starts maps an alternate signal
/// stack and registers itself in a process-wide table under a lock: a guest `fork` made while
/// a host thread started (a monitor, a guest thread) could give the child that lock held for
/// good, and the child hung at its first thread (`thread_cases fork`). The library still takes
/// the lock when one of its threads ends, which is why guest threads are not its threads
/// (`session::spawn_plain_thread`). hotpath replaces both dispositions with its own handler
/// anyway, and gives each guest thread an alternate stack of its own
/// ([`hotpath_translator`]'s signal state). An inherited `SIG_IGN` stays.
extern "C" fn keep_fault_signals_from_std() {
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: only reads and sets a disposition; no other thread exists yet, and the
        // handler set is async-signal-safe (it only resets the disposition).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction =
                fault_before_hotpaths_handler as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESETHAND;
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// A fault of hotpath's own before its handler is installed: the disposition is the default
/// again (`SA_RESETHAND`), so the faulting instruction, run again on return, ends the process
/// as it would have without this handler.
extern "C" fn fault_before_hotpaths_handler(_sig: libc::c_int) {}

#[used]
#[link_section = ".init_array"]
static KEEP_FAULT_SIGNALS_FROM_STD: extern "C" fn() = keep_fault_signals_from_std;

/// Makes hotpath's own large allocations (the monitor's tables, the translator's buffers) come
/// from the allocator's heaps, never from `mmap`s of their own: the guest's `mmap(NULL, ..)`
/// calls share the kernel's top-down mapping area with hotpath, and a block the monitor maps
/// and frees while the guest runs leaves a hole the guest's next mapping may fill, so where the
/// guest's memory lands would depend on the monitor's timing (ld.so's start-up allocator takes
/// a different branch when its new page happens to follow its last one: 11 cold runs in 100 of
/// a dynamic sample, none with this). Every thread of hotpath's allocates from that one
/// arena: glibc would otherwise give each new thread an arena of its own, a 64 MiB reservation
/// mapped in the guest's mapping area, which the guest's `RLIMIT_AS` pays for (a 16-thread
/// program: 416 MiB of address space per thread with them, 355 MiB without). Must run before
/// any thread starts.
fn keep_own_heap_out_of_guest_mappings() {
    // SAFETY: mallopt only sets the allocator's parameters; no thread allocates concurrently
    // yet. A failure (0) leaves glibc's defaults, which are correct, only less transparent.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// The system allocator with hotpath's reserve behind it: an allocation that fails ends the
/// run with one line (its profile written when the reserve leaves room), never Rust's abort.
#[global_allocator]
static ALLOCATOR: hotpath_translator::host::reserve::ReserveAllocator =
    hotpath_translator::host::reserve::ReserveAllocator;

fn main() -> ExitCode {
    hotpath::panics::install();
    // The guest gets its descriptors as they were: a standard one that was closed is closed
    // again (`prog <&-`, `posix_spawn` with a close action), before hotpath opens anything.
    let closed = CLOSED_AT_START.load(Ordering::Relaxed);
    for fd in 0..3 {
        if closed & (1 << fd) != 0 {
            // SAFETY: the descriptor is the `/dev/null` the standard library opened on it.
            unsafe { libc::close(fd) };
        }
    }
    keep_own_heap_out_of_guest_mappings();
    // Read the usable CPUs before any thread is pinned (children inherit masks).
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    match Cli::parse().command {
        Command::Run(args) => {
            // Before the guest's first mapping: under a finite RLIMIT_AS, room for the end of
            // a run that outgrows the headroom the guest's mappings leave hotpath.
            hotpath_translator::host::reserve::keep();
            hotpath::session::run(args, &cores)
        }
        Command::Report(args) => hotpath::report(args),
        Command::Merge(args) => hotpath::merge(args),
        Command::Bench(args) => hotpath::bench::bench(args),
        Command::Cache(args) => hotpath::cache(args),
    }
}
