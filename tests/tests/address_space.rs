//! The guest's address space is the guest's (`guest-samples/address_space.c`): mmap hints
//! at low addresses, MAP_FIXED where hotpath's code cache was, execute-only code, gaps between
//! segments, brk growing by gigabytes and stopping at a mapping, mprotect past brk,
//! the stack bounded by RLIMIT_STACK, hotpath starting under RLIMIT_AS, threads started until
//! RLIMIT_AS leaves no room. Each case runs natively and under hotpath (monitor off, on, eager
//! superblocks; static, static-pie and dynamic builds) with the same resource limits, and the
//! runs are compared. And what a thread and hotpath itself take of the address space.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use hotpath_e2e::catalog::Linkage;
use hotpath_e2e::{
    compare, guest_build, hotpath_bin, hotpath_command, native_command, runner, MonitorMode,
};

const SOURCE: &str = "address_space.c";

/// Seconds one run may take: every case ends in well under a second natively.
const CASE_TIMEOUT: Duration = Duration::from_secs(20);

/// A case: its arguments, and the soft limits `(resource, bytes)` both runs start with.
struct Case {
    args: &'static [&'static str],
    limits: &'static [(libc::__rlimit_resource_t, u64)],
}

const MIB: u64 = 1 << 20;

const CASES: &[Case] = &[
    Case {
        args: &["hints"],
        limits: &[],
    },
    Case {
        args: &["brk"],
        limits: &[],
    },
    Case {
        args: &["brk-3g"],
        limits: &[],
    },
    Case {
        args: &["fixed"],
        limits: &[],
    },
    Case {
        args: &["exec-only"],
        limits: &[],
    },
    Case {
        args: &["brk-blocked"],
        limits: &[],
    },
    // 20 MiB of frames: within a 32 MiB stack limit, past an 8 MiB one.
    Case {
        args: &["stack", "20000"],
        limits: &[(libc::RLIMIT_STACK, 32 * MIB)],
    },
    Case {
        args: &["stack", "20000"],
        limits: &[(libc::RLIMIT_STACK, 8 * MIB)],
    },
    Case {
        args: &["stack", "3000"],
        limits: &[(libc::RLIMIT_STACK, 4 * MIB)],
    },
    Case {
        args: &["stack", "6000"],
        limits: &[(libc::RLIMIT_STACK, 4 * MIB)],
    },
    // `ulimit -v 1048576`: hotpath's own memory must fit beside the guest's.
    Case {
        args: &["hints"],
        limits: &[(libc::RLIMIT_AS, 1024 * MIB)],
    },
    // Threads started until there is no room for another under a 512 MiB RLIMIT_AS:
    // pthread_create fails with EAGAIN as natively (hotpath's own share of a thread fails the
    // guest's clone, never aborts the process), and the threads started all end.
    Case {
        args: &["threads-until-fail"],
        limits: &[(libc::RLIMIT_AS, 512 * MIB)],
    },
    // brk counts against RLIMIT_DATA.
    Case {
        args: &["brk"],
        limits: &[(libc::RLIMIT_DATA, 1024 * MIB)],
    },
    // New code run after malloc has used up a 1 GiB RLIMIT_AS: a little of it translates in
    // the room hotpath keeps (its translation cache's records, which it can do without, are
    // dropped rather than abort the run).
    Case {
        args: &["exhaust-then-run", "5000"],
        limits: &[(libc::RLIMIT_AS, 1024 * MIB)],
    },
];

