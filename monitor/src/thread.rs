//! Spawning, pinning and stopping the monitor thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, Sender};
use crossbeam::utils::Backoff;
use hotpath_events::futex::Doorbell;
use hotpath_events::{BlockCatalog, Command, RingConsumer, MIN_POLL_INTERVAL};

use crate::decisions::Decisions;
use crate::os_thread::{self, OsThread};
use crate::{PathRecorder, Tables};

/// What a monitor keeps: the tables, the path recorder unless paths are off, and its
/// superblock decisions.
#[derive(Clone, Default)]
pub struct MonitorState {
    pub tables: Tables,
    pub paths: Option<PathRecorder>,
    pub decisions: Decisions,
    /// Time spent on events so far, in nanoseconds (see `Totals::monitor_busy_ns`).
    pub busy_ns: u64,
    /// Position of the thread among the process's threads (0: the first).
    pub started: usize,
}

impl MonitorState {
    /// A state going on from `tables` and `paths`.
    pub fn new(tables: Tables, paths: Option<PathRecorder>) -> MonitorState {
        MonitorState {
            tables,
            paths,
            ..MonitorState::default()
        }
    }
}

/// One guest thread's event ring as the monitor gets it: a consumer, the thread's tid, and
/// where superblock requests for its code cache go (none: the monitor only watches).
pub struct Stream {
    /// The guest thread's kernel thread id.
    pub tid: u32,
    /// The consumer end of its ring.
    pub ring: RingConsumer,
    /// Its translator's superblock requests.
    pub commands: Option<Sender<Command>>,
    /// Makes the guest thread come to its dispatcher, so that its translator reads a command
    /// now rather than at its next ring refill: when it next goes to the head of a superblock
    /// requested.
    pub wake: Option<Waker>,
}

use hotpath_events::Waker;

/// What the monitor kept for one guest thread.
pub struct ThreadState {
    /// The guest thread's kernel thread id.
    pub tid: u32,
    /// Its tables, paths and decisions.
    pub state: MonitorState,
    /// How often and how long it waited for a full ring.
    pub waits: hotpath_events::WaitStats,
}

/// What a monitor kept: the guest threads it still holds whole, in the order they started
/// (the first thread, and those that ran until the end), what it folded of the others as they
/// ended, and every id's metadata.
pub struct MonitorResult {
    pub threads: Vec<ThreadState>,
    pub ended: Ended,
    pub catalog: Arc<BlockCatalog>,
}

/// What the monitor keeps of the threads that ended while others ran on, folded as each one
/// ends so that its memory does not grow with the threads a program starts and joins (a
/// thread's tables and path recorder are sized to every block id of the process): their
/// tables summed, and each one's row of the report's per-thread section, with its path
/// profile made then (named by the [`Namer`] given to [`spawn`]).
#[derive(Default)]
pub struct Ended {
    /// Every ended thread's counts over one id space (edges, system calls, last events).
    pub tables: Tables,
    /// Each ended thread's report row, with its position among the process's threads.
    pub threads: Vec<(usize, hotpath_report::Thread)>,
    /// Time the monitor spent on their events, in nanoseconds.
    pub busy_ns: u64,
}

/// Makes, when a thread's path profile is taken, the function that names a guest address as
/// the report does (`symbol`, `symbol+0xOFF`, `sub_<hex>`), from the modules mapped then.
pub type Namer = Arc<dyn Fn() -> Box<dyn Fn(u64) -> String> + Send + Sync>;

impl Ended {
    /// Folds the finished thread `t` in (its tables need not know every id: these learn
    /// the new ones from `catalog`, once for all threads); its path profile, if it recorded
    /// one, is named by `namer`. Returns its tables, for their storage.
    fn fold(
        &mut self,
        t: ThreadState,
        catalog: &Arc<BlockCatalog>,
        namer: Option<&Namer>,
    ) -> Tables {
        self.tables.learn_from(catalog);
        let mut row = crate::profile::thread_report_with(
            t.tid,
            &t.state.tables,
            &self.tables,
            t.waits.waits,
            t.waits.wait_ns,
        );
        if let Some(mut rec) = t.state.paths {
            rec.finish();
            row.path_profile = Some(match namer {
                Some(namer) => rec.profile(&*namer()),
                None => rec.profile(&|addr| format!("sub_{addr:x}")),
            });
        }
        self.threads.push((t.state.started, row));
        self.tables.merge(&t.state.tables);
        self.busy_ns += t.state.busy_ns;
        t.state.tables
    }
}

