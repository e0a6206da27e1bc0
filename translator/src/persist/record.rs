//! One persisted basic block: its guest bytes, what the monitor is told about it, and its host
//! code with the layout, exits and relocations that let another process place the code at
//! another host address, for another guest address and block id (Reddi et al., "Persistent
//! code caching", CGO 2007, §3: code kept with what it needs to be relocated).
//!
//! Every guest address is kept as a delta from the block's start and every host address as an
//! offset from its code's start, so a record is independent of ASLR and of where the code
//! cache is. A record is used only if its guest bytes equal the bytes mapped now.

use hotpath_ir::{BlockId, BlockSummary, Cond, GuestAddr, HostAddr, Terminator};

use crate::backend::emit::EmittedBlock;
use crate::backend::gateway::Gateway;
use crate::backend::jump_table::{Dispatch, Site, DISPATCH_MAX};
use crate::backend::relocs::{RelocKind, Routine};
use crate::backend::stubs::gpr;
use crate::cache::links::{Exit, ExitKind, HostLayout};
use crate::host::thread_area::off;

/// A persisted basic block (see the module doc for the units of its fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRecord {
    /// Guest offset of the block's start from its module's start (bytes).
    pub offset: u64,
    /// The guest bytes the block covers.
    pub guest: Vec<u8>,
    /// Guest instructions per run of the block.
    pub instructions: u32,
    /// The terminating instruction's address, from the block's start.
    pub term_at: i64,
    /// How the block ends.
    pub term: TermRecord,
    /// The host code as emitted (unlinked): the hot part from its start, then the cold part
    /// (its last `cold` bytes), which is placed in the code cache's cold area. Host offsets
    /// count through both, as if the parts were one run of code.
    pub code: Vec<u8>,
    /// Bytes of `code` that are the cold part (0: none).
    pub cold: u32,
    /// The block's entry, from the code's start.
    pub entry: u32,
    /// The fields to patch.
    pub relocs: Vec<RelocRecord>,
    /// The exits, in index order.
    pub exits: Vec<ExitRecord>,
    /// `(host offset, guest delta)` of each body instruction.
    pub body: Vec<(u32, i64)>,
    /// Host offset where the terminator's code starts.
    pub term_start: u32,
    /// Guest delta of the terminating instruction.
    pub term_guest: i64,
    /// Host offset from which RCX is borrowed, if any.
    pub rcx_borrowed_from: Option<u32>,
    /// `(host offset, register number)` of instructions that run with a borrowed register.
    pub far_borrows: Vec<(u32, u8)>,
    /// The slot (guest delta) the block's indirect `jmp`/`call` reads, when it was translated
    /// as a direct one to the slot's value (`decode::constant_slot`): placing it needs the
    /// slot's value in this process, which [`ExitRecord::Folded`] goes to.
    pub slot: Option<i64>,
    /// What code may enter the block with any value in ([`hotpath_ir::entry_dead`]): a
    /// `switch`'s table entry for a case goes straight to its block when the case's register
    /// and the status flags are among them.
    pub dead: u32,
    /// The block's `switch` dispatch, translated as a jump-table site (its table is whichever
    /// is free where it is placed).
    pub site: Option<SiteRecord>,
}

/// A jump-table site ending a block (`crate::backend::jump_table::Site`), guest addresses as
/// deltas from the block's start and host addresses as offsets from its code's start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteRecord {
    /// GPR numbers (RAX = 0) of the table's base, the index and the `jmp`'s register.
    pub base: u8,
    pub index: u8,
    pub target: u8,
    /// The guest load's displacement (bytes).
    pub disp: i32,
    /// The guest's load and `add`, encoded, and the `add`'s offset in them.
    pub dispatch: Vec<u8>,
    pub add_at: u8,
    /// Guest deltas of the load and the `add`.
    pub load: i64,
    pub add: i64,
    /// Host offsets of the fill stub and the general path.
    pub fill: u32,
    pub general: u32,
}

/// A block's terminator with its guest addresses as deltas from the block's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TermRecord {
    Jump(i64),
    Branch {
        cond: u8,
        taken: i64,
        not_taken: i64,
    },
    Call {
        target: i64,
        return_to: i64,
    },
    FallThrough(i64),
    IndirectJump,
    IndirectCall(i64),
    Return,
    Syscall(i64),
}

/// One relocated field: its offset from the code's start and what it holds (guest addresses
/// as deltas from the block's start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelocRecord {
    BlockId(u32),
    Exit {
        at: u32,
        k: u32,
    },
    GatewayExit(u32),
    GatewayIblMiss(u32),
    GuestRel32 {
        at: u32,
        delta: i64,
        end: u8,
    },
    GuestAbs64 {
        at: u32,
        delta: i64,
    },
    GuestLow32 {
        at: u32,
        delta: i64,
    },
    GuestSigned32 {
        at: u32,
        delta: i64,
    },
    /// The thread area's displacement `offset` bytes into the block's jump-table site's table.
    JumpTableArea {
        at: u32,
        offset: i32,
    },
    /// A `rel32` to host offset `target` of the same code, in the other part.
    Local {
        at: u32,
        target: u32,
    },
}

/// One exit, guest addresses as deltas, host addresses as offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitRecord {
    Direct {
        target: i64,
        site: u32,
        stub: u32,
        call: bool,
    },
    Syscall {
        at: i64,
        next: i64,
    },
    /// A direct exit to the value of the block's constant slot ([`BlockRecord::slot`]), which
    /// may be in another module (so is no delta).
    Folded {
        site: u32,
        stub: u32,
        call: bool,
    },
    /// The jump-table site's fill (its site number is the one it is placed with).
    JumpTableFill,
}

/// Every condition, in the order its index is persisted.
const CONDS: [Cond; 18] = [
    Cond::O,
    Cond::No,
    Cond::B,
    Cond::Ae,
    Cond::E,
    Cond::Ne,
    Cond::Be,
    Cond::A,
    Cond::S,
    Cond::Ns,
    Cond::P,
    Cond::Np,
    Cond::L,
    Cond::Ge,
    Cond::Le,
    Cond::G,
    Cond::RcxZero,
    Cond::Loop,
];

