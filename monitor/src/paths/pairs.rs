//! The sums recorder per event: a program per pair of ring runs that sums a run's edges once
//! (docs/paths-design.md, "The recorder at the tables' cost", build order step 2).
//!
//! A *run* is what one event stands for once a superblock's extent is known: a basic block, a
//! superblock run to its end, or a superblock left at a side exit (the side exit's id stands
//! for the blocks before it). The per-block step of a run's blocks (`recorder.rs`) depends on
//! the block before the run, on the shadow stack and on the blocks themselves. In the common
//! case each step continues an activation's path in its function, or is a plain call (into a
//! function entry a call has reached before) or a plain return (to the top frame's return
//! address, with a frame below), and then what the run does is fixed by the pair `(previous
//! run, run)` and the state it meets: the run splits into *pieces* at its calls and returns,
//! and each piece is a push, a pop or nothing, then a *segment* of steps in one function: a
//! sum added to the activation's register, blocks and instructions added to its path, and at
//! back edges inside it, paths ended (the first one's id is the register plus a constant, the
//! others are constants) and a new register. That is compiled once into a chain of
//! [`Program`]s, found through two slots per previous run (the tables' successor cache, keyed
//! the same way), a direct-mapped cache and a map behind them, and each piece is checked
//! before it is applied against what it assumed:
//! 1. its function's numbering, entries and nodes are as they were (a per-function epoch,
//!    bumped by a renumbering, by a new function entry at one of its blocks, and by one of its
//!    blocks being seen in another function);
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

use super::ids::{cache_slot, FxMap, NONE};
use super::numbering::EXIT_EDGE;
use super::recorder::PathRecorder;
use super::runs::{repeat_run_end, NextRun};
use super::stack::{cached_call_child, Activation, Resync, K_CALL, K_INDIRECT, K_OTHER, K_RET};
use super::trie::{START_ENTRY, START_HEAD};
use crate::Tables;

/// What a run does to the shadow stack and the top activation's path (see the module doc).
/// Laid out for the loop in registers: what a piece with no path end reads is the first
/// cache line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct Program {
    /// [`INTRA`], [`CALL`], [`RETURN`], [`TAIL`], [`FOREIGN`], or [`NEVER`] (the per-block
    /// step).
    kind: u8,
    /// It has folded activations (`nfolds > 0`; here, in the first cache line).
    folded: bool,
    /// Paths the segment ends; the second and later ones are `Pairs::ends[ends..ends + nends
    /// - 1]`, counted `Pairs::runs` times when settled, with their blocks and instructions
    /// summed in `mid_blocks` and `mid_instr`.
    nends: u32,
    /// Its function's epoch when compiled (`PathRecorder::fepoch`).
    epoch: u32,
    /// The next piece of the run ([`NONE`]: the last).
    next: u32,
    /// The function the run's path steps in, and the node its path must be at before the
    /// segment ([`INTRA`]: the top activation; [`RETURN`]: the caller returned to; [`CALL`]:
    /// the callee, at its first node).
    func: u32,
    from: u32,
    /// Blocks the segment adds to the current path (with ends: to the first ended path).
    blocks: u32,
    /// The node of the run's last block, and the block itself.
    last_node: u32,
    last: u32,
    /// Guest addresses of the run's blocks that follow an indirect jump: each must not be the
    /// stepping activation's return address (`Pairs::ind[ind..ind + nind]`).
    nind: u16,
    /// Added to the register: the segment's edges (with no path end), or the edges up to and
    /// including the first back edge's end (the first ended path's id is then the register
    /// plus it).
    add: u64,
    /// Guest instructions the segment adds to the current path (with ends: to the first
    /// ended path).
    instr: u64,
    /// The guest address of the run's last block.
    last_addr: u64,
    /// With ends: the register, the path's instructions and blocks after the last one.
    r_after: u64,
    instr_after: u64,
    /// Where the first ended path's count is, minus the register: the function's dense
    /// counters' base plus `add` (wrapping), or [`NO_DENSE`] when its counters are a map.
    cbase: u64,
    mid_blocks: u64,
    mid_instr: u64,
    /// [`CALL`]: the callee's return address and the register its first path starts with.
    /// [`RETURN`]: the address returned to (the top activation's return address), where the
    /// caller's path goes on with the return point's node `first_node` (`first_instr` guest
    /// instructions): `r0` is the value of the edge to it from node `from`, the caller's last
    /// node as last seen (callers reach one return point from blocks entered at different
    /// addresses, so that is a one-entry cache the piece updates, not a check).
    /// [`TAIL`], [`FOREIGN`]: the register the new activation's path starts with; for
    /// [`FOREIGN`], `ret` is the guest address jumped to. [`CALL`], [`TAIL`], [`FOREIGN`]:
    /// `first_instr` is the new activation's first block's guest instructions.
    ret: u64,
    r0: u64,
    first_instr: u64,
    /// Blocks and guest instructions of the folded activations (see `nfold_ends`).
    fold_blocks: u64,
    fold_instr: u64,
    blocks_after: u32,
    ends: u32,
    first_node: u32,
    /// Where this piece starts in the run (blocks).
    pos: u32,
    ind: u32,
    /// Calls the segment makes whose callees return inside it (*folded* activations, see
    /// [`PathRecorder::fold_call`]): the paths they end, `Pairs::ends[ends + nends - 1..]`
    /// (`nfold_ends` of them, after the segment's own), the functions they run with their
    /// epochs and counts (`Pairs::folds[folds..folds + nfolds]`), the blocks and guest
    /// instructions they execute (to the call tree's root), all counted `Pairs::runs` times
    /// when settled; `fold_depth`: the most frames they stack at once.
    nfold_ends: u32,
    folds: u32,
    nfolds: u32,
    fold_depth: u32,
    /// Tail calls the folded activations make (resynchronisations, counted as such).
    fold_tails: u32,
    /// [`TAIL`], [`FOREIGN`]: the function of the activation it replaces.
    tail_of: u32,
    /// [`FOREIGN`]: the index of the symbol containing the address jumped to (`ret`).
    foreign_sym: u32,
}

