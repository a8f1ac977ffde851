/* ffn_hot.c — the hot FFN source (runtime/ffn_source.h): every layer keeps its hottest neurons in memory, the rest
 * of the layer is read from flash as one contiguous range per token (the neuron-level hybrid of docs/SPECULATIVE.md).
 *
 * A .flm file whose FFN records are stored hottest first (`flashlm calibrate` orders them: FLM_FFN_HOT_ORDER in each
 * FFN region entry's flags) has each layer's hot set as a prefix of its region: records [0, n_hot) stay resident,
 * records [n_hot, d_ffn) are one range read with large sequential requests at device bandwidth. The plan chooses one
 * share of every layer's neurons (plan.hot_q16 / 65536, the largest that fits next to the range buffers). Files not
 * ordered run the same way (lossless), with a prefix that is not the hottest: a self-draft from it agrees less often.
 *
 * The target pass is exact: the resident prefix and the streamed range make the whole layer, computed by
 * flm_ffn_bundles_split with the thread ranges and summation order of the ram mode's pass over the same file, so the
 * logits are ram mode's bit for bit. A draft pass (flm_ffn_call.draft: flm_eval_draft, draft trees) computes each FFN over its
 * resident prefix only and reads nothing: the self-draft of speculative decoding.
 *
 * The draft window (plan.window_q16 > 0, flm_params.draft_window; only where a self-draft runs): a share of the
 * resident budget holds, per layer, the records of the streamed neurons most active lately instead of a longer
 * prefix. Every target pass ranks layer l's streamed neurons by a decayed sum of |h_i| (WINDOW_DECAY per token, h
 * from the pass's own kernel call), and copies the records of those that enter the top `cap` from the range buffer
 * they were just computed from into the layer's window (a compact array of records and their neuron indices); the
 * draft then computes over the prefix and the window. The update cannot fail and is done layer by layer after the
 * layer's compute, so a pass that fails leaves every window consistent (its records are the file's records of its
 * indices); the window only changes what the draft proposes, never the target's result. The window's neurons are
 * still streamed (the prefix is shorter by them): it costs reads, so it pays only with a self-draft. Not with FFN
 * up biases (the draft's records would not be in neuron order: flm_bundle_desc.up_bias), where the plan gives it
 * nothing.
 *
 * The draft's correction (with the window): the neurons a draft leaves out (streamed, not in the window) add to every
 * layer's output a part that is far from zero on average, and a draft without it drifts. Each layer keeps the running
 * mean of that part, c_l (d_model floats): after a target pass computed layer l and updated its window, the layer's
 * FFN over the draft's neurons (prefix and window) is computed again for the pass's last FLM_HOT_CORRECTION_ROWS rows,
 * and c_l moves towards y_t - y'_t row by row (y_t the exact output, y'_t the draft's): the mean of the rows so far
 * weighted d^age (d = FLM_HOT_CORRECTION_DECAY), c_l <- c_l + (1 - d) / w_l (y_t - y'_t - c_l) with the weights'
 * sum w_l <- d w_l + (1 - d) (a decayed mean without the start's bias towards 0: after the prompt's 16 rows c_l is
 * their mean, not 28% of it); a draft pass adds c_l to its FFN output. It costs one more FFN over the draft's share of
 * the layer for at most that many rows, under the next layer's read, and changes only what the draft proposes. On
 * Qwen2.5-Coder-1.5B at --mem 50% / 35% / 25% (mode auto, bench, one run) it raised the tokens per target pass from
 * 2.32-2.41 / 2.10-2.32 / 1.41-1.48 to 2.95-3.10 / 2.71-2.83 / 2.03-2.10 (docs/SPECULATIVE.md).
 *
 * Read-ahead: with two range buffers, each with its own read-ahead thread, the reader is kept busy (pump()): at every
 * FFN call, and once a call has its range, when no read is in flight and a buffer is free, the range after the last
 * one asked for is read into it, wrapping to the next pass's first. Within a pass the next layer's range is read while
 * this one is computed; after the last layer the next pass's first range, and once it has arrived and the last
 * layer's buffer is free (at the next call: a draft's), its second, so both buffers fill under the output layer,
 * sampling and a self-draft (which reads no FFN record) and the verification computes its first layer without
 * waiting. Reads are submitted one at a time, in the order the passes use them. When speculation runs (this target
 * pass came right after a draft pass), the next pass's first range waits until the next pass's first FFN call: the
 * next pass is then likely a draft, whose token-embedding rows (read through the same reader, which serves one call
 * at a time) would otherwise wait behind the whole range; the ranges are still read under the drafts' compute, which
 * is longer. Resident prefixes are read once at open and not checksummed (the region's checksum covers the whole
 * region; flashlm verify checks it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/util.h"
#include "io/async_read.h"
#include "runtime/hooks.h"
#include "runtime/runtime.h"

/* Resident records of a layer of n records at share q16 / 65536. */
uint32_t flm_hot_count(uint32_t n, uint32_t q16) {
    return q16 >= 65536u ? n : (uint32_t)(((uint64_t)n * q16) >> 16);
}

