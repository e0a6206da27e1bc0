//! The shadow call stack and the call tree: activations pushed by calls and popped by returns,
//! the resynchronisation rules for everything else, and the call-tree nodes behind flame graphs.
//!
//! The stack follows the blocks alone, exactly the events the tables see (translated code is
//! the same with and without paths): a block whose terminator is a `call` pushes an activation
//! of the function its next block enters; a `ret` to the top frame's return address pops it.
//! Everything else is a resynchronisation ([`Resync`]): a jump to the entry of another
//! function that a call has reached is a tail call (an ELF symbol no call reaches is not an
//! entry: glibc's routines jump between each other's symbols); a `ret` to a deeper frame's
//! return address pops to it; a `ret` to no frame's goes on in the function containing its
//! target; an indirect jump to a frame's return address returns there, one into a function
//! deeper in the stack unwinds to it (longjmp), one into a function not on the stack replaces
//! the top activation.

use super::frames::{
    cached_call_child, Activation, CallNode, Resync, ANY_FUNC, CALL_CACHE_SLOTS,
    CALL_TREE_MAX_DEPTH, DEEPER, SHADOW_STACK_MAX,
};
use super::ids::{cache_slot, NONE};
use super::recorder::PathRecorder;
use super::trie::{END_EXIT, START_ENTRY, START_HEAD};
use crate::Tables;
use hotpath_pathprof::{KSlabForest, PathId};

impl PathRecorder {
    /// [`PathRecorder::call_child`] where it is cached (see [`cached_call_child`]).
    #[inline]
    pub(crate) fn cached_call_child(&self, parent: u32, func: u32) -> u32 {
        cached_call_child(&self.calltree, &self.call_cache, parent, func)
    }

    /// The call-tree child of `parent` for `func`; past [`CALL_TREE_MAX_DEPTH`] frames, the
    /// one [`DEEPER`] node under the last kept frame (its own child).
    pub(crate) fn call_child(&mut self, parent: u32, func: u32) -> u32 {
        let c = self.call_child_uncached(parent, func);
        self.call_cache[cache_slot(parent, func, CALL_CACHE_SLOTS)] = (parent, func, c);
        c
    }

    pub(crate) fn call_child_uncached(&mut self, parent: u32, func: u32) -> u32 {
        let p = &self.calltree[parent as usize];
        let func = if p.depth >= CALL_TREE_MAX_DEPTH {
            if p.func == DEEPER {
                return parent;
            }
            DEEPER
        } else {
            func
        };
        if p.last_func == func || p.last_func == ANY_FUNC {
            return p.last_child;
        }
        let depth = p.depth + 1;
        let c = match self.call_child.get(&(parent, func)) {
            Some(&c) => c,
            None => {
                let c = self.calltree.len() as u32;
                self.calltree.push(CallNode {
                    parent,
                    func,
                    blocks: 0,
                    instructions: 0,
                    depth,
                    last_func: NONE,
                    last_child: NONE,
                });
                self.call_child.insert((parent, func), c);
                c
            }
        };
        let p = &mut self.calltree[parent as usize];
        p.last_func = func;
        p.last_child = c;
        c
    }

    /// Starts an activation of `func` at block `id`. The common case — the block's node and
    /// trie root known, the call-tree child cached under `parent_call`, room on the stack, no
    /// k-slab forest — is a few loads and the frame's store; anything else is prepared by
    /// [`PathRecorder::prepare_activation`] first.
    #[inline]
    pub(crate) fn push_activation(
        &mut self,
        func: u32,
        return_to: u64,
        parent_call: u32,
        id: u32,
        tables: &Tables,
    ) {
        if self.sums {
            self.push_activation_sums(func, return_to, parent_call, id, tables);
            return;
        }
        let mut root = self.id_root[id as usize];
        let mut call_node = self.cached_call_child(parent_call, func);
        if root == NONE
            || call_node == NONE
            || self.id_node[id as usize].0 != func
            || self.stack.len() >= self.stack_cap()
            || self.config.k > 0
        {
            (root, call_node) = self.prepare_activation(func, parent_call, id, tables);
        }
        let pap = self.start_activation(func);
        self.stack.push(Activation {
            cur: root,
            ..Activation::new(func, return_to, call_node, pap, self.id_addr[id as usize])
        });
    }

    /// The root of the PAP run an activation of `func` starting records if the function is
    /// hot, else [`NONE`].
    #[inline]
    pub(crate) fn start_activation(&mut self, func: u32) -> u32 {
        let fun = &mut self.funcs[func as usize];
        if fun.path_ends >= self.config.pap_threshold {
            self.pap_runs.root(fun)
        } else {
            NONE
        }
    }

    /// Starts the k-slab forest's routine of `func` (`--k`): an activation of it begins.
    pub(crate) fn kslab_enter(&mut self, func: u32) {
        let k = self.config.k;
        self.funcs[func as usize]
            .kslab
            .get_or_insert_with(|| KSlabForest::new(k).expect("k >= 1"))
            .routine_entry();
    }

