//! Compiling guest samples with the installed gcc into `<target>/guest-samples/`, once.
//!
//! A built file is `<target>/guest-samples/<source stem>.<linkage>` (`hello.static`,
//! `asm_flags.static-pie`, `hello.dynamic`), or `<source stem>.so` for a shared library a
//! sample loads (`dlopen_lib.so`); next to it, `<file>.cmd` records the gcc command that made
//! it.
//! A file is rebuilt when it is missing, older than its source or any header in
//! `guest-samples/`, or made by a different command. Builders of the same file take an
//! exclusive `flock` on `<file>.lock` (threads of one test process and concurrent test
//! processes alike, e.g. under cargo-nextest), so a file is built once and never replaced
//! while another test runs it; the output is written to a temporary name and renamed into
//! place, so a reader never sees a half-written binary.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use crate::catalog::Linkage;
use crate::paths;

/// Optimisation level of C samples: what a user's release build would use.
const C_OPT: &str = "-O2";

/// `<target>/guest-samples/`: where built samples go.
pub fn build_dir() -> PathBuf {
    paths::target_dir().join("guest-samples")
}

/// The gcc arguments (without the output and the source) that build `source` with `linkage`.
/// C samples are linked against glibc and libm (static, or shared for [`Linkage::Dynamic`],
/// gcc's default PIE); `.S` samples are freestanding (`-nostdlib`, entry `_start`, raw
/// syscalls). C samples named `lines_*` are built with `-g`.
pub fn gcc_args(source: &str, linkage: Linkage) -> Vec<String> {
    let include = format!("-I{}", paths::samples_dir().display());
    let link = linkage.gcc_flag().map(String::from);
    if source.ends_with(".S") {
        ["-nostdlib".into()]
            .into_iter()
            .chain(link)
            .chain([include])
            .collect()
    } else {
        // Samples named `lines_*` test source lines: they carry DWARF.
        let debug = stem(source)
            .rsplit('/')
            .next()
            .is_some_and(|s| s.starts_with("lines_"))
            .then(|| "-g".to_string());
        [C_OPT.into(), "-Wall".into(), "-Wextra".into()]
            .into_iter()
            .chain(debug)
            .chain(link)
            .chain(["-pthread".into(), include])
            .collect()
    }
}

/// The gcc arguments (without the output and the source) that build a C sample as a shared
/// library: position-independent, with the samples' headers.
pub fn shared_library_gcc_args() -> Vec<String> {
    vec![
        C_OPT.into(),
        "-Wall".into(),
        "-Wextra".into(),
        "-shared".into(),
        "-fPIC".into(),
        format!("-I{}", paths::samples_dir().display()),
    ]
}

/// Libraries named after the source file (gcc wants them last).
fn gcc_libs(source: &str) -> Vec<String> {
    if source.ends_with(".S") {
        Vec::new()
    } else {
        vec!["-lm".into()]
    }
}

fn stem(source: &str) -> &str {
    source.rsplit_once('.').map_or(source, |(stem, _)| stem)
}

/// Where `source` built with `linkage` lives.
pub fn output_path(source: &str, linkage: Linkage) -> PathBuf {
    build_dir().join(format!("{}.{}", stem(source), linkage.flag()))
}

/// Where `source` built as a shared library lives: `<target>/guest-samples/<stem>.so`.
pub fn shared_library_path(source: &str) -> PathBuf {
    build_dir().join(format!("{}.so", stem(source)))
}

/// `<out><suffix>`: the command record, lock and temporary files beside a built file.
fn beside(out: &Path, suffix: &str) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The samples' source directory's newest header: a change there rebuilds everything.
fn newest_header() -> io::Result<Option<SystemTime>> {
    let mut newest = None;
    for entry in fs::read_dir(paths::samples_dir())? {
        let entry = entry?;
        if entry.path().extension().is_some_and(|e| e == "h") {
            let m = entry.metadata()?.modified()?;
            newest = Some(newest.map_or(m, |n: SystemTime| n.max(m)));
        }
    }
    Ok(newest)
}

fn up_to_date(out: &Path, cmd_file: &Path, command_line: &str, src: &Path) -> io::Result<bool> {
    let Ok(out_meta) = fs::metadata(out) else {
        return Ok(false);
    };
    let Ok(recorded) = fs::read_to_string(cmd_file) else {
        return Ok(false);
    };
    if recorded != command_line {
        return Ok(false);
    }
    let built = out_meta.modified()?;
    let mut newest_input = fs::metadata(src)?.modified()?;
    if let Some(h) = newest_header()? {
        newest_input = newest_input.max(h);
    }
    Ok(built >= newest_input)
}

