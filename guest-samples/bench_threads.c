/* Benchmark: two threads at once, each running its own integer loop (a hash chain over its own
 * array), the main thread waiting for both: a threaded program that keeps both cores busy,
 * each thread with its own event ring under hotpath. argv[1] = rounds per thread (default
 * 120); each round is a pass over a 256 Ki-entry array. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define ENTRIES (1u << 18)

struct work {
    uint32_t seed;
    unsigned rounds;
    uint64_t result;
};

static void *run(void *arg)
{
    struct work *w = arg;
    uint32_t *a = malloc(ENTRIES * sizeof *a);
    if (!a)
        return NULL;
    uint32_t x = w->seed;
    for (uint32_t i = 0; i < ENTRIES; i++) {
        x = x * 1664525u + 1013904223u;
        a[i] = x;
    }
    uint64_t h = 1469598103934665603ull;
    for (unsigned r = 0; r < w->rounds; r++) {
        for (uint32_t i = 0; i < ENTRIES; i++) {
            uint32_t v = a[i] ^ (uint32_t)h;
            /* A data-dependent branch, as real code has. */
            if (v & 1)
                h = (h ^ v) * 1099511628211ull;
            else
                h += v >> 3;
            a[i] = v + r;
        }
    }
    free(a);
    w->result = h;
    return NULL;
}

int main(int argc, char **argv)
{
    unsigned rounds = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 120;
    struct work w[2] = { { 12345, rounds, 0 }, { 67890, rounds, 0 } };
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, run, &w[i]) != 0) {
            perror("pthread_create");
            return 1;
        }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    printf("threads: %u rounds each, %016llx %016llx\n", rounds,
           (unsigned long long)w[0].result, (unsigned long long)w[1].result);
    return 0;
}
