/* Threads, one case per argument:
 *   counts    - 4 workers; worker k runs the two-instruction loop at `spin_loop` exactly
 *               (k + 1) * 100000 times (tests/tests/threads.rs checks the per-thread counts);
 *   pingpong  - two threads hand a token back and forth 20000 times with a mutex and condvars;
 *   fault     - a worker dereferences NULL, its SIGSEGV handler siglongjmps back, twice;
 *   kill      - pthread_kill(SIGUSR1) reaches the one worker it names, blocked in sigsuspend;
 *   cancel    - pthread_cancel of a worker blocked in pause(), joined as PTHREAD_CANCELED;
 *   many      - 8 rounds of 64 threads created and joined;
 *   serial    - 200 threads created and joined one after another, each summing 0..999;
 *   jumptable - a switch compiled to a jump table (`jt_switch`), each thread taking cases
 *               the threads before it did not: 9 threads one after another (each takes the
 *               last one's code cache and its tables), 4 at once, then a fork whose child
 *               and parent each start one more;
 *   syscall   - a worker makes one getppid() while main waits in pthread_join (the tests
 *               make hotpath fail there, HOTPATH_TEST_PANIC_AT_SYSCALL=110, and see the
 *               process end promptly instead of main waiting for the worker for good);
 *   newcode   - 5 times: main writes `mov eax, v; ret` into a page, a new thread calls it
 *               and is joined, the page is unmapped and mapped again (a thread that starts
 *               runs the code as it is now, not what an ended thread ran there);
 *   jitwriter - a worker writes 2000 small functions into the 64 slots of one RWX page, one
 *               at a time, and main calls each as soon as it is written (a JIT whose compiler
 *               thread emits code that another thread runs): every call returns its value;
 *   jitversions - a worker rewrites one function of an RWX page 3000 times (`mov eax, v;
 *               ret`), publishing v after each; main keeps reading v, serialises (cpuid, as
 *               the SDM asks of code another processor wrote) and calls the function: it
 *               must return v or later, never an older version;
 *   jitdata   - 8 RWX pages, each starting with a function that one worker keeps calling;
 *               two other workers keep storing data into the upper halves of the same
 *               pages (a JIT's code heap with headers beside the code): no store faults;
 *   exit      - main calls exit(3) while a worker spins in a loop forever;
 *   fork      - 10 times, a worker forks while two others take a mutex and malloc in a loop;
 *               the child (the forking thread alone) starts and joins threads of its own
 *               and exits 5, and the worker reaps it;
 *   exec      - a worker's execve of a missing file fails with ENOENT and the other threads
 *               go on; its execve of this program then ends them all (main is in
 *               pthread_join, a worker spins) and the new image runs with gettid() == getpid();
 *   rawclone  - glibc's clone() with CLONE_THREAD and a stack of the caller's (no pthreads):
 *               the child adds to a shared counter and returns (the thread exits); the parent
 *               waits on CLONE_CHILD_CLEARTID's futex, 3 times;
 *   signal    - process-directed signals (kill to the process) reach the one thread that
 *               does not block them: SIGUSR1 a worker in read() on a pipe (no SA_RESTART:
 *               read fails with EINTR), SIGUSR2 a worker in pthread_cond_wait (a futex). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Runs the block at `spin_loop` (dec; jnz) exactly n times (n >= 1). */
static void __attribute__((noinline)) spin(long n)
{
    __asm__ volatile(".globl spin_loop\n"
                     "spin_loop:\n\t"
                     "dec %0\n\t"
                     "jnz spin_loop"
                     : "+r"(n)
                     :
                     : "cc");
}

static void *count_worker(void *arg)
{
    long k = (long)(intptr_t)arg;
    spin((k + 1) * 100000);
    return NULL;
}

static int counts(void)
{
    pthread_t t[4];
    for (long k = 0; k < 4; k++)
        pthread_create(&t[k], NULL, count_worker, (void *)(intptr_t)k);
    for (int k = 0; k < 4; k++)
        pthread_join(t[k], NULL);
    printf("counts: 4 workers done\n");
    return 0;
}

#define ROUNDS 20000
static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv[2] = {PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER};
static int turn;
static long hits[2];

static void *pong(void *arg)
{
    int me = (int)(intptr_t)arg;
    for (int i = 0; i < ROUNDS; i++) {
        pthread_mutex_lock(&m);
        while (turn != me)
            pthread_cond_wait(&cv[me], &m);
        hits[me]++;
        turn = !me;
        pthread_cond_signal(&cv[!me]);
        pthread_mutex_unlock(&m);
    }
    return NULL;
}

