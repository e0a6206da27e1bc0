//! Code that writes code: guest pages that are writable when their code is translated are
//! write-protected, and the first write to one (a JIT emitting into an RWX page) invalidates
//! the translations before the guest runs code from the page again (DynamoRIO's approach).
//!
//! # How a write is caught
//!
//! Translating a block from a page the guest may write (its protection has `PROT_WRITE`)
//! takes `PROT_WRITE` away in the kernel, remembering the guest's protection. A guest store to
//! the page then faults; hotpath's signal handler recognises the page (SEGV_ACCERR in the
//! [`ProtectedPages`] set), gives the page its guest protection back, records it for the
//! dispatcher and sends the thread out of the code cache at its next block boundary (as for
//! an asynchronous signal), then lets the store run again. The dispatcher discards the
//! translations before it runs anything else. Programs that never execute writable memory
//! (nearly all: code pages are read-only) pay nothing.
//!
//! A system call that writes into such a page (a `read` into a JIT buffer) would fail with
//! EFAULT in the kernel instead of faulting: `linux::kernel_writes` gives the pages of the
//! buffers such calls fill their protection back before the call (and handles writes through
//! `/proc/self/mem` and `madvise`); for calls it does not know, the dispatcher gives every
//! protected page its protection back after an EFAULT and makes the call again.
//!
//! Stores into the block that is running take effect at the end of that block (the rest of
//! the block runs as translated), not at the next instruction as on hardware.
//!
//! # Threads
//!
//! The pages and the caught writes are the process's; every thread's code cache may hold
//! translations from a page. A page leaves the set only where its protection changes: when
//! a dispatcher takes its caught write ([`ProtectedPages::take_hits`], under the lock the
//! handlers record writes under), or right after the guest's own system call changes it.
//! The other threads discard the page's translations later, and may by then have translated
//! code from it again and protected it anew: they must not forget it (a page left
//! write-protected and unknown made another thread's next write a SIGSEGV: a JIT compiling
//! on one thread for another, as node's does).
//!
//! The handler that catches a write also sends every other live thread out of the code cache
//! ([`ProtectedPages::peers`]) before the store runs again, so that none enters a translation
//! of the page after the store (a thread that sees a flag the writer sets after its code
//! runs the new code, as on hardware). Each dispatcher looks for caught writes before it runs
//! translated code; one that finds none while another dispatcher has taken some and not yet
//! published them waits for them ([`ProtectedPages::wait_published`]). Only a translation
//! already running (the rest of a block, or of a superblock run) goes on with the old code.
//!
//! Two threads may store into one page at once: the second store's fault can reach its
//! handler after the first handler gave the page its protection back and a dispatcher forgot
//! the page. Pages are given their protection back before they leave the set, and remembered
//! for a while after (`Released`), so that such a fault is known as stale and its store runs
//! again instead of reaching the guest as SIGSEGV.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::host::syscall::raw_syscall;

const PAGE: u64 = 4096;

/// The lock of a [`ProtectedPages`], held (see [`ProtectedPages::try_hold`]).
pub struct PagesHold<'a> {
    pages: &'a ProtectedPages,
}

impl Drop for PagesHold<'_> {
    fn drop(&mut self) {
        self.pages.lock.store(false, Ordering::Release);
    }
}

/// Most write faults the handler can record between two visits of the dispatcher (a block
/// can store to few pages; more than this only flushes the cache a second time).
const MAX_HITS: usize = 16;

/// Most threads the handler sends out of the code cache itself when it catches a write
/// ([`ProtectedPages::peers`]); the threads of a process with more live at once are sent when
/// the write is published, as the others' dispatchers read it.
const MAX_PEERS: usize = 1024;

/// Pages recently taken out of [`ProtectedPages`] with their guest protection (which lets
/// the guest write) given back in the kernel first: a write fault on one of them happened
/// while hotpath still had it write-protected, and its handler came after another thread's
/// (two threads storing into one page of code: the first handler gives the page back, its
/// dispatcher forgets it, and the second handler, which waited for the lock, found the page
/// unknown and delivered SIGSEGV to the guest — a JVM's compiler threads writing their code
/// heap died so). Such a store only needs to run again. An entry goes as soon as the page's
/// protection changes again (hotpath protects it anew, or the guest's own system call
/// changes it), so a fault on a page listed here is always stale. A fixed ring: the handler
/// cannot allocate, and a stale fault's handler is at most one lock hold behind.
struct Released {
    pages: [u64; RELEASED],
    next: usize,
}

