/* execve(argv[1]) with no arguments and an empty environment; if it returns, prints the errno
 * it failed with and exits 1. The ELF corpus test (tests/tests/elf_corpus.rs) runs it on files
 * the kernel refuses: under hotpath the guest's execve must fail with the same errno. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: exec_arg PROGRAM\n");
        return 2;
    }
    char *args[] = {argv[1], NULL};
    char *env[] = {NULL};
    execve(argv[1], args, env);
    printf("execve failed: %s\n", strerror(errno));
    return 1;
}
