/* quants_y256.h — L_compute: the 256-bit kernels of the quantized types: vec_dot against activations quantized once
 * per matvec (int8 arithmetic, as ggml's ggml_vec_dot_*_q8_* on AVX2) for every quantized type, the activation
 * quantizers, dequant/axpy of q4_1, q5_0, q5_1, q4_k, q6_k, float-x dot of all the quantized types of quants.c
 * (through their dequantizers), and the tiled dots of quants_tile_x86.h. See quants.h. Included once per 256-bit
 * level, by a file compiled with that level's flags, which defines before including it:
 *   Y256_FILL        the name of the level's fill function (quants.h);
 *   Y256_VNNI        1 where AVX-VNNI's 256-bit vpdpbusd / vpdpwssd exist (quants_avxvnni.c), 0 for plain AVX2
 *                    (quants_avx2.c). With 1 the int8 x int8 sums of q8_0 are one vpdpbusd each and every int16
 *                    pair sum times its scale is added by one vpdpwssd, where AVX2 takes vpmaddubsw + vpmaddwd
 *                    (+ vpaddd); the integer sums are the same, so both levels give the same bits.
 * Types without a kernel here keep the scalar entries the table was copied from.
 *
 * The int8 products use _mm256_maddubs_epi16 (unsigned x signed bytes, pairs summed to int16), which saturates at
 * 32767: every use below keeps |pair sum| <= 2 * 63 * 127 = 16002 (weights are unsigned 6-bit at most, activations
 * are in [-127, 127]: flm_act_quantize never writes -128). Sums of products are exact integers; each block adds one
 * float product, so results match the scalar reference to float rounding. */
#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "compute/quants.h"
#include "compute/quants_x86.h"
#include "core/types.h"

/* The int8 products. DPWSSD(acc, p, s) adds to acc, in each int32 lane, the products of the int16 pairs of p and s
 * (the K-quants' pair sums times their scales). q8_0's signed x signed bytes: DOT_Q8(u, s) of 32 unsigned bytes u
 * and 32 signed bytes s gives their partial sums, as 16 int16 pair sums (AVX2: vpmaddubsw, to be widened by
 * Q8_I32) or as 8 int32 sums of four (AVX-VNNI: vpdpbusd), and SUM4_Q8 reduces four blocks' partial sums to 4 int32.
 * The 4- and 5-bit types keep vpmaddubsw at both levels: four of their int16 pair sums still fit int16, and that
 * reduction (sum4_i16) is shorter than vpdpbusd's int32 one (counted: 87 against 93 instructions per 256 q4_0
 * weights). */
#if Y256_VNNI
#define DPWSSD(acc, p, s) _mm256_dpwssd_avx_epi32((acc), (p), (s))
#define DOT_Q8(u, s) _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), (u), (s))
#define Q8_I32(p) (p)
#define SUM4_Q8 sum4_i32
#else
#define DPWSSD(acc, p, s) _mm256_add_epi32((acc), _mm256_madd_epi16((p), (s)))
#define DOT_Q8(u, s) _mm256_maddubs_epi16((u), (s))
#define Q8_I32(p) PAIRS_I32(p)
#define SUM4_Q8(p0, p1, p2, p3) sum4_i32(Q8_I32(p0), Q8_I32(p1), Q8_I32(p2), Q8_I32(p3))
#endif
#define PAIRS_I32(p) _mm256_madd_epi16((p), _mm256_set1_epi16(1)) /* 16 int16 pair sums -> 8 int32 */

/* The loop shared by the 32-element types. PAIRS(i) yields block i's partial sums, TO_I32 makes them 8 int32
 * lanes; SUM4 reduces four of them to 4 int32 (sum4_i16 when four pair sums fit int16, else SUM4_Q8); ADJ4(s4, i) and
 * ADJ1(i) correct the integer sums of blocks i..i+3 / block i for an offset taken out of the weights (q4_0, q5_0:
 * their unsigned values are dotted, and the offset times the activations' block sums subtracted, exactly). ad: the
 * activation scales as float32 (the buffer's tail). Leaves acc4 (4 partial sums) and tail (the last nb % 4). */
