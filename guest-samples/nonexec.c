/* Only executable code runs: a call, jump or fall-through into bytes that are not executable
 * faults with SIGSEGV, si_code SEGV_ACCERR and si_addr the address the CPU could not fetch,
 * with the registers of that moment (REG_RIP the target, RSP after the call's push). Cases:
 * code in a segment without PF_X (.rodata, .data), on the heap, on the stack, in a page made
 * PROT_READ with mprotect after it ran (by this thread or another), a fall-through off the end of an executable page, and
 * an instruction that runs into a non-executable page.
 *
 * Only comparisons ("yes"/"no") and offsets from the target are printed, never addresses. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#define ONCE __attribute__((noinline, noclone))

static sigjmp_buf env;
static volatile int caught_sig, caught_code;
static volatile uintptr_t caught_addr, caught_rip, caught_rsp, caught_rbx, caught_top;

static void on_segv(int sig, siginfo_t *info, void *ucv)
{
    ucontext_t *uc = ucv;
    caught_sig = sig;
    caught_code = info->si_code;
    caught_addr = (uintptr_t)info->si_addr;
    caught_rip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    caught_rsp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
    caught_rbx = (uintptr_t)uc->uc_mcontext.gregs[REG_RBX];
    caught_top = *(uintptr_t *)caught_rsp;
    siglongjmp(env, 1);
}

/* RSP just before the transfer, and the return address the call pushes. */
static volatile uintptr_t rsp_before, return_address;

/* `call *target` with RBX = 0x5eed; returns if the target returns. */
ONCE static void call_into(const void *target)
{
    __asm__ volatile("lea 1f(%%rip), %%rax\n\t"
                     "mov %%rax, %1\n\t"
                     "mov %%rsp, %0\n\t"
                     "mov $0x5eed, %%ebx\n\t"
                     "call *%2\n"
                     "1:\n\t"
                     : "=m"(rsp_before), "=m"(return_address)
                     : "r"(target)
                     : "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11",
                       "memory");
}

/* `jmp *target` with RBX = 0x5eed; never returns normally. */
ONCE static void jump_into(const void *target)
{
    __asm__ volatile("mov %%rsp, %0\n\t"
                     "mov $0x5eed, %%ebx\n\t"
                     "jmp *%1\n\t"
                     : "=m"(rsp_before)
                     : "r"(target)
                     : "rbx", "memory");
}

/* Runs `how` (call or jump) into `target`, expecting a fault at `fault` (si_addr) with
 * REG_RIP `rip`, and prints what the handler saw. */
static void expect_fault(const char *name, const void *target, int call, uintptr_t fault,
                         uintptr_t rip)
{
    caught_sig = 0;
    if (sigsetjmp(env, 1) == 0) {
        if (call)
            call_into(target);
        else
            jump_into(target);
        printf("%s: no fault\n", name);
        return;
    }
    uintptr_t want_rsp = call ? rsp_before - 8 : rsp_before;
    printf("%s: sig=%d code=%d addr-fault=%ld rip-expected=%ld rsp ok=%s rbx ok=%s",
           name, caught_sig, caught_code, (long)(caught_addr - fault), (long)(caught_rip - rip),
           caught_rsp == want_rsp ? "yes" : "no", caught_rbx == 0x5eed ? "yes" : "no");
    if (call)
        printf(" return address ok=%s", caught_top == return_address ? "yes" : "no");
    printf("\n");
}

/* Makes the page at `arg` read-only, from another thread. */
static void *make_read_only(void *arg)
{
    mprotect(arg, (size_t)sysconf(_SC_PAGESIZE), PROT_READ);
    return NULL;
}

static const unsigned char rodata_code[] = {0xc3}; /* ret, in a PT_LOAD without PF_X */
static unsigned char data_code[] = {0xc3};         /* ret, in the RW data segment */

int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    long page = sysconf(_SC_PAGESIZE);

    expect_fault("rodata call", rodata_code, 1, (uintptr_t)rodata_code, (uintptr_t)rodata_code);
    expect_fault("data jump", data_code, 0, (uintptr_t)data_code, (uintptr_t)data_code);

    unsigned char *heap = malloc(64);
    heap[0] = 0xc3;
    expect_fault("heap call", heap, 1, (uintptr_t)heap, (uintptr_t)heap);
    free(heap);

    volatile unsigned char stack_code[16];
    stack_code[0] = 0xc3;
    expect_fault("stack call", (const void *)stack_code, 1, (uintptr_t)stack_code,
                 (uintptr_t)stack_code);

    /* A page of `ret` that runs (and is translated), then is made read-only. */
    unsigned char *p = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE | PROT_EXEC,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(p, 0xc3, 2 * page);
    mprotect(p, page, PROT_READ | PROT_EXEC);
    for (int i = 0; i < 3; i++)
        call_into(p + 16);
    printf("ret page ran: yes\n");
    mprotect(p, page, PROT_READ);
    expect_fault("mprotect read-only after running", p + 16, 1, (uintptr_t)(p + 16),
                 (uintptr_t)(p + 16));
    mprotect(p, page, PROT_NONE);
    expect_fault("mprotect none", p + 16, 1, (uintptr_t)(p + 16), (uintptr_t)(p + 16));

    /* The same, with another thread's mprotect: this thread's translation must go too. */
    mprotect(p, page, PROT_READ | PROT_EXEC);
    for (int i = 0; i < 3; i++)
        call_into(p + 16);
    pthread_t t;
    pthread_create(&t, NULL, make_read_only, p);
    pthread_join(t, NULL);
    expect_fault("mprotect by another thread", p + 16, 1, (uintptr_t)(p + 16),
                 (uintptr_t)(p + 16));

    /* Falling off the end of an executable page into a read-only one: nops up to the end. */
    mprotect(p, 2 * page, PROT_READ | PROT_WRITE);
    memset(p, 0x90, page);
    mprotect(p, page, PROT_READ | PROT_EXEC);
    mprotect(p + page, page, PROT_READ);
    expect_fault("fall-through", p + page - 8, 1, (uintptr_t)(p + page), (uintptr_t)(p + page));

    /* `mov eax, imm32` (5 bytes) whose first byte is the page's last: the fetch faults at the
     * next page, RIP at the instruction. */
    mprotect(p, page, PROT_READ | PROT_WRITE);
    memset(p, 0x90, page);
    p[page - 1] = 0xb8;
    mprotect(p, page, PROT_READ | PROT_EXEC);
    expect_fault("straddling instruction", p + page - 8, 1, (uintptr_t)(p + page),
                 (uintptr_t)(p + page - 1));

    /* Executable again: it runs. */
    mprotect(p, 2 * page, PROT_READ | PROT_WRITE);
    memset(p, 0xc3, 2 * page);
    mprotect(p, 2 * page, PROT_READ | PROT_EXEC);
    call_into(p + page + 16);
    printf("executable again: yes\n");
    return 0;
}
