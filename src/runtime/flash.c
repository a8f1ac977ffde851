/* flash.c — what every FFN source of a .flm file shares: the plan, the bundle descriptors, the reader, resident
 * layers; opening the mode's source (runtime/ffn_source.h). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/types.h"
#include "io/async_read.h"
#include "io/io_cost.h"
#include "runtime/hooks.h"
#include "runtime/pass.h"
#include "runtime/runtime.h"
#include "sparsity/sparsity.h"
#include "core/error.h"
#include "core/util.h"

/* After a plan: hold the token embedding in memory when the plan keeps it there but it is still in the file (read
 * the resident region's tail, checksummed), or prepare its row buffer when the plan leaves it there. */
static flm_status place_embedding(flm_ctx *ctx, flm_error *err) {
    flm_flash *fl = ctx->flash;
    flm_file *file = fl->file;
    flm_model *m = ctx->model;
    if (fl->plan.embd != FLM_EMBD_FLASH) {
        free(fl->embd_row);
        fl->embd_row = NULL;
        if (!flm_file_tail_pending(file)) return FLM_OK;
        flm_status st = flm_file_load_tail(file, err);
        if (st) return st;
        m->tok_embd.data = flm_gguf_find_tensor(file->meta, "token_embd.weight")->data; /* the classifier is not tied:
                                                                                          the tail is pending */
        return FLM_OK;
    }
    const flm_gguf_tensor *t = flm_gguf_find_tensor(file->meta, "token_embd.weight");
    fl->embd_offset = file->resident->offset + file->meta->data_offset + t->offset;
    if (!fl->embd_row && !(fl->embd_row = malloc(FLM_EMBD_READ_ROWS * fl->plan.embd_row)))
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    return FLM_OK;
}

/* Checked reads (docs/IO.md): give the reader the record sums of every FFN region and of the token embedding's rows,
 * so that every read from flash is checked before it is used. A file without them (format version 1) runs only in
 * ram mode, whose regions are checked whole as they load, unless the caller turned checking off. */
static flm_status setup_checks(flm_ctx *ctx, flm_error *err) {
    flm_flash *fl = ctx->flash;
    const flm_file *file = fl->file;
    if (ctx->params.no_verify_reads) return FLM_OK;
    if (!file->sums) {
        if (fl->plan.mode == FLM_MODE_RAM) return FLM_OK;
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: the file has no record sums (format version %u, converted by "
                        "an older flashlm), so what mode %s reads from flash cannot be checked: convert the model "
                        "again (flashlm convert), or pass --no-verify-reads", file->path, file->version,
                        flm_mode_name(fl->plan.mode));
    }
    flm_status st = flm_sums_load(file, &fl->sums, err);
    if (st) return st;
    uint32_t n = 0;
    flm_check_table *t = calloc(fl->sums.n_tables + 2, sizeof *t);
    if (!t) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", file->path);
    for (uint32_t i = 0; i < fl->sums.n_tables; i++) {
        const flm_sums_table *s = &fl->sums.tables[i];
        const flm_region *r = s->kind == FLM_SUMS_FFN ? file->ffn[s->layer] : file->resident;
        t[n] = (flm_check_table){r->offset + s->offset, s->unit_bytes, s->n_units, s->sums, "", ""};
        flm_sums_table_name(s, t[n].what, sizeof t[n].what);
        snprintf(t[n].unit, sizeof t[n].unit, "%s", flm_sums_unit_name(s));
        if (s->kind == FLM_SUMS_EMBD && fl->plan.embd == FLM_EMBD_FLASH &&
            (t[n].offset != fl->embd_offset || t[n].unit_bytes != fl->plan.embd_row)) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: record-sums region: its token-embedding rows (%llu bytes at "
                          "%llu) are not the embedding's (%llu bytes at %llu)", file->path,
                          (unsigned long long)t[n].unit_bytes, (unsigned long long)t[n].offset,
                          (unsigned long long)fl->plan.embd_row, (unsigned long long)fl->embd_offset);
            free(t);
            return st;
        }
        n++;
    }
    if (fl->out_sums) { /* the classifier's rows on flash: units of FLM_OUT_UNIT_ROWS rows, their sums made at load */
        const uint64_t rows = ctx->model->hp.n_vocab - fl->plan.out_rows_res, unit = fl->plan.out_unit_rows;
        const uint64_t first = fl->out_offset + fl->plan.out_rows_res * fl->plan.out_row;
        if (rows / unit)
            t[n++] = (flm_check_table){first, unit * fl->plan.out_row, rows / unit, fl->out_sums, "classifier",
                                       "rows"};
        if (rows % unit)
            t[n++] = (flm_check_table){first + rows / unit * unit * fl->plan.out_row, rows % unit * fl->plan.out_row,
                                       1, fl->out_sums + rows / unit, "classifier", "last rows"};
    }
    st = flm_reader_set_checks(fl->reader, t, n, err);
    free(t);
    if (st) return st;
    /* the streamed FFN records are hashed by the kernels that use them, where their bytes come into the cache
     * anyway (docs/IO.md, "Checked reads"): naive, hybrid and hot read whole records in neuron order */
    fl->fused_checks = fl->sums.ffn != NULL;
    for (uint32_t l = 0; fl->fused_checks && l < file->n_layers; l++)
        fl->fused_checks = fl->sums.ffn[l] && fl->sums.ffn[l]->offset == 0 &&
                           fl->sums.ffn[l]->n_units == file->ffn[l]->n_records &&
                           fl->sums.ffn[l]->unit_bytes == fl->desc[l].record_bytes;
    return FLM_OK;
}

