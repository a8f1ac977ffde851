/* quants_panel_vnni.h — L_compute: the vnni level's tiled dots (kernels.h flm_vec_dot_tile_fn) for batches of tokens.
 * The 32-element types (q4_0, q4_1, q5_0, q5_1, q8_0): weight rows repacked on the fly into panels of 16
 * interleaved rows, each 512-bit vpdpbusd forming 4 products for each of the 16 rows at once against 4 activation
 * bytes broadcast from one token. Internal to src/compute/; included once, by quants_vnni.c (compiled with
 * -mavx512f -mavx512bw -mavx512vl -mavx512vnni), after quants_tile_x86.h, whose row-at-a-time tiles it falls back
 * to for one token (PANEL_MIN_TOKENS) and when the panel's
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
 * hsum_ps128's order. tests/test_kernels.c checks it on random blocks (test_tiles_vnni).
 *
 * q4_k and q6_k take panels of 16 rows too, with this level's own float order: one fused multiply-add per
 * super-block of each row's exact integer total (the avx2 kernels keep 8 float lanes per row, which rows-as-lanes
 * cannot follow). This level's vec_dot of both types uses that order, so tile and vec_dot agree bit for bit here,
 * and both are within float rounding of the avx2 kernels (see "q4_k at this level" below). */
#ifndef FLM_COMPUTE_QUANTS_PANEL_VNNI_H
#define FLM_COMPUTE_QUANTS_PANEL_VNNI_H

#include <math.h>
#include <stdlib.h>

#include "compute/quants.h"
#include "compute/quants_x86.h"
#include "compute/work.h"
#include "core/types.h"

#define PANEL_ROWS 16        /* rows per panel: the 16 int32 lanes of a 512-bit vector */
#define PANEL_T 4            /* tokens per micro-tile: 4 x (4 float chains + 1 int sum) + 8 weight vectors fit 32 */
#define PANEL_MIN_TOKENS 2   /* below this many tokens the row-at-a-time tiles run; from 2 on the panels pay: q5_0
                              * 30 / 19 instructions per 256 weights and token at 2 / 4 tokens against the row
                              * tiles' 89 / 62 (step_count), a joined pass of 4 clients (Qwen2.5-Coder-0.5B)
                              * 39 -> 33 ms of CPU per token */
#define PANEL_BLOCK_BYTES 512 /* unsigned weights of one block of 16 rows */

/* Packs rows [0, m) (m <= 16) of W into the panel P: nb * 512 bytes of unsigned weights, then nb * 16 float d, then
 * (HAS_M) nb * 16 float m. Each field of the 16 rows' block b is gathered (vpgatherdd) into the lanes of one vector:
 * the f16 d (and m) at offset 0 of the block, the quant bytes at QS (NQ dwords: 4 for the nibble types, whose low
 * nibbles are elements 0..15 and high nibbles 16..31; 8 for q8_0, shifted by 128), the fifth bits at QH (QH < 0:
 * none): element e's bit is bit e of the 32-bit qh, spread to bit 4 of its byte by a 16-entry table. Lanes m..15
 * repeat row 0 (they are never stored). */
