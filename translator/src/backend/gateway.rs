//! The gateway routines at the bottom of the code cache: `enter` (Rust → translated code),
//! `exit` (translated code → Rust), and the indirect branch lookup.
//!
//! All of them address the thread's [`ThreadArea`](crate::host::thread_area::ThreadArea) through GS
//! (`0x65` prefix on an absolute `[disp32]` operand), so they need no free register and never
//! touch the guest's stack or red zone.

use dynasmrt::{dynasm, x64::X64Relocation, DynasmApi, DynasmLabelApi, VecAssembler};
use hotpath_ir::HostAddr;
use iced_x86::Register;

use crate::cache::code_cache::{CodeCache, GatewayJumps};
use crate::host::thread_area::off;
use crate::TranslateError;

/// The GS segment-override prefix byte.
pub const GS: u8 = 0x65;

/// `exit_code` value: the enqueue stub found the ring's lap full; resume at `resume`.
pub const EXIT_RING_FULL: u32 = u32::MAX - 1;
/// `exit_code` value: an indirect branch missed the lookup table; the guest target is in
/// `ibl_target`.
pub const EXIT_IBL_MISS: u32 = u32::MAX - 2;
/// `exit_code` value: the host signal handler mapped a fault to the guest and sent the thread
/// out through `exit_from_signal`; the guest state is already in the thread area.
pub const EXIT_SIGNAL: u32 = u32::MAX - 3;
/// Exit codes below this are indices into the translator's exit table.
pub const EXIT_SPECIAL_BASE: u32 = u32::MAX - 16;

/// XSAVE components saved and restored on every transition: x87, SSE, AVX, MPX, AVX-512, PKRU
/// and the rest of XCR0 except AMX tile state (bits 17-18), which needs a permission the guest
/// may not have asked for.
const XSAVE_EXCLUDED: u64 = (1 << 17) | (1 << 18);

/// Host CPU features the gateway depends on.
#[derive(Clone, Copy, Debug)]
pub struct HostFeatures {
    /// `rdfsbase`/`wrfsbase` are enabled for user mode (AT_HWCAP2 bit 1).
    pub fsgsbase: bool,
    /// XCR0 with the excluded components masked off: the XSAVE request mask.
    pub xsave_mask: u64,
    /// Bytes XSAVE writes at most for `xsave_mask` (the size for all of XCR0).
    pub xsave_size: u32,
    /// XSAVEOPT is available (CPUID.(EAX=0DH,ECX=1):EAX bit 0): the exit saves with it, which
    /// skips the components the guest did not change since the entry's XRSTOR from the same
    /// image and those in their initial configuration (XSTATE_BV says which; their bytes in
    /// the image are stale, `linux::signals::frame` fills them as XSAVE would for a frame).
    pub xsaveopt: bool,
}

impl HostFeatures {
    /// The host's features, read once per process: every thread that starts asks, and under
    /// a hypervisor each CPUID is a VM exit (2.5 % of a program that starts and joins
    /// threads one after another).
    ///
    /// # Errors
    /// [`TranslateError::Host`] if the CPU lacks XSAVE/OSXSAVE or needs a bigger XSAVE area
    /// than hotpath reserves.
    pub fn detect() -> Result<HostFeatures, TranslateError> {
        static FEATURES: std::sync::OnceLock<Result<HostFeatures, String>> =
            std::sync::OnceLock::new();
        FEATURES
            .get_or_init(HostFeatures::read)
            .clone()
            .map_err(|reason| TranslateError::Host { reason })
    }

