//! The persisted translation cache (#39): a warm run (blocks placed from the cache) gives the
//! native run's output and the cold run's profile, count for count; a damaged file, a
//! directory others can write, `--no-cache` and concurrent writers change nothing the guest
//! sees; `hotpath cache` shows and clears it.

use std::path::{Path, PathBuf};
use std::process::Command;

use hotpath_e2e::report::as_u64;
use hotpath_e2e::{
    busybox, compare, guest_build, hotpath_bin, paths, private_dir, runner, set_guest_environment,
    Linkage, Outcome,
};
use serde_json::Value;

fn scratch(what: &str) -> PathBuf {
    paths::scratch_dir(&format!("translation-cache-{what}"))
}

/// Runs `exe args` natively.
fn native(exe: &Path, args: &[&str], cwd: &Path) -> Outcome {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    set_guest_environment(&mut cmd, cwd);
    runner::run(&mut cmd, hotpath_e2e::run_timeout()).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `exe args` under hotpath with the cache in `cache` (and `extra` options), writing a
/// report; checks the outcome against `native` and returns the report (null with
/// `--no-monitor`, which writes none).
fn run(
    exe: &Path,
    args: &[&str],
    cache: &Path,
    extra: &[&str],
    native: &Outcome,
    cwd: &Path,
) -> Value {
    run_images(exe, args, cache, extra, native, cwd)
        .swap_remove(0)
        .1
}

/// As [`run`], but returns every process image's report: the guest's own first (named
/// `main`), then those of the processes it forked and the programs they exec'd, in the order
/// they were created, each named by its file name's suffix with every pid replaced by its
/// rank (`.1`, `.1.exec`, `.2`, ...), so two runs' lists pair up.
fn run_images(
    exe: &Path,
    args: &[&str],
    cache: &Path,
    extra: &[&str],
    native: &Outcome,
    cwd: &Path,
) -> Vec<(String, Value)> {
    let hotpath = hotpath_bin::hotpath().unwrap_or_else(|e| panic!("{e}"));
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let report = cwd.join(format!("report-{n}.json"));
    let profiled = !extra.contains(&"--no-monitor");
    let mut cmd = Command::new(&hotpath);
    cmd.args(["run", "--quiet", "--cache-dir"])
        .arg(cache)
        .args(extra);
    if profiled {
        cmd.arg("--report").arg(&report);
    }
    cmd.arg("--").arg(exe).args(args);
    set_guest_environment(&mut cmd, cwd);
    let what = runner::describe(&cmd);
    let out =
        runner::run(&mut cmd, hotpath_e2e::run_timeout()).unwrap_or_else(|e| panic!("{what}: {e}"));
    if let Err(e) = compare::compare_outcomes(native, &out) {
        panic!("{what} differs from the native run:\n{e}");
    }
    if !profiled {
        return vec![("main".into(), Value::Null)];
    }
    let read = |p: &Path| -> Value {
        let json = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        let _ = std::fs::remove_file(p);
        json
    };
    let mut images = vec![("main".to_string(), read(&report))];
    // `report-N.json.<pid>` for a forked child, `.exec` added for a program it exec'd.
    let prefix = format!("{}.", report.file_name().unwrap().to_string_lossy());
    let mut others: Vec<(u32, String, PathBuf)> = std::fs::read_dir(cwd)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix(&prefix)?.to_string();
            let pid = rest.split('.').next()?.parse().ok()?;
            Some((pid, rest, e.path()))
        })
        .collect();
    others.sort();
    // Pids wrap around at `/proc/sys/kernel/pid_max` (32768 on many systems): the first
    // process is the one after the widest gap between two pids, counted round the wrap (a
    // run's processes take pids close together), not the lowest.
    if let (Some(first), Some(last)) = (others.first(), others.last()) {
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(1 << 22);
        let gaps = others
            .windows(2)
            .enumerate()
            .map(|(i, w)| (w[1].0 - w[0].0, i + 1));
        let (_, start) = std::iter::once((first.0 + pid_max - last.0, 0))
            .chain(gaps)
            .max_by_key(|gap| gap.0)
            .unwrap();
        others.rotate_left(start);
    }
    let mut rank = 0;
    let mut last_pid = None;
    for (pid, rest, path) in others {
        if last_pid != Some(pid) {
            rank += 1;
            last_pid = Some(pid);
        }
        let name = format!(".{rank}{}", &rest[pid.to_string().len()..]);
        images.push((name, read(&path)));
    }
    images
}

