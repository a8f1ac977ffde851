/* kernels_avx2.c — L_compute: AVX2 + FMA + F16C kernels (dot, axpy, dequant for every type; the FFN
 * activation; f16 rounding). See kernels.h.
 *
 * Built with -mavx2 -mfma -mf16c (CMakeLists.txt); only called after kernels.c checked the CPU. x stays float32
 * throughout: quantized rows are widened to float, never the other way round. Float rows take any n (a short tail
 * goes through a zero-padded block); Q4_0/Q8_0 rows take n a multiple of 32. Several independent accumulators keep
 * enough loads in flight that a long row streams at memory bandwidth. */
#if defined(__x86_64__) && defined(FLM_HAVE_X86)

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "kernels_avx2.c must be compiled with -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "compute/attn_tile.h"
#include "compute/attn_tile_x86.h"
#include "compute/kernels_impl.h"
#include "compute/quants.h"
#include "core/types.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------------------------- */
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static inline __m256 load_bf16x8(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* 8 int8 at p, widened to float. */
static inline __m256 load_i8x8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* The 32 values q-8 of a Q4_0 block as 32 int8: lo = elements 0..15, hi = elements 16..31. */
static inline void unpack_q4(const uint8_t *qs, __m128i *lo, __m128i *hi) {
    const __m128i m4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    __m128i b = _mm_loadu_si128((const __m128i *)qs);
    *lo = _mm_sub_epi8(_mm_and_si128(b, m4), eight);
    *hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), m4), eight);
}

static inline __m256 i8lo_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
static inline __m256 i8hi_to_ps(__m128i v) { return i8lo_to_ps(_mm_unpackhi_epi64(v, v)); }

/* ---------------------------------------------------------------------------------------------------------------
 * dot
 * ------------------------------------------------------------------------------------------------------------- */
/* The float types share one shape: 4 accumulators over 32 elements, then 8 at a time, then a padded tail.
 * LOAD8(i) yields the 8 row values starting at element i; TAIL_T is the row's element type. */
#define DOT_FLOAT_BODY(TAIL_T, LOAD8, LOAD8_PTR)                                                                  \
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps(); \
    size_t i = 0;                                                                                                 \
    for (; i + 32 <= n; i += 32) {                                                                                \
        a0 = _mm256_fmadd_ps(LOAD8(r + i), _mm256_loadu_ps(x + i), a0);                                           \
        a1 = _mm256_fmadd_ps(LOAD8(r + i + 8), _mm256_loadu_ps(x + i + 8), a1);                                   \
        a2 = _mm256_fmadd_ps(LOAD8(r + i + 16), _mm256_loadu_ps(x + i + 16), a2);                                 \
        a3 = _mm256_fmadd_ps(LOAD8(r + i + 24), _mm256_loadu_ps(x + i + 24), a3);                                 \
    }                                                                                                             \
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LOAD8(r + i), _mm256_loadu_ps(x + i), a0);                    \
    if (i < n) {                                                                                                  \
        TAIL_T rt[8] = {0};                                                                                       \
        float xt[8] = {0};                                                                                        \
        memcpy(rt, r + i, (n - i) * sizeof(TAIL_T));                                                              \
        memcpy(xt, x + i, (n - i) * sizeof(float));                                                               \
        a1 = _mm256_fmadd_ps(LOAD8_PTR(rt), _mm256_loadu_ps(xt), a1);                                             \
    }                                                                                                             \
    return hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));

static float dot_f32(const void *row, const float *x, size_t n) {
    const float *r = row;
    DOT_FLOAT_BODY(float, _mm256_loadu_ps, _mm256_loadu_ps)
}

static float dot_f16(const void *row, const float *x, size_t n) {
    const uint16_t *r = row;
    DOT_FLOAT_BODY(uint16_t, load_f16x8, load_f16x8)
}

static float dot_bf16(const void *row, const float *x, size_t n) {
    const uint16_t *r = row;
    DOT_FLOAT_BODY(uint16_t, load_bf16x8, load_bf16x8)
}

/* Per block: p = sum_j q[j]*x[j] in 8 lanes, then acc += d*p. Even and odd blocks use separate accumulators so the
 * acc dependency chain does not limit throughput. */
