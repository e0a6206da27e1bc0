//! Guest instructions the dispatcher handles itself instead of running them translated, and
//! the faults it raises for them exactly as the kernel reports them: traps and interrupts
//! (`int3`, `icebp`, `int n`, `hlt`), code that cannot be fetched, control transfers to
//! non-canonical addresses, the legacy vsyscall page, far returns and `iretq` to the 64-bit
//! user code segment, `popf` and single-stepping (EFLAGS.TF), and `xbegin`.
//!
//! What the kernel gives (Linux `arch/x86/kernel/traps.c`, checked against native runs by
//! `tests/tests/faults.rs`): a trap (`int3`, `int $3`, `icebp`, `int $4`) reports the address
//! after the instruction with EFLAGS.RF clear; a fault reports the instruction with RF set.
//! `int3` is SIGTRAP/SI_KERNEL, trap 3; `icebp` SIGTRAP/TRAP_BRKPT, trap 1, reported at
//! the next instruction or at itself as this machine does (it differs between machines of one
//! vendor, so it is probed: [`icebp_reports_next`]); `int $4` SIGSEGV/SI_KERNEL, trap 4; any
//! other `int n` a #GP whose error code names the IDT entry (`n << 3 | 2`); `hlt`, `in`,
//! `out`, `cli` a #GP with error code 0.

use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic};

use hotpath_ir::TrapKind;

use crate::cache::smc::MapsCache;
use crate::frontend::decode::is_system_instruction;
use crate::host::cpu::set_guest_pkru;
use crate::host::guest_mem;
use crate::host::syscall::raw_syscall;
use crate::host::thread_area::{self, ThreadArea};
pub use crate::linux::signals::{GuestFault, TrapDetails};

/// What the dispatcher does with a trapping or special instruction.
#[derive(Debug)]
pub enum Action {
    /// Deliver this fault to the guest.
    Raise(GuestFault),
    /// The instruction was carried out here: go on at this guest address.
    Continue(u64),
    /// hotpath does not support it: stop with this reason (the instruction is named).
    Refuse(String),
}

/// `si_code` of a signal the kernel raised for a trap without an address (#GP, int3).
pub const SI_KERNEL: i32 = 0x80;
const ILL_ILLOPN: i32 = 2;
/// `si_code` of SIGSEGV: nothing mapped at the address.
pub const SEGV_MAPERR: i32 = 1;
/// `si_code` of SIGSEGV: the mapping forbids the access.
pub const SEGV_ACCERR: i32 = 2;
/// SIGBUS code: a nonexistent physical address (a file page past the end of the file).
const BUS_ADRERR: i32 = 2;
const TRAP_BRKPT: i32 = 1;

/// x86 exception vectors (`X86_TRAP_*`).
const TRAP_DB: u64 = 1;
const TRAP_BP: u64 = 3;
const TRAP_OF: u64 = 4;
const TRAP_UD: u64 = 6;
/// #SS, the stack-segment fault.
pub const TRAP_SS: u64 = 12;
/// #GP, the general-protection fault.
pub const TRAP_GP: u64 = 13;
const TRAP_PF: u64 = 14;

/// Page-fault error code bits: page present, user mode, instruction fetch.
const PF_PROT: u64 = 1;
const PF_USER: u64 = 4;
const PF_INSTR: u64 = 0x10;

/// The 64-bit user code and stack segment selectors (`__USER_CS`, `__USER_DS`).
const USER_CS: u64 = 0x33;
const USER_SS: u64 = 0x2b;
/// The 32-bit user code segment (`__USER32_CS`): a far transfer there leaves 64-bit mode.
const USER32_CS: u64 = 0x23;

/// The legacy vsyscall page: its three entries are 1024 bytes apart.
pub const VSYSCALL_PAGE: u64 = 0xffff_ffff_ff60_0000;
const VSYSCALL_ENTRIES: [(u64, u64); 3] = [
    (0x000, libc::SYS_gettimeofday as u64),
    (0x400, libc::SYS_time as u64),
    (0x800, libc::SYS_getcpu as u64),
];

/// True if `addr` is canonical with 48-bit virtual addresses (bits 63..47 all equal).
pub fn canonical(addr: u64) -> bool {
    let top = (addr as i64) >> 47;
    top == 0 || top == -1
}

/// A fault at guest `rip` (the instruction is restarted: EFLAGS.RF set).
fn fault(sig: i32, code: i32, addr: u64, rip: u64, trapno: u64, err: u64) -> GuestFault {
    GuestFault {
        sig,
        code,
        addr,
        rip,
        trap: TrapDetails {
            trapno,
            err,
            cr2: 0,
            rf: true,
        },
    }
}

/// A trap reported at `next`, after the instruction (EFLAGS.RF clear).
fn trap_after(sig: i32, code: i32, addr: u64, next: u64, trapno: u64) -> GuestFault {
    GuestFault {
        sig,
        code,
        addr,
        rip: next,
        trap: TrapDetails {
            trapno,
            err: 0,
            cr2: 0,
            rf: false,
        },
    }
}

