//! The guest's seccomp: strict mode emulated, filters installed in the kernel with a prologue
//! that lets hotpath's own system calls through.
//!
//! hotpath shares the guest's threads, so a filter the guest installs would also judge the
//! system calls hotpath makes on those threads (translating, reading guest memory with
//! `process_vm_readv`, parking on a full ring with `futex`, writing the report) and, with
//! `SECCOMP_FILTER_FLAG_TSYNC`, the monitor's. The kernel tells them apart for us: every call
//! made for the guest returns to one of two host addresses (the gate's `syscall` and the
//! guest site's, [`crate::host::syscall::guest_syscall_returns`]), so the filter handed to the kernel is
//!
//! ```text
//! ip == a guest site              → the guest's filter
//! ip in hotpath's executable code → SECCOMP_RET_ALLOW      (hotpath's own call)
//! otherwise                       → the guest's filter     (e.g. after execve: fail closed)
//! ```
//!
//! followed by the guest's program, whose kill constants (`SECCOMP_RET_KILL_THREAD`,
//! `SECCOMP_RET_KILL_PROCESS`) become `SECCOMP_RET_TRAP` with hotpath's data
//! ([`SECCOMP_KILL_DATA`]): the call is not made, and the SIGSYS it raises ends the guest by
//! SIGSYS after hotpath has written its report. Killing only the guest's thread would leave
//! hotpath waiting for it (the monitor thread makes a single-threaded guest's process
//! multi-threaded; the kernel ends a single-threaded process in both cases).
//!
//! Strict mode (`SECCOMP_SET_MODE_STRICT`, `PR_SET_SECCOMP` with `SECCOMP_MODE_STRICT`) allows
//! nothing but `read`, `write`, `exit` and `rt_sigreturn`, which hotpath itself could not live
//! with; it is emulated in the system-call table: any other call of the guest ends it with
//! SIGKILL, as the kernel would, after the report is written.
//!
//! What differs from native: the filter sees hotpath's address as `instruction_pointer`, not
//! the guest's; calls hotpath emulates without making them (`brk`, `rt_sigaction`,
//! `arch_prctl`, `exit_group`, ...) are not judged; `SECCOMP_RET_KILL_THREAD` ends the whole
//! process; a kill from a filter whose own traps use hotpath's data ends it without a report.

use crate::host::guest_mem;
use crate::host::syscall::{guest_syscall, guest_syscall_returns, raw_syscall};
use crate::linux::process::lock;
use crate::linux::signals::SECCOMP_KILL_DATA;
use crate::linux::thread::GuestThread;

/// `seccomp(2)` operations and `prctl(PR_SET_SECCOMP)` modes.
const SECCOMP_SET_MODE_STRICT: u64 = 0;
const SECCOMP_SET_MODE_FILTER: u64 = 1;
/// `prctl` options.
pub const PR_GET_SECCOMP: u64 = 21;
pub const PR_SET_SECCOMP: u64 = 22;
const SECCOMP_MODE_STRICT: u64 = 1;
const SECCOMP_MODE_FILTER: u64 = 2;

/// System calls strict mode allows: `read`, `write`, `exit`, `rt_sigreturn`.
const STRICT_ALLOWED: [u64; 4] = [0, 1, 60, 15];

/// The kernel's limit on a filter's length, in instructions (`BPF_MAXINSNS`).
const BPF_MAXINSNS: usize = 4096;

/// Classic BPF opcodes used here and in guest programs.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_LD_IMM: u16 = 0x00;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_JA: u16 = 0x05;
const BPF_RET_K: u16 = 0x06;

/// Filter return values (`SECCOMP_RET_*`): the action is the top 16 bits.
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ACTION_FULL: u32 = 0xffff_0000;
const SECCOMP_RET_KILL_THREAD: u32 = 0;
const SECCOMP_RET_TRAP: u32 = 0x0003_0000;

/// Offsets in `struct seccomp_data` of `instruction_pointer`'s low and high 32 bits.
const IP_LO: u32 = 8;
const IP_HI: u32 = 12;

