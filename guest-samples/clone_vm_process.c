/* clone(CLONE_VM | SIGCHLD) with a stack of its own: a child process that shares its parent's
 * memory without being one of its threads (how LinuxThreads made threads). The child stores
 * into a variable the parent then reads. hotpath does not support such a process and must
 * say so in one line before the guest prints anything. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

static volatile int shared_value;

static int child(void *arg)
{
    (void)arg;
    shared_value = 42;
    return 0;
}

int main(void)
{
    size_t size = 1 << 16;
    char *stack = malloc(size);
    pid_t p = clone(child, stack + size, CLONE_VM | SIGCHLD, NULL);
    int status;
    if (p < 0 || waitpid(p, &status, 0) != p)
        return 1;
    printf("the child stored %d into the shared memory\n", shared_value);
    return 0;
}
