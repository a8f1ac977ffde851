/* test_seed.c — a seed is a seed (issue 30): with temperature > 0 and a seed, a session's text is a function of the
 * seed and the prompt only (flm_sampler_sample_at: each position's token drawn as llama.cpp draws it, with the
 * mt19937 uniform of its index in the reply; src/session/spec.c accepts a draft when it is that token):
 *   - the same seed twice gives the same text, another seed another text (the test can fail);
 *   - the same text in every mode whose logits are ram mode's (ram, hybrid, hot at budgets that stream) and with the
 *     self-draft as a chain and as a tree (auto's shape: tree 12, depth 6, window 0.2) and the n-gram lookup, with
 *     drafts accepted and rejected; with penalties too (they see each position's own history);
 *   - the same on SmolLM2-135M (when pulled) at --mem 75%;
 *   - llama.cpp's text: a seed gives the tokens llama.cpp's sampler gives (reference/stories260K/llamacpp_seeded.txt,
 *     recorded from llama-server and llama-completion), plain and speculating; mt19937 and libstdc++'s uniform
 *     double against known answers (C++ [rand.predef]; g++ 12's std::uniform_real_distribution<double>).
 * (The draft-model case is tests/test_spec.c's test_seed_draft_model.) stories260K from tests/data. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt19937.h"
#include "flashlm.h"
#include "flashlm_tools.h"
#include "testutil.h"

#define MODEL "models/stories260K/stories260K.gguf"
#define TEXT "text/tinystories_sample.txt"
#define N_CTX 256

static char g_hot[4096];
static char *g_text;

static int setup(void **state) {
    (void)state;
    snprintf(g_hot, sizeof g_hot, "%s", tu_tmp("seed-hot", ".flm"));
    if (tu_stories_hot(g_hot, 30000)) return -1;
    size_t len;
    g_text = (char *)tu_read_file(tu_data(TEXT), &len);
    g_text[len < 30000 ? len : 30000] = 0;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(g_hot);
    free(g_text);
    return 0;
}

static flm_ctx *open_mode(const char *path, flm_mode mode, uint64_t mem, double pct, double window) {
    return tu_open_mode(path, mode, mem, pct, N_CTX, window);
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

/* What draft a session uses. */
typedef enum { PLAIN, NGRAM, SELF_CHAIN, SELF_TREE } draft_kind;

/* Generate up to n tokens after text with sampler sp in ctx (speculating as kind says); returns how many, the spec
 * statistics in *st. */
static int gen(flm_ctx *ctx, draft_kind kind, const flm_sampler_params *sp, const char *text, int n, int32_t *out,
               flm_spec_stats *st) {
    flm_session *s = NULL;
    flm_error err;
    if (flm_session_create(ctx, &s, &err) || flm_session_sampling(s, sp, &err)) fail_msg("session: %s", err.msg);
    if (kind != PLAIN) {
        flm_spec_params o;
        flm_spec_params_default(&o);
        o.n_draft = kind == SELF_TREE ? 6 : 4;
        o.ngram = kind == NGRAM;
        o.self_draft = kind == SELF_CHAIN || kind == SELF_TREE;
        o.tree = kind == SELF_TREE ? 12 : 0;
        o.adaptive = kind == SELF_CHAIN; /* the draft length follows measured timings: the text must not */
        if (flm_session_speculate(s, &o, NULL, &err)) fail_msg("speculate: %s", err.msg);
    }
    if (flm_session_prompt_text(s, text, strlen(text), FLM_TOKENIZE_ADD_SPECIAL, NULL, &err))
        fail_msg("prompt: %s", err.msg);
    collect c = {out, 0, n};
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = n;
    if (flm_session_generate(s, &gp, collect_gen, &c, NULL, &err)) fail_msg("generate: %s", err.msg);
    if (st) flm_session_spec_stats(s, st);
    flm_session_free(s);
    return c.n;
}