/// Pages [`Released`] remembers.
const RELEASED: usize = 64;

/// Marks a free [`Released`] entry (not a page address: pages are 4 KiB aligned).
const NO_PAGE: u64 = u64::MAX;

impl Default for Released {
    fn default() -> Released {
        Released {
            pages: [NO_PAGE; RELEASED],
            next: 0,
        }
    }
}

impl Released {
    fn note(&mut self, page: u64) {
        self.pages[self.next % RELEASED] = page;
        self.next = self.next.wrapping_add(1);
    }

    fn contains(&self, page: u64) -> bool {
        self.pages.contains(&page)
    }

    /// Drops the entries in `[start, end)`.
    fn drop_range(&mut self, start: u64, end: u64) {
        for p in self.pages.iter_mut() {
            if *p != NO_PAGE && *p >= start && *p < end {
                *p = NO_PAGE;
            }
        }
    }
}

/// What [`ProtectedPages::catch_write`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaughtWrite {
    /// A store to a page hotpath write-protected: it has its protection back and is recorded;
    /// the store can run again.
    Caught,
    /// A store that faulted while another thread was giving the page its protection back
    /// ([`Released`]): it can run again, nothing else to do.
    Stale,
    /// Not hotpath's: the guest's own fault.
    No,
}

/// The write-protected pages and the writes the handler caught.
///
/// One per process. Who touches what: dispatchers insert and remove pages, and host signal
/// handlers read them, under `lock` (a spin lock: a handler runs only on faults inside
/// translated code, so never on a thread whose dispatcher holds the lock, and another
/// thread's dispatcher holds it briefly); handlers append to `hits`, which dispatchers drain.
pub struct ProtectedPages {
    /// Held while `pages` is read or changed.
    lock: std::sync::atomic::AtomicBool,
    /// Page address → the guest's protection (`PROT_*`) of it.
    pages: std::cell::UnsafeCell<BTreeMap<u64, i32>>,
    /// Pages given their guest protection back lately (under `lock`; see [`Released`]).
    released: std::cell::UnsafeCell<Released>,
    /// Pages whose protection the handler gave back, waiting for the dispatcher.
    hits: [AtomicU64; MAX_HITS],
    hit_count: AtomicUsize,
    /// A write came that `hits` had no room for: discard everything protected.
    overflow: std::sync::atomic::AtomicBool,
    /// Writes a dispatcher has taken (`take_hits`) and not yet published to the other
    /// threads (`published`): a dispatcher that finds no write to take waits for these
    /// before it runs translated code (see the module doc).
    taken: AtomicUsize,
    /// The live threads' handler states, opaque here (the signal handler's `HandlerShared`,
    /// `'static`), in no order, null where free: whom a caught write sends out of the code
    /// cache before the store runs again.
    peers: [std::sync::atomic::AtomicPtr<()>; MAX_PEERS],
}

// SAFETY: see the type's doc: the map is touched only under `lock`; the rest is atomic.
unsafe impl Sync for ProtectedPages {}

impl Default for ProtectedPages {
    fn default() -> ProtectedPages {
        ProtectedPages {
            lock: std::sync::atomic::AtomicBool::new(false),
            pages: std::cell::UnsafeCell::new(BTreeMap::new()),
            released: std::cell::UnsafeCell::new(Released::default()),
            hits: std::array::from_fn(|_| AtomicU64::new(0)),
            hit_count: AtomicUsize::new(0),
            overflow: std::sync::atomic::AtomicBool::new(false),
            taken: AtomicUsize::new(0),
            peers: std::array::from_fn(|_| std::sync::atomic::AtomicPtr::new(std::ptr::null_mut())),
        }
    }
}

