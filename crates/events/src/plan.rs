//! Path plans: a function's Ball-Larus numbering as its instrumented translation runs it, sent
//! by the monitor to the translator (#21 stage 2; docs/paths-design.md, "Step 3c decided").
//!
//! The monitor numbers a function's CFG as it knows it (`hotpath_monitor::Numbering`: the
//! Ball-Larus lecture, steps 1–4, back edges cut in address order, an exit edge after every
//! block) and sends the increments; translated code adds them to the path register `r` and
//! counts each path's end in the current context's counters. The plan names its blocks by
//! their shapes ([`BlockSummary`]), so the translator can check that the guest code still
//! decodes to them, as it does for a superblock's trace.

use hotpath_ir::{BlockSummary, GuestAddr, Terminator};

/// Most paths of an instrumented function's numbering: its counters take one `u64` per path in
/// every context it runs in (the monitor plans no more; the translator refuses more).
pub const MAX_PLAN_PATHS: u64 = 4096;

/// A forward edge's step: `r += add` (mod 2^64; 0 on spanning-tree edges: no code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanEdge {
    /// Source block (index into [`PathPlan::blocks`]).
    pub from: u32,
    /// Destination block, at a higher guest address.
    pub to: u32,
    /// Added to the register.
    pub add: u64,
}

/// A back edge's step: the path `r + end` is counted, then `r = restart`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanBackEdge {
    /// Source block.
    pub from: u32,
    /// Destination block, at the same or a lower guest address (a loop head).
    pub to: u32,
    /// The ending path's id is `r + end` (mod 2^64).
    pub end: u64,
    /// The register's value after the edge (the next path's start).
    pub restart: u64,
}

/// What the register does on the edge between two blocks of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EdgeStep {
    /// A forward edge: `r += add`.
    Forward(u64),
    /// A back edge: count `r + end`, then `r = restart`.
    Back { end: u64, restart: u64 },
}

/// One function's numbering for instrumented translation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathPlan {
    /// The numbering's id: non-zero, unique in the process; a context node's counters say
    /// which numbering they count for.
    pub numbering: u32,
    /// The function's blocks, as the monitor knows them; block 0 is the entry.
    pub blocks: Vec<BlockSummary>,
    /// The register's value when an activation starts, before block 0.
    pub start: u64,
    /// Forward edges, sorted by `(from, to)`.
    pub edges: Vec<PlanEdge>,
    /// Back edges, sorted by `(from, to)`.
    pub back_edges: Vec<PlanBackEdge>,
    /// Per block: the path that ends when the activation ends after it is `r + exits[u]`.
    pub exits: Vec<u64>,
    /// Number of paths: every id is below it, and the counter array has this many entries.
    pub num_paths: u64,
    /// For a function with several `ret` instructions: the return points of the only call
    /// sites that may enter it instrumented (at most one per calling function, so that each
    /// context's returns go back to one place: docs/paths-design.md, "Step 3h as built");
    /// other calls run it cold. `None` for a function with one `ret`: any call may.
    pub entry_sites: Option<Vec<GuestAddr>>,
    /// The blocks (indices, ascending) whose call leaves the region: an indirect call, or a
    /// direct call of a function the region does not hold. The callee runs cold, between a
    /// call-out event and a return-in event ([`BorderEvent`]; docs/paths-design.md, "Step 3g").
    /// Every other call block calls an instrumented function of the region.
    pub calls_out: Vec<u32>,
    /// The blocks (indices, ascending) that end in a jump to another function's entry: a tail
    /// call out of the region. The activation's last path ends there; the callee runs cold in
    /// its frame, after a tail-out event ([`BorderEvent::TailOut`]). A function with tail calls
    /// out is only ever a hole's root (no call enters it instrumented from the region).
    pub tails_out: Vec<u32>,
    /// The border event site id of `calls_out[0]`; `calls_out[i]`'s is `first_site + i`, and
    /// `tails_out[i]`'s `first_site + calls_out.len() + i` (ids the monitor hands out, unique
    /// in the process, below [`MAX_SITES`]).
    pub first_site: u32,
}

impl PathPlan {
    /// Guest address of the function's entry.
    pub fn entry(&self) -> GuestAddr {
        self.blocks[0].start
    }