/// A general-protection fault at `rip` with error code `err`: SIGSEGV, SI_KERNEL, no address.
fn general_protection(rip: u64, err: u64) -> GuestFault {
    fault(libc::SIGSEGV, SI_KERNEL, 0, rip, TRAP_GP, err)
}

/// The guest instruction at `at`, decoded again (`None` if its bytes cannot be read).
fn decode_at(at: u64) -> Option<Instruction> {
    let mut bytes = [0u8; 15];
    let n = guest_mem::read_partial(at, &mut bytes);
    let inst = Decoder::with_ip(64, &bytes[..n], at, DecoderOptions::NONE).decode();
    (!inst.is_invalid()).then_some(inst)
}

/// Decides what a block's trapping terminator (`kind`, the instruction at guest `at`, the
/// next at `next`) does.
pub fn trap(
    kind: TrapKind,
    at: u64,
    next: u64,
    maps: &mut MapsCache,
    area: &mut ThreadArea,
) -> Action {
    let inst = decode_at(at);
    let code = inst.map(|i| i.code());
    match kind {
        TrapKind::Breakpoint if code == Some(Code::Int1) => {
            // A trap after it on some machines, the instruction itself (RF still clear) on
            // others: as this one does natively.
            let rip = if icebp_reports_next() { next } else { at };
            Action::Raise(trap_after(libc::SIGTRAP, TRAP_BRKPT, rip, rip, TRAP_DB))
        }
        TrapKind::Breakpoint => {
            Action::Raise(trap_after(libc::SIGTRAP, SI_KERNEL, 0, next, TRAP_BP))
        }
        TrapKind::Privileged => match inst {
            // `int $4` is #OF through a gate user mode may use: a trap, SIGSEGV.
            Some(i) if i.code() == Code::Int_imm8 && i.immediate8() == 4 => {
                Action::Raise(trap_after(libc::SIGSEGV, SI_KERNEL, 0, next, TRAP_OF))
            }
            // Any other gate is the kernel's: #GP naming the IDT entry.
            Some(i) if i.code() == Code::Int_imm8 => {
                Action::Raise(general_protection(at, (i.immediate8() as u64) << 3 | 2))
            }
            _ => Action::Raise(general_protection(at, 0)),
        },
        TrapKind::Undefined => Action::Raise(fault(libc::SIGILL, ILL_ILLOPN, at, at, TRAP_UD, 0)),
        TrapKind::FetchFault => Action::Raise(fetch_fault(at, maps)),
        TrapKind::Unsupported => match inst {
            Some(i) => unsupported(&i, at, area),
            None => Action::Refuse(format!("unreadable instruction at {at:#x}")),
        },
    }
}

/// The page fault of fetching the instruction at `at` whose byte at `addr` is in memory the
/// guest does not have (hotpath's own): SIGSEGV, SEGV_MAPERR, as where nothing is mapped.
pub fn fetch_fault_unmapped(at: u64, addr: u64) -> GuestFault {
    let mut f = fault(
        libc::SIGSEGV,
        SEGV_MAPERR,
        addr,
        at,
        TRAP_PF,
        PF_USER | PF_INSTR,
    );
    f.trap.cr2 = addr;
    f
}

/// The page fault of fetching the instruction at `at`, whose bytes stop being readable and
/// executable somewhere in its first 15: SIGSEGV at the first byte that cannot be fetched,
/// SEGV_MAPERR where nothing is mapped, SEGV_ACCERR where the mapping forbids it.
pub fn fetch_fault(at: u64, maps: &mut MapsCache) -> GuestFault {
    let mut bytes = [0u8; 15];
    let readable = guest_mem::read_partial(at, &mut bytes) as u64;
    let addr = at + fetchable(at, readable, maps);
    let prot = maps.prot(addr);
    // The kernel says SIGBUS for a page of a file past its end (mapped executable and
    // readable, yet unreadable), not the kernel's execute-only [vsyscall] page above user space.
    const USER_SPACE_END: u64 = 1 << 47;
    if prot.is_some_and(|p| p & libc::PROT_EXEC != 0 && p & libc::PROT_READ != 0)
        && addr < USER_SPACE_END
    {
        let mut f = fault(
            libc::SIGBUS,
            BUS_ADRERR,
            addr,
            at,
            TRAP_PF,
            PF_USER | PF_INSTR,
        );
        f.trap.cr2 = addr;
        return f;
    }
    let (code, present) = match prot {
        None => (SEGV_MAPERR, 0),
        Some(p) if p & libc::PROT_READ != 0 => (SEGV_ACCERR, PF_PROT),
        Some(_) => (SEGV_ACCERR, 0),
    };
    let mut f = fault(
        libc::SIGSEGV,
        code,
        addr,
        at,
        TRAP_PF,
        PF_USER | PF_INSTR | present,
    );
    f.trap.cr2 = addr;
    f
}

/// How many of the `len` bytes at guest `addr` (readable ones) may be executed: up to the
/// first page whose mapping is not executable.
pub fn fetchable(addr: u64, len: u64, maps: &mut MapsCache) -> u64 {
    const PAGE: u64 = 4096;
    let mut page = addr & !(PAGE - 1);
    while page < addr + len {
        if maps.prot(page).is_none_or(|p| p & libc::PROT_EXEC == 0) {
            return page.saturating_sub(addr);
        }
        page += PAGE;
    }
    len
}

