#include "compute/ffn_bundle.h"
#include "compute/pool.h"
#include "compute/work.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/types.h"
#include "core/unit_hash.h"

#ifdef _OPENMP
#endif


/* x prepared once per call for the dot products with one weight type (kernels.h: flm_act_quantize): xq is x itself
 * for float weights, else x quantized into the type's vec_dot_type; NULL when its buffer could not be allocated,
 * then the float-x dot is used instead. */
typedef struct act_x {
    const void *xq;
    flm_work_buf w; /* to give back (flm_work_put) */
} act_x;

#define ACT_STACK_BYTES 16384

static void act_prepare(uint32_t t, const float *x, size_t n, uint8_t *stack, flm_arena *ws, act_x *a) {
    const flm_type_traits *tt = flm_type_traits_of(t);
    a->w = (flm_work_buf){NULL, NULL};
    if (tt->vec_dot_type == FLM_TYPE_F32) {
        a->xq = x;
        return;
    }
    size_t ab = flm_act_bytes(t, n);
    void *buf = ab <= ACT_STACK_BYTES ? (void *)stack : (a->w = flm_work_get(ws, ab)).p;
    if (buf) flm_act_quantize(t, x, n, buf);
    a->xq = buf;
}

static inline float row_dot(const flm_kernels *k, uint32_t t, const void *row, const act_x *a, const float *x,
                            size_t n) {
    return a->xq ? k->vec_dot[t](row, a->xq, n) : k->dot[t](row, x, n);
}

/* bundles [i0, i1) into acc (d_model floats, overwritten) */
static inline const uint8_t *record_at(const uint8_t *records, const uint8_t *tail, size_t n_head, size_t j,
                                       uint64_t record_bytes) {
    return j < n_head ? records + j * record_bytes : tail + (j - n_head) * record_bytes;
}

#define ACT_CHUNK 32 /* neurons (single token) or tokens (batch) whose pre-activations go through k->act at once */

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Fused checked reads (flm_bundle_desc.sums), one thread's tally: records hashed (n), their bytes, mismatches, and
 * the time of every 16th hash (CLOCK_MONOTONIC, read without a system call: ~20 ns; timing every record would add a
 * tenth to the hashing). A sample longer than 20 us plus 1 ns per byte is dropped: the thread was preempted inside it
 * (a busy machine's time slices are milliseconds; thread CPU time is a system call here, 0.3-1.3 us, which costs and
 * skews more than it measures). */
typedef struct check_acc {
    uint64_t n, bytes, bad, sampled_bytes, sampled_ns;
} check_acc;

/* Hash bundle j's record rec right before its first use when b checks it (j >= check_from); true when it does not
 * match its sum (the caller leaves it out). */
static inline bool check_record(const flm_bundle_desc *b, const uint8_t *rec, size_t j, check_acc *c) {
    if (!b->sums || j < b->check_from) return false;
    const size_t rb = (size_t)b->record_bytes;
    const bool timed = (c->n++ & 15) == 0;
    const uint64_t t0 = timed ? mono_ns() : 0;
    const bool bad = flm_unit_hash(rec, rb) != b->sums[j];
    if (timed) {
        const uint64_t dt = mono_ns() - t0;
        if (dt <= 20000 + (uint64_t)rb) { /* else preempted: dropped */
            c->sampled_ns += dt;
            c->sampled_bytes += rb;
        }
    }
    c->bytes += rb;
    c->bad += bad;
    return bad;
}

/* Add a thread's tally to b->check (the time scaled from the sampled hashes to all of them). */
static void check_flush(const flm_bundle_desc *b, const check_acc *c) {
    if (!c->n) return;
    const double ns = c->sampled_bytes ? (double)c->sampled_ns * (double)c->bytes / (double)c->sampled_bytes : 0.0;
    atomic_fetch_add_explicit(&b->check->ns, (uint64_t)ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->check->bytes, c->bytes, memory_order_relaxed);
    if (c->bad) atomic_fetch_add_explicit(&b->check->bad, c->bad, memory_order_relaxed);
}

/* The gating decision and coefficient of one neuron from its activation a (k->act of the pre-activation): under a
 * CATS threshold a neuron at or below it contributes nothing; inactive ReLU neurons need no up row. */
