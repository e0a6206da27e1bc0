//! The per-guest-thread area that translated code reaches through the GS segment: saved guest
//! context, scratch slots, the event ring, the XSAVE area and the indirect branch lookup table.
//!
//! # Who touches what
//!
//! The GS base of a guest thread's host thread points at its `ThreadArea` for the thread's whole
//! life (the guest never gets GS: hotpath refuses guest writes to it). Emitted code addresses
//! fields as `gs:[OFFSET]`, with the offsets below. Fields are written by that thread only —
//! by emitted code while it runs in the code cache, by its Rust dispatcher otherwise — except
//! `ring.consumer`, which the monitor thread writes (see `hotpath_events`).
//!
//! The ring's entries follow the struct in the same mapping, at [`ENTRIES_OFFSET`].

use std::mem::{offset_of, size_of};

use hotpath_events::RingControl;

/// Number of sets in the indirect branch lookup table: indexed by the low 16 bits of the
/// guest target, two entries each ([`IblSet`]). The victim table behind it has as many
/// entries, indexed by [`ThreadArea::ibl2_index`].
pub const IBL_ENTRIES: usize = 1 << 16;

/// Set indices [`ThreadArea::fill_ibl`] logs for [`ThreadArea::forget_all_ibl`] (2 bytes
/// each: 8 KiB): a thread that filled more sets since the table was last emptied gets the
/// whole table swept instead (2 MiB of stores). A short process fills a few hundred; a
/// sweep of the whole table would allocate every page of it.
pub const IBL_FILL_LOG: usize = 4096;

/// Jump-table sites a thread's code cache can hold at once (`jump_table`): each has a table in
/// the thread area, so a translation beyond this many goes through the lookup instead.
pub const JUMP_TABLE_SITES: usize = 128;

/// Entries of one site's table: a `switch` index at or above it goes through the lookup.
pub const JUMP_TABLE_ENTRIES: usize = 256;

/// Words of one site's table in the thread area: its base, its fill stub, then its entries
/// (from word [`JUMP_TABLE_FIRST`]).
pub const JUMP_TABLE_STRIDE: usize = JUMP_TABLE_FIRST + JUMP_TABLE_ENTRIES;

/// The word of a site's table where its entries start.
pub const JUMP_TABLE_FIRST: usize = 2;

/// A site's base word before its first fill: no guest base register can hold it (it is not a
/// canonical address).
pub const JUMP_TABLE_NO_BASE: u64 = u64::MAX;

/// Bytes reserved for the XSAVE image of the guest's x87/SSE/AVX/AVX-512 state.
pub const XSAVE_AREA_SIZE: usize = 16384;

/// Index of RAX in `gpr`.
pub const RAX: usize = 0;
/// Index of RCX in `gpr`.
pub const RCX: usize = 1;
/// Index of RDX in `gpr`.
pub const RDX: usize = 2;
/// Index of RSP in `gpr`.
pub const RSP: usize = 4;
/// Index of RSI in `gpr`.
pub const RSI: usize = 6;
/// Index of RDI in `gpr`.
pub const RDI: usize = 7;
/// Index of R8 in `gpr`.
pub const R8: usize = 8;
/// Index of R9 in `gpr`.
pub const R9: usize = 9;
/// Index of R10 in `gpr`.
pub const R10: usize = 10;
/// Index of R11 in `gpr`.
pub const R11: usize = 11;

/// One slot of the indirect branch lookup table.
///
/// `tag` holds the bitwise complement of the guest address, `-guest - 1`, so emitted code can
/// test for a match with `lea rcx, [tag + target + 1]` + `jrcxz`, which do not touch the flags.
/// A zero slot therefore matches only the non-canonical target `u64::MAX`, whose slot is the
/// last one: so a fresh, zero-filled table is empty as it is mapped (nothing to write at
/// start-up) as long as the last slot points at the miss path ([`ThreadArea::map`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IblEntry {
    /// `!guest_target`.
    pub tag: u64,
    /// Host address of the target's translated block entry.
    pub host: u64,
}

