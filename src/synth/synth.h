/* synth.h — synthetic Llama-shaped GGUF models with random weights and realistic FFN activation statistics, for
 * benchmarking the flash path (`flashlm synth`). Internal. Design and measured numbers: docs/SYNTH.md.
 *
 * The files are standard llama GGUF files (llama.cpp loads the SiLU variant; the ReLU variant adds the one extension
 * key "flashlm.ffn_activation" = "relu"). The weights are random, so the text a model generates is meaningless: a
 * synthetic file measures the system (I/O, memory, kernels), never model quality.
 *
 * What is realistic is the FFN's activation sparsity (the property "LLM in a flash" exploits, Knowl 2): per layer,
 * neuron i fires (gate_i . x > 0) on a fraction p_i of tokens; the sorted p_i follow a Zipf-like power-law curve whose
 * mean is `active` (a few hot neurons, many that almost never fire); gate and up rows are low rank plus noise, so a
 * low-rank predictor of the FFN input can learn which neurons fire. The biases that set p_i are calibrated during
 * generation by running calibration tokens through the model as it is being written (docs/SYNTH.md, "Construction"). */
#ifndef FLM_MODEL_SYNTH_H
#define FLM_MODEL_SYNTH_H
#include <stdbool.h>
#include <stdint.h>
#include "flashlm.h"
#include "format/flm.h"
#include "model/model.h"

typedef struct flm_synth_params {
    /* shape (llama.* keys) */
    uint32_t d_model;     /* embedding_length (default 2048) */
    uint32_t d_ffn;       /* feed_forward_length (default 5632) */
    uint32_t n_layers;    /* block_count (default 28) */
    uint32_t n_heads;     /* attention.head_count (default 32); must divide d_model, head_dim must be even */
    uint32_t n_kv_heads;  /* attention.head_count_kv (default 32); must divide n_heads */
    uint32_t n_vocab;     /* tokens (default 32000); at least 259: <unk>, <s>, </s> and 256 byte tokens */
    uint32_t n_ctx;       /* context_length (default 2048) */
    uint32_t type;        /* flm_type of every matrix (default F16); norms are always F32. Q8_0/Q4_0 need d_model and
                             d_ffn to be multiples of 32 */
    flm_act act;          /* FFN activation (default ReLU: writes flashlm.ffn_activation = "relu"); SiLU writes a plain
                             llama file */
    /* activation statistics */
    double active;        /* mean fraction of FFN neurons with gate . x > 0, over neurons and tokens; (0, 0.9]
                             (default 0.05) */
    uint32_t rank;        /* rank of the low-rank part of gate and up rows (default 64); 0 = no low-rank part
                             (pure noise, unpredictable); at most min(d_model, d_ffn) */
    double noise;         /* fraction of each gate/up row's energy outside the low-rank part, [0, 1] (default 0.1;
                             forced to 1 when rank is 0) */
    double decay;         /* singular values of the low-rank part fall like k^-decay, k = 1..rank (default 0.5) */
    double tail;          /* power-law exponent s of the sorted frequencies p(u) = p_max (1 + u/u0)^-s (default 2) */
    uint32_t calib_tokens;/* tokens run through the model during generation to calibrate biases and scales
                             (default 64; 8..1024) */
    uint64_t seed;        /* everything is a function of the seed: same parameters, same bytes (default 1) */
    /* numerics written as metadata */
    float norm_eps;       /* layer_norm_rms_epsilon (default 1e-5) */
    float rope_theta;     /* rope.freq_base (default 10000) */
    int n_threads;        /* generation threads (default: all online CPUs); does not change the output */
} flm_synth_params;

/* Fill p with the defaults above: the project's standard benchmark shape (about 3.1 GB in F16). */
void flm_synth_params_default(flm_synth_params *p);

/* Check every parameter; the message says which one is wrong and why (e.g. "d_model 2050 is not a multiple of
 * n_heads 32"). Errors: FLM_ERR_ARG. */
flm_status flm_synth_check(const flm_synth_params *p, flm_error *err);

/* Bytes of tensor data the file will hold (the file is this plus a header of about 1 MB for vocabulary 32000);
 * 0 when the parameters are invalid. */
