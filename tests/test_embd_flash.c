/* test_embd_flash.c — the token embedding left on flash (docs/FORMAT.md "The token embedding"; docs/ARCHITECTURE.md
 * "Memory budget"). On a small synthetic model whose classifier is not tied to the embedding (flm_synth_write writes
 * its own output.weight), converted to .flm:
 *   - the converter places token_embd.weight's data last in the resident region and records the head;
 *   - naive / hybrid / sparse-less modes leave it in the file: logits identical to ram mode's, one row's aligned span
 *     read per token and counted, the plan (and the memory it holds) smaller by the embedding's bytes;
 *   - hybrid keeps it in memory when every layer and it fit; a tied model (stories260K) keeps it in memory;
 *   - a file converted before (no head recorded) still opens, with the embedding in memory (and a bigger plan);
 *   - an I/O error while reading the row fails the token, which can be evaluated again; checksums still catch
 *     corruption (the head at open, the whole region in ram mode and in flashlm verify). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"
#include "calibrate/calibrate.h"
#include "convert/convert.h"
#include "core/types.h"
#include "format/flm.h"
#include "write/flm_write.h"
#include "io/reader.h"
#include "synth/synth.h"
#include "runtime/runtime.h"
#include "testutil.h"

#define N_VOCAB 2000
#define N_LAYERS 2
#define N_TOK 8
static char gguf_path[4096], flm_path[4096], old_path[4096], tied_path[4096];
static const int32_t TOKENS[N_TOK] = {1, 1999, 0, 517, 518, 1024, 3, 1998}; /* first, last, neighbours */

/* A copy of path as converted before the embedding was split off: the resident entry's head fields zeroed, the header
 * checksum rebuilt (the payload is the same GGUF, so every region checksum still holds). */
static void write_unsplit_copy(const char *path, const char *out) {
    flm_file *f = NULL;
    flm_error err;
    if (flm_file_open(path, &f, &err)) fail_msg("%s", err.msg);
    flm_region *regions = calloc(f->n_regions, sizeof *regions);
    memcpy(regions, f->regions, f->n_regions * sizeof *regions);
    for (uint32_t i = 0; i < f->n_regions; i++)
        if (regions[i].kind == FLM_REGION_RESIDENT) regions[i].head_bytes = regions[i].head_checksum = 0;
    size_t len;
    uint8_t *data = tu_read_file(path, &len);
    flm_build_header(data, f->header_bytes, regions, f->n_regions, f->file_size);
    tu_write_file(out, data, len);
    free(data);
    free(regions);
    flm_file_close(f);
}

