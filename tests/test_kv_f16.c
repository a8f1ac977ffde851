/* test_kv_f16.c — the f16 KV cache: half the bytes of the f32 one; keys and values stored as halves read back as the
 * f16-rounded floats the f32 cache used to hold; the attention kernels over halves (scalar and AVX2) give the bits of
 * the float loops; and flm_attention over an f16 cache gives, bit for bit, what the previous code gave over an f32
 * cache holding f16-rounded keys and values (its f16 branch, copied below as the reference). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/attention.h"
#include "compute/kernels.h"
#include "flashlm.h"
#include "runtime/runtime.h"

static float round_f16(float x) { return flm_f16_to_f32(flm_f32_to_f16(x)); }

static void fill(float *x, size_t n, uint64_t *rng, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * tu_rand_f32(rng);
}

static void test_bytes_and_layout(void **state) {
    (void)state;
    /* Qwen2.5-Coder-1.5B at -c 2048: 28 layers, 2 KV heads of 128 -> 112 MiB in f32, 56 MiB in f16 */
    assert_int_equal(flm_kv_cache_bytes(28, 2048, 256, FLM_KV_F32), 112ull << 20);
    assert_int_equal(flm_kv_cache_bytes(28, 2048, 256, FLM_KV_F16), 56ull << 20);
    flm_kv_cache c;
    flm_error err;
    assert_int_equal(flm_kv_cache_init(&c, 3, 5, 16, 3, &err), FLM_ERR_ARG);
    assert_int_equal(flm_kv_cache_init(&c, 3, 5, 16, FLM_KV_F16, &err), FLM_OK);
    assert_ptr_equal(flm_kv_key(&c, 2, 4), (uint16_t *)c.k + (2 * 5 + 4) * 16);
    assert_ptr_equal(flm_kv_value(&c, 1, 3), (uint16_t *)c.v + (1 * 5 + 3) * 16);
    uint64_t rng = 7;
    float k[16], v[16];
    fill(k, 16, &rng, 3.0f);
    fill(v, 16, &rng, 0.01f);
    k[0] = 70000.0f; /* overflows to inf, as vcvtps2ph */
    k[1] = 1e-7f;    /* a half subnormal */
    for (int lv = 0; lv < FLM_KERNELS_N_LEVELS; lv++) { /* every level's to_f16 stores the same halves */
        const flm_kernels *kt = flm_kernels_for_level((flm_kernel_level)lv);
        if (!kt) continue;
        memset(flm_kv_key(&c, 2, 4), 0, 16 * 2);
        memset(flm_kv_value(&c, 2, 4), 0, 16 * 2);
        flm_kv_store(kt, &c, 2, 4, k, v);
        const uint16_t *kh = flm_kv_key(&c, 2, 4), *vh = flm_kv_value(&c, 2, 4);
        for (int i = 0; i < 16; i++) {
            assert_int_equal(kh[i], flm_f32_to_f16(k[i]));
            assert_true(flm_f16_to_f32(vh[i]) == round_f16(v[i]));
        }
        assert_true(isinf(flm_f16_to_f32(kh[0])));
    }
    assert_int_equal(((const uint16_t *)flm_kv_key(&c, 2, 3))[0], 0); /* the neighbours are untouched */
    flm_kv_cache_free(&c);
    /* f32: stored as is, in caller memory */
    float mem[2 * 2 * 4 * 16] = {0};
    flm_kv_cache_init_in(&c, 2, 4, 16, FLM_KV_F32, mem);
    assert_ptr_equal(c.v, mem + 2 * 4 * 16);
    flm_kv_store(flm_kernels_best(), &c, 1, 2, k, v);
    assert_memory_equal(flm_kv_key(&c, 1, 2), k, sizeof k);
    assert_memory_equal(flm_kv_value(&c, 1, 2), v, sizeof v);
    flm_kv_cache_free(&c); /* frees nothing */
}

