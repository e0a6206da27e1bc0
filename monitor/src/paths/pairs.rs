//! The sums recorder per event: a program per run and the block before it that sums the
//! run's edges once (docs/paths-design.md, "The recorder at the tables' cost").
//!
//! A *run* is what one event stands for once a superblock's extent is known: a basic block, a
//! superblock run to its end, or a superblock left at a side exit (the side exit's id stands
//! for the blocks before it). The per-block step of a run's blocks (`recorder.rs`) depends on
//! the block before the run, on the shadow stack and on the blocks themselves. In the common
//! case each step continues an activation's path in its function, or is a plain call (into a
//! function entry a call has reached before) or a plain return (to the top frame's return
//! address, with a frame below), and then what the run does is fixed by the pair `(block
//! before the run, run)` and the state it meets: the run splits into *pieces* at its calls and returns,
//! and each piece is a push, a pop or nothing, then a *segment* of steps in one function: a
//! sum added to the activation's register, blocks and instructions added to its path, and at
//! back edges inside it, paths ended (the first one's id is the register plus a constant, the
//! others are constants) and a new register. That is compiled once into a chain of
//! [`Program`]s, found through two slots per previous run (the tables' successor cache, keyed
//! the same way), a direct-mapped cache and a map by block behind them. (Stored by the
//! previous run instead, an interpreter whose traces each end at its dispatch had a program
//! per pair of handlers: a 4,000-case `switch` made 3.5 million, 680 MB.) and each piece is checked
//! before it is applied against what it assumed:
//! 1. its function's numbering, entries and nodes are as they were (a per-function epoch,
//!    bumped by a renumbering and by a call reaching one of its nodes' addresses first, which
//!    makes it an entry in every function that has it);
//! 2. the activation its segment steps (the top one; after a return, the one below it) is in
//!    the piece's function, at the node it was compiled from; a pop is of a frame whose
//!    return address is the piece's first block, with a frame below; a push has room on the
//!    stack and its call-tree child cached;
//! 3. no block of it that follows an indirect jump is that activation's return address (the
//!    per-block step would return there);
//! 4. no k-slab forest is kept (it wants every path's number in order: the per-block step
//!    gives it). An activation that records a PAP run gets the numbers of the paths a
//!    segment ends, in order, looked up beside the counters.
//!
//! A piece that fails its checks hands the rest of the run, from its first block, to the
//! per-block step (the pieces before it are applied and stand). Anything else —
//! resynchronisations, new nodes or edges (which renumber), tail calls — is the per-block step
//! of the run's blocks, after which the pair usually compiles.

use super::frames::{Activation, Resync};
use super::ids::NONE;
use super::programs::{
    Applied, End, Program, CALL, FAST_BACKOFF, FOREIGN, INTRA, NEVER, NO_DENSE, STALE, TAIL,
};
use super::recorder::PathRecorder;
use super::runs::{repeat_run_end, NextRun};
use crate::Tables;

impl PathRecorder {
    /// [`PathRecorder::record`] for the sums recorder: each event's run through its pair's
    /// program, or through the per-block step.
    pub(crate) fn record_pairs(&mut self, events: &[u32], tables: &Tables) {
        let mut i = 0;
        self.runs.repeats.clear();
        if self.runs.pending != NONE {
            let Some((run, taken)) = self.pending_run(events, tables) else {
                return;
            };
            i = taken;
            self.run_pair(run, tables);
        }
        while i < events.len() {
            if self.pairs.backoff == 0 {
                let j = self.run_sums_loop(events, i);
                if j < i + 2 {
                    self.pairs.backoff = FAST_BACKOFF;
                }
                i = j;
                let Some(_) = events.get(i) else { break };
            } else {
                self.pairs.backoff -= 1;
            }
            match self.next_run(events, &mut i, tables) {
                NextRun::Run(run) => self.run_pair(run, tables),
                NextRun::Skip => {}
                NextRun::Pending => break,
            }
        }
    }

