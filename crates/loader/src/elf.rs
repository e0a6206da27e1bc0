//! Checking an ELF file and mapping its PT_LOAD segments into the guest's address space.

use std::ffi::c_void;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use goblin::elf::{header, program_header, sym, Elf};
use memmap2::Mmap;

use crate::aslr::Randomization;
use crate::headers::{
    parse_phdrs, Ehdr, Phdr, EHDR_SIZE, EM_386, EM_X86_64, ET_DYN, ET_EXEC, PF_R, PF_W, PF_X,
    PT_GNU_STACK, PT_INTERP, PT_LOAD,
};
use crate::{page_ceil, page_floor, LoadError, PAGE_SIZE};

/// How far a RIP-relative operand reaches, in bytes (2 GiB): hotpath's own reservation near
/// the image ([`Image::extra`]) is placed within it so translated code keeps the guest's
/// RIP-relative operands as they are.
const RIP_REACH: u64 = 1 << 31;

/// Bytes left free between the image and hotpath's reservation near it (16 MiB): room for
/// the guest's own mappings next to its image.
const EXTRA_GAP: u64 = 16 << 20;

/// What kind of ELF executable the guest is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElfKind {
    /// `ET_EXEC`: fixed addresses (statically or dynamically linked).
    Static,
    /// `ET_DYN`: position-independent, at a base the loader picks (static-pie, PIE with an
    /// interpreter, or an interpreter run as the program).
    StaticPie,
}

/// Where the kernel puts a PIE that has an interpreter (`ELF_ET_DYN_BASE` on x86-64, before
/// randomisation): two thirds of the 47-bit user address space. A hint: when taken, the
/// kernel picks another base, as it would for `mmap`.
const ELF_ET_DYN_BASE: u64 = 0x5555_5555_4000;

/// Room in bytes (64 GiB) a guest heap placed at [`ELF_ET_DYN_BASE`] gets before hotpath's own
/// memory: its binary (when hotpath is a PIE with an interpreter, the kernel puts it at
/// `ELF_ET_DYN_BASE` plus a random offset of up to 1 TiB) or its own brk heap (hotpath is
/// static-pie, whose brk the kernel starts at `ELF_ET_DYN_BASE` plus up to 1 GiB).
const DYN_BASE_ROOM: u64 = 64 << 30;

/// Addresses of hotpath's own that a guest image and heap keep [`DYN_BASE_ROOM`] away from:
/// one inside hotpath's text (its binary's first segments precede it by a few MiB) and its
/// brk heap's current end.
fn own_addresses() -> [u64; 2] {
    let own = (own_addresses as *const () as u64).saturating_sub(64 << 20);
    // SAFETY: sbrk(0) only reads the process's current break.
    let own_brk = unsafe { libc::sbrk(0) } as u64;
    [own, own_brk]
}

/// Whether an image of `span` bytes at `base` and the [`DYN_BASE_ROOM`] above it for its heap
/// hold none of hotpath's own addresses.
fn clear_of_hotpath(base: u64, span: u64) -> bool {
    let end = base.saturating_add(span).saturating_add(DYN_BASE_ROOM);
    !own_addresses().iter().any(|&a| a >= base && a < end)
}

/// Where a static-pie's brk starts before randomisation (and a PIE with an interpreter goes
/// without it): at [`ELF_ET_DYN_BASE`] as natively, unless hotpath's own binary or brk heap
/// lies less than [`DYN_BASE_ROOM`] above it, where the guest's brk heap would soon meet it
/// (natively nothing is there): then that much lower.
fn dyn_base() -> u64 {
    if clear_of_hotpath(ELF_ET_DYN_BASE, 0) {
        ELF_ET_DYN_BASE
    } else {
        ELF_ET_DYN_BASE - DYN_BASE_ROOM
    }
}

/// Where a PIE with an interpreter of `span` bytes goes: [`ELF_ET_DYN_BASE`] plus the
/// kernel's random offset (`arch_mmap_rnd`), drawn again where hotpath's own binary or heap
/// would be in the image's way or its heap's ([`clear_of_hotpath`]); [`dyn_base`] without
/// randomisation or after eight draws that all were.
fn pie_base(span: u64, rnd: &Randomization) -> u64 {
    if rnd.mmap_rnd_bits > 0 {
        for _ in 0..8 {
            let base = ELF_ET_DYN_BASE + rnd.pie_offset();
            if clear_of_hotpath(base, span) {
                return base;
            }
        }
    }
    dyn_base()
}

/// Where the heap starts: `at` (where it would start unrandomised) moved by the kernel's
/// random offset ([`Randomization::brk_start`]) where that page is free, else `at`.
fn heap_start(at: u64, rnd: &Randomization) -> u64 {
    let start = rnd.brk_start(at);
    if start == at || page_is_free(start) {
        start
    } else {
        at
    }
}

/// The program interpreter (`PT_INTERP`, normally ld-linux-x86-64.so.2) as loaded.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// Its path, as the program names it.
    pub path: PathBuf,
    /// Added to every ELF virtual address of the interpreter (AT_BASE).
    pub load_bias: u64,
    /// Guest address of its entry point: where the guest starts.
    pub entry: u64,
    /// Mapped range `[start, end)`, page-aligned guest addresses.
    pub range: (u64, u64),
    /// Its mapped segments (the holes between them in `range` are unmapped, as natively).
    pub segments: Vec<Segment>,
}

/// Caller's requirements for the reservation.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Bytes to reserve (PROT_NONE) near the image for the caller's own use (see
    /// [`Image::extra`]).
    pub extra_reserve: u64,
}

/// One PT_LOAD segment as mapped, page-aligned guest addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First byte (page-aligned guest address).
    pub start: u64,
    /// One past the last byte (page-aligned).
    pub end: u64,
    /// `PROT_*` bits.
    pub prot: i32,
}

