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

/// Writes `pkru` as the PKRU of the guest's saved XSAVE state `xsave` (standard format), which
/// the next entry to the cache loads. False if `xsave` has no room for it.
pub fn set_guest_pkru(xsave: &mut [u8], pkru: u32) -> bool {
    // XSAVE component 9 (PKRU): its offset in the standard format, and its XSTATE_BV bit.
    let offset = std::arch::x86_64::__cpuid_count(0xd, 9).ebx as usize;
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