    /// Reads the host's features from CPUID, XCR0 and the auxiliary vector; what is missing
    /// when they do not do.
    fn read() -> Result<HostFeatures, String> {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        // SAFETY: CPUID is available on every x86-64 CPU.
        let leaf1 = __cpuid(1);
        if leaf1.ecx & (1 << 27) == 0 {
            return Err("the CPU or OS does not enable XSAVE (OSXSAVE)".into());
        }
        let xcr0: u64;
        // SAFETY: xgetbv(0) is valid when OSXSAVE is set (checked above).
        unsafe {
            let (lo, hi): (u32, u32);
            std::arch::asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi, options(nomem, nostack));
            xcr0 = (hi as u64) << 32 | lo as u64;
        }
        let xsave_mask = xcr0 & !XSAVE_EXCLUDED;
        // The size for all of XCR0 (CPUID.(EAX=0DH,ECX=0):EBX): at least what the mask needs,
        // and what any signal frame's image takes. The components' own offsets
        // (`host::cpu::xstate_layout`, seven more CPUIDs, each a VM exit under a hypervisor)
        // are read only when a signal frame is.
        let size = __cpuid_count(0xd, 0).ebx;
        if size as usize > crate::host::thread_area::XSAVE_AREA_SIZE {
            return Err(format!(
                "XSAVE area of {size} bytes is larger than supported"
            ));
        }
        // CPUID.(EAX=0DH,ECX=1):EAX bit 0.
        let xsaveopt = __cpuid_count(0xd, 1).eax & 1 != 0;
        // SAFETY: getauxval has no preconditions.
        let hwcap2 = unsafe { libc::getauxval(libc::AT_HWCAP2) };
        // `HOTPATH_NO_FSGSBASE` forces the arch_prctl path (for testing it on hosts that have
        // FSGSBASE).
        let fsgsbase = hwcap2 & 2 != 0 && std::env::var_os("HOTPATH_NO_FSGSBASE").is_none();
        Ok(HostFeatures {
            fsgsbase,
            xsave_mask,
            xsave_size: size,
            xsaveopt,
        })
    }
}

/// Host addresses of the gateway routines.
#[derive(Clone, Copy, Debug)]
pub struct Gateway {
    /// `extern "sysv64" fn()`: saves the host's callee-saved registers, loads the guest context
    /// from the thread area and jumps to `jump_to`. Returns when translated code exits.
    pub enter: HostAddr,
    /// Jump here with guest RCX in `scratch_rcx` and the exit code in ECX.
    pub exit: HostAddr,
    /// The inlined indirect branch lookup jumps here on a miss (see [`emit_ibl`]).
    pub ibl_miss: HostAddr,
    /// Where empty lookup slots point: a miss (for the non-canonical target `u64::MAX`).
    pub ibl_empty: HostAddr,
    /// The host signal handler resumes a faulting thread here, with the guest's GPRs and
    /// RFLAGS already saved in the area: saves the FPU state and returns to the dispatcher.
    pub exit_from_signal: HostAddr,
}

/// Offset of XSTATE_BV, the XSAVE header's bitmap of the components not in their initial
/// configuration, in the standard-format XSAVE image.
const XSTATE_BV: i32 = 512;

/// The x87 control word of the x87's initial configuration (`fninit`'s).
const INITIAL_FCW: i16 = 0x37f;

