/* test_batch.c — the batched forward pass (flm_eval_batch) against one token at a time, in every mode:
 *   - a batch's logits equal n flm_eval calls' (to 1e-4 of the largest logit, F32 and f16 KV caches), for batch sizes
 *     that split the input unevenly, in ram (GGUF and .flm), naive, hybrid and sparse (a cache that holds the
 *     union of a batch's neurons, and one too small for it: the streamed path);
 *   - a prompt fed in chunks then decoded token by token equals the same sequence token by token;
 *   - going back to an earlier position (rewind) gives the logits of a fresh run;
 *   - a batch reads each streamed layer once: naive reads per batch what it reads per token;
 *   - bad arguments are refused without changing the context;
 *   - flm_embed (mean-pooled, normalised final states after the output norm, llama-server's --embeddings): the
 *     classifier applied to the embedding is parallel to the sum of the tokens' logits (flm_eval_batch's), and for
 *     one token to its logits, with the classifier read from the GGUF here: the states the logits come from;
 *   - flm_evaluate returns its own statistics: bytes and reads per pass against naive's one-read-per-layer, and the
 *     totals' growth over each call; a tree, a joined call and a session's generation through it; bad arguments.
 * stories260K from tests/data, calibrated here for the sparse mode; SmolLM2 (q4_1 / q8_0) when pulled. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"
#include "calibrate/calibrate.h"
#include "format/gguf.h"
#include "convert/convert.h"
#include "sparsity/sparsity.h"
#include "testutil.h"

#define T_TOK 40

static char gguf_path[4096], flm_path[4096], smol_path[4096];
static int32_t toks[T_TOK];
static uint32_t n_vocab;

static int setup(void **state) {
    (void)state;
    snprintf(gguf_path, sizeof gguf_path, "%s", tu_data("models/stories260K/stories260K.gguf"));
    snprintf(flm_path, sizeof flm_path, "%s", tu_tmp("stories-batch", ".flm"));
    flm_error err;
    if (flm_convert(gguf_path, flm_path, NULL, NULL, &err)) { fprintf(stderr, "convert: %s\n", err.msg); return -1; }
    size_t len;
    char *text = (char *)tu_read_file(tu_data("text/tinystories_sample.txt"), &len);
    text[len < 20000 ? len : 20000] = 0;
    flm_calib_opts o;
    flm_calib_opts_default(&o);
    o.text = text;
    o.chunk = 64;
    o.n_threads = 1;
    flm_status st = flm_calibrate(flm_path, &o, NULL, &err);
    if (st) { fprintf(stderr, "calibrate: %s\n", err.msg); free(text); return -1; }
    /* the tokens: the start of a story */
    flm_ctx *ctx;
    if (flm_open(flm_path, NULL, &ctx, &err)) { free(text); return -1; }
    int32_t ids[512];
    text[1400] = 0; /* 400 bytes of a story: about 100 tokens */
    size_t n = flm_tokenize(ctx, text + 1000, true, ids, 512);
    flm_model_info info;
    flm_get_info(ctx, &info);
    n_vocab = info.n_vocab;
    flm_close(ctx);
    free(text);
    if (n < T_TOK || n > 512) { fprintf(stderr, "setup: %zu tokens\n", n); return -1; }
    memcpy(toks, ids, sizeof toks);
    smol_path[0] = 0;
    const char *smol = tu_convert_pulled("smollm2-135m", "smol-batch");
    if (smol) snprintf(smol_path, sizeof smol_path, "%s", smol);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(flm_path);
    if (smol_path[0]) remove(smol_path);
    return 0;
}

typedef struct run_cfg {
    const char *path;
    flm_mode mode;
    uint64_t mem;
    bool kv_f32;
    int n_batch;
} run_cfg;

static flm_status try_open(const run_cfg *c, flm_ctx **out) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = 64;
    p.mode = c->mode;
    p.mem_bytes = c->mem;
    p.kv_f32 = c->kv_f32;
    p.n_batch = c->n_batch;
    p.window = 2;
    flm_error err;
    return flm_open(c->path, &p, out, &err);
}

static flm_ctx *open_cfg(const run_cfg *c) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = 64;
    p.mode = c->mode;
    p.mem_bytes = c->mem;
    p.kv_f32 = c->kv_f32;
    p.n_batch = c->n_batch;
    p.window = 2;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(c->path, &p, &ctx, &err)) fail_msg("%s: open %s: %s", c->path, flm_mode_name(c->mode), err.msg);
    return ctx;
}

