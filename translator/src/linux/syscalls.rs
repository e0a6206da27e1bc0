//! The guest's system calls: a table of the ones hotpath emulates; every other call passes
//! through to the kernel unchanged.
//!
//! Emulated because hotpath shares the process with the guest: `brk` (the guest has its own heap
//! region), `arch_prctl` (the FS base is swapped on every cache transition; GS is hotpath's),
//! `exit`/`exit_group` (the profile must be written first), `readlink`/`open`/`execve` of
//! `/proc/self/exe` (the guest's path, not hotpath's), `mmap`/`munmap`/`mprotect`/`mremap`
//! (never over hotpath's own memory; translated code in the range is invalidated),
//! `rt_sigaction`/`rt_sigreturn`/`sigaltstack` (see `signals`), `fork`/`vfork`/`clone` (the
//! child process goes on under translation; a thread gets a host thread and translator of its
//! own), `exit` (one thread) and `exit_group`, `execve` (the profile is written first),
//! `set_tid_address` and `rseq` (they would change the host thread's state), `seccomp` and
//! `prctl(PR_SET_SECCOMP)` (see `seccomp`).
//!
//! Some passed-through calls are also looked at around the call by `kernel_writes` (memory
//! the kernel changes without a store the write fault sees): the calls that fill buffers,
//! writes to `/proc/self/mem`, `madvise`, and `open`/`dup`/`close` to know which descriptors
//! are open on `/proc/self/mem`.

use std::collections::BTreeMap;

use crate::host::guest_mem;
use crate::host::syscall::{gated_syscall, guest_syscall, raw_syscall};
use crate::host::thread_area::ThreadArea;
use crate::linux::exec::{exe_path_arg, is_proc_self_exe};
use crate::linux::process::{lock, CloneArgs, Memory};
use crate::linux::seccomp;
use crate::linux::thread::GuestThread;

/// How the guest ended, as the waiting parent would see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestExit {
    /// `exit_group(code)`: exit status `code & 0xff`.
    Exited(i32),
    /// Killed by signal number `sig` (the default action of a trap or fault).
    Signaled(i32),
}

/// What a system call did.
#[derive(Debug)]
pub enum Outcome {
    /// Return this value (a result or a negative errno) in RAX and continue.
    Return(i64),
    /// Continue at this guest address with the registers as they are (`rt_sigreturn`).
    Resume(u64),
    /// Create a process (`fork`, `vfork`, `clone` without `CLONE_VM`, or with `CLONE_VM |
    /// CLONE_VFORK`, which is run as a fork): the dispatcher does it.
    Fork(CloneArgs),
    /// Replace the program (`execve`, `execveat`): hotpath writes the profile first.
    Exec,
    /// Create a thread (`clone` with `CLONE_THREAD`): the dispatcher starts it.
    Thread(CloneArgs),
    /// The calling thread ends (`exit`); the process too if it was the last.
    ThreadExit(i32),
    /// The guest ends.
    Exit(GuestExit),
    /// The guest asked for something hotpath does not support yet: the message says what.
    Unsupported(String),
}

type Handler = fn(&mut GuestThread, &mut ThreadArea, &[u64; 6]) -> Outcome;

/// One row of the system-call table.
struct SyscallRow {
    nr: u64,
    handler: Handler,
}

