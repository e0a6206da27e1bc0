//! Where hotpath's own messages go (the summary, its errors): the stderr hotpath started with,
//! kept when the guest closes or replaces its descriptor 2.
//!
//! The guest owns descriptor 2. GNU programs close it at exit (`close_stdout`: `ls`, `date`,
//! `sort`...), and a shell's `exec 2>log` makes it the guest's own file: writing the summary to
//! descriptor 2 at the end lost it in the first case and appended it to the guest's file in the
//! second. So before a guest call that closes or replaces descriptor 2 (`close`, `dup2`,
//! `dup3`, `close_range`), hotpath keeps a copy of it at descriptor [`KEPT_MIN`] or above,
//! close-on-exec, and passed to the hotpath that runs a program the guest execs
//! (`--messages-fd`, the flag cleared for the `execve` alone). That copy is the guest's to take: a call that closes or replaces it drops it
//! (hotpath then has nowhere to write, and writes nothing rather than into a descriptor the
//! guest may reuse). A program that never closes or replaces its stderr sees no copy.

use std::sync::atomic::{AtomicI32, Ordering};

/// The lowest descriptor the copy of stderr takes: above what programs number by hand
/// (shells use up to 255 for their own) and below the usual 1024 soft limit.
pub const KEPT_MIN: i32 = 900;

/// Descriptors (1024, the usual soft `RLIMIT_NOFILE`) the table holds once
/// [`grow_descriptor_table`] has grown it: room for [`KEPT_MIN`] and a shell's own descriptors.
const TABLE_FDS: u64 = 1024;

/// Descriptors a new process's table holds (`NR_OPEN_DEFAULT`, one bit per descriptor in a
/// word): below this nothing grows the table.
const INITIAL_TABLE_FDS: u64 = 64;

/// Grows this process's descriptor table to hold [`TABLE_FDS`] descriptors (fewer under a
/// lower soft `RLIMIT_NOFILE`), for a caller that has one thread and is about to start another
/// (the monitor thread, which shares the table). The kernel grows a table that several threads
/// share only after an RCU grace period (`expand_fdtable` calls `synchronize_rcu`: 6.8 ms
/// seen on a VM), where a one-thread program natively grows it at once: the copy of stderr at
/// [`KEPT_MIN`] when a GNU program closes its stderr at exit, a shell's descriptors at 255, a
/// program's 65th open file. Grown first, none of them waits. Nothing is left open; with
/// descriptors 0 to 2 all closed nothing is done.
pub fn grow_descriptor_table() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    let fds = lim.rlim_cur.min(TABLE_FDS);
    if fds <= INITIAL_TABLE_FDS {
        return;
    }
    for open in 0..3 {
        // SAFETY: fcntl on a descriptor number (a closed one gives EBADF); the copy, our own,
        // is closed at once.
        let copy = unsafe { libc::fcntl(open, libc::F_DUPFD_CLOEXEC, (fds - 1) as i32) };
        if copy >= 0 {
            // SAFETY: the descriptor just made, which nothing else knows.
            unsafe { libc::close(copy) };
            return;
        }
    }
}

/// Where messages go: 2 until the guest takes descriptor 2 away, then the copy, or -1.
static FD: AtomicI32 = AtomicI32::new(2);

/// The descriptor hotpath's messages go to, if there is one.
pub fn fd() -> Option<i32> {
    let fd = FD.load(Ordering::Acquire);
    (fd >= 0).then_some(fd)
}

/// Makes descriptor `fd` (open, set close-on-exec here) the one messages go to: the copy of
/// stderr a hotpath that exec'd this one kept (`hotpath run --messages-fd`). False if `fd` is
/// not open.
pub fn adopt(fd: i32) -> bool {
    // SAFETY: fcntl on a descriptor number; a closed one gives EBADF.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return false;
    }
    FD.store(fd, Ordering::Release);
    true
}

/// The descriptor to pass to a program the guest execs (see [`adopt`]), when messages go to a
/// kept copy of stderr rather than to descriptor 2; its close-on-exec flag is cleared for the
/// exec, and [`exec_failed`] sets it again.
pub fn for_exec() -> Option<i32> {
    let fd = fd().filter(|&fd| fd != 2)?;
    // SAFETY: fcntl on our own descriptor.
    (unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } == 0).then_some(fd)
}

/// The exec that [`for_exec`] prepared failed: the copy is close-on-exec again.
pub fn exec_failed(fd: i32) {
    // SAFETY: fcntl on our own descriptor.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// Writes `bytes` to [`fd`], all of them unless a write fails; errors (a reader gone, no
/// descriptor) are ignored: hotpath's messages must never end a run.
pub fn write_all(mut bytes: &[u8]) {
    let Some(fd) = fd() else { return };
    while !bytes.is_empty() {
        // SAFETY: a write of our own buffer to a descriptor; a bad descriptor is an error.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            return;
        }
    }
}

