//! `hotpath bench`: the same program timed natively, under hotpath in each mode (translator
//! alone, monitor without superblocks, as shipped) and under qemu-x86_64 when it is
//! installed, runs interleaved so that the machine's drift touches every mode alike; prints
//! each mode's median wall time and its ratio to native.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::cli::BenchArgs;

/// One way of running the program.
struct Mode {
    /// Its row label.
    name: &'static str,
    /// The command that runs the program this way (the program and its arguments follow).
    prefix: Vec<OsString>,
    /// Wall times of its runs.
    times: Vec<Duration>,
    /// Its runs' endings that differed from the native run's first one.
    differs: Vec<String>,
}

/// `qemu-x86_64` on `PATH`, if installed.
fn qemu() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("qemu-x86_64"))
        .find(|p| p.is_file())
}

/// Median of `t` (the mean of the middle two for an even count).
fn median(t: &[Duration]) -> Duration {
    let mut v = t.to_vec();
    v.sort();
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2
    }
}

/// Runs `cmd` with no input and its output discarded; its wall time and how it ended.
fn time(cmd: &mut Command) -> std::io::Result<(Duration, ExitStatus)> {
    let start = Instant::now();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    Ok((start.elapsed(), status))
}

/// `exit N` or `signal N`.
fn ending(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => "?".into(),
    }
}

/// `hotpath bench`: prints the table on stdout, progress on stderr.
pub fn bench(args: BenchArgs) -> ExitCode {
    let hotpath = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("hotpath: cannot find hotpath's own executable: {e}");
            return ExitCode::from(1);
        }
    };
    let under = |opts: &[&str]| -> Vec<OsString> {
        let mut v: Vec<OsString> = vec![hotpath.clone().into(), "run".into(), "--quiet".into()];
        v.extend(opts.iter().map(OsString::from));
        v.push("--".into());
        v
    };
    let mode = |name, prefix| Mode {
        name,
        prefix,
        times: Vec::new(),
        differs: Vec::new(),
    };
    let mut modes = vec![
        mode("native", Vec::new()),
        mode("hotpath --no-monitor", under(&["--no-monitor"])),
        mode("hotpath --no-superblocks", under(&["--no-superblocks"])),
        mode("hotpath", under(&[])),
    ];
    if !args.no_qemu {
        if let Some(q) = qemu() {
            modes.push(mode("qemu-x86_64", vec![q.into()]));
        }
    }
    let mut native_end: Option<String> = None;
    let n = modes.len();
    let total = args.runs as usize * n;
    for round in 0..args.runs as usize {
        for (i, m) in modes.iter_mut().enumerate() {
            eprint!(
                "\rhotpath bench: run {}/{total}: {:<28}",
                round * n + i + 1,
                m.name
            );
            let _ = std::io::stderr().flush();
            let argv: Vec<&OsString> = m.prefix.iter().chain(&args.command).collect();
            let mut cmd = Command::new(argv[0]);
            cmd.args(&argv[1..]);
            match time(&mut cmd) {
                Ok((t, status)) => {
                    m.times.push(t);
                    let end = ending(status);
                    match &native_end {
                        None => native_end = Some(end),
                        Some(n) if *n != end => m.differs.push(end),
                        _ => {}
                    }
                }
                Err(e) => {
                    eprintln!(
                        "\nhotpath: bench: cannot run {}: {e}",
                        argv[0].to_string_lossy()
                    );
                    return ExitCode::from(1);
                }
            }
        }
    }
    eprintln!();
    let native = median(&modes[0].times).as_secs_f64().max(1e-9);
    let program: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    println!(
        "{} ({} runs each, interleaved; median wall time)",
        program.join(" "),
        args.runs
    );
    println!("{:<28} {:>10} {:>8}", "mode", "seconds", "ratio");
    for m in &modes {
        let t = median(&m.times).as_secs_f64();
        let note = match m.differs.first() {
            Some(e) => format!(
                "  ({} runs ended with {e}, native with {})",
                m.differs.len(),
                native_end.as_deref().unwrap_or("?")
            ),
            None => String::new(),
        };
        println!("{:<28} {:>10.4} {:>7.2}x{note}", m.name, t, t / native);
    }
    if modes.iter().any(|m| !m.differs.is_empty()) {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
