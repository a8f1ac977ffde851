/* test_hot_window.c — the self-draft's window in mode hot (runtime/ffn_hot.c, flm_params.draft_window):
 *   - the plan gives the window its share of the hot FFN memory and counts it (flm_plan_info.window, inside
 *     ffn_resident; the total still within the budget, and what flm_get_stats reports);
 *   - with the window on, the target's logits are still ram mode's bit for bit, token by token and in batches;
 *   - after target passes every layer's window is consistent: at most its capacity, distinct streamed neurons, and
 *     each record equal to the file's record of that neuron;
 *   - the window changes the draft: a draft of position 0 differs before and after target passes filled the window,
 *     while without a window it does not;
 *   - the draft's correction: after target passes (a batch longer than FLM_HOT_CORRECTION_ROWS, then single tokens)
 *     each layer's is the decayed mean (rows weighted d^age, divided by the weights' sum), over the passes' last
 *     rows, of the exact FFN output less the FFN over the draft's neurons (the prefix and the window as each pass
 *     left it), recomputed here from the FFN inputs (tapped in ram mode) with flm_ffn_bundles over the file's
 *     records; a draft pass leaves it alone.
 * stories260K from tests/data (its records in file order: the hot mode runs any .flm). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "runtime/hooks.h"
#include "runtime/runtime.h"
#include "testutil.h"

#define MODEL "models/stories260K/stories260K.gguf"
#define N_CTX 128
#define WINDOW 0.4

static char g_flm[4096];
static int g_batch; /* flm_params.n_batch of params_for (0: the default) */

