//! The back end: IR blocks, superblocks and jump tables lowered to host code, the stubs they
//! share, and the relocations of what they emit.

pub mod emit;
pub mod jump_table;
pub mod relocs;
pub(crate) mod stubs;
pub mod superblock;
