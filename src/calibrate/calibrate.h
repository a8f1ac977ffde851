/* calibrate.h — `flashlm calibrate`: record FFN inputs on text, fix each layer's activation rule and its operating
 * points (levels), train one low-rank predictor per layer, choose the default level by measuring held-out perplexity,
 * and store everything in the .flm file (paper Knowl 2, 3, 10; docs/SPARSITY.md). Internal. */
#ifndef FLM_CALIBRATE_CALIBRATE_H
#define FLM_CALIBRATE_CALIBRATE_H
#include <stdint.h>
#include "flashlm.h"
#include "format/flm.h"
#include "model/model.h"

typedef struct flm_calib_opts {
    const char *text;        /* calibration text (UTF-8) */
    uint32_t max_tokens;     /* tokens recorded (default 4096); 80% train the predictors, 20% set the thresholds */
    uint32_t chunk;          /* tokens per sequence (each starts at position 0 with BOS; default 128) */
    uint32_t rank;           /* predictor rank of most layers (default min(128, d_model / 2)) */
    uint32_t rank_last;      /* rank of the last quarter of layers (default 2 * rank, capped; Knowl 10) */
    float level;             /* gated non-ReLU FFNs: force the default level to this eps (share of each layer's
                                output energy dropped by the oracle; added to the standard levels); 0 (default) =
                                choose it by measuring held-out perplexity against max_loss */
    float max_loss;          /* the default level is the most aggressive standard level whose held-out perplexity
                                is at most (1 + max_loss) x the dense one (default 0.01) */
    uint32_t eval_tokens;    /* held-out tokens (after the recorded ones) for that check (default 512; fewer when
                                the text is short, at least 2 chunks) */
    float train_eps;         /* the level whose active sets the predictor is trained to flag (default 0.02) */
    bool curve;              /* measure every level, with the predictor and with the true active sets (the oracle),
                                instead of stopping at the first level past max_loss */
    float target_recall;     /* ReLU FFNs: predictor threshold set for this held-out recall (default 0.95) */
    int epochs;              /* default 6 */
    int n_threads;
    uint64_t mem_bytes;      /* memory budget (--mem), bytes; 0: none (the model is held in memory, ram mode) */
    double mem_percent;      /* or a budget as a percentage of the model's weight bytes, when mem_bytes is 0.
                                With a budget, calibrate streams: the model is run in hybrid mode under it; the
                                recorded FFN inputs go to a temporary file beside the model ("<path>.x.tmp",
                                n_layers x tokens x d_model floats, removed afterwards) and one layer's are read back
                                at a time; each layer's FFN weights are read from the file when it is trained; the
                                held-out check runs only when the model and its reference logits fit the budget (else
                                the training level is the default, and the levels' loss is left unmeasured). What
                                one layer's training holds is checked against the budget before anything runs
                                (flm_calibrate_train_bytes) */
    flm_progress_fn progress; /* phases: "recording tokens", "training predictors", "checking levels" */
    void *user;
} flm_calib_opts;

void flm_calib_opts_default(flm_calib_opts *o);

/* The standard levels (eps values) calibrate measures for gated non-ReLU FFNs, ascending; returns their count. */
uint32_t flm_calib_standard_levels(float *eps, uint32_t cap);

/* Bytes that training one layer holds at these options for a model of these hyper-parameters, with the predictors
 * of every layer: gate/up rows as floats (2 d_ffn d_model), pre-activations and energies (2 tokens d_ffn floats),
 * labels (tokens d_ffn bytes), the layer's recorded inputs (tokens d_model floats), the held-out logits, the
 * histogram, the optimiser's state, and all layers' predictors (f32 and f16). What a budget must hold besides the
 * process itself (see flm_calib_opts.mem_bytes). */
uint64_t flm_calibrate_train_bytes(const flm_hparams *hp, const flm_calib_opts *o);

/* Calibrate the .flm file at path in place (atomically: see flm_file_put_region). Prints nothing; per-layer results
 * and the levels (with their measured held-out loss) are in the stored region (read them back with
 * flm_sparsity_deserialize) and returned in *report when non-NULL (at the default level).
 * One calibration of a file at a time: an exclusive advisory lock (flock) on path is held throughout; a second run
 * fails at once with FLM_ERR_IO ("another `flashlm calibrate` is writing this file").
 * Errors: those of flm_open / flm_file_put_region, FLM_ERR_ARG (bad options; text too short: fewer than 64 tokens
 * to record), FLM_ERR_IO (locked, or cannot be opened), FLM_ERR_NOMEM. */
struct flm_sparsity;
flm_status flm_calibrate(const char *path, const flm_calib_opts *o, struct flm_sparsity *report, flm_error *err);

/* Choose the default level of an already calibrated .flm again, on new text, without recording or training: the
 * held-out check above on the last eval_tokens tokens of o->text, against o->max_loss (o->curve: every level). The
 * stored predictors, thresholds and s_agg are kept (s_agg stays the one measured at the old default level).
 * Errors: FLM_ERR_ARG (not calibrated, a single-level (ReLU) calibration, text shorter than 2 chunks), those of
 * flm_open and flm_file_put_region, FLM_ERR_NOMEM. */
flm_status flm_calibrate_levels(const char *path, const flm_calib_opts *o, struct flm_sparsity *report,
                                flm_error *err);

#endif
