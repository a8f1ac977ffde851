/* test_coact.c — the co-activation order (calibrate/coact.c, flm_file_permute_ffn_ex; docs/SPARSITY.md,
 * "Co-activation order") on a small OPT-shaped synthetic model (FFN biases, ungated ReLU), calibrated:
 *   - the ordered file verifies, its regions are marked FLM_FFN_COACT_ORDER (not hot), its FFN biases and predictors
 *     follow the records;
 *   - ram mode on it gives the unordered file's logits (to float rounding: the FFN sums its neurons in another order);
 *   - sparse mode on it (under a budget: the first token's dense set is partly streamed) flags the same neurons token
 *     by token (the same counts predicted, read and reused) and gives the unordered file's logits bit for bit (its
 *     sums run in the original neuron order), with fewer reads;
 *   - the reader's coalescing changes no bit: with gap merging on and off the logits are equal;
 *   - refusals: a file without predictors, a text too short;
 *   - the CLI: calibrate --coact-only prints its held-out table, and refuses --hot-only beside it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "calibrate/calibrate.h"
#include "format/flm.h"
#include "runtime/runtime.h"
#include "testutil.h"

#define N_TOK 24

static char g_gguf[4096], g_plain[4096], g_coact[4096], g_uncal[4096];
static flm_coact_report g_rep;

static int setup(void **state) {
    (void)state;
    snprintf(g_gguf, sizeof g_gguf, "%s", tu_tmp("coact", ".gguf"));
    snprintf(g_plain, sizeof g_plain, "%s", tu_tmp("coact-plain", ".flm"));
    snprintf(g_coact, sizeof g_coact, "%s", tu_tmp("coact-ordered", ".flm"));
    snprintf(g_uncal, sizeof g_uncal, "%s", tu_tmp("coact-uncal", ".flm"));
    flm_synth_params p;
    flm_synth_params_default(&p);
    p.arch = FLM_SYNTH_ARCH_OPT;
    p.d_model = 256;
    p.d_ffn = 2048;
    p.n_layers = 2;
    p.n_heads = p.n_kv_heads = 4;
    p.n_vocab = 512;
    p.n_ctx = 512;
    p.type = FLM_TYPE_F32;
    p.act = FLM_SYNTH_ACT_RELU;
    p.calib_tokens = 64;
    p.n_threads = 1;
    flm_error err;
    if (flm_synth_write(g_gguf, &p, FLM_OUT_REPLACE, NULL, NULL, &err) ||
        flm_convert_ex(g_gguf, g_plain, FLM_TYPE_F32, FLM_OUT_REPLACE, NULL, NULL, NULL, &err) ||
        flm_convert_ex(g_gguf, g_uncal, FLM_TYPE_F32, FLM_OUT_REPLACE, NULL, NULL, NULL, &err)) {
        fprintf(stderr, "synth/convert: %s\n", err.msg);
        return -1;
    }
    size_t len;
    char *text = (char *)tu_read_file(tu_data("text/sentences.txt"), &len);
    flm_calib_opts o;
    flm_calib_opts_default(&o);
    o.text = text;
    o.max_tokens = 512;
    o.chunk = 64;
    o.rank = 32;
    o.n_threads = 1;
    flm_coact_opts co;
    flm_coact_opts_default(&co);
    co.text = text;
    co.max_tokens = 512;
    co.chunk = 64;
    co.n_threads = 1;
    co.out_path = g_coact;
    int rc = 0;
    if (flm_calibrate(g_plain, &o, NULL, &err) || flm_coact_order(g_plain, &co, &g_rep, &err)) {
        fprintf(stderr, "calibrate/coact: %s\n", err.msg);
        rc = -1;
    }
    free(text);
    return rc;
}

static int teardown(void **state) {
    (void)state;
    remove(g_gguf);
    remove(g_plain);
    remove(g_coact);
    remove(g_uncal);
    return 0;
}

static flm_ctx *open_ctx(const char *path, flm_mode mode, double pct, const char *probe) {
    flm_params p;
    flm_params_default(&p);
    p.mode = mode;
    p.n_ctx = 64;
    p.n_threads = 1;
    p.mem_percent = pct;
    p.kv_f32 = true;
    p.io_cost_path = probe;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(path, &p, &ctx, &err)) fail_msg("open %s: %s", path, err.msg);
    return ctx;
}

/* ids of the test's tokens: a fixed sequence over the vocabulary */
static void token_ids(int32_t *ids) {
    for (int t = 0; t < N_TOK; t++) ids[t] = t == 0 ? 1 : 3 + (t * 37) % 500;
}

