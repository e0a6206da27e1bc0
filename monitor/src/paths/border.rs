//! Following the borders of instrumented regions (#21 step 3g; docs/paths-design.md, "Step 3g
//! as built"): a call out of a region runs its callee cold, between a call-out event and a
//! return-in event, while the region's activations stay *suspended* in instrumented code.
//!
//! The recorder holds a running region (a *hole*) as its root's pending activation, marked
//! [`HOLE_ROOT`] (the announcing event's, `step_instrumented`). A call out pushes the cold
//! callee's pending activation above it, under the call-tree node of the caller's guest context
//! (the hole's activations between the root and the caller are in the guest's contexts only),
//! and makes the call block the tables' previous event, so that the ring's pair `call block →
//! callee entry` is the call edge. The return in pops the callee as a `ret` to the return point
//! does, counts the edge from the callee's `ret` block to the return point, and gives the
//! recorder and the tables back the state they had at the call out. The derivation leaves
//! these edges, and the call block's count, to the ring (`PathPlan::calls_out`).
//!
//! While a hole is suspended the guest has frames the recorder's stack does not (the hole's
//! activations above its root), so a context event's depth would not be the stack's: the
//! runtime hands every suspended hole over before it writes an event that gives a depth (a
//! resynchronisation, rare), as it does before a flush and at the thread's end. A suspended
//! hole handed over is replaced in place: its root by its activations, with the callee's
//! above them kept.

use hotpath_contexts::ContextId;
use hotpath_events::{BorderEvent, HandOver};

use super::ids::{NONE, SETTLED};
use super::recorder::PathRecorder;
use crate::Tables;

/// `Activation::len` of a pending activation that stands for a hole: a whole activation of
/// an instrumented function, its root (see `step_instrumented`).
pub(crate) const HOLE_ROOT: u32 = u32::MAX - 1;

/// A hole suspended in a call out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Suspended {
    /// Index on the recorder's stack of the callee's activation.
    callee: usize,
    /// The recorder's previous block at the call out (the hole root's `ret` alias).
    prev: u32,
    /// The tables' previous event at the call out.
    tables_prev: u32,
    /// The return point's block id.
    return_point: u32,
}

impl PathRecorder {
    /// Follows border event `e` (the events before it recorded and settled).
    pub(crate) fn follow_border(&mut self, e: BorderEvent, tables: &mut Tables) {
        self.memo.last = NONE;
        match e {
            BorderEvent::CallOut { site, context } => self.call_out(site, context, tables),
            BorderEvent::ReturnIn => self.return_in(tables),
            BorderEvent::TailOut { site } => self.tail_out(site, tables),
            BorderEvent::HandIn {
                numbering,
                head,
                run,
            } => self.hand_in(numbering, head, run, tables),
        }
    }

    /// The top activation, cold, took the back edge of numbering `numbering`'s function from
    /// its last block to block `head`, and the runtime handed it in: it goes on instrumented
    /// from the head (docs/paths-design.md, "Hand-in as built"). Its path ends at the back
    /// edge, as the head's arriving would end it, and the ring's pair into the head is
    /// counted; then it becomes a hole's root ([`HOLE_ROOT`]), whose paths from the head on
    /// are in its context's counters and whose PAP run goes on under the guest's hand-in
    /// root `run`, which stands for the run so far. The function's `ret` alias is the
    /// previous event, as after an announcing event.
    fn hand_in(&mut self, numbering: u32, head: u32, run: u32, tables: &mut Tables) {
        if self.id_addr.len() < tables.blocks.len() {
            self.learn_known(tables);
        }
        let Some(&(func, _)) = self.instrumenter.numberings.get(&numbering) else {
            return self.hand_in_mismatch();
        };
        let Some(h) = self.block_id(func, head) else {
            return self.hand_in_mismatch();
        };
        let Some(&top) = self.stack.last() else {
            return self.hand_in_mismatch();
        };
        if top.func != func || top.cur == NONE || self.id_addr[h as usize] > top.last_addr {
            return self.hand_in_mismatch();
        }
        let node = self.node_of(func, h, tables);
        self.end_path(node);
        tables.replay_blocks(&[h]);
        let a = *self.stack.last().expect("the activation");
        self.flush_counts(&a, false);
        if run != 0 {
            let known = match a.pap {
                NONE => (NONE, 0),
                t => (t, a.pap_len),
            };
            self.instrumenter.hand_in_runs.insert(run, known);
        }
        // Held as a hole's root from here: pending (its call-tree node is its parent's until a
        // hand-over names it again), popped by the next block or a tail call's event.
        let parent = self.calltree[a.call_node as usize].parent;
        self.stack.pop();
        self.push_pending(func, a.return_to, parent);
        self.stack.last_mut().expect("just pushed").len = HOLE_ROOT;
        let alias = self.instrumenter.ret_alias.get(&numbering).copied();
        self.prev = alias.unwrap_or(SETTLED);
        let entry = self.funcs[func as usize].entry;
        tables.set_prev(match (self.several_rets(entry), alias) {
            (false, Some(alias)) => alias,
            _ => NONE,
        });
    }

