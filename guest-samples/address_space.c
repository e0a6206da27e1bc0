/* The guest's address space is the guest's: what it asks of the kernel for its own memory
 * (mmap hints, brk, the stack's growth) it gets under hotpath as natively.
 *
 *   hints      - mmap with a hint and with MAP_FIXED_NOREPLACE at 0x10000000..0x40000000
 *                (where a program linked at 0x400000 has nothing natively but, now and
 *                then, its randomly placed heap: such an address is moved past the heap);
 *   brk        - sbrk of 1.5 GiB (its last byte written), then back; mprotect of an unmapped
 *                page past brk fails with ENOMEM;
 *   brk-3g     - sbrk of 3 GiB, then back;
 *   brk-blocked - a mapping placed 64 MiB above brk stops brk there, as natively;
 *   layout     - prints where main and the heap's first block are (the kernel randomises
 *                a PIE's base and the heap's start on every run unless told not to);
 *   fixed      - MAP_FIXED over 0x60000000..0x80000000 (within 2 GiB of a program linked at
 *                0x400000, where hotpath would like its code cache), written, then unmapped;
 *   stack KIB  - recursion KIB KiB deep (1 KiB frames): past RLIMIT_STACK it dies of SIGSEGV;
 *   exec-only  - code written to a page made PROT_EXEC alone runs (whether the page can also
 *                be read depends on the CPU: with protection keys it cannot);
 *   hole       - in the gap between two PT_LOAD segments (built with 2 MiB segment alignment
 *                to have one): a load faults with SEGV_MAPERR, and the guest may map there;
 *   malloc-max - mallocs 1 MiB blocks (each touched) until malloc fails, prints how many MiB
 *                it got (under an RLIMIT_AS: what the limit leaves the program);
 *   idle-threads N - prints VmSize and VmRSS (kB, from /proc/self/status) before and while N
 *                threads wait on a barrier: what each thread costs the process;
 *   threads-until-fail - starts threads (each formats a few numbers first, then waits) until
 *                pthread_create fails (under an RLIMIT_AS: no room for another stack), then
 *                lets them all end; prints the failure, not the count;
 *   exhaust-then-run N - generates N small functions (each its own block), mallocs 1 MiB
 *                blocks until malloc fails (keeping them), then calls every function and
 *                prints their sum: under an RLIMIT_AS, new code to run after the program used
 *                up its memory (natively it needs none; under hotpath, its translations do). */
#define _GNU_SOURCE
#include <errno.h>
#include <link.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <pthread.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

/* The heap's possible span around the current break (bytes each side): this case has
 * allocated far less than that when it looks. */
#define HEAP_WINDOW (16UL << 20)

