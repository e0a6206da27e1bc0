//! The profile as reported: the monitor's per-id tables aggregated by guest address
//! (a block translated twice, before and after a code cache flush, is one block here).

use std::collections::{BTreeMap, HashMap};

use hotpath_ir::{syscall_name, Terminator, TerminatorKind};

use crate::{PathProfile, Tables};

/// Names a guest address `symbol+offset`, when a symbol covers it.
pub type Symbolizer<'a> = &'a dyn Fn(u64) -> Option<(String, u64)>;

/// Totals over the whole run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Block executions.
    pub blocks_executed: u64,
    /// Guest instructions executed (Σ block count × block instructions).
    pub guest_instructions: u64,
    /// Distinct guest block addresses executed.
    pub distinct_blocks: u64,
    /// Events the monitor read from the ring: block, superblock, side-exit and system call
    /// events (fewer than blocks executed by what superblocks saved).
    pub events: u64,
    /// Times the guest found the ring full and waited for the monitor.
    pub ring_waits: u64,
    /// Time the guest spent waiting for the monitor, in nanoseconds.
    pub ring_wait_ns: u64,
    /// Time the monitor spent on events (tables, paths, superblock decisions; not polling an
    /// empty ring), in nanoseconds: divided by `events`, what each event cost it.
    pub monitor_busy_ns: u64,
}

/// One guest block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockProfile {
    /// Guest address of its first instruction.
    pub addr: u64,
    /// Executions.
    pub count: u64,
    /// Guest instructions per execution.
    pub instructions: u32,
    /// Guest bytes.
    pub len_bytes: u32,
    /// Terminator kind.
    pub terminator: TerminatorKind,
    /// `symbol+offset`, when known.
    pub symbol: Option<String>,
    /// Its guest code bytes, when they could be read at report time (see
    /// [`Profile::read_code`]).
    pub code: Option<Vec<u8>>,
    /// `(index in Profile::modules, offset in bytes from the module's start)` of the module
    /// containing it, once [`Profile::attribute_modules`] ran.
    pub module: Option<(usize, u64)>,
}

/// One ELF image the guest mapped (the program, its interpreter, the vDSO, a library; a
/// library dlopen'd twice is two entries).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleProfile {
    /// The mapped file (`[vdso]` for the vDSO).
    pub path: String,
    /// Guest address where its file offset 0 was mapped.
    pub base: u64,
    /// Bytes of address space it spans.
    pub size: u64,
    /// Its GNU build id, lowercase hex, when it has one.
    pub build_id: Option<String>,
    /// The guest unmapped it before the report (dlclose).
    pub unloaded: bool,
}

/// A direct edge between two blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EdgeProfile {
    /// Source block address.
    pub from: u64,
    /// Destination block address.
    pub to: u64,
    /// `taken`, `not_taken`, `jump`, `call`, `fallthrough`, `syscall`, or `other` (a
    /// transfer the terminator does not explain, e.g. a signal).
    pub kind: &'static str,
    /// Times taken.
    pub count: u64,
}

/// An indirect branch site and its observed targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndirectSite {
    /// Guest address of the indirect jump, call or return instruction.
    pub site: u64,
    /// `indirect_jump`, `indirect_call` or `return`.
    pub kind: TerminatorKind,
    /// Executions of the site.
    pub count: u64,
    /// `(target address, count)`, most frequent first.
    pub targets: Vec<(u64, u64)>,
}

/// One system call number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyscallProfile {
    /// Number (x86-64).
    pub nr: u32,
    /// Name, or `"unknown"`.
    pub name: &'static str,
    /// Calls.
    pub count: u64,
    /// `(guest address of the syscall instruction, count)`, most frequent first.
    pub sites: Vec<(u64, u64)>,
}

/// One superblock the translator built on the monitor's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperblockProfile {
    /// Guest address of its head (the loop head it was built for).
    pub head: u64,
    /// `symbol+offset` of the head, when known.
    pub symbol: Option<String>,
    /// Guest addresses of the basic blocks of its trace, in order (repeated when unrolled).
    pub blocks: Vec<u64>,
    /// Guest instructions of the whole trace.
    pub instructions: u64,
    /// Times it was entered (one event each).
    pub entries: u64,
    /// Entries that ran the whole trace.
    pub completed: u64,
    /// `(position in the trace, count)` of the entries that left after that block (a side
    /// exit, or a fault), by position.
    pub side_exits: Vec<(u32, u64)>,
}

