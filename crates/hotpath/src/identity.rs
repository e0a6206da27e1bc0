//! The process's identity as the kernel shows it, made the guest's: its name
//! (`/proc/self/comm`, `prctl(PR_GET_NAME)`, `ps`), its command line and environment
//! (`/proc/<pid>/cmdline`, `environ`) and its auxiliary vector (`/proc/self/auxv`,
//! `prctl(PR_GET_AUXV)`).
//!
//! The kernel reads the command line, environment and auxv from addresses it keeps in the
//! process's `mm`; `prctl(PR_SET_MM, PR_SET_MM_MAP)` points them at the guest's initial stack
//! (built by `hotpath_loader::build_stack`), keeping every other field as it is. That is the
//! checkpoint/restore interface and needs no capability (unlike `PR_SET_MM_ARG_START`, which
//! needs CAP_SYS_RESOURCE), only a kernel built with CONFIG_CHECKPOINT_RESTORE; where it fails,
//! hotpath goes on and the guest sees hotpath's own (the README's limits say so).

use std::path::Path;

use hotpath_loader::GuestStack;

/// Longest process name the kernel keeps, in bytes (`TASK_COMM_LEN` less the NUL).
const COMM_LEN: usize = 15;

/// `prctl` options and the `PR_SET_MM` sub-option used here (linux/prctl.h).
const PR_SET_MM: libc::c_int = 35;
const PR_SET_MM_MAP: libc::c_ulong = 14;

/// `struct prctl_mm_map` (linux/prctl.h): addresses are host = guest addresses (one process).
#[repr(C)]
struct PrctlMmMap {
    start_code: u64,
    end_code: u64,
    start_data: u64,
    end_data: u64,
    start_brk: u64,
    brk: u64,
    start_stack: u64,
    arg_start: u64,
    arg_end: u64,
    env_start: u64,
    env_end: u64,
    auxv: *const u64,
    auxv_size: u32,
    /// `u32::MAX`: leave `/proc/self/exe` alone.
    exe_fd: u32,
}

/// The name the kernel gives a process that execs `file`: the first [`COMM_LEN`] bytes of
/// its last path component.
pub fn comm_of(file: &Path) -> Vec<u8> {
    let name = file
        .file_name()
        .map_or(file.as_os_str(), |n| n)
        .as_encoded_bytes();
    name[..name.len().min(COMM_LEN)].to_vec()
}

/// Names the calling thread (the guest's first) after `file`, as exec would. Threads
/// created later inherit it from the thread that makes them; the monitor keeps its own.
pub fn set_name(file: &Path) {
    let mut name = comm_of(file);
    name.push(0);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
}

/// Points the kernel's command line, environment and auxv at the guest's (`stack`).
///
/// # Errors
/// The OS error of `PR_SET_MM_MAP` (EPERM or EINVAL without CONFIG_CHECKPOINT_RESTORE), or
/// of reading `/proc/self/stat`.
pub fn show_guest_args(stack: &GuestStack) -> std::io::Result<()> {
    let stat = hotpath_translator::host::procfs::read_to_string("/proc/self/stat")?;
    // Fields after the command name's closing parenthesis start at field 3.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let field = |n: usize| fields.get(n - 3).copied().unwrap_or(0);
    // SAFETY: brk(0) only reports the current break.
    let brk = unsafe { libc::syscall(libc::SYS_brk, 0) } as u64;
    let auxv_len = stack.auxv.1 - stack.auxv.0;
    let map = PrctlMmMap {
        start_code: field(26),
        end_code: field(27),
        start_data: field(45),
        end_data: field(46),
        start_brk: field(47),
        brk,
        start_stack: field(28),
        arg_start: stack.args.0,
        arg_end: stack.args.1,
        env_start: stack.env.0,
        env_end: stack.env.1,
        auxv: stack.auxv.0 as *const u64,
        auxv_size: auxv_len as u32,
        exe_fd: u32::MAX,
    };
    // SAFETY: the kernel reads `map` (its size is passed) and `auxv_size` bytes at `auxv`,
    // the guest's auxv on its stack, mapped and written by build_stack.
    let r = unsafe {
        libc::prctl(
            PR_SET_MM,
            PR_SET_MM_MAP,
            &map as *const PrctlMmMap,
            std::mem::size_of::<PrctlMmMap>(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::comm_of;
    use std::path::Path;

    #[test]
    fn comm_is_the_file_names_first_15_bytes() {
        assert_eq!(
            comm_of(Path::new("/a/b/hostile_proc.static")),
            b"hostile_proc.st"
        );
        assert_eq!(comm_of(Path::new("./hp")), b"hp");
        assert_eq!(comm_of(Path::new("ls")), b"ls");
    }
}
