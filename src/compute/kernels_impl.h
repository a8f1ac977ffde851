/* kernels_impl.h — L_compute: how kernels.c reaches the per-ISA kernel tables. Internal to src/compute/. */
#ifndef FLM_COMPUTE_KERNELS_IMPL_H
#define FLM_COMPUTE_KERNELS_IMPL_H
#include "compute/kernels.h"

#if defined(__x86_64__) && defined(FLM_HAVE_X86)
/* The AVX2+FMA+F16C table (kernels_avx2.c, compiled with -mavx2 -mfma -mf16c). Returns it unconditionally: the
 * caller must have checked that the CPU supports those extensions before calling any of its functions. */
const flm_kernels *flm_kernels_avx2_table(void);
#endif

#if defined(__aarch64__) && defined(FLM_HAVE_ARM64)
/* The NEON table (kernels_neon.c, ARMv8.0-A Advanced SIMD) and the dot-product one (its copy with quants_dotprod.c's
 * SDOT kernels). Returned unconditionally: the caller checks the CPU (flm_cpu_arm_caps) first. */
const flm_kernels *flm_kernels_neon_table(void);
#endif

#endif
