//! Choosing the functions whose path registers translated code keeps, and making their plans
//! (#21 stage 2, step 3e's decision; docs/paths-design.md, "Step 3c decided", item 1).
//!
//! The first cut instruments *closed regions*: a function qualifies when it has ended at least
//! the threshold's number of paths, every block the recorder knows of it ends in a direct jump,
//! a fall-through, a conditional branch, a direct `call` (not the get-pc one) or a `ret` — no
//! jump to another function's entry (a tail call out of the region) — it
//! has exactly one `ret` instruction (blocks that start at different addresses may run to it),
//! and its numbering has at most
//! [`MAX_PLAN_PATHS`] paths. The region is the largest set of qualifying functions whose calls
//! all go to functions of the set (or to ones instrumented before): a greatest fixed point,
//! found by dropping callers of functions outside until nothing changes. bench_fib's `fib` and
//! `tak` are one.
//!
//! A function is instrumented only once it records PAP runs (past `--pap-threshold` path ends
//! too): its instrumented activations keep their runs in the guest's run trie from their
//! start, as the per-block recorder keeps those of every activation that starts after the
//! function passed the threshold (docs/paths-design.md, "Step 3d as built").

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use hotpath_events::{Command, PathPlan, MAX_NUMBERING, MAX_PLAN_PATHS};
use hotpath_ir::{BlockSummary, GuestAddr, Terminator};

use super::ids::FxMap;
use super::numbering::Numbering;
use super::recorder::PathRecorder;
use crate::Tables;

/// Most events recorded between two looks for new regions (a look walks every function);
/// fewer at a low threshold (tests), so that short programs are instrumented too.
const LOOK_EVERY_EVENTS: u64 = 1 << 16;

/// Most numberings one function is sent (the first and its renumberings).
const MAX_NUMBERINGS_PER_FUNCTION: u32 = 8;

/// Numberings handed out in this process (the translator tells counters apart by them; never
/// 0).
static NEXT_NUMBERING: AtomicU32 = AtomicU32::new(1);

