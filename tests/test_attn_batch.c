/* test_attn_batch.c — a batch's attention as blocked matrix products (compute/attention_batch.c,
 * flm_attention_batch) gives, bit for bit, what flm_attention gives token by token: on random queries, keys and values
 * in an f16 and an f32 KV cache, for several batch sizes, start positions, head counts and group sizes (multi-head,
 * grouped, multi-query; head_dim a multiple of 8 or not), sliding windows, tree masks (random trees, batches of some
 * of their nodes) and 1 or 2 threads, at every kernel level this CPU has (the ones it lacks are reported as skipped).
 * The tile kernels themselves (kernels.h attn_scores_tile / attn_values_tile) are checked against the scalar ones,
 * bit for bit, on ragged shapes. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/attention.h"
#include "compute/kernels.h"

static void fill(float *x, size_t n, uint64_t *rng, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * tu_rand_f32(rng);
}

typedef struct shape {
    uint32_t n_heads, n_kv, hd;
} shape;

/* a random tree of n_nodes: parent[i] < i (-1: a root), depth and the ancestor matrix (self included) */
static void random_tree(uint32_t n_nodes, uint64_t *rng, int32_t *depth, uint8_t *anc) {
    memset(anc, 0, (size_t)n_nodes * n_nodes);
    for (uint32_t i = 0; i < n_nodes; i++) {
        int32_t parent = i == 0 ? -1 : (int32_t)(tu_rand_u64(rng) % i);
        if (i > 0 && tu_rand_u64(rng) % 8 == 0) parent = -1; /* another root */
        depth[i] = parent < 0 ? 0 : depth[parent] + 1;
        if (parent >= 0) memcpy(anc + (size_t)i * n_nodes, anc + (size_t)parent * n_nodes, n_nodes);
        anc[(size_t)i * n_nodes + i] = 1;
    }
}

/* The batch of rows pos .. pos + n - 1 against flm_attention per token, memcmp of every output. */
static void check_batch(const flm_kernels *k, const flm_kv_cache *c, uint32_t l, shape s, uint32_t pos, uint32_t n,
                        uint32_t window, const flm_att_tree *tree, int threads, uint64_t *rng) {
    const size_t q_dim = (size_t)s.n_heads * s.hd, q_stride = q_dim + 8, out_stride = q_dim + 5;
    float *q = malloc(n * q_stride * sizeof(float)), *want = calloc(n * out_stride, sizeof(float));
    float *got = malloc(n * out_stride * sizeof(float)), *att = malloc((size_t)s.n_heads * c->n_ctx * sizeof(float));
    uint8_t *mask = malloc(c->n_ctx);
    assert_non_null(q);
    assert_non_null(want);
    assert_non_null(got);
    assert_non_null(att);
    assert_non_null(mask);
    fill(q, n * q_stride, rng, 2.0f);
    memset(got, 0x5a, n * out_stride * sizeof(float)); /* the gaps between rows stay as they were */
    memset(want, 0x5a, n * out_stride * sizeof(float));
    for (uint32_t t = 0; t < n; t++) { /* as runtime/forward.c's token-by-token loop */
        const uint32_t slot = pos + t, p = tree ? tree->base + (uint32_t)tree->depth[slot - tree->base] : slot;
        const uint32_t first = window && p >= window ? p - window + 1 : 0;
        const uint8_t *m = NULL;
        if (tree) {
            const uint32_t i = slot - tree->base;
            for (uint32_t j = first; j <= slot; j++)
                mask[j - first] = j < tree->base || tree->anc[(size_t)i * tree->n_nodes + (j - tree->base)];
            m = mask;
        }
        flm_attention(k, c, l, first, slot, q + t * q_stride, s.n_heads, s.n_kv, s.hd, 0.0883883f, att,
                      want + t * out_stride, threads, m);
    }
    assert_true(flm_attention_batch(k, c, l, pos, n, window, tree, q, q_stride, s.n_heads, s.n_kv, s.hd, 0.0883883f,
                                    got, out_stride, threads, NULL));
    if (memcmp(want, got, n * out_stride * sizeof(float))) {
        size_t i = 0;
        while (!memcmp(want + i, got + i, sizeof(float))) i++;
        fail_msg("%s, %s cache, %u heads / %u KV heads of %u, rows %u..%u, window %u, %s, %d threads: output %zu "
                 "(row %zu) %.9g != %.9g token by token", k->name, c->elem_bytes == FLM_KV_F16 ? "f16" : "f32",
                 s.n_heads, s.n_kv, s.hd, pos, pos + n - 1, window, tree ? "tree" : "causal", threads, i,
                 i / out_stride, got[i], want[i]);
    }
    free(q);
    free(want);
    free(got);
    free(att);
    free(mask);
}

