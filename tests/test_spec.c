/* test_spec.c — speculative decoding (the session's engine: flm_session_speculate, src/session/spec.c; the sampler's
 * acceptance rule; `flashlm run --draft`):
 *   - the acceptance rule keeps the target's distribution (hand-made p and q, many draws, a fixed seed);
 *   - greedy speculative output is plain greedy output token for token: stories260K with a draft the test derives from
 *     it (a perturbed copy that disagrees sometimes), --draft-n 1, 3, 8, in ram mode and streamed from a .flm (naive);
 *     and with the n-gram lookup on a repetitive prompt;
 *   - sampling through the whole loop (drafts, rejections, the extra token) gives plain sampling's joint distribution
 *     of the first tokens, computed exactly;
 *   - a draft whose tokenizer differs is refused with both files named;
 *   - the real pair Qwen2.5-Coder 0.5B drafting for 1.5B (when pulled);
 *   - the CLI end to end. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "format/gguf.h"
#include "write/gguf_write.h"
#include "session/spec.h" /* spec_ngram_lookup */
#include "testutil.h"

#define MODEL "models/stories260K/stories260K.gguf"
#define N_CTX 256

static const char *g_draft;     /* the perturbed copy of stories260K (setup) */
static char g_draft_path[4096];
static char g_flm_path[4096];   /* stories260K converted to .flm (setup) */

/* ---- helpers ------------------------------------------------------------------------------------------------- */

static flm_ctx *open_model(const char *path, flm_mode mode, int n_ctx) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = n_ctx;
    p.mode = mode;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(path, &p, &ctx, &err)) fail_msg("flm_open %s: %s", path, err.msg);
    return ctx;
}

static uint32_t n_vocab_of(const flm_ctx *ctx) {
    flm_model_info in;
    flm_get_info(ctx, &in);
    return in.n_vocab;
}

/* Plain greedy decoding, one flm_eval per token: up to n tokens after prompt into out (an end-of-generation token
 * ends it, not stored). Returns the count. */
static int gen_plain(flm_ctx *ctx, const int32_t *prompt, int n_prompt, int n, int32_t *out) {
    const float *logits = NULL;
    flm_error err;
    int32_t pos = 0;
    for (int i = 0; i < n_prompt; i++)
        if (flm_eval(ctx, prompt[i], pos++, &logits, &err)) fail_msg("eval: %s", err.msg);
    uint32_t V = n_vocab_of(ctx);
    int k = 0;
    while (k < n) {
        int32_t t = tu_argmax(logits, V);
        if (flm_token_is_eog(ctx, t)) break;
        out[k++] = t;
        if (k < n && flm_eval(ctx, t, pos++, &logits, &err)) fail_msg("eval: %s", err.msg);
    }
    return k;
}

typedef struct {
    int32_t *tok;
    int n, cap;
    flm_session *s;
    int32_t base; /* tokens the session held before the generation */
} collect;

/* The session's callback: every token, and the session holds exactly the prompt and the tokens before this one
 * (accepted drafts the context holds ahead are not counted until they are reported). */
static bool collect_gen(void *user, const flm_gen_token *t) {
    collect *c = user;
    if (t->eog || t->id < 0) return true;
    if (flm_session_n_past(c->s) != c->base + c->n)
        fail_msg("token %d: the session holds %d tokens, want %d", c->n, flm_session_n_past(c->s), c->base + c->n);
    if (c->n >= c->cap) fail_msg("more tokens than asked for");
    c->tok[c->n++] = t->id;
    return true;
}

/* A session over target decoding speculatively (draft: a model, or NULL with ngram), sampling with sp (NULL: greedy). */
static flm_session *spec_session(flm_ctx *target, flm_ctx *draft, bool ngram, int n_draft,
                                 const flm_sampler_params *sp) {
    flm_sampler_params g = {.temp = 0, .top_k = 0, .top_p = 1, .seed = 1};
    flm_session *s = NULL;
    flm_error err;
    if (flm_session_create(target, &s, &err) || flm_session_sampling(s, sp ? sp : &g, &err))
        fail_msg("session: %s", err.msg);
    flm_spec_params o;
    flm_spec_params_default(&o);
    o.n_draft = n_draft;
    o.ngram = ngram;
    if (flm_session_speculate(s, &o, draft, &err)) fail_msg("flm_session_speculate: %s", err.msg);
    return s;
}

/* Speculative decoding through the session: greedy (temp 0) unless sp; the generated tokens into out; stats. */
static int gen_spec(flm_ctx *target, flm_ctx *draft, bool ngram, int n_draft, const flm_sampler_params *sp,
                    const int32_t *prompt, int n_prompt, int n, int32_t *out, flm_spec_stats *st) {
    flm_session *s = spec_session(target, draft, ngram, n_draft, sp);
    flm_error err;
    if (flm_session_feed(s, prompt, (size_t)n_prompt, &err)) fail_msg("feed: %s", err.msg);
    assert_int_equal(flm_session_n_past(s), n_prompt);
    collect c = {out, 0, n, s, n_prompt};
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = n;
    flm_gen_result r;
    if (flm_session_generate(s, &gp, collect_gen, &c, &r, &err)) fail_msg("generate: %s", err.msg);
    assert_int_equal(r.n_gen, c.n + (r.eog ? 1 : 0));
    /* the target holds the prompt and every token but the last (not fed: !feed_last), or all before an EOG */
    assert_int_equal(flm_session_n_past(s), n_prompt + c.n - (r.eog || c.n == 0 ? 0 : 1));
    flm_session_spec_stats(s, st);
    flm_session_free(s);
    return c.n;
}

/* Write a copy of src whose float tensors (weights and norms) get uniform noise of sigma times each tensor's RMS:
 * a model with the same tokenizer that agrees with src on most, not all, greedy tokens. */
