/* Path-profiling sample for a call whose callee runs no translated block: `f` calls the
 * vsyscall page's `time` entry, which the kernel (and hotpath) carries out itself and returns
 * from. _start calls f ROUNDS times. The calling-context tree is _start's activation and f
 * under it, nothing under f: each round runs _start's loop block and f's two blocks (its
 * body up to the call, then the `ret` after it). Where the kernel maps no vsyscall page
 * (vsyscall=none) the call faults natively: the test then skips. */
#define ROUNDS 1000
    .text
    .globl _start
_start:
    mov $ROUNDS, %r12
1:  call f
    dec %r12
    jnz 1b
    mov $60, %eax
    xor %edi, %edi
    syscall

    .type f, @function
f:
    xor %edi, %edi
    mov $0xffffffffff600400, %rax
    call *%rax
    ret
