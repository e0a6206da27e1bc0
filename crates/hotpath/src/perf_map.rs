//! `--perf-map`: the map perf reads to name code it finds in anonymous executable memory
//! (`/tmp/perf-PID.map`, one `START SIZE NAME` line per symbol, hexadecimal, as perf's `jit`
//! interface and QEMU's `-perfmap` define it), so that `perf record` / `perf report` on a
//! hotpath run attribute host time to the guest's functions.
//!
//! Each translated block is named by its guest function and the block's offset in it
//! (`main+0x1c`, `libc.so.6!memcpy+0x40`, as the reports name blocks); a block of a superblock,
//! a calling-context stub and a jump-table stub say so after the name; the gateway is
//! `hotpath gateway`. Written whole when the process ends or execs (atomically: a temporary
//! file renamed), from the translator's record of where it put code; of code put where a
//! flushed cache had other code, the later is named.

use std::io::Write;
use std::path::PathBuf;

use hotpath_translator::cache::code_log::CodeKind;
use hotpath_translator::Translator;

use crate::modules::ModuleMap;

/// Writes `/tmp/perf-PID.map` for this process. Returns its path and how many entries it has.
///
/// # Errors
/// The I/O error when the file cannot be written.
pub fn write(translator: &Translator) -> std::io::Result<(PathBuf, usize)> {
    let records = translator.code_records();
    let modules = ModuleMap::read(&translator.modules());
    let mut text = String::with_capacity(records.len() * 48);
    for r in &records {
        let name = match r.kind {
            CodeKind::Gateway => "hotpath gateway".to_string(),
            kind => {
                let base = match modules.symbolize(r.guest) {
                    Some((name, 0)) => name,
                    Some((name, off)) => format!("{name}+{off:#x}"),
                    None => format!("{:#x}", r.guest),
                };
                match kind {
                    CodeKind::Superblock => format!("{base} [superblock]"),
                    CodeKind::ContextStub => format!("{base} [context stub]"),
                    CodeKind::JumpTableStub => format!("{base} [jump table]"),
                    _ => base,
                }
            }
        };
        text.push_str(&format!(
            "{:x} {:x} {name}\n",
            r.host_start,
            r.host_end - r.host_start
        ));
    }
    let pid = std::process::id();
    let path = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let tmp = PathBuf::from(format!("/tmp/.perf-{pid}.map.hotpath-tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, &path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok((path, records.len()))
}
