//! The single-producer single-consumer event ring: layout, producer refill and consumer drain.
//!
//! # Layout and ownership
//!
//! A ring is a [`RingControl`] plus an array of `capacity` `u32` entries (block ids). Both live
//! in memory owned by the translator; the emitted enqueue stub addresses them directly, so the
//! layout is `#[repr(C)]` and the offsets of the fields it touches are public constants.
//!
//! # Protocol
//!
//! Positions are absolute event numbers (`u64`, never reset); position `p` is stored at index
//! `p % capacity`. The producer fills the array one *lap* at a time, from index 0 to its end.
//!
//! * The **producer** (emitted code of one guest thread, and that thread's Rust code) owns
//!   `cursor` and `laps`, on a cache line no other thread writes. `cursor` is the producer's
//!   index minus `capacity`, a two's-complement number in `[-capacity, 0]`, so that one
//!   counter is both the slot address (`entries_end + 4 * cursor`) and the check (`0`: the
//!   lap is full). Each event: if `cursor == 0` leave the code cache and call
//!   [`RingProducer::refill`]; else `entries[capacity + cursor] = id; cursor += 1`. That is
//!   one load, two stores and a `jrcxz` per event, and no flag is touched. The producer's
//!   head position is `laps * capacity + capacity + cursor`.
//! * The **refill** at the end of a lap waits until the consumer has read every event of it,
//!   then starts the next lap: `cursor = -capacity`, then `laps += 1` (both `Release`; in that
//!   order, see the consumer). A whole lap is granted at once because the stub cannot check a
//!   limit other than 0; waiting for the consumer to catch up costs the guest one wait per lap
//!   (the consumer reads continuously, see below, so it is only the consumer's lag).
//! * The **consumer** (the monitor thread) owns `tail` (an absolute position). It loads `laps`
//!   and then `cursor` (`Acquire`) and reads the entries from `tail` up to the head they give.
//!   On x86 each stub store is a release store, so every entry before the cursor it loads is
//!   visible. Loading `laps` first makes a torn read harmless: a wrap between the two loads
//!   gives a head at or below `tail` (the producer wraps only once `tail` reached its lap's
//!   end), which reads as "nothing yet". It then stores `tail` with `Release`, which hands
//!   the slots back.
//! * The consumer reads the producer's line on every poll, and each read costs the producer a
//!   cache-line transfer at its next event: the consumer polls at most every
//!   [`MIN_POLL_INTERVAL`] unless it found a full batch, and never reads the line of entries the
//!   producer is still filling. Each line of entries it has read it flushes from the caches
//!   (`clflush`), so that the producer's next lap does not find it shared with another core.
//!
//! Nothing is ever dropped: a producer with no room waits until the consumer frees room; the
//! wait is counted. It rings the consumer's [`Doorbell`] (a monitor with nothing to do sleeps
//! on it), spins for up to 20 µs, then blocks on its `parked` futex, which
//! the consumer wakes after each drain that finds it set. Neither side then waits for the
//! other's next scheduler slice when the CPUs are shared with other work (see [`futex`](crate::futex)).

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::futex::{self, Doorbell};

/// How long a producer waiting for room spins before it blocks: a consumer on another core
/// frees room sooner than a futex wake-up takes (tens of microseconds on a VM).
const SPIN_BEFORE_PARK: Duration = Duration::from_micros(20);

/// Longest a parked producer blocks before it looks at the ring again by itself: a bound for
/// the wakes nobody sends (a ring marked unconsumed, a consumer that ended), not the usual way
/// out (the consumer wakes it).
const PARKED_RECHECK: Duration = Duration::from_millis(1);

/// Events per 64-byte cache line.
const LINE_ENTRIES: u64 = 16;

/// Most events the consumer waits for before it drains (16 KiB of entries): large batches
/// keep the consumer off the cache lines the producer is writing.
pub const MAX_BATCH: u64 = 4096;