impl ProtectedPages {
    /// In the signal handler, for a write fault (SEGV_ACCERR) at guest address `addr`: if its
    /// page is one hotpath protected, gives it the guest's protection back, records it and
    /// returns true (the store can run again).
    ///
    /// # Safety
    /// Only from the host signal handler of a guest thread, for a fault in translated code
    /// (so that thread's dispatcher does not hold the lock).
    pub unsafe fn catch_write(&self, addr: u64) -> CaughtWrite {
        let page = addr & !(PAGE - 1);
        // Under the lock: the handlers of two threads writing at once each record their page
        // (a hit lost would leave its page writable with its translations in place).
        self.with_all(|m, released| {
            let Some(&prot) = m.get(&page) else {
                return match released.contains(page) {
                    true => CaughtWrite::Stale,
                    false => CaughtWrite::No,
                };
            };
            raw_syscall(10, &[page, PAGE, prot as u64, 0, 0, 0]);
            let i = self.hit_count.load(Ordering::Relaxed);
            if i < MAX_HITS {
                self.hits[i].store(page, Ordering::Relaxed);
                self.hit_count.store(i + 1, Ordering::Release);
            } else {
                self.overflow.store(true, Ordering::Release);
            }
            CaughtWrite::Caught
        })
    }

    /// Takes the lock if it is free (for a `fork`, which must not copy it held by a thread the
    /// child will not have); it is released when the hold is dropped.
    pub fn try_hold(&self) -> Option<PagesHold<'_>> {
        self.lock
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| PagesHold { pages: self })
    }

    /// Runs `f` on the page map under the lock.
    fn with_map<R>(&self, f: impl FnOnce(&mut BTreeMap<u64, i32>) -> R) -> R {
        self.with_all(|pages, _| f(pages))
    }

    /// Runs `f` on the page map and the released pages under the lock.
    fn with_all<R>(&self, f: impl FnOnce(&mut BTreeMap<u64, i32>, &mut Released) -> R) -> R {
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: holding the lock; `f` cannot reach the map or the ring otherwise.
        let r = f(unsafe { &mut *self.pages.get() }, unsafe {
            &mut *self.released.get()
        });
        self.lock.store(false, Ordering::Release);
        r
    }

    /// Write-protects the pages of `[start, end)` that `prot_of` says the guest may write,
    /// remembering their protection. A page the kernel refuses to protect stays as it is
    /// (its code is then not watched).
    pub fn protect(&self, start: u64, end: u64, mut prot_of: impl FnMut(u64) -> Option<i32>) {
        self.with_all(|pages, released| {
            let mut page = start & !(PAGE - 1);
            while page < end {
                if let std::collections::btree_map::Entry::Vacant(slot) = pages.entry(page) {
                    if let Some(prot) = prot_of(page).filter(|p| p & libc::PROT_WRITE != 0) {
                        let r = raw_syscall(
                            10,
                            &[page, PAGE, (prot & !libc::PROT_WRITE) as u64, 0, 0, 0],
                        );
                        if r == 0 {
                            slot.insert(prot);
                            // A fault on it is no longer stale.
                            released.drop_range(page, page + PAGE);
                        }
                    }
                }
                page += PAGE;
            }
        })
    }

    /// The guest's protection of `page` if hotpath write-protected it to watch its code.
    pub fn guest_prot(&self, page: u64) -> Option<i32> {
        self.with_map(|pages| pages.get(&(page & !(PAGE - 1))).copied())
    }

    /// Forgets the pages of `[start, end)` (the guest changed their mapping or protection
    /// itself; the kernel's protection is now the guest's).
    pub fn forget(&self, start: u64, end: u64) {
        self.with_all(|pages, released| {
            let inside: Vec<u64> = pages
                .range(start & !(PAGE - 1)..end)
                .map(|(&p, _)| p)
                .collect();
            for p in inside {
                pages.remove(&p);
            }
            // The guest's protection there is its own now: a fault is its own.
            released.drop_range(start & !(PAGE - 1), end);
        })
    }

    /// Adds a live thread's handler state to [`Self::peers`] (nothing if they are full).
    pub fn join(&self, peer: *const ()) {
        for slot in &self.peers {
            if slot
                .compare_exchange(
                    std::ptr::null_mut(),
                    peer as *mut (),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return;
            }
        }
    }

    /// Takes an ended thread's handler state out of [`Self::peers`].
    pub fn leave(&self, peer: *const ()) {
        for slot in &self.peers {
            let _ = slot.compare_exchange(
                peer as *mut (),
                std::ptr::null_mut(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// In a child after `fork`: `me` is the only thread; no write is being published.
    pub fn after_fork_child(&self, me: *const ()) {
        for slot in &self.peers {
            slot.store(std::ptr::null_mut(), Ordering::Relaxed);
        }
        self.join(me);
        self.taken.store(0, Ordering::Release);
    }

    /// The live threads' handler states (opaque: see the field), for the handler that caught
    /// a write to send out of the code cache.
    pub fn peers(&self) -> impl Iterator<Item = *const ()> + '_ {
        self.peers
            .iter()
            .map(|p| p.load(Ordering::Acquire) as *const ())
            .filter(|p| !p.is_null())
    }

    /// After the writes [`Self::take_hits`] returned were published to every thread.
    pub fn published(&self) {
        self.taken.fetch_sub(1, Ordering::AcqRel);
    }

    /// Waits until no dispatcher holds writes it took and has not published; true if one
    /// did (read the published invalidations again before running translated code).
    pub fn wait_published(&self) -> bool {
        if self.taken.load(Ordering::Acquire) == 0 {
            return false;
        }
        while self.taken.load(Ordering::Acquire) != 0 {
            std::thread::yield_now();
        }
        true
    }

    /// Takes the writes the handler caught: the page ranges whose translations must go.
    /// From the dispatcher, between runs of translated code; where it returns some, the
    /// dispatcher calls [`Self::published`] once it has published them.
    pub fn take_hits(&self) -> Vec<(u64, u64)> {
        // The dispatcher asks at every entry: a load, no store, when nothing was caught.
        if self.hit_count.load(Ordering::Acquire) == 0 && !self.overflow.load(Ordering::Acquire) {
            return Vec::new();
        }
        // The pages are read and forgotten under the lock the handlers record them under: a
        // page written again after this is protected again first (and caught again).
        let (mut out, overflow) = self.with_all(|pages, released| {
            // Counted as taken before the count goes back to 0: a dispatcher whose check above
            // finds no write left must find this one taken and wait for it to be published
            // (`wait_published`). Counted after, a reader in between saw neither and ran the
            // replaced translation (`jitversions` called an older version 1-15 % of runs).
            self.taken.fetch_add(1, Ordering::AcqRel);
            let n = self.hit_count.swap(0, Ordering::AcqRel);
            let out: Vec<(u64, u64)> = self.hits[..n]
                .iter()
                .map(|h| {
                    let p = h.load(Ordering::Relaxed);
                    // The handler gave it its protection back; a fault from before that may
                    // still be waiting for the lock.
                    if pages.remove(&p).is_some() {
                        released.note(p);
                    }
                    (p, p + PAGE)
                })
                .collect();
            let overflow = self.overflow.swap(false, Ordering::AcqRel);
            if out.is_empty() && !overflow {
                self.taken.fetch_sub(1, Ordering::AcqRel);
            }
            (out, overflow)
        });
        if overflow {
            out.extend(self.unprotect_all());
        }
        out
    }

    /// Gives the protected pages of `[start, end)` (guest addresses, bytes) their guest
    /// protection back and forgets them; returns their page ranges, whose translations must
    /// go. For a system call that will change their contents without a store the write fault
    /// could catch (the kernel writes into a buffer there, zaps the pages): the call then
    /// finds them as the guest left them, and their code is translated (and the pages
    /// protected) again afterwards. A range outside every protected page costs the lock only.
    pub fn unprotect_range(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        // Each page is given its protection back before it leaves the set, under the lock: a
        // handler that finds it gone then knows its fault is stale ([`Released`]).
        self.with_all(|pages, released| {
            let inside: Vec<(u64, i32)> = pages
                .range(start & !(PAGE - 1)..end)
                .map(|(&p, &prot)| (p, prot))
                .collect();
            inside
                .into_iter()
                .map(|(page, prot)| {
                    raw_syscall(10, &[page, PAGE, prot as u64, 0, 0, 0]);
                    pages.remove(&page);
                    released.note(page);
                    (page, page + PAGE)
                })
                .collect()
        })
    }

    /// True if any page is protected.
    pub fn any(&self) -> bool {
        self.with_map(|m| !m.is_empty())
    }

    /// Gives every protected page its guest protection back; returns their ranges (whose
    /// translations must go).
    pub fn unprotect_all(&self) -> Vec<(u64, u64)> {
        // As `unprotect_range`: protection first, under the lock.
        self.with_all(|pages, released| {
            std::mem::take(pages)
                .into_iter()
                .map(|(page, prot)| {
                    raw_syscall(10, &[page, PAGE, prot as u64, 0, 0, 0]);
                    released.note(page);
                    (page, page + PAGE)
                })
                .collect()
        })
    }
}

/// Most stale ranges remembered between two reads of `/proc/self/maps`; more make the whole
/// cache stale.
const MAX_STALE_RANGES: usize = 64;

/// The kernel's protection of guest pages, read from `/proc/self/maps` and read again when a
/// page asked about may have changed: it lies in a range the guest mapped, unmapped,
/// reprotected, remapped or moved its brk over since (each read costs a few hundred
/// microseconds, so a change elsewhere does not cause one), or outside every mapping read
/// (the kernel grew the stack, another thread mapped it).
#[derive(Default)]
pub struct MapsCache {
    /// `(start, end, PROT_*, private)`, sorted by start (`private`: not `MAP_SHARED`).
    ranges: Vec<(u64, u64, i32, bool)>,
    /// Guest ranges `[start, end)` changed since the last read.
    stale: Vec<(u64, u64)>,
    /// Everything may have changed since the last read.
    stale_all: bool,
    /// The index in `ranges` of the last mapping a lookup found, while it is current
    /// (no stale range overlaps it): placement asks about one module's pages many times in a
    /// row, and the binary search and the stale ranges' scan were 2-3 % of a warm run that
    /// places many blocks (`python3 -c pass`, a `cc1` compile). Forgotten when a range goes
    /// stale and at a read.
    last: std::cell::Cell<Option<usize>>,
}

impl MapsCache {
    /// Marks `[start, end)` out of date (after a guest mmap, munmap, mprotect, mremap or brk
    /// there).
    pub fn invalidate_range(&mut self, start: u64, end: u64) {
        self.last.set(None);
        if self.stale.len() >= MAX_STALE_RANGES {
            self.stale_all = true;
        } else if start < end {
            self.stale.push((start, end));
        }
    }

    /// Whether the cache's answer for `[start, end)` is current.
    fn fresh(&self, start: u64, end: u64) -> bool {
        if let Some(i) = self.last.get() {
            let (s, e, _, _) = self.ranges[i];
            if s <= start && end <= e {
                return true;
            }
        }
        !self.stale_all
            && !self.ranges.is_empty()
            && !self.stale.iter().any(|&(s, e)| s < end && start < e)
    }

    /// The cached mapping that contains `addr`: `(index, start, end, prot)`.
    fn find(&self, addr: u64) -> Option<(usize, u64, u64, i32)> {
        if let Some(i) = self.last.get() {
            let (s, e, prot, _) = self.ranges[i];
            if s <= addr && addr < e {
                return Some((i, s, e, prot));
            }
        }
        let i = self
            .ranges
            .partition_point(|r| r.0 <= addr)
            .checked_sub(1)?;
        let (s, e, prot, _) = self.ranges[i];
        if !(s <= addr && addr < e) {
            return None;
        }
        if self.fresh(s, e) {
            self.last.set(Some(i));
        }
        Some((i, s, e, prot))
    }

    /// The kernel's protection of the page at `addr`, or `None` if it is not mapped.
    pub fn prot(&mut self, addr: u64) -> Option<i32> {
        if !self.fresh(addr, addr + 1) || self.find(addr).is_none() {
            self.reload();
        }
        self.find(addr).map(|(_, _, _, prot)| prot)
    }

    /// Whether the `len` bytes at `addr` are mapped readable, by the cache, read again first if
    /// the guest changed a mapping there since (not if they are merely outside every mapping:
    /// the answer is then false, and costs no read).
    pub fn readable(&mut self, addr: u64, len: u64) -> bool {
        let end = addr.saturating_add(len);
        if !self.fresh(addr, end) {
            self.reload();
        }
        let Some((i, _, mut run_end, prot)) = self.find(addr) else {
            return false;
        };
        if prot & libc::PROT_READ == 0 {
            return false;
        }
        for &(s, e, prot, _) in &self.ranges[i + 1..] {
            if run_end >= end || s != run_end || prot & libc::PROT_READ == 0 {
                break;
            }
            run_end = e;
        }
        run_end >= end
    }

    /// Reads `/proc/self/maps` again now (before a fault is reported from what the cache said).
    pub fn refresh(&mut self) {
        self.reload();
    }

    /// How many of the `len` bytes at `addr` lie in consecutive mappings the kernel lets the
    /// CPU fetch instructions from (`PROT_EXEC`), by the cache, read again first if the guest
    /// changed a mapping there since. When the first byte is not executable by the cache, it is
    /// read again anyway before answering 0 (the guest's next instruction then faults, so the
    /// answer must be current; it costs a read only on that path).
    pub fn executable_len(&mut self, addr: u64, len: u64) -> u64 {
        let end = addr.saturating_add(len);
        if !self.fresh(addr, end) {
            self.reload();
        }
        let mut n = self.executable_run(addr, end);
        if n == 0 && !self.ranges.is_empty() {
            self.reload();
            n = self.executable_run(addr, end);
        }
        n
    }

    /// Whether any of `[start, end)` may hold code or a constant a translation depends on:
    /// true if the cache, current there, shows an executable or a read-only mapping
    /// overlapping it, or if the cache is not current there (no read of `/proc/self/maps`: a
    /// cheap, conservative answer). Code is translated only from executable pages, constants
    /// are read only from pages that are not writable (see [`Self::constant`]), and making a
    /// page executable or read-only discards its translations anyway.
    pub fn may_hold_code(&self, start: u64, end: u64) -> bool {
        if !self.fresh(start, end) {
            return true;
        }
        let first = self.ranges.partition_point(|r| r.1 <= start);
        self.ranges[first..]
            .iter()
            .take_while(|r| r.0 < end)
            .any(|r| {
                r.2 & libc::PROT_EXEC != 0
                    || r.2 & (libc::PROT_READ | libc::PROT_WRITE) == libc::PROT_READ
            })
    }

    /// Whether the `len` bytes at `addr` are mapped readable, not writable and private: memory
    /// that changes only after a system call (`mprotect`, `munmap`, `mremap`, `mmap` over it,
    /// `madvise`, a write to `/proc/self/mem`), each of which discards the translations of
    /// the range it touches. A translation may then take a value read there as a constant
    /// (a GOT slot after relocation: `jmp [rip+slot]` of a PLT entry).
    pub fn constant(&mut self, addr: u64, len: u64) -> bool {
        let end = addr.saturating_add(len);
        if !self.fresh(addr, end) {
            self.reload();
        }
        let Some((i, _, run_end, _)) = self.find(addr) else {
            return false;
        };
        let (_, _, prot, private) = self.ranges[i];
        end <= run_end && private && prot & libc::PROT_READ != 0 && prot & libc::PROT_WRITE == 0
    }

    /// Bytes from `addr` up to `end` covered by consecutive executable cached mappings.
    fn executable_run(&self, addr: u64, end: u64) -> u64 {
        let Some((i, _, mut run_end, prot)) = self.find(addr) else {
            return 0;
        };
        if prot & libc::PROT_EXEC == 0 {
            return 0;
        }
        for &(s, e, prot, _) in &self.ranges[i + 1..] {
            if run_end >= end || s != run_end || prot & libc::PROT_EXEC == 0 {
                break;
            }
            run_end = e;
        }
        run_end.min(end) - addr
    }

    fn reload(&mut self) {
        self.stale_all = false;
        self.stale.clear();
        self.ranges.clear();
        self.last.set(None);
        let Ok(maps) = crate::host::procfs::read_to_string("/proc/self/maps") else {
            return;
        };
        for line in maps.lines() {
            let mut f = line.split_whitespace();
            let (Some(range), Some(perms)) = (f.next(), f.next()) else {
                continue;
            };
            let Some((a, b)) = range.split_once('-') else {
                continue;
            };
            let (Ok(s), Ok(e)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
                continue;
            };
            let p = perms.as_bytes();
            let mut prot = 0;
            if p.first() == Some(&b'r') {
                prot |= libc::PROT_READ;
            }
            if p.get(1) == Some(&b'w') {
                prot |= libc::PROT_WRITE;
            }
            if p.get(2) == Some(&b'x') {
                prot |= libc::PROT_EXEC;
            }
            self.ranges.push((s, e, prot, p.get(3) == Some(&b'p')));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_cache_is_read_again_only_where_mappings_changed() {
        // SAFETY: a mapping of our own, reprotected and unmapped by this test only.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                3 * PAGE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let a = p as u64;
            let mut maps = MapsCache::default();
            assert!(maps.readable(a, 3 * PAGE));
            // Unchanged by the cache until it is told: the third page becomes unreadable.
            libc::mprotect(
                (a + 2 * PAGE) as *mut libc::c_void,
                PAGE as usize,
                libc::PROT_NONE,
            );
            assert!(
                maps.readable(a, 3 * PAGE),
                "no read of /proc/self/maps without a change"
            );
            maps.invalidate_range(a + 2 * PAGE, a + 3 * PAGE);
            assert!(maps.readable(a, 2 * PAGE));
            assert!(!maps.readable(a, 2 * PAGE + 1));
            assert_eq!(maps.prot(a + 2 * PAGE), Some(0));
            // Executable bytes: the first page is made executable, the cache told.
            assert_eq!(maps.executable_len(a, 100), 0);
            libc::mprotect(p, PAGE as usize, libc::PROT_READ | libc::PROT_EXEC);
            maps.invalidate_range(a, a + PAGE);
            assert_eq!(maps.executable_len(a + 10, 100), 100);
            assert_eq!(maps.executable_len(a + PAGE - 10, 100), 10);
            assert_eq!(maps.executable_len(a + PAGE, 100), 0);
            // Not told, but a first byte the cache says is not executable is read again.
            libc::mprotect(
                (a + PAGE) as *mut libc::c_void,
                PAGE as usize,
                libc::PROT_READ | libc::PROT_EXEC,
            );
            assert_eq!(maps.executable_len(a + PAGE, 100), 100);
            assert!(maps.may_hold_code(a, a + 1));
            assert!(!maps.may_hold_code(a + 2 * PAGE, a + 3 * PAGE));
            maps.invalidate_range(a + 2 * PAGE, a + 3 * PAGE);
            assert!(
                maps.may_hold_code(a + 2 * PAGE, a + 3 * PAGE),
                "stale: maybe"
            );
            // Constants: readable, not writable, private; a shared view is not one.
            assert!(maps.constant(a + PAGE - 8, 8));
            assert!(
                !maps.constant(a + 2 * PAGE - 4, 8),
                "runs into an unreadable page"
            );
            let shared = libc::mmap(
                std::ptr::null_mut(),
                PAGE as usize,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(shared, libc::MAP_FAILED);
            maps.invalidate_range(shared as u64, shared as u64 + PAGE);
            assert!(!maps.constant(shared as u64, 8));
            libc::munmap(shared, PAGE as usize);
            libc::mprotect(p, PAGE as usize, libc::PROT_READ | libc::PROT_WRITE);
            maps.invalidate_range(a, a + PAGE);
            assert!(!maps.constant(a, 8), "writable");
            libc::munmap(p, 3 * PAGE as usize);
            maps.invalidate_range(a, a + 3 * PAGE);
            assert_eq!(maps.prot(a), None);
            assert!(!maps.readable(a, 1));
        }
    }
}
