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
 * logits are ram mode's bit for bit. A draft pass (ctx->ffn_draft, flm_eval_draft) computes each FFN over its
 * resident prefix only and reads nothing: the self-draft of speculative decoding.
 *
 * Read-ahead, as ffn_stream.c: with two range buffers, the next layer's range is read while this one is computed;
 * after the last layer the first layer's range of the next pass is read (overlapping the output layer, sampling and
 * a self-draft, which reads nothing). Resident prefixes are read once at open and not checksummed (the region's
 * checksum covers the whole region; flashlm verify checks it). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/util.h"
#include "io/async_read.h"
#include "runtime/runtime.h"

/* Resident records of a layer of n records at share q16 / 65536. */
uint32_t flm_hot_count(uint32_t n, uint32_t q16) {
    return q16 >= 65536u ? n : (uint32_t)(((uint64_t)n * q16) >> 16);
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

/* FFN bytes at share q: the resident prefixes (*res) and the largest streamed span (*span). */
static void hot_sizes(const flm_file *f, uint32_t q, uint64_t *res, uint64_t *span) {
    *res = *span = 0;
    for (uint32_t l = 0; l < f->n_layers; l++) {
        const flm_region *r = f->ffn[l];
        uint32_t h = flm_hot_count(r->n_records, q);
        uint64_t off, len, skip;
        stream_span(r, h, &off, &len, &skip);
        *res += prefix_bytes(r, h);
        if (len > *span) *span = len;
    }
}

static flm_status hot_plan(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, flm_mem_plan *p,
                           flm_error *err) {
    const uint64_t fixed = p->resident + p->kv + p->scratch + p->reader;
    const uint64_t avail = p->budget > fixed ? p->budget - fixed : 0;
    uint32_t nb = p->n_stream_buffers == 2 ? 2 : 1;
    uint64_t res, span;
    /* the largest share that fits next to nb range buffers (two first: read-ahead hides a layer's compute under the
     * next one's read); none at all when even the buffers do not fit (the plan then reports the overrun) */
    uint32_t q = 65536;
    hot_sizes(f, q, &res, &span);
    if (p->budget && res + nb * span > avail) {
        for (;; nb--) {
            uint32_t lo = 0, hi = 65536; /* fits(lo) is checked below; fits(hi) is false */
            while (hi - lo > 1) {
                uint32_t mid = lo + (hi - lo) / 2;
                hot_sizes(f, mid, &res, &span);
                if (res + nb * span <= avail) lo = mid;
                else hi = mid;
            }
            q = lo;
            hot_sizes(f, q, &res, &span);
            if (res + nb * span <= avail || nb == 1) break;
        }
    }
    p->hot_q16 = q;
    p->n_stream_buffers = span ? nb : 0;
    p->ffn_resident = res;
    p->stream = span * p->n_stream_buffers;
    p->n_resident_layers = span ? 0 : f->n_layers;
    return FLM_OK;
}

typedef struct hot_state {
    uint8_t **head;          /* [n_layers]: the resident prefix of each layer (NULL when it has none) */
    uint32_t *n_hot;         /* [n_layers] */
    uint8_t *buf[2];
    uint32_t n_buf, cur;
    uint64_t buf_bytes;
    flm_async_read *ahead;
    flm_extent ext;
} hot_state;

static void hot_close(flm_ctx *ctx) {
    hot_state *S = ctx->ffn_state;
    ctx->ffn_state = NULL;
    if (!S) return;
    flm_async_read_stop(S->ahead);
    free(S->head);
    free(S->n_hot);
    free(S);
}

static flm_status hot_open(flm_ctx *ctx, flm_error *err) {
    flm_flash *fl = ctx->flash;
    const flm_file *f = fl->file;
    const uint32_t L = f->n_layers;
    hot_state *S = calloc(1, sizeof *S);
    if (!S) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", f->path);
    ctx->ffn_state = S;
    S->head = calloc(L, sizeof *S->head);
    S->n_hot = calloc(L, sizeof *S->n_hot);
    if (!S->head || !S->n_hot) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", f->path);
    const uint64_t planned = fl->plan.ffn_resident + fl->plan.stream;
    if (planned && flm_arena_init(&fl->ffn_mem, planned))
        return flm_fail(err, FLM_ERR_NOMEM, "%s: cannot allocate the %llu bytes of FFN storage", f->path,
                        (unsigned long long)planned);
    for (uint32_t l = 0; l < L; l++) {
        const flm_region *r = f->ffn[l];
        S->n_hot[l] = flm_hot_count(r->n_records, fl->plan.hot_q16);
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
    if (fl->plan.stream) {
        S->n_buf = fl->plan.n_stream_buffers == 2 ? 2 : 1;
        S->buf_bytes = fl->plan.stream / S->n_buf;
        for (uint32_t b = 0; b < S->n_buf; b++)
            if (!(S->buf[b] = flm_arena_alloc(&fl->ffn_mem, S->buf_bytes, FLM_ALIGN)))
                return flm_fail(err, FLM_ERR_BUDGET, "%s: the range buffers exceed the FFN storage planned", f->path);
        if (S->n_buf == 2) S->ahead = flm_async_read_start(fl->reader);
    }
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

/* Layer l's streamed records (tail): read ahead, or read now. */
static flm_status hot_tail(flm_ctx *ctx, uint32_t l, const uint8_t **tail, flm_token_stats *tok, flm_error *err) {
    flm_flash *fl = ctx->flash;
    hot_state *S = ctx->ffn_state;
    const flm_file *f = fl->file;
    uint64_t off, len, skip;
    stream_span(f->ffn[l], S->n_hot[l], &off, &len, &skip);
    flm_io_stats io = {0};
    flm_status st = FLM_OK;
    uint64_t tag = 0;
    double t0 = flm_now_ms();
    bool ahead = S->ahead && flm_async_read_wait(S->ahead, &tag, &st, err, &io) && tag >> 1 == l;
    if (ahead) {
        if (!st) S->cur = (uint32_t)(tag & 1);
    } else {
        memset(&io, 0, sizeof io);
        flm_extent e = {off, len, S->buf[S->cur]};
        st = flm_reader_read(fl->reader, &e, 1, &io, err);
    }
    tok->io_ms += flm_now_ms() - t0;
    flm_io_stats_add(&ctx->io, &io);
    tok->bytes_read += io.bytes_read;
    tok->n_reads += io.n_requests;
    if (st) return flm_flash_region_error(fl, l, st, err);
    *tail = S->buf[S->cur] + skip;
    if (S->ahead) {
        uint32_t m = next_streamed(S, f, l), into = 1 - S->cur;
        uint64_t mo, ml, ms;
        stream_span(f->ffn[m], S->n_hot[m], &mo, &ml, &ms);
        S->ext = (flm_extent){mo, ml, S->buf[into]};
        flm_async_read_submit(S->ahead, &S->ext, 1, (uint64_t)m << 1 | into);
    }
    return FLM_OK;
}

static flm_status hot_compute_n(flm_ctx *ctx, uint32_t l, uint32_t n, const float *in, size_t in_stride, float *out,
                                size_t out_stride, flm_token_stats *tok, flm_error *err) {
    flm_flash *fl = ctx->flash;
    hot_state *S = ctx->ffn_state;
    const flm_region *r = fl->file->ffn[l];
    const uint8_t *head = S->head[l], *tail = NULL;
    size_t n_rec = r->n_records;
    if (ctx->ffn_draft) n_rec = S->n_hot[l]; /* the self-draft: what is in memory, nothing read */
    else if (S->n_hot[l] < r->n_records) {
        flm_status st = hot_tail(ctx, l, &tail, tok, err);
        if (st) return st;
    }
    const int nt = ctx->params.n_threads;
    if (n == 1)
        flm_ffn_bundles_split(ctx->k, &fl->desc[l], head, S->n_hot[l], tail, NULL, n_rec, in, out, ctx->s.hb,
                              fl->acc, nt);
    else
        flm_ffn_bundles_batch_split(ctx->k, &fl->desc[l], head, S->n_hot[l], tail, NULL, n_rec, NULL, 0, n, in,
                                    in_stride, out, out_stride, fl->acc, nt);
    return FLM_OK;
}

static flm_status hot_compute(flm_ctx *ctx, uint32_t l, const float *in, float *out, flm_token_stats *tok,
                              flm_error *err) {
    return hot_compute_n(ctx, l, 1, in, 0, out, 0, tok, err);
}

static flm_status hot_compute_batch(flm_ctx *ctx, uint32_t l, uint32_t n, const float *in, size_t in_stride,
                                    float *out, size_t out_stride, flm_token_stats *tok, flm_error *err) {
    return hot_compute_n(ctx, l, n, in, in_stride, out, out_stride, tok, err);
}

const flm_ffn_source_ops flm_ffn_hot = {"hot", hot_plan, hot_open, hot_compute, hot_close, hot_compute_batch};