static inline __m256 q8_block(const flm_block_q8_0 *b, const float *x) {
    __m256 p0 = _mm256_mul_ps(load_i8x8(b->qs), _mm256_loadu_ps(x));
    __m256 p1 = _mm256_mul_ps(load_i8x8(b->qs + 8), _mm256_loadu_ps(x + 8));
    p0 = _mm256_fmadd_ps(load_i8x8(b->qs + 16), _mm256_loadu_ps(x + 16), p0);
    p1 = _mm256_fmadd_ps(load_i8x8(b->qs + 24), _mm256_loadu_ps(x + 24), p1);
    return _mm256_add_ps(p0, p1);
}

static float dot_q8_0(const void *row, const float *x, size_t n) {
    const flm_block_q8_0 *b = row;
    const size_t nb = n / FLM_QK;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d)), q8_block(&b[i], x + i * FLM_QK), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i + 1].d)), q8_block(&b[i + 1], x + (i + 1) * FLM_QK), acc1);
    }
    if (i < nb) acc0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d)), q8_block(&b[i], x + i * FLM_QK), acc0);
    return hsum(_mm256_add_ps(acc0, acc1));
}

static inline __m256 q4_block(const flm_block_q4_0 *b, const float *x) {
    __m128i lo, hi;
    unpack_q4(b->qs, &lo, &hi);
    __m256 p0 = _mm256_mul_ps(i8lo_to_ps(lo), _mm256_loadu_ps(x));
    __m256 p1 = _mm256_mul_ps(i8hi_to_ps(lo), _mm256_loadu_ps(x + 8));
    p0 = _mm256_fmadd_ps(i8lo_to_ps(hi), _mm256_loadu_ps(x + 16), p0);
    p1 = _mm256_fmadd_ps(i8hi_to_ps(hi), _mm256_loadu_ps(x + 24), p1);
    return _mm256_add_ps(p0, p1);
}

static float dot_q4_0(const void *row, const float *x, size_t n) {
    const flm_block_q4_0 *b = row;
    const size_t nb = n / FLM_QK;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d)), q4_block(&b[i], x + i * FLM_QK), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i + 1].d)), q4_block(&b[i + 1], x + (i + 1) * FLM_QK), acc1);
    }
    if (i < nb) acc0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d)), q4_block(&b[i], x + i * FLM_QK), acc0);
    return hsum(_mm256_add_ps(acc0, acc1));
}

/* ---------------------------------------------------------------------------------------------------------------
 * axpy: y += a*row (iterations are independent, so out-of-order execution overlaps them without unrolling)
 * ------------------------------------------------------------------------------------------------------------- */
