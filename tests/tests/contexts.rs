//! Calling contexts kept by translated code (`--guest-contexts`, #21 stage 1): the counts the
//! summary line gives, derived by hand from guest samples' sources. (That every sample behaves
//! as natively with contexts on is `samples.rs`'s `--guest-contexts` mode.)

use std::path::Path;
use std::process::Command;

use hotpath_contexts::{Contexts, Functions, Resync};
use hotpath_e2e::{guest_build, hotpath_bin, runner, Linkage};

/// Runs `cmd` (a hotpath run), which must exit 0; its outcome.
fn run_to_exit_0(cmd: &mut Command) -> runner::Outcome {
    let what = runner::describe(cmd);
    let outcome =
        runner::run(cmd, hotpath_e2e::run_timeout()).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        matches!(outcome.termination, runner::Termination::Exited(0)),
        "{what}: {:?}\n{}",
        outcome.termination,
        String::from_utf8_lossy(&outcome.stderr)
    );
    outcome
}

/// `(contexts made, context steps through the runtime, resynchronisations)` from the summary
/// line of `hotpath run --guest-contexts extra... -- exe`, which must exit 0.
fn contexts_line(exe: &Path, extra: &[&str]) -> (u64, u64, u64) {
    contexts_line_of(exe, &[], extra)
}

/// [`contexts_line`] for `exe args`.
fn contexts_line_of(exe: &Path, args: &[&str], extra: &[&str]) -> (u64, u64, u64) {
    let hotpath =
        hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary to test: {e}"));
    let mut cmd = Command::new(&hotpath);
    cmd.arg("run")
        .arg("--guest-contexts")
        .args(extra)
        .arg("--")
        .arg(exe)
        .args(args);
    hotpath_e2e::set_guest_environment(&mut cmd, exe.parent().unwrap_or(Path::new("/")));
    let what = runner::describe(&cmd);
    let outcome = run_to_exit_0(&mut cmd);
    let stderr = String::from_utf8_lossy(&outcome.stderr);
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("hotpath: calling contexts: "))
        .unwrap_or_else(|| panic!("{what}: no contexts line in\n{stderr}"));
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect();
    assert_eq!(n.len(), 3, "{what}: {line}");
    (n[0], n[1], n[2])
}

/// count_calls.S: `_start` (the root context: nothing called it) calls f_one, f_two and f_three
/// indirectly, 600 times in the order 1 2 1 3 1 2, and each calls `leaf`: six contexts (three
/// under the root, one `leaf` under each). The root's four indirect-call cache entries keep all
/// three callees once each has been called (no two of them evict each other: an entry is free
/// for each), so only the first call of each misses; each f's first call of `leaf` misses too:
/// 6 steps through the runtime. (With one indirect entry, which held only the last callee,
/// every one of the 600 calls missed, the order 1 2 1 3 1 2 never repeating a callee: 603.)
/// Every `ret` returns to its frame: no resynchronisation.
#[test]
fn count_calls_contexts_are_counted_by_hand() {
    for linkage in [Linkage::Static, Linkage::StaticPie] {
        let exe = guest_build::build("count_calls.S", linkage)
            .unwrap_or_else(|e| panic!("building count_calls.S: {e}"));
        for extra in [&["--no-monitor"][..], &["--superblock-threshold", "1"][..]] {
            assert_eq!(
                contexts_line(&exe, extra),
                (6, 6, 0),
                "{linkage:?} {extra:?}"
            );
        }
    }
}

/// No ELF function symbols (asm_retaddr.S's labels are not `STT_FUNC`): a function is entered
/// where it is reached.
struct NoSymbols;
impl Functions for NoSymbols {
    fn containing(&self, addr: u64) -> u64 {
        addr
    }
}

