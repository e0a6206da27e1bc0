/* Exact block and edge counts (monitor report test): a loop of exactly 10000 iterations whose
 * conditional branch is taken on every 4th iteration, then a 40 x 25 loop nest. Every block
 * starts at a label the report names (block_label), so the test asserts counts by symbol:
 *
 *   block        count  terminator and edges
 *   loop_head    10000  jz: taken -> loop_skip 2500, not taken -> loop_add 7500
 *   loop_add      7500  jnz: taken -> loop_head 7499, not taken -> loop_add+0x9 (jmp loop_done) 1
 *   loop_skip     2500  jnz: taken -> loop_head 2500 (never falls through)
 *   loop_done        1  jmp outer_head
 *   outer_head      40  jmp inner_head
 *   inner_head    1000  jnz: taken -> inner_head 960, not taken -> outer_tail 40
 *   outer_tail      40  jnz: taken -> outer_head 39, not taken -> report 1
 *
 * The sums are checked in the program, which prints one line either way. */
#include "asm.h"

#define ITERATIONS 10000
#define OUTER 40
#define INNER 25

    .text
    .globl _start
_start:
    mov $ITERATIONS, %r12d
    xor %r13d, %r13d             /* adds */
    xor %r14d, %r14d             /* skips */
    jmp loop_head

    block_label loop_head
    test $3, %r12d
    jz loop_skip                 /* every 4th iteration (r12 = 10000, 9996, ...) */
    block_label loop_add
    add $1, %r13d
    dec %r12d
    jnz loop_head
    jmp loop_done
    block_label loop_skip
    add $1, %r14d
    dec %r12d
    jnz loop_head

    block_label loop_done
    mov $OUTER, %r12d
    xor %r15d, %r15d             /* inner iterations */
    jmp outer_head
    block_label outer_head
    mov $INNER, %ebx
    jmp inner_head
    block_label inner_head
    add $1, %r15d
    dec %ebx
    jnz inner_head
    block_label outer_tail
    dec %r12d
    jnz outer_head

    block_label report
    cmp $7500, %r13d
    jne wrong
    cmp $2500, %r14d
    jne wrong
    cmp $OUTER * INNER, %r15d
    jne wrong
    exit_ok_or_wrong

    .section .rodata
ok_msg:
    .ascii "count_branches: 7500 adds, 2500 skips, 1000 inner iterations\n"
    ok_len = . - ok_msg
wrong_msg:
    .ascii "count_branches: wrong sums\n"
    wrong_len = . - wrong_msg

    .section .note.GNU-stack, "", @progbits
