//! hotpath's host signal handler: records asynchronous signals and sends the thread to a safe
//! point, and maps synchronous faults in translated code back to the guest instruction.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use super::*;
use crate::cache::code_cache::{HostLayout, LayoutMap};
use crate::cache::links::{exits_into, ExitKind};
use crate::cache::sorted_runs::RunsView;
use crate::host::thread_area;

fn read_fs(fsgsbase: bool) -> u64 {
    read_base(fsgsbase, false)
}

/// The calling thread's FS base (`gs == false`) or GS base: `rdfsbase`/`rdgsbase` when
/// FSGSBASE is enabled, else `arch_prctl(ARCH_GET_FS / ARCH_GET_GS)`.
fn read_base(fsgsbase: bool, gs: bool) -> u64 {
    let v: u64;
    if fsgsbase {
        // SAFETY: FSGSBASE is enabled (checked at start-up).
        unsafe {
            if gs {
                std::arch::asm!("rdgsbase {}", out(reg) v, options(nomem, nostack));
            } else {
                std::arch::asm!("rdfsbase {}", out(reg) v, options(nomem, nostack));
            }
        }
    } else {
        let mut out = 0u64;
        let code = if gs { 0x1004 } else { 0x1003 };
        raw_syscall(
            libc::SYS_arch_prctl as u64,
            &[code, &mut out as *mut u64 as u64, 0, 0, 0, 0],
        );
        v = out;
    }
    v
}

fn write_fs(fsgsbase: bool, v: u64) {
    if fsgsbase {
        // SAFETY: FSGSBASE is enabled (checked at start-up); the value is a valid FS base.
        unsafe { std::arch::asm!("wrfsbase {}", in(reg) v, options(nomem, nostack)) };
    } else {
        raw_syscall(libc::SYS_arch_prctl as u64, &[0x1002, v, 0, 0, 0, 0]);
    }
}

// libc's gregs indices.
/// Stale write faults in a row at one guest address after which the handler takes the fault
/// for the guest's own (see `HandlerShared::stale_at`). A stale fault's store succeeds when
/// it runs again; thousands in a row at one address would mean a page's protection is not
/// what the watched set says, and the guest would otherwise spin there for good.
const MAX_STALE_RETRIES: u64 = 10_000;

const REG_R8: usize = 0;
const REG_RDI: usize = 8;
const REG_RSI: usize = 9;
const REG_RBP: usize = 10;
const REG_RBX: usize = 11;
const REG_RDX: usize = 12;
const REG_RAX: usize = 13;
const REG_RCX: usize = 14;
const REG_RSP: usize = 15;
const REG_RIP: usize = 16;
const REG_EFL: usize = 17;
const REG_ERR: usize = 19;
const REG_TRAPNO: usize = 20;
const REG_CR2: usize = 22;

/// `si_code` of a single-step trap (EFLAGS.TF).
const TRAP_TRACE: i32 = 2;
/// EFLAGS bits: trap flag, resume flag, alignment check.
const EFLAGS_TF: i64 = 0x100;
const EFLAGS_RF: i64 = 0x1_0000;
const EFLAGS_AC: u64 = 0x4_0000;

