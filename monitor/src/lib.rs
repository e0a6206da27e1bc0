//! The monitor thread: drains a guest thread's event ring in order and keeps exact profiles.
//!
//! ```text
//! ring (block ids + syscall events, FIFO) ──drain──▶ Tables (edge counts by block id)
//!        NewBlock metadata ──────────────────────────▶ Tables::blocks
//!        events ──▶ PathRecorder: a program per pair of runs (paths/pairs.rs), shadow stack,
//!                   functions, Ball-Larus sums counted per id (paths/sums.rs) ──▶ paths, PAP
//!                   traces, k-paths (paths/report.rs)
//!        hot back edge ──▶ decisions: trace along the hottest successors ──▶ FormSuperblock
//! guest ends ──▶ hotpath_report::Report (aggregated by guest address) ──▶ JSON, text, ...
//! ```
//!
//! After the monitor-thread patent (CN101593125, summarised in DESIGN.md): the monitor polls
//! the queue without locks, resolves every block id to its IR summary and classifies its
//! terminator (direct branch, indirect jump, syscall); it runs pinned to a core other than the
//! guest's. Counts are exact: the ring never drops an event.

mod decisions;
mod os_thread;
mod paths;
mod profile;
mod tables;
mod thread;

pub use decisions::{Decisions, DEFAULT_SUPERBLOCK_THRESHOLD};
pub use paths::{
    FunctionSymbol, PathConfig, PathRecorder, Recorder, DEFAULT_PAP_THRESHOLD, K_PATHS_TOP,
    PAP_LISTED, PAP_MAX_PATHS, PAP_PATHS_TOP,
};
pub use profile::{
    add_code, report_of, thread_report, thread_row_of, Rows, RunInfo, Symbolizer, THREAD_HOTTEST,
};
pub use tables::{Counts, SyscallCount, SyscallRow, Tables};
pub use thread::{
    run_to_end, spawn, MonitorHandle, MonitorResult, MonitorState, Namer, Stream, ThreadState,
};
