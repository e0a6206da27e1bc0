/* Heap churn: tens of thousands of malloc/calloc/realloc/free of varied sizes (brk-backed
 * small chunks, tcache and fastbins, and mmap-backed chunks above the 128 KiB threshold),
 * every block filled with a pattern and verified before it is freed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "common.h"

#define SLOTS 2048

struct slot {
    unsigned char *p;
    size_t n;
    unsigned char tag;
};

static struct slot slots[SLOTS];
static long bad;

static void paint(struct slot *s)
{
    for (size_t i = 0; i < s->n; i += 1 + (i >> 6))
        s->p[i] = (unsigned char)(s->tag + i);
    if (s->n)
        s->p[s->n - 1] = s->tag;
}

static int verify(const struct slot *s)
{
    if (s->n && s->p[s->n - 1] != s->tag)
        return 0;
    for (size_t i = 0; i + 1 < s->n; i += 1 + (i >> 6))
        if (s->p[i] != (unsigned char)(s->tag + i))
            return 0;
    return 1;
}

static size_t pick_size(uint64_t *seed)
{
    uint64_t r = rng_next(seed);
    unsigned k = (unsigned)(r % 64);
    r >>= 8;
    if (k == 0)
        return 0;
    if (k < 28)
        return 1 + r % 24; /* tiny: tcache and fastbins */
    if (k < 48)
        return 24 + r % 1000; /* small bins */
    if (k < 60)
        return 1024 + r % 30000; /* large bins */
    if (k < 63)
        return 100000 + r % 60000; /* around the 128 KiB mmap threshold */
    return 200000 + r % 300000; /* mmap-backed */
}

int main(void)
{
    uint64_t seed = 12345, h = FNV_OFFSET;
    long mallocs = 0, frees = 0, reallocs = 0, callocs = 0;

    for (int round = 0; round < 40000; round++) {
        uint64_t r = rng_next(&seed);
        struct slot *s = &slots[r % SLOTS];
        unsigned op = (unsigned)(r >> 20) % 8;
        if (s->p == NULL && op != 7) {
            s->n = pick_size(&seed);
            s->tag = (unsigned char)(r >> 40);
            if (op & 1) {
                s->p = calloc(1, s->n ? s->n : 1);
                callocs++;
                for (size_t i = 0; i < s->n; i += 4093)
                    if (s->p[i] != 0)
                        bad++;
            } else {
                s->p = malloc(s->n ? s->n : 1);
                mallocs++;
            }
            if (!s->p) {
                printf("allocation of %zu failed\n", s->n);
                return 2;
            }
            paint(s);
        } else if (s->p && op < 3) {
            /* realloc keeps the common prefix: check it, then repaint the whole block. */
            size_t old = s->n, n = pick_size(&seed);
            unsigned char *q = realloc(s->p, n ? n : 1);
            if (!q) {
                printf("realloc to %zu failed\n", n);
                return 2;
            }
            reallocs++;
            s->p = q;
            size_t keep = old < n ? old : n;
            for (size_t i = 0; i + 1 < keep && i + 1 < old; i += 1 + (i >> 6))
                if (q[i] != (unsigned char)(s->tag + i))
                    bad++;
            s->n = n;
            paint(s);
        } else if (s->p) {
            if (!verify(s))
                bad++;
            h = fnv_u64(h, s->n);
            h = fnv_bytes(h, s->p, s->n < 64 ? s->n : 64);
            free(s->p);
            frees++;
            s->p = NULL;
        }
    }
    size_t live = 0;
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].p) {
            if (!verify(&slots[i]))
                bad++;
            live += slots[i].n;
            free(slots[i].p);
            frees++;
        }

    /* A linked list of 100 000 nodes: many same-size allocations, then freed in reverse. */
    struct node {
        struct node *next;
        uint64_t v;
    } *head = NULL;
    for (int i = 0; i < 100000; i++) {
        struct node *nd = malloc(sizeof *nd);
        nd->v = (uint64_t)i * i;
        nd->next = head;
        head = nd;
    }
    uint64_t sum = 0;
    while (head) {
        struct node *nx = head->next;
        sum += head->v;
        free(head);
        head = nx;
    }

    printf("malloc %ld calloc %ld realloc %ld free %ld\n", mallocs, callocs, reallocs, frees);
    printf("live at end %zu bytes, corrupt %ld\n", live, bad);
    printf("hash %016llx list sum %llu\n", (unsigned long long)h, (unsigned long long)sum);
    return bad != 0;
}
