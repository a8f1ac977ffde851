/* quants_rows_vnni.h — L_compute: the vnni level's tiled dots (kernels.h flm_vec_dot_tile_fn) of the 32-element types
 * (q4_0, q4_1, q5_0, q5_1, q8_0) and of q6_k for a few tokens (2 to ROWS_MAX_TOKENS, q6_k to ROWS_K_MAX_TOKENS:
 * the joined decode step of `serve --parallel`, draft trees and their verification; 32-element rows of at most
 * ROWS_WIDE elements and whole quads of blocks from 3 tokens on), reading the stored blocks as they are. Internal to src/compute/;
 * included once, by quants_vnni.c (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni), after
 * quants_panel_vnni.h, whose panels it leaves the larger batches to.
 *
 * Why: the panels (quants_panel_vnni.h) repack every 16 rows by gathers on each call, a cost that only many tokens
 * amortize; with 2 to 4 tokens the repack of a large matrix (the 151,936-row q8_0 output layer) costs more than the
 * products (measured, bench/matmat_rows.c: 4 tokens took 2.4x one token's time on that layer). Here each row's four
 * blocks at a time are decoded once into two 512-bit vectors of unsigned weights (two blocks each) and dotted by
 * vpdpbusd with every token's activation bytes (copied once per call into tmp): for 1 or 2 tokens contiguous per
 * token, the 8 partial int32 sums per block and token then reduced (a tree of two-source permutes and adds) to one
 * vector of exact block sums, lane 4t + j: token t, block j of the four; for 3 to ROWS_MAX_TOKENS tokens interleaved
 * by groups of 4 so that the lanes form those 16 sums themselves (rows_rowg: one permute of the weights per 4 bytes
 * of a block, shared by the groups, no reduction; q5_0 896 x 4864, 4 tokens: 17% fewer instructions than the
 * reduction tree, bench/step_count.c with matmat_rows).
 *
 * Same answer as the level's vec_dot (quants_y256.h's VDOT32_LOOP kernels), bit for bit, in each lane: the integer
 * block sums are the same exact integers (unsigned weights: q4_0 / q5_0 nibbles with offset 8 / 16, q8_0 q + 128
 * with offset 128, the offset taken out exactly as -offset * sum(qa) from the activation tail; a lane adds at most
 * 32 products of 255 * 127), and the float work per (row, token) is the same operations in the same order: lane j of
 * a token's four is its acc4 chain acc_j = fma(d_w * d_a, (float)sum, acc_j) over the quads, the last nb % 4 blocks
 * go into tail = tail + (d_w * d_a) * (float)sum in order, q4_1 / q5_1 add ms_j = fma(m_w, s_a, ms_j) over the quads
 * and tail = tail + m_w * s_a over the rest, and y = hsum_ps128(acc4 (+ ms4)) + tail. tests/test_kernels.c checks it
 * (test_tiles_vnni, test_rows_small). */
#ifndef FLM_COMPUTE_QUANTS_ROWS_VNNI_H
#define FLM_COMPUTE_QUANTS_ROWS_VNNI_H

#include "compute/quants.h"
#include "compute/quants_x86.h"
#include "core/types.h"

#define ROWS_G_MAX 4      /* groups of ROWS_T tokens rows_rowg takes at once */
#define ROWS_MAX_TOKENS 16 /* up to this many tokens the rows run as stored (3 to 16: rows_rowg, whose permuted weights
                            * serve every group of 4); from 17 on the panels. One thread, 4864 x 896, against the
                            * panels (bench/matmat_rows.c): q5_0 0.37 / 0.39 / 0.55 ms for 5 / 8 / 16 tokens against
                            * 0.47 / 0.52 / 0.69; q8_0 0.41 / 0.60 ms for 5 / 16 against 0.59 / 0.81 */
#define ROWS_T 4          /* tokens per micro-tile: one 16-lane vector holds their 4 block sums each */
/* 3 or more tokens go to the panels for rows wider than this, or with a partial last quad of blocks (measured with
 * the reduction tree, before rows_rowg: q5_0 896 x 4864 0.50 against 0.56 ms for 4 tokens; q4_1 1536 x 576 0.13
 * against 0.17), where 2 tokens and the narrower rows of the pulled models (n = 640, 896) are faster here */
#define ROWS_WIDE 2048

