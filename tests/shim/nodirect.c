/* nodirect.c — an LD_PRELOAD shim for tests: every open with O_DIRECT fails with EINVAL, as on a file system that
 * refuses direct I/O (tmpfs before Linux 6.6, some FUSE and network file systems), so the reader's fallback to
 * buffered reads can be tested on any machine (tests/test_cli_hardening.c). */
#undef _FILE_OFFSET_BITS /* define open and open64 both, not one as the other */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/types.h>

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

#define OPEN_SHIM(name)                                                                                            \
    int name(const char *path, int flags, ...) {                                                                   \
        va_list ap;                                                                                                \
        va_start(ap, flags);                                                                                       \
        mode_t m = mode_arg(flags, ap);                                                                            \
        va_end(ap);                                                                                                \
        if (flags & O_DIRECT) { errno = EINVAL; return -1; }                                                       \
        static open_fn next;                                                                                       \
        if (!next) next = (open_fn)dlsym(RTLD_NEXT, #name);                                                        \
        return next(path, flags, m);                                                                               \
    }
#define OPENAT_SHIM(name)                                                                                          \
    int name(int dir, const char *path, int flags, ...) {                                                          \
        va_list ap;                                                                                                \
        va_start(ap, flags);                                                                                       \
        mode_t m = mode_arg(flags, ap);                                                                            \
        va_end(ap);                                                                                                \
        if (flags & O_DIRECT) { errno = EINVAL; return -1; }                                                       \
        static openat_fn next;                                                                                     \
        if (!next) next = (openat_fn)dlsym(RTLD_NEXT, #name);                                                      \
        return next(dir, path, flags, m);                                                                          \
    }

OPEN_SHIM(open)
OPEN_SHIM(open64)
OPENAT_SHIM(openat)
OPENAT_SHIM(openat64)
