//! Naming guest addresses for the reports: the module that contains them (program,
//! interpreter, vDSO, libraries) and the function symbol in that module.

use std::path::Path;

use hotpath_loader::{module_symbols, symbolize_in, Symbol};
use hotpath_report::{module_of, Addr, Module};
use hotpath_translator::cache::modules::{FileId, GuestModule};

/// The guest's modules with their symbols, read once when a report is written.
pub struct ModuleMap {
    /// In mapping order; index 0 is the program.
    pub profiles: Vec<Module>,
    /// Function symbols of each module, at guest addresses.
    symbols: Vec<Vec<Symbol>>,
    /// Each module's file name (what names its blocks), made once rather than for each
    /// block of a report.
    files: Vec<String>,
}

impl ModuleMap {
    /// Reads the symbols and build id of every module in `modules` from its file (the
    /// vDSO's from memory). A file that cannot be read any more (deleted since) gives a
    /// module without symbols.
    pub fn read(modules: &[GuestModule]) -> ModuleMap {
        ModuleMap::read_with(modules, |m| {
            if m.path == Path::new("[vdso]") {
                vdso_bytes(m).map(Image::Owned)
            } else {
                map_file(&m.path).map(Image::Mapped)
            }
        })
    }

    /// [`ModuleMap::read`] of modules a run recorded ([`crate::raw`]) and read later:
    /// `images[i]` is module `i`'s image if the run kept it (the vDSO's), else its file is read
    /// if it is still the one the run mapped ([`FileId`]: the same build id, or without one
    /// the same size and modification time). Returns the map and the paths of the modules
    /// whose file changed or went away since (their blocks are named by offset only).
    pub fn read_recorded(
        modules: &[GuestModule],
        images: &[Option<Vec<u8>>],
    ) -> (ModuleMap, Vec<String>) {
        let mut changed = Vec::new();
        let map = ModuleMap::read_with(modules, |m| {
            let i = modules.iter().position(|x| std::ptr::eq(x, m))?;
            if let Some(bytes) = images.get(i).cloned().flatten() {
                return Some(Image::Owned(bytes));
            }
            let same = match (&m.file, FileId::of_path(&m.path)) {
                (Some(then), Some(now)) if !then.build_id.is_empty() => {
                    then.build_id == now.build_id && then.size == now.size
                }
                (Some(then), Some(now)) => then.size == now.size && then.mtime_ns == now.mtime_ns,
                _ => false,
            };
            if !same {
                changed.push(m.path.display().to_string());
                return None;
            }
            map_file(&m.path).map(Image::Mapped)
        });
        (map, changed)
    }

    /// [`ModuleMap::read`] with each module's image from `image` (`None`: no symbols, and
    /// the build id the run recorded, if any).
    fn read_with(
        modules: &[GuestModule],
        mut image: impl FnMut(&GuestModule) -> Option<Image>,
    ) -> ModuleMap {
        let mut profiles = Vec::with_capacity(modules.len());
        let mut symbols = Vec::with_capacity(modules.len());
        for m in modules {
            let info = image(m)
                .and_then(|b| module_symbols(&b, m.start))
                .unwrap_or_else(|| hotpath_loader::ModuleSymbols {
                    // A file's id holds its build id (the vDSO's holds a checksum too).
                    build_id: m
                        .file
                        .as_ref()
                        .filter(|_| m.path != Path::new("[vdso]"))
                        .map(|f| hex(&f.build_id))
                        .filter(|s| !s.is_empty()),
                    ..Default::default()
                });
            profiles.push(Module {
                path: m.path.display().to_string(),
                base: Addr(m.start),
                size: m.end - m.start,
                build_id: info.build_id,
                unloaded: m.unloaded,
            });
            symbols.push(info.symbols);
        }
        let files = profiles
            .iter()
            .map(|m| {
                Path::new(&m.path)
                    .file_name()
                    .map_or(m.path.clone(), |f| f.to_string_lossy().into_owned())
            })
            .collect();
        ModuleMap {
            profiles,
            symbols,
            files,
        }
    }

    /// Names guest address `addr` as `(name, offset)`: in the program, its function symbol;
    /// in another module, `module!function` with the module's file name, or the module's
    /// file name and the offset from its start when no symbol covers `addr`. `None` outside
    /// every module, or in the program where no symbol covers it.
    pub fn symbolize(&self, addr: u64) -> Option<(String, u64)> {
        let i = module_of(&self.profiles, Addr(addr))?;
        let sym = symbolize_in(&self.symbols[i], addr);
        if i == 0 {
            return sym.map(|(name, off)| (name.to_string(), off));
        }
        let file = &self.files[i];
        Some(match sym {
            Some((name, off)) => (format!("{file}!{name}"), off),
            None => (file.clone(), addr - self.profiles[i].base.0),
        })
    }
}

/// A module's bytes: its file mapped, or a copy (the vDSO's, or one a raw profile kept).
enum Image {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Image {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Image::Mapped(m) => m,
            Image::Owned(v) => v,
        }
    }
}

/// `bytes` in lower-case hexadecimal.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A module's file, mapped read-only (reading it would copy all of it, megabytes for a large
/// library, to look at its headers and symbol table).
fn map_file(path: &Path) -> Option<memmap2::Mmap> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a private read-only view of a file the guest mapped to run; hotpath does not
    // write it. (A file truncated since would fault here, as the guest would have.)
    unsafe { memmap2::Mmap::map(&file) }.ok()
}

/// The vDSO's bytes, read from this process's memory, where the kernel mapped it.
pub fn vdso_bytes(m: &GuestModule) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; (m.end - m.start) as usize];
    hotpath_translator::host::guest_mem::read(m.start, &mut buf).ok()?;
    Some(buf)
}
