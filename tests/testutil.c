#include <glob.h>
#include <math.h>
#include "testutil.h"
#include "flashlm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

const char *tu_data(const char *rel) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", FLM_DATA_DIR, rel);
    return buf;
}

const char *tu_tmp(const char *tag, const char *suffix) {
    static char ring[8][4096];
    static int slot, counter;
    char *p = ring[slot++ % 8];
    snprintf(p, 4096, "%s/%s-%d-%d%s", FLM_TEST_TMPDIR, tag, (int)getpid(), counter++, suffix ? suffix : "");
    return p;
}

bool tu_temp_left(const char *path) {
    char pat[4200];
    glob_t g;
    bool any = false;
    const char *suffixes[] = {".tmp", ".tmp.*", ".lock"};
    for (int i = 0; i < 3 && !any; i++) {
        snprintf(pat, sizeof pat, "%s%s", path, suffixes[i]);
        if (glob(pat, 0, NULL, &g) == 0) any = g.gl_pathc > 0;
        globfree(&g);
    }
    return any;
}

uint8_t *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) fail_msg("short read on %s", path);
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

void tu_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) fail_msg("cannot create %s", path);
    if (len && fwrite(data, 1, len, f) != len) fail_msg("short write on %s", path);
    fclose(f);
}

int tu_run_cli(const char *args, char **out) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s", FLM_CLI, args);
    FILE *p = popen(cmd, "r");
    if (!p) fail_msg("popen failed");
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 2) buf = realloc(buf, cap *= 2);
    }
    buf[len] = 0;
    int st = pclose(p);
    if (out) *out = buf; else free(buf);
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    return -1;
}

char *tu_cli_expect(const char *args, int want_rc, const char *want_text) {
    char *out = NULL;
    char full[8300];
    snprintf(full, sizeof full, "%s 2>&1", args);
    const int rc = tu_run_cli(full, &out);
    const bool bad_rc = rc != want_rc, bad_text = !bad_rc && want_text && !strstr(out, want_text);
    if (bad_rc) print_error("flashlm %s: exit %d, want %d; output:\n%s\n", args, rc, want_rc, out);
    if (bad_text) print_error("flashlm %s: output lacks '%s':\n%s\n", args, want_text, out);
    if (bad_rc || bad_text) {
        free(out); /* fail() leaves the test by longjmp */
        fail();
    }
    return out;
}

int32_t tu_argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

uint64_t tu_rand_u64(uint64_t *s) {
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}

float tu_rand_f32(uint64_t *s) { return (float)((tu_rand_u64(s) >> 40) * (1.0 / (1 << 24)) * 2.0 - 1.0); }

const char *tu_model(const char *name) {
    static char buf[4096];
    const char *c = getenv("FLASHLM_CACHE"), *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (c && *c) snprintf(buf, sizeof buf, "%s/models/%s.gguf", c, name);
    else if (x && *x) snprintf(buf, sizeof buf, "%s/flashlm/models/%s.gguf", x, name);
    else snprintf(buf, sizeof buf, "%s/.cache/flashlm/models/%s.gguf", home ? home : "", name);
    if (access(buf, R_OK) == 0) return buf;
    const char *req = getenv("FLASHLM_REQUIRE_MODELS");
    if (req && !strcmp(req, "1")) fail_msg("model %s is not pulled (%s): run `flashlm pull %s`", name, buf, name);
    print_message("model %s is not pulled (%s): skipped\n", name, buf);
    return NULL;
}

const char *tu_convert_pulled(const char *name, const char *tag) {
    const char *gguf = tu_model(name);
    if (!gguf) return NULL;
    static char path[4096];
    snprintf(path, sizeof path, "%s", tu_tmp(tag, ".flm"));
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "convert '%s' '%s' 2>&1", gguf, path);
    char *out = NULL;
    int rc = tu_run_cli(cmd, &out);
    if (rc != 0) fail_msg("convert of %s failed (%d): %s", name, rc, out);
    free(out);
    return path;
}

