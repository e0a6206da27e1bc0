/* The initial process state the loader builds: argc/argv (including an empty argument and
 * one with spaces), the environment, a few auxv entries, and /proc/self/exe. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/auxv.h>
#include <limits.h>

extern char **environ;

int main(int argc, char **argv)
{
    printf("argc=%d\n", argc);
    for (int i = 0; i < argc; i++) {
        /* argv[0] as given on the command line, other args verbatim. */
        printf("argv[%d]=\"%s\"\n", i, argv[i]);
    }
    printf("argv[argc]=%s\n", argv[argc] == NULL ? "NULL" : "not NULL");

    const char *v = getenv("HOTPATH_E2E_VAR");
    printf("HOTPATH_E2E_VAR=%s\n", v ? v : "(unset)");
    int n = 0, e2e = 0;
    for (char **e = environ; *e; e++, n++)
        e2e += strncmp(*e, "HOTPATH_E2E_", 12) == 0;
    printf("environment has HOTPATH_E2E_* entries: %d\n", e2e);

    printf("AT_PAGESZ=%lu\n", getauxval(AT_PAGESZ));
    printf("AT_SECURE=%lu\n", getauxval(AT_SECURE));
    printf("AT_RANDOM present=%d\n", getauxval(AT_RANDOM) != 0);
    printf("AT_PHDR present=%d AT_ENTRY present=%d\n", getauxval(AT_PHDR) != 0, getauxval(AT_ENTRY) != 0);
    printf("AT_UID matches getuid: %d\n", getauxval(AT_UID) == (unsigned long)getuid());

    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len < 0) {
        printf("readlink failed\n");
        return 1;
    }
    exe[len] = 0;
    const char *base = strrchr(exe, '/');
    printf("/proc/self/exe basename=%s\n", base ? base + 1 : exe);
    char real0[PATH_MAX];
    if (realpath(argv[0], real0) == NULL) {
        printf("realpath(argv[0]) failed\n");
        return 1;
    }
    printf("/proc/self/exe == realpath(argv[0]): %d\n", strcmp(exe, real0) == 0);
    return 0;
}
