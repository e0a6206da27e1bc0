/* Asynchronous signals: SIGALRM and SIGVTALRM from interval timers interrupting a pure spin
 * loop (no syscalls: delivery must happen between translated blocks), SIGUSR1 sent with kill in
 * a loop, a signal raised from inside a handler, standard signals coalescing while blocked and
 * real-time signals queueing in order with their values, a blocking read interrupted with and
 * without SA_RESTART, sigsuspend and nanosleep woken by a timer. Only counts and error codes are
 * printed, never timing.
 *
 * With no argument every part runs except those the catalog runs as separate samples, by name:
 * `rt-queue` (real-time signals queueing), `restart` (SA_RESTART read) and `sigsuspend`, and
 * `counted-alarms`, whose output depends on timing (tests/tests/superblocks.rs reads it). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <stdlib.h>
#include <unistd.h>

#define ALARMS 5
#define KILLS 1000

static volatile sig_atomic_t alarms, vtalarms, usr1s, usr2s, usr2_nested, in_usr1;
static volatile sig_atomic_t rt_order[8], rt_count;
static int pipe_fds[2];

static void on_alarm(int sig)
{
    if (sig == SIGALRM)
        alarms++;
}

static void on_vtalarm(int sig)
{
    if (sig == SIGVTALRM)
        vtalarms++;
}

static void on_usr2(int sig)
{
    (void)sig;
    usr2s++;
    usr2_nested += in_usr1;
}

static void on_usr1(int sig)
{
    (void)sig;
    in_usr1 = 1;
    usr1s++;
    /* A signal raised inside a handler is delivered inside it (SIGUSR2 is not blocked). */
    if (usr1s % 100 == 0)
        kill(getpid(), SIGUSR2);
    in_usr1 = 0;
}

static void on_rt(int sig, siginfo_t *info, void *uc)
{
    (void)uc;
    if (rt_count < 8)
        rt_order[rt_count] = (sig - SIGRTMIN) * 100 + info->si_value.sival_int;
    rt_count++;
}

/* The SIGALRM handler for the blocking-read tests writes one byte into the pipe, so a restarted
 * read finds it; without SA_RESTART the read fails with EINTR first. */
static void on_alarm_write(int sig)
{
    (void)sig;
    alarms++;
    char c = 'x';
    if (write(pipe_fds[1], &c, 1) != 1)
        _exit(90);
}

static void install(int sig, void (*handler)(int), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL) != 0) {
        perror("sigaction");
        _exit(91);
    }
}

static void set_timer(int which, long usec)
{
    struct itimerval it = {{0, usec}, {0, usec}};
    if (setitimer(which, &it, NULL) != 0) {
        perror("setitimer");
        _exit(92);
    }
}

static void one_shot_alarm(long usec)
{
    struct itimerval it = {{0, 0}, {0, usec}};
    setitimer(ITIMER_REAL, &it, NULL);
}

static void timers(void)
{
    /* 1. A 1 ms SIGALRM timer while the program spins in a loop without syscalls. */
    install(SIGALRM, on_alarm, 0);
    set_timer(ITIMER_REAL, 1000);
    unsigned long spins = 0;
    while (alarms < ALARMS)
        spins++;
    set_timer(ITIMER_REAL, 0);
    printf("SIGALRM: at least %d deliveries while spinning (%s)\n", ALARMS,
           spins > 0 ? "the loop ran" : "the loop never ran");

    /* 2. SIGVTALRM counts this process's user CPU time: spinning must make it fire. */
    install(SIGVTALRM, on_vtalarm, 0);
    set_timer(ITIMER_VIRTUAL, 2000);
    while (vtalarms < 3)
        spins++;
    set_timer(ITIMER_VIRTUAL, 0);
    printf("SIGVTALRM: at least 3 deliveries on CPU time\n");
}

static void kills(void)
{

    /* 3. kill(getpid(), SIGUSR1) in a loop: every one is delivered before kill returns. */
    install(SIGUSR1, on_usr1, 0);
    install(SIGUSR2, on_usr2, 0);
    int late = 0;
    for (int i = 1; i <= KILLS; i++) {
        kill(getpid(), SIGUSR1);
        if (usr1s != i)
            late++;
    }
    printf("SIGUSR1: %d sent, %d handled, %d not handled by the time kill returned\n", KILLS,
           (int)usr1s, late);
    printf("SIGUSR2 raised inside the SIGUSR1 handler: %d handled, %d of them nested\n",
           (int)usr2s, (int)usr2_nested);

}

/* 4. Blocked standard signals coalesce. */
static void coalesce(void)
{
    install(SIGUSR1, on_usr1, 0);
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, &old);
    int before = usr1s;
    for (int i = 0; i < 3; i++)
        kill(getpid(), SIGUSR1);
    printf("while blocked: %d SIGUSR1 handled\n", (int)usr1s - before);
    sigprocmask(SIG_SETMASK, &old, NULL);
    printf("after unblocking: SIGUSR1 handled %d time(s) for 3 sent\n", (int)usr1s - before);
}

/* 4b. Blocked real-time signals queue, each with its value; pending SIGUSR1 too. The order in
 * which Linux runs the handlers when all are unblocked at once is part of what is compared. */
