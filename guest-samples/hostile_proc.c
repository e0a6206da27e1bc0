/* Guests that look at the process from the kernel's side: system calls hotpath has no row for,
 * /proc/self/{comm,cmdline,auxv}, prctl(PR_GET_NAME/PR_GET_AUXV), unshare, seccomp in
 * strict and filter mode, the TSC setting, and an address space used up under RLIMIT_AS. One case per run, named by argv[1]; every case prints what it saw
 * (never addresses, which differ from run to run) so a run under hotpath is compared with the
 * native run byte for byte. Used by tests/tests/hostile_proc.rs. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef PR_GET_AUXV
#define PR_GET_AUXV 0x41555856
#endif

/* Reads a whole (small) file into buf; returns its length or -errno. */
static long slurp(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -errno;
    long total = 0;
    for (;;) {
        ssize_t n = read(fd, buf + total, size - total);
        if (n <= 0)
            break;
        total += n;
    }
    close(fd);
    return total;
}

/* Prints a NUL-separated buffer with '|' for each NUL. */
static void print_nul_separated(const char *what, const char *buf, long n)
{
    printf("%s (%ld bytes): ", what, n);
    for (long i = 0; i < n; i++)
        putchar(buf[i] ? buf[i] : '|');
    putchar('\n');
}

static void print_comm(const char *when)
{
    char buf[256], name[32] = {0}, path[64];
    long n = slurp("/proc/self/comm", buf, sizeof buf);
    printf("%s: /proc/self/comm %.*s", when, (int)(n > 0 ? n : 0), buf);
    snprintf(path, sizeof path, "/proc/self/task/%ld/comm", (long)syscall(SYS_gettid));
    n = slurp(path, buf, sizeof buf);
    printf("%s: task comm %.*s", when, (int)(n > 0 ? n : 0), buf);
    prctl(PR_GET_NAME, name);
    printf("%s: PR_GET_NAME %s\n", when, name);
}

static void *comm_thread(void *arg)
{
    (void)arg;
    print_comm("thread");
    return NULL;
}

static int case_comm(void)
{
    print_comm("main");
    pthread_t t;
    pthread_create(&t, NULL, comm_thread, NULL);
    pthread_join(t, NULL);
    prctl(PR_SET_NAME, "renamed-by-guest-long");
    print_comm("renamed");
    return 0;
}

static int case_cmdline(void)
{
    char buf[4096], path[64];
    long n = slurp("/proc/self/cmdline", buf, sizeof buf);
    print_nul_separated("/proc/self/cmdline", buf, n);
    snprintf(path, sizeof path, "/proc/%ld/cmdline", (long)getpid());
    n = slurp(path, buf, sizeof buf);
    print_nul_separated("/proc/<pid>/cmdline", buf, n);
    n = slurp("/proc/thread-self/cmdline", buf, sizeof buf);
    print_nul_separated("/proc/thread-self/cmdline", buf, n);
    return 0;
}

static int case_auxv(void)
{
    unsigned long file[128], prctl_auxv[128];
    long n = slurp("/proc/self/auxv", (char *)file, sizeof file);
    int agree = n > 0;
    int entries = 0;
    for (long i = 0; i + 1 < n / 8; i += 2, entries++) {
        if (file[i] == AT_NULL)
            break;
        /* getauxval does not know the tags it does not keep (AT_MINSIGSTKSZ on older glibc). */
        if (file[i] != AT_MINSIGSTKSZ && getauxval(file[i]) != file[i + 1]) {
            agree = 0;
            printf("tag %lu: /proc/self/auxv and getauxval differ\n", file[i]);
        }
    }
    long r = prctl(PR_GET_AUXV, prctl_auxv, sizeof prctl_auxv, 0, 0);
    printf("auxv: %d entries, /proc/self/auxv agrees with getauxval: %d\n", entries, agree);
    printf("PR_GET_AUXV: %d, same bytes as the file %d\n", r > 0,
           n > 0 && memcmp(prctl_auxv, file, n) == 0);
    return 0;
}