/* The reference (ram, plain) against every mode and draft: the same tokens. */
static void check_path(const char *path, double pct_hybrid, uint64_t mem_hot, double pct_hot, const flm_sampler_params *sp,
                       const char *text, int N) {
    int32_t *ref = malloc((size_t)N * sizeof *ref), *got = malloc((size_t)N * sizeof *got);
    flm_ctx *ram = open_mode(path, FLM_MODE_RAM, 0, 0, 0);
    const int n_ref = gen(ram, PLAIN, sp, text, N, ref, NULL);
    assert_true(n_ref >= N / 2);
    /* the same seed again: the same text; another seed: another text */
    assert_int_equal(gen(ram, PLAIN, sp, text, N, got, NULL), n_ref);
    assert_memory_equal(got, ref, (size_t)n_ref * sizeof *ref);
    flm_sampler_params other = *sp;
    other.seed = sp->seed + 1;
    int n_other = gen(ram, PLAIN, &other, text, N, got, NULL);
    assert_true(n_other != n_ref || memcmp(got, ref, (size_t)n_ref * sizeof *ref) != 0);
    /* the n-gram lookup in ram mode */
    flm_spec_stats st;
    int n = gen(ram, NGRAM, sp, text, N, got, &st);
    print_message("%s: ram + n-gram: %d tokens, drafted %llu, accepted %llu\n", path, n,
                  (unsigned long long)st.n_drafted, (unsigned long long)st.n_accepted);
    assert_int_equal(n, n_ref);
    assert_memory_equal(got, ref, (size_t)n * sizeof *ref);
    flm_close(ram);
    /* hybrid at a budget that streams */
    flm_ctx *hyb = open_mode(path, FLM_MODE_HYBRID, 0, pct_hybrid, 0);
    n = gen(hyb, PLAIN, sp, text, N, got, NULL);
    flm_stats fs;
    flm_get_stats(hyb, &fs);
    print_message("%s: hybrid at %.0f%%: %llu bytes read\n", path, pct_hybrid, (unsigned long long)fs.total.bytes_read);
    assert_true(fs.total.bytes_read > 0);
    assert_int_equal(n, n_ref);
    assert_memory_equal(got, ref, (size_t)n * sizeof *ref);
    flm_close(hyb);
    /* hot, plain and with the self-draft (a chain with the adaptive length; auto's tree with its window) */
    const draft_kind kinds[] = {PLAIN, SELF_CHAIN, SELF_TREE};
    for (int k = 0; k < 3; k++) {
        flm_ctx *hot = open_mode(path, FLM_MODE_HOT, mem_hot, pct_hot, kinds[k] == SELF_TREE ? 0.2 : 0);
        n = gen(hot, kinds[k], sp, text, N, got, &st);
        flm_plan_info pi;
        flm_get_plan(hot, &pi);
        print_message("%s: hot %.1f%%, %s: %d tokens, %llu passes, drafted %llu, accepted %llu\n", path,
                      100 * pi.hot_share, kinds[k] == PLAIN ? "plain" : kinds[k] == SELF_CHAIN ? "chain" : "tree",
                      n, (unsigned long long)st.n_passes, (unsigned long long)st.n_drafted,
                      (unsigned long long)st.n_accepted);
        assert_int_equal(pi.mode, FLM_MODE_HOT);
        assert_true(pi.hot_share < 1.0);
        assert_int_equal(n, n_ref);
        assert_memory_equal(got, ref, (size_t)n * sizeof *ref);
        if (kinds[k] == SELF_TREE) { /* a fixed tree (not adaptive): what it drafts does not follow timings */
            assert_true(st.n_accepted > 0);             /* drafts help ... */
            assert_true(st.n_accepted < st.n_drafted);  /* ... and some are rejected */
        } else if (kinds[k] == SELF_CHAIN) {
            /* the adaptive chain's lengths follow measured costs (under ASan it may draft little and keep none):
             * only the text is checked, above */
            assert_true(st.n_accepted <= st.n_drafted);
        }
        flm_close(hot);
    }
    free(ref);
    free(got);
}

