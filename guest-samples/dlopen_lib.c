/* The shared library dlopen_twice.c loads, calls, unloads and loads again (built by the tests
 * with gcc -shared -fPIC into <target>/guest-samples/dlopen_lib.so). It has a constructor and
 * a destructor, data that a fresh load resets, a thread-local counter (a dlopened library's
 * TLS is dynamic: reached through __tls_get_addr) and a qsort callback, so libc calls back
 * into it. The values it computes follow from the source: tests/tests/dynamic.rs recomputes
 * them. */
#include <stdio.h>
#include <stdlib.h>

#include "common.h"

/* Data looked up with dlsym; the caller increments it, a fresh load has it at 7 again. */
int dl_version = 7;

/* Loads of this copy of the library: 1 in every copy, since dlclose really unloads it. */
static int loads;

/* Calls in this thread since the library was loaded: dynamic TLS, fresh in every copy. */
static __thread int calls;

__attribute__((constructor)) static void dl_constructor(void)
{
    loads++;
    printf("lib: constructor, loads of this copy: %d\n", loads);
}

__attribute__((destructor)) static void dl_destructor(void)
{
    printf("lib: destructor, calls in this copy: %d\n", calls);
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Primes below n (sieve of Eratosthenes): their number in *count, and the sum of their
 * squares, wrapping at 2^64. */
uint64_t dl_primes(uint32_t n, uint32_t *count)
{
    calls++;
    unsigned char *composite = calloc(n, 1);
    if (composite == NULL)
        abort();
    uint64_t sum = 0;
    *count = 0;
    for (uint64_t i = 2; i < n; i++) {
        if (composite[i])
            continue;
        ++*count;
        sum += i * i;
        for (uint64_t j = i * i; j < n; j += i)
            composite[j] = 1;
    }
    free(composite);
    return sum;
}

/* n values of the xorshift64* generator seeded with `seed`, sorted by qsort through this
 * library's comparison function, folded into an FNV-1a hash in sorted order. */
uint64_t dl_sorted_hash(uint32_t n, uint64_t seed)
{
    calls++;
    uint64_t *values = malloc(n * sizeof *values);
    if (values == NULL)
        abort();
    for (uint32_t i = 0; i < n; i++)
        values[i] = rng_next(&seed);
    qsort(values, n, sizeof *values, compare_u64);
    uint64_t h = FNV_OFFSET;
    for (uint32_t i = 0; i < n; i++)
        h = fnv_u64(h, values[i]);
    free(values);
    return h;
}

/* How many calls this thread made into this copy of the library. */
int dl_calls(void)
{
    return calls;
}
