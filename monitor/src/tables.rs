//! The monitor's exact tables, indexed by block id.

use crossbeam::channel::Receiver;
use hotpath_events::NewBlock;
use hotpath_ir::BlockSummary;

/// Block metadata and execution counts, indexed by block id (dense `u32`).
#[derive(Default)]
pub struct Tables {
    /// Summary of block `id` at index `id`.
    pub blocks: Vec<BlockSummary>,
    /// Executions of block `id` at index `id` (u64: cannot overflow in practice).
    pub counts: Vec<u64>,
    /// Events processed (valid after [`finish`](Self::finish)).
    pub blocks_executed: u64,
    /// Guest instructions executed: Σ count × instructions (valid after `finish`).
    pub guest_instructions: u64,
}

/// The profile the monitor hands back when the guest has ended.
pub type Profile = Tables;

impl Tables {
    /// Accounts one execution of block `id`, first reading block metadata from `new_blocks`
    /// until `id` is known (the translator sends it before the block first runs).
    pub fn record(&mut self, id: u32, new_blocks: &Receiver<NewBlock>) {
        let i = id as usize;
        while i >= self.blocks.len() {
            match new_blocks.recv() {
                Ok(b) => self.learn(b),
                // The translator is gone without telling us about this id: a bug in hotpath;
                // count nothing rather than invent a block.
                Err(_) => return,
            }
        }
        self.counts[i] += 1;
    }

    /// Derives the totals from the per-block counts (called once the ring is drained: keeping
    /// them per event would cost the hot loop two more loads).
    pub fn finish(&mut self) {
        self.blocks_executed = self.counts.iter().sum();
        self.guest_instructions =
            self.counts.iter().zip(&self.blocks).map(|(&c, b)| c * b.instructions as u64).sum();
    }

    /// Takes in one block's metadata (ids arrive in order).
    pub fn learn(&mut self, b: NewBlock) {
        debug_assert_eq!(b.id.index(), self.blocks.len(), "block ids arrive in translation order");
        self.blocks.push(b.summary);
        self.counts.push(0);
    }
}
