//! The event ring between a guest thread's translated code (producer) and the monitor
//! thread (consumer), the catalog of what each id stands for, and the commands the monitor
//! sends back to the translator.
//!
//! ```text
//! translator ──append NewBlock (before the block first runs)──▶ [block catalog] ──get(id)──┐
//! translated block head ──enqueue stub: entries[head++] = block id──▶ [ring] ──drain FIFO──▶ monitor
//!          ▲                                                                      │
//!          └──────────── Command::FormSuperblock (crossbeam channel) ◀────────────┘
//! ```
//!
//! The ring's memory belongs to the translator (it lives in the per-thread area the emitted
//! code addresses through the GS segment); this crate fixes its layout and the protocol on it.

mod catalog;
pub mod futex;
mod ring;

pub use catalog::{BlockCatalog, CatalogWriter};
pub use ring::{
    ConsumerSide, ProducerSide, RingConsumer, RingControl, RingProducer, WaitStats,
    MIN_POLL_INTERVAL,
};

/// Events with this bit set are not block ids but guest system calls: the low 31 bits are the
/// system call number. The dispatcher enqueues one after the block that ends in `syscall`, in
/// stream order. Block ids stay below 2^30 ([`MAX_EVENT_ID`]).
pub const SYSCALL_EVENT: u32 = 1 << 31;

/// The tag bits of an event word: 0 for a block (or superblock, or side exit) id,
/// [`SYSCALL_EVENT`] for a system call. Bit 30 is set by no event: it keeps ids below
/// [`MAX_EVENT_ID`].
pub const TAG_MASK: u32 = 0b11 << 30;

/// Largest block id the ring can carry, plus one: ids are below 2^30.
pub const MAX_EVENT_ID: u32 = 1 << 30;

/// True if `word` is a block (or superblock, or side exit) id, not a tagged event.
#[inline(always)]
pub fn is_id(word: u32) -> bool {
    word & TAG_MASK == 0
}

/// Largest ring capacity accepted, in entries (`u32` block ids): 2^26 entries = 256 MiB.
pub const MAX_RING_ENTRIES: u64 = 1 << 26;
/// Smallest ring capacity accepted, in entries.
pub const MIN_RING_ENTRIES: u64 = 4;
/// Default ring capacity, in entries: 1 Mi events = 4 MiB. Measured: at 64 Ki the producer and
/// the consumer of a tight loop kept waiting on each other; a few MiB of slack lets the
/// consumer absorb the guest's bursts.
pub const DEFAULT_RING_ENTRIES: u64 = 1 << 20;

use std::sync::Arc;

use hotpath_ir::{BlockId, BlockSummary};

/// What an id in the event stream stands for.
///
/// A superblock (a trace of basic blocks laid out along a hot path, see DESIGN.md
/// "Superblocks") enqueues one event when it is entered, instead of one per block. When it
/// leaves before its end (a side exit, or a fault in one of its blocks) it enqueues the id of a
/// [`SideExit`](IdKind::SideExit) right after: so the stream still says exactly which blocks
/// ran. A superblock event followed by anything else ran every block of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdKind {
    /// A guest basic block.
    Block,
    /// A superblock: the basic block ids of its trace, in execution order (a block may appear
    /// more than once: an unrolled loop).
    Superblock { blocks: Arc<[BlockId]> },
    /// "Superblock `superblock` ended after the block at position `after` of its trace": the
    /// blocks at positions `0..=after` ran, the rest did not.
    SideExit { superblock: BlockId, after: u32 },
}

/// Metadata of a newly translated id, published in the [`BlockCatalog`] before it first
/// appears in a ring, so every id resolves.
#[derive(Clone, Debug)]
pub struct NewBlock {
    /// The id (dense, in translation order).
    pub id: BlockId,
    /// Shape and terminator of the basic block (for a superblock or a side exit: of the trace's
    /// first block; the monitor looks through them at `kind`).
    pub summary: BlockSummary,
    /// Basic block, superblock, or a superblock's side exit.
    pub kind: IdKind,
    /// The guest bytes of a basic block as they were translated (`summary.len_bytes` of them
    /// from `summary.start`); empty for a superblock or a side exit. Reports show them, whatever the guest did to
    /// that memory later.
    pub code: Box<[u8]>,
}

/// Most basic blocks in one superblock's trace, unrolled copies included: the longest
/// [`Command::FormSuperblock`] the translator accepts. Each position has its own side-exit id,
/// so a superblock takes `1 + len` ids. 64: traces that go on from one interpreter handler to
/// the next reached 32 on bench_interp (sqlite3 as shipped 336 → 306 ms with 64).
pub const MAX_TRACE_BLOCKS: usize = 64;

/// Makes a guest thread come to its dispatcher, from another thread (the monitor's), so that
/// its translator reads a [`Command`] now rather than at its next ring refill: the next time
/// it goes to one of the guest addresses given (superblock heads). Made by the translator
/// (`Translator::waker`), called by the monitor.
pub type Waker = std::sync::Arc<dyn Fn(&[u64]) + Send + Sync>;

/// What the monitor asks of the translator (a crossbeam channel; the translator reads it when
/// it is in the dispatcher, which the monitor makes it come to: see [`Waker`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Build a superblock along `blocks` (1 to [`MAX_TRACE_BLOCKS`] basic block ids, in path
    /// order; each block's static successor must be the next one) and make it the entry of `blocks[0]`'s guest
    /// address. Ignored when an id is stale (its translation was flushed) or the path no
    /// longer matches the guest code.
    FormSuperblock { blocks: Vec<BlockId> },
    /// As [`Command::FormSuperblock`], for a head that has a superblock already, which more of
    /// its runs left through a side exit than ran to its end: the new superblock replaces it
    /// as the entry of `blocks[0]`'s guest address (the old one's entry jumps to it).
    ReformSuperblock { blocks: Vec<BlockId> },
}