/* The classifier on flash (plan.out_flash): where its row 0 lies in the file, and the buffer chunks of its rows are
 * read into. */
static flm_status place_output(flm_ctx *ctx, flm_error *err) {
    flm_flash *fl = ctx->flash;
    if (!fl->plan.out_flash) return FLM_OK;
    const flm_file *file = fl->file;
    const flm_gguf_tensor *t = flm_gguf_find_tensor(file->meta, "output.weight");
    if (!t) t = flm_gguf_find_tensor(file->meta, "token_embd.weight"); /* tied: the embedding's rows */
    fl->out_offset = file->resident->offset + file->meta->data_offset + t->offset;
    const uint64_t bytes = (uint64_t)fl->plan.out_chunk_rows * fl->plan.out_row;
    const uint32_t n_buf = fl->plan.out_n_buf == 2 ? 2 : 1;
    for (uint32_t b = 0; b < n_buf; b++) {
        if (posix_memalign(&fl->out_buf[b], FLM_ALIGN, flm_align_up(bytes, FLM_ALIGN))) fl->out_buf[b] = NULL;
        if (!fl->out_buf[b])
            return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for the classifier's buffer", file->path);
    }
    return FLM_OK;
}

flm_status flm_flash_open(flm_ctx *ctx, flm_file *file, const flm_mem_plan *plan, flm_predictor_region *sparsity,
                          uint64_t *out_sums, flm_error *err) {
    const flm_hparams *hp = &ctx->model->hp;
    const flm_params *pp = &ctx->params;
    flm_flash *fl = calloc(1, sizeof *fl);
    if (!fl) {
        flm_file_close(file);
        if (sparsity) flm_predictor_region_free(sparsity);
        free(sparsity);
        free(out_sums);
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    }
    fl->file = file;
    fl->sparsity = sparsity;
    fl->out_sums = out_sums;
    ctx->flash = fl;
    fl->plan = *plan; /* decided by runtime/plan.c: carried out here, not revisited */
    flm_status st;
    if ((st = place_embedding(ctx, err)) || (st = place_output(ctx, err))) return st;
    uint64_t budget = fl->plan.budget;
    if (pp->mode == FLM_MODE_AUTO && fl->plan.mode == FLM_MODE_HYBRID) /* why auto did not take sparse */
        flm_log(&ctx->log, FLM_LOG_WARN, "%s", fl->plan.reason);
    uint32_t L = hp->n_layers;
    fl->desc = calloc(L, sizeof *fl->desc);
    fl->layer_data = calloc(L, sizeof *fl->layer_data);
    fl->acc = malloc((size_t)pp->n_threads * fl->plan.n_batch * hp->d_model *
                     sizeof(float)); /* per thread, a row per token of a batch */
    if (!fl->desc || !fl->layer_data || !fl->acc) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < L; l++) {
        const flm_region *r = file->ffn[l];
        flm_bundle_layout b = flm_bundle_layout_of(hp->d_model, r->up_type, r->gate_type, r->down_type, hp->gated);
        fl->desc[l] = (flm_bundle_desc){hp->d_model, r->up_type, r->gate_type, r->down_type, b.up_off, b.gate_off,
                                        b.down_off, b.record_bytes, hp->gated, hp->act, 0.0f,
                                        ctx->model->layers[l].ffn_up_b.data, NULL, 0, NULL};
    }
    flm_reader_opts ro;
    flm_reader_opts_default(&ro);
    ro.backend = pp->io == FLM_IO_KIND_URING ? FLM_IO_URING : pp->io == FLM_IO_KIND_THREADS ? FLM_IO_THREADS
                                                                                             : FLM_IO_AUTO;
    if (pp->io_threads > 0) ro.n_threads = pp->io_threads;
    ro.direct = !pp->no_direct;
    /* Coalescing: a gap is read through when that costs less than a separate request. With many requests in flight a
     * request's fixed cost is shared, so the per-request cost that matters is the device latency divided by the
     * parallelism: 80 us / 16 = 5 us, with 2 GB/s merges gaps below 10 KB (docs/IO.md). */
    ro.cost.latency_us = 5.0;
    ro.cost.bandwidth_gbps = 2.0;
    flm_error perr; /* `flashlm probe-disk`'s measured fit replaces the defaults when the caller names one */
    if (pp->io_cost_path && flm_probe_load_cost_file(pp->io_cost_path, &ro.cost, &perr))
        flm_log(&ctx->log, FLM_LOG_WARN, "%s; using the default I/O cost model", perr.msg);
    ro.log = &ctx->log;
    ro.bounce_bytes = fl->plan.reader_bounce;
    if (ro.max_request > ro.bounce_bytes) ro.max_request = ro.bounce_bytes / FLM_ALIGN * FLM_ALIGN;
    if ((st = flm_reader_open(file->path, &ro, &fl->reader, err))) return st;
    if ((st = setup_checks(ctx, err))) return st;
    if (fl->out_buf[1]) fl->out_ahead = flm_async_read_start(fl->reader); /* NULL: every chunk read now, the same */
    uint64_t reader_mem = flm_reader_memory(fl->reader) + fl->sums.bytes;
    if (reader_mem > fl->plan.reader) { /* the estimate was short: account the real figure */
        fl->plan.reader = reader_mem;
        if (budget && flm_mem_plan_total(&fl->plan) > budget)
            return flm_fail(err, FLM_ERR_BUDGET, "%s: a memory budget of %llu bytes is too small: the reader needs "
                            "%llu bytes next to the %llu planned", file->path, (unsigned long long)budget,
                            (unsigned long long)reader_mem, (unsigned long long)flm_mem_plan_total(&fl->plan));
    }
    ctx->ffn = flm_ffn_source_of(fl->plan.mode);
    ctx->ffn_env = (flm_ffn_env){.be = &ctx->be, .k = ctx->k, .model = ctx->model, .params = &ctx->params,
                                 .flash = fl, .s = &ctx->s, .io = &ctx->io, .log = &ctx->log};
    st = ctx->ffn->open(&ctx->ffn_env, err);
    return st;
}

