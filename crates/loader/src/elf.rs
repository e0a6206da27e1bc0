//! Checking an ELF file and mapping its PT_LOAD segments into the guest's address space.

use std::ffi::c_void;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use goblin::elf::{header, program_header, sym, Elf};
use memmap2::Mmap;

use crate::{page_ceil, page_floor, LoadError, PAGE_SIZE};

/// Address space reserved after the image for the guest's brk heap, in bytes (1 GiB).
/// Reserved up front (PROT_NONE) so that nothing of hotpath's can land where the guest's
/// heap must grow.
pub const BRK_RESERVE: u64 = 1 << 30;

/// Size of an ELF64 file header in bytes.
const ELF64_EHDR_SIZE: usize = 64;

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
}

/// Caller's requirements for the reservation.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Bytes to reserve (PROT_NONE) after the brk region for the caller's own use.
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
    /// The guest program's path, absolute (what `/proc/self/exe` must show the guest).
    pub path: PathBuf,
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
    /// One past the highest mapped byte of the image (page-aligned): the initial brk.
    pub brk_start: u64,
    /// End of the address range reserved for the brk heap.
    pub brk_limit: u64,
    /// The caller's extra reservation `(start, len)`, PROT_NONE, right after `brk_limit`.
    pub extra: (u64, u64),
    /// Function symbols, sorted by address.
    pub symbols: Vec<Symbol>,
    /// The program interpreter, for a dynamically linked program.
    pub interpreter: Option<Interpreter>,
}

/// Loads the executable at `path` into this process at its guest addresses, and its
/// interpreter when it names one (`PT_INTERP`), as the kernel's `execve` does: the program at
/// its fixed addresses (`ET_EXEC`) or at a base like the kernel's (`ET_DYN`), the interpreter
/// wherever there is room.
///
/// # Errors
/// [`LoadError`] naming the file when it is missing, unreadable, not executable, not an ELF,
/// not a 64-bit x86-64 executable, malformed, or when its addresses are not free;
/// [`LoadError::Interpreter`] when its interpreter is missing or cannot be loaded.
pub fn load(path: &Path, opts: LoadOptions) -> Result<Image, LoadError> {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let (file, bytes) = open_checked(path, &abs)?;
    let checked = parse_checked(&bytes, &abs)?;
    let elf = &checked.elf;
    let unsupported = |reason: String| LoadError::UnsupportedElf {
        path: abs.clone(),
        reason,
    };
    if checked.kind == ElfKind::StaticPie && elf.entry == 0 {
        return Err(unsupported(
            "a shared library, not an executable (entry point 0)".into(),
        ));
    }
    let placement = match (checked.kind, elf.interpreter) {
        (ElfKind::Static, _) => Placement::Fixed,
        (ElfKind::StaticPie, Some(_)) => Placement::Hint(ELF_ET_DYN_BASE),
        // A static-pie goes where the kernel finds room, like ASLR would put it.
        (ElfKind::StaticPie, None) => Placement::Anywhere,
    };
    let (lo, hi) = checked.span;
    let total = hi - lo + BRK_RESERVE + page_ceil(opts.extra_reserve);
    let base = reserve(&abs, placement, lo, total)?;
    let load_bias = base - lo;

    let mut segments = Vec::new();
    for ph in checked.loads() {
        segments.push(map_segment(&file, &abs, ph, load_bias)?);
    }

    let phdr = match elf
        .program_headers
        .iter()
        .find(|p| p.p_type == program_header::PT_PHDR)
    {
        Some(p) => p.p_vaddr + load_bias,
        // Static glibc has no PT_PHDR: the headers sit in the LOAD that maps file offset 0.
        None => checked
            .loads()
            .find(|p| p.p_offset == 0)
            .map(|p| p.p_vaddr + elf.header.e_phoff + load_bias)
            .unwrap_or(0),
    };
    let interpreter = match elf.interpreter {
        Some(interp) => Some(load_interpreter(&abs, Path::new(interp))?),
        None => None,
    };
    let brk_start = hi + load_bias;
    let brk_limit = brk_start + BRK_RESERVE;
    Ok(Image {
        path: abs,
        kind: checked.kind,
        load_bias,
        entry: elf.entry + load_bias,
        phdr,
        phent: elf.header.e_phentsize as u64,
        phnum: elf.header.e_phnum as u64,
        image_start: base,
        brk_start,
        brk_limit,
        extra: (brk_limit, page_ceil(opts.extra_reserve)),
        symbols: function_symbols(elf, load_bias, &segments),
        segments,
        interpreter,
    })
}

