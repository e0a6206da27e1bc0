/* The machine state at the ELF entry point, as Linux sets it up: every general-purpose
 * register except rsp is 0, the arithmetic flags and DF are clear, rsp is 16-byte aligned and
 * points at argc, argv[], envp[], auxv[]; AT_ENTRY is the real address of _start, AT_PHDR
 * points at the mapped program headers (64 bytes after the ELF header), AT_PAGESZ is 4096,
 * AT_EXECFN is argv[0]; the FS base is 0; MXCSR and the x87 control word are at their
 * reset values. Prints argc and the arguments; exit 0 natively, otherwise the check number. */
#include "asm.h"

#define AT_NULL 0
#define AT_PHDR 3
#define AT_PHENT 4
#define AT_PHNUM 5
#define AT_PAGESZ 6
#define AT_ENTRY 9
#define AT_RANDOM 25
#define AT_EXECFN 31

    .text
    .globl _start
_start:
    /* Capture everything before any instruction changes it. */
    mov %rax, regs+0(%rip)
    mov %rbx, regs+8(%rip)
    mov %rcx, regs+16(%rip)
    mov %rdx, regs+24(%rip)
    mov %rsi, regs+32(%rip)
    mov %rdi, regs+40(%rip)
    mov %rbp, regs+48(%rip)
    mov %r8, regs+56(%rip)
    mov %r9, regs+64(%rip)
    mov %r10, regs+72(%rip)
    mov %r11, regs+80(%rip)
    mov %r12, regs+88(%rip)
    mov %r13, regs+96(%rip)
    mov %r14, regs+104(%rip)
    mov %r15, regs+112(%rip)
    pushfq
    popq flags(%rip)
    stmxcsr mxcsr(%rip)
    fnstcw fpucw(%rip)

    /* 1: general-purpose registers */
    mov $1, %r14d
    lea regs(%rip), %rsi
    xor %ecx, %ecx
1:  cmpq $0, (%rsi,%rcx,8)
    jne fail
    inc %ecx
    cmp $15, %ecx
    jb 1b

    /* 2: flags */
    mov $2, %r14d
    mov flags(%rip), %rax
    test $(FLAGS_ARITH | FL_DF), %eax
    jnz fail

    /* 3: stack alignment */
    mov $3, %r14d
    test $15, %spl
    jnz fail

    /* 4: argc, argv[argc] == NULL, envp terminated */
    mov $4, %r14d
    mov (%rsp), %r12          /* argc */
    test %r12, %r12
    jz fail
    cmpq $0, 8(%rsp,%r12,8)   /* argv[argc] */
    jne fail
    lea 16(%rsp,%r12,8), %rbx /* envp */
2:  mov (%rbx), %rax
    add $8, %rbx
    test %rax, %rax
    jnz 2b                    /* rbx = auxv */
    mov %rbx, auxv(%rip)

    /* 5..10: auxv entries, looked up one by one */
    mov $5, %r14d
    mov $AT_ENTRY, %edi
    call auxv_get
    lea _start(%rip), %rcx
    cmp %rcx, %rax
    jne fail

    mov $6, %r14d
    mov $AT_PAGESZ, %edi
    call auxv_get
    cmp $4096, %rax
    jne fail

    mov $7, %r14d
    mov $AT_PHENT, %edi
    call auxv_get
    cmp $56, %rax
    jne fail
    mov $AT_PHNUM, %edi
    call auxv_get
    test %rax, %rax
    jz fail
    mov $AT_PHDR, %edi
    call auxv_get
    test %rax, %rax
    jz fail
    cmpl $0x464c457f, -64(%rax) /* "\x7fELF" */
    jne fail

    mov $8, %r14d
    mov $AT_RANDOM, %edi
    call auxv_get
    test %rax, %rax
    jz fail
    mov (%rax), %rcx          /* 16 readable bytes */
    or 8(%rax), %rcx

    mov $9, %r14d
    mov $AT_EXECFN, %edi
    call auxv_get
    test %rax, %rax
    jz fail
    mov 8(%rsp), %rsi         /* argv[0] */
3:  movb (%rax), %cl
    cmpb (%rsi), %cl
    jne fail
    inc %rax
    inc %rsi
    test %cl, %cl
    jnz 3b

    /* 10: FS base */
    mov $10, %r14d
    mov $SYS_arch_prctl, %eax
    mov $ARCH_GET_FS, %edi
    lea fsbase(%rip), %rsi
    syscall
    test %rax, %rax
    jnz fail
    cmpq $0, fsbase(%rip)
    jne fail

    /* 11: SSE and x87 control state */
    mov $11, %r14d
    cmpl $0x1f80, mxcsr(%rip)
    jne fail
    cmpw $0x037f, fpucw(%rip)
    jne fail

    /* Report the arguments: "argc N" then one "arg: ..." line per argv[i], i >= 1. */
    mov %r12d, %eax
    two_digits argc_num
    write_stdout argc_msg, argc_len
    mov $1, %r15d
4:  cmp %r12, %r15
    jae 6f
    write_stdout arg_prefix, arg_prefix_len
    mov 8(%rsp,%r15,8), %rsi
    xor %edx, %edx
5:  cmpb $0, (%rsi,%rdx)
    je 55f
    inc %rdx
    jmp 5b
55: mov $SYS_write, %eax
    mov $1, %edi
    syscall
    write_stdout newline, 1
    inc %r15
    jmp 4b
6:  write_stdout ok_msg, ok_len
    xor %edi, %edi
    exit_group_edi

fail:
    mov %r14d, %eax
    two_digits fail_num
    write_stdout fail_msg, fail_len
    mov %r14d, %edi
    exit_group_edi

/* auxv_get(type in edi): the value of the first auxv entry of that type, or 0. */
auxv_get:
    mov auxv(%rip), %rsi
1:  mov (%rsi), %rax
    cmp $AT_NULL, %rax
    je 2f
    cmp %rdi, %rax
    je 3f
    add $16, %rsi
    jmp 1b
2:  xor %eax, %eax
    ret
3:  mov 8(%rsi), %rax
    ret

    .section .rodata
ok_msg:
    .ascii "start state: ok\n"
    ok_len = . - ok_msg
arg_prefix:
    .ascii "arg: "
    arg_prefix_len = . - arg_prefix
newline:
    .ascii "\n"

    .data
    .p2align 3
regs:
    .fill 15, 8, 0
flags:
    .quad 0
auxv:
    .quad 0
fsbase:
    .quad -1
mxcsr:
    .long 0
fpucw:
    .word 0
argc_msg:
    .ascii "argc "
argc_num:
    .ascii "??\n"
    argc_len = . - argc_msg
fail_msg:
    .ascii "start state: FAIL at check "
fail_num:
    .ascii "??\n"
    fail_len = . - fail_msg

    .section .note.GNU-stack, "", @progbits