/* a cache of 2 layers x n_ctx rows of random keys and values */
static void random_cache(flm_kv_cache *c, uint32_t n_ctx, uint32_t kv_dim, uint32_t elem_bytes, uint64_t *rng) {
    flm_error err;
    assert_int_equal(flm_kv_cache_init(c, 2, n_ctx, kv_dim, elem_bytes, &err), FLM_OK);
    float *k = malloc(kv_dim * sizeof(float)), *v = malloc(kv_dim * sizeof(float));
    assert_non_null(k);
    assert_non_null(v);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t t = 0; t < n_ctx; t++) {
            fill(k, kv_dim, rng, 3.0f);
            fill(v, kv_dim, rng, 1.0f);
            flm_kv_store(flm_kernels_scalar(), c, l, t, k, v); /* the same halves at every level */
        }
    free(k);
    free(v);
}

static void run_level(flm_kernel_level L) {
    const flm_kernels *k = flm_kernels_for_level(L);
    if (!k) {
        print_message("skipped: this CPU lacks the %s kernel level\n", flm_kernel_level_name(L));
        skip();
    }
    /* Gemma 3 270M (4 heads, 1 KV head of 256), Qwen2.5-Coder-1.5B (12 / 2 of 128), SmolLM2 (9 / 3 of 64),
     * multi-head attention, and head_dim 20 (not a multiple of 8: the scalar tiles) */
    const shape shapes[] = {{4, 1, 256}, {12, 2, 128}, {9, 3, 64}, {4, 4, 32}, {6, 2, 20}};
    const uint32_t n_ctx = 160;
    uint64_t rng = 11 + (uint64_t)L;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int f32 = 0; f32 < 2; f32++) {
            const shape s = shapes[si];
            flm_kv_cache c;
            random_cache(&c, n_ctx, s.n_kv * s.hd, f32 ? FLM_KV_F32 : FLM_KV_F16, &rng);
            /* causal batches: {pos, n, window} */
            const uint32_t cases[][3] = {{0, 2, 0},   {0, 17, 0},  {3, 5, 0},  {0, 64, 0}, {90, 70, 0},
                                         {40, 33, 16}, {0, 40, 7}, {100, 9, 4}, {20, 64, 50}};
            for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
                for (int nt = 1; nt <= 2; nt++)
                    check_batch(k, &c, (uint32_t)ci % 2, s, cases[ci][0], cases[ci][1], cases[ci][2], NULL, nt, &rng);
            /* trees: a context of base slots, then nodes; batches of all nodes or of some from node0 on */
            for (int ti = 0; ti < 6; ti++) {
                const uint32_t base = ti < 3 ? 30u + 17u * (uint32_t)ti : 0u, n_nodes = 5u + 9u * (uint32_t)(ti % 3);
                int32_t depth[32];
                uint8_t anc[32 * 32];
                random_tree(n_nodes, &rng, depth, anc);
                const flm_att_tree tree = {base, n_nodes, depth, anc};
                const uint32_t node0 = ti % 2 ? n_nodes / 3 : 0, window = ti == 1 ? 20 : ti == 4 ? 3 : 0;
                for (int nt = 1; nt <= 2; nt++)
                    check_batch(k, &c, 1, s, base + node0, n_nodes - node0, window, &tree, nt, &rng);
            }
            flm_kv_cache_free(&c);
        }
}

static void test_batch_scalar(void **state) {
    (void)state;
    run_level(FLM_KERNELS_SCALAR);
}
static void test_batch_avx2(void **state) {
    (void)state;
    run_level(FLM_KERNELS_AVX2);
}
static void test_batch_avx512(void **state) {
    (void)state;
    run_level(FLM_KERNELS_AVX512);
}
static void test_batch_vnni(void **state) {
    (void)state;
    run_level(FLM_KERNELS_VNNI);
}

/* A long context: the scores of 32 rows over 9k positions would take the scratch past its 2 MiB, so chunks take
 * fewer rows; the same bits. */
static void test_long_context(void **state) {
    (void)state;
    const shape s = {4, 1, 256};
    flm_kv_cache c;
    uint64_t rng = 99;
    random_cache(&c, 9100, s.n_kv * s.hd, FLM_KV_F16, &rng);
    for (int nt = 1; nt <= 2; nt++) {
        check_batch(flm_kernels_best(), &c, 0, s, 9000, 64, 0, NULL, nt, &rng);
        check_batch(flm_kernels_best(), &c, 1, s, 9050, 50, 512, NULL, nt, &rng);
    }
    flm_kv_cache_free(&c);
}

