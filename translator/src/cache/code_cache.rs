//! The code cache: regions, each one shared anonymous mapping seen twice, executable beside
//! the guest code it holds and writable elsewhere, so no page is ever writable and executable
//! through the same mapping (W^X). Shared anonymous memory (not a memfd) so that host
//! profilers treat the executable view as JIT code and name it from `/tmp/perf-PID.map`
//! (`--perf-map`): perf takes a mapping of `/dev/zero` for anonymous memory, and a `memfd:`
//! one for a file it cannot read.
//!
//! Who writes: only the guest thread's dispatcher, while no code of the cache runs on that
//! thread (it is in Rust). Translated code only executes the RX view.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use rustc_hash::FxHashMap;
use std::ffi::c_void;

use hotpath_ir::HostAddr;

pub use crate::cache::links::{Exit, ExitKind, HostLayout};
use crate::TranslateError;

/// Host code start → layout of every block and superblock in one code cache: how host
/// addresses are mapped back to guest ones, by the dispatcher (where to resume) and by the
/// host signal handler (what guest state a fault in translated code stands for).
///
/// Who touches it: the owning guest thread alone. Its dispatcher writes and reads it through
/// its [`CodeCache`]; its signal handler only reads it ([`BlockMap::read_in_handler`]), and
/// only when the interrupted PC is inside translated code, where the dispatcher cannot be in
/// the middle of a write.
pub struct BlockMap {
    map: UnsafeCell<LayoutMap>,
}

// SAFETY: see the type's doc: one writer (the owning dispatcher), and a reader on the same
// thread that never interrupts a write.
unsafe impl Sync for BlockMap {}

impl BlockMap {
    /// The map, for the host signal handler.
    ///
    /// # Safety
    /// Only from the owning thread's signal handler, for a PC inside translated code.
    pub unsafe fn read_in_handler(&self) -> &LayoutMap {
        // SAFETY: see the function's contract: the dispatcher is not writing.
        unsafe { &*self.map.get() }
    }
}

/// The [`HostLayout`]s of one code cache, found by host address: chunks of at most
/// [`LAYOUT_CHUNK`] layouts, sorted by `code_start` within and across chunks. Code is appended
/// at each region's cursor, so an insert is a push at the end of the chunk before the next
/// region's (a new chunk when that one is full), and a lookup two binary searches. (A
/// `BTreeMap` of 136-byte layouts cost a warm `python3 -c pass` 13 ms of its 38,000
/// placements; one vector per region as much again, in the page faults of the copies its growth
/// made.)
#[derive(Default)]
pub struct LayoutMap {
    /// Non-empty chunks, in address order.
    chunks: Vec<Vec<HostLayout>>,
}

/// Most layouts in one chunk of a [`LayoutMap`] (about 70 KiB).
const LAYOUT_CHUNK: usize = 512;

impl LayoutMap {
    /// Adds `layout` (replacing one with the same `code_start`).
    pub fn insert(&mut self, layout: HostLayout) {
        let key = layout.code_start;
        // The chunk the layout goes in: the last one starting at or below it.
        let Some(c) = self
            .chunks
            .partition_point(|c| c[0].code_start <= key)
            .checked_sub(1)
        else {
            // Below every chunk (the first code of a region below the others): its own chunk,
            // so that the region's next layouts are pushes, not inserts into another's.
            self.chunks.insert(0, new_chunk(layout));
            return;
        };
        let chunk = &mut self.chunks[c];
        if chunk.last().is_some_and(|l| l.code_start < key) {
            if chunk.len() < LAYOUT_CHUNK {
                chunk.push(layout);
            } else {
                self.chunks.insert(c + 1, new_chunk(layout));
            }
            return;
        }
        match chunk.binary_search_by_key(&key, |l| l.code_start) {
            Ok(i) => chunk[i] = layout,
            Err(i) => {
                chunk.insert(i, layout);
                if chunk.len() > LAYOUT_CHUNK {
                    let upper = chunk.split_off(LAYOUT_CHUNK / 2);
                    self.chunks.insert(c + 1, upper);
                }
            }
        }
    }

    /// The layout with the greatest `code_start` at or below host address `addr`, if any (the
    /// block `addr` is in, when it is inside one: check `code_end`).
    pub fn floor(&self, addr: u64) -> Option<&HostLayout> {
        let c = self.chunks.partition_point(|c| c[0].code_start <= addr);
        let chunk = self.chunks.get(c.checked_sub(1)?)?;
        chunk.get(
            chunk
                .partition_point(|l| l.code_start <= addr)
                .checked_sub(1)?,
        )
    }

    /// Forgets every layout.
    pub fn clear(&mut self) {
        self.chunks.clear();
    }
}

/// A chunk of a [`LayoutMap`] holding `layout`, with room for the rest.
fn new_chunk(layout: HostLayout) -> Vec<HostLayout> {
    let mut chunk = Vec::with_capacity(LAYOUT_CHUNK);
    chunk.push(layout);
    chunk
}

