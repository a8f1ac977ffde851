/* test_tree.c — tree evaluation (flm_eval_tree, flm_tree_accept; runtime/forward.c's tree attention):
 *   - every node's logits equal a plain sequential evaluation of the context and that node's path, bit for bit,
 *     in one call, in batches of 4 and level by level (first > 0);
 *   - without a logits buffer, flm_tree_logits gives each node's logits on demand, the same bits, and
 *     flm_tree_logits_n several nodes' at once (one matrix-matrix classifier), the same bits;
 *   - accepting a path makes the context exactly what evaluating it token by token makes (the next token's logits);
 *   - a draft tree (mode hot, draft = true) equals flm_eval_draft along each path, and a target tree in mode hot
 *     equals ram mode's; a draft vocabulary keeps the draft's first logits and masks the rest;
 *   - bad trees and out-of-order calls are refused and change nothing.
 * stories260K from tests/data. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "testutil.h"

#define MODEL "models/stories260K/stories260K.gguf"
#define TEXT "text/tinystories_sample.txt"
#define N_CTX 256
#define N_NODES 14

/* depth <= 4; several children per node; a chain 0-1-3-6-11 */
static const int32_t PARENT[N_NODES] = {-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 6, 9, 10};
static const char *PROMPT = "Once upon a time, there was a little girl named Lily. She";

static char g_hot[4096];

static int setup(void **state) {
    (void)state;
    snprintf(g_hot, sizeof g_hot, "%s", tu_tmp("tree-hot", ".flm"));
    return tu_stories_hot(g_hot, 20000);
}

static int teardown(void **state) {
    (void)state;
    remove(g_hot);
    return 0;
}

static flm_ctx *open_ctx(const char *path, flm_mode mode, uint64_t mem, int n_batch) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = N_CTX;
    p.mode = mode;
    p.mem_bytes = mem;
    if (n_batch) p.n_batch = n_batch;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(path, &p, &ctx, &err)) fail_msg("open %s (%s): %s", path, flm_mode_name(mode), err.msg);
    return ctx;
}


/* the prompt's tokens into ctx (positions 0 .. *n - 1) */
static int32_t *feed_prompt(flm_ctx *ctx, int *n) {
    size_t m = 0;
    int32_t *ids = flm_tokenize_all(ctx, PROMPT, true, &m);
    assert_non_null(ids);
    assert_true(m >= 8);
    flm_error err;
    const float *lg;
    if (flm_eval_batch(ctx, ids, (uint32_t)m, 0, NULL, &lg, &err)) fail_msg("prompt: %s", err.msg);
    *n = (int)m;
    return ids;
}

/* the tree's tokens: fixed pseudo-random ids (siblings differ) */
static void tree_tokens(uint32_t V, int32_t *tok) {
    uint32_t x = 12345;
    for (int i = 0; i < N_NODES; i++) {
        x = x * 1103515245u + 12345u;
        tok[i] = (int32_t)(3 + (x >> 8) % (V - 3));
    }
}

/* node i's path from its root: out[0..len) */
static int path_of(int i, int32_t *out) {
    int32_t rev[N_NODES];
    int len = 0;
    for (int j = i; j >= 0; j = PARENT[j]) rev[len++] = j;
    for (int k = 0; k < len; k++) out[k] = rev[len - 1 - k];
    return len;
}

/* logits after the context (positions < pos) and node i's path, token by token (flm_eval or flm_eval_draft) */
static void path_logits(flm_ctx *ctx, int pos, const int32_t *tok, int i, bool draft, float *out) {
    int32_t path[N_NODES];
    int len = path_of(i, path);
    flm_error err;
    const float *lg = NULL;
    for (int k = 0; k < len; k++) {
        flm_status st = draft ? flm_eval_draft(ctx, tok[path[k]], pos + k, &lg, &err)
                              : flm_eval(ctx, tok[path[k]], pos + k, &lg, &err);
        if (st) fail_msg("path eval: %s", err.msg);
    }
    memcpy(out, lg, tu_vocab(ctx) * sizeof(float));
}

