//! The dispatcher: finds or translates the block for a guest address, enters the code cache,
//! and acts on every exit (chaining direct branches, filling the indirect branch lookup table,
//! system calls, traps, ring refills).

mod jump_tables;

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
use crate::backend::superblock::{emit_superblock, side_exit_id};
use crate::cache::code_cache::{CacheIndex, CodeCache, FIRST_REGION_SIZE};
use crate::cache::code_cache::{ExitKind, HostLayout};
use crate::cache::code_log::{CodeKind, CodeRecord};
use crate::cache::modules::FileId;
use crate::cache::persist::record::BlockRecord;
use crate::cache::persist::Store;
use crate::frontend::decode::{decode_block_split, MAX_BLOCK_INSTRUCTIONS};
use crate::linux::host::{raw_syscall, GATE_REFUSED};
use crate::linux::kernel_writes;
use crate::linux::process::ThreadResources;
use crate::linux::process::{
    lock, CloneArgs, Memory, ProcessShared, ThreadCtl, ThreadPlace, ThreadStart,
};
use crate::linux::signals::{Delivery, GuestFault, HandlerSetup, SignalState};
use crate::linux::syscalls::{self, GuestExit, Outcome};
use crate::linux::thread::GuestThread;
pub use crate::runtime::config::{Config, Stats};
use crate::runtime::gateway::{
    emit_gateway, Gateway, HostFeatures, EXIT_IBL_MISS, EXIT_RING_FULL, EXIT_SIGNAL,
    EXIT_SPECIAL_BASE,
};
use crate::runtime::guest_mem;
use crate::runtime::special;
use crate::runtime::thread_area::{self, IblEntry, ThreadArea};
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
}

/// A module whose blocks the persisted store keeps, as [`Translator::persisted_module`] found
/// it for a guest address.
struct PersistedModule {
    store: Arc<Store>,
    /// Guest address of the module's start (its blocks' offsets count from it).
    start: u64,
    file: FileId,
    /// Its records, read from the store file the first time (`None`: the store keeps nothing).
    records: Option<Arc<crate::cache::persist::ModuleRecords>>,
    /// Guest addresses `[lo, hi)` where the module list finds this module.
    lo: u64,
    hi: u64,
    /// The module list's version when it was found.
    version: u64,
}

