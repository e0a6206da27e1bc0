//! Code changed without a store the write fault sees (`guest-samples/code_writes.c`, issue
//! #24): writes through `/proc/self/mem` (RX text and an RWX page; `pwrite`, `lseek` +
//! `write`, `pwritev` through a `dup`), `process_vm_writev` to the process itself, `readv`
//! and `recv` into a translated RWX page, `madvise(MADV_DONTNEED)` of anonymous and private
//! file pages, and a plain store as the control. Each case runs natively and under hotpath
//! (monitor off, on, eager superblocks; static, static-pie and dynamic builds) and the runs
//! are compared.

use hotpath_e2e::catalog::Linkage;
use hotpath_e2e::{
    compare, guest_build, hotpath_bin, hotpath_command, native_command, runner, MonitorMode,
    Termination,
};
use std::time::Duration;

const SOURCE: &str = "code_writes.c";

/// Seconds one run may take: every case ends in well under a second natively.
const CASE_TIMEOUT: Duration = Duration::from_secs(20);

/// Every case of the sample; each must match the native run.
const CASES: &[&str] = &[
    "store",
    "procmem-rwx",
    "procmem-text",
    "procmem-write",
    "procmem-pid",
    "vm-writev",
    "readv-pipe",
    "recv-dgram",
    "madvise-anon",
    "madvise-file",
    "same-block",
];

#[test]
fn code_writes_match_native() {
    let hotpath = hotpath_bin::hotpath().expect("a hotpath binary");
    let mut problems = Vec::new();
    for linkage in Linkage::WITH_DYNAMIC {
        let exe = guest_build::build(SOURCE, linkage).expect("sample builds");
        for &case in CASES {
            let native =
                runner::run(&mut native_command(&exe, &[case]), CASE_TIMEOUT).expect("native run");
            // The sample itself: natively every channel changes the code.
            let out = String::from_utf8_lossy(&native.stdout);
            assert_eq!(native.termination, Termination::Exited(0), "{case}: {out}");
            // (`same-block`: the bytes each call stores are what runs.)
            assert!(
                if case == "same-block" {
                    out == "same-block: 5 9, loop 55 10\n"
                } else {
                    out.starts_with(&format!("{case}: before 1, ")) && out.contains(", after 2\n")
                },
                "{case} [{linkage}] natively: {out}"
            );
            for mode in MonitorMode::ALL {
                let mut cmd = hotpath_command(&hotpath, mode, &exe, &[case]);
                let translated = runner::run(&mut cmd, CASE_TIMEOUT).expect("hotpath run");
                if let Err(e) = compare::compare_outcomes(&native, &translated) {
                    problems.push(format!("{case} [{linkage}, {}]:\n{e}", mode.label()));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
