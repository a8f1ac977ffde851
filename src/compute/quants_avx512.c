/* quants_avx512.c — L_compute: the avx512 level's int8 dot products (AVX-512 F/BW/VL, 512-bit maddubs + madd: q6_k), the
 * kernels of quants_x512.h. Built with -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl (CMakeLists.txt); only
 * called after kernels.c checked the CPU (flm_kernels_cpu_level). See quants.h. */
#if defined(__x86_64__) && defined(FLM_HAVE_X86)

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__FMA__) || !defined(__F16C__)
#error "quants_avx512.c must be compiled with -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl"
#endif

#include <immintrin.h>

#define DPWSSD(acc, a, b) _mm512_add_epi32((acc), _mm512_madd_epi16((a), (b)))
#define X512(name) name##_avx512
#define X512_FILL flm_quants_fill_avx512
/* the tiled dots of a batch (quants_tile_x86.h): 8 tokens per micro-tile with 32 vector registers */
#define TILE_T 8
#define TILE_J_UNROLL 4
#define MADDS(acc, p, s) _mm256_add_epi32((acc), _mm256_madd_epi16((p), (s)))
#define TILE(name) name##_avx512_tile
#include "compute/quants_tile_x86.h"
#include "compute/quants_x512.h"

#else
typedef int flm_quants_avx512_empty; /* ISO C wants at least one declaration in a translation unit */
#endif