    /// What [`PathRecorder::push_activation`] does outside its common case: makes room on a
    /// full stack, creates the block's node and trie root and the call-tree child if new, and
    /// starts the k-slab forest's routine. Returns the trie root and the call-tree node.
    #[cold]
    #[inline(never)]
    pub(crate) fn prepare_activation(
        &mut self,
        func: u32,
        parent_call: u32,
        id: u32,
        tables: &Tables,
    ) -> (u32, u32) {
        if self.stack.len() >= self.stack_cap() {
            self.drop_bottom(SHADOW_STACK_MAX / 2);
        }
        let node = self.node_of(func, id, tables);
        let root = match self.id_root[id as usize] {
            NONE => {
                let r = self.root(func, if node == 0 { START_ENTRY } else { START_HEAD }, node);
                self.id_root[id as usize] = r;
                r
            }
            r => r,
        };
        let call_node = self.call_child(parent_call, func);
        if self.config.k > 0 {
            self.kslab_enter(func);
        }
        (root, call_node)
    }

    /// Counts one run of activation `a`'s current path ended by `end` (a back edge's head
    /// node, or [`END_EXIT`]): adds the blocks to `a`'s call-tree node and the path to `a`'s
    /// function. Returns its path number.
    #[inline]
    pub(crate) fn count_path(&mut self, a: &Activation, end: u32) -> u32 {
        if self.by_sums(a.func) {
            return self.count_sum(a, end);
        }
        let p = self.path_of(a.cur, end);
        self.paths[p as usize].count += 1;
        if self.config.k > 0 {
            self.kslab_push(a.func, p);
        }
        p
    }

    /// Feeds path `p` to function `func`'s k-slab forest (`--k`).
    #[cold]
    pub(crate) fn kslab_push(&mut self, func: u32, p: u32) {
        if let Some(k) = self.funcs[func as usize].kslab.as_mut() {
            k.push(PathId(p as u64));
        }
    }

    /// Adds the blocks and path ends an activation has accumulated to its call-tree node and
    /// function (when it ends, or when its frame is dropped), with its current path's when
    /// `with_current` (counted with `count_path` but not `end_path`).
    pub(crate) fn flush_counts(&mut self, a: &Activation, with_current: bool) {
        let (len, instr, ends) = if with_current {
            (a.len as u64, self.current_instructions(a), 1)
        } else {
            (0, 0, 0)
        };
        let node = &mut self.calltree[a.call_node as usize];
        node.blocks += a.blocks + len;
        node.instructions += a.instructions + instr;
        self.funcs[a.func as usize].path_ends += a.path_ends + ends;
    }

    /// Ends the top activation's current path with `end` (a back edge's head node, or
    /// [`END_EXIT`]), counting it. Returns its path number.
    #[inline]
    pub(crate) fn end_path(&mut self, end: u32) -> u32 {
        let a = *self.stack.last().expect("an activation");
        let p = self.count_path(&a, end);
        let instr = self.current_instructions(&a);
        let top = self.stack.last_mut().expect("an activation");
        top.blocks += a.len as u64;
        top.instructions += instr;
        top.path_ends += 1;
        if top.pap != NONE {
            self.pap_runs.push(top, p);
        }
        p
    }

    /// Ends the top activation (its path ends at the exit) and pops it: `end_path(END_EXIT)`,
    /// then its counts go to its call-tree node and function and its PAP run is counted.
    #[inline]
    pub(crate) fn pop_activation(&mut self) {
        if self.sums && self.pop_sums() {
            return;
        }
        let mut a = self.stack.pop().expect("an activation");
        let p = self.count_path(&a, END_EXIT);
        let instr = self.current_instructions(&a);
        let node = &mut self.calltree[a.call_node as usize];
        node.blocks += a.blocks + a.len as u64;
        node.instructions += a.instructions + instr;
        self.funcs[a.func as usize].path_ends += a.path_ends + 1;
        if a.pap != NONE {
            self.pap_runs.push(&mut a, p);
            self.pap_runs.end(&a);
        }
    }

    /// Drops the `n` bottom frames of the shadow stack (it is full): each one's path ends
    /// there, counted as at an exit, and its PAP run is counted as it stands. A later return
    /// to one of them finds no frame and resynchronises.
    #[cold]
    pub(crate) fn drop_bottom(&mut self, n: usize) {
        let n = n.min(self.stack.len().saturating_sub(1));
        for i in 0..n {
            let mut a = self.stack[i];
            let p = self.count_path(&a, END_EXIT);
            self.flush_counts(&a, true);
            if a.pap != NONE {
                self.pap_runs.push(&mut a, p);
                self.pap_runs.end(&a);
            }
        }
        self.stack.drain(..n);
        self.dropped_frames += n as u64;
    }

    /// Replaces the top activation (if any) by one of `func` starting at `id`, keeping its
    /// return address (a tail call, or a resynchronisation).
    pub(crate) fn replace_activation(&mut self, func: u32, id: u32, tables: &Tables) {
        let (return_to, parent) = match self.stack.last() {
            // Without a call tree every activation is the root's (which has no parent).
            Some(a) => match self.calltree[a.call_node as usize].parent {
                NONE => (a.return_to, 0),
                parent => (a.return_to, parent),
            },
            None => (0, 0),
        };
        if !self.stack.is_empty() {
            self.pop_activation();
        }
        self.push_activation(func, return_to, parent, id, tables);
    }

