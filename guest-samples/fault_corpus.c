/* A corpus of faulting and special instructions, run one case at a time; for each case one
 * line says what the program's signal handler saw, so a native run and a run under hotpath
 * can be compared field by field (tests/tests/faults.rs).
 *
 * A case is a few bytes of code copied to its own page of a fixed executable region and
 * entered with every general register set to a known value and RSP on a scratch stack. The
 * rest of the page is int3, so a case that does not fault ends in SIGTRAP. The handler (on
 * an alternate stack) prints the signal, si_code, si_addr and RIP relative to the case's
 * first byte, the trap number, error code and cr2 of the ucontext, the RF/TF/AC and
 * arithmetic flags, every general register, MXCSR and a checksum of the scratch data, then
 * goes back to the driver with siglongjmp.
 *
 * The built-in cases are the asm snippets below (faults, traps, special instructions); more
 * come from the file named by the first argument, one `name hexbytes` per line (the test
 * writes a deterministic set of random instruction sequences there). A second argument runs
 * only the case of that name, or with a leading `-` every case but those it lists
 * (comma-separated). Every address the cases use is fixed, so the output does not
 * depend on where the program or its stack is loaded. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "common.h"

#define PAGE 4096UL
/* One page per case, then the pages for instructions that straddle a mapping's end. */
#define CODE 0x500000000000UL
#define MAX_CASES 1024
/* Scratch data the pointer registers point into (64 KiB, registers at its middle). */
#define SCRATCH 0x500100000000UL
#define SCRATCH_SIZE 0x10000UL
/* The stack cases run on (64 KiB, RSP at its middle). */
#define STACK 0x500200000000UL
#define STACK_SIZE 0x10000UL
/* A read-only page, a PROT_NONE page, a hole and a readable, writable, not executable page. */
#define SPECIAL 0x500300000000UL
#define RO_PAGE (SPECIAL)
#define NONE_PAGE (SPECIAL + PAGE)
#define HOLE_PAGE (SPECIAL + 2 * PAGE)
#define NX_PAGE (SPECIAL + 3 * PAGE)

/* Where a case's bytes go in its page. */
enum placement {
    AT_START,        /* at the page's start */
    END_UNMAPPED,    /* ending at the last byte of a page followed by a hole */
    STRADDLE_HOLE,   /* the last instruction's first byte is the page's last, a hole follows */
    STRADDLE_NONE,   /* the same, a PROT_NONE page follows */
};

struct code_case {
    const char *name;
    const unsigned char *bytes;
    size_t len;
    enum placement place;
};

/* Each snippet lives in .rodata between case_NAME_start and case_NAME_end; it is copied, never
 * run in place, so it must not refer to itself by absolute address. */
#define SNIPPET(name, body)                                                                    \
    __asm__(".pushsection .rodata.fault_cases,\"a\"\n"                                         \
            ".globl case_" #name "_start\n"                                                    \
            "case_" #name "_start:\n" body "\n"                                                \
            ".globl case_" #name "_end\n"                                                      \
            "case_" #name "_end:\n"                                                            \
            ".popsection\n");                                                                  \
    extern const unsigned char case_##name##_start[], case_##name##_end[];

/* Completing normally: the int3 after it. */
SNIPPET(nothing, "nop")
/* Integer divide errors (#DE): FPE_INTDIV at the div. */
SNIPPET(div_zero, "xor %ecx, %ecx\n mov $1, %eax\n cltd\n div %ecx")
SNIPPET(idiv_overflow, "mov $0x8000000000000000, %rax\n cqto\n mov $-1, %rcx\n idiv %rcx")
SNIPPET(div8_zero, "xor %ecx, %ecx\n mov $7, %eax\n divb %cl")
/* SSE divide by zero with the exception unmasked (#XM). */
SNIPPET(divss_unmasked,
        "movl $0x1d80, -8(%rsp)\n ldmxcsr -8(%rsp)\n xorps %xmm1, %xmm1\n mov $1, %eax\n"
        " cvtsi2ss %eax, %xmm0\n divss %xmm1, %xmm0")