void flm_hot_split(uint32_t n, uint32_t q16, uint32_t wq16, uint32_t *hot, uint32_t *win) {
    uint32_t h = flm_hot_count(n, q16);
    uint32_t w = h < n && wq16 ? (uint32_t)(((uint64_t)h * wq16) >> 16) : 0;
    *hot = h - w;
    *win = w;
}

#define WINDOW_DECAY 0.8f /* a streamed neuron's activity score decays by this much per token */
#define HOT_MAX_BUF 4     /* range buffers the source can run (the plan holds two: hot_plan) */

/* Bytes of a layer's window of cap records: the records, their indices, and a score and slot per streamed neuron
 * (ns of them), in one block. */
static uint64_t window_bytes(const flm_region *r, uint32_t cap, uint32_t ns) {
    if (!cap) return 0;
    return flm_align_up(flm_align_up((uint64_t)cap * r->record_bytes, 64) + 4ull * cap + 8ull * ns, FLM_ALIGN);
}

/* The windows' shared block: a copy of the largest layer's scores (the selection), the batch's activities (d_ffn
 * floats), the free slots (the largest window), every layer's correction (n_layers x d_model floats) and the rows of
 * the draft's output it is measured from (FLM_HOT_CORRECTION_ROWS x d_model floats). */
static uint64_t window_select_bytes(uint32_t max_ns, uint32_t d_ffn, uint32_t max_cap) { /* the first three */
    return flm_align_up(4ull * max_ns + 4ull * d_ffn + 4ull * max_cap, 64);
}
static uint64_t window_scratch_bytes(uint32_t max_ns, uint32_t d_ffn, uint32_t max_cap, uint32_t n_layers,
                                     uint32_t d_model) {
    return window_select_bytes(max_ns, d_ffn, max_cap) +
           flm_align_up(4ull * (n_layers + FLM_HOT_CORRECTION_ROWS) * d_model, FLM_ALIGN);
}

/* Bytes of layer l's resident prefix in memory: its records, read from the region's (aligned) start. */
static uint64_t prefix_bytes(const flm_region *r, uint32_t n_hot) {
    return n_hot ? flm_align_up((uint64_t)n_hot * r->record_bytes, FLM_ALIGN) : 0;
}

/* The aligned file span holding layer l's streamed records [n_hot, n): [*off, *off + *len); *skip = bytes before the
 * first streamed record in it. len 0 when nothing streams. */
static void stream_span(const flm_region *r, uint32_t n_hot, uint64_t *off, uint64_t *len, uint64_t *skip) {
    const uint64_t start = (uint64_t)n_hot * r->record_bytes, a = start / FLM_ALIGN * FLM_ALIGN;
    *off = r->offset + a;
    *skip = start - a;
    *len = n_hot >= r->n_records ? 0 : flm_align_up(r->size, FLM_ALIGN) - a;
}

/* FFN bytes at share q with window share wq: the resident prefixes and windows (*res; the windows' part *win) and
 * the largest streamed span (*span). */