#define PANEL_PACK(NAME, WB, QS, QH, HAS_M, NQ)                                                                   \
    static void NAME(const uint8_t *W, size_t w_stride, size_t m, size_t nb, uint8_t *P) {                         \
        float *pd = (float *)(P + nb * PANEL_BLOCK_BYTES), *pm = pd + nb * PANEL_ROWS;                             \
        (void)pm;                                                                                                  \
        _Alignas(64) int32_t off[PANEL_ROWS];                                                                      \
        for (size_t r = 0; r < PANEL_ROWS; r++) off[r] = r < m ? (int32_t)(r * w_stride) : 0;                      \
        const __m512i vidx = _mm512_load_si512((const void *)off), m4 = _mm512_set1_epi32(0x0f0f0f0f);             \
        /* x (low 4 bits) -> bit 4 of byte i set iff bit i of x */                                                 \
        const __m512i fifth = _mm512_setr_epi32(0x0, 0x10, 0x1000, 0x1010, 0x100000, 0x100010, 0x101000, 0x101010,  \
                                                0x10000000, 0x10000010, 0x10001000, 0x10001010, 0x10100000,        \
                                                0x10100010, 0x10101000, 0x10101010);                               \
        (void)m4, (void)fifth;                                                                                     \
        for (size_t b = 0; b < nb; b++) {                                                                          \
            const uint8_t *base = W + b * sizeof(WB);                                                              \
            uint8_t *pw = P + b * PANEL_BLOCK_BYTES;                                                               \
            const __m512i dm = _mm512_i32gather_epi32(vidx, (const void *)base, 1);                                \
            _mm512_store_ps(pd + b * PANEL_ROWS, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));                      \
            if (HAS_M)                                                                                             \
                _mm512_store_ps(pm + b * PANEL_ROWS, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)))); \
            if ((NQ) == 8) {                                                                                       \
                for (int k = 0; k < 8; k++)                                                                        \
                    _mm512_store_si512((void *)(pw + 64 * k),                                                      \
                                       _mm512_xor_si512(_mm512_i32gather_epi32(vidx, (const void *)(base + (QS) + 4 * k), 1), \
                                                        _mm512_set1_epi32((int)0x80808080)));                      \
            } else {                                                                                               \
                const __m512i h = (QH) >= 0 ? _mm512_i32gather_epi32(vidx, (const void *)(base + ((QH) >= 0 ? (QH) : 0)), 1) \
                                            : _mm512_setzero_si512();                                              \
                for (int k = 0; k < 4; k++) {                                                                      \
                    const __m512i q = _mm512_i32gather_epi32(vidx, (const void *)(base + (QS) + 4 * k), 1);        \
                    __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi32(q, 4), m4);      \
                    if ((QH) >= 0) {                                                                               \
                        lo = _mm512_or_si512(lo, _mm512_permutexvar_epi32(_mm512_srli_epi32(h, 4 * k), fifth));    \
                        hi = _mm512_or_si512(hi, _mm512_permutexvar_epi32(_mm512_srli_epi32(h, 4 * k + 16), fifth)); \
                    }                                                                                              \
                    _mm512_store_si512((void *)(pw + 64 * k), lo);                                                 \
                    _mm512_store_si512((void *)(pw + 64 * (k + 4)), hi);                                           \
                }                                                                                                  \
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
                     size_t n, float *Y, size_t y_stride, void *tmp) {                                             \
        const size_t nb = n / 32;                                                                                  \
        const size_t pbytes = nb * (PANEL_BLOCK_BYTES + PANEL_ROWS * sizeof(float) * (HAS_M ? 2 : 1));             \
        /* tmp (flm_tile_tmp_bytes): the panel, then the tokens' offsets */                                      \
        uint8_t *P = n_x >= PANEL_MIN_TOKENS ? tmp : NULL;                                                         \
        int32_t *noff = P ? (int32_t *)(P + ((pbytes + 63) & ~(size_t)63)) : NULL;                                 \
        if (!P) {                                                                                                  \
            FALLBACK(W, w_stride, rows, xq, x_stride, n_x, n, Y, y_stride, NULL);                                  \
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
    }

PANEL_PACK(panel_pack_q4_0, flm_block_q4_0, 2, -1, 0, 4)
PANEL_PACK(panel_pack_q4_1, flm_block_q4_1, 4, -1, 1, 4)
PANEL_PACK(panel_pack_q5_0, flm_block_q5_0, 6, 2, 0, 4)
PANEL_PACK(panel_pack_q5_1, flm_block_q5_1, 8, 4, 1, 4)
PANEL_PACK(panel_pack_q8_0, flm_block_q8_0, 2, -1, 0, 8)
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

/* ---------------------------------------------------------------------------------------------------------------
 * q4_k at this level: one float step per super-block, so rows can be lanes.
 *
 * The avx2 vec_dot keeps 8 float lanes per row (one per int32 lane of its super-block sum) and adds them at the end;
 * a panel whose lanes are rows cannot follow that order. This level's q4_k vec_dot therefore forms, per super-block
 * i, the two exact integers
 *   S_i = sum_j sc_j * sum_{l<32} q_{32j+l} * qa_{32j+l}      M_i = sum_j m_j * (bsums[2j] + bsums[2j+1])
 * and then, in order over i,  acc = fma(da_i * d_i, (float)S_i, acc),  accm = fma(da_i * dmin_i, (float)M_i, accm),
 * y = acc - accm (ggml's q4_K formula; only the float order is this level's own). The panel tile does exactly these
 * float operations in each lane, so a batch gives the bits of token-by-token decoding at this level. The result is
 * within float rounding of the avx2 kernel's, not the same bits (tests/test_kernels.c exempts q4_k at vnni from its
 * same-bits-as-avx2 check, and checks tile == vec_dot here bit for bit). Integer ranges: S_i <= 256 * 15 * 127 * 63,
 * M_i <= 8 * 63 * 4064: int32 holds both.
 * ------------------------------------------------------------------------------------------------------------- */
static float vdot_q4_k_sb(const void *row, const void *xq, size_t n) {
    const flm_block_q4_k *w = row;
    const flm_block_q8_k *a = xq;
    const size_t nb = n / 256;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    float acc = 0.0f, accm = 0.0f;
    for (size_t i = 0; i < nb; i++) {
        uint64_t sc8, mn8;
        q4k_scales8(w[i].scales, &sc8, &mn8);
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)a[i].bsums);
        const __m128i bs2 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i q4 = ld256(w[i].qs + 32 * j);
            const __m256i ql = _mm256_and_si256(q4, m4), qh = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            sumi = _mm256_dpwssd_epi32(sumi, _mm256_maddubs_epi16(ql, ld256(a[i].qs + 64 * j)), tile_lane16(sc16, 2 * j));
            sumi = _mm256_dpwssd_epi32(sumi, _mm256_maddubs_epi16(qh, ld256(a[i].qs + 64 * j + 32)),
                                       tile_lane16(sc16, 2 * j + 1));
        }
        /* [S, M] from the 8 lanes of sumi and the 4 of mins * bs2 */
        __m128i h = _mm_hadd_epi32(_mm_add_epi32(_mm256_castsi256_si128(sumi), _mm256_extracti128_si256(sumi, 1)),
                                   _mm_madd_epi16(mins, bs2));
        h = _mm_hadd_epi32(h, h);
        const float da = a[i].d;
        acc = fmaf(da * h2f(w[i].d), (float)_mm_cvtsi128_si32(h), acc);
        accm = fmaf(da * h2f(w[i].dmin), (float)_mm_extract_epi32(h, 1), accm);
    }
    return acc - accm;
}

