//! The sums recorder's steps ([`Recorder::Sums`]): each activation keeps its current path as
//! a Ball-Larus sum under its function's numbering (`numbering.rs`), so a path end is one
//! count keyed by an id, not a walk through a prefix trie.
//!
//! This is the recorder docs/paths-design.md describes ("The recorder at the tables' cost"):
//! the per-block step of the reference (`recorder.rs`, `stack.rs`: the same shadow stack,
//! resynchronisations and call tree) with the trie node of each activation replaced by
//! `(r, last node)`, and (`pairs.rs`) a program per pair of runs that applies a run's blocks
//! at once.
//!
//! **Growth.** An edge, path start or back-edge end not seen before is added to the
//! numbering, which is then redone (`Numbering::renumber`). Before that, the function's
//! counts are spelled under the old numbers and added to the interned paths (the ones the
//! report numbers again from the final CFG, as for every recorder), and every live activation
//! of the function has its sum decoded under the old numbers and encoded under the new ones.
//! A function whose paths no longer fit in a `u64` is *spelled* from then on: its live
//! activations get the trie node of their prefix and it is stepped as the reference steps it.
//!
//! **Path numbers** (the interned paths) are needed during the run only for PAP runs and
//! k-paths: there a path end looks its id's number up beside the counters (a dense array, or
//! a map), decoding and interning the path the first time.

use super::frames::{Activation, SHADOW_STACK_MAX};
use super::ids::NONE;
use super::numbering::{Numbering, Spelled, EXIT_EDGE};
use super::recorder::PathRecorder;
use super::trie::{END_EXIT, START_ENTRY, START_HEAD};
use crate::Tables;

/// Function epochs stay below it (the pairs' mark of a chain to compile again).
const STALE_EPOCH: u32 = u32::MAX;

/// Paths a function may have for its counters to be a dense array (8 bytes each) rather than
/// a map.
const DENSE_MAX: u64 = 4096;

impl PathRecorder {
    /// Whether activations of `func` keep sums (else trie nodes).
    #[inline]
    pub(crate) fn by_sums(&self, func: u32) -> bool {
        self.sums && !self.funcs[func as usize].spelled
    }

    /// Pair programs of `func` may no longer hold, and any pair the per-block step took may
    /// compile now (see `pairs`).
    pub(crate) fn bump_epoch(&mut self, func: u32) {
        if let Some(e) = self.fepoch.get_mut(func as usize) {
            *e = e.wrapping_add(1) % STALE_EPOCH;
        }
        self.pairs.epoch = self.pairs.epoch.wrapping_add(1);
    }

    /// Guest instructions of activation `a`'s current path so far.
    #[inline]
    pub(crate) fn current_instructions(&self, a: &Activation) -> u64 {
        if self.by_sums(a.func) {
            a.path_instr
        } else {
            self.path_instructions(a.cur)
        }
    }

    /// [`PathRecorder::count_path`] for an activation with a sum: counts its id (the sum plus
    /// the value of its end, which the numbering has). Returns the path number where a PAP
    /// run or a k-slab forest needs it, else [`NONE`].
    pub(crate) fn count_sum(&mut self, a: &Activation, end: u32) -> u32 {
        let fun = &mut self.funcs[a.func as usize];
        let add = if end == END_EXIT {
            0
        } else {
            fun.bl
                .edge(a.last_node, EXIT_EDGE | end)
                .expect("a back edge's end is numbered before it is counted")
        };
        let id = a.r.wrapping_add(add);
        self.count_id(a.func, id, 1);
        if a.pap == NONE && self.config.k == 0 {
            return NONE;
        }
        let p = self.number_of(a.func, id);
        if self.config.k > 0 {
            self.kslab_push(a.func, p);
        }
        p
    }

    /// [`PathRecorder::pop_activation`] of an activation with a sum, with its function's
    /// state read once: false (nothing done) if the top activation's function is spelled.
    #[inline]
    pub(crate) fn pop_sums(&mut self) -> bool {
        let a = *self.stack.last().expect("an activation");
        let fun = &mut self.funcs[a.func as usize];
        if fun.spelled {
            return false;
        }
        self.stack.pop();
        // Its path ends with the activation: its id is its sum.
        if a.r < fun.dense_len {
            self.dense[(fun.dense_base + a.r) as usize] += 1;
        } else {
            *fun.bl_counts.entry(a.r).or_insert(0) += 1;
        }
        if self.tallies {
            fun.path_ends += a.path_ends + 1;
            let node = &mut self.calltree[a.call_node as usize];
            node.blocks += a.blocks + a.len as u64;
            node.instructions += a.instructions + a.path_instr;
        }
        if a.pap != NONE || self.config.k > 0 {
            self.pop_sums_numbered(a);
        }
        true
    }

    /// What [`PathRecorder::pop_sums`] does for an activation that records a PAP run or
    /// feeds a k-slab forest: its last path's number.
    fn pop_sums_numbered(&mut self, mut a: Activation) {
        let p = self.number_of(a.func, a.r);
        if self.config.k > 0 {
            self.kslab_push(a.func, p);
        }
        if a.pap != NONE {
            self.pap_runs.push(&mut a, p);
            self.pap_runs.end(&a);
        }
    }