/* Bytes of tmp rows_prep lays out for n_x tokens of n elements: the tokens' activation bytes (n each; 3 tokens or
 * more: ROWS_T * n per group of ROWS_T tokens, interleaved), then per group and quad of blocks 16 float d_a and 16
 * int32 -offset * sum(qa) (or 16 float s_a). */
static inline size_t rows_tmp_bytes(size_t n, size_t n_x) {
    const size_t groups = (n_x + ROWS_T - 1) / ROWS_T, nq = n / 128;
    return (((n_x > 2 ? groups * ROWS_T : n_x) * n + 63) & ~(size_t)63) + groups * nq * 128;
}

/* Lays out the activations of n_x tokens (AB blocks at x + t * xs, each followed by its float tail: nb d, then nb
 * int32 sum(qs) (q8_0) or nb float s (q8_1)) in P: 1 or 2 tokens: token t's bytes at P + t * n; 3 tokens or more
 * (whole quads: nb % 4 == 0) interleaved for rows_rowg: at P + 4 g n + 512 q + 64 k, lane 4 tt + j (4 bytes) holds
 * bytes 4k..4k+3 of token 4 g + tt's block 4 q + j (absent tokens 0). Then for group g and quad q at lanes 4 tt + j (token 4 g +
 * tt, block 4 q + j): d_a (float) and, with SECOND, the tail's second field: -off * sum(qs) as int32 (off != 0) or
 * s (float, off == 0); lanes of absent tokens 0. */
static inline void rows_prep(const uint8_t *x, size_t xs, size_t n_x, size_t n, size_t ab_size, int32_t off,
                             uint8_t *P, float **da_out, uint8_t **second_out) {
    const size_t nb = n / 32, nq = nb / 4, groups = (n_x + ROWS_T - 1) / ROWS_T;
    const size_t n_a = n_x > 2 ? groups * ROWS_T : n_x;
    float *da = (float *)(P + ((n_a * n + 63) & ~(size_t)63));
    uint8_t *second = (uint8_t *)(da + groups * nq * 16);
    if (n_x > 2) {
        memset(P, 0, n_a * n);
        for (size_t t = 0; t < n_x; t++)
            for (size_t b = 0; b < nb; b++) {
                const uint8_t *qa = x + t * xs + b * ab_size + (ab_size - 32);
                uint8_t *dst = P + (t / ROWS_T) * ROWS_T * n + 512 * (b / 4) + 4 * (4 * (t % ROWS_T) + b % 4);
                for (size_t k = 0; k < 8; k++) memcpy(dst + 64 * k, qa + 4 * k, 4);
            }
    } else {
        for (size_t t = 0; t < n_x; t++)
            for (size_t b = 0; b < nb; b++) memcpy(P + t * n + 32 * b, x + t * xs + b * ab_size + (ab_size - 32), 32);
    }
    memset(da, 0, groups * nq * 16 * sizeof(float) * 2);
    for (size_t t = 0; t < n_x; t++) {
        const uint8_t *tail = x + t * xs + nb * ab_size;
        const size_t g = t / ROWS_T, tt = t % ROWS_T;
        for (size_t b = 0; b < nq * 4; b++) {
            const size_t lane = (g * nq + b / 4) * 16 + 4 * tt + b % 4;
            memcpy(da + lane, tail + 4 * b, 4);
            if (off) {
                const int32_t v = -off * ld1i(tail + 4 * nb + 4 * b);
                memcpy(second + 4 * lane, &v, 4);
            } else {
                memcpy(second + 4 * lane, tail + 4 * nb + 4 * b, 4);
            }
        }
    }
    *da_out = da;
    *second_out = second;
}

/* lanes 0..7: x[2k] + x[2k + 1], lanes 8..15: y[2k] + y[2k + 1] (k < 8) */
static inline __attribute__((always_inline)) __m512i rows_combine(__m512i x, __m512i y) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return _mm512_add_epi32(_mm512_permutex2var_epi32(x, ev, y), _mm512_permutex2var_epi32(x, od, y));
}

