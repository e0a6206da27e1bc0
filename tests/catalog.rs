//! The guest samples: which source, which arguments, and how each run must end natively.

use std::fmt;

/// How a sample is linked. Every sample is built and tested statically both ways; C samples
/// are also built dynamically (see [`Sample::linkages`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Linkage {
    /// `-static`: an ET_EXEC at a fixed address.
    Static,
    /// `-static-pie`: an ET_DYN that relocates itself, loaded at a random base.
    StaticPie,
    /// Plain `gcc` (Debian's default, a PIE): an ET_DYN with a `PT_INTERP`, so ld.so loads it,
    /// glibc's shared objects and their ifunc, TLS and lazy-binding machinery.
    Dynamic,
}

impl Linkage {
    /// The two static linkages, which every sample is built with. The tests of exact counts,
    /// paths and reports loop over these only: a dynamic build adds ld.so's and the shared
    /// libraries' blocks to every count. (Named before [`Linkage::Dynamic`] existed; it is the
    /// same list as [`Linkage::STATIC`].)
    pub const ALL: [Linkage; 2] = Linkage::STATIC;

    /// The self-contained linkages: nothing but the executable is mapped at start.
    pub const STATIC: [Linkage; 2] = [Linkage::Static, Linkage::StaticPie];

    /// Every linkage a C sample is built with.
    pub const WITH_DYNAMIC: [Linkage; 3] = [Linkage::Static, Linkage::StaticPie, Linkage::Dynamic];

    /// The linkage's name: the suffix of the built file's name, and for the static linkages
    /// also the gcc flag (`-static`, `-static-pie`).
    pub fn flag(self) -> &'static str {
        match self {
            Linkage::Static => "static",
            Linkage::StaticPie => "static-pie",
            Linkage::Dynamic => "dynamic",
        }
    }

    /// The gcc flag that selects the linkage; none for [`Linkage::Dynamic`], gcc's default.
    pub fn gcc_flag(self) -> Option<&'static str> {
        match self {
            Linkage::Static => Some("-static"),
            Linkage::StaticPie => Some("-static-pie"),
            Linkage::Dynamic => None,
        }
    }
}

impl fmt::Display for Linkage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.flag())
    }
}

/// How the native run ends (hotpath must end the same way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Normal exit with this status.
    Exit(i32),
    /// Killed by this signal number.
    Signal(i32),
}

/// One guest program run: `source` (in `guest-samples/`) run with `args`.
/// Several samples may share a source and differ in their arguments.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Test name: a Rust identifier, and the stem of the files in `guest-samples/expected/`.
    pub name: &'static str,
    /// File name in `guest-samples/`: `.c` (linked with glibc) or `.S` (freestanding).
    pub source: &'static str,
    /// Arguments after the program path.
    pub args: &'static [&'static str],
    pub expect: Expected,
    /// Whether the native output is the same on every machine, so it is checked against
    /// `guest-samples/expected/<name>.{stdout,stderr}`. Machine-dependent samples are only
    /// compared between the native and the hotpath run.
    pub golden: bool,
    /// What a wrong translation would break, in a few words.
    pub checks: &'static str,
    /// What hotpath must do with it: behave as natively, or refuse it (for now) with a message.
    pub under_hotpath: UnderHotpath,
}

impl Sample {
    /// The linkages the sample is built and tested with. C samples: static, static-pie and
    /// dynamic (the same program started by ld.so, with glibc's shared objects; expected files
    /// are shared). Freestanding `.S` samples only the two static ones: they define `_start`,
    /// use no library, so ld.so would have nothing to load, and several check the state the
    /// kernel leaves at entry (zeroed registers, FS base 0) that ld.so changes before jumping
    /// to `_start`.
    pub fn linkages(&self) -> &'static [Linkage] {
        if self.source.ends_with(".S") {
            &Linkage::STATIC
        } else {
            &Linkage::WITH_DYNAMIC
        }
    }
}

/// What a hotpath run of a sample must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnderHotpath {
    /// Exactly what the native run did: same stdout, stderr and exit status or signal.
    SameAsNative,
    /// hotpath does not support what the sample does yet: it must refuse with exit status 1,
    /// no output on stdout and a single stderr line `hotpath: ...` containing this text (never
    /// a crash, a hang or a silent misbehaviour). The native run is still checked against the
    /// expected files, so the sample stays ready for when the feature lands.
    Unsupported(&'static str),
}

