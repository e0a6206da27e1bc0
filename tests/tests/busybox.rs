//! busybox-static (`/bin/busybox`, a real glibc-static program of ~2 MiB) under hotpath: the
//! shell and applets run on inputs generated here (deterministic, a few hundred KiB) must
//! produce the same stdout, stderr and exit status as natively, with the monitor off and on.
//! And Ctrl-C: SIGINT ends `hotpath run -- busybox sleep 5` as it ends `busybox sleep 5`.
//!
//! `sh -c` pipelines: busybox's shell runs its builtins, loops and subshells itself (forked
//! children stay under translation), but it execs other commands; hotpath runs an exec'd
//! program natively, so in `busybox tar cf - d | busybox tar tf -` only the shell is translated.
//! The applets themselves are translated when run directly (`sort`, `gzip -c`, ...).
//!
//! Without `/bin/busybox` the tests print SKIPPED and return, except under CI (`CI=true`),
//! where busybox is installed by `.ci/setup` and its absence is a failure.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hotpath_e2e::{busybox, compare_with_native, hotpath_bin, paths, Termination};

use hotpath_e2e::inputs::{Rng, WORDS};

/// Lines of `word number word+suffix filler`: about `bytes` bytes of sortable, awk-able text.
fn text(rng: &mut Rng, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 100);
    while s.len() < bytes {
        let w1 = WORDS[rng.below(WORDS.len() as u64) as usize];
        let w2 = WORDS[rng.below(WORDS.len() as u64) as usize];
        let _ = writeln!(
            s,
            "{w1} {} {w2}{} {}",
            rng.below(1_000_000),
            rng.below(100),
            "x".repeat(rng.below(24) as usize)
        );
    }
    s
}

/// The scratch directory with the generated inputs, made once per test process:
/// - `input.txt`: ~300 KiB of text lines;
/// - `binary.bin`: 64 KiB of pseudo-random bytes;
/// - `tree/`: a directory tree, 3 levels, 5 subdirectories each, ~150 files of 0–6 KiB.
fn inputs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = paths::scratch_dir("busybox");
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        fs::write(dir.join("input.txt"), text(&mut rng, 300 * 1024)).expect("write input.txt");
        let binary: Vec<u8> = (0..64 * 1024).map(|_| rng.next() as u8).collect();
        fs::write(dir.join("binary.bin"), binary).expect("write binary.bin");
        make_tree(&dir.join("tree"), &mut rng, 3);
        dir
    })
}

fn make_tree(dir: &Path, rng: &mut Rng, depth: u32) {
    fs::create_dir_all(dir).expect("create tree dir");
    for i in 0..(2 + rng.below(4)) {
        let ext = ["txt", "log", "dat"][rng.below(3) as usize];
        let size = rng.below(6 * 1024) as usize;
        fs::write(dir.join(format!("file{i}.{ext}")), text(rng, size)).expect("write tree file");
    }
    if depth > 0 {
        for d in 0..5 {
            make_tree(&dir.join(format!("dir{d}")), rng, depth - 1);
        }
    }
}

/// Runs `busybox args...` in the inputs directory natively and under hotpath, compares, and
/// checks the native run ended as `want` (so a broken test input is not mistaken for success).
fn check(args: &[&str], want: Termination) {
    let Some(busybox) = busybox() else { return };
    let (native, verdict) = compare_with_native(busybox, args, inputs());
    assert_eq!(
        native.termination,
        want,
        "native `busybox {}` ended unexpectedly; stderr: {}",
        args.join(" "),
        String::from_utf8_lossy(&native.stderr)
    );
    assert!(
        !native.stdout.is_empty() || !native.stderr.is_empty() || want != Termination::Exited(0),
        "native `busybox {}` printed nothing: the test input is wrong",
        args.join(" ")
    );
    if let Err(report) = verdict {
        panic!("busybox {}:{report}", args.join(" "));
    }
}