/* two 256-bit halves into one vector */
static inline __attribute__((always_inline)) __m512i rows_cat(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* q4_1 / q5_1's min part: per quad ms = fma(m_w, s_a, ms) (MQ), then tail += m_w * s_a over the last blocks (MT) */
#define ROWS_MQ(w, i, sec, q, ms)                                                                                 \
    ((ms) = _mm512_fmadd_ps(_mm512_broadcast_f32x4(D4(w, i, m)), _mm512_load_ps((const float *)((sec) + 64 * (q))), (ms)))
#define ROWS_MT(w, ad, nb, nq, tail)                                                                              \
    for (size_t j = 4 * (nq); j < (nb); j++) {                                                                    \
        float sa;                                                                                                 \
        memcpy(&sa, (ad) + 4 * (nb) + 4 * j, 4);                                                                  \
        (tail) += h2f((w)[j].m) * sa;                                                                             \
    }
#define ROWS_NO_MQ(w, i, sec, q, ms) (void)0
#define ROWS_NO_MT(w, ad, nb, nq, tail) (void)0
/* Two blocks' unsigned weights in one vector, as rows_cat(DEC(block i), DEC(block i + 1)) in fewer steps: the two
 * 16-byte nibble fields broadcast to both halves of each 256 bits, the upper halves shifted by 4 (nibbles32's
 * layout: low nibbles are elements 0..15, high nibbles 16..31); q5's fifth bits (bit e of qh for element e) added
 * as 16 under a 64-bit byte mask made from the two 32-bit qh. */
static inline __attribute__((always_inline)) __m512i rows_nib2(const uint8_t *qs0, const uint8_t *qs1) {
    const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs0));
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs1));
    const __m512i v = _mm512_srlv_epi64(rows_cat(a, b), _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
}
static inline __attribute__((always_inline)) __m512i rows_fifth2(__m512i nib, const uint8_t *qh0, const uint8_t *qh1) {
    uint32_t h0, h1;
    memcpy(&h0, qh0, 4);
    memcpy(&h1, qh1, 4);
    const __mmask64 k = _cvtu64_mask64((uint64_t)h0 | (uint64_t)h1 << 32);
    return _mm512_mask_add_epi8(nib, k, nib, _mm512_set1_epi8(0x10));
}
#define ROWS_DEC2_NIB(w, i) rows_nib2((w)[i].qs, (w)[(i) + 1].qs)
#define ROWS_DEC2_NIB5(w, i) rows_fifth2(rows_nib2((w)[i].qs, (w)[(i) + 1].qs), (w)[i].qh, (w)[(i) + 1].qh)
#define ROWS_DEC2_Q8(w, i) _mm512_xor_si512(rows_cat(ld256((w)[i].qs), ld256((w)[(i) + 1].qs)), _mm512_set1_epi8((char)0x80))
#define ROWS_DEC_NIB(b) nibbles32((b).qs)
#define ROWS_DEC_NIB5(b) _mm256_or_si256(nibbles32((b).qs), _mm256_and_si256(bits32((b).qh), _mm256_set1_epi8(0x10)))
#define ROWS_DEC_Q8(b) _mm256_xor_si256(ld256((b).qs), _mm256_set1_epi8((char)0x80))

/* One row (nb blocks of WB at w) against nt <= 2 tokens (3 and more: rows_rowg): their bytes at a + t * n, d_a at
 * da, second field at sec (rows_prep), the original activations at x + t * xs (for the last nb % 4 blocks).
 * Writes y[t * ys]. */
