/* Deep and wide recursion: a 100 000-deep non-tail recursion (about 5 MiB of the 8 MiB
 * stack), mutual recursion, Ackermann (hundreds of thousands of call/return pairs)
 * and a recursive tree walk. A translator must push guest return addresses and keep rsp exact. */
#include <stdio.h>
#include <stdint.h>
#include "common.h"

#define DEPTH 100000

/* Not a tail call: the result is combined with a local after the call returns,
 * and the local's address escapes, so gcc can neither loop-ify nor shrink the frame away. */
__attribute__((noinline)) static uint64_t deep(unsigned n, volatile unsigned char *parent)
{
    volatile unsigned char local[16];
    for (int i = 0; i < 16; i++)
        local[i] = (unsigned char)(n + i);
    if (n == 0)
        return parent[3];
    uint64_t r = deep(n - 1, local);
    return r * 31 + local[n % 16] + parent[0];
}

__attribute__((noinline)) static int is_odd(unsigned n);
__attribute__((noinline)) static int is_even(unsigned n)
{
    return n == 0 ? 1 : is_odd(n - 1);
}
__attribute__((noinline)) static int is_odd(unsigned n)
{
    return n == 0 ? 0 : is_even(n - 1);
}

static uint64_t ack_calls;
__attribute__((noinline)) static uint64_t ack(uint64_t m, uint64_t n)
{
    ack_calls++;
    if (m == 0)
        return n + 1;
    if (n == 0)
        return ack(m - 1, 1);
    return ack(m - 1, ack(m, n - 1));
}

/* Recursive walk of an implicit binary tree: node i has children 2i+1 and 2i+2. */
__attribute__((noinline)) static uint64_t tree(unsigned i, unsigned n)
{
    if (i >= n)
        return 0;
    uint64_t l = tree(2 * i + 1, n);
    uint64_t r = tree(2 * i + 2, n);
    return fnv_u64(l ^ (r << 1), i);
}

int main(void)
{
    unsigned char top[16] = {1, 2, 3, 4};
    printf("deep(%d)   = %016llx\n", DEPTH, (unsigned long long)deep(DEPTH, top));
    /* is_even/is_odd may be turned into loops by gcc's sibling-call optimisation; that is fine. */
    printf("is_even(%d) = %d, is_odd(77777) = %d\n", 50001, is_even(50001), is_odd(77777));
    uint64_t a = ack(3, 7);
    printf("ack(3,7) = %llu in %llu calls\n", (unsigned long long)a, (unsigned long long)ack_calls);
    printf("tree(200000) = %016llx\n", (unsigned long long)tree(0, 200000));
    return 0;
}