    /// The index of the block at guest address `addr`, if the plan has it.
    pub fn index_of(&self, addr: GuestAddr) -> Option<u32> {
        self.blocks
            .iter()
            .position(|b| b.start == addr)
            .map(|i| i as u32)
    }

    /// The register's step on the edge `from → to`, or `None` when the numbering does not
    /// have the edge (the CFG grew since: the activation is handed over).
    pub fn step(&self, from: u32, to: u32) -> Option<EdgeStep> {
        if let Ok(i) = self
            .edges
            .binary_search_by_key(&(from, to), |e| (e.from, e.to))
        {
            return Some(EdgeStep::Forward(self.edges[i].add));
        }
        self.back_edges
            .binary_search_by_key(&(from, to), |e| (e.from, e.to))
            .ok()
            .map(|i| {
                let b = &self.back_edges[i];
                EdgeStep::Back {
                    end: b.end,
                    restart: b.restart,
                }
            })
    }

    /// The step on the edge to the guest address `to` from block `from`: `Some((index, step))`
    /// when `to` is a block of the plan and the edge is numbered.
    pub fn step_to(&self, from: u32, to: GuestAddr) -> Option<(u32, EdgeStep)> {
        let j = self.index_of(to)?;
        Some((j, self.step(from, j)?))
    }

    /// The first block that ends in a `ret`, if any.
    pub fn first_ret_block(&self) -> Option<u32> {
        self.blocks
            .iter()
            .position(|b| b.terminator == Terminator::Return)
            .map(|i| i as u32)
    }

    /// True if block `index`'s call leaves the region ([`PathPlan::calls_out`]).
    pub fn calls_out(&self, index: u32) -> bool {
        self.calls_out.binary_search(&index).is_ok()
    }

    /// The call-out site id of block `index`, if its call leaves the region.
    pub fn call_out_site(&self, index: u32) -> Option<u32> {
        let i = self.calls_out.binary_search(&index).ok()?;
        Some(self.first_site + i as u32)
    }

    /// The tail-out site id of block `index`, if it ends in a tail call out.
    pub fn tail_out_site(&self, index: u32) -> Option<u32> {
        let i = self.tails_out.binary_search(&index).ok()?;
        Some(self.first_site + (self.calls_out.len() + i) as u32)
    }

    /// True if a call from an instrumented function of the region, returning to `return_to`,
    /// may enter this function instrumented: it is not only a hole's root
    /// ([`PathPlan::roots_only`]), and the call site is let in ([`PathPlan::enters_from`]).
    pub fn enters_in_region(&self, return_to: GuestAddr) -> bool {
        !self.roots_only() && self.enters_from(return_to)
    }

    /// True if the function's activations are only ever a hole's root, never entered by a
    /// call from its region: it has a tail call out (its callee would return to the caller's
    /// reload stub unannounced), or no `ret` the monitor knows of (an activation planned
    /// while it runs, a main loop: its return hands it over).
    pub fn roots_only(&self) -> bool {
        !self.tails_out.is_empty() || self.first_ret_block().is_none()
    }

    /// True if a call returning to `return_to` may enter the function instrumented
    /// ([`PathPlan::entry_sites`]).
    pub fn enters_from(&self, return_to: GuestAddr) -> bool {
        match &self.entry_sites {
            None => true,
            Some(sites) => sites.contains(&return_to),
        }
    }

    /// The first block ending at the function's one `ret` instruction, if it has exactly one
    /// (a closed region's functions do: docs/paths-design.md, "Step 3c decided", item 1).
    /// Blocks that start at different addresses may end at the same `ret` — a branch into the
    /// middle of a block starts another block that runs to the same end.
    pub fn ret_block(&self) -> Option<u32> {
        let mut rets = self
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.terminator == Terminator::Return);
        let (i, first) = rets.next()?;
        rets.all(|(_, b)| b.terminator_addr == first.terminator_addr)
            .then_some(i as u32)
    }
}

/// Tag of a hand-over word: bits 31 and 30 both set (block ids have neither, system call
/// events bit 31 alone, context events bit 30 alone).
pub const HANDOVER_EVENT: u32 = 0b11 << 30;