SNIPPET(divss_masked, "xorps %xmm1, %xmm1\n mov $1, %eax\n cvtsi2ss %eax, %xmm0\n"
                      " divss %xmm1, %xmm0\n movd %xmm0, %eax")
/* x87 divide by zero unmasked: #MF at the next waiting x87 instruction. */
SNIPPET(x87_unmasked, "fninit\n movw $0x37b, -8(%rsp)\n fldcw -8(%rsp)\n fld1\n fldz\n"
                      " fdivrp\n nop\n fwait")
/* Traps and special interrupts. */
SNIPPET(int3, "mov $5, %eax\n int3\n mov $6, %eax")
SNIPPET(int_3_long, "mov $5, %eax\n int $3\n mov $6, %eax")
SNIPPET(icebp, "mov $5, %eax\n .byte 0xf1\n mov $6, %eax")
SNIPPET(int_4, "mov $5, %eax\n int $4\n mov $6, %eax")
SNIPPET(int_0x21, "int $0x21")
SNIPPET(into, ".byte 0xce")
SNIPPET(ud2, "ud2")
SNIPPET(hlt, "hlt")
SNIPPET(in_dx, "in %dx, %al")
SNIPPET(cli, "cli")
/* System instructions: #GP(0) in user mode on every x86-64 CPU (SIGSEGV, SI_KERNEL, trap 13). */
SNIPPET(swapgs, "mov $5, %eax\n swapgs")
SNIPPET(sysretq, "mov $5, %eax\n sysretq")
SNIPPET(sysretl, "mov $5, %eax\n sysretl")
SNIPPET(sysexit, "mov $5, %eax\n .byte 0x0f, 0x35")
SNIPPET(bad_opcode, ".byte 0x06")
/* Page faults: read, write, fetch; unmapped, PROT_NONE, read-only, not executable. */
SNIPPET(read_hole, "mov $0x500300002010, %rax\n mov (%rax), %rbx")
SNIPPET(write_hole, "mov $0x500300002010, %rax\n movl $1, (%rax)")
SNIPPET(read_none, "mov $0x500300001010, %rax\n mov (%rax), %rbx")
SNIPPET(write_none, "mov $0x500300001010, %rax\n movl $1, (%rax)")
SNIPPET(read_ro, "mov $0x500300000010, %rax\n mov (%rax), %rbx")
SNIPPET(write_ro, "mov $0x500300000010, %rax\n movl $1, (%rax)")
/* A signal that is not a fault (kill(0, SIGUSR1): main makes the program its own group)
 * right after a page fault: its frame shows the last fault's trap number, error code and CR2,
 * as the kernel keeps them per thread. */
SNIPPET(async_signal, "xor %edi, %edi\n mov $10, %esi\n mov $62, %eax\n syscall")
SNIPPET(rmw_ro, "mov $0x500300000010, %rax\n addl $1, (%rax)")
SNIPPET(push_ro, "mov $0x500300000010, %rsp\n push %rax")
SNIPPET(jump_nx, "mov $0x500300003010, %rax\n jmp *%rax")
SNIPPET(call_hole, "mov $0x500300002010, %rax\n call *%rax")
SNIPPET(jump_none, "mov $0x500300001010, %rax\n jmp *%rax")
SNIPPET(read_null, "xor %eax, %eax\n mov 8(%rax), %rbx")
SNIPPET(read_kernel, "mov $0xffffffff81000000, %rax\n mov (%rax), %rbx")
/* Non-canonical addresses: #GP, SIGSEGV with SI_KERNEL. */
SNIPPET(read_noncanon, "mov $0x8000000000000000, %rax\n mov (%rax), %rbx")
SNIPPET(jmp_noncanon, "mov $0x8000000000000000, %rax\n jmp *%rax")
SNIPPET(call_noncanon, "mov $0x8000000000000000, %rax\n call *%rax")
/* The same with RSP in the scratch area: the word below it stays as it was (no push). */
SNIPPET(call_noncanon_scratch, "mov %rbx, %rsp\n mov $0x8000000000000000, %rax\n call *%rax")
SNIPPET(ret_noncanon, "mov $0x8000000000000000, %rax\n push %rax\n ret")
SNIPPET(jmp_noncanon_low, "mov $0x0000800000000000, %rax\n jmp *%rax")
/* Alignment check: EFLAGS.AC set, a misaligned load. */
SNIPPET(align_check, "pushfq\n orl $0x40000, (%rsp)\n popfq\n mov 1(%rsp), %rax")
/* Single-stepping with EFLAGS.TF: SIGTRAP after each instruction. */
SNIPPET(trap_flag, "pushfq\n orl $0x100, (%rsp)\n popfq\n mov $1, %eax\n mov $2, %eax")
/* Stepping through a loop, an indirect call and its return, pushf, a system call
 * (sched_yield) and the popf that clears TF: the handler of a `step_` case records each
 * SIGTRAP's RIP and returns, so the kernel steps on. */
