/* sparsity.h — what `flashlm calibrate` learns about a model, stored as the .flm file's PREDICTOR region. Internal.
 *
 * Which neurons count as active (docs/SPARSITY.md):
 *   FLM_RULE_RELU     ReLU FFNs (OPT, ReLU-fied Llama, synthetic --act relu): neuron i is active when its activation
 *                     act(gate_i . x) (gated) or act(up_i . x) is positive; the others contribute exactly 0.
 *   FLM_RULE_CONTRIB  gated SiLU/GELU FFNs (Llama, Qwen2, Gemma 3, stories260K): neuron i is active when its
 *                     contribution to the FFN output, e_i = (h_i ||down_i||)^2 with h_i = act(gate_i . x) * (up_i . x),
 *                     is above tau^2 times the token's total sum_j e_j (the threshold is relative: a token with massive
 *                     activations does not set it). A level is the share eps of the layer's output energy, each token's
 *                     counted as 1 over the calibration tokens, that the neurons below tau carry (TEAL and
 *                     CATS rank by |h_i| or |act(gate_i . x)|; weighing by the down column and choosing tau per
 *                     layer by energy spends the budget where layers need it). The predictor is trained to flag the
 *                     active neurons of one training level; for every level its logit threshold is then set so the
 *                     predicted set keeps 1 - eps of the energy on held-out tokens. Every neuron that is read is
 *                     computed exactly: a false positive costs I/O, never accuracy.
 *   FLM_RULE_CATS     version-1 regions only: |silu(gate . x)| above a threshold (CATS, Lee et al. 2024); neurons
 *                     below it are zeroed in the FFN.
 *
 * Region payload (little-endian), version 2:
 *   u8[4] "FSPR", u32 version = 2, u32 n_layers, f32 eps of the default level, u32 n_agg (= FLM_AGG_K),
 *   u32 n_levels (1..FLM_MAX_LEVELS), u32 default_level (< n_levels), u32 reserved = 0
 *   per level: f32 eps, f32 loss (held-out perplexity cost estimated by calibrate: exp(mean KL) - 1; NaN when
 *              not measured)
 *   per layer: u32 rule, f32 threshold, f32 active_frac, f32 recall, f32 precision, f32 pred_frac, u32[2] reserved
 *              (these six at the default level), f32 s_agg[n_agg] (at the default level),
 *              per level: f32 tau, f32 pred_threshold, f32 oracle_frac, f32 pred_frac, f32 kept, f32 recall,
 *              f32 precision,
 *              then one predictor record (sparsity/predictor.h; its threshold is the default level's)
 * Version 3: version 2 followed by "FSPO" and, per layer, u32[d_ffn] orig (a permutation of 0 .. d_ffn - 1: the
 * neuron each record held before a co-activation order); written when the layers have it.
 * Version 1 (still read): header u8[4], u32 1, u32 n_layers, f32 target_sparsity, u32 n_agg, u32[3] reserved; per
 * layer the six fields, reserved, s_agg, predictor (one level).
 */
#ifndef FLM_SPARSITY_SPARSITY_H
#define FLM_SPARSITY_SPARSITY_H
#include <stdint.h>
#include "flashlm.h"
#include "sparsity/predictor.h"

#define FLM_AGG_K 16     /* s_agg(k) is recorded for k = 1 .. FLM_AGG_K */
#define FLM_MAX_LEVELS 8 /* operating points stored per region */

typedef enum flm_rule { FLM_RULE_RELU = 0, FLM_RULE_CATS = 1, FLM_RULE_CONTRIB = 2 } flm_rule;

/* One operating point of one layer. */
typedef struct flm_level {
    float tau;            /* CONTRIB: the oracle's relative threshold (e_i > tau^2 sum_j e_j; RELU: 0; CATS: on |silu|) */
    float pred_threshold; /* the predictor's logit threshold at this level */
    float oracle_frac;    /* share of neurons above tau on the calibration tokens */
    float pred_frac;      /* share of neurons the predictor flags on held-out tokens */
    float kept;           /* share of the output energy the predicted set keeps on held-out tokens */
    float recall;         /* held-out: share of the neurons above tau that the predictor flags */
    float precision;      /* held-out: share of the flagged neurons that are above tau */
} flm_level;

