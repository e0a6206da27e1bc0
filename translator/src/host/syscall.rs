//! System calls hotpath makes on the host: the raw `syscall` instruction, and the gate that
//! every guest system call which may block goes through, so that a signal cannot slip in
//! between the dispatcher's last look and the kernel entering the call.

/// A pass-through system call's result when it was not made because a signal is waiting:
/// the dispatcher delivers the signal first and runs the `syscall` instruction again after the
/// handler, as the CPU would have taken the signal before the instruction. Not an errno the
/// kernel returns (those are in -4095..-1).
pub const GATE_REFUSED: i64 = -4097;

// The syscall gate: every guest system call that may block goes through here, so that a signal
// arriving between the dispatcher's last check and the kernel entering the call cannot be
// lost (the handler would take it and the call would then block forever). The gate refuses
// the call if a signal is pending (the calling thread's `ThreadArea::gate_pending`, through GS),
// and the handler redirects a thread it interrupts anywhere
// from the gate's start up to its `syscall` instruction to the refusal path.
std::arch::global_asm!(
    ".globl hotpath_gate_syscall",
    ".globl hotpath_gate_syscall_insn",
    ".globl hotpath_gate_syscall_refused",
    "hotpath_gate_syscall:",
    "    mov rax, qword ptr gs:[{pending}]",
    "    test rax, rax",
    "    jnz hotpath_gate_syscall_refused",
    "    mov rax, rdi",
    "    mov rdi, qword ptr [rsi]",
    "    mov rdx, qword ptr [rsi + 16]",
    "    mov r10, qword ptr [rsi + 24]",
    "    mov r8, qword ptr [rsi + 32]",
    "    mov r9, qword ptr [rsi + 40]",
    "    mov rsi, qword ptr [rsi + 8]",
    "hotpath_gate_syscall_insn:",
    "    syscall",
    "    ret",
    "hotpath_gate_syscall_refused:",
    "    mov rax, {refused}",
    "    ret",
    pending = const crate::host::thread_area::off::GATE_PENDING,
    refused = const GATE_REFUSED,
);

extern "sysv64" {
    fn hotpath_gate_syscall(nr: u64, args: *const [u64; 6]) -> i64;
    fn hotpath_gate_syscall_insn();
    fn hotpath_gate_syscall_refused();
}

/// The gate's code range `[start, syscall instruction]` and its refusal path, for the handler.
pub fn gate_addresses() -> (u64, u64, u64) {
    (
        hotpath_gate_syscall as *const () as u64,
        hotpath_gate_syscall_insn as *const () as u64,
        hotpath_gate_syscall_refused as *const () as u64,
    )
}

/// Makes system call `nr` through the gate: the kernel's result, or [`GATE_REFUSED`].
pub fn gated_syscall(nr: u64, args: &[u64; 6]) -> i64 {
    // SAFETY: the gate is a plain system call stub (System V ABI: clobbers RAX, RCX, RDX, RSI,
    // RDI, R8-R11, all caller-saved); the calls that could harm hotpath are in TABLE.
    unsafe { hotpath_gate_syscall(nr, args) }
}

// The guest's site: every system call hotpath makes *for* the guest outside the gate (the
// emulated calls' own `mmap`, `openat`, `execve`, `prctl`, `seccomp`, ...) is made by this
// one `syscall` instruction, so that the kernel can tell the guest's calls from hotpath's:
// a guest's seccomp filter judges only calls from here and the gate (`seccomp.rs`), and a
// signal the kernel forces during one of them (`uretprobe`'s SIGILL, seccomp's SIGSYS)
// belongs to the guest.
std::arch::global_asm!(
    ".globl hotpath_guest_syscall",
    ".globl hotpath_guest_syscall_insn",
    "hotpath_guest_syscall:",
    "    mov rax, rdi",
    "    mov rdi, qword ptr [rsi]",
    "    mov rdx, qword ptr [rsi + 16]",
    "    mov r10, qword ptr [rsi + 24]",
    "    mov r8, qword ptr [rsi + 32]",
    "    mov r9, qword ptr [rsi + 40]",
    "    mov rsi, qword ptr [rsi + 8]",
    "hotpath_guest_syscall_insn:",
    "    syscall",
    "    ret",
);

extern "sysv64" {
    fn hotpath_guest_syscall(nr: u64, args: *const [u64; 6]) -> i64;
    fn hotpath_guest_syscall_insn();
}

/// Makes system call `nr` on the guest's behalf from the guest's site (see above): the
/// kernel's raw result (negative errno on failure). Never refused for a pending signal.
pub fn guest_syscall(nr: u64, args: &[u64; 6]) -> i64 {
    // SAFETY: a plain system call stub (System V ABI: clobbers only caller-saved registers);
    // the calls that could harm hotpath are emulated in TABLE before they get here.
    unsafe { hotpath_guest_syscall(nr, args) }
}

/// The host addresses a guest's system call returns to (the instruction after the gate's
/// `syscall` and after the guest site's): a signal the kernel forces at one of these during
/// a call is the guest's, and a seccomp filter sees one of these as the instruction pointer.
pub fn guest_syscall_returns() -> [u64; 2] {
    const SYSCALL_LEN: u64 = 2;
    [
        hotpath_gate_syscall_insn as *const () as u64 + SYSCALL_LEN,
        hotpath_guest_syscall_insn as *const () as u64 + SYSCALL_LEN,
    ]
}

/// Performs system call `nr` on the host, returning the kernel's raw result (negative errno on
/// failure).
pub fn raw_syscall(nr: u64, a: &[u64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: a pass-through system call on the guest's behalf; the calls that could harm
    // hotpath's own state are in TABLE and never get here.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr as i64 => ret,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
            in("r10") a[3], in("r8") a[4], in("r9") a[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack)
        );
    }
    ret
}