/// One set of the lookup table: its two entries side by side, so that a probe of both, a fill
/// and the pages a short process touches stay in one cache line and one page.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub struct IblSet {
    /// The target filled last.
    pub first: IblEntry,
    /// The target the first entry held before (probed inline at every lookup site after a
    /// first-entry miss while `ibl2_open`), so that two hot targets 64 KiB apart (a large
    /// program's returns) both stay in the table.
    pub second: IblEntry,
}

impl IblEntry {
    /// The slot for guest `target`, translated at host address `host`.
    pub fn new(target: u64, host: u64) -> IblEntry {
        IblEntry { tag: !target, host }
    }

    /// True if the slot holds guest `target`.
    pub fn holds(&self, target: u64) -> bool {
        self.tag == !target
    }

    /// A tag that no lookup reaching slot `index` can match: that of a target whose low 16
    /// bits index another slot. (The target is below 2^16, so it indexes the victim table's
    /// slot `index ^ 1` too: the tag is dead there as well.)
    pub fn dead_tag(index: usize) -> u64 {
        !((index ^ 1) as u64)
    }

    /// The guest target the lookup table's slot `index` holds, if it holds one (not empty,
    /// not dead).
    fn target_at(&self, index: usize) -> Option<u64> {
        let target = !self.tag;
        (target != u64::MAX && ThreadArea::ibl_index(target) == index).then_some(target)
    }
}

/// The XSAVE image (64-byte aligned as XSAVE requires).
#[repr(C, align(64))]
pub struct XsaveArea(pub [u8; XSAVE_AREA_SIZE]);

