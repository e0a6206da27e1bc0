//! Source lines of guest code, from each module's DWARF debug information (read with
//! `addr2line`/`gimli`, which also read compressed sections and split DWARF).
//!
//! A module's debug information is looked up the way gdb and perf find it: in the module file
//! itself, else (a stripped module) in `/usr/lib/debug/.build-id/XX/YYYY….debug` named by its
//! GNU build id, else in the file its `.gnu_debuglink` section names, beside the module, in its
//! `.debug/` folder or under `/usr/lib/debug/` plus the module's folder. A module without
//! debug information, or whose debug information cannot be read, has no lines: its code is
//! named by address and symbol as before, with no error.
//!
//! Lines are per guest instruction: a block's instructions are found by decoding its code
//! (from the report when it has it, else from the module file), and each instruction executes
//! as often as its block, so the counts of a line are exact. [`SourceLines::runs`] splits a
//! block into runs of consecutive instructions with the same source position.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use iced_x86::{Decoder, DecoderOptions};
use object::{Object, ObjectSection, ObjectSegment};

use crate::{Addr, Block, Report};

/// Where the system's separate debug files live (Debian's `-dbgsym` packages, Fedora's
/// `-debuginfo`).
const DEBUG_ROOT: &str = "/usr/lib/debug";

/// One source position of an instruction: a function and where in it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// The function (demangled), `None` where the debug information names none.
    pub function: Option<String>,
    /// The source file, as the compiler recorded it (absolute when it knew the directory).
    pub file: Option<String>,
    /// The line, 1-based; 0 where the debug information gives none.
    pub line: u32,
}

/// A run of consecutive instructions of one block that come from the same source position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// Guest address of its first instruction.
    pub addr: Addr,
    /// Instructions in the run.
    pub instructions: u32,
    /// Its source position, innermost first: the inlined functions, then the function they
    /// were inlined into (the last). Empty when the module has no lines for it.
    pub frames: Vec<Frame>,
}

/// A module's debug information and where its file's addresses are at run time.
struct ModuleLines {
    loader: addr2line::Loader,
    /// The module file's bytes, for its code.
    file: memmap2::Mmap,
    /// Its loadable segments: `(virtual address, file offset, bytes in the file)`.
    segments: Vec<(u64, u64, u64)>,
    /// Run-time address minus the module file's virtual address (the load bias).
    bias: u64,
}

/// The source lines of every module of a report that has debug information.
pub struct SourceLines {
    /// Per module of [`Report::modules`], in its order.
    modules: Vec<Option<ModuleLines>>,
}

impl SourceLines {
    /// Reads the debug information of each of `r`'s modules that has some (the files must
    /// still be where the report says they were mapped from): in the module file itself, and
    /// with `separate` also in a separate debug file. Never fails: a module whose file or
    /// debug information is missing or malformed has no lines.
    pub fn load(r: &Report, separate: bool) -> SourceLines {
        SourceLines {
            modules: r
                .modules
                .iter()
                .map(|m| load_module(Path::new(&m.path), m.base.0, separate))
                .collect(),
        }
    }

    /// Whether any module has source lines.
    pub fn any(&self) -> bool {
        self.modules.iter().any(Option::is_some)
    }

    /// Whether module `m` of the report has source lines.
    pub fn has_module(&self, m: usize) -> bool {
        matches!(self.modules.get(m), Some(Some(_)))
    }

    /// The source position of guest address `addr` in module `m`, innermost first; empty when
    /// the module has no lines there.
    pub fn frames(&self, m: usize, addr: Addr) -> Vec<Frame> {
        let Some(Some(ml)) = self.modules.get(m) else {
            return Vec::new();
        };
        frames_at(&ml.loader, addr.0.wrapping_sub(ml.bias))
    }

    /// Block `b` as runs of instructions with one source position each, in address order.
    /// One run of all its instructions, without frames, when its module has no lines or its
    /// code cannot be decoded into exactly `b.instructions` instructions.
    pub fn runs(&self, b: &Block) -> Vec<Run> {
        let whole = || {
            vec![Run {
                addr: b.addr,
                instructions: b.instructions,
                frames: Vec::new(),
            }]
        };
        let Some(Some(ml)) = b.module.and_then(|m| self.modules.get(m)) else {
            return whole();
        };
        let vaddr = b.addr.0.wrapping_sub(ml.bias);
        let code = match &b.code {
            Some(c) => Some(c.0.as_slice()),
            None => ml.code_at(vaddr, b.bytes as u64),
        };
        let Some(starts) = code.and_then(|c| instruction_starts(c, b.addr.0, b.instructions))
        else {
            return whole();
        };
        let mut runs: Vec<Run> = Vec::new();
        for a in starts {
            let frames = frames_at(&ml.loader, a.wrapping_sub(ml.bias));
            match runs.last_mut() {
                Some(r) if r.frames == frames => r.instructions += 1,
                _ => runs.push(Run {
                    addr: Addr(a),
                    instructions: 1,
                    frames,
                }),
            }
        }
        runs
    }
}

/// The addresses of the first `n` instructions of `code` (at guest address `ip`), or `None`
/// if it does not decode into exactly `n` instructions.
fn instruction_starts(code: &[u8], ip: u64, n: u32) -> Option<Vec<u64>> {
    let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut starts = Vec::with_capacity(n as usize);
    while d.can_decode() && starts.len() < n as usize {
        let i = d.decode();
        if i.code() == iced_x86::Code::INVALID {
            return None;
        }
        starts.push(i.ip());
    }
    (starts.len() == n as usize).then_some(starts)
}

