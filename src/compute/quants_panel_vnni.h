/* quants_panel_vnni.h — L_compute: the vnni level's tiled dots (kernels.h flm_vec_dot_tile_fn) of the 32-element
 * types (q4_0, q4_1, q5_0, q5_1, q8_0) for batches of tokens: weight rows repacked on the fly into panels of 16
 * interleaved rows, each 512-bit vpdpbusd forming 4 products for each of the 16 rows at once against 4 activation
 * bytes broadcast from one token. Internal to src/compute/; included once, by quants_vnni.c (compiled with
 * -mavx512f -mavx512bw -mavx512vl -mavx512vnni), after quants_tile_x86.h, whose row-at-a-time tiles it falls back
 * to for small batches (fewer than PANEL_MIN_TOKENS tokens, where repacking would not pay) and when the panel's
 * scratch cannot be allocated.
 *
 * The layout idea is llama.cpp's CPU "repack" (weights interleaved by rows so one vector step serves several rows);
 * here it is built per call from the GGUF rows, so nothing is stored and the memory budget is unchanged. Panel of
 * block b (32 weights of 16 rows): 8 groups k of 64 bytes, group k holding bytes 4k..4k+3 of each row's unsigned
 * weights (row r at bytes 4r..4r+3), then the 16 rows' scales d (float32) and, for q4_1 / q5_1, mins m. Unsigned
 * weights: q4_0/q4_1 nibbles, q5_0/q5_1 nibble | fifth bit << 4, q8_0 q + 128 (as bytes: q ^ 0x80).
 *
 * Lanes are rows, so no horizontal sums are needed until a row ends; a block costs, per 16 rows and token, 8
 * vpdpbusd (whose exact int32 lanes start at -offset * sum(qa), offset 8 / 16 / 128 for q4_0 / q5_0 / q8_0), one
 * int-to-float conversion, one multiply for the scale product and one fused multiply-add.
 *
 * Same answer as the level's vec_dot (quants_avx2.c's VDOT32_LOOP kernels, which this level keeps), bit for bit, in
 * each lane: the integer block sums are the same exact integers (the activations are in [-127, 127]; a lane adds 32
 * products of at most 255 * 127, which int32 holds), and the float work per (row, token) is the same operations in
 * the same order: blocks 4q + j (q-th quad) into lane j's chain acc_j = fma(d_w * d_a, sum, acc_j), the last nb % 4
 * blocks into tail = tail + (d_w * d_a) * sum in order, for q4_1 / q5_1 then ms_j = fma(m_w, s_a, ms_j) over the quads
 * and tail = tail + m_w * s_a over the rest, and y = ((c_0 + c_2) + (c_1 + c_3)) + tail with c_j = acc_j (+ ms_j):
 * hsum_ps128's order. tests/test_kernels.c checks it on random blocks (test_tiles_vnni). */
#ifndef FLM_COMPUTE_QUANTS_PANEL_VNNI_H
#define FLM_COMPUTE_QUANTS_PANEL_VNNI_H

#include <stdlib.h>

#include "compute/quants.h"
#include "compute/quants_x86.h"
#include "core/types.h"

#define PANEL_ROWS 16        /* rows per panel: the 16 int32 lanes of a 512-bit vector */
#define PANEL_T 4            /* tokens per micro-tile: 4 x (4 float chains + 1 int sum) + 8 weight vectors fit 32 */
#define PANEL_MIN_TOKENS 8   /* below this many tokens the row-at-a-time tiles run (repacking would not pay) */
#define PANEL_BLOCK_BYTES 512 /* unsigned weights of one block of 16 rows */

/* The unsigned bytes of a block (32 weights) of each type, as quants_tile_x86.h's decoders (q8_0 shifted by 128). */
#define PANEL_DEC_Q4_0(b) nibbles32((b).qs)
#define PANEL_DEC_Q4_1(b) nibbles32((b).qs)
#define PANEL_DEC_Q5_0(b) _mm256_or_si256(nibbles32((b).qs), _mm256_and_si256(bits32((b).qh), _mm256_set1_epi8(0x10)))
#define PANEL_DEC_Q5_1(b) PANEL_DEC_Q5_0(b)
#define PANEL_M(dst, live, blk) ((dst) = (live) ? h2f((blk).m) : 0.0f)
#define PANEL_NO_M(dst, live, blk) ((void)0)
#define PANEL_DEC_Q8_0(b) _mm256_xor_si256(ld256((b).qs), _mm256_set1_epi8((char)0x80))

