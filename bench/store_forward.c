/* bench/store_forward.c — how long this CPU takes to hand a stored register back to a load of
 * the same address, by addressing mode: the round trip every register the translated code
 * borrows pays (saved to the thread area through GS, reloaded a few instructions later).
 *
 * Each loop stores RCX and loads it back, so each iteration waits for the previous one's
 * round trip: the time per iteration is the store-to-load latency (plus ~0.25 ns of loop).
 *
 *   gcc -O2 -o /tmp/store_forward bench/store_forward.c && /tmp/store_forward
 *
 * On the 2-vCPU AMD EPYC (Zen 4) VM of docs/measurements.md (tenth session): an absolute
 * address, with or without a segment (`gs:[0x40]`, hotpath's scratch slots), 1.6 ns; an
 * address through a register (`gs:[rbx + 0x40]`, also with that register zero), RIP-relative
 * or RSP-relative, 0.25 ns: the CPU forwards those at once and the absolute one late. */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* name(n): n iterations of `save; two independent adds; restore`, RBX = 0 inside. */
#define LOOP(name, save, restore)                                                          \
    extern void name(long);                                                                \
    __asm__(".globl " #name "\n" #name ":\n push %rbx\n xor %ebx, %ebx\n mov %rdi, %r8\n"  \
            "1:\n " save "\n add $1, %rax\n add $1, %rdx\n " restore "\n"                  \
            " dec %r8\n jnz 1b\n pop %rbx\n ret\n");

LOOP(none, "", "")
LOOP(gs_absolute, "mov %rcx, %gs:0x40", "mov %gs:0x40, %rcx")
LOOP(gs_absolute_store_register_load, "mov %rcx, %gs:0x40",
     "mov $0, %ecx\n mov %gs:0x40(%rcx), %rcx")
LOOP(gs_register, "mov %rcx, %gs:0x40(%rbx)", "mov %gs:0x40(%rbx), %rcx")
LOOP(rip_relative, "mov %rcx, slot(%rip)", "mov slot(%rip), %rcx")
LOOP(rsp_relative, "mov %rcx, -136(%rsp)", "mov -136(%rsp), %rcx")
__asm__(".data\nslot: .quad 0\n.text\n");

int main(void) {
    char *area = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED || syscall(SYS_arch_prctl, ARCH_SET_GS, area) != 0) {
        perror("store_forward: GS area");
        return 1;
    }
    struct {
        const char *what;
        void (*run)(long);
    } modes[] = {
        {"no round trip", none},
        {"gs:[abs] store, gs:[abs] load", gs_absolute},
        {"gs:[abs] store, gs:[reg=0 + abs] load", gs_absolute_store_register_load},
        {"gs:[rbx + disp] both", gs_register},
        {"[rip + disp] both", rip_relative},
        {"[rsp - 136] both", rsp_relative},
    };
    const long n = 200000000;
    for (unsigned m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        double best = 1e9;
        for (int round = 0; round < 3; round++) {
            double t = now();
            modes[m].run(n);
            t = now() - t;
            if (t < best)
                best = t;
        }
        printf("%-40s %.2f ns per iteration\n", modes[m].what, best / n * 1e9);
    }
    return 0;
}