    /// Counts `n` runs of `func`'s path `id` (under its current numbering).
    #[inline]
    pub(crate) fn count_id(&mut self, func: u32, id: u64, n: u64) {
        let fun = &mut self.funcs[func as usize];
        if id < fun.dense_len {
            self.dense[(fun.dense_base + id) as usize] += n;
        } else {
            *fun.bl_counts.entry(id).or_insert(0) += n;
        }
    }

    /// [`PathRecorder::step_intra`] for a function with sums: the top activation goes on to
    /// `node` (at guest address `addr`), ending its path first at a back edge. Returns the
    /// number of the path it ended where one is needed (else [`NONE`]), or `None` if the
    /// function had to be spelled on the way (the caller then takes the trie step).
    pub(crate) fn sums_intra(&mut self, func: u32, node: u32, addr: u64) -> Option<u32> {
        let top = *self.stack.last().expect("an activation");
        let u = top.last_node;
        let instr = self.funcs[func as usize].node_instr[node as usize] as u64;
        if addr <= top.last_addr {
            let bl = &self.funcs[func as usize].bl;
            let need_end = bl.edge(u, EXIT_EDGE | node).is_none();
            let need_start = bl.start(START_HEAD, node).is_none();
            if (need_end || need_start)
                && !self.grow(func, |bl| {
                    if need_end {
                        bl.add_edge(u, EXIT_EDGE | node);
                    }
                    if need_start {
                        bl.add_start(START_HEAD, node);
                    }
                })
            {
                return None;
            }
            let p = self.end_path(node);
            let r = self.funcs[func as usize]
                .bl
                .start(START_HEAD, node)
                .expect("numbered above");
            let top = self.stack.last_mut().expect("an activation");
            top.r = r;
            top.last_node = node;
            top.len = 1;
            top.path_instr = instr;
            top.last_addr = addr;
            Some(p)
        } else {
            let e = match self.funcs[func as usize].bl.edge(u, node) {
                Some(e) => e,
                None => {
                    if !self.grow(func, |bl| bl.add_edge(u, node)) {
                        return None;
                    }
                    self.funcs[func as usize]
                        .bl
                        .edge(u, node)
                        .expect("numbered above")
                }
            };
            let top = self.stack.last_mut().expect("an activation");
            top.r = top.r.wrapping_add(e);
            top.last_node = node;
            top.len += 1;
            top.path_instr += instr;
            top.last_addr = addr;
            Some(NONE)
        }
    }

    /// [`PathRecorder::push_activation`] with sums: starts an activation of `func` at block
    /// `id`, returning to `return_to`, under call-tree node `parent_call`.
    pub(crate) fn push_activation_sums(
        &mut self,
        func: u32,
        return_to: u64,
        parent_call: u32,
        id: u32,
        tables: &Tables,
    ) {
        if self.stack.len() >= self.stack_cap() {
            self.drop_bottom(SHADOW_STACK_MAX / 2);
        }
        let node = self.node_of(func, id, tables);
        let tag = if node == 0 { START_ENTRY } else { START_HEAD };
        let (r, cur) = self.path_start(func, tag, node);
        let call_node = match self.cached_call_child(parent_call, func) {
            NONE => self.call_child(parent_call, func),
            c => c,
        };
        if self.config.k > 0 {
            self.kslab_enter(func);
        }
        let pap = self.start_activation(func);
        self.stack.push(Activation {
            cur,
            r,
            last_node: node,
            path_instr: self.funcs[func as usize].node_instr[node as usize] as u64,
            ..Activation::new(func, return_to, call_node, pap, self.id_addr[id as usize])
        });
    }

    /// The start of a path of `func` at `node` after `tag`: its sum (the start numbered first
    /// if new), or for a spelled function its trie root.
    fn path_start(&mut self, func: u32, tag: u32, node: u32) -> (u64, u32) {
        if self.by_sums(func) {
            if let Some(v) = self.funcs[func as usize].bl.start(tag, node) {
                return (v, NONE);
            }
            if self.grow(func, |bl| bl.add_start(tag, node)) {
                let v = self.funcs[func as usize].bl.start(tag, node);
                return (v.expect("numbered above"), NONE);
            }
        }
        (0, self.root(func, tag, node))
    }

