//! End-to-end test support: building guest samples and running them natively and under hotpath.
//!
//! ```text
//! guest-samples/*.c, *.S ──gcc (static, static-pie, dynamic)──▶ <target>/guest-samples/<source>.<linkage>
//!                                                            │
//!              native run ◀──────────────────────────────────┼──────────────▶ hotpath run [--no-monitor]
//!                  │                                                              │
//!                  └────────── Outcome { stdout, stderr, exit code or signal } ───┴──▶ compare, diff
//! ```
//!
//! - [`catalog`]: the table of samples, their arguments and the status they end with;
//! - [`guest_build`]: compiling samples once per source and linkage, shared by parallel tests
//!   and by concurrent test processes;
//! - [`hotpath_bin`]: finding (and, in a cargo run, building) the `hotpath` binary;
//! - [`runner`]: running a command with a timeout and capturing everything it did;
//! - [`compare`]: comparing two outcomes and explaining the difference with a diff;
//! - [`debian`]: real programs from Debian as workloads, checked against their native runs;
//! - [`report`]: running a guest with `--report`, reading the JSON, checking its consistency;
//! - [`check_sample`]: the whole check for one sample, as the `samples` test calls it.
//!
//! The integration tests (`tests/tests/`) include:
//! - `samples`: every sample x {static, static-pie, and for C samples dynamic} x
//!   {`--no-monitor`, monitor on, eager superblocks}, native vs hotpath (samples that find a
//!   known bug are `#[ignore = "bug: ..."]`);
//! - `bad_input`: a corpus of files hotpath must reject with one clear line;
//! - `busybox`: busybox-static's shell and applets on generated inputs, native vs hotpath, and
//!   Ctrl-C (SIGINT) ending `hotpath run -- busybox sleep 5` as it ends busybox;
//! - `dynamic`: real dynamically linked programs from Debian (python3, sqlite3, lua5.4,
//!   luajit, gawk, xz, bzip2, zstd, perl, dash) on generated inputs, a sample that dlopens,
//!   calls, dlcloses and dlopens a library again, and ld.so failing on a missing library,
//!   native vs hotpath;
//! - `threads`: exact per-thread counts of a pthread sample, and real threaded programs from
//!   Debian (zstd -T2, xz -T2, sort --parallel=2, python3 threading) native vs hotpath;
//! - `report`: the `--report` JSON is written however the guest ends (exit, faults, abort,
//!   SIGINT to hotpath, forked children's `FILE.<pid>`), is consistent, and does not depend on
//!   the ring size;
//! - `counts`: exact block, edge, indirect-target and syscall counts of the `count_*` samples,
//!   and instruction totals equal to valgrind's for freestanding samples;
//! - `valgrind`: instruction counts of a glibc program and a busybox applet against valgrind,
//!   address by address, every difference attributed to a documented cause;
//! - others (`paths`, `fs_fallback`) say what they check in their module doc.
//!
//! Run them with `cargo test --release -p hotpath-e2e` (or as part of
//! `cargo test --release --workspace`); one sample: `... --test samples -- asm_flags`.
//!
//! Environment variables:
//! - `HOTPATH_BIN`: the hotpath binary to test (no cargo build is attempted then);
//! - `HOTPATH_E2E_NO_BUILD=1`: do not run `cargo build` for hotpath, use what is in the target dir;
//! - `HOTPATH_E2E_TIMEOUT`: seconds before a run counts as hung and is killed (default 60);
//! - `HOTPATH_BLESS=1`: rewrite `guest-samples/expected/` from native runs.

pub mod catalog;
pub mod compare;
pub mod debian;
pub mod guest_build;
pub mod hotpath_bin;
pub mod inputs;
pub mod paths;
pub mod report;
pub mod runner;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub use catalog::{Expected, Linkage, Sample, UnderHotpath, SAMPLES};
pub use runner::{Outcome, Termination};

/// How hotpath runs a guest in one test configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MonitorMode {
    /// `hotpath run --no-monitor`: translation only.
    Off,
    /// `hotpath run`: translation with the monitor thread profiling every block.
    On,
    /// `hotpath run --superblock-threshold 1`: the monitor asks for a superblock at every
    /// loop head as soon as its back edge is taken once, so the samples' short loops run in
    /// superblocks too (with their side exits, faults and signals).
    EagerSuperblocks,
    /// `--paths --superblock-threshold 1`: eager superblocks, and the monitor records path
    /// profiles (translated code is the same as without paths; the monitor's work per event
    /// and the guest's waits on it are not). Samples only ([`check_sample`]), not in
    /// [`MonitorMode::ALL`].
    Paths,
}

impl MonitorMode {
    pub const ALL: [MonitorMode; 3] = [
        MonitorMode::Off,
        MonitorMode::On,
        MonitorMode::EagerSuperblocks,
    ];

    pub fn label(self) -> &'static str {
        match self {
            MonitorMode::Off => "--no-monitor",
            MonitorMode::On => "monitor on",
            MonitorMode::EagerSuperblocks => "--superblock-threshold 1",
            MonitorMode::Paths => "--paths --superblock-threshold 1",
        }
    }
}

