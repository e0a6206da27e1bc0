/* Shared helpers for the C guest samples: a checksum that every sample folds its results into. */
#ifndef HOTPATH_SAMPLES_COMMON_H
#define HOTPATH_SAMPLES_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* FNV-1a, 64-bit: order-sensitive, so a reordered or dropped update changes it. */
#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static inline uint64_t fnv_u64(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= FNV_PRIME;
    }
    return h;
}

static inline uint64_t fnv_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= FNV_PRIME;
    }
    return h;
}

/* Deterministic xorshift64* generator: samples never read time, pids or addresses. */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dULL;
}

#endif