/* The kernels against the float loops over the same f16-rounded values, for every table, bit for bit. */
static void test_kernels_exact(void **state) {
    (void)state;
    const flm_kernels *tables[2] = {flm_kernels_scalar(), flm_kernels_avx2()};
    const size_t ds[] = {3, 8, 12, 64, 128, 136, 256};
    const size_t ns[] = {1, 7, 8, 9, 31, 65, 200};
    uint64_t rng = 42;
    for (size_t di = 0; di < sizeof ds / sizeof *ds; di++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            size_t d = ds[di], n = ns[ni], stride = d + 24; /* other heads' elements in between */
            uint16_t *K = malloc(n * stride * 2), *V = malloc(n * stride * 2);
            float *Kf = malloc(n * stride * 4), *Vf = malloc(n * stride * 4), *q = malloc(d * 4), *w = malloc(n * 4);
            float *want_s = malloc(n * 4), *want_v = malloc(d * 4), *got_s = malloc(n * 4), *got_v = malloc(d * 4);
            for (size_t i = 0; i < n * stride; i++) {
                K[i] = flm_f32_to_f16(4.0f * tu_rand_f32(&rng));
                V[i] = flm_f32_to_f16(tu_rand_f32(&rng));
                Kf[i] = flm_f16_to_f32(K[i]);
                Vf[i] = flm_f16_to_f32(V[i]);
            }
            for (size_t i = 0; i < d; i++) q[i] = round_f16(2.0f * tu_rand_f32(&rng));
            for (size_t t = 0; t < n; t++) w[t] = round_f16(0.5f + 0.5f * tu_rand_f32(&rng));
            const float scale = 1.0f / sqrtf((float)d);
            for (size_t t = 0; t < n; t++) { /* the previous code's loops over an f32 cache */
                float s = 0.0f;
                for (size_t i = 0; i < d; i++) s += q[i] * Kf[t * stride + i];
                want_s[t] = s * scale;
            }
            memset(want_v, 0, d * 4);
            for (size_t t = 0; t < n; t++)
                for (size_t i = 0; i < d; i++) want_v[i] += w[t] * Vf[t * stride + i];
            for (int k = 0; k < 2; k++) {
                if (!tables[k]) continue; /* no AVX2 here */
                memset(got_s, 0xff, n * 4);
                memset(got_v, 0xff, d * 4);
                tables[k]->attn_scores_f16(q, K, stride, n, d, scale, got_s);
                tables[k]->attn_values_f16(w, V, stride, n, d, got_v);
                if (memcmp(got_s, want_s, n * 4) || memcmp(got_v, want_v, d * 4))
                    fail_msg("%s attention kernels differ from the float loops at d %zu, n %zu", tables[k]->name, d, n);
            }
            free(K); free(V); free(Kf); free(Vf); free(q); free(w);
            free(want_s); free(want_v); free(got_s); free(got_v);
        }
}

/* The previous flm_attention's f16 branch (f32 cache holding f16-rounded keys and values), as the reference; its
 * softmax is kt's (the table flm_attention is given). */
static void attention_before(const flm_kernels *kt, const flm_kv_cache *c, uint32_t l, uint32_t first, uint32_t pos,
                             const float *q, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float scale,
                             float *att, float *out) {
    uint32_t group = n_heads / n_kv_heads;
    for (int h = 0; h < (int)n_heads; h++) {
        float qh[FLM_ATT_MAX_HEAD_DIM];
        for (uint32_t i = 0; i < head_dim; i++) qh[i] = round_f16(q[(size_t)h * head_dim + i]);
        float *a = att + (size_t)h * c->n_ctx;
        size_t koff = (size_t)(h / group) * head_dim;
        for (uint32_t t = first; t <= pos; t++) {
            const float *k = (const float *)flm_kv_key(c, l, t) + koff;
            float s = 0.0f;
            for (uint32_t i = 0; i < head_dim; i++) s += qh[i] * k[i];
            a[t - first] = s * scale;
        }
        flm_softmax(kt, a, pos - first + 1);
        for (uint32_t t = 0; t <= pos - first; t++) a[t] = round_f16(a[t]);
        float *o = out + (size_t)h * head_dim;
        memset(o, 0, head_dim * sizeof(float));
        for (uint32_t t = first; t <= pos; t++) {
            const float *v = (const float *)flm_kv_value(c, l, t) + koff;
            float w = a[t - first];
            for (uint32_t i = 0; i < head_dim; i++) o[i] += w * v[i];
        }
    }
}