/// If `sig` is a fault of `guest_mem::read_mapped`'s copy (it met an unreadable page), sends
/// the copy to its fixup, which returns what it copied, and says true. For any thread: the
/// copy needs none of the guest thread's state.
pub(crate) fn fix_probe_fault(sig: i32, ctx: *mut c_void) -> bool {
    if sig != libc::SIGSEGV && sig != libc::SIGBUS {
        return false;
    }
    // SAFETY: the kernel passes a valid ucontext.
    let gregs = unsafe { &mut (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs };
    let (probe, fixup) = guest_mem::probe_fixup();
    if gregs[REG_RIP] as u64 != probe {
        return false;
    }
    gregs[REG_RIP] = fixup as i64;
    true
}

/// hotpath's handler for every signal the kernel hands it. Runs on hotpath's alternate stack
/// with every signal blocked. Allocates nothing and takes no lock.
pub(super) extern "C" fn host_handler(sig: i32, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // The kernel keeps the interrupted EFLAGS.AC (the guest may have set it): hotpath's own
    // code must not take alignment faults.
    // SAFETY: clears one flag bit; the stack is hotpath's alternate stack.
    unsafe {
        std::arch::asm!(
            "pushfq",
            "and qword ptr [rsp], {mask}",
            "popfq",
            mask = in(reg) !EFLAGS_AC,
        )
    };
    if fix_probe_fault(sig, ctx) {
        return;
    }
    let Some(shared) = current() else {
        return;
    };
    // SAFETY: the area is never unmapped; this handler runs on the guest thread, which owns it.
    let area = unsafe { &mut *shared.area };
    // SAFETY: the kernel passes a valid ucontext and siginfo.
    let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
    let info_bytes: [u8; 128] = unsafe { std::ptr::read(info as *const [u8; 128]) };
    let gregs = &mut uc.uc_mcontext.gregs;
    let pc = gregs[REG_RIP] as u64;
    // SAFETY: this thread's handler.
    let view = unsafe { shared.view() };
    let in_cache = shared.regions().contains(pc);

    // Rust's thread-locals live behind the host FS base; translated code runs with the guest's.
    let fs = read_fs(shared.fsgsbase);
    let switched = fs != area.host_fs_base;
    if switched {
        write_fs(shared.fsgsbase, area.host_fs_base);
    }

    let si_code = i32::from_le_bytes(info_bytes[8..12].try_into().unwrap());
    if !in_cache
        && (is_fault_signal(sig) || sig == libc::SIGSYS)
        && crate::host::syscall::guest_syscall_returns().contains(&pc)
    {
        // The kernel forced this signal on the guest's system call (`uretprobe` called from
        // outside its trampoline raises SIGILL, a seccomp filter's SECCOMP_RET_TRAP raises
        // SIGSYS): the guest's, delivered as the kernel would, right after the call, even if
        // blocked or ignored.
        // SAFETY: the dispatcher is inside the guest's system call; it reads `sync` after.
        unsafe {
            *shared.sync.get() = Some(SyncFault {
                sig,
                info: info_bytes,
                rip: SyncFault::AFTER_SYSCALL,
                // Not a fault: the frame shows the thread's last trap details (`deliver`).
                trap: TrapDetails::default(),
                trace_exit: None,
            })
        };
        if switched {
            write_fs(shared.fsgsbase, fs);
        }
        return;
    }
    let synchronous = is_fault_signal(sig) && si_code > 0;
    const SEGV_ACCERR: i32 = 2;
    if sig == libc::SIGSEGV && si_code == SEGV_ACCERR && in_cache {
        let addr = u64::from_le_bytes(info_bytes[16..24].try_into().unwrap());
        // SAFETY: on the guest thread, for a fault in translated code.
        let mut caught = unsafe { shared.smc.catch_write(addr) };
        if caught == crate::cache::smc::CaughtWrite::Stale {
            let again = shared.stale_at.swap(addr, Ordering::Relaxed) == addr;
            let n = match again {
                true => shared.stale_count.fetch_add(1, Ordering::Relaxed) + 1,
                false => {
                    shared.stale_count.store(1, Ordering::Relaxed);
                    1
                }
            };
            if n > MAX_STALE_RETRIES {
                caught = crate::cache::smc::CaughtWrite::No;
            }
        }
        if caught == crate::cache::smc::CaughtWrite::Stale {
            // Another thread gave the page its protection back after this store faulted:
            // the store runs again, and nothing else is to do.
            if switched {
                write_fs(shared.fsgsbase, fs);
            }
            return;
        }
        if caught == crate::cache::smc::CaughtWrite::Caught {
            shared.stale_count.store(0, Ordering::Relaxed);
            // A store to a page whose code was translated: it runs again now that the page
            // is writable; the thread leaves the cache at its next block boundary, where
            // the dispatcher discards the page's translations. So does every other thread,
            // before the store runs: none enters a translation of the page after it.
            shared.unlink_for_caught_write(area);
            for peer in shared.smc.peers() {
                // SAFETY: peers are `'static` handler states of this process's threads.
                let peer = unsafe { &*(peer as *const HandlerShared) };
                if !std::ptr::eq(peer, shared) {
                    peer.kick();
                }
            }
            if switched {
                write_fs(shared.fsgsbase, fs);
            }
            return;
        }
    }
    if sig == libc::SIGTRAP && si_code == TRAP_TRACE && in_cache {
        // EFLAGS.TF reached translated code, where every host instruction would trap,
        // hotpath's stubs included. Single-stepping goes through the dispatcher (`popf` and
        // `iretq` are carried out there, stepped code runs with TF clear), so this is a bug in
        // hotpath: stop stepping and leave the cache; the dispatcher stops with a message.
        gregs[REG_EFL] &= !EFLAGS_TF;
        // SAFETY: this thread's handler, for a PC in translated code.
        let layouts = unsafe { view.blocks.read_in_handler() };
        let at = capture_fault(layouts, pc, gregs, area).map_or(0, |(rip, _)| rip);
        area.fs_base = fs;
        // SAFETY: the dispatcher is interrupted; only this handler writes `refused` now.
        unsafe {
            *shared.refused.get() = Some((
                "set EFLAGS.TF in a way hotpath did not follow (internal error, a bug in hotpath)",
                at,
            ))
        };
        gregs[REG_RIP] = view.exit_from_signal as i64;
        if switched {
            write_fs(shared.fsgsbase, fs);
        }
        return;
    }
    if synchronous {
        if in_cache {
            // SAFETY: this thread's handler, for a PC in translated code.
            let layouts = unsafe { view.blocks.read_in_handler() };
            if let Some((rip, l)) = capture_fault(layouts, pc, gregs, area) {
                area.fs_base = fs;
                let trapno = gregs[REG_TRAPNO] as u64;
                let trap = TrapDetails {
                    trapno,
                    err: gregs[REG_ERR] as u64,
                    cr2: if trapno == 14 {
                        gregs[REG_CR2] as u64
                    } else {
                        0
                    },
                    rf: gregs[REG_EFL] & EFLAGS_RF != 0,
                };
                let mut info = info_bytes;
                let addr = u64::from_le_bytes(info[16..24].try_into().unwrap());
                if addr == pc {
                    // SIGFPE, SIGILL, SIGTRAP: the kernel gives the faulting instruction's
                    // address, which is the guest's.
                    info[16..24].copy_from_slice(&rip.to_le_bytes());
                }
                // SAFETY: the dispatcher is interrupted; only this handler writes `sync` now.
                unsafe {
                    *shared.sync.get() = Some(SyncFault {
                        sig,
                        info,
                        rip,
                        trap,
                        trace_exit: l.trace_exit,
                    })
                };
                gregs[REG_RIP] = view.exit_from_signal as i64;
                if switched {
                    write_fs(shared.fsgsbase, fs);
                }
                return;
            }
        }
        // A fault in hotpath itself: report it and let it happen again with the default
        // action, which ends the process with the same signal.
        let addr = u64::from_le_bytes(info_bytes[16..24].try_into().unwrap());
        let mut msg = [0u8; 160];
        let mut len = 0;
        for (text, value) in [
            (
                &b"hotpath: internal error: fault in hotpath's own code (signal "[..],
                sig as u64,
            ),
            (b", code ", si_code as u64),
            (b", pc ", pc),
            (b", address ", addr),
        ] {
            len = append(&mut msg, len, text);
            len = append_hex(&mut msg, len, value);
        }
        len = append(
            &mut msg,
            len,
            if in_cache {
                b", in the code cache)\n"
            } else {
                b")\n"
            },
        );
        raw_syscall(
            libc::SYS_write as u64,
            &[2, msg.as_ptr() as u64, len as u64, 0, 0, 0],
        );
        // SAFETY: zeroed sigaction with SIG_DFL.
        let mut k: libc::sigaction = unsafe { std::mem::zeroed() };
        k.sa_sigaction = libc::SIG_DFL;
        kernel_sigaction(sig, Some(&k), None);
        return;
    }

    // Asynchronous: record it and make the thread reach a safe point soon.
    // SAFETY: the dispatcher reads a slot only with every signal blocked.
    unsafe { (&mut *shared.infos.get())[sig as usize - 1].push(sig, info_bytes) };
    shared.pending.fetch_or(1 << (sig - 1), Ordering::AcqRel);
    // The kernel let the signal through, so the guest's mask does too: it is deliverable.
    // SAFETY: this thread's own area; the dispatcher it interrupted writes the field only
    // with every signal blocked.
    unsafe { std::ptr::write_volatile(&mut area.gate_pending, 1) };
    let (gate, gate_insn, refused) = crate::host::syscall::gate_addresses();
    if pc >= gate && pc <= gate_insn {
        // Interrupted on its way into a system call: do not let the call block.
        gregs[REG_RIP] = refused as i64;
    }
    shared.unlink_from_handler(area);
    if switched {
        write_fs(shared.fsgsbase, fs);
    }
}

/// Copies `text` into `buf` at `at` (as much as fits); returns the new length. For messages
/// written from the handler, which may not allocate.
fn append(buf: &mut [u8], at: usize, text: &[u8]) -> usize {
    let n = text.len().min(buf.len() - at);
    buf[at..at + n].copy_from_slice(&text[..n]);
    at + n
}

/// Appends `v` as `0x` and lowercase hexadecimal digits, without leading zeros.
fn append_hex(buf: &mut [u8], at: usize, v: u64) -> usize {
    let mut digits = [0u8; 18];
    digits[..2].copy_from_slice(b"0x");
    let width = (16 - v.leading_zeros() as usize / 4).max(1);
    for i in 0..width {
        let d = ((v >> (4 * (width - 1 - i))) & 0xf) as u8;
        digits[2 + i] = if d < 10 { b'0' + d } else { b'a' + d - 10 };
    }
    append(buf, at, &digits[..2 + width])
}

/// The calling guest thread's handler state, through its GS base (`None` on a thread that
/// runs no guest: GS base 0, or an area without handler state).
fn current() -> Option<&'static HandlerShared> {
    let gs = read_base(FSGSBASE.load(Ordering::Relaxed), true);
    if gs == 0 {
        return None;
    }
    // SAFETY: a non-zero GS base is always a thread area hotpath installed (the guest cannot
    // set GS), mapped for the process's life; `handler` is 0 or a leaked `HandlerShared`.
    let h = unsafe { (*(gs as *const ThreadArea)).handler };
    // SAFETY: see above.
    (h != 0).then(|| unsafe { &*(h as *const HandlerShared) })
}

