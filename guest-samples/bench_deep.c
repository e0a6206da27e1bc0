/* Benchmark: deep recursion — a recursive walk down a 100,000-node linked list (as deep as the
 * list), a binary tree built and summed recursively, and Ackermann(2, n): tens of millions of
 * calls and returns whose return addresses run thousands of frames deep. argv[1] = scale
 * (default 300: list walks, tree rounds and the Ackermann argument grow with it). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

struct node {
    struct node *next;
    uint64_t value;
};

struct tree {
    struct tree *left, *right;
    uint64_t value;
};

__attribute__((noinline)) static uint64_t list_sum(const struct node *n, uint64_t depth)
{
    if (!n)
        return depth;
    return n->value + list_sum(n->next, depth + 1) * 3;
}

__attribute__((noinline)) static struct tree *build(unsigned depth, uint64_t *seed)
{
    struct tree *t = malloc(sizeof *t);
    if (!t)
        abort();
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    t->value = *seed >> 40;
    t->left = depth ? build(depth - 1, seed) : NULL;
    t->right = depth ? build(depth - 1, seed) : NULL;
    return t;
}

__attribute__((noinline)) static uint64_t tree_sum(const struct tree *t)
{
    if (!t)
        return 0;
    return t->value + 2 * tree_sum(t->left) + tree_sum(t->right);
}

__attribute__((noinline)) static void tree_free(struct tree *t)
{
    if (!t)
        return;
    tree_free(t->left);
    tree_free(t->right);
    free(t);
}

__attribute__((noinline)) static uint64_t ackermann(uint64_t m, uint64_t n)
{
    if (m == 0)
        return n + 1;
    if (n == 0)
        return ackermann(m - 1, 1);
    return ackermann(m - 1, ackermann(m, n - 1));
}

int main(int argc, char **argv)
{
    unsigned scale = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 300;
    enum { LIST = 100000 };
    struct node *nodes = malloc(LIST * sizeof *nodes);
    if (!nodes)
        return 1;
    for (unsigned i = 0; i < LIST; i++) {
        nodes[i].next = i + 1 < LIST ? &nodes[i + 1] : NULL;
        nodes[i].value = i * 2654435761u % 1000;
    }
    uint64_t l = 0;
    for (unsigned r = 0; r < scale; r++)
        l ^= list_sum(&nodes[r % 100], r);
    uint64_t t = 0, seed = 7;
    for (unsigned r = 0; r < 1 + scale / 10; r++) {
        struct tree *tree = build(16, &seed);
        t += tree_sum(tree);
        tree_free(tree);
    }
    uint64_t a = ackermann(2, 10ull * scale);
    printf("deep: scale %u, list %016llx, tree %llu, ackermann(2, %u) = %llu\n", scale,
           (unsigned long long)l, (unsigned long long)t, 10 * scale, (unsigned long long)a);
    free(nodes);
    return 0;
}