/* Packs rows [0, m) (m <= 16) of W into the panel P (nb blocks: nb * 512 bytes of weights, then nb * 16 float d,
 * then, where MSTORE is PANEL_M, nb * 16 float m); rows m..15 are zero weights with zero scales (their lanes are never stored). */
#define PANEL_PACK(NAME, WB, DEC, MSTORE)                                                                          \
    static void NAME(const uint8_t *W, size_t w_stride, size_t m, size_t nb, uint8_t *P) {                         \
        float *pd = (float *)(P + nb * PANEL_BLOCK_BYTES), *pm = pd + nb * PANEL_ROWS;                             \
        (void)pm;                                                                                                  \
        for (size_t r = 0; r < PANEL_ROWS; r++) {                                                                  \
            const WB *w = (const WB *)(W + (r < m ? r : 0) * w_stride);                                            \
            for (size_t b = 0; b < nb; b++) {                                                                      \
                _Alignas(32) uint32_t u[8];                                                                        \
                if (r < m) _mm256_store_si256((__m256i *)u, DEC(w[b]));                                           \
                else memset(u, 0, sizeof u);                                                                       \
                uint32_t *dst = (uint32_t *)(P + b * PANEL_BLOCK_BYTES) + r;                                       \
                for (int k = 0; k < 8; k++) dst[k * PANEL_ROWS] = u[k];                                            \
                pd[b * PANEL_ROWS + r] = r < m ? h2f(w[b].d) : 0.0f;                                               \
                MSTORE(pm[b * PANEL_ROWS + r], r < m, w[b]);                                    \
            }                                                                                                      \
        }                                                                                                          \
    }

/* int32 lanes: the 16 rows' exact sums of block b against token activation bytes qa (32 bytes), starting at init */
static inline __attribute__((always_inline)) __m512i panel_block_sum(const __m512i wv[8], const int8_t *qa,
                                                                      int32_t init) {
    __m512i s = _mm512_set1_epi32(init);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        int32_t q4;
        memcpy(&q4, qa + 4 * k, 4);
        s = _mm512_dpbusd_epi32(s, wv[k], _mm512_set1_epi32(q4));
    }
    return s;
}

/* One panel (16 rows) against nt tokens (nt <= PANEL_T, a constant where it unrolls). Token t's activation blocks
 * at x + t * xs (AB blocks, then the float tail: nb d, then nb int32 sum(qs) for q8_0 / nb float s for q8_1);
 * noff[t * nb + b] = -OFF * sum(qs of block b) (q8_0 activations; unused when OFF is 0). Writes y[t * ys + r] for
 * r < m (m <= 16). */