/// The guest's saved context and the translator's per-thread slots.
#[repr(C, align(4096))]
pub struct ThreadArea {
    /// Guest general-purpose registers, x86 encoding order (RAX, RCX, RDX, RBX, RSP, RBP, RSI,
    /// RDI, R8..R15). Valid while the thread is outside the code cache.
    pub gpr: [u64; 16],
    /// Guest RFLAGS, valid outside the code cache.
    pub rflags: u64,
    /// Guest FS base.
    pub fs_base: u64,
    /// Host FS base (Rust's thread-local storage), restored on every exit from the cache.
    pub host_fs_base: u64,
    /// Host RSP inside `enter`, restored by the exit routine.
    pub host_rsp: u64,
    /// Host MXCSR, restored on every exit (the guest may change rounding modes).
    pub host_mxcsr: u32,
    /// Host x87 control word.
    pub host_fcw: u16,
    _pad0: u16,
    /// Scratch slot: guest RCX while emitted code borrows RCX.
    pub scratch_rcx: u64,
    /// Scratch slot: guest RAX while the indirect branch lookup borrows RAX.
    pub scratch_rax: u64,
    /// Scratch slot: guest RDX while the indirect branch lookup borrows RDX.
    pub scratch_rdx: u64,
    /// Scratch slot: guest R11 while the lookup of a `ret` or of a `jmp` through memory holds
    /// the target in R11 (see `gateway::emit_ibl_in`).
    pub scratch_r11: u64,
    /// Why the thread left the code cache: an exit index, or one of the `EXIT_*` codes.
    pub exit_code: u64,
    /// Host address to resume at after a ring refill (the enqueue stub's block entry).
    pub resume: u64,
    /// Guest target of an indirect branch that missed the lookup table.
    pub ibl_target: u64,
    /// Host address of the missed lookup (in the block of the indirect branch), so the
    /// dispatcher can find the guest branch; 0 when unknown (the empty-slot path).
    pub ibl_site: u64,
    /// Host address `enter` and the lookup hit path jump to.
    pub jump_to: u64,
    /// Scratch slot: the guest's value of the register a rewritten instruction borrows to
    /// address a far RIP-relative operand (see `emit::encode_at`).
    pub scratch_far: u64,
    /// Nonzero while a signal the guest may receive now is pending: set by the host signal
    /// handler, recomputed by the dispatcher, read by the syscall gate (`syscalls`).
    pub gate_pending: u64,
    /// This thread's handler state (`signals::HandlerShared`), for the host signal handler,
    /// which finds the area through the GS base.
    pub handler: u64,
    /// Nonzero while the lookup table's second entries and the victim table may be probed:
    /// the signal handler clears it when it empties the lookup table to bring the thread to
    /// the dispatcher (one store instead of killing 128 Ki tags), and the dispatcher sets it
    /// again once no signal is deliverable.
    pub ibl2_open: u64,
    /// The event ring's control block.
    pub ring: RingControl,
    /// XSAVE image of the guest's extended state, valid outside the code cache.
    pub xsave: XsaveArea,
    /// The indirect branch lookup table, 32 bytes a set. A handler emptying the table kills
    /// the first entries' tags alone and closes the second ones with `ibl2_open`, as the
    /// victim table. Pages untouched until used.
    pub ibl: [IblSet; IBL_ENTRIES],
    /// The sets filled since the table was last emptied, for [`Self::forget_all_ibl`]: the
    /// first `ibl_filled_len` entries (more than [`IBL_FILL_LOG`]: too many to log, every set
    /// is swept). Written by the dispatcher only, each index before its set.
    pub ibl_filled: [u16; IBL_FILL_LOG],
    pub ibl_filled_len: u32,
    /// Its victim table: the entries a fill pushed out of `ibl`, probed by the gateway's exit
    /// routine before it leaves the cache on a lookup miss (see `gateway::emit_gateway`), so
    /// that targets whose low 16 bits collide (a large program's returns) do not leave the
    /// cache in turn. Pages untouched until an entry is pushed there.
    pub ibl2: [IblEntry; IBL_ENTRIES],
    /// The `switch` index a jump-table site's fill stub found no translation for, for the
    /// dispatcher (`jump_table`).
    pub jump_table_index: u64,
    /// Jump-table sites open in this thread's cache: the tables
    /// [`Self::unlink_jump_tables`] walks (written by the dispatcher).
    pub jump_tables_open: u64,
    /// The jump-table sites' tables, [`JUMP_TABLE_STRIDE`] words each: the guest base
    /// register's value the site's entries were made for ([`JUMP_TABLE_NO_BASE`] before its
    /// first fill), the site's fill stub, then the host address each `switch` index goes to
    /// (the fill stub, the case's block, or a stub that gives the borrowed register back on
    /// the way there). Written by the dispatcher, and by the signal handler, which points
    /// every entry back at its fill stub to bring the thread out of the cache; pages untouched
    /// until a site is used.
    pub jump_tables: [u64; JUMP_TABLE_SITES * JUMP_TABLE_STRIDE],
}

/// Offset of ring entries (`u32` block ids) from the area's base, in bytes.
pub const ENTRIES_OFFSET: usize = size_of::<ThreadArea>();