const PART_SHIFT: u32 = 28;
const PAYLOAD_BITS: u32 = 28;
const PAYLOAD_MASK: u32 = (1 << PAYLOAD_BITS) - 1;

/// Bits of a tagged event's first word that say what it is (above the count or numbering).
const KIND_SHIFT: u32 = 26;
const KIND_HANDOVER: u32 = 0;
const KIND_SUSPENDED: u32 = 1;
const KIND_CALL_OUT: u32 = 2;
const KIND_RETURN_IN: u32 = 3;
const LOW_MASK: u32 = (1 << KIND_SHIFT) - 1;

/// Largest numbering id a hand-over can name, plus one.
pub const MAX_NUMBERING: u32 = 1 << KIND_SHIFT;

/// Largest call-out site id a border event can name, plus one.
pub const MAX_SITES: u32 = 1 << KIND_SHIFT;

/// True if `word` is part of a hand-over event.
#[inline(always)]
pub fn is_handover(word: u32) -> bool {
    word & HANDOVER_EVENT == HANDOVER_EVENT
}

/// Where one handed-over activation is in its function's numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandedAt {
    /// Its path ran up to and including block `block`, with the register at `r` there (a
    /// Ball-Larus prefix sum, unique per block: the monitor regenerates the prefix).
    Block { block: u32, r: u64 },
    /// A back edge to `head` just ended its path: the next path starts at `head`, which has
    /// not run yet.
    Head { head: u32 },
    /// Its path ran up to and including the call block `call` (the register `r` there), and
    /// that call's callee ran instrumented and returned: the return point has not run yet.
    Returned { call: u32, r: u64 },
    /// It started (its announcing event was written) and nothing of it ran: it runs cold from
    /// its entry.
    Start,
}

/// One activation of an instrumented function that turns cold (docs/paths-design.md, "Step 3c
/// decided", item 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandedActivation {
    /// The numbering it ran under ([`PathPlan::numbering`]).
    pub numbering: u32,
    /// Where its current path is.
    pub at: HandedAt,
    /// Its PAP run so far: the index of its node in the thread's run trie
    /// (`hotpath_contexts::ContextView::run_node`), 0 when it records none (its run was
    /// abandoned) or has not started (`HandedAt::Start`).
    pub run: u32,
}

/// A hand-over: every live instrumented activation of a thread turns cold at once, bottom
/// (the hole's root) first. Written to the ring as tagged words:
///
/// ```text
/// word 0:                 11 | 00 | kind: 00 running hole, 01 suspended (2) | activations (26)
/// per activation, 6 words: 11 | 01 | numbering
///                          11 | 10 | where: 00 block, 01 head, 10 returned, 11 start | index (26)
///                          11 | 11 | r bits 0..28,  11 | 11 | bits 28..56,  11 | 11 | bits 56..64
///                          11 | 11 | run node index
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HandOver {
    /// The activations, the hole's root first.
    pub activations: Vec<HandedActivation>,
    /// The hole is suspended, not the running one: its last activation called out of the
    /// region (it is at that call block) and the callee, cold, has not returned yet; the
    /// monitor's stack holds the callee's activations above the hole's root, which stay
    /// (word 0's kind is 01 instead of 00).
    pub suspended: bool,
}

/// Words per handed-over activation.
const ACTIVATION_WORDS: usize = 6;

/// Bits of a block index in a hand-over's "where" word (a plan has far fewer blocks).
const INDEX_BITS: u32 = 26;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;

impl HandOver {
    /// The event's words.
    ///
    /// # Panics
    /// If a numbering or a run node index does not fit 28 bits or a block index 26 (plans and
    /// run tries never have them).
    pub fn encode(&self) -> Vec<u32> {
        let word = tagged_word;
        let mut out = Vec::with_capacity(1 + ACTIVATION_WORDS * self.activations.len());
        let kind = match self.suspended {
            false => KIND_HANDOVER,
            true => KIND_SUSPENDED,
        };
        assert!(self.activations.len() as u32 <= LOW_MASK);
        out.push(word(0, kind << KIND_SHIFT | self.activations.len() as u32));
        for a in &self.activations {
            out.push(word(1, a.numbering));
            let (kind, index, r) = match a.at {
                HandedAt::Block { block, r } => (0, block, r),
                HandedAt::Head { head } => (1, head, 0),
                HandedAt::Returned { call, r } => (2, call, r),
                HandedAt::Start => (3, 0, 0),
            };
            assert!(
                index <= INDEX_MASK,
                "a hand-over's block index fits 26 bits"
            );
            let where_ = kind << INDEX_BITS | index;
            out.push(word(2, where_));
            out.push(word(3, r as u32 & PAYLOAD_MASK));
            out.push(word(3, (r >> PAYLOAD_BITS) as u32 & PAYLOAD_MASK));
            out.push(word(3, (r >> (2 * PAYLOAD_BITS)) as u32));
            out.push(word(3, a.run));
        }
        out
    }
}

