//! Memoised path transitions: what a run of an event's basic blocks does to the current path,
//! worked out once per (path prefix, event, position) and then replayed as a few adds.
//!
//! The ring carries one event per superblock run, but a path profile is defined over basic
//! blocks, and stepping every block through the shadow stack and the prefix trie (`recorder.rs`, `stack.rs`, `trie.rs`)
//! costs the monitor about as much per *block* as the tables cost per *event*. What makes a
//! shortcut possible: between blocks that neither call, return nor jump indirectly, the
//! per-block step is `step_intra`, whose outcome depends only on the current path (its trie
//! node, which fixes the function and the last block's address) and on the block: it extends
//! the prefix, or at a back edge ends a path — whose number the prefix fixes — and starts the
//! next one at the back edge's head. So a *segment* of an event's blocks, from a position whose
//! step is intra-procedural up to the first block that calls, returns or jumps indirectly,
//! maps the trie node it starts from to the trie node it ends at and ends a fixed list of
//! paths on the way. That map is memoised per (trie node, event, position): the first run
//! steps the blocks one by one (counting as usual) and records it; later runs apply it to the
//! activation (current path, its length, the block and path-end counters) and count one more
//! run of the memo; [`PathRecorder::settle_memos`] adds those runs to the ended paths' counts
//! when the profile is taken. Only where path numbers must be seen in order — the k-slab
//! forests (`--k`) and PAP runs being recorded — are a memo's ended paths replayed one by one.
//! Calls, indirect jumps that leave the function, unusual returns and activation starts go
//! through the per-block step (or its common case in the fast loop, below), and the memo
//! picks up again at the next position. A plain
//! return (to the top frame's return address, with a frame below) pops the activation and
//! then goes on with a memo: the caller's path continues at the return point as after any
//! block.
//!
//! **Prediction.** Which memo comes next is predicted from the one before (its two most
//! recent successors, like block chaining), else found in a direct-mapped cache, else in a
//! hash map. A memo records the trie node it starts from, and that is checked before every
//! use, so a prediction needs no other context: after a call the callee's first memo is
//! predicted from the caller's last one, and after a return the caller's next memo from the
//! one that ended with its call (kept in its frame).
//!
//! **Fast loops** (`fast.rs`). `PathRecorder::run_fast` is the common case with its state in registers,
//! in two loops that hand over to each other: `run_intra_loop` takes whole events that stay in
//! one activation (a loop), and `run_call_loop` also takes calls whose callee's function,
//! trie root and call-tree node are known (what `push_activation` does in its common case)
//! and plain returns followed by a memo of the caller's (what `run_return` does), at any
//! position in an event. Anything else goes the general way. A memo that ends at the node it
//! starts from (a loop whose body is one event) is its own successor for the same event, so
//! the fast loops count a run of that event at once.
//!
//! **Validity.** A memo records what the per-block step did, so it is applied only where that
//! step would do the same again:
//! 1. the per-block step would continue the current path with the segment's first block,
//!    from the trie node the memo starts from: the block before neither calls nor returns
//!    (or it returned plainly and the activation is popped), and if it jumps indirectly, the
//!    segment's first block was last seen in the current function and is not the current
//!    activation's return address (checked before every use, as the per-block step does);
//! 2. no block of the segment is another function's entry (a jump there is a tail call):
//!    function entries are only ever added, and adding one at a block already seen
//!    invalidates every memo (an epoch counter);
//! 3. all else the step reads — the trie, CFG nodes, back edges by guest address, the
//!    event's block sequence — is append-only or fixed.
//!
//! `PathConfig::per_block` keeps the per-block recorder; tests check both give the same
//! profile on every guest sample (tests/tests/paths.rs).

use hotpath_events::{is_id, IdKind, MAX_TRACE_BLOCKS};

use super::ids::{cache_slot, FxMap, NONE};
use super::pap_runs::PapRuns;
use super::recorder::PathRecorder;
use super::stack::{Activation, K_CALL, K_INDIRECT, K_OTHER, K_RET};
use crate::Tables;

/// Appends `runs` repeats of a memo's ended paths `ends` to activation `a`'s PAP run (it
/// records one), until the run is abandoned.
#[cold]
pub(crate) fn push_pap_runs(pap_runs: &mut PapRuns, a: &mut Activation, ends: &[u32], runs: u64) {
    for _ in 0..runs {
        for &p in ends {
            if a.pap == NONE {
                return;
            }
            pap_runs.push(a, p);
        }
    }
}

