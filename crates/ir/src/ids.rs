//! Newtypes for block ids and for guest and host addresses, so the two never mix silently.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Dense id of a translated block, handed out in translation order from 0.
///
/// Monitor tables are arrays indexed by it. Superblocks share the same id space.
/// A block re-translated after a code cache flush gets a new id.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The id as an index into a table (`usize`).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A virtual address in the guest's address space (which is also hotpath's: the guest
/// image is mapped at its own addresses in hotpath's process).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct GuestAddr(pub u64);

impl GuestAddr {
    /// The address `bytes` bytes further on (wrapping like the CPU's RIP).
    pub fn offset(self, bytes: u64) -> GuestAddr {
        GuestAddr(self.0.wrapping_add(bytes))
    }
}

impl fmt::Display for GuestAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A virtual address of host code in the code cache (its executable view).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HostAddr(pub u64);

impl fmt::Display for HostAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "host:{:#x}", self.0)
    }
}