/// Emits the gateway at the start of `cache` and seals it below the flush floor.
///
/// # Errors
/// [`TranslateError::Assemble`] if dynasm rejects the code (a bug in hotpath).
pub fn emit_gateway(cache: &mut CodeCache, host: HostFeatures) -> Result<Gateway, TranslateError> {
    cache.select_home();
    let base = cache.next_addr().0;
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(base as usize);
    let mask_lo = host.xsave_mask as u32 as i32;
    let mask_hi = (host.xsave_mask >> 32) as u32 as i32;
    let gpr = |i: i32| off::GPR + 8 * i;

    // ---- enter ----
    let enter = ops.offset();
    dynasm!(ops
        ; .arch x64
        ; push rbx ; push rbp ; push r12 ; push r13 ; push r14 ; push r15
        ; .u8 GS ; mov QWORD [off::HOST_RSP], rsp
        ; .u8 GS ; stmxcsr [off::HOST_MXCSR]
        ; .u8 GS ; fnstcw [off::HOST_FCW]
    );
    if host.fsgsbase {
        dynasm!(ops ; .arch x64 ; .u8 GS ; mov rax, QWORD [off::FS_BASE] ; wrfsbase rax);
    } else {
        dynasm!(ops
            ; .arch x64
            ; mov eax, libc::SYS_arch_prctl as i32
            ; mov edi, 0x1002 // ARCH_SET_FS
            ; .u8 GS ; mov rsi, QWORD [off::FS_BASE]
            ; syscall
        );
    }
    dynasm!(ops
        ; .arch x64
        ; mov eax, mask_lo
        ; mov edx, mask_hi
        ; .u8 GS ; xrstor64 [off::XSAVE]
        ; .u8 GS ; push QWORD [off::RFLAGS]
        ; popfq
        ; .u8 GS ; mov rax, QWORD [gpr(0)]
        ; .u8 GS ; mov rcx, QWORD [gpr(1)]
        ; .u8 GS ; mov rdx, QWORD [gpr(2)]
        ; .u8 GS ; mov rbx, QWORD [gpr(3)]
        ; .u8 GS ; mov rbp, QWORD [gpr(5)]
        ; .u8 GS ; mov rsi, QWORD [gpr(6)]
        ; .u8 GS ; mov rdi, QWORD [gpr(7)]
        ; .u8 GS ; mov r8, QWORD [gpr(8)]
        ; .u8 GS ; mov r9, QWORD [gpr(9)]
        ; .u8 GS ; mov r10, QWORD [gpr(10)]
        ; .u8 GS ; mov r11, QWORD [gpr(11)]
        ; .u8 GS ; mov r12, QWORD [gpr(12)]
        ; .u8 GS ; mov r13, QWORD [gpr(13)]
        ; .u8 GS ; mov r14, QWORD [gpr(14)]
        ; .u8 GS ; mov r15, QWORD [gpr(15)]
        ; .u8 GS ; mov rsp, QWORD [gpr(4)]
        ; .u8 GS ; jmp QWORD [off::JUMP_TO]
    );

    // ---- exit ----
    // A lookup miss first probes the victim table (`ThreadArea::ibl2`), flag-free: every exit
    // comes here with a 32-bit code in ECX, and EXIT_IBL_MISS comes with the guest target in
    // `ibl_target`, the guest's RCX in its scratch slot and every other register the guest's.
    // A hit goes on at the target's block without leaving the cache.
    // (`jrcxz` reaches 127 bytes: the probe is reached through a jump placed before `exit`.)
    dynasm!(ops ; .arch x64 ; to_victim: ; jmp ->victim);
    let exit = ops.offset();
    let miss_bias = (EXIT_IBL_MISS as i32).wrapping_neg();
    dynasm!(ops
        ; .arch x64
        ; lea ecx, [rcx + miss_bias]                      // 0 iff the code is EXIT_IBL_MISS
        ; jrcxz <to_victim
        ; lea ecx, [rcx - miss_bias]
        ; ->save_state:
        ; .u8 GS ; mov QWORD [off::EXIT_CODE], rcx
        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
        ; .u8 GS ; mov QWORD [gpr(0)], rax
        ; .u8 GS ; mov QWORD [gpr(1)], rcx
        ; .u8 GS ; mov QWORD [gpr(2)], rdx
        ; .u8 GS ; mov QWORD [gpr(3)], rbx
        ; .u8 GS ; mov QWORD [gpr(4)], rsp
        ; .u8 GS ; mov QWORD [gpr(5)], rbp
        ; .u8 GS ; mov QWORD [gpr(6)], rsi
        ; .u8 GS ; mov QWORD [gpr(7)], rdi
        ; .u8 GS ; mov QWORD [gpr(8)], r8
        ; .u8 GS ; mov QWORD [gpr(9)], r9
        ; .u8 GS ; mov QWORD [gpr(10)], r10
        ; .u8 GS ; mov QWORD [gpr(11)], r11
        ; .u8 GS ; mov QWORD [gpr(12)], r12
        ; .u8 GS ; mov QWORD [gpr(13)], r13
        ; .u8 GS ; mov QWORD [gpr(14)], r14
        ; .u8 GS ; mov QWORD [gpr(15)], r15
        ; .u8 GS ; mov rsp, QWORD [off::HOST_RSP]
        ; pushfq
        ; .u8 GS ; pop QWORD [off::RFLAGS]
        // From here on, shared with `exit_from_signal`: the guest's GPRs and RFLAGS are saved
        // and RSP is the host's.
        ; ->host_tail:
        // Host code runs with the ABI's flags: the guest may have set DF, EFLAGS.AC (alignment
        // checks) or TF.
        ; push 2
        ; popfq
        ; mov eax, mask_lo
        ; mov edx, mask_hi
    );
    // The modified optimization is sound here: only this exit writes the image between the
    // entry's XRSTOR and the next XSAVEOPT (the dispatcher changes it only while the guest is
    // out, and XRSTOR loads what it changed).
    if host.xsaveopt {
        dynasm!(ops ; .arch x64 ; .u8 GS ; xsaveopt64 [off::XSAVE]);
    } else {
        dynasm!(ops ; .arch x64 ; .u8 GS ; xsave64 [off::XSAVE]);
    }
    dynasm!(ops
        ; .arch x64
        // The host's x87 state (`fninit`, its control word), unless the guest left the x87
        // in its initial configuration (XSTATE_BV bit 0 clear: control word 0x37F, every
        // register empty) and that is the host's control word too: `fninit` and `fldcw` took
        // a tenth of a system call's round trip through the gateway, and guests rarely use
        // the x87.
        ; .u8 GS ; test BYTE [off::XSAVE + XSTATE_BV], 1
        ; jnz >x87
        ; .u8 GS ; cmp WORD [off::HOST_FCW], INITIAL_FCW
        ; je >x87_ready
        ; x87:
        ; fninit
        ; .u8 GS ; fldcw [off::HOST_FCW]
        ; x87_ready:
        ; .u8 GS ; ldmxcsr [off::HOST_MXCSR]
    );
    if host.fsgsbase {
        dynasm!(ops
            ; .arch x64
            ; rdfsbase rax
            ; .u8 GS ; mov QWORD [off::FS_BASE], rax
            ; .u8 GS ; mov rax, QWORD [off::HOST_FS_BASE]
            ; wrfsbase rax
        );
    } else {
        dynasm!(ops
            ; .arch x64
            ; mov eax, libc::SYS_arch_prctl as i32
            ; mov edi, 0x1002 // ARCH_SET_FS
            ; .u8 GS ; mov rsi, QWORD [off::HOST_FS_BASE]
            ; syscall
        );
    }
    dynasm!(ops
        ; .arch x64
        ; pop r15 ; pop r14 ; pop r13 ; pop r12 ; pop rbp ; pop rbx
        ; ret
    );

    // ---- the victim table's probe (see `exit`) ----
    // Slot: bits 0-15 of the target plus its bits 16-31 (`ThreadArea::ibl2_index`).
    dynasm!(ops
        ; .arch x64
        ; ->victim:
        ; .u8 GS ; mov QWORD [off::SCRATCH_RDX], rdx
        ; .u8 GS ; mov rcx, QWORD [off::IBL2_OPEN]
        ; jrcxz >victim_miss                              // closed: a miss
        ; .u8 GS ; mov rdx, QWORD [off::IBL_TARGET]
        ; .u8 GS ; movzx ecx, WORD [off::IBL_TARGET + 2]
        ; lea ecx, [rcx + rdx]
        ; movzx ecx, cx
        ; lea rcx, [rcx + rcx]                            // slot * 2, scaled by 8: 16-byte slots
        ; .u8 GS ; mov rcx, QWORD [rcx * 8 + off::IBL2]   // !(slot's guest address)
        ; lea rcx, [rcx + rdx + 1]                        // 0 iff the slot holds the target
        ; jrcxz >victim_hit
        ; victim_miss:
        ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
        ; mov ecx, EXIT_IBL_MISS as i32
        ; jmp ->save_state
        ; victim_hit:
        ; .u8 GS ; movzx ecx, WORD [off::IBL_TARGET + 2]
        ; lea ecx, [rcx + rdx]
        ; movzx ecx, cx
        ; lea rcx, [rcx + rcx]
        ; .u8 GS ; mov rcx, QWORD [rcx * 8 + off::IBL2 + 8]
        ; .u8 GS ; mov QWORD [off::JUMP_TO], rcx
        ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
        ; .u8 GS ; jmp QWORD [off::JUMP_TO]
    );

    // ---- indirect branch lookup miss ----
    // The lookup itself is inlined at every indirect branch (see `emit_ibl`), so each site has
    // its own host indirect jump for the branch predictor. On a miss it jumps here with
    // RDX = guest target, guest RAX/RDX in their scratch slots and guest RCX in scratch_rcx.
    let ibl_miss = ops.offset();
    let exit_addr = base + exit.0 as u64;
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::IBL_TARGET], rdx
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
        ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
        ; mov ecx, EXIT_IBL_MISS as i32
        ; jmp extern exit_addr as usize
    );
    // An empty slot "matches" only u64::MAX (in the last slot); treat it as a miss on that
    // target.
    let ibl_empty = ops.offset();
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::SCRATCH_RCX], rcx
        ; mov rcx, -1
        ; .u8 GS ; mov QWORD [off::IBL_TARGET], rcx
        ; .u8 GS ; mov QWORD [off::IBL_SITE], 0
        ; mov ecx, EXIT_IBL_MISS as i32
        ; jmp extern exit_addr as usize
    );
    // ---- exit after a fault ----
    // The handler has saved the guest's GPRs and RFLAGS; the FPU state and FS base are still
    // the guest's, as the exit routine expects them.
    let exit_from_signal = ops.offset();
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov rsp, QWORD [off::HOST_RSP]
        ; .u8 GS ; mov QWORD [off::EXIT_CODE], EXIT_SIGNAL as i32
        ; jmp ->host_tail
    );
    let code = ops.finalize().map_err(|e| TranslateError::Assemble {
        what: "gateway",
        reason: format!("{e:?}"),
    })?;
    if code.len() as u64 > cache.room() {
        return Err(TranslateError::CodeCache {
            reason: "no room for the gateway".into(),
        });
    }
    let at = cache.insert(&code);
    debug_assert_eq!(at.0, base);
    cache.seal_floor();
    let gateway = Gateway {
        enter: HostAddr(base + enter.0 as u64),
        exit: HostAddr(exit_addr),
        ibl_miss: HostAddr(base + ibl_miss.0 as u64),
        ibl_empty: HostAddr(base + ibl_empty.0 as u64),
        exit_from_signal: HostAddr(base + exit_from_signal.0 as u64),
    };
    cache.set_gateway(GatewayJumps {
        exit: gateway.exit,
        ibl_miss: gateway.ibl_miss,
    });
    Ok(gateway)
}

