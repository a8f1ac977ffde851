/* test_sparse.c — the sparse FFN against the dense one, and the full method on stories260K: calibrated on the first
 * part of tinystories_sample.txt, its perplexity on the held-out rest stays within a stated bound of the dense
 * perplexity, and it reads far fewer bytes per token than naive. */
#include <fcntl.h>
#include <math.h>
#include <sys/file.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/ffn_bundle.h"
#include "compute/kernels.h"
#include "flashlm.h"
#include "convert/convert.h"
#include "format/flm.h"
#include "calibrate/calibrate.h"
#include "calibrate/curve.h"
#include "sparsity/sparsity.h"
#include "testutil.h"

/* ---- the bundle FFN on random ReLU data: subsets and orders ------------------------------------------------- */

static void test_sparse_ffn_equals_dense(void **state) {
    (void)state;
    const uint32_t d = 96, F = 300;
    const flm_kernels *k = flm_kernels_best();
    uint32_t types[] = {FLM_TYPE_F32, FLM_TYPE_F16, FLM_TYPE_Q8_0};
    uint64_t rng = 7;
    for (size_t ti = 0; ti < 3; ti++) {
        uint32_t t = types[ti];
        size_t rb = (size_t)(t == FLM_TYPE_F32 ? 4 * d : t == FLM_TYPE_F16 ? 2 * d : d / 32 * 34);
        flm_bundle_desc b = {d, t, t, t, 0, rb, 2 * rb, 3 * rb, true, true, 0.0f, NULL, NULL, 0, NULL};
        uint8_t *rec = malloc(F * b.record_bytes);
        float *row = malloc(d * sizeof(float)), *x = malloc(d * sizeof(float));
        for (uint32_t i = 0; i < F; i++)
            for (int part = 0; part < 3; part++) {
                for (uint32_t j = 0; j < d; j++) row[j] = tu_rand_f32(&rng) * 0.2f;
                flm_quantize_row(t, row, rec + i * b.record_bytes + part * rb, d);
            }
        for (uint32_t j = 0; j < d; j++) x[j] = tu_rand_f32(&rng);
        float *dense = calloc(d, 4), *sub = calloc(d, 4), *h = calloc(F, 4), *acc = calloc(2 * d, 4);
        flm_ffn_bundles(k, &b, rec, NULL, F, x, dense, h, acc, 1, NULL);
        /* the full set through a row list in natural order: exactly the same bits */
        uint32_t *rows = malloc(F * sizeof *rows);
        for (uint32_t i = 0; i < F; i++) rows[i] = i;
        flm_ffn_bundles(k, &b, rec, rows, F, x, sub, h, acc, 1, NULL);
        assert_memory_equal(dense, sub, d * sizeof(float));
        /* the oracle set (neurons with relu(gate . x) > 0), shuffled: equal to float rounding */
        uint32_t n = 0;
        for (uint32_t i = 0; i < F; i++)
            if (k->dot[t](rec + i * b.record_bytes + b.gate_off, x, d) > 0.0f) rows[n++] = i;
        assert_true(n > 0 && n < F);
        for (uint32_t i = n - 1; i > 0; i--) {
            uint32_t j = (uint32_t)(tu_rand_u64(&rng) % (i + 1)), tmp = rows[i];
            rows[i] = rows[j];
            rows[j] = tmp;
        }
        flm_ffn_bundles(k, &b, rec, rows, n, x, sub, h, acc, 2, NULL);
        for (uint32_t j = 0; j < d; j++) assert_true(fabsf(dense[j] - sub[j]) <= 1e-5f * (1.0f + fabsf(dense[j])));
        /* and a set missing an active neuron differs: the check above can fail */
        flm_ffn_bundles(k, &b, rec, rows + 1, n - 1, x, sub, h, acc, 1, NULL);
        double diff = 0;
        for (uint32_t j = 0; j < d; j++) diff += fabs((double)dense[j] - sub[j]);
        assert_true(diff > 1e-4);
        free(rec); free(row); free(x); free(dense); free(sub); free(h); free(acc); free(rows);
    }
}

/* ---- stories260K: calibrate on the first part of the sample, evaluate on the rest ----------------------------- */

static char flm_path[4096], eval_path[4096];
static char *calib_text;

