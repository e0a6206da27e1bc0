/* Exit status from main's return value: prints a line, returns 42. */
#include <stdio.h>

int main(int argc, char **argv)
{
    (void)argv;
    printf("returning 42 from main (argc=%d)\n", argc);
    return 42;
}
