/* test_real_embd.c — the token embedding on flash on a real model whose classifier is not tied to it
 * (Qwen2.5-Coder-0.5B: a q5_0 token_embd of 89 MiB beside a q8_0 output.weight): converted, opened naive, it leaves
 * the embedding in the file and gives ram mode's logits bit for bit, reading one 616-byte row's aligned span per
 * token; its plan holds the embedding's bytes less, and at --mem 50% -c 2048 hybrid plans with the f16 KV cache.
 * Skipped when the model is not pulled, unless FLASHLM_REQUIRE_MODELS=1 (CI). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"
#include "core/util.h"
#include "format/flm.h"
#include "io/reader.h"
#include "runtime/runtime.h"
#include "testutil.h"

#define N_GEN 4

static const char *flm_path; /* the converted model, made once in setup */

static int setup(void **state) {
    (void)state;
    flm_path = tu_convert_pulled("qwen2.5-coder-0.5b", "qwen05"); /* NULL: not pulled, the tests skip */
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (flm_path) remove(flm_path);
    return 0;
}

static flm_ctx *open_ctx(flm_mode mode, double mem_percent, int n_ctx) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = n_ctx;
    p.mode = mode;
    p.mem_percent = mem_percent;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(flm_path, &p, &ctx, &err)) fail_msg("flm_open %s: %s", flm_path, err.msg);
    return ctx;
}

/* The prompt, then N_GEN greedy tokens of ref (ref NULL: of this run, written to ids); all logits into out. */
static size_t run(flm_ctx *ctx, int32_t *ids, const int32_t *ref, float *out, uint32_t V) {
    int32_t prompt[32];
    size_t n = flm_tokenize(ctx, "def fibonacci(n):", false, prompt, 32);
    assert_true(n > 0 && n < 32);
    const float *logits = NULL;
    flm_error err;
    size_t pos = 0;
    for (; pos < n; pos++) {
        if (flm_eval(ctx, prompt[pos], (int32_t)pos, &logits, &err)) fail_msg("eval: %s", err.msg);
        memcpy(out + pos * V, logits, V * sizeof(float));
    }
    for (int s = 0; s < N_GEN; s++, pos++) {
        int32_t next = 0;
        for (uint32_t i = 1; i < V; i++)
            if (logits[i] > logits[next]) next = (int32_t)i;
        ids[s] = ref ? ref[s] : next;
        if (flm_eval(ctx, ids[s], (int32_t)pos, &logits, &err)) fail_msg("eval: %s", err.msg);
        memcpy(out + pos * V, logits, V * sizeof(float));
    }
    return pos;
}

static void test_naive_matches_ram(void **state) {
    (void)state;
    if (!flm_path) { skip(); return; }
    flm_ctx *ram = open_ctx(FLM_MODE_RAM, 0, 64), *naive = open_ctx(FLM_MODE_NAIVE, 0, 64);
    flm_model_info info;
    flm_get_info(ram, &info);
    const uint32_t V = info.n_vocab;
    float *want = malloc((size_t)64 * V * sizeof(float)), *got = malloc((size_t)64 * V * sizeof(float));
    int32_t ids[N_GEN], ids2[N_GEN];
    size_t n = run(ram, ids, NULL, want, V);
    assert_int_equal(run(naive, ids2, ids, got, V), n);
    assert_memory_equal(got, want, n * V * sizeof(float)); /* bit for bit */
    const flm_flash *fl = naive->flash;
    assert_int_equal(fl->plan.embd, FLM_EMBD_FLASH);
    assert_null(naive->model->tok_embd.data);
    flm_stats sr, sn;
    flm_get_stats(ram, &sr);
    flm_get_stats(naive, &sn);
    uint64_t tail = flm_file_tail_bytes(fl->file);
    printf("Qwen2.5-Coder-0.5B: resident %.2f MiB in ram mode, %.2f MiB naive (token embedding %.2f MiB on flash, "
           "rows of %llu bytes)\n", sr.mem_resident / 1048576.0, sn.mem_resident / 1048576.0, tail / 1048576.0,
           (unsigned long long)fl->plan.embd_row);
    assert_true(tail >= 93592576); /* the q5_0 embedding: 151936 rows of 616 bytes */
    assert_int_equal(fl->plan.embd_row, 616);
    assert_int_equal(sn.mem_embd_flash, tail);
    assert_int_equal(sn.mem_resident, sr.mem_resident - tail);
    /* each token: every layer's region and the row's aligned span */
    uint64_t layers = 0, align = flm_reader_align(fl->reader);
    for (uint32_t l = 0; l < fl->file->n_layers; l++) layers += flm_align_up(fl->file->ffn[l]->size, FLM_ALIGN);
    for (size_t t = 0; t < n; t++) {
        flm_token_stats ts;
        assert_true(flm_get_token_stats(naive, t, &ts));
        assert_true(ts.bytes_read == layers + align || ts.bytes_read == layers + 2 * align);
    }
    free(want);
    free(got);
    flm_close(ram);
    flm_close(naive);
}

/* --mem 50% -c 2048 hybrid: an f16 KV cache of 24 MiB, the embedding on flash, everything within the budget. */
static void test_half_budget_plan(void **state) {
    (void)state;
    if (!flm_path) { skip(); return; }
    flm_ctx *ctx = open_ctx(FLM_MODE_HYBRID, 50, 2048);
    const flm_mem_plan *p = &ctx->flash->plan;
    printf("--mem 50%% -c 2048 hybrid: budget %.2f MiB: resident %.2f MiB, KV %.2f MiB, %u of %u layers resident, "
           "planned %.2f MiB\n", p->budget / 1048576.0, p->resident / 1048576.0, p->kv / 1048576.0,
           p->n_resident_layers, ctx->model->hp.n_layers, flm_mem_plan_total(p) / 1048576.0);
    assert_int_equal(p->kv, 24ull << 20); /* 2 x 24 layers x 2048 x 128 x 2 bytes */
    assert_int_equal(p->embd, FLM_EMBD_FLASH);
    assert_int_equal(p->resident, ctx->flash->file->resident->head_bytes);
    assert_true(flm_mem_plan_total(p) <= p->budget);
    /* what it spends the FFN storage on: the two layer buffers of read-ahead (docs/ARCHITECTURE.md: they beat
     * keeping a layer resident), and layers when more fits */
    assert_int_equal(p->n_stream_buffers, 2);
    flm_close(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_naive_matches_ram),
        cmocka_unit_test(test_half_budget_plan),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