/* logits [N_TOK][V] token by token, and the cumulative statistics after each token */
static float *run(flm_ctx *ctx, flm_token_stats *after) {
    int32_t ids[N_TOK];
    token_ids(ids);
    const uint32_t V = tu_vocab(ctx);
    float *out = malloc((size_t)N_TOK * V * sizeof(float));
    assert_non_null(out);
    flm_error err;
    for (int t = 0; t < N_TOK; t++) {
        const float *lg;
        if (flm_eval(ctx, ids[t], t, &lg, &err)) fail_msg("eval: %s", err.msg);
        memcpy(out + (size_t)t * V, lg, V * sizeof(float));
        if (after) {
            flm_stats s;
            flm_get_stats(ctx, &s);
            after[t] = s.total;
        }
    }
    return out;
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double mx = 1e-30, md = 0;
    for (size_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(a[i]));
        md = fmax(md, fabs((double)a[i] - b[i]));
    }
    return md / mx;
}

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void test_order_written(void **state) {
    (void)state;
    flm_error err;
    flm_verify_info vi;
    assert_int_equal(flm_verify(g_coact, NULL, NULL, &vi, &err), FLM_OK);
    assert_false(flm_is_hot_ordered(g_coact));
    flm_file *f = NULL, *g = NULL;
    if (flm_file_open(g_coact, &f, &err) || flm_file_open(g_plain, &g, &err)) fail_msg("open: %s", err.msg);
    assert_non_null(f->predictor);
    for (uint32_t l = 0; l < f->n_layers; l++) {
        assert_int_equal(f->ffn[l]->flags, FLM_FFN_COACT_ORDER);
        assert_int_equal(g->ffn[l]->flags, 0);
    }
    /* the up biases are the unordered file's, permuted: the same multiset, another order */
    char name[64];
    snprintf(name, sizeof name, "blk.%u.ffn_up.bias", 1u);
    const flm_gguf_tensor *bf = flm_gguf_find_tensor(f->meta, name), *bg = flm_gguf_find_tensor(g->meta, name);
    assert_non_null(bf);
    assert_non_null(bg);
    assert_int_equal(bf->type, FLM_TYPE_F32);
    const uint32_t F = (uint32_t)bf->n_elements;
    float *sf = malloc(F * sizeof *sf), *sg = malloc(F * sizeof *sg);
    memcpy(sf, bf->data, F * sizeof *sf);
    memcpy(sg, bg->data, F * sizeof *sg);
    assert_memory_not_equal(sf, sg, F * sizeof *sf);
    qsort(sf, F, sizeof *sf, cmpf);
    qsort(sg, F, sizeof *sg, cmpf);
    assert_memory_equal(sf, sg, F * sizeof *sf);
    free(sf);
    free(sg);
    flm_file_close(f);
    flm_file_close(g);
    printf("held-out (%u sets): reads per token %.1f -> %.1f (MiB %.3f -> %.3f); with a window of %u: %.1f -> %.1f "
           "(MiB %.3f -> %.3f)\n", g_rep.n_held, g_rep.reads[0][0], g_rep.reads[0][1], g_rep.mib[0][0],
           g_rep.mib[0][1], g_rep.window, g_rep.reads[1][0], g_rep.reads[1][1], g_rep.mib[1][0], g_rep.mib[1][1]);
    assert_int_equal(g_rep.n_layers, 2);
    assert_true(g_rep.n_held > 0);
    assert_true(g_rep.reads[0][1] < g_rep.reads[0][0]);
    assert_true(g_rep.mib[0][1] <= g_rep.mib[0][0]);
}

