//! The loader accepts what the kernel accepts and refuses what it refuses: a corpus of header
//! mutants of real executables (a static and a dynamic build of `hello.c`), made here from a
//! fixed seed, each run natively (a raw `execve`: did the kernel refuse it, with which errno, or
//! how did the program end) and under `hotpath run -q` (a refusal must be one `hotpath: ` line
//! naming the file and a non-zero exit; a run must end as the native one did, output included).
//! A panic, a hang or an "internal error" fails the case. Every hotpath run writes a JSON report,
//! whose symbols come from section headers that may be garbage (best-effort: never an error). Also: a FIFO given as the program, and
//! a hand-made executable whose only segment is shorter than a page.

use std::ffi::CString;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use hotpath_e2e::inputs::Rng;
use hotpath_e2e::runner::{self, Outcome, Termination};
use hotpath_e2e::{compare, guest_build, hotpath_bin, paths, Linkage};

/// Every run (native or hotpath) of one mutant; a run still going after this counts as hung.
const TIMEOUT: Duration = Duration::from_secs(15);

/// The seed of the mutants: the same corpus on every run.
const SEED: u64 = 0x5eed_e1f0_2024_0024;

/// What hotpath prints when it refuses a file after the point where the kernel would already
/// have replaced the process image: it then dies by SIGSEGV, as the process does natively.
const KILLED_AT_EXEC: &str = "the kernel kills the process here";

/// Mutants hotpath refuses although the kernel runs them: (what hotpath's one-line message
/// says, the reason). Such a case passes when hotpath exits with status 126 and that line.
const DOCUMENTED_REFUSALS: &[(&str, &str)] = &[(
    "is over 4 GiB: hotpath cannot place it",
    "PT_LOAD segments spread over more than 4 GiB: hotpath reserves one range for the image, \
     its brk and its code cache, which must be within ±2 GiB of the guest's code",
)];

fn corpus_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| paths::scratch_dir("elf-corpus"))
}

fn write_exe(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// How the kernel dealt with a file given to `execve`.
#[derive(Debug)]
enum Native {
    /// `execve` failed with this errno.
    Refused(i32),
    /// The program ran and ended this way.
    Ran(Outcome),
}

/// Runs `path` natively with a raw `execve` (glibc's `execvp`, which `Command` uses, would
/// hand a file the kernel refuses with ENOEXEC to /bin/sh).
fn run_native(path: &Path) -> Native {
    let file = CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL in path");
    let argv = [file.as_ptr(), std::ptr::null()];
    let envp_strings: Vec<CString> = ["PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C"]
        .iter()
        .map(|s| CString::new(*s).expect("no NUL"))
        .collect();
    let mut envp: Vec<*const libc::c_char> = envp_strings.iter().map(|s| s.as_ptr()).collect();
    envp.push(std::ptr::null());
    let file_addr = file.as_ptr() as usize;
    let argv_addr = argv.as_ptr() as usize;
    let envp_addr = envp.as_ptr() as usize;
    let mut cmd = Command::new(path);
    cmd.current_dir(corpus_dir());
    // SAFETY: between fork and exec the closure only calls setrlimit and execve (both
    // async-signal-safe) on memory prepared before the fork and alive until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::execve(
                file_addr as *const libc::c_char,
                argv_addr as *const *const libc::c_char,
                envp_addr as *const *const libc::c_char,
            );
            Err(std::io::Error::last_os_error())
        });
    }
    for _ in 0..20 {
        match runner::run(&mut cmd, TIMEOUT) {
            Ok(outcome) => return Native::Ran(outcome),
            // Another thread of this test process forked while a mutant was open for writing.
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Native::Refused(e.raw_os_error().unwrap_or(0)),
        }
    }
    Native::Refused(libc::ETXTBSY)
}

fn run_hotpath(path: &Path) -> Outcome {
    let hotpath =
        hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary to test: {e}"));
    // With a report: its symbols come from the section headers, which may be garbage.
    let report = path.with_extension("json");
    let mut cmd = Command::new(&hotpath);
    cmd.args(["run", "-q", "--report"])
        .arg(&report)
        .arg("--")
        .arg(path);
    cmd.env_clear();
    cmd.env("PATH", "/usr/local/bin:/usr/bin:/bin");
    cmd.env("LC_ALL", "C");
    cmd.current_dir(corpus_dir());
    let outcome = runner::run(&mut cmd, TIMEOUT)
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", runner::describe(&cmd)));
    let _ = fs::remove_file(&report);
    outcome
}