#[test]
fn sh_loops_pipelines_and_subshells() {
    check(
        &[
            "sh",
            "-c",
            r#"
            for i in 1 2 3 4 5 6 7 8; do echo "line $i"; done | while read a b; do echo "$b:$a"; done
            (cd tree && echo "subshell in ${PWD##*/}"; exit 3); echo "subshell status $?"
            x=$( (echo out; echo err >&2) 2>&1 ); echo "captured [$x]"
            i=0; s=0; while [ $i -lt 3000 ]; do i=$((i + 1)); s=$((s + i * i % 7)); done; echo "sum $s"
            case "$s" in *[!0-9]*) echo "not a number";; *) echo "a number";; esac
            f() { local n=$1; [ "$n" -le 1 ] && { echo 1; return; }; echo $((n * $(f $((n - 1))))); }
            echo "5! = $(f 5)"
            set -- a "b c" d; echo "$# args, second [$2]"
            printf '%s-%05d\n' pad 42
            echo "to stderr" >&2
            false || echo "false failed as it should"
            exit 4
            "#,
        ],
        Termination::Exited(4),
    );
}

#[test]
fn sh_pipeline_of_applets() {
    check(
        &[
            "sh",
            "-c",
            "busybox cat input.txt | busybox grep -c beta; \
             busybox grep gamma input.txt | busybox cut -d' ' -f2 | busybox sort -n | busybox tail -3",
        ],
        Termination::Exited(0),
    );
}

#[test]
fn sort() {
    check(&["sort", "input.txt"], Termination::Exited(0));
    check(&["sort", "-n", "-k2", "input.txt"], Termination::Exited(0));
    check(
        &["sort", "-u", "-r", "-k1,1", "input.txt"],
        Termination::Exited(0),
    );
}

#[test]
fn md5sum() {
    check(
        &["md5sum", "input.txt", "binary.bin"],
        Termination::Exited(0),
    );
}

#[test]
fn awk() {
    check(
        &[
            "awk",
            r#"{ n[$1]++; s += $2; if (length($4) > m) m = length($4) }
               END { for (w in n) t += n[w]; printf "%d lines, %d words, sum %d, longest %d\n", NR, t, s, m;
                     printf "%.3f\n", s / NR; print toupper(substr($1, 1, 3)) }"#,
            "input.txt",
        ],
        Termination::Exited(0),
    );
}

#[test]
fn sed() {
    check(
        &[
            "sed",
            "-e",
            "s/alpha/ALPHA/g",
            "-e",
            "/^beta/d",
            "-e",
            "s/\\([a-z]*\\) \\([0-9]*\\)/\\2 \\1/",
            "-e",
            "$!N;s/\\n/ | /",
            "input.txt",
        ],
        Termination::Exited(0),
    );
}

#[test]
fn wc() {
    check(&["wc", "input.txt", "binary.bin"], Termination::Exited(0));
}

#[test]
fn find() {
    check(&["find", "tree"], Termination::Exited(0));
    check(
        &[
            "find", "tree", "-name", "*.txt", "-size", "+2k", "-type", "f",
        ],
        Termination::Exited(0),
    );
}

#[test]
fn tar_create_then_list() {
    check(
        &["sh", "-c", "busybox tar cf - tree | busybox tar tf -"],
        Termination::Exited(0),
    );
}

#[test]
fn gzip_then_gunzip() {
    check(
        &[
            "sh",
            "-c",
            "busybox gzip -c input.txt | busybox gunzip -c | busybox md5sum; busybox md5sum < input.txt",
        ],
        Termination::Exited(0),
    );
    // The applets themselves translated: compressed bytes compared as they are.
    check(&["gzip", "-c", "-9", "input.txt"], Termination::Exited(0));
}

#[test]
fn failing_applets_keep_their_status_and_message() {
    check(&["cat", "no-such-file"], Termination::Exited(1));
    check(&["sh", "-c", "exit 77"], Termination::Exited(77));
    check(
        &["sh", "-c", "kill -TERM $$"],
        Termination::Signaled(libc::SIGTERM),
    );
}

/// How long after SIGINT a sleeping process must be gone: it is blocked in nanosleep, so
/// natively this takes microseconds; the margin is for a loaded machine.
const SIGINT_DEADLINE: Duration = Duration::from_secs(1);