/// The basic blocks an event id stands for: `seq[start..start + len]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventInfo {
    pub(crate) start: u32,
    pub(crate) len: u32,
    /// Its first basic block, `seq[start]` (read where an indirect jump led to it).
    pub(crate) first: u32,
    /// A superblock (its extent is told by the event after it).
    pub(crate) is_superblock: bool,
    /// A side exit's superblock ([`NONE`] otherwise).
    pub(crate) superblock: u32,
}

/// One memoised transition: a segment of an event's blocks applied to a path prefix. One
/// cache line: the predicted path reads the last memo and this one, nothing else.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct Memo {
    /// Runs not yet added to the ended paths' counts (the first run counted itself).
    pub(crate) count: u64,
    /// Guest address of its last block (the activation's `last_addr` after it).
    pub(crate) last_addr: u64,
    /// The two memos applied right after it most recently and their keys, the more recent
    /// first (a prediction, like block chaining: in a loop the same memos follow each other,
    /// a loop's exit aside; after a memo that ends with a call, the callee's first memo and
    /// the caller's memo after the return; [`NONE`] / [`NO_KEY`]: none yet).
    pub(crate) succ: [u32; 2],
    pub(crate) succ_key: [u32; 2],
    /// The trie node after the segment, and the current path's length then (blocks).
    pub(crate) next: u32,
    pub(crate) len: u32,
    /// The trie node it starts from (checked before every predicted use).
    pub(crate) from: u32,
    /// Its last basic block id (the recorder's `prev` after it).
    pub(crate) last: u32,
    /// Blocks on the paths it ends (added to the activation's finished blocks).
    pub(crate) blocks: u32,
    /// The paths it ends, in order: `MemoState::ends[ends..ends + nends]`.
    pub(crate) ends: u32,
    /// `MemoState::epoch` when it was made.
    pub(crate) epoch: u32,
    pub(crate) nends: u16,
    /// Position in the event's block sequence after the segment.
    pub(crate) end: u8,
    /// The terminator class of its last block.
    pub(crate) last_kind: u8,
}

/// What [`PathRecorder::next_run`] found.
pub(crate) enum NextRun {
    /// The run of this event id.
    Run(u32),
    /// A system call event (or an id the tables do not know).
    Skip,
    /// A superblock at the end of the piece of events.
    Pending,
}

/// What the per-block step would do with the next block, as the block before it decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Context {
    /// Continue the top activation's path (a memoised segment can start here).
    Path,
    /// Return to the frame below the top one (then continue its path).
    Return,
    /// Start a callee's activation.
    Call,
    /// Anything else: the per-block step.
    Step,
}

/// Slots of the direct-mapped memo cache, a power of two (12 bytes each: 384 KiB, so that it
/// stays in the monitor core's L2 while the ring streams through). A miss falls back to a
/// hash map.
const CACHE_SLOTS: usize = 1 << 15;

/// A slot of the memo cache: trie node, key, memo index (`from == NONE`: empty).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    pub(crate) from: u32,
    pub(crate) key: u32,
    pub(crate) memo: u32,
}

const EMPTY_SLOT: Slot = Slot {
    from: NONE,
    key: NO_KEY,
    memo: NONE,
};

/// Events the general path takes after the fast loops took fewer than two (new memos, new
/// functions, unusual returns, syscalls at every event: their start-up would be all they do).
const FAST_BACKOFF: u32 = 8;

/// Bits of a memo key that hold the position in the event (see `MAX_TRACE_BLOCKS`).
const POS_BITS: u32 = 6;
const _: () = assert!(MAX_TRACE_BLOCKS <= 1 << POS_BITS);

/// A key no event has (`Memo::succ_key` of a memo with no successor yet).
pub(crate) const NO_KEY: u32 = u32::MAX;

/// The memo key of position `pos` of event `event`, or [`NO_KEY`] for an event id too large
/// to key (2^26 ids and up: its blocks are stepped one by one).
#[inline]
pub(crate) fn memo_key(event: u32, pos: u32) -> u32 {
    if event >= (1 << (32 - POS_BITS)) - 1 {
        return NO_KEY;
    }
    event << POS_BITS | pos
}

#[inline]
pub(crate) fn slot_of(from: u32, key: u32) -> usize {
    cache_slot(from, key, CACHE_SLOTS)
}

