/* Path profiles of a dynamically linked program: calls into libc through the PLT (a PLT
 * stub's jump into its library is a foreign jump or a tail call to the shadow stack), libc's
 * functions calling and tail-calling each other, a callback from inside libc (qsort), and
 * helpers that return inside one trace. tests/tests/paths.rs compares the default path
 * recorder with the per-block reference on it. Deterministic: no time, no addresses printed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>

static int by_value(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* A helper called from a hot loop that returns at once: folded into the caller's trace. */
static __attribute__((noinline)) int digit_sum(long v) {
    int s = 0;
    while (v > 0) {
        s += v % 10;
        v /= 10;
    }
    return s;
}

int main(void) {
    char text[64];
    int values[48];
    unsigned seed = 12345;
    long total = 0;
    for (int round = 0; round < 3000; round++) {
        for (int k = 0; k < 48; k++)
            values[k] = (int)(rand_r(&seed) % 1000);
        qsort(values, 48, sizeof values[0], by_value);
        int n = snprintf(text, sizeof text, "%d-%d %x", values[0], values[47], round);
        for (int k = 0; k < n; k++)
            text[k] = (char)toupper((unsigned char)text[k]);
        total += strtol(text, NULL, 10) + (long)strlen(text) + digit_sum(values[round % 48]);
        const char *dash = memchr(text, '-', (size_t)n);
        if (dash)
            total += atoi(dash + 1);
        int key = values[round % 48];
        if (bsearch(&key, values, 48, sizeof values[0], by_value))
            total++;
    }
    printf("%ld\n", total);
    return 0;
}
