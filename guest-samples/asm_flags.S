/* Flags live across block boundaries: each check sets CF/ZF/SF/OF/PF/AF (and DF) with one
 * instruction, crosses at least one block boundary (jmp, jcc, call/ret, indirect jmp/call,
 * a loop back edge), and only then consumes the flags with adc/sbb/setcc/cmovcc/jcc/pushfq/
 * lahf/rep movsb. The whole sequence runs ITERATIONS times so every block is hot enough for
 * superblocks. Exit 0 and "flags: ok" natively; a wrong flag exits with the check number. */
#include "asm.h"

#define ITERATIONS 6000

    .text
    .globl _start
_start:
    mov $ITERATIONS, %r13d

round:
    /* 1: CF=1 ZF=1 from add, consumed by setz then adc in later blocks. */
    mov $1, %r14d
    mov $-1, %rax
    add $1, %rax
    jmp 1f
1:  setz %cl
    jmp 2f
2:  mov $0, %ebx              /* mov leaves flags alone */
    adc $0, %rbx
    cmp $1, %rbx
    jne fail
    cmp $1, %cl
    jne fail

    /* 2: the exact arithmetic flags of 0xffff_ffff_ffff_ffff + 1 via pushfq. */
    mov $2, %r14d
    mov $-1, %rax
    add $1, %rax
    jmp 1f
1:  pushfq
    pop %rax
    and $FLAGS_ARITH, %eax
    cmp $(FL_CF | FL_PF | FL_AF | FL_ZF), %eax
    jne fail

    /* 3: signed overflow: OF=1 SF=1 (and AF, PF), consumed by seto, cmovo, jo, pushfq. */
    mov $3, %r14d
    mov $0x7fffffffffffffff, %rax
    add $1, %rax
    jmp 1f
1:  seto %bl
    sets %bh
    mov $0, %ecx
    mov $7, %edx
    cmovo %edx, %ecx
    jno fail
    jmp 2f
2:  pushfq
    pop %rax
    and $FLAGS_ARITH, %eax
    cmp $(FL_OF | FL_SF | FL_AF | FL_PF), %eax
    jne fail
    cmp $0x0101, %bx
    jne fail
    cmp $7, %ecx
    jne fail

    /* 4: borrow from cmp: 3 - 5 sets CF SF AF, clears ZF OF PF; jb, sbb, setl, cmovae. */
    mov $4, %r14d
    mov $3, %eax
    cmp $5, %eax
    jmp 1f
1:  jae fail                  /* must not be taken; flags stay live into the next block */
    sbb %rdx, %rdx            /* rdx = -CF = -1, and sets flags again: 0 - 0 - 1 */
    cmp $-1, %rdx
    jne fail
    mov $3, %eax
    cmp $5, %eax
    jmp 2f
2:  setl %cl                  /* SF != OF */
    setg %ch
    mov $11, %esi
    mov $22, %edi
    cmovae %edi, %esi         /* not taken: esi stays 11 */
    jmp 3f
3:  pushfq
    pop %rax
    and $FLAGS_ARITH, %eax
    cmp $(FL_CF | FL_SF | FL_AF), %eax
    jne fail
    cmp $0x0001, %cx
    jne fail
    cmp $11, %esi
    jne fail

    /* 5: inc and dec do not touch CF. */
    mov $5, %r14d
    stc
    jmp 1f
1:  mov $-1, %rax
    inc %rax                  /* ZF=1, CF still 1 */
    jmp 2f
2:  jnc fail
    jnz fail
    clc
    mov $1, %eax
    dec %eax                  /* ZF=1, CF still 0 */
    jmp 3f
3:  jc fail
    jnz fail

    /* 6: a shift by a zero count leaves every flag unchanged. */
    mov $6, %r14d
    mov $0, %ecx
    mov $0x8000000000000001, %rax
    cmp %ecx, %ecx            /* every flag defined: ZF=1 PF=1, the others 0 */
    stc                       /* CF=1 */
    jmp 1f
1:  shl %cl, %rax             /* count 0 */
    jmp 2f
2:  jnc fail
    pushfq
    pop %rdx
    and $FLAGS_ARITH, %edx
    cmp $(FL_CF | FL_PF | FL_ZF), %edx
    jne fail
    mov $1, %cl
    shl %cl, %rax             /* count 1: CF = old top bit = 1, OF = CF ^ new top = 1 */
    jmp 4f
4:  jnc fail
    jno fail

    /* 7: flags across a call and a ret, in both directions. */
    mov $7, %r14d
    stc
    call adc_one              /* callee consumes the caller's CF */
    cmp $1, %eax
    jne fail
    mov $3, %edi
    call compare_with_5       /* callee sets flags, caller consumes them after ret */
    jnb fail
    jz fail
    js 1f
    jmp fail
1:

    /* 8: flags across an indirect jmp (register), a jump table (memory) and an indirect call. */
    mov $8, %r14d
    lea 1f(%rip), %rax
    mov $-1, %rdx
    add $1, %rdx              /* CF=1 ZF=1 */
    jmp *%rax
    jmp fail
1:  jnc fail
    jnz fail
    mov %r13d, %eax
    and $3, %eax
    lea table(%rip), %rdx
    movslq (%rdx,%rax,4), %rax
    add %rdx, %rax            /* clobbers flags: set them again below with lea (no flags) */
    mov $5, %ecx
    cmp $9, %ecx              /* CF=1 SF=1 */
    jmp *%rax