/// What a dispatcher knows about the translations in its code cache: where each guest block's
/// code is, its guest span, every exit stub's exit, the superblocks and single-step blocks,
/// and how many of the process's published invalidations it reflects. It goes with the cache
/// from a thread that ended to the next one: nothing in translated code belongs to one thread
/// (it reaches its thread's state through GS), so the next thread runs the code as it is,
/// with the same block ids, after applying the invalidations published since.
pub(crate) struct CacheIndex {
    /// Guest block start → host entry.
    pub(crate) blocks: FxHashMap<u64, HostAddr>,
    /// `(guest start, guest end)` of each block (and of each constant a translation
    /// depends on), for invalidation.
    pub(crate) spans: crate::cache::sorted_runs::SortedRuns<(u64, u64)>,
    /// Every exit stub's exit, by exit index.
    pub(crate) exits: Vec<Exit>,
    /// How many times the cache was flushed.
    pub(crate) generation: u64,
    /// The first block id of the current generation: older ids were flushed.
    pub(crate) generation_first_id: u32,
    /// Guest addresses whose entry is a superblock (this generation), with its trace (basic
    /// block ids).
    pub(crate) superblock_heads: FxHashMap<u64, std::sync::Arc<[hotpath_ir::BlockId]>>,
    /// Guest starts of the basic blocks the superblocks of this generation hold (a copy of
    /// each block's code is in the trace).
    pub(crate) superblock_members: rustc_hash::FxHashSet<u64>,
    /// Guest starts of the blocks discarded one by one since the last flush (their `spans`
    /// entries stay: a span that starts at one of them and at no current block names nothing).
    pub(crate) discarded: rustc_hash::FxHashSet<u64>,
    /// Single-instruction blocks for single-stepping (EFLAGS.TF): guest address → host entry
    /// (this generation).
    pub(crate) step_blocks: FxHashMap<u64, HostAddr>,
    /// How many of the process's published invalidations these translations reflect.
    pub(crate) invalidations_seen: u64,
    /// The direct exits the dispatcher linked, by target: where another thread that wants
    /// the guest out of the cache at a target (`SignalState::kick_at`) finds the links into
    /// it without reading every exit.
    pub(crate) linked: crate::cache::links::LinkedExits,
}

/// Exits a [`CacheIndex`] has room for before its table first grows (262,144: a warm `python3
/// -c pass` makes 80,000).
const EXITS_RESERVED: usize = 1 << 18;

/// An empty exit table with room for [`EXITS_RESERVED`] exits where the address space has it
/// (room never written costs no memory, only address space), else none yet: the table then
/// grows by doubling, and a thread started under a tight `RLIMIT_AS` does not abort on the
/// reservation (it did: "memory allocation of 12582912 bytes failed").
///
/// Room from the start because growing by doubling copied the exits into fresh pages each
/// time (a warm `python3 -c pass` took 1,800 page faults there).
fn reserved_exits() -> Vec<Exit> {
    let mut exits = Vec::new();
    let _ = exits.try_reserve_exact(EXITS_RESERVED);
    exits
}

impl CacheIndex {
    /// The index of an empty cache, made when `invalidations_seen` had been published.
    pub(crate) fn new(invalidations_seen: u64) -> CacheIndex {
        CacheIndex {
            blocks: FxHashMap::default(),
            spans: Default::default(),
            exits: reserved_exits(),
            generation: 0,
            generation_first_id: 0,
            superblock_heads: FxHashMap::default(),
            superblock_members: Default::default(),
            discarded: Default::default(),
            step_blocks: FxHashMap::default(),
            invalidations_seen,
            linked: Default::default(),
        }
    }
}

/// Size in bytes of a code cache's first region, and of the first region made for each far
/// stretch of guest code (4 MiB: `busybox true` translates 0.4 MiB, a warm `python3 -c pass`
/// 12 MiB). Each view of a region is mapped, and counts against the guest's `RLIMIT_AS`, so a
/// cache starts small and grows by regions ([`CodeCache::region_for`]).
pub const FIRST_REGION_SIZE: u64 = 4 << 20;

/// Largest size in bytes of one region (64 MiB): a region made for guest code whose regions
/// are full is twice the size of the largest of them, up to this.
pub const MAX_REGION_SIZE: u64 = 64 << 20;

/// Most bytes of code one cache holds in all its regions (256 MiB; each byte is mapped twice,
/// once per view). Past it, a translation that finds no room flushes the cache, which keeps
/// its regions.
pub const MAX_CACHE_BYTES: u64 = 256 << 20;

/// Most regions one code cache has: its home region, those beside far guest code, and those
/// made when a region filled.
pub const MAX_REGIONS: usize = 64;

/// Free bytes below which a region takes no new translation while another can be had: more
/// than the largest block or superblock emits (a trace has at most 256 instructions), so that
/// a translation started in the region [`CodeCache::region_for`] picks fits without
/// assembling it twice.
const REGION_SLACK: u64 = 64 << 10;

/// Eighths of each region that its cold area takes (its last three): measured on a compiler's
/// 230,000 blocks with the monitor on, a block's exit stubs and ring slow path were about 65 of
/// its 140 bytes, and a superblock's code is mostly hot (its side exits stay with it).
const COLD_EIGHTHS: u64 = 3;

/// Guest bytes on each side of a block's address that its region must reach with a 32-bit
/// displacement (256 MiB): a module's code and the data its RIP-relative operands address.
const GUEST_WINDOW: u64 = 256 << 20;

/// Largest distance a `rel32` or a RIP-relative displacement spans, less a margin for the
/// instruction's own length.
const REL32_REACH: u64 = (1 << 31) - 64;

/// The executable range and writable-view offset of each region of one code cache, for the
/// thread's signal handler and for threads that unlink its links (`kick`): is a PC translated
/// code, where is the writable byte of a link site.
///
/// Who writes: the owning dispatcher, appending a region (its fields first, then the count
/// with a release store). Entries never change after they are published; a cache that moves
/// gets a new table.
pub struct RegionTable {
    len: AtomicUsize,
    entries: [RegionEntry; MAX_REGIONS],
}

#[derive(Default)]
struct RegionEntry {
    start: AtomicU64,
    end: AtomicU64,
    rw_delta: AtomicU64,
}

impl RegionTable {
    /// The region holding host address `addr`: its executable range `[start, end)` and the
    /// bytes to add to an executable-view address to reach the writable view.
    pub fn find(&self, addr: u64) -> Option<(u64, u64, u64)> {
        let len = self.len.load(Ordering::Acquire);
        self.entries[..len].iter().find_map(|e| {
            let (start, end) = (
                e.start.load(Ordering::Relaxed),
                e.end.load(Ordering::Relaxed),
            );
            (addr >= start && addr < end).then(|| (start, end, e.rw_delta.load(Ordering::Relaxed)))
        })
    }