static inline bool neuron_active(const flm_bundle_desc *b, float a) {
    return a != 0.0f && (b->threshold == 0.0f || fabsf(a) > b->threshold);
}

static void ffn_range(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *records, const uint8_t *tail,
                      size_t n_head, const uint32_t *rows, size_t i0, size_t i1, const float *x, const act_x *xu,
                      const act_x *xg, float *h, float *acc) {
    flm_axpy_fn axpy_down = k->axpy[b->down_type];
    memset(acc, 0, b->d_model * sizeof(float));
    /* whole records asked for about FLM_PREFETCH_BYTES ahead of the gate dot (kernels.h: flm_prefetch) */
    const size_t ahead = (size_t)((FLM_PREFETCH_BYTES + b->record_bytes - 1) / b->record_bytes);
    for (size_t i = i0; i < i1 && i < i0 + ahead; i++)
        flm_prefetch(record_at(records, tail, n_head, rows ? rows[i] : i, b->record_bytes), 0, b->record_bytes,
                     b->record_bytes);
    float A[ACT_CHUNK]; /* the chunk's pre-activations, then (k->act, in place) its activations */
    check_acc ca = {0};
    for (size_t c0 = i0; c0 < i1; c0 += ACT_CHUNK) {
        const size_t nc = i1 - c0 < ACT_CHUNK ? i1 - c0 : ACT_CHUNK;
        uint64_t bad = 0; /* records of the chunk that did not match (bit r) */
        for (size_t r = 0; r < nc; r++) {
            const size_t j = rows ? rows[c0 + r] : c0 + r;
            const uint8_t *rec = record_at(records, tail, n_head, j, b->record_bytes);
            if (c0 + r + ahead < i1) {
                const size_t jn = rows ? rows[c0 + r + ahead] : c0 + r + ahead;
                flm_prefetch(record_at(records, tail, n_head, jn, b->record_bytes), 0, b->record_bytes,
                             b->record_bytes);
            }
            /* hashed right before the gate dot: the same bytes, brought into L1 once */
            if (check_record(b, rec, j, &ca)) bad |= UINT64_C(1) << r;
            A[r] = bad >> r & 1 ? 0.0f /* left out */
                 : b->gated ? row_dot(k, b->gate_type, rec + b->gate_off, xg, x, b->d_model)
                            : row_dot(k, b->up_type, rec + b->up_off, xu, x, b->d_model) + (b->up_bias ? b->up_bias[j]
                                                                                                       : 0.0f);
        }
        k->act(b->act, A, A, NULL, nc);
        for (size_t r = 0; r < nc; r++) { /* the down rows in neuron order, as one neuron at a time */
            const size_t i = c0 + r, j = rows ? rows[i] : i;
            const uint8_t *rec = record_at(records, tail, n_head, j, b->record_bytes);
            const float a = bad >> r & 1 ? 0.0f : A[r];
            float v = 0.0f;
            if (neuron_active(b, a))
                v = b->gated ? a * (row_dot(k, b->up_type, rec + b->up_off, xu, x, b->d_model) +
                                    (b->up_bias ? b->up_bias[j] : 0.0f))
                             : a;
            h[i] = v;
            if (v != 0.0f) axpy_down(rec + b->down_off, v, acc, b->d_model);
        }
    }
    check_flush(b, &ca);
}

/* One thread's share (part `part` of the split, 0 serial): bundles [i0, i1) into acc (overwritten). */
typedef void (*range_fn)(const void *arg, size_t part, size_t i0, size_t i1, float *acc);

/* split_reduce's two steps over T parts (each part's range depends only on its index: the same sums for any
 * scheduling of the parts) */
typedef struct split_job {
    range_fn fn;
    const void *arg;
    size_t n, T, m, d;
    float *acc, *out;
    size_t stride;
} split_job;

static void split_part(void *arg, size_t t) {
    const split_job *J = arg;
    J->fn(J->arg, t, J->n * t / J->T, J->n * (t + 1) / J->T, J->acc + t * J->m);
}

static void split_sum(void *arg, size_t t) {
    const split_job *J = arg;
    const size_t j0 = J->m * t / J->T, j1 = J->m * (t + 1) / J->T, d = J->d;
    for (size_t j = j0; j < j1; j++) {
        float sum = 0.0f;
        for (size_t u = 0; u < J->T; u++) sum += J->acc[u * J->m + j];
        J->out[(j / d) * J->stride + j % d] = sum;
    }
}

