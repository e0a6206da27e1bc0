//! The PAP run trie: each hot activation's sequence of Ball-Larus path numbers, kept as a
//! prefix tree whose nodes count the runs that ended there.
//!
//! PAP (Wang, Li, Zhou 2012, §3) profiles an activation's whole cyclic path — the run of
//! acyclic paths between its entry and its exit — and counts each distinct run. Online, a run
//! is a node of this trie: every path end steps the activation's node to the child for that
//! path number (through the node's cache of the last two children taken, then a direct-mapped
//! cache, then a hash map that holds the children of nodes with more than one), and the
//! activation's end counts one run at its node. When the profile is taken, the heaviest runs
//! are spelled (function, path numbers) and encoded with `hotpath_pathprof::Pap` by
//! `report`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::frames::Activation;
use super::function::Function;
use super::ids::{cache_slot, FxHasher, FxMap, NONE};
use std::hash::Hasher;

/// Longest PAP run kept, in Ball-Larus paths: a longer activation (a main loop) stops
/// recording its PAP run and counts one abandoned run (`path_stats.pap_abandoned` in the
/// report).
pub const PAP_MAX_PATHS: usize = 1 << 20;

/// PAP run-trie nodes kept (32 bytes each: 128 MiB). Every distinct prefix of a PAP run is one
/// node, in-flight runs included; a run that needs a new node past it is abandoned and counts
/// one abandoned run; runs already stored keep counting.
pub const PAP_STORE_MAX: usize = 1 << 22;

/// Slots of the run trie's direct-mapped child cache (12 bytes each: 48 KiB).
const PAP_CACHE_SLOTS: usize = 1 << 12;

/// A node of the PAP run trie: a run prefix `[function, path numbers...]`.
#[derive(Clone, Copy, Debug)]
struct PapNode {
    /// The prefix without its last path, or [`NONE`] for a function's root (the empty run).
    parent: u32,
    /// Its last path number ([`NONE`] for a root).
    path: u32,
    /// Runs that ended here (activations whose whole PAP run is this prefix).
    count: u64,
    /// The child taken last: its path number and node ([`NONE`]: no child yet).
    last_path: u32,
    last_child: u32,
    /// The child taken last before `last_path` (a branch that goes either way alternates
    /// between the two); [`NONE`] while it has only one child. Its children are in
    /// `PapRuns::children` once it has two: not while it has one (then `last_child`), so a run
    /// no other has taken (a loop whose iterations follow the data) grows one node per path
    /// without a hash-map probe.
    prev_path: u32,
    prev_child: u32,
}

/// The PAP runs of every function: one trie, a root per function (`Function::pap_root`).
#[derive(Clone)]
pub(crate) struct PapRuns {
    nodes: Vec<PapNode>,
    /// Children of nodes with more than one, by `(parent, path number)` (behind `cache`).
    children: FxMap<(u32, u32), u32>,
    /// Direct-mapped cache of `children`: `(parent, path number, child)`.
    cache: Box<[(u32, u32, u32)]>,
    /// Runs dropped for exceeding [`PAP_MAX_PATHS`] or [`PAP_STORE_MAX`].
    pub(crate) abandoned: u64,
}

impl Default for PapRuns {
    fn default() -> Self {
        PapRuns {
            nodes: Vec::new(),
            children: FxMap::default(),
            cache: vec![(NONE, NONE, NONE); PAP_CACHE_SLOTS].into_boxed_slice(),
            abandoned: 0,
        }
    }
}

impl PapRuns {
    /// The root of `fun`'s runs (the empty run), made on first use, or [`NONE`] when the trie
    /// is full.
    pub(crate) fn root(&mut self, fun: &mut Function) -> u32 {
        if fun.pap_root == NONE {
            fun.pap_root = self.new_node(NONE, NONE);
        }
        fun.pap_root
    }

    /// A new node, or [`NONE`] past [`PAP_STORE_MAX`] nodes.
    fn new_node(&mut self, parent: u32, path: u32) -> u32 {
        if self.nodes.len() >= PAP_STORE_MAX {
            return NONE;
        }
        self.nodes.push(PapNode {
            parent,
            path,
            count: 0,
            last_path: NONE,
            last_child: NONE,
            prev_path: NONE,
            prev_child: NONE,
        });
        (self.nodes.len() - 1) as u32
    }

    /// The node of run prefix `t` followed by path `p`, or [`NONE`] when it would need a node
    /// past [`PAP_STORE_MAX`].
    #[inline]
    pub(crate) fn step(&mut self, t: u32, p: u32) -> u32 {
        let n = &mut self.nodes[t as usize];
        if n.last_path == p {
            return n.last_child;
        }
        if n.prev_path == p {
            let c = n.prev_child;
            (n.prev_path, n.prev_child) = (n.last_path, n.last_child);
            (n.last_path, n.last_child) = (p, c);
            return c;
        }
        self.step_slow(t, p)
    }

