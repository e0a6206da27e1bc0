//! A guest run's lifecycle: load, translate, monitor, and the reports written however the
//! process image ends.
//!
//! ```text
//!   load ELF ──▶ stack/auxv ──▶ translator (this thread) ──events──▶ monitor thread (pinned)
//!   guest ends ──▶ close ring ──▶ monitor drains ──▶ Report ──▶ JSON, text, drcov, ... ──▶ exit like the guest
//!   guest forks ──▶ the child gets its own ring, monitor and outputs (FILE.<pid>)
//!   guest execs ──▶ outputs written, then the new program runs under hotpath (FILE.exec)
//! ```

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use hotpath_loader::{build_stack, load, resolve_script, LoadError, LoadOptions};
use hotpath_monitor::{
    thread_report, FunctionSymbol, MonitorHandle, MonitorResult, MonitorState, Namer, PathConfig,
    PathRecorder, Rows, RunInfo, Stream, Tables,
};
use hotpath_report::Ending;
use hotpath_translator::cache::code_cache::FIRST_REGION_SIZE;
use hotpath_translator::cache::modules::GuestModule;
use hotpath_translator::{
    signal_name, Config, ExecWrapper, Forked, GuestExit, ModuleSource, Stop, ThreadStart,
    TranslateError, Translator, GUEST_THREAD_HOST_STACK,
};

use crate::cli::{OutputArgs, RunArgs};
use crate::identity;
use crate::modules::ModuleMap;
use crate::outputs;
use crate::raw;

/// Exit status for a program that could not be loaded (as shells use: 127 not found, 126
/// cannot execute).
fn load_error_status(e: &LoadError) -> u8 {
    if e.is_not_found() {
        127
    } else {
        126
    }
}

/// The monitor side of a run: the thread, where it is pinned, where the report goes.
struct Monitoring {
    handle: Option<MonitorHandle>,
    /// A monitor put off (see [`Monitoring::start`]): the first thread's stream and the
    /// state to start from.
    deferred: Option<(Stream, MonitorState)>,
    /// Where the rings of new guest threads go to the monitor.
    streams: Option<crossbeam::channel::Sender<Stream>>,
    /// Path recording for a new monitor (None: `--no-paths`).
    paths: Option<PathConfig>,
    /// The hot threshold for superblocks (None: `--no-superblocks`).
    superblock_threshold: Option<u64>,
    core: Option<core_affinity::CoreId>,
    /// Where this process image's JSON report goes.
    report: Option<PathBuf>,
    /// Where its raw profile goes.
    profile: Option<PathBuf>,
    /// The other files it writes (renamed like `report` in a forked child).
    outputs: OutputArgs,
}

impl Monitoring {
    /// A fresh monitor state: empty tables and paths.
    fn fresh(&self) -> MonitorState {
        let mut state = MonitorState::new(
            Default::default(),
            self.paths.clone().map(PathRecorder::new),
        );
        state.tables.hot_threshold = self.superblock_threshold.unwrap_or(u64::MAX);
        state
    }

    /// The monitor's handle on `translator`'s ring (and its superblock requests).
    fn stream(&self, translator: &mut Translator) -> Stream {
        let commands = self.superblock_threshold.map(|_| {
            let (tx, rx) = crossbeam::channel::unbounded();
            translator.set_command_receiver(rx);
            tx
        });
        Stream {
            tid: translator.tid(),
            ring: translator.ring_consumer(),
            commands,
            wake: Some(translator.waker()),
        }
    }

    /// Starts a monitor on the translator's ring, going on from `state`. A monitor thread the
    /// system refuses (a process or memory limit) is said on one line, and the guest runs on
    /// without a profile, its rings read by nobody (natively the program needs no thread).
    ///
    /// The thread itself is put off until the program needs it (the superblocks' threshold at
    /// its default): until the first lap of its ring is full (a million events), its first
    /// new thread, or its end, where a program that ended first has its events read on the
    /// thread that ends it. A short process (a shell's `ls`, a compiler driver) then never
    /// has a second thread, so nothing of the kernel's that a second thread makes slower
    /// (TLB shootdowns to the monitor's CPU, the descriptor table's growth) costs it more
    /// than natively. A lower `--superblock-threshold` asks for superblocks sooner than a lap
    /// would show the monitor the blocks: the thread then starts at once.
    fn start(&mut self, translator: &mut Translator, state: MonitorState) {
        let first = self.stream(translator);
        let eager = self
            .superblock_threshold
            .is_some_and(|t| t < hotpath_monitor::DEFAULT_SUPERBLOCK_THRESHOLD);
        if eager {
            self.spawn(translator, first, state);
        } else {
            self.deferred = Some((first, state));
        }
    }

    /// Starts the monitor thread put off by [`Monitoring::start`], if there is one.
    fn start_deferred(&mut self, translator: &Translator) {
        if let Some((first, state)) = self.deferred.take() {
            self.spawn(translator, first, state);
        }
    }

