//! Hot-path decisions: which superblocks to ask the translator for, and along which path.
//!
//! After the monitor-thread patent (CN101593125, DESIGN.md "Monitor"): when a block passes a
//! hot threshold (3000 executions by default), the monitor asks the translator for a
//! superblock. A trace head is, as in Dynamo's NET and DynamoRIO ("a trace head is either a
//! link from a trace or a backward direct branch"), the target of a hot *backward* edge — a
//! loop head, so every hot loop gets one — or a hot exit from a superblock: where a trace's
//! side exit or final indirect branch often leads (an interpreter's opcode handlers, the code
//! after a loop), so the code between traces is covered too; and when no direction of a
//! head's branch dominates, its hot successors become heads in turn. Straight-line code
//! reached only from basic blocks is left alone. From the head the trace follows each
//! block's most frequent successor (the monitor's exact edge counts) while the successor is a
//! static one (direct jump, fall-through, call or either branch direction) or the usual target
//! of a return, indirect jump or indirect call, until it comes back to the head, reaches an
//! indirect branch without a usual target, a system call or a trap, or grows too long; a trace that runs into a superblock takes over that
//! superblock's blocks and goes on along where that superblock's own runs went after its end:
//! the superblock's successor counts follow its whole path, so they can name the usual target
//! of a branch whose block-level counts are spread (an interpreter's dispatch after one
//! opcode's handler). For the same reason a superblock that mostly runs to its end is extended
//! along its own successors (`Decisions::extend`), one step of context at a time.
//! A loop that closes within the trace is unrolled up to [`UNROLL_INSTRUCTIONS`], so that one
//! event (and one full-ring check) covers several iterations.
//! A superblock that leaves through side exits more often than it runs to its end is
//! re-formed along where those exits went (`Decisions::reform`): the #40 rule that a trace
//! ends where its side exits say it should.

use hotpath_events::{Command, IdKind, MAX_TRACE_BLOCKS};
use hotpath_ir::{BlockId, Terminator};
use rustc_hash::FxHashSet;

use crate::Tables;

/// Default hot threshold: executions of a loop's back edge before its superblock is
/// requested (the patent's 3000 for a direct-branch block).
pub const DEFAULT_SUPERBLOCK_THRESHOLD: u64 = 3000;

/// Guest instructions a trace stops growing at (before unrolling).
pub const MAX_TRACE_INSTRUCTIONS: u32 = 256;

/// A trace follows a block's most frequent successor only when it took at least this share of
/// the block's executions; otherwise the block ends the trace (both directions become normal
/// exits), because a side exit costs an extra event.
pub const MIN_SUCCESSOR_SHARE: f64 = 0.7;

/// A closed loop is unrolled only when a run of its trace comes back to the head at least this
/// often (the product of the shares along it). Unrolling does not add events where the loop
/// leaves its hot path (one side exit each, unrolled or not) and saves one per iteration that
/// a copy covers; the threshold keeps copies that would mostly go unused out of the code
/// cache. Measured on busybox gzip (longest_match's loop comes back 0.88 of the time): 0.85
/// left it one event per iteration; at 0.5, 104M events became 67M.
pub const MIN_UNROLL_SHARE: f64 = 0.5;

/// A loop that closes within its trace is repeated until the trace has about this many guest
/// instructions: a 4-instruction loop body becomes 12 copies, one event per 12 iterations.
/// Longer bodies gain less from unrolling (the event is a smaller share of their cost).
pub const UNROLL_INSTRUCTIONS: u32 = 48;

/// A superblock is looked at again when more of its runs left through side exits than ran
/// to its end, after at least this many entries per hot threshold (16 × 3000 by default): a
/// trace chosen from the first few thousand runs may follow a path the program then leaves
/// (a loop that fills a table, then one that sorts it), and each side exit costs an event
/// and the blocks after it.
const REFORM_MIN_ENTRIES: u64 = 16;

/// Ring events between two looks at the superblocks' side exits, at least; and per id the
/// monitor knows (a look walks them all: about 0.1 ms for python3's 100,000).
const REFORM_SCAN_EVENTS: u64 = 1 << 18;
const REFORM_SCAN_EVENTS_PER_ID: u64 = 16;

/// A superblock whose look asked for nothing is looked at again once its entries have grown
/// this many times: the shares a look weighs change only as new runs add up, and a program
/// with thousands of superblocks spent a quarter of the monitor's time choosing the same
/// traces again at every look (cc1, 17,000 superblocks, a look every 6.7 M events). A
/// superblock is then looked at a logarithmic number of times over its life.
const RELOOK_GROWTH: u64 = 2;

/// Times one head's superblock is re-formed at most.
const MAX_REFORMS: u32 = 2;

/// Times one head's superblock is extended past its end at most (each extension adds at
/// least one block, up to [`MAX_TRACE_BLOCKS`] and [`MAX_TRACE_INSTRUCTIONS`]).
const MAX_EXTENSIONS: u32 = 16;