/// The word of a tagged event: `part` (2 bits) and `payload` (28 bits) under the tag.
///
/// # Panics
/// If the payload does not fit 28 bits.
fn tagged_word(part: u32, payload: u32) -> u32 {
    assert!(
        payload <= PAYLOAD_MASK,
        "a tagged event's payload fits 28 bits"
    );
    HANDOVER_EVENT | part << PART_SHIFT | payload
}

/// Where an instrumented region meets cold code (docs/paths-design.md, "Step 3g as built"):
/// written by translated code (or by the runtime for it) as tagged words, like a hand-over.
///
/// ```text
/// call out:  11 | 00 | 10 | site (26)    11 | 01 | caller's context id
/// return in: 11 | 00 | 11 | 0
/// tail out:  11 | 00 | 11 | site + 1 (26)
/// hand in:   11 | 00 | 10 | numbering (26)    11 | 10 | head block (26)    11 | 11 | run node
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BorderEvent {
    /// The call block of call-out site `site` ([`PathPlan::first_site`]) calls out of its
    /// region: written before the call's frame is pushed and its context step made
    /// (`context` is the caller's context, a `hotpath_contexts::ContextId`); the callee's
    /// blocks follow in the ring.
    CallOut { site: u32, context: u32 },
    /// The callee of the innermost suspended call out returned to its frame: the region goes
    /// on at the call's return point, instrumented.
    ReturnIn,
    /// The block of tail-out site `site` jumped to another function's entry: the hole's root
    /// ended its last path there (counted in its counters), and the callee, cold, takes its
    /// frame.
    TailOut { site: u32 },
    /// A cold activation of numbering `numbering`'s function took a back edge to its block
    /// `head` and goes on instrumented from there: its next path starts at `head` (`r` its
    /// restart value, counted in its context's counters), and its PAP run goes on under the
    /// guest's *hand-in root* `run` (a run node index; 0: none could be had). Written by the
    /// runtime after the back edge's block (docs/paths-design.md, "Hand-in as built").
    HandIn { numbering: u32, head: u32, run: u32 },
}

/// Words of a call-out event.
pub const CALL_OUT_WORDS: usize = 2;

/// Words of a return-in event.
pub const RETURN_IN_WORDS: usize = 1;

/// Words of a hand-in event.
pub const HAND_IN_WORDS: usize = 3;

impl BorderEvent {
    /// The event's words.
    ///
    /// # Panics
    /// If the site, a numbering or a head does not fit 26 bits, or the context or the run
    /// node 28.
    pub fn encode(&self) -> Vec<u32> {
        match *self {
            BorderEvent::CallOut { site, context } => vec![
                Self::call_out_word(site),
                Self::context_word(0) | tagged_word(1, context),
            ],
            BorderEvent::ReturnIn => vec![Self::RETURN_IN],
            BorderEvent::TailOut { site } => vec![Self::tail_out_word(site)],
            BorderEvent::HandIn {
                numbering,
                head,
                run,
            } => {
                assert!(numbering < MAX_NUMBERING && head <= INDEX_MASK);
                vec![
                    tagged_word(0, KIND_CALL_OUT << KIND_SHIFT | numbering),
                    tagged_word(2, head),
                    tagged_word(3, run),
                ]
            }
        }
    }

    /// The word of site `site`'s tail out.
    ///
    /// # Panics
    /// If the site does not fit 26 bits less one.
    pub fn tail_out_word(site: u32) -> u32 {
        assert!(site + 1 < MAX_SITES, "a tail-out site fits 26 bits");
        Self::RETURN_IN | (site + 1)
    }