static void hot_sizes(const flm_file *f, uint32_t d_model, uint32_t q, uint32_t wq, uint64_t *res, uint64_t *span,
                      uint64_t *win) {
    *res = *span = *win = 0;
    uint32_t max_ns = 0, max_cap = 0, d_ffn = 0;
    for (uint32_t l = 0; l < f->n_layers; l++) {
        const flm_region *r = f->ffn[l];
        uint32_t h, w;
        flm_hot_split(r->n_records, q, wq, &h, &w);
        uint64_t off, len, skip;
        stream_span(r, h, &off, &len, &skip);
        *res += prefix_bytes(r, h);
        *win += window_bytes(r, w, r->n_records - h);
        if (len > *span) *span = len;
        if (w && r->n_records - h > max_ns) max_ns = r->n_records - h;
        if (w > max_cap) max_cap = w;
        if (r->n_records > d_ffn) d_ffn = r->n_records;
    }
    if (*win) *win += window_scratch_bytes(max_ns, d_ffn, max_cap, f->n_layers, d_model);
    *res += *win;
}

static flm_status hot_plan(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, flm_mem_plan *p,
                           flm_error *err) {
    const uint64_t fixed = p->resident + p->kv + p->scratch + p->reader;
    const uint64_t avail = p->budget > fixed ? p->budget - fixed : 0;
    uint32_t nb = p->n_stream_buffers >= 2 ? p->n_stream_buffers : 1; /* budget.c: 2, or 1 without read-ahead */
    uint64_t res, span, win;
    uint32_t wq = p->window_q16; /* asked (flm_budget_plan: flm_params.draft_window) */
    if (hp->arch && (hp->arch->flags & FLM_ARCH_FFN_BIAS)) wq = 0; /* the draft's records are not in neuron order */
    /* the largest share that fits next to nb range buffers (two first: read-ahead hides a layer's compute under the
     * next one's read); none at all when even the buffers do not fit (the plan then reports the overrun) */
    uint32_t q = 65536;
    hot_sizes(f, hp->d_model, q, wq, &res, &span, &win);
    if (p->budget && res + nb * span > avail) {
        for (;; nb--) {
            uint32_t lo = 0, hi = 65536; /* fits(lo) is checked below; fits(hi) is false */
            while (hi - lo > 1) {
                uint32_t mid = lo + (hi - lo) / 2;
                hot_sizes(f, hp->d_model, mid, wq, &res, &span, &win);
                if (res + nb * span <= avail) lo = mid;
                else hi = mid;
            }
            q = lo;
            hot_sizes(f, hp->d_model, q, wq, &res, &span, &win);
            if (res + nb * span <= avail || nb == 1) break;
        }
    }
    p->hot_q16 = q;
    p->window_q16 = win ? wq : 0;
    p->window = win;
    p->n_stream_buffers = span ? nb : 0;
    p->ffn_resident = res;
    p->stream = span * p->n_stream_buffers;
    p->n_resident_layers = span ? 0 : f->n_layers;
    return FLM_OK;
}

typedef struct hot_state {
    uint8_t **head;          /* [n_layers]: the resident prefix of each layer (NULL when it has none) */
    uint32_t *n_hot;         /* [n_layers] */
    uint8_t *buf[HOT_MAX_BUF];
    uint32_t n_buf, cur;       /* cur: the buffer the last target call computed from */
    uint64_t buf_bytes;
    flm_async_read *ahead[HOT_MAX_BUF]; /* two buffers or more: a read-ahead per buffer (the reader runs one call at
                                           a time; pump() submits one read at a time, in the order passes use them) */
    flm_extent ext[HOT_MAX_BUF];  /* the range submitted to ahead[b] (valid until taken) */
    int32_t want[HOT_MAX_BUF];    /* the layer whose range ahead[b] reads or holds and no call has taken; -1: none */
    int32_t last_req;          /* the last layer whose range was asked for (read ahead or read now); -1: none yet */
    bool pass_draft;           /* the pass of the last compute call is a draft */
    bool after_draft;          /* the target pass under way follows a draft pass (speculation runs) */
    /* the draft window (all NULL / 0 without one); layer l's streamed neuron k is record n_hot[l] + k */
    uint32_t *win_cap, *n_win; /* [n_layers]: records the window holds at most, and now */
    uint8_t **win_rec;         /* [n_layers]: n_win[l] records, compact */
    uint32_t **win_idx;        /* [n_layers]: the streamed neuron k of each window record */
    float **score;             /* [n_layers][n_records - n_hot]: decayed activity of each streamed neuron */
    int32_t **slot;            /* [n_layers][n_records - n_hot]: its window record, or -1 */
    float *sel, *act;          /* scratch: scores to select from; a batch's activities [d_ffn] */
    uint32_t *free_slots;      /* scratch [largest cap] */
    float *corr;               /* [n_layers][d_model]: the draft's correction of each layer (head comment) */
    float *corr_rows;          /* scratch [FLM_HOT_CORRECTION_ROWS][d_model]: the draft's output of a pass's rows */
    float *corr_w;             /* [n_layers]: the sum of the weights of the rows c_l has measured (0: none yet) */
} hot_state;

