/* runtime.h — the context behind the public flm_ctx, and the token loop's pieces. Internal. */
#ifndef FLM_RUNTIME_RUNTIME_H
#define FLM_RUNTIME_RUNTIME_H
#include "flashlm.h"
#include "compute/attention.h"
#include "compute/kernels.h"
#include "compute/ffn_bundle.h"
#include "format/flm.h"
#include "io/reader.h"
#include "model/model.h"
#include "core/util.h"

/* Scratch activations of one token (llama2.c's RunState, without the KV cache). */
typedef struct flm_scratch {
    float *x;      /* residual stream [d_model] */
    float *xb;     /* normed input / attention output [max(d_model, q_dim)] */
    float *xb2;    /* [d_model] */
    float *hb;     /* FFN hidden [d_ffn] */
    float *hb2;    /* FFN hidden (up) [d_ffn] */
    float *q;      /* [q_dim] */
    float *att;    /* [n_heads * n_ctx] */
    float *logits; /* [n_vocab] */
} flm_scratch;

/* The memory plan: what the budget has to hold (bytes), decided once at open (runtime/budget.c). */
typedef struct flm_mem_plan {
    flm_mode mode;                /* the mode chosen (never AUTO) */
    uint64_t budget;              /* 0 = none */
    uint64_t model_bytes;         /* resident region + all FFN regions */
    uint64_t resident;            /* resident weights (and metadata) held in memory */
    uint64_t kv, scratch, reader; /* KV cache; activations + tokenizer; reader bounce buffers and queues */
    uint64_t stream;              /* the buffer one streamed layer is read into (0 when nothing streams) */
    uint64_t ffn_resident;        /* FFN bytes of the layers kept in memory */
    uint64_t predictors;          /* sparse: the predictor region held in memory */
    uint64_t cache;               /* sparse: what is left for the neuron caches (all layers) */
    uint32_t n_resident_layers;   /* layers whose FFN stays in memory: the first n */
    size_t reader_bounce;         /* bounce_bytes to give the reader */
} flm_mem_plan;

/* Plan memory for a .flm model under a budget of budget bytes, or, when that is 0, percent % of the model's weight
 * bytes (both 0: no budget). Errors: FLM_ERR_BUDGET, with every part's size in the message. */
flm_status flm_budget_plan(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, int n_threads, flm_mode mode,
                           uint64_t budget, double percent, flm_mem_plan *plan, flm_error *err);
/* Sum of everything the plan holds. */
uint64_t flm_mem_plan_total(const flm_mem_plan *p);

/* Sparse mode state (runtime/sparse.c). */
typedef struct flm_sparse flm_sparse;
flm_status flm_sparse_open(flm_ctx *ctx, flm_error *err);
void flm_sparse_close(flm_sparse *sp);
flm_status flm_sparse_ffn(flm_ctx *ctx, uint32_t l, const float *in, float *out, flm_token_stats *tok, flm_error *err);
uint32_t flm_sparse_window(const flm_sparse *sp);
uint64_t flm_sparse_cache_rows(const flm_sparse *sp);
uint64_t flm_sparse_dropped(const flm_sparse *sp);

/* The flash side of a context opened from a .flm file. */
typedef struct flm_flash {
    flm_file *file;
    flm_reader *reader;       /* NULL when nothing streams after load */
    flm_mem_plan plan;
    flm_bundle_desc *desc;    /* [n_layers] */
    uint8_t **layer_data;     /* [n_layers]: the layer's FFN records in memory, or NULL when streamed */
    uint8_t *stream_buf;      /* one layer's records, aligned for O_DIRECT */
    float *acc;               /* [n_threads * d_model] per-thread accumulators */
    flm_sparse *sparse;       /* sparse mode */
} flm_flash;

flm_status flm_flash_open(flm_ctx *ctx, flm_file *file, flm_error *err); /* takes ownership of file */
void flm_flash_close(flm_flash *fl);
/* The FFN of layer l on in -> out, reading its records when they are not resident; times go into tok. */
flm_status flm_flash_ffn(flm_ctx *ctx, uint32_t l, const float *in, float *out, flm_token_stats *tok,
                         flm_error *err);

struct flm_ctx {
    flm_model *model;
    flm_params params;
    flm_logger log;          /* params.log, replaced by flm_set_log_callback; the reader logs through it too */
    const flm_kernels *k;
    flm_kv_cache kv;
    flm_scratch s;
    int32_t next_pos;        /* the position flm_eval expects next (or 0 to restart) */
    flm_flash *flash;        /* NULL for GGUF (everything in memory) */
    uint64_t mem_resident;   /* for stats: bytes of resident weights */
    /* statistics */
    flm_token_stats total;
    flm_token_stats *tokens; /* ring [FLM_STATS_TOKENS]: token n's record at n % FLM_STATS_TOKENS */
    uint64_t n_tokens;       /* evaluated since the last reset */
    flm_io_stats io;         /* reader counters since the last reset */
    /* calibration: called with each layer's FFN input (d_model floats) before the FFN runs */
    void (*ffn_tap)(void *user, uint32_t layer, const float *x);
    void *tap_user;
};

/* Bytes of scratch for these hyper-parameters and context length. */
uint64_t flm_scratch_bytes(const flm_hparams *hp, uint32_t n_ctx);
flm_status flm_scratch_init(flm_scratch *s, const flm_hparams *hp, uint32_t n_ctx, flm_error *err);
void flm_scratch_free(flm_scratch *s);

/* Dense FFN of one layer on in[d_model] -> out[d_model], weights resident: out = down(act(gate in) * (up in)).
 * hb/hb2 are [d_ffn] scratch. */
void flm_ffn_dense(const flm_kernels *k, const flm_hparams *hp, const flm_weight *up, const flm_weight *gate,
                   const flm_weight *down, const float *in, float *out, float *hb, float *hb2, int n_threads);

/* One token through the model: fills ctx->s.logits; adds its I/O and memory-management times to tok. */
flm_status flm_forward(flm_ctx *ctx, int32_t token, int32_t pos, flm_token_stats *tok, flm_error *err);

#endif
