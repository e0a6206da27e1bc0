/* Synchronous signals caught by the program itself: faults must be raised at the faulting guest
 * instruction, with the kernel's siginfo (si_addr, si_code) and a ucontext whose registers are
 * the guest's at that instruction; a handler may leave with siglongjmp, or edit the ucontext
 * (REG_RIP past the instruction, other registers, flags) and return to continue there. Also a
 * stack overflow caught on an alternate signal stack.
 *
 * Each faulting instruction sits at a global label in inline assembly, so the expected REG_RIP
 * is known exactly; only "yes"/"no" comparisons are printed, never addresses.
 *
 * With the argument `overflow` only the stack overflow part runs (a separate catalog sample);
 * with `overflow-uncaught` the stack overflows with no handler, and the program dies of SIGSEGV. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <ucontext.h>
#include <unistd.h>

/* Labels defined in the inline assembly below. */
extern const char fault_load[], fault_store[], fault_ud2[], fault_skip_load[], fault_div[],
    fault_int3_after[];

/* Functions holding a labelled instruction must exist once: never inlined or cloned. */
#define ONCE __attribute__((noinline, noclone))

static sigjmp_buf env;
static volatile sig_atomic_t caught_sig;
static void *volatile caught_addr;
static volatile int caught_code;
static volatile uintptr_t caught_rip;
static volatile int rip_ok;
static volatile int handlers_run;

static const char *yes(int b)
{
    return b ? "yes" : "no";
}

/* Records the fault and jumps back to the test. */
static void on_fault_jump(int sig, siginfo_t *info, void *ucv)
{
    ucontext_t *uc = ucv;
    caught_sig = sig;
    caught_addr = info->si_addr;
    caught_code = info->si_code;
    caught_rip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    siglongjmp(env, 1);
}

/* Skips the faulting instruction (its length is in the label table), sets rax to 42 and CF. */
static void on_fault_skip(int sig, siginfo_t *info, void *ucv)
{
    ucontext_t *uc = ucv;
    (void)info;
    handlers_run++;
    caught_sig = sig;
    greg_t rip = uc->uc_mcontext.gregs[REG_RIP];
    if (sig == SIGILL) {
        rip_ok = rip == (greg_t)fault_ud2;
        uc->uc_mcontext.gregs[REG_RIP] = rip + 2; /* ud2 is 0f 0b */
    } else if (sig == SIGSEGV) {
        rip_ok = rip == (greg_t)fault_skip_load;
        uc->uc_mcontext.gregs[REG_RIP] = rip + 3; /* mov (%rbx),%rax is 48 8b 03 */
    } else if (sig == SIGFPE) {
        rip_ok = rip == (greg_t)fault_div && info->si_code == FPE_INTDIV;
        uc->uc_mcontext.gregs[REG_RIP] = rip + 2; /* div %ecx is f7 f1 */
        uc->uc_mcontext.gregs[REG_RDX] = 7;
    } else if (sig == SIGTRAP) {
        /* int3 is a trap: REG_RIP is already after it. */
        rip_ok = rip == (greg_t)fault_int3_after;
    }
    uc->uc_mcontext.gregs[REG_RAX] = 42;
    uc->uc_mcontext.gregs[REG_EFL] |= 1; /* CF */
}

