/* attention.h — RoPE, the KV cache (f16 or f32) and grouped-query attention. Internal.
 * RoPE as in llama.cpp: rope type "normal" (llama) rotates adjacent pairs, "neox" (Qwen2, Gemma) rotates the two
 * halves of each head's first rope_dim dimensions, each pair i by pos * theta^(-2i/rope_dim). */
#ifndef FLM_COMPUTE_ATTENTION_H
#define FLM_COMPUTE_ATTENTION_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "flashlm.h"
#include "compute/kernels.h"
#include "core/arena.h"

#define FLM_ATT_MAX_HEAD_DIM 1024

/* Bytes per cached key or value element. */
#define FLM_KV_F16 2u /* IEEE half (uint16_t), round to nearest even: llama.cpp's default KV cache type */
#define FLM_KV_F32 4u /* float (--kv-f32) */

/* The KV cache: for each layer, n_ctx rows of kv_dim keys and as many values, elem_bytes each (FLM_KV_F16: uint16_t
 * halves; FLM_KV_F32: floats). Row (l, pos) starts at element (l * n_ctx + pos) * kv_dim of k (and of v). */
typedef struct flm_kv_cache {
    uint32_t n_layers, n_ctx, kv_dim;
    uint32_t elem_bytes; /* FLM_KV_F16 or FLM_KV_F32 */
    void *k, *v;
    bool owned; /* k and v were allocated by flm_kv_cache_init (flm_kv_cache_free frees them) */
} flm_kv_cache;

/* Bytes the cache needs: 2 * n_layers * n_ctx * kv_dim * elem_bytes (elem_bytes FLM_KV_F16 or FLM_KV_F32). */
uint64_t flm_kv_cache_bytes(uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim, uint32_t elem_bytes);
/* A zeroed cache on the heap. Errors: FLM_ERR_NOMEM, FLM_ERR_ARG (elem_bytes neither 2 nor 4). */
flm_status flm_kv_cache_init(flm_kv_cache *c, uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim, uint32_t elem_bytes,
                             flm_error *err);
/* The same cache in caller memory: mem holds flm_kv_cache_bytes() zeroed bytes, float-aligned, and outlives c
 * (flm_kv_cache_free then frees nothing). elem_bytes must be FLM_KV_F16 or FLM_KV_F32. */
void flm_kv_cache_init_in(flm_kv_cache *c, uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim, uint32_t elem_bytes,
                          void *mem);
void flm_kv_cache_free(flm_kv_cache *c);
/* Row pointers for layer l, position pos: kv_dim elements (uint16_t halves or floats, by c->elem_bytes). */
void *flm_kv_key(const flm_kv_cache *c, uint32_t l, uint32_t pos);
void *flm_kv_value(const flm_kv_cache *c, uint32_t l, uint32_t pos);
/* Store k[kv_dim] and v[kv_dim] as row (l, pos): copied into an f32 cache; rounded to nearest even half in an f16
 * cache by kt's to_f16 kernel (kernels.h; the same bits at every level: reading them back gives exactly
 * flm_f16_to_f32(flm_f32_to_f16(x))). */
void flm_kv_store(const flm_kernels *kt, const flm_kv_cache *c, uint32_t l, uint32_t pos, const float *k,
                  const float *v);

/* Rotate vec (n_heads heads of head_dim floats) in place for position pos: pair i of each head's first rope_dim
 * dimensions turns by pos * theta^(-2i/rope_dim). neox = false: pairs are (x[2i], x[2i+1]) (llama, "normal");
 * neox = true: pairs are (x[i], x[i + rope_dim/2]) (GPT-NeoX order: Qwen2, Gemma). */
void flm_rope(float *vec, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim, uint32_t pos, float theta,
              bool neox);

