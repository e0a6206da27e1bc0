/* Death by SIGABRT from abort(): the output before it is flushed by hand, and the waiting
 * parent must see the process killed by signal 6, not a normal exit. */
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    printf("about to abort\n");
    fflush(stdout);
    fprintf(stderr, "stderr before abort\n");
    abort();
}