static void test_ram_same_function(void **state) {
    (void)state;
    flm_ctx *a = open_ctx(g_plain, FLM_MODE_RAM, 0, NULL), *b = open_ctx(g_coact, FLM_MODE_RAM, 0, NULL);
    float *la = run(a, NULL), *lb = run(b, NULL);
    const size_t n = (size_t)N_TOK * tu_vocab(a);
    double d = rel_diff(la, lb, n);
    printf("ram, co-activation order vs unordered: max relative logit difference %.2e\n", d);
    assert_true(d <= 1e-5);
    free(la);
    free(lb);
    flm_close(a);
    flm_close(b);
}

static void test_sparse_same_neurons(void **state) {
    (void)state;
    flm_ctx *a = open_ctx(g_plain, FLM_MODE_SPARSE, 70, NULL), *b = open_ctx(g_coact, FLM_MODE_SPARSE, 70, NULL);
    flm_token_stats sa[N_TOK], sb[N_TOK];
    float *la = run(a, sa), *lb = run(b, sb);
    const uint32_t V = tu_vocab(a);
    for (int t = 0; t < N_TOK; t++) { /* the same sets: as many neurons predicted, read and reused, token by token */
        assert_int_equal(sa[t].n_predicted, sb[t].n_predicted);
        assert_int_equal(sa[t].n_loaded, sb[t].n_loaded);
        assert_int_equal(sa[t].n_reused, sb[t].n_reused);
        assert_int_equal(tu_argmax(la + (size_t)t * V, V), tu_argmax(lb + (size_t)t * V, V));
    }
    const flm_token_stats *ta = &sa[N_TOK - 1], *tb = &sb[N_TOK - 1];
    printf("sparse at 70%%, co-activation order vs unordered: logits %s; %llu neurons predicted, %llu read (%llu "
           "streamed past the cache): %llu reads, %.1f KiB (unordered) -> %llu reads, %.1f KiB\n",
           memcmp(la, lb, (size_t)N_TOK * V * sizeof(float)) ? "DIFFER" : "bit for bit equal",
           (unsigned long long)ta->n_predicted, (unsigned long long)ta->n_loaded,
           (unsigned long long)flm_sparse_streamed(flm_ctx_sparse(a)), (unsigned long long)ta->n_reads, ta->bytes_read / 1024.0,
           (unsigned long long)tb->n_reads, tb->bytes_read / 1024.0);
    /* the sums run in the original order (flm_predictor_layer.orig) and the plan keeps the same cache: the same bits,
     * the first token (dense, larger than the cache: part streamed) included */
    assert_memory_equal(la, lb, (size_t)N_TOK * V * sizeof(float));
    assert_true(ta->n_loaded > 0);
    assert_true(flm_sparse_streamed(flm_ctx_sparse(a)) > 0);
    /* after the first token (its dense set streams the part past the cache in the original order: scattered in the
     * new one), fewer reads */
    const uint64_t ra = ta->n_reads - sa[0].n_reads, rb = tb->n_reads - sb[0].n_reads;
    printf("tokens 1..%d: %llu reads, %.1f KiB (unordered) -> %llu reads, %.1f KiB\n", N_TOK - 1,
           (unsigned long long)ra, (ta->bytes_read - sa[0].bytes_read) / 1024.0, (unsigned long long)rb,
           (tb->bytes_read - sb[0].bytes_read) / 1024.0);
    assert_true(rb < ra);
    free(la);
    free(lb);
    flm_close(a);
    flm_close(b);
}