/// The store files in `cache`.
fn store_files(cache: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(cache)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "hpc"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// What a profile says about the guest, by module and offset (ASLR moves libraries between
/// runs; hotpath's own start-up can move them too): every block's count, size and
/// terminator, every edge, indirect target and system call, and the totals that count the
/// guest's work. The vDSO's blocks and edges are not, and the totals are without them: its
/// clock reads retry when the kernel updates the time meanwhile (a seqlock), natively too, so
/// how often its loop runs, and which of its paths, is the kernel's timing.
fn profile(r: &Value) -> Vec<String> {
    let modules: Vec<(String, u64, u64)> = r["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["path"].as_str().unwrap().to_string(),
                as_u64(&m["base"]),
                as_u64(&m["size"]),
            )
        })
        .collect();
    // An address as module + offset (the latest module mapped there).
    let rel = |v: &Value| {
        let a = as_u64(v);
        match modules
            .iter()
            .rev()
            .find(|(_, base, size)| *base <= a && a < base + size)
        {
            Some((path, base, _)) => format!("{path}+{:#x}", a - base),
            None => format!("{a:#x}"),
        }
    };
    let mut out = Vec::new();
    let vdso = |name: &str| name.starts_with("[vdso]");
    let (mut vdso_distinct, mut vdso_blocks, mut vdso_instructions) = (0, 0, 0);
    for b in r["blocks"].as_array().unwrap() {
        let at = rel(&b["addr"]);
        if vdso(&at) {
            vdso_distinct += 1;
            vdso_blocks += as_u64(&b["count"]);
            vdso_instructions += as_u64(&b["count"]) * as_u64(&b["instructions"]);
            continue;
        }
        out.push(format!(
            "block {at} {} {} {} {}",
            b["count"], b["instructions"], b["bytes"], b["terminator"]
        ));
    }
    for e in r["edges"].as_array().unwrap() {
        if vdso(&rel(&e["from"])) {
            continue;
        }
        out.push(format!(
            "edge {} {} {} {}",
            rel(&e["from"]),
            rel(&e["to"]),
            e["kind"],
            e["count"]
        ));
    }
    for s in r["syscalls"].as_array().unwrap() {
        out.push(format!("syscall {} {}", s["nr"], s["count"]));
    }
    // Not `events`: how many blocks ran inside superblocks depends on when the monitor formed
    // them.
    let totals = &r["totals"];
    out.push(format!(
        "blocks_executed {}",
        as_u64(&totals["blocks_executed"]) - vdso_blocks
    ));
    out.push(format!(
        "guest_instructions {}",
        as_u64(&totals["guest_instructions"]) - vdso_instructions
    ));
    out.push(format!(
        "distinct_blocks {}",
        as_u64(&totals["distinct_blocks"]) - vdso_distinct
    ));
    out.sort();
    out
}

/// The profile lines of `a` missing from `b` and the other way round.
fn diff(a: &[String], b: &[String]) -> String {
    let (sa, sb): (std::collections::BTreeSet<_>, std::collections::BTreeSet<_>) =
        (a.iter().collect(), b.iter().collect());
    let only_a: Vec<_> = sa.difference(&sb).take(10).collect();
    let only_b: Vec<_> = sb.difference(&sa).take(10).collect();
    format!("cold only: {only_a:#?}\nwarm only: {only_b:#?}")
}

/// Whether the guest's own profile is compared count for count, or only its run warm: a
/// shell that waits for children takes SIGCHLD wherever it happens to be when a child ends,
/// so the edges around that point differ between two native runs too.
#[derive(Clone, Copy, PartialEq)]
enum MainProfile {
    Exact,
    /// Exact, and the warm run places every block of the main image from the cache.
    ExactAllPlaced,
    TimingDependent,
}

