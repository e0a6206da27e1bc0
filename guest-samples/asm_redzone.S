/* The 128-byte red zone below rsp belongs to the guest: a translator must not push anything
 * onto the guest stack (enqueue stubs, dispatcher calls, syscall handling). Three checks,
 * repeated ROUNDS times so the blocks get hot and superblocks form:
 *  1. a leaf function fills its whole red zone (16 qwords), crosses block boundaries (a loop,
 *     an indirect jmp, a conditional chain) and reads every qword back;
 *  2. a leaf fills 15 qwords of its red zone and returns; the caller, after more blocks,
 *     finds them below its own rsp, together with the stale return address the call pushed
 *     (which must be the guest address of the instruction after the call);
 *  3. straight-line code fills its red zone, makes a write syscall, and checks it after.
 * Exit 0 and "redzone: ok" natively; otherwise the check number. */
#include "asm.h"

#define ROUNDS 5000
#define PATTERN 0x0123456789abcdef

    .text
    .globl _start
_start:
    mov $ROUNDS, %r13d

round:
    /* 1 */
    mov $1, %r14d
    mov %rsp, %r12
    call leaf_full
    cmp %rsp, %r12
    jne fail
    test %eax, %eax
    jnz fail

    /* 2 */
    mov $2, %r14d
    call leaf_store
after_leaf_store:
    jmp 1f
1:  mov $50, %ecx             /* a short loop: back edges, block boundaries */
2:  dec %ecx
    jnz 2b
    lea 3f(%rip), %rax
    jmp *%rax
3:  mov $PATTERN, %rax
    mov $2, %ecx              /* qword k (2..16) lives at -8k(%rsp) with value PATTERN ^ k */
4:  mov %rcx, %rdx
    neg %rdx
    mov (%rsp,%rdx,8), %rsi
    mov %rax, %rdi
    xor %rcx, %rdi
    cmp %rdi, %rsi
    jne fail
    inc %ecx
    cmp $16, %ecx
    jbe 4b
    lea after_leaf_store(%rip), %rax
    cmp %rax, -8(%rsp)        /* the return address the call pushed, below rsp now */
    jne fail

    /* 3 */
    mov $3, %r14d
    mov $PATTERN, %rax
    mov $1, %ecx
1:  mov %rcx, %rdx
    neg %rdx
    mov %rax, %rdi
    xor %rcx, %rdi
    not %rdi
    mov %rdi, (%rsp,%rdx,8)   /* -8k(%rsp) = ~(PATTERN ^ k), k = 1..16 */
    inc %ecx
    cmp $16, %ecx
    jbe 1b
    cmp $1, %r13d             /* the syscall only in the last round: keep the output short */
    jne 2f
    write_stdout syscall_msg, syscall_len
2:  mov $PATTERN, %rax
    mov $1, %ecx
3:  mov %rcx, %rdx
    neg %rdx
    mov %rax, %rdi
    xor %rcx, %rdi
    not %rdi
    cmp %rdi, (%rsp,%rdx,8)
    jne fail
    inc %ecx
    cmp $16, %ecx
    jbe 3b

    dec %r13d
    jnz round

    write_stdout ok_msg, ok_len
    xor %edi, %edi
    exit_group_edi

fail:
    mov %r14d, %eax
    two_digits fail_num
    write_stdout fail_msg, fail_len
    mov %r14d, %edi
    exit_group_edi

/* Leaf: -8k(%rsp) = PATTERN + k for k = 1..16 (all 128 bytes), then work across blocks,
 * then verify; returns 0 in eax when all 16 survived, else the first bad k. */
leaf_full:
    mov $PATTERN, %rax
    mov $1, %ecx
1:  mov %rcx, %rdx
    neg %rdx
    lea (%rax,%rcx), %rsi
    mov %rsi, (%rsp,%rdx,8)
    inc %ecx
    cmp $16, %ecx
    jbe 1b
    /* Work that crosses several kinds of block boundary without touching the stack. */
    mov $100, %ecx
    xor %r8d, %r8d
2:  add %rcx, %r8
    test $1, %ecx
    jz 3f
    xor $0x55, %r8
3:  dec %ecx
    jnz 2b
    lea 4f(%rip), %rdx
    jmp *%rdx
4:  cmp $5000, %r8
    ja 5f
    nop
5:  mov $PATTERN, %rax
    mov $1, %ecx
6:  mov %rcx, %rdx
    neg %rdx
    lea (%rax,%rcx), %rsi
    cmp %rsi, (%rsp,%rdx,8)
    jne 7f
    inc %ecx
    cmp $16, %ecx
    jbe 6b
    xor %eax, %eax
    ret
7:  mov %ecx, %eax
    ret

/* Leaf: -8j(%rsp) = PATTERN ^ (j + 1) for j = 1..15, i.e. in the caller's frame
 * -8k(caller rsp) = PATTERN ^ k for k = 2..16. Returns through a conditional chain. */
leaf_store:
    mov $PATTERN, %rax
    mov $1, %ecx
1:  mov %rcx, %rdx
    neg %rdx
    lea 1(%rcx), %rsi
    xor %rax, %rsi
    mov %rsi, (%rsp,%rdx,8)
    inc %ecx
    cmp $15, %ecx
    jbe 1b
    test %r13d, %r13d
    jz 2f
    ret
2:  ret

    .section .rodata
ok_msg:
    .ascii "redzone: ok, 3 checks x 5000 rounds\n"
    ok_len = . - ok_msg
syscall_msg:
    .ascii "redzone: a write syscall with a live red zone\n"
    syscall_len = . - syscall_msg

    .data
fail_msg:
    .ascii "redzone: FAIL at check "
fail_num:
    .ascii "??\n"
    fail_len = . - fail_msg

    .section .note.GNU-stack, "", @progbits
