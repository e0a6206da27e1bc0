/* Indirect jumps and calls through a read-only slot (as a PLT entry jumps through its GOT
 * slot after relocation), whose target changes only after a system call: a translator that
 * takes the slot's value as constant must notice each way it can change. The slot sits alone
 * in a page-aligned page; `via_jump` is a PLT-like `jmp *slot(%rip)`, `via_call` a
 * `call *slot(%rip)`. The target is changed by mprotect RW / store / mprotect R, by a write
 * to /proc/self/mem through the read-only page, and by MADV_DONTNEED (the page reads as the
 * file again: the static build's initial value; a relocated build's file holds no usable
 * pointer, so it stores the initial one again). Each state runs 2000 times (past the
 * superblock threshold when superblocks are formed eagerly). */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"

static long f0(long x) { return x + 1000; }
static long f1(long x) { return x + 1; }
static long f2(long x) { return x * 2; }
static long f3(long x) { return x - 3; }

typedef long (*fn_t)(long);

/* One page of its own: only the slot changes protection. `const` with a relocated initial
 * value puts it in .data.rel.ro, which ld.so (or the static-pie's own start) makes read-only
 * after relocation, as a GOT is. */
__attribute__((aligned(4096), section(".data.rel.ro.slot"), used))
static fn_t const slot_page[4096 / sizeof(fn_t)] = { f0 };

long via_jump(long x);
long via_call(long x);
__asm__(".text\n"
        ".globl via_jump\n"
        "via_jump:\n"
        "    jmp *slot_page(%rip)\n"
        ".globl via_call\n"
        "via_call:\n"
        "    sub $8, %rsp\n"
        "    call *slot_page(%rip)\n"
        "    add $8, %rsp\n"
        "    ret\n");

static void run(const char *what)
{
    long a = 0, b = 0;
    for (long i = 0; i < 2000; i++) {
        a += via_jump(i);
        b += via_call(i);
    }
    printf("%-24s jump %ld call %ld\n", what, a, b);
}

static void set_slot(fn_t f)
{
    void *page = (void *)slot_page;
    if (mprotect(page, 4096, PROT_READ | PROT_WRITE) != 0) {
        perror("mprotect");
        return;
    }
    *(fn_t volatile *)&slot_page[0] = f;
    mprotect(page, 4096, PROT_READ);
}

int main(void)
{
    void *page = (void *)slot_page;
    /* The page is read-only in every linkage from here on (made so explicitly for the static
     * build, whose .data.rel.ro nothing protects). */
    mprotect(page, 4096, PROT_READ);
    run("initial");

    set_slot(f1);
    run("after mprotect + store");

    int fd = open("/proc/self/mem", O_RDWR);
    fn_t f = f2;
    if (fd < 0 || pwrite(fd, &f, sizeof f, (off_t)(unsigned long)page) != sizeof f)
        printf("/proc/self/mem: not written\n");
    else
        run("after /proc/self/mem");
    if (fd >= 0)
        close(fd);

    set_slot(f3);
    run("after mprotect again");

    /* The page as the file has it: f0 where the initial value needs no relocation. */
    madvise(page, 4096, MADV_DONTNEED);
    if (*(fn_t const volatile *)&slot_page[0] != f0)
        set_slot(f0);
    run("after MADV_DONTNEED");
    return 0;
}
