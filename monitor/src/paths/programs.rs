//! Pair programs: what a run does to the shadow stack and its activations' paths, compiled
//! once per pair of runs (a chain of pieces), and where they are found (see `pairs.rs`).

use super::ids::{cache_slot, FxMap, NONE};

/// What a run does to the shadow stack and the top activation's path (see the module doc).
/// Laid out for the loop in registers: what a piece with no path end reads is the first
/// cache line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct Program {
    /// [`INTRA`], [`CALL`], [`RETURN`], [`TAIL`], [`FOREIGN`], or [`NEVER`] (the per-block
    /// step).
    pub(crate) kind: u8,
    /// It has folded activations (`nfolds > 0`; here, in the first cache line).
    pub(crate) folded: bool,
    /// Paths the segment ends; the second and later ones are `Pairs::ends[ends..ends + nends
    /// - 1]`, counted `Pairs::runs` times when settled, with their blocks and instructions
    /// summed in `mid_blocks` and `mid_instr`.
    pub(crate) nends: u32,
    /// Its function's epoch when compiled (`PathRecorder::fepoch`).
    pub(crate) epoch: u32,
    /// The next piece of the run ([`NONE`]: the last).
    pub(crate) next: u32,
    /// The function the run's path steps in, and the node its path must be at before the
    /// segment ([`INTRA`]: the top activation; [`RETURN`]: the caller returned to; [`CALL`]:
    /// the callee, at its first node).
    pub(crate) func: u32,
    pub(crate) from: u32,
    /// Blocks the segment adds to the current path (with ends: to the first ended path).
    pub(crate) blocks: u32,
    /// The node of the run's last block, and the block itself.
    pub(crate) last_node: u32,
    pub(crate) last: u32,
    /// Guest addresses of the run's blocks that follow an indirect jump: each must not be the
    /// stepping activation's return address (`Pairs::ind[ind..ind + nind]`).
    pub(crate) nind: u16,
    /// Added to the register: the segment's edges (with no path end), or the edges up to and
    /// including the first back edge's end (the first ended path's id is then the register
    /// plus it).
    pub(crate) add: u64,
    /// Guest instructions the segment adds to the current path (with ends: to the first
    /// ended path).
    pub(crate) instr: u64,
    /// The guest address of the run's last block.
    pub(crate) last_addr: u64,
    /// With ends: the register, the path's instructions and blocks after the last one.
    pub(crate) r_after: u64,
    pub(crate) instr_after: u64,
    /// Where the first ended path's count is, minus the register: the function's dense
    /// counters' base plus `add` (wrapping), or [`NO_DENSE`] when its counters are a map.
    pub(crate) cbase: u64,
    pub(crate) mid_blocks: u64,
    pub(crate) mid_instr: u64,
    /// [`CALL`]: the callee's return address and the register its first path starts with.
    /// [`RETURN`]: the address returned to (the top activation's return address), where the
    /// caller's path goes on with the return point's node `first_node` (`first_instr` guest
    /// instructions): `r0` is the value of the edge to it from node `from`, the caller's last
    /// node as last seen (callers reach one return point from blocks entered at different
    /// addresses, so that is a one-entry cache the piece updates, not a check).
    /// [`TAIL`], [`FOREIGN`]: the register the new activation's path starts with; for
    /// [`FOREIGN`], `ret` is the guest address jumped to. [`CALL`], [`TAIL`], [`FOREIGN`]:
    /// `first_instr` is the new activation's first block's guest instructions.
    pub(crate) ret: u64,
    pub(crate) r0: u64,
    pub(crate) first_instr: u64,
    pub(crate) blocks_after: u32,
    pub(crate) ends: u32,
    pub(crate) first_node: u32,
    /// Where this piece starts in the run (blocks).
    pub(crate) pos: u32,
    pub(crate) ind: u32,
    /// Calls the segment makes whose callees return inside it (*folded* activations, see
    /// [`PathRecorder::fold_call`]): the paths they end, `Pairs::ends[ends + nends - 1..]`
    /// (`nfold_ends` of them, after the segment's own), the functions they run with their
    /// epochs and counts (`Pairs::folds[folds..folds + nfolds]`), the blocks and guest
    /// instructions they execute (to the call tree's root), all counted `Pairs::runs` times
    /// when settled; `fold_depth`: the most frames they stack at once.
    pub(crate) nfold_ends: u32,
    pub(crate) folds: u32,
    pub(crate) nfolds: u32,
    pub(crate) fold_depth: u32,
    /// Tail calls the folded activations make (resynchronisations, counted as such).
    pub(crate) fold_tails: u32,
    /// [`TAIL`], [`FOREIGN`]: the function of the activation it replaces.
    pub(crate) tail_of: u32,
    /// [`CALL`], [`RETURN`]: the [`Prefix`] the top activation's path steps first
    /// (`Pairs::prefixes`), or [`NONE`].
    pub(crate) prefix: u32,
    /// [`FOREIGN`]: the index of the symbol containing the address jumped to (`ret`).
    pub(crate) foreign_sym: u32,
}