static int case_unshare(void)
{
    long r = unshare(CLONE_NEWUSER);
    printf("unshare(CLONE_NEWUSER): %ld %s\n", r, r ? strerror(errno) : "ok");
    return 0;
}

static void print_syscall(long nr)
{
    errno = 0;
    long r = syscall(nr, 0, 0, 0, 0, 0, 0);
    printf("syscall %ld: %ld errno %d\n", nr, r, r == -1 ? errno : 0);
}

static void on_signal(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    printf("signal %d: si_code %d si_errno %d", sig, si->si_code, si->si_errno);
    if (sig == SIGSYS)
        printf(" si_syscall %d si_arch %#x call addr set %d", si->si_syscall, si->si_arch,
               si->si_call_addr != NULL);
    printf("\n");
}

static void handle(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO;
    sigaction(sig, &sa, NULL);
}

static int case_unknown_syscalls(void)
{
    /* Numbers beyond the table, negative, and calls of newer kernels (uprobe, mseal,
     * setxattrat, ...): each returns what this kernel returns. */
    static const long nrs[] = {336, 400, 462, 463, 470, 512, 547, 600, 1000, 100000, -1};
    for (unsigned i = 0; i < sizeof nrs / sizeof *nrs; i++)
        print_syscall(nrs[i]);
    return 0;
}

static int case_uretprobe(int with_handler)
{
    /* uretprobe called from outside its trampoline: the kernel raises SIGILL. */
    if (with_handler)
        handle(SIGILL);
    print_syscall(335);
    fflush(stdout);
    return 0;
}

/* Work that needs new translations and a report after the filter is in place. */
static int work_after_filter(void)
{
    char *p = malloc(1 << 20);
    unsigned long sum = 0;
    for (int i = 0; i < (1 << 20); i++) {
        p[i] = (char)(i * 7);
        sum += (unsigned char)p[i];
    }
    free(p);
    printf("work: %lu\n", sum);
    return 0;
}

/* Installs a filter: `nr` gets `action`, everything else is allowed. */
static long install_filter(long nr, unsigned action, unsigned flags)
{
    struct sock_filter prog[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, action),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog fprog = {.len = sizeof prog / sizeof *prog, .filter = prog};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -errno;
    long r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &fprog);
    printf("seccomp filter on %ld: %ld\n", nr, r == -1 ? -errno : r);
    return r;
}

static void *getpid_thread(void *arg)
{
    (void)arg;
    errno = 0;
    long r = syscall(SYS_getpid);
    printf("thread getpid: %d errno %d\n", r == -1 ? -1 : 1, errno);
    return NULL;
}

