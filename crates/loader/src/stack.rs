//! The guest's initial stack: argc, argv, envp and the auxiliary vector, as the kernel lays
//! them out for a new x86-64 process (System V ABI, §3.4.1).

use std::ffi::{c_void, OsString};

use crate::{Image, LoadError};

/// Size of the guest's stack mapping in bytes when RLIMIT_STACK cannot be read (8 MiB, the
/// usual limit).
pub const STACK_SIZE: u64 = 8 << 20;

/// Largest stack mapping in bytes (1 GiB), for an unlimited or larger RLIMIT_STACK: the
/// mapping is made whole up front (MAP_NORESERVE, pages come as they are touched), where the
/// kernel grows the stack a page at a time until it meets another mapping.
const STACK_MAX: u64 = 1 << 30;

/// Smallest stack mapping in bytes (128 KiB, the kernel's floor for the argument strings'
/// room).
const STACK_MIN: u64 = 128 << 10;

/// Size of the guest's stack mapping in bytes: the soft RLIMIT_STACK hotpath was started
/// with (what bounds the stack's growth natively), page-rounded and kept within
/// [`STACK_MIN`]..=[`STACK_MAX`].
pub fn stack_size() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut r) } != 0 {
        return STACK_SIZE;
    }
    crate::page_ceil(r.rlim_cur.clamp(STACK_MIN, STACK_MAX))
}

/// Inaccessible bytes below the stack (1 MiB, the kernel's default stack guard gap), so a
/// guest that overflows its stack faults as it would natively instead of writing into
/// whatever hotpath mapped below it.
pub const STACK_GUARD: u64 = 1 << 20;

/// The guest's stack, ready for the entry point.
#[derive(Clone, Copy, Debug)]
pub struct GuestStack {
    /// Lowest address of the stack mapping.
    pub base: u64,
    /// Size of the mapping in bytes.
    pub size: u64,
    /// Initial RSP: points at argc, 16-byte aligned.
    pub rsp: u64,
    /// Guest address range `[start, end)` of the argv strings (what `/proc/self/cmdline`
    /// shows: the kernel's `arg_start`/`arg_end`).
    pub args: (u64, u64),
    /// Guest address range `[start, end)` of the environment strings (`env_start`/`env_end`).
    pub env: (u64, u64),
    /// Guest address range `[start, end)` of the auxiliary vector, AT_NULL pair included
    /// (what `/proc/self/auxv` and `PR_GET_AUXV` show).
    pub auxv: (u64, u64),
}

// Auxiliary vector keys (linux/auxvec.h).
const AT_NULL: u64 = 0;
const AT_SYSINFO_EHDR: u64 = 33;
const AT_PHDR: u64 = 3;
const AT_PHENT: u64 = 4;
const AT_PHNUM: u64 = 5;
const AT_PAGESZ: u64 = 6;
const AT_BASE: u64 = 7;
const AT_FLAGS: u64 = 8;
const AT_ENTRY: u64 = 9;
const AT_UID: u64 = 11;
const AT_EUID: u64 = 12;
const AT_GID: u64 = 13;
const AT_EGID: u64 = 14;
const AT_PLATFORM: u64 = 15;
const AT_HWCAP: u64 = 16;
const AT_CLKTCK: u64 = 17;
const AT_SECURE: u64 = 23;
const AT_RANDOM: u64 = 25;
const AT_HWCAP2: u64 = 26;
const AT_EXECFN: u64 = 31;
const AT_RSEQ_FEATURE_SIZE: u64 = 27;
const AT_RSEQ_ALIGN: u64 = 28;
const AT_MINSIGSTKSZ: u64 = 51;

/// Writes strings and words downward from the top of the stack.
struct StackWriter {
    sp: u64,
}

impl StackWriter {
    fn push_bytes(&mut self, bytes: &[u8]) -> u64 {
        self.sp -= bytes.len() as u64;
        // SAFETY: `sp` stays inside the freshly mapped, writable stack (sizes are checked by
        // the caller against the stack's size).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.sp as *mut u8, bytes.len()) };
        self.sp
    }

    fn push_cstr(&mut self, s: &[u8]) -> u64 {
        self.push_bytes(&[0]);
        if !s.is_empty() {
            self.push_bytes(s);
        }
        self.sp
    }
}

