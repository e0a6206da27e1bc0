//! Choosing the functions whose path registers translated code keeps, and making their plans
//! (#21 stage 2, step 3e's decision; docs/paths-design.md, "Step 3c decided", item 1).
//!
//! A function qualifies when it has ended at least the threshold's number of paths (its live
//! activations' included: a main loop is planned while it runs, and handed in at its next back
//! edge; docs/paths-design.md, "Hand-in as built"), every
//! block the recorder knows of it ends in a direct jump, a fall-through, a conditional branch,
//! a `call` (direct, not the get-pc one, or indirect) whose return point it has reached, or a
//! `ret` — no indirect jump, system call or trap, and no branch to another function's entry — and
//! its numbering has at most [`MAX_PLAN_PATHS`] paths. A jump (or fall-through) to another
//! function's entry is a *tail call out* (`PathPlan::tails_out`): such a function is only ever a
//! hole's root, needs no `ret`, and one planned without a tail call out is not renumbered with
//! one; so is a function whose `ret` the recorder has not seen (`PathPlan::roots_only`). A function with several `ret` instructions also needs every function that calls it to
//! do so from one call site (its *entry sites*, which the plan lists: a context's returns then
//! all go back to one place, and the edges from its `ret`s are derived from its own counters;
//! docs/paths-design.md, "Step 3h as built"); other call sites run it cold.
//!
//! Every qualifying function is planned, in one set (a *region*). A direct call to a function
//! of the set, or to one planned before, from a site its plan lets in, stays in the region:
//! the callee runs instrumented. Every other call *calls out* (`PathPlan::calls_out`): the
//! callee runs cold, between the border events of the call and of its return
//! (docs/paths-design.md, "Step 3g as built"). A function whose finished paths call out more
//! than once per [`MIN_BLOCKS_PER_CALL_OUT`] blocks is left out (a call out costs more than the
//! few block events it saves), and its callers call out to it. bench_fib's `fib` and `tak` are
//! a region with no call out.
//!
//! A function is planned only where instrumentation pays, as far as its recent history says:
//! at least [`MIN_EVENTS_PER_PATH_END`] ring events per path end between two looks, once
//! [`WARM_UP_LOOKS`] looks have seen it (below that its loops run as unrolled superblocks,
//! cheaper than an instrumented path end each); `--instrument-every` plans every function
//! that qualifies.
//!
//! A function is instrumented only once it records PAP runs (past `--pap-threshold` path ends
//! too): its instrumented activations keep their runs in the guest's run trie from their
//! start, as the per-block recorder keeps those of every activation that starts after the
//! function passed the threshold (docs/paths-design.md, "Step 3d as built").

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use hotpath_events::{Command, PathPlan, MAX_NUMBERING, MAX_PLAN_PATHS, MAX_SITES};
use hotpath_ir::{BlockSummary, GuestAddr, Terminator};

use super::ids::{FxMap, NONE};
use super::numbering::Numbering;
use super::recorder::PathRecorder;
use crate::Tables;

/// Most events recorded between two looks for new regions (a look walks every function);
/// fewer at a low threshold (tests), so that short programs are instrumented too.
const LOOK_EVERY_EVENTS: u64 = 1 << 16;

/// Fewest blocks a function's paths run per call out for it to be instrumented (blocks of its
/// finished paths, weighted by their counts, over the executions of its calls out among them).
const MIN_BLOCKS_PER_CALL_OUT: u64 = 8;

/// Most numberings one function is sent (the first and its renumberings).
const MAX_NUMBERINGS_PER_FUNCTION: u32 = 8;

/// Numberings handed out in this process (the translator tells counters apart by them; never
/// 0).
static NEXT_NUMBERING: AtomicU32 = AtomicU32::new(1);

/// Call-out site ids handed out in this process (`PathPlan::first_site`).
static NEXT_SITE: AtomicU32 = AtomicU32::new(0);