/* The q4_k panel of 16 rows, as two sets of 8 (rows 0-7, 8-15), per super-block PQ4K_SB_BYTES bytes:
 *   8 sub-blocks j x 4 steps s x 2 sets of 64 bytes: weights 8s .. 8s + 7 of sub-block j of the set's row r at bytes
 *     8r .. 8r + 7 (unsigned nibbles; element 64c + 32k + l is nibble k of qs[32c + l], so sub-block j = 2c + k), so
 *     int32 lane 2r of a vpdpbusd sums that row's weights 8s .. 8s + 3, lane 2r + 1 its weights 8s + 4 .. 8s + 7,
 *     against one 64-bit broadcast of the activation bytes 8s .. 8s + 7;
 *   then, in the lane order PQ4K_PERM (below): 8 x 16 int32 scales (sc_j, sc_j) as int16 pairs; 4 x 16 int32 mins
 *     (m_2p, m_2p+1) as int16 pairs; 16 float d; 16 float dmin.
 * Per token and sub-block the two sets' 16-weight half sums (each |.| <= 16 * 15 * 127, an int16) are packed to int16
 * by one vpackssdw (exact: no saturation), whose int32 pair lanes then hold one row's two halves in the lane order
 * PQ4K_PERM, and one vpdpwssd adds sc_j times their sum: the multiply port takes 8 + 1 operations per 32 weights of
 * 16 rows, where a vpmulld would take 8 + 2. */
#define PQ4K_W_BYTES 4096
#define PQ4K_SB_BYTES (PQ4K_W_BYTES + 8 * 64 + 4 * 64 + 64 + 64)
#define PQ4K_T 4 /* tokens per micro-tile: 4 x (acc, accm, sum, 2 half sums) + 8 weight vectors + a scale: 29 registers */
/* row of lane L after vpackssdw of the two sets: 128-bit lane q holds rows 2q, 2q + 1 (set 0), 8 + 2q, 9 + 2q (set 1) */
static const int32_t pq4k_perm[16] = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15};
/* lane of row r: the inverse */
static const int32_t pq4k_inv[16] = {0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15};