/// GS offsets of the fields emitted code touches (bytes from the area's base).
pub mod off {
    use super::*;
    /// `gpr[i]` is at `GPR + 8 * i`.
    pub const GPR: i32 = offset_of!(ThreadArea, gpr) as i32;
    pub const RFLAGS: i32 = offset_of!(ThreadArea, rflags) as i32;
    pub const FS_BASE: i32 = offset_of!(ThreadArea, fs_base) as i32;
    pub const HOST_FS_BASE: i32 = offset_of!(ThreadArea, host_fs_base) as i32;
    pub const HOST_RSP: i32 = offset_of!(ThreadArea, host_rsp) as i32;
    pub const HOST_MXCSR: i32 = offset_of!(ThreadArea, host_mxcsr) as i32;
    pub const HOST_FCW: i32 = offset_of!(ThreadArea, host_fcw) as i32;
    pub const SCRATCH_RCX: i32 = offset_of!(ThreadArea, scratch_rcx) as i32;
    pub const SCRATCH_RAX: i32 = offset_of!(ThreadArea, scratch_rax) as i32;
    pub const SCRATCH_RDX: i32 = offset_of!(ThreadArea, scratch_rdx) as i32;
    pub const SCRATCH_R11: i32 = offset_of!(ThreadArea, scratch_r11) as i32;
    pub const SCRATCH_FAR: i32 = offset_of!(ThreadArea, scratch_far) as i32;
    pub const EXIT_CODE: i32 = offset_of!(ThreadArea, exit_code) as i32;
    pub const RESUME: i32 = offset_of!(ThreadArea, resume) as i32;
    pub const IBL_TARGET: i32 = offset_of!(ThreadArea, ibl_target) as i32;
    pub const IBL_SITE: i32 = offset_of!(ThreadArea, ibl_site) as i32;
    pub const JUMP_TO: i32 = offset_of!(ThreadArea, jump_to) as i32;
    pub const GATE_PENDING: i32 = offset_of!(ThreadArea, gate_pending) as i32;
    pub const RING_CURSOR: i32 = (offset_of!(ThreadArea, ring) + RingControl::CURSOR_OFFSET) as i32;
    pub const XSAVE: i32 = offset_of!(ThreadArea, xsave) as i32;
    pub const IBL: i32 = offset_of!(ThreadArea, ibl) as i32;
    /// Bytes from a lookup set's first entry to its second.
    pub const IBL_WAY: i32 = offset_of!(IblSet, second) as i32;
    // Emitted code scales a set's index by 4, then by 8 in the address: 32-byte sets.
    const _: () = assert!(size_of::<IblSet>() == 32 && IBL_WAY == 16);
    pub const IBL2: i32 = offset_of!(ThreadArea, ibl2) as i32;
    pub const IBL2_OPEN: i32 = offset_of!(ThreadArea, ibl2_open) as i32;
    pub const ENTRIES: i32 = ENTRIES_OFFSET as i32;
    pub const JUMP_TABLE_INDEX: i32 = offset_of!(ThreadArea, jump_table_index) as i32;

    /// GS offset of jump-table site `site`'s base word; its entries follow.
    pub fn jump_table(site: u32) -> i32 {
        (offset_of!(ThreadArea, jump_tables) + 8 * JUMP_TABLE_STRIDE * site as usize) as i32
    }

    /// GS offset of the end of a ring of `ring_entries` entries (the stub stores at
    /// `ENTRIES_END + 4 * cursor`, with a cursor in `[-ring_entries, 0)`).
    pub fn entries_end(ring_entries: u64) -> i32 {
        i32::try_from(ENTRIES_OFFSET as u64 + 4 * ring_entries)
            .expect("the ring's entries are within 2 GiB of the thread area (MAX_RING_ENTRIES)")
    }
}