/* Run fn over bundles [0, n) split into n_threads contiguous ranges, each into its own accumulator of m floats
 * (acc + t * m), then sum the accumulators: element j (j < m) goes to out + (j / d) * stride + j % d (rows of d
 * floats, stride apart). Serial below 64 bundles (a fork costs more); serial and contiguous (stride == d): straight
 * into out. */
static void split_reduce(size_t n, int n_threads, size_t m, size_t d, range_fn fn, const void *arg, float *acc,
                         float *out, size_t stride) {
    int nt = n_threads;
    if (nt < 1 || n < 64) nt = 1;
    if (nt == 1) {
        if (stride == d) { fn(arg, 0, 0, n, out); return; }
        fn(arg, 0, 0, n, acc);
        for (size_t j = 0; j < m; j += d) memcpy(out + (j / d) * stride, acc + j, d * sizeof(float));
        return;
    }
    split_job J = {fn, arg, n, (size_t)nt, m, d, acc, out, stride};
    flm_pool_run(nt, (size_t)nt, split_part, &J);   /* part t: bundles [n t / T, n (t + 1) / T) into acc + t m */
    flm_pool_run(nt, (size_t)nt, split_sum, &J);    /* part t: outputs [m t / T, m (t + 1) / T), summed in order */
}

typedef struct one_args {
    const flm_kernels *k;
    const flm_bundle_desc *b;
    const uint8_t *records, *tail;
    size_t n_head;
    const uint32_t *rows;
    const float *x;
    const act_x *xu, *xg;
    float *h;
} one_args;

static void one_range(const void *arg, size_t part, size_t i0, size_t i1, float *acc) {
    (void)part;
    const one_args *a = arg;
    ffn_range(a->k, a->b, a->records, a->tail, a->n_head, a->rows, i0, i1, a->x, a->xu, a->xg, a->h, acc);
}

void flm_ffn_bundles_split(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *head, size_t n_head,
                           const uint8_t *tail, const uint32_t *rows, size_t n, const float *x, float *out, float *h,
                           float *acc, int n_threads, flm_arena *ws) {
    /* x quantized once for the up and gate rows (one buffer when both types share a vec_dot_type) */
    _Alignas(64) uint8_t su[ACT_STACK_BYTES], sg[ACT_STACK_BYTES];
    const uint64_t mark = flm_work_mark(ws);
    act_x xu, xg;
    act_prepare(b->up_type, x, b->d_model, su, ws, &xu);
    xg = xu;
    xg.w = (flm_work_buf){NULL, NULL};
    if (b->gated && flm_type_traits_of(b->gate_type)->vec_dot_type != flm_type_traits_of(b->up_type)->vec_dot_type)
        act_prepare(b->gate_type, x, b->d_model, sg, ws, &xg);
    one_args args = {k, b, head, tail, n_head, rows, x, &xu, &xg, h};
    split_reduce(n, n_threads, b->d_model, b->d_model, one_range, &args, acc, out, b->d_model);
    flm_work_put(ws, mark, &xu.w);
    flm_work_put(ws, mark, &xg.w);
}

void flm_ffn_bundles(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *records, const uint32_t *rows,
                     size_t n, const float *x, float *out, float *h, float *acc, int n_threads, flm_arena *ws) {
    flm_ffn_bundles_split(k, b, records, SIZE_MAX, NULL, rows, n, x, out, h, acc, n_threads, ws);
}

/* x_b prepared for the dot products with one weight type, for a batch: xq + b * bytes, or NULL (float x). */
typedef struct act_batch {
    uint8_t *xq;
    size_t bytes;
    flm_work_buf w; /* to give back (flm_work_put) */
} act_batch;