    /// Starts a monitor thread on `first` (`translator`'s ring or one of its process's),
    /// going on from `state`.
    fn spawn(&mut self, translator: &Translator, first: Stream, state: MonitorState) {
        hotpath_translator::host::messages::grow_descriptor_table();
        let (stx, srx) = crossbeam::channel::unbounded();
        match hotpath_monitor::spawn(
            first,
            srx,
            translator.catalog(),
            self.core,
            state,
            self.fresh(),
            self.paths
                .is_some()
                .then(|| namer(translator.module_source())),
        ) {
            Ok(handle) => {
                self.streams = Some(stx);
                self.handle = Some(handle);
            }
            Err(e) => {
                crate::say(format_args!("hotpath: cannot start the monitor thread ({e}): the program runs without a profile"));
                self.abandon_ring(translator);
            }
        }
    }

    /// Leaves `translator`'s ring to nobody (no monitor could be started; with `--no-monitor`
    /// nothing writes it anyway).
    fn abandon_ring(&self, translator: &Translator) {
        if let Some(p) = translator.ring_producer() {
            p.abandon();
        }
    }

    /// In a forked child: the parent's monitor thread (or the one it put off) does not exist
    /// here, so a new one starts on this (the only) thread's ring, put off the same way, with
    /// empty tables, and the report goes to `FILE.<pid>`.
    fn restart_in_child(&mut self, translator: &mut Translator) {
        let (deferred, handle) = (self.deferred.take(), self.handle.take());
        if deferred.is_none() && handle.is_none() {
            return;
        }
        // The parent's: dropping them could wait on its monitor thread or drop its channels.
        std::mem::forget(deferred);
        std::mem::forget(handle);
        std::mem::forget(self.streams.take());
        let suffix = format!(".{}", std::process::id());
        self.rename_outputs(&suffix);
        let fresh = self.fresh();
        self.start(translator, fresh);
    }

    /// Adds `suffix` to the name of every file this process image writes.
    fn rename_outputs(&mut self, suffix: &str) {
        let o = &mut self.outputs;
        for p in [
            &mut self.report,
            &mut self.profile,
            &mut o.dot,
            &mut o.flamegraph,
            &mut o.drcov,
            &mut o.callgrind,
            &mut o.pprof,
        ] {
            if let Some(path) = p.take() {
                *p = Some(with_suffix(&path, suffix));
            }
        }
    }

    /// Hands a new guest thread's ring to the monitor (to nobody when there is none).
    fn add_thread(&mut self, translator: &mut Translator) {
        self.start_deferred(translator);
        if let Some(handle) = &self.handle {
            let s = self.stream(translator);
            if let Some(tx) = &self.streams {
                handle.add_stream(tx, s);
            }
        } else {
            self.abandon_ring(translator);
        }
    }

    /// Leaves the monitor thread to the process's end, for an ending process whose profile
    /// nobody reads: it only reads rings and counts (it writes nothing outside its own
    /// memory, takes no lock the exit path takes, prints nothing), so `exit_group` may end
    /// it wherever it is. Stopping it and waiting for it cost a short run 0.2 ms.
    fn abandon(&mut self) {
        self.deferred = None;
        self.streams = None;
        if let Some(handle) = self.handle.take() {
            std::mem::forget(handle);
        }
    }

    /// True if nothing of the profile is shown or written (`--quiet`, no report, no file).
    fn unread(&self, quiet: bool) -> bool {
        quiet && self.report.is_none() && self.profile.is_none() && !self.outputs.any_file()
    }

    /// Closes the ring (the other threads' are closed or stopped) and collects what the
    /// monitor kept.
    fn stop(&mut self, translator: &Translator) -> Option<MonitorResult> {
        if let Some((first, state)) = self.deferred.take() {
            // No thread was started: the events are all in the ring; read them here.
            translator.ring_producer()?.close();
            let namer = self
                .paths
                .is_some()
                .then(|| namer(translator.module_source()));
            let result = hotpath_monitor::run_to_end(
                first,
                translator.catalog(),
                state,
                self.fresh(),
                namer,
            );
            return match result {
                Ok(result) => Some(result),
                Err(e) => {
                    crate::say(format_args!("hotpath: internal error (bug in hotpath): the monitor failed ({e}); no profile"));
                    None
                }
            };
        }
        let handle = self.handle.take()?;
        self.streams = None;
        translator.ring_producer()?.close();
        match handle.finish() {
            Ok(result) => Some(result),
            Err(e) => {
                crate::say(format_args!("hotpath: internal error (bug in hotpath): the monitor failed ({e}); no profile"));
                None
            }
        }
    }
}

/// What every guest thread's host thread shares: the options, and the monitor.
struct RunCtx {
    args: RunArgs,
    program: PathBuf,
    monitoring: std::sync::Mutex<Monitoring>,
}