/// Where the tests expect busybox-static.
pub const BUSYBOX: &str = "/bin/busybox";

/// [`BUSYBOX`], or `None` after printing why the calling test is skipped.
///
/// # Panics
///
/// When busybox is missing under CI (`CI` set to `true` or `1`): `.ci/setup` installs it.
pub fn busybox() -> Option<&'static Path> {
    let path = Path::new(BUSYBOX);
    if path.is_file() {
        return Some(path);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(
        !ci,
        "{BUSYBOX} is missing under CI: .ci/setup installs busybox-static"
    );
    // Written to the real stderr, not the captured test output, so it is seen.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED (not a pass): {BUSYBOX} is missing; install busybox-static (.ci/setup does)"
    );
    None
}

/// Seconds a single run may take before it is killed and reported as a hang. Native runs of
/// every sample take well under a second.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;

/// After this many hung runs in one test process, later hotpath runs get
/// [`hang_timeout`] instead: a hotpath that hangs on everything then fails the suite in a
/// few minutes, not in (samples x configurations x 60 s).
const HANGS_BEFORE_SHORT_TIMEOUT: usize = 2;

static HANGS: AtomicUsize = AtomicUsize::new(0);

/// The per-run timeout: `HOTPATH_E2E_TIMEOUT` seconds, or [`DEFAULT_TIMEOUT_SECS`].
pub fn run_timeout() -> Duration {
    let secs = std::env::var("HOTPATH_E2E_TIMEOUT")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_TIMEOUT_SECS);
    Duration::from_secs(secs)
}

/// The timeout of a hotpath run whose native run took `native`: [`run_timeout`], or, once
/// several runs have hung, 5 s or 30 times the native time, whichever is longer (but never
/// more than [`run_timeout`]).
pub fn hang_timeout(native: Duration) -> Duration {
    let full = run_timeout();
    if HANGS.load(Ordering::Relaxed) >= HANGS_BEFORE_SHORT_TIMEOUT {
        (native * 30).max(Duration::from_secs(5)).min(full)
    } else {
        full
    }
}

/// Environment variables passed from the test process to every run (native and hotpath),
/// so a developer can still ask hotpath for logs or backtraces.
const PASSED_THROUGH_ENV: &[&str] = &["RUST_BACKTRACE", "RUST_LOG", "HOTPATH_LOG"];

/// Gives `cmd` the fixed environment and working directory every run gets, so a native run
/// and a hotpath run of the same guest see the same process state.
pub fn set_guest_environment(cmd: &mut Command, cwd: &Path) {
    default_terminal_signals(cmd);
    cmd.env_clear();
    cmd.env("PATH", "/usr/local/bin:/usr/bin:/bin");
    cmd.env("LC_ALL", "C");
    cmd.env("HOTPATH_E2E_VAR", "a value with spaces = and symbols");
    cmd.env("HOTPATH_E2E_OTHER", "1");
    for name in PASSED_THROUGH_ENV {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    cmd.current_dir(cwd);
}

/// Gives `cmd`'s process SIGINT and SIGQUIT at their default actions, as a terminal's
/// foreground job has them (`Command` resets the signal mask, not dispositions): a suite run
/// started in the background by a non-interactive shell (a CI script's `&`) inherits both
/// ignored, and natively a program then ignores Ctrl-C too.
pub fn default_terminal_signals(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal(2) is async-signal-safe; the closure runs in the child between fork and
    // exec and touches nothing else.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
            Ok(())
        });
    }
}

/// The command that runs `exe` natively with `args`.
pub fn native_command(exe: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    set_guest_environment(&mut cmd, exe.parent().unwrap_or(Path::new("/")));
    cmd
}

/// The translation cache every hotpath run of this test process shares (a scratch
/// directory, private as hotpath requires, empty when the process starts). So the suite runs
/// each sample cold in the first mode that emits its code one way and warm in the next
/// (monitor on, then eager superblocks), with many tests writing one cache at once.
pub fn suite_cache_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| private_dir(paths::scratch_dir("translation-cache")))
}

/// `dir`, made private to this user (mode 0700): a translation cache directory.
pub fn private_dir(dir: PathBuf) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .unwrap_or_else(|e| panic!("chmod 0700 {}: {e}", dir.display()));
    dir
}

/// The command that runs `exe` with `args` under `hotpath run --quiet [--no-monitor]`, with
/// the suite's translation cache ([`suite_cache_dir`]).
pub fn hotpath_command(hotpath: &Path, mode: MonitorMode, exe: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(hotpath);
    cmd.arg("run").arg("--quiet");
    cmd.arg("--cache-dir").arg(suite_cache_dir());
    match mode {
        MonitorMode::Off => {
            cmd.arg("--no-monitor");
        }
        MonitorMode::On => {}
        MonitorMode::EagerSuperblocks => {
            cmd.args(["--superblock-threshold", "1"]);
        }
        MonitorMode::Paths => {
            cmd.args(["--paths", "--superblock-threshold", "1"]);
        }
    }
    cmd.arg("--").arg(exe).args(args);
    set_guest_environment(&mut cmd, exe.parent().unwrap_or(Path::new("/")));
    cmd
}

