/* Signal delivery to the guest: handlers installed with sigaction run on raise() and kill(),
 * with SA_SIGINFO data, a blocked signal stays pending until unblocked and its handler runs
 * exactly when it is unblocked (inside that sigprocmask call, before the next statement), the
 * handler's own signal and sa_mask are blocked while it runs, SA_RESETHAND and SA_NODEFER, and
 * a handler runs on an alternate stack (sigaltstack, SA_ONSTACK). */
#include <stdio.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include <stdint.h>

static volatile sig_atomic_t usr1_count, usr2_code, on_altstack;
/* Program steps, so a handler can record when it ran. */
static volatile sig_atomic_t step, usr1_ran_at_step;
static volatile sig_atomic_t mask_seen, nested_depth, max_nested_depth, resethand_runs;
static char altstack[64 * 1024];

static void on_usr1(int sig)
{
    if (sig == SIGUSR1) {
        usr1_count++;
        usr1_ran_at_step = step;
    }
}

/* Records which of SIGUSR1 (own signal), SIGUSR2 (in sa_mask) and SIGHUP are blocked inside. */
static void on_mask_probe(int sig)
{
    (void)sig;
    sigset_t cur;
    sigprocmask(SIG_BLOCK, NULL, &cur);
    mask_seen = sigismember(&cur, SIGPROF) * 100 + sigismember(&cur, SIGUSR2) * 10 + sigismember(&cur, SIGHUP);
}

/* With SA_NODEFER the handler can be re-entered by its own signal. */
static void on_nodefer(int sig)
{
    nested_depth++;
    if (nested_depth > max_nested_depth)
        max_nested_depth = nested_depth;
    if (nested_depth < 3)
        raise(sig);
    nested_depth--;
}

static void on_resethand(int sig)
{
    (void)sig;
    resethand_runs++;
}

static void on_usr2(int sig, siginfo_t *info, void *uctx)
{
    (void)uctx;
    usr2_code = sig * 1000 + info->si_signo * 10 + (info->si_code == SI_TKILL || info->si_code == SI_USER);
}

static void on_alt(int sig)
{
    char here;
    (void)sig;
    uintptr_t p = (uintptr_t)&here, lo = (uintptr_t)altstack;
    on_altstack = p >= lo && p < lo + sizeof altstack;
}

int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);

    for (int i = 0; i < 100; i++)
        raise(SIGUSR1);
    printf("SIGUSR1 handled %d times\n", (int)usr1_count);

    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_usr2;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGUSR2, &sa, NULL);
    kill(getpid(), SIGUSR2);
    printf("SIGUSR2 siginfo code %d\n", (int)usr2_code);

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    int before = usr1_count;
    step = 1;
    raise(SIGUSR1);
    step = 2;
    sigset_t pending;
    sigpending(&pending);
    printf("blocked: handled during block %d, pending %d\n", (int)usr1_count - before,
           sigismember(&pending, SIGUSR1));
    step = 3;
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    step = 4;
    sigpending(&pending);
    printf("after unblock: handled %d, at step %d (3 = inside the unblocking sigprocmask), still pending %d\n",
           (int)usr1_count - before, (int)usr1_ran_at_step, sigismember(&pending, SIGUSR1));

    /* While a handler runs, its own signal and its sa_mask are blocked, nothing else. */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_mask_probe;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR2);
    sigaction(SIGPROF, &sa, NULL);
    raise(SIGPROF);
    sigset_t after_handler;
    sigprocmask(SIG_BLOCK, NULL, &after_handler);
    printf("inside a handler: own signal blocked %d, sa_mask signal blocked %d, other blocked %d; "
           "after it, own signal blocked %d\n",
           (int)mask_seen / 100, (int)mask_seen / 10 % 10, (int)mask_seen % 10,
           sigismember(&after_handler, SIGPROF));

    /* SA_NODEFER: re-entered by its own signal; SA_RESETHAND: back to SIG_DFL after one run. */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_nodefer;
    sa.sa_flags = SA_NODEFER;
    sigaction(SIGUSR2, &sa, NULL);
    raise(SIGUSR2);
    printf("SA_NODEFER: handler nested %d deep\n", (int)max_nested_depth);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_resethand;
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGURG, &sa, NULL);
    raise(SIGURG);
    struct sigaction now;
    sigaction(SIGURG, NULL, &now);
    printf("SA_RESETHAND: ran %d time(s), disposition now SIG_DFL %d\n", (int)resethand_runs,
           now.sa_handler == SIG_DFL);

    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alt;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGWINCH, &sa, NULL);
    raise(SIGWINCH);
    printf("SA_ONSTACK handler ran on the alternate stack: %d\n", (int)on_altstack);

    signal(SIGUSR1, SIG_IGN);
    raise(SIGUSR1);
    printf("ignored SIGUSR1 survived\n");
    return 0;
}
