//! `hotpath`, the program: its command line, a guest run's lifecycle, and the commands that
//! work on saved reports.
//!
//! ```text
//! hotpath run [OPTIONS] PROGRAM [ARGS...]   session.rs: load, translate, monitor, report
//! hotpath report FILE [OUTPUTS]             outputs.rs: text, JSON, DOT, flame graph, drcov, ...
//!                                           (FILE: a JSON report, or a raw profile: raw.rs)
//! hotpath merge A B... -o OUT.json          hotpath_report::merge
//! hotpath bench [--runs N] PROGRAM [ARGS]   bench.rs: native vs each mode vs qemu, medians
//! hotpath cache [clear]                     the persisted translations (hotpath_translator::persist)
//! ```

pub mod bench;
pub mod cli;
pub mod identity;
pub mod modules;
pub mod outputs;
pub mod panics;
pub mod perf_map;
pub mod raw;
pub mod session;

use std::path::PathBuf;
use std::process::ExitCode;

use hotpath_report::{merge, Report};

use cli::{CacheArgs, MergeArgs, ReportArgs};
use hotpath_translator::persist::CacheDir;

/// Writes one line (`line` and a newline) to stderr in one write, as `eprintln!` does but
/// never panicking: hotpath's own messages go to wherever the guest's stderr goes, and a
/// reader that went away (`hotpath run prog 2>&1 | head`) must not turn the end of a run
/// into a panic on the thread that ends it.
pub fn say(line: std::fmt::Arguments) {
    say_text(&format!("{line}\n"));
}

/// Writes `text` to stderr as it is, errors ignored (see [`say`]): the stderr hotpath started
/// with, also when the guest has closed or replaced its own since
/// (`hotpath_translator::host::messages`).
pub fn say_text(text: &str) {
    hotpath_translator::host::messages::write_all(text.as_bytes());
}

/// Reads a saved profile: a JSON report, or a raw profile ([`raw`]) rendered into one (a
/// module whose file changed since the run is said on stderr: its blocks are named by offset).
///
/// # Errors
/// A one-line reason naming `path`: unreadable, neither form, another version, damaged.
pub fn read_profile(path: &std::path::Path) -> Result<Report, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !raw::is_raw(&bytes) {
        return Report::from_json(&bytes, path).map_err(|e| e.to_string());
    }
    let (report, changed) = raw::render(&bytes, path)?;
    for m in changed {
        eprintln!("hotpath: {m} is not the file the run mapped (changed or gone): its blocks are named by offset");
    }
    Ok(report)
}

/// `hotpath report`: the text summary of a saved profile (JSON report or raw profile) on
/// stdout, and the files asked for (the JSON report with `--json`).
pub fn report(args: ReportArgs) -> ExitCode {
    let report = match read_profile(&args.file) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("hotpath: {e}");
            return ExitCode::from(1);
        }
    };
    let json_ok = args
        .json
        .as_ref()
        .is_none_or(|path| outputs::write_json(&report, path));
    if !args.quiet {
        print!("{}", outputs::summary(&report, &args.outputs));
    }
    if outputs::write_files(&report, &args.outputs, None) && json_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `hotpath cache`: where the translation cache is, its size and counts; with `clear`,
/// empties it.
pub fn cache(args: CacheArgs) -> ExitCode {
    let Some(path) = args.cache_dir.or_else(CacheDir::location) else {
        eprintln!("hotpath: no translation cache: HOTPATH_CACHE=off, or none of HOTPATH_CACHE_DIR, XDG_CACHE_HOME and HOME is set");
        return ExitCode::from(1);
    };
    let dir = match CacheDir::open(&path) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("hotpath: the translation cache is not used: {e}");
            return ExitCode::from(1);
        }
    };
    if args.action.as_deref() == Some("clear") {
        return match dir.clear() {
            Ok(n) => {
                println!("cleared {} ({n} files)", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("hotpath: cannot clear {}: {e}", path.display());
                ExitCode::from(1)
            }
        };
    }
    let s = dir.summary();
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let lookups = s.hits + s.misses;
    println!("cache directory   {}", path.display());
    println!("files             {}", s.files);
    println!(
        "size              {:.1} MiB of {:.1} MiB",
        mib(s.bytes),
        mib(s.limit)
    );
    println!(
        "blocks            {} hits, {} misses ({:.1} % hits)",
        s.hits,
        s.misses,
        if lookups == 0 {
            0.0
        } else {
            100.0 * s.hits as f64 / lookups as f64
        }
    );
    ExitCode::SUCCESS
}

/// `hotpath merge`: sums the reports into one and writes it.
pub fn merge(args: MergeArgs) -> ExitCode {
    let mut reports: Vec<(PathBuf, Report)> = Vec::with_capacity(args.reports.len());
    for path in args.reports {
        match read_profile(&path) {
            Ok(r) => reports.push((path, r)),
            Err(e) => {
                eprintln!("hotpath: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let n = reports.len();
    match merge::merge(reports) {
        Ok(merged) => {
            if !outputs::write_json(&merged, &args.output) {
                return ExitCode::from(1);
            }
            eprintln!(
                "hotpath: merged {n} reports into {} ({} blocks, {} guest instructions)",
                args.output.display(),
                merged.totals.blocks_executed,
                merged.totals.guest_instructions
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hotpath: {e}");
            ExitCode::from(1)
        }
    }
}
