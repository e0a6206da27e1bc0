/* The x87, MMX and SSE state across system calls, each a round trip through hotpath's
 * dispatcher (which runs its own code with the host's x87 control word and MXCSR, and skips
 * reloading them when the guest's x87 state is the initial one): the control word (rounding
 * and precision), the sticky exception flags, the register stack and its tags, an MMX
 * register, and MXCSR's rounding mode, each checked by computing with it after the call.
 * Every asm block makes its own system call, so nothing the compiler keeps lives across it. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include "common.h"

/* A long double's 80 bits as hex (sign/exponent, then mantissa). */
static void print_ld(const char *what, const unsigned char *p)
{
    uint64_t mant;
    uint16_t se;
    memcpy(&mant, p, 8);
    memcpy(&se, p + 8, 2);
    printf("%s %04x:%016llx\n", what, se, (unsigned long long)mant);
}

/* The x87 environment's control, status and tag words (fnstenv masks every exception, so
 * fldenv puts the environment back as it was). */
static void print_env(const char *what)
{
    uint16_t env[14];
    __asm__ volatile("fnstenv %0\n\tfldenv %0" : "=m"(env));
    printf("%s fcw=%04x fsw=%04x ftw=%04x\n", what, env[0], env[2], env[4]);
}

int main(void)
{
    unsigned char a[10], b[10];
    uint16_t cw, sw;
    uint64_t mm;
    uint32_t mx, mx_after;
    const uint32_t mx_default = 0x1f80;
    double q;

    /* The initial state, kept. */
    print_env("start");
    __asm__ volatile("syscall" : : "a"(SYS_getpid) : "rcx", "r11", "memory");
    print_env("after a call");

    /* A control word of the guest's own (round toward zero, 64-bit precision), no registers in
     * use: it rules the division made after the call. */
    cw = 0x0f7f;
    __asm__ volatile("fldcw %2\n\t"
                     "syscall\n\t"
                     "fld1\n\t"
                     "fildl %3\n\t"
                     "fdivrp\n\t"
                     "fstpt %0\n\t"
                     "fnstcw %1"
                     : "=m"(a), "=m"(cw)
                     : "m"(cw), "m"((int){3}), "a"(SYS_getpid)
                     : "rcx", "r11", "memory", "st", "st(1)");
    print_ld("1/3 toward zero", a);
    printf("fcw after the call %04x\n", cw);
    __asm__ volatile("fninit");

    /* Values on the register stack across a call. */
    __asm__ volatile("fldpi\n\t"
                     "fldl2e\n\t"
                     "syscall\n\t"
                     "fstpt %0\n\t"
                     "fstpt %1"
                     : "=m"(a), "=m"(b)
                     : "a"(SYS_getpid)
                     : "rcx", "r11", "memory", "st", "st(1)");
    print_ld("log2(e)", a);
    print_ld("pi", b);
    print_env("stack popped");

    /* A sticky exception flag (a masked division by zero) across a call. */
    __asm__ volatile("fldz\n\t"
                     "fld1\n\t"
                     "fdivp\n\t"
                     "fstp %%st(0)\n\t"
                     "syscall\n\t"
                     "fnstsw %0"
                     : "=m"(sw)
                     : "a"(SYS_getpid)
                     : "rcx", "r11", "memory", "st", "st(1)");
    printf("fsw after 1/0 and a call %04x\n", sw);
    __asm__ volatile("fninit");

    /* An MMX register (the x87 state in MMX mode) across a call. */
    mm = 0x0123456789abcdefull;
    __asm__ volatile("movq %1, %%mm1\n\t"
                     "syscall\n\t"
                     "movq %%mm1, %0\n\t"
                     "emms"
                     : "=r"(mm)
                     : "r"(mm), "a"(SYS_getpid)
                     : "rcx", "r11", "memory", "mm1");
    printf("mm1 %016llx\n", (unsigned long long)mm);
    print_env("after emms");

    /* MXCSR's rounding (toward zero) across a call, used by an SSE division after it. */
    mx = 0x7f80;
    __asm__ volatile("ldmxcsr %2\n\t"
                     "syscall\n\t"
                     "cvtsi2sd %4, %%xmm0\n\t"
                     "cvtsi2sd %5, %%xmm1\n\t"
                     "divsd %%xmm1, %%xmm0\n\t"
                     "movsd %%xmm0, %0\n\t"
                     "stmxcsr %1\n\t"
                     "ldmxcsr %3"
                     : "=m"(q), "=m"(mx_after)
                     : "m"(mx), "m"(mx_default), "r"(2), "r"(3), "a"(SYS_getpid)
                     : "rcx", "r11", "memory", "xmm0", "xmm1");
    uint64_t bits;
    memcpy(&bits, &q, 8);
    printf("2/3 toward zero %016llx, mxcsr after the call %04x\n", (unsigned long long)bits,
           mx_after);

    /* The initial state again. */
    __asm__ volatile("fninit\n\tsyscall" : : "a"(SYS_getpid) : "rcx", "r11", "memory");
    print_env("end");
    return 0;
}
