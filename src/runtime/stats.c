/* stats.c — per-token and total statistics (Knowl 1's L_flash / L_memory / L_compute), and their JSON form. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "runtime/runtime.h"
#include "core/error.h"
#include "core/files.h"

static uint64_t peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (uint64_t)ru.ru_maxrss * 1024; /* Linux: KiB */
}

void flm_get_stats(const flm_ctx *ctx, flm_stats *st) {
    memset(st, 0, sizeof *st);
    const flm_flash *fl = ctx->flash;
    st->mode = fl ? flm_mode_name(fl->plan.mode) : "ram";
    const flm_sparse *sp = flm_ctx_sparse(ctx);
    st->io_backend = fl && fl->reader && (sp || fl->plan.n_resident_layers < ctx->model->hp.n_layers)
                         ? flm_reader_backend_name(fl->reader) : "none";
    st->direct_io = strcmp(st->io_backend, "none") != 0 && flm_reader_is_direct(fl->reader);
    st->n_tokens = ctx->n_tokens;
    st->total = ctx->total;
    for (int b = 0; b < FLM_STATS_HIST && b < FLM_IO_HIST_BUCKETS; b++) st->read_hist[b] = ctx->io.hist[b];
    st->bytes_requested = ctx->io.bytes_requested;
    const flm_hparams *hp = &ctx->model->hp;
    st->n_layers = hp->n_layers;
    st->mem_kv = flm_kv_cache_bytes(hp->n_layers, (uint32_t)ctx->params.n_ctx, hp->n_kv_heads * hp->head_dim,
                                    ctx->be.kv.elem_bytes);
    st->kv_type = ctx->be.kv.elem_bytes == FLM_KV_F16 ? "f16" : "f32";
    st->n_ctx = (uint32_t)ctx->params.n_ctx;
    if (fl) {
        st->mem_budget = fl->plan.budget + fl->plan.spec; /* the parts' and auto's speculative buffers' */
        st->mem_resident = fl->plan.resident;
        st->mem_embd_flash = fl->plan.embd == FLM_EMBD_FLASH ? fl->plan.embd_bytes : 0;
        st->mem_ffn = fl->plan.ffn_resident + fl->plan.stream;
        st->mem_scratch = fl->plan.scratch + fl->plan.reader;
        st->model_bytes = fl->plan.model_bytes;
        st->n_ffn_resident_layers = fl->plan.n_resident_layers;
        st->window = flm_sparse_window(sp);
        st->cache_rows = flm_sparse_cache_rows(sp);
        st->n_streamed = flm_sparse_streamed(sp);
        if (sp) st->mem_ffn = fl->plan.cache + fl->plan.predictors + fl->plan.stream; /* + its stream buffer */
    } else {
        st->mem_resident = ctx->mem_resident;
        st->mem_scratch = ctx->plan.scratch; /* flm_plan_gguf's */
        st->model_bytes = ctx->mem_resident;
        st->n_ffn_resident_layers = hp->n_layers;
    }
    st->n_batch = (uint32_t)ctx->params.n_batch;
    st->reads_verified = fl && flm_reader_checks(fl->reader);
    st->bytes_verified = ctx->io.bytes_checked;
    st->n_verify_retries = ctx->io.n_check_retries;
    st->verify_ms = ctx->io.check_ms;
    st->peak_rss = peak_rss_bytes();
    st->n_tokens_kept = ctx->n_tokens < FLM_STATS_TOKENS ? ctx->n_tokens : FLM_STATS_TOKENS;
}

bool flm_get_token_stats(const flm_ctx *ctx, uint64_t n, flm_token_stats *out) {
    if (n >= ctx->n_tokens || ctx->n_tokens - n > FLM_STATS_TOKENS) return false;
    *out = ctx->tokens[n % FLM_STATS_TOKENS];
    return true;
}

void flm_reset_stats(flm_ctx *ctx) {
    memset(&ctx->total, 0, sizeof ctx->total);
    memset(&ctx->io, 0, sizeof ctx->io);
    ctx->n_tokens = 0;
}