/// What the recorder keeps of its instrumentation requests.
#[derive(Clone, Debug, Default)]
pub(crate) struct Instrumenter {
    /// Functions (recorder indices) sent in a plan set: never sent again.
    planned: HashSet<u32>,
    /// Guest entries of the planned functions (calls to them keep a region closed).
    planned_entries: HashSet<u64>,
    /// Events recorded when regions were last looked for.
    last_look: u64,
    /// A hand-over came since the last look (`instrumentation_request` looks at once).
    pub(crate) handed_over: bool,
    /// Every numbering sent: its function (recorder index) and the numbering, to regenerate
    /// what the guest's counters hold.
    pub(crate) numberings: FxMap<u32, (u32, Numbering)>,
    /// The last numbering sent for each function entry.
    latest: FxMap<u64, u32>,
    /// Each numbering's `ret` alias id (`IdKind::InstrumentedReturn`), as the ring's catalog
    /// announced it.
    pub(crate) ret_alias: FxMap<u32, u32>,
    /// Numberings sent per function.
    sent: FxMap<u32, u32>,
    /// Functions planned with one `ret` (never planned with several after).
    one_ret: HashSet<u32>,
    /// The entry sites of each numbering of a function with several `ret`s (return points).
    pub(crate) entry_sites: FxMap<u32, Vec<GuestAddr>>,
    /// Per planned function: its blocks and paths made when its CFG was last found not to
    /// have grown (`grew` numbers it again only when they change).
    checked: FxMap<u32, (usize, usize)>,
    /// `(numbering, path id)` → the recorder's path number and its function.
    pub(crate) path_numbers: FxMap<(u32, u32), (u32, u32)>,
    /// A hand-over's run node (the guest's index) → the recorder's run node and its length.
    pub(crate) handed_runs: FxMap<u32, (u32, u32)>,
    /// A hand-in root (the guest's run node index) → the recorder's run node and length of
    /// the run it stands for ([`NONE`]: the activation recorded none, or it was abandoned).
    pub(crate) hand_in_runs: FxMap<u32, (u32, u32)>,
    /// Each numbering's call blocks that call out (`PathPlan::calls_out`).
    pub(crate) calls_out: FxMap<u32, Vec<u32>>,
    /// Each border site (a call out's or a tail out's): its numbering and block.
    pub(crate) sites: FxMap<u32, (u32, u32)>,
    /// Numberings whose function is only ever a hole's root (`PathPlan::roots_only`: tail
    /// calls out, or no `ret` known): calls to it call out.
    pub(crate) roots_only: HashSet<u32>,
    /// Each numbering's blocks that end in a tail call out (`PathPlan::tails_out`).
    pub(crate) tails_out: FxMap<u32, Vec<u32>>,
    /// Per function not planned yet: the looks that saw it past the thresholds (up to
    /// `WARM_UP_LOOKS`), and its ring events, path ends and activations at the last one
    /// (`pays_to_instrument`).
    pub(crate) window: FxMap<u32, (u32, (u64, u64, u64))>,
    /// The holes suspended in a call out, innermost last (`border`).
    pub(crate) suspended: Vec<super::border::Suspended>,
    /// Guest context → call-tree node, for call outs (`border`).
    pub(crate) context_nodes: std::collections::HashMap<u32, u32>,
}

impl Instrumenter {
    /// The function and numbering last sent for the function entered at `entry`.
    pub(crate) fn by_entry(&self, entry: u64) -> Option<&(u32, Numbering)> {
        self.numberings.get(self.latest.get(&entry)?)
    }

    /// The numbering last sent for the function entered at `entry`.
    pub(crate) fn latest_numbering(&self, entry: u64) -> Option<&u32> {
        self.latest.get(&entry)
    }
}

