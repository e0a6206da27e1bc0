//! The monitor's exact tables, fed event by event in ring order.
//!
//! The hot loop does one thing per block event: it counts the edge from the previous block to
//! this one, in a two-entry successor cache per block id (most blocks have at most two
//! successors), with a hash map behind it for the rest (indirect branches, re-translations).
//! Block counts, edge kinds, indirect-branch targets and totals are all derived from those
//! edge counts when the profile is taken: a block's count is the sum of its out-edges, plus one
//! for the very last block executed. This keeps the per-event work to a compare and an add.
//!
//! Superblocks do not change the hot loop either: their ids and their side-exit ids are counted
//! as pairs like any other, and [`Tables::edges`] expands each pair into the basic blocks it
//! stands for (`superblock → its side exit i`: the trace's blocks `0..=i` ran; `superblock →
//! anything else`: the whole trace ran, then its last block led to the next event's first).
//! A pair whose count crosses the hot threshold is noted in [`Tables::hot`] for the
//! superblock decisions (`decisions.rs`).

use std::collections::HashMap;

use hotpath_events::{
    is_id, BlockCatalog, CatalogWriter, IdKind, NewBlock, SYSCALL_EVENT, TAG_MASK,
};
use hotpath_ir::{BlockId, BlockSummary};
use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex};

/// No id — the monitor's one "none" for its `u32` ids: no block (a successor slot is empty,
/// or no block has run yet), and in the path recorder no node, function, path or run.
pub(crate) const NONE: u32 = u32::MAX;

/// A successor cache slot of a block whose successors all live in its wide table (never an
/// id: ids stay below 2^31).
const IN_WIDE: u32 = u32::MAX - 1;

/// Successor cache of one block id: the first two distinct successor ids and their counts.
#[derive(Clone, Copy)]
struct Successors {
    id: [u32; 2],
    count: [u64; 2],
}

const EMPTY: Successors = Successors {
    id: [NONE; 2],
    count: [0; 2],
};

/// Slots of a wide successor table: successor id `to` lives in slot `to % WIDE_SLOTS` (ids
/// are dense, so an interpreter's handlers rarely share a slot). Measured on bench_interp: its
/// dispatch jump sent every event to the hash map, which took half of the monitor's time.
const WIDE_SLOTS: usize = 64;

/// The successors of a block with many (an indirect branch site), direct-mapped, and those
/// that fit in no slot.
#[derive(Clone)]
struct Wide {
    /// `(successor id, count)`: an id and its count share a cache line (as two arrays, an
    /// indirect branch's event missed the cache twice on a big program's many return sites).
    slots: [(u32, u64); WIDE_SLOTS],
    /// Successor id → count, for successors whose slot another one holds (rare: two
    /// successors of one block in the same slot; the hash is the fast Fx one, not SipHash).
    /// Kept per block so that a block's successors are found without looking at any other
    /// block's: when it was one map for every block, the superblock decisions, which list
    /// a superblock's successors at each look at its side exits, scanned it whole each time,
    /// and a compiler (cc1, 17,000 superblocks) spent two thirds of the monitor's time there.
    rest: FxHashMap<u32, u64>,
}

/// Counts of one system call number.
#[derive(Clone, Debug, Default)]
pub struct SyscallCount {
    /// Times it was called.
    pub count: u64,
    /// Block id that issued it → times.
    pub sites: HashMap<u32, u64>,
}

/// One system call's row of [`Counts`]: `(number, calls, [(block id that issued it, calls)])`.
pub type SyscallRow = (u32, u64, Vec<(u32, u64)>);

/// What a [`Tables`] counted, without the ids' metadata ([`Tables::counts`]): the form a raw
/// profile keeps and [`Tables::add_counts`] takes back. Ids are event ids (superblocks and
/// side exits included) of the process's catalog.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    /// Every observed pair of consecutive events `(from, to, count)` ([`Tables::raw_edges`]).
    pub edges: Vec<(u32, u32, u64)>,
    /// One row per system call, by number.
    pub syscalls: Vec<SyscallRow>,
    /// The last event of each stream counted (it ran once more than its out-edges say).
    pub last: Vec<u32>,
    /// Events processed (blocks and system calls).
    pub events: u64,
}

/// The ids' metadata as one [`Tables`] knows it: a view of a [`BlockCatalog`] up to the ids it
/// has learnt. Every thread's tables of a process view the process's catalog, so a thread
/// that starts copies nothing (each thread's tables held a copy of every id's metadata, and a
/// python3 program that starts and joins 200 threads spent half of the monitor's time
/// copying). Tables made alone (tests, tools) own a catalog of their own and append to it.
#[derive(Clone)]
struct Meta {
    catalog: Arc<BlockCatalog>,
    /// Ids learnt: `0..known` are published in `catalog`.
    known: usize,
    /// The catalog's writer when these tables made the catalog themselves (shared with their
    /// clones, which view the same catalog).
    writer: Option<Arc<Mutex<CatalogWriter>>>,
}

impl Default for Meta {
    fn default() -> Meta {
        let (catalog, writer) = BlockCatalog::new();
        Meta {
            catalog,
            known: 0,
            writer: Some(Arc::new(Mutex::new(writer))),
        }
    }
}

/// Exact counts of everything the event stream shows, indexed by block id; and the ids'
/// metadata ([`Tables::summary`], [`Tables::kind`]), read from the process's catalog.
#[derive(Clone)]
pub struct Tables {
    meta: Meta,
    /// Pair count at which `(from, to)` is noted in `hot` (`u64::MAX`: never).
    pub hot_threshold: u64,
    /// Event pairs `(from, to)` whose count just reached `hot_threshold`, for the decisions.
    pub hot: Vec<(u32, u32)>,
    successors: Vec<Successors>,
    /// For a block with more than two successors (an indirect branch): the index of its wide
    /// table in `wide`, else [`NONE`]. Indexed by block id, like `successors`.
    wide_of: Vec<u32>,
    /// Direct-mapped successor tables of the blocks that have more than two successors.
    wide: Vec<Wide>,
    /// The ids with an out-edge (a filled successor slot), in the order they got their first:
    /// what [`Tables::raw_edges`] reads, so that a thread's tables cost what the thread ran,
    /// not the size of the process's id space.
    sources: Vec<u32>,
    /// System call number → counts.
    pub syscalls: HashMap<u32, SyscallCount>,
    /// The previous block event (the source of the next edge).
    prev: u32,
    /// The last events of other threads' streams merged in (`merge`): like `prev`, each ran
    /// once more than its out-edges say.
    tails: Vec<u32>,
    /// Events processed (blocks and system calls).
    pub events: u64,
}

