/* corrupt.c — an LD_PRELOAD shim for tests: one pread(2) of the file whose path ends in $FLM_SHIM_CORRUPT_FILE that
 * delivers the byte at file offset $FLM_SHIM_CORRUPT_AT gets that byte flipped, once (a transient corruption on the
 * way from the device), so that the reader's checked reads can be seen to read it again (tests/test_checked_reads.c;
 * the CLI is run with --io threads: io_uring's reads do not go through pread). */
#undef _FILE_OFFSET_BITS /* define pread and pread64 both, not one as the other */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
static atomic_int done;

static void maybe_corrupt(int fd, void *buf, ssize_t got, off_t off) {
    const char *file = getenv("FLM_SHIM_CORRUPT_FILE"), *at_s = getenv("FLM_SHIM_CORRUPT_AT");
    if (got <= 0 || !file || !at_s || atomic_load(&done)) return;
    long long at = atoll(at_s);
    if (at < (long long)off || at >= (long long)off + got) return;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = 0;
    size_t lf = strlen(file);
    if ((size_t)n < lf || strcmp(path + n - lf, file) != 0) return;
    if (atomic_exchange(&done, 1)) return;
    ((unsigned char *)buf)[at - off] ^= 0x5a;
}

#define PREAD_SHIM(name)                                                                                           \
    ssize_t name(int fd, void *buf, size_t n, off_t off) {                                                         \
        static pread_fn next;                                                                                      \
        if (!next) next = (pread_fn)dlsym(RTLD_NEXT, #name);                                                       \
        ssize_t got = next(fd, buf, n, off);                                                                       \
        maybe_corrupt(fd, buf, got, off);                                                                          \
        return got;                                                                                                \
    }

PREAD_SHIM(pread)
PREAD_SHIM(pread64)
