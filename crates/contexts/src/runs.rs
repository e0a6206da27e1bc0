//! PAP run tries of instrumented activations (#21 step 3d; docs/paths-design.md, "Step 3d as
//! built"): per guest thread, each instrumented activation's run — its sequence of Ball-Larus
//! path ids, PAP's cyclic path (Wang, Li, Zhou 2012, §3) — is a node of a prefix tree that
//! translated code steps at every path end and counts at the activation's end.
//!
//! ```text
//! activation start:  run = root of the numbering (one per numbering and thread)
//! path end (id p):   run.cache_id == p ? run = run.cache_child : ──▶ runtime: RunTrie::step
//! activation end:    (the last path's step, then) run.count += 1
//! ```
//!
//! `run` is the host address of a [`RunNode`] (0: the activation records no run — its run was
//! abandoned — and every step is skipped). The runtime makes a child on a cache miss and
//! refills the cache, applying the monitor's caps at the same path as the monitor would: a run
//! longer than [`RUN_PATHS_MAX`] paths, or one that needs a node past [`RUN_NODES_MAX`], is
//! abandoned (counted in `abandoned`). The monitor reads the nodes when the profile is taken
//! ([`crate::ContextView::runs`]), and a hand-over's nodes while the thread runs
//! ([`crate::ContextView::run_node`]): a node's parent and path never change once published.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rustc_hash::FxHashMap;

use crate::reserve::Reserved;

/// Longest run kept, in Ball-Larus paths: the monitor's `PAP_MAX_PATHS`, which is this
/// constant. A longer activation (a main loop) abandons its run.
pub const RUN_PATHS_MAX: usize = 1 << 20;

/// Run nodes a thread keeps at most (32 bytes each: 128 MiB of address space, reserved, not
/// committed), the monitor's `PAP_STORE_MAX` too. A run that needs a node past it is abandoned;
/// runs already stored keep counting.
pub const RUN_NODES_MAX: usize = 1 << 22;

/// No child in a node's cache (a path id is below `MAX_PLAN_PATHS`).
pub const NO_CACHED_ID: u64 = u64::MAX;

/// One node of a run trie: a run prefix. Translated code reads `cache_id` and `cache_child`
/// and adds to `count`; the runtime writes the rest, before the node is published.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RunNode {
    /// Path id of the child taken last ([`NO_CACHED_ID`]: none yet).
    pub cache_id: u64,
    /// Host address of that child.
    pub cache_child: u64,
    /// Runs that ended here (activations whose whole run is this prefix).
    pub count: u64,
    /// The parent's index (`u32::MAX` for a root) in the low half; the prefix's last path id
    /// (a root: its numbering) in the high half.
    link: u64,
}

impl RunNode {
    /// Offset of [`RunNode::cache_id`], bytes.
    pub const CACHE_ID: usize = offset_of!(RunNode, cache_id);
    /// Offset of [`RunNode::cache_child`], bytes.
    pub const CACHE_CHILD: usize = offset_of!(RunNode, cache_child);
    /// Offset of [`RunNode::count`], bytes.
    pub const COUNT: usize = offset_of!(RunNode, count);
}

/// A run node as the monitor reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunInfo {
    /// The parent's index, `None` for a root (a numbering's empty run).
    pub parent: Option<u32>,
    /// The prefix's last path id; a root's numbering.
    pub path: u32,
    /// Runs that ended here.
    pub count: u64,
}

/// The trie's mapping, shared by the writer ([`RunTrie`]) and readers.
pub(crate) struct RunMapping {
    mem: Reserved<RunNode>,
    /// Nodes handed out, index 0 (never used) included (Release after each node is written).
    used: AtomicU64,
    /// Runs abandoned so far.
    abandoned: AtomicU64,
}

// SAFETY: plain memory; one writer thread, and readers read only nodes below `used` (whose
// links were written before `used` covered them) through volatile loads.
unsafe impl Send for RunMapping {}
// SAFETY: as above.
unsafe impl Sync for RunMapping {}

/// The readers' handle on a thread's runs: empty until the thread makes its first root.
pub(crate) type SharedRuns = Arc<OnceLock<Arc<RunMapping>>>;