/// `Ok` when `exec_arg.c`, which execs `path` and prints the errno if that fails, does the
/// same natively and under hotpath.
fn check_guest_exec(path: &Path) -> Result<(), String> {
    static EXEC_ARG: OnceLock<PathBuf> = OnceLock::new();
    let exec_arg = EXEC_ARG.get_or_init(|| {
        guest_build::build("exec_arg.c", Linkage::Static).unwrap_or_else(|e| panic!("{e}"))
    });
    let arg = path.to_str().expect("a UTF-8 scratch path");
    let mut native = hotpath_e2e::native_command(exec_arg, &[arg]);
    let native = runner::run(&mut native, TIMEOUT).map_err(|e| e.to_string())?;
    let hotpath =
        hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary to test: {e}"));
    let mut translated =
        hotpath_e2e::hotpath_command(&hotpath, hotpath_e2e::MonitorMode::Off, exec_arg, &[arg]);
    let translated = runner::run(&mut translated, TIMEOUT).map_err(|e| e.to_string())?;
    compare::compare_outcomes(&native, &translated)
}

/// `Ok` when hotpath's run of `path` matches the kernel's verdict.
fn check_case(path: &Path, native: &Native, hotpath: &Outcome) -> Result<(), String> {
    let stderr = String::from_utf8_lossy(&hotpath.stderr);
    if stderr.contains("panicked") || stderr.contains("internal error") {
        return Err(format!("hotpath failed badly: {stderr:?}"));
    }
    if let Termination::TimedOut(_) = hotpath.termination {
        return Err("hotpath hung".into());
    }
    let one_line = stderr.ends_with('\n') && stderr.matches('\n').count() == 1;
    let names_file = stderr.contains(&path.display().to_string());
    match native {
        Native::Refused(errno) => {
            let want = if *errno == libc::ENOENT { 127 } else { 126 };
            if hotpath.termination == Termination::Exited(want)
                && hotpath.stdout.is_empty()
                && one_line
                && stderr.starts_with("hotpath: ")
                && names_file
            {
                Ok(())
            } else {
                Err(format!(
                    "the kernel refuses it ({}), hotpath: {}, stderr {stderr:?}",
                    std::io::Error::from_raw_os_error(*errno),
                    hotpath.termination
                ))
            }
        }
        Native::Ran(native) => {
            if let Termination::TimedOut(_) = native.termination {
                return Ok(()); // Nothing to compare with.
            }
            // The kernel failed after the point of no return: no message, death by SIGSEGV.
            let killed_at_exec = native.termination == Termination::Signaled(libc::SIGSEGV)
                && native.stdout.is_empty()
                && native.stderr.is_empty()
                && hotpath.termination == native.termination
                && one_line
                && names_file
                && stderr.contains(KILLED_AT_EXEC);
            if killed_at_exec {
                return Ok(());
            }
            let documented = DOCUMENTED_REFUSALS
                .iter()
                .any(|(message, _)| stderr.contains(message));
            if documented && one_line && hotpath.termination == Termination::Exited(126) {
                return Ok(());
            }
            compare::compare_outcomes(native, hotpath).map_err(|e| {
                format!(
                    "the kernel runs it ({}), hotpath differs:\n{e}",
                    native.termination
                )
            })
        }
    }
}

// ---- The mutants ----

/// One field of a header: byte offset in the file and width in bytes.
#[derive(Clone, Copy)]
struct Field {
    name: &'static str,
    off: usize,
    width: usize,
}

fn get(bytes: &[u8], off: usize, width: usize) -> u64 {
    let mut v = [0u8; 8];
    v[..width].copy_from_slice(&bytes[off..off + width]);
    u64::from_le_bytes(v)
}

fn put(bytes: &mut [u8], off: usize, width: usize, value: u64) {
    bytes[off..off + width].copy_from_slice(&value.to_le_bytes()[..width]);
}

const EHDR_FIELDS: &[Field] = &[
    Field {
        name: "ei_class",
        off: 4,
        width: 1,
    },
    Field {
        name: "ei_data",
        off: 5,
        width: 1,
    },
    Field {
        name: "ei_version",
        off: 6,
        width: 1,
    },
    Field {
        name: "ei_osabi",
        off: 7,
        width: 1,
    },
    Field {
        name: "ei_abiversion",
        off: 8,
        width: 1,
    },
    Field {
        name: "ei_pad",
        off: 9,
        width: 7,
    },
    Field {
        name: "e_type",
        off: 16,
        width: 2,
    },
    Field {
        name: "e_machine",
        off: 18,
        width: 2,
    },
    Field {
        name: "e_version",
        off: 20,
        width: 4,
    },
    Field {
        name: "e_entry",
        off: 24,
        width: 8,
    },
    Field {
        name: "e_phoff",
        off: 32,
        width: 8,
    },
    Field {
        name: "e_shoff",
        off: 40,
        width: 8,
    },
    Field {
        name: "e_flags",
        off: 48,
        width: 4,
    },
    Field {
        name: "e_ehsize",
        off: 52,
        width: 2,
    },
    Field {
        name: "e_phentsize",
        off: 54,
        width: 2,
    },
    Field {
        name: "e_phnum",
        off: 56,
        width: 2,
    },
    Field {
        name: "e_shentsize",
        off: 58,
        width: 2,
    },
    Field {
        name: "e_shnum",
        off: 60,
        width: 2,
    },
    Field {
        name: "e_shstrndx",
        off: 62,
        width: 2,
    },
];

