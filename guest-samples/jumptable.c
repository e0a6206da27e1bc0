/* A dense switch that gcc compiles to a jump table (an indirect `jmp` through a table of
 * 16 targets), driven by a pseudo-random selector so every target and many target-to-target
 * transitions run. The test harness checks with objdump that the indirect jmp is there. */
#include <stdio.h>
#include <stdint.h>
#include "common.h"

/* noinline keeps the switch (and its jump table) in one place that objdump can find. */
__attribute__((noinline)) static uint64_t step(unsigned sel, uint64_t x, uint64_t *acc)
{
    switch (sel) {
    case 0: x += 0x1234567; break;
    case 1: x ^= x >> 7; acc[0]++; break;
    case 2: x *= 0x9e3779b97f4a7c15ULL; break;
    case 3: x = (x << 13) | (x >> 51); acc[1] += x & 0xff; break;
    case 4: x -= acc[0] * 3; break;
    case 5: x = ~x; acc[2] ^= x; break;
    case 6: x += (x >> 3) * 5; break;
    case 7: x ^= 0xdeadbeefcafef00dULL; acc[3]--; break;
    case 8: x = x / 3 + 17; break;
    case 9: x ^= acc[1] << 9; acc[0] += 2; break;
    case 10: x += x << 21; break;
    case 11: x = x % 1000000007ULL + acc[2]; break;
    case 12: x |= 0x8000000000000001ULL; acc[1]--; break;
    case 13: x &= 0x7fffffffffffff00ULL; x += 99; break;
    case 14: x = (x >> 1) ^ (-(x & 1) & 0xd800000000000000ULL); break;
    case 15: x += acc[3]; acc[2] += 5; break;
    default: x = 0; acc[3] += 1000; break;
    }
    return x;
}

int main(void)
{
    uint64_t acc[4] = {0, 0, 0, 0};
    uint64_t seed = 42, x = 1;
    unsigned hist[17] = {0};

    for (int i = 0; i < 200000; i++) {
        unsigned sel = (unsigned)(rng_next(&seed) % 17); /* 16 = default case */
        hist[sel]++;
        x = step(sel, x, acc);
    }
    /* A fixed cyclic pattern too: the same indirect site, predictable targets. */
    for (int i = 0; i < 50000; i++)
        x = step((unsigned)i & 15, x, acc);

    for (int i = 0; i < 17; i++)
        printf("case %2d: %u\n", i, hist[i]);
    printf("x   = %016llx\n", (unsigned long long)x);
    printf("acc = %llu %llu %llu %llu\n", (unsigned long long)acc[0], (unsigned long long)acc[1],
           (unsigned long long)acc[2], (unsigned long long)acc[3]);
    return 0;
}