static void test_seed_stories(void **state) {
    (void)state;
    flm_sampler_params sp;
    flm_sampler_params_default(&sp); /* temp 0.8, top-k 40, top-p 0.95 */
    sp.seed = 7;
    const uint64_t mem = tu_hot_budget_for_share(g_hot, 0.3, 0.6, N_CTX);
    check_path(g_hot, 95, mem, 0, &sp, "Once upon a time, there was a little girl", 96);
    /* all tokens (no top-k or top-p), a high temperature: more rejections */
    flm_sampler_params wide = {.temp = 1.2f, .top_k = 0, .top_p = 1.0f, .seed = 1234};
    check_path(g_hot, 95, mem, 0, &wide, "One day, a little boy named Tim", 64);
    /* the penalties and a bias: each position's own history, under speculation too */
    flm_logit_bias bias[] = {{13, -1.5f}};
    flm_sampler_params pen = sp;
    pen.repeat_penalty = 1.3f;
    pen.presence_penalty = 0.4f;
    pen.frequency_penalty = 0.2f;
    pen.bias = bias;
    pen.n_bias = 1;
    check_path(g_hot, 95, mem, 0, &pen, "Once upon a time, there was a little girl", 64);
}

static void test_seed_smollm2(void **state) {
    (void)state;
    const char *flm = tu_convert_pulled("smollm2-135m", "seed-real");
    if (!flm) skip();
    char path[4096];
    snprintf(path, sizeof path, "%s", flm);
    flm_error err;
    if (flm_hot_order(path, g_text, 96, 96, 2, NULL, NULL, &err)) fail_msg("hot order %s: %s", path, err.msg);
    flm_sampler_params sp;
    flm_sampler_params_default(&sp);
    sp.seed = 7;
#ifdef FLM_SANITIZED_BUILD
    const int N = 16;
#else
    const int N = 48;
#endif
    check_path(path, 75, 0, 75, &sp, "Once upon a time, in a small village by the sea,", N);
    remove(path);
}

/* std::mt19937 and libstdc++'s uniform_real_distribution<double>(0, 1) on it: known answers. */
static void test_mt19937_known_answers(void **state) {
    (void)state;
    flm_mt19937 m;
    flm_mt19937_seed(&m, 5489); /* std::mt19937's default seed: its 10000th output is 4123659995 ([rand.predef]) */
    uint32_t v = 0;
    for (int i = 0; i < 10000; i++) v = flm_mt19937_next(&m);
    assert_int_equal(v, 4123659995u);
    /* seed 42: the outputs and doubles g++ 12 (libstdc++) printed for std::mt19937(42) */
    flm_mt19937_seed(&m, 42);
    const uint32_t w[4] = {1608637542u, 3421126067u, 4083286876u, 787846414u};
    for (int i = 0; i < 4; i++) assert_int_equal(flm_mt19937_next(&m), w[i]);
    flm_mt19937_seed(&m, 42);
    const double u[5] = {0.79654298428784598, 0.18343478789336848, 0.77969099761266125, 0.59685016158005655,
                         0.44583275754843343};
    for (int i = 0; i < 5; i++) assert_true(flm_mt19937_canonical(&m) == u[i]);
}

/* The sampler's uniforms come from a bounded window of the mt19937 stream (the cache grew by 8 bytes a generated
 * token before): keys far past the window's size, asked out of order and after a rewind far back, give the token the
 * k-th double of the stream gives (equal logits over 1000 tokens: the token is ceil(1000 u) - 1). */
