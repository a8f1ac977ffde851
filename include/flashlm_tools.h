/*
 * flashlm_tools.h — the public C API of flashlm's tools tier (libflashlm_tools): what prepares and examines a model
 * rather than runs it. The runtime (include/flashlm.h, libflashlm) opens, plans, evaluates, samples and tokenizes;
 * this tier converts a GGUF file into the flash layout (convert) and checks one (verify), calibrates the sparse
 * mode's predictors (the training needs BLAS/LAPACK) and measures its quality curve, writes synthetic benchmark
 * models (synth) and measures the disk (probe). Sources: src/convert, src/calibrate, src/synth, src/probe.
 *
 * Link: libflashlm_tools.a holds both tiers (link it instead of libflashlm.a, not with it), with the libraries of
 * libflashlm plus OpenBLAS and LAPACKE. Conventions are flashlm.h's (flm_status, flm_error, bytes, ms); the library
 * never writes to stdout or stderr: progress goes to the caller's flm_progress_fn.
 */
#ifndef FLASHLM_TOOLS_H
#define FLASHLM_TOOLS_H

#include <stdio.h>

#include "flashlm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Progress of long work: what (a phase, e.g. "converting", "verifying"), done out of total units (bytes). Called
 * from the calling thread. */
typedef void (*flm_progress_fn)(void *user, const char *what, uint64_t done, uint64_t total);

/* ---------------------------------------------------------------------------------------------------------------
 * Output files: the one checked writer of every file flashlm writes (converted models, calibrated models, statistics
 * and benchmark JSON, figures, probe results). Source: src/core/files.c. The rules (docs/SECURITY.md, "Output files"):
 * - a symbolic link given as the path is refused (neither replaced nor written through: name the target itself);
 * - a path that exists and is not a regular file (a device, a FIFO, a directory, a socket) is refused;
 * - the file being read (src: same device and inode) is refused, unless FLM_OUT_SELF (calibrate rewrites its model);
 * - an existing file is replaced only with FLM_OUT_REPLACE (the CLI's --force), checked again at the rename, which
 *   otherwise refuses to replace what appeared meanwhile (renameat2 RENAME_NOREPLACE);
 * - the data go to a unique temporary "<path>.tmp.XXXXXX" in the same folder (O_CREAT|O_EXCL, never through a link),
 *   fsynced and renamed onto path only when complete; the folder is fsynced after the rename;
 * - one writer of a path at a time: "<path>.lock" is held (flock) from open to commit or abort, and removed then; a
 *   second writer of the same path is refused at once (FLM_ERR_IO: "another flashlm is writing this file now").
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct flm_out flm_out;
#define FLM_OUT_REPLACE 1u /* an existing regular file at the path may be replaced */
#define FLM_OUT_SELF 2u    /* the path may be src itself */
/* The checks above without writing anything (to refuse before long work: convert checks before it reads a byte).
 * src: the input being read, or NULL. Errors: FLM_ERR_ARG (the path is refused: the message says why and names it),
 * FLM_ERR_IO (it cannot be examined). */
FLM_API flm_status flm_out_check(const char *path, const char *src, unsigned flags, flm_error *err);
/* Start writing path: the checks, the lock, the temporary (empty). Write through flm_out_stream or flm_out_fd, then
 * flm_out_commit or flm_out_abort exactly once. *out is NULL on error. Errors: those of flm_out_check, FLM_ERR_IO
 * (the lock is held by another writer; the temporary cannot be created: the message names it), FLM_ERR_NOMEM. */
FLM_API flm_status flm_out_open(const char *path, const char *src, unsigned flags, flm_out **out, flm_error *err);
/* A stdio stream on the temporary (created on first call; NULL when out of memory), or its descriptor (read-write).
 * Use one or the other. */
FLM_API FILE *flm_out_stream(flm_out *o);
FLM_API int flm_out_fd(const flm_out *o);
/* The temporary's path, and the output path (strings owned by o). */
FLM_API const char *flm_out_temp(const flm_out *o);
FLM_API const char *flm_out_path(const flm_out *o);
/* Flush, fsync, close and rename the temporary onto the path; frees o in every case and on error removes the
 * temporary (the path is untouched). Errors: FLM_ERR_IO (a write, flush, fsync or rename failed: full disk, I/O
 * error), FLM_ERR_ARG (the path became a link or a non-regular file, or appeared without FLM_OUT_REPLACE). */
FLM_API flm_status flm_out_commit(flm_out *o, flm_error *err);
/* Remove the temporary and the lock, free o. NULL: nothing. */
FLM_API void flm_out_abort(flm_out *o);
/* Remove the temporaries and locks of the writers open now (unlink only: async-signal-safe, for a SIGINT/SIGTERM
 * handler that then ends the process). */
FLM_API void flm_out_remove_temporaries(void);
/* Write a context's statistics (totals, histogram, memory plan, the kept tokens from "first_token" on: flm_get_stats,
 * flm_get_token_stats) as JSON to path, through the checked writer above (a unique temporary renamed onto path; a
 * link, a device or another non-regular file is refused). An existing file at path is replaced only when replace
 * (the CLI's --force), also one that appeared while the run went on (RENAME_NOREPLACE); whether path is the model is
 * the caller's check (flm_out_check). Source: src/write/stats_json.c.
 * Errors: FLM_ERR_IO (the file cannot be written; nothing is left half-written), FLM_ERR_ARG (path refused, or
 * it exists without replace). */