/// The emulated and refused calls, by number (x86-64 numbering). Calls not listed pass through.
const TABLE: &[SyscallRow] = &[
    SyscallRow {
        nr: 9,
        handler: sys_mmap,
    },
    SyscallRow {
        nr: 10,
        handler: sys_mprotect,
    },
    SyscallRow {
        nr: 11,
        handler: sys_munmap,
    },
    SyscallRow {
        nr: 12,
        handler: sys_brk,
    },
    SyscallRow {
        nr: 2,
        handler: sys_open,
    },
    SyscallRow {
        nr: 13,
        handler: sys_rt_sigaction,
    },
    SyscallRow {
        nr: 15,
        handler: sys_rt_sigreturn,
    },
    SyscallRow {
        nr: 130,
        handler: sys_rt_sigsuspend,
    },
    SyscallRow {
        nr: 25,
        handler: sys_mremap,
    },
    SyscallRow {
        nr: 56,
        handler: sys_clone,
    },
    SyscallRow {
        nr: 57,
        handler: sys_fork,
    },
    SyscallRow {
        nr: 58,
        handler: sys_fork,
    },
    SyscallRow {
        nr: 59,
        handler: sys_execve,
    },
    SyscallRow {
        nr: 60,
        handler: sys_exit,
    },
    SyscallRow {
        nr: 131,
        handler: sys_sigaltstack,
    },
    SyscallRow {
        nr: 89,
        handler: sys_readlink,
    },
    SyscallRow {
        nr: 158,
        handler: sys_arch_prctl,
    },
    SyscallRow {
        nr: 218,
        handler: sys_set_tid_address,
    },
    SyscallRow {
        nr: 231,
        handler: sys_exit_group,
    },
    SyscallRow {
        nr: 257,
        handler: sys_openat,
    },
    SyscallRow {
        nr: 267,
        handler: sys_readlinkat,
    },
    SyscallRow {
        nr: 322,
        handler: sys_execveat,
    },
    SyscallRow {
        nr: 157,
        handler: sys_prctl,
    },
    SyscallRow {
        nr: 317,
        handler: sys_seccomp,
    },
    SyscallRow {
        nr: 334,
        handler: sys_rseq,
    },
    SyscallRow {
        nr: 435,
        handler: refuse_clone3,
    },
];

const ENOMEM: i64 = libc::ENOMEM as i64;
const EINVAL: i64 = libc::EINVAL as i64;
const ENOSYS: i64 = libc::ENOSYS as i64;
const EPERM: i64 = libc::EPERM as i64;

/// Runs guest system call `nr` with `args` (RDI, RSI, RDX, R10, R8, R9).
pub fn dispatch(
    process: &mut GuestThread,
    area: &mut ThreadArea,
    nr: u64,
    args: &[u64; 6],
) -> Outcome {
    if seccomp::strict_forbids(process, nr) {
        // Seccomp strict mode: the kernel kills the thread with SIGKILL.
        return Outcome::Exit(GuestExit::Signaled(libc::SIGKILL));
    }
    match TABLE.iter().find(|row| row.nr == nr) {
        Some(row) => (row.handler)(process, area, args),
        None => Outcome::Return(gated_syscall(nr, args)),
    }
}

/// System calls the kernel restarts after a handler with SA_RESTART (they fail with
/// ERESTARTSYS when interrupted), by number.
const RESTARTABLE: &[u64] = &[
    0, 1, 2, 16, 17, 18, 19, 20, 40, 42, 43, 44, 45, 46, 47, 61, 72, 73, 202, 247, 257, 275, 276,
    288, 295, 296,
];

/// True if `nr`, interrupted by a signal whose handler has SA_RESTART, is to be made again.
pub fn is_restartable(nr: u64) -> bool {
    RESTARTABLE.contains(&nr)
}

fn is_error(ret: i64) -> bool {
    (-4095..0).contains(&ret)
}

/// The name of signal `sig` (`"SIGSEGV"`), or `"signal N"`.
pub fn signal_name(sig: i32) -> String {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match NAMES.get(sig as usize) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ if sig >= libc::SIGRTMIN() && sig <= libc::SIGRTMAX() => {
            format!("SIGRTMIN+{}", sig - libc::SIGRTMIN())
        }
        _ => format!("signal {sig}"),
    }
}

impl Memory {
    /// Marks `[start, end)` as the guest's.
    pub fn add_region(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        let overlapping: Vec<(u64, u64)> = self
            .guest_regions
            .range(..=end)
            .filter(|(&rs, &re)| re >= start && rs <= end)
            .map(|(&rs, &re)| (rs, re))
            .collect();
        for (rs, re) in overlapping {
            self.guest_regions.remove(&rs);
            s = s.min(rs);
            e = e.max(re);
        }
        self.guest_regions.insert(s, e);
    }

    /// Forgets `[start, end)` as the guest's.
    pub fn remove_region(&mut self, start: u64, end: u64) {
        let overlapping: Vec<(u64, u64)> = self
            .guest_regions
            .range(..end)
            .filter(|(_, &re)| re > start)
            .map(|(&rs, &re)| (rs, re))
            .collect();
        for (rs, re) in overlapping {
            self.guest_regions.remove(&rs);
            if rs < start {
                self.guest_regions.insert(rs, start);
            }
            if re > end {
                self.guest_regions.insert(end, re);
            }
        }
    }