    /// A hand-in the recorder's stack does not agree with (a bug): counted, and ignored.
    #[cold]
    fn hand_in_mismatch(&mut self) {
        debug_assert!(false, "a hand-in the stack does not agree with");
        self.hand_in_mismatches += 1;
    }

    /// The hole's root jumped out of the region at tail-out site `site`: its activation ended
    /// there (its paths and run are in the guest's counters); the callee, cold, takes its
    /// place by the tail-call context event that follows (the jump goes through the target's
    /// jump entry, and instrumented code never runs in the one context past the depth cap,
    /// where a jump entry makes no tail call), which replaces the root's pending activation.
    /// What is left here: the jump's block is the tables' previous event.
    fn tail_out(&mut self, site: u32, tables: &mut Tables) {
        let Some(u) = self.site_block(site) else {
            return;
        };
        self.prev = SETTLED;
        tables.set_prev(u);
    }

    /// The block id of border site `site`'s block (`None`: a site the recorder did not hand
    /// out).
    fn site_block(&self, site: u32) -> Option<u32> {
        let &(numbering, block) = self.instrumenter.sites.get(&site)?;
        let &(func, _) = self.instrumenter.numberings.get(&numbering)?;
        self.block_id(func, block)
    }

    /// Call-out site `site` called out from guest context `context`: the callee starts at the
    /// next block, cold.
    fn call_out(&mut self, site: u32, context: u32, tables: &mut Tables) {
        let Some(u) = self.site_block(site) else {
            return;
        };
        let Some(return_to) = tables.blocks[u as usize].terminator.return_address() else {
            return;
        };
        let return_point = self
            .ids_at
            .get(&return_to.0)
            .and_then(|ids| ids.last())
            .copied()
            .unwrap_or(NONE);
        // The callee's call-tree parent: the node of the caller's context.
        let parent = self
            .contexts
            .clone()
            .and_then(|view| self.live_call_node(&view, ContextId(context)))
            .or_else(|| self.stack.last().map(|a| a.call_node))
            .unwrap_or(0);
        self.instrumenter.suspended.push(Suspended {
            callee: self.stack.len(),
            prev: self.prev,
            tables_prev: tables.prev(),
            return_point,
        });
        self.push_pending(NONE, return_to.0, parent);
        self.prev = SETTLED;
        tables.set_prev(u);
    }

    /// The callee of the innermost suspended hole's call out returned to its frame: pop it
    /// (and anything above it), count the edge from its `ret` to the return point, and go on
    /// as at the call out.
    fn return_in(&mut self, tables: &mut Tables) {
        let Some(s) = self.instrumenter.suspended.pop() else {
            return;
        };
        while self.stack.len() > s.callee {
            self.pop_activation();
        }
        // The pair (the callee's last event → the return point): the edge from its `ret`, and
        // the rest of a superblock that ended with it.
        if tables.prev() != NONE && s.return_point != NONE {
            tables.replay_blocks(&[s.return_point]);
        }
        self.prev = s.prev;
        tables.set_prev(s.tables_prev);
    }

    /// Hand-over `h` of the innermost suspended hole: its root's pending activation is
    /// replaced by `h`'s activations, below the callee's, which stay; the recorder and the
    /// tables go on from where they are.
    pub(crate) fn hand_over_suspended(&mut self, h: &HandOver, tables: &mut Tables) {
        let Some(s) = self.instrumenter.suspended.pop() else {
            return;
        };
        let Some(root) = (0..s.callee.min(self.stack.len()))
            .rev()
            .find(|&i| self.stack[i].cur == NONE && self.stack[i].len == HOLE_ROOT)
        else {
            return;
        };
        let above = self.stack.split_off(root + 1);
        let (prev, tables_prev) = (self.prev, tables.prev());
        self.hand_over(h, tables);
        self.stack.extend(above);
        self.prev = prev;
        tables.set_prev(tables_prev);
    }

    /// The call-tree node guest context `id` stands for, made if need be (the hole's contexts
    /// are the guest's alone).
    fn live_call_node(
        &mut self,
        view: &hotpath_contexts::ContextView,
        id: ContextId,
    ) -> Option<u32> {
        if self.root_call == NONE {
            return None;
        }
        let mut known = std::mem::take(&mut self.instrumenter.context_nodes);
        if known.get(&ContextId::ROOT.0) != Some(&self.root_call) {
            // The bottom activation changed (an exec, a reset): its descendants' nodes too.
            known.clear();
            known.insert(ContextId::ROOT.0, self.root_call);
        }
        let node = self.call_node_of(view, id, &mut known);
        self.instrumenter.context_nodes = known;
        node
    }
}
