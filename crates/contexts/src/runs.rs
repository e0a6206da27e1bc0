//! PAP run tries of instrumented activations (#21 step 3d; docs/paths-design.md, "Step 3d as
//! built"): per guest thread, each instrumented activation's run — its sequence of Ball-Larus
//! path ids, PAP's cyclic path (Wang, Li, Zhou 2012, §3) — is a node of a prefix tree that
//! translated code steps at every path end and counts at the activation's end.
//!
//! ```text
//! activation start:  run = root of the numbering (one per numbering and thread)
//! path end (id p):   run.cache_id == p + 1      ? run = run.cache_child
//!                    run.children[p] != 0       ? run = run.children[p]     (a dense array)
//!                    run has no child yet       ? run = a new node from run_next (in code)
//!                    else ───────────────────────▶ runtime: RunTrie::step
//! activation end:    (the last path's step, then) run.count += 1
//! ```
//!
//! `run` is the host address of a [`RunNode`] (0: the activation records no run — it was
//! abandoned — and every step is skipped). Translated code makes a node's first child itself,
//! from the area's `run_next`/`run_left` (a run no other has taken grows one node per path, as
//! a loop whose iterations follow the data does, without leaving the code cache). A node with
//! a second child goes to the runtime, which finds or makes it (a hash map of every child that
//! is not some node's cached one), refills the cache and, for functions of at most
//! [`DENSE_PATHS_MAX`] paths, gives the node a dense child array that code reads (recursive
//! functions' runs branch at their root at every activation). The runtime applies the
//! monitor's caps at the same path as the monitor would: a run longer than [`RUN_PATHS_MAX`]
//! paths, or one that needs a node past [`RUN_NODES_MAX`], is abandoned (counted). The monitor
//! reads the nodes when the profile is taken ([`crate::ContextView::runs`]), and a hand-over's
//! while the thread runs ([`crate::ContextView::run_node`]): a node's parent and path never
//! change once it is made, and nodes are made in address order.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rustc_hash::FxHashMap;

use crate::reserve::Reserved;

/// Longest run kept, in Ball-Larus paths: the monitor's `PAP_MAX_PATHS`, which is this
/// constant. A longer activation (a main loop) abandons its run.
pub const RUN_PATHS_MAX: usize = 1 << 20;

/// Run nodes a thread keeps at most (64 bytes each: 256 MiB of address space, reserved, not
/// committed), the monitor's `PAP_STORE_MAX` too. A run that needs a node past it is abandoned;
/// runs already stored keep counting.
pub const RUN_NODES_MAX: usize = 1 << 22;

/// Functions of at most this many paths get a dense child array (8 bytes a path) at every
/// node with two children or more: every instrumented function (plans have at most 4096
/// paths). With 64, busybox gzip's runs went to the runtime 85 000 times on 1 MB of input
/// (malloc's 31 000); with 4096, 144 (2 000), at the same peak memory. The arrays' space is
/// capped (`DENSE_WORDS_MAX` words).
pub const DENSE_PATHS_MAX: u32 = 4096;

/// Words of dense child arrays a thread has at most (128 MiB reserved); past it, nodes keep
/// their one-entry cache alone.
const DENSE_WORDS_MAX: usize = 1 << 24;

/// One node of a run trie: a run prefix. Translated code reads the cache and the dense
/// array, adds to `count`, and makes a childless node's first child; the runtime does the
/// rest. A node is made when `made` is 1 (written last).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RunNode {
    /// The path id of the child taken last, plus one (0: no child yet).
    pub cache_id: u64,
    /// Host address of that child.
    pub cache_child: u64,
    /// Runs that ended here (activations whose whole run is this prefix).
    pub count: u64,
    /// Host address of its dense child array (path id → child's host address, 0: not made
    /// or not known yet), or 0 for none.
    pub children: u64,
    /// Host address of its parent, 0 for a root (a numbering's empty run).
    pub parent: u64,
    /// The prefix's last path id; a root's numbering, with [`HAND_IN_ROOT`] added for a
    /// hand-in root.
    pub path: u64,
    /// Paths in the prefix.
    pub depth: u64,
    /// 1 once the node is written.
    pub made: u64,
}

