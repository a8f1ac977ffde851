/* test_hot.c — the hot mode and the self-draft (runtime/ffn_hot.c, calibrate/hot.c, the session's engine
 * src/session/spec.c through flm_session_speculate; docs/SPECULATIVE.md):
 *   - flm_hot_order stores every layer's neurons in a new order, marks the file, keeps it verifiable, and the model's
 *     logits stay those of the unordered file (to float rounding: the FFN sums in another order);
 *   - the hot mode under budgets that keep part of every layer equals ram mode on the same file bit for bit, token
 *     by token and in batches (what lets greedy speculative output equal plain output at near-ties);
 *   - the self-draft (flm_eval_draft) is refused outside mode hot, and its approximate keys and values are all
 *     overwritten: greedy output with --draft-n 1, 3, 8 equals plain greedy output token for token, with some drafts
 *     accepted and some rejected;
 *   - the same with draft trees (flm_eval_tree, src/session/spec.c tree_step) of 4 to 64 nodes;
 *   - the same with the self-draft's window of recently active neurons (flm_params.draft_window);
 *   - sampling with the self-draft keeps the model's distribution (the joint of the first tokens, counted), with a
 *     chain and with a tree;
 *   - the same on SmolLM2 and Qwen2.5-Coder-0.5B (when pulled) at --mem 75% / 50%, 64 tokens.
 * stories260K from tests/data. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "testutil.h"

#define MODEL "models/stories260K/stories260K.gguf"
#define TEXT "text/tinystories_sample.txt"
#define N_CTX 256

static char g_plain[4096], g_hot[4096];
static char *g_text;
static double g_window; /* flm_params.draft_window of the hot contexts open_mode opens */

static int setup(void **state) {
    (void)state;
    snprintf(g_plain, sizeof g_plain, "%s", tu_tmp("hot-plain", ".flm"));
    snprintf(g_hot, sizeof g_hot, "%s", tu_tmp("hot-ordered", ".flm"));
    flm_error err;
    if (flm_convert(tu_data(MODEL), g_plain, NULL, NULL, &err)) {
        fprintf(stderr, "convert: %s\n", err.msg);
        return -1;
    }
    if (tu_stories_hot(g_hot, 30000)) return -1;
    size_t len;
    g_text = (char *)tu_read_file(tu_data(TEXT), &len);
    g_text[len < 30000 ? len : 30000] = 0;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(g_plain);
    remove(g_hot);
    free(g_text);
    return 0;
}

static flm_ctx *open_mode(const char *path, flm_mode mode, uint64_t mem, double pct, int n_ctx) {
    return tu_open_mode(path, mode, mem, pct, n_ctx, mode == FLM_MODE_HOT ? g_window : 0);
}


static int32_t *tokenize(flm_ctx *ctx, const char *text, int *n) {
    size_t m = 0;
    int32_t *ids = flm_tokenize_all(ctx, text, true, &m);
    assert_non_null(ids);
    *n = (int)m;
    return ids;
}


static void test_order_written(void **state) {
    (void)state;
    assert_true(flm_is_hot_ordered(g_hot));
    assert_false(flm_is_hot_ordered(g_plain));
    flm_error err;
    flm_verify_info vi;
    assert_int_equal(flm_verify(g_hot, NULL, NULL, &vi, &err), FLM_OK);
    /* the same function: ram logits of both files, to float rounding (the FFN sums its neurons in another order) */
    flm_ctx *a = open_mode(g_plain, FLM_MODE_RAM, 0, 0, N_CTX), *b = open_mode(g_hot, FLM_MODE_RAM, 0, 0, N_CTX);
    int n;
    int32_t *ids = tokenize(a, "Once upon a time, there was a little girl named Lily. She loved to play outside.", &n);
    assert_true(n >= 16);
    const uint32_t V = tu_vocab(a);
    float *la = tu_logits(a, ids, n, false), *lb = tu_logits(b, ids, n, false);
    double dmax = 0, amax = 1;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        if (fabs(la[i]) > amax) amax = fabs(la[i]);
        if (fabs(la[i] - lb[i]) > dmax) dmax = fabs(la[i] - lb[i]);
    }
    print_message("hot-ordered vs unordered, ram: max relative logit difference %.2e over %d tokens\n", dmax / amax, n);
    assert_true(dmax / amax <= 1e-3); /* f16 keys and values round the small differences on */
    free(la);
    free(lb);
    free(ids);
    flm_close(a);
    flm_close(b);
    /* neither a GGUF nor a mode other than hot drafts */
    flm_ctx *r = open_mode(g_hot, FLM_MODE_RAM, 0, 0, N_CTX);
    const float *lg;
    assert_int_equal(flm_eval_draft(r, 1, 0, &lg, &err), FLM_ERR_ARG);
    assert_false(flm_has_self_draft(r));
    flm_close(r);
}

