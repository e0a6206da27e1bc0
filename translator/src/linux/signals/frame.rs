//! The guest's signal frame: the kernel's x86-64 `rt_sigframe` (return address, `ucontext`,
//! `siginfo`, XSAVE image) built on the guest's stack, and `rt_sigreturn` reading it back.

use super::*;
use crate::host::thread_area;

// Kernel `struct ucontext` layout on x86-64 (offsets in bytes).
const UC_FLAGS: usize = 0;
const UC_STACK: usize = 16;
const UC_MCONTEXT: usize = 40;
const UC_SIGMASK: usize = 296;
const UC_SIZE: usize = 304;
const MC_RIP: usize = 128;
const MC_EFLAGS: usize = 136;
const MC_CSGSFS: usize = 144;
const MC_ERR: usize = 152;
const MC_TRAPNO: usize = 160;
const MC_OLDMASK: usize = 168;
const MC_CR2: usize = 176;
const MC_FPSTATE: usize = 184;
/// `sigcontext` GPR order (r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp) as indices into
/// `ThreadArea::gpr` (x86 encoding order).
const SIGCONTEXT_GPR: [usize; 16] = [8, 9, 10, 11, 12, 13, 14, 15, 7, 6, 5, 3, 2, 0, 1, 4];

/// Puts the guest's FPU/SSE/AVX state (and PKRU) back to what a handler starts with.
fn reset_xsave(area: &mut ThreadArea) {
    area.xsave.0[..1024].fill(0);
    area.xsave.0[0..2].copy_from_slice(&0x037fu16.to_le_bytes());
    area.xsave.0[24..28].copy_from_slice(&0x1f80u32.to_le_bytes());
    // The kernel gives a handler its initial PKRU, not the architectural 0.
    if let Some(pkru) = crate::host::cpu::initial_pkru() {
        crate::host::cpu::set_guest_pkru(&mut area.xsave.0, pkru);
    }
}