/// The event-level state of a [`PathRecorder`]: what each event id stands for, the superblock
/// waiting for its extent, and the memoised transitions.
#[derive(Clone)]
pub(crate) struct MemoState {
    /// Per event id (block, superblock or side exit).
    pub(crate) events: Vec<EventInfo>,
    /// Basic block ids of every event's span, concatenated.
    pub(crate) seq: Vec<u32>,
    /// A superblock event whose extent the next event tells, or [`NONE`].
    pub(crate) pending: u32,
    pub(crate) memos: Vec<Memo>,
    /// Per memo: guest instructions on the paths it ends (beside `Memo::blocks`; kept out of
    /// the memo's cache line).
    pub(crate) instr: Vec<u64>,
    /// Ended paths of every memo, concatenated.
    pub(crate) ends: Vec<u32>,
    /// Direct-mapped cache in front of `map`.
    pub(crate) cache: Box<[Slot]>,
    /// Memo by (trie node, key).
    pub(crate) map: FxMap<(u32, u32), u32>,
    /// Bumped when memos may no longer be trusted (see the module doc, rule 2).
    pub(crate) epoch: u32,
    /// Events to take the general way before the fast loop is tried again.
    pub(crate) fast_backoff: u32,
    /// The memo applied last, or, after a return, the one that ended with the caller's call
    /// ([`NONE`]: none): its successors predict the next memo.
    pub(crate) last: u32,
    /// Runs of one repeated event the fast loop found in the current piece of events, as
    /// `(start, end)` indices: events `start..end` repeat `events[start - 1]` (for
    /// [`Tables::record_with_repeats`]).
    pub(crate) repeats: Vec<(u32, u32)>,
}

impl Default for MemoState {
    fn default() -> Self {
        MemoState {
            events: Vec::new(),
            seq: Vec::new(),
            pending: NONE,
            memos: Vec::new(),
            instr: Vec::new(),
            ends: Vec::new(),
            cache: vec![EMPTY_SLOT; CACHE_SLOTS].into_boxed_slice(),
            map: FxMap::default(),
            epoch: 0,
            fast_backoff: 0,
            last: NONE,
            repeats: Vec::new(),
        }
    }
}

impl MemoState {
    /// Makes room for `n` more ids (each at least one block of the sequence).
    pub(crate) fn reserve(&mut self, n: usize) {
        self.events.reserve(n);
        self.seq.reserve(n);
    }

    /// Learns what id `id` (the next one) stands for. Returns whether it is a basic block.
    pub(crate) fn learn(&mut self, id: u32, kind: &IdKind) -> bool {
        debug_assert_eq!(self.events.len(), id as usize);
        let start = self.seq.len() as u32;
        let info = match kind {
            IdKind::Block => {
                self.seq.push(id);
                EventInfo {
                    start,
                    len: 1,
                    first: id,
                    is_superblock: false,
                    superblock: NONE,
                }
            }
            IdKind::Superblock { blocks } => {
                self.seq.extend(blocks.iter().map(|b| b.0));
                EventInfo {
                    start,
                    len: blocks.len() as u32,
                    first: blocks.first().map_or(NONE, |b| b.0),
                    is_superblock: true,
                    superblock: NONE,
                }
            }
            IdKind::SideExit { superblock, after } => EventInfo {
                start: self.events[superblock.0 as usize].start,
                len: after + 1,
                first: self.events[superblock.0 as usize].first,
                is_superblock: false,
                superblock: superblock.0,
            },
        };
        self.events.push(info);
        matches!(kind, IdKind::Block)
    }

    /// The memo applied last, whose successors predict the next one ([`NONE`]: none).
    pub(crate) fn last(&self) -> u32 {
        self.last
    }

    /// No memo made so far may be used again.
    pub(crate) fn invalidate(&mut self) {
        self.epoch += 1;
    }
}

impl PathRecorder {
    /// Accounts `events` a whole event at a time, taking in ids as they first appear.
    pub(crate) fn record_events(&mut self, events: &[u32], tables: &Tables) {
        let mut i = 0;
        self.memo.repeats.clear();
        if self.memo.pending != NONE {
            let Some((run, taken)) = self.pending_run(events, tables) else {
                return;
            };
            i = taken;
            self.run_event(run, self.memo.events[run as usize], 0, tables);
        }
        while i < events.len() {
            if self.memo.fast_backoff == 0 {
                let (j, rest) = self.run_fast(events, i);
                // Where they get nowhere (the general path's business at every event), the
                // fast loops cost more than they save: let a few events go the general way.
                if j < i + 2 {
                    self.memo.fast_backoff = FAST_BACKOFF;
                }
                i = j;
                if let Some((run, pos)) = rest {
                    self.run_event(run, self.memo.events[run as usize], pos, tables);
                    continue;
                }
            } else {
                self.memo.fast_backoff -= 1;
            }
            if i >= events.len() {
                break;
            }
            match self.next_run(events, &mut i, tables) {
                NextRun::Run(run) => self.run_event(run, self.memo.events[run as usize], 0, tables),
                NextRun::Skip => {}
                NextRun::Pending => break,
            }
        }
    }