    /// Bytes from `addr` (at most `len`) covered by consecutive guest regions.
    pub fn guest_run(&self, addr: u64, len: u64) -> u64 {
        let end = addr.saturating_add(len);
        let mut at = addr;
        while at < end {
            match self.guest_regions.range(..=at).next_back() {
                Some((_, &re)) if re > at => at = re,
                _ => break,
            }
        }
        at.min(end) - addr
    }

    /// True if `[start, end)` overlaps one of the guest's regions.
    pub fn overlaps_guest(&self, start: u64, end: u64) -> bool {
        self.guest_regions
            .range(..end)
            .next_back()
            .is_some_and(|(_, &re)| re > start)
    }

    /// True if `[addr, addr+len)` overlaps memory that is mapped but not the guest's, i.e.
    /// hotpath's own (code cache, heap, stacks, the thread area, hotpath's binary).
    ///
    /// A range the guest's regions cover whole is the guest's (hotpath maps nothing inside
    /// them), which answers the usual call (the guest unmapping or re-protecting its own
    /// memory) without reading `/proc/self/maps`: that read, under the memory map's lock,
    /// took a loop of 1 MiB `malloc`/`free` (an `mmap` and a `munmap` each) from 11-17 to
    /// 48-60 µs an iteration, and python3 starting 200 threads made 253 of them.
    pub fn overlaps_hotpath(&self, addr: u64, len: u64) -> bool {
        if covered(&self.guest_regions, addr, addr.saturating_add(len)) {
            return false;
        }
        match crate::host::procfs::read_to_string("/proc/self/maps") {
            Ok(maps) => overlaps_foreign(&self.guest_regions, &maps, addr, len),
            Err(_) => true,
        }
    }
}

/// True if `[start, end)` is covered by `regions`.
fn covered(regions: &BTreeMap<u64, u64>, start: u64, end: u64) -> bool {
    let mut at = start;
    while at < end {
        match regions.range(..=at).next_back() {
            Some((_, &re)) if re > at => at = re,
            _ => return false,
        }
    }
    true
}

/// True if `[addr, addr+len)` overlaps a mapping listed in `maps` (the text of
/// `/proc/self/maps`) that `regions` does not cover.
fn overlaps_foreign(regions: &BTreeMap<u64, u64>, maps: &str, addr: u64, len: u64) -> bool {
    let end = addr.saturating_add(len);
    for line in maps.lines() {
        let range = line.split_whitespace().next().unwrap_or("");
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(s), Ok(e)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let (os, oe) = (s.max(addr), e.min(end));
        if os < oe && !covered(regions, os, oe) {
            return true;
        }
    }
    false
}

fn page_ceil(x: u64) -> u64 {
    (x + 4095) & !4095
}

/// `brk`, as the kernel's: the heap is the anonymous memory from the initial brk to the
/// current one (page-rounded). Growing maps the new pages where nothing is mapped, and fails
/// (returning the old brk) where a mapping is in the way, within a page of the new end (the
/// kernel's gap), or past `RLIMIT_DATA`; shrinking unmaps, so a later brk gets zeroed pages.
/// Nothing is reserved for the heap: another mapping above it limits it, as natively.
fn sys_brk(thread: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    const PAGE: u64 = hotpath_loader::PAGE_SIZE;
    let mut p = lock(&thread.shared.memory);
    let want = a[0];
    let old = Outcome::Return(p.brk as i64);
    if want < p.brk_start {
        return old;
    }
    let (old_end, new_end) = (page_ceil(p.brk), page_ceil(want));
    if new_end > old_end {
        if want - p.brk_start > data_limit() || address_space_short(new_end - old_end) {
            return old;
        }
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
        let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        // The new pages and the one after them must be free; the last is given back.
        let len = new_end - old_end + PAGE;
        let r = raw_syscall(9, &[old_end, len, prot, flags, u64::MAX, 0]);
        if is_error(r) {
            return old;
        }
        if r as u64 != old_end {
            // A kernel without FIXED_NOREPLACE took the address as a hint.
            raw_syscall(11, &[r as u64, len, 0, 0, 0, 0]);
            return old;
        }
        raw_syscall(11, &[new_end, PAGE, 0, 0, 0, 0]);
        p.add_region(old_end, new_end);
    } else if new_end < old_end {
        let r = raw_syscall(11, &[new_end, old_end - new_end, 0, 0, 0, 0]);
        if is_error(r) {
            return old;
        }
        p.remove_region(new_end, old_end);
        mapping_changed(&mut thread.invalidate, &thread.signals, new_end, old_end);
    }
    thread
        .maps
        .invalidate_range(old_end.min(new_end), old_end.max(new_end));
    p.brk = want;
    Outcome::Return(want as i64)
}

