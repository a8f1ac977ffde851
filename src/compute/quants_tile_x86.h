/* quants_tile_x86.h — L_compute: the tiled matrix-matrix dots (kernels.h flm_vec_dot_tile_fn) of the quantized
 * types the real models use, for a batch of tokens (prompts, perplexity, draft verification). Internal to
 * src/compute/. Included once per kernel level by a file compiled with that level's flags, which defines before
 * including it:
 *   TILE_T           tokens per micro-tile (4 with AVX2's 16 vector registers, 8 with AVX-512's 32);
 *   TILE_J_UNROLL    how far the loop over a super-block's 32-weight steps unrolls (1 where registers are few:
 *                    unrolled, gcc keeps every product for a late sum tree and spills them);
 *   MADDS(acc, p, s) acc plus, in each int32 lane, p.lo * s.lo + p.hi * s.hi (int16 halves): _mm256_madd_epi16
 *                    and an add (avx2, avx512), or one _mm256_dpwssd_epi32 (vnni);
 *   TILE(name)       the kernel's name in that file.
 * It defines tile_fill(k), which puts the level's tile kernels in its table.
 *
 * The scheme (as ggml's mul_mat with a batch): the activations of every token are quantized once per matrix (by
 * flm_matmat), then each weight block is unpacked (nibbles, high bits, scales, mins) ONCE for a micro-tile of
 * TILE_T tokens, and its int8 products with each token's activation block are formed from the unpacked registers.
 * The per-token vec_dot unpacks every block again for every token: for q4_k that is 6 of its 13 instructions per
 * 32 weights, for q6_k 9 of 12. The caller (flm_matmat) orders the work so a few weight rows stay in L2 while the
 * tokens pass over them.
 *
 * Same answer as the level's vec_dot, bit for bit, for every (row, token): each integer lane sums the same exact
 * products (in another order; int32 sums of these sizes cannot overflow), and the float work per (row, token) is
 * the same operations in the same order (the 8 float lanes of quants_avx2.c's vdot_q4_k / vdot_q6_k, their fused
 * multiply-adds per super-block, the same horizontal sums). tests/test_kernels.c checks it on random blocks at every
 * level. */
#ifndef FLM_COMPUTE_QUANTS_TILE_X86_H
#define FLM_COMPUTE_QUANTS_TILE_X86_H

#include "compute/quants.h"
#include "compute/quants_x86.h"
#include "core/types.h"

#define TILE_INLINE static inline __attribute__((always_inline))
#define TILE_PRAGMA(x) _Pragma(#x)
#define TILE_UNROLL(n) TILE_PRAGMA(GCC unroll n) /* n macro-expanded first */

/* int16 lane k of a vector holding 8 int16 in each 128-bit half, broadcast to all 16 lanes (quants_avx2.c lane16) */
TILE_INLINE __m256i tile_lane16(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x0100 + 0x0202 * k)));
}

/* 16 int8 scales s -> 16 int16 lanes: the low 8 lanes s[g], the high 8 s[g+1] (quants_avx2.c scale_pair) */
TILE_INLINE __m256i tile_scale_pair(__m128i s, int g) {
    const __m128i idx = _mm_set_epi64x((long long)(0x0101010101010101ull * (uint64_t)(g + 1)),
                                       (long long)(0x0101010101010101ull * (uint64_t)g));
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s, idx));
}

/* ---------------------------------------------------------------------------------------------------------------
 * q4_k: one row against nt tokens (nt <= TILE_T; a constant in the full tiles, so every token loop unrolls).
 * Activation block i of token t: (const flm_block_q8_k *)(x + t * xs) + i. y[t * ys] = the dot.
 * ------------------------------------------------------------------------------------------------------------- */
TILE_INLINE void TILE(q4k_row)(const flm_block_q4_k *w, const uint8_t *x, size_t xs, size_t nb, float *y, size_t ys,
                               int nt) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[TILE_T];
    __m128 acc_m[TILE_T];
#pragma GCC unroll 8
    for (int t = 0; t < TILE_T; t++) acc[t] = _mm256_setzero_ps(), acc_m[t] = _mm_setzero_ps();
    for (size_t i = 0; i < nb; i++) {
        uint64_t sc8, mn8;
        q4k_scales8(w[i].scales, &sc8, &mn8);
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8));
        const float wd = h2f(w[i].d), wdmin = h2f(w[i].dmin);
        __m256i sumi[TILE_T];