/* out[n_heads*head_dim] = softmax(scale * q·K^T) V over positions first..pos of layer l (first = 0 for global
 * attention; pos - n_swa + 1 for a sliding window of n_swa tokens), with query head h reading KV head
 * h / (n_heads / n_kv_heads). With an f16 cache, q and the softmax weights are rounded to f16 as llama.cpp's CPU
 * path rounds them against its f16 KV cache, so that greedy outputs agree with llama.cpp's wherever the top two logits
 * are not a near-tie; the f16 keys and values are converted on the fly by k's attn_scores_f16 / attn_values_f16,
 * whose results equal the scalar loops' bit for bit. With an f32 cache (--kv-f32) everything stays f32.
 * att is scratch of n_heads * n_ctx floats. head_dim <= FLM_ATT_MAX_HEAD_DIM.
 * mask (NULL: every position) is [pos - first + 1] bytes: position first + t takes part when mask[t] != 0 (tree
 * attention: a tree node sees the context and its own ancestors, SpecInfer). A masked position's score is -inf, so its
 * softmax weight is exactly 0 and it adds exact zeros to the sums: the result equals attention over the unmasked
 * positions alone (in the same order) bit for bit. mask[pos - first] must be set. */
void flm_attention(const flm_kernels *k, const flm_kv_cache *c, uint32_t l, uint32_t first, uint32_t pos,
                   const float *q, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float scale, float *att,
                   float *out, int n_threads, const uint8_t *mask);

/* The tree of a batch of tree nodes (SpecInfer's tree attention; runtime/pass.h flm_tree): node i sits in KV slot
 * base + i at position base + depth[i], and sees the slots < base and the slots base + j of its ancestors and itself
 * (anc[i * n_nodes + j] != 0). */
typedef struct flm_att_tree {
    uint32_t base, n_nodes;
    const int32_t *depth; /* [n_nodes] */
    const uint8_t *anc;   /* [n_nodes][n_nodes] */
} flm_att_tree;

/* Attention for a batch of n tokens in consecutive KV slots pos .. pos + n - 1 of layer l (their keys and values
 * already stored): for each row t, out + t * out_stride gets exactly what
 *   flm_attention(k, c, l, first_t, pos + t, q + t * q_stride, n_heads, n_kv_heads, head_dim, scale, att, ..., mask_t)
 * writes, bit for bit (f16 q and softmax weights with an f16 cache, as there), where p_t = pos + t (tree:
 * tree->base + tree->depth[pos + t - tree->base]), first_t = p_t - window + 1 when window and p_t >= window (a
 * sliding-window layer of window tokens), else 0, and mask_t NULL (tree NULL: the causal batch) or the tree's row of
 * node pos + t - base. Computed as blocked matrix products (attention_batch.c): for each KV head and block of tokens,
 * the scores of all its query rows (the group's heads x the block's tokens) against each cache row, every key and
 * value row converted once per block (k's attn_scores_tile / attn_values_tile), each sum in the per-token order; split
 * over n_threads threads of the pool by (KV head, token block[, head group]).
 * Its scratch (about n_threads * 32 rows * (head_dim + the block's span) floats, at most about 2 MiB unless one row
 * per thread over the context is more) comes from the work area ws (compute/work.h; the heap when ws is NULL or too
 * small). Returns false, writing nothing, when that scratch cannot be had, or head_dim is above
 * FLM_ATT_MAX_HEAD_DIM: the caller then runs flm_attention per token. n_heads a multiple of n_kv_heads,
 * pos + n <= c->n_ctx. */
bool flm_attention_batch(const flm_kernels *k, const flm_kv_cache *c, uint32_t l, uint32_t pos, uint32_t n,
                         uint32_t window, const flm_att_tree *tree, const float *q, size_t q_stride, uint32_t n_heads,
                         uint32_t n_kv_heads, uint32_t head_dim, float scale, float *out, size_t out_stride,
                         int n_threads, flm_arena *ws);
/* The most bytes of work area flm_attention_batch takes for batches of up to n_batch tokens in a cache of n_ctx
 * positions with these heads and n_threads threads (0 when n_batch <= 1: no batch runs). */
size_t flm_attention_batch_work(uint32_t n_ctx, uint32_t n_batch, uint32_t n_heads, uint32_t n_kv_heads,
                                uint32_t head_dim, int n_threads);

#endif
