//! Context events: how a guest thread tells the monitor that its calling context changed other
//! than by a plain `call` or a `ret` to the top frame (docs/paths-design.md, stage 1 (c)).
//!
//! The guest thread is authoritative for its calling contexts (`hotpath_contexts`). A plain
//! `call` (one that pushes a frame and enters its callee) and a `ret` to the top frame's return
//! address are implied by the block ids the ring carries: the monitor steps its own activation
//! stack the same way. Every other change — a tail call, a return to a deeper frame or to no
//! frame, an indirect jump to a frame's return address, a signal handler entered or left — is
//! written to the ring as a *context event*, right after the event of the block whose
//! terminator made it and before the next block's: one word, or three when it names a function.
//!
//! ```text
//! word 0 (head):    01 | 00 | kind (3 bits) | depth (25 bits: frames after the change)
//! word 1 (address): 01 | 01 | bits 0..28 of the function's guest entry address
//! word 2 (address): 01 | 10 | bits 28..56
//! ```
//!
//! Bit 31 clear and bit 30 set tells every word from a block id (below 2^30) and from a system
//! call event ([`crate::SYSCALL_EVENT`]). Consumers that only count blocks skip context words.

/// Bit 30: the word is part of a context event (with bit 31 clear).
pub const CONTEXT_EVENT: u32 = 1 << 30;

/// The tag bits of an event word: 0 for a block id, [`crate::SYSCALL_EVENT`] or
/// [`CONTEXT_EVENT`] (both set: not used).
pub const TAG_MASK: u32 = 0b11 << 30;

/// Largest block id the ring can carry, plus one: ids are below 2^30.
pub const MAX_EVENT_ID: u32 = CONTEXT_EVENT;

const PART_SHIFT: u32 = 28;
const PART_MASK: u32 = 0b11 << PART_SHIFT;
const KIND_SHIFT: u32 = 25;
const DEPTH_MASK: u32 = (1 << KIND_SHIFT) - 1;
const ADDRESS_BITS: u32 = 28;
const ADDRESS_MASK: u32 = (1 << ADDRESS_BITS) - 1;

/// True if `word` is a block (or superblock, or side exit) id, not a tagged event.
#[inline(always)]
pub fn is_id(word: u32) -> bool {
    word & TAG_MASK == 0
}

/// True if `word` is part of a context event.
#[inline(always)]
pub fn is_context(word: u32) -> bool {
    word & TAG_MASK == CONTEXT_EVENT
}

/// What changed a guest thread's calling context, besides a plain call or return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ContextChange {
    /// A jump to another function's entry: the top activation is replaced by one of the function
    /// whose entry is the next block (same depth).
    TailCall = 0,
    /// A `ret` to the return address of a frame below the top: activations are popped down to
    /// `depth` frames, and the caller's path goes on at the next block.
    DeeperReturn = 1,
    /// A `ret` to no frame's return address: the top activation is replaced by one of the
    /// function named by the event (same depth).
    OrphanReturn = 2,
    /// An indirect jump to a live frame's return address: popped down to `depth` frames.
    JumpReturn = 3,
    /// A signal handler entered: an activation of the function whose entry is the next block
    /// is pushed (`depth` is one more than before).
    SignalEnter = 4,
    /// `rt_sigreturn`: back to the interrupted activation, at `depth` frames.
    SignalReturn = 5,
    /// A `ret` past every frame (which faults): no frames left (`depth` 0).
    Reset = 6,
    /// A call whose callee ran no block returned: code the runtime carries out itself (the
    /// vsyscall page's entries) was called and returned to its caller, at `depth` frames.
    EmulatedReturn = 7,
}

impl ContextChange {
    const ALL: [ContextChange; 8] = [
        ContextChange::TailCall,
        ContextChange::DeeperReturn,
        ContextChange::OrphanReturn,
        ContextChange::JumpReturn,
        ContextChange::SignalEnter,
        ContextChange::SignalReturn,
        ContextChange::Reset,
        ContextChange::EmulatedReturn,
    ];

    /// True if the event names a function (two address words follow its head).
    pub fn names_function(self) -> bool {
        self == ContextChange::OrphanReturn
    }
}

