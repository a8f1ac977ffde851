/* runtime.h — the context behind the public flm_ctx, and the token loop's pieces. Internal. */
#ifndef FLM_RUNTIME_RUNTIME_H
#define FLM_RUNTIME_RUNTIME_H
#include <pthread.h>

#include "flashlm.h"
#include "compute/attention.h"
#include "compute/kernels.h"
#include "compute/ffn_bundle.h"
#include "core/arena.h"
#include "format/flm.h"
#include "io/reader.h"
#include "model/model.h"
#include "runtime/backend.h"
#include "runtime/ffn_source.h"
#include "core/util.h"

/* Scratch activations of one token (llama2.c's RunState, without the KV cache). */
typedef struct flm_scratch {
    float *x;      /* residual stream [d_model] */
    float *xb;     /* normed input / attention output [max(d_model, q_dim)] */
    float *xb2;    /* [d_model] */
    float *hb;     /* FFN hidden [d_ffn] */
    float *hb2;    /* FFN hidden (up) [d_ffn] */
    float *q;      /* [q_dim] */
    float *k, *v;  /* [kv_dim] this token's key and value, before they are stored in the KV cache */
    float *att;    /* [n_heads * n_ctx] */
    float *logits; /* [n_vocab] */
    /* a batch of up to n_batch tokens (flm_forward), token t's row at t * the row length; NULL when
     * n_batch <= 1 (every token then runs alone) */
    uint32_t n_batch;
    float *bx, *bxb, *bxb2; /* [n_batch][d_model], [n_batch][max(d_model, q_dim)], [n_batch][d_model] */
    float *bq, *bk, *bv;    /* [n_batch][q_dim], [n_batch][kv_dim] x 2 */
    float *bh, *bh2;        /* [n_batch][d_ffn] x 2 */
    /* what the token path would otherwise allocate per call, carved once (flm_scratch_bytes counts it) */
    uint8_t *tree;          /* flm_eval_tree: depth int32 [T], ancestors [T][T], a row's mask [n_ctx]; T =
                               flm_scratch_tree_nodes */
    float *out_rows;        /* flm_output_rows: [FLM_OUTPUT_ROWS_MAX(n_batch)][d_model + d_embd] */
    double *embd_sum;       /* flm_embed: the final states' sum [d_model] */
    float *embd_row;        /* flm_embed: one final state after the output norm [d_model] */
    flm_arena work;         /* the compute calls' temporary buffers (compute/work.h: quantized activations of a
                               batch, attention tiles), flm_scratch_work_bytes of them; the backend's `work` */
} flm_scratch;

/* Rows one flm_output_rows call takes (flm_tree_logits_n's classifier pass): FLM_TREE_LOGITS_MAX, at most n_batch. */
#define FLM_TREE_LOGITS_MAX 64
/* How long the leader of a joined pass (flm_eval_seq) waits for the sequences expected back, in microseconds: at
 * least FLM_JOIN_WAIT_US, and up to 1/FLM_JOIN_WAIT_DIV of the last pass's wall time, at most FLM_JOIN_WAIT_MAX_US. A
 * sequence of the last pass samples its next token and asks again within far less (its sampling, a callback), unless
 * its thread waits for a core (a loaded machine: tens of ms); one that misses the pass loses a whole pass (a streamed
 * pass of --mem 50%: ~0.4 s) and, leading the next one alone, can put the sequences out of step, so the wait scales
 * with the pass. One that does not come back (its client reads slowly, it decodes alone) costs the others at most
 * this once, then is not waited for. */
#define FLM_JOIN_WAIT_US 5000
#define FLM_JOIN_WAIT_DIV 8
#define FLM_JOIN_WAIT_MAX_US 100000
/* How long a joined full pass (not a draft) that holds a new generation's first request (its sequence was not
 * expected back) waits for other sequences' requests, in microseconds: clients that start together send within
 * about a millisecond of each other, and one that misses the pass reads a streamed model again in a pass of its own.
 * Paid once per request, not per token. */
#define FLM_JOIN_FRESH_US 3000
/* A sequence counts as busy for flm_seq_busy while its last evaluation began less than this many ms ago and it has
 * not left since (flm_seq_leave): a speculative step alone, a joined pass of a streamed model and the wait for it
 * take well under it. */
#define FLM_SEQ_BUSY_MS 2000.0
#define FLM_OUTPUT_ROWS_MAX(n_batch) ((n_batch) < 1 ? 1u : (n_batch) < FLM_TREE_LOGITS_MAX ? (n_batch) : FLM_TREE_LOGITS_MAX)

/* Where the token embedding (token_embd.weight) lives, as the plan decided. */
typedef enum flm_embd_place {
    FLM_EMBD_MEMORY = 0, /* in memory, part of `resident`: the mode keeps it (ram; hybrid when everything fits) */
    FLM_EMBD_FLASH,      /* in the file: one row read per token (naive, hybrid, sparse; the file has a split head) */
    FLM_EMBD_TIED,       /* in memory: it is also the classifier (output tied to token_embd) */
    FLM_EMBD_UNSPLIT,    /* in memory: the file was converted before the embedding was placed last (convert again) */
} flm_embd_place;

