/* Processes: fork several children that exit with distinct statuses and are reaped with
 * waitpid by pid, in an order different from their creation; a child killed by a signal; a
 * child that inherits unflushed stdio buffers; vfork + _exit; a grandchild reaped by its own
 * parent; wait4 with WNOHANG before and after a child exits. Children compute something on
 * memory the parent changed before the fork (copy-on-write), and the parent checks that a
 * child's writes did not reach it. No pids are printed.
 *
 * With the argument `kill-paused` only one part runs (a separate catalog sample): 200 times, a
 * child tells its parent it is ready and blocks in pause(); the parent kills it with SIGTERM at
 * once, so the signal often arrives just as the child enters the syscall. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#define CHILDREN 6

static unsigned long shared_counter = 1000;
static char heap_note[64];

static void describe(const char *who, int status)
{
    if (WIFEXITED(status))
        printf("%s: exited with status %d\n", who, WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        printf("%s: killed by signal %d%s\n", who, WTERMSIG(status), WCOREDUMP(status) ? " (core)" : "");
    else
        printf("%s: odd status %#x\n", who, status);
}

/* A child's work: a checksum over memory it inherited, folded into its exit status. */
static int child_work(int i)
{
    uint64_t h = FNV_OFFSET;
    char *buf = malloc(1 << 20);
    if (!buf)
        return 99;
    for (int k = 0; k < (1 << 20); k++)
        buf[k] = (char)(k * (i + 3));
    h = fnv_bytes(h, buf, 1 << 20);
    h = fnv_u64(h, shared_counter);
    free(buf);
    shared_counter = 0; /* must not be seen by the parent */
    strcpy(heap_note, "written by a child");
    return (int)(h % 50) + i * 10;
}

/* 200 children blocked in pause() (or about to be) killed by SIGTERM from the parent. */
static int kill_paused(void)
{
    int killed = 0;
    for (int i = 0; i < 200; i++) {
        int go[2];
        if (pipe(go) != 0)
            return 1;
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) {
            if (write(go[1], "r", 1) != 1)
                _exit(2);
            for (;;)
                pause();
        }
        char c;
        if (read(go[0], &c, 1) != 1)
            return 1;
        close(go[0]);
        close(go[1]);
        kill(p, SIGTERM);
        int status;
        waitpid(p, &status, 0);
        killed += WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM;
    }
    printf("%d of 200 children in pause() killed by SIGTERM\n", killed);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "kill-paused") == 0)
        return kill_paused();
    pid_t parent = getpid();
    strcpy(heap_note, "parent's note");
    shared_counter = 4242;

    /* 1. Several children at once, reaped by pid in reverse order. */
    pid_t pids[CHILDREN];
    int expected[CHILDREN];
    for (int i = 0; i < CHILDREN; i++) {
        fflush(stdout);
        pid_t p = fork();
        if (p < 0) {
            perror("fork");
            return 1;
        }
        if (p == 0) {
            if (getppid() != parent)
                _exit(200);
            _exit(child_work(i));
        }
        pids[i] = p;
    }
    /* The parent computes what each child's status must be, the same way. */
    for (int i = 0; i < CHILDREN; i++) {
        unsigned long saved = shared_counter;
        char note[64];
        memcpy(note, heap_note, sizeof note);
        expected[i] = child_work(i);
        shared_counter = saved;
        memcpy(heap_note, note, sizeof note);
    }
    for (int i = CHILDREN - 1; i >= 0; i--) {
        int status = 0;
        pid_t r = waitpid(pids[i], &status, 0);
        char who[48];
        snprintf(who, sizeof who, "child %d (%s pid)", i, r == pids[i] ? "right" : "WRONG");
        describe(who, status);
        printf("  status as computed by the parent: %s\n",
               WIFEXITED(status) && WEXITSTATUS(status) == expected[i] ? "yes" : "no");
    }
    printf("parent's memory after the children wrote theirs: counter %lu, note \"%s\"\n", shared_counter,
           heap_note);
    errno = 0;
    pid_t none = waitpid(-1, NULL, 0);
    printf("waitpid with no children left: %d, %s\n", (int)none, errno == ECHILD ? "ECHILD" : "other errno");

    /* 2. A child killed by a signal it sends itself, and one killed by its parent. */
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        kill(getpid(), SIGUSR1);
        _exit(1);
    }
    int status;
    waitpid(p, &status, 0);
    describe("child that sent itself SIGUSR1", status);

    int go[2];
    if (pipe(go) != 0)
        return 1;
    fflush(stdout);
    p = fork();
    if (p == 0) {
        close(go[0]);
        if (write(go[1], "r", 1) != 1)
            _exit(2);
        for (volatile unsigned long spin = 0;; spin++)
            ;
    }
    close(go[1]);
    char c;
    if (read(go[0], &c, 1) != 1)
        return 1;
    kill(p, SIGTERM);
    waitpid(p, &status, 0);
    describe("spinning child the parent sent SIGTERM", status);

    /* 3. WNOHANG before the child has exited, then a blocking wait4 with rusage. */
    int hold[2];
    if (pipe(hold) != 0)
        return 1;
    fflush(stdout);
    p = fork();
    if (p == 0) {
        close(hold[1]);
        while (read(hold[0], &c, 1) == 1)
            ;
        _exit(17);
    }
    close(hold[0]);
    printf("WNOHANG while the child waits: %d\n", (int)waitpid(p, &status, WNOHANG));
    close(hold[1]);
    struct rusage ru;
    pid_t r = wait4(p, &status, 0, &ru);
    describe(r == p ? "child reaped by wait4" : "wait4 returned another pid", status);

    /* 4. A child that forks a grandchild and reaps it itself. */
    fflush(stdout);
    p = fork();
    if (p == 0) {
        pid_t g = fork();
        if (g == 0)
            _exit(33);
        int gs;
        if (waitpid(g, &gs, 0) != g || !WIFEXITED(gs))
            _exit(100);
        _exit(WEXITSTATUS(gs) + 1);
    }
    waitpid(p, &status, 0);
    describe("child that reaped its own child (33) and added one", status);

    /* 5. vfork: the parent is suspended until the child calls _exit. */
    fflush(stdout);
    p = vfork();
    if (p == 0)
        _exit(44);
    waitpid(p, &status, 0);
    describe("vfork child", status);

    /* 6. Unflushed stdio: the child inherits the buffer and flushes its copy at exit, so the
     * line appears twice (stdout is a pipe or file here, so it is fully buffered). */
    printf("this line was buffered before fork\n");
    p = fork();
    if (p == 0)
        exit(0);
    waitpid(p, &status, 0);
    return 0;
}