static void test_coalescing_changes_no_bit(void **state) {
    (void)state;
    const char *probe[2] = {tu_tmp("coact-nomerge", ".json"), NULL};
    char p0[4096];
    snprintf(p0, sizeof p0, "%s", probe[0]);
    static const char js[] = "{\"format\": \"flashlm-probe\", \"version\": 1, \"cost\": {\"latency_us\": 0, "
                             "\"bandwidth_gbps\": 2}}\n";
    tu_write_file(p0, js, sizeof js - 1);
    static const char js2[] = "{\"format\": \"flashlm-probe\", \"version\": 1, \"cost\": {\"latency_us\": 200, "
                              "\"bandwidth_gbps\": 2}}\n";
    char p1[4096];
    snprintf(p1, sizeof p1, "%s", tu_tmp("coact-merge", ".json"));
    tu_write_file(p1, js2, sizeof js2 - 1);
    flm_ctx *a = open_ctx(g_coact, FLM_MODE_SPARSE, 70, p0), *b = open_ctx(g_coact, FLM_MODE_SPARSE, 70, p1);
    flm_token_stats sa[N_TOK], sb[N_TOK];
    float *la = run(a, sa), *lb = run(b, sb);
    const flm_token_stats *ta = &sa[N_TOK - 1], *tb = &sb[N_TOK - 1];
    printf("sparse, no gap merged: %llu reads, %.1f KiB; gaps below 400 KB read through: %llu reads, %.1f KiB\n",
           (unsigned long long)ta->n_reads, ta->bytes_read / 1024.0, (unsigned long long)tb->n_reads,
           tb->bytes_read / 1024.0);
    assert_memory_equal(la, lb, (size_t)N_TOK * tu_vocab(a) * sizeof(float));
    assert_int_equal(ta->n_loaded, tb->n_loaded);
    assert_true(tb->n_reads < ta->n_reads);
    assert_true(tb->bytes_read > ta->bytes_read);
    free(la);
    free(lb);
    flm_close(a);
    flm_close(b);
    remove(p0);
    remove(p1);
}

static void test_refusals(void **state) {
    (void)state;
    flm_coact_opts co;
    flm_coact_opts_default(&co);
    co.text = "Once upon a time there was a little dog. He liked to run in the park with his ball.";
    co.chunk = 64;
    co.max_tokens = 512;
    flm_error err;
    flm_status st = flm_coact_order(g_uncal, &co, NULL, &err);
    assert_int_equal(st, FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "calibrate"));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", tu_tmp("coact-short", ".flm"));
    co.out_path = tmp;
    st = flm_coact_order(g_plain, &co, NULL, &err); /* ~20 tokens: not one chunk of 64 */
    assert_int_equal(st, FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "tokens"));
    assert_false(tu_temp_left(g_plain));
    co.held_out = 1.0f;
    assert_int_equal(flm_coact_order(g_plain, &co, NULL, &err), FLM_ERR_ARG);
    co.held_out = 0.25f;
    co.text = NULL;
    assert_int_equal(flm_coact_order(g_plain, &co, NULL, &err), FLM_ERR_ARG);
    remove(tmp);
}

/* the CLI: calibrate --coact-only on a copy prints the held-out table; it excludes --hot-only and --levels-only */
static void test_cli(void **state) {
    (void)state;
    char copy[4096], args[16384];
    snprintf(copy, sizeof copy, "%s", tu_tmp("coact-cli", ".flm"));
    size_t len;
    uint8_t *bytes = tu_read_file(g_plain, &len);
    tu_write_file(copy, bytes, len);
    free(bytes);
    snprintf(args, sizeof args, "calibrate '%s' --coact-only --coact-tokens 512 --chunk 64 -t 1 --text '%s' 2>&1", copy,
             tu_data("text/sentences.txt"));
    char *out = tu_cli_expect(args, 0, "stored in co-activation order");
    assert_non_null(strstr(out, "| every predicted neuron | co-activation |"));
    free(out);
    assert_false(flm_is_hot_ordered(copy));
    snprintf(args, sizeof args, "calibrate '%s' --coact-only --hot-only --text '%s' 2>&1", copy,
             tu_data("text/sentences.txt"));
    free(tu_cli_expect(args, 2, "--coact-only excludes"));
    snprintf(args, sizeof args, "calibrate '%s' --coact-tokens 8 --text '%s' 2>&1", copy, tu_data("text/sentences.txt"));
    free(tu_cli_expect(args, 2, "bad --coact-tokens"));
    remove(copy);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_written),
        cmocka_unit_test(test_ram_same_function),
        cmocka_unit_test(test_sparse_same_neurons),
        cmocka_unit_test(test_coalescing_changes_no_bit),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