FLM_API flm_status flm_write_stats_json(const flm_ctx *ctx, const char *path, bool replace, flm_error *err);

/* ---------------------------------------------------------------------------------------------------------------
 * Convert: a GGUF model into the .flm flash layout (docs/FORMAT.md). Source: src/convert/convert.c.
 * ------------------------------------------------------------------------------------------------------------- */
/* Convert the GGUF model at src (any architecture and tensor type flm_open accepts) into the .flm file dst. Writes
 * "<dst>.tmp", fsyncs and renames it onto dst only when complete; on any error removes the temporary file and leaves
 * dst untouched. Down columns of quantized matrices are re-quantized along d_model as q8_0 (src/convert/convert.h),
 * which changes their values slightly; float types are copied exactly. progress (may be NULL): bytes written.
 * An existing dst is replaced (flm_convert_ex with FLM_OUT_REPLACE; give 0 there to refuse it).
 * Errors: FLM_ERR_IO (read, write), FLM_ERR_FORMAT, FLM_ERR_UNSUPPORTED (what flm_open refuses), FLM_ERR_NOMEM. */
FLM_API flm_status flm_convert(const char *src, const char *dst, flm_progress_fn progress, void *user, flm_error *err);
/* What a conversion wrote (filled on success), so nothing has to be read back to report it. */
typedef struct flm_convert_info {
    uint64_t file_bytes;      /* the .flm */
    uint64_t src_bytes;       /* the GGUF */
    uint64_t resident_bytes;  /* the resident region's payload */
    uint64_t embd_bytes;      /* of which token_embd.weight's data, last (the tail: docs/FORMAT.md) */
    uint64_t ffn_bytes;       /* all FFN regions' payloads */
    uint32_t n_layers, n_records; /* FFN regions; records (neurons) per layer */
    uint64_t record_bytes;    /* bytes of one record of layer 0 */
    double seconds;           /* wall time, open to rename */
} flm_convert_info;

/* flm_convert with the type quantized down columns are stored in : q8_0 (the
 * default), f16 (a near-exact copy of 4-6-bit source values at 2 bytes per element) or f32; info (may be NULL) gets
 * what was written. Every byte of the output is written once, sequentially (the resident GGUF too). out_flags:
 * FLM_OUT_REPLACE when an existing dst may be replaced (the CLI's --force), else 0: a dst that exists, or appears
 * while converting, is left alone and the call fails (FLM_ERR_ARG).
 * Errors: those of flm_convert, FLM_ERR_ARG for another type or a refused dst. */
FLM_API flm_status flm_convert_ex(const char *src, const char *dst, uint32_t down_as, unsigned out_flags,
                                  flm_progress_fn progress, void *user, flm_convert_info *info, flm_error *err);
/* A Hugging Face model folder into a GGUF file (then flm_open or flm_convert read it). dir holds config.json and
 * model.safetensors, or shards named by model.safetensors.index.json (f32, f16 or bf16 tensors: the parser is
 * src/format/safetensors.h); tok_dir (NULL: dir) holds tokenizer.json (byte-level BPE: model.vocab, model.merges,
 * added_tokens) or vocab.json + merges.txt, and a folder without either is refused; ids the tokenizer lacks become
 * "[UNUSED_i]"; a SentencePiece-style tokenizer.json (byte_fallback, Metaspace) is refused. flags:
 * FLM_HF_NO_TOKENIZER converts without a tokenizer (every id a placeholder: prompts as ids only; refused together
 * with a tok_dir); FLM_OUT_REPLACE lets an existing dst be replaced (the CLI's --force). dst is refused when it is
 * one of the files read (flm_hf_check_output). Every tensor of the folder must be used by the model config.json
 * describes (PyTorch's saved buffers aside): a num_hidden_layers smaller than the weights' layers is refused. model_type "opt" (pre-LN,
 * word_embed_proj_dim == hidden_size, relu; the positions' offset of 2 folded), "falcon" (Falcon 7B's layout:
 * parallel_attn, multi_query, no alibi, no bias, gelu), "phi" (Phi-2: gelu_new, no qk_layernorm) and "persimmon"
 * (relu2, qk_layernorm); default (unscaled) RoPE only. The names are mapped onto llama.cpp's for opt, falcon, phi2
 * and persimmon (src/convert/hf.c), fused q/k/v in llama.cpp's row order. type: FLM_TYPE_F32, F16 or Q8_0 for the
 * matrices (norms and biases stay f32). Writes "<dst>.tmp" and renames it when complete. Source: src/convert/hf.c.
 * Errors: FLM_ERR_IO, FLM_ERR_FORMAT (config, shapes, the safetensors header: the message names file and tensor),
 * FLM_ERR_UNSUPPORTED (another model_type, or a configuration flashlm does not run: the message names the config
 * key, e.g. post-LN OPT, project_in/out, alibi, another activation, RoPE scaling), FLM_ERR_ARG (type, tok_dir not a
 * folder, dst refused or existing without FLM_OUT_REPLACE), FLM_ERR_NOMEM. */
#define FLM_HF_NO_TOKENIZER 0x100u
FLM_API flm_status flm_convert_hf(const char *dir, const char *tok_dir, const char *dst, uint32_t type, unsigned flags,
                                  flm_error *err);