/// Emits the indirect branch lookup for a guest target in RCX (guest RCX already saved in
/// `scratch_rcx`): it probes the target's set in the lookup table, its first entry and then,
/// while `ibl2_open`, its second (`IblSet::second`, in the same cache line); on a hit, restores RAX, RCX, RDX
/// and jumps to the target's block through this site's own indirect jump; on a miss, goes to
/// the gateway's miss routine (which probes the victim table). Flags are never written: `movzx`, `lea`, `mov`
/// and `jrcxz` leave them alone. Returns the offset (from the assembler's start) of its
/// `rel32` to the miss routine.
pub fn emit_ibl(ops: &mut VecAssembler<X64Relocation>, gateway: &Gateway) -> u64 {
    take_target(ops);
    emit_ibl_lookup(ops, gateway)
}

/// The lookup of an indirect `call` whose target is in RCX (guest RCX already saved in
/// `scratch_rcx`), with the push of the return address (emitted by `push`, which must change
/// no register or flag) after the lookup instead of before it: the CPU faults at a call to a
/// non-canonical address before it pushes, so nothing may be written below RSP then. On a hit
/// the push comes just before the jump to the target's block; on a miss, before the gateway's
/// miss routine, unless the target is non-canonical. Returns the offsets (from the
/// assembler's start) of the two `rel32`s to the miss routine.
pub fn emit_ibl_call(
    ops: &mut VecAssembler<X64Relocation>,
    gateway: &Gateway,
    push: PushReturn<'_>,
) -> [u64; 2] {
    take_target(ops);
    let (first, second) = lookup(ops, gateway, Some(push));
    [
        first,
        second.expect("a call's lookup has a second miss path"),
    ]
}

