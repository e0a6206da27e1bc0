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
//! Positions are indices in `[0, capacity]`; `capacity` is a power of two. One slot always
//! stays empty, so `head == tail` means empty.
//!
//! * The **producer** (emitted code of one guest thread, and that thread's Rust code when it
//!   refills) owns `head` and `budget`, on a cache line no other thread reads. Each event: if
//!   `budget == 0` leave the code cache and call [`RingProducer::refill`]; else
//!   `budget -= 1; entries[head] = id; head += 1`. `budget` never lets `head` pass `capacity`
//!   nor catch up with `tail - 1`, and is at most `capacity / REFILL_FRACTION`; at
//!   `head == capacity` the refill wraps `head` to 0.
//! * The producer **publishes** by copying `head` into `published` (its own cache line) with a
//!   `Release` store: at every refill, every event pushed from Rust, and on close. Publishing
//!   in chunks, not per event, is what keeps the consumer's polling off the line the stub
//!   writes at every block (each poll would otherwise cost the guest a cache-line transfer).
//! * The **consumer** (the monitor thread) owns `tail`. It loads `published` with `Acquire`,
//!   reads entries from `tail` up to it (wrapping `tail` from `capacity` to 0), then stores
//!   `tail` with `Release`, which hands the slots back.
//!
//! Nothing is ever dropped: a producer with no room waits (spin with crossbeam's `Backoff`,
//! then sleep in short naps) until the consumer frees room; the wait is counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam::utils::Backoff;

/// A refill waits until at least `capacity / REFILL_FRACTION` slots are free (or the end of
/// the array is reached), so that a consumer running behind does not make the producer leave
/// the code cache once per event.
pub const REFILL_FRACTION: u64 = 8;

/// How long a producer waiting for room spins before it sleeps.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_millis(2);

/// Events per 64-byte cache line.
const LINE_ENTRIES: u64 = 16;

/// Most events the consumer waits for before it drains (16 KiB of entries): large batches
/// keep the consumer off the cache lines the producer is writing.
pub const MAX_BATCH: u64 = 4096;

/// The producer's cache line: written by the guest thread only.
#[repr(C, align(128))]
pub struct ProducerSide {
    /// Position one past the last published entry, in `[0, capacity]`.
    pub head: AtomicU64,
    /// Events the stub may still enqueue before it must call [`RingProducer::refill`].
    pub budget: AtomicU64,
    /// Number of times the producer found the ring full and waited.
    pub waits: AtomicU64,
    /// Total time spent waiting for room, in nanoseconds.
    pub wait_ns: AtomicU64,
}

/// The producer's published position: written by the guest thread's Rust code, read by the
/// monitor.
#[repr(C, align(128))]
pub struct PublishedSide {
    /// A copy of `producer.head` as of the last publication: entries before it are readable.
    pub head: AtomicU64,
}

/// The consumer's cache line: written by the monitor thread only.
#[repr(C, align(128))]
pub struct ConsumerSide {
    /// Position of the next entry to read, in `[0, capacity]`.
    pub tail: AtomicU64,
    /// Events consumed in all (a free-running counter, for statistics).
    pub consumed: AtomicU64,
}

/// Control block of one ring. Shared by one producer thread and one consumer thread.
#[repr(C)]
pub struct RingControl {
    /// Written by the producer only; read by nobody else.
    pub producer: ProducerSide,
    /// Written by the producer only, read by the consumer.
    pub published: PublishedSide,
    /// Written by the consumer only.
    pub consumer: ConsumerSide,
    /// Number of entries; a power of two, immutable after creation.
    pub capacity: u64,
    /// Set to 1 by the producer (Release) once it will publish no more events.
    pub closed: AtomicU64,
}

