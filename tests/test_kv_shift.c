/* test_kv_shift.c — the context shift (flm_kv_shift) and what run and chat do when the context fills (issue 11).
 *
 * Library: a context A evaluates n tokens and shifts (keep k, discard d); a context B evaluates the same tokens and
 * is not shifted (its cache is A's before the shift). Then
 *   - kept rows are untouched, moved values are B's rows bit for bit, and every moved key equals B's key at its old
 *     position turned by the test's own RoPE (double precision, from the definition: pair i of the first rope_dim
 *     dimensions by (new - old) * theta^(-2i/rope_dim), normal or NEOX pairs, the layer's own base), to the cache's
 *     rounding; the same comparison without the turn fails, so the check sees the rotation;
 *   - layer 0's keys (which depend on the token only) equal those of a fresh context F that evaluated the kept and
 *     the moved tokens at their new positions: the model's own RoPE is the reference there;
 *   - generation continues: A's logits over the next tokens equal those of B after the test rebuilt B's cache by hand
 *     into the shifted state; a rebuild without the turn gives other logits.
 * On stories260K (normal RoPE; f32 and f16 caches; rope_dim < head_dim), Qwen2.5-Coder-0.5B (NEOX) and Gemma 3 270M
 * (NEOX; sliding-window layers with their own RoPE base) when pulled.
 * CLI: run with -c small and -n large stops at a full context with exit 0, the text so far and the message; with
 * --context-shift it generates all -n tokens (ram and naive modes; NEOX); chat goes on past a full context. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"
#include "compute/kernels.h"
#include "runtime/runtime.h"
#include "testutil.h"

#define STORIES "models/stories260K/stories260K.gguf"
#define TEXT "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her " \
             "friends. One day, she saw a big red ball in the grass and ran to get it. The ball was shiny and new."

typedef struct shift_case {
    const char *name;
    const char *path;
    bool kv_f32;
    uint32_t rope_dim; /* 0: the model's; else override it (partial rotary: the pairs past rope_dim stay as they are) */
    int n, keep, discard, n_ctx;
    double key_tol;    /* per pair: |shifted - reference| <= key_tol * |pair| + 1e-6 */
    double logit_tol;  /* max |logit difference| / max(1, max |logit|), at every step: float rounding where the
                          weights are f32 (stories260K); the quantized models quantize activations to 8 bits before
                          each matrix product, as ggml does, so a last-bit difference in a key can move a rounding
                          step: their logits agree to that noise (measured: 1-4% of the largest logit) */
} shift_case;

static flm_ctx *open_case(const shift_case *c) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1; /* no OpenMP barriers: threads spinning at them make a loaded machine crawl */
    p.n_ctx = c->n_ctx;
    p.kv_f32 = c->kv_f32;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(c->path, &p, &ctx, &err)) fail_msg("%s: open: %s", c->name, err.msg);
    if (c->rope_dim) ctx->model->hp.rope_dim = c->rope_dim;
    return ctx;
}

/* Evaluate ids[0..n) from position 0; returns the last token's logits (valid until the next call). */
static const float *eval_all(flm_ctx *ctx, const int32_t *ids, int n, const char *what) {
    flm_error err;
    const float *logits = NULL;
    if (flm_eval_batch(ctx, ids, (uint32_t)n, 0, NULL, &logits, &err)) fail_msg("%s: eval: %s", what, err.msg);
    return logits;
}

/* Row (l, pos) of the key (or value) cache as floats. */
static void get_row(const flm_kv_cache *kv, bool key, uint32_t l, uint32_t pos, float *out) {
    const void *r = key ? flm_kv_key(kv, l, pos) : flm_kv_value(kv, l, pos);
    for (uint32_t i = 0; i < kv->kv_dim; i++)
        out[i] = kv->elem_bytes == FLM_KV_F32 ? ((const float *)r)[i] : flm_f16_to_f32(((const uint16_t *)r)[i]);
}

/* The test's RoPE: turn each head's pairs of k (n_kv_heads heads) by (to - from) * theta^(-2i/rope_dim), in double,
 * with layer l's base. Written from the definition (llama.cpp's rope, normal and NEOX), not from flashlm's code. */