impl RunCtx {
    fn monitoring(&self) -> std::sync::MutexGuard<'_, Monitoring> {
        self.monitoring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one guest thread until the process ends (which this function then does, from
    /// whichever thread ends it) or the thread alone ends (it returns).
    fn guest_thread(self: &Arc<Self>, mut translator: Translator) {
        loop {
            let run = match crate::panics::catch(|| translator.run()) {
                Ok(run) => run,
                // The thread's dispatcher is in no state to go on, and the guest's other
                // threads may wait for this one (a join, a lock it holds): the process ends
                // as at an internal error, its profile written.
                Err(reason) => Err(TranslateError::Internal { reason }),
            };
            match run {
                Ok(Stop::Exit(e)) => self.end(&translator, Ok(e)),
                Err(e) => self.end(&translator, Err(e)),
                Ok(Stop::ThreadExit) => {
                    translator.recycle();
                    return;
                }
                Ok(Stop::Exec) => {
                    // The kernel ends every other thread at an execve.
                    translator.stop_other_threads();
                    translator.write_translation_cache();
                    self.write_perf_map(&translator);
                    let mut monitoring = self.monitoring();
                    let unread = (monitoring.handle.is_some() || monitoring.deferred.is_some())
                        && monitoring.unread(true);
                    if unread {
                        // Nobody reads this image's profile: the monitor is left running, for
                        // the new image to end (or for the guest to go on with, if the exec
                        // fails).
                        translator.set_exec_wrapper(exec_wrapper(&self.args, &monitoring));
                        translator.exec();
                        translator.exec_failed();
                    } else if let Some(result) = monitoring.stop(&translator) {
                        let resume = first_thread_state(&result);
                        finish_report(
                            &self.args,
                            &self.program,
                            &translator,
                            &monitoring,
                            result,
                            Ending::Exec,
                            true,
                        );
                        translator.set_exec_wrapper(exec_wrapper(&self.args, &monitoring));
                        translator.exec();
                        // The exec failed: the guest goes on, and so does its profile.
                        translator.exec_failed();
                        monitoring.start(&mut translator, resume);
                    } else {
                        translator.set_exec_wrapper(exec_wrapper(&self.args, &monitoring));
                        translator.exec();
                        translator.exec_failed();
                    }
                }
                Ok(Stop::Fork) => {
                    // Held across the fork: another thread may be adding its ring.
                    let mut monitoring = self.monitoring();
                    match translator.fork() {
                        Ok(Forked::Parent) => {}
                        Ok(Forked::Child) => monitoring.restart_in_child(&mut translator),
                        Err(e) => {
                            drop(monitoring);
                            self.end(&translator, Err(e));
                        }
                    }
                }
            }
        }
    }

    /// Writes the perf map if `--perf-map` asked for it (a failure is reported, not fatal).
    fn write_perf_map(&self, translator: &Translator) {
        if !self.args.perf_map {
            return;
        }
        match crate::perf_map::write(translator) {
            // One write: forked children announce theirs at the same time.
            Ok((path, n)) if !self.args.quiet => crate::say(format_args!(
                "hotpath: perf map: {} ({n} entries)",
                path.display()
            )),
            Ok(_) => {}
            Err(e) => crate::say(format_args!("hotpath: cannot write the perf map: {e}")),
        }
    }

    /// Ends the process from the calling guest thread: stops the others, writes the
    /// profile, and exits as the guest did.
    fn end(&self, translator: &Translator, outcome: Result<GuestExit, TranslateError>) -> ! {
        translator.stop_other_threads();
        if !matches!(outcome, Err(TranslateError::Internal { .. })) {
            // Not after a panic: what the dispatcher knows may be half updated.
            translator.write_translation_cache();
        }
        let ending = match &outcome {
            Ok(GuestExit::Exited(code)) => Ending::Exited { code: *code },
            Ok(GuestExit::Signaled(sig)) => Ending::Signaled {
                signal: *sig,
                name: signal_name(*sig).to_string(),
            },
            Err(e) => Ending::Error {
                message: e.to_string(),
            },
        };
        if let Err(e) = &outcome {
            crate::say(format_args!("hotpath: {}: {e}", self.program.display()));
        }
        match &outcome {
            Ok(GuestExit::Exited(code)) => hotpath_translator::host::reserve::ending(Ok(*code)),
            Ok(GuestExit::Signaled(sig)) => hotpath_translator::host::reserve::ending(Err(*sig)),
            Err(_) => {}
        }
        let mut monitoring = self.monitoring();
        if monitoring.unread(self.args.quiet) {
            monitoring.abandon();
        } else if let Some(result) = monitoring.stop(translator) {
            finish_report(
                &self.args,
                &self.program,
                translator,
                &monitoring,
                result,
                ending,
                self.args.quiet,
            );
        }
        self.write_perf_map(translator);
        if !self.args.quiet {
            let s = translator.stats();
            crate::say(format_args!(
                "hotpath: translator: {} blocks translated ({} from the translation cache) in {:.3} s, {} superblocks built ({} requests dropped), {} links, {} indirect lookup misses, {} jump tables ({} entries, {} of them the case itself, {} sent to the lookup), {} syscalls, {} flushes ({} moving the cache out of the guest's way), {} ring refills, {} threads",
                s.blocks_translated,
                s.blocks_loaded,
                s.translation_ns() as f64 / 1e9,
                s.superblocks,
                s.superblocks_dropped,
                s.links,
                s.ibl_misses,
                s.jump_table_sites,
                s.jump_table_entries,
                s.jump_table_entries_direct,
                s.jump_table_entries_refused,
                s.syscalls,
                s.flushes,
                s.cache_moves,
                s.ring_refills,
                translator.threads_started()
            ));
        }
        match outcome {
            Ok(GuestExit::Exited(code)) => std::process::exit(code & 0xff),
            Ok(GuestExit::Signaled(sig)) => {
                let _ = die_of(sig);
                std::process::exit(128 + sig)
            }
            Err(_) => std::process::exit(1),
        }
    }
}

/// The state of the process's first thread, for a monitor that goes on after a failed exec.
fn first_thread_state(result: &MonitorResult) -> MonitorState {
    result
        .threads
        .first()
        .map(|t| t.state.clone())
        .unwrap_or_default()
}

/// Creates a host thread for each new guest thread and runs it there.
fn spawner(ctx: Arc<RunCtx>) -> hotpath_translator::Spawner {
    Arc::new(move |start: ThreadStart| {
        let ctx = ctx.clone();
        // The host thread starts with every signal blocked (it inherits the mask it is
        // created with); it takes the guest's mask once it can handle signals.
        // SAFETY: changing the calling thread's mask and restoring it right after.
        let mut saved: libc::sigset_t = unsafe { std::mem::zeroed() };
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut saved);
        }
        // Unnamed: the host thread keeps the name the kernel copies from the thread that
        // makes it (the guest's, as a native thread would).
        let spawned = spawn_plain_thread(
            GUEST_THREAD_HOST_STACK,
            Box::new(move || {
                let Ok(mut translator) = Translator::start_thread(start) else {
                    return;
                };
                ctx.monitoring().add_thread(&mut translator);
                ctx.guest_thread(translator);
            }),
        );
        // SAFETY: restoring the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut()) };
        spawned
    })
}