impl RunNode {
    /// Offset of [`RunNode::cache_id`], bytes.
    pub const CACHE_ID: usize = offset_of!(RunNode, cache_id);
    /// Offset of [`RunNode::cache_child`], bytes.
    pub const CACHE_CHILD: usize = offset_of!(RunNode, cache_child);
    /// Offset of [`RunNode::count`], bytes.
    pub const COUNT: usize = offset_of!(RunNode, count);
    /// Offset of [`RunNode::children`], bytes.
    pub const CHILDREN: usize = offset_of!(RunNode, children);
    /// Offset of [`RunNode::parent`], bytes.
    pub const PARENT: usize = offset_of!(RunNode, parent);
    /// Offset of [`RunNode::path`], bytes.
    pub const PATH: usize = offset_of!(RunNode, path);
    /// Offset of [`RunNode::depth`], bytes.
    pub const DEPTH: usize = offset_of!(RunNode, depth);
    /// Offset of [`RunNode::made`], bytes.
    pub const MADE: usize = offset_of!(RunNode, made);
    /// Bytes of a node.
    pub const SIZE: usize = size_of::<RunNode>();
}

/// Added to a root's [`RunNode::path`] (its numbering) when it is a *hand-in root*: the run
/// so far of an activation that started cold and went on instrumented at a back edge
/// (docs/paths-design.md, "Hand-in as built"), which only the monitor knows; the guest's
/// steps after it go under it.
pub const HAND_IN_ROOT: u64 = 1 << 32;

/// A run node as the monitor reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunInfo {
    /// The parent's index, `None` for a root (a numbering's empty run).
    pub parent: Option<u32>,
    /// The prefix's last path id; a root's numbering.
    pub path: u32,
    /// A hand-in root ([`HAND_IN_ROOT`]): a root that stands for the run, so far, of the
    /// activation the hand-in event that names it handed in.
    pub hand_in: bool,
    /// Runs that ended here.
    pub count: u64,
}

/// The trie's mapping, shared by the writer ([`RunTrie`]) and readers.
pub(crate) struct RunMapping {
    /// [`RUN_NODES_MAX`] nodes; index 0 is never one.
    mem: Reserved<RunNode>,
    /// Runs abandoned so far.
    abandoned: AtomicU64,
}

// SAFETY: plain memory; one writer thread, and readers read only nodes whose `made` they saw
// as 1 (written after the rest) through volatile loads.
unsafe impl Send for RunMapping {}
// SAFETY: as above.
unsafe impl Sync for RunMapping {}

/// The readers' handle on a thread's runs: empty until the thread makes its first root.
pub(crate) type SharedRuns = Arc<OnceLock<Arc<RunMapping>>>;

/// Where nodes are taken from: the context area's `run_next` and `run_left`, which translated
/// code takes from too.
pub(crate) struct NodeSupply<'a> {
    pub(crate) next: &'a mut u64,
    pub(crate) left: &'a mut u64,
}

/// One thread's run trie, grown by that thread (its runtime and its translated code). Nodes
/// never move.
pub(crate) struct RunTrie {
    shared: SharedRuns,
    map: Option<Arc<RunMapping>>,
    /// Children no node's cache holds, by `(parent, path id)` host address and id.
    children: FxHashMap<(u64, u32), u64>,
    /// Each numbering's root, by numbering.
    roots: FxHashMap<u32, u64>,
    /// Dense child arrays: words handed out of `dense`.
    dense: Option<Reserved<u64>>,
    dense_used: usize,
}

impl RunTrie {
    /// A trie with no mapping yet.
    pub(crate) fn new() -> RunTrie {
        RunTrie {
            shared: Arc::default(),
            map: None,
            children: FxHashMap::default(),
            roots: FxHashMap::default(),
            dense: None,
            dense_used: 0,
        }
    }

    /// The readers' handle.
    pub(crate) fn shared(&self) -> SharedRuns {
        Arc::clone(&self.shared)
    }

    /// The root of numbering `numbering`'s runs: its host address, or 0 when no node can be
    /// had (the trie is full, or its address space cannot be reserved).
    pub(crate) fn root(&mut self, numbering: u32, supply: NodeSupply) -> u64 {
        if let Some(&r) = self.roots.get(&numbering) {
            return r;
        }
        if self.map.is_none() {
            let Ok(mem) = Reserved::new(RUN_NODES_MAX) else {
                return 0;
            };
            let map = Arc::new(RunMapping {
                mem,
                abandoned: AtomicU64::new(0),
            });
            let _ = self.shared.set(Arc::clone(&map));
            *supply.next = map.mem.base() as u64 + RunNode::SIZE as u64;
            *supply.left = RUN_NODES_MAX as u64 - 1;
            self.map = Some(map);
        }
        match take(supply, 0, numbering as u64, 0) {
            Some(r) => {
                self.roots.insert(numbering, r);
                r
            }
            None => 0,
        }
    }