SNIPPET(step_walk, "pushfq\n orl $0x100, (%rsp)\n popfq\n mov $3, %ecx\n"
                   "1: dec %ecx\n jnz 1b\n lea 2f(%rip), %rax\n call *%rax\n"
                   " pushfq\n pop %rbx\n mov $24, %eax\n syscall\n"
                   " pushfq\n andl $~0x100, (%rsp)\n popfq\n nop\n jmp 3f\n"
                   "2: ret\n"
                   "3: nop")
/* The vsyscall page (0xffffffffff600000): gettimeofday(NULL, NULL), time(NULL), getcpu. */
SNIPPET(vsyscall_gtod, "xor %edi, %edi\n xor %esi, %esi\n mov $0xffffffffff600000, %rax\n"
                       " call *%rax")
SNIPPET(vsyscall_time, "xor %edi, %edi\n mov $0xffffffffff600400, %rax\n call *%rax\n"
                       " cmp $1000000000, %rax\n seta %al\n movzbl %al, %eax\n test %eax, %eax")
SNIPPET(vsyscall_getcpu, "xor %edi, %edi\n xor %esi, %esi\n xor %edx, %edx\n"
                         " mov $0xffffffffff600800, %rax\n call *%rax")
SNIPPET(vsyscall_middle, "mov $0xffffffffff600100, %rax\n call *%rax")
SNIPPET(vsyscall_read, "mov $0xffffffffff600000, %rax\n mov (%rax), %rbx")
/* Special instructions. */
SNIPPET(monitor, "lea -64(%rsp), %rax\n xor %ecx, %ecx\n xor %edx, %edx\n monitor")
SNIPPET(mwait, "xor %eax, %eax\n xor %ecx, %ecx\n mwait")
SNIPPET(xbegin, "mov $7, %eax\n xbegin 1f\n mov $8, %eax\n xend\n1: nop")
SNIPPET(xabort, "xabort $1")
SNIPPET(xend, "xend")
SNIPPET(xtest, "xtest")
SNIPPET(rdpkru, "xor %ecx, %ecx\n rdpkru")
SNIPPET(wrpkru_key0_wd, "mov $2, %eax\n xor %ecx, %ecx\n xor %edx, %edx\n wrpkru")
SNIPPET(uretprobe_syscall, "mov $335, %eax\n syscall")
/* The 32-bit system call gate, from 64-bit code, with no valid call number. */
SNIPPET(int_0x80, "mov $-1, %eax\n int $0x80")
/* Far transfers to the 64-bit user code segment (0x33), iretq. */
SNIPPET(lret, "lea 1f(%rip), %rax\n push $0x33\n push %rax\n lretq\n ud2\n1: mov $9, %ebx")
SNIPPET(ljmp_mem, "lea 1f(%rip), %rax\n mov %rax, -16(%rsp)\n movw $0x33, -8(%rsp)\n"
                  " rex64 ljmp *-16(%rsp)\n ud2\n1: mov $9, %ebx")
SNIPPET(lcall_mem, "lea 1f(%rip), %rax\n mov %rax, -16(%rsp)\n movw $0x33, -8(%rsp)\n"
                   " rex64 lcall *-16(%rsp)\n ud2\n1: mov (%rsp), %rbx\n mov 8(%rsp), %rcx")