const PHDR_SIZE: usize = 56;
const PHDR_FIELDS: &[Field] = &[
    Field {
        name: "p_type",
        off: 0,
        width: 4,
    },
    Field {
        name: "p_flags",
        off: 4,
        width: 4,
    },
    Field {
        name: "p_offset",
        off: 8,
        width: 8,
    },
    Field {
        name: "p_vaddr",
        off: 16,
        width: 8,
    },
    Field {
        name: "p_paddr",
        off: 24,
        width: 8,
    },
    Field {
        name: "p_filesz",
        off: 32,
        width: 8,
    },
    Field {
        name: "p_memsz",
        off: 40,
        width: 8,
    },
    Field {
        name: "p_align",
        off: 48,
        width: 8,
    },
];

const SHDR_SIZE: usize = 64;
const SHDR_FIELDS: &[Field] = &[
    Field {
        name: "sh_name",
        off: 0,
        width: 4,
    },
    Field {
        name: "sh_type",
        off: 4,
        width: 4,
    },
    Field {
        name: "sh_offset",
        off: 24,
        width: 8,
    },
    Field {
        name: "sh_size",
        off: 32,
        width: 8,
    },
    Field {
        name: "sh_link",
        off: 40,
        width: 4,
    },
    Field {
        name: "sh_entsize",
        off: 56,
        width: 8,
    },
];

const PT_LOAD: u64 = 1;
const PT_INTERP: u64 = 3;
const PF_X: u64 = 1;
const PT_PHDR: u64 = 6;
const PT_GNU_STACK: u64 = 0x6474_e551;
const PT_GNU_PROPERTY: u64 = 0x6474_e553;

/// Values worth trying in a field that holds `orig` in a file of `len` bytes.
fn interesting(rng: &mut Rng, orig: u64, width: usize, len: u64) -> Vec<u64> {
    let max = if width == 8 {
        u64::MAX
    } else {
        (1u64 << (8 * width)) - 1
    };
    let mut v = vec![
        0,
        1,
        max,
        orig.wrapping_add(1) & max,
        orig.wrapping_sub(1) & max,
        orig ^ (1 << rng.below(8 * width as u64)),
        rng.next() & max,
    ];
    if width >= 4 {
        v.extend([
            len & max,
            (orig.wrapping_add(0x1000)) & max,
            0x8000_0000 & max,
        ]);
    }
    v.sort_unstable();
    v.dedup();
    v.retain(|&x| x != orig);
    v
}

/// Picks `n` of `values` (all of them when there are fewer).
fn pick(rng: &mut Rng, mut values: Vec<u64>, n: usize) -> Vec<u64> {
    while values.len() > n {
        let i = rng.below(values.len() as u64) as usize;
        values.swap_remove(i);
    }
    values
}

/// One mutant: how it differs from the file it was made from. Only the differences are kept
/// (every native run forks the test process, whose page tables would otherwise hold a copy
/// of the program per mutant).
struct Mutant {
    name: String,
    /// Its length in bytes.
    len: usize,
    /// `(offset, bytes)` where it differs from the base.
    changes: Vec<(usize, Vec<u8>)>,
}

impl Mutant {
    fn new(name: String, base: &[u8], bytes: &[u8]) -> Mutant {
        let mut changes: Vec<(usize, Vec<u8>)> = Vec::new();
        for (i, &byte) in bytes.iter().enumerate() {
            if base.get(i) == Some(&byte) {
                continue;
            }
            match changes.last_mut() {
                Some((start, run)) if *start + run.len() == i => run.push(byte),
                _ => changes.push((i, vec![byte])),
            }
        }
        Mutant {
            name,
            len: bytes.len(),
            changes,
        }
    }

    fn bytes(&self, base: &[u8]) -> Vec<u8> {
        let mut b = base.to_vec();
        b.resize(self.len, 0);
        for (start, run) in &self.changes {
            b[*start..start + run.len()].copy_from_slice(run);
        }
        b
    }
}

