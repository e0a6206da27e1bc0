//! Path counters of context nodes (#21 stage 2; docs/paths-design.md, "Step 3 broken down",
//! 3b): one `u64` per Ball-Larus path of a function's numbering, per context of the function,
//! in an arena of the guest thread's that the monitor reads.
//!
//! A node's [`Node::counters`] is the host address of its current array's first counter (0:
//! none) and [`Node::numbering`] the numbering it counts for, so that instrumented code checks
//! the numbering flag-free and counts path `r` at `counters + 8 r`. Each array has a 24-byte
//! header in front: its numbering and its length, the address of the array the node had
//! before (0: none), and — last, at [`RUN_ROOT_OFFSET`] from the first counter — the host
//! address of the numbering's run-trie root in this thread (`runs`), where an activation's
//! run starts. A function renumbered (its CFG grew) gets a new array in every context it
//! runs in; the old ones stay, chained, with the counts of the old numbering, which the
//! monitor regenerates with that numbering.

use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::reserve::Reserved;

/// Counters (and headers) the arena holds at most, in `u64` words: 256 MiB of address space,
/// reserved, not committed — pages are touched as arrays are made. A thread whose contexts
/// need more runs the rest cold ([`crate::Contexts::path_counters`] returns `None`).
pub const COUNTER_WORDS_MAX: usize = 1 << 25;

/// Words of an array's header.
const HEADER_WORDS: usize = 3;

/// Offset in bytes, from an array's first counter, of its header's run-trie root.
pub const RUN_ROOT_OFFSET: i32 = -8;

/// One array of a node, as the monitor reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathCounts {
    /// The numbering the counts are for (as the monitor numbered them; never 0).
    pub numbering: u32,
    /// Count of each path id, `0..len`.
    pub counts: Vec<u64>,
}

/// The arena's mapping, shared by the writer ([`CounterArena`]) and readers.
pub(crate) struct CounterMapping {
    /// [`COUNTER_WORDS_MAX`] words, unmapped when the last user is gone.
    mem: Reserved<u64>,
    /// Words handed out (Release after each array's header is written).
    used: AtomicU64,
}

// SAFETY: plain memory; one writer thread, and readers read only words below `used` (whose
// headers were written before `used` covered them) through atomic or volatile loads.
unsafe impl Send for CounterMapping {}
// SAFETY: as above.
unsafe impl Sync for CounterMapping {}

/// The readers' handle on a thread's counters: empty until the thread makes its first array
/// (most threads and runs never do, and the arena's address space is then never taken).
pub(crate) type SharedCounters = Arc<OnceLock<Arc<CounterMapping>>>;

/// One thread's counter arrays, appended by that thread. Addresses never change. The mapping
/// is made with the first array.
pub(crate) struct CounterArena {
    shared: SharedCounters,
    map: Option<Arc<CounterMapping>>,
    used: usize,
}

impl CounterArena {
    /// An arena with no mapping yet.
    pub(crate) fn new() -> CounterArena {
        CounterArena {
            shared: Arc::default(),
            map: None,
            // Word 0 stays unused: an array's address is never 0, the "none" of
            // `Node::counters`.
            used: HEADER_WORDS,
        }
    }

    /// The mapping, made the first time.
    fn mapping(&mut self) -> Option<&Arc<CounterMapping>> {
        if self.map.is_none() {
            let map = Arc::new(CounterMapping::new().ok()?);
            let _ = self.shared.set(Arc::clone(&map));
            self.map = Some(map);
        }
        self.map.as_ref()
    }

    /// A zeroed array of `len` counters for `numbering`, chained to `prev` (the node's array
    /// before, 0 for none), whose activations' runs start at run node `run_root` (0: none):
    /// the host address of its first counter, or `None` when the arena has no room (or its
    /// address space cannot be had).
    pub(crate) fn make(
        &mut self,
        numbering: u32,
        len: u32,
        prev: u64,
        run_root: u64,
    ) -> Option<u64> {
        let words = HEADER_WORDS + len as usize;
        if self.used + words > COUNTER_WORDS_MAX {
            return None;
        }
        let header = self.used;
        let map = Arc::clone(self.mapping()?);
        // SAFETY: `header..header + words` is in the mapping (checked) and beyond `used`: no
        // reader looks at it yet, and the kernel zeroed it.
        unsafe {
            let h = map.mem.base().add(header);
            h.write(numbering as u64 | (len as u64) << 32);
            h.add(1).write(prev);
            h.add(2).write(run_root);
        }
        self.used += words;
        map.used.store(self.used as u64, Ordering::Release);
        Some(map.mem.base() as u64 + ((header + HEADER_WORDS) * size_of::<u64>()) as u64)
    }

