//! Source lines and pprof against independent readers: a sample built with `-g`
//! (lines_hot.c) run with `--pprof` and `--callgrind`, read back by `go tool pprof` (golang-go)
//! and valgrind's `callgrind_annotate --auto=yes`; the counts per line they show must be what
//! the report's block counts imply, with each instruction's line taken from binutils' `objdump
//! -l` (not from the DWARF reader hotpath uses). Also the text report's hot lines, and the bad
//! inputs: malformed debug information, an unwritable `--pprof` path.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use hotpath_e2e::report::{as_u64, run_with_report};
use hotpath_e2e::{guest_build, hotpath_bin, paths, Linkage, Termination};
use serde_json::Value;

const SAMPLE: &str = "lines_hot.c";

fn scratch() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| paths::scratch_dir("lines")).clone()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// The 1-based line of the sample's source that contains `marker`.
fn source_line(marker: &str) -> u32 {
    let src = fs::read_to_string(paths::samples_dir().join(SAMPLE)).unwrap();
    src.lines()
        .position(|l| l.contains(marker))
        .map(|i| i as u32 + 1)
        .unwrap_or_else(|| panic!("no {marker:?} in {SAMPLE}"))
}

/// Instruction address → source line of the sample's own file, by `objdump -d -l`.
fn objdump_lines(exe: &Path) -> HashMap<u64, u32> {
    let out = Command::new("objdump")
        .args(["-d", "-l", "--no-show-raw-insn", s(exe)])
        .output()
        .expect("objdump runs");
    assert!(out.status.success(), "objdump: {out:?}");
    let mut lines = HashMap::new();
    let mut current = None;
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some((file, n)) = l.rsplit_once(':') {
            if !file.contains(' ') && file.contains('/') {
                // `/path/file.c:17` (or `... (discriminator 2)`).
                let n = n.split_whitespace().next().unwrap_or("");
                current = n.parse::<u32>().ok().filter(|_| file.ends_with(SAMPLE));
                continue;
            }
        }
        let t = l.trim_start();
        if let Some((addr, _)) = t.split_once(":\t") {
            if let (Ok(a), Some(n)) = (u64::from_str_radix(addr, 16), current) {
                lines.insert(a, n);
            }
        }
    }
    lines
}

/// Guest instructions per line of the sample, from the report's blocks and objdump's lines.
fn expected_line_counts(json: &Value, exe: &Path) -> HashMap<u32, u64> {
    let lines = objdump_lines(exe);
    let mut starts: Vec<u64> = lines.keys().copied().collect();
    starts.sort();
    let mut out = HashMap::new();
    for b in json["blocks"].as_array().unwrap() {
        let addr =
            u64::from_str_radix(b["addr"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
        let end = addr + as_u64(&b["bytes"]);
        let from = starts.partition_point(|&a| a < addr);
        for a in starts[from..].iter().take_while(|&&a| a < end) {
            *out.entry(lines[a]).or_insert(0) += as_u64(&b["count"]);
        }
    }
    out
}

/// Guest instructions of the blocks whose symbol is `function` or `function+…`.
fn function_instructions(json: &Value, function: &str) -> u64 {
    json["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| {
            b["symbol"].as_str().is_some_and(|s| {
                s == function || s.strip_prefix(function).is_some_and(|r| r.starts_with('+'))
            })
        })
        .map(|b| as_u64(&b["count"]) * as_u64(&b["instructions"]))
        .sum()
}

/// `go tool pprof ARGS`, or `None` when Go is not installed.
fn pprof(args: &[&str]) -> Option<String> {
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .output()
        .ok()?;
    assert!(out.status.success(), "go tool pprof {args:?}: {out:?}");
    Some(String::from_utf8(out.stdout).unwrap())
}

/// The `flat` column and the name of each row of `pprof -top`, most first.
fn top_rows(text: &str) -> Vec<(u64, String)> {
    text.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((w.first()?.parse().ok()?, w.get(5..)?.join(" ")))
        })
        .collect()
}

