/* A thread that ends in the middle of its paths: `walker` loops, and on iteration 37 calls
 * `leave`, which ends the thread with pthread_exit from inside its own loop, both activations
 * (and the thread's start routine's) live. Main then runs `walker` to its end. Each thread's
 * path profile from the default recorder must be the per-block reference's
 * (tests/tests/paths.rs). */
#include <pthread.h>
#include <stdio.h>

static volatile long sink;

__attribute__((noinline)) static void leave(long n)
{
    for (long i = 0; i < n; i++) {
        sink += i;
        if (i == n / 2)
            pthread_exit(NULL);
    }
}

__attribute__((noinline)) static long walker(long n, long stop_at)
{
    long s = 0;
    for (long i = 0; i < n; i++) {
        s += (i & 3) ? i : -i;
        if (i == stop_at)
            leave(40);
    }
    return s;
}

static void *run(void *arg)
{
    sink = walker(1000, (long)arg);
    return NULL;
}

int main(void)
{
    pthread_t t;
    pthread_create(&t, NULL, run, (void *)37L);
    pthread_join(t, NULL);
    sink = walker(500, -1);
    printf("walker done\n");
    return 0;
}