/// A function that a piece's folded activations run (`Program::folds`): its epoch when
/// compiled, and what each run of the piece adds to its activations and path ends.
#[derive(Clone, Copy, Debug)]
struct Fold {
    func: u32,
    epoch: u32,
    activations: u32,
    path_ends: u32,
}

/// How far a [`FoldAcc`] had got: what [`FoldAcc::truncate`] goes back to.
#[derive(Clone, Copy, Default)]
struct FoldMark {
    ends: usize,
    acts: usize,
    blocks: u64,
    instr: u64,
    depth: u32,
    tail_calls: u32,
}

/// The folded activations of the piece being compiled: the paths they end as `(function,
/// id)`, each activation as `(function, paths it ended)`, their blocks, guest instructions
/// and deepest nesting. Only appended to while compiling, so that a call that cannot be
/// folded after all is undone by [`FoldAcc::truncate`].
#[derive(Clone, Default)]
struct FoldAcc {
    ends: Vec<(u32, u64)>,
    acts: Vec<(u32, u32)>,
    blocks: u64,
    instr: u64,
    depth: u32,
    tail_calls: u32,
}

impl FoldAcc {
    fn clear(&mut self) {
        self.truncate(FoldMark::default());
    }

    fn mark(&self) -> FoldMark {
        FoldMark {
            ends: self.ends.len(),
            acts: self.acts.len(),
            blocks: self.blocks,
            instr: self.instr,
            depth: self.depth,
            tail_calls: self.tail_calls,
        }
    }

    fn truncate(&mut self, m: FoldMark) {
        self.ends.truncate(m.ends);
        self.acts.truncate(m.acts);
        (self.blocks, self.instr, self.depth) = (m.blocks, m.instr, m.depth);
        self.tail_calls = m.tail_calls;
    }
}

// What the register loop reads of a piece with no path end is in its first cache line.
const _: () = assert!(
    std::mem::offset_of!(Program, last_addr) + 8 <= 64
        && std::mem::offset_of!(Program, folded) < 64
        && std::mem::offset_of!(Program, nind) < 64
        && std::mem::size_of::<Program>() <= 192
);

/// The top activation's fields that [`PathRecorder::run_sums_loop`] keeps in registers
/// (its frame on the stack is stale meanwhile, and written back when the loop pushes a frame
/// above it or leaves).
#[derive(Clone, Copy)]
struct Top {
    func: u32,
    call_node: u32,
    return_to: u64,
    r: u64,
    len: u32,
    pinstr: u64,
    node: u32,
    addr: u64,
    blocks: u64,
    instrs: u64,
    path_ends: u64,
}

impl Top {
    #[inline(always)]
    fn load(a: &Activation) -> Top {
        Top {
            func: a.func,
            call_node: a.call_node,
            return_to: a.return_to,
            r: a.r,
            len: a.len,
            pinstr: a.path_instr,
            node: a.last_node,
            addr: a.last_addr,
            blocks: a.blocks,
            instrs: a.instructions,
            path_ends: a.path_ends,
        }
    }

    #[inline(always)]
    fn store(&self, a: &mut Activation) {
        (a.r, a.len, a.path_instr) = (self.r, self.len, self.pinstr);
        (a.last_node, a.last_addr) = (self.node, self.addr);
        (a.blocks, a.instructions, a.path_ends) = (self.blocks, self.instrs, self.path_ends);
    }
}

/// Program kinds: the run continues the top activation's path; its first block is a
/// callee's entry (the block before it calls); it returns to the frame below the top one
/// (the block before it returns), whose path it continues; the pair needs the per-block step
/// until the epoch changes.
const INTRA: u8 = 0;
const CALL: u8 = 1;
const RETURN: u8 = 2;
const NEVER: u8 = 3;
/// The run's first block is another function's entry that the top activation jumps to (a tail
/// call): the top activation ends and one of the entry's function takes its place.
const TAIL: u8 = 4;
/// The run's first block follows an indirect jump out of the top activation's function, into
/// a function no frame's activation is of and at no frame's return address (a foreign jump:
/// a PLT stub's jump into its library): the top activation is replaced, as for a tail call.
const FOREIGN: u8 = 5;

/// Runs the general way takes after the intra loop took fewer than two events (calls,
/// returns, new pairs: its start would be all it does).
const FAST_BACKOFF: u32 = 8;

/// A program epoch no function has (a chain to compile again).
const STALE: u32 = u32::MAX;

/// What [`PathRecorder::apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Applied {
    Yes,
    /// The program was compiled for other numbers or another state: compile it again.
    Stale,
    /// Its assumptions hold but this run needs the per-block step (a full stack, a call-tree
    /// child not cached, a block after an indirect jump that is the return address).
    Refused,
}

/// Slots of the direct-mapped pair cache, a power of two (12 bytes each: 192 KiB).
const PAIR_CACHE_SLOTS: usize = 1 << 14;

/// `Program::cbase` of a function whose counters are a map.
const NO_DENSE: u64 = u64::MAX;