/// A block placed from its record: what translating it would have given.
pub struct Placed {
    /// The host code, exits and layout, for the address and id it was placed for.
    pub emitted: EmittedBlock,
    /// What the monitor is told.
    pub summary: BlockSummary,
    /// Its jump-table site and the site's fill stub, for the site number it was placed with.
    pub(crate) site: Option<(Site, HostAddr)>,
}

impl BlockRecord {
    /// The record of `emitted`, the translation of `block` found `offset` bytes into its
    /// module (with its indirect branch through `folded`'s slot translated as a direct one to
    /// `folded`'s target, if given; its dispatch translated as jump-table site `site`, with
    /// its fill stub, if given); `None` when it cannot be persisted: its
    /// relocations are incomplete, it traps, or it has an
    /// exit or layout part a record does not describe.
    pub(crate) fn capture(
        emitted: &EmittedBlock,
        block: &hotpath_ir::Block,
        offset: u64,
        folded: Option<(GuestAddr, GuestAddr)>,
        site: Option<(&Site, HostAddr)>,
    ) -> Option<BlockRecord> {
        if !emitted.relocs.complete || block.code.len() != block.len_bytes as usize {
            return None;
        }
        let start = block.start.0;
        let base = emitted.layout.code_start;
        let g = |a: u64| a.wrapping_sub(start) as i64;
        let gd = |a: GuestAddr| g(a.0);
        let hot_len = emitted.code.len() as u64;
        let cold = (emitted.cold_at.0, emitted.cold.len() as u64);
        // Host address → offset through the hot part, then the cold one.
        let h = |a: u64| {
            let o = match a.checked_sub(base) {
                Some(o) if o < hot_len => o,
                _ => hot_len + a.checked_sub(cold.0).filter(|&o| o < cold.1)?,
            };
            u32::try_from(o).ok()
        };
        let term = match block.terminator {
            Terminator::Jump { target } => TermRecord::Jump(gd(target)),
            Terminator::Branch {
                cond,
                taken,
                not_taken,
            } => TermRecord::Branch {
                cond: CONDS.iter().position(|&c| c == cond)? as u8,
                taken: gd(taken),
                not_taken: gd(not_taken),
            },
            Terminator::Call { target, return_to } => TermRecord::Call {
                target: gd(target),
                return_to: gd(return_to),
            },
            Terminator::FallThrough { next } => TermRecord::FallThrough(gd(next)),
            Terminator::IndirectJump => TermRecord::IndirectJump,
            Terminator::IndirectCall { return_to } => TermRecord::IndirectCall(gd(return_to)),
            Terminator::Return => TermRecord::Return,
            Terminator::Syscall { next } => TermRecord::Syscall(gd(next)),
            Terminator::Trap { .. } => return None,
        };
        let mut relocs = Vec::with_capacity(emitted.relocs.list.len());
        for r in &emitted.relocs.list {
            let at = h(r.at)?;
            relocs.push(match r.kind {
                RelocKind::BlockId => RelocRecord::BlockId(at),
                RelocKind::Exit(k) => RelocRecord::Exit { at, k },
                RelocKind::Gateway(Routine::Exit) => RelocRecord::GatewayExit(at),
                RelocKind::Gateway(Routine::IblMiss) => RelocRecord::GatewayIblMiss(at),
                RelocKind::GuestRel32 { target, end } => RelocRecord::GuestRel32 {
                    at,
                    delta: gd(target),
                    end,
                },
                RelocKind::GuestAbs64 { target } => RelocRecord::GuestAbs64 {
                    at,
                    delta: gd(target),
                },
                RelocKind::GuestLow32 { target } => RelocRecord::GuestLow32 {
                    at,
                    delta: gd(target),
                },
                RelocKind::GuestSigned32 { target } => RelocRecord::GuestSigned32 {
                    at,
                    delta: gd(target),
                },
                RelocKind::JumpTableArea { offset } => {
                    site?;
                    RelocRecord::JumpTableArea { at, offset }
                }
                RelocKind::Local { target } => RelocRecord::Local {
                    at,
                    target: h(target)?,
                },
            });
        }
        let mut exits = Vec::with_capacity(emitted.exits.len());
        for e in &emitted.exits {
            exits.push(match e.kind {
                ExitKind::Direct {
                    target,
                    from,
                    site,
                    stub,
                    call,
                } if from == block.start => {
                    let (site, stub) = (h(site.0)?, h(stub.0)?);
                    match folded {
                        Some((_, t)) if t == target => ExitRecord::Folded { site, stub, call },
                        _ => ExitRecord::Direct {
                            target: gd(target),
                            site,
                            stub,
                            call,
                        },
                    }
                }
                ExitKind::Syscall { at, next } => ExitRecord::Syscall {
                    at: gd(at),
                    next: gd(next),
                },
                ExitKind::JumpTableFill { .. } if site.is_some() => ExitRecord::JumpTableFill,
                _ => return None,
            });
        }
        let site = match site {
            Some((s, fill)) => Some(SiteRecord {
                base: gpr(s.base),
                index: gpr(s.index),
                target: gpr(s.target),
                disp: s.disp,
                dispatch: s.dispatch.bytes().to_vec(),
                add_at: s.dispatch.add_at() as u8,
                load: g(s.dispatch.load_ip),
                add: g(s.dispatch.add_ip),
                fill: h(fill.0)?,
                general: h(s.general.0)?,
            }),
            None => None,
        };
        let l = &emitted.layout;
        if l.trace_exit.is_some() || l.guest_start != start {
            return None;
        }
        let summary = block.summary();
        Some(BlockRecord {
            offset,
            guest: block.code.clone(),
            instructions: summary.instructions,
            term_at: gd(summary.terminator_addr),
            term,
            code: [&emitted.code[..], &emitted.cold[..]].concat(),
            cold: emitted.cold.len() as u32,
            entry: h(l.entry)?,
            relocs,
            exits,
            body: l
                .body
                .iter()
                .map(|&(host, guest)| Some((h(host)?, g(guest))))
                .collect::<Option<_>>()?,
            term_start: h(l.term_start)?,
            term_guest: g(l.term_guest),
            rcx_borrowed_from: match l.rcx_borrowed_from {
                Some(a) => Some(h(a)?),
                None => None,
            },
            far_borrows: l
                .far_borrows
                .iter()
                .map(|&(host, r)| Some((h(host)?, r)))
                .collect::<Option<_>>()?,
            slot: folded.map(|(slot, _)| gd(slot)),
            dead: hotpath_ir::entry_dead(&block.body),
            site,
        })
    }