/* every node of a tree evaluated at the prompt's end equals its path evaluated token by token, bit for bit */
static void check_tree(flm_ctx *ctx, bool draft, const float *want_all, float **got_out) {
    int n;
    int32_t *ids = feed_prompt(ctx, &n);
    const uint32_t V = tu_vocab(ctx);
    int32_t tok[N_NODES];
    tree_tokens(V, tok);
    float *got = malloc((size_t)N_NODES * V * sizeof(float)), *want = malloc(V * sizeof(float));
    flm_error err;
    assert_int_equal(flm_eval_tree(ctx, tok, PARENT, N_NODES, 0, n, draft, got, &err), FLM_OK);
    assert_int_equal(flm_n_past(ctx), n);
    /* level by level into a second buffer: the same values */
    float *lev = malloc((size_t)N_NODES * V * sizeof(float));
    const int bounds[] = {0, 1, 3, 6, 11, N_NODES}; /* nodes by depth: 0 | 1-2 | 3-5 | 6-10 | 11-13 */
    for (int b = 0; b + 1 < 6; b++)
        assert_int_equal(flm_eval_tree(ctx, tok, PARENT, (uint32_t)bounds[b + 1], (uint32_t)bounds[b], n, draft,
                                       lev + (size_t)bounds[b] * V, &err), FLM_OK);
    assert_memory_equal(lev, got, (size_t)N_NODES * V * sizeof(float));
    /* without a logits buffer: each node's logits on demand, the same bits (or refused: more nodes than a batch) */
    flm_stats fs;
    flm_get_stats(ctx, &fs);
    if (fs.n_batch >= N_NODES) {
        assert_int_equal(flm_eval_tree(ctx, tok, PARENT, N_NODES, 0, n, draft, NULL, &err), FLM_OK);
        for (int i = N_NODES - 1; i >= 0; i--) {
            assert_int_equal(flm_tree_logits(ctx, (uint32_t)i, lev, &err), FLM_OK);
            assert_memory_equal(lev, got + (size_t)i * V, V * sizeof(float));
        }
        assert_int_equal(flm_tree_logits(ctx, N_NODES, lev, &err), FLM_ERR_ARG);
        /* several nodes at once (one matrix-matrix classifier), in any order, repeats allowed: the same bits */
        const uint32_t some[] = {13, 0, 7, 7, 2};
        assert_int_equal(flm_tree_logits_n(ctx, some, 5, lev, &err), FLM_OK);
        for (int i = 0; i < 5; i++) assert_memory_equal(lev + (size_t)i * V, got + (size_t)some[i] * V, V * sizeof(float));
        const uint32_t bad[] = {1, N_NODES};
        assert_int_equal(flm_tree_logits_n(ctx, bad, 2, lev, &err), FLM_ERR_ARG);
        assert_int_equal(flm_tree_logits_n(ctx, some, 0, lev, &err), FLM_ERR_ARG);
        /* level by level: only the last call's nodes */
        assert_int_equal(flm_eval_tree(ctx, tok, PARENT, 6, 0, n, draft, NULL, &err), FLM_OK);
        assert_int_equal(flm_eval_tree(ctx, tok, PARENT, N_NODES, 6, n, draft, NULL, &err), FLM_OK);
        assert_int_equal(flm_tree_logits(ctx, 5, lev, &err), FLM_ERR_ARG);
        assert_int_equal(flm_tree_logits(ctx, 6, lev, &err), FLM_OK);
        assert_memory_equal(lev, got + (size_t)6 * V, V * sizeof(float));
    } else {
        assert_int_equal(flm_eval_tree(ctx, tok, PARENT, N_NODES, 0, n, draft, NULL, &err), FLM_ERR_ARG);
    }
    for (int i = 0; i < N_NODES; i++) {
        path_logits(ctx, n, tok, i, draft, want);
        assert_memory_equal(got + (size_t)i * V, want, V * sizeof(float));
        if (want_all) assert_memory_equal(got + (size_t)i * V, want_all + (size_t)i * V, V * sizeof(float));
    }
    print_message("%d nodes, %s: every node equals its path token by token\n", N_NODES, draft ? "draft" : "target");
    free(lev);
    free(want);
    free(ids);
    if (got_out) *got_out = got;
    else free(got);
}

static void test_tree_equals_paths(void **state) {
    (void)state;
    const char *gguf = tu_data(MODEL);
    flm_ctx *a = open_ctx(gguf, FLM_MODE_RAM, 0, 0);
    check_tree(a, false, NULL, NULL);
    flm_close(a);
    flm_ctx *b = open_ctx(gguf, FLM_MODE_RAM, 0, 4); /* batches of 4 nodes */
    check_tree(b, false, NULL, NULL);
    flm_close(b);
}