static void ref_turn(const flm_ctx *ctx, uint32_t l, uint32_t from, uint32_t to, const float *k, double *out) {
    const flm_hparams *hp = &ctx->model->hp;
    const double theta = ctx->model->layers[l].swa ? hp->rope_theta_local : hp->rope_theta;
    const bool neox = hp->arch->rope == FLM_ROPE_NEOX;
    const uint32_t half = hp->rope_dim / 2;
    for (uint32_t i = 0; i < hp->n_kv_heads * hp->head_dim; i++) out[i] = k[i];
    for (uint32_t h = 0; h < hp->n_kv_heads; h++)
        for (uint32_t i = 0; i < half; i++) {
            const double ang = ((double)to - (double)from) * pow(theta, -2.0 * i / hp->rope_dim);
            const size_t a = (size_t)h * hp->head_dim + (neox ? i : 2 * i);
            const size_t b = (size_t)h * hp->head_dim + (neox ? i + half : 2 * i + 1);
            out[a] = k[a] * cos(ang) - k[b] * sin(ang);
            out[b] = k[a] * sin(ang) + k[b] * cos(ang);
        }
}

/* Worst pair error of got against want (kv_dim elements), relative to the pair's length (+1e-6 absolute): the pairs
 * are those RoPE turns (and the untouched dimensions past rope_dim, paired the same way). */
static double pair_err(const flm_ctx *ctx, const float *got, const double *want) {
    const flm_hparams *hp = &ctx->model->hp;
    const bool neox = hp->arch->rope == FLM_ROPE_NEOX;
    const uint32_t half = hp->rope_dim / 2;
    double worst = 0;
    for (uint32_t h = 0; h < hp->n_kv_heads; h++)
        for (uint32_t i = 0; i < hp->head_dim / 2; i++) {
            size_t a, b;
            if (i < half) {
                a = (size_t)h * hp->head_dim + (neox ? i : 2 * i);
                b = (size_t)h * hp->head_dim + (neox ? i + half : 2 * i + 1);
            } else { /* past rope_dim: not turned */
                a = (size_t)h * hp->head_dim + hp->rope_dim + 2 * (i - half);
                b = a + 1;
            }
            double len = sqrt(want[a] * want[a] + want[b] * want[b]);
            double e = fmax(fabs(got[a] - want[a]), fabs(got[b] - want[b])) / (len + 1e-6);
            if (e > worst) worst = e;
        }
    return worst;
}

/* A's cache after a shift of (keep, D) against B's (the same tokens, not shifted): see the top of the file. */
static void check_shifted_cache(const shift_case *c, flm_ctx *A, flm_ctx *B, int D) {
    const flm_hparams *hp = &A->model->hp;
    const uint32_t kv_dim = hp->n_kv_heads * hp->head_dim, eb = A->be.kv.elem_bytes;
    float *ka = malloc(kv_dim * sizeof(float)), *kb = malloc(kv_dim * sizeof(float));
    double *ref = malloc(kv_dim * sizeof(double)), *same = malloc(kv_dim * sizeof(double));
    double worst = 0, unturned = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        for (int p = 0; p < c->keep; p++) {
            assert_memory_equal(flm_kv_key(&A->be.kv, l, (uint32_t)p), flm_kv_key(&B->be.kv, l, (uint32_t)p), kv_dim * eb);
            assert_memory_equal(flm_kv_value(&A->be.kv, l, (uint32_t)p), flm_kv_value(&B->be.kv, l, (uint32_t)p), kv_dim * eb);
        }
        for (int j = c->keep; j < c->n - D; j++) {
            const uint32_t old = (uint32_t)(j + D);
            assert_memory_equal(flm_kv_value(&A->be.kv, l, (uint32_t)j), flm_kv_value(&B->be.kv, l, old), kv_dim * eb);
            get_row(&A->be.kv, true, l, (uint32_t)j, ka);
            get_row(&B->be.kv, true, l, old, kb);
            ref_turn(A, l, old, (uint32_t)j, kb, ref);
            double e = pair_err(A, ka, ref);
            if (e > worst) worst = e;
            for (uint32_t i = 0; i < kv_dim; i++) same[i] = kb[i];
            e = pair_err(A, ka, same);
            if (e > unturned) unturned = e;
            if (worst > c->key_tol)
                fail_msg("%s: layer %u, key moved from %u to %d: off the reference turn by %g of a pair's length "
                         "(tolerance %g)", c->name, l, old, j, worst, c->key_tol);
        }
    }
    print_message("%s: moved keys within %.2g of the reference turn (tolerance %g; %.2g without the turn)\n", c->name,
                  worst, c->key_tol, unturned);
    assert_true(unturned > 10 * c->key_tol); /* the check sees the rotation */
    free(ka);
    free(kb);
    free(ref);
    free(same);
}