static void axpy_f32(const void *row, float a, float *y, size_t n) {
    const float *r = row;
    const __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(r + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * r[i];
}

static void axpy_f16(const void *row, float a, float *y, size_t n) {
    const uint16_t *r = row;
    const __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_f16x8(r + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * _cvtsh_ss(r[i]);
}

static void axpy_bf16(const void *row, float a, float *y, size_t n) {
    const uint16_t *r = row;
    const __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_bf16x8(r + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) {
        uint32_t u = (uint32_t)r[i] << 16;
        float v;
        memcpy(&v, &u, sizeof v);
        y[i] += a * v;
    }
}

static void axpy_q8_0(const void *row, float a, float *y, size_t n) {
    const flm_block_q8_0 *b = row;
    for (size_t i = 0; i < n / FLM_QK; i++, y += FLM_QK) {
        const __m256 ad = _mm256_set1_ps(a * _cvtsh_ss(b[i].d));
        for (int j = 0; j < FLM_QK; j += 8)
            _mm256_storeu_ps(y + j, _mm256_fmadd_ps(ad, load_i8x8(b[i].qs + j), _mm256_loadu_ps(y + j)));
    }
}

/* Half h (16 columns) of block i of nt tokens' outputs through every row, nt a constant where inlined (the switch in
 * axpy_tile_q8_0): 2 * nt accumulators, the half's two weight vectors and the product fit the 16 registers, so
 * nothing spills (a whole 32-column block for 4 tokens needs 21). Each element gets axpy_q8_0's fmadd (a * d
 * rounded once), rows in order. */
static inline __attribute__((always_inline)) void axpy_q8_0_half(const uint8_t *W, size_t w_stride, size_t rows,
                                                                  const float *a, size_t a_stride, float *Y,
                                                                  size_t y_stride, size_t i, int h, const size_t nt) {
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (size_t t = 0; t < nt; t++)
        for (int j = 0; j < 2; j++) acc[t][j] = _mm256_loadu_ps(Y + t * y_stride + i * FLM_QK + 16 * h + 8 * j);
    for (size_t r = 0; r < rows; r++) {
        const flm_block_q8_0 *b = (const flm_block_q8_0 *)(W + r * w_stride) + i;
        const float d = _cvtsh_ss(b->d);
        const __m256 q0 = load_i8x8(b->qs + 16 * h), q1 = load_i8x8(b->qs + 16 * h + 8);
#pragma GCC unroll 4
        for (size_t t = 0; t < nt; t++) {
            const __m256 ad = _mm256_set1_ps(a[t * a_stride + r] * d);
            acc[t][0] = _mm256_fmadd_ps(ad, q0, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(ad, q1, acc[t][1]);
        }
    }
#pragma GCC unroll 4
    for (size_t t = 0; t < nt; t++)
        for (int j = 0; j < 2; j++) _mm256_storeu_ps(Y + t * y_stride + i * FLM_QK + 16 * h + 8 * j, acc[t][j]);
}

/* axpy_q8_0 for a block of rows and up to 4 tokens at a time: each half of a 32-column block of the tokens' outputs
 * stays in registers while the rows pass over it (axpy_q8_0_half), every element updated by the same fmadd as
 * axpy_q8_0, rows in order. */
static void axpy_tile_q8_0(const void *W, size_t w_stride, size_t rows, const float *a, size_t a_stride, float *Y,
                           size_t y_stride, size_t n_y, size_t n) {
    const size_t nb = n / FLM_QK;
    for (size_t t0 = 0; t0 < n_y; t0 += 4) {
        const size_t nt = n_y - t0 < 4 ? n_y - t0 : 4;
        const float *at = a + t0 * a_stride;
        float *Yt = Y + t0 * y_stride;
        for (size_t i = 0; i < nb; i++)
            for (int h = 0; h < 2; h++) switch (nt) {
                case 1: axpy_q8_0_half(W, w_stride, rows, at, a_stride, Yt, y_stride, i, h, 1); break;
                case 2: axpy_q8_0_half(W, w_stride, rows, at, a_stride, Yt, y_stride, i, h, 2); break;
                case 3: axpy_q8_0_half(W, w_stride, rows, at, a_stride, Yt, y_stride, i, h, 3); break;
                default: axpy_q8_0_half(W, w_stride, rows, at, a_stride, Yt, y_stride, i, h, 4); break;
                }
    }
}

static void axpy_q4_0(const void *row, float a, float *y, size_t n) {
    const flm_block_q4_0 *b = row;
    for (size_t i = 0; i < n / FLM_QK; i++, y += FLM_QK) {
        const __m256 ad = _mm256_set1_ps(a * _cvtsh_ss(b[i].d));
        __m128i lo, hi;
        unpack_q4(b[i].qs, &lo, &hi);
        _mm256_storeu_ps(y, _mm256_fmadd_ps(ad, i8lo_to_ps(lo), _mm256_loadu_ps(y)));
        _mm256_storeu_ps(y + 8, _mm256_fmadd_ps(ad, i8hi_to_ps(lo), _mm256_loadu_ps(y + 8)));
        _mm256_storeu_ps(y + 16, _mm256_fmadd_ps(ad, i8lo_to_ps(hi), _mm256_loadu_ps(y + 16)));
        _mm256_storeu_ps(y + 24, _mm256_fmadd_ps(ad, i8hi_to_ps(hi), _mm256_loadu_ps(y + 24)));
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * dequant: y = row (exact: every conversion here is exact, and q*d is one rounding as in the scalar code)
 * ------------------------------------------------------------------------------------------------------------- */
static void dequant_f32(const void *row, float *y, size_t n) { memcpy(y, row, n * sizeof(float)); }

static void dequant_f16(const void *row, float *y, size_t n) {
    const uint16_t *r = row;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_f16x8(r + i));
    for (; i < n; i++) y[i] = _cvtsh_ss(r[i]);
}

static void dequant_bf16(const void *row, float *y, size_t n) {
    const uint16_t *r = row;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_bf16x8(r + i));
    for (; i < n; i++) {
        uint32_t u = (uint32_t)r[i] << 16;
        memcpy(&y[i], &u, sizeof u);
    }
}

static void dequant_q8_0(const void *row, float *y, size_t n) {
    const flm_block_q8_0 *b = row;
    for (size_t i = 0; i < n / FLM_QK; i++, y += FLM_QK) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        for (int j = 0; j < FLM_QK; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(load_i8x8(b[i].qs + j), d));
    }
}

static void dequant_q4_0(const void *row, float *y, size_t n) {
    const flm_block_q4_0 *b = row;
    for (size_t i = 0; i < n / FLM_QK; i++, y += FLM_QK) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        __m128i lo, hi;
        unpack_q4(b[i].qs, &lo, &hi);
        _mm256_storeu_ps(y, _mm256_mul_ps(i8lo_to_ps(lo), d));
        _mm256_storeu_ps(y + 8, _mm256_mul_ps(i8hi_to_ps(lo), d));
        _mm256_storeu_ps(y + 16, _mm256_mul_ps(i8lo_to_ps(hi), d));
        _mm256_storeu_ps(y + 24, _mm256_mul_ps(i8hi_to_ps(hi), d));
    }
}

static float vdot_f32(const void *row, const void *xq, size_t n) { return dot_f32(row, xq, n); }
static float vdot_f16(const void *row, const void *xq, size_t n) { return dot_f16(row, xq, n); }
static float vdot_bf16(const void *row, const void *xq, size_t n) { return dot_bf16(row, xq, n); }

/* ---------------------------------------------------------------------------------------------------------------
 * Attention over an f16 KV cache (flm_attn_scores_fn / flm_attn_values_fn): the scalar loops' bits exactly. Products
 * and sums stay separate instructions (mul, then add): the build compiles ISO C (-std=c11), where GCC does not
 * contract them into FMAs, and tests/test_kernels.c compares the bits with the scalar table's.
 * ------------------------------------------------------------------------------------------------------------- */

/* Scores 8 positions at a time, lane j summing position t+j in order of i like the scalar loop: an 8x8 transpose of
 * halves turns the 8 rows' elements i..i+7 into 8 vectors "element i+c of each position". d % 8 != 0 or the last
 * n % 8 positions: the scalar loop (F16C conversions are exact, as flm_f16_to_f32). */
static void attn_scores_f16(const float *q, const uint16_t *K, size_t stride, size_t n, size_t d, float scale,
                            float *out) {
    size_t t = 0;
    if (d % 8 == 0) {
        const __m256 vs = _mm256_set1_ps(scale);
        for (; t + 8 <= n; t += 8) {
            const uint16_t *k = K + t * stride;
            __m256 acc = _mm256_setzero_ps();
            for (size_t i = 0; i < d; i += 8) {
                __m256 c[8];
                transpose8_f16(k, stride, 8, i, c); /* c[j]: element i+j of the 8 positions */
                for (int j = 0; j < 8; j++)
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[i + (size_t)j]), c[j]));
            }
            _mm256_storeu_ps(out + t, _mm256_mul_ps(acc, vs));
        }
    }
    for (; t < n; t++) {
        const uint16_t *k = K + t * stride;
        float s = 0.0f;
        for (size_t i = 0; i < d; i++) s += q[i] * _cvtsh_ss(k[i]);
        out[t] = s * scale;
    }
}