#pragma GCC unroll 8
        for (int t = 0; t < TILE_T; t++) sumi[t] = _mm256_setzero_si256();
        TILE_UNROLL(TILE_J_UNROLL)
        for (int j = 0; j < 4; j++) {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * j));
            const __m256i ql = _mm256_and_si256(q4, m4), qh = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            const __m256i sl = tile_lane16(sc16, 2 * j), sh = tile_lane16(sc16, 2 * j + 1);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const int8_t *qa = ((const flm_block_q8_k *)(x + (size_t)t * xs))[i].qs + 64 * j;
                sumi[t] = MADDS(sumi[t], _mm256_maddubs_epi16(ql, ld256(qa)), sl);
                sumi[t] = MADDS(sumi[t], _mm256_maddubs_epi16(qh, ld256(qa + 32)), sh);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const flm_block_q8_k *a = (const flm_block_q8_k *)(x + (size_t)t * xs) + i;
            const float d = a->d * wd, dmin = a->d * wdmin;
            const __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
            const __m128i bs2 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            acc_m[t] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, bs2)), acc_m[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum_ps(acc[t]) - hsum_ps128(acc_m[t]);
}

/* ---------------------------------------------------------------------------------------------------------------
 * q6_k: d*da * (sum_g sc_g sum(q*qa) - 32 sum_g sc_g bsums_g), as quants_avx2.c vdot_q6_k.
 * ------------------------------------------------------------------------------------------------------------- */
TILE_INLINE void TILE(q6k_row)(const flm_block_q6_k *w, const uint8_t *x, size_t xs, size_t nb, float *y, size_t ys,
                               int nt) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
    __m256 acc[TILE_T];
#pragma GCC unroll 8
    for (int t = 0; t < TILE_T; t++) acc[t] = _mm256_setzero_ps();
    for (size_t i = 0; i < nb; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)w[i].scales);
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        const float wd = h2f(w[i].d);
        __m256i sumi[TILE_T];
#pragma GCC unroll 8
        for (int t = 0; t < TILE_T; t++) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const flm_block_q8_k *a = (const flm_block_q8_k *)(x + (size_t)t * xs) + i;
            const __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)a->bsums));
            sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
        }
        TILE_UNROLL(TILE_J_UNROLL)
        for (int h = 0; h < 2; h++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h + 32));
            for (int s = 0; s < 4; s++) {
                const __m256i l = s & 1 ? l1 : l0;
                const __m256i lo = _mm256_and_si256(s & 2 ? _mm256_srli_epi16(l, 4) : l, m4);
                const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), m2), 4);
                const __m256i q = _mm256_or_si256(lo, hi);
                const __m256i sp = tile_scale_pair(sc8, 8 * h + 2 * s);
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    const int8_t *qa = ((const flm_block_q8_k *)(x + (size_t)t * xs))[i].qs + 128 * h + 32 * s;
                    sumi[t] = MADDS(sumi[t], _mm256_maddubs_epi16(q, ld256(qa)), sp);
                }
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const flm_block_q8_k *a = (const flm_block_q8_k *)(x + (size_t)t * xs) + i;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(a->d * wd), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum_ps(acc[t]);
}


/* ---------------------------------------------------------------------------------------------------------------
 * The 32-element types, as quants_avx2.c's VDOT32_LOOP: four blocks at a time, their 4 block sums (exact int32)
 * times the 4 weight scales times the 4 activation scales (from the activation buffer's float tail) into 4 float
 * lanes; the last nb % 4 blocks one by one into a float tail; q4_1 / q5_1 then add m * s the same way.
 *   DEC(b)       the block's 32 weights as bytes (unsigned nibbles, fifth bits, or q8_0's signed bytes);
 *   PAIR(u, qa)  maddubs pair sums (16 int16) of u with the 32 activation bytes at qa;
 *   SUM4         sum4_i16 (when four pair sums fit int16) or tile_sum4_i32;
 *   OFF          the offset taken out of unsigned weights (8 for q4_0, 16 for q5_0; 0: none, q8_0 and the q*_1
 *                types), subtracted exactly as OFF * sum(qa) with sum(qa) from the activation tail;
 *   MPART        TILE_M for q4_1 / q5_1 (min m times activation s), else TILE_NO_M.
 * ------------------------------------------------------------------------------------------------------------- */
TILE_INLINE __m128i tile_sum4_i32(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i o = _mm256_set1_epi16(1);
    return sum4_i32(_mm256_madd_epi16(p0, o), _mm256_madd_epi16(p1, o), _mm256_madd_epi16(p2, o),
                    _mm256_madd_epi16(p3, o));
}
#define TILE_DEC_NIB(b) nibbles32((b).qs)
#define TILE_DEC_NIB5(b) _mm256_or_si256(nibbles32((b).qs), _mm256_and_si256(bits32((b).qh), _mm256_set1_epi8(0x10)))
#define TILE_DEC_S8(b) ld256((b).qs)
#define TILE_PAIR_U(u, qa) _mm256_maddubs_epi16((u), ld256(qa))
#define TILE_PAIR_S(u, qa) _mm256_maddubs_epi16(_mm256_sign_epi8((u), (u)), _mm256_sign_epi8(ld256(qa), (u)))

