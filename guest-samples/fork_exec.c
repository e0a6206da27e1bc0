/* fork then execve: the child runs /bin/echo (a different program) and the parent reaps it;
 * an execve that fails (ENOENT) in a child that then exits 127; execvp searching PATH; and
 * execve of /proc/self/exe, which must be this program again (hotpath makes /proc/self/exe name
 * the guest, not itself): the re-executed copy reports the argument it was given. The parent
 * flushes stdout before every fork so lines appear once and in order.
 *
 * With the argument `kill-early` only one part runs (a separate catalog sample): 40 times, a
 * child execs /bin/sleep and its parent sends it SIGTERM at once or within 2 ms, so the signal
 * reaches the child before, during or just after its execve; every child must die of it. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void describe(const char *who, int status)
{
    if (WIFEXITED(status))
        printf("%s: exited with status %d\n", who, WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        printf("%s: killed by signal %d\n", who, WTERMSIG(status));
}

static int spawn_and_wait(const char *who, const char *path, char *const argv[], int use_path)
{
    fflush(stdout);
    pid_t p = fork();
    if (p < 0) {
        perror("fork");
        return -1;
    }
    if (p == 0) {
        if (use_path)
            execvp(path, argv);
        else
            execve(path, argv, environ);
        /* Only reached when exec failed. */
        printf("%s: exec failed with %s\n", who, errno == ENOENT ? "ENOENT" : strerror(errno));
        fflush(stdout);
        _exit(127);
    }
    int status;
    if (waitpid(p, &status, 0) != p) {
        perror("waitpid");
        return -1;
    }
    describe(who, status);
    return status;
}

/* The `kill-early` part: 0 if every child died of SIGTERM. */
static int kill_early(void)
{
    int killed = 0;
    for (int i = 0; i < 40; i++) {
        fflush(stdout);
        pid_t p = fork();
        if (p < 0) {
            perror("fork");
            return 1;
        }
        if (p == 0) {
            char *sleep_argv[] = {"sleep", "3", NULL};
            execve("/bin/sleep", sleep_argv, environ);
            _exit(127);
        }
        if (i % 4)
            usleep((i % 4) * 500);
        kill(p, SIGTERM);
        int status;
        if (waitpid(p, &status, 0) != p) {
            perror("waitpid");
            return 1;
        }
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM)
            killed++;
        else
            describe("a child that should have died of SIGTERM", status);
    }
    printf("%d of 40 children died of SIGTERM\n", killed);
    return killed != 40;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "kill-early") == 0)
        return kill_early();
    if (argc == 3 && strcmp(argv[1], "--again") == 0) {
        /* The copy started through /proc/self/exe. */
        printf("re-executed through /proc/self/exe with \"%s\"\n", argv[2]);
        return 7;
    }

    char *echo_argv[] = {"echo", "hello from /bin/echo,", "two args", NULL};
    spawn_and_wait("/bin/echo", "/bin/echo", echo_argv, 0);

    char *missing_argv[] = {"no-such-program", NULL};
    spawn_and_wait("missing program", "/nonexistent/no-such-program", missing_argv, 0);

    char *printf_argv[] = {"printf", "%s|%s\\n", "found on PATH", "by execvp", NULL};
    spawn_and_wait("printf via PATH", "printf", printf_argv, 1);

    char *sh_argv[] = {"sh", "-c", "echo \"shell: $0 $1\"; exit 3", "zero", "one", NULL};
    spawn_and_wait("/bin/sh -c", "/bin/sh", sh_argv, 0);

    char *self_argv[] = {argv[0], "--again", "an argument", NULL};
    spawn_and_wait("/proc/self/exe", "/proc/self/exe", self_argv, 0);
    return 0;
}
