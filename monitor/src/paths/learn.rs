//! What the recorder learns from the event stream: each id's metadata, the runs the events
//! stand for, the functions blocks enter and their CFG nodes.

use hotpath_events::is_id;
use hotpath_ir::Terminator;

use super::frames::{K_CALL, K_INDIRECT, K_OTHER, K_RET};
use super::function::Function;
use super::ids::NONE;
use super::recorder::PathRecorder;
use super::runs::NextRun;
use crate::Tables;

impl PathRecorder {
    /// The symbol containing `addr`, if any.
    pub(crate) fn symbol_at(&self, addr: u64) -> Option<usize> {
        let syms = &self.config.symbols;
        let i = syms.partition_point(|s| s.addr <= addr).checked_sub(1)?;
        let s = &syms[i];
        (s.size == 0 || addr < s.addr + s.size).then_some(i)
    }

    /// Takes in the recorder's view of the ids `tables` knows and it does not yet (the
    /// tables learn every id of a piece of events before the recorder sees it).
    #[cold]
    pub(crate) fn learn_known(&mut self, tables: &Tables) {
        let new = tables.known().saturating_sub(self.id_addr.len());
        self.id_addr.reserve(new);
        self.id_kind.reserve(new);
        self.id_ret.reserve(new);
        self.id_node.reserve(new);
        self.id_root.reserve(new);
        self.id_entry.reserve(new);
        self.ids_at.reserve(new);
        self.runs.reserve(new);
        for i in self.id_addr.len()..tables.known() {
            if !self
                .runs
                .learn(i as u32, tables.kind(i as u32).expect("a known id"))
            {
                // A superblock or a side exit: its blocks carry the metadata.
                self.id_addr.push(0);
                self.id_kind.push(K_OTHER);
                self.id_ret.push(0);
                self.id_node.push((NONE, NONE));
                self.id_root.push(NONE);
                self.id_entry.push(NONE);
                continue;
            }
            let b = tables.summary(i as u32).expect("a known id");
            let (kind, ret) = match b.terminator {
                // `call 1f; 1:` (get-pc) pushes an address and goes on: no activation.
                Terminator::Call { target, return_to } if target == return_to => (K_OTHER, 0),
                Terminator::Call { return_to, .. } | Terminator::IndirectCall { return_to } => {
                    (K_CALL, return_to.0)
                }
                Terminator::Return => (K_RET, 0),
                Terminator::IndirectJump => (K_INDIRECT, 0),
                _ => (K_OTHER, 0),
            };
            let addr = b.start.0;
            self.id_addr.push(addr);
            self.id_kind.push(kind);
            self.id_ret.push(ret);
            self.id_node.push((NONE, NONE));
            self.id_root.push(NONE);
            let entry = match self.func_by_entry.get(&addr) {
                Some(&f) if self.funcs[f as usize].called => f,
                _ => NONE,
            };
            self.id_entry.push(entry);
            if let Some(&first) = self.ids_at.get(&addr) {
                debug_assert_ne!(first, i as u32);
                self.more_ids_at.entry(addr).or_default().push(i as u32);
            } else {
                self.ids_at.insert(addr, i as u32);
            }
        }
    }

    /// The function whose entry is `addr`, created if new.
    pub(crate) fn function_at(&mut self, addr: u64) -> u32 {
        if let Some(&f) = self.func_by_entry.get(&addr) {
            return f;
        }
        let f = self.funcs.len() as u32;
        let symbol = self
            .symbol_at(addr)
            .filter(|&i| self.config.symbols[i].addr == addr);
        self.funcs.push(Function::new(addr, symbol));
        self.fepoch.push(0);
        self.func_by_entry.insert(addr, f);
        f
    }

    /// The function a call enters at `addr`, created if new. Its entry becomes one that jumps
    /// reach as tail calls (the rule the guest's own contexts kept: an entry is an address a
    /// call has reached).
    pub(crate) fn called_function_at(&mut self, addr: u64) -> u32 {
        let f = self.function_at(addr);
        if !self.funcs[f as usize].called {
            self.funcs[f as usize].called = true;
            if let Some(&first) = self.ids_at.get(&addr) {
                let more = self.more_ids_at.get(&addr).cloned().unwrap_or_default();
                for i in std::iter::once(first).chain(more) {
                    self.id_entry[i as usize] = f;
                }
            }
            // Pair programs of every function the address was seen in took it for a step of
            // their paths, and those that jump into this one took the jump for a foreign one
            // (a jump to it is now a tail call).
            self.bump_epoch(f);
            if let Some(&g) = self.funcs_at.get(&addr) {
                let more = self.more_funcs_at.get(&addr).cloned().unwrap_or_default();
                for g in std::iter::once(g).chain(more) {
                    self.bump_epoch(g);
                }
            }
        }
        f
    }

    /// The function a block reached without a call belongs to: the one whose symbol contains
    /// it (entered at the symbol's start), else a new function entered at the block.
    pub(crate) fn function_containing(&mut self, addr: u64) -> u32 {
        let entry = self
            .symbol_at(addr)
            .map(|i| self.config.symbols[i].addr)
            .unwrap_or(addr);
        self.function_at(entry)
    }

    /// Node of block `id` in function `func`, if it has one yet (`id_node` caches the node of
    /// the function the block was last stepped in; a block may be in several).
    #[inline]
    pub(crate) fn node_in(&self, func: u32, id: u32) -> Option<u32> {
        match self.id_node[id as usize] {
            (f, n) if f == func => Some(n),
            _ => self.funcs[func as usize]
                .nodes
                .get(&self.id_addr[id as usize])
                .copied(),
        }
    }

