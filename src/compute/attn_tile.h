/* attn_tile.h — L_compute: the tile kernels of a batch's attention (kernels.h flm_attn_scores_tile_fn /
 * flm_attn_values_tile_fn), per ISA. Internal to src/compute/. */
#ifndef FLM_COMPUTE_ATTN_TILE_H
#define FLM_COMPUTE_ATTN_TILE_H
#include "compute/kernels.h"

/* Sets k->attn_scores_tile and k->attn_values_tile to the scalar reference (attn_tile.c). */
void flm_attn_tile_fill_scalar(flm_kernels *k);
/* The scalar reference kernels themselves (the SIMD ones fall back to them for a head_dim that is not a multiple of
 * 8). */
void flm_attn_scores_tile_ref(const float *const *q, size_t n_rows, const void *K, uint32_t elem_bytes, size_t stride,
                              size_t n, size_t d, float scale, float *const *out);
void flm_attn_values_tile_ref(const float *const *w, size_t n_rows, const void *V, uint32_t elem_bytes, size_t stride,
                              size_t n, size_t d, float *const *o);
#if defined(__x86_64__) && defined(FLM_HAVE_X86)
/* The AVX2 + FMA + F16C tile kernels (attn_tile_avx2.c); call only once the CPU is known to have them. */
void flm_attn_tile_fill_avx2(flm_kernels *k);
void flm_attn_scores_tile_avx2(const float *const *q, size_t n_rows, const void *K, uint32_t elem_bytes, size_t stride,
                               size_t n, size_t d, float scale, float *const *out);
void flm_attn_values_tile_avx2(const float *const *w, size_t n_rows, const void *V, uint32_t elem_bytes, size_t stride,
                               size_t n, size_t d, float *const *o);
/* The AVX-512 F/BW/VL ones (attn_tile_avx512.c); call only once the CPU is known to have them. */
void flm_attn_tile_fill_avx512(flm_kernels *k);
#endif

#endif
