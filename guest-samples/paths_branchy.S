/* Path-profiling sample with a fixed block layout: branchy(n) runs a loop whose body takes
 * the `then` side 3 times in 4 ((i & 3) != 3) and the `else` side once in 4; _start calls it
 * CALLS times with n = N. Expected Ball-Larus paths per call (blocks: H = .Lhead,
 * T = .Lthen, J = .Ljoin, E = .Lelse (falls into the join), R = .Lret):
 *   [branchy(entry..je), T, J] entry -> back edge   1
 *   [H, T, J]                  back edge -> back     749   (i = 1..998, i & 3 != 3)
 *   [H, E]                     back edge -> back     249   (i = 3, 7, .., 995)
 *   [H, E, R]                  back edge -> exit     1     (i = 999)
 */
#define N 1000
#define CALLS 10
    .text
    .globl _start
    .type branchy, @function
branchy:
    xor %ecx, %ecx
    xor %edx, %edx
.Lhead:
    mov %ecx, %eax
    and $3, %eax
    cmp $3, %eax
    je .Lelse
.Lthen:
    add %rcx, %rdx
    jmp .Ljoin
.Lelse:
    xor %rcx, %rdx
.Ljoin:
    inc %rcx
    cmp %rdi, %rcx
    jl .Lhead
.Lret:
    mov %rdx, %rax
    ret
    .size branchy, .-branchy

    .type _start, @function
_start:
    mov $CALLS, %r12d
1:  mov $N, %edi
    call branchy
    dec %r12d
    jnz 1b
    mov $60, %eax
    xor %edi, %edi
    syscall
    .size _start, .-_start
