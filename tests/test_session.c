/* test_session.c — the session API (include/flashlm.h, "Sessions"; src/session/session.c) on stories260K: greedy
 * generation equals the plain evaluate-and-argmax loop, stop strings end the text before them and never release a
 * part of one, a new prompt keeps the common prefix and still gives the same continuation, cancellation, max_tokens,
 * a full context, the context shift, per-request statistics; speculative decoding through the session gives the same
 * tokens, text, stops and held tokens as plain decoding. Sequences (flm_params.n_seq, flm_session_create_seq): four
 * sessions on one context of four sequences, interleaved on one thread or running on four threads at once (plain
 * and with n-gram speculation, GGUF and a .flm streamed under a budget), each give the tokens its prompt gives alone
 * in a context of one sequence; the plan counts a KV cache and a logits row per sequence. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "runtime/runtime.h" /* the joined passes' queue, to hold requests until they wait together */
#include "testutil.h"

#define MODEL "models/stories260K/stories260K.gguf"

static flm_ctx *open_model(int n_ctx) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = n_ctx;
    flm_ctx *ctx = NULL;
    flm_error err;
    assert_int_equal(flm_open(tu_data(MODEL), &p, &ctx, &err), FLM_OK);
    return ctx;
}

typedef struct {
    char text[8192];
    size_t len;
    int32_t ids[1024];
    int n_ids, n_calls, cancel_after;
    flm_session *s;
    bool saw_eog;
} collect;

static bool on_token(void *user, const flm_gen_token *t) {
    collect *c = user;
    c->n_calls++;
    assert_true(c->len + t->len < sizeof c->text);
    memcpy(c->text + c->len, t->text, t->len);
    c->len += t->len;
    c->text[c->len] = 0;
    if (t->eog) c->saw_eog = true;
    else if (t->id >= 0) c->ids[c->n_ids++] = t->id;
    if (t->id >= 0 && !t->eog) assert_true(t->stats.compute_ms >= 0);
    if (c->cancel_after && c->n_ids == c->cancel_after) flm_session_cancel(c->s);
    return true;
}

/* Greedy: the session's tokens are argmax of flm_eval's logits, token for token; statistics count them. */
static void test_greedy_equals_plain_loop(void **state) {
    (void)state;
    flm_ctx *ctx = open_model(256);
    size_t n = 0;
    int32_t *ids = flm_tokenize_all(ctx, "Once upon a time", true, &n);
    assert_non_null(ids);
    /* the plain loop */
    flm_model_info info;
    flm_get_info(ctx, &info);
    int32_t want[40];
    const float *logits = NULL;
    flm_error err;
    assert_int_equal(flm_eval_batch(ctx, ids, (uint32_t)n, 0, NULL, &logits, &err), FLM_OK);
    for (int i = 0; i < 40; i++) {
        int32_t best = 0;
        for (uint32_t v = 1; v < info.n_vocab; v++)
            if (logits[v] > logits[best]) best = (int32_t)v;
        want[i] = best;
        assert_int_equal(flm_eval(ctx, best, (int32_t)n + i, &logits, &err), FLM_OK);
    }
    flm_session *s = NULL;
    assert_int_equal(flm_session_create(ctx, &s, &err), FLM_OK);
    assert_int_equal(flm_session_feed(s, ids, n, &err), FLM_OK);
    assert_int_equal(flm_session_n_past(s), (int32_t)n);
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = 40;
    static collect c;
    memset(&c, 0, sizeof c);
    flm_gen_result r;
    assert_int_equal(flm_session_generate(s, &gp, on_token, &c, &r, &err), FLM_OK);
    int n_cmp = c.n_ids < 40 ? c.n_ids : 40;
    for (int i = 0; i < n_cmp; i++) assert_int_equal(c.ids[i], want[i]);
    assert_true(r.eog || r.n_gen == 40);
    assert_int_equal(r.limit, !r.eog);
    assert_int_equal(flm_session_n_past(s), (int32_t)n + 39); /* the 40th is sampled, not evaluated */
    flm_session_stats st;
    flm_session_get_stats(s, &st);
    assert_int_equal(st.n_prompt, n);
    assert_int_equal(st.n_gen, (uint64_t)r.n_gen);
    assert_true(st.gen_ms > 0 && st.prompt_ms > 0);
    flm_session_free(s);
    free(ids);
    flm_close(ctx);
}

/* Run one greedy generation of up to max tokens from text with the given stop strings. */
static flm_gen_result gen_text(flm_session *s, const char *text, long max, const char *const *stop, int n_stop,
                               collect *c) {
    flm_error err;
    memset(c, 0, sizeof *c);
    c->s = s;
    assert_int_equal(flm_session_prompt_text(s, text, strlen(text), FLM_TOKENIZE_ADD_SPECIAL, NULL, &err), FLM_OK);
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = max;
    for (int i = 0; i < n_stop; i++) gp.stop[i] = stop[i];
    gp.n_stop = n_stop;
    flm_gen_result r;
    assert_int_equal(flm_session_generate(s, &gp, on_token, c, &r, &err), FLM_OK);
    return r;
}

/* A stop string ends the text right before it; text that could begin it is held back, not released. */
static void test_stop_strings(void **state) {
    (void)state;
    flm_ctx *ctx = open_model(256);
    flm_session *s = NULL;
    flm_error err;
    assert_int_equal(flm_session_create(ctx, &s, &err), FLM_OK);
    static collect full, cut, miss;
    flm_gen_result r = gen_text(s, "Once upon a time", 60, NULL, 0, &full);
    assert_false(r.stopped);
    assert_true(full.len > 40);
    /* a stop string from the middle of the text: the first 5 bytes at offset 20 */
    char stop[6];
    memcpy(stop, full.text + 20, 5);
    stop[5] = 0;
    const char *first = strstr(full.text, stop);
    assert_non_null(first);
    const char *stops[2] = {"zzzz-never", stop};
    r = gen_text(s, "Once upon a time", 60, stops, 2, &cut);
    assert_true(r.stopped);
    assert_int_equal(r.stop_index, 1);
    assert_int_equal(cut.len, (size_t)(first - full.text));
    assert_memory_equal(cut.text, full.text, cut.len);
    /* a stop string that never completes: everything is released in the end, the same text */
    char almost[8];
    memcpy(almost, full.text + 20, 5);
    memcpy(almost + 5, "#@", 3);
    const char *stops2[1] = {almost};
    r = gen_text(s, "Once upon a time", 60, stops2, 1, &miss);
    assert_false(r.stopped);
    assert_int_equal(miss.len, full.len);
    assert_memory_equal(miss.text, full.text, full.len);
    /* bad stop strings are refused */
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.stop[0] = "";
    gp.n_stop = 1;
    assert_int_equal(flm_session_generate(s, &gp, NULL, NULL, NULL, &err), FLM_ERR_ARG);
    flm_session_free(s);
    flm_close(ctx);
}

/* A new prompt keeps the common prefix of what the cache holds, and continues exactly as a fresh session. */
static void test_prompt_reuse(void **state) {
    (void)state;
    flm_ctx *ctx = open_model(256);
    flm_session *s = NULL;
    flm_error err;
    assert_int_equal(flm_session_create(ctx, &s, &err), FLM_OK);
    static collect a, b, fresh;
    gen_text(s, "Once upon a time, there was a little dog", 20, NULL, 0, &a);
    size_t reused = 0;
    const char *p2 = "Once upon a time, there was a little cat";
    assert_int_equal(flm_session_prompt_text(s, p2, strlen(p2), FLM_TOKENIZE_ADD_SPECIAL, &reused, &err), FLM_OK);
    assert_true(reused >= 5);
    gen_text(s, p2, 30, NULL, 0, &b);
    flm_session_stats st;
    flm_session_get_stats(s, &st);
    assert_true(st.n_reused > 5);
    flm_session_free(s);
    flm_close(ctx);
    ctx = open_model(256);
    assert_int_equal(flm_session_create(ctx, &s, &err), FLM_OK);
    gen_text(s, p2, 30, NULL, 0, &fresh);
    assert_int_equal(b.len, fresh.len);
    assert_memory_equal(b.text, fresh.text, b.len);
    flm_session_free(s);
    flm_close(ctx);
}

