//! Calling contexts as the monitor's shadow stack makes them from the blocks alone (the events
//! the tables see; `monitor/src/paths/stack.rs` states the rules): the call trees and the
//! resynchronisations by cause of guest samples, derived by hand from their sources, and their
//! independence from when superblocks come.

use std::path::{Path, PathBuf};
use std::process::Command;

use hotpath_e2e::{guest_build, hotpath_bin, runner, Linkage};
use serde_json::Value;

/// Runs `hotpath run --quiet --paths --call-tree --report R extra... -- exe`, which must exit 0,
/// and returns its report.
fn paths_report(exe: &Path, tag: &str, extra: &[&str]) -> Value {
    let hotpath =
        hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary to test: {e}"));
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    // Made (emptied) once: the tests run at once and write side by side.
    let dir = DIR.get_or_init(|| hotpath_e2e::paths::scratch_dir("contexts"));
    let report = dir.join(format!("{tag}.json"));
    let mut cmd = Command::new(&hotpath);
    // The contexts are what these tests check: the call tree is asked for.
    cmd.args(["run", "--quiet", "--paths", "--call-tree", "--report"])
        .arg(&report)
        .args(extra)
        .arg("--")
        .arg(exe);
    hotpath_e2e::set_guest_environment(&mut cmd, exe.parent().unwrap_or(Path::new("/")));
    let what = runner::describe(&cmd);
    let outcome =
        runner::run(&mut cmd, hotpath_e2e::run_timeout()).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        matches!(outcome.termination, runner::Termination::Exited(0)),
        "{what}: {:?}\n{}",
        outcome.termination,
        String::from_utf8_lossy(&outcome.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&report).expect("the report")).expect("JSON")
}

/// The resynchronisations of `report`'s path profile by cause, the causes that occurred only.
fn resyncs(report: &Value) -> Vec<(String, u64)> {
    let mut by_cause: Vec<(String, u64)> = report["path_profile"]["stats"]["resyncs_by_cause"]
        .as_object()
        .expect("resyncs by cause")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().expect("a count")))
        .filter(|&(_, n)| n > 0)
        .collect();
    by_cause.sort();
    by_cause
}

/// `report`'s call stacks below the outermost frame, with their blocks and instructions,
/// sorted.
fn stacks(report: &Value) -> Vec<(String, u64, u64)> {
    let mut stacks: Vec<(String, u64, u64)> = report["path_profile"]["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .map(|s| {
            let frames: Vec<&str> = s["stack"].as_str().expect("a stack").split(';').collect();
            let count = |k: &str| s[k].as_u64().expect("a count");
            (
                frames[1..].join(";"),
                count("blocks"),
                count("instructions"),
            )
        })
        .collect();
    stacks.sort_unstable();
    stacks
}

/// Without superblocks, and with them formed at once and a small ring (so that side exits and
/// full laps come everywhere).
const MODES: [&[&str]; 2] = [
    &["--no-superblocks"],
    &["--superblock-threshold", "1", "--ring-entries", "256"],
];

fn c(cause: &str, n: u64) -> (String, u64) {
    (cause.to_string(), n)
}

/// count_calls.S: every `ret` returns to its frame, and the labels the sample's blocks start at
/// are function symbols that only jumps reach, so none of those jumps is a tail call (a jump is
/// one only into an entry a call has reached): no resynchronisation. (The call tree itself is
/// `paths.rs`'s `call_stacks_follow_the_source`.)
#[test]
fn count_calls_resynchronises_nowhere() {
    for linkage in [Linkage::Static, Linkage::StaticPie] {
        let exe = guest_build::build("count_calls.S", linkage)
            .unwrap_or_else(|e| panic!("building count_calls.S: {e}"));
        for (m, extra) in MODES.iter().enumerate() {
            let r = paths_report(&exe, &format!("count_calls-{linkage:?}-{m}"), extra);
            assert_eq!(resyncs(&r), [], "{linkage:?} {extra:?}");
        }
    }
}