/// The sample run with `--paths --pprof --callgrind`, its files named after `name`.
fn run_sample(name: &str) -> (PathBuf, hotpath_e2e::report::ReportRun, PathBuf, PathBuf) {
    let exe = guest_build::build(SAMPLE, Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let (pb, cg) = (
        scratch().join(format!("{name}.pb.gz")),
        scratch().join(format!("{name}.cg")),
    );
    let run = run_with_report(
        &exe,
        &[],
        &scratch(),
        name,
        &["--paths", "--pprof", s(&pb), "--callgrind", s(&cg)],
    );
    assert_eq!(run.outcome.termination, Termination::Exited(0));
    (exe, run, pb, cg)
}

/// The pprof profile in the real client: `-top` names sum_squares first with exactly its
/// blocks' instructions, `-lines` names the HOT line with exactly the instructions objdump puts
/// on it, `-traces` shows sum_squares's one calling context, and `-raw` has the build id.
#[test]
fn pprof_profile_reads_in_go_tool_pprof() {
    let (exe, run, pb, _) = run_sample("pprof");
    let json = &run.report.json;
    let Some(top) = pprof(&["-top", s(&pb)]) else {
        eprintln!("go is not installed (golang-go): skipping the pprof test");
        return;
    };
    assert!(
        top.contains(&format!(
            "of {} total",
            as_u64(&json["totals"]["guest_instructions"])
        )),
        "{top}"
    );
    let rows = top_rows(&top);
    assert_eq!(
        rows.first(),
        Some(&(
            function_instructions(json, "sum_squares"),
            "sum_squares".to_string()
        )),
        "{top}"
    );

    let hot = source_line("/* HOT */");
    let expected = expected_line_counts(json, &exe);
    let by_lines = pprof(&["-top", "-lines", s(&pb)]).unwrap();
    let (n, name) = top_rows(&by_lines).into_iter().next().expect("a row");
    assert!(
        name.starts_with("sum_squares ") && name.ends_with(&format!("{SAMPLE}:{hot}")),
        "{by_lines}"
    );
    assert_eq!(Some(&n), expected.get(&hot), "{by_lines}");

    let traces = pprof(&["-traces", s(&pb)]).unwrap();
    let context = traces
        .split("-----------+")
        .find(|t| t.contains("sum_squares"))
        .expect("a trace of sum_squares");
    let frames: Vec<&str> = context
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|w| ["sum_squares", "work", "main"].contains(w))
        .collect();
    assert_eq!(frames, ["sum_squares", "work", "main"], "{context}");

    // `hotpath report SAVED --pprof` renders the same profile from the JSON report.
    let again = scratch().join("again.pb.gz");
    let hotpath = hotpath_bin::hotpath().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(&hotpath)
        .args(["report", s(&run.file), "--pprof", s(&again)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(top_rows(&pprof(&["-top", s(&again)]).unwrap()), rows);

    // The labels a profile store aggregates on.
    let tags = pprof(&["-tags", s(&pb)]).unwrap();
    assert!(
        tags.contains("program:") && tags.contains("pid:") && tags.contains(s(&exe)),
        "{tags}"
    );

    // Profiles of several runs merge in pprof itself: two runs are exactly twice one.
    let merged = scratch().join("merged.pb.gz");
    pprof(&["-proto", "-output", s(&merged), s(&pb), s(&pb)]).unwrap();
    let twice = top_rows(&pprof(&["-top", s(&merged)]).unwrap());
    assert_eq!(twice.first().map(|r| r.0), rows.first().map(|r| 2 * r.0));

    let raw = pprof(&["-raw", s(&pb)]).unwrap();
    let notes = Command::new("readelf")
        .args(["-n", s(&exe)])
        .output()
        .unwrap();
    let notes = String::from_utf8_lossy(&notes.stdout);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("a build id");
    assert!(
        raw.lines()
            .any(|l| l.contains(s(&exe)) && l.contains(id.trim())),
        "mapping with {id}: {raw}"
    );
}

/// callgrind_annotate --auto=yes annotates the sample's source: the HOT line carries the
/// largest count, the one objdump's lines and the block counts give.
#[test]
fn callgrind_annotate_annotates_the_hot_source_line() {
    let (exe, run, _, cg) = run_sample("callgrind");
    let out = match Command::new("callgrind_annotate")
        .args(["--auto=yes", s(&cg)])
        .output()
    {
        Ok(o) => o,
        Err(_) => {
            eprintln!("callgrind_annotate is not installed: skipping");
            return;
        }
    };
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let number = |w: &str| w.replace(',', "").parse::<u64>().ok();
    // The annotated source: `1,234 (56.78%)  source text` per line, and `=> callee` lines
    // with the costs of calls, which are not lines.
    let source = text
        .split_once("-- Auto-annotated source:")
        .expect("an annotated source")
        .1;
    let annotated: Vec<(u64, &str)> = source
        .lines()
        .filter_map(|l| {
            let (count, rest) = l.trim_start().split_once(' ')?;
            let rest = rest.trim_start().strip_prefix('(')?.split_once(')')?.1;
            Some((number(count)?, rest))
        })
        .filter(|(_, src)| !src.trim_start().starts_with("=>") && !src.contains("events annotated"))
        .collect();
    let hottest = annotated
        .iter()
        .max_by_key(|(n, _)| *n)
        .expect("annotated lines");
    assert!(hottest.1.contains("/* HOT */"), "{hottest:?} in {text}");
    let expected = expected_line_counts(&run.report.json, &exe);
    assert_eq!(
        Some(&hottest.0),
        expected.get(&source_line("/* HOT */")),
        "{text}"
    );
}

/// The text report's hot lines start with the HOT line; a module whose debug information is
/// malformed runs as before, named by symbol, with no error; an unwritable `--pprof` path is
/// one line and the guest's exit status is kept.
#[test]
fn hot_lines_in_the_text_report_and_bad_debug_information() {
    let exe = guest_build::build(SAMPLE, Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let hotpath = hotpath_bin::hotpath().unwrap_or_else(|e| panic!("{e}"));
    let json_file = scratch().join("text.json");
    let out = Command::new(&hotpath)
        .args([
            "run",
            "--top",
            "3",
            "--report",
            s(&json_file),
            "--",
            s(&exe),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let table = err
        .split_once("hotpath: hot lines")
        .expect("a hot lines table")
        .1;
    let first = table.lines().nth(1).expect("a row");
    // Its share is the one objdump's lines and the block counts give.
    let json: Value = serde_json::from_slice(&fs::read(&json_file).unwrap()).unwrap();
    let hot = source_line("/* HOT */");
    let share = 100.0 * expected_line_counts(&json, &exe)[&hot] as f64
        / as_u64(&json["totals"]["guest_instructions"]) as f64;
    assert!(
        first.starts_with(&format!("  {share:5.1}%  "))
            && first.contains(&format!("{SAMPLE}:{hot}  "))
            && first.ends_with("sum_squares"),
        "{share:.1}% expected: {err}"
    );

    // The same program with its .debug_info and .debug_line replaced by junk.
    let junk = scratch().join("junk.bin");
    fs::write(&junk, vec![0xa5u8; 4096]).unwrap();
    let broken = scratch().join("lines_hot.broken");
    let st = Command::new("objcopy")
        .args([
            &format!("--update-section=.debug_info={}", s(&junk)),
            &format!("--update-section=.debug_line={}", s(&junk)),
            s(&exe),
            s(&broken),
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let pb = scratch().join("broken.pb.gz");
    let cg = scratch().join("broken.cg");
    let out = Command::new(&hotpath)
        .args([
            "run",
            "--pprof",
            s(&pb),
            "--callgrind",
            s(&cg),
            "--",
            s(&broken),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("panicked") && err.contains("sum_squares"),
        "{err}"
    );
    assert!(fs::metadata(&pb).is_ok() && fs::metadata(&cg).is_ok());

    // An unwritable pprof path: one line, the guest's status (lines_hot exits 0) kept.
    let out = Command::new(&hotpath)
        .args([
            "run",
            "-q",
            "--pprof",
            "/nonexistent/dir/p.pb.gz",
            "--",
            s(&exe),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = err.lines().filter(|l| l.starts_with("hotpath:")).collect();
    assert_eq!(ours.len(), 1, "{err}");
    assert!(ours[0].contains("/nonexistent/dir/p.pb.gz"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}