/* Cancellation stops before the next token; the flag is cleared for the next generation. */
static void test_cancel_and_limits(void **state) {
    (void)state;
    flm_ctx *ctx = open_model(32);
    flm_session *s = NULL;
    flm_error err;
    assert_int_equal(flm_session_create(ctx, &s, &err), FLM_OK);
    static collect c;
    memset(&c, 0, sizeof c);
    c.s = s;
    c.cancel_after = 3;
    assert_int_equal(flm_session_prompt_text(s, "Once", 4, FLM_TOKENIZE_ADD_SPECIAL, NULL, &err), FLM_OK);
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = 20;
    flm_gen_result r;
    assert_int_equal(flm_session_generate(s, &gp, on_token, &c, &r, &err), FLM_OK);
    assert_true(r.cancelled);
    assert_int_equal(r.n_gen, 3);
    /* a full context: 32 tokens, no shift */
    r = gen_text(s, "Once", 100, NULL, 0, &c);
    assert_false(r.cancelled);
    assert_true(r.ctx_full || r.eog);
    if (r.ctx_full) assert_int_equal(flm_session_n_past(s), 32);
    /* the shift: generation goes on past the context */
    flm_session_set_shift(s, true, 1);
    r = gen_text(s, "Once", 100, NULL, 0, &c);
    assert_false(r.ctx_full);
    flm_session_stats st;
    flm_session_get_stats(s, &st);
    if (!r.eog) assert_true(st.n_shifts > 0);
    /* a prompt that leaves no room for a reply */
    int32_t ids[32];
    for (int i = 0; i < 32; i++) ids[i] = 1 + i;
    assert_int_equal(flm_session_prompt(s, ids, 32, NULL, &err), FLM_ERR_CONTEXT);
    assert_int_equal(flm_session_prompt(s, ids, 0, NULL, &err), FLM_ERR_ARG);
    assert_int_equal(flm_session_prompt(s, ids, 31, NULL, &err), FLM_OK);
    flm_session_free(s);
    flm_close(ctx);
}

/* A prompt evaluated in chunks stops at a cancellation (FLM_ERR_CANCELLED) before the next chunk, the context holding
 * the chunks evaluated; a cancellation set before the call is cleared by it; the next prompt evaluates the rest. */
typedef struct {
    flm_session *s;
    size_t cancel_at, calls, last;
} prog;

static void on_prog(void *user, size_t processed, size_t total, size_t cached) {
    prog *p = user;
    (void)total;
    (void)cached;
    p->calls++;
    p->last = processed;
    if (processed >= p->cancel_at) flm_session_cancel(p->s);
}

static void test_prompt_cancel(void **state) {
    (void)state;
    flm_ctx *ctx = open_model(256);
    flm_session *s = NULL;
    flm_error err;
    assert_int_equal(flm_session_create(ctx, &s, &err), FLM_OK);
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = 1 + (i * 7) % 500;
    prog p = {.s = s, .cancel_at = 24};
    flm_session_cancel(s); /* pending from before: cleared by the call */
    assert_int_equal(flm_session_prompt_progress(s, ids, 100, 10, on_prog, &p, NULL, &err), FLM_ERR_CANCELLED);
    assert_non_null(strstr(err.msg, "cancelled after 30 of its 100 tokens"));
    assert_int_equal(p.last, 30); /* reports at 0, 10, 20, 30: the cancellation asked at 30 stops it */
    assert_int_equal(p.calls, 4);
    assert_int_equal(flm_session_n_past(s), 30);
    size_t reused = 0;
    p.cancel_at = 1000;
    assert_int_equal(flm_session_prompt_progress(s, ids, 100, 10, on_prog, &p, &reused, &err), FLM_OK);
    assert_int_equal(reused, 30); /* the chunks evaluated are kept */
    assert_int_equal(flm_session_n_past(s), 100);
    flm_session_cancel(s); /* chunk 0 (flm_session_prompt's way): all at once, no cancellation point */
    assert_int_equal(flm_session_prompt_progress(s, ids, 50, 0, NULL, NULL, NULL, &err), FLM_OK);
    flm_session_free(s);
    flm_close(ctx);
}

/* ---- speculative decoding in the session (flm_session_speculate) ---------------------------------------------- */

typedef struct {
    int32_t ids[256];
    int n;
    char text[4096];
    size_t len;
    uint64_t evals[256]; /* the context's evaluated tokens when token i was reported (unchanged: an accepted draft) */
    int32_t n_past_ok;   /* every report found the session holding exactly base + the tokens reported before */
    int32_t base;
    int cancel_at;       /* flm_session_cancel after this many tokens (0: never) */
    flm_session *s;
} sgen;

static bool g_shifting; /* the context shifts: the tokens held do not grow with the tokens reported */

static bool on_sgen(void *user, const flm_gen_token *t) {
    sgen *g = user;
    assert_true(g->len + t->len < sizeof g->text);
    memcpy(g->text + g->len, t->text, t->len);
    g->len += t->len;
    g->text[g->len] = 0;
    if (t->id < 0 || t->eog) return true;
    if (!g_shifting && flm_session_n_past(g->s) != g->base + g->n) g->n_past_ok = 0;
    flm_stats st;
    flm_get_stats(flm_session_ctx(g->s), &st);
    assert_true(g->n < 256);
    g->evals[g->n] = st.n_tokens;
    g->ids[g->n++] = t->id;
    if (g->cancel_at && g->n == g->cancel_at) flm_session_cancel(g->s);
    return true;
}

/* The prompt (kept prefix), then a generation of max tokens with an optional stop string into *g. */
static flm_gen_result sgen_run(flm_session *s, const int32_t *prompt, size_t n_prompt, long max, const char *stop,
                               int cancel_at, sgen *g) {
    flm_error err;
    assert_int_equal(flm_session_prompt(s, prompt, n_prompt, NULL, &err), FLM_OK);
    memset(g, 0, sizeof *g);
    g->s = s;
    g->base = flm_session_n_past(s);
    g->n_past_ok = 1;
    g->cancel_at = cancel_at;
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = max;
    if (stop) {
        gp.stop[0] = stop;
        gp.n_stop = 1;
    }
    flm_gen_result r;
    if (flm_session_generate(s, &gp, on_sgen, g, &r, &err)) fail_msg("generate: %s", err.msg);
    return r;
}

/* After a generation: the tokens held, and 8 more tokens (what a consistent context continues with). */
static void sgen_after(flm_session *s, int32_t *n_past, int32_t *more, int *n_more) {
    *n_past = flm_session_n_past(s);
    sgen g;
    memset(&g, 0, sizeof g);
    g.s = s;
    g.base = *n_past;
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = 8;
    flm_error err;
    if (flm_session_generate(s, &gp, on_sgen, &g, NULL, &err)) fail_msg("generate: %s", err.msg);
    memcpy(more, g.ids, (size_t)g.n * sizeof *more);
    *n_more = g.n;
}

