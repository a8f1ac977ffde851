/* test_public_api.c — the library as a user links it: this program includes flashlm.h only and links libflashlm.a,
 * the public archive (issue 8, "A library surface"). It checks the version, that internal names stay inside the
 * library (a user may define functions with the same names), and that messages reach the log callback and never
 * stderr, with nothing read implicitly next to the model. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flashlm.h"
#include "testutil.h"

/* Names the library uses internally. Were they global in libflashlm.a, linking this program would fail with
 * "multiple definition" (the archive is one object, pulled in for flm_open). flm_gguf_find_tensor collided with ggml's
 * function of that name before the internal names got their flm_ prefix; these are the prefixed ones. */
int flm_gguf_find_tensor(void);
int flm_gguf_find_tensor(void) { return 42; }
int flm_reader_open(void);
int flm_reader_open(void) { return 7; }
int flm_log(void);
int flm_log(void) { return 5; }

static void test_version(void **state) {
    (void)state;
    const char *s = NULL;
    assert_int_equal(flm_version(&s), FLM_VERSION_NUMBER);
    assert_string_equal(s, FLM_VERSION_STRING);
    assert_int_equal(flm_version(NULL), FLM_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", FLM_VERSION_MAJOR, FLM_VERSION_MINOR, FLM_VERSION_PATCH);
    assert_string_equal(want, FLM_VERSION_STRING);
    assert_int_equal(FLM_VERSION_NUMBER, FLM_VERSION_MAJOR * 10000 + FLM_VERSION_MINOR * 100 + FLM_VERSION_PATCH);
}

static void test_names_stay_inside(void **state) {
    (void)state;
    assert_int_equal(flm_gguf_find_tensor(), 42); /* ours, not the library's */
    assert_int_equal(flm_reader_open(), 7);
    assert_int_equal(flm_log(), 5);
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = 16;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(tu_data("models/stories260K/stories260K.gguf"), &p, &ctx, &err)) fail_msg("open: %s", err.msg);
    const float *logits;
    assert_int_equal(flm_eval(ctx, 1, 0, &logits, &err), FLM_OK); /* the library uses its own internals */
    flm_model_info info;
    flm_get_info(ctx, &info);
    assert_int_equal(info.n_vocab, 512);
    /* the context shift (tests/test_kv_shift.c checks what it computes) */
    assert_int_equal(flm_eval(ctx, 403, 1, &logits, &err), FLM_OK);
    assert_int_equal(flm_eval(ctx, 407, 2, &logits, &err), FLM_OK);
    assert_int_equal(flm_kv_shift(ctx, 1, 1, &err), FLM_OK);
    assert_int_equal(flm_n_past(ctx), 2);
    assert_int_equal(flm_kv_shift(ctx, 1, 2, &err), FLM_ERR_ARG);
    assert_int_equal(flm_eval(ctx, 261, 2, &logits, &err), FLM_OK);
    flm_close(ctx);
}

/* The vocabulary and chat template calls a client (the CLI) uses instead of the library's internals. stories260K:
 * a SentencePiece vocabulary of 512 tokens, no chat template. */