impl PathRecorder {
    /// The plans of a new closed region of functions past `threshold` path ends and the PAP
    /// threshold, if one is there (looked for every 64 `threshold` events, at least 256 and at
    /// most 65 536; `events` is how many were recorded so far).
    pub fn instrumentation_request(
        &mut self,
        tables: &Tables,
        threshold: u64,
        events: u64,
    ) -> Option<Command> {
        let every = threshold.saturating_mul(64).clamp(256, LOOK_EVERY_EVENTS);
        // A hand-over brings a look at once: instrumented code writes few events, and the
        // function it left may need renumbering before its activation hands in again.
        let handed_over = std::mem::take(&mut self.instrumenter.handed_over);
        if events.saturating_sub(self.instrumenter.last_look) < every && !handed_over {
            return None;
        }
        self.instrumenter.last_look = events;
        let threshold = threshold.max(self.config.pap_threshold);
        // Candidate function → (plan, calls (callee entry, return point), numbering).
        let mut cands: BTreeMap<u32, Candidate> = BTreeMap::new();
        // Planned functions whose CFG did not grow, as they are now.
        let mut unchanged = Vec::new();
        let live = self.live_path_ends();
        for f in 0..self.funcs.len() as u32 {
            let fun = &self.funcs[f as usize];
            if fun.path_ends + live.get(&f).copied().unwrap_or(0) < threshold {
                continue;
            }
            let sent = self.instrumenter.sent.get(&f).copied().unwrap_or(0);
            if self.instrumenter.planned.contains(&f) {
                if sent >= MAX_NUMBERINGS_PER_FUNCTION {
                    continue;
                }
                let now = (fun.node_addr.len(), fun.paths.len());
                if self.instrumenter.checked.get(&f) == Some(&now) {
                    continue;
                }
                if !self.grew(f) {
                    unchanged.push((f, now));
                    continue;
                }
            }
            let planned = self.instrumenter.planned.contains(&f);
            let f_live = live.get(&f).copied().unwrap_or(0);
            if !planned
                && !self.config.instrument_every
                && !self.pays_to_instrument(f, f_live, tables)
            {
                continue;
            }
            if let Some(c) = self.plan_of(f, tables) {
                cands.insert(f, c);
            }
        }
        self.instrumenter.checked.extend(unchanged);
        self.with_entry_sites(&mut cands, tables);
        // Each candidate's calls out: its indirect calls, and its direct calls of functions
        // that are not in the set (or planned before) or whose plan does not let the site in.
        // A call out costs the ring three words and the monitor a step each way, and it cuts
        // the superblocks that ran the caller and the callee together: a function whose paths
        // call out every few blocks saves less than that (busybox sort's merge loop calls its
        // comparison every 3 blocks, and ran 40 % slower instrumented), and is left out; its
        // callers then call out to it, so the rest is looked at again, until nothing changes.
        let indirect: FxMap<u32, Vec<u32>> = cands
            .iter()
            .map(|(&f, (p, _, _))| (f, p.calls_out.clone()))
            .collect();
        loop {
            // (A function with tail calls out is only ever a hole's root: calls to it call out.)
            let mut sites: FxMap<u64, Option<Vec<GuestAddr>>> = FxMap::default();
            for (&e, &n) in &self.instrumenter.latest {
                if !self.instrumenter.roots_only.contains(&n) {
                    sites.insert(e, self.instrumenter.entry_sites.get(&n).cloned());
                }
            }
            for (p, _, _) in cands.values() {
                if !p.roots_only() {
                    sites.insert(p.entry().0, p.entry_sites.clone());
                }
            }
            let enters = |t: u64, rp: u64| match sites.get(&t) {
                Some(Some(list)) => list.contains(&GuestAddr(rp)),
                Some(None) => true,
                None => false,
            };
            for (f, (plan, calls, _)) in cands.iter_mut() {
                plan.calls_out = indirect[f].clone();
                for &(t, rp, block) in calls.iter() {
                    if !enters(t, rp) {
                        plan.calls_out.push(block);
                    }
                }
                plan.calls_out.sort_unstable();
            }
            let costly: Vec<u32> = cands
                .iter()
                .filter(|(&f, (plan, _, _))| {
                    let (blocks, outs) = self.blocks_per_call_out(f, &plan.calls_out);
                    blocks < MIN_BLOCKS_PER_CALL_OUT * outs
                })
                .map(|(&f, _)| f)
                .collect();
            if costly.is_empty() {
                break;
            }
            for f in costly {
                cands.remove(&f);
            }
        }
        if cands.is_empty() {
            return None;
        }
        let mut plans = Vec::with_capacity(cands.len());
        for (f, (mut plan, _, n)) in cands {
            let numbering = NEXT_NUMBERING.fetch_add(1, Ordering::Relaxed);
            if numbering >= MAX_NUMBERING {
                return None;
            }
            plan.numbering = numbering;
            let borders = (plan.calls_out.len() + plan.tails_out.len()) as u32;
            plan.first_site = NEXT_SITE.fetch_add(borders, Ordering::Relaxed);
            if plan.first_site as u64 + borders as u64 + 1 > MAX_SITES as u64 {
                return None;
            }
            let i = &mut self.instrumenter;
            for (k, &block) in plan.calls_out.iter().chain(&plan.tails_out).enumerate() {
                i.sites
                    .insert(plan.first_site + k as u32, (numbering, block));
            }
            if !plan.tails_out.is_empty() {
                i.tails_out.insert(numbering, plan.tails_out.clone());
            }
            if plan.roots_only() {
                i.roots_only.insert(numbering);
            }
            match &plan.entry_sites {
                Some(list) => {
                    i.entry_sites.insert(numbering, list.clone());
                }
                // (A numbering with no `ret` binds its function to neither kind.)
                None if plan.first_ret_block().is_none() => {}
                None => {
                    i.one_ret.insert(f);
                }
            }
            i.planned.insert(f);
            i.calls_out.insert(numbering, plan.calls_out.clone());
            i.planned_entries.insert(plan.entry().0);
            i.numberings.insert(numbering, (f, n));
            i.latest.insert(plan.entry().0, numbering);
            *i.sent.entry(f).or_insert(0) += 1;
            plans.push(Arc::new(plan));
        }
        Some(Command::InstrumentFunctions { plans })
    }