/// Instructions hotpath's translator leaves to the dispatcher: emulated when their effect is
/// plain (a far return or `iretq` to the 64-bit user code segment, `xbegin`), else refused.
fn unsupported(i: &Instruction, at: u64, area: &mut ThreadArea) -> Action {
    let text = || {
        use iced_x86::Formatter;
        let mut out = String::new();
        iced_x86::IntelFormatter::new().format(i, &mut out);
        out
    };
    match i.mnemonic() {
        _ if is_system_instruction(i) => match probe_system_instruction(at, i.len()) {
            Some(f) => Action::Raise(f),
            None => Action::Refuse(format!(
                "{} (a system instruction that does not fault on this machine)",
                text()
            )),
        },
        Mnemonic::Retf => far_return(i, at, area, &text()),
        Mnemonic::Iretq => iretq(at, area),
        Mnemonic::Xbegin if !xbegin_runs() => {
            Action::Raise(fault(libc::SIGILL, ILL_ILLOPN, at, at, TRAP_UD, 0))
        }
        // A transaction may always abort: EAX holds the abort status (0: no retry hint)
        // and execution goes on at the fallback address.
        Mnemonic::Xbegin => {
            area.gpr[thread_area::RAX] = 0;
            Action::Continue(i.near_branch_target())
        }
        Mnemonic::Wrpkru => wrpkru(at, i.next_ip(), area),
        Mnemonic::Popf | Mnemonic::Popfq => popf(i, at, area),
        Mnemonic::Jmp | Mnemonic::Call => Action::Refuse(format!(
            "{} (a far {} through memory; its operand size differs between Intel and AMD CPUs)",
            text(),
            if i.mnemonic() == Mnemonic::Jmp {
                "jump"
            } else {
                "call"
            }
        )),
        Mnemonic::Iret | Mnemonic::Iretd => {
            Action::Refuse(format!("{} (an iret with a 16- or 32-bit frame)", text()))
        }
        Mnemonic::Int if i.immediate8() == 0x80 => Action::Refuse(format!(
            "{} (a 32-bit system call from 64-bit code)",
            text()
        )),
        // Writing what is already there (selector 0, base 0) changes nothing.
        _ if crate::frontend::decode::writes_gs(i) && writes_zero_to_gs(i, area) => {
            Action::Continue(i.next_ip())
        }
        _ if crate::frontend::decode::writes_gs(i) => Action::Refuse(format!(
            "{} (it changes GS, where hotpath keeps its per-thread state)",
            text()
        )),
        _ => Action::Refuse(text()),
    }
}

/// What the system instruction at guest `at` (`len` bytes) does in user mode on this machine,
/// probed once per instruction encoding by running it in a forked child with a handler for
/// every fault signal: the fault to raise in the guest, exactly as the kernel reported it to
/// the child (signal, `si_code`, address and RIP relative to the instruction, trap number,
/// error code), or `None` if it did not fault there (a hypervisor that answers `vmmcall`).
fn probe_system_instruction(at: u64, len: usize) -> Option<GuestFault> {
    /// An encoding probed, and what the child saw (see `probe_in_child`).
    type Probed = (Vec<u8>, Option<[u64; 6]>);
    static PROBED: std::sync::Mutex<Vec<Probed>> = std::sync::Mutex::new(Vec::new());
    let mut bytes = [0u8; 15];
    let n = guest_mem::read_partial(at, &mut bytes).min(len);
    let bytes = bytes[..n].to_vec();
    let found = {
        let mut probed = PROBED.lock().unwrap_or_else(|e| e.into_inner());
        match probed.iter().find(|(b, _)| *b == bytes) {
            Some((_, r)) => *r,
            None => {
                let r = probe_in_child(&bytes);
                probed.push((bytes, r));
                r
            }
        }
    };
    let [sig, code, addr_off, rip_off, trapno, err] = found?;
    let addr = if addr_off == u64::MAX {
        0
    } else {
        at.wrapping_add(addr_off)
    };
    let mut f = fault(
        sig as i32,
        code as i32,
        addr,
        at.wrapping_add(rip_off),
        trapno,
        err,
    );
    // A trap reports the next instruction with RF clear, a fault the instruction with RF set.
    f.trap.rf = rip_off == 0;
    Some(f)
}

