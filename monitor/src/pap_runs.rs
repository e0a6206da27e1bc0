//! The PAP run trie: each hot activation's sequence of Ball-Larus path numbers, kept as a
//! prefix tree whose nodes count the runs that ended there.
//!
//! PAP (Wang, Li, Zhou 2012, §3) profiles an activation's whole cyclic path — the run of
//! acyclic paths between its entry and its exit — and counts each distinct run. Online, a run
//! is a node of this trie: every path end steps the activation's node to the child for that
//! path number (through the node's one-entry cache of its last child, then a direct-mapped
//! cache, then a hash map), and the activation's end counts one run at its node. The runs are
//! spelled (function, path numbers) once, when the profile is taken, and encoded with
//! `hotpath_pathprof::Pap` by `pathreport`.

use crate::paths::{cache_slot, Activation, Function, FxMap, NONE};

/// Longest PAP run kept, in Ball-Larus paths: a longer activation (a main loop) stops
/// recording its PAP run and counts one abandoned run (`path_stats.pap_abandoned` in the
/// report).
pub const PAP_MAX_PATHS: usize = 1 << 20;

/// PAP run-trie nodes kept (24 bytes each: 96 MiB). Every distinct prefix of a PAP run is one
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
    /// The child taken last: its path number and node.
    last_path: u32,
    last_child: u32,
}

/// The PAP runs of every function: one trie, a root per function (`Function::pap_root`).
#[derive(Clone)]
pub(crate) struct PapRuns {
    nodes: Vec<PapNode>,
    /// Children by `(parent, path number)` (behind `PapNode::last_child` and `cache`).
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
        });
        (self.nodes.len() - 1) as u32
    }

    /// The node of run prefix `t` followed by path `p`, or [`NONE`] when it would need a node
    /// past [`PAP_STORE_MAX`].
    #[inline]
    pub(crate) fn step(&mut self, t: u32, p: u32) -> u32 {
        let n = &self.nodes[t as usize];
        if n.last_path == p {
            return n.last_child;
        }
        // Recursive functions' runs branch at every node: a direct-mapped cache before the map.
        let slot = cache_slot(t, p, PAP_CACHE_SLOTS);
        let (ct, cp, cc) = self.cache[slot];
        let cached = (ct == t && cp == p).then_some(cc);
        let c = match cached.or_else(|| self.children.get(&(t, p)).copied()) {
            Some(c) => c,
            None => {
                let c = self.new_node(t, p);
                if c == NONE {
                    return NONE;
                }
                self.children.insert((t, p), c);
                c
            }
        };
        self.cache[slot] = (t, p, c);
        let n = &mut self.nodes[t as usize];
        n.last_path = p;
        n.last_child = c;
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

    /// The stored runs, `[function, path numbers...]` → count, spelled from the trie.
    pub(crate) fn spell(&self, funcs: &[Function]) -> FxMap<Box<[u32]>, u64> {
        let mut func_of_root = FxMap::default();
        for (f, fun) in funcs.iter().enumerate() {
            if fun.pap_root != NONE {
                func_of_root.insert(fun.pap_root, f as u32);
            }
        }
        let mut runs = FxMap::default();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.count == 0 {
                continue;
            }
            let mut key = Vec::new();
            let mut t = i as u32;
            while self.nodes[t as usize].parent != NONE {
                key.push(self.nodes[t as usize].path);
                t = self.nodes[t as usize].parent;
            }
            key.push(func_of_root[&t]);
            key.reverse();
            runs.insert(key.into_boxed_slice(), n.count);
        }
        runs
    }
}
