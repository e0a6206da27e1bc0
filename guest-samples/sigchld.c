/* SIGCHLD: a SA_SIGINFO handler reaps children with waitpid(WNOHANG) in a loop (several exits may
 * coalesce into one SIGCHLD), counting them and summing their exit statuses, while the parent
 * loops on sched_yield until all are reaped; a child stopped and continued reports CLD_STOPPED,
 * CLD_CONTINUED, then CLD_EXITED. Only counts are printed.
 *
 * With the argument `sigsuspend` the parent waits the race-free way instead: SIGCHLD blocked
 * while it forks, then sigsuspend with it unblocked (SIGCHLD is usually already pending then). */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHILDREN 8

static volatile sig_atomic_t reaped, status_sum, handler_runs, last_code, from_kernel;
static volatile sig_atomic_t stopped, continued;

static void on_chld(int sig, siginfo_t *info, void *uc)
{
    (void)sig;
    (void)uc;
    handler_runs++;
    last_code = info->si_code;
    from_kernel += info->si_signo == SIGCHLD;
    int status;
    pid_t p;
    while ((p = waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED)) > 0) {
        if (WIFEXITED(status)) {
            reaped++;
            status_sum += WEXITSTATUS(status);
        } else if (WIFSTOPPED(status)) {
            stopped++;
        } else if (WIFCONTINUED(status)) {
            continued++;
        }
    }
}

/* Waits until *flag reaches n: with sigsuspend (SIGCHLD blocked outside it), or in a loop that
 * yields the CPU to the children (SIGCHLD unblocked, delivered whenever it arrives). */
static void wait_for(volatile sig_atomic_t *flag, int n, int use_sigsuspend, const sigset_t *unblocked)
{
    while (*flag < n) {
        if (use_sigsuspend)
            sigsuspend(unblocked);
        else
            sched_yield();
    }
}

int main(int argc, char **argv)
{
    int use_sigsuspend = argc == 2 && strcmp(argv[1], "sigsuspend") == 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_chld;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCHLD, &sa, NULL);

    sigset_t chld, old;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_SETMASK, NULL, &old);
    if (use_sigsuspend)
        sigprocmask(SIG_BLOCK, &chld, NULL);

    int expected_sum = 0;
    for (int i = 0; i < CHILDREN; i++) {
        fflush(stdout);
        pid_t p = fork();
        if (p < 0) {
            perror("fork");
            return 1;
        }
        if (p == 0) {
            /* Children exit in a scrambled order: some spin a little first. */
            volatile unsigned long spin = 0;
            for (unsigned long k = 0; k < (unsigned long)((i * 7) % 5) * 20000; k++)
                spin++;
            _exit(i + 1);
        }
        expected_sum += i + 1;
    }
    wait_for(&reaped, CHILDREN, use_sigsuspend, &old);
    printf("reaped %d children from the SIGCHLD handler, exit statuses sum to %d (expected %d)\n",
           (int)reaped, (int)status_sum, expected_sum);
    printf("handler ran at least once, between 1 and %d times: %s; siginfo says SIGCHLD: %s\n",
           CHILDREN, handler_runs >= 1 && handler_runs <= CHILDREN ? "yes" : "no",
           from_kernel == handler_runs ? "yes" : "no");

    /* A handler run may reap several children, so a SIGCHLD of a child already reaped can still
     * be pending (blocked, in the sigsuspend variant): deliver it now, so it cannot be taken
     * for the next child's CLD_STOPPED. */
    if (use_sigsuspend) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        sigprocmask(SIG_BLOCK, &chld, NULL);
    }

    /* A child stopped by SIGSTOP and continued: CLD_STOPPED then CLD_CONTINUED, then it exits. */
    int pipefd[2];
    if (pipe(pipefd) != 0)
        return 1;
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        char c;
        close(pipefd[1]);
        while (read(pipefd[0], &c, 1) == 1)
            ;
        _exit(50);
    }
    close(pipefd[0]);
    reaped = 0;
    status_sum = 0;
    kill(p, SIGSTOP);
    wait_for(&stopped, 1, use_sigsuspend, &old);
    printf("after SIGSTOP: si_code %s\n", last_code == CLD_STOPPED ? "CLD_STOPPED" : "other");
    kill(p, SIGCONT);
    wait_for(&continued, 1, use_sigsuspend, &old);
    printf("after SIGCONT: si_code %s\n", last_code == CLD_CONTINUED ? "CLD_CONTINUED" : "other");
    close(pipefd[1]);
    wait_for(&reaped, 1, use_sigsuspend, &old);
    printf("then it exited: si_code %s, status %d\n", last_code == CLD_EXITED ? "CLD_EXITED" : "other",
           (int)status_sum);
    return 0;
}