static void expect_same(flm_session *plain, flm_session *spec, const flm_gen_result *rp, const flm_gen_result *rs,
                        const sgen *p, const sgen *q, const char *what) {
    if (p->n != q->n || memcmp(p->ids, q->ids, (size_t)p->n * sizeof *p->ids) || p->len != q->len ||
        memcmp(p->text, q->text, p->len))
        fail_msg("%s: speculative output differs (%d tokens, %zu bytes; plain %d, %zu)", what, q->n, q->len, p->n,
                 p->len);
    assert_int_equal(rp->n_gen, rs->n_gen);
    assert_int_equal(rp->stopped, rs->stopped);
    assert_int_equal(rp->cancelled, rs->cancelled);
    assert_int_equal(rp->limit, rs->limit);
    assert_int_equal(rp->eog, rs->eog);
    assert_int_equal(rp->ctx_full, rs->ctx_full);
    assert_true(q->n_past_ok);
    int32_t np, ns, mp[8], ms[8];
    int nmp, nms;
    sgen_after(plain, &np, mp, &nmp);
    sgen_after(spec, &ns, ms, &nms);
    if (np != ns) fail_msg("%s: the speculative session holds %d tokens, the plain one %d", what, ns, np);
    assert_int_equal(nmp, nms);
    assert_memory_equal(mp, ms, (size_t)nmp * sizeof *mp);
}

/* Opens the contexts of a comparison: the plain one (spec false) and the speculative one, n_ctx each. */
typedef flm_ctx *(*open_fn)(int n_ctx, bool spec);

static flm_ctx *open_ram(int n_ctx, bool spec) {
    (void)spec;
    return open_model(n_ctx);
}

/* Greedy speculative generation (sp) through flm_session_generate equals plain session generation: 64 tokens (drafts
 * accepted and rejected), then stop strings ending at every token from 8 on (some completing at an accepted draft),
 * cancellation after k tokens, max_tokens inside a run, and the context shift; after each, both sessions hold the
 * same tokens and continue alike. */
static void check_spec_equals_plain(open_fn open, const flm_spec_params *spp, const char *what) {
    flm_ctx *cp = open(256, false), *cs = open(256, true);
    flm_session *plain = NULL, *spec = NULL;
    flm_error err;
    assert_int_equal(flm_session_create(cp, &plain, &err), FLM_OK);
    assert_int_equal(flm_session_create(cs, &spec, &err), FLM_OK);
    const flm_spec_params sp = *spp;
    assert_int_equal(flm_session_speculate(spec, &sp, NULL, &err), FLM_OK);
    const char *text = "Tom had a red ball. Tom had a red ball. Tom had a blue ball. Tom had a red";
    size_t n_prompt = 0;
    int32_t *prompt = flm_tokenize_all(cp, text, true, &n_prompt);
    assert_non_null(prompt);
    static sgen gp_, gs_;
    flm_gen_result rp = sgen_run(plain, prompt, n_prompt, 64, NULL, 0, &gp_);
    flm_gen_result rs = sgen_run(spec, prompt, n_prompt, 64, NULL, 0, &gs_);
    assert_int_equal(gp_.n, 64);
    flm_spec_stats st;
    flm_session_spec_stats(spec, &st);
    print_message("%s: 64 tokens in %llu passes, drafted %llu, accepted %llu\n", what, (unsigned long long)st.n_passes,
                  (unsigned long long)st.n_drafted, (unsigned long long)st.n_accepted);
    assert_int_equal(st.n_gen, 64);
    assert_true(st.n_accepted > 0);            /* drafts accepted ... */
    assert_true(st.n_accepted < st.n_drafted); /* ... and rejected */
    assert_true(st.n_passes < 64);
    expect_same(plain, spec, &rp, &rs, &gp_, &gs_, "64 tokens");
    /* which tokens were accepted drafts: no evaluation since the previous report */
    bool drafted[256] = {false};
    int n_in_run = 0;
    for (int i = 1; i < gs_.n; i++) drafted[i] = gs_.evals[i] == gs_.evals[i - 1];
    static sgen full;
    full = gp_;
    /* stop strings: the pieces of tokens k-1 and k, first found at token k */
    int n_stops = 0;
    for (int k = 8; k < full.n; k++) {
        char stop[64];
        size_t off = 0;
        for (int i = 0; i <= k; i++) {
            size_t len;
            const char *piece = flm_token_piece(cp, i ? full.ids[i - 1] : prompt[n_prompt - 1], full.ids[i], &len);
            if (i >= k - 1) {
                if (off + len >= sizeof stop) break;
                memcpy(stop + off, piece, len);
                off += len;
            }
        }
        stop[off] = 0;
        if (off == 0) continue;
        static sgen a, b;
        rp = sgen_run(plain, prompt, n_prompt, 64, stop, 0, &a);
        rs = sgen_run(spec, prompt, n_prompt, 64, stop, 0, &b);
        expect_same(plain, spec, &rp, &rs, &a, &b, stop);
        if (rp.stopped) {
            n_stops++;
            if (a.n == k + 1 && drafted[k]) n_in_run++; /* the stop completed at an accepted draft */
        }
    }
    print_message("%s: %d stop strings, %d completed at an accepted draft\n", what, n_stops, n_in_run);
    assert_true(n_stops > 10);
    assert_true(n_in_run > 0);
    /* cancellation after k tokens, and max_tokens k, for every k (every third under the sanitizers: ~10x slower) */
#ifdef FLM_SANITIZED_BUILD
    const int k_step = 3;
#else
    const int k_step = 1;
#endif
    for (int k = 1; k < 40; k += k_step) {
        static sgen a, b;
        rp = sgen_run(plain, prompt, n_prompt, 64, NULL, k, &a);
        rs = sgen_run(spec, prompt, n_prompt, 64, NULL, k, &b);
        assert_true(rs.cancelled);
        expect_same(plain, spec, &rp, &rs, &a, &b, "cancel");
        rp = sgen_run(plain, prompt, n_prompt, k, NULL, 0, &a);
        rs = sgen_run(spec, prompt, n_prompt, k, NULL, 0, &b);
        expect_same(plain, spec, &rp, &rs, &a, &b, "max_tokens");
    }
    flm_session_free(plain);
    flm_session_free(spec);
    flm_close(cp);
    flm_close(cs);
    /* the context shift: a context of 48 tokens, 120 generated */
    cp = open(48, false);
    cs = open(48, true);
    assert_int_equal(flm_session_create(cp, &plain, &err), FLM_OK);
    assert_int_equal(flm_session_create(cs, &spec, &err), FLM_OK);
    assert_int_equal(flm_session_speculate(spec, &sp, NULL, &err), FLM_OK);
    flm_session_set_shift(plain, true, 1);
    flm_session_set_shift(spec, true, 1);
    static sgen a, b;
    g_shifting = true;
    rp = sgen_run(plain, prompt, n_prompt, 120, NULL, 0, &a);
    rs = sgen_run(spec, prompt, n_prompt, 120, NULL, 0, &b);
    flm_session_stats ps, ss;
    flm_session_get_stats(plain, &ps);
    flm_session_get_stats(spec, &ss);
    print_message("%s: context shift: %ld shifts plain, %ld speculative; %d tokens\n", what, ps.n_shifts, ss.n_shifts,
                  b.n);
    assert_true(ps.n_shifts > 0);
    assert_int_equal(ps.n_shifts, ss.n_shifts);
    expect_same(plain, spec, &rp, &rs, &a, &b, "context shift");
    g_shifting = false;
    /* off again: plain decoding, no speculative counts */
    assert_int_equal(flm_session_speculate(spec, NULL, NULL, &err), FLM_OK);
    flm_session_spec_stats(spec, &st);
    assert_int_equal(st.n_gen, 0);
    flm_session_free(plain);
    flm_session_free(spec);
    flm_close(cp);
    flm_close(cs);
    free(prompt);
}

