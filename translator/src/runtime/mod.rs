//! The runtime: the thread area translated code reaches through GS, the gateway between Rust
//! and translated code, the dispatcher, the instructions it carries out itself, and the host
//! CPU's facts.

pub(crate) mod config;
pub(crate) mod cpu;
pub(crate) mod dispatch;
pub mod gateway;
pub mod guest_mem;
pub(crate) mod special;
pub mod thread_area;
