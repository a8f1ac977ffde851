/* quants_neon.c — L_compute: the neon level's int8 dot products and activation quantizers (quants_neon.h compiled
 * for ARMv8.0-A Advanced SIMD). See quants.h. */
#if defined(__aarch64__) && defined(FLM_HAVE_ARM64)
#include "compute/quants_neon.h"

void flm_quants_fill_neon(flm_kernels *k) { quants_neon_fill(k); }
#else
typedef int flm_quants_neon_empty; /* ISO C wants at least one declaration in a translation unit */
#endif