/// Runs `f` on a new, detached host thread with a stack of `stack` bytes, made by
/// `pthread_create` itself rather than `std::thread`: the standard library's thread start
/// and end take a process-wide lock (its stack-overflow registry, taken at every thread's
/// end even with no handler installed), and a guest thread that forks while another one
/// ends would give the child that lock held for good (the child hung in its threads' and
/// its own exit: `thread_cases fork`, 1 run in about 700 with four at once). A panic that
/// `f` lets out ends the process (the hook has printed it).
///
/// # Errors
/// `pthread_create`'s error (EAGAIN when out of threads or memory).
fn spawn_plain_thread(stack: usize, f: Box<dyn FnOnce() + Send>) -> std::io::Result<()> {
    extern "C" fn start(arg: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: `arg` is the box `spawn_plain_thread` leaked for this thread alone.
        let f = unsafe { Box::from_raw(arg as *mut Box<dyn FnOnce() + Send>) };
        // No unwinding into the C caller. A panic that got this far (its line printed by
        // the hook) was outside the dispatcher's own catch, in the thread's start or at the
        // process's end: the process ends, rather than leave the guest waiting for a
        // thread that is gone.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
            std::process::exit(1);
        }
        std::ptr::null_mut()
    }
    let arg = Box::into_raw(Box::new(f)) as *mut libc::c_void;
    // SAFETY: the attribute object is initialised before use and destroyed after; `start`
    // takes `arg` back exactly once, or it is taken back here if no thread starts.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstacksize(&mut attr, stack);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        let mut thread: libc::pthread_t = 0;
        let r = libc::pthread_create(&mut thread, &attr, start, arg);
        libc::pthread_attr_destroy(&mut attr);
        if r != 0 {
            drop(Box::from_raw(arg as *mut Box<dyn FnOnce() + Send>));
            return Err(std::io::Error::from_raw_os_error(r));
        }
    }
    Ok(())
}

