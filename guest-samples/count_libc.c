/* A small glibc program for the instruction-count test (valgrind.rs): stdio, qsort with a
 * callback, malloc/free, and string functions on sizes that take glibc's ifunc-selected
 * variants down their different paths, including `rep movsb`/`rep stosb` for large copies and
 * fills. About a quarter million instructions, so valgrind's per-instruction trace is quick. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static int by_value(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int main(void)
{
    uint64_t rng = 12345, h = FNV_OFFSET;
    int values[300];
    for (int i = 0; i < 300; i++)
        values[i] = (int)(rng_next(&rng) % 100000);
    qsort(values, 300, sizeof values[0], by_value);
    h = fnv_bytes(h, values, sizeof values);

    static char src[96 * 1024], dst[96 * 1024];
    memset(src, 'a', sizeof src);           /* a large fill */
    for (size_t n = 1; n <= sizeof src; n *= 3) {
        memcpy(dst, src + (n % 61), n);     /* small to large copies */
        h = fnv_u64(h, dst[n / 2]);
    }
    char *words[40];
    for (int i = 0; i < 40; i++) {
        words[i] = malloc(16 + (size_t)i * 37);
        snprintf(words[i], 16 + (size_t)i * 37, "word-%d-%0*d", i, i, i);
        h = fnv_u64(h, strlen(words[i]));
    }
    for (int i = 0; i < 40; i++) {
        h = fnv_u64(h, (uint64_t)strcmp(words[i], words[(i + 7) % 40]) >> 63);
        h = fnv_u64(h, strchr(words[i], '-') - words[i]);
    }
    for (int i = 0; i < 40; i++)
        free(words[i]);
    printf("count_libc: smallest %d, largest %d, checksum %016llx\n", values[0], values[299],
           (unsigned long long)h);
    return 0;
}
