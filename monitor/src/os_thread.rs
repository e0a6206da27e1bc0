//! The monitor's host thread, made with `pthread_create` itself rather than `std::thread`: its
//! CPU is set before it first runs and it maps no memory of its own once started, so its
//! creator need not wait for it to start.
//!
//! A thread of `std::thread` maps an alternate signal stack as it starts (std's stack overflow
//! check), in the guest's mapping area: that had to happen before the guest's next
//! instruction (a mapping made later can take a hole the guest is about to map again,
//! `guest-samples/hole_reuse.S`), so hotpath waited for the thread to start, about 0.3 ms of
//! every process's start. Here the stack is mapped by `pthread_create` in the creator, the CPU
//! mask is an attribute, and the thread only sets its name before running its body.

use std::ffi::c_void;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// A running thread made by [`spawn`], whose body returns a `T`.
pub(crate) struct OsThread<T> {
    id: libc::pthread_t,
    result: Arc<Mutex<Option<T>>>,
}

/// What the new thread is handed: its body and where its result goes.
struct Start<T, F> {
    body: F,
    result: Arc<Mutex<Option<T>>>,
    name: &'static [u8],
}

/// Starts a thread named `name` (at most 15 bytes and a NUL, as the kernel keeps it) with a
/// stack of `stack` bytes (and glibc's guard page), on the CPUs of `cpus` when given (else the
/// creator's), running `body`. It inherits the creator's signal mask. A panic in `body` is
/// caught at the thread's end ([`OsThread::join`] then gives `None`).
///
/// # Errors
/// The OS error when the thread cannot be made (a process or memory limit).
pub(crate) fn spawn<T, F>(
    name: &'static [u8],
    stack: usize,
    cpus: Option<&libc::cpu_set_t>,
    body: F,
) -> std::io::Result<OsThread<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    debug_assert!(name.len() <= 16 && name.ends_with(b"\0"));
    let result = Arc::new(Mutex::new(None));
    let start = Box::into_raw(Box::new(Start {
        body,
        result: result.clone(),
        name,
    }));
    // SAFETY: the attribute object is initialised before use and destroyed after; the CPU set
    // is read for its size; `start` is handed to the thread, which owns it from then on, or
    // taken back here if the thread could not be made.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        let mut e = libc::pthread_attr_init(&mut attr);
        if e == 0 {
            e = libc::pthread_attr_setstacksize(&mut attr, stack);
        }
        if e == 0 {
            if let Some(set) = cpus {
                e = libc::pthread_attr_setaffinity_np(
                    &mut attr,
                    std::mem::size_of::<libc::cpu_set_t>(),
                    set,
                );
            }
        }
        let mut id: libc::pthread_t = 0;
        if e == 0 {
            e = libc::pthread_create(&mut id, &attr, run::<T, F>, start as *mut c_void);
        }
        libc::pthread_attr_destroy(&mut attr);
        if e != 0 {
            drop(Box::from_raw(start));
            return Err(std::io::Error::from_raw_os_error(e));
        }
        Ok(OsThread { id, result })
    }
}

/// The thread's start routine: names the thread, runs the body, keeps its result.
extern "C" fn run<T, F>(start: *mut c_void) -> *mut c_void
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    // SAFETY: `spawn` passed a leaked `Box<Start<T, F>>`, which this thread now owns.
    let start = unsafe { Box::from_raw(start as *mut Start<T, F>) };
    let Start { body, result, name } = *start;
    // SAFETY: PR_SET_NAME reads a NUL-terminated name of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
    // No unwinding out of an `extern "C"` function.
    if let Ok(r) = panic::catch_unwind(AssertUnwindSafe(body)) {
        *result.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    }
    std::ptr::null_mut()
}

impl<T> OsThread<T> {
    /// Waits for the thread to end; its body's result, `None` if it panicked.
    pub(crate) fn join(self) -> Option<T> {
        // SAFETY: the thread was created joinable and is joined once (`self` is consumed).
        unsafe { libc::pthread_join(self.id, std::ptr::null_mut()) };
        self.result.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}
