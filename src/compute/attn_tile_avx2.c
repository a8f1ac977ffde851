/* attn_tile_avx2.c — L_compute: the attention tile kernels (kernels.h flm_attn_scores_tile_fn /
 * flm_attn_values_tile_fn) in AVX2 + F16C, for a batch's query rows that share a KV head (attention_batch.c).
 *
 * Scores: 16 cache rows at a time are transposed (and widened from f16) once into a [d][16] float block on the stack,
 * then 4 query rows at a time run 8 independent accumulators, lane j summing position j over i = 0, 1, ... as the
 * scalar loop does. Values: 16 elements of 4 rows at a time, each lane summing over positions in order. Products and
 * sums stay separate instructions (the build compiles ISO C, -std=c11, where GCC does not contract them into FMAs),
 * so every output has the scalar reference's bits (tests/test_attn_batch.c compares them).
 * Built with -mavx2 -mfma -mf16c (CMakeLists.txt, *_avx2.c); only called after kernels.c checked the CPU. */
#if defined(__x86_64__) && defined(FLM_HAVE_X86)

#if !defined(__AVX2__) || !defined(__F16C__)
#error "attn_tile_avx2.c must be compiled with -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>
#include <string.h>

#include "compute/attention.h"
#include "compute/attn_tile.h"
#include "compute/attn_tile_x86.h"

#define RB 4  /* query rows per register block */

/* out[r][j0 + j] = (q[r] . Kt column j) * scale for r < R, j < nb (nb <= PB) */
INLINE void scores_rows(const float *const *q, int R, const float *Kt, size_t d, __m256 vs, float *const *out,
                        size_t j0, size_t nb) {
    __m256 a[RB][2];
    for (int r = 0; r < R; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (size_t i = 0; i < d; i++) {
        const __m256 k0 = _mm256_load_ps(Kt + i * PB), k1 = _mm256_load_ps(Kt + i * PB + 8);
        for (int r = 0; r < R; r++) {
            const __m256 qb = _mm256_broadcast_ss(q[r] + i);
            a[r][0] = _mm256_add_ps(a[r][0], _mm256_mul_ps(qb, k0));
            a[r][1] = _mm256_add_ps(a[r][1], _mm256_mul_ps(qb, k1));
        }
    }
    for (int r = 0; r < R; r++) {
        const __m256 s0 = _mm256_mul_ps(a[r][0], vs), s1 = _mm256_mul_ps(a[r][1], vs);
        if (nb == PB) {
            _mm256_storeu_ps(out[r] + j0, s0);
            _mm256_storeu_ps(out[r] + j0 + 8, s1);
        } else {
            float tmp[PB];
            _mm256_storeu_ps(tmp, s0);
            _mm256_storeu_ps(tmp + 8, s1);
            memcpy(out[r] + j0, tmp, nb * sizeof(float));
        }
    }
}

void flm_attn_scores_tile_avx2(const float *const *q, size_t n_rows, const void *K, uint32_t elem_bytes, size_t stride,
                               size_t n, size_t d, float scale, float *const *out) {
    if (d % 8 || d > FLM_ATT_MAX_HEAD_DIM) {
        flm_attn_scores_tile_ref(q, n_rows, K, elem_bytes, stride, n, d, scale, out);
        return;
    }
    _Alignas(32) float Kt[FLM_ATT_MAX_HEAD_DIM * PB];
    const __m256 vs = _mm256_set1_ps(scale);
    for (size_t j0 = 0; j0 < n; j0 += PB) {
        const size_t nb = n - j0 < PB ? n - j0 : PB;
        transpose_block((const uint8_t *)K + j0 * stride * elem_bytes, elem_bytes, stride, nb, d, Kt);
        size_t r = 0;
        for (; r + RB <= n_rows; r += RB) scores_rows(q + r, RB, Kt, d, vs, out + r, j0, nb);
        switch (n_rows - r) {
        case 3: scores_rows(q + r, 3, Kt, d, vs, out + r, j0, nb); break;
        case 2: scores_rows(q + r, 2, Kt, d, vs, out + r, j0, nb); break;
        case 1: scores_rows(q + r, 1, Kt, d, vs, out + r, j0, nb); break;
        default: break;
        }
    }
}

INLINE __m256 load8(const void *X, uint32_t elem_bytes, size_t off) {
    if (elem_bytes == FLM_KV_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)X + off)));
    return _mm256_loadu_ps((const float *)X + off);
}

/* o[r][i..i + 8W) += sum_t w[r][t] * V[t][i..], r < R, W vectors of 8 elements */
INLINE void values_rows(const float *const *w, int R, int W, const void *V, uint32_t elem_bytes, size_t stride,
                        size_t n, size_t i, float *const *o) {
    __m256 a[RB][2];
    for (int r = 0; r < R; r++)
        for (int h = 0; h < W; h++) a[r][h] = _mm256_loadu_ps(o[r] + i + 8 * h);
    for (size_t t = 0; t < n; t++) {
        __m256 v[2];
        for (int h = 0; h < W; h++) v[h] = load8(V, elem_bytes, t * stride + i + 8 * (size_t)h);
        for (int r = 0; r < R; r++) {
            const __m256 wb = _mm256_broadcast_ss(w[r] + t);
            for (int h = 0; h < W; h++) a[r][h] = _mm256_add_ps(a[r][h], _mm256_mul_ps(wb, v[h]));
        }
    }
    for (int r = 0; r < R; r++)
        for (int h = 0; h < W; h++) _mm256_storeu_ps(o[r] + i + 8 * h, a[r][h]);
}

/* values_rows over all of d (a multiple of 8) for R rows */
INLINE void values_block(const float *const *w, int R, const void *V, uint32_t elem_bytes, size_t stride, size_t n,
                         size_t d, float *const *o) {
    size_t i = 0;
    for (; i + 16 <= d; i += 16) values_rows(w, R, 2, V, elem_bytes, stride, n, i, o);
    if (i < d) values_rows(w, R, 1, V, elem_bytes, stride, n, i, o);
}

void flm_attn_values_tile_avx2(const float *const *w, size_t n_rows, const void *V, uint32_t elem_bytes, size_t stride,
                               size_t n, size_t d, float *const *o) {
    if (d % 8) {
        flm_attn_values_tile_ref(w, n_rows, V, elem_bytes, stride, n, d, o);
        return;
    }
    size_t r = 0;
    for (; r + RB <= n_rows; r += RB) values_block(w + r, RB, V, elem_bytes, stride, n, d, o + r);
    switch (n_rows - r) {
    case 3: values_block(w + r, 3, V, elem_bytes, stride, n, d, o + r); break;
    case 2: values_block(w + r, 2, V, elem_bytes, stride, n, d, o + r); break;
    case 1: values_block(w + r, 1, V, elem_bytes, stride, n, d, o + r); break;
    default: break;
    }
}

void flm_attn_tile_fill_avx2(flm_kernels *k) {
    k->attn_scores_tile = flm_attn_scores_tile_avx2;
    k->attn_values_tile = flm_attn_values_tile_avx2;
}

#else
typedef int flm_attn_tile_avx2_empty; /* ISO C wants at least one declaration in a translation unit */
#endif
