//! The sums recorder per event: a program per pair of ring runs that sums a run's edges once
//! (docs/paths-design.md, "The recorder at the tables' cost", build order step 2).
//!
//! A *run* is what one event stands for once a superblock's extent is known: a basic block, a
//! superblock run to its end, or a superblock left at a side exit (the side exit's id stands
//! for the blocks before it). The per-block step of a run's blocks (`recorder.rs`) depends on
//! the block before the run, on the top activation and on the blocks themselves; in the common
//! case every step continues the top activation's path in its function, and then what the run
//! does is fixed by the pair `(previous run, run)`, the function and the node the path is at:
//! a sum added to the activation's register, blocks and instructions added to its path, and at
//! back edges inside the run, paths ended (the first one's id is the register plus a constant,
//! the others are constants) and a new register. That is compiled once into a [`Program`],
//! found through two slots per previous run (the tables' successor cache, keyed the same way)
//! and a map behind them, and checked before each use against what it assumed:
//! 1. the numbering and the function entries are as they were (one epoch, bumped by every
//!    renumbering and every new entry: `MemoState::invalidate`);
//! 2. the top activation is in the program's function, at the node it was compiled from;
//! 3. after an indirect jump, the run's first block was last seen in that function and is not
//!    the activation's return address (the per-block step's own test for an intra-procedural
//!    indirect jump);
//! 4. no PAP run is being recorded if the program ends paths, and no k-slab forest is kept
//!    (both want each path's number in order: the per-block step gives it).
//!
//! Anything else — calls, returns, resynchronisations, new nodes or edges (which renumber) —
//! is the per-block step of the run's blocks, after which the pair usually compiles.

use hotpath_events::is_id;

use super::ids::{FxMap, NONE};
use super::numbering::EXIT_EDGE;
use super::recorder::PathRecorder;
use super::stack::{Activation, K_CALL, K_INDIRECT, K_OTHER, K_RET};
use super::trie::{START_ENTRY, START_HEAD};
use crate::Tables;

/// What a run does to the shadow stack and the top activation's path (see the module doc).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Program {
    /// `MemoState::epoch` when compiled.
    epoch: u32,
    /// [`INTRA`], [`CALL`], [`RETURN`], or [`NEVER`] (the per-block step).
    kind: u8,
    /// The function the run's path steps in, and the node its path must be at before the
    /// segment ([`INTRA`]: the top activation; [`RETURN`]: the caller returned to; [`CALL`]:
    /// the callee, at its first node).
    func: u32,
    from: u32,
    /// [`CALL`]: the callee's return address and the register its first path starts with.
    /// [`RETURN`]: the address returned to (the top activation's return address).
    ret: u64,
    r0: u64,
    /// Guest addresses of the run's blocks that follow an indirect jump: each must not be the
    /// stepping activation's return address (`Pairs::ind[ind..ind + nind]`).
    ind: u32,
    nind: u32,
    /// Added to the register: the segment's edges (with no path end), or the edges up to and
    /// including the first back edge's end (the first ended path's id is then the register
    /// plus it).
    add: u64,
    /// Blocks and guest instructions the segment adds to the current path (with ends: to the
    /// first ended path).
    blocks: u32,
    instr: u64,
    /// Paths the segment ends; the second and later ones are `Pairs::ends[ends..ends + nends
    /// - 1]`, counted `Pairs::runs` times when settled, with their blocks and instructions
    /// summed in `mid_blocks` and `mid_instr`.
    nends: u32,
    ends: u32,
    mid_blocks: u64,
    mid_instr: u64,
    /// Where the first ended path's count is, minus the register: the function's dense
    /// counters' base plus `add` (wrapping), or [`NO_DENSE`] when its counters are a map.
    cbase: u64,
    /// With ends: the register, the path's blocks and instructions after the last one.
    r_after: u64,
    blocks_after: u32,
    instr_after: u64,
    /// The node and guest address of the run's last block, and the block itself.
    last_node: u32,
    last_addr: u64,
    last: u32,
}