/// The soft `RLIMIT_DATA` in bytes, which bounds the heap (`u64::MAX` when unlimited).
fn data_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_DATA, &mut r) } != 0 {
        return u64::MAX;
    }
    r.rlim_cur
}

/// Address space (bytes) kept for hotpath under a finite `RLIMIT_AS`: a guest mapping that
/// would leave less free is refused with ENOMEM, as the kernel refuses one past the limit, so
/// that translation and the monitor can still allocate after the guest has used up its share
/// (natively malloc returns NULL there). Part of it is hotpath's reserve
/// ([`crate::host::reserve`]), mapped, for the end of a run that outgrows the rest.
const AS_HEADROOM: u64 = 64 << 20;

/// True if the guest may not grow its address space by `grow` bytes: `RLIMIT_AS` is finite
/// and the process's size plus `grow` would come within [`AS_HEADROOM`] of it (less the
/// reserve, which the size already counts).
pub(crate) fn address_space_short(grow: u64) -> bool {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    if grow == 0
        || unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } != 0
        || r.rlim_cur == libc::RLIM_INFINITY
    {
        return false;
    }
    // The process's size in pages: the first field of /proc/self/statm.
    let size = crate::host::procfs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split(' ').next()?.parse::<u64>().ok())
        .map_or(0, |pages| pages * hotpath_loader::PAGE_SIZE);
    let headroom = AS_HEADROOM - crate::host::reserve::held();
    size.saturating_add(grow).saturating_add(headroom) > r.rlim_cur
}

fn sys_mmap(thread: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    let mut p = lock(&thread.shared.memory);
    let (addr, len, flags) = (a[0], a[1], a[3] as i32);
    let fixed = flags & libc::MAP_FIXED != 0 && flags & libc::MAP_FIXED_NOREPLACE == 0;
    if fixed && p.overlaps_hotpath(addr, page_ceil(len)) {
        return Outcome::Return(-ENOMEM);
    }
    if address_space_short(page_ceil(len)) {
        return Outcome::Return(-ENOMEM);
    }
    let r = guest_syscall(9, a);
    if !is_error(r) {
        let start = r as u64;
        if flags & libc::MAP_ANONYMOUS == 0 {
            p.modules
                .note_mmap(start, page_ceil(len), a[4] as i32 as i64, a[5]);
        }
        p.add_region(start, start + page_ceil(len));
        mapping_changed(
            &mut thread.invalidate,
            &thread.signals,
            start,
            start + page_ceil(len),
        );
    }
    Outcome::Return(r)
}

/// After a system call of this thread that changed the mappings or protections of `[start,
/// end)` (guest addresses, bytes): their translations must go (`invalidate`), and any page
/// there that hotpath write-protected to watch its code now has the protection the guest gave
/// it, so it is no longer watched. Only the thread that made the change forgets the pages,
/// right after it: the other threads discard the range later, by which time one of them may
/// have translated code from a page there again and protected it anew.
fn mapping_changed(
    invalidate: &mut Vec<(u64, u64)>,
    signals: &crate::linux::signals::SignalState,
    start: u64,
    end: u64,
) {
    signals.protected_pages().forget(start, end);
    invalidate.push((start, end));
}

fn sys_munmap(thread: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    let mut p = lock(&thread.shared.memory);
    let (addr, len) = (a[0], page_ceil(a[1]));
    if p.overlaps_hotpath(addr, len) {
        return Outcome::Return(-EINVAL);
    }
    let r = guest_syscall(11, a);
    if !is_error(r) {
        p.modules.note_munmap(addr, addr + len);
        p.remove_region(addr, addr + len);
        mapping_changed(&mut thread.invalidate, &thread.signals, addr, addr + len);
    }
    Outcome::Return(r)
}

