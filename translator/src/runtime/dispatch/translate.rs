//! Lookup or translate: a guest address's translation found, placed from the persisted store,
//! or decoded, emitted and installed.

use super::*;

impl Translator {
    /// The host entry of the block at guest address `pc`, translating it if needed.
    pub(super) fn lookup_or_translate(&mut self, pc: u64) -> Result<HostAddr, TranslateError> {
        if let Some(&h) = self.index.blocks.get(&pc) {
            return Ok(h);
        }
        let started = crate::host::cpu::tsc();
        let entry = self.translate(pc);
        self.stats.translation_ticks += crate::host::cpu::tsc().wrapping_sub(started);
        entry
    }

    /// Decodes the guest block at `start` (at most `max` instructions), from executable pages
    /// only: the CPU fetches nothing else, so the block ends where they end, with a fetch
    /// fault if an instruction is cut there (the mappings' protections come from the thread's
    /// `MapsCache`: no system call per block). Its bytes are read with a plain copy where the
    /// mappings say they are readable, else through `process_vm_readv`, which stops cleanly at
    /// an unreadable page, and `/proc/self/mem` for execute-only pages
    /// ([`guest_mem::read_code`]).
    pub(super) fn decode(&mut self, start: GuestAddr, max: usize) -> hotpath_ir::Block {
        let split = self.code_writable(start.0);
        decode_block_split(start, max, split, |addr, buf| self.fetch_code(addr, buf))
    }

