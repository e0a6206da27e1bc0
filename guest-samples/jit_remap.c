/* Code the program writes at run time: a translator must notice when code it has translated
 * is replaced. The program generates `mov eax, imm32; ret` into a page, runs it, then
 * replaces it three ways — mprotect RW / rewrite / mprotect RX, munmap + mmap MAP_FIXED of
 * new code at the same address, and MAP_FIXED over the live mapping — and runs it again after
 * each change. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <stdint.h>

typedef int (*fn_t)(void);

static void emit(uint8_t *p, int value)
{
    for (int i = 0; i < 64; i++) {          /* a small loop body, so the block is hot */
        p[i * 5 + 0] = 0x05;                /* add eax, imm32 */
        memcpy(p + i * 5 + 1, &(int){ 0 }, 4);
    }
    uint8_t *q = p + 64 * 5;
    q[0] = 0xb8;                            /* mov eax, imm32 */
    memcpy(q + 1, &value, 4);
    q[5] = 0xc3;                            /* ret */
}

static int call_many(fn_t f)
{
    int s = 0;
    for (int i = 0; i < 1000; i++)
        s += f();
    return s / 1000;
}

int main(void)
{
    size_t len = 4096;
    uint8_t *page = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 1;
    emit(page, 1);
    mprotect(page, len, PROT_READ | PROT_EXEC);
    printf("first: %d\n", call_many((fn_t)page));

    mprotect(page, len, PROT_READ | PROT_WRITE);
    emit(page, 2);
    mprotect(page, len, PROT_READ | PROT_EXEC);
    printf("after mprotect: %d\n", call_many((fn_t)page));

    munmap(page, len);
    uint8_t *again = mmap(page, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (again != page)
        return 2;
    emit(page, 3);
    mprotect(page, len, PROT_READ | PROT_EXEC);
    printf("after munmap + mmap: %d\n", call_many((fn_t)page));

    /* Same address, new contents through a fresh MAP_FIXED over the live mapping. */
    uint8_t *fixed = mmap(page, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (fixed != page)
        return 3;
    emit(page, 4);
    mprotect(page, len, PROT_READ | PROT_EXEC);
    printf("after MAP_FIXED over it: %d\n", call_many((fn_t)page));
    return 0;
}
