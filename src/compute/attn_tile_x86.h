/* attn_tile_x86.h — L_compute: what the AVX2 and AVX-512 attention tile kernels share (attn_tile_avx2.c,
 * attn_tile_avx512.c): the transposition of cache rows into a [d][PB] float block. Include only from files compiled
 * with at least -mavx2 -mf16c. Internal to src/compute/. */
#ifndef FLM_COMPUTE_ATTN_TILE_X86_H
#define FLM_COMPUTE_ATTN_TILE_X86_H
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "compute/attention.h"

#define PB 16 /* cache rows per transposed block */
#define INLINE static inline __attribute__((always_inline))

/* c[k] = element i + k of f16 cache rows 0..7 at x (rows j >= nb read as zero), converted to float: an 8x8
 * transposition of halves (also attn_scores_f16's in kernels_avx2.c). */
INLINE void transpose8_f16(const uint16_t *x, size_t stride, size_t nb, size_t i, __m256 c[8]) {
    __m128i r[8], u[8];
    for (size_t j = 0; j < 8; j++)
        r[j] = j < nb ? _mm_loadu_si128((const __m128i *)(x + j * stride + i)) : _mm_setzero_si128();
    for (int j = 0; j < 4; j++) { /* pairs of rows interleaved: a0 b0 a1 b1 ... */
        u[2 * j] = _mm_unpacklo_epi16(r[2 * j], r[2 * j + 1]);
        u[2 * j + 1] = _mm_unpackhi_epi16(r[2 * j], r[2 * j + 1]);
    }
    /* quads: a0 b0 c0 d0 a1 b1 c1 d1 (rows 0-3) and e0 f0 g0 h0 ... (rows 4-7) */
    const __m128i q0 = _mm_unpacklo_epi32(u[0], u[2]), q1 = _mm_unpackhi_epi32(u[0], u[2]);
    const __m128i q2 = _mm_unpacklo_epi32(u[1], u[3]), q3 = _mm_unpackhi_epi32(u[1], u[3]);
    const __m128i q4 = _mm_unpacklo_epi32(u[4], u[6]), q5 = _mm_unpackhi_epi32(u[4], u[6]);
    const __m128i q6 = _mm_unpacklo_epi32(u[5], u[7]), q7 = _mm_unpackhi_epi32(u[5], u[7]);
    c[0] = _mm256_cvtph_ps(_mm_unpacklo_epi64(q0, q4)), c[1] = _mm256_cvtph_ps(_mm_unpackhi_epi64(q0, q4));
    c[2] = _mm256_cvtph_ps(_mm_unpacklo_epi64(q1, q5)), c[3] = _mm256_cvtph_ps(_mm_unpackhi_epi64(q1, q5));
    c[4] = _mm256_cvtph_ps(_mm_unpacklo_epi64(q2, q6)), c[5] = _mm256_cvtph_ps(_mm_unpackhi_epi64(q2, q6));
    c[6] = _mm256_cvtph_ps(_mm_unpacklo_epi64(q3, q7)), c[7] = _mm256_cvtph_ps(_mm_unpackhi_epi64(q3, q7));
}

/* Kt[(i + c) * PB + j0 + j] = element i + c of cache row j (j < nb; zero for nb <= j < 8), c < 8: rows j0..j0+7 of
 * the block, elements i..i+7. */
INLINE void transpose8(const void *X, uint32_t elem_bytes, size_t stride, size_t nb, size_t i, float *Kt) {
    __m256 c[8];
    if (elem_bytes == FLM_KV_F16) {
        transpose8_f16((const uint16_t *)X, stride, nb, i, c);
    } else {
        const float *x = X;
        __m256 r[8], t[8], s[8];
        for (size_t j = 0; j < 8; j++) r[j] = j < nb ? _mm256_loadu_ps(x + j * stride + i) : _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            t[2 * j] = _mm256_unpacklo_ps(r[2 * j], r[2 * j + 1]);
            t[2 * j + 1] = _mm256_unpackhi_ps(r[2 * j], r[2 * j + 1]);
        }
        for (int h = 0; h < 2; h++) { /* rows 4h..4h+3: elements (0,4), (1,5), (2,6), (3,7) of each lane half */
            s[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
            s[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
            s[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
            s[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
        }
        for (int j = 0; j < 4; j++) {
            c[j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x20);
            c[4 + j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x31);
        }
    }
    for (int j = 0; j < 8; j++) _mm256_store_ps(Kt + (i + (size_t)j) * PB, c[j]);
}

/* Kt[i * PB + j] = element i of cache row j of X for i < d (a multiple of 8), j < nb (<= PB); zero for j >= nb */
INLINE void transpose_block(const uint8_t *X, uint32_t elem_bytes, size_t stride, size_t nb, size_t d, float *Kt) {
    for (size_t i = 0; i < d; i += 8) {
        transpose8(X, elem_bytes, stride, nb, i, Kt);
        transpose8(X + 8 * stride * elem_bytes, elem_bytes, stride, nb > 8 ? nb - 8 : 0, i, Kt + 8);
    }
}

#endif
