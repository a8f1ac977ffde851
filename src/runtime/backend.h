/* backend.h — the device seam: everything the forward pass asks of the device that holds the activations, the KV
 * cache and (for the FFN sources) the FFN compute. Internal.
 *
 * Modelled on ggml's backend interface (ggml-backend-impl.h: a device with buffer types, buffers, tensor get/set, a
 * compute entry): here the entry points are the forward pass's blocks (runtime/pass.h) rather than a graph, since
 * the pass is one fixed sequence of blocks per architecture. A backend is a table of operations (flm_backend_ops)
 * and an instance (flm_backend) that owns the device's memory and the KV cache in it; the forward pass
 * (runtime/forward.c) and the FFN sources call the table, never a host kernel directly, so a second device is one
 * more table and its files (docs/ARCHITECTURE.md, "Adding a device"). The CPU backend (runtime/backend_cpu.c) runs
 * the blocks of runtime/forward.c with the kernel table of compute/kernels.h; tests/test_backend.c runs a model
 * through a counting stub over it and checks the logits bit for bit.
 *
 * Pointers to activations (float rows) are device pointers: on the CPU, host memory. Weights (flm_weight.data,
 * FFN records) are passed as the model holds them; a device backend that keeps copies maps them in its state (the
 * weights' upload is its `upload`). Every block takes the pass (flm_pass: P->be is the instance). */
#ifndef FLM_RUNTIME_BACKEND_H
#define FLM_RUNTIME_BACKEND_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "flashlm.h"
#include "compute/attention.h"
#include "compute/ffn_bundle.h"
#include "compute/kernels.h"
#include "core/arena.h"
#include "model/model.h"
#include "runtime/pass.h"

/* What a non-finite output came from (flm_backend_ops.watch). */
enum { FLM_WATCH_ATTENTION = 1, FLM_WATCH_FFN, FLM_WATCH_OUTPUT };

typedef struct flm_backend flm_backend;