/* Refuse dst (FLM_ERR_ARG naming both) when it is, by device and inode, one of the files flm_convert_hf(dir, tok_dir)
 * reads: config.json, model.safetensors, model.safetensors.index.json and the shards it names, and tok_dir's
 * tokenizer.json, vocab.json, merges.txt (tok_dir NULL: none). A dst that does not exist passes. For an output
 * written later from the conversion's result (convert's .flm), so it is refused before any work. */
FLM_API flm_status flm_hf_check_output(const char *dir, const char *tok_dir, const char *dst, flm_error *err);


/* ---------------------------------------------------------------------------------------------------------------
 * Calibrate: the sparse mode's activation rule, operating points (levels) and low-rank predictors, trained on a text
 * and stored into the .flm file (paper Knowl 2, 3, 10; docs/SPARSITY.md). Source: src/calibrate/calibrate.c (the
 * training, BLAS/LAPACK: src/calibrate/train.c).
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct flm_calib_opts {
    const char *text;        /* calibration text (UTF-8), or NULL with text_file */
    const char *text_file;   /* or the text file at this path, read as a stream (flm_text_stream) only as far as the
                                tokens used (max_tokens + eval_tokens; the held-out ones are then those right after
                                the recorded ones): a text of any size, /dev/zero, a pipe cost what a short one does */
    const char *const *text_files; /* or several text files (a NULL-terminated list, replacing text_file when set),
                                taken in turns a chunk at a time: chunk tokens of the first, then of the second, ...,
                                each file from where its last chunk ended, a file that ends dropping out (the hot
                                order and the predictors then see every kind of text: prose, code, ...); each file
                                is read as far as the tokens used alone would be */
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
    uint32_t hot_tokens;     /* > 0: first store every layer's FFN neurons hottest first (flm_hot_order_ex, under the
                                same budget, measured on this many tokens of the text) unless the file already is;
                                after the checks that need no work (the output, the text's length, the training
                                budget), before recording; a file whose FFN has biases keeps its order. 0 (default):
                                keep the order. Ignored by levels_only. `flashlm calibrate` sets 1024 (--hot-tokens;
                                --no-hot: 0) */
    flm_progress_fn progress; /* phases: "recording tokens", "training predictors", "checking levels" (and the hot
                                 order's: "measuring neurons", "scoring neurons", "writing the hot order") */
    void *user;
} flm_calib_opts;

/* Fill o with the defaults above (text NULL: set it). */
FLM_API void flm_calib_opts_default(flm_calib_opts *o);

#define FLM_CALIB_MAX_LEVELS 8 /* operating points stored per model */
#define FLM_CALIB_AGG_K 16     /* s_agg(k) is reported for k = 1 .. FLM_CALIB_AGG_K */

/* One operating point: eps and what it costs. Shares are of d_ffn per token, means over the layers. */
typedef struct flm_calib_level {
    float eps;          /* share of each layer's FFN output energy the oracle leaves out (ReLU: 0) */
    double oracle_frac;  /* neurons above the level's threshold (the true active set), calibration tokens */
    double pred_frac;    /* neurons the predictor flags, held-out recorded tokens */
    double kept;         /* share of the output energy the predicted set keeps */
    double recall;       /* share of the truly active neurons the predictor flags */
    float loss;         /* held-out perplexity cost with the predictor: exp(mean KL(dense || sparse)) - 1; NaN: not
                           measured (a --mem budget too small for the check) */
    float dnll;         /* the perplexity ratio - 1 on the same tokens (noisier); NaN: not measured */
    float loss_oracle;  /* the same two with the true active sets (opts.curve); NaN: not measured */
    float dnll_oracle;
} flm_calib_level;

/* One layer at the default level. */
typedef struct flm_calib_layer {
    uint32_t d_ffn;      /* its FFN neurons */
    uint32_t rank;       /* its predictor's rank */
    float threshold;     /* the level's threshold (the rule's tau) */
    float active_frac;   /* neurons truly active on the calibration tokens */
    float pred_frac;     /* neurons predicted active (what is read without a window) */
    float recall;        /* held-out: TP / (TP + FN) */
    float precision;     /* held-out: TP / (TP + FP) */
    float s_agg[FLM_CALIB_AGG_K]; /* s_agg(k): the union of the predicted sets of k consecutive tokens, share of
                                     d_ffn (Knowl 3), k = 1 .. FLM_CALIB_AGG_K */
} flm_calib_layer;

/* What a calibration measured and stored. */
typedef struct flm_calib_report {
    bool relu;              /* ReLU FFNs: active = activation > 0 (one level); else gated (levels by eps) */
    uint32_t n_layers;
    uint32_t n_levels;      /* 1 .. FLM_CALIB_MAX_LEVELS */
    uint32_t default_level; /* the level the sparse mode runs at unless told otherwise (flm_params.sparse_level) */
    flm_calib_level levels[FLM_CALIB_MAX_LEVELS];
    flm_calib_layer *layers; /* n_layers, malloc'd: free with flm_calib_report_free */
    int hot_order;           /* what flm_calib_opts.hot_tokens did: FLM_CALIB_HOT_NONE (not asked, or levels_only),
                                _DONE (stored hottest first now), _KEPT (it already was), _UNSUPPORTED (FFN biases:
                                the order is kept) */
} flm_calib_report;
#define FLM_CALIB_HOT_NONE 0
#define FLM_CALIB_HOT_DONE 1
#define FLM_CALIB_HOT_KEPT 2
#define FLM_CALIB_HOT_UNSUPPORTED 3