/// A running monitor thread.
pub struct MonitorHandle {
    handle: OsThread<Result<MonitorResult, String>>,
    /// Set to make the monitor finish once every ring it knows is closed and drained.
    stop: Arc<AtomicBool>,
    /// What the monitor sleeps on when no ring has work; rung to wake it.
    bell: &'static Doorbell,
    /// The core it was pinned to, if any.
    pub pinned_to: Option<usize>,
}

/// Bytes of the monitor thread's stack (what `std::thread` gives a thread by default).
const MONITOR_STACK: usize = 2 << 20;

/// How long the monitor first naps when every ring stays without a batch after spinning, in
/// microseconds: short enough that a producer waiting on a full ring is released quickly.
const IDLE_NAP_US: u64 = 50;

/// Longest nap, in microseconds: each nap in a row doubles up to this. Every wake-up costs the
/// guest's core too (measured on a 2-vCPU VM: `busybox true` translated its 1,119 blocks in
/// 8.5 ms with 50 µs naps, 7.4 ms with 1 ms naps, 5.7 ms with no monitor), and a guest that
/// produces fewer than a batch of events per nap has no use for a faster monitor. A full
/// default ring (1 Mi events) takes a guest longer than this to fill; the monitor is woken
/// at once when told to finish.
const MAX_IDLE_NAP_US: u64 = 1000;

/// Shortest nap worth taking between two batches while events come, in µs. Below it the
/// monitor spins (with `pause`) to its next look; above it, it sleeps, which leaves the guest
/// its core's resources: on a 2-vCPU VM in hours when the monitor's spinning slowed the guest
/// (two vCPUs sharing a core, as far as one can tell), bench_nbody took 457 ms as shipped with
/// spinning and 373 ms with naps, bench_interp 174 and 133, lua 951 and 801 (the same as in
/// the other hours, in which naps change nothing: docs/measurements.md).
const NAP_FROM_US: u64 = 10;

/// How far a nap may overrun what it asked for, in µs (the kernel's default timer slack).
const NAP_SLACK_US: f64 = 50.0;

/// How long the rings must stay without a batch before the monitor starts napping, when it
/// has a CPU to itself: longer than a futex wake-up takes on a VM (tens of µs), so that a
/// producer with a small ring, handing over a lap every few microseconds, finds the monitor
/// awake (a 64-entry ring's `busybox sort`: 0.23 s with 200 µs, 1.14 s with 20 µs).
const IDLE_BEFORE_NAP: Duration = Duration::from_micros(200);

/// The same when the monitor has lately been preempted (the CPUs run more threads than they
/// have): spinning then takes the time of the very thread it waits for, and only a thread that
/// sleeps is run at once when woken (the same sort beside two CPU burners: 20 s with 200 µs,
/// 4.5 s with 20 µs).
const IDLE_BEFORE_NAP_CONTENDED: Duration = Duration::from_micros(20);

/// How often the monitor asks the kernel whether it was preempted (`ru_nivcsw`).
const CONTENTION_WINDOW: Duration = Duration::from_millis(2);

/// Whether the monitor thread was preempted in its last [`CONTENTION_WINDOW`]: its CPU is
/// shared with more runnable threads than there are CPUs.
struct Contention {
    checked: Instant,
    preemptions: i64,
    contended: bool,
}

impl Contention {
    fn new() -> Contention {
        Contention {
            checked: Instant::now(),
            preemptions: involuntary_switches(),
            contended: false,
        }
    }