/* A head_dim above FLM_ATT_MAX_HEAD_DIM (the tiles' row buffers; `flashlm synth` writes such models, and the
 * per-token path serves them over an f32 cache): refused, nothing written, so the caller runs flm_attention per token. */
static void test_head_dim_above_limit(void **state) {
    (void)state;
    const uint32_t hd = FLM_ATT_MAX_HEAD_DIM + 8;
    flm_kv_cache c;
    uint64_t rng = 3;
    random_cache(&c, 4, hd, FLM_KV_F32, &rng);
    float *q = calloc(3 * hd, sizeof(float)), *out = malloc(3 * hd * sizeof(float));
    assert_non_null(q);
    assert_non_null(out);
    memset(out, 0x5a, 3 * hd * sizeof(float));
    assert_false(flm_attention_batch(flm_kernels_best(), &c, 0, 0, 3, 0, NULL, q, hd, 1, 1, hd, 1.0f, out, hd, 2, NULL));
    for (size_t i = 0; i < 3 * hd; i++) assert_int_equal(((const uint8_t *)out)[4 * i], 0x5a);
    free(q);
    free(out);
    flm_kv_cache_free(&c);
}

/* The tile kernels of every level against the scalar ones on ragged shapes: rows 1..9 (register blocks and their
 * remainders), positions 1..40 (transposed blocks of 16 and tails), head_dim 8..264 and 12 (scalar fallback), values
 * onto non-zero running sums. */
static void test_tiles(void **state) {
    (void)state;
    const flm_kernels *s = flm_kernels_scalar();
    const size_t ds[] = {8, 12, 16, 24, 64, 128, 256, 264};
    const size_t ns[] = {1, 7, 8, 9, 16, 17, 40};
    uint64_t rng = 5;
    for (int L = 1; L < FLM_KERNELS_N_LEVELS; L++) {
        const flm_kernels *k = flm_kernels_for_level((flm_kernel_level)L);
        if (!k) {
            print_message("skipped: this CPU lacks the %s kernel level\n", flm_kernel_level_name((flm_kernel_level)L));
            continue;
        }
        for (size_t di = 0; di < sizeof ds / sizeof *ds; di++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
                for (size_t rows = 1; rows <= 9; rows += 2)
                    for (uint32_t eb = FLM_KV_F16; eb <= FLM_KV_F32; eb += 2) {
                        const size_t d = ds[di], n = ns[ni], stride = d + 16;
                        float *q = malloc(rows * d * 4), *w = malloc(rows * n * 4), *sa = malloc(rows * n * 4);
                        float *sb = malloc(rows * n * 4), *oa = malloc(rows * d * 4), *ob = malloc(rows * d * 4);
                        void *X = malloc(n * stride * eb);
                        fill(q, rows * d, &rng, 2.0f);
                        fill(w, rows * n, &rng, 1.0f);
                        fill(oa, rows * d, &rng, 1.0f);
                        memcpy(ob, oa, rows * d * 4);
                        for (size_t i = 0; i < n * stride; i++) {
                            float x = 3.0f * tu_rand_f32(&rng);
                            if (eb == FLM_KV_F16) ((uint16_t *)X)[i] = flm_f32_to_f16(x);
                            else ((float *)X)[i] = x;
                        }
                        const float *qp[9], *wp[9];
                        float *sap[9], *sbp[9], *oap[9], *obp[9];
                        for (size_t r = 0; r < rows; r++) {
                            qp[r] = q + r * d, wp[r] = w + r * n;
                            sap[r] = sa + r * n, sbp[r] = sb + r * n, oap[r] = oa + r * d, obp[r] = ob + r * d;
                        }
                        s->attn_scores_tile(qp, rows, X, eb, stride, n, d, 0.125f, sap);
                        k->attn_scores_tile(qp, rows, X, eb, stride, n, d, 0.125f, sbp);
                        s->attn_values_tile(wp, rows, X, eb, stride, n, d, oap);
                        k->attn_values_tile(wp, rows, X, eb, stride, n, d, obp);
                        if (memcmp(sa, sb, rows * n * 4) || memcmp(oa, ob, rows * d * 4))
                            fail_msg("%s tiles differ from scalar: d %zu, n %zu, rows %zu, %u-byte cache", k->name,
                                     d, n, rows, eb);
                        free(q); free(w); free(sa); free(sb); free(oa); free(ob); free(X);
                    }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiles),
        cmocka_unit_test(test_batch_scalar),
        cmocka_unit_test(test_batch_avx2),
        cmocka_unit_test(test_batch_avx512),
        cmocka_unit_test(test_batch_vnni),
        cmocka_unit_test(test_long_context),
        cmocka_unit_test(test_head_dim_above_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