/// One thread's run trie, grown by that thread's runtime. Nodes never move.
pub(crate) struct RunTrie {
    shared: SharedRuns,
    map: Option<Arc<RunMapping>>,
    used: usize,
    /// Children by `(parent index, path id)`.
    children: FxHashMap<(u32, u32), u32>,
    /// Paths in each node's prefix, by index.
    depth: Vec<u32>,
    /// Each numbering's root, by numbering.
    roots: FxHashMap<u32, u32>,
}

impl RunTrie {
    /// A trie with no mapping yet.
    pub(crate) fn new() -> RunTrie {
        RunTrie {
            shared: Arc::default(),
            map: None,
            // Index 0 stays unused: an index of 0 means "no run" in a hand-over.
            used: 1,
            children: FxHashMap::default(),
            depth: vec![0],
            roots: FxHashMap::default(),
        }
    }

    /// The readers' handle.
    pub(crate) fn shared(&self) -> SharedRuns {
        Arc::clone(&self.shared)
    }

    /// The root of numbering `numbering`'s runs: its host address, or 0 when no node can be
    /// had (the trie is full, or its address space cannot be reserved).
    pub(crate) fn root(&mut self, numbering: u32) -> u64 {
        if let Some(&r) = self.roots.get(&numbering) {
            return self.addr(r);
        }
        match self.make(u32::MAX, numbering, 0) {
            Some(r) => {
                self.roots.insert(numbering, r);
                self.addr(r)
            }
            None => 0,
        }
    }