static int setup(void **state) {
    (void)state;
    size_t len;
    char *text = (char *)tu_read_file(tu_data("text/tinystories_sample.txt"), &len);
    /* split at a story boundary about 60% in: calibration text / held-out text */
    char *cut = strstr(text + len * 6 / 10, "<|endoftext|>");
    if (!cut) return -1;
    *cut = 0;
    calib_text = text;
    snprintf(eval_path, sizeof eval_path, "%s", tu_tmp("heldout", ".txt"));
    const char *rest = cut + strlen("<|endoftext|>");
    tu_write_file(eval_path, rest, strlen(rest));
    snprintf(flm_path, sizeof flm_path, "%s", tu_tmp("stories-sparse", ".flm"));
    flm_error err;
    if (flm_convert(tu_data("models/stories260K/stories260K.gguf"), flm_path, NULL, NULL, &err)) return -1;
    flm_calib_opts o;
    flm_calib_opts_default(&o);
    o.text = calib_text;
    o.chunk = 64;
    o.n_threads = 1; /* stories260K is tiny: a second OpenMP thread only waits for the first under ctest -j load */
    flm_predictor_region rep;
    if (flm_calibrate(flm_path, &o, &rep, &err)) { fprintf(stderr, "calibrate: %s\n", err.msg); return -1; }
    for (uint32_t l = 0; l < rep.n_layers; l++)
        printf("layer %u: threshold %.4f, true active %.3f, predicted %.3f, recall %.3f, precision %.3f\n", l,
               (double)rep.layers[l].threshold, rep.layers[l].active_frac, rep.layers[l].pred_frac,
               rep.layers[l].recall, rep.layers[l].precision);
    flm_predictor_region_free(&rep);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(flm_path);
    remove(eval_path);
    free(calib_text);
    return 0;
}

/* Perplexity on the held-out text (chunks of 64; max_chunks 0: all) with p (n_threads 1, n_ctx 64 set here); s and
 * mi (may be NULL) receive the run's statistics and the model's shape. *open_st (may be NULL: then a failure fails
 * the test) receives flm_open's status; 0 is returned when it failed. */
static double held_out_ppl(flm_params p, int max_chunks, flm_status *open_st, flm_stats *s, flm_model_info *mi) {
    p.n_threads = 1;
    p.n_ctx = 64;
    flm_ctx *ctx = NULL;
    flm_error err;
    flm_status st = flm_open(flm_path, &p, &ctx, &err);
    if (open_st) *open_st = st;
    if (st && open_st) return 0;
    if (st) fail_msg("open %s: %s", flm_mode_name(p.mode), err.msg);
    size_t len;
    char *text = (char *)tu_read_file(eval_path, &len);
    flm_ppl_result r;
    if (flm_perplexity(ctx, text, 64, max_chunks, NULL, NULL, &r, &err)) fail_msg("perplexity: %s", err.msg);
    if (s) flm_get_stats(ctx, s);
    if (mi) flm_get_info(ctx, mi);
    free(text);
    flm_close(ctx);
    return r.ppl;
}

static double ppl_of(flm_mode mode, bool oracle, uint64_t *bytes_per_token) {
    flm_params p;
    flm_params_default(&p);
    p.mode = mode;
    p.no_predictor = oracle;
    p.window = 2; /* a short window: without a budget the whole (tiny) FFN would stay cached and nothing be read */
    flm_stats s;
    flm_ppl_result r;
    r.ppl = held_out_ppl(p, 0, NULL, &s, NULL);
    if (bytes_per_token) *bytes_per_token = s.n_tokens ? s.total.bytes_read / s.n_tokens : 0;
    printf("mode %-6s%s: perplexity %.4f; %llu bytes read per token\n", s.mode, oracle ? " (oracle)" : "", r.ppl,
           (unsigned long long)(s.n_tokens ? s.total.bytes_read / s.n_tokens : 0));
    return r.ppl;
}