#define VDOT32_LOOP(PAIRS, TO_I32, SUM4, ADJ4, ADJ1)                                                                     \
    const size_t nb = n / 32;                                                                                     \
    const uint8_t *ad = FLM_ACT_TAIL(xq, nb, *a);                                                                 \
    __m128 acc4 = _mm_setzero_ps();                                                                               \
    size_t i = 0;                                                                                                 \
    for (; i + 4 <= nb; i += 4) {                                                                                 \
        const __m128i s4 = ADJ4(SUM4(PAIRS(i), PAIRS(i + 1), PAIRS(i + 2), PAIRS(i + 3)), i);                    \
        acc4 = _mm_fmadd_ps(_mm_mul_ps(D4(w, i, d), ld4f(ad + 4 * i)), _mm_cvtepi32_ps(s4), acc4);               \
    }                                                                                                             \
    float tail = 0.0f;                                                                                            \
    for (; i < nb; i++)                                                                                           \
        tail += h2f(w[i].d) * h2f(a[i].d) *                                                                       \
                (float)(hsum_i32(TO_I32(PAIRS(i))) + ADJ1(i));

#define NO_ADJ4(s4, i) (s4)
#define NO_ADJ1(i) 0

/* DOT_Q8 of signed x and y: |x| times y with x's sign (q8_0's pair sums reach 2 * 127 * 127: SUM4_Q8) */
static inline __m256i pairs_s8(__m256i x, __m256i y) {
    return DOT_Q8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

static float vdot_q8_0(const void *row, const void *xq, size_t n) {
    const flm_block_q8_0 *w = row;
    const flm_block_q8_0 *a = xq;
#define P_Q8_0(k) pairs_s8(ld256(w[k].qs), ld256(a[k].qs))
    VDOT32_LOOP(P_Q8_0, Q8_I32, SUM4_Q8, NO_ADJ4, NO_ADJ1)
    return hsum_ps128(acc4) + tail;
}

/* q4_0: sum((q - 8) qa) = sum(q qa) - 8 sum(qa), the block sums of qa from the activation buffer's tail (after the
 * float scales). q <= 15: pair sums <= 2 * 15 * 127 = 3810 */
static float vdot_q4_0(const void *row, const void *xq, size_t n) {
    const flm_block_q4_0 *w = row;
    const flm_block_q8_0 *a = xq;
    const uint8_t *asum = FLM_ACT_TAIL(xq, n / 32, *a) + 4 * (n / 32);
#define P_Q4_0(k) _mm256_maddubs_epi16(nibbles32(w[k].qs), ld256(a[k].qs))
#define ADJ4_Q4_0(s4, k) _mm_sub_epi32(s4, _mm_slli_epi32(ld4i(asum + 4 * (k)), 3))
#define ADJ1_Q4_0(k) (-8 * ld1i(asum + 4 * (k)))
    VDOT32_LOOP(P_Q4_0, PAIRS_I32, sum4_i16, ADJ4_Q4_0, ADJ1_Q4_0)
    return hsum_ps128(acc4) + tail;
}

/* q4_1 . q8_1: d_w d_a sum(q * qa) + m_w s_a (s_a = d_a * sum(qa), precomputed by the activation quantizer);
 * q <= 15, pair sums <= 2 * 15 * 127 = 3810 */
static float vdot_q4_1(const void *row, const void *xq, size_t n) {
    const flm_block_q4_1 *w = row;
    const flm_block_q8_1 *a = xq;
#define P_Q4_1(k) _mm256_maddubs_epi16(nibbles32(w[k].qs), ld256(a[k].qs))
    VDOT32_LOOP(P_Q4_1, PAIRS_I32, sum4_i16, NO_ADJ4, NO_ADJ1)
    const uint8_t *as = ad + 4 * nb; /* the s values follow the d values */
    __m128 ms4 = _mm_setzero_ps();
    size_t j = 0;
    for (; j + 4 <= nb; j += 4) ms4 = _mm_fmadd_ps(D4(w, j, m), ld4f(as + 4 * j), ms4);
    for (; j < nb; j++) tail += h2f(w[j].m) * h2f(a[j].s);
    return hsum_ps128(_mm_add_ps(acc4, ms4)) + tail;
}

/* q5_0: sum((q - 16) qa) = sum(q qa) - 16 sum(qa) with q = nibble | fifth bit << 4 <= 31: pair sums <= 7874,
 * four of them 31496 < 32768 */
static float vdot_q5_0(const void *row, const void *xq, size_t n) {
    const flm_block_q5_0 *w = row;
    const flm_block_q8_0 *a = xq;
    const __m256i x10 = _mm256_set1_epi8(0x10);
    const uint8_t *asum = FLM_ACT_TAIL(xq, n / 32, *a) + 4 * (n / 32);
#define P_Q5_0(k) _mm256_maddubs_epi16(_mm256_or_si256(nibbles32(w[k].qs), _mm256_and_si256(bits32(w[k].qh), x10)), ld256(a[k].qs))
#define ADJ4_Q5_0(s4, k) _mm_sub_epi32(s4, _mm_slli_epi32(ld4i(asum + 4 * (k)), 4))
#define ADJ1_Q5_0(k) (-16 * ld1i(asum + 4 * (k)))
    VDOT32_LOOP(P_Q5_0, PAIRS_I32, sum4_i16, ADJ4_Q5_0, ADJ1_Q5_0)
    return hsum_ps128(acc4) + tail;
}

/* q5_1: q <= 31, pair sums <= 7874, four of them 31496 < 32768 */
static float vdot_q5_1(const void *row, const void *xq, size_t n) {
    const flm_block_q5_1 *w = row;
    const flm_block_q8_1 *a = xq;
    const __m256i x10 = _mm256_set1_epi8(0x10);
#define P_Q5_1(k) _mm256_maddubs_epi16(_mm256_or_si256(nibbles32(w[k].qs), _mm256_and_si256(bits32(w[k].qh), x10)), ld256(a[k].qs))
    VDOT32_LOOP(P_Q5_1, PAIRS_I32, sum4_i16, NO_ADJ4, NO_ADJ1)
    const uint8_t *as = ad + 4 * nb;
    __m128 ms4 = _mm_setzero_ps();
    size_t j = 0;
    for (; j + 4 <= nb; j += 4) ms4 = _mm_fmadd_ps(D4(w, j, m), ld4f(as + 4 * j), ms4);
    for (; j < nb; j++) tail += h2f(w[j].m) * h2f(a[j].s);
    return hsum_ps128(_mm_add_ps(acc4, ms4)) + tail;
}

/* ---------------------------------------------------------------------------------------------------------------
 * vec_dot, K-quants (super-blocks of 256 against q8_k)
 * ------------------------------------------------------------------------------------------------------------- */
/* 16 int8 scales s -> 16 int16 lanes: the low 8 lanes s[g], the high 8 lanes s[g+1] (one 32-element chunk of
 * 16-element groups g, g+1 after maddubs, whose int16 lanes 0..7 cover elements 0..15). */
static inline __m256i scale_pair(__m128i s, int g) {
    const __m128i idx = _mm_set_epi64x((long long)(0x0101010101010101ull * (uint64_t)(g + 1)),
                                       (long long)(0x0101010101010101ull * (uint64_t)g));
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s, idx));
}

