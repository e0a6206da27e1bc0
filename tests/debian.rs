//! Real programs from Debian as workloads: where each is installed and by which package, and
//! the check every such test makes (two identical native runs that end as expected, then
//! hotpath equal to native with the monitor off, on, and with eager superblocks).

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use crate::{
    compare, compare_with_native, run_timeout, runner, set_guest_environment, Outcome, Termination,
};

/// A Debian program the tests run, and the package that installs it.
pub struct Program {
    /// Where Debian installs it.
    pub path: &'static str,
    /// The package that installs it.
    pub package: &'static str,
}

/// `path`, installed by the Debian package `package`.
pub const fn debian(path: &'static str, package: &'static str) -> Program {
    Program { path, package }
}

impl Program {
    /// The program's path.
    ///
    /// # Panics
    ///
    /// When it is not installed: these tests never skip, `.ci/setup` installs every program.
    pub fn installed(&self) -> &'static Path {
        let path = Path::new(self.path);
        assert!(
            path.is_file(),
            "{} is not installed: run `bash .ci/setup`, which installs the Debian package {} \
             with every other program these tests run (CI runs it first)",
            self.path,
            self.package
        );
        path
    }
}

/// What the native run of a workload must do (checked before hotpath is compared with it).
pub struct Expect<'a> {
    /// How it ends.
    pub status: Termination,
    /// Texts the native stdout must contain.
    pub stdout: &'a [&'a str],
    /// Texts the native stderr must contain.
    pub stderr: &'a [&'a str],
}

/// Runs `program args` in `dir`: natively twice (the runs must be identical
/// and end as `expect` says), then under hotpath with the monitor off, on and with eager
/// superblocks (each must equal the native run). Returns the native outcome.
///
/// # Panics
///
/// With a report of what differed.
pub fn check(program: &Program, args: &[&str], dir: &Path, expect: Expect) -> Outcome {
    let exe = program.installed();
    let mut first_cmd = Command::new(exe);
    first_cmd.args(args);
    set_guest_environment(&mut first_cmd, dir);
    let what = format!("{} (in {})", runner::describe(&first_cmd), dir.display());
    let first = runner::run(&mut first_cmd, run_timeout())
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));

    let (native, verdict) = compare_with_native(exe, args, dir);
    if let Err(report) = compare::compare_outcomes(&first, &native) {
        panic!(
            "{what}: two NATIVE runs differ (- first, + second): the workload is not \
             deterministic, fix it (hotpath is not at fault):\n{report}"
        );
    }
    let mut problems = String::new();
    if native.termination != expect.status {
        let _ = writeln!(
            problems,
            "  status: expected {}, native run {}",
            expect.status, native.termination
        );
    }
    for (stream, bytes, markers) in [
        ("stdout", &native.stdout, expect.stdout),
        ("stderr", &native.stderr, expect.stderr),
    ] {
        let text = String::from_utf8_lossy(bytes);
        for marker in markers {
            if !text.contains(marker) {
                let _ = writeln!(problems, "  native {stream} lacks {marker:?}");
            }
        }
    }
    if !problems.is_empty() {
        panic!(
            "{what}: the NATIVE run is not what the workload should do (the workload or the \
             installed program is at fault, not hotpath):\n{problems}  stdout:\n{}  stderr:\n{}",
            compare::diff(b"", &native.stdout),
            compare::diff(b"", &native.stderr)
        );
    }
    if let Err(report) = verdict {
        panic!("{what}:{report}");
    }
    native
}
