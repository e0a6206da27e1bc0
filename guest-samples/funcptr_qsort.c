/* Indirect calls: a table of function pointers called in a pseudo-random order, qsort and
 * bsearch with comparators (libc calling back into the program), sorting ints, strings and structs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "common.h"

typedef uint64_t (*op_fn)(uint64_t, uint64_t);

static uint64_t op_add(uint64_t a, uint64_t b) { return a + b; }
static uint64_t op_sub(uint64_t a, uint64_t b) { return a - b; }
static uint64_t op_mul(uint64_t a, uint64_t b) { return a * (b | 1); }
static uint64_t op_xor(uint64_t a, uint64_t b) { return a ^ (b << 3); }
static uint64_t op_rot(uint64_t a, uint64_t b) { return (a << (b & 63)) | (a >> ((64 - (b & 63)) & 63)); }
static uint64_t op_div(uint64_t a, uint64_t b) { return a / ((b & 0xffff) | 1) + b; }

static op_fn const ops[] = {op_add, op_sub, op_mul, op_xor, op_rot, op_div};
#define NOPS (sizeof ops / sizeof ops[0])

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int cmp_int_desc(const void *a, const void *b) { return -cmp_int(a, b); }

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

struct rec {
    uint32_t key;
    uint32_t order; /* original position: makes the comparison a total order */
    char tag[8];
};

static int cmp_rec(const void *a, const void *b)
{
    const struct rec *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

#define N 20000
static int ints[N];
static struct rec recs[N];
static char strbuf[N][12];
static char *strs[N];

int main(void)
{
    uint64_t seed = 7, acc = 1;

    /* Indirect calls through the table. */
    uint64_t hist[NOPS] = {0};
    for (int i = 0; i < 300000; i++) {
        unsigned k = (unsigned)(rng_next(&seed) % NOPS);
        hist[k]++;
        acc = ops[k](acc, (uint64_t)i * 2654435761u);
    }
    printf("ops acc %016llx hist", (unsigned long long)acc);
    for (unsigned k = 0; k < NOPS; k++)
        printf(" %llu", (unsigned long long)hist[k]);
    printf("\n");

    /* qsort ints, both directions, then bsearch for some keys. */
    for (int i = 0; i < N; i++)
        ints[i] = (int)(rng_next(&seed) % 100000) - 50000;
    qsort(ints, N, sizeof ints[0], cmp_int);
    int sorted = 1;
    for (int i = 1; i < N; i++)
        sorted &= ints[i - 1] <= ints[i];
    printf("ints sorted=%d min=%d median=%d max=%d sum=%016llx\n", sorted, ints[0], ints[N / 2],
           ints[N - 1], (unsigned long long)fnv_bytes(FNV_OFFSET, ints, sizeof ints));
    int found = 0;
    for (int key = -50000; key < 50000; key += 37)
        found += bsearch(&key, ints, N, sizeof ints[0], cmp_int) != NULL;
    printf("bsearch found %d\n", found);
    qsort(ints, N, sizeof ints[0], cmp_int_desc);
    printf("desc first=%d last=%d\n", ints[0], ints[N - 1]);

    /* qsort strings through a pointer array. */
    for (int i = 0; i < N; i++) {
        uint64_t r = rng_next(&seed);
        int len = 1 + (int)(r % 10);
        for (int j = 0; j < len; j++)
            strbuf[i][j] = (char)('a' + (r >> (5 * j + 4)) % 26);
        strbuf[i][len] = 0;
        strs[i] = strbuf[i];
    }
    qsort(strs, N, sizeof strs[0], cmp_str);
    uint64_t h = FNV_OFFSET;
    for (int i = 0; i < N; i++)
        h = fnv_bytes(h, strs[i], strlen(strs[i]) + 1);
    printf("strs first=%s last=%s hash=%016llx\n", strs[0], strs[N - 1], (unsigned long long)h);

    /* qsort structs (24-byte elements exercise the generic swap path). */
    for (int i = 0; i < N; i++) {
        recs[i].key = (uint32_t)(rng_next(&seed) % 1000);
        recs[i].order = (uint32_t)i;
        snprintf(recs[i].tag, sizeof recs[i].tag, "r%05d", i % 100000);
    }
    qsort(recs, N, sizeof recs[0], cmp_rec);
    printf("recs first=%u/%s last=%u/%s hash=%016llx\n", recs[0].key, recs[0].tag, recs[N - 1].key,
           recs[N - 1].tag, (unsigned long long)fnv_bytes(FNV_OFFSET, recs, sizeof recs));
    return 0;
}