flm_status flm_flash_embedding(flm_ffn_env *E, const int32_t *tokens, uint32_t n, const void **rows,
                               flm_token_stats *tok, flm_error *err) {
    flm_flash *fl = E->flash;
    if (!fl || !fl->embd_row) /* a planning bug: the embedding is neither in memory nor planned on flash */
        return flm_fail(err, FLM_ERR_ARG, "the token embedding is not in memory");
    if (n < 1 || n > FLM_EMBD_READ_ROWS)
        return flm_fail(err, FLM_ERR_ARG, "%u token-embedding rows asked at once, outside 1..%d", n,
                        FLM_EMBD_READ_ROWS);
    const uint64_t rb = fl->plan.embd_row;
    flm_extent x[FLM_EMBD_READ_ROWS];
    for (uint32_t t = 0; t < n; t++)
        x[t] = (flm_extent){fl->embd_offset + (uint64_t)tokens[t] * rb, rb, (uint8_t *)fl->embd_row + t * rb};
    flm_io_stats before = *E->io;
    double t0 = flm_now_ms();
    flm_status st = flm_reader_read(fl->reader, x, n, E->io, err);
    tok->io_ms += flm_now_ms() - t0;
    tok->bytes_read += E->io->bytes_read - before.bytes_read;
    tok->n_reads += E->io->n_requests - before.n_requests;
    if (st) return st;
    *rows = fl->embd_row;
    return FLM_OK;
}

