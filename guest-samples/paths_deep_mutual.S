/* Mutual recursion deeper than the calling-context tree tells frames apart (128 frames): f and
 * g call each other DEPTH deep, CALLS times from _start. Past the depth cap every frame shares
 * one `[deeper]` context: activations of f and g alternate there, and must not count their
 * paths into each other's counters; the profile must be the per-block reference's
 * (tests/tests/paths.rs). Exit status: the sum of the results, mod 128. */
#define DEPTH 300
#define CALLS 200
    .text
    .globl _start
    .type f, @function
f:
    push %rbx
    mov %rdi, %rbx
    mov $1, %eax
    test %rdi, %rdi
    jz .Lf_done
    lea -1(%rdi), %rdi
    call g
    add %rbx, %rax
.Lf_done:
    pop %rbx
    ret
    .size f, .-f

    .type g, @function
g:
    push %rbx
    mov %rdi, %rbx
    mov $2, %eax
    test %rdi, %rdi
    jz .Lg_done
    lea -1(%rdi), %rdi
    call f
    lea (%rax,%rax,2), %rax
    add %rbx, %rax
.Lg_done:
    pop %rbx
    ret
    .size g, .-g

_start:
    mov $CALLS, %r12
    xor %r13, %r13
.Lloop:
    mov $DEPTH, %rdi
    call f
    add %rax, %r13
    dec %r12
    jnz .Lloop
    mov %r13, %rdi
    and $0x7f, %rdi
    mov $60, %eax
    syscall
