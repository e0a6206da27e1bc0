//! Superblocks (DESIGN.md "Superblocks", invariant 2): they change how the event stream is
//! encoded — one event per trace run, a side-exit event when it leaves early — never the
//! profile. Each guest here runs without superblocks (`--no-superblocks`) and with a
//! superblock at every loop head as soon as its back edge is taken (`--superblock-threshold
//! 1`), and the two reports must agree on every block, edge, indirect target and system call.
//! The runs must also have used superblocks for real: entered, left by side exits, and (in
//! `superblock_fault`) ended by faults in the middle of a trace.

use std::path::{Path, PathBuf};

use hotpath_e2e::report::{
    as_u64, assert_same_execution, check_consistency, run_with_report, Report,
};
use hotpath_e2e::{busybox, guest_build, paths, Linkage, Termination};

fn scratch() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| paths::scratch_dir("superblocks"))
        .clone()
}

/// Σ entries, Σ side exits over a report's superblocks.
fn superblock_use(report: &Report) -> (u64, u64) {
    let sbs = report.json["superblocks"]
        .as_array()
        .expect("a superblocks array");
    let entries = sbs.iter().map(|s| as_u64(&s["entries"])).sum();
    let exits = sbs
        .iter()
        .flat_map(|s| s["side_exits"].as_array().cloned().unwrap_or_default())
        .map(|e| as_u64(&e["count"]))
        .sum();
    (entries, exits)
}

/// Runs `source args` both ways and compares; returns the superblock run's use of them.
fn compare(source: &str, args: &[&str], status: Termination) -> (u64, u64) {
    let exe = guest_build::build(source, Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    compare_exe(&exe, args, source, &["--superblock-threshold", "1"], status)
}

/// Runs `exe args` with `--no-superblocks` and with `sb_args`, compares the outputs and the
/// reports, and returns the superblock run's use of superblocks.
fn compare_exe(
    exe: &Path,
    args: &[&str],
    source: &str,
    sb_args: &[&str],
    status: Termination,
) -> (u64, u64) {
    let exe = exe.to_path_buf();
    let stem: String = source
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { '_' })
        .collect();
    let plain = run_with_report(
        &exe,
        args,
        &scratch(),
        &format!("{stem}_plain"),
        &["--no-superblocks"],
    );
    let eager = run_with_report(&exe, args, &scratch(), &format!("{stem}_eager"), sb_args);
    assert_eq!(
        plain.outcome.termination, status,
        "{source} without superblocks"
    );
    assert_eq!(
        eager.outcome.termination, status,
        "{source} with superblocks"
    );
    assert_eq!(
        plain.outcome.stdout, eager.outcome.stdout,
        "{source}: output with and without superblocks"
    );
    assert!(
        superblock_use(&plain.report) == (0, 0),
        "{source}: --no-superblocks formed superblocks"
    );
    check_consistency(&exe, &eager.report, source);
    assert_same_execution(
        &plain.report,
        &eager.report,
        source,
        ("--no-superblocks", "superblocks"),
    );
    superblock_use(&eager.report)
}

#[test]
fn superblocks_do_not_change_the_profile() {
    let mut entries = 0;
    let mut side_exits = 0;
    for (source, args) in [
        ("count_branches.S", &[][..]),
        ("count_jumptable.S", &[][..]),
        ("count_calls.S", &[][..]),
        ("loops.c", &[][..]),
        ("recursion.c", &[][..]),
        ("funcptr_qsort.c", &[][..]),
        // Traces ending in a jump or call through a read-only slot, which change by system
        // calls (their last block translated as a direct jump or call).
        ("constant_slots.c", &[][..]),
        // Traces ending in a `switch`'s dispatch, translated as a jump table of its own,
        // whose guest table changes by system calls.
        ("jumptable_changes.c", &[][..]),
        ("setjmp.c", &[][..]),
        ("indirect_traces.c", &[][..]),
        ("bench_sieve.c", &["300000"][..]),
        ("bench_interp.c", &["3"][..]),
        ("bench_fib.c", &["20"][..]),
    ] {
        let (e, x) = compare(source, args, Termination::Exited(0));
        entries += e;
        side_exits += x;
    }
    assert!(
        entries > 100_000,
        "superblocks were hardly entered: {entries}"
    );
    assert!(
        side_exits > 1000,
        "superblocks were hardly left early: {side_exits}"
    );
}