static void write_perturbed(const char *src_path, const char *out, float sigma, uint64_t seed) {
    flm_error err;
    flm_gguf_file *src = NULL;
    assert_int_equal(flm_gguf_open(src_path, &src, &err), FLM_OK);
    flm_gguf_writer *w = NULL;
    assert_int_equal(flm_gguf_writer_create(out, FLM_OUT_REPLACE, &w, &err), FLM_OK);
    for (uint64_t i = 0; i < src->n_kv; i++) assert_int_equal(flm_gguf_writer_kv_copy(w, &src->kv[i]), FLM_OK);
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const flm_gguf_tensor *t = &src->tensors[i];
        assert_int_equal(flm_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne), FLM_OK);
    }
    assert_int_equal(flm_gguf_writer_begin(w, &err), FLM_OK);
    uint64_t rng = seed;
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const flm_gguf_tensor *t = &src->tensors[i];
        assert_int_equal(t->type, FLM_TYPE_F32);
        float *x = malloc(t->nbytes);
        assert_non_null(x);
        memcpy(x, t->data, t->nbytes);
        double ss = 0;
        for (uint64_t j = 0; j < t->n_elements; j++) ss += (double)x[j] * x[j];
        float rms = (float)sqrt(ss / (double)t->n_elements);
        for (uint64_t j = 0; j < t->n_elements; j++) x[j] += sigma * rms * tu_rand_f32(&rng);
        assert_int_equal(flm_gguf_writer_write_tensor(w, x, t->nbytes, &err), FLM_OK);
        free(x);
    }
    assert_int_equal(flm_gguf_writer_finish(w, &err), FLM_OK);
    flm_gguf_writer_free(w);
    flm_gguf_close(src);
}

/* A copy of src whose vocabulary differs in one token's string (token `id` gets `piece`), or, with bos >= 0, whose
 * BOS id is bos. */
static void write_other_vocab(const char *src_path, const char *out, int32_t id, const char *piece, int32_t bos) {
    flm_error err;
    flm_gguf_file *src = NULL;
    assert_int_equal(flm_gguf_open(src_path, &src, &err), FLM_OK);
    flm_gguf_writer *w = NULL;
    assert_int_equal(flm_gguf_writer_create(out, FLM_OUT_REPLACE, &w, &err), FLM_OK);
    for (uint64_t i = 0; i < src->n_kv; i++) {
        const flm_gguf_kv *kv = &src->kv[i];
        if (id >= 0 && !strcmp(kv->key, "tokenizer.ggml.tokens")) {
            char **s = calloc(kv->arr_n, sizeof *s);
            for (uint64_t j = 0; j < kv->arr_n; j++)
                s[j] = j == (uint64_t)id ? strdup(piece) : strndup(kv->arr_str[j].data, kv->arr_str[j].len);
            assert_int_equal(flm_gguf_writer_kv_arr(w, kv->key, GGUF_VT_STRING, s, kv->arr_n), FLM_OK);
            for (uint64_t j = 0; j < kv->arr_n; j++) free(s[j]);
            free(s);
        } else if (bos >= 0 && !strcmp(kv->key, "tokenizer.ggml.bos_token_id")) {
            assert_int_equal(flm_gguf_writer_kv_u32(w, kv->key, (uint32_t)bos), FLM_OK);
        } else {
            assert_int_equal(flm_gguf_writer_kv_copy(w, kv), FLM_OK);
        }
    }
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const flm_gguf_tensor *t = &src->tensors[i];
        assert_int_equal(flm_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne), FLM_OK);
    }
    assert_int_equal(flm_gguf_writer_begin(w, &err), FLM_OK);
    for (uint64_t i = 0; i < src->n_tensors; i++)
        assert_int_equal(flm_gguf_writer_write_tensor(w, src->tensors[i].data, src->tensors[i].nbytes, &err), FLM_OK);
    assert_int_equal(flm_gguf_writer_finish(w, &err), FLM_OK);
    flm_gguf_writer_free(w);
    flm_gguf_close(src);
}

static int32_t *tokenize(const flm_ctx *ctx, const char *text, int *n) {
    size_t m = 0;
    int32_t *ids = flm_tokenize_all(ctx, text, true, &m);
    assert_non_null(ids);
    assert_true(m > 0);
    *n = (int)m;
    return ids;
}

static int setup(void **state) {
    (void)state;
    snprintf(g_draft_path, sizeof g_draft_path, "%s", tu_tmp("draft", ".gguf"));
    write_perturbed(tu_data(MODEL), g_draft_path, 0.25f, 7);
    g_draft = g_draft_path;
    snprintf(g_flm_path, sizeof g_flm_path, "%s", tu_tmp("target", ".flm"));
    char args[8192];
    snprintf(args, sizeof args, "convert '%s' '%s' 2>&1", tu_data(MODEL), g_flm_path);
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    if (rc) fprintf(stderr, "convert failed (%d): %s\n", rc, out);
    free(out);
    return rc;
}

static int teardown(void **state) {
    (void)state;
    remove(g_draft_path);
    remove(g_flm_path);
    return 0;
}

/* ---- the acceptance rule and the sampler's distributions ------------------------------------------------------ */

/* |freq - p| within 5 standard deviations of a binomial count (+ one count of slack): with a fixed seed the test is
 * deterministic; a rule that does not keep p would be off by far more (checked against q below). */

static void test_accept_keeps_p(void **state) {
    (void)state;
    enum { V = 6 };
    const float p[V] = {0.05f, 0.30f, 0.25f, 0.0f, 0.15f, 0.25f};
    const float q[V] = {0.40f, 0.10f, 0.25f, 0.15f, 0.10f, 0.0f}; /* q covers a token p gives 0; p one q does not */
    flm_sampler_params sp = {.temp = 1, .top_k = 0, .top_p = 1, .seed = 1234};
    flm_sampler *s = flm_sampler_create(&sp, V);
    assert_non_null(s);
    const int M = 200000;
    double count[V] = {0}, drafted[V] = {0}, pd[V], qd[V];
    int n_acc = 0;
    for (int i = 0; i < M; i++) {
        int32_t x = flm_sampler_sample_probs(s, q), out = -1;
        assert_true(x >= 0 && x < V && q[x] > 0);
        drafted[x]++;
        bool acc = flm_sampler_accept(s, p, q, x, &out);
        assert_true(out >= 0 && out < V);
        if (acc) { assert_int_equal(out, x); n_acc++; }
        else assert_true(p[out] > q[out]); /* a replacement comes from max(0, p - q) */
        count[out]++;
    }
    for (int i = 0; i < V; i++) { pd[i] = p[i]; qd[i] = q[i]; }
    tu_expect_freqs(drafted, qd, V, M, "drafts (sample_probs)");
    tu_expect_freqs(count, pd, V, M, "accepted or replaced");
    /* the acceptance rate is sum min(p, q) = 0.05 + 0.10 + 0.25 + 0 + 0.10 + 0 = 0.50 */
    assert_true(fabs((double)n_acc / M - 0.50) < 5 * sqrt(0.25 / M));
    /* the test can fail: the drafts alone are far from p */
    assert_true(fabs(drafted[0] / M - p[0]) > 0.3);

    /* a certain draft (q NULL: n-gram lookup): token 2 is accepted with probability p[2], else p without it */
    memset(count, 0, sizeof count);
    n_acc = 0;
    for (int i = 0; i < M; i++) {
        int32_t out;
        if (flm_sampler_accept(s, p, NULL, 2, &out)) n_acc++;
        else assert_int_not_equal(out, 2);
        count[out]++;
    }
    tu_expect_freqs(count, pd, V, M, "certain draft");
    assert_true(fabs((double)n_acc / M - 0.25) < 5 * sqrt(0.25 * 0.75 / M));
    /* a token p gives nothing is always replaced; an out-of-range one too */
    int32_t out;
    assert_false(flm_sampler_accept(s, p, NULL, 3, &out));
    assert_true(out != 3 && p[out] > 0);
    assert_false(flm_sampler_accept(s, p, q, 99, &out));
    assert_true(out >= 0 && out < V && p[out] > 0);
    /* unusable weights draw nothing */
    const float zero[V] = {0}, neg[V] = {0.5f, -0.1f, 0.6f, 0, 0, 0};
    assert_int_equal(flm_sampler_sample_probs(s, zero), -1);
    assert_int_equal(flm_sampler_sample_probs(s, neg), -1);
    flm_sampler_free(s);
}