/* Calibrate the .flm file at path with the text o->text and store the result into it, in place and atomically (the
 * file is never left half-written): with the hot order (o->hot_tokens), the ordered copy "<path>.cal.tmp" is
 * calibrated and then renamed onto path, so the model is replaced once at the end, or not at all on any error. One calibration of a file at a time: an exclusive advisory lock (flock) on path
 * is held throughout. levels_only: choose the default level of an already calibrated file again on new text,
 * without recording or training (the held-out check on the last o->eval_tokens tokens against o->max_loss; the
 * stored predictors are kept). report (may be NULL) gets what was measured. Progress goes to o->progress; prints
 * nothing. Takes minutes on real models (docs/SPARSITY.md).
 * Errors: FLM_ERR_ARG (bad options; a text too short: fewer than 64 tokens to record, or 2 chunks; levels_only on a
 * file not calibrated or calibrated for ReLU), FLM_ERR_IO (another calibration holds the file; it cannot be opened
 * or written), those of flm_open (FLM_ERR_FORMAT, FLM_ERR_UNSUPPORTED, FLM_ERR_BUDGET, ...), FLM_ERR_NOMEM. */
FLM_API flm_status flm_calib_run(const char *path, const flm_calib_opts *o, bool levels_only, flm_calib_report *report,
                                 flm_error *err);
/* Order every layer's FFN neurons of the .flm file at path hottest first, in place and atomically
 * (calibrate/hot.c; docs/SPECULATIVE.md): each neuron's score is its summed contribution |h_i| * ||down_i|| over the
 * first max_tokens tokens of text (in chunks of `chunk` tokens from position 0, the model in ram mode: it must fit in
 * memory; flm_hot_order_ex orders under a budget), then flm_file_permute_ffn stores the order. The model's function does not change; the hot mode (and its
 * self-draft) keeps each layer's first records in memory. A predictor region is dropped (calibrate again). Progress:
 * "measuring neurons" (tokens), "writing the hot order". Errors: FLM_ERR_ARG (text under 16 tokens; not a .flm),
 * FLM_ERR_UNSUPPORTED (FFN biases), those of flm_open and flm_file_permute_ffn. */
FLM_API flm_status flm_hot_order(const char *path, const char *text, uint32_t max_tokens, uint32_t chunk,
                                 int n_threads, flm_progress_fn progress, void *user, flm_error *err);
/* Options of flm_hot_order_ex (flm_hot_opts_default fills them). */
typedef struct flm_hot_opts {
    const char *text_file;    /* when the text argument is NULL: the text file, read only as far as max_tokens */
    const char *const *text_files; /* or several text files, a chunk of each in turn (flm_calib_opts.text_files) */
    const char *out_path;     /* write the ordered model there (replaced if it exists), leaving path as it was; NULL:
                                 onto path */
    uint32_t max_tokens;      /* tokens of the text the scores are measured on (default 1024; at least one chunk) */
    uint32_t chunk;           /* tokens per sequence, each from position 0 (default 128) */
    int n_threads;            /* default 2 */
    uint64_t mem_bytes;       /* memory budget in bytes (--mem); 0 with mem_percent 0: none, the model is held in
                                 memory (ram mode) */
    double mem_percent;       /* or a budget as a percentage of the model's weight bytes, when mem_bytes is 0. With a
                                 budget the model runs in hybrid mode under it, each layer's FFN inputs are recorded
                                 to "<path>.x.tmp" (n_layers x max_tokens x d_model floats, removed afterwards) and
                                 each layer's FFN region is read from the file once to score its neurons; what that
                                 holds (two FFN regions of a layer while the order is written, one layer's recorded
                                 inputs) is checked against the budget before anything runs (FLM_ERR_BUDGET) */
    flm_progress_fn progress; /* phases: "measuring neurons" (tokens), "scoring neurons" (layers, with a budget),
                                 "writing the hot order" */
    void *user;
} flm_hot_opts;

/* Fill o with the defaults above. */
FLM_API void flm_hot_opts_default(flm_hot_opts *o);

/* flm_hot_order with options (o NULL: the defaults), under a memory budget when o sets one (see flm_hot_opts).
 * Holds the calibration lock on path throughout (a second calibrate or ordering of the file fails at once with
 * FLM_ERR_IO). The file is replaced atomically (a unique temporary, fsync, rename): on any error, a full disk or a
 * killed process, path keeps its old contents. Ordering a file already stored hottest first orders it again by the
 * new text's scores (check flm_is_hot_ordered first to keep it). Errors: those of flm_hot_order, FLM_ERR_BUDGET
 * (the budget cannot hold the ordering, or flm_open's plan), FLM_ERR_IO (the recorded inputs cannot be written or
 * read back; locked). */
FLM_API flm_status flm_hot_order_ex(const char *path, const char *text, const flm_hot_opts *o, flm_error *err);
/* true when every FFN region of the .flm file at path is stored hottest first (false also when it cannot be read). */
FLM_API bool flm_is_hot_ordered(const char *path);