static void test_spec_equals_plain(void **state) {
    (void)state;
    flm_spec_params sp;
    flm_spec_params_default(&sp);
    sp.ngram = true;
    sp.n_draft = 6;
    check_spec_equals_plain(open_ram, &sp, "n-gram lookup");
    /* refused: no source, two sources, a self-draft outside mode hot, sizes out of range */
    flm_ctx *ctx = open_model(64);
    flm_session *s = NULL;
    flm_error err;
    assert_int_equal(flm_session_create(ctx, &s, &err), FLM_OK);
    flm_spec_params bad = sp;
    bad.ngram = false;
    assert_int_equal(flm_session_speculate(s, &bad, NULL, &err), FLM_ERR_ARG);
    bad.self_draft = true;
    assert_int_equal(flm_session_speculate(s, &bad, NULL, &err), FLM_ERR_ARG);
    bad = sp;
    bad.n_draft = FLM_SPEC_DRAFT_MAX + 1;
    assert_int_equal(flm_session_speculate(s, &bad, NULL, &err), FLM_ERR_ARG);
    bad = sp;
    bad.tree = 8;
    assert_int_equal(flm_session_speculate(s, &bad, NULL, &err), FLM_ERR_ARG);
    flm_session_free(s);
    flm_close(ctx);
}

/* The same with the self-draft's trees (flm_eval_tree, flm_tree_accept): stories260K hot-ordered, the plain session
 * in ram mode (bit for bit hot mode's verification), the speculative one in mode hot keeping 40..70% of each layer. */
static char g_hot[4096];
static uint64_t g_hot_mem[2]; /* the budgets of the hot contexts of 256 and 48 tokens */

static flm_ctx *open_hot(int n_ctx, bool spec) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = n_ctx;
    p.mode = spec ? FLM_MODE_HOT : FLM_MODE_RAM;
    p.mem_bytes = spec ? g_hot_mem[n_ctx == 256 ? 0 : 1] : 0;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(g_hot, &p, &ctx, &err)) fail_msg("open %s: %s", g_hot, err.msg);
    return ctx;
}

/* A session's generation on its own thread: SEQ_GEN tokens after its prompt, collected (also the sequences' tests,
 * below). */
#define SEQ_GEN 48
typedef struct seq_job {
    flm_session *s;
    const char *prompt;
    bool ngram;
    collect c;
    flm_gen_result r;
    flm_session_stats st;
} seq_job;

static void *seq_run(void *arg) {
    seq_job *j = arg;
    flm_error err;
    memset(&j->c, 0, sizeof j->c);
    if (flm_session_prompt_text(j->s, j->prompt, strlen(j->prompt), FLM_TOKENIZE_ADD_SPECIAL, NULL, &err))
        return "prompt";
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = SEQ_GEN;
    if (flm_session_generate(j->s, &gp, on_token, &j->c, &j->r, &err)) return "generate";
    flm_session_get_stats(j->s, &j->st);
    return NULL;
}


/* Speculation inside joined passes: two speculative sessions on one hot context of three sequences generate at once
 * while the third is busy (evaluated, not left), so their steps' self-draft passes join each other's drafts and their
 * verifications join each other's passes (trees: each level of each sequence's tree, and each tree, joined); each
 * reply equals plain decoding's token for token: greedy, and with smp (a seed) the text the same seed gives alone. */
static void joined_self_draft(const flm_spec_params *sp, const flm_sampler_params *smp) {
    flm_ctx *cp = open_hot(256, false);
    int32_t want[2][64];
    int n_want[2];
    for (int i = 0; i < 2; i++) {
        seq_job *j = calloc(1, sizeof *j);
        assert_non_null(j);
        flm_error err;
        assert_int_equal(flm_session_create(cp, &j->s, &err), FLM_OK);
        if (smp) assert_int_equal(flm_session_sampling(j->s, smp, &err), FLM_OK);
        j->prompt = i ? "Lily and Tom went to the park" : "Once upon a time";
        assert_null(seq_run(j));
        n_want[i] = j->c.n_ids;
        assert_true(n_want[i] > 8 && n_want[i] <= 64);
        memcpy(want[i], j->c.ids, (size_t)n_want[i] * sizeof *j->c.ids);
        flm_session_free(j->s);
        free(j);
    }
    flm_close(cp);
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = 256;
    p.n_seq = 3;
    p.mode = FLM_MODE_HOT;
    /* the single sequence's budget and two more KV caches of 256 tokens (the 256- and 48-token budgets differ by
     * 208 tokens' worth) */
    p.mem_bytes = g_hot_mem[0] + 2 * (g_hot_mem[0] - g_hot_mem[1]) * 256 / 208;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(g_hot, &p, &ctx, &err)) fail_msg("open %s: %s", g_hot, err.msg);
    assert_true(flm_has_self_draft(ctx));
    seq_job *jobs[2];
    for (int i = 0; i < 2; i++) {
        jobs[i] = calloc(1, sizeof *jobs[i]);
        assert_non_null(jobs[i]);
        assert_int_equal(flm_session_create_seq(ctx, (uint32_t)i, &jobs[i]->s, &err), FLM_OK);
        assert_int_equal(flm_session_speculate(jobs[i]->s, sp, NULL, &err), FLM_OK);
        if (smp) assert_int_equal(flm_session_sampling(jobs[i]->s, smp, &err), FLM_OK);
        jobs[i]->prompt = i ? "Lily and Tom went to the park" : "Once upon a time";
    }
    size_t n;
    int32_t *ids = flm_tokenize_all(ctx, "The big dog", true, &n);
    assert_non_null(ids);
    const float *lg;
    assert_int_equal(flm_eval_seq(ctx, 2, ids, (uint32_t)n, 0, &lg, NULL, &err), FLM_OK); /* busy */
    free(ids);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, seq_run, jobs[i]), 0);
    for (int i = 0; i < 2; i++) {
        void *rv = NULL;
        pthread_join(th[i], &rv);
        assert_null(rv);
    }
    uint64_t joined = 0, drafted = 0;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(jobs[i]->c.n_ids, n_want[i]);
        for (int t = 0; t < n_want[i]; t++) assert_int_equal(jobs[i]->c.ids[t], want[i][t]);
        flm_spec_stats st;
        flm_session_spec_stats(jobs[i]->s, &st);
        joined += st.n_joined;
        drafted += st.n_joined_drafted;
        flm_session_free(jobs[i]->s);
        free(jobs[i]);
    }
    print_message("joined self-draft%s: %llu joined steps, %llu drafts\n", smp ? " (sampled)" : "",
                  (unsigned long long)joined, (unsigned long long)drafted);
    assert_true(joined > 0 && drafted > 0); /* the first steps: sequence 2 was busy (FLM_SEQ_BUSY_MS) */
    flm_close(ctx);
}

static void test_spec_tree_equals_plain(void **state) {
    (void)state;
    snprintf(g_hot, sizeof g_hot, "%s", tu_tmp("session-hot", ".flm"));
    flm_error err;
    assert_int_equal(flm_convert(tu_data(MODEL), g_hot, NULL, NULL, &err), FLM_OK);
    size_t len;
    char *text = (char *)tu_read_file(tu_data("text/tinystories_sample.txt"), &len);
    text[len < 30000 ? len : 30000] = 0;
    if (flm_hot_order(g_hot, text, 512, 128, 2, NULL, NULL, &err)) fail_msg("hot order: %s", err.msg);
    free(text);
    g_hot_mem[0] = tu_hot_budget_for_share(g_hot, 0.4, 0.7, 256);
    g_hot_mem[1] = tu_hot_budget_for_share(g_hot, 0.4, 0.7, 48);
    flm_spec_params sp;
    flm_spec_params_default(&sp);
    sp.self_draft = sp.adaptive = true;
    sp.n_draft = 4;
    sp.tree = 8;
    check_spec_equals_plain(open_hot, &sp, "self-draft tree of 8");
    joined_self_draft(&sp, NULL);
    flm_sampler_params smp;
    flm_sampler_params_default(&smp);
    smp.temp = 0.8f;
    smp.seed = 42;
    joined_self_draft(&sp, &smp);
    remove(g_hot);
}

