//! What the guest's threads share: the memory map, the block id registry, the list of live
//! threads, code invalidations, how the process ends, and how it makes a thread (`clone`
//! arguments, the new thread's initial state, the embedder's spawner). Each guest thread has its own
//! [`Translator`](crate::Translator) (thread area, event ring, code cache, signal state); this
//! is the part they reach through an `Arc`.
//!
//! # Locks
//!
//! Every lock here is taken by dispatchers only (Rust code outside the code cache), never by
//! the host signal handler, and never while another of them is held, except `registry` inside
//! nothing else. The write-protected code pages (`smc`) have their own lock, which the handler
//! may take (see `smc`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam::channel::Sender;
use hotpath_events::{BlockCatalog, CatalogWriter, NewBlock};

use crate::cache::modules::ModuleList;
use crate::cache::smc::ProtectedPages;
use crate::host::config::{Config, Stats};
use crate::linux::signals::{Actions, HandlerShared};

/// Locks `m`, going on after a panic elsewhere (the data is plain bookkeeping).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Locks `m` if it is free.
fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Every lock of a [`ProcessShared`], held across a `fork` (see
/// [`ProcessShared::hold_for_fork`]): the child has only the forking thread, so a lock another
/// thread held at the fork would stay held in the child forever. Dropping the hold releases
/// them all, in the parent and in the child alike.
pub struct ForkHold<'a> {
    _memory: MutexGuard<'a, Memory>,
    _registry: MutexGuard<'a, Registry>,
    _actions: MutexGuard<'a, [crate::linux::signals::GuestAction; crate::linux::signals::NSIG + 1]>,
    threads: MutexGuard<'a, Vec<Arc<ThreadCtl>>>,
    _ended_stats: MutexGuard<'a, Stats>,
    _invalidations: MutexGuard<'a, Invalidations>,
    _spawner: MutexGuard<'a, Option<Spawner>>,
    pool: MutexGuard<'a, Vec<ThreadResources>>,
    mem_fds: MutexGuard<'a, std::collections::BTreeSet<i32>>,
    _code_log: MutexGuard<'a, Option<crate::cache::code_log::CodeLog>>,
    _smc: crate::cache::smc::PagesHold<'a>,
    store: Option<crate::persist::StoreHold<'a>>,
}

/// The guest's address space as hotpath tracks it.
pub struct Memory {
    /// Lowest brk value (see `hotpath_loader::Image::brk_start`).
    pub brk_start: u64,
    /// Current brk.
    pub brk: u64,
    /// Address ranges that belong to the guest (image, brk region, stacks, its mappings):
    /// start → end, disjoint and merged.
    pub guest_regions: BTreeMap<u64, u64>,
    /// The ELF images mapped into the guest.
    pub modules: ModuleList,
}

/// Block ids and their metadata: one id space for every thread, so the monitor's tables are
/// arrays indexed by id. Ids are handed out and catalogued under the lock, in order.
pub struct Registry {
    /// The next free id.
    pub next_id: u32,
    /// Appends to the catalog of every id's metadata, which the monitor reads.
    catalog: CatalogWriter,
}

impl Registry {
    /// A registry with no ids yet.
    pub fn new() -> Registry {
        Registry {
            next_id: 0,
            catalog: BlockCatalog::new().1,
        }
    }

    /// Publishes a new id's metadata, before the id can run.
    pub fn announce(&mut self, b: NewBlock) {
        self.catalog.append(b);
    }

    /// The catalog of every id so far.
    pub fn catalog(&self) -> &Arc<BlockCatalog> {
        self.catalog.catalog()
    }
}

impl Default for Registry {
    fn default() -> Registry {
        Registry::new()
    }
}

/// Where a guest thread is, for a thread that must stop the others (`exit_group`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ThreadPlace {
    /// In its dispatcher or in translated code.
    Running = 0,
    /// In a system call made for the guest (it may block; it pushes no event until it is
    /// back in the dispatcher, which then stops).
    InSyscall = 1,
    /// Stopped for good: its ring is closed.
    Parked = 2,
}

/// Stack of the host thread that runs a guest thread's dispatcher, in bytes (the guest's own
/// stack is its own): what a [`Spawner`] gives the thread it makes.
pub const GUEST_THREAD_HOST_STACK: usize = 8 << 20;

