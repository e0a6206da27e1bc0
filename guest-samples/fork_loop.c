/* A loop of forks, as a shell runs commands: each child runs code the parent never runs (a
 * small checksum over its index, the same blocks in every child) and exits with part of it;
 * the parent reaps each child before it forks the next and prints the sum of their statuses.
 * Under hotpath each child is a process of its own: the blocks only children run are
 * translated by the first child and found in the translation cache by the later ones. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#define CHILDREN 8

/* Runs in the children only. */
static __attribute__((noinline)) int child_work(int i)
{
    uint64_t h = FNV_OFFSET;
    for (int k = 0; k < 200; k++) {
        switch (k & 3) {
        case 0:
            h = fnv_u64(h, (uint64_t)k * 3);
            break;
        case 1:
            h ^= h >> 7;
            break;
        case 2:
            h += (uint64_t)i << 5;
            break;
        default:
            h = fnv_u64(h, h >> 11);
        }
    }
    return (int)(h & 0x7f);
}

int main(void)
{
    int sum = 0;
    for (int i = 0; i < CHILDREN; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0)
            _exit(child_work(i));
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) {
            printf("child %d did not exit\n", i);
            return 1;
        }
        sum += WEXITSTATUS(status);
    }
    printf("%d children, statuses sum to %d\n", CHILDREN, sum);
    return 0;
}
