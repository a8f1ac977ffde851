/* pass.h — the blocks the forward pass is assembled from (runtime/forward.c), for a batch of n >= 1 tokens. Internal.
 *
 * Each block works on n token rows (row t of a [n][stride] array at t * stride floats) and needs no context: the
 * forward pass (flm_forward) composes them per the architecture's descriptor (model/arch.h), around what only a
 * context has (the FFN source, embedding rows read from flash, statistics, error messages naming the file); `flashlm
 * synth` composes the same blocks while it writes a model tensor by tensor (synth/synth.c). Which variant a block
 * runs is the descriptor's choice (P->hp->arch): RMSNorm or LayerNorm, RoPE order or learned positions, the FFN
 * activation. The linear block runs flm_matvec for one token and flm_matmat for a batch (the same values, row by row:
 * kernels.h), so one token's logits are those of the single-token pass llama2.c's `forward` describes. */
#ifndef FLM_RUNTIME_PASS_H
#define FLM_RUNTIME_PASS_H
#include <stddef.h>
#include <stdint.h>
#include "compute/attention.h"
#include "compute/kernels.h"
#include "model/model.h"

/* A batch of tree nodes (flm_eval_tree; SpecInfer's tree attention): node i sits in KV slot base + i and at position
 * base + depth[i]; it attends to the context's slots < base and to the slots of its ancestors and itself
 * (anc[i * n_nodes + j] != 0). The batch's row t is node (pass.pos - base) + t. */
typedef struct flm_tree {
    uint32_t base, n_nodes;
    const int32_t *depth; /* [n_nodes] */
    const uint8_t *anc;   /* [n_nodes][n_nodes] */
    uint8_t *mask;        /* scratch of n_ctx bytes (the attention mask of one row) */
} flm_tree;

struct flm_backend;

/* What every block of one batch shares. */
typedef struct flm_pass {
    const struct flm_backend *be; /* the backend running the pass (runtime/backend.h); NULL: the CPU blocks below
                                     called directly (synth) */
    const flm_kernels *k;
    const flm_hparams *hp;  /* dimensions, eps, RoPE bases and the descriptor (hp->arch) */
    const flm_kv_cache *kv; /* the attention block stores each token's key and value here, and reads them back */
    int n_threads;
    uint32_t n;             /* tokens in the batch, >= 1 */
    int32_t pos;            /* position of the first; token t is at pos + t (a tree: KV slot of the first) */
    float *att;             /* attention scratch: [n_heads * kv->n_ctx] floats */
    const flm_tree *tree;   /* NULL: the causal batch above; else tree nodes (positions, mask: flm_tree) */
    /* rows of several sequences (a joined pass, flm_eval_seq): row t's KV cache and position (its KV slot); NULL:
     * every row in kv at pos + t */
    const flm_kv_cache *const *row_kv;
    const int32_t *row_pos;
    /* with row_kv, rows that are tree nodes (a sequence's tree in a joined pass): row t's KV slot (NULL: every row's
     * slot is its position) and its tree (NULL, or row_tree[t] NULL: a causal row; else row t is node
     * row_slot[t] - base of row_tree[t], at position row_pos[t] = base + its depth) */
    const int32_t *row_slot;
    const flm_tree *const *row_tree;
} flm_pass;

/* Position of the batch's row t: pos + t, or a tree node's base + depth. */
static inline uint32_t flm_pass_position(const flm_pass *P, uint32_t t) {
    if (P->row_pos) return (uint32_t)P->row_pos[t];
    if (!P->tree) return (uint32_t)P->pos + t;
    return P->tree->base + (uint32_t)P->tree->depth[(uint32_t)P->pos - P->tree->base + t];
}

/* KV slot of the batch's row t: pos + t (a tree: its node's slot), or a joined row's (row_slot, else its position). */
static inline uint32_t flm_pass_slot(const flm_pass *P, uint32_t t) {
    if (P->row_slot) return (uint32_t)P->row_slot[t];
    if (P->row_pos) return (uint32_t)P->row_pos[t];
    return (uint32_t)P->pos + t;
}