/// Shortest time between two polls of a consumer that found less than a batch: each poll
/// moves the producer's cache line to the consumer's core, and the producer pays for it
/// (about 100 ns) at its next event. A batch of 4096 events takes a guest several
/// microseconds to write.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_micros(2);

/// The producer's cache line: written by the guest thread only, read by the consumer.
#[repr(C, align(128))]
pub struct ProducerSide {
    /// The producer's index minus `capacity` (two's complement, in `[-capacity, 0]`): the next
    /// event goes to `entries[capacity + cursor]`; 0 means the lap is full.
    pub cursor: AtomicU64,
    /// Laps completed: the producer's head position is `laps * capacity + capacity + cursor`.
    pub laps: AtomicU64,
    /// Number of times the producer found the ring full and waited.
    pub waits: AtomicU64,
    /// Total time spent waiting for room, in nanoseconds.
    pub wait_ns: AtomicU64,
    /// 1 while the producer is blocked (or about to block) on this futex word waiting for
    /// room; the consumer wakes it after a drain that sees it set. Written by the producer only.
    pub parked: AtomicU32,
}

/// The consumer's cache line: written by the monitor thread only.
#[repr(C, align(128))]
pub struct ConsumerSide {
    /// Absolute position of the next event to read (events before it are consumed).
    pub tail: AtomicU64,
    /// Set to 1 (Release) when the consumer is done with a closed ring for good: the memory
    /// may then serve another producer.
    pub released: AtomicU64,
    /// Address of the consumer's [`Doorbell`] (0: none yet), which the producer rings when its
    /// lap is full. Set by the consumer when it adopts the ring.
    pub bell: AtomicU64,
}

/// Control block of one ring. Shared by one producer thread and one consumer thread.
#[repr(C)]
pub struct RingControl {
    /// Written by the producer only, read by the consumer.
    pub producer: ProducerSide,
    /// Written by the consumer only, read by the producer when it ends a lap.
    pub consumer: ConsumerSide,
    /// Number of entries; a power of two, immutable after creation.
    pub capacity: u64,
    /// Set to 1 by the producer (Release) once it will write no more events.
    pub closed: AtomicU64,
    /// Set to 1 when no consumer will ever read the ring (its monitor thread could not be
    /// started): a lap's end then starts the next lap at once, the events unread.
    pub unconsumed: AtomicU64,
}

impl RingControl {
    /// Byte offset of `producer.cursor` in the control block (read and written by the stub).
    pub const CURSOR_OFFSET: usize =
        std::mem::offset_of!(RingControl, producer) + std::mem::offset_of!(ProducerSide, cursor);

    /// A control block for an empty ring of `capacity` entries.
    ///
    /// # Panics
    /// If `capacity` is not a power of two of at least 2 (a bug in the caller: the command
    /// line is validated before).
    pub fn new(capacity: u64) -> RingControl {
        assert!(
            capacity.is_power_of_two() && capacity >= 2,
            "ring capacity {capacity}"
        );
        RingControl {
            producer: ProducerSide {
                cursor: AtomicU64::new(capacity.wrapping_neg()),
                laps: AtomicU64::new(0),
                waits: AtomicU64::new(0),
                wait_ns: AtomicU64::new(0),
                parked: AtomicU32::new(0),
            },
            consumer: ConsumerSide {
                tail: AtomicU64::new(0),
                released: AtomicU64::new(0),
                bell: AtomicU64::new(0),
            },
            capacity,
            closed: AtomicU64::new(0),
            unconsumed: AtomicU64::new(0),
        }
    }

    /// Marks the ring closed: no event will follow (by the producer, or by another thread of
    /// the process once the producer's thread is stopped for good).
    pub fn close(&self) {
        self.closed.store(1, Ordering::Release);
        self.ring_bell();
    }

    /// How long and how often the producer waited for room so far.
    pub fn wait_stats(&self) -> WaitStats {
        WaitStats {
            waits: self.producer.waits.load(Ordering::Relaxed),
            wait_ns: self.producer.wait_ns.load(Ordering::Relaxed),
        }
    }

