/* A program linked against a library it finds through RUNPATH $ORIGIN/lib (the dynamic
 * linker takes $ORIGIN from /proc/self/exe), started through a symlink by the test
 * (dynamic.rs): prints the library's answer and what /proc/self/exe names. Natively that is
 * the program file, the link resolved. */
#include <stdio.h>
#include <unistd.h>

int origin_answer(void);

int main(void) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    printf("answer %d\nexe %s\n", origin_answer(), exe);
    return 0;
}
