/* kernels_neon.c — L_compute: the 64-bit Arm Advanced SIMD (NEON, ARMv8.0-A) kernels of the float types (dot, axpy,
 * dequant of f32 / f16 / bf16, q8_0 / q4_0 with a float x), attention over an f16 KV cache, the FFN activation, f16
 * rounding and conversion, softmax; the int8 dot products are quants_neon.c's. See kernels.h.
 *
 * Advanced SIMD and the half <-> single conversions (FCVTL / FCVTN) are part of every ARMv8-A CPU, so this file
 * needs no flags beyond the aarch64 default. Where kernels.h asks for the scalar loops' bits (attention, f16
 * rounding) products and sums stay separate instructions (vmulq then vaddq: the build compiles ISO C, where GCC does
 * not contract them into FMLA); where it allows float rounding (dots, axpy) the kernels use FMLA. */
#if defined(__aarch64__) && defined(FLM_HAVE_ARM64)

#include <arm_neon.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "compute/kernels_impl.h"
#include "compute/quants.h"
#include "core/types.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------------------------- */
static inline float32x4_t load_f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
static inline float32x4_t load_bf16x4(const uint16_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}
static inline float32x4_t load_f32x4(const float *p) { return vld1q_f32(p); }

/* ---------------------------------------------------------------------------------------------------------------
 * Float-x dot, axpy, dequant of the float types: 4 accumulators over 16 elements, then 4 at a time, then a padded
 * tail.
 * ------------------------------------------------------------------------------------------------------------- */
#define DOT_FLOAT_BODY(TAIL_T, LOAD4)                                                                             \
    float32x4_t a0 = vdupq_n_f32(0), a1 = vdupq_n_f32(0), a2 = vdupq_n_f32(0), a3 = vdupq_n_f32(0);              \
    size_t i = 0;                                                                                                 \
    for (; i + 16 <= n; i += 16) {                                                                                \
        a0 = vfmaq_f32(a0, LOAD4(r + i), vld1q_f32(x + i));                                                       \
        a1 = vfmaq_f32(a1, LOAD4(r + i + 4), vld1q_f32(x + i + 4));                                               \
        a2 = vfmaq_f32(a2, LOAD4(r + i + 8), vld1q_f32(x + i + 8));                                               \
        a3 = vfmaq_f32(a3, LOAD4(r + i + 12), vld1q_f32(x + i + 12));                                             \
    }                                                                                                             \
    for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, LOAD4(r + i), vld1q_f32(x + i));                                \
    if (i < n) {                                                                                                  \
        TAIL_T rt[4] = {0};                                                                                       \
        float xt[4] = {0};                                                                                        \
        memcpy(rt, r + i, (n - i) * sizeof(TAIL_T));                                                              \
        memcpy(xt, x + i, (n - i) * sizeof(float));                                                               \
        a1 = vfmaq_f32(a1, LOAD4(rt), vld1q_f32(xt));                                                             \
    }                                                                                                             \
    return vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));

static float dot_f32(const void *row, const float *x, size_t n) {
    const float *r = row;
    DOT_FLOAT_BODY(float, load_f32x4)
}

static float dot_f16(const void *row, const float *x, size_t n) {
    const uint16_t *r = row;
    DOT_FLOAT_BODY(uint16_t, load_f16x4)
}

static float dot_bf16(const void *row, const float *x, size_t n) {
    const uint16_t *r = row;
    DOT_FLOAT_BODY(uint16_t, load_bf16x4)
}

#define AXPY_FLOAT_BODY(LOAD4, ELEM)                                                                              \
    const float32x4_t va = vdupq_n_f32(a);                                                                        \
    size_t i = 0;                                                                                                 \
    for (; i + 8 <= n; i += 8) {                                                                                  \
        vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), va, LOAD4(r + i)));                                          \
        vst1q_f32(y + i + 4, vfmaq_f32(vld1q_f32(y + i + 4), va, LOAD4(r + i + 4)));                              \
    }                                                                                                             \
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), va, LOAD4(r + i)));                   \
    for (; i < n; i++) y[i] = fmaf(a, ELEM(r[i]), y[i]);