/// A function symbol of the guest (from `.symtab`, else `.dynsym`), at its loaded address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Symbol name.
    pub name: String,
    /// Guest address of the first byte (load bias applied).
    pub addr: u64,
    /// Size in bytes (when the ELF says 0: up to the next symbol or the end of the segment).
    pub size: u64,
}

/// A loaded guest image.
#[derive(Clone, Debug)]
pub struct Image {
    /// The guest program's path, absolute, as given (for messages and reports).
    pub path: PathBuf,
    /// The program file as the kernel names it (symlinks and `..` resolved, as
    /// `readlink("/proc/self/exe")` shows it natively): what `/proc/self/exe` must show the
    /// guest. The dynamic linker's `$ORIGIN` comes from it: a program started through a
    /// symlink (`/usr/bin/java`) finds its libraries beside the file, not beside the link.
    pub exe: PathBuf,
    /// Kind of executable.
    pub kind: ElfKind,
    /// Added to every ELF virtual address (0 for `ET_EXEC`).
    pub load_bias: u64,
    /// Guest address of the entry point.
    pub entry: u64,
    /// Guest address of the program headers (AT_PHDR).
    pub phdr: u64,
    /// Size of one program header in bytes (AT_PHENT).
    pub phent: u64,
    /// Number of program headers (AT_PHNUM).
    pub phnum: u64,
    /// Mapped segments.
    pub segments: Vec<Segment>,
    /// Lowest mapped guest address of the image (page-aligned).
    pub image_start: u64,
    /// One past the highest mapped byte of the image (page-aligned).
    pub image_end: u64,
    /// The initial brk, where the kernel puts it: the image's end, or for a static-pie
    /// started without an interpreter `ELF_ET_DYN_BASE` (Linux 5.18 on), away from the
    /// image that the kernel placed among the mmap'd libraries; moved up by a random number
    /// of pages within 1 GiB where the kernel randomises the heap (`randomize_va_space` 2,
    /// not under `setarch -R`). Nothing is reserved there: the heap grows as far as the
    /// kernel would let it, up to the next mapping.
    pub brk_start: u64,
    /// The caller's extra reservation `(start, len)`, PROT_NONE, within [`RIP_REACH`] of the
    /// image but out of the ranges the kernel gives the guest: below the image when it lies
    /// high (mmap allocates top-down from far above, brk grows up from the image), else at
    /// the top of the image's reach (a program linked low, whose brk grows toward it), else
    /// wherever the kernel finds room.
    pub extra: (u64, u64),
    /// Function symbols, sorted by address (none when goblin cannot read the section headers:
    /// the kernel does not need them, so neither does loading).
    pub symbols: Vec<Symbol>,
    /// Whether the stack is executable (`PT_GNU_STACK` with `PF_X`; without one it is not, on
    /// x86-64).
    pub exec_stack: bool,
    /// The program interpreter, for a dynamically linked program.
    pub interpreter: Option<Interpreter>,
}

/// Loads the executable at `path` into this process at its guest addresses, and its
/// interpreter when it names one (`PT_INTERP`), as the kernel's `execve` does
/// (`load_elf_binary`, with its checks in its order): the program at its fixed addresses
/// (`ET_EXEC`) or at a base like the kernel's (`ET_DYN`), the interpreter wherever there is
/// room. Only the ELF header and program headers are read; section headers may be anything.
///
/// # Errors
/// A [`LoadError`] naming the file. Before the kernel's point of no return (what `execve`
/// would refuse with an errno): missing, unreadable or not executable ([`LoadError::Io`],
/// [`LoadError::NotExecutable`]), not an ELF or not an x86-64 executable
/// ([`LoadError::NotElf`], [`LoadError::UnsupportedElf`]), a bad `PT_INTERP` or interpreter
/// ([`LoadError::Interpreter`]). After it (where the kernel kills the new process with
/// SIGSEGV): [`LoadError::Killed`]. Where hotpath itself cannot place the image (an image over
/// 4 GiB, addresses hotpath uses): [`LoadError::UnsupportedElf`] or [`LoadError::Map`].
pub fn load(path: &Path, opts: LoadOptions) -> Result<Image, LoadError> {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let (file, bytes) = open_checked(path, &abs)?;
    let exe = parse_checked(&bytes, &abs)?;
    let interp = match interp_path(&bytes, &exe.phdrs, &abs)? {
        Some(interp) => Some(open_interpreter(&abs, &interp)?),
        None => None,
    };
    let exec_stack = exe
        .phdrs
        .iter()
        .rfind(|p| p.p_type == PT_GNU_STACK)
        .is_some_and(|p| p.p_flags & PF_X != 0);

    // The kernel's point of no return: from here on, what it cannot do kills the process.
    let killed = |reason: String| LoadError::Killed {
        path: abs.clone(),
        reason,
    };
    let plan = plan_layout(&exe).map_err(killed)?;
    check_span(plan.span).map_err(|reason| LoadError::UnsupportedElf {
        path: abs.clone(),
        reason,
    })?;
    let kind = exe.kind();
    let rnd = Randomization::of_this_process();
    let placement = match (kind, &interp) {
        (ElfKind::Static, _) => Placement::Fixed,
        (ElfKind::StaticPie, Some(_)) => Placement::Hint(pie_base(plan.span.1 - plan.span.0, &rnd)),
        // A static-pie goes where the kernel finds room, like ASLR would put it.
        (ElfKind::StaticPie, None) => Placement::Anywhere,
    };
    let (lo, hi) = plan.span;
    let total = hi - lo;
    let base = reserve(&abs, placement, lo, total, maximum_alignment(&exe))?;
    let load_bias = base.wrapping_sub(lo);
    let mut segments = Vec::new();
    for ph in exe.loads() {
        segments.extend(map_segment(&file, bytes.len() as u64, ph, load_bias).map_err(killed)?);
    }
    unmap_holes(base, hi.wrapping_add(load_bias), &segments);
    let entry = exe.ehdr.e_entry.wrapping_add(load_bias);
    if interp.is_none() && entry >= TASK_SIZE {
        return Err(killed(format!("entry point {entry:#x} outside user space")));
    }
    let interpreter = match interp {
        Some(opened) => Some(load_interpreter(
            &abs,
            opened,
            (base, hi.wrapping_add(load_bias)),
        )?),
        None => None,
    };
    let image_end = hi.wrapping_add(load_bias);
    let brk_start = match (kind, &interpreter) {
        (ElfKind::StaticPie, None) if page_is_free(dyn_base()) => heap_start(dyn_base(), &rnd),
        _ => heap_start(image_end, &rnd),
    };
    let extra_len = page_ceil(opts.extra_reserve);
    let extra = (reserve_near(base, image_end, extra_len), extra_len);
    let symbols = Elf::parse(&bytes)
        .map(|elf| function_symbols(&elf, load_bias, &segments))
        .unwrap_or_default();
    let exe_name = kernel_name(&file).unwrap_or_else(|| abs.clone());
    Ok(Image {
        exe: exe_name,
        path: abs,
        kind,
        load_bias,
        entry,
        phdr: plan.phdr.wrapping_add(load_bias),
        phent: exe.ehdr.e_phentsize as u64,
        phnum: exe.ehdr.e_phnum as u64,
        image_start: base,
        image_end,
        brk_start,
        extra,
        symbols,
        segments,
        exec_stack,
        interpreter,
    })
}