/* logits [T][V] of toks[0..T) one token at a time */
static float *logits_single(const run_cfg *c, uint32_t T, uint32_t V) {
    flm_ctx *ctx = open_cfg(c);
    float *out = malloc((size_t)T * V * sizeof(float));
    flm_error err;
    for (uint32_t t = 0; t < T; t++) {
        const float *lg;
        if (flm_eval(ctx, toks[t], (int32_t)t, &lg, &err)) fail_msg("eval: %s", err.msg);
        memcpy(out + (size_t)t * V, lg, V * sizeof(float));
    }
    flm_close(ctx);
    return out;
}

/* max |a - b| / max(1, max |a|) */
static double rel_diff(const float *a, const float *b, size_t n) {
    double m = 1.0, d = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(a[i]) > m) m = fabs(a[i]);
        if (fabs((double)a[i] - b[i]) > d) d = fabs((double)a[i] - b[i]);
    }
    return d / m;
}

/* every token's logits through flm_eval_batch (the whole input in one call, split into n_batch pieces inside),
 * against one at a time */
static void check_cfg(const run_cfg *c, uint32_t V, const char *what) {
    float *want = logits_single(c, T_TOK, V);
    flm_ctx *ctx = open_cfg(c);
    float *got = malloc((size_t)T_TOK * V * sizeof(float));
    const float *last = NULL;
    flm_error err;
    if (flm_eval_batch(ctx, toks, T_TOK, 0, got, &last, &err)) fail_msg("%s: batch: %s", what, err.msg);
    assert_ptr_equal(last, got + (size_t)(T_TOK - 1) * V);
    assert_int_equal(flm_n_past(ctx), T_TOK);
    double dmax = rel_diff(want, got, (size_t)T_TOK * V);
    flm_stats st;
    flm_get_stats(ctx, &st);
    printf("%-34s batch %2d: max relative logit difference %.2e over %d tokens (%llu streamed)\n", what, c->n_batch,
           dmax, T_TOK, (unsigned long long)st.n_streamed);
    assert_true(dmax <= 1e-4);
    /* speculative decoding's promise (docs/SPECULATIVE.md): greedy output with drafts equals plain greedy token for
     * token, which needs a verification batch's logits to be the single-token pass's bit for bit (the same dot
     * products, summed in the same order), not only close: every mode but sparse (whose batch may read its neurons
     * from a different place) */
    if (c->mode != FLM_MODE_SPARSE && dmax != 0.0)
        fail_msg("%s: batch %d: logits differ from one token at a time (%.3e): the batched kernels must sum in the "
                 "single-token order", what, c->n_batch, dmax);
    assert_int_equal(st.n_tokens, T_TOK);
    /* a prompt in chunks (last logits only), then decoding token by token */
    const float *lg;
    if (flm_eval_batch(ctx, toks, 25, 0, NULL, &lg, &err)) fail_msg("%s: prompt: %s", what, err.msg);
    assert_true(rel_diff(want + 24 * (size_t)V, lg, V) <= 1e-4);
    for (uint32_t t = 25; t < T_TOK; t++) {
        if (flm_eval(ctx, toks[t], (int32_t)t, &lg, &err)) fail_msg("%s: eval: %s", what, err.msg);
        assert_true(rel_diff(want + (size_t)t * V, lg, V) <= 1e-4);
    }
    /* rewind: back to position 10, a batch from there gives a fresh run's logits */
    if (flm_eval_batch(ctx, toks + 10, 20, 10, got, NULL, &err)) fail_msg("%s: rewind: %s", what, err.msg);
    assert_true(rel_diff(want + 10 * (size_t)V, got, 20 * (size_t)V) <= 1e-4);
    assert_int_equal(flm_n_past(ctx), 30);
    if (flm_eval(ctx, toks[5], 5, &lg, &err)) fail_msg("%s: rewind eval: %s", what, err.msg);
    assert_true(rel_diff(want + 5 * (size_t)V, lg, V) <= 1e-4);
    assert_int_equal(flm_n_past(ctx), 6);
    free(got);
    free(want);
    flm_close(ctx);
}

