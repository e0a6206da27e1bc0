//! The block catalog: every id's metadata, appended by the translators and read by the monitor
//! without a lock, a message or an allocation on the reader's side.
//!
//! # Who touches what
//!
//! One [`CatalogWriter`] exists per catalog. It lives in the translator's id registry, under
//! the lock that hands out ids, so ids are appended in order by one thread at a time. An entry
//! is written once, before the release store that publishes the new length, and never changes
//! or moves after. Readers ([`BlockCatalog::get`], [`BlockCatalog::len`]) load the length with
//! acquire, so every entry below it is complete. A block's entry is published before its
//! block first runs, hence before its id can be in a ring: an id the monitor drains from a ring
//! (acquire on the ring's head) is always in the catalog.
//!
//! The entries sit in chunks of doubling size (chunk `k` holds `FIRST_CHUNK << k` entries),
//! so a fixed array of chunk pointers covers every `u32` id, and nothing is copied as it grows.
//! Every chunk is freed with the catalog (entries are never removed: an id is forever). The
//! memory of a chunk is allocated and freed by the writer's side only, so no thread frees
//! what another allocated while the guest runs.

use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::Arc;

use hotpath_ir::BlockId;

use crate::NewBlock;

/// Entries in chunk 0 (chunk `k` holds `FIRST_CHUNK << k`).
const FIRST_CHUNK: usize = 1024;

/// Chunks enough for 2^32 ids: `FIRST_CHUNK * (2^CHUNKS - 1) >= 2^32`.
const CHUNKS: usize = 23;

/// Every id's metadata, in id order (see the module doc for the protocol).
pub struct BlockCatalog {
    /// Chunk `k`: `FIRST_CHUNK << k` entries, of which those below `len` are initialised;
    /// null until the writer first needs it.
    chunks: [AtomicPtr<MaybeUninit<NewBlock>>; CHUNKS],
    /// Entries published: written once each, in order, by the writer (release).
    len: AtomicUsize,
}

// SAFETY: entries are written only by the one writer before they are published (release on
// `len`) and never changed after; readers see only published entries (acquire on `len`).
// `NewBlock` is Send + Sync (plain data and an `Arc<[BlockId]>`).
unsafe impl Sync for BlockCatalog {}
// SAFETY: as above; the catalog owns its chunks.
unsafe impl Send for BlockCatalog {}

/// The one handle that appends to a [`BlockCatalog`] (see the module doc).
pub struct CatalogWriter {
    catalog: Arc<BlockCatalog>,
}

/// Chunk and position of entry `index`.
fn locate(index: usize) -> (usize, usize) {
    let q = index / FIRST_CHUNK + 1;
    let k = (usize::BITS - 1 - q.leading_zeros()) as usize;
    (k, index - FIRST_CHUNK * ((1 << k) - 1))
}

impl BlockCatalog {
    /// An empty catalog and its writer.
    pub fn new() -> (Arc<BlockCatalog>, CatalogWriter) {
        let catalog = Arc::new(BlockCatalog {
            chunks: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            len: AtomicUsize::new(0),
        });
        let writer = CatalogWriter {
            catalog: catalog.clone(),
        };
        (catalog, writer)
    }

    /// Number of ids published so far.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// True if no id is published yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The metadata of id `id`, if it is published.
    pub fn get(&self, id: BlockId) -> Option<&NewBlock> {
        let index = id.index();
        if index >= self.len() {
            return None;
        }
        let (k, at) = locate(index);
        let chunk = self.chunks[k].load(Ordering::Acquire);
        // SAFETY: `index < len`, so the writer allocated chunk `k` and initialised entry `at`
        // before its release store of `len`, which our acquire load saw; the entry never
        // changes and lives as long as `self`.
        Some(unsafe { (*chunk.add(at)).assume_init_ref() })
    }

    /// The entries of ids `from..` that are published, in id order: chunk by chunk, each
    /// chunk's entries as one slice (no lookup per entry).
    pub fn iter_from(&self, from: usize) -> impl Iterator<Item = &NewBlock> + '_ {
        let len = self.len();
        (0..CHUNKS)
            .map_while(move |k| {
                let first = FIRST_CHUNK * ((1 << k) - 1);
                (first < len).then_some((k, first))
            })
            .flat_map(move |(k, first)| {
                let end = (first + (FIRST_CHUNK << k)).min(len);
                let start = from.clamp(first, end);
                let chunk = self.chunks[k].load(Ordering::Acquire);
                // SAFETY: every index below `len` is published (acquire on `len` above), so
                // chunk `k` is allocated and its entries `start - first..end - first` are
                // initialised; they never change and live as long as `self`.
                unsafe {
                    std::slice::from_raw_parts(
                        chunk.add(start - first) as *const NewBlock,
                        end - start,
                    )
                }
            })
    }

    /// Every published entry, in id order.
    pub fn iter(&self) -> impl Iterator<Item = &NewBlock> + '_ {
        self.iter_from(0)
    }
}

