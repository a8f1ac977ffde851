/* quants_neon.h — L_compute: the 64-bit Arm int8 dot products (vec_dot) of every quantized type and the activation
 * quantizers, one source compiled twice: quants_neon.c (ARMv8.0-A Advanced SIMD: SMULL / SMLAL2 / SADALP for the
 * int8 products) and quants_dotprod.c (FLM_NEON_SDOT: ARMv8.2-A SDOT). Internal to src/compute/.
 *
 * Numeric contract: every kernel forms the scalar reference's integer sums (quants.c: per 32-element block, per
 * K-quant sub-block and super-block; integer sums are exact in any order) and then applies the reference's float
 * operations to them in the reference's order (for the 32-element types four blocks' products at a time, lane by
 * lane, then added to the running sum one by one in block order), so vec_dot gives the scalar reference's bits at
 * both levels (tests/test_kernels.c checks it). The activation quantizers write the scalar quantizers' bytes
 * (FCVTAS rounds half away from zero, as roundf). The f16 scales are widened by FCVT, exact as flm_f16_to_f32 for
 * every value but a signalling NaN (which no quantizer writes).
 *
 * The int8 products never overflow: activations come from flm_act_quantize (|q| <= 127), and two products of a
 * weight of magnitude <= 128 with them fit an int16 (SMULL + SMLAL2 at the neon level); q8_0's weights may be -128
 * against anything, so its products are widened one at a time (dot16_safe). */
#ifndef FLM_COMPUTE_QUANTS_NEON_H
#define FLM_COMPUTE_QUANTS_NEON_H

#include <arm_neon.h>
#include <string.h>

#include "compute/quants.h"
#include "core/types.h"

#define QN_INLINE static inline __attribute__((always_inline))

/* acc + the 16 products a[j] * b[j], in 4 int32 lanes (which lane holds which products differs by level; only the
 * lanes' total is used). |a| * |b| * 2 < 2^15 at the neon level (see above). */
QN_INLINE int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#ifdef FLM_NEON_SDOT
    return vdotq_s32(acc, a, b);
#else
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_high_s8(p, a, b);
    return vpadalq_s16(acc, p);
#endif
}

/* dot16 for operands that may both be -128 (q8_0 weights against any int8): each product widened on its own */
QN_INLINE int32x4_t dot16_safe(int32x4_t acc, int8x16_t a, int8x16_t b) {
#ifdef FLM_NEON_SDOT
    return vdotq_s32(acc, a, b);
#else
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

/* lane k = the total of dk's lanes */
QN_INLINE int32x4_t hsum4(int32x4_t d0, int32x4_t d1, int32x4_t d2, int32x4_t d3) {
    return vpaddq_s32(vpaddq_s32(d0, d1), vpaddq_s32(d2, d3));
}

QN_INLINE float h2f_hw(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* 4 halves 18..24 bytes apart (the d of 4 consecutive weight blocks) as floats */
QN_INLINE float32x4_t h2f_x4(uint16_t a, uint16_t b, uint16_t c, uint16_t d) {
    const uint16_t v[4] = {a, b, c, d};
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(v)));
}

QN_INLINE float32x4_t load_f32x4_unaligned(const uint8_t *p) { return vreinterpretq_f32_u8(vld1q_u8(p)); }

