/* test_real_models.c — real GGUF models (pulled by `flashlm pull`) against llama.cpp's outputs in
 * ../shared/reference/<model>/:
 *   - greedy continuation: the first N_GREEDY generated tokens decode to a prefix of llama.cpp's completion;
 *   - perplexity on wiki.test.raw (-c 512, llama.cpp's chunking) within 1% of llama.cpp's running value after the
 *     same number of chunks (a few chunks here, to keep the suite short; the closing note gives all 16).
 * A model that is not pulled is skipped, unless FLASHLM_REQUIRE_MODELS=1 (CI pulls them first). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "flashlm.h"
#include "testutil.h"

#define N_GREEDY 16

typedef struct real_model {
    const char *name; /* flashlm pull name */
    const char *ref;  /* folder under ../shared/reference */
    int ppl_chunks;   /* chunks of 512 tokens to score in the test */
} real_model;

static const real_model SMOLLM2 = {"smollm2-135m", "smollm2-135m-instruct-q4_1", 3};
static const real_model QWEN05 = {"qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct", 1};
static const real_model GEMMA3 = {"gemma-3-270m", "gemma-3-270m-q4_k_m", 1};

static flm_ctx *open_ctx(const char *path, int n_ctx) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = n_ctx;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(path, &p, &ctx, &err)) fail_msg("flm_open %s: %s", path, err.msg);
    return ctx;
}

static int32_t argmax(const float *v, uint32_t n) {
    int32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = (int32_t)i;
    return best;
}

/* Greedy continuation of every prompt of greedy.jsonl from its reference prompt ids. */
static void check_greedy(const real_model *rm) {
    const char *path = tu_model(rm->name);
    if (!path) { skip(); return; }
    flm_ctx *ctx = open_ctx(path, 512);
    flm_model_info info;
    flm_get_info(ctx, &info);
    char rel[256];
    snprintf(rel, sizeof rel, "reference/%s/greedy.jsonl", rm->ref);
    size_t len;
    char *data = (char *)tu_read_file(tu_shared(rel), &len);
    int n_cases = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const cJSON *ids = cJSON_GetObjectItem(j, "ids_prompt");
        const char *completion = cJSON_GetStringValue(cJSON_GetObjectItem(j, "completion"));
        assert_true(cJSON_IsArray(ids) && completion);
        int n_prompt = cJSON_GetArraySize(ids);
        assert_true(n_prompt > 0);
        int32_t tok = 0, prev = -1;
        const float *logits = NULL;
        flm_error err;
        for (int i = 0; i < n_prompt; i++) {
            tok = (int32_t)cJSON_GetArrayItem(ids, i)->valuedouble;
            if (flm_eval(ctx, tok, i, &logits, &err)) fail_msg("eval: %s", err.msg);
        }
        char text[4096];
        size_t tl = 0;
        for (int g = 0; g < N_GREEDY; g++) {
            int32_t next = argmax(logits, info.n_vocab);
            prev = tok;
            size_t n;
            const char *piece = flm_token_piece(ctx, prev, next, &n);
            assert_true(tl + n < sizeof text);
            memcpy(text + tl, piece, n);
            tl += n;
            tok = next;
            if (flm_eval(ctx, tok, n_prompt + g, &logits, &err)) fail_msg("eval: %s", err.msg);
        }
        text[tl] = 0;
        if (strncmp(completion, text, tl) != 0)
            fail_msg("%s: prompt %d: flashlm's %d greedy tokens\n[%s]\nare not a prefix of llama.cpp's\n[%s]", rm->name,
                     n_cases, N_GREEDY, text, completion);
        n_cases++;
        cJSON_Delete(j);
    }
    assert_true(n_cases >= 1);
    free(data);
    flm_close(ctx);
}

static void check_perplexity(const real_model *rm) {
    const char *path = tu_model(rm->name);
    if (!path) { skip(); return; }
    char rel[256];
    snprintf(rel, sizeof rel, "reference/%s/perplexity.json", rm->ref);
    size_t len;
    char *js = (char *)tu_read_file(tu_shared(rel), &len);
    cJSON *j = cJSON_ParseWithLength(js, len);
    assert_non_null(j);
    const cJSON *run = cJSON_GetObjectItem(j, "running_ppl_per_chunk");
    assert_true(cJSON_GetArraySize(run) >= rm->ppl_chunks);
    double want = cJSON_GetArrayItem(run, rm->ppl_chunks - 1)->valuedouble;
    char *text = (char *)tu_read_file(tu_shared("text/wiki.test.raw"), &len);
    char *t = malloc(len + 1);
    memcpy(t, text, len);
    t[len] = 0;
    flm_ctx *ctx = open_ctx(path, 512);
    flm_ppl_result r;
    flm_error err;
    if (flm_perplexity(ctx, t, 512, rm->ppl_chunks, NULL, NULL, &r, &err)) fail_msg("perplexity: %s", err.msg);
    print_message("%s: perplexity after %d chunks %.4f, llama.cpp %.4f (%+.2f%%)\n", rm->name, rm->ppl_chunks, r.ppl,
                  want, 100.0 * (r.ppl / want - 1.0));
    assert_int_equal(r.n_chunks, rm->ppl_chunks);
    assert_true(fabs(r.ppl / want - 1.0) < 0.01);
    flm_close(ctx);
    free(t);
    free(text);
    free(js);
    cJSON_Delete(j);
}

static void test_smollm2_greedy(void **state) { (void)state; check_greedy(&SMOLLM2); }
static void test_smollm2_perplexity(void **state) { (void)state; check_perplexity(&SMOLLM2); }
static void test_qwen05_greedy(void **state) { (void)state; check_greedy(&QWEN05); }
static void test_qwen05_perplexity(void **state) { (void)state; check_perplexity(&QWEN05); }
static void test_gemma3_greedy(void **state) { (void)state; check_greedy(&GEMMA3); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2_greedy),
        cmocka_unit_test(test_smollm2_perplexity),
        cmocka_unit_test(test_qwen05_greedy),
        cmocka_unit_test(test_qwen05_perplexity),
        cmocka_unit_test(test_gemma3_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