/// Everything the reports show.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    pub totals: Totals,
    /// By address.
    pub blocks: Vec<BlockProfile>,
    /// By (from, to).
    pub edges: Vec<EdgeProfile>,
    /// By site.
    pub indirect: Vec<IndirectSite>,
    /// By number.
    pub syscalls: Vec<SyscallProfile>,
    /// Superblocks, most entered first.
    pub superblocks: Vec<SuperblockProfile>,
    /// Path profiles, when paths were recorded.
    pub paths: Option<PathProfile>,
    /// The guest's modules in mapping order (see [`Profile::attribute_modules`]).
    pub modules: Vec<ModuleProfile>,
    /// Per guest thread, in the order they started.
    pub threads: Vec<ThreadProfile>,
}

/// Blocks listed per thread in [`ThreadProfile::hottest`].
pub const THREAD_HOTTEST: usize = 20;

/// One guest thread's share of the profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadProfile {
    /// Its kernel thread id.
    pub tid: u32,
    /// Ring events it produced.
    pub events: u64,
    /// Block executions.
    pub blocks_executed: u64,
    /// Guest instructions executed.
    pub guest_instructions: u64,
    /// Times it found its ring full and waited for the monitor.
    pub ring_waits: u64,
    /// Time it waited for the monitor, in nanoseconds.
    pub ring_wait_ns: u64,
    /// Its most executed blocks `(guest address, executions)`, at most [`THREAD_HOTTEST`],
    /// most executed first.
    pub hottest: Vec<(u64, u64)>,
}

impl ThreadProfile {
    /// The profile of the thread `tid` whose events `tables` counted (every id known).
    pub fn from_tables(
        tid: u32,
        tables: &Tables,
        ring_waits: u64,
        ring_wait_ns: u64,
    ) -> ThreadProfile {
        let counts = tables.block_counts();
        let mut by_addr: HashMap<u64, u64> = HashMap::new();
        let (mut blocks_executed, mut guest_instructions) = (0, 0);
        for (b, &c) in tables.blocks.iter().zip(&counts) {
            if c == 0 {
                continue;
            }
            blocks_executed += c;
            guest_instructions += c * b.instructions as u64;
            *by_addr.entry(b.start.0).or_insert(0) += c;
        }
        let mut hottest = sorted_desc(by_addr);
        hottest.truncate(THREAD_HOTTEST);
        ThreadProfile {
            tid,
            events: tables.events,
            blocks_executed,
            guest_instructions,
            ring_waits,
            ring_wait_ns,
            hottest,
        }
    }
}

fn sorted_desc(m: HashMap<u64, u64>) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = m.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// The module of `modules` (in mapping order) that contains guest address `addr`: the latest
/// one still mapped, else the latest one unloaded (a block of a dlclose'd library).
pub fn module_of(modules: &[ModuleProfile], addr: u64) -> Option<usize> {
    let contains = |m: &ModuleProfile| m.base <= addr && addr - m.base < m.size;
    let mapped = modules.iter().rposition(|m| !m.unloaded && contains(m));
    mapped.or_else(|| modules.iter().rposition(contains))
}

impl Profile {
    /// Sets the module list and names every block's module and offset from it.
    pub fn attribute_modules(&mut self, modules: Vec<ModuleProfile>) {
        for b in &mut self.blocks {
            b.module = module_of(&modules, b.addr).map(|i| (i, b.addr - modules[i].base));
        }
        self.modules = modules;
    }