/// The mutants of `base`, the same for the same seed.
fn mutants(base: &[u8], seed: u64, per_field: usize) -> Vec<Mutant> {
    let mut rng = Rng(seed);
    let len = base.len() as u64;
    let mut out = Vec::new();
    let mut with = |name: String, f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = base.to_vec();
        f(&mut b);
        out.push(Mutant::new(name, base, &b));
    };
    // The ELF header: named values first, then values from the generic list.
    let named: &[(&str, &[u64])] = &[
        ("e_phentsize", &[0, 32, 55, 57, 64, 0xffff]),
        ("e_phnum", &[0, 1, 0xffff, 1170, 1171]),
        ("e_phoff", &[0, 1, 63, 65, u64::MAX, u64::MAX - 55]),
        ("e_type", &[0, 1, 3, 4, 0xfe00]),
        ("e_machine", &[0, 3, 183, 0x3e00]),
        ("ei_class", &[0, 1, 3]),
        ("ei_data", &[0, 2]),
    ];
    for field in EHDR_FIELDS {
        let orig = get(base, field.off, field.width);
        let mut values = named
            .iter()
            .find(|(n, _)| *n == field.name)
            .map(|(_, v)| v.to_vec())
            .unwrap_or_default();
        let candidates = interesting(&mut rng, orig, field.width, len);
        values.extend(pick(&mut rng, candidates, per_field));
        values.sort_unstable();
        values.dedup();
        for value in values.into_iter().filter(|&v| v != orig) {
            with(format!("{}={value:#x}", field.name), &|b| {
                put(b, field.off, field.width, value)
            });
        }
    }
    let phoff = get(base, 32, 8) as usize;
    let phnum = get(base, 56, 2) as usize;
    let shoff = get(base, 40, 8) as usize;
    let shnum = get(base, 60, 2) as usize;
    // The entry point moved into each non-executable segment.
    for i in 0..phnum {
        let ph = phoff + i * PHDR_SIZE;
        if get(base, ph, 4) == PT_LOAD && get(base, ph + 4, 4) & PF_X == 0 {
            let vaddr = get(base, ph + 16, 8);
            with(format!("e_entry=phdr{i}.p_vaddr"), &|b| {
                put(b, 24, 8, vaddr)
            });
        }
    }
    // Headers the kernel may read beyond PT_LOAD and PT_INTERP: GNU_PROPERTY (x86 notes),
    // GNU_STACK (the stack's protection), PHDR.
    for i in 0..phnum {
        let ph = phoff + i * PHDR_SIZE;
        let named: &[(&str, usize, usize, &[u64])] = match get(base, ph, 4) {
            PT_GNU_PROPERTY => &[
                ("p_filesz", 32, 8, &[0, 2000, 0x10_0000]),
                ("p_offset", 8, 8, &[0, u64::MAX]),
            ],
            PT_GNU_STACK => &[("p_flags", 4, 4, &[0, 1, 7])],
            PT_PHDR => &[("p_vaddr", 16, 8, &[0, 0x1000_0000])],
            _ => &[],
        };
        for (field, off, width, values) in named {
            for &value in *values {
                with(format!("phdr{i}.{field}={value:#x}"), &|b| {
                    put(b, ph + off, *width, value)
                });
            }
        }
    }
    // Program headers.
    for i in 0..phnum {
        let ph = phoff + i * PHDR_SIZE;
        let p_type = get(base, ph, 4);
        for field in PHDR_FIELDS {
            let orig = get(base, ph + field.off, field.width);
            let mut values = interesting(&mut rng, orig, field.width, len);
            if field.name == "p_type" {
                values.extend([0, 1, 3, 4, 6, 7, 0x6474e551, 0x6474e552, 0x7000_0000]);
                values.sort_unstable();
                values.dedup();
                values.retain(|&x| x != orig);
            }
            if field.name == "p_flags" {
                values = vec![0, 4, 5, 6, 7, orig & !PF_X, orig | PF_X];
                values.retain(|&x| x != orig);
                values.dedup();
            }
            let n = if p_type == PT_LOAD || p_type == PT_INTERP {
                per_field + 1
            } else {
                1
            };
            for value in pick(&mut rng, values, n) {
                with(format!("phdr{i}.{}={value:#x}", field.name), &|b| {
                    put(b, ph + field.off, field.width, value)
                });
            }
        }
    }
    // Section headers: the kernel never reads them.
    if shoff != 0 && shoff + shnum * SHDR_SIZE <= base.len() {
        with("shdrs=zero".into(), &|b| {
            b[shoff..shoff + shnum * SHDR_SIZE].fill(0)
        });
        let noise: Vec<u8> = (0..shnum * SHDR_SIZE).map(|_| rng.next() as u8).collect();
        with("shdrs=noise".into(), &|b| {
            b[shoff..shoff + shnum * SHDR_SIZE].copy_from_slice(&noise)
        });
        with("shdrs=cut".into(), &|b| b.truncate(shoff));
        for _ in 0..per_field * 4 {
            let i = rng.below(shnum as u64) as usize;
            let field = SHDR_FIELDS[rng.below(SHDR_FIELDS.len() as u64) as usize];
            let sh = shoff + i * SHDR_SIZE + field.off;
            let orig = get(base, sh, field.width);
            let candidates = interesting(&mut rng, orig, field.width, len);
            let value = pick(&mut rng, candidates, 1)[0];
            with(format!("shdr{i}.{}={value:#x}", field.name), &|b| {
                put(b, sh, field.width, value)
            });
        }
    }
    // Truncations.
    let mut cuts = vec![0, 4, 16, 63, 64, phoff + 1, phoff + phnum * PHDR_SIZE - 1];
    for i in 0..phnum {
        let ph = phoff + i * PHDR_SIZE;
        if get(base, ph, 4) == PT_LOAD {
            let end = (get(base, ph + 8, 8) + get(base, ph + 32, 8)) as usize;
            cuts.extend([end - 1, end.saturating_sub(0x1000)]);
        }
    }
    for _ in 0..per_field {
        cuts.push(rng.below(len) as usize);
    }
    cuts.sort_unstable();
    cuts.dedup();
    for cut in cuts.into_iter().filter(|&c| c < base.len()) {
        with(format!("truncated-at-{cut:#x}"), &|b| b.truncate(cut));
    }
    out
}

