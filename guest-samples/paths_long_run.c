/* A PAP run longer than the longest kept (#21 step 3d): `spin` is a hot leaf function (one
 * `ret`, one loop), instrumented once hot; its last call loops 2^20 + 5 times, so its run of
 * Ball-Larus paths (one per iteration, and the exit) passes the 2^20 paths a run may have and
 * is abandoned — in the guest's run trie, at the same path as the per-block recorder abandons
 * it. The profile, `stats.pap_abandoned` included, must be the reference's. */
#include <stdio.h>

static volatile unsigned sink;

/* A do-while, so that gcc emits one `ret` (a `for` adds an early one for n == 0, and a
 * function with several is not instrumented yet). */
__attribute__((noinline)) static unsigned spin(unsigned n)
{
    unsigned s = 0, i = 0;
    do
        s += i ^ (s >> 3);
    while (++i < n);
    return s;
}

int main(void)
{
    unsigned t = 0;
    for (int k = 0; k < 3000; k++)
        t += spin(((unsigned)k & 7) + 1);
    t += spin((1u << 20) + 5);
    sink = t;
    printf("%u\n", t);
    return 0;
}
