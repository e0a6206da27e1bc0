//! Path profiles (`paths`, `k_paths`, `functions` in the JSON report) against programs whose
//! hottest paths follow from their source: exact Ball-Larus counts and PAP iteration
//! sequences for `paths_branchy.S` (fixed block layout), and, on every guest sample and on
//! busybox applets, path counts consistent with the block table: for every block b of a
//! profiled function, Σ over Ball-Larus paths of count × occurrences of b = count of b.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use hotpath_e2e::{catalog, guest_build, hotpath_bin, paths, runner, Linkage};
use serde_json::Value;

fn scratch() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| paths::scratch_dir("paths")).clone()
}

/// Runs `exe args` under `hotpath run --quiet --report FILE extra...`; returns the report.
fn run_report(exe: &Path, tag: &str, args: &[&str], extra: &[&str]) -> Value {
    run_report_with(&[], exe, tag, args, extra)
}

/// [`run_report`] with hotpath started by `launcher` (a program and its arguments, such as
/// `setarch x86_64 -R`; none if empty).
fn run_report_with(
    launcher: &[&str],
    exe: &Path,
    tag: &str,
    args: &[&str],
    extra: &[&str],
) -> Value {
    let hotpath =
        hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary to test: {e}"));
    let report = scratch().join(format!("{tag}.json"));
    let _ = fs::remove_file(&report);
    let mut cmd = match launcher.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(&hotpath);
            c
        }
        None => Command::new(&hotpath),
    };
    cmd.arg("run")
        .arg("--quiet")
        .arg("--paths")
        .arg("--report")
        .arg(&report)
        .args(extra)
        .arg("--")
        .arg(exe)
        .args(args);
    hotpath_e2e::set_guest_environment(&mut cmd, &scratch());
    let what = runner::describe(&cmd);
    let outcome =
        runner::run(&mut cmd, hotpath_e2e::run_timeout()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "{what} wrote no report: {e} ({})\nstderr: {}",
            outcome.termination,
            String::from_utf8_lossy(&outcome.stderr)
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: not JSON: {e}"))
}

fn addr(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().expect("an address").trim_start_matches("0x"), 16).expect("hex")
}

/// The Ball-Larus paths are listed most executed blocks (count × length) first, then by
/// function, id (null first) and blocks: an order that depends on the profile alone, not on
/// the order a recorder met the paths in (ties are common where a function has too many
/// paths to number and every id is null).
fn paths_in_report_order(what: &str, json: &Value) {
    let key = |p: &Value| {
        let count = p["count"].as_u64().expect("count");
        let len = p["len"].as_u64().expect("len");
        let blocks: Vec<u64> = p["blocks"]
            .as_array()
            .expect("blocks")
            .iter()
            .map(addr)
            .collect();
        (
            std::cmp::Reverse(count.saturating_mul(len)),
            addr(&p["function_addr"]),
            p["id"].as_u64(),
            blocks,
        )
    };
    let bl: Vec<_> = json["path_profile"]["paths"]
        .as_array()
        .expect("paths")
        .iter()
        .filter(|p| p["kind"] == "bl")
        .map(key)
        .collect();
    for (i, w) in bl.windows(2).enumerate() {
        assert!(
            w[0] <= w[1],
            "{what}: paths {i} and {} are out of the report's order",
            i + 1
        );
    }
}