static int hints(void)
{
    static const unsigned long at[] = {0x10000000, 0x20000000, 0x30000000, 0x40000000};
    /* Natively the kernel starts a program's heap at a random page up to 1 GiB past its end
     * (arch_randomize_brk), so now and then the heap covers one of these addresses. One the
     * heap may cover is replaced by the page 64 MiB above it: what is asked is whether an
     * address where the program has nothing is given, not where the heap went. */
    unsigned long brk_now = (unsigned long)sbrk(0);
    for (int i = 0; i < 4; i++) {
        unsigned long asked = at[i];
        if (asked < brk_now + HEAP_WINDOW && asked + 4096 > brk_now - HEAP_WINDOW)
            asked += 64UL << 20;
        void *want = (void *)asked;
        void *p = mmap(want, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        printf("hint %#lx: %s\n", at[i], p == want ? "got it" : "elsewhere");
        if (p != MAP_FAILED)
            munmap(p, 4096);
        p = mmap(want, 4096, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        printf("noreplace %#lx: %s\n", at[i], p == want ? "got it" : strerror(errno));
        if (p != MAP_FAILED)
            munmap(p, 4096);
    }
    return 0;
}

/* sbrk(len), its last byte written, then sbrk(-len); prints what happened. */
static void grow_and_back(const char *what, long len)
{
    void *before = sbrk(0);
    char *p = sbrk(len);
    if (p == (void *)-1) {
        printf("sbrk %s: %s\n", what, strerror(errno));
        return;
    }
    p[len - 1] = 1;
    sbrk(-len);
    printf("sbrk %s: ok, back %s\n", what, sbrk(0) == before ? "where it was" : "ELSEWHERE");
}

static int brk_case(void)
{
    grow_and_back("1.5 GiB", 3L << 29);
    unsigned long past = ((unsigned long)sbrk(0) + (1 << 20)) & ~0xfffUL;
    int r = mprotect((void *)past, 4096, PROT_READ);
    printf("mprotect 1 MiB past brk: %s\n", r ? strerror(errno) : "ok");
    return 0;
}

int main(int argc, char **argv);

static int layout(void)
{
    void *first = malloc(16);
    printf("main %p heap %p\n", (void *)main, first);
    free(first);
    return 0;
}

static int brk_blocked(void)
{
    unsigned long end = ((unsigned long)sbrk(0) + 0xfff) & ~0xfffUL;
    void *wall = (void *)(end + (64 << 20));
    void *p = mmap(wall, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    printf("mapping 64 MiB above brk: %s\n", p == wall ? "placed" : strerror(errno));
    grow_and_back("32 MiB", 32L << 20);
    grow_and_back("128 MiB", 128L << 20);
    return 0;
}

static int fixed(void)
{
    size_t len = 512UL << 20;
    char *want = (char *)0x60000000UL;
    char *p = mmap(want, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p != want) {
        printf("MAP_FIXED at %p: %s\n", (void *)want, strerror(errno));
        return 1;
    }
    for (size_t i = 0; i < len; i += 1 << 20)
        p[i] = (char)i;
    long sum = 0;
    for (size_t i = 0; i < len; i += 1 << 20)
        sum += p[i];
    printf("MAP_FIXED at %p: mapped and written (%ld)\n", (void *)want, sum);
    munmap(p, len);
    return 0;
}

static sigjmp_buf hole_jump;
static volatile int hole_code;

static void hole_handler(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)ctx;
    hole_code = info->si_code;
    siglongjmp(hole_jump, 1);
}

/* The first page-aligned gap of at least a page between the program's PT_LOAD segments. */
static int find_hole(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    unsigned long prev_end = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        unsigned long start = (info->dlpi_addr + ph->p_vaddr) & ~0xfffUL;
        if (prev_end && start >= prev_end + 4096) {
            *(unsigned long *)data = prev_end;
            return 1;
        }
        prev_end = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz + 0xfff) & ~0xfffUL;
    }
    return 1; /* only the program itself */
}

static int hole(void)
{
    unsigned long at = 0;
    dl_iterate_phdr(find_hole, &at);
    if (!at) {
        printf("no gap between the program's segments\n");
        return 0;
    }
    struct sigaction sa = {0};
    sa.sa_sigaction = hole_handler;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    if (!sigsetjmp(hole_jump, 1)) {
        volatile char c = *(volatile char *)at;
        (void)c;
        printf("a load in the gap: no fault\n");
    } else {
        printf("a load in the gap: SIGSEGV, %s\n",
               hole_code == SEGV_MAPERR ? "SEGV_MAPERR" : hole_code == SEGV_ACCERR ? "SEGV_ACCERR" : "other");
    }
    void *p = mmap((void *)at, 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    printf("mapping in the gap: %s\n", p == (void *)at ? "placed" : strerror(errno));
    return 0;
}

static int exec_only(void)
{
    static const unsigned char code[] = {0xb8, 42, 0, 0, 0, 0xc3}; /* mov eax, 42 ; ret */
    unsigned char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memcpy(p, code, sizeof code);
    if (mprotect(p, 4096, PROT_EXEC)) {
        printf("mprotect PROT_EXEC: %s\n", strerror(errno));
        return 1;
    }
    printf("a call into the execute-only page returns %d\n", ((int (*)(void))p)());
    struct sigaction sa = {0};
    sa.sa_sigaction = hole_handler;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    if (!sigsetjmp(hole_jump, 1))
        printf("a load from it: %d\n", *(volatile unsigned char *)p);
    else
        printf("a load from it: SIGSEGV\n");
    return 0;
}

static long depth(long n)
{
    volatile char frame[1000];
    frame[0] = (char)n;
    if (n == 0)
        return 0;
    return depth(n - 1) + frame[0];
}

/* Mallocs 1 MiB blocks (each touched) until malloc fails; returns how many it got. */
static long malloc_until_failure(void)
{
    long mib = 0;
    for (;;) {
        char *p = malloc(1 << 20);
        if (!p)
            break;
        p[0] = 1;
        mib++;
    }
    return mib;
}

static int malloc_max(void)
{
    printf("malloc got %ld MiB\n", malloc_until_failure());
    return 0;
}

static pthread_barrier_t started, release;

static void *idle(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&started);
    pthread_barrier_wait(&release);
    return NULL;
}

