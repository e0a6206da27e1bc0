/* A page the guest unmaps stays free until the guest maps it again, as natively: mmap(NULL)
 * a page, munmap it, sleep, then map the same address with MAP_FIXED_NOREPLACE, five times
 * (jit_remap.c's munmap + MAP_FIXED pattern, with time in between for anything else in the
 * process to map memory). hotpath's own memory must not land in the hole: its monitor thread
 * makes its arena and signal stack before the guest's first instruction, not whenever it is
 * first scheduled (without that, 9 runs in 10 failed). Prints "hole kept" and exits 0, or
 * "hole taken" and exits 1. */
#include "asm.h"

#define SYS_mmap 9
#define SYS_munmap 11
#define SYS_nanosleep 35
#define PROT_RW 3
#define MAP_PRIVATE_ANON 0x22
#define MAP_FIXED_NOREPLACE 0x100000
#define ROUNDS 5

    .text
    .globl _start
_start:
    mov $ROUNDS, %r13d
round:
    mov $SYS_mmap, %eax
    xor %edi, %edi
    mov $4096, %esi
    mov $PROT_RW, %edx
    mov $MAP_PRIVATE_ANON, %r10d
    mov $-1, %r8
    xor %r9d, %r9d
    syscall
    cmp $-4095, %rax
    jae wrong
    mov %rax, %r12                /* the page */

    mov $SYS_munmap, %eax
    mov %r12, %rdi
    mov $4096, %esi
    syscall
    test %rax, %rax
    jnz wrong

    mov $SYS_nanosleep, %eax
    lea pause(%rip), %rdi
    xor %esi, %esi
    syscall

    mov $SYS_mmap, %eax
    mov %r12, %rdi
    mov $4096, %esi
    mov $PROT_RW, %edx
    mov $(MAP_PRIVATE_ANON | MAP_FIXED_NOREPLACE), %r10d
    mov $-1, %r8
    xor %r9d, %r9d
    syscall
    cmp %r12, %rax
    jne wrong

    mov $SYS_munmap, %eax
    mov %r12, %rdi
    mov $4096, %esi
    syscall
    sub $1, %r13d
    jnz round

    exit_ok_or_wrong

    .section .rodata
pause:
    .quad 0, 10000000             /* 10 ms */
ok_msg:
    .ascii "hole kept\n"
    .set ok_len, . - ok_msg
wrong_msg:
    .ascii "hole taken\n"
    .set wrong_len, . - wrong_msg
