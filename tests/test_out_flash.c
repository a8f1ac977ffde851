/* test_out_flash.c — the classifier on flash (issue 30, `--mem 25%`): when a streaming mode does not fit with the
 * classifier in memory, the plan leaves it (past the self-draft's rows) on flash and every pass reads it in chunks
 * (runtime/budget.c, flash.c flm_flash_output). Checked: the plan says so, flm_open carries out the same plan; the
 * logits of decoding and of a batch are bit for bit ram mode's, on a tied model (stories260K: the classifier is the
 * token embedding, read from the resident region's tail) and an untied one (a synthetic model: output.weight in the
 * head, loaded without its rows on flash, their sums made at load); a budget too small even so is refused by the
 * plan and by open with the same message, which names the classifier on flash; a corrupted classifier row on flash
 * is caught by the checked reads; and, measured from outside the process, SmolLM2 at --mem 50% (refused before)
 * prints ram mode's greedy text with peak RSS within the budget + FLM_RSS_ALLOWANCE. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flashlm.h"
#include "calibrate/calibrate.h"
#include "convert/convert.h"
#include "format/gguf.h"
#include "format/flm.h"
#include "synth/synth.h"
#include "testutil.h"

static char tied_path[4096], synth_gguf[4096], synth_path[4096];

/* The synthetic untied model's shape: d_model 64, 4 layers, a 2000-row q8_0 classifier (136 KiB), d_ffn as given. */
static void synth_params(flm_synth_params *sp, uint32_t d_ffn) {
    flm_synth_params_default(sp);
    sp->d_model = 64;
    sp->d_ffn = d_ffn;
    sp->n_layers = 4;
    sp->n_heads = 4;
    sp->n_kv_heads = 2;
    sp->n_vocab = 2000;
    sp->n_ctx = 256;
    sp->type = FLM_TYPE_Q8_0;
    sp->rank = 16;
    sp->n_threads = 1;
}

