/* test_pass.c — the forward pass's blocks (runtime/pass.h) and the descriptor options (model/arch.h) the llama-shaped
 * test model does not use itself: LayerNorm (OPT, Falcon, Phi-2, Persimmon), learned absolute positions (OPT),
 * parallel attention/FFN (Falcon, Phi-2); here they are swapped into stories260K's descriptor one at a time.
 *
 *   - the linear block: one token goes through flm_matvec, a batch through flm_matmat, every row bit-identical, with
 *     the bias added;
 *   - the norm block follows the descriptor: RMSNorm, or LayerNorm with its bias;
 *   - the attention block stores RoPE-rotated keys, or the keys as they are with learned positions;
 *   - on stories260K (tests/data) with its descriptor swapped for variants: LayerNorm, learned positions (a zero table:
 *     position 0's logits equal RoPE's, whose rotation there is the identity; later ones differ) and parallel blocks
 *     each change the logits, and a batch gives the same logits as token by token under every variant. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/pass.h"
#include "runtime/runtime.h"

static float *rand_vec(size_t n, uint64_t *rng) {
    float *v = malloc(n * sizeof(float));
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) v[i] = tu_rand_f32(rng);
    return v;
}

static void test_linear_block(void **state) {
    (void)state;
    enum { ROWS = 48, COLS = 64, N = 3 };
    uint64_t rng = 11;
    float *W = rand_vec((size_t)ROWS * COLS, &rng), *b = rand_vec(ROWS, &rng), *X = rand_vec((size_t)N * COLS, &rng);
    uint8_t wq[ROWS * (COLS / 32) * 34]; /* q8_0: 34 bytes per 32 values */
    for (int r = 0; r < ROWS; r++) assert_true(flm_quantize_row(FLM_TYPE_Q8_0, W + r * COLS, wq + r * 68, COLS));
    flm_arch arch = *flm_arch_find("llama");
    flm_hparams hp = {.arch = &arch, .norm_eps = 1e-5f};
    const flm_kernels *k = flm_kernels_best();
    const flm_weight types[2] = {{FLM_TYPE_F32, COLS, ROWS, W}, {FLM_TYPE_Q8_0, COLS, ROWS, wq}};
    const flm_weight bias = {FLM_TYPE_F32, ROWS, 1, b};
    for (int ti = 0; ti < 2; ti++) {
        const flm_weight *w = &types[ti];
        float want[N][ROWS], got[N][ROWS];
        for (int t = 0; t < N; t++) {
            flm_matvec(k, w->type, w->data, ROWS, COLS, X + t * COLS, want[t], 1);
            for (int r = 0; r < ROWS; r++) want[t][r] += b[r];
        }
        flm_pass one = {.k = k, .hp = &hp, .n_threads = 1, .n = 1};
        flm_pass_linear(&one, w, &bias, ROWS, COLS, X + COLS, COLS, got[1], ROWS);
        assert_memory_equal(got[1], want[1], sizeof want[1]);
        flm_pass batch = {.k = k, .hp = &hp, .n_threads = 2, .n = N};
        flm_pass_linear(&batch, w, &bias, ROWS, COLS, X, COLS, got[0], ROWS);
        assert_memory_equal(got, want, sizeof want);
    }
    free(W);
    free(b);
    free(X);
}

static void test_norm_block(void **state) {
    (void)state;
    enum { D = 16, N = 2 };
    uint64_t rng = 12;
    float *x = rand_vec(N * D, &rng), *w = rand_vec(D, &rng), *b = rand_vec(D, &rng);
    flm_arch arch = *flm_arch_find("llama");
    flm_hparams hp = {.arch = &arch, .norm_eps = 1e-5f};
    const flm_weight nw = {FLM_TYPE_F32, D, 1, w}, nb = {FLM_TYPE_F32, D, 1, b};
    flm_pass P = {.k = flm_kernels_best(), .hp = &hp, .n_threads = 1, .n = N};
    float got[N * D], want[N * D];
    flm_pass_norm(&P, &nw, &nb, D, x, D, got, D); /* RMSNorm: the bias is not part of it */
    for (int t = 0; t < N; t++) flm_rmsnorm(want + t * D, x + t * D, w, D, hp.norm_eps);
    assert_memory_equal(got, want, sizeof want);
    arch.norm = FLM_NORM_LAYER;
    flm_pass_norm(&P, &nw, &nb, D, x, D, got, D);
    for (int t = 0; t < N; t++) flm_layernorm(want + t * D, x + t * D, w, b, D, hp.norm_eps);
    assert_memory_equal(got, want, sizeof want);
    free(x);
    free(w);
    free(b);
}

/* Two tokens' keys through the attention block: RoPE-rotated at their positions, or stored as they are with learned
 * positions. */
