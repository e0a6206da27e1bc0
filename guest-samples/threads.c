/* pthreads: four threads with their own TLS (a __thread counter) sum disjoint ranges, meet at
 * a barrier, update a mutex-protected total, and are joined; only the joined results are printed. */
#include <stdio.h>
#include <pthread.h>
#include <stdint.h>

#define NTHREADS 4
#define PER_THREAD 500000

static __thread uint64_t tls_counter;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t barrier;
static uint64_t total;

struct job {
    int index;
    uint64_t sum;
    uint64_t tls_seen;
};

static void *worker(void *arg)
{
    struct job *j = arg;
    uint64_t s = 0;
    for (uint64_t i = (uint64_t)j->index * PER_THREAD; i < (uint64_t)(j->index + 1) * PER_THREAD; i++) {
        s += i * i % 1000003;
        tls_counter++;
    }
    pthread_barrier_wait(&barrier);
    pthread_mutex_lock(&lock);
    total += s;
    pthread_mutex_unlock(&lock);
    j->sum = s;
    j->tls_seen = tls_counter;
    return (void *)(uintptr_t)(j->index + 100);
}

int main(void)
{
    pthread_t t[NTHREADS];
    struct job jobs[NTHREADS];
    pthread_barrier_init(&barrier, NULL, NTHREADS);
    for (int i = 0; i < NTHREADS; i++) {
        jobs[i].index = i;
        if (pthread_create(&t[i], NULL, worker, &jobs[i]) != 0) {
            printf("pthread_create failed\n");
            return 1;
        }
    }
    for (int i = 0; i < NTHREADS; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        printf("thread %d: sum %llu tls %llu returned %d\n", i, (unsigned long long)jobs[i].sum,
               (unsigned long long)jobs[i].tls_seen, (int)(uintptr_t)ret);
    }
    printf("total %llu, main tls %llu\n", (unsigned long long)total, (unsigned long long)tls_counter);
    return 0;
}