impl Default for Tables {
    fn default() -> Tables {
        Tables {
            meta: Meta::default(),
            hot_threshold: u64::MAX,
            hot: Vec::new(),
            successors: Vec::new(),
            wide_of: Vec::new(),
            wide: Vec::new(),
            sources: Vec::new(),
            syscalls: HashMap::new(),
            prev: NONE,
            tails: Vec::new(),
            events: 0,
        }
    }
}

/// The part of the tables the inner loop updates, borrowed apart from the rest so the
/// compiler keeps it in registers.
struct EdgeCache<'a> {
    successors: &'a mut [Successors],
    wide_of: &'a [u32],
    wide: &'a mut [Wide],
    hot: &'a mut Vec<(u32, u32)>,
    threshold: u64,
}

impl EdgeCache<'_> {
    /// Counts one traversal of the edge `from → to` if it has a slot already: one of `from`'s
    /// two cached successors, or its slot in `from`'s wide table. False otherwise (no slot
    /// yet, or `from` is [`NONE`] or beyond the table). Notes the edge in `hot` when its count
    /// reaches the threshold.
    ///
    /// Which of the two slots holds `to` is as unpredictable as the guest's branches, so the
    /// slot is picked without a branch (measured: the two-way branch mispredicted on most
    /// events of a recursive guest).
    #[inline(always)]
    fn bump(&mut self, from: u32, to: u32) -> bool {
        let Some(s) = self.successors.get_mut(from as usize) else {
            return false;
        };
        let k = (s.id[1] == to) as usize;
        let c = if s.id[k] == to {
            s.count[k] += 1;
            s.count[k]
        } else {
            let w = self.wide_of[from as usize];
            if w == NONE {
                return false;
            }
            let t = &mut self.wide[w as usize];
            let j = to as usize % WIDE_SLOTS;
            if t.slots[j].0 != to {
                return false;
            }
            t.slots[j].1 += 1;
            t.slots[j].1
        };
        if c == self.threshold {
            self.hot.push((from, to));
        }
        true
    }

    /// The monitor's inner loop: counts events while each edge from the one before has a
    /// slot. Returns `(events consumed, last event)`: it stops before the first event it
    /// cannot count.
    ///
    /// A run of one repeated event (a one-block loop) goes through the same compare and add:
    /// counting runs in a register first cost a branch on "same as before?", which a recursive
    /// guest mispredicts (measured on bench_fib: 3.9 ns per event with it, 2.9 without; a
    /// self-following superblock, bench_crc, went from 0.8 to 2.9, still far below the 14 ns
    /// its guest takes per event).
    fn count(&mut self, mut prev: u32, events: &[u32]) -> (usize, u32) {
        for (i, &ev) in events.iter().enumerate() {
            if !self.bump(prev, ev) {
                return (i, prev);
            }
            prev = ev;
        }
        (events.len(), prev)
    }
}

impl Tables {
    /// These tables' storage made into a copy of `fresh` (tables that have counted nothing,
    /// such as the monitor's template for new threads): what was counted is forgotten, but
    /// the per-id arrays keep their size, and only the entries these tables filled (the ids in
    /// `sources`) are emptied. A new thread that takes the storage of one that ended then
    /// grows nothing: python3 starting 200 threads one after another zeroed 1.8 MB of arrays
    /// for each (a page fault per 4 KiB), 15 % of the monitor's time.
    pub fn recycle(&mut self, fresh: &Tables) {
        debug_assert!(fresh.sources.is_empty() && fresh.events == 0);
        for &id in &self.sources {
            if let Some(s) = self.successors.get_mut(id as usize) {
                *s = EMPTY;
            }
            if let Some(w) = self.wide_of.get_mut(id as usize) {
                *w = NONE;
            }
        }
        let (mut successors, mut wide_of) = (
            std::mem::take(&mut self.successors),
            std::mem::take(&mut self.wide_of),
        );
        let fresh_len = fresh.successors.len();
        if successors.len() < fresh_len {
            successors.resize(fresh_len, EMPTY);
            wide_of.resize(fresh_len, NONE);
        }
        successors[..fresh_len].copy_from_slice(&fresh.successors);
        wide_of[..fresh_len].copy_from_slice(&fresh.wide_of);
        let (mut hot, mut sources, mut tails) = (
            std::mem::take(&mut self.hot),
            std::mem::take(&mut self.sources),
            std::mem::take(&mut self.tails),
        );
        hot.clone_from(&fresh.hot);
        sources.clone_from(&fresh.sources);
        tails.clone_from(&fresh.tails);
        *self = Tables {
            meta: fresh.meta.clone(),
            hot_threshold: fresh.hot_threshold,
            hot,
            successors,
            wide_of,
            wide: fresh.wide.clone(),
            sources,
            syscalls: fresh.syscalls.clone(),
            prev: fresh.prev,
            tails,
            events: fresh.events,
        };
    }

