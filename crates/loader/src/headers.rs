//! The ELF file header and program headers, read as Linux's `load_elf_binary` reads them
//! (`fs/binfmt_elf.c`): only the fields the kernel looks at, with its checks in its order.
//! Section headers are never read: the kernel does not need them to run a program.

/// Size of an ELF64 file header in bytes.
pub const EHDR_SIZE: usize = 64;
/// Size of one ELF64 program header in bytes; the kernel refuses any other `e_phentsize`.
pub const PHDR_SIZE: usize = 56;
/// Most bytes of program headers the kernel reads (64 KiB: 1170 headers).
const MAX_PHDR_BYTES: usize = 65536;

/// `e_type` of a fixed-address executable.
pub const ET_EXEC: u16 = 2;
/// `e_type` of a position-independent executable (or shared object, or ld.so).
pub const ET_DYN: u16 = 3;
/// `e_machine` of x86-64.
pub const EM_X86_64: u16 = 62;
/// `e_machine` of i386.
pub const EM_386: u16 = 3;

/// `p_type` of a loadable segment.
pub const PT_LOAD: u32 = 1;
/// `p_type` of the interpreter's path.
pub const PT_INTERP: u32 = 3;
/// `p_type` whose `PF_X` says whether the stack is executable.
pub const PT_GNU_STACK: u32 = 0x6474_e551;

/// Segment flag: executable.
pub const PF_X: u32 = 1;
/// Segment flag: writable.
pub const PF_W: u32 = 2;
/// Segment flag: readable.
pub const PF_R: u32 = 4;

/// The fields of an ELF64 file header the kernel uses.
#[derive(Clone, Copy, Debug)]
pub struct Ehdr {
    /// `e_type` (`ET_EXEC`, `ET_DYN`, ...).
    pub e_type: u16,
    /// `e_machine`.
    pub e_machine: u16,
    /// `e_entry`: ELF virtual address of the entry point.
    pub e_entry: u64,
    /// `e_phoff`: file offset of the program headers, in bytes.
    pub e_phoff: u64,
    /// `e_phentsize`: size of one program header, in bytes.
    pub e_phentsize: u16,
    /// `e_phnum`: number of program headers.
    pub e_phnum: u16,
}

/// One ELF64 program header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phdr {
    /// `p_type`.
    pub p_type: u32,
    /// `p_flags` (`PF_R`, `PF_W`, `PF_X`).
    pub p_flags: u32,
    /// File offset of the segment's first byte.
    pub p_offset: u64,
    /// ELF virtual address of its first byte.
    pub p_vaddr: u64,
    /// Bytes taken from the file.
    pub p_filesz: u64,
    /// Bytes in memory (the rest zero-filled).
    pub p_memsz: u64,
    /// Alignment in bytes.
    pub p_align: u64,
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

impl Ehdr {
    /// The file header at the start of `bytes`, as the kernel sees it: it reads the first
    /// bytes of the file into a zeroed buffer, so a file shorter than a header reads as one
    /// padded with zeros. The caller has checked the ELF magic. `e_ident`'s class, byte order
    /// and version are not looked at (the kernel does not either).
    pub fn parse(bytes: &[u8]) -> Ehdr {
        let mut b = [0u8; EHDR_SIZE];
        let n = bytes.len().min(EHDR_SIZE);
        b[..n].copy_from_slice(&bytes[..n]);
        Ehdr {
            e_type: u16_at(&b, 16),
            e_machine: u16_at(&b, 18),
            e_entry: u64_at(&b, 24),
            e_phoff: u64_at(&b, 32),
            e_phentsize: u16_at(&b, 54),
            e_phnum: u16_at(&b, 56),
        }
    }
}

/// Why the program headers cannot be read, as the kernel decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhdrError {
    /// `e_phentsize` is not 56 (ENOEXEC).
    EntrySize(u16),
    /// No program headers, or more than 64 KiB of them (ENOEXEC).
    Count(u16),
    /// The table runs past the end of the file (EIO: a short read).
    PastEnd,
}