/// Loads the program interpreter `interp` named by `program`, wherever there is room.
fn load_interpreter(program: &Path, interp: &Path) -> Result<Interpreter, LoadError> {
    let err = |reason: String| LoadError::Interpreter {
        path: program.to_path_buf(),
        interp: interp.to_path_buf(),
        reason,
    };
    // The kernel's own rule: the interpreter must be an executable regular file.
    let (file, bytes) = open_checked(interp, interp).map_err(|e| err(e.reason()))?;
    let checked = parse_checked(&bytes, interp).map_err(|e| err(e.reason()))?;
    let elf = &checked.elf;
    if elf.interpreter.is_some() {
        return Err(err("the interpreter itself names an interpreter".into()));
    }
    let placement = match checked.kind {
        ElfKind::Static => Placement::Fixed,
        ElfKind::StaticPie => Placement::Anywhere,
    };
    let (lo, hi) = checked.span;
    let base = reserve(interp, placement, lo, hi - lo).map_err(|e| err(e.reason()))?;
    let load_bias = base - lo;
    for ph in checked.loads() {
        map_segment(&file, interp, ph, load_bias).map_err(|e| err(e.reason()))?;
    }
    Ok(Interpreter {
        path: interp.to_path_buf(),
        load_bias,
        entry: elf.entry + load_bias,
        range: (base, hi + load_bias),
    })
}

/// An ELF file that passed the checks every executable must pass.
struct CheckedElf<'a> {
    elf: Elf<'a>,
    kind: ElfKind,
    /// Page-aligned ELF virtual address range of the PT_LOAD segments, `(lo, hi)`.
    span: (u64, u64),
}

impl CheckedElf<'_> {
    fn loads(&self) -> impl Iterator<Item = &program_header::ProgramHeader> {
        self.elf
            .program_headers
            .iter()
            .filter(|p| p.p_type == program_header::PT_LOAD)
    }
}

/// Opens `path` (shown as `abs` in errors), checks it is an executable regular file and maps
/// it read-only (a read would copy all of it, a few megabytes for a large program, where the
/// loader looks at its headers: a tenth of `busybox true`'s start-up went there).
fn open_checked(path: &Path, abs: &Path) -> Result<(File, Mmap), LoadError> {
    let io = |e: std::io::Error| LoadError::Io {
        path: abs.to_path_buf(),
        reason: io_reason(&e),
    };
    let file = File::open(path).map_err(io)?;
    check_executable(&file, abs)?;
    // SAFETY: a private read-only view of the program file, as the kernel maps it to run it;
    // hotpath does not write it. (Truncating the file while hotpath starts would fault here,
    // as it would fault the program natively.)
    let bytes = unsafe { Mmap::map(&file) }.map_err(io)?;
    Ok((file, bytes))
}

/// Checks `bytes` are a well-formed 64-bit little-endian x86-64 executable (`ET_EXEC` or
/// `ET_DYN`) whose PT_LOAD segments lie in the file and span at most 4 GiB.
fn parse_checked<'a>(bytes: &'a [u8], abs: &Path) -> Result<CheckedElf<'a>, LoadError> {
    let unsupported = |reason: String| LoadError::UnsupportedElf {
        path: abs.to_path_buf(),
        reason,
    };
    if bytes.len() < 4 || &bytes[..4] != b"\x7fELF" {
        return Err(LoadError::NotElf {
            path: abs.to_path_buf(),
        });
    }
    if bytes.len() < header::SIZEOF_IDENT + 2 {
        return Err(unsupported("truncated ELF header".into()));
    }
    match bytes[header::EI_CLASS] {
        header::ELFCLASS64 => {}
        header::ELFCLASS32 => {
            return Err(unsupported(
                "32-bit ELF (ELFCLASS32): hotpath runs x86-64 programs only".into(),
            ))
        }
        c => return Err(unsupported(format!("bad ELF class {c}"))),
    }
    if bytes[header::EI_DATA] != header::ELFDATA2LSB {
        return Err(unsupported(
            "big-endian ELF: hotpath runs x86-64 programs only".into(),
        ));
    }
    if bytes.len() < ELF64_EHDR_SIZE {
        return Err(unsupported(format!(
            "truncated ELF header ({} bytes, need {})",
            bytes.len(),
            ELF64_EHDR_SIZE
        )));
    }
    let machine = u16::from_le_bytes([bytes[18], bytes[19]]);
    if machine != header::EM_X86_64 {
        return Err(unsupported(format!(
            "ELF machine is {} ({machine}), not x86-64: hotpath runs x86-64 programs only",
            header::machine_to_str(machine)
        )));
    }
    let elf = Elf::parse(bytes).map_err(|e| unsupported(format!("malformed ELF: {e}")))?;
    let kind = match elf.header.e_type {
        header::ET_EXEC => ElfKind::Static,
        header::ET_DYN => ElfKind::StaticPie,
        t => {
            return Err(unsupported(format!(
                "not an executable (ELF type {})",
                header::et_to_str(t)
            )))
        }
    };
    let loads: Vec<&program_header::ProgramHeader> = elf
        .program_headers
        .iter()
        .filter(|p| p.p_type == program_header::PT_LOAD)
        .collect();
    if loads.is_empty() {
        return Err(unsupported("no PT_LOAD segment".into()));
    }
    for ph in &loads {
        if ph
            .p_offset
            .checked_add(ph.p_filesz)
            .is_none_or(|end| end > bytes.len() as u64)
        {
            return Err(unsupported(format!(
                "truncated: segment at offset {:#x} needs {:#x} bytes past the end of the file",
                ph.p_offset, ph.p_filesz
            )));
        }
        if ph.p_filesz > ph.p_memsz || (ph.p_vaddr % PAGE_SIZE) != (ph.p_offset % PAGE_SIZE) {
            return Err(unsupported(format!(
                "malformed PT_LOAD at vaddr {:#x}",
                ph.p_vaddr
            )));
        }
    }
    let lo = loads
        .iter()
        .map(|p| page_floor(p.p_vaddr))
        .min()
        .unwrap_or(0);
    let hi = loads
        .iter()
        .map(|p| page_ceil(p.p_vaddr.saturating_add(p.p_memsz)))
        .max()
        .unwrap_or(0);
    if hi <= lo || hi - lo > (1 << 32) {
        return Err(unsupported(format!(
            "image span {lo:#x}..{hi:#x} is empty or over 4 GiB"
        )));
    }
    Ok(CheckedElf {
        elf,
        kind,
        span: (lo, hi),
    })
}

