//! The memo recorder's fast loops: the common case of `record_events` with the recorder's
//! state in registers, one loop for the events that stay in one activation and one that also
//! takes calls and plain returns (see `memo`, "Fast loops").

use hotpath_events::is_id;

use super::ids::NONE;
use super::memo::{memo_key, push_pap_runs, slot_of, EventInfo, NO_KEY};
use super::recorder::PathRecorder;
use super::stack::{cached_call_child, Activation, K_CALL, K_INDIRECT, K_OTHER, K_RET};
use super::trie::cached_exit_path;

/// Events in a row that stay in one activation after which `run_call_loop` hands over to
/// `run_intra_loop` (a loop between calls), which takes them faster; fewer, and the hand-overs
/// cost more than they save on call-bound code.
const INTRA_RUN: u32 = 16;

/// The event at `events[i]` as the fast loops take it: the id that stands for the blocks it
/// ran (a superblock's side exit, told by the event after it, when it left early), that id's
/// blocks, and how many events it takes (2 for a superblock and its side exit). `None`: the
/// general path's (a syscall event, an id not learned yet, a superblock whose next event is
/// not in this piece, the end of `events`).
#[inline(always)]
fn event_at(events: &[u32], i: usize, infos: &[EventInfo]) -> Option<(u32, EventInfo, usize)> {
    let e = *events.get(i)?;
    let info = *infos.get(e as usize)?;
    if !info.is_superblock {
        return Some((e, info, 1));
    }
    let next = *events.get(i + 1)?;
    let exited = match infos.get(next as usize) {
        Some(n) => n.superblock == e,
        None if !is_id(next) => false,
        None => return None,
    };
    // Branch-free: whether a superblock left early is the guest's own branch.
    let run = if exited { next } else { e };
    Some((run, infos[run as usize], 1 + exited as usize))
}

/// Where a run of event `e` that repeats from `events[next]` on ends (a loop whose body is one
/// event, already taken once): the index of the first event that is not a repeat. A
/// superblock's run stops before its last repeat, whose next event says whether it left early.
#[inline(always)]
pub(crate) fn repeat_run_end(
    events: &[u32],
    mut next: usize,
    e: u32,
    is_superblock: bool,
) -> usize {
    if is_superblock {
        while events.get(next) == Some(&e) && events.get(next + 1) == Some(&e) {
            next += 1;
        }
    } else {
        while events.get(next) == Some(&e) {
            next += 1;
        }
    }
    next
}

impl PathRecorder {
    /// The common case of `record_events`, with its state in registers: from `events[i]` on,
    /// [`PathRecorder::run_intra_loop`] takes the events that stay in one activation, and
    /// [`PathRecorder::run_call_loop`] the calls and returns between them, each handing over
    /// to the other. Returns the index of the first event neither took, and, when the last one
    /// taken is not done, that event's id and the position to go on from; the general path
    /// takes it from there, with the recorder's state as the per-block step would have left it.
    #[inline(always)]
    pub(crate) fn run_fast(&mut self, events: &[u32], mut i: usize) -> (usize, Option<(u32, u32)>) {
        loop {
            let (j, rest) = self.run_fast_intra(events, i);
            if self.stack.is_empty() || self.prev == NONE {
                return (j, rest);
            }
            let (k, rest, handed_over) = self.run_call_loop(events, j, rest);
            if !handed_over {
                return (k, rest);
            }
            i = k;
        }
    }

