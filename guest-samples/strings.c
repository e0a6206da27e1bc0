/* glibc string and memory functions on many sizes (0..~1 MiB, plus one 8 MiB copy past the
 * non-temporal threshold) and every source/destination alignment 0..63, each result checked
 * against a plain byte-loop reference in this file. Buffers also end right before a PROT_NONE
 * page, so the vector variants' page-crossing paths run. On a CPU with AVX2 (or AVX-512/EVEX)
 * static glibc selects those variants through ifuncs at startup. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include "common.h"

/* References: byte loops through volatile pointers, so gcc cannot turn them back into calls
 * to the very functions under test. */
static void ref_memcpy(void *d, const void *s, size_t n)
{
    volatile unsigned char *dd = d;
    const volatile unsigned char *ss = s;
    for (size_t i = 0; i < n; i++)
        dd[i] = ss[i];
}

static void ref_memmove(void *d, const void *s, size_t n)
{
    volatile unsigned char *dd = d;
    const volatile unsigned char *ss = s;
    if (dd < ss)
        for (size_t i = 0; i < n; i++)
            dd[i] = ss[i];
    else
        for (size_t i = n; i-- > 0;)
            dd[i] = ss[i];
}

static size_t ref_strlen(const char *s)
{
    const volatile char *p = s;
    size_t n = 0;
    while (p[n])
        n++;
    return n;
}

static int ref_strcmp(const char *a, const char *b)
{
    const volatile unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    size_t i = 0;
    while (x[i] && x[i] == y[i])
        i++;
    return (x[i] > y[i]) - (x[i] < y[i]);
}

static int sign(int v) { return (v > 0) - (v < 0); }

static long failures;
static uint64_t hash = FNV_OFFSET;
static long checks;

#define CHECK(cond, ...)                                                                                 \
    do {                                                                                                 \
        checks++;                                                                                        \
        if (!(cond)) {                                                                                   \
            if (failures++ < 20) {                                                                       \
                printf("FAIL %s:%d: ", __func__, __LINE__);                                              \
                printf(__VA_ARGS__);                                                                     \
                printf("\n");                                                                            \
            }                                                                                            \
        }                                                                                                \
    } while (0)

static const size_t sizes[] = {0,   1,   2,   3,   4,   5,   7,   8,   9,    15,   16,   17,   31,   32,
                               33,  47,  63,  64,  65,  95,  96,  127, 128,  129,  191,  255,  256,  257,
                               511, 512, 513, 1000, 2047, 2048, 2049, 4095, 4096, 4097, 8191, 8193, 65536,
                               100003, 262144, 1048575};
#define NSIZES (sizeof sizes / sizeof sizes[0])
#define BIG (1u << 21) /* bytes per work buffer */

static unsigned char *src, *dst, *ref;

static void fill(unsigned char *p, size_t n, uint64_t seed)
{
    seed |= 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t r = rng_next(&seed);
        memcpy(p + i, &r, 8);
    }
    for (; i < n; i++)
        p[i] = (unsigned char)(rng_next(&seed) >> 56);
}

/* Alignment pairs (source, destination) for sizes too big to try all 64 x 64. */
static const unsigned big_aligns[][2] = {{0, 0}, {1, 63}, {63, 1}, {32, 0}, {7, 40}, {17, 17}};
#define NBIG_ALIGNS (sizeof big_aligns / sizeof big_aligns[0])

/* memcpy then memset of n bytes from src+sa to dst+da, compared with the references over
 * the whole span, so a write outside [da, da+n) shows up too. */
__attribute__((noinline)) static void copy_and_set(size_t n, unsigned sa, unsigned da)
{
    size_t span = n + 128;
    if (span > BIG)
        return;
    fill(src, span, n * 131 + sa);
    fill(dst, span, n * 17 + da);
    memcpy(ref, dst, span);
    memcpy(dst + da, src + sa, n);
    ref_memcpy(ref + da, src + sa, n);
    CHECK(memcmp(dst, ref, span) == 0, "memcpy n=%zu sa=%u da=%u", n, sa, da);

    int c = (int)(n + sa + da) & 0xff;
    memset(dst + da, c, n);
    for (size_t i = 0; i < n; i++)
        ref[da + i] = (unsigned char)c;
    CHECK(memcmp(dst, ref, span) == 0, "memset n=%zu da=%u", n, da);
}