/// The PT_INTERP mutants of a dynamic executable `base`: the path's contents and its header.
fn interp_mutants(base: &[u8]) -> Vec<Mutant> {
    let phoff = get(base, 32, 8) as usize;
    let phnum = get(base, 56, 2) as usize;
    let ph = (0..phnum)
        .map(|i| phoff + i * PHDR_SIZE)
        .find(|&ph| get(base, ph, 4) == PT_INTERP)
        .expect("a dynamic executable has a PT_INTERP");
    let off = get(base, ph + 8, 8) as usize;
    let filesz = get(base, ph + 32, 8) as usize;
    let len = base.len() as u64;
    let mut out = Vec::new();
    let mut with = |name: &str, f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = base.to_vec();
        f(&mut b);
        out.push(Mutant::new(format!("interp-{name}"), base, &b));
    };
    let set_path = |b: &mut Vec<u8>, path: &[u8]| {
        assert!(path.len() < filesz);
        b[off..off + filesz].fill(0);
        b[off..off + path.len()].copy_from_slice(path);
    };
    with("missing", &|b| set_path(b, b"/no/such/ld.so"));
    with("relative-missing", &|b| set_path(b, b"ld-missing.so"));
    with("directory", &|b| set_path(b, b"/tmp"));
    with("text-file", &|b| set_path(b, b"/etc/passwd"));
    with("empty-path", &|b| set_path(b, b""));
    // Other executables as the interpreter (relative to the current directory, where
    // `dynamic_mutants_match_the_kernel` puts copies): the kernel loads any ELF executable
    // there and starts at its entry, without looking at its own PT_INTERP.
    with("static-program", &|b| set_path(b, b"i-static"));
    with("static-pie-program", &|b| set_path(b, b"i-static-pie"));
    with("dynamic-program", &|b| set_path(b, b"i-dynamic"));
    with("current-directory", &|b| set_path(b, b"."));
    with("no-nul", &|b| b[off + filesz - 1] = b'x');
    with("filesz=0", &|b| put(b, ph + 32, 8, 0));
    with("filesz=1", &|b| put(b, ph + 32, 8, 1));
    with("filesz=2", &|b| put(b, ph + 32, 8, 2));
    with("filesz-1", &|b| put(b, ph + 32, 8, filesz as u64 - 1));
    with("filesz+1", &|b| put(b, ph + 32, 8, filesz as u64 + 1));
    with("filesz=4096", &|b| put(b, ph + 32, 8, 4096));
    with("filesz=4097", &|b| put(b, ph + 32, 8, 4097));
    with("filesz=huge", &|b| put(b, ph + 32, 8, 1 << 40));
    with("offset-past-eof", &|b| put(b, ph + 8, 8, len + 16));
    with("offset-at-eof", &|b| {
        put(b, ph + 8, 8, len - filesz as u64 + 1)
    });
    with("offset=0", &|b| put(b, ph + 8, 8, 0));
    with("second-interp-first", &|b| {
        // A PT_INTERP naming a missing file before the real one: the kernel takes the first.
        let note = (0..phnum)
            .map(|i| phoff + i * PHDR_SIZE)
            .find(|&p| get(b, p, 4) == 4)
            .expect("a PT_NOTE");
        let interp: Vec<u8> = b[ph..ph + PHDR_SIZE].to_vec();
        b[note..note + PHDR_SIZE].copy_from_slice(&interp);
        put(b, note + 8, 8, off as u64 + 1);
        put(b, note + 32, 8, filesz as u64 - 1);
    });
    out
}