/* The memory plan: what the budget has to hold (bytes), decided once at open (runtime/budget.c). */
typedef struct flm_mem_plan {
    flm_mode mode;                /* the mode chosen (never AUTO) */
    uint64_t budget;              /* 0 = none */
    uint64_t model_bytes;         /* resident region + all FFN regions */
    uint64_t resident;            /* resident weights (and metadata) held in memory: the resident region, less the
                                     token embedding when that stays in the file */
    flm_embd_place embd;          /* where the token embedding lives */
    uint64_t embd_bytes;          /* its bytes in the file (the resident region's tail; 0 when the file is not split) */
    uint64_t embd_row;            /* FLM_EMBD_FLASH: bytes of one row (the buffer a row is read into, in scratch) */
    uint64_t kv, scratch, reader; /* KV cache; activations + tokenizer; reader bounce buffers and queues, and the
                                     record sums and read checks of checked reads (reader_checks) */
    uint64_t reader_checks;       /* the part of reader that checked reads hold: the record sums, the per-read checks */
    uint32_t n_ctx;               /* KV cache length, tokens */
    uint32_t n_batch;             /* tokens per batched forward pass (their activations are in scratch) */
    uint32_t kv_elem_bytes;       /* FLM_KV_F16 or FLM_KV_F32 */
    uint64_t stream;              /* the buffers streamed layers are read into (0 when nothing streams) */
    uint32_t n_stream_buffers;    /* naive/hybrid: 2 when the budget holds a second layer buffer, which the next
                                     streamed layer is read into while the current one is computed (read-ahead);
                                     else 1 */
    uint64_t ffn_resident;        /* FFN bytes of the layers kept in memory */
    uint64_t predictors;          /* sparse: the predictor region held in memory */
    uint64_t cache;               /* sparse: what is left for the neuron caches (all layers) */
    uint32_t n_resident_layers;   /* layers whose FFN stays in memory: the first n */
    uint32_t hot_q16;             /* hot: every layer keeps flm_hot_count(n, hot_q16) records in memory: a prefix of
                                     them and a window of the rest (flm_hot_split) */
    uint32_t window_q16;          /* hot: the share of those records given to the self-draft's window of recently
                                     active streamed neurons (asked: flm_params.draft_window; 0 when nothing streams
                                     or the FFN has biases) */
    uint64_t window;              /* hot: bytes of the windows (records, indices, scores), inside ffn_resident */
    size_t reader_bounce;         /* bounce_bytes to give the reader */
    uint64_t spec;                /* auto's speculative decoding buffers, held inside the budget beside the parts
                                     above (budget counts them: the parts are planned under budget - spec); 0 unless
                                     self_draft */
    bool self_draft;              /* auto runs hot with neurons streamed: the session decodes with the self-draft */
    int draft_tree, draft_depth;  /* its tree's nodes and levels */
    /* the classifier on flash: when the plan does not fit with it in memory (a streaming mode), its rows from
     * out_rows_res on are read per pass, out_chunk bytes at a time, into a buffer counted in scratch; the first
     * out_rows_res rows (the self-draft's vocabulary, when that fits) stay in memory */
    bool out_flash;
    uint32_t out_rows_res;        /* out_flash: classifier rows held in memory (the first ones) */
    uint64_t out_row;             /* bytes of one classifier row */
    uint64_t out_bytes;           /* the classifier's bytes (all rows); out_flash: less out_rows_res rows on flash */
    uint32_t out_chunk_rows;      /* out_flash: rows read per request (a chunk buffer: out_chunk_rows * out_row) */
    uint32_t out_n_buf;           /* out_flash: chunk buffers (in scratch): 2, the next chunk read while one is
                                     multiplied (flm_flash_output), or 1 (no_read_ahead) */
    uint32_t out_unit_rows;       /* out_flash, untied: rows per checked unit (the sums computed at load) */
    char reason[FLM_PLAN_REASON_MAX]; /* why this mode (flm_plan_info.reason) */
} flm_mem_plan;

/* Children a draft tree's node offers (session/spec.c): its draft's most likely tokens (greedy) or draws; the tree's
 * buffers (flm_spec_buffer_bytes, runtime/plan.c) hold them. */
#define FLM_SPEC_TREE_K 4
/* Nodes a draft tree verified in `tree` nodes drafts at most (session/spec.c: the self-draft grows the tree wider and
 * deeper than the verification takes, which keeps the best `tree` of them by path probability, SpecExec's way); the
 * tree's buffers (flm_spec_buffer_bytes) hold them. */
#define FLM_SPEC_TREE_DRAFT(tree) ((tree) * 3 < FLM_SPEC_DRAFT_MAX ? (tree) * 3 : FLM_SPEC_DRAFT_MAX)

/* Rows of a classifier on flash per checked unit: their sums are made while the resident region loads. */
#define FLM_OUT_UNIT_ROWS 16u

/* What to plan for (runtime/budget.c). */
typedef struct flm_plan_request {
    uint32_t n_ctx;         /* KV cache length, tokens */
    uint32_t n_batch;       /* flm_params.n_batch (0: chosen by the plan, flm_batch_size) */
    int n_threads;          /* compute threads (per-thread FFN accumulators) */
    flm_mode mode;          /* AUTO: chosen by the plan */
    uint64_t budget;        /* bytes (resolved by flm_plan_budget); 0: no budget */
    const flm_params *params; /* the rest of the open parameters (sparse: level, window) */
    struct flm_predictor_region **keep; /* NULL, or where auto's check leaves the parsed predictor region (flm_open) */
    uint32_t kv_elem_bytes; /* FLM_KV_F16 or FLM_KV_F32 */
    flm_embd_place embd;    /* FLM_EMBD_FLASH: the token embedding may stay in the file (its bytes are
                               flm_file_tail_bytes; the plan decides); else why it is in memory */
    uint64_t embd_row;      /* bytes of one embedding row */
    bool no_read_ahead;     /* flm_params.no_read_ahead: one layer buffer */
    double draft_window;    /* mode hot: the self-draft's window share (0: none); flm_plan_flm resolves
                               flm_params.draft_window */
    bool tied;              /* the classifier is the token embedding (no output.weight) */
    uint64_t out_row;       /* bytes of one classifier row (0: the classifier cannot stream) */
    uint32_t out_rows_draft; /* rows of the self-draft's vocabulary (flm_params.draft_vocab resolved) */
    int out_try;            /* internal (flm_budget_plan): 0 classifier in memory, 1 on flash but the draft's rows,
                               2 all of it on flash */
} flm_plan_request;

