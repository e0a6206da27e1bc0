/* The smallest guest: one line on stdout, exit 0. */
#include <stdio.h>

int main(void)
{
    puts("Hello from a hotpath guest!");
    return 0;
}
