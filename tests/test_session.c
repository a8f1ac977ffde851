/* test_session.c — the session API (include/flashlm.h, "Sessions"; src/session/session.c) on stories260K: greedy
 * generation equals the plain evaluate-and-argmax loop, stop strings end the text before them and never release a
 * part of one, a new prompt keeps the common prefix and still gives the same continuation, cancellation, max_tokens,
 * a full context, the context shift, per-request statistics. */
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_equals_plain_loop),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_prompt_reuse),
        cmocka_unit_test(test_cancel_and_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
