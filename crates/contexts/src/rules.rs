//! [`Contexts`]: one guest thread's contexts — the fast paths exactly as translated code does
//! them, and the rules of the slow paths the runtime applies.

use std::alloc::Layout;
use std::mem::size_of;
use std::ptr::NonNull;

use rustc_hash::FxHashMap;

use crate::area::{ContextArea, Frame, FRAMES_MAX};
use crate::tree::{
    Arena, CacheEntry, ContextId, ContextView, Node, DEEPER, DIRECT_PROBES, INDIRECT_ENTRIES,
    MAX_DEPTH,
};

/// Where the runtime finds the function a guest address belongs to, for the rules that replace
/// a context without a call (an orphan return).
pub trait Functions {
    /// Guest address of the entry of the function containing `addr`: the ELF function symbol
    /// containing it, else `addr` itself (a new function entered there).
    fn containing(&self, addr: u64) -> u64;
}

/// Why a context changed other than by a call or a `ret` to the top frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resync {
    /// A jump to another function's entry: the current context is replaced by a sibling.
    TailCall,
    /// A `ret` to the return address of a frame below the top: the frames above it are popped
    /// (longjmp or exceptions through `ret`, a callee that dropped frames).
    DeeperReturn,
    /// A `ret` to an address no frame returns to (a forged return address, `push; ret` used as
    /// a jump, a stack switch, a frame dropped from a full stack): the current context is
    /// replaced by a sibling for the function containing the target.
    OrphanReturn,
    /// An indirect jump to a frame's return address (`pop reg; jmp *reg`): a return to it.
    JumpReturn,
}

impl Resync {
    /// Every cause, in index order.
    pub const ALL: [Resync; 4] = [
        Resync::TailCall,
        Resync::DeeperReturn,
        Resync::OrphanReturn,
        Resync::JumpReturn,
    ];

    /// Its name in the JSON report (the monitor's names for the same causes).
    pub fn name(self) -> &'static str {
        match self {
            Resync::TailCall => "tail_call",
            Resync::DeeperReturn => "deeper_return",
            Resync::OrphanReturn => "orphan_return",
            Resync::JumpReturn => "jump_return",
        }
    }
}

/// Signal handlers whose `rt_sigreturn` is still awaited, at most (older ones, left by handlers
/// that never returned, e.g. that longjmp'd out, are forgotten first).
const SIGNALS_PENDING_MAX: usize = 64;

/// One guest thread's contexts: its [`ContextArea`] (which translated code also writes), the
/// tree's arena and the map behind the nodes' one-entry caches. Used by that thread only.
pub struct Contexts {
    area: NonNull<ContextArea>,
    /// The area's allocation when `Contexts` made it ([`Contexts::new_owned`]).
    owned: Option<Layout>,
    arena: Arena,
    children: FxHashMap<(u32, u64), ContextId>,
    /// Per handler entered and not yet returned from: the frame depth and the context it
    /// interrupted.
    signals: Vec<(usize, ContextId)>,
    /// Resynchronisations by cause, indexed as [`Resync::ALL`].
    pub resyncs: [u64; Resync::ALL.len()],
    /// Frames dropped from the bottom of a full stack.
    pub dropped_frames: u64,
    /// Contexts not made because the arena was full (the call stayed in the caller's context).
    pub contexts_folded: u64,
}

// SAFETY: `Contexts` is moved to the guest thread it serves and used there alone; the area
// pointer is that thread's, the arena's mapping is Send.
unsafe impl Send for Contexts {}

impl Contexts {
    /// Contexts kept in `area` (part of the translator's thread area), initialised here: no
    /// frames, the root current.
    ///
    /// # Safety
    /// `area` must be valid for reads and writes, stay at its address, and be used only by the
    /// thread that uses this `Contexts` (its translated code included), for as long as this
    /// `Contexts` lives.
    ///
    /// # Errors
    /// The OS error if the arena's address space cannot be reserved.
    pub unsafe fn new(area: NonNull<ContextArea>) -> std::io::Result<Contexts> {
        let arena = Arena::new()?;
        let mut c = Contexts {
            area,
            owned: None,
            arena,
            children: FxHashMap::default(),
            signals: Vec::new(),
            resyncs: [0; Resync::ALL.len()],
            dropped_frames: 0,
            contexts_folded: 0,
        };
        let root = c.arena.addr(ContextId::ROOT);
        c.area_mut().init(root);
        Ok(c)
    }

