/* Code written into a page that stays writable and executable (RWX), as JITs without W^X do:
 * no mprotect or mmap tells a translator the code changed. The program rewrites a function
 * in place many times (its constant, and its length), calls it between rewrites, and also
 * writes code into the same page as data it keeps updating; a translator that runs stale
 * code prints a different sum. A read(2) into the code page checks that the kernel's own
 * writes reach it too. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int (*fn_t)(int);

/* `lea eax, [rdi + k]` repeated `adds` times with k = value, then `ret`: returns
 * x + adds * value (each lea adds value to edi first: lea edi, [rdi + value]). */
static void emit(uint8_t *p, int value, int adds)
{
    uint8_t *q = p;
    for (int i = 0; i < adds; i++) {
        *q++ = 0x8d;                        /* lea edi, [rdi + disp32] */
        *q++ = 0xbf;
        memcpy(q, &value, 4);
        q += 4;
    }
    *q++ = 0x89;                            /* mov eax, edi */
    *q++ = 0xf8;
    *q++ = 0xc3;                            /* ret */
}

int main(void)
{
    uint8_t *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    fn_t f = (fn_t)page;
    volatile uint64_t *counter = (volatile uint64_t *)(page + 2048);  /* data in the code page */
    long sum = 0;
    for (int round = 0; round < 300; round++) {
        emit(page, round, 1 + round % 5);
        for (int i = 0; i < 20; i++) {
            sum += f(i);
            *counter += 1;
        }
    }
    printf("rewrites: sum %ld, counter %llu\n", sum, (unsigned long long)*counter);

    /* The kernel writes new code into the page: mov eax, 42; ret. */
    int fds[2];
    if (pipe(fds) != 0)
        return 1;
    const uint8_t code[] = { 0xb8, 42, 0, 0, 0, 0xc3 };
    if (write(fds[1], code, sizeof code) != (ssize_t)sizeof code)
        return 1;
    if (read(fds[0], page, sizeof code) != (ssize_t)sizeof code) {
        perror("read");
        return 1;
    }
    printf("after read: %d\n", f(0));
    return 0;
}