static void rt_queue(void)
{
    install(SIGUSR1, on_usr1, 0);
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigaddset(&block, SIGRTMIN);
    sigaddset(&block, SIGRTMIN + 1);
    sigprocmask(SIG_BLOCK, &block, &old);
    int before = usr1s;
    for (int i = 0; i < 3; i++)
        kill(getpid(), SIGUSR1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_rt;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGRTMIN, &sa, NULL);
    sigaction(SIGRTMIN + 1, &sa, NULL);
    union sigval v;
    for (int i = 1; i <= 3; i++) {
        v.sival_int = i;
        sigqueue(getpid(), SIGRTMIN + 1, v);
    }
    for (int i = 4; i <= 5; i++) {
        v.sival_int = i;
        sigqueue(getpid(), SIGRTMIN, v);
    }
    printf("while blocked: %d SIGUSR1 and %d real-time handled\n", (int)usr1s - before,
           (int)rt_count);
    sigprocmask(SIG_SETMASK, &old, NULL);
    printf("after unblocking: SIGUSR1 handled %d time(s) for 3 sent; %d real-time handled:",
           (int)usr1s - before, (int)rt_count);
    for (int i = 0; i < rt_count && i < 8; i++)
        printf(" %d", (int)rt_order[i]);
    printf("\n");
}

/* 5. A blocking read on an empty pipe, interrupted by SIGALRM without SA_RESTART. */
static void read_eintr(void)
{
    if (pipe(pipe_fds) != 0) {
        perror("pipe");
        exit(1);
    }
    char c;
    install(SIGALRM, on_alarm_write, 0);
    one_shot_alarm(20000);
    errno = 0;
    ssize_t n = read(pipe_fds[0], &c, 1);
    printf("read without SA_RESTART: returned %zd, errno %s\n", n, errno == EINTR ? "EINTR" : strerror(errno));
    n = read(pipe_fds[0], &c, 1);
    printf("  then the byte the handler wrote: %zd '%c'\n", n, n == 1 ? c : '?');
}

/* 5b. The same with SA_RESTART: the read restarts after the handler and finds its byte. */
static void read_restart(void)
{
    if (pipe(pipe_fds) != 0) {
        perror("pipe");
        exit(1);
    }
    char c;
    ssize_t n;
    install(SIGALRM, on_alarm_write, SA_RESTART);
    one_shot_alarm(20000);
    errno = 0;
    n = read(pipe_fds[0], &c, 1);
    printf("read with SA_RESTART: returned %zd '%c' (restarted after the handler)\n", n, n == 1 ? c : '?');
}

/* 6. sigsuspend returns after the handler of the signal it waited for (which arrives while it
 * waits). */
static void suspend(void)
{
    install(SIGALRM, on_alarm, 0);
    sigset_t alrm, wait_mask, old;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    sigprocmask(SIG_BLOCK, &alrm, &old);
    int alarms_before = alarms;
    one_shot_alarm(10000);
    wait_mask = old;
    sigdelset(&wait_mask, SIGALRM);
    errno = 0;
    int r = sigsuspend(&wait_mask);
    printf("sigsuspend: returned %d, errno %s, handler ran %d time(s)\n", r,
           errno == EINTR ? "EINTR" : strerror(errno), (int)alarms - alarms_before);
    sigprocmask(SIG_SETMASK, &old, NULL);
}

/* 7. nanosleep interrupted: EINTR and a remaining time. */
static void sleeps(void)
{
    install(SIGALRM, on_alarm, 0);
    one_shot_alarm(10000);
    struct timespec req = {5, 0}, rem = {0, 0};
    errno = 0;
    int r = nanosleep(&req, &rem);
    printf("nanosleep(5 s): returned %d, errno %s, remaining time between 4 and 5 s: %s\n", r,
           errno == EINTR ? "EINTR" : strerror(errno), rem.tv_sec == 4 ? "yes" : "no");
}

/* 8. (Only by name: its counts depend on timing.) A 200 us SIGALRM timer interrupting a hot
 * counting loop 50 times, the exact numbers printed: the profile must count the handler as
 * often as it ran, however the loop was translated when the signals came. */
static void counted_alarms(void)
{
    install(SIGALRM, on_alarm, 0);
    alarms = 0;
    set_timer(ITIMER_REAL, 200);
    unsigned long spins = 0;
    while (alarms < 50)
        spins = spins * 3 + 1;
    /* A SIGALRM still pending is delivered as this call returns: `alarms` is final after it. */
    set_timer(ITIMER_REAL, 0);
    printf("alarms %d (loop value %lu)\n", (int)alarms, spins % 7);
}

static const struct {
    const char *name;
    void (*run)(void);
    int by_default;
} parts[] = {
    {"timers", timers, 1},   {"kills", kills, 1},          {"coalesce", coalesce, 1},
    {"rt-queue", rt_queue, 0}, {"read-eintr", read_eintr, 1}, {"restart", read_restart, 0},
    {"sigsuspend", suspend, 0}, {"nanosleep", sleeps, 1}, {"counted-alarms", counted_alarms, 0},
};

int main(int argc, char **argv)
{
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        int chosen = argc == 1 ? parts[i].by_default : 0;
        for (int a = 1; a < argc; a++)
            chosen |= strcmp(argv[a], parts[i].name) == 0;
        if (chosen)
            parts[i].run();
    }
    return 0;
}