/* Plan memory for a .flm model under the request's budget: the fixed parts here (the token embedding stays in the
 * file in naive, sparse and hybrid — hybrid keeps it when every layer and it fit — when the request allows), the FFN
 * part by the mode's source (flm_ffn_source_ops.plan). AUTO is decided here and only here: ram when everything
 * fits, else sparse when calibrated and flm_sparse_plan_check accepts it, else hot when every FFN region is stored
 * hottest first (flashlm calibrate), else hybrid; p->reason says why. (Whether hot then decodes with the self-draft
 * is plan.c's, plan_self_draft.)
 * Errors: FLM_ERR_BUDGET, with every part's size in the message. (The entry points are runtime/plan.c's.) */
flm_status flm_budget_plan(const flm_file *f, const flm_hparams *hp, const flm_plan_request *rq, flm_mem_plan *plan,
                           flm_error *err);
/* The budget in bytes params ask for with a model of model_bytes weight bytes: mem_bytes, or mem_percent of
 * model_bytes (at least 1 byte), or 0 (none). The one place --mem N% is resolved (runtime/plan.c). */
uint64_t flm_plan_budget(const flm_params *p, uint64_t model_bytes);
/* Rows of the classifier a self-draft pass computes (flm_params.draft_vocab resolved): all n_vocab when
 * draft_vocab < 0, draft_vocab when > 0, else FLM_DRAFT_VOCAB for a vocabulary larger than twice that; at most
 * n_vocab. */
uint32_t flm_draft_vocab_rows(const flm_params *p, uint32_t n_vocab);
/* The KV cache length params ask for: n_ctx, or min(the model's context_length, 2048), or 512. */
uint32_t flm_plan_n_ctx(const flm_params *p, const flm_hparams *hp);
/* Refuse a budget that cannot hold the resident region's head (header-only f): checked before anything but the GGUF
 * header is loaded; with f->meta parsed, a classifier in the head is not counted outside ram mode (it may stay on
 * flash). Errors: FLM_ERR_BUDGET naming path, the budget and the sizes. */
flm_status flm_plan_check_head(const char *path, const flm_file *f, const flm_params *p, flm_error *err);
/* Parse the GGUF header at the start of header-only f's resident region into f->meta (tensor data not read; the
 * header's bytes in f->resident_data). Errors: FLM_ERR_IO, FLM_ERR_NOMEM, the GGUF parser's. */
flm_status flm_plan_read_meta(flm_file *f, flm_error *err);
/* The whole plan for .flm file f, whose meta (the resident region's GGUF header) is parsed and hp read from it:
 * where the token embedding goes (a whole resident region that must be loaded is checked against the budget), then
 * flm_budget_plan. flm_open and flm_plan both call this. */
flm_status flm_plan_flm(const flm_file *f, const flm_hparams *hp, const flm_params *p, flm_mem_plan *mp,
                        struct flm_predictor_region **keep, flm_error *err);
/* A GGUF file for flm_open or flm_plan in p's mode: refused with FLM_ERR_ARG in a streaming mode (FLM_ERR_IO when
 * it cannot be opened), FLM_ERR_FORMAT naming both magics when it is neither model format. */
flm_status flm_plan_gguf_open(const char *path, const flm_params *p, flm_gguf_file **out, flm_error *err);
/* The plan of a GGUF file of file_bytes (all weights mapped, mode ram). Errors: FLM_ERR_BUDGET (the budget cannot
 * hold the file, the KV cache and scratch). */
flm_status flm_plan_gguf(const char *path, uint64_t file_bytes, const flm_hparams *hp, const flm_params *p,
                         flm_plan_info *out, flm_error *err);
/* FLM_ERR_ARG when p's values are out of range (threads, context, batch, mode, percent). */
flm_status flm_params_check(const flm_params *p, flm_error *err);
/* The public view of a .flm plan. */
void flm_plan_info_of(const flm_mem_plan *mp, const flm_hparams *hp, flm_plan_info *out);
/* sparse (runtime/sparse.c), for auto: whether sparse fits and pays under plan p (p's sparse parts filled): reads
 * and parses f's predictor region; FLM_ERR_BUDGET when its predicted sets at the default level are not smaller than
 * 0.9x what hybrid streams with the same memory, or a layer's neuron cache cannot hold one neuron. No budget: FLM_OK.
 * keep: NULL, or gets the parsed region (malloc'd) when accepted, for sparse_open (so flm_open reads it once). */
struct flm_predictor_region;
flm_status flm_sparse_plan_check(const flm_file *f, const flm_params *pp, const flm_mem_plan *p,
                                 struct flm_predictor_region **keep, flm_error *err);
/* Bytes per KV cache element for these parameters: FLM_KV_F32 with --kv-f32, else FLM_KV_F16. */
uint32_t flm_kv_elem_bytes(const flm_params *p);
/* Sum of everything the plan holds. */
uint64_t flm_mem_plan_total(const flm_mem_plan *p);
/* Threads in the plan (FLM_THREAD_BYTES each past those the allowance covers, core/util.h): the compute team of
 * n_threads (in scratch), and the reader's workers for params p (in reader: the threads back end, when --io threads
 * asks for it or auto finds no io_uring). */