/* flm_sampler_probs is the distribution flm_sampler_sample draws from: temperature, top-k, top-p, greedy. */
static void test_probs_match_sample(void **state) {
    (void)state;
    enum { V = 8 };
    const float logits[V] = {1.0f, 3.0f, -2.0f, 2.5f, 0.0f, 2.5f, -1.0f, 1.5f};
    float probs[V];
    struct { float temp; int top_k; float top_p; float min_p; int support; } cases[] = {
        {0.0f, 0, 1.0f, 0, 1}, {1.0f, 0, 1.0f, 0, 8}, {0.7f, 3, 1.0f, 0, 3}, {1.3f, 0, 0.8f, 0, -1}, {1.0f, 4, 0.9f, 0, -1},
        /* min-p 0.3: the logits within log(0.3) of the largest (3.0): 3.0, 2.5, 2.5 */
        {1.0f, 0, 1.0f, 0.3f, 3}, {1.0f, 5, 0.99f, 0.3f, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        flm_sampler_params sp = {.temp = cases[c].temp, .top_k = cases[c].top_k, .top_p = cases[c].top_p, .seed = 99,
                                 .min_p = cases[c].min_p};
        flm_sampler *s = flm_sampler_create(&sp, V);
        flm_sampler_probs(s, logits, probs);
        double sum = 0, pd[V], count[V] = {0};
        int support = 0;
        for (int i = 0; i < V; i++) {
            assert_true(probs[i] >= 0);
            sum += probs[i];
            support += probs[i] > 0;
            pd[i] = probs[i];
        }
        assert_true(fabs(sum - 1) < 1e-5);
        if (cases[c].support > 0) assert_int_equal(support, cases[c].support);
        if (cases[c].temp == 0) assert_true(probs[1] == 1.0f); /* the argmax */
        if (cases[c].top_k == 3) assert_true(probs[1] > 0 && probs[3] > 0 && probs[5] > 0); /* the 3 largest */
        const int M = 100000;
        for (int i = 0; i < M; i++) count[flm_sampler_sample(s, logits)]++;
        tu_expect_freqs(count, pd, V, M, "flm_sampler_sample vs flm_sampler_probs");
        flm_sampler_free(s);
    }
}

/* top-k over a large vocabulary with many ties: exactly the k largest logits, ties to the lower id (the order the
 * sampler's full sort gave before it selected the k first). */
static int by_logit_desc(const void *a, const void *b, void *ctx) {
    const float *l = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (l[x] != l[y]) return l[x] < l[y] ? 1 : -1;
    return x - y;
}

static void test_top_k_large_vocab(void **state) {
    (void)state;
    enum { V = 5000, K = 40 };
    float *logits = malloc(V * sizeof *logits), *probs = malloc(V * sizeof *probs);
    int32_t *ids = malloc(V * sizeof *ids);
    uint64_t rng = 77;
    for (int i = 0; i < V; i++) {
        logits[i] = (float)(tu_rand_u64(&rng) % 60) / 8.0f; /* 60 levels: ties everywhere, also at the cut */
        ids[i] = i;
    }
    qsort_r(ids, V, sizeof *ids, by_logit_desc, logits);
    flm_sampler_params sp = {.temp = 0.9f, .top_k = K, .top_p = 1.0f, .seed = 5};
    flm_sampler *s = flm_sampler_create(&sp, V);
    flm_sampler_probs(s, logits, probs);
    for (int r = 0; r < V; r++) {
        if (r < K) assert_true(probs[ids[r]] > 0);
        else assert_true(probs[ids[r]] == 0);
    }
    flm_sampler_free(s);
    free(logits);
    free(probs);
    free(ids);
}

/* The logit edits against a hand-computed reference on stories260K's logits after a prompt: logit_bias (one token
 * +1.5, one banned), llama.cpp's repeat penalty and OpenAI's presence and frequency penalties over the last 8 tokens
 * of the history (bias first, as llama.cpp's chain): greedy takes the edited logits' order, sampling their softmax
 * (counted over keys), a banned token never comes; the log-probabilities are the raw logits' log-softmax. */
static void test_penalties_bias_logprobs(void **state) {
    (void)state;
    flm_ctx *ctx = open_model(tu_data(MODEL), FLM_MODE_RAM, N_CTX);
    const uint32_t V = n_vocab_of(ctx);
    int n;
    int32_t *hist = tokenize(ctx, "Once upon a time there was a little girl. The little girl had a little dog", &n);
    assert_true(n > 12);
    const float *lg;
    flm_error err;
    assert_int_equal(flm_eval_batch(ctx, hist, (uint32_t)n, 0, NULL, &lg, &err), FLM_OK);
    float *logits = malloc(V * sizeof *logits), *want = malloc(V * sizeof *want);
    memcpy(logits, lg, V * sizeof *logits);
    /* the reference: the 5th most likely token boosted, the 2nd banned; the 8 last tokens' counts */
    int32_t *order = malloc(V * sizeof *order), *worder = malloc(V * sizeof *worder);
    for (uint32_t i = 0; i < V; i++) order[i] = (int32_t)i;
    qsort_r(order, V, sizeof *order, by_logit_desc, logits);
    const int32_t boosted = order[4], banned = order[1];
    flm_logit_bias bias[] = {{boosted, 1.5f}, {banned, -INFINITY}, {(int32_t)V + 5, 3.0f} /* out of range: ignored */};
    const float rp = 1.3f, pres = 0.5f, freq = 0.3f;
    memcpy(want, logits, V * sizeof *want);
    want[boosted] += 1.5f;
    want[banned] = -INFINITY;
    int in_window = 0;
    for (uint32_t t = 0; t < V; t++) {
        int c = 0;
        for (int i = n - 8; i < n; i++) c += hist[i] == (int32_t)t;
        if (!c) continue;
        in_window++;
        want[t] = want[t] > 0 ? want[t] / rp : want[t] * rp;
        want[t] -= (float)c * freq + pres;
    }
    assert_true(in_window >= 5);
    flm_sampler_params sp = {.temp = 0, .top_k = 0, .top_p = 1, .seed = 3, .repeat_penalty = rp,
                             .presence_penalty = pres, .frequency_penalty = freq, .penalty_last_n = 8,
                             .bias = bias, .n_bias = 3};
    flm_sampler *g = flm_sampler_create(&sp, V);
    int32_t top[FLM_SAMPLER_DRAWS_MAX];
    assert_int_equal(flm_sampler_draws_at(g, logits, 0, hist, (size_t)n, FLM_SAMPLER_DRAWS_MAX, top, NULL),
                     FLM_SAMPLER_DRAWS_MAX);
    for (uint32_t i = 0; i < V; i++) worder[i] = (int32_t)i;
    qsort_r(worder, V, sizeof *worder, by_logit_desc, want);
    assert_memory_equal(top, worder, sizeof top);
    assert_int_equal(flm_sampler_sample_at(g, logits, 9, hist, (size_t)n), worder[0]);
    flm_sampler_free(g);
    /* sampling at temperature 1: the softmax of the edited logits, counted over keys */
    sp.temp = 1.0f;
    flm_sampler *smp = flm_sampler_create(&sp, V);
    double *count = calloc(V, sizeof *count), *pd = malloc(V * sizeof *pd), sum = 0;
    for (uint32_t i = 0; i < V; i++) sum += pd[i] = exp((double)want[i] - want[worder[0]]);
    for (uint32_t i = 0; i < V; i++) pd[i] /= sum;
    const int M = 200000;
    for (int k = 0; k < M; k++) count[flm_sampler_sample_at(smp, logits, (uint64_t)k, hist, (size_t)n)]++;
    tu_expect_freqs(count, pd, (int)V, M, "penalties and bias: frequencies vs the hand-computed softmax");
    assert_true(count[banned] == 0);
    /* without a history the penalties do nothing: only the bias */
    flm_sampler_params nb = sp;
    nb.temp = 0;
    flm_sampler *b = flm_sampler_create(&nb, V);
    float biased_max = -INFINITY;
    int32_t bmax = -1;
    for (uint32_t i = 0; i < V; i++) {
        float x = logits[i] + (i == (uint32_t)boosted ? 1.5f : 0) + (i == (uint32_t)banned ? -INFINITY : 0);
        if (x > biased_max) { biased_max = x; bmax = (int32_t)i; }
    }
    assert_int_equal(flm_sampler_sample_at(b, logits, 0, NULL, 0), bmax);
    flm_sampler_free(b);
    /* the probabilities drawn with (llama-server's post_sampling_probs): the softmax of the edited logits / T over
     * the top-k, cut at top-p, renormalized, from the hand-edited want[]; top-p as llama.cpp's chain applies it:
     * before the temperature, on the softmax over the top-k */
    for (int cut = 0; cut < 2; cut++) {
        const double T = 0.7;
        const int K = 6;
        double pk[6], pu[6], z = 0, zu = 0, c2 = 0, c3 = 0;
        for (int j = 0; j < K; j++) z += pk[j] = exp(((double)want[worder[j]] - want[worder[0]]) / T);
        for (int j = 0; j < K; j++) zu += pu[j] = exp((double)want[worder[j]] - want[worder[0]]);
        c2 = (pu[0] + pu[1]) / zu;
        c3 = c2 + pu[2] / zu;
        const double top_p = (c2 + c3) / 2; /* the cut: top-p over the untempered top-6's mass keeps 3 of the 6 */
        int keep = K;
        if (cut) {
            keep = 3;
            z = pk[0] + pk[1] + pk[2];
        }
        flm_sampler_params tp = sp;
        tp.temp = (float)T;
        tp.top_k = K;
        tp.top_p = cut ? (float)top_p : 1.0f;
        flm_sampler *ps = flm_sampler_create(&tp, V);
        int32_t pid[8];
        float pp[8];
        int got = -1;
        const float p2 = flm_sampler_top_probs(ps, logits, hist, (size_t)n, worder[1], 8, pid, pp, &got);
        assert_int_equal(got, keep);
        for (int j = 0; j < got; j++) {
            assert_int_equal(pid[j], worder[j]);
            assert_true(fabs(pp[j] - pk[j] / z) < 1e-5);
        }
        assert_true(keep > 1 && fabs(p2 - pk[1] / z) < 1e-5);
        assert_true(flm_sampler_top_probs(ps, logits, hist, (size_t)n, worder[K], 2, pid, pp, &got) == 0.0f);
        assert_int_equal(got, 2);
        assert_true(flm_sampler_top_probs(ps, logits, hist, (size_t)n, banned, 0, pid, pp, &got) == 0.0f);
        assert_int_equal(got, 0);
        flm_sampler_free(ps);
    }
    flm_sampler_params gpar = sp; /* greedy: the argmax of the edited logits with 1 */
    gpar.temp = 0;
    flm_sampler *gs = flm_sampler_create(&gpar, V);
    int32_t gid[4];
    float gpp[4];
    int gn = -1;
    assert_true(flm_sampler_top_probs(gs, logits, hist, (size_t)n, worder[0], 4, gid, gpp, &gn) == 1.0f);
    assert_true(gn == 1 && gid[0] == worder[0] && gpp[0] == 1.0f);
    assert_true(flm_sampler_top_probs(gs, logits, hist, (size_t)n, worder[1], 4, gid, gpp, &gn) == 0.0f);
    flm_sampler_free(gs);
    /* log-probabilities: the raw logits' log-softmax (no edit, temperature 1) */
    double lse = 0;
    for (uint32_t i = 0; i < V; i++) lse += exp((double)logits[i] - logits[order[0]]);
    lse = log(lse) + logits[order[0]];
    int32_t tid[5];
    float tlp[5];
    const float lp = flm_logprobs(logits, V, order[3], 5, tid, tlp);
    assert_true(fabs(lp - (logits[order[3]] - lse)) < 1e-5);
    for (int j = 0; j < 5; j++) {
        assert_int_equal(tid[j], order[j]);
        assert_true(fabs(tlp[j] - (logits[order[j]] - lse)) < 1e-5);
    }
    assert_true(flm_logprobs(logits, V, (int32_t)V, 0, tid, tlp) == -INFINITY);
    flm_sampler_free(smp);
    free(count);
    free(pd);
    free(logits);
    free(want);
    free(order);
    free(worder);
    free(hist);
    flm_close(ctx);
}

static void test_ngram_lookup(void **state) {
    (void)state;
    int32_t out[8];
    /* the last 3-gram (7 8 9) occurred at 1..3: what followed it */
    const int32_t a[] = {5, 7, 8, 9, 1, 2, 3, 4, 6, 7, 8, 9};
    assert_int_equal(spec_ngram_lookup(a, 12, 3, out, 4), 4);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[3], 4);
    assert_int_equal(spec_ngram_lookup(a, 12, 3, out, 2), 2); /* at most cap */
    /* the most recent occurrence wins; a longer n-gram before a shorter one */
    const int32_t b[] = {1, 2, 10, 2, 11, 3, 1, 2, 12, 9, 1, 2};
    assert_int_equal(spec_ngram_lookup(b, 12, 3, out, 3), 3); /* 9 1 2? no; 1 2 at 6..7 -> 12 9 1 */
    assert_int_equal(out[0], 12);
    assert_int_equal(out[1], 9);
    const int32_t c[] = {4, 2, 10, 3, 2, 11, 5, 2};
    assert_int_equal(spec_ngram_lookup(c, 8, 3, out, 3), 3); /* only the 1-gram "2" recurs: at 4 -> 11 5 2 */
    assert_int_equal(out[0], 11);
    assert_int_equal(out[2], 2);
    /* nothing recurs; too short */
    const int32_t d[] = {1, 2, 3, 4};
    assert_int_equal(spec_ngram_lookup(d, 4, 3, out, 4), 0);
    assert_int_equal(spec_ngram_lookup(d, 1, 3, out, 4), 0);
    /* a run of one token: the continuation stops at the end of the text */
    const int32_t e[] = {6, 6, 6, 6};
    assert_int_equal(spec_ngram_lookup(e, 4, 3, out, 8), 1);
    assert_int_equal(out[0], 6);
    assert_int_equal(spec_ngram_lookup(e, 4, 3, out, 0), 0);
}