static void test_vocab_and_chat(void **state) {
    (void)state;
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = 16;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(tu_data("models/stories260K/stories260K.gguf"), &p, &ctx, &err)) fail_msg("open: %s", err.msg);
    flm_model_info info;
    flm_get_info(ctx, &info);
    assert_int_equal(flm_vocab_size(ctx), 512);
    assert_int_equal(flm_vocab_size(NULL), 0);
    assert_string_equal(flm_token_text(ctx, info.bos), "<s>");
    assert_string_equal(flm_token_text(ctx, -1), "");
    assert_string_equal(flm_token_text(ctx, 512), "");
    assert_true(flm_add_bos(ctx)); /* SentencePiece: BOS by default */
    assert_false(flm_add_bos(NULL));
    int32_t ids[16];
    size_t n = flm_tokenize_ex(ctx, "Once", 4, FLM_TOKENIZE_BOS, ids, 16);
    assert_true(n >= 2 && n <= 16);
    assert_int_equal(ids[0], info.bos);
    size_t m = flm_tokenize_ex(ctx, "Once", 4, 0, ids, 16);
    assert_int_equal(m, n - 1);
    assert_int_not_equal(ids[0], info.bos);

    assert_true(flm_chat_name_valid("chatml"));
    assert_true(flm_chat_name_valid("gemma"));
    assert_false(flm_chat_name_valid("jinja"));
    assert_false(flm_chat_name_valid(NULL));
    flm_chat *c = NULL;
    assert_int_equal(flm_chat_open(ctx, NULL, &c, &err), FLM_OK);
    assert_string_equal(flm_chat_name(c), "chatml"); /* no template: llama.cpp's default */
    assert_non_null(strstr(flm_chat_origin(c), "default"));
    assert_null(flm_chat_system_prompt(c));
    flm_chat_msg msgs[2] = {{"system", "Be brief."}, {"user", "Hi"}};
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(flm_chat_apply(c, msgs, 2, true, &text, &len, &err), FLM_OK);
    assert_string_equal(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                              "<|im_start|>assistant\n");
    assert_int_equal(len, strlen(text));
    free(text);
    flm_chat_close(c);
    assert_int_equal(flm_chat_open(ctx, "gemma", &c, &err), FLM_OK);
    assert_string_equal(flm_chat_name(c), "gemma");
    assert_string_equal(flm_chat_origin(c), "--chat-template");
    flm_chat_close(c);
    c = (flm_chat *)&err; /* set to NULL on error */
    assert_int_equal(flm_chat_open(ctx, "jinja", &c, &err), FLM_ERR_ARG);
    assert_null(c);
    assert_non_null(strstr(err.msg, "chatml"));
    flm_chat_close(NULL);
    flm_close(ctx);
}

static bool count_tokens(void *user, const flm_gen_token *t) {
    *(int *)user += !t->eog && t->id >= 0;
    return true;
}

/* The session API through the public archive: a chat prompt, a greedy reply with a stop string, statistics. */
static void test_session(void **state) {
    (void)state;
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = 128;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(tu_data("models/stories260K/stories260K.gguf"), &p, &ctx, &err)) fail_msg("open: %s", err.msg);
    flm_session *s = NULL;
    flm_chat *c = NULL;
    assert_int_equal(flm_session_create(ctx, &s, &err), FLM_OK);
    assert_ptr_equal(flm_session_ctx(s), ctx);
    assert_int_equal(flm_chat_open(ctx, NULL, &c, &err), FLM_OK);
    flm_chat_msg msg = {"user", "Once upon a time"};
    size_t reused = 99;
    assert_int_equal(flm_session_prompt_chat(s, c, &msg, 1, &reused, &err), FLM_OK);
    assert_int_equal(reused, 0);
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = 12;
    gp.stop[0] = "@@";
    gp.n_stop = 1;
    int n = 0;
    flm_gen_result r;
    assert_int_equal(flm_session_generate(s, &gp, count_tokens, &n, &r, &err), FLM_OK);
    assert_true(r.n_gen >= 1 && r.n_gen <= 12);
    assert_int_equal(n, r.n_gen - (r.eog ? 1 : 0));
    flm_session_stats st;
    flm_session_get_stats(s, &st);
    assert_int_equal(st.n_gen, (uint64_t)r.n_gen);
    assert_true(st.n_prompt > 0);
    assert_int_equal(flm_session_prompt_chat(s, c, &msg, 1, &reused, &err), FLM_OK); /* the same prompt again */
    assert_int_equal(reused, st.n_prompt - 1);
    /* speculative decoding (the n-gram lookup) and a conversation through the exported calls */
    flm_spec_params sp;
    flm_spec_params_default(&sp);
    assert_int_equal(sp.n_draft, 4);
    sp.ngram = true;
    assert_true(flm_spec_buffer_bytes(flm_vocab_size(ctx), 128, &sp, false, true) > 0);
    assert_int_equal(flm_session_speculate(s, &sp, NULL, &err), FLM_OK);
    flm_chat_turn_info ti;
    assert_int_equal(flm_session_chat_turn(s, c, &msg, 1, &ti, &err), FLM_OK);
    assert_true(ti.from_start && ti.n_new > 0);
    n = 0;
    assert_int_equal(flm_session_generate(s, &gp, count_tokens, &n, &r, &err), FLM_OK);
    flm_spec_stats ss;
    flm_session_spec_stats(s, &ss);
    assert_int_equal(ss.n_gen, (uint64_t)r.n_gen);
    size_t held = 0;
    assert_non_null(flm_session_chat_text(s, &held));
    assert_true(held > 0);
    flm_session_chat_reset(s);
    assert_int_equal(flm_session_n_past(s), 0);
    flm_chat_close(c);
    flm_session_free(s);
    flm_session_free(NULL);
    flm_close(ctx);
}