SNIPPET(iretq, "lea 1f(%rip), %rax\n mov %rsp, %rbx\n push $0x2b\n push %rbx\n pushfq\n"
               " push $0x33\n push %rax\n iretq\n ud2\n1: mov $9, %ecx")
SNIPPET(lret_bad_cs, "lea 1f(%rip), %rax\n push $0x63\n push %rax\n lretq\n1: nop")
/* GS-relative accesses: the guest's GS base is 0. */
SNIPPET(gs_load_abs, "mov %gs:0x10, %rax")
SNIPPET(gs_load_reg, "mov %gs:8(%rbx), %rax")
SNIPPET(gs_store_reg, "mov %rcx, %gs:16(%rbx)\n mov 16(%rbx), %rax")
SNIPPET(gs_rdgsbase, "rdgsbase %rax")
SNIPPET(gs_mov_from_sreg, "mov %gs, %eax")
SNIPPET(gs_push, "push %gs\n pop %rax")
/* A REX byte before the gs prefix (ignored: it is not next to the opcode). */
SNIPPET(gs_after_rex, ".byte 0x42, 0x65, 0x29, 0x23")
SNIPPET(gs_string, "movsq %gs:(%rsi), %es:(%rdi)\n cmpsb %es:(%rdi), %gs:(%rsi)")
SNIPPET(gs_mov_to_sreg, "xor %eax, %eax\n mov %eax, %gs")
SNIPPET(gs_wrgsbase, "xor %eax, %eax\n wrgsbase %rax")
SNIPPET(gs_mov_to_sreg_user, "mov $0x2b, %eax\n mov %eax, %gs")
SNIPPET(gs_wrgsbase_nonzero, "mov $0x500100008000, %rax\n wrgsbase %rax")
/* Instructions at the very end of a mapping. */
SNIPPET(end_of_mapping, "nop\n nop")
SNIPPET(straddle_hole, "nop\n mov %ebx, %eax")
SNIPPET(straddle_none, "nop\n mov %ebx, %eax")

#define CASE(name, place) {#name, case_##name##_start, 0, place}

static struct code_case builtin[] = {
    CASE(nothing, AT_START),
    CASE(div_zero, AT_START),
    CASE(idiv_overflow, AT_START),
    CASE(div8_zero, AT_START),
    CASE(divss_unmasked, AT_START),
    CASE(divss_masked, AT_START),
    CASE(x87_unmasked, AT_START),
    CASE(int3, AT_START),
    CASE(int_3_long, AT_START),
    CASE(icebp, AT_START),
    CASE(int_4, AT_START),
    CASE(int_0x21, AT_START),
    CASE(into, AT_START),
    CASE(ud2, AT_START),
    CASE(hlt, AT_START),
    CASE(in_dx, AT_START),
    CASE(cli, AT_START),
    CASE(swapgs, AT_START),
    CASE(sysretq, AT_START),
    CASE(sysretl, AT_START),
    CASE(sysexit, AT_START),
    CASE(bad_opcode, AT_START),
    CASE(read_hole, AT_START),
    CASE(write_hole, AT_START),
    CASE(read_none, AT_START),
    CASE(write_none, AT_START),
    CASE(read_ro, AT_START),
    CASE(write_ro, AT_START),
    CASE(async_signal, AT_START),
    CASE(rmw_ro, AT_START),
    CASE(push_ro, AT_START),
    CASE(jump_nx, AT_START),
    CASE(call_hole, AT_START),
    CASE(jump_none, AT_START),
    CASE(read_null, AT_START),
    CASE(read_kernel, AT_START),
    CASE(read_noncanon, AT_START),
    CASE(jmp_noncanon, AT_START),
    CASE(call_noncanon, AT_START),
    CASE(call_noncanon_scratch, AT_START),
    CASE(ret_noncanon, AT_START),
    CASE(jmp_noncanon_low, AT_START),
    CASE(align_check, AT_START),
    CASE(trap_flag, AT_START),
    CASE(step_walk, AT_START),
    CASE(vsyscall_gtod, AT_START),
    CASE(vsyscall_time, AT_START),
    CASE(vsyscall_getcpu, AT_START),
    CASE(vsyscall_middle, AT_START),
    CASE(vsyscall_read, AT_START),
    CASE(monitor, AT_START),
    CASE(mwait, AT_START),
    CASE(xbegin, AT_START),
    CASE(xabort, AT_START),
    CASE(xend, AT_START),
    CASE(xtest, AT_START),
    CASE(rdpkru, AT_START),
    CASE(wrpkru_key0_wd, AT_START),
    CASE(uretprobe_syscall, AT_START),
    CASE(int_0x80, AT_START),
    CASE(lret, AT_START),
    CASE(ljmp_mem, AT_START),
    CASE(lcall_mem, AT_START),
    CASE(iretq, AT_START),
    CASE(lret_bad_cs, AT_START),
    CASE(gs_load_abs, AT_START),
    CASE(gs_load_reg, AT_START),
    CASE(gs_store_reg, AT_START),
    CASE(gs_rdgsbase, AT_START),
    CASE(gs_mov_from_sreg, AT_START),
    CASE(gs_push, AT_START),
    CASE(gs_after_rex, AT_START),
    CASE(gs_string, AT_START),
    CASE(gs_mov_to_sreg, AT_START),
    CASE(gs_wrgsbase, AT_START),
    CASE(gs_mov_to_sreg_user, AT_START),
    CASE(gs_wrgsbase_nonzero, AT_START),
    CASE(end_of_mapping, END_UNMAPPED),
    CASE(straddle_hole, STRADDLE_HOLE),
    CASE(straddle_none, STRADDLE_NONE),
};
#define NBUILTIN (sizeof builtin / sizeof builtin[0])

