/* model.h — architectures as data: hyper-parameters and the weights of one model. Internal.
 *
 * A model is described by flm_hparams and one flm_weight per tensor. A weight is a matrix of n_out rows of n_in
 * elements of one flm_type (GGUF layout: ne[0] = n_in is contiguous). Weights resident in memory have data != NULL;
 * FFN weights of a flash (.flm) model live in the file and are brought in by the runtime. */
#ifndef FLM_MODEL_MODEL_H
#define FLM_MODEL_MODEL_H
#include <stdbool.h>
#include <stdint.h>
#include "flashlm.h"
#include "format/gguf.h"
#include "format/tokenizer.h"
#include "model/arch.h"

typedef struct flm_hparams {
    const flm_arch *arch; /* the architecture's descriptor (never NULL once loaded) */
    uint32_t d_model;     /* ARCH.embedding_length */
    uint32_t d_ffn;       /* ARCH.feed_forward_length */
    uint32_t n_layers;    /* ARCH.block_count */
    uint32_t n_heads;     /* ARCH.attention.head_count */
    uint32_t n_kv_heads;  /* ARCH.attention.head_count_kv (default n_heads) */
    uint32_t head_dim;    /* ARCH.attention.key_length (default d_model / n_heads); q_dim = n_heads * head_dim may
                             differ from d_model (Gemma 3: 4 x 256 against 640) */
    uint32_t n_vocab;     /* rows of token_embd.weight */
    uint32_t n_ctx_train; /* ARCH.context_length */
    uint32_t rope_dim;    /* ARCH.rope.dimension_count (default head_dim) */
    uint32_t n_swa;       /* ARCH.attention.sliding_window, tokens; 0 when no layer uses local attention */
    float norm_eps;       /* ARCH.attention.layer_norm_rms_epsilon (LayerNorm: ARCH.attention.layer_norm_epsilon) */
    float rope_theta;     /* ARCH.rope.freq_base (default 10000) */
    float rope_theta_local; /* RoPE base of the sliding-window layers (the arch's; else rope_theta) */
    float attn_scale;     /* attention logits scale, 1/sqrt(head_dim) */
    flm_act act;          /* FFN activation: the arch's, or flashlm.ffn_activation (synthetic ReLU models) */
    bool gated;           /* FFN has a gate projection (SwiGLU / ReGLU / GeGLU) */
    bool norm_after;      /* flashlm.norm_after (post-LN, OPT-350M's do_layer_norm_before = false): each layer is
                             x = norm(x + attn(x)) with attn_norm, then x = norm(x + ffn(x)) with ffn_norm, and
                             output_norm is optional (OPT-350M has none); LayerNorm, sequential architectures only */
    uint32_t d_embd;      /* row length of token_embd.weight (and of the classifier): d_model, or OPT-350M's
                             word_embed_proj_dim when the model has proj_in / proj_out */
} flm_hparams;

typedef struct flm_weight {
    uint32_t type;        /* flm_type */
    uint64_t n_in;        /* row length (elements) */
    uint64_t n_out;       /* rows */
    const void *data;     /* NULL when not resident */
} flm_weight;

typedef struct flm_layer_weights {
    flm_weight attn_norm, wq, wk, wv, wo; /* attention: norm [d_model], q [d_model -> n_heads*head_dim], ... */
    flm_weight ffn_norm, ffn_up, ffn_gate, ffn_down; /* up/gate [d_model -> d_ffn], down [d_ffn -> d_model] */
    /* optional (data NULL when the architecture has none), all f32 */
    flm_weight bq, bk, bv;                /* FLM_ARCH_QKV_BIAS: [q_dim], [kv_dim], [kv_dim] */
    flm_weight q_norm, k_norm;            /* FLM_ARCH_QK_NORM: [head_dim] each */
    flm_weight q_norm_b, k_norm_b;        /* FLM_ARCH_QK_NORM with LayerNorm: their biases, [head_dim] each */
    flm_weight wqkv, bqkv;                /* a fused attn_qkv in FLM_QKV_PER_HEAD order, [d_model -> 3 q_dim] and
                                             [3 q_dim] (bqkv: data NULL without a bias); wq, wk, wv, bq, bk, bv are then
                                             unbound. A FLM_QKV_CONCAT one is bound as wq, wk, wv (bq, bk, bv): row
                                             ranges of the one tensor, these two unbound */
    flm_weight post_attn_norm, post_ffn_norm; /* FLM_ARCH_POST_NORMS: [d_model] each */
    flm_weight attn_norm_b, ffn_norm_b;   /* FLM_NORM_LAYER: the norms' biases, [d_model] each */
    flm_weight bo;                        /* FLM_ARCH_O_BIAS: [d_model] */
    flm_weight ffn_up_b, ffn_down_b;      /* FLM_ARCH_FFN_BIAS: [d_ffn] (by neuron), [d_model]; resident in .flm too */
    bool swa;                             /* this layer uses sliding-window attention over the last n_swa tokens */
} flm_layer_weights;

