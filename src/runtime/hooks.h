/* hooks.h — the runtime's interface for the tools tier (calibrate, the quality curve, synth), internal: the FFN tap
 * and select hook that a forward pass takes in its request (flm_eval_req.hooks), the hot mode's draft windows, the
 * resident FFN records, and read-only views of an open context. The tools read nothing of flm_ctx directly
 * (tests/test_layers.c fails on `ctx->` in a tools directory). The runtime implements it; the session and the CLI
 * never use it. */
#ifndef FLM_RUNTIME_HOOKS_H
#define FLM_RUNTIME_HOOKS_H
#include <stdbool.h>
#include <stdint.h>
#include "flashlm.h"
#include "compute/ffn_bundle.h"
#include "compute/kernels.h"
#include "format/flm.h"
#include "model/model.h"
#include "runtime/runtime.h"

/* The FFN tap: called by the forward pass with each layer's FFN input x[d_model] (the normed residual) of each
 * token, before the FFN runs (it only observes). `flashlm calibrate` records these inputs. */
typedef void (*flm_ffn_tap_fn)(void *user, uint32_t layer, const float *x);

/* The FFN select hook (analysis: calibrate's held-out check of its operating points, oracle studies). In ram mode
 * (.flm), layer l's FFN for the token at position pos is restricted to the neurons fn picks: fn gets the FFN input
 * x[d_model] and, with need_h, every neuron's activation h[d_ffn] (h_i = act(gate_i . x) * (up_i . x), computed over
 * all neurons first; NULL otherwise), writes the chosen neuron ids (any order, no repeats) into ids[d_ffn] and
 * returns their count; the FFN output is then computed over those neurons alone. A pass with a select hook runs its
 * tokens one at a time. */
typedef uint32_t (*flm_ffn_select_fn)(void *user, uint32_t layer, int32_t pos, const float *x, const float *h,
                                      uint32_t *ids);
#define FLM_SELECT_ALL UINT32_MAX /* a select hook's answer (with need_h): every neuron; the dense output stands */

/* The hooks of one evaluation (flm_eval_req.hooks): either may be NULL. */
typedef struct flm_ffn_hooks {
    flm_ffn_tap_fn tap;
    void *tap_user;
    flm_ffn_select_fn select; /* ram mode only (flm_eval_run refuses it otherwise: FLM_ERR_ARG) */
    void *select_user;
    bool need_h;              /* select gets every neuron's activation */
    uint32_t *ids;            /* [d_ffn], the caller's: where select writes its ids */
} flm_ffn_hooks;

/* flm_eval_batch(ctx, tokens, n, pos, logits_all, logits) with hooks h (NULL: none): FLM_LOGITS_ALL when logits_all,
 * else the last token's. Errors: those of flm_eval_run. */
flm_status flm_eval_hooked(flm_ctx *ctx, const int32_t *tokens, uint32_t n, int32_t pos, const flm_ffn_hooks *h,
                           float *logits_all, const float **logits, flm_error *err);

/* flm_perplexity with hooks h (NULL: none) on every evaluation (the quality curve's operating points). */
flm_status flm_perplexity_hooked(flm_ctx *ctx, const char *text, int n_chunk, int max_chunks,
                                 void (*progress)(void *user, int chunk, int n_chunks, double ppl), void *user,
                                 const flm_ffn_hooks *h, flm_ppl_result *out, flm_error *err);
/* flm_perplexity_file with hooks h (NULL: none). */
flm_status flm_perplexity_file_hooked(flm_ctx *ctx, const char *path, int n_chunk, int max_chunks,
                                      void (*progress)(void *user, int chunk, int n_chunks, double ppl), void *user,
                                      const flm_ffn_hooks *h, flm_ppl_result *out, flm_error *err);

/* Read-only views of an open context. */
const flm_model *flm_ctx_model(const flm_ctx *ctx);
const flm_kernels *flm_ctx_kernels(const flm_ctx *ctx);
const flm_params *flm_ctx_params(const flm_ctx *ctx); /* as opened: n_ctx and n_batch as the plan resolved them */
const flm_file *flm_ctx_file(const flm_ctx *ctx);     /* the .flm file, or NULL (a GGUF) */

/* Layer l's FFN records when all of them are in memory (ram mode; the first layers in hybrid), else NULL; *desc
 * gets the layer's bundle layout. d_ffn records of desc->record_bytes each. */
const uint8_t *flm_ffn_resident_records(const flm_ctx *ctx, uint32_t l, const flm_bundle_desc **desc);

/* The hot mode's draft window of layer l (runtime/ffn_hot.c): *n records at *records (the layer's record_bytes
 * each), and when idx is not NULL their neuron indices (records of the layer's FFN region) into idx[0..*n). false
 * (and *n 0) when ctx has no window for layer l. */
bool flm_hot_window(const flm_ctx *ctx, uint32_t l, uint32_t *n, uint32_t *idx, const uint8_t **records);

/* The hot mode's draft correction of layer l (runtime/ffn_hot.c): d_model floats, the running mean of what the
 * neurons a draft leaves out add to the layer's output, which a draft pass adds to its own; *n_hot (when not NULL)
 * gets the layer's resident prefix (records [0, *n_hot); the draft computes over them and the window). NULL when ctx
 * has no window for layer l (no correction either). */
const float *flm_hot_correction(const flm_ctx *ctx, uint32_t l, uint32_t *n_hot);

#endif
