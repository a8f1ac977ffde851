/* quants.h — L_compute: the quantized types' scalar reference kernels and quantizers (quants.c) and their AVX2
 * versions (quants_avx2.c). Internal to src/compute/.
 *
 * Sources for every layout and formula: ggml/src/ggml-common.h (blocks), ggml-quants.c (dequantize_row_*,
 * quantize_row_*_ref, ggml_vec_dot_*_q8_*), cross-checked against the gguf Python package's NumPy dequantizers
 * (tests/test_quants.c). */
#ifndef FLM_COMPUTE_QUANTS_H
#define FLM_COMPUTE_QUANTS_H
#include "compute/kernels.h"

/* Fills k's entries for the types quants.c implements in scalar code: dequant/dot/axpy of q4_1, q5_0, q5_1,
 * q2_k..q6_k, vec_dot of every supported type, act_quantize of q8_0/q8_1/q8_k. Leaves the other entries alone. */
void flm_quants_fill_scalar(flm_kernels *k);

/* Scalar quantizers into blocks (nb blocks from nb * block_elems floats). Rounding as ggml's *_ref functions. */
void flm_quantize_q4_0(const float *x, void *dst, size_t nb);
void flm_quantize_q4_1(const float *x, void *dst, size_t nb);
void flm_quantize_q5_0(const float *x, void *dst, size_t nb);
void flm_quantize_q5_1(const float *x, void *dst, size_t nb);
void flm_quantize_q8_0(const float *x, void *dst, size_t nb);
void flm_quantize_q8_1(const float *x, void *dst, size_t nb);
void flm_quantize_q8_k(const float *x, void *dst, size_t nb);

/* The tail after nb q8_0 / q8_1 activation blocks at xq (see kernels.h flm_act_bytes): nb float32 d (the blocks'
 * f16 d converted), then nb int32 sum(qs) (q8_0) or nb float32 s (q8_1, the f16 s converted). May be unaligned:
 * read with memcpy or unaligned loads. */
#define FLM_ACT_TAIL(xq, nb, block_type) ((const uint8_t *)(xq) + (size_t)(nb) * sizeof(block_type))

/* Unpacks the 8 6-bit scales (out[0..7]) and 8 6-bit mins (out[8..15]) of a Q4_K/Q5_K block's scales[12]
 * (ggml-quants.c get_scale_min_k4, all at once). */
void flm_q4k_scales(const uint8_t scales[12], uint8_t out[16]);

#if defined(__x86_64__) && defined(FLM_HAVE_X86)
/* Overrides k's entries with the AVX2+FMA+F16C kernels of quants_avx2.c (CPU support checked by the caller). */
void flm_quants_fill_avx2(flm_kernels *k);
/* Overrides k's entries with the AVX-VNNI kernels of quants_avxvnni.c (k: a copy of the avx2 table; CPU support
 * checked by the caller): the same kernels, the same bits, vpdpbusd / vpdpwssd for the int8 products. */
void flm_quants_fill_avxvnni(flm_kernels *k);
/* Overrides k's entries with the AVX-512 F/BW/VL kernels of quants_avx512.c (k: a copy of the avx2 table; CPU
 * support checked by the caller). */
void flm_quants_fill_avx512(flm_kernels *k);
/* Overrides k's entries with the AVX-512 VNNI kernels of quants_vnni.c (k: a copy of the avx512 table; CPU support
 * checked by the caller). */
void flm_quants_fill_vnni(flm_kernels *k);
#endif

#if defined(__aarch64__) && defined(FLM_HAVE_ARM64)
/* Overrides k's entries with the NEON (ARMv8.0-A) int8 dot products and activation quantizers of quants_neon.c: the
 * scalar reference's integer sums, then its float operations in its order, so the same bits as scalar. */
void flm_quants_fill_neon(flm_kernels *k);
/* The same kernels with SDOT for the int8 products (quants_dotprod.c, -march=armv8.2-a+dotprod; k: a copy of the
 * neon table; CPU support checked by the caller): the same bits as neon. */
void flm_quants_fill_dotprod(flm_kernels *k);
#endif

#endif
