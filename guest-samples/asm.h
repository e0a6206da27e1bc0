/* Shared definitions for the freestanding assembly guest samples (-nostdlib, raw syscalls).
 * Only rip-relative addressing is used, so the same source links as static and static-pie
 * without any run-time relocation. */
#ifndef HOTPATH_SAMPLES_ASM_H
#define HOTPATH_SAMPLES_ASM_H

#define SYS_write 1
#define SYS_getpid 39
#define SYS_exit 60
#define SYS_arch_prctl 158
#define SYS_exit_group 231
#define ARCH_GET_FS 0x1003

/* Arithmetic flags as pushfq reports them: CF PF AF ZF SF OF. */
#define FLAGS_ARITH 0x8d5
#define FL_CF 0x001
#define FL_PF 0x004
#define FL_AF 0x010
#define FL_ZF 0x040
#define FL_SF 0x080
#define FL_DF 0x400
#define FL_OF 0x800

/* A label the profile can name: a global function symbol, so hotpath's report calls a block
 * starting here `name` (the count samples find their blocks this way). */
.macro block_label name
    .globl \name
    .type \name, @function
\name:
.endm

/* write(1, label, len); clobbers rax, rdi, rsi, rdx, rcx, r11. */
.macro write_stdout label, len
    mov $SYS_write, %eax
    mov $1, %edi
    lea \label(%rip), %rsi
    mov $\len, %edx
    syscall
.endm

/* exit_group(code in %edi). */
.macro exit_group_edi
    mov $SYS_exit_group, %eax
    syscall
    ud2
.endm

/* The end of a sample that checks its own sums: write ok_msg and exit 0; from the label
 * `wrong` (which the checks jump to), write wrong_msg and exit 1. The sample defines ok_msg,
 * ok_len, wrong_msg and wrong_len. */
.macro exit_ok_or_wrong
    write_stdout ok_msg, ok_len
    xor %edi, %edi
    exit_group_edi
wrong:
    write_stdout wrong_msg, wrong_len
    mov $1, %edi
    exit_group_edi
.endm

/* Store the two decimal digits of %eax (0..99) at label and label+1; clobbers eax, ecx, edx. */
.macro two_digits label
    xor %edx, %edx
    mov $10, %ecx
    div %ecx
    add $'0', %al
    add $'0', %dl
    movb %al, \label(%rip)
    movb %dl, \label+1(%rip)
.endm

#endif