    /// A new hand-in root of numbering `numbering` ([`HAND_IN_ROOT`]): its host address, or 0
    /// when no node can be had (the trie is full or has no mapping yet: a numbering's root
    /// is made first).
    pub(crate) fn hand_in_root(&mut self, numbering: u32, supply: NodeSupply) -> u64 {
        if self.map.is_none() {
            return 0;
        }
        take(supply, 0, numbering as u64 | HAND_IN_ROOT, 0).unwrap_or(0)
    }

    /// The child of the node at host address `node` for path id `id` of a function of `paths`
    /// paths (found or made), with the node's cache set to it (and its dense array, which it
    /// gets with its second child when `paths` is at most [`DENSE_PATHS_MAX`]): its host
    /// address, or 0 when the run is abandoned — it would pass [`RUN_PATHS_MAX`] paths or need
    /// a node past [`RUN_NODES_MAX`] — which is counted. `node` must be one of this trie's.
    pub(crate) fn step(&mut self, node: u64, id: u32, paths: u32, supply: NodeSupply) -> u64 {
        if self.index_of(node).is_none() {
            debug_assert!(false, "not a run node: {node:#x}");
            return 0;
        }
        // SAFETY: a made node of this thread's trie (checked), which only this thread writes.
        let n = unsafe { &mut *(node as *mut RunNode) };
        // The child its cache holds (translated code may have made it) goes to the map before
        // the cache changes; dense arrays hold only children the map has.
        if n.cache_id != 0 {
            self.children
                .entry((node, (n.cache_id - 1) as u32))
                .or_insert(n.cache_child);
        }
        let child = match self.children.get(&(node, id)) {
            Some(&c) => Some(c),
            None if n.depth as usize >= RUN_PATHS_MAX => None,
            None => {
                let c = take(supply, node, id as u64, n.depth + 1);
                if let Some(c) = c {
                    self.children.insert((node, id), c);
                }
                c
            }
        };
        let Some(child) = child else {
            if let Some(m) = &self.map {
                m.abandoned.fetch_add(1, Ordering::Relaxed);
            }
            return 0;
        };
        let had_child = n.cache_id != 0;
        n.cache_id = id as u64 + 1;
        n.cache_child = child;
        if n.children == 0 && had_child && paths <= DENSE_PATHS_MAX {
            n.children = self.dense_array(paths);
        }
        if n.children != 0 && id < paths {
            // SAFETY: a dense array of `paths` words this trie handed out (`dense_array`).
            unsafe { *(n.children as *mut u64).add(id as usize) = child };
        }
        child
    }

    /// A zeroed dense child array of `paths` words, or 0 when there is no room.
    fn dense_array(&mut self, paths: u32) -> u64 {
        if self.dense.is_none() {
            self.dense = Reserved::new(DENSE_WORDS_MAX).ok();
        }
        let Some(dense) = &self.dense else { return 0 };
        if self.dense_used + paths as usize > DENSE_WORDS_MAX {
            return 0;
        }
        // SAFETY: within the reservation (checked), never handed out before: zero.
        let a = unsafe { dense.base().add(self.dense_used) } as u64;
        self.dense_used += paths as usize;
        a
    }

    /// Sets the abandoned runs' count to 0.
    pub(crate) fn forget_abandoned(&mut self) {
        if let Some(m) = &self.map {
            m.abandoned.store(0, Ordering::Relaxed);
        }
    }

    /// Counts one run ending at the node at host address `node` (0: none).
    pub(crate) fn end(&mut self, node: u64) {
        if self.index_of(node).is_some() {
            // SAFETY: a made node of this thread's, whose count only this thread writes.
            unsafe { (*(node as *mut RunNode)).count += 1 };
        }
    }

    /// The index of the node at host address `addr`, if it is one of this trie's.
    pub(crate) fn index_of(&self, addr: u64) -> Option<u32> {
        index_in(self.map.as_ref()?, addr)
    }
}

