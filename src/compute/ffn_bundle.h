/* ffn_bundle.h — the FFN computed from neuron bundles (row-column bundling, Knowl 4; the neuron cache's matrix,
 * Knowl 5). Internal.
 *
 * A bundle is one FFN neuron j's weights stored together: up row j | gate row j (gated FFNs) | down column j, each
 * d_model elements of its type (byte offsets in flm_bundle_desc). For n bundles at records + i * record_bytes:
 *     h_i = act(gate_i · x) * (up_i · x)      (gated; act = SiLU, ReLU or GELU)
 *     h_i = act(up_i · x)                      (not gated)
 *     (+ b_up[neuron] inside, after the up dot product, when up_bias is set: OPT)
 *     out = sum_i h_i * down_i                 (out has d_model floats)
 * act is k's act kernel (kernels.h flm_act_fn) in every function here, applied to a few neurons' (or tokens')
 * pre-activations at a time; its result for a value does not depend on the value's position, so the single-token,
 * batch and split forms give the same h_i for the same dot products.
 * Neuron order does not matter (Knowl 5), so any subset of bundles in any order gives the FFN restricted to it. */
#ifndef FLM_COMPUTE_FFN_BUNDLE_H
#define FLM_COMPUTE_FFN_BUNDLE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "compute/act.h"
#include "compute/kernels.h"
#include "core/arena.h"

typedef struct flm_bundle_desc {
    uint32_t d_model;
    uint32_t up_type, gate_type, down_type;
    uint64_t up_off, gate_off, down_off; /* byte offsets inside a record */
    uint64_t record_bytes;
    bool gated;
    flm_act act;                         /* activation (compute/act.h) */
    float threshold;                     /* CATS-style sparsification of SiLU: a neuron whose |act(gate . x)| is at
                                            most threshold contributes nothing (0 = exact FFN) */
    const float *up_bias;                /* NULL, or b_up by neuron (OPT: f32 [d_ffn], resident): up_i · x + b_up[j]
                                            where j = rows[i] (rows given) or i, so records must hold the layer's
                                            neurons in their order (a whole FFN region; not the sparse mode's cache
                                            rows, which are not neuron ids) */
    /* Checked reads fused into the FFN (docs/IO.md, "Checked reads"): NULL, or the record sums of the layer's
     * records in neuron order (sums[j]: core/unit_hash.h of bundle j's record_bytes, as the .flm stores them).
     * Bundles j >= check_from (the records just read from flash; below it: resident ones, checked when they
     * loaded) are hashed right before their first use, while their bytes come into the cache for it; a bundle
     * that does not match is left out (h_j 0; in the tiled batch form its coefficients 0) and counted in
     * check->bad, and the caller must not use the result: it checks the read again and computes once more.
     * Only for calls without rows (the bundle index is the neuron). */
    const uint64_t *sums;
    size_t check_from;
    struct flm_ffn_check *check;
} flm_bundle_desc;

/* What the fused checks of one FFN call found (flm_bundle_desc.sums): records that did not match, bytes hashed and
 * nanoseconds spent hashing, summed over the threads (estimated from every 16th record's hash, preempted samples
 * dropped; it includes bringing the bytes in from memory, which the kernel would otherwise do). Zero it before the
 * call. */
typedef struct flm_ffn_check {
    _Atomic uint64_t bad, bytes, ns;
} flm_ffn_check;

/* out[d_model] = FFN over n bundles (see above): bundle i is records + rows[i] * record_bytes, or
 * records + i * record_bytes when rows is NULL. h receives the n activations h_i (0 for neurons below the threshold).
 * acc is scratch of n_threads * d_model floats. n_threads <= 1: serial. */
void flm_ffn_bundles(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *records, const uint32_t *rows,
                     size_t n, const float *x, float *out, float *h, float *acc, int n_threads, flm_arena *ws);

/* The FFN of a batch of n_x tokens over the same n bundles (records / rows as flm_ffn_bundles): for token b,
 * out_b = sum over the bundles i it uses of h_bi * down_i, with x_b = X + b * x_stride and out_b = OUT + b * out_stride
 * (d_model floats each, overwritten). Token b uses bundle i when mask is NULL or mask[b * mask_stride + i] is
 * non-zero (a sparse batch: each token over its own predicted set within the union the bundles hold). Each bundle is
 * read once for all tokens. Every out_b equals flm_ffn_bundles on that token's bundles to float rounding (the
 * order of the partial sums may differ). acc is scratch of n_threads * n_x * d_model floats; x_b are quantized into
 * the work area ws (compute/work.h: n_x * the activation bytes; the heap when ws is NULL or too small; if that fails,
 * the float-x dot products are used). */
void flm_ffn_bundles_batch(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *records,
                           const uint32_t *rows, size_t n, const uint8_t *mask, size_t mask_stride, size_t n_x,
                           const float *X, size_t x_stride, float *OUT, size_t out_stride, float *acc, int n_threads,
                           flm_arena *ws);

/* The same two over a layer whose records lie in two places (the hot mode, runtime/ffn_hot.c): bundle j < n_head at
 * head + j * record_bytes (the resident hottest neurons), bundle j >= n_head at tail + (j - n_head) * record_bytes
 * (the range streamed from flash). With the same n, threads and inputs, the result is bit for bit that of the
 * one-place call over the whole layer (same thread ranges, same order within each, same reduction): the hot mode's
 * target pass equals ram mode's. The batch form's h_abs (NULL: none) receives, for each bundle i < n, the sum over
 * the tokens of |h_bi| (0 for tokens the mask leaves out): a neuron's activity, which the hot mode's draft window
 * ranks; the threads own disjoint bundle ranges, and it takes no part in the FFN's arithmetic. */
void flm_ffn_bundles_split(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *head, size_t n_head,
                           const uint8_t *tail, const uint32_t *rows, size_t n, const float *x, float *out, float *h,
                           float *acc, int n_threads, flm_arena *ws);
void flm_ffn_bundles_batch_split(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *head, size_t n_head,
                                 const uint8_t *tail, const uint32_t *rows, size_t n, const uint8_t *mask,
                                 size_t mask_stride, size_t n_x, const float *X, size_t x_stride, float *OUT,
                                 size_t out_stride, float *acc, float *h_abs, int n_threads, flm_arena *ws);
/* The most bytes of work area the four calls above take for a layer of d_model and batches of up to n_x tokens on
 * n_threads threads (each thread's tile tmp included). */
size_t flm_ffn_bundles_work(size_t d_model, size_t n_x, int n_threads);

#endif