/// One context event, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextEvent {
    /// What changed.
    pub change: ContextChange,
    /// Frames on the guest thread's stack after it (ignored for [`ContextChange::TailCall`],
    /// which does not change it; at most 2^25 - 1).
    pub depth: u32,
    /// Guest address of the entry of the function the event names (0 for kinds that name none).
    pub function: u64,
}

impl ContextEvent {
    /// The head word of a tail call (the one event translated code writes itself).
    pub const TAIL_CALL_WORD: u32 = CONTEXT_EVENT | (ContextChange::TailCall as u32) << KIND_SHIFT;

    /// The event's words: the head, then the function's address in two words when the kind
    /// names one.
    pub fn encode(&self) -> ([u32; 3], usize) {
        let head = CONTEXT_EVENT
            | (self.change as u32) << KIND_SHIFT
            | self.depth.min(DEPTH_MASK) & DEPTH_MASK;
        if !self.change.names_function() {
            return ([head, 0, 0], 1);
        }
        let lo = CONTEXT_EVENT | 1 << PART_SHIFT | (self.function as u32 & ADDRESS_MASK);
        let hi = CONTEXT_EVENT
            | 2 << PART_SHIFT
            | ((self.function >> ADDRESS_BITS) as u32 & ADDRESS_MASK);
        ([head, lo, hi], 3)
    }
}

/// Reassembles context events from their words, which may arrive split across reads of the
/// ring.
#[derive(Clone, Copy, Debug, Default)]
pub struct ContextDecoder {
    partial: Option<ContextEvent>,
    /// Address words still expected for `partial`.
    missing: u8,
}

impl ContextDecoder {
    /// Takes context word `word`; returns the event once its last word is in. A word out of
    /// order (an address word with no head, a head while address words are awaited) starts
    /// over: it can only come from a ring hotpath wrote wrongly.
    pub fn push(&mut self, word: u32) -> Option<ContextEvent> {
        debug_assert!(is_context(word));
        match (word & PART_MASK) >> PART_SHIFT {
            0 => {
                let change = ContextChange::ALL
                    .get(((word >> KIND_SHIFT) & 0b111) as usize)
                    .copied()?;
                let e = ContextEvent {
                    change,
                    depth: word & DEPTH_MASK,
                    function: 0,
                };
                if change.names_function() {
                    self.partial = Some(e);
                    self.missing = 2;
                    None
                } else {
                    self.partial = None;
                    Some(e)
                }
            }
            part => {
                let e = self.partial.as_mut()?;
                let bits = (word & ADDRESS_MASK) as u64;
                match (part, self.missing) {
                    (1, 2) => e.function |= bits,
                    (2, 1) => e.function |= bits << ADDRESS_BITS,
                    _ => {
                        self.partial = None;
                        return None;
                    }
                }
                self.missing -= 1;
                if self.missing == 0 {
                    self.partial.take()
                } else {
                    None
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_word_by_word() {
        let events = [
            ContextEvent {
                change: ContextChange::OrphanReturn,
                depth: 3,
                function: 0x7fff_f7a1_2340,
            },
            ContextEvent {
                change: ContextChange::DeeperReturn,
                depth: 1 << 18,
                function: 0,
            },
            ContextEvent {
                change: ContextChange::TailCall,
                depth: 0,
                function: 0,
            },
        ];
        let mut d = ContextDecoder::default();
        let mut out = Vec::new();
        for e in &events {
            let (words, n) = e.encode();
            for &w in &words[..n] {
                assert!(is_context(w) && !is_id(w));
                out.extend(d.push(w));
            }
        }
        assert_eq!(out, events);
        assert_eq!(ContextEvent::TAIL_CALL_WORD, events[2].encode().0[0]);
    }

    #[test]
    fn words_out_of_order_are_dropped() {
        let mut d = ContextDecoder::default();
        assert_eq!(d.push(CONTEXT_EVENT | 1 << PART_SHIFT), None);
        let (w, _) = ContextEvent {
            change: ContextChange::Reset,
            depth: 0,
            function: 0,
        }
        .encode();
        assert!(d.push(w[0]).is_some());
    }
}