static void hot_close(flm_ffn_env *E) {
    hot_state *S = E->state;
    E->state = NULL;
    if (!S) return;
    for (int b = 0; b < HOT_MAX_BUF; b++) flm_async_read_stop(S->ahead[b]); /* a read in flight finishes first */
    free(S->head);
    free(S->n_hot);
    free(S->win_cap);
    free(S->n_win);
    free(S->win_rec);
    free(S->win_idx);
    free(S->score);
    free(S->slot);
    free(S->corr_w);
    free(S);
}

/* The windows and the draft's corrections, carved from the FFN storage as the plan sized them (hot_sizes). */
static flm_status window_open(flm_flash *fl, hot_state *S, uint32_t d_model, flm_error *err) {
    const flm_file *f = fl->file;
    const uint32_t L = f->n_layers;
    S->win_cap = calloc(L, sizeof *S->win_cap);
    S->n_win = calloc(L, sizeof *S->n_win);
    S->win_rec = calloc(L, sizeof *S->win_rec);
    S->win_idx = calloc(L, sizeof *S->win_idx);
    S->score = calloc(L, sizeof *S->score);
    S->slot = calloc(L, sizeof *S->slot);
    S->corr_w = calloc(L, sizeof *S->corr_w);
    if (!S->win_cap || !S->n_win || !S->win_rec || !S->win_idx || !S->score || !S->slot || !S->corr_w)
        return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", f->path);
    uint32_t max_ns = 0, max_cap = 0, d_ffn = 0;
    for (uint32_t l = 0; l < L; l++) {
        const flm_region *r = f->ffn[l];
        uint32_t h, w;
        flm_hot_split(r->n_records, fl->plan.hot_q16, fl->plan.window_q16, &h, &w);
        const uint32_t ns = r->n_records - h;
        if (r->n_records > d_ffn) d_ffn = r->n_records;
        if (!w) continue;
        uint8_t *b = flm_arena_alloc(&fl->ffn_mem, window_bytes(r, w, ns), FLM_ALIGN);
        if (!b) return flm_fail(err, FLM_ERR_BUDGET, "%s: layer %u's draft window exceeds the FFN storage planned",
                                f->path, l);
        S->win_cap[l] = w;
        S->win_rec[l] = b;
        b += flm_align_up((uint64_t)w * r->record_bytes, 64);
        S->win_idx[l] = (uint32_t *)b;
        S->score[l] = (float *)(b + 4ull * w);
        S->slot[l] = (int32_t *)(b + 4ull * w + 4ull * ns);
        for (uint32_t k = 0; k < ns; k++) S->slot[l][k] = -1; /* scores start at 0 (the arena is zero) */
        if (ns > max_ns) max_ns = ns;
        if (w > max_cap) max_cap = w;
    }
    uint8_t *sc = flm_arena_alloc(&fl->ffn_mem, window_scratch_bytes(max_ns, d_ffn, max_cap, L, d_model), FLM_ALIGN);
    if (!sc) return flm_fail(err, FLM_ERR_BUDGET, "%s: the draft windows exceed the FFN storage planned", f->path);
    S->sel = (float *)sc;
    S->act = (float *)(sc + 4ull * max_ns);
    S->free_slots = (uint32_t *)(sc + 4ull * max_ns + 4ull * d_ffn);
    S->corr = (float *)(sc + window_select_bytes(max_ns, d_ffn, max_cap)); /* zero: the arena */
    S->corr_rows = S->corr + (size_t)L * d_model;
    return FLM_OK;
}

