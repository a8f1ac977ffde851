/* stats_json.c — the statistics as JSON (flm_write_stats_json, include/flashlm_tools.h), through the checked writer:
 * the runtime writes no file. Reads the context through the public API only (flm_get_stats, flm_get_token_stats). */
#include <inttypes.h>
#include <stdio.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "core/error.h"

flm_status flm_write_stats_json(const flm_ctx *ctx, const char *path, bool replace, flm_error *err) {
    /* the checked writer (write/out.c): no link, device or other non-regular file; a unique temporary, renamed */
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
            ", \"read_gbps\": %.4f, \"io_busy_ms\": %.4f},\n", s.total.io_ms, s.total.mem_ms, s.total.compute_ms,
            total_ms, s.total.bytes_read, s.total.n_reads, s.bytes_requested,
            s.total.io_ms > 0 ? (double)s.total.bytes_read / (s.total.io_ms * 1e6) : 0.0, s.io_busy_ms);
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
        flm_token_stats tk = {0};
        flm_get_token_stats(ctx, first + i, &tk); /* kept: the last n_tokens_kept */
        const flm_token_stats *t = &tk;
        fprintf(f, "%s\n    {\"io_ms\": %.4f, \"mem_ms\": %.4f, \"compute_ms\": %.4f, \"bytes_read\": %" PRIu64
                ", \"n_reads\": %" PRIu64 ", \"n_predicted\": %" PRIu64 ", \"n_loaded\": %" PRIu64 ", \"n_reused\": %"
                PRIu64 ", \"rows_used\": %" PRIu64 "}", i ? "," : "", t->io_ms, t->mem_ms, t->compute_ms,
                t->bytes_read, t->n_reads, t->n_predicted, t->n_loaded, t->n_reused, t->rows_used);
    }
    fprintf(f, "\n  ]\n}\n");
    return flm_out_commit(w, err);
}