static inline float id_f32(float v) { return v; }

static void axpy_f32(const void *row, float a, float *y, size_t n) {
    const float *r = row;
    AXPY_FLOAT_BODY(load_f32x4, id_f32)
}

static void axpy_f16(const void *row, float a, float *y, size_t n) {
    const uint16_t *r = row;
    AXPY_FLOAT_BODY(load_f16x4, flm_f16_to_f32)
}

static void axpy_bf16(const void *row, float a, float *y, size_t n) {
    const uint16_t *r = row;
    AXPY_FLOAT_BODY(load_bf16x4, flm_bf16_to_f32)
}

static void dequant_f16(const void *row, float *y, size_t n) {
    const uint16_t *r = row;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load_f16x4(r + i)); /* FCVTL is exact, as flm_f16_to_f32 */
    for (; i < n; i++) y[i] = flm_f16_to_f32(r[i]);
}

static void dequant_bf16(const void *row, float *y, size_t n) {
    const uint16_t *r = row;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load_bf16x4(r + i));
    for (; i < n; i++) y[i] = flm_bf16_to_f32(r[i]);
}

static float vdot_f32(const void *row, const void *xq, size_t n) { return dot_f32(row, xq, n); }
static float vdot_f16(const void *row, const void *xq, size_t n) { return dot_f16(row, xq, n); }
static float vdot_bf16(const void *row, const void *xq, size_t n) { return dot_bf16(row, xq, n); }

/* q8_0 / q4_0 with a float x: per block p = sum_j q[j] x[j] in 4 lanes, then acc += d p. */
static inline float32x4_t i8x4_to_f32(int8x8_t v, int hi) {
    const int16x8_t w = vmovl_s8(v);
    return vcvtq_f32_s32(vmovl_s16(hi ? vget_high_s16(w) : vget_low_s16(w)));
}

static float dot_q8_0(const void *row, const float *x, size_t n) {
    const flm_block_q8_0 *b = row;
    float32x4_t acc = vdupq_n_f32(0);
    for (size_t i = 0; i < n / 32; i++, x += 32) {
        const int8x16_t q0 = vld1q_s8(b[i].qs), q1 = vld1q_s8(b[i].qs + 16);
        float32x4_t p = vmulq_f32(i8x4_to_f32(vget_low_s8(q0), 0), vld1q_f32(x));
        p = vfmaq_f32(p, i8x4_to_f32(vget_low_s8(q0), 1), vld1q_f32(x + 4));
        p = vfmaq_f32(p, i8x4_to_f32(vget_high_s8(q0), 0), vld1q_f32(x + 8));
        p = vfmaq_f32(p, i8x4_to_f32(vget_high_s8(q0), 1), vld1q_f32(x + 12));
        p = vfmaq_f32(p, i8x4_to_f32(vget_low_s8(q1), 0), vld1q_f32(x + 16));
        p = vfmaq_f32(p, i8x4_to_f32(vget_low_s8(q1), 1), vld1q_f32(x + 20));
        p = vfmaq_f32(p, i8x4_to_f32(vget_high_s8(q1), 0), vld1q_f32(x + 24));
        p = vfmaq_f32(p, i8x4_to_f32(vget_high_s8(q1), 1), vld1q_f32(x + 28));
        acc = vfmaq_n_f32(acc, p, flm_f16_to_f32(b[i].d));
    }
    return vaddvq_f32(acc);
}

/* the 32 values q - 8 of a q4_0 block as two int8x16 (elements 0..15, 16..31) */
static inline void unpack_q4_0(const uint8_t *qs, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
    *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
}

