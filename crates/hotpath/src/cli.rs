//! The command line: `hotpath run | report | merge | bench`, parsed with clap.
//!
//! Options go before the program: the first word that is not an option is the program, and
//! everything after it is the program's own arguments (`--` may separate them). An unknown
//! option before the program is an error with a usage line, never a program name.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use hotpath_events::{DEFAULT_RING_ENTRIES, MAX_RING_ENTRIES, MIN_RING_ENTRIES};
use hotpath_monitor::{DEFAULT_PAP_THRESHOLD, DEFAULT_SUPERBLOCK_THRESHOLD};

/// Rows of each table in the text summary.
pub const SUMMARY_TOP: usize = 10;

/// `hotpath`'s arguments.
#[derive(Parser, Debug)]
#[command(
    name = "hotpath",
    version,
    about = "A dynamic binary translator for x86-64 Linux programs, with exact block and path profiles"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run PROGRAM under translation; it behaves as it does natively.
    Run(RunArgs),
    /// Render a saved profile (JSON report or raw profile) as text, JSON, DOT files, a flame
    /// graph, drcov, callgrind or pprof.
    Report(ReportArgs),
    /// Sum the profiles (JSON reports or raw profiles) of several runs of one program into one
    /// JSON report.
    Merge(MergeArgs),
    /// Time PROGRAM natively, under hotpath in each mode, and under qemu-x86_64 when
    /// installed; print medians and ratios to native.
    Bench(BenchArgs),
    /// Show where the translation cache is, its size, hits and misses; `cache clear` empties
    /// it.
    Cache(CacheArgs),
}

/// `hotpath cache`.
#[derive(clap::Args, Debug)]
pub struct CacheArgs {
    /// `clear`: remove every persisted translation and the counts.
    #[arg(value_parser = ["clear"])]
    pub action: Option<String>,
    /// The cache directory (default: `$HOTPATH_CACHE_DIR`, else `$XDG_CACHE_HOME/hotpath`,
    /// else `~/.cache/hotpath`).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

/// Files rendered from a profile, by `run` and by `report`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OutputArgs {
    /// Rows of each table in the text summary.
    #[arg(long, default_value_t = SUMMARY_TOP)]
    pub top: usize,
    /// List each hot path's blocks with their guest disassembly in the text summary.
    #[arg(long)]
    pub disasm: bool,
    /// Show hot source lines also for modules whose debug information is in a separate file
    /// (/usr/lib/debug, from the system's -dbg/-dbgsym packages); a module built with -g has
    /// its hot lines without this.
    #[arg(long)]
    pub lines: bool,
    /// Write a Graphviz file per hot function into DIR (with `run`, records path profiles).
    #[arg(long, value_name = "DIR")]
    pub dot: Option<PathBuf>,
    /// Write a flame graph of the shadow call stack to FILE.svg (with `run`, records path
    /// profiles).
    #[arg(long, value_name = "FILE.svg")]
    pub flamegraph: Option<PathBuf>,
    /// Write block coverage in DynamoRIO's drcov format (Lighthouse, bncov) to FILE.
    #[arg(long, value_name = "FILE")]
    pub drcov: Option<PathBuf>,
    /// Write a callgrind profile (callgrind_annotate, KCachegrind) to FILE; with `run`, this
    /// records the shadow call stack (as `--paths` does) for the calls' inclusive costs.
    #[arg(long, value_name = "FILE")]
    pub callgrind: Option<PathBuf>,
    /// Write a gzipped pprof profile (`go tool pprof`, Pyroscope, Parca) to FILE: exact guest
    /// instruction and block counts by source line; calling contexts with `--paths`.
    #[arg(long, value_name = "FILE.pb.gz")]
    pub pprof: Option<PathBuf>,
}

impl OutputArgs {
    /// Whether any file is asked for.
    pub fn any_file(&self) -> bool {
        self.dot.is_some()
            || self.flamegraph.is_some()
            || self.drcov.is_some()
            || self.callgrind.is_some()
            || self.pprof.is_some()
    }
}

/// `hotpath report`.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The profile: a JSON report (from `run --report` or `merge`) or a raw profile (from
    /// `run --profile`).
    pub file: PathBuf,
    /// Write the profile as a JSON report (schema hotpath-report/2) to FILE: what
    /// `run --report FILE` would have written.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Print no text summary (only the files asked for).
    #[arg(long, short)]
    pub quiet: bool,
    #[command(flatten)]
    pub outputs: OutputArgs,
}

/// `hotpath merge`.
#[derive(clap::Args, Debug)]
pub struct MergeArgs {
    /// The profiles to sum (JSON reports or raw profiles): runs of one program.
    #[arg(required = true, num_args = 1..)]
    pub reports: Vec<PathBuf>,
    /// Where to write the merged report.
    #[arg(short, long, value_name = "OUT.json")]
    pub output: PathBuf,
}

/// `hotpath bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Runs of each mode (the median is shown).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Skip qemu-x86_64 even when it is installed.
    #[arg(long)]
    pub no_qemu: bool,
    /// The program and its arguments.
    #[arg(
        trailing_var_arg = true,
        required = true,
        value_name = "PROGRAM [ARGS]"
    )]
    pub command: Vec<OsString>,
}

