//! The dispatcher: finds or translates the block for a guest address, enters the code cache,
//! and acts on every exit (chaining direct branches, filling the indirect branch lookup table,
//! system calls, traps, ring refills).
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the thread's translator: its state, start, and what the embedder asks of it |
//! | `run.rs` | the dispatch loop: entering the code cache, exits, traps and faults |
//! | `translate.rs` | lookup or translate: placing persisted code, decoding, emitting, installing |
//! | `link.rs` | links noted as translations chain; invalidations and flushes |
//! | `kernel.rs` | system calls, threads started and ended, fork and exec |
//! | `superblocks.rs` | the monitor's commands: superblocks formed |
//! | `jump_tables.rs` | the thread's jump-table sites |

mod jump_tables;
mod kernel;
mod link;
mod run;
mod superblocks;
mod translate;

use std::collections::BTreeMap;
use std::sync::Arc;

use crossbeam::channel::Receiver;
use hotpath_events::{
    BlockCatalog, Command, IdKind, NewBlock, RingConsumer, RingProducer, MAX_TRACE_BLOCKS,
    SYSCALL_EVENT,
};
use hotpath_ir::{BlockId, GuestAddr, HostAddr, TrapKind};
use hotpath_loader::{GuestStack, Image};
use iced_x86::{Formatter, IntelFormatter};

use crate::backend::emit::{emit_block, EmitContext};
use crate::backend::gateway::{
    emit_gateway, Gateway, HostFeatures, EXIT_IBL_MISS, EXIT_RING_FULL, EXIT_SIGNAL,
    EXIT_SPECIAL_BASE,
};
use crate::backend::superblock::{emit_superblock, side_exit_id};
use crate::cache::code_cache::{CacheIndex, CodeCache, FIRST_REGION_SIZE};
use crate::cache::code_cache::{ExitKind, HostLayout};
use crate::cache::code_log::{CodeKind, CodeRecord};
use crate::cache::modules::FileId;
use crate::frontend::decode::{decode_block_split, MAX_BLOCK_INSTRUCTIONS};
pub use crate::host::config::{Config, Stats};
use crate::host::guest_mem;
use crate::host::syscall::{raw_syscall, GATE_REFUSED};
use crate::host::thread_area::{self, ThreadArea};
use crate::linux::kernel_writes;
use crate::linux::process::ThreadResources;
use crate::linux::process::{
    lock, CloneArgs, Memory, ProcessShared, ThreadCtl, ThreadPlace, ThreadStart,
};
use crate::linux::signals::{Delivery, GuestFault, HandlerSetup, SignalState};
use crate::linux::syscalls::{self, GuestExit, Outcome};
use crate::linux::thread::GuestThread;
use crate::persist::record::BlockRecord;
use crate::persist::Store;
use crate::runtime::special;
use crate::TranslateError;

/// Where to go next.
#[derive(Clone, Copy, Debug)]
enum Next {
    /// A guest address, to look up or translate.
    Guest(u64),
    /// A host address in the code cache.
    Host(HostAddr),
    /// An enqueue stub's entry to run again after a ring refill. Not a signal delivery point:
    /// the stub may have clobbered a register the guest does not read before writing it (see
    /// `emit::RcxSave`), which a handler would see in its frame. A pending signal is delivered
    /// at the end of the block instead (the dispatcher unlinks the blocks before resuming).
    Resume(HostAddr),
    /// A fault or trap was recorded: deliver it (the signal state knows the guest RIP).
    Signal,
}

/// Why [`Translator::run`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The guest ended.
    Exit(GuestExit),
    /// The guest asked to `execve`: write the profile, then call
    /// [`Translator::exec`]; if that returns, call `run` again.
    Exec,
    /// The guest asked to `fork` (or `vfork`, or `clone` without `CLONE_VM`): take the
    /// embedder's own locks that other threads may hold, call [`Translator::fork`], and
    /// release them; in the child, give it its own monitor (see
    /// [`Translator::set_block_sender`]). Then call `run` again, in both.
    Fork,
    /// This guest thread ended (`exit`) while others go on: its ring is closed; drop the
    /// translator and end the host thread.
    ThreadExit,
}