#define PANEL_ROWS_FN(NAME, AB, OFF, HAS_M)                                                                       \
    static inline __attribute__((always_inline)) void NAME(const uint8_t *P, size_t nb, const uint8_t *x,           \
                                                            size_t xs, const int32_t *noff, float *y, size_t ys,   \
                                                            size_t m, int nt) {                                    \
        const float *pd = (const float *)(P + nb * PANEL_BLOCK_BYTES), *pm = pd + nb * PANEL_ROWS;                 \
        __m512 acc[PANEL_T][4], tail[PANEL_T];                                                                     \
        _Pragma("GCC unroll 4") for (int t = 0; t < PANEL_T; t++) {                                                \
            tail[t] = _mm512_setzero_ps();                                                                         \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[t][j] = _mm512_setzero_ps();                   \
        }                                                                                                          \
        size_t b = 0;                                                                                              \
        for (; b + 4 <= nb; b += 4) {                                                                              \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                                  \
                __m512i wv[8];                                                                                     \
                _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) wv[k] =                                        \
                    _mm512_load_si512((const void *)(P + (b + j) * PANEL_BLOCK_BYTES + 64 * k));                   \
                const __m512 dw = _mm512_load_ps(pd + (b + j) * PANEL_ROWS);                                       \
                _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) {                                             \
                    const AB *a = (const AB *)(x + (size_t)t * xs);                                                \
                    const uint8_t *ad = FLM_ACT_TAIL(a, nb, *a);                                                   \
                    float da;                                                                                      \
                    memcpy(&da, ad + 4 * (b + j), 4);                                                              \
                    const __m512i s = panel_block_sum(wv, a[b + j].qs, OFF ? noff[(size_t)t * nb + b + j] : 0);    \
                    acc[t][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(s),      \
                                                acc[t][j]);                                                        \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        for (; b < nb; b++) {                                                                                      \
            __m512i wv[8];                                                                                         \
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) wv[k] =                                            \
                _mm512_load_si512((const void *)(P + b * PANEL_BLOCK_BYTES + 64 * k));                             \
            const __m512 dw = _mm512_load_ps(pd + b * PANEL_ROWS);                                                 \
            _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) {                                                 \
                const AB *a = (const AB *)(x + (size_t)t * xs);                                                    \
                const uint8_t *ad = FLM_ACT_TAIL(a, nb, *a);                                                       \
                float da;                                                                                          \
                memcpy(&da, ad + 4 * b, 4);                                                                        \
                const __m512i s = panel_block_sum(wv, a[b].qs, OFF ? noff[(size_t)t * nb + b] : 0);               \
                tail[t] = _mm512_add_ps(tail[t], _mm512_mul_ps(_mm512_mul_ps(dw, _mm512_set1_ps(da)),              \
                                                               _mm512_cvtepi32_ps(s)));                            \
            }                                                                                                      \
        }                                                                                                          \
        if (HAS_M) { /* + m_w * s_a: the quads into the chains' own accumulators, the rest into the tail */       \
            _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) {                                                 \
                const AB *a = (const AB *)(x + (size_t)t * xs);                                                    \
                const uint8_t *as = FLM_ACT_TAIL(a, nb, *a) + 4 * nb;                                              \
                __m512 ms[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),                     \
                                _mm512_setzero_ps()};                                                              \
                size_t c = 0;                                                                                      \
                for (; c + 4 <= nb; c += 4) {                                                                      \
                    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                          \
                        float sa;                                                                                  \
                        memcpy(&sa, as + 4 * (c + j), 4);                                                          \
                        ms[j] = _mm512_fmadd_ps(_mm512_load_ps(pm + (c + j) * PANEL_ROWS), _mm512_set1_ps(sa),     \
                                                ms[j]);                                                            \
                    }                                                                                              \
                }                                                                                                  \
                for (; c < nb; c++) {                                                                              \
                    float sa;                                                                                      \
                    memcpy(&sa, as + 4 * c, 4);                                                                    \
                    tail[t] = _mm512_add_ps(tail[t], _mm512_mul_ps(_mm512_load_ps(pm + c * PANEL_ROWS),            \
                                                                   _mm512_set1_ps(sa)));                           \
                }                                                                                                  \
                _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[t][j] = _mm512_add_ps(acc[t][j], ms[j]);   \
            }                                                                                                      \
        }                                                                                                          \
        const __mmask16 keep = (__mmask16)(m >= 16 ? 0xffff : (1u << m) - 1);                                     \
        _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) {                                                     \
            const __m512 h = _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][2]),                                    \
                                           _mm512_add_ps(acc[t][1], acc[t][3]));                                   \
            _mm512_mask_storeu_ps(y + (size_t)t * ys, keep, _mm512_add_ps(h, tail[t]));                            \
        }                                                                                                          \
    }

/* The driver (kernels.h flm_vec_dot_tile_fn): panels of 16 rows, each packed once and run against every token (4 at
 * a time, the last n_x % 4 with their exact count). FALLBACK: the row-at-a-time tile of the same type. */