/// Runs every case natively and under hotpath; returns the report of the mismatches.
fn run_corpus(name: &str, base: &[u8], cases: Vec<Mutant>) -> String {
    let mut problems = String::new();
    let mut refused = 0;
    let mut ran = 0;
    let total = cases.len();
    for (i, mutant) in cases.into_iter().enumerate() {
        let case = &mutant.name;
        let path = corpus_dir().join(format!("{name}-{i:03}"));
        write_exe(&path, &mutant.bytes(base));
        let native = run_native(&path);
        let hotpath = run_hotpath(&path);
        match &native {
            Native::Refused(_) => refused += 1,
            Native::Ran(_) => ran += 1,
        }
        if let Err(e) = check_case(&path, &native, &hotpath) {
            let _ = writeln!(problems, "{name} case {i} ({case}): {e}");
        }
        if let Native::Refused(_) = native {
            // A translated guest's execve of it must fail with the kernel's errno.
            if let Err(e) = check_guest_exec(&path) {
                let _ = writeln!(problems, "{name} case {i} ({case}), exec'd by a guest: {e}");
            }
        }
        let _ = fs::remove_file(&path);
    }
    eprintln!("{name}: {total} mutants, {refused} refused by the kernel, {ran} run");
    problems
}

fn base_bytes(linkage: Linkage) -> Vec<u8> {
    let exe = guest_build::build("hello.c", linkage).unwrap_or_else(|e| panic!("{e}"));
    fs::read(&exe).unwrap_or_else(|e| panic!("reading {}: {e}", exe.display()))
}

#[test]
fn static_mutants_match_the_kernel() {
    let base = base_bytes(Linkage::Static);
    let problems = run_corpus("static", &base, mutants(&base, SEED, 2));
    assert!(
        problems.is_empty(),
        "hotpath differs from the kernel:\n{problems}"
    );
}

#[test]
fn dynamic_mutants_match_the_kernel() {
    let base = base_bytes(Linkage::Dynamic);
    for (name, linkage) in [
        ("i-static", Linkage::Static),
        ("i-static-pie", Linkage::StaticPie),
        ("i-dynamic", Linkage::Dynamic),
    ] {
        write_exe(&corpus_dir().join(name), &base_bytes(linkage));
    }
    let mut cases = interp_mutants(&base);
    cases.extend(mutants(&base, SEED ^ 1, 1));
    let problems = run_corpus("dynamic", &base, cases);
    assert!(
        problems.is_empty(),
        "hotpath differs from the kernel:\n{problems}"
    );
}

/// A static (`ET_EXEC`) program whose PT_INTERP names a static program at the same addresses:
/// the kernel maps the interpreter over the program and starts it (hotpath once refused with
/// "cannot map ... File exists"). The PT_NOTE header becomes the PT_INTERP, its path written
/// over the note's bytes.
#[test]
fn static_interpreter_over_a_static_program_matches_the_kernel() {
    let base = base_bytes(Linkage::Static);
    write_exe(&corpus_dir().join("i-static"), &base);
    let phoff = get(&base, 32, 8) as usize;
    let phnum = get(&base, 56, 2) as usize;
    let note = (0..phnum)
        .map(|i| phoff + i * PHDR_SIZE)
        .find(|&p| get(&base, p, 4) == 4)
        .expect("a PT_NOTE");
    let off = get(&base, note + 8, 8) as usize;
    let mut b = base.clone();
    let path = b"i-static\0";
    b[off..off + path.len()].copy_from_slice(path);
    put(&mut b, note, 4, PT_INTERP);
    put(&mut b, note + 32, 8, path.len() as u64);
    put(&mut b, note + 40, 8, path.len() as u64);
    let cases = vec![Mutant::new("static-interp-over-program".into(), &base, &b)];
    let problems = run_corpus("static-interp", &base, cases);
    assert!(
        problems.is_empty(),
        "hotpath differs from the kernel:\n{problems}"
    );
}

/// `execve` of a FIFO fails with EACCES; opening it to read its header would wait for a writer.
#[test]
fn fifo_is_refused() {
    let path = corpus_dir().join("a-fifo");
    let c = CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL");
    // SAFETY: mkfifo reads a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o755) }, 0, "mkfifo");
    let native = run_native(&path);
    assert!(
        matches!(native, Native::Refused(libc::EACCES)),
        "{native:?}"
    );
    let hotpath = run_hotpath(&path);
    check_case(&path, &native, &hotpath).unwrap_or_else(|e| panic!("{e}"));
}

/// One PT_LOAD of a hand-made executable: `(p_flags, p_offset, p_vaddr, p_filesz, p_memsz)`.
type TinySegment = (u32, u64, u64, u64, u64);

/// Where the hand-made executables map file offset 0.
const TINY_BASE: u64 = 0x40_0000;