static void test_accept(void **state) {
    (void)state;
    flm_ctx *ctx = open_ctx(tu_data(MODEL), FLM_MODE_RAM, 0, 0);
    int n;
    int32_t *ids = feed_prompt(ctx, &n);
    const uint32_t V = tu_vocab(ctx);
    int32_t tok[N_NODES];
    tree_tokens(V, tok);
    float *rows = malloc((size_t)N_NODES * V * sizeof(float)), *want = malloc(V * sizeof(float));
    flm_error err;
    assert_int_equal(flm_eval_tree(ctx, tok, PARENT, N_NODES, 0, n, false, rows, &err), FLM_OK);
    const uint32_t path[] = {0, 1, 3, 6, 11};
    /* refused: another position, a node not on a path (not increasing), more nodes than held */
    assert_int_equal(flm_tree_accept(ctx, n + 1, path, 5, &err), FLM_ERR_ARG);
    const uint32_t bad[] = {0, 3, 1};
    assert_int_equal(flm_tree_accept(ctx, n, bad, 3, &err), FLM_ERR_ARG);
    const uint32_t far[] = {0, 1, 3, 6, 11, 14};
    assert_int_equal(flm_tree_accept(ctx, n, far, 6, &err), FLM_ERR_ARG);
    assert_int_equal(flm_tree_accept(ctx, n, path, 5, &err), FLM_OK);
    assert_int_equal(flm_n_past(ctx), n + 5);
    assert_int_equal(flm_tree_accept(ctx, n, path, 1, &err), FLM_ERR_ARG); /* nothing held any more */
    const int32_t next = 42;
    const float *lg;
    assert_int_equal(flm_eval(ctx, next, n + 5, &lg, &err), FLM_OK);
    float *got = malloc(V * sizeof(float));
    memcpy(got, lg, V * sizeof(float));
    /* the same context built token by token */
    flm_ctx *ref = open_ctx(tu_data(MODEL), FLM_MODE_RAM, 0, 0);
    for (int t = 0; t < n; t++) assert_int_equal(flm_eval(ref, ids[t], t, &lg, &err), FLM_OK);
    for (int k = 0; k < 5; k++) assert_int_equal(flm_eval(ref, tok[path[k]], n + k, &lg, &err), FLM_OK);
    assert_int_equal(flm_eval(ref, next, n + 5, &lg, &err), FLM_OK);
    assert_memory_equal(got, lg, V * sizeof(float));
    flm_close(ref);
    /* m = 0 keeps none; an evaluation in between forgets the tree */
    assert_int_equal(flm_eval_tree(ctx, tok, PARENT, 3, 0, n, false, rows, &err), FLM_OK);
    assert_int_equal(flm_tree_accept(ctx, n, NULL, 0, &err), FLM_OK);
    assert_int_equal(flm_n_past(ctx), n);
    assert_int_equal(flm_eval_tree(ctx, tok, PARENT, 3, 0, n, false, rows, &err), FLM_OK);
    assert_int_equal(flm_eval(ctx, next, n, &lg, &err), FLM_OK);
    assert_int_equal(flm_tree_accept(ctx, n, path, 1, &err), FLM_ERR_ARG);
    free(got);
    free(rows);
    free(want);
    free(ids);
    flm_close(ctx);
}

static void test_bad_trees(void **state) {
    (void)state;
    flm_ctx *ctx = open_ctx(tu_data(MODEL), FLM_MODE_RAM, 0, 0);
    int n;
    int32_t *ids = feed_prompt(ctx, &n);
    const uint32_t V = tu_vocab(ctx);
    int32_t tok[N_NODES];
    tree_tokens(V, tok);
    float *rows = malloc((size_t)N_NODES * V * sizeof(float));
    flm_error err;
    const int32_t self_parent[] = {-1, 1}, later[] = {-1, 2, 0}, low[] = {-2};
    assert_int_equal(flm_eval_tree(ctx, tok, self_parent, 2, 0, n, false, rows, &err), FLM_ERR_ARG);
    print_message("refused: %s\n", err.msg);
    assert_int_equal(flm_eval_tree(ctx, tok, later, 3, 0, n, false, rows, &err), FLM_ERR_ARG);
    assert_int_equal(flm_eval_tree(ctx, tok, low, 1, 0, n, false, rows, &err), FLM_ERR_ARG);
    assert_int_equal(flm_eval_tree(ctx, tok, PARENT, N_NODES, 2, n, false, rows, &err), FLM_ERR_ARG); /* none held */
    print_message("refused: %s\n", err.msg);
    assert_int_equal(flm_eval_tree(ctx, tok, PARENT, N_NODES, N_NODES, n, false, rows, &err), FLM_ERR_ARG);
    assert_int_equal(flm_eval_tree(ctx, tok, PARENT, N_NODES, 0, N_CTX - 4, false, rows, &err), FLM_ERR_ARG);
    assert_int_equal(flm_eval_tree(ctx, tok, PARENT, N_NODES, 0, n + 1, false, rows, &err), FLM_ERR_ARG);
    assert_int_equal(flm_eval_tree(ctx, tok, PARENT, N_NODES, 0, n, true, rows, &err), FLM_ERR_ARG); /* not hot */
    int32_t bad_tok[2] = {0, (int32_t)V};
    assert_int_equal(flm_eval_tree(ctx, bad_tok, PARENT, 2, 0, n, false, rows, &err), FLM_ERR_ARG);
    assert_int_equal(flm_n_past(ctx), n); /* the context is untouched */
    free(rows);
    free(ids);
    flm_close(ctx);
}