fn sys_mprotect(thread: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    let p = lock(&thread.shared.memory);
    let (addr, len) = (a[0], page_ceil(a[1]));
    if p.overlaps_hotpath(addr, len) {
        return Outcome::Return(-ENOMEM);
    }
    let r = guest_syscall(10, a);
    if !is_error(r) {
        mapping_changed(&mut thread.invalidate, &thread.signals, addr, addr + len);
    }
    Outcome::Return(r)
}

fn sys_mremap(thread: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    let mut p = lock(&thread.shared.memory);
    let (old, old_len, new_len, flags, new_addr) =
        (a[0], page_ceil(a[1]), page_ceil(a[2]), a[3] as i32, a[4]);
    if p.overlaps_hotpath(old, old_len) {
        return Outcome::Return(-EINVAL);
    }
    if flags & libc::MREMAP_FIXED != 0 && p.overlaps_hotpath(new_addr, new_len) {
        return Outcome::Return(-EINVAL);
    }
    if address_space_short(new_len.saturating_sub(old_len)) {
        return Outcome::Return(-ENOMEM);
    }
    let r = guest_syscall(25, a);
    if !is_error(r) {
        p.remove_region(old, old + old_len);
        p.add_region(r as u64, r as u64 + new_len);
        mapping_changed(&mut thread.invalidate, &thread.signals, old, old + old_len);
        mapping_changed(
            &mut thread.invalidate,
            &thread.signals,
            r as u64,
            r as u64 + new_len,
        );
    }
    Outcome::Return(r)
}

fn sys_rt_sigaction(p: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    Outcome::Return(p.signals.sigaction(a[0], a[1], a[2], a[3]))
}

fn sys_rt_sigreturn(p: &mut GuestThread, area: &mut ThreadArea, _: &[u64; 6]) -> Outcome {
    match p.signals.sigreturn(area) {
        Ok(rip) => Outcome::Resume(rip),
        // An unreadable frame: the kernel kills the process with SIGSEGV.
        Err(sig) => Outcome::Exit(GuestExit::Signaled(sig)),
    }
}

fn sys_rt_sigsuspend(p: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    let mut mask = [0u8; 8];
    if a[1] != 8 {
        return Outcome::Return(-(libc::EINVAL as i64));
    }
    if let Err(e) = guest_mem::read(a[0], &mut mask) {
        return Outcome::Return(e);
    }
    let ret = gated_syscall(130, a);
    if ret == -(libc::EINTR as i64) {
        // hotpath's handler took the signal inside the kernel's wait; the guest's handler
        // must now run under the temporary mask, as it would have inside the call.
        p.signals.suspend_mask = Some(u64::from_le_bytes(mask));
    }
    Outcome::Return(ret)
}

fn sys_sigaltstack(p: &mut GuestThread, area: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    Outcome::Return(
        p.signals
            .sigaltstack(a[0], a[1], area.gpr[crate::host::thread_area::RSP]),
    )
}

fn sys_clone(_: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    let flags = a[0];
    // x86-64 clone(flags, stack, parent_tid, child_tid, tls).
    let args = CloneArgs {
        flags,
        stack: a[1],
        parent_tid: a[2],
        child_tid: a[3],
        tls: a[4],
    };
    let has = |f: i32| flags & f as u64 != 0;
    if has(libc::CLONE_VM) && has(libc::CLONE_VFORK) {
        // vfork-like: run as a fork (the parent waits for nothing, which no caller notices).
        return Outcome::Fork(args);
    }
    if has(libc::CLONE_THREAD) {
        // A thread, as pthread_create makes one: the kernel requires CLONE_SIGHAND and
        // CLONE_VM with it.
        if !has(libc::CLONE_SIGHAND) || !has(libc::CLONE_VM) {
            return Outcome::Return(-EINVAL);
        }
        return Outcome::Thread(args);
    }
    if has(libc::CLONE_VM) || has(libc::CLONE_SIGHAND) {
        return Outcome::Unsupported(format!(
            "the guest calls clone with flags {flags:#x} (a process sharing memory or signal handlers without being a thread): not supported"
        ));
    }
    Outcome::Fork(args)
}

fn sys_fork(_: &mut GuestThread, _: &mut ThreadArea, _: &[u64; 6]) -> Outcome {
    Outcome::Fork(CloneArgs {
        flags: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    })
}

fn refuse_clone3(_: &mut GuestThread, _: &mut ThreadArea, _: &[u64; 6]) -> Outcome {
    // glibc falls back to clone when clone3 is unavailable.
    Outcome::Return(-ENOSYS)
}