    /// Empties the ring (a forked child's, for its new consumer).
    pub fn reset(&self) {
        self.producer
            .cursor
            .store(self.capacity.wrapping_neg(), Ordering::Relaxed);
        self.producer.laps.store(0, Ordering::Relaxed);
        self.consumer.tail.store(0, Ordering::Relaxed);
        self.consumer.released.store(0, Ordering::Relaxed);
        self.consumer.bell.store(0, Ordering::Relaxed);
        self.closed.store(0, Ordering::Release);
    }

    /// Rings the consumer's doorbell, if it has one: the consumer should look at this ring.
    pub fn ring_bell(&self) {
        let bell = self.consumer.bell.load(Ordering::Acquire);
        if bell != 0 {
            // SAFETY: `bell` was stored from a `&'static Doorbell` (`RingConsumer::set_bell`);
            // doorbells are leaked, never freed.
            unsafe { &*(bell as *const Doorbell) }.ring();
        }
    }

    /// True once the consumer of this closed ring let it go (see `ConsumerSide::released`).
    pub fn is_released(&self) -> bool {
        self.consumer.released.load(Ordering::Acquire) != 0
    }

    /// The producer's head position as the consumer may read it: every event before it has
    /// been written. Loads `laps` before `cursor` (see the module doc), so a concurrent wrap
    /// yields a position at or below the consumer's tail, never past the real head. Also
    /// returns whether the producer's lap is full (it waits for the consumer).
    fn head(&self) -> (u64, bool) {
        let laps = self.producer.laps.load(Ordering::Acquire);
        let cursor = self.producer.cursor.load(Ordering::Acquire);
        let head = (laps * self.capacity)
            .wrapping_add(self.capacity)
            .wrapping_add(cursor);
        (head, cursor == 0)
    }
}

/// How long and how often a producer waited for room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// Times the ring was found full.
    pub waits: u64,
    /// Total time waited, in nanoseconds.
    pub wait_ns: u64,
}

/// The producer's Rust-side handle: events pushed from Rust, and the refill at a lap's end.
pub struct RingProducer {
    ctrl: *const RingControl,
    entries: *mut u32,
}

// SAFETY: the handle only touches the producer's fields and atomics; the owner guarantees
// (see `RingProducer::new`) that one thread at a time uses it.
unsafe impl Send for RingProducer {}

impl RingProducer {
    /// A producer handle for the ring at `ctrl` with entries at `entries`.
    ///
    /// # Safety
    /// `ctrl` and `entries` must point to a live ring (`capacity` entries) that outlives the
    /// handle, and only the thread that runs the ring's emitted enqueue stubs may use the
    /// handle.
    pub unsafe fn new(ctrl: *const RingControl, entries: *mut u32) -> RingProducer {
        RingProducer { ctrl, entries }
    }

    /// Enqueues one event from Rust, as the emitted stub does.
    pub fn push(&self, event: u32) {
        let ctrl = self.ctrl();
        self.refill();
        let cursor = ctrl.producer.cursor.load(Ordering::Relaxed);
        let index = ctrl.capacity.wrapping_add(cursor);
        // SAFETY: after `refill` the cursor is below 0, so `index < capacity`, and the slot
        // belongs to the producer's lap, which the consumer has handed back.
        unsafe { self.entries.add(index as usize).write_volatile(event) };
        // Release: the entry is visible before the cursor that covers it.
        ctrl.producer
            .cursor
            .store(cursor.wrapping_add(1), Ordering::Release);
    }

    fn ctrl(&self) -> &RingControl {
        // SAFETY: `new`'s contract keeps the control block alive.
        unsafe { &*self.ctrl }
    }

    /// Whether the producer's lap is full (`cursor == 0`): the next enqueue waits in
    /// [`RingProducer::refill`].
    pub fn lap_full(&self) -> bool {
        self.ctrl().producer.cursor.load(Ordering::Relaxed) == 0
    }

