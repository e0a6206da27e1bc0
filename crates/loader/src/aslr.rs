//! The kernel's layout randomisation for a program it starts (`load_elf_binary`): the random
//! offset of a PIE's base and the random start of the heap, drawn as the kernel draws them,
//! so that a guest gets a fresh layout on every run under hotpath as it does natively.

use crate::PAGE_SIZE;

/// Bytes (1 GiB) past the image within which the kernel starts a 64-bit program's heap
/// (`arch_randomize_brk` on x86-64).
const BRK_RANGE: u64 = 1 << 30;

/// Bits of a PIE's random page offset when `vm.mmap_rnd_bits` cannot be read: the x86-64
/// default (`CONFIG_ARCH_MMAP_RND_BITS`), 1 TiB of 4 KiB pages.
const DEFAULT_MMAP_RND_BITS: u32 = 28;

/// What the kernel randomises in the layout of a program this process starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Randomization {
    /// Bits of the random page offset added to a PIE's base (`vm.mmap_rnd_bits`); 0 when
    /// bases are not randomised.
    pub mmap_rnd_bits: u32,
    /// Whether the heap's start is randomised.
    pub brk: bool,
}

impl Randomization {
    /// No randomisation: the layout the kernel gives under `setarch -R`.
    pub(crate) const NONE: Randomization = Randomization {
        mmap_rnd_bits: 0,
        brk: false,
    };

    /// As the kernel decides at exec (`PF_RANDOMIZE`): nothing when the personality has
    /// `ADDR_NO_RANDOMIZE` (`setarch -R`, which hotpath inherited across its own exec) or
    /// `kernel.randomize_va_space` is 0; the PIE's base from 1 on; the heap's start from 2
    /// on (the default).
    pub(crate) fn of_this_process() -> Randomization {
        // SAFETY: personality(0xffffffff) only reads the calling process's persona.
        let persona = unsafe { libc::personality(0xffff_ffff) };
        if persona != -1 && persona & libc::ADDR_NO_RANDOMIZE != 0 {
            return Randomization::NONE;
        }
        let level = read_sysctl("/proc/sys/kernel/randomize_va_space").unwrap_or(2);
        if level == 0 {
            return Randomization::NONE;
        }
        Randomization {
            mmap_rnd_bits: read_sysctl("/proc/sys/vm/mmap_rnd_bits")
                .map_or(DEFAULT_MMAP_RND_BITS, |b| b.min(40)),
            brk: level >= 2,
        }
    }

    /// A PIE's random offset in bytes (`arch_mmap_rnd`): a page count below
    /// 2^`mmap_rnd_bits`, in bytes; 0 without randomisation.
    pub(crate) fn pie_offset(&self) -> u64 {
        pie_offset_from(self.mmap_rnd_bits, random_u64())
    }

    /// Where the heap starts for an image whose heap would natively start at `at` (a guest
    /// address): a random page within [`BRK_RANGE`] bytes above it (`randomize_page`), or
    /// `at` itself without randomisation.
    pub(crate) fn brk_start(&self, at: u64) -> u64 {
        match self.brk {
            true => brk_start_from(at, random_u64()),
            false => at,
        }
    }
}

/// [`Randomization::pie_offset`] for random bits `r`.
fn pie_offset_from(bits: u32, r: u64) -> u64 {
    if bits == 0 {
        return 0;
    }
    (r & ((1u64 << bits) - 1)) * PAGE_SIZE
}

/// [`Randomization::brk_start`] with randomisation, for random bits `r` (the kernel's
/// `randomize_page(at, BRK_RANGE)`: `at` rounded up to a page, plus a page count below the
/// range's).
fn brk_start_from(at: u64, r: u64) -> u64 {
    let start = crate::page_ceil(at);
    let range = BRK_RANGE - (start - at);
    let range = range.min(u64::MAX - start) / PAGE_SIZE;
    if range == 0 {
        return start;
    }
    start + (r % range) * PAGE_SIZE
}

/// A number from a sysctl file of one decimal number, if it can be read.
fn read_sysctl(path: &str) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// 64 random bits from the kernel (0 if it gives none, which places as without
/// randomisation).
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into the buffer we own.
    let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    match got {
        8 => u64::from_ne_bytes(b),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pie_offset_is_a_page_count_below_the_kernels_bound() {
        assert_eq!(pie_offset_from(0, u64::MAX), 0);
        assert_eq!(pie_offset_from(28, 0), 0);
        assert_eq!(pie_offset_from(28, u64::MAX), ((1 << 28) - 1) * PAGE_SIZE);
        assert_eq!(pie_offset_from(28, 1 << 28), 0);
        assert_eq!(pie_offset_from(32, 3), 3 * PAGE_SIZE);
    }

    #[test]
    fn the_heap_starts_on_a_page_within_a_gib_of_the_image() {
        assert_eq!(brk_start_from(0x4c_5000, 0), 0x4c_5000);
        assert_eq!(brk_start_from(0x4c_5123, 0), 0x4c_6000);
        let last = brk_start_from(0x4c_5000, u64::MAX);
        assert!(
            last < 0x4c_5000 + BRK_RANGE && last % PAGE_SIZE == 0,
            "{last:#x}"
        );
        for r in [1u64, 12345, 1 << 40, u64::MAX / 3] {
            let s = brk_start_from(0x5555_5555_8123, r);
            assert!(
                s >= 0x5555_5555_9000 && s < 0x5555_5555_8123 + BRK_RANGE,
                "{s:#x}"
            );
            assert_eq!(s % PAGE_SIZE, 0);
        }
        assert_eq!(Randomization::NONE.brk_start(0x4c_5123), 0x4c_5123);
        assert_eq!(Randomization::NONE.pie_offset(), 0);
    }
}
