/* quants_avx2.c — L_compute: the avx2 level's kernels of the quantized types (AVX2 + FMA + F16C): quants_y256.h
 * with vpmaddubsw + vpmaddwd for the int8 products. Built with -mavx2 -mfma -mf16c (CMakeLists.txt); only called
 * after kernels.c checked the CPU. See quants.h. */
#if defined(__x86_64__) && defined(FLM_HAVE_X86)

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "quants_avx2.c must be compiled with -mavx2 -mfma -mf16c"
#endif

#define Y256_VNNI 0
#define Y256_FILL flm_quants_fill_avx2
#define TILE(name) name##_avx2
#include "compute/quants_y256.h"

#else
typedef int flm_quants_avx2_empty; /* ISO C wants at least one declaration in a translation unit */
#endif
