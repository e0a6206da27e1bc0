//! `execve` under translation: the new program runs under hotpath too, with the same options
//! (as `valgrind --trace-children=yes` does), by executing hotpath itself with the guest's
//! path, argv and environment.
//!
//! The kernel's own failures must still reach the guest as errors (a missing file, no execute
//! permission, a file that is neither ELF nor `#!`), so the file is checked first the way the
//! kernel checks it; when it would fail, or hotpath cannot follow it (`execveat` relative to a
//! directory descriptor), the guest's call is made as it is and the kernel answers.

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use crate::host::guest_mem;
use crate::host::syscall::gated_syscall;
use crate::linux::thread::GuestThread;

/// How to run a new program under hotpath: `hotpath` with `args` before the program.
#[derive(Clone, Debug)]
pub struct ExecWrapper {
    /// hotpath's own executable.
    pub hotpath: PathBuf,
    /// The arguments that come between hotpath's name and the program: `run`, the options
    /// (each output file already renamed for the new image), ending with `--argv0`; the
    /// guest's `argv[0]`, `--`, its path and its other arguments are appended.
    pub args: Vec<OsString>,
}

/// Most bytes of argv and envp strings read from the guest (the kernel's limit is a quarter of
/// the stack rlimit; this is what 8 MiB gives).
const MAX_ARG_BYTES: usize = 2 << 20;

/// Most pointers in argv or envp read from the guest.
const MAX_ARG_COUNT: usize = 1 << 17;

/// Performs the guest's `execve` (`nr` 59) or `execveat` (322) with `args`, under hotpath when
/// `wrapper` is given, the guest has installed no seccomp filter, and the file is one the
/// kernel would run, else as the guest asked (with
/// `/proc/self/exe` meaning the guest's program), through the syscall gate. Returns only on
/// failure, with the negative errno, or with `GATE_REFUSED` when a signal is waiting (the
/// call was not made: the signal comes first).
pub fn exec(p: &GuestThread, wrapper: Option<&ExecWrapper>, nr: u64, args: &[u64; 6]) -> i64 {
    // Under the guest's own seccomp filter a new hotpath could not run: the program runs
    // untranslated (`seccomp::guest_filter_installed`).
    let wrapper = wrapper.filter(|_| !crate::linux::seccomp::guest_filter_installed());
    if let Some(w) = wrapper {
        if let Some(ret) = exec_translated(p, w, nr, args) {
            return ret;
        }
    }
    let mut a = *args;
    let path_arg = if nr == 59 { 0 } else { 1 };
    let exe = exe_path_arg(p, a[path_arg]);
    if let Some(exe) = &exe {
        a[path_arg] = exe.as_ptr() as u64;
    }
    gated_syscall(nr, &a)
}

/// Executes hotpath on the guest's program, or returns `None` when the guest's own call
/// should be made instead (hotpath cannot follow it, or the kernel will refuse it).
fn exec_translated(p: &GuestThread, w: &ExecWrapper, nr: u64, args: &[u64; 6]) -> Option<i64> {
    let (path, argv, envp) = exec_args(nr, args)?;
    let name = guest_mem::read_cstr(path, 4096).ok()?;
    let file = if is_proc_self_exe(&name) {
        p.exe.clone()
    } else {
        PathBuf::from(OsString::from_vec(name))
    };
    if !kernel_would_run(&file) {
        return None;
    }
    // execve does not search PATH: a name without a slash is in the current directory.
    let file = if file.as_os_str().as_bytes().contains(&b'/') {
        file
    } else {
        PathBuf::from(".").join(file)
    };
    let argv = read_string_array(argv).ok()?;
    let envp = read_string_array(envp).ok()?;
    let mut new_argv: Vec<CString> = Vec::with_capacity(argv.len() + w.args.len() + 6);
    new_argv.push(CString::new(w.hotpath.as_os_str().as_bytes()).ok()?);
    for a in &w.args {
        new_argv.push(CString::new(a.as_bytes()).ok()?);
    }
    // hotpath's messages go on to the stderr it kept (`host::messages`), not to the program's.
    let messages = crate::host::messages::fd().filter(|&fd| fd != 2);
    if let Some(fd) = messages {
        // After `run` (w.args[0]): an option of it.
        new_argv.insert(2, CString::new("--messages-fd").ok()?);
        new_argv.insert(3, CString::new(fd.to_string()).ok()?);
    }
    // An empty argv is allowed: the program then sees argc 0 natively; hotpath gives it its
    // path as argv[0], as the kernel does since Linux 5.18.
    new_argv.push(
        argv.first()
            .cloned()
            .unwrap_or_else(|| CString::new(file.as_os_str().as_bytes()).unwrap_or_default()),
    );
    new_argv.push(CString::new("--").ok()?);
    new_argv.push(CString::new(file.as_os_str().as_bytes()).ok()?);
    new_argv.extend(argv.into_iter().skip(1));
    let envp_ptrs = null_terminated(&envp);
    let hotpath = CString::new(w.hotpath.as_os_str().as_bytes()).ok()?;
    // The copy is passed open (its close-on-exec flag cleared for this call alone); if that
    // cannot be done, the new hotpath writes to the program's stderr, as without a copy.
    let passed = messages.and_then(|_| crate::host::messages::for_exec());
    if messages.is_some() && passed.is_none() {
        new_argv.drain(2..4);
    }
    let argv_ptrs = null_terminated(&new_argv);
    let ret = gated_syscall(
        59,
        &[
            hotpath.as_ptr() as u64,
            argv_ptrs.as_ptr() as u64,
            envp_ptrs.as_ptr() as u64,
            0,
            0,
            0,
        ],
    );
    if let Some(fd) = passed {
        crate::host::messages::exec_failed(fd);
    }
    Some(ret)
}