    /// Accounts a run of events in ring order.
    ///
    /// The common case — the event is one of the previous event's two cached successors — runs
    /// in [`EdgeCache::count`] on a borrow of the tables apart from `self`; it
    /// stops at anything else (a new edge, a system call event, an id beyond the table), which
    /// is handled here, one event at a time.
    pub fn record(&mut self, events: &[u32]) {
        let mut prev = self.prev;
        let mut i = 0;
        while i < events.len() {
            let (done, p) = self.edge_cache().count(prev, &events[i..]);
            prev = p;
            i += done;
            let Some(&ev) = events.get(i) else { break };
            i += 1;
            if !is_id(ev) {
                // Context events say nothing the tables count.
                if ev & TAG_MASK == SYSCALL_EVENT {
                    self.record_syscall(ev & !SYSCALL_EVENT, prev);
                }
                continue;
            }
            if ev as usize >= self.successors.len() {
                self.grow(ev);
            }
            self.add_edge(prev, ev);
            prev = ev;
        }
        self.prev = prev;
        self.events += events.len() as u64;
    }

    /// [`record`](Self::record) of `events`, where each `(start, end)` of `repeats` (in
    /// order, disjoint, `start > 0`) marks events `start..end` as repeats of `events[start -
    /// 1]`, counted at once: the path recorder's fast loop finds such runs (a loop whose body
    /// is one event) on its own pass over the events, and hands them over so that the tables
    /// need not step through them one by one.
    ///
    /// Never inlined (it runs once per piece of 4096 events), so that a profile shows it.
    #[inline(never)]
    pub(crate) fn record_with_repeats(&mut self, events: &[u32], repeats: &[(u32, u32)]) {
        let mut pos = 0;
        for &(start, end) in repeats {
            let (start, end) = (start as usize, end as usize);
            debug_assert!(pos < start && start < end && end <= events.len());
            self.record(&events[pos..start]);
            debug_assert!(events[start..end].iter().all(|&e| e == self.prev));
            self.add_edge_n(self.prev, self.prev, (end - start) as u64);
            self.events += (end - start) as u64;
            pos = end;
        }
        self.record(&events[pos..]);
    }

    /// Counts `n` (at least 1) traversals of `from → to` at once, noting the pair in `hot` if
    /// its count passes the threshold on the way.
    #[cold]
    #[inline(never)]
    fn add_edge_n(&mut self, from: u32, to: u32, n: u64) {
        // The first one as usual: it gives the edge a place if it has none yet.
        self.add_edge(from, to);
        let threshold = self.hot_threshold;
        let Some(c) = self.edge_count_mut(from, to) else {
            return;
        };
        let old = *c;
        *c += n - 1;
        if old < threshold && *c >= threshold {
            self.hot.push((from, to));
        }
    }

    /// The counter of edge `from → to`, wherever it lives (`None`: `from` is beyond the table).
    fn edge_count_mut(&mut self, from: u32, to: u32) -> Option<&mut u64> {
        let cached = self
            .successors
            .get(from as usize)?
            .id
            .iter()
            .position(|&id| id == to);
        if let Some(k) = cached {
            return Some(&mut self.successors[from as usize].count[k]);
        }
        let w = self.wide_of[from as usize];
        if w == NONE {
            return None;
        }
        let t = &mut self.wide[w as usize];
        let j = to as usize % WIDE_SLOTS;
        Some(if t.slots[j].0 == to {
            &mut t.slots[j].1
        } else {
            t.rest.entry(to).or_insert(0)
        })
    }

    /// Counts one traversal of the edge `from → to` (`from` may be [`NONE`]: no edge).
    #[inline(always)]
    fn add_edge(&mut self, from: u32, to: u32) {
        if !self.edge_cache().bump(from, to) {
            self.add_new_edge(from, to);
        }
    }

