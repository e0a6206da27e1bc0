//! The back end: IR blocks, superblocks and jump tables lowered to host code, the gateway
//! routines they enter and leave through, the stubs they share, and the relocations of what
//! they emit.

pub mod emit;
pub mod gateway;
pub mod jump_table;
pub mod relocs;
pub(crate) mod stubs;
pub mod superblock;
