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

/// The frame's software bytes: `magic1` (in the legacy region's reserved bytes) and `magic2`
/// (after the image) say that an XSAVE image follows the legacy region (the kernel's
/// `FP_XSTATE_MAGIC1/2`).
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;
/// Offset of XSTATE_BV in the image (the XSAVE header's bitmap of the components not in their
/// initial configuration); XCOMP_BV and the header's reserved bytes follow it up to byte 576.
const XSTATE_BV: usize = 512;
/// XSTATE_BV's x87 and SSE bits.
const FP_SSE: u64 = 3;

/// Makes the gateway's saved image `image` (standard format, as long as a frame's) what the
/// kernel's XSAVE writes into a signal frame. The gateway saves with XSAVEOPT, which leaves the
/// bytes of a component in its initial configuration as they were (its XSTATE_BV bit clear),
/// and never saves `saved`'s complement (AMX tile configuration); the frame shows those
/// components' initial values, since a handler may read the legacy region's x87 and XMM
/// registers without looking at XSTATE_BV. As the kernel does for programs that never look at
/// XSTATE_BV, the x87 and SSE bits are set (its `save_xstate_epilog`).
fn as_xsave_writes(image: &mut [u8], saved: u64, layout: &crate::host::cpu::XstateLayout) {
    let mut bv = u64::from_le_bytes(image[XSTATE_BV..XSTATE_BV + 8].try_into().unwrap());
    if bv & 1 == 0 {
        // x87: control word 0x37F, every other field and register 0 (MXCSR, bytes 24..32,
        // belongs to SSE and AVX).
        image[0..24].fill(0);
        image[0..2].copy_from_slice(&0x037fu16.to_le_bytes());
        image[32..160].fill(0);
    }
    if bv & 2 == 0 {
        image[160..416].fill(0); // XMM0-15
    }
    for c in &layout.components {
        let bit = 1u64 << c.bit;
        if layout.frame_features & bit != 0 && (bv & bit == 0 || saved & bit == 0) {
            image[c.offset..c.offset + c.size].fill(0);
            bv &= !bit;
        }
    }
    bv |= FP_SSE;
    image[XSTATE_BV..XSTATE_BV + 8].copy_from_slice(&bv.to_le_bytes());
}

/// Reads the XSAVE image of a guest's signal frame at `fpstate` (guest address) for
/// `rt_sigreturn`, checked as the kernel checks it: an image without the software bytes' magic
/// restores the legacy region alone (the rest initial); a header with components the frame
/// cannot have or a non-zero byte among its bytes 8..23 (XCOMP_BV and the next eight), or MXCSR
/// bits the CPU does not have, is a bad frame, which XRSTOR would refuse with a fault in
/// hotpath's gateway (the header's later bytes XRSTOR ignores, as natively).
///
/// # Errors
/// `SIGSEGV` (the signal the kernel sends for a bad frame) when the image cannot be read or
/// is not valid.
fn frame_image(fpstate: u64) -> Result<Vec<u8>, i32> {
    let layout = crate::host::cpu::xstate_layout();
    let size = layout.frame_size;
    let mut fp = vec![0u8; size];
    guest_mem::read(fpstate, &mut fp[..512]).map_err(|_| libc::SIGSEGV)?;
    let word = |fp: &[u8], off: usize| u32::from_le_bytes(fp[off..off + 4].try_into().unwrap());
    let mut magic2 = [0u8; 4];
    let extended = word(&fp, 464) == FP_XSTATE_MAGIC1
        && word(&fp, 468) as usize == size + 4
        && word(&fp, 480) as usize == size
        && guest_mem::read(fpstate + size as u64, &mut magic2).is_ok()
        && u32::from_le_bytes(magic2) == FP_XSTATE_MAGIC2;
    if extended {
        guest_mem::read(fpstate + 512, &mut fp[512..]).map_err(|_| libc::SIGSEGV)?;
        let bv = u64::from_le_bytes(fp[XSTATE_BV..XSTATE_BV + 8].try_into().unwrap());
        if bv & !layout.frame_features != 0
            || fp[XSTATE_BV + 8..XSTATE_BV + 24].iter().any(|&b| b != 0)
        {
            return Err(libc::SIGSEGV);
        }
    } else {
        fp[XSTATE_BV..XSTATE_BV + 8].copy_from_slice(&FP_SSE.to_le_bytes());
    }
    if word(&fp, 24) & !layout.mxcsr_mask != 0 {
        return Err(libc::SIGSEGV);
    }
    // The software bytes are not state.
    fp[464..512].fill(0);
    Ok(fp)
}

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
        let layout = crate::host::cpu::xstate_layout();
        let xsize = layout.frame_size;
        sp -= xsize as u64 + 4;
        sp &= !63;
        let fpstate = sp;
        let mut fp = area.xsave.0[..xsize].to_vec();
        as_xsave_writes(&mut fp, self.xsave_mask, layout);
        fp[464..468].copy_from_slice(&FP_XSTATE_MAGIC1.to_le_bytes());
        fp[468..472].copy_from_slice(&((xsize + 4) as u32).to_le_bytes()); // extended_size
        fp[472..480].copy_from_slice(&layout.frame_features.to_le_bytes()); // xfeatures
        fp[480..484].copy_from_slice(&(xsize as u32).to_le_bytes()); // xstate_size
        fp.extend_from_slice(&FP_XSTATE_MAGIC2.to_le_bytes());
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
            let image = frame_image(fpstate)?;
            area.xsave.0[..image.len()].copy_from_slice(&image);
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