/// The index of host address `addr` in `map`'s nodes, if it is a node's (made or not).
fn index_in(map: &RunMapping, addr: u64) -> Option<u32> {
    let off = addr.checked_sub(map.mem.base() as u64)?;
    let i = off / RunNode::SIZE as u64;
    (off % RunNode::SIZE as u64 == 0 && i >= 1 && (i as usize) < RUN_NODES_MAX).then_some(i as u32)
}

/// Takes the next node from `supply` and writes it: under `parent` (a host address, 0 for a
/// root) for `path`, `depth` paths deep. `None` when none is left.
fn take(supply: NodeSupply, parent: u64, path: u64, depth: u64) -> Option<u64> {
    if *supply.left == 0 {
        return None;
    }
    let addr = *supply.next;
    *supply.next += RunNode::SIZE as u64;
    *supply.left -= 1;
    // SAFETY: `addr` is the supply's next node: in the mapping (`left` counted it), never
    // written before (zero).
    unsafe {
        let n = addr as *mut RunNode;
        (*n).parent = parent;
        (*n).path = path;
        (*n).depth = depth;
        std::ptr::addr_of_mut!((*n).made).write_volatile(1);
    }
    Some(addr)
}

impl RunMapping {
    /// Node `index` as it is now, if made.
    pub(crate) fn node(&self, index: u32) -> Option<RunInfo> {
        if index == 0 || index as usize >= RUN_NODES_MAX {
            return None;
        }
        // SAFETY: in the mapping (checked). `made` is read first: the rest of a made node was
        // written before it and its parent and path never change; its count is a whole
        // aligned word the owner may be adding to (volatile).
        unsafe {
            let n = self.mem.base().add(index as usize);
            if std::ptr::addr_of!((*n).made).read_volatile() != 1 {
                return None;
            }
            let parent = std::ptr::addr_of!((*n).parent).read_volatile();
            let path = std::ptr::addr_of!((*n).path).read_volatile();
            Some(RunInfo {
                parent: match parent {
                    0 => None,
                    p => Some(index_in(self, p)?),
                },
                path: path as u32,
                hand_in: parent == 0 && path & HAND_IN_ROOT != 0,
                count: std::ptr::addr_of!((*n).count).read_volatile(),
            })
        }
    }

    /// Every made node, by index (index 0 is `None`): nodes are made in index order, so the
    /// first one not made ends them.
    pub(crate) fn nodes(&self) -> Vec<Option<RunInfo>> {
        let mut out = vec![None];
        for i in 1..RUN_NODES_MAX as u32 {
            match self.node(i) {
                Some(n) => out.push(Some(n)),
                None => break,
            }
        }
        out
    }

