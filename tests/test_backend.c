/* test_backend.c — the device seam (runtime/backend.h): a stub backend whose every operation counts its calls and
 * runs the CPU backend's underneath is opened with flm_open_backend next to a plain flm_open, and both run the same
 * evaluations: a prompt batch with every row's logits, decoding, a tree with lazy logits and an accepted path, a
 * context shift, a self-draft (mode hot). Every logit is compared bit for bit, and the stub's counts show that the
 * pass went through the interface: one decoded token calls norm 2L + 1 times (L layers: attention and FFN norms, the
 * output norm; plus post-norms where the model has them), qkv, attention, the FFN and the two watches per layer, the
 * classifier once, and asks the finite verdict exactly once. Models: stories260K from tests/data (its GGUF, mapped;
 * its .flm in ram and hot), and SmolLM2-135M when pulled.
 * The budget per device (flm_plan_info.device): the stub on the host gets, at mem_init, the plan's host block, and
 * the host holds the whole total; a second stub with a "device" of its own (its mem_init allocates the block itself,
 * in host memory standing for the device's) gets that device's share of the plan, its KV cache lies in it, the host
 * holds the rest, and the shares sum to the plan's total. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "runtime/backend.h"
#include "runtime/runtime.h"
#include "testutil.h"

#define MODEL "models/stories260K/stories260K.gguf"
#define N_CTX 128
#define N_NODES 6
static const int32_t PARENT[N_NODES] = {-1, 0, 0, 1, 1, 3};
static const char *PROMPT = "Once upon a time, there was a little girl named Lily. She liked to play";

/* ---- the stub: counts, then the CPU operation ---- */
enum { C_MEM_INIT, C_MEM_FREE, C_READ, C_KV_INIT, C_KV_COPY, C_KV_SHIFT, C_EMBED, C_NORM, C_LINEAR, C_QKV, C_ATT,
       C_DENSE, C_RESID, C_BIAS, C_BUN, C_BUN_B, C_BUN_S, C_BUN_BS, C_WATCH, C_VERDICT, C_N };
static const char *const C_NAMES[C_N] = {"mem_init", "mem_free", "read", "kv_init", "kv_copy", "kv_shift",
                                         "embed_rows", "norm", "linear", "qkv", "attention", "ffn_dense", "residual",
                                         "add_bias", "bundles", "bundles_batch", "bundles_split",
                                         "bundles_batch_split", "watch", "verdict"};
static unsigned long g_count[C_N];
static uint64_t g_block; /* the bytes the last mem_init was asked for */
#define CPU flm_backend_cpu

static flm_status s_mem_init(flm_backend *be, flm_arena *a, uint64_t bytes, flm_error *err) {
    g_count[C_MEM_INIT]++;
    g_block = bytes;
    return CPU.mem_init(be, a, bytes, err);
}
static void s_mem_free(flm_backend *be, flm_arena *a) { g_count[C_MEM_FREE]++; CPU.mem_free(be, a); }