QN_INLINE float load_f32_unaligned(const uint8_t *p) {
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* ---------------------------------------------------------------------------------------------------------------
 * The 32-element types: each block's integer dot as 4 int32 lanes
 * ------------------------------------------------------------------------------------------------------------- */
/* the fifth bits of a q5 block (little-endian qh, bit e for element e) as 0x10 bytes: elements 0..15 and 16..31 */
QN_INLINE void q5_high(const uint8_t qh[4], uint8x16_t *h0, uint8x16_t *h1) {
    uint32_t u;
    memcpy(&u, qh, 4);
    const uint8x16_t rep = vreinterpretq_u8_u32(vdupq_n_u32(u));
    static const uint8_t i0[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const uint8_t i1[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t b = vld1q_u8(bit), x10 = vdupq_n_u8(0x10);
    *h0 = vandq_u8(vtstq_u8(vqtbl1q_u8(rep, vld1q_u8(i0)), b), x10);
    *h1 = vandq_u8(vtstq_u8(vqtbl1q_u8(rep, vld1q_u8(i1)), b), x10);
}

QN_INLINE int32x4_t blk_q8_0(const flm_block_q8_0 *w, const flm_block_q8_0 *a) {
    const int32x4_t z = vdupq_n_s32(0);
    return dot16_safe(dot16_safe(z, vld1q_s8(w->qs), vld1q_s8(a->qs)), vld1q_s8(w->qs + 16), vld1q_s8(a->qs + 16));
}

QN_INLINE int32x4_t blk_q4_0(const flm_block_q4_0 *w, const flm_block_q8_0 *a) {
    const uint8x16_t v = vld1q_u8(w->qs);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
    return dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(a->qs)), hi, vld1q_s8(a->qs + 16));
}

QN_INLINE int32x4_t blk_q4_1(const flm_block_q4_1 *w, const flm_block_q8_1 *a) {
    const uint8x16_t v = vld1q_u8(w->qs);
    const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
    const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
    return dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(a->qs)), hi, vld1q_s8(a->qs + 16));
}

QN_INLINE int32x4_t blk_q5_0(const flm_block_q5_0 *w, const flm_block_q8_0 *a) {
    uint8x16_t h0, h1;
    q5_high(w->qh, &h0, &h1);
    const uint8x16_t v = vld1q_u8(w->qs);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, vdupq_n_u8(0x0f)), h0)), vdupq_n_s8(16));
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), h1)), vdupq_n_s8(16));
    return dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(a->qs)), hi, vld1q_s8(a->qs + 16));
}

QN_INLINE int32x4_t blk_q5_1(const flm_block_q5_1 *w, const flm_block_q8_1 *a) {
    uint8x16_t h0, h1;
    q5_high(w->qh, &h0, &h1);
    const uint8x16_t v = vld1q_u8(w->qs);
    const int8x16_t lo = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, vdupq_n_u8(0x0f)), h0));
    const int8x16_t hi = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), h1));
    return dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(a->qs)), hi, vld1q_s8(a->qs + 16));
}

/* vec_dot of a 32-element type without a min (q4_0, q5_0, q8_0: the reference's sum += dw * da * (float)s), or
 * with one (q4_1, q5_1: sum += dw * da * (float)s + m * sa); da and sa from the activation tail (flm_act_bytes). */