/* ---- greedy: the same tokens as plain decoding ------------------------------------------------------------------ */

static void check_greedy_draft(flm_mode mode, const char *target_path) {
    flm_ctx *plain = open_model(target_path, mode, N_CTX);
    int n_prompt;
    int32_t *prompt = tokenize(plain, "Once upon a time", &n_prompt);
    enum { N = 96 };
    int32_t ref[N], got[N];
    int n_ref = gen_plain(plain, prompt, n_prompt, N, ref);
    assert_true(n_ref >= 32);
    flm_close(plain);
    const int lambdas[] = {1, 3, 8};
    for (size_t l = 0; l < 3; l++) {
        flm_ctx *target = open_model(target_path, mode, N_CTX), *draft = open_model(g_draft, FLM_MODE_RAM, N_CTX);
        flm_spec_stats st;
        int n = gen_spec(target, draft, false, lambdas[l], NULL, prompt, n_prompt, N, got, &st);
        print_message("mode %s, --draft-n %d: %d tokens, %llu passes, drafted %llu, accepted %llu\n",
                      flm_mode_name(mode), lambdas[l], n, (unsigned long long)st.n_passes,
                      (unsigned long long)st.n_drafted, (unsigned long long)st.n_accepted);
        assert_int_equal(n, n_ref);
        assert_memory_equal(got, ref, (size_t)n * sizeof *got);
        assert_true(st.n_accepted > 0);               /* the draft helps ... */
        assert_true(st.n_accepted < st.n_drafted);    /* ... and is sometimes wrong */
        assert_true(st.n_passes < (uint64_t)n);       /* fewer target passes than tokens */
        assert_int_equal(st.n_gen, (uint64_t)n);
        /* every pass evaluates the last token and the drafts */
        assert_int_equal(st.target_tokens, st.n_passes + st.n_drafted);
        /* the draft re-evaluates at most the last accepted draft and the new token, then its proposals but the last:
         * never the text again (the prompt, fed before generating, does not count) */
        assert_true(st.draft_tokens <= st.n_steps * (uint64_t)(lambdas[l] + 1));
        assert_true(st.draft_tokens >= st.n_steps);
        flm_stats ts;
        flm_get_stats(target, &ts);
        assert_int_equal(ts.n_tokens, (uint64_t)n_prompt + st.target_tokens);
        flm_close(target);
        flm_close(draft);
    }
    free(prompt);
}