#define TILE32_ROW(NAME, WB, AB, DEC, PAIR, SUM4, OFF, MPART)                                                     \
    TILE_INLINE void TILE(NAME)(const WB *w, const uint8_t *x, size_t xs, size_t nb, float *y, size_t ys, int nt) { \
        __m128 acc4[TILE_T];                                                                                      \
        float tail[TILE_T];                                                                                       \
        TILE_UNROLL(8)                                                                                            \
        for (int t = 0; t < TILE_T; t++) acc4[t] = _mm_setzero_ps(), tail[t] = 0.0f;                              \
        size_t i = 0;                                                                                             \
        for (; i + 4 <= nb; i += 4) {                                                                             \
            const __m256i u0 = DEC(w[i]), u1 = DEC(w[i + 1]), u2 = DEC(w[i + 2]), u3 = DEC(w[i + 3]);            \
            const __m128 dw = D4(w, i, d);                                                                        \
            TILE_UNROLL(8)                                                                                        \
            for (int t = 0; t < nt; t++) {                                                                        \
                const AB *a = (const AB *)(x + (size_t)t * xs);                                                   \
                const uint8_t *ad = FLM_ACT_TAIL(a, nb, *a);                                                      \
                __m128i s4 = SUM4(PAIR(u0, a[i].qs), PAIR(u1, a[i + 1].qs), PAIR(u2, a[i + 2].qs),                \
                                  PAIR(u3, a[i + 3].qs));                                                         \
                if (OFF) s4 = _mm_sub_epi32(s4, _mm_mullo_epi32(ld4i(ad + 4 * nb + 4 * i), _mm_set1_epi32(OFF))); \
                acc4[t] = _mm_fmadd_ps(_mm_mul_ps(dw, ld4f(ad + 4 * i)), _mm_cvtepi32_ps(s4), acc4[t]);          \
            }                                                                                                     \
        }                                                                                                         \
        for (; i < nb; i++) {                                                                                     \
            const __m256i u = DEC(w[i]);                                                                          \
            const float wd = h2f(w[i].d);                                                                         \
            TILE_UNROLL(8)                                                                                        \
            for (int t = 0; t < nt; t++) {                                                                        \
                const AB *a = (const AB *)(x + (size_t)t * xs);                                                   \
                const uint8_t *ad = FLM_ACT_TAIL(a, nb, *a);                                                      \
                const int adj = OFF ? -(OFF) * ld1i(ad + 4 * nb + 4 * i) : 0;                                     \
                tail[t] += wd * h2f(a[i].d) *                                                                     \
                           (float)(hsum_i32(_mm256_madd_epi16(PAIR(u, a[i].qs), _mm256_set1_epi16(1))) + adj);     \
            }                                                                                                     \
        }                                                                                                         \
        TILE_UNROLL(8)                                                                                            \
        for (int t = 0; t < nt; t++) {                                                                            \
            const AB *a = (const AB *)(x + (size_t)t * xs);                                                       \
            MPART(w, a, nb, acc4[t], tail[t]);                                                                   \
            y[(size_t)t * ys] = hsum_ps128(acc4[t]) + tail[t];                                                    \
        }                                                                                                         \
    }
/* q4_1 / q5_1 (TILE32_ROW's MPART): the min m times the activation's s = d * sum(qa) (its tail after the d values),
 * four blocks at a time into the float lanes, the rest into the float tail, as quants_avx2.c's vdot_q4_1 */
#define TILE_M(w, a, nb, acc4, tail)                                                                              \
    do {                                                                                                          \
        const uint8_t *as = FLM_ACT_TAIL(a, nb, *a) + 4 * (nb);                                                   \
        __m128 ms4 = _mm_setzero_ps();                                                                            \
        size_t j = 0;                                                                                             \
        for (; j + 4 <= (nb); j += 4) ms4 = _mm_fmadd_ps(D4(w, j, m), ld4f(as + 4 * j), ms4);                    \
        for (; j < (nb); j++) (tail) += h2f((w)[j].m) * h2f((a)[j].s);                                            \
        (acc4) = _mm_add_ps((acc4), ms4);                                                                         \
    } while (0)
#define TILE_NO_M(w, a, nb, acc4, tail) (void)(a)