#define VDOT32(NAME, WT, AT, BLK, HAS_M)                                                                          \
    static float NAME(const void *row, const void *xq, size_t n) {                                                \
        const WT *w = row;                                                                                        \
        const AT *a = xq;                                                                                         \
        const size_t nb = n / 32;                                                                                 \
        const uint8_t *td = FLM_ACT_TAIL(xq, nb, AT), *ts = td + nb * sizeof(float);                              \
        float sum = 0.0f;                                                                                         \
        size_t i = 0;                                                                                             \
        for (; i + 4 <= nb; i += 4) {                                                                             \
            const int32x4_t s = hsum4(BLK(w + i, a + i), BLK(w + i + 1, a + i + 1), BLK(w + i + 2, a + i + 2),    \
                                      BLK(w + i + 3, a + i + 3));                                                 \
            const float32x4_t dw = h2f_x4(w[i].d, w[i + 1].d, w[i + 2].d, w[i + 3].d);                            \
            float32x4_t p = vmulq_f32(vmulq_f32(dw, load_f32x4_unaligned(td + 4 * i)), vcvtq_f32_s32(s));         \
            if (HAS_M) {                                                                                          \
                const float32x4_t m = h2f_x4(((const uint16_t *)&w[i])[1], ((const uint16_t *)&w[i + 1])[1],      \
                                             ((const uint16_t *)&w[i + 2])[1], ((const uint16_t *)&w[i + 3])[1]); \
                p = vaddq_f32(p, vmulq_f32(m, load_f32x4_unaligned(ts + 4 * i)));                                 \
            }                                                                                                     \
            sum += vgetq_lane_f32(p, 0);                                                                          \
            sum += vgetq_lane_f32(p, 1);                                                                          \
            sum += vgetq_lane_f32(p, 2);                                                                          \
            sum += vgetq_lane_f32(p, 3);                                                                          \
        }                                                                                                         \
        for (; i < nb; i++) {                                                                                     \
            const int s = vaddvq_s32(BLK(w + i, a + i));                                                          \
            float p = h2f_hw(w[i].d) * load_f32_unaligned(td + 4 * i) * (float)s;                                 \
            if (HAS_M) p = p + h2f_hw(((const uint16_t *)&w[i])[1]) * load_f32_unaligned(ts + 4 * i);             \
            sum += p;                                                                                             \
        }                                                                                                         \
        return sum;                                                                                               \
    }

VDOT32(vdot_q8_0, flm_block_q8_0, flm_block_q8_0, blk_q8_0, 0)
VDOT32(vdot_q4_0, flm_block_q4_0, flm_block_q8_0, blk_q4_0, 0)
VDOT32(vdot_q5_0, flm_block_q5_0, flm_block_q8_0, blk_q5_0, 0)
VDOT32(vdot_q4_1, flm_block_q4_1, flm_block_q8_1, blk_q4_1, 1)
VDOT32(vdot_q5_1, flm_block_q5_1, flm_block_q8_1, blk_q5_1, 1)

/* ---------------------------------------------------------------------------------------------------------------
 * The K-quants: per super-block of 256, the integer sums of the reference, then its float expression
 * ------------------------------------------------------------------------------------------------------------- */
/* sum_k sc[k] * g[k] over 8 groups (g as two vectors of 4 group totals, sc as 8 int8 or uint8 widened) */
QN_INLINE int32x4_t scale8(int32x4_t acc, int32x4_t g0, int32x4_t g1, int16x8_t sc) {
    acc = vmlaq_s32(acc, g0, vmovl_s16(vget_low_s16(sc)));
    return vmlaq_s32(acc, g1, vmovl_s16(vget_high_s16(sc)));
}

static float vdot_q2_k(const void *row, const void *xq, size_t n) {
    const flm_block_q2_k *w = row;
    const flm_block_q8_k *a = xq;
    float sum = 0.0f;
    const uint8x16_t m3 = vdupq_n_u8(3);
    for (size_t i = 0; i < n / 256; i++) {
        const uint8x16_t sc = vld1q_u8(w[i].scales);
        const int16x8_t scl = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vandq_u8(sc, vdupq_n_u8(0x0f))))),
                        sch = vreinterpretq_s16_u16(vmovl_u8(vget_high_u8(vandq_u8(sc, vdupq_n_u8(0x0f)))));
        const int16x8_t mnl = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vshrq_n_u8(sc, 4)))),
                        mnh = vreinterpretq_s16_u16(vmovl_u8(vget_high_u8(vshrq_n_u8(sc, 4))));
        const int16x8_t b0 = vld1q_s16(a[i].bsums), b1 = vld1q_s16(a[i].bsums + 8);
        int32x4_t m = vmull_s16(vget_low_s16(mnl), vget_low_s16(b0));
        m = vmlal_s16(m, vget_high_s16(mnl), vget_high_s16(b0));
        m = vmlal_s16(m, vget_low_s16(mnh), vget_low_s16(b1));
        m = vmlal_s16(m, vget_high_s16(mnh), vget_high_s16(b1));
        int32x4_t acc = vdupq_n_s32(0);
        const int8_t *q8 = a[i].qs;
        for (int h = 0; h < 2; h++) {
            const uint8x16_t v0 = vld1q_u8(w[i].qs + 32 * h), v1 = vld1q_u8(w[i].qs + 32 * h + 16);
            int32x4_t g[8];
            const int32x4_t z = vdupq_n_s32(0);
#define Q2G(SH)                                                                                                   \
    g[2 * SH] = dot16(z, vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(v0, 2 * SH), m3)), vld1q_s8(q8 + 32 * SH));      \
    g[2 * SH + 1] = dot16(z, vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(v1, 2 * SH), m3)), vld1q_s8(q8 + 32 * SH + 16));
            g[0] = dot16(z, vreinterpretq_s8_u8(vandq_u8(v0, m3)), vld1q_s8(q8));
            g[1] = dot16(z, vreinterpretq_s8_u8(vandq_u8(v1, m3)), vld1q_s8(q8 + 16));
            Q2G(1)
            Q2G(2)
            Q2G(3)
