/* Jumps into code that a call reaches only later: `shared` (before every symbol, so no
 * symbol owns it) is first reached only by the backward `jmp shared` of `outer_a` and of
 * `outer_b`, a step of each one's paths (the block is in two functions); then `_start` calls
 * `shared` itself, which makes it a function entry, and from then on both jumps to it are tail
 * calls (the rule: a jump is a tail call only into an entry that calls reach). Phases of
 * ROUNDS rounds: call outer_a and outer_b (each loops four times, then jumps to shared, which
 * returns to `_start`), call shared, call outer_a and outer_b again. By hand: 2000 calls of
 * each outer function, 1000 of shared, 2000 tail calls (the last phase's jumps). The program
 * checks its sum: shared adds 1 per run (5000), the outer functions 1 per loop round
 * (16000): 21000. */
#include "asm.h"

#define ROUNDS 1000

    .text
shared:
    add $1, %r14d
    ret

    .globl _start
_start:
    xor %r14d, %r14d             /* sum */
    mov $ROUNDS, %r12d
1:  call outer_a
    call outer_b
    dec %r12d
    jnz 1b

    mov $ROUNDS, %r12d
2:  call shared
    dec %r12d
    jnz 2b

    mov $ROUNDS, %r12d
3:  call outer_a
    call outer_b
    dec %r12d
    jnz 3b

    cmp $5 * ROUNDS + 16 * ROUNDS, %r14d
    jne wrong
    exit_ok_or_wrong

    block_label outer_a
    mov $4, %ecx
4:  add $1, %r14d
    dec %ecx
    jnz 4b
    jmp shared

    block_label outer_b
    mov $4, %ecx
5:  add $1, %r14d
    dec %ecx
    jnz 5b
    jmp shared

    .section .rodata
ok_msg:
    .ascii "paths_late_entry: shared ran 5000 times, 2000 of them after tail calls\n"
    ok_len = . - ok_msg
wrong_msg:
    .ascii "paths_late_entry: wrong sum\n"
    wrong_len = . - wrong_msg

    .section .note.GNU-stack, "", @progbits
