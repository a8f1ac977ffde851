/*
 * flashlm.h — the public C API of flashlm.
 *
 * flashlm runs large language models whose weights do not fit in memory: resident parts (embeddings, attention,
 * norms) stay in RAM, feed-forward (FFN) neurons are streamed from flash. It implements "LLM in a flash"
 * (Alizadeh et al., ACL 2024, arXiv 2312.11514); section references below ("Knowl N") point at the method notes in
 * shared/paper/llm-in-a-flash.txt.
 *
 * Conventions
 *   - Every function that can fail returns an flm_status (0 = FLM_OK, negative = error) and, when given a non-NULL
 *     flm_error, fills it with a one-line message that names the file and what is wrong.
 *   - Sizes are in bytes, times in milliseconds, lengths in tokens, unless a name says otherwise.
 *   - Objects are opaque; each *_open / *_create has a matching *_close / *_free that accepts NULL.
 *   - No global state: everything lives in the objects below. Objects are not thread-safe; use one per thread.
 */
#ifndef FLASHLM_H
#define FLASHLM_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* FLM_API marks the public API. The library is built with -fvisibility=hidden and libflashlm.a is one relocatable
 * object in which every other symbol is local, so only these names reach a program that links it. */
#if defined(__GNUC__)
#define FLM_API __attribute__((visibility("default")))
#else
#define FLM_API
#endif

/* Version: the number is MAJOR * 10000 + MINOR * 100 + PATCH, for compile-time checks such as
 * #if FLM_VERSION_NUMBER >= 200 (0.2.0). flm_version() gives the library's own at run time. */
#define FLM_VERSION_MAJOR 0
#define FLM_VERSION_MINOR 2
#define FLM_VERSION_PATCH 0
#define FLM_VERSION_NUMBER (FLM_VERSION_MAJOR * 10000 + FLM_VERSION_MINOR * 100 + FLM_VERSION_PATCH)
#define FLM_VERSION_STRING "0.2.0"

/* The version of the linked library: FLM_VERSION_NUMBER as it was when the library was built; *str (may be NULL)
 * gets FLM_VERSION_STRING. A program built against other headers can compare the two. */
FLM_API int flm_version(const char **str);

/* The compute kernels' level this process uses, chosen once per process from the CPU's features (cpuid on x86-64,
 * getauxval's HWCAP on aarch64): "scalar" (the reference), "avx2" (AVX2+FMA+F16C), "avxvnni" (avx2 + AVX-VNNI),
 * "avx512" (avx2 + AVX-512 F/BW/VL) or "vnni" (+ AVX-512 VNNI) on x86-64, "neon" (Advanced SIMD) or "dotprod"
 * (+ SDOT) on aarch64, the highest the CPU has; or the level the environment variable FLASHLM_KERNELS names (one of
 * flm_kernels_level_name's), capped at the CPU's: a request above it gets the highest level it has below it. An
 * unknown FLASHLM_KERNELS value is ignored. *cpu_best (may be NULL) gets the CPU's best level. The same string as
 * flm_model_info.kernels. Never fails; static strings. */
FLM_API const char *flm_kernels_in_use(const char **cpu_best);
/* The name of kernel level i (0: "scalar", the lowest; the list docs/ARCHITECTURE.md tabulates), NULL for i past the
 * last: what FLASHLM_KERNELS may name. Static strings. */
FLM_API const char *flm_kernels_level_name(int i);

/* ---------------------------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------------------------- */
typedef enum flm_status {
    FLM_OK = 0,
    FLM_ERR_IO = -1,          /* open/read/write/mmap failed, or a short read */
    FLM_ERR_FORMAT = -2,      /* the file is malformed: bad magic, count, offset, size, shape */
    FLM_ERR_NOMEM = -3,       /* an allocation failed */
    FLM_ERR_UNSUPPORTED = -4, /* valid but not supported: version, tensor type, architecture */
    FLM_ERR_ARG = -5,         /* a bad argument from the caller */
    FLM_ERR_BUDGET = -6,      /* the memory budget (--mem) cannot hold what must be resident */
    FLM_ERR_CHECKSUM = -7,    /* a region's checksum does not match: the file is corrupt */
    FLM_ERR_CONTEXT = -8,     /* the context (n_ctx tokens) cannot hold what was asked (flm_session_*) */
    FLM_ERR_CANCELLED = -9,   /* flm_session_cancel stopped a prompt's evaluation between its chunks */
} flm_status;

#define FLM_ERROR_MSG_MAX 512
typedef struct flm_error {
    flm_status code;
    char msg[FLM_ERROR_MSG_MAX];
} flm_error;

/* A short, static name for a status code ("I/O error", "bad format", ...). */
FLM_API const char *flm_status_str(flm_status s);

/* The offset of the first byte of s[0, n) that does not begin a well-formed UTF-8 sequence (RFC 3629 section 4: a
 * stray continuation byte, a truncated sequence, an overlong form, a surrogate, a code point above U+10FFFF; 0xC0,
 * 0xC1, 0xF5..0xFF), or SIZE_MAX when all of it is well-formed. Text flashlm takes (prompts, chat lines, request
 * bodies) is checked with it: a tokenizer would drop such bytes without a word. */
FLM_API size_t flm_utf8_check(const char *s, size_t n);

/* ---------------------------------------------------------------------------------------------------------------
 * Tensor types (the numeric ids are GGUF's ggml_type ids, so they can be stored as-is)
 * ------------------------------------------------------------------------------------------------------------- */
typedef enum flm_type {
    FLM_TYPE_F32 = 0,
    FLM_TYPE_F16 = 1,
    FLM_TYPE_Q4_0 = 2,  /* blocks of 32: f16 d, 16 bytes of nibbles;                 x = d * (q - 8)        */
    FLM_TYPE_Q4_1 = 3,  /* blocks of 32: f16 d, f16 m, 16 bytes of nibbles;          x = d * q + m          */
    FLM_TYPE_Q5_0 = 6,  /* blocks of 32: f16 d, 32 high bits, 16 bytes of nibbles;   x = d * (q - 16)       */
    FLM_TYPE_Q5_1 = 7,  /* blocks of 32: f16 d, f16 m, 32 high bits, nibbles;        x = d * q + m          */
    FLM_TYPE_Q8_0 = 8,  /* blocks of 32: f16 d, 32 int8;                             x = d * q              */
    FLM_TYPE_Q8_1 = 9,  /* blocks of 32: f16 d, f16 s = d * sum(q), 32 int8 (activations only)             */
    FLM_TYPE_Q2_K = 10, /* super-blocks of 256: 16 sub-blocks with 4-bit scale and min, 2-bit quants        */
    FLM_TYPE_Q3_K = 11, /* super-blocks of 256: 16 sub-blocks with 6-bit scale, 3-bit quants                */
    FLM_TYPE_Q4_K = 12, /* super-blocks of 256: 8 sub-blocks with 6-bit scale and min, 4-bit quants         */
    FLM_TYPE_Q5_K = 13, /* super-blocks of 256: 8 sub-blocks with 6-bit scale and min, 5-bit quants         */
    FLM_TYPE_Q6_K = 14, /* super-blocks of 256: 16 sub-blocks with int8 scale, 6-bit quants                 */
    FLM_TYPE_Q8_K = 15, /* super-blocks of 256: f32 d, 256 int8, 16 int16 block sums (activations only)     */
    FLM_TYPE_BF16 = 30,
} flm_type;

/* Name of a type as GGUF/ggml writes it ("f32", "q8_0", "q4_k", ...), or NULL when the id is not one flashlm
 * knows. Activation-only types (q8_1, q8_k) have names too, but cannot be a tensor's type. */
FLM_API const char *flm_type_name(uint32_t type);

/* ---------------------------------------------------------------------------------------------------------------
 * Opening a model and running it
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct flm_ctx flm_ctx;

/* How FFN weights reach memory (the paper's evaluation modes, Knowl 7). Only .flm files stream; a GGUF file always
 * runs in FLM_MODE_RAM. */
typedef enum flm_mode {
    FLM_MODE_AUTO = 0,   /* ram when the whole model fits the budget (or there is none); else sparse when the model
                            is calibrated, its neuron caches fit and its predicted sets (at the default level) are
                            smaller than 0.9x what hybrid would stream; else hot when the file's neurons are stored
                            hottest first (`flashlm calibrate`); else hybrid. flm_plan says which, and why */
    FLM_MODE_RAM = 1,    /* every weight loaded into memory once: the dense reference */
    FLM_MODE_NAIVE = 2,  /* every layer's FFN read from flash again for every token */
    FLM_MODE_HYBRID = 3, /* as many layers' FFN as the budget allows stay resident; the rest are read every token */
    FLM_MODE_SPARSE = 4, /* the paper's method (needs `flashlm calibrate`): a predictor picks each token's active
                            neurons; a sliding window of recent tokens' neurons stays in a per-layer neuron cache;
                            only the missing bundles are read */
    FLM_MODE_HOT = 5,    /* every layer keeps its hottest neurons in memory (a share of each layer's FFN records, the
                            most the budget holds; `flashlm calibrate` stores them hottest first), the rest of each
                            layer is read as one range per pass; exact (ram mode's logits bit for bit), and what the
                            self-draft (flm_eval_draft) computes from */
} flm_mode;

/* "auto", "ram", "naive", "hybrid", "sparse", "hot"; NULL for an unknown value. */
FLM_API const char *flm_mode_name(flm_mode m);
/* Parse a mode name; returns false when unknown. */
FLM_API bool flm_mode_parse(const char *s, flm_mode *out);

/* Flash reader back ends. */
typedef enum flm_io_kind { FLM_IO_KIND_AUTO = 0, FLM_IO_KIND_THREADS = 1, FLM_IO_KIND_URING = 2 } flm_io_kind;
/* The device cost model the flash reader plans with (docs/IO.md): each read request costs latency_us plus its bytes
 * at bandwidth_gbps, so a gap between two wanted extents is read through when streaming it costs less than one more
 * request. `flashlm probe-disk` measures it (flashlm_tools.h, flm_probe_run) and saves it for
 * flm_params.io_cost_path. */
typedef struct flm_io_cost {
    double latency_us;     /* fixed cost of one request, microseconds; default 80 */
    double bandwidth_gbps; /* streaming bandwidth, GB/s (1e9 bytes per second); default 2 */
} flm_io_cost;

/* ---------------------------------------------------------------------------------------------------------------
 * Log messages
 *
 * The library never writes to stdout or stderr. What it has to say beyond an flm_error (a fallback it took, a file it
 * could not use) goes to a log callback: one line per call, without a trailing newline, valid only during the call.
 * With no callback (the default) messages are dropped. The CLI installs one that prints to stderr. The callback may
 * be called from one of the library's reader threads (at most one call at a time per context).
 * ------------------------------------------------------------------------------------------------------------- */
typedef enum flm_log_level {
    FLM_LOG_ERROR = 0, /* something failed and the library could not go on as asked */
    FLM_LOG_WARN = 1,  /* the library went on differently than asked (e.g. hybrid instead of sparse) */
    FLM_LOG_INFO = 2,  /* a choice the user may want to know about (e.g. buffered reads: no O_DIRECT here) */
    FLM_LOG_DEBUG = 3,
} flm_log_level;
typedef void (*flm_log_fn)(void *user, flm_log_level level, const char *msg);

typedef struct flm_params {
    int n_threads;      /* compute threads (-t); default: the number of online CPUs */
    int n_ctx;          /* KV cache length in tokens (-c); 0 = min(model's context_length, 2048) */
    int n_batch;        /* tokens one batched forward pass holds (-b): flm_eval_batch runs longer inputs in pieces
                           of this many; 0 = 256; clamped to n_ctx. Its activations (about 4 * (3 d_model + q_dim +
                           2 kv_dim + 2 d_ffn) bytes per token) are part of the memory plan */
    flm_mode mode;      /* default FLM_MODE_AUTO */
    int n_seq;          /* sequences the context holds (0 or 1: one; at most FLM_SEQ_MAX): the weights once, and per
                           sequence a KV cache of n_ctx tokens, its position and its logits row, all planned in the
                           budget (flm_plan_info.kv counts every sequence's cache). flm_seq_acquire selects one */
    uint64_t mem_bytes; /* memory budget in bytes (--mem); 0 = none. Resident weights + neuron storage + KV cache +
                           scratch + reader buffers must fit (docs/ARCHITECTURE.md, "Memory budget") */
    double mem_percent; /* alternatively, a budget as a percentage of the model's weight bytes (--mem 50%); used
                           when mem_bytes is 0 and this is > 0 */
    flm_io_kind io;     /* reader back end (--io); default auto: io_uring when available */
    int io_threads;     /* reader threads (--io-threads); default 32 */
    bool no_direct;     /* do not try O_DIRECT (testing only: measurements then depend on the page cache) */
    bool no_verify_reads; /* --no-verify-reads: do not check what is read from flash against the file's record sums
                             (docs/IO.md, "Checked reads"). By default every FFN record and token-embedding row read
                             from a .flm is hashed (XXH3) and compared before it is used; a mismatch is read again
                             once, then FLM_ERR_CHECKSUM naming the layer and record. A file without record sums
                             (format version 1) is refused in the streaming modes unless this is set */
    /* sparse mode (and its ablations, Knowl 8) */
    int window;         /* k, tokens whose active neurons stay cached (--window); 0 = chosen from the budget */
    bool no_window;     /* --no-window: cache only the current token's neurons (k = 1) */
    bool no_bundle;     /* --no-bundle: read a neuron's up, gate and down parts as separate requests */
    bool no_read_ahead; /* --no-read-ahead: naive/hybrid read each streamed layer when it is needed, with one layer
                           buffer, instead of reading the next one while the current one is computed; sparse reads
                           the neurons streamed past its cache 256 at a time, not the next chunk while one is
                           computed (ablation) */
    bool no_predictor;  /* --no-predictor: use the true active set (an oracle, to measure the predictor's cost) */
    bool verify_predictor; /* --verify-predictor: also compute the true active set and count misses */
    bool window_keep_rejected; /* --window-keep-rejected: a batch of up to 16 tokens (draft verification) enters the
                                  window as one set; by default, when the next evaluation goes back into it (draft
                                  tokens rejected), the set is trimmed to the accepted tokens' neurons. This keeps
                                  every token's neurons instead (the plain rule, for comparison) */
    double draft_window; /* mode hot with a self-draft (--draft-window): the share (0 .. 0.9) of the FFN neurons kept
                            in memory that holds, per layer, the records of the streamed neurons most active in the
                            recent target passes (a window the self-draft, flm_eval_draft, computes over besides the
                            hottest prefix, and with it each layer's running mean of what the neurons left out add,
                            which the draft adds) instead of a longer prefix. Costs reads (those neurons are still
                            streamed), so it pays only with a self-draft. 0 (default): FLM_AUTO_DRAFT_WINDOW where
                            mode auto runs the self-draft (flm_plan_info.self_draft), else none; < 0: none. Ignored
                            when the FFN has biases (OPT, Phi-2), in other modes and when the whole model fits */
    bool no_draft;      /* --no-draft (or another draft source: a draft model, the n-gram lookup): mode auto running
                           hot does not decode with the self-draft, and the plan holds no room for its buffers */
    float sparse_level; /* --sparse-level: the stored operating point (eps, the share of each layer's FFN output
                           energy left out; `flashlm calibrate` lists them) to run at; 0 = calibrate's default */
    bool kv_f32;        /* --kv-f32: keep keys, values and attention weights in f32. Default (false): store keys and
                           values as f16 (half the memory) and round q and the attention weights to f16, as
                           llama.cpp's f16 KV cache does, so outputs agree with llama.cpp's */
    int draft_vocab;    /* the self-draft's output layer (flm_eval_draft, draft trees) covers token ids < draft_vocab
                           only, the others' logits -inf (never proposed; the verification decides every token, so
                           output is unchanged): 0 = FLM_DRAFT_VOCAB when the vocabulary has more than twice as
                           many tokens, else all; < 0 = all */
    /* the library's surroundings: nothing is implicit */
    flm_log_fn log;        /* log callback for messages while opening and running (NULL: dropped); see above */
    void *log_user;        /* passed to log */
    const char *io_cost_path; /* a `flashlm probe-disk` result (JSON) whose fitted I/O cost model the reader uses;
                                 NULL: the default model. Nothing is read unless named here (the CLI passes
                                 "<model>.probe.json" when that file exists). A file that cannot be used is logged
                                 (FLM_LOG_WARN) and the default model is used. */
} flm_params;