fn io_reason(e: &std::io::Error) -> String {
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

/// Reserves `total` bytes of address space for an image whose lowest ELF address is `lo`,
/// placed as `placement` says. Returns the start.
fn reserve(path: &Path, placement: Placement, lo: u64, total: u64) -> Result<u64, LoadError> {
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
        let reason = if p == libc::MAP_FAILED {
            std::io::Error::last_os_error().to_string()
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

fn prot_of(flags: u32) -> i32 {
    let mut prot = 0;
    if flags & program_header::PF_R != 0 {
        prot |= libc::PROT_READ;
    }
    if flags & program_header::PF_W != 0 {
        prot |= libc::PROT_WRITE;
    }
    if flags & program_header::PF_X != 0 {
        prot |= libc::PROT_EXEC;
    }
    prot
}

/// Maps one PT_LOAD: file pages, zeroed tail of the last file page, anonymous bss pages.
fn map_segment(
    file: &File,
    path: &Path,
    ph: &program_header::ProgramHeader,
    bias: u64,
) -> Result<Segment, LoadError> {
    let prot = prot_of(ph.p_flags);
    let vaddr = ph.p_vaddr + bias;
    let start = page_floor(vaddr);
    let file_end = vaddr + ph.p_filesz;
    let mem_end = page_ceil(vaddr + ph.p_memsz);
    let map_err = |addr: u64, len: u64| LoadError::Map {
        path: path.to_path_buf(),
        addr,
        len,
        reason: std::io::Error::last_os_error().to_string(),
    };
    let file_map_end = page_ceil(file_end);
    if ph.p_filesz > 0 {
        let len = file_map_end - start;
        // SAFETY: MAP_FIXED inside our own PROT_NONE reservation; the range belongs to the guest.
        let p = unsafe {
            libc::mmap(
                start as *mut c_void,
                len as usize,
                prot | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                file.as_raw_fd(),
                page_floor(ph.p_offset) as i64,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(map_err(start, len));
        }
        if ph.p_memsz > ph.p_filesz {
            // SAFETY: the range [file_end, page end) is inside the writable mapping just made.
            unsafe {
                std::ptr::write_bytes(file_end as *mut u8, 0, (file_map_end - file_end) as usize)
            };
        }
        // SAFETY: our own mapping.
        if unsafe { libc::mprotect(start as *mut c_void, len as usize, prot) } != 0 {
            return Err(map_err(start, len));
        }
    }
    let anon_start = if ph.p_filesz > 0 { file_map_end } else { start };
    if mem_end > anon_start {
        let len = mem_end - anon_start;
        // SAFETY: MAP_FIXED inside our own reservation, for the guest's bss.
        let p = unsafe {
            libc::mmap(
                anon_start as *mut c_void,
                len as usize,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(map_err(anon_start, len));
        }
    }
    Ok(Segment {
        start,
        end: mem_end,
        prot,
    })
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
