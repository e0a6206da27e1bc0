//! ELF loading for the guest: checks, segment mapping, the emulated brk region and the
//! initial stack with argv, envp and auxv.
//!
//! ```text
//! path ──check (exists, executable, ELF64, x86-64, ET_EXEC/ET_DYN)──▶ reserve span
//!      ──map PT_LOADs (fixed for ET_EXEC, a randomised base for ET_DYN), zero bss──▶ Image
//!      ──PT_INTERP: the same for the interpreter (ld.so), anywhere──▶ Image::interpreter
//! Image + argv + envp ──▶ GuestStack (rsp → argc, argv, envp, auxv, strings)
//! ```
//!
//! One reservation covers the image, the guest's brk region and an extra area the caller asks
//! for (the translator puts its code cache there, within ±2 GiB of the guest's code). A PIE's
//! base and the heap's start are randomised as the kernel randomises them (`aslr`).

mod aslr;
mod elf;
mod error;
mod headers;
mod script;
mod stack;

pub use elf::{
    kernel_refusal, load, module_symbols, reserve_above, reserve_within_reach, symbolize_in,
    ElfKind, Image, Interpreter, LoadOptions, ModuleSymbols, Segment, Symbol,
};
pub use error::LoadError;
pub use script::resolve_script;
pub use stack::{build_stack, stack_size, GuestStack, STACK_GUARD, STACK_SIZE};

/// Guest page size in bytes.
pub const PAGE_SIZE: u64 = 4096;

/// Rounds `x` down to a multiple of [`PAGE_SIZE`].
pub fn page_floor(x: u64) -> u64 {
    x & !(PAGE_SIZE - 1)
}

/// Rounds `x` up to a multiple of [`PAGE_SIZE`].
pub fn page_ceil(x: u64) -> u64 {
    (x + PAGE_SIZE - 1) & !(PAGE_SIZE - 1)
}
