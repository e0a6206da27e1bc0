/* Benchmark: call/return-bound recursion — naive Fibonacci plus a recursive tak — tens of
 * millions of calls, so return-address handling dominates. argv[1] = n (default 39). */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>

__attribute__((noinline)) static uint64_t fib(unsigned n)
{
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

__attribute__((noinline)) static int tak(int x, int y, int z)
{
    return y < x ? tak(tak(x - 1, y, z), tak(y - 1, z, x), tak(z - 1, x, y)) : z;
}

int main(int argc, char **argv)
{
    unsigned n = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 39;
    uint64_t f = fib(n);
    int t = tak((int)n / 2, (int)n / 4, (int)n / 8);
    printf("fib(%u) = %llu, tak(%u,%u,%u) = %d\n", n, (unsigned long long)f, n / 2, n / 4, n / 8, t);
    return 0;
}