/// asm_retaddr.S, 3000 rounds of eight return-address checks from `_start`, replayed on the
/// calling-context runtime (`hotpath_contexts`, itself checked against a reference model of
/// the rules): translated code must end with as many contexts and resynchronisations. Per
/// round, two `ret`s go where no frame returns — check 3's callee overwrites its return
/// address, check 4 is `push; ret` used as a jump — orphan returns, which keep the frames; and
/// check 5's callee returns with `pop; jmp *reg` to its frame's return address, a jump return:
/// 9000 resynchronisations. The get-pc `call` of check 2 is no call (no frame, no context).
/// The orphan returns leave check 3's frame on the stack and the context one level deeper
/// each round, until the 1000-deep recursion of check 8 and then everything folds into the
/// `[deeper]` context.
#[test]
fn asm_retaddr_contexts_match_the_runtime_replaying_its_calls() {
    let mut c = Contexts::new_owned().expect("contexts");
    let (rra, rr, l3, l4, pj, sum, rec) = (1u64, 2, 3, 4, 5, 6, 7);
    let (after_1, jmp_fail, after_5, after_6a, after_6b, after_7, after_8, after_rec) =
        (11u64, 12, 15, 16, 17, 18, 19, 20);
    for _ in 0..3000 {
        c.call(rra, after_1);
        c.ret(after_1, &NoSymbols);
        c.call(rr, jmp_fail);
        c.ret(l3, &NoSymbols);
        c.ret(l4, &NoSymbols);
        c.call(pj, after_5);
        c.jump(after_5);
        c.call_indirect(rra, after_6a);
        c.ret(after_6a, &NoSymbols);
        c.call_indirect(rra, after_6b);
        c.ret(after_6b, &NoSymbols);
        c.call(sum, after_7);
        c.ret(after_7, &NoSymbols);
        c.call(rec, after_8);
        for _ in 0..1000 {
            c.call(rec, after_rec);
        }
        for _ in 0..1000 {
            c.ret(after_rec, &NoSymbols);
        }
        c.ret(after_8, &NoSymbols);
    }
    let expected = (c.len() as u64 - 1, c.resyncs.iter().sum::<u64>());
    assert_eq!(expected.1, 9000);
    for linkage in [Linkage::Static, Linkage::StaticPie] {
        let exe = guest_build::build("asm_retaddr.S", linkage)
            .unwrap_or_else(|e| panic!("building asm_retaddr.S: {e}"));
        for extra in [&["--no-monitor"][..], &["--superblock-threshold", "1"][..]] {
            let (made, _, resyncs) = contexts_line(&exe, extra);
            assert_eq!((made, resyncs), expected, "{linkage:?} {extra:?}");
        }
        // The path profile follows the guest's context events: the same resynchronisations,
        // cause by cause.
        let report = exe.with_extension("contexts.json");
        let report_arg = report.to_str().expect("a UTF-8 path");
        let extra = [
            "--paths",
            "--report",
            report_arg,
            "--superblock-threshold",
            "1",
        ];
        let (made, _, resyncs) = contexts_line(&exe, &extra);
        assert_eq!((made, resyncs), expected, "{linkage:?} {extra:?}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).expect("the report"))
                .expect("JSON");
        let stats = &json["path_profile"]["stats"];
        for why in Resync::ALL {
            assert_eq!(
                stats["resyncs_by_cause"][why.name()].as_u64(),
                Some(c.resyncs[why as usize]),
                "{linkage:?}: {why:?} in {stats}"
            );
        }
    }
}

/// The guest's contexts resynchronise exactly where the monitor's shadow stack does by its own
/// rules, on real programs whose only resynchronisations are tail calls (busybox sort's, a
/// comparison's tail call, 40 000 times; md5sum's one, at the end of the file, where
/// `common64_end` tail-calls the block function through a register after it has been called
/// 1700 times and its entry heads a superblock) and plain returns: the summary line's count of
/// a `--guest-contexts` run equals the path profile's of a `--no-guest-contexts` run, with
/// superblocks (which end at function entries while contexts are kept; with a 4096-entry ring,
/// so that the monitor keeps up and builds them early) and without. The first
/// run's own profile, which follows the guest's context events, counts the same: every event
/// reached the monitor. (md5sum's tail call was lost whenever its target's superblock was
/// built before it — when the monitor kept up, which a smaller ring makes certain: the
/// superblock had taken the lookup table's slot from the entry's jump entry.)
#[test]
fn busybox_tail_calls_match_the_monitors_shadow_stack() {
    use std::fmt::Write as _;
    let Some(busybox) = hotpath_e2e::busybox() else {
        return;
    };
    let dir = hotpath_e2e::paths::scratch_dir("contexts");
    let mut rng = hotpath_e2e::inputs::Rng(0x5eed_c0de_0000_0021);
    let mut text = String::new();
    while text.len() < 200_000 {
        let w = hotpath_e2e::inputs::WORDS;
        let _ = writeln!(
            text,
            "{} {} {}",
            w[rng.below(w.len() as u64) as usize],
            rng.below(1_000_000),
            w[rng.below(w.len() as u64) as usize]
        );
    }
    let input = dir.join("words.txt");
    std::fs::write(&input, &text).expect("writing the input");
    let input = input.to_str().expect("a UTF-8 path");
    for applet in [&["sort", input][..], &["md5sum", input][..]] {
        for extra in [&["--no-superblocks"][..], &["--ring-entries", "4096"][..]] {
            let report = dir.join(format!("{}.json", applet[0]));
            let report_arg = report.to_str().expect("a UTF-8 path");
            let mut all = vec!["--paths", "--report", report_arg];
            all.extend_from_slice(extra);
            let (_, _, resyncs) = contexts_line_of(busybox, applet, &all);
            let followed = tail_calls_of(&report, applet);
            // The monitor's own rules: the same run without guest contexts.
            let mut cmd = Command::new(hotpath_bin::hotpath().expect("hotpath"));
            cmd.arg("run")
                .arg("--quiet")
                .arg("--no-guest-contexts")
                .args(&all)
                .arg("--")
                .arg(busybox)
                .args(applet);
            hotpath_e2e::set_guest_environment(
                &mut cmd,
                busybox.parent().unwrap_or(Path::new("/")),
            );
            run_to_exit_0(&mut cmd);
            let own = tail_calls_of(&report, applet);
            assert!(own > 0, "{applet:?} {extra:?}: no tail call seen");
            assert_eq!(
                resyncs, own,
                "{applet:?} {extra:?}: the guest's and the monitor's"
            );
            assert_eq!(
                followed, own,
                "{applet:?} {extra:?}: the guest's, as followed"
            );
        }
    }
}

/// The resynchronisations of the path profile in `report`, which must all be tail calls.
fn tail_calls_of(report: &Path, applet: &[&str]) -> u64 {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report).expect("the report")).expect("JSON");
    let stats = &json["path_profile"]["stats"];
    let monitor = stats["shadow_stack_resyncs"].as_u64().expect("resyncs");
    assert_eq!(
        stats["resyncs_by_cause"]["tail_call"].as_u64(),
        Some(monitor),
        "{applet:?}: resynchronised for more than tail calls: {stats}"
    );
    monitor
}

