/* test_plan.c — the memory plan's one owner (runtime/plan.c, docs/ARCHITECTURE.md "Memory budget"): flm_plan gives,
 * without opening the model, the plan flm_open then carries out — the same mode, the same bytes per part, the same
 * refusal — on stories260K (GGUF; .flm with a tied embedding; the same calibrated) and a synthetic untied model, in
 * every mode over a range of budgets; flm_plan_split never gives a draft and a target more than the budget; the CLI's
 * `flashlm plan` prints the plan and refuses as `run` does. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flashlm.h"
#include "calibrate/calibrate.h"
#include "convert/convert.h"
#include "synth/synth.h"
#include "sparsity/sparsity.h"
#include "testutil.h"

static char gguf_path[4096], tied_path[4096], cal_path[4096], synth_gguf[4096], synth_path[4096], relu_gguf[4096],
    relu_path[4096], hot_path[4096];

static int setup(void **state) {
    (void)state;
    snprintf(gguf_path, sizeof gguf_path, "%s", tu_data("models/stories260K/stories260K.gguf"));
    snprintf(tied_path, sizeof tied_path, "%s", tu_tmp("plan-tied", ".flm"));
    snprintf(cal_path, sizeof cal_path, "%s", tu_tmp("plan-cal", ".flm"));
    snprintf(synth_gguf, sizeof synth_gguf, "%s", tu_tmp("plan-synth", ".gguf"));
    snprintf(synth_path, sizeof synth_path, "%s", tu_tmp("plan-synth", ".flm"));
    snprintf(relu_gguf, sizeof relu_gguf, "%s", tu_tmp("plan-relu", ".gguf"));
    snprintf(relu_path, sizeof relu_path, "%s", tu_tmp("plan-relu", ".flm"));
    snprintf(hot_path, sizeof hot_path, "%s", tu_tmp("plan-hot", ".flm"));
    flm_synth_params sp;
    flm_synth_params_default(&sp);
    sp.d_model = 64;
    sp.d_ffn = 256;
    sp.n_layers = 4;
    sp.n_heads = 4;
    sp.n_kv_heads = 2;
    sp.n_vocab = 512;
    sp.n_ctx = 256;
    sp.type = FLM_TYPE_Q8_0;
    sp.rank = 16;
    sp.n_threads = 1;
    /* a ReLU model whose FFN dominates, calibrated: auto runs it sparse at 80-90% of its size */
    flm_synth_params rp = sp;
    rp.d_model = 128;
    rp.d_ffn = 1024;
    rp.type = FLM_TYPE_F16;
    rp.act = FLM_ACT_RELU;
    rp.active = 0.05;
    rp.n_kv_heads = 4;
    flm_error err;
    if (flm_convert(gguf_path, tied_path, NULL, NULL, &err) || flm_convert(gguf_path, cal_path, NULL, NULL, &err) ||
        flm_synth_write(synth_gguf, &sp, FLM_OUT_REPLACE, NULL, NULL, &err) || flm_convert(synth_gguf, synth_path, NULL, NULL, &err) ||
        flm_synth_write(relu_gguf, &rp, FLM_OUT_REPLACE, NULL, NULL, &err) || flm_convert(relu_gguf, relu_path, NULL, NULL, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    /* stories260K stored hottest first: auto runs it hot, with the self-draft, under a budget */
    size_t hlen;
    char *htext = (char *)tu_read_file(tu_data("text/tinystories_sample.txt"), &hlen);
    htext[hlen < 30000 ? hlen : 30000] = 0;
    flm_status hst = flm_convert(gguf_path, hot_path, NULL, NULL, &err);
    if (!hst) hst = flm_hot_order(hot_path, htext, 512, 128, 1, NULL, NULL, &err);
    free(htext);
    if (hst) {
        fprintf(stderr, "setup (hot order): %s\n", err.msg);
        return -1;
    }
    const char *texts[2] = {"text/tinystories_sample.txt", "text/sentences.txt"}, *paths[2] = {cal_path, relu_path};
    for (int i = 0; i < 2; i++) {
        size_t len;
        char *text = (char *)tu_read_file(tu_data(texts[i]), &len);
        flm_calib_opts o;
        flm_calib_opts_default(&o);
        o.text = text;
        o.chunk = 64;
        o.max_tokens = 2048;
        o.n_threads = 1;
        flm_predictor_region rep;
        flm_status st = flm_calibrate(paths[i], &o, &rep, &err);
        if (!st) flm_predictor_region_free(&rep);
        free(text);
        if (st) { fprintf(stderr, "calibrate %s: %s\n", paths[i], err.msg); return -1; }
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(tied_path);
    remove(cal_path);
    remove(synth_gguf);
    remove(synth_path);
    remove(relu_gguf);
    remove(relu_path);
    remove(hot_path);
    return 0;
}

static uint64_t parts_sum(const flm_plan_info *p) {
    return p->resident + p->kv + p->scratch + p->reader + p->ffn_resident + p->stream + p->predictors + p->cache +
           p->spec;
}

/* flm_plan, then flm_open with the same parameters: both refuse with the same code and message, or the context runs
 * the plan's mode with the plan's bytes. Returns 1 when it opened, 0 when both refused. */
static int check_same(const char *path, const flm_params *p, flm_plan_info *out) {
    flm_plan_info plan;
    flm_error pe, oe;
    memset(&pe, 0, sizeof pe);
    memset(&oe, 0, sizeof oe);
    flm_status ps = flm_plan(path, p, &plan, &pe);
    flm_ctx *ctx = NULL;
    flm_status os = flm_open(path, p, &ctx, &oe);
    if (ps != os)
        fail_msg("%s, mode %s, budget %llu / %g%%: flm_plan says %d (%s), flm_open %d (%s)", path,
                 flm_mode_name(p->mode), (unsigned long long)p->mem_bytes, p->mem_percent, ps, ps ? pe.msg : "",
                 os, os ? oe.msg : "");
    if (ps) {
        assert_string_equal(pe.msg, oe.msg);
        return 0;
    }
    assert_int_not_equal(plan.mode, FLM_MODE_AUTO);
    assert_true(plan.reason[0] != 0);
    assert_int_equal(plan.total, parts_sum(&plan));
    if (plan.budget) assert_true(plan.total <= plan.budget);
    if (p->mode != FLM_MODE_AUTO) assert_int_equal(plan.mode, p->mode);
    flm_stats st;
    flm_get_stats(ctx, &st);
    if (strcmp(st.mode, flm_mode_name(plan.mode)))
        fail_msg("%s, budget %llu / %g%%: planned %s (%s), runs %s", path, (unsigned long long)p->mem_bytes,
                 p->mem_percent, flm_mode_name(plan.mode), plan.reason, st.mode);
    /* the context holds every part but auto's speculative buffers, which its session allocates */
    uint64_t opened = st.mem_resident + st.mem_ffn + st.mem_kv + st.mem_scratch + plan.spec;
    if (opened != plan.total)
        fail_msg("%s, mode %s, budget %llu / %g%%: planned %llu bytes, open reports %llu (resident %llu/%llu, ffn "
                 "%llu, kv %llu/%llu, scratch %llu/%llu+%llu)", path, flm_mode_name(plan.mode),
                 (unsigned long long)p->mem_bytes, p->mem_percent, (unsigned long long)plan.total,
                 (unsigned long long)opened, (unsigned long long)plan.resident, (unsigned long long)st.mem_resident,
                 (unsigned long long)st.mem_ffn, (unsigned long long)plan.kv, (unsigned long long)st.mem_kv,
                 (unsigned long long)st.mem_scratch, (unsigned long long)plan.scratch, (unsigned long long)plan.reader);
    assert_int_equal(st.mem_kv, plan.kv);
    assert_int_equal(st.mem_resident, plan.resident);
    assert_int_equal(st.n_ctx, plan.n_ctx);
    assert_int_equal(st.n_batch, plan.n_batch);
    if (!plan.gguf) {
        assert_int_equal(st.mem_budget, plan.budget);
        assert_int_equal(st.model_bytes, plan.model_bytes);
        assert_int_equal(st.n_ffn_resident_layers, plan.n_resident_layers);
        assert_int_equal(st.mem_embd_flash, plan.embd == FLM_PLAN_EMBD_FLASH ? plan.embd_bytes : 0);
    }
    flm_plan_info got; /* what the context says it carries out */
    flm_get_plan(ctx, &got);
    assert_int_equal(got.mode, plan.mode);
    assert_int_equal(got.total, plan.total);
    assert_string_equal(got.reason, plan.reason);
    /* the budget per device: flm_open's CPU backend holds everything in host memory, its block (KV caches,
     * activations) inside the plan's KV cache and scratch */
    assert_int_equal(plan.n_devices, 1);
    assert_string_equal(plan.device[0].name, "host");
    assert_int_equal(plan.device[0].bytes, plan.total);
    assert_true(plan.device[0].block > plan.kv && plan.device[0].block <= plan.kv + plan.scratch);
    assert_int_equal(got.n_devices, 1);
    assert_int_equal(got.device[0].bytes, got.total);
    assert_int_equal(got.device[0].block, plan.device[0].block);
    flm_close(ctx);
    if (out) *out = plan;
    return 1;
}

/* Every mode at budgets from far too small to none, on each model: the plan is what open does. */
/* flm_parse_mem: decimal budgets with K/M/G/T suffixes and percentages; not hex, exponents, signs, blanks or a
 * fraction of a byte (strtod alone took "0x10" as 16 bytes and "1.5" as 1). */
static void test_parse_mem(void **state) {
    (void)state;
    uint64_t b;
    double pct;
    assert_true(flm_parse_mem("601M", &b, &pct));
    assert_int_equal(b, 601ull << 20);
    assert_true(flm_parse_mem("1.5G", &b, &pct));
    assert_int_equal(b, 3ull << 29);
    assert_true(flm_parse_mem("2KiB", &b, &pct));
    assert_int_equal(b, 2048);
    assert_true(flm_parse_mem("4096", &b, &pct));
    assert_int_equal(b, 4096);
    assert_true(flm_parse_mem("50%", &b, &pct));
    assert_true(pct == 50.0 && b == 0);
    assert_true(flm_parse_mem("0", &b, &pct));
    assert_true(b == 0 && pct == 0);
    const char *bad[] = {"0x10", "1e9", "+5", " 5", "-1", "1.5", ".5", "5.", "inf", "nan", "5X", "", "5%%", "1.5.2G"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (flm_parse_mem(bad[i], &b, &pct)) fail_msg("flm_parse_mem took '%s'", bad[i]);
    }
}

static void test_plan_is_what_open_does(void **state) {
    (void)state;
    const char *paths[] = {gguf_path, tied_path, cal_path, synth_path, relu_path};
    const flm_mode modes[] = {FLM_MODE_AUTO, FLM_MODE_RAM, FLM_MODE_NAIVE, FLM_MODE_HYBRID, FLM_MODE_SPARSE};
    const double pct[] = {0, 10, 40, 55, 70, 85, 90, 100, 130, 250};
    int opened = 0, refused = 0, sparse_auto = 0, hybrid_auto = 0;
    for (size_t m = 0; m < sizeof paths / sizeof *paths; m++)
        for (size_t k = 0; k < sizeof modes / sizeof *modes; k++)
            for (size_t b = 0; b < sizeof pct / sizeof *pct; b++)
                for (int c = 0; c < 2; c++) {
                    flm_params p;
                    flm_params_default(&p);
                    p.n_threads = 1;
                    p.n_ctx = c ? 0 : 64;
                    p.mode = modes[k];
                    p.mem_percent = pct[b];
                    if (c && b == 4) p.kv_f32 = true;
                    flm_plan_info plan;
                    if (check_same(paths[m], &p, &plan)) {
                        opened++;
                        if (modes[k] == FLM_MODE_AUTO && plan.mode == FLM_MODE_SPARSE) sparse_auto++;
                        if (modes[k] == FLM_MODE_AUTO && plan.mode == FLM_MODE_HYBRID) hybrid_auto++;
                    } else {
                        refused++;
                    }
                }
    print_message("plans: %d opened as planned, %d refused by both; auto chose sparse %d times, hybrid %d\n",
                  opened, refused, sparse_auto, hybrid_auto);
    assert_true(opened > 40);
    assert_true(refused > 10);
    assert_true(hybrid_auto > 0); /* the uncalibrated models under a budget; stories260K's sparse does not pay */
    assert_true(sparse_auto > 0); /* the calibrated ReLU model at 85-90% */
}

/* A budget in bytes, and the messages: a budget too small is refused by flm_plan as by flm_open. */
static void test_refusals(void **state) {
    (void)state;
    const uint64_t budgets[] = {1, 64 << 10, 300 << 10, 600 << 10, 800 << 10, 1000 << 10, 1200 << 10, 4 << 20};
    for (size_t b = 0; b < sizeof budgets / sizeof *budgets; b++) {
        flm_params p;
        flm_params_default(&p);
        p.n_threads = 1;
        p.n_ctx = 64;
        p.mem_bytes = budgets[b];
        check_same(tied_path, &p, NULL);
        check_same(cal_path, &p, NULL);
        check_same(gguf_path, &p, NULL);
    }
    flm_params p;
    flm_params_default(&p);
    p.mem_bytes = 300 << 10;
    p.n_ctx = 64;
    flm_plan_info plan;
    flm_error err;
    assert_int_equal(flm_plan(tied_path, &p, &plan, &err), FLM_ERR_BUDGET);
    assert_non_null(strstr(err.msg, "resident weights"));
    p.mode = FLM_MODE_NAIVE; /* a GGUF cannot stream */
    assert_int_equal(flm_plan(gguf_path, &p, &plan, &err), FLM_ERR_ARG);
    p.mode = FLM_MODE_SPARSE; /* not calibrated */
    p.mem_bytes = 0;
    assert_int_equal(flm_plan(tied_path, &p, &plan, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "calibrate"));
    assert_int_equal(flm_plan("/nonexistent/model.flm", NULL, &plan, &err), FLM_ERR_IO);
    p.n_threads = 0;
    assert_int_equal(flm_plan(tied_path, &p, &plan, &err), FLM_ERR_ARG);
}

/* auto: ram when it fits; an uncalibrated model that does not fit runs hybrid and says to calibrate; the reason for
 * sparse (or why not) is given. */
static void test_auto_reasons(void **state) {
    (void)state;
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = 64;
    flm_plan_info plan;
    flm_error err;
    assert_int_equal(flm_plan(tied_path, &p, &plan, &err), FLM_OK);
    assert_int_equal(plan.mode, FLM_MODE_RAM);
    assert_non_null(strstr(plan.reason, "no budget"));
    p.mem_percent = 250;
    assert_int_equal(flm_plan(tied_path, &p, &plan, &err), FLM_OK);
    assert_int_equal(plan.mode, FLM_MODE_RAM);
    assert_non_null(strstr(plan.reason, "fits"));
    p.mem_percent = 90;
    assert_int_equal(flm_plan(tied_path, &p, &plan, &err), FLM_OK);
    assert_int_equal(plan.mode, FLM_MODE_HYBRID);
    assert_non_null(strstr(plan.reason, "not calibrated"));
    p.mem_percent = 100; /* calibrated, but its predicted sets are what hybrid streams */
    assert_int_equal(flm_plan(cal_path, &p, &plan, &err), FLM_OK);
    assert_int_equal(plan.mode, FLM_MODE_HYBRID);
    assert_non_null(strstr(plan.reason, "running hybrid instead"));
    p.mem_percent = 90;
    assert_int_equal(flm_plan(relu_path, &p, &plan, &err), FLM_OK);
    assert_int_equal(plan.mode, FLM_MODE_SPARSE);
    assert_non_null(strstr(plan.reason, "calibrated"));
    assert_true(plan.predictors > 0 && plan.cache > 0);
    p.mode = FLM_MODE_NAIVE;
    assert_int_equal(flm_plan(cal_path, &p, &plan, &err), FLM_OK);
    assert_non_null(strstr(plan.reason, "as asked"));
    /* --mem N% is of the model's weight bytes */
    p.mode = FLM_MODE_AUTO;
    p.mem_percent = 90;
    assert_int_equal(flm_plan(relu_path, &p, &plan, &err), FLM_OK);
    assert_int_equal(plan.budget, (uint64_t)((double)plan.model_bytes * 0.9));
}

/* One budget for a draft and a target: never more than the budget; a draft that leaves nothing is refused. */
static void test_split(void **state) {
    (void)state;
    const double pct[] = {60, 90, 120, 200, 400};
    const uint64_t extra[] = {0, 16 << 10, 200 << 10};
    int ok = 0;
    for (size_t b = 0; b < sizeof pct / sizeof *pct; b++)
        for (size_t e = 0; e < sizeof extra / sizeof *extra; e++)
            for (int with_draft = 0; with_draft < 2; with_draft++) {
                flm_params t, d;
                flm_params_default(&t);
                flm_params_default(&d);
                t.n_threads = d.n_threads = 1;
                t.n_ctx = d.n_ctx = 64;
                t.mem_percent = pct[b];
                d.mode = FLM_MODE_RAM;
                flm_plan_pair pr;
                flm_error err;
                flm_status st = flm_plan_split(cal_path, &t, with_draft ? gguf_path : NULL, &d, extra[e], &pr, &err);
                assert_true(pr.budget > 0);
                if (st) {
                    assert_int_equal(st, FLM_ERR_BUDGET);
                    continue;
                }
                ok++;
                uint64_t draft = with_draft ? pr.draft.total : 0;
                assert_true(draft + pr.extra + pr.target.total <= pr.budget);
                assert_true(pr.target.budget <= pr.budget);
                if (with_draft) assert_int_equal(pr.target.budget, pr.budget - draft - pr.extra);
                assert_int_equal(pr.target.total, parts_sum(&pr.target));
                /* the target opens as planned with the budget it got */
                t.mem_percent = 0;
                t.mem_bytes = pr.target.budget;
                flm_plan_info again;
                assert_int_equal(check_same(cal_path, &t, &again), 1);
                assert_int_equal(again.total, pr.target.total);
            }
    assert_true(ok > 5);
    /* a draft that takes the whole budget */
    flm_params t, d;
    flm_params_default(&t);
    flm_params_default(&d);
    t.n_ctx = d.n_ctx = 64;
    t.mem_bytes = 1600 << 10;
    d.mode = FLM_MODE_RAM;
    flm_plan_pair pr;
    flm_error err;
    assert_int_equal(flm_plan_split(cal_path, &t, gguf_path, &d, 1 << 20, &pr, &err), FLM_ERR_BUDGET);
    assert_non_null(strstr(err.msg, "nothing is left"));
    t.mem_bytes = 200 << 10; /* the draft alone does not fit */
    assert_int_equal(flm_plan_split(cal_path, &t, gguf_path, &d, 0, &pr, &err), FLM_ERR_BUDGET);
    assert_non_null(strstr(err.msg, "draft model: "));
}

/* flashlm plan: the plan's lines without opening the model; a budget too small: exit 1 with run's message. */
static void test_cli_plan(void **state) {
    (void)state;
    char args[8192], *out = NULL, *run = NULL;
    snprintf(args, sizeof args, "plan -m '%s' --mem 90%% -c 64 2>&1", tied_path);
    if (tu_run_cli(args, &out)) fail_msg("plan failed: %s", out);
    const char *want[] = {"plan: mode hybrid", "plan:   why", "not calibrated", "plan:   resident weights",
                          "plan:   KV cache", "plan:   scratch", "plan:   reader", "plan:   FFN in memory",
                          "plan:   device host", "(KV cache, activations)"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strstr(out, want[i])) fail_msg("'%s' missing from:\n%s", want[i], out);
    free(out);
    snprintf(args, sizeof args, "plan -m '%s' --mem 300K -c 64 2>&1", tied_path);
    assert_int_equal(tu_run_cli(args, &out), 1);
    snprintf(args, sizeof args, "run -m '%s' --mem 300K -c 64 -p hi -n 1 2>&1", tied_path);
    assert_int_equal(tu_run_cli(args, &run), 1);
    assert_non_null(strstr(out, "too small"));
    assert_string_equal(out, run);
    free(out);
    free(run);
    assert_int_equal(tu_run_cli("plan --help", &out), 0);
    assert_non_null(strstr(out, "without loading"));
    free(out);
}

/* The lines of out that start with prefix, each NUL-terminated in a fresh array (free both). */
static char **lines_with(const char *out, const char *prefix, int *n) {
    char **v = calloc(256, sizeof *v);
    *n = 0;
    for (const char *p = out; p && *p && *n < 256;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (!strncmp(p, prefix, strlen(prefix))) v[(*n)++] = strndup(p, len);
        p = e ? e + 1 : NULL;
    }
    return v;
}

static void free_lines(char **v, int n) {
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

/* Every "flashlm: plan:" line `flashlm plan` prints appears in out (what run, chat or serve printed). */
static void same_plan_lines(const char *plan_out, const char *out, const char *who) {
    int n;
    char **v = lines_with(plan_out, "flashlm: plan:", &n);
    assert_true(n >= 8);
    for (int i = 0; i < n; i++)
        if (!strstr(out, v[i])) fail_msg("%s does not print flashlm plan's line\n%s\nin:\n%s", who, v[i], out);
    free_lines(v, n);
}

/* Mode auto's whole decision is the library's (flm_plan): on a file stored hottest first under a budget it runs hot
 * and decodes with the self-draft, whose buffers are inside the budget; `flashlm plan`, `run --stats`, `chat -v`,
 * `serve -v` and `bench` print the same plan, and --no-draft takes the buffers away in every one of them. */
static void test_auto_self_draft_everywhere(void **state) {
    (void)state;
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = 64;
    p.mem_percent = 80;
    flm_plan_info plan, off;
    flm_error err;
    assert_int_equal(flm_plan(hot_path, &p, &plan, &err), FLM_OK);
    assert_int_equal(plan.mode, FLM_MODE_HOT);
    assert_true(plan.self_draft);
    assert_int_equal(plan.draft_tree, FLM_AUTO_DRAFT_TREE);
    assert_int_equal(plan.draft_depth, FLM_AUTO_DRAFT_DEPTH);
    flm_spec_params sp; /* the buffers a sampling session allocates for that tree */
    flm_spec_params_default(&sp);
    sp.self_draft = true;
    sp.tree = plan.draft_tree;
    sp.n_draft = plan.draft_depth;
    assert_int_equal(plan.spec, flm_spec_buffer_bytes(plan.n_vocab, plan.n_ctx, &sp, false, false));
    assert_true(plan.total <= plan.budget);
    assert_int_equal(check_same(hot_path, &p, NULL), 1);
    /* the session applies it */
    flm_ctx *ctx = NULL;
    flm_session *sess = NULL;
    assert_int_equal(flm_open(hot_path, &p, &ctx, &err), FLM_OK);
    assert_int_equal(flm_session_create(ctx, &sess, &err), FLM_OK);
    assert_int_equal(flm_session_prompt_text(sess, "Once upon a time", 16, FLM_TOKENIZE_ADD_SPECIAL, NULL, &err),
                     FLM_OK);
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = 12;
    assert_int_equal(flm_session_generate(sess, &gp, NULL, NULL, NULL, &err), FLM_OK);
    flm_spec_stats ss;
    flm_session_spec_stats(sess, &ss);
    assert_true(ss.n_passes > 0 && ss.n_gen > 0);
    flm_session_free(sess);
    flm_close(ctx);
    p.no_draft = true; /* no self-draft: no buffers, the same budget */
    assert_int_equal(flm_plan(hot_path, &p, &off, &err), FLM_OK);
    assert_int_equal(off.mode, FLM_MODE_HOT);
    assert_false(off.self_draft);
    assert_int_equal(off.spec, 0);
    assert_int_equal(off.budget, plan.budget);
    assert_int_equal(check_same(hot_path, &p, NULL), 1);

    char args[16384], *po = NULL, *out = NULL;
    for (int no = 0; no < 2; no++) {
        const char *nd = no ? " --no-draft" : "";
        snprintf(args, sizeof args, "plan -m '%s' --mem 80%% -c 64 -t 1%s 2>&1", hot_path, nd);
        if (tu_run_cli(args, &po)) fail_msg("plan failed: %s", po);
        assert_true((strstr(po, "plan:   self-draft") != NULL) == !no);
        snprintf(args, sizeof args, "run -m '%s' --mem 80%% -c 64 -t 1%s -p 'Once upon a time' -n 8 --temp 0 --stats "
                 "2>&1", hot_path, nd);
        if (tu_run_cli(args, &out)) fail_msg("run failed: %s", out);
        same_plan_lines(po, out, "run --stats");
        assert_true((strstr(out, "self-draft buffers") != NULL) == !no);
        free(out);
        snprintf(args, sizeof args, "chat -m '%s' --mem 80%% -c 64 -t 1%s -n 4 -v < /dev/null 2>&1", hot_path, nd);
        if (tu_run_cli(args, &out)) fail_msg("chat failed: %s", out);
        same_plan_lines(po, out, "chat -v");
        free(out);
        /* serve prints its slot's plan before it listens; stopped by SIGINT once it did */
        char log[1024];
        snprintf(log, sizeof log, "%.1000s", tu_tmp("plan-serve", ".log"));
        snprintf(args, sizeof args, "serve -m '%s' --mem 80%% -c 64 -t 1%s -v --port %d > '%s' 2>&1 & P=$!; "
                 "for i in $(seq 300); do grep -q 'plan:   FFN' '%s' && break; sleep 0.1; done; kill -INT $P; wait $P; "
                 "cat '%s'", hot_path, nd, 20000 + (int)(getpid() % 20000), log, log, log);
        tu_run_cli(args, &out);
        remove(log);
        same_plan_lines(po, out, "serve -v");
        free(out);
        snprintf(args, sizeof args, "bench -m '%s' --mem 80%% -c 64 -t 1%s --modes auto --prompt-tokens 4 "
                 "--gen-tokens 4 2>&1", hot_path, nd);
        if (tu_run_cli(args, &out)) fail_msg("bench failed: %s", out);
        const flm_plan_info *want = no ? &off : &plan;
        char part[256];
        snprintf(part, sizeof part, "plan auto: mode hot, budget %.2f MiB", want->budget / 1048576.0);
        if (!strstr(out, part)) fail_msg("'%s' missing from bench's:\n%s", part, out);
        snprintf(part, sizeof part, "MiB = %.2f MiB", want->total / 1048576.0);
        if (!strstr(out, part)) fail_msg("'%s' missing from bench's:\n%s", part, out);
        assert_true((strstr(out, "+ self-draft") != NULL) == !no);
        free(out);
        free(po);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_mem),
        cmocka_unit_test(test_plan_is_what_open_does),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_auto_reasons),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_cli_plan),
        cmocka_unit_test(test_auto_self_draft_everywhere),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