/// A hand-made static executable: the ELF header, `segments.len()` program headers, then the
/// code, `write(1, "tiny\n", 5); exit(7)`, which must be mapped at `TINY_BASE` + its offset.
/// `segments` gets the file's total size, to say how much of it each segment maps.
fn tiny_elf(segments: impl Fn(u64) -> Vec<TinySegment>) -> Vec<u8> {
    #[rustfmt::skip]
    let mut code: Vec<u8> = vec![
        0xb8, 1, 0, 0, 0,                   // mov eax, 1 (write)
        0xbf, 1, 0, 0, 0,                   // mov edi, 1
        0x48, 0x8d, 0x35, 0x10, 0, 0, 0,    // lea rsi, [rip+16] (the text)
        0xba, 5, 0, 0, 0,                   // mov edx, 5
        0x0f, 0x05,                         // syscall
        0xb8, 60, 0, 0, 0,                  // mov eax, 60 (exit)
        0xbf, 7, 0, 0, 0,                   // mov edi, 7
        0x0f, 0x05,                         // syscall
    ];
    code.extend(b"tiny\n");
    let phnum = segments(0).len() as u64;
    let code_off = 64 + 56 * phnum;
    let total = code_off + code.len() as u64;
    let segments = segments(total);
    let mut f = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
    f.resize(16, 0);
    let fields: [(usize, u64); 13] = [
        (2, 2),                    // e_type: ET_EXEC
        (2, 62),                   // e_machine: EM_X86_64
        (4, 1),                    // e_version
        (8, TINY_BASE + code_off), // e_entry
        (8, 64),                   // e_phoff
        (8, 0),                    // e_shoff
        (4, 0),                    // e_flags
        (2, 64),                   // e_ehsize
        (2, 56),                   // e_phentsize
        (2, phnum),                // e_phnum
        (2, 64),                   // e_shentsize
        (2, 0),                    // e_shnum
        (2, 0),                    // e_shstrndx
    ];
    for (width, v) in fields {
        f.extend(&v.to_le_bytes()[..width]);
    }
    for (flags, offset, vaddr, filesz, memsz) in segments {
        f.extend(1u32.to_le_bytes()); // PT_LOAD
        f.extend(flags.to_le_bytes());
        for v in [offset, vaddr, vaddr, filesz, memsz, 0x1000] {
            f.extend(v.to_le_bytes());
        }
    }
    assert_eq!(f.len() as u64, code_off);
    f.extend(code);
    f
}

const R: u32 = 4;
const RW: u32 = 6;
const RX: u32 = 5;
const RWX: u32 = 7;

/// Hand-made executables whose segments are shorter than a page, run natively and under
/// hotpath: the code alone, with zero-filled memory after it, a data segment on the next page
/// or on the code's own page (which replaces the code's mapping: natively it then faults at
/// its first instruction), segments that run past the end of the file, a writable one.
#[test]
fn segments_shorter_than_a_page() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("rx", tiny_elf(|t| vec![(RX, 0, TINY_BASE, t, t)])),
        (
            "rx-bss-100",
            tiny_elf(|t| vec![(RX, 0, TINY_BASE, t, t + 100)]),
        ),
        (
            "rx-bss-page",
            tiny_elf(|t| vec![(RX, 0, TINY_BASE, t, t + 0x1000)]),
        ),
        (
            "rx-bss-3-pages",
            tiny_elf(|t| vec![(RX, 0, TINY_BASE, t, t + 0x3000)]),
        ),
        ("rwx", tiny_elf(|t| vec![(RWX, 0, TINY_BASE, t, t + 0x10)])),
        (
            "rx-then-rw-next-page",
            tiny_elf(|t| {
                vec![
                    (RX, 0, TINY_BASE, t, t),
                    (RW, 0, TINY_BASE + 0x1000, t, t + 0x2000),
                ]
            }),
        ),
        (
            "rx-then-rw-same-page",
            tiny_elf(|t| vec![(RX, 0, TINY_BASE, t, t), (RW, 0x40, TINY_BASE + 0x40, 8, 8)]),
        ),
        (
            "rx-then-r-same-page-bss",
            tiny_elf(|t| {
                vec![
                    (RX, 0, TINY_BASE, t, t),
                    (R, 0x40, TINY_BASE + 0x40, 8, 0x20),
                ]
            }),
        ),
        (
            "rx-past-eof-in-page",
            tiny_elf(|t| vec![(RX, 0, TINY_BASE, t + 0x800, t + 0x800)]),
        ),
        (
            "rx-past-eof-pages",
            tiny_elf(|t| vec![(RX, 0, TINY_BASE, t + 0x2000, t + 0x2000)]),
        ),
        (
            "rw-past-eof-bss",
            tiny_elf(|t| {
                vec![
                    (RX, 0, TINY_BASE, t, t),
                    (RW, 0, TINY_BASE + 0x1000, t + 0x1800, t + 0x2000),
                ]
            }),
        ),
    ];
    let mut problems = String::new();
    for (name, bytes) in cases {
        let path = corpus_dir().join(format!("tiny-{name}"));
        write_exe(&path, &bytes);
        let native = run_native(&path);
        if let Native::Refused(e) = &native {
            let _ = writeln!(
                problems,
                "{name}: the kernel refuses it (errno {e}): a bad case"
            );
            continue;
        }
        let hotpath = run_hotpath(&path);
        if let Native::Ran(n) = &native {
            eprintln!(
                "{name}: natively {}, hotpath {}",
                n.termination, hotpath.termination
            );
        }
        if let Err(e) = check_case(&path, &native, &hotpath) {
            let _ = writeln!(problems, "{name}: {e}");
        }
    }
    assert!(problems.is_empty(), "{problems}");
}