/* the second device's memory: its own block (host memory standing for the device's), not the CPU backend's */
static uint8_t *g_dev_base;
static uint64_t g_dev_size;
static flm_status d_mem_init(flm_backend *be, flm_arena *a, uint64_t bytes, flm_error *err) {
    (void)be, (void)err;
    g_count[C_MEM_INIT]++;
    g_block = bytes;
    const uint64_t size = (bytes + FLM_ARENA_ALIGN - 1) / FLM_ARENA_ALIGN * FLM_ARENA_ALIGN;
    assert_null(g_dev_base); /* one context on the device at a time */
    g_dev_base = aligned_alloc(FLM_ARENA_ALIGN, size ? size : FLM_ARENA_ALIGN);
    assert_non_null(g_dev_base);
    memset(g_dev_base, 0, size); /* carved buffers are zero until written (core/arena.h) */
    g_dev_size = bytes;
    *a = (flm_arena){.base = g_dev_base, .size = bytes, .used = 0};
    return FLM_OK;
}
static void d_mem_free(flm_backend *be, flm_arena *a) {
    (void)be;
    g_count[C_MEM_FREE]++;
    assert_ptr_equal(a->base, g_dev_base);
    free(g_dev_base);
    g_dev_base = NULL;
    *a = (flm_arena){0};
}
static void s_read(const flm_backend *be, void *dst, const void *src, size_t bytes) {
    g_count[C_READ]++;
    CPU.read(be, dst, src, bytes);
}
static void s_kv_init(flm_backend *be, uint32_t nl, uint32_t nc, uint32_t kd, uint32_t eb, void *mem) {
    g_count[C_KV_INIT]++;
    CPU.kv_init(be, nl, nc, kd, eb, mem);
}
static void s_kv_copy(const flm_backend *be, uint32_t dst, uint32_t src) {
    g_count[C_KV_COPY]++;
    CPU.kv_copy(be, dst, src);
}
static void s_kv_shift(const flm_backend *be, const flm_model *m, uint32_t from, uint32_t to, uint32_t n, int nt) {
    g_count[C_KV_SHIFT]++;
    CPU.kv_shift(be, m, from, to, n, nt);
}
static void s_embed(const flm_pass *P, const flm_weight *t, const void *rows, const int32_t *ids, float sc, float *o,
                    size_t os) {
    g_count[C_EMBED]++;
    CPU.embed_rows(P, t, rows, ids, sc, o, os);
}
static void s_norm(const flm_pass *P, const flm_weight *w, const flm_weight *b, uint32_t dim, const float *in,
                   size_t is, float *out, size_t os) {
    g_count[C_NORM]++;
    CPU.norm(P, w, b, dim, in, is, out, os);
}
static void s_linear(const flm_pass *P, const flm_weight *W, const flm_weight *b, size_t r, size_t c, const float *in,
                     size_t is, float *out, size_t os) {
    g_count[C_LINEAR]++;
    CPU.linear(P, W, b, r, c, in, is, out, os);
}
static void s_qkv(const flm_pass *P, const flm_layer_weights *L, const float *in, size_t is, float *q, float *k,
                  float *v) {
    g_count[C_QKV]++;
    CPU.qkv(P, L, in, is, q, k, v);
}
static void s_att(const flm_pass *P, const flm_layer_weights *L, uint32_t kl, float *q, float *k, const float *v,
                  float *out, size_t os) {
    g_count[C_ATT]++;
    CPU.attention(P, L, kl, q, k, v, out, os);
}
static void s_dense(const flm_pass *P, const flm_layer_weights *L, const float *in, size_t is, float *out, size_t os,
                    float *H, float *U) {
    g_count[C_DENSE]++;
    CPU.ffn_dense(P, L, in, is, out, os, H, U);
}
static void s_resid(const flm_pass *P, float *x, float *y, size_t ys, const flm_weight *post) {
    g_count[C_RESID]++;
    CPU.residual(P, x, y, ys, post);
}
static void s_bias(const flm_pass *P, float *x, size_t xs, const flm_weight *b, uint32_t dim) {
    g_count[C_BIAS]++;
    CPU.add_bias(P, x, xs, b, dim);
}
static void s_bun(const flm_backend *be, const flm_bundle_desc *b, const uint8_t *rec, const uint32_t *rows, size_t n,
                  const float *x, float *out, float *h, float *acc) {
    g_count[C_BUN]++;
    CPU.bundles(be, b, rec, rows, n, x, out, h, acc);
}
static void s_bun_b(const flm_backend *be, const flm_bundle_desc *b, const uint8_t *rec, const uint32_t *rows,
                    size_t n, const uint8_t *mask, size_t ms, size_t nx, const float *X, size_t xs, float *OUT,
                    size_t os, float *acc) {
    g_count[C_BUN_B]++;
    CPU.bundles_batch(be, b, rec, rows, n, mask, ms, nx, X, xs, OUT, os, acc);
}
static void s_bun_s(const flm_backend *be, const flm_bundle_desc *b, const uint8_t *head, size_t nh,
                    const uint8_t *tail, const uint32_t *rows, size_t n, const float *x, float *out, float *h,
                    float *acc) {
    g_count[C_BUN_S]++;
    CPU.bundles_split(be, b, head, nh, tail, rows, n, x, out, h, acc);
}
static void s_bun_bs(const flm_backend *be, const flm_bundle_desc *b, const uint8_t *head, size_t nh,
                     const uint8_t *tail, const uint32_t *rows, size_t n, const uint8_t *mask, size_t ms, size_t nx,
                     const float *X, size_t xs, float *OUT, size_t os, float *acc, float *ha) {
    g_count[C_BUN_BS]++;
    CPU.bundles_batch_split(be, b, head, nh, tail, rows, n, mask, ms, nx, X, xs, OUT, os, acc, ha);
}
static void s_watch(flm_backend *be, const float *x, size_t n, uint32_t layer, int what) {
    g_count[C_WATCH]++;
    CPU.watch(be, x, n, layer, what);
}
static bool s_verdict(flm_backend *be, uint32_t *layer, int *what) {
    g_count[C_VERDICT]++;
    return CPU.verdict(be, layer, what);
}

