//! The layout of a store file: a header, the key, an index sorted by guest offset, and one
//! record per basic block, each checked by its own CRC-32 when it is first used. Opening a
//! file checks only its header, key and index; a process decodes just the records of the
//! blocks it reaches (a library's file holds the blocks of every program that ran it).
//!
//! ```text
//! header   32 bytes, little-endian: "HPTC", format u32, key_len u32, count u32,
//!          index_crc u32 (CRC-32 of key and index), 0 u32, records_len u64
//! key      postcard of (EmitKey, FileId)
//! index    count × 24 bytes: offset u64 (guest, from the module's start), at u32 (from the
//!          records' start), len u32, crc u32 (CRC-32 of the record's bytes), 0 u32
//! records  each BlockRecord in the layout `RecordView` reads, in index order
//! ```

use std::fs;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::record::{BlockRecord, RecordView};
use crate::cache::modules::FileId;
use crate::host::reserve;

/// The start of every store file, then the format's version.
const MAGIC: &[u8; 4] = b"HPTC";
/// Bumped when [`BlockRecord`] or the file layout changes.
const FORMAT: u32 = 6;
/// Header size in bytes.
const HEADER: usize = 32;
/// Index entry size in bytes.
const ENTRY: usize = 24;
/// Guest page size, as a shift, for the index's page directory.
const PAGE_SHIFT: u32 = 12;
/// Most guest pages a module's directory covers (64 GiB of module): a file whose offsets go
/// further is refused rather than given a directory that large.
const MAX_PAGES: u64 = 1 << 24;

/// What besides the module decides the code hotpath emits for it: hotpath's own build, the
/// host CPU's features the code depends on (`AT_HWCAP`, `AT_HWCAP2`: e.g. FSGSBASE for
/// `rdgsbase`; protection keys for `wrpkru`), and the event ring's size in entries (0: no
/// enqueue stub, the monitor off).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EmitKey {
    /// hotpath's version and its executable's device, inode, size and modification time.
    pub hotpath: String,
    pub hwcap: u64,
    pub hwcap2: u64,
    pub pku: bool,
    pub ring_entries: u64,
}

impl EmitKey {
    /// The key of this hotpath on this CPU, with the enqueue stub for a ring of
    /// `ring_entries` entries (`None`: the monitor is off).
    pub fn current(ring_entries: Option<u64>) -> EmitKey {
        let exe = fs::metadata("/proc/self/exe")
            .map(|m| {
                format!(
                    "{}:{}:{}:{}",
                    m.dev(),
                    m.ino(),
                    m.size(),
                    m.mtime_nsec() + m.mtime() * 1_000_000_000
                )
            })
            .unwrap_or_default();
        // SAFETY: getauxval has no preconditions.
        let (hwcap, hwcap2) = unsafe {
            (
                libc::getauxval(libc::AT_HWCAP),
                libc::getauxval(libc::AT_HWCAP2),
            )
        };
        EmitKey {
            hotpath: format!("{} {exe}", env!("CARGO_PKG_VERSION")),
            hwcap,
            hwcap2,
            pku: crate::host::cpu::host_pku(),
            ring_entries: ring_entries.unwrap_or(0),
        }
    }
}

/// What a store file is for: the emission setting and the module's file.
pub type Key = (EmitKey, FileId);

/// A store file's bytes: mapped from the file (what a run reads), or in memory (tests, and a
/// file that cannot be mapped).
pub enum FileBytes {
    /// Read into memory.
    Owned(Vec<u8>),
    /// Mapped read-only and private: only the pages of records placed are read, through the
    /// page cache, without a copy (a python3 process places 38,000 of a 17 MB file's 50,000
    /// records; reading the whole file cost it 4,400 page faults of fresh heap).
    Mapped(memmap2::Mmap),
}

impl Default for FileBytes {
    fn default() -> FileBytes {
        FileBytes::Owned(Vec::new())
    }
}

impl From<Vec<u8>> for FileBytes {
    fn from(v: Vec<u8>) -> FileBytes {
        FileBytes::Owned(v)
    }
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Owned(v) => v,
            FileBytes::Mapped(m) => m,
        }
    }
}