/// Σ count × occurrences over the `bl` paths of `json`'s path profile equals every block's
/// count in its block table.
fn paths_cover_blocks(what: &str, json: &Value) {
    let paths = json["path_profile"]["paths"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no paths in the report"));
    let mut from_paths: HashMap<u64, u64> = HashMap::new();
    for p in paths.iter().filter(|p| p["kind"] == "bl") {
        let c = p["count"].as_u64().expect("count");
        for b in p["blocks"].as_array().expect("blocks") {
            *from_paths.entry(addr(b)).or_insert(0) += c;
        }
    }
    let blocks: HashMap<u64, u64> = json["blocks"]
        .as_array()
        .expect("blocks")
        .iter()
        .map(|b| (addr(&b["addr"]), b["count"].as_u64().unwrap()))
        .collect();
    for (a, c) in &blocks {
        assert_eq!(
            from_paths.get(a).copied().unwrap_or(0),
            *c,
            "{what}: block {a:#x}: paths disagree with the block table"
        );
    }
    for a in from_paths.keys() {
        assert!(
            blocks.contains_key(a),
            "{what}: path block {a:#x} is not in the block table"
        );
    }
}

/// Σ count × occurrences over `bl` paths equals every block's count; every path has its
/// Ball-Larus id.
fn check_consistency(what: &str, json: &Value) {
    let paths = json["path_profile"]["paths"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no paths in the report"));
    for p in paths.iter().filter(|p| p["kind"] == "bl") {
        assert!(
            p["id"].is_u64(),
            "{what}: a path without a Ball-Larus id: {p}"
        );
    }
    paths_in_report_order(what, json);
    paths_cover_blocks(what, json);
    // With the call tree (`--call-tree`, `--flamegraph`), the flame graph's stacks share out
    // every executed block, each to the stack it ran in; without it there are none.
    let stacks = json["path_profile"]["stacks"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no stacks in the report"));
    let in_stacks: u64 = stacks
        .iter()
        .map(|s| s["blocks"].as_u64().expect("blocks"))
        .sum();
    if !stacks.is_empty() {
        assert_eq!(
            in_stacks,
            json["totals"]["blocks_executed"].as_u64().unwrap(),
            "{what}: the stacks' blocks do not add up to the blocks executed"
        );
    }
    // PAP runs: heaviest (count x blocks) first, each listing at most 1000 blocks, run-length
    // entries and breakpoints, and its sizes in full.
    let pap: Vec<&Value> = paths.iter().filter(|p| p["kind"] == "pap").collect();
    assert!(pap.len() <= 200, "{what}: at most 200 PAP runs listed");
    let weight = |p: &Value| p["count"].as_u64().unwrap() * p["len"].as_u64().unwrap();
    assert!(
        pap.windows(2).all(|w| weight(w[0]) >= weight(w[1])),
        "{what}: PAP runs not heaviest first"
    );
    for p in pap {
        let run = &p["pap"];
        let runs = run["bl_runs"].as_array().unwrap();
        let listed: u64 = runs.iter().map(|r| r["repeat"].as_u64().unwrap()).sum();
        let run_paths = run["run_paths"].as_u64().unwrap();
        assert!(
            p["blocks"].as_array().unwrap().len() as u64 == p["len"].as_u64().unwrap().min(1000),
            "{what}: {p}"
        );
        assert!(
            run["breakpoints"].as_array().unwrap().len() as u64
                == run["breakpoints_total"].as_u64().unwrap().min(1000)
        );
        assert!(runs.len() <= 1000 && listed <= run_paths, "{what}: {p}");
        assert!(
            runs.len() == 1000 || listed == run_paths,
            "{what}: bl_runs incomplete"
        );
    }
}

#[test]
fn branchy_loop_paths_are_exact() {
    let exe =
        guest_build::build("paths_branchy.S", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let json = run_report(
        &exe,
        "branchy",
        &[],
        &["--call-tree", "--pap-threshold", "0", "--k", "2"],
    );
    check_consistency("paths_branchy", &json);
    let sym: HashMap<u64, String> = json["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                addr(&b["addr"]),
                b["symbol"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect();
    let bl: Vec<&Value> = json["path_profile"]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "bl" && p["function"] == "branchy")
        .collect();
    let names = |p: &Value| -> Vec<String> {
        p["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| sym[&addr(b)].clone())
            .collect()
    };
    // Block starts: branchy (entry), +0x4 .Lhead, +0xe .Lthen, +0x13 .Lelse, +0x16 .Ljoin, +0x1e .Lret.
    let top = bl
        .iter()
        .max_by_key(|p| p["count"].as_u64().unwrap())
        .unwrap();
    assert_eq!(
        names(top),
        ["branchy+0x4", "branchy+0xe", "branchy+0x16"],
        "top path {top}"
    );
    assert_eq!(top["count"], 7490);
    let find = |blocks: &[&str], end: &str| -> u64 {
        let p = bl
            .iter()
            .find(|p| names(p) == blocks && p["end"] == end)
            .unwrap_or_else(|| panic!("no path {blocks:?} -> {end}"));
        p["id"].as_u64().unwrap()
    };
    let then_id = find(&["branchy+0x4", "branchy+0xe", "branchy+0x16"], "back_edge");
    let else_id = find(&["branchy+0x4", "branchy+0x13"], "back_edge");
    let first_id = find(&["branchy", "branchy+0xe", "branchy+0x16"], "back_edge");
    let last_id = find(&["branchy+0x4", "branchy+0x13", "branchy+0x1e"], "exit");
    let counts: HashMap<u64, u64> = bl
        .iter()
        .map(|p| (p["id"].as_u64().unwrap(), p["count"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        (counts[&else_id], counts[&first_id], counts[&last_id]),
        (2490, 10, 10)
    );
    assert_eq!(bl.len(), 4, "branchy has exactly four paths");

    // PAP: one cyclic path per call, the whole iteration sequence, 10 times.
    let pap: Vec<&Value> = json["path_profile"]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "pap" && p["function"] == "branchy")
        .collect();
    assert_eq!(pap.len(), 1, "every call runs the same iterations");
    assert_eq!(pap[0]["count"], 10);
    let mut expected = vec![first_id];
    expected.extend((1..999).map(|i| if i & 3 != 3 { then_id } else { else_id }));
    expected.push(last_id);
    let mut got = Vec::new();
    for r in pap[0]["pap"]["bl_runs"].as_array().unwrap() {
        for _ in 0..r["repeat"].as_u64().unwrap() {
            got.push(r["id"].as_u64().unwrap());
        }
    }
    assert_eq!(got, expected, "PAP run vs the loop's iterations");
    assert!(
        !pap[0]["pap"]["breakpoints"].as_array().unwrap().is_empty(),
        "1000 iterations overflow a 64-bit PAP register"
    );
    // Blocks: the run's length, the first 1000 listed.
    assert_eq!(pap[0]["len"], 1 + 749 * 3 + 249 * 2 + 2 + 3);
    assert_eq!(pap[0]["blocks"].as_array().unwrap().len(), 1000);
    assert_eq!(pap[0]["pap"]["run_paths"], 1000);

    // k = 2: the hottest pair is then, then.
    let k: Vec<&Value> = json["path_profile"]["k_paths"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["function"] == "branchy")
        .collect();
    let pair = k
        .iter()
        .max_by_key(|k| k["count"].as_u64().unwrap())
        .unwrap();
    assert_eq!(pair["ids"], serde_json::json!([then_id, then_id]));
    assert_eq!(pair["count"], 10 * 499);
}

#[test]
fn recursion_paths_are_exact() {
    let exe =
        guest_build::build("paths_recursion.S", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let json = run_report(
        &exe,
        "recursion",
        &[],
        &["--call-tree", "--pap-threshold", "0"],
    );
    check_consistency("paths_recursion", &json);
    let rsum: Vec<&Value> = json["path_profile"]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "bl" && p["function"] == "rsum")
        .collect();
    let names = |p: &Value| -> Vec<String> {
        p["names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect()
    };
    // See paths_recursion.S: one path per activation; DEPTH = 50 recursive ones and 1 base
    // case per call, 4 calls. Blocks: rsum, +0x5 .Lrec, +0xe .Lafter, +0x13 .Lbase.
    assert_eq!(rsum.len(), 2, "rsum has two paths: {rsum:?}");
    let top = rsum
        .iter()
        .max_by_key(|p| p["count"].as_u64().unwrap())
        .unwrap();
    assert_eq!(
        names(top),
        ["rsum", "rsum+0x5", "rsum+0xe"],
        "top path {top}"
    );
    assert_eq!(
        (
            top["count"].as_u64(),
            top["start"].as_str(),
            top["end"].as_str()
        ),
        (Some(200), Some("entry"), Some("exit"))
    );
    let base = rsum
        .iter()
        .find(|p| p["count"] == 4)
        .expect("the base-case path");
    assert_eq!(names(base), ["rsum", "rsum+0x13"]);
    assert_eq!(
        json["path_profile"]["stats"]["shadow_stack_resyncs"], 0,
        "every return matches its call"
    );
    // The flame graph's deepest stack: _start, then DEPTH + 1 frames of rsum, 2 blocks per call.
    let deepest = json["path_profile"]["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|s| s["stack"].as_str().unwrap().len())
        .unwrap();
    assert_eq!(
        deepest["stack"].as_str().unwrap().matches("rsum").count(),
        51
    );
    assert_eq!(deepest["blocks"], 4 * 2);
}

/// count_calls.S: one indirect call site in `call_head` (a function symbol, like every label
/// the sample's blocks start at) calls f_one 300 times, f_two 200 and f_three 100, in an
/// interleaved order; each callee runs two blocks (its body up to `call leaf`, then the `ret`)
/// and calls `leaf` (one block). So the call tree below the outermost activation (`call_head`,
/// where the stack starts) is known exactly from the
/// source, `leaf` in three contexts: a stack whose blocks went to the wrong node (a sibling, or
/// the same function under another caller) would change these counts. (`call_head` and the
/// sample's other labels are function symbols that only jumps reach: no tail calls.)
#[test]
fn call_stacks_follow_the_source() {
    for linkage in Linkage::ALL {
        let exe = guest_build::build("count_calls.S", linkage).unwrap_or_else(|e| panic!("{e}"));
        for (tag, extra) in [
            ("default", &["--call-tree"][..]),
            ("eager", &["--call-tree", "--superblock-threshold", "1"][..]),
            (
                "per-block",
                &["--call-tree", "--paths-recorder", "per-block"][..],
            ),
            (
                "tiny-ring",
                &[
                    "--call-tree",
                    "--superblock-threshold",
                    "1",
                    "--ring-entries",
                    "64",
                ][..],
            ),
        ] {
            let what = format!("count_calls ({linkage}, {tag})");
            let json = run_report(&exe, &format!("stacks-{linkage}-{tag}"), &[], extra);
            check_consistency(&what, &json);
            let below: HashMap<&str, u64> = json["path_profile"]["stacks"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|s| {
                    // Below the outermost activation (the entry's, which jumps to
                    // `call_head`).
                    let stack = s["stack"].as_str().unwrap();
                    let (_, below) = stack.split_once(';')?;
                    Some((below, s["blocks"].as_u64().unwrap()))
                })
                .collect();
            let expected: HashMap<&str, u64> = [
                ("f_one", 600),
                ("f_one;leaf", 300),
                ("f_two", 400),
                ("f_two;leaf", 200),
                ("f_three", 200),
                ("f_three;leaf", 100),
            ]
            .into_iter()
            .collect();
            assert_eq!(
                below, expected,
                "{what}: stacks below the outermost activation"
            );
        }
    }
}

/// paths_loops.c at gcc -O2 (checked against `objdump -d`; offsets are gcc's layout):
/// `nested(10, 20)`: blocks N0 = entry, N1 = +0x37 (m > 0), N2 = +0x41 (row 0's first inner
/// iteration, falls through into the loop), N3 = +0x48 (rows 1..9's first inner iteration),
/// L = +0x50 (the inner loop, `jne` to itself), T = +0x66 (row end), X = +0x6f (ret). Address
/// order makes L -> L and T -> N3 the back edges, so per call: [N0 N1 N2 L] 1; [L] -> L
/// 17 × 10 = 170 (19 runs of L per row, the first on the row's path, the last ending at T);
/// [L T] -> N3 9; [N3 L] 9; [L T X] 1. 5 calls. `fact` is turned into a loop by gcc (F0 =
/// entry, F1 = +0xb peeled first multiplication, L = +0x10 loop, X = +0x21): per fact(12),
/// [F0 F1 L] 1, [L] -> L 8, [L X] 1 (10 runs of L). The test checks counts, which follow
/// from that layout, not addresses.
#[test]
fn c_loops_and_recursion() {
    let exe =
        guest_build::build("paths_loops.c", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let json = run_report(
        &exe,
        "loops",
        &["400", "5"],
        &["--call-tree", "--pap-threshold", "0"],
    );
    check_consistency("paths_loops", &json);
    let paths = json["path_profile"]["paths"].as_array().unwrap();
    let counts = |f: &str| -> Vec<u64> {
        let mut c: Vec<u64> = paths
            .iter()
            .filter(|p| p["kind"] == "bl" && p["function"] == f)
            .map(|p| p["count"].as_u64().unwrap())
            .collect();
        c.sort();
        c
    };
    assert_eq!(counts("fact"), [5, 5, 40], "fact paths");
    assert_eq!(counts("nested"), [5, 5, 45, 45, 850], "nested paths");
    let nested = paths
        .iter()
        .filter(|p| p["kind"] == "bl" && p["function"] == "nested")
        .max_by_key(|p| p["count"].as_u64().unwrap())
        .unwrap();
    assert_eq!(
        nested["blocks"].as_array().unwrap().len(),
        1,
        "the hottest nested path is the one-block inner loop"
    );
    assert_eq!(
        (nested["start"].as_str(), nested["end"].as_str()),
        (Some("back_edge"), Some("back_edge"))
    );
    assert!(json["path_profile"]["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["stack"].as_str().unwrap().ends_with("main;nested")));
}

/// Every catalog sample — whatever way it ends (exit, fatal signal, handlers, fork, exec), with
/// deep recursion (`recursion`: 100 000 frames), forged and never-returning calls
/// (`asm_retaddr`), longjmp (`setjmp`) — writes a report whose paths add up to its block
/// counts. The bench_* samples are left out for time (the bench measures them).
#[test]
fn every_sample_has_consistent_paths() {
    for s in catalog::SAMPLES
        .iter()
        .filter(|s| !s.source.starts_with("bench_"))
    {
        let exe = guest_build::build(s.source, Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
        for (tag, extra) in [("", &[][..])] {
            let json = run_report(&exe, &format!("sample-{}{tag}", s.name), s.args, extra);
            if json["threads"].as_array().is_some_and(|t| t.len() > 1) {
                // Paths are per thread and the report shows the busiest thread's, while the
                // block table sums every thread: they add up only per thread (#20).
                continue;
            }
            check_consistency(&format!("{}{tag}", s.name), &json);
        }
    }
}

/// `--paths` alone records Ball-Larus paths and activations, with no call tree and no PAP
/// runs (what costs the monitor most on big programs and on recursion: README "Path
/// profiles"); `--call-tree` adds the stacks, `--pap-runs` the PAP runs of hot functions and
/// `--pap-threshold` implies it; the paths themselves are the same in each.
#[test]
fn call_tree_and_pap_runs_are_asked_for() {
    let exe =
        guest_build::build("paths_loops.c", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let args = ["400", "5"];
    let run = |tag: &str, extra: &[&str]| {
        let json = run_report(&exe, &format!("asked-{tag}"), &args, extra);
        check_consistency(tag, &json);
        json
    };
    let stacks = |j: &Value| j["path_profile"]["stacks"].as_array().unwrap().len();
    let pap_runs = |j: &Value| j["path_profile"]["stats"]["pap_runs"].as_u64().unwrap();
    let bl_paths = |j: &Value| -> Vec<Value> {
        let paths = j["path_profile"]["paths"].as_array().unwrap();
        paths
            .iter()
            .filter(|p| p["kind"] == "bl")
            .cloned()
            .collect()
    };
    let flat = run("flat", &[]);
    assert_eq!(stacks(&flat), 0, "--paths alone keeps no call tree");
    assert_eq!(pap_runs(&flat), 0, "--paths alone records no PAP runs");
    let tree = run("call-tree", &["--call-tree"]);
    assert!(stacks(&tree) > 0, "--call-tree: no stacks");
    assert_eq!(pap_runs(&tree), 0, "--call-tree alone records no PAP runs");
    let pap = run("pap-runs", &["--pap-runs"]);
    assert!(
        pap_runs(&pap) > 0,
        "--pap-runs: no PAP runs (a loop here is hot)"
    );
    assert_eq!(stacks(&pap), 0, "--pap-runs alone keeps no call tree");
    let all = run("pap-threshold", &["--pap-threshold", "0"]);
    assert!(
        pap_runs(&all) > pap_runs(&pap),
        "--pap-threshold 0: every function's activations record runs"
    );
    for (tag, j) in [
        ("call-tree", &tree),
        ("pap-runs", &pap),
        ("pap-threshold", &all),
    ] {
        assert!(
            bl_paths(j) == bl_paths(&flat),
            "{tag}: the Ball-Larus paths differ from --paths alone"
        );
    }
}

#[test]
fn busybox_sort_and_awk() {
    let busybox = Path::new("/usr/bin/busybox");
    if !busybox.exists() {
        eprintln!("skipped: no /usr/bin/busybox (install busybox-static, see .ci/setup)");
        return;
    }
    let input = words_file("words.txt", 12345, 3000);
    let input = input.to_str().unwrap();
    let dot_dir = scratch().join("dot");
    let _ = fs::remove_dir_all(&dot_dir);
    let svg = scratch().join("awk.svg");
    for (tag, args) in [
        ("sort", vec!["sort", input]),
        ("awk", vec!["awk", AWK_SCRIPT, input]),
    ] {
        let mut extra = vec!["--k", "2"];
        let d = dot_dir.to_str().unwrap().to_string();
        let f = svg.to_str().unwrap().to_string();
        if tag == "awk" {
            extra.extend(["--dot", &d, "--flamegraph", &f]);
        }
        let json = run_report(busybox, &format!("busybox-{tag}"), &args, &extra);
        check_consistency(tag, &json);
        let paths = json["path_profile"]["paths"].as_array().unwrap();
        assert!(paths.len() > 10, "{tag}: paths recorded");
        let names = paths[0]["names"].as_array().unwrap();
        assert!(
            names.iter().all(
                |n| n.as_str().unwrap().contains('+') || !n.as_str().unwrap().starts_with("0x")
            ),
            "{tag}: names"
        );
    }
    let svg_text = fs::read_to_string(&svg).expect("flame graph written");
    assert!(svg_text.contains("<svg"));
    let dots: Vec<_> = fs::read_dir(&dot_dir)
        .expect("DOT files written")
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!dots.is_empty());
    if Command::new("dot").arg("-V").output().is_ok() {
        for d in dots {
            let out = Command::new("dot").arg("-Tsvg").arg(&d).output().unwrap();
            assert!(
                out.status.success(),
                "dot -Tsvg {}: {}",
                d.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The two fields of the report that a path recorder writes, and its statistics.
fn path_sections(json: &Value) -> [&Value; 5] {
    [
        &json["path_profile"]["paths"],
        &json["path_profile"]["k_paths"],
        &json["path_profile"]["stats"],
        &json["path_profile"]["functions"],
        &json["path_profile"]["stacks"],
    ]
}

/// A file of `lines` lines `w<number> <number>` (a linear congruential sequence from `seed`)
/// in the scratch directory, for busybox sort and awk.
fn words_file(name: &str, seed: u64, lines: usize) -> PathBuf {
    let path = scratch().join(name);
    let mut text = String::new();
    let mut x = seed;
    for _ in 0..lines {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.push_str(&format!("w{} {}\n", x >> 40, (x >> 20) % 1000));
    }
    fs::write(&path, text).unwrap();
    path
}

/// The awk program the busybox cases run on a [`words_file`].
const AWK_SCRIPT: &str = "{ s[$1 % 7] += $2 } END { for (k in s) print k, s[k] }";

/// The [`DETERMINISTIC`] catalog samples (static) and the guest sources `sources`, built: (name,
/// executable, arguments).
fn deterministic_runs(sources: &[&str]) -> Vec<(String, PathBuf, Vec<&'static str>)> {
    let mut runs: Vec<(String, PathBuf, Vec<&'static str>)> = catalog::SAMPLES
        .iter()
        .filter(|s| DETERMINISTIC.contains(&s.name))
        .map(|s| {
            let exe =
                guest_build::build(s.source, Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
            (s.name.to_string(), exe, s.args.to_vec())
        })
        .collect();
    assert_eq!(
        runs.len(),
        DETERMINISTIC.len(),
        "every listed sample is in the catalog"
    );
    for &source in sources {
        let exe = guest_build::build(source, Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
        runs.push((source.to_string(), exe, Vec::new()));
    }
    runs
}

/// Asserts that `got`'s profile is `want`'s (the per-block reference's): the blocks executed,
/// every path section, and the tables.
fn assert_same_profile(what: &str, got: &Value, want: &Value) {
    assert_eq!(
        got["totals"]["blocks_executed"], want["totals"]["blocks_executed"],
        "{what}: the two runs executed different blocks"
    );
    for (a, b) in path_sections(got).into_iter().zip(path_sections(want)) {
        assert!(
            a == b,
            "{what}: path profiles differ from the per-block reference"
        );
    }
    for section in ["blocks", "edges", "indirect_jumps", "syscalls"] {
        assert!(
            got[section] == want[section],
            "{what}: `{section}` differs from the per-block reference"
        );
    }
}

/// Catalog samples whose block counts do not depend on timing (asynchronous signals, fork)
/// or on where the guest maps code (`signal_fault` runs code in a page it maps).
const DETERMINISTIC: &[&str] = &[
    "hello",
    "loops",
    "jumptable",
    "funcptr_qsort",
    "recursion",
    "strings",
    "setjmp",
    "malloc",
    "exit_call",
    "segv",
    "signal_handler",
    "asm_retaddr",
    "count_branches",
    "count_jumptable",
    "count_calls",
    "count_libc",
    "superblock_fault",
    "bench_sieve",
    "bench_crc",
    "bench_fib",
    "bench_interp",
];

/// The memoised recorder (per event: a segment of a superblock's blocks applied from a memo)
/// and the sums recorder (Ball-Larus sums per activation, renumbered as the CFG grows) write
/// the same paths, k-paths, PAP runs, CFGs and call stacks as the per-block reference
/// (`--paths-recorder per-block`), with superblocks built as early as possible (so events
/// stand for many blocks, side exits included), every function recording PAP runs (so
/// memoised path ends are replayed into them) and k-paths on. Samples whose block counts
/// depend on timing (asynchronous signals, fork) or on where the guest maps code
/// (`signal_fault` runs code in a page it maps) are left out.
#[test]
fn every_recorder_matches_the_per_block_reference() {
    let runs = deterministic_runs(&[
        "paths_branchy.S",
        "paths_loops.c",
        "paths_recursion.S",
        "paths_jump_return.S",
        // A SIGSEGV in the middle of a hot leaf's path, its handler run, the load again.
        "paths_fault_mid_path.c",
        // Mutual recursion 300 deep, past the call tree's 128 levels.
        "paths_deep_mutual.S",
        // A PAP run past the 2^20 paths a run may have (abandoned at the same path).
        "paths_long_run.c",
        // More paths than a u64 numbers, found mid-activation (the sums recorder spells it).
        "paths_many_paths.c",
        // Jumps into code a call reaches only later (then tail calls), the block in two
        // functions.
        "paths_late_entry.S",
        // A function entered by jumps through a pointer (foreign jumps) before its first call
        // and after it (tail calls): the sums recorder kept applying the foreign jump.
        "paths_foreign_then_called.c",
    ]);
    // Every path end replayed one by one (k-paths, PAP everywhere, the call tree); PAP
    // everywhere without k-paths (the fast loops feed PAP runs themselves); PAP runs only for
    // functions that became hot; and the default: paths and activations, no call tree, no PAP
    // runs.
    let configs: [&[&str]; 5] = [
        &[
            "--superblock-threshold",
            "1",
            "--call-tree",
            "--k",
            "3",
            "--pap-threshold",
            "0",
        ],
        &[
            "--superblock-threshold",
            "1",
            "--call-tree",
            "--pap-threshold",
            "0",
        ],
        &["--superblock-threshold", "1", "--call-tree", "--pap-runs"],
        &["--superblock-threshold", "1"],
        // A small ring: superblocks come at other moments, the profile must not change.
        &[
            "--superblock-threshold",
            "1",
            "--call-tree",
            "--pap-threshold",
            "0",
            "--ring-entries",
            "4096",
        ],
    ];
    let mut with_superblocks = 0;
    for (c, config) in configs.iter().enumerate() {
        for (name, exe, args) in &runs {
            let mut per_block = config.to_vec();
            per_block.extend(["--paths-recorder", "per-block"]);
            let reference = run_report(exe, &format!("per-block{c}-{name}"), args, &per_block);
            let by_sums = run_report(exe, &format!("sums{c}-{name}"), args, config);
            paths_in_report_order(&format!("{name} ({config:?}, per-block)"), &reference);
            assert_same_profile(&format!("{name} ({config:?})"), &by_sums, &reference);
            if c == 0
                && by_sums["totals"]["events"].as_u64()
                    < by_sums["totals"]["blocks_executed"].as_u64()
            {
                with_superblocks += 1;
            }
        }
    }
    // Short samples end before a loop gets hot even at threshold 1 (a head needs a hot back
    // edge); the loop-heavy ones do not.
    assert!(
        with_superblocks * 3 >= runs.len(),
        "superblocks ran in only {with_superblocks} of {} samples",
        runs.len()
    );
}

/// `v` with every guest address (a `0x…` string) rewritten as `module+offset` by the
/// report's module table, and every array of objects sorted: two runs of a dynamically linked
/// program map its libraries at different addresses, and what the path profile says must not
/// depend on where.
fn module_relative(report: &Value, v: &Value) -> Value {
    let modules: Vec<(u64, String)> = report["modules"]
        .as_array()
        .expect("modules")
        .iter()
        .map(|m| {
            let base = m["base"].as_str().expect("a module base");
            let base = u64::from_str_radix(base.trim_start_matches("0x"), 16).expect("hex");
            (base, m["path"].as_str().expect("a module path").to_string())
        })
        .collect();
    fn walk(modules: &[(u64, String)], v: &Value) -> Value {
        match v {
            Value::String(s) if s.starts_with("0x") => {
                let Ok(a) = u64::from_str_radix(&s[2..], 16) else {
                    return v.clone();
                };
                match modules
                    .iter()
                    .filter(|(b, _)| *b <= a)
                    .max_by_key(|(b, _)| *b)
                {
                    Some((b, path)) => Value::String(format!("{path}+{:#x}", a - b)),
                    None => v.clone(),
                }
            }
            Value::Array(items) => {
                let mut items: Vec<Value> = items.iter().map(|x| walk(modules, x)).collect();
                if items.iter().all(Value::is_object) {
                    items.sort_by_key(|x| x.to_string());
                }
                Value::Array(items)
            }
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, x)| (k.clone(), walk(modules, x)))
                    .collect(),
            ),
            _ => v.clone(),
        }
    }
    walk(&modules, v)
}

/// Dynamically linked, `paths_plt.c` reaches libc through PLT stubs (whose jumps into the
/// library are tail calls or foreign jumps to the shadow stack), libc's functions call and
/// tail-call each other, qsort calls back into the program, and a helper returns inside its
/// caller's trace: the default recorder applies those as pieces and folds the calls that
/// return within a run, and must write exactly the per-block reference's profile, with and
/// without the call tree. Addresses are compared module-relative (`setarch -R` keeps the
/// guest's stack, whose alignment can steer libc's string routines, where it was).
#[test]
fn dynamic_program_matches_the_per_block_reference() {
    let exe = guest_build::build("paths_plt.c", Linkage::Dynamic)
        .unwrap_or_else(|e| panic!("building paths_plt.c: {e}"));
    let launcher = ["setarch", "x86_64", "-R"];
    for (c, config) in [
        &["--superblock-threshold", "1"][..],
        &["--superblock-threshold", "1", "--call-tree"][..],
        &[][..],
    ]
    .iter()
    .enumerate()
    {
        let mut per_block = config.to_vec();
        per_block.extend(["--paths-recorder", "per-block"]);
        let reference = run_report_with(&launcher, &exe, &format!("plt-pb{c}"), &[], &per_block);
        let got = run_report_with(&launcher, &exe, &format!("plt-sums{c}"), &[], config);
        assert_eq!(
            got["totals"]["blocks_executed"], reference["totals"]["blocks_executed"],
            "{config:?}: the two runs executed different blocks"
        );
        let resyncs = &reference["path_profile"]["stats"]["resyncs_by_cause"];
        assert!(
            resyncs["tail_call"].as_u64() > Some(0),
            "{config:?}: no tail calls: {resyncs}"
        );
        for (a, b) in path_sections(&got)
            .into_iter()
            .zip(path_sections(&reference))
        {
            assert!(
                module_relative(&got, a) == module_relative(&reference, b),
                "{config:?}: the path profile differs from the per-block reference"
            );
        }
    }
}

/// The function named `name` in `profile` (a path profile section), if it has one.
fn function_named<'a>(profile: &'a Value, name: &str) -> Option<&'a Value> {
    profile["functions"]
        .as_array()?
        .iter()
        .find(|f| f["name"] == name)
}

/// The executions of function `f`'s entry block (its calls, for a function whose entry is no
/// loop head).
fn entry_count(f: &Value) -> u64 {
    let entry = &f["entry"];
    f["blocks"]
        .as_array()
        .expect("blocks")
        .iter()
        .find(|b| b["addr"] == *entry)
        .and_then(|b| b["count"].as_u64())
        .unwrap_or(0)
}

/// paths_threads.c: two threads run at once, one calls `squares` 100 times, the other `parity`
/// 50 times, and main only starts and joins them. Each thread's row has its own path profile:
/// `squares` in one, `parity` in the other, neither in main's; the process's `path_profile`
/// sums them (the two functions as their threads have them); and each thread's function is
/// exactly what the per-block reference records, and by the default (sums) recorder, with
/// superblocks formed at once.
#[test]
fn each_thread_has_its_own_paths() {
    let exe = guest_build::build("paths_threads.c", Linkage::Static)
        .unwrap_or_else(|e| panic!("building paths_threads.c: {e}"));
    let mut found: Vec<(Value, Value)> = Vec::new();
    for (tag, extra) in [
        (
            "per-block",
            &[
                "--superblock-threshold",
                "1",
                "--paths-recorder",
                "per-block",
            ][..],
        ),
        ("sums", &["--superblock-threshold", "1"][..]),
    ] {
        let json = run_report(&exe, &format!("threads-{tag}"), &[], extra);
        let threads = json["threads"].as_array().expect("threads");
        assert_eq!(threads.len(), 3, "{tag}: threads");
        let (mut squares, mut parity, mut neither) = (None, None, 0);
        for t in threads {
            let p = &t["path_profile"];
            assert!(
                p.is_object(),
                "{tag}: thread {} has no path profile",
                t["tid"]
            );
            match (function_named(p, "squares"), function_named(p, "parity")) {
                (Some(f), None) => squares = Some(f.clone()),
                (None, Some(f)) => parity = Some(f.clone()),
                (None, None) => neither += 1,
                (Some(_), Some(_)) => panic!("{tag}: one thread has both functions"),
            }
        }
        let (Some(squares), Some(parity)) = (squares, parity) else {
            panic!("{tag}: no thread with squares or with parity");
        };
        assert_eq!(neither, 1, "{tag}: main's thread");
        assert_eq!(entry_count(&squares), 100, "{tag}: squares' calls");
        assert_eq!(entry_count(&parity), 50, "{tag}: parity's calls");
        let process = &json["path_profile"];
        assert_eq!(
            function_named(process, "squares"),
            Some(&squares),
            "{tag}: summed"
        );
        assert_eq!(
            function_named(process, "parity"),
            Some(&parity),
            "{tag}: summed"
        );
        found.push((squares, parity));
    }
    assert_eq!(
        found[1], found[0],
        "the default recorder's: the per-block reference's"
    );
}

/// paths_thread_exit.c: a thread ends with `pthread_exit` inside `leave`, called from
/// `walker`'s loop, so its activations end with their paths half-walked. Per thread, the
/// blocks of its Ball-Larus paths add up to the blocks it executed (the paths the thread left
/// open are counted as ended there), the process's paths add up to its block table, and each
/// thread's paths of the sample's functions are the per-block reference's: with superblocks
/// as usual and formed at once.
#[test]
fn a_thread_ending_mid_path_keeps_its_paths() {
    let exe = guest_build::build("paths_thread_exit.c", Linkage::Static)
        .unwrap_or_else(|e| panic!("building paths_thread_exit.c: {e}"));
    let configs: [&[&str]; 2] = [&[], &["--superblock-threshold", "1"]];
    for (c, config) in configs.iter().enumerate() {
        let mut per_block = config.to_vec();
        per_block.extend(["--paths-recorder", "per-block"]);
        let reference = run_report(&exe, &format!("thread-exit-pb{c}"), &[], &per_block);
        let sums = run_report(&exe, &format!("thread-exit-sums{c}"), &[], config);
        for (what, json) in [("per-block", &reference), ("sums", &sums)] {
            let what = format!("{what} {config:?}");
            // The process's paths sum the threads' (a path the threads number differently has
            // no id there: report-schema.md).
            paths_in_report_order(&what, json);
            paths_cover_blocks(&what, json);
            let threads = json["threads"].as_array().expect("threads");
            assert_eq!(threads.len(), 2, "{what}: threads");
            for t in threads {
                let on_paths: u64 = t["path_profile"]["paths"]
                    .as_array()
                    .expect("paths")
                    .iter()
                    .filter(|p| p["kind"] == "bl")
                    .map(|p| {
                        p["count"].as_u64().unwrap() * p["blocks"].as_array().unwrap().len() as u64
                    })
                    .sum();
                assert_eq!(
                    on_paths,
                    t["blocks_executed"].as_u64().unwrap(),
                    "{what}: thread {}: its paths' blocks against the blocks it executed",
                    t["tid"]
                );
            }
            let ended = &threads[1]["path_profile"];
            assert!(
                ["walker", "run"]
                    .iter()
                    .all(|f| function_named(ended, f).is_some())
                    && ended["functions"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|f| f["name"].as_str().unwrap().starts_with("leave")),
                "{what}: the ended thread's profile lacks walker, leave or run"
            );
        }
        // The sample's own functions, thread by thread (what else a thread runs, such as
        // main's wait in `pthread_join`, depends on timing and differs between two runs).
        for (got, want) in sums["threads"]
            .as_array()
            .unwrap()
            .iter()
            .zip(reference["threads"].as_array().unwrap())
        {
            let (got, want) = (&got["path_profile"], &want["path_profile"]);
            assert_eq!(
                own_paths(got),
                own_paths(want),
                "{config:?}: a thread's paths of walker, leave and run differ from the \
                 per-block reference's"
            );
        }
    }
}

/// The function records and Ball-Larus paths of paths_thread_exit.c's own functions in
/// `profile` (a thread's path profile), each list in a fixed order.
fn own_paths(profile: &Value) -> (Vec<String>, Vec<String>) {
    let own = |name: &str| name == "walker" || name == "run" || name.starts_with("leave");
    let mut functions: Vec<String> = profile["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .filter(|f| own(f["name"].as_str().unwrap_or_default()))
        .map(|f| f.to_string())
        .collect();
    let mut paths: Vec<String> = profile["paths"]
        .as_array()
        .expect("paths")
        .iter()
        .filter(|p| p["kind"] == "bl" && own(p["function"].as_str().unwrap_or_default()))
        .map(|p| p.to_string())
        .collect();
    functions.sort();
    paths.sort();
    assert!(!paths.is_empty(), "no paths of walker, leave or run");
    (functions, paths)
}
