/* Threads, one case per argument:
 *   counts    - 4 workers; worker k runs the two-instruction loop at `spin_loop` exactly
 *               (k + 1) * 100000 times (tests/tests/threads.rs checks the per-thread counts);
 *   pingpong  - two threads hand a token back and forth 20000 times with a mutex and condvars;
 *   fault     - a worker dereferences NULL, its SIGSEGV handler siglongjmps back, twice;
 *   kill      - pthread_kill(SIGUSR1) reaches the one worker it names, blocked in sigsuspend;
 *   cancel    - pthread_cancel of a worker blocked in pause(), joined as PTHREAD_CANCELED;
 *   many      - 8 rounds of 64 threads created and joined;
 *   exit      - main calls exit(3) while a worker spins in a loop forever. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    if (!strcmp(c, "exit"))
        return exit_case();
    fprintf(stderr, "unknown case %s\n", c);
    return 2;
}