typedef struct flm_backend_ops {
    const char *name;   /* "cpu" */
    const char *device; /* the memory its block is in, as the plan names it (flm_plan_info.device): "host" (the CPU
                           backend; NULL reads as the host), or a device of its own, whose share of the plan's budget
                           is that block (runtime/plan.c, flm_plan_devices); at most 15 characters */

    /* ---- memory: the device's one block (the KV cache and the activations, as the plan sized them) ---- */
    /* mem_init: a block of bytes, the plan's block on this backend's device (flm_plan_info.device[].block: the KV
     * caches, the activations; flm_ctx_block_bytes), its base FLM_CARVE_ALIGN-aligned; the caller carves it.
     * Errors: FLM_ERR_NOMEM. */
    flm_status (*mem_init)(flm_backend *be, flm_arena *a, uint64_t bytes, flm_error *err);
    void (*mem_free)(flm_backend *be, flm_arena *a);
    /* upload: bytes host -> device (dst a device pointer); read: device -> host (the logits, hidden states) */
    void (*upload)(const flm_backend *be, void *dst, const void *src, size_t bytes);
    void (*read)(const flm_backend *be, void *dst, const void *src, size_t bytes);

    /* ---- the KV cache (be->kv), in the device's memory ---- */
    /* kv_init: n_layers x n_ctx rows of kv_dim elements of elem_bytes (FLM_KV_F16 / F32) for keys and for values,
     * at mem (flm_kv_cache_bytes of them). */
    void (*kv_init)(flm_backend *be, uint32_t n_layers, uint32_t n_ctx, uint32_t kv_dim, uint32_t elem_bytes,
                    void *mem);
    /* kv_copy: slot dst <- slot src, keys and values, every layer (tree accept keeps a path) */
    void (*kv_copy)(const flm_backend *be, uint32_t dst, uint32_t src);
    /* kv_shift: slots [from, from + n_move) move to [to, to + n_move) (to < from), every layer, and their keys turn
     * from position old to new by RoPE (runtime/kv_shift.c: the context shift). */
    void (*kv_shift)(const flm_backend *be, const flm_model *m, uint32_t from, uint32_t to, uint32_t n_move,
                     int n_threads);

    /* ---- the blocks of one pass (runtime/pass.h: same arguments, same results bit for bit on the CPU) ---- */
    /* embed_rows: out[t][0..table->n_in) = row ids[t] of table (rows of table->type; from `rows` when non-NULL:
     * host rows read from flash, row t at rows + t * row_bytes, ids ignored), times scale when scale != 0 */
    void (*embed_rows)(const flm_pass *P, const flm_weight *table, const void *rows, const int32_t *ids, float scale,
                       float *out, size_t out_stride);
    void (*norm)(const flm_pass *P, const flm_weight *w, const flm_weight *b, uint32_t dim, const float *in,
                 size_t in_stride, float *out, size_t out_stride);
    void (*linear)(const flm_pass *P, const flm_weight *W, const flm_weight *b, size_t rows, size_t cols,
                   const float *in, size_t in_stride, float *out, size_t out_stride);
    void (*qkv)(const flm_pass *P, const flm_layer_weights *L, const float *in, size_t in_stride, float *q, float *k,
                float *v);
    /* attention, trees included (P->tree), keys and values stored in be->kv */
    void (*attention)(const flm_pass *P, const flm_layer_weights *L, uint32_t kv_layer, float *q, float *k,
                      const float *v, float *out, size_t out_stride);
    void (*ffn_dense)(const flm_pass *P, const flm_layer_weights *L, const float *in, size_t in_stride, float *out,
                      size_t out_stride, float *H, float *U);
    void (*residual)(const flm_pass *P, float *x, float *y, size_t y_stride, const flm_weight *post);
    /* add_bias: x[t][i] += b[i], i < dim, t < P->n, rows x_stride apart (b: f32, resident) */
    void (*add_bias)(const flm_pass *P, float *x, size_t x_stride, const flm_weight *b, uint32_t dim);

    /* ---- the FFN from bundles (compute/ffn_bundle.h; the FFN sources of a .flm file call these) ---- */
    void (*bundles)(const flm_backend *be, const flm_bundle_desc *b, const uint8_t *records, const uint32_t *rows,
                    size_t n, const float *x, float *out, float *h, float *acc);
    void (*bundles_batch)(const flm_backend *be, const flm_bundle_desc *b, const uint8_t *records,
                          const uint32_t *rows, size_t n, const uint8_t *mask, size_t mask_stride, size_t n_x,
                          const float *X, size_t x_stride, float *OUT, size_t out_stride, float *acc);
    void (*bundles_split)(const flm_backend *be, const flm_bundle_desc *b, const uint8_t *head, size_t n_head,
                          const uint8_t *tail, const uint32_t *rows, size_t n, const float *x, float *out, float *h,
                          float *acc);
    void (*bundles_batch_split)(const flm_backend *be, const flm_bundle_desc *b, const uint8_t *head, size_t n_head,
                                const uint8_t *tail, const uint32_t *rows, size_t n, const uint8_t *mask,
                                size_t mask_stride, size_t n_x, const float *X, size_t x_stride, float *OUT,
                                size_t out_stride, float *acc, float *h_abs);

    /* ---- finite checks: asked once per pass ---- */
    /* watch: note whether x[0..n) (rows of a block's output) holds a NaN or Inf, as the output `what`
     * (FLM_WATCH_*) of layer `layer` (UINT32_MAX: none); the first such note of a pass is kept. A device backend
     * reduces on the device; the CPU one compares the bits as it goes. */
    void (*watch)(flm_backend *be, const float *x, size_t n, uint32_t layer, int what);
    /* verdict: true when everything watched since the last verdict was finite; else false with the first
     * non-finite note in *layer, *what. Clears the notes. */
    bool (*verdict)(flm_backend *be, uint32_t *layer, int *what);
} flm_backend_ops;

/* A backend instance: the device's state, its memory and its KV cache. */
struct flm_backend {
    const flm_backend_ops *ops;
    const flm_kernels *k; /* the CPU backend's kernel table (compute/kernels.h), chosen once per process */
    int n_threads;        /* compute threads */
    flm_kv_cache kv;      /* the KV cache, in the device's memory (kv_init) */
    flm_arena *work;      /* the compute calls' temporary buffers (compute/work.h), carved at open from the plan's
                             scratch (flm_scratch.work); NULL: the heap */
    void *state;          /* a backend's own */
    bool bad;             /* the CPU backend's watch: a non-finite output noted this pass, and the first one's */
    uint32_t bad_layer;
    int bad_what;
};

/* The CPU backend (runtime/backend_cpu.c). */
extern const flm_backend_ops flm_backend_cpu;
/* The CPU backend's kv_shift (runtime/kv_shift.c). */
void flm_kv_shift_rows(const flm_backend *be, const flm_model *m, uint32_t from, uint32_t to, uint32_t n_move,
                       int n_threads);

#endif
