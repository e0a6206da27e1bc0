//! Reading and writing guest memory without trusting the guest's pointers: a bad address gives
//! EFAULT (as the kernel would give the guest), never a fault in hotpath.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};

/// This process's pid for `process_vm_readv`/`writev`, once asked (0: not yet). glibc's
/// `getpid` is a system call; a forked child forgets it ([`forget_pid`]).
static PID: AtomicI32 = AtomicI32::new(0);

fn pid() -> i32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            // SAFETY: getpid has no preconditions.
            let pid = unsafe { libc::getpid() };
            PID.store(pid, Ordering::Relaxed);
            pid
        }
        pid => pid,
    }
}

/// Forgets the cached pid: for a forked child, before it reads guest memory.
pub fn forget_pid() {
    PID.store(0, Ordering::Relaxed);
}

// `hotpath_probe_copy(dst, src, len) -> bytes copied`: a `rep movsb` that stops at the first
// byte it cannot read. A fault at `hotpath_probe_copy_fault` (the `rep movsb`, whose registers
// say how far it got) is sent to `hotpath_probe_copy_fixup` by the host signal handler
// (`linux::signals`), which returns the bytes copied.
std::arch::global_asm!(
    ".pushsection .text.hotpath_probe_copy,\"ax\",@progbits",
    ".globl hotpath_probe_copy",
    ".type hotpath_probe_copy,@function",
    "hotpath_probe_copy:",
    "    mov rcx, rdx",
    ".globl hotpath_probe_copy_fault",
    "hotpath_probe_copy_fault:",
    "    rep movsb",
    ".globl hotpath_probe_copy_fixup",
    "hotpath_probe_copy_fixup:",
    "    mov rax, rdx",
    "    sub rax, rcx",
    "    ret",
    ".size hotpath_probe_copy, . - hotpath_probe_copy",
    ".popsection",
);

extern "C" {
    fn hotpath_probe_copy(dst: *mut u8, src: *const u8, len: usize) -> usize;
    static hotpath_probe_copy_fault: u8;
    static hotpath_probe_copy_fixup: u8;
}

/// `(the probe's faulting instruction, where a fault there resumes)`, host addresses for the
/// host signal handler.
pub fn probe_fixup() -> (u64, u64) {
    (
        &raw const hotpath_probe_copy_fault as u64,
        &raw const hotpath_probe_copy_fixup as u64,
    )
}

/// Reads `buf.len()` bytes at guest address `addr`, which the caller knows to be mapped
/// readable, with a plain copy (no system call). Returns false if a byte turned out unreadable
/// (another thread unmapped it since): the caller reads it with [`read_partial`].
///
/// Only on a thread whose SIGSEGV and SIGBUS are not blocked and whose faults reach hotpath's
/// handler (a guest thread in the dispatcher): else a fault in the copy ends the process.
pub fn read_mapped(addr: u64, buf: &mut [u8]) -> bool {
    // SAFETY: the copy writes at most `buf.len()` bytes into `buf`; a fault reading the guest
    // range stops it (the handler resumes at the fixup), so it never reads what is unmapped.
    let n = unsafe { hotpath_probe_copy(buf.as_mut_ptr(), addr as *const u8, buf.len()) };
    n == buf.len()
}

/// Reads as many bytes as possible from guest address `addr` into `buf`, stopping at the first
/// unreadable page. Returns the number of bytes read.
pub fn read_partial(addr: u64, buf: &mut [u8]) -> usize {
    let mut done = 0usize;
    while done < buf.len() {
        let local = libc::iovec {
            iov_base: buf[done..].as_mut_ptr() as *mut c_void,
            iov_len: buf.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (addr + done as u64) as *mut c_void,
            iov_len: buf.len() - done,
        };
        // SAFETY: the local iovec is our buffer; the remote one is only read by the kernel,
        // which checks it.
        let n = unsafe { libc::process_vm_readv(pid(), &local, 1, &remote, 1, 0) };
        if n <= 0 {
            break;
        }
        done += n as usize;
    }
    done
}