/// Traces through indirect calls and jumps (their usual target inlined behind a compare):
/// formed in `indirect_traces.c`'s hot loops with the default threshold (and a ring small
/// enough that the monitor sees each loop while it runs) and left by their
/// side exits when another target comes (superblocks formed at once follow whatever the
/// first runs did, so there only their exactness is checked: the profile equals a run
/// without superblocks, with a 4-entry ring on which every side exit finds the ring full and
/// the dispatcher makes the branch).
#[test]
fn traces_follow_indirect_calls_and_jumps_to_their_usual_target() {
    let exe =
        guest_build::build("indirect_traces.c", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    compare_exe(
        &exe,
        &[],
        "indirect_traces.c",
        &["--superblock-threshold", "1", "--ring-entries", "4"],
        Termination::Exited(0),
    );
    // A 64 Ki-entry ring: with the default 1 Mi entries the monitor may see a phase of
    // 40,000 iterations only after it has ended, and the traces then form after their loops
    // (1 run in 4 on a 2-vCPU Xeon VM: 5 entries of traces through indirect branches, against
    // 66,000-81,000 in 14 runs of 14 with this ring).
    let run = run_with_report(
        &exe,
        &[],
        &scratch(),
        "indirect_traces_default",
        &["--ring-entries", "65536"],
    );
    assert_eq!(run.outcome.termination, Termination::Exited(0));
    let report = &run.report.json;
    let terminators: std::collections::HashMap<&str, &str> = report["blocks"]
        .as_array()
        .expect("a blocks array")
        .iter()
        .map(|b| {
            (
                b["addr"].as_str().unwrap(),
                b["terminator"].as_str().unwrap(),
            )
        })
        .collect();
    // (entries of traces with an indirect branch inside, side exits taken at one)
    let (mut through, mut left) = (0, 0);
    for sb in report["superblocks"]
        .as_array()
        .expect("a superblocks array")
    {
        let blocks = sb["blocks"].as_array().expect("blocks");
        let inner: Vec<usize> = blocks[..blocks.len() - 1]
            .iter()
            .enumerate()
            .filter(|(_, b)| {
                matches!(
                    terminators.get(b.as_str().unwrap()),
                    Some(&"indirect_call") | Some(&"indirect_jump")
                )
            })
            .map(|(i, _)| i)
            .collect();
        if inner.is_empty() {
            continue;
        }
        through += as_u64(&sb["entries"]);
        for e in sb["side_exits"].as_array().cloned().unwrap_or_default() {
            if inner.contains(&(as_u64(&e["after"]) as usize)) {
                left += as_u64(&e["count"]);
            }
        }
    }
    assert!(
        through > 5000,
        "traces through indirect branches hardly entered: {through}"
    );
    assert!(
        left > 500,
        "their side exits at an indirect branch hardly taken: {left}"
    );
}

/// A loop that changes its path gets a superblock along its new path: `phase_change.S`'s loop
/// takes phase_a for 10,000 runs, then phase_b for 300,000. The first phase's superblock
/// leaves after phase_head on every later run; the trace headed at that exit (phase_b) takes
/// the old superblock's blocks only up to that exit and goes on along phase_b (without that,
/// it would follow phase_head's first-phase successor, leave on every run, and be re-formed:
/// `Decisions::reform`). Either way a superblock along phase_b runs to its end (a 4096-entry
/// ring makes the translator take the requests while the sample runs). The profile equals a
/// run without superblocks.
#[test]
fn a_loop_that_changes_its_path_gets_a_superblock_along_the_new_one() {
    let exe =
        guest_build::build("phase_change.S", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let ring = ["--ring-entries", "4096"];
    compare_exe(&exe, &[], "phase_change.S", &ring, Termination::Exited(0));
    let run = run_with_report(&exe, &[], &scratch(), "phase_change_paths", &ring);
    assert_eq!(run.outcome.termination, Termination::Exited(0));
    let report = &run.report.json;
    let symbols: std::collections::HashMap<&str, &str> = report["blocks"]
        .as_array()
        .expect("a blocks array")
        .iter()
        .filter_map(|b| Some((b["addr"].as_str()?, b["symbol"].as_str()?)))
        .collect();
    let along_b = report["superblocks"]
        .as_array()
        .expect("a superblocks array")
        .iter()
        .find(|sb| {
            let names: Vec<&str> = sb["blocks"]
                .as_array()
                .expect("blocks")
                .iter()
                .filter_map(|b| symbols.get(b.as_str()?).copied())
                .collect();
            names.iter().filter(|&&n| n == "phase_b").count() >= 2 && !names.contains(&"phase_a")
        })
        .unwrap_or_else(|| panic!("no superblock along phase_b: {}", report["superblocks"]));
    let (entries, completed) = (as_u64(&along_b["entries"]), as_u64(&along_b["completed"]));
    assert!(
        entries > 10_000 && completed * 100 >= entries * 99,
        "the superblock along phase_b: {along_b}"
    );
}

/// The translator takes a superblock request when the guest next goes to its head, not at its
/// next ring refill: `slow_loop.S` writes 600,000 events without superblocks (two slow blocks,
/// 300,000 times, over 100 ms), fewer than one lap of the default 1 Mi-entry ring, so a request
/// read only at a refill would never be taken (every run took 600,006 events so); the monitor
/// makes the branches to the head leave for the dispatcher (`HandlerShared::kick_at`), and
/// the loop runs in its superblock, one event per iteration, soon after its 2,000th. (At the
/// default threshold the monitor thread would start only at the lap's end; a lower one
/// starts it with the program.)
#[test]
fn a_superblock_request_is_taken_at_its_head_not_at_the_next_ring_refill() {
    let exe = guest_build::build("slow_loop.S", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let threshold = ["--superblock-threshold", "2000"];
    let run = run_with_report(&exe, &[], &scratch(), "slow_loop", &threshold);
    assert_eq!(run.outcome.termination, Termination::Exited(0));
    let events = as_u64(&run.report.json["totals"]["events"]);
    assert!(
        events < 450_000,
        "{events} ring events: the loop's superblock came late or never"
    );
}

/// An interpreter's traces go on through its dispatch from one handler to the next:
/// `bench_interp.c`'s `switch` jumps to any of 19 handlers, so the dispatch block's own counts
/// predict none and each handler's first superblock ends there, one ring event per bytecode.
/// After a given handler's superblock, though, the interpreted program mostly runs the same
/// next handler, and the monitor extends the superblock along where its own runs went
/// (`Decisions::extend`): a superblock then holds the dispatch block several times, and the
/// run takes well under one event per bytecode. The profile equals a run without
/// superblocks (a 4096-entry ring makes the translator take the requests while it runs).
#[test]
fn an_interpreters_traces_go_on_from_handler_to_handler() {
    let exe =
        guest_build::build("bench_interp.c", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let ring = ["--ring-entries", "4096"];
    compare_exe(
        &exe,
        &["300"],
        "bench_interp.c",
        &ring,
        Termination::Exited(0),
    );
    let run = run_with_report(&exe, &["300"], &scratch(), "interp_handlers", &ring);
    assert_eq!(run.outcome.termination, Termination::Exited(0));
    let stdout = String::from_utf8_lossy(&run.outcome.stdout);
    let bytecodes: u64 = stdout
        .split(", ")
        .find_map(|part| part.strip_suffix(" bytecodes executed\n"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no bytecode count in {stdout:?}"));
    let report = &run.report.json;
    let events = as_u64(&report["totals"]["events"]);
    assert!(
        events * 3 < bytecodes * 2,
        "{events} ring events for {bytecodes} bytecodes: traces end at every dispatch"
    );
    let through_dispatch = report["superblocks"]
        .as_array()
        .expect("a superblocks array")
        .iter()
        .any(|sb| {
            let blocks = sb["blocks"].as_array().expect("blocks");
            as_u64(&sb["entries"]) > 10_000
                && blocks
                    .iter()
                    .any(|b| blocks.iter().filter(|c| *c == b).count() >= 3)
        });
    assert!(
        through_dispatch,
        "no busy superblock through the dispatch from handler to handler: {}",
        report["superblocks"]
    );
}

/// Faults inside a trace: the dispatcher enqueues the side exit of the block that faulted, so
/// the blocks after it in the trace are not counted.
#[test]
fn a_fault_inside_a_superblock_ends_its_trace_there() {
    let mut mid_trace = 0;
    // Formation is timed by the monitor; a few tries make sure the loop ran in its superblock.
    for _ in 0..5 {
        let (entries, exits) = compare("superblock_fault.c", &[], Termination::Exited(0));
        if entries > 0 && exits > 0 {
            mid_trace += 1;
        }
    }
    assert!(
        mid_trace > 0,
        "the walk loop never ran in a superblock that it left early"
    );
}

/// A guest that dies of a signal while its hot loop runs in a superblock: the report is
/// written and agrees with a run without superblocks.
#[test]
fn death_inside_a_superblock() {
    compare(
        "signal_fault.c",
        &["overflow-uncaught"],
        Termination::Signaled(libc::SIGSEGV),
    );
}

/// Timer signals arriving while a hot loop runs in its superblock, with a 64-entry ring (the
/// guest waits for the monitor at every lap's end, so signals also come while the dispatcher
/// refills the ring): the report is consistent, counts the handler exactly as often as the
/// guest says it ran, and the loop ran in a superblock. The counts depend on timing, so the
/// reference is what the guest printed, not another run.
#[test]
fn timer_signals_inside_traces_keep_the_counts_exact() {
    for linkage in Linkage::ALL {
        let exe = guest_build::build("signal_async.c", linkage).unwrap_or_else(|e| panic!("{e}"));
        let what = format!("signal_async counted-alarms ({linkage})");
        let run = run_with_report(
            &exe,
            &["counted-alarms"],
            &scratch(),
            &format!("counted_alarms_{linkage}"),
            &["--superblock-threshold", "1", "--ring-entries", "64"],
        );
        assert_eq!(run.outcome.termination, Termination::Exited(0), "{what}");
        let stdout = String::from_utf8_lossy(&run.outcome.stdout).into_owned();
        let alarms: u64 = stdout
            .strip_prefix("alarms ")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{what}: unexpected output {stdout:?}"));
        assert!(alarms >= 50, "{what}: {stdout}");
        check_consistency(&exe, &run.report, &what);
        let handler: u64 = run
            .report
            .blocks()
            .iter()
            .filter(|b| b["symbol"].as_str() == Some("on_alarm"))
            .map(|b| as_u64(&b["count"]))
            .sum();
        assert_eq!(
            handler, alarms,
            "{what}: the handler's entry block against the deliveries the guest counted"
        );
        let (entries, _) = superblock_use(&run.report);
        assert!(
            entries > alarms,
            "{what}: the loop hardly ran in a superblock ({entries} entries)"
        );
        assert!(
            run.report.total("ring_waits") > 0,
            "{what}: a 64-entry ring never made the guest wait"
        );
    }
}

/// busybox sort and gzip with superblocks formed at once and a 4-entry ring (every side exit
/// and superblock entry then finds the ring full and goes through the dispatcher's slow
/// paths): same output as natively (checked against a run without superblocks), same profile.
/// The input is 8 KiB: every lap of 4 events is a hand-over between two threads, which costs
/// a scheduler slice when other work shares the CPUs (60 KiB, 131,000 laps, took 194 s beside
/// two CPU burners and a test run, past the run timeout; 8 KiB still enters superblocks
/// thousands of times).
#[test]
fn busybox_with_eager_superblocks_and_a_tiny_ring() {
    let Some(busybox) = busybox() else { return };
    let input = scratch().join("lines.txt");
    let mut text = String::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    while text.len() < 8 * 1024 {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        text.push_str(&format!(
            "w{} {} {}\n",
            r % 37,
            (r >> 8) % 100_000,
            (r >> 40) % 7
        ));
    }
    std::fs::write(&input, text).expect("write the input");
    let input = input.to_str().expect("a UTF-8 path");
    let runs: [&[&str]; 2] = [&["sort", input], &["gzip", "-c", input]];
    for args in runs {
        let (entries, _) = compare_exe(
            busybox,
            args,
            &format!("busybox {}", args[0]),
            &["--superblock-threshold", "1", "--ring-entries", "4"],
            Termination::Exited(0),
        );
        assert!(
            entries > 1000,
            "busybox {}: superblocks hardly entered",
            args[0]
        );
    }
}

/// The `switch` of `count_jumptable.S` (selector 0..3 into a 5-entry table, case_e never
/// taken) is translated as a jump-table site, not only through the lookup: without the monitor
/// one site with an entry for each of the four cases taken, case_c's and case_d's their blocks
/// themselves (they set RAX and the flags first), case_a's and case_b's stubs that run the
/// guest's load and `add` first (case_b reads the `add`'s carry: the sample's own sum check
/// fails if it is entered straight); with superblocks formed at once, at least one site (a
/// trace through the dispatch inlines its usual case behind a compare instead; one that ends
/// there is a site too). The profile stays exact (`superblocks_do_not_change_the_profile`,
/// the counts tests).
#[test]
fn a_switch_dispatch_becomes_a_jump_table_site() {
    let exe =
        guest_build::build("count_jumptable.S", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    let hotpath = hotpath_e2e::hotpath_bin::hotpath().unwrap_or_else(|e| panic!("{e}"));
    for mode in [&["--no-monitor"][..], &["--superblock-threshold", "1"][..]] {
        let out = std::process::Command::new(&hotpath)
            .arg("run")
            .arg("--no-cache")
            .args(mode)
            .arg("--")
            .arg(&exe)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", hotpath.display()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        // "... N jump tables (M entries, D of them the case itself, R sent to the lookup) ..."
        let counts: Option<Vec<u64>> = stderr.split_once(" jump tables (").and_then(|(a, b)| {
            let sites = a.rsplit(' ').next()?.parse().ok()?;
            let (entries, rest) = b.split_once(" entries, ")?;
            let (direct, rest) = rest.split_once(" of them the case itself, ")?;
            let refused = rest.split(' ').next()?.parse().ok()?;
            Some(vec![
                sites,
                entries.parse().ok()?,
                direct.parse().ok()?,
                refused,
            ])
        });
        let ok = match (mode.len(), counts.as_deref()) {
            (1, Some(&[1, 4, 2, 0])) => true,
            (2, Some(&[sites, entries, _, 0])) => sites >= 1 && entries >= 4,
            _ => false,
        };
        assert!(
            out.status.success() && ok,
            "{mode:?}: jump tables (sites, entries, direct, refused) {counts:?}:\n{stderr}"
        );
    }
}

/// Functions in [`generated_program`], each of five distinct blocks (its entry and the four
/// places its tests branch to).
const GENERATED_FUNCTIONS: usize = 22_000;

/// Writes and builds (freestanding, static) a program of [`GENERATED_FUNCTIONS`] functions
/// that a driver calls one after another through a table, `rounds` times over: each function
/// tests four bits of its argument (a hash of the round and its index), so that across rounds
/// every one of its blocks runs. It writes the sum of what they return (8 raw bytes) and
/// exits 0. Returns the executable.
fn generated_program(rounds: u32) -> PathBuf {
    use std::fmt::Write as _;
    let mut s = String::from(".intel_syntax noprefix\n.text\n.globl _start\n_start:\n");
    // r12: round, r13: function index, r14: the table, r15: the sum.
    let _ = write!(
        s,
        "    xor r12d, r12d\n    xor r15d, r15d\n    lea r14, [rip + table]\n\
         round:\n    xor r13d, r13d\n\
         next:\n    mov rdi, r12\n    shl rdi, 20\n    xor rdi, r13\n    imul rdi, rdi, 0x5bd1e995\n    shr rdi, 13\n\
         \x20   call [r14 + r13 * 8]\n    add r15, rax\n    inc r13\n    cmp r13, {GENERATED_FUNCTIONS}\n    jb next\n\
         \x20   inc r12\n    cmp r12, {rounds}\n    jb round\n\
         \x20   mov [rsp - 8], r15\n    lea rsi, [rsp - 8]\n    mov edx, 8\n    mov edi, 1\n    mov eax, 1\n    syscall\n\
         \x20   xor edi, edi\n    mov eax, 60\n    syscall\n"
    );
    for f in 0..GENERATED_FUNCTIONS {
        let _ = write!(
            s,
            "f{f}:\n    xor eax, eax\n    test edi, 1\n    jz 1f\n    add eax, {a}\n\
             1:  test edi, 2\n    jz 2f\n    add eax, {b}\n\
             2:  test edi, 4\n    jz 3f\n    xor eax, {c}\n\
             3:  test edi, 8\n    jz 4f\n    sub eax, {d}\n\
             4:  ret\n",
            a = f + 1,
            b = 3 * f + 1,
            c = 5 * f + 1,
            d = 7 * f + 1,
        );
    }
    s.push_str(".section .rodata\n.balign 8\ntable:\n");
    for f in 0..GENERATED_FUNCTIONS {
        let _ = writeln!(s, "    .quad f{f}");
    }
    let dir = scratch();
    let src = dir.join("generated_blocks.S");
    let exe = dir.join("generated_blocks");
    std::fs::write(&src, s).expect("write the generated program");
    let out = std::process::Command::new("gcc")
        .args(["-nostdlib", "-static", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// A program with more than 100,000 distinct blocks (#60: the monitor's tables, the
/// superblocks formed and the code cache at a big program's scale): its tables with a
/// superblock at every loop head as soon as it is hot, and again with a 64-entry ring, equal
/// its tables without superblocks, and its output equals its native output.
#[test]
fn a_program_of_100000_blocks_keeps_its_tables_exact_with_superblocks() {
    let exe = generated_program(16);
    let native = std::process::Command::new(&exe)
        .output()
        .expect("run the generated program natively");
    assert!(native.status.success(), "native run: {}", native.status);
    for (name, sb_args) in [
        ("generated_blocks", &["--superblock-threshold", "1"][..]),
        (
            "generated_blocks_ring64",
            &["--superblock-threshold", "1", "--ring-entries", "64"][..],
        ),
    ] {
        let (entries, _) = compare_exe(&exe, &[], name, sb_args, Termination::Exited(0));
        assert!(entries > 0, "{name}: no superblock was entered");
    }
    let run = run_with_report(&exe, &[], &scratch(), "generated_blocks_default", &[]);
    assert_eq!(run.outcome.stdout, native.stdout, "output under hotpath");
    let distinct = as_u64(&run.report.json["totals"]["distinct_blocks"]);
    assert!(
        distinct > 100_000,
        "the generated program ran only {distinct} distinct blocks"
    );
}