/* Values 32 (then 8) elements at a time, each lane summing over positions in order like the scalar loop. */
static void attn_values_f16(const float *w, const uint16_t *V, size_t stride, size_t n, size_t d, float *out) {
    size_t i = 0;
    for (; i + 32 <= d; i += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (size_t t = 0; t < n; t++) {
            const uint16_t *v = V + t * stride + i;
            const __m256 wt = _mm256_set1_ps(w[t]);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(wt, load_f16x8(v)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(wt, load_f16x8(v + 8)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(wt, load_f16x8(v + 16)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(wt, load_f16x8(v + 24)));
        }
        _mm256_storeu_ps(out + i, a0);
        _mm256_storeu_ps(out + i + 8, a1);
        _mm256_storeu_ps(out + i + 16, a2);
        _mm256_storeu_ps(out + i + 24, a3);
    }
    for (; i + 8 <= d; i += 8) {
        __m256 a = _mm256_setzero_ps();
        for (size_t t = 0; t < n; t++)
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(w[t]), load_f16x8(V + t * stride + i)));
        _mm256_storeu_ps(out + i, a);
    }
    for (; i < d; i++) {
        float a = 0.0f;
        for (size_t t = 0; t < n; t++) a += w[t] * _cvtsh_ss(V[t * stride + i]);
        out[i] = a;
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * FFN activation (kernels.h flm_act_fn) and f16 rounding
 * ------------------------------------------------------------------------------------------------------------- */
/* e^t for the sigmoid forms below, about 1 ulp: t = n ln2 + r with n = round(t / ln2), |r| <= ln2 / 2 (ln2 in two
 * parts, Cephes' 0.693359375 - 2.12194440e-4, so n * hi is exact), e^r by Cephes' expf polynomial
 * 1 + r + r^2 (1/2 + r/6 + ...), times 2^n built in the exponent bits. t is clamped to [-87, 88] so 2^n stays a
 * normal float; above 88 the result is +inf (x / (1 + e^t) is then the reference's signed zero, or NaN for an
 * infinite x), below -87 it is e^-87 (only ever added to 1). NaN stays NaN (min/max pass their second operand). */
static inline __m256 exp_ps(__m256 t) {
    const __m256 over = _mm256_cmp_ps(t, _mm256_set1_ps(88.0f), _CMP_GT_OQ);
    const __m256 x = _mm256_max_ps(_mm256_set1_ps(-87.0f), _mm256_min_ps(_mm256_set1_ps(88.0f), t));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_blendv_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_set1_ps(INFINITY), over);
}

/* act(x) for 8 values; a is not FLM_ACT_GELU_ERF. SiLU x / (1 + e^-x); tanh-GELU 0.5 x (1 + tanh(y)) =
 * x / (1 + e^-2y), y = sqrt(2/pi) (x + 0.044715 x^3); ReLU max(0, x) (max gives +0 for -0 and NaN, as
 * x > 0 ? x : 0 does). */
static inline __m256 act8(flm_act a, __m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    switch (a) {
    case FLM_ACT_RELU: return _mm256_max_ps(x, zero);
    case FLM_ACT_RELU2: {
        const __m256 r = _mm256_max_ps(x, zero);
        return _mm256_mul_ps(r, r);
    }
    case FLM_ACT_GELU_TANH: {
        const __m256 k1 = _mm256_set1_ps((float)(-2.0 * 0.79788456080286535588)),
                     k3 = _mm256_set1_ps((float)(-2.0 * 0.79788456080286535588 * 0.044715));
        const __m256 t = _mm256_mul_ps(x, _mm256_fmadd_ps(k3, _mm256_mul_ps(x, x), k1)); /* -2y */
        return _mm256_div_ps(x, _mm256_add_ps(one, exp_ps(t)));
    }
    default: return _mm256_div_ps(x, _mm256_add_ps(one, exp_ps(_mm256_sub_ps(zero, x))));
    }
}

/* act_f32 for one activation (a constant after inlining: one loop per activation, no switch inside). */
static inline __attribute__((always_inline)) void act_loop(flm_act a, float *y, const float *x, const float *u,
                                                           size_t n) {
    size_t i = 0;
    if (u)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(act8(a, _mm256_loadu_ps(x + i)), _mm256_loadu_ps(u + i)));
    else
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, act8(a, _mm256_loadu_ps(x + i)));
    if (i < n) { /* the tail through the same vector code, so a value's result never depends on where it sits */
        float xt[8] = {0}, ut[8] = {0};
        memcpy(xt, x + i, (n - i) * sizeof(float));
        __m256 v = act8(a, _mm256_loadu_ps(xt));
        if (u) {
            memcpy(ut, u + i, (n - i) * sizeof(float));
            v = _mm256_mul_ps(v, _mm256_loadu_ps(ut));
        }
        _mm256_storeu_ps(xt, v);
        memcpy(y + i, xt, (n - i) * sizeof(float));
    }
}