/// An [`INTRA`] piece fused into the [`CALL`] or [`RETURN`] piece after it
/// (`Program::prefix`): the steps of the top activation's path before the call or the
/// return, applied as that piece would have applied them (one piece less a run on calling
/// code: a run that calls or returns was otherwise two pieces, each with its own checks).
/// Only where the piece had no path end, folded call or indirect step, and activations keep
/// no tallies (`PathRecorder::tallies`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prefix {
    /// The top activation's function, its epoch when compiled, and the node its path must be
    /// at.
    pub(crate) func: u32,
    pub(crate) epoch: u32,
    pub(crate) from: u32,
    /// Its path's node and guest address after the steps.
    pub(crate) last_node: u32,
    pub(crate) last_addr: u64,
    /// Added to its register.
    pub(crate) add: u64,
}

/// A function that a piece's folded activations run (`Program::folds`), and its epoch when
/// compiled.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fold {
    pub(crate) func: u32,
    pub(crate) epoch: u32,
}

/// How far a [`FoldAcc`] had got: what [`FoldAcc::truncate`] goes back to.
#[derive(Clone, Copy, Default)]
pub(crate) struct FoldMark {
    pub(crate) ends: usize,
    pub(crate) acts: usize,
    pub(crate) depth: u32,
    pub(crate) tail_calls: u32,
}

/// The folded activations of the piece being compiled: the paths they end as `(function,
/// id)`, each activation's function, and their deepest nesting. Only appended to while
/// compiling, so that a call that cannot be folded after all is undone by
/// [`FoldAcc::truncate`]. (Their blocks, instructions and path ends are not tallied:
/// folding is only for a profile without a call tree or PAP runs, which reads none.)
#[derive(Clone, Default)]
pub(crate) struct FoldAcc {
    pub(crate) ends: Vec<(u32, u64)>,
    pub(crate) acts: Vec<u32>,
    pub(crate) depth: u32,
    pub(crate) tail_calls: u32,
}

impl FoldAcc {
    pub(crate) fn clear(&mut self) {
        self.truncate(FoldMark::default());
    }

    pub(crate) fn mark(&self) -> FoldMark {
        FoldMark {
            ends: self.ends.len(),
            acts: self.acts.len(),
            depth: self.depth,
            tail_calls: self.tail_calls,
        }
    }

    pub(crate) fn truncate(&mut self, m: FoldMark) {
        self.ends.truncate(m.ends);
        self.acts.truncate(m.acts);
        self.depth = m.depth;
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

/// Program kinds: the run continues the top activation's path; its first block is a
/// callee's entry (the block before it calls); it returns to the frame below the top one
/// (the block before it returns), whose path it continues; the pair needs the per-block step
/// until the epoch changes.
pub(crate) const INTRA: u8 = 0;
pub(crate) const CALL: u8 = 1;
pub(crate) const RETURN: u8 = 2;
pub(crate) const NEVER: u8 = 3;
/// The run's first block is another function's entry that the top activation jumps to (a tail
/// call): the top activation ends and one of the entry's function takes its place.
pub(crate) const TAIL: u8 = 4;
/// The run's first block follows an indirect jump out of the top activation's function, into
/// a function no frame's activation is of and at no frame's return address (a foreign jump:
/// a PLT stub's jump into its library): the top activation is replaced, as for a tail call.
pub(crate) const FOREIGN: u8 = 5;

/// Runs the general way takes after the intra loop took fewer than two events (calls,
/// returns, new pairs: its start would be all it does).
pub(crate) const FAST_BACKOFF: u32 = 8;

/// A program epoch no function has (a chain to compile again).
pub(crate) const STALE: u32 = u32::MAX;

/// What [`PathRecorder::apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    Yes,
    /// The program was compiled for other numbers or another state: compile it again.
    Stale,
    /// Its assumptions hold but this run needs the per-block step (a full stack, a call-tree
    /// child not cached, a block after an indirect jump that is the return address).
    Refused,
}

/// Slots of the direct-mapped pair cache, a power of two (12 bytes each: 192 KiB).
pub(crate) const PAIR_CACHE_SLOTS: usize = 1 << 14;

/// `Program::cbase` of a function whose counters are a map.
pub(crate) const NO_DENSE: u64 = u64::MAX;

/// A path a program ends after its first, or one a folded activation ends: its function, a
/// constant id, and its number.
#[derive(Clone, Copy, Debug)]
pub(crate) struct End {
    pub(crate) func: u32,
    pub(crate) id: u64,
    /// Its path number once a PAP run needed it ([`NONE`] before: interning it earlier would
    /// list a path that never ran).
    pub(crate) number: u32,
}

/// The pair programs of one recorder.
#[derive(Clone, Default)]
pub(crate) struct Pairs {
    /// Per run: the two runs that followed it most recently, with their programs (`(NONE,
    /// _)`: empty).
    pub(crate) slots: Vec<[(u32, u32); 2]>,
    /// Program by `(run before, run)`, behind `slots`: a direct-mapped cache (a run followed
    /// by more than two others: a superblock's side exits, a dispatch loop); then the map,
    /// by `(block before, run, top frame's function)`: the programs themselves, one per block,
    /// run and function the run continues. A program checks the function it continues, and
    /// code that runs in the activations of several functions (an interpreter's code jumped
    /// to from each of its callers) made one program per block and run thrash: guile running
    /// fib recompiled one on 37 % of its events.
    pub(crate) cache: Box<[(u32, u32, u32)]>,
    pub(crate) map: FxMap<(u32, u32, u32), u32>,
    pub(crate) progs: Vec<Program>,
    pub(crate) ends: Vec<End>,
    pub(crate) folds: Vec<Fold>,
    pub(crate) ind: Vec<u64>,
    pub(crate) prefixes: Vec<Prefix>,
    pub(crate) scratch: Scratch,
    /// Per program: runs whose second and later path ends are not yet counted, and the
    /// programs that have some.
    pub(crate) runs: Vec<u64>,
    pub(crate) dirty: Vec<u32>,
    /// The previous run ([`NONE`]: none yet).
    pub(crate) prev_run: u32,
    /// Runs to take the general way before [`PathRecorder::run_sums_loop`] is tried again.
    pub(crate) backoff: u32,
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

