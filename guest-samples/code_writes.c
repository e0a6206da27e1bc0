/* Code changed without a store the translator's write fault sees (issue #24, "code writes are
 * seen"): each case puts `mov eax, 1; ret` somewhere, calls it (so a translator translates
 * it), changes it to `mov eax, 2; ret` (or takes it away) through one channel, calls it again
 * and prints both results and the channel's return value. Run as `code_writes CASE`:
 *
 *   store          a plain store into the RWX page (the control: the write fault sees it)
 *   procmem-rwx    pwrite(2) to /proc/self/mem over an RWX page
 *   procmem-text   pwrite(2) to /proc/self/mem over the program's own text (read-only, RX)
 *   procmem-write  lseek(2) + write(2) to /proc/thread-self/mem over an RWX page
 *   procmem-pid    pwritev(2) to /proc/<pid>/mem, through a dup(2) of the fd, over an RWX page
 *   vm-writev      process_vm_writev(2) to the process itself of a header into a data buffer
 *                  and the code over an RWX page (one call)
 *   readv-pipe     readv(2) of a page-long header and the code (two pipe buffers) into a data
 *                  buffer and an RWX page
 *   recv-dgram     recv(2) of a datagram holding the code into an RWX page
 *   madvise-anon   madvise(MADV_DONTNEED) of the RWX page, then new code stored into it
 *   madvise-file   madvise(MADV_DONTNEED) of a private RWX file page holding code stored over
 *                  the file's: the page reads as the file again, so the file's code runs
 *   same-block     code in an RWX page that stores into its own next instruction (the
 *                  immediate of a `mov`) and then runs it: the CPU runs the stored bytes, also
 *                  the first time, with a loop around it and in a page whose code ran before
 *
 * After the change, the RWX cases store `mov eax, 3; ret` and call once more: the page must be
 * as writable as the program made it. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

typedef int (*fn_t)(void);

/* mov eax, N; ret */
static const uint8_t RET1[] = { 0xb8, 1, 0, 0, 0, 0xc3 };
static const uint8_t RET2[] = { 0xb8, 2, 0, 0, 0, 0xc3 };
static const uint8_t RET3[] = { 0xb8, 3, 0, 0, 0, 0xc3 };

/* A function in the program's text, `mov eax, 1; ret`, padded so a rewrite stays inside it. */
__asm__(".text\n"
        ".globl text_fn\n"
        ".p2align 4\n"
        "text_fn:\n"
        "  mov $1, %eax\n"
        "  ret\n"
        "  .fill 10, 1, 0xcc\n");
int text_fn(void);

static uint8_t *rwx_page(void)
{
    uint8_t *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    memcpy(page, RET1, sizeof RET1);
    return page;
}

static int open_mem(const char *path)
{
    int fd = open(path, O_RDWR);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    return fd;
}

static void report(const char *name, int before, long ret, int after)
{
    printf("%s: before %d, call returned %ld, after %d\n", name, before, ret, after);
}

/* mov byte [rip + 1], dil   (patches the imm8 below: the store's next instruction)
 * mov al, 0                  (b0 imm8)
 * ret
 * Returns the byte it was called with, since the CPU runs the bytes as stored. */
static const uint8_t PATCH_NEXT[] = { 0x40, 0x88, 0x3d, 0x01, 0, 0, 0, 0xb0, 0x00, 0xc3 };

/* mov ecx, edi; xor eax, eax
 * loop: mov byte [rip + 1], cl; add al, 0; dec ecx; jnz loop; ret
 * (each iteration stores the counter into its own `add` immediate, then runs it: the sum of
 * n, n-1, ..., 1 as a byte) */
static const uint8_t PATCH_LOOP[] = { 0x89, 0xf9, 0x31, 0xc0,
                                      0x88, 0x0d, 0x01, 0, 0, 0,
                                      0x04, 0x00,
                                      0xff, 0xc9,
                                      0x75, 0xf4,
                                      0xc3 };