/// Program kinds: the run continues the top activation's path; its first block is a
/// callee's entry (the block before it calls); it returns to the frame below the top one
/// (the block before it returns), whose path it continues; the pair needs the per-block step
/// until the epoch changes.
const INTRA: u8 = 0;
const CALL: u8 = 1;
const RETURN: u8 = 2;
const NEVER: u8 = 3;

/// What [`PathRecorder::apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Applied {
    Yes,
    /// The program was compiled for other numbers or another state: compile it again.
    Stale,
    /// Its assumptions hold but this run needs the per-block step (a PAP run, a full stack, a
    /// call-tree child not cached).
    Refused,
}

/// `Program::cbase` of a function whose counters are a map.
const NO_DENSE: u64 = u64::MAX;

/// A path a program ends after its first: a constant id.
#[derive(Clone, Copy, Debug)]
struct End {
    id: u64,
}

/// The pair programs of one recorder.
#[derive(Clone, Default)]
pub(crate) struct Pairs {
    /// Per previous run: the two runs that followed it most recently, with their programs
    /// (`(NONE, _)`: empty).
    slots: Vec<[(u32, u32); 2]>,
    /// Program by `(previous run, run)`, behind `slots`.
    map: FxMap<(u32, u32), u32>,
    progs: Vec<Program>,
    ends: Vec<End>,
    ind: Vec<u64>,
    /// Per program: runs whose second and later path ends are not yet counted, and the
    /// programs that have some.
    runs: Vec<u64>,
    dirty: Vec<u32>,
    /// The previous run ([`NONE`]: none yet).
    prev_run: u32,
    /// A superblock whose extent the next event tells, or [`NONE`].
    pending: u32,
    /// Runs taken by a program, and by the per-block step.
    pub(crate) by_program: u64,
    pub(crate) by_step: u64,
}

impl Pairs {
    pub(crate) fn new() -> Pairs {
        Pairs {
            prev_run: NONE,
            pending: NONE,
            ..Default::default()
        }
    }

    pub(crate) fn progs_len(&self) -> usize {
        self.progs.len()
    }

    /// The program of pair `(prev, run)`, if one was compiled (perhaps stale).
    #[inline]
    fn find(&self, prev: u32, run: u32) -> Option<u32> {
        let s = self.slots.get(prev as usize)?;
        if s[0].0 == run {
            return Some(s[0].1);
        }
        if s[1].0 == run {
            return Some(s[1].1);
        }
        self.find_slow(prev, run)
    }

    #[cold]
    fn find_slow(&self, prev: u32, run: u32) -> Option<u32> {
        self.map.get(&(prev, run)).copied()
    }
}

impl PathRecorder {
    /// [`PathRecorder::record`] for the sums recorder: each event's run through its pair's
    /// program, or through the per-block step.
    pub(crate) fn record_pairs(&mut self, events: &[u32], tables: &Tables) {
        let mut i = 0;
        if self.pairs.pending != NONE {
            let Some(&next) = events.first() else { return };
            self.learn_event(next, tables);
            let sb = std::mem::replace(&mut self.pairs.pending, NONE);
            let exited = self.exits(sb, next);
            i = exited as usize;
            self.run_pair(if exited { next } else { sb }, tables);
        }
        while i < events.len() {
            let e = events[i];
            i += 1;
            if !is_id(e) || !self.learn_event(e, tables) {
                continue;
            }
            let mut run = e;
            if self.memo.events[e as usize].is_superblock {
                let Some(&next) = events.get(i) else {
                    self.pairs.pending = e;
                    break;
                };
                self.learn_event(next, tables);
                let exited = self.exits(e, next);
                run = if exited { next } else { e };
                i += exited as usize;
            }
            self.run_pair(run, tables);
        }
    }

    /// The superblock still waiting for its next event ran to its end.
    pub(crate) fn flush_pending_pair(&mut self, tables: &Tables) {
        let pending = std::mem::replace(&mut self.pairs.pending, NONE);
        if pending != NONE {
            self.run_pair(pending, tables);
        }
    }