/* Layer 0's keys depend on the token alone: a fresh evaluation of the kept and moved tokens at their new positions
 * must store what the shift left (the model's own RoPE as the reference). Returns that fresh context. */
static flm_ctx *check_layer0_fresh(const shift_case *c, flm_ctx *A, const int32_t *ids) {
    const int m = c->n - c->discard;
    int32_t *fresh = malloc((size_t)m * sizeof *fresh);
    for (int j = 0; j < m; j++) fresh[j] = j < c->keep ? ids[j] : ids[j + c->discard];
    flm_ctx *F = open_case(c);
    eval_all(F, fresh, m, c->name);
    const flm_hparams *hp = &A->model->hp;
    const uint32_t kv_dim = hp->n_kv_heads * hp->head_dim;
    float *ka = malloc(kv_dim * sizeof(float)), *kf = malloc(kv_dim * sizeof(float));
    double *want = malloc(kv_dim * sizeof(double));
    double worst = 0;
    for (int j = 0; j < m; j++) {
        get_row(&A->be.kv, true, 0, (uint32_t)j, ka);
        get_row(&F->be.kv, true, 0, (uint32_t)j, kf);
        for (uint32_t i = 0; i < kv_dim; i++) want[i] = kf[i];
        double e = pair_err(A, ka, want);
        if (e > worst) worst = e;
    }
    print_message("%s: layer 0 keys within %.2g of a fresh evaluation at the new positions\n", c->name, worst);
    if (worst > c->key_tol) fail_msg("%s: layer 0 keys differ from a fresh evaluation by %g", c->name, worst);
    free(fresh);
    free(ka);
    free(kf);
    free(want);
    return F;
}

/* Rebuild R's cache (R evaluated the same tokens as A, unshifted) into the shifted state by hand: rows moved down by
 * D, keys turned by the test's RoPE (turn = false: not turned, a wrong rebuild), rounded as the cache stores them. */
static void rebuild(flm_ctx *R, const shift_case *c, int D, bool turn) {
    const flm_hparams *hp = &R->model->hp;
    const uint32_t kv_dim = hp->n_kv_heads * hp->head_dim, eb = R->be.kv.elem_bytes;
    float *k = malloc(kv_dim * sizeof(float)), *kf = malloc(kv_dim * sizeof(float));
    double *ref = malloc(kv_dim * sizeof(double));
    for (uint32_t l = 0; l < hp->n_layers; l++)
        for (int j = c->keep; j < c->n - D; j++) { /* upwards: row j + D is read before anything overwrites it */
            const uint32_t old = (uint32_t)(j + D);
            get_row(&R->be.kv, true, l, old, k);
            ref_turn(R, l, old, turn ? (uint32_t)j : old, k, ref);
            for (uint32_t i = 0; i < kv_dim; i++) kf[i] = (float)ref[i];
            void *dst = flm_kv_key(&R->be.kv, l, (uint32_t)j);
            if (eb == FLM_KV_F32) memcpy(dst, kf, kv_dim * sizeof(float));
            else for (uint32_t i = 0; i < kv_dim; i++) ((uint16_t *)dst)[i] = flm_f32_to_f16(kf[i]);
            memcpy(flm_kv_value(&R->be.kv, l, (uint32_t)j), flm_kv_value(&R->be.kv, l, old), kv_dim * eb);
        }
    R->next_pos = c->n - D;
    free(k);
    free(kf);
    free(ref);
}

