/* EFLAGS.AC (alignment checking) set by the guest around code whose own accesses are all
 * aligned: a direct call and return, a call through a pointer, a conditional branch, a system
 * call and cpuid, each between a popf that sets AC and one that clears it (the JVM's CPU
 * probe sets AC this way). Natively nothing faults; translated code runs with the guest's
 * flags, so every load hotpath's own code makes there (a 64-bit return address pushed from a
 * literal, a veneer's jump through one) must be aligned too. Prints how many of each ran. */
#include <stdio.h>
#include <stdlib.h>

#define SET_AC "pushfq\n\tpop %%rax\n\tor $0x40000, %%rax\n\tpush %%rax\n\tpopfq\n\t"
#define CLR_AC "pushfq\n\tpop %%rax\n\tand $~0x40000, %%rax\n\tpush %%rax\n\tpopfq\n\t"

__attribute__((noinline)) long plus_one(long x) { return x + 1; }
long (*volatile through)(long) = plus_one;

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 4000;
    long calls = 0, indirect = 0, branches = 0, syscalls = 0, cpuids = 0;
    for (long i = 0; i < n; i++) {
        long r;
        __asm__ volatile(SET_AC "mov %1, %%rdi\n\tcall plus_one\n\tmov %%rax, %%rdx\n\t" CLR_AC
                         : "=&d"(r) : "r"(i)
                         : "rax", "rdi", "rsi", "rcx", "r8", "r9", "r10", "r11", "cc", "memory");
        calls += r == i + 1;
        __asm__ volatile(SET_AC "mov %1, %%rdi\n\tcall *%2\n\tmov %%rax, %%rdx\n\t" CLR_AC
                         : "=&d"(r) : "r"(i), "m"(through)
                         : "rax", "rdi", "rsi", "rcx", "r8", "r9", "r10", "r11", "cc", "memory");
        indirect += r == i + 1;
        __asm__ volatile(SET_AC "mov %1, %%rdx\n\ttest $1, %%dl\n\tjne 1f\n\tadd $2, %%rdx\n"
                         "1:\t" CLR_AC
                         : "=&d"(r) : "r"(i) : "rax", "cc", "memory");
        branches += r == (i & 1 ? i : i + 2);
        __asm__ volatile(SET_AC "mov $39, %%eax\n\tsyscall\n\tmov %%rax, %%rdx\n\t" CLR_AC
                         : "=&d"(r) : : "rax", "rcx", "r11", "cc", "memory");
        syscalls += r > 0;
        __asm__ volatile(SET_AC "xor %%eax, %%eax\n\tpush %%rbx\n\tcpuid\n\tpop %%rbx\n\t"
                         "mov %%rax, %%rdx\n\t" CLR_AC
                         : "=&d"(r) : : "rax", "rcx", "cc", "memory");
        cpuids += r > 0;
    }
    printf("calls %ld, through a pointer %ld, branches %ld, syscalls %ld, cpuid %ld of %ld\n",
           calls, indirect, branches, syscalls, cpuids, n);
    return 0;
}