/// Times a head whose trace could not be chosen yet (its successors' counts still split or
/// too even) is looked at again, once per later call of [`Decisions::decide`].
const RETRIES: u32 = 16;

/// Superblocks requested per step of the hot threshold: after `n` requests a new head needs
/// `1 + n / SUPERBLOCKS_PER_THRESHOLD_STEP` times the threshold it was given. Each superblock
/// is code beside its blocks' (tail-duplicated, unrolled), and a program whose superblocks
/// outgrow the caches runs slower for them: `cc1 -O2` of 16,000 lines, 21,000 superblocks at a
/// fixed threshold of 3000, ran 11.4-14.6 s as shipped, 12.3 s without superblocks and 10.2 s
/// at 30,000 (docs/measurements.md, 2026-12-02). Programs with few hot loops never reach a
/// step; a big one keeps forming superblocks only for what runs most.
pub const SUPERBLOCKS_PER_THRESHOLD_STEP: u64 = 1024;

/// What the decisions remember between calls.
#[derive(Clone, Default)]
pub struct Decisions {
    /// Heads (basic block ids) asked for, or given up on.
    requested: FxHashSet<u32>,
    /// Heads to look at again, with the tries left.
    retry: Vec<(u32, u32)>,
    /// Superblocks requested.
    pub requests: u64,
    /// Heads whose superblock was re-formed, with how many times.
    reformed: rustc_hash::FxHashMap<u32, u32>,
    /// Heads whose superblock was extended past its end, with how many times.
    extended: rustc_hash::FxHashMap<u32, u32>,
    /// Superblocks (ids) re-formed: replaced, so their counts no longer grow.
    replaced: FxHashSet<u32>,
    /// Superblocks (ids) whose last look asked for nothing, with their entries then: each is
    /// looked at again once its entries have grown [`RELOOK_GROWTH`] times.
    settled: rustc_hash::FxHashMap<u32, u64>,
    /// Looks taken at superblocks so far (for the tests).
    looks: u64,
    /// The event count at which the superblocks' side exits are looked at next.
    next_scan: u64,
    /// The hot threshold the tables were given (0: not read yet), which
    /// [`SUPERBLOCKS_PER_THRESHOLD_STEP`] raises `tables.hot_threshold` from.
    base_threshold: u64,
    /// The usual successors of ids with many, as last found.
    memo: HotMemo,
}

impl Decisions {
    /// True when [`Self::decide`] has work besides new hot pairs: a look at the superblocks'
    /// side exits is due.
    ///
    /// A superblock is looked at once it has had [`REFORM_MIN_ENTRIES`] entries per hot
    /// threshold in this thread's stream, so no look is due before the stream has had that
    /// many events: a thread that runs briefly never scans the process's ids (a python3
    /// program that started and joined 200 threads scanned them 200 times).
    pub fn scan_due(&self, tables: &Tables) -> bool {
        let first = REFORM_MIN_ENTRIES.saturating_mul(tables.hot_threshold.max(1));
        tables.events >= self.next_scan.max(first)
    }

    /// Looks at the event pairs that just became hot (`tables.hot`, emptied) and, when due,
    /// at the superblocks' side exits, and returns the superblocks to request.
    pub fn decide(&mut self, tables: &mut Tables) -> Vec<Command> {
        if self.base_threshold == 0 {
            self.base_threshold = tables.hot_threshold;
        }
        let hot = std::mem::take(&mut tables.hot);
        let mut out = Vec::new();
        if self.scan_due(tables) {
            let per_ids = REFORM_SCAN_EVENTS_PER_ID * tables.known() as u64;
            self.next_scan = tables.events + REFORM_SCAN_EVENTS.max(per_ids);
            self.reform(tables, &mut out);
        }
        let mut heads: Vec<(u32, u32)> = std::mem::take(&mut self.retry);
        for (from, to) in hot {
            if let Some(head) = trace_head(tables, from, to) {
                if self.requested.insert(head) {
                    heads.push((head, RETRIES));
                }
            }
        }
        for (head, tries) in heads {
            match trace_from(tables, &mut self.memo, head) {
                Some(blocks) => {
                    self.requests += 1;
                    out.push(Command::FormSuperblock { blocks });
                }
                None if tries > 0 => self.retry.push((head, tries - 1)),
                None => {
                    // No direction of the head dominates: its hot successors become heads
                    // (a trace can start after the branch that no trace can cross).
                    for (to, c) in tables.successors_of(head) {
                        if c >= tables.hot_threshold
                            && is_block(tables, to)
                            && self.requested.insert(to)
                        {
                            self.retry.push((to, RETRIES));
                        }
                    }
                }
            }
        }
        if self.base_threshold != u64::MAX {
            let step = 1 + self.requests / SUPERBLOCKS_PER_THRESHOLD_STEP;
            tables.hot_threshold = self.base_threshold.saturating_mul(step);
        }
        out
    }
}