    /// True if the thread was preempted in the last window (asks the kernel once a window).
    fn contended(&mut self) -> bool {
        if self.checked.elapsed() >= CONTENTION_WINDOW {
            let now = involuntary_switches();
            self.contended = now > self.preemptions;
            self.preemptions = now;
            self.checked = Instant::now();
        }
        self.contended
    }
}

/// The calling thread's involuntary context switches so far (preemptions).
fn involuntary_switches() -> i64 {
    // SAFETY: getrusage writes one `rusage` to the pointer given.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
        usage.ru_nivcsw as i64
    }
}

/// Events the tables and then the path recorder take at a time, 16 KiB of them.
const PATHS_PIECE: usize = 4096;

/// Starts the monitor thread on `first` (the first guest thread's ring, going on from
/// `state`: empty for a new guest, the previous monitor's after a failed `execve`) and on the
/// rings of the threads the guest starts later (from `streams`, each with a copy of
/// `template`), resolving ids through `catalog` (where every id is published before it can
/// be in a ring), pinned to `core` when given (the caller picks a core other than the
/// guest's). It finishes when told to (see [`MonitorHandle::finish`]) and every ring it knows
/// is closed and drained. `namer` names the path profiles of threads that end while others
/// run on (taken when they end; without it, functions are named by address).
///
/// # Errors
/// The OS error when the thread cannot be created (a process or memory limit); nothing is
/// left changed.
pub fn spawn(
    first: Stream,
    streams: Receiver<Stream>,
    catalog: Arc<BlockCatalog>,
    core: Option<core_affinity::CoreId>,
    state: MonitorState,
    template: MonitorState,
    namer: Option<Namer>,
) -> std::io::Result<MonitorHandle> {
    let pinned_to = core.map(|c| c.id);
    let stop = Arc::new(AtomicBool::new(false));
    let bell = Doorbell::leak();
    first.ring.set_bell(bell);
    let stop_seen = stop.clone();
    // Signals are the guest threads' business: a process-directed signal must reach one (to
    // interrupt its system call), never this thread. The new thread inherits the mask it is
    // created with, so block everything around its creation: blocking from inside the thread
    // would leave a window in which it could take a signal meant for the guest.
    // SAFETY: changing the calling thread's mask and restoring it right after.
    let mut saved: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut saved);
    }
    // Its stack is mapped here, before the guest's next instruction, and it maps nothing of
    // its own once it runs (`os_thread`), so nothing waits for it to start: the guest's events
    // wait in its ring. It starts on its own CPU (`core`), else on any of this thread's.
    let target = core.map(|c| cpu_set_of(c.id));
    let handle = os_thread::spawn(
        b"hotpath-monitor\0",
        MONITOR_STACK,
        target.as_ref(),
        move || {
            run_monitor(
                first, state, &streams, &stop_seen, catalog, template, bell, namer,
            )
        },
    );
    // SAFETY: restoring the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut()) };
    Ok(MonitorHandle {
        handle: handle?,
        stop,
        bell,
        pinned_to,
    })
}

/// The monitor's work on the thread that runs it: learns `first` from `state`, drains every
/// ring (and those `streams` brings) until `stop` is set and all are closed and drained, and
/// returns what it kept (its panic's message if it panicked, after freeing room in the rings
/// until they close, so that no guest waits on a full ring for good).
#[allow(clippy::too_many_arguments)]
fn run_monitor(
    first: Stream,
    state: MonitorState,
    streams: &Receiver<Stream>,
    stop: &AtomicBool,
    catalog: Arc<BlockCatalog>,
    template: MonitorState,
    bell: &'static Doorbell,
    namer: Option<Namer>,
) -> Result<MonitorResult, String> {
    let mut monitor = Monitor {
        live: Vec::new(),
        done: Vec::new(),
        ended: Ended::default(),
        catalog,
        template,
        bell,
        namer,
        spare_tables: None,
    };
    monitor.add(first, state);
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        monitor.drain_loop(streams, stop);
    }));
    match run {
        Ok(()) => {
            let mut threads: Vec<ThreadState> = monitor
                .done
                .into_iter()
                .chain(monitor.live.into_iter().map(Live::finish_ring))
                .collect();
            threads.sort_by_key(|t| t.state.started);
            Ok(MonitorResult {
                threads,
                ended: monitor.ended,
                catalog: monitor.catalog,
            })
        }
        Err(panic) => {
            // A bug in the monitor must not hang the guest on a full ring: keep freeing room,
            // discarding events, until the guest ends.
            let mut rings: Vec<RingConsumer> = monitor.live.into_iter().map(|l| l.ring).collect();
            discard_until_closed(&mut rings, streams, stop);
            Err(panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into()))
        }
    }
}

