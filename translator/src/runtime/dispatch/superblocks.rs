//! The monitor's commands: superblocks formed along the hot paths it asks for.

use super::*;

impl Translator {
    /// The catalog of every id the process's translators handed out (what the monitor reads
    /// to resolve the ids in the rings; a forked child's new monitor reads the same one).
    pub fn catalog(&self) -> Arc<BlockCatalog> {
        lock(&self.process.shared.registry).catalog().clone()
    }

    /// Takes the monitor's requests from `rx` (a forked child's new monitor replaces them).
    pub fn set_command_receiver(&mut self, rx: Receiver<Command>) {
        if let Some(old) = self.commands.replace(rx) {
            // In a forked child the old channel's sender lived in the parent's monitor thread,
            // which does not exist here and may have held the channel's lock at the fork:
            // dropping the receiver could wait on it forever.
            std::mem::forget(old);
        }
    }

    /// Acts on the monitor's pending requests.
    pub(super) fn poll_commands(&mut self) {
        let Some(rx) = &self.commands else { return };
        let requests: Vec<Command> = rx.try_iter().collect();
        for c in requests {
            match c {
                Command::FormSuperblock { blocks } => {
                    if !self.cfg.superblocks || !self.form_superblock(&blocks, false) {
                        self.stats.superblocks_dropped += 1;
                    }
                }
                Command::ReformSuperblock { blocks } => {
                    if !self.cfg.superblocks || !self.form_superblock(&blocks, true) {
                        self.stats.superblocks_dropped += 1;
                    }
                }
            }
        }
    }

    /// Builds the superblock over basic block ids `ids` and makes it the entry of the first
    /// one's guest address (`replace`: in place of the superblock it has). Returns false
    /// (nothing changed) when the request is stale: an id from before a flush, a head that
    /// has a superblock already (none, with `replace`), or guest code that no longer decodes
    /// to the same blocks.
    pub(super) fn form_superblock(&mut self, ids: &[BlockId], replace: bool) -> bool {
        if ids.is_empty() || ids.len() > MAX_TRACE_BLOCKS {
            return false;
        }
        let mut blocks = Vec::with_capacity(ids.len());
        let shared = self.process.shared.clone();
        let mut registry = lock(&shared.registry);
        let catalog = registry.catalog().clone();
        for &id in ids {
            let Some(known) = catalog.get(id) else {
                return false;
            };
            if id.0 < self.index.generation_first_id || known.kind != IdKind::Block {
                return false;
            }
            if self.code_writable(known.summary.start.0) {
                // A trace runs on from block to block without the exits a store into its
                // code sends the thread out through: code the guest may write stays in
                // blocks (`decode_block_split`).
                return false;
            }
            let block = self.decode(known.summary.start, MAX_BLOCK_INSTRUCTIONS);
            if block.summary() != known.summary {
                return false;
            }
            blocks.push(block);
        }
        let head = blocks[0].start.0;
        let Some(&old_entry) = self.index.blocks.get(&head) else {
            return false;
        };
        match self.index.superblock_heads.get(&head) {
            None if !replace => {}
            // Re-formed into the same trace: nothing to change.
            Some(old) if replace && old[..] != ids[..] => {}
            _ => return false,
        }
        let sb = BlockId(registry.next_id);
        let first_exit = self.index.exits.len() as u32;
        let gateway = self.select_region(head);
        let cx = EmitContext {
            enqueue: Some(self.cfg.ring_entries),
            gateway,
            jump_table: None,
            cold: Some(self.cache.next_cold_addr()),
        };
        // An indirect branch through a constant slot goes on as a direct one, as the block's
        // own translation does: inside the trace with nothing to check (its target is the
        // next block's), at its end chained (the monitor still learns the blocks as decoded).
        let folded: Vec<(usize, GuestAddr, GuestAddr)> = (0..blocks.len())
            .filter_map(|i| {
                let (slot, target) = self.constant_target(&blocks[i])?;
                Some((i, slot, target))
            })
            .collect();
        let direct = (!folded.is_empty()).then(|| {
            let mut direct = blocks.clone();
            for &(i, _, target) in &folded {
                direct[i] = crate::frontend::decode::with_direct_target(&blocks[i], target);
            }
            direct
        });
        let to_emit = direct.as_deref().unwrap_or(&blocks);
        // A trace that ends in a `switch`'s dispatch gets a jump table of its own.
        let last = &to_emit[to_emit.len() - 1];
        let site = crate::backend::jump_table::pattern(last).zip(self.free_jump_table_site());
        let cx = EmitContext {
            jump_table: site.map(|(_, number)| number),
            ..cx
        };
        let trace = match emit_superblock(to_emit, sb, self.cache.next_addr(), first_exit, &cx) {
            Ok(t) => t,
            Err(e) => {
                if self.trace_translation {
                    eprintln!("hotpath: {e}");
                }
                return false;
            }
        };
        if trace.code.len() as u64 > self.cache.room()
            || trace.cold.len() as u64 > self.cache.cold_room()
            || first_exit as u64 + trace.exits.len() as u64 > EXIT_SPECIAL_BASE as u64
        {
            // The next translation flushes the cache; the monitor asks again if it stays hot.
            return false;
        }
        let at = self.cache.next_addr();
        if self.trace_translation {
            eprintln!(
                "hotpath: superblock {} at guest {head:#x} ({} blocks) → {}:\n{}",
                sb.0,
                blocks.len(),
                trace.entry,
                disassemble_parts(&trace.code, at.0, &trace.cold, trace.cold_at.0)
            );
        }
        self.cache.insert(&trace.code);
        if !trace.cold.is_empty() {
            debug_assert_eq!(self.cache.next_cold_addr(), trace.cold_at);
            self.cache.insert_cold(&trace.cold);
        }
        for &(_, slot, _) in &folded {
            self.depend_on_slot(slot);
        }
        if let (Some((pattern, number)), Some(code), Some(jmp)) =
            (site, trace.jump_table, last.term_inst.as_ref())
        {
            let s = crate::backend::jump_table::Site::of(
                &pattern,
                sb,
                last.start,
                GuestAddr(jmp.inst.ip()),
                &code,
            );
            self.open_jump_table(number, s, code.fill);
        }
        self.index.exits.extend(trace.exits);
        for l in &trace.layouts {
            self.note_code(l, CodeKind::Superblock);
        }
        for l in trace.layouts {
            self.cache.add_layout(l);
        }
        let trace_ids: std::sync::Arc<[BlockId]> = ids.into();
        registry.announce(NewBlock {
            id: sb,
            summary: blocks[0].summary(),
            kind: IdKind::Superblock {
                blocks: trace_ids.clone(),
            },
            code: Box::default(),
        });
        for (i, b) in blocks.iter().enumerate() {
            registry.announce(NewBlock {
                id: side_exit_id(sb, i),
                summary: b.summary(),
                kind: IdKind::SideExit {
                    superblock: sb,
                    after: i as u32,
                },
                code: Box::default(),
            });
        }
        registry.next_id += 1 + blocks.len() as u32;
        drop(registry);
        // Every way into the head now leads to the superblock: new links and lookups through
        // the map, existing links through a jump over the old block's enqueue stub, the lookup
        // table by its entry.
        self.index.blocks.insert(head, trace.entry);
        self.index.superblock_heads.insert(head, trace_ids);
        self.index
            .superblock_members
            .extend(blocks.iter().map(|b| b.start.0));
        self.cache.patch_jump(old_entry, trace.entry);
        self.area.retarget_ibl(head, trace.entry.0);
        self.stats.superblocks += 1;
        true
    }
}