uint64_t flm_compute_threads_bytes(int n_threads);
uint64_t flm_reader_threads_bytes(const flm_params *p);
/* The busy time of ctx's reader since it was opened (flm_reader_busy_ns), ns; 0 without one (ram mode, a GGUF). */
uint64_t flm_ctx_io_busy_ns(const flm_ctx *ctx);
/* b bytes in MiB (for messages). */
double flm_mib(uint64_t b);
/* Bytes of all FFN regions of f and of the largest one, each rounded up to FLM_ALIGN (as they lie in the file). */
void flm_ffn_region_bytes(const flm_file *f, uint64_t *total, uint64_t *largest);

/* Sparse mode state (runtime/sparse.c, the source flm_ffn_sparse); these accept NULL (not sparse) and give 0. */
typedef struct flm_sparse flm_sparse;
uint32_t flm_sparse_window(const flm_sparse *sp);
uint64_t flm_sparse_cache_rows(const flm_sparse *sp);
uint64_t flm_sparse_streamed(const flm_sparse *sp);

/* The flash side of a context opened from a .flm file: what every FFN source of a .flm file shares. */
typedef struct flm_flash {
    flm_file *file;
    flm_reader *reader;       /* NULL when nothing streams after load */
    flm_mem_plan plan;
    flm_bundle_desc *desc;    /* [n_layers] */
    uint8_t **layer_data;     /* [n_layers]: the layer's FFN records in memory (ram, hybrid's first layers), or NULL */
    flm_arena ffn_mem;        /* the FFN storage of ram / naive / hybrid, one block of plan.ffn_resident + plan.stream
                                 bytes: the resident layers and the stream buffer are carved from it, so they cannot
                                 outgrow the plan */
    float *acc;               /* [n_threads * d_model] per-thread accumulators */
    uint64_t embd_offset;     /* FLM_EMBD_FLASH: file offset of the token embedding's row 0 */
    void *embd_row;           /* FLM_EMBD_FLASH: [FLM_EMBD_READ_ROWS * plan.embd_row] bytes, the rows being read */
    struct flm_predictor_region *sparsity; /* the predictor region as the plan parsed it (auto), until sparse_open
                                              takes it */
    flm_sums sums;            /* the record sums the reader checks reads against (empty with --no-verify-reads) */
    bool fused_checks;        /* checked reads, and the FFN records a layer streams are checked by the FFN kernels
                                 right before their first use (flm_flash_ffn) instead of by the reader */
    uint64_t out_offset;      /* plan.out_flash: file offset of the classifier's row 0 */
    void *out_buf[2];         /* plan.out_flash: plan.out_n_buf buffers of [out_chunk_rows * out_row] bytes, the
                                 rows being read and multiplied */
    struct flm_async_read *out_ahead; /* plan.out_flash, two buffers: reads the next chunk (NULL: read now) */
    flm_extent out_ext[2];    /* the chunk out_ahead reads into out_buf[b] */
    uint64_t *out_sums;       /* plan.out_flash, classifier in the head: the sums of its units on flash (made at load) */
} flm_flash;

/* Carry out plan (flm_plan_flm's, for this file and ctx->params): open the reader and the plan's FFN source
 * (ctx->ffn); takes ownership of file and sparsity (NULL, or the predictor region the plan parsed). Decides nothing. Errors: the reader's (its real size past the budget:
 * FLM_ERR_BUDGET) and the source's open. */
flm_status flm_flash_open(flm_ctx *ctx, flm_file *file, const flm_mem_plan *plan, struct flm_predictor_region *sparsity,
                          uint64_t *out_sums, flm_error *err);
/* The classifier when the plan leaves it on flash (plan.out_flash): logits rows [0, rows) of the n = P->n tokens whose
 * inputs are in (d_embd floats, rows in_stride apart) into logits (rows of n_vocab floats): the rows in memory, then
 * the rest read out_chunk_rows at a time (checked reads) and multiplied as they arrive, the next chunk read ahead
 * (into the other of plan.out_n_buf buffers) while one is multiplied; each logit is the same sum as with the whole
 * classifier in memory; io_ms counts only the time spent waiting for a chunk. I/O counts in ctx->io and tok (may be NULL). Errors: the reader's. */
struct flm_pass;
flm_status flm_flash_output(flm_ctx *ctx, const struct flm_pass *P, const float *in, size_t in_stride, float *logits,
                            uint32_t rows, flm_token_stats *tok, flm_error *err);
void flm_flash_close(flm_flash *fl);
/* Allocate fl->ffn_mem (plan.ffn_resident + plan.stream bytes) when not yet done, then read the FFN regions of layers
 * [0, n) into fl->layer_data carved from it (4 KiB-aligned, checksummed), through the reader; not counted in the
 * statistics (load time). Errors: FLM_ERR_NOMEM, FLM_ERR_BUDGET (the regions exceed the plan: a planning bug),
 * FLM_ERR_IO, FLM_ERR_CHECKSUM naming the layer. */
flm_status flm_flash_load_layers(flm_ffn_env *E, uint32_t n, flm_error *err);
/* A failed read of layer l's FFN region: err (the reader's "<path>: what happened") becomes "<path>: FFN region of
 * layer l: what happened", so every error names the file and the region. Returns st. */
flm_status flm_flash_region_error(const flm_flash *fl, uint32_t l, flm_status st, flm_error *err);
/* Rows of the token embedding a pass reads at once (flm_flash_embedding): the buffer they are read into is this many
 * rows (plan.embd_row bytes each), in the plan's scratch. */