/* The norm block: out[t] = norm(in[t]) for t < n, rows of dim floats; RMSNorm with weight w, or LayerNorm with w and
 * bias b (b->data may be NULL: no bias) when hp->arch->norm is FLM_NORM_LAYER; eps hp->norm_eps. out may be in. */
void flm_pass_norm(const flm_pass *P, const flm_weight *w, const flm_weight *b, uint32_t dim, const float *in,
                   size_t in_stride, float *out, size_t out_stride);

/* The linear block: out[t][r] = W row r . in[t] (+ b[r] when b and b->data) for r < rows, t < n; W is rows x cols of
 * W->type (resident: W->data != NULL). n == 1: flm_matvec; else flm_matmat (each weight row read once per batch). */
void flm_pass_linear(const flm_pass *P, const flm_weight *W, const flm_weight *b, size_t rows, size_t cols,
                     const float *in, size_t in_stride, float *out, size_t out_stride);

/* The q, k, v projections of layer L: q [n][q_dim], k and v [n][kv_dim] from in (rows in_stride apart), biases added:
 * three linear blocks over wq, wk, wv (separate tensors, or row ranges of a fused attn_qkv), or, for a fused attn_qkv
 * interleaved per head (L->wqkv: FLM_QKV_PER_HEAD, Persimmon), one linear block per head and part over its rows. */
void flm_pass_qkv(const flm_pass *P, const flm_layer_weights *L, const float *in, size_t in_stride, float *q, float *k,
                  float *v);

/* The attention block of layer L, given q [n][q_dim], k and v [n][kv_dim] (projected, biases added): each head of q
 * and k normed when L has q/k norms (RMSNorm, or LayerNorm with bias for a LayerNorm architecture), RoPE on the first
 * rope_dim dimensions of each head of q and k at their positions (FLM_POS_ROPE; the local base on
 * sliding-window layers), k and v stored as row (kv_layer, pos + t) of P->kv (q and k are changed in place), then
 * out[t][q_dim] = causal attention over positions first..pos + t (first = pos + t - n_swa + 1 on sliding-window
 * layers, else 0). Tree nodes (P->tree): RoPE at the node's position, stored at its slot, attention over the
 * context's slots and the node's ancestors (flm_attention's mask). A batch (n > 1) runs flm_attention_batch (blocked
 * over the KV cache; the same bits as flm_attention token by token, which runs when its scratch cannot be had).
 * Rows of several sequences (P->row_kv): row t's key and value go to P->row_kv[t] at slot flm_pass_slot (its
 * position, or a tree node's slot: P->row_slot), and it attends over that cache alone (flm_attention row by row), a
 * tree node (P->row_tree[t]) over the context's slots and its own tree's ancestors. */
void flm_pass_attention(const flm_pass *P, const flm_layer_weights *L, uint32_t kv_layer, float *q, float *k,
                        const float *v, float *out, size_t out_stride);

/* The FFN activation block, on count = n * d_ffn values: gated (hp->gated) h = act(h) * u, where h holds the gate
 * projection and u the up projection; ungated h = act(u). act: hp->act (compute/act.h: SiLU, ReLU, tanh-GELU,
 * erf-GELU, squared ReLU), computed by k's act kernel (kernels.h flm_act_fn: the scalar table is the reference). */
void flm_pass_ffn_act(const flm_kernels *k, const flm_hparams *hp, size_t count, float *h, const float *u);

/* The dense FFN block of layer L with resident weights: out[t] = down(act(gate in[t]) * (up in[t])), or
 * down(act(up in[t])) ungated; out rows of d_model. H and U are [n][d_ffn] scratch. */
void flm_pass_ffn_dense(const flm_pass *P, const flm_layer_weights *L, const float *in, size_t in_stride, float *out,
                        size_t out_stride, float *H, float *U);

/* The residual block: x[t] += post ? norm(y[t]) * post : y[t] for t < n, rows of d_model floats (x's stride
 * d_model, y's y_stride); y is normed in place when post->data (Gemma's post-attention and post-FFN norms). */
void flm_pass_residual(const flm_pass *P, float *x, float *y, size_t y_stride, const flm_weight *post);

#endif