impl ThreadArea {
    /// Maps a zeroed area with room for `ring_entries` events and initialises it: empty ring,
    /// empty lookup table (zero, but for the last slot, which points at `ibl_miss`: see
    /// [`IblEntry`]), initial FPU state.
    ///
    /// # Errors
    /// The OS error if the mapping fails.
    pub fn map(ring_entries: u64, ibl_miss: u64) -> std::io::Result<&'static mut ThreadArea> {
        let len = ThreadArea::map_len(ring_entries);
        // SAFETY: a fresh anonymous mapping; zero bytes are a valid (if empty) ThreadArea except
        // for the ring control and table, which are written below before any use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `p` is page-aligned (align 4096 holds), `len` covers the struct, and the
        // mapping is never unmapped: the area lives as long as the process.
        let area = unsafe { &mut *(p as *mut ThreadArea) };
        // SAFETY: writing a valid value into our own mapping.
        unsafe { std::ptr::write(&mut area.ring, RingControl::new(ring_entries)) };
        area.point_empty_set_at(ibl_miss);
        area.kill_empty_ibl2_slot();
        area.ibl2_open = 1;
        area.rflags = 0x202;
        // Legacy XSAVE region: FCW at 0, MXCSR at 24; XSTATE_BV (header at 512) = 0 means every
        // component is in its initial state, so XRSTOR loads the power-on FPU/SSE/AVX state
        // (except MXCSR, which it takes from here).
        area.xsave.0[0..2].copy_from_slice(&0x037fu16.to_le_bytes());
        area.xsave.0[24..28].copy_from_slice(&0x1f80u32.to_le_bytes());
        // PKRU's initial state is 0 (every key open); a process starts with the kernel's.
        if let Some(pkru) = crate::host::cpu::initial_pkru() {
            crate::host::cpu::set_guest_pkru(&mut area.xsave.0, pkru);
        }
        Ok(area)
    }

    /// Bytes [`ThreadArea::map`] maps for a ring of `ring_entries` events.
    pub fn map_len(ring_entries: u64) -> usize {
        ENTRIES_OFFSET + 4 * ring_entries as usize
    }

    /// Address of ring entry 0.
    pub fn entries(&self) -> *const u32 {
        // SAFETY: the entries follow the struct in the same mapping (see `map`).
        unsafe { (self as *const ThreadArea as *const u8).add(ENTRIES_OFFSET) as *const u32 }
    }

    /// Points every entry of the open jump-table sites back at its site's fill stub, so that
    /// a `switch` dispatch leaves for the dispatcher (as an emptied lookup table does).
    pub fn unlink_jump_tables(&mut self) {
        let open = (self.jump_tables_open as usize).min(JUMP_TABLE_SITES);
        for site in self
            .jump_tables
            .chunks_exact_mut(JUMP_TABLE_STRIDE)
            .take(open)
        {
            let fill = site[1];
            site[JUMP_TABLE_FIRST..].fill(fill);
        }
    }

    /// Empties the indirect branch lookup table and its victim table (after a code cache
    /// flush).
    pub fn clear_ibl(&mut self, ibl_miss: u64) {
        let empty = IblEntry { tag: 0, host: 0 };
        self.ibl.fill(IblSet {
            first: empty,
            second: empty,
        });
        self.ibl_filled_len = 0;
        self.point_empty_set_at(ibl_miss);
        self.ibl2.fill(empty);
        self.kill_empty_ibl2_slot();
    }

    /// A zero tag matches the target `u64::MAX` alone, whose set is the last one: both its
    /// entries lead to the miss path `ibl_miss`, so a zero-filled table is empty.
    fn point_empty_set_at(&mut self, ibl_miss: u64) {
        self.ibl[IBL_ENTRIES - 1].first.host = ibl_miss;
        self.ibl[IBL_ENTRIES - 1].second.host = ibl_miss;
    }

    /// A zero tag matches the target `u64::MAX` alone; in the lookup table that is the last
    /// slot, which leads to the miss path. In the victim table that target's slot gets a dead
    /// tag instead, so an empty victim table matches nothing.
    fn kill_empty_ibl2_slot(&mut self) {
        let i = ThreadArea::ibl2_index(u64::MAX);
        self.ibl2[i].tag = IblEntry::dead_tag(i);
    }

    /// Index of `guest` in the lookup table: its low 16 bits (what the emitted `movzx` takes).
    pub fn ibl_index(guest: u64) -> usize {
        (guest & 0xffff) as usize
    }

    /// Index of `guest` in the victim table: its bits 0-15 plus its bits 16-31, modulo 2^16
    /// (what the gateway computes, flag-free, with `movzx` and `lea`), so that targets whose
    /// low 16 bits collide in the lookup table mostly land in different slots here.
    pub fn ibl2_index(guest: u64) -> usize {
        ((guest & 0xffff) + ((guest >> 16) & 0xffff)) as usize & 0xffff
    }

    /// Puts guest `target`, translated at host address `host`, first in its lookup-table set
    /// (where an entry holding it already is only pointed at `host`); the target the first
    /// entry held goes to the second, and the second's to the victim table (where it
    /// displaces whatever its slot there held).
    pub fn fill_ibl(&mut self, target: u64, host: u64) {
        let i = ThreadArea::ibl_index(target);
        let set = &mut self.ibl[i];
        for way in [&mut set.first, &mut set.second] {
            if way.holds(target) {
                way.host = host;
                return;
            }
        }
        // Logged before the set is written: a handler that empties the table in between
        // kills a tag that is not there yet, and the dispatcher, which it interrupted, looks
        // for signals before it runs translated code again.
        let n = self.ibl_filled_len as usize;
        if n < IBL_FILL_LOG {
            self.ibl_filled[n] = i as u16;
        }
        if n <= IBL_FILL_LOG {
            self.ibl_filled_len += 1;
        }
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        let set = &mut self.ibl[i];
        let old = set.second;
        set.second = set.first;
        set.first = IblEntry::new(target, host);
        if let Some(t) = old.target_at(i) {
            self.ibl2[ThreadArea::ibl2_index(t)] = old;
        }
    }

    /// The entries that may hold `target`, with their indices: its set's two in the lookup
    /// table and its slot in the victim table.
    fn entries_for(&mut self, target: u64) -> [(&mut IblEntry, usize); 3] {
        let (i, j) = (
            ThreadArea::ibl_index(target),
            ThreadArea::ibl2_index(target),
        );
        let set = &mut self.ibl[i];
        [
            (&mut set.first, i),
            (&mut set.second, i),
            (&mut self.ibl2[j], j),
        ]
    }

    /// Points the entries that hold guest `target` (in either table) at host address `host`.
    pub fn retarget_ibl(&mut self, target: u64, host: u64) {
        for (e, _) in self.entries_for(target) {
            if e.holds(target) {
                e.host = host;
            }
        }
    }

    /// Makes the entries that hold guest `target` match nothing. Only the tags are written: a
    /// lookup interrupted between its tag check and its load of the host address still loads
    /// a valid block entry.
    pub fn forget_ibl(&mut self, target: u64) {
        for (e, index) in self.entries_for(target) {
            if e.holds(target) {
                e.tag = IblEntry::dead_tag(index);
            }
        }
    }

    /// Makes every first entry of the lookup table match nothing (tags only, as
    /// [`Self::forget_ibl`]) and closes the second entries and the victim table until the
    /// dispatcher reopens them ([`Self::ibl2_open`]): their entries stay valid, but no lookup
    /// finds them meanwhile.
    ///
    /// Only the sets filled since the table was last emptied are written, where they were
    /// few enough to be logged (a sweep of the whole table would allocate every page of it).
    pub fn forget_all_ibl(&mut self) {
        let n = self.ibl_filled_len as usize;
        if n <= IBL_FILL_LOG {
            for k in 0..n {
                let i = self.ibl_filled[k] as usize;
                self.ibl[i].first.tag = IblEntry::dead_tag(i);
            }
        } else {
            for (i, set) in self.ibl.iter_mut().enumerate() {
                set.first.tag = IblEntry::dead_tag(i);
            }
        }
        self.ibl_filled_len = 0;
        self.ibl2_open = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three targets that share their low 16 bits: the set keeps the two filled last, most
    /// recent first, and the third fill pushes the first into the victim table, where
    /// forgetting it kills it; an empty victim table matches nothing, not even the target
    /// whose slot a zero tag would match.
    #[test]
    fn a_fill_pushes_the_set_s_oldest_target_into_the_victim_table() {
        let area = ThreadArea::map(16, 0x1000).expect("a thread area");
        let empty = ThreadArea::ibl2_index(u64::MAX);
        assert!(!area.ibl2[empty].holds(u64::MAX));
        assert_eq!(area.ibl2_open, 1);
        let last = [
            area.ibl[IBL_ENTRIES - 1].first,
            area.ibl[IBL_ENTRIES - 1].second,
        ];
        assert!(last.iter().all(|w| w.holds(u64::MAX) && w.host == 0x1000));
        let (a, b, c) = (0x40_1234u64, 0x7f_1234u64, 0x9e_1234u64);
        let i = ThreadArea::ibl_index(a);
        assert!(i == ThreadArea::ibl_index(b) && i == ThreadArea::ibl_index(c));
        assert_ne!(ThreadArea::ibl2_index(a), ThreadArea::ibl2_index(b));
        let set = |area: &ThreadArea| {
            let s = area.ibl[i];
            [s.first, s.second].map(|w| (!w.tag, w.host))
        };
        area.fill_ibl(a, 0xa);
        area.fill_ibl(b, 0xb);
        assert_eq!(set(area), [(b, 0xb), (a, 0xa)]);
        // A fill of a target the set holds only points it elsewhere.
        area.fill_ibl(a, 0xa0);
        assert_eq!(set(area), [(b, 0xb), (a, 0xa0)]);
        area.fill_ibl(c, 0xc);
        assert_eq!(set(area), [(c, 0xc), (b, 0xb)]);
        let j = ThreadArea::ibl2_index(a);
        assert!(area.ibl2[j].holds(a) && area.ibl2[j].host == 0xa0);
        area.retarget_ibl(a, 0xaa);
        area.retarget_ibl(b, 0xbb);
        assert_eq!(area.ibl2[j].host, 0xaa);
        assert_eq!(set(area), [(c, 0xc), (b, 0xbb)]);
        area.forget_ibl(a);
        area.forget_ibl(b);
        assert!(!area.ibl2[j].holds(a));
        assert!(area.ibl[i].first.holds(c) && !area.ibl[i].second.holds(b));
        area.forget_all_ibl();
        assert!(!area.ibl[i].first.holds(c));
        assert_eq!(area.ibl2_open, 0);
        area.clear_ibl(0x1000);
        assert!(!area.ibl2[empty].holds(u64::MAX));
    }

    /// Emptying the table for a signal kills the first entry of every set filled since it was
    /// last emptied, from the fill log, and of every set once the log overflowed; sets never
    /// filled are not written (their pages stay unallocated).
    #[test]
    fn emptying_the_table_kills_the_logged_sets_or_sweeps_them_all() {
        let area = ThreadArea::map(16, 0x1000).expect("a thread area");
        let (a, b) = (0x40_0010u64, 0x40_2020u64);
        area.fill_ibl(a, 0xa);
        area.fill_ibl(b, 0xb);
        area.fill_ibl(a, 0xaa);
        assert_eq!(area.ibl_filled_len, 2);
        area.forget_all_ibl();
        let (i, j) = (ThreadArea::ibl_index(a), ThreadArea::ibl_index(b));
        assert!(!area.ibl[i].first.holds(a) && !area.ibl[j].first.holds(b));
        assert_eq!(
            area.ibl[i + 1].first.tag,
            0,
            "a set never filled is not written"
        );
        assert_eq!(area.ibl_filled_len, 0);
        area.ibl2_open = 1;
        // More fills than the log holds: the next emptying sweeps every set.
        area.fill_ibl(a, 0xa);
        for k in 0..IBL_FILL_LOG as u64 {
            area.fill_ibl(0x50_0000 + 2 * k, k);
        }
        assert_eq!(area.ibl_filled_len as usize, IBL_FILL_LOG + 1);
        area.forget_all_ibl();
        assert!(!area.ibl[i].first.holds(a));
        assert_eq!(area.ibl[i + 1].first.tag, IblEntry::dead_tag(i + 1));
    }
}