static void test_sparse_quality_and_bytes(void **state) {
    (void)state;
    uint64_t b_naive = 0, b_sparse = 0;
    double dense = ppl_of(FLM_MODE_RAM, false, NULL);
    double naive = ppl_of(FLM_MODE_NAIVE, false, &b_naive);
    double oracle = ppl_of(FLM_MODE_SPARSE, true, NULL);
    double sparse = ppl_of(FLM_MODE_SPARSE, false, &b_sparse);
    assert_true(fabs(naive - dense) < 1e-6 * dense); /* naive is exact */
    /* Stated bounds (issue: sparse within +3% of dense at the default calibration, on held-out text). Measured:
     * dense 4.7142, oracle set 4.7369 (+0.5%), predictor 4.7787 (+1.4%), at the level calibrate chose by its own
     * held-out check (then --max-loss 1.5%; the default is now 1%). */
    assert_true(oracle <= dense * 1.03);
    assert_true(sparse <= dense * 1.03);
    assert_true(sparse >= dense * 0.97); /* not suspiciously better either */
    /* bytes per token well below naive's: the window reuses most neurons */
    assert_true(b_sparse * 4 < b_naive);
}

/* The quality curve (flashlm perplexity --curve) against the modes it stands for: its dense point is the ram mode's
 * perplexity, its predictor point is `--mode sparse --no-window` (the same sets: the share of neurons equals the
 * sparse mode's count of predicted neurons, and perplexity agrees to rounding), its oracle point is `--no-predictor`;
 * the oracle needs fewer neurons than the predictor at the same level, and a more aggressive level fewer still. */
static double sparse_stats_ppl(bool oracle, double *neuron_frac) {
    flm_params p;
    flm_params_default(&p);
    p.mode = FLM_MODE_SPARSE;
    p.no_window = true;
    p.no_predictor = oracle;
    flm_stats s;
    flm_model_info mi;
    double ppl = held_out_ppl(p, 0, NULL, &s, &mi);
    *neuron_frac = (double)s.total.n_predicted / ((double)s.n_tokens * mi.n_layers * mi.d_ffn);
    return ppl;
}

static void test_quality_curve(void **state) {
    (void)state;
    size_t len;
    char *text = (char *)tu_read_file(eval_path, &len);
    flm_curve_opts o;
    flm_curve_opts_default(&o);
    o.chunk = 64;
    o.n_threads = 1;
    flm_curve_point pts[1 + 2 * 8];
    uint32_t n = 0;
    flm_error err;
    if (flm_sparsity_curve(flm_path, text, &o, pts, 1 + 2 * 8, &n, &err)) fail_msg("curve: %s", err.msg);
    free(text);
    assert_true(n >= 5 && n % 2 == 1); /* dense + (predictor, oracle) per stored level */
    double dense = ppl_of(FLM_MODE_RAM, false, NULL);
    assert_true(fabs(pts[0].ppl / dense - 1) < 1e-9);
    assert_true(pts[0].neuron_frac == 1.0 && pts[0].bytes_per_token > 0);
    int def = -1;
    for (uint32_t j = 1; j < n; j += 2) {
        const flm_curve_point *q = &pts[j], *orc = &pts[j + 1];
        printf("eps %g: predictor %.1f%% %.4f, oracle %.1f%% %.4f (dense %.4f)\n", (double)q->eps,
               100 * q->neuron_frac, q->ppl, 100 * orc->neuron_frac, orc->ppl, pts[0].ppl);
        assert_false(q->oracle);
        assert_true(orc->oracle && orc->eps == q->eps);
        assert_true(orc->neuron_frac < q->neuron_frac);
        assert_true(fabs(q->bytes_per_token / pts[0].bytes_per_token - q->neuron_frac) < 1e-9);
        if (j > 1) assert_true(orc->neuron_frac < pts[j - 1].neuron_frac); /* eps ascending: fewer neurons */
        if (q->is_default) def = (int)j;
    }
    assert_true(def > 0);
    double frac, frac_o;
    double sp = sparse_stats_ppl(false, &frac), so = sparse_stats_ppl(true, &frac_o);
    assert_true(fabs(pts[def].neuron_frac - frac) < 1e-12);
    assert_true(fabs(pts[def + 1].neuron_frac - frac_o) < 1e-12);
    assert_true(fabs(pts[def].ppl / sp - 1) < 1e-4);
    assert_true(fabs(pts[def + 1].ppl / so - 1) < 1e-4);
    /* a level that is not stored is refused, naming it */
    float bad = 0.123f;
    o.levels = &bad;
    o.n_levels = 1;
    text = (char *)tu_read_file(eval_path, &len);
    assert_int_equal(flm_sparsity_curve(flm_path, text, &o, pts, 1 + 2 * 8, &n, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "0.123"));
    free(text);
    /* the CLI: the table and the chart; bad --levels and the flags without --curve are refused */
    char cmd[3 * 4096 + 256], eps[32];
    snprintf(eps, sizeof eps, "%g", (double)pts[def].eps);
    const char *svg = tu_tmp("curve", ".svg");
    snprintf(cmd, sizeof cmd, "perplexity -m '%s' -f '%s' -c 64 -t 1 --curve --levels %s --no-oracle --svg '%s' 2>&1",
             flm_path, eval_path, eps, svg);
    char *out = NULL;
    assert_int_equal(tu_run_cli(cmd, &out), 0);
    assert_non_null(strstr(out, "| dense | - | 100.0% |"));
    assert_non_null(strstr(out, "(default)"));
    assert_null(strstr(out, "| oracle |"));
    free(out);
    size_t sl;
    char *chart = (char *)tu_read_file(svg, &sl);
    assert_non_null(strstr(chart, "<svg"));
    assert_non_null(strstr(chart, "predictor"));
    free(chart);
    remove(svg);
    snprintf(cmd, sizeof cmd, "perplexity -m '%s' -f '%s' --curve --levels 0.001,abc 2>&1", flm_path, eval_path);
    assert_int_equal(tu_run_cli(cmd, &out), 2);
    assert_non_null(strstr(out, "bad --levels"));
    free(out);
    snprintf(cmd, sizeof cmd, "perplexity -m '%s' -f '%s' --no-oracle 2>&1", flm_path, eval_path);
    assert_int_equal(tu_run_cli(cmd, &out), 2);
    assert_non_null(strstr(out, "go with --curve"));
    free(out);
}