static void test_hot_equals_ram(void **state) {
    (void)state;
    flm_ctx *ram = open_mode(g_hot, FLM_MODE_RAM, 0, 0, N_CTX);
    int n;
    int32_t *ids = tokenize(ram, "Once upon a time, there was a little dog. He liked to run in the park with his ball.",
                            &n);
    assert_true(n >= 16);
    const uint32_t V = tu_vocab(ram);
    float *want = tu_logits(ram, ids, n, false);
    flm_close(ram);
    const double shares[][2] = {{0.05, 0.3}, {0.4, 0.7}, {0.75, 0.97}};
    for (int k = 0; k < 3; k++) {
        uint64_t mem = tu_hot_budget_for_share(g_hot, shares[k][0], shares[k][1], N_CTX);
        for (int batch = 0; batch < 2; batch++) {
            flm_ctx *hot = open_mode(g_hot, FLM_MODE_HOT, mem, 0, N_CTX);
            flm_plan_info pi;
            flm_get_plan(hot, &pi);
            assert_int_equal(pi.mode, FLM_MODE_HOT);
            assert_true(flm_has_self_draft(hot));
            float *got = tu_logits(hot, ids, n, batch);
            flm_stats st;
            flm_get_stats(hot, &st);
            print_message("hot %.1f%% (budget %llu), %s: %llu bytes read, logits %s ram's\n", 100 * pi.hot_share,
                          (unsigned long long)mem, batch ? "one batch" : "token by token",
                          (unsigned long long)st.total.bytes_read,
                          memcmp(got, want, (size_t)n * V * sizeof(float)) ? "DIFFER from" : "equal");
            assert_true(st.total.bytes_read > 0);
            assert_memory_equal(got, want, (size_t)n * V * sizeof(float));
            free(got);
            flm_close(hot);
        }
    }
    free(want);
    free(ids);
}

typedef struct collect {
    int32_t *tok;
    int n, cap;
} collect;

static bool collect_gen(void *user, const flm_gen_token *t) {
    collect *c = user;
    if (t->eog || t->id < 0) return true;
    if (c->n >= c->cap) fail_msg("more tokens than asked for");
    c->tok[c->n++] = t->id;
    return true;
}

/* A session over target decoding with the self-draft (a chain of n_draft, or a tree of `tree` nodes), sampling
 * with sp. */
static flm_session *self_session(flm_ctx *target, int n_draft, int tree, const flm_sampler_params *sp) {
    flm_session *s = NULL;
    flm_error err;
    if (flm_session_create(target, &s, &err) || flm_session_sampling(s, sp, &err)) fail_msg("session: %s", err.msg);
    flm_spec_params o;
    flm_spec_params_default(&o);
    o.n_draft = n_draft;
    o.self_draft = true;
    o.tree = tree;
    if (flm_session_speculate(s, &o, NULL, &err)) fail_msg("flm_session_speculate: %s", err.msg);
    return s;
}