/* Packs rows [0, m) (m <= 16) of W (nb super-blocks each) into P; missing rows repeat row 0 (never stored). */
static void panel_pack_q4_k(const uint8_t *W, size_t w_stride, size_t m, size_t nb, uint8_t *P) {
    _Alignas(64) int32_t off[PANEL_ROWS];
    for (size_t l = 0; l < PANEL_ROWS; l++) off[l] = (size_t)pq4k_perm[l] < m ? (int32_t)(pq4k_perm[l] * w_stride) : 0;
    _Alignas(32) int32_t off8[2][8];
    for (size_t s = 0; s < 2; s++)
        for (size_t r = 0; r < 8; r++) off8[s][r] = 8 * s + r < m ? (int32_t)((8 * s + r) * w_stride) : 0;
    const __m512i vidx = _mm512_load_si512((const void *)off), m4 = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f), m2 = _mm512_set1_epi32(0x03030303), ff = _mm512_set1_epi32(0xff);
    const __m256i v8[2] = {_mm256_load_si256((const __m256i *)off8[0]), _mm256_load_si256((const __m256i *)off8[1])};
    for (size_t i = 0; i < nb; i++) {
        const uint8_t *base = W + i * sizeof(flm_block_q4_k);
        uint8_t *pw = P + i * PQ4K_SB_BYTES;
        int32_t *psc = (int32_t *)(pw + PQ4K_W_BYTES), *pmn = psc + 8 * PANEL_ROWS;
        float *pd = (float *)(pmn + 4 * PANEL_ROWS), *pdm = pd + PANEL_ROWS;
        const __m512i dm = _mm512_i32gather_epi32(vidx, (const void *)base, 1);
        _mm512_store_ps(pd, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
        _mm512_store_ps(pdm, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16))));
        /* q4k_scales8 in every lane: bytes 0..3 of sc_lo are sc_0..3, of sc_hi sc_4..7; the same for the mins */
        const __m512i u0 = _mm512_i32gather_epi32(vidx, (const void *)(base + 4), 1);
        const __m512i u1 = _mm512_i32gather_epi32(vidx, (const void *)(base + 8), 1);
        const __m512i u2 = _mm512_i32gather_epi32(vidx, (const void *)(base + 12), 1);
        const __m512i sc_lo = _mm512_and_si512(u0, m6), mn_lo = _mm512_and_si512(u1, m6);
        const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(u2, m4),
                                              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), m2), 4));
        const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),
                                              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), m2), 4));
        for (int j = 0; j < 4; j++) {
            const __m512i a = _mm512_and_si512(_mm512_srli_epi32(sc_lo, 8 * j), ff);
            const __m512i b = _mm512_and_si512(_mm512_srli_epi32(sc_hi, 8 * j), ff);
            _mm512_store_si512((void *)(psc + j * PANEL_ROWS), _mm512_or_si512(a, _mm512_slli_epi32(a, 16)));
            _mm512_store_si512((void *)(psc + (j + 4) * PANEL_ROWS), _mm512_or_si512(b, _mm512_slli_epi32(b, 16)));
        }
        for (int p = 0; p < 2; p++) { /* (m_2p, m_2p+1) as int16 pairs */
            const __m512i lo = _mm512_srli_epi32(mn_lo, 16 * p), hi = _mm512_srli_epi32(mn_hi, 16 * p);
            _mm512_store_si512((void *)(pmn + p * PANEL_ROWS),
                               _mm512_or_si512(_mm512_and_si512(lo, ff), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(lo, 8), ff), 16)));
            _mm512_store_si512((void *)(pmn + (p + 2) * PANEL_ROWS),
                               _mm512_or_si512(_mm512_and_si512(hi, ff), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi, 8), ff), 16)));
        }
        for (int s8 = 0; s8 < 2; s8++)
            for (int c = 0; c < 4; c++)
                for (int s = 0; s < 4; s++) {
                    const __m512i q = _mm512_i32gather_epi64(v8[s8], (const void *)(base + 16 + 32 * c + 8 * s), 1);
                    _mm512_store_si512((void *)(pw + (((2 * c) * 4 + s) * 2 + s8) * 64), _mm512_and_si512(q, m4));
                    _mm512_store_si512((void *)(pw + (((2 * c + 1) * 4 + s) * 2 + s8) * 64),
                                       _mm512_and_si512(_mm512_srli_epi32(q, 4), m4));
                }
    }
}