/// Maps a fresh stack and lays out argc, argv, envp and auxv for `image`.
///
/// `argv[0]` is what the guest sees as its name; `execfn` is AT_EXECFN (the path as given);
/// `vdso` is AT_SYSINFO_EHDR, the guest address of a vDSO's ELF header (none when `None`).
///
/// # Errors
/// [`LoadError::Map`] if the stack cannot be mapped, or the strings do not fit in it.
pub fn build_stack(
    image: &Image,
    argv: &[OsString],
    envp: &[OsString],
    execfn: &str,
    vdso: Option<u64>,
) -> Result<GuestStack, LoadError> {
    let size = stack_size();
    let map_err = |reason: String| LoadError::Map {
        path: image.path.clone(),
        addr: 0,
        len: size,
        reason,
    };
    let strings: usize =
        argv.iter().chain(envp).map(|s| s.len() + 1).sum::<usize>() + execfn.len() + 64;
    if strings as u64 > size / 4 {
        return Err(map_err("argument list too long".into()));
    }
    // SAFETY: a fresh anonymous mapping owned by the guest: a guard gap, then the stack.
    let guard = unsafe {
        libc::mmap(
            std::ptr::null_mut::<c_void>(),
            (STACK_GUARD + size) as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if guard == libc::MAP_FAILED {
        return Err(map_err(std::io::Error::last_os_error().to_string()));
    }
    let base = guard as u64 + STACK_GUARD;
    // SAFETY: the stack part of the mapping just made.
    if unsafe {
        libc::mprotect(
            base as *mut c_void,
            size as usize,
            // Executable only where the program asks for it (PT_GNU_STACK), as natively.
            libc::PROT_READ | libc::PROT_WRITE | if image.exec_stack { libc::PROT_EXEC } else { 0 },
        )
    } != 0
    {
        return Err(map_err(std::io::Error::last_os_error().to_string()));
    }
    let mut w = StackWriter {
        sp: base + size - 8,
    };
    let execfn_addr = w.push_cstr(execfn.as_bytes());
    let mut env_addrs: Vec<u64> = envp
        .iter()
        .rev()
        .map(|s| w.push_cstr(s.as_encoded_bytes()))
        .collect();
    env_addrs.reverse();
    let mut arg_addrs: Vec<u64> = argv
        .iter()
        .rev()
        .map(|s| w.push_cstr(s.as_encoded_bytes()))
        .collect();
    arg_addrs.reverse();
    let args_start = w.sp;
    let env_start = env_addrs.first().copied().unwrap_or(execfn_addr);
    let platform = w.push_cstr(b"x86_64");
    let mut random = [0u8; 16];
    // SAFETY: getrandom writes at most 16 bytes into our buffer.
    let got = unsafe { libc::getrandom(random.as_mut_ptr() as *mut c_void, 16, 0) };
    if got != 16 {
        random = (std::process::id() as u128 * 0x9e37_79b9_7f4a_7c15).to_le_bytes();
    }
    let random_addr = w.push_bytes(&random);
    w.sp &= !15;

    // The kernel's values, from hotpath's own auxv: glibc's getauxval(AT_HWCAP) on x86-64 is
    // not the kernel's word but glibc's own HWCAP_X86_* bits.
    let kernel_auxv = std::fs::read("/proc/self/auxv").unwrap_or_default();
    let host = |key: u64| {
        let pairs = kernel_auxv.chunks_exact(16).map(|p| {
            let word = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().unwrap());
            (word(0), word(8))
        });
        let mut pairs = pairs.take_while(|&(k, _)| k != AT_NULL);
        match pairs.find(|&(k, _)| k == key) {
            Some((_, v)) => v,
            // SAFETY: getauxval has no preconditions.
            None if kernel_auxv.is_empty() => unsafe { libc::getauxval(key) },
            None => 0,
        }
    };
    // SAFETY: the id getters have no preconditions.
    let (uid, euid, gid, egid) = unsafe {
        (
            libc::getuid(),
            libc::geteuid(),
            libc::getgid(),
            libc::getegid(),
        )
    };
    // In the kernel's order (create_elf_tables: ARCH_DLINFO first).
    let mut auxv: Vec<(u64, u64)> = Vec::new();
    if let Some(ehdr) = vdso {
        auxv.push((AT_SYSINFO_EHDR, ehdr));
    }
    let minsig = host(AT_MINSIGSTKSZ);
    if minsig != 0 {
        auxv.push((AT_MINSIGSTKSZ, minsig));
    }
    auxv.extend([
        (AT_HWCAP, host(AT_HWCAP)),
        (AT_PAGESZ, crate::PAGE_SIZE),
        (AT_CLKTCK, host(AT_CLKTCK).max(1)),
        (AT_PHDR, image.phdr),
        (AT_PHENT, image.phent),
        (AT_PHNUM, image.phnum),
        (
            AT_BASE,
            image.interpreter.as_ref().map_or(0, |i| i.load_bias),
        ),
        (AT_FLAGS, 0),
        (AT_ENTRY, image.entry),
        (AT_UID, uid as u64),
        (AT_EUID, euid as u64),
        (AT_GID, gid as u64),
        (AT_EGID, egid as u64),
        (AT_SECURE, 0),
        (AT_RANDOM, random_addr),
        (AT_HWCAP2, host(AT_HWCAP2)),
        (AT_EXECFN, execfn_addr),
        (AT_PLATFORM, platform),
    ]);
    // rseq's size and alignment, as the host kernel reports them (the guest's rseq
    // registration itself is refused: see the translator's syscall table).
    for key in [AT_RSEQ_FEATURE_SIZE, AT_RSEQ_ALIGN] {
        let v = host(key);
        if v != 0 {
            auxv.push((key, v));
        }
    }
    auxv.push((AT_NULL, 0));

    let auxv_bytes = 16 * auxv.len() as u64;
    let words = 1 + arg_addrs.len() + 1 + env_addrs.len() + 1 + 2 * auxv.len();
    let mut table: Vec<u64> = Vec::with_capacity(words);
    table.push(argv.len() as u64);
    table.extend(&arg_addrs);
    table.push(0);
    table.extend(&env_addrs);
    table.push(0);
    for (k, v) in auxv {
        table.push(k);
        table.push(v);
    }
    let mut rsp = (w.sp - 8 * table.len() as u64) & !15;
    let start = rsp;
    let auxv_start = start + 8 * (table.len() as u64 - 2 * (auxv_bytes / 16));
    for word in table {
        // SAFETY: inside the stack mapping, below the strings.
        unsafe { (rsp as *mut u64).write(word) };
        rsp += 8;
    }
    Ok(GuestStack {
        base,
        size,
        rsp: start,
        args: (args_start, env_start),
        env: (env_start, execfn_addr),
        auxv: (auxv_start, auxv_start + auxv_bytes),
    })
}
