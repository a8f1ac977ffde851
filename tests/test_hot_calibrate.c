/* test_hot_calibrate.c — the hot order as calibrate's default (calibrate/hot.c, tools/cmd_calibrate.c; issue 20,
 * docs/SPECULATIVE.md):
 *   - flm_hot_order_ex under a memory budget (hybrid mode, the FFN inputs recorded to "<path>.x.tmp") gives the order
 *     the in-memory path gives (the same hottest quarter of every layer, to float rounding), and the file is the same
 *     model: ram logits equal the unordered file's to rounding, and the hot mode's logits equal ram mode's bit for bit;
 *   - a budget that cannot hold the ordering, or a file another calibrate holds, fails cleanly: the file keeps its
 *     bytes, no temporary and no recorded inputs are left;
 *   - `flashlm calibrate` with its defaults orders the neurons and then trains the predictors (the sparse mode and
 *     the hot mode both run the result); a second run keeps the order (idempotent); --no-hot keeps the old layout;
 *     --levels-only keeps it too; under --mem the ordering runs under the budget;
 *   - a write that fails part-way (a file size limit: EFBIG, as a full disk) leaves the model as it was and nothing
 *     beside it;
 *   - several texts (flm_calib_opts.text_files, `--text A --text B`): their tokens in turns of a chunk, each file
 *     from where its last turn ended, a file that ends dropping out (flm_calib_tokens, against each file tokenized
 *     alone); the hot order measured on a text and a copy of it is the order measured on the text alone.
 * stories260K from tests/data. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "calibrate/calibrate.h"
#include "format/flm.h"
#include "testutil.h"

#define MODEL "models/stories260K/stories260K.gguf"
#define TEXT "text/tinystories_sample.txt"

static char *g_text;

static int setup(void **state) {
    (void)state;
    size_t len;
    g_text = (char *)tu_read_file(tu_data(TEXT), &len);
    g_text[len < 30000 ? len : 30000] = 0;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    free(g_text);
    return 0;
}

/* A fresh unordered .flm of stories260K at a new temporary path (static ring of tu_tmp: copy it). */
static void fresh(char *out, size_t cap, const char *tag) {
    snprintf(out, cap, "%s", tu_tmp(tag, ".flm"));
    flm_error err;
    if (flm_convert(tu_data(MODEL), out, NULL, NULL, &err)) fail_msg("convert: %s", err.msg);
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* No recorded inputs, no writer's temporary or lock beside path. */
static void assert_clean(const char *path) {
    char spill[4200];
    snprintf(spill, sizeof spill, "%s.x.tmp", path);
    assert_false(exists(spill));
    assert_false(tu_temp_left(path));
}

static flm_ctx *open_mode(const char *path, flm_mode mode, uint64_t mem) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = 128;
    p.mode = mode;
    p.mem_bytes = mem;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(path, &p, &ctx, &err)) fail_msg("open %s (%s): %s", path, flm_mode_name(mode), err.msg);
    return ctx;
}

/* Share of layer l's first q * d_ffn records of a that are among b's first q * d_ffn records (compared by bytes). */
static double prefix_overlap(const char *a, const char *b, uint32_t l, double q) {
    flm_file *fa = NULL, *fb = NULL;
    flm_error err;
    assert_int_equal(flm_file_open(a, &fa, &err), FLM_OK);
    assert_int_equal(flm_file_open(b, &fb, &err), FLM_OK);
    void *ra = NULL, *rb = NULL;
    assert_int_equal(flm_file_read_region(fa, fa->ffn[l], &ra, &err), FLM_OK);
    assert_int_equal(flm_file_read_region(fb, fb->ffn[l], &rb, &err), FLM_OK);
    const uint64_t rec = fa->ffn[l]->record_bytes, n = (uint64_t)(q * fa->ffn[l]->n_records);
    assert_int_equal(rec, fb->ffn[l]->record_bytes);
    uint64_t same = 0;
    for (uint64_t i = 0; i < n; i++)
        for (uint64_t j = 0; j < n; j++)
            if (!memcmp((const uint8_t *)ra + i * rec, (const uint8_t *)rb + j * rec, rec)) { same++; break; }
    free(ra);
    free(rb);
    flm_file_close(fa);
    flm_file_close(fb);
    return n ? (double)same / (double)n : 1.0;
}