    /// Accounts run `run` (an event id whose blocks are known).
    #[inline]
    fn run_pair(&mut self, run: u32, tables: &Tables) {
        let prev = std::mem::replace(&mut self.pairs.prev_run, run);
        if prev != NONE {
            let found = self.pairs.find(prev, run);
            let applied = match found {
                Some(p) => self.apply(p),
                None => Applied::Stale,
            };
            match applied {
                Applied::Yes => return,
                Applied::Refused => {}
                Applied::Stale => {
                    let prog = self.compile(run);
                    let p = self.store_pair(prev, run, prog);
                    if self.apply(p) == Applied::Yes {
                        return;
                    }
                }
            }
        }
        self.pairs.by_step += 1;
        let info = self.memo.events[run as usize];
        for k in info.start..info.start + info.len {
            let b = self.memo.seq[k as usize];
            if (b as usize) < self.id_addr.len() {
                self.step(b, tables);
            }
        }
    }

    /// Keeps `prog` as pair `(prev, run)`'s program (replacing a stale one, whose runs are
    /// settled first), in its slots.
    fn store_pair(&mut self, prev: u32, run: u32, prog: Program) -> u32 {
        let p = match self.pairs.map.get(&(prev, run)) {
            Some(&p) => {
                self.settle_pair(p);
                self.pairs.progs[p as usize] = prog;
                p
            }
            None => {
                let p = self.pairs.progs.len() as u32;
                self.pairs.progs.push(prog);
                self.pairs.runs.push(0);
                self.pairs.map.insert((prev, run), p);
                p
            }
        };
        let slots = &mut self.pairs.slots;
        if slots.len() <= prev as usize {
            slots.resize(prev as usize + 1, [(NONE, NONE); 2]);
        }
        let s = &mut slots[prev as usize];
        if s[0].0 != run {
            s[1] = s[0];
            s[0] = (run, p);
        }
        p
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
        for k in prog.ends..prog.ends + prog.nends - 1 {
            let id = self.pairs.ends[k as usize].id;
            self.count_id(prog.func, id, n);
        }
    }

    /// Applies program `p` if its assumptions hold (module doc).
    #[inline]
    fn apply(&mut self, p: u32) -> Applied {
        let prog = self.pairs.progs[p as usize];
        if prog.epoch != self.memo.epoch {
            return Applied::Stale;
        }
        let depth = self.stack.len();
        let Some(top) = self.stack.last() else {
            return Applied::Refused;
        };
        match prog.kind {
            INTRA => {
                if top.func != prog.func || top.last_node != prog.from {
                    return Applied::Stale;
                }
                if (prog.nends > 0 && top.pap != NONE) || !self.ind_ok(&prog, top.return_to) {
                    return Applied::Refused;
                }
            }
            CALL => {
                let parent = top.call_node;
                let call_node = self.cached_call_child(parent, prog.func);
                let fun = &self.funcs[prog.func as usize];
                let records = fun.path_ends >= self.config.pap_threshold;
                if call_node == NONE
                    || depth >= self.stack_cap()
                    || (records && prog.nends > 0)
                    || !self.ind_ok(&prog, prog.ret)
                {
                    return Applied::Refused;
                }
                let fun = &mut self.funcs[prog.func as usize];
                fun.activations += 1;
                let pap = if records {
                    self.pap_runs.root(fun)
                } else {
                    NONE
                };
                self.stack.push(Activation {
                    func: prog.func,
                    return_to: prog.ret,
                    cur: NONE,
                    len: 1,
                    blocks: 0,
                    instructions: 0,
                    path_ends: 0,
                    // Both set by the segment.
                    last_addr: prog.last_addr,
                    pap,
                    pap_len: 0,
                    call_node,
                    resume: NONE,
                    r: prog.r0,
                    last_node: prog.from,
                    path_instr: self.funcs[prog.func as usize].node_instr[prog.from as usize]
                        as u64,
                });
            }
            RETURN => {
                if depth < 2 || top.return_to != prog.ret {
                    return Applied::Refused;
                }
                let below = &self.stack[depth - 2];
                if below.func != prog.func || below.last_node != prog.from {
                    return Applied::Stale;
                }
                if (prog.nends > 0 && below.pap != NONE) || !self.ind_ok(&prog, below.return_to) {
                    return Applied::Refused;
                }
                self.pop_activation();
            }
            _ => return Applied::Refused,
        }
        self.pairs.by_program += 1;
        self.prev = prog.last;
        self.apply_segment(p, &prog);
        Applied::Yes
    }