/// A path a program ends after its first, or one a folded activation ends: its function, a
/// constant id, and its number.
#[derive(Clone, Copy, Debug)]
struct End {
    func: u32,
    id: u64,
    /// Its path number once a PAP run needed it ([`NONE`] before: interning it earlier would
    /// list a path that never ran).
    number: u32,
}

/// The pair programs of one recorder.
#[derive(Clone, Default)]
pub(crate) struct Pairs {
    /// Per previous run: the two runs that followed it most recently, with their programs
    /// (`(NONE, _)`: empty).
    slots: Vec<[(u32, u32); 2]>,
    /// Program by `(previous run, run)`, behind `slots`: a direct-mapped cache (a run
    /// followed by more than two others: a superblock's side exits, a dispatch loop), then a
    /// map.
    cache: Box<[(u32, u32, u32)]>,
    map: FxMap<(u32, u32), u32>,
    progs: Vec<Program>,
    ends: Vec<End>,
    folds: Vec<Fold>,
    ind: Vec<u64>,
    scratch: Scratch,
    /// Per program: runs whose second and later path ends are not yet counted, and the
    /// programs that have some.
    runs: Vec<u64>,
    dirty: Vec<u32>,
    /// The previous run ([`NONE`]: none yet).
    prev_run: u32,
    /// Runs to take the general way before [`PathRecorder::run_sums_loop`] is tried again.
    backoff: u32,
    /// Bumped when a [`NEVER`] program may compile now (any function's epoch changed).
    pub(crate) epoch: u32,
}

