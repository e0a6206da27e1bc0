//! Naming guest addresses for the reports: the module that contains them (program,
//! interpreter, vDSO, libraries) and the function symbol in that module.

use std::path::Path;

use hotpath_loader::{module_symbols, symbolize_in, Symbol};
use hotpath_report::{module_of, Addr, Module};
use hotpath_translator::cache::modules::GuestModule;

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
        let mut profiles = Vec::with_capacity(modules.len());
        let mut symbols = Vec::with_capacity(modules.len());
        for m in modules {
            let info = if m.path == Path::new("[vdso]") {
                vdso_bytes(m).and_then(|b| module_symbols(&b, m.start))
            } else {
                map_file(&m.path).and_then(|b| module_symbols(&b, m.start))
            }
            .unwrap_or_default();
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

/// A module's file, mapped read-only (reading it would copy all of it, megabytes for a large
/// library, to look at its headers and symbol table).
fn map_file(path: &Path) -> Option<memmap2::Mmap> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a private read-only view of a file the guest mapped to run; hotpath does not
    // write it. (A file truncated since would fault here, as the guest would have.)
    unsafe { memmap2::Mmap::map(&file) }.ok()
}

/// The vDSO's bytes, read from this process's memory, where the kernel mapped it.
fn vdso_bytes(m: &GuestModule) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; (m.end - m.start) as usize];
    hotpath_translator::host::guest_mem::read(m.start, &mut buf).ok()?;
    Some(buf)
}