/// One live guest thread as the others see it.
pub struct ThreadCtl {
    /// Its kernel thread id (the guest's `gettid`).
    pub tid: u32,
    /// Its handler state (to send it out of the code cache).
    pub handler: &'static HandlerShared,
    /// Its event ring's control block (to close it).
    pub ring: &'static hotpath_events::RingControl,
    place: AtomicU32,
    /// Its translator's counters, published at system calls and at its end.
    pub stats: Mutex<Stats>,
}

impl ThreadCtl {
    /// A control record for a thread about to run.
    pub fn new(
        tid: u32,
        handler: &'static HandlerShared,
        ring: &'static hotpath_events::RingControl,
    ) -> ThreadCtl {
        ThreadCtl {
            tid,
            handler,
            ring,
            place: AtomicU32::new(ThreadPlace::Running as u32),
            stats: Mutex::new(Stats::default()),
        }
    }

    /// Where the thread is.
    pub fn place(&self) -> ThreadPlace {
        match self.place.load(Ordering::SeqCst) {
            1 => ThreadPlace::InSyscall,
            2 => ThreadPlace::Parked,
            _ => ThreadPlace::Running,
        }
    }

    /// Records where the thread is (by the thread itself).
    pub fn set_place(&self, p: ThreadPlace) {
        self.place.store(p as u32, Ordering::SeqCst);
    }
}

/// The arguments of a `clone`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CloneArgs {
    /// `clone` flags (the low byte is the exit signal).
    pub flags: u64,
    /// New stack pointer for the child (0: the parent's).
    pub stack: u64,
    /// Where to store the child's tid in the parent (CLONE_PARENT_SETTID).
    pub parent_tid: u64,
    /// Where to store the child's tid in the child (CLONE_CHILD_SETTID).
    pub child_tid: u64,
    /// The child's FS base (CLONE_SETTLS).
    pub tls: u64,
}

/// A new guest thread's initial state, handed to the embedder's spawner (which creates the
/// host thread and calls [`Translator::start_thread`](crate::Translator::start_thread) on it).
pub struct ThreadStart {
    pub(crate) process: Arc<ProcessShared>,
    pub(crate) cfg: Config,
    /// Guest registers: the parent's, with RAX = 0 and RSP = the new stack.
    pub(crate) gpr: [u64; 16],
    pub(crate) rflags: u64,
    pub(crate) fs_base: u64,
    /// The parent's XSAVE image (the child starts with its FPU state).
    pub(crate) xsave: Box<[u8]>,
    /// Guest address the child starts at (after the `syscall`).
    pub(crate) rip: u64,
    /// `clone` flags and the addresses they name.
    pub(crate) clone: CloneArgs,
    /// The guest's signal mask at the `clone` (the child's initial mask).
    pub(crate) mask: u64,
    /// The child sends its tid here once it can run (or the error that stopped it).
    pub(crate) reply: Sender<Result<u32, String>>,
    /// The creator's time-stamp counter mode (`PR_SET_TSC`), which the child inherits.
    pub(crate) tsc_sigsegv: bool,
}

/// Creates a host thread for a new guest thread (given by the embedder).
pub type Spawner = Arc<dyn Fn(ThreadStart) -> std::io::Result<()> + Send + Sync>;

/// The part of the guest process every thread reaches.
pub struct ProcessShared {
    /// The guest's executable, absolute (what `/proc/self/exe` shows it).
    pub exe: PathBuf,
    /// The guest's address space.
    pub memory: Mutex<Memory>,
    /// Block ids and metadata.
    pub registry: Mutex<Registry>,
    /// Pages write-protected because code was translated from them.
    pub smc: Arc<ProtectedPages>,
    /// The signal dispositions.
    pub actions: Arc<Actions>,
    /// The live guest threads.
    pub threads: Mutex<Vec<Arc<ThreadCtl>>>,
    /// Counters of threads that ended.
    pub ended_stats: Mutex<Stats>,
    /// Set when one thread ends the process (`exit_group`, a fatal signal, `execve`): the
    /// others stop at their next dispatcher entry.
    pub exiting: AtomicBool,
    /// Guest ranges whose translations every thread must discard, in order (each thread keeps
    /// how far it has applied them), and the guest pages translations were made from.
    invalidations: Mutex<Invalidations>,
    invalidation_count: AtomicU64,
    /// Creates host threads for new guest threads (the embedder's).
    pub spawner: Mutex<Option<Spawner>>,
    /// Reusable per-thread resources of threads that ended.
    pub pool: Mutex<Vec<ThreadResources>>,
    /// Threads started so far (the first included).
    pub threads_started: AtomicU32,
    /// The guest's file descriptors open on its own memory file (`/proc/self/mem` and its
    /// other names), through which a write changes code without a fault; kept by
    /// `kernel_writes` (threads share their descriptor table).
    pub mem_fds: Mutex<std::collections::BTreeSet<i32>>,
    /// Where translated code was put, for host profilers (`None`: not asked for).
    pub code_log: Mutex<Option<crate::cache::code_log::CodeLog>>,
    /// The persisted translations this process reads and adds to (unset: no cache).
    pub store: std::sync::OnceLock<Arc<crate::persist::Store>>,
}