    /// The common case with its state in registers: runs whose pair's program is one piece
    /// that continues the top activation's path, from `events[i]` on. Returns the index of
    /// the first event it did not take (anything else: a call, a return, a stale or missing
    /// program, a superblock whose extent the next piece of events tells).
    fn run_sums_loop(&mut self, events: &[u32], mut i: usize) -> usize {
        let Some(top) = self.stack.last().copied() else {
            return i;
        };
        if self.config.k > 0 || self.prev == NONE || !self.by_sums(top.func) {
            return i;
        }
        let func = top.func;
        let depth = self.stack.len();
        let epoch = self.fepoch[func as usize];
        let (pap, return_to) = (top.pap != NONE, top.return_to);
        let (mut r, mut len, mut pinstr) = (top.r, top.len, top.path_instr);
        let (mut node, mut addr, mut last) = (top.last_node, top.last_addr, self.prev);
        let (mut blocks, mut instrs, mut path_ends) = (0u64, 0u64, 0u64);
        let mut prev_run = self.pairs.prev_run;
        let start = i;
        let infos = &self.runs.events;
        while let Some(&e) = events.get(i) {
            let Some(info) = infos.get(e as usize) else {
                break;
            };
            let (run, took) = if info.is_superblock {
                let Some(&next) = events.get(i + 1) else {
                    break;
                };
                match infos.get(next as usize) {
                    Some(n) if n.superblock == e => (next, 2),
                    _ => (e, 1),
                }
            } else {
                (e, 1)
            };
            let Some(p) = self.pairs.find(prev_run, last, run, func) else {
                break;
            };
            let prog = &self.pairs.progs[p as usize];
            if prog.kind != INTRA
                || prog.next != NONE
                || prog.epoch != epoch
                || prog.func != func
                || prog.from != node
                || (prog.nind > 0 && !self.ind_ok(prog, return_to))
                || (pap && prog.nends > 0)
                || (prog.folded && self.folds_hold(prog, depth) != Applied::Yes)
            {
                break;
            }
            if prog.folded {
                let runs = &mut self.pairs.runs[p as usize];
                if *runs == 0 {
                    self.pairs.dirty.push(p);
                }
                *runs += 1;
            }
            if prog.nends == 0 {
                r = r.wrapping_add(prog.add);
                len += prog.blocks;
                pinstr += prog.instr;
            } else {
                let first = r.wrapping_add(prog.add);
                if prog.cbase != NO_DENSE {
                    self.dense[r.wrapping_add(prog.cbase) as usize] += 1;
                } else {
                    let fun = &mut self.funcs[func as usize];
                    if first < fun.dense_len {
                        self.dense[(fun.dense_base + first) as usize] += 1;
                    } else {
                        *fun.bl_counts.entry(first).or_insert(0) += 1;
                    }
                }
                blocks += (len + prog.blocks) as u64 + prog.mid_blocks;
                instrs += pinstr + prog.instr + prog.mid_instr;
                path_ends += prog.nends as u64;
                (r, len, pinstr) = (prog.r_after, prog.blocks_after, prog.instr_after);
                if prog.nends > 1 && !prog.folded {
                    let runs = &mut self.pairs.runs[p as usize];
                    if *runs == 0 {
                        self.pairs.dirty.push(p);
                    }
                    *runs += 1;
                }
            }
            (node, addr, last) = (prog.last_node, prog.last_addr, prog.last);
            i += took;
            if prev_run == run && took == 1 && prog.from == prog.last_node {
                // A loop whose body is this run: the same program again from the same state,
                // as often as the event repeats, counted at once (and by the tables too:
                // `Tables::record_with_repeats`).
                let next = repeat_run_end(events, i, e, info.is_superblock);
                let k = (next - i) as u64;
                if k > 0 {
                    self.runs.repeats.push((i as u32, next as u32));
                    if prog.folded {
                        self.pairs.runs[p as usize] += k;
                    }
                    if prog.nends == 0 {
                        r = r.wrapping_add(prog.add.wrapping_mul(k));
                        len += prog.blocks * k as u32;
                        pinstr += prog.instr * k;
                    } else {
                        let first = r.wrapping_add(prog.add);
                        if prog.cbase != NO_DENSE {
                            self.dense[r.wrapping_add(prog.cbase) as usize] += k;
                        } else {
                            let fun = &mut self.funcs[func as usize];
                            if first < fun.dense_len {
                                self.dense[(fun.dense_base + first) as usize] += k;
                            } else {
                                *fun.bl_counts.entry(first).or_insert(0) += k;
                            }
                        }
                        blocks += k * ((len + prog.blocks) as u64 + prog.mid_blocks);
                        instrs += k * (pinstr + prog.instr + prog.mid_instr);
                        path_ends += k * prog.nends as u64;
                        if prog.nends > 1 && !prog.folded {
                            let runs = &mut self.pairs.runs[p as usize];
                            if *runs == 0 {
                                self.pairs.dirty.push(p);
                            }
                            *runs += k;
                        }
                    }
                    i = next;
                }
            }
            prev_run = run;
        }
        if i > start {
            self.pairs.prev_run = prev_run;
            self.prev = last;
            let top = self.stack.last_mut().expect("an activation");
            (top.r, top.len, top.path_instr) = (r, len, pinstr);
            (top.last_node, top.last_addr) = (node, addr);
            top.blocks += blocks;
            top.instructions += instrs;
            top.path_ends += path_ends;
        }
        i
    }

