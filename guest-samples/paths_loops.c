/* Path-profiling sample: hot paths that follow from the source.
 *   branchy(n): a loop whose body takes one branch direction 3 times in 4;
 *   nested(n, m): a loop nest;
 *   fact(n): a recursive function.
 * noinline + a volatile sink keep each shape as written at -O2. */
#include <stdio.h>
#include <stdlib.h>

volatile long sink;

__attribute__((noinline)) long branchy(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        if ((i & 3) != 3) {
            asm volatile("" ::: "memory"); /* keeps a real branch (no cmov) */
            s += i;
        } else {
            asm volatile("" ::: "memory");
            s ^= i * 7;
        }
        sink = s;
    }
    return s;
}

__attribute__((noinline)) long nested(long n, long m) {
    long s = 0;
    for (long i = 0; i < n; i++)
        for (long j = 0; j < m; j++)
            sink = s += i * j;
    return s;
}

__attribute__((noinline)) long fact(long n) {
    if (n <= 1)
        return 1;
    return n * fact(n - 1);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    long calls = argc > 2 ? atol(argv[2]) : 10;
    long t = 0;
    for (long c = 0; c < calls; c++) {
        t += branchy(n);
        t += nested(10, 20);
        t += fact(12);
    }
    printf("%ld\n", t);
    return 0;
}
