//! Running a command with a timeout and capturing its stdout, stderr and how it ended.
//!
//! Every run gets stdin from /dev/null, a core-size limit of 0 (guests that die by SIGSEGV or
//! SIGABRT must not write cores) and its own process group, so a hung run is killed with
//! everything it started.

use std::fmt;
use std::io::{self, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Termination {
    /// Normal exit with this status.
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
    /// Still running at the timeout; it was killed.
    TimedOut(Duration),
}

impl Termination {
    fn from_status(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => Termination::Exited(code),
            (None, Some(sig)) => Termination::Signaled(sig),
            (None, None) => Termination::Exited(-1),
        }
    }
}

impl fmt::Display for Termination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Termination::Exited(code) => write!(f, "exit status {code}"),
            Termination::Signaled(sig) => {
                write!(f, "killed by signal {sig} ({})", signal_name(sig))
            }
            Termination::TimedOut(t) => write!(f, "still running after {} s (killed)", t.as_secs()),
        }
    }
}

/// The conventional name of a signal number, for messages.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSYS => "SIGSYS",
        _ => "?",
    }
}

/// Everything a run did that a test compares.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub termination: Termination,
    /// Wall time from spawn to exit (or to the kill, on timeout).
    pub elapsed: Duration,
}

/// A shell-like rendering of `cmd`, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"\\$`".contains(c)) {
            s.push_str(&format!(" '{}'", a.replace('\'', r"'\''")));
        } else {
            s.push(' ');
            s.push_str(&a);
        }
    }
    s
}

/// Runs `cmd` to completion or until `timeout`, capturing stdout and stderr.
///
/// # Errors
///
/// When the command cannot be spawned (e.g. the program does not exist).
pub fn run(cmd: &mut Command, timeout: Duration) -> io::Result<Outcome> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.process_group(0);
    // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits; the
    // closure allocates nothing and runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::setrlimit(libc::RLIMIT_CORE, &no_core) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let start = Instant::now();
    let mut child = cmd.spawn()?;
    let pid = child.id() as libc::pid_t;
    let out_pipe = child.stdout.take().expect("stdout is piped");
    let err_pipe = child.stderr.take().expect("stderr is piped");
    let (out_tx, out_rx) = mpsc::channel();
    let (err_tx, err_rx) = mpsc::channel();
    spawn_reader(out_pipe, out_tx);
    spawn_reader(err_pipe, err_tx);

    let mut nap = Duration::from_micros(200);
    let termination = loop {
        if let Some(status) = child.try_wait()? {
            break Termination::from_status(status);
        }
        if start.elapsed() >= timeout {
            kill_group(pid);
            let _ = child.wait();
            break Termination::TimedOut(timeout);
        }
        thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(10));
    };
    let elapsed = start.elapsed();
    // The pipes close when the last process holding them exits. If something the child
    // started outlives it and keeps them open, kill the group rather than wait forever.
    let grace = timeout
        .saturating_sub(start.elapsed())
        .max(Duration::from_secs(1));
    let stdout = collect(&out_rx, grace, pid);
    let stderr = collect(&err_rx, grace, pid);
    Ok(Outcome {
        stdout,
        stderr,
        termination,
        elapsed,
    })
}

fn spawn_reader(mut pipe: impl Read + Send + 'static, tx: mpsc::Sender<Vec<u8>>) {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
}

fn collect(rx: &mpsc::Receiver<Vec<u8>>, grace: Duration, pgid: libc::pid_t) -> Vec<u8> {
    match rx.recv_timeout(grace) {
        Ok(buf) => buf,
        Err(_) => {
            kill_group(pgid);
            rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default()
        }
    }
}

/// SIGKILL to the process group the child leads (it was spawned with `process_group(0)`),
/// only while that group still has members we started.
fn kill_group(pgid: libc::pid_t) {
    // SAFETY: kill(2) has no memory-safety preconditions; the group is the child's own.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
}
