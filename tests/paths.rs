//! Where things are: the workspace, the cargo target dir this test was built into, the samples.

use std::path::{Path, PathBuf};

/// The workspace root (the parent of this `tests/` package).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// `guest-samples/` in the workspace: the sources of every guest program.
pub fn samples_dir() -> PathBuf {
    workspace_root().join("guest-samples")
}

/// `guest-samples/expected/`: golden stdout/stderr of the native runs.
pub fn expected_dir() -> PathBuf {
    samples_dir().join("expected")
}

/// The profile directory the running test executable lives in, e.g. `target/release`
/// (test executables are `target/<profile>/deps/<name>-<hash>`).
pub fn profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    if deps.file_name()? != "deps" {
        return None;
    }
    Some(deps.parent()?.to_path_buf())
}

/// The cargo target directory: the nearest ancestor of [`profile_dir`] holding the
/// `CACHEDIR.TAG` cargo writes at the top of every target dir (this skips a
/// `<target-triple>/` level), else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    if let Some(profile) = profile_dir() {
        let mut dir = profile.parent();
        while let Some(d) = dir {
            if d.join("CACHEDIR.TAG").is_file() {
                return d.to_path_buf();
            }
            dir = d.parent();
        }
        if let Some(parent) = profile.parent() {
            return parent.to_path_buf();
        }
    }
    workspace_root().join("target")
}

/// A scratch directory under the target dir, unique to this process and `what`, created
/// empty. Tests put generated inputs there (never in the source tree).
pub fn scratch_dir(what: &str) -> PathBuf {
    let dir = target_dir()
        .join("e2e-scratch")
        .join(format!("{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create scratch dir {}: {e}", dir.display()));
    dir
}