static void act_batch_prepare(uint32_t t, const float *X, size_t x_stride, size_t n_x, size_t n, flm_arena *ws,
                              act_batch *a) {
    const flm_type_traits *tt = flm_type_traits_of(t);
    a->xq = NULL;
    a->bytes = 0;
    a->w = (flm_work_buf){NULL, NULL};
    if (tt->vec_dot_type == FLM_TYPE_F32) return;
    a->bytes = (flm_act_bytes(t, n) + 63) & ~(size_t)63;
    if (!(a->xq = (a->w = flm_work_get(ws, a->bytes * n_x)).p)) return;
    for (size_t b = 0; b < n_x; b++) flm_act_quantize(t, X + b * x_stride, n, a->xq + b * a->bytes);
}

static inline float batch_dot(const flm_kernels *k, uint32_t t, const void *row, const act_batch *a, size_t b,
                              const float *x, size_t n) {
    return a->xq ? k->vec_dot[t](row, a->xq + b * a->bytes, n) : k->dot[t](row, x, n);
}

#define TILE_NB 16 /* neurons per tile: their gate and up rows unpacked once for a group of tokens (16: a vnni panel) */
#define TILE_NX 32 /* tokens per group */
#define TILE_NG 32 /* neurons per down group: the tokens' accumulators (n_x x d_model floats, in L2) pass through the
                      registers once per TILE_NG down rows instead of once per tile (measured: 8 rows per pass left
                      the 512-bit axpy_tile no faster than the 256-bit one) */

/* ffn_range_batch with the tile kernels (every record from `records`/`tail` in order, no mask): the gate and up dot
 * products of TILE_NB neurons for up to TILE_NX tokens at once (vec_dot_tile: the same bits as vec_dot), then the
 * down rows of TILE_NG neurons added into each token's accumulator in the order of the plain loop (neuron by neuron,
 * token by token), so every token's sums are the plain loop's bit for bit. */
static void ffn_range_batch_tiled(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *records,
                                  const uint8_t *tail, size_t n_head, size_t i0, size_t i1, size_t n_x,
                                  const act_batch *xu, const act_batch *xg, float *acc, float *h_abs, void *tmp) {
    const size_t d = b->d_model;
    const uint64_t rb = b->record_bytes;
    flm_axpy_fn axpy_down = k->axpy[b->down_type];
    const flm_axpy_tile_fn at = k->axpy_tile[b->down_type];
    const flm_vec_dot_tile_fn tg = b->gated ? k->vec_dot_tile[b->gate_type] : NULL, tu = k->vec_dot_tile[b->up_type];
    float G[TILE_NB * TILE_NX], U[TILE_NB * TILE_NX], C[TILE_NG * TILE_NX];
    check_acc ca = {0};
    if (h_abs)
        for (size_t i = i0; i < i1; i++) h_abs[i] = 0.0f;
    for (size_t i = i0; i < i1;) {
        size_t ng = i1 - i < TILE_NG ? i1 - i : TILE_NG;
        if (i < n_head && i + ng > n_head) ng = n_head - i; /* a group never straddles the resident/streamed seam */
        const uint8_t *rec = record_at(records, tail, n_head, i, rb);
        uint64_t bad = 0; /* the group's records that did not match (bit r), hashed before the group uses them */
        for (size_t r = 0; r < ng; r++) {
            if (b->sums && i + ng + r < i1) /* the next group's records come in while this one is hashed */
                flm_prefetch(record_at(records, tail, n_head, i + ng + r, rb), 0, rb, rb);
            if (check_record(b, rec + r * rb, i + r, &ca)) bad |= UINT64_C(1) << r;
        }
        for (size_t t0 = 0; t0 < n_x; t0 += TILE_NX) {
            const size_t nt = n_x - t0 < TILE_NX ? n_x - t0 : TILE_NX;
            for (size_t s = 0; s < ng; s += TILE_NB) {
                const size_t nb = ng - s < TILE_NB ? ng - s : TILE_NB;
                const uint8_t *rs = rec + s * rb;
                if (tg) tg(rs + b->gate_off, rb, nb, xg->xq + t0 * xg->bytes, xg->bytes, nt, d, G, nb, tmp);
                tu(rs + b->up_off, rb, nb, xu->xq + t0 * xu->bytes, xu->bytes, nt, d, U, nb, tmp);
                if (!b->gated) /* G: the pre-activations up + b_up */
                    for (size_t t = 0; t < nt; t++)
                        for (size_t r = 0; r < nb; r++)
                            G[t * nb + r] = U[t * nb + r] + (b->up_bias ? b->up_bias[i + s + r] : 0.0f);
                k->act(b->act, G, G, NULL, nt * nb); /* G: the activations */
                for (size_t r = 0; r < nb; r++) {
                    const size_t j = i + s + r;
                    const float bu = b->up_bias ? b->up_bias[j] : 0.0f;
                    for (size_t t = 0; t < nt; t++) {
                        const float a = G[t * nb + r];
                        float v = 0.0f;
                        if (neuron_active(b, a) && !(bad >> (s + r) & 1)) v = b->gated ? a * (U[t * nb + r] + bu) : a;
                        C[t * ng + s + r] = v; /* the coefficients */
                        if (h_abs) h_abs[j] += fabsf(v); /* not part of the FFN's arithmetic */
                    }
                }
            }
            if (at) at(rec + b->down_off, rb, ng, C, ng, acc + t0 * d, d, nt, d);
            else
                for (size_t r = 0; r < ng; r++)
                    for (size_t t = 0; t < nt; t++)
                        if (C[t * ng + r] != 0.0f)
                            axpy_down(rec + r * rb + b->down_off, C[t * ng + r], acc + (t0 + t) * d, d);
        }
        i += ng;
    }
    check_flush(b, &ca);
}

