/* test_kernels.c — the compute kernels: SIMD against the scalar reference, conversions, quantizers, matvec,
 * rmsnorm, softmax. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/kernels.h"
#include "compute/work.h"
#include "core/types.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TEST_HAVE_F16C_HW 1
#endif

static const uint32_t all_types[] = {FLM_TYPE_F32,  FLM_TYPE_F16,  FLM_TYPE_BF16, FLM_TYPE_Q8_0, FLM_TYPE_Q4_0,
                                     FLM_TYPE_Q4_1, FLM_TYPE_Q5_0, FLM_TYPE_Q5_1, FLM_TYPE_Q2_K, FLM_TYPE_Q3_K,
                                     FLM_TYPE_Q4_K, FLM_TYPE_Q5_K, FLM_TYPE_Q6_K};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

static bool is_quant(uint32_t t) { return flm_type_traits_of(t)->is_quantized; }

/* Byte offsets of a block's f16 scale fields (d, then m or dmin where the type has one; -1: none), from the
 * layouts in core/types.h. */
static void scale_offsets(uint32_t t, int off[2]) {
    off[0] = 0, off[1] = -1;
    switch (t) {
    case FLM_TYPE_Q4_1: case FLM_TYPE_Q5_1: case FLM_TYPE_Q4_K: case FLM_TYPE_Q5_K: off[1] = 2; break;
    case FLM_TYPE_Q2_K: off[0] = 80, off[1] = 82; break;
    case FLM_TYPE_Q3_K: off[0] = 108; break;
    case FLM_TYPE_Q6_K: off[0] = 208; break;
    default: break;
    }
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
static bool bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0; }

/* A random row of n elements of type t, placed at a deliberately misaligned address inside *base (free that).
 * Float types hold converted uniform values; quantized types hold random scales and raw random quants, so every
 * nibble and int8 value (including -128) occurs. */
static void *rand_row(uint32_t t, size_t n, uint64_t *rng, void **base) {
    size_t bytes = flm_row_bytes(t, n);
    uint8_t *mem = malloc(bytes + 64);
    assert_non_null(mem);
    *base = mem;
    uint8_t *row = mem + (t == FLM_TYPE_F32 ? 4 : 2); /* not 32-byte aligned */
    if (is_quant(t)) {
        for (size_t i = 0; i < bytes; i++) row[i] = (uint8_t)tu_rand_u64(rng);
        size_t bb = flm_type_block_bytes(t);
        int off[2];
        scale_offsets(t, off);
        for (size_t b = 0; b < n / flm_type_block_elems(t); b++) {
            uint16_t d = flm_f32_to_f16(tu_rand_f32(rng) * 0.05f);
            memcpy(row + b * bb + off[0], &d, sizeof d); /* finite, sane scales; every other bit random */
            if (off[1] >= 0) {
                d = flm_f32_to_f16(tu_rand_f32(rng) * 0.05f);
                memcpy(row + b * bb + off[1], &d, sizeof d);
            }
        }
    } else {
        float *tmp = malloc((n + 1) * sizeof(float));
        assert_non_null(tmp);
        for (size_t i = 0; i < n; i++) tmp[i] = tu_rand_f32(rng) * 2.0f;
        flm_quantize_row(t, tmp, row, n);
        free(tmp);
    }
    return row;
}

/* n random floats at a misaligned address (x + 1 of a fresh buffer stored in *base). */
static float *rand_vec(size_t n, uint64_t *rng, float scale, void **base) {
    float *mem = malloc((n + 2) * sizeof(float));
    assert_non_null(mem);
    *base = mem;
    for (size_t i = 0; i < n; i++) mem[i + 1] = tu_rand_f32(rng) * scale;
    return mem + 1;
}

static const size_t float_lens[] = {0, 1, 7, 8, 32, 33, 64, 96, 160, 172, 257, 4096 + 32};
static const size_t quant_lens[] = {32, 64, 96, 160, 4096 + 32};
static const size_t kquant_lens[] = {256, 768, 4096 + 256};