/// The indirect branch lookup for a guest target in 64-bit register `target` (neither RCX
/// nor RSP), with only RCX borrowed (the guest's RCX already in `scratch_rcx`), or also R11
/// when `target` is R11 and `r11_borrowed` (the guest's R11 in `scratch_r11`, the target
/// loaded into it). On a hit, gives the borrowed registers back and jumps to the target's
/// block; on a miss, leaves the target in `ibl_target` and the site in `ibl_site` and exits to
/// the dispatcher with `EXIT_IBL_MISS`. Flag-free, as [`emit_ibl`].
///
/// Every register the lookup borrows is saved and reloaded through the thread area: a round
/// trip on that register's dependency chain (about 6 cycles on AMD Zen 4, which forwards a
/// store to an absolute load late), paid by whatever reads the register next. So the slot is
/// found again from `target` on the hit path instead of being kept in a second register, and
/// a target that is not in a register already goes to R11: at a return (compiled code reads no
/// caller-saved register but RAX and RDX after a call) and at a PLT jump (R11 carries no
/// argument) nothing reads R11 before writing it, while RAX, which [`emit_ibl`] borrows, is
/// the return value. Returns the offset (from the assembler's start) of its `rel32` to the
/// gateway's exit.
#[allow(clippy::useless_conversion)]
pub fn emit_ibl_in(
    ops: &mut VecAssembler<X64Relocation>,
    gateway: &Gateway,
    target: Register,
    r11_borrowed: bool,
) -> u64 {
    debug_assert!(target.is_gpr64() && !matches!(target, Register::RCX | Register::RSP));
    debug_assert!(!r11_borrowed || target == Register::R11);
    let t = (target as u32 - Register::RAX as u32) as u8;
    let exit = gateway.exit.0 as usize;
    dynasm!(ops
        ; .arch x64
        ; movzx ecx, Rw(t)
        ; lea ecx, [rcx + rcx]
        ; lea ecx, [rcx + rcx]                            // set * 4, scaled by 8: 32-byte sets
        ; .u8 GS ; mov rcx, QWORD [rcx * 8 + off::IBL]    // !(first entry's guest address)
        ; lea rcx, [rcx + Rq(t) + 1]                      // 0 iff the entry holds the target
        ; jrcxz >hit
        ; .u8 GS ; mov rcx, QWORD [off::IBL2_OPEN]        // second entries closed: a miss
        ; jrcxz >site
        ; movzx ecx, Rw(t)
        ; lea ecx, [rcx + rcx]
        ; lea ecx, [rcx + rcx]
        ; .u8 GS ; mov rcx, QWORD [rcx * 8 + off::IBL + off::IBL_WAY]  // the second entry's
        ; lea rcx, [rcx + Rq(t) + 1]
        ; jrcxz >hit_second
        ; site:
        ; .u8 GS ; mov QWORD [off::IBL_TARGET], Rq(t)
    );
    if r11_borrowed {
        dynasm!(ops ; .arch x64 ; .u8 GS ; mov r11, QWORD [off::SCRATCH_R11]);
    }
    // The miss records where it happened: the dispatcher finds the guest branch from it when
    // the target cannot be run (a non-canonical address).
    dynasm!(ops
        ; .arch x64
        ; lea rcx, [<site]
        ; .u8 GS ; mov QWORD [off::IBL_SITE], rcx
        ; mov ecx, EXIT_IBL_MISS as i32
        ; jmp extern exit
    );
    let miss = ops.offset().0 as u64 - 4;
    dynasm!(ops
        ; .arch x64
        ; hit_second:
        ; movzx ecx, Rw(t)
        ; lea ecx, [rcx + rcx]
        ; lea ecx, [rcx + rcx + off::IBL_WAY / 8]
        ; jmp >host
        ; hit:
        ; movzx ecx, Rw(t)
        ; lea ecx, [rcx + rcx]
        ; lea ecx, [rcx + rcx]
        ; host:
        ; .u8 GS ; mov rcx, QWORD [rcx * 8 + off::IBL + 8]
        ; .u8 GS ; mov QWORD [off::JUMP_TO], rcx
    );
    if r11_borrowed {
        dynasm!(ops ; .arch x64 ; .u8 GS ; mov r11, QWORD [off::SCRATCH_R11]);
    }
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
        ; .u8 GS ; jmp QWORD [off::JUMP_TO]
    );
    miss
}

