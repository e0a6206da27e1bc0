//! Guest memory a system call changes without a store hotpath's write fault sees: the
//! kernel writing into buffers of pages hotpath write-protected, writes through
//! `/proc/self/mem` and `process_vm_writev` to the process itself, and `madvise` calls that
//! take pages' contents away. Each is made to find memory as the guest left it, and the
//! translations of what it changes are discarded before the guest runs on.
//!
//! # What is done, per call
//!
//! - **Buffers the kernel fills** (`read`, `pread64`, `readv`, `preadv`, `preadv2`,
//!   `recvfrom`, `recvmsg`, the local side of `process_vm_readv`, the remote side of
//!   `process_vm_writev` to this process): before the call, the pages hotpath write-protected
//!   in them get the guest's protection back and their translations are discarded. The
//!   kernel would otherwise fail the copy with EFAULT where natively it succeeds, or stop a
//!   vectored call short at the protected page (a `readv` of two pipe buffers returns the
//!   first only). Only looked at while some page is protected (a program that never runs
//!   writable memory pays nothing).
//! - **`/proc/self/mem`** (also `/proc/<pid>/mem`, `/proc/thread-self/mem` and
//!   `/proc/<pid>/task/<tid>/mem` of any thread of the process): the kernel writes with
//!   `FOLL_FORCE`, through any protection, so a write to the program's own read-only text
//!   succeeds and no fault is seen. The file descriptors open on such a file are tracked
//!   (`open`, `openat`, `openat2`: the descriptor's link in `/proc/self/fd` is read after each
//!   successful open, one `readlink` of about a microsecond; `dup`, `dup2`, `dup3`,
//!   `fcntl(F_DUPFD*)` copy the mark, `close` and `close_range` drop it, a forked child forgets
//!   every mark: its descriptors show the parent's memory). A `write`, `writev`, `pwrite64`,
//!   `pwritev` or `pwritev2` on one discards the translations of the range it writes (file
//!   offset = guest address; `write`/`writev` and `pwritev2` at offset -1 ask `lseek` for the
//!   current one), after giving protected pages there the guest's protection back.
//! - **`madvise`** with `MADV_DONTNEED`, `MADV_DONTNEED_LOCKED`, `MADV_FREE` or `MADV_REMOVE`:
//!   the range reads as zeros (anonymous memory) or as the file again (a private file
//!   mapping) afterwards, so its translations are discarded, and protected pages there get
//!   the guest's protection back first (a store after it must not fault). Only where the
//!   thread's cached `/proc/self/maps` shows executable memory (or is not current): malloc
//!   gives memory back with `MADV_DONTNEED`/`MADV_FREE` often, and a discard sends every
//!   other thread out of the code cache.
//!
//! # The fallback, and why it is a fallback
//!
//! Any other call that fails with EFAULT while pages are protected is made again after every
//! protected page got its protection back (in the dispatcher). That is right for the calls
//! that fail before they change anything (most `stat`s, `getdents64`, `getrandom`), but a
//! call that consumed input before its copy failed loses that input: a `recv` of a datagram
//! drops the datagram on EFAULT, and the second call then finds none. That is why the calls
//! that fill buffers are handled before they are made, above, and not by the retry.
//!
//! # Limits
//!
//! Not seen: descriptors on `/proc/self/mem` received through `SCM_RIGHTS` or `pidfd_getfd`,
//! or opened before an `execve` into the new image (hotpath starts with no marks); code
//! changed by another process (its `/proc/<pid>/mem`, `process_vm_writev`, a debugger's
//! `ptrace(POKETEXT)`); pages shared with another mapping (a `memfd` or `MAP_SHARED` file
//! mapped twice, writable and executable: stores through the writable view do not fault, and
//! `write(2)` to the file changes the executable one); `shmat`/`shmdt` over translated code;
//! `MADV_WIPEONFORK` (a forked child keeps its parent's translations of the wiped pages);
//! `io_uring` reads into code pages.

use std::collections::BTreeSet;

use crate::host::guest_mem;
use crate::host::syscall::raw_syscall;
use crate::linux::process::lock;
use crate::linux::thread::GuestThread;

/// Most `iovec`s read from a vectored call's array (the kernel's `UIO_MAXIOV`: more is EINVAL).
const MAX_IOVECS: u64 = 1024;

/// Page size, bytes.
const PAGE: u64 = 4096;