/* The classifier's chunk k, rows [r, r + out_chunk_rows) or to the vocabulary's end (V rows), read whole (its checked
 * units) into out_buf[k % 2] on the read-ahead thread. */
static void out_submit(flm_flash *fl, uint32_t V, uint32_t r, uint32_t k) {
    const uint32_t C = fl->plan.out_chunk_rows;
    const uint64_t rb = fl->plan.out_row;
    fl->out_ext[k & 1] = (flm_extent){fl->out_offset + (uint64_t)r * rb, (uint64_t)(V - r < C ? V - r : C) * rb,
                                      fl->out_buf[k & 1]};
    flm_async_read_submit(fl->out_ahead, &fl->out_ext[k & 1], 1, k);
}

flm_status flm_flash_output(flm_ctx *ctx, const flm_pass *P, const float *in, size_t in_stride, float *logits,
                            uint32_t rows, flm_token_stats *tok, flm_error *err) {
    flm_flash *fl = ctx->flash;
    const flm_model *m = ctx->model;
    const flm_hparams *hp = &m->hp;
    const flm_backend_ops *B = ctx->be.ops;
    const uint32_t V = hp->n_vocab, R = fl->plan.out_rows_res, C = fl->plan.out_chunk_rows;
    const uint64_t rb = fl->plan.out_row;
    const bool bias = m->output_b.data != NULL;
    /* chunk k: rows [R + k C, ...) read whole (checked units) into out_buf[k % 2]; with the read-ahead, chunk 0 is
     * read while the rows in memory are multiplied, and chunk k + 1 while chunk k is (its buffer held chunk k - 1,
     * whose product is done) */
    const uint32_t n_chunks = rows > R ? (rows - R + C - 1) / C : 0;
    flm_async_read *a = fl->out_ahead;
    if (a && n_chunks) out_submit(fl, V, R, 0);
    if (R) {
        const uint32_t n = rows < R ? rows : R;
        const flm_weight W = {m->output.type, m->output.n_in, n, m->output.data};
        B->linear(P, &W, bias ? &m->output_b : NULL, n, hp->d_embd, in, in_stride, logits, V);
    }
    for (uint32_t k = 0; k < n_chunks; k++) {
        const uint32_t r = R + k * C, c = rows - r < C ? rows - r : C;
        void *buf = fl->out_buf[a ? k & 1 : 0];
        flm_io_stats io = {0};
        flm_status st = FLM_OK;
        const double t0 = flm_now_ms();
        if (a) {
            uint64_t tag = 0;
            if (!flm_async_read_wait(a, &tag, &st, err, &io) || tag != k)
                st = flm_fail(err, FLM_ERR_IO, "%s: the classifier's read-ahead lost chunk %u", fl->file->path, k);
            if (!st && k + 1 < n_chunks) out_submit(fl, V, R + (k + 1) * C, k + 1);
        } else {
            flm_extent x = {fl->out_offset + (uint64_t)r * rb, (uint64_t)(V - r < C ? V - r : C) * rb, buf};
            st = flm_reader_read(fl->reader, &x, 1, &io, err);
        }
        if (tok) {
            tok->io_ms += flm_now_ms() - t0;
            tok->bytes_read += io.bytes_read;
            tok->n_reads += io.n_requests;
        }
        flm_io_stats_add(&ctx->io, &io);
        if (st) return st;
        const flm_weight W = {m->output.type, m->output.n_in, c, buf};
        const flm_weight b = {FLM_TYPE_F32, c, 1, bias ? (const float *)m->output_b.data + r : NULL};
        B->linear(P, &W, bias ? &b : NULL, c, hp->d_embd, in, in_stride, logits + r, V);
    }
    return FLM_OK;
}

