//! The monitor's exact tables, fed event by event in ring order.
//!
//! The hot loop does one thing per block event: it counts the edge from the previous block to
//! this one, in a two-entry successor cache per block id (most blocks have at most two
//! successors), with a hash map behind it for the rest (indirect branches, re-translations).
//! Block counts, edge kinds, indirect-branch targets and totals are all derived from those
//! edge counts when the profile is taken: a block's count is the sum of its out-edges, plus one
//! for the very last block executed. This keeps the per-event work to a compare and an add.

use std::collections::HashMap;

use crossbeam::channel::Receiver;
use hotpath_events::{NewBlock, SYSCALL_EVENT};
use hotpath_ir::BlockSummary;
use rustc_hash::FxHashMap;

/// No block: the successor slot is empty, or no block has run yet.
const NONE: u32 = u32::MAX;

/// Successor cache of one block id: the first two distinct successor ids and their counts.
#[derive(Clone, Copy)]
struct Successors {
    id: [u32; 2],
    count: [u64; 2],
}

const EMPTY: Successors = Successors {
    id: [NONE; 2],
    count: [0; 2],
};

/// Counts of one system call number.
#[derive(Clone, Debug, Default)]
pub struct SyscallCount {
    /// Times it was called.
    pub count: u64,
    /// Block id that issued it → times.
    pub sites: HashMap<u32, u64>,
}

/// Exact counts of everything the event stream shows, indexed by block id.
#[derive(Clone)]
pub struct Tables {
    /// Block metadata by id, learned from the translator's `NewBlock` messages.
    pub blocks: Vec<BlockSummary>,
    successors: Vec<Successors>,
    /// Edges `(from id, to id)` beyond the two cached per block (indirect branches with many
    /// targets land here on every event, so the hash is the fast Fx one, not SipHash).
    overflow: FxHashMap<(u32, u32), u64>,
    /// System call number → counts.
    pub syscalls: HashMap<u32, SyscallCount>,
    /// The previous block event (the source of the next edge).
    prev: u32,
    /// Events processed (blocks and system calls).
    pub events: u64,
}

impl Default for Tables {
    fn default() -> Tables {
        Tables {
            blocks: Vec::new(),
            successors: Vec::new(),
            overflow: FxHashMap::default(),
            syscalls: HashMap::new(),
            prev: NONE,
            events: 0,
        }
    }
}

impl Tables {
    /// Accounts a run of events in ring order.
    ///
    /// A block that follows itself (a one-block loop) is counted in a register and added to its
    /// self-edge when the run ends: such loops produce the densest event streams.
    pub fn record(&mut self, events: &[u32]) {
        let mut prev = self.prev;
        let mut repeats = 0u64;
        for &ev in events {
            if ev == prev {
                repeats += 1;
                continue;
            }
            if repeats > 0 {
                self.add_edge(prev, prev, repeats);
                repeats = 0;
            }
            if ev & SYSCALL_EVENT != 0 {
                self.record_syscall(ev & !SYSCALL_EVENT, prev);
                continue;
            }
            if ev as usize >= self.successors.len() {
                self.grow(ev);
            }
            self.add_edge(prev, ev, 1);
            prev = ev;
        }
        if repeats > 0 {
            self.add_edge(prev, prev, repeats);
        }
        self.prev = prev;
        self.events += events.len() as u64;
    }

    /// Counts `n` traversals of the edge `from → to` (`from` may be [`NONE`]: no edge).
    #[inline(always)]
    fn add_edge(&mut self, from: u32, to: u32, n: u64) {
        if let Some(s) = self.successors.get_mut(from as usize) {
            if s.id[0] == to {
                s.count[0] += n;
                return;
            }
            if s.id[1] == to {
                s.count[1] += n;
                return;
            }
        }
        self.add_new_edge(from, to, n);
    }

    /// The rare cases of [`add_edge`](Self::add_edge): a successor not in the cache yet.
    #[cold]
    #[inline(never)]
    fn add_new_edge(&mut self, from: u32, to: u32, n: u64) {
        let Some(s) = self.successors.get_mut(from as usize) else {
            return;
        };
        if s.id[0] == NONE {
            *s = Successors {
                id: [to, NONE],
                count: [n, 0],
            };
        } else if s.id[1] == NONE {
            s.id[1] = to;
            s.count[1] = n;
        } else {
            *self.overflow.entry((from, to)).or_insert(0) += n;
        }
    }

