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

/// The profile directory the running test executable lives in, e.g. `target/x86_64-unknown-linux-gnu/release`
/// (test executables are `target/<profile>/deps/<name>-<hash>`).
pub fn profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    if deps.file_name()? != "deps" {
        return None;
    }
    Some(deps.parent()?.to_path_buf())
}

/// The cargo target directory: `<target>` of [`profile_dir`]'s `<target>/<profile>` or
/// `<target>/<triple>/<profile>` (cargo writes a `CACHEDIR.TAG` at the top of a target dir, and
/// also in each `<triple>/` below it, so the higher one with a tag is taken), else
/// `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    if let Some(profile) = profile_dir() {
        let parent = profile.parent();
        let above = parent.and_then(|p| p.parent());
        for d in [above, parent].into_iter().flatten() {
            if d.join("CACHEDIR.TAG").is_file() {
                return d.to_path_buf();
            }
        }
        if let Some(parent) = parent {
            return parent.to_path_buf();
        }
    }
    workspace_root().join("target")
}

/// A scratch directory under the target dir, unique to this process and `what`, created
/// empty. Tests put generated inputs there (never in the source tree). Directories left by
/// earlier processes that have exited are removed.
pub fn scratch_dir(what: &str) -> PathBuf {
    let root = target_dir().join("e2e-scratch");
    remove_stale_scratch(&root, what);
    let dir = root.join(format!("{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create scratch dir {}: {e}", dir.display()));
    dir
}

/// Removes `<root>/<what>-<pid>` directories whose process no longer exists.
fn remove_stale_scratch(root: &Path, what: &str) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let prefix = format!("{what}-");
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