    /// The superblock still waiting for its next event ran to its end.
    pub(crate) fn flush_pending_pair(&mut self, tables: &Tables) {
        let pending = std::mem::replace(&mut self.runs.pending, NONE);
        if pending != NONE {
            self.run_pair(pending, tables);
        }
    }

    /// Accounts run `run` (an event id whose blocks are known).
    #[inline]
    fn run_pair(&mut self, run: u32, tables: &Tables) {
        let prev_run = std::mem::replace(&mut self.pairs.prev_run, run);
        // A program is stored by the block before the run, not the run before it: what the
        // run does depends on that block alone (and on the state, which each piece checks),
        // and an interpreter whose traces each end at its dispatch would otherwise compile a
        // program per pair of handlers (a 4,000-case `switch`: 3.5 million programs, 680 MB).
        // The slots that find it first stay per run before, whose successors follow the
        // program's own sequence of handlers (by block, an interpreter's slots missed more:
        // 15 % slower).
        let prev = self.prev;
        let func = self.stack.last().map_or(NONE, |a| a.func);
        let mut from = 0;
        if prev_run != NONE && prev != NONE {
            let found = self.pairs.find_in_slots(prev_run, run).or_else(|| {
                let p = self.pairs.find_slow(prev_run, prev, run, func)?;
                self.pairs.remember(prev_run, run, p);
                Some(p)
            });
            let mut applied = match found {
                Some(p) => self.apply_chain(p),
                None => Err((Applied::Stale, 0)),
            };
            if matches!(applied, Err((Applied::Stale, 0))) {
                // The one the slots found may be this run's program in another function's
                // activation: this function's, if it has one.
                let own = self.pairs.map.get(&(prev, run, func)).copied();
                if let Some(q) = own.filter(|&q| Some(q) != found) {
                    applied = self.apply_chain(q);
                    if applied.is_ok() {
                        self.pairs.remember(prev_run, run, q);
                    }
                }
            }
            match applied {
                Ok(()) => return,
                Err((Applied::Stale, 0)) => {
                    let mut scratch = std::mem::take(&mut self.pairs.scratch);
                    self.compile(run, &mut scratch);
                    let p = self.store_pair(prev, run, func, &mut scratch.chain);
                    self.pairs.remember(prev_run, run, p);
                    self.pairs.scratch = scratch;
                    match self.apply_chain(p) {
                        Ok(()) => return,
                        Err((_, pos)) => from = pos,
                    }
                }
                Err((_, pos)) => from = pos,
            }
        }
        self.step_run_from(run, from, tables);
    }

    /// The per-block step of run `run`'s blocks from position `from` (blocks) on.
    fn step_run_from(&mut self, run: u32, from: u32, tables: &Tables) {
        let info = self.runs.events[run as usize];
        for k in info.start + from..info.start + info.len {
            let b = self.runs.seq[k as usize];
            if (b as usize) < self.id_addr.len() {
                self.step(b, tables);
            }
        }
    }