static void test_attention_as_before(void **state) {
    (void)state;
    const uint32_t L = 2, n_ctx = 160, n_heads = 6, n_kv = 2, hd = 64, kv_dim = n_kv * hd;
    flm_kv_cache c16, c32;
    flm_error err;
    assert_int_equal(flm_kv_cache_init(&c16, L, n_ctx, kv_dim, FLM_KV_F16, &err), FLM_OK);
    assert_int_equal(flm_kv_cache_init(&c32, L, n_ctx, kv_dim, FLM_KV_F32, &err), FLM_OK);
    uint64_t rng = 3;
    float *k = malloc(kv_dim * 4), *v = malloc(kv_dim * 4), *kr = malloc(kv_dim * 4), *vr = malloc(kv_dim * 4);
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t t = 0; t < n_ctx; t++) {
            fill(k, kv_dim, &rng, 3.0f);
            fill(v, kv_dim, &rng, 1.0f);
            for (uint32_t i = 0; i < kv_dim; i++) kr[i] = round_f16(k[i]), vr[i] = round_f16(v[i]);
            flm_kv_store(flm_kernels_best(), &c16, l, t, k, v);   /* rounded by the cache */
            flm_kv_store(flm_kernels_best(), &c32, l, t, kr, vr); /* rounded before, as the forward pass did */
        }
    float q[6 * 64], att_a[6 * 160], att_b[6 * 160], out_a[6 * 64], out_b[6 * 64];
    const flm_kernels *tables[2] = {flm_kernels_scalar(), flm_kernels_best()};
    /* global attention at several positions (one and two threads: heads split, pos - first >= 64), and a window */
    const uint32_t cases[][3] = {{1, 0, 0}, {1, 0, 37}, {0, 0, 159}, {1, 90, 159}, {0, 150, 151}};
    for (int kt = 0; kt < 2; kt++)
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
            for (int nt = 1; nt <= 2; nt++) {
                uint32_t l = cases[ci][0], first = cases[ci][1], pos = cases[ci][2];
                fill(q, sizeof q / sizeof *q, &rng, 2.0f);
                attention_before(tables[kt], &c32, l, first, pos, q, n_heads, n_kv, hd, 0.125f, att_a, out_a);
                flm_attention(tables[kt], &c16, l, first, pos, q, n_heads, n_kv, hd, 0.125f, att_b, out_b, nt, NULL);
                if (memcmp(out_a, out_b, sizeof out_a))
                    fail_msg("%s, layer %u, positions %u..%u, %d threads: attention differs from before",
                             tables[kt]->name, l, first, pos, nt);
            }
    free(k); free(v); free(kr); free(vr);
    flm_kv_cache_free(&c16);
    flm_kv_cache_free(&c32);
}

/* A context's KV cache follows --kv-f32: f16 (half the bytes) by default, and the stats say which. */
static void test_context_kv(void **state) {
    (void)state;
    for (int f32 = 0; f32 < 2; f32++) {
        flm_params p;
        flm_params_default(&p);
        p.n_threads = 1;
        p.n_ctx = 64;
        p.kv_f32 = f32;
        flm_ctx *ctx = NULL;
        flm_error err;
        if (flm_open(tu_data("models/stories260K/stories260K.gguf"), &p, &ctx, &err)) fail_msg("%s", err.msg);
        flm_stats s;
        flm_get_stats(ctx, &s);
        const flm_hparams *hp = &ctx->model->hp;
        uint64_t f32_bytes = 2ull * hp->n_layers * 64 * hp->n_kv_heads * hp->head_dim * 4;
        assert_int_equal(s.mem_kv, f32 ? f32_bytes : f32_bytes / 2);
        assert_string_equal(s.kv_type, f32 ? "f32" : "f16");
        assert_int_equal(s.n_ctx, 64);
        assert_int_equal(ctx->be.kv.elem_bytes, f32 ? FLM_KV_F32 : FLM_KV_F16);
        flm_close(ctx);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_and_layout),
        cmocka_unit_test(test_kernels_exact),
        cmocka_unit_test(test_attention_as_before),
        cmocka_unit_test(test_context_kv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