/// Runs `code` (one instruction) in a forked child: `[signal, si_code, si_addr − start
/// (u64::MAX for none), RIP − start, trap number, error code]` of the fault it raised, or
/// `None` if it ran on (or the probe could not run).
fn probe_in_child(code: &[u8]) -> Option<[u64; 6]> {
    use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
    static START: AtomicU64 = AtomicU64::new(0);
    static PIPE: AtomicI32 = AtomicI32::new(-1);
    extern "C" fn on_fault(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let start = START.load(Ordering::Relaxed);
        // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler.
        let (addr, g) = unsafe {
            (
                (*info).si_addr() as u64,
                (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs,
            )
        };
        let code = unsafe { (*info).si_code };
        let out: [u64; 6] = [
            sig as u64,
            code as u64,
            if addr == 0 {
                u64::MAX
            } else {
                addr.wrapping_sub(start)
            },
            (g[libc::REG_RIP as usize] as u64).wrapping_sub(start),
            g[libc::REG_TRAPNO as usize] as u64,
            g[libc::REG_ERR as usize] as u64,
        ];
        // SAFETY: async-signal-safe; the child ends here.
        unsafe {
            libc::write(PIPE.load(Ordering::Relaxed), out.as_ptr().cast(), 48);
            libc::_exit(0);
        }
    }
    let mut fds = [0i32; 2];
    // SAFETY: a pipe for the child's answer; both ends are closed below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    let code = code.to_vec();
    // SAFETY: the child maps a page, installs handlers, runs the instruction and `_exit`s, all
    // async-signal-safe (no allocation: `code` was copied before the fork).
    let status = run_in_child(|| unsafe {
        PIPE.store(fds[1], Ordering::Relaxed);
        let page = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        ) as *mut u8;
        if page as *mut libc::c_void == libc::MAP_FAILED {
            libc::_exit(2);
        }
        std::ptr::copy_nonoverlapping(code.as_ptr(), page, code.len());
        // `ret` after it: an instruction that runs on comes back here.
        *page.add(code.len()) = 0xc3;
        START.store(page as u64, Ordering::Relaxed);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_fault as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [
            libc::SIGSEGV,
            libc::SIGILL,
            libc::SIGTRAP,
            libc::SIGBUS,
            libc::SIGFPE,
        ] {
            libc::sigaction(sig, &sa, std::ptr::null_mut());
            libc::sigaddset(&mut set, sig);
        }
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        // The 32-bit system call `sysenter` may become on some CPUs: getpid's number there.
        std::arch::asm!(
            "call {page}",
            page = in(reg) page,
            inout("eax") 20 => _,
            out("rcx") _,
            out("rdx") _,
            out("r11") _,
            clobber_abi("C"),
        );
        libc::_exit(1);
    });
    let mut out = [0u64; 6];
    // SAFETY: reading what the child wrote (48 bytes, or nothing); the ends are ours.
    let n = unsafe {
        libc::close(fds[1]);
        let n = libc::read(fds[0], out.as_mut_ptr().cast(), 48);
        libc::close(fds[0]);
        n
    };
    let exited = status.is_some_and(|s| libc::WIFEXITED(s) && libc::WEXITSTATUS(s) == 0);
    (exited && n == 48).then_some(out)
}

/// EFLAGS.TF: single-step (a #DB trap after each instruction).
pub const EFLAGS_TF: u64 = 0x100;
/// EFLAGS.RF and VM: `pushf` stores them clear.
const EFLAGS_RF_VM: u64 = 0x1_0000 | 0x2_0000;

/// `popf` / `popfq`: the flags user code may change (CF PF AF ZF SF TF DF OF, NT, AC, ID; not
/// IF or IOPL) from the stack. Run here so that a TF it sets is seen before the next
/// instruction (the dispatcher then single-steps).
fn popf(i: &Instruction, at: u64, area: &mut ThreadArea) -> Action {
    let (size, mask): (u64, u64) = if i.code() == Code::Popfw {
        (2, 0x4dd5 | EFLAGS_TF)
    } else {
        (8, 0x4dd5 | EFLAGS_TF | 0x4_0000 | 0x20_0000)
    };
    let rsp = area.gpr[thread_area::RSP];
    let mut buf = [0u8; 8];
    if guest_mem::read(rsp, &mut buf[..size as usize]).is_err() {
        return Action::Raise(stack_fault(rsp, at));
    }
    let flags = u64::from_le_bytes(buf);
    area.rflags = (area.rflags & !mask) | (flags & mask) | 2;
    area.gpr[thread_area::RSP] = rsp.wrapping_add(size);
    Action::Continue(i.next_ip())
}

/// One single-step while EFLAGS.TF is set, for the instruction at `pc`, if the dispatcher
/// carries it out itself: `pushf` must store TF set (the translated instruction runs with the
/// host's TF clear). Returns the fault it raises (`None`: translate and run the instruction).
pub fn step_here(pc: u64, area: &mut ThreadArea) -> Option<Action> {
    let i = decode_at(pc)?;
    let size: u64 = match i.code() {
        Code::Pushfq => 8,
        Code::Pushfw => 2,
        _ => return None,
    };
    let rsp = area.gpr[thread_area::RSP].wrapping_sub(size);
    let image = (area.rflags & !EFLAGS_RF_VM).to_le_bytes();
    if guest_mem::write(rsp, &image[..size as usize]).is_err() {
        let mut f = fault(libc::SIGSEGV, SEGV_MAPERR, rsp, pc, TRAP_PF, PF_USER | 2);
        f.trap.cr2 = rsp;
        return Some(Action::Raise(f));
    }
    area.gpr[thread_area::RSP] = rsp;
    Some(Action::Raise(single_step(i.next_ip())))
}