/// An exclusive advisory lock on a file, released when dropped (the fd closes).
struct FileLock {
    _file: fs::File,
}

impl FileLock {
    fn acquire(path: &Path) -> io::Result<FileLock> {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        loop {
            // SAFETY: flock on an fd we own; no memory is passed.
            let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if r == 0 {
                return Ok(FileLock { _file: file });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Builds `source` (a file name in `guest-samples/`) with `linkage` unless an up-to-date
/// build exists, and returns the path of the executable.
///
/// # Errors
///
/// A message with gcc's output when gcc is missing or fails, or an I/O error text.
pub fn build(source: &str, linkage: Linkage) -> Result<PathBuf, String> {
    let out = output_path(source, linkage);
    compile(source, &out, gcc_args(source, linkage), gcc_libs(source))
}

/// Builds the C file `source` (in `guest-samples/`) as a shared library,
/// [`shared_library_path`], unless an up-to-date build exists, and returns its path. A sample
/// that loads it (`dlopen_twice.c`) is given the path in its arguments.
///
/// # Errors
///
/// As [`build`].
pub fn build_shared_library(source: &str) -> Result<PathBuf, String> {
    let out = shared_library_path(source);
    compile(source, &out, shared_library_gcc_args(), Vec::new())
}

/// `gcc ARGS -o OUT guest-samples/SOURCE LIBS`, under the lock of `out`, unless `out` is up to
/// date.
fn compile(
    source: &str,
    out: &Path,
    mut args: Vec<String>,
    libs: Vec<String>,
) -> Result<PathBuf, String> {
    let src = paths::samples_dir().join(source);
    let out = out.to_path_buf();
    let cmd_file = beside(&out, ".cmd");
    args.push("-o".into());
    args.push(out.display().to_string());
    args.push(src.display().to_string());
    args.extend(libs);
    let command_line = format!("gcc {}", args.join(" "));

    fs::create_dir_all(build_dir())
        .map_err(|e| format!("creating {}: {e}", build_dir().display()))?;
    let lock_path = beside(&out, ".lock");
    let _lock = FileLock::acquire(&lock_path)
        .map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    let fresh = up_to_date(&out, &cmd_file, &command_line, &src)
        .map_err(|e| format!("checking {}: {e}", out.display()))?;
    if fresh {
        return Ok(out);
    }

    // Unique per process and thread: concurrent test processes may build the same file.
    let tmp = beside(
        &out,
        &format!(
            ".tmp-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ),
    );
    let mut tmp_args = args.clone();
    let o = tmp_args
        .iter()
        .position(|a| a == "-o")
        .expect("-o is in the args")
        + 1;
    tmp_args[o] = tmp.display().to_string();
    let result = Command::new("gcc")
        .args(&tmp_args)
        .output()
        .map_err(|e| format!("cannot run gcc: {e}"))?;
    if !result.status.success() {
        let _ = fs::remove_file(&tmp);
        return Err(format!(
            "{command_line}\nfailed with {}:\n{}{}",
            result.status,
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr)
        ));
    }
    fs::rename(&tmp, &out)
        .map_err(|e| format!("renaming {} to {}: {e}", tmp.display(), out.display()))?;
    fs::write(&cmd_file, &command_line)
        .map_err(|e| format!("writing {}: {e}", cmd_file.display()))?;
    Ok(out)
}

/// `objdump -d` of `exe`, restricted to the function `symbol` (AT&T syntax, no raw bytes).
///
/// # Errors
///
/// When objdump cannot run or the symbol is not found.
pub fn disassemble_function(exe: &Path, symbol: &str) -> Result<String, String> {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(exe)
        .output()
        .map_err(|e| format!("cannot run objdump: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "objdump failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let header = format!("<{symbol}>:");
    let mut lines = text.lines().skip_while(|l| !l.ends_with(&header));
    let first = lines
        .next()
        .ok_or_else(|| format!("no function {symbol} in {}", exe.display()))?;
    let mut body = String::from(first);
    for line in lines.take_while(|l| !l.trim().is_empty()) {
        body.push('\n');
        body.push_str(line);
    }
    Ok(body)
}
