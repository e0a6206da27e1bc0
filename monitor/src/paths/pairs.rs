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
use super::stack::{K_INDIRECT, K_OTHER};
use super::trie::START_HEAD;
use crate::Tables;

/// What a run does to the top activation's path (see the module doc).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Program {
    /// `MemoState::epoch` when compiled.
    epoch: u32,
    /// The function the run steps in, and the node its path must be at before it.
    func: u32,
    from: u32,
    /// The run's first block where the block before it jumps indirectly (checked: rule 3),
    /// else [`NONE`].
    indirect_first: u32,
    /// Added to the register: the run's edges (with no path end), or the edges up to and
    /// including the first back edge's end (the first ended path's id is then the register
    /// plus it).
    add: u64,
    /// Blocks and guest instructions the run adds to the current path (with ends: to the
    /// first ended path).
    blocks: u32,
    instr: u64,
    /// Paths the run ends; the second and later ones are `Pairs::ends[ends..ends + nends -
    /// 1]`, counted `Pairs::runs` times when settled, with their blocks and instructions
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
            if let Some(p) = self.pairs.find(prev, run) {
                if self.apply(p) {
                    return;
                }
            }
            if let Some(prog) = self.compile(run) {
                let p = self.store_pair(prev, run, prog);
                if self.apply(p) {
                    return;
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

    /// Applies program `p` to the top activation if its assumptions hold (module doc).
    #[inline]
    fn apply(&mut self, p: u32) -> bool {
        let prog = self.pairs.progs[p as usize];
        let Some(top) = self.stack.last() else {
            return false;
        };
        if prog.epoch != self.memo.epoch
            || top.func != prog.func
            || top.last_node != prog.from
            || (prog.nends > 0 && top.pap != NONE)
            || (prog.indirect_first != NONE
                && (self.id_node[prog.indirect_first as usize].0 != prog.func
                    || self.id_addr[prog.indirect_first as usize] == top.return_to))
        {
            return false;
        }
        self.pairs.by_program += 1;
        self.prev = prog.last;
        if prog.nends == 0 {
            let top = self.stack.last_mut().expect("an activation");
            top.r = top.r.wrapping_add(prog.add);
            top.len += prog.blocks;
            top.path_instr += prog.instr;
            top.last_node = prog.last_node;
            top.last_addr = prog.last_addr;
            return true;
        }
        let top = self.stack.last_mut().expect("an activation");
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
        true
    }

    /// The program of run `run` after the block `self.prev`, if every step of its blocks would
    /// continue the top activation's path with nodes and edges its function's numbering has.
    fn compile(&mut self, run: u32) -> Option<Program> {
        let top = *self.stack.last()?;
        let func = top.func;
        if self.prev == NONE || self.config.k > 0 || !self.by_sums(func) {
            return None;
        }
        let info = self.memo.events[run as usize];
        let blocks = &self.memo.seq[info.start as usize..(info.start + info.len) as usize];
        let first = *blocks.first()?;
        let indirect_first = match self.id_kind[self.prev as usize] {
            K_OTHER => NONE,
            K_INDIRECT
                if self.id_node[first as usize].0 == func
                    && self.id_addr[first as usize] != top.return_to =>
            {
                first
            }
            _ => return None,
        };
        let fun = &self.funcs[func as usize];
        let bl = &fun.bl;
        let (mut node, mut addr) = (top.last_node, top.last_addr);
        let mut prog = Program {
            epoch: self.memo.epoch,
            func,
            from: node,
            indirect_first,
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
        // With ends: the register, blocks and instructions of the path since the last end.
        let (mut r, mut len, mut ins) = (0u64, 0u32, 0u64);
        let mut ends = Vec::new();
        for (k, &b) in blocks.iter().enumerate() {
            if k > 0 && self.id_kind[blocks[k - 1] as usize] != K_OTHER {
                return None;
            }
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
        Some(prog)
    }
}