/// The monitor's work for a guest that ended before any monitor thread started, done on the
/// calling thread: `first`'s ring (closed by the caller, its events all written) is read from
/// `state` on to its end, and what the monitor kept is returned, as
/// [`MonitorHandle::finish`] returns it from a thread [`spawn`] started. No thread is
/// created, so a short process never has a second one.
///
/// # Errors
/// The panic message of a bug in the monitor.
pub fn run_to_end(
    first: Stream,
    catalog: Arc<BlockCatalog>,
    state: MonitorState,
    template: MonitorState,
    namer: Option<Namer>,
) -> Result<MonitorResult, String> {
    let (_, streams) = crossbeam::channel::unbounded();
    let stop = AtomicBool::new(true);
    run_monitor(
        first,
        state,
        &streams,
        &stop,
        catalog,
        template,
        Doorbell::leak(),
        namer,
    )
}

/// The CPU set holding `cpu` alone.
fn cpu_set_of(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: a zeroed `cpu_set_t` is the empty set; CPU_SET checks `cpu` against its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    }
}

/// A ring being drained, with the thread's state.
struct Live {
    tid: u32,
    ring: RingConsumer,
    commands: Option<Sender<Command>>,
    wake: Option<Waker>,
    state: MonitorState,
}

/// The monitor thread's state: the rings it drains, and the metadata of every id.
struct Monitor {
    live: Vec<Live>,
    /// Finished threads kept whole: the first one (a failed exec goes on from its state), and
    /// every one that finished once no other ran.
    done: Vec<ThreadState>,
    /// The other finished threads, folded.
    ended: Ended,
    /// Every id's metadata, in id order (each thread's tables learn from it).
    catalog: Arc<BlockCatalog>,
    /// A new thread's initial state.
    template: MonitorState,
    /// What the thread sleeps on when no ring has work (each ring's producer rings it when
    /// its lap is full).
    bell: &'static Doorbell,
    /// Names the path profiles of threads that end while others run on.
    namer: Option<Namer>,
    /// The tables of the last thread folded, whose storage the next new thread takes.
    spare_tables: Option<Tables>,
}

impl Monitor {
    fn add(&mut self, s: Stream, mut state: MonitorState) {
        s.ring.set_bell(self.bell);
        state.started = self.live.len() + self.done.len() + self.ended.threads.len();
        self.live.push(Live {
            tid: s.tid,
            ring: s.ring,
            commands: s.commands,
            wake: s.wake,
            state,
        });
    }

    /// A new thread's initial state: the template, whose path recorder has first learnt every
    /// id published so far. What an id stands for belongs to the process, so each thread's
    /// recorder starts from the template's copy instead of learning every id again: a
    /// python3 program starting 200 threads one after another spent 41 % of the monitor's
    /// time in each new recorder's `learn_known` (46,000 ids, their maps grown entry by
    /// entry).
    ///
    /// The tables take the storage of the last thread that ended, if any ([`Tables::recycle`]).
    fn fresh_state(&mut self) -> MonitorState {
        let t = &mut self.template;
        if let Some(p) = t.paths.as_mut() {
            t.tables.learn_from(&self.catalog);
            p.learn_known(&t.tables);
        }
        let Some(mut tables) = self.spare_tables.take() else {
            return t.clone();
        };
        // The template cloned without its tables: a copy of them would fill fresh arrays,
        // which the recycled storage is there to spare.
        tables.recycle(&t.tables);
        let template_tables = std::mem::take(&mut t.tables);
        let mut state = t.clone();
        t.tables = template_tables;
        state.tables = tables;
        state
    }

