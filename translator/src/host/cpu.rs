//! Facts about the host CPU and the guest's CPU settings that decoding, the thread area and the
//! runtime all read: protection keys, the PKRU a process starts with, the guest thread's
//! time-stamp-counter mode (`PR_SET_TSC`), and the counter as hotpath's own clock. A leaf: it
//! imports nothing of the translator's.

use std::sync::OnceLock;
use std::time::Instant;

/// The host has protection keys enabled (CPUID.(EAX=7,ECX=0):ECX.OSPKE, bit 4).
pub fn host_pku() -> bool {
    std::arch::x86_64::__cpuid_count(7, 0).ecx & (1 << 4) != 0
}

thread_local! {
    /// The guest thread disabled its time-stamp counter (`prctl(PR_SET_TSC,
    /// PR_TSC_SIGSEGV)`): its `rdtsc` and `rdtscp` raise #GP as the kernel's CR4.TSD makes
    /// them do. Emulated, not passed on: the kernel's setting would stop hotpath's own clock.
    static TSC_SIGSEGV: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this guest thread's `rdtsc` and `rdtscp` fault (`set_tsc_sigsegv`).
pub fn tsc_sigsegv() -> bool {
    TSC_SIGSEGV.with(|t| t.get())
}

/// Sets this guest thread's time-stamp counter mode (`PR_SET_TSC`; a new thread inherits its
/// creator's). The caller discards translations made under the other mode.
pub fn set_tsc_sigsegv(on: bool) {
    TSC_SIGSEGV.with(|t| t.set(on));
}

/// The first [`tsc`] reading of the process and the time it was taken: what [`tsc_ns`]
/// measures the counter's rate against.
static TSC_EPOCH: OnceLock<(Instant, u64)> = OnceLock::new();

fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` only reads the counter; hotpath never lets the kernel disable it for
    // the process (the guest's `PR_TSC_SIGSEGV` is emulated, `set_tsc_sigsegv`).
    unsafe { std::arch::x86_64::_rdtsc() }
}

/// The time-stamp counter now, in ticks: a clock for hotpath's own work that is read around
/// each block translated, where `clock_gettime` (20–70 ns through the vDSO on the VMs
/// measured) cost a warm `python3 -c pass` 5 % of its run. [`tsc_ns`] turns ticks into
/// nanoseconds.
pub fn tsc() -> u64 {
    TSC_EPOCH.get_or_init(|| (Instant::now(), rdtsc()));
    rdtsc()
}

/// `ticks` of [`tsc`] in nanoseconds, at the rate the counter ran since the process's first
/// reading (0 before any).
pub fn tsc_ns(ticks: u64) -> u64 {
    let Some(&(at, first)) = TSC_EPOCH.get() else {
        return 0;
    };
    let (ns, elapsed) = (at.elapsed().as_nanos() as f64, rdtsc().wrapping_sub(first));
    if elapsed == 0 {
        return 0;
    }
    (ticks as f64 * ns / elapsed as f64) as u64
}

/// One extended state component (XCR0 bit 2 or above) in the XSAVE standard format.
#[derive(Clone, Copy, Debug)]
pub struct XstateComponent {
    /// Its bit in XCR0 and XSTATE_BV.
    pub bit: u32,
    /// Offset of its state from the start of the image, bytes (CPUID.(EAX=0DH,ECX=bit):EBX).
    pub offset: usize,
    /// Size of its state, bytes (CPUID.(EAX=0DH,ECX=bit):EAX).
    pub size: usize,
}

/// The host's XSAVE standard format, read from CPUID once per process: what the gateway saves
/// and what the kernel puts in a signal frame.
#[derive(Debug)]
pub struct XstateLayout {
    /// The components of a signal frame's image: XCR0 less those whose first use the kernel
    /// traps (XFD, CPUID.(EAX=0DH,ECX=bit):ECX bit 2: AMX tile data), as a process that asked
    /// for no extra permission sees them (the kernel's `xfeatures` in the frame).
    pub frame_features: u64,
    /// Bytes of a signal frame's image (the kernel's `xstate_size`): up to the end of the last
    /// component of `frame_features`.
    pub frame_size: usize,
    /// The bits of MXCSR the CPU lets software set (the image's MXCSR_MASK, 0xFFBF when the
    /// CPU writes 0 there).
    pub mxcsr_mask: u32,
    /// Every extended component of XCR0, by bit.
    pub components: Vec<XstateComponent>,
}

/// Bytes of the XSAVE legacy region and header, before the first extended component.
const XSAVE_LEGACY_AND_HEADER: usize = 576;

impl XstateLayout {
    /// Bytes of a standard-format image holding `features`: the end of its last component.
    pub fn size_for(&self, features: u64) -> usize {
        self.components
            .iter()
            .filter(|c| features >> c.bit & 1 != 0)
            .map(|c| c.offset + c.size)
            .fold(XSAVE_LEGACY_AND_HEADER, usize::max)
    }

    fn read() -> XstateLayout {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        let mut xcr0 = 3; // x87 and SSE: what FXSAVE has, without XSAVE.
        if __cpuid(1).ecx & (1 << 27) != 0 {
            let (lo, hi): (u32, u32);
            // SAFETY: xgetbv(0) is valid when OSXSAVE is set (checked above).
            unsafe {
                std::arch::asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi,
                    options(nomem, nostack, preserves_flags));
            }
            xcr0 = (hi as u64) << 32 | lo as u64;
        }
        let mut components = Vec::new();
        let mut trapped = 0u64;
        for bit in 2..64 {
            if xcr0 >> bit & 1 == 0 {
                continue;
            }
            let leaf = __cpuid_count(0xd, bit);
            if leaf.ecx & (1 << 2) != 0 {
                trapped |= 1 << bit;
            }
            components.push(XstateComponent {
                bit,
                offset: leaf.ebx as usize,
                size: leaf.eax as usize,
            });
        }
        #[repr(C, align(16))]
        struct Fxsave([u8; 512]);
        let mut fx = Fxsave([0; 512]);
        // SAFETY: FXSAVE writes exactly the 512 bytes of the 16-byte-aligned buffer.
        unsafe {
            std::arch::asm!("fxsave64 [{}]", in(reg) fx.0.as_mut_ptr(),
                options(nostack, preserves_flags));
        }
        let mask = u32::from_le_bytes(fx.0[28..32].try_into().unwrap());
        let mut layout = XstateLayout {
            frame_features: xcr0 & !trapped,
            frame_size: 0,
            mxcsr_mask: if mask == 0 { 0xffbf } else { mask },
            components,
        };
        layout.frame_size = layout.size_for(layout.frame_features);
        layout
    }
}

/// The host's XSAVE layout (read on first use).
pub fn xstate_layout() -> &'static XstateLayout {
    static LAYOUT: OnceLock<XstateLayout> = OnceLock::new();
    LAYOUT.get_or_init(XstateLayout::read)
}

/// Writes `pkru` as the PKRU of the guest's saved XSAVE state `xsave` (standard format), which
/// the next entry to the cache loads. False if `xsave` has no room for it.
pub fn set_guest_pkru(xsave: &mut [u8], pkru: u32) -> bool {
    // XSAVE component 9 (PKRU): its offset in the standard format (one CPUID per process:
    // every thread area is given the initial PKRU), and its XSTATE_BV bit.
    static OFFSET: OnceLock<usize> = OnceLock::new();
    let offset = *OFFSET.get_or_init(|| std::arch::x86_64::__cpuid_count(0xd, 9).ebx as usize);
    let Some(slot) = xsave.get_mut(offset..offset + 4) else {
        return false;
    };
    slot.copy_from_slice(&pkru.to_le_bytes());
    xsave[512 + 1] |= 1 << 1; // XSTATE_BV bit 9: byte 513, bit 1
    true
}

/// The PKRU a process starts with, and a signal handler runs with (the kernel's
/// `init_pkru_value`, 0x55555554 by default: every key but 0 denied), on a host with protection
/// keys; `None` without them. Read from hotpath's own PKRU the first time (the kernel set it at
/// `execve`, and hotpath never changes it), which is before any guest code runs.
pub fn initial_pkru() -> Option<u32> {
    static PKRU: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *PKRU.get_or_init(|| {
        host_pku().then(|| {
            let pkru: u32;
            // SAFETY: `rdpkru` (ECX = 0) reads the thread's PKRU; OSPKE is set (checked).
            unsafe {
                std::arch::asm!("rdpkru", in("ecx") 0, out("eax") pkru, out("edx") _,
                    options(nomem, nostack, preserves_flags));
            }
            pkru
        })
    })
}