#undef Q2G
            acc = scale8(acc, hsum4(g[0], g[1], g[2], g[3]), hsum4(g[4], g[5], g[6], g[7]), h ? sch : scl);
            q8 += 128;
        }
        const int isum = vaddvq_s32(acc), msum = vaddvq_s32(m);
        sum += a[i].d * (h2f_hw(w[i].d) * (float)isum - h2f_hw(w[i].dmin) * (float)msum);
    }
    return sum;
}

/* The 16 6-bit scales of a Q3_K block, minus 32 (quants.c q3k_scales) */
QN_INLINE int16x8_t q3k_scales_lo_hi(const uint8_t s[12], int16x8_t *hi) {
    int8_t out[16];
    for (int i = 0; i < 16; i++) {
        const int lo = i < 8 ? (s[i] & 0x0f) : (s[i - 8] >> 4);
        const int hb = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
        out[i] = (int8_t)((lo | (hb << 4)) - 32);
    }
    const int8x16_t v = vld1q_s8(out);
    *hi = vmovl_s8(vget_high_s8(v));
    return vmovl_s8(vget_low_s8(v));
}

static float vdot_q3_k(const void *row, const void *xq, size_t n) {
    const flm_block_q3_k *w = row;
    const flm_block_q8_k *a = xq;
    float sum = 0.0f;
    const uint8x16_t m3 = vdupq_n_u8(3), four = vdupq_n_u8(4);
    for (size_t i = 0; i < n / 256; i++) {
        int16x8_t sch;
        const int16x8_t scl = q3k_scales_lo_hi(w[i].scales, &sch);
        const uint8x16_t hm0 = vld1q_u8(w[i].hmask), hm1 = vld1q_u8(w[i].hmask + 16);
        int32x4_t acc = vdupq_n_s32(0);
        const int8_t *q8 = a[i].qs;
        for (int h = 0; h < 2; h++) {
            const uint8x16_t v0 = vld1q_u8(w[i].qs + 32 * h), v1 = vld1q_u8(w[i].qs + 32 * h + 16);
            int32x4_t g[8];
            const int32x4_t z = vdupq_n_s32(0);
            for (int sh = 0; sh < 4; sh++) {
                const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << (4 * h + sh)));
                const int8x16_t shv = vdupq_n_s8((int8_t)(-2 * sh));
                /* q = 2 bits - (hmask bit ? 0 : 4) */
                const int8x16_t q0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(v0, shv), m3)),
                                              vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(hm0, bit))));
                const int8x16_t q1 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(v1, shv), m3)),
                                              vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(hm1, bit))));
                g[2 * sh] = dot16(z, q0, vld1q_s8(q8 + 32 * sh));
                g[2 * sh + 1] = dot16(z, q1, vld1q_s8(q8 + 32 * sh + 16));
            }
            acc = scale8(acc, hsum4(g[0], g[1], g[2], g[3]), hsum4(g[4], g[5], g[6], g[7]), h ? sch : scl);
            q8 += 128;
        }
        const int isum = vaddvq_s32(acc);
        sum += a[i].d * h2f_hw(w[i].d) * (float)isum;
    }
    return sum;
}