/* The k-th largest (1 <= k <= n) of a[0..n), which it reorders (quickselect, three-way: many equal scores). */
static float kth_largest(float *a, uint32_t n, uint32_t k) {
    size_t lo = 0, hi = n, want = k - 1;
    while (hi - lo > 1) {
        const float p = a[lo + (hi - lo) / 2];
        size_t lt = lo, i = lo, gt = hi; /* [lo, lt) > p, [lt, gt) == p, [gt, hi) < p */
        while (i < gt) {
            float v = a[i];
            if (v > p) { a[i++] = a[lt]; a[lt++] = v; }
            else if (v < p) { a[i] = a[--gt]; a[gt] = v; }
            else i++;
        }
        if (want < lt) hi = lt;
        else if (want >= gt) lo = gt;
        else return p;
    }
    return a[lo];
}

/* After a target pass computed layer l: decay its streamed neurons' scores by WINDOW_DECAY per token (n_tok), add
 * act[k] (the pass's summed |h| of streamed neuron k), and make the window the top win_cap[l] by score, copying the
 * records of neurons that enter it from tail (the range buffer the pass computed from). Cannot fail. */
static void window_update(hot_state *S, const flm_region *r, uint32_t l, const uint8_t *tail, const float *act,
                          uint32_t n_tok) {
    const uint32_t cap = S->win_cap[l], ns = r->n_records - S->n_hot[l];
    const uint64_t rb = r->record_bytes;
    float *score = S->score[l], d = 1.0f;
    int32_t *slot = S->slot[l];
    uint32_t *idx = S->win_idx[l], n = S->n_win[l];
    uint8_t *rec = S->win_rec[l];
    for (uint32_t t = 0; t < n_tok; t++) d *= WINDOW_DECAY;
    for (uint32_t k = 0; k < ns; k++) S->sel[k] = score[k] = score[k] * d + fabsf(act[k]);
    const float tau = cap < ns ? kth_largest(S->sel, ns, cap) : 0.0f;
    /* leave: window records whose neuron fell below the cap-th score */
    uint32_t n_free = 0;
    for (uint32_t s = 0; s < n; s++)
        if (score[idx[s]] < tau) {
            slot[idx[s]] = -1;
            idx[s] = UINT32_MAX;
            S->free_slots[n_free++] = s;
        }
    /* enter: neurons at or above it that are not in, into the freed slots, then past the end */
    for (uint32_t k = 0; k < ns; k++) {
        if (slot[k] >= 0 || score[k] < tau || !(score[k] > 0.0f)) continue;
        uint32_t s;
        if (n_free) s = S->free_slots[--n_free];
        else if (n < cap) s = n++;
        else break;
        memcpy(rec + s * rb, tail + k * rb, rb);
        idx[s] = k;
        slot[k] = (int32_t)s;
    }
    /* compact: freed slots left over take the last records */
    for (uint32_t s = 0; s < n;) {
        if (idx[s] != UINT32_MAX) { s++; continue; }
        n--;
        if (s < n) {
            idx[s] = idx[n];
            if (idx[s] != UINT32_MAX) {
                memcpy(rec + s * rb, rec + (uint64_t)n * rb, rb);
                slot[idx[s]] = (int32_t)s;
            }
        }
    }
    S->n_win[l] = n;
}

/* After a target pass computed layer l (c) and updated its window: the draft's output over the prefix and the window
 * for the call's last rows, and the correction moved towards what it lacks (head comment). Cannot fail (the records
 * are in memory and were checked when they came). */
