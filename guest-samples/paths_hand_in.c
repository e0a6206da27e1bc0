/* Hand-in (#21; docs/paths-design.md, "Hand-in as built"): `churn` is called once, early, and
 * loops 1 200 000 times, so its one activation is live when the monitor plans the function;
 * it goes on instrumented from one of its back edges. Its loop calls `mix` (entered
 * instrumented once planned) and, now and then, `putchar` (a call out to cold code). Its PAP
 * run — the cold paths before the hand-in, then the instrumented ones — passes the 2^20 paths
 * a run may have: abandoned once, as the per-block recorder abandons it, whether the recorder
 * had a run for it at the hand-in (the guest's run then goes on from it) or not (a function
 * not PAP-hot when the activation started: the guest's run is left out, and its abandonment
 * too). Then short calls, which start instrumented, record their runs. */
#include <stdio.h>

static volatile unsigned sink;

__attribute__((noinline)) static unsigned mix(unsigned x)
{
    unsigned y = x * 2654435761u;
    if (y & 0x100)
        y ^= y >> 7;
    else
        y += 3;
    return y;
}

/* A do-while: one `ret`. */
__attribute__((noinline)) static unsigned churn(unsigned n)
{
    unsigned s = 0, i = 0;
    do {
        if (i & 1)
            s += mix(i);
        else
            s ^= i >> 2;
        if ((i & 0xffff) == 0x8000)
            putchar('.');
    } while (++i < n);
    return s;
}

int main(void)
{
    unsigned t = churn(1200000);
    for (unsigned k = 0; k < 4; k++)
        t += churn(6 + k);
    sink = t;
    printf("\n%u\n", t);
    return 0;
}