    /// Whether none of the program's blocks that follow an indirect jump is `return_to` (the
    /// stepping activation's return address: the per-block step would return there).
    #[inline]
    fn ind_ok(&self, prog: &Program, return_to: u64) -> bool {
        prog.nind == 0
            || !self.pairs.ind[prog.ind as usize..(prog.ind + prog.nind) as usize]
                .contains(&return_to)
    }

    /// The segment of program `p` on the top activation's path (the checks are done).
    #[inline]
    fn apply_segment(&mut self, p: u32, prog: &Program) {
        let top = self.stack.last_mut().expect("an activation");
        if prog.nends == 0 {
            top.r = top.r.wrapping_add(prog.add);
            top.len += prog.blocks;
            top.path_instr += prog.instr;
            top.last_node = prog.last_node;
            top.last_addr = prog.last_addr;
            return;
        }
        let r = top.r;
        top.blocks += (top.len + prog.blocks) as u64 + prog.mid_blocks;
        top.instructions += top.path_instr + prog.instr + prog.mid_instr;
        top.path_ends += prog.nends as u64;
        top.r = prog.r_after;
        top.len = prog.blocks_after;
        top.path_instr = prog.instr_after;
        top.last_node = prog.last_node;
        top.last_addr = prog.last_addr;
        if prog.cbase != NO_DENSE {
            self.dense[r.wrapping_add(prog.cbase) as usize] += 1;
        } else {
            self.count_id(prog.func, r.wrapping_add(prog.add), 1);
        }
        if prog.nends > 1 {
            let runs = &mut self.pairs.runs[p as usize];
            if *runs == 0 {
                self.pairs.dirty.push(p);
            }
            *runs += 1;
        }
    }

    /// The program of run `run` after the block `self.prev` in the current state (a
    /// [`NEVER`] program if the per-block step would do anything but continue one
    /// activation's path with nodes and edges its function's numbering has, after a plain call
    /// or return at most).
    fn compile(&mut self, run: u32) -> Program {
        let mut prog = Program {
            epoch: self.memo.epoch,
            kind: NEVER,
            func: NONE,
            from: NONE,
            ret: 0,
            r0: 0,
            ind: self.pairs.ind.len() as u32,
            nind: 0,
            add: 0,
            blocks: 0,
            instr: 0,
            nends: 0,
            ends: self.pairs.ends.len() as u32,
            mid_blocks: 0,
            mid_instr: 0,
            cbase: NO_DENSE,
            r_after: 0,
            blocks_after: 0,
            instr_after: 0,
            last_node: NONE,
            last_addr: 0,
            last: NONE,
        };
        if self.compile_into(run, &mut prog).is_none() {
            prog.kind = NEVER;
            self.pairs.ind.truncate(prog.ind as usize);
        }
        prog
    }