/* A conversation in the session (flm_session_chat_turn): the first turn evaluates the whole rendering, the next only
 * what follows the text the cache holds (the rendering and the reply as generated); the same replies with
 * speculative decoding; a plain prompt or a reset forgets the conversation. */
static void chat_turns(bool speculative, char replies[3][512]) {
    flm_ctx *ctx = open_model(256);
    flm_session *s = NULL;
    flm_error err;
    assert_int_equal(flm_session_create(ctx, &s, &err), FLM_OK);
    if (speculative) {
        flm_spec_params sp;
        flm_spec_params_default(&sp);
        sp.ngram = true;
        assert_int_equal(flm_session_speculate(s, &sp, NULL, &err), FLM_OK);
    }
    flm_chat *t = NULL;
    assert_int_equal(flm_chat_open(ctx, "chatml", &t, &err), FLM_OK);
    flm_chat_msg msgs[6] = {{"user", "Tom had a red ball. Tom had a red ball."}};
    size_t n = 1;
    const char *users[3] = {NULL, "Tom had a blue ball.", "Tom had a red"};
    for (int turn = 0; turn < 3; turn++) {
        if (turn) msgs[n++] = (flm_chat_msg){"user", users[turn]};
        int32_t before = flm_session_n_past(s);
        flm_chat_turn_info ti;
        assert_int_equal(flm_session_chat_turn(s, t, msgs, n, &ti, &err), FLM_OK);
        assert_int_equal(ti.from_start, turn == 0);
        assert_false(ti.rewrote);
        assert_int_equal(ti.pos0, turn ? before : 0);
        assert_int_equal(flm_session_n_past(s), ti.pos0 + (int32_t)ti.n_new);
        char *want = NULL;
        size_t want_len = 0;
        assert_int_equal(flm_chat_apply(t, msgs, n, true, &want, &want_len, &err), FLM_OK);
        size_t held_len;
        const char *held = flm_session_chat_text(s, &held_len);
        assert_int_equal(held_len, want_len);
        assert_memory_equal(held, want, want_len);
        if (turn) assert_true(ti.n_new < (size_t)before); /* only the new turn */
        static collect c;
        memset(&c, 0, sizeof c);
        flm_gen_params gp;
        flm_gen_params_default(&gp);
        gp.max_tokens = 24;
        gp.feed_last = true;
        assert_int_equal(flm_session_generate(s, &gp, on_token, &c, NULL, &err), FLM_OK);
        assert_true(c.len < 512);
        memcpy(replies[turn], c.text, c.len + 1);
        /* the held text: the rendering and the reply (an end-of-generation token has no text) */
        held = flm_session_chat_text(s, &held_len);
        assert_int_equal(held_len, want_len + c.len);
        assert_memory_equal(held + want_len, c.text, c.len);
        free(want);
        msgs[n++] = (flm_chat_msg){"assistant", replies[turn]};
    }
    size_t held_len;
    flm_session_chat_reset(s);
    assert_int_equal(flm_session_n_past(s), 0);
    flm_session_chat_text(s, &held_len);
    assert_int_equal(held_len, 0);
    flm_chat_turn_info ti;
    assert_int_equal(flm_session_chat_turn(s, t, msgs, 1, &ti, &err), FLM_OK);
    assert_true(ti.from_start);
    assert_int_equal(flm_session_prompt_text(s, "Once", 4, FLM_TOKENIZE_ADD_SPECIAL, NULL, &err), FLM_OK);
    flm_session_chat_text(s, &held_len);
    assert_int_equal(held_len, 0); /* a plain prompt: no conversation held */
    flm_chat_close(t);
    flm_session_free(s);
    flm_close(ctx);
}

static void test_chat_turns(void **state) {
    (void)state;
    static char plain[3][512], spec[3][512];
    chat_turns(false, plain);
    chat_turns(true, spec);
    for (int i = 0; i < 3; i++) assert_string_equal(plain[i], spec[i]);
    assert_true(strlen(plain[0]) > 0);
}

/* ---- sequences: one context, several sessions ------------------------------------------------------------------ */

#define SEQ_N 4
static const char *const SEQ_PROMPTS[SEQ_N] = {"Once upon a time", "Lily and Tom went to the park",
                                               "The big dog", "One day, a little bird"};
static char g_seq_flm[4096];

/* A context of the model (the .flm under a budget when flm), n_seq sequences. */
static flm_ctx *open_seq(bool flm, int n_seq) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = 128;
    p.n_seq = n_seq;
    if (flm) {
        p.mode = FLM_MODE_HYBRID; /* layers streamed from the file: the FFN source is shared by the sequences */
        p.mem_bytes = 2u << 20;
    }
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(flm ? g_seq_flm : tu_data(MODEL), &p, &ctx, &err)) fail_msg("%s", err.msg);
    return ctx;
}

static void seq_speculate(flm_session *s, bool ngram) {
    if (!ngram) return;
    flm_spec_params sp;
    flm_spec_params_default(&sp);
    sp.ngram = true;
    sp.n_draft = 4;
    flm_error err;
    assert_int_equal(flm_session_speculate(s, &sp, NULL, &err), FLM_OK);
}

/* Each prompt alone, in a context of one sequence (the reference), against the four on one context of four: on four
 * threads (threads) or one after another token by token is not possible from outside, so the unthreaded case runs
 * them one after another on the shared context, each on its own sequence, twice (the second round reuses each
 * sequence's cached prompt: the caches are apart). */
static void seq_case(bool flm, bool ngram, bool threads) {
    seq_job ref[SEQ_N], got[SEQ_N];
    flm_error err;
    flm_ctx *one = open_seq(flm, 1);
    for (int i = 0; i < SEQ_N; i++) {
        ref[i].prompt = SEQ_PROMPTS[i];
        ref[i].ngram = ngram;
        assert_int_equal(flm_session_create(one, &ref[i].s, &err), FLM_OK);
        seq_speculate(ref[i].s, ngram);
        assert_null(seq_run(&ref[i]));
        assert_true(ref[i].c.n_ids > 8);
        flm_session_free(ref[i].s);
    }
    flm_close(one);
    flm_ctx *ctx = open_seq(flm, SEQ_N);
    assert_int_equal(flm_n_seq(ctx), SEQ_N);
    for (int i = 0; i < SEQ_N; i++) {
        got[i].prompt = SEQ_PROMPTS[i];
        assert_int_equal(flm_session_create_seq(ctx, (uint32_t)i, &got[i].s, &err), FLM_OK);
        seq_speculate(got[i].s, ngram);
    }
    for (int round = 0; round < 2; round++) {
        if (threads) {
            pthread_t th[SEQ_N];
            for (int i = 0; i < SEQ_N; i++) assert_int_equal(pthread_create(&th[i], NULL, seq_run, &got[i]), 0);
            for (int i = 0; i < SEQ_N; i++) {
                void *rv = NULL;
                pthread_join(th[i], &rv);
                assert_null(rv);
            }
        } else {
            for (int i = SEQ_N - 1; i >= 0; i--) assert_null(seq_run(&got[i]));
        }
        for (int i = 0; i < SEQ_N; i++) {
            assert_int_equal(got[i].c.n_ids, ref[i].c.n_ids);
            for (int t = 0; t < ref[i].c.n_ids; t++) assert_int_equal(got[i].c.ids[t], ref[i].c.ids[t]);
            assert_int_equal(got[i].c.len, ref[i].c.len);
            assert_memory_equal(got[i].c.text, ref[i].c.text, ref[i].c.len);
            /* its own statistics: the tokens its passes evaluated (the others' are not counted) */
            assert_true(got[i].st.gen.compute_ms >= 0);
        }
    }
    for (int i = 0; i < SEQ_N; i++) flm_session_free(got[i].s);
    flm_close(ctx);
}

