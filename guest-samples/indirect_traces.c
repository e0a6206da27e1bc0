/* Hot loops whose paths go through indirect calls and jumps with a usual target: under
 * hotpath their superblocks follow the usual target behind a compare, and leave by a side exit
 * when another target comes (tests/tests/superblocks.rs compares the profile with a run
 * without superblocks; the catalog compares the output with a native run).
 *
 * 1. A call through a function table, 9 times in 10 to `inc`, else to `dbl`.
 * 2. A `switch` compiled to a jump table, 7 times in 8 to one case.
 * 3. The same call site whose usual target changes half way (`inc`, then `neg`): the trace
 *    formed for the first half leaves by its side exit in the second.
 * 4. A computed `goto` through a label table, mostly to one label, then to a non-canonical
 *    address; and the function table's call to a non-canonical address: each faults at the
 *    branch (SIGSEGV, address 0, as a general-protection fault reports), in the middle of a
 *    hot trace, and the handler siglongjmps out. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef long (*op_fn)(long);

__attribute__((noinline)) static long inc(long x) { return x + 1; }
__attribute__((noinline)) static long dbl(long x) { return (x * 2) % 1000003; }
__attribute__((noinline)) static long neg(long x) { return -x / 3; }

static op_fn table[3] = {inc, dbl, neg};
static sigjmp_buf env;
static volatile int faults;
static void *volatile fault_addr;

static void on_segv(int sig, siginfo_t *info, void *uc)
{
    (void)sig;
    (void)uc;
    fault_addr = info->si_addr;
    faults++;
    siglongjmp(env, 1);
}

/* The call through the table: `pick` says which entry, for each step. */
__attribute__((noinline)) static long calls(long rounds, int (*pick)(long))
{
    long x = 1, s = 0;
    for (long i = 0; i < rounds; i++) {
        x = table[pick(i)](x);
        s += x & 0xff;
    }
    return s + x;
}

static int mostly_inc(long i) { return i % 10 == 9; }
static int inc_then_neg(long i) { return i < 20000 ? 0 : 2; }

__attribute__((noinline)) static long dispatch(long rounds)
{
    long s = 0;
    for (long i = 0; i < rounds; i++) {
        switch ((i % 8 == 7) ? (int)(i % 5) : 3) {
        case 0: s += 7; break;
        case 1: s ^= i; break;
        case 2: s -= 3; break;
        case 3: s += i & 15; break;
        case 4: s = s * 3 % 65521; break;
        }
    }
    return s;
}

/* A computed goto, mostly to `add`; `bad` steps after `bad_at` jump to `labels[3]`. */
__attribute__((noinline)) static long computed(long rounds, long bad_at, void *bad)
{
    static void *labels[4] = {&&add, &&sub, &&done, 0};
    long s = 0, i = 0;
    labels[3] = bad;
next:
    if (i == rounds)
        goto done;
    i++;
    goto *labels[i == bad_at ? 3 : (i % 16 == 0)];
add:
    s += i;
    goto next;
sub:
    s -= 1;
    goto next;
done:
    return s;
}

int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, 0);

    printf("calls, mostly inc: %ld\n", calls(40000, mostly_inc));
    printf("calls, inc then neg: %ld\n", calls(40000, inc_then_neg));
    printf("switch: %ld\n", dispatch(40000));
    printf("computed goto: %ld\n", computed(40000, -1, 0));

    void *noncanonical = (void *)0x8000000000001000ull;
    if (sigsetjmp(env, 1) == 0)
        computed(40000, 30000, noncanonical);
    printf("computed goto to a non-canonical address: %d fault(s) at %p\n", faults,
           fault_addr);
    table[1] = (op_fn)noncanonical;
    if (sigsetjmp(env, 1) == 0)
        calls(40000, mostly_inc);
    printf("call to a non-canonical address: %d fault(s) at %p\n", faults, fault_addr);
    return 0;
}
