/* Death by an uncaught SIGTERM the program sends itself, after output on stdout (flushed with
 * fflush first, so it is not lost) and stderr (write(2)). */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void)
{
    printf("about to send myself SIGTERM\n");
    fflush(stdout);
    const char msg[] = "stderr: no handler for SIGTERM\n";
    if (write(2, msg, strlen(msg)) < 0)
        return 1;
    kill(getpid(), SIGTERM);
    /* Not reached: SIGTERM's default action ends the process before kill returns. */
    printf("still alive after SIGTERM!\n");
    return 0;
}
