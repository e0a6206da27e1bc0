//! Bad input gets a clear error (DESIGN.md invariant 4): for each file in a corpus generated
//! here at run time, `hotpath run -- FILE` prints exactly one non-empty line on stderr that
//! names the file, exits with a non-zero status, is not killed by a signal and does not panic.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use hotpath_e2e::{guest_build, hotpath_bin, paths, runner, Linkage, Termination};

/// A run that rejects its input should be quick; this only stops a hang from blocking CI.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The scratch directory of this test process, shared by all cases (each uses its own name).
fn corpus_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| paths::scratch_dir("bad-input"))
}

fn write_file(name: &str, bytes: &[u8], mode: u32) -> PathBuf {
    let path = corpus_dir().join(name);
    fs::write(&path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    fs::set_permissions(&path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
    path
}

/// The bytes of a real x86-64 static executable (the hello sample).
fn real_elf() -> Vec<u8> {
    let exe = guest_build::build("hello.c", Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
    fs::read(&exe).unwrap_or_else(|e| panic!("reading {}: {e}", exe.display()))
}

/// Runs hotpath on `path` with a few option sets and checks every run rejected it properly.
fn assert_rejected(path: &Path) {
    let hotpath =
        hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary to test: {e}"));
    let shown = path.display().to_string();
    let mut problems = Vec::new();
    for options in [&[][..], &["--quiet"][..], &["--no-monitor"][..]] {
        let mut cmd = Command::new(&hotpath);
        cmd.arg("run").args(options).arg("--").arg(path);
        hotpath_e2e::set_guest_environment(&mut cmd, corpus_dir());
        let what = runner::describe(&cmd);
        let outcome =
            runner::run(&mut cmd, TIMEOUT).unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
        let stderr = String::from_utf8_lossy(&outcome.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        let mut bad = Vec::new();
        match outcome.termination {
            Termination::Exited(0) => bad.push("exit status 0 (want non-zero)".to_string()),
            Termination::Exited(_) => {}
            other => bad.push(format!("{other} (want a non-zero exit)")),
        }
        if stderr.contains("panicked") {
            bad.push("stderr contains \"panicked\"".to_string());
        }
        if lines.len() != 1 || lines[0].trim().is_empty() {
            bad.push(format!(
                "{} lines on stderr (want exactly one non-empty line)",
                lines.len()
            ));
        }
        if !stderr.contains(&shown) {
            bad.push(format!("stderr does not name the file {shown}"));
        }
        if !bad.is_empty() {
            problems.push(format!(
                "{what}\n  -> {}\n  problems: {}\n  stderr: {:?}",
                outcome.termination,
                bad.join("; "),
                stderr
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "hotpath did not reject {shown} cleanly:\n{}",
        problems.join("\n")
    );
}

fn u16le(v: u16) -> [u8; 2] {
    v.to_le_bytes()
}
fn u32le(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}
fn u64le(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

/// A minimal, well-formed i386 executable: ELF32 header, one PT_LOAD, and
/// `mov $1,%eax; xor %ebx,%ebx; int $0x80` (exit(0)).
fn crafted_i386_elf() -> Vec<u8> {
    const BASE: u32 = 0x0804_8000;
    const CODE_OFF: u32 = 52 + 32;
    let code: &[u8] = &[0xb8, 0x01, 0x00, 0x00, 0x00, 0x31, 0xdb, 0xcd, 0x80];
    let total = CODE_OFF + code.len() as u32;
    let mut f = vec![
        0x7f, b'E', b'L', b'F', 1, /* ELFCLASS32 */
        1, /* LSB */
        1, 0,
    ];
    f.resize(16, 0);
    f.extend(u16le(2)); // e_type: ET_EXEC
    f.extend(u16le(3)); // e_machine: EM_386
    f.extend(u32le(1)); // e_version
    f.extend(u32le(BASE + CODE_OFF)); // e_entry
    f.extend(u32le(52)); // e_phoff
    f.extend(u32le(0)); // e_shoff
    f.extend(u32le(0)); // e_flags
    f.extend(u16le(52)); // e_ehsize
    f.extend(u16le(32)); // e_phentsize
    f.extend(u16le(1)); // e_phnum
    f.extend(u16le(40)); // e_shentsize
    f.extend(u16le(0)); // e_shnum
    f.extend(u16le(0)); // e_shstrndx
    f.extend(u32le(1)); // p_type: PT_LOAD
    f.extend(u32le(0)); // p_offset
    f.extend(u32le(BASE)); // p_vaddr
    f.extend(u32le(BASE)); // p_paddr
    f.extend(u32le(total)); // p_filesz
    f.extend(u32le(total)); // p_memsz
    f.extend(u32le(5)); // p_flags: R X
    f.extend(u32le(0x1000)); // p_align
    f.extend(code);
    f
}

/// A minimal, well-formed aarch64 executable: ELF64 header with EM_AARCH64 (183), one
/// PT_LOAD, and `mov x0,#0; mov x8,#93; svc #0` (exit(0)).
fn crafted_aarch64_elf() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const CODE_OFF: u64 = 64 + 56;
    let code: &[u8] = &[
        0x00, 0x00, 0x80, 0xd2, // mov x0, #0
        0xa8, 0x0b, 0x80, 0xd2, // mov x8, #93
        0x01, 0x00, 0x00, 0xd4, // svc #0
    ];
    let total = CODE_OFF + code.len() as u64;
    let mut f = vec![
        0x7f, b'E', b'L', b'F', 2, /* ELFCLASS64 */
        1, /* LSB */
        1, 0,
    ];
    f.resize(16, 0);
    f.extend(u16le(2)); // e_type: ET_EXEC
    f.extend(u16le(183)); // e_machine: EM_AARCH64
    f.extend(u32le(1)); // e_version
    f.extend(u64le(BASE + CODE_OFF)); // e_entry
    f.extend(u64le(64)); // e_phoff
    f.extend(u64le(0)); // e_shoff
    f.extend(u32le(0)); // e_flags
    f.extend(u16le(64)); // e_ehsize
    f.extend(u16le(56)); // e_phentsize
    f.extend(u16le(1)); // e_phnum
    f.extend(u16le(64)); // e_shentsize
    f.extend(u16le(0)); // e_shnum
    f.extend(u16le(0)); // e_shstrndx
    f.extend(u32le(1)); // p_type: PT_LOAD
    f.extend(u32le(5)); // p_flags: R X
    f.extend(u64le(0)); // p_offset
    f.extend(u64le(BASE)); // p_vaddr
    f.extend(u64le(BASE)); // p_paddr
    f.extend(u64le(total)); // p_filesz
    f.extend(u64le(total)); // p_memsz
    f.extend(u64le(0x1_0000)); // p_align
    f.extend(code);
    f
}

/// A real i386 executable when `gcc -m32` works here, else a crafted one.
fn i386_elf() -> Vec<u8> {
    let out = corpus_dir().join("i386-from-gcc");
    let built = Command::new("gcc")
        .args(["-m32", "-static", "-O2", "-o"])
        .arg(&out)
        .arg(paths::samples_dir().join("hello.c"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    match fs::read(&out) {
        Ok(bytes) if built => bytes,
        _ => crafted_i386_elf(),
    }
}

#[test]
fn text_file() {
    let path = write_file("notes.txt", b"this is a text file, not a program\n", 0o755);
    assert_rejected(&path);
}

#[test]
fn empty_file() {
    let path = write_file("empty", b"", 0o755);
    assert_rejected(&path);
}

#[test]
fn truncated_elf_header() {
    let elf = real_elf();
    let path = write_file("truncated-header", &elf[..20], 0o755);
    assert_rejected(&path);
}

#[test]
fn truncated_program_headers() {
    // A complete 64-byte ELF header whose program header table lies past the end of the file.
    let elf = real_elf();
    let path = write_file("truncated-phdrs", &elf[..64], 0o755);
    assert_rejected(&path);
}

#[test]
fn i386_elf_is_rejected() {
    let bytes = i386_elf();
    assert_eq!(bytes[4], 1, "not ELFCLASS32");
    assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 3, "not EM_386");
    let path = write_file("i386-program", &bytes, 0o755);
    assert_rejected(&path);
}

#[test]
fn aarch64_elf_is_rejected() {
    let path = write_file("aarch64-program", &crafted_aarch64_elf(), 0o755);
    assert_rejected(&path);
}

#[test]
fn relocatable_object() {
    let obj = corpus_dir().join("hello.o");
    let out = Command::new("gcc")
        .args(["-c", "-O2", "-o"])
        .arg(&obj)
        .arg(paths::samples_dir().join("hello.c"))
        .output()
        .expect("gcc runs");
    assert!(
        out.status.success(),
        "gcc -c failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::set_permissions(&obj, fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_rejected(&obj);
}

#[test]
fn x86_64_elf_without_execute_permission() {
    let path = write_file("hello-not-executable", &real_elf(), 0o644);
    assert_rejected(&path);
}

#[test]
fn nonexistent_path() {
    let path = corpus_dir().join("no-such-program");
    assert!(!path.exists());
    assert_rejected(&path);
}

/// A script whose `#!` names a missing interpreter is reported as a shell reports it, naming
/// both files, with the shell's status for a command not found.
#[test]
fn script_with_a_missing_interpreter() {
    let path = write_file(
        "script-bad-interpreter",
        b"#!/nonexistent/interp -x\necho hi\n",
        0o755,
    );
    assert_rejected(&path);
    let hotpath = hotpath_bin::hotpath().unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(&hotpath);
    cmd.arg("run").arg(&path);
    hotpath_e2e::set_guest_environment(&mut cmd, corpus_dir());
    let outcome = runner::run(&mut cmd, TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.termination, Termination::Exited(127));
    assert_eq!(
        String::from_utf8_lossy(&outcome.stderr),
        format!(
            "hotpath: {}: bad interpreter /nonexistent/interp: No such file or directory\n",
            path.display()
        )
    );
}

#[test]
fn directory() {
    let path = corpus_dir().join("a-directory");
    fs::create_dir_all(&path).expect("mkdir");
    assert_rejected(&path);
}

/// The crafted files are what they claim to be, so a rejection is for the right reason.
#[test]
fn crafted_elves_are_well_formed() {
    let i386 = crafted_i386_elf();
    assert_eq!(&i386[..4], b"\x7fELF");
    assert_eq!(i386.len(), 52 + 32 + 9);
    let a64 = crafted_aarch64_elf();
    assert_eq!(&a64[..4], b"\x7fELF");
    assert_eq!(a64[4], 2);
    assert_eq!(u16::from_le_bytes([a64[18], a64[19]]), 183);
    assert_eq!(a64.len(), 64 + 56 + 12);
}

/// A directory any user can enter and read, for the unprivileged runs below (the target
/// directory may be under a home only its owner enters). Removed when dropped.
struct OpenDir(PathBuf);

impl OpenDir {
    fn new() -> OpenDir {
        let dir = std::env::temp_dir().join(format!("hotpath-open-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", dir.display()));
        OpenDir(dir)
    }

    /// Copies `from` in as `name`, readable and executable by anyone.
    fn add(&self, from: &Path, name: &str) -> PathBuf {
        let to = self.0.join(name);
        fs::copy(from, &to).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
        fs::set_permissions(&to, fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", to.display()));
        to
    }
}

impl Drop for OpenDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `args` run as user `nobody` allowed one process (`runuser`, `prlimit --nproc=1`): room
/// for a program's own single thread and no other. `None` where that cannot be arranged
/// (not root, or the tools or the user missing).
fn as_nobody_with_one_process(args: &[&Path]) -> Option<Command> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let works = Command::new("runuser")
        .args(["-u", "nobody", "--", "prlimit", "--nproc=1", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !works {
        return None;
    }
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "nobody", "--", "prlimit", "--nproc=1"])
        .args(args)
        .current_dir(std::env::temp_dir());
    Some(cmd)
}

/// A process limit that leaves no room for hotpath's monitor thread: a program that ends
/// within its ring's first lap needs none (the ending thread reads its events, and the report
/// is written); one that runs on past it still runs as natively (output and exit status), and
/// one line says it runs without a profile.
#[test]
fn a_limit_that_refuses_the_monitor_thread() {
    let hotpath =
        hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary to test: {e}"));
    let dir = OpenDir::new();
    let hp = dir.add(&hotpath, "hotpath");
    // hello: a few thousand events; bench_sieve (a small limit, still millions of blocks):
    // more than a lap, so the monitor thread is asked for.
    for (sample, args, refused) in [
        ("hello.c", &[][..], false),
        ("bench_sieve.c", &["3000000"][..], true),
    ] {
        let exe = guest_build::build(sample, Linkage::Static).unwrap_or_else(|e| panic!("{e}"));
        let guest = dir.add(&exe, sample.trim_end_matches(".c"));
        let mut native_args = vec![guest.as_path()];
        native_args.extend(args.iter().map(Path::new));
        let Some(mut native) = as_nobody_with_one_process(&native_args) else {
            eprintln!("skipped: needs root, runuser, prlimit and the user nobody");
            return;
        };
        let native = runner::run(&mut native, TIMEOUT).unwrap_or_else(|e| panic!("native: {e}"));
        assert_eq!(native.termination, Termination::Exited(0));
        let report = dir.0.join(format!("{sample}.json"));
        let mut hp_args = vec![
            hp.as_path(),
            Path::new("run"),
            Path::new("--quiet"),
            Path::new("--report"),
            &report,
            Path::new("--"),
        ];
        hp_args.extend(native_args);
        let run = as_nobody_with_one_process(&hp_args)
            .map(|mut c| runner::run(&mut c, TIMEOUT).unwrap_or_else(|e| panic!("hotpath: {e}")))
            .expect("arranged above");
        assert_eq!(run.termination, native.termination, "{sample}: exit status");
        assert_eq!(run.stdout, native.stdout, "{sample}: stdout");
        let stderr = String::from_utf8_lossy(&run.stderr);
        let expected: &[&str] = match refused {
            true => &["hotpath: cannot start the monitor thread (Resource temporarily unavailable (os error 11)): the program runs without a profile"],
            false => &[],
        };
        assert_eq!(
            stderr.lines().collect::<Vec<_>>(),
            expected,
            "{sample}: stderr"
        );
        assert_eq!(
            report.exists(),
            !refused,
            "{sample}: a report only with a profile"
        );
    }
}