static double logit_diff(const float *a, const float *b, uint32_t n) {
    double worst = 0, scale = 1;
    for (uint32_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return worst / scale;
}

static void run_case(const shift_case *c) {
    if (!c->path) { skip(); return; }
    flm_ctx *A = open_case(c), *B = open_case(c);
    size_t n_ids = 0;
    int32_t *ids = flm_tokenize_all(A, TEXT, true, &n_ids);
    assert_non_null(ids);
    assert_true((int)n_ids >= c->n);
    flm_model_info info;
    flm_get_info(A, &info);
    const uint32_t V = info.n_vocab;
    float *last = malloc(V * sizeof(float)); /* the logits after ids[n-1]: they pick the first token after the shift */
    memcpy(last, eval_all(A, ids, c->n, c->name), V * sizeof(float));
    eval_all(B, ids, c->n, c->name);
    flm_error err;
    assert_int_equal(flm_kv_shift(A, c->keep, c->discard, &err), FLM_OK);
    assert_int_equal(flm_n_past(A), c->n - c->discard);
    check_shifted_cache(c, A, B, c->discard);
    /* generation continues: A against B rebuilt by hand, and W rebuilt without the turn: W is the fresh context,
     * given B's cache (in ram mode a context's state is its KV cache and its next position) */
    flm_ctx *W = check_layer0_fresh(c, A, ids);
    const size_t half = flm_kv_cache_bytes(B->be.kv.n_layers, B->be.kv.n_ctx, B->be.kv.kv_dim, B->be.kv.elem_bytes) / 2;
    memcpy(W->be.kv.k, B->be.kv.k, half);
    memcpy(W->be.kv.v, B->be.kv.v, half);
    W->next_pos = B->next_pos;
    rebuild(B, c, c->discard, true);
    rebuild(W, c, c->discard, false);
    int32_t tok = tu_argmax(last, V);
    double worst = 0, wrong = 0;
    int differ = 0;     /* steps at which the wrong rebuild would pick another token */
    int near_ties = 0;  /* steps at which the rebuilt cache picks another token within the tolerance */
    for (int t = 0; t < 8; t++) {
        const int32_t pos = c->n - c->discard + t;
        const float *la, *lb, *lw;
        if (flm_eval(A, tok, pos, &la, &err)) fail_msg("%s: eval after the shift: %s", c->name, err.msg);
        memcpy(last, la, V * sizeof(float));
        if (flm_eval(B, tok, pos, &lb, &err) || flm_eval(W, tok, pos, &lw, &err)) fail_msg("%s: %s", c->name, err.msg);
        worst = fmax(worst, logit_diff(last, lb, V));
        wrong = fmax(wrong, logit_diff(lw, lb, V));
        tok = tu_argmax(last, V);
        /* the same greedy token, unless the rebuilt cache's top two are within the tolerance (a near tie) */
        const int32_t tb = tu_argmax(lb, V);
        double scale = 1;
        for (uint32_t i = 0; i < V; i++) scale = fmax(scale, fabs((double)lb[i]));
        if (tok != tb && (double)lb[tb] - lb[tok] > c->logit_tol * scale)
            fail_msg("%s: step %d after the shift picks token %d, the rebuilt cache %d (%g higher)", c->name, t, tok,
                     tb, (double)lb[tb] - lb[tok]);
        near_ties += tok != tb;
        differ += tu_argmax(lw, V) != tok;
    }
    print_message("%s: 8 tokens after the shift: the rebuilt cache's greedy tokens (%d near ties), logits within "
                  "%.2g (tolerance %g); without the turn %.2g, %d other tokens\n", c->name, near_ties, worst,
                  c->logit_tol, wrong, differ);
    if (worst > c->logit_tol) fail_msg("%s: logits after the shift differ by %g", c->name, worst);
    assert_true(wrong > 4 * c->logit_tol); /* the comparison sees a missing turn */
    free(last);
    free(ids);
    flm_close(A);
    flm_close(B);
    flm_close(W);
}

static void test_shift_stories_f32(void **state) {
    (void)state;
    shift_case c = {"stories260K f32", tu_data(STORIES), true, 0, 40, 4, 18, 48, 1e-5, 1e-4};
    run_case(&c);
}

static void test_shift_stories_f16(void **state) {
    (void)state;
    shift_case c = {"stories260K f16", tu_data(STORIES), false, 0, 40, 4, 18, 48, 2e-3, 1e-2};
    run_case(&c);
}

static void test_shift_partial_rotary(void **state) {
    (void)state;
    /* head_dim 8 with RoPE on the first 4 dimensions only (rope.dimension_count < key_length) */
    shift_case c = {"stories260K f16, rope_dim 4", tu_data(STORIES), false, 4, 40, 1, 20, 40, 2e-3, 1e-2};
    run_case(&c);
}

static void test_shift_qwen_neox(void **state) {
    (void)state;
    shift_case c = {"qwen2.5-coder-0.5b (NEOX)", tu_model("qwen2.5-coder-0.5b"), false, 0, 24, 3, 10, 28, 2e-3, 0.04};
    run_case(&c);
}


static void test_shift_gemma_swa(void **state) {
    (void)state;
    shift_case c = {"gemma-3-270m (NEOX, local and global bases)", tu_model("gemma-3-270m"), false, 0, 24, 2, 11, 28,
                    2e-3, 0.08};
    run_case(&c);
}

/* Two shifts compose: (keep, d1) then (keep, d2) is (keep, d1 + d2). */
static void test_shift_twice(void **state) {
    (void)state;
    shift_case c = {"stories260K f32, two shifts", tu_data(STORIES), true, 0, 40, 4, 0, 48, 1e-5, 1e-4};
    flm_ctx *A = open_case(&c), *B = open_case(&c);
    size_t n_ids = 0;
    int32_t *ids = flm_tokenize_all(A, TEXT, true, &n_ids);
    eval_all(A, ids, c.n, c.name);
    eval_all(B, ids, c.n, c.name);
    flm_error err;
    assert_int_equal(flm_kv_shift(A, c.keep, 7, &err), FLM_OK);
    assert_int_equal(flm_kv_shift(A, c.keep, 11, &err), FLM_OK);
    assert_int_equal(flm_n_past(A), c.n - 18);
    check_shifted_cache(&c, A, B, 18);
    free(ids);
    flm_close(A);
    flm_close(B);
}

/* Bad arguments are refused with a message and change nothing; n_discard 0 does nothing; discarding everything after
 * the kept part leaves n_keep positions. */
static void test_shift_arguments(void **state) {
    (void)state;
    shift_case c = {"args", tu_data(STORIES), false, 0, 20, 0, 0, 32, 0, 0};
    flm_ctx *A = open_case(&c);
    size_t n_ids = 0;
    int32_t *ids = flm_tokenize_all(A, TEXT, true, &n_ids);
    eval_all(A, ids, c.n, c.name);
    const size_t bytes = flm_kv_cache_bytes(A->be.kv.n_layers, A->be.kv.n_ctx, A->be.kv.kv_dim, A->be.kv.elem_bytes);
    uint8_t *before = malloc(bytes);
    memcpy(before, A->be.kv.k, bytes / 2);
    memcpy(before + bytes / 2, A->be.kv.v, bytes / 2);
    const struct { int keep, discard; } bad[] = {{-1, 1}, {0, -1}, {19, 2}, {0, 21}, {21, 0}, {INT32_MAX, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        flm_error err = {0};
        assert_int_equal(flm_kv_shift(A, bad[i].keep, bad[i].discard, &err), FLM_ERR_ARG);
        assert_non_null(strstr(err.msg, "context shift"));
        assert_non_null(strstr(err.msg, "the context holds 20"));
        assert_int_equal(flm_n_past(A), 20);
    }
    flm_error err;
    assert_int_equal(flm_kv_shift(NULL, 0, 1, &err), FLM_ERR_ARG);
    assert_int_equal(flm_kv_shift(A, 5, 0, &err), FLM_OK); /* nothing to do */
    assert_int_equal(flm_n_past(A), 20);
    assert_memory_equal(before, A->be.kv.k, bytes / 2);
    assert_memory_equal(before + bytes / 2, A->be.kv.v, bytes / 2);
    /* everything after the first 3 */
    assert_int_equal(flm_kv_shift(A, 3, 17, &err), FLM_OK);
    assert_int_equal(flm_n_past(A), 3);
    assert_memory_equal(before, A->be.kv.k, 3 * A->be.kv.kv_dim * A->be.kv.elem_bytes); /* layer 0's first rows untouched */
    const float *logits;
    assert_int_equal(flm_eval(A, ids[3], 4, &logits, &err), FLM_ERR_ARG); /* past the next position */
    assert_int_equal(flm_eval(A, ids[3], 3, &logits, &err), FLM_OK);
    /* and the context now equals one that only ever saw the first 4 tokens (nothing was moved) */
    flm_ctx *F = open_case(&c);
    const float *lf;
    if (flm_eval_batch(F, ids, 4, 0, NULL, &lf, &err)) fail_msg("%s", err.msg);
    assert_true(logit_diff(logits, lf, 512) < 1e-4);
    flm_close(F);
    free(before);
    free(ids);
    flm_close(A);
}

/* Attention and the shift keep per-head scratch of FLM_ATT_MAX_HEAD_DIM (1024) on the stack: a model whose head_dim is
 * above it (a GGUF may say up to 4096) is refused at open. Before, attention wrote past its q buffer: SIGSEGV. */
static void test_head_dim_above_limit_refused(void **state) {
    (void)state;
    const char *path = tu_tmp("headdim", ".gguf");
    char args[8192];
    snprintf(args, sizeof args, "synth '%s' --d-model 1032 --heads 1 --layers 1 --d-ffn 64 --vocab 300 --rank 0 -t 1 "
             "-f 2>&1", path);
    char *out = NULL;
    if (tu_run_cli(args, &out) != 0) fail_msg("synth: %s", out);
    free(out);
    flm_ctx *ctx = NULL;
    flm_error err;
    assert_int_equal(flm_open(path, NULL, &ctx, &err), FLM_ERR_UNSUPPORTED);
    assert_null(ctx);
    assert_non_null(strstr(err.msg, "head_dim 1032 is above the 1024 flashlm supports"));
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 2>&1", path);
    out = NULL;
    assert_int_equal(tu_run_cli(args, &out), 1);
    assert_non_null(strstr(out, "head_dim 1032"));
    free(out);
    remove(path);
}

/* ---- the CLI ---------------------------------------------------------------------------------------------------- */

/* Run the CLI; fail unless it exits with want_rc. The output (malloc'd) is returned. (Not inlined: inlined, gcc's
 * -Wdangling-pointer takes the buffer it returns for its local variable.) */
__attribute__((noinline)) static char *cli(const char *args, int want_rc) {
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    if (rc != want_rc) fail_msg("flashlm %s: exit %d, want %d; output:\n%s", args, rc, want_rc, out);
    return out;
}

/* The count N of "generation N tokens" in run's statistics. */
static long generated(const char *out) {
    long n = -1;
    const char *g = strstr(out, "flashlm: generation ");
    if (g) sscanf(g, "flashlm: generation %ld", &n);
    return n; /* -1: no statistics */
}

static void test_cli_run_context_full(void **state) {
    (void)state;
    char args[8192];
    const char *m = tu_data(STORIES);
    /* "Once upon a time" is 5 tokens with BOS: at -c 32, 27 tokens are printed (prompt + reply = the context, as
     * llama.cpp and OpenAI count; no token is sampled that the context could not hold) */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 500 -c 32 --temp 0 -t 1 2>&1", m);
    char *out = cli(args, 0);
    assert_non_null(strstr(out, "flashlm: context full (32 tokens): stopped; raise -c or pass --context-shift"));
    assert_int_equal(generated(out), 27);
    free(out);
    /* the text printed is the text so far: what a run with room for it prints */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 500 -c 32 --temp 0 -t 1 2>/dev/null", m);
    char *full = cli(args, 0);
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 27 -c 256 --temp 0 -t 1 2>/dev/null", m);
    char *room = cli(args, 0);
    assert_string_equal(full, room);
    assert_true(strlen(full) > 80);
    /* --context-shift: every -n token, and the same text until the first shift */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 500 -c 32 --temp 0 -t 1 --context-shift 2>&1",
             m);
    char *shifted = cli(args, 0);
    assert_int_equal(generated(shifted), 500);
    assert_non_null(strstr(shifted, "flashlm: context shift: "));
    assert_null(strstr(shifted, "context full"));
    assert_memory_equal(shifted, full, strlen(full) - 1); /* (full ends with the closing newline) */
    free(shifted);
    /* a streaming mode shifts the same way: naive gives the ram run's text */
    const char *flm = tu_tmp("shift", ".flm");
    snprintf(args, sizeof args, "convert '%s' '%s' 2>&1", m, flm);
    free(cli(args, 0));
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 200 -c 32 --temp 0 -t 1 --context-shift 2>/dev/null",
             m);
    char *ram = cli(args, 0);
    snprintf(args, sizeof args, "run -m '%s' --mode naive -p 'Once upon a time' -n 200 -c 32 --temp 0 -t 1 "
             "--context-shift 2>/dev/null", flm);
    out = cli(args, 0);
    assert_string_equal(out, ram);
    free(out);
    free(ram);
    remove(flm);
    /* --keep -1 keeps the whole prompt: a prompt that fills the context leaves nothing to discard */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time there was a little girl named Lily' -c 14 -n 50 "
             "--temp 0 -t 1 --context-shift --keep -1 2>&1", m);
    out = cli(args, 0);
    assert_non_null(strstr(out, "leave nothing to discard: stopped"));
    free(out);
    /* a prompt longer than the context: an error, with or without --context-shift */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time there was a little girl named Lily' -c 8 -n 5 "
             "--context-shift 2>&1", m);
    out = cli(args, 1);
    assert_non_null(strstr(out, "is longer than the context (8 tokens); raise -c"));
    free(out);
    free(full);
    free(room);
}

