/* What the CPU reports to the guest: the cpuid feature bits that glibc's ifunc resolvers read
 * (leaf 1 ecx/edx, leaf 7 ebx/ecx/edx), the XCR0 state mask, and the vector extensions gcc's
 * __builtin_cpu_supports sees. Natively this describes the host, so the output is machine
 * dependent (no expected file); under hotpath it must be identical, otherwise glibc picks
 * different string/memory variants than a native run would (and the `strings` sample would
 * not exercise the AVX2/EVEX code it is meant to). APIC ids and other per-core fields are
 * masked out. */
#include <stdio.h>
#include <cpuid.h>

int main(void)
{
    unsigned a, b, c, d, max;
    max = __get_cpuid_max(0, NULL);
    printf("max basic leaf >= 7: %d\n", max >= 7);
    __cpuid(1, a, b, c, d);
    printf("leaf 1: ecx %08x edx %08x\n", c, d & ~(1u << 9) /* APIC on-chip: virtualised */);
    int osxsave = (c >> 27) & 1;
    if (max >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        printf("leaf 7.0: ebx %08x ecx %08x edx %08x\n", b, c, d);
    }
    if (osxsave) {
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        printf("xcr0: %08x%08x\n", hi, lo);
    }
    __builtin_cpu_init();
    printf("sse4.2 %d avx %d avx2 %d fma %d bmi2 %d avx512f %d avx512bw %d avx512vl %d\n",
           !!__builtin_cpu_supports("sse4.2"), !!__builtin_cpu_supports("avx"), !!__builtin_cpu_supports("avx2"),
           !!__builtin_cpu_supports("fma"), !!__builtin_cpu_supports("bmi2"), !!__builtin_cpu_supports("avx512f"),
           !!__builtin_cpu_supports("avx512bw"), !!__builtin_cpu_supports("avx512vl"));
    return 0;
}