    #[cold]
    fn grow(&mut self, id: u32) {
        let len = (id as usize + 1).next_power_of_two().max(1024);
        self.successors.resize(len, EMPTY);
    }

    #[cold]
    fn record_syscall(&mut self, nr: u32, site: u32) {
        let s = self.syscalls.entry(nr).or_default();
        s.count += 1;
        *s.sites.entry(site).or_insert(0) += 1;
    }

    /// Takes in block metadata (ids arrive in translation order).
    pub fn learn(&mut self, b: NewBlock) {
        // A re-sent block (after the monitor was replaced) is already known.
        if b.id.index() < self.blocks.len() {
            return;
        }
        debug_assert_eq!(
            b.id.index(),
            self.blocks.len(),
            "block ids arrive in translation order"
        );
        self.blocks.push(b.summary);
    }

    /// Reads every pending `NewBlock` message.
    pub fn learn_all(&mut self, new_blocks: &Receiver<NewBlock>) {
        while let Ok(b) = new_blocks.try_recv() {
            self.learn(b);
        }
    }

    /// Every observed edge `(from id, to id, count)`.
    pub fn edges(&self) -> Vec<(u32, u32, u64)> {
        let mut out = Vec::new();
        for (from, s) in self.successors.iter().enumerate() {
            for k in 0..2 {
                if s.id[k] != NONE {
                    out.push((from as u32, s.id[k], s.count[k]));
                }
            }
        }
        out.extend(self.overflow.iter().map(|(&(f, t), &c)| (f, t, c)));
        out
    }

    /// Executions of each block id: the sum of its out-edges, plus one for the last block run
    /// (which has no out-edge yet).
    pub fn block_counts(&self) -> Vec<u64> {
        let mut counts = vec![0u64; self.blocks.len().max(self.successors.len())];
        for (from, _, c) in self.edges() {
            counts[from as usize] += c;
        }
        if self.prev != NONE {
            counts[self.prev as usize] += 1;
        }
        counts.truncate(self.blocks.len());
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hotpath_ir::{BlockId, GuestAddr, Terminator};

    fn learn(t: &mut Tables, n: u32) {
        for i in 0..n {
            let start = GuestAddr(0x1000 + 0x10 * i as u64);
            t.learn(NewBlock {
                id: BlockId(i),
                summary: BlockSummary {
                    start,
                    terminator_addr: start,
                    len_bytes: 16,
                    instructions: 2,
                    terminator: Terminator::IndirectJump,
                },
            });
        }
    }

    /// Brute force: count consecutive pairs directly.
    #[test]
    fn edge_and_block_counts_match_brute_force() {
        let mut t = Tables::default();
        learn(&mut t, 5);
        let mut x = 12345u64;
        let stream: Vec<u32> = (0..10_000)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) % 5) as u32
            })
            .collect();
        for chunk in stream.chunks(7) {
            t.record(chunk);
        }
        let mut pairs: HashMap<(u32, u32), u64> = HashMap::new();
        for w in stream.windows(2) {
            *pairs.entry((w[0], w[1])).or_insert(0) += 1;
        }
        let got: HashMap<(u32, u32), u64> = t
            .edges()
            .into_iter()
            .map(|(f, to, c)| ((f, to), c))
            .collect();
        assert_eq!(got, pairs);
        let mut counts = vec![0u64; 5];
        for &b in &stream {
            counts[b as usize] += 1;
        }
        assert_eq!(t.block_counts(), counts);
    }

    #[test]
    fn syscalls_are_attributed_to_the_previous_block() {
        let mut t = Tables::default();
        learn(&mut t, 3);
        t.record(&[0, 1, SYSCALL_EVENT | 39, 2, 1, SYSCALL_EVENT | 39]);
        let s = &t.syscalls[&39];
        assert_eq!(s.count, 2);
        assert_eq!(s.sites[&1], 2);
        assert_eq!(t.block_counts(), vec![1, 2, 1]);
    }
}
