/* curve.h — the quality curve of a calibrated model: perplexity against the bytes a token's FFN sets take from flash,
 * dense, then each stored level with the predictor and with the true active sets (the oracle), so the loss from the
 * threshold and the loss from the predictor show apart (docs/SPARSITY.md, "Quality curves"). Internal; `flashlm
 * perplexity --curve` prints it. */
#ifndef FLM_CALIBRATE_CURVE_H
#define FLM_CALIBRATE_CURVE_H
#include <stdbool.h>
#include <stdint.h>
#include "flashlm.h"
#include "format/flm.h"

/* One point. Dense: eps 0, oracle false. */
typedef struct flm_curve_point {
    float eps;              /* the level (share of each layer's FFN output energy left out by the oracle); 0 = dense */
    bool oracle;            /* the true active sets of the level instead of the predictor's */
    bool is_default;        /* the stored default level */
    double ppl, ppl_stderr; /* flm_perplexity over the same chunks as the dense point */
    double neuron_frac;     /* mean share of d_ffn computed per token and layer (1 for dense; the first token of
                               every chunk runs dense, as in the sparse mode) */
    double bytes_per_token; /* neuron_frac x n_layers x d_ffn x bundle bytes: what a token's sets take from flash when
                               nothing is cached (`--mode sparse --no-window`), before alignment; dense: the whole
                               FFN */
    double seconds;         /* wall time of this point */
} flm_curve_point;

typedef struct flm_curve_opts {
    int chunk;              /* tokens per chunk (-c; default 512, as llama.cpp's wiki numbers) */
    int max_chunks;         /* at most this many chunks; 0 = all */
    const float *levels;    /* the stored levels to measure (eps values, each must be stored); NULL = all */
    uint32_t n_levels;
    bool no_oracle;         /* skip the oracle points (each needs every neuron's contribution: a dense FFN pass) */
    int n_threads;          /* 0 = the library default */
    /* after each chunk: what ("quality curve"), chunks done of all points' chunks */
    flm_progress_fn progress;
    /* after each point (may be NULL) */
    void (*on_point)(void *user, const flm_curve_point *pt);
    void *user;
} flm_curve_opts;

void flm_curve_opts_default(flm_curve_opts *o);

/* Measure the curve of the calibrated gated .flm at path on text (UTF-8): the model is held in memory (ram mode, the
 * FFN select hook) and each point runs flm_perplexity over the same chunks. pts receives 1 + (1 or 2) x levels
 * points (dense first, then per level the predictor and the oracle), at most cap; *n_pts their count.
 * Memory: the model, d_ffn floats per layer (down-column norms), the stored predictors.
 * Errors: FLM_ERR_ARG (not a .flm (the message says how to convert), not calibrated, a ReLU calibration (its sets are exact: one level), a level not
 * stored, cap too small, text shorter than one chunk), those of flm_open and flm_perplexity, FLM_ERR_NOMEM. */
flm_status flm_sparsity_curve(const char *path, const char *text, const flm_curve_opts *o, flm_curve_point *pts,
                              uint32_t cap, uint32_t *n_pts, flm_error *err);

#endif
