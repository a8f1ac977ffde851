/* unit_hash.h — the record sum of checked reads (docs/IO.md, "Checked reads"; docs/FORMAT.md, "Record sums"): XXH3_64
 * (seed 0) of one unit's bytes. The reader (io/reader.c) and the FFN kernels that check records right before their
 * first use (compute/ffn_bundle.c) hash with it, so both compare against the sums the .flm writer stored. */
#ifndef FLM_CORE_UNIT_HASH_H
#define FLM_CORE_UNIT_HASH_H
#include <stddef.h>
#include <stdint.h>

/* XXH3_64bits(p, n) with seed 0, bit for bit libxxhash's, computed by xxHash's inlined code built for the best
 * vector unit the CPU has (x86-64: AVX2 where cpuid and the OS allow it, else SSE2): measured inside the FFN kernel
 * on Qwen2.5-Coder-1.5B's records, a third of the time of libxxhash's XXH3_64bits_dispatch (unit_hash.c). n may be
 * 0 (p then unused). Thread-safe. */
uint64_t flm_unit_hash(const void *p, size_t n);

#endif
