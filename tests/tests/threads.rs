//! Per-thread profiles are exact: `guest-samples/thread_cases.c counts` starts 4 workers, and
//! worker k runs the two-instruction loop block at `spin_loop` exactly (k + 1) × 100000 times
//! (it counts a register down to zero). The report's `threads` section must show each
//! worker's count, the process total must be their sum, and the per-thread totals must add up
//! to the process's: with the default ring and a 64-entry one (the guest threads wait on the
//! monitor all the time), superblocks on and off, static and dynamic.

use std::path::PathBuf;

use hotpath_e2e::report::{as_u64, run_with_report};
use hotpath_e2e::{guest_build, paths, Linkage, Termination};

fn scratch() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| paths::scratch_dir("threads")).clone()
}

/// Iterations of `spin_loop` in worker k (see the sample).
fn iterations(k: u64) -> u64 {
    (k + 1) * 100_000
}

fn check_counts(linkage: Linkage, hotpath_args: &[&str], tag: &str) {
    let exe = guest_build::build("thread_cases.c", linkage).unwrap_or_else(|e| panic!("{e}"));
    let name = format!("thread_counts.{linkage}.{tag}");
    let run = run_with_report(&exe, &["counts"], &scratch(), &name, hotpath_args);
    assert_eq!(run.outcome.termination, Termination::Exited(0), "{name}");
    let json = &run.report.json;
    let spin = run
        .report
        .blocks()
        .iter()
        // `spin_loop` is the first instruction of `spin`: either name may be reported.
        .find(|b| matches!(b["symbol"].as_str(), Some("spin_loop" | "spin")))
        .unwrap_or_else(|| panic!("{name}: no block at spin_loop"));
    let spin_addr = as_u64(&spin["addr"]);
    let total: u64 = (0..4).map(iterations).sum();
    assert_eq!(
        as_u64(&spin["count"]),
        total,
        "{name}: spin_loop in all threads"
    );

    let threads = json["threads"].as_array().expect("a threads section");
    assert_eq!(threads.len(), 5, "{name}: main and 4 workers");
    let mut seen: Vec<u64> = threads
        .iter()
        .map(|t| {
            t["hottest"]
                .as_array()
                .unwrap()
                .iter()
                .find(|h| as_u64(&h["addr"]) == spin_addr)
                .map_or(0, |h| as_u64(&h["count"]))
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        [
            0,
            iterations(0),
            iterations(1),
            iterations(2),
            iterations(3)
        ],
        "{name}: spin_loop per thread"
    );
    let mut tids: Vec<u64> = threads.iter().map(|t| as_u64(&t["tid"])).collect();
    tids.sort_unstable();
    tids.dedup();
    assert_eq!(tids.len(), 5, "{name}: distinct tids");
    for field in ["events", "blocks_executed", "guest_instructions"] {
        let sum: u64 = threads.iter().map(|t| as_u64(&t[field])).sum();
        assert_eq!(
            sum,
            as_u64(&json["totals"][field]),
            "{name}: Σ threads.{field}"
        );
    }
}

#[test]
fn per_thread_counts_follow_the_source() {
    for linkage in [Linkage::Static, Linkage::Dynamic] {
        check_counts(linkage, &[], "default");
        check_counts(linkage, &["--ring-entries", "64"], "ring64");
        check_counts(linkage, &["--no-superblocks"], "nosb");
    }
}