static void test_attention_positions(void **state) {
    (void)state;
    enum { HEADS = 2, HD = 8, DIM = HEADS * HD, N = 2 };
    uint64_t rng = 13;
    flm_arch arch = *flm_arch_find("llama");
    flm_hparams hp = {.arch = &arch, .n_heads = HEADS, .n_kv_heads = HEADS, .head_dim = HD, .rope_dim = HD,
                      .rope_theta = 10000.0f, .rope_theta_local = 10000.0f, .attn_scale = 0.35f, .norm_eps = 1e-5f};
    flm_kv_cache kv;
    flm_error err;
    assert_int_equal(flm_kv_cache_init(&kv, 1, 8, DIM, FLM_KV_F32, &err), FLM_OK);
    float att[HEADS * 8], out[N * DIM];
    flm_layer_weights L = {0};
    for (int learned = 0; learned < 2; learned++) {
        arch.pos = learned ? FLM_POS_LEARNED : FLM_POS_ROPE;
        float *q = rand_vec(N * DIM, &rng), *k = rand_vec(N * DIM, &rng), *v = rand_vec(N * DIM, &rng);
        float k0[N * DIM];
        memcpy(k0, k, sizeof k0);
        flm_pass P = {.k = flm_kernels_best(), .hp = &hp, .kv = &kv, .n_threads = 1, .n = N, .pos = 3, .att = att};
        flm_pass_attention(&P, &L, 0, q, k, v, out, DIM);
        for (int t = 0; t < N; t++) {
            float want[DIM];
            memcpy(want, k0 + t * DIM, sizeof want);
            if (!learned) flm_rope(want, HEADS, HD, HD, 3 + t, hp.rope_theta, false);
            assert_memory_equal(flm_kv_key(&kv, 0, 3 + t), want, sizeof want);
            assert_memory_equal(flm_kv_value(&kv, 0, 3 + t), v + t * DIM, sizeof want);
        }
        free(q);
        free(k);
        free(v);
    }
    flm_kv_cache_free(&kv);
}

/* ---- the descriptor options on a real model ------------------------------------------------------------------- */
#define NT 6

static const int32_t k_tokens[NT] = {1, 403, 261, 350, 289, 407};

/* logits of every token, batched (batch) or one flm_eval at a time, into out[NT][V] */
static void run(flm_ctx *ctx, bool batch, float *out) {
    flm_error err;
    const uint32_t V = ctx->model->hp.n_vocab;
    if (batch) {
        if (flm_eval_batch(ctx, k_tokens, NT, 0, out, NULL, &err)) fail_msg("eval_batch: %s", err.msg);
        return;
    }
    for (int t = 0; t < NT; t++) {
        const float *lg;
        if (flm_eval(ctx, k_tokens[t], t, &lg, &err)) fail_msg("eval: %s", err.msg);
        memcpy(out + (size_t)t * V, lg, V * sizeof(float));
    }
}

static bool rows_equal(const float *a, const float *b, uint32_t V, int t) {
    return !memcmp(a + (size_t)t * V, b + (size_t)t * V, V * sizeof(float));
}

static void test_descriptor_variants(void **state) {
    (void)state;
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = 64;
    p.mode = FLM_MODE_RAM;
    flm_ctx *ctx;
    flm_error err;
    if (flm_open(tu_data("models/stories260K/stories260K.gguf"), &p, &ctx, &err)) fail_msg("open: %s", err.msg);
    flm_model *m = ctx->model;
    const uint32_t V = m->hp.n_vocab, d = m->hp.d_model;
    const flm_arch *orig = m->hp.arch;
    flm_arch arch = *orig;
    m->hp.arch = &arch;
    float *base = malloc((size_t)NT * V * sizeof(float)), *a = malloc((size_t)NT * V * sizeof(float)),
          *b = malloc((size_t)NT * V * sizeof(float));
    float *pos_table = calloc((size_t)p.n_ctx * d, sizeof(float)); /* learned positions, all zero */
    assert_true(base && a && b && pos_table);
    run(ctx, false, base);
    run(ctx, true, a);
    assert_memory_equal(a, base, (size_t)NT * V * sizeof(float)); /* the plain descriptor: batch == token by token */

    /* LayerNorm (no bias tensors: w only) */
    arch.norm = FLM_NORM_LAYER;
    run(ctx, false, a);
    run(ctx, true, b);
    assert_memory_equal(a, b, (size_t)NT * V * sizeof(float));
    assert_false(rows_equal(a, base, V, 0));
    arch.norm = FLM_NORM_RMS;

    /* learned positions, a zero table: no RoPE. At position 0 RoPE is the identity, so token 0's logits are the
     * plain model's; later tokens' differ */
    arch.pos = FLM_POS_LEARNED;
    m->pos_embd = (flm_weight){FLM_TYPE_F32, d, (uint64_t)p.n_ctx, pos_table};
    run(ctx, false, a);
    run(ctx, true, b);
    assert_memory_equal(a, b, (size_t)NT * V * sizeof(float));
    assert_true(rows_equal(a, base, V, 0));
    assert_false(rows_equal(a, base, V, NT - 1));
    /* a nonzero row for position 0 changes token 0 */
    for (uint32_t i = 0; i < d; i++) pos_table[i] = 0.5f * (float)((i % 7) - 3);
    run(ctx, true, b);
    assert_false(rows_equal(a, b, V, 0));
    m->pos_embd = (flm_weight){0};
    arch.pos = FLM_POS_ROPE;

    /* parallel attention and FFN */
    arch.flags |= FLM_ARCH_PARALLEL;
    run(ctx, false, a);
    run(ctx, true, b);
    assert_memory_equal(a, b, (size_t)NT * V * sizeof(float));
    assert_false(rows_equal(a, base, V, 0));
    arch.flags &= ~(unsigned)FLM_ARCH_PARALLEL;

    /* back to the plain descriptor: the plain logits again */
    run(ctx, true, a);
    assert_memory_equal(a, base, (size_t)NT * V * sizeof(float));
    m->hp.arch = orig;
    flm_close(ctx);
    free(base);
    free(a);
    free(b);
    free(pos_table);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_block),
        cmocka_unit_test(test_norm_block),
        cmocka_unit_test(test_attention_positions),
        cmocka_unit_test(test_descriptor_variants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