table_target:                 /* every table entry lands here with the cmp's flags */
    jnc fail
    jns fail
    lea adc_one(%rip), %rax
    stc
    call *%rax
    cmp $1, %eax
    jne fail

    /* 9: a 256-bit add whose carry crosses the loop's back edge (dec keeps CF):
     * (2^255 - 1) + (2^255 + 1) = 2^256, so every limb is 0 and the carry out is 1. */
    mov $9, %r14d
    lea bignum_a(%rip), %r8
    lea bignum_b(%rip), %r9
    lea bignum_c(%rip), %r10
    xor %esi, %esi
    mov $4, %ecx
    clc
1:  mov (%r8,%rsi,8), %rax
    adc (%r9,%rsi,8), %rax
    mov %rax, (%r10,%rsi,8)
    lea 1(%rsi), %rsi
    dec %ecx
    jnz 1b
    setc %dl                  /* final carry out: a + b overflows 256 bits */
    cmp $1, %dl
    jne fail
    cmpq $0, (%r10)
    jne fail
    cmpq $0, 8(%r10)
    jne fail
    cmpq $0, 16(%r10)
    jne fail
    cmpq $0, 24(%r10)
    jne fail
    movq $-1, 8(%r10)         /* dirty the result so the next round must recompute it */

    /* 10: sahf in one block, lahf in another. */
    mov $10, %r14d
    mov $0xd5, %ah            /* SF ZF AF PF CF */
    sahf
    jmp 1f
1:  mov $0, %al
    lahf
    cmp $0xd7, %ah            /* bit 1 always reads as 1 */
    jne fail

    /* 11: bt sets CF; bts/btr/btc too; consumed after a jmp by adc and cmovc. */
    mov $11, %r14d
    mov $0x10, %eax
    bt $4, %eax
    jmp 1f
1:  mov $0, %ecx
    adc $0, %ecx
    cmp $1, %ecx
    jne fail
    mov $0x10, %eax
    btr $4, %eax              /* CF = old bit 4 = 1, bit cleared */
    jmp 2f
2:  mov $0, %ecx
    mov $9, %edx
    cmovc %edx, %ecx
    cmp $9, %ecx
    jne fail
    test %eax, %eax
    jnz fail

    /* 12: DF across blocks: std, jmp, then rep movsb copies backwards; pushfq sees DF. */
    mov $12, %r14d
    lea df_src+7(%rip), %rsi
    lea df_dst+7(%rip), %rdi
    mov $8, %ecx
    std
    jmp 1f
1:  pushfq
    pop %rax
    jmp 2f
2:  rep movsb
    cld
    test $FL_DF, %eax
    jz fail
    mov df_src(%rip), %rax
    cmp df_dst(%rip), %rax
    jne fail
    movq $0, df_dst(%rip)

    /* 13: parity flag from a logic op (PF counts the low byte only). */
    mov $13, %r14d
    mov $0x0103, %eax
    test $0xff03, %eax        /* result 0x0103: low byte 0x03 has two bits set -> PF=1 */
    jmp 1f
1:  jnp fail
    mov $0x0107, %eax
    and $0x0107, %eax         /* low byte 0x07: three bits -> PF=0 */
    jmp 2f
2:  jp fail

    /* 14: mul/imul set CF and OF when the high half is significant. */
    mov $14, %r14d
    mov $0x100000000, %rax
    mov $0x100000000, %rcx
    mul %rcx                  /* 2^64: rdx=1, CF=OF=1 */
    jmp 1f
1:  jnc fail
    jno fail
    mov $3, %rax
    imul $5, %rax, %rax       /* fits: CF=OF=0 */
    jmp 2f
2:  jc fail
    jo fail

    /* 15: neg and sub with borrow chains across blocks (sbb of a sbb). */
    mov $15, %r14d
    mov $5, %eax
    neg %eax                  /* CF=1 because the operand was non-zero */
    jmp 1f
1:  mov $10, %ecx
    sbb $3, %ecx              /* 10 - 3 - 1 = 6, no borrow -> CF=0 */
    jmp 2f
2:  mov $0, %edx
    sbb $0, %edx              /* 0 - 0 - 0 = 0 */
    cmp $6, %ecx
    jne fail
    test %edx, %edx
    jne fail

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

/* Returns CF (the caller's) in eax: 0 + 0 + CF. */
adc_one:
    mov $0, %eax
    adc $0, %eax
    ret

/* Sets flags from edi - 5 and returns them to the caller. */
compare_with_5:
    cmp $5, %edi
    ret

    .section .rodata
    .p2align 2
/* A position-independent jump table: offsets relative to the table, as gcc emits for PIC. */
table:
    .long table_target - table
    .long table_target - table
    .long table_target - table
    .long table_target - table
ok_msg:
    .ascii "flags: ok, 15 checks x 6000 rounds\n"
    ok_len = . - ok_msg

    .data
    .p2align 3
bignum_a:
    .quad -1, -1, -1, 0x7fffffffffffffff
bignum_b:
    .quad 1, 0, 0, 0x8000000000000000
bignum_c:
    .quad 0, 0, 0, 0
df_src:
    .ascii "ABCDEFGH"
df_dst:
    .quad 0
fail_msg:
    .ascii "flags: FAIL at check "
fail_num:
    .ascii "??\n"
    fail_len = . - fail_msg

    .section .note.GNU-stack, "", @progbits
