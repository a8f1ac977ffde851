/* test_hot_window.c — the self-draft's window in mode hot (runtime/ffn_hot.c, flm_params.draft_window):
 *   - the plan gives the window its share of the hot FFN memory and counts it (flm_plan_info.window, inside
 *     ffn_resident; the total still within the budget, and what flm_get_stats reports);
 *   - with the window on, the target's logits are still ram mode's bit for bit, token by token and in batches;
 *   - after target passes every layer's window is consistent: at most its capacity, distinct streamed neurons, and
 *     each record equal to the file's record of that neuron;
 *   - the window changes the draft: a draft of position 0 differs before and after target passes filled the window,
 *     while without a window it does not.
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_counts_window),
        cmocka_unit_test(test_window_exact_and_consistent),
        cmocka_unit_test(test_window_changes_draft),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
