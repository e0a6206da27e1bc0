//! The code cache: one shared anonymous mapping seen twice, executable near the guest and
//! writable elsewhere, so no page is ever writable and executable through the same mapping
//! (W^X). Shared anonymous memory (not a memfd) so that host profilers treat the executable
//! view as JIT code and name it from `/tmp/perf-PID.map` (`--perf-map`): perf takes a
//! mapping of `/dev/zero` for anonymous memory, and a `memfd:` one for a file it cannot read.
//!
//! Who writes: only the guest thread's dispatcher, while no code of the cache runs on that
//! thread (it is in Rust). Translated code only executes the RX view.

use std::cell::UnsafeCell;
use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};
use std::ffi::c_void;

use hotpath_ir::HostAddr;

pub use crate::links::{Exit, ExitKind, HostLayout};
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
    map: UnsafeCell<BTreeMap<u64, HostLayout>>,
}

// SAFETY: see the type's doc: one writer (the owning dispatcher), and a reader on the same
// thread that never interrupts a write.
unsafe impl Sync for BlockMap {}

impl BlockMap {
    /// The map, for the host signal handler.
    ///
    /// # Safety
    /// Only from the owning thread's signal handler, for a PC inside translated code.
    pub unsafe fn read_in_handler(&self) -> &BTreeMap<u64, HostLayout> {
        // SAFETY: see the function's contract: the dispatcher is not writing.
        unsafe { &*self.map.get() }
    }
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
    /// Guest block start → guest end, for invalidation.
    pub(crate) spans: BTreeMap<u64, u64>,
    /// Every exit stub's exit, by exit index.
    pub(crate) exits: Vec<Exit>,
    /// How many times the cache was flushed.
    pub(crate) generation: u64,
    /// The first block id of the current generation: older ids were flushed.
    pub(crate) generation_first_id: u32,
    /// Guest addresses whose entry is a superblock (this generation).
    pub(crate) superblock_heads: FxHashSet<u64>,
    /// Single-instruction blocks for single-stepping (EFLAGS.TF): guest address → host entry
    /// (this generation).
    pub(crate) step_blocks: FxHashMap<u64, HostAddr>,
    /// How many of the process's published invalidations these translations reflect.
    pub(crate) invalidations_seen: u64,
}

impl CacheIndex {
    /// The index of an empty cache, made when `invalidations_seen` had been published.
    pub(crate) fn new(invalidations_seen: u64) -> CacheIndex {
        CacheIndex {
            blocks: FxHashMap::default(),
            spans: BTreeMap::new(),
            exits: Vec::new(),
            generation: 0,
            generation_first_id: 0,
            superblock_heads: FxHashSet::default(),
            step_blocks: FxHashMap::default(),
            invalidations_seen,
        }
    }
}

/// Size of the code cache in bytes (64 MiB). When it fills, the whole cache is flushed.
pub const CODE_CACHE_SIZE: u64 = 64 << 20;

/// The code cache's two views and its allocation cursor.
pub struct CodeCache {
    /// Base of the executable view (the addresses code is assembled for).
    rx_base: u64,
    /// Base of the writable view of the same pages.
    rw_base: *mut u8,
    /// Size of each view in bytes.
    size: u64,
    /// Offset of the next free byte.
    cursor: u64,
    /// Offset below which code survives a flush (the gateway routines).
    floor: u64,
    /// The layouts of the blocks in the cache (shared with the thread's signal handler, hence
    /// leaked: a cache lives as long as the process).
    blocks: &'static BlockMap,
}

impl CodeCache {
    /// Maps a cache of `size` bytes whose executable view replaces the reserved (PROT_NONE)
    /// range at `rx_addr`.
    ///
    /// # Errors
    /// [`TranslateError::CodeCache`] if a mapping cannot be made.
    pub fn create(rx_addr: u64, size: u64) -> Result<CodeCache, TranslateError> {
        let rw = shared_anonymous(size)?;
        if let Err(e) = alias(rw, size, rx_addr, libc::PROT_READ | libc::PROT_EXEC) {
            // SAFETY: the mapping just made, which nothing uses.
            unsafe { libc::munmap(rw as *mut c_void, size as usize) };
            return Err(e);
        }
        Ok(CodeCache {
            blocks: Box::leak(Box::new(BlockMap {
                map: UnsafeCell::new(BTreeMap::new()),
            })),
            rx_base: rx_addr,
            rw_base: rw as *mut u8,
            size,
            cursor: 0,
            floor: 0,
        })
    }