/// Runs `exe args` natively and under hotpath (monitor off and on), all in `cwd`, and compares
/// each hotpath run with the native one. For programs that are not catalog samples (e.g.
/// busybox applets on generated inputs).
///
/// # Errors
///
/// A report of every mismatch (or of a run that could not start), after all runs; the native
/// outcome is returned either way so the caller can also check it.
pub fn compare_with_native(exe: &Path, args: &[&str], cwd: &Path) -> (Outcome, Result<(), String>) {
    let mut native_cmd = Command::new(exe);
    native_cmd.args(args);
    set_guest_environment(&mut native_cmd, cwd);
    let native = runner::run(&mut native_cmd, run_timeout())
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", runner::describe(&native_cmd)));
    let hotpath = match hotpath_bin::hotpath() {
        Ok(path) => path,
        Err(e) => return (native, Err(format!("no hotpath binary to test: {e}"))),
    };
    let mut problems = String::new();
    for mode in MonitorMode::ALL {
        let mut cmd = hotpath_command(&hotpath, mode, exe, args);
        cmd.current_dir(cwd);
        match runner::run(&mut cmd, hang_timeout(native.elapsed)) {
            Ok(translated) => {
                if matches!(translated.termination, Termination::TimedOut(_)) {
                    HANGS.fetch_add(1, Ordering::Relaxed);
                }
                if let Err(report) = compare::compare_outcomes(&native, &translated) {
                    let _ = write!(
                        problems,
                        "\n[{}] hotpath differs from the native run\n  command: {} (in {})\n{report}",
                        mode.label(),
                        runner::describe(&cmd),
                        cwd.display()
                    );
                }
            }
            Err(e) => {
                let _ = write!(problems, "\n[{}] could not run hotpath: {e}", mode.label());
            }
        }
    }
    let verdict = if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    };
    (native, verdict)
}

/// The whole end-to-end check of one sample: for each of its linkages
/// ([`Sample::linkages`]), build it, run it natively,
/// compare the native run with the expected files in `guest-samples/expected/` (this catches
/// a broken or non-deterministic sample, not a hotpath bug), then run it under hotpath with
/// the monitor off and on and compare each run with the native one (or, for a sample marked
/// [`UnderHotpath::Unsupported`], check that hotpath refuses it with its one-line message).
///
/// # Panics
///
/// With a report of every mismatch found, after all configurations have run.
pub fn check_sample(name: &str) {
    let sample =
        catalog::find(name).unwrap_or_else(|| panic!("no sample named {name:?} in the catalog"));
    let hotpath = hotpath_bin::hotpath();
    let mut problems = Vec::new();

    for &linkage in sample.linkages() {
        let exe = match guest_build::build(sample.source, linkage) {
            Ok(exe) => exe,
            Err(e) => {
                problems.push(format!(
                    "[{linkage}] could not build {}: {e}",
                    sample.source
                ));
                continue;
            }
        };
        let native = match runner::run(&mut native_command(&exe, sample.args), run_timeout()) {
            Ok(outcome) => outcome,
            Err(e) => {
                problems.push(format!(
                    "[{linkage} native] could not run {}: {e}",
                    exe.display()
                ));
                continue;
            }
        };
        if let Err(report) = compare::check_expected(sample, linkage, &exe, &native) {
            problems.push(format!(
                "[{linkage} native] the NATIVE run does not match guest-samples/expected \
                 (the sample or the toolchain is at fault, not hotpath; \
                 HOTPATH_BLESS=1 regenerates the files):\n{report}"
            ));
        }
        let hotpath = match &hotpath {
            Ok(path) => path,
            Err(e) => {
                problems.push(format!("[{linkage}] no hotpath binary to test: {e}"));
                continue;
            }
        };
        for mode in MonitorMode::ALL.into_iter().chain([MonitorMode::Paths]) {
            let mut cmd = hotpath_command(hotpath, mode, &exe, sample.args);
            let label = format!("{linkage}, {}", mode.label());
            match runner::run(&mut cmd, hang_timeout(native.elapsed)) {
                Ok(translated) => {
                    if matches!(translated.termination, Termination::TimedOut(_)) {
                        HANGS.fetch_add(1, Ordering::Relaxed);
                    }
                    let verdict = match sample.under_hotpath {
                        UnderHotpath::SameAsNative => {
                            compare::compare_outcomes(&native, &translated)
                        }
                        UnderHotpath::Unsupported(message) => {
                            compare::check_refusal(&translated, message)
                        }
                    };
                    if let Err(report) = verdict {
                        problems.push(format!(
                            "[{label}] hotpath differs from the native run\n  command: {}\n{report}",
                            runner::describe(&cmd)
                        ));
                    }
                }
                Err(e) => problems.push(format!("[{label}] could not run hotpath: {e}")),
            }
        }
    }

    if !problems.is_empty() {
        let mut message = format!(
            "sample {name} ({}): {} problem(s)\n",
            sample.source,
            problems.len()
        );
        for p in &problems {
            let _ = writeln!(message, "\n{p}");
        }
        panic!("{message}");
    }
}