/// `hotpath run`: runs the program in `args` until the process ends, which it then ends the
/// way the guest did (exit status, or death by the same signal). Returns only when the
/// program cannot be started (with the shell's status: 127 not found, 126 cannot execute).
/// `cores` are the CPUs this process may use, read before any thread was pinned.
pub fn run(mut args: RunArgs, cores: &[core_affinity::CoreId]) -> ExitCode {
    if let Some(fd) = args.messages_fd {
        if !hotpath_translator::host::messages::adopt(fd) {
            crate::say(format_args!(
                "hotpath: --messages-fd {fd}: not an open file descriptor"
            ));
            return ExitCode::from(2);
        }
    }
    absolutize_outputs(&mut args);
    let file = search_path(&args.command[0]);
    if let Some(name) = args.argv0.take() {
        // The report shows the argv the guest saw.
        args.command[0] = name;
    }
    let (program, argv) = match resolve_script(&file, &args.command) {
        Ok(p) => p,
        Err(e) => {
            crate::say(format_args!("hotpath: {e}"));
            return ExitCode::from(load_error_status(&e));
        }
    };
    let image = match load(
        &program,
        LoadOptions {
            extra_reserve: FIRST_REGION_SIZE,
        },
    ) {
        Ok(i) => i,
        Err(e) => {
            crate::say(format_args!("hotpath: {e}"));
            if e.kills_the_process() {
                // As natively: execve succeeded, then the new process died before its first
                // instruction.
                return die_of(libc::SIGSEGV);
            }
            return ExitCode::from(load_error_status(&e));
        }
    };
    let envp: Vec<OsString> = std::env::vars_os()
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            kv
        })
        .collect();
    // What execvp passes the kernel as the file name, which AT_EXECFN shows (the script's,
    // for a #! script).
    let execfn = file.to_string_lossy().into_owned();
    let stack = match build_stack(
        &image,
        &argv,
        &envp,
        &execfn,
        hotpath_translator::guest_vdso().filter(|_| !args.no_vdso),
    ) {
        Ok(s) => s,
        Err(e) => {
            crate::say(format_args!("hotpath: {e}"));
            return ExitCode::from(126);
        }
    };

    // The guest's name, command line, environment and auxv in /proc, before any other
    // thread starts (threads inherit the name).
    identity::set_name(&file);
    let _ = identity::show_guest_args(&stack);

    let monitor_on = !args.no_monitor;
    let cfg = Config {
        enqueue: monitor_on,
        ring_entries: args.ring_entries,
        superblocks: monitor_on && !args.no_superblocks,
        vdso: !args.no_vdso,
        perf_map: args.perf_map,
    };
    let mut translator = match Translator::new(&image, &stack, cfg) {
        Ok(t) => t,
        Err(e) => {
            crate::say(format_args!("hotpath: {}: {e}", image.path.display()));
            return ExitCode::from(70);
        }
    };
    if let Some(dir) = args.translation_cache() {
        translator.use_translation_cache(&dir);
    }
    let core = match args.monitor_cpu {
        Some(id) => Some(core_affinity::CoreId { id }),
        None => monitor_core(cores),
    };
    let paths = args.records_paths().then(|| PathConfig {
        pap_threshold: args.pap_threshold(),
        call_tree: args.records_call_tree(),
        k: args.k,
        recorder: args.paths_recorder.recorder(),
        symbols: image
            .symbols
            .iter()
            .map(|s| FunctionSymbol {
                name: s.name.clone(),
                addr: s.addr,
                size: s.size,
            })
            .collect(),
    });
    let mut monitoring = Monitoring {
        handle: None,
        deferred: None,
        streams: None,
        paths,
        superblock_threshold: (!args.no_superblocks).then_some(args.superblock_threshold),
        core,
        report: args.report.clone(),
        profile: args.profile.clone(),
        outputs: args.outputs.clone(),
    };
    if monitor_on {
        let fresh = monitoring.fresh();
        monitoring.start(&mut translator, fresh);
    } else if args.report.is_some() || args.profile.is_some() {
        crate::say(format_args!(
            "hotpath: no report: --no-monitor collects no profile"
        ));
    }
    let ctx = Arc::new(RunCtx {
        program: image.path.clone(),
        args,
        monitoring: std::sync::Mutex::new(monitoring),
    });
    translator.set_spawner(spawner(ctx.clone()));
    if monitor_on {
        let hook_ctx = ctx.clone();
        translator.set_lap_full_hook(Arc::new(move |t: &mut Translator| {
            hook_ctx.monitoring().start_deferred(t)
        }));
    }
    ctx.guest_thread(translator);
    // The first guest thread ended alone (`exit` while others run): the process ends when
    // the last one does, from its host thread.
    // SAFETY: blocking this thread's signals; it runs no guest code any more.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
    }
    loop {
        std::thread::park();
    }
}

/// The CPU to pin the monitor to, among `cores` (the CPUs this process may use), or `None`
/// to leave it to the scheduler.
///
/// The rule: a CPU other than the one the guest's thread is on now, chosen among the others
/// by pid, so that concurrent runs (a shell script, `make -j` under hotpath) spread their
/// monitors as the scheduler would spread native processes; and no pinning at all on a
/// machine with fewer than two such CPUs, or where more threads are runnable than this
/// process has CPUs (pinned monitors would then queue behind each other while their guests
/// wait for them: 20 concurrent runs with `--ring-entries 64` took 5x their sequential time
/// with every monitor on the last CPU).
fn monitor_core(cores: &[core_affinity::CoreId]) -> Option<core_affinity::CoreId> {
    // SAFETY: sched_getcpu has no preconditions.
    let here = unsafe { libc::sched_getcpu() };
    let ids: Vec<usize> = cores.iter().map(|c| c.id).collect();
    let id = choose_monitor_cpu(
        &ids,
        usize::try_from(here).ok(),
        runnable_threads(),
        std::process::id(),
    )?;
    Some(core_affinity::CoreId { id })
}