/// The process's code invalidations and the pages they concern.
#[derive(Default)]
pub struct Invalidations {
    /// Guest ranges whose translations every thread must discard, in order.
    ranges: Vec<(u64, u64)>,
    /// Guest pages (page numbers) some thread made a translation from, or read a constant of
    /// one from: a change elsewhere concerns no translation.
    code_pages: std::collections::BTreeSet<u64>,
}

impl ProcessShared {
    /// A process with one (not yet registered) thread.
    pub fn new(
        exe: PathBuf,
        memory: Memory,
        smc: Arc<ProtectedPages>,
        actions: Arc<Actions>,
    ) -> ProcessShared {
        ProcessShared {
            exe,
            memory: Mutex::new(memory),
            registry: Mutex::new(Registry::new()),
            smc,
            actions,
            threads: Mutex::new(Vec::new()),
            ended_stats: Mutex::new(Stats::default()),
            exiting: AtomicBool::new(false),
            invalidations: Mutex::new(Invalidations::default()),
            invalidation_count: AtomicU64::new(0),
            spawner: Mutex::new(None),
            pool: Mutex::new(Vec::new()),
            threads_started: AtomicU32::new(0),
            mem_fds: Mutex::new(std::collections::BTreeSet::new()),
            code_log: Mutex::new(None),
            store: Default::default(),
        }
    }