static void test_sequences_equal_alone(void **state) {
    (void)state;
    seq_case(false, false, false);
    seq_case(false, false, true);
    seq_case(false, true, true);
    seq_case(true, false, true);
}

/* The plan holds a KV cache and a logits row per sequence; sequences out of range are refused by name. */
static void test_sequences_plan(void **state) {
    (void)state;
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = 128;
    flm_plan_info a, b;
    flm_error err;
    assert_int_equal(flm_plan(tu_data(MODEL), &p, &a, &err), FLM_OK);
    p.n_seq = SEQ_N;
    assert_int_equal(flm_plan(tu_data(MODEL), &p, &b, &err), FLM_OK);
    assert_int_equal(b.kv, SEQ_N * a.kv);
    const uint64_t row = ((uint64_t)a.n_vocab * 4 + 63) / 64 * 64;
    /* each sequence's tree in a joined pass: depth and ancestors of T = min(n_ctx, FLM_TREE_MAX_NODES) nodes, and
     * their final states (d_model floats each), each carved aligned */
    flm_ctx *one = open_seq(false, 1);
    flm_model_info mi;
    flm_get_info(one, &mi);
    flm_close(one);
    const uint64_t T = 128 < FLM_TREE_MAX_NODES ? 128 : FLM_TREE_MAX_NODES;
    const uint64_t B = (uint64_t)b.n_batch, H = T < B ? T : B; /* final states: the rows of one batch at most */
    const uint64_t tree = (4 * T + T * T + 63) / 64 * 64 + (4 * H * mi.d_model + 63) / 64 * 64 + 2 * 64;
    /* theirs, and a joined pass's; and the alignment of the other sequences' KV caches and rows as they are carved */
    assert_int_equal(b.scratch, a.scratch + (2 * SEQ_N - 1) * row + 64 + (SEQ_N - 1) * 64 + SEQ_N * tree);
    assert_int_equal(b.resident, a.resident);
    p.n_seq = FLM_SEQ_MAX + 1;
    assert_int_equal(flm_plan(tu_data(MODEL), &p, &b, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "sequences"));
    flm_ctx *ctx = open_seq(false, 2);
    flm_stats st;
    flm_get_stats(ctx, &st);
    assert_int_equal(st.mem_kv, 2 * a.kv);
    assert_int_equal(flm_seq_acquire(ctx, 2, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "sequence 2"));
    flm_session *s = NULL;
    assert_int_equal(flm_session_create_seq(ctx, 2, &s, &err), FLM_ERR_ARG);
    assert_null(s);
    /* positions are per sequence */
    const float *logits = NULL;
    const int32_t ids[3] = {1, 2, 3};
    assert_int_equal(flm_seq_acquire(ctx, 1, &err), FLM_OK);
    assert_int_equal(flm_eval_batch(ctx, ids, 3, 0, NULL, &logits, &err), FLM_OK);
    assert_int_equal(flm_n_past(ctx), 3);
    flm_seq_release(ctx);
    assert_int_equal(flm_seq_acquire(ctx, 0, &err), FLM_OK);
    assert_int_equal(flm_n_past(ctx), 0);
    flm_seq_release(ctx);
    flm_close(ctx);
}

/* ---- joined passes (flm_eval_seq): three sequences' rows in one forward pass ------------------------------------ */

typedef struct join_job {
    flm_ctx *ctx;
    uint32_t seq, n;
    const int32_t *ids;
    int32_t pos;
    float *logits; /* [n_vocab]: a copy of what it got */
    flm_status st;
    float *all;    /* not NULL: every row's logits (FLM_EVAL_LOGITS_ALL, a speculative step's verification) */
    double ms, pass_ms; /* with all: the call's flm_call_stats.ms and pass_ms */
    const int32_t *parent; /* not NULL: a tree of n nodes at pos, its logits into all, or none (NULL: kept lazily) */
    const uint32_t *some;  /* with parent and all: FLM_EVAL_LOGITS_SOME, these 3 nodes' logits into all */
} join_job;

static void *join_run_one(void *arg) {
    join_job *j = arg;
    const float *lg = NULL;
    flm_error err;
    flm_token_stats ts = {0};
    if (j->parent) { /* a joined tree: no logits returned (every node's into all, or none) */
        const flm_eval_args a = {.tokens = j->ids, .n = j->n, .pos = j->pos, .seq = j->seq, .join = true,
                                 .parent = j->parent, .logits_all = j->all, .some = j->some, .n_some = j->some ? 3 : 0,
                                 .logits = j->some  ? FLM_EVAL_LOGITS_SOME
                                           : j->all ? FLM_EVAL_LOGITS_ALL
                                                    : FLM_EVAL_LOGITS_NONE};
        flm_eval_out out;
        j->st = flm_evaluate(j->ctx, &a, &out, &err);
        if (!j->st && out.logits) j->st = FLM_ERR_ARG; /* a tree returns no last row */
        return NULL;
    }
    if (j->all) {
        const flm_eval_args a = {.tokens = j->ids, .n = j->n, .pos = j->pos, .seq = j->seq, .join = true,
                                 .logits = FLM_EVAL_LOGITS_ALL, .logits_all = j->all};
        flm_eval_out out;
        j->st = flm_evaluate(j->ctx, &a, &out, &err);
        lg = out.logits;
        j->ms = out.stats.ms;
        j->pass_ms = out.stats.pass_ms;
    } else {
        j->st = flm_eval_seq(j->ctx, j->seq, j->ids, j->n, j->pos, &lg, &ts, &err);
    }
    if (!j->st) memcpy(j->logits, lg, (size_t)flm_vocab_size(j->ctx) * sizeof(float));
    return NULL;
}

/* Three threads evaluate at once while the context is held (flm_seq_acquire on a fourth sequence), none of them
 * expected back (flm_seq_leave): the first takes its own request and waits for the context, the other two queue;
 * released, the first runs alone and the other two join one pass. Every thread's logits equal, bit for bit, those
 * of its sequence evaluated alone. */
