/* calibrate.h — `flashlm calibrate`: record FFN inputs and true active sets on text, fix each layer's activation
 * rule, train one low-rank predictor per layer, and store everything in the .flm file (Knowl 2, 3, 10). Internal. */
#ifndef FLM_CALIBRATE_CALIBRATE_H
#define FLM_CALIBRATE_CALIBRATE_H
#include <stdint.h>
#include "flashlm.h"
#include "format/flm.h"

typedef struct flm_calib_opts {
    const char *text;        /* calibration text (UTF-8) */
    uint32_t max_tokens;     /* tokens recorded (default 4096) */
    uint32_t chunk;          /* tokens per sequence (each starts at position 0 with BOS; default 128) */
    uint32_t rank;           /* predictor rank of most layers (default min(128, d_model / 2)) */
    uint32_t rank_last;      /* rank of the last quarter of layers (default 2 * rank, capped; Knowl 10) */
    float sparsity;          /* SiLU (CATS): share of neurons zeroed by the thresholds (default 0.5) */
    float target_recall;     /* predictor threshold set for this held-out recall (default 0.95; 0 = logit 0) */
    int epochs;              /* default 6 */
    int n_threads;
    flm_progress_fn progress;
    void *user;
} flm_calib_opts;

void flm_calib_opts_default(flm_calib_opts *o);

/* Calibrate the .flm file at path in place (atomically: see flm_file_put_region). Prints nothing; per-layer results
 * are in the stored region (read them back with flm_sparsity_deserialize) and returned in *report when non-NULL.
 * Errors: those of flm_open / flm_file_put_region, FLM_ERR_ARG (text too short: fewer than 64 tokens). */
struct flm_sparsity;
flm_status flm_calibrate(const char *path, const flm_calib_opts *o, struct flm_sparsity *report, flm_error *err);

#endif
