/* unit_hash_avx2.c — XXH3_64 with xxHash's AVX2 code (this file alone is built with -mavx2; flm_unit_hash calls it
 * only when the CPU has AVX2). */
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__AVX2__)
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

uint64_t flm_unit_hash_avx2(const void *p, size_t n);
uint64_t flm_unit_hash_avx2(const void *p, size_t n) { return XXH3_64bits(p, n); }
#endif