    /// If a function below the top activation owns guest address `addr` (block `id`'s), the
    /// frames above the deepest-nested such one are gone (a longjmp, an exception raised by
    /// `ret`): pops them, counting one unwind, and steps `id` in it. False (nothing done)
    /// otherwise.
    fn unwind_to(&mut self, addr: u64, id: u32, tables: &Tables) -> bool {
        let top = self.stack.len().saturating_sub(1);
        let Some(i) = (0..top)
            .rev()
            .find(|&i| self.owns(self.stack[i].func, addr))
        else {
            return false;
        };
        self.resync(Resync::Unwind);
        while self.stack.len() > i + 1 {
            self.pop_activation();
        }
        self.step_intra(id, tables);
        true
    }

    /// A `ret` to block `id`: pop the frame that returns there.
    #[cold]
    pub(crate) fn step_return(&mut self, id: u32, tables: &Tables) {
        let target = self.id_addr[id as usize];
        let depth = self.stack.iter().rposition(|a| a.return_to == target);
        match depth {
            Some(i) if i >= 1 => {
                if i + 1 != self.stack.len() {
                    self.resync(Resync::DeeperReturn);
                }
                while self.stack.len() > i {
                    self.pop_activation();
                }
                self.step_intra(id, tables);
            }
            _ => {
                // A return into a function deeper in the stack, to no frame's return address:
                // an exception raised by `ret` to its handler (OCaml's `raise` loads the
                // handler's stack pointer and returns into it). The frames above it are gone,
                // as for a longjmp ([`Self::step_indirect`]); left on the stack, each later
                // resynchronisation looked through them (an OCaml program that had raised
                // 4,000 exceptions ran 36 times slower with paths).
                if self.unwind_to(target, id, tables) {
                    return;
                }
                // A return to no frame on the stack (the guest switched stacks, or returned
                // from the outermost activation): go on in the function containing it.
                self.resync(Resync::OrphanReturn);
                let f = self.function_containing(target);
                self.replace_activation(f, id, tables);
            }
        }
    }

    /// An indirect jump to a block not yet seen in the current function: a jump table in the
    /// same function, or a longjmp into a frame deeper in the stack, or a jump elsewhere.
    #[cold]
    pub(crate) fn step_indirect(&mut self, id: u32, tables: &Tables) {
        let addr = self.id_addr[id as usize];
        // `pop reg; jmp *reg` and friends: a jump to a frame's return address returns there.
        if let Some(i) = self
            .stack
            .iter()
            .rposition(|a| a.return_to == addr)
            .filter(|&i| i >= 1)
        {
            self.resync(Resync::JumpReturn);
            while self.stack.len() > i {
                self.pop_activation();
            }
            self.step_intra(id, tables);
            return;
        }
        let owner = |p: &PathRecorder, f: u32| p.owns(f, addr);
        let top = self.stack.last().expect("an activation").func;
        if owner(self, top) || self.symbol_at(addr).is_none() {
            self.step_intra(id, tables);
            return;
        }
        if self.unwind_to(addr, id, tables) {
            return;
        }
        self.resync(Resync::ForeignJump);
        let f = self.function_containing(addr);
        self.replace_activation(f, id, tables);
    }

    /// Whether guest address `addr` belongs to function `func`: one of its blocks, or inside
    /// its ELF symbol.
    pub(crate) fn owns(&self, func: u32, addr: u64) -> bool {
        let fun = &self.funcs[func as usize];
        let (lo, hi) = fun.node_span;
        (lo <= addr && addr <= hi && fun.nodes.contains_key(&addr))
            || match fun.symbol {
                Some(s) => self.symbol_at(addr) == Some(s),
                None => false,
            }
    }

    /// [`PathRecorder::owns`] with the symbol containing `addr` known (`sym`).
    #[inline]
    pub(crate) fn owns_in(&self, func: u32, addr: u64, sym: Option<usize>) -> bool {
        let fun = &self.funcs[func as usize];
        let (lo, hi) = fun.node_span;
        (fun.symbol.is_some() && fun.symbol == sym)
            || (lo <= addr && addr <= hi && fun.nodes.contains_key(&addr))
    }

    /// Activations the stack holds before a push drops its bottom half: [`SHADOW_STACK_MAX`].
    #[inline]
    pub(crate) fn stack_cap(&self) -> usize {
        SHADOW_STACK_MAX
    }

    /// Starts the activation of `func` at block `id` on an empty stack (the guest thread's
    /// root context's).
    #[cold]
    pub(crate) fn push_bottom(&mut self, func: u32, id: u32, tables: &Tables) {
        self.push_activation(func, 0, 0, id, tables);
    }

    /// Counts one resynchronisation of the shadow stack.
    #[inline]
    pub(crate) fn resync(&mut self, why: Resync) {
        self.resyncs += 1;
        self.resync_kinds[why as usize] += 1;
    }
}