    /// Gives each candidate with several `ret`s its entry sites: the return points of every
    /// direct call to it the recorder knows, one per calling function (docs/paths-design.md,
    /// "Step 3h as built"), so that a context's returns all go back to one place; a candidate
    /// that some function calls from two sites is dropped.
    fn with_entry_sites(&self, cands: &mut BTreeMap<u32, Candidate>, tables: &Tables) {
        if cands.values().all(|(p, _, _)| p.entry_sites.is_none()) {
            return;
        }
        // Callee entry → (calling function, return point) of every known direct call.
        let mut callers: FxMap<u64, Vec<(u32, u64)>> = FxMap::default();
        for (g, fun) in self.funcs.iter().enumerate() {
            for addr in &fun.node_addr {
                let Some(&id) = self.ids_at.get(addr).and_then(|ids| ids.last()) else {
                    continue;
                };
                if let Some(Terminator::Call { target, return_to }) =
                    tables.blocks.get(id as usize).map(|b| b.terminator)
                {
                    if target != return_to {
                        callers
                            .entry(target.0)
                            .or_default()
                            .push((g as u32, return_to.0));
                    }
                }
            }
        }
        cands.retain(|_, (plan, _, _)| {
            let entry = plan.entry().0;
            let Some(sites) = &mut plan.entry_sites else {
                return true;
            };
            let mut by_caller: FxMap<u32, u64> = FxMap::default();
            for &(g, rp) in callers.get(&entry).into_iter().flatten() {
                if *by_caller.entry(g).or_insert(rp) != rp {
                    return false;
                }
            }
            *sites = by_caller.values().map(|&rp| GuestAddr(rp)).collect();
            sites.sort_unstable();
            true
        });
    }

