/* Signal delivery to the guest: handlers installed with sigaction run on raise() and kill(),
 * with SA_SIGINFO data, a blocked signal stays pending until unblocked, and a handler runs
 * on an alternate stack (sigaltstack). */
#include <stdio.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include <stdint.h>

static volatile sig_atomic_t usr1_count, usr2_code, on_altstack;
static char altstack[64 * 1024];

static void on_usr1(int sig)
{
    if (sig == SIGUSR1)
        usr1_count++;
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
    raise(SIGUSR1);
    sigset_t pending;
    sigpending(&pending);
    printf("blocked: handled during block %d, pending %d\n", (int)usr1_count - before,
           sigismember(&pending, SIGUSR1));
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    printf("after unblock: handled %d\n", (int)usr1_count - before);

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
