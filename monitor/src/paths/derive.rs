//! Adding what instrumented code counted to the profile (#21 stage 2, step 3e;
//! docs/paths-design.md, "Step 3c decided", item 1): each context's path counters, read from
//! the guest thread's contexts when its ring is closed, regenerated into the paths, blocks,
//! edges and call-tree counts the recorder would have made from the blocks themselves.
//!
//! A counted id of numbering `n` regenerates (`Numbering::regenerate`, the Ball-Larus lecture's
//! step 4) into a path of `n`'s function: its start (the activation's entry, or a back edge's
//! head), its blocks and its end (a back edge, or the activation's end after its `ret`). That
//! is the recorder's path key; its blocks run once more each, on the edges between them, in
//! the call-tree node of the context; a path from the entry is an activation. A call block
//! followed by its return point in a path is a call that returned: the call edge into the
//! callee's entry and the edge from the callee's one `ret` to the return point are taken once
//! more each (the callee is instrumented too: a closed region). The edge into a region from
//! cold code and out of it are the ring's own (an announcing event's pairs). The guest's PAP
//! run tries (docs/paths-design.md, "Step 3d as built") join the recorder's: each node's ids
//! regenerate into the recorder's path numbers, and its count is added.

use std::collections::HashMap;

use hotpath_contexts::{ContextId, ContextView, DEEPER as GUEST_DEEPER, RUN_PATHS_MAX};
use hotpath_ir::Terminator;

use super::ids::NONE;
use super::pap_runs::PAP_MAX_PATHS;

/// `add_instrumented_runs`' numbering of guest run nodes under a hand-in root that stands
/// for no run of the recorder's (no numbering is this).
const LEFT_OUT: u32 = u32::MAX;
use super::numbering::{NumberedEnd, NumberedStart};
use super::recorder::PathRecorder;
use super::stack::DEEPER;
use super::trie::{END_EXIT, START_ENTRY, START_HEAD};
use crate::Tables;

impl PathRecorder {
    /// Adds the counts in `view`'s path counters (a finished guest thread's) to the profile
    /// and to `tables`. Counters of a numbering the recorder did not make, or of a context
    /// whose chain of functions it cannot follow, are left out.
    pub fn add_instrumented(&mut self, view: &ContextView, tables: &mut Tables) {
        if self.instrumenter.numberings.is_empty() || self.root_call == NONE {
            return;
        }
        self.add_instrumented_runs(view);
        // Guest context → call-tree node, made as needed from its parent's (ids grow from
        // parents to children).
        let mut call_node: HashMap<u32, u32> = HashMap::new();
        call_node.insert(ContextId::ROOT.0, self.root_call);
        for id in 0..view.len() as u32 {
            let counts = view.path_counts(ContextId(id));
            if counts.is_empty() {
                continue;
            }
            let Some(node) = self.call_node_of(view, ContextId(id), &mut call_node) else {
                continue;
            };
            // The function the context's activations were called from: its parent's (the
            // guest's root context stands for the bottom activation's function).
            let caller = view.node(ContextId(id)).and_then(|n| match n.parent {
                ContextId::ROOT => {
                    let f = self.calltree[self.root_call as usize].func;
                    self.funcs.get(f as usize).map(|fun| fun.entry)
                }
                p => view.node(p).map(|p| p.function),
            });
            for pc in counts {
                let Some((func, numbering)) =
                    self.instrumenter.numberings.get(&pc.numbering).cloned()
                else {
                    continue;
                };
                let returns_to = self.return_point(pc.numbering, caller);
                for (p, &c) in pc.counts.iter().enumerate() {
                    if c == 0 {
                        continue;
                    }
                    let Some(path) = numbering.regenerate(p as u64) else {
                        continue;
                    };
                    self.add_numbered_path(pc.numbering, func, node, &path, c, tables);
                    let tail = path.blocks.last().is_some_and(|b| {
                        self.instrumenter
                            .tails_out
                            .get(&pc.numbering)
                            .is_some_and(|t| t.binary_search(b).is_ok())
                    });
                    if let (NumberedEnd::Exit, Some(rp), false) = (path.end, returns_to, tail) {
                        // Several `ret`s: the edge from this one back to the context's call
                        // site.
                        let ret = path.blocks.last().and_then(|&b| self.block_id(func, b));
                        if let Some(ret) = ret {
                            tables.add_derived_edge(ret, rp, c);
                        }
                    }
                }
            }
        }
    }