    /// Runs abandoned so far.
    pub(crate) fn abandoned(&self) -> u64 {
        self.abandoned.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_what_emitted_code_assumes() {
        assert_eq!(RunNode::SIZE, 64);
        assert_eq!(RunNode::CACHE_ID, 0);
        assert_eq!(RunNode::CACHE_CHILD, 8);
        assert_eq!(RunNode::COUNT, 16);
        assert_eq!(RunNode::CHILDREN, 24);
        assert_eq!(RunNode::MADE, 56);
    }

    /// A trie and its supply words.
    struct Fixture {
        trie: RunTrie,
        next: u64,
        left: u64,
    }

    impl Fixture {
        fn new() -> Fixture {
            Fixture {
                trie: RunTrie::new(),
                next: 0,
                left: 0,
            }
        }
        fn root(&mut self, numbering: u32) -> u64 {
            let supply = NodeSupply {
                next: &mut self.next,
                left: &mut self.left,
            };
            self.trie.root(numbering, supply)
        }
        fn hand_in_root(&mut self, numbering: u32) -> u64 {
            let supply = NodeSupply {
                next: &mut self.next,
                left: &mut self.left,
            };
            self.trie.hand_in_root(numbering, supply)
        }
        fn step(&mut self, node: u64, id: u32, paths: u32) -> u64 {
            let supply = NodeSupply {
                next: &mut self.next,
                left: &mut self.left,
            };
            self.trie.step(node, id, paths, supply)
        }
        /// A first child made as translated code makes it.
        fn code_child(&mut self, node: u64, id: u32) -> u64 {
            let c = self.next;
            self.next += RunNode::SIZE as u64;
            self.left -= 1;
            // SAFETY (test): nodes of the fixture's trie, written as emitted code writes them.
            unsafe {
                let n = c as *mut RunNode;
                let p = node as *mut RunNode;
                (*n).parent = node;
                (*n).path = id as u64;
                (*p).cache_id = id as u64 + 1;
                (*p).cache_child = c;
                (*n).depth = (*p).depth + 1;
                (*n).made = 1;
            }
            c
        }
        fn node(&self, addr: u64) -> RunNode {
            // SAFETY (test): a node of the fixture's trie.
            unsafe { *(addr as *const RunNode) }
        }
    }

    #[test]
    fn steps_find_or_make_children_and_fill_the_caches() {
        let mut f = Fixture::new();
        let shared = f.trie.shared();
        assert!(shared.get().is_none(), "no mapping before the first root");
        let root = f.root(7);
        assert_ne!(root, 0);
        assert_eq!(f.root(7), root, "one root per numbering");
        assert_ne!(f.root(8), root);
        // The first child made by code, the second by the runtime: both known after.
        let a = f.code_child(root, 3);
        let b = f.step(root, 4, 8);
        assert_ne!(b, a);
        assert_eq!(f.step(root, 3, 8), a, "code's child is found");
        assert_eq!(f.step(root, 4, 8), b);
        let r = f.node(root);
        assert_eq!(
            (r.cache_id, r.cache_child),
            (5, b),
            "the cache holds the last"
        );
        assert_ne!(r.children, 0, "a dense array from the second child on");
        // SAFETY (test): the root's dense array of 8 words.
        let dense = unsafe { std::slice::from_raw_parts(r.children as *const u64, 8) };
        assert_eq!((dense[3], dense[4], dense[0]), (a, b, 0));
        let aa = f.step(a, 3, 8);
        f.trie.end(aa);
        f.trie.end(aa);
        f.trie.end(0);
        let m = shared.get().unwrap();
        let i = |addr| f.trie.index_of(addr).unwrap();
        assert_eq!(
            m.node(i(root)),
            Some(RunInfo {
                parent: None,
                path: 7,
                count: 0,
                hand_in: false,
            })
        );
        assert_eq!(
            m.node(i(aa)),
            Some(RunInfo {
                parent: Some(i(a)),
                path: 3,
                count: 2,
                hand_in: false,
            })
        );
        let nodes = m.nodes();
        assert_eq!(nodes.len(), 6, "index 0, two roots, a, b, aa");
        assert_eq!(nodes[i(b) as usize].map(|n| n.parent), Some(Some(i(root))));
        assert_eq!(m.abandoned(), 0);
    }

    #[test]
    fn hand_in_roots_are_new_roots_each_time() {
        let mut f = Fixture::new();
        assert_eq!(f.hand_in_root(3), 0, "no mapping before a numbering's root");
        let shared = f.trie.shared();
        let root = f.root(3);
        let (h1, h2) = (f.hand_in_root(3), f.hand_in_root(3));
        assert!(h1 != 0 && h2 != 0 && h1 != h2 && h1 != root);
        assert_eq!(f.root(3), root, "a numbering's root stays one");
        let c = f.step(h1, 5, 8);
        f.trie.end(c);
        let m = shared.get().unwrap();
        let i = |addr| f.trie.index_of(addr).unwrap();
        assert_eq!(
            m.node(i(h2)),
            Some(RunInfo {
                parent: None,
                path: 3,
                count: 0,
                hand_in: true,
            })
        );
        assert_eq!(f.node(c).depth, 1, "paths are counted from the hand-in");
        assert_eq!(
            m.node(i(c)).map(|n| (n.parent, n.hand_in)),
            Some((Some(i(h1)), false))
        );
        assert!(!m.node(i(root)).unwrap().hand_in);
    }

    #[test]
    fn many_paths_get_no_dense_array() {
        let mut f = Fixture::new();
        let root = f.root(1);
        f.step(root, 0, DENSE_PATHS_MAX + 1);
        f.step(root, 1, DENSE_PATHS_MAX + 1);
        assert_eq!(f.node(root).children, 0);
    }

    #[test]
    fn a_run_past_the_cap_is_abandoned() {
        let mut f = Fixture::new();
        let root = f.root(1);
        // SAFETY (test): pretend the root is RUN_PATHS_MAX paths deep.
        unsafe { (*(root as *mut RunNode)).depth = RUN_PATHS_MAX as u64 };
        assert_eq!(f.step(root, 0, 4), 0);
        assert_eq!(f.trie.shared().get().unwrap().abandoned(), 1);
        f.left = 0;
        assert_eq!(f.root(2), 0, "no node left");
    }
}