/* The self-draft's default output vocabulary (flm_params.draft_vocab): byte-level BPE ids are in merge order, the
 * frequent tokens first, so a large vocabulary's first ids carry nearly all the draft's likely proposals at a fifth
 * of the output layer's cost (Qwen2.5: 32768 of 151936). */
#define FLM_DRAFT_VOCAB 32768

/* Mode auto's speculative decoding (flm_plan_info.self_draft): where auto runs hot with neurons streamed, a session
 * (flm_session_create) decodes with the self-draft as a tree of FLM_AUTO_DRAFT_TREE nodes, FLM_AUTO_DRAFT_DEPTH
 * levels deep, the draft length chosen from measured costs; the self-draft's window takes FLM_AUTO_DRAFT_WINDOW of
 * the FFN memory. Measured on Qwen2.5-Coder-1.5B at --mem 50% (docs/SPECULATIVE.md). */
#define FLM_AUTO_DRAFT_TREE 12
#define FLM_AUTO_DRAFT_DEPTH 6
#define FLM_AUTO_DRAFT_WINDOW 0.2

/* Fill p with the defaults above. */
FLM_API void flm_params_default(flm_params *p);

/* Parse a budget: "N" bytes, with an optional K/M/G/T suffix (powers of 1024; "Ki", "KB", "KiB" alike), or "N%" of
 * the model's weights; N is decimal digits with an optional fraction ("1.5G"; a plain byte count must be whole: no
 * sign, exponent or hex). "0" means no budget. Returns false on a malformed value. */
FLM_API bool flm_parse_mem(const char *s, uint64_t *bytes, double *percent);

/* Open a model file: a GGUF file (run with every weight in memory) or a .flm flash layout (made by flashlm convert;
 * FFN weights are streamed according to params->mode and the budget). Validates the file before use.
 * Errors: FLM_ERR_IO, FLM_ERR_FORMAT, FLM_ERR_UNSUPPORTED, FLM_ERR_NOMEM, FLM_ERR_ARG (bad params),
 * FLM_ERR_CHECKSUM (corrupt .flm), FLM_ERR_BUDGET (the budget cannot hold the resident part: the message gives each
 * part's size; a budget below the resident weights alone is refused before they are loaded, with their size);
 * the message names the file and the problem. flm_open carries out the plan flm_plan computes for the same path and
 * parameters (the same mode, the same bytes per part; the same errors when the budget cannot hold it): nothing is
 * decided again here. */
FLM_API flm_status flm_open(const char *path, const flm_params *p, flm_ctx **out, flm_error *err);
FLM_API void flm_close(flm_ctx *ctx);
/* Replace the context's log callback (initially params->log); fn NULL drops messages from now on. */
FLM_API void flm_set_log_callback(flm_ctx *ctx, flm_log_fn fn, void *user);

/* ---------------------------------------------------------------------------------------------------------------
 * The memory plan (docs/ARCHITECTURE.md, "Memory budget")
 *
 * One function decides how a model is held under a budget: flm_plan. It resolves --mem (bytes, or a percentage of
 * the model's weight bytes), picks the mode `auto` runs and says why, and sizes every part the budget must hold.
 * flm_open carries out exactly that plan; flm_get_plan returns it from an open context.
 * ------------------------------------------------------------------------------------------------------------- */
/* Where the token embedding lives. */
typedef enum flm_plan_embd {
    FLM_PLAN_EMBD_MEMORY = 0,  /* in memory (part of resident): the mode keeps it (ram; hybrid when all fits) */
    FLM_PLAN_EMBD_FLASH = 1,   /* left in the .flm file: one row (embd_row bytes) read per token */
    FLM_PLAN_EMBD_TIED = 2,    /* in memory: it is also the output classifier */
    FLM_PLAN_EMBD_UNSPLIT = 3, /* in memory: the file predates the split resident region (convert it again) */
} flm_plan_embd;

#define FLM_PLAN_REASON_MAX 512
#define FLM_PLAN_DEVICES_MAX 4
/* One device's share of a plan: the memory of the host, or of a device a backend computes on. */
typedef struct flm_plan_device {
    char name[16];  /* "host", or the backend's device */
    uint64_t bytes; /* the plan's bytes this device holds; the devices' bytes sum to flm_plan_info.total */
    uint64_t block; /* of them, the one block the context's backend asks of this device at open: the KV caches
                       (kv), and of scratch the activations, tree, output rows, work area, statistics ring and other
                       sequences' logits rows, with their alignment; 0 on a device the backend does not compute on */
} flm_plan_device;
/* A plan. Every size in bytes. total = resident + kv + scratch + reader + ffn_resident + stream + predictors +
 * cache + spec; all but spec are what flm_get_stats reports once open (mem_resident + mem_ffn + mem_kv +
 * mem_scratch), spec is what a session's speculative decoding allocates (flm_session_create). */
typedef struct flm_plan_info {
    flm_mode mode;            /* the mode flm_open runs: never FLM_MODE_AUTO */
    char reason[FLM_PLAN_REASON_MAX]; /* why this mode, one line without a newline ("asked for", "the whole model
                                         fits", "not calibrated", or why sparse was not taken) */
    bool gguf;                /* a GGUF file: every weight mapped in memory, mode ram */
    uint64_t budget;          /* the budget: mem_bytes, or mem_percent of model_bytes; 0 = none */
    uint64_t model_bytes;     /* all weights: a .flm's resident region + FFN regions (each 4 KiB-padded); a GGUF's
                                 file size */
    uint64_t total;           /* the sum of the parts below: what the budget holds (<= budget when there is one) */
    /* the parts */
    uint64_t resident;        /* resident weights: embeddings, attention, norms, output, tokenizer (less the token
                                 embedding when it stays on flash) */
    uint64_t kv;              /* KV cache */
    uint64_t scratch;         /* activations (batches of n_batch tokens), FFN accumulators, tokenizer copies, the
                                 statistics ring, the embedding row buffer, and the compute threads past the first 8
                                 (80 KiB each: stack, TLS, OpenMP state; the first are in FLM_RSS_ALLOWANCE) */
    uint64_t reader;          /* reader bounce buffers (reader_bounce), request queues, and its worker threads past
                                 the first 32 (80 KiB each; --io threads, or auto without io_uring) */
    uint64_t ffn_resident;    /* FFN of the layers kept in memory (ram: all; hybrid: the first n_resident_layers) */
    uint64_t stream;          /* buffers streamed FFN weights are read into (naive/hybrid: n_stream_buffers
                                 layers; sparse: neurons past the cache and the batches' sets) */
    uint64_t predictors;      /* sparse: the predictors */
    uint64_t cache;           /* sparse: the neuron caches of all layers (the rest of the budget) */
    uint64_t spec;            /* the buffers of auto's speculative decoding (flm_spec_buffer_bytes of the tree below,
                                 sampling), held inside the budget: the model's parts are planned under budget - spec;
                                 0 unless self_draft */
    /* speculative decoding, as mode auto decides it: the session applies it (flm_session_create) */
    bool self_draft;          /* mode auto runs hot with neurons streamed (and no flm_params.no_draft): decode with the
                                 self-draft */
    int draft_tree;           /* self_draft: the tree's nodes (FLM_AUTO_DRAFT_TREE) */
    int draft_depth;          /* self_draft: its levels, the draft length's bound (FLM_AUTO_DRAFT_DEPTH) */
    /* details */
    flm_plan_embd embd;       /* where the token embedding lives */
    uint64_t embd_bytes;      /* its bytes */
    uint64_t embd_row;        /* FLM_PLAN_EMBD_FLASH: bytes of one row */
    uint64_t reader_bounce;   /* the reader's bounce buffers (inside reader) */
    uint32_t n_layers, n_resident_layers; /* layers; those whose FFN stays in memory */
    double hot_share;         /* hot: the share of every layer's FFN neurons kept in memory as its hottest prefix
                                 (0..1); else 0 */
    double window_share;      /* hot: the share of every layer's FFN neurons held in the self-draft's window of
                                 recently active streamed neurons (flm_params.draft_window); else 0 */
    uint64_t window;          /* hot: bytes of the windows (records, indices, scores, the draft's corrections;
                                 inside ffn_resident) */
    uint32_t n_stream_buffers; /* naive/hybrid: 2 with read-ahead, else 1 (0: nothing streams) */
    uint32_t n_ctx;           /* KV cache length, tokens (params n_ctx 0 resolved) */
    uint32_t n_batch;         /* tokens per batched forward pass */
    uint32_t kv_elem_bytes;   /* 2 (f16) or 4 (f32, --kv-f32) */
    uint32_t kv_dim;          /* keys (and values) per token and layer: n_kv_heads * head_dim */
    uint32_t n_vocab;         /* the model's vocabulary (logits per token) */
    uint64_t out_flash_bytes; /* the classifier's bytes left on flash and read every pass (0: all in memory): when
                                 the plan does not fit otherwise in a mode that streams (docs/ARCHITECTURE.md,
                                 "Memory budget"); not part of resident */
    uint32_t out_rows_resident; /* classifier rows held in memory (the first ones: the self-draft's vocabulary when
                                   it fits; n_vocab when nothing streams) */
    uint64_t out_chunk;       /* out_flash_bytes > 0: bytes read per request into a chunk buffer (in scratch; two
                                 of them unless no_read_ahead: the next chunk is read while one is multiplied) */
    /* the budget per device: device[0] is the host; a backend that computes on a device of its own adds it, holding
       its block (and the host the rest). flm_plan and flm_open's CPU backend: the host alone, holding total */
    uint32_t n_devices;       /* 1 .. FLM_PLAN_DEVICES_MAX */
    flm_plan_device device[FLM_PLAN_DEVICES_MAX];
} flm_plan_info;

/* The plan flm_open would carry out for path and p (NULL: defaults), without opening the model: reads the .flm
 * file's header and the resident region's metadata (hyper-parameters, tensor table), and, in auto mode under a
 * budget with a calibrated model, its predictor region (the predicted sets' sizes); a GGUF file is mapped, its
 * weights not read. Nothing the plan sizes is allocated.
 * Errors: those of flm_open's checks, with the same messages: FLM_ERR_IO, FLM_ERR_FORMAT, FLM_ERR_UNSUPPORTED,
 * FLM_ERR_ARG (bad params; a streaming mode on a GGUF; sparse without calibration), FLM_ERR_BUDGET (the budget
 * cannot hold the plan: every part's size in the message), FLM_ERR_NOMEM; *out is then all zero. Source:
 * docs/ARCHITECTURE.md, "Memory budget". */
FLM_API flm_status flm_plan(const char *path, const flm_params *p, flm_plan_info *out, flm_error *err);
/* The budget in bytes p asks for with the model at path (mem_bytes, or mem_percent of its weight bytes: a .flm's
 * resident and FFN regions, a GGUF's size), without planning: what --parallel slots or two models share.
 * *budget 0: none. Errors: FLM_ERR_IO, FLM_ERR_FORMAT (a .flm header that cannot be read). */
FLM_API flm_status flm_plan_budget_bytes(const char *path, const flm_params *p, uint64_t *budget, flm_error *err);
/* The plan an open context carries out (as flm_plan gave it; reader holds the reader's real size when that was
 * larger than planned). */
FLM_API void flm_get_plan(const flm_ctx *ctx, flm_plan_info *out);

