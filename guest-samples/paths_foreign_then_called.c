/* A function first entered only by an indirect jump from another function (a tail call
 * through a pointer: a foreign jump, as a PLT stub's into its library), then called, then
 * jumped to again: from its first call on, a jump to its entry is a tail call. 1,000 of each
 * (tests/tests/paths.rs: the recorders must agree on the resynchronisations' causes). */
#include <stdio.h>

typedef long (*fn)(long);

__attribute__((noinline)) static long target(long x)
{
    return x * 3 + 1;
}

/* gcc -O2 makes the call through `f` a jump (`jmp *%rdi`-like): `via`'s activation is
 * replaced by `target`'s. */
__attribute__((noinline)) static long via(fn f, long x)
{
    return f(x + 1);
}

int main(void)
{
    fn volatile p = target;
    long s = 0;
    for (long i = 0; i < 1000; i++)
        s += via(p, i);
    for (long i = 0; i < 1000; i++)
        s += p(i);
    for (long i = 0; i < 1000; i++)
        s += via(p, i);
    printf("%ld\n", s);
    return 0;
}