static void correction_update(flm_ffn_env *E, hot_state *S, const flm_ffn_call *c) {
    const uint32_t l = c->layer, D = E->model->hp.d_model;
    const uint32_t m = c->n < FLM_HOT_CORRECTION_ROWS ? c->n : FLM_HOT_CORRECTION_ROWS, r0 = c->n - m;
    flm_ffn_call d = *c;
    d.n = m;
    d.in = c->in + (size_t)r0 * c->in_stride;
    d.out = S->corr_rows;
    d.out_stride = D;
    d.draft = true;
    flm_flash_ffn(E, &d, S->head[l], S->n_hot[l], S->win_rec[l], S->n_hot[l] + S->n_win[l], NULL, NULL, NULL);
    float *cl = S->corr + (size_t)l * D;
    for (uint32_t t = 0; t < m; t++) {
        const float *y = c->out + (size_t)(r0 + t) * c->out_stride, *yd = S->corr_rows + (size_t)t * D;
        S->corr_w[l] = FLM_HOT_CORRECTION_DECAY * S->corr_w[l] + (1.0f - FLM_HOT_CORRECTION_DECAY);
        const float g = (1.0f - FLM_HOT_CORRECTION_DECAY) / S->corr_w[l]; /* 1 for the first row */
        for (uint32_t i = 0; i < D; i++) cl[i] += g * (y[i] - yd[i] - cl[i]);
    }
}

const float *flm_hot_correction(const flm_ctx *ctx, uint32_t l, uint32_t *n_hot) {
    const flm_flash *fl = ctx ? ctx->flash : NULL;
    const hot_state *S = fl && fl->plan.mode == FLM_MODE_HOT ? ctx->ffn_env.state : NULL;
    if (!S || !S->corr || l >= fl->file->n_layers || !S->win_cap[l]) return NULL;
    if (n_hot) *n_hot = S->n_hot[l];
    return S->corr + (size_t)l * ctx->model->hp.d_model;
}

bool flm_hot_window(const flm_ctx *ctx, uint32_t l, uint32_t *n, uint32_t *idx, const uint8_t **records) {
    const flm_flash *fl = ctx ? ctx->flash : NULL;
    const hot_state *S = fl && fl->plan.mode == FLM_MODE_HOT ? ctx->ffn_env.state : NULL;
    *n = 0;
    *records = NULL;
    if (!S || !S->win_cap || l >= fl->file->n_layers || !S->win_cap[l]) return false;
    *n = S->n_win[l];
    *records = S->win_rec[l];
    if (idx)
        for (uint32_t s = 0; s < S->n_win[l]; s++) idx[s] = S->n_hot[l] + S->win_idx[l][s];
    return true;
}

static flm_status hot_open(flm_ffn_env *E, flm_error *err) {
    flm_flash *fl = E->flash;
    const flm_file *f = fl->file;
    const uint32_t L = f->n_layers;
    hot_state *S = calloc(1, sizeof *S);
    if (!S) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", f->path);
    E->state = S;
    S->head = calloc(L, sizeof *S->head);
    S->n_hot = calloc(L, sizeof *S->n_hot);
    if (!S->head || !S->n_hot) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", f->path);
    const uint64_t planned = fl->plan.ffn_resident + fl->plan.stream;
    if (planned && flm_arena_init(&fl->ffn_mem, planned))
        return flm_fail(err, FLM_ERR_NOMEM, "%s: cannot allocate the %llu bytes of FFN storage", f->path,
                        (unsigned long long)planned);
    for (uint32_t l = 0; l < L; l++) {
        const flm_region *r = f->ffn[l];
        uint32_t w;
        flm_hot_split(r->n_records, fl->plan.hot_q16, fl->plan.window_q16, &S->n_hot[l], &w);
        uint64_t pb = prefix_bytes(r, S->n_hot[l]);
        if (!pb) continue;
        if (!(S->head[l] = flm_arena_alloc(&fl->ffn_mem, pb, FLM_ALIGN)))
            return flm_fail(err, FLM_ERR_BUDGET, "%s: layer %u's hot neurons exceed the FFN storage planned", f->path,
                            l);
        flm_extent e = {r->offset, pb, S->head[l]};
        flm_status st = flm_reader_read(fl->reader, &e, 1, NULL, err);
        if (st) return flm_flash_region_error(fl, l, st, err);
        if (S->n_hot[l] == r->n_records) fl->layer_data[l] = S->head[l]; /* whole: as a resident layer */
    }
    if (fl->plan.window) {
        flm_status st = window_open(fl, S, E->model->hp.d_model, err);
        if (st) return st;
    }
    if (fl->plan.stream) {
        S->n_buf = fl->plan.n_stream_buffers >= 2 ? fl->plan.n_stream_buffers : 1;
        if (S->n_buf > HOT_MAX_BUF) S->n_buf = HOT_MAX_BUF;
        S->buf_bytes = fl->plan.stream / S->n_buf;
        for (uint32_t b = 0; b < S->n_buf; b++)
            if (!(S->buf[b] = flm_arena_alloc(&fl->ffn_mem, S->buf_bytes, FLM_ALIGN)))
                return flm_fail(err, FLM_ERR_BUDGET, "%s: the range buffers exceed the FFN storage planned", f->path);
        bool all = S->n_buf >= 2; /* without every thread each read is synchronous: slower, the same result */
        for (uint32_t b = 0; all && b < S->n_buf; b++) all = (S->ahead[b] = flm_async_read_start(fl->reader));
        for (uint32_t b = 0; !all && b < S->n_buf; b++) {
            flm_async_read_stop(S->ahead[b]);
            S->ahead[b] = NULL;
        }
    }
    for (int b = 0; b < HOT_MAX_BUF; b++) S->want[b] = -1;
    S->last_req = -1;
    return FLM_OK;
}