/// Which side of a [`Translator::fork`] this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forked {
    /// The parent (also when the fork failed: the guest gets the error).
    Parent,
    /// The new child process, with this thread alone.
    Child,
}

/// A guest `execve` waiting for the session to write the profile (see `Translator::exec`).
struct ExecRequest {
    nr: u64,
    args: [u64; 6],
    at: u64,
    rcx: u64,
    r11: u64,
}

/// What the embedder does when a thread's ring lap is full, before the thread waits for the
/// monitor to read it: starts a monitor that was put off (see
/// [`Translator::set_lap_full_hook`]).
pub type LapFullHook = std::sync::Arc<dyn Fn(&mut Translator) + Send + Sync>;

/// One guest thread's translator.
pub struct Translator {
    area: &'static mut ThreadArea,
    cache: CodeCache,
    gateway: Gateway,
    cfg: Config,
    /// What this thread knows about the translations in `cache`.
    index: CacheIndex,
    process: GuestThread,
    producer: Option<RingProducer>,
    /// Called when this thread's ring lap is full, before waiting for the monitor to read it
    /// (see [`Translator::set_lap_full_hook`]).
    lap_full_hook: Option<LapFullHook>,
    stats: Stats,
    /// Where `run` goes on.
    next: Next,
    /// The pending `execve`: `nr`, its arguments, the guest address of its `syscall`
    /// instruction and the guest's RCX and R11 before it (to make the call again after a
    /// signal that came first).
    exec_request: Option<ExecRequest>,
    /// The pending `fork`'s `clone` arguments.
    fork_request: Option<CloneArgs>,
    /// How to run an exec'd program under hotpath (`None`: natively).
    exec_wrapper: Option<crate::linux::exec::ExecWrapper>,
    /// This thread as the others see it.
    ctl: Arc<ThreadCtl>,
    host: HostFeatures,
    /// The vDSO's range when the guest was given it: code the guest may run that is not in
    /// its regions (`Memory::guest_run`).
    vdso: Option<(u64, u64)>,
    /// The code about to run, or that just ran, is one single-stepped instruction.
    stepping: bool,
    /// A resume after a ring refill was turned into a resume by guest address: the enqueue
    /// stub there may have left its value in a register the guest overwrites next (`RcxSave`),
    /// so no signal is delivered before the thread has run translated code again.
    hold_delivery: bool,
    /// That instruction ends in a single-step trap (not `syscall`).
    step_traps: bool,
    /// The monitor's requests.
    commands: Option<Receiver<Command>>,
    /// Print every translated block's host code (environment `HOTPATH_TRACE_TRANSLATION=1`).
    trace_translation: bool,
    /// Panic when the guest makes this system call (environment
    /// `HOTPATH_TEST_PANIC_AT_SYSCALL=NR`): how the tests make hotpath fail on a guest thread
    /// of their choosing, to see the process end and its profile written.
    panic_at_syscall: Option<u64>,
    /// The jump-table sites of the translations in `cache` (they go with it, as `index`).
    jump_tables: crate::backend::jump_table::Sites,
    /// The module of the persisted store the last block looked for came from (blocks are
    /// reached in runs from one module: no module list search, file id copy or store lookup
    /// per block).
    last_module: Option<Arc<PersistedModule>>,
    /// Guest pages (page numbers) this thread has noted in the process's list of pages
    /// translations were made from (`ProcessShared::note_code_pages`).
    code_pages_noted: rustc_hash::FxHashSet<u64>,
}