/* NEOX RoPE through the CLI: Qwen2.5-Coder generates past its context with --context-shift. */
static void test_cli_run_shift_neox(void **state) {
    (void)state;
    const char *m = tu_model("qwen2.5-coder-0.5b");
    if (!m) { skip(); return; }
    char args[8192];
    snprintf(args, sizeof args, "run -m '%s' -p 'The story of a lighthouse keeper who' -n 40 -c 24 --temp 0 "
             "-t 2 --context-shift 2>&1", m);
    char *out = cli(args, 0);
    long n = generated(out);
    if (!strstr(out, "context shift: ")) fail_msg("no context shift:\n%s", out);
    assert_true(n > 24); /* past the context (unless the model ended its text: then at least it shifted) */
    free(out);
}

static void test_cli_chat_context_shift(void **state) {
    (void)state;
    const char *in = tu_tmp("chat-in", ".txt");
    const char *text = "Hello there\nTell me a story\nAnd another one\n";
    tu_write_file(in, text, strlen(text));
    char args[8192];
    snprintf(args, sizeof args, "chat -m '%s' --chat-template chatml -n 30 --temp 0 -t 1 -v -c 50 --context-shift "
             "< '%s' 2>&1", tu_data(STORIES), in);
    char *out = cli(args, 0);
    assert_non_null(strstr(out, "3 replies"));
    assert_non_null(strstr(out, "context shift on: the first "));
    assert_non_null(strstr(out, "flashlm: context shift: "));
    assert_null(strstr(out, "is full"));
    free(out);
    /* --keep N: N tokens after BOS */
    snprintf(args, sizeof args, "chat -m '%s' --chat-template chatml -n 30 --temp 0 -t 1 -v -c 50 --context-shift "
             "--keep 2 < '%s' 2>&1", tu_data(STORIES), in);
    out = cli(args, 0);
    assert_non_null(strstr(out, "context shift on: the first 3 tokens are kept"));
    assert_non_null(strstr(out, "3 replies"));
    free(out);
    /* a kept part as long as the context: the turn cannot go in, as a full context (exit 1) */
    snprintf(args, sizeof args, "chat -m '%s' --chat-template chatml -n 30 --temp 0 -t 1 -c 50 --context-shift "
             "--keep 60 < '%s' 2>&1", tu_data(STORIES), in);
    out = cli(args, 1);
    assert_non_null(strstr(out, "leave nothing to discard"));
    free(out);
    remove(in);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shift_arguments),
        cmocka_unit_test(test_shift_stories_f32),
        cmocka_unit_test(test_shift_stories_f16),
        cmocka_unit_test(test_shift_partial_rotary),
        cmocka_unit_test(test_shift_twice),
        cmocka_unit_test(test_shift_qwen_neox),
        cmocka_unit_test(test_shift_gemma_swa),
        cmocka_unit_test(test_head_dim_above_limit_refused),
        cmocka_unit_test(test_cli_run_context_full),
        cmocka_unit_test(test_cli_run_shift_neox),
        cmocka_unit_test(test_cli_chat_context_shift),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