    /// The monitor's work: drain every ring in order into its thread's tables (and paths)
    /// until told to stop and every ring is closed, asking each thread for superblocks as
    /// pairs of its events become hot.
    fn drain_loop(&mut self, streams: &Receiver<Stream>, stop: &AtomicBool) {
        let mut idle_since: Option<Instant> = None;
        let mut nap = IDLE_NAP_US;
        let replays = std::env::var("HOTPATH_REPLAY")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let initial = (replays > 0).then(|| {
            let s = &self.live[0].state;
            (s.tables.clone(), s.paths.clone())
        });
        let mut kept = Vec::new();
        // When the last drain was, and how fast the events came up to it (events per µs).
        let mut last_drain = Instant::now();
        let mut rate = f64::INFINITY;
        let mut contention = Contention::new();
        loop {
            let stopping = stop.load(Ordering::Acquire);
            while let Ok(s) = streams.try_recv() {
                let fresh = self.fresh_state();
                self.add(s, fresh);
            }
            let started = Instant::now();
            let mut drained = 0;
            let mut i = 0;
            while i < self.live.len() {
                // Read `closed` before draining: everything written before the close is
                // visible to this drain.
                let closed = self.live[i].ring.is_closed();
                let n = self.drain_one(i, closed, replays > 0 && i == 0, &mut kept);
                drained += n;
                if closed && n == 0 {
                    let l = self.live.swap_remove(i);
                    let mut t = l.finish_ring();
                    // A thread that ends while others run on is folded (its tables alone are
                    // as large as the program's code); the first one and the last ones are
                    // kept whole. Without paths, a folded thread's tables learn no id.
                    let fold = t.state.started != 0 && !self.live.is_empty() && !stopping;
                    if !fold || t.state.paths.is_some() {
                        self.finish_state(&mut t.state);
                    }
                    if fold {
                        let tables = self.ended.fold(t, &self.catalog, self.namer.as_ref());
                        self.spare_tables = Some(tables);
                    } else {
                        self.done.push(t);
                    }
                } else {
                    i += 1;
                }
            }
            if drained > 0 {
                idle_since = None;
                nap = IDLE_NAP_US;
                let now = Instant::now();
                let us = now.duration_since(last_drain).as_secs_f64() * 1e6;
                rate = drained as f64 / us.max(1e-3);
                last_drain = now;
            } else if stopping && self.live.is_empty() {
                break;
            } else if idle_since.get_or_insert(started).elapsed()
                > if contention.contended() {
                    IDLE_BEFORE_NAP_CONTENDED
                } else {
                    IDLE_BEFORE_NAP
                }
            {
                self.nap(Duration::from_micros(nap), streams, stop);
                nap = (nap * 2).min(MAX_IDLE_NAP_US);
            } else if let Some(wait) = self.batch_wait(rate, last_drain) {
                self.nap(wait, streams, stop);
            } else {
                // Less than a batch: look again after MIN_POLL_INTERVAL, not sooner (each look
                // costs the guest a cache-line transfer). Yield first: a thread waiting for
                // this CPU (a guest thread the kernel put here, another process's guest or
                // monitor) runs now instead of when this thread's time slice ends, up to a
                // millisecond or two later; with nothing waiting the call returns at once.
                // Two `cc1 -O2` compiles at once 3.49 -> 3.04 s, two busybox gzip 777 -> 705
                // ms, python3 starting 200 threads 308 -> 280 ms (medians of 3-8); one gzip,
                // bench_fib, bench_threads and a shell's fork-exec loop unchanged.
                std::thread::yield_now();
                let backoff = Backoff::new();
                while started.elapsed() < MIN_POLL_INTERVAL {
                    backoff.spin();
                }
            }
        }
        if let Some((tables0, paths0)) = initial {
            replay(&kept, &self.catalog, tables0, paths0, replays);
        }
    }