static int same_block(void)
{
    uint8_t *page = rwx_page();
    memcpy(page, PATCH_NEXT, sizeof PATCH_NEXT);
    int (*patch)(int) = (int (*)(int))page;
    int a = patch(5) & 0xff, b = patch(9) & 0xff;
    memcpy(page + 64, PATCH_LOOP, sizeof PATCH_LOOP);
    int (*loop)(int) = (int (*)(int))(page + 64);
    int c = loop(10) & 0xff, d = loop(4) & 0xff;
    printf("same-block: %d %d, loop %d %d\n", a, b, c, d);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: code_writes CASE\n");
        return 2;
    }
    const char *c = argv[1];
    if (strcmp(c, "same-block") == 0)
        return same_block();
    /* Through a volatile pointer: the compiler must call what is in memory. */
    fn_t volatile f;
    if (strcmp(c, "procmem-text") == 0) {
        f = text_fn;
        int before = f();
        int fd = open_mem("/proc/self/mem");
        long r = pwrite(fd, RET2, sizeof RET2, (off_t)(uintptr_t)text_fn);
        report(c, before, r, f());
        return 0;
    }
    if (strcmp(c, "madvise-file") == 0) {
        int fd = memfd_create("code", 0);
        if (fd < 0 || write(fd, RET2, sizeof RET2) != (ssize_t)sizeof RET2 ||
            ftruncate(fd, 4096) != 0) {
            perror("memfd");
            return 1;
        }
        uint8_t *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE, fd, 0);
        if (page == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        memcpy(page, RET1, sizeof RET1);
        f = (fn_t)page;
        int before = f();
        long r = madvise(page, 4096, MADV_DONTNEED);
        report(c, before, r, f());
        return 0;
    }
    uint8_t *page = rwx_page();
    f = (fn_t)page;
    int before = f();
    long r;
    if (strcmp(c, "store") == 0) {
        memcpy(page, RET2, sizeof RET2);
        r = 0;
    } else if (strcmp(c, "procmem-rwx") == 0) {
        int fd = open_mem("/proc/self/mem");
        r = pwrite(fd, RET2, sizeof RET2, (off_t)(uintptr_t)page);
    } else if (strcmp(c, "procmem-write") == 0) {
        int fd = open_mem("/proc/thread-self/mem");
        if (lseek(fd, (off_t)(uintptr_t)page, SEEK_SET) < 0) {
            perror("lseek");
            return 1;
        }
        r = write(fd, RET2, sizeof RET2);
    } else if (strcmp(c, "procmem-pid") == 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/mem", (int)getpid());
        int fd = dup(open_mem(path));
        struct iovec iov[2] = { { (void *)RET2, 1 }, { (void *)(RET2 + 1), sizeof RET2 - 1 } };
        r = pwritev(fd, iov, 2, (off_t)(uintptr_t)page);
    } else if (strcmp(c, "vm-writev") == 0) {
        static char header[4];
        struct iovec local[2] = { { "CODE", 4 }, { (void *)RET2, sizeof RET2 } };
        struct iovec remote[2] = { { header, sizeof header }, { page, sizeof RET2 } };
        r = process_vm_writev(getpid(), local, 2, remote, 2, 0);
    } else if (strcmp(c, "readv-pipe") == 0) {
        int fds[2];
        static char header[4096];
        if (pipe(fds) != 0 || write(fds[1], header, sizeof header) != (ssize_t)sizeof header ||
            write(fds[1], RET2, sizeof RET2) != (ssize_t)sizeof RET2) {
            perror("pipe");
            return 1;
        }
        struct iovec iov[2] = { { header, sizeof header }, { page, sizeof RET2 } };
        r = readv(fds[0], iov, 2);
    } else if (strcmp(c, "recv-dgram") == 0) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) != 0 ||
            send(sv[1], RET2, sizeof RET2, 0) != (ssize_t)sizeof RET2) {
            perror("socketpair");
            return 1;
        }
        r = recv(sv[0], page, 64, MSG_DONTWAIT);
    } else if (strcmp(c, "madvise-anon") == 0) {
        r = madvise(page, 4096, MADV_DONTNEED);
        if (page[0] != 0) {
            printf("%s: the page still holds code after MADV_DONTNEED\n", c);
            return 1;
        }
        memcpy(page, RET2, sizeof RET2);
    } else {
        fprintf(stderr, "unknown case %s\n", c);
        return 2;
    }
    report(c, before, r, f());
    memcpy(page, RET3, sizeof RET3);
    printf("%s: then stored, %d\n", c, f());
    return 0;
}
