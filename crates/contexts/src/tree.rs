//! Context nodes: an arena of 256-byte nodes that never moves (emitted code holds their host
//! addresses), written by the guest thread, and a read-only view that resolves ids from
//! another thread.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::reserve::Reserved;

/// Contexts per thread (256 bytes each: 64 MiB of address space, touched as they are made).
/// Past it a new context is its parent ([`crate::Contexts::contexts_folded`] counts them).
pub const CONTEXTS_MAX: usize = 1 << 18;

/// Levels of the tree below the root. A call from a context at this depth goes to the one
/// [`DEEPER`] context under it, whose calls stay in it: deep recursion is one `[deeper]` frame,
/// as in the monitor's call tree (a 100 000-deep recursion would otherwise be 100 000
/// contexts, and flame graphs' folded stacks cost their depth per stack).
pub const MAX_DEPTH: u32 = 128;

/// Function of the context standing for every frame past [`MAX_DEPTH`] (not a guest address:
/// non-canonical).
pub const DEEPER: u64 = 0xdeef_0000_0000_0000;

/// A context: a dense index into the thread's arena, in creation order. The root is 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContextId(pub u32);

impl ContextId {
    /// The root: the thread before its first function (its function is 0).
    pub const ROOT: ContextId = ContextId(0);
}

/// Entries of a node's child cache: [`DIRECT_ENTRIES`] for direct calls, in groups of
/// [`DIRECT_PROBES`]; a direct call probes its callee's group ([`Node::direct_probes`], fixed
/// when it is translated), so a caller that calls several functions in turn (busybox sort's
/// comparison calls five) keeps them; then [`INDIRECT_ENTRIES`] for indirect calls, which probe
/// them all, so that a callback called from a loop that also calls directly (a sort calling its
/// comparison) neither evicts the direct calls nor is evicted by them, and a call site that
/// calls a few functions in turn (a table of function pointers) keeps them.
pub const CACHE_ENTRIES: usize = DIRECT_ENTRIES + INDIRECT_ENTRIES;

/// Cache entries shared by direct calls (a power of two).
pub const DIRECT_ENTRIES: usize = 8;

/// Entries a direct call probes (a power of two, at most [`DIRECT_ENTRIES`]).
pub const DIRECT_PROBES: usize = 4;

/// Cache entries of indirect calls (a power of two), from [`INDIRECT_FIRST`]. Measured on
/// funcptr_qsort, whose benchmark loop calls six functions through one pointer table: with one
/// entry, 250 300 of its calls went to the runtime.
pub const INDIRECT_ENTRIES: usize = 4;

/// The first cache entry of indirect calls.
pub const INDIRECT_FIRST: usize = DIRECT_ENTRIES;

/// One entry of a node's child cache.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheEntry {
    /// `!entry` of the callee's function (0: empty; no entry is `u64::MAX`), so that
    /// translated code compares it flag-free: `lea rcx, [rcx + entry + 1]` is 0 iff they match.
    pub key: u64,
    /// Host address of the child context's node.
    pub child: u64,
}

/// One context node (four cache lines). The cache changes as the thread runs; the other fields
/// are written once, before the node's id is published.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Node {
    /// The child cache, in front of the thread's map of children.
    pub cache: [CacheEntry; CACHE_ENTRIES],
    /// Host address of the parent's node (0 for the root).
    pub parent: u64,
    /// Guest address of the function's entry (0 for the root, [`DEEPER`]).
    pub function: u64,
    /// Its id.
    pub id: u32,
    /// Levels below the root (the root is 0).
    pub depth: u32,
    /// The parent's id (the root's is its own).
    pub parent_id: u32,
}

impl Node {
    /// Offset of the child cache, bytes.
    pub const CACHE: usize = offset_of!(Node, cache);
    /// Offset of [`Node::id`], bytes.
    pub const ID: usize = offset_of!(Node, id);
    /// Offset of [`Node::function`], bytes.
    pub const FUNCTION: usize = offset_of!(Node, function);
    /// Offset of [`Node::depth`], bytes.
    pub const DEPTH: usize = offset_of!(Node, depth);
    /// Offset of [`Node::parent`], bytes.
    pub const PARENT: usize = offset_of!(Node, parent);