/// The guest ranges `[start, end)` (bytes) the system call `nr` with `args` may write into
/// as a copy to a user buffer, for the calls listed in the module doc; empty for others.
fn filled_buffers(nr: u64, a: &[u64; 6]) -> Vec<(u64, u64)> {
    let span = |addr: u64, len: u64| vec![(addr, addr.saturating_add(len))];
    match nr {
        // read, pread64, recvfrom: (fd, buf, len, ...)
        0 | 17 | 45 => span(a[1], a[2]),
        // readv, preadv, preadv2: (fd, iov, iovcnt, ...)
        19 | 295 | 327 => iovecs(a[1], a[2]),
        // recvmsg(fd, msghdr, flags): msg_iov at offset 16, msg_iovlen at 24.
        47 => {
            let mut hdr = [0u8; 32];
            if guest_mem::read(a[1], &mut hdr).is_err() {
                return Vec::new();
            }
            let word = |i: usize| u64::from_le_bytes(hdr[i..i + 8].try_into().unwrap());
            iovecs(word(16), word(24))
        }
        // process_vm_readv(pid, local_iov, liovcnt, ...): the local side is written.
        310 => iovecs(a[1], a[2]),
        // process_vm_writev(pid, .., remote_iov, riovcnt, ..) to this process.
        311 if is_own_task(a[0] as i32) => iovecs(a[3], a[4]),
        _ => Vec::new(),
    }
}

/// The `(base, base + len)` of the `count` guest `iovec`s at guest address `at` (as many as
/// can be read; at most [`MAX_IOVECS`]).
fn iovecs(at: u64, count: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for i in 0..count.min(MAX_IOVECS) {
        let mut v = [0u8; 16];
        if guest_mem::read(at + 16 * i, &mut v).is_err() {
            break;
        }
        let base = u64::from_le_bytes(v[..8].try_into().unwrap());
        let len = u64::from_le_bytes(v[8..].try_into().unwrap());
        if len > 0 {
            out.push((base, base.saturating_add(len)));
        }
    }
    out
}

/// True if `id` (a pid or tid) is a thread of this process: its memory is this memory.
fn is_own_task(id: i32) -> bool {
    id > 0 && std::path::Path::new(&format!("/proc/self/task/{id}")).exists()
}