/// The trap after a single-stepped instruction, reported at `next`: SIGTRAP, TRAP_TRACE,
/// trap 1.
pub fn single_step(next: u64) -> GuestFault {
    const TRAP_TRACE: i32 = 2;
    trap_after(libc::SIGTRAP, TRAP_TRACE, next, next, TRAP_DB)
}

/// True if the guest instruction at `pc` has a GS-relative memory operand.
pub fn gs_relative(pc: u64) -> bool {
    decode_at(pc).is_some_and(|i| crate::frontend::decode::gs_memory(&i))
}

/// True if single-stepping the instruction at `pc` ends in a trap after it: not after
/// `syscall` (the kernel's return to user mode does not report one; the next instruction's
/// trap comes as usual).
pub fn traps_after_step(pc: u64) -> bool {
    decode_at(pc).is_none_or(|i| i.code() != Code::Syscall)
}

/// True if the instruction at `pc` leaves through the indirect branch lookup (a single-step
/// block of it must not find another block there).
pub fn is_indirect(pc: u64) -> bool {
    decode_at(pc).is_some_and(|i| {
        matches!(
            i.flow_control(),
            FlowControl::IndirectBranch | FlowControl::IndirectCall | FlowControl::Return
        )
    })
}

/// `wrpkru` on a host with protection keys: hotpath's own memory has key 0 and the guest's
/// PKRU is live while hotpath runs (it is part of the XSAVE state swapped at each
/// transition), so a value that denies access or writes to key 0 is refused; any other is
/// written into the guest's saved PKRU, which the next entry to the cache loads. ECX and EDX
/// must be 0 (#GP otherwise).
fn wrpkru(at: u64, next: u64, area: &mut ThreadArea) -> Action {
    let g = &area.gpr;
    if g[thread_area::RCX] as u32 != 0 || g[thread_area::RDX] as u32 != 0 {
        return Action::Raise(general_protection(at, 0));
    }
    let pkru = g[thread_area::RAX] as u32;
    if pkru & 3 != 0 {
        return Action::Refuse(format!(
            "wrpkru {pkru:#x} (it denies access or writes to protection key 0, which hotpath's own memory uses)"
        ));
    }
    if !set_guest_pkru(&mut area.xsave.0, pkru) {
        return Action::Refuse("wrpkru (no room for PKRU in the saved state)".into());
    }
    Action::Continue(next)
}

/// True if `i` (which writes GS) writes the null selector or base 0 from a register: the
/// guest's GS is then what it was (selector 0, base 0), natively too.
fn writes_zero_to_gs(i: &Instruction, area: &ThreadArea) -> bool {
    use iced_x86::{OpKind, Register};
    let src = match i.mnemonic() {
        Mnemonic::Wrgsbase => 0,
        Mnemonic::Mov => 1,
        _ => return false,
    };
    if i.op_kind(src) != OpKind::Register {
        return false;
    }
    let reg = i.op_register(src).full_register();
    let index = reg as usize - Register::RAX as usize;
    index < 16 && area.gpr[index] as u32 as u16 == 0 && (src == 1 || area.gpr[index] == 0)
}

/// `lret` / `lretq` (with its `imm16`): pops the return address and the code selector. To
/// 0x33 it is a plain return; to 0x23 (32-bit code) it is refused; to any other selector the
/// CPU raises #GP with the selector as its error code.
fn far_return(i: &Instruction, at: u64, area: &mut ThreadArea, text: &str) -> Action {
    let size: u64 = match i.code() {
        Code::Retfq | Code::Retfq_imm16 => 8,
        Code::Retfd | Code::Retfd_imm16 => 4,
        _ => return Action::Refuse(format!("{text} (a far return with a 16-bit frame)")),
    };
    let imm = match i.code() {
        Code::Retfq_imm16 | Code::Retfd_imm16 => i.immediate16() as u64,
        _ => 0,
    };
    let rsp = area.gpr[thread_area::RSP];
    let Some([rip, cs]) = read_stack::<2>(rsp, size) else {
        return Action::Raise(stack_fault(rsp, at));
    };
    match cs & 0xffff {
        USER_CS => {
            area.gpr[thread_area::RSP] = rsp.wrapping_add(2 * size + imm);
            Action::Continue(rip)
        }
        USER32_CS => Action::Refuse(format!("{text} (to 32-bit code, selector 0x23)")),
        sel => Action::Raise(general_protection(at, sel & 0xfffc)),
    }
}

/// `iretq`: pops RIP, CS, RFLAGS, RSP and SS. To the 64-bit user segments it returns there
/// with the flags user code may change; other selectors are refused or #GP as for `lret`.
fn iretq(at: u64, area: &mut ThreadArea) -> Action {
    let rsp = area.gpr[thread_area::RSP];
    let Some([rip, cs, flags, new_rsp, ss]) = read_stack::<5>(rsp, 8) else {
        return Action::Raise(stack_fault(rsp, at));
    };
    match (cs & 0xffff, ss & 0xffff) {
        (USER_CS, USER_SS) => {
            // CF PF AF ZF SF TF DF OF, AC, ID, RF: what user mode may change (not IF, IOPL).
            const USER_FLAGS: u64 = 0x0dd5 | 0x100 | 0x4_0000 | 0x20_0000 | 0x1_0000;
            area.rflags = (area.rflags & !USER_FLAGS) | (flags & USER_FLAGS) | 2;
            area.gpr[thread_area::RSP] = new_rsp;
            Action::Continue(rip)
        }
        (USER32_CS, _) => Action::Refuse("iretq (to 32-bit code, selector 0x23)".into()),
        (USER_CS, sel) | (sel, _) => Action::Raise(general_protection(at, sel & 0xfffc)),
    }
}