static const flm_backend_ops STUB = {
    .name = "stub", .device = "host", .mem_init = s_mem_init, .mem_free = s_mem_free, .read = s_read, .kv_init = s_kv_init,
    .kv_copy = s_kv_copy, .kv_shift = s_kv_shift, .embed_rows = s_embed, .norm = s_norm, .linear = s_linear,
    .qkv = s_qkv, .attention = s_att, .ffn_dense = s_dense, .residual = s_resid, .add_bias = s_bias, .bundles = s_bun,
    .bundles_batch = s_bun_b, .bundles_split = s_bun_s, .bundles_batch_split = s_bun_bs, .watch = s_watch,
    .verdict = s_verdict,
};

/* the stub on a device of its own: the same operations, its own memory */
static flm_backend_ops stub_device(void) {
    flm_backend_ops o = STUB;
    o.name = "stub-device";
    o.device = "stubdev";
    o.mem_init = d_mem_init;
    o.mem_free = d_mem_free;
    return o;
}

/* ---- the comparison ---- */

static void params_of(flm_params *p, flm_mode mode) {
    flm_params_default(p);
    p->n_threads = 2;
    p->n_ctx = N_CTX;
    p->n_batch = 8;
    p->mode = mode;
}

static flm_ctx *open_on(const char *path, flm_mode mode, const flm_backend_ops *be) {
    flm_params p;
    params_of(&p, mode);
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open_backend(path, &p, be, &ctx, &err)) fail_msg("open %s on %s: %s", path, be->name, err.msg);
    return ctx;
}

static void same(const float *a, const float *b, size_t n, const char *what) {
    if (memcmp(a, b, n * sizeof(float))) {
        size_t i = 0;
        while (a[i] == b[i]) i++;
        fail_msg("%s: logit %zu differs: cpu %.9g, stub %.9g", what, i, (double)a[i], (double)b[i]);
    }
}

/* one decoded token at pos, on both; the logits compared */
static void decode_both(flm_ctx *c, flm_ctx *s, int32_t tok, int32_t pos, bool draft, uint32_t V, const char *what) {
    const float *lc, *ls;
    flm_error err;
    flm_status a = draft ? flm_eval_draft(c, tok, pos, &lc, &err) : flm_eval(c, tok, pos, &lc, &err);
    if (a) fail_msg("%s (cpu): %s", what, err.msg);
    flm_status b = draft ? flm_eval_draft(s, tok, pos, &ls, &err) : flm_eval(s, tok, pos, &ls, &err);
    if (b) fail_msg("%s (stub): %s", what, err.msg);
    same(lc, ls, V, what);
}

/* The budget per device of s (opened on ops): the shares sum to the total; mem_init was asked for the plan's block on
 * the backend's device, which holds the KV cache; the host holds the rest. On the host, as flm_plan gives it. */
