/* A function with more Ball-Larus paths than a 64-bit id can number: `mix` is 72 diamonds in
 * a row (each an `asm` bit test and a branch to one of two blocks, so the compiler cannot
 * turn it into a conditional move), called 400 times with pseudo-random bits. Once both sides
 * of about 64 diamonds have run, its DAG of seen edges has more than 2^64 paths, in the
 * middle of an activation. The sums recorder must then count it as the per-block reference
 * does (tests/tests/paths.rs), and the report must say the function could not be numbered. */
#include <stdint.h>
#include <stdio.h>

#define D(i, x)                                                                                \
    __asm__ volatile("bt %[b], %[v]\n\t"                                                        \
                     "jnc 1f\n\t"                                                               \
                     "add %[b], %[s]\n\t"                                                       \
                     "jmp 2f\n"                                                                 \
                     "1:\n\t"                                                                   \
                     "xor $" #i ", %[s]\n"                                                      \
                     "2:"                                                                       \
                     : [s] "+r"(s)                                                              \
                     : [v] "r"(x), [b] "r"((uint64_t)((i) % 64))                                \
                     : "cc")

#define D8(i, x)                                                                               \
    D(i, x);                                                                                   \
    D(i + 1, x);                                                                               \
    D(i + 2, x);                                                                               \
    D(i + 3, x);                                                                               \
    D(i + 4, x);                                                                               \
    D(i + 5, x);                                                                               \
    D(i + 6, x);                                                                               \
    D(i + 7, x)

__attribute__((noinline)) static uint64_t mix(uint64_t x, uint64_t y)
{
    uint64_t s = 0;
    D8(0, x);
    D8(8, x);
    D8(16, x);
    D8(24, x);
    D8(32, x);
    D8(40, x);
    D8(48, x);
    D8(56, x);
    D8(64, y);
    return s;
}

int main(void)
{
    uint64_t state = 0x9e3779b97f4a7c15u, total = 0;
    for (int k = 0; k < 400; k++) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        total += mix(state, state * 0x2545f4914f6cdd1du);
    }
    printf("%llu\n", (unsigned long long)total);
    return 0;
}
