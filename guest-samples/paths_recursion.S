/* Path-profiling sample with a fixed block layout: rsum(n) = n + rsum(n - 1), rsum(0) = 0, a
 * non-tail recursion (the addition happens after the call returns); _start calls rsum(DEPTH)
 * CALLS times. Blocks of rsum: A = rsum (test; jz), B = .Lrec (push; dec; call rsum),
 * C = .Lafter (pop; add; ret), D = .Lbase (xor; ret). A call does not end the caller's path
 * (its next block is the return point, C), so every activation runs exactly one Ball-Larus
 * path, from its entry to its return:
 *   [A, B, C]  entry -> exit   DEPTH per call  (n = DEPTH .. 1)   = 200
 *   [A, D]     entry -> exit   1 per call      (n = 0)            = 4
 * The shadow stack reaches DEPTH + 1 frames of rsum under _start, and every return matches
 * its call (no resynchronisation). */
#define DEPTH 50
#define CALLS 4
    .text
    .globl _start
    .type rsum, @function
rsum:
    test %rdi, %rdi
    jz .Lbase
.Lrec:
    push %rdi
    dec %rdi
    call rsum
.Lafter:
    pop %rdi
    add %rdi, %rax
    ret
.Lbase:
    xor %eax, %eax
    ret
    .size rsum, .-rsum

    .type _start, @function
_start:
    mov $CALLS, %r12d
1:  mov $DEPTH, %edi
    call rsum
    cmp $DEPTH * (DEPTH + 1) / 2, %rax
    jne 2f
    dec %r12d
    jnz 1b
    mov $60, %eax
    xor %edi, %edi
    syscall
2:  mov $60, %eax
    mov $1, %edi
    syscall
    .size _start, .-_start
