//! Ids and small shared pieces of the path recorder: the one `NONE`, the hasher of its maps,
//! direct-mapped cache slots.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// No block, node, function or path (the monitor's one "none", `tables::NONE`).
pub(crate) use crate::tables::NONE;

/// FxHash-style hasher: path keys are short `u32` sequences hashed once per path end.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// The slot of key `(a, b)` in a direct-mapped cache of `slots` entries (a power of two).
#[inline]
pub(crate) fn cache_slot(a: u32, b: u32, slots: usize) -> usize {
    let h = (((a as u64) << 32) | b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> (64 - slots.trailing_zeros())) as usize
}