/// One classic BPF instruction (`struct sock_filter`, 8 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

impl Insn {
    const fn new(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
        Insn { code, jt, jf, k }
    }

    fn from_bytes(b: &[u8]) -> Insn {
        Insn {
            code: u16::from_le_bytes([b[0], b[1]]),
            jt: b[2],
            jf: b[3],
            k: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0..2].copy_from_slice(&self.code.to_le_bytes());
        b[2] = self.jt;
        b[3] = self.jf;
        b[4..8].copy_from_slice(&self.k.to_le_bytes());
        b
    }
}

/// True if the guest thread is in (emulated) strict mode and may not make call `nr`: the
/// caller ends the guest with SIGKILL.
pub fn strict_forbids(thread: &GuestThread, nr: u64) -> bool {
    thread.seccomp_strict && !STRICT_ALLOWED.contains(&nr)
}

/// `seccomp(op, flags, args)` (`nr` 317).
pub fn seccomp(thread: &mut GuestThread, a: &[u64; 6]) -> i64 {
    match a[0] {
        SECCOMP_SET_MODE_STRICT => {
            if a[1] != 0 || a[2] != 0 {
                return -(libc::EINVAL as i64);
            }
            enter_strict(thread)
        }
        SECCOMP_SET_MODE_FILTER => install_filter(thread, 317, a, 2),
        _ => guest_syscall(317, a),
    }
}

/// `prctl(PR_SET_SECCOMP, mode, filter)`.
pub fn prctl_set_seccomp(thread: &mut GuestThread, a: &[u64; 6]) -> i64 {
    match a[1] {
        SECCOMP_MODE_STRICT => enter_strict(thread),
        SECCOMP_MODE_FILTER => install_filter(thread, 157, a, 2),
        _ => guest_syscall(157, a),
    }
}

/// Strict mode, unless a filter is in place (the kernel refuses to change modes).
fn enter_strict(thread: &mut GuestThread) -> i64 {
    if raw_syscall(157, &[PR_GET_SECCOMP, 0, 0, 0, 0, 0]) != 0 {
        return -(libc::EINVAL as i64);
    }
    thread.seccomp_strict = true;
    0
}

/// Set once a guest filter is in the kernel (a forked child inherits it with the memory).
static GUEST_FILTER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// True if the guest installed a seccomp filter in this process. A program it execs then runs
/// untranslated (`linux::exec`): the filter stays with the process across `execve`, and its
/// prologue knows only this hotpath's code addresses, so it would judge every system call of
/// a new hotpath (its futexes, mappings, reads of `/proc`) as the guest's.
pub fn guest_filter_installed() -> bool {
    GUEST_FILTER.load(std::sync::atomic::Ordering::Relaxed)
}