    /// Takes every lock of the process, for a `fork` (the `pthread_atfork` rule). The locks
    /// are taken all or none, and the attempt is repeated until it succeeds, so the order
    /// other threads take them in does not matter; none of them is held for long.
    pub fn hold_for_fork(&self) -> ForkHold<'_> {
        loop {
            if let Some(hold) = self.try_hold_for_fork() {
                return hold;
            }
            std::thread::yield_now();
        }
    }

    /// Takes an ended thread's resources for a new thread, if the pool has any it may use:
    /// with the monitor on (`enqueue`), only those whose ring the monitor has let go of.
    /// Resources that keep translations are preferred, and worth a wait of up to
    /// [`POOL_WAIT`] for the monitor to drain and let go of a ring the last thread closed
    /// just now: the monitor naps up to a millisecond when idle, and a new thread that
    /// misses them translates everything it runs again (5 µs a block) in a code cache
    /// that then stays in the pool. `None` when nothing fits (the caller maps new ones).
    pub(crate) fn take_pooled(&self, enqueue: bool) -> Option<ThreadResources> {
        let started = std::time::Instant::now();
        loop {
            let mut pool = lock(&self.pool);
            let usable = |r: &ThreadResources| !enqueue || r.area.ring.is_released();
            let kept = |r: &ThreadResources| r.kept.is_some();
            let with_translations = pool.iter().position(|r| usable(r) && kept(r));
            let awaited = pool.iter().any(|r| kept(r) && !usable(r));
            if with_translations.is_some() || !awaited || started.elapsed() >= POOL_WAIT {
                let pick = with_translations.or_else(|| pool.iter().position(usable));
                return pick.map(|i| pool.swap_remove(i));
            }
            drop(pool);
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }

    fn try_hold_for_fork(&self) -> Option<ForkHold<'_>> {
        Some(ForkHold {
            _memory: try_lock(&self.memory)?,
            _registry: try_lock(&self.registry)?,
            _actions: try_lock(&self.actions)?,
            threads: try_lock(&self.threads)?,
            _ended_stats: try_lock(&self.ended_stats)?,
            _invalidations: try_lock(&self.invalidations)?,
            _spawner: try_lock(&self.spawner)?,
            pool: try_lock(&self.pool)?,
            mem_fds: try_lock(&self.mem_fds)?,
            _code_log: try_lock(&self.code_log)?,
            _smc: self.smc.try_hold()?,
            store: match self.store.get() {
                Some(s) => Some(s.try_hold()?),
                None => None,
            },
        })
    }

    /// In the child of a `fork` made under `hold` by the thread `me`, now the child's only
    /// thread (as the kernel makes it): the other threads are forgotten, and so are the pooled
    /// resources of ended ones (their code caches are memfds the parent still shares). Then
    /// every lock is released.
    pub fn after_fork_child(&self, mut hold: ForkHold<'_>, me: Arc<ThreadCtl>) {
        self.smc
            .after_fork_child(me.handler as *const HandlerShared as *const ());
        *hold.threads = vec![me];
        // No Drop of theirs unmaps anything: the parent's mappings stay as they are.
        hold.pool.clear();
        // The child's descriptors on `/proc/self/mem` show its parent's memory, not its own.
        hold.mem_fds.clear();
        // What the parent translated before the fork is the parent's to write.
        if let Some(store) = &mut hold.store {
            store.forget_pending();
        }
        self.exiting.store(false, Ordering::SeqCst);
        self.threads_started.store(1, Ordering::SeqCst);
        drop(hold);
    }

    /// Publishes `ranges` for every thread to discard (and to read its mappings again
    /// there), and sends the other live threads out of the code cache so they do before
    /// running more translated code, if a range holds a page any thread made a translation
    /// from ([`Self::note_code_pages`]). `me` is the caller.
    ///
    /// A range no translation was made from needs no kick: the other threads apply it at
    /// their next dispatcher entry, before they translate anything. (A new thread's stack
    /// mapped, its guard page protected, an ended thread's stack given back: each kick undid
    /// every link of every other thread, and a python3 program starting 200 threads one after
    /// another spent most of its time linking its main thread's code again.) A thread that
    /// notes a page after the check reads it after the system call that changed it.
    pub fn publish_invalidations(&self, ranges: &[(u64, u64)], me: u32) {
        if ranges.is_empty() {
            return;
        }
        let holds_code = {
            let mut log = lock(&self.invalidations);
            log.ranges.extend_from_slice(ranges);
            self.invalidation_count
                .store(log.ranges.len() as u64, Ordering::SeqCst);
            ranges.iter().any(|&(s, e)| {
                s < e
                    && log
                        .code_pages
                        .range(s / hotpath_loader::PAGE_SIZE..=(e - 1) / hotpath_loader::PAGE_SIZE)
                        .next()
                        .is_some()
            })
        };
        if !holds_code {
            return;
        }
        for t in lock(&self.threads).iter().filter(|t| t.tid != me) {
            t.handler.kick();
        }
    }

    /// Notes that a translation is about to be made from the guest pages `first..=last`
    /// (page numbers: addresses divided by the page size), before their bytes are read.
    pub fn note_code_pages(&self, first: u64, last: u64) {
        let mut log = lock(&self.invalidations);
        log.code_pages.extend(first..=last);
    }

    /// The invalidations published after the first `seen`, and the new count.
    pub fn invalidations_since(&self, seen: u64) -> Option<(Vec<(u64, u64)>, u64)> {
        if self.invalidation_count.load(Ordering::SeqCst) == seen {
            return None;
        }
        let log = lock(&self.invalidations);
        Some((
            log.ranges[seen as usize..].to_vec(),
            log.ranges.len() as u64,
        ))
    }

    /// The number of invalidations published so far.
    pub fn invalidation_count(&self) -> u64 {
        self.invalidation_count.load(Ordering::SeqCst)
    }

    /// Sum of the translator counters of every thread, ended and live.
    pub fn stats(&self) -> Stats {
        let mut s = *lock(&self.ended_stats);
        for t in lock(&self.threads).iter() {
            s.add(&lock(&t.stats));
        }
        s
    }

    /// Stops every live thread but `me`: marks the process as ending, sends the threads in
    /// translated code out of it, and waits (at most `STOP_WAIT`) until each is parked or in
    /// a system call; then closes every ring but the caller's, so the monitor can finish.
    /// Returns the tids that did not stop in time (they may still add events).
    pub fn stop_others(&self, me: u32) -> Vec<u32> {
        self.exiting.store(true, Ordering::SeqCst);
        let others: Vec<Arc<ThreadCtl>> = lock(&self.threads)
            .iter()
            .filter(|t| t.tid != me)
            .cloned()
            .collect();
        for t in &others {
            t.handler.kick();
        }
        let started = std::time::Instant::now();
        let mut late = Vec::new();
        for t in &others {
            while t.place() == ThreadPlace::Running {
                if started.elapsed() > STOP_WAIT {
                    late.push(t.tid);
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            t.ring.close();
        }
        late
    }
}

/// How long `exit_group` waits for the other threads to reach a stop before it writes the
/// profile anyway.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Longest a new thread waits for the monitor to let go of an ended thread's ring whose
/// translations it would take over (see [`ProcessShared::take_pooled`]). Well past the
/// monitor's longest nap (1 ms), so that only a monitor kept off its core by other work
/// makes the thread translate again; short next to what a thread start costs when it does
/// (a thousand blocks translated take 5 ms).
pub(crate) const POOL_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// What a guest thread's translator owns apart from its bookkeeping: its code cache (with
/// the gateway at its bottom), its thread area and its signal state. Kept for reuse when the
/// thread ends (a program that starts and joins threads in a loop maps them once, and
/// translates the code they run once).
pub struct ThreadResources {
    pub(crate) cache: crate::cache::code_cache::CodeCache,
    pub(crate) gateway: crate::backend::gateway::Gateway,
    pub(crate) area: &'static mut crate::host::thread_area::ThreadArea,
    pub(crate) signals: crate::linux::signals::SignalState,
    /// The translations in `cache` (and the thread area's lookup and jump tables) when they
    /// were kept for the next thread; `None` for an empty cache.
    pub(crate) kept: Option<KeptTranslations>,
}

/// What a dispatcher knows about the translations in a code cache it hands to the next
/// thread: everything translated code points to or was made from that is not in the cache
/// or the thread area themselves. A field the dispatcher keeps about its translations and
/// leaves out of here is lost with the thread that made them, and the next thread finds the
/// code without it.
pub(crate) struct KeptTranslations {
    /// Blocks, exits, superblocks, links.
    pub(crate) index: crate::cache::code_cache::CacheIndex,
    /// The jump-table sites whose tables are in the thread area.
    pub(crate) jump_tables: crate::backend::jump_table::Sites,
}

// SAFETY: a thread's resources are used by one host thread at a time: its own while it runs,
// then handed to the next through the process's pool under its lock. The code cache's raw
// pointer is its writable view, mapped for the process's life.
unsafe impl Send for ThreadResources {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fork hold takes every lock of the process: one left out is copied into the child
    /// held by a thread the child does not have, and the child hangs on it (as it once did
    /// with a lock every thread that translated a call took). The pattern names
    /// every field, so a new one does not compile until it is sorted here.
    #[test]
    fn a_fork_hold_takes_every_lock_of_the_process() {
        let shared = ProcessShared::new(
            PathBuf::from("/guest"),
            Memory {
                brk_start: 0,
                brk: 0,
                guest_regions: Default::default(),
                modules: Default::default(),
            },
            Arc::new(crate::cache::smc::ProtectedPages::default()),
            Arc::new(Mutex::new(
                [crate::linux::signals::GuestAction::default(); crate::linux::signals::NSIG + 1],
            )),
        );
        let hold = shared.hold_for_fork();
        std::thread::scope(|s| {
            s.spawn(|| {
                let ProcessShared {
                    // Not locks: set once, or atomics.
                    exe: _,
                    exiting: _,
                    invalidation_count: _,
                    threads_started: _,
                    memory,
                    registry,
                    smc,
                    actions,
                    threads,
                    ended_stats,
                    invalidations,
                    spawner,
                    pool,
                    mem_fds,
                    code_log,
                    store: _,
                } = &shared;
                assert!(memory.try_lock().is_err(), "memory");
                assert!(registry.try_lock().is_err(), "registry");
                assert!(smc.try_hold().is_none(), "smc");
                assert!(actions.try_lock().is_err(), "actions");
                assert!(threads.try_lock().is_err(), "threads");
                assert!(ended_stats.try_lock().is_err(), "ended_stats");
                assert!(invalidations.try_lock().is_err(), "invalidations");
                assert!(spawner.try_lock().is_err(), "spawner");
                assert!(pool.try_lock().is_err(), "pool");
                assert!(mem_fds.try_lock().is_err(), "mem_fds");
                assert!(code_log.try_lock().is_err(), "code_log");
            });
        });
        drop(hold);
        assert!(shared.mem_fds.try_lock().is_ok());
    }
}