    /// Adds the PAP runs of `view`'s run trie (a finished guest thread's instrumented
    /// activations) to the recorder's run trie: every node, parents first, its count and the
    /// thread's abandoned runs. A node the recorder's trie has no room for counts its runs as
    /// abandoned.
    fn add_instrumented_runs(&mut self, view: &ContextView) {
        let (nodes, abandoned) = view.runs();
        // Runs the guest abandoned under hand-in roots the recorder had no run for (it
        // abandoned the run before, or never recorded it): not the reference's.
        let mut not_ours = 0u64;
        // Guest node → (recorder node, numbering, paths in the run), parents first;
        // numbering 0: one the recorder did not make (a forked child's trie holds its
        // parent's), left out; [`LEFT_OUT`]: under a hand-in root that stands for no run, left
        // out, with the paths since the hand-in.
        let mut ours = vec![(NONE, 0u32, 0u32); nodes.len()];
        for (i, n) in nodes.iter().enumerate() {
            let Some(n) = n else { continue };
            let here = match n.parent {
                None if n.hand_in => self.hand_in_root(i as u32, n.path),
                None => match self.instrumenter.numberings.get(&n.path) {
                    Some(&(func, _)) => (
                        self.pap_runs.root(&mut self.funcs[func as usize]),
                        n.path,
                        0,
                    ),
                    None => (NONE, 0, 0),
                },
                Some(parent) => match ours[parent as usize] {
                    (_, 0, _) => (NONE, 0, 0),
                    (_, LEFT_OUT, depth) => {
                        // The guest abandons a run that would pass RUN_PATHS_MAX paths
                        // from its hand-in, at a node this deep.
                        if depth as usize + 1 == RUN_PATHS_MAX {
                            not_ours += 1;
                        }
                        (NONE, LEFT_OUT, depth + 1)
                    }
                    (NONE, numbering, len) => (NONE, numbering, len + 1),
                    // Past the longest run kept: the recorder abandons it there.
                    (_, numbering, len) if len as usize >= PAP_MAX_PATHS => {
                        (NONE, numbering, len + 1)
                    }
                    (up, numbering, len) => match self.numbered_path_number(numbering, n.path) {
                        Some((p, _)) => (self.pap_runs.step(up, p), numbering, len + 1),
                        None => (NONE, numbering, len + 1),
                    },
                },
            };
            ours[i] = here;
            match here {
                (_, 0 | LEFT_OUT, _) => {}
                // The recorder's trie is full, or the run too long.
                (NONE, _, _) => self.pap_runs.abandoned += n.count,
                (t, _, _) => self.pap_runs.add_count(t, n.count),
            }
        }
        self.pap_runs.abandoned += abandoned.saturating_sub(not_ours);
    }

    /// What the guest's hand-in root `index` of numbering `numbering` stands for: the
    /// recorder's run node, the numbering and the run's length so far (docs/paths-design.md,
    /// "Hand-in as built"); numbering [`LEFT_OUT`] when the activation had no run when it
    /// was handed in: its function was not PAP-hot when it started, or its run was abandoned
    /// (and counted so) already, and the per-block recorder would count nothing more of it.
    fn hand_in_root(&self, index: u32, numbering: u32) -> (u32, u32, u32) {
        match self.instrumenter.hand_in_runs.get(&index) {
            Some(&(t, len)) if t != NONE => (t, numbering, len),
            _ => (NONE, LEFT_OUT, 0),
        }
    }

