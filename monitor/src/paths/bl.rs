//! The Ball-Larus loop: the common case of the recorder with each activation's path kept as a
//! Ball-Larus register `r` instead of a trie node, so that a ring event costs a lookup keyed by
//! the event pair and an add, not a load that depends on the previous event's (#38;
//! docs/paths-design.md, "The recorder at the tables' cost").
//!
//! Source: the Ball-Larus lecture, steps 1–3 (a path's id is the sum of the values on its
//! edges; a back edge `u -> h` ends the path with `r + val(u -> exit)` and restarts `r` at
//! `val(entry -> h)`), with the numbering of `numbering.rs` (back edges by the address-order
//! rule, an exit edge after every block so that an activation may end anywhere).
//!
//! **Programs.** What a run of an event (a block, a whole superblock, or a superblock up to
//! its side exit) does after a given block is fixed: the edge from that block into the run's
//! first block and the run's own edges, each classified as the per-block step classifies it
//! (by the terminator of the block before, with the guest's calling contexts: a call pushes
//! an activation, a `ret` pops one, anything else goes on in the activation, the address order
//! telling back edges). So the pair (previous block, run) is compiled once into a short list of
//! [`Step`]s — a sum of forward increments, a path end and restart, a call, a return — and
//! kept in a two-slot cache per previous block (a map behind it). Programs are compiled
//! against the current numberings; a renumbering or a new function entry drops them all (an
//! epoch).
//!
//! **Frames.** While the loop runs, the activations it pushed or went on with are in
//! Ball-Larus form: `cur` is [`IN_BL`], and a parallel stack holds each one's register and its
//! last block's node; their `blocks` and `instructions` count everything the activation ran,
//! its current path included. Outside the loop every frame is in trie form, as the rest of
//! the recorder expects: when the loop stops, each Ball-Larus frame's current path is
//! regenerated from `(r, last node)` (a Ball-Larus prefix is unique per node) and walked into
//! the trie. So the numberings only change outside the loop: a program that meets an edge or
//! a block its function's numbering lacks stops the loop, and the function is numbered again
//! the next time the loop starts in it, after its counters are flushed.
//!
//! **Counts.** A path end adds one to its id's counter (a dense array per numbered function
//! of at most [`DENSE_PATHS`] paths, else a map); counters become the interned paths' counts
//! when the function is renumbered and when the profile is taken
//! ([`PathRecorder::settle_bl`]). An activation that records a PAP run needs its paths' numbers
//! in order: its path ends intern the id at once (a map per function). Calls and returns do
//! what `push_activation` and `pop_activation` do, with the same call-tree node, PAP decision
//! and counts. k-slab forests (`--k`) and instrumented functions are left to the other paths.

use hotpath_events::{is_context, is_id};

use super::fast::repeat_run_end;
use super::ids::{cache_slot, FxMap, NONE, SETTLED};
use super::memo::EventInfo;
use super::numbering::{NumberedEnd, NumberedPath, NumberedStart, Numbering};
use super::recorder::PathRecorder;
use super::stack::{cached_call_child, Activation, K_CALL, K_INSTRUMENTED, K_RET};
use super::trie::{END_EXIT, START_ENTRY, START_HEAD};
use crate::Tables;

/// A program key that names the previous block rather than the previous run.
const BLOCK_KEY: u32 = 1 << 31;

/// `Activation::cur` of a frame in Ball-Larus form (only while the loop runs).
pub(crate) const IN_BL: u32 = u32::MAX - 3;

/// Functions with at most this many paths count them in a dense array (8 bytes a path);
/// larger ones in a map.
const DENSE_PATHS: u64 = 4096;

/// Slots of the direct-mapped program cache, a power of two (12 bytes each: 768 KiB).
const WIDE_SLOTS: usize = 1 << 16;

/// Events the other paths take after the loop took none (it could not start, or stopped at
/// once), before it is tried again.
const BL_BACKOFF: u32 = 8;

/// What one step of a program does (see [`Step`]).
const OP_FWD: u8 = 0;
const OP_BACK: u8 = 1;
const OP_KONST: u8 = 2;
const OP_CALL: u8 = 3;
const OP_RET: u8 = 4;

/// One step of a program: an edge that changes the register other than by a sum (a back edge,
/// a call, a return), or the first edge of the run, followed by the forward edges after it.
#[derive(Clone, Copy, Debug)]
struct Step {
    op: u8,
    /// `OP_CALL`: the callee. `OP_RET`: the function the caller must be in ([`NONE`]: the
    /// program pushed it). Otherwise the function the step runs in.
    func: u32,
    /// `OP_BACK`: added to `r` to give the ended path's id. `OP_RET`: likewise, the callee's
    /// exit. `OP_CALL`: the callee's register at its entry block. `OP_KONST`: the first of
    /// its paths in `BlState::konst`.
    a: u64,
    /// Added to `r` after the step's own edge, for the forward edges that follow (`OP_BACK`:
    /// the restart value plus them; `OP_KONST`: the register's value after the step).
    b: u64,
    /// `OP_CALL`: the caller's increment on its edge from the call to the return point.
    ret_add: u64,
    /// `OP_CALL`: the caller's node of the return point ([`NONE`]: none yet; the return
    /// then stops the loop). `OP_RET`: the same, which the caller's frame must have.
    /// `OP_KONST`: the number of paths it ends.
    ret_node: u32,
    /// `OP_CALL`: the guest return address of the call.
    return_to: u64,
    /// Blocks and guest instructions the step enters (its edge's target and the forward edges'
    /// after it).
    blocks: u32,
    instr: u32,
    /// Position in the run of the block the step's edge enters.
    pos: u32,
    /// The last block the step enters (block id) and its node in the function after the step.
    last: u32,
    node: u32,
}

/// A compiled pair (previous block, run): `steps[start..start + len]`, valid while `epoch` is
/// the loop's and the top activation's function is `func`. `runs` counts its complete runs
/// not yet added to the counters of its constant paths (`OP_KONST`).
#[derive(Clone, Copy, Debug)]
struct Program {
    epoch: u32,
    func: u32,
    start: u32,
    len: u32,
    runs: u64,
    /// It has `OP_KONST` steps.
    konst: bool,
    /// It stays in one activation and leaves `r` at a constant, `r_end` (it ends a path):
    /// run again from `r_end` (an event that follows itself: a loop whose body is one event),
    /// it ends the same paths — `BlState::konst[rep..rep + nrep]` are those of its
    /// `OP_BACK` steps — and the same number of them, `ends`, each time.
    selfrep: bool,
    r_end: u64,
    rep: u32,
    nrep: u32,
    ends: u32,
    /// Blocks and guest instructions of a run.
    blocks: u32,
    instr: u32,
}

/// What a program does, as the loop's fast path reads it (one half cache line): an intra-
/// procedural program either adds to `r` (`HOT_ADD`) or ends one path whose id is `r + add`
/// and leaves `r` at `r_after` (`HOT_END`; the paths its later back edges end are constant,
/// counted with its runs when `konst`); anything else (`HOT_STEPS`) runs its steps.
#[derive(Clone, Copy, Debug)]
struct Hot {
    epoch: u32,
    func: u32,
    add: u64,
    r_after: u64,
    kind: u8,
    konst: bool,
    selfrep: bool,
    blocks: u16,
    instr: u32,
    ends: u32,
    last: u32,
    node: u32,
    /// `blocks << 32 | ends`, as the fast loop adds them.
    be: u64,
}

const NO_HOT: Hot = Hot {
    epoch: NONE,
    func: NONE,
    add: 0,
    r_after: 0,
    kind: HOT_STEPS,
    konst: false,
    selfrep: false,
    blocks: 0,
    instr: 0,
    ends: 0,
    last: NONE,
    node: NONE,
    be: 0,
};