typedef struct flm_model {
    char arch[32];             /* general.architecture: "llama", "qwen2", "gemma3" */
    flm_hparams hp;
    flm_weight tok_embd;       /* [n_vocab rows of d_embd] */
    flm_weight output_norm;    /* [d_model] f32; data NULL when norm_after and the model has none (OPT-350M) */
    flm_weight output_norm_b;  /* FLM_NORM_LAYER: [d_model] f32, else data NULL */
    flm_weight pos_embd;       /* FLM_POS_LEARNED: [n_ctx_train rows of d_model], else data NULL */
    flm_weight output;         /* [n_vocab rows of d_embd]; equals tok_embd when tied */
    flm_weight output_b;       /* FLM_ARCH_OUT_BIAS: [n_vocab] f32, else data NULL */
    flm_weight proj_in;        /* proj_in.weight [d_embd -> d_model] (OPT-350M's project_in, no bias): the embedding
                                  row is projected before the position row is added; data NULL when d_embd == d_model */
    flm_weight proj_out;       /* proj_out.weight [d_model -> d_embd] (project_out): applied to the last hidden state
                                  (after output_norm, when there is one) before the classifier; present with proj_in */
    flm_layer_weights *layers; /* n_layers */
    flm_tokenizer *tok;
    flm_gguf_file *gguf;           /* owner of the weight bytes when loaded from GGUF */
} flm_model;

/* Load a model of a known architecture (model/arch.h) from an open GGUF file (which the model then owns and closes).
 * Reads hyper-parameters from the metadata, checks every tensor's presence, type and shape, builds the tokenizer.
 * Errors: FLM_ERR_FORMAT (missing key/tensor, wrong shape — the message names the file, key or tensor),
 * FLM_ERR_UNSUPPORTED (architecture or tokenizer model not supported), FLM_ERR_NOMEM. On error f is closed. */
flm_status flm_model_from_gguf(flm_gguf_file *f, flm_model **out, flm_error *err);

/* Load a llama model from an open .flm file: resident weights and tokenizer from its resident region; FFN weights
 * are described (type, shape) but not resident (data == NULL; ffn_down is stored by columns in the bundles).
 * The model does not own f. Errors: as flm_model_from_gguf, plus FLM_ERR_FORMAT when the FFN regions do not match
 * the hyper-parameters. */
struct flm_file;
/* The .flm's FFN regions against the hyper-parameters from its resident GGUF: one region per layer, each of d_ffn
 * records of the bundle layout of its types (docs/FORMAT.md), all gated or all not; sets hp->gated from layer 0's.
 * What flm_model_from_flm and flm_plan check before trusting a region. Errors: FLM_ERR_FORMAT naming the file and
 * the layer. */
flm_status flm_model_check_regions(const struct flm_file *f, flm_hparams *hp, flm_error *err);
flm_status flm_model_from_flm(const struct flm_file *f, flm_model **out, flm_error *err);

/* Read hyper-parameters from GGUF metadata (keys prefixed by general.architecture) (shared by the GGUF and .flm paths).
 * n_vocab is taken from the token list. Errors: FLM_ERR_FORMAT naming the key. */
flm_status flm_hparams_from_gguf(const flm_gguf_file *f, flm_hparams *hp, flm_error *err);
/* Check hyper-parameters for consistency (nonzero, n_heads % n_kv_heads == 0, even rope_dim <= head_dim,
 * sizes < 2^20). what names the source in messages. */
flm_status flm_hparams_check(const flm_hparams *hp, const char *what, flm_error *err);


/* Floats of one token's block-input row (the scratch that holds a normed input, the attention's output, the
 * embedding row before proj_in and the hidden state after proj_out): max(n_heads * head_dim, d_model, d_embd). */
static inline uint64_t flm_hparams_row(const flm_hparams *hp) {
    uint64_t q = (uint64_t)hp->n_heads * hp->head_dim, r = q > hp->d_model ? q : hp->d_model;
    return hp->d_embd > r ? hp->d_embd : r;
}

/* Bytes of a weight (rows * row bytes). */
uint64_t flm_weight_bytes(const flm_weight *w);

void flm_model_free(flm_model *m);

#endif