/* A set larger than the neuron cache is streamed, never dropped: under budgets that shrink the cache below a
 * token's set, sparse computes the same neurons as without a budget (same perplexity to rounding), reading more. */
static double sparse_ppl_budget2(uint64_t mem, bool no_read_ahead, flm_status *open_st, uint64_t *streamed,
                                 uint64_t *cache_rows) {
    flm_params p;
    flm_params_default(&p);
    p.no_read_ahead = no_read_ahead;
    p.mode = FLM_MODE_SPARSE;
    p.window = 1;
    p.mem_bytes = mem;
    flm_stats s;
    double ppl = held_out_ppl(p, 2, open_st, &s, NULL);
    if (*open_st) return 0;
    *streamed = s.n_streamed;
    *cache_rows = s.cache_rows;
    assert_true(s.peak_rss > 0);
    return ppl;
}

static double sparse_ppl_budget(uint64_t mem, flm_status *open_st, uint64_t *streamed, uint64_t *cache_rows) {
    return sparse_ppl_budget2(mem, false, open_st, streamed, cache_rows);
}

static void test_sparse_streams_past_small_cache(void **state) {
    (void)state;
    flm_status st;
    uint64_t streamed = 0, rows = 0, min_rows = UINT64_MAX, max_streamed = 0, min_mem = 0;
    double ref = sparse_ppl_budget(0, &st, &streamed, &rows);
    assert_int_equal(st, FLM_OK);
    assert_int_equal(streamed, 0);
    int runs = 0;
    for (uint64_t mem = 4u << 20; mem >= (256u << 10); mem -= 64u << 10) {
        double ppl = sparse_ppl_budget(mem, &st, &streamed, &rows);
        if (st == FLM_ERR_BUDGET) break; /* no room for the predictors and one neuron per layer */
        assert_int_equal(st, FLM_OK);
        runs++;
        assert_true(fabs(ppl - ref) <= 1e-4 * ref);
        if (rows < min_rows) { min_rows = rows; max_streamed = streamed; min_mem = mem; }
    }
    printf("streaming: %d budgets ran; the smallest cache (%llu rows over all layers) streamed %llu neurons; "
           "perplexity %.5f as without a budget\n", runs, (unsigned long long)min_rows,
           (unsigned long long)max_streamed, ref);
    assert_true(runs > 0);
    assert_true(max_streamed > 0); /* the smallest caches were below a token's set */
    /* the streamed chunks read while the previous one is computed, or read in turn (--no-read-ahead): the same
     * neurons, the same perplexity to rounding (chunks summed in groups of 128 or 256) */
    uint64_t s2 = 0, r2 = 0;
    double a = sparse_ppl_budget2(min_mem, false, &st, &streamed, &rows);
    double b = sparse_ppl_budget2(min_mem, true, &st, &s2, &r2);
    assert_int_equal(st, FLM_OK);
    assert_int_equal(streamed, s2);
    assert_true(streamed > 0);
    printf("smallest budget: perplexity %.7f with read-ahead, %.7f without\n", a, b);
    assert_true(fabs(a - b) <= 1e-4 * b); /* as every budget above against none (the f16 KV cache amplifies) */
}