    /// Maps a cache of `size` bytes wherever the kernel finds room (a thread's cache; its
    /// code reaches far guest operands as `emit` rewrites them).
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

    /// Host address where the next inserted code will start.
    pub fn next_addr(&self) -> HostAddr {
        HostAddr(self.rx_base + self.cursor)
    }

    /// Free bytes left.
    pub fn room(&self) -> u64 {
        self.size - self.cursor
    }

    /// Appends `code`, which must have been assembled for [`next_addr`](Self::next_addr).
    /// Returns its host address.
    ///
    /// # Panics
    /// If `code` does not fit ([`room`](Self::room) is the caller's to check: a bug otherwise).
    pub fn insert(&mut self, code: &[u8]) -> HostAddr {
        assert!(
            code.len() as u64 <= self.room(),
            "code cache overflow (caller did not check room)"
        );
        let at = self.next_addr();
        // SAFETY: the RW view covers [cursor, cursor + len); no code runs while we write.
        unsafe {
            std::ptr::copy_nonoverlapping(
                code.as_ptr(),
                self.rw_base.add(self.cursor as usize),
                code.len(),
            )
        };
        self.cursor += code.len() as u64;
        // Keep blocks 16-byte aligned (branch targets fetch better).
        self.cursor = (self.cursor + 15) & !15;
        at
    }

    /// Makes everything inserted so far survive [`flush`](Self::flush).
    pub fn seal_floor(&mut self) {
        self.floor = self.cursor;
    }

    /// Points the 32-bit displacement at `site` (the last four bytes of a `jmp`/`jcc rel32`)
    /// to `target`: the chaining of a direct branch.
    ///
    /// # Panics
    /// If `site` is outside the cache (a bug in hotpath).
    pub fn patch_rel32(&mut self, site: HostAddr, target: HostAddr) {
        assert!(
            self.contains(site) && self.contains(HostAddr(site.0 + 3)),
            "patch site {site} outside the code cache"
        );
        let rel = target.0 as i64 - (site.0 as i64 + 4);
        let rel = i32::try_from(rel).expect("code cache spans less than 2 GiB");
        let off = (site.0 - self.rx_base) as usize;
        // SAFETY: inside the RW view; the patched block is not running (we are in Rust).
        unsafe {
            std::ptr::copy_nonoverlapping(rel.to_le_bytes().as_ptr(), self.rw_base.add(off), 4)
        };
    }

    /// Writes `jmp rel32` to `target` over the 5 bytes at `at`: an old block entry that now
    /// leads to a superblock (links to the old entry keep working).
    ///
    /// # Panics
    /// If `at` is outside the cache (a bug in hotpath).
    pub fn patch_jump(&mut self, at: HostAddr, target: HostAddr) {
        assert!(
            self.contains(at) && self.contains(HostAddr(at.0 + 4)),
            "patch site {at} outside the code cache"
        );
        let off = (at.0 - self.rx_base) as usize;
        // SAFETY: inside the RW view; no translated code runs while the dispatcher patches.
        unsafe { *self.rw_base.add(off) = 0xe9 };
        self.patch_rel32(HostAddr(at.0 + 1), target);
    }

    /// Copies the cache into new shared memory, for a child about to be forked: the cache's
    /// memory is shared across `fork`, so parent and child would otherwise write each other's
    /// code. Call before forking (nothing changes the cache then), then
    /// [`adopt`](Self::adopt) the copy in the child and drop it in the parent.
    ///
    /// # Errors
    /// [`TranslateError::CodeCache`] if the memory cannot be mapped.
    pub fn snapshot(&self) -> Result<CacheCopy, TranslateError> {
        let at = shared_anonymous(self.size)?;
        let copy = CacheCopy {
            at,
            size: self.size,
        };
        // SAFETY: the used part of our own RW view into the new mapping, of the same size.
        unsafe { std::ptr::copy_nonoverlapping(self.rw_base, at as *mut u8, self.cursor as usize) };
        Ok(copy)
    }