/* int16 lane k of a vector holding 8 int16 in each 128-bit half, broadcast to all 16 lanes */
static inline __m256i lane16(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x0100 + 0x0202 * k)));
}

/* q4_k and q5_k: per super-block d*da * sum_j sc_j sum(q*qa) - dmin*da * sum_j m_j (bsums[2j] + bsums[2j+1]). The two
 * layouts share d, dmin and scales at the start of a block (core/types.h); q is the nibble, plus for q5_k (has_qh)
 * the fifth bit from qh. Inlined with constant arguments, so each type gets its own loop. */
static inline __attribute__((always_inline)) float vdot_k45(const uint8_t *w, size_t bb, size_t qs_off,
                                                             bool has_qh, size_t qh_off, const void *xq, size_t n) {
    const flm_block_q8_k *a = xq;
    const size_t nb = n / 256;
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    for (size_t i = 0; i < nb; i++) {
        const uint8_t *b = w + i * bb; /* d, dmin, scales: at the same offsets in both */
        uint16_t hd, hm;
        memcpy(&hd, b + offsetof(flm_block_q4_k, d), 2);
        memcpy(&hm, b + offsetof(flm_block_q4_k, dmin), 2);
        uint64_t sc8, mn8;
        q4k_scales8(b + offsetof(flm_block_q4_k, scales), &sc8, &mn8);
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        const float d = a[i].d * h2f(hd), dmin = a[i].d * h2f(hm);
        /* mins: 8 int16 mins times the 8 pair sums of bsums */
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)a[i].bsums);
        const __m128i bs2 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, bs2)), acc_m);
        const uint8_t *qs = b + qs_off;
        const __m256i hb = has_qh ? _mm256_loadu_si256((const __m256i *)(b + qh_off)) : _mm256_setzero_si256();
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i ql = _mm256_and_si256(q4, m4), qh = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            if (has_qh) { /* fifth bits: bit 2j of qh[l] for the low nibbles, bit 2j+1 for the high ones */
                ql = _mm256_or_si256(ql, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one), 4));
                qh = _mm256_or_si256(qh, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one), 4));
            }
            const __m256i yl = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * j));
            const __m256i yh = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * j + 32));
            sumi = DPWSSD(sumi, _mm256_maddubs_epi16(ql, yl), lane16(sc16, 2 * j));
            sumi = DPWSSD(sumi, _mm256_maddubs_epi16(qh, yh), lane16(sc16, 2 * j + 1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc) - hsum_ps128(acc_m);
}

