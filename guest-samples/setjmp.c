/* setjmp/longjmp: jumps out of deep recursion, nested jmp_bufs, sigsetjmp/siglongjmp with the
 * signal mask. glibc mangles the saved rsp/rip with a pointer guard read from %fs:0x30, so this
 * also checks that the guest's FS base is its own. */
#include <stdio.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>

static jmp_buf env;
static sigjmp_buf senv;
static volatile int depth_reached;

__attribute__((noinline)) static void dive(int n, int target)
{
    volatile char pad[32];
    pad[0] = (char)n;
    depth_reached = n + pad[0] - (char)n;
    if (n == target)
        longjmp(env, n + 1);
    dive(n + 1, target);
}

__attribute__((noinline)) static int nested(int level)
{
    jmp_buf inner;
    int r = setjmp(inner);
    if (r == 0) {
        if (level > 0) {
            int below = nested(level - 1);
            longjmp(inner, below + 10);
        }
        return 1;
    }
    return r;
}

int main(void)
{
    volatile int rounds = 0;
    int r = setjmp(env);
    if (r == 0) {
        dive(0, 5000);
    } else {
        rounds++;
        printf("longjmp from depth %d returned %d (round %d)\n", depth_reached, r, rounds);
        if (rounds < 5)
            longjmp(env, r + 1000);
    }

    printf("nested(6) = %d\n", nested(6));

    /* siglongjmp restores the mask saved by sigsetjmp(…, 1). */
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    volatile int phase = 0;
    if (sigsetjmp(senv, 1) == 0) {
        sigprocmask(SIG_BLOCK, &set, NULL);
        phase = 1;
        siglongjmp(senv, 7);
    }
    sigprocmask(SIG_BLOCK, NULL, &old);
    printf("after siglongjmp phase=%d usr1_blocked=%d\n", phase, sigismember(&old, SIGUSR1));

    /* Many short round trips, so the setjmp and longjmp blocks get hot. */
    volatile uint64_t sum = 0;
    for (volatile int i = 0; i < 20000; i++) {
        jmp_buf b;
        int v = setjmp(b);
        if (v == 0)
            longjmp(b, (int)(i % 13) + 1);
        sum += (uint64_t)v;
    }
    printf("round trips sum = %llu\n", (unsigned long long)sum);
    return 0;
}