/// Cold, then warm: the warm run places every block the cold one translated (these programs
/// run the same way each time) in every process image, and each image's profile is the cold
/// one's (the guest's own as `main` says).
fn cold_then_warm(exe: &Path, args: &[&str], extra: &[&str], what: &str, main: MainProfile) {
    let dir = scratch(what);
    let cache = dir.join("cache");
    let n = native(exe, args, &dir);
    let cold = run_images(exe, args, &cache, extra, &n, &dir);
    assert!(
        !store_files(&cache).is_empty(),
        "{what}: the cold run wrote no store file"
    );
    let warm = run_images(exe, args, &cache, extra, &n, &dir);
    if cold[0].1.is_null() {
        // No profile without the monitor: the cache's own counts say what the runs did, one
        // `hits misses` line each.
        let log = std::fs::read_to_string(cache.join("stats")).unwrap_or_default();
        let lines: Vec<Vec<u64>> = log
            .lines()
            .map(|l| l.split(' ').map(|w| w.parse().unwrap()).collect())
            .collect();
        assert!(
            lines.len() == 2 && lines[0][0] == 0 && lines[1][1] == 0 && lines[1][0] > 0,
            "{what}: {log}"
        );
        return;
    }
    let names = |v: &[(String, Value)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&cold),
        names(&warm),
        "{what}: the runs wrote reports for different process images"
    );
    for ((name, cold), (_, warm)) in cold.iter().zip(&warm) {
        let what = format!("{what} ({name})");
        // Later processes of the cold run find what earlier ones stored.
        if name == "main" {
            assert_eq!(
                as_u64(&cold["totals"]["blocks_loaded"]),
                0,
                "{what}: a cold run loads nothing"
            );
        }
        let (translated, loaded) = (
            as_u64(&warm["totals"]["blocks_translated"]),
            as_u64(&warm["totals"]["blocks_loaded"]),
        );
        assert!(
            loaded > 0 && loaded * 10 >= translated * 9,
            "{what}: the warm run placed {loaded} of {translated} blocks"
        );
        // A static program's code is all in its file: a warm run translates nothing afresh,
        // its `switch` dispatches (jump-table sites) included, and so never builds iced's
        // decoder and encoder tables.
        if name == "main" && main == MainProfile::ExactAllPlaced {
            assert_eq!(
                loaded, translated,
                "{what}: the warm run translated blocks afresh"
            );
        }
        if name == "main" && main == MainProfile::TimingDependent {
            continue;
        }
        let (pc, pw) = (profile(cold), profile(warm));
        assert!(
            pc == pw,
            "{what}: the warm profile differs from the cold one:\n{}",
            diff(&pc, &pw)
        );
    }
}

#[test]
fn a_warm_run_has_the_cold_runs_profile() {
    for linkage in [Linkage::Static, Linkage::StaticPie, Linkage::Dynamic] {
        let exe = guest_build::build("jumptable.c", linkage).unwrap_or_else(|e| panic!("{e}"));
        let main = match linkage {
            Linkage::Static => MainProfile::ExactAllPlaced,
            _ => MainProfile::Exact,
        };
        cold_then_warm(&exe, &[], &[], &format!("jumptable-{linkage}"), main);
        cold_then_warm(
            &exe,
            &[],
            &["--no-monitor"],
            &format!("jumptable-{linkage}-nomon"),
            MainProfile::Exact,
        );
    }
    let exe = guest_build::build("recursion.c", Linkage::Dynamic).unwrap_or_else(|e| panic!("{e}"));
    cold_then_warm(&exe, &[], &[], "recursion", MainProfile::Exact);
    // The vDSO's blocks are kept too (under its build id and bytes): a program that reads the
    // clock places its blocks warm, but for those of the vDSO's retry paths that only one of
    // the two runs took (the kernel's timing), hence not `ExactAllPlaced`.
    let exe = guest_build::build("clock.c", Linkage::Dynamic).unwrap_or_else(|e| panic!("{e}"));
    cold_then_warm(&exe, &[], &[], "clock", MainProfile::Exact);
}

/// A program that meets a few blocks no earlier program stored in a library's file that others
/// filled (fewer than the file's rewrite takes) keeps them too, in the file's delta: its next
/// run places every block (a run that translates one afresh builds iced's tables).
#[test]
fn a_few_new_blocks_in_a_big_file_are_kept_too() {
    let big = guest_build::build("strings.c", Linkage::Dynamic).unwrap_or_else(|e| panic!("{e}"));
    let small = guest_build::build("hello.c", Linkage::Dynamic).unwrap_or_else(|e| panic!("{e}"));
    let dir = scratch("delta");
    let cache = dir.join("cache");
    run(&big, &[], &cache, &[], &native(&big, &[], &dir), &dir);
    let n = native(&small, &[], &dir);
    let first = run(&small, &[], &cache, &[], &n, &dir);
    let second = run(&small, &[], &cache, &[], &n, &dir);
    let placed = |r: &Value| {
        (
            as_u64(&r["totals"]["blocks_loaded"]),
            as_u64(&r["totals"]["blocks_translated"]),
        )
    };
    let (loaded, translated) = placed(&second);
    assert_eq!(
        loaded,
        translated,
        "the second run translated blocks afresh (first run: {:?})",
        placed(&first)
    );
    assert_eq!(profile(&first), profile(&second));
}

#[test]
fn a_shell_script_runs_warm_in_every_process() {
    let Some(bb) = busybox() else { return };
    // Forks and execs applets: each process reads the cache and adds to it. The subshells
    // and applets take no asynchronous signal: their profiles are compared count for count.
    let script = "for i in 1 2 3; do echo $i | busybox tr 123 abc; busybox expr $i + 1; done";
    cold_then_warm(
        bb,
        &["sh", "-c", script],
        &[],
        "busybox-sh",
        MainProfile::TimingDependent,
    );
}