/// `N` stack slots of `size` bytes (4 or 8) from guest `rsp`, zero-extended.
fn read_stack<const N: usize>(rsp: u64, size: u64) -> Option<[u64; N]> {
    let mut out = [0u64; N];
    let mut buf = [0u8; 8];
    for (k, slot) in out.iter_mut().enumerate() {
        guest_mem::read(rsp + k as u64 * size, &mut buf[..size as usize]).ok()?;
        *slot = u64::from_le_bytes(buf);
        buf = [0; 8];
    }
    Some(out)
}

/// The fault of reading an unreadable stack at `rsp` for the instruction at `at`.
fn stack_fault(rsp: u64, at: u64) -> GuestFault {
    let mut f = fault(libc::SIGSEGV, SEGV_MAPERR, rsp, at, TRAP_PF, PF_USER);
    f.trap.cr2 = rsp;
    f
}

/// The CPU has RTM (CPUID.(EAX=7,ECX=0):EBX bit 11).
fn rtm() -> bool {
    let r = std::arch::x86_64::__cpuid_count(7, 0);
    r.ebx & (1 << 11) != 0
}

/// `xbegin` runs on this CPU instead of raising #UD: RTM is enumerated, or the kernel turned
/// TSX off through TSX_CTRL, which hides RTM from CPUID while `xbegin` still runs and always
/// aborts (a CPU seen with `tsx=off`: natively the fallback ran, where hotpath raised SIGILL).
/// Without RTM in CPUID this is probed once, the first time a guest runs `xbegin`, by running
/// one in a child process (a SIGILL there kills only the child).
fn xbegin_runs() -> bool {
    static RUNS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *RUNS.get_or_init(|| rtm() || probe_xbegin())
}

/// Runs `xbegin` in a forked child: true if the child exits normally.
fn probe_xbegin() -> bool {
    // SAFETY: the child runs only `sigaction`, the instruction and `_exit`, all
    // async-signal-safe.
    let status = run_in_child(|| unsafe {
        // The default action (death), not hotpath's handler the child inherited.
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGILL, &sa, std::ptr::null_mut());
        std::arch::asm!(
            "xbegin 2f",
            "xend",
            "2:",
            out("eax") _,
            options(nostack)
        );
        libc::_exit(0);
    });
    status.is_some_and(|s| libc::WIFEXITED(s) && libc::WEXITSTATUS(s) == 0)
}

/// Whether this CPU writes a near `call`'s return address below RSP before it raises #GP for
/// a non-canonical target (RSP itself is left as it was either way). CPUs differ: an Intel
/// Xeon was seen to write it, AMD EPYCs not. Probed once, the first time a guest calls a
/// non-canonical address, by making such a call in a child process; where the probe cannot
/// run, the architectural answer (Intel's pseudo-code checks the target before the push): no
/// write.
pub fn noncanonical_call_writes_return() -> bool {
    static WRITES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WRITES.get_or_init(|| probe_noncanonical_call() == Some(true))
}

/// Calls a non-canonical address on a stack of zeros in a forked child whose SIGSEGV handler
/// (on an alternate stack) looks at the slot the push would have written; `None` if anything
/// else happened.
fn probe_noncanonical_call() -> Option<bool> {
    /// The stack the call runs on: RSP at its middle, so the push writes `STACK[31]`.
    static mut STACK: [u64; 64] = [0; 64];
    /// The handler's own stack.
    static mut ALT: [u8; 1 << 16] = [0; 1 << 16];
    extern "C" fn on_segv(_sig: i32, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
        // SAFETY: reads the child's own static stack, which nothing else writes now; `_exit`
        // is async-signal-safe.
        unsafe {
            let slot = std::ptr::read_volatile(std::ptr::addr_of!(STACK[31]));
            libc::_exit(if slot != 0 { 11 } else { 10 });
        }
    }
    // SAFETY: the child runs only `sigaltstack`, `sigaction`, `sigprocmask`, the call and the
    // handler's `_exit`, all async-signal-safe; the call's stack and the handler's are the
    // child's own statics.
    let status = run_in_child(|| unsafe {
        let ss = libc::stack_t {
            ss_sp: std::ptr::addr_of_mut!(ALT) as *mut libc::c_void,
            ss_flags: 0,
            ss_size: 1 << 16,
        };
        libc::sigaltstack(&ss, std::ptr::null_mut());
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_segv as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGSEGV);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        let top = std::ptr::addr_of_mut!(STACK) as u64 + 32 * 8;
        std::arch::asm!(
            "mov rsp, {top}",
            "call {target}",
            "ud2",
            top = in(reg) top,
            target = in(reg) 0x8000_0000_0000_0000u64,
            options(noreturn)
        );
    })?;
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 11) => Some(true),
        (true, 10) => Some(false),
        _ => None,
    }
}