    /// Applies the chain of pieces from program `first`; on a piece that fails its checks, what
    /// it found and the position in the run where the per-block step must take over. A later
    /// piece found stale makes the chain's first piece stale too, so that the pair is compiled
    /// again next time.
    #[inline]
    fn apply_chain(&mut self, first: u32) -> Result<(), (Applied, u32)> {
        // Out of `self` while they are applied, so that a piece is read in place (a copy of
        // one was a `memcpy` whose stores the next load waited for).
        let mut progs = std::mem::take(&mut self.pairs.progs);
        let mut p = first;
        let done = loop {
            let prog = &mut progs[p as usize];
            let (next, pos) = (prog.next, prog.pos);
            match self.apply(p, prog) {
                Applied::Yes if next == NONE => break Ok(()),
                Applied::Yes => p = next,
                Applied::Stale if p != first => {
                    progs[first as usize].epoch = STALE;
                    break Err((Applied::Refused, pos));
                }
                a => break Err((a, pos)),
            }
        };
        self.pairs.progs = progs;
        done
    }

    /// Keeps the chain of pieces `chain` as the program of run `run` after block `prev` in an
    /// activation of function `func` (over the stale one, whose runs are settled first, where
    /// it has as many pieces). Returns its first piece.
    fn store_pair(&mut self, prev: u32, run: u32, func: u32, chain: &mut [Program]) -> u32 {
        let old = self.pairs.map.get(&(prev, run, func)).copied();
        let old_len = old.map(|p| self.chain_len(p));
        let first = match old {
            Some(p) if old_len == Some(chain.len()) => {
                for k in 0..chain.len() as u32 {
                    self.settle_pair(p + k);
                }
                p
            }
            _ => {
                let p = self.pairs.progs.len() as u32;
                self.pairs.progs.resize(p as usize + chain.len(), chain[0]);
                self.pairs.runs.resize(p as usize + chain.len(), 0);
                if let Some(o) = old {
                    for k in 0..old_len.unwrap_or(0) as u32 {
                        self.settle_pair(o + k);
                    }
                }
                self.pairs.map.insert((prev, run, func), p);
                p
            }
        };
        let n = chain.len();
        for (k, prog) in chain.iter_mut().enumerate() {
            prog.next = if k + 1 < n {
                first + k as u32 + 1
            } else {
                NONE
            };
            self.pairs.progs[first as usize + k] = *prog;
        }
        first
    }

    /// Pieces in the chain from program `p`.
    fn chain_len(&self, mut p: u32) -> usize {
        let mut n = 1;
        while self.pairs.progs[p as usize].next != NONE {
            p = self.pairs.progs[p as usize].next;
            n += 1;
        }
        n
    }

    /// Counts the second and later path ends of every program's runs so far (before the
    /// numbers they were compiled with change, and when the profile is taken).
    pub(crate) fn settle_pairs(&mut self) {
        while let Some(p) = self.pairs.dirty.pop() {
            self.settle_pair(p);
        }
    }

    /// Counts program `p`'s runs' second and later path ends (it stays on the dirty list,
    /// which [`PathRecorder::settle_pairs`] empties, with no runs).
    fn settle_pair(&mut self, p: u32) {
        let n = std::mem::take(&mut self.pairs.runs[p as usize]);
        if n == 0 {
            return;
        }
        let prog = self.pairs.progs[p as usize];
        let later = prog.nends.saturating_sub(1) + prog.nfold_ends;
        for k in prog.ends..prog.ends + later {
            let End { func, id, .. } = self.pairs.ends[k as usize];
            self.count_id(func, id, n);
        }
        if prog.folded {
            self.resyncs += n * prog.fold_tails as u64;
            self.resync_kinds[Resync::TailCall as usize] += n * prog.fold_tails as u64;
        }
    }

    /// Whether piece `prog`'s folded activations (if any) may run on a stack `depth` frames
    /// deep when its segment starts: the functions they run are numbered as when compiled
    /// (else `Stale`), and the stack has room for them without dropping frames (else
    /// `Refused`, as the per-block step would drop some).
    #[inline]
    fn folds_hold(&self, prog: &Program, depth: usize) -> Applied {
        if !prog.folded {
            return Applied::Yes;
        }
        let folds = &self.pairs.folds[prog.folds as usize..(prog.folds + prog.nfolds) as usize];
        if folds
            .iter()
            .any(|f| self.fepoch[f.func as usize] != f.epoch)
        {
            return Applied::Stale;
        }
        if depth + prog.fold_depth as usize > self.stack_cap() {
            return Applied::Refused;
        }
        Applied::Yes
    }