static void test_sampler_stream_window(void **state) {
    (void)state;
    enum { V = 1000, K = 20000 };
    float *lg = calloc(V, sizeof *lg);
    assert_non_null(lg);
    flm_sampler_params p;
    flm_sampler_params_default(&p);
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 1234;
    flm_sampler *a = flm_sampler_create(&p, V), *b = flm_sampler_create(&p, V);
    assert_non_null(a);
    assert_non_null(b);
    flm_sampler_set_origin(a, 7);
    flm_sampler_set_origin(b, 7);
    int32_t *want = malloc(K * sizeof *want);
    assert_non_null(want);
    flm_mt19937 m;
    flm_mt19937_seed(&m, 1234);
    for (int k = 0; k < K; k++) {
        want[k] = (int32_t)ceil(V * flm_mt19937_canonical(&m)) - 1;
        assert_int_equal(flm_sampler_sample_at(a, lg, 7 + (uint64_t)k, NULL, 0), want[k]); /* in order */
    }
    const int order[] = {19999, 3, 15000, 19998, 0, 8191, 8192, 12345, 4095, 4096, 1};
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) /* out of order: forward jumps and rewinds */
        assert_int_equal(flm_sampler_sample_at(b, lg, 7 + (uint64_t)order[i], NULL, 0), want[order[i]]);
    free(want);
    flm_sampler_free(a);
    flm_sampler_free(b);
    /* a seed above 2^32 is folded (seed ^ seed >> 32), not cut to its low 32 bits: 2^32 + 5 is not seed 5, and is
     * mt19937(2^32 + 5 ^ 1 = 4) */
    const uint64_t seeds[3] = {5, ((uint64_t)1 << 32) + 5, 4};
    int32_t t[3][64];
    for (int i = 0; i < 3; i++) {
        p.seed = seeds[i];
        flm_sampler *c = flm_sampler_create(&p, V);
        assert_non_null(c);
        for (int k = 0; k < 64; k++) t[i][k] = flm_sampler_sample_at(c, lg, (uint64_t)k, NULL, 0);
        flm_sampler_free(c);
    }
    assert_memory_not_equal(t[0], t[1], sizeof t[0]);
    assert_memory_equal(t[1], t[2], sizeof t[1]);
    free(lg);
}

/* llama.cpp's seeded text: each case of the recording, plain and with the n-gram lookup (ram mode), and with the
 * self-draft tree (hot mode, neurons streamed: the same logits). */
static void test_seed_llamacpp(void **state) {
    (void)state;
    size_t len;
    char *txt = (char *)tu_read_file(tu_data("reference/stories260K/llamacpp_seeded.txt"), &len);
    assert_non_null(txt);
    flm_ctx *ram = open_mode(tu_data(MODEL), FLM_MODE_RAM, 0, 0, 0);
    flm_ctx *hot = open_mode(g_hot, FLM_MODE_HOT, tu_hot_budget_for_share(g_hot, 0.3, 0.6, N_CTX), 0, 0);
    assert_non_null(hot);
    int n_cases = 0;
    for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        unsigned long long seed;
        float temp, top_p, min_p;
        int top_k, n;
        int used = 0;
        if (sscanf(line, "%llu %f %d %f %f %d\t%n", &seed, &temp, &top_k, &top_p, &min_p, &n, &used) != 6 || !used)
            fail_msg("bad fixture line: %s", line);
        char *prompt = line + used, *ids = strchr(prompt, '\t');
        assert_non_null(ids);
        *ids++ = 0;
        int32_t want[256], got[256];
        int nw = 0;
        for (char *e; nw < 256 && *ids; ids = e) {
            want[nw++] = (int32_t)strtol(ids, &e, 10);
            if (e == ids) fail_msg("bad ids in: %s", line);
        }
        assert_int_equal(nw, n);
        flm_sampler_params sp;
        flm_sampler_params_default(&sp);
        sp.seed = seed;
        sp.temp = temp;
        sp.top_k = top_k;
        sp.top_p = top_p;
        sp.min_p = min_p;
        const draft_kind kinds[] = {PLAIN, NGRAM, SELF_TREE};
        for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
            assert_int_equal(gen(kinds[k] == SELF_TREE ? hot : ram, kinds[k], &sp, prompt, n, got, NULL), n);
            for (int i = 0; i < n; i++)
                if (got[i] != want[i])
                    fail_msg("seed %llu \"%s\" (draft kind %d): token %d is %d, llama.cpp's %d", seed, prompt,
                             (int)kinds[k], i, got[i], want[i]);
        }
        n_cases++;
    }
    assert_true(n_cases >= 5);
    flm_close(hot);
    flm_close(ram);
    free(txt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mt19937_known_answers),
        cmocka_unit_test(test_sampler_stream_window),
        cmocka_unit_test(test_seed_llamacpp),
        cmocka_unit_test(test_seed_stories),
        cmocka_unit_test(test_seed_smollm2),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