impl RingControl {
    /// Byte offset of `producer.head` in the control block (read and written by the stub).
    pub const HEAD_OFFSET: usize =
        std::mem::offset_of!(RingControl, producer) + std::mem::offset_of!(ProducerSide, head);
    /// Byte offset of `producer.budget` in the control block (read and written by the stub).
    pub const BUDGET_OFFSET: usize =
        std::mem::offset_of!(RingControl, producer) + std::mem::offset_of!(ProducerSide, budget);

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
                head: AtomicU64::new(0),
                budget: AtomicU64::new(0),
                waits: AtomicU64::new(0),
                wait_ns: AtomicU64::new(0),
            },
            published: PublishedSide {
                head: AtomicU64::new(0),
            },
            consumer: ConsumerSide {
                tail: AtomicU64::new(0),
                consumed: AtomicU64::new(0),
            },
            capacity,
            closed: AtomicU64::new(0),
        }
    }

    /// Empties the ring (a forked child's, for its new consumer).
    pub fn reset(&self) {
        self.producer.head.store(0, Ordering::Relaxed);
        self.producer.budget.store(0, Ordering::Relaxed);
        self.published.head.store(0, Ordering::Relaxed);
        self.consumer.tail.store(0, Ordering::Relaxed);
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

/// The producer's Rust-side handle: refills the stub's budget.
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

    /// Enqueues one event from Rust, as the emitted stub does, and publishes it.
    pub fn push(&self, event: u32) {
        let ctrl = self.ctrl();
        if ctrl.producer.budget.load(Ordering::Relaxed) == 0 {
            self.refill();
        }
        ctrl.producer.budget.fetch_sub(1, Ordering::Relaxed);
        let head = ctrl.producer.head.load(Ordering::Relaxed);
        // SAFETY: a budget of at least one guarantees `head < capacity` and a free slot.
        unsafe { self.entries.add(head as usize).write_volatile(event) };
        ctrl.producer.head.store(head + 1, Ordering::Relaxed);
        self.publish();
    }

    /// Makes every event enqueued so far readable by the consumer.
    pub fn publish(&self) {
        let ctrl = self.ctrl();
        let head = ctrl.producer.head.load(Ordering::Relaxed);
        // Release: the entries were stored before (by this thread, in the stub or `push`).
        ctrl.published.head.store(head, Ordering::Release);
    }

    fn ctrl(&self) -> &RingControl {
        // SAFETY: `new`'s contract keeps the control block alive.
        unsafe { &*self.ctrl }
    }

    /// Makes room for at least one event: wraps `head` at the end of the array, waits while
    /// the ring is full, and sets `budget` to the number of events the stub may write before
    /// it must call again (at least 1).
    pub fn refill(&self) {
        let ctrl = self.ctrl();
        let cap = ctrl.capacity;
        let mut head = ctrl.producer.head.load(Ordering::Relaxed);
        if head == cap {
            // The consumer treats a tail of `capacity` as 0, so publishing 0 here is safe.
            head = 0;
            ctrl.producer.head.store(0, Ordering::Relaxed);
        }
        self.publish();
        // Wait for a worthwhile amount of room, not one slot: each refill costs the guest a
        // trip out of the code cache, so refilling a nearly full ring slot by slot would cost
        // far more than waiting for the consumer to catch up.
        let want = (cap / REFILL_FRACTION).clamp(1, cap - head);
        let mut budget = self.room(head);
        if budget < want {
            let started = Instant::now();
            let backoff = Backoff::new();
            while budget < want {
                // The consumer runs on another core and frees room within microseconds; a
                // sleep would oversleep by tens of them, so spin first and sleep only when the
                // consumer seems stalled.
                if !backoff.is_completed() {
                    backoff.snooze();
                } else if started.elapsed() < SPIN_BEFORE_SLEEP {
                    std::hint::spin_loop();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
                budget = self.room(head);
            }
            ctrl.producer.waits.fetch_add(1, Ordering::Relaxed);
            ctrl.producer
                .wait_ns
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        // At most a chunk: the consumer sees events only when they are published.
        ctrl.producer
            .budget
            .store(budget.min(want), Ordering::Relaxed);
    }

    /// Slots the producer at `head` may fill now without wrapping: free slots (keeping one
    /// empty), capped at the end of the array.
    fn room(&self, head: u64) -> u64 {
        let ctrl = self.ctrl();
        let cap = ctrl.capacity;
        let tail = ctrl.consumer.tail.load(Ordering::Acquire) % cap;
        let occupied = head.wrapping_sub(tail) & (cap - 1);
        let free = cap - 1 - occupied;
        free.min(cap - head)
    }

    /// Marks the ring closed: no event will follow. The consumer drains what is left.
    pub fn close(&self) {
        let ctrl = self.ctrl();
        ctrl.producer.budget.store(0, Ordering::Relaxed);
        self.publish();
        ctrl.closed.store(1, Ordering::Release);
    }

    /// Reopens a closed ring (a forked child, whose new consumer starts from the current
    /// positions).
    pub fn reopen(&self) {
        self.ctrl().closed.store(0, Ordering::Release);
    }

    /// Wait statistics so far.
    pub fn wait_stats(&self) -> WaitStats {
        let p = &self.ctrl().producer;
        WaitStats {
            waits: p.waits.load(Ordering::Relaxed),
            wait_ns: p.wait_ns.load(Ordering::Relaxed),
        }
    }
}

/// The consumer's handle: drains events in FIFO order.
pub struct RingConsumer {
    ctrl: *const RingControl,
    entries: *const u32,
}

// SAFETY: the consumer only reads entries the producer has published (Acquire on `head`) and
// writes only `tail`/`consumed`; `new`'s contract keeps the memory alive.
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

    /// Hands published events to `sink` in FIFO order, as at most two contiguous slices (the
    /// second when the events wrap around the end of the array), then frees their slots.
    /// Returns the number of events drained.
    ///
    /// With `all == false` it drains only when at least [`batch`](Self::batch) events wait, and
    /// stops at a cache-line boundary: reading the line the producer is still filling would
    /// bounce it between the two cores at every event. With `all == true` (the producer has
    /// closed the ring) it drains everything.
    pub fn drain(&mut self, all: bool, mut sink: impl FnMut(&[u32])) -> u64 {
        let ctrl = self.ctrl();
        let cap = ctrl.capacity;
        let mut head = ctrl.published.head.load(Ordering::Acquire);
        let mut tail = ctrl.consumer.tail.load(Ordering::Relaxed);
        if !all {
            let waiting = (head % cap).wrapping_sub(tail % cap) & (cap - 1);
            if waiting < self.batch() {
                return 0;
            }
            let line_start = head & !(LINE_ENTRIES - 1);
            if head > tail && line_start > tail && line_start - tail >= self.batch() {
                head = line_start;
            }
        }
        let mut n = 0;
        loop {
            if tail == cap {
                if head == cap {
                    break;
                }
                tail = 0;
            }
            if tail == head {
                break;
            }
            // Entries [tail, end) are published: up to head, or to the end of the array when
            // the producer has wrapped.
            let end = if head > tail { head } else { cap };
            // SAFETY: the range is inside the array and was published before `head` (Acquire);
            // the producer does not write it until we store a `tail` past it.
            let events = unsafe {
                std::slice::from_raw_parts(self.entries.add(tail as usize), (end - tail) as usize)
            };
            sink(events);
            n += end - tail;
            tail = end;
        }
        if n > 0 {
            ctrl.consumer.tail.store(tail, Ordering::Release);
            ctrl.consumer.consumed.fetch_add(n, Ordering::Relaxed);
        }
        n
    }

    /// Fewest waiting events worth a drain: a quarter of the ring, at most [`MAX_BATCH`].
    pub fn batch(&self) -> u64 {
        (self.ctrl().capacity / 4).clamp(1, MAX_BATCH)
    }

    /// True once the producer has closed the ring (drain once more after seeing it).
    pub fn is_closed(&self) -> bool {
        self.ctrl().closed.load(Ordering::Acquire) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_across_threads_without_loss() {
        for cap in [4u64, 8, 64] {
            let ctrl = Box::leak(Box::new(RingControl::new(cap)));
            let entries: &'static mut [u32] =
                Box::leak(vec![0u32; cap as usize].into_boxed_slice());
            let entries_ptr = entries.as_mut_ptr();
            // SAFETY: both are leaked, so they outlive the handles; one consumer.
            let mut cons = unsafe { RingConsumer::new(ctrl, entries_ptr) };
            let entries_ptr = entries_ptr as usize as *mut u32;
            let ctrl_addr = ctrl as *const RingControl as usize;
            let consumer = std::thread::spawn(move || {
                let mut seen = Vec::new();
                loop {
                    let closed = cons.is_closed();
                    cons.drain(false, |ids| seen.extend_from_slice(ids));
                    if closed {
                        cons.drain(true, |ids| seen.extend_from_slice(ids));
                        return seen;
                    }
                }
            });
            // SAFETY: leaked control block; this thread is the only producer.
            let prod = unsafe { RingProducer::new(ctrl_addr as *const RingControl, entries_ptr) };
            let n = 20_000u32;
            for id in 0..n {
                prod.push(id);
            }
            prod.close();
            let seen = consumer.join().unwrap();
            assert_eq!(seen.len(), n as usize, "capacity {cap}");
            assert!(seen.iter().enumerate().all(|(i, &id)| i as u32 == id));
        }
    }
}
