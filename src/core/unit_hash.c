/* unit_hash.c — flm_unit_hash: xxHash's XXH3_64 inlined here (XXH_INLINE_ALL: static copies, no clash with
 * libxxhash), its vector code chosen once per process. Measured (docs/IO.md, "Checked reads": the FFN kernels hash
 * each 3360-byte record right before its gate dot): libxxhash's XXH3_64bits_dispatch added 2.5-3.0 ms of thread CPU
 * per 28.7 MiB layer to a 4.3-5.1 ms kernel, the inlined AVX2 code 0.7-0.9 ms (the AVX-512 build of the same code
 * 0.8-1.1 ms, so it is not used). The result is the same XXH3_64 whatever the vector code. */
#include "core/unit_hash.h"

#include <stdatomic.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

typedef uint64_t (*unit_hash_fn)(const void *p, size_t n);

/* the build's default vector code (x86-64: SSE2) */
static uint64_t unit_hash_default(const void *p, size_t n) { return XXH3_64bits(p, n); }

#if defined(__x86_64__) && defined(__GNUC__)
uint64_t flm_unit_hash_avx2(const void *p, size_t n); /* unit_hash_avx2.c, built with -mavx2 */
#endif

static unit_hash_fn pick(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) return flm_unit_hash_avx2; /* cpuid, and the OS saves the ymm state */
#endif
    return unit_hash_default;
}

static _Atomic(unit_hash_fn) g_fn; /* chosen on the first call (threads racing to it choose the same) */

uint64_t flm_unit_hash(const void *p, size_t n) {
    unit_hash_fn f = atomic_load_explicit(&g_fn, memory_order_relaxed);
    if (!f) {
        f = pick();
        atomic_store_explicit(&g_fn, f, memory_order_relaxed);
    }
    return f(p, n);
}