/// A module whose blocks the persisted store keeps, as [`Translator::persisted_module`] found
/// it for a guest address.
#[derive(Clone)]
struct PersistedModule {
    store: Arc<Store>,
    /// Guest address of the module's start (its blocks' offsets count from it).
    start: u64,
    file: FileId,
    /// Its records, read from the store file the first time (`None`: the store keeps nothing).
    records: Option<Arc<crate::persist::ModuleRecords>>,
    /// Guest addresses `[lo, hi)` where the module list finds this module.
    lo: u64,
    hi: u64,
    /// The module list's version when it was found.
    version: u64,
}

const ARCH_SET_GS: i32 = 0x1001;
const ARCH_GET_FS: i32 = 0x1003;

/// Builds every table iced-x86 builds on first use (the decoder's handlers, the encoder's, the
/// Intel formatter's), or waits for the thread that is building one, before a `fork`: a table
/// another thread was building at the fork stays half built in the child for good (its `Once`
/// waits for a thread the child does not have). A process whose blocks all came from the
/// translation cache first decodes late, in any thread, and a child forked meanwhile hung on
/// its first decode.
fn build_iced_tables() {
    use iced_x86::{Decoder, DecoderOptions, Encoder, InstructionInfoFactory};
    let nop = Decoder::with_ip(64, &[0x90], 0, DecoderOptions::NONE).decode();
    let _ = Encoder::new(64).encode(&nop, 0);
    let _ = InstructionInfoFactory::new().info(&nop);
    IntelFormatter::new().format(&nop, &mut String::new());
}

/// Makes `area` the calling thread's GS base.
fn set_gs(area: &ThreadArea) -> Result<(), TranslateError> {
    let addr = area as *const ThreadArea as u64;
    // SAFETY: arch_prctl on this thread with valid arguments; Rust does not use GS.
    let r = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_SET_GS, addr) };
    if r != 0 {
        return Err(TranslateError::Thread {
            reason: format!(
                "arch_prctl(ARCH_SET_GS): {}",
                std::io::Error::last_os_error()
            ),
        });
    }
    Ok(())
}

/// Maps a thread area for `cfg`'s ring and makes it the calling thread's GS base.
fn map_area(cfg: &Config, gateway: &Gateway) -> Result<&'static mut ThreadArea, TranslateError> {
    let area = ThreadArea::map(cfg.ring_entries, gateway.ibl_empty.0).map_err(|e| {
        TranslateError::Thread {
            reason: format!("mmap: {e}"),
        }
    })?;
    set_gs(area)?;
    Ok(area)
}

/// What the host signal handler needs to know about a thread's translator.
fn handler_setup(
    area: &mut ThreadArea,
    cache: &CodeCache,
    gateway: &Gateway,
    host: HostFeatures,
) -> HandlerSetup {
    HandlerSetup {
        area: area as *mut ThreadArea,
        regions: cache.region_table(),
        exit_from_signal: gateway.exit_from_signal.0,
        fsgsbase: host.fsgsbase,
        blocks: cache.block_map(),
        xsave_mask: host.xsave_mask,
    }
}