    /// [`PapRuns::step`] to a child other than the last two taken.
    #[cold]
    fn step_slow(&mut self, t: u32, p: u32) -> u32 {
        let n = &self.nodes[t as usize];
        let (only, mapped) = (n.last_path, n.prev_path != NONE);
        let c = if only == NONE {
            // Its first child: not in the map.
            self.new_node(t, p)
        } else if !mapped {
            // Its second child: from now on all of them are in the map.
            let c = self.new_node(t, p);
            if c != NONE {
                let first = self.nodes[t as usize].last_child;
                self.children.insert((t, only), first);
                self.children.insert((t, p), c);
            }
            c
        } else {
            // Recursive functions' runs branch at every node: a direct-mapped cache before
            // the map.
            let slot = cache_slot(t, p, PAP_CACHE_SLOTS);
            let (ct, cp, cc) = self.cache[slot];
            let c = if ct == t && cp == p {
                cc
            } else {
                match self.children.get(&(t, p)) {
                    Some(&c) => c,
                    None => {
                        let c = self.new_node(t, p);
                        if c != NONE {
                            self.children.insert((t, p), c);
                        }
                        c
                    }
                }
            };
            if c != NONE {
                self.cache[slot] = (t, p, c);
            }
            c
        };
        if c != NONE {
            let n = &mut self.nodes[t as usize];
            (n.prev_path, n.prev_child) = (n.last_path, n.last_child);
            (n.last_path, n.last_child) = (p, c);
        }
        c
    }

    /// Appends path `p` to activation `a`'s run (which it records: `a.pap != NONE`),
    /// abandoning the run when it is too long or the trie is full.
    #[inline]
    pub(crate) fn push(&mut self, a: &mut Activation, p: u32) {
        let next = if a.pap_len as usize >= PAP_MAX_PATHS {
            NONE
        } else {
            self.step(a.pap, p)
        };
        if next == NONE {
            a.pap = NONE;
            self.abandoned += 1;
        } else {
            a.pap = next;
            a.pap_len += 1;
        }
    }

    /// Counts activation `a`'s run as it stands, if it records one (its activation ended).
    #[inline]
    pub(crate) fn end(&mut self, a: &Activation) {
        if a.pap != NONE {
            self.nodes[a.pap as usize].count += 1;
        }
    }