static void test_memcpy_memmove_memset(void)
{
    for (size_t si = 0; si < NSIZES; si++) {
        size_t n = sizes[si];
        /* All 64 x 64 alignment pairs for small sizes, a few for big ones. */
        if (n <= 257) {
            for (unsigned sa = 0; sa < 64; sa++)
                for (unsigned da = 0; da < 64; da++)
                    copy_and_set(n, sa, da);
        } else if (n <= 8193) {
            for (unsigned sa = 0; sa < 64; sa += 9)
                for (unsigned da = 0; da < 64; da += 11)
                    copy_and_set(n, sa, da);
        } else {
            for (unsigned k = 0; k < NBIG_ALIGNS; k++)
                copy_and_set(n, big_aligns[k][0], big_aligns[k][1]);
        }
        hash = fnv_u64(hash, fnv_bytes(FNV_OFFSET, dst, n + 64));

        /* Overlapping memmove, both directions, several distances. */
        static const size_t dists[] = {1, 3, 8, 31, 64, 200, 4096};
        for (unsigned di = 0; di < sizeof dists / sizeof dists[0]; di++) {
            size_t d = dists[di];
            for (unsigned a = 0; a < 64; a += (n <= 513 ? 5 : n <= 8193 ? 21 : 40)) {
                size_t span = n + d + 64;
                fill(src, span, n + d + a);
                memcpy(ref, src, span);
                memmove(src + a + d, src + a, n); /* forward overlap */
                ref_memmove(ref + a + d, ref + a, n);
                CHECK(memcmp(src, ref, span) == 0, "memmove fwd n=%zu d=%zu a=%u", n, d, a);
                memmove(src + a, src + a + d, n); /* backward overlap */
                ref_memmove(ref + a, ref + a + d, n);
                CHECK(memcmp(src, ref, span) == 0, "memmove bwd n=%zu d=%zu a=%u", n, d, a);
            }
        }
        hash = fnv_u64(hash, fnv_bytes(FNV_OFFSET, src, n + 64));
    }
}

/* One 8 MiB copy and move: above glibc's non-temporal threshold on most machines. */
static void test_huge(void)
{
    size_t n = 8u << 20;
    unsigned char *a = malloc(n + 64), *b = malloc(n + 64);
    fill(a, n + 64, 99);
    memcpy(b + 3, a + 1, n);
    CHECK(memcmp(b + 3, a + 1, n) == 0, "huge memcpy");
    memmove(b + 1, b + 3, n); /* overlapping, backward distance 2 */
    CHECK(memcmp(b + 1, a + 1, n) == 0, "huge memmove");
    memset(a, 0x5a, n);
    size_t ones = 0;
    for (size_t i = 0; i < n; i += 4096)
        ones += a[i] == 0x5a;
    CHECK(ones == n / 4096, "huge memset");
    hash = fnv_u64(hash, fnv_bytes(FNV_OFFSET, b + n - 4096, 4096));
    free(a);
    free(b);
}

