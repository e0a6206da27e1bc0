//! The guest's modules: every ELF image mapped into the guest (the program, its interpreter,
//! the vDSO, each library ld.so maps, each incarnation of a dlopen'd one), recorded as they
//! are mapped so reports can name blocks module + offset even after a module is unloaded.

use std::path::PathBuf;

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
}

/// The modules in the order they were mapped.
#[derive(Clone, Debug, Default)]
pub struct ModuleList {
    modules: Vec<GuestModule>,
}

impl ModuleList {
    /// Records a module mapped at `[start, end)`.
    pub fn add(&mut self, path: PathBuf, start: u64, end: u64) {
        self.modules.push(GuestModule {
            path,
            start,
            end,
            unloaded: false,
        });
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
            self.add(path, addr, addr + len);
        }
    }

    /// Records that the guest unmapped `[start, end)`: the modules entirely inside it are gone.
    pub fn note_munmap(&mut self, start: u64, end: u64) {
        for m in &mut self.modules {
            if !m.unloaded && start <= m.start && m.end <= end {
                m.unloaded = true;
            }
        }
    }

    /// Every module ever mapped, in mapping order.
    pub fn all(&self) -> &[GuestModule] {
        &self.modules
    }
}
