/* test_real_models.c — real GGUF models (pulled by `flashlm pull`) against llama.cpp's outputs in
 * tests/data/reference/<model>/:
 *   - greedy continuation: the first N_GREEDY generated tokens decode to a prefix of llama.cpp's completion, or
 *     diverge from it only at a near-tie (the token continuing llama.cpp's text within NEAR_TIE logits of ours);
 *   - perplexity on wiki.test.raw (-c 512, llama.cpp's chunking) within 1% of llama.cpp's running value after the
 *     same number of chunks (a few chunks here, to keep the suite short; the closing note gives all 16).
 * A model that is not pulled is skipped, unless FLASHLM_REQUIRE_MODELS=1 (CI pulls them first). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "flashlm.h"
#include "testutil.h"

#define N_GREEDY 16
#define NEAR_TIE 0.5f /* logits: how far apart two tokens may score and still count as a tie */

typedef struct real_model {
    const char *name; /* flashlm pull name */
    const char *ref;  /* folder under tests/data/reference */
    int ppl_chunks;   /* chunks of 512 tokens to score in the test */
} real_model;

static const real_model SMOLLM2 = {"smollm2-135m", "smollm2-135m-instruct-q4_1", 3};
static const real_model QWEN05 = {"qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct", 2};
static const real_model GEMMA3 = {"gemma-3-270m", "gemma-3-270m-q4_k_m", 1};
static const real_model QWEN15 = {"qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m", 1};

/* Qwen2.5-Coder-1.5B takes minutes here: checked when FLASHLM_TEST_LARGE=1 (the closing notes quote it). */
static bool large_tests(void) {
    const char *v = getenv("FLASHLM_TEST_LARGE");
    return v && !strcmp(v, "1");
}

static flm_ctx *open_ctx(const char *path, int n_ctx) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1; /* ctest -j runs tests side by side: one thread each */
    p.n_ctx = n_ctx;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(path, &p, &ctx, &err)) fail_msg("flm_open %s: %s", path, err.msg);
    return ctx;
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
    char *data = (char *)tu_read_file(tu_data(rel), &len);
    int n_cases = 0, n_full = 0, n_near_ties = 0;
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
        /* llama.cpp's ids: the retokenized prompt + completion; usable while its prompt part equals ids_prompt
         * (it may not: "):" + "\n" can merge across the boundary) and our ids agree with it */
        const cJSON *ref = cJSON_GetObjectItem(j, "ids_prompt_plus_completion");
        int n_ref = cJSON_GetArraySize(ref);
        bool ids_agree = n_ref > n_prompt;
        for (int i = 0; ids_agree && i < n_prompt; i++)
            ids_agree = cJSON_GetArrayItem(ref, i)->valuedouble == cJSON_GetArrayItem(ids, i)->valuedouble;
        char text[4096];
        size_t tl = 0, cl = strlen(completion);
        for (int g = 0; g < N_GREEDY; g++) {
            int32_t next = tu_argmax(logits, info.n_vocab);
            prev = tok;
            size_t n;
            const char *piece = flm_token_piece(ctx, prev, next, &n);
            bool text_ok = tl + n <= cl && memcmp(completion + tl, piece, n) == 0;
            int32_t alt = -1; /* llama.cpp's token here, when known */
            if (ids_agree && n_prompt + g < n_ref) {
                alt = (int32_t)cJSON_GetArrayItem(ref, n_prompt + g)->valuedouble;
                if (alt == next) alt = -1;
                else if (text_ok && logits[next] - logits[alt] >= NEAR_TIE) {
                    ids_agree = false; /* the same text in other tokens (a retokenization merge): compare text */
                    alt = -1;
                }
            }
            if (!text_ok && alt < 0) {
                /* the best token that does continue llama.cpp's text */
                for (uint32_t v = 0; v < info.n_vocab; v++) {
                    size_t an;
                    const char *ap = flm_token_piece(ctx, prev, (int32_t)v, &an);
                    if (an == 0 || tl + an > cl || memcmp(completion + tl, ap, an) != 0) continue;
                    if (alt < 0 || logits[v] > logits[alt]) alt = (int32_t)v;
                }
                if (alt < 0) alt = next; /* nothing continues it: margin 0 below is then no tie, fail */
            }
            if (alt >= 0) {
                /* Diverged from llama.cpp: accepted only at a near-tie, i.e. when llama.cpp's token scores within
                 * NEAR_TIE of ours (its int8 dot products round differently from ours). */
                float margin = alt == next ? INFINITY : logits[next] - logits[alt];
                text[tl] = 0;
                print_message("%s: prompt %d: diverges from llama.cpp after %d tokens at a margin of %.3f (token %d "
                              "against %d)\n", rm->name, n_cases, g, (double)margin, next, alt);
                if (!(margin < NEAR_TIE))
                    fail_msg("%s: prompt %d: after [%s] flashlm picks token %d, %.3f above llama.cpp's token %d "
                             "in [%s]", rm->name, n_cases, text, next, (double)margin, alt, completion);
                n_near_ties++;
                break;
            }
            memcpy(text + tl, piece, n);
            tl += n;
            tok = next;
            if (g + 1 == N_GREEDY) { n_full++; break; }
            if (flm_eval(ctx, tok, n_prompt + g, &logits, &err)) fail_msg("eval: %s", err.msg);
        }
        n_cases++;
        cJSON_Delete(j);
    }
    print_message("%s: %d of %d prompts identical for %d tokens, %d diverge at a near-tie\n", rm->name, n_full,
                  n_cases, N_GREEDY, n_near_ties);
    assert_true(n_cases >= 1);
    assert_int_equal(n_full + n_near_ties, n_cases);
    free(data);
    flm_close(ctx);
}

static void check_perplexity(const real_model *rm) {
    const char *path = tu_model(rm->name);
    if (!path) { skip(); return; }
    char rel[256];
    snprintf(rel, sizeof rel, "reference/%s/perplexity.json", rm->ref);
    size_t len;
    char *js = (char *)tu_read_file(tu_data(rel), &len);
    cJSON *j = cJSON_ParseWithLength(js, len);
    assert_non_null(j);
    const cJSON *run = cJSON_GetObjectItem(j, "running_ppl_per_chunk");
    assert_true(cJSON_GetArraySize(run) >= rm->ppl_chunks);
    double want = cJSON_GetArrayItem(run, rm->ppl_chunks - 1)->valuedouble;
    char *text = (char *)tu_read_file(tu_data("text/wiki.test.raw"), &len);
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
#ifdef FLM_SANITIZED_BUILD
/* Under ASan (an unoptimised build) these take tens of minutes: the Release suite runs them. */
#define HEAVY(call) skip()
#else
#define HEAVY(call) call
#endif
static void test_smollm2_perplexity(void **state) { (void)state; HEAVY(check_perplexity(&SMOLLM2)); }
static void test_qwen05_greedy(void **state) { (void)state; HEAVY(check_greedy(&QWEN05)); }
static void test_qwen05_perplexity(void **state) { (void)state; HEAVY(check_perplexity(&QWEN05)); }
static void test_gemma3_greedy(void **state) { (void)state; HEAVY(check_greedy(&GEMMA3)); }
static void test_qwen15_greedy(void **state) {
    (void)state;
    if (!large_tests()) { skip(); return; }
    check_greedy(&QWEN15);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2_greedy),
        cmocka_unit_test(test_smollm2_perplexity),
        cmocka_unit_test(test_qwen05_greedy),
        cmocka_unit_test(test_qwen05_perplexity),
        cmocka_unit_test(test_gemma3_greedy),
        cmocka_unit_test(test_qwen15_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