/* Options of flm_coact_order (flm_coact_opts_default fills them). */
typedef struct flm_coact_opts {
    const char *text;         /* the text whose predicted sets are measured, or NULL: */
    const char *text_file;    /* the text file, read only as far as max_tokens */
    const char *const *text_files; /* or several text files, a chunk of each in turn (flm_calib_opts.text_files) */
    const char *out_path;     /* write the ordered model there (replaced if it exists), leaving path as it was; NULL:
                                 onto path */
    uint32_t max_tokens;      /* tokens of the text (default 1024; whole chunks) */
    uint32_t chunk;           /* tokens per sequence, each from position 0 (default 128) */
    float held_out;           /* share of the tokens (whole chunks, the last ones) not used to order but to measure
                                 the order (default 0.25) */
    uint32_t window;          /* the report's window: previous tokens of the chunk whose neurons are not read again
                                 (default 4) */
    uint64_t gap_bytes;       /* the report's merge rule: a gap below this between two reads is read through (default
                                 10000: the sparse mode's default cost model, docs/IO.md) */
    int n_threads;            /* default 2 */
    flm_progress_fn progress; /* phases: "recording tokens" (tokens), "ordering neurons" (layers), "writing the
                                 co-activation order" */
    void *user;
} flm_coact_opts;

/* Fill o with the defaults above. */
FLM_API void flm_coact_opts_default(flm_coact_opts *o);

/* What flm_coact_order measured on its held-out tokens (summed over layers, per token; the reads and bytes the
 * reader's planner makes of each token's predicted set: 4 KiB-aligned, gaps below gap_bytes read through). */
typedef struct flm_coact_report {
    uint32_t n_layers;
    uint32_t n_order, n_held; /* predicted sets (tokens past the first of a chunk) ordered on, and measured on */
    uint32_t window;
    uint64_t gap_bytes;
    double reads[2][2];       /* [0: every predicted neuron read; 1: those not flagged on the window's previous tokens]
                                 [0: the old order; 1: the new one] */
    double mib[2][2];         /* MiB read, the same */
    double seconds;
} flm_coact_report;

/* Store every layer's FFN neurons of the calibrated .flm file at path in co-activation order (calibrate/coact.c;
 * docs/SPARSITY.md, "Co-activation order"), atomically: the model runs densely in memory (ram mode) on the text,
 * each layer's predictor (at the default level) gives the sets the sparse mode would read, and the neurons are
 * ordered so that those flagged together lie together (a greedy short path under the Hamming distance of their
 * predicted sets); then the FFN records, the FFN biases and the predictors' per-neuron rows are stored in that order
 * (flm_file_permute_ffn_ex), so the sparse mode flags the same neurons and computes the same function with fewer,
 * larger reads. A hot order is replaced (the hot mode then refuses the file: calibrate again for it). Holds the
 * calibration lock on path throughout. rep (may be NULL) gets the held-out measurement. Memory: the model, the
 * text's FFN inputs (n_layers x max_tokens x d_model floats) and d_ffn x max_tokens bits. Errors: FLM_ERR_ARG (no
 * text, bad options, too few tokens, not a .flm, not calibrated: no predictors), FLM_ERR_FORMAT (predictors that do
 * not match the model), FLM_ERR_IO (locked), those of flm_open and flm_file_permute_ffn_ex, FLM_ERR_NOMEM. */
FLM_API flm_status flm_coact_order(const char *path, const flm_coact_opts *o, flm_coact_report *rep, flm_error *err);

/* Read the calibration stored in the .flm file at path (its predictor region) into report, without running
 * anything: the levels with their stored held-out loss (dnll and the oracle's values are NaN: not stored), and each
 * layer at the default level. Reads the file's header and that region only.
 * Errors: FLM_ERR_ARG (the file is not calibrated), FLM_ERR_IO, FLM_ERR_FORMAT (not a .flm file; a region that does
 * not match the model's layers), FLM_ERR_CHECKSUM, FLM_ERR_NOMEM. */
FLM_API flm_status flm_calib_read(const char *path, flm_calib_report *report, flm_error *err);
/* Release what flm_calib_run put in r (r itself is not freed); NULL is fine. */
FLM_API void flm_calib_report_free(flm_calib_report *r);

/* ---------------------------------------------------------------------------------------------------------------
 * Quality curve of a calibrated model (`flashlm perplexity --curve`): perplexity against the bytes a token's FFN
 * sets take from flash, dense, then each stored level with the predictor and with the true active sets (the
 * oracle), so the loss from the threshold and the loss from the predictor show apart (docs/SPARSITY.md, "Quality
 * curves"). Source: src/calibrate/curve.c.
 * ------------------------------------------------------------------------------------------------------------- */
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
    const char *text_file;  /* when the text argument is NULL: the text file, read as a stream for each point
                               (flm_perplexity_file), never held whole */
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

FLM_API void flm_curve_opts_default(flm_curve_opts *o);

/* Measure the curve of the calibrated gated .flm at path on text (UTF-8): the model is held in memory (ram mode, the
 * FFN select hook) and each point runs flm_perplexity over the same chunks. pts receives 1 + (1 or 2) x levels
 * points (dense first, then per level the predictor and the oracle), at most cap; *n_pts their count.
 * Memory: the model, d_ffn floats per layer (down-column norms), the stored predictors.
 * Errors: FLM_ERR_ARG (not a .flm (the message says how to convert), not calibrated, a ReLU calibration (its sets
 * are exact: one level), a level not stored, cap too small, text shorter than one chunk), those of flm_open and
 * flm_perplexity, FLM_ERR_NOMEM. */
FLM_API flm_status flm_sparsity_curve(const char *path, const char *text, const flm_curve_opts *o, flm_curve_point *pts,
                                      uint32_t cap, uint32_t *n_pts, flm_error *err);

