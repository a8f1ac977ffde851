/* quants_vnni.c — L_compute: the vnni level's int8 dot products (AVX-512 VNNI: vpdpwssd for the K-quants' int16 pair
 * sums times their scales, one instruction where avx512 takes two: q6_k), the kernels of quants_x512.h. Built with -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl
 * -mavx512vnni (CMakeLists.txt); only called after kernels.c checked the CPU. See quants.h. */
#if defined(__x86_64__) && defined(FLM_HAVE_X86)

#if !defined(__AVX512VNNI__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__FMA__) || !defined(__F16C__)
#error "quants_vnni.c must be compiled with -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni"
#endif

#include <immintrin.h>

#define DPWSSD(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))
#define X512(name) name##_vnni
#define X512_FILL flm_quants_fill_vnni
/* the tiled dots of a batch (quants_tile_x86.h): 8 tokens per micro-tile with 32 vector registers */
#define TILE_T 8
#define TILE_J_UNROLL 4
#define MADDS(acc, p, s) _mm256_dpwssd_epi32((acc), (p), (s))
#define TILE(name) name##_vnni_tile
#include "compute/quants_tile_x86.h"
/* the 32-element types' batches: panels of 16 interleaved rows, vpdpbusd (quants_panel_vnni.h) */
#include "compute/quants_panel_vnni.h"
/* their batches of 2 to 8 tokens: the rows as stored, no repack (quants_rows_vnni.h) */
#include "compute/quants_rows_vnni.h"
static void panel_rows_fill(flm_kernels *k) {
    panel_fill(k);
    rows_fill(k);
}
#define X512_PANEL_FILL panel_rows_fill
#define X512_SB_ORDER /* q6_k's vec_dot in the panels' float order (quants_panel_vnni.h) */
#include "compute/quants_x512.h"

#else
typedef int flm_quants_vnni_empty; /* ISO C wants at least one declaration in a translation unit */
#endif