/// asm_retaddr.S, 3000 rounds of eight return-address checks: per round, two `ret`s go where no
/// frame returns. Check 3's callee overwrites its return address and returns into its caller
/// elsewhere: the caller's frame is below, so the callee's is popped (an unwind, as an
/// exception raised by `ret` is), but in the first round, where the caller's code at that
/// address is not known yet as its own (an orphan return); check 4 is `push; ret` used as a
/// jump within the function: an orphan return. Check 5's callee returns with `pop; jmp *reg`
/// to its frame's return address: a jump return. Nothing else (the get-pc `call` of check 2 is
/// no call; check 8's 1000-deep recursion returns frame by frame).
#[test]
fn asm_retaddr_resynchronises_as_its_source_says() {
    let exe = guest_build::build("asm_retaddr.S", Linkage::Static)
        .unwrap_or_else(|e| panic!("building asm_retaddr.S: {e}"));
    for (m, extra) in MODES.iter().enumerate() {
        let r = paths_report(&exe, &format!("asm_retaddr-{m}"), extra);
        assert_eq!(
            resyncs(&r),
            [
                c("jump_return", 3000),
                c("orphan_return", 3001),
                c("unwind", 2999)
            ],
            "{extra:?}"
        );
    }
}

/// setjmp.c (static glibc): every `longjmp` ends in `__longjmp`'s indirect jump into the
/// function that called `setjmp`, deeper in the stack: an unwind to it, popping the frames
/// above. 5 from `dive` (depth 5000) back to `main`, 6 in `nested` (each level's own jmp_buf),
/// 1 `siglongjmp`, 20 000 round trips: 20 012. The round trips' `setjmp` is `_setjmp`, which
/// jumps to `__sigsetjmp`: a tail call once a call has entered `__sigsetjmp`, which `main`'s
/// `sigsetjmp` does before the round trips and nothing does before it: 20 000. (With the
/// guest's own contexts, before #56, `main`'s code after each `longjmp` stayed in `longjmp`'s
/// context.) No frame is ever returned to past the top one.
#[test]
fn setjmp_unwinds_once_per_longjmp() {
    for linkage in [Linkage::Static, Linkage::StaticPie] {
        let exe = guest_build::build("setjmp.c", linkage)
            .unwrap_or_else(|e| panic!("building setjmp.c: {e}"));
        for (m, extra) in MODES.iter().enumerate() {
            let r = paths_report(&exe, &format!("setjmp-{linkage:?}-{m}"), extra);
            let by_cause: Vec<(String, u64)> = resyncs(&r)
                .into_iter()
                .filter(|(cause, _)| cause != "foreign_jump")
                .collect();
            assert_eq!(
                by_cause,
                [c("tail_call", 20_000), c("unwind", 20_012)],
                "{linkage:?} {extra:?}"
            );
            // Each longjmp leaves `main` where it was: no context has `main` twice (as one
            // would where the frames a longjmp skips stayed on the stack).
            for (stack, _, _) in stacks(&r) {
                assert!(
                    stack.split(';').filter(|&f| f == "main").count() <= 1,
                    "{linkage:?} {extra:?}: main twice in {stack}"
                );
            }
        }
    }
}

/// contexts_tail_call.S: `work` is called 3000 times and loops ten times a call (a block a
/// round, then its `ret` block); `tail_indirect` (two instructions) and `tail_direct` (one)
/// run 1000 times each and tail-call it, so that it returns for them. The call tree, with and
/// without superblocks (`work`'s entry heads one before the first tail call): `work` under
/// `_start` with 3000 × 11 blocks and 3000 × (10 × 3 + 1) instructions, each tail caller
/// under `_start` with its own block, and the rest `_start`'s; 2000 tail calls.
#[test]
fn tail_calls_into_a_superblock_head_are_counted_by_hand() {
    let exe = guest_build::build("contexts_tail_call.S", Linkage::Static)
        .unwrap_or_else(|e| panic!("building contexts_tail_call.S: {e}"));
    for (m, extra) in MODES.iter().enumerate() {
        let r = paths_report(&exe, &format!("tail_call-{m}"), extra);
        assert_eq!(resyncs(&r), [c("tail_call", 2000)], "{extra:?}");
        let total = |k: &str| r["totals"][k].as_u64().expect("a total");
        let (blocks, instructions) = (total("blocks_executed"), total("guest_instructions"));
        let own = (blocks - 35_000, instructions - 96_000);
        assert_eq!(
            stacks(&r),
            [
                (String::new(), own.0, own.1),
                ("tail_direct".to_string(), 1000, 1000),
                ("tail_indirect".to_string(), 1000, 2000),
                ("work".to_string(), 33_000, 93_000),
            ],
            "{extra:?}"
        );
    }
}

