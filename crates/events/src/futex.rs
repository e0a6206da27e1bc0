//! Blocking hand-overs between a ring's producer and its consumer: Linux futexes on 32-bit
//! words, and the monitor's doorbell that a producer rings when its lap is full.
//!
//! Spinning is the fast hand-over when each side has a core; on a machine with more runnable
//! threads than cores it is the slow one (each side only looks in its own scheduler slices,
//! milliseconds apart). A side that blocks on a futex the other side wakes is run at once by
//! the kernel's wake-up preemption instead.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Blocks while `*word == expected`, for at most `timeout` (or until a wake, a signal or a
/// spurious return: callers re-check their condition in a loop).
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT_PRIVATE reads the aligned 32-bit word at `word` (alive for the call)
    // and the timespec; it writes nothing of ours.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes up to `n` threads blocked in [`wait`] on `word`.
pub fn wake(word: &AtomicU32, n: u32) {
    // SAFETY: FUTEX_WAKE_PRIVATE only uses the word's address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
        );
    }
}

/// A consumer's doorbell: the word a monitor thread sleeps on when none of its rings has work,
/// rung by a producer whose lap is full (it waits for the monitor) and by whoever tells the
/// monitor to finish. One per monitor thread, shared by all its rings (each ring's
/// `ConsumerSide::bell` holds its address); its memory must outlive every ring that points to
/// it, so monitors leak theirs (4 bytes each).
///
/// Protocol (a Dekker pair, `SeqCst` on both sides): the sleeper stores 1, then looks at its
/// rings once more, then waits while the word is 1; a producer stores its full lap (cursor 0),
/// then loads the word and, if it is 1, swaps in 0 and wakes the sleeper. Either the sleeper
/// sees the full lap or the producer sees the sleeper.
#[repr(C, align(64))]
#[derive(Default)]
pub struct Doorbell {
    word: AtomicU32,
}

impl Doorbell {
    /// A doorbell nobody sleeps on, with a stable address for the rings to point to.
    pub fn leak() -> &'static Doorbell {
        Box::leak(Box::default())
    }

    /// Announces that the caller is about to sleep. Look for work once more after it, then
    /// call [`sleep`](Self::sleep) if there is none (or [`awake`](Self::awake) if there is).
    pub fn prepare(&self) {
        self.word.store(1, Ordering::SeqCst);
    }

    /// Sleeps until rung, for at most `timeout`. Call after [`prepare`](Self::prepare).
    pub fn sleep(&self, timeout: Duration) {
        wait(&self.word, 1, timeout);
        self.word.store(0, Ordering::Relaxed);
    }

    /// Withdraws a [`prepare`](Self::prepare): work turned up before the sleep.
    pub fn awake(&self) {
        self.word.store(0, Ordering::Relaxed);
    }

    /// Wakes the sleeper, if there is one (a load, and a system call only when it sleeps).
    pub fn ring(&self) {
        // The caller's last store (the full lap's cursor, or the stop flag) before this load.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.word.load(Ordering::SeqCst) == 1 && self.word.swap(0, Ordering::SeqCst) == 1 {
            wake(&self.word, 1);
        }
    }

    /// The doorbell's address, as a ring's `ConsumerSide::bell` keeps it.
    pub fn addr(&'static self) -> u64 {
        self as *const Doorbell as u64
    }
}
