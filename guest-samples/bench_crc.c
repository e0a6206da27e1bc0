/* Benchmark: integer-heavy hashing — table-driven CRC-32, FNV-1a and a murmur-style 64-bit
 * mixer over a pseudo-random buffer, many passes. argv[1] = passes (default 400). */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>

#define BUF_BYTES (1u << 20)

static uint32_t crc_table[256];

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32_buf(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    for (size_t i = 0; i < n; i++)
        crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static uint64_t mix64(uint64_t h, const uint64_t *w, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t k = w[i] * 0x87c37b91114253d5ULL;
        k = (k << 31) | (k >> 33);
        h ^= k * 0x4cf5ad432745937fULL;
        h = ((h << 27) | (h >> 37)) * 5 + 0x52dce729;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 33);
}

int main(int argc, char **argv)
{
    long passes = argc > 1 ? strtol(argv[1], NULL, 10) : 400;
    uint64_t *words = malloc(BUF_BYTES);
    uint64_t s = 0x243f6a8885a308d3ULL;
    for (size_t i = 0; i < BUF_BYTES / 8; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        words[i] = s;
    }
    const unsigned char *bytes = (const unsigned char *)words;
    crc_init();

    uint32_t crc = 0;
    uint64_t fnv = 0xcbf29ce484222325ULL, mix = 0;
    for (long p = 0; p < passes; p++) {
        size_t off = (size_t)(p * 4099) % 4096, n = BUF_BYTES - 4096;
        switch (p % 3) {
        case 0: crc = crc32_buf(crc, bytes + off, n); break;
        case 1: fnv = fnv1a(fnv, bytes + off, n); break;
        default: mix = mix64(mix ^ (uint64_t)p, words + off / 8, n / 8); break;
        }
    }
    printf("passes %ld crc32 %08x fnv1a %016llx mix %016llx\n", passes, crc, (unsigned long long)fnv,
           (unsigned long long)mix);
    free(words);
    return 0;
}
