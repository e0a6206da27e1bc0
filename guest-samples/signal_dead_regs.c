/* Asynchronous signals landing where hotpath's enqueue stub borrows a register the guest is
 * about to overwrite (a register that is dead at a block's entry). A spin loop keeps RBX, RCX
 * and RDX at fixed values at every instruction, while each of its blocks starts by writing one
 * of them again (so the stub may use it) or by reading another register (so it may not); an
 * interval timer interrupts it, and the SIGALRM handler checks the three registers in the
 * interrupted context. Natively they always hold their values; under hotpath a signal must
 * never be delivered at a point where the stub's use of a register could show. Only counts are
 * printed, never timing. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <ucontext.h>

/* SIGALRMs that must interrupt the loop before it stops. */
#define WANT 300

extern char spin_begin[], spin_end[];
/* Spins until *count >= want, with RBX = 0x1234, RCX = 0x5678, RDX = 0x9abc throughout. */
void spin(volatile int *count, int want);

__asm__(".text\n"
        ".globl spin\n"
        ".type spin, @function\n"
        "spin:\n"
        "    push %rbx\n"
        "    mov $0x1234, %ebx\n"
        "    mov $0x5678, %ecx\n"
        "    mov $0x9abc, %edx\n"
        "spin_begin:\n"
        "1:  mov $0x1234, %ebx\n" /* a block whose entry has RBX dead */
        "    cmp %esi, (%rdi)\n"
        "    jge 9f\n"
        "    mov $0x5678, %ecx\n" /* a block whose entry has RCX dead */
        "    mov $0x9abc, %edx\n"
        "    jmp 2f\n"
        "2:  add $1, %r8\n" /* a block with no dead register */
        "    mov $0x9abc, %edx\n"
        "    jmp 1b\n"
        "9:  pop %rbx\n"
        "    ret\n"
        "spin_end:\n"
        ".size spin, . - spin\n");

static volatile int in_loop, wrong;

static void on_alarm(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)info;
    const greg_t *g = ((ucontext_t *)ctx)->uc_mcontext.gregs;
    unsigned long rip = (unsigned long)g[REG_RIP];
    if (rip < (unsigned long)spin_begin || rip >= (unsigned long)spin_end)
        return;
    in_loop++;
    if (g[REG_RBX] != 0x1234 || g[REG_RCX] != 0x5678 || g[REG_RDX] != 0x9abc)
        wrong++;
}

int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_alarm;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 100}, {0, 100}};
    setitimer(ITIMER_REAL, &every, NULL);
    spin(&in_loop, WANT);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("%s %d signals interrupted the loop; %d saw a register the loop never holds\n",
           in_loop >= WANT ? "at least" : "only", WANT, wrong);
    return wrong != 0;
}
