//! The code cache: regions and what they hold (layouts, links, where code went), code that
//! writes code, and the guest's modules.

pub mod code_cache;
pub mod code_log;
pub(crate) mod links;
pub mod modules;
pub(crate) mod smc;
pub(crate) mod sorted_runs;