static void test_greedy_draft_ram(void **state) {
    (void)state;
    check_greedy_draft(FLM_MODE_RAM, tu_data(MODEL));
}

static void test_greedy_draft_flash(void **state) {
    (void)state;
    check_greedy_draft(FLM_MODE_NAIVE, g_flm_path); /* every layer's FFN read from the file at every pass */
}

static void test_greedy_ngram(void **state) {
    (void)state;
    const char *text = "Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had";
    flm_ctx *plain = open_model(tu_data(MODEL), FLM_MODE_RAM, N_CTX);
    int n_prompt;
    int32_t *prompt = tokenize(plain, text, &n_prompt);
    enum { N = 64 };
    int32_t ref[N], got[N];
    int n_ref = gen_plain(plain, prompt, n_prompt, N, ref);
    flm_close(plain);
    const int lambdas[] = {1, 4, 8};
    for (size_t l = 0; l < 3; l++) {
        flm_ctx *target = open_model(tu_data(MODEL), FLM_MODE_RAM, N_CTX);
        flm_spec_stats st;
        int n = gen_spec(target, NULL, true, lambdas[l], NULL, prompt, n_prompt, N, got, &st);
        print_message("n-gram, --draft-n %d: %d tokens, %llu passes, drafted %llu, accepted %llu, %llu plain\n",
                      lambdas[l], n, (unsigned long long)st.n_passes, (unsigned long long)st.n_drafted,
                      (unsigned long long)st.n_accepted, (unsigned long long)st.n_plain);
        assert_int_equal(n, n_ref);
        assert_memory_equal(got, ref, (size_t)n * sizeof *got);
        assert_true(st.n_accepted > 0);
        assert_true(st.n_passes < (uint64_t)n);
        assert_int_equal(st.draft_tokens, 0);
        flm_close(target);
    }
    free(prompt);
}

