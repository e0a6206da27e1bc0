//! `hotpath`: run an x86-64 Linux program under the dynamic binary translator and profile it.
//!
//! ```text
//! hotpath run [OPTIONS] -- PROGRAM [ARGS...]
//! hotpath report FILE.json [--top N] [--dot DIR] [--flamegraph FILE.svg]
//!   load ELF ──▶ stack/auxv ──▶ translator (this thread) ──events──▶ monitor thread (pinned)
//!   guest ends ──▶ close ring ──▶ monitor drains ──▶ JSON report, summary ──▶ exit like the guest
//!   guest forks ──▶ the child gets its own ring, monitor and report (FILE.<pid>)
//!   guest execs ──▶ report written, then the new program runs natively
//! ```

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

mod modules;

use clap::{Parser, Subcommand};
use hotpath_events::{DEFAULT_RING_ENTRIES, MAX_RING_ENTRIES, MIN_RING_ENTRIES};
use hotpath_loader::{build_stack, load, resolve_script, LoadError, LoadOptions};
use hotpath_monitor::report::{self, Ending, RunInfo};
use hotpath_monitor::{
    FunctionSymbol, MonitorHandle, MonitorResult, MonitorState, PathConfig, PathProfile,
    PathRecorder, Profile, Stream, Tables, ThreadProfile, DEFAULT_PAP_THRESHOLD,
    DEFAULT_SUPERBLOCK_THRESHOLD,
};
use hotpath_translator::code_cache::CODE_CACHE_SIZE;
use modules::ModuleMap;

use hotpath_translator::{
    signal_name, Config, ExecWrapper, Forked, GuestExit, Stop, ThreadStart, TranslateError,
    Translator,
};

/// Rows of each table in the stderr summary.
const SUMMARY_TOP: usize = 10;

#[derive(Parser)]
#[command(
    name = "hotpath",
    version,
    about = "A dynamic binary translator for x86-64 Linux programs, with exact block and path profiles"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run PROGRAM under translation; it behaves as it does natively.
    Run(RunArgs),
    /// Render a saved JSON report (from `run --report`) as text, DOT files or a flame graph.
    Report(ReportArgs),
}

#[derive(clap::Args)]
struct ReportArgs {
    /// The JSON report.
    file: PathBuf,
    /// Rows of each table.
    #[arg(long, default_value_t = SUMMARY_TOP)]
    top: usize,
    /// Write a Graphviz file per hot function into DIR.
    #[arg(long, value_name = "DIR")]
    dot: Option<PathBuf>,
    /// Write a flame graph of the shadow call stack to FILE.svg.
    #[arg(long, value_name = "FILE.svg")]
    flamegraph: Option<PathBuf>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Do not emit the enqueue stub and run no monitor (measures the translator alone).
    #[arg(long)]
    no_monitor: bool,
    /// Event ring capacity in entries (a power of two).
    #[arg(long, default_value_t = DEFAULT_RING_ENTRIES, value_parser = parse_ring_entries)]
    ring_entries: u64,
    /// Pin the monitor thread to this CPU (default: the last CPU this process may use, when
    /// there are at least two).
    #[arg(long)]
    monitor_cpu: Option<usize>,
    /// Print no summary on stderr.
    #[arg(long, short)]
    quiet: bool,
    /// Write the profile as JSON (schema hotpath-report/1, docs/report-schema.md) to FILE.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Record path profiles (functions, shadow stack, Ball-Larus and PAP paths, k-paths).
    /// Off by default: 1.1-12x the tables-only run's time on the bench samples
    /// (bench/paths.sh; README "Path profiles").
    #[arg(long, overrides_with = "no_paths")]
    paths: bool,
    /// Record tables only: no functions, shadow stack or path profiles (the default).
    #[arg(long)]
    no_paths: bool,
    /// Record k-iteration paths: runs of up to N consecutive Ball-Larus paths (0: none).
    #[arg(long = "k", value_name = "N", default_value_t = 0)]
    k: usize,
    /// Path ends after which a function is hot and records PAP cyclic paths (0: all).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PAP_THRESHOLD)]
    pap_threshold: u64,
    /// Record paths one basic block at a time, without memoised transitions: the slower
    /// reference the default recorder is checked against (same profile).
    #[arg(long)]
    paths_per_block: bool,
    /// Build no superblocks: every block enqueues its own event (measures what superblocks
    /// buy; the profile is the same).
    #[arg(long)]
    no_superblocks: bool,
    /// Executions of a loop's back edge after which the monitor asks for a superblock at the
    /// loop head (the monitor-thread patent's 3000).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SUPERBLOCK_THRESHOLD,
          value_parser = clap::value_parser!(u64).range(1..))]
    superblock_threshold: u64,
    /// Rows of each table in the summary (hot paths, blocks, indirect branches).
    #[arg(long, default_value_t = SUMMARY_TOP)]
    top: usize,
    /// Write a Graphviz file per hot function into DIR.
    #[arg(long, value_name = "DIR")]
    dot: Option<PathBuf>,
    /// Write a flame graph of the shadow call stack to FILE.svg.
    #[arg(long, value_name = "FILE.svg")]
    flamegraph: Option<PathBuf>,
    /// The name the program sees as its argv[0] (default: PROGRAM as given).
    #[arg(long, value_name = "NAME")]
    argv0: Option<OsString>,
    /// Run the programs the guest execs natively instead of under hotpath.
    #[arg(long)]
    no_follow_exec: bool,
    /// Give the guest no vDSO (as valgrind does): its time functions make system calls.
    #[arg(long)]
    no_vdso: bool,
    /// The program and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "PROGRAM [ARGS]"
    )]
    command: Vec<OsString>,
}