    /// If the producer's lap is full (`cursor == 0`), waits until the consumer has read all of
    /// it and starts the next one; otherwise does nothing. Afterwards at least one event
    /// (a whole lap, after a wrap) can be enqueued.
    pub fn refill(&self) {
        let ctrl = self.ctrl();
        if ctrl.producer.cursor.load(Ordering::Relaxed) != 0 {
            return;
        }
        let cap = ctrl.capacity;
        let laps = ctrl.producer.laps.load(Ordering::Relaxed);
        let lap_end = (laps + 1) * cap;
        let consumed = || {
            ctrl.consumer.tail.load(Ordering::Acquire) == lap_end
                || ctrl.unconsumed.load(Ordering::Relaxed) != 0
        };
        if !consumed() {
            let started = Instant::now();
            // The full lap (cursor 0, stored by the last enqueue) is what a sleeping consumer
            // must learn: wake it rather than wait for its nap to end.
            ctrl.ring_bell();
            while !consumed() {
                // The consumer runs on another core and frees room within microseconds, so
                // spin first; past that, block until it wakes us. On a machine with more
                // runnable threads than cores the consumer may be waiting for this very core:
                // a woken thread runs at once (wake-up preemption), where a spinning one takes
                // the consumer's time and a yielding one waits for the end of another
                // thread's slice.
                if started.elapsed() < SPIN_BEFORE_PARK {
                    std::hint::spin_loop();
                    continue;
                }
                // Dekker with the consumer's `wake_parked`: the flag before the re-check.
                ctrl.producer.parked.store(1, Ordering::SeqCst);
                if !consumed() {
                    ctrl.ring_bell();
                    futex::wait(&ctrl.producer.parked, 1, PARKED_RECHECK);
                }
                ctrl.producer.parked.store(0, Ordering::Relaxed);
            }
            ctrl.producer.waits.fetch_add(1, Ordering::Relaxed);
            ctrl.producer
                .wait_ns
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        // The cursor first, then the lap count: a consumer that sees the new count sees the
        // new cursor too (see `RingControl::head`).
        ctrl.producer
            .cursor
            .store(cap.wrapping_neg(), Ordering::Release);
        ctrl.producer.laps.store(laps + 1, Ordering::Release);
    }

    /// Marks the ring closed: no event will follow. The consumer drains what is left.
    pub fn close(&self) {
        self.ctrl().close();
    }

    /// Marks the ring as one no consumer will read: the producer never waits for room again
    /// (its events are overwritten lap after lap).
    pub fn abandon(&self) {
        self.ctrl().unconsumed.store(1, Ordering::Relaxed);
    }

    /// Reopens a closed ring (a forked child, whose new consumer starts from the current
    /// positions).
    pub fn reopen(&self) {
        self.ctrl().closed.store(0, Ordering::Release);
    }

    /// Wait statistics so far.
    pub fn wait_stats(&self) -> WaitStats {
        self.ctrl().wait_stats()
    }
}

/// How the consumer hands back the cache lines it has read (see [`release_read_lines`]): the
/// cheapest instruction this CPU has that moves a line out of the consumer's core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LineRelease {
    /// `cldemote`: the line moves to a cache both cores share (a hint, made for producer and
    /// consumer handing lines over).
    Demote,
    /// `clflushopt`: written back and dropped from every cache, unordered with other flushes.
    FlushOpt,
    /// `clflush` (SSE2, on every x86-64 CPU): the same, but each flush waits for the one before.
    Flush,
}