/* ---- sampling through the whole loop ---------------------------------------------------------------------------- */

/* With top-k 3 every token has 3 candidates, so the joint distribution of the first three generated tokens has 27
 * cells: computed exactly from the target's distributions, and counted over many speculative generations (each of 4
 * tokens: the first from the prompt's logits, then a step with drafts drawn with the noise of their positions:
 * accepted when they are the target's draw there, else replaced by it, the extra token), one seed per generation. */

static void test_sampling_distribution(void **state) {
    (void)state;
    flm_ctx *ref = open_model(tu_data(MODEL), FLM_MODE_RAM, N_CTX);
    flm_ctx *dref = open_model(g_draft, FLM_MODE_RAM, N_CTX);
    const uint32_t V = n_vocab_of(ref);
    int n_prompt;
    int32_t *prompt = tokenize(ref, "Once upon a time there was a", &n_prompt);
    flm_sampler_params sp = {.temp = 1.0f, .top_k = 3, .top_p = 1.0f, .seed = 2024};
    flm_sampler *ps = flm_sampler_create(&sp, V);
    float *p = malloc(V * sizeof *p);
    const float *logits;
    flm_error err;
    /* the exact joint of (t1, t2, t3) under the target: cell a * 9 + b * 3 + c holds tokens cand[cell][0..2] */
    double joint[27], djoint[27];
    int32_t cand[27][3];
    tu_joint3(ref, prompt, n_prompt, ps, cand, joint);
    /* the draft's own probabilities of the same cells: what accepting every draft would give */
    for (int cell = 0; cell < 27; cell++) {
        double q = 1;
        assert_int_equal(flm_eval_batch(dref, prompt, (uint32_t)n_prompt, 0, NULL, &logits, &err), FLM_OK);
        for (int k = 0; k < 3; k++) {
            flm_sampler_probs(ps, logits, p);
            q *= p[cand[cell][k]];
            if (k < 2) assert_int_equal(flm_eval(dref, cand[cell][k], n_prompt + k, &logits, &err), FLM_OK);
        }
        djoint[cell] = q;
    }
    /* speculative generations */
    flm_ctx *target = open_model(tu_data(MODEL), FLM_MODE_RAM, N_CTX), *draft = open_model(g_draft, FLM_MODE_RAM, N_CTX);
    flm_session *s = spec_session(target, draft, false, 4, &sp);
    assert_int_equal(flm_session_feed(s, prompt, (size_t)n_prompt, &err), FLM_OK);
#ifdef FLM_SANITIZED_BUILD
    const int M = 3000;
#else
    const int M = 12000;
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
        collect c = {toks, 0, 4, s, n_prompt};
        flm_gen_params gp;
        flm_gen_params_default(&gp);
        gp.max_tokens = 4;
        assert_int_equal(flm_session_generate(s, &gp, collect_gen, &c, NULL, &err), FLM_OK);
        assert_int_equal(c.n, 4); /* stories260K's top 3 here hold no end-of-text token */
        int cell = -1;
        for (int k = 0; k < 27 && cell < 0; k++)
            if (cand[k][0] == toks[0] && cand[k][1] == toks[1] && cand[k][2] == toks[2]) cell = k;
        if (cell < 0) fail_msg("tokens %d %d %d are not among the target's top-3 paths", toks[0], toks[1], toks[2]);
        count[cell]++;
    }
    flm_spec_stats st;
    flm_session_spec_stats(s, &st);
    print_message("sampling: %d generations, drafted %llu, accepted %llu\n", M, (unsigned long long)st.n_drafted,
                  (unsigned long long)st.n_accepted);
    assert_true(st.n_accepted > 0 && st.n_accepted < st.n_drafted);
    tu_expect_freqs(count, joint, 27, M, "speculative sampling, joint of the first 3 tokens");
    /* the test can fail: the draft's own joint is far from the target's in some cell */
    double far = 0;
    for (int k = 0; k < 27; k++) far = fmax(far, fabs(djoint[k] - joint[k]));
    print_message("largest |draft - target| over the 27 cells: %.4f\n", far);
    assert_true(far > 10 * sqrt(0.25 / M));
    flm_session_free(s);
    flm_sampler_free(ps);
    flm_close(target);
    flm_close(draft);
    flm_close(ref);
    flm_close(dref);
    free(p);
    free(prompt);
}

/* ---- refusals ----------------------------------------------------------------------------------------------------- */

/* A seed is a seed with a draft model too: sampled text with the draft (lambda 1, 4, 8) equals plain sampling's with
 * the same seed token for token, drafts accepted and rejected (the draft is a perturbed copy: its races end as the
 * target's only when their distributions agree). */
static void test_seed_draft_model(void **state) {
    (void)state;
    flm_ctx *ref = open_model(tu_data(MODEL), FLM_MODE_RAM, N_CTX);
    int n_prompt;
    int32_t *prompt = tokenize(ref, "Once upon a time there was a", &n_prompt);
    flm_sampler_params sp;
    flm_sampler_params_default(&sp);
    sp.seed = 7;
    enum { N = 64 };
    int32_t want[N], got[N];
    flm_session *s = NULL;
    flm_error err;
    if (flm_session_create(ref, &s, &err) || flm_session_sampling(s, &sp, &err)) fail_msg("session: %s", err.msg);
    assert_int_equal(flm_session_feed(s, prompt, (size_t)n_prompt, &err), FLM_OK);
    collect c = {want, 0, N, s, n_prompt};
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = N;
    assert_int_equal(flm_session_generate(s, &gp, collect_gen, &c, NULL, &err), FLM_OK);
    const int n_want = c.n;
    assert_true(n_want >= N / 2);
    flm_session_free(s);
    flm_close(ref);
    const int lambdas[] = {1, 4, 8};
    uint64_t acc = 0, drafted = 0;
    for (int l = 0; l < 3; l++) {
        flm_ctx *target = open_model(tu_data(MODEL), FLM_MODE_RAM, N_CTX), *draft = open_model(g_draft, FLM_MODE_RAM, N_CTX);
        flm_spec_stats st;
        int n = gen_spec(target, draft, false, lambdas[l], &sp, prompt, n_prompt, N, got, &st);
        print_message("seed 7, draft model, --draft-n %d: %d tokens, %llu passes, drafted %llu, accepted %llu\n",
                      lambdas[l], n, (unsigned long long)st.n_passes, (unsigned long long)st.n_drafted,
                      (unsigned long long)st.n_accepted);
        assert_int_equal(n, n_want);
        assert_memory_equal(got, want, (size_t)n * sizeof *got);
        acc += st.n_accepted;
        drafted += st.n_drafted;
        flm_close(target);
        flm_close(draft);
    }
    assert_true(acc > 0 && acc < drafted);
    free(prompt);
}