/// Emits a call's push of its return address (no register or flag changed).
pub type PushReturn<'a> = &'a mut dyn FnMut(&mut VecAssembler<X64Relocation>);

/// The lookup of [`emit_ibl`] after its first step: the guest target in RDX, the guest's RAX,
/// RCX and RDX in their scratch slots, RAX and RCX free. Returns the offset (from the
/// assembler's start) of its `rel32` to the gateway's miss routine.
pub fn emit_ibl_lookup(ops: &mut VecAssembler<X64Relocation>, gateway: &Gateway) -> u64 {
    lookup(ops, gateway, None).0
}

/// The lookup's first step: the guest's RAX and RDX to their scratch slots, the target from
/// RCX to RDX.
fn take_target(ops: &mut VecAssembler<X64Relocation>) {
    dynasm!(ops
        ; .arch x64
        ; .u8 GS ; mov QWORD [off::SCRATCH_RAX], rax
        ; .u8 GS ; mov QWORD [off::SCRATCH_RDX], rdx
        ; mov rdx, rcx                                    // rdx = guest target
    );
}

/// The lookup of [`emit_ibl_lookup`], with a call's `push` on its hit path and on the miss
/// path of a canonical target (see [`emit_ibl_call`]); the test is flag-free: target + 2^47
/// is below 2^48 exactly for a canonical target, so its two high bytes, brought down by
/// `bswap`, are zero. Returns the offsets of the `rel32`s to the miss routine (the second
/// with `push` only).
fn lookup(
    ops: &mut VecAssembler<X64Relocation>,
    gateway: &Gateway,
    mut push: Option<PushReturn<'_>>,
) -> (u64, Option<u64>) {
    let miss = gateway.ibl_miss.0 as usize;
    dynasm!(ops
        ; .arch x64
        ; movzx eax, dx
        ; lea eax, [rax + rax]
        ; lea eax, [rax + rax]                            // set * 4, scaled by 8: 32-byte sets
        ; .u8 GS ; mov rcx, QWORD [rax * 8 + off::IBL]    // !(first entry's guest address)
        ; lea rcx, [rcx + rdx + 1]                        // 0 iff the entry holds the target
        ; jrcxz >hit
        ; .u8 GS ; mov rcx, QWORD [off::IBL2_OPEN]        // second entries closed: a miss
        ; jrcxz >closed
        ; .u8 GS ; mov rcx, QWORD [rax * 8 + off::IBL + off::IBL_WAY]  // the second entry's
        ; lea rcx, [rcx + rdx + 1]
        ; jrcxz >hit_second
        ; closed:
    );
    if push.is_some() {
        dynasm!(ops
            ; .arch x64
            ; mov rax, QWORD 1 << 47
            ; lea rcx, [rdx + rax]
            ; bswap rcx
            ; movzx ecx, cx                               // 0 iff the target is canonical
            ; jrcxz >canonical
        );
    }
    // A miss records where it happened (RAX is saved): the dispatcher finds the guest branch
    // from it when the target cannot be run (a non-canonical address).
    dynasm!(ops
        ; .arch x64
        ; site:
        ; lea rax, [<site]
        ; .u8 GS ; mov QWORD [off::IBL_SITE], rax
        ; jmp extern miss
    );
    let first = ops.offset().0 as u64 - 4;
    let second = push.as_mut().map(|push| {
        dynasm!(ops ; .arch x64 ; canonical:);
        push(ops);
        dynasm!(ops
            ; .arch x64
            ; lea rax, [<site]
            ; .u8 GS ; mov QWORD [off::IBL_SITE], rax
            ; jmp extern miss
        );
        ops.offset().0 as u64 - 4
    });
    dynasm!(ops
        ; .arch x64
        ; hit_second:
        ; lea rax, [rax + off::IBL_WAY / 8]
        ; hit:
        ; .u8 GS ; mov rax, QWORD [rax * 8 + off::IBL + 8]
        ; .u8 GS ; mov QWORD [off::JUMP_TO], rax
        ; .u8 GS ; mov rax, QWORD [off::SCRATCH_RAX]
        ; .u8 GS ; mov rdx, QWORD [off::SCRATCH_RDX]
        ; .u8 GS ; mov rcx, QWORD [off::SCRATCH_RCX]
    );
    if let Some(push) = push {
        push(ops);
    }
    dynasm!(ops ; .arch x64 ; .u8 GS ; jmp QWORD [off::JUMP_TO]);
    (first, second)
}
