/* attn_tile.c — L_compute: the scalar reference of the attention tile kernels (kernels.h flm_attn_scores_tile_fn,
 * flm_attn_values_tile_fn): each cache row converted to floats once, then used by every row of the block; each sum in
 * order, product then add, as the scalar attn_scores_f16 / attn_values_f16 and the f32 loops of attention.c. */
#include <string.h>

#include "compute/attention.h"
#include "compute/attn_tile.h"

/* row t of an f16 or f32 cache block, d elements, as floats into f */
static void cache_row(const void *X, uint32_t elem_bytes, size_t stride, size_t t, size_t d, float *f) {
    if (elem_bytes == FLM_KV_F32) {
        memcpy(f, (const float *)X + t * stride, d * sizeof *f);
        return;
    }
    const uint16_t *h = (const uint16_t *)X + t * stride;
    for (size_t i = 0; i < d; i++) f[i] = flm_f16_to_f32(h[i]);
}

void flm_attn_scores_tile_ref(const float *const *q, size_t n_rows, const void *K, uint32_t elem_bytes, size_t stride,
                              size_t n, size_t d, float scale, float *const *out) {
    float k[FLM_ATT_MAX_HEAD_DIM];
    for (size_t t = 0; t < n; t++) {
        cache_row(K, elem_bytes, stride, t, d, k);
        for (size_t r = 0; r < n_rows; r++) {
            const float *qr = q[r];
            float s = 0.0f;
            for (size_t i = 0; i < d; i++) s += qr[i] * k[i];
            out[r][t] = s * scale;
        }
    }
}

void flm_attn_values_tile_ref(const float *const *w, size_t n_rows, const void *V, uint32_t elem_bytes, size_t stride,
                              size_t n, size_t d, float *const *o) {
    float v[FLM_ATT_MAX_HEAD_DIM];
    for (size_t t = 0; t < n; t++) {
        cache_row(V, elem_bytes, stride, t, d, v);
        for (size_t r = 0; r < n_rows; r++) {
            const float a = w[r][t];
            float *orow = o[r];
            for (size_t i = 0; i < d; i++) orow[i] += a * v[i];
        }
    }
}

void flm_attn_tile_fill_scalar(flm_kernels *k) {
    k->attn_scores_tile = flm_attn_scores_tile_ref;
    k->attn_values_tile = flm_attn_values_tile_ref;
}