    /// Applies piece `p` (`prog`) if its assumptions hold (module doc).
    #[inline]
    fn apply(&mut self, p: u32, prog: &mut Program) -> Applied {
        if prog.kind == NEVER {
            return if prog.epoch == self.pairs.epoch {
                Applied::Refused
            } else {
                Applied::Stale
            };
        }
        if self.fepoch[prog.func as usize] != prog.epoch {
            return Applied::Stale;
        }
        let depth = self.stack.len();
        let Some(top) = self.stack.last() else {
            return Applied::Refused;
        };
        if prog.prefix != NONE {
            let pre = &self.pairs.prefixes[prog.prefix as usize];
            if self.fepoch[pre.func as usize] != pre.epoch
                || top.func != pre.func
                || top.last_node != pre.from
            {
                return Applied::Stale;
            }
        }
        match prog.kind {
            INTRA => {
                if top.func != prog.func || top.last_node != prog.from {
                    return Applied::Stale;
                }
                if !self.ind_ok(prog, top.return_to) {
                    return Applied::Refused;
                }
                match self.folds_hold(prog, depth) {
                    Applied::Yes => {}
                    a => return a,
                }
            }
            CALL => {
                // Without tallies there is no call tree: every activation is the root's.
                let call_node = match self.tallies {
                    true => self.cached_call_child(top.call_node, prog.func),
                    false => 0,
                };
                if call_node == NONE || depth >= self.stack_cap() || !self.ind_ok(prog, prog.ret) {
                    return Applied::Refused;
                }
                match self.folds_hold(prog, depth + 1) {
                    Applied::Yes => {}
                    a => return a,
                }
                let pap = match self.tallies {
                    true => self.start_activation(prog.func),
                    false => NONE,
                };
                self.step_prefix(prog.prefix);
                self.stack.push(Activation {
                    r: prog.r0,
                    last_node: prog.from,
                    path_instr: prog.first_instr,
                    // The address is set by the segment.
                    ..Activation::new(prog.func, prog.ret, call_node, pap, prog.last_addr)
                });
            }
            TAIL | FOREIGN => {
                if top.func != prog.tail_of {
                    return Applied::Stale;
                }
                if prog.kind == FOREIGN && !self.foreign_ok(prog) {
                    return Applied::Refused;
                }
                let return_to = top.return_to;
                let parent = match self.calltree[top.call_node as usize].parent {
                    NONE => 0,
                    parent => parent,
                };
                let call_node = self.cached_call_child(parent, prog.func);
                if call_node == NONE || !self.ind_ok(prog, return_to) {
                    return Applied::Refused;
                }
                match self.folds_hold(prog, depth) {
                    Applied::Yes => {}
                    a => return a,
                }
                // As the per-block step's `replace_activation`.
                self.resync(if prog.kind == TAIL {
                    Resync::TailCall
                } else {
                    Resync::ForeignJump
                });
                self.pop_activation();
                let pap = self.start_activation(prog.func);
                self.stack.push(Activation {
                    r: prog.r0,
                    last_node: prog.from,
                    path_instr: prog.first_instr,
                    ..Activation::new(prog.func, return_to, call_node, pap, prog.last_addr)
                });
            }
            _ => {
                // RETURN
                if depth < 2 || top.return_to != prog.ret {
                    return Applied::Refused;
                }
                let below = &self.stack[depth - 2];
                if below.func != prog.func {
                    return Applied::Stale;
                }
                if !self.ind_ok(prog, below.return_to) {
                    return Applied::Refused;
                }
                match self.folds_hold(prog, depth - 1) {
                    Applied::Yes => {}
                    a => return a,
                }
                let e = if below.last_node == prog.from {
                    prog.r0
                } else {
                    let edge = (below.last_addr < prog.ret)
                        .then(|| {
                            self.funcs[prog.func as usize]
                                .bl
                                .edge(below.last_node, prog.first_node)
                        })
                        .flatten();
                    let Some(e) = edge else {
                        return Applied::Refused;
                    };
                    (prog.from, prog.r0) = (below.last_node, e);
                    e
                };
                self.step_prefix(prog.prefix);
                self.pop_activation();
                let tallies = self.tallies;
                let top = self.stack.last_mut().expect("the caller");
                top.r = top.r.wrapping_add(e);
                if tallies {
                    top.len += 1;
                    top.path_instr += prog.first_instr;
                }
                top.last_node = prog.first_node;
                top.last_addr = prog.ret;
            }
        }
        self.prev = prog.last;
        self.apply_segment(p, prog);
        Applied::Yes
    }