/// A program whose `PT_GNU_STACK` asks for an executable stack (`-z execstack`) runs code on
/// its stack natively, so it must under hotpath too (`nonexec.c`'s "stack call" returns
/// instead of faulting; its other cases still fault).
#[test]
fn executable_stack_runs_stack_code() {
    for linkage in [Linkage::Static, Linkage::Dynamic] {
        let exe = corpus_dir().join(format!("nonexec-execstack.{linkage}"));
        let out = Command::new("gcc")
            .args(guest_build::gcc_args("nonexec.c", linkage))
            .args(["-z", "execstack", "-o"])
            .arg(&exe)
            .arg(paths::samples_dir().join("nonexec.c"))
            .output()
            .expect("gcc runs");
        assert!(
            out.status.success(),
            "gcc -z execstack failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (native, verdict) = hotpath_e2e::compare_with_native(&exe, &[], corpus_dir());
        let stdout = String::from_utf8_lossy(&native.stdout);
        assert!(
            stdout.contains("stack call: no fault") && stdout.contains("heap call: sig=11"),
            "the native run is not what this test is for:\n{stdout}"
        );
        verdict.unwrap_or_else(|e| panic!("{linkage}: {e}"));
    }
}

/// A position-independent program whose segments ask for 4 MiB alignment is loaded at a
/// multiple of it, natively and under hotpath (static-pie and dynamic).
#[test]
fn load_bias_follows_p_align() {
    for linkage in [Linkage::StaticPie, Linkage::Dynamic] {
        let exe = corpus_dir().join(format!("load_align.{linkage}"));
        let out = Command::new("gcc")
            .args(guest_build::gcc_args("load_align.c", linkage))
            .args(["-Wl,-z,max-page-size=0x400000", "-o"])
            .arg(&exe)
            .arg(paths::samples_dir().join("load_align.c"))
            .output()
            .expect("gcc runs");
        assert!(
            out.status.success(),
            "gcc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (native, verdict) = hotpath_e2e::compare_with_native(&exe, &[], corpus_dir());
        assert_eq!(
            String::from_utf8_lossy(&native.stdout),
            "base aligned to 4 MiB: yes\n",
            "the native run is not what this test is for"
        );
        verdict.unwrap_or_else(|e| panic!("{linkage}: {e}"));
    }
}

/// A `#!` script is refused as its interpreter is: a guest's execve of a script whose
/// interpreter the kernel refuses (a bad `e_phentsize`: ENOEXEC), is missing (ENOENT) or is
/// six levels of scripts deep (ELOOP) fails with the kernel's errno under hotpath too, instead
/// of starting a hotpath that exits 126; a script whose interpreter runs, runs.
#[test]
fn scripts_are_refused_as_their_interpreters_are() {
    let mut bad = base_bytes(Linkage::Static);
    put(&mut bad, 0x36, 2, 0); // e_phentsize
    let bad_path = corpus_dir().join("script-interp-bad-phentsize");
    write_exe(&bad_path, &bad);
    let good_path = corpus_dir().join("script-interp-good");
    write_exe(&good_path, &base_bytes(Linkage::Static));
    let script = |name: &str, interp: &Path| {
        let path = corpus_dir().join(name);
        write_exe(&path, format!("#!{}\n", interp.display()).as_bytes());
        path
    };
    let mut cases = vec![
        script("script-bad-interp", &bad_path),
        script(
            "script-missing-interp",
            &corpus_dir().join("no-such-interpreter"),
        ),
        script("script-good-interp", &good_path),
    ];
    // The kernel follows five levels of scripts; a sixth is ELOOP.
    let mut chain = good_path.clone();
    for level in 1..=6 {
        chain = script(&format!("script-chain-{level}"), &chain);
        if level >= 5 {
            cases.push(chain.clone());
        }
    }
    let problems: Vec<String> = cases
        .iter()
        .filter_map(|p| {
            check_guest_exec(p)
                .err()
                .map(|e| format!("{}: {e}", p.display()))
        })
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