/// Whether this machine reports the SIGTRAP of `icebp` (int1) at the next instruction, as a
/// trap (true), or at the `icebp` itself (false). Machines differ, even with one CPU vendor
/// (two AMD EPYC virtual machines were seen to answer differently: the hypervisor's handling
/// of #DB decides), and one virtual machine was seen to answer both ways from one run to the
/// next. So this is probed once, the first time a guest runs `icebp`, by running it
/// [`ICEBP_PROBES`] times in a child process: when every answer agrees, that is this
/// machine's; when they disagree (or the probe cannot run), the architectural answer, a trap
/// after the instruction, is taken, so that hotpath never answers less consistently than the
/// machine does.
pub fn icebp_reports_next() -> bool {
    static NEXT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *NEXT.get_or_init(|| probe_icebp().unwrap_or(IcebpAnswers::Mixed).reports_next())
}

/// How many times [`icebp_reports_next`]'s probe runs `icebp`.
const ICEBP_PROBES: usize = 8;

/// What the probe's `icebp`s reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IcebpAnswers {
    /// Every one at the instruction.
    At,
    /// Every one at the next instruction.
    After,
    /// Some at, some after.
    Mixed,
}

impl IcebpAnswers {
    /// The answer hotpath gives: the machine's when it is consistent, else the
    /// architectural one (after).
    fn reports_next(self) -> bool {
        self != IcebpAnswers::At
    }
}

/// Runs `icebp` [`ICEBP_PROBES`] times in a forked child whose SIGTRAP handler notes the
/// signal's RIP relative to the instruction (+0 or +1) and resumes after it; `None` if
/// anything else happened.
fn probe_icebp() -> Option<IcebpAnswers> {
    use std::sync::atomic::{AtomicU64, Ordering};
    /// The guest address of the child's `icebp`.
    static AT: AtomicU64 = AtomicU64::new(0);
    /// Bit 0: a trap reported at the instruction; bit 1: after it; bit 2: anywhere else.
    static SEEN: AtomicU64 = AtomicU64::new(0);
    extern "C" fn on_trap(_sig: i32, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid ucontext to an SA_SIGINFO handler; only the
        // child's own saved RIP is changed, to the instruction after the `icebp`.
        unsafe {
            let gregs = &mut (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs;
            let at = AT.load(Ordering::Relaxed);
            let bit = match (gregs[libc::REG_RIP as usize] as u64).wrapping_sub(at) {
                0 => 1,
                1 => 2,
                _ => 4,
            };
            SEEN.fetch_or(bit, Ordering::Relaxed);
            gregs[libc::REG_RIP as usize] = (at + 1) as i64;
        }
    }
    // SAFETY: the child runs only `sigaction`, `sigprocmask`, the instruction and `_exit`
    // (and the handler, atomics only), all async-signal-safe.
    let status = run_in_child(|| unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_trap as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigaction(libc::SIGTRAP, &sa, std::ptr::null_mut());
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTRAP);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        for _ in 0..ICEBP_PROBES {
            std::arch::asm!(
                "lea {at}, [rip + 2f]",
                "mov qword ptr [{slot}], {at}",
                "2:",
                ".byte 0xf1",
                "nop",
                at = out(reg) _,
                slot = in(reg) AT.as_ptr(),
                options(nostack)
            );
        }
        libc::_exit(10 + SEEN.load(Ordering::Relaxed) as i32);
    })?;
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 11) => Some(IcebpAnswers::At),
        (true, 12) => Some(IcebpAnswers::After),
        (true, 13) => Some(IcebpAnswers::Mixed),
        _ => None,
    }
}

/// Forks a child that runs `child` (which must not return, and may call only
/// async-signal-safe functions: the process may have other threads) and waits for it: the
/// child's wait status, or `None` if it could not be forked.
fn run_in_child(child: impl FnOnce()) -> Option<i32> {
    // SAFETY: the child runs only `child`, async-signal-safe by the caller's word, then
    // `_exit`s; the parent only waits for it.
    unsafe {
        match libc::fork() {
            0 => {
                child();
                libc::_exit(127);
            }
            -1 => None,
            pid => {
                let mut status = 0;
                while libc::waitpid(pid, &mut status, libc::__WALL) == -1 {
                    if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                        return None;
                    }
                }
                Some(status)
            }
        }
    }
}

