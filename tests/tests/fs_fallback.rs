//! The FS-base switch without FSGSBASE: hotpath swaps the guest's and its own FS base with
//! `arch_prctl` when the CPU or kernel lacks `wrfsbase`. The development and CI machines have
//! FSGSBASE, so `HOTPATH_NO_FSGSBASE=1` forces that path here, on samples that depend on the
//! guest's FS base (glibc's TLS, stack protector and pointer mangling in setjmp), signals
//! (the handler switches FS bases too) and fork.

use hotpath_e2e::catalog::Linkage;
use hotpath_e2e::{
    compare, guest_build, hotpath_bin, hotpath_command, native_command, run_timeout, runner,
    MonitorMode,
};

/// Samples whose output does not include the environment (the variable reaches the guest).
const SAMPLES: &[(&str, &[&str])] = &[
    ("setjmp.c", &[]),
    ("signal_handler.c", &[]),
    ("malloc.c", &[]),
    ("asm_start_state.S", &[]),
];

#[test]
fn samples_run_with_arch_prctl_fs_switching() {
    let hotpath = hotpath_bin::hotpath().expect("a hotpath binary");
    let mut problems = Vec::new();
    for &(source, args) in SAMPLES {
        for linkage in Linkage::ALL {
            let exe = guest_build::build(source, linkage).expect("sample builds");
            let native =
                runner::run(&mut native_command(&exe, args), run_timeout()).expect("native run");
            for mode in MonitorMode::ALL {
                let mut cmd = hotpath_command(&hotpath, mode, &exe, args);
                cmd.env("HOTPATH_NO_FSGSBASE", "1");
                let translated = runner::run(&mut cmd, run_timeout()).expect("hotpath run");
                if let Err(e) = compare::compare_outcomes(&native, &translated) {
                    problems.push(format!("{source} [{linkage}, {}]: {e}", mode.label()));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