    /// The cache entries direct calls of the function entered at `callee` probe, in order:
    /// the group of [`DIRECT_PROBES`] its hash picks, from the entry it hashes to (bits 4 up:
    /// entries are mostly 16-byte aligned). A miss fills the first empty one, else the first.
    pub fn direct_probes(callee: u64) -> [usize; DIRECT_PROBES] {
        let h = ((callee >> 4 ^ callee >> 7 ^ callee >> 10) & (DIRECT_ENTRIES as u64 - 1)) as usize;
        std::array::from_fn(|i| h ^ i)
    }

    /// The cache entries indirect calls probe, in order (translated code probes them all);
    /// a miss fills the first empty one, else the one the callee's address hashes to.
    pub fn indirect_probes() -> [usize; INDIRECT_ENTRIES] {
        std::array::from_fn(|i| INDIRECT_FIRST + i)
    }

    /// The indirect entry a miss for `callee` replaces when none is empty.
    pub fn indirect_victim(callee: u64) -> usize {
        INDIRECT_FIRST
            + ((callee >> 4 ^ callee >> 6 ^ callee >> 9) & (INDIRECT_ENTRIES as u64 - 1)) as usize
    }

    /// Byte offset in the node of entry `slot`'s key (its child follows, 8 bytes on).
    pub fn cache_key_offset(slot: usize) -> usize {
        Self::CACHE + slot * size_of::<CacheEntry>()
    }
}

/// What the monitor needs of a context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// Its caller's context ([`ContextId::ROOT`] for the root itself).
    pub parent: ContextId,
    /// Guest address of its function's entry (0: the root; [`DEEPER`]).
    pub function: u64,
    /// Levels below the root.
    pub depth: u32,
}

/// The arena's mapping, shared by the writer ([`Arena`]) and readers ([`ContextView`]).
struct Mapping {
    /// [`CONTEXTS_MAX`] nodes, unmapped when the last user (writer or view) is gone.
    mem: Reserved<Node>,
    /// Nodes written and published (Release after each node is complete).
    published: AtomicU32,
}

// SAFETY: the mapping is plain memory; its writer is one thread (the owner of `Arena`), and
// readers only read the fields written before `published` covered them (see `ContextView`).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

/// The nodes of one thread's tree, appended by that thread. Node addresses never change.
pub(crate) struct Arena {
    map: Arc<Mapping>,
    len: u32,
}

impl Arena {
    /// An arena holding only the root.
    ///
    /// # Errors
    /// The OS error if the address space cannot be reserved.
    pub(crate) fn new() -> std::io::Result<Arena> {
        let mut arena = Arena {
            map: Arc::new(Mapping {
                mem: Reserved::new(CONTEXTS_MAX)?,
                published: AtomicU32::new(0),
            }),
            len: 0,
        };
        arena.push(0, None);
        Ok(arena)
    }

    /// Nodes made so far.
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    /// True when no node can be added.
    pub(crate) fn is_full(&self) -> bool {
        self.len as usize >= CONTEXTS_MAX
    }

    /// Host address of node `id`.
    pub(crate) fn addr(&self, id: ContextId) -> u64 {
        debug_assert!(id.0 < self.len);
        self.map.mem.base() as u64 + id.0 as u64 * size_of::<Node>() as u64
    }

    /// Index of the node at host address `addr`, which must be one of this arena's nodes.
    fn index_of(&self, addr: u64) -> usize {
        let offset = addr.wrapping_sub(self.map.mem.base() as u64);
        let i = offset / size_of::<Node>() as u64;
        assert!(
            offset.is_multiple_of(size_of::<Node>() as u64) && i < self.len as u64,
            "a context address outside the arena (a bug in hotpath)"
        );
        i as usize
    }

    /// The node at host address `addr` (one of this arena's).
    pub(crate) fn at(&self, addr: u64) -> &Node {
        let i = self.index_of(addr);
        // SAFETY: `i` indexes a node written by `push` (`index_of` checks), and the only writer
        // is the caller's thread, which holds `&self`.
        unsafe { &*self.map.mem.base().add(i) }
    }

