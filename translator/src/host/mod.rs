//! What the host and the thread look like to everything above: the host CPU's facts, guest
//! memory read and written without trusting the guest's pointers, the thread area translated
//! code reaches through GS, raw system calls and the gate, the translator's settings, and
//! where hotpath's own messages go.

pub(crate) mod config;
pub(crate) mod cpu;
pub mod guest_mem;
pub mod messages;
pub mod procfs;
pub mod reserve;
pub mod syscall;
pub mod thread_area;
