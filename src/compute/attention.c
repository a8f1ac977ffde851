#include "compute/attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/kernels.h"
#include "core/error.h"

uint64_t flm_kv_cache_bytes(uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim) {
    return 2ull * n_layers * n_ctx * kv_dim * sizeof(float);
}

flm_status flm_kv_cache_init(flm_kv_cache *c, uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim, flm_error *err) {
    size_t n = (size_t)n_layers * n_ctx * kv_dim;
    c->n_layers = n_layers;
    c->n_ctx = n_ctx;
    c->kv_dim = kv_dim;
    c->owned = true;
    c->k = calloc(n, sizeof(float));
    c->v = calloc(n, sizeof(float));
    if (!c->k || !c->v) {
        flm_kv_cache_free(c);
        return flm_fail(err, FLM_ERR_NOMEM, "KV cache: cannot allocate %llu bytes",
                        (unsigned long long)flm_kv_cache_bytes(n_layers, n_ctx, kv_dim));
    }
    return FLM_OK;
}

void flm_kv_cache_init_in(flm_kv_cache *c, uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim, void *mem) {
    size_t n = (size_t)n_layers * n_ctx * kv_dim;
    *c = (flm_kv_cache){n_layers, n_ctx, kv_dim, (float *)mem, (float *)mem + n, false};
}

void flm_kv_cache_free(flm_kv_cache *c) {
    if (c->owned) {
        free(c->k);
        free(c->v);
    }
    c->k = c->v = NULL;
}

float *flm_kv_key(const flm_kv_cache *c, uint32_t l, uint32_t pos) {
    return c->k + ((size_t)l * c->n_ctx + pos) * c->kv_dim;
}
float *flm_kv_value(const flm_kv_cache *c, uint32_t l, uint32_t pos) {
    return c->v + ((size_t)l * c->n_ctx + pos) * c->kv_dim;
}

void flm_rope(float *vec, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim, uint32_t pos, float theta,
              bool neox) {
    const uint32_t half = rope_dim / 2;
    for (uint32_t i = 0; i < half; i++) {
        float freq = 1.0f / powf(theta, (float)(2 * i) / (float)rope_dim);
        float val = (float)pos * freq;
        float fcr = cosf(val), fci = sinf(val);
        uint32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        for (uint32_t h = 0; h < n_heads; h++) {
            float *v = vec + (size_t)h * head_dim;
            float v0 = v[a], v1 = v[b];
            v[a] = v0 * fcr - v1 * fci;
            v[b] = v0 * fci + v1 * fcr;
        }
    }
}

void flm_attention(const flm_kv_cache *c, uint32_t l, uint32_t first, uint32_t pos, const float *q, uint32_t n_heads,
                   uint32_t n_kv_heads, uint32_t head_dim, float scale, bool f16, float *att, float *out, int n_threads) {
    uint32_t group = n_heads / n_kv_heads;
    int nt = (n_threads > 1 && pos - first >= 64) ? n_threads : 1;
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int h = 0; h < (int)n_heads; h++) {
        float qh[FLM_ATT_MAX_HEAD_DIM]; /* q rounded to f16, as llama.cpp multiplies it with its f16 K cache */
        for (uint32_t i = 0; i < head_dim; i++)
            qh[i] = f16 ? flm_f16_to_f32(flm_f32_to_f16(q[(size_t)h * head_dim + i])) : q[(size_t)h * head_dim + i];
        float *a = att + (size_t)h * c->n_ctx;
        size_t koff = (size_t)(h / group) * head_dim;
        for (uint32_t t = first; t <= pos; t++) {
            const float *k = flm_kv_key(c, l, t) + koff;
            float s = 0.0f;
            for (uint32_t i = 0; i < head_dim; i++) s += qh[i] * k[i];
            a[t - first] = s * scale;
        }
        flm_softmax(a, pos - first + 1);
        for (uint32_t t = 0; f16 && t <= pos - first; t++) a[t] = flm_f16_to_f32(flm_f32_to_f16(a[t])); /* as llama.cpp */
        float *o = out + (size_t)h * head_dim;
        memset(o, 0, head_dim * sizeof(float));
        for (uint32_t t = first; t <= pos; t++) {
            const float *v = flm_kv_value(c, l, t) + koff;
            float w = a[t - first];
            for (uint32_t i = 0; i < head_dim; i++) o[i] += w * v[i];
        }
    }
}