/// Installs the guest's filter (the `struct sock_fprog` pointer is `a[prog_arg]` of call
/// `nr`) behind hotpath's prologue, with the guest's call.
fn install_filter(thread: &mut GuestThread, nr: u64, a: &[u64; 6], prog_arg: usize) -> i64 {
    if thread.seccomp_strict {
        return -(libc::EINVAL as i64);
    }
    let mut fprog = [0u8; 16];
    if let Err(e) = guest_mem::read(a[prog_arg], &mut fprog) {
        return e;
    }
    let len = u16::from_le_bytes([fprog[0], fprog[1]]) as usize;
    let ptr = u64::from_le_bytes(fprog[8..16].try_into().unwrap());
    if len == 0 || len > BPF_MAXINSNS {
        return -(libc::EINVAL as i64);
    }
    let mut bytes = vec![0u8; len * 8];
    if let Err(e) = guest_mem::read(ptr, &mut bytes) {
        return e;
    }
    let guest: Vec<Insn> = bytes.chunks_exact(8).map(Insn::from_bytes).collect();
    let host_code = {
        let memory = lock(&thread.shared.memory);
        match crate::host::procfs::read_to_string("/proc/self/maps") {
            Ok(maps) => host_code_ranges(&maps, |s, e| memory.overlaps_guest(s, e)),
            Err(_) => Vec::new(),
        }
    };
    let program = wrap(&guest, &guest_syscall_returns(), &host_code);
    let ret = if program.len() > BPF_MAXINSNS {
        // Too long with the prologue: judge hotpath's calls too rather than refuse a filter
        // the kernel would take.
        pass_filter(nr, a, prog_arg, &guest)
    } else {
        pass_filter(nr, a, prog_arg, &program)
    };
    if ret >= 0 {
        GUEST_FILTER.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    ret
}

/// Makes the guest's call with `program` in place of its filter.
fn pass_filter(nr: u64, a: &[u64; 6], prog_arg: usize, program: &[Insn]) -> i64 {
    let bytes: Vec<u8> = program.iter().flat_map(|i| i.to_bytes()).collect();
    let mut fprog = [0u8; 16];
    fprog[0..2].copy_from_slice(&(program.len() as u16).to_le_bytes());
    fprog[8..16].copy_from_slice(&(bytes.as_ptr() as u64).to_le_bytes());
    let mut args = *a;
    args[prog_arg] = fprog.as_ptr() as u64;
    guest_syscall(nr, &args)
}

/// hotpath's executable mappings in `maps` (the text of `/proc/self/maps`): every `x`
/// mapping `is_guest` does not claim, as `[start, end)` host addresses.
fn host_code_ranges(maps: &str, is_guest: impl Fn(u64, u64) -> bool) -> Vec<(u64, u64)> {
    let mut ranges = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !perms.contains('x') {
            continue;
        }
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else {
            continue;
        };
        if !is_guest(s, e) {
            ranges.push((s, e));
        }
    }
    ranges
}

