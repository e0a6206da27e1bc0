/* What a signal handler's frame shows of the FPU, SSE and AVX state when parts of it are back in
 * their initial configuration (fninit, vzeroall, vzeroupper, MXCSR reset) after they were in use
 * across a system call. Under hotpath each system call is a round trip through the dispatcher,
 * which saves the guest's state in its thread area (XSAVEOPT does not write a component in its
 * initial configuration there); the frame must still show what the kernel's would: the x87
 * registers, MXCSR, the XMM registers and the upper halves of the YMM registers as they are.
 * Each case is one asm block: the state in use, a system call, the state reset, then tgkill,
 * so nothing the compiler emits runs in between. Then what rt_sigreturn makes of a frame the
 * handler changed: a new MXCSR, an image without the software bytes' magic (the legacy region
 * alone is restored), a header byte XRSTOR ignores, and a header byte XRSTOR refuses (the kernel
 * kills the process with SIGSEGV; done in a child). Compared with the native run. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>
#include <cpuid.h>

static uint8_t frame[8192];
static volatile int delivered;
static int avx;
static unsigned avx_offset; /* of the YMM upper halves in the standard XSAVE format (bytes) */

/* What the handler does to the frame's image before it returns. */
static enum { KEEP, SET_MXCSR, DROP_MAGIC, HIGH_HEADER, BAD_HEADER } edit;

static void handler(int sig, siginfo_t *si, void *ctx)
{
    (void)sig;
    (void)si;
    uint8_t *fp = (uint8_t *)((ucontext_t *)ctx)->uc_mcontext.fpregs;
    uint32_t mx = 0x3f80; /* rounding toward -inf */
    switch (edit) {
    case KEEP:
        break;
    case SET_MXCSR:
        memcpy(fp + 24, &mx, 4);
        break;
    case DROP_MAGIC:
        memset(fp + 464, 0, 4);
        break;
    case HIGH_HEADER: /* header bytes 24..63: XRSTOR does not look at them */
        fp[512 + 60] = 1;
        break;
    case BAD_HEADER: /* header bytes 8..23 (XCOMP_BV and after) must be 0 for XRSTOR */
        fp[512 + 12] = 1;
        break;
    }
    uint32_t size;
    memcpy(&size, fp + 480, 4); /* sw_reserved.xstate_size */
    if (size > sizeof frame || size < 576)
        size = 512;
    memcpy(frame, fp, size);
    delivered = 1;
}

static const uint8_t pattern[32] __attribute__((aligned(32))) = {
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
};

static void hex(const char *what, const uint8_t *p, int n)
{
    printf(" %s=", what);
    for (int i = n - 1; i >= 0; i--)
        printf("%02x", p[i]);
}

/* The frame's legacy region, as a handler that does not look at XSTATE_BV reads it, and the
 * YMM upper halves where XSTATE_BV says they are in use. */
static void show(const char *what)
{
    uint16_t fcw, fsw;
    uint32_t mxcsr;
    uint64_t bv;
    if (!delivered) {
        printf("%s: no signal\n", what);
        return;
    }
    delivered = 0;
    memcpy(&fcw, frame, 2);
    memcpy(&fsw, frame + 2, 2);
    memcpy(&mxcsr, frame + 24, 4);
    memcpy(&bv, frame + 512, 8);
    printf("%s: fcw=%04x fsw=%04x ftw=%02x mxcsr=%08x", what, fcw, fsw, frame[4], mxcsr);
    hex("st0", frame + 32, 10);
    hex("st1", frame + 48, 10);
    printf("\n   ");
    hex("xmm0", frame + 160, 16);
    hex("xmm7", frame + 160 + 7 * 16, 16);
    hex("xmm15", frame + 160 + 15 * 16, 16);
    printf("\n    bv.fp=%d bv.sse=%d", (int)(bv & 1), (int)(bv >> 1 & 1));
    if (avx) {
        printf(" bv.avx=%d", (int)(bv >> 2 & 1));
        if (bv >> 2 & 1) {
            hex("ymm0.hi", frame + avx_offset, 16);
            hex("ymm1.hi", frame + avx_offset + 16, 16);
        }
    }
    printf("\n");
}

#define SET_XMM(r) "movdqa %[pat], %%" r "\n\t"
#define ZERO_XMM(r) "pxor %%" r ", %%" r "\n\t"
#define ALL(M) M("xmm0") M("xmm1") M("xmm2") M("xmm3") M("xmm4") M("xmm5") M("xmm6") \
    M("xmm7") M("xmm8") M("xmm9") M("xmm10") M("xmm11") M("xmm12") M("xmm13") M("xmm14") \
    M("xmm15")
#define XMM_CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", \
    "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"
