//! Guests that look at their process from the kernel's side (`guest-samples/hostile_proc.c`),
//! each case run natively and under hotpath (monitor off, on, eager superblocks; static,
//! static-pie and dynamic builds) and compared: system calls hotpath has no row for
//! (`uretprobe`'s SIGILL, numbers past the table), `/proc/self/comm`, `cmdline` and `auxv`,
//! seccomp in strict mode and with filters (errno, kill, trap, TSYNC), and the documented
//! difference of `unshare(CLONE_NEWUSER)`.

use hotpath_e2e::catalog::Linkage;
use hotpath_e2e::{
    compare, guest_build, hotpath_bin, hotpath_command, native_command, runner, MonitorMode,
};
use std::time::Duration;

const SOURCE: &str = "hostile_proc.c";

/// Seconds one run may take: every case ends in well under a second natively.
const CASE_TIMEOUT: Duration = Duration::from_secs(20);

/// The cases whose hotpath run must equal the native run.
const SAME_AS_NATIVE: &[&[&str]] = &[
    &["unknown-syscalls"],
    &["uretprobe"],
    &["uretprobe-default"],
    &["seccomp", "strict"],
    &["seccomp", "strict-kill"],
    &["seccomp", "deny-getpid"],
    &["seccomp", "deny-process_vm_readv"],
    &["seccomp", "kill-futex"],
    &["seccomp", "kill-futex-exit"],
    &["seccomp", "tsync-kill-futex-exit"],
    &["seccomp", "kill-thread-getppid"],
    &["seccomp", "trap-getppid"],
    &["seccomp", "tsync-getpid"],
];

/// Runs each case natively and under hotpath in every mode and linkage; returns the
/// differences.
fn compare_cases(cases: &[&[&str]], modes: &[MonitorMode]) -> Vec<String> {
    let hotpath = hotpath_bin::hotpath().expect("a hotpath binary");
    let mut problems = Vec::new();
    for linkage in Linkage::WITH_DYNAMIC {
        let exe = guest_build::build(SOURCE, linkage).expect("sample builds");
        for &args in cases {
            let native =
                runner::run(&mut native_command(&exe, args), CASE_TIMEOUT).expect("native run");
            for &mode in modes {
                let mut cmd = hotpath_command(&hotpath, mode, &exe, args);
                let translated = runner::run(&mut cmd, CASE_TIMEOUT).expect("hotpath run");
                if let Err(e) = compare::compare_outcomes(&native, &translated) {
                    problems.push(format!(
                        "{} [{linkage}, {}]:\n{e}",
                        args.join(" "),
                        mode.label()
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn cases_match_native() {
    let problems = compare_cases(SAME_AS_NATIVE, &MonitorMode::ALL);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