static void check_devices(const char *path, flm_mode mode, const flm_ctx *s, const flm_backend_ops *ops) {
    flm_plan_info got;
    flm_get_plan(s, &got);
    assert_true(got.n_devices >= 1 && got.n_devices <= FLM_PLAN_DEVICES_MAX);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < got.n_devices; i++) sum += got.device[i].bytes;
    assert_int_equal(sum, got.total);
    assert_string_equal(got.device[0].name, "host");
    const flm_plan_device *mine = &got.device[got.n_devices - 1];
    assert_int_equal(g_block, mine->block);
    assert_true(s->mem.size >= mine->block && s->mem.used <= mine->block); /* the block, carved */
    assert_true(mine->block > got.kv && mine->block <= got.kv + got.scratch);
    if (!strcmp(ops->device, "host")) {
        flm_params p;
        params_of(&p, mode);
        flm_plan_info pub;
        flm_error err;
        if (flm_plan(path, &p, &pub, &err)) fail_msg("plan %s: %s", path, err.msg);
        assert_int_equal(got.n_devices, 1);
        assert_int_equal(got.device[0].bytes, got.total);
        assert_int_equal(pub.n_devices, 1);
        assert_int_equal(pub.device[0].bytes, got.device[0].bytes);
        assert_int_equal(pub.device[0].block, got.device[0].block);
        return;
    }
    assert_int_equal(got.n_devices, 2);
    assert_string_equal(got.device[1].name, ops->device);
    assert_int_equal(got.device[1].bytes, got.device[1].block);
    assert_int_equal(got.device[0].block, 0);
    assert_int_equal(got.device[0].bytes, got.total - got.device[1].bytes);
    assert_int_equal(g_dev_size, got.device[1].block);
    const uint8_t *k = (const uint8_t *)s->be.kv.k;
    assert_true(k >= g_dev_base && k + flm_kv_cache_bytes(s->model->hp.n_layers, N_CTX, s->be.kv.kv_dim,
                                                          s->be.kv.elem_bytes) <= g_dev_base + g_dev_size);
    print_message("  %s on %s: host %llu bytes, %s %llu (its block), total %llu\n", path, ops->name,
                  (unsigned long long)got.device[0].bytes, got.device[1].name,
                  (unsigned long long)got.device[1].bytes, (unsigned long long)got.total);
}