static void test_batch_equals_single(void **state) {
    (void)state;
    const uint32_t V = n_vocab;
#ifdef FLM_SANITIZED_BUILD
    const int f32_last = 1; /* memory errors, not numerics: the F32 cache only (ASan is ~10x slower) */
#else
    const int f32_last = 0;
#endif
    for (int f32 = 1; f32 >= f32_last; f32--) {
        int sizes[] = {7, 16, 64};
        for (int i = 0; i < 3; i++) {
            run_cfg c = {gguf_path, FLM_MODE_AUTO, 0, f32, sizes[i]};
            char what[96];
            snprintf(what, sizeof what, "GGUF ram, %s KV", f32 ? "f32" : "f16");
            check_cfg(&c, V, what);
        }
        const flm_mode modes[] = {FLM_MODE_RAM, FLM_MODE_NAIVE, FLM_MODE_SPARSE};
        for (int m = 0; m < 3; m++) {
            run_cfg c = {flm_path, modes[m], 0, f32, 16};
            char what[96];
            snprintf(what, sizeof what, ".flm %s, %s KV", flm_mode_name(modes[m]), f32 ? "f32" : "f16");
            check_cfg(&c, V, what);
        }
    }
}

/* hybrid with some layers streamed; sparse with a cache too small for a batch's union (the streamed path) */
static void test_batch_under_budgets(void **state) {
    (void)state;
    const uint32_t V = n_vocab;
    /* a budget that keeps some layers in memory and streams the others */
    flm_ctx *ctx;
    flm_stats st = {0};
    uint64_t hmem = 0;
    for (uint64_t m = 640u << 10; m <= (2u << 20) && !hmem; m += 16u << 10) {
        run_cfg h = {flm_path, FLM_MODE_HYBRID, m, true, 16};
        if (try_open(&h, &ctx)) continue;
        flm_get_stats(ctx, &st);
        flm_close(ctx);
        if (st.n_ffn_resident_layers > 0 && st.n_ffn_resident_layers < st.n_layers) hmem = h.mem;
    }
    assert_true(hmem > 0);
    run_cfg h = {flm_path, FLM_MODE_HYBRID, hmem, true, 16};
    char what[64];
    snprintf(what, sizeof what, ".flm hybrid, %llu KiB", (unsigned long long)(hmem >> 10));
    check_cfg(&h, V, what);
    /* the smallest sparse budget that opens: its caches cannot hold a 16-token union */
    uint64_t mem = 0;
    for (uint64_t m = 600u << 10; m <= (4u << 20); m += 32u << 10) {
        run_cfg s = {flm_path, FLM_MODE_SPARSE, m, true, 16};
        if (try_open(&s, &ctx) == FLM_OK) { flm_close(ctx); mem = m; break; }
    }
    assert_true(mem > 0);
    run_cfg s = {flm_path, FLM_MODE_SPARSE, mem, true, 16};
    check_cfg(&s, V, "sparse, tightest budget");
    ctx = open_cfg(&s);
    float *lg = malloc((size_t)T_TOK * V * sizeof(float));
    flm_error err;
    if (flm_eval_batch(ctx, toks, T_TOK, 0, lg, NULL, &err)) fail_msg("batch: %s", err.msg);
    flm_get_stats(ctx, &st);
    assert_true(st.n_streamed > 0); /* the streamed path ran */
    free(lg);
    flm_close(ctx);
}

/* naive reads every layer once per batch: a 16-token batch reads what one token reads */
static void test_batch_reads_layers_once(void **state) {
    (void)state;
    run_cfg c = {flm_path, FLM_MODE_NAIVE, 0, false, 16};
    flm_ctx *ctx = open_cfg(&c);
    flm_error err;
    const float *lg;
    if (flm_eval(ctx, toks[0], 0, &lg, &err)) fail_msg("eval: %s", err.msg);
    flm_stats one;
    flm_get_stats(ctx, &one);
    if (flm_eval_batch(ctx, toks + 1, 16, 1, NULL, &lg, &err)) fail_msg("batch: %s", err.msg);
    flm_stats all;
    flm_get_stats(ctx, &all);
    printf("naive: one token read %llu bytes; a batch of 16 read %llu\n", (unsigned long long)one.total.bytes_read,
           (unsigned long long)(all.total.bytes_read - one.total.bytes_read));
    assert_true(one.total.bytes_read > 0);
    assert_int_equal(all.total.bytes_read - one.total.bytes_read, one.total.bytes_read);
    assert_int_equal(all.n_tokens, 17);
    flm_close(ctx);
}

/* W e (the classifier, output.weight [n_vocab][d] f32 in stories260K, applied to e) against the logits it should be
 * parallel to: cosine within 1e-5 of 1. */