/* bundles [i0, i1) for every token into acc (n_x rows of d_model floats, overwritten) */
static void ffn_range_batch(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *records,
                            const uint8_t *tail, size_t n_head, const uint32_t *rows, size_t i0, size_t i1,
                            const uint8_t *mask, size_t mask_stride, size_t n_x, const float *X, size_t x_stride,
                            const act_batch *xu, const act_batch *xg, float *acc, float *h_abs, void *tmp) {
    const size_t d = b->d_model;
    flm_axpy_fn axpy_down = k->axpy[b->down_type];
    memset(acc, 0, n_x * d * sizeof(float));
    if (!rows && !mask && xu->xq && k->vec_dot_tile[b->up_type] &&
        (!b->gated || (xg->xq && k->vec_dot_tile[b->gate_type]))) {
        ffn_range_batch_tiled(k, b, records, tail, n_head, i0, i1, n_x, xu, xg, acc, h_abs, tmp);
        return;
    }
    check_acc ca = {0};
    for (size_t i = i0; i < i1; i++) {
        const size_t j = rows ? rows[i] : i;
        const uint8_t *rec = record_at(records, tail, n_head, j, b->record_bytes);
        const float bu = b->up_bias ? b->up_bias[j] : 0.0f;
        float sum_abs = 0.0f; /* h_abs only: not part of the FFN's arithmetic */
        if (check_record(b, rec, j, &ca)) { /* left out: did not match */
            if (h_abs) h_abs[i] = 0.0f;
            continue;
        }
        for (size_t t0 = 0; t0 < n_x;) {
            /* the next up to ACT_CHUNK tokens that use neuron i: their pre-activations, then k->act on them */
            uint32_t T[ACT_CHUNK];
            float A[ACT_CHUNK];
            size_t nc = 0;
            for (; t0 < n_x && nc < ACT_CHUNK; t0++) {
                if (mask && !mask[t0 * mask_stride + i]) continue;
                const float *x = X + t0 * x_stride;
                T[nc] = (uint32_t)t0;
                A[nc++] = b->gated ? batch_dot(k, b->gate_type, rec + b->gate_off, xg, t0, x, d)
                                   : batch_dot(k, b->up_type, rec + b->up_off, xu, t0, x, d) + bu;
            }
            if (nc == 0) break;
            k->act(b->act, A, A, NULL, nc);
            for (size_t c = 0; c < nc; c++) {
                const size_t t = T[c];
                const float a = A[c];
                float v = 0.0f;
                if (neuron_active(b, a))
                    v = b->gated ? a * (batch_dot(k, b->up_type, rec + b->up_off, xu, t, X + t * x_stride, d) + bu)
                                 : a;
                if (v != 0.0f) axpy_down(rec + b->down_off, v, acc + t * d, d);
                sum_abs += fabsf(v);
            }
        }
        if (h_abs) h_abs[i] = sum_abs;
    }
    check_flush(b, &ca);
}