#define ROWS_ROW_FN(NAME, WB, AB, DEC, DEC2, OFF, HAS_M, MQ, MT)                                                                \
    static inline __attribute__((always_inline)) void NAME(const WB *w, size_t nb, size_t n, const uint8_t *a,      \
                                                            const float *da, const uint8_t *sec, const uint8_t *x,  \
                                                            size_t xs, float *y, size_t ys, int nt) {              \
        const size_t nq = nb / 4;                                                                                  \
        __m512 acc = _mm512_setzero_ps(), ms = _mm512_setzero_ps();                                                \
        (void)ms;                                                                                                  \
        for (size_t q = 0; q < nq; q++) {                                                                          \
            const size_t i = 4 * q;                                                                                \
            const __m512i w01 = DEC2(w, i), w23 = DEC2(w, i + 2);                                                  \
            __m512i c[2];                                                                                          \
            _Pragma("GCC unroll 2") for (int t = 0; t < nt; t++) {                                                 \
                const uint8_t *at = a + (size_t)t * n + 128 * q;                                                   \
                const __m512i s01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w01, _mm512_loadu_si512(at));     \
                const __m512i s23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w23, _mm512_loadu_si512(at + 64)); \
                c[t] = rows_combine(s01, s23);                                                                     \
            }                                                                                                      \
            const __m512i d01 = rows_combine(c[0], nt > 1 ? c[nt > 1 ? 1 : 0] : c[0]);                             \
            __m512i e = rows_combine(d01, d01);                                                                    \
            if (OFF) e = _mm512_add_epi32(e, _mm512_load_si512((const void *)(sec + 64 * q)));                     \
            const __m512 dw = _mm512_broadcast_f32x4(D4(w, i, d));                                                 \
            acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_load_ps(da + 16 * q)), _mm512_cvtepi32_ps(e), acc);     \
            MQ(w, i, sec, q, ms);                                                                                  \
        }                                                                                                          \
        if (HAS_M) acc = _mm512_add_ps(acc, ms);                                                                   \
        _Alignas(64) float lanes[16];                                                                              \
        _mm512_store_ps(lanes, acc);                                                                               \
        _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) {                                                     \
            const AB *ab = (const AB *)(x + (size_t)t * xs);                                                       \
            const uint8_t *ad = FLM_ACT_TAIL(ab, nb, *ab);                                                         \
            float tail = 0.0f;                                                                                     \
            for (size_t i = 4 * nq; i < nb; i++) {                                                                 \
                const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), DEC(w[i]),                           \
                                                      ld256(a + (size_t)t * n + 32 * i));                          \
                const int adj = OFF ? -(OFF) * ld1i(ad + 4 * nb + 4 * i) : 0;                                      \
                tail += h2f(w[i].d) * h2f(ab[i].d) * (float)(hsum_i32(p) + adj);                                   \
            }                                                                                                      \
            MT(w, ad, nb, nq, tail);                                                                               \
            y[(size_t)t * ys] = hsum_ps128(_mm_loadu_ps(lanes + 4 * t)) + tail;                                    \
        }                                                                                                          \
    }

/* One row (nb blocks of WB at w, nb % 4 == 0) against G groups of up to 4 tokens (n_x tokens in all, 3 <= n_x <=
 * 4 G), their activations interleaved by rows_prep (group g at a + 4 g n: lane 4 t + j of step k holds dword k of
 * token t's block j of the quad), d_a at da and the second field at sec (group g: + g nq 16 floats / 64 nq bytes).
 * Each quad's 16 block sums of a group (lane 4 t + j: token t, block j) are formed in the lanes themselves: step k
 * dots dword k of the four weight blocks (one two-source permute of the two decoded vectors puts block j's dword k
 * in lanes 4 t + j, shared by the groups) with the tokens' dwords k, accumulated by vpdpbusd over the 8 steps: exact
 * integers, so the same sums as rows_row's reduction tree, in 8 permutes a quad whatever the tokens instead of 14 per
 * 4 tokens, and no adds. The float work is rows_row's. Writes y[t * ys] for t < n_x. */
#define ROWS_ROWG_FN(NAME, WB, DEC2, OFF, HAS_M, MQ)                                                                \
    static inline __attribute__((always_inline)) void NAME(const WB *w, size_t nb, size_t n, const uint8_t *a,     \
                                                            const float *da, const uint8_t *sec, float *y,           \
                                                            size_t ys, int n_x, const int G) {                       \
        const size_t nq = nb / 4;                                                                                  \
        const __m512i i0 = _mm512_setr_epi32(0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24);              \
        __m512 acc[ROWS_G_MAX], ms[ROWS_G_MAX];                                                                    \
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) acc[g] = ms[g] = _mm512_setzero_ps();                  \
        for (size_t q = 0; q < nq; q++) {                                                                          \
            const size_t i = 4 * q;                                                                                \
            const __m512i w01 = DEC2(w, i), w23 = DEC2(w, i + 2);                                                  \
            __m512i pw[8];                                                                                         \
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)                                                    \
                pw[k] = _mm512_permutex2var_epi32(w01, _mm512_add_epi32(i0, _mm512_set1_epi32(k)), w23);           \
            const __m512 dw = _mm512_broadcast_f32x4(D4(w, i, d));                                                 \
            _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {                                                  \
                const uint8_t *aq = a + (size_t)g * 4 * n + 512 * q;                                               \
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();                                  \
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {                                              \
                    s0 = _mm512_dpbusd_epi32(s0, pw[k], _mm512_loadu_si512((const void *)(aq + 64 * k)));          \
                    s1 = _mm512_dpbusd_epi32(s1, pw[k + 4], _mm512_loadu_si512((const void *)(aq + 64 * (k + 4)))); \
                }                                                                                                  \
                __m512i e = _mm512_add_epi32(s0, s1);                                                              \
                const uint8_t *sg = sec + (size_t)g * nq * 64;                                                     \
                if (OFF) e = _mm512_add_epi32(e, _mm512_load_si512((const void *)(sg + 64 * q)));                  \
                acc[g] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_load_ps(da + (size_t)g * nq * 16 + 16 * q)),      \
                                         _mm512_cvtepi32_ps(e), acc[g]);                                           \
                MQ(w, i, sg, q, ms[g]);                                                                            \
            }                                                                                                      \
        }                                                                                                          \
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {                                                      \
            if (HAS_M) acc[g] = _mm512_add_ps(acc[g], ms[g]);                                                      \
            _Alignas(64) float lanes[16];                                                                          \
            _mm512_store_ps(lanes, acc[g]);                                                                        \
            const int nt = n_x - 4 * g < 4 ? n_x - 4 * g : 4;                                                      \
            for (int t = 0; t < nt; t++) y[(size_t)(4 * g + t) * ys] = hsum_ps128(_mm_loadu_ps(lanes + 4 * t));    \
        }                                                                                                          \
    }