typedef struct flm_predictor_layer {
    uint32_t rule;          /* flm_rule */
    float threshold;        /* the default level's tau */
    float active_frac;      /* share of neurons truly active on the calibration tokens (default level) */
    float recall;           /* predictor, held-out tokens: TP / (TP + FN) (default level) */
    float precision;        /* TP / (TP + FP) */
    float pred_frac;        /* share of neurons predicted active (what is read without a window) */
    float s_agg[FLM_AGG_K]; /* s_agg(k): mean size of the union of the predicted sets of k consecutive tokens, as a
                               share of d_ffn (Knowl 3), k = 1 .. FLM_AGG_K, at the default level */
    flm_level levels[FLM_MAX_LEVELS];
    flm_predictor pred;
    uint32_t *orig;         /* [d_ffn] or NULL: the neuron each stored record was before a co-activation order
                               (calibrate/coact.c), record i = neuron orig[i]; the sparse mode computes a set in that
                               order, so its sums are those of the file before the order, bit for bit (version 3) */
} flm_predictor_layer;

typedef struct flm_predictor_region {
    uint32_t n_layers;
    float target_sparsity;  /* version 2: eps of the default level; version 1: CATS share of neurons zeroed */
    uint32_t n_levels;      /* 1 .. FLM_MAX_LEVELS */
    uint32_t default_level; /* < n_levels */
    float level_eps[FLM_MAX_LEVELS];  /* energy share dropped per layer by the oracle at each level (RELU: 0) */
    float level_loss[FLM_MAX_LEVELS]; /* held-out perplexity cost with the predictor, estimated as exp(mean KL(dense
                                         || sparse)) - 1 over the held-out tokens; NaN = not measured */
    /* not stored (NaN when read back): calibrate's report */
    float level_loss_oracle[FLM_MAX_LEVELS]; /* the same with the true active sets (calibrate --curve) */
    float level_dnll[FLM_MAX_LEVELS];        /* perplexity ratio - 1 measured on the same tokens (noisier) */
    float level_dnll_oracle[FLM_MAX_LEVELS];
    flm_predictor_layer *layers;
} flm_predictor_region;

/* The CONTRIB rule's true active set: the ids, in increasing order, of the neurons with (h_i dn_i)^2 > tau^2
 * sum_j (h_j dn_j)^2, where h (F floats) holds each neuron's activation act(gate_i . x) (up_i . x) and dn (F floats)
 * its down column's norm. e: F floats of scratch, which may be h itself (each h_i is read before e_i is written).
 * Returns the count. */
uint32_t flm_contrib_set(const float *h, const float *dn, uint32_t F, float tau, float *e, uint32_t *ids);

/* Make level k the current one: each layer's threshold/pred_frac and its predictor's threshold take level k's
 * values (s_agg stays the default level's). k < s->n_levels. */
void flm_predictor_region_use_level(flm_predictor_region *s, uint32_t k);

/* The level whose eps is eps (within 1e-6 relative), or -1. */
int flm_predictor_region_find_level(const flm_predictor_region *s, float eps);

/* Serialize into a malloc'd buffer (*out, *len). Errors: FLM_ERR_NOMEM. */
flm_status flm_predictor_region_serialize(const flm_predictor_region *s, uint8_t **out, size_t *len, flm_error *err);
/* Parse a region payload, checking every field and size (what names the source in messages).
 * Errors: FLM_ERR_FORMAT, FLM_ERR_UNSUPPORTED (version), FLM_ERR_NOMEM. On error *s is zeroed. */
flm_status flm_predictor_region_deserialize(const uint8_t *buf, size_t len, const char *what, flm_predictor_region *s,
                                            flm_error *err);
void flm_predictor_region_free(flm_predictor_region *s);

#endif