impl LineRelease {
    /// The one this CPU has (CPUID leaf 7: ECX bit 25 `cldemote`, EBX bit 23 `clflushopt`),
    /// found once.
    fn of_this_cpu() -> LineRelease {
        static KIND: std::sync::OnceLock<LineRelease> = std::sync::OnceLock::new();
        *KIND.get_or_init(|| {
            use std::arch::x86_64::{__cpuid, __cpuid_count};
            // Leaf 7 is read only where leaf 0 says it exists.
            let leaf7 = (__cpuid(0).eax >= 7).then(|| __cpuid_count(7, 0));
            match leaf7 {
                Some(l) if l.ecx & (1 << 25) != 0 => LineRelease::Demote,
                Some(l) if l.ebx & (1 << 23) != 0 => LineRelease::FlushOpt,
                _ => LineRelease::Flush,
            }
        })
    }
}

/// Moves the lines of `events` (positions `start..end`) that the consumer has now read to
/// their end out of its core's caches ([`LineRelease`]), so that the producer's next lap finds
/// them in no other core's cache. Without it every line the producer writes again is still
/// shared with the consumer's core, and each of the producer's stores waits for that copy to be
/// invalidated: a producer writing an event every 0.6 ns was measured at 2.9 ns an event
/// against 0.8 ns with `clflush` (a C model of the ring on the 2-vCPU AMD EPYC VM; sqlite3
/// under hotpath with `--no-superblocks`, 813 M events: docs/measurements.md). Which
/// instruction matters as much: on an Intel Xeon 2-vCPU VM (it has all three) `clflush` cost
/// the monitor 9.6 ns an event on bench_fib's stream, and `clflushopt` or `cldemote` 1.9–2.0
/// (no flush at all: 1.6–1.7): each `clflush` waits for the write-back of the one before.
/// With a capacity that is a multiple of a line's entries, position `p`'s line starts at
/// `p & !15` in the array (whole cache lines when the array is line-aligned, as the thread
/// area's is; anywhere else the hints only miss their aim).
fn release_read_lines(events: &[u32], start: u64, end: u64, how: LineRelease) {
    let first_line = start & !(LINE_ENTRIES - 1);
    let mut line = first_line;
    while line + LINE_ENTRIES <= end {
        // The line's first entry, which may precede `events` (read in an earlier drain).
        let offset = line as i64 - start as i64;
        let p = events.as_ptr().wrapping_offset(offset as isize);
        // SAFETY: `p` lies in the ring's array (the line holds entries this consumer read, in
        // this drain or the one before); each instruction only moves the line between caches
        // and memory (writing it back where it is dirty), it changes no byte, and `how` was
        // chosen from what CPUID says this CPU has.
        unsafe {
            match how {
                LineRelease::Demote => std::arch::asm!(
                    "cldemote [{0}]",
                    in(reg) p,
                    options(nostack, preserves_flags)
                ),
                LineRelease::FlushOpt => std::arch::asm!(
                    "clflushopt [{0}]",
                    in(reg) p,
                    options(nostack, preserves_flags)
                ),
                LineRelease::Flush => std::arch::x86_64::_mm_clflush(p as *const u8),
            }
        }
        line += LINE_ENTRIES;
    }
}

/// The consumer's handle: drains events in FIFO order.
pub struct RingConsumer {
    ctrl: *const RingControl,
    entries: *const u32,
}

// SAFETY: the consumer only reads entries the producer has written (Acquire on `cursor`) and
// writes only `tail`; `new`'s contract keeps the memory alive.
unsafe impl Send for RingConsumer {}

impl RingConsumer {
    /// A consumer for the ring whose control block is at `ctrl` and entries at `entries`.
    ///
    /// # Safety
    /// Both must point to live memory of a ring (with `capacity` entries) that outlives the
    /// handle, and only one consumer may exist per ring.
    pub unsafe fn new(ctrl: *const RingControl, entries: *const u32) -> RingConsumer {
        RingConsumer { ctrl, entries }
    }

    fn ctrl(&self) -> &RingControl {
        // SAFETY: see `new`.
        unsafe { &*self.ctrl }
    }

