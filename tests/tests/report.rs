//! The monitor's JSON report (`--report FILE`, schema in docs/report-schema.md) against the
//! guest's real behaviour: it is written however the guest ends (DESIGN.md invariant 3), its
//! totals add up, and its instruction count is exact (invariant 2) — checked against
//! valgrind's independent count for freestanding samples, whose instruction stream does not
//! depend on the CPU (no cpuid, no ifuncs) and has no `rep` string instructions (which
//! valgrind counts once per iteration).
//!
//! These tests also catch a hotpath that only pretends to translate (e.g. execs the guest
//! natively): it would pass the `samples` comparison but write no profile.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use hotpath_e2e::{guest_build, hotpath_bin, paths, runner, Linkage, Termination};
use serde_json::Value;

fn scratch() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| paths::scratch_dir("report")).clone()
}

/// Runs `source` (built with `linkage`) under `hotpath run --quiet --report FILE` and returns
/// how it ended and the parsed report.
fn run_with_report(source: &str, linkage: Linkage, args: &[&str]) -> (PathBuf, Termination, Value) {
    let hotpath =
        hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary to test: {e}"));
    let exe = guest_build::build(source, linkage).unwrap_or_else(|e| panic!("{e}"));
    let report = scratch().join(format!("{}.{linkage}.json", source.replace('.', "_")));
    let _ = fs::remove_file(&report);
    let mut cmd = Command::new(&hotpath);
    cmd.arg("run")
        .arg("--quiet")
        .arg("--report")
        .arg(&report)
        .arg("--")
        .arg(&exe)
        .args(args);
    hotpath_e2e::set_guest_environment(&mut cmd, &scratch());
    let what = runner::describe(&cmd);
    let outcome =
        runner::run(&mut cmd, hotpath_e2e::run_timeout()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "{what} ({}) wrote no report {}: {e}\nstderr: {}",
            outcome.termination,
            report.display(),
            String::from_utf8_lossy(&outcome.stderr)
        )
    });
    let json: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{what}: report {} is not JSON: {e}", report.display()));
    (exe, outcome.termination, json)
}

fn u64_at(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("report has no integer at {pointer}"))
}

/// Checks the fields every report has, and that its totals are the sums of its blocks.
fn check_consistency(exe: &Path, json: &Value) {
    assert_eq!(json["schema"], "hotpath-report/1", "schema");
    let program = json["program"].as_str().expect("program is a string");
    assert_eq!(
        fs::canonicalize(program).ok(),
        fs::canonicalize(exe).ok(),
        "program {program} is not the guest {}",
        exe.display()
    );
    let blocks = json["blocks"].as_array().expect("blocks is an array");
    assert!(
        !blocks.is_empty(),
        "no blocks in the report: nothing was translated?"
    );
    let executed: u64 = blocks.iter().map(|b| u64_at(b, "/count")).sum();
    let instructions: u64 = blocks
        .iter()
        .map(|b| u64_at(b, "/count") * u64_at(b, "/instructions"))
        .sum();
    assert_eq!(
        u64_at(json, "/totals/blocks_executed"),
        executed,
        "totals.blocks_executed"
    );
    assert_eq!(
        u64_at(json, "/totals/guest_instructions"),
        instructions,
        "totals.guest_instructions"
    );
    assert_eq!(
        u64_at(json, "/totals/distinct_blocks"),
        blocks.len() as u64,
        "totals.distinct_blocks"
    );
}

/// valgrind's count of guest instructions executed by `exe`, or `None` without valgrind.
fn valgrind_instructions(exe: &Path) -> Option<u64> {
    let out = Command::new("valgrind")
        .args(["--tool=lackey", "--basic-counts=yes"])
        .arg(exe)
        .output()
        .ok()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().find(|l| l.contains("guest instrs:"))?;
    let digits: String = line
        .rsplit(':')
        .next()?
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

fn check_exact_count(source: &str) {
    for linkage in Linkage::ALL {
        let (exe, termination, json) = run_with_report(source, linkage, &[]);
        assert_eq!(
            termination,
            Termination::Exited(0),
            "{source} ({linkage}) under hotpath"
        );
        check_consistency(&exe, &json);
        assert_eq!(
            json["ending"]["status"], "exited",
            "{source} ({linkage}) ending"
        );
        assert_eq!(json["ending"]["code"], 0, "{source} ({linkage}) ending");
        match valgrind_instructions(&exe) {
            Some(expected) => assert_eq!(
                u64_at(&json, "/totals/guest_instructions"),
                expected,
                "{source} ({linkage}): guest instructions in the report vs valgrind --tool=lackey"
            ),
            None => {
                eprintln!("valgrind is not installed: {source} ({linkage}) count not cross-checked")
            }
        }
    }
}

#[test]
fn instruction_count_is_exact_asm_retaddr() {
    check_exact_count("asm_retaddr.S");
}

#[test]
fn instruction_count_is_exact_asm_redzone() {
    check_exact_count("asm_redzone.S");
}

#[test]
fn report_of_a_libc_program() {
    let (exe, termination, json) = run_with_report("exit_return.c", Linkage::StaticPie, &["x"]);
    assert_eq!(termination, Termination::Exited(42));
    check_consistency(&exe, &json);
    assert_eq!(json["ending"]["status"], "exited");
    assert_eq!(json["ending"]["code"], 42);
    let argv: Vec<&str> = json["argv"]
        .as_array()
        .expect("argv is an array")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(argv.len(), 2, "argv {argv:?}");
    assert_eq!(argv[1], "x", "argv {argv:?}");
    let syscalls = json["syscalls"].as_array().expect("syscalls is an array");
    assert!(
        syscalls.iter().any(|s| s["name"] == "exit_group"),
        "no exit_group among the syscalls: {syscalls:?}"
    );
}

#[test]
fn report_is_written_when_the_guest_dies_by_a_signal() {
    let (exe, termination, json) = run_with_report("segv.c", Linkage::Static, &[]);
    assert_eq!(termination, Termination::Signaled(libc::SIGSEGV));
    check_consistency(&exe, &json);
    assert_eq!(json["ending"]["status"], "signaled");
    assert_eq!(json["ending"]["signal"], libc::SIGSEGV);
}