#define FLM_EMBD_READ_ROWS 16
/* Rows tokens[0..n) (1 <= n <= FLM_EMBD_READ_ROWS) of the token embedding, read from the file (the plan left it
 * there: FLM_EMBD_FLASH) in one reader call into a host buffer of the flash side, *rows (row t at t * plan.embd_row
 * bytes; token_embd's type, valid until the next call; the backend's embed_rows dequantizes them). The rows'
 * aligned 4 KiB spans are read through the reader, checked against their record sums; the time, bytes and requests
 * go to tok. Errors: FLM_ERR_ARG (n outside 1..FLM_EMBD_READ_ROWS), FLM_ERR_IO or FLM_ERR_CHECKSUM naming the file
 * (nothing else is touched: the tokens can be evaluated again). */
flm_status flm_flash_embedding(flm_ffn_env *E, const int32_t *tokens, uint32_t n, const void **rows,
                               flm_token_stats *tok, flm_error *err);
/* The FFN of call c's layer l over n_rec bundles: bundle j < n_head at head + j * record_bytes, the rest at tail
 * (flm_ffn_bundles_split; n_head SIZE_MAX: all at head), one token (c->n 1: h into the scratch's hb) or a batch
 * (h_abs as flm_ffn_bundles_batch_split's). src: NULL when every record is in memory and was checked as it loaded,
 * else the read that just brought the records j >= n_head (all of them when n_head is SIZE_MAX) into memory. With
 * fl->fused_checks, src is a read the reader did not check (flm_flash_stream_read) and the kernels hash each of
 * those records right before its first use; when one does not match, the read is checked again through the reader
 * (flm_reader_check: the record read again once) and the FFN computed once more; a second mismatch is
 * FLM_ERR_CHECKSUM naming the layer and record, and c->out must not be used. The hashing's bytes and time go to the
 * context's I/O statistics (bytes_checked, check_ms), a record read again to c->tok too. */
flm_status flm_flash_ffn(flm_ffn_env *E, const flm_ffn_call *c, const uint8_t *head, size_t n_head,
                         const uint8_t *tail, size_t n_rec, const flm_extent *src, float *h_abs, flm_error *err);
struct flm_async_read;
/* A streamed FFN read (naive, hybrid, hot): ext read now, or submitted to the read-ahead thread a, with the
 * reader's checks (flm_reader_read) or, when fl->fused_checks, without them (flm_flash_ffn checks the records). */
flm_status flm_flash_stream_read(const flm_flash *fl, const flm_extent *ext, flm_io_stats *io, flm_error *err);
void flm_flash_stream_submit(const flm_flash *fl, struct flm_async_read *a, const flm_extent *ext, uint64_t tag);
/* The FFN of layer l from records in memory (n_records bundles). */
void flm_flash_bundles(flm_ffn_env *E, uint32_t l, const uint8_t *records, const float *in, float *out);
/* The same for a batch of n <= plan.n_batch tokens (rows in_stride / out_stride floats apart): each record is read
 * once for all of them. */
void flm_flash_bundles_batch(flm_ffn_env *E, uint32_t l, const uint8_t *records, uint32_t n, const float *in,
                             size_t in_stride, float *out, size_t out_stride);

/* A sequence's own state (flm_params.n_seq): what flm_seq_acquire swaps in and out of the context's fields of the
 * same names (be.kv, next_pos, the tree, s.logits). The cache and the logits row are carved from ctx->mem. */
typedef struct flm_seq_state {
    flm_kv_cache kv;
    float *logits;                /* [n_vocab] */
    int32_t next_pos, tree_pos;
    uint32_t tree_n, tree_hidden_first;
    const float *tree_hidden;
    /* a context of several sequences (carved with the logits rows, never swapped): the sequence's tree in a joined
     * pass, depth [T] int32 then ancestors [T][T] (T = flm_scratch_tree_nodes), and the final states of its nodes
     * kept for flm_seq_tree_logits_n, [T][d_model] (a joined or lone tree without logits: tree_hidden points here) */
    uint8_t *tree_mem;
    float *hidden;
} flm_seq_state;

