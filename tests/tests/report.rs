//! The monitor's JSON report (`--report FILE`, schema in docs/report-schema.md) against the
//! guest's real behaviour: it is written however the guest ends (DESIGN.md invariant 3: exit
//! from main, a fault, abort, SIGINT to hotpath, and in every forked child as `FILE.<pid>`), it
//! is consistent (totals add up, control flow is conserved), and it does not depend on the
//! event ring's size (a full ring stalls the guest, it never drops or reorders events).
//!
//! These tests also catch a hotpath that only pretends to translate (e.g. execs the guest
//! natively): it would pass the `samples` comparison but write no profile. Exact counts are
//! in `counts.rs`; instruction totals against valgrind in `counts.rs` and `valgrind.rs`.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hotpath_e2e::report::{
    as_u64, assert_same_execution, check_consistency, run_with_report, Report,
};
use hotpath_e2e::{guest_build, hotpath_bin, paths, Linkage, Termination};
use serde_json::Value;

fn scratch() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| paths::scratch_dir("report")).clone()
}

fn build(source: &str, linkage: Linkage) -> PathBuf {
    guest_build::build(source, linkage).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn report_of_a_libc_program_returning_from_main() {
    let exe = build("exit_return.c", Linkage::StaticPie);
    let run = run_with_report(&exe, &["x"], &scratch(), "exit_return", &[]);
    assert_eq!(run.outcome.termination, Termination::Exited(42));
    check_consistency(&exe, &run.report, "exit_return");
    let json = &run.report.json;
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
    // main returns to __libc_start_main, which calls exit, which ends with exit_group.
    let exit_group = run.report.syscall("exit_group").unwrap_or_else(|| {
        panic!(
            "no exit_group among the syscalls: {:?}",
            run.report.syscalls()
        )
    });
    assert_eq!(as_u64(&exit_group["count"]), 1, "{exit_group}");
}

/// A guest that dies of a signal: the report says which, and it is consistent.
fn check_death(source: &str, signal: i32, name: &str) {
    for linkage in Linkage::ALL {
        let exe = build(source, linkage);
        let run = run_with_report(&exe, &[], &scratch(), &format!("{source}.{linkage}"), &[]);
        assert_eq!(
            run.outcome.termination,
            Termination::Signaled(signal),
            "{source} ({linkage})"
        );
        check_consistency(&exe, &run.report, source);
        let ending = &run.report.json["ending"];
        assert_eq!(
            ending["status"], "signaled",
            "{source} ({linkage}): {ending}"
        );
        assert_eq!(ending["signal"], signal, "{source} ({linkage}): {ending}");
        assert_eq!(ending["name"], name, "{source} ({linkage}): {ending}");
    }
}

#[test]
fn report_is_written_when_the_guest_dies_of_sigsegv() {
    check_death("segv.c", libc::SIGSEGV, "SIGSEGV");
}

#[test]
fn report_is_written_when_the_guest_aborts() {
    check_death("abort.c", libc::SIGABRT, "SIGABRT");
}

#[test]
fn report_is_written_when_the_guest_kills_itself_with_sigterm() {
    check_death("sigterm_self.c", libc::SIGTERM, "SIGTERM");
}

/// SIGINT sent to hotpath while the guest computes (bench_fib, seconds of work): hotpath dies
/// of SIGINT like the guest would, promptly, after writing a report that says so.
#[test]
fn report_is_written_when_hotpath_gets_sigint_mid_run() {
    let hotpath =
        hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary to test: {e}"));
    let exe = build("bench_fib.c", Linkage::Static);
    let file = scratch().join("sigint.json");
    let _ = fs::remove_file(&file);
    let mut cmd = Command::new(&hotpath);
    cmd.args(["run", "--quiet", "--report"])
        .arg(&file)
        .arg("--")
        .arg(&exe)
        .arg("42");
    hotpath_e2e::set_guest_environment(&mut cmd, &scratch());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn hotpath");
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "bench_fib 42 ended within 400 ms: give it more work"
    );
    let sent = Instant::now();
    // SAFETY: kill(2) on our own child; no memory involved.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if sent.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("hotpath still running 10 s after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let took = sent.elapsed();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGINT),
        "hotpath after SIGINT: {status:?}"
    );
    assert!(
        took < Duration::from_secs(2),
        "hotpath took {took:?} to end after SIGINT"
    );
    let report = Report::read(&file).unwrap_or_else(|e| panic!("after SIGINT: {e}"));
    check_consistency(&exe, &report, "bench_fib interrupted");
    let ending = &report.json["ending"];
    assert_eq!(ending["status"], "signaled", "{ending}");
    assert_eq!(ending["signal"], libc::SIGINT, "{ending}");
    assert_eq!(ending["name"], "SIGINT", "{ending}");
    // bench_fib runs ~10^8 blocks a second; after 400 ms even a loaded machine ran many.
    assert!(
        report.total("blocks_executed") > 10_000,
        "the guest ran 400 ms but the report has {} block executions",
        report.total("blocks_executed")
    );
}