    /// The child of the node at host address `node` for path id `id` (found or made), with
    /// the node's cache set to it: its host address, or 0 when the run is abandoned — it
    /// would pass [`RUN_PATHS_MAX`] paths or need a node past [`RUN_NODES_MAX`] — which is
    /// counted. `node` must be one of this trie's.
    pub(crate) fn step(&mut self, node: u64, id: u32) -> u64 {
        let Some(parent) = self.index_of(node) else {
            debug_assert!(false, "not a run node: {node:#x}");
            return 0;
        };
        let child = match self.children.get(&(parent, id)) {
            Some(&c) => Some(c),
            None if self.depth[parent as usize] as usize >= RUN_PATHS_MAX => None,
            None => {
                let depth = self.depth[parent as usize] + 1;
                let c = self.make(parent, id, depth);
                if let Some(c) = c {
                    self.children.insert((parent, id), c);
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
        let addr = self.addr(child);
        // SAFETY: `parent` is a node of the mapping below `used`, written by this thread
        // alone; readers do not read its cache.
        unsafe {
            let n = self.node_ptr(parent);
            (*n).cache_id = id as u64;
            (*n).cache_child = addr;
        }
        addr
    }

    /// Counts one run ending at the node at host address `node` (0: none).
    pub(crate) fn end(&mut self, node: u64) {
        if let Some(i) = self.index_of(node) {
            // SAFETY: a published node of this thread's, whose count only this thread writes.
            unsafe { (*self.node_ptr(i)).count += 1 };
        }
    }

    /// The index of the node at host address `addr`, if it is one of this trie's.
    pub(crate) fn index_of(&self, addr: u64) -> Option<u32> {
        let base = self.map.as_ref()?.mem.base() as u64;
        let off = addr.checked_sub(base)?;
        let i = off / size_of::<RunNode>() as u64;
        (off % size_of::<RunNode>() as u64 == 0 && i >= 1 && (i as usize) < self.used)
            .then_some(i as u32)
    }

    fn addr(&self, index: u32) -> u64 {
        self.node_ptr(index) as u64
    }

    fn node_ptr(&self, index: u32) -> *mut RunNode {
        let map = self.map.as_ref().expect("a node was made");
        // SAFETY: callers pass indices below `used`, inside the mapping.
        unsafe { map.mem.base().add(index as usize) }
    }

    /// A new node under `parent` (`u32::MAX`: a root) for `path`, `depth` paths deep: its
    /// index, or `None` past [`RUN_NODES_MAX`] nodes.
    fn make(&mut self, parent: u32, path: u32, depth: u32) -> Option<u32> {
        if self.used >= RUN_NODES_MAX {
            return None;
        }
        if self.map.is_none() {
            let map = Arc::new(RunMapping {
                mem: Reserved::new(RUN_NODES_MAX).ok()?,
                used: AtomicU64::new(1),
                abandoned: AtomicU64::new(0),
            });
            let _ = self.shared.set(Arc::clone(&map));
            self.map = Some(map);
        }
        let index = self.used as u32;
        // SAFETY: `index` is in the mapping (checked) and beyond `used`: no reader looks at it
        // yet.
        unsafe {
            self.node_ptr(index).write(RunNode {
                cache_id: NO_CACHED_ID,
                cache_child: 0,
                count: 0,
                link: parent as u64 | (path as u64) << 32,
            });
        }
        self.used += 1;
        self.depth.push(depth);
        let map = self.map.as_ref().expect("made above");
        map.used.store(self.used as u64, Ordering::Release);
        Some(index)
    }
}

impl RunMapping {
    /// Node `index` as it is now, if published (index 0 never is).
    pub(crate) fn node(&self, index: u32) -> Option<RunInfo> {
        let used = self.used.load(Ordering::Acquire);
        if index == 0 || index as u64 >= used {
            return None;
        }
        // SAFETY: a published node: its link was written before the Release that published
        // `used`; its count is a whole aligned word the owner may be adding to (volatile).
        unsafe {
            let n = self.mem.base().add(index as usize);
            let link = std::ptr::addr_of!((*n).link).read_volatile();
            let count = std::ptr::addr_of!((*n).count).read_volatile();
            let parent = link as u32;
            Some(RunInfo {
                parent: (parent != u32::MAX).then_some(parent),
                path: (link >> 32) as u32,
                count,
            })
        }
    }

    /// Nodes published so far, index 0 included.
    pub(crate) fn len(&self) -> u32 {
        self.used.load(Ordering::Acquire) as u32
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
        assert_eq!(size_of::<RunNode>(), 32);
        assert_eq!(RunNode::CACHE_ID, 0);
        assert_eq!(RunNode::CACHE_CHILD, 8);
        assert_eq!(RunNode::COUNT, 16);
    }

    #[test]
    fn steps_find_or_make_children_and_fill_the_cache() {
        let mut t = RunTrie::new();
        let shared = t.shared();
        assert!(shared.get().is_none(), "no mapping before the first root");
        let root = t.root(7);
        assert_ne!(root, 0);
        assert_eq!(t.root(7), root, "one root per numbering");
        let other = t.root(8);
        assert_ne!(other, root);
        let a = t.step(root, 3);
        let b = t.step(a, 3);
        assert_eq!(t.step(root, 3), a, "found again");
        let c = t.step(root, 4);
        assert_ne!(c, a);
        // SAFETY (test): nodes of `t`, read as emitted code reads them.
        let cache = unsafe { (*(root as *const RunNode)).cache_child };
        assert_eq!(cache, c, "the cache holds the child taken last");
        t.end(b);
        t.end(b);
        t.end(0);
        let m = shared.get().unwrap();
        let i = |addr| t.index_of(addr).unwrap();
        assert_eq!(
            m.node(i(root)),
            Some(RunInfo {
                parent: None,
                path: 7,
                count: 0
            })
        );
        assert_eq!(
            m.node(i(b)),
            Some(RunInfo {
                parent: Some(i(a)),
                path: 3,
                count: 2
            })
        );
        assert_eq!(m.node(0), None);
        assert_eq!(m.node(m.len()), None);
        assert_eq!(m.abandoned(), 0);
    }

    #[test]
    fn a_run_past_the_cap_is_abandoned() {
        let mut t = RunTrie::new();
        let root = t.root(1);
        let root_index = t.index_of(root).unwrap();
        // Pretend the root is RUN_PATHS_MAX paths deep.
        t.depth[root_index as usize] = RUN_PATHS_MAX as u32;
        assert_eq!(t.step(root, 0), 0);
        assert_eq!(t.shared().get().unwrap().abandoned(), 1);
    }
}