/* A system call the dispatcher sees (getpid), then `reset`, then tgkill(pid, tid, SIGUSR1). */
#define CASE(use, reset)                                                                      \
    do {                                                                                      \
        long ax;                                                                              \
        __asm__ volatile(use "mov $39, %%eax\n\tsyscall\n\t" reset                            \
                         "mov $234, %%eax\n\tsyscall"                                         \
                         : "=a"(ax)                                                           \
                         : "D"(pid), "S"(tid), "d"(SIGUSR1), [pat] "m"(pattern),              \
                           [mx_a] "m"(mx_a), [mx_b] "m"(mx_b)                                 \
                         : "rcx", "r11", "memory", XMM_CLOBBERS);                             \
    } while (0)

int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGUSR1, &sa, NULL);
    long pid = getpid(), tid = syscall(SYS_gettid);
    unsigned a, b, c, d;
    __cpuid(1, a, b, c, d);
    /* AVX, and the OS saving it (OSXSAVE; XCR0's SSE and AVX bits). */
    if ((c & (1u << 28)) && (c & (1u << 27))) {
        uint32_t lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        avx = (lo & 6) == 6;
    }
    if (avx) {
        __cpuid_count(0xd, 2, a, b, c, d);
        avx_offset = b;
    }
    printf("avx=%d\n", avx);
    uint32_t mx_a = 0x1f80, mx_b = 0x5f80; /* default; rounding toward +inf */

    CASE(ALL(SET_XMM), ALL(ZERO_XMM));
    show("xmm in use, then zeroed");

    CASE("ldmxcsr %[mx_b]\n\t", "ldmxcsr %[mx_a]\n\t" ALL(ZERO_XMM));
    show("mxcsr changed, then default, xmm zero");

    CASE(ALL(SET_XMM) "ldmxcsr %[mx_a]\n\t", ALL(ZERO_XMM) "ldmxcsr %[mx_b]\n\t");
    show("xmm zeroed, mxcsr changed");
    __asm__ volatile("ldmxcsr %0" : : "m"(mx_a));

    {
        long ax;
        __asm__ volatile("fld1\n\tfldpi\n\tmov $39, %%eax\n\tsyscall\n\t"
                         "fninit\n\tmov $234, %%eax\n\tsyscall"
                         : "=a"(ax)
                         : "D"(pid), "S"(tid), "d"(SIGUSR1)
                         : "rcx", "r11", "memory", "st", "st(1)");
    }
    show("x87 in use, then fninit");

    {
        long ax;
        __asm__ volatile("fld1\n\tfldpi\n\tmov $234, %%eax\n\tsyscall\n\t"
                         "fstp %%st(0)\n\tfstp %%st(0)"
                         : "=a"(ax)
                         : "D"(pid), "S"(tid), "d"(SIGUSR1)
                         : "rcx", "r11", "memory", "st", "st(1)");
    }
    show("x87 in use");

    if (avx) {
        CASE("vmovdqa %[pat], %%ymm0\n\tvmovdqa %[pat], %%ymm1\n\t", "vzeroupper\n\t");
        show("ymm in use, then vzeroupper");
        CASE("vmovdqa %[pat], %%ymm0\n\t", "vzeroall\n\t");
        show("ymm in use, then vzeroall");
        CASE("vzeroall\n\t", "vmovdqa %[pat], %%ymm1\n\t");
        show("ymm zero, then in use");
        __asm__ volatile("vzeroupper" ::: "memory");
    }

    /* rt_sigreturn restores what the handler left in the frame. */
    uint32_t mx;
    edit = SET_MXCSR;
    CASE("", "");
    __asm__ volatile("stmxcsr %0" : "=m"(mx));
    __asm__ volatile("ldmxcsr %0" : : "m"(mx_a));
    printf("mxcsr set by the handler: %08x\n", mx);
    if (avx) {
        uint8_t upper[32] __attribute__((aligned(32)));
        edit = DROP_MAGIC;
        /* ymm1's upper half in use when the signal comes; the frame without its magic restores
         * the legacy region alone, and the upper halves start from zero. */
        long ax;
        __asm__ volatile("vmovdqa %[pat], %%ymm1\n\tmov $234, %%eax\n\tsyscall\n\t"
                         "vmovdqa %%ymm1, %[out]\n\tvzeroupper"
                         : "=a"(ax), [out] "=m"(upper)
                         : "D"(pid), "S"(tid), "d"(SIGUSR1), [pat] "m"(pattern)
                         : "rcx", "r11", "memory", "xmm1");
        hex("frame without magic: ymm1", upper, 32);
        printf("\n");
    }
    edit = HIGH_HEADER;
    CASE("", "");
    printf("header byte 60 set: restored\n");
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        edit = BAD_HEADER;
        pid = getpid();
        tid = syscall(SYS_gettid);
        CASE("", "");
        printf("header byte 12 set: restored\n");
        return 0;
    }
    int status;
    waitpid(child, &status, 0);
    if (WIFSIGNALED(status))
        printf("header byte 12 set: killed by signal %d\n", WTERMSIG(status));
    else
        printf("header byte 12 set: exit %d\n", WEXITSTATUS(status));
    return 0;
}