impl Decisions {
    /// Re-forms each superblock that, after [`REFORM_MIN_ENTRIES`] entries per hot threshold,
    /// left through side exits more often than it ran to its end (the monitor counts every
    /// exit): the new trace keeps the blocks up to the most taken side exit and goes on along
    /// where that exit leads, chosen as [`trace_from`] chooses (DynamoRIO's rule that a hot
    /// trace exit heads a trace, applied inside the trace). At most [`MAX_REFORMS`] times per
    /// head; nothing when the trace would not change.
    fn reform(&mut self, tables: &Tables, out: &mut Vec<Command>) {
        let min_entries = REFORM_MIN_ENTRIES * tables.hot_threshold.max(1);
        for (id, kind) in tables.kinds().enumerate() {
            let IdKind::Superblock { blocks } = kind else {
                continue;
            };
            let id = id as u32;
            if self.replaced.contains(&id) {
                continue;
            }
            let x = Exits::of(tables, id, blocks.len());
            if x.entries < min_entries {
                continue;
            }
            if self
                .settled
                .get(&id)
                .is_some_and(|&then| x.entries < RELOOK_GROWTH * then)
            {
                continue;
            }
            let asked = out.len();
            self.look(tables, id, blocks, &x, out);
            if out.len() == asked {
                self.settled.insert(id, x.entries);
            }
        }
    }

    /// The look of [`Self::reform`] at superblock `id` (`blocks`), whose runs ended as `x`
    /// says: extended if it mostly ran to its end, else re-formed along its most taken exit.
    fn look(
        &mut self,
        tables: &Tables,
        id: u32,
        blocks: &[BlockId],
        x: &Exits,
        out: &mut Vec<Command>,
    ) {
        self.looks += 1;
        let head = blocks[0].0;
        if !x.mostly_early() {
            self.extend(tables, id, blocks, out);
            return;
        }
        if self.reformed.get(&head).is_some_and(|&t| t >= MAX_REFORMS) {
            return;
        }
        let (_, after, exit) = x.worst;
        let prefix: Vec<u32> = blocks[..=after as usize].iter().map(|b| b.0).collect();
        // Along the exit when most runs that reach its block go where the exit's runs
        // mostly go; else the trace ends at that block (a branch or a return whose targets
        // are as frequent: no trace crosses it, as `trace_from` would decide).
        let trace = if x.follow_exit(tables, &mut self.memo) {
            extend_trace(tables, &mut self.memo, prefix, Some(exit))
        } else if prefix.len() >= 2 {
            Some(prefix.into_iter().map(BlockId).collect())
        } else {
            None
        };
        if let Some(trace) = trace {
            if self.replace(id, blocks, trace, out) {
                *self.reformed.entry(head).or_insert(0) += 1;
            }
        }
    }

    /// Asks for `trace` in place of superblock `id` (`blocks`) unless it is the same trace;
    /// returns whether it asked. The replaced superblock's counts no longer grow.
    fn replace(
        &mut self,
        id: u32,
        blocks: &[BlockId],
        trace: Vec<BlockId>,
        out: &mut Vec<Command>,
    ) -> bool {
        if trace[..] == blocks[..] {
            return false;
        }
        self.replaced.insert(id);
        self.requests += 1;
        out.push(Command::ReformSuperblock { blocks: trace });
        true
    }
}

impl Decisions {
    /// Extends superblock `id` (`blocks`), which mostly ran to its end, along where its runs
    /// went on after it: [`extend_trace`] from its last block with its own successor counts,
    /// which know its whole path (after an interpreter's handler for one opcode, the next
    /// opcode's handler is the usual target of a dispatch whose block-level counts are
    /// spread over every opcode). At most [`MAX_EXTENSIONS`] times per head; nothing when the
    /// trace would not change (no usual successor, or the trace is as long as it can be).
    fn extend(&mut self, tables: &Tables, id: u32, blocks: &[BlockId], out: &mut Vec<Command>) {
        let head = blocks[0].0;
        if self
            .extended
            .get(&head)
            .is_some_and(|&t| t >= MAX_EXTENSIONS)
        {
            return;
        }
        let prefix: Vec<u32> = blocks.iter().map(|b| b.0).collect();
        let Some(trace) = extend_trace(tables, &mut self.memo, prefix, Some(id)) else {
            return;
        };
        if self.replace(id, blocks, trace, out) {
            *self.extended.entry(head).or_insert(0) += 1;
        }
    }
}

/// How superblock `id`'s runs ended so far: its entries, its side exits by position, and its
/// most taken side exit as (count, position, the exit's event id).
#[derive(Clone)]
struct Exits {
    entries: u64,
    by_position: Vec<u64>,
    worst: (u64, u32, u32),
}

impl Exits {
    fn of(tables: &Tables, id: u32, len: usize) -> Exits {
        Exits::counted(tables, id, len).0
    }

