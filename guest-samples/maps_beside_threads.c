/* One thread maps, touches, re-protects and unmaps anonymous memory (never executable) 2,000
 * times while another calls a function in a loop until told to stop: under hotpath the
 * mappings concern no translated code, so they must not send the calling thread out of its
 * code cache (tests/tests/threads.rs checks the links the run makes; the output is compared
 * with a native run). argv[1] = rounds. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static volatile int stop;
static volatile long calls;

__attribute__((noinline)) static long step(long x) { return x * 3 + (x >> 2); }

static void *worker(void *arg)
{
    long s = 0;
    (void)arg;
    while (!stop) {
        for (int i = 0; i < 1000; i++)
            s += step(i) & 7;
        calls += 1000;
    }
    return (void *)(s >= 0 ? 1L : 0L);
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? strtol(argv[1], NULL, 10) : 2000;
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0)
        return 1;
    while (calls == 0)
        ;
    long touched = 0;
    for (long i = 0; i < rounds; i++) {
        char *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return 2;
        memset(p, 1, 4096);
        touched += p[4095];
        if (mprotect(p, 4096, PROT_READ) != 0 || munmap(p, 1 << 20) != 0)
            return 3;
    }
    stop = 1;
    void *ran;
    pthread_join(t, &ran);
    printf("mapped %ld times beside a running thread (touched %ld); the thread ran: %s\n", rounds,
           touched, ran ? "yes" : "no");
    return 0;
}
