/* Exact indirect-jump counts (monitor report test): 1000 iterations of a switch through a jump
 * table of 32-bit offsets (the -fPIC shape gcc emits: movslq, add, jmp *%rax), indexed by
 * i % 10 through a selector table, so the cases are hit a known number of times:
 *
 *   selector  0 0 0 0 1 1 1 2 2 3  ->  case_a 400, case_b 300, case_c 200, case_d 100
 *   case_e is in the table but never selected.
 *
 * The indirect jmp is at the label switch_jmp; every case ends with jmp switch_next. The
 * program sums a case-dependent value and checks it (400*1 + 300*10 + 200*100 + 100*1000). */
#include "asm.h"

#define ITERATIONS 1000

    .text
    .globl _start
_start:
    xor %r12d, %r12d             /* i */
    xor %r13d, %r13d             /* i % 10 */
    xor %r14d, %r14d             /* sum */
    jmp switch_head

    block_label switch_head
    lea selector(%rip), %rdx
    movzbl (%rdx,%r13,1), %eax
    lea cases(%rip), %rdx
    movslq (%rdx,%rax,4), %rax
    add %rdx, %rax
    .globl switch_jmp
switch_jmp:
    jmp *%rax

    block_label case_a
    add $1, %r14d
    jmp switch_next
    /* The dispatch's add sets CF (the cases lie below the table, so the offset is negative):
     * case_b adds 9 + CF. case_c and case_d set RAX and every status flag before reading any,
     * so hotpath may enter them straight from its jump table; case_a (RAX kept) and case_b
     * (CF read) it may not. */
    block_label case_b
    mov $9, %eax
    adc %eax, %r14d
    jmp switch_next
    block_label case_c
    mov $100, %eax
    add %eax, %r14d
    jmp switch_next
    block_label case_d
    mov $1000, %eax
    add %eax, %r14d
    jmp switch_next
    block_label case_e
    add $10000, %r14d
    jmp switch_next

    block_label switch_next
    add $1, %r13d
    cmp $10, %r13d
    jne switch_count
    xor %r13d, %r13d
    block_label switch_count
    add $1, %r12d
    cmp $ITERATIONS, %r12d
    jne switch_head

    cmp $400 * 1 + 300 * 10 + 200 * 100 + 100 * 1000, %r14d
    jne wrong
    exit_ok_or_wrong

    .section .rodata
    .balign 4
cases:
    .long case_a - cases, case_b - cases, case_c - cases, case_d - cases, case_e - cases
selector:
    .byte 0, 0, 0, 0, 1, 1, 1, 2, 2, 3
ok_msg:
    .ascii "count_jumptable: cases hit 400, 300, 200, 100 and 0 times\n"
    ok_len = . - ok_msg
wrong_msg:
    .ascii "count_jumptable: wrong sum\n"
    wrong_len = . - wrong_msg

    .section .note.GNU-stack, "", @progbits