    /// [`Exits::of`], with the number of successors it looked at.
    fn counted(tables: &Tables, id: u32, len: usize) -> (Exits, usize) {
        let mut x = Exits {
            entries: 0,
            by_position: vec![0; len],
            worst: (0, 0, 0),
        };
        let successors = tables.successors_of(id);
        let n = successors.len();
        for (to, c) in successors {
            x.entries += c;
            if let Some(IdKind::SideExit { superblock, after }) = tables.kind(to) {
                if superblock.0 == id {
                    x.worst = x.worst.max((c, *after, to));
                    if let Some(n) = x.by_position.get_mut(*after as usize) {
                        *n += c;
                    }
                }
            }
        }
        (x, n)
    }

    /// True if more runs left early than ran to the end.
    fn mostly_early(&self) -> bool {
        self.by_position.iter().sum::<u64>() * 2 > self.entries
    }

    /// True if a trace reaching the most taken exit's block should go where that exit's
    /// runs went: 70 % of the runs reaching the block went there ([`MIN_SUCCESSOR_SHARE`]).
    fn follow_exit(&self, tables: &Tables, memo: &mut HotMemo) -> bool {
        let (left, after, exit) = self.worst;
        let reached = self.entries - self.by_position[..after as usize].iter().sum::<u64>();
        let along_exit = memo.hottest(tables, exit).map_or(0.0, |(_, share)| share);
        left as f64 * along_exit >= MIN_SUCCESSOR_SHARE * reached as f64
    }
}

fn is_block(tables: &Tables, id: u32) -> bool {
    matches!(tables.kind(id), Some(IdKind::Block))
}

/// The head of a trace for the hot pair `from → to`: `to`, when it is a basic block that a
/// superblock (`from`, or its side exit) leads to, or that is at or before the block `from`
/// ended with (a backward edge: `to` heads a loop).
fn trace_head(tables: &Tables, from: u32, to: u32) -> Option<u32> {
    if !is_block(tables, to) || from as usize >= tables.known() {
        return None;
    }
    if !is_block(tables, from) {
        return Some(to);
    }
    let source = tables.summary(tables.last_block(from))?;
    let target = tables.summary(to)?;
    (target.start <= source.start).then_some(to)
}

/// Ids with at least this many successors have their usual one remembered ([`HotMemo`]):
/// finding it costs a look at each.
const HOT_MEMO_MIN_SUCCESSORS: usize = 64;

/// Events for which a remembered usual successor stands before it is looked for again.
const HOT_MEMO_EVENTS: u64 = 1 << 16;

/// The usual successors ([`HotMemo::hottest`]) of the ids with [`HOT_MEMO_MIN_SUCCESSORS`] or
/// more, with the event count when each was found. A call through a table of 22,000
/// functions has as many successors, and each of their 22,000 returns heads a trace that
/// reaches that call again: looking through them every time made a generated program of
/// 110,000 blocks (6 ms natively) run 24 s with a superblock at every hot loop head.
#[derive(Clone, Default)]
struct HotMemo {
    by_id: rustc_hash::FxHashMap<u32, (u64, Option<(u32, f64)>)>,
    /// The same for [`Exits::of`] superblocks with many successors (a trace through the
    /// superblock at such a call's loop head looks at how its runs ended).
    exits: rustc_hash::FxHashMap<u32, (u64, Exits)>,
}

impl HotMemo {
    /// [`Exits::of`] superblock `id` (`len` blocks), as found at most [`HOT_MEMO_EVENTS`]
    /// events ago for one with many successors.
    fn exits(&mut self, tables: &Tables, id: u32, len: usize) -> Exits {
        if let Some((at, x)) = self.exits.get(&id) {
            if tables.events.saturating_sub(*at) < HOT_MEMO_EVENTS && x.by_position.len() == len {
                return x.clone();
            }
        }
        let (x, successors) = Exits::counted(tables, id, len);
        if successors >= HOT_MEMO_MIN_SUCCESSORS {
            self.exits.insert(id, (tables.events, x.clone()));
        }
        x
    }

    /// The successor of `id` that followed it most often, with its share of `id`'s
    /// successors, as found at most [`HOT_MEMO_EVENTS`] events ago for an id with many.
    /// Successors that start at the same guest address count as one: a block and the
    /// superblock that replaced it as the entry of its address (the superblock is returned).
    fn hottest(&mut self, tables: &Tables, id: u32) -> Option<(u32, f64)> {
        if let Some(&(at, found)) = self.by_id.get(&id) {
            if tables.events.saturating_sub(at) < HOT_MEMO_EVENTS {
                return found;
            }
        }
        let successors = tables.successors_of(id);
        let many = successors.len() >= HOT_MEMO_MIN_SUCCESSORS;
        let mut by_addr: rustc_hash::FxHashMap<u64, (u32, u64)> = rustc_hash::FxHashMap::default();
        by_addr.reserve(successors.len());
        let mut total = 0;
        for (to, c) in successors {
            total += c;
            let Some((start, superblock)) = tables.start_of(to) else {
                continue;
            };
            let e = by_addr.entry(start).or_insert((to, 0));
            e.1 += c;
            if superblock {
                e.0 = to;
            }
        }
        let found = by_addr
            .into_iter()
            .max_by_key(|&(addr, (_, c))| (c, std::cmp::Reverse(addr)))
            .map(|(_, (to, c))| (to, c as f64 / total.max(1) as f64));
        if many {
            self.by_id.insert(id, (tables.events, found));
        }
        found
    }
}

