/* Exact call and return counts (monitor report test): 600 indirect calls through a table of
 * function pointers (filled at run time, so the same code links static and static-pie), in the
 * repeating order f_one f_two f_one f_three f_one f_two, so f_one is called 300 times, f_two 200
 * and f_three 100, from one `call *(%rbx,%rax,8)` at the label call_site; each callee returns to
 * the same place (call_return). Every callee also makes a direct call to leaf, 600 in all.
 * The program checks the sum (300*1 + 200*2 + 100*3 plus 600 from leaf). */
#include "asm.h"

#define ROUNDS 100

    .text
    .globl _start
_start:
    lea f_one(%rip), %rax
    mov %rax, table(%rip)
    lea f_two(%rip), %rax
    mov %rax, table+8(%rip)
    lea f_three(%rip), %rax
    mov %rax, table+16(%rip)
    xor %r12d, %r12d             /* position in the order, 0..5 */
    xor %r13d, %r13d             /* calls made */
    xor %r14d, %r14d             /* sum */
    jmp call_head

    block_label call_head
    lea order(%rip), %rdx
    movzbl (%rdx,%r12,1), %eax
    lea table(%rip), %rbx
    .globl call_site
call_site:
    call *(%rbx,%rax,8)
    block_label call_return
    add $1, %r12d
    cmp $6, %r12d
    jne call_count
    xor %r12d, %r12d
    block_label call_count
    add $1, %r13d
    cmp $6 * ROUNDS, %r13d
    jne call_head

    cmp $300 * 1 + 200 * 2 + 100 * 3 + 600, %r14d
    jne wrong
    exit_ok_or_wrong

    block_label f_one
    add $1, %r14d
    call leaf
    ret
    block_label f_two
    add $2, %r14d
    call leaf
    ret
    block_label f_three
    add $3, %r14d
    call leaf
    ret
    block_label leaf
    add $1, %r14d
    ret

    .section .rodata
order:
    .byte 0, 1, 0, 2, 0, 1
ok_msg:
    .ascii "count_calls: f_one 300, f_two 200, f_three 100 calls, leaf 600\n"
    ok_len = . - ok_msg
wrong_msg:
    .ascii "count_calls: wrong sum\n"
    wrong_len = . - wrong_msg

    .bss
    .balign 8
table:
    .zero 24

    .section .note.GNU-stack, "", @progbits
