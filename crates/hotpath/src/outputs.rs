//! Everything rendered from a finished profile: the JSON report, the text summary, DOT files,
//! the flame graph, drcov coverage, the callgrind profile and the pprof profile.

use std::path::Path;

use hotpath_report::{callgrind, drcov, graph, pprof, text, Report, ReportError};

use crate::cli::OutputArgs;

/// Writes the files `outputs` asks for from `report` (of the guest process `pid` when the run
/// writes them). Each failure is printed as one `hotpath:` line; returns whether all were
/// written.
pub fn write_files(report: &Report, outputs: &OutputArgs, pid: Option<u32>) -> bool {
    let mut ok = true;
    let mut check = |r: Result<(), ReportError>| {
        if let Err(e) = r {
            crate::say(format_args!("hotpath: {e}"));
            ok = false;
        }
    };
    if let Some(dir) = &outputs.dot {
        check(graph::write_dot(report, dir, outputs.top).map(drop));
    }
    if let Some(path) = &outputs.flamegraph {
        check(graph::write_flamegraph(report, path));
    }
    if let Some(path) = &outputs.drcov {
        check(drcov::write(report, path));
    }
    if let Some(path) = &outputs.callgrind {
        check(callgrind::write(report, path));
    }
    if let Some(path) = &outputs.pprof {
        check(pprof::write(report, path, pid));
    }
    ok
}

/// Writes the JSON report to `path`; a failure is printed as one `hotpath:` line.
pub fn write_json(report: &Report, path: &Path) -> bool {
    match report.write(path) {
        Ok(()) => true,
        Err(e) => {
            crate::say(format_args!("hotpath: cannot write the report: {e}"));
            false
        }
    }
}

/// The text summary of `report` as `outputs` asks for it (rows per table, disassembly, hot
/// lines from separate debug files).
pub fn summary(report: &Report, outputs: &OutputArgs) -> String {
    text::render(report, outputs.top, outputs.disasm, outputs.lines)
}
