/* Thread starts and ends racing with what other threads do, many times per run; one case per
 * argument (bench/stress.sh runs each hundreds of times, the tests once per mode):
 *   join  - 20 rounds: 6 workers start and end at once; main joins half of them and a
 *           joiner thread the other half, while the workers are still ending (a thread that
 *           ends wakes whoever waits on its tid: CLONE_CHILD_CLEARTID's futex); then 6
 *           detached workers whose end main waits for on their tids itself (raw futex wait
 *           on pthread's tid word is not portable: a counter and a futex of its own instead);
 *   exit  - 8 times, a child process whose main thread calls exit(7) while a worker keeps
 *           starting and ending threads and two others wait on a condition variable (the
 *           interpreter that ends while its executor's threads go on): every child must end
 *           with status 7;
 *   fork  - 8 rounds: while two threads keep starting and ending threads, a worker forks;
 *           the child starts a thread of its own, joins it and exits 5; the worker reaps it;
 *   signal - 1000 rounds: a raw clone() thread (glibc's threads block every signal before
 *           they exit; this one does not) unblocks SIGRTMIN, which main blocks, and main
 *           queues one to the process just as the thread exits: the kernel gives it to the
 *           thread, or when that thread is gone to main once main unblocks it. Every one
 *           must reach the handler (a real-time signal is queued, never merged).
 * The output is a few deterministic lines. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void *work(void *arg)
{
    long s = (intptr_t)arg;
    for (int i = 0; i < 200; i++)
        s += i ^ s;
    return (void *)(intptr_t)(s & 0xffff);
}

struct join_job {
    pthread_t *threads;
    int n;
    long sum;
};

static void *joiner(void *arg)
{
    struct join_job *job = arg;
    for (int i = 0; i < job->n; i++) {
        void *r;
        pthread_join(job->threads[i], &r);
        job->sum += (intptr_t)r;
    }
    return NULL;
}

static int ended;

static void *detached_work(void *arg)
{
    work(arg);
    __atomic_add_fetch(&ended, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &ended, FUTEX_WAKE, 1, NULL, NULL, 0);
    return NULL;
}

static int join_case(void)
{
    long main_sum = 0, joiner_sum = 0;
    for (int round = 0; round < 20; round++) {
        pthread_t t[6];
        for (int i = 0; i < 6; i++)
            pthread_create(&t[i], NULL, work, (void *)(intptr_t)(round * 6 + i));
        struct join_job job = {t + 3, 3, 0};
        pthread_t j;
        pthread_create(&j, NULL, joiner, &job);
        for (int i = 0; i < 3; i++) {
            void *r;
            pthread_join(t[i], &r);
            main_sum += (intptr_t)r;
        }
        pthread_join(j, NULL);
        joiner_sum += job.sum;
        ended = 0;
        pthread_attr_t detached;
        pthread_attr_init(&detached);
        pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
        for (int i = 0; i < 6; i++) {
            pthread_t d;
            pthread_create(&d, &detached, detached_work, (void *)(intptr_t)i);
        }
        pthread_attr_destroy(&detached);
        int seen;
        while ((seen = __atomic_load_n(&ended, __ATOMIC_SEQ_CST)) < 6)
            syscall(SYS_futex, &ended, FUTEX_WAIT, seen, NULL, NULL, 0);
    }
    printf("join: main %ld, joiner %ld, 120 detached ended\n", main_sum, joiner_sum);
    return 0;
}

static volatile int churning = 1;

static void *churn(void *arg)
{
    (void)arg;
    while (churning) {
        pthread_t t;
        if (pthread_create(&t, NULL, work, NULL) == 0)
            pthread_join(t, NULL);
    }
    return NULL;
}

static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;

static void *wait_forever(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mutex);
    for (;;)
        pthread_cond_wait(&never, &mutex);
    return NULL;
}

static int exit_case(void)
{
    int sevens = 0;
    for (int i = 0; i < 8; i++) {
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) {
            pthread_t c, w[2];
            pthread_create(&c, NULL, churn, NULL);
            for (int k = 0; k < 2; k++)
                pthread_create(&w[k], NULL, wait_forever, NULL);
            /* Let the churn get going: a few thread lifetimes. */
            for (int k = 0; k < 3; k++) {
                pthread_t t;
                pthread_create(&t, NULL, work, NULL);
                pthread_join(t, NULL);
            }
            exit(7);
        }
        int status = 0;
        if (p > 0 && waitpid(p, &status, 0) == p && WIFEXITED(status) && WEXITSTATUS(status) == 7)
            sevens++;
    }
    printf("exit: %d of 8 children exited with status 7\n", sevens);
    return 0;
}