fn sys_execve(p: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    exec_outcome(p, 59, a)
}

fn sys_execveat(p: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    exec_outcome(p, 322, a)
}

/// An exec the kernel will refuse is made here and its error returned: the process goes on
/// as it was (its threads running, its profile open). Any other ends the process image
/// through the embedder ([`Outcome::Exec`]).
fn exec_outcome(p: &GuestThread, nr: u64, a: &[u64; 6]) -> Outcome {
    if crate::linux::exec::certainly_refused(nr, a) {
        Outcome::Return(crate::linux::exec::exec(p, None, nr, a))
    } else {
        Outcome::Exec
    }
}

fn sys_open(p: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    match exe_path_arg(p, a[0]) {
        Some(exe) => Outcome::Return(guest_syscall(
            2,
            &[exe.as_ptr() as u64, a[1], a[2], 0, 0, 0],
        )),
        None => Outcome::Return(guest_syscall(2, a)),
    }
}

fn sys_openat(p: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    match exe_path_arg(p, a[1]) {
        Some(exe) => Outcome::Return(guest_syscall(
            257,
            &[a[0], exe.as_ptr() as u64, a[2], a[3], 0, 0],
        )),
        None => Outcome::Return(guest_syscall(257, a)),
    }
}

fn sys_exit_group(_: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    Outcome::Exit(GuestExit::Exited((a[0] & 0xff) as i32))
}

fn sys_exit(_: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    Outcome::ThreadExit((a[0] & 0xff) as i32)
}

fn readlink_exe(p: &GuestThread, buf: u64, size: u64) -> i64 {
    if (size as i64) <= 0 {
        return -EINVAL;
    }
    let target = p.exe.as_os_str().as_encoded_bytes();
    let n = target.len().min(size as usize);
    match guest_mem::write(buf, &target[..n]) {
        Ok(()) => n as i64,
        Err(e) => e,
    }
}

fn sys_readlink(p: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    match guest_mem::read_cstr(a[0], 4096) {
        Ok(path) if is_proc_self_exe(&path) => Outcome::Return(readlink_exe(p, a[1], a[2])),
        Ok(_) => Outcome::Return(guest_syscall(89, a)),
        Err(e) => Outcome::Return(e),
    }
}

fn sys_readlinkat(p: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    match guest_mem::read_cstr(a[1], 4096) {
        Ok(path) if path.starts_with(b"/") && is_proc_self_exe(&path) => {
            Outcome::Return(readlink_exe(p, a[2], a[3]))
        }
        Ok(_) => Outcome::Return(guest_syscall(267, a)),
        Err(e) => Outcome::Return(e),
    }
}

const ARCH_SET_GS: u64 = 0x1001;
const ARCH_SET_FS: u64 = 0x1002;
const ARCH_GET_FS: u64 = 0x1003;
const ARCH_GET_GS: u64 = 0x1004;

fn sys_arch_prctl(_: &mut GuestThread, area: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    let (code, addr) = (a[0], a[1]);
    match code {
        ARCH_SET_FS => {
            if addr >= 1 << 47 {
                return Outcome::Return(-EPERM);
            }
            area.fs_base = addr;
            Outcome::Return(0)
        }
        ARCH_GET_FS => Outcome::Return(guest_mem::write(addr, &area.fs_base.to_le_bytes()).map_or_else(|e| e, |_| 0)),
        ARCH_GET_GS => Outcome::Return(guest_mem::write(addr, &0u64.to_le_bytes()).map_or_else(|e| e, |_| 0)),
        ARCH_SET_GS => Outcome::Unsupported(
            "the guest sets its GS base (arch_prctl ARCH_SET_GS): hotpath keeps its per-thread state in GS".into(),
        ),
        _ => Outcome::Return(guest_syscall(158, a)),
    }
}

fn sys_set_tid_address(p: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    // The host thread's clear_child_tid stays hotpath's: the dispatcher clears and wakes the
    // guest's when the guest thread exits.
    p.clear_child_tid = a[0];
    Outcome::Return(raw_syscall(libc::SYS_gettid as u64, &[0; 6]))
}

fn sys_seccomp(p: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    Outcome::Return(seccomp::seccomp(p, a))
}