static uint32_t n_layers_of(const char *path) {
    flm_file *f = NULL;
    flm_error err;
    assert_int_equal(flm_file_open(path, &f, &err), FLM_OK);
    uint32_t n = f->n_layers;
    flm_file_close(f);
    return n;
}

/* Max |a - b| / max |a| over the logits of a fixed text, ram mode. */
static double ram_logit_diff(const char *a, const char *b) {
    flm_ctx *x = open_mode(a, FLM_MODE_RAM, 0), *y = open_mode(b, FLM_MODE_RAM, 0);
    size_t n = 0;
    int32_t *ids = flm_tokenize_all(x, "Once upon a time, there was a little girl named Lily. She liked to play.", true,
                                    &n);
    assert_non_null(ids);
    const uint32_t V = tu_vocab(x);
    float *la = tu_logits(x, ids, (int)n, false), *lb = tu_logits(y, ids, (int)n, false);
    double dmax = 0, amax = 1;
    for (size_t i = 0; i < n * V; i++) {
        if (fabs(la[i]) > amax) amax = fabs(la[i]);
        if (fabs(la[i] - lb[i]) > dmax) dmax = fabs(la[i] - lb[i]);
    }
    free(la);
    free(lb);
    free(ids);
    flm_close(x);
    flm_close(y);
    return dmax / amax;
}

static void test_order_under_budget(void **state) {
    (void)state;
    char plain[4096], ram[4096], bud[4096];
    fresh(plain, sizeof plain, "hc-plain");
    fresh(ram, sizeof ram, "hc-ram");
    fresh(bud, sizeof bud, "hc-budget");
    flm_error err;
    assert_int_equal(flm_hot_order(ram, g_text, 512, 128, 2, NULL, NULL, &err), FLM_OK);
    flm_hot_opts o;
    flm_hot_opts_default(&o);
    o.max_tokens = 512;
    o.mem_percent = 85;
    if (flm_hot_order_ex(bud, g_text, &o, &err)) fail_msg("hot order under 85%%: %s", err.msg);
    assert_true(flm_is_hot_ordered(bud));
    assert_clean(bud);
    flm_verify_info vi;
    assert_int_equal(flm_verify(bud, NULL, NULL, &vi, &err), FLM_OK);
    /* the same hottest quarter as the in-memory measurement (the scores differ in float rounding only) */
    const uint32_t L = n_layers_of(bud);
    double worst = 1;
    for (uint32_t l = 0; l < L; l++) {
        double ov = prefix_overlap(bud, ram, l, 0.25);
        if (ov < worst) worst = ov;
    }
    print_message("hot order under a budget vs in memory: the hottest quarter agrees on >= %.1f%% of every layer\n",
                  100 * worst);
    assert_true(worst >= 0.95);
    /* the same model: ram logits as the unordered file's (the FFN sums in another order) */
    double rel = ram_logit_diff(plain, bud);
    print_message("ordered under a budget vs unordered, ram: max relative logit difference %.2e\n", rel);
    assert_true(rel <= 1e-3);
    /* the hot mode, part of every layer streamed, equals ram mode on the ordered file bit for bit */
    flm_ctx *r = open_mode(bud, FLM_MODE_RAM, 0);
    uint64_t mem = 256 << 10;
    for (; mem < (1ull << 32); mem += mem / 32) { /* a budget that keeps a third to two thirds of every layer */
        flm_params p;
        flm_params_default(&p);
        p.n_ctx = 128;
        p.mode = FLM_MODE_HOT;
        p.mem_bytes = mem;
        flm_plan_info pl;
        if (!flm_plan(bud, &p, &pl, &err) && pl.hot_share >= 0.33) break;
    }
    flm_ctx *h = open_mode(bud, FLM_MODE_HOT, mem);
    flm_plan_info hi;
    flm_get_plan(h, &hi);
    print_message("hot mode keeps %.1f%% of every layer\n", 100 * hi.hot_share);
    assert_true(hi.hot_share >= 0.33 && hi.hot_share < 0.67);
    size_t n = 0;
    int32_t *ids = flm_tokenize_all(r, "One day, a little dog found a big red ball in the park.", true, &n);
    const uint32_t V = tu_vocab(r);
    float *lr = tu_logits(r, ids, (int)n, false), *lh = tu_logits(h, ids, (int)n, false);
    assert_memory_equal(lr, lh, n * V * sizeof(float));
    free(lr);
    free(lh);
    free(ids);
    flm_close(r);
    flm_close(h);
    remove(plain);
    remove(ram);
    remove(bud);
}