/// What the recorder keeps of its instrumentation requests.
#[derive(Clone, Debug, Default)]
pub(crate) struct Instrumenter {
    /// Functions (recorder indices) sent in a plan set: never sent again.
    planned: HashSet<u32>,
    /// Guest entries of the planned functions (calls to them keep a region closed).
    planned_entries: HashSet<u64>,
    /// Events recorded when regions were last looked for.
    last_look: u64,
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
    /// `(numbering, path id)` → the recorder's path number and its function.
    pub(crate) path_numbers: FxMap<(u32, u32), (u32, u32)>,
    /// A hand-over's run node (the guest's index) → the recorder's run node and its length.
    pub(crate) handed_runs: FxMap<u32, (u32, u32)>,
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
        if events.saturating_sub(self.instrumenter.last_look) < every {
            return None;
        }
        self.instrumenter.last_look = events;
        let threshold = threshold.max(self.config.pap_threshold);
        // Candidate function → (plan, call targets, numbering).
        let mut cands: BTreeMap<u32, (PathPlan, Vec<u64>, Numbering)> = BTreeMap::new();
        for (f, fun) in self.funcs.iter().enumerate() {
            let f = f as u32;
            if fun.path_ends < threshold {
                continue;
            }
            let sent = self.instrumenter.sent.get(&f).copied().unwrap_or(0);
            if self.instrumenter.planned.contains(&f)
                && (sent >= MAX_NUMBERINGS_PER_FUNCTION || !self.grew(f))
            {
                continue;
            }
            if let Some(c) = self.plan_of(f, tables) {
                cands.insert(f, c);
            }
        }
        loop {
            let entries: HashSet<u64> = cands
                .values()
                .map(|(p, _, _)| p.entry().0)
                .chain(self.instrumenter.planned_entries.iter().copied())
                .collect();
            let before = cands.len();
            cands.retain(|_, (_, calls, _)| calls.iter().all(|t| entries.contains(t)));
            if cands.len() == before {
                break;
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
            let i = &mut self.instrumenter;
            i.planned.insert(f);
            i.planned_entries.insert(plan.entry().0);
            i.numberings.insert(numbering, (f, n));
            i.latest.insert(plan.entry().0, numbering);
            *i.sent.entry(f).or_insert(0) += 1;
            plans.push(Arc::new(plan));
        }
        Some(Command::InstrumentFunctions { plans })
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

    /// Function `f`'s plan (numbering 0: set when sent) and its calls' targets, if it
    /// qualifies on its own (module doc).
    fn plan_of(&self, f: u32, tables: &Tables) -> Option<(PathPlan, Vec<u64>, Numbering)> {
        self.plan_or_why(f, tables).ok()
    }

    /// [`Self::plan_of`], or the first rule function `f` fails.
    fn plan_or_why(
        &self,
        f: u32,
        tables: &Tables,
    ) -> Result<(PathPlan, Vec<u64>, Numbering), NotPlanned> {
        use NotPlanned::*;
        let fun = &self.funcs[f as usize];
        let mut blocks: Vec<BlockSummary> = Vec::with_capacity(fun.node_addr.len());
        let mut calls = Vec::new();
        let mut ret = None;
        for &addr in &fun.node_addr {
            let id = *self
                .ids_at
                .get(&addr)
                .and_then(|ids| ids.last())
                .ok_or(Unknown)?;
            let b = *tables.blocks.get(id as usize).ok_or(Unknown)?;
            // A jump to another function's entry is a tail call out of the region.
            let out = |t: GuestAddr| t.0 != fun.entry && self.func_by_entry.contains_key(&t.0);
            if b.terminator.static_successors().into_iter().any(out)
                && !matches!(b.terminator, Terminator::Call { .. })
            {
                return Err(TailCallOut);
            }
            match b.terminator {
                Terminator::Jump { .. }
                | Terminator::FallThrough { .. }
                | Terminator::Branch { .. } => {}
                // Every `ret` block must end at the one `ret` instruction.
                Terminator::Return
                    if *ret.get_or_insert(b.terminator_addr) != b.terminator_addr =>
                {
                    return Err(SeveralRets)
                }
                Terminator::Return => {}
                Terminator::Call { target, return_to } if target != return_to => {
                    // The callee is a function, and it has returned here (the call edge is in
                    // the numbering).
                    self.func_by_entry.get(&target.0).ok_or(Unknown)?;
                    fun.nodes.get(&return_to.0).ok_or(CallNotReturned)?;
                    calls.push(target.0);
                }
                Terminator::IndirectJump | Terminator::IndirectCall { .. } => return Err(Indirect),
                _ => return Err(SyscallOrTrap),
            }
            blocks.push(b);
        }
        ret.ok_or(NoRet)?;
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
        let mut qualify: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (f, fun) in self.funcs.iter().enumerate() {
            if fun.path_ends < threshold {
                continue;
            }
            let why = if self.instrumenter.planned.contains(&(f as u32)) {
                "instrumented"
            } else {
                match self.plan_or_why(f as u32, tables) {
                    Ok((_, calls, _)) => {
                        qualify.insert(f as u32, calls);
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
        // Those that qualify alone call one that does not, at some depth.
        for &f in qualify.keys() {
            let e = by.entry("calls one that is not").or_default();
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

/// Why a function past the thresholds is not instrumented: the first rule of the module doc
/// it fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NotPlanned {
    /// A block or its numbering is not known (yet).
    Unknown,
    /// A jump to another function's entry.
    TailCallOut,
    /// Blocks end at more than one `ret` instruction.
    SeveralRets,
    /// No `ret` seen (it never returned: `main`, a loop that exits the process).
    NoRet,
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
            NotPlanned::NoRet => "no ret",
            NotPlanned::CallNotReturned => "a call not returned",
            NotPlanned::Indirect => "indirect jump or call",
            NotPlanned::SyscallOrTrap => "system call or trap",
            NotPlanned::TooManyPaths => "too many paths",
        }
    }
}