/* ---------------------------------------------------------------------------------------------------------------
 * Synth: synthetic Llama-shaped GGUF models with random weights and realistic FFN activation statistics, for
 * benchmarking the flash path (`flashlm synth`; docs/SYNTH.md). The text such a model generates is meaningless: it
 * measures the system (I/O, memory, kernels), never model quality. Source: src/synth/synth.c.
 * ------------------------------------------------------------------------------------------------------------- */
#define FLM_SYNTH_ACT_SILU 0u /* silu(gate . x) (up . x): a plain llama file */
#define FLM_SYNTH_ACT_RELU 1u /* relu(gate . x) (up . x): flashlm.ffn_activation = "relu" */
#define FLM_SYNTH_ARCH_LLAMA 0u /* llama: RMSNorm, RoPE, gated FFN, no biases (the default) */
#define FLM_SYNTH_ARCH_OPT 1u   /* OPT (pre-LN, as OPT 1.3B..175B): LayerNorm with bias, learned positions, biases on
                                   q, k, v, the output and the FFN, ungated ReLU FFN (relu(up . x + b_up)): the up
                                   biases set each neuron's firing frequency; needs act RELU */

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
    uint32_t act;         /* FFN activation: FLM_SYNTH_ACT_RELU (default: writes flashlm.ffn_activation = "relu") or
                             FLM_SYNTH_ACT_SILU (a plain llama file) */
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
    uint32_t arch;        /* FLM_SYNTH_ARCH_LLAMA (default) or FLM_SYNTH_ARCH_OPT */
} flm_synth_params;

/* Fill p with the defaults above: the project's standard benchmark shape (about 3.1 GB in F16). */
FLM_API void flm_synth_params_default(flm_synth_params *p);

/* Check every parameter; the message says which one is wrong and why (e.g. "d_model 2050 is not a multiple of
 * n_heads 32"). Errors: FLM_ERR_ARG. */
FLM_API flm_status flm_synth_check(const flm_synth_params *p, flm_error *err);

/* Bytes of tensor data the file will hold (the file is this plus a header of about 1 MB for vocabulary 32000);
 * 0 when the parameters are invalid. */
FLM_API uint64_t flm_synth_tensor_bytes(const flm_synth_params *p);

/* Write the model to path: "<path>.tmp" is written tensor by tensor through a streaming GGUF writer (one tensor is
 * generated while the previous one is written in the background: at most two tensor buffers in memory, each the size
 * of the largest tensor, the n_vocab x d_model embedding of p->type: ~270 MB for the default), fsynced and renamed
 * onto path. progress (may be NULL) gets ("synth", bytes of tensor data written, total) as tensors complete. On any
 * error nothing is left behind (no path, no temporary) and an existing file at path is untouched. out_flags:
 * FLM_OUT_REPLACE when an existing file at path may be replaced (the CLI's --force), else 0: then a file that
 * exists, or appears while the model is written, is left alone and the call fails (FLM_ERR_ARG).
 * Errors: FLM_ERR_ARG (bad parameters, as flm_synth_check; path refused), FLM_ERR_IO (cannot write), FLM_ERR_NOMEM,
 * FLM_ERR_FORMAT (the calibration pass met a non-finite value: should not happen; please report). */
FLM_API flm_status flm_synth_write(const char *path, const flm_synth_params *p, unsigned out_flags,
                                   flm_progress_fn progress, void *user, flm_error *err);

/* true when synth can write matrices of tensor type `type` (a GGUF type id with a quantizer: f32, f16, bf16, q8_0,
 * q4_0, ...); the names are flm_type_name's. */
FLM_API bool flm_synth_type_ok(uint32_t type);

/* The window of flm_synth_activity.layer_reuse: the paper's OPT 6.7B setting of four recent tokens (Knowl 3). */
#define FLM_SYNTH_WINDOW 4

/* Measured activation statistics of a model (flm_synth_measure). A neuron is active for a token when its gate
 * pre-activation gate_i . rmsnorm(x) is > 0 (ReLU: relu(gate) > 0; SiLU: silu(gate) > 0); in an ungated FFN (OPT)
 * when up_i . x + b_up_i > 0. */
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
    double max_logit_diff;   /* max |batched logit - flm_eval logit| / max(1, max |flm_eval logit|) over the tokens;
                                -1 when not checked */
    bool finite;             /* every activation and logit was finite */
} flm_synth_activity;

/* Run n_tokens tokens (BOS, then ids drawn from seed) through the GGUF model at path with the engine's own forward
 * pass (flm_open in ram mode with an f32 KV cache, flm_eval_batch) and count, per layer and neuron, the tokens on which
 * the neuron fired (gate . x > 0 on the FFN input x the pass hands its FFN tap). When check_engine, every token's
 * logits from the batched pass are also compared with flm_eval's token by token (max_logit_diff). Works on any GGUF,
 * not only synthetic ones (an ungated FFN: up . x + b_up > 0).
 * Errors: those of flm_open and flm_eval_batch; FLM_ERR_ARG (n_tokens outside 1..4096); FLM_ERR_NOMEM. On error *out is zeroed. Free with flm_synth_activity_free. */
FLM_API flm_status flm_synth_measure(const char *path, uint32_t n_tokens, uint64_t seed, int n_threads,
                                     bool check_engine, flm_synth_activity *out, flm_error *err);
FLM_API void flm_synth_activity_free(flm_synth_activity *a);