/* The next layer after l with a streamed range (wrapping to the next pass's first), or l. */
static uint32_t next_streamed(const hot_state *S, const flm_file *f, uint32_t l) {
    for (uint32_t j = 1; j <= f->n_layers; j++) {
        uint32_t m = (l + j) % f->n_layers;
        if (S->n_hot[m] < f->ffn[m]->n_records) return m;
    }
    return l;
}

/* Keep the reader busy: when no read-ahead is in flight and a range buffer is free (not in_use, the buffer the call
 * under way computes from, and holding no range a call has yet to take), read into it the range that follows the
 * last one asked for, wrapping to the next pass's first ones. With wrap false the next pass's ranges wait for a later
 * call (the head comment: after a draft's embedding rows). So between a verification's last layer and the next one's
 * first, both buffers fill: the next pass's first two ranges are read while this pass's output, sampling and the
 * drafts run (they read no FFN record), and the verification computes its first layer from memory. */
static void pump(flm_ffn_env *E, int in_use, bool wrap) {
    hot_state *S = E->state;
    flm_flash *fl = E->flash;
    const flm_file *f = fl->file;
    if (!S->ahead[0]) return;
    for (uint32_t b = 0; b < S->n_buf; b++)
        if (flm_async_read_busy(S->ahead[b])) return;
    const uint32_t from = S->last_req < 0 ? f->n_layers - 1 : (uint32_t)S->last_req, m = next_streamed(S, f, from);
    if (S->n_hot[m] >= f->ffn[m]->n_records) return; /* nothing streams */
    if (!wrap && S->last_req >= 0 && m <= from) return;
    for (int b = 0; b < (int)S->n_buf; b++) {
        if (b == in_use || S->want[b] >= 0) continue;
        uint64_t off, len, skip;
        stream_span(f->ffn[m], S->n_hot[m], &off, &len, &skip);
        S->ext[b] = (flm_extent){off, len, S->buf[b]};
        S->want[b] = (int32_t)m;
        S->last_req = (int32_t)m;
        flm_flash_stream_submit(fl, S->ahead[b], &S->ext[b], m);
        return;
    }
}

