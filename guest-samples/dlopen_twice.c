/* dlopen a library (its path is argv[1]: dlopen_lib.c built as a shared object), call it
 * through dlsym, dlclose it, check it is gone (RTLD_NOLOAD), and do it all again with lazy
 * binding; then the errors: a missing symbol and a missing library. Dynamically linked only
 * (tests/tests/dynamic.rs builds and runs it). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef uint64_t primes_fn(uint32_t n, uint32_t *count);
typedef uint64_t sorted_hash_fn(uint32_t n, uint64_t seed);
typedef int calls_fn(void);

/* dlerror's text from `what` on (it starts with the library's path, which varies). */
static const char *error_from(const char *what)
{
    const char *e = dlerror();
    if (e == NULL)
        return "(no error)";
    const char *at = strstr(e, what);
    return at ? at : e;
}

static int round_trip(const char *path, int round, int mode)
{
    void *lib = dlopen(path, mode);
    if (lib == NULL) {
        fprintf(stderr, "round %d: dlopen failed: %s\n", round, dlerror());
        return 1;
    }
    primes_fn *primes = (primes_fn *)dlsym(lib, "dl_primes");
    sorted_hash_fn *sorted_hash = (sorted_hash_fn *)dlsym(lib, "dl_sorted_hash");
    calls_fn *calls = (calls_fn *)dlsym(lib, "dl_calls");
    int *version = dlsym(lib, "dl_version");
    if (primes == NULL || sorted_hash == NULL || calls == NULL || version == NULL) {
        fprintf(stderr, "round %d: dlsym failed: %s\n", round, dlerror());
        return 1;
    }
    printf("round %d: dl_version %d\n", round, *version);
    *version += 100; /* a fresh load must show 7 again */

    uint32_t n = 100000u * (uint32_t)round, count;
    uint64_t squares = primes(n, &count);
    printf("round %d: %u primes below %u, sum of squares %llu\n", round, count, n,
           (unsigned long long)squares);
    uint32_t values = 5000u * (uint32_t)round;
    uint64_t hash = sorted_hash(values, 0x9e3779b97f4a7c15ULL + (uint64_t)round);
    printf("round %d: %u sorted values hash to %016llx\n", round, values,
           (unsigned long long)hash);
    printf("round %d: calls into this copy: %d\n", round, calls());

    if (dlclose(lib) != 0) {
        fprintf(stderr, "round %d: dlclose failed: %s\n", round, dlerror());
        return 1;
    }
    void *still = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    printf("round %d: loaded after dlclose: %s\n", round, still ? "yes" : "no");
    if (still)
        dlclose(still);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s LIBRARY.so\n", argv[0]);
        return 2;
    }
    /* First with every symbol bound at load, then lazily (PLT entries resolved on first call
     * through ld.so's _dl_runtime_resolve). */
    if (round_trip(argv[1], 1, RTLD_NOW | RTLD_LOCAL) != 0)
        return 1;
    if (round_trip(argv[1], 2, RTLD_LAZY | RTLD_GLOBAL) != 0)
        return 1;

    void *lib = dlopen(argv[1], RTLD_NOW);
    if (lib == NULL)
        return 1;
    void *missing = dlsym(lib, "dl_no_such_symbol");
    printf("missing symbol: %s, %s\n", missing ? "found?!" : "NULL",
           error_from("undefined symbol"));
    dlclose(lib);

    void *none = dlopen("./dlopen-no-such-library.so", RTLD_NOW);
    printf("missing library: %s, %s\n", none ? "loaded?!" : "NULL",
           error_from("cannot open shared object file"));
    return 0;
}