struct flm_ctx {
    flm_model *model;
    flm_params params;
    flm_logger log;          /* params.log, replaced by flm_set_log_callback; the reader logs through it too */
    const flm_kernels *k;
    flm_backend be;          /* the device: its operations, its memory (mem) and the KV cache in it (be.kv) */
    flm_scratch s;
    int32_t next_pos;        /* the position flm_eval expects next (or 0 to restart) */
    flm_flash *flash;        /* NULL for GGUF (everything in memory) */
    const flm_ffn_source_ops *ffn; /* where the FFN weights come from: chosen once at open */
    flm_ffn_env ffn_env;     /* what the source works with (its state in ffn_env.state, freed by ffn->close) */
    uint64_t mem_resident;   /* for stats: bytes of resident weights */
    flm_plan_info plan;      /* the plan carried out (flm_get_plan) */
    /* statistics */
    flm_token_stats total;
    flm_token_stats *tokens; /* ring [FLM_STATS_TOKENS]: token n's record at n % FLM_STATS_TOKENS (in mem) */
    flm_arena mem;           /* one block of the backend's memory (be.ops->mem_init): the KV cache, the activations (s)
                                and the statistics ring, carved */
    uint64_t n_tokens;       /* evaluated since the last reset */
    flm_io_stats io;         /* reader counters since the last reset */
    uint64_t io_busy_base;   /* the reader's busy ns (flm_reader_busy_ns) at the last reset */
    int32_t tree_pos;        /* flm_eval_tree: the KV slot of node 0 of the tree the cache holds */
    uint32_t tree_n;         /* its nodes held (slots tree_pos ..); 0: none (any other evaluation forgets them) */
    const float *tree_hidden; /* flm_eval_tree without logits: the final states (before the output norm) of nodes
                                 [tree_hidden_first, tree_n), d_model floats each (scratch rows, what the last pass
                                 returned in flm_eval_res.hidden), or NULL */
    uint32_t tree_hidden_first;
    /* sequences (flm_params.n_seq): the current one's state lives in the fields above, the others' in seq[] */
    uint32_t n_seq, cur_seq;
    flm_seq_state *seq;      /* [n_seq] (calloc) */
    pthread_mutex_t seq_mu;  /* flm_seq_acquire / flm_seq_release */
    bool seq_mu_init;
    /* joined passes (flm_eval_seq): the waiting requests, whether a thread is running a pass for them, and the
     * pass's arrays: every sequence's logits row [n_seq][n_vocab] (carved), each row's token, position and KV cache
     * [n_batch] (malloc'd with seq: 16 bytes a row) */
    pthread_mutex_t join_mu;
    pthread_cond_t join_cv;
    bool join_init, join_leading;
    struct flm_join_req *join_head, *join_tail;
    uint64_t n_joined, rows_joined; /* flm_stats' */
    uint64_t join_pass_us;   /* wall time of the last pass run for flm_eval_seq (the leader's wait scales with it) */
    double *seq_busy_ms;     /* [n_seq]: flm_now_ms of the sequence's last evaluation, 0 after flm_seq_leave (under
                                join_mu; flm_seq_busy) */
    double *seq_left_ms;     /* [n_seq]: flm_now_ms of the sequence's flm_seq_leave while join_expect says it left
                                (JOIN_EXPECT_LEFT), under join_mu */
    uint8_t *join_expect;    /* [n_seq]: not 0 while the sequence is expected back (it was in the last joined pass and
                                has neither left, flm_seq_leave, nor taken the context alone, flm_seq_acquire): the
                                next pass waits for it, up to FLM_JOIN_WAIT_US; 2 when that pass was a draft (its
                                speculative step goes on): waited for FLM_JOIN_WAIT_MAX_US; 3 when its generation
                                ended (flm_seq_leave) less than the wait's bound ago: a full pass waits for its next
                                request until then (a client's next request, a few ms later), a draft pass does not */
    float *join_logits;
    int32_t *join_tok, *join_pos, *join_slot; /* join_slot: a tree node's KV slot (its position otherwise) */
    const flm_kv_cache **join_kv;
    const struct flm_tree **join_tree; /* [n_batch]: a row's tree (NULL: causal); the trees are join_trees[n_seq] */
    struct flm_tree *join_trees;
    const float **join_x;    /* [n_batch]: a joined pass's rows that want logits, their final hidden states */
    float **join_dst;        /* [n_batch]: and where their logits go */
};

/* Records of a layer of n that the hot mode keeps in memory at share q16 / 65536 (runtime/ffn_hot.c). */
uint32_t flm_hot_count(uint32_t n, uint32_t q16);
/* A hot layer of n records at resident share q16 with window share wq16 of that: records [0, *hot) stay resident as
 * the prefix, *win more are the self-draft's window (0 when the whole layer is resident). */
void flm_hot_split(uint32_t n, uint32_t q16, uint32_t wq16, uint32_t *hot, uint32_t *win);
/* The self-draft's correction (runtime/ffn_hot.c, with a window): measured on a target pass's last this many rows,
 * decayed by this much per row (about the last 50 rows weigh; measured on Qwen2.5-Coder-1.5B at --mem 50%: 0.95 and
 * 0.99 gave the same tokens per pass, 0 (the last row only) was no better than none). */
#define FLM_HOT_CORRECTION_ROWS 16
#define FLM_HOT_CORRECTION_DECAY 0.98f
/* The sparse source's state when ctx runs sparse, else NULL. */
const flm_sparse *flm_ctx_sparse(const flm_ctx *ctx);

/* Alignment of the buffers carved from ctx->mem, and how many there are (KV cache, 10 activation arrays, 8 batch
 * arrays, the tree, output rows, flm_embed's sum and row, the work area, the statistics ring): the arena holds their
 * bytes plus FLM_CTX_CARVES * FLM_CARVE_ALIGN of padding. */
#define FLM_CARVE_ALIGN 64u
#define FLM_CTX_CARVES 25u

/* Bytes of scratch for these hyper-parameters, context length, batch size (tokens; <= 1: no batch arrays) and
 * compute threads: the activations, the tree and output-row buffers, the work area (flm_scratch_work_bytes) and the
 * statistics ring (runtime/plan.c, with flm_batch_size: the plan's sizes). */
uint64_t flm_scratch_bytes(const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, int n_threads);
/* Nodes the tree buffer holds: FLM_TREE_MAX_NODES, at most n_ctx. */
uint32_t flm_scratch_tree_nodes(uint32_t n_ctx);
/* The work area: the largest of what one compute call of the token path takes at once (flm_matmat's quantized
 * batch, flm_attention_batch's tiles, the bundle FFN's quantized batch: compute/work.h), for batches of up to
 * n_batch tokens over n_threads threads. */