fn sys_prctl(p: &mut GuestThread, _: &mut ThreadArea, a: &[u64; 6]) -> Outcome {
    match a[0] as i32 {
        x if x as u64 == seccomp::PR_SET_SECCOMP => {
            Outcome::Return(seccomp::prctl_set_seccomp(p, a))
        }
        // The time-stamp counter setting is the thread's and is emulated: the kernel's would
        // make hotpath's own clock (the vDSO's `rdtscp`) fault.
        libc::PR_GET_TSC => {
            let mode = if crate::host::cpu::tsc_sigsegv() {
                libc::PR_TSC_SIGSEGV
            } else {
                libc::PR_TSC_ENABLE
            };
            Outcome::Return(guest_mem::write(a[1], &mode.to_le_bytes()).map_or_else(|e| e, |_| 0))
        }
        libc::PR_SET_TSC => {
            let on = match a[1] as i32 {
                libc::PR_TSC_ENABLE => false,
                libc::PR_TSC_SIGSEGV => true,
                _ => return Outcome::Return(-(libc::EINVAL as i64)),
            };
            if on != crate::host::cpu::tsc_sigsegv() {
                crate::host::cpu::set_tsc_sigsegv(on);
                // Translations made under the other mode: this thread's go (its code cache
                // is its own).
                p.invalidate.push((0, 1 << 47));
            }
            Outcome::Return(0)
        }
        _ => Outcome::Return(guest_syscall(157, a)),
    }
}

fn sys_rseq(_: &mut GuestThread, _: &mut ThreadArea, _: &[u64; 6]) -> Outcome {
    // Registering the guest's rseq area would make the kernel rewrite guest memory and RIP on
    // preemption, with host RIPs: report it unavailable, which glibc handles.
    Outcome::Return(-ENOSYS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "00400000-00500000 r-xp 00000000 08:01 1 /guest\n\
                        00500000-00600000 rw-p 00000000 00:00 0\n\
                        40000000-44000000 r-xp 00000000 00:01 2 /memfd:hotpath-code-cache (deleted)\n\
                        7f0000000000-7f0000100000 rw-p 00000000 00:00 0 [heap]\n";

    #[test]
    fn map_fixed_over_hotpath_memory_is_refused() {
        let mut regions = BTreeMap::new();
        regions.insert(0x40_0000, 0x60_0000);
        // Inside the guest image: allowed.
        assert!(!overlaps_foreign(&regions, MAPS, 0x40_1000, 0x1000));
        // Unmapped address space: allowed (the kernel decides).
        assert!(!overlaps_foreign(&regions, MAPS, 0x1000_0000, 0x1000));
        // The code cache and hotpath's heap: refused, also when only partly covered.
        assert!(overlaps_foreign(&regions, MAPS, 0x4000_0000, 0x1000));
        assert!(overlaps_foreign(&regions, MAPS, 0x5f_f000, 0x4000_0000));
        assert!(overlaps_foreign(&regions, MAPS, 0x7f00_0000_0000, 0x10));
    }

    /// The shortcut for ranges the guest's regions cover whole must not hide hotpath's own
    /// memory from a range that is covered only in part (here the test's heap stands for
    /// hotpath's: it is mapped, and no guest region holds it).
    #[test]
    fn own_memory_is_found_beside_a_covered_range() {
        let heap = vec![0u8; 1 << 16];
        let at = heap.as_ptr() as u64 & !0xfff;
        let mut memory = Memory {
            brk_start: 0,
            brk: 0,
            guest_regions: BTreeMap::new(),
            modules: Default::default(),
        };
        memory.add_region(at - 0x10_0000, at);
        assert!(!memory.overlaps_hotpath(at - 0x10_0000, 0x10_0000));
        assert!(memory.overlaps_hotpath(at - 0x1000, 0x2000));
        assert!(memory.overlaps_hotpath(at, 0x1000));
        memory.add_region(at, at + 0x1000);
        assert!(!memory.overlaps_hotpath(at - 0x1000, 0x2000));
    }

    #[test]
    fn regions_merge_and_split() {
        let mut regions = BTreeMap::new();
        regions.insert(0x1000, 0x3000);
        assert!(covered(&regions, 0x1000, 0x3000));
        assert!(!covered(&regions, 0x1000, 0x3001));
        assert!(!covered(&regions, 0x800, 0x1800));
    }
}