    /// Puts `copy` (from [`snapshot`](Self::snapshot)) under both views: this process's cache
    /// is now its own.
    ///
    /// # Errors
    /// [`TranslateError::CodeCache`] if a mapping fails.
    pub fn adopt(&mut self, copy: CacheCopy) -> Result<(), TranslateError> {
        alias(
            copy.at,
            self.size,
            self.rx_base,
            libc::PROT_READ | libc::PROT_EXEC,
        )?;
        // The copy itself becomes the writable view (the old one, shared with the parent, goes).
        // SAFETY: moving our own mapping over our own RW view; no translated code runs while
        // the dispatcher does this.
        let rw = unsafe {
            libc::mremap(
                copy.at as *mut c_void,
                self.size as usize,
                self.size as usize,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                self.rw_base as *mut c_void,
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
        std::mem::forget(copy);
        Ok(())
    }

    /// Forgets every block (not the gateway) and its layout: the next insert reuses the space.
    pub fn flush(&mut self) {
        self.cursor = self.floor;
        self.layouts_mut().clear();
    }

    /// Host addresses `[start, end)` of the gateway's routines (the code below the floor).
    pub fn gateway_range(&self) -> (u64, u64) {
        (self.rx_base, self.rx_base + self.floor)
    }

    /// The layouts of the blocks in the cache, by host code start.
    pub fn layouts(&self) -> &BTreeMap<u64, HostLayout> {
        // SAFETY: the handler only reads the map (`BlockMap`'s doc), and writes need `&mut self`.
        unsafe { &*self.blocks.map.get() }
    }

    /// The layouts, to add or remove blocks'.
    pub fn layouts_mut(&mut self) -> &mut BTreeMap<u64, HostLayout> {
        // SAFETY: the dispatcher holds `&mut self`, so it runs no translated code of this
        // thread, where alone the handler reads the map (`BlockMap`'s doc).
        unsafe { &mut *self.blocks.map.get() }
    }

    /// The layout map itself, for the thread's signal handler.
    pub fn block_map(&self) -> &'static BlockMap {
        self.blocks
    }

    /// True if `addr` is inside the executable view.
    pub fn contains(&self, addr: HostAddr) -> bool {
        addr.0 >= self.rx_base && addr.0 < self.rx_base + self.size
    }

    /// Bytes to add to an executable-view address to reach the same byte in the writable view.
    pub fn rw_delta(&self) -> u64 {
        (self.rw_base as u64).wrapping_sub(self.rx_base)
    }

    /// The executable view's range `(start, end)`.
    pub fn range(&self) -> (u64, u64) {
        (self.rx_base, self.rx_base + self.size)
    }

    /// Unmaps both views, giving their address ranges back (to the guest). The layout map
    /// stays allocated (the signal handler held a `&'static` to it).
    ///
    /// # Safety
    /// No code of this cache may run again on any thread, and nothing may jump to it: the
    /// caller's thread has left it and pointed its handler elsewhere.
    pub unsafe fn release(self) {
        // SAFETY: see the function's contract; both mappings are this cache's own.
        unsafe {
            libc::munmap(self.rx_base as *mut c_void, self.size as usize);
            libc::munmap(self.rw_base as *mut c_void, self.size as usize);
        }
    }
}

/// A copy of a code cache for a forked child ([`CodeCache::snapshot`]); unmapped when dropped
/// (in the parent), taken over by [`CodeCache::adopt`] (in the child).
pub struct CacheCopy {
    at: u64,
    size: u64,
}

impl Drop for CacheCopy {
    fn drop(&mut self) {
        // SAFETY: the copy's own mapping, which nothing else uses.
        unsafe { libc::munmap(self.at as *mut c_void, self.size as usize) };
    }
}

/// A new shared anonymous mapping of `size` bytes, readable and writable, wherever the kernel
/// likes. Returns its address.
fn shared_anonymous(size: u64) -> Result<u64, TranslateError> {
    // SAFETY: a fresh mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            // No commit charge for the whole size up front: pages are used as code fills them.
            libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
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