    /// Blocks function `f`'s finished paths ran, and how many of them were the call blocks
    /// `calls_out` (node indices), weighted by each path's count.
    fn blocks_per_call_out(&self, f: u32, calls_out: &[u32]) -> (u64, u64) {
        let (mut blocks, mut outs) = (0u64, 0u64);
        for &p in &self.funcs[f as usize].paths {
            let path = &self.paths[p as usize];
            let nodes = &path.key[2..path.key.len() - 1];
            blocks += path.count * nodes.len() as u64;
            let n = nodes
                .iter()
                .filter(|n| calls_out.binary_search(n).is_ok())
                .count();
            outs += path.count * n as u64;
        }
        (blocks, outs)
    }

    /// True if instrumented function `f`'s CFG has grown since its last numbering (its
    /// activations handed over at an edge the numbering lacked, and the recorder learnt it
    /// from the cold blocks after): it is renumbered, and its translations replaced, so that
    /// it stops handing over there.
    fn grew(&self, f: u32) -> bool {
        let fun = &self.funcs[f as usize];
        let Some((_, old)) = self.instrumenter.by_entry(fun.entry) else {
            return false;
        };
        if fun.node_addr.len() > old.blocks.len() {
            return true;
        }
        match self.numbering(fun.entry) {
            Some(Ok(now)) => {
                now.edges.len() != old.edges.len() || now.back_edges.len() != old.back_edges.len()
            }
            _ => false,
        }
    }

    /// Path ends of live activations, not yet added to their functions' (a long activation,
    /// a main loop, is planned while it runs): by function, from the bottom and the top
    /// [`LIVE_SCAN_FRAMES`] frames of the stack at most (a deep recursion's frames have few
    /// each).
    fn live_path_ends(&self) -> FxMap<u32, u64> {
        let n = self.stack.len();
        let scanned = match n <= 2 * LIVE_SCAN_FRAMES {
            true => 0..n,
            false => 0..LIVE_SCAN_FRAMES,
        };
        let top = (n - LIVE_SCAN_FRAMES.min(n)).max(scanned.end)..n;
        let mut live: FxMap<u32, u64> = FxMap::default();
        for a in self.stack[scanned].iter().chain(&self.stack[top]) {
            if a.cur != NONE && a.path_ends > 0 {
                *live.entry(a.func).or_insert(0) += a.path_ends;
            }
        }
        live
    }

    /// True if function `f` (with `live` path ends in live activations) runs cheaper
    /// instrumented than cold, as far as its recent history says: since the last look, its
    /// path ends cost the ring at least [`MIN_EVENTS_PER_PATH_END`] events each, or at least
    /// one each where its activations are short (at most [`SHORT_ACTIVATION_PATHS`] path ends
    /// each: there calls and returns, the monitor's dearest events, are most of the work). Not
    /// before [`WARM_UP_LOOKS`] looks have seen it past the thresholds: its first path ends run
    /// before its loops' superblocks.
    fn pays_to_instrument(&mut self, f: u32, live: u64, tables: &Tables) -> bool {
        let (events, ends) = self.events_and_path_ends(f, live, tables);
        let activations = self.funcs[f as usize].activations;
        let now = (events, ends, activations);
        let (looks, then) = self
            .instrumenter
            .window
            .insert(f, (0, now))
            .unwrap_or((0, now));
        if looks < WARM_UP_LOOKS {
            self.instrumenter.window.insert(f, (looks + 1, now));
            return false;
        }
        let events = events.saturating_sub(then.0);
        let ends = ends.saturating_sub(then.1);
        let activations = activations.saturating_sub(then.2);
        let (num, den) = MIN_EVENTS_PER_PATH_END;
        let short = activations.saturating_mul(SHORT_ACTIVATION_PATHS) >= ends;
        ends > 0
            && (events.saturating_mul(den) >= ends.saturating_mul(num) || (short && events >= ends))
    }