/// A program slot: the run it follows with, the program, and its hot view (so that the fast
/// path reads one slot, not a slot and then the program).
#[derive(Clone, Copy, Debug)]
struct Slot {
    run: u32,
    p: u32,
    hot: Hot,
}

const NO_SLOT: Slot = Slot {
    run: NONE,
    p: NONE,
    hot: NO_HOT,
};

const HOT_ADD: u8 = 0;
const HOT_END: u8 = 1;
const HOT_STEPS: u8 = 2;
/// A call (`[FWD?, CALL]`) or a return out of the program (`[FWD?, RET]`): taken in the
/// general loop without the steps' dispatch.
const HOT_CALL: u8 = 3;
const HOT_RET: u8 = 4;

/// An activation in Ball-Larus form: its register, its last block's node, and, while it
/// calls, the node of the return point and the increment of the edge there.
#[derive(Clone, Copy, Debug)]
struct Frame {
    r: u64,
    node: u32,
    ret_node: u32,
    ret_add: u64,
}

const NO_FRAME: Frame = Frame {
    r: 0,
    node: NONE,
    ret_node: NONE,
    ret_add: 0,
};

/// A numbered function as the loop uses it.
#[derive(Clone, Debug)]
struct BlFunc {
    numbering: Numbering,
    /// Forward edge `(from, to)` → increment.
    fwd: FxMap<(u32, u32), u64>,
    /// Back edge `(from, to)` → (end increment, restart value).
    back: FxMap<(u32, u32), (u64, u64)>,
    /// Back-edge head → the register's value at it after the back edge.
    head: FxMap<u32, u64>,
    /// Dense counters: `BlState::counts[base..base + num_paths]`, or [`NONE`]: `sparse`.
    base: u32,
    sparse: FxMap<u64, u64>,
    /// Interned path numbers of ids (for PAP runs): by id for a function with dense counters
    /// ([`NONE`]: not interned yet), else in `sparse_numbers`.
    numbers: Vec<u32>,
    sparse_numbers: FxMap<u64, u32>,
    /// An edge or block was met that this numbering lacks: number again before use.
    stale: bool,
}

/// Per function: not numbered yet, numbered, or not numberable (more than 2^64 paths).
#[derive(Clone, Debug)]
enum Numbered {
    No,
    Yes(Box<BlFunc>),
    Never,
}

/// The loop's state.
#[derive(Clone)]
pub(crate) struct BlState {
    funcs: Vec<Numbered>,
    counts: Vec<u64>,
    /// Bumped when programs may no longer be trusted: a numbering changed, a function entry
    /// appeared at a block already seen.
    epoch: u32,
    /// Per previous run (event id): two (run, program) slots.
    slots: Vec<[Slot; 2]>,
    /// The run before the next one, or [`NONE`] when the loop has just started (programs
    /// are then found by the previous block, `BLOCK_KEY | prev`, in `more`). Keying by runs,
    /// which the ring gives, keeps the lookup off the chain of loads from one event to the
    /// next (the previous block would come from the last program's step).
    prev_run: u32,
    more: FxMap<(u32, u32), u32>,
    /// Direct-mapped cache in front of `more`: `(previous run, run, program)` (a dispatch
    /// loop's indirect jump has more successors than two slots).
    wide: Box<[(u32, u32, u32)]>,
    programs: Vec<Program>,
    /// By program: what the fast path reads.
    hot: Vec<Hot>,
    steps: Vec<Step>,
    /// Per trie node: `(numbering epoch, r)` of the prefix it stands for.
    trie_r: Vec<(u32, u64)>,
    /// Per function: the epoch its numbering was made in.
    numbered_at: Vec<u32>,
    /// Ball-Larus form of the frames `stack[low..]`, by stack index.
    frames: Vec<Frame>,
    /// Paths of `OP_KONST` steps: `(function, id)`.
    konst: Vec<(u32, u64)>,
    /// Programs whose `runs` are not zero.
    dirty: Vec<u32>,
    low: usize,
    backoff: u32,
    /// The loop is on (paths with the guest's contexts, no k-slab forest, no instrumentation,
    /// not the per-block reference).
    pub(crate) enabled: bool,
}

impl Default for BlState {
    fn default() -> Self {
        BlState {
            funcs: Vec::new(),
            counts: Vec::new(),
            epoch: 0,
            slots: Vec::new(),
            prev_run: NONE,
            more: FxMap::default(),
            wide: vec![(NONE, NONE, NONE); WIDE_SLOTS].into_boxed_slice(),
            programs: Vec::new(),
            hot: Vec::new(),
            steps: Vec::new(),
            trie_r: Vec::new(),
            numbered_at: Vec::new(),
            frames: Vec::new(),
            konst: Vec::new(),
            dirty: Vec::new(),
            low: usize::MAX,
            backoff: 0,
            enabled: false,
        }
    }
}

impl BlState {
    /// A loop with nothing numbered yet, on if `enabled`.
    pub(crate) fn new(enabled: bool) -> BlState {
        BlState {
            enabled,
            ..Default::default()
        }
    }

    /// No program made so far may be used again.
    pub(crate) fn invalidate(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
    }

    /// Function `f`'s numbering, if current.
    fn func(&self, f: u32) -> Option<&BlFunc> {
        self.numbered(f).filter(|b| !b.stale)
    }

    /// Function `f`'s numbering, current or stale (frames in Ball-Larus form and counters
    /// are under it until it is numbered again).
    fn numbered(&self, f: u32) -> Option<&BlFunc> {
        match self.funcs.get(f as usize) {
            Some(Numbered::Yes(b)) => Some(b),
            _ => None,
        }
    }

    /// Counts one run of path `id` of function `f`.
    #[inline]
    fn count(&mut self, f: u32, id: u64) {
        let Some(Numbered::Yes(b)) = self.funcs.get_mut(f as usize) else {
            unreachable!("a path end in a numbered function");
        };
        if b.base != NONE {
            self.counts[b.base as usize + id as usize] += 1;
        } else {
            *b.sparse.entry(id).or_insert(0) += 1;
        }
    }
}

/// Why the loop did not take a step: it stops there.
struct Stop;

impl PathRecorder {
    /// The Ball-Larus loop from `events[i]` on (module doc). Returns the index of the first
    /// event it did not take and, when it stopped inside an event, that event's id and the
    /// position to go on from. When it took every event (a superblock at the end waits in
    /// `memo.pending` for the next piece), its frames stay in Ball-Larus form for the next
    /// piece; otherwise every frame is in trie form again and `prev` is the last block it
    /// took, for the other paths to go on from.
    pub(crate) fn run_bl(
        &mut self,
        events: &[u32],
        mut i: usize,
        tables: &Tables,
    ) -> (usize, Option<(u32, u32)>) {
        let i0 = i;
        if !self.bl_active() {
            if self.bl.backoff > 0 {
                self.bl.backoff -= 1;
                return (i, None);
            }
            if !self.bl_enter() {
                self.bl.backoff = BL_BACKOFF;
                return (i, None);
            }
        }
        let (j, rest) = self.bl_loop(events, i, tables);
        i = j;
        if i == events.len() && rest.is_none() {
            return (i, None);
        }
        self.bl_leave();
        if i == i0 && rest.is_none() {
            self.bl.backoff = BL_BACKOFF;
        }
        (i, rest)
    }