fn parse_ring_entries(s: &str) -> Result<u64, String> {
    let n: u64 = s.parse().map_err(|e| format!("{e}"))?;
    if !n.is_power_of_two() || !(MIN_RING_ENTRIES..=MAX_RING_ENTRIES).contains(&n) {
        return Err(format!(
            "must be a power of two in [{MIN_RING_ENTRIES}, {MAX_RING_ENTRIES}]"
        ));
    }
    Ok(n)
}

fn main() -> ExitCode {
    // Read the usable CPUs before any thread is pinned (children inherit masks).
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(args, &cores),
        Command::Report(args) => render_report(args),
    }
}

/// `hotpath report`: renders a saved JSON report alone.
fn render_report(args: ReportArgs) -> ExitCode {
    let doc: serde_json::Value = match std::fs::read_to_string(&args.file)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("hotpath: {}: {e}", args.file.display());
            return ExitCode::from(1);
        }
    };
    if doc["schema"] != report::SCHEMA {
        eprintln!(
            "hotpath: {}: not a {} report",
            args.file.display(),
            report::SCHEMA
        );
        return ExitCode::from(1);
    }
    print!("{}", report::render_text(&doc, args.top));
    write_extras(
        &doc,
        args.dot.as_deref(),
        args.flamegraph.as_deref(),
        args.top,
    )
}