static int pingpong(void)
{
    pthread_t t;
    pthread_create(&t, NULL, pong, (void *)1);
    pong((void *)0);
    pthread_join(t, NULL);
    printf("pingpong: %ld %ld\n", hits[0], hits[1]);
    return 0;
}

static __thread sigjmp_buf jump;
static __thread int faults;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    faults++;
    printf("fault: signal %d at %p in the faulting thread\n", sig, si->si_addr);
    siglongjmp(jump, 1);
}

static void *fault_worker(void *arg)
{
    (void)arg;
    for (int i = 0; i < 2; i++) {
        if (sigsetjmp(jump, 1) == 0)
            *(volatile int *)(intptr_t)(16 * i) = 1;
    }
    return (void *)(intptr_t)faults;
}

static int fault(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, NULL);
    pthread_t t;
    void *ret;
    pthread_create(&t, NULL, fault_worker, NULL);
    pthread_join(t, &ret);
    printf("fault: the worker saw %d faults, main %d\n", (int)(intptr_t)ret, faults);
    return 0;
}

static volatile sig_atomic_t usr1_in[3];
static __thread int my_index;

static void on_usr1(int sig)
{
    (void)sig;
    usr1_in[my_index]++;
}

static pthread_barrier_t ready;

static void *kill_worker(void *arg)
{
    my_index = (int)(intptr_t)arg;
    sigset_t block, wait;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &block, &wait);
    pthread_barrier_wait(&ready);
    sigdelset(&wait, SIGUSR1);
    sigsuspend(&wait);
    return NULL;
}

static int kill_case(void)
{
    signal(SIGUSR1, on_usr1);
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &block, NULL);
    pthread_barrier_init(&ready, NULL, 3);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, kill_worker, (void *)(intptr_t)(i + 1));
    pthread_barrier_wait(&ready);
    for (int i = 1; i >= 0; i--) {
        pthread_kill(t[i], SIGUSR1);
        pthread_join(t[i], NULL);
        printf("kill: worker %d woke; handler ran in main %d, worker 1 %d, worker 2 %d\n", i + 1,
               (int)usr1_in[0], (int)usr1_in[1], (int)usr1_in[2]);
    }
    return 0;
}

static void *cancel_worker(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

static int cancel(void)
{
    pthread_t t;
    void *ret;
    pthread_create(&t, NULL, cancel_worker, NULL);
    usleep(20000);
    pthread_cancel(t);
    pthread_join(t, &ret);
    printf("cancel: joined, %s\n", ret == PTHREAD_CANCELED ? "canceled" : "not canceled");
    return 0;
}

static void *add_one(void *arg)
{
    return (void *)((intptr_t)arg + 1);
}

static int many(void)
{
    long sum = 0;
    for (int round = 0; round < 8; round++) {
        pthread_t t[64];
        for (int i = 0; i < 64; i++)
            if (pthread_create(&t[i], NULL, add_one, (void *)(intptr_t)i) != 0) {
                printf("many: pthread_create failed\n");
                return 1;
            }
        for (int i = 0; i < 64; i++) {
            void *r;
            pthread_join(t[i], &r);
            sum += (intptr_t)r;
        }
    }
    printf("many: 512 threads, sum %ld\n", sum);
    return 0;
}

static void *sum_to_1000(void *arg)
{
    long s = (intptr_t)arg;
    for (int i = 0; i < 1000; i++)
        s += i;
    return (void *)(intptr_t)s;
}

static int serial(void)
{
    long sum = 0;
    for (int i = 0; i < 200; i++) {
        pthread_t t;
        void *r;
        if (pthread_create(&t, NULL, sum_to_1000, (void *)(intptr_t)i) != 0) {
            printf("serial: pthread_create failed\n");
            return 1;
        }
        pthread_join(t, &r);
        sum += (intptr_t)r;
    }
    printf("serial: 200 threads, sum %ld\n", sum);
    return 0;
}

static volatile long jt_sink;

/* A dense switch: gcc -O2 compiles it to a jump table (movslq, add, jmp). */
__attribute__((noinline)) static long jt_switch(long i, long x)
{
    switch (i) {
    case 0: x = x * 3 + 1; break;
    case 1: x ^= 0x5555; break;
    case 2: x <<= 3; break;
    case 3: x -= 77; break;
    case 4: x = ~x; break;
    case 5: x *= x; break;
    case 6: x = x / 7 + 2; break;
    case 7: x |= 0x100; break;
    default: x = 0;
    }
    jt_sink = x;
    return x;
}

/* Runs case `arg` (mod 9) and the next one ten times each; returns the sum. */
static void *jt_run(void *arg)
{
    long c = (intptr_t)arg, s = 0;
    for (long k = 0; k < 10; k++)
        s += jt_switch(c % 9, k) + jt_switch((c + 1) % 9, k);
    return (void *)(intptr_t)s;
}

static long jt_thread(long c)
{
    pthread_t t;
    void *r;
    if (pthread_create(&t, NULL, jt_run, (void *)(intptr_t)c) != 0)
        return -1000000;
    pthread_join(t, &r);
    return (intptr_t)r;
}

static int jumptable_case(void)
{
    long serial = 0, parallel = 0;
    for (long c = 0; c < 9; c++) {
        serial += jt_thread(c * 2);
        if (c % 4 == 3) {
            /* Long enough for the ended thread's ring to be drained and let go of. */
            struct timespec pause = {0, 30000000};
            nanosleep(&pause, NULL);
        }
    }
    pthread_t t[4];
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, jt_run, (void *)(intptr_t)(3 * i + 1));
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        parallel += (intptr_t)r;
    }
    fflush(stdout);
    pid_t p = fork();
    if (p == 0)
        _exit((int)(jt_thread(5) & 0x7f));
    long after = jt_thread(7);
    int status = 0;
    waitpid(p, &status, 0);
    printf("jumptable: serial %ld, parallel %ld, after the fork %ld, child status %d\n", serial,
           parallel, after, WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
    return 0;
}