impl ModuleLines {
    /// `len` bytes of the module file mapped at virtual address `vaddr`, if a segment holds
    /// them.
    fn code_at(&self, vaddr: u64, len: u64) -> Option<&[u8]> {
        let &(start, offset, _) = self
            .segments
            .iter()
            .find(|&&(start, _, size)| vaddr >= start && vaddr - start + len <= size)?;
        let from = (offset + (vaddr - start)) as usize;
        self.file.get(from..from + len as usize)
    }
}

/// The frames of `probe` (a module file virtual address), innermost first.
fn frames_at(loader: &addr2line::Loader, probe: u64) -> Vec<Frame> {
    let mut out = Vec::new();
    let Ok(mut it) = loader.find_frames(probe) else {
        return out;
    };
    while let Ok(Some(f)) = it.next() {
        let function = f
            .function
            .as_ref()
            .and_then(|n| n.demangle().ok())
            .map(|n| n.into_owned());
        let (file, line) = match &f.location {
            Some(l) => (l.file.map(str::to_string), l.line.unwrap_or(0)),
            None => (None, 0),
        };
        if function.is_none() && file.is_none() {
            continue;
        }
        out.push(Frame {
            function,
            file,
            line,
        });
    }
    out
}

/// The debug information of the module file at `path`, mapped so that file offset 0 is at
/// run-time address `base` (with `separate`, also from a separate debug file); `None` without
/// any.
fn load_module(path: &Path, base: u64, separate: bool) -> Option<ModuleLines> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a read-only private mapping of a module file; a file changed under it gives wrong
    // lines, never unsoundness in the code that reads the bytes (they are parsed as untrusted).
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let obj = object::File::parse(&*map).ok()?;
    // File offset 0 is in the first loadable segment; its address less its offset is where
    // offset 0 would be in the file's own addresses.
    let first = obj
        .segments()
        .min_by_key(|s| s.file_range().0)
        .filter(|s| s.file_range().0 <= s.address())?;
    let bias = base.wrapping_sub(first.address() - first.file_range().0);
    let debug_file = if has_dwarf(&obj) {
        path.to_path_buf()
    } else if separate {
        separate_debug_file(path, &obj)?
    } else {
        return None;
    };
    let loader = addr2line::Loader::new(&debug_file).ok()?;
    let segments = obj
        .segments()
        .map(|s| (s.address(), s.file_range().0, s.file_range().1))
        .collect();
    drop(obj);
    Some(ModuleLines {
        loader,
        file: map,
        segments,
        bias,
    })
}

/// Whether `obj` carries DWARF line information itself.
fn has_dwarf(obj: &object::File) -> bool {
    obj.section_by_name(".debug_line")
        .or_else(|| obj.section_by_name(".zdebug_line"))
        .is_some_and(|s| s.size() > 0)
}

/// The separate debug file of a stripped module: by build id, else by `.gnu_debuglink`.
fn separate_debug_file(path: &Path, obj: &object::File) -> Option<PathBuf> {
    let with_dwarf = |p: PathBuf| {
        let f = std::fs::File::open(&p).ok()?;
        // SAFETY: as in `load_module`.
        let map = unsafe { memmap2::Mmap::map(&f) }.ok()?;
        has_dwarf(&object::File::parse(&*map).ok()?).then_some(p)
    };
    if let Ok(Some(id)) = obj.build_id() {
        if id.len() >= 2 {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            let p = Path::new(DEBUG_ROOT)
                .join(".build-id")
                .join(&hex[..2])
                .join(format!("{}.debug", &hex[2..]));
            if let Some(p) = with_dwarf(p) {
                return Some(p);
            }
        }
    }
    let (name, _crc) = obj.gnu_debuglink().ok().flatten()?;
    let name = std::str::from_utf8(name).ok()?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let rel = dir.strip_prefix("/").unwrap_or(dir);
    [
        dir.join(name),
        dir.join(".debug").join(name),
        Path::new(DEBUG_ROOT).join(rel).join(name),
    ]
    .into_iter()
    .find_map(with_dwarf)
}

/// Guest instructions executed per source line, over every block of `r` whose module has
/// lines: `(file, line, function)` of the innermost frame → instructions, and the first guest
/// address seen on it.
pub fn line_costs(r: &Report, lines: &SourceLines) -> HashMap<Frame, (u64, Addr)> {
    let mut out: HashMap<Frame, (u64, Addr)> = HashMap::new();
    for b in r.blocks.iter().filter(|b| b.count > 0) {
        if !b.module.is_some_and(|m| lines.has_module(m)) {
            continue;
        }
        for run in lines.runs(b) {
            let Some(f) = run.frames.first() else {
                continue;
            };
            let e = out.entry(f.clone()).or_insert((0, run.addr));
            e.0 += b.count * run.instructions as u64;
            e.1 = e.1.min(run.addr);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_decoded_into_its_own_instruction_count_or_not_at_all() {
        // mov eax, 1; add eax, ebx; ret
        let code = [0xb8, 1, 0, 0, 0, 0x01, 0xd8, 0xc3];
        assert_eq!(
            instruction_starts(&code, 0x1000, 3),
            Some(vec![0x1000, 0x1005, 0x1007])
        );
        assert_eq!(instruction_starts(&code, 0x1000, 4), None);
        assert_eq!(instruction_starts(&[0x0f, 0xff], 0x1000, 1), None);
    }

    #[test]
    fn a_module_that_is_missing_or_not_an_elf_has_no_lines() {
        assert!(load_module(Path::new("/nonexistent/module"), 0, true).is_none());
        let junk = std::env::temp_dir().join(format!("hotpath-lines-junk-{}", std::process::id()));
        std::fs::write(&junk, b"\x7fELF but not really an ELF file at all").unwrap();
        assert!(load_module(&junk, 0, true).is_none());
        let _ = std::fs::remove_file(&junk);
    }
}