/* One budget for a draft model and a target model (speculative decoding). */
typedef struct flm_plan_pair {
    uint64_t budget;     /* the whole budget: target->mem_bytes, or target->mem_percent of the target's weights */
    uint64_t extra;      /* the caller's own buffers taken out of it (extra_bytes) */
    flm_plan_info draft; /* the draft's plan (draft.budget: open the draft with mem_bytes = draft.budget) */
    flm_plan_info target; /* the target's (target.budget: open the target with mem_bytes = target.budget) */
} flm_plan_pair;
/* Split one budget between a draft model (draft_path, opened with draft params; NULL: no draft model) and a target
 * model (target_path, target params), next to extra_bytes the caller holds beside them (e.g. speculative decoding's
 * buffers). The budget is the target's: target->mem_bytes, or target->mem_percent of the target's weight bytes
 * (draft->mem_bytes and mem_percent are ignored). The draft is planned first under the whole budget, then the
 * target under what the draft and extra_bytes leave; with no draft model, the target keeps the whole budget when its
 * plan and extra_bytes fit in it, else it gets budget - extra_bytes. Without a budget each is planned with none.
 * draft.total + extra + target.total <= budget. Open each with mem_bytes = its plan's budget (mem_percent 0).
 * Errors: those of flm_plan (the draft's messages start "draft model: "); FLM_ERR_BUDGET when the draft and
 * extra_bytes leave nothing for the target (the message names both files and the draft's parts). */
FLM_API flm_status flm_plan_split(const char *target_path, const flm_params *target, const char *draft_path,
                                  const flm_params *draft, uint64_t extra_bytes, flm_plan_pair *out, flm_error *err);

/* Run one token at position pos (0-based) through the model and point *logits at the n_vocab next-token logits
 * (valid until the next call). Positions are fed in order 0, 1, 2, ...; pos may also go back to any earlier
 * position p (0 restarts): the context then forgets positions >= p (rejected draft tokens, a regenerated reply).
 * Errors: FLM_ERR_ARG (token out of range, pos >= n_ctx, or pos past the next position), FLM_ERR_IO (a weight read
 * failed), FLM_ERR_CHECKSUM (non-finite data). After an error the context holds positions < pos, as before the call:
 * evaluating pos again is correct. */
FLM_API flm_status flm_eval(flm_ctx *ctx, int32_t token, int32_t pos, const float **logits, flm_error *err);

/* The self-draft (docs/SPECULATIVE.md): flm_eval with every FFN computed over the neurons the hot mode keeps in
 * memory only (with a window, flm_params.draft_window: plus each layer's running mean of what the other neurons
 * added in recent target passes) — attention, norms and the classifier exact, nothing read from flash. Its logits
 * approximate the model's; the keys and values it stores at pos are approximate too, so the caller evaluates pos
 * again exactly (flm_eval_batch over the drafted tokens: the verification pass) before anything depends on them.
 * Same arguments and errors as flm_eval, plus FLM_ERR_ARG when ctx does not run mode hot (flm_has_self_draft). */
FLM_API flm_status flm_eval_draft(flm_ctx *ctx, int32_t token, int32_t pos, const float **logits, flm_error *err);
/* true when ctx runs mode hot with some neurons streamed (a self-draft is then cheaper than the model itself). */
FLM_API bool flm_has_self_draft(const flm_ctx *ctx);

/* Run n tokens at positions pos, pos + 1, ..., pos + n - 1 (pos as in flm_eval: the next position or an earlier
 * one) in batched forward passes of up to n_batch tokens (flm_params.n_batch): each resident weight matrix is read
 * once per batch, and a streamed FFN layer's weights once per batch for all its tokens (sparse: the union of the
 * tokens' predicted neurons; each token is computed over its own set). The results equal n flm_eval calls (logits
 * to float rounding). Used for prompts and for verifying draft tokens (speculative decoding).
 *   logits_all: NULL, or the caller's n * n_vocab floats that receive every token's next-token logits (row i: after
 *               tokens[0..i]);
 *   logits:     NULL, or set to the last token's logits (inside logits_all, or the context's, valid until the next
 *               call).
 * Statistics: each token gets an equal share of its batch's I/O, memory and compute time and bytes (counts split
 * so that the tokens' shares add up to the batch's: the totals stay exact).
 * Errors: those of flm_eval, FLM_ERR_ARG (n == 0, tokens NULL, pos + n > n_ctx: nothing is run). After an error
 * the context holds positions < pos (as before the call). */
FLM_API flm_status flm_eval_batch(flm_ctx *ctx, const int32_t *tokens, uint32_t n, int32_t pos, float *logits_all,
                                  const float **logits, flm_error *err);

/* The embedding of n tokens as llama.cpp's server gives it with --embeddings --pooling mean: the tokens' final
 * states (after the output norm, the classifier's input), averaged over the tokens and scaled to unit Euclidean
 * length (its default normalisation). out: the caller's d_model floats (flm_model_info.d_model). The tokens are
 * evaluated from position 0 of ctx: its KV cache then holds them (whatever it held before is forgotten, as
 * flm_eval_batch at 0). Allocates nothing: its sum and row are carved at open (the plan's scratch).
 * Errors: FLM_ERR_ARG (n == 0, ids NULL or out of range, n > n_ctx, out NULL), those of flm_eval_batch; after an
 * error the context holds nothing. */
FLM_API flm_status flm_embed(flm_ctx *ctx, const int32_t *ids, uint32_t n, float *out, flm_error *err);
/* Tree evaluation (tree attention: SpecInfer, Miao et al. 2024; SpecExec; Sequoia): n_nodes candidate tokens
 * tokens[i] whose parents are parent[i] (an earlier node, or -1: the node follows the context directly). Node i takes
 * KV cache slot pos + i and position pos + depth(i) (a root's depth is 0); it attends to the context's positions
 * < pos and to its own ancestors, so its logits are those of evaluating the context plus its path token by token
 * (bit for bit in every mode but sparse: the masked positions add exact zeros). Nodes [first, n_nodes) are evaluated,
 * in batches of n_batch; their logits go to logits[(i - first) * n_vocab]. logits NULL: no output layer now (a
 * verification needs the logits of the path it keeps, not of every node): flm_tree_logits gives a node's on demand;
 * then n_nodes - first must fit one batch (n_batch) or be 1. Nodes [0, first) must be held
 * from the previous call on the same tree (same pos, same earlier nodes): a draft grows its tree a level at a time.
 * draft: every FFN over its resident neurons, as flm_eval_draft (mode hot). pos <= flm_n_past; the context keeps
 * positions < pos; the nodes stay apart until flm_tree_accept keeps one path (any other evaluation forgets them).
 * A tree has at most FLM_TREE_MAX_NODES nodes (its ancestor matrix is carved at open, in the plan's scratch).
 * Errors: FLM_ERR_ARG (a parent not earlier, ids out of range, pos + n_nodes > n_ctx, more than FLM_TREE_MAX_NODES
 * nodes, first > the nodes held, a path longer than a sliding window, draft outside mode hot, mode sparse: it chooses
 * neurons per position), those of flm_eval; after an error the context holds positions < pos and the nodes before
 * the failed batch. */
#define FLM_TREE_MAX_NODES 256
FLM_API flm_status flm_eval_tree(flm_ctx *ctx, const int32_t *tokens, const int32_t *parent, uint32_t n_nodes,
                                 uint32_t first, int32_t pos, bool draft, float *logits, flm_error *err);
/* logits[n_vocab] of node `node` of the last flm_eval_tree called without logits (node in its [first, n_nodes)), equal
 * to what that call would have written with a buffer, bit for bit; valid until the next evaluation or accept.
 * Errors: FLM_ERR_ARG (no such node held), FLM_ERR_CHECKSUM / FLM_ERR_FORMAT (not finite: corrupt weights). */
FLM_API flm_status flm_tree_logits(flm_ctx *ctx, uint32_t node, float *logits, flm_error *err);
/* flm_tree_logits of n nodes at once (nodes[0..n), any order, repeats allowed): logits[i * n_vocab] gets node
 * nodes[i]'s, bit for bit flm_tree_logits's, with the classifier run as one matrix-matrix product (its weights read
 * once for the n nodes: a verification that expects to walk several nodes asks for them together).
 * Errors: FLM_ERR_ARG (n == 0, a node not held), FLM_ERR_NOMEM, those of flm_tree_logits. */
FLM_API flm_status flm_tree_logits_n(flm_ctx *ctx, const uint32_t *nodes, uint32_t n, float *logits, flm_error *err);
/* Keep one path of the tree flm_eval_tree evaluated at pos: nodes path[0..m) (a root, then each node a child of the
 * one before: strictly increasing indices) become positions pos .. pos + m - 1 of the context (their keys and values
 * move to those slots); flm_n_past is then pos + m. m = 0 keeps none. Errors: FLM_ERR_ARG (no tree held at pos, a
 * node not held, indices not increasing), nothing changed. */
FLM_API flm_status flm_tree_accept(flm_ctx *ctx, int32_t pos, const uint32_t *path, uint32_t m, flm_error *err);
/* flm_tree_logits_n and flm_tree_accept on sequence seq of a context of several (flm_params.n_seq), from any thread
 * without flm_seq_acquire (they take the context for the call, as flm_seq_acquire would: never while holding it): the
 * tree its last evaluation held, a joined one included (flm_evaluate with join and parent), whose nodes' final states
 * the sequence keeps (other sequences' passes between the evaluation and these calls change nothing). Bit for bit
 * the same logits as flm_eval_tree's of the same nodes. Errors: FLM_ERR_ARG (seq out of range), those of
 * flm_tree_logits_n and flm_tree_accept. Source: src/runtime/context.c. */
FLM_API flm_status flm_seq_tree_logits_n(flm_ctx *ctx, uint32_t seq, const uint32_t *nodes, uint32_t n, float *logits,
                                         flm_error *err);
FLM_API flm_status flm_seq_tree_accept(flm_ctx *ctx, uint32_t seq, int32_t pos, const uint32_t *path, uint32_t m,
                                       flm_error *err);

/* The next position flm_eval expects (tokens held in the context). */
FLM_API int32_t flm_n_past(const flm_ctx *ctx);

/* ---- sequences: one model, several KV caches (flm_params.n_seq) ----
 * A context opened with n_seq > 1 holds the weights once and n_seq sequences, each its own KV cache, position
 * (flm_n_past), tree and logits row. Every call on the context (flm_eval*, flm_eval_tree, flm_tree_*, flm_kv_shift,
 * flm_embed, flm_n_past) works on the current sequence; sequence 0 is current after flm_open. Threads that share a
 * context each take it with flm_seq_acquire (a mutex: one evaluation at a time) and give it back with
 * flm_seq_release; logits returned for a sequence stay valid while other sequences are evaluated (each sequence has
 * its own row), until that sequence's next evaluation. The statistics (flm_get_stats) count every sequence's
 * tokens. */
#define FLM_SEQ_MAX 256
/* The sequences ctx holds (flm_params.n_seq, at least 1). */
FLM_API uint32_t flm_n_seq(const flm_ctx *ctx);
/* Lock ctx (blocking while another thread holds it) and make sequence seq current. Errors: FLM_ERR_ARG (seq >=
 * flm_n_seq; nothing is locked then). */
FLM_API flm_status flm_seq_acquire(flm_ctx *ctx, uint32_t seq, flm_error *err);
/* Unlock ctx after flm_seq_acquire (the sequence stays current until the next acquire). */
FLM_API void flm_seq_release(flm_ctx *ctx);

/* The context shift (llama.cpp's --context-shift; llama_memory_seq_rm + llama_memory_seq_add): make room in a full
 * context without evaluating anything again. The context holds positions [0, n_past) (n_past = flm_n_past); this
 * forgets positions [n_keep, n_keep + n_discard) and moves positions [n_keep + n_discard, n_past) down by n_discard
 * to [n_keep, n_past - n_discard): their values are moved as they are, and their keys, stored after RoPE, are turned
 * by the position difference (normal or NEOX pair order as the architecture's, each layer's own RoPE base: the local
 * one on sliding-window layers; only the first rope_dim dimensions of each head), for f16 and f32 KV caches alike.
 * Afterwards flm_n_past is n_past - n_discard: the next token goes there, and attends to the kept tokens and the
 * moved ones as if they had been evaluated at their new positions (the moved tokens' keys and values still carry
 * what they saw of the discarded ones). A moved key equals the key a fresh evaluation at its new position stores, up
 * to the cache's rounding (f16: about 1e-3 relative). Typical use, as llama.cpp: n_keep = the tokens to keep at the
 * start (BOS, a system prompt), n_discard = (n_past - n_keep) / 2.
 *   n_keep:    tokens kept at the start, >= 0
 *   n_discard: tokens forgotten after them, >= 0 (0: nothing happens), n_keep + n_discard <= n_past
 * Costs one pass over the moved part of the KV cache (every layer); allocates nothing.
 * Errors: FLM_ERR_ARG (ctx NULL, n_keep or n_discard negative, n_keep + n_discard > n_past): the context is
 * unchanged. */
FLM_API flm_status flm_kv_shift(flm_ctx *ctx, int32_t n_keep, int32_t n_discard, flm_error *err);

/* Model facts. */
typedef struct flm_model_info {
    const char *arch;                 /* "llama" */
    uint32_t d_model, d_ffn, n_layers, n_heads, n_kv_heads, head_dim, n_vocab, n_ctx_train;
    uint32_t n_ctx;                   /* this context's KV cache length */
    float norm_eps, rope_theta;
    int32_t bos, eos;                 /* token ids, -1 when absent */
    const char *kernels;              /* kernel level in use: "scalar", "avx2", "avxvnni", "avx512", "vnni", "neon",
                                         "dotprod" (flm_kernels_in_use) */
} flm_model_info;
FLM_API void flm_get_info(const flm_ctx *ctx, flm_model_info *info);