static double cos_w(const float *W, uint32_t V, uint32_t d, const float *e, const double *want) {
    double dot = 0, a = 0, b = 0;
    for (uint32_t v = 0; v < V; v++) {
        double we = 0;
        for (uint32_t c = 0; c < d; c++) we += (double)W[(size_t)v * d + c] * e[c];
        dot += we * want[v];
        a += we * we;
        b += want[v] * want[v];
    }
    return dot / sqrt(a * b);
}

static void test_embed_matches_logits(void **state) {
    (void)state;
    flm_error err;
    flm_gguf_file *g;
    assert_int_equal(flm_gguf_open(gguf_path, &g, &err), FLM_OK);
    const flm_gguf_tensor *w = flm_gguf_find_tensor(g, "output.weight");
    assert_non_null(w);
    assert_int_equal(w->type, 0); /* F32 */
    flm_ctx *ctx;
    flm_params p;
    flm_params_default(&p);
    p.n_batch = 16; /* 40 tokens: three pieces, the last shorter */
    p.kv_f32 = true;
    assert_int_equal(flm_open(gguf_path, &p, &ctx, &err), FLM_OK);
    flm_model_info info;
    flm_get_info(ctx, &info);
    const uint32_t d = info.d_model, V = info.n_vocab;
    assert_int_equal(w->ne[0], d);
    assert_int_equal(w->ne[1], V);
    float *e = malloc(d * sizeof *e), *all = malloc((size_t)T_TOK * V * sizeof *all);
    double *sum = calloc(V, sizeof *sum);
    for (int k = 0; k < 2; k++) {
        const uint32_t n = k ? T_TOK : 1;
        assert_int_equal(flm_embed(ctx, toks, n, e, &err), FLM_OK);
        double norm = 0;
        for (uint32_t c = 0; c < d; c++) norm += (double)e[c] * e[c];
        assert_true(fabs(norm - 1) < 1e-5);
        assert_int_equal(flm_n_past(ctx), (int32_t)n); /* the context holds the tokens */
        assert_int_equal(flm_eval_batch(ctx, toks, n, 0, all, NULL, &err), FLM_OK);
        memset(sum, 0, V * sizeof *sum);
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t v = 0; v < V; v++) sum[v] += all[(size_t)t * V + v];
        double cs = cos_w((const float *)w->data, V, d, e, sum);
        print_message("flm_embed of %u tokens: cos(W e, sum of logits) = %.9f\n", n, cs);
        assert_true(cs > 1 - 1e-5);
    }
    /* the mean, not one token's: W e is not parallel to the last token's logits alone */
    double last[512];
    assert_true(V <= 512);
    for (uint32_t v = 0; v < V; v++) last[v] = all[(size_t)(T_TOK - 1) * V + v];
    assert_true(cos_w((const float *)w->data, V, d, e, last) < 0.999);
    /* bad arguments */
    assert_int_equal(flm_embed(ctx, toks, 0, e, &err), FLM_ERR_ARG);
    int32_t bad = (int32_t)V;
    assert_int_equal(flm_embed(ctx, &bad, 1, e, &err), FLM_ERR_ARG);
    assert_int_equal(flm_embed(ctx, toks, 1, NULL, &err), FLM_ERR_ARG);
    free(e);
    free(all);
    free(sum);
    flm_close(ctx);
    flm_gguf_close(g);
}

static void test_batch_bad_arguments(void **state) {
    (void)state;
    run_cfg c = {flm_path, FLM_MODE_RAM, 0, false, 8};
    flm_ctx *ctx = open_cfg(&c);
    flm_error err;
    const float *lg;
    assert_int_equal(flm_eval_batch(ctx, toks, 10, 0, NULL, &lg, &err), FLM_OK);
    assert_int_equal(flm_eval_batch(ctx, toks, 0, 10, NULL, &lg, &err), FLM_ERR_ARG);
    assert_int_equal(flm_eval_batch(ctx, NULL, 3, 10, NULL, &lg, &err), FLM_ERR_ARG);
    assert_int_equal(flm_eval_batch(ctx, toks, 3, 11, NULL, &lg, &err), FLM_ERR_ARG); /* past the next position */
    assert_non_null(strstr(err.msg, "out of order"));
    int32_t many[60] = {0};
    assert_int_equal(flm_eval_batch(ctx, many, 60, 10, NULL, &lg, &err), FLM_ERR_ARG); /* past n_ctx = 64 */
    assert_non_null(strstr(err.msg, "raise -c"));
    int32_t bad[3] = {1, (int32_t)n_vocab, 2};
    assert_int_equal(flm_eval_batch(ctx, bad, 3, 10, NULL, &lg, &err), FLM_ERR_ARG);
    assert_int_equal(flm_n_past(ctx), 10); /* nothing changed */
    flm_close(ctx);
}