/// The trace from `head` along the most frequent static successors, unrolled when it closes
/// a loop; `None` when it would be a single block that is not a loop (nothing to gain).
fn trace_from(tables: &Tables, memo: &mut HotMemo, head: u32) -> Option<Vec<BlockId>> {
    extend_trace(tables, memo, vec![head], None)
}

/// [`trace_from`] the trace's first blocks `trace` (basic block ids, not empty), going on
/// from its last one along the most frequent static successors; the first step along those
/// of event `via` instead, when given (a superblock's side exit after that block: where the
/// runs that left the superblock there went; or a superblock: where its runs went after its
/// end).
fn extend_trace(
    tables: &Tables,
    memo: &mut HotMemo,
    mut trace: Vec<u32>,
    mut via: Option<u32>,
) -> Option<Vec<BlockId>> {
    let head = trace[0];
    let mut instructions: u32 = trace
        .iter()
        .map(|&b| tables.summary(b).expect("a known id").instructions)
        .sum();
    let mut closed = false;
    // Probability that a run reaching the current block came along the trace.
    let mut along = 1.0;
    let mut cur = *trace.last()?;
    while trace.len() < MAX_TRACE_BLOCKS && instructions < MAX_TRACE_INSTRUCTIONS {
        let b = tables.summary(cur).expect("a known id");
        // A step chosen from a superblock's or a side exit's successors knows the path that
        // led there: a block the trace has already (an interpreter's dispatch, between two
        // handlers) may come again.
        let from = via.take();
        let Some((next, share)) = memo.hottest(tables, from.unwrap_or(cur)) else {
            break;
        };
        if share < MIN_SUCCESSOR_SHARE {
            break;
        }
        // A superblock next: the trace goes on along its blocks and ends where it ends (the
        // counts of its blocks stopped growing when it was built; its trace is their hot path).
        let (first, rest): (u32, &[BlockId]) = match tables.trace(next) {
            Some(t) => (t[0].0, &t[1..]),
            None if is_block(tables, next) => (next, &[]),
            None => break,
        };
        along *= share;
        let n = tables.summary(first).expect("a known id");
        let static_successor = match b.terminator {
            Terminator::Jump { target } | Terminator::FallThrough { next: target } => {
                target == n.start
            }
            Terminator::Call { target, .. } => target == n.start,
            Terminator::Branch {
                taken, not_taken, ..
            } => taken == n.start || not_taken == n.start,
            // A return, indirect jump or indirect call whose target is predictable enough
            // (the share test above): inlined behind a compare with the predicted target.
            Terminator::Return | Terminator::IndirectJump | Terminator::IndirectCall { .. } => true,
            _ => false,
        };
        if !static_successor {
            break;
        }
        if first == head {
            closed = true;
            break;
        }
        if from.is_none() && trace.contains(&first) {
            break;
        }
        if !rest.is_empty() || first != next {
            let room = MAX_TRACE_BLOCKS - trace.len();
            // A superblock that mostly left early: its blocks up to its most taken exit, then
            // on as its re-forming would go (its path after that is one the runs left).
            let x = memo.exits(tables, next, rest.len() + 1);
            if x.entries >= tables.hot_threshold && x.mostly_early() {
                let (_, after, exit) = x.worst;
                let upto = (after as usize + 1).min(room);
                trace.push(first);
                trace.extend(rest.iter().take(upto - 1).map(|b| b.0));
                instructions += trace[trace.len() - upto..]
                    .iter()
                    .map(|&b| tables.summary(b).expect("a known id").instructions)
                    .sum::<u32>();
                if upto == after as usize + 1 && x.follow_exit(tables, memo) {
                    cur = *trace.last()?;
                    via = Some(exit);
                    continue;
                }
                break;
            }
            trace.push(first);
            trace.extend(rest.iter().take(room - 1).map(|b| b.0));
            if rest.len() >= room {
                break;
            }
            // Whole: on along where that superblock's own runs went after its end (its
            // successor counts follow its whole path, so a target its last block's counts
            // find too spread may be the usual one after this path).
            instructions += std::iter::once(first)
                .chain(rest.iter().map(|b| b.0))
                .map(|b| tables.summary(b).expect("a known id").instructions)
                .sum::<u32>();
            cur = *trace.last()?;
            via = Some(next);
            continue;
        }
        trace.push(next);
        instructions += n.instructions;
        cur = next;
    }
    if closed && along >= MIN_UNROLL_SHARE && instructions > 0 {
        let body = trace.clone();
        let mut total = instructions;
        while total < UNROLL_INSTRUCTIONS && trace.len() + body.len() <= MAX_TRACE_BLOCKS {
            trace.extend_from_slice(&body);
            total += instructions;
        }
    }
    if trace.len() < 2 {
        return None;
    }
    Some(trace.into_iter().map(BlockId).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hotpath_events::NewBlock;
    use hotpath_ir::{Cond, GuestAddr};
    use std::sync::Arc;

    use crate::tables::learn_test_block as block;

    fn requested(cmds: &[Command]) -> Vec<Vec<u32>> {
        cmds.iter()
            .filter_map(|c| match c {
                Command::FormSuperblock { blocks } => Some(blocks.iter().map(|b| b.0).collect()),
                _ => None,
            })
            .collect()
    }

    fn reformed(cmds: &[Command]) -> Vec<Vec<u32>> {
        cmds.iter()
            .filter_map(|c| match c {
                Command::ReformSuperblock { blocks } => Some(blocks.iter().map(|b| b.0).collect()),
                _ => None,
            })
            .collect()
    }

    /// A loop whose head branches to A in its first phase and to B in its second: its
    /// superblock, formed along A, leaves after the head on every run of the second phase, so
    /// it is re-formed along B once those exits outnumber its completed runs; a superblock
    /// whose exits stay fewer, or whose new trace would be the same, is left as it is.
    /// Guest address of the head block of [`superblock_over_a_branch`].
    const HEAD: u64 = 0x4000;

    /// Tables (hot threshold 10) over block 0 at [`HEAD`], a branch to block 1 (ending in
    /// `end`) or block 2 (a jump back to the head), and superblock 3 over blocks 0 and 1, with
    /// side exits 4 (after block 0) and 5 (after block 1).
    fn superblock_over_a_branch(end: Terminator) -> Tables {
        let mut t = Tables::default();
        t.hot_threshold = 10;
        let (a, b) = (0x4010, 0x4020);
        let branch = Terminator::Branch {
            cond: Cond::Ne,
            taken: GuestAddr(a),
            not_taken: GuestAddr(b),
        };
        block(&mut t, 0, HEAD, 2, branch);
        block(&mut t, 1, a, 3, end);
        let back = Terminator::Jump {
            target: GuestAddr(HEAD),
        };
        block(&mut t, 2, b, 3, back);
        let trace: Arc<[BlockId]> = vec![BlockId(0), BlockId(1)].into();
        t.learn(&NewBlock {
            id: BlockId(3),
            summary: *t.summary(0).expect("a known id"),
            kind: IdKind::Superblock { blocks: trace },
            code: Box::default(),
        });
        for after in 0..2u32 {
            t.learn(&NewBlock {
                id: BlockId(4 + after),
                summary: *t.summary(after).expect("a known id"),
                kind: IdKind::SideExit {
                    superblock: BlockId(3),
                    after,
                },
                code: Box::default(),
            });
        }
        t
    }

    #[test]
    fn a_superblock_that_mostly_side_exits_is_re_formed_along_its_exit() {
        for (phase2_runs, expect) in [(600, true), (100, false)] {
            let back = Terminator::Jump {
                target: GuestAddr(HEAD),
            };
            let mut t = superblock_over_a_branch(back);
            // Phase 1 before the superblock (0 → 1) and in it (3 runs to its end); phase 2 in
            // it: the side exit after the head (4), then block 2, back to the superblock.
            for _ in 0..30 {
                t.record(&[0, 1]);
            }
            for _ in 0..200 {
                t.record(&[3]);
            }
            for _ in 0..phase2_runs {
                t.record(&[3, 4, 2]);
            }
            let mut d = Decisions::default();
            let cmds = d.decide(&mut t);
            let got = reformed(&cmds);
            if expect {
                assert_eq!(got.len(), 1, "{got:?}");
                assert_eq!(&got[0][..2], &[0, 2], "along the exit: {got:?}");
                assert!(!got[0].contains(&1), "not along the old path: {got:?}");
            } else {
                // Mostly to its end: not re-formed along the exit (only unrolled, now that its
                // runs are seen to come back to its head).
                assert!(
                    got.iter().all(|g| !g.contains(&2)),
                    "200 runs to the end, 100 exits: {got:?}"
                );
            }
            // The next look finds the replaced superblock done with.
            t.events += REFORM_SCAN_EVENTS;
            assert!(reformed(&d.decide(&mut t)).is_empty());
        }
    }

    /// Superblock 3 ([0, 1]) runs to its end and on to one of three blocks in turn, so no
    /// extension is usual enough: its look asks for nothing, and it is looked at again only
    /// once its entries have doubled; then, now that its runs mostly leave by its side exit,
    /// it is re-formed.
    #[test]
    fn a_superblock_whose_look_asked_nothing_waits_until_its_runs_double() {
        let mut t = superblock_over_a_branch(Terminator::IndirectJump);
        for (id, addr) in [(6, 0x5000), (7, 0x5100), (8, 0x5200)] {
            let back = Terminator::Jump {
                target: GuestAddr(HEAD),
            };
            block(&mut t, id, addr, 1, back);
        }
        for k in 0..300 {
            t.record(&[3, 6 + k % 3]);
        }
        let mut d = Decisions::default();
        assert!(reformed(&d.decide(&mut t)).is_empty());
        assert_eq!(d.looks, 1);
        // 200 side exits: 500 entries, fewer than twice 300, so no look.
        for _ in 0..200 {
            t.record(&[3, 4, 2]);
        }
        t.events += REFORM_SCAN_EVENTS;
        assert!(reformed(&d.decide(&mut t)).is_empty());
        assert_eq!(d.looks, 1, "not looked at before its entries doubled");
        // 1,400 entries, 1,100 of them left early: looked at, re-formed along the exit.
        for _ in 0..900 {
            t.record(&[3, 4, 2]);
        }
        t.events += REFORM_SCAN_EVENTS;
        let got = reformed(&d.decide(&mut t));
        assert_eq!(d.looks, 2);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(&got[0][..2], &[0, 2], "along the exit: {got:?}");
    }

    /// An interpreter's loop: a dispatch block D (an indirect jump) and three handlers that
    /// jump back to it, run in the order H1 H2 H3 H1 … by the interpreted program. D's own
    /// counts are spread over the three, so each handler's superblock ends at D; but after
    /// H1's superblock comes H2's every time, so H1's is extended through D along H2's and
    /// H3's until it comes back to H1 (and is unrolled). When the program alternates H1 H2 H1
    /// H3, H1's superblock has no usual successor and stays as it is.
    #[test]
    fn a_superblock_is_extended_along_where_its_own_runs_went() {
        for (program, expect) in [(&[4u32, 7, 10][..], true), (&[4, 7, 4, 10][..], false)] {
            let mut t = Tables::default();
            t.hot_threshold = 10;
            let d = 0x5000;
            block(&mut t, 0, d, 4, Terminator::IndirectJump);
            let back = Terminator::Jump {
                target: GuestAddr(d),
            };
            for h in 1..=3u32 {
                block(&mut t, h, 0x5000 + 0x100 * h as u64, 3, back);
            }
            // Superblock 4 = [H1, D], 7 = [H2, D], 10 = [H3, D], each with two side exits.
            for (h, sb) in [(1u32, 4u32), (2, 7), (3, 10)] {
                let trace: Arc<[BlockId]> = vec![BlockId(h), BlockId(0)].into();
                t.learn(&NewBlock {
                    id: BlockId(sb),
                    summary: *t.summary(h).expect("a known id"),
                    kind: IdKind::Superblock { blocks: trace },
                    code: Box::default(),
                });
                for after in 0..2u32 {
                    t.learn(&NewBlock {
                        id: BlockId(sb + 1 + after),
                        summary: *t.summary(h).expect("a known id"),
                        kind: IdKind::SideExit {
                            superblock: BlockId(sb),
                            after,
                        },
                        code: Box::default(),
                    });
                }
            }
            for _ in 0..400 {
                t.record(program);
            }
            let mut dec = Decisions::default();
            let got = reformed(&dec.decide(&mut t));
            let from_h1: Vec<&Vec<u32>> = got.iter().filter(|g| g[0] == 1).collect();
            if expect {
                assert_eq!(from_h1.len(), 1, "{got:?}");
                assert_eq!(&from_h1[0][..6], &[1, 0, 2, 0, 3, 0], "{got:?}");
                assert!(from_h1[0].len() > 6, "unrolled once it closed: {got:?}");
            } else {
                assert!(from_h1.is_empty(), "H2 and H3 after H1 as often: {got:?}");
            }
        }
    }

    /// A two-block loop (A: 3 instructions, B: 5, B branches back to A 99 times in 100) is
    /// requested once its back edge is hot, from A, unrolled to about 48 instructions.
    #[test]
    fn a_hot_loop_is_requested_unrolled_from_its_head() {
        let mut t = Tables::default();
        t.hot_threshold = 50;
        let (a, b, exit) = (0x1000, 0x1010, 0x1020);
        block(
            &mut t,
            0,
            a,
            3,
            Terminator::Jump {
                target: GuestAddr(b),
            },
        );
        let back = Terminator::Branch {
            cond: Cond::Ne,
            taken: GuestAddr(a),
            not_taken: GuestAddr(exit),
        };
        block(&mut t, 1, b, 5, back);
        block(&mut t, 2, exit, 1, Terminator::Return);
        let mut d = Decisions::default();
        let mut cmds = Vec::new();
        for i in 0..100 {
            t.record(&[0, 1]);
            if i == 99 {
                t.record(&[2]);
            }
            cmds.extend(d.decide(&mut t));
        }
        // 8 instructions per iteration: 6 copies reach 48.
        assert_eq!(requested(&cmds), vec![[0, 1].repeat(6)]);
        assert_eq!(d.requests, 1);
    }

    /// The hot threshold rises by its starting value every
    /// [`SUPERBLOCKS_PER_THRESHOLD_STEP`] superblocks requested, and stays where the tables
    /// say "never" (`u64::MAX`, superblocks off).
    #[test]
    fn the_hot_threshold_rises_with_the_superblocks_requested() {
        let mut t = Tables::default();
        t.hot_threshold = 10;
        let mut d = Decisions::default();
        d.decide(&mut t);
        assert_eq!(t.hot_threshold, 10);
        d.requests = SUPERBLOCKS_PER_THRESHOLD_STEP - 1;
        d.decide(&mut t);
        assert_eq!(t.hot_threshold, 10);
        d.requests = SUPERBLOCKS_PER_THRESHOLD_STEP;
        d.decide(&mut t);
        assert_eq!(t.hot_threshold, 20);
        d.requests = 5 * SUPERBLOCKS_PER_THRESHOLD_STEP + 7;
        d.decide(&mut t);
        assert_eq!(t.hot_threshold, 60);
        let mut off = Tables::default();
        let mut d = Decisions {
            requests: 3 * SUPERBLOCKS_PER_THRESHOLD_STEP,
            ..Decisions::default()
        };
        d.decide(&mut off);
        assert_eq!(off.hot_threshold, u64::MAX);
    }

    /// A loop whose body calls through a pointer: a trace follows the call to its usual
    /// callee (9 calls in 10: block 0 → 1 in a trace); where the pointer's two targets are as
    /// frequent, every trace ends at the call (nothing follows block 0).
    #[test]
    fn a_trace_follows_an_indirect_call_to_its_usual_target_only() {
        for usual_share in [9u32, 5] {
            let mut t = Tables::default();
            t.hot_threshold = 50;
            let (head, usual, other, back) = (0x3000, 0x3100, 0x3200, 0x3010);
            block(
                &mut t,
                0,
                head,
                4,
                Terminator::IndirectCall {
                    return_to: GuestAddr(back),
                },
            );
            block(&mut t, 1, usual, 3, Terminator::Return);
            block(&mut t, 2, other, 3, Terminator::Return);
            let loop_back = Terminator::Branch {
                cond: Cond::Ne,
                taken: GuestAddr(head),
                not_taken: GuestAddr(0x3020),
            };
            block(&mut t, 3, back, 2, loop_back);
            let mut d = Decisions::default();
            let mut cmds = Vec::new();
            for i in 0..200 {
                let callee = if i % 10 < usual_share { 1 } else { 2 };
                t.record(&[0, callee, 3]);
                cmds.extend(d.decide(&mut t));
            }
            let got = requested(&cmds);
            let follows = |from: u32| {
                got.iter()
                    .flat_map(|trace| trace.windows(2))
                    .filter(|w| w[0] == from)
                    .map(|w| w[1])
                    .collect::<Vec<u32>>()
            };
            if usual_share == 9 {
                assert!(follows(0).contains(&1), "into the usual callee: {got:?}");
                assert!(!follows(0).contains(&2), "not into the other: {got:?}");
            } else {
                assert!(follows(0).is_empty(), "past an even call: {got:?}");
                assert!(!got.is_empty(), "the loop still gets a trace: {got:?}");
            }
        }
    }

    /// A block whose successor was a basic block and then the superblock that replaced it
    /// (same address) is traced into the superblock's blocks: the counts of the two are one.
    #[test]
    fn a_successor_replaced_by_a_superblock_counts_as_one() {
        let mut t = Tables::default();
        t.hot_threshold = 20;
        let (head, next, handler) = (0x2000, 0x2010, 0x2100);
        block(
            &mut t,
            0,
            head,
            2,
            Terminator::Jump {
                target: GuestAddr(next),
            },
        );
        block(&mut t, 1, next, 2, Terminator::IndirectJump);
        block(
            &mut t,
            2,
            handler,
            4,
            Terminator::Jump {
                target: GuestAddr(head),
            },
        );
        block(
            &mut t,
            3,
            0x2200,
            4,
            Terminator::Jump {
                target: GuestAddr(head),
            },
        );
        let trace: Arc<[BlockId]> = vec![BlockId(0), BlockId(1)].into();
        t.learn(&NewBlock {
            id: BlockId(4),
            summary: *t.summary(0).expect("a known id"),
            kind: IdKind::Superblock { blocks: trace },
            code: Box::default(),
        });
        for (i, &b) in [0u32, 1].iter().enumerate() {
            t.learn(&NewBlock {
                id: BlockId(5 + i as u32),
                summary: *t.summary(b).expect("a known id"),
                kind: IdKind::SideExit {
                    superblock: BlockId(4),
                    after: i as u32,
                },
                code: Box::default(),
            });
        }
        // Before the superblock: handler → block 0; after: handler → superblock 4, alternating
        // with another handler so that the pairs superblock → handler become hot.
        for _ in 0..30 {
            t.record(&[0, 1, 2]);
        }
        let mut d = Decisions::default();
        let mut cmds = Vec::new();
        for _ in 0..30 {
            t.record(&[4, 2, 4, 3]);
            cmds.extend(d.decide(&mut t));
        }
        let got = requested(&cmds);
        assert!(
            got.contains(&vec![2, 0, 1]),
            "the handler's trace takes over the superblock: {got:?}"
        );
    }
}