static int setup(void **state) {
    (void)state;
    snprintf(g_flm, sizeof g_flm, "%s", tu_tmp("hot-window", ".flm"));
    flm_error err;
    if (flm_convert(tu_data(MODEL), g_flm, NULL, NULL, &err)) {
        fprintf(stderr, "convert: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(g_flm);
    return 0;
}

static void params_for(flm_params *p, flm_mode mode, uint64_t mem, double window) {
    flm_params_default(p);
    p->n_threads = 2;
    p->n_ctx = N_CTX;
    p->mode = mode;
    p->mem_bytes = mem;
    p->draft_window = window;
    if (g_batch) p->n_batch = g_batch;
}

static flm_ctx *open_mode(flm_mode mode, uint64_t mem, double window) {
    flm_params p;
    params_for(&p, mode, mem, window);
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(g_flm, &p, &ctx, &err)) fail_msg("open (%s): %s", flm_mode_name(mode), err.msg);
    return ctx;
}

/* A budget at which the hot mode with the window keeps between lo and hi of every layer (prefix and window). */
static uint64_t budget_for(double lo, double hi) {
    for (uint64_t mem = 256 << 10; mem < (1ull << 30); mem += mem / 32) {
        flm_params p;
        params_for(&p, FLM_MODE_HOT, mem, WINDOW);
        flm_plan_info pi;
        flm_error err;
        if (flm_plan(g_flm, &p, &pi, &err)) continue;
        double s = pi.hot_share + pi.window_share;
        if (s >= lo && s <= hi && pi.window) return mem;
        if (s > hi) break;
    }
    fail_msg("no budget gives a hot share in [%.2f, %.2f]", lo, hi);
    return 0;
}


static int32_t *prompt_ids(flm_ctx *ctx, int *n) {
    size_t m = 0;
    int32_t *ids = flm_tokenize_all(ctx, "Once upon a time, there was a little dog. He liked to run in the park "
                                    "with his ball and his friend the cat.", true, &m);
    assert_non_null(ids);
    *n = (int)m;
    return ids;
}


static void test_plan_counts_window(void **state) {
    (void)state;
    uint64_t mem = budget_for(0.3, 0.7);
    flm_params p;
    params_for(&p, FLM_MODE_HOT, mem, WINDOW);
    flm_plan_info pi, none;
    flm_error err;
    assert_int_equal(flm_plan(g_flm, &p, &pi, &err), FLM_OK);
    print_message("budget %llu: hot %.1f%% + window %.1f%% (%llu bytes), FFN %llu + %llu, total %llu\n",
                  (unsigned long long)mem, 100 * pi.hot_share, 100 * pi.window_share, (unsigned long long)pi.window,
                  (unsigned long long)pi.ffn_resident, (unsigned long long)pi.stream, (unsigned long long)pi.total);
    assert_true(pi.window > 0 && pi.window <= pi.ffn_resident);
    assert_true(pi.window_share > 0.0);
    assert_true(fabs(pi.window_share / (pi.hot_share + pi.window_share) - WINDOW) < 0.01);
    assert_true(pi.total <= mem);
    /* without a window the same budget keeps about as many neurons, all as the prefix */
    p.draft_window = 0;
    assert_int_equal(flm_plan(g_flm, &p, &none, &err), FLM_OK);
    assert_int_equal(none.window, 0);
    assert_true(none.window_share == 0.0);
    assert_true(none.hot_share > pi.hot_share);
    /* open carries out the plan: the same bytes */
    flm_ctx *ctx = open_mode(FLM_MODE_HOT, mem, WINDOW);
    flm_plan_info got;
    flm_get_plan(ctx, &got);
    assert_int_equal(got.window, pi.window);
    flm_stats st;
    flm_get_stats(ctx, &st);
    assert_int_equal(st.mem_resident + st.mem_ffn + st.mem_kv + st.mem_scratch, got.total);
    flm_close(ctx);
    /* nothing streams (no budget): no window */
    params_for(&p, FLM_MODE_HOT, 0, WINDOW);
    assert_int_equal(flm_plan(g_flm, &p, &none, &err), FLM_OK);
    assert_int_equal(none.window, 0);
}

/* every layer's window: at most its capacity, distinct streamed neurons, records equal the file's */
static void check_windows(flm_ctx *hot, flm_ctx *ram, uint32_t *filled) {
    flm_model_info info;
    flm_get_info(hot, &info);
    uint32_t *idx = malloc(info.d_ffn * sizeof *idx);
    uint8_t *seen = calloc(info.d_ffn, 1);
    *filled = 0;
    for (uint32_t l = 0; l < info.n_layers; l++) {
        uint32_t n;
        const uint8_t *rec;
        assert_true(flm_hot_window(hot, l, &n, idx, &rec));
        const flm_bundle_desc *d;
        const uint8_t *all = flm_ffn_resident_records(ram, l, &d);
        assert_non_null(all);
        memset(seen, 0, info.d_ffn);
        for (uint32_t s = 0; s < n; s++) {
            assert_true(idx[s] < info.d_ffn);
            assert_false(seen[idx[s]]);
            seen[idx[s]] = 1;
            assert_memory_equal(rec + (size_t)s * d->record_bytes, all + (size_t)idx[s] * d->record_bytes,
                                d->record_bytes);
        }
        *filled += n;
    }
    free(idx);
    free(seen);
}

static void test_window_exact_and_consistent(void **state) {
    (void)state;
    uint64_t mem = budget_for(0.3, 0.7);
    flm_ctx *ram = open_mode(FLM_MODE_RAM, 0, 0);
    int n;
    int32_t *ids = prompt_ids(ram, &n);
    assert_true(n >= 16);
    const uint32_t V = tu_vocab(ram);
    float *want = tu_logits(ram, ids, n, false);
    for (int batch = 0; batch < 2; batch++) {
        flm_ctx *hot = open_mode(FLM_MODE_HOT, mem, WINDOW);
        assert_true(flm_has_self_draft(hot));
        uint32_t filled;
        check_windows(hot, ram, &filled);
        assert_int_equal(filled, 0); /* empty until a target pass */
        float *got = tu_logits(hot, ids, n, batch);
        assert_memory_equal(got, want, (size_t)n * V * sizeof(float));
        check_windows(hot, ram, &filled);
        print_message("%s: logits equal ram's; %u window records after %d tokens\n",
                      batch ? "one batch" : "token by token", filled, n);
        assert_true(filled > 0);
        /* drafts in between leave the target exact and the windows consistent */
        const float *lg;
        flm_error err;
        if (flm_eval_draft(hot, ids[n - 1], n - 1, &lg, &err)) fail_msg("draft: %s", err.msg);
        if (flm_eval(hot, ids[n - 1], n - 1, &lg, &err)) fail_msg("eval: %s", err.msg);
        assert_memory_equal(lg, want + (size_t)(n - 1) * V, V * sizeof(float));
        check_windows(hot, ram, &filled);
        free(got);
        flm_close(hot);
    }
    free(want);
    free(ids);
    flm_close(ram);
}

/* The draft of position 0 (it attends to itself only) before and after target passes: with a window they differ
 * (the passes filled it), without one they are equal. */
static void test_window_changes_draft(void **state) {
    (void)state;
    uint64_t mem = budget_for(0.3, 0.7);
    for (int w = 0; w < 2; w++) {
        flm_ctx *hot = open_mode(FLM_MODE_HOT, mem, w ? WINDOW : 0.0);
        int n;
        int32_t *ids = prompt_ids(hot, &n);
        const uint32_t V = tu_vocab(hot);
        float *before = malloc(V * sizeof(float));
        const float *lg;
        flm_error err;
        if (flm_eval_draft(hot, ids[0], 0, &lg, &err)) fail_msg("draft: %s", err.msg);
        memcpy(before, lg, V * sizeof(float));
        if (flm_eval_batch(hot, ids, (uint32_t)n, 0, NULL, &lg, &err)) fail_msg("batch: %s", err.msg);
        if (flm_eval_draft(hot, ids[0], 0, &lg, &err)) fail_msg("draft: %s", err.msg);
        double diff = 0;
        for (uint32_t v = 0; v < V; v++) diff = fmax(diff, fabs((double)lg[v] - before[v]));
        print_message("window %s: draft logits of position 0 change by %g after the prompt's target pass\n",
                      w ? "on" : "off", diff);
        if (w) assert_true(diff > 1e-4);
        else assert_memory_equal(lg, before, V * sizeof(float));
        free(before);
        free(ids);
        flm_close(hot);
    }
}

/* The FFN inputs of a pass, tapped: x[t][l] (d_model floats), t counted per layer. */
typedef struct {
    float *x;
    uint32_t n_layers, d_model, n_tok, seen[64];
} tap_rec;

static void tap_fn(void *user, uint32_t layer, const float *x) {
    tap_rec *r = user;
    assert_true(layer < r->n_layers && r->seen[layer] < r->n_tok);
    memcpy(r->x + ((size_t)r->seen[layer]++ * r->n_layers + layer) * r->d_model, x, r->d_model * sizeof(float));
}

/* The correction's reference after a target pass whose FFN inputs are rows [t0, t1) of tap, with the draft's neurons
 * of each layer as hot now holds them (prefix and window): the decayed sums of the differences (sum[l], d_model
 * floats) and of their weights (w[l]), each row's weight 1 - d and every older row's times d; want[l] = sum[l] / w[l],
 * the mean the runtime keeps incrementally. */
static void correction_step(flm_ctx *hot, flm_ctx *ram, const tap_rec *tap, uint32_t t0, uint32_t t1, double *sum,
                            double *w, float *want) {
    const uint32_t L = tap->n_layers, D = tap->d_model;
    const flm_kernels *k = flm_ctx_kernels(ram);
    flm_model_info info;
    flm_get_info(hot, &info);
    uint32_t *rows = malloc(info.d_ffn * sizeof *rows);
    float *full = malloc(D * sizeof(float)), *sub = malloc(D * sizeof(float));
    float *h = malloc(info.d_ffn * sizeof(float)), *acc = malloc(D * sizeof(float));
    if (t1 - t0 > FLM_HOT_CORRECTION_ROWS) t0 = t1 - FLM_HOT_CORRECTION_ROWS;
    for (uint32_t l = 0; l < L; l++) {
        uint32_t n_hot, n_win;
        const uint8_t *rec;
        if (!flm_hot_correction(hot, l, &n_hot)) continue;
        assert_true(flm_hot_window(hot, l, &n_win, rows + n_hot, &rec));
        for (uint32_t i = 0; i < n_hot; i++) rows[i] = i;
        const flm_bundle_desc *d;
        const uint8_t *all = flm_ffn_resident_records(ram, l, &d);
        assert_non_null(all);
        for (uint32_t t = t0; t < t1; t++) {
            const float *x = tap->x + ((size_t)t * L + l) * D;
            flm_ffn_bundles(k, d, all, NULL, info.d_ffn, x, full, h, acc, 1, NULL);
            flm_ffn_bundles(k, d, all, rows, n_hot + n_win, x, sub, h, acc, 1, NULL);
            const double dk = FLM_HOT_CORRECTION_DECAY;
            for (uint32_t i = 0; i < D; i++)
                sum[(size_t)l * D + i] = dk * sum[(size_t)l * D + i] + (1.0 - dk) * ((double)full[i] - sub[i]);
            w[l] = dk * w[l] + (1.0 - dk);
        }
        for (uint32_t i = 0; i < D && w[l] > 0; i++) want[(size_t)l * D + i] = (float)(sum[(size_t)l * D + i] / w[l]);
    }
    free(rows);
    free(full);
    free(sub);
    free(h);
    free(acc);
}

/* every layer with a window: its correction equals want to float rounding (the batch kernels sum in another order) */
static void check_corrections(flm_ctx *hot, const float *want, uint32_t L, uint32_t D, const char *when) {
    double far = 0, size = 0;
    uint32_t n = 0;
    for (uint32_t l = 0; l < L; l++) {
        const float *c = flm_hot_correction(hot, l, NULL);
        if (!c) continue;
        n++;
        for (uint32_t i = 0; i < D; i++) {
            far = fmax(far, fabs((double)c[i] - want[(size_t)l * D + i]));
            size = fmax(size, fabs((double)want[(size_t)l * D + i]));
        }
    }
    print_message("%s: %u layers' corrections, largest %g, largest difference from the reference %g\n", when, n,
                  size, far);
    assert_true(n > 0);
    assert_true(size > 1e-3);
    assert_true(far <= 1e-4 * size + 1e-7);
}

static void test_draft_correction(void **state) {
    (void)state;
    flm_ctx *ram = open_mode(FLM_MODE_RAM, 0, 0);
    g_batch = 2 * FLM_HOT_CORRECTION_ROWS; /* a pass of more rows than are measured */
    flm_ctx *hot = open_mode(FLM_MODE_HOT, budget_for(0.3, 0.7), WINDOW);
    g_batch = 0;
    flm_error err;
    flm_model_info info;
    flm_get_info(ram, &info);
    const uint32_t L = info.n_layers, D = info.d_model;
    int n;
    int32_t *ids = prompt_ids(ram, &n);
    assert_true(n > FLM_HOT_CORRECTION_ROWS + 3 && L <= 64);
    const int n_batch = n - 3; /* one batch longer than the rows measured, then three tokens one at a time */
    tap_rec tap = {malloc((size_t)n * L * D * sizeof(float)), L, D, (uint32_t)n, {0}};
    flm_ffn_hooks hk = {.tap = tap_fn, .tap_user = &tap};
    const float *lg;
    if (flm_eval_hooked(ram, ids, (uint32_t)n, 0, &hk, NULL, &lg, &err)) fail_msg("ram: %s", err.msg);
    float *want = calloc((size_t)L * D, sizeof(float));
    double *sum = calloc((size_t)L * D, sizeof(double)), w[64] = {0};
    for (uint32_t l = 0; l < L; l++) {
        const float *c = flm_hot_correction(hot, l, NULL);
        if (c)
            for (uint32_t i = 0; i < D; i++) assert_true(c[i] == 0.0f); /* none before a target pass */
    }
    /* the plan's batch: a longer one runs as passes of that many rows, each a target pass of its own */
    flm_plan_info pi;
    flm_get_plan(hot, &pi);
    print_message("batches of %u rows, hot %.1f%% + window %.1f%%\n", pi.n_batch, 100 * pi.hot_share,
                  100 * pi.window_share);
    assert_true(pi.n_batch > FLM_HOT_CORRECTION_ROWS && pi.window > 0);
    for (int t = 0; t < n_batch; t += (int)pi.n_batch) {
        const int m = n_batch - t < (int)pi.n_batch ? n_batch - t : (int)pi.n_batch;
        if (flm_eval_batch(hot, ids + t, (uint32_t)m, t, NULL, &lg, &err)) fail_msg("batch: %s", err.msg);
        correction_step(hot, ram, &tap, (uint32_t)t, (uint32_t)(t + m), sum, w, want);
    }
    check_corrections(hot, want, L, D, "after a batch");
    for (int t = n_batch; t < n; t++) {
        if (flm_eval_draft(hot, ids[t], t, &lg, &err)) fail_msg("draft: %s", err.msg); /* changes nothing */
        if (flm_eval(hot, ids[t], t, &lg, &err)) fail_msg("eval: %s", err.msg);
        correction_step(hot, ram, &tap, (uint32_t)t, (uint32_t)t + 1, sum, w, want);
    }
    check_corrections(hot, want, L, D, "after single tokens");
    free(want);
    free(sum);
    free(tap.x);
    free(ids);
    flm_close(hot);
    flm_close(ram);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_counts_window),
        cmocka_unit_test(test_window_exact_and_consistent),
        cmocka_unit_test(test_window_changes_draft),
        cmocka_unit_test(test_draft_correction),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
