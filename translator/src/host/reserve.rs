//! hotpath's memory reserve: address space kept back under a finite `RLIMIT_AS` and given up
//! when one of hotpath's own allocations fails, so that the run ends as a translator error
//! does (one line, the other threads stopped, the profile written from the reserve's room)
//! instead of Rust's `memory allocation of N bytes failed` abort.
//!
//! Under `RLIMIT_AS` the guest and hotpath share one limit. The guest's own mappings are
//! refused while they would leave less than a headroom free (`linux::syscalls`), so that
//! translation and the monitor can still allocate after the guest has taken its share; but
//! what hotpath needs grows with the code the guest runs, and a program that exhausts its
//! memory and then runs much new code can outgrow any headroom. The reserve is the part of
//! that headroom hotpath keeps mapped (`PROT_NONE`, no memory behind it): when an allocation
//! fails, it is unmapped, the allocation tried again, and [`exhausted`] tells the dispatcher to
//! end the run at its next exit. A failure with no reserve left is said in one line on
//! hotpath's stderr, and the process exits with status 1, as at a translator error, without a
//! profile. Without a finite `RLIMIT_AS` there is no reserve (a failure then comes from the
//! machine's memory, which unmapping address space does not give back), and a failure ends the
//! run the second way.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

/// Bytes of address space the reserve holds: room for the end of a run (stopping threads, the
/// monitor's last tables, the profile) once the headroom is used up.
pub const RESERVE_BYTES: usize = 16 << 20;

/// The reserve's address, 0 when there is none (not made, or given up).
static RESERVE: AtomicUsize = AtomicUsize::new(0);
/// An allocation of hotpath's failed: the reserve is given up and the run should end.
static EXHAUSTED: AtomicBool = AtomicBool::new(false);
/// How the guest ended, once it has (`ending`): the exit status, or the signal's number
/// negated; [`NOT_ENDED`] before.
static ENDING: AtomicI32 = AtomicI32::new(NOT_ENDED);
const NOT_ENDED: i32 = i32::MIN;

/// Maps the reserve if `RLIMIT_AS` is finite (once, at start, before any thread: a forked
/// child keeps its parent's, a new program's hotpath makes its own). A mapping that fails
/// leaves no reserve.
pub fn keep() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } != 0
        || r.rlim_cur == libc::RLIM_INFINITY
        || RESERVE.load(Ordering::Relaxed) != 0
    {
        return;
    }
    // SAFETY: a new private mapping with no access, placed by the kernel: it touches nothing
    // that exists.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            RESERVE_BYTES,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p != libc::MAP_FAILED {
        RESERVE.store(p as usize, Ordering::Relaxed);
    }
}

/// Bytes the reserve holds now (0 when there is none): part of the headroom the guest's
/// mappings leave hotpath.
pub fn held() -> u64 {
    if RESERVE.load(Ordering::Relaxed) != 0 {
        RESERVE_BYTES as u64
    } else {
        0
    }
}

/// Gives the reserve up and marks the process [`exhausted`]. True if there was a reserve to
/// give (the caller may try its allocation again).
pub fn release() -> bool {
    EXHAUSTED.store(true, Ordering::Relaxed);
    let p = RESERVE.swap(0, Ordering::Relaxed);
    if p == 0 {
        return false;
    }
    // SAFETY: the reserve is hotpath's own mapping, unmapped once (the swap above), and
    // nothing is ever placed in it.
    unsafe { libc::munmap(p as *mut libc::c_void, RESERVE_BYTES) };
    true
}

/// True once one of hotpath's allocations has failed: the run goes on only to its end.
pub fn exhausted() -> bool {
    EXHAUSTED.load(Ordering::Relaxed)
}

/// Records how the guest ended (exit status `Ok(code)`, or death by signal `Err(sig)`), before
/// hotpath writes its profile: if memory runs out there, the process still ends as the guest
/// did, not with hotpath's status 1.
pub fn ending(how: Result<i32, i32>) {
    ENDING.store(
        match how {
            Ok(code) => code & 0xff,
            Err(sig) => -sig,
        },
        Ordering::Relaxed,
    );
}

thread_local! {
    /// The calling thread is in [`fallibly`]: a failed allocation returns null to its caller
    /// (a `try_reserve`), the reserve untouched.
    static FALLIBLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, whose allocations are fallible ones (`Vec::try_reserve` and the like) for work
/// hotpath can do without (the translation cache's records): one that fails returns its error
/// instead of taking the reserve or ending the process. An infallible allocation in `f` that
/// fails would abort: keep `f` to the `try_` calls.
pub fn fallibly<T>(f: impl FnOnce() -> T) -> T {
    let was = FALLIBLE.with(|c| c.replace(true));
    let r = f();
    FALLIBLE.with(|c| c.set(was));
    r
}

/// The system allocator, with the reserve behind it: the process's global allocator
/// (`#[global_allocator]` in the `hotpath` program).
pub struct ReserveAllocator;

// SAFETY: every call goes to `System` with the caller's arguments; a failure is retried once
// with the same arguments after the reserve is unmapped, or ends the process.
unsafe impl GlobalAlloc for ReserveAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            return p;
        }
        // SAFETY: as above.
        retry(layout.size(), || unsafe { System.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            return p;
        }
        // SAFETY: as above.
        retry(layout.size(), || unsafe { System.alloc_zeroed(layout) })
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s; a failed realloc leaves `ptr` valid.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            return p;
        }
        // SAFETY: as above.
        retry(new_size, || unsafe {
            System.realloc(ptr, layout, new_size)
        })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// After a failed allocation of `size` bytes: null inside [`fallibly`]; else gives the reserve
/// up and tries `again`, and with no reserve, or when that fails too, ends the process.
fn retry(size: usize, again: impl FnOnce() -> *mut u8) -> *mut u8 {
    if FALLIBLE.with(|c| c.get()) {
        return std::ptr::null_mut();
    }
    if release() {
        let p = again();
        if !p.is_null() {
            return p;
        }
    }
    give_up(size)
}

/// Says that hotpath is out of memory, in one line written without allocating, and ends the
/// process: as the guest ended if it has ([`ending`]), else with status 1 (as at a translator
/// error). No profile: writing one needs memory.
fn give_up(size: usize) -> ! {
    use std::io::Write;
    let mut line = [0u8; 512];
    let mut w = std::io::Cursor::new(&mut line[..]);
    let _ = writeln!(
        w,
        "hotpath: out of memory: cannot allocate {size} bytes for hotpath's own use (no profile \
         written); under an address space limit (ulimit -v), raise it"
    );
    let n = w.position() as usize;
    crate::host::messages::write_all(&line[..n]);
    let how = ENDING.load(Ordering::Relaxed);
    if how < 0 && how != NOT_ENDED {
        // SAFETY: the signal's default action ends the process, as the guest's did; signal
        // and raise allocate nothing.
        unsafe {
            libc::signal(-how, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, -how);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(-how);
        }
    }
    let status = if how >= 0 { how } else { 1 };
    // SAFETY: ends the process at once, running nothing that could allocate.
    unsafe { libc::_exit(status) }
}