    /// Contexts with an area of their own (tests, and a runtime not yet placed in a thread
    /// area).
    ///
    /// # Errors
    /// The OS error if memory cannot be had.
    pub fn new_owned() -> std::io::Result<Contexts> {
        let layout = Layout::new::<ContextArea>();
        // SAFETY: the layout is not zero-sized; zeroed bytes are a valid ContextArea (plain
        // integers), initialised by `new`.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let area = NonNull::new(p.cast::<ContextArea>())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        // SAFETY: a fresh allocation owned by the result, freed in `drop`.
        let mut c = unsafe { Contexts::new(area)? };
        c.owned = Some(layout);
        Ok(c)
    }

    fn area(&self) -> &ContextArea {
        // SAFETY: valid for the life of `self` (`new`'s contract), written only by this thread.
        unsafe { self.area.as_ref() }
    }

    fn area_mut(&mut self) -> &mut ContextArea {
        // SAFETY: as in `area`; translated code does not run while the runtime does.
        unsafe { self.area.as_mut() }
    }

    /// The current context.
    pub fn current(&self) -> ContextId {
        ContextId(self.arena.at(self.area().ctx).id)
    }

    /// Guest address of the current context's function (0 for the root context's, which
    /// stands for the thread's first activation).
    pub fn current_function(&self) -> u64 {
        self.arena.at(self.area().ctx).function
    }

    /// True if the current context is the one past [`crate::MAX_DEPTH`] frames, which stands
    /// for every deeper frame, of whatever function.
    pub fn in_deeper(&self) -> bool {
        self.arena.at(self.area().ctx).function == crate::DEEPER
    }

    /// The frames, bottom first: (guest return address, caller's context).
    pub fn frames(&self) -> Vec<(u64, ContextId)> {
        self.area()
            .live_frames()
            .iter()
            .map(|f| (f.return_to, ContextId(self.arena.at(f.caller).id)))
            .collect()
    }

    /// Frames on the stack (the sentinel not counted).
    pub fn depth(&self) -> usize {
        self.area().depth()
    }

    /// Contexts made so far, the root included.
    pub fn len(&self) -> usize {
        self.arena.len()
    }

    /// True if only the root exists.
    pub fn is_empty(&self) -> bool {
        self.arena.len() <= 1
    }

    /// A view of the tree for the monitor.
    pub fn view(&self) -> ContextView {
        self.arena.view()
    }

    /// Rule 1, a direct `call` of the function entered at `callee` that returns to
    /// `return_to`, as translated code does it: frames full → [`Contexts::call_slow`]; push the
    /// frame; a cache entry of [`Node::direct_probes`]`(callee)` holds `callee` → its child,
    /// else [`Contexts::child_slow`].
    pub fn call(&mut self, callee: u64, return_to: u64) -> ContextId {
        self.call_through(false, callee, return_to)
    }

    /// [`Contexts::call`] for an indirect `call` (the cache entries of
    /// [`Node::indirect_probes`]).
    pub fn call_indirect(&mut self, callee: u64, return_to: u64) -> ContextId {
        self.call_through(true, callee, return_to)
    }

    fn call_through(&mut self, indirect: bool, callee: u64, return_to: u64) -> ContextId {
        if self.area().frame_top as usize == ContextArea::FRAMES_END {
            return self.call_slow(indirect, callee, return_to);
        }
        self.push_frame(return_to);
        let node = self.arena.at(self.area().ctx);
        if let Some(e) = probes(indirect, callee)
            .iter()
            .map(|&i| node.cache[i])
            .find(|e| e.key == !callee)
        {
            self.area_mut().ctx = e.child;
            return self.current();
        }
        self.child_slow(indirect, callee)
    }

    /// A call (`indirect` or not) found the frame stack full: drops its bottom half, then
    /// makes the call.
    pub fn call_slow(&mut self, indirect: bool, callee: u64, return_to: u64) -> ContextId {
        let drop = FRAMES_MAX / 2;
        let area = self.area_mut();
        let depth = area.depth();
        area.frames.copy_within(1 + drop..1 + depth, 1);
        area.truncate(depth - drop);
        self.dropped_frames += drop as u64;
        for s in &mut self.signals {
            s.0 = s.0.saturating_sub(drop);
        }
        self.push_frame(return_to);
        self.child_slow(indirect, callee)
    }