uint32_t tu_vocab(const flm_ctx *ctx) {
    flm_model_info in;
    flm_get_info(ctx, &in);
    return in.n_vocab;
}

float *tu_logits(flm_ctx *ctx, const int32_t *ids, int T, bool batch) {
    const uint32_t V = tu_vocab(ctx);
    float *out = malloc((size_t)T * V * sizeof(float));
    if (!out) fail_msg("out of memory for %d rows of logits", T);
    flm_error err;
    if (batch) {
        if (flm_eval_batch(ctx, ids, (uint32_t)T, 0, out, NULL, &err)) fail_msg("batch: %s", err.msg);
        return out;
    }
    for (int t = 0; t < T; t++) {
        const float *lg;
        if (flm_eval(ctx, ids[t], t, &lg, &err)) fail_msg("eval: %s", err.msg);
        memcpy(out + (size_t)t * V, lg, V * sizeof(float));
    }
    return out;
}

void tu_expect_freqs(const double *count, const double *p, int n, double draws, const char *what) {
    for (int i = 0; i < n; i++) {
        double f = count[i] / draws, tol = 5 * sqrt(p[i] * (1 - p[i]) / draws) + 1 / draws;
        if (fabs(f - p[i]) > tol) fail_msg("%s: cell %d: frequency %.4f, want %.4f +- %.4f", what, i, f, p[i], tol);
    }
}

/* the 3 candidates (top-k 3) of a distribution, in id order */
static void top3(flm_sampler *ps, const float *logits, float *p, uint32_t V, int32_t ids[3], double pr[3]) {
    flm_sampler_probs(ps, logits, p);
    int k = 0;
    for (uint32_t i = 0; i < V; i++)
        if (p[i] > 0) {
            assert_true(k < 3);
            ids[k] = (int32_t)i;
            pr[k++] = p[i];
        }
    assert_int_equal(k, 3);
}

void tu_joint3(flm_ctx *ref, const int32_t *prompt, int n_prompt, flm_sampler *ps, int32_t cand[27][3],
               double joint[27]) {
    const uint32_t V = tu_vocab(ref);
    float *p = malloc(V * sizeof *p);
    if (!p) fail_msg("out of memory");
    const float *logits;
    flm_error err;
    int32_t i1[3], i2[3], i3[3];
    double p1[3], p2[3], p3[3];
    assert_int_equal(flm_eval_batch(ref, prompt, (uint32_t)n_prompt, 0, NULL, &logits, &err), FLM_OK);
    top3(ps, logits, p, V, i1, p1);
    for (int a = 0; a < 3; a++) {
        assert_int_equal(flm_eval(ref, i1[a], n_prompt, &logits, &err), FLM_OK);
        top3(ps, logits, p, V, i2, p2);
        for (int b = 0; b < 3; b++) {
            assert_int_equal(flm_eval(ref, i2[b], n_prompt + 1, &logits, &err), FLM_OK);
            top3(ps, logits, p, V, i3, p3);
            for (int c = 0; c < 3; c++) {
                int cell = a * 9 + b * 3 + c;
                cand[cell][0] = i1[a];
                cand[cell][1] = i2[b];
                cand[cell][2] = i3[c];
                joint[cell] = p1[a] * p2[b] * p3[c];
            }
        }
    }
    free(p);
}

double tu_hot_share_at(const char *path, uint64_t mem, int n_ctx) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = n_ctx;
    p.mode = FLM_MODE_HOT;
    p.mem_bytes = mem;
    flm_plan_info pi;
    flm_error err;
    if (flm_plan(path, &p, &pi, &err)) return -1;
    return pi.hot_share;
}

uint64_t tu_hot_budget_for_share(const char *path, double lo, double hi, int n_ctx) {
    for (uint64_t mem = 256 << 10; mem < (1ull << 34); mem += mem / 32) {
        double s = tu_hot_share_at(path, mem, n_ctx);
        if (s >= lo && s <= hi) return mem;
        if (s > hi) break;
    }
    fail_msg("%s: no budget gives a hot share in [%.2f, %.2f]", path, lo, hi);
    return 0;
}