/// fork_wait forks 11 processes (6 children at once, one killed by its own SIGUSR1, one by the
/// parent's SIGTERM, one reaped by wait4, one that forks a grandchild, a vfork child, and one
/// that flushes inherited stdio): each writes its own report `FILE.<pid>` (the grandchild
/// `FILE.<child pid>.<pid>`), ending as the process did, with consistent counts.
#[test]
fn forked_children_write_their_own_reports() {
    let exe = build("fork_wait.c", Linkage::Static);
    let dir = scratch().join("fork");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("mkdir");
    let run = run_with_report(&exe, &[], &dir, "fork", &[]);
    assert_eq!(run.outcome.termination, Termination::Exited(0));
    check_consistency(&exe, &run.report, "fork_wait parent");
    assert_eq!(run.report.json["ending"]["status"], "exited");

    // The six first children's statuses, from the expected output.
    let expected_stdout =
        fs::read_to_string(paths::expected_dir().join("fork_wait.stdout")).expect("expected");
    let mut want: BTreeMap<String, usize> = BTreeMap::new();
    for line in expected_stdout
        .lines()
        .filter(|l| l.starts_with("child ") && l.contains("(right pid)"))
    {
        let code = line.rsplit(' ').next().unwrap_or("?");
        *want.entry(format!("exited {code}")).or_default() += 1;
    }
    assert_eq!(want.values().sum::<usize>(), 6, "expected file: {want:?}");
    for end in [
        "signaled SIGUSR1",
        "signaled SIGTERM",
        "exited 17",
        "exited 34",
        "exited 33",
        "exited 44",
        "exited 0",
    ] {
        *want.entry(end.to_string()).or_default() += 1;
    }

    let mut got: BTreeMap<String, usize> = BTreeMap::new();
    let mut grandchildren = 0;
    for entry in fs::read_dir(&dir).expect("read dir").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pids) = name.strip_prefix("fork.json.") else {
            continue;
        };
        let pids: Vec<&str> = pids.split('.').collect();
        assert!(
            pids.iter().all(|p| p.parse::<u32>().is_ok()),
            "odd child report name {name}"
        );
        grandchildren += usize::from(pids.len() == 2);
        let report = Report::read(&entry.path()).unwrap_or_else(|e| panic!("{e}"));
        check_consistency(&exe, &report, &name);
        let ending = &report.json["ending"];
        let key = match ending["status"].as_str() {
            Some("exited") => format!("exited {}", ending["code"]),
            Some("signaled") => format!("signaled {}", ending["name"].as_str().unwrap_or("?")),
            other => format!("{other:?}"),
        };
        *got.entry(key).or_default() += 1;
    }
    assert_eq!(got, want, "endings of the children's reports (FILE.<pid>)");
    assert_eq!(
        grandchildren, 1,
        "one grandchild report FILE.<child>.<grandchild>"
    );
}

/// The same program with a 64-entry ring (the guest stalls on a full ring all the time) and a
/// 1 Mi-entry ring gives the same report: no event is lost or reordered by stalls.
#[test]
fn report_does_not_depend_on_the_ring_size() {
    let mut small_ring_waits = 0;
    for (source, args) in [
        ("count_jumptable.S", &[][..]),
        ("bench_interp.c", &["3"][..]),
    ] {
        let exe = build(source, Linkage::Static);
        let small = run_with_report(&exe, args, &scratch(), "ring64", &["--ring-entries", "64"]);
        let large = run_with_report(
            &exe,
            args,
            &scratch(),
            "ring1m",
            &["--ring-entries", "1048576"],
        );
        assert_eq!(
            small.outcome.termination,
            Termination::Exited(0),
            "{source}"
        );
        assert_eq!(
            large.outcome.termination,
            Termination::Exited(0),
            "{source}"
        );
        check_consistency(&exe, &small.report, source);
        small_ring_waits += small.report.total("ring_waits");
        assert_same_execution(
            &small.report,
            &large.report,
            source,
            ("--ring-entries 64", "--ring-entries 1048576"),
        );
    }
    assert!(
        small_ring_waits > 0,
        "a 64-entry ring never filled: the test proves nothing"
    );
}

/// `blocks[].code` (with `--paths`) is what the translator decoded: each block's bytes equal
/// the program file's bytes at its address (a static program's code is its file's code).
#[test]
fn block_code_is_the_programs_own_bytes() {
    let exe = build("count_calls.S", Linkage::Static);
    let run = run_with_report(&exe, &[], &scratch(), "block_code", &["--paths"]);
    assert_eq!(run.outcome.termination, Termination::Exited(0));
    let file = fs::read(&exe).expect("reading the sample");
    let u64_at = |o: usize| u64::from_le_bytes(file[o..o + 8].try_into().unwrap());
    let u16_at = |o: usize| u16::from_le_bytes(file[o..o + 2].try_into().unwrap()) as usize;
    // (vaddr, file offset, bytes in the file) of each PT_LOAD segment.
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    let loads: Vec<(u64, u64, u64)> = (0..phnum)
        .map(|i| phoff + i * phentsize)
        .filter(|&p| u32::from_le_bytes(file[p..p + 4].try_into().unwrap()) == 1)
        .map(|p| (u64_at(p + 16), u64_at(p + 8), u64_at(p + 32)))
        .collect();
    let mut checked = 0;
    for b in run.report.json["blocks"].as_array().expect("blocks") {
        let addr =
            u64::from_str_radix(b["addr"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
        let code = b["code"].as_str().unwrap_or_else(|| panic!("no code: {b}"));
        let bytes: Vec<u8> = (0..code.len() / 2)
            .map(|i| u8::from_str_radix(&code[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        assert_eq!(bytes.len() as u64, as_u64(&b["bytes"]), "{b}");
        let Some(&(vaddr, offset, _)) = loads
            .iter()
            .find(|&&(v, _, size)| addr >= v && addr + bytes.len() as u64 <= v + size)
        else {
            continue; // the vDSO
        };
        let at = (offset + addr - vaddr) as usize;
        assert_eq!(bytes, file[at..at + bytes.len()], "block at {addr:#x}");
        checked += 1;
    }
    assert!(checked > 10, "only {checked} blocks checked");
}