/// The static jumptable sample, a scratch directory for `what`, a cache there with one cold
/// run in it, and the native outcome.
fn primed(what: &str) -> (PathBuf, PathBuf, PathBuf, Outcome) {
    let exe = guest_build::build("jumptable.c", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let dir = scratch(what);
    let cache = dir.join("cache");
    let n = native(&exe, &[], &dir);
    run(&exe, &[], &cache, &[], &n, &dir);
    (exe, dir, cache, n)
}

#[test]
fn a_damaged_or_foreign_cache_changes_nothing_but_its_use() {
    let (exe, dir, cache, n) = primed("damaged");
    // Every byte position class: header, middle, last byte.
    for f in store_files(&cache) {
        let mut bytes = std::fs::read(&f).unwrap();
        let len = bytes.len();
        for at in [5, len / 2, len - 1] {
            bytes[at] ^= 0x41;
        }
        std::fs::write(&f, &bytes).unwrap();
    }
    let r = run(&exe, &[], &cache, &[], &n, &dir);
    assert_eq!(
        as_u64(&r["totals"]["blocks_loaded"]),
        0,
        "a damaged file was used"
    );
    // It was written again whole.
    let r = run(&exe, &[], &cache, &[], &n, &dir);
    assert!(
        as_u64(&r["totals"]["blocks_loaded"]) > 0,
        "the damaged file was not replaced"
    );

    // A directory others may write is not used, nor is a store file others may write.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let r = run(&exe, &[], &cache, &[], &n, &dir);
    assert_eq!(as_u64(&r["totals"]["blocks_loaded"]), 0);
    assert_eq!(as_u64(&r["totals"]["translation_cache_errors"]), 1);
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
    for f in store_files(&cache) {
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let r = run(&exe, &[], &cache, &[], &n, &dir);
    assert_eq!(
        as_u64(&r["totals"]["blocks_loaded"]),
        0,
        "a world-writable store file was used"
    );

    // --no-cache neither reads nor writes.
    let fresh = dir.join("fresh");
    let r = run(&exe, &[], &fresh, &["--no-cache"], &n, &dir);
    assert_eq!(as_u64(&r["totals"]["blocks_loaded"]), 0);
    assert!(!fresh.exists(), "--no-cache created the cache directory");
}

#[test]
fn concurrent_runs_share_one_cache() {
    let exe = guest_build::build("jumptable.c", Linkage::Dynamic).unwrap_or_else(|e| panic!("{e}"));
    let dir = scratch("concurrent");
    let cache = dir.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let cache = private_dir(cache);
    let n = native(&exe, &[], &dir);
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| run(&exe, &[], &cache, &[], &n, &dir));
        }
    });
    assert!(!std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().ends_with(".tmp")));
    let r = run(&exe, &[], &cache, &[], &n, &dir);
    assert!(as_u64(&r["totals"]["blocks_loaded"]) > 0);
}

#[test]
fn the_cache_command_shows_and_clears() {
    let (exe, dir, cache, n) = primed("command");
    run(&exe, &[], &cache, &[], &n, &dir);
    let hotpath = hotpath_bin::hotpath().unwrap_or_else(|e| panic!("{e}"));
    let show = |args: &[&str]| {
        let out = Command::new(&hotpath)
            .arg("cache")
            .args(args)
            .arg("--cache-dir")
            .arg(&cache)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = show(&[]);
    assert!(
        text.contains(&format!("files             {}", store_files(&cache).len())),
        "{text}"
    );
    let line = text.lines().find(|l| l.starts_with("blocks")).unwrap();
    let hits: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(hits > 0, "{text}");
    show(&["clear"]);
    assert!(store_files(&cache).is_empty());
    assert!(show(&[]).contains("files             0"));
}

/// A loop of forks on a cold cache: the first child translates the code only children run
/// and stores it at its exit; every later child finds it there (the store reads a module's
/// file again after a miss when another process has written it since), so it places every
/// block and writes nothing.
#[test]
fn later_children_of_a_fork_loop_find_the_first_ones_blocks() {
    let exe = guest_build::build("fork_loop.c", Linkage::Dynamic).unwrap_or_else(|e| panic!("{e}"));
    let dir = scratch("fork-loop");
    let cache = dir.join("cache");
    let n = native(&exe, &[], &dir);
    let images = run_images(&exe, &[], &cache, &[], &n, &dir);
    assert_eq!(images.len(), 9, "the parent and its 8 children");
    for (name, r) in &images[2..] {
        let (loaded, translated) = (
            as_u64(&r["totals"]["blocks_loaded"]),
            as_u64(&r["totals"]["blocks_translated"]),
        );
        assert!(
            translated > 0 && loaded == translated,
            "child {name}: placed {loaded} of {translated} blocks from the cache"
        );
    }
}