impl Translator {
    /// Sets up the code cache (in the image's extra reservation), the gateway and this thread's
    /// area (installed as the thread's GS base), with the guest about to start at the image's
    /// entry point on `stack`. Block metadata goes to the process's catalog
    /// ([`Translator::catalog`]).
    ///
    /// Must be called on the thread that will call [`run`](Self::run).
    ///
    /// # Errors
    /// [`TranslateError`] if the host lacks XSAVE, or a mapping or `arch_prctl` fails.
    pub fn new(
        image: &Image,
        stack: &GuestStack,
        cfg: Config,
    ) -> Result<Translator, TranslateError> {
        let host = HostFeatures::detect()?;
        let smc = Arc::new(crate::cache::smc::ProtectedPages::default());
        let mut cache = CodeCache::create(image.extra.0, image.extra.1)?;
        let gateway = emit_gateway(&mut cache, host)?;
        let area = map_area(&cfg, &gateway)?;
        let setup = handler_setup(area, &cache, &gateway, host);
        let signals =
            SignalState::install(setup, smc.clone()).map_err(|e| TranslateError::Thread {
                reason: format!("signal stack: {e}"),
            })?;
        area.gpr = [0; 16];
        area.gpr[thread_area::RSP] = stack.rsp;
        area.fs_base = 0;

        let mut memory = Memory {
            brk_start: image.brk_start,
            brk: image.brk_start,
            guest_regions: BTreeMap::new(),
            modules: Default::default(),
        };
        memory.modules.add(
            image.path.clone(),
            image.image_start,
            image.image_end,
            FileId::of_path(&image.path),
        );
        if let Some(interp) = &image.interpreter {
            memory.modules.add(
                interp.path.clone(),
                interp.range.0,
                interp.range.1,
                FileId::of_path(&interp.path),
            );
        }
        if let Some((start, end)) = crate::vdso_range().filter(|_| cfg.vdso) {
            memory
                .modules
                .add("[vdso]".into(), start, end, crate::vdso_file_id());
        }
        // Segment by segment: the holes between them are unmapped, and hotpath may map its
        // own memory there, which the guest must not unmap or re-protect.
        let interp_segments = image.interpreter.iter().flat_map(|i| &i.segments);
        for seg in image.segments.iter().chain(interp_segments) {
            memory.add_region(seg.start, seg.end);
        }
        memory.add_region(
            stack.base - hotpath_loader::STACK_GUARD,
            stack.base + stack.size,
        );
        let shared = Arc::new(ProcessShared::new(
            image.exe.clone(),
            memory,
            smc,
            signals.actions(),
        ));
        let resources = ThreadResources {
            cache,
            gateway,
            area,
            signals,
            kept: None,
        };
        if cfg.perf_map {
            *lock(&shared.code_log) = Some(Default::default());
        }
        let mut t = Translator::assemble(shared, resources, cfg, host);
        t.note_gateway();
        t.next = Next::Guest(image.start());
        Ok(t)
    }

    /// The translator of a new guest thread, on the host thread made for it (by the
    /// embedder's spawner, see [`set_spawner`](Self::set_spawner)): installs its area and
    /// signal state, stores its tid where the `clone` flags say, and tells the parent. Call
    /// [`run`](Self::run) next.
    ///
    /// # Errors
    /// [`TranslateError`] if a mapping fails (the parent's `clone` then fails with EAGAIN).
    pub fn start_thread(start: ThreadStart) -> Result<Translator, TranslateError> {
        let ThreadStart {
            process,
            cfg,
            gpr,
            rflags,
            fs_base,
            xsave,
            rip,
            clone,
            mask,
            reply,
            tsc_sigsegv,
        } = start;
        crate::host::cpu::set_tsc_sigsegv(tsc_sigsegv);
        let built = (|| {
            let host = HostFeatures::detect()?;
            let resources = match process.take_pooled(cfg.enqueue) {
                Some(mut r) => {
                    set_gs(r.area)?;
                    r.signals
                        .reset_for_thread()
                        .map_err(|e| TranslateError::Thread {
                            reason: format!("signal stack: {e}"),
                        })?;
                    r.area.ring.reset();
                    r
                }
                None => {
                    let mut cache = CodeCache::create_anywhere(FIRST_REGION_SIZE)?;
                    let gateway = emit_gateway(&mut cache, host)?;
                    let area = map_area(&cfg, &gateway)?;
                    let setup = handler_setup(area, &cache, &gateway, host);
                    let signals = SignalState::for_thread(
                        setup,
                        process.actions.clone(),
                        process.smc.clone(),
                    )
                    .map_err(|e| TranslateError::Thread {
                        reason: format!("signal stack: {e}"),
                    })?;
                    ThreadResources {
                        cache,
                        gateway,
                        area,
                        signals,
                        kept: None,
                    }
                }
            };
            Ok::<_, TranslateError>((resources, host))
        })();
        let (resources, host) = match built {
            Ok(r) => r,
            Err(e) => {
                let _ = reply.send(Err(e.to_string()));
                return Err(e);
            }
        };
        let mut t = Translator::assemble(process, resources, cfg, host);
        t.note_gateway();
        // Translations kept from an ended thread: what changed in guest code since goes
        // before any of them runs.
        t.take_invalidations();
        t.area.gpr = gpr;
        t.area.rflags = rflags;
        t.area.fs_base = fs_base;
        t.area.xsave.0[..xsave.len()].copy_from_slice(&xsave);
        t.next = Next::Guest(rip);
        let tid = t.ctl.tid;
        if clone.flags & libc::CLONE_CHILD_SETTID as u64 != 0 {
            let _ = guest_mem::write(clone.child_tid, &tid.to_le_bytes());
        }
        if clone.flags & libc::CLONE_PARENT_SETTID as u64 != 0 {
            let _ = guest_mem::write(clone.parent_tid, &tid.to_le_bytes());
        }
        if clone.flags & libc::CLONE_CHILD_CLEARTID as u64 != 0 {
            t.process.clear_child_tid = clone.child_tid;
        }
        // The guest's mask from the parent (the host thread was created with all blocked).
        crate::linux::signals::set_guest_mask(mask);
        let _ = reply.send(Ok(tid));
        Ok(t)
    }