static const unsigned char *const builtin_ends[] = {
    case_nothing_end, case_div_zero_end, case_idiv_overflow_end, case_div8_zero_end,
    case_divss_unmasked_end, case_divss_masked_end, case_x87_unmasked_end, case_int3_end,
    case_int_3_long_end, case_icebp_end, case_int_4_end, case_int_0x21_end, case_into_end,
    case_ud2_end, case_hlt_end, case_in_dx_end, case_cli_end, case_swapgs_end, case_sysretq_end, case_sysretl_end,
    case_sysexit_end, case_bad_opcode_end,
    case_read_hole_end, case_write_hole_end, case_read_none_end, case_write_none_end,
    case_read_ro_end, case_write_ro_end, case_async_signal_end, case_rmw_ro_end, case_push_ro_end, case_jump_nx_end,
    case_call_hole_end, case_jump_none_end, case_read_null_end, case_read_kernel_end,
    case_read_noncanon_end, case_jmp_noncanon_end, case_call_noncanon_end,
    case_call_noncanon_scratch_end,
    case_ret_noncanon_end, case_jmp_noncanon_low_end, case_align_check_end,
    case_trap_flag_end, case_step_walk_end, case_vsyscall_gtod_end, case_vsyscall_time_end,
    case_vsyscall_getcpu_end, case_vsyscall_middle_end, case_vsyscall_read_end,
    case_monitor_end, case_mwait_end, case_xbegin_end, case_xabort_end, case_xend_end,
    case_xtest_end, case_rdpkru_end, case_wrpkru_key0_wd_end, case_uretprobe_syscall_end, case_int_0x80_end,
    case_lret_end, case_ljmp_mem_end, case_lcall_mem_end, case_iretq_end,
    case_lret_bad_cs_end, case_gs_load_abs_end, case_gs_load_reg_end, case_gs_store_reg_end,
    case_gs_rdgsbase_end, case_gs_mov_from_sreg_end, case_gs_push_end, case_gs_after_rex_end, case_gs_string_end, case_gs_mov_to_sreg_end,
    case_gs_wrgsbase_end, case_gs_mov_to_sreg_user_end, case_gs_wrgsbase_nonzero_end, case_end_of_mapping_end,
    case_straddle_hole_end, case_straddle_none_end,
};
_Static_assert(sizeof builtin_ends / sizeof builtin_ends[0] == NBUILTIN, "one end per case");