    /// The first word of site `site`'s call out: translated code writes it as a constant.
    ///
    /// # Panics
    /// If the site does not fit 26 bits.
    pub fn call_out_word(site: u32) -> u32 {
        assert!(site < MAX_SITES, "a call-out site fits 26 bits");
        tagged_word(0, KIND_CALL_OUT << KIND_SHIFT | site)
    }

    /// The call out's second word with context id `context` (translated code adds the id to
    /// `context_word(0)`: the id fits 28 bits, so the sum is their OR).
    pub fn context_word(context: u32) -> u32 {
        tagged_word(1, context)
    }

    /// The return-in event's one word.
    pub const RETURN_IN: u32 = HANDOVER_EVENT | KIND_RETURN_IN << KIND_SHIFT;
}

/// A tagged event of the ring (tag `11`): a hand-over or a border event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaggedEvent {
    /// Instrumented activations turn cold.
    HandOver(HandOver),
    /// A call out of a region, or the return into it.
    Border(BorderEvent),
}

/// Reassembles tagged events (hand-overs and border events) from their words, which may
/// arrive split across reads of the ring.
#[derive(Clone, Debug, Default)]
pub struct HandOverDecoder {
    /// The event's kind (`KIND_*`) while one is being read.
    kind: u32,
    /// Activations a hand-over still expects (0: no hand-over being read).
    expected: usize,
    /// A call out's site while its context word is awaited, or a hand-in's numbering.
    numbering: u32,
    /// A hand-in's head block while its run word is awaited.
    head: Option<u32>,
    words: Vec<u32>,
    partial: HandOver,
}