/// The records of one module as read from its store file (possibly none), looked up by guest
/// offset and decoded on use.
#[derive(Default)]
pub struct ModuleRecords {
    /// The whole file.
    bytes: FileBytes,
    /// Where the index starts in `bytes`.
    index_at: usize,
    /// Index entries.
    count: usize,
    /// Where the records start in `bytes`.
    records_at: usize,
    /// Entry `p`: the first index entry whose offset is on guest page `p` of the module or
    /// later (one more entry, `count`, at the end): a lookup searches one page's entries, a
    /// cache line or two, not the whole index (16 probes across a python3 file's 1.2 MB).
    pages: Vec<u32>,
    /// The records written beside the file since it was last rewritten (its delta file, a
    /// store file of its own), looked up after the file's.
    delta: Option<Box<ModuleRecords>>,
}

/// A little-endian integer of `N` bytes at `at`, if `bytes` holds it.
fn le<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

impl ModuleRecords {
    /// The records of the store file `bytes`, if its header, key and index are whole and
    /// unchanged and its key is `key`.
    pub fn parse(bytes: FileBytes, key: &Key) -> Option<ModuleRecords> {
        let u32_at = |at| le::<4>(&bytes, at).map(u32::from_le_bytes);
        if bytes.get(..4)? != MAGIC || u32_at(4)? != FORMAT || u32_at(20)? != 0 {
            return None;
        }
        let key_len = u32_at(8)? as usize;
        let count = u32_at(12)? as usize;
        let index_crc = u32_at(16)?;
        let records_len = u64::from_le_bytes(le::<8>(&bytes, 24)?);
        let index_at = HEADER.checked_add(key_len)?;
        let records_at = index_at.checked_add(count.checked_mul(ENTRY)?)?;
        if records_at as u64 + records_len != bytes.len() as u64 {
            return None;
        }
        if crc32fast::hash(&bytes[HEADER..records_at]) != index_crc {
            return None;
        }
        let stored: Key = postcard::from_bytes(&bytes[HEADER..index_at]).ok()?;
        if stored != *key {
            return None;
        }
        let mut records = ModuleRecords {
            bytes,
            index_at,
            count,
            records_at,
            pages: Vec::new(),
            delta: None,
        };
        records.pages = records.page_directory()?;
        Some(records)
    }

    /// The page directory of the index (see `pages`), if the index is sorted by offset.
    fn page_directory(&self) -> Option<Vec<u32>> {
        let last_page = match self.count {
            0 => 0,
            n => self.entry(n - 1).0 >> PAGE_SHIFT,
        };
        if last_page >= MAX_PAGES {
            return None;
        }
        let mut pages = Vec::with_capacity(usize::try_from(last_page).ok()? + 2);
        let mut previous = 0;
        for i in 0..self.count {
            let offset = self.entry(i).0;
            if i > 0 && offset <= previous {
                return None;
            }
            previous = offset;
            while (pages.len() as u64) <= offset >> PAGE_SHIFT {
                pages.push(i as u32);
            }
        }
        pages.push(self.count as u32);
        Some(pages)
    }

    /// Index entry `i`: `(offset, at, len, crc)`.
    fn entry(&self, i: usize) -> (u64, usize, usize, u32) {
        let e = self.index_at + i * ENTRY;
        let b = &self.bytes[e..e + ENTRY];
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default());
        (
            u64::from_le_bytes(b[..8].try_into().unwrap_or_default()),
            u32_at(8) as usize,
            u32_at(12) as usize,
            u32_at(16),
        )
    }

    /// The index entry of guest offset `offset`, by binary search among its page's.
    fn find(&self, offset: u64) -> Option<usize> {
        let page = usize::try_from(offset >> PAGE_SHIFT).ok()?;
        let (mut lo, mut hi) = match self.pages.get(page..page + 2) {
            Some(&[lo, hi]) => (lo as usize, hi as usize),
            _ => return None,
        };
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.entry(mid).0.cmp(&offset) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// These records with `delta`'s after them (see `delta`).
    pub fn with_delta(mut self, delta: ModuleRecords) -> ModuleRecords {
        self.delta = Some(Box::new(delta));
        self
    }

    /// The delta file's records, if it was read.
    pub fn delta(&self) -> Option<&ModuleRecords> {
        self.delta.as_deref()
    }

    /// Whether the file or its delta has a record for guest offset `offset` (not checked or
    /// decoded).
    pub fn contains(&self, offset: u64) -> bool {
        self.find(offset).is_some() || self.delta.as_ref().is_some_and(|d| d.contains(offset))
    }

    /// Records in the file and its delta.
    pub fn len(&self) -> usize {
        self.count + self.delta.as_ref().map_or(0, |d| d.len())
    }

    /// Records in the file itself (its delta's not counted).
    pub fn own_len(&self) -> usize {
        self.count
    }

    /// Whether the file and its delta have no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of record `i` of the index with its offset, if they are unchanged.
    fn blob(&self, i: usize) -> Option<(u64, &[u8])> {
        let (offset, at, len, crc) = self.entry(i);
        let start = self.records_at.checked_add(at)?;
        let bytes = self.bytes.get(start..start.checked_add(len)?)?;
        (crc32fast::hash(bytes) == crc).then_some((offset, bytes))
    }

    /// Record `i` of the index, if its bytes are unchanged and decode to a record of its
    /// offset.
    fn decode(&self, i: usize) -> Option<RecordView<'_>> {
        let (offset, bytes) = self.blob(i)?;
        let record = RecordView::parse(bytes)?;
        (record.offset == offset).then_some(record)
    }

    /// The record of the block at guest offset `offset`, if the file (else its delta) has
    /// one and it is whole.
    pub fn get(&self, offset: u64) -> Option<RecordView<'_>> {
        match self.find(offset) {
            Some(i) => self.decode(i),
            None => self.delta.as_ref()?.get(offset),
        }
    }

    /// Every whole record, in offset order (a damaged one is left out).
    #[cfg(test)]
    pub fn all(&self) -> impl Iterator<Item = BlockRecord> + '_ {
        (0..self.count).filter_map(|i| self.decode(i)?.to_record())
    }
}