    /// A call's frame is pushed and the node's cache did not hold `callee` where the call
    /// (`indirect` or not) probes: steps to the child (found or made) and caches it in the
    /// first empty entry the call probes, else the first.
    pub fn child_slow(&mut self, indirect: bool, callee: u64) -> ContextId {
        let parent = self.current();
        let child = self.child(parent, callee);
        let child_addr = self.arena.addr(child);
        let cache = self.arena.cache_mut(self.arena.addr(parent));
        let probes = probes(indirect, callee);
        let victim = if indirect {
            Node::indirect_victim(callee)
        } else {
            probes[0]
        };
        let slot = probes
            .iter()
            .copied()
            .find(|&i| cache[i].key == 0)
            .unwrap_or(victim);
        cache[slot] = CacheEntry {
            key: !callee,
            child: child_addr,
        };
        self.area_mut().ctx = child_addr;
        child
    }

    /// Rule 2, a `ret` to `target`, as translated code does it: the top frame's return address
    /// is `target` → pop it; else [`Contexts::ret_slow`].
    pub fn ret(&mut self, target: u64, functions: &dyn Functions) -> ContextId {
        let top = self.area().frame_top as usize;
        let f = self.frame_at(top - size_of::<Frame>());
        if f.return_to == target {
            let area = self.area_mut();
            area.frame_top = (top - size_of::<Frame>()) as u64;
            area.ctx = f.caller;
            return self.current();
        }
        self.ret_slow(target, functions)
    }

    /// A `ret` to `target`, which is not the top frame's return address: a frame deeper in the
    /// stack returns there → pop to it (a deeper return); none does → an orphan return.
    pub fn ret_slow(&mut self, target: u64, functions: &dyn Functions) -> ContextId {
        if self.pop_to(target) {
            self.count(Resync::DeeperReturn);
            return self.current();
        }
        self.count(Resync::OrphanReturn);
        self.replace(functions.containing(target))
    }

    /// Rule 3: a jump to the entry of function `entry` from the current context. A jump to
    /// the current function's own entry (a loop through it) changes nothing, nor does one from
    /// the [`DEEPER`] context (frames past [`MAX_DEPTH`] are not told apart); any other is a
    /// tail call.
    pub fn tail_call(&mut self, entry: u64) -> ContextId {
        let f = self.arena.at(self.area().ctx).function;
        if f == entry || f == DEEPER {
            return self.current();
        }
        self.count(Resync::TailCall);
        let c = self.replace(entry);
        // Translated code finds the next tail call from a sibling in the parent's cache, as a
        // call from the parent would.
        let cur = self.arena.at(self.area().ctx);
        let parent = self.arena.addr(ContextId(cur.parent_id));
        let probes = Node::direct_probes(entry);
        let child = self.arena.addr(c);
        let cache = self.arena.cache_mut(parent);
        if !probes.iter().any(|&i| cache[i].key == !entry) {
            let slot = probes
                .iter()
                .copied()
                .find(|&i| cache[i].key == 0)
                .unwrap_or(probes[0]);
            cache[slot] = CacheEntry { key: !entry, child };
        }
        c
    }

    /// Rule 4: an indirect jump to `target`. Returns true if it went to a live frame's return
    /// address (popped to it: a jump return), false if the context is unchanged.
    pub fn jump(&mut self, target: u64) -> bool {
        if self.pop_to(target) {
            self.count(Resync::JumpReturn);
            return true;
        }
        false
    }

    /// Rule 5: the guest's handler entered at `handler` is called by the signal's delivery,
    /// returning to `return_to` (its restorer), from the current context.
    pub fn signal_enter(&mut self, handler: u64, return_to: u64) -> ContextId {
        if self.signals.len() == SIGNALS_PENDING_MAX {
            self.signals.remove(0);
        }
        let interrupted = (self.area().depth(), self.current());
        self.signals.push(interrupted);
        self.call(handler, return_to)
    }

    /// Rule 5: `rt_sigreturn` resumes the context the last handler interrupted, with the frames
    /// it had (a handler that returned has popped its frame already). Without a handler
    /// pending, nothing changes.
    pub fn signal_return(&mut self) -> ContextId {
        if let Some((depth, ctx)) = self.signals.pop() {
            let addr = self.arena.addr(ctx);
            let area = self.area_mut();
            if depth <= area.depth() {
                area.truncate(depth);
            }
            area.ctx = addr;
        }
        self.current()
    }