    /// Builds a thread's translator around its resources, on its own host thread, and adds
    /// it to the process's live threads.
    fn assemble(
        shared: Arc<ProcessShared>,
        resources: ThreadResources,
        cfg: Config,
        host: HostFeatures,
    ) -> Translator {
        let ThreadResources {
            cache,
            gateway,
            area,
            signals,
            kept,
        } = resources;
        let mut fs = 0u64;
        // SAFETY: ARCH_GET_FS writes one u64 into `fs`.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_GET_FS, &mut fs as *mut u64) };
        area.host_fs_base = fs;
        let producer = if cfg.enqueue {
            // SAFETY: the area (and so the ring control) is never unmapped; this thread is the
            // ring's only producer.
            Some(unsafe { RingProducer::new(&area.ring, area.entries() as *mut u32) })
        } else {
            None
        };
        let tid = raw_syscall(libc::SYS_gettid as u64, &[0; 6]) as u32;
        // SAFETY: the area is mapped for the process's life; the control block is only read
        // (closed) through this reference.
        let ring: &'static hotpath_events::RingControl =
            unsafe { &*(&area.ring as *const hotpath_events::RingControl) };
        let ctl = Arc::new(ThreadCtl::new(tid, signals.handler(), ring));
        lock(&shared.threads).push(ctl.clone());
        // Whom a write the handler catches sends out of the code cache (see `smc`).
        shared
            .smc
            .join(signals.handler() as *const crate::linux::signals::HandlerShared as *const ());
        shared
            .threads_started
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (index, jump_tables) = match kept {
            Some(k) => (k.index, k.jump_tables),
            None => (
                CacheIndex::new(shared.invalidation_count()),
                Default::default(),
            ),
        };
        let process = GuestThread {
            exe: shared.exe.clone(),
            shared,
            invalidate: Vec::new(),
            signals,
            maps: Default::default(),
            clear_child_tid: 0,
            seccomp_strict: false,
        };
        Translator {
            area,
            cache,
            gateway,
            cfg,
            index,
            process,
            producer,
            lap_full_hook: None,
            stats: Stats::default(),
            next: Next::Guest(0),
            exec_request: None,
            fork_request: None,
            exec_wrapper: None,
            ctl,
            host,
            vdso: crate::vdso_range().filter(|_| cfg.vdso),
            stepping: false,
            hold_delivery: false,
            step_traps: false,
            commands: None,
            trace_translation: std::env::var_os("HOTPATH_TRACE_TRANSLATION").is_some(),
            panic_at_syscall: std::env::var("HOTPATH_TEST_PANIC_AT_SYSCALL")
                .ok()
                .and_then(|v| v.parse().ok()),
            jump_tables,
            last_module: None,
            code_pages_noted: Default::default(),
        }
    }