    /// Node of block `id` in function `func`, created (with its static successors) if new.
    #[inline]
    pub(crate) fn node_of(&mut self, func: u32, id: u32, tables: &Tables) -> u32 {
        let (f, n) = self.id_node[id as usize];
        if f == func {
            return n;
        }
        self.node_of_slow(func, id, tables)
    }

    #[cold]
    pub(crate) fn node_of_slow(&mut self, func: u32, id: u32, tables: &Tables) -> u32 {
        // A block seen in another function before: `id_node` caches one function's node, and
        // nothing the per-block step does depends on which (an indirect jump asks the
        // function's own nodes, see `step_indirect`), so no pair program is stale for it
        // (they were compiled for nodes that stay). Node numbers are never reused.
        let addr = self.id_addr[id as usize];
        let fun = &mut self.funcs[func as usize];
        if fun.node_addr.is_empty() && addr != fun.entry {
            // The entry block is node 0 even when an activation starts elsewhere.
            fun.node_addr.push(fun.entry);
            fun.node_instr.push(0);
            fun.nodes.insert(fun.entry, 0);
            fun.node_span = (
                fun.node_span.0.min(fun.entry),
                fun.node_span.1.max(fun.entry),
            );
            fun.static_succs.push(Vec::new());
        }
        let n = match fun.nodes.get(&addr) {
            Some(&n) => n,
            None => {
                let n = fun.node_addr.len() as u32;
                fun.node_addr.push(addr);
                fun.node_instr.push(0);
                fun.nodes.insert(addr, n);
                fun.node_span = (fun.node_span.0.min(addr), fun.node_span.1.max(addr));
                fun.static_succs.push(Vec::new());
                if self.sums && addr != fun.entry {
                    if let Some(&first) = self.funcs_at.get(&addr) {
                        debug_assert_ne!(first, func);
                        self.more_funcs_at.entry(addr).or_default().push(func);
                    } else {
                        self.funcs_at.insert(addr, func);
                    }
                }
                n
            }
        };
        let entry = fun.entry;
        if fun.static_succs[n as usize].is_empty() {
            let called = |a: &u64| {
                self.func_by_entry
                    .get(a)
                    .is_some_and(|&g| self.funcs[g as usize].called)
            };
            let succs: Vec<u64> = match tables.summary(id).expect("a known id").terminator {
                Terminator::Call { return_to, .. } | Terminator::IndirectCall { return_to } => {
                    vec![return_to.0]
                }
                t => t
                    .static_successors()
                    .into_iter()
                    .map(|a| a.0)
                    .filter(|a| !called(a) || *a == entry)
                    .collect(),
            };
            self.funcs[func as usize].static_succs[n as usize] = succs;
        }
        self.funcs[func as usize].node_instr[n as usize] =
            tables.summary(id).expect("a known id").instructions;
        self.id_node[id as usize] = (func, n);
        self.id_root[id as usize] = NONE;
        n
    }
}

impl PathRecorder {
    /// The run the superblock left by the previous piece of events stands for (its extent
    /// is this piece's first event), and the events of this piece it took (0 or 1); `None`
    /// if the piece is empty (the superblock still waits).
    pub(crate) fn pending_run(&mut self, events: &[u32], tables: &Tables) -> Option<(u32, usize)> {
        let &next = events.first()?;
        self.learn_event(next, tables);
        let sb = std::mem::replace(&mut self.runs.pending, NONE);
        let exited = self.exits(sb, next);
        Some((if exited { next } else { sb }, exited as usize))
    }

    /// The run that event `events[*i]` begins (a basic block, a superblock run to its end, or
    /// one left at a side exit, which the next event then is), with `*i` moved past it;
    /// [`NextRun::Pending`] if it is a superblock whose extent the next piece of events tells
    /// (kept in `Runs::pending`).
    #[inline(always)]
    pub(crate) fn next_run(&mut self, events: &[u32], i: &mut usize, tables: &Tables) -> NextRun {
        let e = events[*i];
        *i += 1;
        if !is_id(e) || !self.learn_event(e, tables) {
            return NextRun::Skip;
        }
        if !self.runs.events[e as usize].is_superblock {
            return NextRun::Run(e);
        }
        let Some(&next) = events.get(*i) else {
            self.runs.pending = e;
            return NextRun::Pending;
        };
        self.learn_event(next, tables);
        // Branch-free: whether a superblock left early is the guest's own branch, often
        // unpredictable.
        let exited = self.exits(e, next);
        *i += exited as usize;
        NextRun::Run(if exited { next } else { e })
    }

    /// The runs of a repeated event the last [`record`](PathRecorder::record) counted at
    /// once, for [`Tables::record_with_repeats`] of the same events.
    pub(crate) fn repeats(&self) -> &[(u32, u32)] {
        &self.runs.repeats
    }

    /// Makes sure event id `e` is known (a syscall event is not an id). Returns false if
    /// `tables` do not know it (a bug: ids are catalogued before they run).
    #[inline(always)]
    pub(crate) fn learn_event(&mut self, e: u32, tables: &Tables) -> bool {
        if is_id(e) && e as usize >= self.runs.events.len() {
            self.learn_known(tables);
        }
        (e as usize) < self.runs.events.len()
    }

    /// Whether `next`, the event after superblock `sb`, is one of `sb`'s side exits (which
    /// then stands for the blocks `sb` ran); else `sb` ran to its end.
    #[inline(always)]
    pub(crate) fn exits(&self, sb: u32, next: u32) -> bool {
        self.runs
            .events
            .get(next as usize)
            .is_some_and(|n| n.superblock == sb)
    }
}
