//! The event ring between a guest thread's translated code (producer) and the monitor
//! thread (consumer), and the commands the monitor sends back to the translator.
//!
//! ```text
//! translated block head ──enqueue stub: entries[head++] = block id──▶ [ring] ──drain FIFO──▶ monitor
//!          ▲                                                                      │
//!          └──────────── Command::FormSuperblock (crossbeam channel) ◀────────────┘
//! ```
//!
//! The ring's memory belongs to the translator (it lives in the per-thread area the emitted
//! code addresses through the GS segment); this crate fixes its layout and the protocol on it.

mod ring;

pub use ring::{ConsumerSide, ProducerSide, RingConsumer, RingControl, RingProducer, WaitStats};

/// Events with this bit set are not block ids but guest system calls: the low 31 bits are the
/// system call number. The dispatcher enqueues one after the block that ends in `syscall`, in
/// stream order. Block ids therefore stay below 2^31.
pub const SYSCALL_EVENT: u32 = 1 << 31;

/// Largest ring capacity accepted, in entries (`u32` block ids): 2^26 entries = 256 MiB.
pub const MAX_RING_ENTRIES: u64 = 1 << 26;
/// Smallest ring capacity accepted, in entries.
pub const MIN_RING_ENTRIES: u64 = 4;
/// Default ring capacity, in entries: 1 Mi events = 4 MiB. Measured: at 64 Ki the producer and
/// the consumer of a tight loop kept waiting on each other; a few MiB of slack lets the
/// consumer absorb the guest's bursts.
pub const DEFAULT_RING_ENTRIES: u64 = 1 << 20;

use hotpath_ir::{BlockId, BlockSummary};

/// Metadata of a newly translated block, sent to the monitor before the block first runs so
/// every id in the ring resolves.
#[derive(Clone, Copy, Debug)]
pub struct NewBlock {
    /// The block's id (dense, in translation order).
    pub id: BlockId,
    /// Its shape and terminator.
    pub summary: BlockSummary,
}
