/* quants_x512.h — L_compute: the 512-bit int8 dot products shared by two kernel levels, included once by
 * quants_avx512.c (AVX-512 F/BW/VL: maddubs + madd) and once by quants_vnni.c (AVX-512 VNNI: vpdpbusd / vpdpwssd),
 * each compiled with its own flags. Internal to src/compute/; see quants.h.
 *
 * The includer defines, before including this file:
 *   DPBUSD(acc, u, s): acc plus, in each int32 lane, the sum of the 4 products u8 x s8 of the lane's bytes;
 *   DPWSSD(acc, a, b): acc plus, in each int32 lane, a.lo * b.lo + a.hi * b.hi (int16 halves);
 *   X512(name): the kernel's name in that file; X512_FILL: its table-fill function.
 * With maddubs (which saturates at int16) every pair sum stays below 32767: |u| <= 128 (q8_0 weights, |-128|),
 * |s| <= 127 (flm_act_quantize never writes -128), so 2 * 128 * 127 = 32512.
 *
 * Kernels: vec_dot of q8_0, q4_k, q6_k (the other types keep the avx2 table's).
 *
 * Same answer as the avx2 kernels, bit for bit: each kernel forms the same exact integer sums as its quants_avx2.c
 * counterpart (the 32-element types: one int32 per block; the K-quants: the same 8 int32 lanes per super-block,
 * the two 256-bit halves of a 512-bit accumulator added at the end) and then the same float operations in the same
 * order. Only the integer work is wider. tests/test_kernels.c checks the equality on random blocks. */
#ifndef FLM_COMPUTE_QUANTS_X512_H
#define FLM_COMPUTE_QUANTS_X512_H

#include "compute/quants.h"
#include "compute/quants_x86.h"
#include "core/types.h"

/* lo in the low 256 bits, hi in the high */
static inline __m512i cat256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* [sum of block 0, 1, 2, 3]: p01 holds blocks 0 (low half) and 1 (high half) in 8 int32 lanes each, p23 2 and 3 */
static inline __m128i bsum4(__m512i p01, __m512i p23) {
    return sum4_i32(_mm512_castsi512_si256(p01), _mm512_extracti64x4_epi64(p01, 1), _mm512_castsi512_si256(p23),
                    _mm512_extracti64x4_epi64(p23, 1));
}

/* y negated where x is negative (x = 0 gives y; the product with |x| = 0 is 0 either way) */
static inline __m512i sign_of(__m512i y, __m512i x) {
    return _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
}

/* Four 32-element blocks at a time: WV(k) gives block k's 32 weight bytes (unsigned, or signed with SIGNED), the
 * activations' qs are at a[k].qs; ADJ4 / ADJ1 as in quants_avx2.c's VDOT32_LOOP. Leaves acc4 and tail exactly as
 * that loop does. Only q8_0 uses it: for the nibble types (q4_0, q4_1, q5_0, q5_1) this shape took more
 * instructions per weight than the avx2 kernels (building two blocks' 256-bit weights and inserting them, and the
 * int32 block reductions, outweigh the halved multiplies), so those stay at avx2 for now. */
#define VDOT32_X512(WV, SIGNED, ADJ4, ADJ1)                                                                       \
    const size_t nb = n / 32;                                                                                     \
    const uint8_t *ad = FLM_ACT_TAIL(xq, nb, *a);                                                                 \
    __m128 acc4 = _mm_setzero_ps();                                                                               \
    size_t i = 0;                                                                                                 \
    for (; i + 4 <= nb; i += 4) {                                                                                 \
        const __m512i w01 = cat256(WV(i), WV(i + 1)), w23 = cat256(WV(i + 2), WV(i + 3));                         \
        const __m512i a01 = cat256(ld256(a[i].qs), ld256(a[i + 1].qs));                                           \
        const __m512i a23 = cat256(ld256(a[i + 2].qs), ld256(a[i + 3].qs));                                       \
        const __m512i z = _mm512_setzero_si512();                                                                 \
        const __m512i p01 = SIGNED ? DPBUSD(z, _mm512_abs_epi8(w01), sign_of(a01, w01)) : DPBUSD(z, w01, a01);    \
        const __m512i p23 = SIGNED ? DPBUSD(z, _mm512_abs_epi8(w23), sign_of(a23, w23)) : DPBUSD(z, w23, a23);    \
        const __m128i s4 = ADJ4(bsum4(p01, p23), i);                                                              \
        acc4 = _mm_fmadd_ps(_mm_mul_ps(D4(w, i, d), ld4f(ad + 4 * i)), _mm_cvtepi32_ps(s4), acc4);               \
    }                                                                                                             \
    float tail = 0.0f;                                                                                            \
    for (; i < nb; i++)                                                                                           \
        tail += h2f(w[i].d) * h2f(a[i].d) *                                                                       \
                (float)(hsum_i32(SIGNED ? dot_s8(WV(i), ld256(a[i].qs)) : dot_us8(WV(i), ld256(a[i].qs))) + ADJ1(i));

#define X512_NO_ADJ4(s4, i) (s4)
#define X512_NO_ADJ1(i) 0

