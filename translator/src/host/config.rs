//! The translator's settings and the counters of its work: shared by the dispatcher and the
//! process state (which keeps the counters of threads that ended). A leaf.

/// Translator settings.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Emit the enqueue stub at every block head (the monitor is on).
    pub enqueue: bool,
    /// Event ring capacity in entries (a power of two).
    pub ring_entries: u64,
    /// Build the superblocks the monitor asks for (`--no-superblocks` turns it off).
    pub superblocks: bool,
    /// The guest was given the vDSO ([`crate::guest_vdso`]; `--no-vdso` turns it off).
    pub vdso: bool,
    /// Record where translated code goes, for host profilers ([`Translator::code_records`]).
    pub perf_map: bool,
}

/// Counters of the translator's own work.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Blocks translated (re-translations after a flush included), decoded and emitted
    /// afresh or placed from the persisted store.
    pub blocks_translated: u64,
    /// Of those, blocks placed from the persisted store (`persist`) instead.
    pub blocks_loaded: u64,
    /// Blocks decoded and emitted afresh in a module the store could hold them for, and kept
    /// for it (its misses; a translation the store cannot hold, such as a jump-table site's,
    /// is none).
    pub blocks_missed: u64,
    /// Direct branches chained.
    pub links: u64,
    /// Indirect branches that missed the lookup table.
    pub ibl_misses: u64,
    /// Jump-table sites made (`jump_table`).
    pub jump_table_sites: u64,
    /// `switch` indices given an entry in a jump-table site's table.
    pub jump_table_entries: u64,
    /// Of those, entries that are the case's block itself (the others are stubs that run the
    /// guest's load and `add` first).
    pub jump_table_entries_direct: u64,
    /// Indices sent through the lookup instead, their guest table entry not constant.
    pub jump_table_entries_refused: u64,
    /// Guest system calls.
    pub syscalls: u64,
    /// Code cache flushes.
    pub flushes: u64,
    /// Blocks discarded one by one (their page written or remapped) instead of a flush.
    pub blocks_discarded: u64,
    /// Times a code cache moved out of the guest's way (see `Translator::move_cache`).
    pub cache_moves: u64,
    /// Exits at the end of a ring lap (to wait for the monitor and start the next lap).
    pub ring_refills: u64,
    /// Superblocks built (re-built ones after a flush included).
    pub superblocks: u64,
    /// Superblock requests dropped: stale after a flush, or the guest code changed.
    pub superblocks_dropped: u64,
    /// Wall time spent translating basic blocks (decode, emit, install), in time-stamp
    /// counter ticks ([`translation_ns`](Self::translation_ns) in nanoseconds).
    pub translation_ticks: u64,
}

impl Stats {
    /// Wall time spent translating basic blocks, in nanoseconds.
    pub fn translation_ns(&self) -> u64 {
        crate::host::cpu::tsc_ns(self.translation_ticks)
    }

    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &Stats) {
        self.blocks_translated += o.blocks_translated;
        self.blocks_loaded += o.blocks_loaded;
        self.blocks_missed += o.blocks_missed;
        self.links += o.links;
        self.ibl_misses += o.ibl_misses;
        self.jump_table_sites += o.jump_table_sites;
        self.jump_table_entries += o.jump_table_entries;
        self.jump_table_entries_refused += o.jump_table_entries_refused;
        self.jump_table_entries_direct += o.jump_table_entries_direct;
        self.syscalls += o.syscalls;
        self.flushes += o.flushes;
        self.blocks_discarded += o.blocks_discarded;
        self.cache_moves += o.cache_moves;
        self.ring_refills += o.ring_refills;
        self.superblocks += o.superblocks;
        self.superblocks_dropped += o.superblocks_dropped;
        self.translation_ticks += o.translation_ticks;
    }
}