static int case_seccomp(const char *mode)
{
    if (!strcmp(mode, "strict")) {
        /* Only read, write, exit and rt_sigreturn are allowed; exit (not exit_group) ends. */
        static const char msg[] = "in strict mode\n";
        fflush(stdout);
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT, 0, 0, 0) != 0)
            return 10;
        write(1, msg, sizeof msg - 1);
        syscall(SYS_exit, 3);
        return 11;
    }
    if (!strcmp(mode, "strict-kill")) {
        /* Any other call kills the process with SIGKILL. */
        fflush(stdout);
        if (syscall(SYS_seccomp, SECCOMP_SET_MODE_STRICT, 0, NULL) != 0)
            return 10;
        write(1, "before\n", 7);
        syscall(SYS_getpid);
        write(1, "after\n", 6);
        syscall(SYS_exit, 4);
        return 11;
    }
    if (!strcmp(mode, "deny-getpid")) {
        install_filter(SYS_getpid, SECCOMP_RET_ERRNO | EPERM, 0);
        errno = 0;
        long r = syscall(SYS_getpid);
        printf("getpid: %ld errno %d\n", r, errno);
        return work_after_filter();
    }
    if (!strcmp(mode, "deny-process_vm_readv")) {
        install_filter(SYS_process_vm_readv, SECCOMP_RET_ERRNO | EACCES, 0);
        char a[4] = "abc", b[4] = {0};
        struct iovec local = {b, 4}, remote = {a, 4};
        errno = 0;
        long r = syscall(SYS_process_vm_readv, getpid(), &local, 1, &remote, 1, 0);
        printf("process_vm_readv: %ld errno %d\n", r, errno);
        return work_after_filter();
    }
    if (!strcmp(mode, "kill-futex")) {
        install_filter(SYS_futex, SECCOMP_RET_KILL_PROCESS, 0);
        work_after_filter();
        fflush(stdout);
        syscall(SYS_futex, NULL, 0, 0, NULL, NULL, 0);
        return 12;
    }
    if (!strcmp(mode, "kill-futex-exit") || !strcmp(mode, "tsync-kill-futex-exit")) {
        /* The guest never calls futex; hotpath's threads do (parking, joining the monitor). */
        unsigned flags = mode[0] == 't' ? SECCOMP_FILTER_FLAG_TSYNC : 0;
        install_filter(SYS_futex, SECCOMP_RET_KILL_PROCESS, flags);
        return work_after_filter();
    }
    if (!strcmp(mode, "kill-thread-getppid")) {
        /* SECCOMP_RET_KILL_THREAD in a single-threaded process ends the process. */
        install_filter(SYS_getppid, SECCOMP_RET_KILL_THREAD, 0);
        fflush(stdout);
        syscall(SYS_getppid);
        return 12;
    }
    if (!strcmp(mode, "kill-getppid-handled")) {
        /* A kill ignores the guest's SIGSYS handler. */
        handle(SIGSYS);
        install_filter(SYS_getppid, SECCOMP_RET_KILL_PROCESS, 0);
        fflush(stdout);
        syscall(SYS_getppid);
        return 12;
    }
    if (!strcmp(mode, "trap-getppid")) {
        handle(SIGSYS);
        install_filter(SYS_getppid, SECCOMP_RET_TRAP | 42, 0);
        long r = syscall(SYS_getppid);
        printf("getppid after the trap: %ld\n", r);
        return work_after_filter();
    }
    if (!strcmp(mode, "tsync-getpid")) {
        install_filter(SYS_getpid, SECCOMP_RET_ERRNO | EPERM, SECCOMP_FILTER_FLAG_TSYNC);
        pthread_t t;
        pthread_create(&t, NULL, getpid_thread, NULL);
        pthread_join(t, NULL);
        return work_after_filter();
    }
    if (!strcmp(mode, "exec-deny-getpid") || !strcmp(mode, "exec-kill-futex")) {
        /* The filter stays across execve: the new image runs under it. */
        if (mode[5] == 'd')
            install_filter(SYS_getpid, SECCOMP_RET_ERRNO | EPERM, 0);
        else
            install_filter(SYS_futex, SECCOMP_RET_KILL_PROCESS, 0);
        fflush(stdout);
        char *args[] = {"hostile_proc", "seccomp", "after-exec", NULL};
        execv("/proc/self/exe", args);
        printf("execv: %s\n", strerror(errno));
        return 13;
    }
    if (!strcmp(mode, "after-exec")) {
        errno = 0;
        long r = syscall(SYS_getpid);
        printf("after exec, getpid: %d errno %d\n", r == -1 ? -1 : 1, errno);
        return work_after_filter();
    }
    fprintf(stderr, "unknown seccomp mode %s\n", mode);
    return 2;
}

/* The time-stamp counter turned off for the thread (prctl PR_SET_TSC): rdtsc and rdtscp then
 * raise SIGSEGV (#GP), reported here field by field; PR_GET_TSC says the mode; turned on again
 * they run; a bad mode is EINVAL. The program's own work goes on meanwhile. */
static sigjmp_buf tsc_back;
static volatile int tsc_sig, tsc_code;
static volatile long long tsc_trapno, tsc_err;

static void tsc_handler(int sig, siginfo_t *si, void *uc_)
{
    ucontext_t *uc = uc_;
    tsc_sig = sig;
    tsc_code = si->si_code;
    tsc_trapno = uc->uc_mcontext.gregs[REG_TRAPNO];
    tsc_err = uc->uc_mcontext.gregs[REG_ERR];
    siglongjmp(tsc_back, 1);
}