/* Failures leave the file as it was, with nothing beside it. */
static void test_order_failures(void **state) {
    (void)state;
    char path[4096];
    fresh(path, sizeof path, "hc-fail");
    size_t len0, len1;
    uint8_t *before = tu_read_file(path, &len0);
    flm_error err;
    flm_hot_opts o;
    flm_hot_opts_default(&o);
    o.max_tokens = 256;
    /* a budget that cannot hold the ordering (or the hybrid plan): refused, nothing written */
    o.mem_bytes = 64 << 10;
    flm_status st = flm_hot_order_ex(path, g_text, &o, &err);
    print_message("at 64 KiB: %s\n", err.msg);
    assert_int_equal(st, FLM_ERR_BUDGET);
    assert_false(flm_is_hot_ordered(path));
    assert_clean(path);
    /* another calibrate holds the file */
    o.mem_bytes = 0;
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    assert_int_equal(flm_hot_order_ex(path, g_text, &o, &err), FLM_ERR_IO);
    assert_non_null(strstr(err.msg, "another `flashlm calibrate`"));
    close(fd);
    /* a text too short */
    assert_int_equal(flm_hot_order_ex(path, "hi", &o, &err), FLM_ERR_ARG);
    uint8_t *after = tu_read_file(path, &len1);
    assert_int_equal(len0, len1);
    assert_memory_equal(before, after, len0);
    assert_clean(path);
    free(before);
    free(after);
    remove(path);
}

static char *cli(const char *args, int want_rc) {
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    if (rc != want_rc) fail_msg("flashlm %s: exit %d, want %d:\n%s", args, rc, want_rc, out ? out : "");
    return out;
}

/* The checksums of path's FFN regions, in layer order, into sums (n_layers entries). */
static void ffn_sums(const char *path, uint64_t *sums, uint32_t cap) {
    flm_file *f = NULL;
    flm_error err;
    assert_int_equal(flm_file_open(path, &f, &err), FLM_OK);
    assert_true(f->n_layers <= cap);
    for (uint32_t l = 0; l < f->n_layers; l++) sums[l] = f->ffn[l]->checksum;
    flm_file_close(f);
}

static void test_calibrate_defaults(void **state) {
    (void)state;
    char path[4096], nohot[4096], args[12288];
    fresh(path, sizeof path, "hc-cli");
    fresh(nohot, sizeof nohot, "hc-cli-nohot");
    const char *small = "--tokens 256 --chunk 64 --epochs 1 --eval-tokens 0 --rank 16 --rank-last 16 -t 2";
    /* the defaults: ordered, then calibrated */
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' %s 2>&1", path, tu_data(TEXT), small);
    char *out = cli(args, 0);
    assert_non_null(strstr(out, "stored hottest first (measured on up to 1024 tokens), then calibrated"));
    assert_non_null(strstr(out, "calibrated in"));
    free(out);
    assert_true(flm_is_hot_ordered(path));
    assert_clean(path);
    uint64_t s1[64], s2[64];
    ffn_sums(path, s1, 64);
    /* both plans run it: sparse (the predictors) and hot */
    snprintf(args, sizeof args, "run -m '%s' --mode sparse -c 64 -p 'Once upon' -n 4 --temp 0 2>&1", path);
    free(cli(args, 0));
    snprintf(args, sizeof args, "run -m '%s' --mode hot --mem 85%% -c 64 -p 'Once upon' -n 4 --temp 0 2>&1", path);
    free(cli(args, 0));
    /* again: the order is kept (no second permutation), the predictors trained again */
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' %s 2>&1", path, tu_data(TEXT), small);
    out = cli(args, 0);
    assert_non_null(strstr(out, "already stored hottest first"));
    assert_non_null(strstr(out, "calibrated in"));
    free(out);
    ffn_sums(path, s2, 64);
    assert_memory_equal(s1, s2, n_layers_of(path) * sizeof *s1);
    /* --levels-only keeps the order as it is; --no-hot keeps the converted layout */
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' %s --no-hot 2>&1", nohot, tu_data(TEXT), small);
    out = cli(args, 0);
    assert_null(strstr(out, "hottest first"));
    free(out);
    assert_false(flm_is_hot_ordered(nohot));
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --levels-only --eval-tokens 128 --chunk 64 2>&1", nohot,
             tu_data(TEXT));
    out = cli(args, 0);
    assert_non_null(strstr(out, "neurons not ordered: --levels-only keeps the stored predictors"));
    free(out);
    assert_false(flm_is_hot_ordered(nohot));
    /* flags that contradict each other */
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --no-hot --hot-only 2>&1", nohot, tu_data(TEXT));
    out = cli(args, 2);
    assert_non_null(strstr(out, "--no-hot excludes"));
    free(out);
    /* --hot-only on a file not ordered: only the order, no predictors */
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --hot-only --hot-tokens 128 2>&1", nohot, tu_data(TEXT));
    free(cli(args, 0));
    assert_true(flm_is_hot_ordered(nohot));
    remove(path);
    remove(nohot);
    /* under --mem: a budget that cannot hold the training is refused before the order changes */
    fresh(path, sizeof path, "hc-cli-mem");
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' %s --hot-tokens 128 --mem 85%% 2>&1", path, tu_data(TEXT),
             small);
    out = cli(args, 1);
    assert_non_null(strstr(out, "cannot hold calibrate's training"));
    free(out);
    assert_false(flm_is_hot_ordered(path));
    assert_clean(path);
    /* one that can: the ordering runs under it (hybrid mode, the inputs through "<path>.x.tmp") */
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' %s --hot-tokens 128 --mem 300%% 2>&1", path, tu_data(TEXT),
             small);
    out = cli(args, 0);
    assert_non_null(strstr(out, "stored hottest first (measured on up to 128 tokens, under the budget), then calibrated"));
    free(out);
    assert_true(flm_is_hot_ordered(path));
    assert_clean(path);
    remove(path);
}

