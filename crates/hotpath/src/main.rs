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

fn main() -> ExitCode {
    // The guest gets its descriptors as they were: a standard one that was closed is closed
    // again (`prog <&-`, `posix_spawn` with a close action), before hotpath opens anything.
    let closed = CLOSED_AT_START.load(Ordering::Relaxed);
    for fd in 0..3 {
        if closed & (1 << fd) != 0 {
            // SAFETY: the descriptor is the `/dev/null` the standard library opened on it.
            unsafe { libc::close(fd) };
        }
    }
    // Read the usable CPUs before any thread is pinned (children inherit masks).
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    match Cli::parse().command {
        Command::Run(args) => hotpath::session::run(args, &cores),
        Command::Report(args) => hotpath::report(args),
        Command::Merge(args) => hotpath::merge(args),
        Command::Bench(args) => hotpath::bench::bench(args),
        Command::Cache(args) => hotpath::cache(args),
    }
}