static void run_case_on(const char *path, flm_mode mode, const char *name, const flm_backend_ops *ops) {
    memset(g_count, 0, sizeof g_count);
    flm_ctx *c = open_on(path, mode, &flm_backend_cpu), *s = open_on(path, mode, ops);
    flm_model_info info;
    flm_get_info(s, &info);
    const uint32_t V = info.n_vocab, L = info.n_layers;
    assert_int_equal(g_count[C_MEM_INIT], 1);
    assert_int_equal(g_count[C_KV_INIT], 1);
    check_devices(path, mode, s, ops);
    size_t m = 0;
    int32_t *ids = flm_tokenize_all(c, PROMPT, true, &m);
    assert_non_null(ids);
    assert_true(m > 8 && m < 40);
    flm_error err;
    /* the prompt: batches of 8, every row's logits */
    float *ac = malloc(m * V * sizeof(float)), *as = malloc(m * V * sizeof(float));
    assert_true(ac && as);
    if (flm_eval_batch(c, ids, (uint32_t)m, 0, ac, NULL, &err) ||
        flm_eval_batch(s, ids, (uint32_t)m, 0, as, NULL, &err))
        fail_msg("%s: prompt: %s", name, err.msg);
    same(ac, as, m * V, name);
    /* one decoded token: the interface's counts for one pass */
    unsigned long before[C_N];
    memcpy(before, g_count, sizeof before);
    int32_t pos = (int32_t)m;
    decode_both(c, s, ids[1], pos++, false, V, name);
    unsigned long d[C_N];
    for (int i = 0; i < C_N; i++) d[i] = g_count[i] - before[i];
    const unsigned long ffn = d[C_DENSE] + d[C_BUN] + d[C_BUN_S];
    assert_int_equal(d[C_VERDICT], 1); /* the finite verdict: once per pass */
    assert_int_equal(d[C_WATCH], 2ul * L + 1);
    assert_int_equal(d[C_QKV], L);
    assert_int_equal(d[C_ATT], L);
    assert_int_equal(ffn, L);
    assert_int_equal(d[C_EMBED], 1);
    assert_true(d[C_NORM] >= 2ul * L + 1 && d[C_NORM] <= 4ul * L + 1); /* + post-norms */
    assert_true(d[C_LINEAR] >= L + 1);                                  /* o projections, the classifier */
    assert_true(d[C_RESID] >= 2ul * L);
    /* a tree without logits, then every node's on demand, then a path accepted */
    int32_t tt[N_NODES];
    for (int i = 0; i < N_NODES; i++) tt[i] = ids[(i + 2) % m];
    if (flm_eval_tree(c, tt, PARENT, N_NODES, 0, pos, false, NULL, &err) ||
        flm_eval_tree(s, tt, PARENT, N_NODES, 0, pos, false, NULL, &err))
        fail_msg("%s: tree: %s", name, err.msg);
    uint32_t nodes[N_NODES];
    for (uint32_t i = 0; i < N_NODES; i++) nodes[i] = i;
    float *tc = malloc(N_NODES * V * sizeof(float)), *ts = malloc(N_NODES * V * sizeof(float));
    assert_true(tc && ts);
    if (flm_tree_logits_n(c, nodes, N_NODES, tc, &err) || flm_tree_logits_n(s, nodes, N_NODES, ts, &err))
        fail_msg("%s: tree logits: %s", name, err.msg);
    same(tc, ts, (size_t)N_NODES * V, name);
    const uint32_t keep[3] = {0, 1, 3};
    if (flm_tree_accept(c, pos, keep, 3, &err) || flm_tree_accept(s, pos, keep, 3, &err))
        fail_msg("%s: accept: %s", name, err.msg);
    assert_true(g_count[C_KV_COPY] > 0);
    pos += 3;
    decode_both(c, s, ids[3], pos++, false, V, name);
    /* the context shift, then decoding on */
    if (flm_kv_shift(c, 2, 5, &err) || flm_kv_shift(s, 2, 5, &err)) fail_msg("%s: shift: %s", name, err.msg);
    pos -= 5;
    assert_int_equal(g_count[C_KV_SHIFT], 1);
    decode_both(c, s, ids[4], pos++, false, V, name);
    decode_both(c, s, ids[5], pos++, false, V, name);
    if (mode == FLM_MODE_HOT) decode_both(c, s, ids[6], pos++, true, V, name);
    assert_true(g_count[C_READ] > 0);
    free(tc);
    free(ts);
    free(ac);
    free(as);
    free(ids);
    flm_close(c);
    flm_close(s);
    assert_int_equal(g_count[C_MEM_FREE], 1);
    printf("  %s: bit for bit through the %s;", name, ops->name);
    for (int i = 0; i < C_N; i++)
        if (g_count[i]) printf(" %s %lu", C_NAMES[i], g_count[i]);
    printf("\n");
}

static void run_case(const char *path, flm_mode mode, const char *name) {
    run_case_on(path, mode, name, &STUB);
    const flm_backend_ops dev = stub_device(); /* the same, its block on a device of its own */
    run_case_on(path, mode, name, &dev);
}

static void test_stories_gguf(void **state) {
    (void)state;
    run_case(tu_data(MODEL), FLM_MODE_AUTO, "stories260K gguf");
    assert_true(g_count[C_DENSE] > 0); /* the mapped source's dense block */
}

static void test_stories_flm(void **state) {
    (void)state;
    const char *out = tu_tmp("backend", ".flm");
    flm_error err;
    if (flm_convert(tu_data(MODEL), out, NULL, NULL, &err)) fail_msg("convert: %s", err.msg);
    run_case(out, FLM_MODE_RAM, "stories260K .flm ram");
    assert_true(g_count[C_BUN] > 0 && g_count[C_BUN_B] > 0);
    run_case(out, FLM_MODE_HOT, "stories260K .flm hot");
    assert_true(g_count[C_BUN_S] > 0 && g_count[C_BUN_BS] > 0);
    remove(out);
}

static void test_smollm2(void **state) {
    (void)state;
    const char *path = tu_model("smollm2-135m");
    if (!path) skip();
    run_case(path, FLM_MODE_AUTO, "SmolLM2-135M gguf");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_gguf),
        cmocka_unit_test(test_stories_flm),
        cmocka_unit_test(test_smollm2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
