/* predictor.h — the low-rank activation predictor (paper Knowl 2, accuracy notes in Knowl 10). Internal.
 *
 * One predictor per FFN layer. Given the FFN input x (d_model floats: the RMSNorm-ed vector the FFN sees, i.e. the
 * output of that layer's attention block after the FFN norm), it guesses which of the layer's d_ffn intermediate
 * neurons will be active, so only those neurons' bundles are read from flash (Knowl 2, 4):
 *
 *     h = A x           A: rank x d_model     (R^N -> R^r)
 *     z = B h + c       B: d_ffn x rank, c: d_ffn   (R^r -> R^M)
 *     neuron i predicted active  <=>  z_i > threshold
 *
 * With threshold 0 this is the paper's sigmoid(z_i) > 0.5; a negative threshold trades precision (more neurons
 * read) for recall (fewer missed ones), a positive one the reverse. Knowl 10: rank and threshold are model- and
 * layer-dependent (OPT 6.7B used rank 128 in the first 28 layers and 1024 in the last 4, ~5% false negatives and
 * ~7% false positives), so each predictor carries its own rank and threshold.
 *
 * All matrices are float32, row-major (half precision once loaded from a .flm file: A16, B16). This header is the
 * runtime's part: the shape, its lifetime and the serialized record the sparse mode loads (src/runtime/sparse.c
 * predicts with the f16 matrices through the compute kernels). Training, evaluation, threshold calibration and the
 * f32 prediction they use are the tools tier's (src/calibrate/train.h): they need BLAS/LAPACK, the runtime does
 * not. */
#ifndef FLM_SPARSITY_PREDICTOR_H
#define FLM_SPARSITY_PREDICTOR_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "flashlm.h"

/* Upper limits accepted by init and deserialize (far above any real model: d_ffn is 53248 for Llama 3 405B). */
#define FLM_PREDICTOR_MAX_DIM (1u << 20)

typedef struct flm_predictor {
    uint32_t d_model; /* N: length of x */
    uint32_t d_ffn;   /* M: number of FFN intermediate neurons */
    uint32_t rank;    /* r: 1 <= r <= min(d_model, d_ffn) */
    float threshold;  /* logit threshold (default 0): neuron i is predicted active when z_i > threshold */
    float *A;         /* rank x d_model, row-major (malloc'd, owned); NULL when loaded at half precision (A16) */
    float *B;         /* d_ffn x rank, row-major (owned); NULL when loaded at half precision (B16) */
    float *c;         /* d_ffn bias, in logit units (owned) */
    uint16_t *A16;    /* the same matrices as IEEE half floats: set (and A, B NULL) by flm_predictor_deserialize, which */
    uint16_t *B16;    /* reads them as stored (records are f16 since version 2); training and eval need A, B */
} flm_predictor;

/* Allocate a predictor of the given shape with A, B, c and threshold zero (it then predicts nothing active).
 * Errors: FLM_ERR_ARG (a dimension is 0 or above FLM_PREDICTOR_MAX_DIM, rank > min(d_model, d_ffn)),
 * FLM_ERR_NOMEM. On error *p is zeroed (flm_predictor_free on it is a no-op). */
flm_status flm_predictor_init(flm_predictor *p, uint32_t d_model, uint32_t d_ffn, uint32_t rank, flm_error *err);

/* Free A, B, c and zero *p. Accepts NULL and a zeroed predictor. */
void flm_predictor_free(flm_predictor *p);

/* ---------------------------------------------------------------------------------------------------------------
 * Serialization (one record per layer in the .flm file's predictor region; records can be concatenated)
 *
 *   offset  type                   field
 *   0       u8[4]                  magic "FPRD"
 *   4       u32                    version = 2 (1: A and B as f32, still read)
 *   8       u32                    d_model
 *   12      u32                    d_ffn
 *   16      u32                    rank
 *   20      f32                    threshold
 *   24      u32[2]                 reserved, zero
 *   32      f16[rank * d_model]    A, row-major (version 1: f32)
 *           f16[d_ffn * rank]      B, row-major (version 1: f32)
 *           u16 pad, zero          only when rank * (d_model + d_ffn) is odd (version 2)
 *           f32[d_ffn]             c
 * All fields little-endian (IEEE-754 bit patterns for floats). Size (version 2): 32 + 2 * rank * (d_model + d_ffn),
 * rounded up to a multiple of 4, + 4 * d_ffn. Half precision halves the region and the memory it is loaded into;
 * logits move by about 1e-3 of their scale (measured in calibrate, which rounds before it chooses thresholds).
 * ------------------------------------------------------------------------------------------------------------- */
#define FLM_PREDICTOR_MAGIC "FPRD"
#define FLM_PREDICTOR_VERSION 2u
#define FLM_PREDICTOR_HEADER_BYTES 32u

/* Bytes flm_predictor_serialize writes for p. */
size_t flm_predictor_serialized_bytes(const flm_predictor *p);

/* Write p (A, B or A16, B16) to dst as a version-2 record (flm_predictor_serialized_bytes(p) bytes; any alignment). */
void flm_predictor_serialize(const flm_predictor *p, uint8_t *dst);

/* Read one record from src[0 .. len) into *p (overwritten, not freed first: pass a zeroed or freed predictor) and
 * set *consumed (when non-NULL) to its size, so a region holding several layers' records can be walked. Every
 * field is checked against len before it is trusted: magic, reserved fields, dimensions (non-zero, at most
 * FLM_PREDICTOR_MAX_DIM, 1 <= rank <= min(d_model, d_ffn)), the record size (computed in 64 bits) against len, and
 * every float (threshold, A, B, c) finite. Version 2 records load into A16, B16 (A, B stay NULL), version 1 into A, B.
 * Errors: FLM_ERR_FORMAT (the message names what, the field and the values), FLM_ERR_UNSUPPORTED (a version other
 * than 1 or 2), FLM_ERR_NOMEM, FLM_ERR_ARG (NULL p or src with len > 0).
 * On error *p is zeroed. */
flm_status flm_predictor_deserialize(flm_predictor *p, const uint8_t *src, size_t len, size_t *consumed,
                                     const char *what, flm_error *err);

/* The prediction the sparse mode runs (runtime/sparse.c) and the quality curve measures (calibrate/curve.c), with the
 * half-precision matrices A16 [rank x d_model] and B16 [d_ffn x rank] (p's, or a copy of them) through the kernels k:
 * h = A x, z = B h + c, ids = {i : z_i > threshold}, increasing. scratch: rank + d_ffn floats; z is left at
 * scratch + rank. Rows split over n_threads. Returns the count. */
struct flm_kernels;
uint32_t flm_predictor_predict_f16(const struct flm_kernels *k, const flm_predictor *p, const uint16_t *A16,
                                   const uint16_t *B16, float threshold, const float *x, float *scratch,
                                   uint32_t *ids, int n_threads);

#endif