/// Spawns `cmd` (with SIGINT at its default action, `default_terminal_signals`), waits
/// `settle`, sends SIGINT, and returns how the process ended and how long after the signal.
fn interrupt(mut cmd: Command, settle: Duration) -> (Termination, Duration) {
    hotpath_e2e::default_terminal_signals(&mut cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    std::thread::sleep(settle);
    let sent = Instant::now();
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let r = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(r, 0, "kill: {}", std::io::Error::last_os_error());
    let deadline = sent + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let elapsed = sent.elapsed();
            use std::os::unix::process::ExitStatusExt;
            let termination = match (status.code(), status.signal()) {
                (Some(code), _) => Termination::Exited(code),
                (None, Some(sig)) => Termination::Signaled(sig),
                _ => Termination::Exited(-1),
            };
            return (termination, elapsed);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return (
                Termination::TimedOut(Duration::from_secs(10)),
                sent.elapsed(),
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn ctrl_c_ends_busybox_sleep_as_natively() {
    let Some(busybox) = busybox() else { return };
    let hotpath =
        hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary to test: {e}"));
    let mut native = Command::new(busybox);
    native.args(["sleep", "5"]);
    let (native_end, native_after) = interrupt(native, Duration::from_millis(300));
    assert_eq!(
        native_end,
        Termination::Signaled(libc::SIGINT),
        "native busybox sleep 5 after SIGINT"
    );
    for quiet in [true, false] {
        let mut translated = Command::new(&hotpath);
        translated.arg("run");
        if quiet {
            translated.arg("--quiet");
        }
        translated.arg("--").arg(busybox).args(["sleep", "5"]);
        let (end, after) = interrupt(translated, Duration::from_millis(500));
        assert_eq!(
            end, native_end,
            "hotpath run{} -- busybox sleep 5 after SIGINT (native: {native_end} after {native_after:?})",
            if quiet { " --quiet" } else { "" }
        );
        assert!(
            after < SIGINT_DEADLINE,
            "hotpath took {after:?} to die of SIGINT (native {native_after:?}); limit {SIGINT_DEADLINE:?}"
        );
    }
}

/// Runs `args` under hotpath (its summary on, `--top 1`) in `dir`; returns its stdout and
/// stderr.
fn run_with_summary(args: &[&str], dir: &Path) -> (String, String) {
    let hotpath = hotpath_bin::hotpath().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(hotpath)
        .args(["run", "--top", "1", "--"])
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run hotpath");
    assert!(out.status.success(), "{args:?}: {:?}", out.status);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// hotpath's summary goes to the stderr hotpath started with, not to what the guest made of
/// its descriptor 2: a shell's `exec 2>log` leaves the guest's file as natively (before, the
/// summary was appended to it), and a program that closes its stderr at exit (GNU `date`,
/// `ls`: `close_stdout`) still gets a summary.
#[test]
fn the_summary_goes_to_hotpaths_stderr_not_the_guests() {
    let Some(bb) = busybox() else { return };
    let bb = bb.to_str().expect("a UTF-8 path");
    let dir = paths::scratch_dir("busybox-stderr");
    // The shell's own summary, and the summary of a program it execs with that stderr
    // (passed the kept copy with `--messages-fd`), both go to hotpath's stderr.
    let script = format!("exec 2>log; echo guest line >&2; {bb} echo exec line >&2; echo out");
    let (out, err) = run_with_summary(&[bb, "sh", "-c", &script], &dir);
    assert_eq!(out, "out\n");
    assert_eq!(
        fs::read_to_string(dir.join("log")).expect("the guest's log"),
        "guest line\nexec line\n",
        "the guest's own file holds only what the guest wrote"
    );
    let summaries = err.matches(" ring events").count();
    assert_eq!(
        summaries, 2,
        "the shell's and the exec'd echo's summaries: {err:?}"
    );
    let date = Path::new("/bin/date");
    if date.exists() {
        let (out, err) = run_with_summary(&["/bin/date", "+%Y"], &dir);
        assert_eq!(out.trim().len(), 4, "{out:?}");
        assert!(
            err.contains("hotpath: ") && err.contains("blocks"),
            "no summary after the guest closed its stderr: {err:?}"
        );
    }
}