/* plain greedy: up to n tokens after prompt */
static int gen_plain(flm_ctx *ctx, const int32_t *prompt, int n_prompt, int n, int32_t *out) {
    const float *lg = NULL;
    flm_error err;
    if (flm_eval_batch(ctx, prompt, (uint32_t)n_prompt, 0, NULL, &lg, &err)) fail_msg("prompt: %s", err.msg);
    const uint32_t V = tu_vocab(ctx);
    int k = 0, pos = n_prompt;
    while (k < n) {
        int32_t t = tu_argmax(lg, V);
        if (flm_token_is_eog(ctx, t)) break;
        out[k++] = t;
        if (k < n && flm_eval(ctx, t, pos++, &lg, &err)) fail_msg("eval: %s", err.msg);
    }
    return k;
}

static int gen_self(flm_ctx *target, int n_draft, int tree, const int32_t *prompt, int n_prompt, int n, int32_t *out,
                    flm_spec_stats *st) {
    flm_sampler_params g = {.temp = 0, .top_k = 0, .top_p = 1, .seed = 1};
    flm_session *s = self_session(target, n_draft, tree, &g);
    flm_error err;
    if (flm_session_feed(s, prompt, (size_t)n_prompt, &err)) fail_msg("feed: %s", err.msg);
    collect c = {out, 0, n};
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = n;
    if (flm_session_generate(s, &gp, collect_gen, &c, NULL, &err)) fail_msg("generate: %s", err.msg);
    flm_session_spec_stats(s, st);
    flm_session_free(s);
    return c.n;
}

/* greedy with the self-draft equals plain greedy (ram mode on the same file), with drafts accepted and rejected;
 * cfg[i] = {draft length (a tree's depth), tree nodes (0: a chain)} */
static void check_self_draft(const char *path, uint64_t mem, double pct, int n_ctx, const char *text, int N,
                             const int (*cfg)[2], int n_cfg) {
    flm_ctx *plain = open_mode(path, FLM_MODE_RAM, 0, 0, n_ctx);
    int n_prompt;
    int32_t *prompt = tokenize(plain, text, &n_prompt);
    int32_t *ref = malloc((size_t)N * sizeof *ref), *got = malloc((size_t)N * sizeof *got);
    int n_ref = gen_plain(plain, prompt, n_prompt, N, ref);
    assert_true(n_ref >= N / 2);
    flm_close(plain);
    for (int l = 0; l < n_cfg; l++) {
        uint64_t accepted = 0, drafted = 0;
        flm_ctx *target = open_mode(path, FLM_MODE_HOT, mem, pct, n_ctx);
        flm_plan_info pi;
        flm_get_plan(target, &pi);
        flm_spec_stats st;
        int n = gen_self(target, cfg[l][0], cfg[l][1], prompt, n_prompt, N, got, &st);
        print_message("%s: hot %.1f%% + window %.1f%%, --draft-n %d, tree %d: %d tokens in %llu passes, drafted %llu, "
                      "accepted %llu\n", path, 100 * pi.hot_share, 100 * pi.window_share, cfg[l][0], cfg[l][1], n,
                      (unsigned long long)st.n_passes,
                      (unsigned long long)st.n_drafted, (unsigned long long)st.n_accepted);
        assert_int_equal(n, n_ref);
        assert_memory_equal(got, ref, (size_t)n * sizeof *got);
        assert_true(st.n_passes <= (uint64_t)n);
        /* a tree drafts more nodes than it verifies (FLM_SPEC_TREE_DRAFT), but no pass verifies more than `tree`
         * (a chain: --draft-n + 1 rows) */
        const int most = cfg[l][1] ? cfg[l][1] : cfg[l][0] + 1;
        for (int k = most + 1; k <= FLM_SPEC_DRAFT_MAX + 1; k++) assert_int_equal(st.verify_n[k], 0);
        accepted += st.n_accepted;
        drafted += st.n_drafted;
        flm_close(target);
        assert_true(accepted > 0);        /* the draft helps ... */
        assert_true(accepted < drafted);  /* ... and is sometimes wrong: rejections are exercised */
    }
    free(ref);
    free(got);
    free(prompt);
}