/// Before a guest system call that closes or replaces every descriptor in `[first, last]`:
/// keeps a copy of stderr if descriptor 2 is among them and still the one messages go to,
/// and drops the copy if it is among them.
pub fn before_losing(first: u64, last: u64) {
    let fd = FD.load(Ordering::Acquire);
    let hit = |d: i32| d >= 0 && first <= d as u64 && d as u64 <= last;
    if fd == 2 && hit(2) {
        // SAFETY: fcntl on a descriptor number; a closed one gives EBADF.
        let kept = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, KEPT_MIN) };
        let _ = FD.compare_exchange(2, kept.max(-1), Ordering::AcqRel, Ordering::Acquire);
    } else if fd > 2 && hit(fd) {
        let _ = FD.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// [`before_losing`] for guest system call `nr` with arguments `a`, if it is one that closes
/// or replaces descriptors: `close(fd)`, `dup2(old, new)`, `dup3(old, new, flags)`,
/// `close_range(first, last, flags)` (not with `CLOSE_RANGE_CLOEXEC`, which closes nothing
/// now).
pub fn before_call(nr: u64, a: &[u64; 6]) {
    const CLOSE_RANGE_CLOEXEC: u64 = 4;
    let fd = |v: u64| v as u32 as u64;
    match nr {
        n if n == libc::SYS_close as u64 => before_losing(fd(a[0]), fd(a[0])),
        n if n == libc::SYS_dup2 as u64 || n == libc::SYS_dup3 as u64 => {
            before_losing(fd(a[1]), fd(a[1]))
        }
        n if n == libc::SYS_close_range as u64 && a[2] & CLOSE_RANGE_CLOEXEC == 0 => {
            before_losing(fd(a[0]), fd(a[1]))
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_calls_that_take_a_descriptor_away_are_seen() {
        // Descriptor 2 is this test process's stderr: the copy is made once it is about to go
        // (here nothing closes it: the call is not made), then dropped when the copy goes.
        assert_eq!(fd(), Some(2));
        before_call(libc::SYS_dup as u64, &[2, 0, 0, 0, 0, 0]);
        before_call(libc::SYS_close as u64, &[5, 0, 0, 0, 0, 0]);
        before_call(
            libc::SYS_close_range as u64,
            &[0, u32::MAX as u64, 4, 0, 0, 0],
        );
        assert_eq!(fd(), Some(2));
        before_call(
            libc::SYS_close_range as u64,
            &[0, u32::MAX as u64, 0, 0, 0, 0],
        );
        let kept = fd().expect("a copy of stderr");
        assert!(kept >= KEPT_MIN);
        // SAFETY: F_GETFD on a descriptor number.
        let flags = unsafe { libc::fcntl(kept, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        before_call(libc::SYS_dup2 as u64, &[1, kept as u64, 0, 0, 0, 0]);
        assert_eq!(fd(), None);
        // SAFETY: closing the copy this test made.
        unsafe { libc::close(kept) };
    }

    /// The size of this process's descriptor table (`FDSize` in `/proc/self/status`).
    fn table_size() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        let line = status
            .lines()
            .find(|l| l.starts_with("FDSize:"))
            .expect("FDSize");
        line["FDSize:".len()..].trim().parse().expect("a number")
    }

    /// Descriptors open in this process (the directory's own included).
    fn open_descriptors() -> usize {
        std::fs::read_dir("/proc/self/fd").expect("fd dir").count()
    }

    /// In a fresh process (this test run again alone, whose table has not been grown to
    /// 1024 slots: 256 here): the table holds 1024 descriptors afterwards (fewer under a
    /// lower soft `RLIMIT_NOFILE`), and no descriptor is left open.
    #[test]
    fn the_descriptor_table_is_grown_and_nothing_is_left_open() {
        const NAME: &str =
            "host::messages::tests::the_descriptor_table_is_grown_and_nothing_is_left_open";
        if std::env::var_os("HOTPATH_TEST_FD_TABLE").is_some() {
            let (size, open) = (table_size(), open_descriptors());
            grow_descriptor_table();
            println!(
                "fd-table {size} {} {open} {}",
                table_size(),
                open_descriptors()
            );
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env("HOTPATH_TEST_FD_TABLE", "1")
            .output()
            .expect("the test binary runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find_map(|l| l.split_once("fd-table ").map(|(_, rest)| rest))
            .unwrap_or_else(|| panic!("no fd-table line in {text}"));
        let n: Vec<u64> = line
            .split(' ')
            .map(|w| w.parse().expect("a number"))
            .collect();
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct we own.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        let want = lim.rlim_cur.min(TABLE_FDS);
        if want > INITIAL_TABLE_FDS {
            assert!(n[1] >= want, "the table was not grown to {want}: {line}");
        }
        assert_eq!(n[2], n[3], "a descriptor was left open: {line}");
    }
}