    fn edge_cache(&mut self) -> EdgeCache<'_> {
        EdgeCache {
            successors: &mut self.successors,
            wide_of: &self.wide_of,
            wide: &mut self.wide,
            hot: &mut self.hot,
            threshold: self.hot_threshold,
        }
    }

    /// The rare cases of [`add_edge`](Self::add_edge): a successor not in the cache yet.
    #[cold]
    #[inline(never)]
    fn add_new_edge(&mut self, from: u32, to: u32) {
        let Some(s) = self.successors.get_mut(from as usize) else {
            return;
        };
        let c = if s.id[0] == NONE {
            *s = Successors {
                id: [to, NONE],
                count: [1, 0],
            };
            self.sources.push(from);
            1
        } else if s.id[1] == NONE {
            s.id[1] = to;
            s.count[1] = 1;
            1
        } else {
            let mut w = self.wide_of[from as usize];
            if w == NONE {
                // The block's two cached successors move into its new wide table, and the
                // cache slots get a mark no id matches: every edge of the block is then found
                // in one place, so whether an event goes to the wide table depends on the
                // block alone, which the CPU predicts (when it depended on which successor
                // came, the branch mispredicted on most events of an interpreter).
                w = self.wide.len() as u32;
                let mut t = Wide {
                    slots: [(NONE, 0); WIDE_SLOTS],
                    rest: FxHashMap::default(),
                };
                for k in 0..2 {
                    let j = s.id[k] as usize % WIDE_SLOTS;
                    if t.slots[j].0 == NONE {
                        t.slots[j].0 = s.id[k];
                        t.slots[j].1 = s.count[k];
                    } else {
                        *t.rest.entry(s.id[k]).or_insert(0) += s.count[k];
                    }
                }
                *s = Successors {
                    id: [IN_WIDE; 2],
                    count: [0; 2],
                };
                self.wide.push(t);
                self.wide_of[from as usize] = w;
            }
            let t = &mut self.wide[w as usize];
            let k = to as usize % WIDE_SLOTS;
            if t.slots[k].0 == to || t.slots[k].0 == NONE {
                t.slots[k].0 = to;
                t.slots[k].1 += 1;
                t.slots[k].1
            } else {
                let c = t.rest.entry(to).or_insert(0);
                *c += 1;
                let c = *c;
                // Two successors share the slot: the one that has run more than twice as often
                // takes it, and the other moves to the hash map, with its count (an edge lives
                // in one place at a time). Measured on busybox gzip: a block's successor and
                // the superblock that replaced it shared a slot, and 2 % of all events took
                // this path, one hash-map update each. The factor of two keeps two equally
                // hot successors from trading the slot at every event.
                if c > 2 * t.slots[k].1 {
                    t.rest.remove(&to);
                    let displaced = t.rest.entry(t.slots[k].0).or_insert(0);
                    debug_assert_eq!(*displaced, 0, "an edge lives in one place");
                    *displaced += t.slots[k].1;
                    t.slots[k].0 = to;
                    t.slots[k].1 = c;
                }
                c
            }
        };
        if c == self.hot_threshold {
            self.hot.push((from, to));
        }
    }

    #[cold]
    fn grow(&mut self, id: u32) {
        let len = (id as usize + 1).next_power_of_two().max(1024);
        self.successors.resize(len, EMPTY);
        self.wide_of.resize(len, NONE);
    }

    #[cold]
    fn record_syscall(&mut self, nr: u32, site: u32) {
        let s = self.syscalls.entry(nr).or_default();
        s.count += 1;
        *s.sites.entry(site).or_insert(0) += 1;
    }

    /// The last block event of every stream counted here (this one's and merged ones').
    fn last_events(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::once(self.prev)
            .chain(self.tails.iter().copied())
            .filter(|&e| e != NONE)
    }

    /// Adds the counts of another thread's stream (`other`, over the same ids) to these: its
    /// edges, system calls and events, and its last event. Metadata is not copied.
    pub fn merge(&mut self, other: &Tables) {
        self.add_counts(&other.counts());
    }

    /// What these tables counted, apart from the ids' metadata: what a raw profile keeps.
    pub fn counts(&self) -> Counts {
        let mut syscalls: Vec<SyscallRow> = self
            .syscalls
            .iter()
            .map(|(&nr, s)| {
                let mut sites: Vec<(u32, u64)> = s.sites.iter().map(|(&b, &c)| (b, c)).collect();
                sites.sort_unstable();
                (nr, s.count, sites)
            })
            .collect();
        syscalls.sort_unstable_by_key(|s| s.0);
        Counts {
            edges: self.raw_edges(),
            syscalls,
            last: self.last_events().collect(),
            events: self.events,
        }
    }

    /// Adds `counts` (of a stream over the same ids) to these, as [`merge`](Self::merge)
    /// does: edges, system calls, events, and its streams' last events.
    pub fn add_counts(&mut self, counts: &Counts) {
        let threshold = std::mem::replace(&mut self.hot_threshold, u64::MAX);
        for &(from, to, c) in &counts.edges {
            let top = from.max(to);
            if top as usize >= self.successors.len() {
                self.grow(top);
            }
            self.add_edge_n(from, to, c);
        }
        self.hot_threshold = threshold;
        for (nr, count, sites) in &counts.syscalls {
            let mine = self.syscalls.entry(*nr).or_default();
            mine.count += count;
            for &(site, n) in sites {
                *mine.sites.entry(site).or_insert(0) += n;
            }
        }
        self.events += counts.events;
        self.tails
            .extend(counts.last.iter().copied().filter(|&e| e != NONE));
    }

    /// Takes in block metadata (ids in translation order; one already known is skipped): the
    /// next id of the catalog these tables view, appended to it first if these tables made
    /// it.
    ///
    /// # Panics
    /// If `b` is neither in the catalog nor appendable (tables viewing a process's catalog
    /// learn from it, [`Tables::learn_from`]): a bug in hotpath.
    pub fn learn(&mut self, b: &NewBlock) {
        let m = &mut self.meta;
        if b.id.index() < m.known {
            return;
        }
        debug_assert_eq!(
            b.id.index(),
            m.known,
            "block ids arrive in translation order"
        );
        if b.id.index() >= m.catalog.len() {
            let writer = m
                .writer
                .as_ref()
                .expect("tables over a shared catalog learn from it");
            writer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .append(b.clone());
        }
        m.known = b.id.index() + 1;
    }

    /// Takes in every id of `catalog` not known yet. Tables that know no id yet (or view
    /// `catalog` already) view it from now on, copying nothing; others copy the new entries.
    pub fn learn_from(&mut self, catalog: &Arc<BlockCatalog>) {
        let m = &mut self.meta;
        if Arc::ptr_eq(&m.catalog, catalog) {
            m.known = catalog.len();
        } else if m.known == 0 {
            *m = Meta {
                catalog: catalog.clone(),
                known: catalog.len(),
                writer: None,
            };
        } else {
            for b in catalog.iter_from(m.known) {
                self.learn(b);
            }
        }
    }

    /// Ids whose metadata these tables know (`0..known()`).
    pub fn known(&self) -> usize {
        self.meta.known
    }

    /// Metadata of id `id`, if known.
    fn entry(&self, id: u32) -> Option<&NewBlock> {
        if id as usize >= self.meta.known {
            return None;
        }
        self.meta.catalog.get(BlockId(id))
    }

    /// Shape and terminator of id `id`'s basic block (for a superblock or side-exit id: of
    /// its trace's first block, see [`Tables::kind`]), if known.
    pub fn summary(&self, id: u32) -> Option<&BlockSummary> {
        self.entry(id).map(|b| &b.summary)
    }

    /// The guest address id `id`'s run starts at (its basic block's, or its trace's first
    /// block's) and whether it is a superblock, if known: one catalog lookup.
    pub fn start_of(&self, id: u32) -> Option<(u64, bool)> {
        self.entry(id).map(|b| {
            (
                b.summary.start.0,
                matches!(b.kind, IdKind::Superblock { .. }),
            )
        })
    }

    /// What id `id` stands for (a basic block, a superblock, a superblock's side exit), if
    /// known.
    pub fn kind(&self, id: u32) -> Option<&IdKind> {
        self.entry(id).map(|b| &b.kind)
    }

    /// Every known id's metadata, in id order.
    pub fn entries(&self) -> impl Iterator<Item = &NewBlock> + '_ {
        self.meta.catalog.iter().take(self.meta.known)
    }

    /// Every known id's summary, in id order.
    pub fn summaries(&self) -> impl Iterator<Item = &BlockSummary> + '_ {
        self.entries().map(|b| &b.summary)
    }

    /// Every known id's kind, in id order.
    pub fn kinds(&self) -> impl Iterator<Item = &IdKind> + '_ {
        self.entries().map(|b| &b.kind)
    }

    /// Every observed pair of consecutive events `(from id, to id, count)`, superblock and
    /// side-exit ids included.
    pub fn raw_edges(&self) -> Vec<(u32, u32, u64)> {
        let mut out = Vec::new();
        let mut sources = self.sources.clone();
        sources.sort_unstable();
        for &from in &sources {
            let s = &self.successors[from as usize];
            for k in 0..2 {
                if s.id[k] < IN_WIDE {
                    out.push((from, s.id[k], s.count[k]));
                }
            }
        }
        for &from in &sources {
            let w = self.wide_of[from as usize];
            if w != NONE {
                let t = &self.wide[w as usize];
                for k in 0..WIDE_SLOTS {
                    if t.slots[k].0 != NONE {
                        out.push((from, t.slots[k].0, t.slots[k].1));
                    }
                }
                out.extend(t.rest.iter().map(|(&to, &c)| (from, to, c)));
            }
        }
        out
    }

    /// The basic blocks of superblock `id`'s trace, if `id` is a superblock.
    pub fn trace(&self, id: u32) -> Option<&[BlockId]> {
        match self.kind(id) {
            Some(IdKind::Superblock { blocks }) => Some(blocks),
            _ => None,
        }
    }

    /// The basic block an event `id` starts with (`None` for a side exit, which only ever
    /// follows its own superblock).
    fn first_block(&self, id: u32) -> Option<u32> {
        match self.kind(id) {
            Some(IdKind::Superblock { blocks }) => Some(blocks[0].0),
            Some(IdKind::SideExit { .. }) => None,
            _ => Some(id),
        }
    }

    /// The basic block an event `id` ends with: itself, a superblock's last block, or the
    /// block a side exit left from.
    pub fn last_block(&self, id: u32) -> u32 {
        match self.kind(id) {
            Some(IdKind::Superblock { blocks }) => blocks[blocks.len() - 1].0,
            Some(IdKind::SideExit { superblock, after }) => self
                .trace(superblock.0)
                .map(|t| t[*after as usize].0)
                .unwrap_or(id),
            _ => id,
        }
    }

    /// Every edge between basic blocks `(from id, to id, count)`: the event pairs with each
    /// superblock expanded into the blocks of its trace that ran.
    pub fn edges(&self) -> Vec<(u32, u32, u64)> {
        self.stream_edges_with(self)
    }

    /// [`Tables::edges`] with the ids' metadata read from `meta` (tables over the same ids
    /// that learned at least every id these counted).
    fn stream_edges_with(&self, meta: &Tables) -> Vec<(u32, u32, u64)> {
        let raw = self.raw_edges();
        // Sized for the stream's edges at once (growing it step by step, each step a fresh
        // table and its page faults, was most of its cost for 50,000 edges).
        let mut out: FxHashMap<(u32, u32), u64> =
            FxHashMap::with_capacity_and_hasher(raw.len(), Default::default());
        let mut add = |f: u32, t: u32, c: u64| *out.entry((f, t)).or_insert(0) += c;
        let mut inner = |trace: &[BlockId], upto: usize, c: u64| {
            for w in trace[..=upto].windows(2) {
                add(w[0].0, w[1].0, c);
            }
        };
        let mut outer: Vec<(u32, u32, u64)> = Vec::new();
        for (from, to, c) in raw {
            match meta.kind(from) {
                Some(IdKind::Superblock { blocks }) => {
                    let ended_after = match meta.kind(to) {
                        Some(IdKind::SideExit { superblock, after }) if superblock.0 == from => {
                            Some(*after as usize)
                        }
                        _ => None,
                    };
                    match ended_after {
                        Some(after) => inner(blocks, after, c),
                        None => {
                            inner(blocks, blocks.len() - 1, c);
                            if let Some(t) = meta.first_block(to) {
                                outer.push((blocks[blocks.len() - 1].0, t, c));
                            }
                        }
                    }
                }
                _ => {
                    if let Some(t) = meta.first_block(to) {
                        outer.push((meta.last_block(from), t, c));
                    }
                }
            }
        }
        // The last event of each stream: a superblock that was running when the guest ended
        // ran to its end (a fault inside it would have been followed by its side exit).
        for last in self.last_events() {
            if let Some(trace) = meta.trace(last) {
                inner(trace, trace.len() - 1, 1);
            }
        }
        for (f, t, c) in outer {
            *out.entry((f, t)).or_insert(0) += c;
        }
        out.into_iter().map(|((f, t), c)| (f, t, c)).collect()
    }

    /// Executions of each basic block id: the sum of its out-edges, plus one for the last
    /// block run (which has no out-edge yet). Superblock and side-exit ids count 0 (their
    /// blocks are counted).
    pub fn block_counts(&self) -> Vec<u64> {
        self.block_counts_with(self)
    }

    /// [`Tables::block_counts`] with the ids' metadata read from `meta` (tables over the same
    /// ids that learned at least every id these counted): a thread's counts need not learn
    /// every id of the process.
    pub fn block_counts_with(&self, meta: &Tables) -> Vec<u64> {
        self.counts_of(meta, &self.stream_edges_with(meta))
    }

    /// [`Tables::block_counts`] and [`Tables::edges`] at once: both come from the stream's
    /// edges, which a long run's report would otherwise expand from the superblock runs twice
    /// (a few milliseconds for 50,000 blocks).
    pub fn counts_and_edges(&self) -> (Vec<u64>, Vec<(u32, u32, u64)>) {
        let edges = self.stream_edges_with(self);
        let counts = self.counts_of(self, &edges);
        (counts, edges)
    }

    /// The basic blocks these tables counted and their executions, `(id, count)` in id order,
    /// with the ids' metadata read from `meta`: [`Tables::block_counts_with`] without a count
    /// for every id of the process, so that a thread that ran a few blocks of a big program
    /// costs what it ran.
    pub fn counted_blocks_with(&self, meta: &Tables) -> Vec<(u32, u64)> {
        let mut counts: FxHashMap<u32, u64> = FxHashMap::default();
        for (from, _, c) in self.stream_edges_with(meta) {
            *counts.entry(from).or_insert(0) += c;
        }
        for last in self.last_events() {
            let b = meta.last_block(last);
            if (b as usize) < meta.known() {
                *counts.entry(b).or_insert(0) += 1;
            }
        }
        let mut out: Vec<(u32, u64)> = counts
            .into_iter()
            .filter(|&(id, c)| c > 0 && (id as usize) < meta.known())
            .collect();
        out.sort_unstable();
        out
    }

    /// The block counts of [`Tables::block_counts_with`], from the stream's edges `stream`.
    fn counts_of(&self, meta: &Tables, stream: &[(u32, u32, u64)]) -> Vec<u64> {
        let mut counts = vec![0u64; meta.known().max(self.successors.len())];
        for &(from, _, c) in stream {
            counts[from as usize] += c;
        }
        for last in self.last_events() {
            if let Some(n) = counts.get_mut(meta.last_block(last) as usize) {
                *n += 1;
            }
        }
        counts.truncate(meta.known());
        counts
    }

    /// Each superblock's entries and how they ended: `(id, entries, side exits by position)`,
    /// where entries that ran the whole trace are `entries − Σ side exits`.
    pub fn superblock_runs(&self) -> Vec<(u32, u64, Vec<u64>)> {
        let mut runs: FxHashMap<u32, (u64, Vec<u64>)> = FxHashMap::default();
        for (id, k) in self.kinds().enumerate() {
            if let IdKind::Superblock { blocks } = k {
                runs.insert(id as u32, (0, vec![0; blocks.len()]));
            }
        }
        for (from, to, c) in self.raw_edges() {
            let Some(r) = runs.get_mut(&from) else {
                continue;
            };
            r.0 += c;
            if let Some(IdKind::SideExit { superblock, after }) = self.kind(to) {
                if superblock.0 == from {
                    r.1[*after as usize] += c;
                }
            }
        }
        for last in self.last_events() {
            if let Some(r) = runs.get_mut(&last) {
                r.0 += 1;
            }
        }
        let mut v: Vec<(u32, u64, Vec<u64>)> =
            runs.into_iter().map(|(id, (n, e))| (id, n, e)).collect();
        v.sort_by_key(|r| r.0);
        v
    }

    /// The events that followed event `id`, with counts.
    pub fn successors_of(&self, id: u32) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        if let Some(s) = self.successors.get(id as usize) {
            for k in 0..2 {
                if s.id[k] < IN_WIDE {
                    out.push((s.id[k], s.count[k]));
                }
            }
            if let Some(t) = self
                .wide_of
                .get(id as usize)
                .filter(|&&w| w != NONE)
                .map(|&w| &self.wide[w as usize])
            {
                for k in 0..WIDE_SLOTS {
                    if t.slots[k].0 != NONE {
                        out.push((t.slots[k].0, t.slots[k].1));
                    }
                }
                out.extend(t.rest.iter().map(|(&to, &c)| (to, c)));
            }
        }
        out
    }
}

