/* quants_dotprod.c — L_compute: the dotprod level's int8 dot products (quants_neon.h with FLM_NEON_SDOT: ARMv8.2-A
 * SDOT for the int8 products; built with -march=armv8.2-a+dotprod, called only when getauxval reports
 * HWCAP_ASIMDDP). The same integer sums and float operations as the neon level, so the same bits. See quants.h. */
#if defined(__aarch64__) && defined(FLM_HAVE_ARM64)
#ifndef __ARM_FEATURE_DOTPROD
#error "quants_dotprod.c must be compiled with -march=armv8.2-a+dotprod"
#endif
#define FLM_NEON_SDOT 1
#include "compute/quants_neon.h"

void flm_quants_fill_dotprod(flm_kernels *k) { quants_neon_fill(k); }
#else
typedef int flm_quants_dotprod_empty; /* ISO C wants at least one declaration in a translation unit */
#endif
