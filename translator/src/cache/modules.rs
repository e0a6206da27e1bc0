//! The guest's modules: every ELF image mapped into the guest (the program, its interpreter,
//! the vDSO, each library ld.so maps, each incarnation of a dlopen'd one), recorded as they
//! are mapped so reports can name blocks module + offset even after a module is unloaded.

use std::path::PathBuf;

/// What identifies a module's file and its contents: where it is (device, inode), its size
/// and times, and its GNU build id (empty when it has none or it is not in the file's first
/// 8 KiB). Two mappings with equal ids map the same bytes unless the file was changed in place
/// within the times' resolution; the persisted store compares each block's bytes anyway.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
    pub build_id: Vec<u8>,
}

impl FileId {
    /// The id of the file open as `fd`; `None` if it is not a regular file.
    pub fn of_fd(fd: i32) -> Option<FileId> {
        // SAFETY: fstat writes the struct we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        let mut head = vec![0u8; 8192];
        // SAFETY: pread into our own buffer of that length.
        let n = unsafe { libc::pread(fd, head.as_mut_ptr().cast(), head.len(), 0) };
        head.truncate(n.max(0) as usize);
        Some(FileId {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime_ns: st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
            ctime_ns: st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
            build_id: build_id(&head).unwrap_or_default(),
        })
    }

    /// The id of an image that has no file (the vDSO), from its bytes: their length and GNU
    /// build id, and the CRC-32 of the bytes with it (the kernel's vDSO carries a build id; the
    /// CRC tells two images apart without one); device, inode and times 0. Its translations
    /// are persisted like a file's: the store compares each block's bytes before use anyway.
    pub fn of_image(bytes: &[u8]) -> FileId {
        let mut id = build_id(bytes).unwrap_or_default();
        id.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
        FileId {
            dev: 0,
            ino: 0,
            size: bytes.len() as u64,
            mtime_ns: 0,
            ctime_ns: 0,
            build_id: id,
        }
    }

    /// The id of the file at `path`.
    pub fn of_path(path: &std::path::Path) -> Option<FileId> {
        let f = std::fs::File::open(path).ok()?;
        FileId::of_fd(std::os::fd::AsRawFd::as_raw_fd(&f))
    }
}

/// The GNU build id in the PT_NOTE segments of the ELF file whose first bytes are `head`.
fn build_id(head: &[u8]) -> Option<Vec<u8>> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(head.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(head.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(head.get(o..o + 8)?.try_into().ok()?));
    if head.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(32)? as usize, u16_at(54)? as usize, u16_at(56)?);
    for i in 0..phnum as usize {
        let ph = phoff + i * phentsize;
        if u32_at(ph)? != 4 {
            continue; // not PT_NOTE
        }
        let (mut o, end) = (
            u64_at(ph + 8)? as usize,
            (u64_at(ph + 8)? + u64_at(ph + 32)?) as usize,
        );
        while o + 12 <= end.min(head.len()) {
            let (namesz, descsz, kind) =
                (u32_at(o)? as usize, u32_at(o + 4)? as usize, u32_at(o + 8)?);
            let name = o + 12;
            let desc = name + namesz.next_multiple_of(4);
            if kind == 3 && head.get(name..name + namesz)? == b"GNU\0" {
                return Some(head.get(desc..desc + descsz)?.to_vec());
            }
            o = desc + descsz.next_multiple_of(4);
        }
    }
    None
}

/// One ELF image mapped into the guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestModule {
    /// The mapped file (`[vdso]` for the vDSO).
    pub path: PathBuf,
    /// Guest address of its first mapped byte: where file offset 0 is mapped.
    pub start: u64,
    /// One past its last byte (page-aligned guest address): the extent of the mapping that
    /// mapped offset 0, which ld.so makes the whole image's span.
    pub end: u64,
    /// The guest unmapped it (dlclose); a later load at the same place is a new entry.
    pub unloaded: bool,
    /// Its file's identity when it was mapped (the vDSO's: [`FileId::of_image`]).
    pub file: Option<FileId>,
}

/// The modules in the order they were mapped.
#[derive(Clone, Debug, Default)]
pub struct ModuleList {
    modules: Vec<GuestModule>,
    /// Changes each time a module is added or unloaded: what [`containing`](Self::containing)
    /// found for an address holds while it stays the same.
    version: u64,
}

impl ModuleList {
    /// Records a module mapped at `[start, end)` from the file `file` identifies.
    pub fn add(&mut self, path: PathBuf, start: u64, end: u64, file: Option<FileId>) {
        self.version += 1;
        self.modules.push(GuestModule {
            path,
            start,
            end,
            unloaded: false,
            file,
        });
    }

    /// The module mapped last that holds guest address `addr` and is still mapped.
    pub fn containing(&self, addr: u64) -> Option<&GuestModule> {
        Some(&self.modules[self.index_containing(addr)?])
    }

    /// The index of [`containing`](Self::containing)`(addr)`.
    fn index_containing(&self, addr: u64) -> Option<usize> {
        self.modules
            .iter()
            .rposition(|m| !m.unloaded && m.start <= addr && addr < m.end)
    }

    /// [`containing`](Self::containing)`(addr)` with the range `[lo, hi)` around `addr` where it
    /// finds the same module: the module's span less the modules mapped after it.
    pub fn containing_range(&self, addr: u64) -> Option<(&GuestModule, u64, u64)> {
        let i = self.index_containing(addr)?;
        let m = &self.modules[i];
        let (mut lo, mut hi) = (m.start, m.end);
        for later in self.modules[i + 1..].iter().filter(|l| !l.unloaded) {
            if later.end <= addr {
                lo = lo.max(later.end);
            } else if later.start > addr {
                hi = hi.min(later.start);
            }
        }
        Some((m, lo, hi))
    }

    /// Records a guest `mmap` that succeeded at `addr` (`len` bytes, page-aligned) from file
    /// descriptor `fd` at file offset `offset`: a module when it maps offset 0 of a file that
    /// starts with the ELF magic (ld.so maps each library this way first, over its whole
    /// span, then maps the other segments inside it).
    pub fn note_mmap(&mut self, addr: u64, len: u64, fd: i64, offset: u64) {
        if fd < 0 || offset != 0 {
            return;
        }
        let Ok(path) = std::fs::read_link(format!("/proc/self/fd/{fd}")) else {
            return;
        };
        let mut magic = [0u8; 4];
        // Read the file, not the mapping: the guest may have mapped it without PROT_READ.
        // SAFETY: pread into our own buffer from a descriptor the guest just mapped.
        let n = unsafe { libc::pread(fd as i32, magic.as_mut_ptr().cast(), 4, 0) };
        if n == 4 && &magic == b"\x7fELF" {
            let file = FileId::of_fd(fd as i32);
            self.add(path, addr, addr + len, file);
        }
    }

    /// Records that the guest unmapped `[start, end)`: the modules entirely inside it are gone.
    pub fn note_munmap(&mut self, start: u64, end: u64) {
        for m in &mut self.modules {
            if !m.unloaded && start <= m.start && m.end <= end {
                m.unloaded = true;
                self.version += 1;
            }
        }
    }

    /// The list's version: the same as long as no module was added or unloaded.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Every module ever mapped, in mapping order.
    pub fn all(&self) -> &[GuestModule] {
        &self.modules
    }
}