/* One q4_k panel (16 rows) against nt <= PQ4K_T tokens at x + t * xs (q8_k blocks); bsp[t * nb * 4 + 4i + p]: token
 * t's (bs_2p, bs_2p+1) of super-block i as an int16 pair, bs_j = bsums[2j] + bsums[2j+1]. Writes y[t * ys + r], r < m. */
static inline __attribute__((always_inline)) void panel_rows_q4_k(const uint8_t *P, size_t nb, const uint8_t *x,
                                                                   size_t xs, const int32_t *bsp, float *y, size_t ys,
                                                                   size_t m, int nt) {
    __m512 acc[PQ4K_T], accm[PQ4K_T];
#pragma GCC unroll 4
    for (int t = 0; t < PQ4K_T; t++) acc[t] = _mm512_setzero_ps(), accm[t] = _mm512_setzero_ps();
    for (size_t i = 0; i < nb; i++) {
        const uint8_t *pw = P + i * PQ4K_SB_BYTES;
        const int32_t *psc = (const int32_t *)(pw + PQ4K_W_BYTES), *pmn = psc + 8 * PANEL_ROWS;
        const float *pd = (const float *)(pmn + 4 * PANEL_ROWS);
        __m512i sum[PQ4K_T];
#pragma GCC unroll 4
        for (int t = 0; t < PQ4K_T; t++) sum[t] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            __m512i wv[8];
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) wv[g] = _mm512_load_si512((const void *)(pw + (8 * j + g) * 64));
            const __m512i sc = _mm512_load_si512((const void *)(psc + j * PANEL_ROWS));
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const int8_t *qa = ((const flm_block_q8_k *)(x + (size_t)t * xs))[i].qs + 32 * j;
                __m512i h0 = _mm512_setzero_si512(), h1 = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int s = 0; s < 4; s++) {
                    int64_t q8;
                    memcpy(&q8, qa + 8 * s, 8);
                    const __m512i b = _mm512_set1_epi64(q8);
                    h0 = _mm512_dpbusd_epi32(h0, wv[2 * s], b);
                    h1 = _mm512_dpbusd_epi32(h1, wv[2 * s + 1], b);
                }
                sum[t] = _mm512_dpwssd_epi32(sum[t], _mm512_packs_epi32(h0, h1), sc);
            }
        }
        const __m512 dw = _mm512_load_ps(pd), dmw = _mm512_load_ps(pd + PANEL_ROWS);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const int32_t *bp = bsp + ((size_t)t * nb + i) * 4;
            __m512i ms = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_load_si512((const void *)pmn),
                                             _mm512_set1_epi32(bp[0]));
#pragma GCC unroll 3
            for (int p = 1; p < 4; p++)
                ms = _mm512_dpwssd_epi32(ms, _mm512_load_si512((const void *)(pmn + p * PANEL_ROWS)),
                                         _mm512_set1_epi32(bp[p]));
            const __m512 da = _mm512_set1_ps(((const flm_block_q8_k *)(x + (size_t)t * xs))[i].d);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(da, dw), _mm512_cvtepi32_ps(sum[t]), acc[t]);
            accm[t] = _mm512_fmadd_ps(_mm512_mul_ps(da, dmw), _mm512_cvtepi32_ps(ms), accm[t]);
        }
    }
    const __mmask16 keep = (__mmask16)(m >= 16 ? 0xffff : (1u << m) - 1);
    const __m512i inv = _mm512_loadu_si512((const void *)pq4k_inv);
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(y + (size_t)t * ys, keep, _mm512_permutexvar_ps(inv, _mm512_sub_ps(acc[t], accm[t])));
}