    /// Resynchronisations by cause, indexed as [`Resync::ALL`]: [`Contexts::resyncs`] and the
    /// tail calls translated code made itself.
    pub fn resync_counts(&self) -> [u64; Resync::ALL.len()] {
        let mut r = self.resyncs;
        r[Resync::TailCall as usize] += self.area().tail_calls;
        r
    }

    /// Forgets every frame's host address (the code cache they point into was flushed): the
    /// returns go through the lookup table.
    pub fn forget_hosts(&mut self) {
        self.area_mut().forget_hosts();
    }

    /// Puts the area back in a valid state after a `ret` that matched the sentinel frame (a
    /// `ret` to a non-canonical address, which faults): no frames, the current context kept.
    /// Returns true if it had to.
    pub fn repair(&mut self) -> bool {
        if (self.area().frame_top as usize) < ContextArea::FRAMES_EMPTY {
            let (ctx, tail_calls) = (self.area().ctx, self.area().tail_calls);
            self.area_mut().init(ctx);
            self.area_mut().tail_calls = tail_calls;
            return true;
        }
        false
    }

    /// The frame at byte offset `offset` of the area (`frames[0]`, the sentinel, or above).
    fn frame_at(&self, offset: usize) -> Frame {
        self.area().frames[(offset - ContextArea::FRAMES) / size_of::<Frame>()]
    }

    fn push_frame(&mut self, return_to: u64) {
        let area = self.area_mut();
        let top = area.frame_top as usize;
        area.frames[(top - ContextArea::FRAMES) / size_of::<Frame>()] =
            Frame::new(return_to, area.ctx);
        area.frame_top = (top + size_of::<Frame>()) as u64;
    }

    /// Pops to the topmost frame returning to `target`, restoring its caller's context;
    /// false if no live frame returns there.
    fn pop_to(&mut self, target: u64) -> bool {
        let area = self.area_mut();
        match area
            .live_frames()
            .iter()
            .rposition(|f| f.return_to == target)
        {
            Some(i) => {
                area.ctx = area.live_frames()[i].caller;
                area.truncate(i);
                true
            }
            None => false,
        }
    }

    /// Replaces the current context by its sibling for `function` (the root's child when the
    /// root is current).
    fn replace(&mut self, function: u64) -> ContextId {
        let cur = self.arena.at(self.area().ctx);
        let parent = ContextId(cur.parent_id);
        let c = self.child(parent, function);
        let addr = self.arena.addr(c);
        self.area_mut().ctx = addr;
        c
    }

    /// The child of `parent` for `function`, found or made: past [`MAX_DEPTH`] the one
    /// [`DEEPER`] child (its own child); with the arena full, `parent` itself.
    fn child(&mut self, parent: ContextId, function: u64) -> ContextId {
        let p = self.arena.at(self.arena.addr(parent));
        let function = if p.depth >= MAX_DEPTH {
            if p.function == DEEPER {
                return parent;
            }
            DEEPER
        } else {
            function
        };
        if let Some(&c) = self.children.get(&(parent.0, function)) {
            return c;
        }
        if self.arena.is_full() {
            self.contexts_folded += 1;
            return parent;
        }
        let c = self.arena.push(function, Some(parent));
        self.children.insert((parent.0, function), c);
        c
    }

    fn count(&mut self, why: Resync) {
        self.resyncs[why as usize] += 1;
    }
}

/// The cache entries a call probes, in order.
fn probes(indirect: bool, callee: u64) -> Probes {
    if indirect {
        Probes(Node::indirect_probes(), INDIRECT_ENTRIES)
    } else {
        let mut p = [0; INDIRECT_ENTRIES];
        p[..DIRECT_PROBES].copy_from_slice(&Node::direct_probes(callee));
        Probes(p, DIRECT_PROBES)
    }
}

/// The first `.1` of `.0`.
struct Probes([usize; INDIRECT_ENTRIES], usize);
const _: () = assert!(DIRECT_PROBES <= INDIRECT_ENTRIES);

impl std::ops::Deref for Probes {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.0[..self.1]
    }
}