/// What the kernel's `execve` of the ELF file `path` would fail with before its point of no
/// return, as [`load`] checks it (the file, its headers, its interpreter), without mapping
/// anything: `None` when the kernel would go on (it may still kill the new process, which a
/// `load` of it then reports), or when the file is not for this check (no ELF magic, or an
/// i386 program, which the kernel runs through its compat loader and hotpath refuses).
/// The guest's `execve` uses it to let the kernel answer the calls it refuses.
pub fn kernel_refusal(path: &Path) -> Option<LoadError> {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let (_file, bytes) = match open_checked(path, &abs) {
        Ok(opened) => opened,
        Err(e) => return Some(e),
    };
    let i386 = bytes.get(header::EI_CLASS) == Some(&header::ELFCLASS32)
        && Ehdr::parse(&bytes).e_machine == EM_386;
    if bytes.len() < 4 || &bytes[..4] != b"\x7fELF" || i386 {
        return None;
    }
    let exe = match parse_checked(&bytes, &abs) {
        Ok(exe) => exe,
        Err(e) => return Some(e),
    };
    match interp_path(&bytes, &exe.phdrs, &abs) {
        Ok(Some(interp)) => open_interpreter(&abs, &interp).err(),
        Ok(None) => None,
        Err(e) => Some(e),
    }
}

/// First byte above user space on x86-64 (`TASK_SIZE`): an address at or above it is the
/// kernel's `BAD_ADDR`.
const TASK_SIZE: u64 = (1 << 47) - PAGE_SIZE;

/// Longest interpreter path the kernel reads from `PT_INTERP`, NUL included (`PATH_MAX`).
const PATH_MAX: u64 = 4096;

/// The interpreter's path named by the first `PT_INTERP` of `bytes`, if any, with the
/// kernel's checks: 2 to 4096 bytes in the file, ending with a NUL; the path is the string
/// up to its first NUL.
fn interp_path(bytes: &[u8], phdrs: &[Phdr], abs: &Path) -> Result<Option<PathBuf>, LoadError> {
    let Some(ph) = phdrs.iter().find(|p| p.p_type == PT_INTERP) else {
        return Ok(None);
    };
    let unsupported = |reason: String| LoadError::UnsupportedElf {
        path: abs.to_path_buf(),
        reason,
    };
    if ph.p_filesz > PATH_MAX || ph.p_filesz < 2 {
        return Err(unsupported(format!(
            "interpreter path of {} bytes (PT_INTERP): 2 to {PATH_MAX} are accepted",
            ph.p_filesz
        )));
    }
    let text = usize::try_from(ph.p_offset)
        .ok()
        .and_then(|start| bytes.get(start..start.checked_add(ph.p_filesz as usize)?))
        .ok_or_else(|| {
            unsupported("the interpreter path (PT_INTERP) is past the end of the file".into())
        })?;
    let Some((&0, _)) = text.split_last() else {
        return Err(unsupported(
            "the interpreter path (PT_INTERP) does not end with a NUL byte".into(),
        ));
    };
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    if end == 0 {
        // The kernel's open of an empty path fails with EACCES.
        return Err(LoadError::Interpreter {
            path: abs.to_path_buf(),
            interp: PathBuf::new(),
            reason: "empty interpreter path (PT_INTERP)".into(),
        });
    }
    use std::os::unix::ffi::OsStrExt;
    Ok(Some(PathBuf::from(std::ffi::OsStr::from_bytes(
        &text[..end],
    ))))
}

/// The interpreter as opened and checked before the point of no return.
struct OpenedInterpreter {
    path: PathBuf,
    file: File,
    bytes: Mmap,
    ehdr: Ehdr,
    phdrs: Vec<Phdr>,
}

/// Opens the interpreter `interp` named by `program` and checks what the kernel checks before
/// its point of no return: an executable regular file of at least a file header's size, with
/// the ELF magic, x86-64 and readable program headers (else ELIBBAD).
fn open_interpreter(program: &Path, interp: &Path) -> Result<OpenedInterpreter, LoadError> {
    let err = |reason: String| LoadError::Interpreter {
        path: program.to_path_buf(),
        interp: interp.to_path_buf(),
        reason,
    };
    // The kernel's own rule: the interpreter must be an executable regular file.
    let (file, bytes) = open_checked(interp, interp).map_err(|e| err(e.reason()))?;
    if bytes.len() < EHDR_SIZE {
        return Err(err("truncated ELF header".into()));
    }
    if &bytes[..4] != b"\x7fELF" {
        return Err(err("not an ELF file".into()));
    }
    let ehdr = Ehdr::parse(&bytes);
    if ehdr.e_machine != EM_X86_64 {
        return Err(err(format!("ELF machine {}, not x86-64", ehdr.e_machine)));
    }
    let phdrs = parse_phdrs(&bytes, &ehdr).map_err(|e| err(e.to_string()))?;
    Ok(OpenedInterpreter {
        path: interp.to_path_buf(),
        file,
        bytes,
        ehdr,
        phdrs,
    })
}