/* The driver: row by row (with flm_matvec's prefetch), each row against every token at once: rows_row for 1 or 2
 * tokens, rows_rowg for the G groups of ROWS_T of 3 or more. FALLBACK (the panels) for more than ROWS_MAX_TOKENS
 * tokens, 3 or more of rows wider than ROWS_WIDE or with a partial last quad, or when tmp is absent. */
#define ROWS_DRIVER(NAME, ROW, ROWG, WB, AB, OFF, FALLBACK)                                                       \
    static void NAME(const void *W, size_t w_stride, size_t rows, const void *xq, size_t x_stride, size_t n_x,     \
                     size_t n, float *Y, size_t y_stride, void *tmp) {                                             \
        const size_t nb = n / 32;                                                                                  \
        if (n_x > ROWS_MAX_TOKENS || !tmp || (n_x > 2 && (nb % 4 || n > ROWS_WIDE))) {                             \
            FALLBACK(W, w_stride, rows, xq, x_stride, n_x, n, Y, y_stride, tmp);                                   \
            return;                                                                                                \
        }                                                                                                          \
        const uint8_t *x = xq;                                                                                     \
        float *da;                                                                                                 \
        uint8_t *sec;                                                                                              \
        rows_prep(x, x_stride, n_x, n, sizeof(AB), OFF, tmp, &da, &sec);                                           \
        const uint8_t *P = tmp;                                                                                    \
        const size_t limit = rows * w_stride;                                                                      \
        flm_prefetch(W, 0, limit, FLM_PREFETCH_BYTES);                                                             \
        const int G = (int)((n_x + ROWS_T - 1) / ROWS_T);                                                          \
        for (size_t r = 0; r < rows; r++) {                                                                        \
            flm_prefetch(W, r * w_stride + FLM_PREFETCH_BYTES, limit, w_stride);                                   \
            const WB *w = (const WB *)((const uint8_t *)W + r * w_stride);                                         \
            float *y = Y + r;                                                                                      \
            if (n_x <= 2) {                                                                                        \
                if (n_x == 2) ROW(w, nb, n, P, da, sec, x, x_stride, y, y_stride, 2);                              \
                else ROW(w, nb, n, P, da, sec, x, x_stride, y, y_stride, 1);                                       \
                continue;                                                                                          \
            }                                                                                                      \
            switch (G) {                                                                                           \
            case 1: ROWG(w, nb, n, P, da, sec, y, y_stride, (int)n_x, 1); break;                                   \
            case 2: ROWG(w, nb, n, P, da, sec, y, y_stride, (int)n_x, 2); break;                                   \
            case 3: ROWG(w, nb, n, P, da, sec, y, y_stride, (int)n_x, 3); break;                                   \
            default: ROWG(w, nb, n, P, da, sec, y, y_stride, (int)n_x, 4); break;                                  \
            }                                                                                                      \
        }                                                                                                          \
    }