    /// The run the superblock left by the previous piece of events stands for (its extent
    /// is this piece's first event), and the events of this piece it took (0 or 1); `None`
    /// if the piece is empty (the superblock still waits).
    pub(crate) fn pending_run(&mut self, events: &[u32], tables: &Tables) -> Option<(u32, usize)> {
        let &next = events.first()?;
        self.learn_event(next, tables);
        let sb = std::mem::replace(&mut self.memo.pending, NONE);
        let exited = self.exits(sb, next);
        Some((if exited { next } else { sb }, exited as usize))
    }

    /// The run that event `events[*i]` begins (a basic block, a superblock run to its end, or
    /// one left at a side exit, which the next event then is), with `*i` moved past it;
    /// [`NextRun::Pending`] if it is a superblock whose extent the next piece of events tells
    /// (kept in `MemoState::pending`).
    #[inline(always)]
    pub(crate) fn next_run(&mut self, events: &[u32], i: &mut usize, tables: &Tables) -> NextRun {
        let e = events[*i];
        *i += 1;
        if !is_id(e) || !self.learn_event(e, tables) {
            return NextRun::Skip;
        }
        if !self.memo.events[e as usize].is_superblock {
            return NextRun::Run(e);
        }
        let Some(&next) = events.get(*i) else {
            self.memo.pending = e;
            return NextRun::Pending;
        };
        self.learn_event(next, tables);
        // Branch-free: whether a superblock left early is the guest's own branch, often
        // unpredictable.
        let exited = self.exits(e, next);
        *i += exited as usize;
        NextRun::Run(if exited { next } else { e })
    }

    /// The runs of a repeated event the last [`record`](PathRecorder::record) found, for
    /// [`Tables::record_with_repeats`] of the same events.
    pub(crate) fn repeats(&self) -> &[(u32, u32)] {
        &self.memo.repeats
    }

    /// Makes sure event id `e` is known (a syscall event is not an id). Returns false if
    /// `tables` do not know it (a bug: ids are catalogued before they run).
    #[inline(always)]
    pub(crate) fn learn_event(&mut self, e: u32, tables: &Tables) -> bool {
        if is_id(e) && e as usize >= self.memo.events.len() {
            self.learn_known(tables);
        }
        (e as usize) < self.memo.events.len()
    }

    /// Whether `next`, the event after superblock `sb`, is one of `sb`'s side exits (which
    /// then stands for the blocks `sb` ran); else `sb` ran to its end.
    #[inline(always)]
    pub(crate) fn exits(&self, sb: u32, next: u32) -> bool {
        self.memo
            .events
            .get(next as usize)
            .is_some_and(|n| n.superblock == sb)
    }

    /// Runs the superblock still waiting for its next event to its end.
    pub(crate) fn flush_pending(&mut self, tables: &Tables) {
        let pending = std::mem::replace(&mut self.memo.pending, NONE);
        if pending != NONE {
            self.run_event(pending, self.memo.events[pending as usize], 0, tables);
        }
    }

    /// Steps the basic blocks event `e` stands for, from position `pos` on.
    #[inline(always)]
    fn run_event(&mut self, e: u32, info: EventInfo, mut pos: u32, tables: &Tables) {
        let EventInfo { start, len, .. } = info;
        while pos < len {
            let b = self.memo.seq[(start + pos) as usize];
            let key = memo_key(e, pos);
            pos = match self.context(b) {
                Context::Path if key != NO_KEY => self.run_memo(key, start, pos, len, tables),
                Context::Return if key != NO_KEY => {
                    self.run_return(b, key, start, pos, len, tables)
                }
                Context::Call => {
                    // `memo.last` stays: the callee's first memo is predicted from the caller's
                    // last one (and checked against the callee's root before use).
                    self.step(b, tables);
                    pos + 1
                }
                _ => {
                    self.memo.last = NONE;
                    self.step(b, tables);
                    pos + 1
                }
            };
        }
    }

