/* quants.c — L_compute: scalar reference kernels of the quantized types (dequantize, float-x dot, axpy, and the
 * int8 vec_dot against quantized activations) and the quantizers. See quants.h and kernels.h.
 *
 * Element order inside the blocks (ggml-quants.c dequantize_row_*; e is the element index in the block):
 *   q4_0/q4_1/q5_0/q5_1: e < 16 in the low nibble of qs[e], e >= 16 in the high nibble of qs[e-16]; the fifth bit
 *                        of q5_* is bit e of the little-endian uint32 qh.
 *   q2_k/q3_k: e = 128h + 32s + l  ->  bits 2s..2s+1 of qs[32h + l]; q3_k's third bit is bit 4h+s of hmask[l].
 *   q4_k/q5_k: e = 64c + 32k + l   ->  nibble k of qs[32c + l]; q5_k's fifth bit is bit e/32 of qh[l].
 *   q6_k:      e = 128h + r        ->  nibble r/64 of ql[64h + r%64], bits 2(r/32).. of qh[32h + r%32].
 * Float arithmetic in the dequantizers follows the same order as ggml and the gguf NumPy code (one product for
 * the sub-block scale, then one product and one subtraction per element), so the values agree bit for bit. */
#include "compute/quants.h"

#include <math.h>
#include <string.h>

#include "core/types.h"

static inline float h2f(uint16_t h) { return flm_f16_to_f32(h); }

static inline uint32_t load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void flm_q4k_scales(const uint8_t scales[12], uint8_t out[16]) {
    for (int j = 0; j < 4; j++) {
        out[j] = scales[j] & 63;                                                  /* scale j */
        out[8 + j] = scales[j + 4] & 63;                                          /* min j */
        out[4 + j] = (scales[j + 8] & 0x0f) | ((scales[j] >> 6) << 4);            /* scale j+4 */
        out[12 + j] = (scales[j + 8] >> 4) | ((scales[j + 4] >> 6) << 4);         /* min j+4 */
    }
}