    /// The `n` stored runs that executed the most basic blocks (count × the blocks of their
    /// paths, `path_blocks(p)` each), heaviest first: `(function, path numbers, count)`.
    /// Only those are spelled: the trie can hold millions of runs (every activation of a loop
    /// whose iterations follow the data is one), whose spelled lengths would add up to
    /// gigabytes.
    ///
    /// Equal ones are ordered by a hash of what they are — their function's entry address
    /// (`funcs[f].entry`) and each path's `path_hash(p)`, which must not depend on the order
    /// paths were met — and only then by the order first seen, so that the order does not
    /// depend on when each run was first met.
    pub(crate) fn heaviest(
        &self,
        funcs: &[Function],
        path_blocks: impl Fn(u32) -> u64,
        path_hash: impl Fn(u32) -> u64,
        n: usize,
    ) -> Vec<(u32, Box<[u32]>, u64)> {
        let func_of_root: FxMap<u32, u32> = funcs
            .iter()
            .enumerate()
            .filter(|(_, fun)| fun.pap_root != NONE)
            .map(|(f, fun)| (fun.pap_root, f as u32))
            .collect();
        // Parents come before their children: one pass gives every prefix its blocks and its
        // hash.
        let mut blocks = vec![0u64; self.nodes.len()];
        let mut hash = vec![0u64; self.nodes.len()];
        // Min-heap of the heaviest so far: (weight, smaller hash first, first seen first).
        type Key = (u64, Reverse<u64>, Reverse<u32>);
        let mut top: BinaryHeap<Reverse<Key>> = BinaryHeap::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let mut h = FxHasher::default();
            if node.parent != NONE {
                blocks[i] = blocks[node.parent as usize] + path_blocks(node.path);
                h.write_u64(hash[node.parent as usize]);
                h.write_u64(path_hash(node.path));
            } else if let Some(&f) = func_of_root.get(&(i as u32)) {
                h.write_u64(funcs[f as usize].entry);
            }
            hash[i] = h.finish();
            if node.count == 0 || n == 0 {
                continue;
            }
            let key = (
                node.count.saturating_mul(blocks[i]),
                Reverse(hash[i]),
                Reverse(i as u32),
            );
            if top.len() < n {
                top.push(Reverse(key));
            } else if top.peek().is_some_and(|Reverse(least)| key > *least) {
                top.pop();
                top.push(Reverse(key));
            }
        }
        let mut runs: Vec<_> = top.into_iter().map(|Reverse(k)| k).collect();
        runs.sort_unstable_by(|a, b| b.cmp(a));
        runs.into_iter()
            .map(|(_, _, Reverse(i))| {
                let mut paths = Vec::new();
                let mut t = i;
                while self.nodes[t as usize].parent != NONE {
                    paths.push(self.nodes[t as usize].path);
                    t = self.nodes[t as usize].parent;
                }
                paths.reverse();
                (
                    func_of_root[&t],
                    paths.into_boxed_slice(),
                    self.nodes[i as usize].count,
                )
            })
            .collect()
    }

    /// Runs counted, and distinct runs among them.
    pub(crate) fn totals(&self) -> (u64, u64) {
        self.nodes
            .iter()
            .filter(|n| n.count > 0)
            .fold((0, 0), |(runs, distinct), n| (runs + n.count, distinct + 1))
    }

    /// The path numbers that start a stored run (in-flight ones included), once each.
    pub(crate) fn first_paths(&self) -> impl Iterator<Item = u32> + '_ {
        self.nodes.iter().filter_map(|n| {
            (n.parent != NONE && self.nodes[n.parent as usize].parent == NONE).then_some(n.path)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::function::Function;
    use proptest::prelude::*;

    fn activation(pap: u32) -> Activation {
        Activation {
            func: 0,
            return_to: 0,
            cur: 0,
            len: 1,
            blocks: 0,
            instructions: 0,
            path_ends: 0,
            last_addr: 0,
            pap,
            pap_len: 0,
            call_node: 0,
            r: 0,
            last_node: NONE,
            path_instr: 0,
        }
    }

    proptest! {
        /// Runs of two functions, nested as calls nest (a run may start inside another), over
        /// a small alphabet of path numbers so that prefixes are shared and nodes get one, two
        /// and many children: the spelled runs are exactly the runs fed, with their counts,
        /// heaviest (count x blocks) first, and the top 3 are the first 3 of them all.
        #[test]
        fn spelled_runs_are_the_runs_fed(
            runs in proptest::collection::vec(
                (0..2usize, proptest::collection::vec(0..5u32, 0..12), 0..3usize),
                1..80,
            )
        ) {
            let mut funcs = vec![Function::new(0x1000, None), Function::new(0x2000, None)];
            let mut trie = PapRuns::default();
            let mut expected: FxMap<Box<[u32]>, u64> = FxMap::default();
            // Each run: (function, paths, where a nested run of the next one starts).
            let mut pending: Option<Activation> = None;
            for (i, (f, paths, nest_at)) in runs.iter().enumerate() {
                let root = trie.root(&mut funcs[*f]);
                let mut a = activation(root);
                for (j, &p) in paths.iter().enumerate() {
                    trie.push(&mut a, p);
                    if j == *nest_at && i % 2 == 0 {
                        // Another activation ends while this one is under way.
                        if let Some(b) = pending.take() {
                            trie.end(&b);
                        }
                    }
                }
                let mut key = vec![*f as u32];
                key.extend(paths);
                *expected.entry(key.into_boxed_slice()).or_default() += 1;
                if let Some(b) = pending.replace(a) {
                    trie.end(&b);
                }
            }
            if let Some(b) = pending.take() {
                trie.end(&b);
            }
            prop_assert_eq!(trie.abandoned, 0);
            // Path p has p + 1 blocks.
            let all = trie.heaviest(&funcs, |p| p as u64 + 1, |p| p as u64, usize::MAX);
            let spelled: FxMap<Box<[u32]>, u64> = all
                .iter()
                .map(|(f, paths, count)| {
                    let mut key = vec![*f];
                    key.extend(paths.iter());
                    (key.into_boxed_slice(), *count)
                })
                .collect();
            prop_assert_eq!(spelled.len(), all.len());
            prop_assert_eq!(
                trie.totals(),
                (expected.values().sum::<u64>(), expected.len() as u64)
            );
            prop_assert_eq!(spelled, expected);
            let weight = |(_, paths, count): &(u32, Box<[u32]>, u64)| {
                count * paths.iter().map(|&p| p as u64 + 1).sum::<u64>()
            };
            prop_assert!(all.windows(2).all(|w| weight(&w[0]) >= weight(&w[1])));
            prop_assert_eq!(
                &trie.heaviest(&funcs, |p| p as u64 + 1, |p| p as u64, 3)[..],
                &all[..all.len().min(3)]
            );
            // The same runs met in another order (nodes made in another order) list the same,
            // in the same order, whatever the cut.
            let mut other = PapRuns::default();
            let mut other_funcs = vec![Function::new(0x1000, None), Function::new(0x2000, None)];
            for (f, paths, _) in runs.iter().rev() {
                let root = other.root(&mut other_funcs[*f]);
                let mut a = activation(root);
                for &p in paths {
                    other.push(&mut a, p);
                }
                other.end(&a);
            }
            for n in [1, 3, usize::MAX] {
                prop_assert_eq!(
                    other.heaviest(&other_funcs, |p| p as u64 + 1, |p| p as u64, n),
                    trie.heaviest(&funcs, |p| p as u64 + 1, |p| p as u64, n)
                );
            }
            let firsts: std::collections::BTreeSet<u32> = trie.first_paths().collect();
            let expected_firsts: std::collections::BTreeSet<u32> =
                runs.iter().filter_map(|(_, paths, _)| paths.first().copied()).collect();
            prop_assert_eq!(firsts, expected_firsts);
        }
    }
}