static struct code_case cases[MAX_CASES];
static size_t ncases;

/* The case running now: its name and where its first byte is. */
static const char *current_name;
static uint64_t current_base;
static sigjmp_buf back;
/* The driver's stack pointer while a case runs (restored by siglongjmp anyway). */
uint64_t fault_corpus_saved_rsp;

/* The register values every case starts with (rax, rbx, rcx, rdx, rsi, rdi, rbp, r8..r15). */
static const uint64_t start_regs[15] = {
    0x1111111111111111, SCRATCH + 0x8000, 4, 3, SCRATCH + 0x8100, SCRATCH + 0x7f00,
    SCRATCH + 0x8200, 0x8888888888888888, SCRATCH + 0x8300, 0xa, 0x7fffffff,
    0xcccccccccccccccc, SCRATCH + 0x7e00, 0xeeeeeeeeeeeeeeee, 0xffffffffffffffff,
};

/* Enters the case at `entry` with the start registers and RSP in the middle of STACK; never
 * returns (the case ends in a signal, whose handler goes back with siglongjmp). */
__attribute__((noreturn)) void fault_corpus_enter(uint64_t entry, const uint64_t *regs);
__asm__(".text\n"
        ".globl fault_corpus_enter\n"
        "fault_corpus_enter:\n"
        "    mov %rsp, fault_corpus_saved_rsp(%rip)\n"
        "    mov $0x500200008000, %rsp\n"
        "    push %rdi\n"
        "    mov %rsi, %r15\n"
        "    mov 0(%r15), %rax\n"
        "    mov 8(%r15), %rbx\n"
        "    mov 16(%r15), %rcx\n"
        "    mov 24(%r15), %rdx\n"
        "    mov 32(%r15), %rsi\n"
        "    mov 40(%r15), %rdi\n"
        "    mov 48(%r15), %rbp\n"
        "    mov 56(%r15), %r8\n"
        "    mov 64(%r15), %r9\n"
        "    mov 72(%r15), %r10\n"
        "    mov 80(%r15), %r11\n"
        "    mov 88(%r15), %r12\n"
        "    mov 96(%r15), %r13\n"
        "    mov 104(%r15), %r14\n"
        "    mov 112(%r15), %r15\n"
        "    push $0x202\n"
        "    popfq\n"
        "    ret\n");

/* An address as printed: relative to the case's base when near it, else absolute. */
static void put_addr(char *out, size_t n, uint64_t a)
{
    int64_t d = (int64_t)(a - current_base);
    if (d > -0x10000 && d < 0x10000)
        snprintf(out, n, "%s0x%llx", d < 0 ? "-" : "+", (unsigned long long)(d < 0 ? -d : d));
    else
        snprintf(out, n, "0x%llx", (unsigned long long)a);
}

/* The RIPs (relative) of the single-step traps of a `step_` case, as text. */
static char steps[4096];
static size_t steps_len;