static void join_step(flm_ctx *ctx, join_job *jobs, const float *want, uint32_t V) {
    flm_error err;
    flm_stats a, b;
    flm_get_stats(ctx, &a);
    for (uint32_t q = 0; q < 3; q++) flm_seq_leave(ctx, q); /* not expected back: the leader does not wait for them */
    assert_int_equal(flm_seq_acquire(ctx, 3, &err), FLM_OK);
    pthread_t th[3];
    /* job 0 first, until it leads and has taken its own request (it waits for the context): which thread leads
     * must not be left to the scheduler, since the two that join must fit one batch together (the first prompt
     * step's rows of the two longest prompts do not, in the .flm's batch of 11) */
    assert_int_equal(pthread_create(&th[0], NULL, join_run_one, &jobs[0]), 0);
    for (bool ready = false; !ready;) {
        pthread_mutex_lock(&ctx->join_mu);
        ready = ctx->join_leading && !ctx->join_head;
        pthread_mutex_unlock(&ctx->join_mu);
        if (!ready) { struct timespec ts = {0, 1000000}; nanosleep(&ts, NULL); }
    }
    for (int i = 1; i < 3; i++) assert_int_equal(pthread_create(&th[i], NULL, join_run_one, &jobs[i]), 0);
    for (bool ready = false; !ready;) { /* the leader waiting for the context, the two others queued */
        pthread_mutex_lock(&ctx->join_mu);
        ready = ctx->join_leading && ctx->join_head && ctx->join_head != ctx->join_tail;
        pthread_mutex_unlock(&ctx->join_mu);
        if (!ready) { struct timespec ts = {0, 1000000}; nanosleep(&ts, NULL); }
    }
    flm_seq_release(ctx);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    flm_get_stats(ctx, &b);
    assert_int_equal(b.n_joined, a.n_joined + 1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(jobs[i].st, FLM_OK);
        if (jobs[i].parent) continue; /* a tree: its nodes' logits are checked by the caller */
        assert_memory_equal(jobs[i].logits, want + (size_t)i * V, (size_t)V * sizeof(float));
        /* a call's own pass within its wall time; job 0 waited for the context before its pass (pass_ms leaves
         * that out: the self-draft's joined cost, spec.c) */
        if (jobs[i].all) assert_true(jobs[i].pass_ms > 0 && jobs[i].pass_ms <= jobs[i].ms);
        if (jobs[i].all && i == 0) assert_true(jobs[i].pass_ms < jobs[i].ms);
    }
}

static int32_t argmax(const float *x, uint32_t V) {
    int32_t best = 0;
    for (uint32_t v = 1; v < V; v++)
        if (x[v] > x[best]) best = (int32_t)v;
    return best;
}