/// Reads guest code at `addr` whose pages the caller knows to be executable but that may not
/// be readable (`PROT_EXEC` alone): `process_vm_readv` honours the mapping's missing
/// `PROT_READ` where the CPU still fetches (and, without protection keys, reads) the bytes,
/// so what it leaves is read through `/proc/self/mem`, which reads as a debugger does.
/// Returns the number of bytes read, up to the first byte neither can read.
pub fn read_code(addr: u64, buf: &mut [u8]) -> usize {
    use std::os::unix::fs::FileExt;
    let n = read_partial(addr, buf);
    if n == buf.len() {
        return n;
    }
    // Opened each time: rare (execute-only code), and a forked child needs its own.
    let Ok(mem) = std::fs::File::open("/proc/self/mem") else {
        return n;
    };
    let mut done = n;
    while done < buf.len() {
        match mem.read_at(&mut buf[done..], addr + done as u64) {
            Ok(0) | Err(_) => break,
            Ok(k) => done += k,
        }
    }
    done
}

/// Reads exactly `buf.len()` bytes from guest address `addr`.
///
/// # Errors
/// `EFAULT` (as a negative errno) if any byte is unreadable.
pub fn read(addr: u64, buf: &mut [u8]) -> Result<(), i64> {
    if read_partial(addr, buf) == buf.len() {
        Ok(())
    } else {
        Err(-(libc::EFAULT as i64))
    }
}

/// Writes `data` to guest address `addr`.
///
/// # Errors
/// `EFAULT` (as a negative errno) if any byte is not writable.
pub fn write(addr: u64, data: &[u8]) -> Result<(), i64> {
    if data.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut c_void,
        iov_len: data.len(),
    };
    // SAFETY: the kernel checks the remote range; the local one is our slice.
    let n = unsafe { libc::process_vm_writev(pid(), &local, 1, &remote, 1, 0) };
    if n == data.len() as isize {
        Ok(())
    } else {
        Err(-(libc::EFAULT as i64))
    }
}

/// Reads a NUL-terminated string of at most `max` bytes from guest address `addr`.
///
/// # Errors
/// `EFAULT` if unreadable, `ENAMETOOLONG` if no NUL within `max` bytes.
pub fn read_cstr(addr: u64, max: usize) -> Result<Vec<u8>, i64> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 256];
    while out.len() < max {
        // Never read across a page boundary in one go: the next page may be unmapped.
        let here = addr + out.len() as u64;
        let to_page_end = (4096 - (here % 4096)) as usize;
        let want = chunk.len().min(to_page_end);
        let got = read_partial(here, &mut chunk[..want]);
        if got == 0 {
            return Err(-(libc::EFAULT as i64));
        }
        if let Some(nul) = chunk[..got].iter().position(|&b| b == 0) {
            out.extend_from_slice(&chunk[..nul]);
            return Ok(out);
        }
        out.extend_from_slice(&chunk[..got]);
    }
    Err(-(libc::ENAMETOOLONG as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn on_fault(sig: i32, _: *mut libc::siginfo_t, ctx: *mut c_void) {
        if !crate::linux::signals::fix_probe_fault(sig, ctx) {
            // SAFETY: restoring the default action and returning re-raises the fault.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }

    #[test]
    fn read_mapped_stops_at_an_unreadable_page() {
        // SAFETY: a handler for this test binary's faults (no other test faults), then a
        // two-page mapping of ours whose second page is made inaccessible.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_fault as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            assert_ne!(p as *mut c_void, libc::MAP_FAILED);
            std::ptr::write_bytes(p, 0xab, 4096);
            libc::mprotect(p.add(4096) as *mut c_void, 4096, libc::PROT_NONE);
            let mut buf = [0u8; 100];
            let at = p as u64 + 4096 - 40;
            assert!(!read_mapped(at, &mut buf));
            assert!(read_mapped(at, &mut buf[..40]));
            assert!(buf[..40].iter().all(|&b| b == 0xab));
            assert_eq!(read_partial(at, &mut buf), 40);
        }
    }
}
