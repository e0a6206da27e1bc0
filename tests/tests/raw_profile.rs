//! The raw profile (`run --profile FILE`): `hotpath report FILE --json OUT` renders exactly the
//! JSON report the same run wrote with `--report` (threads, path profiles, forked children,
//! exec'd programs, the vDSO and shared libraries); `report` and `merge` take it where they
//! take a JSON report; a module whose file changed since the run is not named from the new
//! file; a damaged or foreign file gets one clear line.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use hotpath_e2e::report::Report;
use hotpath_e2e::{guest_build, hotpath_bin, paths, runner, set_guest_environment, Linkage};

fn scratch(name: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR
        .get_or_init(|| paths::scratch_dir("raw_profile"))
        .join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("mkdir");
    dir
}

fn hotpath() -> PathBuf {
    hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary to test: {e}"))
}

/// Runs `hotpath ARGS` in `dir` with the guest environment; panics unless it exits 0 (or
/// `guest_ok` says the guest's own status is fine). Returns stdout and stderr.
fn run(dir: &Path, args: &[&std::ffi::OsStr], expect_success: bool) -> (String, String) {
    let mut cmd = Command::new(hotpath());
    cmd.args(args);
    set_guest_environment(&mut cmd, dir);
    let what = runner::describe(&cmd);
    let out =
        runner::run(&mut cmd, hotpath_e2e::run_timeout()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if expect_success {
        assert_eq!(
            out.termination,
            hotpath_e2e::Termination::Exited(0),
            "{what}\nstderr: {stderr}"
        );
    }
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

/// `hotpath run -q --profile RAW -- EXE` in `dir`, which must succeed.
fn run_with_profile(dir: &Path, raw: &Path, exe: &Path) {
    let args = [
        os("run"),
        os("-q"),
        os("--profile"),
        raw.as_os_str(),
        os("--"),
        exe.as_os_str(),
    ];
    run(dir, &args, true);
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

/// Runs `exe args` under `hotpath run -q [hotpath_args] --report DIR/r.json --profile
/// DIR/r.raw`, then renders every raw profile the run's processes wrote (`r.raw`,
/// `r.raw.<pid>`, `r.raw.exec`, ...) with `hotpath report -q --json` and requires each to be
/// byte for byte the JSON report of the same process. Returns how many processes wrote one.
fn check_raw_equals_json(dir: &Path, exe: &Path, args: &[&str], hotpath_args: &[&str]) -> usize {
    let (json, raw) = (dir.join("r.json"), dir.join("r.raw"));
    let mut a: Vec<&std::ffi::OsStr> = vec![os("run"), os("-q")];
    a.extend(hotpath_args.iter().map(|s| os(s)));
    a.extend([
        os("--report"),
        json.as_os_str(),
        os("--profile"),
        raw.as_os_str(),
        os("--"),
        exe.as_os_str(),
    ]);
    a.extend(args.iter().map(|s| os(s)));
    run(dir, &a, false);
    let mut processes = 0;
    for entry in fs::read_dir(dir).expect("read dir").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(suffix) = name.strip_prefix("r.json") else {
            continue;
        };
        let raw = dir.join(format!("r.raw{suffix}"));
        assert!(raw.is_file(), "{name} has no raw profile beside it");
        let rendered = dir.join(format!("rendered.json{suffix}"));
        run(
            dir,
            &[
                os("report"),
                os("-q"),
                raw.as_os_str(),
                os("--json"),
                rendered.as_os_str(),
            ],
            true,
        );
        let (want, got) = (
            fs::read_to_string(entry.path()).expect("json"),
            fs::read_to_string(&rendered).expect("rendered"),
        );
        if want != got {
            let (w, g) = (Report::read(&entry.path()), Report::read(&rendered));
            panic!(
                "{name}: the rendered raw profile differs from the run's JSON report\nrun: {}\nrendered: {}",
                w.map(|r| r.json.to_string().chars().take(2000).collect::<String>())
                    .unwrap_or_else(|e| e),
                g.map(|r| r.json.to_string().chars().take(2000).collect::<String>())
                    .unwrap_or_else(|e| e),
            );
        }
        processes += 1;
    }
    processes
}

/// Two threads with path profiles of their own, a dynamic program (ld.so, libc, the vDSO):
/// the rendered raw profile is the JSON report, and its text summary is the JSON's.
#[test]
fn a_raw_profile_renders_the_report_the_run_wrote_threads_and_paths() {
    let exe =
        guest_build::build("paths_threads.c", Linkage::Dynamic).unwrap_or_else(|e| panic!("{e}"));
    let dir = scratch("threads");
    assert_eq!(check_raw_equals_json(&dir, &exe, &[], &["--paths"]), 1);
    let report = Report::read(&dir.join("r.json")).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.json["threads"]
        .as_array()
        .is_some_and(|t| t.len() >= 3));
    assert!(report.json["path_profile"].is_object());
    let text_of = |f: &str| run(&dir, &[os("report"), dir.join(f).as_os_str()], true).0;
    assert_eq!(text_of("r.raw"), text_of("r.json"));
}

/// Forked children and exec'd programs write raw profiles under the names their JSON reports
/// get, each rendering to its report.
#[test]
fn a_raw_profile_renders_the_report_the_run_wrote_fork_and_exec() {
    let exe = guest_build::build("fork_exec.c", Linkage::Dynamic).unwrap_or_else(|e| panic!("{e}"));
    let dir = scratch("fork_exec");
    let n = check_raw_equals_json(&dir, &exe, &[], &[]);
    assert!(n >= 4, "{n} processes wrote a profile");
    let exe = guest_build::build("fork_wait.c", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let dir = scratch("fork_wait");
    let n = check_raw_equals_json(&dir, &exe, &[], &["--no-superblocks"]);
    assert!(n >= 8, "{n} processes wrote a profile");
}

/// `merge` sums raw profiles as it sums JSON reports.
#[test]
fn merge_takes_raw_profiles() {
    let exe = guest_build::build("loops.c", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let dir = scratch("merge");
    check_raw_equals_json(&dir, &exe, &[], &[]);
    let merged = dir.join("merged.json");
    run(
        &dir,
        &[
            os("merge"),
            dir.join("r.raw").as_os_str(),
            dir.join("r.json").as_os_str(),
            os("-o"),
            merged.as_os_str(),
        ],
        true,
    );
    let one = Report::read(&dir.join("r.json")).unwrap_or_else(|e| panic!("{e}"));
    let two = Report::read(&merged).unwrap_or_else(|e| panic!("{e}"));
    assert!(one.total("blocks_executed") > 0);
    assert_eq!(
        two.total("blocks_executed"),
        2 * one.total("blocks_executed")
    );
    assert_eq!(
        two.total("guest_instructions"),
        2 * one.total("guest_instructions")
    );
}

/// The program's file changed after the run (same build id, other size): its blocks are not
/// named from the new file's symbols, and `report` says why; the unchanged file names them.
#[test]
fn a_module_changed_since_the_run_is_named_by_offset() {
    let built = guest_build::build("loops.c", Linkage::Dynamic).unwrap_or_else(|e| panic!("{e}"));
    let dir = scratch("changed");
    let exe = dir.join("loops");
    fs::copy(&built, &exe).expect("copy the program");
    let raw = dir.join("r.raw");
    run_with_profile(&dir, &raw, &exe);
    let render = |out: &str| {
        let json = dir.join(out);
        let (_, stderr) = run(
            &dir,
            &[
                os("report"),
                os("-q"),
                raw.as_os_str(),
                os("--json"),
                json.as_os_str(),
            ],
            true,
        );
        (
            Report::read(&json).unwrap_or_else(|e| panic!("{e}")),
            stderr,
        )
    };
    let (before, stderr) = render("before.json");
    assert!(stderr.is_empty(), "{stderr}");
    let mut bytes = fs::read(&exe).expect("read");
    bytes.extend_from_slice(&[0; 64]);
    fs::write(&exe, bytes).expect("rewrite the program");
    let (after, stderr) = render("after.json");
    assert!(
        stderr.contains("is not the file the run mapped") && stderr.contains("loops"),
        "{stderr}"
    );
    let names_main = |r: &Report| {
        r.blocks().iter().any(|b| {
            b["symbol"]
                .as_str()
                .is_some_and(|s| s == "main" || s.starts_with("main+"))
        })
    };
    assert!(names_main(&before));
    assert!(
        !names_main(&after),
        "a block named from the changed file's symbols"
    );
    assert_eq!(
        after.total("blocks_executed"),
        before.total("blocks_executed")
    );
}

/// A truncated raw profile, one of another version, and a file that is neither form: one
/// `hotpath:` line naming the file, exit status 1, no panic.
#[test]
fn a_damaged_raw_profile_gets_one_clear_line() {
    let exe = guest_build::build("hello.c", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let dir = scratch("damaged");
    let raw = dir.join("r.raw");
    run_with_profile(&dir, &raw, &exe);
    let good = fs::read(&raw).expect("read");
    let mut version = good.clone();
    version[8] = version[8].wrapping_add(1);
    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    for b in &mut flipped[mid..] {
        *b = !*b;
    }
    for (name, bytes, says) in [
        (
            "truncated.raw",
            good[..good.len() / 3].to_vec(),
            "not a usable raw profile",
        ),
        ("short.raw", good[..10].to_vec(), "not a usable raw profile"),
        ("version.raw", version, "raw profile version"),
        ("flipped.raw", flipped, "not a usable raw profile"),
        ("text.raw", b"HPRAW? no".to_vec(), "not JSON"),
    ] {
        let file = dir.join(name);
        fs::write(&file, bytes).expect("write");
        let mut cmd = Command::new(hotpath());
        cmd.arg("report").arg(&file);
        let out = runner::run(&mut cmd, hotpath_e2e::run_timeout()).expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.termination,
            hotpath_e2e::Termination::Exited(1),
            "{name}: {stderr}"
        );
        assert!(
            stderr.starts_with("hotpath: ")
                && stderr.lines().count() == 1
                && stderr.contains(name)
                && !stderr.contains("panicked"),
            "{name}: {stderr}"
        );
        assert!(
            stderr.to_lowercase().contains(&says.to_lowercase()),
            "{name}: {stderr}"
        );
    }
}