/// True if `link` (a descriptor's target in `/proc/self/fd`) is this process's memory file:
/// `/proc/ID/mem` or `/proc/ID/task/TID/mem` with a thread of this process.
fn is_own_mem_file(link: &str) -> bool {
    let Some(rest) = link.strip_prefix("/proc/") else {
        return false;
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let id = match parts.as_slice() {
        [id, "mem"] | [_, "task", id, "mem"] => id,
        _ => return false,
    };
    id.parse().is_ok_and(is_own_task)
}

/// The guest range a write-family call `nr` on a memory-file descriptor writes: the file
/// offset is the guest address; the length is the byte count asked for.
fn mem_write_range(nr: u64, a: &[u64; 6]) -> Option<(u64, u64)> {
    let fd = a[0];
    let current = || {
        let r = raw_syscall(8, &[fd, 0, libc::SEEK_CUR as u64, 0, 0, 0]);
        (r >= 0).then_some(r as u64)
    };
    let total = |iov, cnt| iovecs(iov, cnt).iter().map(|(s, e)| e - s).sum::<u64>();
    let (at, len) = match nr {
        // write(fd, buf, len)
        1 => (current()?, a[2]),
        // pwrite64(fd, buf, len, offset)
        18 => (a[3], a[2]),
        // writev(fd, iov, cnt)
        20 => (current()?, total(a[1], a[2])),
        // pwritev(fd, iov, cnt, offset)
        296 => (a[3], total(a[1], a[2])),
        // pwritev2(fd, iov, cnt, offset, 0, flags): offset -1 is the current position.
        328 if a[3] == u64::MAX => (current()?, total(a[1], a[2])),
        328 => (a[3], total(a[1], a[2])),
        _ => return None,
    };
    Some((at, at.saturating_add(len)))
}

/// Before the guest's system call `nr` with `args`: makes the memory it will change look as
/// the guest left it (protected pages there get their protection back) and queues the
/// translations of that memory for discarding (in `thread.invalidate`, applied when the call
/// returns).
pub fn before_call(thread: &mut GuestThread, nr: u64, a: &[u64; 6]) {
    let mut changed: Vec<(u64, u64)> = Vec::new();
    match nr {
        1 | 18 | 20 | 296 | 328 if lock(&thread.shared.mem_fds).contains(&(a[0] as i32)) => {
            // Through FOLL_FORCE: the whole range, read-only text included.
            changed.extend(mem_write_range(nr, a));
        }
        // madvise(addr, len, advice)
        28 if matches!(
            a[2] as i32,
            libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE | MADV_DONTNEED_LOCKED
        ) =>
        {
            let range = (
                a[0],
                a[0].saturating_add(a[1]).saturating_add(PAGE - 1) & !(PAGE - 1),
            );
            // Allocators give memory back this way all the time: only a range that may hold
            // code is discarded (which sends every other thread out of the code cache).
            if thread.maps.may_hold_code(range.0, range.1) {
                changed.push(range);
            }
        }
        _ => {}
    }
    let pages = thread.signals.protected_pages();
    if pages.any() {
        for (s, e) in filled_buffers(nr, a)
            .into_iter()
            .chain(changed.iter().copied())
        {
            thread.invalidate.extend(pages.unprotect_range(s, e));
        }
    }
    thread.invalidate.extend(changed);
}

/// `MADV_DONTNEED_LOCKED` (Linux 5.18), not in every libc crate.
const MADV_DONTNEED_LOCKED: i32 = 24;

/// After the guest's system call `nr` with `args` returned `ret`: keeps the marks of
/// descriptors open on the process's memory file current.
pub fn after_call(thread: &mut GuestThread, nr: u64, a: &[u64; 6], ret: i64) {
    if !matches!(nr, 2 | 3 | 32 | 33 | 72 | 257 | 292 | 436 | 437)
        || !(0..=i32::MAX as i64).contains(&ret)
    {
        return;
    }
    let fd = ret as i32;
    let mut mem = lock(&thread.shared.mem_fds);
    match nr {
        // open, openat, openat2: what was opened, whatever the path said (a symlink, a
        // directory descriptor on /proc/self).
        2 | 257 | 437 => {
            let link = std::fs::read_link(format!("/proc/self/fd/{fd}"));
            if link.is_ok_and(|l| l.to_str().is_some_and(is_own_mem_file)) {
                mem.insert(fd);
            } else {
                mem.remove(&fd);
            }
        }
        // dup(old), dup2(old, new), dup3(old, new, flags), fcntl(old, F_DUPFD*, min)
        32 | 33 | 292 => copy_mark(&mut mem, a[0] as i32, fd),
        72 if matches!(a[1] as i32, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) => {
            copy_mark(&mut mem, a[0] as i32, fd)
        }
        // close(fd)
        3 => {
            mem.remove(&(a[0] as i32));
        }
        // close_range(first, last, flags): CLOSE_RANGE_CLOEXEC (4) closes nothing now.
        436 if a[2] & 4 == 0 => {
            let (first, last) = (a[0] as u32, a[1] as u32);
            mem.retain(|&f| !(first as i64..=last as i64).contains(&(f as i64)));
        }
        _ => {}
    }
}

/// `new` now refers to what `old` refers to.
fn copy_mark(mem: &mut BTreeSet<i32>, old: i32, new: i32) {
    if mem.contains(&old) {
        mem.insert(new);
    } else {
        mem.remove(&new);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_memory_files_are_recognised() {
        let me = std::process::id();
        assert!(is_own_mem_file(&format!("/proc/{me}/mem")));
        assert!(is_own_mem_file(&format!("/proc/{me}/task/{me}/mem")));
        assert!(!is_own_mem_file(&format!("/proc/{me}/maps")));
        assert!(!is_own_mem_file("/proc/1/mem") || me == 1);
        assert!(!is_own_mem_file("/tmp/mem"));
    }

    #[test]
    fn buffers_of_vectored_reads_are_their_iovecs() {
        let data = [0u8; 64];
        let iov: [u64; 4] = [data.as_ptr() as u64, 16, data.as_ptr() as u64 + 32, 8];
        let a = [0, iov.as_ptr() as u64, 2, 0, 0, 0];
        let base = data.as_ptr() as u64;
        assert_eq!(
            filled_buffers(19, &a),
            vec![(base, base + 16), (base + 32, base + 40)]
        );
        assert_eq!(
            filled_buffers(0, &[0, 0x1000, 10, 0, 0, 0]),
            vec![(0x1000, 0x100a)]
        );
        assert!(filled_buffers(1, &a).is_empty());
    }
}
