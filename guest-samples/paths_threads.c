/* Per-thread path profiles: two threads run different functions at once, `squares` 100 times
 * in one and `parity` 50 times in the other, while main only starts and joins them. Each
 * thread's path profile must hold its own function alone (tests/tests/paths.rs). */
#include <pthread.h>
#include <stdio.h>

static volatile long sink;

__attribute__((noinline)) static long squares(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += i * i;
    return s;
}

__attribute__((noinline)) static long parity(long n)
{
    long c = 0;
    for (long i = 0; i < n; i++) {
        if (((i * 7) ^ (i >> 3)) & 1)
            c += 3;
        else
            c -= 1;
    }
    return c;
}

static void *run_squares(void *arg)
{
    (void)arg;
    for (int k = 0; k < 100; k++)
        sink = squares(1000 + k);
    return NULL;
}

static void *run_parity(void *arg)
{
    (void)arg;
    for (int k = 0; k < 50; k++)
        sink = parity(2000 + k);
    return NULL;
}

int main(void)
{
    pthread_t a, b;
    pthread_create(&a, NULL, run_squares, NULL);
    pthread_create(&b, NULL, run_parity, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("squares and parity done\n");
    return 0;
}