impl std::fmt::Display for PhdrError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PhdrError::EntrySize(n) => {
                write!(f, "program header size {n} (e_phentsize), not {PHDR_SIZE}")
            }
            PhdrError::Count(n) => write!(
                f,
                "{n} program headers (e_phnum): between 1 and {} are accepted",
                MAX_PHDR_BYTES / PHDR_SIZE
            ),
            PhdrError::PastEnd => f.write_str("the program headers run past the end of the file"),
        }
    }
}

/// The program headers `ehdr` describes in the file `bytes`, with the kernel's checks
/// (`load_elf_phdrs`).
///
/// # Errors
/// [`PhdrError`] saying which check failed.
pub fn parse_phdrs(bytes: &[u8], ehdr: &Ehdr) -> Result<Vec<Phdr>, PhdrError> {
    if ehdr.e_phentsize as usize != PHDR_SIZE {
        return Err(PhdrError::EntrySize(ehdr.e_phentsize));
    }
    let size = PHDR_SIZE * ehdr.e_phnum as usize;
    if size == 0 || size > MAX_PHDR_BYTES {
        return Err(PhdrError::Count(ehdr.e_phnum));
    }
    let start = usize::try_from(ehdr.e_phoff).map_err(|_| PhdrError::PastEnd)?;
    let table = start
        .checked_add(size)
        .and_then(|end| bytes.get(start..end))
        .ok_or(PhdrError::PastEnd)?;
    Ok(table
        .chunks_exact(PHDR_SIZE)
        .map(|p| Phdr {
            p_type: u32_at(p, 0),
            p_flags: u32_at(p, 4),
            p_offset: u64_at(p, 8),
            p_vaddr: u64_at(p, 16),
            p_filesz: u64_at(p, 32),
            p_memsz: u64_at(p, 40),
            p_align: u64_at(p, 48),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(phentsize: u16, phnum: u16, phoff: u64) -> Vec<u8> {
        let mut b = vec![0u8; EHDR_SIZE];
        b[..4].copy_from_slice(b"\x7fELF");
        b[16..18].copy_from_slice(&ET_EXEC.to_le_bytes());
        b[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
        b[32..40].copy_from_slice(&phoff.to_le_bytes());
        b[54..56].copy_from_slice(&phentsize.to_le_bytes());
        b[56..58].copy_from_slice(&phnum.to_le_bytes());
        b
    }

    #[test]
    fn program_header_checks_are_the_kernels() {
        for bad in [0, 32, 55, 57, 64, 0xffff] {
            let b = header(bad, 1, 64);
            assert_eq!(
                parse_phdrs(&b, &Ehdr::parse(&b)),
                Err(PhdrError::EntrySize(bad))
            );
        }
        for bad in [0, 1171, 0xffff] {
            let b = header(56, bad, 64);
            assert_eq!(
                parse_phdrs(&b, &Ehdr::parse(&b)),
                Err(PhdrError::Count(bad))
            );
        }
        let mut b = header(56, 2, 64);
        b.resize(64 + 2 * 56 - 1, 0);
        assert_eq!(parse_phdrs(&b, &Ehdr::parse(&b)), Err(PhdrError::PastEnd));
        b.push(0);
        assert_eq!(parse_phdrs(&b, &Ehdr::parse(&b)).map(|p| p.len()), Ok(2));
        let b = header(56, 1, u64::MAX - 10);
        assert_eq!(parse_phdrs(&b, &Ehdr::parse(&b)), Err(PhdrError::PastEnd));
    }

    #[test]
    fn a_short_header_reads_as_zero_padded() {
        let h = Ehdr::parse(b"\x7fELF\x02\x01\x01\x00");
        assert_eq!((h.e_type, h.e_phentsize, h.e_phnum), (0, 0, 0));
    }
}
