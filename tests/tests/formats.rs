//! The report's other formats and commands against independent readers: drcov read by a
//! parser written here from the format's description, callgrind read by valgrind's own
//! callgrind_annotate, `hotpath merge` (two runs merged are exactly twice one run), the
//! refusals (another schema, a malformed report, reports of different programs, an unknown
//! option), and `hotpath bench`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hotpath_e2e::report::{as_u64, run_with_report};
use hotpath_e2e::{guest_build, hotpath_bin, paths, Linkage, Termination};
use serde_json::Value;

fn scratch() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| paths::scratch_dir("formats")).clone()
}

fn build(source: &str, linkage: Linkage) -> PathBuf {
    guest_build::build(source, linkage).unwrap_or_else(|e| panic!("{e}"))
}

/// `hotpath ARGS`, its output captured.
fn hotpath(args: &[&str]) -> Output {
    let bin = hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary: {e}"));
    Command::new(bin).args(args).output().expect("hotpath runs")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// A drcov file as its description says (DynamoRIO's drcov.c and Lighthouse's reader agree):
/// text header lines, a module table whose `Columns:` line names the fields, then `BB Table: N
/// bbs` and N binary entries `{u32 start; u16 size; u16 mod_id}`.
struct Drcov {
    /// `(id, base, end, path)`.
    modules: Vec<(u64, u64, u64, String)>,
    /// `(module id, start offset, size)`.
    blocks: Vec<(u16, u32, u16)>,
}

fn read_drcov(bytes: &[u8]) -> Drcov {
    let mut rest = bytes;
    let mut line = || -> String {
        let n = rest.iter().position(|&b| b == b'\n').expect("a text line");
        let l = String::from_utf8(rest[..n].to_vec()).expect("UTF-8");
        rest = &rest[n + 1..];
        l
    };
    assert_eq!(line(), "DRCOV VERSION: 2");
    assert!(line().starts_with("DRCOV FLAVOR: "));
    let table = line();
    let count: usize = table
        .strip_prefix("Module Table: version 2, count ")
        .unwrap_or_else(|| panic!("module table header {table:?}"))
        .parse()
        .unwrap();
    let columns: Vec<String> = line()
        .strip_prefix("Columns: ")
        .expect("a Columns line")
        .split(", ")
        .map(str::to_string)
        .collect();
    let col = |name: &str| columns.iter().position(|c| c == name).unwrap();
    let hex = |f: &str| u64::from_str_radix(f.trim().trim_start_matches("0x"), 16).unwrap();
    let mut modules = Vec::new();
    for _ in 0..count {
        let l = line();
        // The path is the last column and may itself contain ", ".
        let fields: Vec<&str> = l.splitn(columns.len(), ',').collect();
        modules.push((
            fields[col("id")].trim().parse().unwrap(),
            hex(fields[col("base")]),
            hex(fields[col("end")]),
            fields[col("path")].trim().to_string(),
        ));
    }
    let bbs = line();
    let n: usize = bbs
        .strip_prefix("BB Table: ")
        .and_then(|r| r.strip_suffix(" bbs"))
        .unwrap_or_else(|| panic!("bb table header {bbs:?}"))
        .parse()
        .unwrap();
    assert_eq!(rest.len(), 8 * n, "{n} entries of 8 bytes");
    let blocks = rest
        .chunks(8)
        .map(|e| {
            (
                u16::from_le_bytes([e[6], e[7]]),
                u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
                u16::from_le_bytes([e[4], e[5]]),
            )
        })
        .collect();
    Drcov { modules, blocks }
}

/// drcov of a dynamically linked program (the program, ld.so, the vDSO, libc): its module
/// table is the report's modules, and its blocks are exactly the report's blocks that lie in
/// a module, as (module, offset, size).
#[test]
fn drcov_lists_the_reports_modules_and_blocks() {
    let exe = build("hello.c", Linkage::Dynamic);
    let cov = scratch().join("hello.drcov");
    let run = run_with_report(&exe, &[], &scratch(), "drcov", &["--drcov", s(&cov)]);
    assert_eq!(run.outcome.termination, Termination::Exited(0));
    let d = read_drcov(&fs::read(&cov).expect("the drcov file"));
    let json = &run.report.json;
    let modules: Vec<(u64, u64, u64, String)> = json["modules"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let base = as_u64(&m["base"]);
            (
                i as u64,
                base,
                base + as_u64(&m["size"]),
                m["path"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(modules.len() >= 3, "program, ld.so, libc: {modules:?}");
    assert_eq!(d.modules, modules);
    let expected: BTreeSet<(u16, u32, u16)> = run
        .report
        .blocks()
        .iter()
        .filter(|b| !b["module"].is_null())
        .map(|b| {
            (
                b["module"].as_u64().unwrap() as u16,
                as_u64(&b["offset"]) as u32,
                as_u64(&b["bytes"]) as u16,
            )
        })
        .collect();
    let got: BTreeSet<(u16, u32, u16)> = d.blocks.iter().copied().collect();
    assert_eq!(got.len(), d.blocks.len(), "each block once");
    assert_eq!(got, expected);
    // Every block lies inside its module.
    for &(m, off, size) in &d.blocks {
        let (_, base, end, _) = &d.modules[m as usize];
        assert!(base + off as u64 + size as u64 <= *end);
    }
}

/// `(function, inclusive Ir)` rows of `callgrind_annotate --inclusive=yes`, most first, and
/// its program total.
fn callgrind_annotate(file: &Path) -> Option<(u64, Vec<(String, u64)>)> {
    let out = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", s(file)])
        .output()
        .ok()?;
    assert!(out.status.success(), "callgrind_annotate failed: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let number = |w: &str| w.replace(',', "").parse::<u64>().ok();
    let mut total = None;
    let mut rows = Vec::new();
    for l in text.lines() {
        let words: Vec<&str> = l.split_whitespace().collect();
        if l.ends_with("PROGRAM TOTALS") {
            total = number(words[0]);
        } else if let (Some(n), Some(f)) = (words.first().and_then(|w| number(w)), words.get(2)) {
            // `1,234 (56.78%)  file:function [object]`
            let name = f.split_once(':').map_or(*f, |(_, f)| f);
            rows.push((name.to_string(), n));
        }
    }
    Some((total.expect("a PROGRAM TOTALS line"), rows))
}

/// `(caller, callee) -> calls` from a callgrind file, read by its specification: `fn=` and
/// `cfn=` name functions (`(id) name` the first time, `(id)` after), `calls=N target`.
fn callgrind_calls(text: &str) -> HashMap<(String, String), u64> {
    let mut names: HashMap<String, String> = HashMap::new();
    let mut name = |spec: &str| -> String {
        let (id, n) = spec.split_once(' ').unwrap_or((spec, ""));
        if !n.is_empty() {
            names.insert(id.to_string(), n.to_string());
        }
        names[id].clone()
    };
    let (mut caller, mut callee) = (String::new(), String::new());
    let mut calls = HashMap::new();
    for l in text.lines() {
        if let Some(f) = l.strip_prefix("fn=") {
            caller = name(f);
        } else if let Some(f) = l.strip_prefix("cfn=") {
            callee = name(f);
        } else if let Some(c) = l.strip_prefix("calls=") {
            let n: u64 = c.split_whitespace().next().unwrap().parse().unwrap();
            *calls.entry((caller.clone(), callee.clone())).or_insert(0) += n;
        }
    }
    calls
}

/// count_calls.S under `--callgrind`: callgrind_annotate's total is the report's guest
/// instructions, its top function and that function's inclusive count are the report's
/// (instructions of every shadow stack the function is on), and the calls are the source's:
/// the indirect call site calls f_one 300 times, f_two 200 and f_three 100, and each of them
/// calls leaf once per call.
#[test]
fn callgrind_profile_reads_in_callgrind_annotate() {
    let exe = build("count_calls.S", Linkage::Static);
    let cg = scratch().join("count_calls.callgrind");
    let run = run_with_report(&exe, &[], &scratch(), "callgrind", &["--callgrind", s(&cg)]);
    assert_eq!(run.outcome.termination, Termination::Exited(0));
    let json = &run.report.json;
    let Some((total, rows)) = callgrind_annotate(&cg) else {
        eprintln!("callgrind_annotate is not installed: skipping its half of the test");
        return;
    };
    assert_eq!(total, as_u64(&json["totals"]["guest_instructions"]));
    // Inclusive instructions per function, from the report's folded stacks.
    let mut inclusive: BTreeMap<String, u64> = BTreeMap::new();
    for st in json["path_profile"]["stacks"].as_array().unwrap() {
        let frames: BTreeSet<&str> = st["stack"].as_str().unwrap().split(';').collect();
        for f in frames {
            *inclusive.entry(f.to_string()).or_insert(0) += as_u64(&st["instructions"]);
        }
    }
    let (top, count) = inclusive
        .iter()
        .max_by_key(|(f, n)| (**n, std::cmp::Reverse(f.as_str())))
        .unwrap();
    assert_eq!(
        rows.first(),
        Some(&(top.clone(), *count)),
        "callgrind_annotate's top function vs the report's"
    );
    let calls = callgrind_calls(&fs::read_to_string(&cg).unwrap());
    let caller = calls
        .keys()
        .find(|(_, callee)| callee == "f_one")
        .map(|(c, _)| c.clone())
        .expect("a call to f_one");
    for (callee, n) in [("f_one", 300), ("f_two", 200), ("f_three", 100)] {
        assert_eq!(
            calls.get(&(caller.clone(), callee.into())),
            Some(&n),
            "{callee}"
        );
        assert_eq!(
            calls.get(&(callee.into(), "leaf".into())),
            Some(&n),
            "{callee} -> leaf"
        );
    }
}

/// Every count in a report, keyed by what identifies it in any run of the same program: module
/// index and offset (or the address outside modules), so that runs loaded at other addresses
/// compare.
fn counts(json: &Value) -> BTreeMap<String, u64> {
    let modules: Vec<(u64, u64)> = json["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (as_u64(&m["base"]), as_u64(&m["size"])))
        .collect();
    let at = |v: &Value| {
        let a = as_u64(v);
        match modules.iter().rposition(|&(b, n)| a >= b && a - b < n) {
            Some(i) => format!("m{i}+{:#x}", a - modules[i].0),
            None => format!("{a:#x}"),
        }
    };
    let mut c = BTreeMap::new();
    for b in json["blocks"].as_array().unwrap() {
        c.insert(format!("block {}", at(&b["addr"])), as_u64(&b["count"]));
    }
    for e in json["edges"].as_array().unwrap() {
        let k = format!("edge {} {} {}", at(&e["from"]), at(&e["to"]), e["kind"]);
        c.insert(k, as_u64(&e["count"]));
    }
    for site in json["indirect_jumps"].as_array().unwrap() {
        for t in site["targets"].as_array().unwrap() {
            let k = format!("indirect {} {}", at(&site["site"]), at(&t["addr"]));
            c.insert(k, as_u64(&t["count"]));
        }
    }
    for sc in json["syscalls"].as_array().unwrap() {
        c.insert(format!("syscall {}", sc["nr"]), as_u64(&sc["count"]));
    }
    for t in ["blocks_executed", "guest_instructions"] {
        c.insert(format!("total {t}"), as_u64(&json["totals"][t]));
    }
    if let Some(pp) = json["path_profile"].as_object() {
        for p in pp["paths"].as_array().unwrap() {
            let blocks: Vec<String> = p["blocks"].as_array().unwrap().iter().map(at).collect();
            let k = format!("path {} {} {}", p["kind"], p["function"], blocks.join(","));
            c.insert(k, as_u64(&p["count"]));
        }
        for st in pp["stacks"].as_array().unwrap() {
            c.insert(
                format!("stack {}", st["stack"]),
                as_u64(&st["instructions"]),
            );
        }
    }
    c
}

/// Two runs of a program merged: every count (blocks, edges, indirect targets, syscalls,
/// totals, paths, stacks) is exactly twice the first run's, static-pie included (its base
/// differs from run to run, so the second run's addresses are moved to the first's).
#[test]
fn merging_two_runs_doubles_every_count() {
    for linkage in [Linkage::Static, Linkage::StaticPie] {
        let exe = build("count_jumptable.S", linkage);
        let what = format!("count_jumptable ({linkage})");
        let a = run_with_report(
            &exe,
            &[],
            &scratch(),
            &format!("merge-a-{linkage}"),
            &["--paths"],
        );
        let b = run_with_report(
            &exe,
            &[],
            &scratch(),
            &format!("merge-b-{linkage}"),
            &["--paths"],
        );
        let out = scratch().join(format!("merged-{linkage}.json"));
        let o = hotpath(&["merge", s(&a.file), s(&b.file), "-o", s(&out)]);
        assert!(o.status.success(), "{what}: merge failed: {o:?}");
        let merged: Value = serde_json::from_str(&fs::read_to_string(&out).unwrap()).unwrap();
        let (one, two) = (counts(&a.report.json), counts(&merged));
        assert_eq!(one.len(), two.len(), "{what}: the same items");
        for (k, n) in &one {
            assert_eq!(two.get(k), Some(&(2 * n)), "{what}: {k}");
        }
        // The merged report reads back, and renders.
        let o = hotpath(&["report", s(&out), "--top", "3"]);
        assert!(o.status.success(), "{what}: {o:?}");
    }
}

/// What hotpath refuses, with one clear line and a non-zero exit: reports of two programs to
/// merge, a report of an older schema, a malformed report, something that is not a report, and
/// an unknown option before the program.
#[test]
fn refusals_name_the_problem() {
    // `hotpath ARGS` fails with exit status `code` and names the problem with every one of
    // `words`; returns its stderr.
    let refused = |args: &[&str], code: i32, words: &[&str]| -> String {
        let o = hotpath(args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        for w in words {
            assert!(err.contains(w), "{args:?}: no {w:?} in {err}");
        }
        err
    };
    // A saved report changed by `change`, refused by `hotpath report` with `words`.
    let changed = |json: &Value, name: &str, change: &dyn Fn(&mut Value), words: &[&str]| {
        let mut v = json.clone();
        change(&mut v);
        let file = scratch().join(name);
        fs::write(&file, v.to_string()).unwrap();
        refused(&["report", s(&file)], 1, words)
    };
    let one = build("count_jumptable.S", Linkage::Static);
    let other = build("count_calls.S", Linkage::Static);
    let a = run_with_report(&one, &[], &scratch(), "refuse-a", &[]);
    let b = run_with_report(&other, &[], &scratch(), "refuse-b", &[]);
    let out = scratch().join("refused.json");
    let merge = ["merge", s(&a.file), s(&b.file), "-o", s(&out)];
    refused(&merge, 1, &["cannot merge", "different programs"]);
    assert!(!out.exists(), "no merged report");

    let json = &a.report.json;
    let old = |v: &mut Value| v["schema"] = "hotpath-report/1".into();
    changed(
        json,
        "old.json",
        &old,
        &["schema hotpath-report/1", "hotpath-report/2"],
    );
    let broken = |v: &mut Value| {
        v["totals"]
            .as_object_mut()
            .unwrap()
            .remove("guest_instructions");
    };
    let err = changed(
        json,
        "broken.json",
        &broken,
        &["malformed", "guest_instructions"],
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");

    refused(&["report", s(&one)], 1, &["not a hotpath report"]);
    refused(
        &["run", "--drcovv", "x", "--", s(&one)],
        2,
        &["--drcovv", "Usage:"],
    );
}

/// `hotpath bench` times every mode and prints one row each with its ratio to native.
#[test]
fn bench_prints_every_mode() {
    let exe = build("count_jumptable.S", Linkage::Static);
    let o = hotpath(&["bench", "--runs", "1", "--no-qemu", "--", s(&exe)]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    for mode in [
        "native",
        "hotpath --no-monitor",
        "hotpath --no-superblocks",
        "hotpath",
    ] {
        let row = out
            .lines()
            .find(|l| l.get(..28).map(str::trim_end) == Some(mode))
            .unwrap_or_else(|| panic!("no {mode:?} row in\n{out}"));
        assert!(row.trim_end().ends_with('x'), "a ratio: {row}");
    }
}