static void test_vocab_mismatch(void **state) {
    (void)state;
    const char *other = tu_tmp("othervocab", ".gguf");
    char other_path[4096];
    snprintf(other_path, sizeof other_path, "%s", other);
    write_other_vocab(tu_data(MODEL), other_path, 300, "zzz-not-a-piece", -1);
    flm_ctx *t = open_model(tu_data(MODEL), FLM_MODE_RAM, 64), *d = open_model(other_path, FLM_MODE_RAM, 64);
    flm_error err;
    assert_int_equal(flm_spec_check_vocab(t, "T.gguf", d, "D.gguf", &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "T.gguf"));
    assert_non_null(strstr(err.msg, "D.gguf"));
    assert_non_null(strstr(err.msg, "token 300"));
    assert_non_null(strstr(err.msg, "zzz-not-a-piece"));
    flm_close(d);
    /* the same vocabulary with another BOS */
    write_other_vocab(tu_data(MODEL), other_path, -1, NULL, 2);
    d = open_model(other_path, FLM_MODE_RAM, 64);
    assert_int_equal(flm_spec_check_vocab(t, "T.gguf", d, "D.gguf", &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "BOS"));
    flm_close(d);
    /* the perturbed copy shares it */
    d = open_model(g_draft, FLM_MODE_RAM, 64);
    assert_int_equal(flm_spec_check_vocab(t, "T.gguf", d, "D.gguf", &err), FLM_OK);
    flm_close(d);
    /* a model of another family: SmolLM2's 49152-token vocabulary (when pulled) */
    const char *smol = tu_model("smollm2-135m");
    if (smol) {
        d = open_model(smol, FLM_MODE_RAM, 64);
        assert_int_equal(flm_spec_check_vocab(t, "T.gguf", d, "D.gguf", &err), FLM_ERR_ARG);
        assert_non_null(strstr(err.msg, "49152"));
        flm_close(d);
    }
    /* the CLI refuses before generating, naming both files */
    write_other_vocab(tu_data(MODEL), other_path, 300, "zzz-not-a-piece", -1);
    char args[8192], *out = NULL;
    snprintf(args, sizeof args, "run -m '%s' --draft '%s' -p 'Once' -n 8 -c 64 2>&1", tu_data(MODEL), other_path);
    assert_int_equal(tu_run_cli(args, &out), 1);
    if (!strstr(out, other_path) || !strstr(out, tu_data(MODEL)) || !strstr(out, "tokenizer"))
        fail_msg("the refusal does not name both files: %s", out);
    free(out);
    flm_close(t);
    remove(other_path);
}

/* ---- the real pair: Qwen2.5-Coder 0.5B drafting for 1.5B ----------------------------------------------------------- */

static void test_real_qwen_pair(void **state) {
    (void)state;
    const char *t_path = tu_model("qwen2.5-coder-1.5b");
    if (!t_path) { skip(); return; }
    char tp[4096];
    snprintf(tp, sizeof tp, "%s", t_path);
    const char *d_path = tu_model("qwen2.5-coder-0.5b");
    if (!d_path) { skip(); return; }
    char dp[4096];
    snprintf(dp, sizeof dp, "%s", d_path);
#ifdef FLM_SANITIZED_BUILD
    enum { N = 4 }; /* the 1.5B under AddressSanitizer: a few tokens */
#else
    enum { N = 16 };
#endif
    const char *code = "def quicksort(arr):\n    \"\"\"Sort a list of numbers.\"\"\"\n    if len(arr) <= 1:\n";
    flm_ctx *plain = open_model(tp, FLM_MODE_RAM, 128);
    flm_error err;
    int n_prompt;
    int32_t *prompt = tokenize(plain, code, &n_prompt);
    int32_t ref[N], got[N];
    int n_ref = gen_plain(plain, prompt, n_prompt, N, ref);
    assert_int_equal(n_ref, N);
    flm_ctx *draft = open_model(dp, FLM_MODE_RAM, 128);
    assert_int_equal(flm_spec_check_vocab(plain, tp, draft, dp, &err), FLM_OK);
    flm_spec_stats st;
    int n = gen_spec(plain, draft, false, 4, NULL, prompt, n_prompt, N, got, &st); /* plain rewinds to 0 */
    print_message("qwen2.5-coder 0.5B -> 1.5B: %d tokens, %llu passes, drafted %llu, accepted %llu\n", n,
                  (unsigned long long)st.n_passes, (unsigned long long)st.n_drafted, (unsigned long long)st.n_accepted);
    assert_int_equal(n, n_ref);
    assert_memory_equal(got, ref, (size_t)n * sizeof *got);
    assert_true(st.n_accepted > 0);
    flm_close(draft);
    flm_close(plain);
    free(prompt);
}

/* ---- the command line ------------------------------------------------------------------------------------------- */

static void expect_cli(const char *args, int want_rc, const char *want_text, char **out_keep) {
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    if (rc != want_rc) fail_msg("flashlm %s: exit %d, want %d; output:\n%s", args, rc, want_rc, out);
    if (want_text && !strstr(out, want_text)) fail_msg("flashlm %s: output lacks '%s':\n%s", args, want_text, out);
    if (out_keep) *out_keep = out;
    else free(out);
}