    /// The recorder's run node and length that a hand-over's run node `run` (of the guest
    /// thread's run trie) stands for: `(NONE, 0)` for 0 (no run), or one it cannot spell.
    pub(crate) fn handed_run(&mut self, run: u32) -> (u32, u32) {
        if run == 0 {
            return (NONE, 0);
        }
        if let Some(&known) = self.instrumenter.handed_runs.get(&run) {
            return known;
        }
        let Some(view) = self.contexts.clone() else {
            return (NONE, 0);
        };
        // The guest's ids from the root down, and the root.
        let mut ids = Vec::new();
        let mut at = run;
        let root = loop {
            let Some(n) = view.run_node(at) else {
                return (NONE, 0);
            };
            match n.parent {
                Some(p) => {
                    ids.push(n.path);
                    at = p;
                }
                None => break n,
            }
        };
        let numbering = root.path;
        let Some(&(func, _)) = self.instrumenter.numberings.get(&numbering) else {
            return (NONE, 0);
        };
        let (mut t, base) = match root.hand_in {
            // A hand-in root: the run the recorder had when the activation was handed in.
            true => match self.hand_in_root(at, numbering) {
                (t, LEFT_OUT, _) => (t, 0),
                (t, _, len) => (t, len),
            },
            false => (self.pap_runs.root(&mut self.funcs[func as usize]), 0),
        };
        if t != NONE && base as usize + ids.len() > PAP_MAX_PATHS {
            // Longer than the recorder keeps: it would have abandoned the run (the guest did
            // not, counting from the hand-in; it goes on cold from here).
            self.pap_runs.abandoned += 1;
            t = NONE;
        }
        for &id in ids.iter().rev() {
            let Some((p, _)) = self.numbered_path_number(numbering, id) else {
                return (NONE, 0);
            };
            if t == NONE {
                break;
            }
            t = self.pap_runs.step(t, p);
        }
        let known = match t {
            NONE => (NONE, 0),
            t => (t, base + ids.len() as u32),
        };
        self.instrumenter.handed_runs.insert(run, known);
        known
    }

    /// For numbering `numbering` of a function with several `ret`s, the block id of the
    /// return point its activations called from function `caller` (an entry address) go back
    /// to: the one entry site in that function (docs/paths-design.md, "Step 3h as built").
    /// `None` for a function with one `ret` (its callers' paths give those edges).
    fn return_point(&self, numbering: u32, caller: Option<u64>) -> Option<u32> {
        let sites = self.instrumenter.entry_sites.get(&numbering)?;
        let g = *self.func_by_entry.get(&caller?)?;
        let nodes = &self.funcs[g as usize].nodes;
        let rp = sites.iter().find(|rp| nodes.contains_key(&rp.0))?;
        self.ids_at.get(&rp.0)?.last().copied()
    }

    /// True if the function entered at `entry` is instrumented with several `ret`s: the
    /// edges back from them are derived from its own counters, not its callers'.
    pub(crate) fn several_rets(&self, entry: u64) -> bool {
        self.instrumenter
            .latest_numbering(entry)
            .is_some_and(|n| self.instrumenter.entry_sites.contains_key(n))
    }

    /// The call-tree node guest context `id` stands for (`known` caches them).
    pub(crate) fn call_node_of(
        &mut self,
        view: &ContextView,
        id: ContextId,
        known: &mut HashMap<u32, u32>,
    ) -> Option<u32> {
        if let Some(&n) = known.get(&id.0) {
            return Some(n);
        }
        let info = view.node(id)?;
        let parent = self.call_node_of(view, info.parent, known)?;
        let func = match info.function {
            GUEST_DEEPER => DEEPER,
            f => *self.func_by_entry.get(&f)?,
        };
        let n = self.call_child(parent, func);
        known.insert(id.0, n);
        Some(n)
    }

    /// The recorder's path (its number, and the trie node of its blocks) that `path` of
    /// function `func` is, made if new.
    fn intern_numbered_path(
        &mut self,
        func: u32,
        path: &super::numbering::NumberedPath,
    ) -> (u32, u32) {
        let first = path.blocks[0];
        // As the recorder tags them: a path after a back edge starts at its head, even the
        // entry.
        let tag = match path.start {
            NumberedStart::Entry => START_ENTRY,
            NumberedStart::AfterBackEdge(_) => START_HEAD,
        };
        let mut cur = self.root(func, tag, first);
        for &b in &path.blocks[1..] {
            cur = self.trie_step(cur, b);
        }
        let end = match path.end {
            NumberedEnd::Exit => END_EXIT,
            NumberedEnd::BackEdge(h) => h,
        };
        (self.path_of(cur, end), cur)
    }

    /// The recorder's path number of path id `id` of numbering `numbering`, and its function
    /// (`None`: a numbering the recorder did not make, or an id it does not have).
    pub(crate) fn numbered_path_number(&mut self, numbering: u32, id: u32) -> Option<(u32, u32)> {
        if let Some(&p) = self.instrumenter.path_numbers.get(&(numbering, id)) {
            return Some(p);
        }
        let (func, n) = self.instrumenter.numberings.get(&numbering).cloned()?;
        let path = n.regenerate(id as u64)?;
        let (p, _) = self.intern_numbered_path(func, &path);
        self.instrumenter
            .path_numbers
            .insert((numbering, id), (p, func));
        Some((p, func))
    }