typedef struct {
    int n, n_warn;
    char all[4096];
} log_seen;

static void collect(void *user, flm_log_level level, const char *msg) {
    log_seen *s = user;
    s->n++;
    s->n_warn += level == FLM_LOG_WARN;
    assert_null(strchr(msg, '\n')); /* one line, no newline */
    strncat(s->all, msg, sizeof s->all - strlen(s->all) - 2);
    strcat(s->all, "|");
}

/* Open a .flm with stderr redirected into a file; return what went to stderr (malloc'd). */
static char *open_quietly(const char *path, flm_params *p, flm_ctx **ctx, flm_status *st, flm_error *err) {
    const char *cap = tu_tmp("stderr", ".txt");
    fflush(stderr);
    int saved = dup(2), fd = open(cap, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    *st = flm_open(path, p, ctx, err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    size_t n;
    char *text = (char *)tu_read_file(cap, &n);
    remove(cap);
    return text;
}

static void test_log_callback_not_stderr(void **state) {
    (void)state;
    char flm[4096], args[8192];
    snprintf(flm, sizeof flm, "%s", tu_tmp("public", ".flm"));
    snprintf(args, sizeof args, "convert '%s' '%s' 2>&1", tu_data("models/stories260K/stories260K.gguf"), flm);
    assert_int_equal(tu_run_cli(args, NULL), 0);
    /* a probe file next to the model that cannot be used: the library must not read it unless asked */
    char probe[4200];
    snprintf(probe, sizeof probe, "%s.probe.json", flm);
    tu_write_file(probe, "not json", 8);

    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = 64;
    p.mem_bytes = 1000 * 1024; /* below the 1.02 MiB model; uncalibrated: auto runs hybrid and says so */
    log_seen seen = {0};
    p.log = collect;
    p.log_user = &seen;
    flm_ctx *ctx = NULL;
    flm_status st;
    flm_error err;
    char *out = open_quietly(flm, &p, &ctx, &st, &err);
    if (st) fail_msg("open: %s", err.msg);
    assert_string_equal(out, ""); /* nothing on stderr */
    free(out);
    assert_non_null(strstr(seen.all, "not calibrated, so it runs hybrid"));
    assert_null(strstr(seen.all, "probe")); /* the file next to the model was not read */
    assert_true(seen.n_warn >= 1);
    /* the plan, from the public archive: what the context runs, computed without opening the model */
    flm_plan_info plan, ran;
    assert_int_equal(flm_plan(flm, &p, &plan, &err), FLM_OK);
    flm_get_plan(ctx, &ran);
    assert_int_equal(plan.mode, FLM_MODE_HYBRID);
    assert_int_equal(ran.mode, plan.mode);
    assert_int_equal(ran.total, plan.total);
    assert_true(plan.total <= p.mem_bytes);
    flm_stats sst;
    flm_get_stats(ctx, &sst);
    assert_int_equal(sst.mem_resident + sst.mem_ffn + sst.mem_kv + sst.mem_scratch, plan.total);
    flm_close(ctx);

    /* named explicitly, the unusable file is reported through the callback, and the open still succeeds */
    memset(&seen, 0, sizeof seen);
    p.io_cost_path = probe;
    out = open_quietly(flm, &p, &ctx, &st, &err);
    if (st) fail_msg("open with io_cost_path: %s", err.msg);
    assert_string_equal(out, "");
    free(out);
    assert_non_null(strstr(seen.all, probe));
    assert_non_null(strstr(seen.all, "using the default I/O cost model"));
    /* replaced after open: later messages go to the new callback (here: none) */
    flm_set_log_callback(ctx, NULL, NULL);
    const float *logits;
    assert_int_equal(flm_eval(ctx, 1, 0, &logits, &err), FLM_OK);
    flm_close(ctx);

    /* no callback at all: still nothing on stderr */
    p.log = NULL;
    out = open_quietly(flm, &p, &ctx, &st, &err);
    assert_int_equal(st, FLM_OK);
    assert_string_equal(out, "");
    free(out);
    flm_close(ctx);
    remove(probe);
    remove(flm);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_names_stay_inside),
        cmocka_unit_test(test_vocab_and_chat),
        cmocka_unit_test(test_session),
        cmocka_unit_test(test_log_callback_not_stderr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