    /// What the per-block step would do with block `b`, as far as the block before it decides
    /// (validity rule 1; rule 2 is the memo's).
    #[inline(always)]
    fn context(&self, b: u32) -> Context {
        let (Some(top), false) = (self.stack.last(), self.prev == NONE) else {
            return Context::Step;
        };
        match self.id_kind[self.prev as usize] {
            K_OTHER => Context::Path,
            K_INDIRECT
                if self.id_node[b as usize].0 == top.func
                    && self.id_addr[b as usize] != top.return_to =>
            {
                Context::Path
            }
            K_RET if self.stack.len() >= 2 && top.return_to == self.id_addr[b as usize] => {
                Context::Return
            }
            // A call carried out without a block of its callee (the vsyscall page's entries,
            // which the runtime emulates): the caller's path goes on at the return point.
            K_CALL if self.id_addr[b as usize] == self.id_ret[self.prev as usize] => Context::Path,
            K_CALL => Context::Call,
            _ => Context::Step,
        }
    }

    /// Runs the segment at position `pos` of the event keyed `key` (blocks
    /// `seq[start..start + len]`) on the top activation's path. Returns the position after it.
    #[inline(always)]
    fn run_memo(&mut self, key: u32, start: u32, pos: u32, len: u32, tables: &Tables) -> u32 {
        // The common case, a short chain of loads: the memo that follows the last one.
        match self.run_predicted(key) {
            Some(end) => end,
            None => self.run_segment(key, start, pos, len, tables),
        }
    }

    /// A plain return to block `b` (the top frame's return address, with a frame below): pops
    /// the top activation, then the caller's path goes on at `b` as after any other block —
    /// through a memo, predicted from the one that ended with the caller's call. Returns the
    /// position after the segment.
    fn run_return(
        &mut self,
        b: u32,
        key: u32,
        start: u32,
        pos: u32,
        len: u32,
        tables: &Tables,
    ) -> u32 {
        let caller = &self.stack[self.stack.len() - 2];
        let entry = self.id_entry[b as usize];
        if entry != NONE && entry != caller.func {
            // The per-block step continues the caller's path with `b` even so; a memo from
            // here would stop before it (a tail call): step it.
            self.memo.last = NONE;
            self.step(b, tables);
            return pos + 1;
        }
        self.pop_activation();
        self.memo.last = self.stack.last().expect("the caller").resume;
        self.run_memo(key, start, pos, len, tables)
    }

    /// Applies the memo that followed the last one applied under `key` (not [`NO_KEY`]), if
    /// there is one, it is still valid and it starts at the top activation's current path.
    /// Returns the position after its segment.
    #[inline(always)]
    fn run_predicted(&mut self, key: u32) -> Option<u32> {
        let last = self.memo.last;
        if last == NONE {
            return None;
        }
        let l = &self.memo.memos[last as usize];
        // Branch-free choice: which successor comes is often the guest's own unpredictable
        // branch.
        let second = (l.succ_key[1] == key) as usize;
        if l.succ_key[second] != key {
            return None;
        }
        let succ = l.succ[second];
        let m = &self.memo.memos[succ as usize];
        let top = self.stack.last().expect("an activation");
        if m.epoch != self.memo.epoch || m.from != top.cur {
            return None;
        }
        self.memo.last = succ;
        Some(self.apply_memo(succ))
    }

    /// Runs the segment that starts at position `pos` of the event keyed `key` (blocks
    /// `seq[start..start + len]`), from a memo when there is a valid one, and remembers it as
    /// a successor of the last memo. Returns the position after it.
    #[inline]
    fn run_segment(&mut self, key: u32, start: u32, pos: u32, len: u32, tables: &Tables) -> u32 {
        let last = self.memo.last;
        let from = self.stack.last().expect("an activation").cur;
        let slot = slot_of(from, key);
        let s = self.memo.cache[slot];
        let m = if s.from == from && s.key == key {
            s.memo
        } else {
            match self.memo.map.get(&(from, key)) {
                Some(&m) => {
                    self.memo.cache[slot] = Slot { from, key, memo: m };
                    m
                }
                None => NONE,
            }
        };
        let (m, end) = if m != NONE && self.memo.memos[m as usize].epoch == self.memo.epoch {
            (m, self.apply_memo(m))
        } else {
            self.make_memo(from, key, start, pos, len, tables)
        };
        if last != NONE && m != NONE {
            let l = &mut self.memo.memos[last as usize];
            if l.succ_key[0] == key || l.succ_key[1] == key {
                // A successor from an older epoch or from another path: replaced in place.
                l.succ[(l.succ_key[1] == key) as usize] = m;
            } else {
                l.succ = [m, l.succ[0]];
                l.succ_key = [key, l.succ_key[0]];
            }
        }
        self.memo.last = m;
        end
    }