    /// Adds `count` runs of `path` of numbering `numbering` (of function `func`) in call-tree
    /// node `node`. A call block that calls out counts neither its block nor its edges: the
    /// ring's pairs around the border events do (`border`).
    fn add_numbered_path(
        &mut self,
        numbering: u32,
        func: u32,
        node: u32,
        path: &super::numbering::NumberedPath,
        count: u64,
        tables: &mut Tables,
    ) {
        let (p, cur) = self.intern_numbered_path(func, path);
        self.paths[p as usize].count += count;
        let instr = self.path_instructions(cur);
        let n = &mut self.calltree[node as usize];
        n.blocks += count * path.blocks.len() as u64;
        n.instructions += count * instr;
        let fun = &mut self.funcs[func as usize];
        fun.path_ends += count;
        if path.start == NumberedStart::Entry {
            fun.activations += count;
        }
        // The blocks and edges, by block id.
        let ids: Vec<Option<u32>> = path
            .blocks
            .iter()
            .map(|&b| self.block_id(func, b))
            .collect();
        let calls_out = self
            .instrumenter
            .calls_out
            .get(&numbering)
            .map_or(&[][..], |c| &c[..]);
        let tails_out = self
            .instrumenter
            .tails_out
            .get(&numbering)
            .map_or(&[][..], |c| &c[..]);
        let out = |b: u32| calls_out.binary_search(&b).is_ok();
        // A path that ends at a tail call out's block: the ring's pair into the callee counts
        // the block. (The block may also run as a plain jump, when its target is no call
        // target in the guest's contexts: then it ends at a back edge or goes on.)
        let tail = path.end == NumberedEnd::Exit
            && path
                .blocks
                .last()
                .is_some_and(|b| tails_out.binary_search(b).is_ok());
        for (i, (&b, id)) in path.blocks.iter().zip(&ids).enumerate() {
            let last = i + 1 == path.blocks.len();
            if let (Some(id), false) = (id, out(b) || (tail && last)) {
                tables.add_derived_block(*id, count);
            }
        }
        for (w, pair) in path.blocks.windows(2).zip(ids.windows(2)) {
            let (Some(u), Some(v)) = (pair[0], pair[1]) else {
                continue;
            };
            if out(w[0]) {
                continue;
            }
            match tables.blocks[u as usize].terminator {
                Terminator::Call { target, return_to }
                    if return_to.0 == self.funcs[func as usize].node_addr[w[1] as usize] =>
                {
                    // A call that returned: into the callee, and from its `ret` back (from
                    // its own counters when it has several).
                    if let Some(entry) = self.entry_block_id(target.0) {
                        tables.add_derived_edge(u, entry, count);
                    }
                    if let (false, Some(ret)) =
                        (self.several_rets(target.0), self.ret_block_id(target.0))
                    {
                        tables.add_derived_edge(ret, v, count);
                    }
                }
                _ => tables.add_derived_edge(u, v, count),
            }
        }
        if let (NumberedEnd::BackEdge(h), Some(&Some(u))) = (path.end, ids.last()) {
            if let Some(v) = self.block_id(func, h) {
                tables.add_derived_edge(u, v, count);
            }
        }
    }

    /// The latest block id of node `node` of function `func`.
    pub(crate) fn block_id(&self, func: u32, node: u32) -> Option<u32> {
        let addr = *self.funcs[func as usize].node_addr.get(node as usize)?;
        self.ids_at.get(&addr)?.last().copied()
    }

    /// The latest block id of the entry of the function entered at `entry`.
    pub(crate) fn entry_block_id(&self, entry: u64) -> Option<u32> {
        self.ids_at.get(&entry)?.last().copied()
    }

    /// The latest block id of a block ending at the `ret` of the instrumented function
    /// entered at `entry` (its plan has one `ret` instruction).
    pub(crate) fn ret_block_id(&self, entry: u64) -> Option<u32> {
        let &(func, ref n) = self.instrumenter.by_entry(entry)?;
        n.blocks.iter().enumerate().find_map(|(i, _)| {
            let id = self.block_id(func, i as u32)?;
            (self.id_kind[id as usize] == super::stack::K_RET).then_some(id)
        })
    }
}