    /// Adds to `func`'s numbering what `add` adds and numbers it again (see the module doc):
    /// its counts are spelled first and its live activations re-encoded. Returns false if the
    /// function is spelled from now on (its paths need more than 2^64 ids).
    #[cold]
    fn grow(&mut self, func: u32, add: impl FnOnce(&mut Numbering)) -> bool {
        self.settle_pairs();
        // Its pair programs summed the old numbers.
        self.bump_epoch(func);
        // What the old numbers name: the live activations' prefixes.
        let bl = &self.funcs[func as usize].bl;
        let mut live: Vec<(usize, Spelled)> = Vec::new();
        for (i, a) in self.stack.iter().enumerate() {
            if a.func == func {
                let mut prefix = Spelled::default();
                let decoded = bl.decode_into(a.r, &mut prefix);
                debug_assert!(
                    decoded && prefix.end.is_none() && prefix.nodes.last() == Some(&a.last_node),
                    "a live sum names its prefix"
                );
                live.push((i, prefix));
            }
        }
        // The counts go to the interned paths now: kept under the new ids, every later
        // renumbering would spell them all again.
        self.flush_sums(func);
        let fun = &mut self.funcs[func as usize];
        fun.numbers.clear();
        add(&mut fun.bl);
        let numbered = fun.bl.renumber(&fun.node_addr);
        if !numbered {
            fun.spelled = true;
            fun.dense_len = 0;
            for (i, prefix) in &live {
                self.stack[*i].cur = self.trie_walk(func, prefix);
            }
            return false;
        }
        if fun.bl.total() <= DENSE_MAX {
            if fun.bl.total() > fun.dense_cap {
                fun.dense_cap = fun.bl.total().next_power_of_two().max(16);
                fun.dense_base = self.dense.len() as u64;
                self.dense
                    .resize(self.dense.len() + fun.dense_cap as usize, 0);
                self.dense_numbers.resize(self.dense.len(), NONE);
            } else {
                // The ids mean other paths now.
                let block = fun.dense_base as usize..(fun.dense_base + fun.dense_cap) as usize;
                self.dense_numbers[block].fill(NONE);
            }
            fun.dense_len = fun.bl.total();
        } else {
            fun.dense_len = 0;
        }
        for (i, prefix) in &live {
            self.stack[*i].r = fun.bl.encode(prefix).expect("edges are only ever added");
        }
        true
    }

    /// Adds `func`'s counted ids to the interned paths' counts, spelling each under the
    /// current numbers, and empties its counters.
    fn flush_sums(&mut self, func: u32) {
        let mut path = std::mem::take(&mut self.spelled);
        let fun = &self.funcs[func as usize];
        for id in 0..fun.dense_len {
            let at = (self.funcs[func as usize].dense_base + id) as usize;
            let count = std::mem::take(&mut self.dense[at]);
            if count != 0 {
                self.add_spelled(func, id, count, &mut path);
            }
        }
        let mut counts = std::mem::take(&mut self.funcs[func as usize].bl_counts);
        for (&id, &count) in &counts {
            self.add_spelled(func, id, count, &mut path);
        }
        counts.clear();
        self.funcs[func as usize].bl_counts = counts;
        self.spelled = path;
    }

    /// Adds `count` runs of `func`'s path `id` to its interned path's count (`path`: a buffer).
    fn add_spelled(&mut self, func: u32, id: u64, count: u64, path: &mut Spelled) {
        let decoded = self.funcs[func as usize].bl.decode_into(id, path);
        debug_assert!(decoded, "a counted id names a path");
        if decoded {
            let p = self.intern_spelled(func, path);
            self.paths[p as usize].count += count;
        }
    }

    /// Adds every function's counted ids to the interned paths' counts (the profile is taken).
    pub(crate) fn flush_all_sums(&mut self) {
        for f in 0..self.funcs.len() as u32 {
            let fun = &self.funcs[f as usize];
            if !fun.bl_counts.is_empty() || fun.dense_len > 0 {
                self.flush_sums(f);
            }
        }
    }

    /// The path number of `func`'s path with id `id` under its current numbering.
    pub(crate) fn number_of(&mut self, func: u32, id: u64) -> u32 {
        let fun = &self.funcs[func as usize];
        if id < fun.dense_len {
            let at = (fun.dense_base + id) as usize;
            return match self.dense_numbers[at] {
                NONE => {
                    let p = self.number_of_slow(func, id);
                    self.dense_numbers[at] = p;
                    p
                }
                p => p,
            };
        }
        if let Some(&p) = fun.numbers.get(&id) {
            return p;
        }
        let p = self.number_of_slow(func, id);
        self.funcs[func as usize].numbers.insert(id, p);
        p
    }

    #[cold]
    fn number_of_slow(&mut self, func: u32, id: u64) -> u32 {
        let mut path = std::mem::take(&mut self.spelled);
        let decoded = self.funcs[func as usize].bl.decode_into(id, &mut path);
        debug_assert!(decoded, "a counted id names a path");
        let p = self.intern_spelled(func, &path);
        self.spelled = path;
        p
    }

    /// The interned path number of a spelled path of `func`.
    fn intern_spelled(&mut self, func: u32, path: &Spelled) -> u32 {
        let t = self.trie_walk(func, path);
        self.path_of(t, path.end.unwrap_or(END_EXIT))
    }

    /// The trie node of a spelled path's blocks (its end aside).
    fn trie_walk(&mut self, func: u32, path: &Spelled) -> u32 {
        let (&first, rest) = path.nodes.split_first().expect("a path has a block");
        let mut t = self.root(func, path.start_tag, first);
        for &n in rest {
            t = self.trie_step(t, n);
        }
        t
    }
}
