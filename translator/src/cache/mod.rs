//! The code cache: regions and what they hold (layouts, links), code that writes code, the
//! guest's modules, and translations persisted across processes.

pub mod code_cache;
pub mod code_log;
pub(crate) mod links;
pub mod modules;
pub mod persist;
pub(crate) mod smc;
