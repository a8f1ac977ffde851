/* attention.h — RoPE, the KV cache and grouped-query attention (float32). Internal.
 * RoPE as in llama.cpp: rope type "normal" (llama) rotates adjacent pairs, "neox" (Qwen2, Gemma) rotates the two
 * halves of each head's first rope_dim dimensions, each pair i by pos * theta^(-2i/rope_dim). */
#ifndef FLM_COMPUTE_ATTENTION_H
#define FLM_COMPUTE_ATTENTION_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "flashlm.h"

#define FLM_ATT_MAX_HEAD_DIM 1024

/* The KV cache: for each layer, n_ctx rows of kv_dim floats for keys and for values. */
typedef struct flm_kv_cache {
    uint32_t n_layers, n_ctx, kv_dim;
    float *k, *v;
    bool owned; /* k and v were allocated by flm_kv_cache_init (flm_kv_cache_free frees them) */
} flm_kv_cache;

/* Bytes the cache needs: 2 * n_layers * n_ctx * kv_dim * 4. */
uint64_t flm_kv_cache_bytes(uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim);
/* Errors: FLM_ERR_NOMEM. */
flm_status flm_kv_cache_init(flm_kv_cache *c, uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim, flm_error *err);
/* The same cache in caller memory: mem holds flm_kv_cache_bytes() zeroed bytes, float-aligned, and outlives c
 * (flm_kv_cache_free then frees nothing). */
void flm_kv_cache_init_in(flm_kv_cache *c, uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim, void *mem);
void flm_kv_cache_free(flm_kv_cache *c);
/* Row pointers for layer l, position pos. */
float *flm_kv_key(const flm_kv_cache *c, uint32_t l, uint32_t pos);
float *flm_kv_value(const flm_kv_cache *c, uint32_t l, uint32_t pos);

/* Rotate vec (n_heads heads of head_dim floats) in place for position pos: pair i of each head's first rope_dim
 * dimensions turns by pos * theta^(-2i/rope_dim). neox = false: pairs are (x[2i], x[2i+1]) (llama, "normal");
 * neox = true: pairs are (x[i], x[i + rope_dim/2]) (GPT-NeoX order: Qwen2, Gemma). */
void flm_rope(float *vec, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim, uint32_t pos, float theta,
              bool neox);

/* out[n_heads*head_dim] = softmax(scale * q·K^T) V; with f16, q and the softmax weights are rounded to f16 as
 * llama.cpp's CPU path rounds them against its f16 KV cache (the forward pass then stores f16-rounded K and V), so
 * that greedy outputs agree with llama.cpp's wherever the top two logits are not a near-tie; over positions first..pos of layer l (first = 0 for global
 * attention; pos - n_swa + 1 for a sliding window of n_swa tokens), with query head h reading KV head
 * h / (n_heads / n_kv_heads). att is scratch of n_heads * n_ctx floats. */
void flm_attention(const flm_kv_cache *c, uint32_t l, uint32_t first, uint32_t pos, const float *q, uint32_t n_heads,
                   uint32_t n_kv_heads, uint32_t head_dim, float scale, bool f16, float *att, float *out, int n_threads);

#endif