/* ---------------------------------------------------------------------------------------------------------------
 * Statistics (the paper's cost model, Knowl 1: L = L_flash + L_memory + L_compute)
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct flm_token_stats {
    double io_ms;        /* L_flash: waiting for weight reads */
    double mem_ms;       /* L_memory: placing loaded weights (copies, cache bookkeeping) */
    double compute_ms;   /* L_compute: everything else in the forward pass */
    uint64_t bytes_read; /* bytes transferred from flash (incl. alignment and coalesced gaps) */
    uint64_t n_reads;    /* device read requests */
    /* sparse mode, summed over layers */
    uint64_t n_predicted;   /* neurons predicted active */
    uint64_t n_loaded;      /* neurons read from flash (not in the window) */
    uint64_t n_reused;      /* neurons already cached */
    uint64_t rows_used;     /* neuron-cache rows in use after the token */
    uint64_t n_true;        /* --verify-predictor: truly active neurons */
    uint64_t n_true_pos;    /* --verify-predictor: truly active and predicted */
} flm_token_stats;

/* ---- sequences (above): joined evaluations ---- */
/* Evaluate n tokens at positions pos .. pos + n - 1 of sequence seq (pos <= that sequence's n_past: later positions
 * are forgotten, as flm_eval_batch), from any thread, without flm_seq_acquire: calls on other sequences that wait at
 * the same time join one forward pass (continuous batching: every row attends over its own sequence's cache, each
 * weight is read once for all rows, a streamed FFN layer read once per pass), as many as one batch holds (n_batch
 * rows; a longer evaluation runs alone in pieces). *logits gets the last token's n_vocab logits, the sequence's own
 * row (valid until that sequence's next evaluation); stats, when not NULL, gets its rows' share of the pass (added
 * to). The tokens are bit for bit those of evaluating each sequence alone. Mode sparse runs the joined requests one
 * after another. Errors: FLM_ERR_ARG (seq >= flm_n_seq, no tokens or no logits), and those of flm_eval_batch. */
FLM_API flm_status flm_eval_seq(flm_ctx *ctx, uint32_t seq, const int32_t *tokens, uint32_t n, int32_t pos,
                                const float **logits, flm_token_stats *stats, flm_error *err);
/* Say that sequence seq evaluates nothing more for now (its generation ended). A sequence that took part in a joined
 * pass is expected back: the next pass waits for its next flm_eval_seq (a few milliseconds at most, so that the
 * sequences decoding together stay in one pass instead of alternating between smaller ones); after this call it is
 * waited for only by a pass that is not a draft, and only until it left 1/8 of the last pass's time ago (5 to 100 ms):
 * its client's next request (on seq, or on a sequence not expected: either ends the wait for it), which then joins
 * that pass instead of reading a streamed model again in a pass of its own; and only if another sequence was busy
 * (flm_seq_busy) when it left (one client alone is not waited for). flm_seq_acquire (a turn alone) stops the waiting at once. Sessions call it when a generation ends.
 * NULL ctx or seq out of range: nothing. */
FLM_API void flm_seq_leave(flm_ctx *ctx, uint32_t seq);
/* How many sequences other than seq are busy: evaluated (flm_evaluate, joined or not) within the last 2 s and have
 * not left since (flm_seq_leave). A session that could take the context alone for a speculative step decodes joined
 * instead while others are busy (one pass for every sequence's token beats a pass per sequence). Thread-safe; 0 for a
 * NULL ctx or a context of one sequence. Source: src/runtime/context.c. */
FLM_API uint32_t flm_seq_busy(flm_ctx *ctx, uint32_t seq);

/* ---- one evaluation call that returns its own statistics ----
 * flm_evaluate is every evaluation above in one call (flm_eval, flm_eval_draft, flm_eval_batch, flm_eval_seq and
 * flm_eval_tree are it with fixed arguments): the request in flm_eval_args, the logits and the call's own statistics
 * in flm_eval_out. A caller that wants a request's cost sums the flm_call_stats of its calls (flm_call_stats_add)
 * instead of reading flm_get_stats before and after: the totals move with every sequence's calls, the call's figures
 * are its own. */
typedef enum flm_eval_logits {
    FLM_EVAL_LOGITS_LAST = 0, /* the last token's n_vocab logits (flm_eval_out.logits) */
    FLM_EVAL_LOGITS_NONE,     /* none: no output layer (a prompt piece before its last; a tree verified lazily, whose
                                 logits flm_tree_logits gives on demand) */
    FLM_EVAL_LOGITS_ALL,      /* every token's (a tree: every evaluated node's) into logits_all */
    FLM_EVAL_LOGITS_SOME,     /* a tree only: the nodes some[0..n_some) into logits_all (row i: node some[i]), in the
                                 same pass (joined: one classifier pass for every sequence's), bit for bit
                                 flm_tree_logits_n's; the others on demand as with NONE (a verification asks for the
                                 nodes its walk will likely visit) */
} flm_eval_logits;

typedef struct flm_eval_args {
    const int32_t *tokens;  /* [n] token ids, each < n_vocab */
    uint32_t n;             /* tokens (a tree: nodes), >= 1 */
    int32_t pos;            /* position of tokens[0] (a tree: the KV slot of node 0), <= flm_n_past of the sequence */
    uint32_t seq;           /* the sequence (< flm_n_seq). Not joined: it must be the current one (flm_seq_acquire's;
                               0 in a context of one sequence) */
    bool join;              /* flm_eval_seq: from any thread without flm_seq_acquire, joining the passes of the other
                               sequences' calls waiting at the same time (drafts join drafts only, and run first);
                               FLM_EVAL_LOGITS_LAST, or ALL (a speculative step's verification: every row's logits;
                               not with draft). A tree (parent) joins too, its nodes beside the other sequences' rows,
                               bit for bit flm_eval_tree's: logits ALL (a draft's level), or NONE (a verification:
                               flm_seq_tree_logits_n gives its nodes' logits, flm_seq_tree_accept keeps a path) */
    bool draft;             /* the self-draft (flm_eval_draft, mode hot): every FFN over its resident neurons */
    flm_eval_logits logits; /* which logits (FLM_EVAL_LOGITS_LAST when zeroed) */
    float *logits_all;      /* FLM_EVAL_LOGITS_ALL: the caller's n * n_vocab floats (a tree: (n - first) rows, node i
                               in row i - first); NULL otherwise */
    const int32_t *parent;  /* NULL: a causal sequence of tokens. Else a tree (flm_eval_tree): parent[i] is an earlier
                               node or -1; logits FLM_EVAL_LOGITS_ALL or NONE (lazy: flm_tree_logits; joined:
                               flm_seq_tree_logits_n) */
    uint32_t first;         /* a tree: the nodes [first, n) are evaluated, [0, first) held from the previous call;
                               0 without a tree */
    const uint32_t *some;   /* FLM_EVAL_LOGITS_SOME: n_some >= 1 nodes, each in [first, n) (repeats allowed); else
                               NULL and 0 */
    uint32_t n_some;
} flm_eval_args;

/* The statistics of one call: its own figures, not a difference of totals. Bytes, reads and the sparse counts are
 * exact (their sums over calls equal the growth of flm_stats.total when nothing else evaluates); times in ms. */
typedef struct flm_call_stats {
    uint64_t n_tokens;     /* tokens (tree nodes) the call evaluated: what it added to flm_stats.n_tokens (a joined
                              call: its own rows) */
    uint64_t n_passes;     /* forward passes it ran (pieces of n_batch; a joined call: 1, the pass it joined) */
    flm_token_stats total; /* sums over its tokens, as flm_stats.total: io_ms (waiting for flash reads), mem_ms,
                              compute_ms (the passes' wall time less those two), bytes_read, n_reads, the sparse
                              counts; rows_used the level after the call (a joined call: its rows' share of the pass) */
    double io_busy_ms;     /* wall ms during the call in which the context's reader had a read in flight (a joined
                              call: its rows' share of its pass's); 0 when nothing is read from flash. A read a call
                              starts ahead for the next one counts where it is in flight: between calls it counts in
                              none, so a generation's busy share is flm_gen_result.io_busy_ms (its wall window) */
    double ms;             /* wall ms of the call (a joined call: waiting for the pass included) */
    double pass_ms;        /* of ms, the wall ms of the passes it ran: a joined call's whole pass (every sequence's
                              rows) from its start to the call's logits, without the wait for it to begin (queued
                              behind other passes, the leader's wait for the sequences expected back); ms - pass_ms
                              is that wait. Not joined: ms */
} flm_call_stats;

typedef struct flm_eval_out {
    const float *logits;   /* FLM_EVAL_LOGITS_LAST / ALL without a tree: the last token's n_vocab logits (the
                              sequence's row, or inside logits_all), valid until the sequence's next evaluation;
                              else NULL */
    flm_call_stats stats;  /* this call's statistics (after an error: of the passes that completed) */
} flm_eval_out;

/* Evaluate args->n tokens of sequence args->seq from position args->pos as args asks (above; the semantics are those
 * of the call it names: flm_eval_batch for a causal run, flm_eval_draft with draft, flm_eval_tree with parent,
 * flm_eval_seq with join), *out getting the logits and the call's statistics. Every token's statistics are also
 * added to the context's totals and per-token record (flm_get_stats), as before.
 * Errors: FLM_ERR_ARG (ctx, args or out NULL; no tokens; seq out of range, or not current without join; join without
 * a tree and with FLM_EVAL_LOGITS_NONE, or a draft with FLM_EVAL_LOGITS_ALL; a draft outside mode hot; logits_all
 * given without FLM_EVAL_LOGITS_ALL or SOME, or the reverse; first > 0 without a tree, first >= n with one;
 * FLM_EVAL_LOGITS_LAST with a tree, SOME without one, some[] NULL, empty or naming a node not evaluated), and those
 * of the call it names; after an error the context holds
 * what that call's errors say, and out->stats the passes that completed before it. Source: src/runtime/context.c. */
FLM_API flm_status flm_evaluate(flm_ctx *ctx, const flm_eval_args *args, flm_eval_out *out, flm_error *err);
/* sum += a, field by field (rows_used: a's, the later level). For summing a request's calls. */
FLM_API void flm_call_stats_add(flm_call_stats *sum, const flm_call_stats *a);
/* The same for the per-token figures alone (flm_call_stats.total, flm_session_stats.prompt / gen): times, bytes,
 * reads and sparse counts summed, rows_used a's. Source: src/runtime/stats.c. */
FLM_API void flm_token_stats_add(flm_token_stats *sum, const flm_token_stats *a);

#define FLM_STATS_HIST 24
typedef struct flm_stats {
    const char *mode;        /* the mode in effect: "ram", "naive", "hybrid" */
    const char *io_backend;  /* "io_uring", "threads", or "none" (nothing streamed) */
    bool direct_io;          /* reads bypass the page cache with O_DIRECT */
    uint64_t n_tokens;       /* tokens evaluated */
    flm_token_stats total;   /* sums over all tokens */
    uint64_t n_joined;       /* forward passes that joined several sequences' evaluations (flm_eval_seq) */
    uint64_t rows_joined;    /* the rows (tokens) of those passes: rows_joined / n_joined sequences' tokens a pass */
    uint64_t read_hist[FLM_STATS_HIST]; /* read requests by size: bucket b counts [2^(b+9), 2^(b+10)) bytes */
    uint64_t bytes_requested;           /* bytes the engine asked for (before alignment / coalescing) */
    /* memory plan, bytes */
    uint64_t mem_budget;     /* 0 = none */
    uint64_t mem_resident;   /* embeddings, attention, norms, output (the .flm resident region or the GGUF map),
                                less the token embedding when it stays on flash (mem_embd_flash) */
    uint64_t mem_ffn;        /* FFN storage: resident layers + streaming buffer (sparse: predictors + neuron caches +
                                its stream buffer) */
    uint64_t mem_kv;         /* KV cache */
    uint64_t mem_scratch;    /* activations and reader buffers */
    uint64_t model_bytes;    /* all weights */
    uint32_t n_layers, n_ffn_resident_layers;
    uint32_t window;         /* sparse: k */
    uint64_t cache_rows;     /* sparse: neuron-cache capacity summed over layers */
    uint64_t n_streamed;     /* sparse: predicted neurons that did not fit a layer's neuron cache (its set was larger):
                                read into a small stream buffer, computed and discarded (0 unless the budget is tight) */
    uint64_t peak_rss;       /* process peak resident set size so far, bytes (getrusage); with a budget it stays
                                within mem_budget + FLM_RSS_ALLOWANCE */
    uint64_t n_tokens_kept;  /* per-token records held: those of tokens n_tokens - n_tokens_kept .. n_tokens - 1 */
    uint64_t mem_embd_flash; /* bytes of the token embedding left on flash, not in memory (a .flm run naive, hybrid
                                or sparse whose classifier is not tied to it: one row is read per token); else 0 */
    const char *kv_type;     /* KV cache element type: "f16" (default) or "f32" (--kv-f32) */
    uint32_t n_ctx;          /* KV cache length, tokens */
    uint32_t n_batch;        /* tokens per batched forward pass (flm_eval_batch) */
    /* checked reads (flm_params.no_verify_reads) */
    bool reads_verified;     /* every unit read from flash is checked against its record sum */
    uint64_t bytes_verified; /* bytes hashed and compared (the reads since the last reset; retries included) */
    uint64_t n_verify_retries; /* units whose first check failed and were read again (then matched) */
    double verify_ms;        /* CPU ms spent hashing, summed over the threads that did it (mostly reader threads,
                                beside the computation): the cost of checking */
    double io_busy_ms;       /* wall-clock ms since the last reset during which the context's reader had a read in
                                flight (a read-ahead's included; calls never overlap, so this is at most the wall time
                                since the reset): over a generation's wall time, the disk's busy share (issue 30's
                                "the disk never waits on the CPU": 1 when it always has work). 0 when nothing is read
                                from flash after load (ram mode, a GGUF) */
} flm_stats;

/* What the memory budget does not model, and the process's peak RSS may exceed it by: program text and libraries,
 * the C library's and OpenMP's own allocations, thread stacks, allocator slack (docs/ARCHITECTURE.md,
 * "Memory budget"). Peak RSS <= budget + FLM_RSS_ALLOWANCE at every model size (tests/test_scale_rss.c, and
 * tests/test_cli_hardening.c measures it from outside the process). */