static void test_str(void)
{
    char *s = (char *)src, *t = (char *)dst;
    for (size_t len = 0; len < 600; len += (len < 130 ? 1 : 37))
        for (unsigned a = 0; a < 64; a += (len < 130 ? 3 : 1)) {
            char *p = s + a;
            for (size_t i = 0; i < len; i++)
                p[i] = (char)('A' + (i * 7 + a) % 50);
            p[len] = 0;
            p[len + 1] = 'Z'; /* garbage after the terminator must not matter */
            CHECK(strlen(p) == ref_strlen(p), "strlen len=%zu a=%u", len, a);

            /* strcmp against a copy at a different alignment, equal and differing at the end. */
            char *q = t + ((a * 5) & 63);
            memcpy(q, p, len + 1);
            CHECK(strcmp(p, q) == 0, "strcmp eq len=%zu a=%u", len, a);
            if (len > 0) {
                q[len - 1]++;
                CHECK(sign(strcmp(p, q)) == ref_strcmp(p, q), "strcmp ne len=%zu a=%u", len, a);
                q[len - 1] = (char)0xf0; /* a byte >= 0x80: comparison is unsigned */
                CHECK(sign(strcmp(p, q)) == ref_strcmp(p, q), "strcmp hi len=%zu a=%u", len, a);
                CHECK(sign(strncmp(p, q, len - 1)) == 0, "strncmp len=%zu a=%u", len, a);
            }

            /* strchr / memchr / strrchr for a byte at the end, in the middle, and absent. */
            if (len > 0) {
                char c = p[len - 1];
                char *exp = p;
                while (*exp != c)
                    exp++;
                CHECK(strchr(p, c) == exp, "strchr len=%zu a=%u", len, a);
                CHECK(memchr(p, c, len) == exp, "memchr len=%zu a=%u", len, a);
                CHECK(strrchr(p, c) == p + len - 1, "strrchr len=%zu a=%u", len, a);
            }
            CHECK(strchr(p, '#') == NULL, "strchr absent len=%zu a=%u", len, a);
            CHECK(strchr(p, 0) == p + len, "strchr nul len=%zu a=%u", len, a);
            CHECK(memchr(p, '#', len) == NULL, "memchr absent len=%zu a=%u", len, a);
            hash = fnv_u64(hash, strlen(p) * 1000003 + (unsigned)a);
        }

    /* strstr: needles of several lengths, present at varied offsets or absent. */
    for (size_t hl = 1; hl < 3000; hl = hl * 3 / 2 + 1) {
        char *h = s + (hl & 31);
        for (size_t i = 0; i < hl; i++)
            h[i] = (char)('a' + (i * i + hl) % 3);
        h[hl] = 0;
        for (size_t nl = 1; nl <= 40 && nl <= hl; nl = nl * 2 + 1) {
            size_t at = (hl * 7) % (hl - nl + 1);
            char needle[64];
            memcpy(needle, h + at, nl);
            needle[nl] = 0;
            char *found = strstr(h, needle);
            char *exp = NULL;
            for (size_t i = 0; i + nl <= hl; i++)
                if (memcmp(h + i, needle, nl) == 0) {
                    exp = h + i;
                    break;
                }
            CHECK(found == exp, "strstr hl=%zu nl=%zu", hl, nl);
            needle[nl - 1] = 'x';
            CHECK(strstr(h, needle) == NULL, "strstr absent hl=%zu nl=%zu", hl, nl);
            hash = fnv_u64(hash, found ? (uint64_t)(found - h) : ~0ull);
        }
    }
}

/* Strings that end right before an unmapped page: vector loads must not fault. */
static void test_page_end(void)
{
    long page = 4096;
    unsigned char *m = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        printf("mmap failed\n");
        return;
    }
    mprotect(m + page, page, PROT_NONE);
    for (size_t len = 0; len < 200; len++) {
        char *p = (char *)m + page - len - 1;
        memset(p, 'q', len);
        p[len] = 0;
        CHECK(strlen(p) == len, "page-end strlen len=%zu", len);
        CHECK(strchr(p, 'r') == NULL, "page-end strchr len=%zu", len);
        CHECK(memchr(p, 0, len + 1) == p + len, "page-end memchr len=%zu", len);
        CHECK(strcmp(p, p) == 0, "page-end strcmp len=%zu", len);
        unsigned char *d = m + page - len;
        memmove(d, p, len); /* overlapping, ends at the page end */
        CHECK(len == 0 || d[len - 1] == 'q', "page-end memmove len=%zu", len);
    }
    munmap(m, 2 * page);
}

int main(void)
{
    src = malloc(BIG);
    dst = malloc(BIG);
    ref = malloc(BIG);
    test_memcpy_memmove_memset();
    test_huge();
    test_str();
    test_page_end();
    printf("checks %ld failures %ld hash %016llx\n", checks, failures, (unsigned long long)hash);
    free(src);
    free(dst);
    free(ref);
    return failures != 0;
}