/* bsp for panel_rows_q4_k: token t's (bs_2p, bs_2p+1) of super-block i as int16 pairs, bs_j = bsums[2j] + bsums[2j+1] */
static void pq4k_bsums(const uint8_t *x, size_t x_stride, size_t n_x, size_t nb, int32_t *bsp) {
    for (size_t t = 0; t < n_x; t++)
        for (size_t i = 0; i < nb; i++) {
            const flm_block_q8_k *a = (const flm_block_q8_k *)(x + t * x_stride) + i;
            for (int p = 0; p < 4; p++) {
                const int32_t lo = a->bsums[4 * p] + a->bsums[4 * p + 1], hi = a->bsums[4 * p + 2] + a->bsums[4 * p + 3];
                bsp[(t * nb + i) * 4 + p] = (int32_t)(((uint32_t)hi << 16) | ((uint32_t)lo & 0xffff));
            }
        }
}

/* The flm_vec_dot_tile_fn of a K-quant panel: panels of 16 rows, each packed once (PACK) and run against every token
 * (ROWS_CALL(nt): PQ4K_T at a time, the last n_x % PQ4K_T with their exact count). BSP: the rows function reads
 * pq4k_bsums (q4_k). Without memory for the panel: VDOT per (row, token), the same bits. */
#define PANEL_K_DRIVER(NAME, PACK, ROWS_CALL, SB_BYTES, BSP, VDOT)                                                \
    static void NAME(const void *W, size_t w_stride, size_t rows, const void *xq, size_t x_stride, size_t n_x,     \
                     size_t n, float *Y, size_t y_stride, void *tmp) {                                             \
        const size_t nb = n / 256;                                                                                 \
        const uint8_t *x = xq;                                                                                     \
        /* tmp (flm_tile_tmp_bytes): the panel, then (BSP) the tokens' paired block sums */                       \
        uint8_t *P = tmp;                                                                                          \
        int32_t *bsp = P && (BSP) ? (int32_t *)(P + ((nb * (SB_BYTES) + 63) & ~(size_t)63)) : NULL;                \
        if (!P) {                                                                                                  \
            for (size_t r = 0; r < rows; r++)                                                                      \
                for (size_t t = 0; t < n_x; t++)                                                                   \
                    Y[t * y_stride + r] = VDOT((const uint8_t *)W + r * w_stride, x + t * x_stride, n);            \
            return;                                                                                                \
        }                                                                                                          \
        if (BSP) pq4k_bsums(x, x_stride, n_x, nb, bsp);                                                            \
        for (size_t r0 = 0; r0 < rows; r0 += PANEL_ROWS) {                                                         \
            const size_t m = rows - r0 < PANEL_ROWS ? rows - r0 : PANEL_ROWS;                                      \
            PACK((const uint8_t *)W + r0 * w_stride, w_stride, m, nb, P);                                          \
            size_t t0 = 0;                                                                                         \
            for (; t0 + PQ4K_T <= n_x; t0 += PQ4K_T) ROWS_CALL(PQ4K_T);                                            \
            switch (n_x - t0) {                                                                                    \
            case 3: ROWS_CALL(3); break;                                                                           \
            case 2: ROWS_CALL(2); break;                                                                           \
            case 1: ROWS_CALL(1); break;                                                                           \
            default: break;                                                                                        \
            }                                                                                                      \
        }                                                                                                          \
    }
#define PQ4K_ROWS(NT)                                                                                             \
    panel_rows_q4_k(P, nb, x + t0 * x_stride, x_stride, bsp + t0 * nb * 4, Y + t0 * y_stride + r0, y_stride, m, NT)
PANEL_K_DRIVER(panel_q4_k, panel_pack_q4_k, PQ4K_ROWS, PQ4K_SB_BYTES, 1, vdot_q4_k_sb)

