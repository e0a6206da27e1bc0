/* Benchmark: a bytecode interpreter whose dispatch is a dense switch (one jump table, one
 * highly polymorphic indirect jmp), running a program with nested loops, arithmetic and
 * calls. argv[1] = outer iterations of the bytecode program (default 3 000). */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>

enum op {
    OP_PUSH, OP_LOAD, OP_STORE, OP_ADD, OP_SUB, OP_MUL, OP_XOR, OP_SHL, OP_SHR, OP_AND,
    OP_LT, OP_JMP, OP_JZ, OP_JNZ, OP_DUP, OP_OVER, OP_DROP, OP_CALL, OP_RET, OP_INC, OP_HALT,
};

struct insn {
    uint8_t op;
    int32_t arg;
};

/* vars: 0 = outer counter i, 1 = inner counter j, 2 = accumulator, 3 = outer limit.
 * for (i = 0; i < limit; i++) for (j = 0; j < 1000; j++) acc = ((acc + f(j)) & 0x7fffffff) ^ (i << 3); */
static const struct insn program[] = {
    /*  0 */ {OP_PUSH, 0}, {OP_STORE, 0},
    /*  2 outer head */ {OP_LOAD, 0}, {OP_LOAD, 3}, {OP_LT, 0}, {OP_JZ, 31},
    /*  6 */ {OP_PUSH, 0}, {OP_STORE, 1},
    /*  8 inner head */ {OP_LOAD, 1}, {OP_PUSH, 1000}, {OP_LT, 0}, {OP_JZ, 27},
    /* 12 */ {OP_LOAD, 2}, {OP_LOAD, 1}, {OP_CALL, 32}, {OP_ADD, 0}, {OP_PUSH, 0x7fffffff}, {OP_AND, 0},
    /* 18 */ {OP_LOAD, 0}, {OP_PUSH, 3}, {OP_SHL, 0}, {OP_XOR, 0}, {OP_STORE, 2},
    /* 23 */ {OP_LOAD, 1}, {OP_INC, 0}, {OP_STORE, 1}, {OP_JMP, 8},
    /* 27 inner exit */ {OP_LOAD, 0}, {OP_INC, 0}, {OP_STORE, 0}, {OP_JMP, 2},
    /* 31 outer exit */ {OP_HALT, 0},
    /* 32 f: [x] -> [((7x - (x >> 2)) ^ x) + (3 if odd)] */
    {OP_DUP, 0}, {OP_PUSH, 7}, {OP_MUL, 0}, {OP_OVER, 0}, {OP_PUSH, 2}, {OP_SHR, 0}, {OP_SUB, 0},
    /* 39 */ {OP_XOR, 0}, {OP_DUP, 0}, {OP_PUSH, 1}, {OP_AND, 0}, {OP_JZ, 46}, {OP_PUSH, 3}, {OP_ADD, 0},
    /* 46 */ {OP_RET, 0},
};

static int64_t run(const struct insn *code, int64_t limit, uint64_t *executed)
{
    int64_t stack[256], vars[4] = {0, 0, 12345, limit};
    int retstack[64];
    int sp = 0, rsp = 0, pc = 0;
    uint64_t n = 0;
    for (;;) {
        struct insn in = code[pc++];
        n++;
        switch (in.op) {
        case OP_PUSH: stack[sp++] = in.arg; break;
        case OP_LOAD: stack[sp++] = vars[in.arg]; break;
        case OP_STORE: vars[in.arg] = stack[--sp]; break;
        case OP_ADD: sp--; stack[sp - 1] += stack[sp]; break;
        case OP_SUB: sp--; stack[sp - 1] -= stack[sp]; break;
        case OP_MUL: sp--; stack[sp - 1] *= stack[sp]; break;
        case OP_XOR: sp--; stack[sp - 1] ^= stack[sp]; break;
        case OP_SHL: sp--; stack[sp - 1] = (int64_t)((uint64_t)stack[sp - 1] << (stack[sp] & 63)); break;
        case OP_SHR: sp--; stack[sp - 1] = (int64_t)((uint64_t)stack[sp - 1] >> (stack[sp] & 63)); break;
        case OP_AND: sp--; stack[sp - 1] &= stack[sp]; break;
        case OP_LT: sp--; stack[sp - 1] = stack[sp - 1] < stack[sp]; break;
        case OP_JMP: pc = in.arg; break;
        case OP_JZ: if (stack[--sp] == 0) pc = in.arg; break;
        case OP_JNZ: if (stack[--sp] != 0) pc = in.arg; break;
        case OP_DUP: stack[sp] = stack[sp - 1]; sp++; break;
        case OP_OVER: stack[sp] = stack[sp - 2]; sp++; break;
        case OP_DROP: sp--; break;
        case OP_CALL: retstack[rsp++] = pc; pc = in.arg; break;
        case OP_RET: pc = retstack[--rsp]; break;
        case OP_INC: stack[sp - 1]++; break;
        case OP_HALT: *executed = n; return vars[2];
        }
    }
}

int main(int argc, char **argv)
{
    long limit = argc > 1 ? strtol(argv[1], NULL, 10) : 3000;
    uint64_t executed = 0;
    int64_t acc = run(program, limit, &executed);
    printf("interp: limit %ld, acc %lld, %llu bytecodes executed\n", limit, (long long)acc,
           (unsigned long long)executed);
    return 0;
}
