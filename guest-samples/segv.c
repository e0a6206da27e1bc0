/* Death by SIGSEGV from a store through a null pointer, after flushed output. A translator
 * must let the fault kill the guest with the same signal (no handler is installed). */
#include <stdio.h>

static int *volatile null_ptr; /* volatile: the store is not optimised into a trap */

int main(void)
{
    printf("about to store through NULL\n");
    fflush(stdout);
    *null_ptr = 42;
    printf("still alive?\n");
    return 0;
}
