/* attn_tile_avx512.c — L_compute: the attention tile kernels (kernels.h flm_attn_scores_tile_fn /
 * flm_attn_values_tile_fn) in AVX-512 F, for the avx512 and vnni levels: as attn_tile_avx2.c with 16 lanes.
 *
 * Scores: 16 cache rows transposed (and widened) once into a [d][16] float block (attn_tile_x86.h), one vector per
 * element i, then 8 query rows at a time, lane j summing position j over i in order. Values: 32 elements of 4 rows at
 * a time, each lane summing over positions in order (a head_dim that is not a multiple of 16: the AVX2 kernel).
 * Products and sums stay separate instructions (ISO C build: no contraction into FMAs), so every output has the
 * scalar reference's bits (tests/test_attn_batch.c). Built with -mavx512f -mavx512bw -mavx512vl and the AVX2 flags
 * (CMakeLists.txt); only called after kernels.c checked the CPU. */
#if defined(__x86_64__) && defined(FLM_HAVE_X86)

#if !defined(__AVX512F__) || !defined(__AVX2__) || !defined(__F16C__)
#error "attn_tile_avx512.c must be compiled with -mavx512f -mavx2 -mf16c"
#endif

#include <immintrin.h>
#include <string.h>

#include "compute/attention.h"
#include "compute/attn_tile.h"
#include "compute/attn_tile_x86.h"

#define RS 8 /* query rows per register block (scores) */
#define RV 4 /* rows per register block (values) */

/* out[r][j0 + j] = (q[r] . Kt column j) * scale for r < R, j < nb (nb <= PB = 16) */
INLINE void scores_rows(const float *const *q, int R, const float *Kt, size_t d, __m512 vs, float *const *out,
                        size_t j0, size_t nb) {
    __m512 a[RS];
    for (int r = 0; r < R; r++) a[r] = _mm512_setzero_ps();
    for (size_t i = 0; i < d; i++) {
        const __m512 k = _mm512_load_ps(Kt + i * PB);
        for (int r = 0; r < R; r++) a[r] = _mm512_add_ps(a[r], _mm512_mul_ps(_mm512_set1_ps(q[r][i]), k));
    }
    const __mmask16 m = (__mmask16)((1u << nb) - 1);
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(out[r] + j0, m, _mm512_mul_ps(a[r], vs));
}

static void scores_tile(const float *const *q, size_t n_rows, const void *K, uint32_t elem_bytes, size_t stride,
                        size_t n, size_t d, float scale, float *const *out) {
    if (d % 8 || d > FLM_ATT_MAX_HEAD_DIM) {
        flm_attn_scores_tile_ref(q, n_rows, K, elem_bytes, stride, n, d, scale, out);
        return;
    }
    _Alignas(64) float Kt[FLM_ATT_MAX_HEAD_DIM * PB];
    const __m512 vs = _mm512_set1_ps(scale);
    for (size_t j0 = 0; j0 < n; j0 += PB) {
        const size_t nb = n - j0 < PB ? n - j0 : PB;
        transpose_block((const uint8_t *)K + j0 * stride * elem_bytes, elem_bytes, stride, nb, d, Kt);
        size_t r = 0;
        for (; r + RS <= n_rows; r += RS) scores_rows(q + r, RS, Kt, d, vs, out + r, j0, nb);
        switch (n_rows - r) {
        case 7: scores_rows(q + r, 7, Kt, d, vs, out + r, j0, nb); break;
        case 6: scores_rows(q + r, 6, Kt, d, vs, out + r, j0, nb); break;
        case 5: scores_rows(q + r, 5, Kt, d, vs, out + r, j0, nb); break;
        case 4: scores_rows(q + r, 4, Kt, d, vs, out + r, j0, nb); break;
        case 3: scores_rows(q + r, 3, Kt, d, vs, out + r, j0, nb); break;
        case 2: scores_rows(q + r, 2, Kt, d, vs, out + r, j0, nb); break;
        case 1: scores_rows(q + r, 1, Kt, d, vs, out + r, j0, nb); break;
        default: break;
        }
    }
}

INLINE __m512 load16(const void *X, uint32_t elem_bytes, size_t off) {
    if (elem_bytes == FLM_KV_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)X + off)));
    return _mm512_loadu_ps((const float *)X + off);
}

/* o[r][i..i + 16W) += sum_t w[r][t] * V[t][i..], r < R, W vectors of 16 elements */
INLINE void values_rows(const float *const *w, int R, int W, const void *V, uint32_t elem_bytes, size_t stride,
                        size_t n, size_t i, float *const *o) {
    __m512 a[RV][2];
    for (int r = 0; r < R; r++)
        for (int h = 0; h < W; h++) a[r][h] = _mm512_loadu_ps(o[r] + i + 16 * h);
    for (size_t t = 0; t < n; t++) {
        __m512 v[2];
        for (int h = 0; h < W; h++) v[h] = load16(V, elem_bytes, t * stride + i + 16 * (size_t)h);
        for (int r = 0; r < R; r++) {
            const __m512 wb = _mm512_set1_ps(w[r][t]);
            for (int h = 0; h < W; h++) a[r][h] = _mm512_add_ps(a[r][h], _mm512_mul_ps(wb, v[h]));
        }
    }
    for (int r = 0; r < R; r++)
        for (int h = 0; h < W; h++) _mm512_storeu_ps(o[r] + i + 16 * h, a[r][h]);
}

INLINE void values_block(const float *const *w, int R, const void *V, uint32_t elem_bytes, size_t stride, size_t n,
                         size_t d, float *const *o) {
    size_t i = 0;
    for (; i + 32 <= d; i += 32) values_rows(w, R, 2, V, elem_bytes, stride, n, i, o);
    if (i < d) values_rows(w, R, 1, V, elem_bytes, stride, n, i, o);
}

static void values_tile(const float *const *w, size_t n_rows, const void *V, uint32_t elem_bytes, size_t stride,
                        size_t n, size_t d, float *const *o) {
    if (d % 16) {
        flm_attn_values_tile_avx2(w, n_rows, V, elem_bytes, stride, n, d, o);
        return;
    }
    size_t r = 0;
    for (; r + RV <= n_rows; r += RV) values_block(w + r, RV, V, elem_bytes, stride, n, d, o + r);
    switch (n_rows - r) {
    case 3: values_block(w + r, 3, V, elem_bytes, stride, n, d, o + r); break;
    case 2: values_block(w + r, 2, V, elem_bytes, stride, n, d, o + r); break;
    case 1: values_block(w + r, 1, V, elem_bytes, stride, n, d, o + r); break;
    default: break;
    }
}

void flm_attn_tile_fill_avx512(flm_kernels *k) {
    k->attn_scores_tile = scores_tile;
    k->attn_values_tile = values_tile;
}

#else
typedef int flm_attn_tile_avx512_empty; /* ISO C wants at least one declaration in a translation unit */
#endif