    /// The consumer end of this thread's event ring, for the monitor thread.
    pub fn ring_consumer(&self) -> RingConsumer {
        // SAFETY: the area is never unmapped, so the control block and entries outlive the
        // consumer; the caller creates one consumer per ring.
        unsafe { RingConsumer::new(&self.area.ring, self.area.entries()) }
    }

    /// The producer handle (to close the ring and wait for the monitor at the end).
    pub fn ring_producer(&self) -> Option<&RingProducer> {
        self.producer.as_ref()
    }

    /// The ELF images mapped into the guest so far, in mapping order.
    pub fn modules(&self) -> Vec<crate::cache::modules::GuestModule> {
        lock(&self.process.shared.memory).modules.all().to_vec()
    }

    /// A handle that lists the process's modules from another thread (the monitor names a
    /// thread's path profile when the thread ends).
    pub fn module_source(&self) -> ModuleSource {
        ModuleSource(self.process.shared.clone())
    }

    /// Records that `layout`'s code is in the cache, when host profilers asked
    /// ([`Config::perf_map`]).
    pub(crate) fn note_code(&self, layout: &HostLayout, kind: CodeKind) {
        if let Some(log) = lock(&self.process.shared.code_log).as_mut() {
            log.push(CodeRecord {
                host_start: layout.code_start,
                host_end: layout.code_end,
                guest: layout.guest_start,
                kind,
            });
        }
    }

    /// Records this thread's gateway (after the cache or the thread is made).
    fn note_gateway(&self) {
        if let Some(log) = lock(&self.process.shared.code_log).as_mut() {
            let (start, end) = self.cache.gateway_range();
            log.push(CodeRecord {
                host_start: start,
                host_end: end,
                guest: 0,
                kind: CodeKind::Gateway,
            });
        }
    }

    /// Where the process's translated code is now, by host address (empty unless
    /// [`Config::perf_map`]): every block, superblock block, context stub, jump-table stub and
    /// gateway of every thread whose code is still where it was put.
    pub fn code_records(&self) -> Vec<CodeRecord> {
        lock(&self.process.shared.code_log)
            .as_ref()
            .map_or_else(Vec::new, |log| log.current())
    }

    /// Reads and adds to the persisted translations in the cache directory `dir` (see
    /// [`crate::persist`]); a directory that cannot be used is counted in
    /// [`Self::cache_stats`] and otherwise ignored.
    pub fn use_translation_cache(&self, dir: &std::path::Path) {
        let key =
            crate::persist::EmitKey::current(self.cfg.enqueue.then_some(self.cfg.ring_entries));
        let _ = self
            .process
            .shared
            .store
            .set(Arc::new(Store::new(dir, key)));
    }

    /// Writes the blocks translated afresh since the last call into the cache directory, with
    /// this process's hits and misses (when [`Self::use_translation_cache`] was called).
    pub fn write_translation_cache(&self) {
        let Some(store) = self.process.shared.store.get() else {
            return;
        };
        let s = self.stats();
        store.write(s.blocks_loaded, s.blocks_missed);
    }

    /// The persisted store's counters (`None` without a cache).
    pub fn cache_stats(&self) -> Option<crate::persist::StoreStats> {
        self.process.shared.store.get().map(|s| s.stats())
    }

    /// Counters so far, of every thread of the process.
    pub fn stats(&self) -> Stats {
        self.publish_stats();
        self.process.shared.stats()
    }

    /// What makes this guest thread come to its dispatcher (which then reads the monitor's
    /// commands), callable from any thread: with `None` at its next block boundary, with guest
    /// addresses the next time it goes to one of them (`HandlerShared::kick_at`).
    pub fn waker(&self) -> hotpath_events::Waker {
        let handler = self.ctl.handler;
        std::sync::Arc::new(move |targets| handler.kick_at(targets))
    }

