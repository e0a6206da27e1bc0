/* Reads the clocks through the vDSO (clock_gettime, gettimeofday, time): 1000 reads of each,
 * checking that the monotonic clock never goes back. Output does not depend on the time. */
#include <stdio.h>
#include <sys/time.h>
#include <time.h>

int main(void)
{
    struct timespec last = {0, 0};
    int back = 0;
    for (int i = 0; i < 1000; i++) {
        struct timespec now;
        struct timeval tv;
        clock_gettime(CLOCK_MONOTONIC, &now);
        gettimeofday(&tv, NULL);
        (void)time(NULL);
        if (now.tv_sec < last.tv_sec || (now.tv_sec == last.tv_sec && now.tv_nsec < last.tv_nsec))
            back++;
        last = now;
    }
    printf("clock: 1000 reads, the monotonic clock went back %d times\n", back);
    return back != 0;
}