/// True if the kernel will surely refuse the guest's `execve` (`nr` 59) or `execveat` (322)
/// with `args`: its file does not exist, is not executable by this user, or is not a regular
/// file (a directory, a FIFO...). Files the kernel might still run through a `binfmt_misc`
/// handler, and `execveat` relative to a directory descriptor, are not judged here.
pub fn certainly_refused(nr: u64, args: &[u64; 6]) -> bool {
    let Some((path, _, _)) = exec_args(nr, args) else {
        return false;
    };
    let Ok(name) = guest_mem::read_cstr(path, 4096) else {
        // The kernel will answer EFAULT.
        return true;
    };
    !is_proc_self_exe(&name) && !executable_file(std::path::Path::new(OsStr::from_bytes(&name)))
}

/// The path, argv and envp of an `execve` (`nr` 59), or of an `execveat` (322) that does only
/// what `execve` could (relative to the current directory, no flags); `None` for any other.
fn exec_args(nr: u64, args: &[u64; 6]) -> Option<(u64, u64, u64)> {
    const AT_FDCWD: i64 = -100;
    match nr {
        59 => Some((args[0], args[1], args[2])),
        // execveat(dirfd, path, argv, envp, flags)
        _ if args[0] as i64 == AT_FDCWD && args[4] == 0 => Some((args[1], args[2], args[3])),
        _ => None,
    }
}

/// True if `file` is a regular file (symbolic links followed) this user may execute.
fn executable_file(file: &std::path::Path) -> bool {
    let Ok(c) = CString::new(file.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `access` reads a NUL-terminated path we own.
    let executable = unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0;
    executable && std::fs::metadata(file).is_ok_and(|m| m.is_file())
}

/// True if `execve(file)` would start a program: a regular file this user may execute that
/// starts with the ELF magic or `#!` (what the kernel's binfmt handlers accept; for `#!`, the
/// program its interpreter lines lead to), and for an ELF file, one whose headers and
/// interpreter pass the kernel's checks
/// (`hotpath_loader::kernel_refusal`: else the guest's call gets the kernel's errno, such as
/// ENOEXEC for a bad `e_phentsize`, not a hotpath that starts and exits with status 126).
fn kernel_would_run(file: &std::path::Path) -> bool {
    use std::io::Read;
    if !executable_file(file) {
        return false;
    }
    let Ok(mut f) = std::fs::File::open(file) else {
        return false;
    };
    let mut magic = [0u8; 4];
    if f.read_exact(&mut magic).is_err() {
        return false;
    }
    if &magic == b"\x7fELF" {
        return hotpath_loader::kernel_refusal(file).is_none();
    }
    if !magic.starts_with(b"#!") {
        return false;
    }
    // The kernel runs the program the `#!` lines lead to: a refusal of it (a missing or
    // malformed interpreter, too many levels) is the script's execve's error.
    match hotpath_loader::resolve_script(file, &[file.as_os_str().to_owned()]) {
        Ok((program, _)) => program != file && kernel_would_run(&program),
        Err(_) => false,
    }
}

/// Reads a guest NULL-terminated array of C strings (argv or envp); a null array is empty.
fn read_string_array(addr: u64) -> Result<Vec<CString>, i64> {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    if addr == 0 {
        return Ok(out);
    }
    for i in 0..MAX_ARG_COUNT as u64 {
        let mut ptr = [0u8; 8];
        guest_mem::read(addr + 8 * i, &mut ptr)?;
        let ptr = u64::from_le_bytes(ptr);
        if ptr == 0 {
            return Ok(out);
        }
        let s = guest_mem::read_cstr(ptr, MAX_ARG_BYTES - bytes)?;
        bytes += s.len() + 1;
        out.push(CString::new(s).map_err(|_| -(libc::EINVAL as i64))?);
    }
    Err(-(libc::E2BIG as i64))
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// The guest's path when `path` names `/proc/self/exe`, for calls that take a path.
pub(crate) fn exe_path_arg(p: &GuestThread, path: u64) -> Option<std::ffi::CString> {
    let name = guest_mem::read_cstr(path, 4096).ok()?;
    if is_proc_self_exe(&name) {
        std::ffi::CString::new(p.exe.as_os_str().as_encoded_bytes()).ok()
    } else {
        None
    }
}

/// True if `path` names the calling process's executable through /proc.
pub(crate) fn is_proc_self_exe(path: &[u8]) -> bool {
    let own = format!("/proc/{}/exe", std::process::id());
    path == b"/proc/self/exe" || path == b"/proc/thread-self/exe" || path == own.as_bytes()
}