impl HandOverDecoder {
    /// Takes tagged word `word`; returns the event once its last word is in. Words out of
    /// order start over (only a ring hotpath wrote wrongly has them).
    pub fn push(&mut self, word: u32) -> Option<TaggedEvent> {
        debug_assert!(is_handover(word));
        let part = (word >> PART_SHIFT) & 0b11;
        let payload = word & PAYLOAD_MASK;
        if part == 0 {
            self.kind = payload >> KIND_SHIFT;
            self.words.clear();
            self.partial = HandOver {
                activations: Vec::new(),
                suspended: self.kind == KIND_SUSPENDED,
            };
            return match self.kind {
                KIND_HANDOVER | KIND_SUSPENDED => {
                    self.expected = (payload & LOW_MASK) as usize;
                    (self.expected == 0)
                        .then(|| TaggedEvent::HandOver(std::mem::take(&mut self.partial)))
                }
                KIND_RETURN_IN => {
                    self.expected = 0;
                    Some(TaggedEvent::Border(match payload & LOW_MASK {
                        0 => BorderEvent::ReturnIn,
                        s => BorderEvent::TailOut { site: s - 1 },
                    }))
                }
                _ => {
                    // A call out (its context word follows) or a hand in (its head's).
                    self.expected = usize::MAX;
                    self.numbering = payload & LOW_MASK;
                    self.head = None;
                    None
                }
            };
        }
        if self.expected == 0 {
            return None;
        }
        if self.kind == KIND_CALL_OUT {
            return match (part, self.head) {
                (1, None) => {
                    self.expected = 0;
                    Some(TaggedEvent::Border(BorderEvent::CallOut {
                        site: self.numbering,
                        context: payload,
                    }))
                }
                (2, None) => {
                    self.head = Some(payload);
                    None
                }
                (3, Some(head)) => {
                    self.expected = 0;
                    Some(TaggedEvent::Border(BorderEvent::HandIn {
                        numbering: self.numbering,
                        head,
                        run: payload,
                    }))
                }
                _ => {
                    self.expected = 0;
                    None
                }
            };
        }
        let want = match self.words.len() {
            0 => 1,
            1 => 2,
            _ => 3,
        };
        if part != want {
            self.expected = 0;
            return None;
        }
        self.words.push(payload);
        if self.words.len() < ACTIVATION_WORDS {
            return None;
        }
        let w = std::mem::take(&mut self.words);
        let r = w[2] as u64 | (w[3] as u64) << PAYLOAD_BITS | (w[4] as u64) << (2 * PAYLOAD_BITS);
        let index = w[1] & INDEX_MASK;
        let at = match w[1] >> INDEX_BITS {
            0 => HandedAt::Block { block: index, r },
            1 => HandedAt::Head { head: index },
            2 => HandedAt::Returned { call: index, r },
            _ => HandedAt::Start,
        };
        self.partial.activations.push(HandedActivation {
            numbering: w[0],
            at,
            run: w[5],
        });
        if self.partial.activations.len() == self.expected {
            self.expected = 0;
            return Some(TaggedEvent::HandOver(std::mem::take(&mut self.partial)));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{is_context, is_id, SYSCALL_EVENT};
    use hotpath_ir::GuestAddr;

    fn block(start: u64, terminator: Terminator) -> BlockSummary {
        BlockSummary {
            start: GuestAddr(start),
            terminator_addr: GuestAddr(start),
            len_bytes: 4,
            instructions: 1,
            terminator,
        }
    }

    #[test]
    fn hand_overs_round_trip_word_by_word() {
        let h = HandOver {
            activations: vec![
                HandedActivation {
                    numbering: 7,
                    at: HandedAt::Block {
                        block: 3,
                        r: 0xdead_beef_0123_4567,
                    },
                    run: 5,
                },
                HandedActivation {
                    numbering: MAX_NUMBERING - 1,
                    at: HandedAt::Head { head: 0 },
                    run: 0,
                },
                HandedActivation {
                    numbering: 1,
                    at: HandedAt::Block {
                        block: 0,
                        r: u64::MAX,
                    },
                    run: PAYLOAD_MASK,
                },
                HandedActivation {
                    numbering: 9,
                    at: HandedAt::Returned {
                        call: INDEX_MASK,
                        r: 12,
                    },
                    run: 1,
                },
                HandedActivation {
                    numbering: 4,
                    at: HandedAt::Start,
                    run: 0,
                },
            ],
            suspended: false,
        };
        let words = h.encode();
        assert_eq!(words.len(), 1 + 5 * ACTIVATION_WORDS);
        let mut d = HandOverDecoder::default();
        let mut out = Vec::new();
        for &w in &words {
            assert!(is_handover(w) && !is_id(w) && !is_context(w));
            assert_ne!(w & HANDOVER_EVENT, SYSCALL_EVENT);
            out.extend(d.push(w));
        }
        assert_eq!(out, vec![TaggedEvent::HandOver(h.clone())]);
        assert_eq!(
            d.push(HandOver::default().encode()[0]),
            Some(TaggedEvent::HandOver(HandOver::default()))
        );
        let suspended = HandOver {
            suspended: true,
            ..h
        };
        let out: Vec<TaggedEvent> = suspended
            .encode()
            .iter()
            .filter_map(|&w| d.push(w))
            .collect();
        assert_eq!(out, vec![TaggedEvent::HandOver(suspended)]);
    }

    #[test]
    fn a_word_out_of_order_drops_the_event() {
        let h = HandOver {
            activations: vec![HandedActivation {
                numbering: 2,
                at: HandedAt::Head { head: 1 },
                run: 3,
            }],
            suspended: false,
        };
        let words = h.encode();
        let mut d = HandOverDecoder::default();
        assert_eq!(d.push(words[0]), None);
        assert_eq!(d.push(words[2]), None);
        for &w in &words[3..] {
            assert_eq!(d.push(w), None);
        }
        let again: Vec<TaggedEvent> = words.iter().filter_map(|&w| d.push(w)).collect();
        assert_eq!(again, vec![TaggedEvent::HandOver(h)]);
    }

    #[test]
    fn border_events_round_trip_between_hand_overs() {
        let out_ = BorderEvent::CallOut {
            site: MAX_SITES - 1,
            context: PAYLOAD_MASK,
        };
        let in_ = BorderEvent::ReturnIn;
        let tail = BorderEvent::TailOut { site: 0 };
        let last = BorderEvent::TailOut {
            site: MAX_SITES - 2,
        };
        let hand_in = BorderEvent::HandIn {
            numbering: MAX_NUMBERING - 1,
            head: INDEX_MASK,
            run: PAYLOAD_MASK,
        };
        assert_eq!(hand_in.encode().len(), HAND_IN_WORDS);
        assert_eq!(out_.encode().len(), CALL_OUT_WORDS);
        assert_eq!(in_.encode().len(), RETURN_IN_WORDS);
        assert_eq!(out_.encode()[0], BorderEvent::call_out_word(MAX_SITES - 1));
        assert_eq!(
            out_.encode()[1],
            BorderEvent::context_word(0) + PAYLOAD_MASK
        );
        let h = HandOver::default();
        let mut d = HandOverDecoder::default();
        let words: Vec<u32> = [
            out_.encode(),
            h.encode(),
            in_.encode(),
            tail.encode(),
            in_.encode(),
            hand_in.encode(),
            last.encode(),
        ]
        .concat();
        assert!(words.iter().all(|&w| is_handover(w)));
        let got: Vec<TaggedEvent> = words.iter().filter_map(|&w| d.push(w)).collect();
        assert_eq!(
            got,
            vec![
                TaggedEvent::Border(out_),
                TaggedEvent::HandOver(h),
                TaggedEvent::Border(in_),
                TaggedEvent::Border(tail),
                TaggedEvent::Border(in_),
                TaggedEvent::Border(hand_in),
                TaggedEvent::Border(last)
            ]
        );
        // A call out cut short by another event's first word is dropped.
        let w = out_.encode();
        assert_eq!(d.push(w[0]), None);
        assert_eq!(d.push(in_.encode()[0]), Some(TaggedEvent::Border(in_)));
        assert_eq!(d.push(w[1]), None);
        // A hand in cut short, or with its words swapped, too.
        let w = hand_in.encode();
        assert_eq!(d.push(w[0]), None);
        assert_eq!(d.push(w[2]), None);
        assert_eq!(d.push(w[1]), None);
        assert_eq!(d.push(w[0]), None);
        assert_eq!(d.push(w[1]), None);
        assert_eq!(d.push(out_.encode()[1]), None);
        assert_eq!(d.push(w[2]), None);
    }

    #[test]
    fn steps_are_found_by_edge() {
        let plan = PathPlan {
            numbering: 1,
            blocks: vec![
                block(
                    0x10,
                    Terminator::Branch {
                        cond: hotpath_ir::Cond::E,
                        taken: GuestAddr(0x30),
                        not_taken: GuestAddr(0x20),
                    },
                ),
                block(
                    0x20,
                    Terminator::Jump {
                        target: GuestAddr(0x10),
                    },
                ),
                block(0x30, Terminator::Return),
            ],
            start: 0,
            edges: vec![
                PlanEdge {
                    from: 0,
                    to: 1,
                    add: 0,
                },
                PlanEdge {
                    from: 0,
                    to: 2,
                    add: 2,
                },
            ],
            back_edges: vec![PlanBackEdge {
                from: 1,
                to: 0,
                end: 1,
                restart: 3,
            }],
            exits: vec![0, 0, 0],
            num_paths: 4,
            entry_sites: None,
            calls_out: vec![],
            tails_out: vec![],
            first_site: 0,
        };
        assert_eq!(plan.entry(), GuestAddr(0x10));
        assert_eq!(plan.step(0, 2), Some(EdgeStep::Forward(2)));
        assert_eq!(
            plan.step_to(1, GuestAddr(0x10)),
            Some((0, EdgeStep::Back { end: 1, restart: 3 }))
        );
        assert_eq!(plan.step(2, 0), None);
        assert_eq!(plan.step_to(0, GuestAddr(0x40)), None);
        assert_eq!(plan.ret_block(), Some(2));
        let mut two = plan.clone();
        two.blocks.push(BlockSummary {
            start: GuestAddr(0x2f),
            ..two.blocks[2]
        });
        assert_eq!(two.ret_block(), Some(2), "two blocks ending at one ret");
        two.blocks[3].terminator_addr = GuestAddr(0x40);
        assert_eq!(two.ret_block(), None, "two rets");
        assert_eq!(two.first_ret_block(), Some(2));
        assert!(two.enters_from(GuestAddr(0x99)));
        two.entry_sites = Some(vec![GuestAddr(0x50)]);
        assert!(two.enters_from(GuestAddr(0x50)) && !two.enters_from(GuestAddr(0x99)));
    }
}
