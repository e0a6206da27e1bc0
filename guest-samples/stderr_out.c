/* Output on both streams: unbuffered stderr and buffered stdout, fprintf, fputs, perror and a
 * raw write(2), plus a non-zero exit status. */
#include <stdio.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

int main(void)
{
    for (int i = 0; i < 5; i++) {
        printf("stdout line %d\n", i);
        fprintf(stderr, "stderr line %d\n", i);
    }
    fputs("fputs to stderr\n", stderr);
    errno = ENOENT;
    perror("perror says");
    fprintf(stderr, "strerror(EACCES) = %s\n", strerror(EACCES));
    static const char raw[] = "raw write(2, ...)\n";
    if (write(2, raw, sizeof raw - 1) != (ssize_t)(sizeof raw - 1))
        return 9;
    printf("done\n");
    return 5;
}