static void tsc_try(const char *what, int rdtscp)
{
    tsc_sig = 0;
    if (!sigsetjmp(tsc_back, 1)) {
        unsigned lo, hi, aux;
        if (rdtscp)
            __asm__ volatile("rdtscp" : "=a"(lo), "=d"(hi), "=c"(aux));
        else
            __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
        printf("%s: ran\n", what);
    } else {
        printf("%s: sig=%d code=%d trapno=%lld err=%lld\n", what, tsc_sig, tsc_code, tsc_trapno,
               tsc_err);
    }
}

static int case_tsc(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = tsc_handler;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    int mode = -1;
    int r = prctl(PR_GET_TSC, &mode);
    printf("get: %d mode %d\n", r, mode);
    tsc_try("rdtsc enabled", 0);
    printf("set sigsegv: %d\n", prctl(PR_SET_TSC, PR_TSC_SIGSEGV));
    r = prctl(PR_GET_TSC, &mode);
    printf("get: %d mode %d\n", r, mode);
    tsc_try("rdtsc", 0);
    tsc_try("rdtscp", 1);
    r = prctl(PR_SET_TSC, 7);
    int e = errno;
    printf("set 7: %d errno %d\n", r, e);
    printf("set enable: %d\n", prctl(PR_SET_TSC, PR_TSC_ENABLE));
    tsc_try("rdtsc again", 0);
    return 0;
}

/* Which standard descriptors are open (the test starts this case with one of them closed:
 * `prog <&-`), then a write to descriptor 1; the findings go to descriptor 2 and, if it is
 * open, 1. Exit 7 if the write failed. */
static int case_std_fds(void)
{
    char line[128];
    int n = 0;
    for (int fd = 0; fd < 3; fd++) {
        struct stat st;
        int r = fstat(fd, &st);
        n += snprintf(line + n, sizeof line - n, "fd%d=%s ", fd,
                      r == 0 ? "open" : errno == EBADF ? "EBADF" : "other");
    }
    ssize_t w = write(1, line, n);
    int e = errno;
    char tail[64];
    int m = snprintf(tail, sizeof tail, "write1=%s\n",
                     w >= 0 ? "ok" : e == EBADF ? "EBADF" : "other");
    if (write(2, line, n) < 0 || write(2, tail, m) < 0)
        return 8;
    return w >= 0 ? 0 : 7;
}

static sigjmp_buf foreign_back;
static volatile long foreign_code, foreign_addr;

static void foreign_handler(int sig, siginfo_t *info, void *uc)
{
    (void)sig;
    (void)uc;
    foreign_code = info->si_code;
    foreign_addr = (long)info->si_addr;
    siglongjmp(foreign_back, 1);
}

/* Calls into every executable mapping of /proc/self/maps that is not one of the program's
 * own (its executable, ld.so and the libraries it loaded, the vDSO, vsyscall): natively there
 * is none; under hotpath these are hotpath's own (its code cache, its binary), which must
 * fault as unmapped memory does. One line per mapping: its kind and what the call gave. */
static int case_jump_into_foreign_code(void)
{
    char maps[1 << 16];
    long n = slurp("/proc/self/maps", maps, sizeof maps - 1);
    if (n <= 0)
        return 3;
    maps[n] = 0;
    char self[4096];
    ssize_t m = readlink("/proc/self/exe", self, sizeof self - 1);
    self[m > 0 ? m : 0] = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = foreign_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    sigaction(SIGILL, &sa, NULL);
    sigaction(SIGTRAP, &sa, NULL);
    int found = 0;
    for (char *line = strtok(maps, "\n"); line; line = strtok(NULL, "\n")) {
        unsigned long start, end;
        char perms[8], path[4096] = "";
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %4095[^\n]", &start, &end, perms, path) < 3)
            continue;
        if (perms[2] != 'x' || strstr(path, "[vdso]") || strstr(path, "[vsyscall]") ||
            !strcmp(path, self) || strstr(path, "/ld-linux") || strstr(path, "/libc.so"))
            continue;
        found++;
        const char *kind = path[0] == '/' && !strstr(path, "(deleted)") ? "file" : "anonymous";
        foreign_code = 0;
        if (sigsetjmp(foreign_back, 1) == 0) {
            ((void (*)(void))start)();
            printf("%s: returned\n", kind);
        } else {
            printf("%s: signal code %ld at %s\n", kind, foreign_code,
                   foreign_addr == (long)start ? "its start" : "another address");
        }
    }
    printf("%d foreign executable mappings\n", found);
    return 0;
}