/// `hotpath run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Do not emit the enqueue stub and run no monitor (measures the translator alone).
    #[arg(long)]
    pub no_monitor: bool,
    /// Event ring capacity in entries (a power of two).
    #[arg(long, default_value_t = DEFAULT_RING_ENTRIES, value_parser = parse_ring_entries)]
    pub ring_entries: u64,
    /// Pin the monitor thread to this CPU (default: the last CPU this process may use, when
    /// there are at least two).
    #[arg(long)]
    pub monitor_cpu: Option<usize>,
    /// Print no summary on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Write the profile as JSON (schema hotpath-report/2, docs/report-schema.md) to FILE.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Write the raw profile to FILE: the monitor's tables as they are, in a versioned binary
    /// file that `hotpath report FILE` renders later (text, `--json`, every other output).
    /// Cheaper than `--report` at the end of a run (no symbols read, no JSON); with `--quiet`
    /// and no other output, the run renders nothing.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Record path profiles: functions, the shadow stack's activations and resynchronisations,
    /// Ball-Larus paths per function (with `--call-tree`, `--pap-runs`, `--k`: more). Off by
    /// default: 1.0-3x the tables-only run's time on loops, interpreters and real programs,
    /// up to about 18x on deep recursion, where nearly every event is a call or a return
    /// (bench/paths.sh; README "Path profiles").
    #[arg(long, overrides_with = "no_paths")]
    pub paths: bool,
    /// Record tables only: no functions, shadow stack or path profiles (the default).
    #[arg(long)]
    pub no_paths: bool,
    /// Record k-iteration paths: runs of up to N consecutive Ball-Larus paths (0: none).
    #[arg(long = "k", value_name = "N", default_value_t = 0)]
    pub k: usize,
    /// With the path profile, also keep the calling-context tree: blocks and instructions per
    /// shadow call stack (folded stacks, flame graphs, callgrind's inclusive costs, pprof's
    /// contexts; `--flamegraph` and `--callgrind` ask for it themselves). Costs the monitor
    /// a call-tree step per call (README "Path profiles").
    #[arg(long)]
    pub call_tree: bool,
    /// With the path profile, also record PAP cyclic paths: the run of Ball-Larus paths of
    /// each activation of a hot function. Costs the monitor a run-trie step per path end of
    /// those activations (README "Path profiles").
    #[arg(long)]
    pub pap_runs: bool,
    /// Path ends after which a function is hot and records PAP cyclic paths (0: all; implies
    /// `--pap-runs`) [default: 1000].
    #[arg(long, value_name = "N")]
    pub pap_threshold: Option<u64>,
    /// The path recorder (both give the same profile): `sums`, Ball-Larus sums per activation
    /// and a program per pair of events (the default); `per-block`, the shadow stack and a
    /// path trie stepped per basic block, several times slower: the reference the default is
    /// checked against.
    #[arg(long, value_enum, value_name = "RECORDER", default_value_t = PathsRecorder::Sums)]
    pub paths_recorder: PathsRecorder,
    /// Build no superblocks: every block enqueues its own event (measures what superblocks
    /// buy; the profile is the same).
    #[arg(long)]
    pub no_superblocks: bool,
    /// Executions of a loop's back edge after which the monitor asks for a superblock at the
    /// loop head (the monitor-thread patent's 3000); N more after every 1024 superblocks
    /// requested, so that a big program's superblocks stay what runs most. At the default the
    /// monitor thread starts once the program has made a million events, started a second
    /// thread or ended; a lower N starts it with the program.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SUPERBLOCK_THRESHOLD,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub superblock_threshold: u64,
    #[command(flatten)]
    pub outputs: OutputArgs,
    /// Write hotpath's summary and messages to descriptor FD (open, made close-on-exec)
    /// instead of 2. hotpath passes the copy of its stderr it kept (when the guest closed or
    /// replaced its own) to the programs the guest execs this way.
    #[arg(long, value_name = "FD")]
    pub messages_fd: Option<i32>,
    /// The name the program sees as its argv[0] (default: PROGRAM as given).
    #[arg(long, value_name = "NAME")]
    pub argv0: Option<OsString>,
    /// Run the programs the guest execs natively instead of under hotpath.
    #[arg(long)]
    pub no_follow_exec: bool,
    /// Give the guest no vDSO (as valgrind does): its time functions make system calls.
    #[arg(long)]
    pub no_vdso: bool,
    /// Write /tmp/perf-PID.map when the process ends or execs, naming every translated block
    /// by its guest function, so that `perf record` / `perf report` on this run attribute host
    /// time to the guest's code (as QEMU's -perfmap).
    #[arg(long)]
    pub perf_map: bool,
    /// Neither read nor write the translation cache (also `HOTPATH_CACHE=off`).
    #[arg(long)]
    pub no_cache: bool,
    /// The translation cache's directory (default: `$HOTPATH_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/hotpath`, else `~/.cache/hotpath`).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(
        trailing_var_arg = true,
        required = true,
        value_name = "PROGRAM [ARGS]"
    )]
    pub command: Vec<OsString>,
}