TILE32_ROW(q4_0_row, flm_block_q4_0, flm_block_q8_0, TILE_DEC_NIB, TILE_PAIR_U, sum4_i16, 8, TILE_NO_M)
TILE32_ROW(q4_1_row, flm_block_q4_1, flm_block_q8_1, TILE_DEC_NIB, TILE_PAIR_U, sum4_i16, 0, TILE_M)
TILE32_ROW(q5_0_row, flm_block_q5_0, flm_block_q8_0, TILE_DEC_NIB5, TILE_PAIR_U, sum4_i16, 16, TILE_NO_M)
TILE32_ROW(q5_1_row, flm_block_q5_1, flm_block_q8_1, TILE_DEC_NIB5, TILE_PAIR_U, sum4_i16, 0, TILE_M)
TILE32_ROW(q8_0_row, flm_block_q8_0, flm_block_q8_0, TILE_DEC_S8, TILE_PAIR_S, tile_sum4_i32, 0, TILE_NO_M)

/* The tile driver (kernels.h flm_vec_dot_tile_fn): token groups of TILE_T outside, rows inside, so one group's
 * activations stay in L1 while the rows (which the caller keeps few enough to stay in L2) pass under them. */
#define TILE_ROWS(ROW, BLOCK, NT)                                                                                 \
    for (size_t r = 0; r < rows; r++)                                                                             \
        TILE(ROW)((const BLOCK *)((const uint8_t *)W + r * w_stride), (const uint8_t *)xq + t0 * x_stride,       \
                  x_stride, nb, Y + t0 * y_stride + r, y_stride, NT)
/* the last n_x % TILE_T tokens with a constant count too (each count its own unrolled code: a runtime count
 * leaves the per-token arrays in memory, and draft verification batches are often that small) */
#define TILE_DRIVER(NAME, ROW, BLOCK, QK)                                                                         \
    static void TILE(NAME)(const void *W, size_t w_stride, size_t rows, const void *xq, size_t x_stride,         \
                           size_t n_x, size_t n, float *Y, size_t y_stride, void *tmp) {                          \
        (void)tmp; /* nothing packed at these levels */                                                           \
        const size_t nb = n / (QK);                                                                               \
        size_t t0 = 0;                                                                                            \
        for (; t0 + TILE_T <= n_x; t0 += TILE_T) TILE_ROWS(ROW, BLOCK, TILE_T);                                   \
        switch (n_x - t0) {                                                                                       \
        case 7: if (TILE_T > 7) { TILE_ROWS(ROW, BLOCK, 7 % TILE_T); break; } /* fall through */                  \
        case 6: if (TILE_T > 6) { TILE_ROWS(ROW, BLOCK, 6 % TILE_T); break; } /* fall through */                  \
        case 5: if (TILE_T > 5) { TILE_ROWS(ROW, BLOCK, 5 % TILE_T); break; } /* fall through */                  \
        case 4: if (TILE_T > 4) { TILE_ROWS(ROW, BLOCK, 4 % TILE_T); break; } /* fall through */                  \
        case 3: TILE_ROWS(ROW, BLOCK, 3); break;                                                                  \
        case 2: TILE_ROWS(ROW, BLOCK, 2); break;                                                                  \
        case 1: TILE_ROWS(ROW, BLOCK, 1); break;                                                                  \
        default: break;                                                                                           \
        }                                                                                                         \
    }

TILE_DRIVER(tile_q4_k, q4k_row, flm_block_q4_k, 256)
TILE_DRIVER(tile_q6_k, q6k_row, flm_block_q6_k, 256)
TILE_DRIVER(tile_q4_0, q4_0_row, flm_block_q4_0, 32)
TILE_DRIVER(tile_q4_1, q4_1_row, flm_block_q4_1, 32)
TILE_DRIVER(tile_q5_0, q5_0_row, flm_block_q5_0, 32)
TILE_DRIVER(tile_q5_1, q5_1_row, flm_block_q5_1, 32)
TILE_DRIVER(tile_q8_0, q8_0_row, flm_block_q8_0, 32)

static void tile_fill(flm_kernels *k) {
    k->vec_dot_tile[FLM_TYPE_Q4_K] = TILE(tile_q4_k);
    k->vec_dot_tile[FLM_TYPE_Q6_K] = TILE(tile_q6_k);
    k->vec_dot_tile[FLM_TYPE_Q4_0] = TILE(tile_q4_0);
    k->vec_dot_tile[FLM_TYPE_Q4_1] = TILE(tile_q4_1);
    k->vec_dot_tile[FLM_TYPE_Q5_0] = TILE(tile_q5_0);
    k->vec_dot_tile[FLM_TYPE_Q5_1] = TILE(tile_q5_1);
    k->vec_dot_tile[FLM_TYPE_Q8_0] = TILE(tile_q8_0);
}

#endif