static void *getppid_worker(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)(getppid() > 0);
}

static int syscall_case(void)
{
    pthread_t t;
    void *r;
    pthread_create(&t, NULL, getppid_worker, NULL);
    pthread_join(t, &r);
    printf("syscall: the worker's getppid %s\n", (intptr_t)r ? "returned" : "failed");
    return 0;
}

static unsigned char *new_code;

static void *call_new_code(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)((int (*)(void))new_code)();
}

static int newcode(void)
{
    new_code = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (int v = 1; v <= 5; v++) {
        unsigned char insns[] = {0xb8, (unsigned char)v, 0, 0, 0, 0xc3}; /* mov eax, v; ret */
        mprotect(new_code, 4096, PROT_READ | PROT_WRITE);
        memcpy(new_code, insns, sizeof insns);
        mprotect(new_code, 4096, PROT_READ | PROT_EXEC);
        pthread_t t;
        void *r;
        pthread_create(&t, NULL, call_new_code, NULL);
        pthread_join(t, &r);
        printf("newcode: thread %d returned %ld\n", v, (long)(intptr_t)r);
        munmap(new_code, 4096);
        new_code = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    return 0;
}

/* jitwriter: the page, its slots (32 bytes each), and the handshake. */
#define JIT_SLOTS 64
#define JIT_FUNCS 2000
static unsigned char *jit_page;
static volatile int jit_ready = -1, jit_want;

/* Maps the RWX page the jit cases write code into: 0, or 1 if it cannot be mapped. */
static int jit_map(void)
{
    jit_page = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return jit_page == MAP_FAILED;
}

/* Writes `lea rax, [rdi + 3k + 1]; ret` into slot k % JIT_SLOTS. */
static void jit_emit(int k)
{
    unsigned char c[] = {0x48, 0x8d, 0x87, 0, 0, 0, 0, 0xc3};
    int32_t imm = 3 * k + 1;
    memcpy(c + 3, &imm, 4);
    memcpy(jit_page + (k % JIT_SLOTS) * 32, c, sizeof c);
}

static void *jit_writer(void *arg)
{
    (void)arg;
    for (int k = 1; k < JIT_FUNCS; k++) {
        while (__atomic_load_n(&jit_want, __ATOMIC_ACQUIRE) < k)
            ;
        jit_emit(k);
        __atomic_store_n(&jit_ready, k, __ATOMIC_RELEASE);
    }
    return NULL;
}

static int jitwriter(void)
{
    if (jit_map())
        return 1;
    for (int k = JIT_SLOTS - 1; k >= 0; k--)
        jit_emit(k);
    __atomic_store_n(&jit_ready, 0, __ATOMIC_RELEASE);
    pthread_t t;
    pthread_create(&t, NULL, jit_writer, NULL);
    long sum = 0, bad = 0;
    for (int k = 0; k < JIT_FUNCS; k++) {
        while (__atomic_load_n(&jit_ready, __ATOMIC_ACQUIRE) < k)
            ;
        long r = ((long (*)(long))(jit_page + (k % JIT_SLOTS) * 32))(k);
        bad += r != 4L * k + 1;
        sum += r;
        __atomic_store_n(&jit_want, k + 1, __ATOMIC_RELEASE);
    }
    pthread_join(t, NULL);
    printf("jitwriter: %d functions, sum %ld, wrong %ld\n", JIT_FUNCS, sum, bad);
    return bad != 0;
}

/* jitversions: one function rewritten in place, and the version last written. */
#define JIT_VERSIONS 3000
static volatile int jit_version, jit_done;

/* Writes `mov eax, v; ret` at the start of the page. */
static void jit_emit_version(int v)
{
    unsigned char c[] = {0xb8, 0, 0, 0, 0, 0xc3};
    memcpy(c + 1, &v, 4);
    memcpy(jit_page, c, sizeof c);
}

static void *jit_rewriter(void *arg)
{
    (void)arg;
    for (int v = 1; v <= JIT_VERSIONS; v++) {
        jit_emit_version(v);
        __atomic_store_n(&jit_version, v, __ATOMIC_RELEASE);
        for (volatile int i = 0; i < 200; i++)
            ;
    }
    __atomic_store_n(&jit_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int jitversions(void)
{
    if (jit_map())
        return 1;
    jit_emit_version(0);
    pthread_t t;
    pthread_create(&t, NULL, jit_rewriter, NULL);
    long older = 0;
    while (!__atomic_load_n(&jit_done, __ATOMIC_ACQUIRE)) {
        int v = __atomic_load_n(&jit_version, __ATOMIC_ACQUIRE);
        unsigned a = 0, b, c = 0, d;
        __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
        older += ((int (*)(void))jit_page)() < v;
    }
    pthread_join(t, NULL);
    int last = ((int (*)(void))jit_page)();
    printf("jitversions: %d versions, older calls %ld, last %d\n", JIT_VERSIONS, older, last);
    return older != 0;
}

/* jitdata: pages of code that one thread runs and two others store data into. */
#define JITDATA_PAGES 8
#define JITDATA_STORES 300000
static unsigned char *jitdata_pages;
static int jitdata_stop, jitdata_started;

static void *jitdata_caller(void *arg)
{
    (void)arg;
    long calls = 0;
    __atomic_add_fetch(&jitdata_started, 1, __ATOMIC_ACQ_REL);
    for (unsigned i = 0; !__atomic_load_n(&jitdata_stop, __ATOMIC_ACQUIRE); i++)
        calls += ((int (*)(void))(jitdata_pages + (i % JITDATA_PAGES) * 4096))();
    return (void *)calls;
}

static void *jitdata_writer(void *arg)
{
    long id = (long)arg;
    __atomic_add_fetch(&jitdata_started, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(&jitdata_started, __ATOMIC_ACQUIRE) < 3)
        ;
    for (long i = 0; i < JITDATA_STORES; i++)
        ((volatile long *)(jitdata_pages + ((i * 7 + id) % JITDATA_PAGES) * 4096 + 2048 +
                           id * 1024))[i & 63] = i;
    return NULL;
}

static int jitdata(void)
{
    jitdata_pages = mmap(NULL, JITDATA_PAGES * 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (jitdata_pages == MAP_FAILED)
        return 1;
    for (int p = 0; p < JITDATA_PAGES; p++) {
        static const unsigned char ret1[] = {0xb8, 1, 0, 0, 0, 0xc3}; /* mov eax, 1; ret */
        memcpy(jitdata_pages + p * 4096, ret1, sizeof ret1);
    }
    pthread_t c, w0, w1;
    pthread_create(&c, NULL, jitdata_caller, NULL);
    pthread_create(&w0, NULL, jitdata_writer, (void *)0);
    pthread_create(&w1, NULL, jitdata_writer, (void *)1);
    pthread_join(w0, NULL);
    pthread_join(w1, NULL);
    __atomic_store_n(&jitdata_stop, 1, __ATOMIC_RELEASE);
    void *calls;
    pthread_join(c, &calls);
    long sum = 0;
    for (int p = 0; p < JITDATA_PAGES; p++)
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 64; j++)
                sum += ((long *)(jitdata_pages + p * 4096 + 2048 + k * 1024))[j] != 0;
    (void)calls;
    printf("jitdata: %d stores by each of 2 threads, %ld slots written\n", JITDATA_STORES,
           sum);
    return 0;
}

static volatile long forever;

static void *spin_forever(void *arg)
{
    (void)arg;
    for (;;)
        forever++;
    return NULL;
}

static int exit_case(void)
{
    pthread_t t;
    pthread_create(&t, NULL, spin_forever, NULL);
    while (forever < 1000000)
        ;
    printf("exit: leaving with a worker running\n");
    fflush(stdout);
    exit(3);
}

static volatile int stop_churning;
static pthread_mutex_t churn_lock = PTHREAD_MUTEX_INITIALIZER;
static long churned;

/* Takes a mutex and the allocator's locks all the time, so a fork may come while they are
 * held (the child touches neither the mutex nor the other threads' memory). */
static void *churn(void *arg)
{
    (void)arg;
    while (!stop_churning) {
        pthread_mutex_lock(&churn_lock);
        churned++;
        pthread_mutex_unlock(&churn_lock);
        free(malloc(64 + churned % 512));
    }
    return NULL;
}

static void *fork_worker(void *arg)
{
    int round = (int)(intptr_t)arg;
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        long sum = 0;
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, add_one, (void *)(intptr_t)i);
        for (int i = 0; i < 4; i++) {
            void *r;
            pthread_join(t[i], &r);
            sum += (intptr_t)r;
        }
        char *line = malloc(128);
        snprintf(line, 128, "fork: child %d started and joined 4 threads, sum %ld", round, sum);
        puts(line);
        free(line);
        exit(5);
    }
    int status = 0;
    if (p < 0 || waitpid(p, &status, 0) != p)
        return (void *)(intptr_t)-1;
    return (void *)(intptr_t)(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

static int fork_case(void)
{
    pthread_t c[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&c[i], NULL, churn, NULL);
    int fives = 0;
    for (int round = 0; round < 10; round++) {
        pthread_t f;
        void *status;
        pthread_create(&f, NULL, fork_worker, (void *)(intptr_t)round);
        pthread_join(f, &status);
        fives += (intptr_t)status == 5;
    }
    stop_churning = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(c[i], NULL);
    printf("fork: %d of 10 children exited with status 5\n", fives);
    return 0;
}

extern char **environ;

/* True once `forever` moves within about two seconds (the spinning worker still runs). */
static int spinner_runs(void)
{
    long before = forever;
    for (int i = 0; i < 2000; i++) {
        if (forever != before)
            return 1;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return 0;
}

static void *exec_worker(void *arg)
{
    (void)arg;
    char *argv[] = {"thread_cases", "exec-image", NULL};
    execve("/nonexistent/thread_cases", argv, environ);
    printf("exec: a failed execve gives %s; the spinning worker %s\n",
           errno == ENOENT ? "ENOENT" : strerror(errno),
           spinner_runs() ? "goes on" : "STOPPED");
    fflush(stdout);
    execve("/proc/self/exe", argv, environ);
    printf("exec: execve of /proc/self/exe failed: %s\n", strerror(errno));
    exit(1);
}

static int exec_case(void)
{
    pthread_t s, e;
    pthread_create(&s, NULL, spin_forever, NULL);
    while (forever == 0)
        ;
    pthread_create(&e, NULL, exec_worker, NULL);
    pthread_join(e, NULL);
    printf("exec: pthread_join returned\n");
    return 1;
}

static int exec_image(void)
{
    printf("exec: the new image runs, gettid() %s getpid()\n",
           syscall(SYS_gettid) == getpid() ? "==" : "!=");
    return 4;
}

static volatile long raw_sum;

static int raw_child(void *arg)
{
    raw_sum += (long)(intptr_t)arg;
    return 0;
}

static int rawclone_case(void)
{
    const int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
                      CLONE_SYSVSEM | CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID;
    size_t size = 1 << 16;
    char *stack = malloc(size);
    for (int i = 1; i <= 3; i++) {
        volatile pid_t tid = 0;
        pid_t t = clone(raw_child, stack + size, flags, (void *)(intptr_t)(i * 10),
                        (pid_t *)&tid, NULL, (pid_t *)&tid);
        if (t < 0) {
            perror("clone");
            return 1;
        }
        /* The kernel stores 0 into `tid` and wakes it when the thread exits. */
        while (tid != 0)
            syscall(SYS_futex, &tid, FUTEX_WAIT, t, NULL, NULL, 0);
        printf("rawclone: thread %d ended, sum %ld\n", i, raw_sum);
    }
    free(stack);
    return 0;
}

static volatile sig_atomic_t usr2_in[3];
static volatile int read_interrupted, cond_done;
static pthread_mutex_t sig_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sig_cond = PTHREAD_COND_INITIALIZER;
static int pipe_fds[2];

static void on_usr2(int sig)
{
    (void)sig;
    usr2_in[my_index]++;
}

static void unblock(int sig)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

/* Worker 1: SIGUSR2 unblocked, waits on a condition variable (a futex wait). */
static void *cond_waiter(void *arg)
{
    (void)arg;
    my_index = 1;
    unblock(SIGUSR2);
    pthread_mutex_lock(&sig_lock);
    while (!cond_done)
        pthread_cond_wait(&sig_cond, &sig_lock);
    pthread_mutex_unlock(&sig_lock);
    return NULL;
}

/* Worker 2: SIGUSR1 unblocked, reads an empty pipe until a signal interrupts the read. */
static void *pipe_reader(void *arg)
{
    (void)arg;
    my_index = 2;
    unblock(SIGUSR1);
    char c;
    ssize_t r = read(pipe_fds[0], &c, 1);
    read_interrupted = r < 0 && errno == EINTR;
    return NULL;
}

static int signal_case(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1; /* no SA_RESTART: the read fails with EINTR */
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = on_usr2;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR2, &sa, NULL);
    sigset_t both;
    sigemptyset(&both);
    sigaddset(&both, SIGUSR1);
    sigaddset(&both, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &both, NULL);
    if (pipe(pipe_fds) != 0)
        return 1;
    pthread_t waiter, reader;
    pthread_create(&waiter, NULL, cond_waiter, NULL);
    pthread_create(&reader, NULL, pipe_reader, NULL);
    /* A signal that comes before the read starts runs the handler but does not end the read:
     * send until the reader is out of it. */
    for (int i = 0; i < 5000 && !read_interrupted; i++) {
        kill(getpid(), SIGUSR1);
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    pthread_join(reader, NULL);
    printf("signal: SIGUSR1 to the process: the read %s; handler ran in main %s, worker 1 %s, "
           "worker 2 %s\n",
           read_interrupted ? "failed with EINTR" : "WAS NOT INTERRUPTED",
           usr1_in[0] ? "yes" : "no", usr1_in[1] ? "yes" : "no", usr1_in[2] ? "yes" : "no");
    for (int i = 0; i < 5000 && !usr2_in[1]; i++) {
        kill(getpid(), SIGUSR2);
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    pthread_mutex_lock(&sig_lock);
    cond_done = 1;
    pthread_cond_signal(&sig_cond);
    pthread_mutex_unlock(&sig_lock);
    pthread_join(waiter, NULL);
    printf("signal: SIGUSR2 to the process: handler ran in main %s, worker 1 %s, worker 2 %s; "
           "the condition wait went on\n",
           usr2_in[0] ? "yes" : "no", usr2_in[1] ? "yes" : "no", usr2_in[2] ? "yes" : "no");
    return 0;
}

int main(int argc, char **argv)
{
    const char *c = argc > 1 ? argv[1] : "counts";
    if (!strcmp(c, "counts"))
        return counts();
    if (!strcmp(c, "pingpong"))
        return pingpong();
    if (!strcmp(c, "fault"))
        return fault();
    if (!strcmp(c, "kill"))
        return kill_case();
    if (!strcmp(c, "cancel"))
        return cancel();
    if (!strcmp(c, "many"))
        return many();
    if (!strcmp(c, "serial"))
        return serial();
    if (!strcmp(c, "jumptable"))
        return jumptable_case();
    if (!strcmp(c, "syscall"))
        return syscall_case();
    if (!strcmp(c, "newcode"))
        return newcode();
    if (!strcmp(c, "jitwriter"))
        return jitwriter();
    if (!strcmp(c, "jitversions"))
        return jitversions();
    if (!strcmp(c, "jitdata"))
        return jitdata();
    if (!strcmp(c, "exit"))
        return exit_case();
    if (!strcmp(c, "fork"))
        return fork_case();
    if (!strcmp(c, "exec"))
        return exec_case();
    if (!strcmp(c, "exec-image"))
        return exec_image();
    if (!strcmp(c, "signal"))
        return signal_case();
    if (!strcmp(c, "rawclone"))
        return rawclone_case();
    fprintf(stderr, "unknown case %s\n", c);
    return 2;
}
