/* Benchmark: count primes below a limit with a segmented sieve of Eratosthenes (byte array,
 * tight inner loops, predictable branches). argv[1] = limit (default 150 000 000). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

#define SEGMENT 32768 /* bytes: one L1-sized window of the number line */

int main(int argc, char **argv)
{
    uint64_t limit = argc > 1 ? strtoull(argv[1], NULL, 10) : 150000000ULL;
    if (limit < 10)
        limit = 10;
    uint64_t root = 1;
    while (root * root <= limit)
        root++;

    /* Small primes up to sqrt(limit) with a plain sieve. */
    unsigned char *small = calloc(root + 1, 1);
    uint32_t *primes = malloc((root + 1) * sizeof *primes);
    uint64_t *next = malloc((root + 1) * sizeof *next);
    size_t np = 0;
    for (uint64_t i = 2; i <= root; i++) {
        if (small[i])
            continue;
        primes[np] = (uint32_t)i;
        next[np] = i * i;
        np++;
        for (uint64_t j = i * i; j <= root; j += i)
            small[j] = 1;
    }

    unsigned char seg[SEGMENT];
    uint64_t count = 0, sum = 0, last = 0;
    for (uint64_t lo = 2; lo < limit; lo += SEGMENT) {
        uint64_t hi = lo + SEGMENT < limit ? lo + SEGMENT : limit;
        memset(seg, 0, sizeof seg);
        for (size_t k = 0; k < np; k++) {
            uint64_t p = primes[k], j = next[k];
            if (j >= hi)
                continue;
            for (; j < hi; j += p)
                seg[j - lo] = 1;
            next[k] = j;
        }
        for (uint64_t n = lo; n < hi; n++)
            if (!seg[n - lo]) {
                count++;
                sum += n;
                last = n;
            }
    }
    printf("primes below %llu: %llu, sum %llu, largest %llu\n", (unsigned long long)limit,
           (unsigned long long)count, (unsigned long long)sum, (unsigned long long)last);
    free(small);
    free(primes);
    free(next);
    return 0;
}