    /// The record's bytes in a store file (the layout [`RecordView`] reads).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(
            FIXED
                + self.guest.len()
                + self.code.len()
                + 4
                + RELOC * self.relocs.len()
                + EXIT * self.exits.len()
                + BODY * self.body.len()
                + FAR * self.far_borrows.len()
                + SITE,
        );
        let u32_ = |w: &mut Vec<u8>, v: u32| w.extend_from_slice(&v.to_le_bytes());
        let i64_ = |w: &mut Vec<u8>, v: i64| w.extend_from_slice(&v.to_le_bytes());
        w.extend_from_slice(&self.offset.to_le_bytes());
        u32_(&mut w, self.instructions);
        i64_(&mut w, self.term_at);
        let (kind, cond, a, b) = match self.term {
            TermRecord::Jump(t) => (0, 0, t, 0),
            TermRecord::Branch {
                cond,
                taken,
                not_taken,
            } => (1, cond, taken, not_taken),
            TermRecord::Call { target, return_to } => (2, 0, target, return_to),
            TermRecord::FallThrough(n) => (3, 0, n, 0),
            TermRecord::IndirectJump => (4, 0, 0, 0),
            TermRecord::IndirectCall(r) => (5, 0, r, 0),
            TermRecord::Return => (6, 0, 0, 0),
            TermRecord::Syscall(n) => (7, 0, n, 0),
        };
        w.extend_from_slice(&[kind, cond]);
        i64_(&mut w, a);
        i64_(&mut w, b);
        u32_(&mut w, self.entry);
        u32_(&mut w, self.term_start);
        i64_(&mut w, self.term_guest);
        u32_(&mut w, self.rcx_borrowed_from.unwrap_or(u32::MAX));
        w.push(self.slot.is_some() as u8);
        i64_(&mut w, self.slot.unwrap_or(0));
        u32_(&mut w, self.dead);
        w.push(self.site.is_some() as u8);
        for n in [
            self.guest.len(),
            self.code.len(),
            self.relocs.len(),
            self.exits.len(),
            self.body.len(),
            self.far_borrows.len(),
            self.cold as usize,
        ] {
            u32_(&mut w, n as u32);
        }
        if let Some(site) = &self.site {
            w.extend_from_slice(&[site.base, site.index, site.target, site.add_at]);
            w.extend_from_slice(&site.disp.to_le_bytes());
            i64_(&mut w, site.load);
            i64_(&mut w, site.add);
            u32_(&mut w, site.fill);
            u32_(&mut w, site.general);
            let mut dispatch = [0u8; DISPATCH_MAX];
            let n = site.dispatch.len().min(DISPATCH_MAX);
            dispatch[..n].copy_from_slice(&site.dispatch[..n]);
            w.push(n as u8);
            w.extend_from_slice(&dispatch);
        }
        w.extend_from_slice(&self.guest);
        w.extend_from_slice(&self.code);
        for r in &self.relocs {
            let (kind, end, at, value) = match *r {
                RelocRecord::BlockId(at) => (0, 0, at, 0),
                RelocRecord::Exit { at, k } => (1, 0, at, k as i64),
                RelocRecord::GatewayExit(at) => (2, 0, at, 0),
                RelocRecord::GatewayIblMiss(at) => (3, 0, at, 0),
                RelocRecord::GuestRel32 { at, delta, end } => (4, end, at, delta),
                RelocRecord::GuestAbs64 { at, delta } => (5, 0, at, delta),
                RelocRecord::GuestLow32 { at, delta } => (6, 0, at, delta),
                RelocRecord::GuestSigned32 { at, delta } => (7, 0, at, delta),
                RelocRecord::JumpTableArea { at, offset } => (8, 0, at, offset as i64),
                RelocRecord::Local { at, target } => (9, 0, at, target as i64),
            };
            w.extend_from_slice(&[kind, end]);
            u32_(&mut w, at);
            i64_(&mut w, value);
        }
        for e in &self.exits {
            let (kind, call, site, stub, a, b) = match *e {
                ExitRecord::Direct {
                    target,
                    site,
                    stub,
                    call,
                } => (0, call, site, stub, target, 0),
                ExitRecord::Syscall { at, next } => (1, false, 0, 0, at, next),
                ExitRecord::Folded { site, stub, call } => (2, call, site, stub, 0, 0),
                ExitRecord::JumpTableFill => (3, false, 0, 0, 0, 0),
            };
            w.extend_from_slice(&[kind, call as u8]);
            u32_(&mut w, site);
            u32_(&mut w, stub);
            i64_(&mut w, a);
            i64_(&mut w, b);
        }
        for &(h, g) in &self.body {
            u32_(&mut w, h);
            i64_(&mut w, g);
        }
        for &(h, r) in &self.far_borrows {
            u32_(&mut w, h);
            w.push(r);
        }
        w
    }
}

/// Bytes of a record's fixed part (see [`RecordView`]).
const FIXED: usize = 8 + 4 + 8 + 18 + 4 + 4 + 8 + 4 + 9 + 4 + 1 + 7 * 4;
/// Bytes of a record's jump-table site, when it has one.
const SITE: usize = 4 + 4 + 8 + 8 + 4 + 4 + 1 + DISPATCH_MAX;
/// Bytes of one relocation, exit, body entry and far borrow.
const RELOC: usize = 14;
const EXIT: usize = 26;
const BODY: usize = 12;
const FAR: usize = 5;

/// A little-endian reader over a record's bytes; every read is `None` past the end.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.bytes.len() {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.array()?))
    }
}