/// Points every chained direct branch back at its exit stub, empties the indirect branch
/// lookup table and points the jump tables' entries at their fill stubs, so that translated
/// code returns to the dispatcher at its next block boundary.
/// Runs in the signal handler while the dispatcher is outside its critical sections, or on
/// the dispatcher's own request (`SignalState::unlink_now`).
pub(super) fn unlink_all(shared: &HandlerShared, area: &mut ThreadArea) {
    unlink_exits(shared, |_| true);
    // Only the tags: a lookup this handler interrupted between its tag check and its load of
    // the host address must still load a valid block entry (the blocks themselves stay).
    area.forget_all_ibl();
    // Jump tables too: each entry back to its site's fill stub (always a valid target).
    area.unlink_jump_tables();
}

/// Undoes the links of the exits that go to one of the guest addresses `targets` (the
/// direct links into those blocks) and empties their lookup-table slots, so that the next
/// transfer to one of them comes to the dispatcher; the other links stay. Same contract as
/// [`unlink_all`]. The links are found in the dispatcher's list of linked exits, not among
/// all its exits: reading a large program's exit table (3.8 MB for a warm `python3 -c pass`)
/// for each superblock request kept its thread waiting for `critical`.
pub(super) fn unlink_into(shared: &HandlerShared, area: &mut ThreadArea, targets: &[u64]) {
    let ptr = shared.linked.load(Ordering::Relaxed);
    let len = shared.linked_len.load(Ordering::Relaxed) as usize;
    let starts_ptr = shared.linked_starts.load(Ordering::Relaxed);
    let starts_len = shared.linked_starts_len.load(Ordering::Relaxed) as usize;
    if !ptr.is_null() {
        // SAFETY: published by the dispatcher, which is not changing them (not critical).
        let items = unsafe { std::slice::from_raw_parts(ptr, len) };
        let starts = if starts_ptr.is_null() {
            &[][..]
        } else {
            // SAFETY: as `linked`.
            unsafe { std::slice::from_raw_parts(starts_ptr, starts_len) }
        };
        let sorted = shared.linked_sorted.load(Ordering::Relaxed) as usize;
        let linked = RunsView {
            items,
            starts,
            sorted,
        };
        let exits = exits_into(linked, targets);
        unlink_listed(shared, exits.map(|e| e as usize));
    }
    for &t in targets {
        area.forget_ibl(t);
    }
}