/// Loads the interpreter opened by [`open_interpreter`] wherever there is room (past the
/// kernel's point of no return: a failure kills the process).
/// Maps the interpreter `opened` of `program`, whose image is at `[program_range.0,
/// program_range.1)`. An `ET_EXEC` interpreter goes at its own addresses over whatever of the
/// program is there, as the kernel maps it (`MAP_FIXED`, `load_elf_interp`); anywhere else it
/// must find the room free.
fn load_interpreter(
    program: &Path,
    opened: OpenedInterpreter,
    program_range: (u64, u64),
) -> Result<Interpreter, LoadError> {
    let killed = |reason: String| LoadError::Killed {
        path: program.to_path_buf(),
        reason: format!("interpreter {}: {reason}", opened.path.display()),
    };
    let interp = CheckedElf {
        ehdr: opened.ehdr,
        phdrs: opened.phdrs.clone(),
    };
    if interp.ehdr.e_type != ET_EXEC && interp.ehdr.e_type != ET_DYN {
        return Err(killed(format!(
            "ELF type {}, not an executable",
            interp.ehdr.e_type
        )));
    }
    let plan = plan_layout(&interp).map_err(&killed)?;
    check_span(plan.span).map_err(|reason| LoadError::Interpreter {
        path: program.to_path_buf(),
        interp: opened.path.clone(),
        reason,
    })?;
    let placement = match interp.kind() {
        ElfKind::Static => Placement::Fixed,
        ElfKind::StaticPie => Placement::Anywhere,
    };
    let (lo, hi) = plan.span;
    if placement == Placement::Fixed {
        // The part of the program it covers is replaced (the rest must be free, below).
        let (s, e) = (lo.max(program_range.0), hi.min(program_range.1));
        if s < e {
            // SAFETY: unmaps only the program's own image, which the interpreter replaces
            // as it does natively; nothing of hotpath's is in that range.
            unsafe { libc::munmap(s as *mut c_void, (e - s) as usize) };
        }
    }
    // The kernel does not align an interpreter to its p_align.
    let base =
        reserve(&opened.path, placement, lo, hi - lo, PAGE_SIZE).map_err(|e| killed(e.reason()))?;
    let load_bias = base.wrapping_sub(lo);
    let mut segments = Vec::new();
    for ph in interp.loads() {
        segments.extend(
            map_segment(&opened.file, opened.bytes.len() as u64, ph, load_bias).map_err(&killed)?,
        );
    }
    unmap_holes(base, hi.wrapping_add(load_bias), &segments);
    let entry = interp.ehdr.e_entry.wrapping_add(load_bias);
    if entry >= TASK_SIZE {
        return Err(killed(format!("entry point {entry:#x} outside user space")));
    }
    Ok(Interpreter {
        path: opened.path,
        load_bias,
        entry,
        range: (base, hi.wrapping_add(load_bias)),
        segments,
    })
}

/// An ELF file that passed the checks the kernel makes before its point of no return.
struct CheckedElf {
    ehdr: Ehdr,
    phdrs: Vec<Phdr>,
}

impl CheckedElf {
    fn loads(&self) -> impl Iterator<Item = &Phdr> {
        self.phdrs.iter().filter(|p| p.p_type == PT_LOAD)
    }

    fn kind(&self) -> ElfKind {
        if self.ehdr.e_type == ET_EXEC {
            ElfKind::Static
        } else {
            ElfKind::StaticPie
        }
    }
}

/// Opens `path` (shown as `abs` in errors), checks it is an executable regular file and maps
/// it read-only (a read would copy all of it, a few megabytes for a large program, where the
/// loader looks at its headers: a tenth of `busybox true`'s start-up went there).
/// The path the kernel gives open file `file` (`/proc/self/fd/N`): symlinks and `..` resolved,
/// as `/proc/self/exe` shows a program natively. `None` without `/proc`.
fn kernel_name(file: &File) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
        .filter(|p| p.is_absolute())
}

fn open_checked(path: &Path, abs: &Path) -> Result<(File, Mmap), LoadError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e: std::io::Error| LoadError::Io {
        path: abs.to_path_buf(),
        reason: io_reason(&e),
    };
    // Not blocking: opening a FIFO to read waits for a writer (the kernel refuses to execute
    // anything but a regular file, which `check_executable` checks next).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    check_executable(&file, abs)?;
    if file.metadata().map_err(io)?.len() == 0 {
        // An empty file cannot be mapped; the kernel finds no format for it.
        return Err(LoadError::NotElf {
            path: abs.to_path_buf(),
        });
    }
    // SAFETY: a private read-only view of the program file, as the kernel maps it to run it;
    // hotpath does not write it. (Truncating the file while hotpath starts would fault here,
    // as it would fault the program natively.)
    let bytes = unsafe { Mmap::map(&file) }.map_err(io)?;
    Ok((file, bytes))
}