static void test_self_draft_greedy(void **state) {
    (void)state;
    uint64_t mem = tu_hot_budget_for_share(g_hot, 0.4, 0.7, N_CTX);
#ifdef FLM_SANITIZED_BUILD /* memory errors, not numerics: fewer shapes (ASan is ~10x slower) */
    const int cfg[][2] = {{1, 0}, {3, 4}, {8, 16}};
#else
    const int cfg[][2] = {{1, 0}, {3, 0}, {8, 0}, {3, 4}, {8, 16}, {12, 64}}; /* chains, then trees */
#endif
    check_self_draft(g_hot, mem, 0, N_CTX, "Once upon a time, there was a little girl", 96, cfg,
                     (int)(sizeof cfg / sizeof cfg[0]));
}

/* the same with the self-draft's window (runtime/ffn_hot.c): the verification is exact whatever the draft computes */
static void test_self_draft_window_greedy(void **state) {
    (void)state;
    uint64_t mem = tu_hot_budget_for_share(g_hot, 0.4, 0.7, N_CTX);
    const int cfg[][2] = {{1, 0}, {4, 0}, {4, 8}};
    g_window = 0.4;
    check_self_draft(g_hot, mem, 0, N_CTX, "Once upon a time, there was a little girl", 96, cfg, 3);
    g_window = 0;
}




/* Sampling through the self-draft keeps the model's distribution: the joint of the first 3 tokens (top-k 3: 27
 * cells) computed exactly from ram mode, against the counts of many speculative generations in mode hot (drafts from
 * the hot neurons, drawn with the noise of their positions, accepted when they are the target's draw there); and the
 * self-draft's own joint is far from it (the test
 * can fail). */
static void check_self_draft_sampling(int tree) {
    flm_ctx *ref = open_mode(g_hot, FLM_MODE_RAM, 0, 0, N_CTX);
    const uint32_t V = tu_vocab(ref);
    int n_prompt;
    int32_t *prompt = tokenize(ref, "Once upon a time there was a", &n_prompt);
    flm_sampler_params sp = {.temp = 1.0f, .top_k = 3, .top_p = 1.0f, .seed = 99};
    flm_sampler *ps = flm_sampler_create(&sp, V);
    float *p = malloc(V * sizeof *p);
    const float *logits;
    flm_error err;
    double joint[27], djoint[27];
    int32_t cand[27][3];
    tu_joint3(ref, prompt, n_prompt, ps, cand, joint);
    const uint64_t mem = tu_hot_budget_for_share(g_hot, 0.2, 0.5, N_CTX);
    flm_ctx *dref = open_mode(g_hot, FLM_MODE_HOT, mem, 0, N_CTX);
    for (int cell = 0; cell < 27; cell++) { /* the self-draft's own probabilities of the cells */
        double q = 1;
        assert_int_equal(flm_eval_batch(dref, prompt, (uint32_t)n_prompt - 1, 0, NULL, &logits, &err), FLM_OK);
        assert_int_equal(flm_eval_draft(dref, prompt[n_prompt - 1], n_prompt - 1, &logits, &err), FLM_OK);
        for (int k = 0; k < 3; k++) {
            flm_sampler_probs(ps, logits, p);
            q *= p[cand[cell][k]];
            if (k < 2) assert_int_equal(flm_eval_draft(dref, cand[cell][k], n_prompt + k, &logits, &err), FLM_OK);
        }
        djoint[cell] = q;
    }
    flm_close(dref);
    flm_ctx *target = open_mode(g_hot, FLM_MODE_HOT, mem, 0, N_CTX);
    flm_session *s = self_session(target, 2, tree, &sp);
    assert_int_equal(flm_session_feed(s, prompt, (size_t)n_prompt, &err), FLM_OK);
#ifdef FLM_SANITIZED_BUILD
    const int M = 600;
#else
    const int M = 2500; /* each generation is a few passes that read from the file: seconds per thousand */
#endif
    double count[27] = {0};
    for (int i = 0; i < M; i++) {
        /* the prompt again: its last token evaluated again for its logits, the rest kept; a new seed each time (a
         * seed is a seed: the same one would give the same text), so the counts are over seeds */
        assert_int_equal(flm_session_prompt(s, prompt, (size_t)n_prompt, NULL, &err), FLM_OK);
        flm_sampler_params si = sp;
        si.seed = sp.seed + 1000003u * (uint64_t)i;
        assert_int_equal(flm_session_sampling(s, &si, &err), FLM_OK);
        int32_t toks[4];
        collect c = {toks, 0, 4};
        flm_gen_params gp;
        flm_gen_params_default(&gp);
        gp.max_tokens = 4;
        assert_int_equal(flm_session_generate(s, &gp, collect_gen, &c, NULL, &err), FLM_OK);
        assert_int_equal(c.n, 4);
        int cell = -1;
        for (int k = 0; k < 27 && cell < 0; k++)
            if (cand[k][0] == toks[0] && cand[k][1] == toks[1] && cand[k][2] == toks[2]) cell = k;
        if (cell < 0) fail_msg("tokens %d %d %d are not among the model's top-3 paths", toks[0], toks[1], toks[2]);
        count[cell]++;
    }
    flm_spec_stats st;
    flm_session_spec_stats(s, &st);
    print_message("self-draft sampling (tree %d): %d generations, drafted %llu, accepted %llu\n", tree, M,
                  (unsigned long long)st.n_drafted, (unsigned long long)st.n_accepted);
    assert_true(st.n_accepted > 0 && st.n_accepted < st.n_drafted);
    tu_expect_freqs(count, joint, 27, M, "self-draft sampling, joint of the first 3 tokens");
    double far = 0;
    for (int k = 0; k < 27; k++) far = fmax(far, fabs(djoint[k] - joint[k]));
    print_message("largest |self-draft - model| over the 27 cells: %.4f\n", far);
    assert_true(far > 6 * sqrt(0.25 / M));
    flm_session_free(s);
    flm_sampler_free(ps);
    flm_close(target);
    flm_close(ref);
    free(p);
    free(prompt);
}

