/* A loop that changes its path halfway through a program's life (a table filled, then
 * sorted): its branch goes to phase_a for the first 10,000 iterations and to phase_b for the
 * next 300,000. The superblock formed in the first phase (after 3,000 runs of its back edge)
 * leaves after its head on every run of the second, so the monitor re-forms it along phase_b
 * (superblocks.rs). Counts follow from the source: phase_head and phase_next 310,000 times,
 * phase_a 10,000, phase_b 300,000. */
#include "asm.h"

#define FIRST 10000
#define ITERATIONS 310000

    .text
    .globl _start
_start:
    xor %r12d, %r12d             /* i */
    xor %r13d, %r13d             /* phase a's sum */
    xor %r14d, %r14d             /* phase b's sum */

    block_label phase_head
    cmp $FIRST, %r12d
    jae phase_b
    block_label phase_a
    add $1, %r13d
    jmp phase_next
    block_label phase_b
    add $3, %r14d
    block_label phase_next
    add $1, %r12d
    cmp $ITERATIONS, %r12d
    jne phase_head

    cmp $FIRST, %r13d
    jne wrong
    cmp $3 * (ITERATIONS - FIRST), %r14d
    jne wrong
    exit_ok_or_wrong

    .section .rodata
ok_msg:
    .ascii "phase_change: 10000 runs along phase_a, then 300000 along phase_b\n"
    ok_len = . - ok_msg
wrong_msg:
    .ascii "phase_change: wrong sums\n"
    wrong_len = . - wrong_msg

    .section .note.GNU-stack, "", @progbits
