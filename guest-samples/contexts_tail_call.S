/* Tail calls into a function whose entry is a loop head, so that with superblocks its entry
 * becomes a superblock's head: `_start` calls `work` 1000 times through a register (the
 * indirect call fills the lookup table's slot for `work`), then calls `tail_indirect` 1000
 * times, which tail-calls `work` with `jmp *%rax`, and `tail_direct` 1000 times, which
 * tail-calls it with `jmp work`. `work` loops three times from its entry (its `jnz` is a
 * backward branch to it) and returns to `_start`. Contexts by hand: work, tail_indirect and
 * tail_direct under `_start` (3; a tail call replaces the caller's frame with work's, a context
 * that exists already); 2000 tail calls. The program checks its sum: 3 per call of work, 9000. */
#include "asm.h"

#define ROUNDS 1000

    .text
    .globl _start
_start:
    lea work(%rip), %rbx
    xor %r14d, %r14d             /* sum */
    mov $ROUNDS, %r12d
    block_label call_loop
    mov $10, %ecx
    call *%rbx
    dec %r12d
    jnz call_loop

    mov $ROUNDS, %r12d
    block_label indirect_loop
    mov $10, %ecx
    call tail_indirect
    dec %r12d
    jnz indirect_loop

    mov $ROUNDS, %r12d
    block_label direct_loop
    mov $10, %ecx
    call tail_direct
    dec %r12d
    jnz direct_loop

    cmp $10 * 3 * ROUNDS, %r14d
    jne wrong
    exit_ok_or_wrong

    block_label tail_indirect
    lea work(%rip), %rax
    jmp *%rax

    block_label tail_direct
    jmp work

    block_label work
    add $1, %r14d
    dec %ecx
    jnz work
    ret

    .section .rodata
ok_msg:
    .ascii "contexts_tail_call: work called 3000 times, 2000 of them by tail calls\n"
    ok_len = . - ok_msg
wrong_msg:
    .ascii "contexts_tail_call: wrong sum\n"
    wrong_len = . - wrong_msg

    .section .note.GNU-stack, "", @progbits