/// [`monitor_core`]'s rule on plain numbers: `cpus` this process may use, the CPU the guest's
/// thread is on (`here`), the machine's runnable threads, this process's `pid`.
fn choose_monitor_cpu(
    cpus: &[usize],
    here: Option<usize>,
    runnable: Option<usize>,
    pid: u32,
) -> Option<usize> {
    if cpus.len() < 2 || runnable.is_some_and(|n| n > cpus.len()) {
        return None;
    }
    let others: Vec<usize> = cpus.iter().copied().filter(|&c| Some(c) != here).collect();
    (!others.is_empty()).then(|| others[pid as usize % others.len()])
}

/// Threads runnable on the machine now (`procs_running` of `/proc/stat`, this one included).
fn runnable_threads() -> Option<usize> {
    let stat = hotpath_translator::host::procfs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("procs_running "))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Suffix added to every output file name of a program the guest execs, so that no process
/// image overwrites another's report (a forked child adds `.<pid>` instead).
const EXEC_SUFFIX: &str = ".exec";

/// Makes every output path absolute against hotpath's starting directory, once: the guest
/// may `chdir` before its report is written, and an exec'd image gets the same paths.
fn absolutize_outputs(args: &mut RunArgs) {
    let o = &mut args.outputs;
    for p in [
        &mut args.report,
        &mut args.profile,
        &mut o.dot,
        &mut o.flamegraph,
        &mut o.drcov,
        &mut o.callgrind,
        &mut o.pprof,
    ]
    .into_iter()
    .flatten()
    {
        if let Ok(abs) = std::path::absolute(&*p) {
            *p = abs;
        }
    }
}

