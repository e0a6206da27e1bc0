//! The translator: runs a guest program block by block out of a code cache.
//!
//! ```text
//! guest pc ──▶ dispatch ──miss──▶ decode (iced-x86) ──▶ IR Block ──▶ emit (dynasmrt + iced re-encoding) ──▶ code cache
//!                 ▲                                          │
//!                 │ exit stubs, lookup misses, syscalls      └──▶ NewBlock ──▶ monitor (before the block first runs)
//!                 │
//!   translated code: [enqueue stub] [guest body] [terminator: chained jmp / indirect branch lookup / exit]
//!
//! monitor ──Command::FormSuperblock──▶ dispatch (polled at every dispatcher entry) ──▶ superblock
//!   [enqueue stub] [body 0] [inverted jcc → side exit 0] [body 1] ... [terminator] [side exits:
//!   enqueue "ended after i", chained jmp] ──▶ becomes the head's entry (old entry jumps to it)
//! ```
//!
//! Guest registers live in host registers while translated code runs; the gateway
//! ([`backend::gateway`]) switches between the guest's context and Rust's, saving GPRs, RFLAGS, the
//! XSAVE state and the FS base into the thread's [`host::thread_area::ThreadArea`], which the code
//! reaches through GS.
//!
//! The folders are the layers, each importing only itself and the ones before it (the layers
//! test in `tests/tests/layers.rs` keeps it so):
//!
//! | folder | what |
//! |---|---|
//! | [`host`] | the host CPU's facts, guest memory, the thread area, raw system calls |
//! | [`frontend`] | guest bytes decoded and lifted to the IR |
//! | [`cache`] | the code cache's regions, layouts and links; code that writes code; modules |
//! | [`backend`] | blocks, superblocks and jump tables lowered to host code; the gateway |
//! | [`persist`] | translations kept across processes |
//! | [`linux`] | the process, its threads, system calls, signals, exec |
//! | [`runtime`] | the dispatcher, and the instructions it carries out itself |

pub mod backend;
pub mod cache;
pub mod frontend;
pub mod host;
pub mod linux;
pub mod persist;
pub mod runtime;

pub use linux::exec::ExecWrapper;
pub use linux::process::{Spawner, ThreadStart, GUEST_THREAD_HOST_STACK};
pub use linux::syscalls::{signal_name, GuestExit};
pub use runtime::dispatch::{Config, Forked, LapFullHook, ModuleSource, Stats, Stop, Translator};

/// Why translation stopped. `Display` is one line for the user.
#[derive(Debug, thiserror::Error)]
pub enum TranslateError {
    /// The code cache could not be set up.
    #[error("cannot create the code cache: {reason}")]
    CodeCache { reason: String },
    /// The host lacks something hotpath needs.
    #[error("unsupported host: {reason}")]
    Host { reason: String },
    /// The per-thread area could not be mapped or installed.
    #[error("cannot set up the guest thread: {reason}")]
    Thread { reason: String },
    /// dynasm rejected code hotpath generated: a bug in hotpath.
    #[error("internal error (bug in hotpath): cannot assemble {what}: {reason}")]
    Assemble { what: &'static str, reason: String },
    /// A guest instruction could not be re-encoded at its code cache address.
    #[error("cannot re-encode the guest instruction at {guest:#x}: {reason}")]
    Encode { guest: u64, reason: String },
    /// The guest executed an instruction hotpath does not support.
    #[error("the guest executes an unsupported instruction at {at:#x}: {text}")]
    UnsupportedInstruction { at: u64, text: String },
    /// The guest did something hotpath does not support (`what` says what) at guest `at`.
    #[error("the guest {what} (at {at:#x})")]
    UnsupportedGuest { at: u64, what: &'static str },
    /// The guest asked the kernel for something hotpath does not support yet.
    #[error("{message}")]
    UnsupportedSyscall { message: String },
    /// hotpath itself failed on a guest thread (a panic in its dispatcher, `reason` saying
    /// where): a bug in hotpath. Made by the embedder that caught it.
    #[error("internal error (bug in hotpath): {reason}")]
    Internal { reason: String },
    /// hotpath's own memory ran out (an allocation failed; its reserve,
    /// [`host::reserve`], lets the run end with its profile).
    #[error("out of memory for hotpath's own use: the run ends here (under an address space limit, ulimit -v, raise it)")]
    OutOfMemory,
    /// A superblock the monitor asked for cannot be laid out (the request is dropped; the
    /// guest goes on with its basic blocks).
    #[error("cannot form the superblock at {head:#x}: {reason}")]
    Superblock { head: u64, reason: String },
}

/// Guest address of the vDSO the guest is given (AT_SYSINFO_EHDR): hotpath's own, which the
/// kernel mapped into this process. Its code runs translated like any other (its accesses to
/// the kernel's data pages are far RIP-relative operands, rewritten by the emitter), so the
/// guest reads the clock without a system call, as natively. `None` when the kernel gave no
/// vDSO.
pub fn guest_vdso() -> Option<u64> {
    // SAFETY: getauxval has no preconditions.
    let ehdr = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    (ehdr != 0).then_some(ehdr)
}

/// The guest range `[start, end)` of the vDSO given to the guest (see [`guest_vdso`]), from
/// its ELF program headers: the span of its PT_LOAD segments. Read once per process (the
/// kernel maps the vDSO once, and a fork keeps it where it is): every thread that starts asks,
/// and each read is four `process_vm_readv` calls.
pub fn vdso_range() -> Option<(u64, u64)> {
    static RANGE: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    *RANGE.get_or_init(read_vdso_range)
}

/// The identity the vDSO's translations are persisted under ([`cache::modules::FileId::of_image`]
/// of its bytes), read once per process; `None` without a vDSO.
pub fn vdso_file_id() -> Option<cache::modules::FileId> {
    static ID: std::sync::OnceLock<Option<cache::modules::FileId>> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let (start, end) = vdso_range()?;
        let mut bytes = vec![0u8; usize::try_from(end - start).ok()?];
        host::guest_mem::read(start, &mut bytes).ok()?;
        Some(cache::modules::FileId::of_image(&bytes))
    })
    .clone()
}

/// [`vdso_range`], read from the vDSO's headers.
fn read_vdso_range() -> Option<(u64, u64)> {
    let base = guest_vdso()?;
    let mut ehdr = [0u8; 64];
    host::guest_mem::read(base, &mut ehdr).ok()?;
    let phoff = u64::from_le_bytes(ehdr[32..40].try_into().ok()?);
    let phentsize = u16::from_le_bytes(ehdr[54..56].try_into().ok()?) as u64;
    let phnum = u16::from_le_bytes(ehdr[56..58].try_into().ok()?) as u64;
    let mut end = base;
    for i in 0..phnum.min(64) {
        let mut ph = [0u8; 56];
        host::guest_mem::read(base + phoff + i * phentsize, &mut ph).ok()?;
        if u32::from_le_bytes(ph[0..4].try_into().ok()?) == 1 {
            // PT_LOAD: vaddr at 16, memsz at 40 (the vDSO is linked at 0).
            let vaddr = u64::from_le_bytes(ph[16..24].try_into().ok()?);
            let memsz = u64::from_le_bytes(ph[40..48].try_into().ok()?);
            end = end.max(base + ((vaddr + memsz + 4095) & !4095));
        }
    }
    (end > base).then_some((base, end))
}