    /// This thread's kernel thread id.
    pub fn tid(&self) -> u32 {
        self.ctl.tid
    }

    /// Guest threads started so far, the first included.
    pub fn threads_started(&self) -> u32 {
        self.process
            .shared
            .threads_started
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets what runs each time this thread's ring lap is full, before the thread waits for
    /// a monitor to read the lap: the embedder starts its monitor there when it put it off
    /// (no thread reads the ring until then, and without one the wait would not end). A
    /// forked child keeps its parent's hook.
    pub fn set_lap_full_hook(&mut self, hook: LapFullHook) {
        self.lap_full_hook = Some(hook);
    }

    /// Gives the process the function that creates a host thread for each new guest thread
    /// (it calls [`start_thread`](Self::start_thread) there). Without one, a guest `clone` of
    /// a thread fails with EAGAIN.
    pub fn set_spawner(&self, spawner: crate::linux::process::Spawner) {
        *lock(&self.process.shared.spawner) = Some(spawner);
    }

    /// Stops every other guest thread before the process ends (see
    /// [`ProcessShared::stop_others`]), and closes this thread's ring.
    pub fn stop_other_threads(&self) -> Vec<u32> {
        let late = self.process.shared.stop_others(self.ctl.tid);
        self.publish_stats();
        late
    }

    /// After a failed `execve` (the guest goes on): the process is not ending. An exec the
    /// kernel surely refuses (a missing or non-executable file) never gets here, and the
    /// other threads go on; one that fails later (the kernel refuses hotpath's own exec, e.g.
    /// E2BIG) leaves the threads stopped for it stopped, a known limit.
    pub fn exec_failed(&self) {
        self.process
            .shared
            .exiting
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    fn publish_stats(&self) {
        *lock(&self.ctl.stats) = self.stats;
    }
}

/// A translation's hot part `code` at host address `at` and its cold part `cold` at `cold_at`
/// (none when empty), disassembled one instruction per line.
fn disassemble_parts(code: &[u8], at: u64, cold: &[u8], cold_at: u64) -> String {
    let mut out = disassemble(code, at);
    if !cold.is_empty() {
        out.push_str("  cold part:\n");
        out.push_str(&disassemble(cold, cold_at));
    }
    out
}

/// Host code `code` at host address `at`, disassembled one instruction per line.
fn disassemble(code: &[u8], at: u64) -> String {
    let mut decoder = iced_x86::Decoder::with_ip(64, code, at, iced_x86::DecoderOptions::NONE);
    let mut formatter = IntelFormatter::new();
    let mut out = String::new();
    for inst in &mut decoder {
        out.push_str(&format!("  {:x}  ", inst.ip()));
        formatter.format(&inst, &mut out);
        out.push('\n');
    }
    out
}

/// Bytes from guest `addr` (at most `len`) in consecutive guest regions or the vDSO given to
/// the guest (`vdso`): what the guest may fetch code from. hotpath's own executable mappings
/// (code caches, its binary and libraries) are not the guest's: a jump there faults as into
/// nothing, natively.
fn guest_run(shared: &ProcessShared, vdso: Option<(u64, u64)>, addr: u64, len: u64) -> u64 {
    if let Some((s, e)) = vdso {
        if addr >= s && addr < e {
            return len.min(e - addr);
        }
    }
    lock(&shared.memory).guest_run(addr, len)
}

/// Lists a process's modules from any thread ([`crate::Translator::module_source`]).
pub struct ModuleSource(Arc<crate::linux::process::ProcessShared>);

impl ModuleSource {
    /// The ELF images mapped into the guest now, in mapping order; `None` while a guest
    /// thread holds the process's memory map (it may be waiting for the monitor, which must
    /// not wait for it in turn).
    pub fn try_modules(&self) -> Option<Vec<crate::cache::modules::GuestModule>> {
        let memory = self.0.memory.try_lock().ok()?;
        Some(memory.modules.all().to_vec())
    }
}