static float vdot_q4_k(const void *row, const void *xq, size_t n) {
    return vdot_k45(row, sizeof(flm_block_q4_k), offsetof(flm_block_q4_k, qs), false, 0, xq, n);
}

static float vdot_q5_k(const void *row, const void *xq, size_t n) {
    return vdot_k45(row, sizeof(flm_block_q5_k), offsetof(flm_block_q5_k, qs), true, offsetof(flm_block_q5_k, qh),
                    xq, n);
}

/* q6_k: d*da * sum_g sc_g * sum((q - 32) * qa) = d*da * (sum_g sc_g sum(q*qa) - 32 sum_g sc_g bsums_g) */
static float vdot_q6_k(const void *row, const void *xq, size_t n) {
    const flm_block_q6_k *w = row;
    const flm_block_q8_k *a = xq;
    const size_t nb = n / 256;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
    __m256 acc = _mm256_setzero_ps();
    for (size_t i = 0; i < nb; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)w[i].scales);
        /* the -32 offset through the block sums */
        const __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8),
                                               _mm256_loadu_si256((const __m256i *)a[i].bsums));
        __m256i sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
        for (int h = 0; h < 2; h++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h + 32));
            const __m256i lo[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                                   _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
            for (int s = 0; s < 4; s++) {
                const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), m2), 4);
                const __m256i q = _mm256_or_si256(lo[s], hi);
                const __m256i y = _mm256_loadu_si256((const __m256i *)(a[i].qs + 128 * h + 32 * s));
                const __m256i p = _mm256_maddubs_epi16(q, y);
                sumi = DPWSSD(sumi, p, scale_pair(sc8, 8 * h + 2 * s));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[i].d * h2f(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

/* q2_k: d*da * sum_g (sc_g & 15) sum(q*qa) - dmin*da * sum_g (sc_g >> 4) bsums_g */
static float vdot_q2_k(const void *row, const void *xq, size_t n) {
    const flm_block_q2_k *w = row;
    const flm_block_q8_k *a = xq;
    const size_t nb = n / 256;
    const __m256i m2 = _mm256_set1_epi8(0x03);
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (size_t i = 0; i < nb; i++) {
        const __m128i s8 = _mm_loadu_si128((const __m128i *)w[i].scales);
        const __m128i sc = _mm_and_si128(s8, _mm_set1_epi8(0x0f));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(0x0f)));
        const __m256i pm = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)a[i].bsums));
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q2 = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(q2, 2 * s), m2);
                const __m256i y = _mm256_loadu_si256((const __m256i *)(a[i].qs + 128 * h + 32 * s));
                sumi = DPWSSD(sumi, _mm256_maddubs_epi16(q, y), scale_pair(sc, 8 * h + 2 * s));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[i].d * h2f(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
        __m128i pm4 = _mm_add_epi32(_mm256_castsi256_si128(pm), _mm256_extracti128_si256(pm, 1));
        pm4 = _mm_add_epi32(pm4, _mm_shuffle_epi32(pm4, 0x4e));
        pm4 = _mm_add_epi32(pm4, _mm_shuffle_epi32(pm4, 0xb1));
        summ += a[i].d * h2f(w[i].dmin) * (float)_mm_cvtsi128_si32(pm4);
    }
    return hsum_ps(acc) - summ;
}