/* speculative verification in sparse mode: a batch of 6 draft tokens, of which 2 are accepted (the next evaluation
 * goes back to position 12). By default the window keeps only the accepted tokens' neurons; --window-keep-rejected
 * keeps them all. The logits are the same either way (every neuron read is computed exactly). */
static void test_sparse_window_after_rejection(void **state) {
    (void)state;
    const uint32_t V = n_vocab;
    uint64_t rows[2];
    float *lg[2];
    for (int keep = 0; keep < 2; keep++) {
        flm_params p;
        flm_params_default(&p);
        p.n_threads = 1;
        p.n_ctx = 64;
        p.mode = FLM_MODE_SPARSE;
        p.window = 2;
        p.n_batch = 16;
        p.window_keep_rejected = keep;
        flm_ctx *ctx;
        flm_error err;
        if (flm_open(flm_path, &p, &ctx, &err)) fail_msg("%s", err.msg);
        const float *l;
        for (int t = 0; t < 10; t++)
            if (flm_eval(ctx, toks[t], t, &l, &err)) fail_msg("%s", err.msg);
        int32_t draft[6] = {toks[10], toks[11], 7, 8, 9, 10}; /* two right, four wrong */
        if (flm_eval_batch(ctx, draft, 6, 10, NULL, &l, &err)) fail_msg("%s", err.msg);
        lg[keep] = malloc(V * sizeof(float));
        if (flm_eval(ctx, toks[12], 12, &l, &err)) fail_msg("%s", err.msg);
        memcpy(lg[keep], l, V * sizeof(float));
        flm_stats st;
        flm_get_stats(ctx, &st);
        rows[keep] = st.total.rows_used;
        flm_close(ctx);
    }
    printf("neuron-cache rows after 2 of 6 drafts were accepted: %llu (accepted tokens only), %llu (all kept)\n",
           (unsigned long long)rows[0], (unsigned long long)rows[1]);
    assert_true(rows[0] < rows[1]);
    assert_true(rel_diff(lg[1], lg[0], V) <= 1e-5);
    run_cfg c = {flm_path, FLM_MODE_SPARSE, 0, false, 16}; /* the same tokens one at a time */
    float *want = logits_single(&c, 13, V);
    assert_true(rel_diff(want + 12 * (size_t)V, lg[0], V) <= 1e-4);
    free(want);
    free(lg[0]);
    free(lg[1]);
}

/* flm_evaluate returns its own statistics: naive reads every layer once per pass, so a call of 10 tokens in passes of
 * 4 reads what 3 single-token calls read (an independent reference), and each call's bytes, reads and tokens are
 * exactly what the context's totals gained over it; the logits it names are flm_eval_batch's; a tree through it,
 * joined calls of a two-sequence context, a session's generation (flm_session_stats: n_gen_evaluated and the bytes
 * summed from its calls, no totals diffed); bad arguments refused by name, the context unchanged. */
static void check_call(flm_ctx *ctx, const flm_eval_args *a, flm_eval_out *out, uint64_t n_tokens) {
    flm_stats before, after;
    flm_error err;
    flm_get_stats(ctx, &before);
    if (flm_evaluate(ctx, a, out, &err)) fail_msg("flm_evaluate: %s", err.msg);
    flm_get_stats(ctx, &after);
    assert_int_equal(out->stats.n_tokens, n_tokens);
    assert_int_equal(out->stats.n_tokens, after.n_tokens - before.n_tokens);
    assert_int_equal(out->stats.total.bytes_read, after.total.bytes_read - before.total.bytes_read);
    assert_int_equal(out->stats.total.n_reads, after.total.n_reads - before.total.n_reads);
    const double ms = out->stats.total.io_ms + out->stats.total.mem_ms + out->stats.total.compute_ms;
    const double grew = (after.total.io_ms + after.total.mem_ms + after.total.compute_ms) -
                        (before.total.io_ms + before.total.mem_ms + before.total.compute_ms);
    assert_true(fabs(ms - grew) <= 1e-6 * (1 + ms));
    assert_true(out->stats.ms >= 0 && out->stats.io_busy_ms >= 0);
    /* the passes' own time: all of a call that joins nothing; a joined call's without the wait for its pass */
    assert_true(out->stats.pass_ms > 0 && out->stats.pass_ms <= out->stats.ms);
    if (!a->join) assert_true(out->stats.pass_ms == out->stats.ms);
}

