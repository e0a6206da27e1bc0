//! Spawning, pinning and stopping the monitor thread.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, Sender};
use crossbeam::utils::Backoff;
use hotpath_events::{Command, NewBlock, RingConsumer, MIN_POLL_INTERVAL};

use crate::decisions::Decisions;
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

/// A running monitor thread.
pub struct MonitorHandle {
    handle: JoinHandle<Result<MonitorState, String>>,
    /// The core it was pinned to, if any.
    pub pinned_to: Option<usize>,
}

/// How long the monitor naps when the ring stays empty after spinning, in microseconds. Short
/// enough that a producer waiting on a full ring is released quickly; long enough that an idle
/// guest (blocked in a syscall) does not keep a core busy.
const IDLE_NAP_US: u64 = 50;

/// How long the ring must stay without a batch before the monitor starts napping.
const IDLE_BEFORE_NAP: Duration = Duration::from_micros(200);

/// Events the tables and then the path recorder take at a time, 16 KiB of them.
const PATHS_PIECE: usize = 4096;

/// Starts the monitor thread on `ring`, learning block metadata from `new_blocks`, pinned to
/// `core` when given (the caller picks a core other than the guest's), going on from `tables`
/// (empty for a new guest; the previous monitor's after a failed `execve`). With paths on, an
/// event whose block id is not yet known waits for its `NewBlock` message. Superblock requests
/// go to `commands` (none: the monitor only watches).
pub fn spawn(
    mut ring: RingConsumer,
    new_blocks: Receiver<NewBlock>,
    commands: Option<Sender<Command>>,
    core: Option<core_affinity::CoreId>,
    state: MonitorState,
) -> MonitorHandle {
    let pinned_to = core.map(|c| c.id);
    // Signals are the guest thread's business: a process-directed signal must reach it (to
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
    let handle = std::thread::Builder::new()
        .name("hotpath-monitor".into())
        .spawn(move || {
            if let Some(c) = core {
                core_affinity::set_for_current(c);
            }
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                drain_loop(&mut ring, &new_blocks, commands.as_ref(), state)
            }));
            run.map_err(|panic| {
                // A bug in the monitor must not hang the guest on a full ring: keep freeing
                // room, discarding events, until the guest ends.
                discard_until_closed(&mut ring);
                panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into())
            })
        })
        .expect("spawning the monitor thread");
    // SAFETY: restoring the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut()) };
    MonitorHandle { handle, pinned_to }
}

/// The monitor's work: drain the ring in order into the tables (and paths) until the
/// producer closes it, asking for superblocks as pairs of events become hot.
fn drain_loop(
    ring: &mut RingConsumer,
    new_blocks: &Receiver<NewBlock>,
    commands: Option<&Sender<Command>>,
    mut state: MonitorState,
) -> MonitorState {
    let mut idle_since: Option<Instant> = None;
    let replays = std::env::var("HOTPATH_REPLAY")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let initial = (replays > 0).then(|| (state.tables.clone(), state.paths.clone()));
    let mut kept = Vec::new();
    let MonitorState {
        tables,
        paths,
        decisions,
        busy_ns,
    } = &mut state;
    loop {
        // Read `closed` before draining: everything written before the close is visible
        // to this drain.
        let closed = ring.is_closed();
        let started = Instant::now();
        let n = ring.drain(closed, |events| {
            if replays > 0 {
                kept.extend_from_slice(events);
            }
            record(events, tables, paths.as_mut(), Some(new_blocks));
        });
        if !tables.hot.is_empty() {
            tables.learn_all(new_blocks);
            let requests = decisions.decide(tables);
            if let Some(tx) = commands {
                for c in requests {
                    // A translator that is gone needs no superblocks.
                    let _ = tx.send(c);
                }
            }
        }
        if n > 0 {
            *busy_ns += started.elapsed().as_nanos() as u64;
            idle_since = None;
        } else if closed {
            break;
        } else if idle_since.get_or_insert(started).elapsed() > IDLE_BEFORE_NAP {
            tables.learn_all(new_blocks);
            std::thread::sleep(Duration::from_micros(IDLE_NAP_US));
        } else {
            // Less than a batch: look again after MIN_POLL_INTERVAL, not sooner (each look
            // costs the guest a cache-line transfer).
            let backoff = Backoff::new();
            while started.elapsed() < MIN_POLL_INTERVAL {
                backoff.spin();
            }
        }
    }
    tables.learn_all(new_blocks);
    if let Some(p) = paths.as_mut() {
        p.end_of_stream(tables);
    }
    if let Some((tables0, paths0)) = initial {
        replay(&kept, tables, tables0, paths0, replays);
    }
    state
}

/// Accounts `events` in the tables and, if on, the path recorder, which learns the ids it has
/// not seen itself from `new_blocks` (waiting for their metadata; none: all are known).
fn record(
    events: &[u32],
    tables: &mut Tables,
    paths: Option<&mut PathRecorder>,
    new_blocks: Option<&Receiver<NewBlock>>,
) {
    match paths {
        None => tables.record(events),
        // The tables read each event again after the path recorder, in pieces that stay in
        // the L1 cache between the two passes (a drained run can be megabytes), and count the
        // runs of one repeated event the recorder found at once.
        Some(p) => {
            for piece in events.chunks(PATHS_PIECE) {
                p.record(piece, tables, new_blocks);
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
    learned: &Tables,
    tables0: Tables,
    paths0: Option<PathRecorder>,
    n: usize,
) {
    let mut times = Vec::new();
    for _ in 0..n {
        let (mut tables, mut paths) = (tables0.clone(), paths0.clone());
        for (i, b) in learned.blocks.iter().enumerate().skip(tables.blocks.len()) {
            tables.learn(NewBlock {
                id: hotpath_ir::BlockId(i as u32),
                summary: *b,
                kind: learned.kinds[i].clone(),
            });
        }
        let started = Instant::now();
        record(events, &mut tables, paths.as_mut(), None);
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

/// After a failure: frees ring room without looking at the events, until the ring closes.
fn discard_until_closed(ring: &mut RingConsumer) {
    loop {
        let closed = ring.is_closed();
        if ring.drain(true, |_| {}) == 0 {
            if closed {
                return;
            }
            std::thread::sleep(Duration::from_micros(IDLE_NAP_US));
        }
    }
}

impl MonitorHandle {
    /// Waits for the monitor to drain the (closed) ring and returns its tables and paths.
    ///
    /// # Errors
    /// The panic message, if the monitor failed (a bug in hotpath); the guest went on
    /// unaffected but its profile is lost.
    pub fn finish(self) -> Result<MonitorState, String> {
        match self.handle.join() {
            Ok(result) => result,
            Err(_) => Err("the monitor thread ended abnormally".into()),
        }
    }
}