/* q3_k: q = q2 - 4 * (hmask bit clear); d*da * sum_g (sc_g - 32) sum(q*qa) */
static float vdot_q3_k(const void *row, const void *xq, size_t n) {
    const flm_block_q3_k *w = row;
    const flm_block_q8_k *a = xq;
    const size_t nb = n / 256;
    const __m256i m2 = _mm256_set1_epi8(0x03), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    for (size_t i = 0; i < nb; i++) {
        int8_t scv[16];
        for (int g = 0; g < 16; g++) { /* ggml-quants.c's Q3_K scale packing (see quants.c q3k_scales) */
            int lo = g < 8 ? (w[i].scales[g] & 0x0f) : (w[i].scales[g - 8] >> 4);
            int hi = (w[i].scales[8 + (g & 3)] >> (2 * (g >> 2))) & 3;
            scv[g] = (int8_t)((lo | (hi << 4)) - 32);
        }
        const __m128i sc = _mm_loadu_si128((const __m128i *)scv);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)w[i].hmask);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q2 = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(q2, 2 * s), m2);
                /* 4 where the high bit (bit 4h+s of hmask[l]) is clear */
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + s), one);
                const __m256i q4 = _mm256_slli_epi16(_mm256_xor_si256(hb, one), 2);
                const __m256i y = _mm256_loadu_si256((const __m256i *)(a[i].qs + 128 * h + 32 * s));
                const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(q4, y));
                sumi = DPWSSD(sumi, p, scale_pair(sc, 8 * h + 2 * s));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[i].d * h2f(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

/* ---------------------------------------------------------------------------------------------------------------
 * axpy and dequant of the 32-element types with an offset (y += a * (d*q + m)): the bundle FFN's down columns
 * ------------------------------------------------------------------------------------------------------------- */
static inline __m256 u8lo_ps(__m256i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm256_castsi256_si128(v))); }

/* The 32 element values of a block as four vectors of 8 floats: v = d*q + m (q unsigned bytes in qb). The same
 * two roundings as the scalar code (product, then sum), no fma, so dequant agrees bit for bit. */
static inline void vals_dqm(__m256i qb, float d, float m, __m256 out[4]) {
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    const __m128i lo = _mm256_castsi256_si128(qb), hi = _mm256_extracti128_si256(qb, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++)
        out[k] = _mm256_add_ps(_mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k]))), vm);
}

static void dequant_q4_1(const void *row, float *y, size_t n) {
    const flm_block_q4_1 *b = row;
    for (size_t i = 0; i < n / 32; i++, y += 32) {
        __m256 v[4];
        vals_dqm(nibbles32(b[i].qs), h2f(b[i].d), h2f(b[i].m), v);
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, v[k]);
    }
}

static void axpy_q4_1(const void *row, float a, float *y, size_t n) {
    const flm_block_q4_1 *b = row;
    const __m256 va = _mm256_set1_ps(a);
    for (size_t i = 0; i < n / 32; i++, y += 32) {
        __m256 v[4];
        vals_dqm(nibbles32(b[i].qs), h2f(b[i].d), h2f(b[i].m), v);
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, _mm256_fmadd_ps(va, v[k], _mm256_loadu_ps(y + 8 * k)));
    }
}

static void dequant_q5_1(const void *row, float *y, size_t n) {
    const flm_block_q5_1 *b = row;
    for (size_t i = 0; i < n / 32; i++, y += 32) {
        __m256 v[4];
        const __m256i q = _mm256_or_si256(nibbles32(b[i].qs), _mm256_and_si256(bits32(b[i].qh), _mm256_set1_epi8(0x10)));
        vals_dqm(q, h2f(b[i].d), h2f(b[i].m), v);
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, v[k]);
    }
}

static void axpy_q5_1(const void *row, float a, float *y, size_t n) {
    const flm_block_q5_1 *b = row;
    const __m256 va = _mm256_set1_ps(a);
    for (size_t i = 0; i < n / 32; i++, y += 32) {
        __m256 v[4];
        const __m256i q = _mm256_or_si256(nibbles32(b[i].qs), _mm256_and_si256(bits32(b[i].qh), _mm256_set1_epi8(0x10)));
        vals_dqm(q, h2f(b[i].d), h2f(b[i].m), v);
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, _mm256_fmadd_ps(va, v[k], _mm256_loadu_ps(y + 8 * k)));
    }
}

/* q5_0: the signed values q - 16 as four vectors of 8 floats, times d */
static inline void vals_q5_0(const flm_block_q5_0 *b, __m256 out[4]) {
    const __m256i q = _mm256_or_si256(nibbles32(b->qs), _mm256_andnot_si256(bits32(b->qh), _mm256_set1_epi8((char)0xf0)));
    const __m256 vd = _mm256_set1_ps(h2f(b->d));
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++) out[k] = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])));
}