static int setup(void **state) {
    (void)state;
    snprintf(gguf_path, sizeof gguf_path, "%s", tu_tmp("embd", ".gguf"));
    snprintf(flm_path, sizeof flm_path, "%s", tu_tmp("embd", ".flm"));
    snprintf(old_path, sizeof old_path, "%s", tu_tmp("embd-old", ".flm"));
    snprintf(tied_path, sizeof tied_path, "%s", tu_tmp("tied", ".flm"));
    flm_synth_params sp;
    flm_synth_params_default(&sp);
    sp.d_model = 64;
    sp.d_ffn = 256;
    sp.n_layers = N_LAYERS;
    sp.n_heads = 4;
    sp.n_kv_heads = 2;
    sp.n_vocab = N_VOCAB;
    sp.n_ctx = 256;
    sp.type = FLM_TYPE_Q8_0; /* 68-byte rows: some cross a 4 KiB boundary */
    sp.rank = 16;
    sp.n_threads = 1;
    flm_error err;
    if (flm_synth_write(gguf_path, &sp, FLM_OUT_REPLACE, NULL, NULL, &err) || flm_convert(gguf_path, flm_path, NULL, NULL, &err) ||
        flm_convert(tu_data("models/stories260K/stories260K.gguf"), tied_path, NULL, NULL, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(gguf_path);
    remove(flm_path);
    remove(old_path);
    remove(tied_path);
    return 0;
}

static bool no_read_ahead; /* test_read_error: which request is the token's first is then fixed */

static flm_ctx *open_mode(const char *path, flm_mode mode, uint64_t mem, flm_status want, flm_error *err) {
    flm_params p;
    flm_params_default(&p);
    p.no_read_ahead = no_read_ahead;
    p.n_threads = 1;
    p.n_ctx = 64;
    p.n_batch = 4; /* fixed: the default shrinks with the budget, and test_budget needs the fixed parts fixed */
    p.mode = mode;
    p.mem_bytes = mem;
    flm_ctx *ctx = NULL;
    flm_status st = flm_open(path, &p, &ctx, err);
    if (st != want) fail_msg("%s: mode %s, budget %llu: status %d (%s), want %d", path, flm_mode_name(mode),
                             (unsigned long long)mem, st, st ? err->msg : "ok", want);
    return ctx;
}

/* Logits of TOKENS at positions 0.. (n_tok x N_VOCAB floats, malloc'd). */
static float *run_tokens(flm_ctx *ctx, int n_tok) {
    float *out = malloc((size_t)n_tok * N_VOCAB * sizeof(float));
    for (int t = 0; t < n_tok; t++) {
        const float *logits;
        flm_error err;
        if (flm_eval(ctx, TOKENS[t], t, &logits, &err)) fail_msg("eval %d: %s", t, err.msg);
        memcpy(out + (size_t)t * N_VOCAB, logits, N_VOCAB * sizeof(float));
    }
    return out;
}

static void test_layout(void **state) {
    (void)state;
    flm_file *f = NULL;
    flm_error err;
    assert_int_equal(flm_file_open(flm_path, &f, &err), FLM_OK);
    const flm_region *r = f->resident;
    const flm_gguf_tensor *e = flm_gguf_find_tensor(f->meta, "token_embd.weight");
    assert_non_null(e);
    assert_non_null(flm_gguf_find_tensor(f->meta, "output.weight")); /* not tied */
    assert_int_equal(r->head_bytes, f->meta->data_offset + e->offset); /* the embedding's data starts the tail */
    assert_true(r->size - r->head_bytes >= e->nbytes && r->size - r->head_bytes < e->nbytes + 32);
    assert_int_equal(e->nbytes, (uint64_t)N_VOCAB * flm_row_bytes(FLM_TYPE_Q8_0, 64));
    assert_int_equal(flm_file_tail_bytes(f), r->size - r->head_bytes);
    assert_int_equal(f->resident_loaded, r->size);
    assert_int_equal(flm_file_verify(f, NULL, NULL, &err), FLM_OK);
    flm_file_close(f);
    /* lazily: the head only, the embedding's data absent until the tail is loaded */
    assert_int_equal(flm_file_open_ex(flm_path, FLM_FILE_LAZY_TAIL, &f, &err), FLM_OK);
    assert_true(flm_file_tail_pending(f));
    assert_int_equal(f->resident_loaded, f->resident->head_bytes);
    assert_null(flm_gguf_find_tensor(f->meta, "token_embd.weight")->data);
    assert_non_null(flm_gguf_find_tensor(f->meta, "output.weight")->data);
    assert_int_equal(flm_file_load_tail(f, &err), FLM_OK);
    assert_false(flm_file_tail_pending(f));
    flm_file *whole = NULL;
    assert_int_equal(flm_file_open(flm_path, &whole, &err), FLM_OK);
    e = flm_gguf_find_tensor(f->meta, "token_embd.weight");
    assert_non_null(e->data);
    assert_memory_equal(e->data, flm_gguf_find_tensor(whole->meta, "token_embd.weight")->data, e->nbytes);
    flm_file_close(whole);
    flm_file_close(f);
}

static void test_naive_matches_ram(void **state) {
    (void)state;
    flm_error err;
    flm_ctx *ram = open_mode(flm_path, FLM_MODE_RAM, 0, FLM_OK, &err);
    flm_ctx *naive = open_mode(flm_path, FLM_MODE_NAIVE, 0, FLM_OK, &err);
    assert_int_equal(ram->flash->plan.embd, FLM_EMBD_MEMORY);
    assert_int_equal(naive->flash->plan.embd, FLM_EMBD_FLASH);
    /* the embedding's bytes are really not in memory */
    const flm_file *nf = naive->flash->file;
    assert_null(naive->model->tok_embd.data);
    assert_null(nf->tail_data);
    assert_int_equal(nf->resident_loaded, nf->resident->head_bytes);
    float *want = run_tokens(ram, N_TOK), *got = run_tokens(naive, N_TOK);
    assert_memory_equal(got, want, (size_t)N_TOK * N_VOCAB * sizeof(float)); /* bit for bit */
    /* the plan and the statistics: resident smaller by the embedding, which is reported on flash */
    flm_stats sr, sn;
    flm_get_stats(ram, &sr);
    flm_get_stats(naive, &sn);
    uint64_t tail = flm_file_tail_bytes(nf);
    assert_int_equal(sr.mem_embd_flash, 0);
    assert_int_equal(sn.mem_embd_flash, tail);
    assert_int_equal(sn.mem_resident, sr.mem_resident - tail);
    assert_int_equal(naive->flash->plan.resident, nf->resident->head_bytes);
    assert_int_equal(naive->flash->plan.embd_row, flm_row_bytes(FLM_TYPE_Q8_0, 64));
    /* per token: the layers' regions plus the aligned span around the row, one request more */
    uint64_t align = flm_reader_align(naive->flash->reader), layers = 0;
    for (uint32_t l = 0; l < N_LAYERS; l++) layers += flm_align_up(nf->ffn[l]->size, FLM_ALIGN);
    uint64_t rb = naive->flash->plan.embd_row;
    bool crossed = false;
    for (int t = 0; t < N_TOK; t++) {
        flm_token_stats ts;
        assert_true(flm_get_token_stats(naive, (uint64_t)t, &ts));
        uint64_t off = naive->flash->embd_offset + (uint64_t)TOKENS[t] * rb;
        uint64_t span = flm_align_up(off + rb, align) - off / align * align;
        crossed |= span > align;
        assert_int_equal(ts.bytes_read, layers + span);
        assert_int_equal(ts.n_reads, N_LAYERS + 1);
    }
    if (!crossed) { /* one more token, whose row crosses an alignment boundary: two blocks in one request */
        int32_t x = -1;
        for (int32_t t = 0; t < N_VOCAB && x < 0; t++) {
            uint64_t off = naive->flash->embd_offset + (uint64_t)t * rb;
            if (off / align != (off + rb - 1) / align) x = t;
        }
        assert_true(x >= 0);
        const float *a, *b;
        assert_int_equal(flm_eval(ram, x, N_TOK, &a, &err), FLM_OK);
        assert_int_equal(flm_eval(naive, x, N_TOK, &b, &err), FLM_OK);
        assert_memory_equal(a, b, N_VOCAB * sizeof(float));
        flm_token_stats ts;
        assert_true(flm_get_token_stats(naive, N_TOK, &ts));
        assert_int_equal(ts.bytes_read, layers + 2 * align);
        assert_int_equal(ts.n_reads, N_LAYERS + 1);
    }
    free(want);
    free(got);
    flm_close(ram);
    flm_close(naive);
}

/* A batch reads its rows FLM_EMBD_READ_ROWS at a time, each group in one reader call: a batch of more rows than
 * one group (a token repeated in it too) gives every row ram's logits bit for bit, and reads each group's rows. */
static void test_batch_rows(void **state) {
    (void)state;
    flm_error err;
    enum { N = FLM_EMBD_READ_ROWS + 5 };
    int32_t tok[N];
    for (int t = 0; t < N; t++) tok[t] = TOKENS[t * 3 % N_TOK]; /* every row of TOKENS, repeated */
    flm_ctx *ram = open_mode(flm_path, FLM_MODE_RAM, 0, FLM_OK, &err);
    flm_ctx *naive = open_mode(flm_path, FLM_MODE_NAIVE, 0, FLM_OK, &err);
    assert_int_equal(naive->flash->plan.embd, FLM_EMBD_FLASH);
    float *want = malloc((size_t)N * N_VOCAB * sizeof(float)), *got = malloc((size_t)N * N_VOCAB * sizeof(float));
    const float *last;
    assert_int_equal(flm_eval_batch(ram, tok, N, 0, want, &last, &err), FLM_OK);
    assert_int_equal(flm_eval_batch(naive, tok, N, 0, got, &last, &err), FLM_OK);
    assert_memory_equal(got, want, (size_t)N * N_VOCAB * sizeof(float));
    free(want);
    free(got);
    flm_close(ram);
    flm_close(naive);
}

static void test_budget(void **state) {
    (void)state;
    flm_error err;
    /* naive's plan with the embedding on flash: C (everything but the reader) + the reader, whose bounce buffers are
     * 1/16 of the budget (when that exceeds 32 KiB): at B >= (C + 36 KiB) * 16 / 15 it fits */
    flm_ctx *ctx = open_mode(flm_path, FLM_MODE_NAIVE, 64u << 20, FLM_OK, &err);
    const uint64_t tail = flm_file_tail_bytes(ctx->flash->file), row = ctx->flash->plan.embd_row;
    const flm_mem_plan *pl = &ctx->flash->plan; /* with one layer buffer (the second is read-ahead's, optional) */
    const uint64_t c = flm_mem_plan_total(pl) - pl->reader + pl->reader_checks - /* the record sums are fixed */
                       (pl->stream - pl->stream / pl->n_stream_buffers);
    flm_close(ctx);
    const uint64_t budget = (c + (36u << 10)) * 16 / 15 + 8192;
    ctx = open_mode(flm_path, FLM_MODE_NAIVE, budget, FLM_OK, &err);
    assert_int_equal(ctx->flash->plan.embd, FLM_EMBD_FLASH);
    assert_true(flm_mem_plan_total(&ctx->flash->plan) <= budget);
    assert_true(flm_mem_plan_total(&ctx->flash->plan) + tail > budget); /* the embedding would not have fitted */
    flm_close(ctx);
    /* the same file as converted before the split: the embedding stays in memory, so that budget is too small */
    write_unsplit_copy(flm_path, old_path);
    ctx = open_mode(old_path, FLM_MODE_NAIVE, budget, FLM_ERR_BUDGET, &err);
    assert_non_null(strstr(err.msg, old_path));
    assert_non_null(strstr(err.msg, "resident weights"));
    /* at a budget that holds both: the plans differ by the embedding's bytes (less the rows' buffer); same logits */
    ctx = open_mode(old_path, FLM_MODE_NAIVE, 64u << 20, FLM_OK, &err);
    assert_int_equal(ctx->flash->plan.embd, FLM_EMBD_UNSPLIT);
    assert_non_null(ctx->model->tok_embd.data);
    assert_int_equal(ctx->flash->plan.resident, ctx->flash->file->resident->size);
    const uint64_t unsplit = flm_mem_plan_total(&ctx->flash->plan);
    float *old_logits = run_tokens(ctx, 3);
    flm_close(ctx);
    ctx = open_mode(flm_path, FLM_MODE_NAIVE, 64u << 20, FLM_OK, &err);
    assert_int_equal(unsplit - flm_mem_plan_total(&ctx->flash->plan), tail - FLM_EMBD_READ_ROWS * row);
    float *new_logits = run_tokens(ctx, 3);
    assert_memory_equal(old_logits, new_logits, 3 * N_VOCAB * sizeof(float));
    flm_close(ctx);
    free(old_logits);
    free(new_logits);
    /* hybrid: everything fits (every layer and the embedding): it stays in memory, nothing is read per token */
    ctx = open_mode(flm_path, FLM_MODE_HYBRID, 64u << 20, FLM_OK, &err);
    assert_int_equal(ctx->flash->plan.n_resident_layers, N_LAYERS);
    assert_int_equal(ctx->flash->plan.embd, FLM_EMBD_MEMORY);
    assert_non_null(ctx->model->tok_embd.data);
    free(run_tokens(ctx, 2));
    flm_stats s;
    flm_get_stats(ctx, &s);
    assert_int_equal(s.total.bytes_read, 0);
    assert_int_equal(s.mem_embd_flash, 0);
    flm_close(ctx);
    /* hybrid at the tight budget: the embedding stays on flash, the layers are streamed */
    ctx = open_mode(flm_path, FLM_MODE_HYBRID, budget, FLM_OK, &err);
    assert_int_equal(ctx->flash->plan.embd, FLM_EMBD_FLASH);
    assert_true(ctx->flash->plan.n_resident_layers < N_LAYERS);
    flm_close(ctx);
}

/* An I/O error reading the row fails the token before anything changes; evaluated again, it gives ram's logits. */
static void test_read_error(void **state) {
    (void)state;
    flm_error err;
    flm_ctx *ram = open_mode(flm_path, FLM_MODE_RAM, 0, FLM_OK, &err);
    float *want = run_tokens(ram, N_TOK);
    flm_close(ram);
    const int kinds[2] = {FLM_FAULT_EIO, FLM_FAULT_SHORT};
    no_read_ahead = true; /* else the first layer's read is the previous token's last (tests/test_faults.c) */
    for (int k = 0; k < 2; k++)
        for (uint64_t at = 0; at < 2; at++) { /* the token's first request (the row), then its first layer's */
            flm_ctx *ctx = open_mode(flm_path, FLM_MODE_NAIVE, 0, FLM_OK, &err);
            const float *logits;
            for (int t = 0; t < N_TOK; t++) {
                if (t == 4) {
                    flm_reader_set_fault(ctx->flash->reader, kinds[k], at);
                    assert_int_equal(flm_eval(ctx, TOKENS[t], t, &logits, &err), FLM_ERR_IO);
                    assert_non_null(strstr(err.msg, flm_path));
                    flm_stats s;
                    flm_get_stats(ctx, &s);
                    assert_int_equal(s.n_tokens, 4); /* the failed token is not counted */
                }
                if (flm_eval(ctx, TOKENS[t], t, &logits, &err)) fail_msg("eval %d: %s", t, err.msg);
                assert_memory_equal(logits, want + (size_t)t * N_VOCAB, N_VOCAB * sizeof(float));
            }
            flm_close(ctx);
        }
    no_read_ahead = false;
    free(want);
}

/* Checksums: a corrupt head fails at open in every mode; a corrupt embedding fails where the region is read whole
 * (ram mode, flashlm verify, naming the row), and in a streaming mode when the bad row is read (its record sum), not
 * at open. */
static void test_corruption(void **state) {
    (void)state;
    flm_file *f = NULL;
    flm_error err;
    assert_int_equal(flm_file_open(flm_path, &f, &err), FLM_OK);
    uint64_t head_at = f->resident->offset + f->resident->head_bytes / 2;
    uint64_t tail_at = f->resident->offset + f->resident->head_bytes + 100;
    flm_file_close(f);
    size_t len;
    uint8_t *orig = tu_read_file(flm_path, &len);
    const char *bad = tu_tmp("embd-bad", ".flm");
    orig[head_at] ^= 0x10;
    tu_write_file(bad, orig, len);
    open_mode(bad, FLM_MODE_NAIVE, 0, FLM_ERR_CHECKSUM, &err);
    assert_non_null(strstr(err.msg, "resident region (head)"));
    open_mode(bad, FLM_MODE_RAM, 0, FLM_ERR_CHECKSUM, &err);
    orig[head_at] ^= 0x10;
    orig[tail_at] ^= 0x10;
    tu_write_file(bad, orig, len);
    flm_ctx *ctx = open_mode(bad, FLM_MODE_NAIVE, 0, FLM_OK, &err);
    const uint64_t bad_row = 100 / ctx->flash->plan.embd_row;
    char row[64];
    snprintf(row, sizeof row, "token embedding, row %llu", (unsigned long long)bad_row);
    const float *lg;
    assert_int_equal(flm_eval(ctx, (int32_t)bad_row + 1, 0, &lg, &err), FLM_OK); /* another row */
    assert_int_equal(flm_eval(ctx, (int32_t)bad_row, 1, &lg, &err), FLM_ERR_CHECKSUM);
    assert_non_null(strstr(err.msg, row));
    flm_close(ctx);
    open_mode(bad, FLM_MODE_RAM, 0, FLM_ERR_CHECKSUM, &err);
    assert_non_null(strstr(err.msg, "resident region: checksum mismatch"));
    assert_int_equal(flm_file_open_ex(bad, FLM_FILE_LAZY_TAIL, &f, &err), FLM_OK);
    assert_int_equal(flm_file_verify(f, NULL, NULL, &err), FLM_ERR_CHECKSUM);
    assert_non_null(strstr(err.msg, row)); /* the same row the streaming mode named */
    assert_int_equal(flm_file_load_tail(f, &err), FLM_ERR_CHECKSUM);
    assert_true(flm_file_tail_pending(f)); /* nothing half-loaded */
    flm_file_close(f);
    remove(bad);
    free(orig);
}

/* A tied classifier is the embedding: it stays in memory whatever the mode. */
static void test_tied_stays_in_memory(void **state) {
    (void)state;
    flm_error err;
    flm_ctx *ctx = open_mode(tied_path, FLM_MODE_NAIVE, 0, FLM_OK, &err);
    assert_int_equal(ctx->flash->plan.embd, FLM_EMBD_TIED);
    assert_non_null(ctx->model->tok_embd.data);
    assert_ptr_equal(ctx->model->tok_embd.data, ctx->model->output.data);
    assert_int_equal(ctx->flash->plan.resident, ctx->flash->file->resident->size);
    flm_stats s;
    flm_get_stats(ctx, &s);
    assert_int_equal(s.mem_embd_flash, 0);
    flm_close(ctx);
}

/* Calibrating (flm_file_put_region rewrites the header) keeps the head; sparse mode leaves the embedding on flash and
 * gives the same logits as on the unsplit copy, where it stays in memory. */
static void test_sparse_calibrated(void **state) {
    (void)state;
    const char *cal = tu_tmp("embd-cal", ".flm"), *cal_old = tu_tmp("embd-cal-old", ".flm");
    size_t len;
    uint8_t *bytes = tu_read_file(flm_path, &len);
    tu_write_file(cal, bytes, len);
    free(bytes);
    char *text = (char *)tu_read_file(tu_data("text/tinystories_sample.txt"), &len);
    if (len > 20000) text[20000] = 0;
    flm_calib_opts o;
    flm_calib_opts_default(&o);
    o.text = text;
    o.level = 0.02f;
    o.chunk = 64;
    o.max_tokens = 512;
    o.n_threads = 1;
    flm_error err;
    if (flm_calibrate(cal, &o, NULL, &err)) fail_msg("calibrate: %s", err.msg);
    free(text);
    flm_file *f = NULL;
    assert_int_equal(flm_file_open(cal, &f, &err), FLM_OK);
    assert_non_null(f->predictor);
    assert_true(f->resident->head_bytes > 0);
    assert_int_equal(flm_file_verify(f, NULL, NULL, &err), FLM_OK);
    flm_file_close(f);
    write_unsplit_copy(cal, cal_old);
    flm_ctx *a = open_mode(cal, FLM_MODE_SPARSE, 0, FLM_OK, &err);
    flm_ctx *b = open_mode(cal_old, FLM_MODE_SPARSE, 0, FLM_OK, &err);
    assert_int_equal(a->flash->plan.embd, FLM_EMBD_FLASH);
    assert_int_equal(b->flash->plan.embd, FLM_EMBD_UNSPLIT);
    float *la = run_tokens(a, N_TOK), *lb = run_tokens(b, N_TOK);
    assert_memory_equal(la, lb, (size_t)N_TOK * N_VOCAB * sizeof(float));
    flm_stats sa, sb;
    flm_get_stats(a, &sa);
    flm_get_stats(b, &sb);
    assert_int_equal(sa.mem_embd_flash, flm_file_tail_bytes(a->flash->file));
    assert_int_equal(sa.mem_resident + sa.mem_embd_flash, sb.mem_resident);
    assert_true(sa.total.bytes_read > sb.total.bytes_read); /* the rows */
    free(la);
    free(lb);
    flm_close(a);
    flm_close(b);
    remove(cal);
    remove(cal_old);
}

/* flashlm run --stats (or -v) prints the plan at open, one line per part; without them it does not. */
static void test_cli_plan(void **state) {
    (void)state;
    char args[8192], *out = NULL;
    snprintf(args, sizeof args, "run -m '%s' -n 2 -c 64 -t 1 --temp 0 --mode hybrid --mem 0 --stats 2>&1", flm_path);
    if (tu_run_cli(args, &out)) fail_msg("run failed: %s", out);
    const char *want[] = {"plan: mode hybrid", "plan:   resident weights", "plan:   token embedding",
                          "on flash, not in memory", "plan:   KV cache", "f16, 64 tokens x 2 layers",
                          "plan:   scratch", "plan:   reader", "plan:   FFN in memory", "token embedding"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strstr(out, want[i])) fail_msg("'%s' missing from:\n%s", want[i], out);
    free(out);
    snprintf(args, sizeof args, "run -m '%s' -n 2 -c 64 -t 1 --temp 0 --mode naive --kv-f32 -v 2>&1", flm_path);
    if (tu_run_cli(args, &out)) fail_msg("run failed: %s", out);
    assert_non_null(strstr(out, "f32 (--kv-f32), 64 tokens"));
    free(out);
    snprintf(args, sizeof args, "run -m '%s' -n 2 -c 64 -t 1 --temp 0 --mode naive 2>&1", flm_path);
    if (tu_run_cli(args, &out)) fail_msg("run failed: %s", out);
    assert_null(strstr(out, "plan:"));
    assert_non_null(strstr(out, "on flash)")); /* the summary line says where the embedding is */
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_naive_matches_ram),
        cmocka_unit_test(test_batch_rows),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_read_error),
        cmocka_unit_test(test_corruption),
        cmocka_unit_test(test_tied_stays_in_memory),
        cmocka_unit_test(test_sparse_calibrated),
        cmocka_unit_test(test_cli_plan),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
