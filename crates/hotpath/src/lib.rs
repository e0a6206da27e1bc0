//! `hotpath`, the program: its command line, a guest run's lifecycle, and the commands that
//! work on saved reports.
//!
//! ```text
//! hotpath run [OPTIONS] PROGRAM [ARGS...]   session.rs: load, translate, monitor, report
//! hotpath report FILE.json [OUTPUTS]        outputs.rs: text, DOT, flame graph, drcov, callgrind
//! hotpath merge A.json B.json... -o OUT     hotpath_report::merge
//! hotpath bench [--runs N] PROGRAM [ARGS]   bench.rs: native vs each mode vs qemu, medians
//! ```

pub mod bench;
pub mod cli;
pub mod identity;
pub mod modules;
pub mod outputs;
pub mod perf_map;
pub mod session;

use std::path::PathBuf;
use std::process::ExitCode;

use hotpath_report::{merge, Report};

use cli::{MergeArgs, ReportArgs};

/// `hotpath report`: the text summary of a saved report on stdout, and the files asked for.
pub fn report(args: ReportArgs) -> ExitCode {
    let report = match Report::read(&args.file) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("hotpath: {e}");
            return ExitCode::from(1);
        }
    };
    print!(
        "{}",
        outputs::summary(&report, args.outputs.top, args.outputs.disasm)
    );
    if outputs::write_files(&report, &args.outputs) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `hotpath merge`: sums the reports into one and writes it.
pub fn merge(args: MergeArgs) -> ExitCode {
    let mut reports: Vec<(PathBuf, Report)> = Vec::with_capacity(args.reports.len());
    for path in args.reports {
        match Report::read(&path) {
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