flm_status flm_write_stats_json(const flm_ctx *ctx, const char *path, bool replace, flm_error *err) {
    /* the checked writer (core/files.h): no link, device or other non-regular file; a unique temporary, renamed */
    flm_out *w = NULL;
    flm_status st = flm_out_open(path, NULL, replace ? FLM_OUT_REPLACE : 0u, &w, err);
    if (st) return st;
    FILE *f = flm_out_stream(w);
    if (!f) {
        flm_out_abort(w);
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    }
    flm_stats s;
    flm_get_stats(ctx, &s);
    double total_ms = s.total.io_ms + s.total.mem_ms + s.total.compute_ms;
    fprintf(f, "{\n  \"mode\": \"%s\",\n  \"io_backend\": \"%s\",\n  \"direct_io\": %s,\n  \"n_tokens\": %" PRIu64
            ",\n", s.mode, s.io_backend, s.direct_io ? "true" : "false", s.n_tokens);
    fprintf(f, "  \"total\": {\"io_ms\": %.4f, \"mem_ms\": %.4f, \"compute_ms\": %.4f, \"total_ms\": %.4f, "
            "\"bytes_read\": %" PRIu64 ", \"n_reads\": %" PRIu64 ", \"bytes_requested\": %" PRIu64
            ", \"read_gbps\": %.4f},\n", s.total.io_ms, s.total.mem_ms, s.total.compute_ms, total_ms,
            s.total.bytes_read, s.total.n_reads, s.bytes_requested,
            s.total.io_ms > 0 ? (double)s.total.bytes_read / (s.total.io_ms * 1e6) : 0.0);
    fprintf(f, "  \"verify_reads\": {\"enabled\": %s, \"bytes\": %" PRIu64 ", \"retries\": %" PRIu64
            ", \"hash_ms\": %.4f},\n", s.reads_verified ? "true" : "false", s.bytes_verified, s.n_verify_retries,
            s.verify_ms);
    fprintf(f, "  \"sparse\": {\"window\": %u, \"cache_rows\": %" PRIu64 ", \"n_predicted\": %" PRIu64
            ", \"n_loaded\": %" PRIu64 ", \"n_reused\": %" PRIu64 ", \"n_true\": %" PRIu64 ", \"n_true_pos\": %" PRIu64
            ", \"n_streamed\": %" PRIu64 "},\n", s.window, s.cache_rows, s.total.n_predicted, s.total.n_loaded,
            s.total.n_reused, s.total.n_true, s.total.n_true_pos, s.n_streamed);
    fprintf(f, "  \"read_size_hist\": {\"bucket_low_bytes\": [");
    for (int b = 0; b < FLM_STATS_HIST; b++) fprintf(f, "%s%llu", b ? ", " : "", 512ull << b);
    fprintf(f, "], \"count\": [");
    for (int b = 0; b < FLM_STATS_HIST; b++) fprintf(f, "%s%" PRIu64, b ? ", " : "", s.read_hist[b]);
    fprintf(f, "]},\n");
    fprintf(f, "  \"memory\": {\"budget\": %" PRIu64 ", \"resident\": %" PRIu64 ", \"embd_flash\": %" PRIu64
            ", \"ffn\": %" PRIu64 ", \"kv\": %" PRIu64 ", \"kv_type\": \"%s\", \"n_ctx\": %u, \"scratch\": %" PRIu64
            ", \"model_bytes\": %" PRIu64 ", \"n_layers\": %u, \"ffn_resident_layers\": %u, \"peak_rss\": %" PRIu64
            "},\n", s.mem_budget, s.mem_resident, s.mem_embd_flash, s.mem_ffn, s.mem_kv, s.kv_type, s.n_ctx,
            s.mem_scratch, s.model_bytes, s.n_layers, s.n_ffn_resident_layers, s.peak_rss);
    uint64_t first = s.n_tokens - s.n_tokens_kept;
    fprintf(f, "  \"first_token\": %" PRIu64 ",\n  \"tokens\": [", first); /* the ring keeps the last ones */
    for (uint64_t i = 0; i < s.n_tokens_kept; i++) {
        const flm_token_stats *t = &ctx->tokens[(first + i) % FLM_STATS_TOKENS];
        fprintf(f, "%s\n    {\"io_ms\": %.4f, \"mem_ms\": %.4f, \"compute_ms\": %.4f, \"bytes_read\": %" PRIu64
                ", \"n_reads\": %" PRIu64 ", \"n_predicted\": %" PRIu64 ", \"n_loaded\": %" PRIu64 ", \"n_reused\": %"
                PRIu64 ", \"rows_used\": %" PRIu64 "}", i ? "," : "", t->io_ms, t->mem_ms, t->compute_ms,
                t->bytes_read, t->n_reads, t->n_predicted, t->n_loaded, t->n_reused, t->rows_used);
    }
    fprintf(f, "\n  ]\n}\n");
    return flm_out_commit(w, err);
}
