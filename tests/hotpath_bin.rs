//! Finding the `hotpath` binary under test, building it first when the tests run from cargo.
//!
//! `cargo test --workspace` builds test harnesses, not the `hotpath` executable itself (cargo
//! builds a package's binaries only for that package's own integration tests, and `hotpath`
//! has none). So, unless `HOTPATH_BIN` names a binary, the first test to need hotpath runs
//! `cargo build -p hotpath --bin hotpath` with the same profile and target dir as the test
//! executable (a no-op when it is up to date; cargo has released its build lock by the time
//! tests run). `HOTPATH_E2E_NO_BUILD=1` skips that build and takes whatever binary is there.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::paths;

/// The hotpath binary to test, or why there is none. Computed once per process.
pub fn hotpath() -> Result<PathBuf, String> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(locate).clone()
}

fn locate() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("HOTPATH_BIN") {
        let bin = PathBuf::from(bin);
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(format!("HOTPATH_BIN={} is not a file", bin.display()))
        };
    }
    let profile_dir = paths::profile_dir()
        .ok_or("the test executable is not in <target>/<profile>/deps; set HOTPATH_BIN")?;
    let bin = profile_dir.join("hotpath");
    if std::env::var_os("HOTPATH_E2E_NO_BUILD").is_some_and(|v| v != "0") {
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(format!(
                "{} does not exist (HOTPATH_E2E_NO_BUILD is set)",
                bin.display()
            ))
        };
    }
    cargo_build(&profile_dir)?;
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "cargo build succeeded but {} does not exist",
            bin.display()
        ))
    }
}

/// `cargo build -p hotpath --bin hotpath` into the target dir and profile of `profile_dir`.
fn cargo_build(profile_dir: &std::path::Path) -> Result<(), String> {
    let target_dir = paths::target_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(paths::workspace_root().join("Cargo.toml"))
        .args(["-p", "hotpath", "--bin", "hotpath"])
        .arg("--target-dir")
        .arg(&target_dir);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
        None => return Err(format!("odd profile dir {}", profile_dir.display())),
    }
    // target/<triple>/<profile>: build for that triple too.
    if let Some(parent) = profile_dir.parent() {
        if parent != target_dir {
            if let Some(triple) = parent.file_name() {
                cmd.arg("--target").arg(triple);
            }
        }
    }
    let out = cmd.output().map_err(|e| format!("cannot run cargo: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "building hotpath failed ({:?}):\n{}",
            cmd,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
