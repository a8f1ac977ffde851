/* quants_x512.h — L_compute: the 512-bit int8 dot products shared by two kernel levels, included once by
 * quants_avx512.c (AVX-512 F/BW/VL: maddubs + madd) and once by quants_vnni.c (AVX-512 VNNI: maddubs + vpdpwssd),
 * each compiled with its own flags. Internal to src/compute/; see quants.h.
 *
 * The includer defines, before including this file:
 *   DPWSSD(acc, a, b): acc plus, in each int32 lane, a.lo * b.lo + a.hi * b.hi (int16 halves);
 *   X512(name): the kernel's name in that file; X512_FILL: its table-fill function.
 * maddubs saturates at int16: q6_k's weights are unsigned 6-bit and activations in [-127, 127]
 * (flm_act_quantize never writes -128), so a pair sum is at most 2 * 63 * 127 = 16002.
 *
 * Kernels: vec_dot of q6_k; every other type keeps the avx2 table's. Measured on an AVX-512 VNNI Xeon (2 cores,
 * one thread, CPU time of 400000 rows of 4096 weights hot in L2, bench/kernel_instr.c), ns per 256 weights:
 *   q6_k  avx2 11.6, avx512 9.5-10.7, vnni 9.6-9.7   (kept: two 32-byte steps per 512-bit step)
 *   q4_k  avx2 7.9-10.1, avx512 9.9-11.2, vnni 9.1-10.2 (dropped: maddubs + vpdpwssd per 64 bytes is no fewer
 *         multiply-port cycles than avx2's two maddubs + madd per 2 x 32 bytes, plus the 256-to-512 inserts)
 *   q8_0  avx2 9.1-9.9, avx512 15.9-16.0, vnni 15.3-15.4 (dropped: 34-byte blocks need an insert per 2 blocks,
 *         the sign fix a mask + masked subtract, and int32 block sums a reduction the avx2 kernel does in int16)
 *   q4_0/q4_1/q5_0/q5_1: more instructions than avx2 in the same shape (dropped untimed).
 * The dropped kernels are in git history (the commit "kernels: levels chosen at run time ..."). Beating avx2 on
 * the 32-element types and q4_k needs what llama.cpp does: weights repacked into interleaved rows so one 512-bit
 * step serves several rows, and float accumulation per sub-block instead of the avx2 kernels' lane order.
 *
 * Same answer as the avx2 kernel, bit for bit: it forms the same exact integer sums as quants_avx2.c's vdot_q6_k
 * (the same 8 int32 lanes per super-block, the two 256-bit halves of a 512-bit accumulator added at the end) and
 * then the same float operations in the same order. Only the integer work is wider. tests/test_kernels.c checks the equality on random blocks. */
#ifndef FLM_COMPUTE_QUANTS_X512_H
#define FLM_COMPUTE_QUANTS_X512_H

#include "compute/quants.h"
#include "compute/quants_x86.h"
#include "core/types.h"

/* lo in the low 256 bits, hi in the high */
static inline __m512i cat256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
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
    float acc_sb = 0.0f;
    (void)acc_sb;
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
#ifdef X512_SB_ORDER /* one float step per super-block (quants_panel_vnni.h): its exact integer total */
        acc_sb = fmaf(a[i].d * h2f(w[i].d), (float)hsum_i32(sumi), acc_sb);
#else
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[i].d * h2f(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
#endif
    }
#ifdef X512_SB_ORDER
    (void)acc;
    return acc_sb;
#else
    return hsum_ps(acc);
#endif
}

/* axpy_tile of q8_0 (the down rows of a batch, ffn_bundle.c): Y[t] += a[t * a_stride + r] * row r for rows r in
 * order and up to 12 tokens at a time, each 32-column block of the tokens' outputs held in two 512-bit registers per
 * token while the rows pass over it. Every element gets the fmadd of the avx2 axpy_q8_0 (a * d rounded once, then
 * one fused multiply-add with the exact int8 weight), rows in the same order, so the bits are axpy_q8_0's row by row:
 * only the vector is wider and 12 tokens share each block's conversion instead of 4. A zero coefficient adds an
 * exact 0 (the row-by-row loop skips it). tests/test_kernels.c checks the bits.
 *
 * The products a * d of a block go to a small table first, 16 rows per vmulps (the rows' block scales gathered and
 * converted 16 at a time, the coefficients loaded 16 rows at a time: a token's are contiguous in r), and each fmadd
 * takes its product from there as an embedded broadcast (a load) instead of a scalar multiply and a register
 * broadcast: at 512 bits the broadcast shares the shuffle port with the second FMA unit, so the old inner loop
 * issued four p0/p5 operations per two FMAs. The products are the same single roundings, so the bits do not change. */
#define AXPY_T8_ROWS 32 /* rows per product table (a down group, TILE_NG in ffn_bundle.c) */
#define AXPY_T8_TOK 12  /* tokens per pass over the rows: 24 accumulators of the 32 registers */

/* One 32-column block i of nt tokens' outputs (Y0 + t * y_stride) through nr rows (block i of row r at Wi + r *
 * w_stride; ad[t * AXPY_T8_ROWS + r] the product a * d). Inlined with nt a constant (the switch below), so the
 * token loops unroll and the 2 * nt accumulators stay in registers (with nt a variable the compiler kept them on the
 * stack: a store and a compare beside each pair of fmadds); the operations and their order are the same for every
 * nt. */