/// paths_late_entry.S: `shared` is reached first only by the jumps that end `outer_a` and
/// `outer_b` (a step of each one's paths, the block in two functions), then called, and then
/// jumped to by both again: those last 2000 jumps are tail calls, whichever function the block
/// was last seen in. By hand: `shared`'s context has its 1000 calls and 2000 tail calls (3000
/// blocks, 6000 instructions); each outer function's has its 2000 calls (a block entering its
/// loop, three more rounds, the jump: 5 blocks, 14 instructions) and the first phase's 1000
/// runs of `shared` (11000 blocks, 30000 instructions). The default recorder must count it as
/// the per-block reference does.
#[test]
fn a_jump_into_code_a_call_reaches_later_becomes_a_tail_call() {
    let exe = guest_build::build("paths_late_entry.S", Linkage::Static)
        .unwrap_or_else(|e| panic!("building paths_late_entry.S: {e}"));
    for (m, extra) in MODES
        .iter()
        .copied()
        .chain([&["--paths-recorder", "per-block"][..]])
        .enumerate()
    {
        let r = paths_report(&exe, &format!("late_entry-{m}"), extra);
        assert_eq!(resyncs(&r), [c("tail_call", 2000)], "{extra:?}");
        let below_root: Vec<(String, u64, u64)> = stacks(&r)
            .into_iter()
            .filter(|(s, _, _)| !s.is_empty())
            .map(|(s, blocks, instructions)| {
                let name = if s.starts_with("outer_") {
                    s
                } else {
                    "shared".to_string()
                };
                (name, blocks, instructions)
            })
            .collect();
        assert_eq!(
            below_root,
            [
                ("outer_a".to_string(), 11_000, 30_000),
                ("outer_b".to_string(), 11_000, 30_000),
                ("shared".to_string(), 3000, 6000),
            ],
            "{extra:?}"
        );
    }
}

/// paths_vsyscall.S: `f` calls the vsyscall page's `time`, which runs no translated block (the
/// runtime carries it out and returns): the block after the call is the call's own return
/// point, so no activation is pushed. The call tree has `_start`'s activation (its first block,
/// `dec; jnz` 1000 times, `call f` alone 999 times, the exit block: 2001 blocks) and f under it
/// with its two blocks a round (1000 rounds), and nothing resynchronises (without the rule
/// each round left an activation behind, returned past by a deeper return).
#[test]
fn a_call_the_runtime_carries_out_returns_in_the_path_profile() {
    let exe = guest_build::build("paths_vsyscall.S", Linkage::Static)
        .unwrap_or_else(|e| panic!("building paths_vsyscall.S: {e}"));
    let native = Command::new(&exe)
        .status()
        .expect("running paths_vsyscall natively");
    if !native.success() {
        eprintln!("SKIPPED (not a pass): no vsyscall page on this kernel ({native})");
        return;
    }
    for (m, extra) in MODES
        .iter()
        .copied()
        .chain([&["--paths-recorder", "per-block"][..]])
        .enumerate()
    {
        let r = paths_report(&exe, &format!("vsyscall-{m}"), extra);
        assert_eq!(resyncs(&r), [], "{extra:?}");
        let shape: Vec<(usize, u64)> = stacks(&r)
            .into_iter()
            .map(|(s, blocks, _)| (if s.is_empty() { 1 } else { 2 }, blocks))
            .collect();
        assert_eq!(shape, [(1, 2001), (2, 2000)], "{extra:?}");
    }
}

/// The contexts are the program's, not the run's: with superblocks formed as early as possible
/// and a 256-entry ring, whose laps end at thousands of side exits, every sample's path profile
/// (paths, functions, call stacks, resynchronisations) is the one it has without superblocks,
/// section by section: the shadow stack sees the blocks in the same order however the events
/// group them.
#[test]
fn contexts_do_not_depend_on_superblocks_or_the_ring() {
    for source in [
        "funcptr_qsort.c",
        "recursion.c",
        "setjmp.c",
        "asm_retaddr.S",
        "paths_jump_return.S",
        "jumptable.c",
        "malloc.c",
        "contexts_tail_call.S",
    ] {
        let exe = guest_build::build(source, Linkage::Static)
            .unwrap_or_else(|e| panic!("building {source}: {e}"));
        let profiles: Vec<Value> = MODES
            .iter()
            .enumerate()
            .map(|(m, extra)| {
                paths_report(&exe, &format!("{source}-{m}"), extra)["path_profile"].clone()
            })
            .collect();
        assert!(profiles[0].is_object(), "{source}: no path profile");
        for (section, want) in profiles[0].as_object().expect("an object") {
            assert_eq!(
                &profiles[1][section], want,
                "{source} {:?}: path profile's {section}",
                MODES[1]
            );
        }
    }
}