static void on_signal(int sig, siginfo_t *info, void *ucv)
{
    /* The kernel leaves EFLAGS.AC as the case set it: clear it before any misaligned access. */
    __asm__ volatile("pushfq\n andl $~0x40000, (%%rsp)\n popfq" ::: "memory", "cc");
    ucontext_t *uc = ucv;
    greg_t *g = uc->uc_mcontext.gregs;
    char addr[40], rip[40], cr2[40];
    if (sig == SIGTRAP && info->si_code == TRAP_TRACE && strncmp(current_name, "step_", 5) == 0) {
        put_addr(rip, sizeof rip, (uint64_t)g[REG_RIP]);
        if (steps_len < sizeof steps - 64)
            steps_len += snprintf(steps + steps_len, sizeof steps - steps_len, "%s%s",
                                  steps_len ? "," : " steps=", rip);
        return;
    }
    /* A signal sent by a process carries its pid and uid where a fault has si_addr. */
    if (info->si_code <= 0)
        snprintf(addr, sizeof addr, "-");
    else
        put_addr(addr, sizeof addr, (uint64_t)info->si_addr);
    put_addr(rip, sizeof rip, (uint64_t)g[REG_RIP]);
    /* cr2 is the fault address of a page fault; for other traps it is stale. */
    if (g[REG_TRAPNO] == 14)
        put_addr(cr2, sizeof cr2, (uint64_t)g[REG_CR2]);
    else
        snprintf(cr2, sizeof cr2, "-");
    uint64_t efl = (uint64_t)g[REG_EFL];
    uint32_t mxcsr = uc->uc_mcontext.fpregs ? uc->uc_mcontext.fpregs->mxcsr : 0;
    uint64_t xmm0 = 0;
    char fip[40] = "-";
    if (uc->uc_mcontext.fpregs) {
        memcpy(&xmm0, &uc->uc_mcontext.fpregs->_xmm[0], 8);
        /* The last x87 instruction's address, when the x87 state is saved (XSTATE_BV bit 0
         * in the XSAVE header after the 512-byte legacy region). */
        uint64_t xstate_bv;
        memcpy(&xstate_bv, (const char *)uc->uc_mcontext.fpregs + 512, 8);
        if (xstate_bv & 1)
            put_addr(fip, sizeof fip, uc->uc_mcontext.fpregs->rip);
    }
    uint64_t data = fnv_bytes(FNV_OFFSET, (const void *)SCRATCH, SCRATCH_SIZE);
    static const int order[16] = {REG_RAX, REG_RBX, REG_RCX, REG_RDX, REG_RSI, REG_RDI,
                                  REG_RBP, REG_RSP, REG_R8,  REG_R9,  REG_R10, REG_R11,
                                  REG_R12, REG_R13, REG_R14, REG_R15};
    static const char *const names[16] = {"rax", "rbx", "rcx", "rdx", "rsi", "rdi",
                                          "rbp", "rsp", "r8",  "r9",  "r10", "r11",
                                          "r12", "r13", "r14", "r15"};
    char regs[16 * 32];
    size_t at = 0;
    for (int i = 0; i < 16; i++)
        at += snprintf(regs + at, sizeof regs - at, " %s=%llx", names[i],
                       (unsigned long long)g[order[i]]);
    dprintf(1,
            "%s: sig=%d code=%d addr=%s rip=%s trapno=%lld err=%#llx cr2=%s rf=%d tf=%d ac=%d "
            "flags=%#llx mxcsr=%#x fip=%s xmm0=%llx data=%016llx%s%s\n",
            current_name, sig, info->si_code, addr, rip, (long long)g[REG_TRAPNO],
            (unsigned long long)g[REG_ERR], cr2, (int)(efl >> 16) & 1, (int)(efl >> 8) & 1,
            (int)(efl >> 18) & 1, (unsigned long long)(efl & 0x8d5), mxcsr, fip,
            (unsigned long long)xmm0, (unsigned long long)data, regs, steps);
    steps_len = 0;
    steps[0] = 0;
    siglongjmp(back, 1);
}

static void *map_fixed(uint64_t addr, size_t len, int prot)
{
    void *p = mmap((void *)addr, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                   -1, 0);
    if (p != (void *)addr) {
        perror("mmap");
        exit(2);
    }
    return p;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Reads `name hexbytes` lines into `cases` after the built-in ones. */
static void read_cases(const char *file)
{
    FILE *f = fopen(file, "r");
    if (!f) {
        perror(file);
        exit(2);
    }
    char line[1024];
    while (fgets(line, sizeof line, f) && ncases < MAX_CASES) {
        char *sp = strchr(line, ' ');
        if (!sp)
            continue;
        *sp = 0;
        unsigned char *bytes = malloc(strlen(sp + 1) / 2 + 1);
        size_t n = 0;
        for (char *h = sp + 1; hexval(h[0]) >= 0 && hexval(h[1]) >= 0; h += 2)
            bytes[n++] = (unsigned char)(hexval(h[0]) * 16 + hexval(h[1]));
        cases[ncases++] = (struct code_case){strdup(line), bytes, n, AT_START};
    }
    fclose(f);
}

/* Whether the case `name` runs: `only` is a case name, or `-` and a comma-separated list of
 * cases to skip. */
static int selected(const char *only, const char *name)
{
    if (only[0] != '-')
        return strcmp(only, name) == 0;
    size_t n = strlen(name);
    for (const char *p = only + 1; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0)
            return 0;
        p += len + (end != NULL);
    }
    return 1;
}