/* The write fails part-way (a file size limit below the model's size: EFBIG, as a full disk gives ENOSPC; the CLI
 * ignores SIGXFSZ so that the writer sees the error): the model keeps its bytes, nothing is left beside it, the
 * command fails saying why, and the next run orders it. */
static void test_write_fails(void **state) {
    (void)state;
    char path[4096], args[12288];
    fresh(path, sizeof path, "hc-efbig");
    size_t len0, len1;
    uint8_t *before = tu_read_file(path, &len0);
    /* ulimit -f counts 1024-byte blocks; half the model */
    snprintf(args, sizeof args, "sh -c \"ulimit -f %zu; exec '%s' calibrate '%s' --text '%s' --hot-tokens 128 "
             "--tokens 256 --chunk 64 --epochs 1 --eval-tokens 0\" 2>&1", len0 / 2048, FLM_CLI, path, tu_data(TEXT));
    FILE *pp = popen(args, "r");
    assert_non_null(pp);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, pp);
    out[n] = 0;
    int st = pclose(pp), rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (rc != 1 || !strstr(out, "File too large")) fail_msg("calibrate at ulimit -f: exit %d, want 1:\n%s", rc, out);
    uint8_t *after = tu_read_file(path, &len1);
    assert_int_equal(len0, len1);
    assert_memory_equal(before, after, len0);
    assert_false(flm_is_hot_ordered(path));
    assert_clean(path);
    free(after);
    free(before);
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --hot-only --hot-tokens 128 2>&1", path, tu_data(TEXT));
    free(cli(args, 0));
    assert_true(flm_is_hot_ordered(path));
    assert_clean(path);
    remove(path);
}

/* Several texts in turns of a chunk (flm_calib_tokens): each file tokenized alone gives the expected sequence. */
static void check_turns(flm_ctx *ctx, const char *const *files, size_t nf, uint32_t chunk, bool bos, size_t max) {
    int32_t *one[4];
    size_t n_one[4], at[4] = {0};
    for (size_t i = 0; i < nf; i++) {
        flm_error err;
        if (flm_tokenize_file(ctx, files[i], bos, 0, &one[i], &n_one[i], &err)) fail_msg("%s", err.msg);
    }
    size_t total = 0;
    for (size_t i = 0; i < nf; i++) total += n_one[i];
    const size_t want_n = max && max < total ? max : total;
    int32_t *want = malloc((want_n + 1) * sizeof *want);
    size_t k = 0;
    while (k < want_n)
        for (size_t i = 0; i < nf && k < want_n; i++)
            for (uint32_t c = 0; c < chunk && at[i] < n_one[i] && k < want_n; c++) want[k++] = one[i][at[i]++];
    int32_t *got = NULL;
    size_t n_got = 0;
    flm_error err;
    assert_int_equal(flm_calib_tokens(ctx, NULL, NULL, files, chunk, bos, max, &got, &n_got, &err), FLM_OK);
    assert_int_equal(n_got, want_n);
    assert_memory_equal(got, want, want_n * sizeof *want);
    free(got);
    free(want);
    for (size_t i = 0; i < nf; i++) free(one[i]);
}