    /// Applies memo `m` to the top activation. Returns the position after its segment.
    #[inline(always)]
    fn apply_memo(&mut self, m: u32) -> u32 {
        let memo = &mut self.memo.memos[m as usize];
        memo.count += 1;
        let memo = *memo;
        let top = self.stack.last_mut().expect("an activation");
        top.cur = memo.next;
        top.len = memo.len;
        top.last_addr = memo.last_addr;
        top.blocks += memo.blocks as u64;
        top.instructions += self.memo.instr[m as usize];
        top.path_ends += memo.nends as u64;
        self.prev = memo.last;
        if memo.nends > 0 && (top.pap != NONE || self.config.k > 0) {
            self.replay_ends(&memo);
        }
        memo.end as u32
    }

    /// Feeds a memo's ended paths, in order, to the k-slab forest and the PAP run of the top
    /// activation (what `count_path` and `end_path` do besides counting).
    #[cold]
    fn replay_ends(&mut self, memo: &Memo) {
        let top = self.stack.last_mut().expect("an activation");
        let ended = memo.ends as usize..memo.ends as usize + memo.nends as usize;
        if self.config.k > 0 {
            if let Some(k) = self.funcs[top.func as usize].kslab.as_mut() {
                for &p in &self.memo.ends[ended.clone()] {
                    k.push(hotpath_pathprof::PathId(p as u64));
                }
            }
        }
        push_pap_runs(&mut self.pap_runs, top, &self.memo.ends[ended], 1);
    }

    /// Steps the segment starting at position `pos` block by block from trie node `from`,
    /// and memoises it under `(from, key)`. Returns the memo ([`NONE`] if the segment was
    /// empty: its first block is another function's entry, stepped as a tail call) and the
    /// position after it.
    #[cold]
    fn make_memo(
        &mut self,
        from: u32,
        key: u32,
        start: u32,
        pos: u32,
        len: u32,
        tables: &Tables,
    ) -> (u32, u32) {
        let func = self.stack.last().expect("an activation").func;
        let ends = self.memo.ends.len() as u32;
        let (mut blocks, mut instr, mut nends) = (0, 0u64, 0);
        let mut at = pos;
        while at < len {
            let b = self.memo.seq[(start + at) as usize];
            let entry = self.id_entry[b as usize];
            if entry != NONE && entry != func {
                break; // A tail call: the per-block step's business.
            }
            let top = self.stack.last().expect("an activation");
            let (path_len, path_instr) = (top.len, self.path_instructions(top.cur));
            self.prev = b;
            let p = self.step_intra(b, tables);
            if p != NONE {
                self.memo.ends.push(p);
                nends += 1;
                blocks += path_len;
                instr += path_instr;
            }
            at += 1;
            if self.id_kind[b as usize] != K_OTHER {
                break;
            }
        }
        if at == pos {
            let b = self.memo.seq[(start + pos) as usize];
            self.step(b, tables);
            return (NONE, pos + 1);
        }
        let top = self.stack.last().expect("an activation");
        let m = self.memo.memos.len() as u32;
        self.memo.instr.push(instr);
        self.memo.memos.push(Memo {
            count: 0,
            last_addr: top.last_addr,
            succ: [NONE; 2],
            succ_key: [NO_KEY; 2],
            next: top.cur,
            len: top.len,
            from,
            last: self.prev,
            blocks,
            ends,
            epoch: self.memo.epoch,
            nends,
            end: at as u8,
            last_kind: self.id_kind[self.prev as usize],
        });
        self.memo.map.insert((from, key), m);
        self.memo.cache[slot_of(from, key)] = Slot { from, key, memo: m };
        (m, at)
    }

    /// Adds the runs of every memo since the last call to the counts of the paths it ends.
    pub(crate) fn settle_memos(&mut self) {
        for memo in &mut self.memo.memos {
            if memo.count == 0 {
                continue;
            }
            let ends = memo.ends as usize..memo.ends as usize + memo.nends as usize;
            for &p in &self.memo.ends[ends] {
                self.paths[p as usize].count += memo.count;
            }
            memo.count = 0;
        }
    }
}
