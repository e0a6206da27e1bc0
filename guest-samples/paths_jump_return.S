/* Path-profiling sample for the memoised recorder's validity rule after an indirect jump: a
 * jump to the current activation's return address is a return, wherever else the same jump
 * from the same path prefix was a step inside the function.
 *
 * f(n): for n > 0 it calls f(n - 1) and resumes at .Lresume (pop; ret). The leaf, f(0), spins
 * SPIN times, then drops its return address and jumps to .Lresume itself (`jmp *%rcx`), which
 * pops its caller's register and returns for it. _start alternates two ways in:
 *  - f(0) under a frame made to look like f(1)'s: the leaf's jump to .Lresume goes to a block
 *    of f that is not its return address, so its path goes on there (and `ret` returns to
 *    _start, the activation's return address);
 *  - f(1): the leaf's jump to .Lresume is its return to f(1)'s frame.
 * Both leaves reach the jump along the same path, so a transition remembered from the first
 * must not be replayed in the second. */
#define ROUNDS 400
#define SPIN 20
    .text
    .globl _start
    .type f, @function
f:
    push %rbx
    mov %rdi, %rbx
    test %rdi, %rdi
    jz .Lleaf
    lea -1(%rdi), %rdi
    call f
.Lresume:
    pop %rbx
    ret
.Lleaf:
    mov $SPIN, %ecx
1:  dec %ecx
    jnz 1b
    pop %rbx
    add $8, %rsp
    lea .Lresume(%rip), %rcx
    jmp *%rcx
    .size f, .-f

    .type _start, @function
_start:
    mov $ROUNDS, %r12d
2:  lea 3f(%rip), %rax
    push %rax
    push %rbx
    xor %edi, %edi
    call f
3:  mov $1, %edi
    call f
    dec %r12d
    jnz 2b
    mov $60, %eax
    xor %edi, %edi
    syscall
    .size _start, .-_start
