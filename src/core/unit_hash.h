/* unit_hash.h — the record sum of checked reads (docs/IO.md, "Checked reads"; docs/FORMAT.md, "Record sums"): XXH3_64
 * (seed 0) of one unit's bytes, through libxxhash's run-time dispatch where it has one (x86-64: AVX2 where the CPU has
 * it, about twice SSE2's speed). The reader (io/reader.c) and the FFN kernels that check records right before their
 * first use (compute/ffn_bundle.c) hash with this, so both compare against the same stored sums. */
#ifndef FLM_CORE_UNIT_HASH_H
#define FLM_CORE_UNIT_HASH_H
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#define FLM_UNIT_HASH_DISPATCH 1
#endif
#endif

/* XXH3_64bits(p, n) with seed 0: the value the .flm writer stores per record and per token-embedding row. */
static inline uint64_t flm_unit_hash(const void *p, size_t n) {
#ifdef FLM_UNIT_HASH_DISPATCH
    return XXH3_64bits_dispatch(p, n);
#else
    return XXH3_64bits(p, n);
#endif
}

#endif