#define FLM_RSS_ALLOWANCE (16ull << 20)
/* Per-token statistics are kept for the last FLM_STATS_TOKENS tokens only, in a ring allocated once at open and
 * counted in the memory budget (as scratch); the totals cover every token. */
#define FLM_STATS_TOKENS 256

/* Totals so far. */
FLM_API void flm_get_stats(const flm_ctx *ctx, flm_stats *st);
/* Statistics of the n-th evaluated token since the last reset (0-based); false when n is not among the last
 * FLM_STATS_TOKENS tokens (n < n_tokens - n_tokens_kept or n >= n_tokens). */
FLM_API bool flm_get_token_stats(const flm_ctx *ctx, uint64_t n, flm_token_stats *out);
/* Clear the counters and the per-token record (e.g. between prompt and generation). */
FLM_API void flm_reset_stats(flm_ctx *ctx);
/* (The statistics as a JSON file: flm_write_stats_json, include/flashlm_tools.h: the runtime writes no file.) */

/* ---------------------------------------------------------------------------------------------------------------
 * Tokenizer (SentencePiece BPE or GPT-2 byte-level BPE, from the model's metadata)
 * ------------------------------------------------------------------------------------------------------------- */
/* Encode UTF-8 text into at most cap ids, with BOS first when add_bos and the model adds one
 * (tokenizer.ggml.add_bos_token; EOS last when add_bos and add_eos_token); special tokens are not parsed. Returns
 * how many ids the whole text needs (when more than cap, only cap were written), or SIZE_MAX when out of memory. */
FLM_API size_t flm_tokenize(const flm_ctx *ctx, const char *text, bool add_bos, int32_t *ids, size_t cap);
/* Encode the whole text into a malloc'd array (caller frees) of *n ids, as flm_tokenize; NULL when out of
 * memory. */
FLM_API int32_t *flm_tokenize_all(const flm_ctx *ctx, const char *text, bool add_bos, size_t *n);
/* A text file read as a stream of tokens, piece by piece, only as far as the caller reads: at most 256 KiB of text
 * and its tokens are held at a time, whatever the file's size (a 50 MB text, /dev/zero, a pipe). Each piece ends
 * after its last newline (else its last space, else a character boundary) and is tokenized on its own, as
 * flm_tokenize would tokenize it (add_bos: BOS before the first piece and EOS after the last as the model adds
 * them); a text under 256 KiB gives exactly flm_tokenize's ids. path "-": standard input. A NUL byte ends the
 * stream with an error (FLM_ERR_FORMAT naming the file and the offset: a text has none).
 * open: FLM_ERR_IO (cannot open: the message names the file), FLM_ERR_NOMEM. read: up to cap ids into ids, *n of
 * them; *n < cap only at the end of the text. Errors: FLM_ERR_IO (a read failed), FLM_ERR_FORMAT (NUL),
 * FLM_ERR_NOMEM. */
typedef struct flm_text_stream flm_text_stream;
FLM_API flm_status flm_text_stream_open(const flm_ctx *ctx, const char *path, bool add_bos, flm_text_stream **out,
                                        flm_error *err);
FLM_API flm_status flm_text_stream_read(flm_text_stream *s, int32_t *ids, size_t cap, size_t *n, flm_error *err);
FLM_API void flm_text_stream_close(flm_text_stream *s);
/* The first max tokens of the text file at path (max 0: all of them), through flm_text_stream: *ids malloc'd (the
 * caller frees), *n of them. Nothing past those tokens' piece is read. Errors: those of flm_text_stream_*. */
FLM_API flm_status flm_tokenize_file(const flm_ctx *ctx, const char *path, bool add_bos, size_t max, int32_t **ids,
                                     size_t *n, flm_error *err);
/* Bytes that token id decodes to, given the previous token (a leading space after BOS is dropped); not
 * NUL-terminated, *len bytes, valid while ctx lives. */
FLM_API const char *flm_token_piece(const flm_ctx *ctx, int32_t prev, int32_t id, size_t *len);