/// Turns a stream of events (superblock and side-exit ids included) into the stream of basic
/// block ids and system call events it stands for. A superblock's event is held until the
/// next event says how far its trace ran.
#[derive(Clone, Default)]
pub struct Expander {
    /// A superblock whose end is not known yet.
    pending: Option<u32>,
}

impl Expander {
    /// Appends to `out` what `events` stand for (every id must be known to `tables`).
    pub fn expand(&mut self, tables: &Tables, events: &[u32], out: &mut Vec<u32>) {
        for &ev in events {
            if let Some(sb) = self.pending.take() {
                let trace = tables.trace(sb).expect("pending ids are superblocks");
                let upto = match tables.kind(ev) {
                    Some(IdKind::SideExit { superblock, after }) if superblock.0 == sb => {
                        Some(*after as usize)
                    }
                    _ => None,
                };
                match upto {
                    Some(after) => {
                        out.extend(trace[..=after].iter().map(|b| b.0));
                        continue;
                    }
                    None => out.extend(trace.iter().map(|b| b.0)),
                }
            }
            if is_id(ev) && tables.trace(ev).is_some() {
                self.pending = Some(ev);
            } else {
                out.push(ev);
            }
        }
    }

    /// At the end of the stream: the superblock still pending ran to its end.
    pub fn finish(&mut self, tables: &Tables, out: &mut Vec<u32>) {
        if let Some(sb) = self.pending.take() {
            if let Some(trace) = tables.trace(sb) {
                out.extend(trace.iter().map(|b| b.0));
            }
        }
    }
}

