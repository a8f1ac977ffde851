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

#define FLM_VERSION_STRING "0.1.0"

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
} flm_status;

#define FLM_ERROR_MSG_MAX 512
typedef struct flm_error {
    flm_status code;
    char msg[FLM_ERROR_MSG_MAX];
} flm_error;

/* A short, static name for a status code ("I/O error", "bad format", ...). */
const char *flm_status_str(flm_status s);

/* ---------------------------------------------------------------------------------------------------------------
 * Tensor types (the numeric ids are GGUF's ggml_type ids, so they can be stored as-is)
 * ------------------------------------------------------------------------------------------------------------- */
typedef enum flm_type {
    FLM_TYPE_F32 = 0,
    FLM_TYPE_F16 = 1,
    FLM_TYPE_Q4_0 = 2,  /* blocks of 32: f16 scale d, 16 bytes of nibbles; x = d * (q - 8) */
    FLM_TYPE_Q8_0 = 8,  /* blocks of 32: f16 scale d, 32 int8;            x = d * q       */
    FLM_TYPE_BF16 = 30,
} flm_type;

/* Name of a type ("f32", "q8_0", ...), or NULL when the id is not one flashlm supports. */
const char *flm_type_name(uint32_t type);

/* ---------------------------------------------------------------------------------------------------------------
 * Opening a model and running it
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct flm_ctx flm_ctx;

typedef struct flm_params {
    int n_threads;   /* compute threads (-t); default: the number of online CPUs */
    int n_ctx;       /* KV cache length in tokens (-c); 0 = min(model's context_length, 2048) */
} flm_params;

/* Fill p with the defaults above. */
void flm_params_default(flm_params *p);

/* Open a model file: a GGUF file (run with every weight in memory). Validates the file completely before use.
 * Errors: FLM_ERR_IO, FLM_ERR_FORMAT, FLM_ERR_UNSUPPORTED, FLM_ERR_NOMEM, FLM_ERR_ARG (bad params); the message
 * names the file and the problem. */
flm_status flm_open(const char *path, const flm_params *p, flm_ctx **out, flm_error *err);
void flm_close(flm_ctx *ctx);

/* Run one token at position pos (0-based; positions must be fed in order 0, 1, 2, ... or restart at 0) through the
 * model and point *logits at the n_vocab next-token logits (valid until the next call).
 * Errors: FLM_ERR_ARG (token out of range, pos >= n_ctx or out of order), FLM_ERR_IO (a weight read failed). */
flm_status flm_eval(flm_ctx *ctx, int32_t token, int32_t pos, const float **logits, flm_error *err);

/* Model facts. */
typedef struct flm_model_info {
    const char *arch;                 /* "llama" */
    uint32_t d_model, d_ffn, n_layers, n_heads, n_kv_heads, head_dim, n_vocab, n_ctx_train;
    uint32_t n_ctx;                   /* this context's KV cache length */
    float norm_eps, rope_theta;
    int32_t bos, eos;                 /* token ids, -1 when absent */
    const char *kernels;              /* kernel table in use: "avx2", "scalar" */
} flm_model_info;
void flm_get_info(const flm_ctx *ctx, flm_model_info *info);

/* ---------------------------------------------------------------------------------------------------------------
 * Tokenizer (SentencePiece BPE from the model's metadata)
 * ------------------------------------------------------------------------------------------------------------- */
/* Encode UTF-8 text into at most cap ids, with BOS first when add_bos. Returns how many ids the whole text needs
 * (when more than cap, only cap were written). */
size_t flm_tokenize(const flm_ctx *ctx, const char *text, bool add_bos, int32_t *ids, size_t cap);
/* Bytes that token id decodes to, given the previous token (a leading space after BOS is dropped); not
 * NUL-terminated, *len bytes, valid while ctx lives. */
const char *flm_token_piece(const flm_ctx *ctx, int32_t prev, int32_t id, size_t *len);

/* ---------------------------------------------------------------------------------------------------------------
 * Sampling
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct flm_sampler flm_sampler;
typedef struct flm_sampler_params {
    float temp;     /* 0 = greedy (argmax, lowest id on ties) */
    int top_k;      /* keep the k most likely tokens; <= 0 = all */
    float top_p;    /* nucleus: keep the smallest set with probability >= top_p; >= 1 = all */
    uint64_t seed;  /* RNG seed (xorshift64*); the same seed gives the same text */
} flm_sampler_params;
void flm_sampler_params_default(flm_sampler_params *p); /* temp 0.8, top_k 40, top_p 0.95, seed 42 */
/* NULL on allocation failure or n_vocab == 0. */
flm_sampler *flm_sampler_create(const flm_sampler_params *p, size_t n_vocab);
/* Pick the next token from n_vocab logits (not modified). */
int32_t flm_sampler_sample(flm_sampler *s, const float *logits);
void flm_sampler_free(flm_sampler *s);

#ifdef __cplusplus
}
#endif
#endif /* FLASHLM_H */