static int setup(void **state) {
    (void)state;
    snprintf(tied_path, sizeof tied_path, "%s", tu_tmp("outflash-tied", ".flm"));
    snprintf(synth_gguf, sizeof synth_gguf, "%s", tu_tmp("outflash-synth", ".gguf"));
    snprintf(synth_path, sizeof synth_path, "%s", tu_tmp("outflash-synth", ".flm"));
    flm_synth_params sp;
    synth_params(&sp, 256); /* a classifier (q8_0, 136 KiB) as large as the rest of the resident region */
    flm_error err;
    if (flm_convert(tu_data("models/stories260K/stories260K.gguf"), tied_path, NULL, NULL, &err) ||
        flm_synth_write(synth_gguf, &sp, FLM_OUT_REPLACE, NULL, NULL, &err) ||
        flm_convert(synth_gguf, synth_path, NULL, NULL, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(tied_path);
    remove(synth_gguf);
    remove(synth_path);
    return 0;
}

static void params(flm_params *p, flm_mode mode, uint64_t mem) {
    flm_params_default(p);
    p->n_threads = 2;
    p->n_ctx = 64;
    p->mode = mode;
    p->mem_bytes = mem;
}

/* The largest budget (in 1 KiB steps, from the model's size down) at which path in mode plans with the classifier on
 * flash (its plan in *out); 0 when none does. */
static uint64_t out_flash_budget(const char *path, flm_mode mode, int draft_vocab, flm_plan_info *out) {
    for (uint64_t mem = 4u << 20; mem >= (64u << 10); mem -= 1024) {
        flm_params p;
        params(&p, mode, mem);
        p.draft_vocab = draft_vocab;
        flm_error err;
        if (flm_plan(path, &p, out, &err) == FLM_OK && out->out_flash_bytes) return mem;
    }
    return 0;
}

/* ids[0..T) from position 0 in ram mode and in mode at mem: every token's logits bit for bit, one token at a time
 * and as one batch; the opened context runs the plan's classifier on flash and read it. */
static void same_as_ram(const char *path, flm_mode mode, uint64_t mem, int draft_vocab) {
    flm_params pr, ps;
    params(&pr, FLM_MODE_RAM, 0);
    params(&ps, mode, mem);
    ps.draft_vocab = draft_vocab;
    flm_error err;
    flm_ctx *ram = NULL, *st = NULL;
    assert_int_equal(flm_open(path, &pr, &ram, &err), FLM_OK);
    if (flm_open(path, &ps, &st, &err)) fail_msg("%s at %llu bytes: %s", path, (unsigned long long)mem, err.msg);
    flm_plan_info plan;
    flm_get_plan(st, &plan);
    assert_true(plan.out_flash_bytes > 0);
    assert_true(plan.total <= plan.budget);
    const uint32_t V = tu_vocab(ram);
    assert_int_equal(plan.out_flash_bytes % (V - plan.out_rows_resident), 0);
    int32_t ids[12];
    uint64_t rng = 7;
    for (int i = 0; i < 12; i++) ids[i] = (int32_t)(1 + tu_rand_u64(&rng) % (V - 1));
    for (int batch = 0; batch < 2; batch++) {
        float *a = tu_logits(ram, ids, 12, batch), *b = tu_logits(st, ids, 12, batch);
        for (int t = 0; t < 12; t++)
            if (memcmp(a + (size_t)t * V, b + (size_t)t * V, V * sizeof(float)))
                fail_msg("%s, mode %s at %llu bytes, %s: token %d's logits differ from ram mode's (%g vs %g at the "
                         "argmax)", path, flm_mode_name(mode), (unsigned long long)mem, batch ? "batch" : "decoding",
                         t, a[(size_t)t * V + tu_argmax(a + (size_t)t * V, V)],
                         b[(size_t)t * V + tu_argmax(a + (size_t)t * V, V)]);
        free(a);
        free(b);
    }
    flm_stats s;
    flm_get_stats(st, &s);
    /* every pass read the classifier's rows on flash (and more): at least 24 passes' worth */
    assert_true(s.bytes_requested >= 24 * plan.out_flash_bytes);
    flm_close(ram);
    flm_close(st);
}

static void test_tied(void **state) {
    (void)state;
    const flm_mode modes[] = {FLM_MODE_NAIVE, FLM_MODE_HYBRID};
    for (int m = 0; m < 2; m++) {
        flm_plan_info plan;
        const uint64_t mem = out_flash_budget(tied_path, modes[m], 0, &plan);
        assert_true(mem > 0);
        print_message("stories260K %s: classifier on flash below %.1f KiB (%u rows in memory)\n",
                      flm_mode_name(modes[m]), mem / 1024.0, plan.out_rows_resident);
        assert_int_equal(plan.embd, FLM_PLAN_EMBD_FLASH); /* tied: the embedding goes with it */
        assert_int_equal(plan.out_rows_resident, 0);
        same_as_ram(tied_path, modes[m], mem, 0);
        same_as_ram(tied_path, modes[m], mem - 32 * 1024, 0);
    }
}

static void test_untied(void **state) {
    (void)state;
    const flm_mode modes[] = {FLM_MODE_NAIVE, FLM_MODE_HYBRID};
    for (int m = 0; m < 2; m++) {
        flm_plan_info plan;
        uint64_t mem = out_flash_budget(synth_path, modes[m], 0, &plan);
        assert_true(mem > 0);
        assert_int_equal(plan.out_rows_resident, 0); /* the vocabulary is its own draft vocabulary */
        same_as_ram(synth_path, modes[m], mem, 0);
        /* a draft vocabulary of 200 rows: they stay in memory, the other 1800 are read */
        mem = out_flash_budget(synth_path, modes[m], 200, &plan);
        assert_true(mem > 0);
        assert_int_equal(plan.out_rows_resident, 200);
        same_as_ram(synth_path, modes[m], mem, 200);
    }
}

/* Too small even with the classifier on flash: plan and open refuse alike, naming the classifier on flash. */
static void test_refused(void **state) {
    (void)state;
    const char *paths[] = {tied_path, synth_path};
    for (int i = 0; i < 2; i++) {
        flm_plan_info plan;
        uint64_t mem = out_flash_budget(paths[i], FLM_MODE_HYBRID, 0, &plan);
        assert_true(mem > 0);
        for (mem = plan.total; mem > 0; mem -= 1024) { /* the largest refused budget below the smallest plan */
            flm_params p;
            params(&p, FLM_MODE_HYBRID, mem);
            flm_error pe, oe;
            flm_status ps = flm_plan(paths[i], &p, &plan, &pe);
            if (!ps) continue;
            assert_int_equal(ps, FLM_ERR_BUDGET);
            flm_ctx *ctx = NULL;
            assert_int_equal(flm_open(paths[i], &p, &ctx, &oe), FLM_ERR_BUDGET);
            assert_string_equal(pe.msg, oe.msg);
            if (!strstr(pe.msg, "classifier") || !strstr(pe.msg, "on flash") || !strstr(pe.msg, "KV cache"))
                fail_msg("refusal without the classifier's part: %s", pe.msg);
            break;
        }
    }
}

/* A byte of an untied classifier row on flash flipped after conversion: the head's checksum (over every byte) refuses
 * the file at open, before anything runs. */
static void test_corrupt_row(void **state) {
    (void)state;
    const char *bad = tu_tmp("outflash-bad", ".flm");
    size_t len;
    uint8_t *data = tu_read_file(synth_path, &len);
    flm_file *f = NULL;
    flm_error err;
    assert_int_equal(flm_file_open(synth_path, &f, &err), FLM_OK);
    const flm_gguf_tensor *t = flm_gguf_find_tensor(f->meta, "output.weight");
    assert_non_null(t);
    const uint64_t at = f->resident->offset + f->meta->data_offset + t->offset + t->nbytes - 100;
    flm_file_close(f);
    data[at] ^= 0x40;
    tu_write_file(bad, data, len);
    free(data);
    flm_plan_info plan;
    const uint64_t mem = out_flash_budget(bad, FLM_MODE_HYBRID, 0, &plan);
    assert_true(mem > 0);
    flm_params p;
    params(&p, FLM_MODE_HYBRID, mem);
    flm_ctx *ctx = NULL;
    assert_int_equal(flm_open(bad, &p, &ctx, &err), FLM_ERR_CHECKSUM);
    assert_non_null(strstr(err.msg, "resident region"));
    remove(bad);
}

/* Run the CLI with args: its stdout into *out, its stderr into *errs (malloc'd), its peak RSS (wait4) into *peak;
 * returns its exit status. */
static char *slurp(const char *path) {
    size_t len;
    uint8_t *text = tu_read_file(path, &len);
    char *s = realloc(text, len + 1);
    s[len] = 0;
    remove(path);
    return s;
}

static int run_rss(const char *args, uint64_t *peak, char **out, char **errs) {
    char cmd[16384], o[4096], e[4096];
    snprintf(o, sizeof o, "%s", tu_tmp("outflash-out", ".txt"));
    snprintf(e, sizeof e, "%s", tu_tmp("outflash-err", ".txt"));
    snprintf(cmd, sizeof cmd, "exec '%s' %s >'%s' 2>'%s'", FLM_CLI, args, o, e);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    struct rusage ru;
    assert_int_equal(wait4(pid, &st, 0, &ru), pid);
    *peak = (uint64_t)ru.ru_maxrss * 1024;
    *out = slurp(o);
    *errs = slurp(e);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* SmolLM2-135M (tied, 105 MiB) at --mem 50% -c 512: refused before (its resident region, 46 MiB, with the KV cache
 * and the rest, is more than 52 MiB); now it runs with the classifier and the embedding on flash, prints ram mode's
 * greedy text, and its peak RSS, measured by wait4, is within the budget + the allowance. */
static void test_smollm2_half(void **state) {
    (void)state;
    const char *smol = tu_convert_pulled("smollm2-135m", "outflash-smol");
    if (!smol) skip();
    char args[8192], *ram = NULL, *half = NULL, *ram_err = NULL, *half_err = NULL;
    uint64_t peak = 0, ram_peak = 0;
    const char *gen = "-c 512 -t 2 -p 'The capital of France is a city that' -n 24 --temp 0";
    snprintf(args, sizeof args, "run -m '%s' --mode ram %s", smol, gen);
    assert_int_equal(run_rss(args, &ram_peak, &ram, &ram_err), 0);
    snprintf(args, sizeof args, "run -m '%s' --mem 50%% --stats %s", smol, gen);
    if (run_rss(args, &peak, &half, &half_err)) fail_msg("--mem 50%% refused:\n%s", half_err);
    if (!strstr(half_err, "classifier") || !strstr(half_err, "on flash, not in memory"))
        fail_msg("the plan does not leave the classifier on flash:\n%s", half_err);
    assert_true(strlen(ram) > 60);
    if (strcmp(ram, half)) fail_msg("--mem 50%% printed another text than ram mode:\nram:  %s\nhalf: %s", ram, half);
    flm_plan_info plan;
    flm_params p;
    flm_params_default(&p);
    p.n_ctx = 512;
    p.n_threads = 2;
    p.mem_percent = 50;
    flm_error err;
    assert_int_equal(flm_plan(smol, &p, &plan, &err), FLM_OK);
    print_message("SmolLM2 --mem 50%%: budget %.2f MiB, peak RSS %.2f MiB (ram mode: %.2f MiB)\n",
                  plan.budget / 1048576.0, peak / 1048576.0, ram_peak / 1048576.0);
#ifndef FLM_SANITIZED_BUILD /* shadow memory is not the engine's */
    assert_true(peak <= plan.budget + FLM_RSS_ALLOWANCE);
    assert_true(peak < ram_peak); /* and it did not hold the classifier after all */
#endif
    free(ram);
    free(half);
    free(ram_err);
    free(half_err);
    remove(smol);
}

/* Mode auto on a file stored hottest first, at a budget where it runs hot with the self-draft and the classifier on
 * flash: draft passes, trees (their logits by flm_output_rows) and verification read the classifier, and the greedy
 * text is ram mode's. */
static void test_auto_hot_self_draft(void **state) {
    (void)state;
    const char *hot = tu_tmp("outflash-hot", ".flm");
    flm_error err;
    size_t hlen;
    char *htext = (char *)tu_read_file(tu_data("text/tinystories_sample.txt"), &hlen);
    htext[hlen < 30000 ? hlen : 30000] = 0;
    flm_status hst = flm_convert(tu_data("models/stories260K/stories260K.gguf"), hot, NULL, NULL, &err);
    if (!hst) hst = flm_hot_order(hot, htext, 512, 128, 1, NULL, NULL, &err);
    free(htext);
    if (hst) fail_msg("hot order: %s", err.msg);
    uint64_t mem = 0;
    flm_plan_info plan;
    for (uint64_t m = 4u << 20; m >= (64u << 10) && !mem; m -= 1024) {
        flm_params p;
        params(&p, FLM_MODE_AUTO, m);
        if (!flm_plan(hot, &p, &plan, &err) && plan.out_flash_bytes && plan.self_draft) mem = m;
    }
    assert_true(mem > 0);
    assert_int_equal(plan.mode, FLM_MODE_HOT);
    char args[8192], *ram = NULL, *at = NULL, *ram_err = NULL, *at_err = NULL;
    uint64_t peak;
    const char *gen = "-c 64 -t 2 -p 'Once upon a time' -n 40 --temp 0";
    snprintf(args, sizeof args, "run -m '%s' --mode ram %s", hot, gen);
    assert_int_equal(run_rss(args, &peak, &ram, &ram_err), 0);
    snprintf(args, sizeof args, "run -m '%s' --mem %llu --stats %s", hot, (unsigned long long)mem, gen);
    if (run_rss(args, &peak, &at, &at_err)) fail_msg("auto at %llu bytes failed:\n%s", (unsigned long long)mem, at_err);
    if (!strstr(at_err, "classifier") || !strstr(at_err, "self-draft"))
        fail_msg("auto at %llu bytes does not run the self-draft with the classifier on flash:\n%s",
                 (unsigned long long)mem, at_err);
    assert_true(strlen(ram) > 40);
    if (strcmp(ram, at)) fail_msg("auto with the classifier on flash printed another text:\nram:  %s\nauto: %s", ram, at);
    free(ram);
    free(at);
    free(ram_err);
    free(at_err);
    /* A tree verified with some nodes' logits in the call (FLM_EVAL_LOGITS_SOME), alone and joined: the classifier's
     * rows on flash it reads are in the call's own statistics, as every other read (before, the walk's classifier
     * pass was missing from them: bench's MiB per token and its split left out ~143 MiB a pass of Qwen2.5-Coder-1.5B
     * at --mem 25%). The reader's growth over the call (bytes_requested: before alignment) is the floor. */
    for (int joined = 0; joined < 2; joined++) {
        flm_params p;
        params(&p, FLM_MODE_AUTO, mem);
        p.n_seq = joined ? 2 : 1;
        flm_ctx *ctx = NULL;
        flm_plan_info pl;
        if (!joined || flm_plan(hot, &p, &pl, &err) || !pl.out_flash_bytes) /* two KV caches may not fit: then 1 */
            p.n_seq = 1;
        if (flm_open(hot, &p, &ctx, &err)) fail_msg("open %s at %llu bytes: %s", hot, (unsigned long long)mem, err.msg);
        flm_get_plan(ctx, &pl);
        assert_true(pl.out_flash_bytes > 0);
        const int32_t prompt[4] = {1, 403, 407, 261}, tree[3] = {300, 301, 302}, par[3] = {-1, 0, 0};
        const uint32_t some[2] = {0, 2};
        flm_eval_out o;
        flm_eval_args a = {.tokens = prompt, .n = 4, .join = joined && p.n_seq > 1};
        if (flm_evaluate(ctx, &a, &o, &err)) fail_msg("prompt: %s", err.msg);
        float *lg = malloc(2 * sizeof(float) * pl.n_vocab);
        assert_non_null(lg);
        flm_stats before, after;
        flm_get_stats(ctx, &before);
        a = (flm_eval_args){.tokens = tree, .n = 3, .pos = 4, .parent = par, .logits = FLM_EVAL_LOGITS_SOME,
                            .logits_all = lg, .some = some, .n_some = 2, .join = joined && p.n_seq > 1};
        if (flm_evaluate(ctx, &a, &o, &err)) fail_msg("tree: %s", err.msg);
        flm_get_stats(ctx, &after);
        const uint64_t asked = after.bytes_requested - before.bytes_requested;
        if (o.stats.total.bytes_read < asked || asked < pl.out_flash_bytes)
            fail_msg("joined %d: the tree's call counted %llu bytes read, the reader was asked for %llu (the "
                     "classifier on flash: %llu)", joined, (unsigned long long)o.stats.total.bytes_read,
                     (unsigned long long)asked, (unsigned long long)pl.out_flash_bytes);
        free(lg);
        flm_close(ctx);
    }
    remove(hot);
}

/* Mode auto on an untied model stored hottest first (the synthetic one): where keeping the classifier in memory leaves
 * the self-draft less than half the neurons that putting its rows past the draft's vocabulary on flash would, the
 * plan puts them there (runtime/plan.c, plan_self_draft), and not otherwise. The reference for each budget is the
 * same plan without a draft vocabulary (draft_vocab -1: the classifier cannot be split, so it stays in memory); both
 * cases must occur over the budgets, and where the plan reads the classifier from flash, flm_open carries it out and
 * the logits of a prompt are ram mode's bit for bit. */
static void test_auto_classifier_for_draft(void **state) {
    (void)state;
    const char *hot = tu_tmp("outflash-synth-hot", ".flm"), *gguf = tu_tmp("outflash-synth-wide", ".gguf");
    flm_error err;
    size_t hlen;
    char *htext = (char *)tu_read_file(tu_data("text/tinystories_sample.txt"), &hlen);
    htext[hlen < 20000 ? hlen : 20000] = 0;
    flm_synth_params sp; /* the FFN (q8_0, 4 x 816 KiB) several times the classifier (136 KiB), as in a real model */
    synth_params(&sp, 4096);
    flm_status hst = flm_synth_write(gguf, &sp, FLM_OUT_REPLACE, NULL, NULL, &err);
    if (!hst) hst = flm_convert(gguf, hot, NULL, NULL, &err);
    if (!hst) hst = flm_hot_order(hot, htext, 256, 64, 1, NULL, NULL, &err);
    free(htext);
    if (hst) fail_msg("hot order: %s", err.msg);
    int n_flash = 0, n_memory = 0;
    uint64_t flash_mem = 0;
    for (uint64_t m = 8u << 20; m >= (256u << 10); m -= 16384) {
        flm_params pa, pb;
        params(&pa, FLM_MODE_AUTO, m);
        pa.draft_vocab = 500; /* of 2000 */
        params(&pb, FLM_MODE_AUTO, m);
        pb.draft_vocab = -1;
        flm_plan_info a, b;
        if (flm_plan(hot, &pa, &a, &err) || flm_plan(hot, &pb, &b, &err)) continue;
        if (!a.self_draft || !b.self_draft || b.out_flash_bytes || a.mode != FLM_MODE_HOT) continue;
        const double qa = a.hot_share + a.window_share, qb = b.hot_share + b.window_share;
        if (a.out_flash_bytes) {
            assert_int_equal(a.out_rows_resident, 500);
            if (qa < 2 * qb - 1e-4) fail_msg("at %llu bytes the classifier went to flash for %.4f of the neurons "
                                             "against %.4f", (unsigned long long)m, qa, qb);
            n_flash++;
            if (!flash_mem) flash_mem = m;
        } else {
            if (qb > 0 && qa != qb) fail_msg("at %llu bytes the plan in memory differs from the reference: %.4f "
                                             "against %.4f", (unsigned long long)m, qa, qb);
            n_memory++;
        }
    }
    printf("classifier for the draft: %d budgets with it on flash, %d in memory; first on flash at %llu bytes\n",
           n_flash, n_memory, (unsigned long long)flash_mem);
    assert_true(n_flash > 0 && n_memory > 0);
    /* carried out: open at that budget, a prompt's logits equal ram mode's */
    flm_params p, pr;
    params(&p, FLM_MODE_AUTO, flash_mem);
    p.draft_vocab = 500;
    params(&pr, FLM_MODE_RAM, 0);
    flm_ctx *ctx = NULL, *ram = NULL;
    if (flm_open(hot, &p, &ctx, &err) || flm_open(hot, &pr, &ram, &err)) fail_msg("open: %s", err.msg);
    flm_plan_info got;
    flm_get_plan(ctx, &got);
    assert_true(got.out_flash_bytes > 0 && got.self_draft);
    const int32_t prompt[5] = {1, 40, 41, 42, 43};
    flm_eval_out oa, ob;
    flm_eval_args ea = {.tokens = prompt, .n = 5};
    if (flm_evaluate(ctx, &ea, &oa, &err) || flm_evaluate(ram, &ea, &ob, &err)) fail_msg("evaluate: %s", err.msg);
    assert_memory_equal(oa.logits, ob.logits, sizeof(float) * got.n_vocab);
    assert_true(oa.stats.total.bytes_read >= got.out_flash_bytes);
    flm_close(ctx);
    flm_close(ram);
    remove(hot);
    remove(gguf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tied),
        cmocka_unit_test(test_untied),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_corrupt_row),
        cmocka_unit_test(test_smollm2_half),
        cmocka_unit_test(test_auto_hot_self_draft),
        cmocka_unit_test(test_auto_classifier_for_draft),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