static float X512(vdot_q8_0)(const void *row, const void *xq, size_t n) {
    const flm_block_q8_0 *w = row;
    const flm_block_q8_0 *a = xq;
#define WV_Q8_0(k) ld256(w[k].qs)
    VDOT32_X512(WV_Q8_0, 1, X512_NO_ADJ4, X512_NO_ADJ1)
    return hsum_ps128(acc4) + tail;
}

/* int16 lanes 0..15 (the low 256 bits) = word w0 of each 128-bit lane of v, lanes 16..31 = word w1 (v holds the
 * same 8 words in every 128-bit lane) */
static inline __m512i words2(__m512i v, int w0, int w1) {
    const int b0 = (0x0100 + 0x0202 * w0) * 0x10001, b1 = (0x0100 + 0x0202 * w1) * 0x10001;
    return _mm512_shuffle_epi8(v, cat256(_mm256_set1_epi32(b0), _mm256_set1_epi32(b1)));
}

/* q4_k: per super-block d*da * sum_j sc_j sum(q*qa) - dmin*da * sum_j m_j (bsums[2j] + bsums[2j+1]). A 32-byte
 * chunk of qs holds sub-block 2j in its low nibbles and 2j+1 in its high ones, whose activations are the 64
 * contiguous bytes at 64j: one 512-bit step per chunk. */
static float X512(vdot_q4_k)(const void *row, const void *xq, size_t n) {
    const flm_block_q4_k *w = row;
    const flm_block_q8_k *a = xq;
    const size_t nb = n / 256;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    for (size_t i = 0; i < nb; i++) {
        uint64_t sc8, mn8;
        q4k_scales8(w[i].scales, &sc8, &mn8);
        const __m512i sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        const float d = a[i].d * h2f(w[i].d), dmin = a[i].d * h2f(w[i].dmin);
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)a[i].bsums);
        const __m128i bs2 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, bs2)), acc_m);
        __m512i s = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            const __m256i q4 = ld256(w[i].qs + 32 * j);
            const __m512i q = _mm512_and_si512(cat256(q4, _mm256_srli_epi16(q4, 4)), m4);
            const __m512i y = _mm512_loadu_si512((const void *)(a[i].qs + 64 * j));
            s = DPWSSD(s, _mm512_maddubs_epi16(q, y), words2(sc, 2 * j, 2 * j + 1));
        }
        const __m256i sumi = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc) - hsum_ps128(acc_m);
}

/* int16 lane k of the result = scale g + k / 8 (s16: 16 int16 scales in the low 256 bits) */
static inline __m512i scales4(__m512i s16, int g) {
    const __m512i idx = _mm512_set_epi32(0x30003, 0x30003, 0x30003, 0x30003, 0x20002, 0x20002, 0x20002, 0x20002,
                                         0x10001, 0x10001, 0x10001, 0x10001, 0, 0, 0, 0);
    return _mm512_permutexvar_epi16(_mm512_add_epi16(idx, _mm512_set1_epi16((short)g)), s16);
}

/* q6_k: d*da * (sum_g sc_g sum(q*qa) - 32 sum_g sc_g bsums_g); two 32-element steps (s, s+1) of quants_avx2.c per
 * 512-bit step: their ql bytes are the 64 contiguous bytes at 64h (low nibbles for s = 0, 1, high for 2, 3), their
 * qh bits the same 32 bytes shifted by 2s and 2s + 2, their activations the 64 bytes at 128h + 32s. */
static float X512(vdot_q6_k)(const void *row, const void *xq, size_t n) {
    const flm_block_q6_k *w = row;
    const flm_block_q8_k *a = xq;
    const size_t nb = n / 256;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x03);
    __m256 acc = _mm256_setzero_ps();
    for (size_t i = 0; i < nb; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)w[i].scales);
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        const __m512i s16 = _mm512_castsi256_si512(sc16);
        const __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)a[i].bsums));
        __m512i s = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const __m256i qh = ld256(w[i].qh + 32 * h);
            const __m512i qh2 = cat256(qh, _mm256_srli_epi16(qh, 2));
            const __m512i l = _mm512_loadu_si512((const void *)(w[i].ql + 64 * h));
            const __m512i q01 = _mm512_or_si512(_mm512_and_si512(l, m4),
                                                _mm512_slli_epi16(_mm512_and_si512(qh2, m2), 4));
            const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh2, 4), m2), 4));
            const __m512i y01 = _mm512_loadu_si512((const void *)(a[i].qs + 128 * h));
            const __m512i y23 = _mm512_loadu_si512((const void *)(a[i].qs + 128 * h + 64));
            s = DPWSSD(s, _mm512_maddubs_epi16(q01, y01), scales4(s16, 8 * h));
            s = DPWSSD(s, _mm512_maddubs_epi16(q23, y23), scales4(s16, 8 * h + 4));
        }
        const __m256i sumi = _mm256_sub_epi32(
            _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1)), _mm256_slli_epi32(corr, 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[i].d * h2f(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

void X512_FILL(flm_kernels *k) {
    k->vec_dot[FLM_TYPE_Q8_0] = X512(vdot_q8_0);
    k->vec_dot[FLM_TYPE_Q4_K] = X512(vdot_q4_k);
    k->vec_dot[FLM_TYPE_Q6_K] = X512(vdot_q6_k);
}

#endif
