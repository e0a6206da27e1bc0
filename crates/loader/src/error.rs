//! The loader's error type: every way a guest file can be refused, each naming the file.

use std::path::PathBuf;

/// Why a guest program could not be loaded. `Display` is one line naming the file and the
/// reason, ready for the user.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be opened or read.
    #[error("{}: {reason}", path.display())]
    Io { path: PathBuf, reason: String },
    /// The file is not executable by this user (no execute permission, or not a regular file).
    #[error("{}: not executable: {reason}", path.display())]
    NotExecutable { path: PathBuf, reason: String },
    /// The file does not start with the ELF magic.
    #[error("{}: not an ELF file", path.display())]
    NotElf { path: PathBuf },
    /// The file is an ELF hotpath cannot run (class, machine, type) or it is malformed.
    #[error("{}: {reason}", path.display())]
    UnsupportedElf { path: PathBuf, reason: String },
    /// The program's interpreter (`PT_INTERP`) is missing or cannot be loaded.
    #[error("{}: interpreter {}: {reason}", path.display(), interp.display())]
    Interpreter {
        path: PathBuf,
        interp: PathBuf,
        reason: String,
    },
    /// A `#!` script's interpreter cannot be found or read (as a shell says it: "bad
    /// interpreter").
    #[error("{}: bad interpreter {}: {reason}", script.display(), interp.display())]
    BadInterpreter {
        script: PathBuf,
        interp: PathBuf,
        reason: String,
    },
    /// The kernel would accept the file but fail to set it up past its point of no return
    /// (a segment it cannot map, an entry point outside user space): natively the new
    /// process dies by SIGSEGV before its first instruction, and so does `hotpath run`.
    #[error("{}: {reason}: the kernel kills the process here (SIGSEGV)", path.display())]
    Killed { path: PathBuf, reason: String },
    /// An address range the guest needs could not be mapped.
    #[error("{}: cannot map the guest image at {addr:#x} ({len} bytes): {reason}", path.display())]
    Map {
        path: PathBuf,
        addr: u64,
        len: u64,
        reason: String,
    },
}

impl LoadError {
    /// The reason alone, without the file's name (for an error about a file another one
    /// names, such as the interpreter).
    pub fn reason(&self) -> String {
        match self {
            LoadError::Io { reason, .. }
            | LoadError::NotExecutable { reason, .. }
            | LoadError::UnsupportedElf { reason, .. }
            | LoadError::Interpreter { reason, .. }
            | LoadError::BadInterpreter { reason, .. }
            | LoadError::Killed { reason, .. } => reason.clone(),
            LoadError::NotElf { .. } => "not an ELF file".into(),
            LoadError::Map {
                addr, len, reason, ..
            } => format!("cannot map {len} bytes at {addr:#x}: {reason}"),
        }
    }

    /// True when the kernel would let the `execve` succeed and then kill the new process with
    /// SIGSEGV ([`LoadError::Killed`]): hotpath then dies of SIGSEGV too.
    pub fn kills_the_process(&self) -> bool {
        matches!(self, LoadError::Killed { .. })
    }

    /// True when the file (or the interpreter it names) does not exist: a shell reports such
    /// a command with exit status 127, other failures to execute with 126.
    pub fn is_not_found(&self) -> bool {
        match self {
            LoadError::Io { reason, .. }
            | LoadError::Interpreter { reason, .. }
            | LoadError::BadInterpreter { reason, .. } => reason.contains("No such file"),
            _ => false,
        }
    }
}