    /// The loop from `events[i]` on, with the top activation's register, node and counts in
    /// locals (a step through memory would chain each event's `r` to the last one's store).
    /// Returns the index of the first event it did not take and, when it stopped inside a
    /// run, the run and the position of the block it stopped before. It took every event when
    /// the index is `events.len()` (a superblock at the end waits in `memo.pending`).
    #[inline(never)]
    // The last write-back zeroes counts nothing reads after it.
    #[allow(unused_assignments)]
    fn bl_loop(
        &mut self,
        events: &[u32],
        mut i: usize,
        tables: &Tables,
    ) -> (usize, Option<(u32, u32)>) {
        let mut n = self.stack.len() - 1;
        let (mut prev, mut prev_run) = (self.prev, self.bl.prev_run);
        // Programs made under another epoch are not used (compiling may change it).
        let mut epoch = self.bl.epoch;
        let (mut func, mut pap, mut base, mut r, mut node) = self.bl_regs(n);
        let (mut blocks, mut instr, mut ends) = (0u64, 0u64, 0u64);
        // Writes the registers back to the top frame.
        macro_rules! write_back {
            () => {{
                let f = &mut self.bl.frames[n];
                (f.r, f.node) = (r, node);
                let top = &mut self.stack[n];
                top.blocks += blocks;
                top.instructions += instr;
                top.path_ends += ends;
                (blocks, instr, ends) = (0, 0, 0);
                self.prev = prev;
                self.bl.prev_run = prev_run;
            }};
        }
        let mut rest = None;
        'events: while i < events.len() {
            if base != NONE {
                // The common case, in a small loop whose state fits in registers.
                let mut regs = FastRegs {
                    r,
                    prev_run,
                    last: (prev, node),
                    blocks_ends: 0,
                    instr: 0,
                };
                let j = bl_fast(
                    FastTables {
                        slots: &self.bl.slots,
                        wide: &self.bl.wide,
                        hot: &self.bl.hot,
                        infos: &self.memo.events,
                        counts: &mut self.bl.counts,
                        programs: &mut self.bl.programs,
                        dirty: &mut self.bl.dirty,
                    },
                    events,
                    i,
                    &mut regs,
                    epoch,
                    func,
                    base,
                );
                if j != i {
                    i = j;
                    (r, prev_run, (prev, node)) = (regs.r, regs.prev_run, regs.last);
                    blocks += regs.blocks_ends >> 32;
                    ends += regs.blocks_ends & 0xffff_ffff;
                    instr += regs.instr;
                    let Some(&e2) = events.get(i) else {
                        break;
                    };
                    let _ = e2;
                }
            }
            let e = events[i];
            if !is_id(e) {
                if is_context(e) {
                    break;
                }
                // A syscall event: nothing for paths.
                i += 1;
                continue;
            }
            let Some(&info) = self.memo.events.get(e as usize) else {
                break;
            };
            if info.len == 0 {
                break;
            }
            let (mut run, mut taken) = (e, 1);
            if info.is_superblock {
                let Some(&next) = events.get(i + 1) else {
                    // Its extent is the next piece's first event.
                    self.memo.pending = e;
                    i += 1;
                    break;
                };
                let exited = match self.memo.events.get(next as usize) {
                    Some(x) => x.superblock == e,
                    None if !is_id(next) => false,
                    None => break,
                };
                // Branch-free: whether a superblock left early is the guest's own branch.
                run = if exited { next } else { e };
                taken += exited as usize;
            }
            let mut p = NONE;
            let mut h = NO_HOT;
            if let Some(sl) = self.bl.slots.get(prev_run as usize) {
                let k = (sl[1].run == run) as usize;
                let x = &sl[k];
                if x.run == run && x.hot.epoch == epoch && x.hot.func == func {
                    (p, h) = (x.p, x.hot);
                }
            }
            if p == NONE {
                let (a, b, q) = self.bl.wide[cache_slot(prev_run, run, WIDE_SLOTS)];
                if a == prev_run && b == run {
                    let x = &self.bl.hot[q as usize];
                    if x.epoch == epoch && x.func == func {
                        (p, h) = (q, *x);
                    }
                }
            }
            if p != NONE {
                let fast = h.kind == HOT_ADD || (h.kind == HOT_END && base != NONE);
                if fast && !(run == prev_run && h.selfrep && r == h.r_after) {
                    if h.kind == HOT_ADD {
                        r = r.wrapping_add(h.add);
                    } else {
                        self.bl.counts[base as usize + r.wrapping_add(h.add) as usize] += 1;
                        r = h.r_after;
                        if h.konst {
                            let pr = &mut self.bl.programs[p as usize];
                            if pr.runs == 0 {
                                self.bl.dirty.push(p);
                            }
                            pr.runs += 1;
                        }
                    }
                    blocks += h.blocks as u64;
                    instr += h.instr as u64;
                    ends += h.ends as u64;
                    (prev, node, prev_run) = (h.last, h.node, run);
                    i += taken;
                    continue;
                }
            }
            let room = h.kind == HOT_RET || self.stack.len() < self.stack_cap();
            if p != NONE && h.kind >= HOT_CALL && room {
                let prog = self.bl.programs[p as usize];
                let st = self.bl.steps[(prog.start + prog.len - 1) as usize];
                // The forward edges before the call or return, if the run has any.
                let pre = (prog.len == 2).then(|| self.bl.steps[prog.start as usize]);
                let (add, pre_blocks, pre_instr) =
                    pre.map_or((0, 0, 0), |s| (s.b, s.blocks, s.instr));
                if h.kind == HOT_CALL {
                    r = r.wrapping_add(add);
                    blocks += pre_blocks as u64;
                    instr += pre_instr as u64;
                    if let Some(s) = pre {
                        (prev, node) = (s.last, s.node);
                    }
                    write_back!();
                    self.bl_call(n, &st);
                    n += 1;
                    (func, pap, base, r, _) = self.bl_regs(n);
                    blocks += st.blocks as u64;
                    instr += st.instr as u64;
                    (prev, node) = (st.last, st.node);
                    prev_run = run;
                    i += taken;
                    continue;
                }
                if n >= 1 && self.bl_return_ok_fast(n, &st) {
                    r = r.wrapping_add(add);
                    blocks += pre_blocks as u64;
                    instr += pre_instr as u64;
                    write_back!();
                    let id = r.wrapping_add(st.a);
                    if base != NONE {
                        self.bl.counts[base as usize + id as usize] += 1;
                    } else {
                        self.bl.count(func, id);
                    }
                    self.bl_pop(id);
                    n -= 1;
                    (func, pap, base, r, _) = self.bl_regs(n);
                    let f = &mut self.bl.frames[n];
                    r = r.wrapping_add(f.ret_add).wrapping_add(st.b);
                    f.ret_node = NONE;
                    blocks += st.blocks as u64;
                    instr += st.instr as u64;
                    (prev, node) = (st.last, st.node);
                    prev_run = run;
                    i += taken;
                    continue;
                }
            }
            if p == NONE {
                write_back!();
                let program = self.bl_program(run, self.memo.events[run as usize], tables);
                epoch = self.bl.epoch;
                match program {
                    Some(q) => p = q,
                    None => {
                        i += taken;
                        rest = Some((run, 0));
                        break;
                    }
                }
            }
            let prog = self.bl.programs[p as usize];
            if run == prev_run
                && prog.selfrep
                && r == prog.r_end
                && base != NONE
                && run == e
                && i > 0
                && events[i - 1] == e
            {
                // A loop whose body is this one event, and `r` where the event leaves it:
                // each run of the event from here on ends the same paths. A superblock's run
                // stops before its last repeat, whose next event says whether it left early.
                let j = repeat_run_end(events, i, e, info.is_superblock);
                if j > i {
                    let m = (j - i) as u64;
                    for x in prog.rep..prog.rep + prog.nrep {
                        let (_, id) = self.bl.konst[x as usize];
                        self.bl.counts[base as usize + id as usize] += m;
                    }
                    if prog.konst {
                        let pr = &mut self.bl.programs[p as usize];
                        if pr.runs == 0 {
                            self.bl.dirty.push(p);
                        }
                        pr.runs += m;
                    }
                    blocks += m * prog.blocks as u64;
                    instr += m * prog.instr as u64;
                    ends += m * prog.ends as u64;
                    // The tables count them at once too (`Tables::record_with_repeats`).
                    self.memo.repeats.push((i as u32, j as u32));
                    i = j;
                    continue;
                }
            }
            i += taken;
            for k in prog.start..prog.start + prog.len {
                let st = self.bl.steps[k as usize];
                match st.op {
                    OP_FWD => r = r.wrapping_add(st.b),
                    OP_BACK => {
                        let id = r.wrapping_add(st.a);
                        if base != NONE {
                            self.bl.counts[base as usize + id as usize] += 1;
                        } else {
                            self.bl_path_end(n, func, id);
                            if pap && self.stack[n].pap == NONE {
                                // Its PAP run was abandoned (too long): counters from here.
                                (_, pap, base, _, _) = self.bl_regs(n);
                            }
                        }
                        ends += 1;
                        r = st.b;
                    }
                    OP_KONST => {
                        ends += st.ret_node as u64;
                        if pap {
                            self.bl_konst_pap(n, &st);
                            if self.stack[n].pap == NONE {
                                (_, pap, base, _, _) = self.bl_regs(n);
                            }
                        }
                        r = st.b;
                    }
                    OP_CALL => {
                        if self.stack.len() >= self.stack_cap() {
                            write_back!();
                            self.bl_count_konst(prog.start, k);
                            rest = Some((run, st.pos));
                            break 'events;
                        }
                        write_back!();
                        self.bl_call(n, &st);
                        n += 1;
                        (func, pap, base, r, _) = self.bl_regs(n);
                    }
                    OP_RET => {
                        write_back!();
                        if !self.bl_return_ok(n, &st) {
                            self.bl_count_konst(prog.start, k);
                            rest = Some((run, st.pos));
                            break 'events;
                        }
                        let id = r.wrapping_add(st.a);
                        if base != NONE {
                            self.bl.counts[base as usize + id as usize] += 1;
                        } else {
                            self.bl.count(func, id);
                        }
                        self.bl_pop(id);
                        n -= 1;
                        (func, pap, base, r, _) = self.bl_regs(n);
                        let f = &mut self.bl.frames[n];
                        r = r.wrapping_add(f.ret_add).wrapping_add(st.b);
                        f.ret_node = NONE;
                    }
                    _ => unreachable!("a step's op"),
                }
                blocks += st.blocks as u64;
                instr += st.instr as u64;
                (prev, node) = (st.last, st.node);
            }
            if prog.konst {
                let pr = &mut self.bl.programs[p as usize];
                if pr.runs == 0 {
                    self.bl.dirty.push(p);
                }
                pr.runs += 1;
            }
            prev_run = run;
        }
        write_back!();
        (i, rest)
    }

    /// The registers of frame `n` (in Ball-Larus form): its function, whether it records a
    /// PAP run, its function's dense counters' base ([`NONE`]: its path ends take the slow
    /// way), its register and node.
    #[inline]
    fn bl_regs(&self, n: usize) -> (u32, bool, u32, u64, u32) {
        let a = &self.stack[n];
        let pap = a.pap != NONE;
        let base = match self.bl.numbered(a.func) {
            Some(b) if !pap => b.base,
            _ => NONE,
        };
        let f = &self.bl.frames[n];
        (a.func, pap, base, f.r, f.node)
    }

    /// Counts the constant paths of the `OP_KONST` steps `start..end` of a program stopped
    /// before it completed (they are not counted with its runs).
    fn bl_count_konst(&mut self, start: u32, end: u32) {
        for j in start..end {
            let t = self.bl.steps[j as usize];
            if t.op == OP_KONST {
                for x in t.a..t.a + t.ret_node as u64 {
                    let (f, id) = self.bl.konst[x as usize];
                    self.bl.count(f, id);
                }
            }
        }
    }

    /// The constant paths of `OP_KONST` step `st` go to frame `n`'s PAP run.
    #[cold]
    fn bl_konst_pap(&mut self, n: usize, st: &Step) {
        for x in st.a..st.a + st.ret_node as u64 {
            if self.stack[n].pap == NONE {
                break;
            }
            let (f, id) = self.bl.konst[x as usize];
            let p = self.bl_path_number(f, id);
            self.pap_runs.push(&mut self.stack[n], p);
        }
    }

    /// `OP_CALL` step `st` from the top frame `n` (its registers written back): pushes the
    /// callee's activation, as `push_activation` does.
    fn bl_call(&mut self, n: usize, st: &Step) {
        let parent = self.stack[n].call_node;
        let mut call_node = cached_call_child(&self.calltree, &self.call_cache, parent, st.func);
        if call_node == NONE {
            call_node = self.call_child(parent, st.func);
        }
        let fun = &mut self.funcs[st.func as usize];
        fun.activations += 1;
        let pap = if fun.path_ends >= self.config.pap_threshold {
            self.pap_runs.root(fun)
        } else {
            NONE
        };
        self.stack.push(Activation {
            func: st.func,
            return_to: st.return_to,
            cur: IN_BL,
            len: 0,
            blocks: 0,
            instructions: 0,
            path_ends: 0,
            last_addr: 0,
            pap,
            pap_len: 0,
            call_node,
            resume: NONE,
        });
        let caller = &mut self.bl.frames[n];
        caller.ret_node = st.ret_node;
        caller.ret_add = st.ret_add;
        self.bl.frames.push(Frame {
            r: st.a.wrapping_add(st.b),
            node: st.node,
            ..NO_FRAME
        });
    }

    /// Whether `OP_RET` step `st` from the top frame `n` is a plain return the loop takes: to
    /// the frame below, in the function the program expects, numbered, at the call whose
    /// return point this is (a caller in trie form goes to Ball-Larus form here).
    fn bl_return_ok(&mut self, n: usize, st: &Step) -> bool {
        if n < 1 {
            return false;
        }
        let below = self.stack[n - 1];
        if st.func == NONE {
            return true;
        }
        if below.func != st.func || below.cur == NONE {
            return false;
        }
        if n > self.bl.low {
            return self.bl.frames[n - 1].ret_node == st.ret_node;
        }
        // The caller is in trie form: it goes to Ball-Larus form.
        if !self.bl_number(below.func, false) {
            return false;
        }
        let Some(r) = self.bl_register(below.cur) else {
            return false;
        };
        let node = self.trie[below.cur as usize].node;
        let bf = self.bl.func(below.func).expect("just numbered");
        let Some(&ret_add) = bf.fwd.get(&(node, st.ret_node)) else {
            return false;
        };
        self.frame_to_bl(n - 1);
        self.bl.frames[n - 1] = Frame {
            r,
            node,
            ret_node: st.ret_node,
            ret_add,
        };
        self.bl.low = n - 1;
        true
    }

    /// [`PathRecorder::bl_return_ok`] when the caller is in Ball-Larus form already.
    #[inline]
    fn bl_return_ok_fast(&self, n: usize, st: &Step) -> bool {
        n > self.bl.low
            && self.stack[n - 1].func == st.func
            && self.bl.frames[n - 1].ret_node == st.ret_node
    }

    /// Pops the top activation, whose exit path `id` is counted, as `pop_activation` does:
    /// its counts go to its call-tree node and function, its PAP run is counted.
    fn bl_pop(&mut self, id: u64) {
        self.bl.frames.pop();
        let mut a = self.stack.pop().expect("the callee");
        let node = &mut self.calltree[a.call_node as usize];
        node.blocks += a.blocks;
        node.instructions += a.instructions;
        self.funcs[a.func as usize].path_ends += a.path_ends + 1;
        if a.pap != NONE {
            let pn = self.bl_path_number(a.func, id);
            self.pap_runs.push(&mut a, pn);
            self.pap_runs.end(&a);
        }
    }

    /// Whether frames are in Ball-Larus form (the loop is between pieces of events).
    pub(crate) fn bl_active(&self) -> bool {
        self.bl.low != usize::MAX
    }

    /// Takes run `run` in the loop: `Err(pos)` if it stopped before the block at `pos` (every
    /// step before it taken; `Err(0)`: none).
    pub(crate) fn bl_take(&mut self, run: u32, tables: &Tables) -> Result<(), u32> {
        let info = self.memo.events[run as usize];
        match self.bl_program(run, info, tables) {
            Some(p) => {
                self.bl_execute(p)?;
                self.bl.prev_run = run;
                Ok(())
            }
            None => Err(0),
        }
    }

    /// Puts the top frame in Ball-Larus form, numbering its function first if it must be.
    /// False if the loop cannot start here.
    fn bl_enter(&mut self) -> bool {
        if self.prev == NONE || self.prev == SETTLED || self.stack.is_empty() {
            return false;
        }
        if self.id_kind[self.prev as usize] == K_INSTRUMENTED {
            return false;
        }
        let n = self.stack.len() - 1;
        let a = self.stack[n];
        if a.cur == NONE || a.func == NONE {
            return false;
        }
        if !self.bl_number(a.func, true) {
            return false;
        }
        let r = match self.bl_register(a.cur) {
            Some(r) => r,
            // Numbered again with what the prefix took, once.
            None if self.bl_number(a.func, true) => match self.bl_register(a.cur) {
                Some(r) => r,
                None => {
                    return false;
                }
            },
            None => return false,
        };
        let node = self.trie[a.cur as usize].node;
        self.bl.low = n;
        self.bl.frames.clear();
        self.bl.frames.resize(n + 1, NO_FRAME);
        self.bl.frames[n] = Frame {
            r,
            node,
            ..NO_FRAME
        };
        self.frame_to_bl(n);
        self.memo.last = NONE;
        self.bl.prev_run = NONE;
        true
    }

    /// Frame `n` (in trie form) goes to Ball-Larus form: its counts include its current path.
    fn frame_to_bl(&mut self, n: usize) {
        let instr = self.path_instructions(self.stack[n].cur);
        let a = &mut self.stack[n];
        a.blocks += a.len as u64;
        a.instructions += instr;
        a.cur = IN_BL;
        a.resume = NONE;
    }

    /// Every Ball-Larus frame goes back to trie form (before anything but the loop looks at the
    /// frames).
    pub(crate) fn bl_leave(&mut self) {
        let low = std::mem::replace(&mut self.bl.low, usize::MAX);
        if low == usize::MAX {
            return;
        }
        self.bl.prev_run = NONE;
        let frames = std::mem::take(&mut self.bl.frames);
        for (n, f) in frames.iter().enumerate().skip(low) {
            self.materialize(n, f.r, f.node);
        }
        self.bl.frames = frames;
        self.bl.frames.clear();
    }

    /// Frame `n`, whose register is `r` at node `node`, goes back to trie form.
    fn materialize(&mut self, n: usize, r: u64, node: u32) {
        let func = self.stack[n].func;
        let b = self
            .bl
            .numbered(func)
            .expect("a Ball-Larus frame's function is numbered");
        let (start, blocks) = b
            .numbering
            .prefix(r, node)
            .expect("a Ball-Larus register is a prefix sum");
        let mut t = match start {
            NumberedStart::Entry => self.root(func, START_ENTRY, blocks[0]),
            NumberedStart::AfterBackEdge(h) => self.root(func, START_HEAD, h),
        };
        for &v in &blocks[1..] {
            t = self.trie_step(t, v);
        }
        let instr = self.path_instructions(t);
        let addr = self.funcs[func as usize].node_addr[node as usize];
        let a = &mut self.stack[n];
        a.cur = t;
        a.len = blocks.len() as u32;
        a.blocks -= blocks.len() as u64;
        a.instructions -= instr;
        a.last_addr = addr;
    }

    /// The register of the prefix trie node `t` stands for, under its function's numbering
    /// (`None` if the numbering lacks one of its edges, or it starts where no path starts).
    fn bl_register(&mut self, t: u32) -> Option<u64> {
        let func = self.trie[t as usize].func;
        let at = *self.bl.numbered_at.get(func as usize)?;
        if let Some(&(e, r)) = self.bl.trie_r.get(t as usize) {
            if e == at {
                return Some(r);
            }
        }
        let mut nodes = Vec::new();
        let mut x = t;
        while x != NONE {
            nodes.push(self.trie[x as usize].node);
            x = self.trie[x as usize].parent;
        }
        nodes.reverse();
        let root = self.trie[t as usize].start_tag;
        let b = self.bl.func(func)?;
        let mut r = match root {
            START_ENTRY if nodes[0] == 0 => b.numbering.start,
            START_HEAD => *b.head.get(&nodes[0])?,
            _ => return None,
        };
        let mut missing = false;
        for w in nodes.windows(2) {
            match b.fwd.get(&(w[0], w[1])) {
                Some(x) => r = r.wrapping_add(*x),
                None => {
                    missing = true;
                    break;
                }
            }
        }
        if missing {
            // The prefix took an edge (or reached a block) the numbering lacks.
            self.bl_stale(func);
            return None;
        }
        if self.bl.trie_r.len() <= t as usize {
            self.bl
                .trie_r
                .resize(self.trie.len().max(t as usize + 1), (NONE, 0));
        }
        self.bl.trie_r[t as usize] = (at, r);
        Some(r)
    }

    /// Makes sure function `func` has a current numbering. A stale one is numbered again only
    /// when `may_renumber` (no frame is in Ball-Larus form: outside the loop), after its
    /// counters are flushed. False if it has none.
    fn bl_number(&mut self, func: u32, may_renumber: bool) -> bool {
        let f = func as usize;
        if self.bl.funcs.len() <= f {
            self.bl.funcs.resize(f + 1, Numbered::No);
            self.bl.numbered_at.resize(f + 1, NONE);
        }
        match &self.bl.funcs[f] {
            Numbered::Yes(b) if !b.stale => return true,
            Numbered::Yes(_) if !may_renumber => return false,
            Numbered::Never => return false,
            _ => {}
        }
        self.flush_bl_programs();
        self.flush_bl_counts(func);
        let entry = self.funcs[f].entry;
        let numbering = match self.numbering(entry) {
            Some(Ok(n)) => n,
            Some(Err(_)) => {
                self.bl.funcs[f] = Numbered::Never;
                return false;
            }
            None => return false,
        };
        let mut fwd = FxMap::default();
        for e in &numbering.edges {
            fwd.insert((e.from, e.to), e.add);
        }
        let mut back = FxMap::default();
        let mut head = FxMap::default();
        for e in &numbering.back_edges {
            back.insert((e.from, e.to), (e.end, e.restart));
            head.insert(e.to, e.restart);
        }
        let numbering_paths = numbering.num_paths;
        let base = if numbering.num_paths <= DENSE_PATHS {
            let base = self.bl.counts.len();
            self.bl
                .counts
                .resize(base + numbering.num_paths as usize, 0);
            base as u32
        } else {
            NONE
        };
        self.bl.funcs[f] = Numbered::Yes(Box::new(BlFunc {
            numbering,
            fwd,
            back,
            head,
            base,
            sparse: FxMap::default(),
            numbers: if base != NONE {
                vec![NONE; numbering_paths as usize]
            } else {
                Vec::new()
            },
            sparse_numbers: FxMap::default(),
            stale: false,
        }));
        self.bl.invalidate();
        self.bl.numbered_at[f] = self.bl.epoch;
        true
    }

    /// Adds the runs of programs to their constant paths' counters.
    fn flush_bl_programs(&mut self) {
        for p in std::mem::take(&mut self.bl.dirty) {
            let pr = &mut self.bl.programs[p as usize];
            let runs = std::mem::take(&mut pr.runs);
            for k in pr.start..pr.start + pr.len {
                let s = self.bl.steps[k as usize];
                if s.op == OP_KONST {
                    for x in s.a..s.a + s.ret_node as u64 {
                        let (f, id) = self.bl.konst[x as usize];
                        let Some(Numbered::Yes(b)) = self.bl.funcs.get_mut(f as usize) else {
                            unreachable!("a numbered function");
                        };
                        if b.base != NONE {
                            self.bl.counts[b.base as usize + id as usize] += runs;
                        } else {
                            *b.sparse.entry(id).or_insert(0) += runs;
                        }
                    }
                }
            }
        }
    }

    /// Adds function `func`'s counters to its interned paths' counts and zeroes them.
    fn flush_bl_counts(&mut self, func: u32) {
        let Some(Numbered::Yes(b)) = self.bl.funcs.get_mut(func as usize) else {
            return;
        };
        let mut counted: Vec<(u64, u64)> = std::mem::take(&mut b.sparse).into_iter().collect();
        if b.base != NONE {
            let base = b.base as usize;
            for id in 0..b.numbering.num_paths as usize {
                let c = std::mem::take(&mut self.bl.counts[base + id]);
                if c > 0 {
                    counted.push((id as u64, c));
                }
            }
        }
        for (id, c) in counted {
            let p = self.bl_path_number(func, id);
            self.paths[p as usize].count += c;
        }
    }

    /// Adds every numbered function's counters to its paths' counts (when the profile is
    /// taken).
    pub(crate) fn settle_bl(&mut self) {
        self.flush_bl_programs();
        for f in 0..self.bl.funcs.len() {
            self.flush_bl_counts(f as u32);
        }
    }

    /// The interned path number of id `id` of numbered function `func`.
    fn bl_path_number(&mut self, func: u32, id: u64) -> u32 {
        let Some(Numbered::Yes(b)) = self.bl.funcs.get(func as usize) else {
            unreachable!("a numbered function");
        };
        let known = match b.numbers.get(id as usize) {
            Some(&p) => p,
            None => b.sparse_numbers.get(&id).copied().unwrap_or(NONE),
        };
        if known != NONE {
            return known;
        }
        let NumberedPath { start, blocks, end } = b
            .numbering
            .regenerate(id)
            .expect("a counted id is a path of its numbering");
        let mut t = match start {
            NumberedStart::Entry => self.root(func, START_ENTRY, blocks[0]),
            NumberedStart::AfterBackEdge(h) => self.root(func, START_HEAD, h),
        };
        for &v in &blocks[1..] {
            t = self.trie_step(t, v);
        }
        let end = match end {
            NumberedEnd::Exit => END_EXIT,
            NumberedEnd::BackEdge(h) => h,
        };
        let p = self.path_of(t, end);
        if let Some(Numbered::Yes(b)) = self.bl.funcs.get_mut(func as usize) {
            match b.numbers.get_mut(id as usize) {
                Some(x) => *x = p,
                None => {
                    b.sparse_numbers.insert(id, p);
                }
            }
        }
        p
    }

    /// The program of the top activation's `prev` followed by `run` (compiled if new), or
    /// `None` if the loop cannot take it.
    fn bl_program(&mut self, run: u32, info: EventInfo, tables: &Tables) -> Option<u32> {
        let prev = match self.bl.prev_run {
            NONE => (self.prev | BLOCK_KEY) as usize,
            r => r as usize,
        };
        let func = self.stack.last()?.func;
        if let Some(s) = self.bl.slots.get(prev) {
            let k = (s[1].run == run) as usize;
            if s[k].run == run {
                let p = &self.bl.programs[s[k].p as usize];
                if p.epoch == self.bl.epoch && p.func == func {
                    return Some(s[k].p);
                }
            }
        }
        if let Some(&p) = self.bl.more.get(&(prev as u32, run)) {
            let pr = &self.bl.programs[p as usize];
            if pr.epoch == self.bl.epoch && pr.func == func {
                self.bl_cache(prev, run, p);
                return Some(p);
            }
        }
        let p = self.bl_compile(run, info, func, tables)?;
        self.bl.more.insert((prev as u32, run), p);
        self.bl_cache(prev, run, p);
        Some(p)
    }

    fn bl_cache(&mut self, prev: usize, run: u32, p: u32) {
        if prev >= BLOCK_KEY as usize {
            return;
        }
        self.bl.wide[cache_slot(prev as u32, run, WIDE_SLOTS)] = (prev as u32, run, p);
        if self.bl.slots.len() <= prev {
            self.bl
                .slots
                .resize(self.id_addr.len().max(prev + 1), [NO_SLOT; 2]);
        }
        let slot = Slot {
            run,
            p,
            hot: self.bl.hot[p as usize],
        };
        let s = &mut self.bl.slots[prev];
        if s[0].run == run {
            s[0] = slot;
        } else if s[1].run == run {
            s[1] = slot;
        } else {
            s[1] = s[0];
            s[0] = slot;
        }
    }

    /// Compiles the program of `prev` followed by `run`'s blocks, starting in function `func`
    /// (module doc, "Programs"). `None` if a block or an edge is one the loop leaves to the
    /// per-block step, or a numbering lacks it (then marked stale).
    fn bl_compile(&mut self, run: u32, info: EventInfo, func: u32, tables: &Tables) -> Option<u32> {
        let start = self.bl.steps.len() as u32;
        match self.bl_compile_steps(info, func, tables) {
            Ok(()) => {}
            Err(Stop) => {
                self.bl.steps.truncate(start as usize);
                return None;
            }
        }
        let _ = run;
        let p = self.bl.programs.len() as u32;
        let len = self.bl.steps.len() as u32 - start;
        let steps = &self.bl.steps[start as usize..];
        let konst = steps.iter().any(|s| s.op == OP_KONST);
        let intra = steps.iter().all(|s| s.op <= OP_KONST);
        let blocks = steps.iter().map(|s| s.blocks).sum();
        let instr = steps.iter().map(|s| s.instr).sum();
        let mut ends = 0;
        // Where `r` ends, if constant, and the paths its back edges end when it starts there.
        let mut r_end = None;
        for s in steps {
            match s.op {
                OP_FWD => r_end = r_end.map(|r: u64| r.wrapping_add(s.b)),
                OP_BACK => {
                    ends += 1;
                    r_end = Some(s.b);
                }
                OP_KONST => {
                    ends += s.ret_node;
                    r_end = Some(s.b);
                }
                _ => {}
            }
        }
        let (selfrep, r_end) = match r_end {
            Some(r) if intra => (true, r),
            _ => (false, 0),
        };
        let rep = self.bl.konst.len() as u32;
        if selfrep {
            let mut r = r_end;
            for k in start..start + len {
                let s = self.bl.steps[k as usize];
                match s.op {
                    OP_FWD => r = r.wrapping_add(s.b),
                    OP_BACK => {
                        self.bl.konst.push((func, r.wrapping_add(s.a)));
                        r = s.b;
                    }
                    _ => r = s.b,
                }
            }
        }
        let nrep = self.bl.konst.len() as u32 - rep;
        // The fast path's view: a sum, or one variable path end (the first back edge: later
        // ones end constant paths, as `r` is then known) and a constant register after it.
        let steps = &self.bl.steps[start as usize..];
        let backs = steps.iter().filter(|s| s.op == OP_BACK).count();
        let shape = |op: u8| match steps {
            [s] => s.op == op,
            [f, s] => f.op == OP_FWD && s.op == op,
            _ => false,
        };
        let (kind, add, r_after) = if shape(OP_CALL) {
            (HOT_CALL, 0, 0)
        } else if shape(OP_RET) && steps[steps.len() - 1].func != NONE {
            (HOT_RET, 0, 0)
        } else if !intra || blocks > u16::MAX as u32 {
            (HOT_STEPS, 0, 0)
        } else if backs == 0 {
            (
                HOT_ADD,
                steps.iter().map(|s| s.b).fold(0u64, u64::wrapping_add),
                0,
            )
        } else {
            let at = steps
                .iter()
                .position(|s| s.op == OP_BACK)
                .expect("a back edge");
            let before = steps[..at]
                .iter()
                .map(|s| s.b)
                .fold(0u64, u64::wrapping_add);
            let first_konst_or_back_after = steps[at + 1..].iter().all(|s| s.op != OP_BACK);
            if first_konst_or_back_after {
                (HOT_END, before.wrapping_add(steps[at].a), r_end)
            } else {
                (HOT_STEPS, 0, 0)
            }
        };
        let last = steps.last().map_or(NONE, |s| s.last);
        let node = steps.last().map_or(NONE, |s| s.node);
        self.bl.hot.push(Hot {
            epoch: self.bl.epoch,
            func,
            add,
            r_after,
            kind,
            konst,
            selfrep,
            blocks: blocks as u16,
            instr,
            ends,
            last,
            node,
            be: (blocks as u64) << 32 | ends as u64,
        });
        self.bl.programs.push(Program {
            epoch: self.bl.epoch,
            func,
            start,
            len,
            runs: 0,
            konst,
            selfrep,
            r_end,
            rep,
            nrep,
            ends,
            blocks,
            instr,
        });
        Some(p)
    }

    fn bl_compile_steps(
        &mut self,
        info: EventInfo,
        func: u32,
        tables: &Tables,
    ) -> Result<(), Stop> {
        let first = self.bl.steps.len();
        // The activations the program itself pushed: each caller's function, the node of its
        // call and its register if the program knows it.
        let mut pushed: Vec<(u32, u32, Option<u64>)> = Vec::new();
        let (mut cf, mut prev) = (func, self.prev);
        let mut u = self.id_node_in(cf, prev)?;
        // The current activation's register where the program knows it (after a back edge
        // or a call in it): the paths its back edges end are then constant.
        let mut known: Option<u64> = None;
        let epoch0 = self.bl.epoch;
        for pos in 0..info.len {
            let b = self.memo.seq[(info.start + pos) as usize];
            let instr = tables.blocks[b as usize].instructions;
            let mut step = Step {
                op: OP_FWD,
                func: cf,
                a: 0,
                b: 0,
                ret_add: 0,
                ret_node: NONE,
                return_to: 0,
                blocks: 1,
                instr,
                pos,
                last: b,
                node: NONE,
            };
            match self.id_kind[prev as usize] {
                K_CALL => {
                    let callee = match self.id_entry[b as usize] {
                        NONE => self.function_at(self.id_addr[b as usize]),
                        f => f,
                    };
                    if !self.bl_number(callee, false) {
                        return Err(Stop);
                    }
                    let v = self.node_of(callee, b, tables);
                    let bf = self.bl.func(callee).ok_or(Stop)?;
                    if v != 0 || v as usize >= bf.numbering.blocks.len() {
                        self.bl_stale(callee);
                        return Err(Stop);
                    }
                    let start = bf.numbering.start;
                    // The caller's edge to its return point, if the numbering has it yet.
                    let ret = self.id_ret[prev as usize];
                    let caller = self.bl.func(cf).ok_or(Stop)?;
                    let (ret_node, ret_add) = match self.funcs[cf as usize].nodes.get(&ret) {
                        Some(&rn) => match caller.fwd.get(&(u, rn)) {
                            Some(&add) => (rn, add),
                            None => (NONE, 0),
                        },
                        None => (NONE, 0),
                    };
                    pushed.push((cf, u, known));
                    step.op = OP_CALL;
                    step.func = callee;
                    step.a = start;
                    step.ret_add = ret_add;
                    step.ret_node = ret_node;
                    step.return_to = ret;
                    step.node = v;
                    self.bl.steps.push(step);
                    (cf, u, known) = (callee, v, Some(start));
                }
                K_RET => {
                    let exit = *self
                        .bl
                        .func(cf)
                        .ok_or(Stop)?
                        .numbering
                        .exits
                        .get(u as usize)
                        .ok_or(Stop)?;
                    let (caller, call, caller_known, out) = match pushed.pop() {
                        Some((g, call, k)) => (g, call, k, false),
                        None => {
                            // Returns out of the program: the caller is the function the
                            // return point was last seen in, checked when the step runs.
                            let g = self.id_node[b as usize].0;
                            if g == NONE {
                                return Err(Stop);
                            }
                            (g, NONE, None, true)
                        }
                    };
                    if !self.bl_number(caller, false) {
                        return Err(Stop);
                    }
                    let v = self.node_of(caller, b, tables);
                    let bf = self.bl.func(caller).ok_or(Stop)?;
                    if v as usize >= bf.numbering.blocks.len() {
                        self.bl_stale(caller);
                        return Err(Stop);
                    }
                    let add = match call {
                        NONE => None,
                        call => match bf.fwd.get(&(call, v)) {
                            Some(&x) => Some(x),
                            None => {
                                self.bl_stale(caller);
                                return Err(Stop);
                            }
                        },
                    };
                    step.op = OP_RET;
                    step.func = if out { caller } else { NONE };
                    step.a = exit;
                    step.ret_node = v;
                    step.node = v;
                    self.bl.steps.push(step);
                    known = caller_known.zip(add).map(|(r, x)| r.wrapping_add(x));
                    (cf, u) = (caller, v);
                }
                K_INSTRUMENTED => return Err(Stop),
                _ => {
                    let v = self.node_of(cf, b, tables);
                    let bf = self.bl.func(cf).ok_or(Stop)?;
                    if v as usize >= bf.numbering.blocks.len() {
                        self.bl_stale(cf);
                        return Err(Stop);
                    }
                    let back = self.id_addr[b as usize] <= self.id_addr[prev as usize];
                    if back {
                        let Some(&(end, restart)) = bf.back.get(&(u, v)) else {
                            self.bl_stale(cf);
                            return Err(Stop);
                        };
                        match known {
                            Some(r) => {
                                // A constant path: counted from the program's runs.
                                let id = r.wrapping_add(end);
                                let k = self.bl.konst.len() as u64;
                                self.bl.konst.push((cf, id));
                                let mine = self.bl.steps.len() > first;
                                let last = self
                                    .bl
                                    .steps
                                    .last_mut()
                                    .filter(|s| mine && s.op == OP_KONST && s.func == cf);
                                match last {
                                    Some(s) => {
                                        s.ret_node += 1;
                                        s.b = restart;
                                        s.blocks += 1;
                                        s.instr += instr;
                                        s.last = b;
                                        s.node = v;
                                    }
                                    None => {
                                        step.op = OP_KONST;
                                        step.a = k;
                                        step.b = restart;
                                        step.ret_node = 1;
                                        step.node = v;
                                        self.bl.steps.push(step);
                                    }
                                }
                            }
                            None => {
                                step.op = OP_BACK;
                                step.a = end;
                                step.b = restart;
                                step.node = v;
                                self.bl.steps.push(step);
                            }
                        }
                        known = Some(restart);
                    } else {
                        let Some(&add) = bf.fwd.get(&(u, v)) else {
                            self.bl_stale(cf);
                            return Err(Stop);
                        };
                        known = known.map(|r| r.wrapping_add(add));
                        let fold = self.bl.steps.len() > first;
                        match self.bl.steps.last_mut().filter(|_| fold) {
                            Some(s) => {
                                s.b = s.b.wrapping_add(add);
                                s.blocks += 1;
                                s.instr += instr;
                                s.last = b;
                                s.node = v;
                            }
                            None => {
                                step.b = add;
                                step.node = v;
                                self.bl.steps.push(step);
                            }
                        }
                    }
                    u = v;
                }
            }
            // A function entry made while compiling (the callee's first call): programs made
            // before may no longer hold, this one is made under the new epoch.
            if self.bl.epoch != epoch0 {
                return Err(Stop);
            }
            prev = b;
        }
        Ok(())
    }

    /// The node of block `id` in function `func`, if it has one already.
    fn id_node_in(&mut self, func: u32, id: u32) -> Result<u32, Stop> {
        let (f, n) = self.id_node[id as usize];
        if f == func {
            Ok(n)
        } else {
            let addr = self.id_addr[id as usize];
            self.funcs[func as usize]
                .nodes
                .get(&addr)
                .copied()
                .ok_or(Stop)
        }
    }

    /// Function `func`'s numbering lacks an edge or a block: number it again before use.
    fn bl_stale(&mut self, func: u32) {
        if let Some(Numbered::Yes(b)) = self.bl.funcs.get_mut(func as usize) {
            b.stale = true;
        }
    }

    /// Runs program `p` on the frames (module doc). `Err(pos)`: it stopped before the step
    /// entering the run's block at `pos`, with every step before it taken.
    fn bl_execute(&mut self, p: u32) -> Result<(), u32> {
        let prog = self.bl.programs[p as usize];
        for k in prog.start..prog.start + prog.len {
            let s = self.bl.steps[k as usize];
            if let Err(pos) = self.bl_step(&s) {
                // The constant paths of the steps taken are counted now, not with the runs.
                for j in prog.start..k {
                    let t = self.bl.steps[j as usize];
                    if t.op == OP_KONST {
                        for x in t.a..t.a + t.ret_node as u64 {
                            let (f, id) = self.bl.konst[x as usize];
                            self.bl.count(f, id);
                        }
                    }
                }
                return Err(pos);
            }
        }
        if prog.konst {
            let pr = &mut self.bl.programs[p as usize];
            if pr.runs == 0 {
                self.bl.dirty.push(p);
            }
            pr.runs += 1;
        }
        Ok(())
    }

    /// One step of a program (see [`PathRecorder::bl_execute`]).
    #[inline]
    fn bl_step(&mut self, s: &Step) -> Result<(), u32> {
        let n = self.stack.len() - 1;
        match s.op {
            OP_FWD => {
                let f = &mut self.bl.frames[n];
                f.r = f.r.wrapping_add(s.b);
                f.node = s.node;
            }
            OP_BACK => {
                let id = self.bl.frames[n].r.wrapping_add(s.a);
                self.bl_path_end(n, s.func, id);
                self.stack[n].path_ends += 1;
                let f = &mut self.bl.frames[n];
                f.r = s.b;
                f.node = s.node;
            }
            OP_KONST => {
                self.stack[n].path_ends += s.ret_node as u64;
                if self.stack[n].pap != NONE {
                    self.bl_konst_pap(n, s);
                }
                let f = &mut self.bl.frames[n];
                f.r = s.b;
                f.node = s.node;
            }
            OP_CALL => {
                if self.stack.len() >= self.stack_cap() {
                    return Err(s.pos);
                }
                self.bl_call(n, s);
            }
            OP_RET => {
                if !self.bl_return_ok(n, s) {
                    return Err(s.pos);
                }
                let id = self.bl.frames[n].r.wrapping_add(s.a);
                self.bl.count(self.stack[n].func, id);
                self.bl_pop(id);
                let f = &mut self.bl.frames[n - 1];
                f.r = f.r.wrapping_add(f.ret_add).wrapping_add(s.b);
                f.node = s.node;
                f.ret_node = NONE;
            }
            _ => unreachable!("a step's op"),
        }
        let top = self.stack.last_mut().expect("an activation");
        top.blocks += s.blocks as u64;
        top.instructions += s.instr as u64;
        self.prev = s.last;
        Ok(())
    }

    /// A path of function `func` with id `id` ended in frame `n` at a back edge.
    #[inline]
    fn bl_path_end(&mut self, n: usize, func: u32, id: u64) {
        self.bl.count(func, id);
        let a = &self.stack[n];
        if a.pap != NONE {
            let p = self.bl_path_number(func, id);
            self.pap_runs.push(&mut self.stack[n], p);
        }
    }
}

