//! What belongs to one guest thread for the emulated system calls: its signal state (mask,
//! alternate stack, pending signals), what it must invalidate, the address the kernel clears
//! when it ends. Its registers and event ring live in its
//! [`ThreadArea`](crate::host::thread_area::ThreadArea), its code in its own code cache; what every
//! thread shares is [`ProcessShared`].

use crate::linux::process::ProcessShared;
use crate::linux::signals::SignalState;
use std::path::PathBuf;

/// What the emulated calls of one guest thread reach: the process's shared state and the
/// thread's own.
pub struct GuestThread {
    /// The guest's executable, absolute (what `/proc/self/exe` shows it).
    pub exe: PathBuf,
    /// What the process's threads share (memory map, dispositions, block ids, threads).
    pub shared: std::sync::Arc<ProcessShared>,
    /// Guest ranges whose translated code must be discarded before the guest goes on (by
    /// every thread: the dispatcher publishes them).
    pub invalidate: Vec<(u64, u64)>,
    /// The thread's signal state (the process's dispositions inside).
    pub signals: SignalState,
    /// The kernel's page protections, for deciding which translated pages to watch.
    pub maps: crate::cache::smc::MapsCache,
    /// Guest address the kernel would clear and wake when the thread ends
    /// (`CLONE_CHILD_CLEARTID`, `set_tid_address`); 0 for none.
    pub clear_child_tid: u64,
    /// The thread is in seccomp strict mode, which hotpath emulates (`seccomp.rs`).
    pub seccomp_strict: bool,
}