/// A record read in place from a store file, without decoding its parts into vectors: the
/// fixed fields, then the variable parts as byte slices that [`place`](Self::place) walks.
/// (Decoding each record into vectors first, with `postcard`, made a warm `busybox true` 6 %
/// slower.)
///
/// ```text
/// offset u64, instructions u32, term_at i64,
/// terminator: kind u8 (Jump, Branch, Call, FallThrough, IndirectJump, IndirectCall, Return,
///             Syscall), condition u8, two deltas i64,
/// entry u32, term_start u32, term_guest i64, rcx_borrowed_from u32 (u32::MAX: none),
/// slot: present u8, delta i64, dead u32, site present u8,
/// counts u32 × 7: guest bytes, code bytes, relocations, exits, body entries, far borrows,
///              cold code bytes (the last of the code bytes)
/// site (when present): base u8, index u8, target u8, add_at u8, disp i32, load i64,
///              add i64, fill u32, general u32, dispatch length u8, dispatch [u8; 16]
/// guest bytes, code bytes,
/// relocations  14 bytes each: kind u8 (RelocRecord's order), end u8, at u32, value i64
/// exits        26 bytes each: kind u8 (Direct, Syscall, Folded, JumpTableFill), call u8,
///              site u32, stub u32, two values i64
/// body         12 bytes each: host offset u32, guest delta i64
/// far borrows   5 bytes each: host offset u32, register u8
/// ```
///
/// Its fields are [`BlockRecord`]'s of the same names; the variable parts are byte slices.
pub struct RecordView<'a> {
    /// Guest offset of the block's start from its module's start (bytes).
    pub offset: u64,
    /// Guest instructions per run of the block.
    pub instructions: u32,
    term_at: i64,
    term: TermRecord,
    entry: u32,
    term_start: u32,
    term_guest: i64,
    rcx_borrowed_from: Option<u32>,
    /// The constant slot's guest delta, for a block translated through one.
    pub slot: Option<i64>,
    /// [`BlockRecord::dead`].
    pub dead: u32,
    site: Option<SiteRecord>,
    /// The guest bytes the block covers.
    pub guest: &'a [u8],
    /// The host code as emitted ([`BlockRecord::code`]).
    pub code: &'a [u8],
    /// [`BlockRecord::cold`].
    pub cold: u32,
    relocs: &'a [u8],
    exits: &'a [u8],
    body: &'a [u8],
    far_borrows: &'a [u8],
}

impl<'a> RecordView<'a> {
    /// The record in `bytes`, if they are one whole record (its parts' lengths add up to
    /// `bytes` exactly and its terminator is known).
    pub fn parse(bytes: &'a [u8]) -> Option<RecordView<'a>> {
        let mut r = Reader { bytes };
        let offset = u64::from_le_bytes(r.array()?);
        let instructions = r.u32()?;
        let term_at = r.i64()?;
        let (kind, cond, a, b) = (r.u8()?, r.u8()?, r.i64()?, r.i64()?);
        let term = match kind {
            0 => TermRecord::Jump(a),
            1 => TermRecord::Branch {
                cond,
                taken: a,
                not_taken: b,
            },
            2 => TermRecord::Call {
                target: a,
                return_to: b,
            },
            3 => TermRecord::FallThrough(a),
            4 => TermRecord::IndirectJump,
            5 => TermRecord::IndirectCall(a),
            6 => TermRecord::Return,
            7 => TermRecord::Syscall(a),
            _ => return None,
        };
        let entry = r.u32()?;
        let term_start = r.u32()?;
        let term_guest = r.i64()?;
        let rcx_borrowed_from = Some(r.u32()?).filter(|&v| v != u32::MAX);
        let slot = match (r.u8()?, r.i64()?) {
            (0, _) => None,
            (_, d) => Some(d),
        };
        let dead = r.u32()?;
        let has_site = r.u8()? != 0;
        let mut n = [0usize; 7];
        for n in &mut n {
            *n = r.u32()? as usize;
        }
        let site = if has_site {
            let [base, index, target, add_at] = r.array()?;
            let disp = i32::from_le_bytes(r.array()?);
            let (load, add, fill, general) = (r.i64()?, r.i64()?, r.u32()?, r.u32()?);
            let len = r.u8()? as usize;
            let dispatch = r.take(DISPATCH_MAX)?.get(..len)?.to_vec();
            Some(SiteRecord {
                base,
                index,
                target,
                disp,
                dispatch,
                add_at,
                load,
                add,
                fill,
                general,
            })
        } else {
            None
        };
        let view = RecordView {
            offset,
            instructions,
            term_at,
            term,
            entry,
            term_start,
            term_guest,
            rcx_borrowed_from,
            slot,
            dead,
            site,
            guest: r.take(n[0])?,
            code: r.take(n[1])?,
            cold: u32::try_from(n[6]).ok().filter(|&c| c as usize <= n[1])?,
            relocs: r.take(n[2].checked_mul(RELOC)?)?,
            exits: r.take(n[3].checked_mul(EXIT)?)?,
            body: r.take(n[4].checked_mul(BODY)?)?,
            far_borrows: r.take(n[5].checked_mul(FAR)?)?,
        };
        r.bytes.is_empty().then_some(view)
    }

    /// Exits of the block.
    pub fn exit_count(&self) -> usize {
        self.exits.len() / EXIT
    }

    /// The relocations (`None` for one of an unknown kind).
    fn relocs(&self) -> impl Iterator<Item = Option<RelocRecord>> + 'a {
        self.relocs.chunks_exact(RELOC).map(|c| {
            let mut r = Reader { bytes: c };
            let (kind, end, at, value) = (r.u8()?, r.u8()?, r.u32()?, r.i64()?);
            Some(match kind {
                0 => RelocRecord::BlockId(at),
                1 => RelocRecord::Exit {
                    at,
                    k: u32::try_from(value).ok()?,
                },
                2 => RelocRecord::GatewayExit(at),
                3 => RelocRecord::GatewayIblMiss(at),
                4 => RelocRecord::GuestRel32 {
                    at,
                    delta: value,
                    end,
                },
                5 => RelocRecord::GuestAbs64 { at, delta: value },
                6 => RelocRecord::GuestLow32 { at, delta: value },
                7 => RelocRecord::GuestSigned32 { at, delta: value },
                8 => RelocRecord::JumpTableArea {
                    at,
                    offset: i32::try_from(value).ok()?,
                },
                9 => RelocRecord::Local {
                    at,
                    target: u32::try_from(value).ok()?,
                },
                _ => return None,
            })
        })
    }

