/* Thread starts and ends racing with what other threads do, many times per run; one case per
 * argument (bench/stress.sh runs each hundreds of times, the tests once per mode):
 *   join  - 40 rounds: 6 workers start and end at once; main joins half of them and a
 *           joiner thread the other half, while the workers are still ending (a thread that
 *           ends wakes whoever waits on its tid: CLONE_CHILD_CLEARTID's futex); then 6
 *           detached workers whose end main waits for on their tids itself (raw futex wait
 *           on pthread's tid word is not portable: a counter and a futex of its own instead);
 *   exit  - 20 times, a child process whose main thread calls exit(7) while a worker keeps
 *           starting and ending threads and two others wait on a condition variable (the
 *           interpreter that ends while its executor's threads go on): every child must end
 *           with status 7;
 *   fork  - 20 rounds: while two threads keep starting and ending threads, a worker forks;
 *           the child starts a thread of its own, joins it and exits 5; the worker reaps it.
 * The output is a few deterministic lines. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
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
    for (int round = 0; round < 40; round++) {
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
    printf("join: main %ld, joiner %ld, 240 detached ended\n", main_sum, joiner_sum);
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
    for (int i = 0; i < 20; i++) {
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
    printf("exit: %d of 20 children exited with status 7\n", sevens);
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
    for (int round = 0; round < 20; round++) {
        pthread_t f;
        void *status;
        pthread_create(&f, NULL, fork_worker, NULL);
        pthread_join(f, &status);
        fives += (intptr_t)status == 5;
    }
    churning = 0;
    for (int i = 0; i < 2; i++)
        pthread_join(c[i], NULL);
    printf("fork: %d of 20 children exited with status 5\n", fives);
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
    fprintf(stderr, "unknown case %s\n", c);
    return 2;
}