    /// For the census: true if function `f`'s whole history so far says it runs cheaper cold
    /// (fewer than [`MIN_EVENTS_PER_PATH_END`] ring events per path end).
    fn cheaper_cold_so_far(&self, f: u32, tables: &Tables) -> bool {
        let (events, ends) = self.events_and_path_ends(f, 0, tables);
        let (num, den) = MIN_EVENTS_PER_PATH_END;
        !self.config.instrument_every && events.saturating_mul(den) < ends.saturating_mul(num)
    }

    /// Function `f`'s ring events so far — events whose first block is one of its blocks, a
    /// superblock's counted once for its whole trace — and its path ends, `live` of them in
    /// live activations.
    fn events_and_path_ends(&self, f: u32, live: u64, tables: &Tables) -> (u64, u64) {
        let fun = &self.funcs[f as usize];
        let events: u64 = fun
            .node_addr
            .iter()
            .flat_map(|a| {
                let blocks = self.ids_at.get(a).into_iter().flatten();
                blocks.chain(self.traces_at.get(a).into_iter().flatten())
            })
            .map(|&id| tables.events_followed(id))
            .sum();
        (events, fun.path_ends + live)
    }

    /// Function `f`'s plan (numbering 0: set when sent; entry sites not yet set) and its calls
    /// (callee entry, return point), if it qualifies on its own (module doc).
    fn plan_of(&self, f: u32, tables: &Tables) -> Option<Candidate> {
        self.plan_or_why(f, tables).ok()
    }

    /// [`Self::plan_of`], or the first rule function `f` fails.
    fn plan_or_why(&self, f: u32, tables: &Tables) -> Result<Candidate, NotPlanned> {
        use NotPlanned::*;
        let fun = &self.funcs[f as usize];
        let mut blocks: Vec<BlockSummary> = Vec::with_capacity(fun.node_addr.len());
        let mut calls = Vec::new();
        let mut calls_out = Vec::new();
        let mut tails_out = Vec::new();
        let mut ret = None;
        let mut several_rets = false;
        for &addr in &fun.node_addr {
            let id = *self
                .ids_at
                .get(&addr)
                .and_then(|ids| ids.last())
                .ok_or(Unknown)?;
            let b = *tables.blocks.get(id as usize).ok_or(Unknown)?;
            // A jump to another function's entry is a tail call out of the region: a plain
            // jump (or fall-through) ends the activation there (`tails_out`); a branch to one is
            // not instrumented.
            let out = |t: GuestAddr| t.0 != fun.entry && self.func_by_entry.contains_key(&t.0);
            if b.terminator.static_successors().into_iter().any(out)
                && !matches!(b.terminator, Terminator::Call { .. })
            {
                match b.terminator {
                    Terminator::Jump { .. } | Terminator::FallThrough { .. } => {
                        tails_out.push(blocks.len() as u32);
                        blocks.push(b);
                        continue;
                    }
                    _ => return Err(TailCallOut),
                }
            }
            match b.terminator {
                Terminator::Jump { .. }
                | Terminator::FallThrough { .. }
                | Terminator::Branch { .. } => {}
                // Blocks may end at one `ret` instruction or at several (the plan then says
                // which call sites may enter: `with_entry_sites`).
                Terminator::Return => {
                    if *ret.get_or_insert(b.terminator_addr) != b.terminator_addr {
                        several_rets = true;
                    }
                }
                Terminator::Call { target, return_to } if target != return_to => {
                    // The callee is a function, and it has returned here (the call edge is in
                    // the numbering).
                    self.func_by_entry.get(&target.0).ok_or(Unknown)?;
                    fun.nodes.get(&return_to.0).ok_or(CallNotReturned)?;
                    calls.push((target.0, return_to.0, blocks.len() as u32));
                }
                // An indirect call leaves the region (a call out), once it has returned.
                Terminator::IndirectCall { return_to } => {
                    fun.nodes.get(&return_to.0).ok_or(CallNotReturned)?;
                    calls_out.push(blocks.len() as u32);
                }
                Terminator::IndirectJump => return Err(Indirect),
                _ => return Err(SyscallOrTrap),
            }
            blocks.push(b);
        }
        // With no `ret` known (a function planned while it runs, whose activation has not
        // returned yet: a main loop) it is only a hole's root, as with a tail call out.
        let roots_only = !tails_out.is_empty() || ret.is_none();
        if roots_only && self.instrumenter.planned.contains(&f) {
            // Planned as one its callers may call in the region before, which a function
            // that is only a hole's root cannot let them.
            let before = self.instrumenter.latest_numbering(fun.entry);
            if before.is_some_and(|n| !self.instrumenter.roots_only.contains(n)) {
                return Err(TailCallOut);
            }
        }
        if several_rets && self.instrumenter.one_ret.contains(&f) {
            // Planned with one `ret` before: its numberings stay of one kind (the derivation
            // attributes their `ret` edges one way or the other).
            return Err(SeveralRets);
        }
        let n = self
            .numbering(fun.entry)
            .ok_or(Unknown)?
            .map_err(|_| Unknown)?;
        if n.num_paths == 0 || n.num_paths > MAX_PLAN_PATHS {
            return Err(TooManyPaths);
        }
        debug_assert!(n.blocks.iter().zip(&blocks).all(|(&a, b)| a == b.start.0));
        let plan = PathPlan {
            numbering: 0,
            blocks,
            start: n.start,
            edges: n.edges.clone(),
            back_edges: n.back_edges.clone(),
            exits: n.exits.clone(),
            num_paths: n.num_paths,
            // Set by `with_entry_sites` for several `ret`s.
            entry_sites: several_rets.then(Vec::new),
            // Direct calls out are added once the region is known.
            calls_out,
            tails_out,
            first_site: 0,
        };
        Ok((plan, calls, n))
    }

