/* stats.c — per-token and total statistics (Knowl 1's L_flash / L_memory / L_compute); their JSON form is the
 * tools tier's (write/stats_json.c). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "runtime/runtime.h"
#include "core/error.h"

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
    st->n_joined = ctx->n_joined;
    st->rows_joined = ctx->rows_joined;
    for (int b = 0; b < FLM_STATS_HIST && b < FLM_IO_HIST_BUCKETS; b++) st->read_hist[b] = ctx->io.hist[b];
    st->bytes_requested = ctx->io.bytes_requested;
    const flm_hparams *hp = &ctx->model->hp;
    st->n_layers = hp->n_layers;
    st->mem_kv = ctx->n_seq * flm_kv_cache_bytes(hp->n_layers, (uint32_t)ctx->params.n_ctx, hp->n_kv_heads * hp->head_dim,
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
        st->mem_budget = ctx->plan.budget; /* flm_plan_gguf's: the whole file must fit it */
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
    uint64_t busy = flm_ctx_io_busy_ns(ctx);
    st->io_busy_ms = busy > ctx->io_busy_base ? (double)(busy - ctx->io_busy_base) / 1e6 : 0;
    st->peak_rss = peak_rss_bytes();
    st->n_tokens_kept = ctx->n_tokens < FLM_STATS_TOKENS ? ctx->n_tokens : FLM_STATS_TOKENS;
}

bool flm_get_token_stats(const flm_ctx *ctx, uint64_t n, flm_token_stats *out) {
    if (n >= ctx->n_tokens || ctx->n_tokens - n > FLM_STATS_TOKENS) return false;
    *out = ctx->tokens[n % FLM_STATS_TOKENS];
    return true;
}

uint64_t flm_ctx_io_busy_ns(const flm_ctx *ctx) {
    return ctx && ctx->flash ? flm_reader_busy_ns(ctx->flash->reader) : 0;
}

void flm_reset_stats(flm_ctx *ctx) {
    ctx->io_busy_base = flm_ctx_io_busy_ns(ctx);
    memset(&ctx->total, 0, sizeof ctx->total);
    memset(&ctx->io, 0, sizeof ctx->io);
    ctx->n_tokens = 0;
    ctx->n_joined = ctx->rows_joined = 0;
}

void flm_token_stats_add(flm_token_stats *sum, const flm_token_stats *a) {
    sum->io_ms += a->io_ms;
    sum->mem_ms += a->mem_ms;
    sum->compute_ms += a->compute_ms;
    sum->bytes_read += a->bytes_read;
    sum->n_reads += a->n_reads;
    sum->n_predicted += a->n_predicted;
    sum->n_loaded += a->n_loaded;
    sum->n_reused += a->n_reused;
    sum->rows_used = a->rows_used; /* a level, not a sum: the later */
    sum->n_true += a->n_true;
    sum->n_true_pos += a->n_true_pos;
}

void flm_call_stats_add(flm_call_stats *sum, const flm_call_stats *a) {
    sum->n_tokens += a->n_tokens;
    sum->n_passes += a->n_passes;
    flm_token_stats_add(&sum->total, &a->total);
    sum->io_busy_ms += a->io_busy_ms;
    sum->ms += a->ms;
    sum->pass_ms += a->pass_ms;
}