ROWS_ROW_FN(rows_row_q4_0, flm_block_q4_0, flm_block_q8_0, ROWS_DEC_NIB, ROWS_DEC2_NIB, 8, 0, ROWS_NO_MQ, ROWS_NO_MT)
ROWS_ROW_FN(rows_row_q4_1, flm_block_q4_1, flm_block_q8_1, ROWS_DEC_NIB, ROWS_DEC2_NIB, 0, 1, ROWS_MQ, ROWS_MT)
ROWS_ROW_FN(rows_row_q5_0, flm_block_q5_0, flm_block_q8_0, ROWS_DEC_NIB5, ROWS_DEC2_NIB5, 16, 0, ROWS_NO_MQ, ROWS_NO_MT)
ROWS_ROW_FN(rows_row_q5_1, flm_block_q5_1, flm_block_q8_1, ROWS_DEC_NIB5, ROWS_DEC2_NIB5, 0, 1, ROWS_MQ, ROWS_MT)
ROWS_ROW_FN(rows_row_q8_0, flm_block_q8_0, flm_block_q8_0, ROWS_DEC_Q8, ROWS_DEC2_Q8, 128, 0, ROWS_NO_MQ, ROWS_NO_MT)
ROWS_ROWG_FN(rows_rowg_q4_0, flm_block_q4_0, ROWS_DEC2_NIB, 8, 0, ROWS_NO_MQ)
ROWS_DRIVER(rows_q4_0, rows_row_q4_0, rows_rowg_q4_0, flm_block_q4_0, flm_block_q8_0, 8, panel_q4_0)
ROWS_ROWG_FN(rows_rowg_q4_1, flm_block_q4_1, ROWS_DEC2_NIB, 0, 1, ROWS_MQ)
ROWS_DRIVER(rows_q4_1, rows_row_q4_1, rows_rowg_q4_1, flm_block_q4_1, flm_block_q8_1, 0, panel_q4_1)
ROWS_ROWG_FN(rows_rowg_q5_0, flm_block_q5_0, ROWS_DEC2_NIB5, 16, 0, ROWS_NO_MQ)
ROWS_DRIVER(rows_q5_0, rows_row_q5_0, rows_rowg_q5_0, flm_block_q5_0, flm_block_q8_0, 16, panel_q5_0)
ROWS_ROWG_FN(rows_rowg_q5_1, flm_block_q5_1, ROWS_DEC2_NIB5, 0, 1, ROWS_MQ)
ROWS_DRIVER(rows_q5_1, rows_row_q5_1, rows_rowg_q5_1, flm_block_q5_1, flm_block_q8_1, 0, panel_q5_1)
ROWS_ROWG_FN(rows_rowg_q8_0, flm_block_q8_0, ROWS_DEC2_Q8, 128, 0, ROWS_NO_MQ)
ROWS_DRIVER(rows_q8_0, rows_row_q8_0, rows_rowg_q8_0, flm_block_q8_0, flm_block_q8_0, 128, panel_q8_0)

/* ---------------------------------------------------------------------------------------------------------------
 * q6_k, 2 to ROWS_K_MAX_TOKENS tokens: each super-block of a row decoded once (low and high bits, scales) and dotted
 * with every token's activations, in this level's float order (one fused multiply-add per super-block of its exact
 * integer total: quants_x512.h vdot_q6_k with X512_SB_ORDER), so the same bits as the level's vec_dot: the integers
 * are the same exact sums, the float operations the same. (q4_k keeps its panels: the same scheme at 256 bits,
 * tried, took 1.3-2.3x their time for 2-4 tokens, bench/matmat_rows.c.)
 * ------------------------------------------------------------------------------------------------------------- */
/* int16 lane k of the result = scale g + k / 8 (s16: 16 int16 scales in the low 256 bits; quants_x512.h scales4) */
static inline __attribute__((always_inline)) __m512i rows_scales4(__m512i s16, int g) {
    const __m512i idx = _mm512_set_epi32(0x30003, 0x30003, 0x30003, 0x30003, 0x20002, 0x20002, 0x20002, 0x20002,
                                         0x10001, 0x10001, 0x10001, 0x10001, 0, 0, 0, 0);
    return _mm512_permutexvar_epi16(_mm512_add_epi16(idx, _mm512_set1_epi16((short)g)), s16);
}