/// Learns a basic block for a unit test: id `id` at guest `start`, 4 bytes, `instructions`
/// instructions, ending with `terminator`.
#[cfg(test)]
pub(crate) fn learn_test_block(
    t: &mut Tables,
    id: u32,
    start: u64,
    instructions: u32,
    terminator: hotpath_ir::Terminator,
) {
    t.learn(&NewBlock {
        id: BlockId(id),
        summary: BlockSummary {
            start: hotpath_ir::GuestAddr(start),
            terminator_addr: hotpath_ir::GuestAddr(start),
            len_bytes: 4,
            instructions,
            terminator,
        },
        kind: IdKind::Block,
        code: Box::default(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use hotpath_ir::{BlockId, GuestAddr, Terminator};

    fn learn(t: &mut Tables, n: u32) {
        for i in 0..n {
            let start = GuestAddr(0x1000 + 0x10 * i as u64);
            t.learn(&NewBlock {
                id: BlockId(i),
                summary: BlockSummary {
                    start,
                    terminator_addr: start,
                    len_bytes: 16,
                    instructions: 2,
                    terminator: Terminator::IndirectJump,
                },
                kind: IdKind::Block,
                code: Box::default(),
            });
        }
    }

    /// Records `stream` in pieces of 7 events and checks every edge count, every block count
    /// and the hot pairs against a brute-force count of consecutive pairs.
    fn check_against_brute_force(ids: u32, stream: &[u32], threshold: u64) {
        let mut t = Tables::default();
        learn(&mut t, ids);
        t.hot_threshold = threshold;
        check_tables_against_brute_force(t, ids, stream);
    }

    /// [`check_against_brute_force`] on tables `t` (knowing `ids` ids, nothing counted).
    fn check_tables_against_brute_force(mut t: Tables, ids: u32, stream: &[u32]) {
        let threshold = t.hot_threshold;
        let mut hot = Vec::new();
        for chunk in stream.chunks(7) {
            t.record(chunk);
            hot.append(&mut t.hot);
        }
        let mut pairs: HashMap<(u32, u32), u64> = HashMap::new();
        for w in stream.windows(2) {
            *pairs.entry((w[0], w[1])).or_insert(0) += 1;
        }
        let got: HashMap<(u32, u32), u64> = t
            .edges()
            .into_iter()
            .map(|(f, to, c)| ((f, to), c))
            .collect();
        assert_eq!(got, pairs);
        for from in 0..ids {
            let mut listed = t.successors_of(from);
            listed.sort_unstable();
            let mut want: Vec<(u32, u64)> = pairs
                .iter()
                .filter(|&(&(f, _), _)| f == from)
                .map(|(&(_, to), &c)| (to, c))
                .collect();
            want.sort_unstable();
            assert_eq!(listed, want, "the successors of {from}, and only its");
        }
        let mut counts = vec![0u64; ids as usize];
        for &b in stream {
            counts[b as usize] += 1;
        }
        assert_eq!(t.block_counts(), counts);
        let mut want_hot: Vec<(u32, u32)> = pairs
            .iter()
            .filter(|&(_, &c)| c >= threshold)
            .map(|(&p, _)| p)
            .collect();
        want_hot.sort_unstable();
        hot.sort_unstable();
        assert_eq!(
            hot, want_hot,
            "each pair is noted hot once, when it reaches the threshold"
        );
    }

    /// A deterministic pseudo-random sequence (an LCG's high bits).
    fn lcg(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 33
        }
    }

    #[test]
    fn edge_and_block_counts_match_brute_force() {
        let mut next = lcg(12345);
        let stream: Vec<u32> = (0..10_000).map(|_| (next() % 5) as u32).collect();
        check_against_brute_force(5, &stream, 100);
    }

    /// Blocks 0 and 3 are indirect branches whose successors 1, 65, 129 and 193 share one
    /// slot of their wide tables, and which of them is hottest changes from phase to phase,
    /// so they trade the slot and the rest of the successors back and forth.
    #[test]
    fn successors_that_share_a_wide_slot_keep_exact_counts() {
        let mut next = lcg(7);
        let sharing = [1, 65, 129, 193];
        let mut stream = Vec::new();
        for phase in 0..8 {
            for _ in 0..5_000 {
                stream.push(if next() % 3 == 0 { 3 } else { 0 });
                let r = next() % 100;
                let to = if r < 70 {
                    sharing[phase % 4]
                } else if r < 90 {
                    sharing[(phase + 1) % 4]
                } else {
                    2 + (r as u32 % 3) * 64
                };
                stream.push(to);
            }
        }
        check_against_brute_force(200, &stream, 1_000);
    }

    /// Tables that take the storage of tables that counted another stream (with wide tables,
    /// system calls and hot pairs, over more ids) count as fresh ones do.
    #[test]
    fn recycled_tables_count_as_fresh_ones() {
        let mut next = lcg(99);
        let mut old = Tables::default();
        learn(&mut old, 300);
        old.hot_threshold = 10;
        let first: Vec<u32> = (0..20_000)
            .map(|i| match i % 3 {
                0 => 7,
                1 => (next() % 300) as u32,
                _ => SYSCALL_EVENT | (next() % 5) as u32,
            })
            .collect();
        old.record(&first);
        assert!(!old.wide.is_empty() && !old.syscalls.is_empty());
        let mut fresh = Tables::default();
        learn(&mut fresh, 5);
        fresh.hot_threshold = 100;
        old.recycle(&fresh);
        assert_eq!(old.known(), 5);
        assert!(old.syscalls.is_empty() && old.hot.is_empty() && old.events == 0);
        let stream: Vec<u32> = (0..10_000).map(|_| (next() % 5) as u32).collect();
        check_tables_against_brute_force(old, 5, &stream);
    }

    #[test]
    fn syscalls_are_attributed_to_the_previous_block() {
        let mut t = Tables::default();
        learn(&mut t, 3);
        t.record(&[0, 1, SYSCALL_EVENT | 39, 2, 1, SYSCALL_EVENT | 39]);
        let s = &t.syscalls[&39];
        assert_eq!(s.count, 2);
        assert_eq!(s.sites[&1], 2);
        assert_eq!(t.block_counts(), vec![1, 2, 1]);
    }
}

#[cfg(test)]
mod superblock_tests {
    use super::*;
    use hotpath_ir::{BlockId, GuestAddr, Terminator};
    use std::sync::Arc;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    /// Basic blocks `0..n`, then superblocks over `traces` (each followed by one side-exit id
    /// per position), as the translator announces them.
    fn tables_with(n: u32, traces: &[Vec<u32>]) -> (Tables, Vec<u32>) {
        let mut t = Tables::default();
        let summary = |i: u32| {
            let start = GuestAddr(0x1000 + 0x10 * i as u64);
            BlockSummary {
                start,
                terminator_addr: start,
                len_bytes: 16,
                instructions: 1 + i % 3,
                terminator: Terminator::IndirectJump,
            }
        };
        for i in 0..n {
            t.learn(&NewBlock {
                id: BlockId(i),
                summary: summary(i),
                kind: IdKind::Block,
                code: Box::default(),
            });
        }
        let mut sb_ids = Vec::new();
        let mut id = n;
        for trace in traces {
            let blocks: Arc<[BlockId]> = trace.iter().map(|&b| BlockId(b)).collect();
            t.learn(&NewBlock {
                id: BlockId(id),
                summary: summary(trace[0]),
                kind: IdKind::Superblock { blocks },
                code: Box::default(),
            });
            sb_ids.push(id);
            for (pos, &b) in trace.iter().enumerate() {
                t.learn(&NewBlock {
                    id: BlockId(id + 1 + pos as u32),
                    summary: summary(b),
                    kind: IdKind::SideExit {
                        superblock: BlockId(id),
                        after: pos as u32,
                    },
                    code: Box::default(),
                });
            }
            id += 1 + trace.len() as u32;
        }
        (t, sb_ids)
    }

    /// Encodes a walk over basic blocks the way translated code reports it: at a block that
    /// heads a superblock, one superblock event; while the walk follows the trace, nothing;
    /// where it leaves early (or ends: a guest dies inside a trace only by a signal, whose
    /// delivery enqueues the side exit), the side-exit event of the last block it ran; a
    /// syscall event may follow any block.
    fn encode(walk: &[u32], traces: &[Vec<u32>], sb_ids: &[u32]) -> Vec<u32> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < walk.len() {
            let b = walk[i];
            if b == SYSCALL_EVENT | 1 {
                out.push(b);
                i += 1;
                continue;
            }
            if let Some(k) = traces.iter().position(|t| t[0] == b) {
                let trace = &traces[k];
                let mut pos = 0;
                while pos + 1 < trace.len()
                    && i + pos + 1 < walk.len()
                    && walk[i + pos + 1] == trace[pos + 1]
                {
                    pos += 1;
                }
                out.push(sb_ids[k]);
                let ran_to_end = pos + 1 == trace.len();
                if !ran_to_end {
                    out.push(sb_ids[k] + 1 + pos as u32);
                }
                i += pos + 1;
            } else {
                out.push(b);
                i += 1;
            }
        }
        out
    }

    #[test]
    fn superblock_events_expand_to_the_blocks_they_stand_for() {
        let n = 6u32;
        // A loop unrolled twice, a straight trace, and a one-block loop unrolled.
        let traces = vec![vec![0, 1, 2, 0, 1, 2], vec![3, 4], vec![5, 5, 5, 5]];
        for seed in 1..40u64 {
            let (mut t, sb_ids) = tables_with(n, &traces);
            let mut rng = Rng(seed);
            // A walk that mostly follows the traces' paths and sometimes jumps anywhere.
            let mut walk = Vec::new();
            let mut b = rng.next(n as u64) as u32;
            for _ in 0..3000 {
                walk.push(b);
                if rng.next(50) == 0 {
                    walk.push(SYSCALL_EVENT | 1);
                }
                b = match (b, rng.next(10)) {
                    (_, 0) => rng.next(n as u64) as u32,
                    (0, _) => 1,
                    (1, _) => 2,
                    (2, r) => {
                        if r < 7 {
                            0
                        } else {
                            3
                        }
                    }
                    (3, _) => 4,
                    (4, r) => {
                        if r < 5 {
                            5
                        } else {
                            0
                        }
                    }
                    (_, r) => {
                        if r < 8 {
                            5
                        } else {
                            0
                        }
                    }
                };
            }
            let events = encode(&walk, &traces, &sb_ids);
            assert!(events.len() < walk.len(), "superblocks shorten the stream");
            let mut cut = 0;
            while cut < events.len() {
                let len = 1 + rng.next(300) as usize;
                let end = (cut + len).min(events.len());
                t.record(&events[cut..end]);
                cut = end;
            }
            let blocks_only: Vec<u32> = walk
                .iter()
                .copied()
                .filter(|&e| e & SYSCALL_EVENT == 0)
                .collect();
            let mut want_edges: HashMap<(u32, u32), u64> = HashMap::new();
            for w in blocks_only.windows(2) {
                *want_edges.entry((w[0], w[1])).or_insert(0) += 1;
            }
            let got_edges: HashMap<(u32, u32), u64> = t
                .edges()
                .into_iter()
                .map(|(f, to, c)| ((f, to), c))
                .collect();
            assert_eq!(got_edges, want_edges, "seed {seed}");
            let mut want_counts = vec![0u64; t.known()];
            for &b in &blocks_only {
                want_counts[b as usize] += 1;
            }
            assert_eq!(t.block_counts(), want_counts, "seed {seed}");
            let (counts, edges) = t.counts_and_edges();
            let edges: HashMap<(u32, u32), u64> =
                edges.into_iter().map(|(f, to, c)| ((f, to), c)).collect();
            assert_eq!((counts, edges), (want_counts, want_edges), "seed {seed}");
            let syscalls: u64 = t.syscalls.values().map(|s| s.count).sum();
            let sites: u64 = t.syscalls[&1]
                .sites
                .iter()
                .filter(|(&id, _)| (t.last_block(id) as usize) < n as usize)
                .map(|(_, &c)| c)
                .sum();
            assert_eq!(syscalls, sites, "every syscall site maps to a basic block");

            let mut expander = Expander::default();
            let mut expanded = Vec::new();
            for chunk in events.chunks(7) {
                expander.expand(&t, chunk, &mut expanded);
            }
            expander.finish(&t, &mut expanded);
            assert_eq!(
                expanded, walk,
                "seed {seed}: the expander restores the walk"
            );
        }
    }

    #[test]
    fn hot_pairs_are_noted_once_when_they_cross_the_threshold() {
        let (mut t, _) = tables_with(3, &[]);
        t.hot_threshold = 100;
        let stream: Vec<u32> = (0..1000).map(|i| [0, 1, 1, 2][i % 4]).collect();
        for c in stream.chunks(33) {
            t.record(c);
        }
        t.hot.sort();
        // 0→1, 1→1 (a run counted in a register), 1→2 and 2→0 all pass 100.
        assert_eq!(t.hot, vec![(0, 1), (1, 1), (1, 2), (2, 0)]);
    }
}
