//! The monitor thread: drains a guest thread's event ring in order and keeps exact profiles.
//!
//! ```text
//! ring (block ids, FIFO) ──drain──▶ resolve id via NewBlock metadata ──▶ tables (counts, totals)
//! ```
//!
//! The monitor-thread patent (CN101593125, see DESIGN.md) has the monitor poll the queue
//! without locks, look each block up by id and classify its terminator; it runs pinned to a
//! core other than the guest's.

mod tables;
mod thread;

pub use tables::{Profile, Tables};
pub use thread::{spawn, MonitorHandle};