static float dot_q4_0(const void *row, const float *x, size_t n) {
    const flm_block_q4_0 *b = row;
    float32x4_t acc = vdupq_n_f32(0);
    for (size_t i = 0; i < n / 32; i++, x += 32) {
        int8x16_t q0, q1;
        unpack_q4_0(b[i].qs, &q0, &q1);
        float32x4_t p = vmulq_f32(i8x4_to_f32(vget_low_s8(q0), 0), vld1q_f32(x));
        p = vfmaq_f32(p, i8x4_to_f32(vget_low_s8(q0), 1), vld1q_f32(x + 4));
        p = vfmaq_f32(p, i8x4_to_f32(vget_high_s8(q0), 0), vld1q_f32(x + 8));
        p = vfmaq_f32(p, i8x4_to_f32(vget_high_s8(q0), 1), vld1q_f32(x + 12));
        p = vfmaq_f32(p, i8x4_to_f32(vget_low_s8(q1), 0), vld1q_f32(x + 16));
        p = vfmaq_f32(p, i8x4_to_f32(vget_low_s8(q1), 1), vld1q_f32(x + 20));
        p = vfmaq_f32(p, i8x4_to_f32(vget_high_s8(q1), 0), vld1q_f32(x + 24));
        p = vfmaq_f32(p, i8x4_to_f32(vget_high_s8(q1), 1), vld1q_f32(x + 28));
        acc = vfmaq_n_f32(acc, p, flm_f16_to_f32(b[i].d));
    }
    return vaddvq_f32(acc);
}

/* y += (a d) q per block of 32; the scalar's (a d) * q is one rounding, then the add (FMLA: one rounding less) */
static inline void axpy_i8x16(float *y, int8x16_t q, float32x4_t ad) {
    vst1q_f32(y, vfmaq_f32(vld1q_f32(y), ad, i8x4_to_f32(vget_low_s8(q), 0)));
    vst1q_f32(y + 4, vfmaq_f32(vld1q_f32(y + 4), ad, i8x4_to_f32(vget_low_s8(q), 1)));
    vst1q_f32(y + 8, vfmaq_f32(vld1q_f32(y + 8), ad, i8x4_to_f32(vget_high_s8(q), 0)));
    vst1q_f32(y + 12, vfmaq_f32(vld1q_f32(y + 12), ad, i8x4_to_f32(vget_high_s8(q), 1)));
}

static void axpy_q8_0(const void *row, float a, float *y, size_t n) {
    const flm_block_q8_0 *b = row;
    for (size_t i = 0; i < n / 32; i++, y += 32) {
        const float32x4_t ad = vdupq_n_f32(a * flm_f16_to_f32(b[i].d));
        axpy_i8x16(y, vld1q_s8(b[i].qs), ad);
        axpy_i8x16(y + 16, vld1q_s8(b[i].qs + 16), ad);
    }
}

static void axpy_q4_0(const void *row, float a, float *y, size_t n) {
    const flm_block_q4_0 *b = row;
    for (size_t i = 0; i < n / 32; i++, y += 32) {
        const float32x4_t ad = vdupq_n_f32(a * flm_f16_to_f32(b[i].d));
        int8x16_t q0, q1;
        unpack_q4_0(b[i].qs, &q0, &q1);
        axpy_i8x16(y, q0, ad);
        axpy_i8x16(y + 16, q1, ad);
    }
}

/* the scalar's (float)q * d, exactly (int8 to float is exact, then one product) */
static inline void deq_i8x16(float *y, int8x16_t q, float32x4_t d) {
    vst1q_f32(y, vmulq_f32(i8x4_to_f32(vget_low_s8(q), 0), d));
    vst1q_f32(y + 4, vmulq_f32(i8x4_to_f32(vget_low_s8(q), 1), d));
    vst1q_f32(y + 8, vmulq_f32(i8x4_to_f32(vget_high_s8(q), 0), d));
    vst1q_f32(y + 12, vmulq_f32(i8x4_to_f32(vget_high_s8(q), 1), d));
}

static void dequant_q8_0(const void *row, float *y, size_t n) {
    const flm_block_q8_0 *b = row;
    for (size_t i = 0; i < n / 32; i++, y += 32) {
        const float32x4_t d = vdupq_n_f32(flm_f16_to_f32(b[i].d));
        deq_i8x16(y, vld1q_s8(b[i].qs), d);
        deq_i8x16(y + 16, vld1q_s8(b[i].qs + 16), d);
    }
}