    /// The common case of `record_events`, with its state in registers: from `events[i]` on,
    /// each event starts with a memo that the last one predicts (or the memo cache holds),
    /// after a block that neither calls nor returns, and that ends no path a k-slab forest
    /// must see (a hot function's PAP run takes the ended paths here, in order). Returns the
    /// index of the first event it did not take, and, when the last one it took goes on past
    /// its first memo (a call or a return follows), that event's id and the position to go on
    /// from; the general path takes it from there.
    #[inline(always)]
    fn run_fast_intra(&mut self, events: &[u32], i: usize) -> (usize, Option<(u32, u32)>) {
        let (Some(l), Some(top)) = (
            self.memo.memos.get(self.memo.last as usize),
            self.stack.last(),
        ) else {
            return (i, None);
        };
        // Cheap to rule out: calls and returns (a recursive guest's every event) are not here.
        if l.last != self.prev
            || l.next != top.cur
            || (l.last_kind != K_OTHER && l.last_kind != K_INDIRECT)
        {
            return (i, None);
        }
        if top.pap != NONE && self.config.k == 0 {
            self.run_intra_loop::<true>(events, i)
        } else {
            self.run_intra_loop::<false>(events, i)
        }
    }

    #[inline(never)]
    fn run_intra_loop<const PAP: bool>(
        &mut self,
        events: &[u32],
        mut i: usize,
    ) -> (usize, Option<(u32, u32)>) {
        let (i0, last0) = (i, self.memo.last);
        let top = self.stack.last_mut().expect("an activation");
        let memos = &mut self.memo.memos;
        let (infos, epoch) = (&self.memo.events, self.memo.epoch);
        let (cache, memo_ends) = (&self.memo.cache, &self.memo.ends);
        let pap_runs = &mut self.pap_runs;
        let repeats = &mut self.memo.repeats;
        let (id_node, id_addr) = (&self.id_node, &self.id_addr);
        // Paths a memo ends go one by one to a k-slab forest: not here. To a PAP run: here in
        // the `PAP` instance (taken when the activation records one and there is no k-slab
        // forest), which the other does not pay for.
        let bail_on_ends = !PAP && (top.pap != NONE || self.config.k > 0);
        let (func, return_to) = (top.func, top.return_to);
        let (mut last, mut cur) = (last0, top.cur);
        let (mut blocks, mut instr, mut ends) = (0u64, 0u64, 0u64);
        let memo_instr = &self.memo.instr;
        let mut rest = None;
        while let Some(&e) = events.get(i) {
            // Inline rather than `event_at`: callgrind counts 8 % more instructions per event
            // on interp and sieve with the helper here.
            let Some(&info) = infos.get(e as usize) else {
                break;
            };
            let (mut run, mut run_info, mut taken) = (e, info, 1);
            if info.is_superblock {
                let Some(&next) = events.get(i + 1) else {
                    break;
                };
                let exited = match infos.get(next as usize) {
                    Some(n) => n.superblock == e,
                    None if !is_id(next) => false,
                    None => break,
                };
                // Branch-free: whether a superblock left early is the guest's own branch.
                run = if exited { next } else { e };
                taken += exited as usize;
                run_info = infos[run as usize];
            }
            let key = memo_key(run, 0);
            let l = &memos[last as usize];
            if key == NO_KEY || l.last_kind != K_OTHER {
                // After an indirect jump the path goes on only inside the function and not to
                // its return address (validity rule 1).
                let b = run_info.first as usize;
                if key == NO_KEY
                    || l.last_kind != K_INDIRECT
                    || id_node[b].0 != func
                    || id_addr[b] == return_to
                {
                    break;
                }
            }
            let second = (l.succ_key[1] == key) as usize;
            let m = if l.succ_key[second] == key {
                l.succ[second]
            } else {
                // More successors than a memo remembers (a dispatch loop, a superblock's many
                // side exits): the direct-mapped cache.
                let s = cache[slot_of(cur, key)];
                if s.from != cur || s.key != key {
                    break;
                }
                s.memo
            };
            let memo = &mut memos[m as usize];
            if memo.epoch != epoch || memo.from != cur || (memo.nends > 0 && bail_on_ends) {
                break;
            }
            // A loop whose body is one event (a block or an unrolled superblock that follows
            // itself): when the memo ends where it starts, the same event again is the same
            // memo again, so a run of it is counted at once. A superblock's run is taken up to
            // its last repeat, whose next event says whether it left early.
            // `run == e`: the event ran whole (`taken` is 1), so the next one starts a repeat.
            let mut next = i + taken;
            if run == e
                && memo.from == memo.next
                && memo.last_kind == K_OTHER
                && memo.end as u32 == run_info.len
            {
                next = repeat_run_end(events, next, e, info.is_superblock);
                if next > i + 1 {
                    // The tables count the repeats at once too (`Tables::record_with_repeats`).
                    repeats.push(((i + 1) as u32, next as u32));
                }
            }
            // The events `i..next` are this memo's runs (one, or the first of a repeat run).
            let runs = (next - i - taken + 1) as u64;
            memo.count += runs;
            blocks += runs * memo.blocks as u64;
            instr += runs * memo_instr[m as usize];
            ends += runs * memo.nends as u64;
            if PAP && memo.nends > 0 {
                // A hot function's activation: its PAP run takes the ended paths in order.
                let ended = memo.ends as usize..memo.ends as usize + memo.nends as usize;
                push_pap_runs(pap_runs, top, &memo_ends[ended], runs);
            }
            cur = memo.next;
            last = m;
            i = next;
            if memo.end as u32 != run_info.len {
                // The rest of the event (after a call or a return) is the general path's.
                rest = Some((run, memo.end as u32));
                break;
            }
        }
        if i != i0 {
            let l = &memos[last as usize];
            top.cur = cur;
            top.len = l.len;
            top.last_addr = l.last_addr;
            top.blocks += blocks;
            top.instructions += instr;
            top.path_ends += ends;
            self.prev = l.last;
            self.memo.last = last;
        }
        (i, rest)
    }