/// The registers of [`bl_fast`]: the top activation's `r`, the previous run, the last block
/// and node, and the counts it took (blocks in the high half of `blocks_ends`, path ends in
/// the low one: at most [`FAST_EVENTS`] events of at most `MAX_TRACE_BLOCKS` blocks each).
struct FastRegs {
    r: u64,
    prev_run: u32,
    last: (u32, u32),
    blocks_ends: u64,
    instr: u64,
}

/// What [`bl_fast`] reads and counts in.
struct FastTables<'a> {
    slots: &'a [[Slot; 2]],
    wide: &'a [(u32, u32, u32)],
    hot: &'a [Hot],
    infos: &'a [EventInfo],
    counts: &'a mut [u64],
    programs: &'a mut [Program],
    dirty: &'a mut Vec<u32>,
}

/// Events [`bl_fast`] takes at most per call (its packed counts cannot overflow).
const FAST_EVENTS: usize = 1 << 16;

/// The loop's common case from `events[i]` on: runs whose program is in their previous
/// run's slots, made under `epoch` for the top activation's function `func`, and adds to `r`
/// or ends one path counted in the dense counters at `base` (module doc). Returns the index
/// of the first event it did not take; `regs` holds the state after the last one it took.
#[inline(never)]
fn bl_fast(
    t: FastTables<'_>,
    events: &[u32],
    mut i: usize,
    regs: &mut FastRegs,
    epoch: u32,
    func: u32,
    base: u32,
) -> usize {
    let (mut r, mut prev_run) = (regs.r, regs.prev_run);
    let (mut be, mut instr) = (0u64, 0u64);
    let mut last = NONE as usize;
    let end = events.len().min(i + FAST_EVENTS);
    while i < end {
        let e = events[i];
        let Some(info) = t.infos.get(e as usize) else {
            break;
        };
        let (mut run, mut taken) = (e, 1);
        if info.is_superblock {
            let Some(&next) = events.get(i + 1) else {
                break;
            };
            let exited = match t.infos.get(next as usize) {
                Some(x) => x.superblock == e,
                None if !is_id(next) => false,
                None => break,
            };
            // Branch-free: whether a superblock left early is the guest's own branch.
            run = if exited { next } else { e };
            taken += exited as usize;
        }
        let Some(sl) = t.slots.get(prev_run as usize) else {
            break;
        };
        let k = (sl[1].run == run) as usize;
        let x = &sl[k];
        let (p, h) = if x.run == run {
            (x.p, &x.hot)
        } else {
            // More successors than two (a dispatch loop): the direct-mapped cache.
            let (a, b, q) = t.wide[cache_slot(prev_run, run, WIDE_SLOTS)];
            if a != prev_run || b != run {
                break;
            }
            (q, &t.hot[q as usize])
        };
        if h.epoch != epoch || h.func != func || h.kind >= HOT_STEPS {
            break;
        }
        if run == prev_run && h.selfrep && r == h.r_after {
            // A repeat run: the general loop counts it at once.
            break;
        }
        if h.kind == HOT_ADD {
            r = r.wrapping_add(h.add);
        } else {
            t.counts[base as usize + r.wrapping_add(h.add) as usize] += 1;
            r = h.r_after;
            if h.konst {
                let pr = &mut t.programs[p as usize];
                if pr.runs == 0 {
                    t.dirty.push(p);
                }
                pr.runs += 1;
            }
        }
        be += h.be;
        instr += h.instr as u64;
        last = p as usize;
        prev_run = run;
        i += taken;
    }
    if last != NONE as usize {
        let h = &t.hot[last];
        regs.last = (h.last, h.node);
        (regs.r, regs.prev_run, regs.blocks_ends, regs.instr) = (r, prev_run, be, instr);
    }
    i
}