    /// Fills `buf` with the guest's code from `addr` up to the first byte the guest could not
    /// fetch (see [`Self::decode`]); returns how many bytes it read.
    pub(super) fn fetch_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        let len = buf.len() as u64;
        self.note_code_pages(addr, len);
        let maps = &mut self.process.maps;
        let executable = maps.executable_len(addr, len).min(guest_run(
            &self.process.shared,
            self.vdso,
            addr,
            len,
        )) as usize;
        let buf = &mut buf[..executable];
        if maps.readable(addr, buf.len() as u64) && guest_mem::read_mapped(addr, buf) {
            buf.len()
        } else {
            guest_mem::read_code(addr, buf)
        }
    }

    /// Notes the guest pages of the `len` bytes at `addr` as pages a translation is made from
    /// (before they are read), where this thread has not already.
    fn note_code_pages(&mut self, addr: u64, len: u64) {
        let page = hotpath_loader::PAGE_SIZE;
        let (first, last) = (addr / page, addr.saturating_add(len.max(1) - 1) / page);
        if (first..=last).all(|p| self.code_pages_noted.contains(&p)) {
            return;
        }
        self.process.shared.note_code_pages(first, last);
        self.code_pages_noted.extend(first..=last);
    }

    /// Whether the guest may write the page of `at` or the next (a block's code is on them;
    /// the next only where a block starting at `at` can reach it): by its own protection,
    /// also where hotpath write-protected the page to watch its code.
    pub(super) fn code_writable(&mut self, at: u64) -> bool {
        let page = hotpath_loader::page_floor(at);
        let last = hotpath_loader::page_floor(
            at.saturating_add(crate::frontend::decode::MAX_BLOCK_BYTES as u64 - 1),
        );
        (page..=last)
            .step_by(hotpath_loader::PAGE_SIZE as usize)
            .any(|p| {
                let prot = match self.process.signals.protected_pages().guest_prot(p) {
                    Some(prot) => Some(prot),
                    None => self.process.maps.prot(p),
                };
                prot.is_some_and(|x| x & libc::PROT_WRITE != 0 && x & libc::PROT_EXEC != 0)
            })
    }

    /// The slot and target of `block`'s indirect branch when the slot
    /// ([`crate::frontend::decode::constant_slot`]) holds a constant: on a private page the guest can
    /// read but not write ([`crate::cache::smc::MapsCache::constant`]; a GOT after relocation), so it
    /// changes only through a system call that discards this translation. `None` for a
    /// non-canonical value, which must fault at the branch.
    pub(super) fn constant_target(
        &mut self,
        block: &hotpath_ir::Block,
    ) -> Option<(GuestAddr, GuestAddr)> {
        let slot = crate::frontend::decode::constant_slot(block)?;
        Some((slot, self.constant_value(slot)?))
    }

    /// The 8-byte value at guest `slot` if it is a constant there (see
    /// [`Self::constant_target`]) and a canonical address.
    pub(super) fn constant_value(&mut self, slot: GuestAddr) -> Option<GuestAddr> {
        if !self.constant_bytes(slot.0, 8) {
            return None;
        }
        let mut value = [0u8; 8];
        guest_mem::read(slot.0, &mut value).ok()?;
        let target = u64::from_le_bytes(value);
        (target < 1 << 47).then_some(GuestAddr(target))
    }

    /// True if the `len` bytes at guest `addr` change only through a system call that
    /// discards the translations of their range: on a private page the guest can read but
    /// not write ([`crate::cache::smc::MapsCache::constant`]), nor write-protected by hotpath for a
    /// guest that may write it.
    pub(super) fn constant_bytes(&mut self, addr: u64, len: u64) -> bool {
        self.note_code_pages(addr, len);
        let guest_writable = [addr, addr + len - 1].into_iter().any(|a| {
            let prot = self.process.signals.protected_pages().guest_prot(a);
            prot.is_some_and(|p| p & libc::PROT_WRITE != 0)
        });
        !guest_writable && self.process.maps.constant(addr, len)
    }

    /// Makes the constant `slot` count as guest bytes of the translations in the cache: a
    /// system call that changes it (reprotects, unmaps, remaps or discards its page, or
    /// writes it through /proc/self/mem) discards them.
    pub(super) fn depend_on_slot(&mut self, slot: GuestAddr) {
        self.depend_on_bytes(slot.0, 8);
    }

    /// [`Self::depend_on_slot`] for the `len` bytes at guest `addr`.
    pub(super) fn depend_on_bytes(&mut self, addr: u64, len: u64) {
        self.index.spans.push((addr, addr + len));
    }

    /// Write-protects the guest pages of `start..end` (code just translated) where the guest
    /// may write them, so that a write there discards the translation (`smc`).
    pub(super) fn protect_code(&mut self, start: u64, end: u64) {
        let maps = &mut self.process.maps;
        self.process
            .signals
            .protected_pages()
            .protect(start, end, |page| maps.prot(page));
    }

    /// Translates the basic block at guest `pc` into the code cache and announces its id.
    pub(super) fn translate(&mut self, pc: u64) -> Result<HostAddr, TranslateError> {
        self.translate_limited(pc, MAX_BLOCK_INSTRUCTIONS)
    }

    /// [`Self::translate`] with at most `max` instructions; a block of fewer than the usual
    /// most is a single-step block, kept apart from the lookup map. A block of a module the
    /// persisted store holds is placed from its record when its guest bytes are unchanged;
    /// one translated afresh there is kept for the store.
    pub(super) fn translate_limited(
        &mut self,
        pc: u64,
        max: usize,
    ) -> Result<HostAddr, TranslateError> {
        let module = (max == MAX_BLOCK_INSTRUCTIONS)
            .then(|| self.persisted_module(pc))
            .flatten();
        if let Some(module) = &module {
            if let Some(entry) = self.place_persisted(pc, module)? {
                return Ok(entry);
            }
        }
        // Watch the code's pages for writes if the guest may write them (undecodable bytes
        // too: code written there later must replace the trap), before their bytes are read:
        // another thread's store after the read then faults and discards this translation
        // (protected after the read, a store in between went unseen and the translation
        // stayed stale). Not when nothing can be fetched at `pc` (a page that is not
        // executable, such as the stack or the heap): its bytes are no code, and hotpath
        // itself writes signal frames on the stack.
        let watched = self.code_writable(pc);
        if watched && self.process.maps.executable_len(pc, 1) > 0 {
            self.protect_code(pc, pc + 1);
        }
        let mut block = self.decode(GuestAddr(pc), max);
        let fetched_nothing = matches!(
            block.terminator,
            hotpath_ir::Terminator::Trap { kind: TrapKind::FetchFault, at } if at.0 == pc
        );
        if !fetched_nothing {
            let end = block.end().0.max(pc + 1);
            self.protect_code(pc, end);
            let page = hotpath_loader::page_floor;
            if watched && page(end - 1) != page(pc) {
                // The block runs onto a page protected only now: read it again under the
                // protection.
                block = self.decode(GuestAddr(pc), max);
                self.protect_code(pc, block.end().0.max(pc + 1));
            }
        }
        // An indirect branch through a slot that cannot change without a system call is
        // translated as a direct one to the slot's value.
        let folded = (max == MAX_BLOCK_INSTRUCTIONS)
            .then(|| self.constant_target(&block))
            .flatten();
        let direct =
            folded.map(|(_, target)| crate::frontend::decode::with_direct_target(&block, target));
        let gateway = self.select_region(pc);
        let cx = EmitContext {
            enqueue: self.cfg.enqueue.then_some(self.cfg.ring_entries),
            gateway,
            jump_table: None,
            cold: None,
        };
        let shared = self.process.shared.clone();
        let mut registry = lock(&shared.registry);
        let mut flushed = false;
        // A `switch`'s dispatch through a jump table gets a table of its own (`jump_table`),
        // while there is one free.
        let switch = match &direct {
            None if max == MAX_BLOCK_INSTRUCTIONS => crate::backend::jump_table::pattern(&block),
            _ => None,
        };
        let mut site = None;
        let emitted = loop {
            let id = BlockId(registry.next_id);
            let first_exit = self.index.exits.len() as u32;
            let to_emit = direct.as_ref().unwrap_or(&block);
            let at = self.cache.next_addr();
            let cx = EmitContext {
                cold: Some(self.cache.next_cold_addr()),
                ..cx
            };
            let table = switch.and_then(|p| Some((p, self.free_jump_table_site()?)));
            let emitted = match table {
                Some((p, number)) => {
                    let cx = EmitContext {
                        jump_table: Some(number),
                        ..cx
                    };
                    let (emitted, code) = crate::backend::jump_table::emit_block(
                        to_emit, &p, id, at, first_exit, &cx, number,
                    )?;
                    site = Some((number, p, id, code));
                    emitted
                }
                None => emit_block(to_emit, id, at, first_exit, &cx)?,
            };
            let fits = emitted.code.len() as u64 <= self.cache.room()
                && emitted.cold.len() as u64 <= self.cache.cold_room()
                && first_exit as u64 + emitted.exits.len() as u64 <= EXIT_SPECIAL_BASE as u64;
            if fits {
                break emitted;
            }
            if flushed {
                return Err(TranslateError::CodeCache {
                    reason: format!("block at {pc:#x} does not fit in an empty cache"),
                });
            }
            drop(registry);
            self.flush();
            registry = lock(&shared.registry);
            flushed = true;
        };
        let jmp_at = block.term_inst.as_ref().map(|i| GuestAddr(i.inst.ip()));
        let site = match (site, jmp_at) {
            (Some((number, pattern, id, code)), Some(jmp_at)) => Some((
                number,
                crate::backend::jump_table::Site::of(&pattern, id, GuestAddr(pc), jmp_at, &code),
                code.fill,
            )),
            _ => None,
        };
        if let Some(m) = &module {
            let kept_site = site.as_ref().map(|(_, s, fill)| (s, *fill));
            if let Some(r) = BlockRecord::capture(&emitted, &block, pc - m.start, folded, kept_site)
            {
                m.store.keep(&m.file, r);
                self.stats.blocks_missed += 1;
            }
        }
        if let Some((slot, _)) = folded {
            self.depend_on_slot(slot);
        }
        let end = block.end().0.max(pc + 1);
        let summary = block.summary();
        let entry = self.install_block(
            pc,
            max,
            emitted,
            summary,
            block.code.into_boxed_slice(),
            end,
            registry,
        )?;
        if let Some((number, s, fill)) = site {
            self.open_jump_table(number, s, fill);
        }
        Ok(entry)
    }

    /// Makes the code cache put the next translation, of guest code at `pc`, in a region
    /// within reach of it (`CodeCache::region_for`), and returns the gateway as code there
    /// reaches it.
    pub(super) fn select_region(&mut self, pc: u64) -> Gateway {
        let memory = &self.process.shared.memory;
        let region = self.cache.region_for(pc, || pc > lock(memory).brk);
        self.cache.select(region);
        let jumps = self.cache.gateway_jumps();
        Gateway {
            exit: jumps.exit,
            ibl_miss: jumps.ibl_miss,
            ..self.gateway
        }
    }

    /// The persisted store and the module holding `pc` (its start and file), when a block
    /// there may be placed from the store or kept for it: a file-backed module, on pages the
    /// guest cannot write, while the guest's `rdtsc` runs (decoding depends on nothing else
    /// of the process's state: with `PR_TSC_SIGSEGV` it traps).
    pub(super) fn persisted_module(&mut self, pc: u64) -> Option<Arc<PersistedModule>> {
        if crate::host::cpu::tsc_sigsegv() {
            return None;
        }
        let store = self.process.shared.store.get()?;
        let module = {
            let memory = lock(&self.process.shared.memory);
            let version = memory.modules.version();
            match &self.last_module {
                // The same list and the same store (a forked child has a store of its own).
                Some(m)
                    if m.version == version
                        && (m.lo..m.hi).contains(&pc)
                        && Arc::ptr_eq(&m.store, store) =>
                {
                    m.clone()
                }
                _ => {
                    let (m, lo, hi) = memory.modules.containing_range(pc)?;
                    let (start, file) = (m.start, m.file.clone()?);
                    drop(memory);
                    let records = store.records(&file);
                    let m = Arc::new(PersistedModule {
                        store: store.clone(),
                        start,
                        file,
                        records,
                        lo,
                        hi,
                        version,
                    });
                    self.last_module = Some(m.clone());
                    m
                }
            }
        };
        if self.code_writable(pc) {
            return None;
        }
        Some(module)
    }

    /// Places the block at `pc` from the persisted store (`module`: see
    /// [`Self::persisted_module`]) if the store has it, its guest bytes are the ones mapped and
    /// executable now, and its code can be relocated here. Returns its entry, or `None` to
    /// translate it afresh.
    pub(super) fn place_persisted(
        &mut self,
        pc: u64,
        module: &PersistedModule,
    ) -> Result<Option<HostAddr>, TranslateError> {
        let Some(records) = &module.records else {
            return Ok(None);
        };
        let Some(record) = records.get(pc - module.start) else {
            // Another process may have written it since the records were read.
            let Some(newer) = module.store.refresh(&module.file) else {
                return Ok(None);
            };
            let module = Arc::new(PersistedModule {
                records: Some(newer),
                ..PersistedModule::clone(module)
            });
            self.last_module = Some(module.clone());
            return self.place_persisted(pc, &module);
        };
        let len = record.guest.len() as u64;
        // Protected before the bytes are compared, as a fresh translation's (`translate_limited`).
        self.protect_code(pc, pc + len);
        if !self.code_is(pc, record.guest) {
            return Ok(None);
        }
        // A block translated with its slot's value as constant: the value in this process.
        let slot = record.slot.map(|d| GuestAddr(pc.wrapping_add(d as u64)));
        let folded = match slot {
            Some(slot) => match self.constant_value(slot) {
                Some(target) => Some(target),
                None => return Ok(None),
            },
            None => None,
        };
        let gateway = self.select_region(pc);
        let shared = self.process.shared.clone();
        let mut registry = lock(&shared.registry);
        if record.code.len() as u64 + 15 > self.cache.room()
            || record.cold as u64 > self.cache.cold_room()
            || self.index.exits.len() + record.exit_count() > EXIT_SPECIAL_BASE as usize
        {
            drop(registry);
            self.flush();
            registry = lock(&shared.registry);
        }
        let id = BlockId(registry.next_id);
        let first_exit = self.index.exits.len() as u32;
        let at = self.cache.next_addr();
        // A `switch`'s dispatch gets a table of its own, while there is one free.
        let number = if record.has_site() {
            match self.free_jump_table_site() {
                Some(n) => Some(n),
                None => return Ok(None),
            }
        } else {
            None
        };
        let cold_at = self.cache.next_cold_addr();
        let Some(placed) = record.place(
            GuestAddr(pc),
            at,
            cold_at,
            id,
            first_exit,
            &gateway,
            folded,
            number,
        ) else {
            return Ok(None);
        };
        if placed.emitted.code.len() as u64 > self.cache.room()
            || placed.emitted.cold.len() as u64 > self.cache.cold_room()
        {
            return Ok(None);
        }
        if let Some(slot) = slot {
            self.depend_on_slot(slot);
        }
        self.stats.blocks_loaded += 1;
        let code: Box<[u8]> = record.guest.into();
        let entry = self.install_block(
            pc,
            MAX_BLOCK_INSTRUCTIONS,
            placed.emitted,
            placed.summary,
            code,
            pc + len,
            registry,
        )?;
        if let (Some(number), Some((site, fill))) = (number, placed.site) {
            self.open_jump_table(number, site, fill);
        }
        Ok(Some(entry))
    }

    /// Whether the guest's executable code at `pc` is `bytes` now (a persisted record is used
    /// only then).
    pub(super) fn code_is(&mut self, pc: u64, bytes: &[u8]) -> bool {
        let mut now = vec![0u8; bytes.len()];
        self.fetch_code(pc, &mut now) == now.len() && now == bytes
    }

    /// Puts `emitted`, the translation of the block at `pc` (at most `max` instructions,
    /// guest bytes `code` up to `end`, summarised by `summary`) into the code cache under the
    /// next id of `registry`, records its exits and layout, and announces it to the monitor.
    /// Returns its entry.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn install_block(
        &mut self,
        pc: u64,
        max: usize,
        emitted: crate::backend::emit::EmittedBlock,
        summary: hotpath_ir::BlockSummary,
        code: Box<[u8]>,
        end: u64,
        mut registry: std::sync::MutexGuard<'_, crate::linux::process::Registry>,
    ) -> Result<HostAddr, TranslateError> {
        let id = BlockId(registry.next_id);
        registry.next_id += 1;
        let at = self.cache.next_addr();
        if self.trace_translation {
            eprintln!(
                "hotpath: block {} at guest {pc:#x} → {}:\n{}",
                id.0,
                emitted.entry,
                disassemble_parts(&emitted.code, at.0, &emitted.cold, emitted.cold_at.0)
            );
        }
        self.cache.insert(&emitted.code);
        if !emitted.cold.is_empty() {
            debug_assert_eq!(self.cache.next_cold_addr(), emitted.cold_at);
            self.cache.insert_cold(&emitted.cold);
        }
        let first_exit = self.index.exits.len();
        self.index.exits.extend(emitted.exits);
        self.note_code(&emitted.layout, CodeKind::Block);
        self.cache.add_layout(emitted.layout);
        if max < MAX_BLOCK_INSTRUCTIONS {
            self.index.step_blocks.insert(pc, emitted.entry);
        } else {
            self.index.blocks.insert(pc, emitted.entry);
        }
        self.index.spans.push((pc, end));
        self.stats.blocks_translated += 1;
        if max == MAX_BLOCK_INSTRUCTIONS {
            self.link_to_known(first_exit);
        }
        registry.announce(NewBlock {
            id,
            summary,
            kind: IdKind::Block,
            code,
        });
        drop(registry);
        Ok(emitted.entry)
    }
}