    /// Hands written events to `sink` in FIFO order, as contiguous slices of the array, then
    /// frees their slots. Returns the number of events drained.
    ///
    /// With `all == false` it drains only when at least [`batch`](Self::batch) events wait or
    /// the producer's lap is full (it waits for this drain), and otherwise stops at a
    /// cache-line boundary: reading the line the producer is still filling would bounce it
    /// between the two cores at every event. With `all == true` (the producer has closed the
    /// ring) it drains everything.
    pub fn drain(&mut self, all: bool, mut sink: impl FnMut(&[u32])) -> u64 {
        let ctrl = self.ctrl();
        let cap = ctrl.capacity;
        let (mut head, lap_full) = ctrl.head();
        let mut tail = ctrl.consumer.tail.load(Ordering::Relaxed);
        if head <= tail {
            return 0;
        }
        if !all && !lap_full {
            if head - tail < self.batch() {
                return 0;
            }
            let line_start = head & !(LINE_ENTRIES - 1);
            if line_start > tail && line_start - tail >= self.batch() {
                head = line_start;
            }
        }
        let start = tail;
        let how = LineRelease::of_this_cpu();
        while tail < head {
            let index = tail % cap;
            let len = (head - tail).min(cap - index);
            // SAFETY: the range is inside the array and was written before the cursor we
            // loaded (Acquire); the producer does not write it again until we store a `tail`
            // past the end of its lap.
            let events = unsafe {
                std::slice::from_raw_parts(self.entries.add(index as usize), len as usize)
            };
            sink(events);
            if cap >= LINE_ENTRIES {
                release_read_lines(events, tail, tail + len, how);
            }
            tail += len;
        }
        ctrl.consumer.tail.store(tail, Ordering::Release);
        self.wake_parked();
        tail - start
    }

    /// Wakes the producer if it blocked waiting for room (after a store of `tail`).
    fn wake_parked(&self) {
        let ctrl = self.ctrl();
        // Dekker with `RingProducer::refill`: the tail before the flag.
        fence(Ordering::SeqCst);
        if ctrl.producer.parked.load(Ordering::Relaxed) != 0 {
            futex::wake(&ctrl.producer.parked, 1);
        }
    }

    /// Makes the producer ring `bell` when its lap is full (the consumer sleeps on it).
    pub fn set_bell(&self, bell: &'static Doorbell) {
        self.ctrl()
            .consumer
            .bell
            .store(bell.addr(), Ordering::Release);
    }

    /// True when the producer waits for this consumer (its lap is full and unread) or has
    /// closed the ring: drain it now.
    pub fn urgent(&self) -> bool {
        let ctrl = self.ctrl();
        let (head, lap_full) = ctrl.head();
        (lap_full && head > ctrl.consumer.tail.load(Ordering::Relaxed)) || self.is_closed()
    }

    /// Events the producer can still write before it must wait for this consumer: the rest of
    /// its lap (0 when the lap is full).
    pub fn room(&self) -> u64 {
        self.ctrl()
            .producer
            .cursor
            .load(Ordering::Relaxed)
            .wrapping_neg()
    }

    /// Fewest waiting events worth a drain: a quarter of the ring, at most [`MAX_BATCH`].
    pub fn batch(&self) -> u64 {
        (self.ctrl().capacity / 4).clamp(1, MAX_BATCH)
    }

    /// How long and how often the producer waited for room so far.
    pub fn wait_stats(&self) -> WaitStats {
        self.ctrl().wait_stats()
    }

    /// Lets go of a closed, drained ring: its memory may serve another producer.
    pub fn release(self) {
        self.ctrl().consumer.released.store(1, Ordering::Release);
    }

