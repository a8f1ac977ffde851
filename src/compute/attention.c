#include "compute/attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/kernels.h"
#include "compute/pool.h"
#include "core/error.h"

uint64_t flm_kv_cache_bytes(uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim, uint32_t elem_bytes) {
    return 2ull * n_layers * n_ctx * kv_dim * elem_bytes;
}

flm_status flm_kv_cache_init(flm_kv_cache *c, uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim, uint32_t elem_bytes,
                             flm_error *err) {
    memset(c, 0, sizeof *c);
    if (elem_bytes != FLM_KV_F16 && elem_bytes != FLM_KV_F32)
        return flm_fail(err, FLM_ERR_ARG, "KV cache: %u bytes per element (2: f16, 4: f32)", elem_bytes);
    size_t n = (size_t)n_layers * n_ctx * kv_dim;
    c->n_layers = n_layers;
    c->n_ctx = n_ctx;
    c->kv_dim = kv_dim;
    c->elem_bytes = elem_bytes;
    c->owned = true;
    c->k = calloc(n, elem_bytes);
    c->v = calloc(n, elem_bytes);
    if (!c->k || !c->v) {
        flm_kv_cache_free(c);
        return flm_fail(err, FLM_ERR_NOMEM, "KV cache: cannot allocate %llu bytes",
                        (unsigned long long)flm_kv_cache_bytes(n_layers, n_ctx, kv_dim, elem_bytes));
    }
    return FLM_OK;
}

void flm_kv_cache_init_in(flm_kv_cache *c, uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim, uint32_t elem_bytes,
                          void *mem) {
    size_t n = (size_t)n_layers * n_ctx * kv_dim;
    *c = (flm_kv_cache){n_layers, n_ctx, kv_dim, elem_bytes, mem, (uint8_t *)mem + n * elem_bytes, false};
}

void flm_kv_cache_free(flm_kv_cache *c) {
    if (c->owned) {
        free(c->k);
        free(c->v);
    }
    c->k = c->v = NULL;
}

void *flm_kv_key(const flm_kv_cache *c, uint32_t l, uint32_t pos) {
    return (uint8_t *)c->k + ((size_t)l * c->n_ctx + pos) * c->kv_dim * c->elem_bytes;
}
void *flm_kv_value(const flm_kv_cache *c, uint32_t l, uint32_t pos) {
    return (uint8_t *)c->v + ((size_t)l * c->n_ctx + pos) * c->kv_dim * c->elem_bytes;
}

void flm_kv_store(const flm_kernels *kt, const flm_kv_cache *c, uint32_t l, uint32_t pos, const float *k,
                  const float *v) {
    void *kr = flm_kv_key(c, l, pos), *vr = flm_kv_value(c, l, pos);
    if (c->elem_bytes == FLM_KV_F32) {
        memcpy(kr, k, c->kv_dim * sizeof(float));
        memcpy(vr, v, c->kv_dim * sizeof(float));
        return;
    }
    kt->to_f16(kr, k, c->kv_dim);
    kt->to_f16(vr, v, c->kv_dim);
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

/* flm_attention's chunks: one query head each */
typedef struct att_job {
    const flm_kernels *k;
    const flm_kv_cache *c;
    uint32_t l, first, pos, group, n, head_dim;
    const float *q;
    float scale, *att, *out;
    const uint8_t *mask;
} att_job;

static void att_head(void *arg, size_t hh) {
    const att_job *J = arg;
    const flm_kernels *k = J->k;
    const flm_kv_cache *c = J->c;
    const uint32_t l = J->l, first = J->first, pos = J->pos, n = J->n, head_dim = J->head_dim;
    const float *q = J->q;
    const float scale = J->scale;
    const int h = (int)hh;
    float *a = J->att + (size_t)h * c->n_ctx;
    float *o = J->out + (size_t)h * head_dim;
    size_t koff = (size_t)(h / J->group) * head_dim;
    if (c->elem_bytes == FLM_KV_F16) {
        float qh[FLM_ATT_MAX_HEAD_DIM]; /* q rounded to f16, as llama.cpp multiplies it with its f16 K cache */
        k->round_f16(qh, q + (size_t)h * head_dim, head_dim);
        k->attn_scores_f16(qh, (const uint16_t *)flm_kv_key(c, l, first) + koff, c->kv_dim, n, head_dim, scale, a);
        if (J->mask)
            for (uint32_t t = 0; t < n; t++)
                if (!J->mask[t]) a[t] = -INFINITY;
        flm_softmax(k, a, n);
        k->round_f16(a, a, n); /* as llama.cpp */
        k->attn_values_f16(a, (const uint16_t *)flm_kv_value(c, l, first) + koff, c->kv_dim, n, head_dim, o);
        return;
    }
    const float *qf = q + (size_t)h * head_dim;
    for (uint32_t t = first; t <= pos; t++) {
        const float *kr = (const float *)flm_kv_key(c, l, t) + koff;
        float s = 0.0f;
        for (uint32_t i = 0; i < head_dim; i++) s += qf[i] * kr[i];
        a[t - first] = J->mask && !J->mask[t - first] ? -INFINITY : s * scale;
    }
    flm_softmax(k, a, n);
    memset(o, 0, head_dim * sizeof(float));
    for (uint32_t t = first; t <= pos; t++) {
        const float *v = (const float *)flm_kv_value(c, l, t) + koff;
        float w = a[t - first];
        for (uint32_t i = 0; i < head_dim; i++) o[i] += w * v[i];
    }
}

void flm_attention(const flm_kernels *k, const flm_kv_cache *c, uint32_t l, uint32_t first, uint32_t pos,
                   const float *q, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float scale, float *att,
                   float *out, int n_threads, const uint8_t *mask) {
    const att_job J = {k, c, l, first, pos, n_heads / n_kv_heads, pos - first + 1, head_dim, q, scale, att, out,
                       mask};
    flm_pool_run(n_threads > 1 && pos - first >= 64 ? n_threads : 1, n_heads, att_head, (void *)&J);
}
