/* backend_cpu.c — the CPU backend (runtime/backend.h): the host's memory, the KV cache in it, the blocks of
 * runtime/forward.c over the kernel table of compute/kernels.h, the bundle FFN of compute/ffn_bundle.c. Every
 * operation is the function the forward pass called directly before the seam, so the results are those bits. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "core/types.h"
#include "runtime/backend.h"
#include "runtime/runtime.h"

static flm_status cpu_mem_init(flm_backend *be, flm_arena *a, uint64_t bytes, flm_error *err) {
    (void)be;
    if (flm_arena_init(a, bytes))
        return flm_fail(err, FLM_ERR_NOMEM, "cannot allocate %llu bytes for the KV cache and activations",
                        (unsigned long long)bytes);
    return FLM_OK;
}

static void cpu_mem_free(flm_backend *be, flm_arena *a) {
    (void)be;
    flm_arena_free(a);
}

static void cpu_copy(const flm_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (dst != src) memcpy(dst, src, bytes);
}

static void cpu_kv_init(flm_backend *be, uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim, uint32_t elem_bytes,
                        void *mem) {
    flm_kv_cache_init_in(&be->kv, n_layers, n_ctx, kv_dim, elem_bytes, mem);
}

static void cpu_kv_copy(const flm_backend *be, uint32_t dst, uint32_t src) {
    const flm_kv_cache *c = &be->kv;
    const size_t row = (size_t)c->kv_dim * c->elem_bytes;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        memcpy(flm_kv_key(c, l, dst), flm_kv_key(c, l, src), row);
        memcpy(flm_kv_value(c, l, dst), flm_kv_value(c, l, src), row);
    }
}

static void cpu_embed_rows(const flm_pass *P, const flm_weight *table, const void *rows, const int32_t *ids,
                           float scale, float *out, size_t out_stride) {
    const size_t row_bytes = flm_row_bytes(table->type, table->n_in);
    for (uint32_t t = 0; t < P->n; t++) {
        float *x = out + t * out_stride;
        const uint8_t *src = rows ? (const uint8_t *)rows + t * row_bytes
                                  : (const uint8_t *)table->data + (size_t)ids[t] * row_bytes;
        P->k->dequant[table->type](src, x, table->n_in);
        if (scale != 0.0f)
            for (size_t i = 0; i < table->n_in; i++) x[i] *= scale;
    }
}

static void cpu_add_bias(const flm_pass *P, float *x, size_t x_stride, const flm_weight *b, uint32_t dim) {
    const float *v = b->data;
    for (uint32_t t = 0; t < P->n; t++) {
        float *y = x + t * x_stride;
        for (uint32_t i = 0; i < dim; i++) y[i] += v[i];
    }
}

static void cpu_bundles(const flm_backend *be, const flm_bundle_desc *b, const uint8_t *records, const uint32_t *rows,
                        size_t n, const float *x, float *out, float *h, float *acc) {
    flm_ffn_bundles(be->k, b, records, rows, n, x, out, h, acc, be->n_threads, be->work);
}

static void cpu_bundles_batch(const flm_backend *be, const flm_bundle_desc *b, const uint8_t *records,
                              const uint32_t *rows, size_t n, const uint8_t *mask, size_t mask_stride, size_t n_x,
                              const float *X, size_t x_stride, float *OUT, size_t out_stride, float *acc) {
    flm_ffn_bundles_batch(be->k, b, records, rows, n, mask, mask_stride, n_x, X, x_stride, OUT, out_stride, acc,
                          be->n_threads, be->work);
}

static void cpu_bundles_split(const flm_backend *be, const flm_bundle_desc *b, const uint8_t *head, size_t n_head,
                              const uint8_t *tail, const uint32_t *rows, size_t n, const float *x, float *out,
                              float *h, float *acc) {
    flm_ffn_bundles_split(be->k, b, head, n_head, tail, rows, n, x, out, h, acc, be->n_threads, be->work);
}

static void cpu_bundles_batch_split(const flm_backend *be, const flm_bundle_desc *b, const uint8_t *head,
                                    size_t n_head, const uint8_t *tail, const uint32_t *rows, size_t n,
                                    const uint8_t *mask, size_t mask_stride, size_t n_x, const float *X,
                                    size_t x_stride, float *OUT, size_t out_stride, float *acc, float *h_abs) {
    flm_ffn_bundles_batch_split(be->k, b, head, n_head, tail, rows, n, mask, mask_stride, n_x, X, x_stride, OUT,
                                out_stride, acc, h_abs, be->n_threads, be->work);
}

/* one pass of integer compares over the exponent bits, nothing next to the matrix products */
static void cpu_watch(flm_backend *be, const float *x, size_t n, uint32_t layer, int what) {
    if (be->bad) return; /* the first note of the pass stands */
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    if (bad) {
        be->bad = true;
        be->bad_layer = layer;
        be->bad_what = what;
    }
}

static bool cpu_verdict(flm_backend *be, uint32_t *layer, int *what) {
    const bool ok = !be->bad;
    *layer = be->bad_layer;
    *what = be->bad_what;
    be->bad = false;
    return ok;
}

const flm_backend_ops flm_backend_cpu = {
    .name = "cpu",
    .device = "host",
    .mem_init = cpu_mem_init,
    .mem_free = cpu_mem_free,
    .upload = cpu_copy,
    .read = cpu_copy,
    .kv_init = cpu_kv_init,
    .kv_copy = cpu_kv_copy,
    .kv_shift = flm_kv_shift_rows,
    .embed_rows = cpu_embed_rows,
    .norm = flm_pass_norm,
    .linear = flm_pass_linear,
    .qkv = flm_pass_qkv,
    .attention = flm_pass_attention,
    .ffn_dense = flm_pass_ffn_dense,
    .residual = flm_pass_residual,
    .add_bias = cpu_add_bias,
    .bundles = cpu_bundles,
    .bundles_batch = cpu_bundles_batch,
    .bundles_split = cpu_bundles_split,
    .bundles_batch_split = cpu_bundles_batch_split,
    .watch = cpu_watch,
    .verdict = cpu_verdict,
};