uint64_t flm_synth_tensor_bytes(const flm_synth_params *p);

/* Write the model to path: "<path>.tmp" is written tensor by tensor through the streaming flm_gguf_writer (one tensor is
 * generated while the previous one is written in the background: at most two tensor buffers in memory, each the size
 * of the largest tensor, the n_vocab x d_model embedding of p->type: ~270 MB for the default), fsynced and renamed
 * onto path. progress (may be NULL) gets ("synth", bytes of tensor data written, total) as tensors complete. On any
 * error nothing is left behind (no path, no temporary) and an existing file at path is untouched.
 * Errors: FLM_ERR_ARG (bad parameters, as flm_synth_check), FLM_ERR_IO (cannot write), FLM_ERR_NOMEM,
 * FLM_ERR_FORMAT (the calibration pass met a non-finite value: should not happen; please report). */
flm_status flm_synth_write(const char *path, const flm_synth_params *p, flm_progress_fn progress, void *user,
                           flm_error *err);

/* The target frequency curve: n per-neuron firing frequencies, sorted from hottest to coldest,
 * p_k = p_max (1 + u_k/u0)^-tail with u_k = (k + 0.5)/n, p_max = 0.5 + active/2, and u0 solved so that the mean is
 * active. out holds n values in (0, 1). Returns false when active is outside (0, 0.9] or tail <= 0. */
bool flm_synth_frequencies(double active, double tail, uint32_t n, double *out);

/* The window of flm_synth_activity.layer_reuse: the paper's OPT 6.7B setting of four recent tokens (Knowl 3). */
#define FLM_SYNTH_WINDOW 4

/* Measured activation statistics of a model (flm_synth_measure). A neuron is active for a token when its gate
 * pre-activation gate_i . rmsnorm(x) is > 0 (ReLU: relu(gate) > 0; SiLU: silu(gate) > 0). */
typedef struct flm_synth_activity {
    uint32_t n_layers, d_ffn, n_tokens;
    uint32_t *counts;        /* [n_layers * d_ffn]: tokens on which neuron i of layer l fired, at l * d_ffn + i */
    double *layer_active;    /* [n_layers]: mean fraction of active neurons */
    double *layer_hot_share; /* [n_layers]: share of all activations that the 10% most frequently active neurons make */
    double *layer_rare;      /* [n_layers]: fraction of neurons active on at most 1% of the tokens */
    double *layer_reuse;     /* [n_layers]: fraction of a token's active neurons that were active on at least one of
                                the FLM_SYNTH_WINDOW previous tokens (what windowing can reuse, Knowl 3) */
    double *layer_token_sd;  /* [n_layers]: standard deviation over tokens of a token's fraction of active neurons */
    double *layer_token_max; /* [n_layers]: the largest fraction of active neurons of any token */
    double mean_active, mean_hot_share, mean_rare, mean_reuse; /* averages over layers */
    double max_logit_diff;   /* max |logit - engine logit| / max(1, max |engine logit|) against flm_eval on the same
                                tokens; -1 when not checked */
    bool finite;             /* every activation and logit was finite */
} flm_synth_activity;

/* Run n_tokens tokens (BOS, then ids drawn from seed) through the GGUF model at path with a batched replica of the
 * llama forward pass (the engine's own kernels, RMSNorm, RoPE and attention; weights bound by flm_model_from_gguf)
 * and count, per layer and neuron, the tokens on which the neuron fired. When check_engine, the same tokens are also
 * run through flm_open/flm_eval and the replica's logits are compared with the engine's (max_logit_diff), which shows
 * the counts are what the engine computes. Works on any llama GGUF, not only synthetic ones.
 * Errors: those of flm_gguf_open, flm_model_from_gguf and flm_open; FLM_ERR_ARG (n_tokens outside 1..4096);
 * FLM_ERR_NOMEM. On error *out is zeroed. Free with flm_synth_activity_free. */
flm_status flm_synth_measure(const char *path, uint32_t n_tokens, uint64_t seed, int n_threads, bool check_engine,
                             flm_synth_activity *out, flm_error *err);
void flm_synth_activity_free(flm_synth_activity *a);

#endif
