/* train.h — training the low-rank activation predictors (sparsity/predictor.h; paper Knowl 2, 10): prediction in
 * f32, evaluation, threshold calibration and training. The tools tier (libflashlm_tools): BLAS/LAPACK live here, not
 * in the runtime library. Internal.
 *
 * All matrices are float32, row-major. Training (flm_predictor_train) is plain C + BLAS/LAPACK on the CPU:
 * an optional truncated-SVD initialisation from the layer's gate (or up) projection, a bias initialisation that
 * matches each neuron's active fraction, then mini-batch Adam on a balanced binary cross-entropy.
 *
 * Threading: predict, eval and calibrate call BLAS (OpenBLAS), which may use its own pthread pool; train sets
 * OpenBLAS's thread count to opts.n_threads for its duration (and restores it). OpenBLAS's pool and OpenMP's
 * spinning workers contend for the cores when their work interleaves (measured: an epoch 5x slower on 2 cores when
 * the element-wise training loops were OpenMP-parallel), so those loops are serial and OpenMP is used only where no
 * BLAS call interleaves (the per-neuron bias initialisation). For the same reason a runtime that runs its own
 * OpenMP kernels between predictions should run OpenBLAS single-threaded (openblas_set_num_threads(1)): predict for
 * d_model 2048, d_ffn 5632, rank 128 took 67 us with one BLAS thread and 84-120 us with two on a 2-core machine.
 * A predictor is read-only during predict, so several threads may predict with the same predictor concurrently,
 * each with its own scratch. */
#ifndef FLM_CALIBRATE_TRAIN_H
#define FLM_CALIBRATE_TRAIN_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flashlm.h"
#include "sparsity/predictor.h"

/* Floats of scratch that flm_predictor_predict needs: rank + d_ffn. */
static inline size_t flm_predictor_scratch_floats(const flm_predictor *p) {
    return (size_t)p->rank + (size_t)p->d_ffn;
}

/* Predict the active neurons for one input x (d_model floats), with A, B (f32) or else A16, B16 (f16). Writes the ids
 * of the neurons with z_i > threshold into ids (capacity d_ffn) in increasing order and returns their count. scratch holds
 * flm_predictor_scratch_floats(p) floats; on return scratch[rank .. rank + d_ffn) holds the logits z (bias
 * included), scratch[0 .. rank) the hidden vector h = A x. Cost: rank * (d_model + d_ffn) multiply-adds. */
size_t flm_predictor_predict(const flm_predictor *p, const float *x, uint32_t *ids, float *scratch);

/* ---------------------------------------------------------------------------------------------------------------
 * Training
 * ------------------------------------------------------------------------------------------------------------- */

/* How the binary cross-entropy weights the (rare) active neurons against the inactive ones. With weight w on a
 * positive term, the loss is minimised by predicting "active" when P(active | x) > 1 / (1 + w): w = n_neg / n_pos
 * makes both classes count equally in total, which is what keeps a predictor from learning "nothing fires" when
 * only a few percent of neurons do (Knowl 2: "balanced positive/negative training loss"). */
typedef enum flm_predictor_balance {
    FLM_PRED_BALANCE_LAYER = 0,  /* default: one weight w = n_neg / n_pos over the whole layer (training split) */
    FLM_PRED_BALANCE_NEURON = 1, /* per neuron: w_i = n_neg_i / n_pos_i, capped at max_pos_weight (1 when the
                                    neuron never fires in the training split) */
    FLM_PRED_BALANCE_NONE = 2,   /* plain BCE (w = 1): for comparison */
} flm_predictor_balance;

typedef struct flm_predictor_train_opts {
    int epochs;             /* passes over the training split (default 6); 0 = initialise only, no Adam steps */
    float lr;               /* Adam step size, relative: A and B move by about lr * (RMS of their initial entries)
                               per step, c by about lr * (std of the initial logits) (default 0.02). This makes one
                               setting work whatever the scale of W and x. */
    int batch;              /* samples per Adam step (default 64) */
    float holdout;          /* fraction of the n samples held out for the returned metrics, in [0, 1) (default 0.2);
                               0 = none (metrics are then computed on the training samples) */
    uint64_t seed;          /* split, shuffling and random initialisation (default 1) */
    const float *init_W;    /* optional d_ffn x d_model row-major matrix (the layer's gate projection, or the up
                               projection of a non-gated FFN) whose truncated SVD W ~ U_r S_r V_r^T initialises
                               B = U_r S_r^{1/2}, A = S_r^{1/2} V_r^T; NULL = random initialisation */
    flm_predictor_balance balance; /* default FLM_PRED_BALANCE_LAYER */
    float max_pos_weight;   /* cap for FLM_PRED_BALANCE_NEURON weights (default 100) */
    float target_recall;    /* in (0, 1]: after training, calibrate the threshold (flm_predictor_calibrate) so the
                               recall on the held-out split (the training split when there is none) is at least
                               target_recall; 0 (default) = keep threshold 0 */
    bool warm_start;        /* start from p's current (trained) A, B, c instead of initialising them (init_W then
                               unused); the step sizes then scale with their current RMS, so A = B = 0 stays put */
    bool select_best;       /* keep the weights (after an epoch, or the initial ones) with the lowest held-out loss
                               instead of the last epoch's: early stopping against over-fitting, which a few thousand
                               samples allow (default true; needs holdout > 0). The returned metrics are then
                               computed on the split that chose the epoch, so they are slightly optimistic. */
    int n_threads;          /* OpenBLAS threads during training (restored after), and OpenMP threads of the bias
                               initialisation; 0 (default) = leave the libraries' defaults */
    void (*progress)(void *user, const char *what, uint64_t done, uint64_t total); /* optional: called with "init"
                               (0 of 1, 1 of 1) and "epoch" (done of epochs) after each epoch */
    void *user;
} flm_predictor_train_opts;