    /// The steps of [`Prefix`] `prefix` ([`NONE`]: none) on the top activation's path (its
    /// checks are done).
    #[inline]
    fn step_prefix(&mut self, prefix: u32) {
        if prefix != NONE {
            let pre = self.pairs.prefixes[prefix as usize];
            let top = self.stack.last_mut().expect("an activation");
            top.r = top.r.wrapping_add(pre.add);
            (top.last_node, top.last_addr) = (pre.last_node, pre.last_addr);
        }
    }

    /// Whether the per-block step of [`FOREIGN`] piece `prog`'s jump would find a foreign
    /// jump on the stack as it is: no frame but the bottom one returns to its target, and no
    /// frame's function owns it (else it returns there, or unwinds to that frame).
    fn foreign_ok(&self, prog: &Program) -> bool {
        let (addr, sym) = (prog.ret, Some(prog.foreign_sym as usize));
        self.stack
            .iter()
            .enumerate()
            .all(|(i, a)| (i == 0 || a.return_to != addr) && !self.owns_in(a.func, addr, sym))
    }

    /// Whether none of the piece's blocks that follow an indirect jump is `return_to` (the
    /// stepping activation's return address: the per-block step would return there).
    #[inline]
    fn ind_ok(&self, prog: &Program, return_to: u64) -> bool {
        prog.nind == 0
            || !self.pairs.ind[prog.ind as usize..(prog.ind + prog.nind as u32) as usize]
                .contains(&return_to)
    }

    /// The segment of piece `p` on the top activation's path (the checks are done).
    #[inline]
    fn apply_segment(&mut self, p: u32, prog: &Program) {
        if prog.folded {
            let runs = &mut self.pairs.runs[p as usize];
            if *runs == 0 {
                self.pairs.dirty.push(p);
            }
            *runs += 1;
        }
        let tallies = self.tallies;
        let top = self.stack.last_mut().expect("an activation");
        if prog.nends == 0 {
            top.r = top.r.wrapping_add(prog.add);
            if tallies {
                top.len += prog.blocks;
                top.path_instr += prog.instr;
            }
            top.last_node = prog.last_node;
            top.last_addr = prog.last_addr;
            return;
        }
        let r = top.r;
        if tallies {
            top.blocks += (top.len + prog.blocks) as u64 + prog.mid_blocks;
            top.instructions += top.path_instr + prog.instr + prog.mid_instr;
            top.path_ends += prog.nends as u64;
            top.len = prog.blocks_after;
            top.path_instr = prog.instr_after;
        }
        top.r = prog.r_after;
        top.last_node = prog.last_node;
        top.last_addr = prog.last_addr;
        let pap = top.pap != NONE;
        if prog.cbase != NO_DENSE {
            self.dense[r.wrapping_add(prog.cbase) as usize] += 1;
        } else {
            self.count_id(prog.func, r.wrapping_add(prog.add), 1);
        }
        if pap {
            self.pap_ends(prog, r.wrapping_add(prog.add));
        }
        if prog.nends > 1 && !prog.folded {
            let runs = &mut self.pairs.runs[p as usize];
            if *runs == 0 {
                self.pairs.dirty.push(p);
            }
            *runs += 1;
        }
    }

    /// Feeds the paths a segment ended (the first with id `first`) to the top activation's
    /// PAP run, in order, until the run is abandoned.
    #[cold]
    fn pap_ends(&mut self, prog: &Program, first: u64) {
        let p = self.number_of(prog.func, first);
        let top = self.stack.last_mut().expect("an activation");
        self.pap_runs.push(top, p);
        for k in prog.ends..prog.ends + prog.nends - 1 {
            if self.stack.last().expect("an activation").pap == NONE {
                return;
            }
            let e = self.pairs.ends[k as usize];
            let p = match e.number {
                NONE => {
                    let p = self.number_of(prog.func, e.id);
                    self.pairs.ends[k as usize].number = p;
                    p
                }
                p => p,
            };
            let top = self.stack.last_mut().expect("an activation");
            self.pap_runs.push(top, p);
        }
    }
}