/// A control transfer to the non-canonical `target` by the guest branch at `site`: the CPU
/// raises #GP at the branch itself (with RSP as before a `call` pushes or a `ret` pops), so
/// the stack pointer the translated branch already changed is put back. A direct `call` has
/// pushed its return address; an indirect one has not (its lookup comes first,
/// `gateway::emit_ibl_call`) unless `indirect_call_pushed`, and then writes it below RSP if
/// this CPU does ([`noncanonical_call_writes_return`]). `site` is `None` when the branch is
/// not known, and the fault is then reported at the target.
pub fn noncanonical_branch(
    site: Option<u64>,
    target: u64,
    area: &mut ThreadArea,
    indirect_call_pushed: bool,
) -> GuestFault {
    let Some(site) = site else {
        return general_protection(target, 0);
    };
    if let Some(i) = decode_at(site) {
        let rsp = &mut area.gpr[thread_area::RSP];
        let direct = i.op0_kind() == iced_x86::OpKind::NearBranch64;
        match i.mnemonic() {
            Mnemonic::Ret => {
                *rsp = rsp.wrapping_sub(crate::frontend::decode::return_pop(&i) as u64)
            }
            Mnemonic::Call if direct || indirect_call_pushed => *rsp = rsp.wrapping_add(8),
            Mnemonic::Call if noncanonical_call_writes_return() => {
                // An unwritable slot is left alone and the #GP reported (natively the push
                // might have faulted first: not modelled).
                let _ = guest_mem::write(rsp.wrapping_sub(8), &i.next_ip().to_le_bytes());
            }
            _ => {}
        }
    }
    general_protection(site, 0)
}

/// A guest control transfer to `pc` in the vsyscall page, as the kernel handles it when the
/// page is mapped execute-only (`vsyscall=xonly`, the default) or emulated: the three entries
/// (`gettimeofday`, `time`, `getcpu`) make the system call and return to the caller; any other
/// address there is SIGSEGV. `None` when the page is not mapped (`vsyscall=none`): the fetch
/// then faults like any unmapped address. `last` is the trap details a non-fault frame shows.
pub fn vsyscall(
    pc: u64,
    maps: &mut MapsCache,
    area: &mut ThreadArea,
    last: TrapDetails,
) -> Option<Action> {
    if !(VSYSCALL_PAGE..VSYSCALL_PAGE + 4096).contains(&pc) {
        return None;
    }
    maps.prot(VSYSCALL_PAGE)
        .filter(|p| p & libc::PROT_EXEC != 0)?;
    let Some(&(_, nr)) = VSYSCALL_ENTRIES
        .iter()
        .find(|(off, _)| VSYSCALL_PAGE + off == pc)
    else {
        // The kernel's emulation refuses a call into the middle of the page: SIGSEGV with
        // the thread's last trap details.
        return Some(Action::Raise(GuestFault {
            sig: libc::SIGSEGV,
            code: SI_KERNEL,
            addr: 0,
            rip: pc,
            trap: TrapDetails { rf: true, ..last },
        }));
    };
    let g = &area.gpr;
    let ret = raw_syscall(
        nr,
        &[
            g[thread_area::RDI],
            g[thread_area::RSI],
            g[thread_area::RDX],
            0,
            0,
            0,
        ],
    );
    let rsp = area.gpr[thread_area::RSP];
    let Some([to]) = read_stack::<1>(rsp, 8) else {
        return Some(Action::Raise(stack_fault(rsp, pc)));
    };
    area.gpr[thread_area::RAX] = ret as u64;
    area.gpr[thread_area::RSP] = rsp.wrapping_add(8);
    Some(Action::Continue(to))
}

/// `uretprobe(2)`: the return probe trampoline's system call (x86-64 number 335).
pub const SYS_URETPROBE: u64 = 335;

/// What the kernel does to a `uretprobe` system call made from anywhere but its trampoline:
/// SIGILL (SI_KERNEL) reported after the `syscall` instruction at `next`, with the thread's
/// last trap details (`last`).
pub fn uretprobe(next: u64, last: TrapDetails) -> GuestFault {
    GuestFault {
        sig: libc::SIGILL,
        code: SI_KERNEL,
        addr: 0,
        rip: next,
        trap: TrapDetails { rf: false, ..last },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_addresses() {
        assert!(canonical(0));
        assert!(canonical(0x7fff_ffff_ffff));
        assert!(!canonical(0x8000_0000_0000));
        assert!(!canonical(0x8000_0000_0000_0000));
        assert!(canonical(0xffff_8000_0000_0000));
        assert!(canonical(VSYSCALL_PAGE));
    }

    /// `swapgs` faults with #GP(0) in user mode on every x86-64 CPU: the probe reports
    /// SIGSEGV, SI_KERNEL, no address, at the instruction, trap 13, error code 0.
    #[test]
    fn system_instruction_probe_reports_the_kernels_signal() {
        let got = probe_in_child(&[0x0f, 0x01, 0xf8]);
        assert_eq!(
            got,
            Some([libc::SIGSEGV as u64, SI_KERNEL as u64, u64::MAX, 0, 13, 0])
        );
    }

    /// The probe sees the answers machines give: it runs, traps and reports each time.
    #[test]
    fn icebp_probe_sees_a_trap_at_or_after_the_instruction() {
        assert!(probe_icebp().is_some());
    }

    /// A machine that answers both ways gets the architectural answer, after the
    /// instruction; a consistent one gets its own.
    #[test]
    fn icebp_answers_that_disagree_give_the_trap_after_the_instruction() {
        assert!(IcebpAnswers::Mixed.reports_next());
        assert!(IcebpAnswers::After.reports_next());
        assert!(!IcebpAnswers::At.reports_next());
    }
}