    /// Developer aid (`HOTPATH_INSTRUMENT_WHY`): the functions past `threshold` path ends
    /// (and the PAP threshold), by why they are not instrumented — or that they are — each
    /// with its functions, their path ends, and the names of its three with the most, the
    /// largest first. Taken before the guest's counters are added: an instrumented function's path ends are
    /// those the ring showed.
    pub fn instrumentation_census(
        &self,
        tables: &Tables,
        threshold: u64,
    ) -> Vec<(&'static str, usize, u64, String)> {
        let threshold = threshold.max(self.config.pap_threshold);
        // Reason → functions, their path ends, and each one's (path ends, function).
        type Tally = (usize, u64, Vec<(u64, u32)>);
        let mut by: BTreeMap<&'static str, Tally> = BTreeMap::new();
        let mut qualify: Vec<u32> = Vec::new();
        for (f, fun) in self.funcs.iter().enumerate() {
            if fun.path_ends < threshold {
                continue;
            }
            let why = if self.instrumenter.planned.contains(&(f as u32)) {
                "instrumented"
            } else {
                match self.plan_or_why(f as u32, tables) {
                    Ok(_) if self.cheaper_cold_so_far(f as u32, tables) => "cheaper cold (so far)",
                    Ok(_) => {
                        qualify.push(f as u32);
                        continue;
                    }
                    Err(why) => why.name(),
                }
            };
            let e = by.entry(why).or_default();
            e.0 += 1;
            e.1 += fun.path_ends;
            e.2.push((fun.path_ends, f as u32));
        }
        // Those that qualify and are not planned yet (the next look plans them).
        for &f in &qualify {
            let e = by.entry("qualifies, not planned yet").or_default();
            e.0 += 1;
            e.1 += self.funcs[f as usize].path_ends;
            e.2.push((self.funcs[f as usize].path_ends, f));
        }
        // The three with the most path ends, by name.
        let name = |f: u32| {
            let fun = &self.funcs[f as usize];
            match fun.symbol.and_then(|s| self.config.symbols.get(s)) {
                Some(s) => s.name.clone(),
                None => format!("{:#x}", fun.entry),
            }
        };
        // The functions with the most path ends: their ring events per path end.
        let mut top: Vec<(u64, u32)> = self
            .funcs
            .iter()
            .enumerate()
            .map(|(f, fun)| (fun.path_ends, f as u32))
            .collect();
        top.sort_unstable_by(|a, b| b.cmp(a));
        for &(_, f) in top.iter().take(5) {
            let (events, ends) = self.events_and_path_ends(f, 0, tables);
            eprintln!(
                "hotpath:   {:<32} {ends:>12} path ends {events:>12} events: {:.3} a path end",
                name(f),
                events as f64 / ends.max(1) as f64
            );
        }
        let mut out: Vec<_> = by
            .into_iter()
            .map(|(w, (n, e, mut fs))| {
                fs.sort_unstable_by(|a, b| b.cmp(a));
                let top: Vec<String> = fs.iter().take(3).map(|&(_, f)| name(f)).collect();
                (w, n, e, top.join(", "))
            })
            .collect();
        out.sort_by_key(|c| std::cmp::Reverse(c.2));
        out
    }
}