static void dequant_q4_0(const void *row, float *y, size_t n) {
    const flm_block_q4_0 *b = row;
    for (size_t i = 0; i < n / 32; i++, y += 32) {
        const float32x4_t d = vdupq_n_f32(flm_f16_to_f32(b[i].d));
        int8x16_t q0, q1;
        unpack_q4_0(b[i].qs, &q0, &q1);
        deq_i8x16(y, q0, d);
        deq_i8x16(y + 16, q1, d);
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Attention over an f16 KV cache (flm_attn_scores_fn / flm_attn_values_fn): the scalar loops' bits exactly.
 * ------------------------------------------------------------------------------------------------------------- */
/* Scores 4 positions at a time, lane j summing position t+j in order of i like the scalar loop: a 4x4 transpose of
 * the 4 rows' elements i..i+3 gives 4 vectors "element i+c of each position". d % 4 != 0 or the last n % 4
 * positions: the scalar loop (FCVTL is exact, as flm_f16_to_f32). */
static void attn_scores_f16(const float *q, const uint16_t *K, size_t stride, size_t n, size_t d, float scale,
                            float *out) {
    size_t t = 0;
    if (d % 4 == 0) {
        const float32x4_t vs = vdupq_n_f32(scale);
        for (; t + 4 <= n; t += 4) {
            const uint16_t *k = K + t * stride;
            float32x4_t acc = vdupq_n_f32(0);
            for (size_t i = 0; i < d; i += 4) {
                const float32x4_t r0 = load_f16x4(k + i), r1 = load_f16x4(k + stride + i),
                                  r2 = load_f16x4(k + 2 * stride + i), r3 = load_f16x4(k + 3 * stride + i);
                /* transpose: c_j = element i+j of rows 0..3 */
                const float32x4_t t0 = vtrn1q_f32(r0, r1), t1 = vtrn2q_f32(r0, r1), t2 = vtrn1q_f32(r2, r3),
                                  t3 = vtrn2q_f32(r2, r3);
                const float32x4_t c0 = vreinterpretq_f32_f64(
                                      vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2))),
                                  c1 = vreinterpretq_f32_f64(
                                      vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3))),
                                  c2 = vreinterpretq_f32_f64(
                                      vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2))),
                                  c3 = vreinterpretq_f32_f64(
                                      vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
                acc = vaddq_f32(acc, vmulq_n_f32(c0, q[i]));
                acc = vaddq_f32(acc, vmulq_n_f32(c1, q[i + 1]));
                acc = vaddq_f32(acc, vmulq_n_f32(c2, q[i + 2]));
                acc = vaddq_f32(acc, vmulq_n_f32(c3, q[i + 3]));
            }
            vst1q_f32(out + t, vmulq_f32(acc, vs));
        }
    }
    for (; t < n; t++) {
        const uint16_t *k = K + t * stride;
        float s = 0.0f;
        for (size_t i = 0; i < d; i++) s += q[i] * flm_f16_to_f32(k[i]);
        out[t] = s * scale;
    }
}