/* ---------------------------------------------------------------------------------------------------------------
 * q6_k at this level, in the same per-super-block order: S_i = sum_g sc_g * (sum_{l<16} q_{16g+l} * qa_{16g+l}
 * - 32 * bsums_g) exact, acc = fma(da_i * d_i, (float)S_i, acc) in order over i (quants_x512.h's vdot_q6_k with
 * X512_SB_ORDER, which quants_vnni.c defines). Panel of 16 rows, per super-block PQ6K_SB_BYTES bytes:
 *   64 groups v of 64 bytes: elements 4v .. 4v + 3 of row r at bytes 4r .. 4r + 3, unsigned 6-bit q (element
 *     128n + 32s + l: low bits nibble s / 2 of ql[64n + 32(s % 2) + l], high bits 2s of qh[32n + l]);
 *   16 x 16 int32: the scales sc_g;  8 x 16 int32: (sc_2p, sc_2p+1) as int16 pairs;  16 float d.
 * |S_i| <= 256 * 63 * 127 * 128 + 32 * 16 * 128 * 2032: int32 holds it.
 * ------------------------------------------------------------------------------------------------------------- */
#define PQ6K_W_BYTES 4096
#define PQ6K_SB_BYTES (PQ6K_W_BYTES + 16 * 64 + 8 * 64 + 64)

static void panel_pack_q6_k(const uint8_t *W, size_t w_stride, size_t m, size_t nb, uint8_t *P) {
    _Alignas(64) int32_t off[PANEL_ROWS];
    for (size_t r = 0; r < PANEL_ROWS; r++) off[r] = r < m ? (int32_t)(r * w_stride) : 0;
    const __m512i vidx = _mm512_load_si512((const void *)off), m4 = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i m2 = _mm512_set1_epi32(0x03030303), lo16 = _mm512_set1_epi32(0xffff);
    for (size_t i = 0; i < nb; i++) {
        const uint8_t *base = W + i * sizeof(flm_block_q6_k);
        uint8_t *pw = P + i * PQ6K_SB_BYTES;
        int32_t *psc = (int32_t *)(pw + PQ6K_W_BYTES), *ppr = psc + 16 * PANEL_ROWS;
        float *pd = (float *)(ppr + 8 * PANEL_ROWS);
        /* d: the high half of the dword at 206 (sc_14, sc_15, d), which stays inside the block */
        const __m512i dq = _mm512_i32gather_epi32(vidx, (const void *)(base + 206), 1);
        _mm512_store_ps(pd, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dq, 16))));
        __m512i sc[16];
        for (int k = 0; k < 4; k++) {
            const __m512i u = _mm512_i32gather_epi32(vidx, (const void *)(base + 192 + 4 * k), 1);
            for (int b = 0; b < 4; b++) {
                sc[4 * k + b] = _mm512_srai_epi32(_mm512_slli_epi32(u, 24 - 8 * b), 24);
                _mm512_store_si512((void *)(psc + (4 * k + b) * PANEL_ROWS), sc[4 * k + b]);
            }
        }
        for (int p = 0; p < 8; p++)
            _mm512_store_si512((void *)(ppr + p * PANEL_ROWS),
                               _mm512_or_si512(_mm512_and_si512(sc[2 * p], lo16), _mm512_slli_epi32(sc[2 * p + 1], 16)));
        for (int n2 = 0; n2 < 2; n2++)
            for (int g = 0; g < 8; g++) {
                const __m512i qh = _mm512_i32gather_epi32(vidx, (const void *)(base + 128 + 32 * n2 + 4 * g), 1);
                const __m512i l0 = _mm512_i32gather_epi32(vidx, (const void *)(base + 64 * n2 + 4 * g), 1);
                const __m512i l1 = _mm512_i32gather_epi32(vidx, (const void *)(base + 64 * n2 + 32 + 4 * g), 1);
                for (int s = 0; s < 4; s++) {
                    const __m512i l = s & 1 ? l1 : l0;
                    const __m512i lo = _mm512_and_si512(s & 2 ? _mm512_srli_epi32(l, 4) : l, m4);
                    const __m512i hi = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qh, 2 * s), m2), 4);
                    _mm512_store_si512((void *)(pw + (32 * n2 + 8 * s + g) * 64), _mm512_or_si512(lo, hi));
                }
            }
    }
}