impl SignalState {
    /// Builds the kernel's `rt_sigframe` for `sig` on the guest's stack and points the guest
    /// at its handler; the frame restores mask `saved`, the handler runs with `base` plus its
    /// `sa_mask` (and `sig` itself unless SA_NODEFER); its `sigcontext` shows `trap` (trap
    /// number, error code, CR2, EFLAGS.RF). Returns the handler's address and mask.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn setup_frame(
        &mut self,
        area: &mut ThreadArea,
        sig: i32,
        info: &[u8; 128],
        rip: u64,
        saved: u64,
        base: u64,
        trap: TrapDetails,
    ) -> Result<(u64, u64), ()> {
        let mask = saved;
        let a = self.action(sig);
        let rsp = area.gpr[thread_area::RSP];
        let on_alt = self.on_altstack(rsp);
        let mut sp =
            if a.flags & SA_ONSTACK != 0 && self.altstack.flags & SS_DISABLE == 0 && !on_alt {
                self.altstack.sp + self.altstack.size
            } else {
                rsp - 128
            };
        // XSAVE image, 64-byte aligned, followed by the 4-byte FP_XSTATE_MAGIC2.
        let xsize = self.xsave_size;
        sp -= xsize as u64 + 4;
        sp &= !63;
        let fpstate = sp;
        let mut fp = area.xsave.0[..xsize].to_vec();
        if fp[512] & 1 == 0 {
            // x87 state in its init configuration: XSAVE left its bytes as they were; the
            // kernel's frame shows the init values (FCW 0x37f, everything else 0).
            fp[0..24].fill(0);
            fp[0..2].copy_from_slice(&0x037fu16.to_le_bytes());
            fp[32..160].fill(0);
            fp[512] |= 1;
        }
        fp[464..468].copy_from_slice(&0x4650_5853u32.to_le_bytes()); // FP_XSTATE_MAGIC1
        fp[468..472].copy_from_slice(&((xsize + 4) as u32).to_le_bytes()); // extended_size
        fp[472..480].copy_from_slice(&self.xsave_mask.to_le_bytes()); // xfeatures
        fp[480..484].copy_from_slice(&(xsize as u32).to_le_bytes()); // xstate_size
        fp.extend_from_slice(&0x4650_5845u32.to_le_bytes()); // FP_XSTATE_MAGIC2
        guest_mem::write(fpstate, &fp).map_err(|_| ())?;

        const FRAME: u64 = 8 + UC_SIZE as u64 + 128;
        sp = ((sp - FRAME) & !15) - 8;
        let frame = sp;
        let mut f = vec![0u8; FRAME as usize];
        let put =
            |f: &mut Vec<u8>, off: usize, v: u64| f[off..off + 8].copy_from_slice(&v.to_le_bytes());
        put(&mut f, 0, a.restorer);
        let uc = 8;
        put(&mut f, uc + UC_FLAGS, 1 | 2 | 4); // UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS
        put(&mut f, uc + UC_STACK, self.altstack.sp);
        let ss_flags = if on_alt {
            SS_ONSTACK
        } else {
            self.altstack.flags
        };
        f[uc + UC_STACK + 8..uc + UC_STACK + 12].copy_from_slice(&ss_flags.to_le_bytes());
        put(&mut f, uc + UC_STACK + 16, self.altstack.size);
        for (i, &slot) in SIGCONTEXT_GPR.iter().enumerate() {
            put(&mut f, uc + UC_MCONTEXT + 8 * i, area.gpr[slot]);
        }
        put(&mut f, uc + UC_MCONTEXT + MC_RIP, rip);
        const RF: u64 = 0x1_0000;
        let eflags = (area.rflags & !RF) | if trap.rf { RF } else { 0 };
        put(&mut f, uc + UC_MCONTEXT + MC_EFLAGS, eflags);
        // cs, gs, fs, ss
        put(&mut f, uc + UC_MCONTEXT + MC_CSGSFS, 0x33 | (0x2b << 48));
        put(&mut f, uc + UC_MCONTEXT + MC_ERR, trap.err);
        put(&mut f, uc + UC_MCONTEXT + MC_TRAPNO, trap.trapno);
        put(&mut f, uc + UC_MCONTEXT + MC_OLDMASK, mask);
        put(&mut f, uc + UC_MCONTEXT + MC_CR2, trap.cr2);
        put(&mut f, uc + UC_MCONTEXT + MC_FPSTATE, fpstate);
        put(&mut f, uc + UC_SIGMASK, mask);
        f[8 + UC_SIZE..].copy_from_slice(info);
        guest_mem::write(frame, &f).map_err(|_| ())?;

        area.gpr[thread_area::RSP] = frame;
        area.gpr[thread_area::RDI] = sig as u64;
        area.gpr[thread_area::RSI] = frame + 8 + UC_SIZE as u64;
        area.gpr[thread_area::RDX] = frame + 8;
        area.gpr[thread_area::RAX] = 0;
        // The kernel clears DF, TF and RF for the handler and gives it a fresh FPU state.
        area.rflags &= !(0x400 | 0x100 | 0x10000);
        reset_xsave(area);
        let mut new_mask = base | a.mask;
        if a.flags & SA_NODEFER == 0 {
            new_mask |= 1 << (sig - 1);
        }
        if a.flags & SA_RESETHAND != 0 {
            self.set_action(sig, GuestAction::default());
        }
        let _ = SA_SIGINFO | SA_RESTORER;
        Ok((a.handler, new_mask))
    }

    /// `rt_sigreturn` for the guest: restores the context saved in the frame at `rsp - 8`.
    /// Returns the guest RIP to resume at.
    pub fn sigreturn(&mut self, area: &mut ThreadArea) -> Result<u64, i32> {
        let frame = area.gpr[thread_area::RSP] - 8;
        let mut f = vec![0u8; 8 + UC_SIZE];
        guest_mem::read(frame, &mut f).map_err(|_| libc::SIGSEGV)?;
        let get = |off: usize| u64::from_le_bytes(f[off..off + 8].try_into().unwrap());
        let uc = 8;
        for (i, &slot) in SIGCONTEXT_GPR.iter().enumerate() {
            area.gpr[slot] = get(uc + UC_MCONTEXT + 8 * i);
        }
        let rip = get(uc + UC_MCONTEXT + MC_RIP);
        // Only the flags user code may change (the kernel's FIX_EFLAGS).
        const FIX_EFLAGS: u64 = 0x0004_0dd5 | 0x0001_0000;
        let eflags = get(uc + UC_MCONTEXT + MC_EFLAGS);
        area.rflags = (area.rflags & !FIX_EFLAGS) | (eflags & FIX_EFLAGS) | 0x2;
        let fpstate = get(uc + UC_MCONTEXT + MC_FPSTATE);
        if fpstate != 0 {
            let mut fp = vec![0u8; self.xsave_size];
            guest_mem::read(fpstate, &mut fp).map_err(|_| libc::SIGSEGV)?;
            // Keep the header's reserved bytes zero, as XRSTOR demands.
            fp[464..512].fill(0);
            area.xsave.0[..self.xsave_size].copy_from_slice(&fp);
        } else {
            reset_xsave(area);
        }
        let mask =
            get(uc + UC_SIGMASK) & !((1 << (libc::SIGKILL - 1)) | (1 << (libc::SIGSTOP - 1)));
        set_mask(mask);
        let ss_sp = get(uc + UC_STACK);
        let ss_flags =
            i32::from_le_bytes(f[uc + UC_STACK + 8..uc + UC_STACK + 12].try_into().unwrap());
        let ss_size = get(uc + UC_STACK + 16);
        if ss_flags & SS_DISABLE != 0 {
            self.altstack = AltStack {
                sp: 0,
                flags: SS_DISABLE,
                size: 0,
            };
        } else if ss_size >= MINSIGSTKSZ {
            self.altstack = AltStack {
                sp: ss_sp,
                flags: 0,
                size: ss_size,
            };
        }
        Ok(rip)
    }
}
