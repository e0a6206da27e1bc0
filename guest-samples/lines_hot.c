/* Source lines: built with -g (samples named lines_* are). main calls work() once and small()
 * LOOPS times; work() calls sum_squares() LOOPS times and small() LOOPS times. Nearly every
 * guest instruction is sum_squares's loop, on the line marked HOT; sum_squares runs in one
 * calling context (main;work;sum_squares), small in two (main;small and main;work;small). */
#include <stdio.h>

#define LOOPS 200
#define N 5000

/* Read at run time, so that gcc cannot fold the loops or clone the functions for constants. */
static volatile unsigned n_iter = N;
static volatile unsigned loops = LOOPS;

__attribute__((noinline)) static unsigned sum_squares(unsigned n) {
    unsigned s = 0;
    for (unsigned i = 0; i < n; i++)
        s += (i ^ s) * i; /* HOT */
    return s;
}

__attribute__((noinline)) static unsigned small(unsigned x) {
    return x * 3 + 1;
}

__attribute__((noinline)) static unsigned work(void) {
    unsigned t = 0;
    for (unsigned r = 0; r < loops; r++)
        t += sum_squares(n_iter) + small(r);
    return t;
}

int main(void) {
    unsigned t = work();
    for (unsigned r = 0; r < loops; r++)
        t += small(r);
    printf("%u\n", t);
    return 0;
}