    /// The exits, in index order (`None` for one of an unknown kind).
    fn exits(&self) -> impl Iterator<Item = Option<ExitRecord>> + 'a {
        self.exits.chunks_exact(EXIT).map(|c| {
            let mut r = Reader { bytes: c };
            let (kind, call) = (r.u8()?, r.u8()? != 0);
            let (site, stub, a, b) = (r.u32()?, r.u32()?, r.i64()?, r.i64()?);
            Some(match kind {
                0 => ExitRecord::Direct {
                    target: a,
                    site,
                    stub,
                    call,
                },
                1 => ExitRecord::Syscall { at: a, next: b },
                2 => ExitRecord::Folded { site, stub, call },
                3 => ExitRecord::JumpTableFill,
                _ => return None,
            })
        })
    }

    /// `(host offset, guest delta)` of each body instruction.
    fn body(&self) -> impl Iterator<Item = (u32, i64)> + 'a {
        self.body.chunks_exact(BODY).filter_map(|c| {
            let mut r = Reader { bytes: c };
            Some((r.u32()?, r.i64()?))
        })
    }

    /// `(host offset, register number)` of each instruction run with a borrowed register.
    fn far_borrows(&self) -> impl Iterator<Item = (u32, u8)> + 'a {
        self.far_borrows.chunks_exact(FAR).filter_map(|c| {
            let mut r = Reader { bytes: c };
            Some((r.u32()?, r.u8()?))
        })
    }

    /// The record as owned vectors (`None` if a part is of an unknown kind).
    pub fn to_record(&self) -> Option<BlockRecord> {
        Some(BlockRecord {
            offset: self.offset,
            guest: self.guest.to_vec(),
            instructions: self.instructions,
            term_at: self.term_at,
            term: self.term,
            code: self.code.to_vec(),
            cold: self.cold,
            entry: self.entry,
            relocs: self.relocs().collect::<Option<_>>()?,
            exits: self.exits().collect::<Option<_>>()?,
            body: self.body().collect(),
            term_start: self.term_start,
            term_guest: self.term_guest,
            rcx_borrowed_from: self.rcx_borrowed_from,
            far_borrows: self.far_borrows().collect(),
            slot: self.slot,
            dead: self.dead,
            site: self.site.clone(),
        })
    }

    /// Whether the block ends in a jump-table site (placing it takes a free site number).
    pub fn has_site(&self) -> bool {
        self.site.is_some()
    }

    /// The block placed at host address `at` (its cold part at `cold_at`) for guest address
    /// `start`, with id `id` and exits
    /// from index `first_exit`, its gateway `gateway`, `folded` the value its constant
    /// slot holds now (see [`Self::slot`]) and `site` the jump-table site number its dispatch
    /// gets (see [`Self::has_site`]); `None` when a field cannot hold its new value (a
    /// RIP-relative operand now out of a displacement's reach, a pushed return address now
    /// above 2^31) or the record needs a slot's value or a site `folded` or `site` does not
    /// give: the block is then translated afresh.
    #[allow(clippy::too_many_arguments)]
    pub fn place(
        &self,
        start: GuestAddr,
        at: HostAddr,
        cold_at: HostAddr,
        id: BlockId,
        first_exit: u32,
        gateway: &Gateway,
        folded: Option<GuestAddr>,
        site: Option<u32>,
    ) -> Option<Placed> {
        if self.slot.is_some() != folded.is_some() || (self.site.is_some() && site.is_none()) {
            return None;
        }
        let base = at.0;
        let guest = |d: i64| start.0.wrapping_add(d as u64);
        let hot_len = (self.code.len() - self.cold as usize) as u32;
        // Offset → host address, through the hot part, then the cold one.
        let host = |o: u32| match o.checked_sub(hot_len) {
            None => base + o as u64,
            Some(c) => cold_at.0 + c as u64,
        };
        let mut code = self.code.to_vec();
        let mut put = |at: u32, bytes: &[u8]| -> Option<()> {
            let at = at as usize;
            code.get_mut(at..at + bytes.len())?.copy_from_slice(bytes);
            Some(())
        };
        let rel32 = |field: u32, end: u64, target: u64| -> Option<[u8; 4]> {
            let from = host(field) + end;
            let d = i32::try_from(target.wrapping_sub(from) as i64).ok()?;
            Some(d.to_le_bytes())
        };
        for r in self.relocs() {
            match r? {
                RelocRecord::BlockId(f) => put(f, &id.0.to_le_bytes())?,
                RelocRecord::Exit { at, k } => put(at, &(first_exit + k).to_le_bytes())?,
                RelocRecord::GatewayExit(f) => put(f, &rel32(f, 4, gateway.exit.0)?)?,
                RelocRecord::GatewayIblMiss(f) => put(f, &rel32(f, 4, gateway.ibl_miss.0)?)?,
                RelocRecord::GuestRel32 { at, delta, end } => {
                    put(at, &rel32(at, end as u64, guest(delta))?)?
                }
                RelocRecord::GuestAbs64 { at, delta } => put(at, &guest(delta).to_le_bytes())?,
                RelocRecord::GuestLow32 { at, delta } => {
                    put(at, &(guest(delta) as u32).to_le_bytes())?
                }
                RelocRecord::GuestSigned32 { at, delta } => {
                    let v = i32::try_from(guest(delta)).ok()?;
                    put(at, &v.to_le_bytes())?
                }
                RelocRecord::JumpTableArea { at, offset } => {
                    let v = off::jump_table(site?).checked_add(offset)?;
                    put(at, &v.to_le_bytes())?
                }
                RelocRecord::Local { at, target } => put(at, &rel32(at, 4, host(target))?)?,
            }
        }
        let cold = code.split_off(hot_len as usize);
        let exits = self
            .exits()
            .map(|e| {
                Some(Exit {
                    block: id,
                    kind: match e? {
                        ExitRecord::Folded { site, stub, call } => ExitKind::Direct {
                            target: folded.unwrap_or(GuestAddr(0)),
                            from: start,
                            site: HostAddr(host(site)),
                            stub: HostAddr(host(stub)),
                            call,
                        },
                        ExitRecord::Direct {
                            target,
                            site,
                            stub,
                            call,
                        } => ExitKind::Direct {
                            target: GuestAddr(guest(target)),
                            from: start,
                            site: HostAddr(host(site)),
                            stub: HostAddr(host(stub)),
                            call,
                        },
                        ExitRecord::Syscall { at, next } => ExitKind::Syscall {
                            at: GuestAddr(guest(at)),
                            next: GuestAddr(guest(next)),
                        },
                        ExitRecord::JumpTableFill => ExitKind::JumpTableFill { site: site? },
                    },
                })
            })
            .collect::<Option<Vec<Exit>>>()?;
        let placed_site = match &self.site {
            Some(s) => {
                let reg = |n: u8| hotpath_ir::gpr_numbered(n as u32);
                let dispatch = Dispatch::from_parts(
                    &s.dispatch,
                    s.add_at as usize,
                    guest(s.load),
                    guest(s.add),
                )?;
                let site = Site {
                    base: reg(s.base)?,
                    index: reg(s.index)?,
                    target: reg(s.target)?,
                    disp: s.disp,
                    dispatch,
                    id,
                    from: start,
                    jmp_at: GuestAddr(guest(self.term_at)),
                    general: HostAddr(host(s.general)),
                };
                Some((site, HostAddr(host(s.fill))))
            }
            None => None,
        };
        let layout = HostLayout {
            code_start: base,
            entry: host(self.entry),
            guest_start: start.0,
            code_end: base + hot_len as u64,
            body: self.body().map(|(h, g)| (host(h), guest(g))).collect(),
            term_start: host(self.term_start),
            term_guest: guest(self.term_guest),
            rcx_borrowed_from: self.rcx_borrowed_from.map(host),
            far_borrows: self.far_borrows().map(|(h, r)| (host(h), r)).collect(),
            trace_exit: None,
        };
        let g = |d: i64| GuestAddr(guest(d));
        let terminator = match self.term {
            TermRecord::Jump(t) => Terminator::Jump { target: g(t) },
            TermRecord::Branch {
                cond,
                taken,
                not_taken,
            } => Terminator::Branch {
                cond: *CONDS.get(cond as usize)?,
                taken: g(taken),
                not_taken: g(not_taken),
            },
            TermRecord::Call { target, return_to } => Terminator::Call {
                target: g(target),
                return_to: g(return_to),
            },
            TermRecord::FallThrough(n) => Terminator::FallThrough { next: g(n) },
            TermRecord::IndirectJump => Terminator::IndirectJump,
            TermRecord::IndirectCall(r) => Terminator::IndirectCall { return_to: g(r) },
            TermRecord::Return => Terminator::Return,
            TermRecord::Syscall(n) => Terminator::Syscall { next: g(n) },
        };
        Some(Placed {
            emitted: EmittedBlock {
                code,
                cold,
                cold_at,
                entry: HostAddr(host(self.entry)),
                exits,
                layout,
                relocs: Default::default(),
            },
            summary: BlockSummary {
                start,
                terminator_addr: g(self.term_at),
                len_bytes: self.guest.len() as u32,
                instructions: self.instructions,
                terminator,
            },
            site: placed_site,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::emit::{emit_block, EmitContext};
    use crate::frontend::decode::decode_block_from;

    /// The executable bytes of this test binary (a large x86-64 program: Rust's standard
    /// library, iced, dynasm) and the virtual address they are linked at.
    fn own_text() -> (Vec<u8>, u64) {
        let elf = std::fs::read("/proc/self/exe").unwrap();
        let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
        let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
        let (phoff, phentsize, phnum) = (u64_at(32) as usize, u16_at(54), u16_at(56));
        for i in 0..phnum {
            let ph = phoff + i * phentsize;
            let (kind, flags) = (
                u32::from_le_bytes(elf[ph..ph + 4].try_into().unwrap()),
                elf[ph + 4],
            );
            if kind == 1 && flags & 1 != 0 {
                let (off, vaddr, size) = (
                    u64_at(ph + 8) as usize,
                    u64_at(ph + 16),
                    u64_at(ph + 32) as usize,
                );
                return (elf[off..off + size].to_vec(), vaddr);
            }
        }
        panic!("no executable segment");
    }

    /// Gateway routines `base`-relative, as a thread's cache would have them.
    fn gateway(base: u64) -> Gateway {
        Gateway {
            enter: HostAddr(base),
            exit: HostAddr(base + 0x100),
            ibl_miss: HostAddr(base + 0x200),
            ibl_empty: HostAddr(base + 0x300),
            exit_from_signal: HostAddr(base + 0x400),
        }
    }

    /// Every block of a linear sweep over this binary's code, translated for guest address
    /// `g1` and host address `h1`, recorded, and placed for `g2` and `h2` with another id and
    /// first exit, is what translating it there directly gives: the same bytes, exits and
    /// layout. `h - g` is the same in both places, so each operand has the same reach.
    ///
    /// With `cold`, each block's cold part goes elsewhere (the code cache's cold area): in the
    /// first place 16 MiB and a few odd bytes above its code, in the second 48 MiB and other
    /// odd bytes below it, so that every `rel32` between the two parts changes; else it stays
    /// in line.
    fn placed_equals_translated(enqueue: Option<u64>, far: bool, cold: bool) {
        let (text, vaddr) = own_text();
        let text = &text[..text.len().min(400_000)];
        // Near: code 1 GiB after its guest; far: 64 TiB away (every RIP-relative operand is
        // rewritten). The second place is ASLR-like: both moved by the same 0x5a5a_5000.
        let (g1, h1) = (
            0x5555_0000_0000 + vaddr,
            if far { 0x1000_0000 } else { 0x5555_4000_0000 },
        );
        let shift = 0x5a5a_5000;
        let cold_of = |h: u64| {
            HostAddr(match (cold, h < h1 + shift) {
                (false, _) => 0,
                (true, true) => h + 0x100_2345,
                (true, false) => h - 0x300_1235,
            })
        };
        let cx = |g: u64, h: u64| EmitContext {
            enqueue,
            gateway: gateway(g & !0xfff_ffff),
            jump_table: None,
            cold: cold.then(|| cold_of(h)),
        };
        // Record `r` placed as guest block `start` at host address `h` (its cold part where
        // `cold_of` puts it), as id 4242 with its exits from 1000.
        let place_at = |r: &RecordView<'_>,
                        start: GuestAddr,
                        h: u64,
                        gw: &Gateway,
                        folded: Option<GuestAddr>,
                        site: Option<u32>| {
            r.place(
                start,
                HostAddr(h),
                cold_of(h),
                BlockId(4242),
                1000,
                gw,
                folded,
                site,
            )
        };
        let (mut at, mut checked, mut pushes, mut folded, mut sites) = (0usize, 0, 0, 0, 0);
        while at + 16 < text.len() {
            let fetch = |base: u64| {
                move |addr: u64, buf: &mut [u8]| {
                    let o = (addr - base) as usize;
                    let n = buf.len().min(text.len() - o);
                    buf[..n].copy_from_slice(&text[o..o + n]);
                    n
                }
            };
            let b1 = decode_block_from(GuestAddr(g1 + at as u64), fetch(g1));
            // The same block in the second place: its host address and the block decoded there.
            let second = || {
                let g2 = g1 + shift;
                let b2 = decode_block_from(GuestAddr(g2 + at as u64), fetch(g2));
                (h1 + shift + at as u64 * 16, b2)
            };
            let len = (b1.len_bytes as usize).max(1);
            let e1 = emit_block(
                &b1,
                BlockId(7),
                HostAddr(h1 + at as u64 * 16),
                3,
                &cx(h1, h1 + at as u64 * 16),
            )
            .unwrap();
            if let Some(r) = BlockRecord::capture(&e1, &b1, at as u64, None, None) {
                // Placed through its bytes, as a store file gives it.
                let bytes = r.encode();
                let r = RecordView::parse(&bytes).expect("a record reads back");
                let (h2, b2) = second();
                let e2 = emit_block(&b2, BlockId(4242), HostAddr(h2), 1000, &cx(h1 + shift, h2))
                    .unwrap();
                let p = place_at(&r, b2.start, h2, &cx(h1 + shift, h2).gateway, None, None)
                    .expect("the same reach places");
                assert_eq!(p.emitted.code, e2.code, "block at +{at:#x}");
                assert_eq!(p.emitted.cold, e2.cold, "block at +{at:#x}");
                assert_eq!(p.emitted.cold_at, e2.cold_at);
                assert_eq!(p.emitted.entry, e2.entry);
                assert_eq!(format!("{:?}", p.emitted.exits), format!("{:?}", e2.exits));
                assert_eq!(
                    format!("{:?}", p.emitted.layout),
                    format!("{:?}", e2.layout)
                );
                assert_eq!(p.summary, b2.summary());
                pushes += matches!(
                    b1.terminator,
                    Terminator::Call { .. } | Terminator::IndirectCall { .. }
                ) as u32;
                checked += 1;
            }
            // The same block with its slot's value taken as constant, if it has such a slot:
            // placed with the value the slot holds in the second process (another module's
            // address, not moved with this one).
            if let Some(slot) = crate::frontend::decode::constant_slot(&b1) {
                let (t1, t2) = (GuestAddr(0x7f00_1234_5000), GuestAddr(0x7f77_0000_9000));
                let d1 = crate::frontend::decode::with_direct_target(&b1, t1);
                let e1 = emit_block(
                    &d1,
                    BlockId(7),
                    HostAddr(h1 + at as u64 * 16),
                    3,
                    &cx(h1, h1 + at as u64 * 16),
                )
                .unwrap();
                let bytes = BlockRecord::capture(&e1, &b1, at as u64, Some((slot, t1)), None)
                    .expect("a folded block is persisted")
                    .encode();
                let r = RecordView::parse(&bytes).expect("a record reads back");
                let (h2, b2) = second();
                let d2 = crate::frontend::decode::with_direct_target(&b2, t2);
                let e2 = emit_block(&d2, BlockId(4242), HostAddr(h2), 1000, &cx(h1 + shift, h2))
                    .unwrap();
                let gw = &cx(h1 + shift, h2).gateway;
                let p =
                    place_at(&r, b2.start, h2, gw, Some(t2), None).expect("the same reach places");
                assert_eq!(p.emitted.code, e2.code, "folded block at +{at:#x}");
                assert_eq!(p.emitted.cold, e2.cold, "folded block at +{at:#x}");
                assert_eq!(format!("{:?}", p.emitted.exits), format!("{:?}", e2.exits));
                assert_eq!(
                    p.summary,
                    b2.summary(),
                    "the monitor learns the indirect branch"
                );
                assert!(place_at(&r, b2.start, h2, gw, None, None).is_none());
                folded += 1;
            }
            // A `switch`'s dispatch translated as jump-table site 3, placed as site 9: the
            // translation as site 9 there, and the same site for the table to open.
            if let Some(pat) = crate::backend::jump_table::pattern(&b1) {
                let (e1, c1) = crate::backend::jump_table::emit_block(
                    &b1,
                    &pat,
                    BlockId(7),
                    HostAddr(h1 + at as u64 * 16),
                    3,
                    &cx(h1, h1 + at as u64 * 16),
                    3,
                )
                .unwrap();
                let jmp_at =
                    |b: &hotpath_ir::Block| GuestAddr(b.term_inst.as_ref().unwrap().inst.ip());
                let s1 = Site::of(&pat, BlockId(7), b1.start, jmp_at(&b1), &c1);
                let bytes = BlockRecord::capture(&e1, &b1, at as u64, None, Some((&s1, c1.fill)))
                    .expect("a jump-table site is persisted")
                    .encode();
                let r = RecordView::parse(&bytes).expect("a record reads back");
                assert!(r.has_site());
                let (h2, b2) = second();
                let p2 = crate::backend::jump_table::pattern(&b2).unwrap();
                let cx2 = cx(h1 + shift, h2);
                let (e2, c2) = crate::backend::jump_table::emit_block(
                    &b2,
                    &p2,
                    BlockId(4242),
                    HostAddr(h2),
                    1000,
                    &cx2,
                    9,
                )
                .unwrap();
                let s2 = Site::of(&p2, BlockId(4242), b2.start, jmp_at(&b2), &c2);
                let gw = &cx2.gateway;
                let p =
                    place_at(&r, b2.start, h2, gw, None, Some(9)).expect("the same reach places");
                assert_eq!(p.emitted.code, e2.code, "jump-table site at +{at:#x}");
                assert_eq!(p.emitted.cold, e2.cold, "jump-table site at +{at:#x}");
                assert_eq!(format!("{:?}", p.emitted.exits), format!("{:?}", e2.exits));
                assert_eq!(
                    format!("{:?}", p.emitted.layout),
                    format!("{:?}", e2.layout)
                );
                assert_eq!(
                    format!("{:?}", p.site),
                    format!("{:?}", Some((s2, c2.fill)))
                );
                assert_eq!(r.dead, hotpath_ir::entry_dead(&b2.body));
                assert!(
                    place_at(&r, b2.start, h2, gw, None, None).is_none(),
                    "a site needs a table"
                );
                sites += 1;
            }
            at += len;
        }
        assert!(
            checked > 10_000 && pushes > 500 && folded > 50 && sites > 20,
            "{checked} blocks, {pushes} calls, {folded} through constant slots, {sites} jump-table sites"
        );
    }

    #[test]
    fn a_placed_block_is_its_translation_there_near() {
        placed_equals_translated(Some(1024), false, true);
    }

    #[test]
    fn a_placed_block_is_its_translation_there_far() {
        placed_equals_translated(Some(4096), true, true);
    }

    #[test]
    fn a_placed_block_is_its_translation_there_without_the_monitor() {
        placed_equals_translated(None, false, true);
    }

    #[test]
    fn a_placed_block_is_its_translation_there_in_one_part() {
        placed_equals_translated(Some(1024), false, false);
    }

    #[test]
    fn a_field_out_of_reach_is_refused_not_wrapped() {
        // lea rax, [rip + 0x100]; ret — emitted near, placed 4 GiB away from its guest.
        let code = [0x48, 0x8d, 0x05, 0x00, 0x01, 0, 0, 0xc3];
        let b = decode_block_from(GuestAddr(0x40_0000), |_, buf: &mut [u8]| {
            buf[..code.len()].copy_from_slice(&code);
            code.len()
        });
        let cx = EmitContext {
            enqueue: None,
            gateway: gateway(0x7000_0000),
            jump_table: None,
            cold: None,
        };
        let e = emit_block(&b, BlockId(1), HostAddr(0x7000_1000), 0, &cx).unwrap();
        let bytes = BlockRecord::capture(&e, &b, 0, None, None)
            .unwrap()
            .encode();
        let r = RecordView::parse(&bytes).unwrap();
        assert!(r
            .place(
                GuestAddr(0x40_0000),
                HostAddr(0x7000_2000),
                HostAddr(0),
                BlockId(2),
                0,
                &cx.gateway,
                None,
                None
            )
            .is_some());
        assert!(r
            .place(
                GuestAddr(0x1_4000_0000),
                HostAddr(0x7000_2000),
                HostAddr(0),
                BlockId(2),
                0,
                &cx.gateway,
                None,
                None
            )
            .is_none());
    }

    #[test]
    fn a_record_reads_back_from_its_bytes_and_nothing_else_does() {
        let terms = [
            TermRecord::Jump(-5),
            TermRecord::Branch {
                cond: 4,
                taken: 9,
                not_taken: -1 << 40,
            },
            TermRecord::Call {
                target: 1 << 33,
                return_to: 5,
            },
            TermRecord::FallThrough(7),
            TermRecord::IndirectJump,
            TermRecord::IndirectCall(3),
            TermRecord::Return,
            TermRecord::Syscall(2),
        ];
        for (i, term) in terms.into_iter().enumerate() {
            let r = BlockRecord {
                offset: 0x1234 + i as u64,
                guest: vec![0xc3; i + 1],
                instructions: 3,
                term_at: 2,
                term,
                code: (0..40).collect(),
                cold: (i as u32 * 5) % 40,
                entry: 8,
                relocs: vec![
                    RelocRecord::BlockId(1),
                    RelocRecord::Exit { at: 2, k: 3 },
                    RelocRecord::GatewayExit(4),
                    RelocRecord::GatewayIblMiss(5),
                    RelocRecord::GuestRel32 {
                        at: 6,
                        delta: -7,
                        end: 5,
                    },
                    RelocRecord::GuestAbs64 {
                        at: 8,
                        delta: 1 << 50,
                    },
                    RelocRecord::GuestLow32 { at: 9, delta: 10 },
                    RelocRecord::GuestSigned32 { at: 11, delta: -12 },
                    RelocRecord::JumpTableArea { at: 12, offset: 16 },
                    RelocRecord::Local { at: 13, target: 39 },
                ],
                exits: vec![
                    ExitRecord::Direct {
                        target: -3,
                        site: 20,
                        stub: 30,
                        call: true,
                    },
                    ExitRecord::Syscall { at: 1, next: 2 },
                    ExitRecord::Folded {
                        site: 21,
                        stub: 31,
                        call: false,
                    },
                    ExitRecord::JumpTableFill,
                ],
                body: vec![(8, 0), (12, 1)],
                term_start: 16,
                term_guest: 2,
                rcx_borrowed_from: (i % 2 == 0).then_some(14),
                far_borrows: vec![(10, 2)],
                slot: (i % 3 == 0).then_some(-64),
                dead: 0x1_0041 + i as u32,
                site: (i % 2 == 1).then(|| SiteRecord {
                    base: 3,
                    index: 0,
                    target: 2,
                    disp: -16,
                    dispatch: vec![0x48, 0x63, 0x04, 0x83, 0x48, 0x01, 0xd8],
                    add_at: 4,
                    load: -7,
                    add: -3,
                    fill: 30,
                    general: 36,
                }),
            };
            let bytes = r.encode();
            assert_eq!(
                RecordView::parse(&bytes).and_then(|v| v.to_record()),
                Some(r)
            );
            assert!(RecordView::parse(&bytes[..bytes.len() - 1]).is_none());
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(RecordView::parse(&longer).is_none());
            let mut bad_term = bytes.clone();
            bad_term[20] = 8;
            assert!(RecordView::parse(&bad_term).is_none());
        }
    }
}