static void lens_for(uint32_t t, const size_t **lens, size_t *count) {
    if (flm_type_block_elems(t) == 256) {
        *lens = kquant_lens;
        *count = sizeof kquant_lens / sizeof kquant_lens[0];
    } else if (is_quant(t)) {
        *lens = quant_lens;
        *count = sizeof quant_lens / sizeof quant_lens[0];
    } else {
        *lens = float_lens;
        *count = sizeof float_lens / sizeof float_lens[0];
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Tables
 * ------------------------------------------------------------------------------------------------------------- */
static void test_tables(void **state) {
    (void)state;
    const flm_kernels *s = flm_kernels_scalar(), *b = flm_kernels_best(), *a = flm_kernels_avx2();
    assert_non_null(s);
    assert_non_null(b);
    assert_string_equal(s->name, "scalar");
    assert_ptr_equal(b, flm_kernels_best()); /* cached */
    /* the best table: the CPU's level, or FLASHLM_KERNELS's (FLM_KERNELS when unset) capped at it */
    const char *env = getenv("FLASHLM_KERNELS");
    if (!env) env = getenv("FLM_KERNELS");
    const int want = flm_kernel_level_parse(env);
    const flm_kernel_level cpu = flm_kernels_cpu_level();
    assert_ptr_equal(b, flm_kernels_for_level(flm_kernels_level_capped(want >= 0 ? (flm_kernel_level)want
                                                                                 : FLM_KERNELS_N_LEVELS)));
    assert_int_equal(flm_kernels_level_capped(FLM_KERNELS_N_LEVELS), cpu);
    assert_int_equal(flm_kernels_level_capped(FLM_KERNELS_SCALAR), FLM_KERNELS_SCALAR);
    print_message("kernel levels: this CPU's best is %s; the best table is %s\n", flm_kernel_level_name(cpu), b->name);
    /* levels: names round-trip; every level up to the CPU's exists (avxvnni where cpuid has it) and is named for its
     * level, none above; asking for a level gives the highest one the CPU has at or below it */
    for (int l = 0; l < FLM_KERNELS_N_LEVELS; l++) {
        assert_int_equal(flm_kernel_level_parse(flm_kernel_level_name((flm_kernel_level)l)), l);
        const flm_kernels *t = flm_kernels_for_level((flm_kernel_level)l);
        const bool has = flm_kernels_has_level((flm_kernel_level)l);
        /* a level of another instruction set than the CPU's best (x86 levels on Arm, Arm levels on x86) never */
        const bool same_isa = strcmp(flm_kernel_level_isa((flm_kernel_level)l), "any") == 0 ||
                              strcmp(flm_kernel_level_isa((flm_kernel_level)l), flm_kernel_level_isa(cpu)) == 0;
        if (l != FLM_KERNELS_AVXVNNI) assert_int_equal(has, (flm_kernel_level)l <= cpu && same_isa);
        const flm_kernel_level c = flm_kernels_level_capped((flm_kernel_level)l);
        assert_true(c <= (flm_kernel_level)l && flm_kernels_has_level(c));
        if (has) assert_int_equal(c, l);
        if (has) {
            assert_non_null(t);
            assert_string_equal(t->name, flm_kernel_level_name((flm_kernel_level)l));
            assert_ptr_equal(t, flm_kernels_for_level((flm_kernel_level)l)); /* built once */
        } else {
            assert_null(t);
        }
    }
    assert_int_equal(flm_kernel_level_parse("AVX2"), -1);
    assert_int_equal(flm_kernel_level_parse(""), -1);
    assert_int_equal(flm_kernel_level_parse(NULL), -1);
    assert_string_equal(flm_kernel_level_isa(FLM_KERNELS_SCALAR), "any");
    assert_string_equal(flm_kernel_level_isa(FLM_KERNELS_AVX2), "x86-64");
    assert_string_equal(flm_kernel_level_isa(FLM_KERNELS_NEON), "aarch64");
    assert_null(flm_kernel_level_isa(FLM_KERNELS_N_LEVELS));
    /* the Arm levels: dotprod is neon's table with SDOT int8 dot products (quants_dotprod.c), the rest neon's */
    const flm_kernels *ne = flm_kernels_for_level(FLM_KERNELS_NEON), *dp = flm_kernels_for_level(FLM_KERNELS_DOTPROD);
    if (ne) {
        assert_true(ne->vec_dot[FLM_TYPE_Q4_K] != s->vec_dot[FLM_TYPE_Q4_K]);
        assert_true(ne->attn_scores_f16 != s->attn_scores_f16 && ne->act != s->act);
    }
    if (dp) {
        assert_non_null(ne);
        static const uint32_t int8[] = {FLM_TYPE_Q8_0, FLM_TYPE_Q4_0, FLM_TYPE_Q4_1, FLM_TYPE_Q5_0, FLM_TYPE_Q5_1,
                                        FLM_TYPE_Q2_K, FLM_TYPE_Q3_K, FLM_TYPE_Q4_K, FLM_TYPE_Q5_K, FLM_TYPE_Q6_K};
        for (size_t i = 0; i < sizeof int8 / sizeof int8[0]; i++) assert_true(dp->vec_dot[int8[i]] != ne->vec_dot[int8[i]]);
        assert_true(dp->vec_dot[FLM_TYPE_F16] == ne->vec_dot[FLM_TYPE_F16] && dp->act == ne->act);
    }
    assert_null(flm_kernel_level_name(FLM_KERNELS_N_LEVELS));
    assert_null(flm_kernels_for_level(FLM_KERNELS_N_LEVELS));
    assert_ptr_equal(flm_kernels_for_level(FLM_KERNELS_SCALAR), s);
    assert_ptr_equal(flm_kernels_for_level(FLM_KERNELS_AVX2), a);
    /* each level above avx2 overrides q6_k's int8 dot product (and keeps the rest: quants_x512.h says why) */
    static const uint32_t wide[] = {FLM_TYPE_Q6_K};
    for (int l = FLM_KERNELS_AVX512; l <= FLM_KERNELS_VNNI; l++) {
        const flm_kernels *t = flm_kernels_for_level((flm_kernel_level)l),
                          *below = flm_kernels_for_level(l == FLM_KERNELS_AVX512 ? FLM_KERNELS_AVX2 : l - 1); /* base */
        if (!t) continue;
        for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++) assert_true(t->vec_dot[wide[i]] != below->vec_dot[wide[i]]);
        assert_true(t->vec_dot[FLM_TYPE_Q5_K] == below->vec_dot[FLM_TYPE_Q5_K]); /* the level below's */
        assert_true(t->vec_dot[FLM_TYPE_Q4_1] == below->vec_dot[FLM_TYPE_Q4_1]);
        /* q4_k: vnni has its own (one float step per super-block, the order of its row panels); avx512 avx2's */
        if (l == FLM_KERNELS_VNNI) assert_true(t->vec_dot[FLM_TYPE_Q4_K] != below->vec_dot[FLM_TYPE_Q4_K]);
        else assert_true(t->vec_dot[FLM_TYPE_Q4_K] == below->vec_dot[FLM_TYPE_Q4_K]);
        assert_true(t->vec_dot[FLM_TYPE_Q8_0] == below->vec_dot[FLM_TYPE_Q8_0]);
        assert_true(t->dot[FLM_TYPE_Q4_K] == below->dot[FLM_TYPE_Q4_K]);
    }
    /* avxvnni: avx2's int8 dots rebuilt with -mavxvnni (vpdpbusd for q8_0, vpdpwssd for the K-quants' scales:
     * quants_y256.h), the float kernels avx2's */
    const flm_kernels *v = flm_kernels_for_level(FLM_KERNELS_AVXVNNI);
    if (v) {
        static const uint32_t int8[] = {FLM_TYPE_Q8_0, FLM_TYPE_Q4_0, FLM_TYPE_Q4_1, FLM_TYPE_Q5_0, FLM_TYPE_Q5_1,
                                        FLM_TYPE_Q2_K, FLM_TYPE_Q3_K, FLM_TYPE_Q4_K, FLM_TYPE_Q5_K, FLM_TYPE_Q6_K};
        for (size_t i = 0; i < sizeof int8 / sizeof int8[0]; i++) assert_true(v->vec_dot[int8[i]] != a->vec_dot[int8[i]]);
        assert_true(v->dot[FLM_TYPE_Q4_K] != NULL && v->vec_dot[FLM_TYPE_F16] == a->vec_dot[FLM_TYPE_F16]);
        assert_true(v->attn_scores_f16 == a->attn_scores_f16 && v->act == a->act);
    } else {
        print_message("avxvnni: this CPU lacks AVX-VNNI\n");
    }
    if (a) assert_string_equal(a->name, "avx2");
    else print_message("avx2 kernels unavailable on this build/CPU\n");
    const flm_kernels *tabs[FLM_KERNELS_N_LEVELS];
    for (int l = 0; l < FLM_KERNELS_N_LEVELS; l++) tabs[l] = flm_kernels_for_level((flm_kernel_level)l);
    for (int k = 0; k < FLM_KERNELS_N_LEVELS; k++) {
        if (!tabs[k]) continue;
        assert_non_null(tabs[k]->attn_scores_f16);
        assert_non_null(tabs[k]->attn_values_f16);
        for (uint32_t at = FLM_TYPE_Q8_0; at <= FLM_TYPE_Q8_K; at++)
            if (at == FLM_TYPE_Q8_0 || at == FLM_TYPE_Q8_1 || at == FLM_TYPE_Q8_K) assert_non_null(tabs[k]->act_quantize[at]);
        for (size_t i = 0; i < N_TYPES; i++) assert_true(flm_type_supported(all_types[i]));
        /* every supported type has every kernel (a SIMD table falls back to scalar, never NULL); unknown ids none */
        for (uint32_t t = 0; t < FLM_N_TYPES; t++) {
            if (flm_type_supported(t)) {
                assert_non_null(tabs[k]->dot[t]);
                assert_non_null(tabs[k]->axpy[t]);
                assert_non_null(tabs[k]->dequant[t]);
                assert_non_null(tabs[k]->vec_dot[t]);
            } else if (!flm_type_traits_of(t)) {
                assert_null(tabs[k]->dot[t]);
                assert_null(tabs[k]->vec_dot[t]);
            }
        }
        assert_null(tabs[k]->dot[4]);  /* removed from ggml (q4_2) */
        assert_null(tabs[k]->dot[29]); /* unknown */
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * SIMD against scalar
 * ------------------------------------------------------------------------------------------------------------- */
static void test_simd_vs_scalar(void **state) {
    (void)state;
    const flm_kernels *s = flm_kernels_scalar(), *a = flm_kernels_avx2();
    if (!a) {
        print_message("skipped: avx2 kernels unavailable on this build/CPU\n");
        skip();
    }
    uint64_t rng = 12345;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t t = all_types[ti];
        const size_t *lens;
        size_t nl;
        lens_for(t, &lens, &nl);
        for (size_t li = 0; li < nl; li++) {
            size_t n = lens[li];
            for (int rep = 0; rep < 3; rep++) {
                void *rb, *xb, *yb;
                const void *row = rand_row(t, n, &rng, &rb);
                const float *x = rand_vec(n, &rng, 1.0f, &xb);
                float *deq_s = malloc((n + 1) * sizeof(float)), *deq_a = malloc((n + 1) * sizeof(float));
                assert_non_null(deq_s);
                assert_non_null(deq_a);

                /* dequant: every conversion is exact, so the two must agree bit for bit */
                s->dequant[t](row, deq_s, n);
                a->dequant[t](row, deq_a, n);
                if (n && memcmp(deq_s, deq_a, n * sizeof(float)) != 0)
                    fail_msg("dequant %s n=%zu: avx2 differs from scalar", flm_type_name(t), n);

                /* dot: within float rounding of sum |row_i * x_i|; both near a double-precision reference */
                double scale = 0.0, ref = 0.0;
                for (size_t i = 0; i < n; i++) {
                    scale += fabs((double)deq_s[i] * x[i]);
                    ref += (double)deq_s[i] * x[i];
                }
                float ds = s->dot[t](row, x, n), da = a->dot[t](row, x, n);
                double tol = 1e-5 * scale + 1e-30;
                if (fabs((double)ds - da) > tol || fabs(ds - ref) > tol || fabs(da - ref) > tol)
                    fail_msg("dot %s n=%zu: scalar %.9g avx2 %.9g double %.9g (tol %.3g)", flm_type_name(t), n, ds,
                             da, ref, tol);

                /* axpy: one rounding apart (fma vs mul+add) per element */
                float *y0 = rand_vec(n, &rng, 3.0f, &yb);
                float *ys = malloc((n + 1) * sizeof(float)), *ya = malloc((n + 1) * sizeof(float));
                assert_non_null(ys);
                assert_non_null(ya);
                memcpy(ys, y0, n * sizeof(float));
                memcpy(ya, y0, n * sizeof(float));
                float alpha = tu_rand_f32(&rng) * 4.0f;
                s->axpy[t](row, alpha, ys, n);
                a->axpy[t](row, alpha, ya, n);
                for (size_t i = 0; i < n; i++) {
                    double want = (double)y0[i] + (double)alpha * deq_s[i];
                    double etol = 1e-6 * (fabs(y0[i]) + fabs((double)alpha * deq_s[i])) + 1e-30;
                    if (fabs((double)ys[i] - ya[i]) > etol || fabs(ya[i] - want) > etol)
                        fail_msg("axpy %s n=%zu i=%zu: scalar %.9g avx2 %.9g want %.9g", flm_type_name(t), n, i, ys[i],
                                 ya[i], want);
                }
                free(ys);
                free(ya);
                free(yb);
                free(deq_s);
                free(deq_a);
                free(rb);
                free(xb);
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Every kernel level against the scalar reference. Levels are selected with flm_kernels_for_level, the forcing
 * FLASHLM_KERNELS uses; a level this CPU lacks is reported as skipped. On random rows of every type and length:
 *   - dequant: bit for bit the scalar's (every conversion is exact);
 *   - act_quantize (q8_0, q8_1, q8_k): the whole activation buffer (blocks and float/int tails), byte for byte;
 *   - vec_dot (int8 products, then the float scales): within 2e-6 * sum |w_i * xq_i| of the scalar (the integer
 *     sums are exact at every level; only the float accumulation order differs), and, at the levels above avx2, bit
 *     for bit the avx2 kernel's float (they form the same integer sums and then the same float operations, so any
 *     error in the integer part shows as a difference);
 *   - dot (float x) within 1e-5 * sum |w_i * x_i|, axpy within 1e-6 per element (fma against mul + add);
 *   - attention over an f16 cache: bit for bit (kernels.h orders every sum);
 *   - the FFN activation (check_act) and the f16 rounding and conversion (check_round_f16).
 * ------------------------------------------------------------------------------------------------------------- */
/* A float for the activation tests: mostly "ordinary" pre-activations (uniform in [-12, 12]), then any magnitude
 * from 1e-40 (subnormal) to 1e38 of either sign, and now and then a special value. */
static float act_input(uint64_t *rng) {
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.0f, -88.0f, 88.5f, -88.5f, 87.0f,
                                    -87.0f, 100.0f, -100.0f, 1e-45f, -1e-45f, 1.17549435e-38f, -4.9f, -5.2f, 3e19f,
                                    -3e19f, 3.4028235e38f, -3.4028235e38f};
    const uint64_t r = tu_rand_u64(rng);
    switch (r % 16) {
    case 0: return special[(r >> 8) % (sizeof special / sizeof special[0])];
    case 1: case 2: case 3: {
        const float mag = powf(10.0f, tu_rand_f32(rng) * 39.0f), v = mag < 1e-40f ? 1e-40f : mag;
        return (r >> 8) & 1 ? -v : v;
    }
    default: return tu_rand_f32(rng) * 12.0f;
    }
}

/* k's act against the scalar reference (kernels.h flm_act_fn), gated (u) and not, at lengths that exercise the
 * tails, in place and not: ReLU, squared ReLU and erf-GELU bit for bit; SiLU and tanh-GELU within
 * 1e-5 |ref| + 1e-7 |x| |u| (the absolute part covers the reference's own cancellation in 1 + tanh for x < -3 and the
 * tiny tails the two round differently), the same class for NaN and infinities. Returns the largest relative
 * error of SiLU / tanh-GELU seen outside those tails (where |ref| >= |x| |u| / 10 and > 1e-30). */
static double check_act(const flm_kernels *k, uint64_t *rng) {
    const flm_kernels *s = flm_kernels_scalar();
    static const size_t lens[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 1000, 4099};
    enum { MAXN = 4099 };
    float *x = malloc(MAXN * sizeof(float)), *u = malloc(MAXN * sizeof(float)), *ys = malloc(MAXN * sizeof(float)),
          *yk = malloc(MAXN * sizeof(float));
    assert_true(x && u && ys && yk);
    double worst = 0.0;
    for (int a = 0; a <= FLM_ACT_RELU2; a++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (int gated = 0; gated < 2; gated++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    const size_t n = lens[li];
                    for (size_t i = 0; i < n; i++) {
                        x[i] = act_input(rng);
                        u[i] = tu_rand_f32(rng) * 2.0f;
                    }
                    s->act((flm_act)a, ys, x, gated ? u : NULL, n);
                    if (inplace) {
                        memcpy(yk, x, n * sizeof(float));
                        k->act((flm_act)a, yk, yk, gated ? u : NULL, n);
                    } else {
                        k->act((flm_act)a, yk, x, gated ? u : NULL, n);
                    }
                    const bool exact = a != FLM_ACT_SILU && a != FLM_ACT_GELU_TANH;
                    for (size_t i = 0; i < n; i++) {
                        const double r = ys[i], g = yk[i], uu = gated ? fabs((double)u[i]) : 1.0;
                        bool ok;
                        if (exact) ok = f32_bits(ys[i]) == f32_bits(yk[i]);
                        else if (isnan(r) || isinf(r)) ok = isnan(r) ? isnan(g) : r == g;
                        else ok = isfinite(g) && fabs(r - g) <= 1e-5 * fabs(r) + 1e-7 * fabs((double)x[i]) * uu;
                        if (!ok)
                            fail_msg("%s: act %s%s n=%zu i=%zu x=%.9g u=%.9g: %.9g, scalar %.9g", k->name,
                                     flm_act_name((flm_act)a), gated ? " gated" : "", n, i, (double)x[i],
                                     gated ? (double)u[i] : 1.0, g, r);
                        if (!exact && isfinite(r) && fabs(r) > 1e-30 && fabs(r) >= 0.1 * fabs((double)x[i]) * uu &&
                            fabs(r - g) / fabs(r) > worst)
                            worst = fabs(r - g) / fabs(r);
                    }
                }
    free(x);
    free(u);
    free(ys);
    free(yk);
    return worst;
}

/* k's round_f16 bit for bit against flm_f16_to_f32(flm_f32_to_f16(x)), and its to_f16 against flm_f32_to_f16(x):
 * random bit patterns (every class: NaN with payloads, infinities, subnormals), values across the half range and its
 * edges (65504, 65520 and up: inf; half subnormals and the ties at 2^-25), in place and not, at lengths with tails. */
static void check_round_f16(const flm_kernels *k, uint64_t *rng) {
    static const uint32_t edges[] = {0x477fe000u, 0x477fefffu, 0x477ff000u, 0x47800000u, 0x33000000u, 0x33000001u,
                                     0x33800000u, 0x33c00000u, 0x387fe000u, 0x387ff000u, 0x38800000u, 0x00000001u,
                                     0x807fffffu, 0x7f800001u, 0xffc00000u, 0x7fbfffffu, 0x80000000u, 0x3f801000u,
                                     0x3f803000u};
    enum { MAXN = 1031 };
    float *x = malloc(MAXN * sizeof(float)), *y = malloc(MAXN * sizeof(float));
    uint16_t *hv = malloc((MAXN + 1) * sizeof(uint16_t));
    assert_true(x && y && hv);
    size_t n_checked = 0;
    for (int rep = 0; rep < 64; rep++) {
        const size_t n = rep % 4 == 3 ? MAXN : 1 + (size_t)rep % 19;
        for (size_t i = 0; i < n; i++) {
            const uint64_t r = tu_rand_u64(rng);
            uint32_t b;
            switch (r % 4) {
            case 0: b = (uint32_t)(r >> 32); break;                                            /* any pattern */
            case 1: b = edges[(r >> 8) % (sizeof edges / sizeof edges[0])] + (uint32_t)((r >> 16) % 3) - 1; break;
            default: b = (uint32_t)((r >> 32) & 0x807fffffu) | (uint32_t)(97 + (r >> 8) % 48) << 23; /* 2^-30..2^17 */
            }
            x[i] = bits_f32(b);
        }
        const bool inplace = rep & 1;
        if (inplace) memcpy(y, x, n * sizeof(float));
        k->round_f16(y, inplace ? y : x, n);
        hv[n] = 0xbeefu; /* to_f16 writes n halves, not one more */
        k->to_f16(hv, x, n);
        for (size_t i = 0; i < n; i++) {
            const float want = flm_f16_to_f32(flm_f32_to_f16(x[i]));
            if (f32_bits(want) != f32_bits(y[i]))
                fail_msg("%s: round_f16(%08x) = %08x, scalar %08x (n=%zu i=%zu)", k->name, f32_bits(x[i]),
                         f32_bits(y[i]), f32_bits(want), n, i);
            if (hv[i] != flm_f32_to_f16(x[i]))
                fail_msg("%s: to_f16(%08x) = %04x, scalar %04x (n=%zu i=%zu)", k->name, f32_bits(x[i]), hv[i],
                         flm_f32_to_f16(x[i]), n, i);
        }
        assert_int_equal(hv[n], 0xbeefu);
        n_checked += n;
    }
    assert_true(n_checked > 10000);
    free(x);
    free(y);
    free(hv);
}

static void check_level(flm_kernel_level L) {
    const flm_kernels *k = flm_kernels_for_level(L), *s = flm_kernels_scalar();
    const flm_kernels *a2 = flm_kernels_for_level(FLM_KERNELS_AVX2);
    if (!k) {
        print_message("skipped: this CPU lacks the %s kernel level (its best: %s)\n", flm_kernel_level_name(L),
                      flm_kernel_level_name(flm_kernels_cpu_level()));
        skip();
    }
    assert_string_equal(k->name, flm_kernel_level_name(L));
    uint64_t rng = 4242 + (uint64_t)L;
    size_t n_vdot = 0, n_bitsame = 0;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = all_types[ti], at = flm_type_traits_of(t)->vec_dot_type;
        const size_t *lens;
        size_t nl;
        lens_for(t, &lens, &nl);
        for (size_t li = 0; li < nl; li++) {
            const size_t n = lens[li];
            if (n == 0) continue;
            for (int rep = 0; rep < 4; rep++) {
                void *rb, *xb, *yb;
                const void *row = rand_row(t, n, &rng, &rb);
                const float *x = rand_vec(n, &rng, rep == 3 ? 100.0f : 1.0f, &xb);
                float *deq_s = malloc(n * sizeof(float)), *deq_k = malloc(n * sizeof(float));
                assert_true(deq_s && deq_k);
                s->dequant[t](row, deq_s, n);
                k->dequant[t](row, deq_k, n);
                if (memcmp(deq_s, deq_k, n * sizeof(float)) != 0)
                    fail_msg("%s: dequant %s n=%zu differs from scalar", k->name, flm_type_name(t), n);
                double scale = 0.0, ref = 0.0;
                for (size_t i = 0; i < n; i++) {
                    scale += fabs((double)deq_s[i] * x[i]);
                    ref += (double)deq_s[i] * x[i];
                }
                const float ds = s->dot[t](row, x, n), dk = k->dot[t](row, x, n);
                const double tol = 1e-5 * scale + 1e-30;
                if (fabs((double)ds - dk) > tol || fabs(dk - ref) > tol)
                    fail_msg("%s: dot %s n=%zu: %.9g, scalar %.9g, double %.9g (tol %.3g)", k->name, flm_type_name(t),
                             n, dk, ds, ref, tol);
                /* vec_dot against x quantized by the scalar reference (and the level's quantizer: same bytes) */
                const size_t ab = flm_act_bytes(t, n);
                uint8_t *xq = malloc(ab + 1), *xk = malloc(ab + 1);
                assert_true(xq && xk);
                if (at == FLM_TYPE_F32) {
                    memcpy(xq, x, n * sizeof(float));
                } else {
                    memset(xq, 0x5a, ab);
                    memset(xk, 0xa5, ab);
                    s->act_quantize[at](x, xq, n);
                    k->act_quantize[at](x, xk, n);
                    if (memcmp(xq, xk, ab) != 0)
                        fail_msg("%s: act_quantize %s n=%zu differs from scalar", k->name, flm_type_name(at), n);
                }
                double mag_q = 0.0;
                if (at == FLM_TYPE_F32) {
                    mag_q = scale;
                } else {
                    float *xd = malloc(n * sizeof(float));
                    assert_non_null(xd);
                    s->dequant[at](xq, xd, n);
                    for (size_t i = 0; i < n; i++) mag_q += fabs((double)deq_s[i] * xd[i]);
                    if (at == FLM_TYPE_Q8_1) { /* q4_1/q5_1 also add m * s per block */
                        const size_t wb = flm_type_block_bytes(t);
                        for (size_t b = 0; b < n / 32; b++) {
                            uint16_t m, sv;
                            memcpy(&m, (const uint8_t *)row + b * wb + 2, 2);
                            memcpy(&sv, xq + b * sizeof(flm_block_q8_1) + 2, 2);
                            mag_q += fabs((double)flm_f16_to_f32(m) * flm_f16_to_f32(sv));
                        }
                    }
                    free(xd);
                }
                const float vs = s->vec_dot[t](row, xq, n), vk = k->vec_dot[t](row, xq, n);
                const double vtol = (at == FLM_TYPE_F32 ? 1e-5 : 2e-6) * mag_q + 1e-30;
                if (!(fabs((double)vs - vk) <= vtol))
                    fail_msg("%s: vec_dot %s n=%zu: %.9g, scalar %.9g (tol %.3g)", k->name, flm_type_name(t), n, vk,
                             vs, vtol);
                n_vdot++;
                /* the same bits as avx2 where a level keeps avx2's float order (all but vnni's q4_k and q6_k, whose
                 * float order is their panels': quants_panel_vnni.h; they are checked against scalar above) */
                /* the Arm levels: the scalar reference's bits (quants_neon.h: its integer sums, then its float
                 * operations in its order) */
                if ((L == FLM_KERNELS_NEON || L == FLM_KERNELS_DOTPROD) && at != FLM_TYPE_F32) {
                    if (memcmp(&vs, &vk, sizeof vs) != 0)
                        fail_msg("%s: vec_dot %s n=%zu: %.9g, scalar %.9g: not the same bits", k->name,
                                 flm_type_name(t), n, vk, vs);
                    n_bitsame++;
                }
                if (L > FLM_KERNELS_AVX2 && L <= FLM_KERNELS_VNNI && at != FLM_TYPE_F32 &&
                    !(L == FLM_KERNELS_VNNI && (t == FLM_TYPE_Q4_K || t == FLM_TYPE_Q6_K))) {
                    const float va = a2->vec_dot[t](row, xq, n);
                    if (memcmp(&va, &vk, sizeof va) != 0)
                        fail_msg("%s: vec_dot %s n=%zu: %.9g, avx2 %.9g: not the same bits", k->name,
                                 flm_type_name(t), n, vk, va);
                    n_bitsame++;
                }
                free(xq);
                free(xk);
                /* axpy: one rounding apart (fma vs mul+add) per element */
                float *y0 = rand_vec(n, &rng, 3.0f, &yb);
                float *ys = malloc(n * sizeof(float)), *yk = malloc(n * sizeof(float));
                assert_true(ys && yk);
                memcpy(ys, y0, n * sizeof(float));
                memcpy(yk, y0, n * sizeof(float));
                const float alpha = tu_rand_f32(&rng) * 4.0f;
                s->axpy[t](row, alpha, ys, n);
                k->axpy[t](row, alpha, yk, n);
                for (size_t i = 0; i < n; i++) {
                    const double etol = 1e-6 * (fabs(y0[i]) + fabs((double)alpha * deq_s[i])) + 1e-30;
                    if (fabs((double)ys[i] - yk[i]) > etol)
                        fail_msg("%s: axpy %s n=%zu i=%zu: %.9g, scalar %.9g", k->name, flm_type_name(t), n, i, yk[i],
                                 ys[i]);
                }
                free(ys);
                free(yk);
                free(yb);
                free(deq_s);
                free(deq_k);
                free(rb);
                free(xb);
            }
        }
    }
    /* attention over an f16 cache: the same bits as the scalar loops */
    static const size_t ds_[] = {5, 64, 80, 128}, ns_[] = {1, 7, 9, 33};
    for (size_t di = 0; di < 4; di++)
        for (size_t ni = 0; ni < 4; ni++) {
            const size_t d = ds_[di], nn = ns_[ni], stride = d + 3;
            uint16_t *K = malloc(nn * stride * sizeof *K);
            float *q = malloc(d * sizeof *q), *w = malloc(nn * sizeof *w);
            float *o_s = malloc((nn > d ? nn : d) * sizeof(float)), *o_k = malloc((nn > d ? nn : d) * sizeof(float));
            assert_true(K && q && w && o_s && o_k);
            for (size_t i = 0; i < nn * stride; i++) K[i] = flm_f32_to_f16(tu_rand_f32(&rng) * 2.0f);
            for (size_t i = 0; i < d; i++) q[i] = tu_rand_f32(&rng);
            for (size_t i = 0; i < nn; i++) w[i] = tu_rand_f32(&rng);
            s->attn_scores_f16(q, K, stride, nn, d, 0.125f, o_s);
            k->attn_scores_f16(q, K, stride, nn, d, 0.125f, o_k);
            if (memcmp(o_s, o_k, nn * sizeof(float)) != 0) fail_msg("%s: attn_scores_f16 d=%zu n=%zu", k->name, d, nn);
            s->attn_values_f16(w, K, stride, nn, d, o_s);
            k->attn_values_f16(w, K, stride, nn, d, o_k);
            if (memcmp(o_s, o_k, d * sizeof(float)) != 0) fail_msg("%s: attn_values_f16 d=%zu n=%zu", k->name, d, nn);
            free(K);
            free(q);
            free(w);
            free(o_s);
            free(o_k);
        }
    const double act_worst = check_act(k, &rng);
    check_round_f16(k, &rng);
    print_message("%s: %zu vec_dots within float rounding of scalar, %zu of them bit for bit the %s kernel's; act: "
                  "SiLU / tanh-GELU within %.2g relative of scalar where |act(x)| >= |x| / 10, ReLU / ReLU2 / "
                  "erf-GELU, round_f16 and to_f16 bit for bit\n",
                  k->name, n_vdot, n_bitsame, L >= FLM_KERNELS_NEON ? "scalar" : "avx2", act_worst);
}

static void test_level_avx2(void **state) {
    (void)state;
    check_level(FLM_KERNELS_AVX2);
}
static void test_level_avxvnni(void **state) {
    (void)state;
    check_level(FLM_KERNELS_AVXVNNI);
}
static void test_level_avx512(void **state) {
    (void)state;
    check_level(FLM_KERNELS_AVX512);
}
static void test_level_vnni(void **state) {
    (void)state;
    check_level(FLM_KERNELS_VNNI);
}
static void test_level_neon(void **state) {
    (void)state;
    check_level(FLM_KERNELS_NEON);
}
static void test_level_dotprod(void **state) {
    (void)state;
    check_level(FLM_KERNELS_DOTPROD);
}

/* Every f16 bit pattern through both dequant tables (the scalar bit-twiddling against F16C). */
static void test_f16_dequant_all_patterns(void **state) {
    (void)state;
    const flm_kernels *s = flm_kernels_scalar(), *a = flm_kernels_avx2();
    uint16_t *h = malloc(65536 * sizeof *h);
    float *fs = malloc(65536 * sizeof *fs), *fa = malloc(65536 * sizeof *fa);
    assert_non_null(h);
    assert_non_null(fs);
    assert_non_null(fa);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    s->dequant[FLM_TYPE_F16](h, fs, 65536);
    for (uint32_t i = 0; i < 65536; i++) assert_true(f32_bits(fs[i]) == f32_bits(flm_f16_to_f32((uint16_t)i)));
    if (a) {
        a->dequant[FLM_TYPE_F16](h, fa, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            if (f16_is_nan((uint16_t)i)) assert_true(isnan(fs[i]) && isnan(fa[i]));
            else if (f32_bits(fs[i]) != f32_bits(fa[i])) fail_msg("f16 %04x: scalar %g avx2 %g", i, fs[i], fa[i]);
        }
    }
    free(h);
    free(fs);
    free(fa);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Conversions
 * ------------------------------------------------------------------------------------------------------------- */
static void test_f16_specials(void **state) {
    (void)state;
    static const struct { float f; uint16_t h; } cases[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {65504.0f, 0x7bff},          /* largest half */
        {65519.99f, 0x7bff},         /* just below the tie */
        {65520.0f, 0x7c00},          /* tie between 65504 and 65536: 0x7bff is odd, rounds up to inf */
        {1e5f, 0x7c00},              /* overflow */
        {-1e5f, 0xfc00},
        {0x1p-14f, 0x0400},          /* smallest normal, 6.1035e-5 */
        {6.1e-5f, 0x03ff},           /* just below: the largest subnormal */
        {0x1p-24f, 0x0001},          /* smallest subnormal, 5.96e-8 */
        {5.96e-8f, 0x0001},
        {0x1p-25f, 0x0000},          /* tie between 0 and 2^-24: to even, 0 */
        {0x1.000002p-25f, 0x0001},   /* just above that tie */
        {0x1.8p-24f, 0x0002},        /* 1.5 units: tie, to even 2 */
        {0x1.4p-23f, 0x0002},        /* 2.5 units: tie, to even 2 */
        {1e-8f, 0x0000},
        {-1e-8f, 0x8000},
        {1.0f / 3.0f, 0x3555},
        {1.00048828125f, 0x3c00},    /* 1 + 2^-11: tie, to even 1.0 */
        {1.00146484375f, 0x3c02},    /* 1 + 3*2^-11: tie, to even */
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t h = flm_f32_to_f16(cases[i].f);
        if (h != cases[i].h) fail_msg("f32_to_f16(%a) = %04x, want %04x", (double)cases[i].f, h, cases[i].h);
    }
    assert_true(flm_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(flm_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(flm_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    assert_true(flm_f16_to_f32(0x3555) == 0.333251953125f);
    assert_true(f32_bits(flm_f16_to_f32(0x8000)) == 0x80000000u);
    assert_true(isinf(flm_f16_to_f32(0x7c00)) && flm_f16_to_f32(0x7c00) > 0);
    assert_true(isinf(flm_f16_to_f32(0xfc00)) && flm_f16_to_f32(0xfc00) < 0);
    assert_true(f16_is_nan(flm_f32_to_f16(NAN)));
    assert_true(f16_is_nan(flm_f32_to_f16(-NAN)));
    assert_true(f16_is_nan(flm_f32_to_f16(bits_f32(0x7f800001u)))); /* nan with only low payload bits */
    assert_true(isnan(flm_f16_to_f32(0x7e00)));
    assert_true(isnan(flm_f16_to_f32(0x7c01)));
}

static void test_f16_all_round_trip(void **state) {
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = flm_f16_to_f32(h);
        uint16_t back = flm_f32_to_f16(f);
        if (f16_is_nan(h)) {
            assert_true(isnan(f));
            assert_true(f16_is_nan(back));
        } else if (back != h) {
            fail_msg("f16 %04x -> %a -> %04x", h, (double)f, back);
        }
    }
    /* Ties and their neighbours: the midpoint of two adjacent finite halves rounds to the even one. */
    for (uint32_t i = 0; i < 0x7bff; i++) {
        float lo = flm_f16_to_f32((uint16_t)i), hi = flm_f16_to_f32((uint16_t)(i + 1));
        float mid = (lo + hi) * 0.5f; /* exact: 12 significant bits */
        uint16_t even = (i & 1) ? (uint16_t)(i + 1) : (uint16_t)i;
        assert_true(flm_f32_to_f16(mid) == even);
        assert_true(flm_f32_to_f16(-mid) == (uint16_t)(even | 0x8000));
        assert_true(flm_f32_to_f16(nextafterf(mid, 0.0f)) == i);
        assert_true(flm_f32_to_f16(nextafterf(mid, INFINITY)) == i + 1);
    }
}

#ifdef TEST_HAVE_F16C_HW
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

/* flm_f32_to_f16 against vcvtps2ph on a million float bit patterns spread over the whole range (nan included). */
static void test_f16_vs_hardware(void **state) {
    (void)state;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("f16c")) {
        print_message("skipped: no F16C\n");
        skip();
    }
    uint64_t rng = 99;
    for (uint64_t k = 0; k < (1u << 20); k++) {
        uint32_t u = (k & 1) ? (uint32_t)tu_rand_u64(&rng) : (uint32_t)(k * 4093u);
        float f = bits_f32(u);
        uint16_t mine = flm_f32_to_f16(f), hw = hw_f32_to_f16(f);
        if (mine != hw) fail_msg("f32_to_f16(%08x): %04x, hardware %04x", u, mine, hw);
    }
}
#endif

static void test_bf16(void **state) {
    (void)state;
    static const struct { uint32_t f; uint16_t h; } cases[] = {
        {0x00000000u, 0x0000}, /* 0 */
        {0x80000000u, 0x8000}, /* -0 */
        {0x3f800000u, 0x3f80}, /* 1 */
        {0x3eaaaaabu, 0x3eab}, /* 1/3 rounds up */
        {0x3f808000u, 0x3f80}, /* tie, even stays */
        {0x3f818000u, 0x3f82}, /* tie, odd rounds up */
        {0x3f807fffu, 0x3f80}, /* below tie */
        {0x3f808001u, 0x3f81}, /* above tie */
        {0x7f800000u, 0x7f80}, /* inf */
        {0xff800000u, 0xff80}, /* -inf */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to inf */
        {0x00000001u, 0x0000}, /* smallest subnormal rounds to 0 */
        {0x00008000u, 0x0000}, /* tie at zero */
        {0x00018000u, 0x0002}, /* subnormal tie, odd rounds up */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t h = flm_f32_to_bf16(bits_f32(cases[i].f));
        if (h != cases[i].h) fail_msg("f32_to_bf16(%08x) = %04x, want %04x", cases[i].f, h, cases[i].h);
    }
    assert_true(bf16_is_nan(flm_f32_to_bf16(NAN)));
    assert_true(bf16_is_nan(flm_f32_to_bf16(bits_f32(0x7f800001u)))); /* would round to inf without the nan case */
    assert_true(bf16_is_nan(flm_f32_to_bf16(bits_f32(0xffffffffu)))); /* would carry past the sign */
    assert_true(flm_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(flm_bf16_to_f32(0xc040) == -3.0f);
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = flm_bf16_to_f32(h);
        uint16_t back = flm_f32_to_bf16(f);
        if (bf16_is_nan(h)) {
            assert_true(isnan(f));
            assert_true(bf16_is_nan(back));
        } else if (back != h) {
            fail_msg("bf16 %04x -> %a -> %04x", h, (double)f, back);
        }
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Quantizers
 * ------------------------------------------------------------------------------------------------------------- */
/* Random blocks with varied scales, and a few special ones (all zero, a single spike, all equal). */
static void fill_quant_input(float *x, size_t n, uint64_t *rng) {
    for (size_t b = 0; b < n / FLM_QK; b++) {
        float *xb = x + b * FLM_QK;
        float scale = powf(10.0f, (float)(b % 9) - 4.0f); /* 1e-4 .. 1e4 */
        for (int j = 0; j < FLM_QK; j++) xb[j] = tu_rand_f32(rng) * scale;
        switch (b % 13) {
        case 3: memset(xb, 0, FLM_QK * sizeof(float)); break;
        case 5: memset(xb, 0, FLM_QK * sizeof(float)); xb[7] = -scale; break;
        case 7: for (int j = 0; j < FLM_QK; j++) xb[j] = scale; break;
        case 11: xb[2] = -2.0f * scale; xb[30] = 2.0f * scale; break; /* an exact opposite of the max: clamps */
        default: break;
        }
    }
}

static void test_quantize_q8_0(void **state) {
    (void)state;
    uint64_t rng = 7;
    const size_t n = 32 * 200;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    flm_block_q8_0 *q = malloc(flm_row_bytes(FLM_TYPE_Q8_0, n));
    assert_true(x && y && q);
    fill_quant_input(x, n, &rng);
    flm_quantize_row(FLM_TYPE_Q8_0, x, q, n);
    flm_kernels_scalar()->dequant[FLM_TYPE_Q8_0](q, y, n);
    for (size_t b = 0; b < n / FLM_QK; b++) {
        float amax = 0.0f;
        for (int j = 0; j < FLM_QK; j++) amax = fmaxf(amax, fabsf(x[b * FLM_QK + j]));
        float d = amax / 127.0f;
        assert_true(q[b].d == flm_f32_to_f16(d));
        double d16 = flm_f16_to_f32(q[b].d);
        /* |x - q*d16| <= |x - q*d| + |q|*|d - d16| <= d/2 + 127*|d - d16| (plus float rounding of x/d) */
        double bound = 0.5 * d * (1 + 1e-4) + 127 * fabs(d - d16) + 1e-30;
        for (int j = 0; j < FLM_QK; j++) {
            size_t i = b * FLM_QK + j;
            assert_true(q[b].qs[j] >= -127);
            if (fabs((double)x[i] - y[i]) > bound)
                fail_msg("q8_0 block %zu elem %d: x %g -> %g, bound %g", b, j, x[i], y[i], bound);
        }
    }
    /* a hand-made block: amax 127 gives d = 1, so q = roundf(x) (halves away from zero, as ggml) */
    float hx[32] = {127.0f, -127.0f, 0.4f, -0.6f, 2.5f, -2.5f, 100.49f, -0.5f};
    static const int8_t want[8] = {127, -127, 0, -1, 3, -3, 100, -1};
    flm_block_q8_0 hb;
    flm_quantize_row(FLM_TYPE_Q8_0, hx, &hb, 32);
    assert_int_equal(hb.d, 0x3c00);
    for (int j = 0; j < 32; j++) assert_int_equal(hb.qs[j], j < 8 ? want[j] : 0);
    free(x);
    free(y);
    free(q);
}

static void test_quantize_q4_0(void **state) {
    (void)state;
    uint64_t rng = 8;
    const size_t n = 32 * 200;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    flm_block_q4_0 *q = malloc(flm_row_bytes(FLM_TYPE_Q4_0, n));
    assert_true(x && y && q);
    fill_quant_input(x, n, &rng);
    flm_quantize_row(FLM_TYPE_Q4_0, x, q, n);
    flm_kernels_scalar()->dequant[FLM_TYPE_Q4_0](q, y, n);
    for (size_t b = 0; b < n / FLM_QK; b++) {
        const float *xb = x + b * FLM_QK;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < FLM_QK; j++)
            if (amax < fabsf(xb[j])) amax = fabsf(xb[j]), max = xb[j];
        float d = max / -8.0f;
        assert_true(q[b].d == flm_f32_to_f16(d));
        double d16 = flm_f16_to_f32(q[b].d), ad = fabs(d);
        /* x/d lies in [-8, 8]; q = floor(x/d + 8.5) rounds to the nearest level, error <= |d|/2, except that
         * x/d >= 7.5 (opposite sign to max, |x| >= 15/16 |max|) clamps to q = 15, error up to |d|. The stored d16
         * adds |q - 8| * |d - d16| <= 8 |d - d16|. */
        for (int j = 0; j < FLM_QK; j++) {
            size_t i = b * FLM_QK + j;
            bool clamped = d != 0 && (double)xb[j] / d > 7.5 - 1e-4;
            double bound = (clamped ? ad : 0.5 * ad) * (1 + 1e-4) + 8 * fabs(d - d16) + 1e-30;
            if (fabs((double)xb[j] - y[i]) > bound)
                fail_msg("q4_0 block %zu elem %d: x %g -> %g, bound %g", b, j, xb[j], y[i], bound);
        }
    }
    /* hand-made: max -8 (the first of the +-8 tie) gives d = 1, q = min(15, (int)(x + 8.5)) */
    float hx[32] = {-8.0f, 8.0f, 0.0f, -0.5f, 0.49f, 0.5f, -7.6f};
    hx[16] = 7.4f;
    hx[17] = -3.0f;
    hx[18] = 2.0f;
    flm_block_q4_0 hb;
    flm_quantize_row(FLM_TYPE_Q4_0, hx, &hb, 32);
    assert_int_equal(hb.d, 0x3c00);
    static const uint8_t want[7] = {0xf0, 0x5f, 0xa8, 0x88, 0x88, 0x89, 0x80}; /* low: elem j, high: elem j+16 */
    for (int j = 0; j < 16; j++) assert_int_equal(hb.qs[j], j < 7 ? want[j] : 0x88);
    /* a positive max gives a negative d */
    float px[32] = {16.0f, 2.0f};
    flm_quantize_row(FLM_TYPE_Q4_0, px, &hb, 32);
    assert_true(flm_f16_to_f32(hb.d) == -2.0f);
    assert_int_equal(hb.qs[0], 0x80); /* 16 -> q 0, i.e. (0-8)*-2 = 16 */
    assert_int_equal(hb.qs[1], 0x87); /* 2 -> (int)(-1 + 8.5) = 7 */
    free(x);
    free(y);
    free(q);
}

static void test_quantize_float_types(void **state) {
    (void)state;
    float x[5] = {1.0f, -0.0f, 1.0f / 3.0f, 65520.0f, 1e-30f};
    uint16_t h[5];
    float f[5];
    flm_quantize_row(FLM_TYPE_F16, x, h, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(h[i], flm_f32_to_f16(x[i]));
    flm_quantize_row(FLM_TYPE_BF16, x, h, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(h[i], flm_f32_to_bf16(x[i]));
    flm_quantize_row(FLM_TYPE_F32, x, f, 5);
    assert_memory_equal(f, x, sizeof x);
}

/* Known blocks through dequant and dot of both tables. */
static void test_known_blocks(void **state) {
    (void)state;
    const flm_kernels *tabs[2] = {flm_kernels_scalar(), flm_kernels_avx2()};
    flm_block_q4_0 b4;
    b4.d = 0x3800; /* 0.5 */
    for (int j = 0; j < 16; j++) b4.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    flm_block_q8_0 b8;
    b8.d = 0x3400; /* 0.25 */
    for (int j = 0; j < 32; j++) b8.qs[j] = (int8_t)(j * 8 - 128);
    float ones[32], y[32];
    for (int j = 0; j < 32; j++) ones[j] = 1.0f;
    for (int k = 0; k < 2; k++) {
        const flm_kernels *t = tabs[k];
        if (!t) continue;
        t->dequant[FLM_TYPE_Q4_0](&b4, y, 32);
        double sum4 = 0;
        for (int j = 0; j < 16; j++) {
            assert_true(y[j] == 0.5f * (float)(j - 8));
            assert_true(y[j + 16] == 0.5f * (float)(7 - j));
            sum4 += y[j] + y[j + 16];
        }
        assert_true(t->dot[FLM_TYPE_Q4_0](&b4, ones, 32) == (float)sum4); /* -4: small integers, exact */
        t->dequant[FLM_TYPE_Q8_0](&b8, y, 32);
        double sum8 = 0;
        for (int j = 0; j < 32; j++) {
            assert_true(y[j] == 0.25f * (float)(j * 8 - 128));
            sum8 += y[j];
        }
        assert_true(t->dot[FLM_TYPE_Q8_0](&b8, ones, 32) == (float)sum8);
        for (int j = 0; j < 32; j++) y[j] = 1.0f;
        t->axpy[FLM_TYPE_Q8_0](&b8, 2.0f, y, 32);
        for (int j = 0; j < 32; j++) assert_true(y[j] == 1.0f + 0.5f * (float)(j * 8 - 128));
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * matvec, rmsnorm, softmax
 * ------------------------------------------------------------------------------------------------------------- */
static void test_matvec(void **state) {
    (void)state;
    const flm_kernels *tabs[FLM_KERNELS_N_LEVELS + 1]; /* every level the CPU has, and the best */
    for (int l = 0; l < FLM_KERNELS_N_LEVELS; l++) tabs[l] = flm_kernels_for_level((flm_kernel_level)l);
    tabs[FLM_KERNELS_N_LEVELS] = flm_kernels_best();
    static const size_t rows_list[] = {1, 2, 3, 5, 17, 257, 1031};
    static const int threads[] = {0, 1, 2, 3, 4};
    uint64_t rng = 42;
    for (int k = 0; k <= FLM_KERNELS_N_LEVELS; k++) {
        if (!tabs[k]) continue;
        for (size_t ti = 0; ti < N_TYPES; ti++) {
            uint32_t t = all_types[ti];
            size_t n = is_quant(t) ? ((k & 1) ? 256 : 64) : ((k & 1) ? 256 : 33);
            if (flm_type_block_elems(t) == 256) n = (k & 1) ? 512 : 256;
            size_t stride = flm_row_bytes(t, n);
            for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++) {
                size_t rows = rows_list[ri];
                void *wb, *xb;
                uint8_t *W = malloc(rows * stride);
                assert_non_null(W);
                for (size_t r = 0; r < rows; r++) {
                    void *one = rand_row(t, n, &rng, &wb);
                    memcpy(W + r * stride, one, stride);
                    free(wb);
                }
                float *x = rand_vec(n, &rng, 1.0f, &xb);
                float *want = malloc(rows * sizeof(float)), *got = malloc(rows * sizeof(float));
                assert_true(want && got);
                /* matvec quantizes x once into the type's vec_dot_type, then runs vec_dot per row */
                void *xq = malloc(flm_act_bytes(t, n) + 1);
                assert_non_null(xq);
                flm_act_quantize(t, x, n, xq);
                for (size_t r = 0; r < rows; r++) want[r] = flm_vec_dot(tabs[k], t, W + r * stride, xq, n);
                free(xq);
                for (size_t th = 0; th < sizeof threads / sizeof threads[0]; th++) {
                    for (size_t r = 0; r < rows; r++) got[r] = NAN;
                    flm_matvec(tabs[k], t, W, rows, n, x, got, threads[th]);
                    if (memcmp(want, got, rows * sizeof(float)) != 0)
                        fail_msg("matvec %s %s rows=%zu n=%zu threads=%d differs from per-row vec_dot", tabs[k]->name,
                                 flm_type_name(t), rows, n, threads[th]);
                }
                free(want);
                free(got);
                free(W);
                free(xb);
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Tiled dots of a batch (vec_dot_tile, flm_matmat)
 * ------------------------------------------------------------------------------------------------------------- */
/* Level L's vec_dot_tile of every type that has one, on random blocks: for every (row, token) bit for bit the same
 * level's vec_dot, and within 2e-6 * sum |w * xq| of the scalar reference's vec_dot; token counts cover full and
 * partial micro-tiles (4 tokens at avx2, 8 above). Then flm_matmat at level L with 1 and 2 threads against
 * flm_matvec token by token, bit for bit, on a matrix big enough to be split into several row blocks per thread. */
#ifdef FLM_SANITIZED_BUILD
#define TILE_MIS 0 /* the scalar reference reads its block structs in place: misaligned, that is undefined behaviour the
                      sanitizer stops at; the release build checks that the tiles do not depend on alignment */
#else
#define TILE_MIS 1
#endif

static void check_tiles(flm_kernel_level L) {
    const flm_kernels *k = flm_kernels_for_level(L), *s = flm_kernels_scalar();
    if (!k) {
        print_message("skipped: this CPU lacks the %s kernel level (its best: %s)\n", flm_kernel_level_name(L),
                      flm_kernel_level_name(flm_kernels_cpu_level()));
        skip();
    }
    static const size_t nxs[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 17};
    static const size_t rows_list[] = {1, 3, 6, 19};
    uint64_t rng = 777 + (uint64_t)L;
    size_t n_types = 0, n_dots = 0;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = all_types[ti], at = flm_type_traits_of(t)->vec_dot_type;
        if (!k->vec_dot_tile[t]) continue;
        n_types++;
        const size_t *lens;
        size_t nl;
        lens_for(t, &lens, &nl);
        for (size_t li = 0; li < nl; li++) {
            const size_t n = lens[li], stride = flm_row_bytes(t, n),
                         ab = TILE_MIS ? flm_act_bytes(t, n) + 3 : (flm_act_bytes(t, n) + 63) & ~(size_t)63;
            for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++) {
                const size_t rows = rows_list[ri], nx = nxs[(li * 3 + ri * 5) % 10 + 0 * rows];
                for (size_t xi = 0; xi < sizeof nxs / sizeof nxs[0]; xi++) {
                    const size_t n_x = (xi + li + ri) % 3 == 0 ? nxs[xi] : nx;
                    uint8_t *W = malloc(rows * stride + 1), *xq = malloc(n_x * ab + 1);
                    float *Y = malloc(n_x * (rows + 2) * sizeof(float));
                    float *wd = malloc(n * sizeof(float)), *xd = malloc(n * sizeof(float));
                    assert_true(W && xq && Y && wd && xd);
                    for (size_t r = 0; r < rows; r++) {
                        void *wb;
                        memcpy(W + TILE_MIS + r * stride, rand_row(t, n, &rng, &wb), stride); /* misaligned */
                        free(wb);
                    }
                    for (size_t b = 0; b < n_x; b++) {
                        void *xb;
                        const float *x = rand_vec(n, &rng, b % 3 == 2 ? 100.0f : 1.0f, &xb);
                        s->act_quantize[at](x, xq + TILE_MIS + b * ab, n);
                        free(xb);
                    }
                    const size_t ys = rows + 2;
                    /* with the tmp the caller carves (the vnni panels pack into it), and without (their
                     * row-at-a-time form): both the same bits as vec_dot */
                    const size_t tb = flm_tile_tmp_bytes(n, n_x);
                    void *tmp = tb ? aligned_alloc(64, tb) : NULL;
                    assert_true(!tb || tmp);
                    for (int with_tmp = 1; with_tmp >= 0; with_tmp--) {
                    for (size_t i = 0; i < n_x * ys; i++) Y[i] = NAN;
                    k->vec_dot_tile[t](W + TILE_MIS, stride, rows, xq + TILE_MIS, ab, n_x, n, Y, ys,
                                       with_tmp ? tmp : NULL);
                    for (size_t b = 0; b < n_x; b++) {
                        const void *xb = xq + TILE_MIS + b * ab;
                        s->dequant[at](xb, xd, n);
                        for (size_t r = 0; r < rows; r++) {
                            const void *row = W + TILE_MIS + r * stride;
                            const float got = Y[b * ys + r], want = k->vec_dot[t](row, xb, n);
                            if (memcmp(&got, &want, sizeof got) != 0)
                                fail_msg("%s: vec_dot_tile %s n=%zu rows=%zu n_x=%zu (row %zu, token %zu): %.9g, "
                                         "vec_dot %.9g: not the same bits", k->name, flm_type_name(t), n, rows, n_x,
                                         r, b, got, want);
                            s->dequant[t](row, wd, n);
                            double mag = 0.0;
                            for (size_t i = 0; i < n; i++) mag += fabs((double)wd[i] * xd[i]);
                            const float ref = s->vec_dot[t](row, xb, n);
                            if (!(fabs((double)ref - got) <= 2e-6 * mag + 1e-30))
                                fail_msg("%s: vec_dot_tile %s n=%zu: %.9g, scalar vec_dot %.9g", k->name,
                                         flm_type_name(t), n, got, ref);
                            n_dots++;
                        }
                        if (!isnan(Y[b * ys + rows]) || !isnan(Y[b * ys + rows + 1]))
                            fail_msg("%s: vec_dot_tile %s wrote outside its rows", k->name, flm_type_name(t));
                    }
                    }
                    free(tmp);
                    free(W);
                    free(xq);
                    free(Y);
                    free(wd);
                    free(xd);
                }
            }
        }
        /* flm_matmat: row blocks, threads */
        const size_t n = 4096 + flm_type_block_elems(t) * (is_quant(t) ? 1 : 32), rows = 203, n_x = 11;
        const size_t stride = flm_row_bytes(t, n);
        uint8_t *W = malloc(rows * stride);
        float *X = malloc(n_x * n * sizeof(float)), *want = malloc(n_x * rows * sizeof(float));
        float *got = malloc(n_x * rows * sizeof(float));
        assert_true(W && X && want && got);
        for (size_t r = 0; r < rows; r++) {
            void *wb;
            memcpy(W + r * stride, rand_row(t, n, &rng, &wb), stride);
            free(wb);
        }
        for (size_t i = 0; i < n_x * n; i++) X[i] = tu_rand_f32(&rng);
        for (size_t b = 0; b < n_x; b++) flm_matvec(k, t, W, rows, n, X + b * n, want + b * rows, 1);
        for (int th = 1; th <= 2; th++) {
            for (size_t i = 0; i < n_x * rows; i++) got[i] = NAN;
            flm_matmat(k, t, W, rows, n, X, n, n_x, got, rows, th, NULL);
            if (memcmp(want, got, n_x * rows * sizeof(float)) != 0)
                fail_msg("%s: matmat %s threads=%d differs from matvec token by token", k->name, flm_type_name(t),
                         th);
        }
        free(W);
        free(X);
        free(want);
        free(got);
    }
    print_message("%s: %zu types with tiled dots, %zu (row, token) dots bit for bit the level's vec_dot\n", k->name,
                  n_types, n_dots);
    /* axpy_tile: rows x tokens of coefficients (some zero, as inactive neurons) against the level's axpy, row by row
     * and token by token, bit for bit */
    size_t n_axpy = 0;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = all_types[ti];
        if (!k->axpy_tile[t]) continue;
        const size_t n = 256, stride = flm_row_bytes(t, n);
        static const size_t row_counts[] = {1, 5, 9, 17, 32, 37}; /* a tile's product table: 16 rows per half, 32 */
        for (size_t ri = 0; ri < sizeof row_counts / sizeof *row_counts; ri++)
            for (size_t n_y = 1, rows = row_counts[ri]; n_y <= 25; n_y++) { /* 12 per pass at 512 bits: every count
                                                                                 of a pass, whole and in part */
                uint8_t *W = malloc(rows * stride);
                float *a = malloc(rows * n_y * sizeof(float)), *want = malloc(n_y * n * sizeof(float)),
                      *got = malloc(n_y * n * sizeof(float));
                assert_true(W && a && want && got);
                for (size_t r = 0; r < rows; r++) {
                    void *wb;
                    memcpy(W + r * stride, rand_row(t, n, &rng, &wb), stride);
                    free(wb);
                }
                for (size_t i = 0; i < rows * n_y; i++) a[i] = i % 5 == 3 ? 0.0f : tu_rand_f32(&rng);
                for (size_t i = 0; i < n_y * n; i++) want[i] = got[i] = tu_rand_f32(&rng);
                for (size_t r = 0; r < rows; r++)
                    for (size_t y = 0; y < n_y; y++)
                        if (a[y * rows + r] != 0.0f) k->axpy[t](W + r * stride, a[y * rows + r], want + y * n, n);
                k->axpy_tile[t](W, stride, rows, a, rows, got, n, n_y, n);
                if (memcmp(want, got, n_y * n * sizeof(float)) != 0)
                    fail_msg("%s: axpy_tile %s rows=%zu tokens=%zu: not the bits of axpy row by row", k->name,
                             flm_type_name(t), rows, n_y);
                n_axpy++;
                free(W);
                free(a);
                free(want);
                free(got);
            }
    }
    print_message("%s: %zu tiled axpy cases bit for bit the level's axpy\n", k->name, n_axpy);
}

/* Small batches, the joined decode step of `serve --parallel` (2 to 8 rows, one per client) and short drafts: at
 * every level this CPU has, every type with a tiled dot, every token count 1..8, sizes with an odd number of blocks
 * (and a last quad of 32-element blocks that is partial), row counts that are not whole panels. For each (row,
 * token): the tile (with the tmp flm_matmat carves) bit for bit the level's vec_dot, flm_matmat bit for bit
 * flm_matvec token by token (what the greedy equality of joined clients rests on), within 2e-6 * sum |w x| of the
 * scalar reference vec_dot, and within 1e-5 * sum |w x| of the double-precision dot of the scalar dequantizers'
 * values (checked against the gguf package's in tests/test_quants.c; not for q8_1 activations, below). */
static void test_tiles_small(void **state) {
    (void)state;
    static const size_t q32_lens[] = {32 * 5, 32 * 7, 32 * 18, 32 * 28}, qk_lens[] = {256, 256 * 3, 256 * 6};
    static const size_t rows_list[] = {1, 17, 35};
    const flm_kernels *s = flm_kernels_scalar();
    uint64_t rng = 4242;
    size_t n_checked = 0;
    for (int L = 0; L < FLM_KERNELS_N_LEVELS; L++) {
        const flm_kernels *k = flm_kernels_for_level((flm_kernel_level)L);
        if (!k) continue;
        for (size_t ti = 0; ti < N_TYPES; ti++) {
            const uint32_t t = all_types[ti], at = flm_type_traits_of(t)->vec_dot_type;
            /* a level without a tiled dot for t (the Arm levels) still has flm_matmat's batch path: its bits
             * against flm_matvec and the references are checked, the tile's only where it exists */
            if (!is_quant(t) || !k->vec_dot[t]) continue;
            const bool tiled = k->vec_dot_tile[t] != NULL;
            const bool kq = flm_type_block_elems(t) == 256;
            const size_t *lens = kq ? qk_lens : q32_lens, nl = kq ? 3 : 4;
            for (size_t li = 0; li < nl; li++)
                for (size_t ri = 0; ri < 3; ri++)
                    for (size_t n_x = 1; n_x <= 8; n_x++) {
                        const size_t n = lens[li], rows = rows_list[ri], stride = flm_row_bytes(t, n);
                        const size_t ab = (flm_act_bytes(t, n) + 63) & ~(size_t)63, tb = flm_tile_tmp_bytes(n, n_x);
                        uint8_t *W = malloc(rows * stride), *xq = aligned_alloc(64, n_x * ab);
                        float *X = malloc(n_x * n * sizeof(float)), *Y = malloc(n_x * rows * sizeof(float));
                        float *M = malloc(n_x * rows * sizeof(float)), *V = malloc(n_x * rows * sizeof(float));
                        float *wd = malloc(n * sizeof(float)), *xd = malloc(n * sizeof(float));
                        void *tmp = aligned_alloc(64, tb);
                        assert_true(W && xq && X && Y && M && V && wd && xd && tmp);
                        for (size_t r = 0; r < rows; r++) {
                            void *wb;
                            memcpy(W + r * stride, rand_row(t, n, &rng, &wb), stride);
                            free(wb);
                        }
                        for (size_t b = 0; b < n_x; b++) {
                            void *xb;
                            memcpy(X + b * n, rand_vec(n, &rng, b % 3 == 1 ? 50.0f : 1.0f, &xb), n * sizeof(float));
                            free(xb);
                            s->act_quantize[at](X + b * n, xq + b * ab, n);
                        }
                        flm_matmat(k, t, W, rows, n, X, n, n_x, M, rows, 1, NULL);
                        if (tiled) k->vec_dot_tile[t](W, stride, rows, xq, ab, n_x, n, Y, rows, tmp);
                        else memcpy(Y, M, n_x * rows * sizeof(float));
                        for (size_t b = 0; b < n_x; b++) flm_matvec(k, t, W, rows, n, X + b * n, V + b * rows, 1);
                        for (size_t b = 0; b < n_x; b++) {
                            s->dequant[at](xq + b * ab, xd, n);
                            for (size_t r = 0; r < rows; r++) {
                                const float got = Y[b * rows + r], want = k->vec_dot[t](W + r * stride, xq + b * ab, n);
                                if (memcmp(&got, &want, sizeof got) != 0)
                                    fail_msg("%s: %s %s n=%zu rows=%zu n_x=%zu (row %zu, token %zu): %.9g, "
                                             "vec_dot %.9g", k->name, tiled ? "vec_dot_tile" : "matmat", flm_type_name(t), n, rows, n_x, r, b, got,
                                             want);
                                if (memcmp(&M[b * rows + r], &V[b * rows + r], sizeof(float)) != 0)
                                    fail_msg("%s: matmat %s n=%zu rows=%zu n_x=%zu (row %zu, token %zu): %.9g, matvec "
                                             "%.9g", k->name, flm_type_name(t), n, rows, n_x, r, b, M[b * rows + r],
                                             V[b * rows + r]);
                                s->dequant[t](W + r * stride, wd, n);
                                double ref = 0.0, mag = 0.0;
                                for (size_t i = 0; i < n; i++) {
                                    ref += (double)wd[i] * xd[i];
                                    mag += fabs((double)wd[i] * xd[i]);
                                }
                                /* q8_1 activations (q4_1, q5_1) carry s = d * sum(qs) rounded to f16, which
                                 * the dot uses for the weights' min: against the dequantized values, that
                                 * rounding; the scalar vec_dot (the reference) follows it */
                                if (at != FLM_TYPE_Q8_1 && !(fabs(ref - got) <= 1e-5 * mag + 1e-30))
                                    fail_msg("%s: vec_dot_tile %s n=%zu n_x=%zu: %.9g, dequantized values' dot %.9g",
                                             k->name, flm_type_name(t), n, n_x, got, ref);
                                const float sref = s->vec_dot[t](W + r * stride, xq + b * ab, n);
                                if (!(fabs((double)sref - got) <= 2e-6 * mag + 1e-30))
                                    fail_msg("%s: vec_dot_tile %s n=%zu n_x=%zu: %.9g, scalar vec_dot %.9g", k->name,
                                             flm_type_name(t), n, n_x, got, sref);
                                n_checked++;
                            }
                        }
                        free(W), free(xq), free(X), free(Y), free(M), free(V), free(wd), free(xd), free(tmp);
                    }
        }
    }
    assert_true(n_checked > 0);
    print_message("%zu (row, token) dots of batches of 1..8 checked\n", n_checked);
}

static void test_tiles_scalar(void **state) {
    (void)state;
    check_tiles(FLM_KERNELS_SCALAR);
}
static void test_tiles_avx2(void **state) {
    (void)state;
    check_tiles(FLM_KERNELS_AVX2);
}
static void test_tiles_avxvnni(void **state) {
    (void)state;
    check_tiles(FLM_KERNELS_AVXVNNI);
}
static void test_tiles_avx512(void **state) {
    (void)state;
    check_tiles(FLM_KERNELS_AVX512);
}
static void test_tiles_vnni(void **state) {
    (void)state;
    check_tiles(FLM_KERNELS_VNNI);
}
static void test_tiles_neon(void **state) {
    (void)state;
    check_tiles(FLM_KERNELS_NEON);
}
static void test_tiles_dotprod(void **state) {
    (void)state;
    check_tiles(FLM_KERNELS_DOTPROD);
}

static void test_rmsnorm(void **state) {
    (void)state;
    static const size_t lens[] = {1, 7, 64, 288, 4096};
    uint64_t rng = 5;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        size_t n = lens[li];
        void *xb, *wb;
        float *x = rand_vec(n, &rng, 3.0f, &xb), *w = rand_vec(n, &rng, 2.0f, &wb);
        float *out = malloc(n * sizeof(float));
        assert_non_null(out);
        const float eps = 1e-5f;
        flm_rmsnorm(out, x, w, n, eps);
        double ss = 0;
        for (size_t j = 0; j < n; j++) ss += (double)x[j] * x[j];
        double inv = 1.0 / sqrt(ss / (double)n + eps);
        for (size_t j = 0; j < n; j++) {
            double want = (double)w[j] * x[j] * inv;
            if (fabs(out[j] - want) > 2e-5 * fabs(want) + 1e-30)
                fail_msg("rmsnorm n=%zu j=%zu: %.9g want %.9g", n, j, out[j], want);
        }
        /* in place (out == x) is how the forward pass calls it */
        float *x2 = malloc(n * sizeof(float));
        assert_non_null(x2);
        memcpy(x2, x, n * sizeof(float));
        flm_rmsnorm(x2, x2, w, n, eps);
        assert_memory_equal(x2, out, n * sizeof(float));
        free(x2);
        free(out);
        free(xb);
        free(wb);
    }
}

/* LayerNorm against a hand computation: x = (1, 2, 3, 6): mean 3, deviations (-2, -1, 0, 3), variance
 * (4 + 1 + 0 + 9) / 4 = 3.5; with eps = 0.5 the scale is 1/sqrt(4) = 0.5, so the normed x is (-1, -0.5, 0, 1.5);
 * times w = (1, 2, -1, 0.5) plus b = (0.25, 0, 1, -1): (-0.75, -1, 1, -0.25). */
static void test_layernorm(void **state) {
    (void)state;
    const float x[4] = {1, 2, 3, 6}, w[4] = {1, 2, -1, 0.5f}, b[4] = {0.25f, 0, 1, -1};
    const float want[4] = {-0.75f, -1.0f, 1.0f, -0.25f}, want_nob[4] = {-1.0f, -1.0f, 0.0f, 0.75f};
    float out[4], in_place[4];
    flm_layernorm(out, x, w, b, 4, 0.5f);
    for (int j = 0; j < 4; j++) assert_float_equal(out[j], want[j], 1e-6);
    flm_layernorm(out, x, w, NULL, 4, 0.5f); /* no bias */
    for (int j = 0; j < 4; j++) assert_float_equal(out[j], want_nob[j], 1e-6);
    memcpy(in_place, x, sizeof x); /* out == x, as the forward pass calls it */
    flm_layernorm(in_place, in_place, w, b, 4, 0.5f);
    for (int j = 0; j < 4; j++) assert_float_equal(in_place[j], want[j], 1e-6);
    /* a constant row: zero deviation, the output is the bias */
    const float c[4] = {7, 7, 7, 7};
    flm_layernorm(out, c, w, b, 4, 1e-5f);
    for (int j = 0; j < 4; j++) assert_float_equal(out[j], b[j], 1e-6);
}

/* Every level's softmax kernel (kernels.h flm_softmax_fn, through flm_softmax) against the double-precision
 * softmax, at lengths with vector tails; masked (-inf) positions exactly 0; no overflow at large inputs. Levels this
 * CPU lacks are reported as skipped. */
static void test_softmax(void **state) {
    (void)state;
    static const size_t lens[] = {1, 2, 7, 8, 9, 17, 100, 1000, 32000};
    for (int lv = 0; lv < FLM_KERNELS_N_LEVELS; lv++) {
        const flm_kernels *k = flm_kernels_for_level((flm_kernel_level)lv);
        if (!k) {
            print_message("softmax: level %s skipped (not on this CPU / build)\n",
                          flm_kernel_level_name((flm_kernel_level)lv));
            continue;
        }
        uint64_t rng = 6;
        double worst = 0, worst_s = 0; /* against the exact softmax; against the scalar kernel for n <= 1000 */
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (int masked = 0; masked < 2; masked++) {
                size_t n = lens[li];
                void *xb;
                float *x = rand_vec(n, &rng, 10.0f, &xb);
                if (masked) /* a causal / tree mask: -inf at every third position after the first */
                    for (size_t i = 1; i < n; i += 3) x[i] = -INFINITY;
                double *want = malloc(n * sizeof(double));
                assert_non_null(want);
                double max = x[0], sum = 0;
                for (size_t i = 1; i < n; i++) max = fmax(max, x[i]);
                for (size_t i = 0; i < n; i++) sum += want[i] = exp(x[i] - max);
                float *ref = malloc(n * sizeof(float));
                assert_non_null(ref);
                memcpy(ref, x, n * sizeof(float));
                flm_softmax(flm_kernels_scalar(), ref, n);
                flm_softmax(k, x, n);
                /* the float sum of n positive terms drifts by up to ~n*eps/2 relative; a few ulp per element */
                double rtol = 1e-6 + 3e-9 * (double)n, total = 0;
                for (size_t i = 0; i < n; i++) {
                    want[i] /= sum;
                    total += x[i];
                    if (masked && i % 3 == 1 && f32_bits(x[i]) != 0)
                        fail_msg("%s: softmax n=%zu: masked i=%zu gives %.9g, not +0", k->name, n, i, x[i]);
                    if (fabs(x[i] - want[i]) > rtol * want[i] + 1e-12)
                        fail_msg("%s: softmax n=%zu i=%zu: %.9g want %.9g", k->name, n, i, x[i], want[i]);
                    if (want[i] > 1e-30 && fabs(x[i] - want[i]) / want[i] > worst) worst = fabs(x[i] - want[i]) / want[i];
                    if (n <= 1000 && ref[i] > 1e-30f && fabs((double)x[i] - ref[i]) / ref[i] > worst_s)
                        worst_s = fabs((double)x[i] - ref[i]) / ref[i];
                }
                free(ref);
                if (masked) { /* the unmasked positions alone give the same bits (a tree row vs the plain row) */
                    float *u = malloc(n * sizeof(float)), *x2 = malloc(n * sizeof(float));
                    assert_true(u && x2);
                    uint64_t r2 = rng;
                    size_t m = 0;
                    for (size_t i = 0; i < n; i++) {
                        x2[i] = i % 3 == 1 ? -INFINITY : 10.0f * tu_rand_f32(&r2);
                        if (i % 3 != 1) u[m++] = x2[i];
                    }
                    flm_softmax(k, x2, n);
                    flm_softmax(k, u, m);
                    for (size_t i = 0, j = 0; i < n; i++)
                        if (i % 3 != 1 && f32_bits(x2[i]) != f32_bits(u[j++]))
                            fail_msg("%s: softmax n=%zu: masked positions change i=%zu", k->name, n, i);
                    free(u);
                    free(x2);
                }
                assert_true(fabs(total - 1.0) < rtol);
                free(want);
                free(xb);
            }
        float big[3] = {1000.0f, 1000.0f, -1000.0f}; /* stable: no overflow */
        flm_softmax(k, big, 3);
        assert_true(big[0] == 0.5f && big[1] == 0.5f && big[2] == 0.0f);
        print_message("softmax %s: within %.2g relative of the exact softmax, %.2g of the scalar one (n <= 1000)\n",
                      k->name, worst, worst_s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables),
        cmocka_unit_test(test_simd_vs_scalar),
        cmocka_unit_test(test_level_avx2),
        cmocka_unit_test(test_level_avxvnni),
        cmocka_unit_test(test_level_avx512),
        cmocka_unit_test(test_level_vnni),
        cmocka_unit_test(test_level_neon),
        cmocka_unit_test(test_level_dotprod),
        cmocka_unit_test(test_f16_dequant_all_patterns),
        cmocka_unit_test(test_f16_specials),
        cmocka_unit_test(test_f16_all_round_trip),
#ifdef TEST_HAVE_F16C_HW
        cmocka_unit_test(test_f16_vs_hardware),
#endif
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_quantize_q8_0),
        cmocka_unit_test(test_quantize_q4_0),
        cmocka_unit_test(test_quantize_float_types),
        cmocka_unit_test(test_known_blocks),
        cmocka_unit_test(test_matvec),
        cmocka_unit_test(test_tiles_scalar),
        cmocka_unit_test(test_tiles_avx2),
        cmocka_unit_test(test_tiles_avxvnni),
        cmocka_unit_test(test_tiles_avx512),
        cmocka_unit_test(test_tiles_vnni),
        cmocka_unit_test(test_tiles_small),
        cmocka_unit_test(test_tiles_neon),
        cmocka_unit_test(test_tiles_dotprod),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_softmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