/// Writes the DOT files and the flame graph, if asked.
fn write_extras(
    doc: &serde_json::Value,
    dot: Option<&std::path::Path>,
    flamegraph: Option<&std::path::Path>,
    top: usize,
) -> ExitCode {
    let mut status = ExitCode::SUCCESS;
    if let Some(dir) = dot {
        if let Err(e) = report::write_dot(doc, dir, top) {
            eprintln!(
                "hotpath: cannot write DOT files into {}: {e}",
                dir.display()
            );
            status = ExitCode::from(1);
        }
    }
    if let Some(path) = flamegraph {
        if let Err(e) = report::write_flamegraph(doc, path) {
            eprintln!("hotpath: cannot write the flame graph: {e}");
            status = ExitCode::from(1);
        }
    }
    status
}

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
    /// Where the rings of new guest threads go to the monitor.
    streams: Option<crossbeam::channel::Sender<Stream>>,
    /// Path recording for a new monitor (None: `--no-paths`).
    paths: Option<PathConfig>,
    /// The hot threshold for superblocks (None: `--no-superblocks`).
    superblock_threshold: Option<u64>,
    core: Option<core_affinity::CoreId>,
    report: Option<PathBuf>,
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
        }
    }

    /// Starts a monitor on the translator's ring, going on from `state`.
    fn start(&mut self, translator: &mut Translator, state: MonitorState) {
        let (tx, rx) = crossbeam::channel::unbounded();
        translator.set_block_sender(tx);
        let first = self.stream(translator);
        let (stx, srx) = crossbeam::channel::unbounded();
        self.streams = Some(stx);
        self.handle = Some(hotpath_monitor::spawn(
            first,
            srx,
            rx,
            self.core,
            state,
            self.fresh(),
        ));
    }

    /// In a forked child: the parent's monitor thread does not exist here, so a new one
    /// starts on this (the only) thread's ring, with empty tables, and the report goes to
    /// `FILE.<pid>`.
    fn restart_in_child(&mut self, translator: &mut Translator) {
        if let Some(old) = self.handle.take() {
            // Dropping them could wait on the parent's monitor thread.
            std::mem::forget(old);
            if let Some(old) = self.streams.take() {
                std::mem::forget(old);
            }
            self.report = self
                .report
                .take()
                .map(|p| with_suffix(&p, &format!(".{}", std::process::id())));
            let fresh = self.fresh();
            self.start(translator, fresh);
        }
    }

    /// Hands a new guest thread's ring to the monitor.
    fn add_thread(&self, translator: &mut Translator) {
        if self.handle.is_some() {
            let s = self.stream(translator);
            if let Some(tx) = &self.streams {
                let _ = tx.send(s);
            }
        }
    }

    /// Closes the ring (the other threads' are closed or stopped) and collects what the
    /// monitor kept.
    fn stop(&mut self, translator: &Translator) -> Option<MonitorResult> {
        let handle = self.handle.take()?;
        self.streams = None;
        translator.ring_producer()?.close();
        match handle.finish() {
            Ok(result) => Some(result),
            Err(e) => {
                eprintln!("hotpath: internal error (bug in hotpath): the monitor failed ({e}); no profile");
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
            match translator.run() {
                Ok(Stop::Exit(e)) => self.end(&translator, Ok(e)),
                Err(e) => self.end(&translator, Err(e)),
                Ok(Stop::ThreadExit) => {
                    translator.recycle();
                    return;
                }
                Ok(Stop::Exec) => {
                    // The kernel ends every other thread at an execve.
                    translator.stop_other_threads();
                    let mut monitoring = self.monitoring();
                    if let Some(result) = monitoring.stop(&translator) {
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

    /// Ends the process from the calling guest thread: stops the others, writes the
    /// profile, and exits as the guest did.
    fn end(&self, translator: &Translator, outcome: Result<GuestExit, TranslateError>) -> ! {
        translator.stop_other_threads();
        let ending = match &outcome {
            Ok(GuestExit::Exited(code)) => Ending::Exited(*code),
            Ok(GuestExit::Signaled(sig)) => Ending::Signaled(*sig, signal_name(*sig)),
            Err(e) => Ending::Error(e.to_string()),
        };
        if let Err(e) = &outcome {
            eprintln!("hotpath: {}: {e}", self.program.display());
        }
        let mut monitoring = self.monitoring();
        if let Some(result) = monitoring.stop(translator) {
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
        if !self.args.quiet {
            let s = translator.stats();
            eprintln!(
                "hotpath: translator: {} blocks translated in {:.3} s, {} superblocks built ({} requests dropped), {} links, {} indirect lookup misses, {} syscalls, {} flushes, {} ring refills, {} threads",
                s.blocks_translated,
                s.translation_ns as f64 / 1e9,
                s.superblocks,
                s.superblocks_dropped,
                s.links,
                s.ibl_misses,
                s.syscalls,
                s.flushes,
                s.ring_refills,
                translator.threads_started()
            );
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
        let spawned = std::thread::Builder::new()
            .name("hotpath-guest".into())
            .stack_size(GUEST_THREAD_HOST_STACK)
            .spawn(move || {
                let Ok(mut translator) = Translator::start_thread(start) else {
                    return;
                };
                ctx.monitoring().add_thread(&mut translator);
                ctx.guest_thread(translator);
            });
        // SAFETY: restoring the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut()) };
        spawned.map(|_| ())
    })
}

/// Stack of the host thread that runs a guest thread's dispatcher, in bytes (the guest's own
/// stack is its own).
const GUEST_THREAD_HOST_STACK: usize = 8 << 20;

fn run(mut args: RunArgs, cores: &[core_affinity::CoreId]) -> ExitCode {
    let file = search_path(&args.command[0]);
    if let Some(name) = args.argv0.take() {
        // The report shows the argv the guest saw.
        args.command[0] = name;
    }
    let (program, argv) = match resolve_script(&file, &args.command) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("hotpath: {e}");
            return ExitCode::from(load_error_status(&e));
        }
    };
    let image = match load(
        &program,
        LoadOptions {
            extra_reserve: CODE_CACHE_SIZE,
        },
    ) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("hotpath: {e}");
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
            eprintln!("hotpath: {e}");
            return ExitCode::from(126);
        }
    };

    let monitor_on = !args.no_monitor;
    let cfg = Config {
        enqueue: monitor_on,
        ring_entries: args.ring_entries,
        superblocks: monitor_on && !args.no_superblocks,
        vdso: !args.no_vdso,
    };
    let mut translator = match Translator::new(&image, &stack, cfg, None) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("hotpath: {}: {e}", image.path.display());
            return ExitCode::from(70);
        }
    };
    let core = match args.monitor_cpu {
        Some(id) => Some(core_affinity::CoreId { id }),
        None if cores.len() >= 2 => cores.last().copied(),
        None => None,
    };
    let paths = (args.paths && !args.no_paths).then(|| PathConfig {
        pap_threshold: args.pap_threshold,
        k: args.k,
        per_block: args.paths_per_block,
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
        streams: None,
        paths,
        superblock_threshold: (!args.no_superblocks).then_some(args.superblock_threshold),
        core,
        report: args.report.clone(),
    };
    if monitor_on {
        let fresh = monitoring.fresh();
        monitoring.start(&mut translator, fresh);
    } else if args.report.is_some() {
        eprintln!("hotpath: no report: --no-monitor collects no profile");
    }
    let ctx = Arc::new(RunCtx {
        program: image.path.clone(),
        args,
        monitoring: std::sync::Mutex::new(monitoring),
    });
    translator.set_spawner(spawner(ctx.clone()));
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

/// Suffix added to every output file name of a program the guest execs, so that no process
/// image overwrites another's report (a forked child adds `.<pid>` instead).
const EXEC_SUFFIX: &str = ".exec";

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &std::path::Path, suffix: &str) -> PathBuf {
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
    if args.paths && !args.no_paths {
        opt("--paths", None);
    }
    opt("--k", Some(args.k.to_string().into()));
    opt(
        "--pap-threshold",
        Some(args.pap_threshold.to_string().into()),
    );
    if args.paths_per_block {
        opt("--paths-per-block", None);
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
    opt("--top", Some(args.top.to_string().into()));
    if let Some(d) = &args.dot {
        opt("--dot", Some(with_suffix(d, EXEC_SUFFIX).into()));
    }
    if let Some(f) = &args.flamegraph {
        opt("--flamegraph", Some(with_suffix(f, EXEC_SUFFIX).into()));
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

/// Writes the JSON report (if asked) and the stderr summary (unless `quiet`).
fn finish_report(
    args: &RunArgs,
    program: &Path,
    translator: &Translator,
    monitoring: &Monitoring,
    result: MonitorResult,
    ending: Ending,
    quiet: bool,
) {
    if quiet && monitoring.report.is_none() && args.dot.is_none() && args.flamegraph.is_none() {
        // Nobody reads the profile: building it would cost more than many short runs take.
        return;
    }
    let modules = ModuleMap::read(&translator.modules());
    let symbolize = |addr: u64| modules.symbolize(addr);
    // The process's tables: every thread's counts over one id space.
    let mut tables = Tables::default();
    for b in &result.catalog {
        tables.learn(b.clone());
    }
    let (mut waits, mut wait_ns, mut busy_ns) = (0, 0, 0);
    let mut threads = Vec::new();
    // Path profiles are per thread (each has its shadow stack); the report shows the one of
    // the thread that ran the most events.
    let mut paths: Option<(u64, PathRecorder)> = None;
    for t in result.threads {
        tables.merge(&t.state.tables);
        waits += t.waits.waits;
        wait_ns += t.waits.wait_ns;
        busy_ns += t.state.busy_ns;
        threads.push(ThreadProfile::from_tables(
            t.tid,
            &t.state.tables,
            t.waits.waits,
            t.waits.wait_ns,
        ));
        if let Some(rec) = t.state.paths {
            if paths
                .as_ref()
                .is_none_or(|(n, _)| t.state.tables.events > *n)
            {
                paths = Some((t.state.tables.events, rec));
            }
        }
    }
    let paths = paths.map(|(_, rec)| rec);
    let mut profile = Profile::from_tables(&tables, &symbolize);
    profile.threads = threads;
    profile.totals.ring_waits = waits;
    profile.totals.ring_wait_ns = wait_ns;
    profile.totals.monitor_busy_ns = busy_ns;
    profile.read_code();
    profile.attribute_modules(modules.profiles.clone());
    if let Some(mut rec) = paths {
        rec.finish();
        let name_of = |addr: u64| match modules.symbolize(addr) {
            Some((name, 0)) => name.to_string(),
            Some((name, off)) => format!("{name}+{off:#x}"),
            None => format!("sub_{addr:x}"),
        };
        profile.paths = Some(PathProfile::from_recorder(&rec, &name_of));
    }
    if let Some(path) = &monitoring.report {
        let run = RunInfo {
            program: program.display().to_string(),
            argv: args
                .command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            ending,
            blocks_translated: translator.stats().blocks_translated,
            translation_ns: translator.stats().translation_ns,
        };
        if let Err(e) = report::write_json(path, &profile, &run) {
            eprintln!("hotpath: cannot write the report {}: {e}", path.display());
        }
    }
    let run = RunInfo {
        program: program.display().to_string(),
        argv: args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        ending: Ending::Exec,
        blocks_translated: translator.stats().blocks_translated,
        translation_ns: translator.stats().translation_ns,
    };
    let doc = report::to_json(&profile, &run);
    if !quiet {
        eprint!("{}", report::render_text(&doc, args.top));
    }
    write_extras(
        &doc,
        args.dot.as_deref(),
        args.flamegraph.as_deref(),
        args.top,
    );
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
    eprintln!(
        "hotpath: the guest died of {} but the signal did not end hotpath",
        signal_name(sig)
    );
    ExitCode::from(128 + sig as u8)
}