impl RunArgs {
    /// The translation cache's directory: `--cache-dir`, else the default location
    /// ([`hotpath_translator::persist::CacheDir::location`]); `None` with `--no-cache` or
    /// `HOTPATH_CACHE=off`.
    pub fn translation_cache(&self) -> Option<PathBuf> {
        use hotpath_translator::persist::CacheDir;
        if self.no_cache || CacheDir::switched_off() {
            return None;
        }
        self.cache_dir.clone().or_else(CacheDir::location)
    }

    /// Whether the shadow stack and path profiles are recorded: `--paths`, or an output that
    /// needs them (`--callgrind`'s calls, `--dot`'s CFGs, `--flamegraph`'s stacks), unless
    /// `--no-paths` comes last.
    pub fn records_paths(&self) -> bool {
        let o = &self.outputs;
        (self.paths
            || self.call_tree
            || self.pap_runs
            || self.pap_threshold.is_some()
            || o.callgrind.is_some()
            || o.dot.is_some()
            || o.flamegraph.is_some())
            && !self.no_paths
    }

    /// Whether the path profile keeps the calling-context tree: `--call-tree`, or an output
    /// made of call stacks (`--flamegraph`, `--callgrind`).
    pub fn records_call_tree(&self) -> bool {
        let o = &self.outputs;
        self.call_tree || o.flamegraph.is_some() || o.callgrind.is_some()
    }

    /// The path ends after which a function records PAP runs: `--pap-threshold`, else
    /// [`DEFAULT_PAP_THRESHOLD`] with `--pap-runs`, else none (`u64::MAX`).
    pub fn pap_threshold(&self) -> u64 {
        match self.pap_threshold {
            Some(n) => n,
            None if self.pap_runs => DEFAULT_PAP_THRESHOLD,
            None => u64::MAX,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("hotpath").chain(args.iter().copied()))
    }

    fn run_args(args: &[&str]) -> RunArgs {
        match parse(args).expect("parses").command {
            Command::Run(r) => r,
            c => panic!("not run: {c:?}"),
        }
    }

    #[test]
    fn an_unknown_option_before_the_program_is_an_error() {
        let e = parse(&["run", "--drcovv", "f", "--", "/bin/true"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("Usage:"), "{e}");
        let e = parse(&["run", "--bogus", "/bin/true"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
    }

    #[test]
    fn the_program_and_its_options_are_the_programs() {
        let r = run_args(&["run", "--drcov", "cov", "--", "/bin/ls", "-l", "--all"]);
        assert_eq!(r.outputs.drcov, Some(PathBuf::from("cov")));
        assert_eq!(r.command, ["/bin/ls", "-l", "--all"]);
        // Without `--`: the first word that is not an option starts the program.
        let r = run_args(&["run", "-q", "/bin/ls", "-q", "--report", "x"]);
        assert!(r.quiet && r.outputs.drcov.is_none() && r.report.is_none());
        assert_eq!(r.command, ["/bin/ls", "-q", "--report", "x"]);
    }

    #[test]
    fn callgrind_records_the_shadow_stack() {
        assert!(run_args(&["run", "--callgrind", "cg", "p"]).records_paths());
        assert!(!run_args(&["run", "--callgrind", "cg", "--no-paths", "p"]).records_paths());
        assert!(!run_args(&["run", "p"]).records_paths());
    }

    #[test]
    fn the_call_tree_and_pap_runs_are_asked_for() {
        let flat = run_args(&["run", "--paths", "p"]);
        assert!(!flat.records_call_tree());
        assert_eq!(flat.pap_threshold(), u64::MAX);
        let tree = run_args(&["run", "--call-tree", "p"]);
        assert!(tree.records_paths() && tree.records_call_tree());
        assert!(run_args(&["run", "--flamegraph", "f.svg", "p"]).records_call_tree());
        assert!(run_args(&["run", "--callgrind", "cg", "p"]).records_call_tree());
        let pap = run_args(&["run", "--pap-runs", "p"]);
        assert!(pap.records_paths() && !pap.records_call_tree());
        assert_eq!(pap.pap_threshold(), DEFAULT_PAP_THRESHOLD);
        let all = run_args(&["run", "--pap-threshold", "0", "p"]);
        assert!(all.records_paths());
        assert_eq!(all.pap_threshold(), 0);
    }
}

/// `--paths-recorder`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PathsRecorder {
    /// Ball-Larus sums per activation, a program per pair of events.
    Sums,
    /// The path trie per basic block (the reference).
    PerBlock,
}

impl PathsRecorder {
    /// The monitor's recorder of that name.
    pub fn recorder(self) -> hotpath_monitor::Recorder {
        match self {
            PathsRecorder::Sums => hotpath_monitor::Recorder::Sums,
            PathsRecorder::PerBlock => hotpath_monitor::Recorder::PerBlock,
        }
    }
}
