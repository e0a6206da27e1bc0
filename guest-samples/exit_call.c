/* exit() from deep inside the call stack: atexit handlers run in reverse order and stdio
 * buffers are flushed on the way out; the status is 3. */
#include <stdio.h>
#include <stdlib.h>

static volatile int exit_at_bottom = 1; /* volatile: gcc must not treat leave() as endless recursion */

static void first_registered(void) { printf("atexit: first registered, runs last\n"); }
static void second_registered(void) { printf("atexit: second registered, runs first\n"); }

__attribute__((noinline)) static void leave(int depth)
{
    if (depth == 0) {
        printf("calling exit(3) at depth 0 (no newline before exit...)");
        if (exit_at_bottom)
            exit(3);
        return;
    }
    leave(depth - 1);
    printf("never printed\n");
}

int main(void)
{
    atexit(first_registered);
    atexit(second_registered);
    printf("buffered line that exit() must flush\n");
    leave(10);
    return 0;
}
