/* quants_x86.h — L_compute: static inline helpers shared by the x86 kernel files (quants_avx2.c, quants_avx512.c,
 * quants_vnni.c). Internal to src/compute/. Include it only from a file compiled with at least -mavx2 -mfma -mf16c:
 * each includer gets its own copy, compiled with its own ISA flags. */
#ifndef FLM_COMPUTE_QUANTS_X86_H
#define FLM_COMPUTE_QUANTS_X86_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------------------------- */
static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hsum_ps128(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15) then high nibbles (elements 16..31). */
static inline __m256i nibbles32(const uint8_t *qs) {
    /* both 128-bit halves hold the 16 bytes; the upper half's 64-bit lanes shift right by 4, so each byte's low
     * nibble there is the high nibble of the same byte (the bits shifted in from the next byte are masked off) */
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i v = _mm256_srlv_epi64(b, _mm256_set_epi64x(4, 4, 0, 0));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* The 32 bits of a little-endian uint32 at p -> 32 bytes, 0xff where the bit is set, else 0. */
static inline __m256i bits32(const uint8_t *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    /* byte j of the result starts as byte j/8 of x, */
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)x),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
    /* then every bit but bit j%8 is forced to 1: the byte is all ones iff that bit was set */
    const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1));
}

/* sum of u8 * s8 products, in 8 int32 lanes (each lane: 4 adjacent bytes) */
static inline __m256i dot_us8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* sum of s8 * s8 products, in 8 int32 lanes: |x| * (y with x's sign) keeps maddubs's first operand unsigned */
static inline __m256i dot_s8(__m256i x, __m256i y) {
    return dot_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* ---------------------------------------------------------------------------------------------------------------
 * vec_dot, 32-element blocks. Four blocks at a time: their maddubs pair sums are reduced to one vector of 4 block
 * sums (in int16 while that cannot overflow), and the 4 scale products are formed in one vector: the 4 weight
 * scales in one f16 -> f32 conversion, the 4 activation scales in one load from the activation buffer's float
 * tail (kernels.h flm_act_bytes). q4_0 and q5_0 dot their unsigned values and subtract offset * sum(qa) (also in
 * the tail) from the exact integer sums, which spares the sign trick signed x signed needs.
 * ------------------------------------------------------------------------------------------------------------- */
/* [sum(p0), sum(p1), sum(p2), sum(p3)] of four vectors of 8 int32 */
static inline __m128i sum4_i32(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* The same for four vectors of 16 int16 pair sums (maddubs results), when adding four of them cannot overflow
 * int16 (|pair sum| <= 8191; the callers state their bound): two int16 levels (phaddw), then int32. */
static inline __m128i sum4_i16(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(p0, p1), _mm256_hadd_epi16(p2, p3));
    const __m256i w = _mm256_madd_epi16(h, _mm256_set1_epi16(1));
    return _mm_add_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}

/* four f16 values (a, b, c, d) as floats */
static inline __m128 f16x4(uint16_t a, uint16_t b, uint16_t c, uint16_t d) {
    return _mm_cvtph_ps(_mm_setr_epi16((short)a, (short)b, (short)c, (short)d, 0, 0, 0, 0));
}

#define D4(p, i, f) f16x4(p[i].f, p[i + 1].f, p[i + 2].f, p[i + 3].f)

/* four floats / int32 at an unaligned byte address */
static inline __m128 ld4f(const uint8_t *p) { return _mm_castsi128_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m128i ld4i(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
static inline int32_t ld1i(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* sum of the 8 int32 lanes of p */
static inline int hsum_i32(__m256i p) {
    __m128i q = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4e));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xb1));
    return _mm_cvtsi128_si32(q);
}

static inline __m256i ld256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* q4_k/q5_k packed scales -> 8 scales (*sc) and 8 mins (*mn), one byte each, in 32-bit word operations
 * (the same unpacking as quants.c flm_q4k_scales; ggml-quants.c get_scale_min_k4). */
static inline void q4k_scales8(const uint8_t s[12], uint64_t *sc, uint64_t *mn) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    const uint32_t sc_lo = u0 & 0x3f3f3f3f, mn_lo = u1 & 0x3f3f3f3f;
    const uint32_t sc_hi = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4);
    const uint32_t mn_hi = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4);
    *sc = (uint64_t)sc_lo | (uint64_t)sc_hi << 32;
    *mn = (uint64_t)mn_lo | (uint64_t)mn_hi << 32;
}

#endif
