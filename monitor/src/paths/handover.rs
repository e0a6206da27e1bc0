//! Following a hand-over: a guest thread's instrumented activations turned cold at once, and
//! the recorder and the tables take them on as if their blocks had been in the ring (#21 stage
//! 2; docs/paths-design.md, "Step 3c decided", item 3).
//!
//! Before it, the recorder holds the hole's root as a whole activation it cannot see (the
//! announcing event's, on top of its stack). The hand-over names every live instrumented
//! activation, the root first, with where its current path is: the path's blocks so far are
//! regenerated from the register (`Numbering::prefix`) and stepped as the per-block recorder
//! would have stepped them — each activation called from the one below's call block — so
//! that the cold blocks that follow go on from there. What the activations did before their
//! current paths (completed paths, counted in the guest's counters) is added when the thread
//! ends, like any other instrumented run; only the edges no completed path holds are counted
//! here: the calls into the activations, and the edges of the current paths. Each activation
//! goes on with the PAP run its instrumented code had reached (the guest's run node, spelled
//! into the recorder's run trie).

use hotpath_events::{HandOver, HandedAt, TaggedEvent};
use hotpath_ir::Terminator;

use super::ids::{NONE, SETTLED};
use super::numbering::NumberedStart;
use super::recorder::PathRecorder;
use super::stack::Activation;
use super::trie::START_HEAD;
use crate::Tables;

/// `Activation::len` of an activation whose next path starts at the next block, after a back
/// edge its instrumented code took (`cur` is [`NONE`]); see [`PathRecorder::continue_top`].
pub(crate) const HEAD_NEXT: u32 = u32::MAX;

impl PathRecorder {
    /// Takes word `w` of a hand-over ([`hotpath_events::is_handover`]); the last one makes it
    /// (the events before it recorded, everything they leave pending settled first).
    pub fn handover_word(&mut self, w: u32, tables: &mut Tables) {
        self.bl_leave();
        let Some(e) = self.handover_words.push(w) else {
            return;
        };
        if self.config.per_block {
            let mut expanded = std::mem::take(&mut self.expanded);
            expanded.clear();
            self.expander.finish(tables, &mut expanded);
            self.record_blocks(&expanded, tables);
            self.expanded = expanded;
        } else {
            self.flush_pending(tables);
        }
        match e {
            TaggedEvent::HandOver(h) if h.suspended => self.hand_over_suspended(&h, tables),
            TaggedEvent::HandOver(h) => self.hand_over(&h, tables),
            TaggedEvent::Border(b) => self.follow_border(b, tables),
        }
    }

    /// Takes on the activations of hand-over `h` (module doc).
    pub(crate) fn hand_over(&mut self, h: &HandOver, tables: &mut Tables) {
        self.memo.last = NONE;
        self.instrumenter.handed_over = true;
        if h.activations.is_empty() {
            return;
        }
        // The hole's root, held as a whole activation since its announcing event.
        let (mut return_to, mut parent) = match self.stack.last() {
            Some(a) if a.cur == NONE && a.len != HEAD_NEXT => {
                let a = self.stack.pop().expect("the hole's root");
                (a.return_to, a.call_node)
            }
            // Not what the ring said before (a bug): take the root as called from the top.
            Some(a) => (0, a.call_node),
            None => (0, self.root_call.min(self.calltree.len() as u32 - 1)),
        };
        tables.set_prev(NONE);
        // The block id of the call the next activation was called from.
        let mut caller_call: Option<u32> = None;
        for act in &h.activations {
            let Some((func, numbering)) = self.instrumenter.numberings.get(&act.numbering).cloned()
            else {
                return;
            };
            let entry = self.funcs[func as usize].entry;
            let (block, r, returned) = match act.at {
                HandedAt::Start => {
                    // Nothing ran: the next block (its entry, cold) starts it, called from the
                    // block before.
                    self.push_unseen(func, return_to, parent, false);
                    tables.set_prev(caller_call.unwrap_or(NONE));
                    return;
                }
                HandedAt::Head { .. } => {
                    // Its path ended at a back edge to the head, which runs next, cold. The
                    // activation's start is counted already (its first path is among the
                    // guest's counters), and so is the back edge.
                    self.push_unseen(func, return_to, parent, true);
                    self.continue_run(act.run);
                    if let (Some(c), Some(e)) = (caller_call, self.entry_block_id(entry)) {
                        tables.add_edge_once(c, e);
                    }
                    tables.set_prev(NONE);
                    return;
                }
                HandedAt::Block { block, r } => (block, r, false),
                HandedAt::Returned { call, r } => (call, r, true),
            };
            let Some((start, blocks)) = numbering.prefix(r, block) else {
                return;
            };
            let ids: Option<Vec<u32>> = blocks.iter().map(|&b| self.block_id(func, b)).collect();
            let Some(ids) = ids else { return };
            match start {
                NumberedStart::Entry => {
                    self.push_activation(func, return_to, parent, ids[0], tables);
                    tables.set_prev(caller_call.unwrap_or(NONE));
                }
                NumberedStart::AfterBackEdge(h) => {
                    self.push_after_back_edge(func, return_to, parent, h, ids[0], tables);
                    if let (Some(c), Some(e)) = (caller_call, self.entry_block_id(entry)) {
                        tables.add_edge_once(c, e);
                    }
                    tables.set_prev(NONE);
                }
            }
            self.continue_run(act.run);
            for &id in &ids[1..] {
                self.step_intra(id, tables);
            }
            self.replay_prefix(act.numbering, &blocks, &ids, tables);
            let last = *ids.last().expect("a prefix has a block");
            self.prev = last;
            let called_out = self
                .instrumenter
                .calls_out
                .get(&act.numbering)
                .is_some_and(|c| c.binary_search(&blocks[blocks.len() - 1]).is_ok());
            if returned && called_out {
                // Its call out returned (the return-in event popped the callee and counted
                // the edge back): the return point runs next, cold, in this activation.
                self.prev = SETTLED;
                tables.set_prev(NONE);
                return;
            }
            let Terminator::Call {
                target,
                return_to: rp,
            } = tables.blocks[last as usize].terminator
            else {
                // The top activation: the cold blocks go on from its last block.
                return;
            };
            let top = self.stack.last_mut().expect("just pushed");
            top.resume = NONE;
            parent = top.call_node;
            return_to = rp.0;
            caller_call = Some(last);
            if returned {
                // Its callee ran instrumented and returned: a whole activation, as an
                // announcing event stands for; the return point runs next, cold.
                let callee = self.function_at(target.0);
                self.push_unseen(callee, return_to, parent, false);
                if let Some(e) = self.entry_block_id(target.0) {
                    tables.add_edge_once(last, e);
                }
                self.prev = self.ret_alias(target.0).unwrap_or(NONE);
                // With several `ret`s, the edge back is derived from the callee's counters.
                tables.set_prev(match self.several_rets(target.0) {
                    true => NONE,
                    false => self.prev,
                });
                return;
            }
        }
    }