/// The guest's contexts are the program's, not the run's: with superblocks formed as early as
/// possible and a 256-entry ring, whose laps end at thousands of side exits (whose slow paths
/// the dispatcher then takes: returns, jumps to function entries), every sample makes the same
/// contexts and resynchronisations as without superblocks, and the path profile that follows
/// them is the same, section by section. (A side exit's `ret` made by the dispatcher once
/// skipped the return's context step: frames leaked whenever the ring happened to be full
/// there — funcptr_qsort made 793 contexts instead of 285 with this ring. And a superblock
/// headed by a function entry once took the lookup table's slot from the entry's jump entry:
/// contexts_tail_call.S's tail calls through a register went unseen until `work`'s loop came
/// back through the jump entry, which then counted them, one block late — the same counts, a
/// different call tree. A smaller ring makes the guest wait for the monitor so often that, on
/// a loaded machine, a run takes minutes.)
#[test]
fn contexts_do_not_depend_on_superblocks_or_the_ring() {
    let dir = hotpath_e2e::paths::scratch_dir("contexts-superblocks");
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
        let profile_of = |extra: &[&str]| {
            let report = dir.join(format!("{source}.json"));
            let mut all = vec![
                "--paths",
                "--report",
                report.to_str().expect("a UTF-8 path"),
            ];
            all.extend_from_slice(extra);
            let line = contexts_line(&exe, &all);
            let json: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&report).expect("the report"))
                    .expect("JSON");
            (line, json["path_profile"].clone())
        };
        let ((made, _, resyncs), profile) = profile_of(&["--no-superblocks"]);
        assert!(profile.is_object(), "{source}: no path profile");
        let fast = ["--superblock-threshold", "1", "--ring-entries", "256"];
        let (m, _, r) = contexts_line(&exe, &fast);
        assert_eq!((m, r), (made, resyncs), "{source} {fast:?}");
        let ((m, _, r), p) = profile_of(&fast);
        assert_eq!((m, r), (made, resyncs), "{source} {fast:?} --paths");
        for (section, want) in profile.as_object().expect("an object") {
            assert_eq!(
                &p[section], want,
                "{source} {fast:?}: path profile's {section}"
            );
        }
    }
}