static void test_cli(void **state) {
    (void)state;
    char m[4096]; /* tu_data's buffer is reused by the next call */
    snprintf(m, sizeof m, "%s", tu_data(MODEL));
    char args[8192], *plain = NULL, *spec = NULL, *log = NULL;
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 48 --temp 0 -t 1 -c 128 2>/dev/null", m);
    expect_cli(args, 0, NULL, &plain);
    /* a draft model: the same text on stdout; the statistics on stderr */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 48 --temp 0 -t 1 -c 128 --draft '%s' "
             "--draft-n 3 2>/dev/null", m, g_draft);
    expect_cli(args, 0, NULL, &spec);
    assert_string_equal(spec, plain);
    free(spec);
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 48 --temp 0 -t 1 -c 128 --draft '%s' --stats "
             "2>&1 >/dev/null", m, g_draft);
    expect_cli(args, 0, "tokens per pass; drafted", &log);
    assert_non_null(strstr(log, "plan: draft"));
    assert_non_null(strstr(log, "accepted"));
    assert_non_null(strstr(log, "per generated token"));
    free(log);
    /* from the .flm, streamed (naive), with a budget that holds both: the same text, and the budget split */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 48 --temp 0 -t 1 -c 128 --mode naive --mem 8M "
             "--draft '%s' 2>/dev/null", g_flm_path, g_draft);
    expect_cli(args, 0, NULL, &spec);
    assert_string_equal(spec, plain);
    free(spec);
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 48 --temp 0 -t 1 -c 128 --mode naive --mem 8M "
             "--draft '%s' 2>&1 >/dev/null", g_flm_path, g_draft);
    expect_cli(args, 0, "budget 8.00 MiB = draft and buffers", NULL);
    /* the n-gram lookup */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 48 --temp 0 -t 1 -c 128 --draft-ngram "
             "--draft-n 5 2>/dev/null", m);
    expect_cli(args, 0, NULL, &spec);
    assert_string_equal(spec, plain);
    free(spec);
    free(plain);
    /* sampling runs too (its text differs from plain sampling's: the random draws are used differently) */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 32 -t 1 -c 128 --temp 0.8 --draft '%s' 2>&1",
             m, g_draft);
    expect_cli(args, 0, "accepted", NULL);
    /* help and refusals */
    expect_cli("run --help", 0, "--draft-ngram", NULL);
    expect_cli("run --help", 0, "--draft-n N", NULL);
    expect_cli("chat --help", 0, "--draft MODEL", NULL);
    snprintf(args, sizeof args, "run -m '%s' --draft '%s' --draft-ngram 2>&1", m, g_draft);
    expect_cli(args, 2, "exclude each other", NULL);
    snprintf(args, sizeof args, "run -m '%s' --draft-n 3 2>&1", m);
    expect_cli(args, 2, "--draft-n needs --draft", NULL);
    snprintf(args, sizeof args, "run -m '%s' --draft '%s' --draft-n 0 2>&1", m, g_draft);
    expect_cli(args, 2, "bad --draft-n", NULL);
    snprintf(args, sizeof args, "run -m '%s' --draft 2>&1", m);
    expect_cli(args, 2, "needs a value", NULL);
    snprintf(args, sizeof args, "run -m '%s' --draft /nonexistent/draft.gguf -n 4 2>&1", m);
    expect_cli(args, 1, "/nonexistent/draft.gguf", NULL);
    /* budgets: the draft alone does not fit; the draft leaves the target too little */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once' -n 8 -c 128 --mem 600K --draft '%s' 2>&1", m, g_draft);
    expect_cli(args, 1, "--mem covers the draft and the target together", NULL);
    snprintf(args, sizeof args, "run -m '%s' -p 'Once' -n 8 -c 128 --mem 2M --draft '%s' 2>&1", m, g_draft);
    expect_cli(args, 1, "what the draft leaves", NULL);
    /* a sparse target whose plan takes the whole budget: the n-gram buffers are taken out of it (flm_plan_split plans
     * it again with that much less; calibrate a copy first) */
    const char *cal = tu_tmp("calibrated", ".flm");
    char cal_path[4096];
    snprintf(cal_path, sizeof cal_path, "%s", cal);
    size_t len;
    uint8_t *bytes = tu_read_file(g_flm_path, &len);
    tu_write_file(cal_path, bytes, len);
    free(bytes);
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' -t 1 2>&1", cal_path,
             tu_data("text/tinystories_sample.txt"));
    expect_cli(args, 0, NULL, NULL);
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 24 --temp 0 -t 1 -c 128 --mode sparse --mem 1.5M "
             "--draft-ngram -v 2>&1", cal_path);
    expect_cli(args, 0, "the target gets a budget of 1.49 MiB", &log);
    assert_non_null(strstr(log, "budget 1.50 MiB = n-gram buffers"));
#ifndef FLM_SANITIZED_BUILD /* peak RSS includes AddressSanitizer's shadow memory */
    assert_non_null(strstr(log, "(within the budget"));
#endif
    free(log);
    remove(cal_path);
    /* chat: a conversation with a draft model gives the same replies */
    snprintf(args, sizeof args, "printf 'Hello\\nMore\\n' | '%s' chat -m '%s' -n 24 --temp 0 -t 1 -c 256 2>/dev/null",
             FLM_CLI, m);
    FILE *pp = popen(args, "r");
    char a[4096] = "", b[4096] = "";
    size_t na = fread(a, 1, sizeof a - 1, pp);
    pclose(pp);
    a[na] = 0;
    snprintf(args, sizeof args, "printf 'Hello\\nMore\\n' | '%s' chat -m '%s' -n 24 --temp 0 -t 1 -c 256 --draft '%s' "
             "2>/dev/null", FLM_CLI, m, g_draft);
    pp = popen(args, "r");
    size_t nb = fread(b, 1, sizeof b - 1, pp);
    pclose(pp);
    b[nb] = 0;
    assert_true(na > 10);
    assert_string_equal(a, b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accept_keeps_p),
        cmocka_unit_test(test_probs_match_sample),
        cmocka_unit_test(test_top_k_large_vocab),
        cmocka_unit_test(test_penalties_bias_logprobs),
        cmocka_unit_test(test_ngram_lookup),
        cmocka_unit_test(test_greedy_draft_ram),
        cmocka_unit_test(test_greedy_draft_flash),
        cmocka_unit_test(test_greedy_ngram),
        cmocka_unit_test(test_sampling_distribution),
        cmocka_unit_test(test_seed_draft_model),
        cmocka_unit_test(test_vocab_mismatch),
        cmocka_unit_test(test_real_qwen_pair),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