    /// The top activation goes on with the PAP run its instrumented code had reached: the
    /// guest's run node `run` (0: none, its run was abandoned).
    fn continue_run(&mut self, run: u32) {
        let (pap, len) = self.handed_run(run);
        let top = self.stack.last_mut().expect("an activation");
        top.pap = pap;
        top.pap_len = len;
    }

    /// Counts the edges of a current path's blocks `ids` in the tables, from the previous
    /// event on. A call block followed by its return point is a call that returned: its
    /// callee (instrumented) ran a whole activation, counted in the guest's counters, so the
    /// edges are the call into the callee's entry and the callee's `ret` to the return point —
    /// unless the call called out (`blocks` are the ids' nodes in numbering `numbering`): the
    /// ring had those edges.
    fn replay_prefix(&self, numbering: u32, blocks: &[u32], ids: &[u32], tables: &mut Tables) {
        let calls_out = self.instrumenter.calls_out.get(&numbering);
        for (i, &id) in ids.iter().enumerate() {
            if let Some(j) = i.checked_sub(1) {
                if calls_out.is_some_and(|c| c.binary_search(&blocks[j]).is_ok()) {
                    tables.set_prev(NONE);
                    tables.replay_blocks(&[id]);
                    continue;
                }
            }
            if let Some(&u) = i.checked_sub(1).and_then(|j| ids.get(j)) {
                if let Terminator::Call { target, return_to } = tables.blocks[u as usize].terminator
                {
                    if return_to == tables.blocks[id as usize].start {
                        if let Some(e) = self.entry_block_id(target.0) {
                            tables.add_edge_once(u, e);
                        }
                        if let (false, Some(r)) =
                            (self.several_rets(target.0), self.ret_block_id(target.0))
                        {
                            tables.add_derived_edge(r, id, 1);
                        }
                        tables.set_prev(NONE);
                    }
                }
            }
            tables.replay_blocks(&[id]);
        }
    }

    /// Pushes an activation of `func` that has run no block the recorder saw (`parent` is its
    /// caller's call-tree node): one the next block starts, or an instrumented one, or with
    /// `head_next` one whose next path starts at the next block ([`HEAD_NEXT`]). The next
    /// block goes on from it.
    fn push_unseen(&mut self, func: u32, return_to: u64, parent: u32, head_next: bool) {
        self.push_pending(func, return_to, parent);
        if head_next {
            let node = self.call_child(parent, func);
            let top = self.stack.last_mut().expect("just pushed");
            top.len = HEAD_NEXT;
            top.call_node = node;
        }
        self.prev = SETTLED;
    }

    /// Pushes the activation of `func` whose current path started after a back edge to node
    /// `head` (block id `id`): it was counted when it started (its first path is among the
    /// guest's counters); its PAP run so far is the hand-over's (`continue_run`).
    fn push_after_back_edge(
        &mut self,
        func: u32,
        return_to: u64,
        parent: u32,
        head: u32,
        id: u32,
        tables: &Tables,
    ) {
        let node = self.node_of(func, id, tables);
        debug_assert_eq!(node, head);
        let cur = self.root(func, START_HEAD, node);
        let call_node = self.call_child(parent, func);
        self.stack.push(Activation {
            func,
            return_to,
            cur,
            len: 1,
            blocks: 0,
            instructions: 0,
            path_ends: 0,
            last_addr: self.id_addr[id as usize],
            pap: NONE,
            pap_len: 0,
            call_node,
            resume: NONE,
        });
    }

    /// The `ret` alias id of the instrumented function entered at `entry` (its announcing
    /// event's), for the edge from its `ret` to the next block.
    fn ret_alias(&self, entry: u64) -> Option<u32> {
        let &numbering = self.instrumenter.latest_numbering(entry)?;
        self.instrumenter.ret_alias.get(&numbering).copied()
    }
}
