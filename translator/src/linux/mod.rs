//! The Linux layer: what the guest process and each of its threads are to the kernel, and the
//! system calls and signals hotpath emulates between them.
//!
//! ```text
//! syscalls ──▶ exec ──▶ thread ──▶ process ──▶ signals ──▶ crate::host::syscall
//!    │                    │                       ▲
//!    └────────────────────┴───────────────────────┘
//! ```
//!
//! - [`process`]: what every thread shares (memory map, dispositions, block ids, live threads,
//!   code invalidations, how the process ends), and how it makes threads (`clone` arguments,
//!   a new thread's initial state, the embedder's spawner);
//! - [`thread`]: one thread's own state for the emulated calls (signal state, pending
//!   invalidations, the tid address cleared at its end);
//! - [`syscalls`]: the table of emulated calls (everything else passes through);
//! - [`kernel_writes`]: guest memory a call changes without a store the write fault sees
//!   (buffers in write-protected code pages, `/proc/self/mem`, `process_vm_writev`,
//!   `madvise`): protection given back, translations discarded;
//! - [`signals`]: guest dispositions, masks and alternate stacks, delivery, the host handler;
//! - [`exec`]: `execve` under hotpath and `/proc/self/exe`;
//! - [`seccomp`]: the guest's seccomp strict mode (emulated) and filters (hotpath's own calls
//!   let through);
//! - `crate::host::syscall` (below this layer): the raw `syscall` instruction and the gate
//!   blocking calls go through.
//!
//! Arrows point at what a module uses; none uses a module to its left. [`kernel_writes`]
//! stands beside `syscalls` (it uses `thread`, `process` and the raw system calls).

pub mod exec;
pub mod kernel_writes;
pub mod process;
pub mod seccomp;
pub mod signals;
pub mod syscalls;
pub mod thread;