/// Most entries of [`CacheIndex::linked`] left unsorted: what a kick reads one by one.
const LINKED_UNSORTED: usize = 2048;

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
        xsave_size: host.xsave_size as usize,
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
            memory.modules.add("[vdso]".into(), start, end, None);
        }
        memory.add_region(image.image_start, image.image_end);
        if let Some(interp) = &image.interpreter {
            memory.add_region(interp.range.0, interp.range.1);
        }
        memory.add_region(
            stack.base - hotpath_loader::STACK_GUARD,
            stack.base + stack.size,
        );
        let shared = Arc::new(ProcessShared::new(
            image.path.clone(),
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
        crate::runtime::cpu::set_tsc_sigsegv(tsc_sigsegv);
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
    /// [`crate::cache::persist`]); a directory that cannot be used is counted in
    /// [`Self::cache_stats`] and otherwise ignored.
    pub fn use_translation_cache(&self, dir: &std::path::Path) {
        let key = crate::cache::persist::EmitKey::current(
            self.cfg.enqueue.then_some(self.cfg.ring_entries),
        );
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
    pub fn cache_stats(&self) -> Option<crate::cache::persist::StoreStats> {
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

    /// Runs the guest until it exits, dies, or needs its embedder (exec, fork).
    ///
    /// # Errors
    /// [`TranslateError`] when the guest needs something hotpath does not support, or a guest
    /// instruction cannot be translated.
    pub fn run(&mut self) -> Result<Stop, TranslateError> {
        self.run_until_stop()
    }

    /// [`Translator::run`]'s loop.
    fn run_until_stop(&mut self) -> Result<Stop, TranslateError> {
        loop {
            if self
                .process
                .shared
                .exiting
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                self.park();
            }
            self.process.signals.take_kick();
            self.take_invalidations();
            let mut next = self.next;
            let resuming =
                matches!(next, Next::Resume(_)) || std::mem::take(&mut self.hold_delivery);
            if matches!(next, Next::Signal) || (!resuming && self.process.signals.deliverable()) {
                let rip = self.guest_rip_settled(next);
                self.guest_fpu_ip();
                match self.process.signals.deliver(self.area, rip) {
                    Delivery::Continue(to) => next = Next::Guest(to),
                    Delivery::Exit(sig) => return Ok(Stop::Exit(GuestExit::Signaled(sig))),
                }
            }
            let written = self.process.signals.protected_pages().take_hits();
            if !written.is_empty() {
                // The guest wrote into pages whose code was translated: resume at the guest
                // address (the host code may be about to go) and discard the translations.
                next = Next::Guest(self.guest_rip_settled(next));
                self.process.invalidate.extend(written);
                self.apply_invalidations();
            }
            self.arm_safe_point();
            self.poll_commands();
            if let Next::Guest(pc) = next {
                let last = self.process.signals.last_trap();
                if let Some(action) = special::vsyscall(pc, &mut self.process.maps, self.area, last)
                {
                    self.next = self.act(action)?;
                    continue;
                }
            }
            let tf = self.area.rflags & special::EFLAGS_TF != 0;
            self.stepping = tf;
            let host = match next {
                // EFLAGS.TF: one guest instruction at a time, a SIGTRAP after each.
                Next::Guest(_) | Next::Host(_) if tf => match self.step_entry(next)? {
                    Ok(h) => h,
                    Err(n) => {
                        self.next = n;
                        continue;
                    }
                },
                Next::Guest(pc) => self.lookup_or_translate(pc)?,
                Next::Host(h) | Next::Resume(h) => h,
                Next::Signal => unreachable!("delivery always yields a guest address"),
            };
            // From here to the cache a signal's handler may unlink blocks; a signal that came
            // during the critical section is caught by this check instead.
            self.process.signals.set_critical(false, &self.index);
            if self.process.signals.kicked() {
                // Another thread has news for this one (see `run`'s top).
                self.process.signals.set_critical(true, &self.index);
                self.next = if resuming {
                    next
                } else {
                    Next::Guest(self.guest_rip_settled(Next::Host(host)))
                };
                continue;
            }
            if self.process.signals.deliverable() {
                if resuming {
                    // Run the block to its end, where it leaves the cache unchained.
                    self.process.signals.unlink_now(self.area);
                } else {
                    self.process.signals.set_critical(true, &self.index);
                    self.next = Next::Guest(self.guest_rip_settled(Next::Host(host)));
                    continue;
                }
            }
            self.area.jump_to = host.0;
            if self.stepping {
                // The host does not trap: the dispatcher raises the guest's trap afterwards.
                self.area.rflags &= !special::EFLAGS_TF;
            }
            self.enter();
            if self.stepping {
                self.area.rflags |= special::EFLAGS_TF;
            }
            self.process.signals.set_critical(true, &self.index);
            let exit = self.handle_exit();
            let stepped = std::mem::take(&mut self.stepping);
            match exit? {
                Ok(n) => {
                    self.next = n;
                    // The instruction ran (a fault or a ring refill stopped it short otherwise).
                    if stepped && self.step_traps && !matches!(n, Next::Signal | Next::Resume(_)) {
                        let rip = self.guest_rip_settled(n);
                        self.process.signals.raise(special::single_step(rip));
                        self.next = Next::Signal;
                    }
                }
                Err(stop) => return Ok(stop),
            }
        }
    }

    /// Another thread ends the process: stop here for good (the process's end kills this
    /// host thread). The ring is closed first, so the monitor can finish.
    fn park(&mut self) -> ! {
        self.publish_stats();
        if let Some(p) = &self.producer {
            p.close();
        }
        crate::linux::signals::block_all();
        self.ctl.set_place(ThreadPlace::Parked);
        loop {
            std::thread::park();
        }
    }

    /// Applies the code invalidations other threads published since this one last looked
    /// (their `munmap`, `mprotect`, code writes...).
    fn take_invalidations(&mut self) {
        if let Some((ranges, seen)) = self
            .process
            .shared
            .invalidations_since(self.index.invalidations_seen)
        {
            self.index.invalidations_seen = seen;
            // A host address to go on at (a block just linked or looked up) may be in code the
            // discard flushes: go on at its guest address instead, as after a caught write.
            if !matches!(self.next, Next::Signal) {
                self.next = Next::Guest(self.guest_rip_settled(self.next));
            }
            self.discard(&ranges);
        }
    }

    /// Makes every block entry's check pass again: when the monitor is on and the ring's lap
    /// is full, waits for the monitor to read it and starts the next one.
    fn arm_safe_point(&mut self) {
        if let Some(p) = &self.producer {
            p.refill();
        }
    }

    /// [`Translator::guest_rip`] for a dispatcher that goes on at the guest address instead of
    /// `next`'s host address.
    fn guest_rip_settled(&mut self, next: Next) -> u64 {
        if matches!(next, Next::Resume(_)) {
            self.hold_delivery = true;
        }
        self.guest_rip(next)
    }

    /// The guest address the guest would resume at for `next`.
    fn guest_rip(&self, next: Next) -> u64 {
        match next {
            Next::Guest(pc) => pc,
            // A resume at a block entry (after a ring refill).
            Next::Host(h) | Next::Resume(h) => self
                .cache
                .layouts()
                .floor(h.0)
                .map(|l| l.guest_start)
                .unwrap_or(0),
            Next::Signal => 0,
        }
    }

    /// Performs the guest's pending `execve` (after [`Stop::Exec`]). Returns only if it
    /// failed; the guest then sees the error and `run` goes on.
    pub fn exec(&mut self) {
        if let Some(r) = self.exec_request.take() {
            let ret =
                crate::linux::exec::exec(&self.process, self.exec_wrapper.as_ref(), r.nr, &r.args);
            if ret == GATE_REFUSED {
                // A signal came before the call (while the profile was written, say): it is
                // delivered first, then the `syscall` instruction runs again, as natively.
                // Made anyway, the new image would never see it.
                self.area.gpr[thread_area::RCX] = r.rcx;
                self.area.gpr[thread_area::R11] = r.r11;
                self.next = Next::Guest(r.at);
            } else {
                self.area.gpr[thread_area::RAX] = ret as u64;
            }
        }
    }

    /// Runs the programs the guest execs under hotpath as `wrapper` says (`None`, the
    /// default: natively).
    pub fn set_exec_wrapper(&mut self, wrapper: Option<crate::linux::exec::ExecWrapper>) {
        self.exec_wrapper = wrapper;
    }

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
    fn poll_commands(&mut self) {
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
    fn form_superblock(&mut self, ids: &[BlockId], replace: bool) -> bool {
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
                disassemble(&trace.code, at.0)
            );
        }
        self.cache.insert(&trace.code);
        for &(_, slot, _) in &folded {
            self.depend_on_slot(slot);
        }
        if let (Some((pattern, number)), Some(code), Some(jmp)) =
            (site, trace.jump_table, last.term_inst.as_ref())
        {
            let s = crate::backend::jump_table::Site {
                pattern,
                id: sb,
                from: last.start,
                jmp_at: GuestAddr(jmp.inst.ip()),
                general: code.general,
            };
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
        self.cache.patch_jump(old_entry, trace.entry);
        let slot = &mut self.area.ibl[ThreadArea::ibl_index(head)];
        if slot.holds(head) {
            slot.host = trace.entry.0;
        }
        self.stats.superblocks += 1;
        true
    }

    /// Runs translated code from `area.jump_to` until it exits to the dispatcher.
    fn enter(&mut self) {
        // SAFETY: `enter` is the gateway routine emitted for this ABI: it saves the host's
        // callee-saved registers, MXCSR and x87 control word, swaps in the guest's FS base and
        // state from this thread's area (GS base), and returns here, with everything restored,
        // when translated code jumps to the exit routine. The code cache is live and only this
        // thread executes it.
        let enter: extern "sysv64" fn() =
            unsafe { std::mem::transmute(self.gateway.enter.0 as usize) };
        enter();
    }

    /// Acts on the exit recorded in the area: `Ok(Ok(next))` to go on, `Ok(Err(stop))` to
    /// return to the embedder.
    fn handle_exit(&mut self) -> Result<Result<Next, Stop>, TranslateError> {
        let code = self.area.exit_code as u32;
        match code {
            EXIT_RING_FULL => {
                self.stats.ring_refills += 1;
                Ok(Ok(Next::Resume(HostAddr(self.area.resume))))
            }
            EXIT_SIGNAL => {
                if let Some((what, at)) = self.process.signals.take_refusal() {
                    return Err(TranslateError::UnsupportedGuest { at, what });
                }
                self.correct_fault();
                // A fault inside a superblock ended its trace early: say where, in order.
                if let (Some(p), Some(m)) = (&self.producer, self.process.signals.trace_exit()) {
                    p.push(m);
                }
                Ok(Ok(Next::Signal))
            }
            EXIT_IBL_MISS => {
                self.stats.ibl_misses += 1;
                self.lookup_miss(self.area.ibl_target)
            }
            index => {
                let exit = self.index.exits[index as usize];
                match exit.kind {
                    ExitKind::Direct { target, site, .. } => {
                        let generation = self.index.generation;
                        let host = self.lookup_or_translate(target.0)?;
                        // A single-step block always comes back here.
                        if generation == self.index.generation && !self.stepping {
                            self.cache.patch_rel32(site, host);
                            self.note_link(target.0, index);
                            self.stats.links += 1;
                        }
                        Ok(Ok(Next::Host(host)))
                    }
                    ExitKind::JumpTableFill { site } => Ok(Ok(self.fill_jump_table(site)?)),
                    // A signal that arrived before the `syscall` instruction is delivered
                    // first, as on hardware; the handler returns to the instruction.
                    ExitKind::Syscall { at, .. } if self.process.signals.deliverable() => {
                        Ok(Ok(Next::Guest(at.0)))
                    }
                    ExitKind::Syscall { next, .. } => self.syscall(next.0),
                    ExitKind::SideExit { marker, target } => {
                        if let Some(p) = &self.producer {
                            p.push(marker.0);
                        }
                        Ok(Ok(Next::Guest(target.0)))
                    }
                    ExitKind::SideExitReturn { marker, at, pop } => {
                        if let Some(p) = &self.producer {
                            p.push(marker.0);
                        }
                        let rsp = self.area.gpr[thread_area::RSP];
                        let mut ret = [0u8; 8];
                        match guest_mem::read(rsp, &mut ret) {
                            Ok(()) if !special::canonical(u64::from_le_bytes(ret)) => {
                                let target = u64::from_le_bytes(ret);
                                let fault =
                                    special::noncanonical_branch(None, target, self.area, false);
                                // The `ret` itself faults, with nothing popped.
                                let fault = GuestFault { rip: at.0, ..fault };
                                self.process.signals.raise(fault);
                                Ok(Ok(Next::Signal))
                            }
                            Ok(()) => {
                                self.area.gpr[thread_area::RSP] = rsp.wrapping_add(pop as u64);
                                Ok(Ok(Next::Guest(u64::from_le_bytes(ret))))
                            }
                            // The stack went away since the compare read it: let the `ret`
                            // itself fault.
                            Err(_) => Ok(Ok(Next::Guest(at.0))),
                        }
                    }
                    ExitKind::SideExitIndirect {
                        marker,
                        at,
                        return_to,
                    } => {
                        if let Some(p) = &self.producer {
                            p.push(marker.0);
                        }
                        let target = self.area.ibl_target;
                        if !special::canonical(target) {
                            // The branch itself faults, with nothing pushed.
                            let fault =
                                special::noncanonical_branch(None, target, self.area, false);
                            self.process
                                .signals
                                .raise(GuestFault { rip: at.0, ..fault });
                            return Ok(Ok(Next::Signal));
                        }
                        if let Some(ret) = return_to {
                            let rsp = self.area.gpr[thread_area::RSP].wrapping_sub(8);
                            if guest_mem::write(rsp, &ret.0.to_le_bytes()).is_err() {
                                // The stack cannot take the return address: let the `call`
                                // itself fault.
                                return Ok(Ok(Next::Guest(at.0)));
                            }
                            self.area.gpr[thread_area::RSP] = rsp;
                        }
                        Ok(Ok(Next::Guest(target)))
                    }
                    ExitKind::Trap { kind, at, next } => self.trap(kind, at, next).map(Ok),
                }
            }
        }
    }

    /// An indirect branch to `target` that the lookup table does not hold: fault at a
    /// non-canonical target (at the branch, as the CPU does), else translate it and fill the
    /// table's slot.
    fn lookup_miss(&mut self, target: u64) -> Result<Result<Next, Stop>, TranslateError> {
        if !special::canonical(target) {
            // The CPU faults at the branch, not at its target.
            let site = self.branch_at(self.area.ibl_site);
            let fault = special::noncanonical_branch(site, target, self.area, false);
            self.process.signals.raise(fault);
            return Ok(Ok(Next::Signal));
        }
        if target >= special::VSYSCALL_PAGE {
            return Ok(Ok(Next::Guest(target)));
        }
        let host = self.lookup_or_translate(target)?;
        self.area.ibl[ThreadArea::ibl_index(target)] = IblEntry::new(target, host.0);
        Ok(Ok(Next::Host(host)))
    }

    fn syscall(&mut self, next: u64) -> Result<Result<Next, Stop>, TranslateError> {
        self.stats.syscalls += 1;
        let g = &self.area.gpr;
        let nr = g[thread_area::RAX];
        if let Some(p) = &self.producer {
            p.push(SYSCALL_EVENT | (nr as u32 & !SYSCALL_EVENT));
        }
        if self.panic_at_syscall == Some(nr) {
            panic!("injected at system call {nr} (HOTPATH_TEST_PANIC_AT_SYSCALL)");
        }
        let g = &self.area.gpr;
        let args = [
            g[thread_area::RDI],
            g[thread_area::RSI],
            g[thread_area::RDX],
            g[thread_area::R10],
            g[thread_area::R8],
            g[thread_area::R9],
        ];
        let at = next - 2; // `syscall` is 2 bytes
        let (rcx, r11) = (
            self.area.gpr[thread_area::RCX],
            self.area.gpr[thread_area::R11],
        );
        // As the kernel's `sysret` leaves them: RCX = next RIP, R11 = RFLAGS.
        self.area.gpr[thread_area::RCX] = next;
        self.area.gpr[thread_area::R11] = self.area.rflags;
        if nr == special::SYS_URETPROBE {
            // Only the kernel's uretprobe trampoline may make it: from anywhere else the
            // kernel kills the call with SIGILL (and RAX = -1).
            self.area.gpr[thread_area::RAX] = u64::MAX;
            let last = self.process.signals.last_trap();
            self.process.signals.raise(special::uretprobe(next, last));
            return Ok(Ok(Next::Signal));
        }
        self.ctl.set_place(ThreadPlace::InSyscall);
        // Memory the call changes without a store the write fault sees (buffers in protected
        // code pages, /proc/self/mem, madvise): as the guest left it, its code discarded.
        kernel_writes::before_call(&mut self.process, nr, &args);
        let mut outcome = syscalls::dispatch(&mut self.process, self.area, nr, &args);
        if matches!(outcome, Outcome::Return(r) if r == -(libc::EFAULT as i64))
            && self.process.signals.protected_pages().any()
        {
            // The fallback for calls `kernel_writes` does not know (see its module doc: a call
            // that consumed input before the copy failed loses it): the kernel may have
            // refused to write into a page hotpath write-protected to watch its code, so every
            // such page gets its protection back and the call is made again.
            let pages = self.process.signals.protected_pages().unprotect_all();
            self.process.invalidate.extend(pages);
            outcome = syscalls::dispatch(&mut self.process, self.area, nr, &args);
        }
        if self.cache_in_the_way(nr, &args, &outcome) {
            // The guest asked for memory where this thread's code cache is: the cache moves
            // away (the guest's memory is the guest's), and the call is made again.
            self.move_cache()?;
            outcome = syscalls::dispatch(&mut self.process, self.area, nr, &args);
        }
        if let Outcome::Return(ret) = outcome {
            kernel_writes::after_call(&mut self.process, nr, &args, ret);
        }
        self.ctl.set_place(ThreadPlace::Running);
        self.process.signals.refresh_gate();
        match outcome {
            Outcome::Return(GATE_REFUSED) => {
                // A signal came before the call: deliver it, then make the call again.
                self.area.gpr[thread_area::RCX] = rcx;
                self.area.gpr[thread_area::R11] = r11;
                Ok(Ok(Next::Guest(at)))
            }
            Outcome::Return(ret)
                if ret == -(libc::EINTR as i64)
                    && syscalls::is_restartable(nr)
                    && self.process.signals.next_restarts() =>
            {
                // The kernel would restart it after the handler (SA_RESTART): the handler's
                // frame returns to the `syscall` instruction with the call number in RAX.
                self.area.gpr[thread_area::RCX] = rcx;
                self.area.gpr[thread_area::R11] = r11;
                Ok(Ok(Next::Guest(at)))
            }
            Outcome::Return(ret) => {
                self.area.gpr[thread_area::RAX] = ret as u64;
                self.apply_invalidations();
                Ok(Ok(Next::Guest(next)))
            }
            Outcome::Resume(rip) => Ok(Ok(Next::Guest(rip))),
            Outcome::Exit(exit) => Ok(Err(Stop::Exit(exit))),
            Outcome::Unsupported(message) => Err(TranslateError::UnsupportedSyscall { message }),
            Outcome::Exec => {
                self.exec_request = Some(ExecRequest {
                    nr,
                    args,
                    at,
                    rcx,
                    r11,
                });
                self.next = Next::Guest(next);
                Ok(Err(Stop::Exec))
            }
            Outcome::Fork(clone) => {
                self.fork_request = Some(clone);
                self.next = Next::Guest(next);
                Ok(Err(Stop::Fork))
            }
            Outcome::Thread(clone) => {
                let ret = self.spawn_thread(clone, next);
                self.area.gpr[thread_area::RAX] = ret as u64;
                Ok(Ok(Next::Guest(next)))
            }
            Outcome::ThreadExit(code) => Ok(Err(self.exit_thread(code))),
        }
    }

    /// Starts a guest thread (`clone` with `CLONE_VM | CLONE_THREAD`) that goes on at guest
    /// `next` on a host thread of its own. Returns its tid, or a negative errno.
    fn spawn_thread(&mut self, clone: CloneArgs, next: u64) -> i64 {
        let Some(spawner) = lock(&self.process.shared.spawner).clone() else {
            return -(libc::EAGAIN as i64);
        };
        self.publish_stats();
        let mut gpr = self.area.gpr;
        gpr[thread_area::RAX] = 0;
        if clone.stack != 0 {
            gpr[thread_area::RSP] = clone.stack;
        }
        let fs_base = if clone.flags & libc::CLONE_SETTLS as u64 != 0 {
            clone.tls
        } else {
            self.area.fs_base
        };
        let (tx, rx) = crossbeam::channel::bounded(1);
        let start = ThreadStart {
            process: self.process.shared.clone(),
            cfg: self.cfg,
            gpr,
            rflags: self.area.rflags,
            fs_base,
            xsave: self.area.xsave.0[..self.host.xsave_size as usize].into(),
            rip: next,
            clone,
            mask: crate::linux::signals::guest_mask(),
            reply: tx,
            tsc_sigsegv: crate::runtime::cpu::tsc_sigsegv(),
        };
        if let Err(e) = spawner(start) {
            return -(e.raw_os_error().unwrap_or(libc::EAGAIN) as i64);
        }
        match rx.recv() {
            Ok(Ok(tid)) => tid as i64,
            Ok(Err(reason)) => {
                eprintln!("hotpath: cannot start a guest thread: {reason}");
                -(libc::EAGAIN as i64)
            }
            Err(_) => -(libc::EAGAIN as i64),
        }
    }

    /// This guest thread calls `exit`: the last thread ends the process with its status;
    /// any other ends alone, as the kernel ends it (the tid at `CLONE_CHILD_CLEARTID` /
    /// `set_tid_address` is cleared and woken), its ring closed and its resources kept for
    /// the next thread.
    fn exit_thread(&mut self, code: i32) -> Stop {
        // The thread takes no more signals (the kernel gives a process's signals to its other
        // threads from here on, as it does when a thread exits); those it took and has not
        // delivered go back to the process.
        crate::linux::signals::block_all();
        self.process.signals.requeue_to_process(self.ctl.tid);
        self.publish_stats();
        let shared = self.process.shared.clone();
        let last = {
            let mut threads = lock(&shared.threads);
            let alone = threads.len() == 1;
            if !alone {
                threads.retain(|t| !Arc::ptr_eq(t, &self.ctl));
                lock(&shared.ended_stats).add(&self.stats);
            }
            alone
        };
        if last {
            return Stop::Exit(GuestExit::Exited(code));
        }
        let ctid = self.process.clear_child_tid;
        if ctid != 0 && guest_mem::write(ctid, &0u32.to_le_bytes()).is_ok() {
            const FUTEX_WAKE: u64 = 1;
            raw_syscall(libc::SYS_futex as u64, &[ctid, FUTEX_WAKE, 1, 0, 0, 0]);
        }
        if let Some(p) = &self.producer {
            p.close();
        }
        Stop::ThreadExit
    }

    /// Gives this thread's resources back to the process for the next thread (after
    /// [`Stop::ThreadExit`]; the translator is gone), with its translations: a program that
    /// starts threads one after another to run the same code translates it once, and its
    /// block ids (so the monitor's tables) stop growing with the threads it starts.
    pub fn recycle(self) {
        crate::linux::signals::block_all();
        let shared = self.process.shared.clone();
        let Translator {
            cache,
            gateway,
            area,
            process,
            index,
            jump_tables,
            ..
        } = self;
        let kept = Some(crate::linux::process::KeptTranslations { index, jump_tables });
        let signals = process.signals;
        lock(&shared.pool).push(ThreadResources {
            cache,
            gateway,
            area,
            signals,
            kept,
        });
    }

    /// Performs the guest's pending `fork` (after [`Stop::Fork`]): the child process goes on
    /// under translation with a copy of everything, and only this thread, as the kernel
    /// makes it. Every process lock is held across the fork, so none is copied held by a
    /// thread the child does not have. If the process is ending meanwhile, this thread stops
    /// instead.
    ///
    /// # Errors
    /// [`TranslateError::CodeCache`] when the code cache cannot be copied for the child.
    pub fn fork(&mut self) -> Result<Forked, TranslateError> {
        let Some(clone) = self.fork_request.take() else {
            return Ok(Forked::Parent);
        };
        let exit_signal = clone.flags & 0xff;
        build_iced_tables();
        let copy = self.cache.snapshot()?;
        let shared = self.process.shared.clone();
        let pid = {
            // No handler runs on this thread while it holds the locks (one that came would
            // find its own lock held); the guest's mask is back after.
            let _blocked = crate::linux::signals::BlockAll::new();
            let hold = shared.hold_for_fork();
            if shared.exiting.load(std::sync::atomic::Ordering::SeqCst) {
                drop(hold);
                drop(_blocked);
                self.park();
            }
            let pid = if exit_signal == libc::SIGCHLD as u64 {
                // glibc's fork resets its allocator's locks in the child, which other host
                // threads (the monitor, other guest threads) may have held.
                // SAFETY: every lock of hotpath's that the child uses is held by this thread
                // (`hold`); the child touches only state this thread owns or holds.
                unsafe { libc::fork() as i64 }
            } else {
                raw_syscall(libc::SYS_clone as u64, &[exit_signal, 0, 0, 0, 0, 0])
            };
            if pid == 0 {
                let tid = raw_syscall(libc::SYS_gettid as u64, &[0; 6]) as u32;
                let ctl = Arc::new(ThreadCtl::new(
                    tid,
                    self.process.signals.handler(),
                    self.ctl.ring,
                ));
                self.ctl = ctl.clone();
                shared.after_fork_child(hold, ctl);
                // The parent's pending signals are not the child's; this is done before the
                // guest's mask is back, so a signal sent to the child from now on stays.
                self.process.signals.after_fork_child();
            }
            pid
        };
        if pid < 0 {
            let err = if pid == -1 {
                -(std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EAGAIN) as i64)
            } else {
                pid
            };
            self.area.gpr[thread_area::RAX] = err as u64;
            return Ok(Forked::Parent);
        }
        if pid > 0 {
            if clone.flags & libc::CLONE_PARENT_SETTID as u64 != 0 {
                let _ = guest_mem::write(clone.parent_tid, &(pid as u32).to_le_bytes());
            }
            self.area.gpr[thread_area::RAX] = pid as u64;
            return Ok(Forked::Parent);
        }
        // The child: its counts start at 0 (its summary is its own work).
        self.stats = Stats::default();
        guest_mem::forget_pid();
        if clone.flags & libc::CLONE_CHILD_SETTID as u64 != 0 {
            let _ = guest_mem::write(clone.child_tid, &self.ctl.tid.to_le_bytes());
        }
        if clone.flags & libc::CLONE_SETTLS as u64 != 0 {
            self.area.fs_base = clone.tls;
        }
        if clone.stack != 0 {
            self.area.gpr[thread_area::RSP] = clone.stack;
        }
        self.area.gpr[thread_area::RAX] = 0;
        self.cache.adopt(copy)?;
        // A fresh, empty ring for the child's own monitor.
        self.area.ring.reset();
        if let Some(p) = &self.producer {
            p.reopen();
        }
        Ok(Forked::Child)
    }

    fn trap(
        &mut self,
        kind: TrapKind,
        at: GuestAddr,
        next: GuestAddr,
    ) -> Result<Next, TranslateError> {
        if kind == TrapKind::FetchFault && self.fetchable_now(at.0) {
            // The cache was out of date when the block was decoded: the page is executable
            // now. The block ending here goes, and the guest goes on at `at` (the state is
            // that of `at`), translated again.
            self.flush();
            return Ok(Next::Guest(at.0));
        }
        if kind == TrapKind::FetchFault {
            // Cut by hotpath's own memory (its code cache, binary, heap) before the mappings
            // cut it: there the guest has nothing mapped, natively.
            let guest = guest_run(&self.process.shared, self.vdso, at.0, 15);
            if guest < self.process.maps.executable_len(at.0, 15) {
                let f = special::fetch_fault_unmapped(at.0, at.0 + guest);
                return self.act(special::Action::Raise(f));
            }
        }
        let action = special::trap(kind, at.0, next.0, &mut self.process.maps, self.area);
        if let special::Action::Refuse(text) = action {
            return Err(TranslateError::UnsupportedInstruction { at: at.0, text });
        }
        self.act(action)
    }

    /// True if the instruction at guest `at`, whose block ended in a fetch fault, can be
    /// fetched after all (its page was made executable since the thread's `MapsCache` was
    /// read): the first byte that could not be fetched (`at`, or the start of the next page
    /// when the instruction runs into it) is fetchable under fresh mappings.
    fn fetchable_now(&mut self, at: u64) -> bool {
        let (shared, vdso) = (&self.process.shared, self.vdso);
        let maps = &mut self.process.maps;
        maps.refresh();
        let mut fetchable = |a: u64| {
            maps.executable_len(a, 1) == 1
                && guest_run(shared, vdso, a, 1) == 1
                && guest_mem::read_partial(a, &mut [0]) == 1
        };
        let first_cut = if fetchable(at) {
            hotpath_loader::page_floor(at) + hotpath_loader::PAGE_SIZE
        } else {
            at
        };
        fetchable(first_cut)
    }

    /// Carries out what [`special`] decided: raise a fault or go on at a guest address.
    fn act(&mut self, action: special::Action) -> Result<Next, TranslateError> {
        match action {
            special::Action::Raise(fault) => {
                self.process.signals.raise(fault);
                Ok(Next::Signal)
            }
            special::Action::Continue(rip) => Ok(Next::Guest(rip)),
            special::Action::Refuse(text) => Err(TranslateError::UnsupportedInstruction {
                at: self.guest_rip(self.next),
                text,
            }),
        }
    }

    /// Puts the guest address of the last x87 instruction into the saved FPU state's FIP,
    /// where the CPU stored the host address of its translation (a signal frame shows it;
    /// the x87 exception handler of a guest reads it).
    fn guest_fpu_ip(&mut self) {
        const FIP: usize = 8; // 64-bit FIP in the XSAVE legacy region (XSAVE64 format)
        let fip = u64::from_le_bytes(self.area.xsave.0[FIP..FIP + 8].try_into().unwrap());
        if !self.cache.contains(HostAddr(fip)) {
            return;
        }
        let guest = self.cache.layouts().floor(fip).and_then(|l| {
            let i = l.body.partition_point(|&(h, _)| h <= fip).checked_sub(1)?;
            Some(l.body[i].1)
        });
        if let Some(g) = guest {
            self.area.xsave.0[FIP..FIP + 8].copy_from_slice(&g.to_le_bytes());
        }
    }

    /// Corrects what the host fault says where the guest's instruction differs from what ran:
    ///
    /// * A guest access to memory hotpath reserved (the code cache) faults with SEGV_ACCERR
    ///   on the reservation's PROT_NONE or read-only pages; natively nothing is mapped
    ///   there: SEGV_MAPERR.
    /// * A GS-relative operand runs with a DS prefix, which 64-bit mode ignores, so a
    ///   non-canonical address based on RSP or RBP is a stack-segment fault (#SS, SIGBUS)
    ///   where the guest's GS-relative access is a #GP (SIGSEGV).
    fn correct_fault(&mut self) {
        let cache = &self.cache;
        self.process.signals.adjust_fault(|f| {
            let reserved = cache.contains(HostAddr(f.addr));
            if f.sig == libc::SIGSEGV && f.code == special::SEGV_ACCERR && reserved {
                f.code = special::SEGV_MAPERR;
            }
            if f.sig == libc::SIGBUS
                && f.trap.trapno == special::TRAP_SS
                && special::gs_relative(f.rip)
            {
                *f = GuestFault {
                    sig: libc::SIGSEGV,
                    code: special::SI_KERNEL,
                    addr: 0,
                    trap: special::TrapDetails {
                        trapno: special::TRAP_GP,
                        err: 0,
                        ..f.trap
                    },
                    ..*f
                };
            }
        });
    }

    /// Where one single-stepped guest instruction at `next`'s guest address runs: its own
    /// one-instruction block, entered with nothing linked to it so that it comes back to the
    /// dispatcher. `Err` when the dispatcher carried the instruction out itself (`pushf`).
    fn step_entry(&mut self, next: Next) -> Result<Result<HostAddr, Next>, TranslateError> {
        let pc = self.guest_rip_settled(next);
        if let Some(action) = special::step_here(pc, self.area) {
            return self.act(action).map(Err);
        }
        self.step_traps = special::traps_after_step(pc);
        if special::is_indirect(pc) {
            // Its lookup must miss, whatever the table holds.
            self.area.clear_ibl(self.gateway.ibl_empty.0);
        }
        if let Some(&h) = self.index.step_blocks.get(&pc) {
            return Ok(Ok(h));
        }
        self.translate_limited(pc, 1).map(Ok)
    }

    /// The guest branch whose translation holds host address `site` (a lookup miss), if any.
    fn branch_at(&self, site: u64) -> Option<u64> {
        if site == 0 {
            return None;
        }
        let l = self.cache.layouts().floor(site)?;
        (site < l.code_end).then_some(l.term_guest)
    }

    /// Discards translations overlapping ranges the guest unmapped, remapped, reprotected or
    /// wrote to (code that writes code).
    fn apply_invalidations(&mut self) {
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

    /// Discards this thread's translations of `ranges`.
    fn discard(&mut self, ranges: &[(u64, u64)]) {
        for &(s, e) in ranges {
            self.process.maps.invalidate_range(s, e);
            self.process.signals.protected_pages().forget(s, e);
        }
        let hit = ranges.iter().any(|&(s, e)| {
            // Blocks are at most a few hundred bytes: look a page back for ones that start before.
            self.index
                .spans
                .range(s.saturating_sub(4096)..e)
                .any(|(&bs, &be)| bs < e && be > s)
        });
        if hit {
            self.flush();
        }
    }

    /// True if the guest's `mmap` (`nr` 9) or `brk` (12) with `args` did not get memory
    /// it would have natively, because this thread's code cache is in the requested range:
    /// `brk` growing into it, or `mmap` at a hint or a fixed address overlapping it.
    fn cache_in_the_way(&self, nr: u64, args: &[u64; 6], outcome: &Outcome) -> bool {
        const PAGE: u64 = hotpath_loader::PAGE_SIZE;
        let overlaps = |start: u64, end: u64| self.cache.overlaps(start, end);
        let &Outcome::Return(ret) = outcome else {
            return false;
        };
        match nr {
            12 => {
                let brk = lock(&self.process.shared.memory).brk;
                let want = args[0];
                // Failed growth; the kernel also keeps a page free after the new end.
                ret as u64 != want
                    && want > brk
                    && overlaps(brk.div_ceil(PAGE) * PAGE, want.div_ceil(PAGE) * PAGE + PAGE)
            }
            9 => {
                let (addr, len) = (args[0], args[1].div_ceil(PAGE) * PAGE);
                addr != 0 && ret as u64 != addr && overlaps(addr, addr.saturating_add(len))
            }
            _ => false,
        }
    }

    /// Moves this thread's code cache to wherever the kernel finds room, flushing every
    /// translation (the guest goes on at the guest address it was going to): a new cache and
    /// gateway, the handler pointed at them, the old views unmapped. Far from the guest's
    /// image, translated code reaches its RIP-relative operands through a register
    /// (`emit::encode_at`), as other threads' caches do.
    ///
    /// # Errors
    /// [`TranslateError::CodeCache`] when the new cache cannot be mapped.
    fn move_cache(&mut self) -> Result<(), TranslateError> {
        let mut cache = CodeCache::create_anywhere(FIRST_REGION_SIZE)?;
        let gateway = emit_gateway(&mut cache, self.host)?;
        if !matches!(self.next, Next::Signal) {
            self.next = Next::Guest(self.guest_rip_settled(self.next));
        }
        // The dispatcher holds `critical` here: no other thread unlinks this one's code.
        let setup = handler_setup(self.area, &cache, &gateway, self.host);
        self.process.signals.move_cache(&setup);
        let old = std::mem::replace(&mut self.cache, cache);
        self.gateway = gateway;
        self.note_gateway();
        self.flush();
        // SAFETY: this thread is in the dispatcher, its handler and lookup table point at the
        // new cache, and no other thread runs or links into a thread's cache.
        unsafe { old.release() };
        self.stats.cache_moves += 1;
        Ok(())
    }

    /// Notes that direct exit `exit` was linked to its target, guest `target`
    /// ([`CacheIndex::linked`]). Past [`LINKED_UNSORTED`] unsorted entries the list is sorted
    /// again (a stable sort merges the sorted part and the new entries' run in linear time)
    /// and entries made twice (links undone by a signal or a kick, then made again) merged.
    pub(super) fn note_link(&mut self, target: u64, exit: u32) {
        let index = &mut self.index;
        index.linked.push((target, exit));
        if index.linked.len() - index.linked_sorted > LINKED_UNSORTED {
            index.linked.sort();
            index.linked.dedup();
            index.linked_sorted = index.linked.len();
        }
    }

    /// Empties the code cache: every block will be translated again (with new ids).
    fn flush(&mut self) {
        self.cache.flush();
        self.index.blocks.clear();
        self.index.spans.clear();
        self.index.exits.clear();
        self.index.linked.clear();
        self.index.linked_sorted = 0;
        self.area.clear_ibl(self.gateway.ibl_empty.0);
        self.index.generation += 1;
        self.index.generation_first_id = lock(&self.process.shared.registry).next_id;
        self.index.superblock_heads.clear();
        self.index.step_blocks.clear();
        self.jump_tables.clear();
        self.area.jump_tables_open = 0;
        self.stats.flushes += 1;
    }

    /// The host entry of the block at guest address `pc`, translating it if needed.
    fn lookup_or_translate(&mut self, pc: u64) -> Result<HostAddr, TranslateError> {
        if let Some(&h) = self.index.blocks.get(&pc) {
            return Ok(h);
        }
        let started = crate::runtime::cpu::tsc();
        let entry = self.translate(pc);
        self.stats.translation_ticks += crate::runtime::cpu::tsc().wrapping_sub(started);
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
    fn fetch_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        let len = buf.len() as u64;
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

    /// Whether the guest may write the page of `at` or the next (a block's code is on them):
    /// by its own protection, also where hotpath write-protected the page to watch its code.
    fn code_writable(&mut self, at: u64) -> bool {
        let page = hotpath_loader::page_floor(at);
        [page, page + hotpath_loader::PAGE_SIZE]
            .into_iter()
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
    fn constant_target(&mut self, block: &hotpath_ir::Block) -> Option<(GuestAddr, GuestAddr)> {
        let slot = crate::frontend::decode::constant_slot(block)?;
        Some((slot, self.constant_value(slot)?))
    }

    /// The 8-byte value at guest `slot` if it is a constant there (see
    /// [`Self::constant_target`]) and a canonical address.
    fn constant_value(&mut self, slot: GuestAddr) -> Option<GuestAddr> {
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
    fn constant_bytes(&mut self, addr: u64, len: u64) -> bool {
        let guest_writable = [addr, addr + len - 1].into_iter().any(|a| {
            let prot = self.process.signals.protected_pages().guest_prot(a);
            prot.is_some_and(|p| p & libc::PROT_WRITE != 0)
        });
        !guest_writable && self.process.maps.constant(addr, len)
    }

    /// Makes the constant `slot` count as guest bytes of the translations in the cache: a
    /// system call that changes it (reprotects, unmaps, remaps or discards its page, or
    /// writes it through /proc/self/mem) discards them.
    fn depend_on_slot(&mut self, slot: GuestAddr) {
        self.depend_on_bytes(slot.0, 8);
    }

    /// [`Self::depend_on_slot`] for the `len` bytes at guest `addr`.
    fn depend_on_bytes(&mut self, addr: u64, len: u64) {
        let span = self.index.spans.entry(addr).or_insert(addr + len);
        *span = (*span).max(addr + len);
    }

    /// Write-protects the guest pages of `start..end` (code just translated) where the guest
    /// may write them, so that a write there discards the translation (`smc`).
    fn protect_code(&mut self, start: u64, end: u64) {
        let maps = &mut self.process.maps;
        self.process
            .signals
            .protected_pages()
            .protect(start, end, |page| maps.prot(page));
    }

    /// Translates the basic block at guest `pc` into the code cache and announces its id.
    fn translate(&mut self, pc: u64) -> Result<HostAddr, TranslateError> {
        self.translate_limited(pc, MAX_BLOCK_INSTRUCTIONS)
    }

    /// [`Self::translate`] with at most `max` instructions; a block of fewer than the usual
    /// most is a single-step block, kept apart from the lookup map. A block of a module the
    /// persisted store holds is placed from its record when its guest bytes are unchanged;
    /// one translated afresh there is kept for the store.
    fn translate_limited(&mut self, pc: u64, max: usize) -> Result<HostAddr, TranslateError> {
        let module = (max == MAX_BLOCK_INSTRUCTIONS)
            .then(|| self.persisted_module(pc))
            .flatten();
        if let Some(module) = &module {
            if let Some(entry) = self.place_persisted(pc, module)? {
                return Ok(entry);
            }
        }
        let block = self.decode(GuestAddr(pc), max);
        // Watch the code's pages for writes if the guest may write them (undecodable bytes
        // too: code written there later must replace the trap). Not when nothing could be
        // fetched at `pc` (a page that is not executable, such as the stack or the heap): its
        // bytes are no code, and hotpath itself writes signal frames on the stack.
        let fetched_nothing = matches!(
            block.terminator,
            hotpath_ir::Terminator::Trap { kind: TrapKind::FetchFault, at } if at.0 == pc
        );
        if !fetched_nothing {
            self.protect_code(pc, block.end().0.max(pc + 1));
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
        if let Some(m) = &module {
            // A translation the store cannot hold (a jump-table site's, whose table is this
            // thread's) is no miss: no run would have found it there.
            if let Some(r) = BlockRecord::capture(&emitted, &block, pc - m.start, folded) {
                m.store.keep(&m.file, r);
                self.stats.blocks_missed += 1;
            }
        }
        if let Some((slot, _)) = folded {
            self.depend_on_slot(slot);
        }
        let end = block.end().0.max(pc + 1);
        let summary = block.summary();
        let jmp_at = block.term_inst.as_ref().map(|i| GuestAddr(i.inst.ip()));
        let entry = self.install_block(
            pc,
            max,
            emitted,
            summary,
            block.code.into_boxed_slice(),
            end,
            registry,
        )?;
        if let (Some((number, pattern, id, code)), Some(jmp_at)) = (site, jmp_at) {
            let s = crate::backend::jump_table::Site {
                pattern,
                id,
                from: GuestAddr(pc),
                jmp_at,
                general: code.general,
            };
            self.open_jump_table(number, s, code.fill);
        }
        Ok(entry)
    }

    /// Makes the code cache put the next translation, of guest code at `pc`, in a region
    /// within reach of it (`CodeCache::region_for`), and returns the gateway as code there
    /// reaches it.
    fn select_region(&mut self, pc: u64) -> Gateway {
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
    fn persisted_module(&mut self, pc: u64) -> Option<Arc<PersistedModule>> {
        if crate::runtime::cpu::tsc_sigsegv() {
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
    fn place_persisted(
        &mut self,
        pc: u64,
        module: &PersistedModule,
    ) -> Result<Option<HostAddr>, TranslateError> {
        let Some(records) = &module.records else {
            return Ok(None);
        };
        let Some(record) = records.get(pc - module.start) else {
            return Ok(None);
        };
        let len = record.guest.len() as u64;
        let mut now = vec![0u8; len as usize];
        if self.fetch_code(pc, &mut now) != now.len() || now != record.guest {
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
            || self.index.exits.len() + record.exit_count() > EXIT_SPECIAL_BASE as usize
        {
            drop(registry);
            self.flush();
            registry = lock(&shared.registry);
        }
        let id = BlockId(registry.next_id);
        let first_exit = self.index.exits.len() as u32;
        let at = self.cache.next_addr();
        let Some(placed) = record.place(GuestAddr(pc), at, id, first_exit, &gateway, folded) else {
            return Ok(None);
        };
        if placed.emitted.code.len() as u64 > self.cache.room() {
            return Ok(None);
        }
        self.protect_code(pc, pc + len);
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
        Ok(Some(entry))
    }

    /// Puts `emitted`, the translation of the block at `pc` (at most `max` instructions,
    /// guest bytes `code` up to `end`, summarised by `summary`) into the code cache under the
    /// next id of `registry`, records its exits and layout, and announces it to the monitor.
    /// Returns its entry.
    #[allow(clippy::too_many_arguments)]
    fn install_block(
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
                disassemble(&emitted.code, at.0)
            );
        }
        self.cache.insert(&emitted.code);
        self.index.exits.extend(emitted.exits);
        self.note_code(&emitted.layout, CodeKind::Block);
        self.cache.add_layout(emitted.layout);
        if max < MAX_BLOCK_INSTRUCTIONS {
            self.index.step_blocks.insert(pc, emitted.entry);
        } else {
            self.index.blocks.insert(pc, emitted.entry);
        }
        let span = self.index.spans.entry(pc).or_insert(end);
        *span = (*span).max(end);
        self.stats.blocks_translated += 1;
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