    /// Sleeps for at most `timeout` on the doorbell, which a producer rings when its lap is
    /// full (it waits for this thread), the session when it hands over a new thread's ring,
    /// and `finish`; not at all if one of those already happened.
    fn nap(&self, timeout: Duration, streams: &Receiver<Stream>, stop: &AtomicBool) {
        self.bell.prepare();
        if stop.load(Ordering::Acquire)
            || !streams.is_empty()
            || self.live.iter().any(|l| l.ring.urgent())
        {
            self.bell.awake();
        } else {
            self.bell.sleep(timeout);
        }
    }

    /// How long to sleep before the next look at rings that hold less than a batch, given
    /// that the events came at `rate` per µs up to the last drain (at `last`): half the time
    /// the next batch should take, when that is at least [`NAP_FROM_US`] (at most
    /// [`MAX_IDLE_NAP_US`]), and never so long that a guest could fill the rest of its ring's
    /// lap before the monitor wakes (it would wait for the monitor). `None`: spin and look
    /// again soon.
    fn batch_wait(&self, rate: f64, last: Instant) -> Option<Duration> {
        let batch = self.live.iter().map(|l| l.ring.batch()).min()? as f64;
        let due_us = batch / rate - last.elapsed().as_secs_f64() * 1e6;
        let nap = (due_us / 2.0).min(MAX_IDLE_NAP_US as f64);
        if nap < NAP_FROM_US as f64 {
            return None;
        }
        // Only now the producers' cursors: each is a line the guest writes at every event.
        let room = self.live.iter().map(|l| l.ring.room()).min()? as f64;
        (room > 2.0 * rate * (nap + NAP_SLACK_US)).then(|| Duration::from_micros(nap as u64))
    }

    /// Drains ring `i` (all of it when `all`) into its thread's state; returns the events.
    fn drain_one(&mut self, i: usize, all: bool, keep: bool, kept: &mut Vec<u32>) -> u64 {
        let started = Instant::now();
        let Monitor { live, catalog, .. } = self;
        let l = &mut live[i];
        let state = &mut l.state;
        // Each piece is recorded before its slots are freed, so a guest at the end of a lap
        // waits for the recording (the monitor stays close behind it).
        let n = l.ring.drain(all, |events| {
            if keep {
                kept.extend_from_slice(events);
            }
            if state.paths.is_some() {
                // The path recorder needs every id's metadata; the ids drained are published.
                state.tables.learn_from(catalog);
            }
            record(events, &mut state.tables, state.paths.as_mut());
        });
        let l = &mut self.live[i];
        if !l.state.tables.hot.is_empty() || l.state.decisions.scan_due(&l.state.tables) {
            l.state.tables.learn_from(&self.catalog);
            let requests = l.state.decisions.decide(&mut l.state.tables);
            if let Some(tx) = &l.commands {
                let mut heads = Vec::with_capacity(requests.len());
                for c in requests {
                    let (Command::FormSuperblock { blocks } | Command::ReformSuperblock { blocks }) =
                        &c;
                    if let Some(b) = l.state.tables.summary(blocks[0].0) {
                        heads.push(b.start.0);
                    }
                    // A translator that is gone needs no superblocks.
                    let _ = tx.send(c);
                }
                // The translator reads them when it next comes to its dispatcher, at the
                // latest at its next ring refill (a lap of up to 1 Mi events, in which a loop
                // whose superblock is waiting runs on as basic blocks: 12 M of python3's 74 M
                // events): make it come when it next goes to one of the heads.
                if let (false, Some(wake)) = (heads.is_empty(), &l.wake) {
                    wake(&heads);
                }
            }
        }
        let l = &mut self.live[i];
        if n > 0 {
            l.state.busy_ns += started.elapsed().as_nanos() as u64;
        }
        n
    }

    /// Completes a finished thread's state: every id known, paths closed.
    fn finish_state(&mut self, state: &mut MonitorState) {
        state.tables.learn_from(&self.catalog);
        if let Some(p) = state.paths.as_mut() {
            p.end_of_stream(&state.tables);
        }
    }
}

