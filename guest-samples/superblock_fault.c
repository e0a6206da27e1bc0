/* A hot loop that runs into a fault, again and again: under hotpath the loop becomes a
 * superblock (an unrolled trace with side exits), so the fault lands in the middle of a trace.
 * The guest must see the fault at the right address, and the count of odd bytes it went
 * through before each fault must be right (state at the fault is the guest's), and the profile must
 * still count exactly the blocks that ran (tests/tests/superblocks.rs compares the report with
 * a run without superblocks).
 *
 * Each round walks a buffer whose end is followed by a PROT_NONE page, summing bytes with a
 * data-dependent branch in the loop body (mostly one way, so the trace is unrolled); the load past the end faults and the handler
 * siglongjmps out. Rounds start at different offsets, so the fault hits different positions of
 * the unrolled trace. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

static sigjmp_buf env;
static unsigned char *volatile fault_addr;
static volatile int faults;

static void on_segv(int sig, siginfo_t *info, void *ucv)
{
    (void)sig;
    (void)ucv;
    fault_addr = info->si_addr;
    faults++;
    siglongjmp(env, 1);
}

/* Reads p[start], p[start + 1], ... up to p[end - 1]; the caller's `end` lies past the
 * readable bytes, so the walk faults before it returns. */
__attribute__((noinline)) static unsigned long walk(const volatile unsigned char *p, long start,
                                                    long end, unsigned long *odd)
{
    unsigned long sum = 0;
    for (long i = start; i < end; i++) {
        unsigned char c = p[i];
        if (c & 1)
            (*odd)++;
        else
            sum += c;
    }
    return sum;
}

int main(void)
{
    long page = sysconf(_SC_PAGESIZE);
    unsigned char *buf = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED)
        return 1;
    for (long i = 0; i < page; i++)
        buf[i] = (unsigned char)(i % 16 == 5 ? 2 * i + 1 : 2 * i); /* 1 byte in 16 is odd */
    if (mprotect(buf + page, page, PROT_NONE) != 0)
        return 2;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);

    unsigned long odd = 0;
    volatile unsigned long total = 0;
    for (volatile int round = 0; round < 40; round++) {
        if (sigsetjmp(env, 1) == 0) {
            total += walk(buf, round * 13, 2 * page, &odd);
            printf("round %d: the walk ended without a fault\n", round);
            return 3;
        }
        if (fault_addr != buf + page) {
            printf("round %d: fault at offset %ld, expected %ld\n", round,
                   (long)(fault_addr - buf), page);
            return 4;
        }
    }
    printf("faults %d, odd bytes %lu\n", faults, odd);
    return 0;
}