/// hotpath's prologue (see the module doc) followed by `guest` with its kill-thread returns
/// made kill-process.
fn wrap(guest: &[Insn], sites: &[u64], host_code: &[(u64, u64)]) -> Vec<Insn> {
    let mut p = Vec::new();
    // A guest site: jump to the guest's program (placed after the ranges).
    let mut to_guest = Vec::new();
    for &site in sites {
        p.push(Insn::new(BPF_LD_W_ABS, 0, 0, IP_HI));
        p.push(Insn::new(BPF_JEQ_K, 0, 3, (site >> 32) as u32));
        p.push(Insn::new(BPF_LD_W_ABS, 0, 0, IP_LO));
        p.push(Insn::new(BPF_JEQ_K, 0, 1, site as u32));
        to_guest.push(p.len());
        p.push(Insn::new(BPF_JA, 0, 0, 0));
    }
    // hotpath's code: allow. Each range is cut where the high 32 bits change.
    for &(start, end) in host_code {
        let mut s = start;
        while s < end {
            let hi = s >> 32;
            // u128: the last piece of the address space ends at 2^64 ([vsyscall]).
            let piece_end = (end as u128).min((hi as u128 + 1) << 32);
            let lo_end = (piece_end - 1) as u32; // inclusive: the piece may end at 2^32
            p.push(Insn::new(BPF_LD_W_ABS, 0, 0, IP_HI));
            p.push(Insn::new(BPF_JEQ_K, 0, 4, hi as u32));
            p.push(Insn::new(BPF_LD_W_ABS, 0, 0, IP_LO));
            p.push(Insn::new(BPF_JGE_K, 0, 2, s as u32));
            // ip_lo > lo_end, i.e. ip_lo >= lo_end + 1 (lo_end < u32::MAX here or always true)
            p.push(Insn::new(BPF_JGE_K, 1, 0, lo_end.wrapping_add(1)));
            p.push(Insn::new(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW));
            if lo_end == u32::MAX {
                // `ip_lo >= 0` always holds: drop that test so the piece allows its whole end.
                let n = p.len();
                p[n - 2] = Insn::new(BPF_JA, 0, 0, 0);
            }
            s = piece_end as u64; // <= end, which is a u64
        }
    }
    let guest_start = p.len();
    for at in to_guest {
        p[at].k = (guest_start - at - 1) as u32;
    }
    // The guest's program starts with A = 0, as the kernel's would.
    p.push(Insn::new(BPF_LD_IMM, 0, 0, 0));
    let kill_data = SECCOMP_RET_TRAP | SECCOMP_KILL_DATA as u32;
    // The guest's own trap with hotpath's data would read as a kill: keep its kills then.
    let trap_for_kill = !guest
        .iter()
        .any(|i| i.code == BPF_RET_K && i.k == kill_data);
    p.extend(guest.iter().map(|&i| {
        let action = i.k & SECCOMP_RET_ACTION_FULL;
        let kill = action == SECCOMP_RET_KILL_THREAD || action == SECCOMP_RET_KILL_PROCESS;
        if i.code != BPF_RET_K || !kill {
            i
        } else if trap_for_kill {
            Insn { k: kill_data, ..i }
        } else {
            Insn {
                k: SECCOMP_RET_KILL_PROCESS,
                ..i
            }
        }
    }));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic BPF interpreter for the instructions `wrap` emits and the guest programs
    /// below use: enough to check the prologue's decisions.
    fn run(prog: &[Insn], ip: u64, nr: u32) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[8..16].copy_from_slice(&ip.to_le_bytes());
        let (mut a, mut pc) = (0xdead_beefu32, 0usize);
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                BPF_LD_W_ABS => {
                    let k = i.k as usize;
                    a = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                BPF_LD_IMM => a = i.k,
                BPF_JA => pc += i.k as usize,
                BPF_JEQ_K => pc += if a == i.k { i.jt } else { i.jf } as usize,
                BPF_JGE_K => pc += if a >= i.k { i.jt } else { i.jf } as usize,
                BPF_RET_K => return i.k,
                other => panic!("opcode {other:#x}"),
            }
        }
    }

    /// `nr == 39 (getpid)` → kill the thread, else allow.
    const DENY_GETPID: [Insn; 4] = [
        Insn::new(BPF_LD_W_ABS, 0, 0, 0),
        Insn::new(BPF_JEQ_K, 0, 1, 39),
        Insn::new(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_THREAD),
        Insn::new(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ];

    /// What a guest's kill becomes.
    const KILL: u32 = SECCOMP_RET_TRAP | SECCOMP_KILL_DATA as u32;

    #[test]
    fn guest_sites_are_judged_and_hotpath_code_is_not() {
        let sites = [0x5555_0000_1234, 0x5555_0000_2000];
        let code = [
            (0x5555_0000_0000, 0x5555_0001_0000),
            (0x7fff_ffff_f000, 0x8000_0000_1000),
            (0xffff_ffff_ff60_0000, 0xffff_ffff_ff60_1000),
        ];
        let p = wrap(&DENY_GETPID, &sites, &code);
        for site in sites {
            assert_eq!(run(&p, site, 39), KILL, "{site:#x}");
            assert_eq!(run(&p, site, 1), SECCOMP_RET_ALLOW);
        }
        for ip in [
            0x5555_0000_0000,
            0x5555_0000_ffff,
            0x7fff_ffff_f000,
            0x7fff_ffff_ffff,
            0x8000_0000_0000,
            0x8000_0000_0fff,
        ] {
            assert_eq!(run(&p, ip, 39), SECCOMP_RET_ALLOW, "{ip:#x}");
        }
        for ip in [
            0x5555_0001_0000,
            0x4000_0000,
            0x7fff_ffff_efff,
            0x8000_0000_1000,
        ] {
            assert_eq!(run(&p, ip, 39), KILL, "{ip:#x}");
        }
    }

    #[test]
    fn maps_give_the_executable_mappings_not_the_guests() {
        let maps = "00400000-00401000 r-xp 00000000 08:01 1 /guest\n\
                    7f00-8f00 r-xp 00000000 08:01 2 /lib/libc.so.6\n\
                    9000-a000 rw-p 00000000 00:00 0\n";
        assert_eq!(
            host_code_ranges(maps, |s, _| s == 0x40_0000),
            vec![(0x7f00, 0x8f00)]
        );
    }
}