impl Pairs {
    pub(crate) fn new() -> Pairs {
        Pairs {
            prev_run: NONE,
            cache: vec![(NONE, NONE, NONE); PAIR_CACHE_SLOTS].into_boxed_slice(),
            ..Default::default()
        }
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
        let (cp, cr, p) = self.cache[cache_slot(prev, run, PAIR_CACHE_SLOTS)];
        if cp == prev && cr == run {
            return Some(p);
        }
        self.map.get(&(prev, run)).copied()
    }
}

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
                let j = self.run_sums_loop(events, i, tables);
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

    /// The common case with the top activation in registers: runs whose pair's program is a
    /// chain of pieces that continue the top activation's path, call (push an activation) and
    /// return (pop one), from `events[i]` on, while every piece's checks hold (see
    /// [`PathRecorder::apply`], which this loop does the same as). Returns the index of the
    /// first event it did not take: a run whose first piece fails its checks (stale or
    /// missing programs, tail calls, foreign jumps, PAP runs, a full stack) is left to the
    /// general way whole; one whose later piece fails is finished by it here.
    fn run_sums_loop(&mut self, events: &[u32], mut i: usize, tables: &Tables) -> usize {
        let Some(a) = self.stack.last() else {
            return i;
        };
        if self.config.k > 0 || self.prev == NONE || a.pap != NONE || !self.by_sums(a.func) {
            return i;
        }
        let mut top = Top::load(a);
        let mut depth = self.stack.len();
        let mut last = self.prev;
        let mut prev_run = self.pairs.prev_run;
        let pap_threshold = self.config.pap_threshold;
        while let Some(&e) = events.get(i) {
            let Some(info) = self.runs.events.get(e as usize) else {
                break;
            };
            let is_superblock = info.is_superblock;
            let (run, took) = if is_superblock {
                let Some(&next) = events.get(i + 1) else {
                    break;
                };
                match self.runs.events.get(next as usize) {
                    Some(n) if n.superblock == e => (next, 2),
                    _ => (e, 1),
                }
            } else {
                (e, 1)
            };
            let Some(first) = self.pairs.find(prev_run, run) else {
                break;
            };
            let mut p = first;
            let failed = loop {
                let prog = &self.pairs.progs[p as usize];
                let mut caller_node = None;
                if prog.kind == NEVER || self.fepoch[prog.func as usize] != prog.epoch {
                    break true;
                }
                match prog.kind {
                    INTRA => {
                        if top.func != prog.func
                            || top.node != prog.from
                            || (prog.nind > 0 && !self.ind_ok(prog, top.return_to))
                            || (prog.folded && self.folds_hold(prog, depth) != Applied::Yes)
                        {
                            break true;
                        }
                    }
                    CALL => {
                        let call_node = cached_call_child(
                            &self.calltree,
                            &self.call_cache,
                            top.call_node,
                            prog.func,
                        );
                        if call_node == NONE
                            || depth >= self.stack_cap()
                            || (prog.nind > 0 && !self.ind_ok(prog, prog.ret))
                            || (prog.folded && self.folds_hold(prog, depth + 1) != Applied::Yes)
                            || self.funcs[prog.func as usize].path_ends >= pap_threshold
                        {
                            break true;
                        }
                        // As `apply`: the callee's activation starts (with no PAP run).
                        self.funcs[prog.func as usize].activations += 1;
                        top.store(self.stack.last_mut().expect("an activation"));
                        self.stack.push(Activation::new(
                            prog.func,
                            prog.ret,
                            call_node,
                            NONE,
                            prog.last_addr,
                        ));
                        depth += 1;
                        top = Top {
                            func: prog.func,
                            call_node,
                            return_to: prog.ret,
                            r: prog.r0,
                            len: 1,
                            pinstr: prog.first_instr,
                            node: prog.from,
                            addr: prog.last_addr,
                            blocks: 0,
                            instrs: 0,
                            path_ends: 0,
                        };
                    }
                    RETURN => {
                        if depth < 2 || top.return_to != prog.ret {
                            break true;
                        }
                        let below = &self.stack[depth - 2];
                        if below.func != prog.func
                            || below.pap != NONE
                            || (prog.nind > 0 && !self.ind_ok(prog, below.return_to))
                            || (prog.folded && self.folds_hold(prog, depth - 1) != Applied::Yes)
                        {
                            break true;
                        }
                        let e = if below.last_node == prog.from {
                            prog.r0
                        } else {
                            // As `apply`: the piece's one-entry cache of the caller's last node.
                            let edge = (below.last_addr < prog.ret)
                                .then(|| {
                                    self.funcs[prog.func as usize]
                                        .bl
                                        .edge(below.last_node, prog.first_node)
                                })
                                .flatten();
                            let Some(e) = edge else {
                                break true;
                            };
                            caller_node = Some((below.last_node, e));
                            e
                        };
                        let fun = &mut self.funcs[top.func as usize];
                        if fun.spelled {
                            break true;
                        }
                        // As `pop_sums`: the top activation's path ends with it (its id is
                        // its sum), its counts go to its function and call-tree node.
                        if top.r < fun.dense_len {
                            self.dense[(fun.dense_base + top.r) as usize] += 1;
                        } else {
                            *fun.bl_counts.entry(top.r).or_insert(0) += 1;
                        }
                        fun.path_ends += top.path_ends + 1;
                        let node = &mut self.calltree[top.call_node as usize];
                        node.blocks += top.blocks + top.len as u64;
                        node.instructions += top.instrs + top.pinstr;
                        self.stack.pop();
                        depth -= 1;
                        top = Top::load(&self.stack[depth - 1]);
                        // The caller's path goes on with the return point.
                        top.r = top.r.wrapping_add(e);
                        top.len += 1;
                        top.pinstr += prog.first_instr;
                        top.node = prog.first_node;
                        top.addr = prog.ret;
                    }
                    _ => break true,
                }
                // The segment, as `apply_segment`.
                if prog.folded {
                    let runs = &mut self.pairs.runs[p as usize];
                    if *runs == 0 {
                        self.pairs.dirty.push(p);
                    }
                    *runs += 1;
                }
                if prog.nends == 0 {
                    top.r = top.r.wrapping_add(prog.add);
                    top.len += prog.blocks;
                    top.pinstr += prog.instr;
                } else {
                    let first_id = top.r.wrapping_add(prog.add);
                    if prog.cbase != NO_DENSE {
                        self.dense[top.r.wrapping_add(prog.cbase) as usize] += 1;
                    } else {
                        let fun = &mut self.funcs[top.func as usize];
                        if first_id < fun.dense_len {
                            self.dense[(fun.dense_base + first_id) as usize] += 1;
                        } else {
                            *fun.bl_counts.entry(first_id).or_insert(0) += 1;
                        }
                    }
                    top.blocks += (top.len + prog.blocks) as u64 + prog.mid_blocks;
                    top.instrs += top.pinstr + prog.instr + prog.mid_instr;
                    top.path_ends += prog.nends as u64;
                    (top.r, top.len, top.pinstr) =
                        (prog.r_after, prog.blocks_after, prog.instr_after);
                    if prog.nends > 1 && !prog.folded {
                        let runs = &mut self.pairs.runs[p as usize];
                        if *runs == 0 {
                            self.pairs.dirty.push(p);
                        }
                        *runs += 1;
                    }
                }
                (top.node, top.addr, last) = (prog.last_node, prog.last_addr, prog.last);
                let next = prog.next;
                if let Some((from, e)) = caller_node {
                    let prog = &mut self.pairs.progs[p as usize];
                    (prog.from, prog.r0) = (from, e);
                }
                if next == NONE {
                    break false;
                }
                p = next;
            };
            if failed {
                if p == first {
                    // Nothing of the run is applied: the general way takes it.
                    break;
                }
                // The pieces before `p` stand; the general way finishes the run from `p`.
                top.store(self.stack.last_mut().expect("an activation"));
                self.prev = last;
                self.pairs.prev_run = run;
                self.finish_run(run, first, p, tables);
                return i + took;
            }
            i += took;
            let prog = &self.pairs.progs[first as usize];
            if prev_run == run
                && took == 1
                && prog.kind == INTRA
                && prog.next == NONE
                && prog.from == prog.last_node
            {
                // A loop whose body is this run: the same program again from the same state,
                // as often as the event repeats, counted at once (and by the tables too:
                // `Tables::record_with_repeats`).
                let next = repeat_run_end(events, i, e, is_superblock);
                let k = (next - i) as u64;
                if k > 0 {
                    self.runs.repeats.push((i as u32, next as u32));
                    if prog.folded {
                        self.pairs.runs[first as usize] += k;
                    }
                    if prog.nends == 0 {
                        top.r = top.r.wrapping_add(prog.add.wrapping_mul(k));
                        top.len += prog.blocks * k as u32;
                        top.pinstr += prog.instr * k;
                    } else {
                        let first_id = top.r.wrapping_add(prog.add);
                        if prog.cbase != NO_DENSE {
                            self.dense[top.r.wrapping_add(prog.cbase) as usize] += k;
                        } else {
                            let fun = &mut self.funcs[top.func as usize];
                            if first_id < fun.dense_len {
                                self.dense[(fun.dense_base + first_id) as usize] += k;
                            } else {
                                *fun.bl_counts.entry(first_id).or_insert(0) += k;
                            }
                        }
                        top.blocks += k * ((top.len + prog.blocks) as u64 + prog.mid_blocks);
                        top.instrs += k * (top.pinstr + prog.instr + prog.mid_instr);
                        top.path_ends += k * prog.nends as u64;
                        if prog.nends > 1 && !prog.folded {
                            let runs = &mut self.pairs.runs[first as usize];
                            if *runs == 0 {
                                self.pairs.dirty.push(first);
                            }
                            *runs += k;
                        }
                    }
                    i = next;
                }
            }
            prev_run = run;
        }
        top.store(self.stack.last_mut().expect("an activation"));
        self.prev = last;
        self.pairs.prev_run = prev_run;
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
        let prev = std::mem::replace(&mut self.pairs.prev_run, run);
        let mut from = 0;
        if prev != NONE {
            let found = self.pairs.find(prev, run);
            let applied = match found {
                Some(p) => self.apply_chain(p, p),
                None => Err((Applied::Stale, 0)),
            };
            match applied {
                Ok(()) => return,
                Err((Applied::Stale, 0)) => {
                    let mut scratch = std::mem::take(&mut self.pairs.scratch);
                    self.compile(run, &mut scratch);
                    let p = self.store_pair(prev, run, &mut scratch.chain);
                    self.pairs.scratch = scratch;
                    match self.apply_chain(p, p) {
                        Ok(()) => return,
                        Err((_, pos)) => from = pos,
                    }
                }
                Err((_, pos)) => from = pos,
            }
        }
        self.step_run_from(run, from, tables);
    }

    /// Finishes run `run` the general way from piece `p` of its chain (which starts at piece
    /// `first`), the pieces before `p` applied.
    #[cold]
    fn finish_run(&mut self, run: u32, first: u32, p: u32, tables: &Tables) {
        if let Err((_, pos)) = self.apply_chain(first, p) {
            self.step_run_from(run, pos, tables);
        }
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

    /// Applies the chain of pieces that starts at program `first`, from its piece `start` on
    /// (the ones before applied); on a piece that fails its checks, what it found and the
    /// position in the run where the per-block step must take over. A later piece found
    /// stale makes the chain's first piece stale too, so that the pair is compiled again next
    /// time.
    #[inline]
    fn apply_chain(&mut self, first: u32, start: u32) -> Result<(), (Applied, u32)> {
        // Out of `self` while they are applied, so that a piece is read in place (a copy of
        // one was a `memcpy` whose stores the next load waited for).
        let mut progs = std::mem::take(&mut self.pairs.progs);
        let mut p = start;
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

    /// Keeps the chain of pieces `chain` as pair `(prev, run)`'s program (over the stale one,
    /// whose runs are settled first, where it has as many pieces), in its slots. Returns its
    /// first piece.
    fn store_pair(&mut self, prev: u32, run: u32, chain: &mut [Program]) -> u32 {
        let old = self.pairs.map.get(&(prev, run)).copied();
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
                self.pairs.map.insert((prev, run), p);
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
        self.pairs.cache[cache_slot(prev, run, PAIR_CACHE_SLOTS)] = (prev, run, first);
        let slots = &mut self.pairs.slots;
        if slots.len() <= prev as usize {
            slots.resize(prev as usize + 1, [(NONE, NONE); 2]);
        }
        let s = &mut slots[prev as usize];
        if s[0].0 != run {
            s[1] = s[0];
            s[0] = (run, first);
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
            for k in prog.folds..prog.folds + prog.nfolds {
                let f = self.pairs.folds[k as usize];
                let fun = &mut self.funcs[f.func as usize];
                fun.activations += n * f.activations as u64;
                fun.path_ends += n * f.path_ends as u64;
            }
            // Folding is for a recorder without a call tree: every activation is the root's.
            let root = &mut self.calltree[0];
            root.blocks += n * prog.fold_blocks;
            root.instructions += n * prog.fold_instr;
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
                let parent = top.call_node;
                let call_node = self.cached_call_child(parent, prog.func);
                if call_node == NONE || depth >= self.stack_cap() || !self.ind_ok(prog, prog.ret) {
                    return Applied::Refused;
                }
                match self.folds_hold(prog, depth + 1) {
                    Applied::Yes => {}
                    a => return a,
                }
                let pap = self.start_activation(prog.func);
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
                self.pop_activation();
                let top = self.stack.last_mut().expect("the caller");
                top.r = top.r.wrapping_add(e);
                top.len += 1;
                top.path_instr += prog.first_instr;
                top.last_node = prog.first_node;
                top.last_addr = prog.ret;
            }
        }
        self.prev = prog.last;
        self.apply_segment(p, prog);
        Applied::Yes
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

    /// The chain of pieces of run `run` after the block `self.prev` in the current state: one
    /// [`NEVER`] piece if the per-block step would do anything but plain calls, plain returns
    /// and steps of an activation's path with nodes and edges its function's numbering has.
    fn compile(&mut self, run: u32, scratch: &mut Scratch) {
        let ind = self.pairs.ind.len();
        let ends = self.pairs.ends.len();
        scratch.blocks.clear();
        scratch.sim.clear();
        scratch.chain.clear();
        let folds = self.pairs.folds.len();
        if self.compile_pieces(run, scratch).is_none() {
            self.pairs.ind.truncate(ind);
            self.pairs.ends.truncate(ends);
            self.pairs.folds.truncate(folds);
            scratch.chain.clear();
            scratch.chain.push(Program {
                epoch: self.pairs.epoch,
                kind: NEVER,
                ..Program::empty()
            });
        }
    }

    /// [`PathRecorder::compile`]'s work: `None` where the per-block step is needed. The
    /// shadow stack is simulated: frames pushed inside the run, over the real stack's.
    fn compile_pieces(&mut self, run: u32, scratch: &mut Scratch) -> Option<()> {
        if self.prev == NONE || self.config.k > 0 || self.stack.is_empty() {
            return None;
        }
        let info = self.runs.events[run as usize];
        scratch.blocks.extend_from_slice(
            &self.runs.seq[info.start as usize..(info.start + info.len) as usize],
        );
        let Scratch {
            blocks,
            sim,
            chain,
            fold,
        } = scratch;
        // A call whose callee returns inside the run is folded into the caller's piece where
        // nothing but the path counts needs its activation: no call tree, PAP runs or k-paths.
        let can_fold = !self.config.call_tree && self.config.pap_threshold == u64::MAX;
        let blocks = &blocks[..];
        // The simulated stack: the real frames below `real` as they are, then copies of the
        // others as the run changes them, and the frames it pushes.
        let mut real = self.stack.len() - 1;
        let frame_of = |a: &Activation| SimFrame {
            func: a.func,
            node: a.last_node,
            addr: a.last_addr,
            return_to: a.return_to,
        };
        sim.push(frame_of(&self.stack[real]));
        let mut before = self.prev;
        let mut k = 0;
        while k < blocks.len() {
            let b = blocks[k];
            let addr = self.id_addr[b as usize];
            let mut prog = Program {
                pos: k as u32,
                ind: self.pairs.ind.len() as u32,
                ends: self.pairs.ends.len() as u32,
                ..Program::empty()
            };
            let seg_start = match self.id_kind[before as usize] {
                // Only the run's first block follows a block that neither calls nor returns
                // and starts a piece.
                K_OTHER | K_INDIRECT
                    if matches!(self.id_entry.get(b as usize), Some(&e)
                        if e != NONE && e != sim.last().expect("a frame").func) =>
                {
                    // A tail call: the top frame's activation is replaced.
                    let (f, r0, n, _) = self.fold_start(b)?;
                    let top = sim.last_mut().expect("a frame");
                    prog.kind = TAIL;
                    prog.tail_of = top.func;
                    prog.r0 = r0;
                    prog.first_instr = self.funcs[f as usize].node_instr[n as usize] as u64;
                    (top.func, top.node, top.addr) = (f, n, addr);
                    k + 1
                }
                K_INDIRECT if self.node_in(sim.last().expect("a frame").func, b).is_none() => {
                    // Out of the top frame's function: a foreign jump, if that is what the
                    // per-block step would find (the rest is checked when applied).
                    let top = sim.last_mut().expect("a frame");
                    let sym = self.symbol_at(addr)?;
                    let entry = self.config.symbols[sym].addr;
                    let f = self.func_by_entry.get(&entry).copied()?;
                    if addr == top.return_to || self.owns(top.func, addr) || !self.by_sums(f) {
                        return None;
                    }
                    let n = self.node_in(f, b)?;
                    let tag = if n == 0 { START_ENTRY } else { START_HEAD };
                    prog.kind = FOREIGN;
                    prog.tail_of = top.func;
                    prog.r0 = self.funcs[f as usize].bl.start(tag, n)?;
                    prog.first_instr = self.funcs[f as usize].node_instr[n as usize] as u64;
                    (prog.ret, prog.foreign_sym) = (addr, sym as u32);
                    (top.func, top.node, top.addr) = (f, n, addr);
                    k + 1
                }
                K_OTHER | K_INDIRECT => {
                    prog.kind = INTRA;
                    k
                }
                K_CALL if addr != self.id_ret[before as usize] => {
                    let f = self.id_entry.get(b as usize).copied()?;
                    if f == NONE || !self.by_sums(f) {
                        return None;
                    }
                    let n = self.node_in(f, b)?;
                    prog.kind = CALL;
                    prog.ret = self.id_ret[before as usize];
                    let tag = if n == 0 { START_ENTRY } else { START_HEAD };
                    prog.r0 = self.funcs[f as usize].bl.start(tag, n)?;
                    prog.first_instr = self.funcs[f as usize].node_instr[n as usize] as u64;
                    sim.push(SimFrame {
                        func: f,
                        node: n,
                        addr,
                        return_to: prog.ret,
                    });
                    k + 1
                }
                K_RET if sim.last().map(|f| f.return_to) == Some(addr) => {
                    sim.pop();
                    if sim.is_empty() {
                        if real == 0 {
                            return None;
                        }
                        real -= 1;
                        sim.push(frame_of(&self.stack[real]));
                    }
                    // The caller's path goes on with the return point: a forward edge from
                    // the caller's last block.
                    let caller = sim.last_mut().expect("a frame");
                    let g = caller.func;
                    let n = self.node_in(g, b)?;
                    if addr <= caller.addr || !self.by_sums(g) {
                        return None;
                    }
                    let fun = &self.funcs[g as usize];
                    prog.kind = RETURN;
                    prog.ret = addr;
                    prog.from = caller.node;
                    prog.r0 = fun.bl.edge(caller.node, n)?;
                    prog.first_node = n;
                    prog.first_instr = fun.node_instr[n as usize] as u64;
                    (caller.node, caller.addr) = (n, addr);
                    k + 1
                }
                _ => return None,
            };
            let mut frame = *sim.last().expect("a frame");
            if !self.by_sums(frame.func) {
                return None;
            }
            prog.func = frame.func;
            if prog.kind != RETURN {
                prog.from = frame.node;
            }
            prog.epoch = self.fepoch[frame.func as usize];
            prog.last = b;
            prog.last_node = frame.node;
            prog.last_addr = frame.addr;
            // The segment: up to the first block after a call or a return, calls whose
            // callees return inside the run folded in.
            let mut end = seg_start;
            fold.clear();
            while end < blocks.len() {
                let c = blocks[end];
                let prior = if end == 0 { self.prev } else { blocks[end - 1] };
                let kind = self.id_kind[prior as usize];
                if end > k && kind == K_CALL && can_fold {
                    let mark = fold.mark();
                    match self.fold_call(blocks, end, &frame, fold, 1) {
                        Some(m) => {
                            // The return point: a forward edge of the caller (checked).
                            self.compile_step(&mut prog, &mut frame, blocks[m])
                                .expect("fold_call checked the return point's edge");
                            prog.last = blocks[m];
                            end = m + 1;
                            continue;
                        }
                        None => fold.truncate(mark),
                    }
                }
                if end > k && (kind == K_CALL || kind == K_RET) {
                    break;
                }
                if end > k
                    && kind != K_RET
                    && matches!(self.id_entry.get(c as usize), Some(&e) if e != NONE && e != frame.func)
                {
                    // A tail call starts the next piece.
                    break;
                }
                if kind == K_INDIRECT {
                    if end > k && self.node_in(frame.func, c).is_none() {
                        // Out of the function: the next piece (a foreign jump, or nothing).
                        break;
                    }
                    // A step of the path only into a block of its own function.
                    self.node_in(frame.func, c)?;
                    self.pairs.ind.push(self.id_addr[c as usize]);
                    prog.nind += 1;
                }
                if kind != K_RET {
                    // A step of the path, unless the block is another function's entry (a
                    // tail call); a return's first block is not tested, as in its step.
                    let entry = self.id_entry.get(c as usize).copied()?;
                    if entry != NONE && entry != frame.func {
                        return None;
                    }
                }
                self.compile_step(&mut prog, &mut frame, c)?;
                prog.last = c;
                end += 1;
            }
            let fun = &self.funcs[frame.func as usize];
            if prog.nends > 0 && fun.dense_len > 0 {
                prog.cbase = fun.dense_base.wrapping_add(prog.add);
            }
            if !fold.acts.is_empty() {
                self.keep_folds(&mut prog, fold);
            }
            *sim.last_mut().expect("a frame") = frame;
            chain.push(prog);
            before = blocks[end - 1];
            k = end;
        }
        Some(())
    }

    /// Records the folded activations `fold` as piece `prog`'s (after its own path ends).
    fn keep_folds(&mut self, prog: &mut Program, fold: &FoldAcc) {
        prog.nfold_ends = fold.ends.len() as u32;
        self.pairs
            .ends
            .extend(fold.ends.iter().map(|&(func, id)| End {
                func,
                id,
                number: NONE,
            }));
        prog.folds = self.pairs.folds.len() as u32;
        let first = self.pairs.folds.len();
        for &(func, path_ends) in &fold.acts {
            match self.pairs.folds[first..]
                .iter_mut()
                .find(|f| f.func == func)
            {
                Some(f) => {
                    f.activations += 1;
                    f.path_ends += path_ends;
                }
                None => self.pairs.folds.push(Fold {
                    func,
                    epoch: self.fepoch[func as usize],
                    activations: 1,
                    path_ends,
                }),
            }
        }
        prog.nfolds = (self.pairs.folds.len() - first) as u32;
        prog.folded = prog.nfolds > 0;
        prog.fold_depth = fold.depth;
        prog.fold_blocks = fold.blocks;
        prog.fold_instr = fold.instr;
        prog.fold_tails = fold.tail_calls;
    }

    /// Folds the activation that `blocks[at]` starts (the block before it calls) into the
    /// piece whose frame is `caller`, if it returns inside the run and is a plain activation
    /// throughout: it is entered at a function entry a call has reached, its steps are its
    /// function's numbered edges (its calls folded the same way, `depth` frames above the
    /// caller's), and it returns to its return address, where the caller's path goes on with
    /// a numbered forward edge. What it does is then the same at every run of the piece: the
    /// paths it ends, one activation, its blocks and instructions, added to `acc`. Returns the
    /// position of the return point in `blocks`; `None` where the per-block step would do
    /// anything else (`acc` may then hold part of the activation: the caller truncates it).
    fn fold_call(
        &self,
        blocks: &[u32],
        at: usize,
        caller: &SimFrame,
        acc: &mut FoldAcc,
        depth: u32,
    ) -> Option<usize> {
        let ret = self.id_ret[blocks[at - 1] as usize];
        if self.id_addr[blocks[at] as usize] == ret {
            return None;
        }
        // The function stepped, its path's sum, node, address and the paths it ended.
        let (mut f, mut r, mut node, mut addr) = self.fold_start(blocks[at])?;
        let mut ends = 0u32;
        acc.depth = acc.depth.max(depth);
        acc.blocks += 1;
        acc.instr += self.funcs[f as usize].node_instr[node as usize] as u64;
        let mut j = at + 1;
        while j < blocks.len() {
            let c = blocks[j];
            let a = self.id_addr[c as usize];
            let bl = &self.funcs[f as usize].bl;
            match self.id_kind[blocks[j - 1] as usize] {
                K_RET => {
                    // A plain return (anything else resynchronises): the activation's last
                    // path ends with it, its id its sum.
                    if a != ret {
                        return None;
                    }
                    acc.ends.push((f, r));
                    acc.acts.push((f, ends + 1));
                    let h = caller.func;
                    let rn = self.node_in(h, c)?;
                    if a <= caller.addr || !self.by_sums(h) {
                        return None;
                    }
                    self.funcs[h as usize].bl.edge(caller.node, rn)?;
                    return Some(j);
                }
                K_CALL => {
                    let me = SimFrame {
                        func: f,
                        node,
                        addr,
                        return_to: ret,
                    };
                    let m = self.fold_call(blocks, j, &me, acc, depth + 1)?;
                    let rn = self
                        .node_in(f, blocks[m])
                        .expect("checked by the inner fold");
                    r = r.wrapping_add(bl.edge(node, rn).expect("checked by the inner fold"));
                    (node, addr) = (rn, self.id_addr[blocks[m] as usize]);
                    acc.blocks += 1;
                    acc.instr += self.funcs[f as usize].node_instr[rn as usize] as u64;
                    j = m + 1;
                    continue;
                }
                kind => {
                    let entry = self.id_entry.get(c as usize).copied()?;
                    if entry != NONE && entry != f {
                        // A jump to another function's entry: a tail call, which ends this
                        // activation and starts one of `entry` that returns where it would.
                        acc.ends.push((f, r));
                        acc.acts.push((f, ends + 1));
                        acc.tail_calls += 1;
                        ends = 0;
                        (f, r, node, addr) = self.fold_start(c)?;
                        if f != entry {
                            return None;
                        }
                        acc.blocks += 1;
                        acc.instr += self.funcs[f as usize].node_instr[node as usize] as u64;
                        j += 1;
                        continue;
                    }
                    // An indirect jump to the return address would return; one to another
                    // function's block, resynchronise.
                    let cn = self.node_in(f, c)?;
                    if kind == K_INDIRECT && a == ret {
                        return None;
                    }
                    if a <= addr {
                        // A back edge ends a path.
                        let e = bl.edge(node, EXIT_EDGE | cn)?;
                        acc.ends.push((f, r.wrapping_add(e)));
                        ends += 1;
                        r = bl.start(START_HEAD, cn)?;
                    } else {
                        r = r.wrapping_add(bl.edge(node, cn)?);
                    }
                    (node, addr) = (cn, a);
                    acc.blocks += 1;
                    acc.instr += self.funcs[f as usize].node_instr[cn as usize] as u64;
                }
            }
            j += 1;
        }
        // The run ends inside the callee.
        None
    }

    /// How an activation that block `b` starts begins, if `b` is a function entry whose
    /// activations keep sums and whose start is numbered: the function, the register, the
    /// node and the address.
    fn fold_start(&self, b: u32) -> Option<(u32, u64, u32, u64)> {
        let f = self.id_entry.get(b as usize).copied()?;
        if f == NONE || !self.by_sums(f) {
            return None;
        }
        let n = self.node_in(f, b)?;
        let tag = if n == 0 { START_ENTRY } else { START_HEAD };
        let r = self.funcs[f as usize].bl.start(tag, n)?;
        Some((f, r, n, self.id_addr[b as usize]))
    }

    /// Adds block `c`'s step to piece `prog`'s segment on frame `frame` (its function, node
    /// and address before and after): `None` if its node, edge or end is not numbered.
    fn compile_step(&mut self, prog: &mut Program, frame: &mut SimFrame, c: u32) -> Option<()> {
        let fun = &self.funcs[frame.func as usize];
        let bl = &fun.bl;
        let n = self.node_in(frame.func, c)?;
        let a = self.id_addr[c as usize];
        let i = fun.node_instr[n as usize] as u64;
        if a <= frame.addr {
            let end = bl.edge(frame.node, EXIT_EDGE | n)?;
            let start = bl.start(START_HEAD, n)?;
            if prog.nends == 0 {
                prog.add = prog.add.wrapping_add(end);
            } else {
                self.pairs.ends.push(End {
                    func: frame.func,
                    id: prog.r_after.wrapping_add(end),
                    number: NONE,
                });
                prog.mid_blocks += prog.blocks_after as u64;
                prog.mid_instr += prog.instr_after;
            }
            prog.nends += 1;
            (prog.r_after, prog.blocks_after, prog.instr_after) = (start, 1, i);
        } else {
            let e = bl.edge(frame.node, n)?;
            if prog.nends == 0 {
                prog.add = prog.add.wrapping_add(e);
                prog.blocks += 1;
                prog.instr += i;
            } else {
                prog.r_after = prog.r_after.wrapping_add(e);
                prog.blocks_after += 1;
                prog.instr_after += i;
            }
        }
        (frame.node, frame.addr) = (n, a);
        prog.last_node = n;
        prog.last_addr = a;
        Some(())
    }
}

/// Buffers compiling a run uses: its blocks, the simulated stack, the pieces made.
#[derive(Clone, Default)]
pub(crate) struct Scratch {
    blocks: Vec<u32>,
    sim: Vec<SimFrame>,
    chain: Vec<Program>,
    fold: FoldAcc,
}

/// A frame of the shadow stack as compiling a run sees it.
#[derive(Clone, Copy, Debug)]
struct SimFrame {
    func: u32,
    node: u32,
    addr: u64,
    return_to: u64,
}

impl Program {
    /// A piece that does nothing yet.
    fn empty() -> Program {
        Program {
            epoch: 0,
            next: NONE,
            pos: 0,
            kind: NEVER,
            func: NONE,
            from: NONE,
            ret: 0,
            r0: 0,
            first_node: NONE,
            first_instr: 0,
            ind: 0,
            nind: 0,
            folded: false,
            add: 0,
            blocks: 0,
            instr: 0,
            nends: 0,
            ends: 0,
            mid_blocks: 0,
            mid_instr: 0,
            cbase: NO_DENSE,
            r_after: 0,
            blocks_after: 0,
            instr_after: 0,
            last_node: NONE,
            last_addr: 0,
            last: NONE,
            nfold_ends: 0,
            folds: 0,
            nfolds: 0,
            fold_depth: 0,
            fold_blocks: 0,
            fold_instr: 0,
            fold_tails: 0,
            tail_of: NONE,
            foreign_sym: NONE,
        }
    }
}