    /// Aggregates `tables` by guest address, naming blocks with `symbolize`.
    pub fn from_tables(tables: &Tables, symbolize: Symbolizer) -> Profile {
        let counts = tables.block_counts();
        let blocks = &tables.blocks;

        let mut by_addr: BTreeMap<u64, BlockProfile> = BTreeMap::new();
        let mut totals = Totals::default();
        for (id, b) in blocks.iter().enumerate() {
            let c = counts[id];
            totals.blocks_executed += c;
            totals.guest_instructions += c * b.instructions as u64;
            if c == 0 {
                continue;
            }
            let e = by_addr.entry(b.start.0).or_insert_with(|| BlockProfile {
                addr: b.start.0,
                count: 0,
                instructions: b.instructions,
                len_bytes: b.len_bytes,
                terminator: b.kind(),
                symbol: symbolize(b.start.0).map(|(s, off)| {
                    if off == 0 {
                        s
                    } else {
                        format!("{s}+{off:#x}")
                    }
                }),
                code: None,
                module: None,
            });
            e.count += c;
        }
        totals.distinct_blocks = by_addr.len() as u64;
        totals.events = tables.events;

        let mut edges: BTreeMap<(u64, u64, &'static str), u64> = BTreeMap::new();
        let mut indirect: BTreeMap<u64, (TerminatorKind, HashMap<u64, u64>)> = BTreeMap::new();
        for (from, to, c) in tables.edges() {
            let (Some(f), Some(t)) = (blocks.get(from as usize), blocks.get(to as usize)) else {
                continue;
            };
            let kind = match f.terminator {
                Terminator::Branch { taken, .. } if t.start == taken => "taken",
                Terminator::Branch { not_taken, .. } if t.start == not_taken => "not_taken",
                Terminator::Jump { target } if t.start == target => "jump",
                Terminator::Call { target, .. } if t.start == target => "call",
                Terminator::FallThrough { next } if t.start == next => "fallthrough",
                Terminator::Syscall { next } if t.start == next => "syscall",
                Terminator::IndirectJump | Terminator::IndirectCall { .. } | Terminator::Return => {
                    let site = indirect
                        .entry(f.terminator_addr.0)
                        .or_insert_with(|| (f.kind(), HashMap::new()));
                    *site.1.entry(t.start.0).or_insert(0) += c;
                    continue;
                }
                _ => "other",
            };
            *edges.entry((f.start.0, t.start.0, kind)).or_insert(0) += c;
        }
        let edges = edges
            .into_iter()
            .map(|((from, to, kind), count)| EdgeProfile {
                from,
                to,
                kind,
                count,
            })
            .collect();
        let indirect = indirect
            .into_iter()
            .map(|(site, (kind, targets))| {
                let targets = sorted_desc(targets);
                IndirectSite {
                    site,
                    kind,
                    count: targets.iter().map(|t| t.1).sum(),
                    targets,
                }
            })
            .collect();

        let mut syscalls: Vec<SyscallProfile> = tables
            .syscalls
            .iter()
            .map(|(&nr, s)| {
                let mut sites: HashMap<u64, u64> = HashMap::new();
                for (&id, &c) in &s.sites {
                    let addr = blocks
                        .get(tables.last_block(id) as usize)
                        .map(|b| b.terminator_addr.0)
                        .unwrap_or(0);
                    *sites.entry(addr).or_insert(0) += c;
                }
                SyscallProfile {
                    nr,
                    name: syscall_name(nr as u64).unwrap_or("unknown"),
                    count: s.count,
                    sites: sorted_desc(sites),
                }
            })
            .collect();
        syscalls.sort_by_key(|s| s.nr);

        let name = |a: u64| {
            symbolize(a).map(
                |(s, off)| {
                    if off == 0 {
                        s
                    } else {
                        format!("{s}+{off:#x}")
                    }
                },
            )
        };
        let mut superblocks: Vec<SuperblockProfile> = tables
            .superblock_runs()
            .into_iter()
            .filter_map(|(id, entries, exits)| {
                let trace = tables.trace(id)?;
                let addrs: Vec<u64> = trace.iter().map(|b| blocks[b.index()].start.0).collect();
                Some(SuperblockProfile {
                    head: addrs[0],
                    symbol: name(addrs[0]),
                    instructions: trace
                        .iter()
                        .map(|b| blocks[b.index()].instructions as u64)
                        .sum(),
                    blocks: addrs,
                    entries,
                    completed: entries - exits.iter().sum::<u64>(),
                    side_exits: exits
                        .iter()
                        .enumerate()
                        .filter(|(_, &c)| c > 0)
                        .map(|(i, &c)| (i as u32, c))
                        .collect(),
                })
            })
            .collect();
        superblocks.sort_by(|a, b| b.entries.cmp(&a.entries).then(a.head.cmp(&b.head)));

        Profile {
            totals,
            blocks: by_addr.into_values().collect(),
            edges,
            indirect,
            syscalls,
            superblocks,
            paths: None,
            modules: Vec::new(),
            threads: Vec::new(),
        }
    }

    /// Reads the guest code bytes of every block from this process's memory, where the guest
    /// image is mapped at its own addresses (so only while the guest's mappings still exist).
    /// Uses `process_vm_readv` on this process, which fails cleanly on unmapped memory. Code
    /// rewritten after it ran (self-modifying, JIT) shows its latest bytes.
    pub fn read_code(&mut self) {
        for b in &mut self.blocks {
            let mut buf = vec![0u8; b.len_bytes as usize];
            let local = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            let remote = libc::iovec {
                iov_base: b.addr as *mut libc::c_void,
                iov_len: buf.len(),
            };
            // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`, which we own; the
            // remote range is only read, and an unmapped one makes the call fail.
            let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
            if n == buf.len() as isize {
                b.code = Some(buf);
            }
        }
    }
}