/// `path` with `suffix` appended to its file name; a character device or FIFO
/// (`--report /dev/null`, a named pipe) keeps its name: every process image writes to it.
fn with_suffix(path: &std::path::Path, suffix: &str) -> PathBuf {
    if hotpath_report::is_stream_file(path) {
        return path.to_path_buf();
    }
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// How the guest's `execve` runs the new program: under this hotpath with the same options
/// and every output file renamed with [`EXEC_SUFFIX`] (after the current image's own name,
/// which a fork may have changed), or natively with `--no-follow-exec`.
fn exec_wrapper(args: &RunArgs, monitoring: &Monitoring) -> Option<ExecWrapper> {
    if args.no_follow_exec {
        return None;
    }
    let hotpath = std::env::current_exe().ok()?;
    let mut a: Vec<OsString> = vec!["run".into()];
    let mut opt = |name: &str, value: Option<OsString>| {
        a.push(name.into());
        a.extend(value);
    };
    if args.no_monitor {
        opt("--no-monitor", None);
    }
    if args.perf_map {
        opt("--perf-map", None);
    }
    // The cache this run resolved, whatever the environment the guest gives its child.
    match args.translation_cache() {
        Some(dir) => opt("--cache-dir", Some(dir.into())),
        None => opt("--no-cache", None),
    }
    opt("--ring-entries", Some(args.ring_entries.to_string().into()));
    if let Some(cpu) = args.monitor_cpu {
        opt("--monitor-cpu", Some(cpu.to_string().into()));
    }
    if args.quiet {
        opt("--quiet", None);
    }
    if let Some(r) = &monitoring.report {
        opt("--report", Some(with_suffix(r, EXEC_SUFFIX).into()));
    }
    if let Some(r) = &monitoring.profile {
        opt("--profile", Some(with_suffix(r, EXEC_SUFFIX).into()));
    }
    if args.records_paths() {
        opt("--paths", None);
    }
    opt("--k", Some(args.k.to_string().into()));
    if args.call_tree {
        opt("--call-tree", None);
    }
    if let Some(n) = args.pap_threshold {
        opt("--pap-threshold", Some(n.to_string().into()));
    } else if args.pap_runs {
        opt("--pap-runs", None);
    }
    if args.paths_recorder != crate::cli::PathsRecorder::Sums {
        let name = clap::ValueEnum::to_possible_value(&args.paths_recorder).expect("a named value");
        opt("--paths-recorder", Some(name.get_name().to_string().into()));
    }
    if args.no_superblocks {
        opt("--no-superblocks", None);
    }
    if args.no_vdso {
        opt("--no-vdso", None);
    }
    opt(
        "--superblock-threshold",
        Some(args.superblock_threshold.to_string().into()),
    );
    let o = &monitoring.outputs;
    opt("--top", Some(o.top.to_string().into()));
    if o.disasm {
        opt("--disasm", None);
    }
    if o.lines {
        opt("--lines", None);
    }
    for (name, file) in [
        ("--dot", &o.dot),
        ("--flamegraph", &o.flamegraph),
        ("--drcov", &o.drcov),
        ("--callgrind", &o.callgrind),
        ("--pprof", &o.pprof),
    ] {
        if let Some(f) = file {
            opt(name, Some(with_suffix(f, EXEC_SUFFIX).into()));
        }
    }
    a.push("--argv0".into());
    Some(ExecWrapper { hotpath, args: a })
}

/// The file `execvp` would run for `name`: `name` itself when it contains a slash, else the
/// first executable regular file called `name` in a directory of `PATH` (default
/// `/usr/local/bin:/usr/bin:/bin`, as glibc's), else `name` (the loader then reports it
/// missing).
fn search_path(name: &std::ffi::OsStr) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    if name.as_bytes().contains(&b'/') || name.is_empty() {
        return PathBuf::from(name);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| {
            // An empty entry means the current directory.
            if dir.as_os_str().is_empty() {
                PathBuf::from(".").join(name)
            } else {
                dir.join(name)
            }
        })
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Builds the report of `result` and writes every output asked for: the JSON report, the other
/// files, and the stderr summary (unless `quiet`).
fn finish_report(
    args: &RunArgs,
    program: &Path,
    translator: &Translator,
    monitoring: &Monitoring,
    result: MonitorResult,
    ending: Ending,
    quiet: bool,
) {
    // The process ends right after an exit's report: its memory goes with it, unfreed (a
    // python3 run's tables, catalog and report took 3 ms to free).
    let process_ends = !matches!(ending, Ending::Exec);
    let guest_modules = translator.modules();
    // Rendered only when something rendered is asked for: a raw profile alone reads no
    // symbol and sums nothing by address (`hotpath report` does that later).
    let rendered = !quiet || monitoring.report.is_some() || monitoring.outputs.any_file();
    let ended = result.ended;
    let mut threads = ended.threads;
    let has_paths = result.threads.iter().any(|t| t.state.paths.is_some())
        || threads.iter().any(|(_, t)| t.path_profile.is_some());
    let modules = (rendered || has_paths).then(|| ModuleMap::read(&guest_modules));
    let name_of = |addr: u64| address_name(modules.as_ref(), addr);
    let (mut waits, mut wait_ns, mut busy_ns) = (0, 0, ended.busy_ns);
    for (_, t) in &threads {
        waits += t.ring_waits;
        wait_ns += t.ring_wait_ns;
    }
    // The process's tables: every thread's counts over one id space, the threads the
    // monitor folded as they ended included. A process that ran one thread has that
    // thread's (which learned every id when the monitor finished it), and its thread row is
    // read off the report instead of counted again (a fifth of a short run's report).
    // Path profiles are per thread (each has its shadow stack): an ended thread's row has
    // its own already, the others' are taken here.
    let mut result_threads = result.threads;
    let mut only_row = None;
    let mut only_paths = None;
    let mut tables = if threads.is_empty() && result_threads.len() == 1 {
        let t = result_threads.remove(0);
        let events = t.state.tables.events;
        waits += t.waits.waits;
        wait_ns += t.waits.wait_ns;
        busy_ns += t.state.busy_ns;
        only_row = Some((t.tid, events, t.waits.waits, t.waits.wait_ns));
        only_paths = t.state.paths;
        t.state.tables
    } else {
        let mut tables = Tables::default();
        tables.learn_from(&result.catalog);
        tables.merge(&ended.tables);
        tables
    };
    for t in result_threads {
        tables.merge(&t.state.tables);
        waits += t.waits.waits;
        wait_ns += t.waits.wait_ns;
        busy_ns += t.state.busy_ns;
        let mut row = thread_report(t.tid, &t.state.tables, t.waits.waits, t.waits.wait_ns);
        if let Some(mut rec) = t.state.paths {
            rec.finish();
            row.path_profile = Some(rec.profile(&name_of));
        }
        threads.push((t.state.started, row));
    }
    // In the order the threads started.
    threads.sort_by_key(|&(started, _)| started);
    let mut threads: Vec<_> = threads.into_iter().map(|(_, t)| t).collect();
    // The process's path profile: its one thread's, or every thread's summed (each row keeps
    // its own).
    let path_profile = match only_paths {
        Some(mut rec) => {
            rec.finish();
            Some(rec.profile(&name_of))
        }
        None if threads.len() == 1 => threads[0].path_profile.take(),
        None => hotpath_report::merge::sum_path_profiles(
            threads
                .iter()
                .filter_map(|t| t.path_profile.clone())
                .collect(),
        ),
    };
    let stats = translator.stats();
    let parts = raw::Parts {
        run: RunInfo {
            program: program.display().to_string(),
            argv: args
                .command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            ending,
            blocks_translated: stats.blocks_translated,
            blocks_loaded: stats.blocks_loaded,
            translation_cache_errors: translator.cache_stats().map_or(0, |s| s.errors),
            translation_ns: stats.translation_ns(),
        },
        threads,
        only_row,
        ring_waits: waits,
        ring_wait_ns: wait_ns,
        monitor_busy_ns: busy_ns,
        path_profile,
    };
    if let Some(path) = &monitoring.profile {
        if let Err(e) = raw::write(path, &tables, &parts, &guest_modules) {
            crate::say(format_args!("hotpath: cannot write the raw profile: {e}"));
        }
    }
    if let Some(modules) = modules.as_ref().filter(|_| rendered) {
        // The text summary alone lists no direct edge.
        let rows = if monitoring.report.is_some() || monitoring.outputs.any_file() {
            Rows::All
        } else {
            Rows::NoDirectEdges
        };
        let report = raw::assemble(&tables, parts, modules, rows);
        if let Some(path) = &monitoring.report {
            outputs::write_json(&report, path);
        }
        if !quiet {
            crate::say_text(&outputs::summary(&report, &monitoring.outputs));
        }
        // hotpath runs the guest in its own process: its pid is the guest's.
        outputs::write_files(&report, &monitoring.outputs, Some(std::process::id()));
        if process_ends {
            std::mem::forget(report);
        }
    }
    if process_ends {
        std::mem::forget(tables);
        std::mem::forget(result.catalog);
    }
}

/// Ends this process by signal `sig` with its default action, as the guest died natively.
fn die_of(sig: i32) -> ExitCode {
    // SAFETY: resetting a disposition, unblocking and raising affect only this process, which
    // is meant to end here.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    crate::say(format_args!(
        "hotpath: the guest died of {} but the signal did not end hotpath",
        signal_name(sig)
    ));
    ExitCode::from(128 + sig as u8)
}