static void joined_case(bool flm) {
    static const char *const P[3] = {"Once upon a time", "The big dog ran to the", "Lily"};
    flm_ctx *one = open_seq(flm, 1);
    const uint32_t V = flm_vocab_size(one);
    int32_t *ids[3];
    size_t n[3];
    float *want = malloc((size_t)9 * V * sizeof(float)), *got = malloc((size_t)3 * V * sizeof(float));
    float *want_all = malloc((size_t)12 * V * sizeof(float)), *got_all = malloc((size_t)12 * V * sizeof(float));
    /* a tree per sequence after its first decoded token: a root (a rejected draft), two children, a grandchild */
    static const int32_t tpar[4] = {-1, 0, 0, 1};
    static const uint32_t tpath[3] = {0, 1, 3}, tnodes[3] = {3, 0, 2};
    int32_t tree[3][4];
    float *want_tree = malloc((size_t)12 * V * sizeof(float)), *want_after = malloc((size_t)3 * V * sizeof(float));
    float *got_tree = malloc((size_t)12 * V * sizeof(float));
    assert_non_null(want_tree);
    assert_non_null(want_after);
    assert_non_null(got_tree);
    assert_non_null(want);
    assert_non_null(got);
    assert_non_null(want_all);
    assert_non_null(got_all);
    int32_t next[3], pair[3][4];
    flm_error err;
    for (int i = 0; i < 3; i++) { /* alone: the prompt's logits, then the next token's, then four tokens' (every row) */
        ids[i] = flm_tokenize_all(one, P[i], true, &n[i]);
        assert_non_null(ids[i]);
        const float *lg = NULL;
        assert_int_equal(flm_eval_batch(one, ids[i], (uint32_t)n[i], 0, NULL, &lg, &err), FLM_OK);
        memcpy(want + (size_t)i * V, lg, (size_t)V * sizeof(float));
        next[i] = argmax(lg, V);
        assert_int_equal(flm_eval(one, next[i], (int32_t)n[i], &lg, &err), FLM_OK);
        memcpy(want + (size_t)(3 + i) * V, lg, (size_t)V * sizeof(float));
        pair[i][0] = next[i];
        pair[i][1] = argmax(lg, V) == 7 ? 8 : 7; /* drafts: one that is not the next token, as a rejected one */
        pair[i][2] = 9;
        pair[i][3] = 10;
        assert_int_equal(flm_eval_batch(one, pair[i], 4, (int32_t)n[i], want_all + (size_t)4 * i * V, &lg, &err),
                         FLM_OK);
        memcpy(want + (size_t)(6 + i) * V, lg, (size_t)V * sizeof(float));
        /* the tree at n + 1 (every node's logits), its path 0, 1, 3 kept, then one token after it */
        const int32_t tp = (int32_t)n[i] + 1;
        tree[i][0] = pair[i][1];
        tree[i][1] = 9;
        tree[i][2] = 10;
        tree[i][3] = 11 + i;
        assert_int_equal(flm_eval_tree(one, tree[i], tpar, 4, 0, tp, false, want_tree + (size_t)4 * i * V, &err),
                         FLM_OK);
        assert_int_equal(flm_tree_accept(one, tp, tpath, 3, &err), FLM_OK);
        assert_int_equal(flm_eval(one, 12, tp + 3, &lg, &err), FLM_OK);
        memcpy(want_after + (size_t)i * V, lg, (size_t)V * sizeof(float));
    }
    flm_close(one);
    flm_ctx *ctx = open_seq(flm, 4);
    join_job jobs[3];
    for (int i = 0; i < 3; i++) /* the prompts: the first alone, the other two joined in one pass */
        jobs[i] = (join_job){ctx, (uint32_t)i, (uint32_t)n[i], ids[i], 0, got + (size_t)i * V, FLM_OK, NULL, 0, 0, NULL, NULL};
    join_step(ctx, jobs, want, V);
    for (int i = 0; i < 3; i++) /* then one token each: decoding rows of three sequences in one pass */
        jobs[i] = (join_job){ctx, (uint32_t)i, 1, &next[i], (int32_t)n[i], got + (size_t)i * V, FLM_OK, NULL, 0, 0, NULL, NULL};
    join_step(ctx, jobs, want + (size_t)3 * V, V);
    /* then a speculative step's verification each, from the same position: four rows with every row's logits for
     * sequences 0 (alone: it leads) and 1 (joined with 2, which wants its last row only: five rows of logits, more
     * than the scratch of 4 sequences' rows holds whole, so the classifier runs in blocks of its rows) */
    for (int i = 0; i < 3; i++)
        jobs[i] = (join_job){ctx, (uint32_t)i, 4, pair[i], (int32_t)n[i], got + (size_t)i * V, FLM_OK,
                             i < 2 ? got_all + (size_t)4 * i * V : NULL, 0, 0, NULL, NULL};
    join_step(ctx, jobs, want + (size_t)6 * V, V);
    assert_memory_equal(got_all, want_all, (size_t)8 * V * sizeof(float));
    /* then a tree each (flm_evaluate with join and parent): sequence 0 alone (it leads) and lazily (its logits asked
     * afterwards, flm_seq_tree_logits_n, after other sequences' passes), 1 with every node's logits, joined with 2,
     * which asks for three nodes' in the pass (FLM_EVAL_LOGITS_SOME) and the same three afterwards; each equal, bit
     * for bit, to flm_eval_tree's alone; then each keeps the path 0, 1, 3 (flm_seq_tree_accept) and decodes one more
     * token in a joined pass, as alone */
    float *got_some = malloc((size_t)3 * V * sizeof(float));
    assert_non_null(got_some);
    for (int i = 0; i < 3; i++)
        jobs[i] = (join_job){ctx, (uint32_t)i, 4, tree[i], (int32_t)n[i] + 1, got + (size_t)i * V, FLM_OK,
                             i == 1 ? got_tree + (size_t)4 * V : i == 2 ? got_some : NULL, 0, 0, tpar,
                             i == 2 ? tnodes : NULL};
    join_step(ctx, jobs, NULL, V);
    assert_memory_equal(got_tree + (size_t)4 * V, want_tree + (size_t)4 * V, (size_t)4 * V * sizeof(float));
    for (int k = 0; k < 3; k++)
        assert_memory_equal(got_some + (size_t)k * V, want_tree + (size_t)(8 + (int)tnodes[k]) * V,
                            (size_t)V * sizeof(float));
    free(got_some);
    for (int i = 0; i < 3; i += 2) {
        assert_int_equal(flm_seq_tree_logits_n(ctx, (uint32_t)i, tnodes, 3, got_tree, &err), FLM_OK);
        for (int k = 0; k < 3; k++)
            assert_memory_equal(got_tree + (size_t)k * V, want_tree + (size_t)(4 * i + (int)tnodes[k]) * V,
                                (size_t)V * sizeof(float));
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(flm_seq_tree_accept(ctx, (uint32_t)i, (int32_t)n[i] + 1, tpath, 3, &err), FLM_OK);
    assert_int_equal(flm_seq_tree_logits_n(ctx, 0, tnodes, 1, got_tree, &err), FLM_ERR_ARG); /* none held now */
    assert_int_equal(flm_seq_tree_accept(ctx, 4, 0, tpath, 1, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "sequence 4"));
    static const int32_t after = 12;
    for (int i = 0; i < 3; i++)
        jobs[i] = (join_job){ctx, (uint32_t)i, 1, &after, (int32_t)n[i] + 4, got + (size_t)i * V, FLM_OK, NULL, 0, 0,
                             NULL, NULL};
    join_step(ctx, jobs, want_after, V);
    /* a joined evaluation takes no draft and no FLM_EVAL_LOGITS_NONE; the others' rows are untouched by a refusal */
    const flm_eval_args none = {.tokens = pair[0], .n = 1, .pos = (int32_t)n[0], .seq = 0, .join = true,
                                .logits = FLM_EVAL_LOGITS_NONE};
    flm_eval_out out;
    assert_int_equal(flm_evaluate(ctx, &none, &out, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "join"));
    flm_close(ctx);
    for (int i = 0; i < 3; i++) free(ids[i]);
    free(want);
    free(got);
    free(want_all);
    free(got_all);
    free(want_tree);
    free(want_after);
    free(got_tree);
}

static void test_joined_pass_equals_alone(void **state) {
    (void)state;
    joined_case(false);
    joined_case(true);
}

/* flm_seq_busy counts the other sequences that evaluated and have not left; a speculative session on a shared
 * context verifies its steps in joined passes while another is busy, and alone once it has left. The reply is the
 * one it gives alone either way. */
static void test_busy_sequences_decode_joined(void **state) {
    (void)state;
    flm_error err;
    flm_ctx *one = open_seq(false, 1);
    seq_job ref = {.prompt = SEQ_PROMPTS[0]};
    assert_int_equal(flm_session_create(one, &ref.s, &err), FLM_OK);
    assert_null(seq_run(&ref));
    assert_true(ref.c.n_ids > 8);
    assert_int_equal(flm_seq_busy(one, 0), 0); /* a context of one sequence: none */
    flm_session_free(ref.s);
    flm_close(one);

    flm_ctx *ctx = open_seq(false, 3);
    assert_int_equal(flm_seq_busy(ctx, 0), 0);
    assert_int_equal(flm_seq_busy(NULL, 0), 0);
    int32_t *ids;
    size_t n;
    ids = flm_tokenize_all(ctx, "The big dog", true, &n);
    assert_non_null(ids);
    const float *lg = NULL;
    assert_int_equal(flm_eval_seq(ctx, 1, ids, (uint32_t)n, 0, &lg, NULL, &err), FLM_OK);
    assert_int_equal(flm_seq_busy(ctx, 0), 1); /* sequence 1 */
    assert_int_equal(flm_seq_busy(ctx, 1), 0); /* not itself */
    assert_int_equal(flm_eval_seq(ctx, 2, ids, (uint32_t)n, 0, &lg, NULL, &err), FLM_OK);
    assert_int_equal(flm_seq_busy(ctx, 0), 2);
    assert_int_equal(flm_seq_busy(ctx, 1), 1);
    flm_seq_leave(ctx, 2);
    assert_int_equal(flm_seq_busy(ctx, 0), 1);

    /* sequence 0 speculates (n-gram lookup) while sequence 1 is busy: every step verified in a joined pass */
    seq_job got = {.prompt = SEQ_PROMPTS[0]};
    assert_int_equal(flm_session_create_seq(ctx, 0, &got.s, &err), FLM_OK);
    seq_speculate(got.s, true);
    for (int round = 0; round < 2; round++) {
        if (round == 0) /* busy just now (a busy sequence counts for FLM_SEQ_BUSY_MS after its evaluation) */
            assert_int_equal(flm_eval_seq(ctx, 1, ids, (uint32_t)n, 0, &lg, NULL, &err), FLM_OK);
        else
            flm_seq_leave(ctx, 1); /* none busy: its steps take the context alone again */
        assert_int_equal(flm_seq_busy(ctx, 0), round == 0 ? 1 : 0);
        flm_session_rewind(got.s, 0);
        flm_session_reset_stats(got.s);
        assert_null(seq_run(&got));
        flm_spec_stats ss;
        flm_session_spec_stats(got.s, &ss);
        /* busy: every step joins the others' pass (a chain from the n-gram lookup); none busy: steps alone */
        assert_true(ss.n_steps > 0);
        assert_int_equal(ss.n_joined, round == 0 ? ss.n_steps : 0);
        if (round == 0) assert_true(ss.n_joined_drafted > 0 && ss.n_joined_accepted <= ss.n_joined_drafted);
        assert_int_equal(got.c.n_ids, ref.c.n_ids);
        for (int t = 0; t < ref.c.n_ids; t++) assert_int_equal(got.c.ids[t], ref.c.ids[t]);
        assert_memory_equal(got.c.text, ref.c.text, ref.c.len);
    }
    /* a request that ends after its prompt (failed, or its client gone: serve rewinds the session) leaves: it kept
     * the others from speculating for FLM_SEQ_BUSY_MS after */
    flm_session *s2;
    assert_int_equal(flm_session_create_seq(ctx, 2, &s2, &err), FLM_OK);
    assert_int_equal(flm_session_feed(s2, ids, n, &err), FLM_OK);
    assert_int_equal(flm_seq_busy(ctx, 0), 1); /* sequence 2 */
    flm_session_rewind(s2, 0);
    assert_int_equal(flm_seq_busy(ctx, 0), 0);
    flm_session_free(s2);
    flm_session_free(got.s);
    flm_close(ctx);
    free(ids);
}

static int seq_setup(void **state) {
    (void)state;
    snprintf(g_seq_flm, sizeof g_seq_flm, "%s", tu_tmp("seq", ".flm"));
    char args[8192];
    snprintf(args, sizeof args, "convert '%s' '%s' 2>&1", tu_data(MODEL), g_seq_flm);
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    if (rc) fprintf(stderr, "convert failed (%d): %s\n", rc, out);
    free(out);
    return rc;
}

static int seq_teardown(void **state) {
    (void)state;
    remove(g_seq_flm);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_equals_plain_loop),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_prompt_reuse),
        cmocka_unit_test(test_cancel_and_limits),
        cmocka_unit_test(test_prompt_cancel),
        cmocka_unit_test(test_spec_equals_plain),
        cmocka_unit_test(test_spec_tree_equals_plain),
        cmocka_unit_test(test_chat_turns),
        cmocka_unit_test(test_sequences_plan),
        cmocka_unit_test(test_sequences_equal_alone),
        cmocka_unit_test(test_joined_pass_equals_alone),
        cmocka_unit_test(test_busy_sequences_decode_joined),
    };
    return cmocka_run_group_tests(tests, seq_setup, seq_teardown);
}