/* Prints "TAG VmSize VmRSS" in kB. */
static void status_line(const char *tag)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long size = -1, rss = -1;
    while (f && fgets(line, sizeof line, f)) {
        sscanf(line, "VmSize: %ld", &size);
        sscanf(line, "VmRSS: %ld", &rss);
    }
    if (f)
        fclose(f);
    printf("%s %ld %ld\n", tag, size, rss);
}

static int idle_threads(int n)
{
    pthread_t t[256];
    if (n < 1 || n > 256)
        return 2;
    pthread_barrier_init(&started, NULL, n + 1);
    pthread_barrier_init(&release, NULL, n + 1);
    status_line("before");
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, idle, NULL) != 0) {
            printf("pthread_create failed\n");
            return 1;
        }
    pthread_barrier_wait(&started);
    status_line("during");
    pthread_barrier_wait(&release);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    return 0;
}

static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_open = PTHREAD_COND_INITIALIZER;
static int gate;

static void *busy_then_wait(void *arg)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%ld %f %x", (long)arg, (double)(long)arg / 3, (unsigned)(long)arg);
    pthread_mutex_lock(&gate_lock);
    while (!gate)
        pthread_cond_wait(&gate_open, &gate_lock);
    pthread_mutex_unlock(&gate_lock);
    return strlen(buf) ? NULL : arg;
}

static int threads_until_fail(void)
{
    enum { MOST = 4096 };
    static pthread_t t[MOST];
    int n = 0, err = 0;
    while (n < MOST && (err = pthread_create(&t[n], NULL, busy_then_wait, (void *)(long)n)) == 0)
        n++;
    if (n == MOST)
        printf("%d threads started, no failure\n", MOST);
    else
        printf("pthread_create failed after %s: %s\n", n > 0 ? "some threads" : "none",
               strerror(err));
    pthread_mutex_lock(&gate_lock);
    gate = 1;
    pthread_cond_broadcast(&gate_open);
    pthread_mutex_unlock(&gate_lock);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    printf("joined\n");
    return 0;
}

/* `mov eax, imm32; ret`, 8 bytes apart. */
static int exhaust_then_run(long n)
{
    size_t len = (size_t)n * 8;
    unsigned char *code = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                               -1, 0);
    if (code == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    for (long i = 0; i < n; i++) {
        unsigned char *f = code + i * 8;
        uint32_t v = (uint32_t)(i * 2654435761u);
        f[0] = 0xb8;
        memcpy(f + 1, &v, 4);
        f[5] = 0xc3;
        f[6] = f[7] = 0xcc;
    }
    if (mprotect(code, len, PROT_READ | PROT_EXEC)) {
        perror("mprotect");
        return 1;
    }
    printf("%ld functions\n", n);
    malloc_until_failure();
    uint64_t sum = 0;
    for (long i = 0; i < n; i++)
        sum += ((uint32_t(*)(void))(code + i * 8))();
    printf("malloc failed; the functions sum to %llu\n", (unsigned long long)sum);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *c = argc > 1 ? argv[1] : "";
    if (!strcmp(c, "hints"))
        return hints();
    if (!strcmp(c, "brk"))
        return brk_case();
    if (!strcmp(c, "brk-3g")) {
        grow_and_back("3 GiB", 3L << 30);
        return 0;
    }
    if (!strcmp(c, "layout"))
        return layout();
    if (!strcmp(c, "brk-blocked"))
        return brk_blocked();
    if (!strcmp(c, "fixed"))
        return fixed();
    if (!strcmp(c, "hole"))
        return hole();
    if (!strcmp(c, "exec-only"))
        return exec_only();
    if (!strcmp(c, "threads-until-fail"))
        return threads_until_fail();
    if (!strcmp(c, "malloc-max"))
        return malloc_max();
    if (!strcmp(c, "exhaust-then-run") && argc > 2)
        return exhaust_then_run(atol(argv[2]));
    if (!strcmp(c, "idle-threads") && argc > 2)
        return idle_threads(atoi(argv[2]));
    if (!strcmp(c, "stack") && argc > 2) {
        long kib = atol(argv[2]);
        printf("recursing %ld KiB deep\n", kib);
        printf("came back (%ld)\n", depth(kib) & 1);
        return 0;
    }
    fprintf(stderr, "usage: address_space hints|brk|brk-3g|brk-blocked|layout|fixed|hole|exec-only|malloc-max|exhaust-then-run N|idle-threads N|threads-until-fail|stack KIB\n");
    return 2;
}
