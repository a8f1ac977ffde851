/* ffn_stream.c — the FFN sources that stream whole layers (Knowl 7's baselines; runtime/ffn_source.h):
 *   naive   every layer's region is read into a layer buffer every token (one zero-copy O_DIRECT read per
 *           max_request piece)
 *   hybrid  the first k layers stay resident (k the largest that fits next to the layer buffers); the rest as naive
 *
 * Read-ahead. With two layer buffers (when the budget holds the second: plan.n_stream_buffers), a thread reads the
 * next streamed layer into one buffer while the current layer is computed from the other, so a token takes about
 * max(L_flash, L_compute) instead of their sum (the paper's Knowl 1 terms). After the last streamed layer it reads
 * the first one of the next token, overlapping the output layer, sampling and the resident layers. Which layer comes
 * next is known in advance here (every streamed layer is read whole, in order); the sparse mode's sets are not (each
 * depends on the layer's input). io_ms counts only the time the computation waits for a read; bytes and requests
 * are counted for the token that uses them. A read that fails is reported when its layer is needed, as a failed
 * synchronous read would be, and the buffer is read again next time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/util.h"
#include "io/async_read.h"
#include "runtime/runtime.h"

static flm_status naive_plan(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, flm_mem_plan *p,
                             flm_error *err) {
    uint64_t total, largest;
    flm_ffn_region_bytes(f, &total, &largest);
    uint64_t fixed = p->resident + p->kv + p->scratch + p->reader;
    /* a second buffer for read-ahead when the budget holds it (the plan then still fits with one) */
    p->n_stream_buffers = p->n_stream_buffers == 2 && f->n_layers > 1 &&
                          (!p->budget || fixed + 2 * largest <= p->budget) ? 2 : 1;
    p->stream = largest * p->n_stream_buffers;
    return FLM_OK;
}

/* The first layers that fit next to the streaming buffers: two (read-ahead) when the budget holds them, else one. */
static flm_status hybrid_plan(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, flm_mem_plan *p,
                              flm_error *err) {
    uint64_t total, max_layer;
    flm_ffn_region_bytes(f, &total, &max_layer);
    uint64_t fixed = p->resident + p->kv + p->scratch + p->reader;
    uint64_t avail = p->budget > fixed ? p->budget - fixed : 0;
    /* The second buffer comes before resident layers: reading ahead hides the compute of every streamed layer
     * under the next one's read, a resident layer saves one layer's read (Qwen2.5-Coder-0.5B at --mem 50% -c 2048,
     * on a loaded machine: 2 buffers and no layer resident, 209 ms/token; 1 buffer and 1 layer, 362 ms/token). */
    uint32_t nb = p->n_stream_buffers == 2 && avail >= 2 * max_layer ? 2 : 1;
    uint64_t used = 0;
    uint32_t n = 0;
    while (n < f->n_layers) {
        uint32_t streamed = f->n_layers - (n + 1); /* layers left to stream if layer n stays */
        uint64_t bufs = streamed ? (streamed >= 2 ? nb : 1) * max_layer : 0;
        if (used + flm_align_up(f->ffn[n]->size, FLM_ALIGN) + bufs > avail) break;
        used += flm_align_up(f->ffn[n]->size, FLM_ALIGN);
        n++;
    }
    uint32_t streamed = f->n_layers - n;
    p->n_stream_buffers = streamed >= 2 ? nb : 1; /* one streamed layer: nothing else to read ahead */
    p->n_resident_layers = n;
    p->ffn_resident = used;
    p->stream = streamed ? (uint64_t)p->n_stream_buffers * max_layer : 0;
    return FLM_OK;
}

typedef struct stream_state {
    uint8_t *buf[2];
    uint32_t n_buf;          /* 1 or 2 (read-ahead) */
    uint32_t cur;            /* the buffer holding the layer being computed */
    uint64_t buf_bytes;
    flm_async_read *ahead;   /* the read-ahead thread, NULL without (one buffer, or it could not start) */
    flm_extent ext;          /* the read in flight: layer tag >> 1, buffer tag & 1 */
} stream_state;

/* state: the layer buffers (plan.stream bytes, aligned for O_DIRECT, carved from fl->ffn_mem after the resident
 * layers) and the read-ahead thread; NULL when every layer is resident */
static void stream_close(flm_ffn_env *E) {
    stream_state *S = E->state;
    E->state = NULL;
    if (!S) return;
    flm_async_read_stop(S->ahead); /* a read in flight finishes first: the buffers are the arena's */
    free(S);
}

