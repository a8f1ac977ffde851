/* sparsity.h — what `flashlm calibrate` learns about a model, stored as the .flm file's PREDICTOR region. Internal.
 *
 * Which neurons count as active (docs/SPARSITY.md):
 *   FLM_RULE_RELU  ReLU FFNs (OPT, ReLU-fied Llama, synthetic --act relu): neuron i is active when its activation
 *                  act(gate_i . x) (gated) or act(up_i . x) is positive; the others contribute exactly 0.
 *   FLM_RULE_CATS  gated SiLU FFNs (Llama, stories260K): neuron i is active when |silu(gate_i . x)| exceeds a per-layer
 *                  threshold calibrated to a target sparsity (CATS, Lee et al. 2024); neurons below it are treated as
 *                  zero, in every mode that uses the predictor region (sparse), so sparse runs are an approximation
 *                  whose quality `flashlm perplexity` measures.
 *
 * Region payload (little-endian):
 *   u8[4] "FSPR", u32 version = 1, u32 n_layers, f32 target_sparsity, u32 n_agg (= FLM_AGG_K), u32[3] reserved
 *   per layer: u32 rule, f32 threshold, f32 active_frac, f32 recall, f32 precision, f32 pred_frac, u32[2] reserved,
 *              f32 s_agg[n_agg], then one predictor record (sparsity/predictor.h)
 */
#ifndef FLM_SPARSITY_SPARSITY_H
#define FLM_SPARSITY_SPARSITY_H
#include <stdint.h>
#include "flashlm.h"
#include "sparsity/predictor.h"

#define FLM_AGG_K 16 /* s_agg(k) is recorded for k = 1 .. FLM_AGG_K */

typedef enum flm_rule { FLM_RULE_RELU = 0, FLM_RULE_CATS = 1 } flm_rule;

typedef struct flm_layer_sparsity {
    uint32_t rule;          /* flm_rule */
    float threshold;        /* CATS: |silu(gate . x)| threshold; RELU: 0 */
    float active_frac;      /* share of neurons truly active on the calibration tokens */
    float recall;           /* predictor, held-out tokens: TP / (TP + FN) */
    float precision;        /* TP / (TP + FP) */
    float pred_frac;        /* share of neurons predicted active (what is read without a window) */
    float s_agg[FLM_AGG_K]; /* s_agg(k): mean size of the union of the predicted sets of k consecutive tokens, as a
                               share of d_ffn (Knowl 3), k = 1 .. FLM_AGG_K */
    flm_predictor pred;
} flm_layer_sparsity;

typedef struct flm_sparsity {
    uint32_t n_layers;
    float target_sparsity;  /* CATS: the share of neurons the thresholds zero on calibration text */
    flm_layer_sparsity *layers;
} flm_sparsity;

/* Serialize into a malloc'd buffer (*out, *len). Errors: FLM_ERR_NOMEM. */
flm_status flm_sparsity_serialize(const flm_sparsity *s, uint8_t **out, size_t *len, flm_error *err);
/* Parse a region payload, checking every field and size (what names the source in messages).
 * Errors: FLM_ERR_FORMAT, FLM_ERR_UNSUPPORTED (version), FLM_ERR_NOMEM. On error *s is zeroed. */
flm_status flm_sparsity_deserialize(const uint8_t *buf, size_t len, const char *what, flm_sparsity *s,
                                    flm_error *err);
void flm_sparsity_free(flm_sparsity *s);

#endif
