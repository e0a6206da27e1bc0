//! `--perf-map`: the `/tmp/perf-PID.map` perf reads to name JIT code. Checked against the
//! run's own report: every translation the report counts (`totals.blocks_translated`; these
//! small samples never flush the code cache) has one entry, superblock entries exist exactly
//! when the report lists superblocks, no two entries overlap, the gateway is there, and the sample's own functions are
//! named (by symbol, as the reports name them) — in a recursive program and in a threaded
//! one, whose threads each have a code cache. A forked child writes its own map.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use hotpath_e2e::report::as_u64;
use hotpath_e2e::{guest_build, hotpath_bin, paths, runner, set_guest_environment, Linkage};
use serde_json::Value;

fn scratch() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| paths::scratch_dir("perf_map")).clone()
}

/// One map line: host start, size, name.
struct Entry {
    start: u64,
    size: u64,
    name: String,
}

/// Runs `exe` under hotpath with `--perf-map` and a report; returns the map(s) it announced
/// on stderr (one per process: the first is the parent's) and the report.
fn run(exe: &Path, args: &[&str], name: &str) -> (Vec<(PathBuf, Vec<Entry>)>, Value) {
    let hotpath = hotpath_bin::hotpath().unwrap_or_else(|e| panic!("{e}"));
    let report = scratch().join(format!("{name}.json"));
    let mut cmd = Command::new(&hotpath);
    cmd.args(["run", "--perf-map", "--report"])
        .arg(&report)
        .arg("--")
        .arg(exe)
        .args(args);
    set_guest_environment(&mut cmd, &scratch());
    let what = runner::describe(&cmd);
    let out =
        runner::run(&mut cmd, hotpath_e2e::run_timeout()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let mut maps = Vec::new();
    for (at, _) in stderr.match_indices("hotpath: perf map: ") {
        let rest = &stderr[at + "hotpath: perf map: ".len()..];
        let path = PathBuf::from(rest.split(" (").next().unwrap());
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{what}: {}: {e}", path.display()));
        let entries = text
            .lines()
            .map(|l| {
                let mut f = l.splitn(3, ' ');
                let mut hex = || {
                    u64::from_str_radix(f.next().expect("a field"), 16)
                        .unwrap_or_else(|e| panic!("{}: {l:?}: {e}", path.display()))
                };
                let (start, size) = (hex(), hex());
                let name = f.next().unwrap_or_default().to_string();
                assert!(size > 0 && !name.is_empty(), "{}: {l:?}", path.display());
                Entry { start, size, name }
            })
            .collect();
        let _ = std::fs::remove_file(&path);
        maps.push((path, entries));
    }
    assert!(!maps.is_empty(), "{what}: no perf map announced:\n{stderr}");
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{what}: report: {e}")),
    )
    .unwrap_or_else(|e| panic!("{what}: report: {e}"));
    (maps, json)
}

/// The checks every map must pass against its report.
fn check(entries: &[Entry], json: &Value, functions: &[&str], what: &str) {
    let totals = &json["totals"];
    fn kind(e: &Entry) -> Option<&str> {
        e.name
            .rsplit_once(" [")
            .map(|(_, k)| k.trim_end_matches(']'))
    }
    let blocks = entries.iter().filter(|e| kind(e).is_none()).count() as u64;
    let gateway = entries
        .iter()
        .filter(|e| e.name == "hotpath gateway")
        .count();
    let superblocks = entries
        .iter()
        .filter(|e| kind(e) == Some("superblock"))
        .count() as u64;
    assert!(gateway >= 1, "{what}: no gateway entry");
    // Every translation, once (the gateway has no bracket either).
    assert_eq!(
        blocks - gateway as u64,
        as_u64(&totals["blocks_translated"]),
        "{what}: block entries against the report's translations"
    );
    let built: u64 = json["superblocks"].as_array().map_or(0, |a| {
        a.iter()
            .map(|s| s["blocks"].as_array().map_or(0, |b| b.len()) as u64)
            .sum()
    });
    assert!(
        superblocks >= built.min(1) && (built == 0) == (superblocks == 0),
        "{what}: {superblocks} superblock entries, the report's superblocks have {built} blocks"
    );
    let mut sorted: Vec<&Entry> = entries.iter().collect();
    sorted.sort_by_key(|e| e.start);
    for w in sorted.windows(2) {
        assert!(
            w[0].start + w[0].size <= w[1].start,
            "{what}: {} and {} overlap",
            w[0].name,
            w[1].name
        );
    }
    let named: BTreeSet<&str> = entries
        .iter()
        .map(|e| e.name.split(['+', ' ']).next().unwrap())
        .collect();
    for f in functions {
        assert!(named.contains(f), "{what}: no entry names {f}: {named:?}");
    }
}

#[test]
fn every_translation_is_named_by_its_function() {
    for linkage in [Linkage::Static, Linkage::StaticPie] {
        let exe = guest_build::build("recursion.c", linkage).unwrap_or_else(|e| panic!("{e}"));
        let what = format!("recursion ({linkage:?})");
        let (maps, json) = run(&exe, &[], &format!("recursion-{linkage:?}"));
        assert_eq!(maps.len(), 1, "{what}: one process, one map");
        check(
            &maps[0].1,
            &json,
            &["main", "deep", "is_even", "is_odd"],
            &what,
        );
    }
}

#[test]
fn threads_and_forked_children_have_their_code_named() {
    let exe = guest_build::build("threads.c", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let (maps, json) = run(&exe, &[], "threads");
    check(&maps[0].1, &json, &["main", "worker"], "threads");
    let gateways = maps[0]
        .1
        .iter()
        .filter(|e| e.name == "hotpath gateway")
        .count();
    assert!(
        gateways >= 2,
        "threads: one gateway per thread's cache, got {gateways}"
    );

    let exe = guest_build::build("fork_wait.c", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let (maps, _) = run(&exe, &[], "fork_wait");
    let pids: BTreeSet<&PathBuf> = maps.iter().map(|(p, _)| p).collect();
    assert!(
        pids.len() >= 2,
        "fork_wait: every process writes its own map, got {pids:?}"
    );
    for (path, entries) in &maps {
        assert!(
            entries.iter().any(|e| e.name.starts_with("main")),
            "{}: the child's map names the code it inherited",
            path.display()
        );
    }
}