static flm_status stream_open(flm_ffn_env *E, flm_error *err) {
    flm_flash *fl = E->flash;
    flm_status st = flm_flash_load_layers(E, fl->plan.n_resident_layers, err);
    if (st) return st;
    if (!fl->plan.stream) return FLM_OK;
    stream_state *S = calloc(1, sizeof *S);
    if (!S) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for the layer stream", fl->file->path);
    E->state = S;
    S->n_buf = fl->plan.n_stream_buffers == 2 ? 2 : 1;
    S->buf_bytes = fl->plan.stream / S->n_buf;
    for (uint32_t b = 0; b < S->n_buf; b++)
        if (!(S->buf[b] = flm_arena_alloc(&fl->ffn_mem, S->buf_bytes, FLM_ALIGN)))
            return flm_fail(err, FLM_ERR_BUDGET, "%s: the %llu-byte layer buffers exceed the FFN storage planned",
                            fl->file->path, (unsigned long long)fl->plan.stream);
    /* without the thread (it cannot be created) every read is synchronous: slower, the same result */
    if (S->n_buf == 2) S->ahead = flm_async_read_start(fl->reader);
    return FLM_OK;
}

/* The streamed layer after l (wrapping to the next token's first), or l itself when it is the only one. */
static uint32_t next_streamed(const flm_flash *fl, uint32_t n_layers, uint32_t l) {
    for (uint32_t j = 1; j <= n_layers; j++) {
        uint32_t m = (l + j) % n_layers;
        if (!fl->layer_data[m]) return m;
    }
    return l;
}

/* Layer l's records: in memory (a resident layer: *src unchanged), read ahead, or read now into a layer buffer
 * (*src: the read that brought them, for flm_flash_ffn's checks). */
static flm_status layer_records(flm_ffn_env *E, uint32_t l, const uint8_t **out, flm_extent *src,
                                flm_token_stats *tok, flm_error *err) {
    flm_flash *fl = E->flash;
    const uint8_t *records = fl->layer_data[l];
    if (records) {
        *out = records;
        return FLM_OK;
    }
    stream_state *S = E->state;
    const flm_region *r = fl->file->ffn[l];
    flm_io_stats io = {0};
    flm_status st = FLM_OK;
    uint64_t tag = 0;
    double t0 = flm_now_ms();
    bool ahead = S->ahead && flm_async_read_wait(S->ahead, &tag, &st, err, &io) && tag >> 1 == l;
    if (ahead) { /* the layer was read while the previous one was computed */
        if (!st) S->cur = (uint32_t)(tag & 1);
    } else {
        /* nothing read ahead for l (the first streamed layer, or the read was another layer's: dropped, not
         * counted); the region is padded to 4096 in the file, so the aligned length is readable and zero-copy */
        memset(&io, 0, sizeof io);
        flm_extent e = {r->offset, flm_align_up(r->size, FLM_ALIGN), S->buf[S->cur]};
        st = flm_flash_stream_read(fl, &e, &io, err);
    }
    tok->io_ms += flm_now_ms() - t0;
    flm_io_stats_add(E->io, &io);
    tok->bytes_read += io.bytes_read;
    tok->n_reads += io.n_requests;
    if (st) return flm_flash_region_error(fl, l, st, err); /* the layer buffer is read whole again next time */
    records = S->buf[S->cur];
    *src = (flm_extent){r->offset, flm_align_up(r->size, FLM_ALIGN), S->buf[S->cur]};
    if (S->ahead) { /* read the next streamed layer into the other buffer while this one is computed */
        uint32_t m = next_streamed(fl, E->model->hp.n_layers, l), into = 1 - S->cur;
        const flm_region *rm = fl->file->ffn[m];
        S->ext = (flm_extent){rm->offset, flm_align_up(rm->size, FLM_ALIGN), S->buf[into]};
        flm_flash_stream_submit(fl, S->ahead, &S->ext, (uint64_t)m << 1 | into);
    }
    *out = records;
    return FLM_OK;
}

/* one token or a batch (c->n): a batch reads the layer once for all its tokens */
static flm_status stream_compute(flm_ffn_env *E, const flm_ffn_call *c, flm_error *err) {
    const uint8_t *records = NULL;
    flm_extent src = {0};
    flm_status st = layer_records(E, c->layer, &records, &src, c->tok, err);
    if (st) return st;
    return flm_flash_ffn(E, c, records, SIZE_MAX, NULL, E->flash->file->ffn[c->layer]->n_records,
                         src.dst ? &src : NULL, NULL, err);
}

const flm_ffn_source_ops flm_ffn_naive = {"naive", naive_plan, stream_open, stream_compute, stream_close,
                                          stream_compute};
const flm_ffn_source_ops flm_ffn_hybrid = {"hybrid", hybrid_plan, stream_open, stream_compute, stream_close,
                                           stream_compute};
