//! `#!` scripts, as the kernel's binfmt_script runs them: the interpreter named on the first
//! line runs with the script's path as its argument.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::LoadError;

/// Bytes of a file's start the kernel looks at for `#!` (BINPRM_BUF_SIZE).
const SCRIPT_HEADER_BYTES: usize = 256;

/// How many levels of `#!` scripts the kernel follows before it gives up with ELOOP
/// (`exec_binprm`: binfmt handler depths 0..=5, the last one the ELF program's).
const MAX_SCRIPT_DEPTH: usize = 5;

/// The ELF program to load for `path` run with `argv`, and the argv it gets: `path` itself
/// when it is not a `#!` script, else its interpreter (through any number of script levels,
/// up to the kernel's limit) with argv `[interpreter, optional argument, path, argv[1..]]`.
///
/// # Errors
/// [`LoadError::Io`] when a script cannot be read, [`LoadError::NotExecutable`] when it lacks
/// execute permission, [`LoadError::BadInterpreter`] when the interpreter a script names does
/// not exist, [`LoadError::UnsupportedElf`] for an empty `#!` line or too many levels of
/// scripts.
pub fn resolve_script(
    path: &Path,
    argv: &[OsString],
) -> Result<(PathBuf, Vec<OsString>), LoadError> {
    let mut path = path.to_path_buf();
    let mut argv = argv.to_vec();
    for _ in 0..=MAX_SCRIPT_DEPTH {
        let Some((interp, arg)) = shebang(&path)? else {
            return Ok((path, argv));
        };
        check_script_executable(&path)?;
        if let Err(e) = std::fs::metadata(&interp) {
            return Err(LoadError::BadInterpreter {
                script: path,
                interp,
                reason: crate::elf::io_reason(&e),
            });
        }
        let mut next = vec![interp.clone().into_os_string()];
        next.extend(arg);
        next.push(path.clone().into_os_string());
        next.extend(argv.iter().skip(1).cloned());
        argv = next;
        path = interp;
    }
    Err(LoadError::UnsupportedElf {
        path,
        reason: "too many levels of #! interpreters".into(),
    })
}

/// The interpreter and optional argument of `path`'s `#!` line, or `None` when the file does
/// not start with `#!` (or cannot be opened: the ELF loader reports that).
fn shebang(path: &Path) -> Result<Option<(PathBuf, Option<OsString>)>, LoadError> {
    // Only a regular file can be a script (the kernel refuses to execute anything else, which
    // the ELF loader reports); opening a FIFO to read would wait for a writer.
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Ok(None);
    }
    let Ok(file) = std::fs::File::open(path) else {
        return Ok(None);
    };
    let mut head = Vec::with_capacity(SCRIPT_HEADER_BYTES);
    if file
        .take(SCRIPT_HEADER_BYTES as u64)
        .read_to_end(&mut head)
        .is_err()
        || !head.starts_with(b"#!")
    {
        return Ok(None);
    }
    let line = &head[2..];
    let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = line.iter().position(|b| !blank(b)).unwrap_or(line.len());
    let line = &line[start..];
    let end = line.iter().rposition(|b| !blank(b)).map_or(0, |i| i + 1);
    let line = &line[..end];
    if line.is_empty() {
        return Err(LoadError::UnsupportedElf {
            path: path.to_path_buf(),
            reason: "#! line names no interpreter".into(),
        });
    }
    // As the kernel splits it: the interpreter up to the first blank, the rest (trimmed) is
    // one argument.
    let split = line.iter().position(blank).unwrap_or(line.len());
    let interp = PathBuf::from(std::ffi::OsStr::from_bytes(&line[..split]));
    let rest = &line[split..];
    let rest = &rest[rest.iter().position(|b| !blank(b)).unwrap_or(rest.len())..];
    let arg = (!rest.is_empty()).then(|| OsString::from_vec(rest.to_vec()));
    Ok(Some((interp, arg)))
}

fn check_script_executable(path: &Path) -> Result<(), LoadError> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        LoadError::NotExecutable {
            path: path.to_path_buf(),
            reason: "path contains NUL".into(),
        }
    })?;
    // SAFETY: `access` reads a NUL-terminated path we own.
    if unsafe { libc::access(c.as_ptr(), libc::X_OK) } != 0 {
        return Err(LoadError::NotExecutable {
            path: path.to_path_buf(),
            reason: "permission denied".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// A missing interpreter is named with the script, as a shell names it, and counts as
    /// not found (exit status 127).
    #[test]
    fn a_missing_interpreter_is_a_bad_interpreter_of_the_script() {
        let dir = std::env::temp_dir().join(format!("hotpath-badinterp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = script(&dir, "s", "#!/nonexistent/interp -x\necho hi\n");
        let e = resolve_script(&s, &["s".into()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: bad interpreter /nonexistent/interp: No such file or directory",
                s.display()
            )
        );
        assert!(e.is_not_found());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn interpreter_argument_and_nesting() {
        let dir = std::env::temp_dir().join(format!("hotpath-script-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let inner = script(&dir, "inner", "#!/bin/sh -e  \necho hi\n");
        let outer = script(&dir, "outer", &format!("#! {}\n", inner.display()));
        let (p, argv) = resolve_script(&outer, &["outer".into(), "x".into()]).unwrap();
        assert_eq!(p, PathBuf::from("/bin/sh"));
        let want: Vec<OsString> = vec![
            "/bin/sh".into(),
            "-e".into(),
            inner.clone().into_os_string(),
            outer.clone().into_os_string(),
            "x".into(),
        ];
        assert_eq!(argv, want);
        let (p, argv) = resolve_script(Path::new("/bin/sh"), &["sh".into()]).unwrap();
        assert_eq!((p, argv), (PathBuf::from("/bin/sh"), vec!["sh".into()]));
        let looping = script(&dir, "loop", &format!("#!{}\n", dir.join("loop").display()));
        assert!(resolve_script(&looping, &["loop".into()]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