    /// True if `addr` is translated code's (inside a region's executable view).
    pub fn contains(&self, addr: u64) -> bool {
        self.find(addr).is_some()
    }

    fn push(&self, start: u64, end: u64, rw_delta: u64) {
        let len = self.len.load(Ordering::Relaxed);
        let e = &self.entries[len];
        e.start.store(start, Ordering::Relaxed);
        e.end.store(end, Ordering::Relaxed);
        e.rw_delta.store(rw_delta, Ordering::Relaxed);
        self.len.store(len + 1, Ordering::Release);
    }
}

/// One region of a code cache: a shared anonymous mapping seen twice, and its two cursors.
///
/// A region has two areas: the *hot* one from its start (translations: the code that runs),
/// and the *cold* one in its last [`COLD_EIGHTHS`] eighths (the parts of translations that run
/// only on the way to the dispatcher: exit stubs, the ring's slow path). Keeping those out
/// of line packs the code that runs into fewer cache lines and pages; DynamoRIO separates its
/// exit stubs from its fragments the same way.
struct Region {
    /// Base of the executable view (the addresses code is assembled for).
    rx_base: u64,
    /// Base of the writable view of the same pages.
    rw_base: *mut u8,
    /// Size of each view in bytes.
    size: u64,
    /// Offset of the next free byte of the hot area, which ends at `cold_base`.
    cursor: u64,
    /// Offset where the cold area starts (it ends at `size`).
    cold_base: u64,
    /// Offset of the next free byte of the cold area.
    cold_cursor: u64,
    /// Offset below which code survives a flush (the gateway, or the region's veneers to it).
    floor: u64,
    /// The gateway's routines as code in this region reaches them (set when the gateway is
    /// known).
    routines: GatewayJumps,
}

/// The gateway routines translated code jumps to with a `rel32` (host addresses): its exit
/// and its indirect branch lookup's miss routine. In the home region they are the routines
/// themselves; elsewhere, veneers to them at the region's start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatewayJumps {
    /// The exit routine.
    pub exit: HostAddr,
    /// The lookup's miss routine.
    pub ibl_miss: HostAddr,
}

impl Region {
    /// Copies `code` into the region at offset `at` through its writable view.
    ///
    /// # Panics
    /// If `code` does not fit below the region's end (the callers check their area's room).
    fn write(&mut self, at: u64, code: &[u8]) {
        assert!(
            at + code.len() as u64 <= self.size,
            "write past a code region's end"
        );
        // SAFETY: the RW view covers [at, at + len), checked above; only the owning
        // dispatcher writes, while no code of the cache runs on its thread.
        unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), self.rw_base.add(at as usize), code.len())
        };
    }

    /// Free bytes of the hot area.
    fn room(&self) -> u64 {
        self.cold_base - self.cursor
    }

    /// Free bytes of the cold area.
    fn cold_room(&self) -> u64 {
        self.size - self.cold_cursor
    }

    fn contains(&self, addr: u64) -> bool {
        addr >= self.rx_base && addr < self.rx_base + self.size
    }

    /// True if every byte of the region is within a `rel32`'s reach of every byte of
    /// `[lo, hi)`.
    fn reaches(&self, lo: u64, hi: u64) -> bool {
        let end = self.rx_base + self.size;
        hi.max(end) - lo.min(self.rx_base) < REL32_REACH
    }
}

/// A thread's code cache: its *home* region, where the gateway is (within reach of the
/// program's image for the first thread), and regions made beside guest code that lies out of
/// the home region's reach (libraries, the interpreter, the vDSO: terabytes away), so that
/// their RIP-relative operands stay RIP-relative and their blocks' `rel32`s reach the gateway
/// (through two veneers at each region's start). A direct branch between regions is linked
/// through a veneer in the branch's region (`jmp [rip+literal]`).
///
/// Code is inserted into the *current* region ([`select`](Self::select)), which the
/// dispatcher picks for each translation ([`region_for`](Self::region_for)).
pub struct CodeCache {
    regions: Vec<Region>,
    /// Index of the region inserts go to.
    current: usize,
    /// The veneers made for links between regions: `(region, target)` → veneer.
    veneers: FxHashMap<(usize, u64), HostAddr>,
    /// Guest ranges `[lo, hi)` where no region could be made: code there goes to the home
    /// region without trying again (each try is a few dozen `mmap`s).
    unplaceable: Vec<(u64, u64)>,
    /// The layouts of the blocks in the cache (shared with the thread's signal handler, hence
    /// leaked: a cache lives as long as the process).
    blocks: &'static BlockMap,
    /// The regions as the signal handler sees them (leaked for the same reason).
    table: &'static RegionTable,
}

