/* Indirect calls to four functions whose addresses share their low 16 bits (each aligned to
 * 64 KiB), in turn, 100,000 rounds: under hotpath every one of them indexes the same slot of
 * the indirect branch lookup table, and the victim table behind it must keep the others
 * (tests/tests/counts.rs checks the lookup misses; the catalog compares the output with a
 * native run). argv[1] = rounds. */
#include <stdio.h>
#include <stdlib.h>

#define ALIGNED __attribute__((noinline, aligned(65536)))

ALIGNED static long f0(long x) { return x + 1; }
ALIGNED static long f1(long x) { return x ^ 0x55; }
ALIGNED static long f2(long x) { return (x * 3) % 1000003; }
ALIGNED static long f3(long x) { return x - 7; }

typedef long (*op_fn)(long);
static op_fn volatile ops[4] = {f0, f1, f2, f3};

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? strtol(argv[1], NULL, 10) : 100000;
    long x = 1;
    unsigned low = 0;
    for (int k = 0; k < 4; k++)
        low |= (unsigned)((unsigned long)ops[k] & 0xffff);
    for (long i = 0; i < rounds; i++)
        for (int k = 0; k < 4; k++)
            x = ops[k](x);
    printf("x = %ld after %ld rounds; low 16 bits of the targets %s\n", x, rounds,
           low == 0 ? "all zero" : "not all zero");
    return 0;
}
