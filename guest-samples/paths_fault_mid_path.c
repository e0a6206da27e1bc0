/* A signal in the middle of a path: `sum` is a hot leaf function (a loop, in a superblock
 * once hot); every 50th round main takes the page it reads away, so `sum`'s first load
 * faults, the SIGSEGV handler (an activation the blocks alone show) gives the page back, and
 * the load runs again. The profile must be the per-block reference's (tests/tests/paths.rs).
 * Deterministic: the faults come at fixed rounds. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static char *page;
static long page_size;
static volatile int faults;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)si;
    (void)uc;
    mprotect(page, page_size, PROT_READ | PROT_WRITE);
    faults++;
}

__attribute__((noinline)) static long sum(const volatile char *p, int n)
{
    long s = 0;
    for (int i = 0; i < n; i++)
        s += p[i] * (i & 7);
    return s;
}

int main(void)
{
    page_size = sysconf(_SC_PAGESIZE);
    page = mmap(NULL, page_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 1;
    for (long i = 0; i < page_size; i++)
        page[i] = (char)(i * 7);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    long total = 0;
    for (int round = 0; round < 300; round++) {
        if (round % 50 == 49)
            mprotect(page, page_size, PROT_NONE);
        total += sum(page, 200);
    }
    printf("total %ld, faults %d\n", total, faults);
    return 0;
}