/* mode hot: a target tree equals ram mode's bit for bit; a draft tree equals flm_eval_draft along each path */
static void test_hot_trees(void **state) {
    (void)state;
    flm_ctx *ram = open_ctx(g_hot, FLM_MODE_RAM, 0, 0);
    float *want = NULL;
    check_tree(ram, false, NULL, &want);
    flm_close(ram);
    /* a budget at which the hot mode keeps part of every layer */
    uint64_t mem = 0;
    for (uint64_t m = 256 << 10; m < (1ull << 30); m += m / 32) {
        flm_params p;
        flm_params_default(&p);
        p.n_threads = 2;
        p.n_ctx = N_CTX;
        p.mode = FLM_MODE_HOT;
        p.mem_bytes = m;
        flm_plan_info pi;
        flm_error err;
        if (!flm_plan(g_hot, &p, &pi, &err) && pi.hot_share >= 0.2 && pi.hot_share <= 0.6) {
            mem = m;
            break;
        }
    }
    assert_true(mem > 0);
    flm_ctx *hot = open_ctx(g_hot, FLM_MODE_HOT, mem, 0);
    assert_true(flm_has_self_draft(hot));
    check_tree(hot, false, want, NULL);
    float *draft = NULL;
    check_tree(hot, true, NULL, &draft);
    const uint32_t V = tu_vocab(hot);
    assert_memory_not_equal(draft, want, (size_t)N_NODES * V * sizeof(float)); /* the draft is not the target */
    flm_close(hot);
    /* a draft vocabulary (flm_params.draft_vocab): ids below it as before, bit for bit; the others -inf; the target's
     * logits untouched */
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = N_CTX;
    p.mode = FLM_MODE_HOT;
    p.mem_bytes = mem;
    p.draft_vocab = 100;
    flm_error err;
    assert_int_equal(flm_open(g_hot, &p, &hot, &err), FLM_OK);
    int n;
    int32_t *ids = feed_prompt(hot, &n);
    int32_t tok[N_NODES];
    tree_tokens(V, tok);
    float *dv = malloc((size_t)N_NODES * V * sizeof(float));
    assert_int_equal(flm_eval_tree(hot, tok, PARENT, N_NODES, 0, n, true, dv, &err), FLM_OK);
    for (int i = 0; i < N_NODES; i++) {
        assert_memory_equal(dv + (size_t)i * V, draft + (size_t)i * V, 100 * sizeof(float));
        for (uint32_t j = 100; j < V; j++) assert_true(isinf(dv[(size_t)i * V + j]) && dv[(size_t)i * V + j] < 0);
    }
    const float *lg;
    assert_int_equal(flm_eval_draft(hot, tok[0], n, &lg, &err), FLM_OK);
    assert_memory_equal(lg, draft, 100 * sizeof(float));
    assert_true(isinf(lg[100]));
    assert_int_equal(flm_eval_tree(hot, tok, PARENT, N_NODES, 0, n, false, dv, &err), FLM_OK);
    assert_memory_equal(dv, want, (size_t)N_NODES * V * sizeof(float));
    free(dv);
    free(ids);
    flm_close(hot);
    free(draft);
    free(want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_equals_paths),
        cmocka_unit_test(test_accept),
        cmocka_unit_test(test_bad_trees),
        cmocka_unit_test(test_hot_trees),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