/* ---------------------------------------------------------------------------------------------------------------
 * Probe: measure the disk that holds a model (`flashlm probe-disk`) and fit the reader's cost model (flm_io_cost).
 * Source: src/probe/probe.c; the method, what a cell is and the fit are described in src/probe/probe.h and
 * docs/IO.md ("Measuring the disk"). The result is saved next to the model as "<model>.probe.json", which a run
 * reads through flm_params.io_cost_path.
 * ------------------------------------------------------------------------------------------------------------- */
#define FLM_PROBE_SUFFIX ".probe.json"   /* the file next to the model: "<model>.probe.json" (as src/io/io_cost.h) */
#define FLM_PROBE_SEQ_BYTES ((uint64_t)4 << 20) /* request size of the sequential cells */
#define FLM_PROBE_SEQ_MAX_IN_FLIGHT 16          /* sequential cells are run at the in-flight counts up to this */
#define FLM_PROBE_MAX_LIST 16                   /* at most this many request sizes / in-flight counts */
#define FLM_PROBE_MIN_FILE ((uint64_t)16 << 20) /* smaller files are refused: the device cache would serve them */

/* Which back ends to measure (bit mask). */
enum { FLM_PROBE_THREADS = 1, FLM_PROBE_URING = 2, FLM_PROBE_BOTH = 3 };

typedef struct flm_probe_opts {
    double seconds;            /* total time budget of the measurements (not counting writing a test file), s;
                                  default 60; split evenly over the cells still to run */
    uint64_t size;             /* directory target: bytes of the temporary test file; default 1 GiB; capped at half
                                  the free space; rounded down to 4 MiB; at least FLM_PROBE_MIN_FILE */
    uint64_t sizes[FLM_PROBE_MAX_LIST]; /* random request sizes, bytes, powers of two >= 512; n_sizes = 0: default
                                           4 KiB, 16 KiB, 64 KiB, 256 KiB, 1 MiB */
    size_t n_sizes;
    int depths[FLM_PROBE_MAX_LIST];     /* reads in flight, 1..1024; n_depths = 0: default 1, 4, 16, 32, 64 */
    size_t n_depths;
    unsigned backends;         /* FLM_PROBE_* mask; 0 = both */
    bool buffered;             /* testing: do not try O_DIRECT (reads are buffered + POSIX_FADV_DONTNEED) */
    uint64_t cell_bytes;       /* a cell stops after reading this many bytes; 0 = default 1 GiB */
    uint64_t dst_bytes;        /* destination memory for one batch, bytes; 0 = default 64 MiB (a batch is at least
                                  the in-flight count when this allows) */
    uint64_t seed;             /* random offsets; 0 = default 1 */
    /* progress (may be NULL): called before each cell (done = cells finished, total = all cells) and while
     * writing a test file (done/total in bytes); the same signature as cli_progress */
    void (*progress)(void *user, const char *what, uint64_t done, uint64_t total);
    void *progress_user;
} flm_probe_opts;

/* Fill o with the defaults above. */
FLM_API void flm_probe_opts_default(flm_probe_opts *o);

/* One measurement. */
typedef struct flm_probe_cell {
    flm_io_kind backend;  /* FLM_IO_KIND_THREADS or FLM_IO_KIND_URING */
    bool sequential;         /* false: random */
    uint64_t request_bytes;  /* bytes per extent asked for */
    int in_flight;           /* asked: n_threads / queue_depth */
    int batch;               /* extents per flm_reader_read call (in flight = min(in_flight, batch)) */
    bool measured;           /* false: skipped (back end unavailable, file too small for the batch) */
    uint64_t requests;       /* device requests timed (stats.n_requests) */
    uint64_t bytes;          /* device bytes timed (stats.bytes_read) */
    double seconds;          /* time in flm_reader_read, s */
    double throughput_gbps;  /* bytes / seconds / 1e9 */
    double iops;             /* requests / seconds */
    double latency_us;       /* mean per request, Little's law: min(in_flight, batch) / iops, microseconds */
} flm_probe_cell;

/* The fitted cost model (all from one back end: the one FLM_IO_AUTO gives the engine when it was measured). */
typedef struct flm_probe_fit {
    bool valid;                  /* false when the cells needed were not measured */
    flm_io_kind backend;      /* back end the fit is from */
    uint64_t small_bytes;        /* request size of the latency cells: the smallest measured (4 KiB) */
    double latency_us;           /* device latency: mean latency of small random reads, 1 in flight */
    double bandwidth_gbps;       /* streaming bandwidth: the best sequential throughput (GB/s, 1e9 B/s) */
    int parallelism;             /* the engine's default reads in flight for the back end (io_uring 64, threads 32),
                                    or the nearest measured in-flight count */
    double speedup;              /* small random reads: iops at `parallelism` / iops at 1 in flight */
    double effective_latency_us; /* per-request cost at `parallelism`: latency_us / speedup, less the transfer of
                                    small_bytes at bandwidth_gbps; >= 0 */
    flm_io_cost cost;            /* what the planner should use: {effective_latency_us, bandwidth_gbps} */
} flm_probe_fit;

typedef struct flm_probe_result {
    char *path;               /* what was probed (the file or the directory), malloc'd */
    bool temp_file;           /* a temporary test file was created (and deleted) in the directory `path` */
    uint64_t file_bytes;      /* size of the file read */
    uint64_t align;           /* reader alignment, bytes */
    bool direct;              /* every read went through O_DIRECT (false: buffered + DONTNEED) */
    bool uring_available;     /* the io_uring back end could be opened */
    char uring_note[160];     /* why not, when it was asked for and could not be opened */
    double seconds_budget;    /* opts.seconds */
    double wall_seconds;      /* measuring time (without writing the test file) */
    uint64_t seed;
    flm_probe_cell *cells;    /* n_cells, malloc'd; order: back end, in flight, then sizes (random, sequential) */
    size_t n_cells;
    flm_probe_fit fit;
} flm_probe_result;