static void test_evaluate_own_stats(void **state) {
    (void)state;
    const uint32_t V = n_vocab;
    run_cfg c = {flm_path, FLM_MODE_NAIVE, 0, false, 4};
    flm_ctx *ctx = open_cfg(&c);
    flm_error err;
    flm_eval_out one, out;
    check_call(ctx, &(flm_eval_args){.tokens = toks, .n = 1, .pos = 0}, &one, 1);
    assert_true(one.stats.total.bytes_read > 0);
    assert_int_equal(one.stats.n_passes, 1);
    /* 10 tokens in passes of 4: 3 passes, each reading every layer once */
    float *all = malloc((size_t)10 * V * sizeof(float));
    const float *want = NULL;
    if (flm_eval_batch(ctx, toks, 10, 0, all, &want, &err)) fail_msg("batch: %s", err.msg);
    check_call(ctx, &(flm_eval_args){.tokens = toks, .n = 10, .pos = 0}, &out, 10);
    assert_int_equal(out.stats.n_passes, 3);
    assert_int_equal(out.stats.total.bytes_read, 3 * one.stats.total.bytes_read);
    assert_int_equal(out.stats.total.n_reads, 3 * one.stats.total.n_reads);
    assert_memory_equal(out.logits, all + 9 * (size_t)V, V * sizeof(float));
    /* every token's logits, and none (no output layer: nothing returned, the tokens still counted) */
    float *got = malloc((size_t)10 * V * sizeof(float));
    check_call(ctx, &(flm_eval_args){.tokens = toks, .n = 10, .logits = FLM_EVAL_LOGITS_ALL, .logits_all = got}, &out,
               10);
    assert_ptr_equal(out.logits, got + 9 * (size_t)V);
    assert_memory_equal(got, all, (size_t)10 * V * sizeof(float));
    check_call(ctx, &(flm_eval_args){.tokens = toks, .n = 6, .logits = FLM_EVAL_LOGITS_NONE}, &out, 6);
    assert_null(out.logits);
    assert_int_equal(flm_n_past(ctx), 6);
    /* the sum of calls (flm_call_stats_add) is the totals' growth over them */
    flm_stats a, b;
    flm_get_stats(ctx, &a);
    flm_call_stats sum = {0};
    for (uint32_t t = 6; t < 12; t++) {
        if (flm_evaluate(ctx, &(flm_eval_args){.tokens = toks + t, .n = 1, .pos = (int32_t)t}, &out, &err))
            fail_msg("eval: %s", err.msg);
        flm_call_stats_add(&sum, &out.stats);
    }
    flm_get_stats(ctx, &b);
    assert_int_equal(sum.n_tokens, 6);
    assert_int_equal(sum.n_passes, 6);
    assert_int_equal(sum.total.bytes_read, 6 * one.stats.total.bytes_read);
    assert_int_equal(sum.total.bytes_read, b.total.bytes_read - a.total.bytes_read);
    assert_int_equal(sum.total.n_reads, b.total.n_reads - a.total.n_reads);
    /* a tree (flm_eval_tree through it): a root and two children, then a third node from the held ones */
    const int32_t par[4] = {-1, 0, 0, 1};
    check_call(ctx, &(flm_eval_args){.tokens = toks + 12, .n = 3, .pos = 12, .parent = par,
                                     .logits = FLM_EVAL_LOGITS_ALL, .logits_all = got}, &out, 3);
    assert_null(out.logits);
    assert_int_equal(out.stats.n_passes, 1);
    check_call(ctx, &(flm_eval_args){.tokens = toks + 12, .n = 4, .pos = 12, .parent = par, .first = 3,
                                     .logits = FLM_EVAL_LOGITS_NONE}, &out, 1);
    float row[2][512];
    assert_true(V <= 512);
    if (flm_tree_logits(ctx, 3, row[0], &err)) fail_msg("tree logits: %s", err.msg);
    if (flm_eval_tree(ctx, toks + 12, par, 4, 3, 12, false, row[1], &err)) fail_msg("tree: %s", err.msg);
    assert_memory_equal(row[0], row[1], V * sizeof(float));
    /* a tree's logits for some nodes in the pass (FLM_EVAL_LOGITS_SOME): those of flm_tree_logits_n */
    const uint32_t some[2] = {3, 1};
    check_call(ctx, &(flm_eval_args){.tokens = toks + 12, .n = 4, .pos = 12, .parent = par, .first = 1,
                                     .logits = FLM_EVAL_LOGITS_SOME, .logits_all = got, .some = some, .n_some = 2},
               &out, 3);
    assert_null(out.logits);
    assert_memory_equal(got, row[1], V * sizeof(float));
    if (flm_tree_logits_n(ctx, some, 2, got + 2 * (size_t)V, &err)) fail_msg("tree logits: %s", err.msg);
    assert_memory_equal(got, got + 2 * (size_t)V, 2 * (size_t)V * sizeof(float));
    /* bad arguments: refused, naming what is wrong, the context unchanged */
    static const uint32_t some1[1] = {1}, some5[1] = {5};
    if (flm_eval_batch(ctx, toks, 8, 0, NULL, NULL, &err)) fail_msg("batch: %s", err.msg);
    const struct {
        flm_eval_args a;
        const char *msg;
    } bad[] = {
        {{.tokens = toks, .n = 2, .pos = 8, .logits_all = got}, "logits_all given"},
        {{.tokens = toks, .n = 2, .pos = 8, .logits = FLM_EVAL_LOGITS_ALL}, "logits_all NULL"},
        {{.tokens = toks, .n = 2, .pos = 8, .logits = (flm_eval_logits)7}, "logits 7"},
        {{.tokens = toks, .n = 2, .pos = 8, .first = 1}, "without a tree"},
        {{.tokens = toks, .n = 2, .pos = 8, .parent = par}, "a tree's logits"},
        {{.tokens = toks, .n = 2, .pos = 8, .seq = 1}, "sequence 1"},
        {{.tokens = toks, .n = 2, .pos = 8, .join = true, .logits = FLM_EVAL_LOGITS_NONE}, "joined"},
        {{.tokens = toks, .n = 2, .pos = 8, .join = true, .draft = true, .logits = FLM_EVAL_LOGITS_ALL,
          .logits_all = got}, "not with draft"},
        {{.tokens = toks, .n = 2, .pos = 8, .join = true, .draft = true}, "a self-draft needs mode hot"},
        {{.tokens = toks, .n = 0, .pos = 8}, "no tokens"},
        {{.tokens = toks, .n = 2, .pos = 8, .logits = FLM_EVAL_LOGITS_SOME, .logits_all = got, .some = some1,
          .n_some = 1}, "SOME takes a tree"},
        {{.tokens = toks, .n = 2, .pos = 8, .parent = par, .logits = FLM_EVAL_LOGITS_SOME, .logits_all = got}, "SOME "
          "takes a tree"},
        {{.tokens = toks, .n = 2, .pos = 8, .parent = par, .logits = FLM_EVAL_LOGITS_ALL, .logits_all = got,
          .some = some1, .n_some = 1}, "the other logits neither"},
        {{.tokens = toks + 8, .n = 2, .pos = 8, .parent = par, .logits = FLM_EVAL_LOGITS_SOME, .logits_all = got,
          .some = some5, .n_some = 1}, "node 5 is not one"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&out, 0x5a, sizeof out);
        assert_int_equal(flm_evaluate(ctx, &bad[i].a, &out, &err), FLM_ERR_ARG);
        if (!strstr(err.msg, bad[i].msg)) fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err.msg, bad[i].msg);
        assert_int_equal(out.stats.n_tokens, 0);
        assert_null(out.logits);
        assert_int_equal(flm_n_past(ctx), 8);
    }
    assert_int_equal(flm_evaluate(ctx, NULL, &out, &err), FLM_ERR_ARG);
    assert_int_equal(flm_evaluate(NULL, &bad[0].a, &out, &err), FLM_ERR_ARG);
    flm_close(ctx);
    /* two sequences: a joined call (alone here: one pass of its own) and the current one's */
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = 64;
    p.mode = FLM_MODE_NAIVE;
    p.n_batch = 4;
    p.n_seq = 2;
    if (flm_open(flm_path, &p, &ctx, &err)) fail_msg("open: %s", err.msg);
    check_call(ctx, &(flm_eval_args){.tokens = toks, .n = 3, .seq = 1, .join = true}, &out, 3);
    assert_int_equal(out.stats.total.bytes_read, one.stats.total.bytes_read); /* one pass */
    assert_memory_equal(out.logits, all + 2 * (size_t)V, V * sizeof(float));
    flm_seq_leave(ctx, 1);
    assert_int_equal(flm_seq_acquire(ctx, 1, &err), FLM_OK);
    assert_int_equal(flm_n_past(ctx), 3);
    check_call(ctx, &(flm_eval_args){.tokens = toks + 3, .n = 1, .pos = 3, .seq = 1}, &out, 1);
    assert_memory_equal(out.logits, all + 3 * (size_t)V, V * sizeof(float));
    assert_int_equal(flm_evaluate(ctx, &(flm_eval_args){.tokens = toks, .n = 1, .seq = 0}, &out, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "not the current one"));
    flm_seq_release(ctx);
    flm_close(ctx);
    /* a session's generation: its figures are its calls' (n_gen - 1 evaluated: the last sampled one is not) */
    ctx = open_cfg(&c);
    flm_session *s = NULL;
    if (flm_session_create(ctx, &s, &err) || flm_session_feed(s, toks, 5, &err)) fail_msg("session: %s", err.msg);
    flm_get_stats(ctx, &a);
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = 6;
    flm_gen_result r;
    if (flm_session_generate(s, &gp, NULL, NULL, &r, &err)) fail_msg("generate: %s", err.msg);
    flm_get_stats(ctx, &b);
    flm_session_stats ss;
    flm_session_get_stats(s, &ss);
    assert_true(r.n_gen == 6 || r.eog);
    assert_int_equal(ss.n_gen_evaluated, (uint64_t)r.n_gen - 1); /* neither the 6th nor an end token is evaluated */
    assert_int_equal(ss.n_gen_evaluated, b.n_tokens - a.n_tokens);
    assert_int_equal(ss.gen.bytes_read, ss.n_gen_evaluated * one.stats.total.bytes_read);
    assert_int_equal(ss.gen.n_reads, b.total.n_reads - a.total.n_reads);
    assert_int_equal(ss.prompt.bytes_read, 2 * one.stats.total.bytes_read); /* 5 prompt tokens: 2 passes of 4 */
    flm_session_free(s);
    flm_close(ctx);
    free(got);
    free(all);
}