impl Drop for Contexts {
    fn drop(&mut self) {
        if let Some(layout) = self.owned {
            // SAFETY: allocated with this layout in `new_owned`, and no longer used.
            unsafe { std::alloc::dealloc(self.area.as_ptr().cast(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoSymbols;
    impl Functions for NoSymbols {
        fn containing(&self, addr: u64) -> u64 {
            addr
        }
    }

    #[test]
    fn calls_and_returns_walk_the_tree() {
        let mut c = Contexts::new_owned().unwrap();
        let main = c.call(0x1000, 0x10);
        let f = c.call(0x2000, 0x1005);
        assert_eq!(c.frames(), vec![(0x10, ContextId::ROOT), (0x1005, main)]);
        assert_eq!(c.ret(0x1005, &NoSymbols), main);
        // The second call of the same function from the same context hits the cache.
        assert_eq!(c.call(0x2000, 0x1009), f);
        assert_eq!(c.len(), 3);
        assert_eq!(c.ret(0x1009, &NoSymbols), main);
        assert_eq!(c.ret(0x10, &NoSymbols), ContextId::ROOT);
        assert_eq!(c.resyncs, [0; 4]);
    }

    #[test]
    fn a_return_to_a_deeper_frame_pops_to_it() {
        let mut c = Contexts::new_owned().unwrap();
        let main = c.call(0x1000, 0x10);
        c.call(0x2000, 0x1005);
        c.call(0x3000, 0x2005);
        assert_eq!(c.ret(0x1005, &NoSymbols), main);
        assert_eq!(c.frames().len(), 1);
        assert_eq!(c.resyncs[Resync::DeeperReturn as usize], 1);
    }

    #[test]
    fn an_orphan_return_replaces_the_context_by_a_sibling() {
        let mut c = Contexts::new_owned().unwrap();
        let main = c.call(0x1000, 0x10);
        c.call(0x2000, 0x1005);
        let g = c.ret(0x7777, &NoSymbols);
        let info = c.view().node(g).unwrap();
        assert_eq!((info.parent, info.function), (main, 0x7777));
        assert_eq!(c.frames().len(), 2);
        assert_eq!(c.resyncs[Resync::OrphanReturn as usize], 1);
    }

    #[test]
    fn a_return_past_every_frame_hits_the_sentinel_and_is_repaired() {
        let mut c = Contexts::new_owned().unwrap();
        c.call(0x1000, 0x10);
        c.ret(0x10, &NoSymbols);
        c.ret(crate::SENTINEL_RETURN, &NoSymbols);
        c.repair();
        assert!(c.frames().is_empty());
        c.call(0x1000, 0x10);
        assert_eq!(c.frames().len(), 1);
    }

    #[test]
    fn deep_recursion_folds_into_one_deeper_context() {
        let mut c = Contexts::new_owned().unwrap();
        let mut last = ContextId::ROOT;
        for i in 0..MAX_DEPTH as u64 + 10 {
            last = c.call(0x1000, 0x1005 + i);
        }
        assert_eq!(c.view().node(last).unwrap().function, DEEPER);
        assert_eq!(c.len(), MAX_DEPTH as usize + 2);
        for i in (0..MAX_DEPTH as u64 + 10).rev() {
            c.ret(0x1005 + i, &NoSymbols);
        }
        assert_eq!(c.current(), ContextId::ROOT);
        assert_eq!(c.resyncs, [0; 4]);
    }

    #[test]
    fn a_full_stack_drops_its_bottom_half() {
        let mut c = Contexts::new_owned().unwrap();
        for i in 0..FRAMES_MAX as u64 + 1 {
            c.call(0x1000, 0x1_0000 + i);
        }
        assert_eq!(c.dropped_frames, FRAMES_MAX as u64 / 2);
        assert_eq!(c.frames().len(), FRAMES_MAX / 2 + 1);
        assert_eq!(c.frames()[0].0, 0x1_0000 + FRAMES_MAX as u64 / 2);
    }

    #[test]
    fn a_signal_handler_runs_under_the_interrupted_context() {
        let mut c = Contexts::new_owned().unwrap();
        let main = c.call(0x1000, 0x10);
        let h = c.signal_enter(0x5000, 0x9000);
        assert_eq!(c.view().node(h).unwrap().parent, main);
        c.call(0x6000, 0x5005);
        // The handler longjmps out of its callee, then rt_sigreturn.
        assert_eq!(c.signal_return(), main);
        assert_eq!(c.frames().len(), 1);
    }
}