/// Checks `bytes` as the kernel does before its point of no return: the ELF magic, `ET_EXEC`
/// or `ET_DYN`, x86-64, and program headers it can read. The class, byte order and version in
/// `e_ident` and the section headers are not looked at (the kernel does not either).
fn parse_checked(bytes: &[u8], abs: &Path) -> Result<CheckedElf, LoadError> {
    let unsupported = |reason: String| LoadError::UnsupportedElf {
        path: abs.to_path_buf(),
        reason,
    };
    if bytes.len() < 4 || &bytes[..4] != b"\x7fELF" {
        return Err(LoadError::NotElf {
            path: abs.to_path_buf(),
        });
    }
    let ehdr = Ehdr::parse(bytes);
    if ehdr.e_type != ET_EXEC && ehdr.e_type != ET_DYN {
        let what = match ehdr.e_type {
            1 => "a relocatable object (ET_REL)".to_string(),
            4 => "a core dump (ET_CORE)".to_string(),
            t => format!("ELF type {t}"),
        };
        return Err(unsupported(format!("not an executable: {what}")));
    }
    if ehdr.e_machine != EM_X86_64 {
        let class = match bytes.get(header::EI_CLASS) {
            Some(&header::ELFCLASS32) if ehdr.e_machine == EM_386 => {
                "32-bit ELF (ELFCLASS32): ".to_string()
            }
            _ => String::new(),
        };
        return Err(unsupported(format!(
            "{class}ELF machine is {} ({}), not x86-64: hotpath runs x86-64 programs only",
            header::machine_to_str(ehdr.e_machine),
            ehdr.e_machine
        )));
    }
    let phdrs = parse_phdrs(bytes, &ehdr).map_err(|e| unsupported(e.to_string()))?;
    Ok(CheckedElf { ehdr, phdrs })
}

/// Where an image's segments go, worked out before anything is mapped.
struct Layout {
    /// Page-aligned ELF virtual address range of the PT_LOAD segments, `(lo, hi)`.
    span: (u64, u64),
    /// ELF virtual address of the program headers (AT_PHDR before the load bias): in the
    /// PT_LOAD whose file bytes hold them (the last such), else 0, as the kernel finds it.
    phdr: u64,
}

/// The kernel's checks of the PT_LOAD segments (made past its point of no return, so a
/// failure, returned as the reason, kills the process), and the span hotpath reserves.
fn plan_layout(elf: &CheckedElf) -> Result<Layout, String> {
    let mut lo = u64::MAX;
    let mut hi = 0u64;
    let mut phdr = 0;
    for ph in elf.loads() {
        if ph.p_vaddr >= TASK_SIZE
            || ph.p_filesz > ph.p_memsz
            || ph.p_memsz > TASK_SIZE
            || TASK_SIZE - ph.p_memsz < ph.p_vaddr
        {
            return Err(format!(
                "PT_LOAD at {:#x} ({:#x} bytes in the file, {:#x} in memory) does not fit in user space",
                ph.p_vaddr, ph.p_filesz, ph.p_memsz
            ));
        }
        if ph.p_filesz > 0 && ph.p_offset % PAGE_SIZE != ph.p_vaddr % PAGE_SIZE {
            return Err(format!(
                "PT_LOAD at {:#x}: file offset {:#x} is not at the same place in its page",
                ph.p_vaddr, ph.p_offset
            ));
        }
        if ph.p_offset <= elf.ehdr.e_phoff
            && elf.ehdr.e_phoff < ph.p_offset.wrapping_add(ph.p_filesz)
        {
            phdr = (elf.ehdr.e_phoff - ph.p_offset).wrapping_add(ph.p_vaddr);
        }
        lo = lo.min(page_floor(ph.p_vaddr));
        hi = hi.max(page_ceil(ph.p_vaddr + ph.p_memsz));
    }
    if lo >= hi {
        return Err("no PT_LOAD segment with bytes in memory".into());
    }
    Ok(Layout {
        span: (lo, hi),
        phdr,
    })
}

/// Largest span of an image's PT_LOAD segments hotpath reserves, in bytes (4 GiB).
const MAX_SPAN: u64 = 1 << 32;

/// Refuses a span `(lo, hi)` of PT_LOAD segments over [`MAX_SPAN`]: not the kernel's limit
/// but hotpath's (its code cache must be within ±2 GiB of the guest's code).
fn check_span((lo, hi): (u64, u64)) -> Result<(), String> {
    if hi - lo > MAX_SPAN {
        return Err(format!(
            "image span {lo:#x}..{hi:#x} is over 4 GiB: hotpath cannot place it"
        ));
    }
    Ok(())
}

pub(crate) fn io_reason(e: &std::io::Error) -> String {
    // "No such file or directory (os error 2)" → without the errno suffix.
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

fn check_executable(file: &File, path: &Path) -> Result<(), LoadError> {
    let meta = file.metadata().map_err(|e| LoadError::Io {
        path: path.to_path_buf(),
        reason: io_reason(&e),
    })?;
    let not_exec = |reason: &str| LoadError::NotExecutable {
        path: path.to_path_buf(),
        reason: reason.into(),
    };
    if meta.is_dir() {
        return Err(not_exec("is a directory"));
    }
    if !meta.is_file() {
        return Err(not_exec("not a regular file"));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(not_exec("no execute permission"));
    }
    let _ = meta.mode();
    // The kernel's own check for this user (root may execute any file with an x bit).
    // SAFETY: `access` reads a NUL-terminated path we own.
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| not_exec("path contains NUL"))?;
    if unsafe { libc::access(c.as_ptr(), libc::X_OK) } != 0 {
        return Err(not_exec("permission denied"));
    }
    Ok(())
}

/// Where a reservation goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// Exactly at the ELF's own addresses (`ET_EXEC`).
    Fixed,
    /// Near this address if it is free, else where the kernel finds room.
    Hint(u64),
    /// Where the kernel finds room.
    Anywhere,
}

/// The largest power-of-two `p_align` of `elf`'s PT_LOAD segments, at least a page: where
/// the kernel puts an `ET_DYN` program, its load bias is a multiple of it
/// (`maximum_alignment` in `fs/binfmt_elf.c`), and a program may rely on it (a section
/// aligned to 2 MiB for huge pages, `__ehdr_start` on a boundary).
fn maximum_alignment(elf: &CheckedElf) -> u64 {
    elf.loads()
        .map(|p| p.p_align)
        .filter(|a| a.is_power_of_two())
        .fold(PAGE_SIZE, u64::max)
}