static void *fork_worker(void *arg)
{
    (void)arg;
    pid_t p = fork();
    if (p == 0) {
        pthread_t t;
        void *r;
        pthread_create(&t, NULL, work, (void *)(intptr_t)3);
        pthread_join(t, &r);
        _exit(5);
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
    for (int round = 0; round < 8; round++) {
        pthread_t f;
        void *status;
        pthread_create(&f, NULL, fork_worker, NULL);
        pthread_join(f, &status);
        fives += (intptr_t)status == 5;
    }
    churning = 0;
    for (int i = 0; i < 2; i++)
        pthread_join(c[i], NULL);
    printf("fork: %d of 8 children exited with status 5\n", fives);
    return 0;
}

static volatile int rt_got, rt_ending;

static void on_rt(int sig)
{
    (void)sig;
    __atomic_add_fetch(&rt_got, 1, __ATOMIC_SEQ_CST);
}

static int rt_exiting_thread(void *arg)
{
    (void)arg;
    sigset_t none;
    sigemptyset(&none);
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
    volatile long x = 0;
    for (int i = 0; i < 2000; i++)
        x += i;
    __atomic_store_n(&rt_ending, 1, __ATOMIC_SEQ_CST);
    /* A few instructions for the signal to land in before the exit. */
    for (int i = 0; i < 50; i++)
        x += i;
    syscall(SYS_exit, 0);
    return 0;
}

static char rt_stack[65536] __attribute__((aligned(16)));

static int signal_case(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_rt;
    sigaction(SIGRTMIN, &sa, NULL);
    sigset_t rt;
    sigemptyset(&rt);
    sigaddset(&rt, SIGRTMIN);
    sigprocmask(SIG_BLOCK, &rt, NULL);
    int sent = 0;
    static volatile pid_t tid;
    for (int round = 0; round < 1000; round++) {
        tid = 1;
        rt_ending = 0;
        int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
                    CLONE_SYSVSEM | CLONE_CHILD_CLEARTID | CLONE_PARENT_SETTID;
        if (clone(rt_exiting_thread, rt_stack + sizeof rt_stack, flags, NULL, (pid_t *)&tid, NULL,
                  (pid_t *)&tid) < 0)
            return 1;
        while (!__atomic_load_n(&rt_ending, __ATOMIC_SEQ_CST))
            ;
        union sigval v = {0};
        if (sigqueue(getpid(), SIGRTMIN, v) == 0)
            sent++;
        pid_t t;
        while ((t = tid) != 0)
            syscall(SYS_futex, &tid, FUTEX_WAIT, t, NULL, NULL, 0);
    }
    sigprocmask(SIG_UNBLOCK, &rt, NULL);
    for (int i = 0; i < 5000 && rt_got < sent; i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    printf("signal: %d of %d queued signals reached the handler\n", rt_got, sent);
    return 0;
}

int main(int argc, char **argv)
{
    const char *c = argc > 1 ? argv[1] : "join";
    if (!strcmp(c, "join"))
        return join_case();
    if (!strcmp(c, "exit"))
        return exit_case();
    if (!strcmp(c, "fork"))
        return fork_case();
    if (!strcmp(c, "signal"))
        return signal_case();
    fprintf(stderr, "unknown case %s\n", c);
    return 2;
}