static void dequant_q5_0(const void *row, float *y, size_t n) {
    const flm_block_q5_0 *b = row;
    for (size_t i = 0; i < n / 32; i++, y += 32) {
        __m256 v[4];
        vals_q5_0(&b[i], v);
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, v[k]);
    }
}

static void axpy_q5_0(const void *row, float a, float *y, size_t n) {
    const flm_block_q5_0 *b = row;
    const __m256 va = _mm256_set1_ps(a);
    for (size_t i = 0; i < n / 32; i++, y += 32) {
        __m256 v[4];
        vals_q5_0(&b[i], v);
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, _mm256_fmadd_ps(va, v[k], _mm256_loadu_ps(y + 8 * k)));
    }
}

/* Float-x dot of any type through its (scalar or SIMD) block dequantizer and an FMA dot, 256 elements at a time.
 * Used for the types without a dedicated float-x kernel. */
#define DOT_VIA_DEQUANT(T, DEQ, BE, BB)                                                                           \
    static float dot_##T(const void *row, const float *x, size_t n) {                                             \
        const uint8_t *r = row;                                                                                   \
        _Alignas(32) float tmp[256];                                                                              \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                                           \
        const size_t per = 256 / (BE) * (BE); /* whole blocks per chunk */                                       \
        for (size_t i = 0; i < n; i += per) {                                                                     \
            size_t m = n - i < per ? n - i : per;                                                                 \
            DEQ(r + i / (BE) * (BB), tmp, m);                                                                     \
            for (size_t j = 0; j < m; j += 16) {                                                                  \
                acc0 = _mm256_fmadd_ps(_mm256_load_ps(tmp + j), _mm256_loadu_ps(x + i + j), acc0);                \
                acc1 = _mm256_fmadd_ps(_mm256_load_ps(tmp + j + 8), _mm256_loadu_ps(x + i + j + 8), acc1);        \
            }                                                                                                     \
        }                                                                                                         \
        return hsum_ps(_mm256_add_ps(acc0, acc1));                                                                \
    }

DOT_VIA_DEQUANT(q4_1, dequant_q4_1, 32, sizeof(flm_block_q4_1))
DOT_VIA_DEQUANT(q5_0, dequant_q5_0, 32, sizeof(flm_block_q5_0))
DOT_VIA_DEQUANT(q5_1, dequant_q5_1, 32, sizeof(flm_block_q5_1))

/* 32 bytes q (unsigned, or signed when SIGNED) -> y[0..31] = dl * q - ml, elementwise, product then difference
 * (the scalar code's two roundings; no fma). Covers two 16-element groups when dl/ml differ per half: dl0/ml0 for
 * elements 0..15, dl1/ml1 for 16..31. */
static inline void store_dq32(__m256i q, bool is_signed, float dl0, float ml0, float dl1, float ml1, float *y) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++) {
        const __m256i w = is_signed ? _mm256_cvtepi8_epi32(parts[k]) : _mm256_cvtepu8_epi32(parts[k]);
        const __m256 dl = _mm256_set1_ps(k < 2 ? dl0 : dl1), ml = _mm256_set1_ps(k < 2 ? ml0 : ml1);
        _mm256_storeu_ps(y + 8 * k, _mm256_sub_ps(_mm256_mul_ps(dl, _mm256_cvtepi32_ps(w)), ml));
    }
}

static void dequant_q4_k(const void *row, float *y, size_t n) {
    const flm_block_q4_k *b = row;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (size_t i = 0; i < n / 256; i++, y += 256) {
        uint64_t sc8, mn8;
        q4k_scales8(b[i].scales, &sc8, &mn8);
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int j = 0; j < 4; j++) {
            const __m256i q4 = ld256(b[i].qs + 32 * j);
            const int s0 = (int)(sc8 >> (16 * j)) & 0xff, s1 = (int)(sc8 >> (16 * j + 8)) & 0xff;
            const int m0 = (int)(mn8 >> (16 * j)) & 0xff, m1 = (int)(mn8 >> (16 * j + 8)) & 0xff;
            const float dl0 = d * (float)s0, ml0 = dmin * (float)m0, dl1 = d * (float)s1, ml1 = dmin * (float)m1;
            store_dq32(_mm256_and_si256(q4, m4), false, dl0, ml0, dl0, ml0, y + 64 * j);
            store_dq32(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4), false, dl1, ml1, dl1, ml1, y + 64 * j + 32);
        }
    }
}