static void act_f32(flm_act a, float *y, const float *x, const float *u, size_t n) {
    switch (a) {
    case FLM_ACT_SILU: act_loop(FLM_ACT_SILU, y, x, u, n); break;
    case FLM_ACT_RELU: act_loop(FLM_ACT_RELU, y, x, u, n); break;
    case FLM_ACT_GELU_TANH: act_loop(FLM_ACT_GELU_TANH, y, x, u, n); break;
    case FLM_ACT_RELU2: act_loop(FLM_ACT_RELU2, y, x, u, n); break;
    default: flm_kernels_scalar()->act(a, y, x, u, n); /* erf-GELU: no vector erf, the reference's */
    }
}

/* vcvtps2ph with an immediate round-to-nearest-even (MXCSR not consulted), then vcvtph2ps: the scalar pair's bits
 * (tests/test_kernels.c test_f16_vs_hardware and check_level). */
static void round_f16(float *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) dst[i] = _cvtsh_ss(_cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT));
}

/* vcvtps2ph with an immediate round-to-nearest-even: flm_f32_to_f16's bits (as round_f16). */
static void to_f16(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

/* flm_softmax_fn: the max by max_ps (exact, any order), e^(x - max) by exp_ps (0 below -87: masked -inf positions get
 * an exact 0; a short row's tail through the same vector code), their sum in index order as the reference's (so
 * masked positions, exact zeros, leave it unchanged wherever they sit: a tree row's softmax equals the softmax of its
 * unmasked positions alone, bit for bit, as attention.h promises), and x / sum by division as the reference. */
static void softmax(float *x, size_t n) {
    if (n == 0) return;
    __m256 vm = _mm256_set1_ps(x[0]);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(_mm256_loadu_ps(x + i), vm);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    float max = _mm_cvtss_f32(m4);
    for (size_t j = i; j < n; j++)
        if (x[j] > max) max = x[j];
    const __m256 vmax = _mm256_set1_ps(max), lo = _mm256_set1_ps(-87.0f), zero = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 t = _mm256_sub_ps(_mm256_loadu_ps(x + i), vmax);
        _mm256_storeu_ps(x + i, _mm256_blendv_ps(exp_ps(t), zero, _mm256_cmp_ps(t, lo, _CMP_LT_OQ)));
    }
    if (i < n) {
        float xt[8];
        for (size_t j = 0; j < 8; j++) xt[j] = i + j < n ? x[i + j] : 0.0f;
        const __m256 t = _mm256_sub_ps(_mm256_loadu_ps(xt), vmax);
        _mm256_storeu_ps(xt, _mm256_blendv_ps(exp_ps(t), zero, _mm256_cmp_ps(t, lo, _CMP_LT_OQ)));
        memcpy(x + i, xt, (n - i) * sizeof(float));
    }
    float sum = 0.0f;
    for (i = 0; i < n; i++) sum += x[i];
    const __m256 vs = _mm256_set1_ps(sum);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), vs));
    for (; i < n; i++) x[i] /= _mm256_cvtss_f32(vs);
}