int main(int argc, char **argv)
{
    for (size_t i = 0; i < NBUILTIN; i++) {
        cases[ncases] = builtin[i];
        cases[ncases].len = (size_t)(builtin_ends[i] - builtin[i].bytes);
        ncases++;
    }
    if (argc > 1 && argv[1][0])
        read_cases(argv[1]);
    const char *only = argc > 2 ? argv[2] : NULL;

    map_fixed(SCRATCH, SCRATCH_SIZE, PROT_READ | PROT_WRITE);
    map_fixed(STACK, STACK_SIZE, PROT_READ | PROT_WRITE);
    map_fixed(RO_PAGE, PAGE, PROT_READ);
    map_fixed(NONE_PAGE, PAGE, PROT_NONE);
    memset(map_fixed(NX_PAGE, PAGE, PROT_READ | PROT_WRITE), 0xcc, PAGE);

    /* Pages: one per case, then [end page][hole][straddle page][hole][straddle page][none]. */
    size_t pages = ncases + 6;
    unsigned char *code = map_fixed(CODE, pages * PAGE, PROT_READ | PROT_WRITE);
    memset(code, 0xcc, pages * PAGE);
    uint64_t *base = calloc(ncases, sizeof *base);
    size_t extra = ncases;
    for (size_t i = 0; i < ncases; i++) {
        struct code_case *c = &cases[i];
        unsigned char *page;
        size_t off;
        switch (c->place) {
        case AT_START:
            page = code + i * PAGE;
            off = 0;
            break;
        case END_UNMAPPED:
            page = code + extra * PAGE;
            extra += 2;
            off = PAGE - c->len;
            break;
        default:
            /* The last instruction is 2 bytes (89 d8): its second byte is on the next page. */
            page = code + extra * PAGE;
            extra += 2;
            off = PAGE - c->len + 1;
            break;
        }
        memcpy(page + off, c->bytes, c->place >= STRADDLE_HOLE ? c->len - 1 : c->len);
        base[i] = (uint64_t)(page + off);
    }
    if (mprotect(code, pages * PAGE, PROT_READ | PROT_EXEC) != 0) {
        perror("mprotect");
        return 2;
    }
    /* The pages after the special placements: holes, and one PROT_NONE page. */
    for (size_t p = ncases + 1; p < pages; p += 2)
        munmap(code + p * PAGE, PAGE);
    for (size_t i = 0; i < ncases; i++)
        if (cases[i].place == STRADDLE_NONE)
            map_fixed((base[i] + PAGE) & ~(PAGE - 1), PAGE, PROT_NONE);

    /* The async_signal case signals its process group (kill(0, ...)): be alone in it. */
    setpgid(0, 0);
    static char altstack[64 * 1024];
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigfillset(&sa.sa_mask);
    for (int s = 1; s < 32; s++)
        if (s != SIGKILL && s != SIGSTOP && s != SIGCHLD && s != SIGCONT)
            sigaction(s, &sa, NULL);

    for (size_t i = 0; i < ncases; i++) {
        if (only && !selected(only, cases[i].name))
            continue;
        current_name = cases[i].name;
        current_base = base[i];
        memset((void *)SCRATCH, 0x5a, SCRATCH_SIZE);
        for (uint64_t *s = (uint64_t *)STACK; s < (uint64_t *)(STACK + STACK_SIZE); s++)
            *s = SCRATCH + 0x8000;
        __asm__ volatile("fninit\n"
                         "movl $0x1f80, -8(%%rsp)\n"
                         "ldmxcsr -8(%%rsp)" ::
                             : "memory");
        if (sigsetjmp(back, 1) == 0)
            fault_corpus_enter(base[i], start_regs);
    }
    dprintf(1, "done: %zu cases\n", ncases);
    return 0;
}