/* Layer l's streamed records (tail): read ahead, or read now. */
static flm_status hot_tail(flm_ffn_env *E, uint32_t l, const uint8_t **tail, flm_extent *src, flm_token_stats *tok,
                           flm_error *err) {
    flm_flash *fl = E->flash;
    hot_state *S = E->state;
    const flm_file *f = fl->file;
    uint64_t off, len, skip;
    stream_span(f->ffn[l], S->n_hot[l], &off, &len, &skip);
    flm_io_stats io = {0};
    flm_status st = FLM_OK;
    uint64_t tag = 0;
    double t0 = flm_now_ms();
    int b = -1;
    for (int k = 0; k < (int)S->n_buf; k++)
        if (S->want[k] == (int32_t)l) b = k;
    if (b >= 0) { /* read ahead (it cannot be missing: want[b] is set only by a submit to ahead[b]) */
        if (!flm_async_read_wait(S->ahead[b], &tag, &st, err, &io))
            st = flm_fail(err, FLM_ERR_IO, "%s: layer %u's read-ahead has no request", f->path, l);
        S->want[b] = -1;
        S->cur = (uint32_t)b;
    } else { /* not asked for (the first pass, or a pass started again): drop what is pending, read it now */
        for (int k = 0; k < (int)S->n_buf; k++)
            if (S->want[k] >= 0) {
                flm_status dst;
                flm_async_read_wait(S->ahead[k], &tag, &dst, NULL, NULL);
                S->want[k] = -1;
            }
        flm_extent e = {off, len, S->buf[S->cur]};
        st = flm_flash_stream_read(fl, &e, &io, err);
        S->last_req = (int32_t)l;
    }
    tok->io_ms += flm_now_ms() - t0;
    flm_io_stats_add(E->io, &io);
    tok->bytes_read += io.bytes_read;
    tok->n_reads += io.n_requests;
    if (st) return flm_flash_region_error(fl, l, st, err);
    *tail = S->buf[S->cur] + skip;
    *src = (flm_extent){off, len, S->buf[S->cur]};
    pump(E, (int)S->cur, !S->after_draft); /* the next range, into the other buffer, while this one is computed */
    return FLM_OK;
}

/* one token or a batch (c->n): the prefix, then the streamed tail (or, drafting, the window) */
static flm_status hot_compute(flm_ffn_env *E, const flm_ffn_call *c, flm_error *err) {
    flm_flash *fl = E->flash;
    hot_state *S = E->state;
    const uint32_t l = c->layer, n = c->n;
    const flm_region *r = fl->file->ffn[l];
    const uint8_t *head = S->head[l], *tail = NULL;
    size_t n_rec = r->n_records;
    const bool win = S->win_cap && S->win_cap[l];
    if (l == 0) { /* a pass begins (every pass calls layer 0 first) */
        S->after_draft = !c->draft && S->pass_draft;
        S->pass_draft = c->draft;
    }
    /* between calls no buffer is in use; the next pass's ranges wait for its first call when speculation runs */
    pump(E, -1, c->draft || !S->after_draft || l == 0);
    if (c->draft) { /* the self-draft: what is in memory (the prefix, then the window), nothing read */
        n_rec = S->n_hot[l] + (win ? S->n_win[l] : 0);
        if (win) tail = S->win_rec[l];
    }
    flm_extent src = {0};
    if (!c->draft && S->n_hot[l] < r->n_records) {
        flm_status st = hot_tail(E, l, &tail, &src, c->tok, err);
        if (st) return st;
    }
    const bool update = win && !c->draft;
    /* the streamed tail's records are checked (flm_flash_ffn); the prefix and the window were when they loaded */
    flm_status st = flm_flash_ffn(E, c, head, S->n_hot[l], tail, n_rec, src.dst ? &src : NULL,
                                  n > 1 && update ? S->act : NULL, err);
    if (st) return st;
    if (update) {
        window_update(S, r, l, tail, (n == 1 ? E->s->hb : S->act) + S->n_hot[l], n);
        correction_update(E, S, c);
    } else if (c->draft && win) { /* what the neurons left out add on average */
        const uint32_t D = E->model->hp.d_model;
        const float *cl = S->corr + (size_t)l * D;
        for (uint32_t t = 0; t < n; t++) {
            float *y = c->out + (size_t)t * c->out_stride;
            for (uint32_t i = 0; i < D; i++) y[i] += cl[i];
        }
    }
    pump(E, -1, c->draft || !S->after_draft); /* this layer's buffer is free again */
    return FLM_OK;
}

const flm_ffn_source_ops flm_ffn_hot = {"hot", hot_plan, hot_open, hot_compute, hot_close, hot_compute};