impl Drop for BlockCatalog {
    fn drop(&mut self) {
        let len = *self.len.get_mut();
        for k in 0..CHUNKS {
            let chunk = *self.chunks[k].get_mut();
            if chunk.is_null() {
                continue;
            }
            let size = FIRST_CHUNK << k;
            let first = FIRST_CHUNK * ((1 << k) - 1);
            let live = len.saturating_sub(first).min(size);
            // SAFETY: the chunk was allocated by `append` as a boxed slice of `size` entries,
            // of which the first `live` are initialised; nobody else holds the catalog.
            unsafe {
                for i in 0..live {
                    (*chunk.add(i)).assume_init_drop();
                }
                drop(Box::from_raw(ptr::slice_from_raw_parts_mut(chunk, size)));
            }
        }
    }
}

impl CatalogWriter {
    /// The catalog this writer appends to (for readers).
    pub fn catalog(&self) -> &Arc<BlockCatalog> {
        &self.catalog
    }

    /// Publishes `b`, which must be the next id (`b.id == len`).
    ///
    /// # Panics
    /// If `b.id` is not the next id: ids are handed out in order under the registry lock, so
    /// anything else is a bug in hotpath. If it reaches [`crate::MAX_EVENT_ID`].
    pub fn append(&mut self, b: NewBlock) {
        let c = &*self.catalog;
        // Only this writer stores `len`.
        let index = c.len.load(Ordering::Relaxed);
        assert_eq!(b.id.index(), index, "block ids are catalogued in order");
        assert!(
            b.id.0 < crate::MAX_EVENT_ID,
            "block ids run out at 2^30 (the ring's tag bits)"
        );
        let (k, at) = locate(index);
        let mut chunk = c.chunks[k].load(Ordering::Relaxed);
        if chunk.is_null() {
            let size = FIRST_CHUNK << k;
            let boxed: Box<[MaybeUninit<NewBlock>]> = Box::new_uninit_slice(size);
            chunk = Box::into_raw(boxed) as *mut MaybeUninit<NewBlock>;
            c.chunks[k].store(chunk, Ordering::Release);
        }
        // SAFETY: entry `at` of chunk `k` is not published yet (`index == len`), so no reader
        // looks at it; this writer is the only one.
        unsafe { (*chunk.add(at)).write(b) };
        c.len.store(index + 1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IdKind;
    use hotpath_ir::{BlockSummary, GuestAddr, Terminator};

    fn entry(i: u32) -> NewBlock {
        NewBlock {
            id: BlockId(i),
            summary: BlockSummary {
                start: GuestAddr(0x1000 + i as u64),
                terminator_addr: GuestAddr(0x1000 + i as u64),
                len_bytes: 1,
                instructions: 1,
                terminator: Terminator::Return,
            },
            kind: IdKind::Block,
            code: vec![i as u8].into(),
        }
    }

    #[test]
    fn chunks_double_and_cover_every_u32_id() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(FIRST_CHUNK - 1), (0, FIRST_CHUNK - 1));
        assert_eq!(locate(FIRST_CHUNK), (1, 0));
        assert_eq!(locate(3 * FIRST_CHUNK), (2, 0));
        assert_eq!(locate(3 * FIRST_CHUNK - 1), (1, 2 * FIRST_CHUNK - 1));
        let (k, at) = locate(u32::MAX as usize);
        assert!(k < CHUNKS && at < FIRST_CHUNK << k);
    }

    #[test]
    fn a_reader_on_another_thread_sees_every_entry_in_order() {
        let (catalog, mut writer) = BlockCatalog::new();
        let n = 5 * FIRST_CHUNK as u32 + 17;
        let reader = {
            let catalog = catalog.clone();
            std::thread::spawn(move || {
                let mut seen = 0u32;
                while seen < n {
                    for b in catalog.iter_from(seen as usize) {
                        assert_eq!(b.id, BlockId(seen));
                        assert_eq!(b.summary.start, GuestAddr(0x1000 + seen as u64));
                        assert_eq!(&*b.code, &[seen as u8]);
                        seen += 1;
                    }
                }
            })
        };
        for i in 0..n {
            writer.append(entry(i));
        }
        reader.join().unwrap();
        assert_eq!(catalog.len(), n as usize);
        assert!(catalog.get(BlockId(n)).is_none());
        // Superblock entries own an Arc: dropping the catalog drops them.
        let trace: Arc<[BlockId]> = vec![BlockId(0), BlockId(1)].into();
        writer.append(NewBlock {
            kind: IdKind::Superblock {
                blocks: trace.clone(),
            },
            ..entry(n)
        });
        drop(writer);
        drop(catalog);
        assert_eq!(Arc::strong_count(&trace), 1);
    }

    #[test]
    #[should_panic(expected = "in order")]
    fn an_id_out_of_order_is_a_bug() {
        let (_catalog, mut writer) = BlockCatalog::new();
        writer.append(entry(1));
    }

    #[test]
    fn iter_from_gives_every_published_entry_across_chunks_in_order() {
        let (catalog, mut writer) = BlockCatalog::new();
        for i in 0..(7 * FIRST_CHUNK as u32 + 3) {
            writer.append(entry(i));
        }
        let len = catalog.len();
        for from in [
            0,
            1,
            FIRST_CHUNK - 1,
            FIRST_CHUNK,
            3 * FIRST_CHUNK + 5,
            len - 1,
            len,
            len + 9,
        ] {
            let ids: Vec<usize> = catalog.iter_from(from).map(|b| b.id.index()).collect();
            let want: Vec<usize> = (from..len).collect();
            assert_eq!(ids, want, "from {from}");
        }
    }
}