#define FLM_TOKENIZE_ADD_SPECIAL 1u   /* BOS / EOS as the model's tokenizer.ggml.add_bos_token / add_eos_token say
                                         (llama.cpp's add_special) */
#define FLM_TOKENIZE_PARSE_SPECIAL 2u /* control tokens spelled out in the text ("<|im_start|>", "<end_of_turn>")
                                         become those tokens (llama.cpp's parse_special) */
#define FLM_TOKENIZE_BOS 8u           /* BOS first when the vocabulary has one, whatever add_bos_token says, and no
                                         EOS (a chat turn: the caller decides with flm_add_bos) */
/* Encode len bytes of UTF-8 text (need not be NUL-terminated) into at most cap ids with FLM_TOKENIZE_* flags.
 * Returns how many ids the whole text needs (only the first cap are written), or SIZE_MAX when out of memory. */
FLM_API size_t flm_tokenize_ex(const flm_ctx *ctx, const char *text, size_t len, unsigned flags, int32_t *ids, size_t cap);
/* flm_tokenize_ex where, with FLM_TOKENIZE_PARSE_SPECIAL, no control token is matched that overlaps one of the n_plain
 * byte ranges [plain[2i], plain[2i + 1]) of text (sorted, disjoint: a chat's message contents, flm_chat_apply_spans):
 * their text gives the tokens plain text gives, so a message cannot spell "<|im_end|>" into a control token. */
FLM_API size_t flm_tokenize_spans(const flm_ctx *ctx, const char *text, size_t len, unsigned flags, const size_t *plain,
                                  size_t n_plain, int32_t *ids, size_t cap);
/* true for the tokens that end a generation or a chat turn (EOS, EOT, "<|im_end|>", "<end_of_turn>", ...). */
FLM_API bool flm_token_is_eog(const flm_ctx *ctx, int32_t id);
/* Tokens in the model's vocabulary (tokenizer.ggml.tokens): ids 0 .. flm_vocab_size - 1. It may differ from
 * flm_model_info.n_vocab, the logits per token (a classifier padded past the vocabulary, or a short one). 0 when ctx
 * is NULL. Source: the GGUF metadata (a .flm file's resident copy of it). */
FLM_API uint32_t flm_vocab_size(const flm_ctx *ctx);
/* The vocabulary string of token id as the model stores it (SentencePiece "▁" for a space, GPT-2's byte characters,
 * "<|im_end|>"), NUL-terminated, valid while ctx lives; "" when id is outside [0, flm_vocab_size) or ctx is NULL.
 * For the bytes a token decodes to, use flm_token_piece. */
FLM_API const char *flm_token_text(const flm_ctx *ctx, int32_t id);
/* Whether the model asks for BOS at the start of a text (tokenizer.ggml.add_bos_token; default true for
 * SentencePiece vocabularies, false for GPT-2 ones except the llama3 pre-tokenizer, as llama.cpp decides): the BOS
 * that FLM_TOKENIZE_ADD_SPECIAL adds. false when ctx is NULL. */
FLM_API bool flm_add_bos(const flm_ctx *ctx);
/* ---------------------------------------------------------------------------------------------------------------
 * Chat templates
 *
 * A GGUF file may carry its Hugging Face chat template (tokenizer.chat_template, a Jinja source). flashlm does not
 * run Jinja: as llama.cpp's llm_chat_detect_template it recognises the family by marker substrings and renders that
 * family's format in C (src/format/chat_template.h lists the families and their markers). The rendered text has no
 * leading BOS (tokenize it with FLM_TOKENIZE_ADD_BOS when flm_add_bos says so) and spells control tokens out
 * ("<|im_start|>"): tokenize it with FLM_TOKENIZE_PARSE_SPECIAL.
 * ------------------------------------------------------------------------------------------------------------- */
/* The names flm_chat_open accepts, for messages. */
#define FLM_CHAT_TEMPLATE_NAMES "chatml, command-r, gemma, llama2, llama3, phi3, zephyr"
/* One conversation turn: role "system", "user" or "assistant" (others pass through where the format has a generic
 * role slot), content UTF-8, both NUL-terminated. */
typedef struct flm_chat_msg {
    const char *role;
    const char *content;
} flm_chat_msg;
typedef struct flm_chat flm_chat;
/* true when name is one of FLM_CHAT_TEMPLATE_NAMES (exact, lower case). */
FLM_API bool flm_chat_name_valid(const char *name);
/* The chat format of an open model: name (one of FLM_CHAT_TEMPLATE_NAMES, e.g. from --chat-template; NULL: none)
 * wins; else the family of the model's tokenizer.chat_template, with the default system prompt it carries (Qwen2.5,
 * SmolLM2); else the one its architecture implies (gemma*); else chatml (llama.cpp's default). *out: free with
 * flm_chat_close; it does not borrow ctx.
 * Errors: FLM_ERR_ARG (ctx or out NULL; name not one of FLM_CHAT_TEMPLATE_NAMES: the message lists them),
 * FLM_ERR_UNSUPPORTED (the model's template is of no known family: the message says to choose one),
 * FLM_ERR_NOMEM. *out is NULL after an error. */
FLM_API flm_status flm_chat_open(const flm_ctx *ctx, const char *name, flm_chat **out, flm_error *err);
/* The format a chat template's source is of (a Jinja template as Hugging Face's tokenizer_config.json or llama.cpp's
 * --chat-template-file give it): one of FLM_CHAT_TEMPLATE_NAMES, static, found by the markers the family's templates
 * carry, in llama.cpp's order (src/llama-chat.cpp, llm_chat_detect_template) — flashlm renders the family, it does
 * not run the Jinja; NULL when len bytes of tmpl carry none (or tmpl is NULL / len 0). */
FLM_API const char *flm_chat_format_of(const char *tmpl, size_t len);
/* The format chosen ("chatml", "gemma", ...), static. */
FLM_API const char *flm_chat_name(const flm_chat *c);
/* How it was chosen, static: "--chat-template" (a name was given), "the model's template", "the architecture",
 * "the default: the model has no chat template". */
FLM_API const char *flm_chat_origin(const flm_chat *c);
/* The system prompt the model's template adds when a conversation has none (Qwen2.5: "You are Qwen, created by
 * Alibaba Cloud. ..."), NUL-terminated, valid until flm_chat_close; NULL when it has none. */
FLM_API const char *flm_chat_system_prompt(const flm_chat *c);
/* Render n messages into the prompt text the template gives them, followed by the assistant turn's opening when
 * add_assistant (Jinja's add_generation_prompt); the template's default system prompt goes first when msgs[0] is
 * not a system message. With add_assistant, a final assistant message is a prefill (llama-server's): the messages
 * before it with the assistant's opening, then its content as it is, left open (no end of turn), so that a
 * generation continues it. *out: malloc'd, NUL-terminated (the caller frees it); *out_len (may be NULL) its length in
 * bytes. Errors: FLM_ERR_ARG (c, out or a role/content NULL), FLM_ERR_NOMEM. */
FLM_API flm_status flm_chat_apply(const flm_chat *c, const flm_chat_msg *msgs, size_t n, bool add_assistant,
                                  char **out, size_t *out_len, flm_error *err);
/* flm_chat_apply, and *spans (malloc'd, the caller frees it; NULL when none) gets *n_spans byte ranges
 * [spans[2i], spans[2i + 1]) of *out: where the messages' contents are (sorted, disjoint), for flm_tokenize_spans.
 * Found by rendering the messages again with each content replaced by a marker and aligning the two renderings; a
 * content the template rewrote beyond trimming (llama2's system prompt joined to the first user message) gets no
 * range. Errors: those of flm_chat_apply. */
FLM_API flm_status flm_chat_apply_spans(const flm_chat *c, const flm_chat_msg *msgs, size_t n, bool add_assistant,
                                        char **out, size_t *out_len, size_t **spans, size_t *n_spans, flm_error *err);
FLM_API void flm_chat_close(flm_chat *c);

/* ---- Tools: OpenAI's function tools in the model's own tool-call format (src/format/chat_tools.c) ----
 * Qwen2.5's ("qwen", from its template): the tools as JSON lines inside <tools></tools> in a "# Tools" block ending
 * the system turn; each call "<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>" in the assistant's
 * turn; each tool's result "<tool_response>\nRESULT\n</tool_response>" in a user turn (consecutive ones in one).
 * JSON in the prompt is written as the template's tojson writes it (Python's json.dumps). */
/* The model's tool-call format, static: "qwen" when the model's own chat template has Qwen2.5's, NULL when it has
 * none (another family, no template, or a format chosen by name). */
FLM_API const char *flm_chat_tool_format(const flm_chat *c);
/* The markers around one call in a generation (static): "<tool_call>" and "</tool_call>" for "qwen". false (NULLs)
 * without a tool format. */
FLM_API bool flm_chat_tool_tags(const flm_chat *c, const char **open_tag, const char **close_tag);
/* A conversation with tools rewritten into plain messages (roles system, user, assistant) that flm_chat_apply renders
 * exactly as the model's template renders the original: tools (a JSON array of OpenAI tools, {"type": "function",
 * "function": {"name", "description", "parameters"}}; NULL or "[]": none) in the system message (the template's
 * default one when msgs has none), each run of role "tool" messages as one user turn, an assistant message i with
 * tool_calls[i] (a JSON array of OpenAI calls {"id", "type", "function": {"name", "arguments": a JSON string}}; the
 * array, or tool_calls[i], may be NULL) with its calls after its content. *out (*n_out messages; roles static,
 * contents malloc'd): free with flm_chat_msgs_free. Errors: FLM_ERR_UNSUPPORTED (no tool format), FLM_ERR_FORMAT
 * (tools or a message's tool_calls not of that shape: named), FLM_ERR_ARG, FLM_ERR_NOMEM. */
FLM_API flm_status flm_chat_tools_messages(const flm_chat *c, const flm_chat_msg *msgs, const char *const *tool_calls,
                                           size_t n, const char *tools, flm_chat_msg **out, size_t *n_out,
                                           flm_error *err);
FLM_API void flm_chat_msgs_free(flm_chat_msg *m, size_t n);
/* One tool call parsed out of a generation. */
typedef struct flm_tool_call {
    char *name;       /* the function's name */
    char *arguments;  /* its arguments: a JSON object, compact (an OpenAI call's "arguments" string) */
} flm_tool_call;
/* The calls in a generated text[0..len): every complete block whose JSON is {"name": a string, "arguments": an
 * object (or a JSON string of one)}, in order; *content (malloc'd, NUL-terminated) gets the text outside them,
 * trimmed of whitespace when there are calls (a block that is not a call, or not closed, stays in it). *calls
 * (malloc'd, *n_calls of them; NULL when none): free with flm_tool_calls_free. Errors: FLM_ERR_UNSUPPORTED (no tool
 * format), FLM_ERR_ARG, FLM_ERR_NOMEM. */
FLM_API flm_status flm_chat_parse_tool_calls(const flm_chat *c, const char *text, size_t len, char **content,
                                             flm_tool_call **calls, size_t *n_calls, flm_error *err);
FLM_API void flm_tool_calls_free(flm_tool_call *calls, size_t n);
/* GBNF (flm_grammar_parse) for a reply made only of calls in the model's format: one call (parallel: one or more,
 * separated by a newline) of one of the tools (only the one named `name` when not NULL), its arguments valid
 * against the tool's "parameters" schema (flm_json_schema_to_gbnf; none: an empty parameter list, `{}` only, as
 * OpenAI's). *out: malloc'd.
 * Errors: FLM_ERR_UNSUPPORTED (no tool format; a keyword of a parameters schema: the message names the tool and the
 * keyword), FLM_ERR_FORMAT (tools not a non-empty array of named functions), FLM_ERR_ARG (no tool called name),
 * FLM_ERR_NOMEM. */
FLM_API flm_status flm_chat_tool_grammar(const flm_chat *c, const char *tools, const char *name, bool parallel,
                                         char **out, flm_error *err);

/* ---------------------------------------------------------------------------------------------------------------
 * Perplexity (teacher-forced, as llama.cpp's perplexity tool computes it)
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct flm_ppl_result {
    double ppl;          /* exp(mean negative log-likelihood) */
    double nll;          /* mean negative log-likelihood, nats per token */
    double nll_stderr;   /* its standard error */
    uint64_t n_scored;   /* tokens scored */
    int n_chunks;        /* chunks evaluated */
} flm_ppl_result;

/* Tokenize text, cut it into chunks of n_chunk tokens (the first of each replaced by BOS), evaluate each chunk from
 * position 0 and score the predictions of its second half (tokens n_chunk/2 .. n_chunk-1), as llama.cpp does.
 * max_chunks > 0 limits the chunks. progress (may be NULL) is called after each chunk with the running perplexity.
 * Each chunk runs in batches (flm_eval_batch): its first half in one call, the scored half 16 tokens at a time with
 * their logits kept (16 * n_vocab floats, allocated here, outside the memory plan).
 * Errors: FLM_ERR_ARG (n_chunk < 4 or > the context; text shorter than one chunk), errors of flm_eval. */
FLM_API flm_status flm_perplexity(flm_ctx *ctx, const char *text, int n_chunk, int max_chunks,
                          void (*progress)(void *user, int chunk, int n_chunks, double ppl), void *user,
                          flm_ppl_result *out, flm_error *err);
/* flm_perplexity of the text file at path ("-": standard input), read as a stream (flm_text_stream): one chunk's
 * tokens at a time, and nothing past the last chunk evaluated (max_chunks > 0), so a text of any size costs the same
 * memory. progress gets n_chunks = max_chunks, or 0 when evaluating to the end (the count is not known ahead). A
 * text over 256 KiB is tokenized in pieces (flm_text_stream), so its ids can differ from flm_perplexity's at the
 * pieces' seams. Errors: those of flm_perplexity and of flm_text_stream_* (FLM_ERR_IO, FLM_ERR_FORMAT for a NUL). */
FLM_API flm_status flm_perplexity_file(flm_ctx *ctx, const char *path, int n_chunk, int max_chunks,
                                       void (*progress)(void *user, int chunk, int n_chunks, double ppl), void *user,
                                       flm_ppl_result *out, flm_error *err);

/* ---------------------------------------------------------------------------------------------------------------
 * Sampling
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct flm_sampler flm_sampler;
/* One entry of a logit bias (OpenAI's logit_bias): bias added to token's logit before sampling (-INFINITY bans it). */
typedef struct flm_logit_bias {
    int32_t token;
    float bias;
} flm_logit_bias;
/* Zero is "off" for every field after seed (a designated initializer of the first four samples as before). */
typedef struct flm_sampler_params {
    float temp;     /* 0 = greedy (argmax of the edited logits, lowest id on ties) */
    int top_k;      /* keep the k most likely tokens; <= 0 = all */
    float top_p;    /* nucleus: keep the smallest set with probability >= top_p (untempered, over the top-k); >= 1 =
                       all */
    uint64_t seed;  /* mt19937's seed: below 2^32 as llama.cpp's 32-bit --seed (the same text); a larger seed folded
                       to 32 bits (seed ^ seed >> 32); the token at key k is a function of (seed, k, its distribution) */
    float min_p;    /* llama.cpp's min-p: keep the tokens with probability >= min_p * the largest (untempered); 0 =
                       off */
    float repeat_penalty;    /* llama.cpp's --repeat-penalty: a logit l of a token in the window becomes l / r when
                                positive, l * r when negative; 0 or 1 = off */
    float presence_penalty;  /* OpenAI's: minus this for a token that occurs in the window (-2..2 in the API) */
    float frequency_penalty; /* OpenAI's: minus this times the token's count in the window */
    int penalty_last_n;      /* the window: the last N tokens of the history (the prompt's included, as llama.cpp's
                                penalties sampler); -1 = all of it; 0 = off (flm_sampler_params_default: 64) */
    const flm_logit_bias *bias; /* n_bias entries (copied by flm_sampler_create; ids outside the vocabulary ignored) */
    size_t n_bias;
} flm_sampler_params;
/* llama.cpp's defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1, no presence/frequency
 * penalty, penalty_last_n 64, no bias; seed 42 (llama.cpp's default seed is random). */
FLM_API void flm_sampler_params_default(flm_sampler_params *p);
/* NULL on allocation failure, n_vocab == 0, or n_bias > 0 with bias NULL. */
FLM_API flm_sampler *flm_sampler_create(const flm_sampler_params *p, size_t n_vocab);
/* Pick the token at key `key` (the position the token will take: a session's n_past plus its context shifts) from
 * n_vocab logits (not modified), after the tokens hist[0..n_hist) (the history the penalties look at; NULL/0: none),
 * as llama.cpp's default sampler chain picks it: the logits edited (logit_bias, repeat penalty, presence and frequency
 * penalties), then greedy (temp <= 0: argmax) or top-k, top-p, min-p (on the untempered logits), temperature, and
 * llama.cpp's dist: the first kept token (most likely first once a filter sorted them) whose running probability
 * reaches u, u the (key - origin)-th double (0-based) of mt19937(seed) through libstdc++'s
 * uniform_real_distribution<double> (flm_sampler_set_origin; past FLM_SAMPLER_STREAM_MAX from it, or before it, a
 * hash of (seed, key)). So the k-th generated token takes llama.cpp's k-th uniform: the same seed gives llama.cpp's
 * text on the same logits, and the same (seed, key, distribution) gives the same token whoever computed the logits:
 * a seeded text is the same in every mode and with or without speculative decoding (a draft is accepted when it is
 * this token). */
FLM_API int32_t flm_sampler_sample_at(flm_sampler *s, const float *logits, uint64_t key, const int32_t *hist,
                                      size_t n_hist);
/* A second draw for key, independent of the first: the same distribution with a uniform hashed from (seed, key) (a
 * grammar's "sample, check, resample under the mask": the first draw's u, conditioned on its token being refused, is
 * no longer uniform; llama.cpp draws a next one from its stream). */
FLM_API int32_t flm_sampler_resample_at(flm_sampler *s, const float *logits, uint64_t key, const int32_t *hist,
                                        size_t n_hist);
/* The key of the first generated token (default 0): key k then takes the (k - key)-th uniform of mt19937(seed), as
 * llama.cpp's sampler, made anew per request, draws one per generated token. A session sets it at each generation's
 * first position. */
FLM_API void flm_sampler_set_origin(flm_sampler *s, uint64_t key);
#define FLM_SAMPLER_STREAM_MAX ((uint64_t)1 << 22) /* keys this far past the origin hash their uniform */
#define FLM_SAMPLER_DRAWS_MAX 16
/* Up to k (1..FLM_SAMPLER_DRAWS_MAX) candidate tokens for key (a draft's): tok[0] is flm_sampler_sample_at's token,
 * then the kept tokens whose stretch of the cumulative distribution lies nearest u (where the draw of a slightly
 * different distribution with the same u lands), nearest first; when prob is not NULL their probabilities in the
 * processed distribution; greedy: the k largest edited logits, prob 1 for the first and 0 for the others. Fewer when
 * fewer tokens are kept. Returns how many (>= 1 when k >= 1). */
FLM_API int flm_sampler_draws_at(flm_sampler *s, const float *logits, uint64_t key, const int32_t *hist,
                                 size_t n_hist, int k, int32_t *tok, float *prob);
/* flm_sampler_sample_at with the key a count of this sampler's calls of flm_sampler_sample (0, 1, ...) and no
 * history (no penalties). */
FLM_API int32_t flm_sampler_sample(flm_sampler *s, const float *logits);
/* The model's log-probabilities (log softmax of the logits at temperature 1 over the whole vocabulary, before any
 * sampler setting: what OpenAI's logprobs and llama-server's n_probs report): returns token's (-INFINITY when out of
 * range), and top_id/top_lp (n_top entries each) get the n_top most likely tokens, most likely first (the lowest id
 * on ties), n_top clamped to [0, n]. */
FLM_API float flm_logprobs(const float *logits, size_t n, int32_t token, int n_top, int32_t *top_id, float *top_lp);
/* The distribution flm_sampler_sample draws from: probs (the caller's n_vocab floats) gets every token's probability
 * after logit_bias, temperature, top-k, top-p and min-p (no penalties: they need a history) — 0 for the tokens they
 * leave out, the kept ones renormalized to sum to 1. With temp 0 (greedy): 1 for the argmax (the lowest id on ties),
 * 0 elsewhere. Uses no random number. */
FLM_API void flm_sampler_probs(flm_sampler *s, const float *logits, float *probs);
/* The distribution flm_sampler_sample_at draws from after the tokens hist[0..n_hist) (flm_sampler_probs with the
 * penalties of that history too; NULL/0: none), summarized as llama-server's post_sampling_probs reports it: returns
 * token's probability (0 when the filters leave it out or it is out of range); top_id/top_p (the caller's n_top >= 0
 * entries each) get the most probable tokens whose probability is > 0, most probable first (the lowest id on ties),
 * and *n_got how many (fewer than n_top when fewer are kept). Greedy (temp <= 0): the argmax with 1. Uses no random
 * number; allocates nothing. */
FLM_API float flm_sampler_top_probs(flm_sampler *s, const float *logits, const int32_t *hist, size_t n_hist,
                                    int32_t token, int n_top, int32_t *top_id, float *top_p, int *n_got);
/* The classic rules below draw from the sampler's own RNG stream (xorshift64* from seed); a session no longer uses
 * them (it accepts a draft when it is flm_sampler_sample_at's token), they stay for callers that have a q.
 * Draw a token from probs (n_vocab non-negative weights; normalized here, so they need not sum to 1) with the
 * sampler's RNG (one draw). Returns -1, drawing nothing, when no weight is positive or one is negative, NaN or
 * infinite. */
FLM_API int32_t flm_sampler_sample_probs(flm_sampler *s, const float *probs);
/* Speculative decoding's acceptance rule (Leviathan et al. 2023, Chen et al. 2023). A draft proposed `token`, drawn
 * from q; the target's distribution is p (both n_vocab probabilities as flm_sampler_probs gives them: p from the
 * target's logits, q from the draft's). The token is accepted with probability min(1, p[token] / q[token]) (one
 * draw of the sampler's RNG); when it is rejected, *out gets a token drawn from normalize(max(0, p - q)) (a second
 * draw), so the token kept is distributed as p whatever q is. q NULL means a certain draft (q = 1 at token, 0
 * elsewhere: a lookup in the text, not a model). Returns true when accepted (*out = token), false when rejected
 * (*out = the replacement, never the rejected token while p has mass elsewhere; when max(0, p - q) has no mass
 * through rounding, it is drawn from p). A token outside [0, n_vocab) is rejected the same way. */
FLM_API bool flm_sampler_accept(flm_sampler *s, const float *p, const float *q, int32_t token, int32_t *out);
/* Several drafts at one position (a tree's children; SpecInfer's multi-step speculative sampling, Miao et al. 2024,
 * Alg. 2): draws[0..n_draws) were drawn independently from q (with repetition). Each in turn is accepted with
 * probability min(1, w(x)/q(x)), w starting as p and becoming norm(max(0, w - q)) after each rejection; when none is
 * accepted, *out is drawn from the last w. Returns the index of the accepted draw (*out = draws[index]), or -1. The
 * token *out is distributed as p whatever q is. Greedy samplers (temp 0) give p and q one-hot: the draw equal to the
 * argmax is accepted. */
FLM_API int flm_sampler_accept_multi(flm_sampler *s, const float *p, const float *q, const int32_t *draws,
                                     int n_draws, int32_t *out);
/* Whether s samples greedily (temp <= 0: argmax). */
FLM_API bool flm_sampler_greedy(const flm_sampler *s);
FLM_API void flm_sampler_free(flm_sampler *s);

/* ---------------------------------------------------------------------------------------------------------------
 * Constrained decoding: grammars and JSON schemas (src/session/grammar.c, json_schema.c; docs/STRUCTURED.md)
 *
 * A grammar constrains a generation (flm_gen_params.grammar): before each token is taken, a token whose bytes cannot
 * continue the text under the grammar is replaced by a draw from the tokens that can (the logits of the others set
 * to -inf), an end-of-generation token is allowed only when the text is a complete sentence, and the generation ends
 * by itself when the sentence is complete and nothing may follow (flm_gen_result.complete). Grammars are written in
 * a subset of llama.cpp's GBNF (grammars/README.md): rules "name ::= alternatives", literals "..." with \n \t \r
 * \\ \" \xHH \uHHHH escapes, classes [a-z] [^...] (non-ASCII only as single characters of a positive class), ".",
 * groups, | * + ? {m} {m,} {m,n} (n <= 4096), comments; no token references, no left recursion. A JSON schema is
 * compiled to such a grammar (the keywords supported are listed in docs/STRUCTURED.md; another is refused by name).
 * A grammar holds its automaton's caches (states, token masks): one generation at a time uses it.
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct flm_grammar flm_grammar;
/* Parse GBNF text (len bytes) with start rule root (NULL: "root"); the automaton's start state is built here.
 * Errors: FLM_ERR_ARG (text or out NULL), FLM_ERR_FORMAT (a syntax error, an undefined rule, no start rule: the
 * message gives the line), FLM_ERR_UNSUPPORTED (a construct outside the subset, left recursion: named; a start
 * too ambiguous: over 4096 parse stacks before the first byte), FLM_ERR_NOMEM. *out is NULL after an error. No
 * recursion deeper than the group nesting (200): any accepted grammar compiles on a small thread stack. */
FLM_API flm_status flm_grammar_parse(const char *text, size_t len, const char *root, flm_grammar **out,
                                     flm_error *err);
/* Compile a JSON schema (len bytes of JSON) to GBNF text whose start rule is `name` (NULL: "root"; letters, digits
 * and '-'), every other rule named "name-..." (so that several compiled schemas can be joined into one grammar).
 * *out: malloc'd, NUL-terminated; *out_len (may be NULL) its length. Errors: FLM_ERR_FORMAT (not JSON; a keyword
 * with a value of the wrong type; a $ref to nothing), FLM_ERR_UNSUPPORTED (a keyword outside the subset, e.g.
 * "pattern", "format", "minimum": the message names it), FLM_ERR_ARG, FLM_ERR_NOMEM. */
FLM_API flm_status flm_json_schema_to_gbnf(const char *schema, size_t len, const char *name, char **out,
                                           size_t *out_len, flm_error *err);
/* flm_json_schema_to_gbnf then flm_grammar_parse. Errors: theirs. */
FLM_API flm_status flm_grammar_json_schema(const char *schema, size_t len, flm_grammar **out, flm_error *err);
/* Run text (len bytes) through the grammar from its start: FLM_OK when every byte can be taken (*complete, may be
 * NULL: and the text is a complete sentence), FLM_ERR_FORMAT when some byte cannot. Errors: FLM_ERR_ARG,
 * FLM_ERR_NOMEM, FLM_ERR_UNSUPPORTED (the automaton's limits). */
FLM_API flm_status flm_grammar_match(flm_grammar *g, const char *text, size_t len, bool *complete, flm_error *err);
FLM_API void flm_grammar_free(flm_grammar *g);

/* ---------------------------------------------------------------------------------------------------------------
 * Sessions: prompts, generation, stop strings, streaming, cancellation (what `run`, `chat` and `serve` share)
 *
 * A session drives one open context: it holds the tokens the context's KV cache holds, feeds prompts (token ids,
 * text, or chat messages rendered through a chat template), samples replies with its own sampler, stops at an
 * end-of-generation token, a token limit, a full context or a stop string, streams each token and the text it
 * releases through a callback, can be cancelled from another thread, shifts the context when it fills (optional)
 * and counts per-request statistics. It writes nothing to stdout or stderr. A session borrows its context: close the
 * context after flm_session_free, and do not evaluate the context directly while a session uses it. One thread at a
 * time calls a session's functions, except flm_session_cancel (any thread, any time).
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct flm_session flm_session;

/* A session over ctx (borrowed), holding no tokens, greedy sampling (temp 0) until flm_session_sampling, no context
 * shift. Allocates the token history (n_ctx int32) and a small text buffer, outside the memory plan. When ctx's plan
 * says so (mode auto running hot: flm_plan_info.self_draft), it decodes speculatively with the self-draft as the plan
 * sizes it (a tree of draft_tree nodes, draft_depth deep, adaptive), in the buffers the plan held inside the budget
 * (spec); flm_session_speculate replaces or (NULL) ends that.
 * Errors: FLM_ERR_ARG (ctx or out NULL), FLM_ERR_NOMEM. */
FLM_API flm_status flm_session_create(flm_ctx *ctx, flm_session **out, flm_error *err);
/* flm_session_create on sequence seq of ctx (flm_params.n_seq): the session's every call into ctx takes it with
 * flm_seq_acquire(ctx, seq) and gives it back, so sessions on different sequences of one context may run on
 * different threads at once (their evaluations take turns); its statistics count its own evaluations only. The
 * self-draft buffers the plan holds are per sequence. Errors: those of flm_session_create; FLM_ERR_ARG (seq >=
 * flm_n_seq). */
FLM_API flm_status flm_session_create_seq(flm_ctx *ctx, uint32_t seq, flm_session **out, flm_error *err);
/* Free the session (NULL: nothing); the context stays open, holding what was evaluated. */
FLM_API void flm_session_free(flm_session *s);
/* The context the session drives. */
FLM_API flm_ctx *flm_session_ctx(const flm_session *s);
/* Replace the session's sampler by a new one with these parameters; the sampler then lives across generations. A
 * token is drawn with the noise of its position (flm_sampler_sample_at with key = its position, plus the positions a
 * context shift discarded since the text began), so a seed and a prompt give the same text in every mode, at every
 * budget, with or without speculative decoding; generating again at the same positions (a prompt again, a rewind)
 * gives the same tokens, and the penalties see the tokens the context holds. Errors: FLM_ERR_NOMEM (the old sampler
 * is kept). */
FLM_API flm_status flm_session_sampling(flm_session *s, const flm_sampler_params *p, flm_error *err);
/* The context shift (llama.cpp's --context-shift, flm_kv_shift): when on, a generation or flm_session_feed_shift
 * that finds the context full forgets half of positions [n_keep, n_past) (more when needed) and goes on; when off,
 * generation stops there (flm_gen_result.ctx_full). n_keep: positions always kept at the start (BOS, a system
 * prompt); clamped to [0, n_past]. */
FLM_API void flm_session_set_shift(flm_session *s, bool on, int32_t n_keep);
/* Tokens the context holds (the next position). */
FLM_API int32_t flm_session_n_past(const flm_session *s);
/* Forget positions >= n (0: start over); n > n_past is clamped to n_past. The next feed starts at n. A session on a
 * sequence of a shared context (flm_session_create_seq) also leaves it (flm_seq_leave) until it evaluates again. */
FLM_API void flm_session_rewind(flm_session *s, int32_t n);

/* Evaluate ids[0..n) after the tokens held (positions n_past ..). Errors: FLM_ERR_CONTEXT (n_past + n > n_ctx:
 * nothing is run), those of flm_eval_batch (the context then holds what it held before). n == 0 does nothing. */
FLM_API flm_status flm_session_feed(flm_session *s, const int32_t *ids, size_t n, flm_error *err);
/* flm_session_feed, shifting the context whenever it fills (the shift must be on), so ids of any length go through
 * (only their end is then held), and leaving room for one more token. Errors: FLM_ERR_CONTEXT (shift off, or the kept
 * start leaves nothing to discard), those of flm_eval_batch. */
FLM_API flm_status flm_session_feed_shift(flm_session *s, const int32_t *ids, size_t n, flm_error *err);
/* Make the context hold exactly ids[0..n) (a new request's whole prompt): the longest common prefix with the tokens
 * it holds is kept (not evaluated again, as llama-server's prompt cache; at least the last token is evaluated, for its
 * logits) and the rest evaluated. *n_reused (may be NULL) gets the tokens kept. Evaluation in one prefix or another
 * gives the same KV entries, so the result equals evaluating ids from position 0.
 * Errors: FLM_ERR_ARG (n == 0), FLM_ERR_CONTEXT (n >= n_ctx: no room left for a reply; the message gives both),
 * those of flm_eval_batch. */
FLM_API flm_status flm_session_prompt(flm_session *s, const int32_t *ids, size_t n, size_t *n_reused,
                                      flm_error *err);
/* The progress of a prompt's evaluation: processed tokens of total held so far (cached of them kept from before). */
typedef void (*flm_prompt_fn)(void *user, size_t processed, size_t total, size_t cached);
/* flm_session_prompt, the tokens not kept evaluated chunk at a time (0: all at once; each chunk still goes through
 * the context's batches), fn (may be NULL) called before the first chunk (processed == cached) and after each (the
 * last: processed == total): llama-server's prompt progress. The same tokens, cache and logits as flm_session_prompt.
 * With chunk > 0 a cancellation (flm_session_cancel, from fn or another thread, after this call began) is checked
 * before each chunk: FLM_ERR_CANCELLED, the context then holding the prompt's first `processed` tokens (fn's last
 * report; the logits are not those of the prompt's last token).
 * Errors: those of flm_session_prompt (fn is then not called again), FLM_ERR_CANCELLED. */
FLM_API flm_status flm_session_prompt_progress(flm_session *s, const int32_t *ids, size_t n, size_t chunk,
                                               flm_prompt_fn fn, void *user, size_t *n_reused, flm_error *err);
/* flm_session_prompt of text tokenized with FLM_TOKENIZE_* flags (plain text: FLM_TOKENIZE_ADD_SPECIAL, as
 * flm_tokenize with add_bos). Errors: those of flm_session_prompt; FLM_ERR_ARG (no tokens), FLM_ERR_NOMEM. */
FLM_API flm_status flm_session_prompt_text(flm_session *s, const char *text, size_t len, unsigned flags,
                                           size_t *n_reused, flm_error *err);
/* Whether control tokens spelled out in chat message contents ("<|im_end|>") are parsed as control tokens
 * (--allow-special-in-content); by default (false) a content tokenizes as plain text does (flm_chat_apply_spans and
 * flm_tokenize_spans), so a message cannot close its turn and forge another. For flm_session_prompt_chat and
 * flm_session_chat_turn. */
FLM_API void flm_session_set_special_in_content(flm_session *s, bool allow);
/* The prompt of a chat request: msgs rendered through t (flm_chat_apply with the assistant's opening; a final
 * assistant message is continued), tokenized with FLM_TOKENIZE_PARSE_SPECIAL outside the contents (see
 * flm_session_set_special_in_content) and BOS when flm_add_bos (the tokens `flashlm run --chat` feeds), then
 * flm_session_prompt. Errors: those of flm_chat_apply and flm_session_prompt_text. */
FLM_API flm_status flm_session_prompt_chat(flm_session *s, const flm_chat *t, const flm_chat_msg *msgs, size_t n,
                                           size_t *n_reused, flm_error *err);
/* The tokens flm_session_prompt_chat makes the context hold (rendered and tokenized the same way), without evaluating
 * anything: *ids malloc'd (the caller frees it; NULL after an error), *n_ids of them. For a server that reports the
 * prompt (its length when it does not fit, its text). Errors: those of flm_chat_apply, FLM_ERR_NOMEM. */
FLM_API flm_status flm_session_chat_tokens(flm_session *s, const flm_chat *t, const flm_chat_msg *msgs, size_t n,
                                           int32_t **ids, size_t *n_ids, flm_error *err);

/* ---- a conversation held in a session (what `flashlm chat` does, as llama.cpp's conversation mode) ----
 * The session keeps the text its cache holds for the conversation: the renderings fed and the replies as generated
 * (the pieces of the tokens evaluated). Each turn renders the whole conversation; when that text begins the
 * rendering only the rest is tokenized and evaluated (a turn costs its own tokens), else (the first turn, a template
 * that rewrote history, e.g. Gemma trimming a reply's trailing whitespace) the whole rendering is fed as a prompt
 * (flm_session_prompt: the common token prefix kept). A context shift leaves the text as it is: new text is still
 * appended to what the cache began with. */
typedef struct flm_chat_turn_info {
    int32_t pos0;    /* the position the turn's evaluation started at */
    size_t n_new;    /* the turn's tokens from pos0 (evaluated, or refused: FLM_ERR_CONTEXT) */
    bool from_start; /* the whole rendering was the turn's prompt (a new conversation, or history rewritten) */
    bool rewrote;    /* of those, the template rewrote the text the cache held */
} flm_chat_turn_info;
/* One turn: msgs (the whole conversation, ending with the new user message) rendered through t with the assistant's
 * opening, evaluated as above (tokenized with FLM_TOKENIZE_PARSE_SPECIAL, BOS from the start when flm_add_bos); the
 * next flm_session_generate's reply (feed_last, to go on) joins the held text. With the context shift on, the turn
 * goes through whatever its length (flm_session_feed_shift). info (may be NULL) says what was evaluated.
 * Errors: FLM_ERR_CONTEXT (shift off: the tokens held and the turn's leave no room for a reply, nothing evaluated and
 * the conversation kept; shift on: the kept start leaves nothing to discard), those of flm_chat_apply, flm_tokenize_ex
 * (FLM_ERR_NOMEM) and flm_eval_batch (the conversation is then forgotten: the next turn starts from the beginning). */
FLM_API flm_status flm_session_chat_turn(flm_session *s, const flm_chat *t, const flm_chat_msg *msgs, size_t n,
                                         flm_chat_turn_info *info, flm_error *err);
/* Forget the conversation and every token held (the next turn starts at position 0). */
FLM_API void flm_session_chat_reset(flm_session *s);
/* The conversation's text the cache holds (*len bytes, NUL-terminated, valid until the next call on s); "" when none.
 */
FLM_API const char *flm_session_chat_text(const flm_session *s, size_t *len);
/* Replace that text by text[0..len) (a caller that dropped old messages after a context shift: the rendering of the
 * rest up to the same end); the tokens held stay. Errors: FLM_ERR_NOMEM (the old text is kept). */
FLM_API flm_status flm_session_chat_set_text(flm_session *s, const char *text, size_t len, flm_error *err);

/* What one generation may do. */
#define FLM_GEN_STOP_MAX 8     /* stop strings per generation */
#define FLM_GEN_STOP_LEN 256   /* bytes per stop string, at most */
typedef struct flm_gen_params {
    long max_tokens;          /* tokens to sample at most (an end-of-generation token included); < 0: no limit
                                 (until end of generation or a full context) */
    bool feed_last;           /* evaluate the last token too (a conversation goes on after the reply); else the
                                 max_tokens-th token is sampled but not evaluated */
    const char *stop[FLM_GEN_STOP_MAX]; /* stop strings (NUL-terminated, non-empty, borrowed for the call); the text
                                 ends before the first occurrence of any of them, which is not released */
    int n_stop;               /* how many of stop[] are used, 0..FLM_GEN_STOP_MAX */
    bool utf8_whole;          /* release text only in whole UTF-8 characters (RFC 3629): an incomplete sequence
                                 at the end is held until the next token completes it; bytes that cannot be UTF-8,
                                 and a sequence still incomplete when the generation ends, are released as U+FFFD
                                 each (the token's own bytes, flm_token_piece, are unchanged) */
    flm_grammar *grammar;     /* NULL, or the text generated must follow this grammar from its start (borrowed for
                                 the call; its caches grow): see "Constrained decoding" above */
    bool logprobs;            /* give each token's log-probability (flm_gen_token.logprob: flm_logprobs, the model's
                                 softmax at temperature 1, from the logits that gave the token, a verified row under
                                 speculative decoding) and its top_logprobs most likely alternatives */
    int top_logprobs;         /* 0..FLM_GEN_TOP_LOGPROBS_MAX, with logprobs */
    bool post_sampling;       /* with logprobs: logprob and top_logprob are the log of the probabilities the token was
                                 drawn with instead (flm_sampler_top_probs: after logit_bias, the penalties,
                                 temperature, top-k, top-p, min-p and the grammar's mask; llama-server's
                                 post_sampling_probs), the alternatives only those with a probability > 0 */
} flm_gen_params;
#define FLM_GEN_TOP_LOGPROBS_MAX 20 /* OpenAI's limit */
/* max_tokens -1, nothing else. */
FLM_API void flm_gen_params_default(flm_gen_params *p);

/* One step of a generation, as the callback sees it. */
typedef struct flm_gen_token {
    int32_t id;                   /* the token sampled; -1 for the final release of held text (no token) */
    bool eog;                     /* id is an end-of-generation token: no text, not evaluated, the last call */
    const char *text;             /* text released now (len bytes, not NUL-terminated, valid during the call): the
                                     token's piece and earlier held-back text, less what could still begin a stop
                                     string (held back); may be empty */
    size_t len;
    double ms;                    /* wall-clock ms since the previous call (the first: since the generation began) */
    flm_token_stats stats;        /* the evaluation whose logits gave this token (per-token share of a batch) */
    int32_t prev;                 /* the token before it in the context (-1: none): flm_token_piece(ctx, prev, id) is
                                     its piece (the alternatives' too) */
    float logprob;                /* with flm_gen_params.logprobs: the token's log-probability (flm_logprobs; with
                                     post_sampling, the log of flm_sampler_top_probs': -INFINITY when filtered out) */
    int n_top;                    /* with logprobs: the alternatives given, top_logprobs (fewer for a tiny vocabulary) */
    int32_t top_id[FLM_GEN_TOP_LOGPROBS_MAX];    /* the most likely tokens, most likely first */
    float top_logprob[FLM_GEN_TOP_LOGPROBS_MAX]; /* their log-probabilities */
} flm_gen_token;
/* Return false to stop the generation (flm_gen_result.cancelled). */
typedef bool (*flm_gen_fn)(void *user, const flm_gen_token *t);

typedef struct flm_gen_result {
    long n_gen;        /* tokens sampled (an end-of-generation token included) */
    bool eog;          /* ended by an end-of-generation token */
    bool limit;        /* ended after max_tokens */
    bool ctx_full;     /* ended: the context had no room for the next token (shift off, or nothing to discard):
                          the prompt and the reply fill it (n_past = n_ctx); no token is sampled it could not hold */
    bool stopped;      /* ended by a stop string (stop_index says which) */
    int stop_index;    /* -1 unless stopped */
    bool cancelled;    /* ended by flm_session_cancel or the callback */
    bool complete;     /* ended by the grammar: the text is a complete sentence and nothing may follow */
    double ms;         /* wall-clock ms of the call */
    double io_busy_ms; /* of ms, the time the context's reader had a read in flight (flm_stats.io_busy_ms): the
                          disk's busy share of the generation is io_busy_ms / ms (0 in ram mode) */
} flm_gen_result;

/* Sample after the tokens held (the prompt fed last, or the last generated token), up to gp->max_tokens, streaming
 * each token to fn (may be NULL) as described above; each sampled token except an end-of-generation one is
 * evaluated, except the max_tokens-th when !feed_last and a token ending in a stop string. The session's pending
 * cancellation (flm_session_cancel) is checked before each token and cleared when this returns. Context shift: as
 * flm_session_set_shift. Speculative decoding (flm_session_speculate): the same tokens, calls and results (greedy;
 * sampling: the same distribution), decided a step at a time; accepted drafts the context holds past a token where
 * the generation ends are forgotten (n_past counts only the tokens reported and evaluated as above); a failed
 * verification pass leaves the tokens before it and no logits (feed or prompt again). Errors: FLM_ERR_ARG (nothing
 * fed yet; a stop string empty, longer than FLM_GEN_STOP_LEN, or n_stop out of range), FLM_ERR_NOMEM, those of
 * flm_eval_batch (and flm_eval_tree, flm_eval_draft, the draft model's evaluations); r (may be NULL) says where it
 * ended either way. */
FLM_API flm_status flm_session_generate(flm_session *s, const flm_gen_params *gp, flm_gen_fn fn, void *user,
                                        flm_gen_result *r, flm_error *err);
/* Ask the running (or next) flm_session_generate to stop before its next token; safe from any thread and from a
 * signal handler (an atomic flag). A feed or prompt call clears a pending cancellation (a new request starts). */
FLM_API void flm_session_cancel(flm_session *s);

/* Counts since flm_session_create or flm_session_reset_stats. */
typedef struct flm_session_stats {
    uint64_t n_prompt;        /* prompt tokens evaluated (feeds and prompts) */
    uint64_t n_reused;        /* prompt tokens kept from the cache instead (flm_session_prompt) */
    uint64_t n_gen;           /* tokens sampled by generations */
    double prompt_ms, gen_ms; /* wall-clock ms feeding prompts, generating */
    flm_token_stats prompt;   /* sums over the prompts' evaluations: flash I/O, memory, compute ms, bytes, reads (each
                                 call's own statistics, flm_evaluate's flm_call_stats, summed) */
    flm_token_stats gen;      /* the same over generations' evaluations */
    uint64_t n_gen_evaluated; /* tokens the context evaluated while generating (flm_call_stats.n_tokens summed): n_gen
                                 less the unevaluated last one, plus a speculative step's drafts and rejected ones */
    long n_shifts;            /* context shifts, and the tokens they discarded */
    long n_discarded;
} flm_session_stats;
/* The counts so far (a copy). */
FLM_API void flm_session_get_stats(const flm_session *s, flm_session_stats *st);
/* Zero them (e.g. at the start of each request); the speculative counts (flm_session_spec_stats) too. */
FLM_API void flm_session_reset_stats(flm_session *s);

/* ---- speculative decoding in a session (src/session/spec.c; docs/SPECULATIVE.md) ----
 * A draft proposes tokens, the target verifies them all in one batched pass and keeps the longest prefix it agrees
 * with, plus one token of its own (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
 * Decoding"; Chen et al. 2023). Greedy output is token for token that of plain decoding; with sampling every token
 * keeps the target's distribution (the rejection rule of flm_sampler_accept; for trees SpecInfer's multi-draft rule,
 * flm_sampler_accept_multi, Miao et al. 2024). Draft sources: a separate draft model sharing the target's tokenizer,
 * n-gram lookup in the text so far (llama.cpp's lookup decoding), or the target itself restricted to the neurons it
 * keeps in memory (the self-draft, mode hot: flm_eval_draft), as a chain or as a tree of candidates verified in one
 * pass with tree attention (flm_eval_tree; SpecExec, Svirschevski et al. 2024; Sequoia, Chen et al. 2024). */
#define FLM_SPEC_DRAFT_MAX 64 /* the most tokens (chain) or nodes (tree) one step may propose */
typedef struct flm_spec_params {
    int n_draft;     /* tokens proposed per step (a tree: its depth), 1..FLM_SPEC_DRAFT_MAX; fewer near max_tokens or
                        the end of the context, or when the n-gram lookup finds fewer */
    bool ngram;      /* without a draft model: propose what followed the last earlier occurrence of the last 3, 2 or 1
                        tokens of the text (prompt and generated) */
    bool self_draft; /* without a draft model: the target proposes over its resident neurons (flm_has_self_draft) */
    bool adaptive;   /* each step's draft length 0..n_draft from the measured costs: the most expected tokens per ms
                        of a pass, E(n) / (n c_draft + c_verify(n + 1)), E(n) = (1 - a^(n+1)) / (1 - a) for the
                        measured acceptance a; 0 when drafting does not pay */
    int tree;        /* with self_draft: the most nodes of a draft tree, 2..FLM_SPEC_DRAFT_MAX (0: a chain); each
                        level drafted in one flm_eval_tree (the draft grows up to 3 * tree nodes, at most
                        FLM_SPEC_DRAFT_MAX, expanding only nodes that may rank among the tree likeliest), the tree
                        verified in one, pruned to the nodes that pay by the measured pass time against rows; greedy
                        trees also hold the n-gram continuation */
} flm_spec_params;
/* n_draft 4, no source, not adaptive, a chain. */
FLM_API void flm_spec_params_default(flm_spec_params *p);

/* Counts of a session's speculative generations (flm_session_generate; prompts not counted), since
 * flm_session_speculate or flm_session_reset_stats. */
typedef struct flm_spec_stats {
    uint64_t n_gen;          /* tokens generated (an end-of-generation token included) */
    uint64_t n_passes;       /* target forward passes while generating */
    uint64_t n_steps;        /* of those, verification steps */
    uint64_t n_drafted;      /* draft tokens proposed to the target */
    uint64_t n_accepted;     /* of those, accepted */
    uint64_t n_plain;        /* steps with nothing proposed */
    uint64_t n_joined;       /* steps verified in a pass joined with other sequences' (a shared context while others
                                are busy: a chain, the self-draft's passes joined with theirs too) */
    uint64_t n_joined_drafted;  /* draft tokens those steps proposed */
    uint64_t n_joined_accepted; /* of those, accepted */
    uint64_t target_tokens;  /* tokens the target evaluated (accepted or not) */
    double target_ms;        /* the target's flash I/O + memory + compute ms (flm_stats) */
    uint64_t bytes_read;     /* the target's bytes read from flash */
    uint64_t n_loaded;       /* the target's neurons read from flash (sparse mode) */
    uint64_t draft_tokens;   /* tokens the draft evaluated (a draft model re-synchronising included) */
    double draft_ms;         /* ms drafting */
    double draft_select_ms;  /* ms choosing drafts and accepting, outside both models */
    double verify_ms[FLM_SPEC_DRAFT_MAX + 2]; /* [k]: ms of the verification passes of k rows, summed */
    uint64_t verify_n[FLM_SPEC_DRAFT_MAX + 2]; /* [k]: how many such passes */
} flm_spec_stats;

/* Decode speculatively from now on: every flm_session_generate proposes with draft (a context of a draft model,
 * borrowed: close it after flm_session_free; NULL: none), the n-gram lookup or the self-draft as p says, and verifies
 * in batched passes of the session's context. Stop strings, max_tokens, cancellation, the callback and the context
 * shift act token by token as without it, and the session holds exactly the tokens it reports: a generation that ends
 * inside a run of accepted drafts forgets the rest. The engine's buffers (flm_spec_buffer_bytes) are allocated here,
 * outside the memory plan. p NULL: plain decoding again (the engine freed). A draft model must share the target's
 * tokenizer (check it with flm_spec_check_vocab first); its context is re-evaluated from the first token that
 * differs from the session's (after a rewind, a new prompt, a context shift).
 * Errors: FLM_ERR_ARG (n_draft or tree out of range, no source or two, self_draft without flm_has_self_draft, logits
 * of different sizes), FLM_ERR_NOMEM, those of evaluating the draft model over the tokens held. */
FLM_API flm_status flm_session_speculate(flm_session *s, const flm_spec_params *p, flm_ctx *draft, flm_error *err);
/* The speculative counts so far (zeros when the session does not speculate). */
FLM_API void flm_session_spec_stats(const flm_session *s, flm_spec_stats *st);
/* Bytes of the engine's buffers for these sizes (what flm_session_speculate allocates): the verification logits
 * ((max(n_draft, tree) + 1) x n_vocab floats), a tree's nodes, the token histories (n_ctx int32); with_draft_model
 * and greedy no longer change it (drafts draw with the target's noise: no draft distribution is kept). For a budget
 * that holds them beside the models (flm_plan_split's extra_bytes). */
FLM_API uint64_t flm_spec_buffer_bytes(uint32_t n_vocab, uint32_t n_ctx, const flm_spec_params *p,
                                       bool with_draft_model, bool greedy);
/* Whether draft can draft for target: the same vocabulary size (logits), every token's string and piece identical,
 * the same BOS, EOS and end-of-generation tokens. FLM_OK, or FLM_ERR_ARG with a message naming both files
 * (target_path, draft_path: for the message only) and the first difference. */
FLM_API flm_status flm_spec_check_vocab(const flm_ctx *target, const char *target_path, const flm_ctx *draft,
                                        const char *draft_path, flm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* FLASHLM_H */