    /// Counts path `id` in the array whose first counter is at `counters` (one of this
    /// arena's; an id past its length is not counted).
    pub(crate) fn count(&mut self, counters: u64, id: u64) {
        let Some(map) = &self.map else { return };
        let base = map.mem.base() as u64;
        let Some(first) = counters
            .checked_sub(base)
            .map(|o| (o / 8) as usize)
            .filter(|&w| (HEADER_WORDS..self.used).contains(&w))
        else {
            return;
        };
        // SAFETY: `first - HEADER_WORDS` is the header of an array below `used` (checked),
        // written by this thread; its counters are this thread's to add to.
        unsafe {
            let len = map.mem.base().add(first - HEADER_WORDS).read() >> 32;
            if id < len {
                *map.mem.base().add(first + id as usize) += 1;
            }
        }
    }

    /// The readers' handle.
    pub(crate) fn shared(&self) -> SharedCounters {
        Arc::clone(&self.shared)
    }
}

impl CounterMapping {
    /// A fresh mapping of [`COUNTER_WORDS_MAX`] words.
    ///
    /// # Errors
    /// The OS error if the address space cannot be reserved.
    fn new() -> std::io::Result<CounterMapping> {
        Ok(CounterMapping {
            mem: Reserved::new(COUNTER_WORDS_MAX)?,
            used: AtomicU64::new(0),
        })
    }

    /// The arrays chained from `counters` (a node's current array, 0 for none), newest first,
    /// as they are now (counters read while the thread may still count: each whole, the set
    /// not a snapshot). Addresses outside the arena end the chain.
    pub(crate) fn read_chain(&self, mut counters: u64) -> Vec<PathCounts> {
        let used = self.used.load(Ordering::Acquire) as usize;
        let base = self.mem.base() as u64;
        let mut out = Vec::new();
        while counters != 0 {
            let Some(first) = counters
                .checked_sub(base)
                .filter(|o| o % 8 == 0)
                .map(|o| (o / 8) as usize)
                .filter(|&w| (HEADER_WORDS..=used).contains(&w))
            else {
                break;
            };
            // SAFETY: `first - 2 .. first` is a header below `used` (checked), written before
            // the Release that published `used`; the counters after it are whole aligned words,
            // read with volatile loads because the owning thread may be adding to them.
            unsafe {
                let h = self.mem.base().add(first - HEADER_WORDS);
                let word = h.read_volatile();
                let prev = h.add(1).read_volatile();
                let len = (word >> 32) as usize;
                if first + len > used {
                    break;
                }
                let counts = (0..len)
                    .map(|i| self.mem.base().add(first + i).read_volatile())
                    .collect();
                out.push(PathCounts {
                    numbering: word as u32,
                    counts,
                });
                counters = prev;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_are_zeroed_chained_and_read_back() {
        let mut a = CounterArena::new();
        let shared = a.shared();
        assert!(shared.get().is_none(), "no mapping before the first array");
        let first = a.make(1, 3, 0, 0).unwrap();
        let m = shared.get().unwrap();
        assert_ne!(first, 0);
        // SAFETY (test): counters 0..3 of the array just made.
        unsafe {
            *(first as *mut u64).add(2) += 5;
        }
        let second = a.make(2, 2, first, 0).unwrap();
        // SAFETY (test): as above.
        unsafe {
            *(second as *mut u64) += 1;
        }
        assert_eq!(
            m.read_chain(second),
            vec![
                PathCounts {
                    numbering: 2,
                    counts: vec![1, 0]
                },
                PathCounts {
                    numbering: 1,
                    counts: vec![0, 0, 5]
                },
            ]
        );
        assert_eq!(m.read_chain(0), vec![]);
        // Not an array's address: nothing read.
        assert_eq!(m.read_chain(first + 4), vec![]);
        assert_eq!(m.read_chain(8), vec![]);
    }

    #[test]
    fn a_full_arena_makes_no_array() {
        let mut a = CounterArena::new();
        assert!(a.make(1, (COUNTER_WORDS_MAX - 9) as u32, 0, 0).is_some());
        assert_eq!(a.make(1, 1, 0, 0), None);
        assert!(a.make(1, 0, 0, 0).is_some());
    }
}
