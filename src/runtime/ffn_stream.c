/* ffn_stream.c — the FFN sources that stream whole layers (Knowl 7's baselines; runtime/ffn_source.h):
 *   naive   every layer's region is read into one layer buffer every token (one zero-copy O_DIRECT read per
 *           max_request piece)
 *   hybrid  the first k layers stay resident (k the largest that fits next to the layer buffer); the rest as naive */
#include <stdlib.h>

#include "core/error.h"
#include "core/util.h"
#include "runtime/runtime.h"

static flm_status naive_plan(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, flm_mem_plan *p,
                             flm_error *err) {
    uint64_t total, largest;
    flm_ffn_region_bytes(f, &total, &largest);
    p->stream = largest;
    return FLM_OK;
}

/* The first layers that fit next to one streaming buffer. */
static flm_status hybrid_plan(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, flm_mem_plan *p,
                              flm_error *err) {
    uint64_t total, max_layer;
    flm_ffn_region_bytes(f, &total, &max_layer);
    uint64_t fixed = p->resident + p->kv + p->scratch + p->reader;
    uint64_t avail = p->budget > fixed ? p->budget - fixed : 0;
    p->stream = max_layer;
    uint64_t used = 0;
    uint32_t n = 0;
    while (n < f->n_layers &&
           used + flm_align_up(f->ffn[n]->size, FLM_ALIGN) + (n + 1 < f->n_layers ? max_layer : 0) <= avail) {
        used += flm_align_up(f->ffn[n]->size, FLM_ALIGN);
        n++;
    }
    p->n_resident_layers = n;
    p->ffn_resident = used;
    if (n == f->n_layers) p->stream = 0;
    return FLM_OK;
}

/* state: the layer buffer (plan.stream bytes, aligned for O_DIRECT, carved from fl->ffn_mem after the resident
 * layers), or NULL when every layer is resident */
static flm_status stream_open(flm_ctx *ctx, flm_error *err) {
    flm_flash *fl = ctx->flash;
    flm_status st = flm_flash_load_layers(ctx, fl->plan.n_resident_layers, err);
    if (st) return st;
    if (fl->plan.stream && !(ctx->ffn_state = flm_arena_alloc(&fl->ffn_mem, fl->plan.stream, FLM_ALIGN)))
        return flm_fail(err, FLM_ERR_BUDGET, "%s: the %llu-byte layer buffer exceeds the FFN storage planned",
                        fl->file->path, (unsigned long long)fl->plan.stream);
    return FLM_OK;
}

/* Layer l's records: in memory (a resident layer), or read into the layer buffer. */
static flm_status layer_records(flm_ctx *ctx, uint32_t l, const uint8_t **out, flm_token_stats *tok, flm_error *err) {
    flm_flash *fl = ctx->flash;
    const uint8_t *records = fl->layer_data[l];
    if (!records) {
        /* the region is padded to 4096 in the file, so the aligned length is readable and zero-copy */
        const flm_region *r = fl->file->ffn[l];
        flm_extent e = {r->offset, flm_align_up(r->size, FLM_ALIGN), ctx->ffn_state};
        flm_io_stats before = ctx->io;
        double t0 = flm_now_ms();
        flm_status st = flm_reader_read(fl->reader, &e, 1, &ctx->io, err);
        tok->io_ms += flm_now_ms() - t0;
        tok->bytes_read += ctx->io.bytes_read - before.bytes_read;
        tok->n_reads += ctx->io.n_requests - before.n_requests;
        if (st) return flm_flash_region_error(fl, l, st, err); /* the layer buffer is read whole again next time */
        records = ctx->ffn_state;
    }
    *out = records;
    return FLM_OK;
}

static flm_status stream_compute(flm_ctx *ctx, uint32_t l, const float *in, float *out, flm_token_stats *tok,
                                 flm_error *err) {
    const uint8_t *records = NULL;
    flm_status st = layer_records(ctx, l, &records, tok, err);
    if (st) return st;
    flm_flash_bundles(ctx, l, records, in, out);
    return FLM_OK;
}

/* a batch: the layer is read once for all its tokens */
static flm_status stream_compute_batch(flm_ctx *ctx, uint32_t l, uint32_t n, const float *in, size_t in_stride,
                                       float *out, size_t out_stride, flm_token_stats *tok, flm_error *err) {
    const uint8_t *records = NULL;
    flm_status st = layer_records(ctx, l, &records, tok, err);
    if (st) return st;
    flm_flash_bundles_batch(ctx, l, records, n, in, in_stride, out, out_stride);
    return FLM_OK;
}

static void stream_close(flm_ctx *ctx) { ctx->ffn_state = NULL; } /* the buffer is part of ctx->flash->ffn_mem */

const flm_ffn_source_ops flm_ffn_naive = {"naive", naive_plan, stream_open, stream_compute, stream_close,
                                          stream_compute_batch};
const flm_ffn_source_ops flm_ffn_hybrid = {"hybrid", hybrid_plan, stream_open, stream_compute, stream_close,
                                           stream_compute_batch};