impl Live {
    /// Lets go of the drained ring (its memory may serve a new thread).
    fn finish_ring(self) -> ThreadState {
        let waits = self.ring.wait_stats();
        self.ring.release();
        ThreadState {
            tid: self.tid,
            state: self.state,
            waits,
        }
    }
}

/// Accounts `events` in the tables and, if on, the path recorder (every id of `events` must
/// be known to `tables`).
fn record(events: &[u32], tables: &mut Tables, paths: Option<&mut PathRecorder>) {
    match paths {
        None => tables.record(events),
        // The tables read each event again after the path recorder, in pieces that stay in
        // the L1 cache between the two passes (a drained run can be megabytes), and count the
        // runs of one repeated event the recorder found at once.
        Some(p) => {
            for piece in events.chunks(PATHS_PIECE) {
                p.record(piece, tables);
                tables.record_with_repeats(piece, p.repeats());
            }
        }
    }
}

/// Developer aid (environment `HOTPATH_REPLAY=N`): feeds the events of the whole run `N`
/// times more to fresh copies of the monitor's initial tables and path recorder, with every
/// block's metadata known up front, and prints the median nanoseconds per event to stderr —
/// what the monitor's work costs without the guest beside it (no ring waits, no noise from
/// the guest's core). Superblock requests are not sent again.
fn replay(
    events: &[u32],
    catalog: &Arc<BlockCatalog>,
    tables0: Tables,
    paths0: Option<PathRecorder>,
    n: usize,
) {
    let mut times = Vec::new();
    for _ in 0..n {
        let (mut tables, mut paths) = (tables0.clone(), paths0.clone());
        tables.learn_from(catalog);
        let started = Instant::now();
        record(events, &mut tables, paths.as_mut());
        if let Some(p) = paths.as_mut() {
            p.end_of_stream(&tables);
        }
        times.push(started.elapsed().as_nanos() as f64 / events.len().max(1) as f64);
    }
    times.sort_by(f64::total_cmp);
    eprintln!(
        "hotpath: replay of {} events: {:.2} ns per event (median of {n}; min {:.2}, max {:.2})",
        events.len(),
        times[n / 2],
        times[0],
        times[n - 1]
    );
}

/// After a failure: frees ring room without looking at the events, until told to stop and
/// every ring is closed.
fn discard_until_closed(
    rings: &mut Vec<RingConsumer>,
    streams: &Receiver<Stream>,
    stop: &AtomicBool,
) {
    loop {
        let stopping = stop.load(Ordering::Acquire);
        while let Ok(s) = streams.try_recv() {
            rings.push(s.ring);
        }
        let mut n = 0;
        let mut i = 0;
        while i < rings.len() {
            let closed = rings[i].is_closed();
            let d = rings[i].drain(true, |_| {});
            n += d;
            if closed && d == 0 {
                // Its memory may serve a new thread.
                rings.swap_remove(i).release();
            } else {
                i += 1;
            }
        }
        if n == 0 {
            if stopping && rings.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_micros(IDLE_NAP_US));
        }
    }
}

impl MonitorHandle {
    /// Hands the monitor a new guest thread's ring through `streams` (the receiver given to
    /// [`spawn`]) and wakes it if it sleeps. False if the monitor has gone.
    pub fn add_stream(&self, streams: &Sender<Stream>, s: Stream) -> bool {
        s.ring.set_bell(self.bell);
        let sent = streams.send(s).is_ok();
        self.bell.ring();
        sent
    }

    /// Tells the monitor to finish once every ring is closed (the caller has closed them or
    /// stopped their threads), waits for it, and returns what it kept.
    ///
    /// # Errors
    /// The panic message, if the monitor failed (a bug in hotpath); the guest went on
    /// unaffected but its profile is lost.
    pub fn finish(self) -> Result<MonitorResult, String> {
        self.stop.store(true, Ordering::Release);
        self.bell.ring();
        match self.handle.join() {
            Some(result) => result,
            None => Err("the monitor thread ended abnormally".into()),
        }
    }
}
