//! Every guest sample, static and static-pie (and, for C samples, dynamically linked: started
//! by ld.so with glibc's shared objects), run natively and under hotpath (monitor off, on, and
//! with eager superblocks): stdout, stderr and exit status or fatal signal must be identical.
//!
//! One test per sample, so a failure names the sample; each test reports every configuration
//! before failing. See `hotpath_e2e::check_sample` and `Sample::linkages`.

use std::process::Command;

use hotpath_e2e::{
    catalog, compare, guest_build, native_command, run_timeout, runner, set_guest_environment,
    Linkage,
};

/// One `#[test]` per listed sample, calling `check_sample` with the sample's name; the list
/// must match the catalog exactly (checked by `every_catalog_sample_has_a_test`). A sample
/// that finds a known hotpath bug is listed with `#[ignore = "bug: ..."]`: it still compiles
/// and runs with `cargo test -- --ignored`.
macro_rules! sample_tests {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        $(
            #[test]
            $(#[$attr])*
            fn $name() {
                hotpath_e2e::check_sample(stringify!($name));
            }
        )*
        const LISTED: &[&str] = &[$(stringify!($name)),*];
    };
}

sample_tests! {
    hello,
    loops,
    jumptable,
    funcptr_qsort,
    recursion,
    fp_printf,
    x87_state,
    strings,
    setjmp,
    malloc,
    exit_return,
    exit_call,
    stderr_out,
    args_env,
    abort,
    segv,
    signal_handler,
    signal_async,
    signal_sigsuspend,
    signal_rt_queue,
    signal_restart,
    signal_dead_regs,
    signal_xstate,
    signal_fault,
    nonexec,
    signal_overflow,
    stack_overflow,
    sigterm_self,
    fork_wait,
    fork_kill_paused,
    fork_exec,
    fork_loop,
    fork_exec_kill_early,
    sigchld,
    sigchld_sigsuspend,
    cpu_features,
    jit_remap,
    hole_reuse,
    constant_slots,
    jumptable_changes,
    jit_rwx,
    jit_pages,
    eflags_ac,
    threads,
    thread_counts,
    thread_pingpong,
    thread_fault,
    thread_kill,
    thread_cancel,
    thread_many,
    thread_serial,
    thread_jumptable,
    thread_syscall,
    thread_races_join,
    thread_races_exit,
    thread_races_fork,
    thread_races_signal,
    thread_newcode,
    thread_jitwriter,
    thread_jitversions,
    thread_jitdata,
    thread_exit,
    thread_fork,
    thread_exec,
    thread_signal,
    thread_rawclone,
    clone_vm_process,
    asm_flags,
    asm_redzone,
    asm_retaddr,
    asm_start_state,
    asm_traps_ud2,
    asm_traps_badop,
    asm_traps_int3,
    count_branches,
    count_jumptable,
    phase_change,
    slow_loop,
    count_calls,
    count_syscalls,
    count_libc,
    auxv_count,
    superblock_fault,
    indirect_traces,
    ibl_collisions,
    maps_beside_threads,
    bench_sieve,
    bench_crc,
    bench_fib,
    bench_nbody,
    bench_interp,
    bench_threads,
    bench_deep,
}

#[test]
fn every_catalog_sample_has_a_test() {
    let catalog: Vec<&str> = catalog::SAMPLES.iter().map(|s| s.name).collect();
    let missing: Vec<_> = catalog.iter().filter(|n| !LISTED.contains(n)).collect();
    let unknown: Vec<_> = LISTED.iter().filter(|n| !catalog.contains(n)).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "samples in the catalog without a test: {missing:?}; tests without a catalog entry: {unknown:?}"
    );
}

/// The samples that exist to exercise indirect jumps must really contain one: gcc could
/// otherwise turn a switch into a compare chain or a lookup table and the test would
/// silently stop covering jump tables.
#[test]
fn jump_table_samples_have_an_indirect_jmp() {
    for (source, function) in [
        ("jumptable.c", "step"),
        ("bench_interp.c", "run"),
        ("thread_cases.c", "jt_switch"),
    ] {
        for linkage in Linkage::WITH_DYNAMIC {
            let exe = guest_build::build(source, linkage).unwrap_or_else(|e| panic!("{e}"));
            // gcc may clone the function (run.constprop.0); accept any symbol it starts with.
            let body = guest_build::disassemble_function(&exe, function)
                .or_else(|_| {
                    guest_build::disassemble_function(&exe, &format!("{function}.constprop.0"))
                })
                .or_else(|_| guest_build::disassemble_function(&exe, &format!("{function}.isra.0")))
                .unwrap_or_else(|e| panic!("{source} ({linkage}): {e}"));
            let indirect = body
                .lines()
                .any(|l| l.contains("jmp") && l.contains('*') && !l.contains("call"));
            assert!(
                indirect,
                "{source} ({linkage}): no indirect jmp in {function}:\n{body}"
            );
        }
    }
}

/// `signal_dead_regs` with a 64-entry ring: the guest then waits for the monitor at the end of
/// every lap, so most timer signals arrive while the dispatcher refills the ring at the entry
/// of a block whose enqueue stub borrowed a dead register. Delivering one there would hand the
/// handler the stub's value (a run that did so saw it in 200-290 of 300 signals); the
/// dispatcher runs the block to its end first.
#[test]
fn signals_at_ring_refills_never_see_a_borrowed_register() {
    let hotpath = hotpath_e2e::hotpath_bin::hotpath().unwrap_or_else(|e| panic!("{e}"));
    for linkage in Linkage::ALL {
        let exe =
            guest_build::build("signal_dead_regs.c", linkage).unwrap_or_else(|e| panic!("{e}"));
        let native = runner::run(&mut native_command(&exe, &[]), run_timeout())
            .unwrap_or_else(|e| panic!("native run: {e}"));
        let modes: [&[&str]; 2] = [
            &["--ring-entries", "64", "--no-superblocks"],
            &["--ring-entries", "64", "--superblock-threshold", "1"],
        ];
        for extra in modes {
            let mut cmd = Command::new(&hotpath);
            cmd.args(["run", "--quiet"]).args(extra).arg("--").arg(&exe);
            set_guest_environment(&mut cmd, exe.parent().expect("a directory"));
            let translated =
                runner::run(&mut cmd, run_timeout()).unwrap_or_else(|e| panic!("hotpath run: {e}"));
            if let Err(report) = compare::compare_outcomes(&native, &translated) {
                panic!("[{linkage}] hotpath {extra:?} differs from the native run:\n{report}");
            }
        }
    }
}
