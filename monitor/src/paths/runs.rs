//! What each event id stands for (a basic block, a superblock run to its end, or one left at a
//! side exit), and how the event stream is cut into *runs*: the blocks one event, or a
//! superblock event and the side exit after it, executed.

use hotpath_events::{is_id, IdKind};

use super::ids::NONE;
use super::recorder::PathRecorder;
use crate::Tables;

/// The basic blocks an event id stands for: `seq[start..start + len]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventInfo {
    pub(crate) start: u32,
    pub(crate) len: u32,
    /// Its first basic block, `seq[start]`.
    pub(crate) first: u32,
    /// A superblock (its extent is told by the event after it).
    pub(crate) is_superblock: bool,
    /// A side exit's superblock ([`NONE`] otherwise).
    pub(crate) superblock: u32,
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

/// The event-level state of a [`PathRecorder`]: what each event id stands for and the
/// superblock waiting for its extent.
#[derive(Clone)]
pub(crate) struct Runs {
    /// Per event id (block, superblock or side exit).
    pub(crate) events: Vec<EventInfo>,
    /// Basic block ids of every event's span, concatenated.
    pub(crate) seq: Vec<u32>,
    /// A superblock event whose extent the next event tells, or [`NONE`].
    pub(crate) pending: u32,
    /// Runs of one repeated event the recorder counted at once in the current piece of
    /// events, as `(start, end)` indices: events `start..end` repeat `events[start - 1]` (for
    /// [`Tables::record_with_repeats`]).
    pub(crate) repeats: Vec<(u32, u32)>,
}

impl Default for Runs {
    fn default() -> Self {
        Runs {
            events: Vec::new(),
            seq: Vec::new(),
            pending: NONE,
            repeats: Vec::new(),
        }
    }
}

impl Runs {
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
}

impl PathRecorder {
    /// The run the superblock left by the previous piece of events stands for (its extent
    /// is this piece's first event), and the events of this piece it took (0 or 1); `None`
    /// if the piece is empty (the superblock still waits).
    pub(crate) fn pending_run(&mut self, events: &[u32], tables: &Tables) -> Option<(u32, usize)> {
        let &next = events.first()?;
        self.learn_event(next, tables);
        let sb = std::mem::replace(&mut self.runs.pending, NONE);
        let exited = self.exits(sb, next);
        Some((if exited { next } else { sb }, exited as usize))
    }

    /// The run that event `events[*i]` begins (a basic block, a superblock run to its end, or
    /// one left at a side exit, which the next event then is), with `*i` moved past it;
    /// [`NextRun::Pending`] if it is a superblock whose extent the next piece of events tells
    /// (kept in `Runs::pending`).
    #[inline(always)]
    pub(crate) fn next_run(&mut self, events: &[u32], i: &mut usize, tables: &Tables) -> NextRun {
        let e = events[*i];
        *i += 1;
        if !is_id(e) || !self.learn_event(e, tables) {
            return NextRun::Skip;
        }
        if !self.runs.events[e as usize].is_superblock {
            return NextRun::Run(e);
        }
        let Some(&next) = events.get(*i) else {
            self.runs.pending = e;
            return NextRun::Pending;
        };
        self.learn_event(next, tables);
        // Branch-free: whether a superblock left early is the guest's own branch, often
        // unpredictable.
        let exited = self.exits(e, next);
        *i += exited as usize;
        NextRun::Run(if exited { next } else { e })
    }

    /// The runs of a repeated event the last [`record`](PathRecorder::record) counted at
    /// once, for [`Tables::record_with_repeats`] of the same events.
    pub(crate) fn repeats(&self) -> &[(u32, u32)] {
        &self.runs.repeats
    }

    /// Makes sure event id `e` is known (a syscall event is not an id). Returns false if
    /// `tables` do not know it (a bug: ids are catalogued before they run).
    #[inline(always)]
    pub(crate) fn learn_event(&mut self, e: u32, tables: &Tables) -> bool {
        if is_id(e) && e as usize >= self.runs.events.len() {
            self.learn_known(tables);
        }
        (e as usize) < self.runs.events.len()
    }

    /// Whether `next`, the event after superblock `sb`, is one of `sb`'s side exits (which
    /// then stands for the blocks `sb` ran); else `sb` ran to its end.
    #[inline(always)]
    pub(crate) fn exits(&self, sb: u32, next: u32) -> bool {
        self.runs
            .events
            .get(next as usize)
            .is_some_and(|n| n.superblock == sb)
    }
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