uint64_t flm_scratch_work_bytes(const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, int n_threads);
/* Sequences these parameters ask for (flm_params.n_seq: 0 -> 1). */
uint32_t flm_n_seq_of(const flm_params *p);
/* Bytes the sequences past the first add to the scratch: a logits row each (n_vocab floats, carve-aligned), for
 * a joined pass (flm_eval_seq) a logits row per sequence, and per sequence its tree (flm_seq_state.tree_mem, hidden:
 * 4 T + T^2 bytes, T = flm_scratch_tree_nodes(n_ctx), and 4 d_model bytes a row of flm_seq_hidden_rows), each
 * carve-aligned with its padding. */
uint64_t flm_seq_scratch_bytes(const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, uint32_t n_seq);
/* Final states a sequence keeps of a tree evaluated without all its logits (flm_seq_state.hidden): such a tree's
 * evaluated nodes fit one batch, so min(flm_scratch_tree_nodes(n_ctx), max(n_batch, 1)) rows. */
uint32_t flm_seq_hidden_rows(uint32_t n_ctx, uint32_t n_batch);
/* The plan's scratch part (flm_plan_info.scratch), the one formula: what the context's block holds beside the KV
 * caches (flm_scratch_bytes: the activations and the statistics ring; flm_seq_scratch_bytes for n_seq sequences; the
 * carves' alignment, FLM_CARVE_ALIGN for each of FLM_CTX_CARVES + n_seq), the compute threads past the allowance's
 * (flm_compute_threads_bytes), and for a .flm file (flash) the per-thread FFN accumulators of a batch
 * (4 n_threads n_batch d_model) and the tokenizer's copies (~96 bytes a token: pieces twice, hash, entries). The
 * embedding row buffer is the budget plan's own. */
uint64_t flm_plan_scratch(const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, int n_threads, uint32_t n_seq,
                          bool flash);
/* Bytes of the context's one block of the backend's memory (flm_backend_ops.mem_init; flm_open carves it): n_seq KV
 * caches of n_ctx tokens (kv_elem bytes an element) and, of the plan's scratch, flm_scratch_bytes,
 * flm_seq_scratch_bytes and the carves' alignment. Inside the plan's kv + scratch. */
uint64_t flm_ctx_block_bytes(const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, int n_threads, uint32_t n_seq,
                             uint32_t kv_elem);
/* Fill o's budget per device (flm_plan_info.device) for a context whose backend computes on `device` ("host", or
 * NULL for the host: the CPU backend; another name: a device of its own): the block (flm_ctx_block_bytes of o's
 * n_ctx, n_batch, kv_elem_bytes and p's threads and sequences) on that device, the rest of o->total on the host.
 * o's other fields are set (flm_plan_info_of, flm_plan_gguf) and its total final. */
void flm_plan_devices(flm_plan_info *o, const flm_hparams *hp, const flm_params *p, const char *device);
/* Carve the activations from a (FLM_CARVE_ALIGN-aligned arrays, zero). Errors: FLM_ERR_BUDGET (a is too small). */
flm_status flm_scratch_init(flm_scratch *s, const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, int n_threads,
                            flm_arena *a, flm_error *err);
/* The batch size (tokens) for these parameters: params->n_batch when set, else 256, or under a budget (bytes; 0:
 * none) fewer, so that the batch's activations and FFN accumulators take at most 1/64 of it; clamped to
 * [1, n_ctx]. */
uint32_t flm_batch_size(const flm_params *p, const flm_hparams *hp, uint32_t n_ctx, uint64_t budget);
void flm_scratch_free(flm_scratch *s);

struct flm_tree;

/* logits[n_vocab] = the output layers of x (a token's final state, d_model floats; not changed): the output norm,
 * proj_out, the classifier, as the forward pass's last step computes them for one token. Errors: FLM_ERR_NOMEM,
 * FLM_ERR_CHECKSUM / FLM_ERR_FORMAT (not finite). */
flm_status flm_output_row(flm_ctx *ctx, const float *x, float *logits, flm_error *err);
/* flm_output_row of n tokens at once: x[i] is token i's d_model floats (not changed), logits n rows of n_vocab; the
 * classifier as one matrix-matrix product (each weight row read once for the n tokens), every row's bits those of
 * flm_output_row (the tile kernels' dots are vec_dot's); the rows are copied into scratch carved at open. Errors:
 * FLM_ERR_ARG (n above FLM_OUTPUT_ROWS_MAX(n_batch)), those of flm_output_row. */
flm_status flm_output_rows(flm_ctx *ctx, const float *const *x, uint32_t n, float *logits, flm_error *err);
/* flm_output_rows, over the self-draft's vocabulary when draft (flm_draft_vocab_rows; the logits of the ids past it
 * -inf), as a draft pass computes them; the classifier's reads from flash (plan.out_flash) are added to tok (io_ms,
 * bytes_read, n_reads; NULL: not counted). Same errors. */
flm_status flm_output_rows_ex(flm_ctx *ctx, const float *const *x, uint32_t n, bool draft, float *logits,
                              flm_token_stats *tok, flm_error *err);
/* flm_output_rows_ex with each token's logits into its own row: dst[i] (n_vocab floats) gets x[i]'s. The classifier
 * runs in blocks of its rows sized so that n rows of a block fit scratch (cap floats, at least n_vocab), every token
 * at once, so each weight is read once whatever n (joined passes: every sequence's rows that want logits, a
 * speculative step's all of them); when the blocks would be small, or the classifier is read from flash, rows at a
 * time as the scratch holds (the reads from flash counted in tok, as flm_output_rows_ex's). The same dots as
 * flm_output_rows. Errors: FLM_ERR_ARG (n above FLM_OUTPUT_ROWS_MAX(n_batch), cap below n_vocab), those of
 * flm_output_rows. Source: src/runtime/forward.c. */