/// Reserves `total` bytes of address space for an image whose lowest ELF address is `lo`,
/// placed as `placement` says, with a load bias (start - `lo`) that is a multiple of `align`
/// bytes (a power of two; not for [`Placement::Fixed`]). Returns the start.
///
/// # Errors
/// [`LoadError::Killed`] where the kernel could not map there either (below
/// `vm.mmap_min_addr`), [`LoadError::Map`] where hotpath's own mappings are in the way.
fn reserve(
    path: &Path,
    placement: Placement,
    lo: u64,
    total: u64,
    align: u64,
) -> Result<u64, LoadError> {
    if placement != Placement::Fixed && align > PAGE_SIZE {
        if let Some(start) = reserve_aligned(placement, lo, total, align) {
            return Ok(start);
        }
        // No room for the alignment's slack (an absurd p_align): unaligned, as before.
    }
    let (hint, flags) = match placement {
        Placement::Fixed => (lo, libc::MAP_FIXED_NOREPLACE),
        Placement::Hint(h) => (h, 0),
        Placement::Anywhere => (0, 0),
    };
    // SAFETY: an anonymous PROT_NONE reservation; FIXED_NOREPLACE never replaces a mapping.
    let p = unsafe {
        libc::mmap(
            hint as *mut c_void,
            total as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED || (placement == Placement::Fixed && p as u64 != lo) {
        let err = std::io::Error::last_os_error();
        if p == libc::MAP_FAILED && matches!(err.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
            // Below vm.mmap_min_addr: the kernel's own mapping of the segment fails too.
            return Err(LoadError::Killed {
                path: path.to_path_buf(),
                reason: format!("cannot map the image at {lo:#x}: {err}"),
            });
        }
        let reason = if p == libc::MAP_FAILED {
            err.to_string()
        } else {
            "address already in use".to_string()
        };
        return Err(LoadError::Map {
            path: path.to_path_buf(),
            addr: lo,
            len: total,
            reason,
        });
    }
    Ok(p as u64)
}

/// Gives back the parts of an image's reservation `[start, end)` that no segment of
/// `segments` covers: between segments nothing is mapped natively (the kernel maps the first
/// segment with the image's whole size and unmaps the rest before mapping the others), so a
/// guest access there is SEGV_MAPERR and the guest may map there.
fn unmap_holes(start: u64, end: u64, segments: &[Segment]) {
    let mut covered: Vec<(u64, u64)> = segments.iter().map(|s| (s.start, s.end)).collect();
    covered.sort_unstable();
    let mut at = start;
    for (s, e) in covered.into_iter().chain(std::iter::once((end, end))) {
        if s > at {
            // SAFETY: a part of the image's own PROT_NONE reservation that no segment took.
            unsafe { libc::munmap(at as *mut c_void, (s.min(end) - at) as usize) };
        }
        at = at.max(e);
        if at >= end {
            break;
        }
    }
}

/// Reserves `len` bytes (PROT_NONE) for hotpath near the image `[start, end)` as
/// [`Image::extra`] says, and returns where; 0 when `len` is 0.
fn reserve_near(start: u64, end: u64, len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    reserve_within_reach(start, end, len)
        .or_else(|| map_reservation(0, len, 0))
        .unwrap_or(0)
}

/// Reserves `len` bytes of address space (PROT_NONE, no commit charge) whose every byte lies
/// within a RIP-relative displacement's reach (2 GiB) of every byte of the guest range
/// `[start, end)`, leaving 16 MiB free next to the range for the guest's own mappings: below
/// it where it lies above 4 GiB, else as high in its reach as is free (away from a brk that
/// grows up from the range). Returns the reservation's address (page-aligned), or `None` when
/// no candidate address is free. A code cache there keeps the range's RIP-relative operands
/// RIP-relative.
pub fn reserve_within_reach(start: u64, end: u64, len: u64) -> Option<u64> {
    let len = page_ceil(len);
    let mut candidates = Vec::new();
    // Below the range, where it lies high enough that no low address is taken.
    if start >= (1 << 32) + EXTRA_GAP + len && end - start + EXTRA_GAP + len <= RIP_REACH {
        candidates.push(page_floor(start - EXTRA_GAP - len));
    }
    // The top of the range's reach, then down toward its end one reservation at a time.
    let top = page_floor((start + RIP_REACH).saturating_sub(len + EXTRA_GAP));
    let mut at = top;
    while at >= end + EXTRA_GAP && candidates.len() < 16 {
        candidates.push(at);
        at -= len;
    }
    for at in candidates {
        if let Some(p) = map_reservation(at, len, libc::MAP_FIXED_NOREPLACE) {
            if p == at {
                return Some(p);
            }
            // An old kernel took FIXED_NOREPLACE as a hint.
            // SAFETY: the reservation just made, elsewhere.
            unsafe { libc::munmap(p as *mut c_void, len as usize) };
        }
    }
    None
}

/// Reserves `len` bytes of address space (PROT_NONE, no commit charge) just above the guest
/// range `[start, end)` and within a RIP-relative displacement's reach (2 GiB) of all of it:
/// the first free of 16 MiB past `end`, then up one reservation at a time. For code beside
/// libraries, which the kernel maps top-down from its mmap base: above them lies the gap
/// below the stack, where the guest's own mappings do not go, while below them is where its
/// next ones will. `None` when no candidate is free.
pub fn reserve_above(start: u64, end: u64, len: u64) -> Option<u64> {
    let len = page_ceil(len);
    let mut at = page_ceil(end + EXTRA_GAP);
    for _ in 0..16 {
        if at + len - start > RIP_REACH {
            break;
        }
        if let Some(p) = map_reservation(at, len, libc::MAP_FIXED_NOREPLACE) {
            if p == at {
                return Some(p);
            }
            // SAFETY: the reservation just made, elsewhere (an old kernel's hint).
            unsafe { libc::munmap(p as *mut c_void, len as usize) };
        }
        at += len;
    }
    None
}

/// A PROT_NONE, MAP_NORESERVE anonymous mapping of `len` bytes at `at` with `flags`.
fn map_reservation(at: u64, len: u64, flags: i32) -> Option<u64> {
    // SAFETY: an anonymous PROT_NONE reservation; FIXED_NOREPLACE never replaces a mapping.
    let p = unsafe {
        libc::mmap(
            at as *mut c_void,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | flags,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as u64)
}

/// True if nothing is mapped at the page at `addr`.
fn page_is_free(addr: u64) -> bool {
    match map_reservation(addr, PAGE_SIZE, libc::MAP_FIXED_NOREPLACE) {
        Some(p) => {
            // SAFETY: the probe page just mapped.
            unsafe { libc::munmap(p as *mut c_void, PAGE_SIZE as usize) };
            p == addr
        }
        None => false,
    }
}

/// Reserves `total` bytes whose start is congruent to `lo` modulo `align` (so the load bias is
/// a multiple of `align`): `align` bytes more are reserved, and the slack on both sides is
/// given back. `None` if that much address space is not to be had.
fn reserve_aligned(placement: Placement, lo: u64, total: u64, align: u64) -> Option<u64> {
    let hint = match placement {
        Placement::Hint(h) => h & !(align - 1),
        _ => 0,
    };
    let len = total.checked_add(align)?;
    // SAFETY: an anonymous PROT_NONE reservation at an address of the kernel's choosing.
    let p = unsafe {
        libc::mmap(
            hint as *mut c_void,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let p = p as u64;
    let start = p + (lo % align + align - p % align) % align;
    // SAFETY: both ranges are parts of the reservation just made, outside [start, start+total).
    unsafe {
        if start > p {
            libc::munmap(p as *mut c_void, (start - p) as usize);
        }
        let end = start + total;
        if p + len > end {
            libc::munmap(end as *mut c_void, (p + len - end) as usize);
        }
    }
    Some(start)
}

fn prot_of(flags: u32) -> i32 {
    let mut prot = 0;
    if flags & PF_R != 0 {
        prot |= libc::PROT_READ;
    }
    if flags & PF_W != 0 {
        prot |= libc::PROT_WRITE;
    }
    if flags & PF_X != 0 {
        prot |= libc::PROT_EXEC;
    }
    prot
}

/// Maps one PT_LOAD as the kernel's `elf_load` does: the file's pages with the segment's
/// protection; if the segment is longer in memory, the rest of the last file page zeroed when
/// the segment is writable (the kernel ignores its failure to zero a read-only page), and
/// anonymous pages after it, readable and writable (and executable if the segment is), as
/// `vm_brk_flags` makes them. Returns the page-aligned ranges mapped.
///
/// # Errors
/// The reason, when the kernel's mapping would fail too (it then kills the process).
fn map_segment(file: &File, file_len: u64, ph: &Phdr, bias: u64) -> Result<Vec<Segment>, String> {
    let prot = prot_of(ph.p_flags);
    let vaddr = ph.p_vaddr.wrapping_add(bias);
    let start = page_floor(vaddr);
    let file_end = vaddr + ph.p_filesz;
    let mem_end = vaddr + ph.p_memsz;
    let map_err = |what: &str, addr: u64, len: u64| {
        format!(
            "cannot map {what} of the PT_LOAD at {:#x} ({len:#x} bytes at {addr:#x}): {}",
            ph.p_vaddr,
            std::io::Error::last_os_error()
        )
    };
    let mut out = Vec::new();
    let mut anon_start = start;
    if ph.p_filesz > 0 {
        let file_map_end = page_ceil(file_end);
        let len = file_map_end - start;
        let offset = ph.p_offset - vaddr % PAGE_SIZE;
        if offset
            .checked_add(len)
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(format!(
                "PT_LOAD at {:#x}: file offset {:#x} too large",
                ph.p_vaddr, ph.p_offset
            ));
        }
        // SAFETY: MAP_FIXED inside our own reservation; the range belongs to the guest.
        let p = unsafe {
            libc::mmap(
                start as *mut c_void,
                len as usize,
                prot,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                file.as_raw_fd(),
                offset as i64,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(map_err("the file", start, len));
        }
        out.push(Segment {
            start,
            end: file_map_end,
            prot,
        });
        if ph.p_memsz > ph.p_filesz
            && !file_end.is_multiple_of(PAGE_SIZE)
            && prot & libc::PROT_WRITE != 0
        {
            // The page holding the file's last byte: past the end of the file, the kernel's
            // write to it fails (a fault it turns into EFAULT).
            let page_offset = offset + (page_floor(file_end) - start);
            if page_offset >= file_len {
                return Err(format!(
                    "PT_LOAD at {:#x}: its last file page is past the end of the file",
                    ph.p_vaddr
                ));
            }
            // SAFETY: [file_end, page end) is inside the writable file mapping just made, and
            // that page holds bytes of the file (checked above), so it does not fault.
            unsafe {
                std::ptr::write_bytes(file_end as *mut u8, 0, (file_map_end - file_end) as usize)
            };
        }
        anon_start = file_map_end;
    }
    let anon_end = page_ceil(mem_end);
    if ph.p_memsz > ph.p_filesz && anon_end > anon_start {
        let len = anon_end - anon_start;
        let anon_prot = libc::PROT_READ | libc::PROT_WRITE | (prot & libc::PROT_EXEC);
        // SAFETY: MAP_FIXED inside our own reservation, for the guest's bss.
        let p = unsafe {
            libc::mmap(
                anon_start as *mut c_void,
                len as usize,
                anon_prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(map_err("the zeroed part", anon_start, len));
        }
        out.push(Segment {
            start: anon_start,
            end: anon_end,
            prot: anon_prot,
        });
    }
    Ok(out)
}

/// The function symbols of `elf` (`.symtab`, else `.dynsym`), sorted by address. A symbol of
/// size 0 (`_fini`, hand-written assembly) is given the bytes up to the next symbol or the end
/// of its segment, whichever comes first: otherwise it would claim every address above it,
/// other mappings included.
fn function_symbols(elf: &Elf, bias: u64, segments: &[Segment]) -> Vec<Symbol> {
    let mut out = Vec::new();
    for (syms, strtab) in [(&elf.syms, &elf.strtab), (&elf.dynsyms, &elf.dynstrtab)] {
        for s in syms.iter() {
            if s.st_type() != sym::STT_FUNC || s.st_value == 0 {
                continue;
            }
            if let Some(name) = strtab.get_at(s.st_name) {
                out.push(Symbol {
                    name: name.to_string(),
                    addr: s.st_value + bias,
                    size: s.st_size,
                });
            }
        }
        if !out.is_empty() {
            break;
        }
    }
    out.sort_by(|a, b| a.addr.cmp(&b.addr).then_with(|| a.name.cmp(&b.name)));
    out.dedup_by(|a, b| a.addr == b.addr);
    for i in 0..out.len() {
        if out[i].size != 0 {
            continue;
        }
        let addr = out[i].addr;
        let segment_end = segments
            .iter()
            .find(|g| g.start <= addr && addr < g.end)
            .map_or(addr + 1, |g| g.end);
        let next = out.get(i + 1).map_or(u64::MAX, |n| n.addr);
        out[i].size = segment_end.min(next) - addr;
    }
    out
}

impl Image {
    /// Guest address where execution starts: the interpreter's entry point for a dynamically
    /// linked program, the program's own otherwise.
    pub fn start(&self) -> u64 {
        self.interpreter.as_ref().map_or(self.entry, |i| i.entry)
    }
}

/// The symbol of `symbols` (sorted by address) containing `addr`, and the offset in it.
pub fn symbolize_in(symbols: &[Symbol], addr: u64) -> Option<(&str, u64)> {
    let i = symbols.partition_point(|s| s.addr <= addr);
    let s = symbols.get(i.checked_sub(1)?)?;
    if s.size == 0 || addr < s.addr + s.size {
        Some((&s.name, addr - s.addr))
    } else {
        None
    }
}

/// What a report needs of one mapped ELF image: its function symbols and build id.
#[derive(Clone, Debug, Default)]
pub struct ModuleSymbols {
    /// Function symbols (`.symtab`, else `.dynsym`) at their guest addresses, sorted.
    pub symbols: Vec<Symbol>,
    /// The GNU build id (`NT_GNU_BUILD_ID` note), lowercase hex.
    pub build_id: Option<String>,
}

/// The symbols and build id of the ELF image `bytes` (a file's contents, or a vDSO's memory)
/// whose file offset 0 is mapped at guest address `start`. `None` when `bytes` is not an ELF
/// image goblin can parse.
pub fn module_symbols(bytes: &[u8], start: u64) -> Option<ModuleSymbols> {
    let elf = Elf::parse(bytes).ok()?;
    let loads: Vec<&program_header::ProgramHeader> = elf
        .program_headers
        .iter()
        .filter(|p| p.p_type == program_header::PT_LOAD)
        .collect();
    let lo = loads.iter().map(|p| page_floor(p.p_vaddr)).min()?;
    let bias = start.wrapping_sub(lo);
    let segments: Vec<Segment> = loads
        .iter()
        .map(|p| Segment {
            start: page_floor(p.p_vaddr.wrapping_add(bias)),
            end: page_ceil(p.p_vaddr.wrapping_add(bias).wrapping_add(p.p_memsz)),
            prot: prot_of(p.p_flags),
        })
        .collect();
    const NT_GNU_BUILD_ID: u32 = 3;
    let build_id = elf.iter_note_headers(bytes).and_then(|notes| {
        notes
            .filter_map(Result::ok)
            .find(|n| n.n_type == NT_GNU_BUILD_ID && n.name == "GNU")
            .map(|n| n.desc.iter().map(|b| format!("{b:02x}")).collect())
    });
    Some(ModuleSymbols {
        symbols: function_symbols(&elf, bias, &segments),
        build_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Unmaps `[at, at + len)`.
    fn unmap(at: u64, len: u64) {
        // SAFETY: a reservation the test made, which nothing uses.
        unsafe { libc::munmap(at as *mut c_void, len as usize) };
    }

    /// Every byte of `[at, at + len)` is within a rel32's reach of every byte of `[start, end)`.
    fn in_reach(at: u64, len: u64, start: u64, end: u64) -> bool {
        (at + len).max(end) - at.min(start) <= RIP_REACH
    }

    #[test]
    fn reservations_lie_in_reach_of_their_range_and_above_it_when_asked() {
        // A stand-in for a library: 32 MiB at the bottom of a free gigabyte (found by mapping
        // it and giving it back), so the candidates above it are free.
        let len = 64 * MIB;
        let hole = map_reservation(0, 1024 * MIB, 0).expect("a free gigabyte");
        unmap(hole, 1024 * MIB);
        let module = map_reservation(hole, 32 * MIB, libc::MAP_FIXED_NOREPLACE)
            .filter(|&m| m == hole)
            .expect("the module's place");
        let (start, end) = (module, module + 32 * MIB);

        let above = reserve_above(start, end, len).expect("room above");
        assert!(
            above >= end + EXTRA_GAP,
            "{above:#x} leaves the gap above {end:#x}"
        );
        assert!(in_reach(above, len, start, end));
        // The first candidate taken: the next one up.
        let again = reserve_above(start, end, len).expect("room above");
        assert_eq!(again, above + len, "one reservation further up");
        assert!(in_reach(again, len, start, end));

        let near = reserve_within_reach(start, end, len).expect("room in reach");
        assert!(in_reach(near, len, start, end));
        assert!(near + len <= start || near >= end, "not over the range");

        for (at, n) in [(above, len), (again, len), (near, len), (module, 32 * MIB)] {
            unmap(at, n);
        }
    }
}