/* The 16 6-bit scales of a Q3_K block, minus 32 (ggml-quants.c dequantize_row_q3_K's aux unpacking). */
static void q3k_scales(const uint8_t s[12], int8_t out[16]) {
    for (int i = 0; i < 16; i++) {
        int lo = i < 8 ? (s[i] & 0x0f) : (s[i - 8] >> 4);
        int hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
        out[i] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Block dequantizers: one block of block_elems floats
 * ------------------------------------------------------------------------------------------------------------- */
static void deq_q4_1(const void *blk, float *y) {
    const flm_block_q4_1 *b = blk;
    const float d = h2f(b->d), m = h2f(b->m);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(b->qs[j] & 0x0f) + m;
        y[j + 16] = d * (float)(b->qs[j] >> 4) + m;
    }
}

static void deq_q5_0(const void *blk, float *y) {
    const flm_block_q5_0 *b = blk;
    const float d = h2f(b->d);
    const uint32_t qh = load_u32le(b->qh);
    for (int j = 0; j < 16; j++) {
        int q0 = (b->qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
        int q1 = (b->qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (float)(q0 - 16);
        y[j + 16] = d * (float)(q1 - 16);
    }
}

static void deq_q5_1(const void *blk, float *y) {
    const flm_block_q5_1 *b = blk;
    const float d = h2f(b->d), m = h2f(b->m);
    const uint32_t qh = load_u32le(b->qh);
    for (int j = 0; j < 16; j++) {
        int q0 = (b->qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
        int q1 = (b->qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (float)q0 + m;
        y[j + 16] = d * (float)q1 + m;
    }
}

static void deq_q2_k(const void *blk, float *y) {
    const flm_block_q2_k *b = blk;
    const float d = h2f(b->d), dmin = h2f(b->dmin);
    for (int g = 0; g < 16; g++) {
        const float dl = d * (float)(b->scales[g] & 0x0f), ml = dmin * (float)(b->scales[g] >> 4);
        for (int i = 0; i < 16; i++) {
            int e = g * 16 + i, h = e >> 7, s = (e >> 5) & 3, l = e & 31;
            y[e] = dl * (float)((b->qs[32 * h + l] >> (2 * s)) & 3) - ml;
        }
    }
}

static void deq_q3_k(const void *blk, float *y) {
    const flm_block_q3_k *b = blk;
    const float d = h2f(b->d);
    int8_t sc[16];
    q3k_scales(b->scales, sc);
    for (int g = 0; g < 16; g++) {
        const float dl = d * (float)sc[g];
        for (int i = 0; i < 16; i++) {
            int e = g * 16 + i, h = e >> 7, s = (e >> 5) & 3, l = e & 31;
            int q = ((b->qs[32 * h + l] >> (2 * s)) & 3) - (((b->hmask[l] >> (4 * h + s)) & 1) ? 0 : 4);
            y[e] = dl * (float)q;
        }
    }
}

static void deq_q4_k(const void *blk, float *y) {
    const flm_block_q4_k *b = blk;
    const float d = h2f(b->d), dmin = h2f(b->dmin);
    uint8_t sm[16];
    flm_q4k_scales(b->scales, sm);
    for (int j = 0; j < 8; j++) {
        const float dl = d * (float)sm[j], ml = dmin * (float)sm[8 + j];
        const uint8_t *q = b->qs + 32 * (j >> 1);
        const int shift = 4 * (j & 1);
        for (int l = 0; l < 32; l++) y[32 * j + l] = dl * (float)((q[l] >> shift) & 0x0f) - ml;
    }
}

static void deq_q5_k(const void *blk, float *y) {
    const flm_block_q5_k *b = blk;
    const float d = h2f(b->d), dmin = h2f(b->dmin);
    uint8_t sm[16];
    flm_q4k_scales(b->scales, sm);
    for (int j = 0; j < 8; j++) {
        const float dl = d * (float)sm[j], ml = dmin * (float)sm[8 + j];
        const uint8_t *q = b->qs + 32 * (j >> 1);
        const int shift = 4 * (j & 1);
        for (int l = 0; l < 32; l++) {
            int v = ((q[l] >> shift) & 0x0f) | (((b->qh[l] >> j) & 1) << 4);
            y[32 * j + l] = dl * (float)v - ml;
        }
    }
}

/* The 6-bit value (0..63) of element r of half h of a Q6_K block. */
static inline int q6k_val(const flm_block_q6_k *b, int h, int r) {
    int lo = (b->ql[64 * h + (r & 63)] >> (4 * (r >> 6))) & 0x0f;
    int hi = (b->qh[32 * h + (r & 31)] >> (2 * (r >> 5))) & 3;
    return lo | (hi << 4);
}

static void deq_q6_k(const void *blk, float *y) {
    const flm_block_q6_k *b = blk;
    const float d = h2f(b->d);
    for (int g = 0; g < 16; g++) {
        const float dl = d * (float)b->scales[g];
        for (int i = 0; i < 16; i++) {
            int e = 16 * g + i;
            y[e] = dl * (float)(q6k_val(b, e >> 7, e & 127) - 32);
        }
    }
}

static void deq_q8_1(const void *blk, float *y) {
    const flm_block_q8_1 *b = blk;
    const float d = h2f(b->d);
    for (int j = 0; j < 32; j++) y[j] = (float)b->qs[j] * d;
}

static void deq_q8_k(const void *blk, float *y) {
    const flm_block_q8_k *b = blk;
    for (int j = 0; j < 256; j++) y[j] = (float)b->qs[j] * b->d;
}

/* Row-level dequant / float-x dot / axpy of a type with block dequantizer DEQ (BE elements, BB bytes a block):
 * each block is dequantized into a small float buffer, then used. */
#define ROW_KERNELS(T, DEQ, BE, BB)                                                                               \
    static void dequant_##T(const void *row, float *y, size_t n) {                                                \
        const uint8_t *r = row;                                                                                   \
        for (size_t i = 0; i < n / (BE); i++) DEQ(r + i * (BB), y + i * (BE));                                    \
    }                                                                                                             \
    static float dot_##T(const void *row, const float *x, size_t n) {                                             \
        const uint8_t *r = row;                                                                                   \
        float tmp[BE], sum = 0.0f;                                                                                \
        for (size_t i = 0; i < n / (BE); i++, x += (BE)) {                                                        \
            DEQ(r + i * (BB), tmp);                                                                               \
            float s = 0.0f;                                                                                       \
            for (int j = 0; j < (BE); j++) s += tmp[j] * x[j];                                                    \
            sum += s;                                                                                             \
        }                                                                                                         \
        return sum;                                                                                               \
    }                                                                                                             \
    static void axpy_##T(const void *row, float a, float *y, size_t n) {                                          \
        const uint8_t *r = row;                                                                                   \
        float tmp[BE];                                                                                            \
        for (size_t i = 0; i < n / (BE); i++, y += (BE)) {                                                        \
            DEQ(r + i * (BB), tmp);                                                                               \
            for (int j = 0; j < (BE); j++) y[j] += a * tmp[j];                                                    \
        }                                                                                                         \
    }

ROW_KERNELS(q4_1, deq_q4_1, 32, sizeof(flm_block_q4_1))
ROW_KERNELS(q5_0, deq_q5_0, 32, sizeof(flm_block_q5_0))
ROW_KERNELS(q5_1, deq_q5_1, 32, sizeof(flm_block_q5_1))
ROW_KERNELS(q8_1, deq_q8_1, 32, sizeof(flm_block_q8_1))
ROW_KERNELS(q2_k, deq_q2_k, 256, sizeof(flm_block_q2_k))
ROW_KERNELS(q3_k, deq_q3_k, 256, sizeof(flm_block_q3_k))
ROW_KERNELS(q4_k, deq_q4_k, 256, sizeof(flm_block_q4_k))
ROW_KERNELS(q5_k, deq_q5_k, 256, sizeof(flm_block_q5_k))
ROW_KERNELS(q6_k, deq_q6_k, 256, sizeof(flm_block_q6_k))
ROW_KERNELS(q8_k, deq_q8_k, 256, sizeof(flm_block_q8_k))

/* ---------------------------------------------------------------------------------------------------------------
 * vec_dot: a weight row against activations quantized by flm_act_quantize (ggml_vec_dot_*_q8_* in scalar form).
 * Integer sums are exact; each block adds one float product.
 * ------------------------------------------------------------------------------------------------------------- */
static float vdot_q4_0(const void *row, const void *xq, size_t n) {
    const flm_block_q4_0 *w = row;
    const flm_block_q8_0 *a = xq;
    float sum = 0.0f;
    for (size_t i = 0; i < n / 32; i++) {
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += ((w[i].qs[j] & 0x0f) - 8) * a[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + 16];
        sum += h2f(w[i].d) * h2f(a[i].d) * (float)s;
    }
    return sum;
}

static float vdot_q4_1(const void *row, const void *xq, size_t n) {
    const flm_block_q4_1 *w = row;
    const flm_block_q8_1 *a = xq;
    float sum = 0.0f;
    for (size_t i = 0; i < n / 32; i++) {
        int s = 0;
        for (int j = 0; j < 16; j++) s += (w[i].qs[j] & 0x0f) * a[i].qs[j] + (w[i].qs[j] >> 4) * a[i].qs[j + 16];
        sum += h2f(w[i].d) * h2f(a[i].d) * (float)s + h2f(w[i].m) * h2f(a[i].s);
    }
    return sum;
}

static float vdot_q5_0(const void *row, const void *xq, size_t n) {
    const flm_block_q5_0 *w = row;
    const flm_block_q8_0 *a = xq;
    float sum = 0.0f;
    for (size_t i = 0; i < n / 32; i++) {
        const uint32_t qh = load_u32le(w[i].qh);
        int s = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = ((w[i].qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4)) - 16;
            int q1 = ((w[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16;
            s += q0 * a[i].qs[j] + q1 * a[i].qs[j + 16];
        }
        sum += h2f(w[i].d) * h2f(a[i].d) * (float)s;
    }
    return sum;
}

static float vdot_q5_1(const void *row, const void *xq, size_t n) {
    const flm_block_q5_1 *w = row;
    const flm_block_q8_1 *a = xq;
    float sum = 0.0f;
    for (size_t i = 0; i < n / 32; i++) {
        const uint32_t qh = load_u32le(w[i].qh);
        int s = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (w[i].qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            int q1 = (w[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            s += q0 * a[i].qs[j] + q1 * a[i].qs[j + 16];
        }
        sum += h2f(w[i].d) * h2f(a[i].d) * (float)s + h2f(w[i].m) * h2f(a[i].s);
    }
    return sum;
}

static float vdot_q8_0(const void *row, const void *xq, size_t n) {
    const flm_block_q8_0 *w = row;
    const flm_block_q8_0 *a = xq;
    float sum = 0.0f;
    for (size_t i = 0; i < n / 32; i++) {
        int s = 0;
        for (int j = 0; j < 32; j++) s += w[i].qs[j] * a[i].qs[j];
        sum += h2f(w[i].d) * h2f(a[i].d) * (float)s;
    }
    return sum;
}

static float vdot_q2_k(const void *row, const void *xq, size_t n) {
    const flm_block_q2_k *w = row;
    const flm_block_q8_k *a = xq;
    float sum = 0.0f;
    for (size_t i = 0; i < n / 256; i++) {
        int isum = 0, msum = 0;
        for (int g = 0; g < 16; g++) {
            msum += (w[i].scales[g] >> 4) * a[i].bsums[g];
            int s = 0;
            for (int k = 0; k < 16; k++) {
                int e = 16 * g + k, h = e >> 7, sh = (e >> 5) & 3, l = e & 31;
                s += ((w[i].qs[32 * h + l] >> (2 * sh)) & 3) * a[i].qs[e];
            }
            isum += (w[i].scales[g] & 0x0f) * s;
        }
        sum += a[i].d * (h2f(w[i].d) * (float)isum - h2f(w[i].dmin) * (float)msum);
    }
    return sum;
}

static float vdot_q3_k(const void *row, const void *xq, size_t n) {
    const flm_block_q3_k *w = row;
    const flm_block_q8_k *a = xq;
    float sum = 0.0f;
    for (size_t i = 0; i < n / 256; i++) {
        int8_t sc[16];
        q3k_scales(w[i].scales, sc);
        int isum = 0;
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int k = 0; k < 16; k++) {
                int e = 16 * g + k, h = e >> 7, sh = (e >> 5) & 3, l = e & 31;
                int q = ((w[i].qs[32 * h + l] >> (2 * sh)) & 3) - (((w[i].hmask[l] >> (4 * h + sh)) & 1) ? 0 : 4);
                s += q * a[i].qs[e];
            }
            isum += sc[g] * s;
        }
        sum += a[i].d * h2f(w[i].d) * (float)isum;
    }
    return sum;
}

static float vdot_q4_k(const void *row, const void *xq, size_t n) {
    const flm_block_q4_k *w = row;
    const flm_block_q8_k *a = xq;
    float sum = 0.0f;
    for (size_t i = 0; i < n / 256; i++) {
        uint8_t sm[16];
        flm_q4k_scales(w[i].scales, sm);
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = w[i].qs + 32 * (j >> 1);
            const int shift = 4 * (j & 1);
            int s = 0;
            for (int l = 0; l < 32; l++) s += ((q[l] >> shift) & 0x0f) * a[i].qs[32 * j + l];
            isum += sm[j] * s;
            msum += sm[8 + j] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
        }
        sum += a[i].d * (h2f(w[i].d) * (float)isum - h2f(w[i].dmin) * (float)msum);
    }
    return sum;
}

static float vdot_q5_k(const void *row, const void *xq, size_t n) {
    const flm_block_q5_k *w = row;
    const flm_block_q8_k *a = xq;
    float sum = 0.0f;
    for (size_t i = 0; i < n / 256; i++) {
        uint8_t sm[16];
        flm_q4k_scales(w[i].scales, sm);
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = w[i].qs + 32 * (j >> 1);
            const int shift = 4 * (j & 1);
            int s = 0;
            for (int l = 0; l < 32; l++)
                s += (((q[l] >> shift) & 0x0f) | (((w[i].qh[l] >> j) & 1) << 4)) * a[i].qs[32 * j + l];
            isum += sm[j] * s;
            msum += sm[8 + j] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
        }
        sum += a[i].d * (h2f(w[i].d) * (float)isum - h2f(w[i].dmin) * (float)msum);
    }
    return sum;
}

static float vdot_q6_k(const void *row, const void *xq, size_t n) {
    const flm_block_q6_k *w = row;
    const flm_block_q8_k *a = xq;
    float sum = 0.0f;
    for (size_t i = 0; i < n / 256; i++) {
        int isum = 0;
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int k = 0; k < 16; k++) {
                int e = 16 * g + k;
                s += (q6k_val(&w[i], e >> 7, e & 127) - 32) * a[i].qs[e];
            }
            isum += w[i].scales[g] * s;
        }
        sum += a[i].d * h2f(w[i].d) * (float)isum;
    }
    return sum;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Quantizers (ggml-quants.c quantize_row_*_ref)
 * ------------------------------------------------------------------------------------------------------------- */
void flm_quantize_q8_0(const float *x, void *dst, size_t nb) {
    flm_block_q8_0 *y = dst;
    for (size_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = flm_f32_to_f16(d);
        for (int j = 0; j < 32; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

void flm_quantize_q8_1(const float *x, void *dst, size_t nb) {
    flm_block_q8_1 *y = dst;
    for (size_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = flm_f32_to_f16(d);
        y[i].s = flm_f32_to_f16((float)sum * d);
    }
}

void flm_quantize_q8_k(const float *x, void *dst, size_t nb) {
    flm_block_q8_k *y = dst;
    for (size_t i = 0; i < nb; i++, x += 256) {
        float amax = 0.0f;
        for (int j = 0; j < 256; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = d;
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 16 * g; j < 16 * g + 16; j++) {
                y[i].qs[j] = (int8_t)roundf(x[j] * id);
                s += y[i].qs[j];
            }
            y[i].bsums[g] = (int16_t)s;
        }
    }
}

/* The signed value of largest magnitude in x[32] (the first one on ties), as q4_0/q5_0 use. */
static float signed_absmax(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

void flm_quantize_q4_0(const float *x, void *dst, size_t nb) {
    flm_block_q4_0 *y = dst;
    for (size_t i = 0; i < nb; i++, x += 32) {
        const float d = signed_absmax(x) / -8.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = flm_f32_to_f16(d);
        for (int j = 0; j < 16; j++) {
            int q0 = (int8_t)(x[j] * id + 8.5f), q1 = (int8_t)(x[j + 16] * id + 8.5f);
            if (q0 > 15) q0 = 15;
            if (q1 > 15) q1 = 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* min and max of x[32] */
static void minmax32(const float *x, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

void flm_quantize_q4_1(const float *x, void *dst, size_t nb) {
    flm_block_q4_1 *y = dst;
    for (size_t i = 0; i < nb; i++, x += 32) {
        float mn, mx;
        minmax32(x, &mn, &mx);
        const float d = (mx - mn) / 15.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = flm_f32_to_f16(d);
        y[i].m = flm_f32_to_f16(mn);
        for (int j = 0; j < 16; j++) {
            int q0 = (int8_t)((x[j] - mn) * id + 0.5f), q1 = (int8_t)((x[j + 16] - mn) * id + 0.5f);
            if (q0 > 15) q0 = 15;
            if (q1 > 15) q1 = 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void flm_quantize_q5_0(const float *x, void *dst, size_t nb) {
    flm_block_q5_0 *y = dst;
    for (size_t i = 0; i < nb; i++, x += 32) {
        const float d = signed_absmax(x) / -16.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = flm_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (int8_t)(x[j] * id + 16.5f), q1 = (int8_t)(x[j + 16] * id + 16.5f);
            if (q0 > 31) q0 = 31;
            if (q1 > 31) q1 = 31;
            y[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)((q0 & 0x10) >> 4) << j;
            qh |= (uint32_t)((q1 & 0x10) >> 4) << (j + 16);
        }
        for (int k = 0; k < 4; k++) y[i].qh[k] = (uint8_t)(qh >> (8 * k));
    }
}

void flm_quantize_q5_1(const float *x, void *dst, size_t nb) {
    flm_block_q5_1 *y = dst;
    for (size_t i = 0; i < nb; i++, x += 32) {
        float mn, mx;
        minmax32(x, &mn, &mx);
        const float d = (mx - mn) / 31.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = flm_f32_to_f16(d);
        y[i].m = flm_f32_to_f16(mn);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (uint8_t)((x[j] - mn) * id + 0.5f), q1 = (uint8_t)((x[j + 16] - mn) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)((q0 & 0x10) >> 4) << j;
            qh |= (uint32_t)((q1 & 0x10) >> 4) << (j + 16);
        }
        for (int k = 0; k < 4; k++) y[i].qh[k] = (uint8_t)(qh >> (8 * k));
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Table fill
 * ------------------------------------------------------------------------------------------------------------- */
/* vec_dot for float weight types: xq is x itself (vec_dot_type f32), so it is the float-x dot of the same table. */
#define FLOAT_VDOT(T)                                                                                             \
    static float vdot_##T(const void *row, const void *xq, size_t n) {                                            \
        return flm_kernels_scalar()->dot[FLM_TYPE_##T](row, xq, n);                                               \
    }
FLOAT_VDOT(F32)
FLOAT_VDOT(F16)
FLOAT_VDOT(BF16)

/* The activation buffers of the 32-element types: blocks, then the float scales (kernels.h flm_act_bytes). */
static void aq_q8_0(const float *x, void *dst, size_t n) {
    const size_t nb = n / 32;
    flm_quantize_q8_0(x, dst, nb);
    const flm_block_q8_0 *b = dst;
    uint8_t *tail = (uint8_t *)dst + nb * sizeof *b;
    for (size_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d);
        int32_t sum = 0;
        for (int j = 0; j < 32; j++) sum += b[i].qs[j];
        memcpy(tail + i * sizeof d, &d, sizeof d);
        memcpy(tail + (nb + i) * sizeof sum, &sum, sizeof sum);
    }
}

static void aq_q8_1(const float *x, void *dst, size_t n) {
    const size_t nb = n / 32;
    flm_quantize_q8_1(x, dst, nb);
    const flm_block_q8_1 *b = dst;
    uint8_t *tail = (uint8_t *)dst + nb * sizeof *b;
    for (size_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d), s = h2f(b[i].s);
        memcpy(tail + i * sizeof d, &d, sizeof d);
        memcpy(tail + (nb + i) * sizeof s, &s, sizeof s);
    }
}
static void aq_q8_k(const float *x, void *dst, size_t n) { flm_quantize_q8_k(x, dst, n / 256); }

void flm_quants_fill_scalar(flm_kernels *k) {
    k->act_quantize[FLM_TYPE_Q8_0] = aq_q8_0;
    k->act_quantize[FLM_TYPE_Q8_1] = aq_q8_1;
    k->act_quantize[FLM_TYPE_Q8_K] = aq_q8_k;
#define SET(ID, T)                                                                                                \
    do {                                                                                                          \
        k->dequant[ID] = dequant_##T;                                                                             \
        k->dot[ID] = dot_##T;                                                                                     \
        k->axpy[ID] = axpy_##T;                                                                                   \
    } while (0)
    SET(FLM_TYPE_Q4_1, q4_1);
    SET(FLM_TYPE_Q5_0, q5_0);
    SET(FLM_TYPE_Q5_1, q5_1);
    SET(FLM_TYPE_Q8_1, q8_1);
    SET(FLM_TYPE_Q2_K, q2_k);
    SET(FLM_TYPE_Q3_K, q3_k);
    SET(FLM_TYPE_Q4_K, q4_k);
    SET(FLM_TYPE_Q5_K, q5_k);
    SET(FLM_TYPE_Q6_K, q6_k);
    SET(FLM_TYPE_Q8_K, q8_k);
#undef SET
    k->vec_dot[FLM_TYPE_F32] = vdot_F32;
    k->vec_dot[FLM_TYPE_F16] = vdot_F16;
    k->vec_dot[FLM_TYPE_BF16] = vdot_BF16;
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
