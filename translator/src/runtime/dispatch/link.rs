//! Links noted as translations chain, and what the cache drops: invalidated ranges and flushes.

use super::*;
use crate::cache::links::exits_into;

impl Translator {
    /// Discards translations overlapping ranges the guest unmapped, remapped, reprotected or
    /// wrote to (code that writes code).
    pub(super) fn apply_invalidations(&mut self) {
        let ranges = std::mem::take(&mut self.process.invalidate);
        if ranges.is_empty() {
            return;
        }
        self.process
            .shared
            .publish_invalidations(&ranges, self.ctl.tid);
        // This thread's own ranges are in the log too: skip them there.
        self.take_invalidations();
    }

    /// Discards this thread's translations of `ranges`. The write-protected pages there stay
    /// as they are: whoever changed a page's protection forgot it then (the thread whose
    /// system call changed it, `syscalls::mapping_changed`; whoever took a caught write,
    /// `ProtectedPages::take_hits`), and a page protected since holds new translations.
    ///
    /// Where every translation there is a basic block of its own (no superblock holds a copy
    /// of one, no translation took a constant from there), just those blocks go
    /// ([`Self::discard_blocks`]): what a JIT writing code into pages it runs from needs, a
    /// page at a time. Anything else flushes the whole cache.
    pub(super) fn discard(&mut self, ranges: &[(u64, u64)]) {
        for &(s, e) in ranges {
            self.process.maps.invalidate_range(s, e);
        }
        let mut blocks = Vec::new();
        let mut whole = false;
        for &(s, e) in ranges {
            // Blocks are at most a few hundred bytes: look a page back for ones that start before.
            let spans = self.index.spans.view();
            for &(bs, be) in spans.range(|&(bs, _)| bs, s.saturating_sub(4096), e) {
                if !(bs < e && be > s) {
                    continue;
                }
                let index = &self.index;
                if index.superblock_heads.contains_key(&bs)
                    || index.superblock_members.contains(&bs)
                {
                    // A superblock holds a copy of it (maybe of a block itself discarded
                    // already: a superblock decodes its blocks afresh).
                    whole = true;
                } else if index.blocks.contains_key(&bs) || index.step_blocks.contains_key(&bs) {
                    blocks.push(bs);
                } else if !index.discarded.contains(&bs) {
                    // A constant a translation depends on.
                    whole = true;
                }
            }
        }
        if whole {
            self.flush();
        } else if !blocks.is_empty() {
            blocks.sort_unstable();
            blocks.dedup();
            self.discard_blocks(&blocks);
        }
    }

    /// Discards the basic blocks that start at the guest addresses `starts` (none of them a
    /// superblock's head or part of one): the links into them go back to their exit stubs,
    /// their lookup entries go, and every jump table goes back to its fill stubs (a table may
    /// hold one of them). Their code stays in the cache, unreachable, until the next flush.
    fn discard_blocks(&mut self, starts: &[u64]) {
        let linked: Vec<u32> = exits_into(self.index.linked.view(), starts).collect();
        for e in linked {
            if let Some((site, stub)) = self.index.exits[e as usize].kind.link_site() {
                self.cache.patch_rel32(site, stub);
            }
        }
        for &start in starts {
            self.area.forget_ibl(start);
            self.index.blocks.remove(&start);
            self.index.step_blocks.remove(&start);
            self.index.discarded.insert(start);
        }
        self.area.unlink_jump_tables();
        self.stats.blocks_discarded += starts.len() as u64;
    }

    /// Notes that direct exit `exit` was linked to its target, guest `target`
    /// ([`CacheIndex::linked`]).
    pub(super) fn note_link(&mut self, target: u64, exit: u32) {
        self.index.linked.push((target, exit));
    }

    /// Links the direct exits from index `first` on (a block just installed) whose targets
    /// are translated already, as the dispatcher links an exit when the guest first takes it:
    /// each saves the trip out of the code cache that would make the link (a warm `python3 -c
    /// pass` took 12,700 of its 40,000 links that way). Exits to code not translated yet are
    /// linked when taken, so nothing is translated for an exit the guest never takes.
    pub(super) fn link_to_known(&mut self, first: usize) {
        if self.stepping {
            return;
        }
        for index in first..self.index.exits.len() {
            let ExitKind::Direct { target, site, .. } = self.index.exits[index].kind else {
                continue;
            };
            let Some(&host) = self.index.blocks.get(&target.0) else {
                continue;
            };
            self.cache.patch_rel32(site, host);
            self.note_link(target.0, index as u32);
            self.stats.links += 1;
        }
    }

    /// Empties the code cache: every block will be translated again (with new ids).
    pub(super) fn flush(&mut self) {
        self.cache.flush();
        self.index.blocks.clear();
        self.index.spans.clear();
        self.index.exits.clear();
        self.index.linked.clear();
        self.area.clear_ibl(self.gateway.ibl_empty.0);
        self.index.generation += 1;
        self.index.generation_first_id = lock(&self.process.shared.registry).next_id;
        self.index.superblock_heads.clear();
        self.index.superblock_members.clear();
        self.index.discarded.clear();
        self.index.step_blocks.clear();
        self.jump_tables.clear();
        self.area.jump_tables_open = 0;
        self.stats.flushes += 1;
    }
}
