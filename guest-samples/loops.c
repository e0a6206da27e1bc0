/* Nested loops of several shapes (for, while, do-while, break/continue, down-counting)
 * with integer arithmetic of every width, each folded into a printed checksum. */
#include <stdio.h>
#include <stdint.h>
#include "common.h"

static volatile int sink;

/* Triple nest with a data-dependent inner trip count. */
static uint64_t triple_nest(int n)
{
    uint64_t h = FNV_OFFSET;
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++)
            for (int k = j; k < n; k += 1 + (i & 3))
                h = fnv_u64(h, (uint64_t)(i * 31 + j * 7 + k));
    return h;
}

/* Signed/unsigned division, remainder, shifts and rotates in a while loop. */
static uint64_t arith_mix(uint32_t n)
{
    uint64_t acc = 1;
    int64_t s = -123456789;
    uint32_t i = 0;
    while (i < n) {
        uint64_t r = (acc << (i & 63)) | (acc >> ((64 - (i & 63)) & 63));
        acc = r * 6364136223846793005ULL + 1442695040888963407ULL;
        s = s / 3 + (int64_t)(acc % 1000003) - (s % 7);
        acc ^= (uint64_t)s;
        acc += (uint64_t)(int8_t)(acc >> 5) + (uint64_t)(int16_t)(acc >> 17) + (uint64_t)(int32_t)(acc >> 29);
        i++;
    }
    return acc ^ (uint64_t)s;
}

/* do-while, down-counting, with break and continue. */
static uint64_t breaks_and_continues(int n)
{
    uint64_t h = FNV_OFFSET;
    int i = n;
    do {
        if (i % 3 == 0)
            continue;
        for (int j = 0;; j++) {
            if (j * j > i)
                break;
            if ((i ^ j) & 1)
                continue;
            h = fnv_u64(h, (uint64_t)(i * j));
        }
    } while (--i > 0);
    return h;
}

/* Bit-twiddling builtins: clz/ctz/popcount/bswap (some become libgcc calls without -mpopcnt). */
static uint64_t bits(int n)
{
    uint64_t h = FNV_OFFSET, x = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < n; i++) {
        x = rng_next(&x) | 1;
        h = fnv_u64(h, (uint64_t)__builtin_clzll(x) | ((uint64_t)__builtin_ctzll(x) << 8) |
                           ((uint64_t)__builtin_popcountll(x) << 16) |
                           ((uint64_t)__builtin_parityll(x) << 24));
        h ^= __builtin_bswap64(x);
    }
    return h;
}

/* Matrix multiply: a loop nest gcc vectorizes at -O2 (SSE), with 32-bit wraparound. */
#define M 48
static uint32_t ma[M][M], mb[M][M], mc[M][M];

static uint64_t matmul(void)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++) {
            ma[i][j] = (uint32_t)(i * 2654435761u + j);
            mb[i][j] = (uint32_t)(j * 40503u ^ i);
        }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++) {
            uint32_t s = 0;
            for (int k = 0; k < M; k++)
                s += ma[i][k] * mb[k][j];
            mc[i][j] = s;
        }
    return fnv_bytes(FNV_OFFSET, mc, sizeof mc);
}

int main(void)
{
    uint64_t total = 0;
    uint64_t r;

    r = triple_nest(60);
    printf("triple_nest      %016llx\n", (unsigned long long)r);
    total ^= r;
    r = arith_mix(200000);
    printf("arith_mix        %016llx\n", (unsigned long long)r);
    total ^= r;
    r = breaks_and_continues(3000);
    printf("breaks_continues %016llx\n", (unsigned long long)r);
    total ^= r;
    r = bits(50000);
    printf("bits             %016llx\n", (unsigned long long)r);
    total ^= r;
    r = matmul();
    printf("matmul           %016llx\n", (unsigned long long)r);
    total ^= r;

    int count = 0;
    for (int i = 0; i < 1000; i++)
        for (int j = 0; j < 1000; j++)
            count += (i * j) % 7 == 3;
    sink = count;
    printf("count            %d\n", count);
    printf("total            %016llx\n", (unsigned long long)total);
    return 0;
}
