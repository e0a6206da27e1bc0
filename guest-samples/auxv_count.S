/* Prints how many auxiliary vector entries the program was started with, AT_NULL excluded
 * ("auxv entries: NN"): the same natively and under hotpath (a machine-dependent catalog
 * sample). Also a probe for valgrind.rs: hotpath and valgrind each build the guest's auxv
 * themselves, and glibc's _dl_aux_init loops once per entry, so valgrind.rs needs both
 * numbers to account for that loop exactly. */
#include "asm.h"

    .text
    .globl _start
_start:
    mov (%rsp), %rcx             /* argc */
    lea 16(%rsp,%rcx,8), %rsi    /* envp: after argv[argc] = NULL */
1:  mov (%rsi), %rax
    add $8, %rsi
    test %rax, %rax
    jnz 1b                       /* now rsi = auxv */
    xor %eax, %eax
2:  cmpq $0, (%rsi)
    je 3f
    add $1, %eax
    add $16, %rsi
    jmp 2b
3:  two_digits digits
    write_stdout msg, msg_len
    xor %edi, %edi
    exit_group_edi

    .data
msg:
    .ascii "auxv entries: "
digits:
    .ascii "00\n"
    msg_len = . - msg

    .section .note.GNU-stack, "", @progbits