/// The bytes of a store file for `key` holding the records of the files `old` (their own, not
/// their deltas') and `new`; where several have a record at one offset, `new`'s is kept, else
/// the one of the latest in `old`. Old records are copied as they are, without decoding them
/// (a damaged one is left out): a library's file holds tens of thousands. `None` if a part is
/// too large for its field.
pub fn encode_merged(key: &Key, old: &[&ModuleRecords], new: &[BlockRecord]) -> Option<Vec<u8>> {
    // The large buffers are reserved fallibly: the file is optional, and the memory may be
    // short (a guest that used up an address space limit).
    let fallible = |v: &mut Vec<u8>, n: usize| reserve::fallibly(|| v.try_reserve_exact(n)).ok();
    let fresh = new
        .iter()
        .map(|r| (r.offset, r.encode()))
        .collect::<Vec<_>>();
    // (offset, rank: later wins, blob)
    let mut parts: Vec<(u64, usize, &[u8])> = Vec::new();
    let count = old.iter().map(|o| o.count).sum::<usize>() + fresh.len();
    reserve::fallibly(|| parts.try_reserve_exact(count)).ok()?;
    for (rank, o) in old.iter().enumerate() {
        parts.extend(
            (0..o.count)
                .filter_map(|i| o.blob(i))
                .map(|(at, b)| (at, rank, b)),
        );
    }
    parts.extend(fresh.iter().map(|(at, b)| (*at, old.len(), b.as_slice())));
    parts.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    parts.dedup_by_key(|p| p.0);
    let parts: Vec<(u64, &[u8])> = parts.into_iter().map(|(at, _, b)| (at, b)).collect();
    let key_bytes = postcard::to_stdvec(key).ok()?;
    let mut index = Vec::new();
    fallible(&mut index, parts.len() * ENTRY)?;
    let mut at = 0usize;
    for (offset, blob) in &parts {
        index.extend_from_slice(&offset.to_le_bytes());
        index.extend_from_slice(&u32::try_from(at).ok()?.to_le_bytes());
        index.extend_from_slice(&u32::try_from(blob.len()).ok()?.to_le_bytes());
        index.extend_from_slice(&crc32fast::hash(blob).to_le_bytes());
        index.extend_from_slice(&0u32.to_le_bytes());
        at += blob.len();
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&key_bytes);
    crc.update(&index);
    let mut out = Vec::new();
    fallible(&mut out, HEADER + key_bytes.len() + index.len() + at)?;
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&u32::try_from(key_bytes.len()).ok()?.to_le_bytes());
    out.extend_from_slice(&u32::try_from(parts.len()).ok()?.to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(at as u64).to_le_bytes());
    out.extend_from_slice(&key_bytes);
    out.extend_from_slice(&index);
    for (_, blob) in &parts {
        out.extend_from_slice(blob);
    }
    Some(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::persist::record::{ExitRecord, RelocRecord, TermRecord};

    pub(crate) fn key() -> Key {
        let file = FileId {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: 4,
            ctime_ns: 5,
            build_id: vec![6],
        };
        (EmitKey::current(Some(1024)), file)
    }

    pub(crate) fn record(offset: u64) -> BlockRecord {
        BlockRecord {
            offset,
            guest: vec![0x48, 0x89, 0xc3, 0xeb, 0xfe],
            instructions: 2,
            term_at: 3,
            term: TermRecord::Jump(3),
            code: vec![0x90; 40 + offset as usize % 7],
            cold: 10,
            entry: 8,
            relocs: vec![RelocRecord::BlockId(2), RelocRecord::Exit { at: 20, k: 0 }],
            exits: vec![ExitRecord::Direct {
                target: 3,
                site: 24,
                stub: 30,
                call: false,
            }],
            body: vec![(8, 0)],
            term_start: 12,
            term_guest: 3,
            rcx_borrowed_from: None,
            far_borrows: Vec::new(),
            slot: None,
            dead: 0,
            site: None,
        }
    }

    #[test]
    fn records_are_found_by_offset_and_checked_on_use() {
        let records: Vec<_> = [0x10u64, 0x40, 0x41, 0x900].map(record).into();
        let bytes = encode_merged(&key(), &[], &records).unwrap();
        let file = ModuleRecords::parse(bytes.clone().into(), &key()).unwrap();
        assert_eq!(file.len(), 4);
        for r in &records {
            assert_eq!(
                file.get(r.offset).and_then(|v| v.to_record()).as_ref(),
                Some(r)
            );
        }
        assert!(file.get(0x11).is_none() && !file.contains(0x11));
        assert_eq!(file.all().collect::<Vec<_>>(), records);
        let records_at = bytes.len() - records.iter().map(|r| r.encode().len()).sum::<usize>();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x20;
            match ModuleRecords::parse(bad.into(), &key()) {
                // The header, key or index changed: the file is refused whole.
                None => assert!(i < records_at, "byte {i} of a record refused the file"),
                // A record's bytes changed: that record alone is refused.
                Some(f) => {
                    assert!(i >= records_at, "byte {i} of the header or index not seen");
                    let whole = records.iter().filter(|r| {
                        f.get(r.offset).and_then(|v| v.to_record()).as_ref() == Some(r)
                    });
                    assert_eq!(whole.count(), 3, "byte {i} flipped");
                }
            }
        }
        assert!(ModuleRecords::parse(bytes[..bytes.len() - 1].to_vec().into(), &key()).is_none());
        let mut other = key();
        other.1.ino += 1;
        assert!(ModuleRecords::parse(bytes.into(), &other).is_none());
    }

    #[test]
    fn records_on_many_pages_are_found_and_gaps_are_not() {
        let offsets = [0x10u64, 0xfff, 0x1000, 0x1fff, 0x5000, 0x5008, 0x12345];
        let records: Vec<_> = offsets.map(record).into();
        let bytes = encode_merged(&key(), &[], &records).unwrap();
        let file = ModuleRecords::parse(bytes.into(), &key()).unwrap();
        for r in &records {
            assert_eq!(
                file.get(r.offset).and_then(|v| v.to_record()).as_ref(),
                Some(r)
            );
        }
        for missing in [
            0,
            0x11,
            0xffe,
            0x2000,
            0x4fff,
            0x5001,
            0x12344,
            0x12346,
            1 << 40,
        ] {
            assert!(!file.contains(missing), "{missing:#x} found");
        }
        // Offsets beyond what a directory covers: the file is refused, not given a huge one.
        let far = encode_merged(&key(), &[], &[record(0x10), record(1 << 40)]).unwrap();
        assert!(ModuleRecords::parse(far.into(), &key()).is_none());
    }

    #[test]
    fn a_merge_keeps_old_records_and_replaces_them_by_new_ones() {
        let old: Vec<_> = [0x10u64, 0x40, 0x900].map(record).into();
        let bytes = encode_merged(&key(), &[], &old).unwrap();
        let file = ModuleRecords::parse(bytes.into(), &key()).unwrap();
        let mut newer = record(0x40);
        newer.instructions = 9;
        let new = vec![record(0x41), newer.clone(), record(0x5)];
        let merged = encode_merged(&key(), &[&file], &new).unwrap();
        let merged = ModuleRecords::parse(merged.into(), &key()).unwrap();
        let offsets: Vec<u64> = merged.all().map(|r| r.offset).collect();
        assert_eq!(offsets, [0x5, 0x10, 0x40, 0x41, 0x900]);
        assert_eq!(merged.get(0x40).and_then(|v| v.to_record()), Some(newer));
        assert_eq!(
            merged.get(0x900).and_then(|v| v.to_record()),
            Some(record(0x900))
        );
    }
}