static void test_self_draft_sampling(void **state) {
    (void)state;
    check_self_draft_sampling(0);
}

/* the same with a draft tree: each node's children are its draft's draw and the tokens nearest it in the draft's
 * distribution (flm_sampler_draws_at), the walk follows the target's own draw */
static void test_self_draft_tree_sampling(void **state) {
    (void)state;
    check_self_draft_sampling(8);
}

static void test_self_draft_real(void **state) {
    (void)state;
    static const struct { const char *name; double pct; } models[] = {{"smollm2-135m", 75}, {"qwen2.5-coder-0.5b", 50}};
    int ran = 0;
#ifdef FLM_SANITIZED_BUILD /* memory errors, not numerics: SmolLM2 and a few tokens (ASan is ~10x slower) */
    const int n_models = 1, n_tok = 32;
#else
    const int n_models = 2, n_tok = 64;
#endif
    for (int i = 0; i < n_models; i++) {
        const char *flm = tu_convert_pulled(models[i].name, "hot-real");
        if (!flm) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s", flm);
        flm_error err;
        if (flm_hot_order(path, g_text, 96, 96, 2, NULL, NULL, &err)) fail_msg("hot order %s: %s", path, err.msg);
#ifdef FLM_SANITIZED_BUILD
        const int cfg[][2] = {{8, 24}}, cfg_w[][2] = {{4, 0}};
#else
        const int cfg[][2] = {{4, 0}, {8, 24}}, cfg_w[][2] = {{4, 0}};
#endif
        const char *code = "def merge_sort(items):\n    \"\"\"Sort a list.\"\"\"\n";
        check_self_draft(path, 0, models[i].pct, 512, code, n_tok, cfg, (int)(sizeof cfg / sizeof cfg[0]));
        g_window = 0.3; /* with the self-draft's window */
        check_self_draft(path, 0, models[i].pct, 512, code, n_tok, cfg_w, 1);
        g_window = 0;
        remove(path);
        ran++;
    }
    if (!ran) skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_written),
        cmocka_unit_test(test_hot_equals_ram),
        cmocka_unit_test(test_self_draft_greedy),
        cmocka_unit_test(test_self_draft_window_greedy),
        cmocka_unit_test(test_self_draft_sampling),
        cmocka_unit_test(test_self_draft_tree_sampling),
        cmocka_unit_test(test_self_draft_real),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