static void dequant_q6_k(const void *row, float *y, size_t n) {
    const flm_block_q6_k *b = row;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03), k32 = _mm256_set1_epi8(32);
    for (size_t i = 0; i < n / 256; i++, y += 256) {
        const float d = h2f(b[i].d);
        for (int h = 0; h < 2; h++) {
            const __m256i qh = ld256(b[i].qh + 32 * h), l0 = ld256(b[i].ql + 64 * h), l1 = ld256(b[i].ql + 64 * h + 32);
            const __m256i lo[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                                   _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
            for (int s = 0; s < 4; s++) {
                const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), m2), 4);
                const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo[s], hi), k32);
                const int g = 8 * h + 2 * s;
                store_dq32(q, true, d * (float)b[i].scales[g], 0.0f, d * (float)b[i].scales[g + 1], 0.0f,
                           y + 128 * h + 32 * s);
            }
        }
    }
}

/* K-quants without an AVX2 dequantizer: the table's (scalar) one of the same type, looked up once */
static flm_dequant_fn kdeq[FLM_N_TYPES];
static void deq_q2_k(const void *r, float *y, size_t n) { kdeq[FLM_TYPE_Q2_K](r, y, n); }
static void deq_q3_k(const void *r, float *y, size_t n) { kdeq[FLM_TYPE_Q3_K](r, y, n); }
static void deq_q5_k(const void *r, float *y, size_t n) { kdeq[FLM_TYPE_Q5_K](r, y, n); }
DOT_VIA_DEQUANT(q2_k, deq_q2_k, 256, sizeof(flm_block_q2_k))
DOT_VIA_DEQUANT(q3_k, deq_q3_k, 256, sizeof(flm_block_q3_k))
DOT_VIA_DEQUANT(q4_k, dequant_q4_k, 256, sizeof(flm_block_q4_k))
DOT_VIA_DEQUANT(q5_k, deq_q5_k, 256, sizeof(flm_block_q5_k))
DOT_VIA_DEQUANT(q6_k, dequant_q6_k, 256, sizeof(flm_block_q6_k))

/* ---------------------------------------------------------------------------------------------------------------
 * Activation quantizers: the same bytes as quants.c's scalar ones (same amax, d, 1/d, x*id products; roundf's
 * round-half-away-from-zero done exactly: trunc, then +-1 when the exact remainder is at least one half).
 * ------------------------------------------------------------------------------------------------------------- */
static inline __m256i round_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t)); /* exact */
    const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 step = _mm256_and_ps(up, _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, sign)));
    return _mm256_cvttps_epi32(_mm256_add_ps(t, step));
}

static inline float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 32 floats at x times id, rounded, as 32 int8 in element order; *sum gets their sum when non-NULL. */
static inline __m256i quant32(const float *x, __m256 id, int *sum) {
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = round_away(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), id));
    if (sum) {
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        *sum = _mm_cvtsi128_si32(s4);
    }
    /* packs interleave 128-bit lanes: dwords come out as a0 b0 c0 d0 a1 b1 c1 d1; put them back in order */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline float amax_n(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    return hmax_ps(m);
}

/* 32-element activation buffers: the blocks, then their scales as float32 (kernels.h flm_act_bytes) */
static void aq_q8_0(const float *x, void *dst, size_t n) {
    flm_block_q8_0 *y = dst;
    const size_t nb = n / 32;
    uint8_t *tail = (uint8_t *)dst + nb * sizeof *y;
    for (size_t i = 0; i < nb; i++, x += 32) {
        const float d = amax_n(x, 32) / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT); /* = flm_f32_to_f16 (test_kernels) */
        const float df = _cvtsh_ss(y[i].d);
        memcpy(tail + 4 * i, &df, 4);
        int32_t sum;
        _mm256_storeu_si256((__m256i *)y[i].qs, quant32(x, _mm256_set1_ps(id), &sum));
        memcpy(tail + 4 * (nb + i), &sum, 4);
    }
}

static void aq_q8_1(const float *x, void *dst, size_t n) {
    flm_block_q8_1 *y = dst;
    const size_t nb = n / 32;
    uint8_t *tail = (uint8_t *)dst + nb * sizeof *y;
    for (size_t i = 0; i < nb; i++, x += 32) {
        const float d = amax_n(x, 32) / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        int sum;
        _mm256_storeu_si256((__m256i *)y[i].qs, quant32(x, _mm256_set1_ps(id), &sum));
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT); /* = flm_f32_to_f16 (test_kernels) */
        y[i].s = _cvtss_sh((float)sum * d, _MM_FROUND_TO_NEAREST_INT);
        const float df = _cvtsh_ss(y[i].d), sf = _cvtsh_ss(y[i].s);
        memcpy(tail + 4 * i, &df, 4);
        memcpy(tail + 4 * (nb + i), &sf, 4);
    }
}

