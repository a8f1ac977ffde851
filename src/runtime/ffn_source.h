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
 * forward pass calls compute() for every layer of every token and knows nothing of modes. Adding a mode means one more
 * flm_ffn_source_ops; a device is a backend (runtime/backend.h), whose bundle operations the sources call. */
#ifndef FLM_RUNTIME_FFN_SOURCE_H
#define FLM_RUNTIME_FFN_SOURCE_H
#include <stdint.h>
#include "flashlm.h"
#include "format/flm.h"
#include "model/model.h"
#include "compute/kernels.h"
#include "core/error.h"
#include "io/reader.h"

struct flm_mem_plan;
struct flm_flash;
struct flm_scratch;
struct flm_ffn_hooks;
struct flm_backend;

/* What a source works with: the model, the kernels, the flash side and the FFN scratch, never the context (the
 * context owns one, filled at open: flm_flash_open). Per-call inputs come in flm_ffn_call. */
typedef struct flm_ffn_env {
    const struct flm_backend *be; /* the device the FFN runs on: the bundle FFN and the dense block go through its
                                     operations (runtime/backend.h) */
    const flm_kernels *k;       /* host kernels: the sparse predictors, records read on the host */
    const flm_model *model;     /* hyper-parameters, FFN biases (b_up), the mapped GGUF's matrices */
    const flm_params *params;   /* n_threads, the sparse ablations, no_read_ahead */
    struct flm_flash *flash;    /* the .flm side (file, reader, plan, bundle descriptors); NULL for a GGUF */
    struct flm_scratch *s;      /* FFN scratch: hb, hb2 [d_ffn] (one token), bh, bh2 [n_batch][d_ffn] (a batch) */
    flm_io_stats *io;           /* the context's reader counters: every read is added */
    const flm_logger *log;
    void *state;                /* the source's own (stream buffers, sparse caches...), set by open, freed by close */
} flm_ffn_env;

/* One FFN call: layer `layer` for n >= 1 tokens at positions pos .. pos + n - 1 (tree nodes: their KV slots); token
 * t's input (the FFN-normed residual, d_model floats) at in + t * in_stride, its output at out + t * out_stride. */
typedef struct flm_ffn_call {
    uint32_t layer, n;
    int32_t pos;
    const float *in;
    size_t in_stride;
    float *out;
    size_t out_stride;
    bool draft;                          /* hot: a self-draft pass, over the resident neurons only, nothing read */
    const struct flm_ffn_hooks *hooks;   /* NULL, or the select hook (ram only; runtime/hooks.h) */
    flm_token_stats *tok;                /* gets the I/O and memory-management times and bytes */
} flm_ffn_call;

typedef struct flm_ffn_source_ops {
    const char *name; /* the mode's name (flm_mode_name) */
    /* plan: the FFN part of p for .flm file f, given that p already holds the fixed parts (resident weights, KV
     * cache, scratch, reader) and p->budget (0: none). Fills p's FFN fields (ffn_resident, stream,
     * n_resident_layers, predictors, cache). Errors: FLM_ERR_BUDGET (does not fit: every part named), FLM_ERR_ARG.
     * NULL for the mapped source (a GGUF holds every weight in memory; flm_open checks its budget). */
    flm_status (*plan)(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, struct flm_mem_plan *p,
                       flm_error *err);
    /* open: allocate what the plan holds and read what stays resident; E->flash (for .flm) exists, with the plan,
     * the bundle descriptors and the reader. State goes into E->state. Errors: FLM_ERR_NOMEM, FLM_ERR_IO,
     * FLM_ERR_CHECKSUM, FLM_ERR_BUDGET (sparse: a layer's cache cannot hold a token's neurons). */
    flm_status (*open)(flm_ffn_env *E, flm_error *err);
    /* compute: one token (c->n == 1): out[d_model] = FFN of layer c->layer on in[d_model]; reads what is not in
     * memory and adds its I/O time, memory-management time and bytes to c->tok. Errors: FLM_ERR_IO (the read;
     * nothing is left half-cached), FLM_ERR_CHECKSUM. */
    flm_status (*compute)(flm_ffn_env *E, const flm_ffn_call *c, flm_error *err);
    /* close: free E->state (may be NULL: open failed part way). */
    void (*close)(flm_ffn_env *E);
    /* compute_batch: the same for c->n > 1 tokens (a batched forward pass); the layer's weights are read once for
     * all of them. NULL: the forward pass calls compute token by token. Errors: as compute (the batch is evaluated
     * again from its start). */
    flm_status (*compute_batch)(flm_ffn_env *E, const flm_ffn_call *c, flm_error *err);
} flm_ffn_source_ops;

extern const flm_ffn_source_ops flm_ffn_mapped; /* ffn_ram.c */
extern const flm_ffn_source_ops flm_ffn_ram;    /* ffn_ram.c */
extern const flm_ffn_source_ops flm_ffn_naive;  /* ffn_stream.c */
extern const flm_ffn_source_ops flm_ffn_hybrid; /* ffn_stream.c */
extern const flm_ffn_source_ops flm_ffn_sparse; /* sparse.c */
extern const flm_ffn_source_ops flm_ffn_hot;    /* ffn_hot.c */

/* The source of a .flm mode (RAM, NAIVE, HYBRID, SPARSE, HOT); NULL for AUTO or an unknown mode. */
const flm_ffn_source_ops *flm_ffn_source_of(flm_mode mode);

#endif