    /// [`PathRecorder::compile`]'s work: `None` where the per-block step is needed.
    fn compile_into(&mut self, run: u32, prog: &mut Program) -> Option<()> {
        let depth = self.stack.len();
        let top = *self.stack.last()?;
        if self.prev == NONE || self.config.k > 0 {
            return None;
        }
        let info = self.memo.events[run as usize];
        let blocks: Vec<u32> =
            self.memo.seq[info.start as usize..(info.start + info.len) as usize].to_vec();
        let first = *blocks.first()?;
        let first_addr = self.id_addr[first as usize];
        let entry_of = |b: u32| self.id_entry.get(b as usize).copied();
        // The first block: what the block before it makes of it (the per-block `step`).
        let (func, node, addr, rest) = match self.id_kind[self.prev as usize] {
            K_OTHER | K_INDIRECT => {
                let entry = entry_of(first)?;
                if entry != NONE && entry != top.func {
                    return None;
                }
                if self.id_kind[self.prev as usize] == K_INDIRECT {
                    if self.id_node[first as usize].0 != top.func {
                        return None;
                    }
                    self.pairs.ind.push(first_addr);
                    prog.nind += 1;
                }
                prog.kind = INTRA;
                (top.func, top.last_node, top.last_addr, &blocks[..])
            }
            K_CALL if first_addr != self.id_ret[self.prev as usize] => {
                let f = entry_of(first)?;
                let (g, n) = self.id_node[first as usize];
                if f == NONE || g != f {
                    return None;
                }
                prog.kind = CALL;
                prog.ret = self.id_ret[self.prev as usize];
                let tag = if n == 0 { START_ENTRY } else { START_HEAD };
                prog.r0 = self.funcs[f as usize].bl.start(tag, n)?;
                (f, n, first_addr, &blocks[1..])
            }
            K_RET if depth >= 2 && top.return_to == first_addr => {
                let below = self.stack[depth - 2];
                prog.kind = RETURN;
                prog.ret = first_addr;
                (below.func, below.last_node, below.last_addr, &blocks[..])
            }
            _ => return None,
        };
        if !self.by_sums(func) {
            return None;
        }
        prog.func = func;
        prog.from = node;
        let fun = &self.funcs[func as usize];
        let bl = &fun.bl;
        let (mut node, mut addr) = (node, addr);
        // With ends: the register, blocks and instructions of the path since the last end.
        let (mut r, mut len, mut ins) = (0u64, 0u32, 0u64);
        let mut ends = Vec::new();
        let mut before = if rest.len() < blocks.len() {
            first
        } else {
            self.prev
        };
        for (k, &b) in rest.iter().enumerate() {
            if k > 0 || rest.len() < blocks.len() {
                match self.id_kind[before as usize] {
                    K_OTHER => {}
                    K_INDIRECT if self.id_node[b as usize].0 == func => {
                        self.pairs.ind.push(self.id_addr[b as usize]);
                        prog.nind += 1;
                    }
                    _ => return None,
                }
            }
            before = b;
            let entry = self.id_entry.get(b as usize).copied()?;
            if entry != NONE && entry != func {
                return None;
            }
            let (f, n) = self.id_node[b as usize];
            if f != func {
                return None;
            }
            let a = self.id_addr[b as usize];
            let i = fun.node_instr[n as usize] as u64;
            if a <= addr {
                let end = bl.edge(node, EXIT_EDGE | n)?;
                let start = bl.start(START_HEAD, n)?;
                if prog.nends == 0 {
                    prog.add = prog.add.wrapping_add(end);
                } else {
                    ends.push(End {
                        id: r.wrapping_add(end),
                    });
                    prog.mid_blocks += len as u64;
                    prog.mid_instr += ins;
                }
                prog.nends += 1;
                (r, len, ins) = (start, 1, i);
            } else {
                let e = bl.edge(node, n)?;
                if prog.nends == 0 {
                    prog.add = prog.add.wrapping_add(e);
                    prog.blocks += 1;
                    prog.instr += i;
                } else {
                    r = r.wrapping_add(e);
                    len += 1;
                    ins += i;
                }
            }
            (node, addr) = (n, a);
        }
        prog.r_after = r;
        prog.blocks_after = len;
        prog.instr_after = ins;
        prog.last_node = node;
        prog.last_addr = addr;
        prog.last = *blocks.last().expect("a block");
        if prog.nends > 0 && fun.dense_len > 0 {
            prog.cbase = fun.dense_base.wrapping_add(prog.add);
        }
        self.pairs.ends.extend(ends);
        Some(())
    }
}
