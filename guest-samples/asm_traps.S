/* Death by a trap, as on hardware: with no argument the guest executes ud2 (SIGILL); with
 * "badop" it executes a byte sequence that is not a valid instruction in 64-bit mode (0x06,
 * push %es, which must raise SIGILL, not be decoded leniently); with "int3" it executes int3
 * (SIGTRAP). A line is written first so the output before the trap is compared too. */
#include "asm.h"

    .text
    .globl _start
_start:
    mov (%rsp), %r12          /* argc */
    write_stdout before_msg, before_len
    cmp $2, %r12
    jb do_ud2
    mov 16(%rsp), %rsi        /* argv[1] */
    cmpb $'b', (%rsi)
    je do_badop
    cmpb $'i', (%rsi)
    je do_int3
do_ud2:
    ud2
do_badop:
    .byte 0x06
    jmp survived
do_int3:
    int3
survived:
    write_stdout survived_msg, survived_len
    xor %edi, %edi
    exit_group_edi

    .section .rodata
before_msg:
    .ascii "traps: about to trap\n"
    before_len = . - before_msg
survived_msg:
    .ascii "traps: survived the trap?!\n"
    survived_len = . - survived_msg

    .section .note.GNU-stack, "", @progbits
