//! What each event id stands for (a basic block, a superblock run to its end, or one left at a
//! side exit), and how the event stream is cut into *runs*: the blocks one event, or a
//! superblock event and the side exit after it, executed.

use hotpath_events::IdKind;

use super::ids::NONE;

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