/* a real quantized model (q4_1 FFN, q8_0 embedding): every type's batched dot product */
static void test_batch_real_model(void **state) {
    (void)state;
    if (!smol_path[0]) skip();
    flm_ctx *ctx;
    flm_error err;
    if (flm_open(smol_path, NULL, &ctx, &err)) fail_msg("%s", err.msg);
    flm_model_info info;
    flm_get_info(ctx, &info);
    int32_t ids[64];
    size_t n = flm_tokenize(ctx, "The quick brown fox jumps over the lazy dog. Once upon a time, there was", true,
                            ids, 64);
    flm_close(ctx);
    assert_true(n >= 12 && n <= 64);
    memcpy(toks, ids, n * sizeof *ids);
    const uint32_t T = (uint32_t)n, V = info.n_vocab;
    const flm_mode modes[] = {FLM_MODE_RAM, FLM_MODE_NAIVE};
    for (int m = 0; m < 2; m++) {
        run_cfg c = {smol_path, modes[m], 0, true, 5};
        float *want = logits_single(&c, T, V);
        ctx = open_cfg(&c);
        float *got = malloc((size_t)T * V * sizeof(float));
        if (flm_eval_batch(ctx, toks, T, 0, got, NULL, &err)) fail_msg("batch: %s", err.msg);
        double dmax = rel_diff(want, got, (size_t)T * V);
        printf("SmolLM2 %s: max relative logit difference %.2e over %u tokens\n", flm_mode_name(modes[m]), dmax, T);
        assert_true(dmax == 0.0); /* bit for bit (check_cfg says why) */
        free(got);
        free(want);
        flm_close(ctx);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_equals_single),
        cmocka_unit_test(test_batch_under_budgets),
        cmocka_unit_test(test_batch_reads_layers_once),
        cmocka_unit_test(test_batch_bad_arguments),
        cmocka_unit_test(test_embed_matches_logits),
        cmocka_unit_test(test_sparse_window_after_rejection),
        cmocka_unit_test(test_evaluate_own_stats),
        cmocka_unit_test(test_batch_real_model),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