/// contexts_tail_call.S: `work` is called 3000 times and loops ten times a call (a block a
/// round, then its `ret` block); `tail_indirect` (two instructions) and `tail_direct` (one)
/// run 1000 times each and tail-call it, so that it returns for them. The call tree, with and
/// without superblocks (`work`'s entry heads one before the first tail call): `work` under
/// `_start` with 3000 × 11 blocks and 3000 × (10 × 3 + 1) instructions, each tail caller
/// under `_start` with its own block, and the rest `_start`'s; three contexts, 2000 tail calls.
#[test]
fn tail_calls_into_a_superblock_head_are_counted_by_hand() {
    let exe = guest_build::build("contexts_tail_call.S", Linkage::Static)
        .unwrap_or_else(|e| panic!("building contexts_tail_call.S: {e}"));
    let report = exe.with_extension("tail.json");
    let report_arg = report.to_str().expect("a UTF-8 path");
    for extra in [
        &["--no-superblocks"][..],
        &["--superblock-threshold", "1"][..],
    ] {
        let mut all = vec!["--paths", "--report", report_arg];
        all.extend_from_slice(extra);
        let (made, _, resyncs) = contexts_line(&exe, &all);
        assert_eq!((made, resyncs), (3, 2000), "{extra:?}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).expect("the report"))
                .expect("JSON");
        let mut stacks: Vec<(String, u64, u64)> = json["path_profile"]["stacks"]
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
        let total = |k: &str| json["totals"][k].as_u64().expect("a total");
        let (blocks, instructions) = (total("blocks_executed"), total("guest_instructions"));
        let own = (blocks - 35_000, instructions - 96_000);
        assert_eq!(
            stacks,
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

/// paths_vsyscall.S: `f` calls the vsyscall page's `time`, which runs no translated block (the
/// runtime carries it out and returns). The guest's contexts are `_start`'s, f under it and the
/// vsyscall entry under f; the path profile's call tree has `_start`'s activation and f under
/// it, with f's two blocks per round (1000 rounds) — the monitor, which saw the call but no
/// callee block, is told of the return by a context event (without it, every round left an
/// activation behind and the tree grew a level per round).
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
    let report = exe.with_extension("vsyscall.json");
    let report_arg = report.to_str().expect("a UTF-8 path");
    assert_eq!(
        contexts_line(&exe, &["--paths", "--report", report_arg]),
        (2, 2, 0)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("the report")).expect("JSON");
    let mut stacks: Vec<(usize, u64)> = json["path_profile"]["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .map(|s| {
            let frames = s["stack"].as_str().expect("a stack").split(';').count();
            (frames, s["blocks"].as_u64().expect("blocks"))
        })
        .collect();
    stacks.sort_unstable();
    // _start: its first block (`mov`, `call f`), `dec; jnz` 1000 times, `call f` alone 999
    // times, the exit block; f: two blocks a round.
    assert_eq!(stacks, [(1, 2001), (2, 2000)]);
}

/// Where the guest's rules and the shadow stack's own agree — asm_retaddr.S (orphan and jump
/// returns, the get-pc call, deep recursion) and paths_jump_return.S (`pop; jmp *reg`
/// returns) — the path profile that follows the guest's context events is the one the shadow
/// stack's own rules give: paths, functions, call stacks and resynchronisation counts, section
/// by section. (The profile's consistency with itself, and the two recorders' agreement, hold
/// however the events are followed; this is what checks that they are followed right.)
#[test]
fn followed_contexts_give_the_profile_of_the_shadow_stacks_own_rules() {
    let hotpath = hotpath_bin::hotpath().expect("hotpath");
    let dir = hotpath_e2e::paths::scratch_dir("contexts-own-rules");
    for source in ["asm_retaddr.S", "paths_jump_return.S"] {
        let exe = guest_build::build(source, Linkage::Static)
            .unwrap_or_else(|e| panic!("building {source}: {e}"));
        let profiles: Vec<serde_json::Value> = [&[][..], &["--no-guest-contexts"][..]]
            .iter()
            .enumerate()
            .map(|(i, extra)| {
                let report = dir.join(format!("{source}.{i}.json"));
                let mut cmd = Command::new(&hotpath);
                cmd.args(["run", "--quiet", "--paths", "--superblock-threshold", "1"])
                    .arg("--report")
                    .arg(&report)
                    .args(*extra)
                    .arg("--")
                    .arg(&exe);
                run_to_exit_0(&mut cmd);
                let text = std::fs::read_to_string(&report).expect("the report");
                serde_json::from_str::<serde_json::Value>(&text).expect("JSON")["path_profile"]
                    .clone()
            })
            .collect();
        for section in ["paths", "functions", "stacks", "stats"] {
            assert!(
                profiles[0][section] == profiles[1][section],
                "{source}: `{section}` differs between the followed contexts and the own rules"
            );
        }
    }
}