/* q4_k and q5_k: 8 sub-blocks of 32 (nibble k of qs[32c + l] is element 64c + 32k + l; q5_k's fifth bit is bit j
 * of qh[l] for sub-block j); sums sm[j] * s_j and the mins' sm[8 + j] * (bsums[2j] + bsums[2j + 1]). */
QN_INLINE float vdot_k45(const void *row, const void *xq, size_t n, int five) {
    const flm_block_q8_k *a = xq;
    const size_t wb = five ? sizeof(flm_block_q5_k) : sizeof(flm_block_q4_k);
    float sum = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), x10 = vdupq_n_u8(0x10);
    for (size_t i = 0; i < n / 256; i++) {
        const uint8_t *blk = (const uint8_t *)row + i * wb;
        const flm_block_q4_k *w4 = (const flm_block_q4_k *)(const void *)blk;
        const flm_block_q5_k *w5 = (const flm_block_q5_k *)(const void *)blk;
        const uint8_t *qs = five ? w5->qs : w4->qs;
        uint8_t sm[16];
        flm_q4k_scales(five ? w5->scales : w4->scales, sm);
        const uint8x16_t smv = vld1q_u8(sm);
        const int16x8_t sc = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(smv))),
                        mn = vreinterpretq_s16_u16(vmovl_u8(vget_high_u8(smv)));
        const int16x8_t bs = vpaddq_s16(vld1q_s16(a[i].bsums), vld1q_s16(a[i].bsums + 8)); /* per sub-block */
        int32x4_t m = vmull_s16(vget_low_s16(mn), vget_low_s16(bs));
        m = vmlal_s16(m, vget_high_s16(mn), vget_high_s16(bs));
        uint8x16_t qh0 = vdupq_n_u8(0), qh1 = vdupq_n_u8(0);
        if (five) qh0 = vld1q_u8(w5->qh), qh1 = vld1q_u8(w5->qh + 16);
        int32x4_t g[8];
        const int32x4_t z = vdupq_n_s32(0);
        for (int c = 0; c < 4; c++) {
            const uint8x16_t v0 = vld1q_u8(qs + 32 * c), v1 = vld1q_u8(qs + 32 * c + 16);
            uint8x16_t l0 = vandq_u8(v0, m4), l1 = vandq_u8(v1, m4), u0 = vshrq_n_u8(v0, 4), u1 = vshrq_n_u8(v1, 4);
            if (five) {
                const uint8x16_t bl = vdupq_n_u8((uint8_t)(1u << (2 * c))), bu = vdupq_n_u8((uint8_t)(2u << (2 * c)));
                l0 = vorrq_u8(l0, vandq_u8(vtstq_u8(qh0, bl), x10));
                l1 = vorrq_u8(l1, vandq_u8(vtstq_u8(qh1, bl), x10));
                u0 = vorrq_u8(u0, vandq_u8(vtstq_u8(qh0, bu), x10));
                u1 = vorrq_u8(u1, vandq_u8(vtstq_u8(qh1, bu), x10));
            }
            const int8_t *q8 = a[i].qs + 64 * c;
            g[2 * c] = dot16(dot16(z, vreinterpretq_s8_u8(l0), vld1q_s8(q8)), vreinterpretq_s8_u8(l1),
                             vld1q_s8(q8 + 16));
            g[2 * c + 1] = dot16(dot16(z, vreinterpretq_s8_u8(u0), vld1q_s8(q8 + 32)), vreinterpretq_s8_u8(u1),
                                 vld1q_s8(q8 + 48));
        }
        const int32x4_t acc = scale8(vdupq_n_s32(0), hsum4(g[0], g[1], g[2], g[3]), hsum4(g[4], g[5], g[6], g[7]), sc);
        const int isum = vaddvq_s32(acc), msum = vaddvq_s32(m);
        const uint16_t d = five ? w5->d : w4->d, dmin = five ? w5->dmin : w4->dmin;
        sum += a[i].d * (h2f_hw(d) * (float)isum - h2f_hw(dmin) * (float)msum);
    }
    return sum;
}