flm_status flm_flash_load_layers(flm_ffn_env *E, uint32_t n, flm_error *err) {
    flm_flash *fl = E->flash;
    const flm_file *file = fl->file;
    uint64_t planned = fl->plan.ffn_resident + fl->plan.stream;
    if (!fl->ffn_mem.base && planned && flm_arena_init(&fl->ffn_mem, planned))
        return flm_fail(err, FLM_ERR_NOMEM, "%s: cannot allocate the %llu bytes of FFN storage", file->path,
                        (unsigned long long)planned);
    for (uint32_t l = 0; l < n; l++) {
        const flm_region *r = file->ffn[l];
        if (!(fl->layer_data[l] = flm_arena_alloc(&fl->ffn_mem, flm_align_up(r->size, FLM_ALIGN), FLM_ALIGN)))
            return flm_fail(err, FLM_ERR_BUDGET, "%s: layer %u's FFN region (%llu bytes) exceeds the %llu bytes "
                            "planned for FFN storage", file->path, l, (unsigned long long)r->size,
                            (unsigned long long)planned);
        flm_extent e = {r->offset, flm_align_up(r->size, FLM_ALIGN), fl->layer_data[l]};
        flm_status st = flm_reader_read(fl->reader, &e, 1, NULL, err);
        if (st) return flm_flash_region_error(fl, l, st, err);
        /* every record was checked as it arrived (checked reads); else the region's checksum: read whole anyway */
        if (!flm_reader_checks(fl->reader) && !flm_region_checksum_ok(r, fl->layer_data[l]))
            return flm_fail(err, FLM_ERR_CHECKSUM, "%s: FFN region of layer %u: checksum mismatch (the file is corrupt)",
                            file->path, l);
    }
    return FLM_OK;
}