static inline __attribute__((always_inline)) void X512(axpy_t8_block)(const uint8_t *Wi, size_t w_stride, size_t nr,
                                                                     const float *ad, float *Y0, size_t y_stride,
                                                                     const size_t nt) {
    __m512 lo[AXPY_T8_TOK], hi[AXPY_T8_TOK];
#pragma GCC unroll 12
    for (size_t t = 0; t < nt; t++) {
        lo[t] = _mm512_loadu_ps(Y0 + t * y_stride);
        hi[t] = _mm512_loadu_ps(Y0 + t * y_stride + 16);
    }
    for (size_t r = 0; r < nr; r++) {
        const flm_block_q8_0 *b = (const flm_block_q8_0 *)(Wi + r * w_stride);
        const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->qs)));
        const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16))));
#pragma GCC unroll 12
        for (size_t t = 0; t < nt; t++) {
            const __m512 p = _mm512_set1_ps(ad[t * AXPY_T8_ROWS + r]);
            lo[t] = _mm512_fmadd_ps(p, q0, lo[t]);
            hi[t] = _mm512_fmadd_ps(p, q1, hi[t]);
        }
    }
#pragma GCC unroll 12
    for (size_t t = 0; t < nt; t++) {
        _mm512_storeu_ps(Y0 + t * y_stride, lo[t]);
        _mm512_storeu_ps(Y0 + t * y_stride + 16, hi[t]);
    }
}

static void X512(axpy_tile_q8_0)(const void *W, size_t w_stride, size_t rows, const float *a, size_t a_stride,
                                 float *Y, size_t y_stride, size_t n_y, size_t n) {
    const size_t nb = n / FLM_QK;
    float ad[AXPY_T8_TOK * AXPY_T8_ROWS] __attribute__((aligned(64))); /* [t][r]: a * d of block i */
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (size_t r0 = 0; r0 < rows; r0 += AXPY_T8_ROWS) { /* rows in order: a later chunk adds after this one */
        const size_t nr = rows - r0 < AXPY_T8_ROWS ? rows - r0 : AXPY_T8_ROWS;
        const uint8_t *W0 = (const uint8_t *)W + r0 * w_stride;
        /* byte offsets of the chunk's rows (16 per half): a gather reads each row's block scale */
        const __m512i off = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)w_stride));
        const __m512i off16 = _mm512_add_epi32(off, _mm512_set1_epi32((int)(16 * w_stride)));
        const __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1),
                        m1 = nr <= 16 ? (__mmask16)0 : nr >= 32 ? (__mmask16)0xffff : (__mmask16)((1u << (nr - 16)) - 1);
        for (size_t t0 = 0; t0 < n_y; t0 += AXPY_T8_TOK) {
            const size_t nt = n_y - t0 < AXPY_T8_TOK ? n_y - t0 : AXPY_T8_TOK;
            for (size_t i = 0; i < nb; i++) {
                const uint8_t *Wi = W0 + i * sizeof(flm_block_q8_0); /* the 16-bit scale leads the block */
                __m512 d0, d1 = _mm512_setzero_ps();
                if (w_stride <= (size_t)INT32_MAX / AXPY_T8_ROWS) { /* the offsets fit the gather's int32 lanes */
                    d0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
                        _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m0, off, Wi, 1)));
                    if (m1)
                        d1 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
                            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m1, off16, Wi, 1)));
                } else {
                    float dv[AXPY_T8_ROWS] = {0};
                    for (size_t r = 0; r < nr; r++) dv[r] = _cvtsh_ss(((const flm_block_q8_0 *)(Wi + r * w_stride))->d);
                    d0 = _mm512_loadu_ps(dv);
                    d1 = _mm512_loadu_ps(dv + 16);
                }
                for (size_t t = 0; t < nt; t++) {
                    const float *at = a + (t0 + t) * a_stride + r0;
                    _mm512_store_ps(ad + t * AXPY_T8_ROWS, _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, at), d0));
                    if (m1)
                        _mm512_store_ps(ad + t * AXPY_T8_ROWS + 16,
                                        _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, at + 16), d1));
                }
                float *Y0 = Y + t0 * y_stride + i * FLM_QK;
                switch (nt) { /* each a copy with the token count fixed (X512(axpy_t8_block)) */
#define AXPY_T8_CASE(N)                                                                                                \
    case N: X512(axpy_t8_block)(Wi, w_stride, nr, ad, Y0, y_stride, N); break;
                    AXPY_T8_CASE(1) AXPY_T8_CASE(2) AXPY_T8_CASE(3) AXPY_T8_CASE(4) AXPY_T8_CASE(5) AXPY_T8_CASE(6)
                    AXPY_T8_CASE(7) AXPY_T8_CASE(8) AXPY_T8_CASE(9) AXPY_T8_CASE(10) AXPY_T8_CASE(11)
                    default: X512(axpy_t8_block)(Wi, w_stride, nr, ad, Y0, y_stride, AXPY_T8_TOK); break;
#undef AXPY_T8_CASE
                }
            }
        }
    }
}
#undef AXPY_T8_ROWS
#undef AXPY_T8_TOK

void X512_FILL(flm_kernels *k) {
    k->vec_dot[FLM_TYPE_Q6_K] = X512(vdot_q6_k);
    k->axpy_tile[FLM_TYPE_Q8_0] = X512(axpy_tile_q8_0);
    tile_fill(k); /* the includer's tiled dots (quants_tile_x86.h, included before this file) */
#ifdef X512_PANEL_FILL
    X512_PANEL_FILL(k); /* and its panel tiles, where it has them (quants_panel_vnni.h) */
#endif
}

#endif