/* Values 16 (then 4) elements at a time, each lane summing over positions in order like the scalar loop. */
static void attn_values_f16(const float *w, const uint16_t *V, size_t stride, size_t n, size_t d, float *out) {
    size_t i = 0;
    for (; i + 16 <= d; i += 16) {
        float32x4_t a0 = vdupq_n_f32(0), a1 = vdupq_n_f32(0), a2 = vdupq_n_f32(0), a3 = vdupq_n_f32(0);
        for (size_t t = 0; t < n; t++) {
            const uint16_t *v = V + t * stride + i;
            const float wt = w[t];
            a0 = vaddq_f32(a0, vmulq_n_f32(load_f16x4(v), wt));
            a1 = vaddq_f32(a1, vmulq_n_f32(load_f16x4(v + 4), wt));
            a2 = vaddq_f32(a2, vmulq_n_f32(load_f16x4(v + 8), wt));
            a3 = vaddq_f32(a3, vmulq_n_f32(load_f16x4(v + 12), wt));
        }
        vst1q_f32(out + i, a0);
        vst1q_f32(out + i + 4, a1);
        vst1q_f32(out + i + 8, a2);
        vst1q_f32(out + i + 12, a3);
    }
    for (; i + 4 <= d; i += 4) {
        float32x4_t a = vdupq_n_f32(0);
        for (size_t t = 0; t < n; t++) a = vaddq_f32(a, vmulq_n_f32(load_f16x4(V + t * stride + i), w[t]));
        vst1q_f32(out + i, a);
    }
    for (; i < d; i++) {
        float a = 0.0f;
        for (size_t t = 0; t < n; t++) a += w[t] * flm_f16_to_f32(V[t * stride + i]);
        out[i] = a;
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * FFN activation (kernels.h flm_act_fn), f16 rounding, softmax
 * ------------------------------------------------------------------------------------------------------------- */
/* e^t, the avx2 level's scheme (kernels_avx2.c exp_ps) lane for lane: t = n ln2 + r, n = round(t / ln2) to nearest
 * even (FRINTN), ln2 in Cephes' two parts, Cephes' expf polynomial with fused multiply-adds, times 2^n built in the
 * exponent bits; t clamped to [-87, 88], +inf above 88. NaN stays NaN (FMINNM / FMAXNM would drop it: FMIN / FMAX
 * keep it). */
static inline float32x4_t exp_f32x4(float32x4_t t) {
    const uint32x4_t over = vcgtq_f32(t, vdupq_n_f32(88.0f));
    const float32x4_t x = vmaxq_f32(vdupq_n_f32(-87.0f), vminq_f32(vdupq_n_f32(88.0f), t));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vbslq_f32(over, vdupq_n_f32(INFINITY), vmulq_f32(p, vreinterpretq_f32_s32(e)));
}

/* act(x) for 4 values; a is not FLM_ACT_GELU_ERF (kernels_avx2.c act8's forms). ReLU: x > 0 ? x : +0 (a compare
 * and a select, so -0 and NaN give +0 like the reference). */
static inline float32x4_t act4(flm_act a, float32x4_t x) {
    const float32x4_t one = vdupq_n_f32(1.0f), zero = vdupq_n_f32(0.0f);
    switch (a) {
    case FLM_ACT_RELU: return vbslq_f32(vcgtq_f32(x, zero), x, zero);
    case FLM_ACT_RELU2: {
        const float32x4_t r = vbslq_f32(vcgtq_f32(x, zero), x, zero);
        return vmulq_f32(r, r);
    }
    case FLM_ACT_GELU_TANH: {
        const float32x4_t k1 = vdupq_n_f32((float)(-2.0 * 0.79788456080286535588)),
                          k3 = vdupq_n_f32((float)(-2.0 * 0.79788456080286535588 * 0.044715));
        const float32x4_t t = vmulq_f32(x, vfmaq_f32(k1, k3, vmulq_f32(x, x))); /* -2y */
        return vdivq_f32(x, vaddq_f32(one, exp_f32x4(t)));
    }
    default: return vdivq_f32(x, vaddq_f32(one, exp_f32x4(vsubq_f32(zero, x))));
    }
}

static inline __attribute__((always_inline)) void act_loop(flm_act a, float *y, const float *x, const float *u,
                                                           size_t n) {
    size_t i = 0;
    if (u)
        for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_f32(act4(a, vld1q_f32(x + i)), vld1q_f32(u + i)));
    else
        for (; i + 4 <= n; i += 4) vst1q_f32(y + i, act4(a, vld1q_f32(x + i)));
    if (i < n) { /* the tail through the same vector code, so a value's result never depends on where it sits */
        float xt[4] = {0}, ut[4] = {0};
        memcpy(xt, x + i, (n - i) * sizeof(float));
        float32x4_t v = act4(a, vld1q_f32(xt));
        if (u) {
            memcpy(ut, u + i, (n - i) * sizeof(float));
            v = vmulq_f32(v, vld1q_f32(ut));
        }
        vst1q_f32(xt, v);
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

/* FCVTN rounds by FPCR (round to nearest even: Linux's default, never changed here) and quiets a NaN keeping its top
 * payload bits (FPCR.DN = 0), which is flm_f32_to_f16; FCVTL back is exact. */
static void round_f16(float *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vcvt_f32_f16(vcvt_f16_f32(vld1q_f32(src + i))));
    for (; i < n; i++) dst[i] = flm_f16_to_f32(flm_f32_to_f16(src[i]));
}

static void to_f16(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
    for (; i < n; i++) dst[i] = flm_f32_to_f16(src[i]);
}

/* flm_softmax_fn as kernels_avx2.c's: the max (exact in any order), e^(x - max) by exp_f32x4 (0 below -87), their
 * sum in index order, then the divisions. */
static void softmax(float *x, size_t n) {
    if (n == 0) return;
    float32x4_t vm = vdupq_n_f32(x[0]);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vm = vmaxq_f32(vld1q_f32(x + i), vm);
    float max = vmaxvq_f32(vm);
    for (size_t j = i; j < n; j++)
        if (x[j] > max) max = x[j];
    const float32x4_t vmax = vdupq_n_f32(max), lo = vdupq_n_f32(-87.0f), zero = vdupq_n_f32(0.0f);
    for (i = 0; i + 4 <= n; i += 4) {
        const float32x4_t t = vsubq_f32(vld1q_f32(x + i), vmax);
        vst1q_f32(x + i, vbslq_f32(vcltq_f32(t, lo), zero, exp_f32x4(t)));
    }
    if (i < n) {
        float xt[4];
        for (size_t j = 0; j < 4; j++) xt[j] = i + j < n ? x[i + j] : 0.0f;
        const float32x4_t t = vsubq_f32(vld1q_f32(xt), vmax);
        vst1q_f32(xt, vbslq_f32(vcltq_f32(t, lo), zero, exp_f32x4(t)));
        memcpy(x + i, xt, (n - i) * sizeof(float));
    }
    float sum = 0.0f;
    for (i = 0; i < n; i++) sum += x[i];
    const float32x4_t vs = vdupq_n_f32(sum);
    for (i = 0; i + 4 <= n; i += 4) vst1q_f32(x + i, vdivq_f32(vld1q_f32(x + i), vs));
    for (; i < n; i++) x[i] /= sum;
}

/* The NEON table starts as a copy of the scalar one (a type without a NEON kernel falls back to scalar by
 * construction), then overrides what this file and quants_neon.c accelerate. */
static flm_kernels neon_kernels;
static pthread_once_t neon_once = PTHREAD_ONCE_INIT;

static void neon_init(void) {
    flm_kernels *k = &neon_kernels;
    *k = *flm_kernels_scalar();
    k->name = "neon";
    k->dot[FLM_TYPE_F32] = dot_f32, k->dot[FLM_TYPE_F16] = dot_f16, k->dot[FLM_TYPE_BF16] = dot_bf16;
    k->dot[FLM_TYPE_Q8_0] = dot_q8_0, k->dot[FLM_TYPE_Q4_0] = dot_q4_0;
    k->axpy[FLM_TYPE_F32] = axpy_f32, k->axpy[FLM_TYPE_F16] = axpy_f16, k->axpy[FLM_TYPE_BF16] = axpy_bf16;
    k->axpy[FLM_TYPE_Q8_0] = axpy_q8_0, k->axpy[FLM_TYPE_Q4_0] = axpy_q4_0;
    k->dequant[FLM_TYPE_F16] = dequant_f16, k->dequant[FLM_TYPE_BF16] = dequant_bf16;
    k->dequant[FLM_TYPE_Q8_0] = dequant_q8_0, k->dequant[FLM_TYPE_Q4_0] = dequant_q4_0;
    k->vec_dot[FLM_TYPE_F32] = vdot_f32, k->vec_dot[FLM_TYPE_F16] = vdot_f16, k->vec_dot[FLM_TYPE_BF16] = vdot_bf16;
    flm_quants_fill_neon(k);
    k->attn_scores_f16 = attn_scores_f16, k->attn_values_f16 = attn_values_f16;
    k->act = act_f32, k->round_f16 = round_f16, k->to_f16 = to_f16, k->softmax = softmax;
}

const flm_kernels *flm_kernels_neon_table(void) {
    pthread_once(&neon_once, neon_init);
    return &neon_kernels;
}

#else
typedef int flm_kernels_neon_empty; /* ISO C wants at least one declaration in a translation unit */
#endif