flm_status flm_flash_region_error(const flm_flash *fl, uint32_t l, flm_status st, flm_error *err) {
    if (!err) return st;
    const char *path = fl->file->path, *what = err->msg;
    size_t n = strlen(path);
    if (!strncmp(what, path, n) && !strncmp(what + n, ": ", 2)) what += n + 2; /* the reader named the file */
    char region[48];
    snprintf(region, sizeof region, "FFN region of layer %u", l);
    if (!strncmp(what, region, strlen(region))) return st; /* a checked read named the region (and record) */
    char msg[FLM_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", what);
    return flm_fail(err, st, "%s: FFN region of layer %u: %s", path, l, msg);
}

flm_status flm_flash_stream_read(const flm_flash *fl, const flm_extent *ext, flm_io_stats *io, flm_error *err) {
    return fl->fused_checks ? flm_reader_read_unchecked(fl->reader, ext, 1, io, err)
                            : flm_reader_read(fl->reader, ext, 1, io, err);
}

void flm_flash_stream_submit(const flm_flash *fl, flm_async_read *a, const flm_extent *ext, uint64_t tag) {
    if (fl->fused_checks) flm_async_read_submit_unchecked(a, ext, 1, tag);
    else flm_async_read_submit(a, ext, 1, tag);
}

flm_status flm_flash_ffn(flm_ffn_env *E, const flm_ffn_call *c, const uint8_t *head, size_t n_head,
                         const uint8_t *tail, size_t n_rec, const flm_extent *src, float *h_abs, flm_error *err) {
    flm_flash *fl = E->flash;
    const uint32_t l = c->layer;
    flm_bundle_desc d = fl->desc[l];
    flm_ffn_check chk;
    if (src && fl->fused_checks) { /* the reader did not check what src brought: the kernels do */
        d.sums = fl->sums.ffn[l]->sums;
        d.check_from = n_head == SIZE_MAX ? 0 : n_head;
        d.check = &chk;
    }
    for (;;) {
        atomic_init(&chk.bad, 0);
        atomic_init(&chk.bytes, 0);
        atomic_init(&chk.ns, 0);
        if (c->n == 1)
            E->be->ops->bundles_split(E->be, &d, head, n_head, tail, NULL, n_rec, c->in, c->out, E->s->hb, fl->acc);
        else
            E->be->ops->bundles_batch_split(E->be, &d, head, n_head, tail, NULL, n_rec, NULL, 0, c->n, c->in,
                                            c->in_stride, c->out, c->out_stride, fl->acc, h_abs);
        if (!d.sums) return FLM_OK;
        E->io->bytes_checked += atomic_load(&chk.bytes);
        E->io->check_ms += (double)atomic_load(&chk.ns) / 1e6;
        if (!atomic_load(&chk.bad)) return FLM_OK;
        /* a record did not match: the reader checks the read again (a mismatch read again once, then an error naming
         * the layer and record); when it passes, every record matches: compute once more without the kernels' check */
        flm_io_stats io = {0};
        double t0 = flm_now_ms();
        flm_status st = flm_reader_check(fl->reader, src, 1, &io, err);
        c->tok->io_ms += flm_now_ms() - t0;
        flm_io_stats_add(E->io, &io);
        c->tok->bytes_read += io.bytes_read;
        c->tok->n_reads += io.n_check_retries;
        if (st) return flm_flash_region_error(fl, l, st, err);
        d.sums = NULL;
    }
}

void flm_flash_bundles(flm_ffn_env *E, uint32_t l, const uint8_t *records, const float *in, float *out) {
    flm_flash *fl = E->flash;
    E->be->ops->bundles(E->be, &fl->desc[l], records, NULL, fl->file->ffn[l]->n_records, in, out, E->s->hb, fl->acc);
}

void flm_flash_bundles_batch(flm_ffn_env *E, uint32_t l, const uint8_t *records, uint32_t n, const float *in,
                             size_t in_stride, float *out, size_t out_stride) {
    flm_flash *fl = E->flash;
    E->be->ops->bundles_batch(E->be, &fl->desc[l], records, NULL, fl->file->ffn[l]->n_records, NULL, 0, n, in,
                              in_stride, out, out_stride, fl->acc);
}

void flm_flash_close(flm_flash *fl) {
    if (!fl) return;
    flm_async_read_stop(fl->out_ahead); /* before the reader and the buffers it reads into */
    flm_reader_close(fl->reader);
    flm_sums_free(&fl->sums); /* after the reader, which checked against it */
    flm_arena_free(&fl->ffn_mem); /* every layer_data[l] */
    free(fl->layer_data);
    free(fl->desc);
    free(fl->acc);
    free(fl->embd_row);
    free(fl->out_buf[0]);
    free(fl->out_buf[1]);
    free(fl->out_sums); /* after the reader, which checked against them */
    if (fl->sparsity) flm_predictor_region_free(fl->sparsity); /* sparse_open did not take it (it failed first) */
    free(fl->sparsity);
    flm_file_close(fl->file);
    free(fl);
}

const uint8_t *flm_ffn_resident_records(const flm_ctx *ctx, uint32_t l, const flm_bundle_desc **desc) {
    const flm_flash *fl = ctx->flash;
    if (!fl || l >= fl->file->n_layers) return NULL;
    *desc = &fl->desc[l];
    return fl->layer_data[l];
}

const flm_model *flm_ctx_model(const flm_ctx *ctx) { return ctx->model; }
const flm_kernels *flm_ctx_kernels(const flm_ctx *ctx) { return ctx->k; }
const flm_params *flm_ctx_params(const flm_ctx *ctx) { return &ctx->params; }
const flm_file *flm_ctx_file(const flm_ctx *ctx) { return ctx->flash ? ctx->flash->file : NULL; }
