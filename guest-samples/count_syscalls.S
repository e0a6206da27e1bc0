/* Exact syscall counts (monitor report test): 7 write calls from one site (write_site, in a
 * loop); 13 getpid calls: 1 at getpid_first, 9 at getpid_site_a (in a loop), 1 each at
 * getpid_site_b, getpid_site_c and getpid_site_d (straight line); then 1 exit_group. The program
 * checks that every getpid returned the same pid. */
#include "asm.h"

    .text
    .globl _start
_start:
    mov $7, %r12d
    jmp write_loop
    block_label write_loop
    mov $SYS_write, %eax
    mov $1, %edi
    lea line(%rip), %rsi
    mov $line_len, %edx
    .globl write_site
write_site:
    syscall
    dec %r12d
    jnz write_loop

    mov $SYS_getpid, %eax
    .globl getpid_first
getpid_first:
    syscall
    mov %rax, %r13               /* the pid */
    mov $9, %r12d
    jmp getpid_loop
    block_label getpid_loop
    mov $SYS_getpid, %eax
    .globl getpid_site_a
getpid_site_a:
    syscall
    cmp %rax, %r13
    jne wrong
    dec %r12d
    jnz getpid_loop

    block_label getpid_straight
    mov $SYS_getpid, %eax
    .globl getpid_site_b
getpid_site_b:
    syscall
    cmp %rax, %r13
    jne wrong
    mov $SYS_getpid, %eax
    .globl getpid_site_c
getpid_site_c:
    syscall
    cmp %rax, %r13
    jne wrong
    mov $SYS_getpid, %eax
    .globl getpid_site_d
getpid_site_d:
    syscall
    cmp %rax, %r13
    jne wrong
    xor %edi, %edi
    exit_group_edi
wrong:
    write_stdout wrong_msg, wrong_len
    mov $1, %edi
    exit_group_edi

    .section .rodata
line:
    .ascii "count_syscalls: one of 7 writes\n"
    line_len = . - line
wrong_msg:
    .ascii "count_syscalls: getpid changed\n"
    wrong_len = . - wrong_msg

    .section .note.GNU-stack, "", @progbits
