/* Where the kernel loads a position-independent program, its load bias is a multiple of the
 * largest p_align of its PT_LOAD segments. The ELF corpus test (tests/tests/elf_corpus.rs)
 * builds this with `-z max-page-size=0x400000` and compares native and hotpath runs. */
#include <stdint.h>
#include <stdio.h>

extern const char __ehdr_start[];

int main(void)
{
    uintptr_t base = (uintptr_t)__ehdr_start;
    printf("base aligned to 4 MiB: %s\n", base % (4u << 20) == 0 ? "yes" : "no");
    return 0;
}