#define PANEL_DRIVER(NAME, PACK, ROWS_FN, AB, OFF, HAS_M, FALLBACK)                                               \
    static void NAME(const void *W, size_t w_stride, size_t rows, const void *xq, size_t x_stride, size_t n_x,     \
                     size_t n, float *Y, size_t y_stride) {                                                        \
        const size_t nb = n / 32;                                                                                  \
        const size_t pbytes = nb * (PANEL_BLOCK_BYTES + PANEL_ROWS * sizeof(float) * (HAS_M ? 2 : 1));             \
        uint8_t *P = n_x >= PANEL_MIN_TOKENS ? aligned_alloc(64, (pbytes + 63) & ~(size_t)63) : NULL;              \
        int32_t *noff = P ? malloc(n_x * nb * sizeof *noff + sizeof *noff) : NULL;                                         \
        if (!P || !noff) {                                                                                \
            free(P);                                                                                               \
            free(noff);                                                                                            \
            FALLBACK(W, w_stride, rows, xq, x_stride, n_x, n, Y, y_stride);                                        \
            return;                                                                                                \
        }                                                                                                          \
        const uint8_t *x = xq;                                                                                     \
        for (size_t t = 0; OFF && t < n_x; t++) { /* -OFF * sum(qs), the sums after the d values in the tail */   \
            const uint8_t *s = FLM_ACT_TAIL(x + t * x_stride, nb, AB) + 4 * nb;                                    \
            for (size_t b = 0; b < nb; b++) noff[t * nb + b] = -(OFF) * ld1i(s + 4 * b);                           \
        }                                                                                                          \
        for (size_t r0 = 0; r0 < rows; r0 += PANEL_ROWS) {                                                         \
            const size_t m = rows - r0 < PANEL_ROWS ? rows - r0 : PANEL_ROWS;                                      \
            PACK((const uint8_t *)W + r0 * w_stride, w_stride, m, nb, P);                                          \
            size_t t0 = 0;                                                                                         \
            for (; t0 + PANEL_T <= n_x; t0 += PANEL_T)                                                             \
                ROWS_FN(P, nb, x + t0 * x_stride, x_stride, noff + t0 * nb, Y + t0 * y_stride + r0, y_stride, m,   \
                        PANEL_T);                                                                                  \
            switch (n_x - t0) {                                                                                    \
            case 3: ROWS_FN(P, nb, x + t0 * x_stride, x_stride, noff + t0 * nb, Y + t0 * y_stride + r0, y_stride,  \
                            m, 3); break;                                                                          \
            case 2: ROWS_FN(P, nb, x + t0 * x_stride, x_stride, noff + t0 * nb, Y + t0 * y_stride + r0, y_stride,  \
                            m, 2); break;                                                                          \
            case 1: ROWS_FN(P, nb, x + t0 * x_stride, x_stride, noff + t0 * nb, Y + t0 * y_stride + r0, y_stride,  \
                            m, 1); break;                                                                          \
            default: break;                                                                                        \
            }                                                                                                      \
        }                                                                                                          \
        free(P);                                                                                                   \
        free(noff);                                                                                                \
    }

PANEL_PACK(panel_pack_q4_0, flm_block_q4_0, PANEL_DEC_Q4_0, PANEL_NO_M)
PANEL_PACK(panel_pack_q4_1, flm_block_q4_1, PANEL_DEC_Q4_1, PANEL_M)
PANEL_PACK(panel_pack_q5_0, flm_block_q5_0, PANEL_DEC_Q5_0, PANEL_NO_M)
PANEL_PACK(panel_pack_q5_1, flm_block_q5_1, PANEL_DEC_Q5_1, PANEL_M)
PANEL_PACK(panel_pack_q8_0, flm_block_q8_0, PANEL_DEC_Q8_0, PANEL_NO_M)
PANEL_ROWS_FN(panel_rows_q4_0, flm_block_q8_0, 8, 0)
PANEL_ROWS_FN(panel_rows_q4_1, flm_block_q8_1, 0, 1)
PANEL_ROWS_FN(panel_rows_q5_0, flm_block_q8_0, 16, 0)
PANEL_ROWS_FN(panel_rows_q5_1, flm_block_q8_1, 0, 1)
PANEL_ROWS_FN(panel_rows_q8_0, flm_block_q8_0, 128, 0)
PANEL_DRIVER(panel_q4_0, panel_pack_q4_0, panel_rows_q4_0, flm_block_q8_0, 8, 0, TILE(tile_q4_0))
PANEL_DRIVER(panel_q4_1, panel_pack_q4_1, panel_rows_q4_1, flm_block_q8_1, 0, 1, TILE(tile_q4_1))
PANEL_DRIVER(panel_q5_0, panel_pack_q5_0, panel_rows_q5_0, flm_block_q8_0, 16, 0, TILE(tile_q5_0))
PANEL_DRIVER(panel_q5_1, panel_pack_q5_1, panel_rows_q5_1, flm_block_q8_1, 0, 1, TILE(tile_q5_1))
PANEL_DRIVER(panel_q8_0, panel_pack_q8_0, panel_rows_q8_0, flm_block_q8_0, 128, 0, TILE(tile_q8_0))

/* Puts the panel tiles of the 32-element types in k (after tile_fill). */
static void panel_fill(flm_kernels *k) {
    k->vec_dot_tile[FLM_TYPE_Q4_0] = panel_q4_0;
    k->vec_dot_tile[FLM_TYPE_Q4_1] = panel_q4_1;
    k->vec_dot_tile[FLM_TYPE_Q5_0] = panel_q5_0;
    k->vec_dot_tile[FLM_TYPE_Q5_1] = panel_q5_1;
    k->vec_dot_tile[FLM_TYPE_Q8_0] = panel_q8_0;
}

#endif
