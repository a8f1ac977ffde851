/* kernels.h — L_compute: the numeric kernels, a scalar reference and SIMD variants chosen at run time. Internal.
 *
 * Rows are stored as in GGUF: a row of n elements of type t is flm_row_bytes(t, n) bytes (Q4_0/Q8_0 in blocks of 32,
 * layouts in core/types.h). Vectors x, y are float32. All functions take n as the element count; for Q4_0/Q8_0
 * n must be a multiple of 32 (callers check shapes at load time). The SIMD variants must agree with the scalar
 * reference to float rounding (tests/test_kernels.c checks it on random inputs of awkward lengths). */
#ifndef FLM_COMPUTE_KERNELS_H
#define FLM_COMPUTE_KERNELS_H
#include <stddef.h>
#include <stdint.h>
#include "flashlm.h"

#define FLM_N_TYPES 31 /* table size: type ids are < 31 */

typedef float (*flm_dot_fn)(const void *row, const float *x, size_t n);          /* sum_i row[i]*x[i] */
typedef void (*flm_axpy_fn)(const void *row, float a, float *y, size_t n);       /* y[i] += a*row[i]  */
typedef void (*flm_dequant_fn)(const void *row, float *y, size_t n);             /* y[i]  = row[i]    */

typedef struct flm_kernels {
    const char *name;                    /* "scalar", "avx2" */
    flm_dot_fn dot[FLM_N_TYPES];         /* indexed by flm_type; NULL for unsupported types */
    flm_axpy_fn axpy[FLM_N_TYPES];
    flm_dequant_fn dequant[FLM_N_TYPES];
} flm_kernels;

/* The scalar reference table (always available). */
const flm_kernels *flm_kernels_scalar(void);
/* The best table this CPU supports (AVX2+FMA+F16C on x86-64 when present, else scalar). The environment variable
 * FLM_KERNELS=scalar forces the reference. */
const flm_kernels *flm_kernels_best(void);
/* The AVX2 table, or NULL if this build or CPU lacks it (for tests). */
const flm_kernels *flm_kernels_avx2(void);

/* y[r] = dot(W row r, x) for r in [0, rows): W is rows x n of type t, row stride flm_row_bytes(t, n).
 * Splits rows over n_threads OpenMP threads (n_threads <= 1: serial). */
void flm_matvec(const flm_kernels *k, uint32_t t, const void *W, size_t rows, size_t n, const float *x, float *y,
                int n_threads);

/* Scalar conversions (IEEE half, bfloat16 with round-to-nearest-even). */
float flm_f16_to_f32(uint16_t h);
uint16_t flm_f32_to_f16(float f);
float flm_bf16_to_f32(uint16_t h);
uint16_t flm_f32_to_bf16(float f);

/* Quantize / convert a float row of n elements into type t (same rounding as ggml's reference quantizers
 * quantize_row_q8_0_ref / quantize_row_q4_0_ref). dst holds flm_row_bytes(t, n) bytes. */
void flm_quantize_row(uint32_t t, const float *x, void *dst, size_t n);

/* Small float32 ops used by the forward pass (scalar; they are not the bottleneck). */
void flm_rmsnorm(float *out, const float *x, const float *weight, size_t n, float eps); /* out = x/rms(x)*w */
void flm_softmax(float *x, size_t n);                                                     /* in place, stable */

#endif