static void test_text_turns(void **state) {
    (void)state;
    flm_ctx *ctx = open_mode(tu_data(MODEL), FLM_MODE_RAM, 0);
    char shortf[4096], copy[4096];
    snprintf(shortf, sizeof shortf, "%s", tu_tmp("hc-short", ".txt"));
    FILE *f = fopen(shortf, "w");
    assert_non_null(f);
    fputs("The cat sat on the mat. It was a sunny day, and the dog ran to the park to play.", f);
    fclose(f);
    char story[4096], sentences[4096];
    snprintf(story, sizeof story, "%s", tu_data(TEXT));
    snprintf(sentences, sizeof sentences, "%s", tu_data("text/sentences.txt"));
    const char *files[] = {story, shortf, sentences, NULL};
    check_turns(ctx, files, 3, 16, false, 0);     /* all: the short file drops out after its second turn */
    check_turns(ctx, files, 3, 16, true, 0);      /* BOS before each file's first token */
    check_turns(ctx, files, 3, 7, false, 100);    /* max cuts a turn short */
    const char *two[] = {shortf, story, NULL};
    check_turns(ctx, two, 2, 100000, false, 0);   /* a chunk longer than the files: each whole, in order */
    const char *none[] = {NULL};
    int32_t *ids = NULL;
    size_t n = 0;
    flm_error err;
    assert_int_equal(flm_calib_tokens(ctx, NULL, NULL, none, 16, false, 0, &ids, &n, &err), FLM_ERR_ARG);
    assert_int_equal(flm_calib_tokens(ctx, NULL, NULL, files, 0, false, 0, &ids, &n, &err), FLM_ERR_ARG);
    const char *missing[] = {story, "/nonexistent/flashlm-text", NULL};
    assert_int_equal(flm_calib_tokens(ctx, NULL, NULL, missing, 16, false, 0, &ids, &n, &err), FLM_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/flashlm-text"));
    assert_null(ids);
    flm_close(ctx);
    /* the hot order on the text and a copy of it, in turns (each chunk counted twice), is the text's own order */
    snprintf(copy, sizeof copy, "%s", tu_tmp("hc-copy", ".txt"));
    size_t len;
    char *t = (char *)tu_read_file(tu_data(TEXT), &len);
    f = fopen(copy, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(t, 1, len, f), len);
    fclose(f);
    free(t);
    char a[4096], b[4096], args[16384];
    fresh(a, sizeof a, "hc-turns-a");
    fresh(b, sizeof b, "hc-turns-b");
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --hot-only --hot-tokens 256 --chunk 32 2>&1", a,
             tu_data(TEXT));
    free(cli(args, 0));
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --text '%s' --hot-only --hot-tokens 512 --chunk 32 2>&1",
             b, tu_data(TEXT), copy);
    free(cli(args, 0));
    assert_true(flm_is_hot_ordered(a) && flm_is_hot_ordered(b));
    for (uint32_t l = 0; l < n_layers_of(a); l++) assert_true(prefix_overlap(a, b, l, 0.25) >= 0.95);
    /* the CLI refuses a text given twice, and --curve with several */
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --text '%s' 2>&1", a, copy, copy);
    char *out = cli(args, 2);
    assert_non_null(strstr(out, "is given twice"));
    free(out);
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --text '%s' --curve 2>&1", a, copy, tu_data(TEXT));
    out = cli(args, 2);
    assert_non_null(strstr(out, "--curve measures on one --text"));
    free(out);
    remove(a);
    remove(b);
    remove(copy);
    remove(shortf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_under_budget),
        cmocka_unit_test(test_order_failures),
        cmocka_unit_test(test_calibrate_defaults),
        cmocka_unit_test(test_write_fails),
        cmocka_unit_test(test_text_turns),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
