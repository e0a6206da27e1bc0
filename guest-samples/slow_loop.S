/* A loop of two slow blocks (each a chain of 60 dependent square roots, a fraction of a
 * microsecond), 300,000 times: without superblocks 600,000 ring events, fewer than one lap of
 * the default 1 Mi-entry ring, in over 100 ms. Its superblock (both blocks, one event per
 * iteration) is requested after 3,000 iterations; superblocks.rs checks that the translator
 * takes it then, when the loop next reaches its head, and not at a ring refill that never
 * comes. Prints "ok" when the loop ran 300,000 times and the roots reached 1.0, else "wrong". */
#include "asm.h"

#define ITERATIONS 300000

    .text
    .globl _start
_start:
    xor %r12d, %r12d             /* i */
    mov $2, %eax
    cvtsi2sd %eax, %xmm0         /* 2.0: its repeated square root rounds to 1.0 */

    block_label slow_a
    .rept 60
    sqrtsd %xmm0, %xmm0
    .endr
    jmp slow_b
    block_label slow_b
    .rept 60
    sqrtsd %xmm0, %xmm0
    .endr
    add $1, %r12d
    cmp $ITERATIONS, %r12d
    jne slow_a

    cmp $ITERATIONS, %r12d
    jne wrong
    mov $1, %eax
    cvtsi2sd %eax, %xmm1
    ucomisd %xmm1, %xmm0
    jne wrong
    exit_ok_or_wrong

    .section .rodata
ok_msg:
    .ascii "ok\n"
    .set ok_len, . - ok_msg
wrong_msg:
    .ascii "wrong\n"
    .set wrong_len, . - wrong_msg
