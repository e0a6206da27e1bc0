//! The thread's jump-table sites (`crate::backend::jump_table`): which translation each table in the
//! thread area belongs to, and the fill that makes an index's stub the first time a `switch`
//! index runs.

use hotpath_ir::{GuestAddr, HostAddr};
use iced_x86::Register;

use super::{Next, Translator};
use crate::backend::jump_table::{emit_index_stub, Site};
use crate::backend::stubs::gpr;
use crate::cache::code_log::CodeKind;
use crate::cache::links::ExitKind;
use crate::host::thread_area::{
    JUMP_TABLE_ENTRIES, JUMP_TABLE_FIRST, JUMP_TABLE_NO_BASE, JUMP_TABLE_SITES, JUMP_TABLE_STRIDE,
};
use crate::TranslateError;

/// Most bytes an index's stub takes (`jump_table::emit_index_stub`: about 30).
const INDEX_STUB_MAX: u64 = 64;

impl Translator {
    /// The site number the next translation of a `switch` dispatch gets, or `None` when every
    /// table is taken (until the next flush).
    pub(super) fn free_jump_table_site(&self) -> Option<u32> {
        let open = self.jump_tables.sites.len();
        (open < JUMP_TABLE_SITES).then_some(open as u32)
    }

    /// Records site `site` (the one [`Self::free_jump_table_site`] gave, its code now in the
    /// cache with its fill stub at `fill`) and empties its table: no base yet, every index to
    /// the fill stub.
    pub(super) fn open_jump_table(&mut self, site: u32, s: Site, fill: HostAddr) {
        debug_assert_eq!(site as usize, self.jump_tables.sites.len());
        self.jump_tables.sites.push(s);
        self.stats.jump_table_sites += 1;
        let words =
            &mut self.area.jump_tables[site as usize * JUMP_TABLE_STRIDE..][..JUMP_TABLE_STRIDE];
        words[0] = JUMP_TABLE_NO_BASE;
        words[1..].fill(fill.0);
        self.area.jump_tables_open = self.jump_tables.sites.len() as u64;
    }

    /// Site `site`'s fill stub ran (the guest's dispatch done, the case's address in its
    /// register): takes the base the site is for when it has none, makes the index's stub
    /// when the index, the base and the table entry allow (see `crate::backend::jump_table`), and goes
    /// on at the case.
    pub(super) fn fill_jump_table(&mut self, site: u32) -> Result<Next, TranslateError> {
        let s = self.jump_tables.sites[site as usize];
        let reg =
            |area: &crate::host::thread_area::ThreadArea, r: Register| area.gpr[gpr(r) as usize];
        let (base, target) = (reg(self.area, s.base), reg(self.area, s.target));
        let index = self.area.jump_table_index;
        let words = site as usize * JUMP_TABLE_STRIDE;
        if self.area.jump_tables[words] == JUMP_TABLE_NO_BASE {
            self.area.jump_tables[words] = base;
        }
        let entry = base
            .wrapping_add(index.wrapping_mul(4))
            .wrapping_add(s.disp as u64);
        if self.area.jump_tables[words] != base
            || index >= JUMP_TABLE_ENTRIES as u64
            || target >= 1 << 47
            || self.stepping
        {
            return Ok(Next::Guest(target));
        }
        if !self.constant_bytes(entry, 4) {
            // A table the guest may write: this index goes through the lookup from now on.
            self.area.jump_tables[words + JUMP_TABLE_FIRST + index as usize] = s.general.0;
            self.stats.jump_table_entries_refused += 1;
            return Ok(Next::Guest(target));
        }
        let generation = self.index.generation;
        let host = self.lookup_or_translate(target)?;
        if generation != self.index.generation {
            return Ok(Next::Host(host));
        }
        // The table jump skips the guest's load and `add`: the case's block may be entered
        // straight when it sets the `jmp`'s register and the status flags before it reads
        // them (or can fault); else through the index's stub, made once (a signal points the
        // entry back at the fill stub, not the stub away).
        let dead = self.dead_at_entry(target);
        let direct = dead & (1 << gpr(s.target)) != 0 && dead & hotpath_ir::FLAGS_DEAD != 0;
        let to = if direct {
            self.stats.jump_table_entries_direct += 1;
            host
        } else if let Some(&stub) = self.jump_tables.stubs.get(&(site, index)) {
            stub
        } else {
            match self.index_stub(site, index, &s, target, host)? {
                Some(stub) => stub,
                None => return Ok(Next::Host(host)),
            }
        };
        self.depend_on_bytes(entry, 4);
        self.stats.jump_table_entries += 1;
        self.area.jump_tables[words + JUMP_TABLE_FIRST + index as usize] = to.0;
        Ok(Next::Host(host))
    }

    /// What the block at guest `pc` may be entered with any value in
    /// ([`hotpath_ir::entry_dead`]): from its persisted record where the store has one for
    /// the bytes mapped now (a warm run decodes nothing), else from the block decoded.
    fn dead_at_entry(&mut self, pc: u64) -> u32 {
        if let Some(module) = self.persisted_module(pc) {
            if let Some(record) = module
                .records
                .as_ref()
                .and_then(|r| r.get(pc - module.start))
            {
                if self.code_is(pc, record.guest) {
                    return record.dead;
                }
            }
        }
        let case = self.decode(
            GuestAddr(pc),
            crate::frontend::decode::MAX_BLOCK_INSTRUCTIONS,
        );
        hotpath_ir::entry_dead(&case.body)
    }

    /// Makes the stub of site `site`'s index `index` (the site `s`), whose case at guest
    /// `target` is translated at `host`, beside the site and linked to the case. `None` when
    /// the cache or the exit table has no room for it.
    fn index_stub(
        &mut self,
        site: u32,
        index: u64,
        s: &Site,
        target: u64,
        host: HostAddr,
    ) -> Result<Option<HostAddr>, TranslateError> {
        let gateway = self.select_region(s.from.0);
        let exit = self.index.exits.len() as u32;
        if self.cache.room() < INDEX_STUB_MAX
            || exit + 1 >= crate::backend::gateway::EXIT_SPECIAL_BASE
        {
            return Ok(None);
        }
        let at = self.cache.next_addr();
        let (code, e, layout) = emit_index_stub(
            &s.dispatch,
            at,
            GuestAddr(target),
            s.from,
            s.jmp_at,
            exit,
            gateway.exit.0 as usize,
            s.id,
        )?;
        debug_assert!(code.len() as u64 <= INDEX_STUB_MAX);
        self.cache.insert(&code);
        self.index.exits.push(e);
        self.note_code(&layout, CodeKind::JumpTableStub);
        self.cache.add_layout(layout);
        if let ExitKind::Direct { site: rel32, .. } = e.kind {
            self.cache.patch_rel32(rel32, host);
            self.note_link(target, exit);
            self.stats.links += 1;
        }
        self.jump_tables.stubs.insert((site, index), at);
        Ok(Some(at))
    }
}
