/* Return addresses are guest addresses: call must push the guest address of the next
 * instruction, and code may read, pop, replace or forge return addresses. Checks:
 *  1. a callee reads [rsp] and compares it with the label after the call;
 *  2. call to the next instruction + pop (the classic get-pc idiom);
 *  3. a callee overwrites its return address, so ret lands somewhere else;
 *  4. push + ret used as an indirect jump;
 *  5. a callee returns with pop + jmp *reg;
 *  6. an indirect call (register and memory) pushes the right address;
 *  7. ret $16 pops the arguments pushed by the caller;
 *  8. a 1000-deep recursion where every level checks its own return address.
 * Repeated ROUNDS times. Exits with SYS_exit (not exit_group): 0 natively, else the check. */
#include "asm.h"

#define ROUNDS 3000
#define DEPTH 1000

    .text
    .globl _start
_start:
    mov $ROUNDS, %r13d

round:
    /* 1 */
    mov $1, %r14d
    call read_return_address
after_1:
    lea after_1(%rip), %rcx
    cmp %rcx, %rax
    jne fail

    /* 2 */
    mov $2, %r14d
    call 1f
1:  pop %rax
    lea 1b(%rip), %rcx
    cmp %rcx, %rax
    jne fail

    /* 3 */
    mov $3, %r14d
    call redirect_return
    jmp fail                  /* skipped: the callee returns to landing_3 instead */
landing_3:
    cmp $0x33, %eax
    jne fail

    /* 4 */
    mov $4, %r14d
    lea landing_4(%rip), %rax
    push %rax
    ret
    jmp fail
landing_4:

    /* 5 */
    mov $5, %r14d
    mov %rsp, %r12
    call pop_and_jump
after_5:
    cmp %rsp, %r12
    jne fail
    lea after_5(%rip), %rcx
    cmp %rcx, %rax
    jne fail

    /* 6 */
    mov $6, %r14d
    lea read_return_address(%rip), %rdx
    call *%rdx
after_6a:
    lea after_6a(%rip), %rcx
    cmp %rcx, %rax
    jne fail
    mov %rdx, fn_slot(%rip)
    call *fn_slot(%rip)
after_6b:
    lea after_6b(%rip), %rcx
    cmp %rcx, %rax
    jne fail

    /* 7 */
    mov $7, %r14d
    mov %rsp, %r12
    push $0x1111
    push $0x2222
    call sum_args_ret16
after_7:
    cmp %rsp, %r12
    jne fail
    cmp $0x3333, %eax
    jne fail

    /* 8 */
    mov $8, %r14d
    mov $DEPTH, %edi
    call recurse
after_8:
    test %eax, %eax
    jnz fail

    dec %r13d
    jnz round

    write_stdout ok_msg, ok_len
    xor %edi, %edi
    mov $SYS_exit, %eax
    syscall
    ud2

fail:
    mov %r14d, %eax
    two_digits fail_num
    write_stdout fail_msg, fail_len
    mov %r14d, %edi
    mov $SYS_exit, %eax
    syscall
    ud2

read_return_address:
    mov (%rsp), %rax
    ret

redirect_return:
    lea landing_3(%rip), %rax
    mov %rax, (%rsp)
    mov $0x33, %eax
    ret

pop_and_jump:
    pop %rcx
    mov %rcx, %rax
    jmp *%rcx

/* Two stack arguments above the return address; the callee pops them with ret $16. */
sum_args_ret16:
    mov 8(%rsp), %rax
    add 16(%rsp), %rax
    ret $16

/* recurse(n): returns 0 when every level saw the expected return address: after_8 for the
 * outermost call, after_recursive_call for the others. Also checks 16-byte alignment:
 * rsp + 8 is aligned at every entry, as at the first call from _start. */
recurse:
    mov (%rsp), %rax
    cmp $DEPTH, %edi
    jne 1f
    lea after_8(%rip), %rcx
    jmp 2f
1:  lea after_recursive_call(%rip), %rcx
2:  cmp %rcx, %rax
    jne 4f
    lea 8(%rsp), %rax
    test $15, %eax
    jnz 4f
    test %edi, %edi
    jz 3f
    push %rdi                 /* 8 bytes + the return address: 16 per level */
    dec %edi
    call recurse
after_recursive_call:
    pop %rdi
    ret
3:  xor %eax, %eax
    ret
4:  mov $1, %eax
    ret

    .section .rodata
ok_msg:
    .ascii "retaddr: ok, 8 checks x 3000 rounds\n"
    ok_len = . - ok_msg

    .data
    .p2align 3
fn_slot:
    .quad 0
fail_msg:
    .ascii "retaddr: FAIL at check "
fail_num:
    .ascii "??\n"
    fail_len = . - fail_msg

    .section .note.GNU-stack, "", @progbits