impl CodeCache {
    /// Maps a cache whose home region of `size` bytes has its executable view replace the
    /// reserved (PROT_NONE) range at `rx_addr`.
    ///
    /// # Errors
    /// [`TranslateError::CodeCache`] if a mapping cannot be made.
    pub fn create(rx_addr: u64, size: u64) -> Result<CodeCache, TranslateError> {
        let table: &'static RegionTable = Box::leak(Box::new(RegionTable {
            len: AtomicUsize::new(0),
            entries: std::array::from_fn(|_| RegionEntry::default()),
        }));
        let mut cache = CodeCache {
            regions: Vec::new(),
            current: 0,
            veneers: FxHashMap::default(),
            unplaceable: Vec::new(),
            blocks: Box::leak(Box::new(BlockMap {
                map: UnsafeCell::new(LayoutMap::default()),
            })),
            table,
        };
        cache.map_region(rx_addr, size)?;
        Ok(cache)
    }

    /// Maps a cache whose home region of `size` bytes is wherever the kernel finds room (a
    /// thread's cache; its code reaches far guest operands as `emit` rewrites them, or
    /// through regions made beside them).
    ///
    /// # Errors
    /// [`TranslateError::CodeCache`] if the reservation or the cache cannot be mapped.
    pub fn create_anywhere(size: u64) -> Result<CodeCache, TranslateError> {
        // SAFETY: a fresh PROT_NONE reservation, replaced by `create`'s executable view.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(TranslateError::CodeCache {
                reason: format!("reserve: {}", std::io::Error::last_os_error()),
            });
        }
        CodeCache::create(at as u64, size)
    }

    /// Maps a region's two views, the executable one over the reservation at `rx_addr`, and
    /// publishes it to the handler. Returns its index.
    fn map_region(&mut self, rx_addr: u64, size: u64) -> Result<usize, TranslateError> {
        // A region beside far code has its writable view right above its executable one (out
        // of the guest's mmap area, as the region is); the home region's goes where the
        // kernel likes.
        let hint = match self.regions.is_empty() {
            true => 0,
            false => rx_addr + size,
        };
        let rw = shared_anonymous(size, hint)?;
        if let Err(e) = alias(rw, size, rx_addr, libc::PROT_READ | libc::PROT_EXEC) {
            // SAFETY: the mapping just made, which nothing uses.
            unsafe { libc::munmap(rw as *mut c_void, size as usize) };
            return Err(e);
        }
        let cold_base = (size - size / 8 * COLD_EIGHTHS) & !15;
        self.regions.push(Region {
            rx_base: rx_addr,
            rw_base: rw as *mut u8,
            size,
            cursor: 0,
            cold_base,
            cold_cursor: cold_base,
            floor: 0,
            routines: GatewayJumps::default(),
        });
        self.table
            .push(rx_addr, rx_addr + size, rw.wrapping_sub(rx_addr));
        Ok(self.regions.len() - 1)
    }

    /// Records where the gateway's routines are (emitted at the start of the home region):
    /// code in the home region reaches them directly.
    pub fn set_gateway(&mut self, routines: GatewayJumps) {
        self.regions[0].routines = routines;
    }

    /// The gateway's routines as code in the current region reaches them.
    pub fn gateway_jumps(&self) -> GatewayJumps {
        self.regions[self.current].routines
    }

    /// A region whose code reaches guest code at `pc` and the data around it
    /// (`GUEST_WINDOW`) with 32-bit displacements and has room for a translation
    /// ([`REGION_SLACK`]): the current one if it does, else another made before, else a new
    /// one reserved beside `pc` with veneers to the gateway's routines: above it first when
    /// `above_first()` says nothing of the guest grows there (code in the mmap area, above the
    /// brk heap), else as the first cache is placed. A new region is [`FIRST_REGION_SIZE`]
    /// bytes, or twice the largest region already reaching `pc` (up to [`MAX_REGION_SIZE`])
    /// when those are full: the cache grows with the code it holds. When no region can be made
    /// ([`MAX_REGIONS`] or [`MAX_CACHE_BYTES`] reached, or no room in the address space
    /// there): the reaching region with the most room (a translation that does not fit then
    /// flushes the cache), else the home region, where far operands are rewritten.
    pub fn region_for(&mut self, pc: u64, above_first: impl FnOnce() -> bool) -> usize {
        let (lo, hi) = (
            pc.saturating_sub(GUEST_WINDOW),
            pc.saturating_add(GUEST_WINDOW),
        );
        let usable = |r: &Region| {
            r.reaches(lo, hi) && r.room() >= REGION_SLACK && r.cold_room() >= REGION_SLACK
        };
        if usable(&self.regions[self.current]) {
            return self.current;
        }
        if let Some(i) = self.regions.iter().position(usable) {
            return i;
        }
        // The regions that reach `pc` are full (or there are none): the fullest-grown one
        // sets the next one's size.
        let reaching = self
            .regions
            .iter()
            .enumerate()
            .filter(|(_, r)| r.reaches(lo, hi))
            .max_by_key(|(_, r)| r.room().min(r.cold_room()))
            .map(|(i, _)| i);
        let largest = self
            .regions
            .iter()
            .filter(|r| r.reaches(lo, hi))
            .map(|r| r.size)
            .max();
        let fallback = reaching.unwrap_or(0);
        let size = largest.map_or(FIRST_REGION_SIZE, |s| (2 * s).min(MAX_REGION_SIZE));
        let mapped: u64 = self.regions.iter().map(|r| r.size).sum();
        if self.regions.len() >= MAX_REGIONS
            || mapped + size > MAX_CACHE_BYTES
            || self.unplaceable.iter().any(|&(l, h)| pc >= l && pc < h)
        {
            return fallback;
        }
        let above = above_first()
            .then(|| hotpath_loader::reserve_above(lo, hi, size))
            .flatten();
        let at = above.or_else(|| hotpath_loader::reserve_within_reach(lo, hi, size));
        let mapped = at.and_then(|at| match self.map_region(at, size) {
            Ok(i) => Some(i),
            Err(_) => {
                // SAFETY: the reservation just made, which nothing uses.
                unsafe { libc::munmap(at as *mut c_void, size as usize) };
                None
            }
        });
        let Some(i) = mapped else {
            if reaching.is_none() {
                self.unplaceable.push((lo, hi));
            }
            return fallback;
        };
        let home = self.regions[0].routines;
        let routines = GatewayJumps {
            exit: self.emit_veneer(i, home.exit),
            ibl_miss: self.emit_veneer(i, home.ibl_miss),
        };
        let r = &mut self.regions[i];
        r.routines = routines;
        r.floor = r.cursor;
        i
    }

    /// Makes region `r` the one inserts go to.
    pub fn select(&mut self, r: usize) {
        self.current = r;
    }

    /// Makes the home region the one inserts go to.
    pub fn select_home(&mut self) {
        self.current = 0;
    }

    /// Writes `jmp qword [rip+2]; int3; int3; dq target` (16 bytes) at region `r`'s cursor
    /// (16-byte aligned), so that the literal is 8-byte aligned: the jump runs with the guest's
    /// EFLAGS.AC, and a guest that sets it (the JVM's CPU probe) would otherwise take a SIGBUS
    /// in the veneer to the gateway's exit.
    fn emit_veneer(&mut self, r: usize, target: HostAddr) -> HostAddr {
        let mut code = [0xccu8; VENEER_SIZE];
        code[..6].copy_from_slice(&[0xff, 0x25, 2, 0, 0, 0]);
        code[8..16].copy_from_slice(&target.0.to_le_bytes());
        let saved = std::mem::replace(&mut self.current, r);
        let at = self.insert(&code);
        self.current = saved;
        at
    }

    /// Host address where the next inserted code will start (in the current region).
    pub fn next_addr(&self) -> HostAddr {
        let r = &self.regions[self.current];
        HostAddr(r.rx_base + r.cursor)
    }

    /// Free bytes left in the current region's hot area.
    pub fn room(&self) -> u64 {
        self.regions[self.current].room()
    }

    /// Host address where the next cold code will start (in the current region's cold area).
    pub fn next_cold_addr(&self) -> HostAddr {
        let r = &self.regions[self.current];
        HostAddr(r.rx_base + r.cold_cursor)
    }

    /// Free bytes left in the current region's cold area.
    pub fn cold_room(&self) -> u64 {
        self.regions[self.current].cold_room()
    }

    /// Appends `code` to the current region's cold area; it must have been assembled for
    /// [`next_cold_addr`](Self::next_cold_addr). Returns its host address.
    ///
    /// # Panics
    /// If `code` does not fit ([`cold_room`](Self::cold_room) is the caller's to check).
    pub fn insert_cold(&mut self, code: &[u8]) -> HostAddr {
        assert!(
            code.len() as u64 <= self.cold_room(),
            "code cache cold area overflow (caller did not check room)"
        );
        let at = self.next_cold_addr();
        let r = &mut self.regions[self.current];
        r.write(r.cold_cursor, code);
        // Cold code needs no alignment of its own (it holds no patchable rel32 nor literal).
        r.cold_cursor += code.len() as u64;
        at
    }

    /// Appends `code` to the current region; it must have been assembled for
    /// [`next_addr`](Self::next_addr). Returns its host address.
    ///
    /// # Panics
    /// If `code` does not fit ([`room`](Self::room) is the caller's to check: a bug otherwise).
    pub fn insert(&mut self, code: &[u8]) -> HostAddr {
        assert!(
            code.len() as u64 <= self.room(),
            "code cache overflow (caller did not check room)"
        );
        let at = self.next_addr();
        let r = &mut self.regions[self.current];
        r.write(r.cursor, code);
        r.cursor += code.len() as u64;
        // Keep blocks 16-byte aligned (branch targets fetch better).
        r.cursor = (r.cursor + 15) & !15;
        at
    }

    /// Makes everything inserted so far into the current region survive
    /// [`flush`](Self::flush).
    pub fn seal_floor(&mut self) {
        let r = &mut self.regions[self.current];
        r.floor = r.cursor;
    }

    /// The region holding host address `addr`.
    fn region_of(&self, addr: HostAddr) -> Option<usize> {
        self.regions.iter().position(|r| r.contains(addr.0))
    }

    /// Points the 32-bit displacement at `site` (the last four bytes of a `jmp`/`jcc rel32`)
    /// to `target`: the chaining of a direct branch. A target in another region out of the
    /// `rel32`'s reach is reached through a veneer in the site's region; when that region has
    /// no room for one, the site is left as it is (it exits to the dispatcher until the next
    /// flush). Returns whether the site now leads to `target`.
    ///
    /// # Panics
    /// If `site` is outside the cache (a bug in hotpath).
    pub fn patch_rel32(&mut self, site: HostAddr, target: HostAddr) -> bool {
        let r = self
            .region_of(site)
            .filter(|&r| self.regions[r].contains(site.0 + 3))
            .unwrap_or_else(|| panic!("patch site {site} outside the code cache"));
        let reach = |to: HostAddr| i32::try_from(to.0 as i64 - (site.0 as i64 + 4)).ok();
        let rel = match reach(target) {
            Some(rel) => rel,
            None => {
                let veneer = match self.veneers.get(&(r, target.0)) {
                    Some(&v) => v,
                    None if self.regions[r].room() >= VENEER_SIZE as u64 => {
                        let v = self.emit_veneer(r, target);
                        self.veneers.insert((r, target.0), v);
                        v
                    }
                    None => return false,
                };
                reach(veneer).expect("a region spans less than 2 GiB")
            }
        };
        let region = &self.regions[r];
        let off = (site.0 - region.rx_base) as usize;
        // SAFETY: inside the region's RW view; the patched block is not running (we are in
        // Rust).
        unsafe {
            std::ptr::copy_nonoverlapping(rel.to_le_bytes().as_ptr(), region.rw_base.add(off), 4)
        };
        true
    }

    /// Writes `jmp rel32` to `target` over the 5 bytes at `at`: an old block entry that now
    /// leads to a superblock (links to the old entry keep working).
    ///
    /// # Panics
    /// If `at` is outside the cache (a bug in hotpath).
    pub fn patch_jump(&mut self, at: HostAddr, target: HostAddr) {
        let r = self
            .region_of(at)
            .filter(|&r| self.regions[r].contains(at.0 + 4))
            .unwrap_or_else(|| panic!("patch site {at} outside the code cache"));
        // The displacement first (the jump it completes is not there yet), then the opcode.
        if self.patch_rel32(HostAddr(at.0 + 1), target) {
            let region = &self.regions[r];
            let off = (at.0 - region.rx_base) as usize;
            // SAFETY: inside the RW view; no translated code runs while the dispatcher patches.
            unsafe { *region.rw_base.add(off) = 0xe9 };
        }
    }

    /// Copies the cache into new shared memory, for a child about to be forked: the cache's
    /// memory is shared across `fork`, so parent and child would otherwise write each other's
    /// code. Call before forking (nothing changes the cache then), then
    /// [`adopt`](Self::adopt) the copy in the child and drop it in the parent.
    ///
    /// # Errors
    /// [`TranslateError::CodeCache`] if the memory cannot be mapped.
    pub fn snapshot(&self) -> Result<CacheCopy, TranslateError> {
        let mut copy = CacheCopy {
            regions: Vec::with_capacity(self.regions.len()),
        };
        for r in &self.regions {
            let at = shared_anonymous(r.size, 0)?;
            copy.regions.push((at, r.size));
            // SAFETY: the used parts of the region's RW view (hot and cold) into the new
            // mapping, of the same size.
            unsafe {
                std::ptr::copy_nonoverlapping(r.rw_base, at as *mut u8, r.cursor as usize);
                std::ptr::copy_nonoverlapping(
                    r.rw_base.add(r.cold_base as usize),
                    (at + r.cold_base) as *mut u8,
                    (r.cold_cursor - r.cold_base) as usize,
                );
            }
        }
        Ok(copy)
    }

    /// Puts `copy` (from [`snapshot`](Self::snapshot)) under both views of every region: this
    /// process's cache is now its own. The views stay where they were.
    ///
    /// # Errors
    /// [`TranslateError::CodeCache`] if a mapping fails.
    pub fn adopt(&mut self, mut copy: CacheCopy) -> Result<(), TranslateError> {
        for (r, (at, size)) in self.regions.iter().zip(std::mem::take(&mut copy.regions)) {
            alias(at, size, r.rx_base, libc::PROT_READ | libc::PROT_EXEC)?;
            // The copy itself becomes the writable view (the old one, shared with the parent,
            // goes).
            // SAFETY: moving our own mapping over our own RW view; no translated code runs
            // while the dispatcher does this.
            let rw = unsafe {
                libc::mremap(
                    at as *mut c_void,
                    size as usize,
                    size as usize,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    r.rw_base as *mut c_void,
                )
            };
            if rw == libc::MAP_FAILED {
                return Err(TranslateError::CodeCache {
                    reason: format!(
                        "remapping the code cache: {}",
                        std::io::Error::last_os_error()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Forgets every block (not the gateway nor the regions' veneers to it) and its layout:
    /// the next insert reuses the space.
    pub fn flush(&mut self) {
        for r in &mut self.regions {
            r.cursor = r.floor;
            r.cold_cursor = r.cold_base;
        }
        self.veneers.clear();
        self.layouts_mut().clear();
    }

    /// Host addresses `[start, end)` of the gateway's routines (the code below the home
    /// region's floor).
    pub fn gateway_range(&self) -> (u64, u64) {
        let home = &self.regions[0];
        (home.rx_base, home.rx_base + home.floor)
    }

    /// The layouts of the blocks in the cache, by host code start.
    pub fn layouts(&self) -> &LayoutMap {
        // SAFETY: the handler only reads the map (`BlockMap`'s doc), and writes need `&mut self`.
        unsafe { &*self.blocks.map.get() }
    }

    /// The layouts, to clear them.
    fn layouts_mut(&mut self) -> &mut LayoutMap {
        // SAFETY: the dispatcher holds `&mut self`, so it runs no translated code of this
        // thread, where alone the handler reads the map (`BlockMap`'s doc).
        unsafe { &mut *self.blocks.map.get() }
    }

    /// Adds the layout of code just inserted (at `layout.code_start`).
    pub fn add_layout(&mut self, layout: HostLayout) {
        self.layouts_mut().insert(layout);
    }

    /// The layout map itself, for the thread's signal handler.
    pub fn block_map(&self) -> &'static BlockMap {
        self.blocks
    }

    /// The region table, for the thread's signal handler.
    pub fn region_table(&self) -> &'static RegionTable {
        self.table
    }

    /// True if `addr` is inside a region's executable view.
    pub fn contains(&self, addr: HostAddr) -> bool {
        self.region_of(addr).is_some()
    }

    /// True if `[start, end)` overlaps a view (executable or writable) of a region: memory
    /// of the cache's that the guest may ask for.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.regions.iter().any(|r| {
            let rw = r.rw_base as u64;
            (start < r.rx_base + r.size && end > r.rx_base) || (start < rw + r.size && end > rw)
        })
    }

    /// Unmaps both views of every region, giving their address ranges back (to the guest).
    /// The layout map and the region table stay allocated (the signal handler held
    /// `&'static`s to them).
    ///
    /// # Safety
    /// No code of this cache may run again on any thread, and nothing may jump to it: the
    /// caller's thread has left it and pointed its handler elsewhere.
    pub unsafe fn release(self) {
        for r in &self.regions {
            // SAFETY: see the function's contract; both mappings are this cache's own.
            unsafe {
                libc::munmap(r.rx_base as *mut c_void, r.size as usize);
                libc::munmap(r.rw_base as *mut c_void, r.size as usize);
            }
        }
    }
}

/// Bytes of a veneer: `jmp qword [rip+0]` (6), its 8-byte target, 2 bytes of padding.
const VENEER_SIZE: usize = 16;

/// A copy of a code cache for a forked child ([`CodeCache::snapshot`]): one mapping
/// `(address, size)` per region; unmapped when dropped (in the parent), taken over by
/// [`CodeCache::adopt`] (in the child).
pub struct CacheCopy {
    regions: Vec<(u64, u64)>,
}

impl Drop for CacheCopy {
    fn drop(&mut self) {
        for &(at, size) in &self.regions {
            // SAFETY: the copy's own mapping, which nothing else uses.
            unsafe { libc::munmap(at as *mut c_void, size as usize) };
        }
    }
}

/// A new shared anonymous mapping of `size` bytes, readable and writable, at `hint` if that
/// range is free (0: no hint), else wherever the kernel likes. Returns its address.
fn shared_anonymous(size: u64, hint: u64) -> Result<u64, TranslateError> {
    // No commit charge for the whole size up front: pages are used as code fills them.
    let flags = libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    let map = |at: u64, extra: i32| {
        // SAFETY: a fresh mapping; FIXED_NOREPLACE never replaces one.
        unsafe {
            libc::mmap(
                at as *mut c_void,
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags | extra,
                -1,
                0,
            )
        }
    };
    if hint != 0 {
        let p = map(hint, libc::MAP_FIXED_NOREPLACE);
        if p as u64 == hint {
            return Ok(hint);
        }
        if p != libc::MAP_FAILED {
            // An old kernel took FIXED_NOREPLACE as a hint.
            // SAFETY: the mapping just made, which nothing uses.
            unsafe { libc::munmap(p, size as usize) };
        }
    }
    let p = map(0, 0);
    if p == libc::MAP_FAILED {
        return Err(TranslateError::CodeCache {
            reason: format!("mmap: {}", std::io::Error::last_os_error()),
        });
    }
    Ok(p as u64)
}

/// Maps the pages of the shared mapping at `from` (`size` bytes) a second time at `at`,
/// replacing what is there, with protection `prot`: `mremap` with an old size of 0 makes a new
/// mapping of the same pages.
fn alias(from: u64, size: u64, at: u64, prot: i32) -> Result<(), TranslateError> {
    let err = |what: &str| TranslateError::CodeCache {
        reason: format!("{what}: {}", std::io::Error::last_os_error()),
    };
    // SAFETY: a second view of our own shared mapping, over a range the caller owns (its
    // reservation or its old view); it gets `prot` before any code runs.
    let p = unsafe {
        libc::mremap(
            from as *mut c_void,
            0,
            size as usize,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            at as *mut c_void,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(err("mremap (second view)"));
    }
    // SAFETY: the view just made.
    if unsafe { libc::mprotect(at as *mut c_void, size as usize, prot) } != 0 {
        return Err(err("mprotect"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The host address a `jmp qword [rip+0]` veneer at `at` goes to.
    fn veneer_target(at: HostAddr) -> u64 {
        // SAFETY: the executable view is readable; the veneer is 16 bytes.
        let bytes = unsafe { std::slice::from_raw_parts(at.0 as *const u8, 16) };
        assert_eq!(bytes[..6], [0xff, 0x25, 2, 0, 0, 0], "not a veneer at {at}");
        assert_eq!(at.0 % 8, 0, "a veneer's literal is 8-byte aligned");
        u64::from_le_bytes(bytes[8..16].try_into().unwrap())
    }

    /// Where the `rel32` at `site` leads.
    fn rel32_target(site: HostAddr) -> u64 {
        // SAFETY: the executable view is readable.
        let rel = unsafe { std::ptr::read_unaligned(site.0 as *const i32) };
        (site.0 as i64 + 4 + rel as i64) as u64
    }

    /// A layout of `len` bytes of code at host address `at`.
    fn layout_at(at: u64, len: u64) -> HostLayout {
        HostLayout {
            code_start: at,
            entry: at,
            guest_start: at ^ 0xabc,
            code_end: at + len,
            ..HostLayout::default()
        }
    }

    /// The layout map against a `BTreeMap` (the reference): inserts appended in two regions
    /// in turn, some out of order, one replacing a layout, lookups everywhere between.
    #[test]
    fn layouts_are_found_as_an_ordered_map_finds_them() {
        let mut map = LayoutMap::default();
        let mut reference: BTreeMap<u64, HostLayout> = BTreeMap::new();
        let regions = [0x7000_0000u64, 0x1000_0000];
        let mut cursors = regions;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for i in 0..20_000 {
            let r = next(2) as usize;
            let len = 1 + next(300);
            let at = if i % 13 == 0 {
                // Out of order: below the region's cursor (a replaced layout, or a new one).
                regions[r] + next(cursors[r] - regions[r] + 1)
            } else {
                let at = cursors[r];
                cursors[r] += len;
                at
            };
            map.insert(layout_at(at, len));
            reference.insert(at, layout_at(at, len));
        }
        let probes = (0..5000).map(|_| {
            let r = next(2) as usize;
            regions[r] - 16 + next(cursors[r] - regions[r] + 32)
        });
        for addr in probes.chain([0, 0x0fff_ffff, 0x1000_0000, 0x7000_0000, u64::MAX]) {
            let want = reference
                .range(..=addr)
                .next_back()
                .map(|(_, l)| l.code_start);
            assert_eq!(map.floor(addr).map(|l| l.code_start), want, "at {addr:#x}");
        }
        map.clear();
        assert!(map.floor(u64::MAX).is_none());
    }

    #[test]
    fn far_code_gets_a_region_in_reach_and_links_between_regions_go_through_veneers() {
        let mut cache = CodeCache::create_anywhere(FIRST_REGION_SIZE).unwrap();
        // A stand-in gateway: two routines at the home region's start.
        let exit = cache.insert(&[0xcc; 16]);
        let ibl_miss = cache.insert(&[0xcc; 16]);
        cache.seal_floor();
        cache.set_gateway(GatewayJumps { exit, ibl_miss });
        let home = cache.regions[0].rx_base;
        let pc = if home > 0x4000_0000_0000 {
            0x1000_0000_0000
        } else {
            0x6000_0000_0000
        };
        assert_eq!(
            cache.region_for(home + 4096, || true),
            0,
            "the home region reaches itself"
        );

        let r = cache.region_for(pc, || true);
        assert_ne!(r, 0, "a region is made beside far code");
        assert!(cache.regions[r].reaches(pc - GUEST_WINDOW, pc + GUEST_WINDOW));
        assert_eq!(
            cache.region_for(pc + (1 << 20), || false),
            r,
            "and reused for code near it"
        );
        assert!(cache.regions[r].rx_base > pc, "above the code, as asked");
        let rw = cache
            .region_table()
            .find(cache.regions[r].rx_base)
            .unwrap()
            .2;
        assert_eq!(
            cache.regions[r].rx_base.wrapping_add(rw),
            cache.regions[r].rx_base + FIRST_REGION_SIZE,
            "its writable view right above it"
        );
        cache.select(r);
        let jumps = cache.gateway_jumps();
        assert_eq!(veneer_target(jumps.exit), exit.0);
        assert_eq!(veneer_target(jumps.ibl_miss), ibl_miss.0);
        let (start, end, _) = cache.region_table().find(jumps.exit.0).unwrap();
        assert!(start <= jumps.exit.0 && jumps.exit.0 < end);
        assert!(cache.contains(jumps.exit) && !cache.contains(HostAddr(pc)));

        // A jump in the far region to a block at home, and one at home to the far region.
        let far_jump = cache.insert(&[0x90, 0x90, 0x90, 0xe9, 0, 0, 0, 0]);
        cache.select_home();
        let home_block = cache.insert(&[0x90, 0x90, 0x90, 0xe9, 0, 0, 0, 0]);
        let (far_site, home_site) = (HostAddr(far_jump.0 + 4), HostAddr(home_block.0 + 4));
        assert!(cache.patch_rel32(far_site, home_block));
        assert!(cache.patch_rel32(home_site, far_jump));
        assert_eq!(
            veneer_target(HostAddr(rel32_target(far_site))),
            home_block.0
        );
        assert_eq!(veneer_target(HostAddr(rel32_target(home_site))), far_jump.0);
        assert_eq!(cache.veneers.len(), 2);
        // A second link to the same target reuses its veneer; a near one needs none.
        assert!(cache.patch_rel32(far_site, home_block));
        assert_eq!(cache.veneers.len(), 2);
        let near = cache.insert(&[0x90; 16]);
        assert!(cache.patch_rel32(home_site, near));
        assert_eq!(rel32_target(home_site), near.0);

        // A flush keeps each region's veneers to the gateway, not those of links.
        let floors: Vec<u64> = cache.regions.iter().map(|r| r.rx_base + r.floor).collect();
        cache.flush();
        assert!(cache.veneers.is_empty());
        cache.select(r);
        assert_eq!(cache.next_addr().0, floors[r]);
        assert_eq!(veneer_target(cache.gateway_jumps().exit), exit.0);
        // SAFETY: nothing runs this cache's code.
        unsafe { cache.release() };
    }

    #[test]
    fn a_full_region_makes_a_larger_one_for_the_same_code_and_a_flush_empties_them() {
        let mut cache = CodeCache::create_anywhere(FIRST_REGION_SIZE).unwrap();
        let exit = cache.insert(&[0xcc; 16]);
        let ibl_miss = cache.insert(&[0xcc; 16]);
        cache.seal_floor();
        cache.set_gateway(GatewayJumps { exit, ibl_miss });
        let pc = cache.regions[0].rx_base + 4096;
        assert_eq!(cache.region_for(pc, || false), 0);
        let mut made = vec![0];
        // Each region filled to within its slack: the next one reaches the same code and is
        // twice as large, up to the largest size.
        for _ in 0..6 {
            let r = *made.last().unwrap();
            let region = &mut cache.regions[r];
            region.cursor = region.cold_base - REGION_SLACK + 1;
            let next = cache.region_for(pc, || false);
            assert!(!made.contains(&next), "a full region is not picked again");
            let (prev_size, size) = (cache.regions[r].size, cache.regions[next].size);
            assert_eq!(size, (2 * prev_size).min(MAX_REGION_SIZE));
            assert!(cache.regions[next].reaches(pc - GUEST_WINDOW, pc + GUEST_WINDOW));
            cache.select(next);
            assert_eq!(veneer_target(cache.gateway_jumps().exit), exit.0);
            made.push(next);
        }
        let mapped: u64 = cache.regions.iter().map(|r| r.size).sum();
        assert_eq!(mapped, (4 + 8 + 16 + 32 + 64 + 64 + 64) << 20);
        // Past the cache's most bytes no region is made: the one with the most room is
        // given, and a translation that does not fit there flushes.
        let r = *made.last().unwrap();
        let region = &mut cache.regions[r];
        region.cursor = region.cold_base - REGION_SLACK + 1;
        let before = cache.regions.len();
        let given = cache.region_for(pc, || false);
        assert_eq!(
            cache.regions.len(),
            before,
            "no region past MAX_CACHE_BYTES"
        );
        assert!(made.contains(&given));
        cache.flush();
        assert_eq!(
            cache.region_for(pc, || false),
            given,
            "the region given keeps serving"
        );
        cache.select(0);
        assert_eq!(
            cache.region_for(pc, || false),
            0,
            "after a flush the home region has room"
        );
        // SAFETY: nothing runs this cache's code.
        unsafe { cache.release() };
    }
}