/* Fill o with the defaults above. */
void flm_predictor_train_opts_default(flm_predictor_train_opts *o);

/* Quality of a predictor on a data set. Counts are over all (sample, neuron) pairs ("micro" averages). */
typedef struct flm_predictor_metrics {
    double recall;           /* TP / (TP + FN): share of truly active neurons that were predicted (1 if none are) */
    double precision;        /* TP / (TP + FP): share of predicted neurons that were active (1 if none predicted) */
    double active_frac_true; /* (TP + FN) / (n * d_ffn) */
    double active_frac_pred; /* (TP + FP) / (n * d_ffn): the share of FFN weights that would be read */
    uint64_t n_train;        /* samples trained on (flm_predictor_eval: 0) */
    uint64_t n_holdout;      /* samples the metrics were computed on */
    double loss;             /* layer-balanced BCE (positives weighted by n_neg / n_pos of the evaluated data),
                                divided by the total weight: 0.693 is a coin flip; uses the threshold-free z */
} flm_predictor_metrics;

/* Train p (already flm_predictor_init'ed: its d_model, d_ffn and rank are used) to predict Y from X.
 *   X: n x d_model floats, row-major: FFN inputs (the RMSNorm-ed vectors the FFN sees).
 *   Y: n x d_ffn bytes, row-major: 1 when the neuron was active for that input (e.g. gate_i . x > 0 for a ReLU
 *      FFN), 0 when not; any non-zero byte counts as 1.
 *   o: options (NULL = defaults). m: optional, receives the metrics on the held-out split.
 * Samples are split at random (seed) into training and held-out sets. Unless o->warm_start, A and B are initialised
 * from init_W's truncated SVD (or at random), rescaled so the initial logits have standard deviation 4, and each
 * c_i is set so that neuron i's predicted active fraction on the training split equals its true one. Then
 * o->epochs passes of mini-batch Adam (beta1 0.9, beta2 0.999, eps 1e-8, step cosine-decayed to 10%) over shuffled
 * batches minimise the balanced BCE (see flm_predictor_balance); with o->select_best the weights with the lowest
 * held-out loss are kept. p->threshold is 0 afterwards unless o->target_recall > 0.
 * Cost per epoch: about 6 * n * rank * (d_model + d_ffn) flops (three GEMMs forward and back); d_model 2048, d_ffn
 * 5632, rank 128, 4000 samples: ~1.5 s to initialise and ~0.5 s per epoch on 2 cores, 4-5 s with the defaults.
 * Memory: the data (not copied) plus ~4 parameter-sized buffers and a few batch-sized ones.
 * Errors: FLM_ERR_ARG (p not initialised; NULL data; fewer than 2 training samples or more than INT_MAX; a bad
 * option; a non-finite value in X or init_W; training diverged to non-finite weights), FLM_ERR_NOMEM,
 * FLM_ERR_UNSUPPORTED (the eigensolver failed on init_W). On error p's weights are unspecified but valid to free. */
flm_status flm_predictor_train(flm_predictor *p, const float *X, const uint8_t *Y, size_t n,
                               const flm_predictor_train_opts *o, flm_predictor_metrics *m, flm_error *err);

/* Round A and B to half precision in place (the values a serialized record holds), so that what calibration measures
 * with p is what a loaded predictor computes. */
void flm_predictor_round_f16(flm_predictor *p);

/* Metrics of p (with its threshold) on n samples (X, Y as for train); m->n_train = 0, m->n_holdout = n.
 * Errors (m zeroed): FLM_ERR_ARG (NULL or uninitialised argument), FLM_ERR_NOMEM (scratch: 256 samples' worth). */
flm_status flm_predictor_eval(const flm_predictor *p, const float *X, const uint8_t *Y, size_t n,
                              flm_predictor_metrics *m, flm_error *err);

/* Set p->threshold so that the recall on (X, Y) is at least target_recall (0 < target <= 1) with as few
 * predicted neurons as that allows: with the P active pairs' logits sorted ascending, s_0 <= s_1 <= ..., and
 * k = floor((1 - target) * P) of them allowed to be missed, the threshold goes midway between s_{k-1} and s_k
 * (just below s_k when k = 0 or they are equal). With no active pair the threshold is left unchanged.
 * Memory: P floats. Errors: FLM_ERR_ARG, FLM_ERR_NOMEM. */
flm_status flm_predictor_calibrate(flm_predictor *p, const float *X, const uint8_t *Y, size_t n, double target_recall,
                                   flm_error *err);

#endif