static float vdot_q4_k(const void *row, const void *xq, size_t n) { return vdot_k45(row, xq, n, 0); }
static float vdot_q5_k(const void *row, const void *xq, size_t n) { return vdot_k45(row, xq, n, 1); }

/* q6_k: element 128h + r is nibble r/64 of ql[64h + r%64] with bits 2(r/32).. of qh[32h + r%32] above, minus 32;
 * 16 groups of 16 with int8 scales. */
static float vdot_q6_k(const void *row, const void *xq, size_t n) {
    const flm_block_q6_k *w = row;
    const flm_block_q8_k *a = xq;
    float sum = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m30 = vdupq_n_u8(0x30);
    const int8x16_t k32 = vdupq_n_s8(32);
    for (size_t i = 0; i < n / 256; i++) {
        const int8x16_t scv = vld1q_s8(w[i].scales);
        const int16x8_t scl = vmovl_s8(vget_low_s8(scv)), sch = vmovl_s8(vget_high_s8(scv));
        int32x4_t acc = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[i].ql + 64 * h, *qh = w[i].qh + 32 * h;
            const int8_t *q8 = a[i].qs + 128 * h;
            const uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16), l2 = vld1q_u8(ql + 32),
                             l3 = vld1q_u8(ql + 48), h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
            int8x16_t q[8];
            q[0] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(h0, 4), m30)));
            q[1] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(h1, 4), m30)));
            q[2] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l2, m4), vandq_u8(vshlq_n_u8(h0, 2), m30)));
            q[3] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l3, m4), vandq_u8(vshlq_n_u8(h1, 2), m30)));
            q[4] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(h0, m30)));
            q[5] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(h1, m30)));
            q[6] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l2, 4), vandq_u8(vshrq_n_u8(h0, 2), m30)));
            q[7] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l3, 4), vandq_u8(vshrq_n_u8(h1, 2), m30)));
            int32x4_t g[8];
            const int32x4_t z = vdupq_n_s32(0);
            for (int k = 0; k < 8; k++) g[k] = dot16(z, vsubq_s8(q[k], k32), vld1q_s8(q8 + 16 * k));
            acc = scale8(acc, hsum4(g[0], g[1], g[2], g[3]), hsum4(g[4], g[5], g[6], g[7]), h ? sch : scl);
        }
        const int isum = vaddvq_s32(acc);
        sum += a[i].d * h2f_hw(w[i].d) * (float)isum;
    }
    return sum;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Activation quantizers: the scalar quantizers' bytes (quants.c flm_quantize_q8_*, aq_q8_*)
 * ------------------------------------------------------------------------------------------------------------- */
/* max |x[j]| over 32 * k floats (FMAXNM: a NaN is passed over, as fmaxf does) */
QN_INLINE float amax_f32(const float *x, int k) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int j = 0; j < 8 * k; j++) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + 4 * j)));
    return vmaxnmvq_f32(m);
}

/* roundf(x[j] * id) for 16 floats, as int8 (FCVTAS: to nearest, ties away from zero) */
QN_INLINE int8x16_t round16(const float *x, float id) {
    const int32x4_t r0 = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x), id)),
                    r1 = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + 4), id)),
                    r2 = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + 8), id)),
                    r3 = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + 12), id));
    const int16x8_t s0 = vcombine_s16(vmovn_s32(r0), vmovn_s32(r1)), s1 = vcombine_s16(vmovn_s32(r2), vmovn_s32(r3));
    return vcombine_s8(vmovn_s16(s0), vmovn_s16(s1));
}

