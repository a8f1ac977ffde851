/* quants_avxvnni.c — L_compute: the avxvnni level's kernels of the quantized types (AVX2 + FMA + F16C + AVX-VNNI,
 * the 256-bit VEX vpdpbusd / vpdpwssd of CPUs with or without AVX-512): quants_y256.h with one vpdpbusd per int8 x
 * int8 block sum and one vpdpwssd per scaled pair sum, the same bits as the avx2 level. Built with -mavx2 -mfma
 * -mf16c -mavxvnni (CMakeLists.txt); only called after kernels.c checked the CPU. See quants.h. */
#if defined(__x86_64__) && defined(FLM_HAVE_X86)

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__) || !defined(__AVXVNNI__)
#error "quants_avxvnni.c must be compiled with -mavx2 -mfma -mf16c -mavxvnni"
#endif

#define Y256_VNNI 1
#define Y256_FILL flm_quants_fill_avxvnni
#define TILE(name) name##_avxvnni
#include "compute/quants_y256.h"

#else
typedef int flm_quants_avxvnni_empty; /* ISO C wants at least one declaration in a translation unit */
#endif