static void aq_q8_k(const float *x, void *dst, size_t n) {
    flm_block_q8_k *y = dst;
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (size_t i = 0; i < n / 256; i++, x += 256) {
        const float d = amax_n(x, 256) / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = d;
        for (int c = 0; c < 8; c++) {
            const __m256i q = quant32(x + 32 * c, _mm256_set1_ps(id), NULL);
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * c), q);
            /* lane k: elements 4k..4k+3; lanes 0-3 are group 2c, 4-7 group 2c+1 */
            const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
            __m128i h = _mm_hadd_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            h = _mm_hadd_epi32(h, h);
            y[i].bsums[2 * c] = (int16_t)_mm_cvtsi128_si32(h);
            y[i].bsums[2 * c + 1] = (int16_t)_mm_extract_epi32(h, 1);
        }
    }
}

/* y += a * row through the block dequantizer, 256 elements at a time (the K-quants' down columns) */
#define AXPY_VIA_DEQUANT(T, DEQ, BB)                                                                              \
    static void axpy_##T(const void *row, float a, float *y, size_t n) {                                          \
        const uint8_t *r = row;                                                                                   \
        _Alignas(32) float tmp[256];                                                                              \
        const __m256 va = _mm256_set1_ps(a);                                                                      \
        for (size_t i = 0; i < n; i += 256) {                                                                     \
            DEQ(r + i / 256 * (BB), tmp, 256);                                                                    \
            for (size_t j = 0; j < 256; j += 8)                                                                   \
                _mm256_storeu_ps(y + i + j, _mm256_fmadd_ps(va, _mm256_load_ps(tmp + j), _mm256_loadu_ps(y + i + j))); \
        }                                                                                                         \
    }
AXPY_VIA_DEQUANT(q4_k, dequant_q4_k, sizeof(flm_block_q4_k))
AXPY_VIA_DEQUANT(q6_k, dequant_q6_k, sizeof(flm_block_q6_k))

/* the tiled dots of a batch (quants_tile_x86.h): 4 tokens per micro-tile with 16 vector registers */
#define TILE_T 4
#define TILE_J_UNROLL 4
#define MADDS(acc, p, s) DPWSSD(acc, p, s)
#include "compute/quants_tile_x86.h"

void Y256_FILL(flm_kernels *k) {
    k->act_quantize[FLM_TYPE_Q8_0] = aq_q8_0;
    k->act_quantize[FLM_TYPE_Q8_1] = aq_q8_1;
    k->act_quantize[FLM_TYPE_Q8_K] = aq_q8_k;
    for (uint32_t t = 0; t < FLM_N_TYPES; t++) kdeq[t] = k->dequant[t];
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
    k->dequant[FLM_TYPE_Q4_1] = dequant_q4_1, k->axpy[FLM_TYPE_Q4_1] = axpy_q4_1, k->dot[FLM_TYPE_Q4_1] = dot_q4_1;
    k->dequant[FLM_TYPE_Q5_0] = dequant_q5_0, k->axpy[FLM_TYPE_Q5_0] = axpy_q5_0, k->dot[FLM_TYPE_Q5_0] = dot_q5_0;
    k->dequant[FLM_TYPE_Q5_1] = dequant_q5_1, k->axpy[FLM_TYPE_Q5_1] = axpy_q5_1, k->dot[FLM_TYPE_Q5_1] = dot_q5_1;
    k->dot[FLM_TYPE_Q2_K] = dot_q2_k;
    k->dot[FLM_TYPE_Q3_K] = dot_q3_k;
    k->dot[FLM_TYPE_Q4_K] = dot_q4_k, k->dequant[FLM_TYPE_Q4_K] = dequant_q4_k, k->axpy[FLM_TYPE_Q4_K] = axpy_q4_k;
    k->dot[FLM_TYPE_Q5_K] = dot_q5_k;
    k->dot[FLM_TYPE_Q6_K] = dot_q6_k, k->dequant[FLM_TYPE_Q6_K] = dequant_q6_k, k->axpy[FLM_TYPE_Q6_K] = axpy_q6_k;
    tile_fill(k);
}