/* Measure the storage holding `path`:
 *   - a regular file (a model): random and sequential reads over it, read only; at least FLM_PROBE_MIN_FILE bytes;
 *   - a directory: a temporary file of opts->size bytes (pseudo-random data, fsync'ed, dropped from the page cache)
 *     is created there, measured and deleted (it is unlinked right after creation where /proc/self/fd allows, so
 *     nothing is left behind even if the process is killed).
 * opts NULL = defaults. Fills *out (release with flm_probe_result_free; it is zeroed first) including the fit.
 * Errors: FLM_ERR_ARG (NULL path/out, bad options, a file too small, not a file or directory), FLM_ERR_IO (open,
 * write, read, not enough free space), FLM_ERR_NOMEM. A back end that cannot be opened (io_uring refused) is not an
 * error: its cells are marked not measured and uring_note says why. */
FLM_API flm_status flm_probe_run(const char *path, const flm_probe_opts *opts, flm_probe_result *out, flm_error *err);

/* The cell of a measurement, or NULL when there is none (or it was not measured). */
FLM_API const flm_probe_cell *flm_probe_find(const flm_probe_result *r, flm_io_kind backend, bool sequential,
                                             uint64_t request_bytes, int in_flight);

/* Fit the cost model from r->cells into r->fit (also done by flm_probe_run):
 *   backend         io_uring when it was measured (FLM_IO_AUTO picks it), else threads
 *   latency_us      latency of the smallest random request size at 1 in flight (or the smallest in-flight count)
 *   bandwidth_gbps  the best sequential throughput of that back end (none: the best random throughput)
 *   parallelism     the engine default for the back end (flm_reader_opts_default: queue_depth / n_threads), or the
 *                   largest measured in-flight count not above it
 *   speedup         iops(small, parallelism) / iops(small, 1)
 *   effective       max(0, latency_us / speedup - small_bytes / bandwidth): with P reads in flight a request's fixed
 *                   cost is shared by P, so the cost the planner weighs against streaming a gap is the time one more
 *                   small request adds at that parallelism (1 / iops) less the time its bytes take to stream
 *   cost            {effective, bandwidth_gbps}: the planner then reads through gaps below effective * bandwidth. */
FLM_API void flm_probe_fit_cost(flm_probe_result *r);

/* Save r as JSON to path atomically (path.tmp.<pid>, fsync, rename). Errors: FLM_ERR_IO, FLM_ERR_NOMEM. */
FLM_API flm_status flm_probe_save(const flm_probe_result *r, const char *path, flm_error *err);

/* Release what flm_probe_run allocated; r itself is not freed. NULL is fine. */
FLM_API void flm_probe_result_free(flm_probe_result *r);


/* ---------------------------------------------------------------------------------------------------------------
 * Inspect: a model file's format, regions (.flm), hyper-parameters, metadata and tensors (type, shape, bytes), as
 * the text `flashlm inspect` prints. Source: src/convert/inspect.c.
 * ------------------------------------------------------------------------------------------------------------- */
/* Read the GGUF or .flm file at path and write its report into *text (malloc'd, NUL-terminated: the caller frees
 * it). The model is also opened as flm_open would run it (params, NULL = defaults; n_ctx is set to 1): *runnable
 * (may be NULL) is true when it opens; when it does not, the report says why ("model cannot be run: ...") and the
 * call still succeeds. A damaged GGUF is reported as far as it parses: *text holds that part, and the parse error
 * is returned (nothing is run then).
 * Errors: FLM_ERR_ARG (path or text NULL), those of opening the file (FLM_ERR_IO, FLM_ERR_FORMAT, FLM_ERR_CHECKSUM:
 * *text NULL when nothing could be read; for a GGUF whose parsing failed part-way, *text holds the part read),
 * FLM_ERR_NOMEM. */
FLM_API flm_status flm_inspect(const char *path, const flm_params *params, char **text, bool *runnable, flm_error *err);

/* ---------------------------------------------------------------------------------------------------------------
 * Verify: read every region of a .flm file and check its xxh64 checksum. Source: src/convert/verify.c.
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct flm_verify_info {
    uint32_t n_regions;   /* regions checked (resident, FFN layers, record sums, predictors) */
    uint64_t file_bytes;  /* the file's size */
} flm_verify_info;
/* Open path (a .flm file), read every region and compare its checksum; progress (may be NULL) in bytes read. Then
 * make flm_open's checks of the header and resident region (a naive-mode context with a short cache is opened and
 * closed: counts that agree, every tensor's presence, shape and type), so a file verify accepts is one run opens.
 * info (may be NULL) is filled on success.
 * Errors: FLM_ERR_IO (cannot open or read), FLM_ERR_FORMAT (not a valid .flm file; or checksums that match on a file
 * flm_open refuses: its message follows), FLM_ERR_CHECKSUM (a region's checksum does not match: the message names the
 * region), FLM_ERR_NOMEM, and flm_open's. */
FLM_API flm_status flm_verify(const char *path, flm_progress_fn progress, void *user, flm_verify_info *info,
                              flm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* FLASHLM_TOOLS_H */
