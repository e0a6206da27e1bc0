/* bench/paths-model.c — the cost model of docs/paths-design.md, compiled natively: bench_fib's
 * fib and tak as gcc -O2 shapes them (fib: one call per iteration of a loop), run plainly and
 * with what translated code would do per activation once they are instrumented (stages 1-2):
 * per call a frame push (guest return address, caller's context) and a step to the callee's
 * context through the caller node's one-entry child cache; per return a compare with the top
 * frame and a pop; per path end (a back edge or the exit) a counter update in the context's
 * counters, the chord increments folded into constants as Ball-Larus places them.
 *
 *   gcc -O2 -o /tmp/paths-model bench/paths-model.c && /tmp/paths-model [n]
 *   -DNOCTX: path counters only (no frames, no contexts); -DNOPATH: frames and contexts only.
 *
 * Prints the best of 5 runs of each and their ratio. This is gcc's code with flags and free
 * registers: a floor for what the translator can emit (flag-free, registers borrowed through
 * the thread area). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct node;
struct frame { uint64_t return_to; struct node *ctx; };
struct node { uint64_t last_callee; struct node *last_child, *parent; uint64_t *counters; };
static __thread struct { struct node *ctx; struct frame *top; } P;
static struct node nodes[1 << 16];
static unsigned n_nodes = 1;

/* The runtime's part: a context not in the one-entry cache (the model never looks further). */
__attribute__((noinline, unused)) static struct node *new_child(struct node *p, uint64_t callee)
{
    struct node *c = &nodes[n_nodes++];
    c->parent = p;
    c->counters = calloc(8, sizeof(uint64_t));
    p->last_callee = callee;
    p->last_child = c;
    return c;
}

/* A return to another frame: the runtime's resynchronisation (never taken here). */
__attribute__((noinline, unused)) static void resync(void) { abort(); }

#ifdef NOCTX
#define CALL_ENTER(callee, ret) do {} while (0)
#define RET_LEAVE(ret) do {} while (0)
#else
#define CALL_ENTER(callee, ret) do { \
    struct frame *f = P.top; P.top = f + 1; f->return_to = (ret); struct node *c = P.ctx; f->ctx = c; \
    P.ctx = __builtin_expect(c->last_callee == (callee), 1) ? c->last_child : new_child(c, (callee)); \
} while (0)
#define RET_LEAVE(ret) do { \
    struct frame *f = P.top - 1; \
    if (__builtin_expect(f->return_to != (ret), 0)) resync(); \
    P.top = f; P.ctx = f->ctx; \
} while (0)
#endif
#ifdef NOPATH
#define PATH_END(r) ((void)(r))
#else
#define PATH_END(r) (P.ctx->counters[r]++)
#endif

/* fib as gcc -O2 compiles bench_fib's. */
__attribute__((noinline)) static uint64_t fib(unsigned n)
{
    uint64_t acc = 0;
    while (n > 1) { acc += fib(n - 1); n -= 2; __asm__ volatile("" : "+r"(n)); }
    return acc + n;
}

__attribute__((noinline)) static int tak(int x, int y, int z)
{
    return y < x ? tak(tak(x - 1, y, z), tak(y - 1, z, x), tak(z - 1, x, y)) : z;
}

/* Paths of fib: entry->exit (0), entry->back edge (1), head->back edge (2), head->exit (3). The
 * return addresses are the guest's (immediates in translated code). */
__attribute__((noinline)) static uint64_t fib_i(unsigned n)
{
    uint64_t acc = 0;
    unsigned r = 0;
    while (n > 1) {
        CALL_ENTER(0x401000, 0x40101b);
        acc += fib_i(n - 1);
        RET_LEAVE(0x40101b);
        n -= 2;
        __asm__ volatile("" : "+r"(n));
        if (n > 1) { PATH_END(r + 1); r = 2; } else r += 3;
    }
    PATH_END(r);
    return acc + n;
}

__attribute__((noinline)) static int tak_i(int x, int y, int z)
{
    int v;
    unsigned r = 0;
    if (y < x) {
        int a, b, c;
        CALL_ENTER(0x402000, 0x402010); a = tak_i(x - 1, y, z); RET_LEAVE(0x402010);
        CALL_ENTER(0x402000, 0x402020); b = tak_i(y - 1, z, x); RET_LEAVE(0x402020);
        CALL_ENTER(0x402000, 0x402030); c = tak_i(z - 1, x, y); RET_LEAVE(0x402030);
        CALL_ENTER(0x402000, 0x402040); v = tak_i(a, b, c); RET_LEAVE(0x402040);
    } else {
        r += 1;
        v = z;
    }
    PATH_END(r);
    return v;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    unsigned n = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 39;
    P.ctx = &nodes[0];
    nodes[0].counters = calloc(8, sizeof(uint64_t));
    P.top = calloc(1 << 20, sizeof(struct frame));
    double best[2] = {1e9, 1e9};
    uint64_t sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        sink += fib(n) + tak(n / 2, n / 4, n / 8);
        double t1 = now();
        sink += fib_i(n) + tak_i(n / 2, n / 4, n / 8);
        double t2 = now();
        if (t1 - t0 < best[0]) best[0] = t1 - t0;
        if (t2 - t1 < best[1]) best[1] = t2 - t1;
    }
    printf("plain %.3f s, instrumented %.3f s, ratio %.2f (%u contexts, checksum %llu)\n", best[0],
           best[1], best[1] / best[0], n_nodes, (unsigned long long)sink);
    return 0;
}