static void install(int sig, void (*fn)(int, siginfo_t *, void *), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fn;
    sa.sa_flags = SA_SIGINFO | flags;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

/* Loads from p at the label fault_load. */
ONCE static long load_at_label(const long *p)
{
    long v;
    __asm__ volatile(".globl fault_load\nfault_load:\n\tmov (%1), %0" : "=r"(v) : "r"(p) : "memory");
    return v;
}

/* Stores to p at the label fault_store. */
ONCE static void store_at_label(long *p)
{
    __asm__ volatile(".globl fault_store\nfault_store:\n\tmovq $1, (%0)" : : "r"(p) : "memory");
}

/* ud2 at fault_ud2; the handler skips it and sets rax = 42 and CF; returns rax*2 + CF. */
ONCE static long skip_ud2(void)
{
    long rax = 1;
    unsigned char cf;
    __asm__ volatile("clc\n.globl fault_ud2\nfault_ud2:\n\tud2\n\tsetc %1"
                     : "+a"(rax), "=r"(cf)
                     :
                     : "cc");
    return rax * 2 + cf;
}

/* mov (%rbx),%rax from a null rbx at fault_skip_load; the handler skips it and sets rax. */
ONCE static long skip_null_load(void)
{
    long rax = 1;
    unsigned char cf;
    __asm__ volatile("xor %%ebx, %%ebx\n\tclc\n.globl fault_skip_load\nfault_skip_load:\n\t"
                     ".byte 0x48, 0x8b, 0x03\n\tsetc %1"
                     : "+a"(rax), "=r"(cf)
                     :
                     : "rbx", "cc", "memory");
    return rax * 2 + cf;
}

/* div %ecx by zero at fault_div; the handler skips it, sets rax = 42 and rdx = 7. */
ONCE static long skip_div(void)
{
    unsigned long rax = 100, rdx = 0;
    __asm__ volatile("xor %%ecx, %%ecx\n.globl fault_div\nfault_div:\n\t.byte 0xf7, 0xf1"
                     : "+a"(rax), "+d"(rdx)
                     :
                     : "rcx", "cc");
    return (long)(rax * 10 + rdx);
}

/* int3; the handler sees REG_RIP after it and sets rax = 42. */
ONCE static long after_int3(void)
{
    long rax = 1;
    __asm__ volatile("int3\n.globl fault_int3_after\nfault_int3_after:\n\tnop" : "+a"(rax) : : "cc");
    return rax;
}

static char altstack[256 * 1024];
static volatile int on_alt, alt_flag;

static void on_overflow(int sig, siginfo_t *info, void *ucv)
{
    (void)info;
    (void)ucv;
    char here;
    uintptr_t p = (uintptr_t)&here, lo = (uintptr_t)altstack;
    on_alt = p >= lo && p < lo + sizeof altstack;
    stack_t cur;
    sigaltstack(NULL, &cur);
    alt_flag = (cur.ss_flags & SS_ONSTACK) != 0;
    caught_sig = sig;
    siglongjmp(env, 1);
}

static volatile unsigned long depth;

#pragma GCC diagnostic ignored "-Winfinite-recursion"
static unsigned long recurse(volatile char *prev)
{
    volatile char frame[512];
    frame[0] = prev ? prev[0] + 1 : 0;
    depth++;
    return recurse(frame) + frame[0];
}

static void stack_overflow(void);
static unsigned long recurse(volatile char *prev);

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "overflow") == 0) {
        stack_overflow();
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "overflow-uncaught") == 0) {
        printf("overflowing the stack with no SIGSEGV handler\n");
        fflush(stdout);
        recurse(NULL);
        printf("survived a stack overflow!\n");
        return 0;
    }

    /* 1. SIGSEGV from loads and stores: si_addr, si_code, and REG_RIP at the instruction. */
    install(SIGSEGV, on_fault_jump, 0);
    long *null_ptr = (long *)(uintptr_t)0;
    long *wild = (long *)(uintptr_t)0x10;
    struct {
        const char *what;
        int store;
        long *p;
        int code;
    } cases[4];
    long *ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    long *none = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ro == MAP_FAILED || none == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    cases[0] = (typeof(cases[0])){"load from NULL", 0, null_ptr, SEGV_MAPERR};
    cases[1] = (typeof(cases[0])){"store to 0x10", 1, wild, SEGV_MAPERR};
    cases[2] = (typeof(cases[0])){"store to a read-only page", 1, ro + 3, SEGV_ACCERR};
    cases[3] = (typeof(cases[0])){"load from a PROT_NONE page", 0, none + 5, SEGV_ACCERR};
    for (int i = 0; i < 4; i++) {
        for (int round = 0; round < 3; round++) {
            caught_sig = 0;
            if (sigsetjmp(env, 1) == 0) {
                if (cases[i].store)
                    store_at_label(cases[i].p);
                else
                    (void)load_at_label(cases[i].p);
                printf("%s: no fault!\n", cases[i].what);
                continue;
            }
            if (round > 0)
                continue;
            const char *label = cases[i].store ? fault_store : fault_load;
            printf("%s: signal %d, si_addr right %s, si_code %s, REG_RIP at the instruction %s\n",
                   cases[i].what, (int)caught_sig, yes(caught_addr == (void *)cases[i].p),
                   caught_code == cases[i].code ? (cases[i].code == SEGV_MAPERR ? "SEGV_MAPERR" : "SEGV_ACCERR") : "WRONG",
                   yes(caught_rip == (uintptr_t)label));
        }
    }
    /* The mask was restored by siglongjmp: the handler still works after three rounds. */
    sigset_t now;
    sigprocmask(SIG_BLOCK, NULL, &now);
    printf("SIGSEGV blocked after siglongjmp: %s\n", yes(sigismember(&now, SIGSEGV)));

    /* 2. Jumping to non-executable memory: the fault is at the target, REG_RIP = si_addr. */
    caught_sig = 0;
    if (sigsetjmp(env, 1) == 0) {
        void (*fn)(void) = (void (*)(void))(void *)ro;
        fn();
        printf("call into a non-executable page: no fault!\n");
    } else {
        printf("call into a non-executable page: signal %d, si_addr = REG_RIP = target %s\n",
               (int)caught_sig, yes(caught_addr == (void *)ro && caught_rip == (uintptr_t)ro));
    }

    /* 3. Handlers that edit the ucontext and return: execution continues after the fault. */
    install(SIGILL, on_fault_skip, 0);
    install(SIGSEGV, on_fault_skip, 0);
    install(SIGFPE, on_fault_skip, 0);
    install(SIGTRAP, on_fault_skip, 0);
    long r = skip_ud2();
    printf("ud2 skipped: rax*2+CF = %ld (85 expected), REG_RIP at ud2 %s\n", r, yes(rip_ok));
    r = skip_null_load();
    printf("null load skipped: rax*2+CF = %ld (85 expected), REG_RIP at the load %s\n", r, yes(rip_ok));
    r = skip_div();
    printf("division by zero skipped: rax*10+rdx = %ld (427 expected), FPE_INTDIV at the div %s\n", r,
           yes(rip_ok));
    r = after_int3();
    printf("int3: rax = %ld (42 expected), REG_RIP after the int3 %s\n", r, yes(rip_ok));
    int total = 0;
    for (int i = 0; i < 1000; i++)
        total += skip_ud2() == 85;
    printf("1000 more ud2 skipped correctly: %d, handlers run %d\n", total, (int)handlers_run);
    return 0;
}

static void stack_overflow(void)
{
    /* 4. A stack overflow caught on the alternate stack (the normal stack is exhausted). */
    struct rlimit rl = {8 << 20, 8 << 20};
    setrlimit(RLIMIT_STACK, &rl);
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    install(SIGSEGV, on_overflow, SA_ONSTACK);
    caught_sig = 0;
    if (sigsetjmp(env, 1) == 0) {
        recurse(NULL);
        printf("stack overflow: no fault!\n");
    } else {
        printf("stack overflow: signal %d, handler on the alternate stack %s, SS_ONSTACK %s, "
               "deeper than 1000 frames %s\n",
               (int)caught_sig, yes(on_alt), yes(alt_flag), yes(depth > 1000));
    }
    stack_t after;
    sigaltstack(NULL, &after);
    printf("after siglongjmp out of the alternate stack: SS_ONSTACK %s\n", yes(after.ss_flags & SS_ONSTACK));
}