    /// The program of run `run` after run `prev_run`, whose last block is `prev_block`, in an
    /// activation of function `func`, if one was compiled (perhaps stale, or another
    /// function's): through `prev_run`'s slots and the direct-mapped cache (keyed by the run
    /// before, whose successors are more predictable than a block's), else the map (keyed by
    /// the block and the function, which is all a program depends on).
    #[inline]
    pub(crate) fn find(&self, prev_run: u32, prev_block: u32, run: u32, func: u32) -> Option<u32> {
        self.find_in_slots(prev_run, run)
            .or_else(|| self.find_slow(prev_run, prev_block, run, func))
    }

    /// [`Pairs::find`] in `prev_run`'s two slots alone.
    #[inline]
    pub(crate) fn find_in_slots(&self, prev_run: u32, run: u32) -> Option<u32> {
        let s = self.slots.get(prev_run as usize)?;
        if s[0].0 == run {
            return Some(s[0].1);
        }
        if s[1].0 == run {
            return Some(s[1].1);
        }
        None
    }

    #[cold]
    pub(crate) fn find_slow(
        &self,
        prev_run: u32,
        prev_block: u32,
        run: u32,
        func: u32,
    ) -> Option<u32> {
        let (cp, cr, p) = self.cache[cache_slot(prev_run, run, PAIR_CACHE_SLOTS)];
        if cp == prev_run && cr == run {
            return Some(p);
        }
        self.map.get(&(prev_block, run, func)).copied()
    }

    /// Makes program `p` the one [`Pairs::find`] finds first for run `run` after run
    /// `prev_run`.
    pub(crate) fn remember(&mut self, prev_run: u32, run: u32, p: u32) {
        self.cache[cache_slot(prev_run, run, PAIR_CACHE_SLOTS)] = (prev_run, run, p);
        if self.slots.len() <= prev_run as usize {
            self.slots.resize(prev_run as usize + 1, [(NONE, NONE); 2]);
        }
        let s = &mut self.slots[prev_run as usize];
        if s[0].0 != run {
            s[1] = s[0];
            s[0] = (run, p);
        } else {
            s[0].1 = p;
        }
    }
}

/// Buffers compiling a run uses: its blocks, the simulated stack, the pieces made.
#[derive(Clone, Default)]
pub(crate) struct Scratch {
    pub(crate) blocks: Vec<u32>,
    pub(crate) sim: Vec<SimFrame>,
    pub(crate) chain: Vec<Program>,
    pub(crate) fold: FoldAcc,
}

/// A frame of the shadow stack as compiling a run sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SimFrame {
    pub(crate) func: u32,
    pub(crate) node: u32,
    pub(crate) addr: u64,
    pub(crate) return_to: u64,
}

impl Program {
    /// A piece that does nothing yet.
    pub(crate) fn empty() -> Program {
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
            fold_tails: 0,
            tail_of: NONE,
            foreign_sym: NONE,
            prefix: NONE,
        }
    }
}