    /// True once the producer has closed the ring (drain once more after seeing it).
    pub fn is_closed(&self) -> bool {
        self.ctrl().closed.load(Ordering::Acquire) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes `n` events through a ring of `cap` entries to a consumer on another thread that
    /// pauses for `pause` after every `pause_every`-th poll (so that it is sometimes a whole lap
    /// behind, sometimes right behind the producer) and returns what the consumer saw.
    fn run_ring(cap: u64, n: u32, pause_every: u32, pause: Duration) -> Vec<u32> {
        let ctrl = Box::leak(Box::new(RingControl::new(cap)));
        let entries: &'static mut [u32] = Box::leak(vec![0u32; cap as usize].into_boxed_slice());
        let entries_ptr = entries.as_mut_ptr();
        // SAFETY: both are leaked, so they outlive the handles; one consumer.
        let mut cons = unsafe { RingConsumer::new(ctrl, entries_ptr) };
        let entries_ptr = entries_ptr as usize as *mut u32;
        let ctrl_addr = ctrl as *const RingControl as usize;
        let consumer = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for poll in 1.. {
                let closed = cons.is_closed();
                cons.drain(false, |ids| seen.extend_from_slice(ids));
                if closed {
                    cons.drain(true, |ids| seen.extend_from_slice(ids));
                    return seen;
                }
                if poll % pause_every == 0 {
                    std::thread::sleep(pause);
                }
            }
            unreachable!()
        });
        // SAFETY: leaked control block; this thread is the only producer.
        let prod = unsafe { RingProducer::new(ctrl_addr as *const RingControl, entries_ptr) };
        for id in 0..n {
            prod.push(id);
        }
        prod.close();
        consumer.join().unwrap()
    }

    #[test]
    fn fifo_across_threads_without_loss() {
        for cap in [4u64, 8, 64] {
            for (pause_every, pause) in [(u32::MAX, Duration::ZERO), (7, Duration::from_micros(20))]
            {
                let n = 20_000u32;
                let seen = run_ring(cap, n, pause_every, pause);
                assert_eq!(seen.len(), n as usize, "capacity {cap}");
                assert!(seen.iter().enumerate().all(|(i, &id)| i as u32 == id));
            }
        }
    }

    #[test]
    fn positions_survive_many_laps() {
        // 4096 laps of a 16-entry ring, with the consumer sometimes asleep for a whole lap.
        let n = 65_536u32;
        let seen = run_ring(16, n, 3, Duration::from_micros(5));
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn a_full_lap_wakes_a_sleeping_consumer() {
        // A consumer that only sleeps on its doorbell (with a timeout far longer than a lap
        // takes): every wake-up must come from the producer's full lap or its close, never
        // from the timeout, and nothing may be lost.
        const TIMEOUT: Duration = Duration::from_secs(2);
        let cap = 4u64;
        let ctrl = Box::leak(Box::new(RingControl::new(cap)));
        let entries: &'static mut [u32] = Box::leak(vec![0u32; cap as usize].into_boxed_slice());
        let entries_ptr = entries.as_mut_ptr();
        // SAFETY: both are leaked, so they outlive the handles; one consumer.
        let mut cons = unsafe { RingConsumer::new(ctrl, entries_ptr) };
        let bell = Doorbell::leak();
        cons.set_bell(bell);
        let entries_addr = entries_ptr as usize;
        let ctrl_addr = ctrl as *const RingControl as usize;
        let consumer = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut longest = Duration::ZERO;
            loop {
                let closed = cons.is_closed();
                cons.drain(true, |ids| seen.extend_from_slice(ids));
                if closed {
                    return (seen, longest);
                }
                bell.prepare();
                if cons.urgent() {
                    bell.awake();
                } else {
                    let slept = Instant::now();
                    bell.sleep(TIMEOUT);
                    longest = longest.max(slept.elapsed());
                }
            }
        });
        // SAFETY: leaked control block; this thread is the only producer.
        let prod =
            unsafe { RingProducer::new(ctrl_addr as *const RingControl, entries_addr as *mut u32) };
        let n = 64u32;
        for id in 0..n {
            prod.push(id);
        }
        prod.close();
        let (seen, longest) = consumer.join().unwrap();
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
        assert!(longest < TIMEOUT, "a sleep ran to its timeout: {longest:?}");
    }
}