/* One q6_k row (nb super-blocks at w) against nt tokens' q8_k blocks at x + t * xs: y[t * ys] */
static inline __attribute__((always_inline)) void rows_row_q6_k(const flm_block_q6_k *w, size_t nb, const uint8_t *x,
                                                                 size_t xs, float *y, size_t ys, int nt) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x03);
    float acc[ROWS_T] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (size_t i = 0; i < nb; i++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales));
        const __m512i s16 = _mm512_castsi256_si512(sc16);
        __m512i q[4], sc[4];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i qh = ld256(w[i].qh + 32 * h);
            const __m512i qh2 = rows_cat(qh, _mm256_srli_epi16(qh, 2));
            const __m512i l = _mm512_loadu_si512((const void *)(w[i].ql + 64 * h));
            q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(_mm512_and_si512(qh2, m2), 4));
            q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                           _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh2, 4), m2), 4));
            sc[2 * h] = rows_scales4(s16, 8 * h);
            sc[2 * h + 1] = rows_scales4(s16, 8 * h + 4);
        }
        const float wd = h2f(w[i].d);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const flm_block_q8_k *a = (const flm_block_q8_k *)(x + (size_t)t * xs) + i;
            const __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)a->bsums));
            __m512i sv = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
                sv = _mm512_dpwssd_epi32(sv, _mm512_maddubs_epi16(q[k], _mm512_loadu_si512((const void *)(a->qs + 64 * k))),
                                         sc[k]);
            const __m256i sumi = _mm256_sub_epi32(
                _mm256_add_epi32(_mm512_castsi512_si256(sv), _mm512_extracti64x4_epi64(sv, 1)), _mm256_slli_epi32(corr, 5));
            acc[t] = fmaf(a->d * wd, (float)hsum_i32(sumi), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = acc[t];
}

/* q6_k runs here up to this many tokens, the panels from one more: one thread, a 0.5B layer's down rows (896 x 4864,
 * from DRAM, bench/matmat_rows.c), here 0.34 / 0.40 / 0.48 ms for 2 / 3 / 4 tokens against the panels' 0.36-0.39 /
 * 0.43-0.45 / 0.43-0.46 (4 tokens: the joined step of `serve --parallel 4`) */
#define ROWS_K_MAX_TOKENS 3

/* The driver of q6_k: up to ROWS_K_MAX_TOKENS tokens, rows in order with flm_matvec's prefetch; more tokens go
 * to FALLBACK (the panels). */
#define ROWS_K_DRIVER(NAME, ROW, WB, FALLBACK)                                                                    \
    static void NAME(const void *W, size_t w_stride, size_t rows, const void *xq, size_t x_stride, size_t n_x,     \
                     size_t n, float *Y, size_t y_stride, void *tmp) {                                             \
        if (n_x > ROWS_K_MAX_TOKENS) {                                                                             \
            FALLBACK(W, w_stride, rows, xq, x_stride, n_x, n, Y, y_stride, tmp);                                   \
            return;                                                                                                \
        }                                                                                                          \
        const size_t nb = n / 256, limit = rows * w_stride;                                                        \
        const uint8_t *x = xq;                                                                                     \
        flm_prefetch(W, 0, limit, FLM_PREFETCH_BYTES);                                                             \
        for (size_t r = 0; r < rows; r++) {                                                                        \
            flm_prefetch(W, r * w_stride + FLM_PREFETCH_BYTES, limit, w_stride);                                   \
            const WB *w = (const WB *)((const uint8_t *)W + r * w_stride);                                         \
            switch (n_x) {                                                                                         \
            case 4: ROW(w, nb, x, x_stride, Y + r, y_stride, 4); break;                                            \
            case 3: ROW(w, nb, x, x_stride, Y + r, y_stride, 3); break;                                            \
            case 2: ROW(w, nb, x, x_stride, Y + r, y_stride, 2); break;                                            \
            case 1: ROW(w, nb, x, x_stride, Y + r, y_stride, 1); break;                                            \
            default: break;                                                                                        \
            }                                                                                                      \
        }                                                                                                          \
    }
ROWS_K_DRIVER(rows_q6_k, rows_row_q6_k, flm_block_q6_k, panel_q6_k)

/* Puts the small-batch tiles in k (after panel_fill: they hand larger batches to the panels). */
static void rows_fill(flm_kernels *k) {
    k->vec_dot_tile[FLM_TYPE_Q4_0] = rows_q4_0;
    k->vec_dot_tile[FLM_TYPE_Q4_1] = rows_q4_1;
    k->vec_dot_tile[FLM_TYPE_Q5_0] = rows_q5_0;
    k->vec_dot_tile[FLM_TYPE_Q5_1] = rows_q5_1;
    k->vec_dot_tile[FLM_TYPE_Q8_0] = rows_q8_0;
    k->vec_dot_tile[FLM_TYPE_Q6_K] = rows_q6_k;
}

#endif