typedef struct batch_args {
    const flm_kernels *k;
    const flm_bundle_desc *b;
    const uint8_t *records, *tail;
    size_t n_head;
    const uint32_t *rows;
    const uint8_t *mask;
    size_t mask_stride, n_x;
    const float *X;
    size_t x_stride;
    const act_batch *xu, *xg;
    float *h_abs;
    uint8_t *tmp;     /* one tile tmp per part (flm_tile_tmp_bytes(d_model, TILE_NX)), or NULL */
    size_t tmp_bytes;
} batch_args;

static void batch_range(const void *arg, size_t part, size_t i0, size_t i1, float *acc) {
    const batch_args *a = arg;
    ffn_range_batch(a->k, a->b, a->records, a->tail, a->n_head, a->rows, i0, i1, a->mask, a->mask_stride, a->n_x,
                    a->X, a->x_stride, a->xu, a->xg, acc, a->h_abs, a->tmp ? a->tmp + part * a->tmp_bytes : NULL);
}

void flm_ffn_bundles_batch_split(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *head, size_t n_head,
                                 const uint8_t *tail, const uint32_t *rows, size_t n, const uint8_t *mask,
                                 size_t mask_stride, size_t n_x, const float *X, size_t x_stride, float *OUT,
                                 size_t out_stride, float *acc, float *h_abs, int n_threads, flm_arena *ws) {
    const size_t d = b->d_model;
    const uint64_t mark = flm_work_mark(ws);
    act_batch xu, xg;
    act_batch_prepare(b->up_type, X, x_stride, n_x, d, ws, &xu);
    bool own_g = b->gated &&
                 flm_type_traits_of(b->gate_type)->vec_dot_type != flm_type_traits_of(b->up_type)->vec_dot_type;
    if (own_g) act_batch_prepare(b->gate_type, X, x_stride, n_x, d, ws, &xg);
    else xg = xu;
    if ((xu.bytes && !xu.xq) || (own_g && xg.bytes && !xg.xq)) { /* no memory: float-x dots for both */
        flm_work_put(ws, mark, &xu.w);
        if (own_g) flm_work_put(ws, mark, &xg.w);
        xu = xg = (act_batch){NULL, 0, {NULL, NULL}};
        own_g = false;
    }
    /* the tiles' tmp, one per part (split_reduce runs at most n_threads parts) */
    const size_t tb = flm_tile_tmp_bytes(d, n_x < TILE_NX ? n_x : TILE_NX), parts = n_threads > 1 ? (size_t)n_threads : 1;
    flm_work_buf tw = {NULL, NULL};
    if (tb && xu.xq) tw = flm_work_get(ws, parts * tb);
    batch_args args = {k, b, head, tail, n_head, rows, mask, mask_stride, n_x, X, x_stride, &xu, &xg, h_abs, tw.p, tb};
    split_reduce(n, n_threads, n_x * d, d, batch_range, &args, acc, OUT, out_stride);
    flm_work_put(ws, mark, &tw);
    flm_work_put(ws, mark, &xu.w);
    if (own_g) flm_work_put(ws, mark, &xg.w);
}

size_t flm_ffn_bundles_work(size_t d_model, size_t n_x, int n_threads) {
    const size_t ab = flm_act_bytes_max(d_model);
    /* one token: the up and gate activations on the stack up to ACT_STACK_BYTES each; a batch: n_x of each, and a
     * tile tmp per thread */
    const size_t one = ab > ACT_STACK_BYTES ? 2 * ab : 0,
                 batch = n_x > 1 ? 2 * n_x * ab + (size_t)(n_threads > 1 ? n_threads : 1) *
                                                      flm_tile_tmp_bytes(d_model, n_x < TILE_NX ? n_x : TILE_NX) + 64
                                 : 0;
    return (one > batch ? one : batch) + 2 * 64;
}

void flm_ffn_bundles_batch(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *records,
                           const uint32_t *rows, size_t n, const uint8_t *mask, size_t mask_stride, size_t n_x,
                           const float *X, size_t x_stride, float *OUT, size_t out_stride, float *acc, int n_threads,
                           flm_arena *ws) {
    flm_ffn_bundles_batch_split(k, b, records, SIZE_MAX, NULL, rows, n, mask, mask_stride, n_x, X, x_stride, OUT,
                                out_stride, acc, NULL, n_threads, ws);
}