/// Makes `cmd` start with the soft `limits` (hard limits unchanged).
fn with_limits(cmd: &mut Command, limits: &'static [(libc::__rlimit_resource_t, u64)]) {
    // SAFETY: the closure runs in the forked child before exec and only calls
    // getrlimit/setrlimit, which are async-signal-safe system calls.
    unsafe {
        cmd.pre_exec(move || {
            for &(resource, bytes) in limits {
                let mut r = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::getrlimit(resource, &mut r);
                r.rlim_cur = bytes.min(r.rlim_max);
                if libc::setrlimit(resource, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

#[test]
fn cases_match_native() {
    let hotpath = hotpath_bin::hotpath().expect("a hotpath binary");
    let mut problems = Vec::new();
    for linkage in Linkage::WITH_DYNAMIC {
        let exe = guest_build::build(SOURCE, linkage).expect("sample builds");
        for case in CASES {
            let mut native = native_command(&exe, case.args);
            with_limits(&mut native, case.limits);
            let native = runner::run(&mut native, CASE_TIMEOUT).expect("native run");
            for mode in MonitorMode::ALL {
                let mut cmd = hotpath_command(&hotpath, mode, &exe, case.args);
                with_limits(&mut cmd, case.limits);
                let translated = runner::run(&mut cmd, CASE_TIMEOUT).expect("hotpath run");
                if let Err(e) = compare::compare_outcomes(&native, &translated) {
                    problems.push(format!(
                        "{} with limits {:?} [{linkage}, {}]:\n{e}",
                        case.args.join(" "),
                        case.limits,
                        mode.label()
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Runs of the `layout` case per side in [`layout_is_randomised_as_natively`].
const LAYOUT_RUNS: usize = 4;

/// The distinct `main` and heap addresses `runs` runs of `cmd` print (the `layout` case).
fn layouts(
    mut cmd: impl FnMut() -> Command,
    no_randomize: bool,
) -> (
    std::collections::BTreeSet<String>,
    std::collections::BTreeSet<String>,
) {
    let (mut mains, mut heaps) = (
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    );
    for _ in 0..LAYOUT_RUNS {
        let mut c = cmd();
        if no_randomize {
            // SAFETY: personality is async-signal-safe; it runs in the child before exec.
            unsafe {
                c.pre_exec(|| {
                    libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
                    Ok(())
                });
            }
        }
        let run = runner::run(&mut c, CASE_TIMEOUT).expect("layout run");
        let text = String::from_utf8_lossy(&run.stdout).into_owned();
        let mut words = text.split_whitespace();
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("main"), Some(main), Some("heap"), Some(heap)) => {
                mains.insert(main.to_string());
                heaps.insert(heap.to_string());
            }
            _ => panic!("unexpected layout output: {text:?}"),
        }
    }
    (mains, heaps)
}

/// A PIE's base and the heap's start change from run to run under hotpath where they do
/// natively (the kernel's randomisation, `randomize_va_space`), and stay put under
/// `setarch -R` (`ADDR_NO_RANDOMIZE`) as natively.
#[test]
fn layout_is_randomised_as_natively() {
    let hotpath = hotpath_bin::hotpath().expect("a hotpath binary");
    let mut problems = Vec::new();
    for linkage in Linkage::WITH_DYNAMIC {
        let exe = guest_build::build(SOURCE, linkage).expect("sample builds");
        let args = ["layout"];
        let native = layouts(|| native_command(&exe, &args), false);
        let translated = layouts(
            || hotpath_command(&hotpath, MonitorMode::On, &exe, &args),
            false,
        );
        for (what, n, t) in [
            ("main", &native.0, &translated.0),
            ("heap", &native.1, &translated.1),
        ] {
            if n.len() > 1 && t.len() == 1 {
                problems.push(format!(
                    "[{linkage}] {what} moves natively ({n:?}) but not under hotpath ({t:?})"
                ));
            }
        }
        let fixed = layouts(
            || hotpath_command(&hotpath, MonitorMode::On, &exe, &args),
            true,
        );
        if fixed.0.len() > 1 || fixed.1.len() > 1 {
            problems.push(format!(
                "[{linkage}] under ADDR_NO_RANDOMIZE the layout moves: {fixed:?}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The sample built with 2 MiB segment alignment (`-z max-page-size=0x200000 -z
/// separate-code`), which leaves gaps between its PT_LOAD segments, for `linkage`.
fn build_with_gaps(linkage: Linkage) -> std::path::PathBuf {
    let out = guest_build::build_dir().join(format!("address_space_gaps.{}", linkage.flag()));
    std::fs::create_dir_all(guest_build::build_dir()).expect("build dir");
    let status = Command::new("gcc")
        .args(guest_build::gcc_args(SOURCE, linkage))
        .args([
            "-Wl,-z,max-page-size=0x200000",
            "-Wl,-z,separate-code",
            "-o",
        ])
        .arg(&out)
        .arg(hotpath_e2e::paths::samples_dir().join(SOURCE))
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed on {SOURCE} for {linkage}");
    out
}

/// Natively nothing is mapped between an image's segments: a load there is SEGV_MAPERR, and
/// the guest may map there (hotpath gives back what its reservation of the image's span did
/// not use).
#[test]
fn gaps_between_segments_are_unmapped_as_natively() {
    let hotpath = hotpath_bin::hotpath().expect("a hotpath binary");
    let mut problems = Vec::new();
    for linkage in Linkage::WITH_DYNAMIC {
        let exe = build_with_gaps(linkage);
        let native =
            runner::run(&mut native_command(&exe, &["hole"]), CASE_TIMEOUT).expect("native run");
        assert!(
            String::from_utf8_lossy(&native.stdout).contains("SEGV_MAPERR"),
            "the {linkage} build has no gap between its segments:\n{}",
            String::from_utf8_lossy(&native.stdout)
        );
        for mode in MonitorMode::ALL {
            let mut cmd = hotpath_command(&hotpath, mode, &exe, &["hole"]);
            let translated = runner::run(&mut cmd, CASE_TIMEOUT).expect("hotpath run");
            if let Err(e) = compare::compare_outcomes(&native, &translated) {
                problems.push(format!("hole [{linkage}, {}]:\n{e}", mode.label()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The numbers after `tag` on the line of `stdout` that starts with it.
fn numbers_after(stdout: &[u8], tag: &str) -> Vec<i64> {
    let text = String::from_utf8_lossy(stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with(tag))
        .unwrap_or_else(|| panic!("no line starting {tag:?} in:\n{text}"));
    line[tag.len()..]
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// Threads the idle-threads case starts.
const IDLE_THREADS: i64 = 16;

/// Each idle thread costs the process at most this much address space beyond what it costs
/// natively (kB): hotpath's code regions start small and grow with the code (#57).
const THREAD_ADDRESS_SPACE_KB: i64 = 64 * 1024;

/// ... and at most this much resident memory beyond native's (kB).
const THREAD_RESIDENT_KB: i64 = 2 * 1000;

/// `VmSize` and `VmRSS` growth per thread (kB) from the idle-threads case's output.
fn per_thread_growth(stdout: &[u8]) -> (i64, i64) {
    let before = numbers_after(stdout, "before ");
    let during = numbers_after(stdout, "during ");
    (
        (during[0] - before[0]) / IDLE_THREADS,
        (during[1] - before[1]) / IDLE_THREADS,
    )
}

/// Sixteen threads that wait on a barrier cost each at most `THREAD_ADDRESS_SPACE_KB` of
/// address space and `THREAD_RESIDENT_KB` resident beyond what a thread costs natively, as
/// `/proc/self/status` shows them to the guest itself.
#[test]
fn an_idle_thread_costs_little_address_space() {
    let hotpath = hotpath_bin::hotpath().expect("a hotpath binary");
    let n = IDLE_THREADS.to_string();
    let args = ["idle-threads", n.as_str()];
    let mut problems = Vec::new();
    for linkage in Linkage::WITH_DYNAMIC {
        let exe = guest_build::build(SOURCE, linkage).expect("sample builds");
        let native = runner::run(&mut native_command(&exe, &args), CASE_TIMEOUT).expect("native");
        let (native_size, native_rss) = per_thread_growth(&native.stdout);
        for mode in MonitorMode::ALL {
            let mut cmd = hotpath_command(&hotpath, mode, &exe, &args);
            let run = runner::run(&mut cmd, CASE_TIMEOUT).expect("hotpath run");
            let (size, rss) = per_thread_growth(&run.stdout);
            let label = format!("[{linkage}, {}]", mode.label());
            if size - native_size > THREAD_ADDRESS_SPACE_KB {
                problems.push(format!(
                    "{label}: a thread takes {size} kB of address space, natively {native_size}"
                ));
            }
            if rss - native_rss > THREAD_RESIDENT_KB {
                problems.push(format!(
                    "{label}: a thread takes {rss} kB resident, natively {native_rss}"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// What hotpath itself may take of a 1 GiB `RLIMIT_AS` (MiB): its binary, heap, the
/// monitor, the thread area with its ring, and the code cache's first regions.
const OWN_SHARE_MIB: i64 = 128;

/// `ulimit -v 1048576`: a program that mallocs until it fails gets at least native's amount
/// less `OWN_SHARE_MIB`.
#[test]
fn malloc_under_rlimit_as_gets_nearly_what_it_gets_natively() {
    let hotpath = hotpath_bin::hotpath().expect("a hotpath binary");
    let limits: &'static [(libc::__rlimit_resource_t, u64)] = &[(libc::RLIMIT_AS, 1024 * MIB)];
    let mut problems = Vec::new();
    for linkage in Linkage::WITH_DYNAMIC {
        let exe = guest_build::build(SOURCE, linkage).expect("sample builds");
        let mut native = native_command(&exe, &["malloc-max"]);
        with_limits(&mut native, limits);
        let native = runner::run(&mut native, CASE_TIMEOUT).expect("native run");
        let native_mib = numbers_after(&native.stdout, "malloc got ")[0];
        for mode in MonitorMode::ALL {
            let mut cmd = hotpath_command(&hotpath, mode, &exe, &["malloc-max"]);
            with_limits(&mut cmd, limits);
            let run = runner::run(&mut cmd, CASE_TIMEOUT).expect("hotpath run");
            let got = numbers_after(&run.stdout, "malloc got ")[0];
            if got < native_mib - OWN_SHARE_MIB {
                problems.push(format!(
                    "[{linkage}, {}]: malloc got {got} MiB, natively {native_mib}",
                    mode.label()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Much new code run after malloc has used up a 1 GiB `RLIMIT_AS` (200,000 functions of one
/// block each, their translations larger than any room hotpath keeps): the run goes as
/// natively, or ends with hotpath's one-line out-of-memory error and status 1 (its profile
/// written when its reserve leaves room); never Rust's `memory allocation of N bytes failed`
/// abort, a panic or a signal.
#[test]
fn running_out_of_memory_for_translations_ends_the_run_cleanly() {
    let hotpath = hotpath_bin::hotpath().expect("a hotpath binary");
    let limits: &'static [(libc::__rlimit_resource_t, u64)] = &[(libc::RLIMIT_AS, 1024 * MIB)];
    let args = &["exhaust-then-run", "200000"];
    let mut problems = Vec::new();
    for linkage in Linkage::WITH_DYNAMIC {
        let exe = guest_build::build(SOURCE, linkage).expect("sample builds");
        let mut native = native_command(&exe, args);
        with_limits(&mut native, limits);
        let native = runner::run(&mut native, CASE_TIMEOUT).expect("native run");
        assert_eq!(
            native.termination,
            runner::Termination::Exited(0),
            "natively"
        );
        for mode in MonitorMode::ALL {
            let mut cmd = hotpath_command(&hotpath, mode, &exe, args);
            with_limits(&mut cmd, limits);
            let run = runner::run(&mut cmd, CASE_TIMEOUT).expect("hotpath run");
            let stderr = String::from_utf8_lossy(&run.stderr);
            let as_natively = run.termination == native.termination && run.stdout == native.stdout;
            let out_of_memory = run.termination == runner::Termination::Exited(1)
                && stderr
                    .lines()
                    .any(|l| l.starts_with("hotpath: ") && l.contains("out of memory"))
                && native.stdout.starts_with(&run.stdout);
            let aborted =
                stderr.contains("memory allocation of") || stderr.contains("internal error");
            if aborted || !(as_natively || out_of_memory) {
                problems.push(format!(
                    "[{linkage}, {}]: {:?}\nstdout: {}\nstderr: {stderr}",
                    mode.label(),
                    run.termination,
                    String::from_utf8_lossy(&run.stdout)
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
