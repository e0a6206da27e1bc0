//! The IR shared by the translator and the monitor: guest basic blocks with an explicit terminator.
//!
//! ```text
//! guest bytes ──decode──▶ Block { body: [Inst], terminator } ──emit──▶ host code
//!                              │
//!                              └──▶ BlockSummary (what the monitor needs to classify an event)
//! ```
//!
//! A [`Block`] is a maximal run of guest instructions ending at a control transfer, a
//! `syscall`, a trap or the size limit. Its [`Terminator`] is what the monitor classifies
//! (direct branch / indirect jump / syscall, after the monitor-thread patent) and what the
//! translator turns into chained jumps, an indirect branch lookup or an exit to the dispatcher.

mod block;
mod ids;
mod liveness;
mod syscalls;
mod terminator;

pub use block::{Block, BlockSummary, Inst, FLAGS_ALL};
pub use ids::{BlockId, GuestAddr, HostAddr};
pub use liveness::{
    cannot_fault, dead_at_entry, entry_dead, gpr_numbered, scratch_register,
    status_flags_dead_at_entry, FLAGS_DEAD,
};
pub use syscalls::syscall_name;
pub use terminator::{Cond, Terminator, TerminatorKind, TrapKind};