static int by_value(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

/* The process uses up its address space: RLIMIT_AS is set 256 MiB above its size now, then
 * anonymous mappings of halving sizes (64 MiB down to a page) fill it until each size fails.
 * Afterwards the program runs code it never ran before (qsort, printf of doubles), which
 * under hotpath must be translated with the address space full, gives the space back and
 * maps again. Prints only what does not depend on where the limit fell. */
static int case_address_space_full(void)
{
    char statm[256];
    long n = slurp("/proc/self/statm", statm, sizeof statm - 1);
    if (n <= 0)
        return 3;
    statm[n] = 0;
    unsigned long pages = strtoul(statm, NULL, 10);
    struct rlimit r = {pages * 4096 + (256ul << 20), pages * 4096 + (256ul << 20)};
    if (setrlimit(RLIMIT_AS, &r) != 0)
        return 4;
    static void *maps[4096];
    static size_t sizes[4096];
    int count = 0, enomem = 0;
    for (size_t sz = 64ul << 20; sz >= 4096 && count < 4096; sz /= 2) {
        for (;;) {
            void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) {
                enomem += errno == ENOMEM;
                break;
            }
            maps[count] = p;
            sizes[count++] = sz;
            if (count == 4096)
                break;
        }
    }
    printf("mapped: %s, every failure ENOMEM: %s\n", count > 0 ? "yes" : "no",
           enomem == 15 ? "yes" : "no");
    int v[64];
    for (int i = 0; i < 64; i++)
        v[i] = (i * 37) % 64;
    qsort(v, 64, sizeof v[0], by_value);
    printf("sorted: %d %d %d, %.3f %e\n", v[0], v[31], v[63], 2.0 / 3.0, 6.02e23);
    for (int i = 0; i < count; i++)
        munmap(maps[i], sizes[i]);
    void *again = mmap(NULL, 16ul << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("after unmapping: %s\n", again != MAP_FAILED ? "mapped again" : "still full");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: hostile_proc CASE [ARGS]\n");
        return 2;
    }
    const char *c = argv[1];
    if (!strcmp(c, "comm"))
        return case_comm();
    if (!strcmp(c, "cmdline"))
        return case_cmdline();
    if (!strcmp(c, "auxv"))
        return case_auxv();
    if (!strcmp(c, "unshare"))
        return case_unshare();
    if (!strcmp(c, "tsc"))
        return case_tsc();
    if (!strcmp(c, "jump-into-foreign-code"))
        return case_jump_into_foreign_code();
    if (!strcmp(c, "address-space-full"))
        return case_address_space_full();
    if (!strcmp(c, "std-fds"))
        return case_std_fds();
    if (!strcmp(c, "unknown-syscalls"))
        return case_unknown_syscalls();
    if (!strcmp(c, "uretprobe"))
        return case_uretprobe(1);
    if (!strcmp(c, "uretprobe-default"))
        return case_uretprobe(0);
    if (!strcmp(c, "chdir") && argc > 2) {
        /* A guest that moves: hotpath's relative output paths are its starting directory's. */
        if (chdir(argv[2]) != 0)
            return 3;
        return work_after_filter();
    }
    if (!strcmp(c, "seccomp") && argc > 2)
        return case_seccomp(argv[2]);
    fprintf(stderr, "unknown case %s\n", c);
    return 2;
}