    /// The child cache of the node at host address `addr`, to refill it.
    pub(crate) fn cache_mut(&mut self, addr: u64) -> &mut [CacheEntry; CACHE_ENTRIES] {
        let i = self.index_of(addr);
        // SAFETY: as in `at`; `&mut self` makes this the only reference the writer holds, and
        // it covers the cache alone, which readers (`ContextView`) never read.
        unsafe { &mut *std::ptr::addr_of_mut!((*self.map.mem.base().add(i)).cache) }
    }

    /// Appends a node for `function` under `parent` (`None`: the root) and publishes it.
    pub(crate) fn push(&mut self, function: u64, parent: Option<ContextId>) -> ContextId {
        assert!(
            !self.is_full(),
            "the context arena is full (a bug in hotpath)"
        );
        let id = ContextId(self.len);
        let (parent_addr, parent_id, depth) = match parent {
            Some(p) => {
                let n = self.at(self.addr(p));
                (self.addr(p), p.0, n.depth + 1)
            }
            None => (0, id.0, 0),
        };
        // SAFETY: `id` is below CONTEXTS_MAX (checked), in the mapping, and not yet published:
        // no reader looks at it.
        unsafe {
            self.map.mem.base().add(id.0 as usize).write(Node {
                cache: [CacheEntry::default(); CACHE_ENTRIES],
                parent: parent_addr,
                function,
                id: id.0,
                depth,
                parent_id,
            })
        };
        self.len += 1;
        self.map.published.store(self.len, Ordering::Release);
        id
    }

    /// A read-only view for another thread.
    pub(crate) fn view(&self) -> ContextView {
        ContextView {
            map: Arc::clone(&self.map),
        }
    }
}

/// Read-only access to a thread's contexts from another thread (the monitor). Resolves the
/// ids the ring carries: a context is published before its id is enqueued.
#[derive(Clone)]
pub struct ContextView {
    map: Arc<Mapping>,
}

impl ContextView {
    /// Contexts published so far.
    pub fn len(&self) -> usize {
        self.map.published.load(Ordering::Acquire) as usize
    }

    /// True if only the root exists (it always does).
    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }

    /// Function, parent and depth of context `id`, or `None` if it is not published (an id
    /// that did not come from this thread's ring).
    pub fn node(&self, id: ContextId) -> Option<NodeInfo> {
        if id.0 as usize >= self.len() {
            return None;
        }
        // SAFETY: `id` is published (Acquire above pairs with the writer's Release), so its
        // `function`, `depth` and `parent_id` are written and never change; the cache fields,
        // which the writer changes, are not read. Each field is read on its own, through raw
        // pointers, so no reference to the racing fields is made.
        unsafe {
            let n = self.map.mem.base().add(id.0 as usize);
            Some(NodeInfo {
                parent: ContextId(std::ptr::addr_of!((*n).parent_id).read()),
                function: std::ptr::addr_of!((*n).function).read(),
                depth: std::ptr::addr_of!((*n).depth).read(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_layout_is_what_emitted_code_assumes() {
        assert_eq!(size_of::<Node>(), 256);
        assert_eq!(Node::CACHE, 0);
        assert_eq!(Node::cache_key_offset(3), 48);
        let mut p = Node::direct_probes(0x401158);
        p.sort_unstable();
        assert!(p == [0, 1, 2, 3] || p == [4, 5, 6, 7]);
        assert_eq!(Node::cache_key_offset(INDIRECT_FIRST), 128);
        assert_eq!(Node::indirect_probes(), [8, 9, 10, 11]);
        assert!(Node::indirect_probes().contains(&Node::indirect_victim(0x401c30)));
        assert_eq!(Node::ID, 208);
    }

    #[test]
    fn the_view_sees_published_nodes_only() {
        let mut a = Arena::new().unwrap();
        let v = a.view();
        assert_eq!(v.len(), 1);
        assert_eq!(v.node(ContextId(1)), None);
        let c = a.push(0x401000, Some(ContextId::ROOT));
        assert_eq!(
            v.node(c),
            Some(NodeInfo {
                parent: ContextId::ROOT,
                function: 0x401000,
                depth: 1
            })
        );
        drop(a);
        assert_eq!(v.node(c).map(|n| n.function), Some(0x401000));
    }
}
