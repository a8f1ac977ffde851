/* fuzz_common.h — helpers the libFuzzer targets of tests/fuzz share (header only: each target is one .c file).
 *
 * Every target defines LLVMFuzzerTestOneInput (and, when it needs one-time setup, LLVMFuzzerInitialize). The same
 * file links either with libFuzzer (clang, -fsanitize=fuzzer: the fuzz build) or with replay.c (any compiler: a
 * main() that feeds it the files of tests/fuzz/regress/ and tests/fuzz/seeds/, registered with CTest). A target
 * reports a finding by crashing: a sanitizer report, or fz_check()'s abort() for a broken invariant. */
#ifndef FLM_FUZZ_COMMON_H
#define FLM_FUZZ_COMMON_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* An invariant of the code under test: abort (a finding) with the message when it does not hold. */
#define fz_check(cond, ...)                                                                                        \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            fprintf(stderr, "fuzz: %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);                         \
            fprintf(stderr, __VA_ARGS__);                                                                          \
            fprintf(stderr, "\n");                                                                                 \
            abort();                                                                                               \
        }                                                                                                          \
    } while (0)

/* A file holding exactly data[0, size): one memfd per process, rewritten for each input, named by a /proc path so
 * code that opens files by name reads it (O_DIRECT is refused there: the buffered fallback is what runs). */
static inline const char *fz_file(const void *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("flashlm-fuzz", 0);
        if (fd < 0) { perror("memfd_create"); abort(); }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) { perror("ftruncate"); abort(); }
    const uint8_t *p = data;
    size_t off = 0;
    while (off < size) {
        ssize_t n = pwrite(fd, p + off, size - off, (off_t)off);
        if (n <= 0) { perror("pwrite"); abort(); }
        off += (size_t)n;
    }
    return path;
}

/* The cached path of a model pulled by `flashlm pull NAME` (as tests/testutil.c's tu_model), or NULL. */
static inline const char *fz_model(const char *name, char *buf, size_t cap) {
    const char *c = getenv("FLASHLM_CACHE"), *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (c && *c) snprintf(buf, cap, "%s/models/%s.gguf", c, name);
    else if (x && *x) snprintf(buf, cap, "%s/flashlm/models/%s.gguf", x, name);
    else snprintf(buf, cap, "%s/.cache/flashlm/models/%s.gguf", home ? home : "", name);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

/* Read little-endian integers from a byte cursor, 0 past the end. */
typedef struct { const uint8_t *p; size_t n, pos; } fz_bytes;
static inline uint32_t fz_u8(fz_bytes *b) { return b->pos < b->n ? b->p[b->pos++] : 0; }
static inline uint32_t fz_u16(fz_bytes *b) { uint32_t lo = fz_u8(b); return lo | fz_u8(b) << 8; }

#endif