const fn sample(
    name: &'static str,
    source: &'static str,
    args: &'static [&'static str],
    expect: Expected,
    checks: &'static str,
) -> Sample {
    Sample {
        name,
        source,
        args,
        expect,
        golden: true,
        checks,
        under_hotpath: UnderHotpath::SameAsNative,
    }
}

/// A sample hotpath must refuse for now with a one-line message containing `message`.
const fn unsupported(
    name: &'static str,
    source: &'static str,
    message: &'static str,
    checks: &'static str,
) -> Sample {
    Sample {
        name,
        source,
        args: &[],
        expect: Expected::Exit(0),
        golden: true,
        checks,
        under_hotpath: UnderHotpath::Unsupported(message),
    }
}

/// A sample whose output describes the machine: no expected files.
const fn machine_dependent(
    name: &'static str,
    source: &'static str,
    checks: &'static str,
) -> Sample {
    Sample {
        name,
        source,
        args: &[],
        expect: Expected::Exit(0),
        golden: false,
        checks,
        under_hotpath: UnderHotpath::SameAsNative,
    }
}

use Expected::{Exit, Signal};

/// Every sample the `samples` test runs. The CPU-bound `bench_*` samples run here with small
/// arguments (milliseconds natively); `bench/run.sh` runs them with their default sizes.
#[rustfmt::skip]
pub const SAMPLES: &[Sample] = &[
    sample("hello", "hello.c", &[], Exit(0),
        "the smallest libc program"),
    sample("loops", "loops.c", &[], Exit(0),
        "nested loops of every shape, integer arithmetic, SSE vectorised code"),
    sample("jumptable", "jumptable.c", &[], Exit(0),
        "a switch compiled to an indirect jmp through a jump table"),
    sample("funcptr_qsort", "funcptr_qsort.c", &[], Exit(0),
        "indirect calls, qsort/bsearch calling back into the program"),
    sample("recursion", "recursion.c", &[], Exit(0),
        "100 000-deep recursion, Ackermann: call/return and rsp exactness"),
    sample("fp_printf", "fp_printf.c", &[], Exit(0),
        "double/float/x87 arithmetic, printf %f %e %g %a, libm ifuncs"),
    sample("x87_state", "x87_state.c", &[], Exit(0),
        "x87 control word, exception flags, register stack, MMX and MXCSR kept across system \
         calls (round trips through the dispatcher), each used by arithmetic after the call"),
    sample("strings", "strings.c", &[], Exit(0),
        "glibc's AVX2/EVEX string functions on all sizes and alignments"),
    sample("setjmp", "setjmp.c", &[], Exit(0),
        "setjmp/longjmp (pointer guard via %fs:0x30), sigsetjmp masks"),
    sample("malloc", "malloc.c", &[], Exit(0),
        "heap churn: brk and mmap-backed chunks, realloc, calloc"),
    sample("exit_return", "exit_return.c", &[], Exit(42),
        "exit status from main's return value"),
    sample("exit_call", "exit_call.c", &[], Exit(3),
        "exit() from deep in the stack, atexit handlers, stdio flush"),
    sample("stderr_out", "stderr_out.c", &[], Exit(5),
        "output on both stdout and stderr, perror, raw write(2)"),
    sample("args_env", "args_env.c",
        &["alpha", "two words", "", "--not-an-option", "-x", "\u{fc}nic\u{f6}de"], Exit(0),
        "argv (incl. empty and option-like arguments), environment, auxv, /proc/self/exe"),
    sample("abort", "abort.c", &[], Signal(libc::SIGABRT),
        "death by SIGABRT from abort()"),
    sample("segv", "segv.c", &[], Signal(libc::SIGSEGV),
        "death by SIGSEGV from a null store"),
    sample("signal_handler", "signal_handler.c", &[], Exit(0),
        "guest signal handlers, SA_SIGINFO, masks (delivery exactly at unblock), SA_NODEFER, \
         SA_RESETHAND, sigaltstack"),
    sample("signal_async", "signal_async.c", &[], Exit(0),
        "SIGALRM/SIGVTALRM timers interrupting a spin loop, kill loops, nested delivery, \
         EINTR from read and nanosleep"),
    sample("signal_sigsuspend", "signal_async.c", &["sigsuspend"], Exit(0),
        "sigsuspend runs the handler of the signal that ends it, under the temporary mask"),
    sample("signal_rt_queue", "signal_async.c", &["rt-queue"], Exit(0),
        "blocked real-time signals queue with their values; order of delivery at unblock"),
    sample("signal_restart", "signal_async.c", &["restart"], Exit(0),
        "a blocking read restarted after an SA_RESTART handler"),
    sample("signal_dead_regs", "signal_dead_regs.c", &[], Exit(0),
        "timer signals in a loop whose blocks start by overwriting a register: the handler's \
         context never shows the register the enqueue stub borrowed"),
    sample("signal_fault", "signal_fault.c", &[], Exit(0),
        "SIGSEGV/SIGILL/SIGFPE/SIGTRAP at the guest instruction: si_addr, si_code, REG_RIP; \
         handlers that siglongjmp or edit the ucontext and return"),
    sample("nonexec", "nonexec.c", &[], Exit(0),
        "only executable code runs: a call, jump or fall-through into .rodata, .data, the heap, \
         the stack, a page made PROT_READ/PROT_NONE after it ran, or an instruction running \
         into a read-only page faults with SEGV_ACCERR at the fetch address, REG_RIP, RSP and \
         the pushed return address as natively"),
    sample("signal_overflow", "signal_fault.c", &["overflow"], Exit(0),
        "a stack overflow caught by an SA_ONSTACK handler on the alternate stack"),
    sample("stack_overflow", "signal_fault.c", &["overflow-uncaught"], Signal(libc::SIGSEGV),
        "death by SIGSEGV from a stack overflow with no handler"),
    sample("sigterm_self", "sigterm_self.c", &[], Signal(libc::SIGTERM),
        "death by an uncaught SIGTERM sent to itself, after flushed output"),
    sample("fork_wait", "fork_wait.c", &[], Exit(0),
        "fork, waitpid by pid, exit statuses, children killed by signals, vfork, wait4, \
         copy-on-write, inherited stdio buffers"),
    sample("fork_kill_paused", "fork_wait.c", &["kill-paused"], Exit(0),
        "SIGTERM reaching a child as it enters pause()"),
    sample("fork_exec", "fork_exec.c", &[], Exit(0),
        "fork + execve of /bin/echo, a failing exec, execvp, /bin/sh, /proc/self/exe"),
    sample("fork_exec_kill_early", "fork_exec.c", &["kill-early"], Exit(0),
        "SIGTERM reaching a child before, during or just after its execve: it dies of it"),
    sample("fork_loop", "fork_loop.c", &[], Exit(0),
        "a loop of forks, each child running code the parent never runs: the later children \
         find the first one's translations in the cache"),
    sample("sigchld", "sigchld.c", &[], Exit(0),
        "a SIGCHLD handler reaping and counting children; CLD_STOPPED/CONTINUED/EXITED"),
    sample("sigchld_sigsuspend", "sigchld.c", &["sigsuspend"], Exit(0),
        "sigsuspend with SIGCHLD already pending runs the handler before returning"),
    machine_dependent("signal_xstate", "signal_xstate.c",
        "the x87, MXCSR, XMM and YMM state a signal frame shows after parts of it went back to \
         their initial configuration (fninit, vzeroall, vzeroupper) since a system call"),
    machine_dependent("cpu_features", "cpu_features.c",
        "cpuid feature bits and XCR0 as glibc's ifunc resolvers see them"),
    sample("jit_remap", "jit_remap.c", &[], Exit(0),
        "code generated at run time, then replaced (mprotect, munmap+mmap, MAP_FIXED)"),
    sample("hole_reuse", "hole_reuse.S", &[], Exit(0),
        "a page the guest unmaps stays free for it to map again (nothing of hotpath's lands \
         in the hole, whenever its monitor thread first runs)"),
    sample("constant_slots", "constant_slots.c", &[], Exit(0),
        "indirect jumps and calls through a read-only slot (a GOT after relocation), changed \
         by mprotect + store, a /proc/self/mem write and MADV_DONTNEED"),
    sample("jumptable_changes", "jumptable_changes.c", &[], Exit(0),
        "a switch's jump table (movslq, add, jmp) changed by mprotect + store, a \
         /proc/self/mem write and MADV_DONTNEED; a second table base and indices past 255"),
    sample("jit_rwx", "jit_rwx.c", &[], Exit(0),
        "code rewritten in place in an RWX page (no mprotect), data stored into the code page, \
         and read(2) writing code into it"),
    sample("eflags_ac", "eflags_ac.c", &[], Exit(0),
        "EFLAGS.AC set by popf around a call, a call through a pointer, a branch, a system \
         call and cpuid (the JVM's CPU probe): translated code's own loads are aligned"),
    sample("jit_pages", "jit_pages.c", &[], Exit(0),
        "code in one RWX page calls and jumps into a function in another that is rewritten \
         between calls (the caller's links into the written page undone)"),
    sample("threads", "threads.c", &[], Exit(0),
        "pthreads: clone, per-thread TLS (FS base), futexes, a barrier, a mutex, join"),
    sample("thread_counts", "thread_cases.c", &["counts"], Exit(0),
        "4 workers running a counted loop (per-thread counts in threads.rs)"),
    sample("thread_pingpong", "thread_cases.c", &["pingpong"], Exit(0),
        "a token passed 20000 times between two threads with a mutex and condvars"),
    sample("thread_fault", "thread_cases.c", &["fault"], Exit(0),
        "a worker's NULL dereferences reach its SIGSEGV handler, which siglongjmps"),
    sample("thread_kill", "thread_cases.c", &["kill"], Exit(0),
        "pthread_kill reaches the thread it names, in sigsuspend, and only that one"),
    sample("thread_cancel", "thread_cases.c", &["cancel"], Exit(0),
        "pthread_cancel of a thread blocked in pause (glibc's SIGCANCEL)"),
    sample("thread_many", "thread_cases.c", &["many"], Exit(0),
        "8 rounds of 64 threads created and joined"),
    sample("thread_serial", "thread_cases.c", &["serial"], Exit(0),
        "200 threads started and joined one after another (each takes the last one's cache)"),
    sample("thread_jumptable", "thread_cases.c", &["jumptable"], Exit(0),
        "a switch's jump table run by threads one after another, at once and after a fork, each \
         thread with cases the ones before it did not take (a thread that takes an ended one's \
         code cache takes its jump tables too)"),
    sample("thread_syscall", "thread_cases.c", &["syscall"], Exit(0),
        "a worker's getppid while main waits in pthread_join (threads.rs makes hotpath fail \
         there and sees the process end)"),
    sample("thread_races_join", "thread_races.c", &["join"], Exit(0),
        "20 rounds of workers that end while main and another thread join them, and detached \
         ones that end while main waits for them"),
    sample("thread_races_exit", "thread_races.c", &["exit"], Exit(0),
        "8 children whose main thread exits while their threads start, end and wait on a \
         condition variable: each ends with its status"),
    sample("thread_races_fork", "thread_races.c", &["fork"], Exit(0),
        "8 forks from a worker while two threads keep starting and ending threads"),
    sample("thread_races_signal", "thread_races.c", &["signal"], Exit(0),
        "1000 real-time signals queued to the process as the one thread that takes them exits \
         (a raw clone thread): every one reaches the handler, on that thread or on main"),
    sample("thread_newcode", "thread_cases.c", &["newcode"], Exit(0),
        "code rewritten and remapped between threads: each new thread runs it as it is now"),
    sample("thread_jitwriter", "thread_cases.c", &["jitwriter"], Exit(0),
        "a worker writes functions into an RWX page's slots one at a time and main calls each \
         as soon as it is written (another thread's writes to translated code are caught)"),
    sample("thread_jitversions", "thread_cases.c", &["jitversions"], Exit(0),
        "a worker rewrites a function in place, publishing each version; main, which reads \
         the version and calls the function, never runs an older one"),
    sample("thread_jitdata", "thread_cases.c", &["jitdata"], Exit(0),
        "two workers store data into RWX pages whose code a third keeps running: no store \
         faults (a second writer's fault, handled after the first one's had given the page \
         back, once reached the guest as SIGSEGV)"),
    sample("thread_exit", "thread_cases.c", &["exit"], Exit(3),
        "exit from main while a worker spins: every thread stops, the status is main's"),
    sample("thread_fork", "thread_cases.c", &["fork"], Exit(0),
        "fork from a worker while others hold a mutex and malloc: the child has one thread, \
         starts its own, exits 5"),
    sample("thread_exec", "thread_cases.c", &["exec"], Exit(4),
        "a failed execve from a worker leaves the others running; a good one ends them all"),
    sample("thread_rawclone", "thread_cases.c", &["rawclone"], Exit(0),
        "glibc's clone() with CLONE_THREAD on a caller's stack, joined on CLONE_CHILD_CLEARTID"),
    sample("thread_signal", "thread_cases.c", &["signal"], Exit(0),
        "process-directed signals reach the one unblocking thread, in read (EINTR) or a futex"),
    unsupported("clone_vm_process", "clone_vm_process.c",
        "a process sharing memory or signal handlers without being a thread",
        "clone(CLONE_VM | SIGCHLD) without CLONE_THREAD is refused in one line"),
    sample("asm_flags", "asm_flags.S", &[], Exit(0),
        "arithmetic flags and DF live across block boundaries"),
    sample("asm_redzone", "asm_redzone.S", &[], Exit(0),
        "the 128-byte red zone below rsp is never touched"),
    sample("asm_retaddr", "asm_retaddr.S", &[], Exit(0),
        "call pushes guest return addresses; forged/modified returns"),
    sample("asm_start_state", "asm_start_state.S", &["first", "second arg"], Exit(0),
        "entry state: zeroed registers, flags, auxv, FS base, MXCSR"),
    sample("asm_traps_ud2", "asm_traps.S", &[], Signal(libc::SIGILL),
        "ud2 raises SIGILL"),
    sample("asm_traps_badop", "asm_traps.S", &["badop"], Signal(libc::SIGILL),
        "an invalid opcode raises SIGILL"),
    sample("asm_traps_int3", "asm_traps.S", &["int3"], Signal(libc::SIGTRAP),
        "int3 raises SIGTRAP"),
    sample("count_branches", "count_branches.S", &[], Exit(0),
        "a counted loop and loop nest (exact block and edge counts in counts.rs)"),
    sample("phase_change", "phase_change.S", &[], Exit(0),
        "a loop whose branch changes direction after 10,000 of its 310,000 runs (its first \
         superblock re-formed: superblocks.rs)"),
    sample("slow_loop", "slow_loop.S", &[], Exit(0),
        "a loop of two slow blocks that writes fewer events than a ring lap (its superblock \
         taken at its head: superblocks.rs)"),
    sample("count_jumptable", "count_jumptable.S", &[], Exit(0),
        "a switch through a jump table (exact indirect-target counts in counts.rs)"),
    sample("count_calls", "count_calls.S", &[], Exit(0),
        "indirect calls through a function table, returns (exact counts in counts.rs)"),
    sample("count_syscalls", "count_syscalls.S", &[], Exit(0),
        "write and getpid from several sites (exact syscall counts in counts.rs)"),
    sample("count_libc", "count_libc.c", &[], Exit(0),
        "qsort, snprintf, memcpy/memset up to 96 KiB (instruction accounting in valgrind.rs)"),
    machine_dependent("auxv_count", "auxv_count.S",
        "the number of auxiliary vector entries the kernel gives (hotpath must give as many)"),
    sample("superblock_fault", "superblock_fault.c", &[], Exit(0),
        "faults in the middle of a hot loop's superblock (an unrolled trace): the fault address, \
         the guest state at it, and a handler that siglongjmps out, 40 times"),
    sample("indirect_traces", "indirect_traces.c", &[], Exit(0),
        "hot indirect calls, a jump table and a computed goto with a usual target, one whose \
         target changes half way, and branches to a non-canonical address in a hot trace"),
    sample("ibl_collisions", "ibl_collisions.c", &[], Exit(0),
        "indirect calls to four functions whose addresses share their low 16 bits, in turn \
         (one slot of the indirect branch lookup table; its victim table keeps the others)"),
    sample("maps_beside_threads", "maps_beside_threads.c", &[], Exit(0),
        "anonymous memory mapped, re-protected and unmapped 2,000 times while another thread \
         runs (the mappings hold no code: the running thread keeps its links)"),
    sample("bench_sieve", "bench_sieve.c", &["300000"], Exit(0),
        "segmented sieve (benchmark, small size)"),
    sample("bench_crc", "bench_crc.c", &["3"], Exit(0),
        "CRC-32/FNV/mixing loops (benchmark, small size)"),
    sample("bench_fib", "bench_fib.c", &["24"], Exit(0),
        "recursive fib and tak (benchmark, small size)"),
    sample("bench_nbody", "bench_nbody.c", &["20000"], Exit(0),
        "n-body doubles (benchmark, small size)"),
    sample("bench_interp", "bench_interp.c", &["20"], Exit(0),
        "switch-dispatched bytecode interpreter (benchmark, small size)"),
    sample("bench_threads", "bench_threads.c", &["2"], Exit(0),
        "two threads each running its own loop at once (benchmark, small size)"),
    sample("bench_deep", "bench_deep.c", &["2"], Exit(0),
        "deep recursion: a 100,000-frame list walk, a recursive tree, Ackermann (benchmark, \
         small size)"),
];

/// The sample called `name`, if any.
pub fn find(name: &str) -> Option<&'static Sample> {
    SAMPLES.iter().find(|s| s.name == name)
}