#[cfg(test)]
mod tests {
    use super::choose_monitor_cpu;

    #[test]
    fn the_monitor_goes_beside_the_guest_and_concurrent_runs_spread() {
        // One CPU, or a busy machine: the scheduler places the monitor.
        assert_eq!(choose_monitor_cpu(&[0], Some(0), Some(1), 7), None);
        assert_eq!(choose_monitor_cpu(&[0, 1], Some(0), Some(3), 7), None);
        // Never the guest's CPU.
        for pid in 0..8 {
            assert_eq!(choose_monitor_cpu(&[0, 1], Some(0), Some(1), pid), Some(1));
            assert_eq!(choose_monitor_cpu(&[0, 1], Some(1), Some(2), pid), Some(0));
        }
        // Runs with different pids use different CPUs, not all the last one.
        let chosen: std::collections::BTreeSet<usize> = (100..104)
            .filter_map(|pid| choose_monitor_cpu(&[0, 1, 2, 3], Some(0), Some(1), pid))
            .collect();
        assert_eq!(chosen.into_iter().collect::<Vec<_>>(), vec![1, 2, 3]);
    }
}

/// A guest address named as the reports name it: `symbol`, `symbol+0xOFF`, else `sub_<hex>`.
fn address_name(modules: Option<&ModuleMap>, addr: u64) -> String {
    match modules.and_then(|m| m.symbolize(addr)) {
        Some((name, 0)) => name.to_string(),
        Some((name, off)) => format!("{name}+{off:#x}"),
        None => format!("sub_{addr:x}"),
    }
}

/// Times the monitor tries for the modules' list when a thread's path profile is taken while a
/// guest thread holds the memory map, [`MODULES_RETRY`] apart.
const MODULES_TRIES: u32 = 20;
const MODULES_RETRY: std::time::Duration = std::time::Duration::from_micros(100);

/// The monitor's [`Namer`]: names addresses from the modules mapped when a thread's profile is
/// taken, their symbols read again only when the list changed since the last time.
fn namer(source: ModuleSource) -> Namer {
    type Cached = Option<(Vec<GuestModule>, Arc<ModuleMap>)>;
    let cache: std::sync::Mutex<Cached> = std::sync::Mutex::new(None);
    Arc::new(move || {
        let mut cached = cache.lock().unwrap_or_else(|e| e.into_inner());
        let now = (0..MODULES_TRIES).find_map(|i| {
            if i > 0 {
                std::thread::sleep(MODULES_RETRY);
            }
            source.try_modules()
        });
        if let Some(now) = now {
            if cached.as_ref().is_none_or(|(was, _)| *was != now) {
                let map = Arc::new(ModuleMap::read(&now));
                *cached = Some((now, map));
            }
        }
        let map = cached.as_ref().map(|(_, m)| m.clone());
        Box::new(move |addr| address_name(map.as_deref(), addr))
    })
}