/* Two calibrations of one file: the second is refused at once while the first holds the file (issue 12 #4). */
static void test_calibrate_lock(void **state) {
    (void)state;
    int fd = open(flm_path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0); /* as a running calibrate holds it */
    flm_calib_opts o;
    flm_calib_opts_default(&o);
    o.text = calib_text;
    o.chunk = 64;
    o.level = 0.01f;
    flm_error err;
    assert_int_equal(flm_calibrate(flm_path, &o, NULL, &err), FLM_ERR_IO);
    assert_non_null(strstr(err.msg, "another `flashlm calibrate`"));
    assert_non_null(strstr(err.msg, flm_path));
    close(fd); /* released: the file is still the calibrated one and opens sparse */
    flm_params p;
    flm_params_default(&p);
    p.n_ctx = 64;
    p.mode = FLM_MODE_SPARSE;
    flm_ctx *ctx = NULL;
    assert_int_equal(flm_open(flm_path, &p, &ctx, &err), FLM_OK);
    flm_close(ctx);
}

/* An uncalibrated .flm says how to calibrate; auto picks sparse under a budget when calibrated. */
static void test_uncalibrated_and_auto(void **state) {
    (void)state;
    const char *plain = tu_tmp("plain", ".flm");
    flm_error err;
    assert_int_equal(flm_convert(tu_data("models/stories260K/stories260K.gguf"), plain, NULL, NULL, &err), FLM_OK);
    flm_params p;
    flm_params_default(&p);
    p.n_ctx = 64;
    p.mode = FLM_MODE_SPARSE;
    flm_ctx *ctx = NULL;
    assert_int_not_equal(flm_open(plain, &p, &ctx, &err), FLM_OK);
    assert_non_null(strstr(err.msg, "flashlm calibrate"));
    remove(plain);
    /* stories260K is too small and too dense for the neuron cache to fit below its own size (its predictors and one
     * token's 80% active set cost more than the FFN saved): auto then falls back to hybrid, and says so */
    p.mode = FLM_MODE_AUTO;
    p.mem_bytes = 1000 * 1024; /* below the 1.02 MiB model */
    assert_int_equal(flm_open(flm_path, &p, &ctx, &err), FLM_OK);
    flm_stats s;
    flm_get_stats(ctx, &s);
    assert_string_equal(s.mode, "hybrid");
    flm_close(ctx);
    /* with room, auto picks ram; asked for explicitly, sparse runs with its statistics */
    p.mem_bytes = 0;
    p.mode = FLM_MODE_SPARSE;
    assert_int_equal(flm_open(flm_path, &p, &ctx, &err), FLM_OK);
    const float *logits;
    assert_int_equal(flm_eval(ctx, 1, 0, &logits, &err), FLM_OK);
    flm_get_stats(ctx, &s);
    assert_string_equal(s.mode, "sparse");
    assert_true(s.total.n_predicted > 0 && s.total.n_loaded == s.total.n_predicted); /* first token: all read */
    flm_close(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sparse_ffn_equals_dense),
        cmocka_unit_test(test_sparse_quality_and_bytes),
        cmocka_unit_test(test_quality_curve),
        cmocka_unit_test(test_sparse_streams_past_small_cache),
        cmocka_unit_test(test_calibrate_lock),
        cmocka_unit_test(test_uncalibrated_and_auto),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