QN_INLINE int sum16(int8x16_t v) { return vaddlvq_s8(v); }

static void aq_q8_0(const float *x, void *dst, size_t n) {
    const size_t nb = n / 32;
    flm_block_q8_0 *y = dst;
    uint8_t *tail = (uint8_t *)dst + nb * sizeof *y;
    for (size_t i = 0; i < nb; i++, x += 32) {
        const float d = amax_f32(x, 1) / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = flm_f32_to_f16(d);
        const int8x16_t q0 = round16(x, id), q1 = round16(x + 16, id);
        vst1q_s8(y[i].qs, q0);
        vst1q_s8(y[i].qs + 16, q1);
        const float dd = h2f_hw(y[i].d);
        const int32_t sum = sum16(q0) + sum16(q1);
        memcpy(tail + i * sizeof dd, &dd, sizeof dd);
        memcpy(tail + (nb + i) * sizeof sum, &sum, sizeof sum);
    }
}

static void aq_q8_1(const float *x, void *dst, size_t n) {
    const size_t nb = n / 32;
    flm_block_q8_1 *y = dst;
    uint8_t *tail = (uint8_t *)dst + nb * sizeof *y;
    for (size_t i = 0; i < nb; i++, x += 32) {
        const float d = amax_f32(x, 1) / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        const int8x16_t q0 = round16(x, id), q1 = round16(x + 16, id);
        vst1q_s8(y[i].qs, q0);
        vst1q_s8(y[i].qs + 16, q1);
        const int sum = sum16(q0) + sum16(q1);
        y[i].d = flm_f32_to_f16(d);
        y[i].s = flm_f32_to_f16((float)sum * d);
        const float dd = h2f_hw(y[i].d), s = h2f_hw(y[i].s);
        memcpy(tail + i * sizeof dd, &dd, sizeof dd);
        memcpy(tail + (nb + i) * sizeof s, &s, sizeof s);
    }
}

static void aq_q8_k(const float *x, void *dst, size_t n) {
    flm_block_q8_k *y = dst;
    for (size_t i = 0; i < n / 256; i++, x += 256) {
        const float d = amax_f32(x, 8) / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = d;
        for (int g = 0; g < 16; g++) {
            const int8x16_t q = round16(x + 16 * g, id);
            vst1q_s8(y[i].qs + 16 * g, q);
            y[i].bsums[g] = (int16_t)sum16(q);
        }
    }
}

/* The overrides of one level (quants_neon.c: neon; quants_dotprod.c: dotprod). */
QN_INLINE void quants_neon_fill(flm_kernels *k) {
    k->act_quantize[FLM_TYPE_Q8_0] = aq_q8_0;
    k->act_quantize[FLM_TYPE_Q8_1] = aq_q8_1;
    k->act_quantize[FLM_TYPE_Q8_K] = aq_q8_k;
    k->vec_dot[FLM_TYPE_Q4_0] = vdot_q4_0;
    k->vec_dot[FLM_TYPE_Q4_1] = vdot_q4_1;
    k->vec_dot[FLM_TYPE_Q5_0] = vdot_q5_0;
    k->vec_dot[FLM_TYPE_Q5_1] = vdot_q5_1;
    k->vec_dot[FLM_TYPE_Q8_0] = vdot_q8_0;
    k->vec_dot[FLM_TYPE_Q2_K] = vdot_q2_k;
    k->vec_dot[FLM_TYPE_Q3_K] = vdot_q3_k;
    k->vec_dot[FLM_TYPE_Q4_K] = vdot_q4_k;
    k->vec_dot[FLM_TYPE_Q5_K] = vdot_q5_k;
    k->vec_dot[FLM_TYPE_Q6_K] = vdot_q6_k;
}

#endif