/* One q6_k panel (16 rows) against nt <= PQ4K_T tokens at x + t * xs (q8_k blocks). Writes y[t * ys + r], r < m. */
static inline __attribute__((always_inline)) void panel_rows_q6_k(const uint8_t *P, size_t nb, const uint8_t *x,
                                                                   size_t xs, float *y, size_t ys, size_t m, int nt) {
    __m512 acc[PQ4K_T];
#pragma GCC unroll 4
    for (int t = 0; t < PQ4K_T; t++) acc[t] = _mm512_setzero_ps();
    for (size_t i = 0; i < nb; i++) {
        const uint8_t *pw = P + i * PQ6K_SB_BYTES;
        const int32_t *psc = (const int32_t *)(pw + PQ6K_W_BYTES), *ppr = psc + 16 * PANEL_ROWS;
        const float *pd = (const float *)(ppr + 8 * PANEL_ROWS);
        __m512i sum[PQ4K_T];
#pragma GCC unroll 4
        for (int t = 0; t < PQ4K_T; t++) sum[t] = _mm512_setzero_si512();
        for (int g = 0; g < 16; g++) {
            __m512i wv[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) wv[k] = _mm512_load_si512((const void *)(pw + (4 * g + k) * 64));
            const __m512i sc = _mm512_load_si512((const void *)(psc + g * PANEL_ROWS));
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const int8_t *qa = ((const flm_block_q8_k *)(x + (size_t)t * xs))[i].qs + 16 * g;
                __m512i dot = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    int32_t q4;
                    memcpy(&q4, qa + 4 * k, 4);
                    dot = _mm512_dpbusd_epi32(dot, wv[k], _mm512_set1_epi32(q4));
                }
                sum[t] = _mm512_add_epi32(sum[t], _mm512_mullo_epi32(dot, sc));
            }
        }
        const __m512 dw = _mm512_load_ps(pd);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const flm_block_q8_k *a = (const flm_block_q8_k *)(x + (size_t)t * xs) + i;
            __m512i corr = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int p = 0; p < 8; p++) {
                int32_t bp;
                memcpy(&bp, a->bsums + 2 * p, 4);
                corr = _mm512_dpwssd_epi32(corr, _mm512_load_si512((const void *)(ppr + p * PANEL_ROWS)),
                                           _mm512_set1_epi32(bp));
            }
            const __m512i s = _mm512_sub_epi32(sum[t], _mm512_slli_epi32(corr, 5));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(a->d), dw), _mm512_cvtepi32_ps(s), acc[t]);
        }
    }
    const __mmask16 keep = (__mmask16)(m >= 16 ? 0xffff : (1u << m) - 1);
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + (size_t)t * ys, keep, acc[t]);
}

static float vdot_q6_k_vnni(const void *row, const void *xq, size_t n); /* quants_x512.h */
#define PQ6K_ROWS(NT) panel_rows_q6_k(P, nb, x + t0 * x_stride, x_stride, Y + t0 * y_stride + r0, y_stride, m, NT)
PANEL_K_DRIVER(panel_q6_k, panel_pack_q6_k, PQ6K_ROWS, PQ6K_SB_BYTES, 0, vdot_q6_k_vnni)
_Static_assert(PANEL_BLOCK_BYTES == FLM_PANEL_BLOCK_BYTES && PANEL_ROWS == 16 && PQ4K_SB_BYTES <= FLM_PANEL_SB_BYTES_MAX &&
                   PQ6K_SB_BYTES <= FLM_PANEL_SB_BYTES_MAX,
               "flm_tile_tmp_bytes (compute/work.h) must cover the panels");

/* Puts the panel tiles of the 32-element types in k (after tile_fill). */
static void panel_fill(flm_kernels *k) {
    k->vec_dot_tile[FLM_TYPE_Q4_0] = panel_q4_0;
    k->vec_dot_tile[FLM_TYPE_Q4_1] = panel_q4_1;
    k->vec_dot_tile[FLM_TYPE_Q5_0] = panel_q5_0;
    k->vec_dot_tile[FLM_TYPE_Q5_1] = panel_q5_1;
    k->vec_dot_tile[FLM_TYPE_Q8_0] = panel_q8_0;
    k->vec_dot[FLM_TYPE_Q4_K] = vdot_q4_k_sb;
    k->vec_dot_tile[FLM_TYPE_Q4_K] = panel_q4_k;
    k->vec_dot_tile[FLM_TYPE_Q6_K] = panel_q6_k;
}

#endif
