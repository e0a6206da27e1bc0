/* Code in one page that calls and jumps into a function in another page, which is rewritten
 * 3000 times (`mov eax, v; ret`) between calls: first in place while the page stays RWX (each
 * write faults under a translator that watches the page), then W^X as JITs that flip
 * protections do (mprotect to RW, write, mprotect to RX: no fault, the mprotect says it). The
 * caller's page is not written, so a translator that discards only the translations of the
 * written page must still undo the caller's direct links into them. Prints the sums. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

int main(void)
{
    uint8_t *p = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    uint8_t *f = p, *h = p + 64, *g = p + 2 * 4096;
    /* f: call g; add eax, 1; ret */
    int32_t rel = (int32_t)(g - (f + 5));
    f[0] = 0xe8;
    memcpy(f + 1, &rel, 4);
    f[5] = 0x83;
    f[6] = 0xc0;
    f[7] = 0x01;
    f[8] = 0xc3;
    /* h: jmp g */
    int32_t rel2 = (int32_t)(g - (h + 5));
    h[0] = 0xe9;
    memcpy(h + 1, &rel2, 4);
    mprotect(p, 4096, PROT_READ | PROT_EXEC);
    for (int wx = 0; wx < 2; wx++) {
        long sum = 0;
        for (int v = 0; v < 3000; v++) {
            uint8_t c[] = {0xb8, 0, 0, 0, 0, 0xc3}; /* g: mov eax, v; ret */
            memcpy(c + 1, &v, 4);
            if (wx)
                mprotect(g, 4096, PROT_READ | PROT_WRITE);
            memcpy(g, c, sizeof c);
            if (wx)
                mprotect(g, 4096, PROT_READ | PROT_EXEC);
            for (int k = 0; k < 3; k++) {
                sum += ((int (*)(void))f)();
                sum += 2L * ((int (*)(void))h)();
            }
        }
        printf("jit_pages: %s sum %ld\n", wx ? "W^X" : "RWX", sum);
    }
    return 0;
}