    /// The calls and plain returns of [`PathRecorder::run_fast`], and the memos around them:
    /// from `events[i]` on, or from position `rest.1` of event `rest.0` (already taken) when
    /// given, every segment of every event is a memo that the last one predicts (or the memo
    /// cache holds), the entry block of a callee whose function, trie root and call-tree node
    /// are known (as `push_activation`'s common case), or a plain return to the frame below
    /// followed by a memo of the caller's (as `run_return`); and no path ends that a k-slab
    /// forest must see. Returns the index of the first event it did not take, the event and
    /// position to go on from when that event is not done, and whether it stopped to hand
    /// over to [`PathRecorder::run_intra_loop`]: after a call or a return, at the end of an
    /// event whose last memo stays in the function.
    #[inline(never)]
    fn run_call_loop(
        &mut self,
        events: &[u32],
        mut i: usize,
        rest: Option<(u32, u32)>,
    ) -> (usize, Option<(u32, u32)>, bool) {
        let stack_cap = self.stack_cap();
        let memos = &mut self.memo.memos;
        let (infos, seq, epoch) = (&self.memo.events, &self.memo.seq, self.memo.epoch);
        let (cache, memo_ends) = (&self.memo.cache, &self.memo.ends);
        let (pap_runs, repeats) = (&mut self.pap_runs, &mut self.memo.repeats);
        let (id_node, id_addr, id_kind) = (&self.id_node, &self.id_addr, &self.id_kind);
        let (id_entry, id_root, id_ret) = (&self.id_entry, &self.id_root, &self.id_ret);
        let (stack, funcs, paths) = (&mut self.stack, &mut self.funcs, &mut self.paths);
        let (calltree, call_cache, trie) = (&mut self.calltree, &self.call_cache, &self.trie);
        let (k, pap_threshold) = (self.config.k, self.config.pap_threshold);
        // The top activation's path state lives in registers; its frame's `cur`, `blocks` and
        // `path_ends` are stale until written back, and so are its `len` and `last_addr` while
        // `by_memo` (they are then the last memo's).
        let top = stack.last().expect("an activation");
        let (mut func, mut return_to, mut pap) = (top.func, top.return_to, top.pap != NONE);
        let (mut cur, mut blocks, mut ends, mut by_memo) = (top.cur, 0u64, 0u64, false);
        let mut instr = 0u64;
        let memo_instr = &self.memo.instr;
        let (mut prev, mut last) = (self.prev, self.memo.last);
        let mut kind = id_kind[prev as usize];
        // Writes the registers back to the top frame.
        macro_rules! write_back {
            () => {{
                let t = stack.last_mut().expect("an activation");
                t.cur = cur;
                t.blocks += blocks;
                t.instructions += instr;
                t.path_ends += ends;
                if by_memo {
                    let l = &memos[last as usize];
                    (t.len, t.last_addr) = (l.len, l.last_addr);
                }
            }};
        }
        // The event being run: its id, its blocks `seq[start..start + len]`, the position of
        // the next segment. `pos == len`: take the next event.
        let (mut run, mut start, mut len, mut pos, mut first) = (NONE, 0u32, 0u32, 0u32, NONE);
        if let Some((r, p)) = rest {
            let ri = infos[r as usize];
            (run, start, len, pos, first) = (r, ri.start, ri.len, p, ri.first);
        }
        // Events in a row that stayed in the activation; `INTRA_RUN` of them hand over.
        let (mut intra, mut handed_over) = (0u32, false);
        loop {
            let mut first_of = None;
            if pos == len {
                intra += 1;
                if intra > INTRA_RUN && by_memo && (kind == K_OTHER || kind == K_INDIRECT) {
                    handed_over = true;
                    break;
                }
                // The next event.
                let Some((r, ri, taken)) = event_at(events, i, infos) else {
                    break;
                };
                (run, start, len, pos, first) = (r, ri.start, ri.len, 0, ri.first);
                // `r == events[i]`: the event ran whole, so the same event next starts a
                // repeat.
                let e = events[i];
                first_of = (r == e).then_some((e, ri.is_superblock, i));
                i += taken;
            }
            let key = memo_key(run, pos);
            if key == NO_KEY {
                break;
            }
            // What the per-block step would do with the segment's first block `b`, as the
            // block before it decides (validity rule 1): where the memo that goes on from here
            // starts, and which memo predicts it.
            let (mut pred, mut from) = (last, cur);
            if kind != K_OTHER {
                let b = if pos == 0 {
                    first
                } else {
                    seq[(start + pos) as usize]
                } as usize;
                if kind == K_INDIRECT {
                    if id_node[b].0 != func || id_addr[b] == return_to {
                        break;
                    }
                } else if kind == K_CALL {
                    // A call: the callee's activation starts with `b`, as `push_activation`'s
                    // common case (no k-slab forest to tell of a routine entry).
                    let f = id_entry[b];
                    if f == NONE || k > 0 || stack.len() >= stack_cap {
                        break;
                    }
                    let root = id_root[b];
                    let parent = stack.last().expect("an activation").call_node;
                    let call_node = cached_call_child(calltree, call_cache, parent, f);
                    if root == NONE || id_node[b].0 != f || call_node == NONE {
                        break;
                    }
                    write_back!();
                    stack.last_mut().expect("an activation").resume = last;
                    let fun = &mut funcs[f as usize];
                    fun.activations += 1;
                    let pap_node = if fun.path_ends >= pap_threshold {
                        pap_runs.root(fun)
                    } else {
                        NONE
                    };
                    stack.push(Activation {
                        cur: root,
                        ..Activation::new(f, id_ret[prev as usize], call_node, pap_node, id_addr[b])
                    });
                    (func, return_to, pap) = (f, id_ret[prev as usize], pap_node != NONE);
                    (cur, blocks, ends, by_memo) = (root, 0, 0, false);
                    instr = 0;
                    // The entry block is stepped alone; the callee's first memo is predicted
                    // from the caller's last one.
                    prev = b as u32;
                    kind = id_kind[b];
                    pos += 1;
                    intra = 0;
                    continue;
                } else {
                    // A return: to the top frame's return address, with a frame below, and
                    // not to another function's entry (a tail call after all).
                    let n = stack.len();
                    if n < 2 || return_to != id_addr[b] || k > 0 {
                        break;
                    }
                    let caller = &stack[n - 2];
                    let entry = id_entry[b];
                    if (entry != NONE && entry != caller.func)
                        || cached_exit_path(trie, cur) == NONE
                    {
                        break;
                    }
                    // The caller's path goes on with `b`, predicted from the memo that ended
                    // with its call.
                    (pred, from) = (caller.resume, caller.cur);
                }
            }
            let mut m = NONE;
            if let Some(l) = memos.get(pred as usize) {
                // Branch-free choice: which successor comes is often the guest's own
                // unpredictable branch.
                let second = (l.succ_key[1] == key) as usize;
                if l.succ_key[second] == key {
                    m = l.succ[second];
                }
            }
            if m == NONE || memos[m as usize].from != from {
                // More successors than a memo remembers (a dispatch loop, a superblock's many
                // side exits), or a successor from another path: the direct-mapped cache.
                let s = cache[slot_of(from, key)];
                if s.from != from || s.key != key {
                    break;
                }
                m = s.memo;
            }
            let next = &memos[m as usize];
            if next.epoch != epoch || next.from != from || (next.nends > 0 && k > 0) {
                break;
            }
            if kind == K_RET {
                // Pop the callee, as `pop_activation` does: its path ends at the exit.
                write_back!();
                let mut a = stack.pop().expect("the callee");
                let p = cached_exit_path(trie, a.cur);
                paths[p as usize].count += 1;
                let node = &mut calltree[a.call_node as usize];
                node.blocks += a.blocks + a.len as u64;
                node.instructions += a.instructions + trie[a.cur as usize].instr;
                funcs[a.func as usize].path_ends += a.path_ends + 1;
                if a.pap != NONE {
                    pap_runs.push(&mut a, p);
                    pap_runs.end(&a);
                }
                let t = stack.last().expect("the caller");
                (func, return_to, pap) = (t.func, t.return_to, t.pap != NONE);
                // `cur` and `by_memo` are the memo's, below.
                (blocks, instr, ends) = (0, 0, 0);
                intra = 0;
            }
            let memo = &mut memos[m as usize];
            // A loop whose body is one event (a block or an unrolled superblock that follows
            // itself): when the memo ends where it starts, the same event again is the same
            // memo again, so a run of it is counted at once. A superblock's run is taken up to
            // its last repeat, whose next event says whether it left early.
            let mut runs = 1u64;
            if let Some((e, is_superblock, at)) = first_of {
                if memo.from == memo.next && memo.last_kind == K_OTHER && memo.end as u32 == len {
                    i = repeat_run_end(events, i, e, is_superblock);
                    if i > at + 1 {
                        // The tables count the repeats at once too
                        // (`Tables::record_with_repeats`).
                        repeats.push(((at + 1) as u32, i as u32));
                        runs += (i - at - 1) as u64;
                    }
                }
            }
            memo.count += runs;
            blocks += runs * memo.blocks as u64;
            instr += runs * memo_instr[m as usize];
            ends += runs * memo.nends as u64;
            if pap && memo.nends > 0 {
                // A hot function's activation: its PAP run takes the ended paths in order.
                let ended = memo.ends as usize..memo.ends as usize + memo.nends as usize;
                let t = stack.last_mut().expect("an activation");
                push_pap_runs(pap_runs, t, &memo_ends[ended], runs);
                pap = t.pap != NONE;
            }
            (cur, prev, kind, pos) = (memo.next, memo.last, memo.last_kind, memo.end as u32);
            (last, by_memo) = (m, true);
        }
        // (Nothing changed if it took nothing: the same values again.)
        write_back!();
        self.prev = prev;
        self.memo.last = last;
        (i, (pos != len).then_some((run, pos)), handed_over)
    }
}
