/* A PAP run longer than the longest kept: `spin` is a hot leaf function (one loop); its last
 * call loops 2^20 + 5 times, so its run of Ball-Larus paths (one per iteration, and the exit)
 * passes the 2^20 paths a run may have and is abandoned, at the same path as the per-block
 * recorder abandons it. The profile, `stats.pap_abandoned` included, must be the reference's
 * (tests/tests/paths.rs). */
#include <stdio.h>

static volatile unsigned sink;

/* A do-while: one loop and one `ret` (a `for` adds an early return for n == 0). */
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
