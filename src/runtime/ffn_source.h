/* ffn_source.h — where a layer's FFN weights come from: one interface, one implementation per mode. Internal.
 *
 *   source   file            weights                                              plan (bytes held for the FFN)
 *   mapped   ffn_ram.c       a GGUF's matrices, mapped in memory: dense matvecs    the whole file (checked at open)
 *   ram      ffn_ram.c       every FFN region read once at open                    all regions
 *   naive    ffn_stream.c    each layer's region read into one buffer per token    one layer buffer
 *   hybrid   ffn_stream.c    the first k layers resident, the rest as naive        k regions + one layer buffer
 *   sparse   sparse.c        predicted neurons, from a neuron cache or the file    predictors + neuron caches
 *   hot      ffn_hot.c       each layer's hottest records resident, the rest       the prefixes + two range buffers
 *                            read as one range (a draft pass: the prefixes only)
 *
 * The mode is chosen once, by the plan (runtime/plan.c, flm_plan; auto's rule in runtime/budget.c, flm_budget_plan),
 * which flm_open carries out; flm_ffn_source_of() gives its source; the
 * forward pass calls compute() for every layer of every token and knows nothing of modes. Adding a mode (or a device
 * backend) means one more flm_ffn_source_ops. */
#ifndef FLM_RUNTIME_FFN_SOURCE_H
#define FLM_RUNTIME_FFN_SOURCE_H
#include <stdint.h>
#include "flashlm.h"
#include "format/flm.h"
#include "model/model.h"

struct flm_mem_plan;

typedef struct flm_ffn_source_ops {
    const char *name; /* the mode's name (flm_mode_name) */
    /* plan: the FFN part of p for .flm file f, given that p already holds the fixed parts (resident weights, KV
     * cache, scratch, reader) and p->budget (0: none). Fills p's FFN fields (ffn_resident, stream,
     * n_resident_layers, predictors, cache). Errors: FLM_ERR_BUDGET (does not fit: every part named), FLM_ERR_ARG.
     * NULL for the mapped source (a GGUF holds every weight in memory; flm_open checks its budget). */
    flm_status (*plan)(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, struct flm_mem_plan *p,
                       flm_error *err);
    /* open: allocate what the plan holds and read what stays resident; ctx->flash (for .flm) exists, with the plan,
     * the bundle descriptors and the reader. State goes into ctx->ffn_state. Errors: FLM_ERR_NOMEM, FLM_ERR_IO,
     * FLM_ERR_CHECKSUM, FLM_ERR_BUDGET (sparse: a layer's cache cannot hold a token's neurons). */
    flm_status (*open)(flm_ctx *ctx, flm_error *err);
    /* compute: out[d_model] = FFN of layer l on in[d_model] (in is the FFN-normed residual); reads what is not in
     * memory and adds its I/O time, memory-management time and bytes to tok. Errors: FLM_ERR_IO (the read; nothing is
     * left half-cached), FLM_ERR_CHECKSUM. */
    flm_status (*compute)(flm_ctx *ctx, uint32_t l, const float *in, float *out, flm_token_stats *tok,
                          flm_error *err);
    /* close: free ctx->ffn_state (may be NULL: open failed part way). */
    void (*close)(flm_ctx *ctx);
    /* compute_batch: the same for n tokens at positions ctx->cur_pos .. ctx->cur_pos + n - 1 (a batched forward
     * pass): token t's input at in + t * in_stride, its output at out + t * out_stride (d_model floats). The
     * layer's weights are read once for all n tokens. NULL: the forward pass calls compute token by token.
     * Errors: as compute (the batch is evaluated again from its start). */
    flm_status (*compute_batch)(flm_ctx *ctx, uint32_t l, uint32_t n, const float *in, size_t in_stride, float *out,
                                size_t out_stride, flm_token_stats *tok, flm_error *err);
} flm_ffn_source_ops;

extern const flm_ffn_source_ops flm_ffn_mapped; /* ffn_ram.c */
extern const flm_ffn_source_ops flm_ffn_ram;    /* ffn_ram.c */
extern const flm_ffn_source_ops flm_ffn_naive;  /* ffn_stream.c */
extern const flm_ffn_source_ops flm_ffn_hybrid; /* ffn_stream.c */
extern const flm_ffn_source_ops flm_ffn_sparse; /* sparse.c */
extern const flm_ffn_source_ops flm_ffn_hot;    /* ffn_hot.c */

/* The source of a .flm mode (RAM, NAIVE, HYBRID, SPARSE); NULL for AUTO or an unknown mode. */
const flm_ffn_source_ops *flm_ffn_source_of(flm_mode mode);

#endif