/* The AVX2 table starts as a copy of the scalar one (so a type without an AVX2 kernel falls back to scalar by
 * construction, never to NULL), then overrides what this file and quants_avx2.c accelerate. */
static flm_kernels avx2_kernels;
static pthread_once_t avx2_once = PTHREAD_ONCE_INIT;

static void avx2_init(void) {
    flm_kernels *k = &avx2_kernels;
    *k = *flm_kernels_scalar();
    k->name = flm_kernel_level_name(FLM_KERNELS_AVX2);
    k->dot[FLM_TYPE_F32] = dot_f32, k->dot[FLM_TYPE_F16] = dot_f16, k->dot[FLM_TYPE_BF16] = dot_bf16;
    k->dot[FLM_TYPE_Q8_0] = dot_q8_0, k->dot[FLM_TYPE_Q4_0] = dot_q4_0;
    k->axpy[FLM_TYPE_F32] = axpy_f32, k->axpy[FLM_TYPE_F16] = axpy_f16, k->axpy[FLM_TYPE_BF16] = axpy_bf16;
    k->axpy[FLM_TYPE_Q8_0] = axpy_q8_0, k->axpy[FLM_TYPE_Q4_0] = axpy_q4_0;
    k->axpy_tile[FLM_TYPE_Q8_0] = axpy_tile_q8_0;
    k->dequant[FLM_TYPE_F32] = dequant_f32, k->dequant[FLM_TYPE_F16] = dequant_f16;
    k->dequant[FLM_TYPE_BF16] = dequant_bf16, k->dequant[FLM_TYPE_Q8_0] = dequant_q8_0;
    k->dequant[FLM_TYPE_Q4_0] = dequant_q4_0;
    k->vec_dot[FLM_TYPE_F32] = vdot_f32, k->vec_dot[FLM_TYPE_F16] = vdot_f16, k->vec_dot[FLM_TYPE_BF16] = vdot_bf16;
    flm_quants_fill_avx2(k);
    k->attn_scores_f16 = attn_scores_f16, k->attn_values_f16 = attn_values_f16;
    k->act = act_f32, k->round_f16 = round_f16, k->to_f16 = to_f16, k->softmax = softmax;
    flm_attn_tile_fill_avx2(k); /* a batch's attention tiles (attn_tile_avx2.c) */
}

const flm_kernels *flm_kernels_avx2_table(void) {
    pthread_once(&avx2_once, avx2_init);
    return &avx2_kernels;
}

#else
typedef int flm_kernels_avx2_empty; /* ISO C wants at least one declaration in a translation unit */
#endif