flm_status flm_output_scatter(flm_ctx *ctx, const float *const *x, uint32_t n, bool draft, float *const *dst,
                              float *scratch, size_t cap, flm_token_stats *tok, flm_error *err);

/* flm_open on backend `be` (flm_open: &flm_backend_cpu; tests/test_backend.c: a stub over it). */
flm_status flm_open_backend(const char *path, const flm_params *p, const flm_backend_ops *be, flm_ctx **out,
                            flm_error *err);

/* Which logits a forward pass computes. */
typedef enum flm_logits_want {
    FLM_LOGITS_LAST = 0, /* the last token's, into ctx->s.logits (flm_eval_res.logits) */
    FLM_LOGITS_NONE,     /* none: a prompt piece before the last (on a 262k vocabulary one output layer is ~7% of a
                            128-token prompt) */
    FLM_LOGITS_ALL,      /* every token's, into logits_all[n][n_vocab]; the last one's into ctx->s.logits too */
    FLM_LOGITS_HIDDEN,   /* none: the tokens' final states (before the output norm) stay in scratch rows
                            (flm_eval_res.hidden) for flm_output_rows: tree verification's lazy logits */
} flm_logits_want;

struct flm_ffn_hooks;

/* Everything a forward pass depends on besides the model, its KV cache and its FFN source: the tokens, where they
 * go, which logits, whether it is a draft, the tree, the calibration hooks. Nothing of it is kept in the context. */
typedef struct flm_eval_req {
    const int32_t *tokens;        /* [n], each < n_vocab (checked by the caller) */
    uint32_t n;                   /* >= 1 */
    int32_t pos;                  /* position of the first (a tree: the KV slot of the first node evaluated) */
    flm_logits_want logits;
    float *logits_all;            /* FLM_LOGITS_ALL: [n][n_vocab]; else NULL */
    bool draft;                   /* the self-draft (mode hot): every FFN over its resident neurons, nothing read, and
                                     the output layer over the draft vocabulary (flm_params.draft_vocab) */
    const struct flm_tree *tree;  /* NULL: a causal batch; else the tokens are tree nodes (runtime/pass.h flm_tree) */
    const struct flm_ffn_hooks *hooks; /* NULL, or calibration's tap and select hook (runtime/hooks.h, tools only) */
    /* rows of several sequences in one pass (flm_eval_seq's joined pass; pos is then 0, tree and hooks NULL, logits
     * FLM_LOGITS_HIDDEN): row t goes to KV cache row_kv[t] at position row_pos[t]. NULL: one sequence, be.kv */
    const flm_kv_cache *const *row_kv;
    const int32_t *row_pos;
    /* with row_kv, tree nodes among the rows (a joined tree, flm_pass.row_slot / row_tree): row t's KV slot and
     * tree; NULL: causal rows at slot row_pos[t] */
    const int32_t *row_slot;
    const struct flm_tree *const *row_tree;
} flm_eval_req;

/* What a forward pass returns. */
typedef struct flm_eval_res {
    flm_token_stats stats;        /* added to by the call: its passes' I/O and memory-management times, bytes, reads
                                     and the sparse mode's counts, and compute_ms (the call's wall time less those
                                     two times): the call's own statistics, nothing diffed from the totals */
    const float *logits;          /* FLM_LOGITS_LAST / ALL: the last token's n_vocab logits (ctx->s.logits) */
    const float *hidden;          /* FLM_LOGITS_HIDDEN: the final states, [n][d_model] scratch rows, valid until the
                                     next pass */
    uint32_t n_tokens, n_passes;  /* flm_eval_run: the tokens recorded and the passes run (flm_forward: untouched) */
} flm_eval_res;

/* The forward pass (runtime/forward.c, assembled from the blocks of runtime/pass.h): rq->n >= 1 tokens at positions
 * pos .. pos + n - 1 through the model, keys and values into the KV cache; the logits rq->logits asks for. n = 1
 * (decoding) runs on the single-token scratch with matrix-vector products; 1 < n <= ctx->s.n_batch in one batched
 * pass (matrix-matrix products, the FFN source's compute_batch); a larger n token by token. res->stats gets the I/O
 * and memory-management times and bytes, and the call's compute time (wall time less those). Errors: FLM_ERR_IO (an embedding row or FFN read), FLM_ERR_CHECKSUM /
 * FLM_ERR_FORMAT (a non-finite output: the message names the file, layer and region), FLM_ERR_ARG (a position past
 * a model's learned positions; FLM_LOGITS_HIDDEN with more tokens than one batch holds).
 * rq->tree (NULL: the causal batch above): the tokens are tree nodes (runtime/pass.h flm_tree), pos the KV slot of
 * the first; each node at its own position, attending to the context and its ancestors (flm_eval_tree). */
flm_status flm_forward(flm_ctx *ctx, const flm_eval_req *rq, flm_eval_res *res, flm_error *err);

/* Evaluate rq->n tokens from rq->pos (<= flm_n_past) as flm_eval_batch does — in pieces of n_batch, the context
 * rewound to pos on an error, every token's statistics recorded — with rq's logits, draft and hooks (rq->tree must
 * be NULL); the public flm_eval, flm_eval_draft and flm_eval_batch are this. res->stats gets the whole call's
 * (compute_ms included), res->logits the last token's logits (FLM_LOGITS_LAST / ALL). Errors: those of flm_eval_batch,
 * FLM_ERR_ARG (a draft without mode hot; a select hook outside ram mode). */
flm_status flm_eval_run(flm_ctx *ctx, const flm_eval_req *rq, flm_eval_res *res, flm_error *err);

#endif