/// Points every linked exit that `which` selects back at its exit stub, in the exit table
/// the dispatcher published.
fn unlink_exits(shared: &HandlerShared, which: impl Fn(&ExitKind) -> bool) {
    let exits = published_exits(shared);
    unlink_listed(shared, (0..exits.len()).filter(|&i| which(&exits[i].kind)));
}

/// The exit table the dispatcher published (empty before it published one). Only while the
/// dispatcher is not changing it: from its thread's handler outside critical sections, or
/// from a thread that holds its `critical` flag.
fn published_exits(shared: &HandlerShared) -> &[Exit] {
    let ptr = shared.exits.load(Ordering::Relaxed);
    if ptr.is_null() {
        return &[];
    }
    let len = shared.exits_len.load(Ordering::Relaxed) as usize;
    // SAFETY: published by the dispatcher, which is not changing it (see above).
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// Points the exits with the indices `which` (in the exit table the dispatcher published;
/// an index past it is skipped) back at their exit stubs.
fn unlink_listed(shared: &HandlerShared, which: impl Iterator<Item = usize>) {
    let exits = published_exits(shared);
    let regions = shared.regions();
    for e in which.filter_map(|i| exits.get(i)) {
        let Some((site, stub)) = e.kind.link_site() else {
            continue;
        };
        let Some((_, _, delta)) = regions.find(site.0) else {
            continue;
        };
        let rel = (stub.0 as i64 - (site.0 as i64 + 4)) as i32;
        // SAFETY: the site is a 4-byte aligned rel32 (`emit::patchable_jmp`) inside the code
        // cache's writable view. One atomic store: the owner may be running this very branch
        // when another thread kicks it, and must fetch either the old or the new
        // displacement, never a mix.
        unsafe {
            std::sync::atomic::AtomicU32::from_ptr(site.0.wrapping_add(delta) as *mut u32)
                .store(rel as u32, Ordering::Relaxed)
        };
    }
}

/// Maps a fault at host `pc` back to the guest: fills the area's GPRs and RFLAGS with the
/// guest's values at the faulting instruction and returns its guest address with the layout of
/// its block (which says the superblock side exit it is in), or `None`
/// when `pc` is not at a guest instruction (a fault in hotpath's own stubs).
fn capture_fault<'a>(
    layouts: &'a LayoutMap,
    pc: u64,
    gregs: &[i64; 23],
    area: &mut ThreadArea,
) -> Option<(u64, &'a HostLayout)> {
    let l = layouts.floor(pc)?;
    if pc >= l.code_end {
        return None;
    }
    let mut regs = [0u64; 16];
    let from_gregs = [
        (thread_area::RAX, REG_RAX),
        (thread_area::RCX, REG_RCX),
        (thread_area::RDX, REG_RDX),
        (3, REG_RBX),
        (thread_area::RSP, REG_RSP),
        (5, REG_RBP),
        (thread_area::RSI, REG_RSI),
        (thread_area::RDI, REG_RDI),
    ];
    for (slot, g) in from_gregs {
        regs[slot] = gregs[g] as u64;
    }
    for i in 0..8 {
        regs[8 + i] = gregs[REG_R8 + i] as u64;
    }
    let rip = if let Ok(i) = l.body.binary_search_by_key(&pc, |&(h, _)| h) {
        l.body[i].1
    } else if pc >= l.term_start {
        if l.rcx_borrowed_from.is_some_and(|from| pc >= from) {
            regs[thread_area::RCX] = area.scratch_rcx;
        }
        l.term_guest
    } else {
        return None;
    };
    if let Some(&(_, reg)) = l.far_borrows.iter().find(|&&(h, _)| h == pc) {
        regs[reg as usize] = area.scratch_far;
    }
    area.gpr = regs;
    area.rflags = gregs[REG_EFL] as u64;
    Some((rip, l))
}

#[cfg(test)]
mod tests {
    use super::{append, append_hex};

    #[test]
    fn hex_without_allocation() {
        let mut buf = [0u8; 64];
        let mut n = append(&mut buf, 0, b"pc ");
        n = append_hex(&mut buf, n, 0x7fff_0000_12ab);
        n = append(&mut buf, n, b" zero ");
        n = append_hex(&mut buf, n, 0);
        n = append(&mut buf, n, b" max ");
        n = append_hex(&mut buf, n, u64::MAX);
        assert_eq!(
            std::str::from_utf8(&buf[..n]).unwrap(),
            "pc 0x7fff000012ab zero 0x0 max 0xffffffffffffffff"
        );
        let mut small = [0u8; 4];
        assert_eq!(
            append_hex(&mut small, 0, 0x1234),
            4,
            "truncated to the buffer"
        );
    }
}
