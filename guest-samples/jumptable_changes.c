/* A `switch`'s dispatch through a jump table of 32-bit offsets (gcc's -fPIC shape: movslq,
 * add, jmp *%rax) whose table changes only after a system call: a translator that makes the
 * table's entries part of its translation must notice each way it can change, and must not
 * take an entry made for one table base or index for another.
 *
 * `sw` loads the table's base itself (lea); `sw_at` takes it as an argument and is called
 * with two tables, one of them 300 entries long (indices past 255 too). The short table sits
 * alone in a page-aligned read-only page and is changed by mprotect RW / store / mprotect R,
 * by a write to /proc/self/mem through the read-only page, and by MADV_DONTNEED (the page
 * reads as the file again). Each state runs 2000 times (past the superblock threshold when
 * superblocks are formed eagerly). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

long sw(long index, long x);
long sw_at(long index, long x, const int32_t *table);
extern const int32_t table[1024], long_table[300];
extern const char case_a[], case_b[], case_c[], case_d[];

__asm__(".text\n"
        ".globl sw\n"
        "sw:\n"
        "    lea table(%rip), %rcx\n"
        "    movslq (%rcx,%rdi,4), %rax\n"
        "    add %rcx, %rax\n"
        "    jmp *%rax\n"
        ".globl sw_at\n"
        "sw_at:\n"
        "    movslq (%rdx,%rdi,4), %rax\n"
        "    add %rdx, %rax\n"
        "    jmp *%rax\n"
        ".globl case_a, case_b, case_c, case_d\n"
        "case_a: lea 1000(%rsi), %rax\n ret\n"
        "case_b: lea 1(%rsi), %rax\n ret\n"
        "case_c: lea (%rsi,%rsi), %rax\n ret\n"
        "case_d: lea -3(%rsi), %rax\n ret\n"
        /* One page of its own, read-only in the file: only this table changes. */
        ".section .rodata.jumptable_changes, \"a\"\n"
        ".balign 4096\n"
        ".globl table\n"
        "table:\n"
        "    .long case_a - table, case_b - table, case_c - table, case_d - table\n"
        "    .fill 1020, 4, 0\n"
        ".balign 4\n"
        ".globl long_table\n"
        "long_table:\n"
        "    .rept 75\n"
        "    .long case_d - long_table, case_c - long_table, case_b - long_table, case_a - long_table\n"
        "    .endr\n"
        ".text\n");

static void run(const char *what)
{
    long own = 0, at = 0, far = 0;
    for (long i = 0; i < 2000; i++) {
        own += sw(i % 4, i);
        at += sw_at(i % 4, i, i % 3 ? table : long_table);
        far += sw_at(296 + i % 4, i, long_table);
    }
    printf("%-24s own %ld at %ld far %ld\n", what, own, at, far);
}

/* Entry 0 of `table` to `to`, through mprotect. */
static void set_entry(const char *to)
{
    void *page = (void *)table;
    if (mprotect(page, 4096, PROT_READ | PROT_WRITE) != 0) {
        perror("mprotect");
        return;
    }
    *(int32_t volatile *)&table[0] = (int32_t)(to - (const char *)table);
    mprotect(page, 4096, PROT_READ);
}

int main(void)
{
    run("initial");

    set_entry(case_d);
    run("after mprotect + store");

    int fd = open("/proc/self/mem", O_RDWR);
    int32_t entry = (int32_t)(case_c - (const char *)table);
    if (fd < 0 || pwrite(fd, &entry, sizeof entry, (off_t)(uintptr_t)table) != sizeof entry)
        printf("/proc/self/mem: not written\n");
    else
        run("after /proc/self/mem");
    if (fd >= 0)
        close(fd);

    set_entry(case_b);
    run("after mprotect again");

    /* The page as the file has it: case_a. */
    madvise((void *)table, 4096, MADV_DONTNEED);
    run("after MADV_DONTNEED");
    return 0;
}