/// Ring events per path end (numerator, denominator: 3/2) below which a function is left
/// cold, unless its activations are short: there its loops run as unrolled superblocks, one
/// event for several path ends, and a path end in instrumented code costs the guest about 25
/// instructions where an event costs it about 5 (and the monitor 5–50 ns, on its own core:
/// loops' blocks cheap, calls and returns dear). Measured with hand-ins (docs/measurements.md,
/// sixth session), by the ratio the rule weighs: bench_sieve's `main` (0.15 in steady state)
/// ran 2.1× slower instrumented, bench_nbody's (1.0–1.3, one activation) 13 % slower.
const MIN_EVENTS_PER_PATH_END: (u64, u64) = (3, 2);

/// Path ends per activation at most of a function whose activations are short: one ring
/// event per path end is enough for it to be planned. bench_fib's `fib` (1.4 path ends an
/// activation) runs at 1.45 events per path end once its superblocks are built, below
/// [`MIN_EVENTS_PER_PATH_END`]: judged by that alone it stayed cold in 2 runs of 8 (11 s
/// against 1.9 s instrumented).
const SHORT_ACTIVATION_PATHS: u64 = 8;

/// Looks that see a function past the thresholds before its events per path end are
/// weighed (over the interval since the last one): its first path ends, before the monitor
/// asked for its loops' superblocks and they were built, cost an event per block. With one
/// look, bench_sieve's `main` showed 1.4 events per path end; it runs at 0.15.
const WARM_UP_LOOKS: u32 = 4;

/// Frames at each end of the shadow stack whose live path ends count toward planning (each
/// look would otherwise walk a deep recursion's 262 144 frames).
const LIVE_SCAN_FRAMES: usize = 1024;

/// A function that qualifies: its plan, its direct calls (callee entry, return point, call
/// block index), its numbering.
type Candidate = (PathPlan, Vec<(u64, u64, u32)>, Numbering);

/// Why a function past the thresholds is not instrumented: the first rule of the module doc
/// it fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NotPlanned {
    /// A block or its numbering is not known (yet).
    Unknown,
    /// A branch to another function's entry, or a tail call out (or no `ret` known) in a
    /// function planned as one its callers may call in the region.
    TailCallOut,
    /// Blocks end at more than one `ret` instruction, and it was planned with one before.
    SeveralRets,
    /// A call whose return point it has not reached.
    CallNotReturned,
    /// An indirect jump or call.
    Indirect,
    /// A system call or a trap.
    SyscallOrTrap,
    /// More than `MAX_PLAN_PATHS` paths.
    TooManyPaths,
}

impl NotPlanned {
    fn name(self) -> &'static str {
        match self {
            NotPlanned::Unknown => "not known yet",
            NotPlanned::TailCallOut => "tail call out",
            NotPlanned::SeveralRets => "several rets",
            NotPlanned::CallNotReturned => "a call not returned",
            NotPlanned::Indirect => "indirect jump or call",
            NotPlanned::SyscallOrTrap => "system call or trap",
            NotPlanned::TooManyPaths => "too many paths",
        }
    }
}
