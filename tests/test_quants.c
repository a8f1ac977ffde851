/* test_quants.c — every GGUF block type: the traits table, dequantizers against an independent oracle (the gguf
 * Python package's NumPy code, run by tests/oracle/dequant.py), quantizers, the quantized-activation dot products
 * (scalar, AVX2, and dequantize-then-float-dot), matvec, and real tensors from the downloaded models.
 *
 * The oracle needs python3 with the gguf and numpy packages (scripts/install-deps.sh installs them). Without them
 * the oracle tests fail, unless FLM_ALLOW_SKIP_ORACLE=1 (then they skip). The real-model test skips a model file
 * that is absent from ~/.cache/flashlm/models/, unless FLASHLM_REQUIRE_MODELS=1 (then it fails). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/ffn_bundle.h"
#include "compute/kernels.h"
#include "core/types.h"
#include "format/gguf.h"

static const uint32_t tensor_types[] = {FLM_TYPE_F32,  FLM_TYPE_F16,  FLM_TYPE_BF16, FLM_TYPE_Q4_0, FLM_TYPE_Q4_1,
                                        FLM_TYPE_Q5_0, FLM_TYPE_Q5_1, FLM_TYPE_Q8_0, FLM_TYPE_Q2_K, FLM_TYPE_Q3_K,
                                        FLM_TYPE_Q4_K, FLM_TYPE_Q5_K, FLM_TYPE_Q6_K};
#define N_TENSOR_TYPES (sizeof tensor_types / sizeof tensor_types[0])

/* ---------------------------------------------------------------------------------------------------------------
 * The oracle
 * ------------------------------------------------------------------------------------------------------------- */
/* tests/oracle/dequant.py next to this file (__FILE__ is the absolute source path under CMake). */
static const char *oracle_script(void) {
    static char path[4096];
    const char *slash = strrchr(__FILE__, '/');
    int dir = slash ? (int)(slash - __FILE__) : 1;
    snprintf(path, sizeof path, "%.*s/oracle/dequant.py", dir, slash ? __FILE__ : ".");
    return path;
}

/* Fails (or skips, with FLM_ALLOW_SKIP_ORACLE=1) when python3 cannot import gguf. Call first in an oracle test. */
static void need_oracle(void) {
    static int ok = -1;
    if (ok < 0) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "python3 '%.4000s' --check", oracle_script());
        ok = system(cmd) == 0;
    }
    if (ok) return;
    const char *allow = getenv("FLM_ALLOW_SKIP_ORACLE");
    if (allow && strcmp(allow, "1") == 0) {
        print_message("skipped: python3 cannot import the gguf package (FLM_ALLOW_SKIP_ORACLE=1)\n");
        skip();
    }
    fail_msg("the dequantization oracle needs python3 with the gguf and numpy packages (python3 -m pip install gguf "
             "numpy, or scripts/install-deps.sh); set FLM_ALLOW_SKIP_ORACLE=1 to skip these tests instead");
}

/* The oracle's values for nb blocks of type t at data (nb * block_elems floats, malloc'd). mode: "" or
 * "--quantize " (then data is floats and the result is blocks, *out_len bytes). */
static void *run_oracle(const char *mode, uint32_t t, const void *data, size_t len, size_t *out_len) {
    const char *in = tu_tmp("oracle-in", ".bin"), *out = tu_tmp("oracle-out", ".bin");
    char in_path[1024], out_path[1024], cmd[4200];
    snprintf(in_path, sizeof in_path, "%s", in);
    snprintf(out_path, sizeof out_path, "%s", out);
    tu_write_file(in_path, data, len);
    snprintf(cmd, sizeof cmd, "python3 '%.2000s' %s%u '%.1000s' '%.1000s'", oracle_script(), mode, t, in_path,
             out_path);
    int rc = system(cmd);
    if (rc != 0) fail_msg("oracle failed (status %d): %s", rc, cmd);
    void *res = tu_read_file(out_path, out_len);
    remove(in_path);
    remove(out_path);
    return res;
}

/* Compares flashlm's dequantization of nb blocks at data with the oracle's: equal bit for bit, or within 1e-6
 * relative (numpy may evaluate in another order). what names the data in a failure. */
static void check_against_oracle(uint32_t t, const uint8_t *data, size_t nb, const char *what) {
    const size_t be = flm_type_block_elems(t), bb = flm_type_block_bytes(t), n = nb * be;
    size_t len;
    float *want = run_oracle("", t, data, nb * bb, &len);
    assert_int_equal(len, n * sizeof(float));
    const flm_kernels *tabs[2] = {flm_kernels_scalar(), flm_kernels_avx2()};
    float *got = malloc(n * sizeof(float));
    assert_non_null(got);
    for (int k = 0; k < 2; k++) {
        if (!tabs[k]) continue;
        tabs[k]->dequant[t](data, got, n);
        size_t inexact = 0;
        for (size_t i = 0; i < n; i++) {
            if (memcmp(&got[i], &want[i], sizeof(float)) == 0) continue;
            inexact++;
            if (!(fabsf(got[i] - want[i]) <= 1e-6f * fabsf(want[i])))
                fail_msg("%s: %s dequant (%s) element %zu of %zu: flashlm %.9g, oracle %.9g", what, flm_type_name(t),
                         tabs[k]->name, i, n, got[i], want[i]);
        }
        if (inexact) print_message("%s: %s (%s): %zu of %zu values within 1e-6, not bit-equal\n", what,
                                   flm_type_name(t), tabs[k]->name, inexact, n);
    }
    free(got);
    free(want);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Random data
 * ------------------------------------------------------------------------------------------------------------- */
/* Byte offsets of a block's f16 scale fields (d, and m or dmin where there is one; -1: none): types.h layouts. */
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

/* nb random blocks of type t (malloc'd): random bytes, with the f16 scales forced finite and sane (|d| < 0.05);
 * float types get finite random values. */
static uint8_t *rand_blocks(uint32_t t, size_t nb, uint64_t *rng) {
    const size_t bb = flm_type_block_bytes(t);
    uint8_t *p = malloc(nb * bb + 1);
    assert_non_null(p);
    for (size_t i = 0; i < nb * bb; i++) p[i] = (uint8_t)tu_rand_u64(rng);
    if (!flm_type_traits_of(t)->is_quantized) {
        for (size_t i = 0; i < nb; i++) {
            float v = tu_rand_f32(rng) * 4.0f;
            uint16_t h = t == FLM_TYPE_F16 ? flm_f32_to_f16(v) : flm_f32_to_bf16(v);
            if (t == FLM_TYPE_F32) memcpy(p + i * 4, &v, 4);
            else memcpy(p + i * 2, &h, 2);
        }
        return p;
    }
    int off[2];
    scale_offsets(t, off);
    for (size_t b = 0; b < nb; b++)
        for (int k = 0; k < 2; k++) {
            if (off[k] < 0) continue;
            uint16_t h = flm_f32_to_f16(tu_rand_f32(rng) * 0.05f);
            memcpy(p + b * bb + (size_t)off[k], &h, 2);
        }
    return p;
}

static float *rand_floats(size_t n, uint64_t *rng, float scale) {
    float *x = malloc((n + 1) * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = tu_rand_f32(rng) * scale;
    return x;
}

/* ---------------------------------------------------------------------------------------------------------------
 * (0) the traits table
 * ------------------------------------------------------------------------------------------------------------- */
static void test_traits(void **state) {
    (void)state;
    /* ggml.c type_traits: name, blck_size, type_size, vec_dot_type */
    static const struct { uint32_t t; const char *name; uint32_t be, bb, vdt; } want[] = {
        {FLM_TYPE_F32, "f32", 1, 4, FLM_TYPE_F32},        {FLM_TYPE_F16, "f16", 1, 2, FLM_TYPE_F32},
        {FLM_TYPE_BF16, "bf16", 1, 2, FLM_TYPE_F32},      {FLM_TYPE_Q4_0, "q4_0", 32, 18, FLM_TYPE_Q8_0},
        {FLM_TYPE_Q4_1, "q4_1", 32, 20, FLM_TYPE_Q8_1},   {FLM_TYPE_Q5_0, "q5_0", 32, 22, FLM_TYPE_Q8_0},
        {FLM_TYPE_Q5_1, "q5_1", 32, 24, FLM_TYPE_Q8_1},   {FLM_TYPE_Q8_0, "q8_0", 32, 34, FLM_TYPE_Q8_0},
        {FLM_TYPE_Q2_K, "q2_k", 256, 84, FLM_TYPE_Q8_K},  {FLM_TYPE_Q3_K, "q3_k", 256, 110, FLM_TYPE_Q8_K},
        {FLM_TYPE_Q4_K, "q4_k", 256, 144, FLM_TYPE_Q8_K}, {FLM_TYPE_Q5_K, "q5_k", 256, 176, FLM_TYPE_Q8_K},
        {FLM_TYPE_Q6_K, "q6_k", 256, 210, FLM_TYPE_Q8_K},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const flm_type_traits *tt = flm_type_traits_of(want[i].t);
        assert_non_null(tt);
        assert_string_equal(tt->name, want[i].name);
        assert_string_equal(flm_type_name(want[i].t), want[i].name);
        assert_int_equal(tt->block_elems, want[i].be);
        assert_int_equal(tt->block_bytes, want[i].bb);
        assert_int_equal(flm_type_block_elems(want[i].t), want[i].be);
        assert_int_equal(flm_type_block_bytes(want[i].t), want[i].bb);
        assert_int_equal(tt->vec_dot_type, want[i].vdt);
        assert_true(tt->is_tensor);
        assert_true(flm_type_supported(want[i].t));
        assert_int_equal(tt->is_quantized, want[i].be > 1);
        assert_int_equal(flm_row_bytes(want[i].t, 4096), 4096 / want[i].be * want[i].bb);
        if (want[i].be > 1) assert_int_equal(flm_row_bytes(want[i].t, want[i].be + 1), 0);
        /* the activation type exists, has a quantizer, and is sized by the same table */
        const flm_type_traits *vt = flm_type_traits_of(want[i].vdt);
        assert_non_null(vt);
        assert_true(vt->has_quantizer);
        assert_int_equal(vt->block_elems, want[i].be == 1 ? 1 : want[i].be);
        /* the q8_0 / q8_1 blocks are followed by their scales as float32 (d; and s for q8_1) */
        size_t tail = want[i].vdt == FLM_TYPE_Q8_0 || want[i].vdt == FLM_TYPE_Q8_1 ? 4096 / 32 * 8 : 0;
        assert_int_equal(flm_act_bytes(want[i].t, 4096), flm_row_bytes(want[i].vdt, 4096) + tail);
    }
    /* activation-only types: known by name and size, not loadable as tensors */
    assert_string_equal(flm_type_name(FLM_TYPE_Q8_1), "q8_1");
    assert_int_equal(flm_type_block_bytes(FLM_TYPE_Q8_1), 36);
    assert_string_equal(flm_type_name(FLM_TYPE_Q8_K), "q8_k");
    assert_int_equal(flm_type_block_bytes(FLM_TYPE_Q8_K), 292);
    assert_false(flm_type_supported(FLM_TYPE_Q8_1));
    assert_false(flm_type_supported(FLM_TYPE_Q8_K));
    assert_int_equal(flm_act_bytes(FLM_TYPE_Q8_K, 256), 0);
    /* ids ggml retired (q4_2 = 4, q4_3 = 5), ids flashlm does not know (iq*, tq*), and beyond the end */
    static const uint32_t unknown[] = {4, 5, 16, 20, 29, 31, 39, 1000, UINT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_null(flm_type_traits_of(unknown[i]));
        assert_null(flm_type_name(unknown[i]));
        assert_false(flm_type_supported(unknown[i]));
        assert_int_equal(flm_type_block_elems(unknown[i]), 0);
        assert_int_equal(flm_type_block_bytes(unknown[i]), 0);
        assert_int_equal(flm_row_bytes(unknown[i], 256), 0);
        assert_int_equal(flm_act_bytes(unknown[i], 256), 0);
    }
    char list[128];
    assert_string_equal(flm_type_supported_list(list, sizeof list),
                        "f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, bf16");
    assert_string_equal(flm_type_supported_list(list, 15), "f32, f16, q4_0"); /* cut at a name */
    /* quantizers: what the table says */
    float x[256] = {0};
    uint8_t buf[512];
    for (size_t i = 0; i < N_TENSOR_TYPES; i++) {
        uint32_t t = tensor_types[i];
        size_t n = flm_type_block_elems(t) == 256 ? 256 : 32;
        assert_int_equal(flm_quantize_row(t, x, buf, n), flm_type_traits_of(t)->has_quantizer);
    }
    assert_false(flm_quantize_row(FLM_TYPE_Q4_0, x, buf, 33)); /* not whole blocks */
    assert_false(flm_quantize_row(99, x, buf, 32));
}

/* ---------------------------------------------------------------------------------------------------------------
 * (a) dequantizers against the oracle, on random blocks
 * ------------------------------------------------------------------------------------------------------------- */
static void test_dequant_oracle(void **state) {
    (void)state;
    need_oracle();
    uint64_t rng = 777;
    for (size_t i = 0; i < N_TENSOR_TYPES; i++) {
        uint32_t t = tensor_types[i];
        size_t nb = flm_type_block_elems(t) == 1 ? 4096 : (flm_type_block_elems(t) == 32 ? 512 : 64);
        uint8_t *blocks = rand_blocks(t, nb, &rng);
        char what[64];
        snprintf(what, sizeof what, "%zu random blocks", nb);
        check_against_oracle(t, blocks, nb, what);
        free(blocks);
    }
}

/* Quantizers with a Python counterpart give the same bytes (ggml's reference rounding). */
static void test_quantize_oracle(void **state) {
    (void)state;
    need_oracle();
    static const uint32_t types[] = {FLM_TYPE_Q4_0, FLM_TYPE_Q4_1, FLM_TYPE_Q5_0, FLM_TYPE_Q5_1, FLM_TYPE_Q8_0};
    uint64_t rng = 99;
    const size_t n = 32 * 256;
    float *x = rand_floats(n, &rng, 3.0f);
    for (size_t b = 0; b < n / 32; b += 7) memset(x + b * 32, 0, 32 * sizeof(float)); /* all-zero blocks too */
    for (size_t b = 3; b < n / 32; b += 11) for (int j = 0; j < 32; j++) x[b * 32 + j] = 0.25f; /* constant */
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        uint32_t t = types[i];
        size_t rb = flm_row_bytes(t, n), len;
        uint8_t *got = malloc(rb);
        assert_non_null(got);
        assert_true(flm_quantize_row(t, x, got, n));
        uint8_t *want = run_oracle("--quantize ", t, x, n * sizeof(float), &len);
        assert_int_equal(len, rb);
        size_t bb = flm_type_block_bytes(t), diff = 0;
        for (size_t b = 0; b < n / 32; b++)
            if (memcmp(got + b * bb, want + b * bb, bb) != 0) {
                if (!diff) print_message("%s block %zu differs from gguf.quants.quantize\n", flm_type_name(t), b);
                diff++;
            }
        if (diff) fail_msg("%s: %zu of %zu blocks differ from the oracle's quantizer", flm_type_name(t), diff, n / 32);
        free(got);
        free(want);
    }
    free(x);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Activation quantizers: q8_0, q8_1, q8_k
 * ------------------------------------------------------------------------------------------------------------- */
static void test_act_quantize(void **state) {
    (void)state;
    uint64_t rng = 5;
    const size_t n = 1024;
    float *x = rand_floats(n, &rng, 2.0f);
    memset(x + 256, 0, 256 * sizeof(float)); /* a zero super-block */
    x[700] = -9.0f;                         /* one large value */
    float *y = malloc(n * sizeof(float));
    assert_non_null(y);
    static const uint32_t wtypes[] = {FLM_TYPE_Q4_0, FLM_TYPE_Q4_1, FLM_TYPE_Q4_K};
    for (size_t wi = 0; wi < 3; wi++) {
        uint32_t wt = wtypes[wi], at = flm_type_traits_of(wt)->vec_dot_type;
        size_t be = flm_type_block_elems(at);
        uint8_t *q = malloc(flm_act_bytes(wt, n));
        assert_non_null(q);
        flm_act_quantize(wt, x, n, q);
        flm_kernels_scalar()->dequant[at](q, y, n);
        for (size_t b = 0; b < n / be; b++) {
            float amax = 0.0f;
            for (size_t j = 0; j < be; j++) amax = fmaxf(amax, fabsf(x[b * be + j]));
            /* |x - q*d| <= d/2, plus the f16 rounding of d (q8_0, q8_1: relative 2^-11 of |q*d| <= amax) */
            double tol = amax / 127.0 * 0.5 * 1.0001 + (at == FLM_TYPE_Q8_K ? 0.0 : amax * 0x1p-11) + 1e-30;
            for (size_t j = 0; j < be; j++) {
                size_t i = b * be + j;
                if (fabs((double)y[i] - x[i]) > tol)
                    fail_msg("%s: element %zu: %.9g quantized to %.9g (tol %.3g)", flm_type_name(at), i, x[i], y[i],
                             tol);
            }
            if (amax == 0.0f)
                for (size_t j = 0; j < be; j++) assert_true(y[b * be + j] == 0.0f);
        }
        if (at == FLM_TYPE_Q8_1) { /* s = d * sum(q), as f16 */
            const flm_block_q8_1 *qb = (const flm_block_q8_1 *)q;
            for (size_t b = 0; b < n / 32; b++) {
                int s = 0;
                for (int j = 0; j < 32; j++) s += qb[b].qs[j];
                double want = (double)s * flm_f16_to_f32(qb[b].d), got = flm_f16_to_f32(qb[b].s);
                assert_true(fabs(got - want) <= fabs(want) * 0x1p-10 + 1e-30); /* two f16 roundings apart */
            }
        }
        if (at == FLM_TYPE_Q8_K) { /* bsums are the 16-element sums; the largest |x| maps to +-127 */
            const flm_block_q8_k *qb = (const flm_block_q8_k *)q;
            for (size_t b = 0; b < n / 256; b++) {
                for (int g = 0; g < 16; g++) {
                    int s = 0;
                    for (int j = 0; j < 16; j++) s += qb[b].qs[16 * g + j];
                    assert_int_equal(qb[b].bsums[g], s);
                }
            }
            assert_int_equal(qb[2].qs[700 - 512], -127);
        }
        free(q);
    }
    free(y);
    free(x);
}

/* Every table's activation quantizer writes the same bytes as the scalar reference, ties (x/d = k + 1/2) included:
 * roundf rounds them away from zero. */
static void test_act_quantize_simd(void **state) {
    (void)state;
    const flm_kernels *s = flm_kernels_scalar(), *a = flm_kernels_avx2();
    if (!a) {
        print_message("skipped: avx2 kernels unavailable on this build/CPU\n");
        skip();
    }
    uint64_t rng = 77;
    const size_t n = 4096;
    float *x = rand_floats(n, &rng, 3.0f);
    /* block 0: amax 127 makes d = 1, so these are exact ties and near-ties */
    x[0] = 127.0f;
    for (int j = 1; j < 32; j++) x[j] = (float)(j - 16) + (j & 1 ? 0.5f : -0.5f);
    x[5] = 0.49999997f, x[6] = -0.49999997f, x[7] = -2.5f, x[8] = 2.5f;
    for (size_t j = 256; j < 512; j++) x[j] = (float)((int)j % 21 - 10) * 0.5f; /* many ties in a q8_k block */
    memset(x + 1024, 0, 256 * sizeof(float));
    static const uint32_t at[] = {FLM_TYPE_Q8_0, FLM_TYPE_Q8_1, FLM_TYPE_Q8_K};
    for (size_t i = 0; i < 3; i++) {
        /* the whole activation buffer (blocks, then the float scales of q8_0/q8_1), via a weight type using it */
        static const uint32_t wt[] = {FLM_TYPE_Q4_0, FLM_TYPE_Q4_1, FLM_TYPE_Q4_K};
        size_t bytes = flm_act_bytes(wt[i], n), rbytes = flm_row_bytes(at[i], n);
        assert_true(bytes >= rbytes);
        uint8_t *qs = malloc(bytes), *qa = malloc(bytes), *qr = malloc(bytes);
        assert_true(qs && qa && qr);
        memset(qs, 0x5a, bytes);
        memset(qa, 0xa5, bytes);
        s->act_quantize[at[i]](x, qs, n);
        a->act_quantize[at[i]](x, qa, n);
        assert_true(flm_quantize_row(at[i], x, qr, n));
        if (memcmp(qs, qa, bytes) != 0) {
            size_t b = 0;
            while (qs[b] == qa[b]) b++;
            fail_msg("%s: avx2 act_quantize differs from scalar at byte %zu (%u vs %u)", flm_type_name(at[i]), b,
                     qa[b], qs[b]);
        }
        assert_memory_equal(qs, qr, rbytes); /* the table's quantizer writes flm_quantize_row's blocks */
        if (at[i] != FLM_TYPE_Q8_K) { /* then the scales as float32 */
            const size_t nb = n / 32, bb = flm_type_block_bytes(at[i]);
            for (size_t b = 0; b < nb; b++) {
                uint16_t d, sv;
                float df, sf;
                memcpy(&d, qs + b * bb, 2);
                memcpy(&df, qs + rbytes + 4 * b, 4);
                assert_true(df == flm_f16_to_f32(d));
                if (at[i] == FLM_TYPE_Q8_1) { /* then s */
                    memcpy(&sv, qs + b * bb + 2, 2);
                    memcpy(&sf, qs + rbytes + 4 * (nb + b), 4);
                    assert_true(sf == flm_f16_to_f32(sv));
                } else { /* then sum(qs) */
                    int32_t sum = 0, got;
                    for (int j = 0; j < 32; j++) sum += (int8_t)qs[b * bb + 2 + j];
                    memcpy(&got, qs + rbytes + 4 * (nb + b), 4);
                    assert_int_equal(got, sum);
                }
            }
        }
        if (at[i] == FLM_TYPE_Q8_0) { /* the ties went away from zero */
            const flm_block_q8_0 *b = (const flm_block_q8_0 *)qs;
            assert_int_equal(b[0].qs[0], 127);
            assert_int_equal(b[0].qs[7], -3);
            assert_int_equal(b[0].qs[8], 3);
            assert_int_equal(b[0].qs[5], 0);
            assert_int_equal(b[0].qs[6], 0);
            assert_int_equal(b[0].qs[1], -15); /* -14.5 */
            assert_int_equal(b[0].qs[3], -13); /* -12.5 */
            assert_int_equal(b[0].qs[31], 16); /* 15.5 */
        }
        free(qs);
        free(qa);
        free(qr);
    }
    free(x);
}

/* ---------------------------------------------------------------------------------------------------------------
 * (b) dot products: vec_dot (scalar, AVX2) against dequantize-then-dot, float-x dot, matvec
 * ------------------------------------------------------------------------------------------------------------- */
/* Checks vec_dot of every table on row (n elements of t) against x; see the tolerances below. even_x: x has no
 * outliers (uniform random), so the 1e-2 relative bound applies too. */
static void check_dots(uint32_t t, const uint8_t *row, const float *x, size_t n, const char *what, bool even_x) {
    const flm_kernels *s = flm_kernels_scalar(), *a = flm_kernels_avx2();
    const uint32_t at = flm_type_traits_of(t)->vec_dot_type;
    const size_t abe = flm_type_block_elems(at);
    float *w = malloc(n * sizeof(float)), *xd = malloc(n * sizeof(float));
    uint8_t *xq = malloc(flm_act_bytes(t, n) + 1);
    assert_true(w && xd && xq);
    s->dequant[t](row, w, n);
    flm_act_quantize(t, x, n, xq);
    if (at == FLM_TYPE_F32) memcpy(xd, x, n * sizeof(float));
    else s->dequant[at](xq, xd, n);
    /* truth: the float dot; ref_q: the dot with the quantized x, both in double */
    double truth = 0, ref_q = 0, mag = 0, mag_q = 0, qerr = 0, s_err = 0;
    for (size_t b = 0; b < n / abe; b++) {
        double amax = 0;
        for (size_t j = 0; j < abe; j++) amax = fmax(amax, fabs(x[b * abe + j]));
        for (size_t j = 0; j < abe; j++) {
            size_t i = b * abe + j;
            truth += (double)w[i] * x[i];
            ref_q += (double)w[i] * xd[i];
            mag += fabs((double)w[i] * x[i]);
            mag_q += fabs((double)w[i] * xd[i]);
            /* the activation's rounding: <= d/2 with d = amax/127, plus f16 d (2^-11 relative when normal; the
             * actual difference covers subnormal d of tiny activations) */
            if (at != FLM_TYPE_F32)
                qerr += fabs(w[i]) * fmax(amax / 254.0 * 1.0001 + amax * 0x1p-11, fabs((double)x[i] - xd[i]));
        }
    }
    if (at == FLM_TYPE_Q8_1) { /* q4_1/q5_1 take m * s with s = d*sum(q) rounded to f16 */
        const flm_block_q8_1 *qb = (const flm_block_q8_1 *)xq;
        const size_t wb = flm_type_block_bytes(t);
        for (size_t b = 0; b < n / 32; b++) {
            uint16_t m;
            memcpy(&m, row + b * wb + 2, 2);
            double sq = 0;
            for (int j = 0; j < 32; j++) sq += xd[b * 32 + j];
            s_err += fabs(flm_f16_to_f32(m)) * (fabs(flm_f16_to_f32(qb[b].s) - sq) * 1.01 + 1e-12);
        }
    }
    const double tol_q = 2e-6 * mag_q + s_err + 1e-30; /* float accumulation order, s rounding */
    const flm_kernels *tabs[2] = {s, a};
    float got[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        if (!tabs[k]) continue;
        got[k] = flm_vec_dot(tabs[k], t, row, xq, n);
        if (!(fabs(got[k] - ref_q) <= tol_q))
            fail_msg("%s: %s vec_dot (%s) n=%zu: %.9g, dequantized dot with the same quantized x %.9g (tol %.3g)",
                     what, flm_type_name(t), tabs[k]->name, n, got[k], ref_q, tol_q);
        if (!(fabs(got[k] - truth) <= qerr + tol_q + 2e-6 * mag))
            fail_msg("%s: %s vec_dot (%s) n=%zu: %.9g, float dot %.9g (activation rounding bound %.3g)", what,
                     flm_type_name(t), tabs[k]->name, n, got[k], truth, qerr);
        /* the float-x dot of the same table: float rounding of the exact dot */
        float fd = tabs[k]->dot[t](row, x, n);
        if (!(fabs(fd - truth) <= 2e-6 * mag + 1e-30))
            fail_msg("%s: %s dot (%s) n=%zu: %.9g, double %.9g", what, flm_type_name(t), tabs[k]->name, n, fd, truth);
    }
    /* with activations of even magnitude the int8 rounding is small against |w|.|x| (~1e-2 relative) */
    if (even_x)
        for (int k = 0; k < 2; k++)
            if (tabs[k] && !(fabs(got[k] - truth) <= 1e-2 * mag + 1e-30))
                fail_msg("%s: %s vec_dot (%s) n=%zu: %.9g, float dot %.9g: more than 1e-2 of |w||x| = %.3g", what,
                         flm_type_name(t), tabs[k]->name, n, got[k], truth, mag);
    free(w);
    free(xd);
    free(xq);
}

static void test_vec_dot(void **state) {
    (void)state;
    uint64_t rng = 31337;
    for (size_t i = 0; i < N_TENSOR_TYPES; i++) {
        uint32_t t = tensor_types[i];
        size_t be = flm_type_block_elems(t) == 1 ? 32 : flm_type_block_elems(t);
        static const size_t mult[] = {1, 2, 3, 7, 28, 35};
        for (size_t m = 0; m < sizeof mult / sizeof mult[0]; m++) {
            size_t n = be * mult[m];
            if (n > 16384) continue;
            for (int rep = 0; rep < 4; rep++) {
                uint8_t *row = rand_blocks(t, n / flm_type_block_elems(t), &rng);
                float *x = rand_floats(n, &rng, rep == 3 ? 1e-3f : 1.5f);
                if (rep == 2) /* uneven magnitudes: blocks of zeros and one big value */
                    for (size_t j = 0; j < n; j++) x[j] = (j / 64) % 3 == 1 ? 0.0f : (j % 97 == 0 ? 40.0f : x[j]);
                char what[48];
                snprintf(what, sizeof what, "random rep %d", rep);
                check_dots(t, row, x, n, what, rep < 2);
                free(row);
                free(x);
            }
        }
    }
}

/* matvec: per-row vec_dot, bit for bit, for every table and thread count; close to the float matvec. */
static void test_matvec_all_types(void **state) {
    (void)state;
    uint64_t rng = 8;
    const flm_kernels *tabs[2] = {flm_kernels_scalar(), flm_kernels_avx2()};
    static const int threads[] = {1, 2, 3};
    for (size_t i = 0; i < N_TENSOR_TYPES; i++) {
        uint32_t t = tensor_types[i];
        const size_t n = 1536, rows = 67, stride = flm_row_bytes(t, n);
        uint8_t *W = rand_blocks(t, rows * n / flm_type_block_elems(t), &rng);
        float *x = rand_floats(n, &rng, 1.0f), *got = malloc(rows * sizeof(float)), *w = malloc(n * sizeof(float));
        uint8_t *xq = malloc(flm_act_bytes(t, n));
        assert_true(got && w && xq);
        flm_act_quantize(t, x, n, xq);
        for (int k = 0; k < 2; k++) {
            if (!tabs[k]) continue;
            for (size_t th = 0; th < sizeof threads / sizeof threads[0]; th++) {
                flm_matvec(tabs[k], t, W, rows, n, x, got, threads[th]);
                for (size_t r = 0; r < rows; r++) {
                    float want = flm_vec_dot(tabs[k], t, W + r * stride, xq, n);
                    if (memcmp(&want, &got[r], sizeof want) != 0)
                        fail_msg("%s matvec (%s, %d threads) row %zu: %.9g, vec_dot %.9g", flm_type_name(t),
                                 tabs[k]->name, threads[th], r, got[r], want);
                    tabs[k]->dequant[t](W + r * stride, w, n);
                    double truth = 0, mag = 0;
                    for (size_t j = 0; j < n; j++) truth += (double)w[j] * x[j], mag += fabs((double)w[j] * x[j]);
                    if (!(fabs(got[r] - truth) <= 1e-2 * mag + 1e-30))
                        fail_msg("%s matvec (%s) row %zu: %.9g, float %.9g (|w||x| %.3g)", flm_type_name(t),
                                 tabs[k]->name, r, got[r], truth, mag);
                }
            }
        }
        free(W);
        free(x);
        free(got);
        free(w);
        free(xq);
    }
}

/* flm_matvec_multi: several matrices of mixed types against one x give what flm_matvec gives for each, bit for
 * bit, for any thread count; also with an x too large for the stack buffer. */
static void test_matvec_multi(void **state) {
    (void)state;
    uint64_t rng = 12;
    static const uint32_t types[] = {FLM_TYPE_Q4_K, FLM_TYPE_Q5_0, FLM_TYPE_F16, FLM_TYPE_Q4_1, FLM_TYPE_Q8_0,
                                     FLM_TYPE_Q6_K};
    static const size_t rows[] = {67, 1, 130, 33, 2, 256};
    static const size_t lens[] = {1536, 32768};
    const flm_kernels *tabs[2] = {flm_kernels_scalar(), flm_kernels_avx2()};
    for (size_t li = 0; li < 2; li++) {
        const size_t n = lens[li];
        float *x = rand_floats(n, &rng, 1.0f);
        flm_matvec_job jobs[6];
        float *want[6];
        for (size_t j = 0; j < 6; j++) {
            size_t r = li ? (rows[j] + 15) / 16 : rows[j];
            jobs[j] = (flm_matvec_job){.type = types[j], .rows = r, .y = malloc(r * sizeof(float))};
            jobs[j].W = rand_blocks(types[j], r * n / flm_type_block_elems(types[j]), &rng);
            want[j] = malloc(r * sizeof(float));
            assert_true(jobs[j].y && want[j]);
        }
        for (int k = 0; k < 2; k++) {
            if (!tabs[k]) continue;
            for (size_t j = 0; j < 6; j++) flm_matvec(tabs[k], types[j], jobs[j].W, jobs[j].rows, n, x, want[j], 1);
            for (int th = 1; th <= 3; th++)
                for (size_t nj = 1; nj <= 6; nj += 5) {
                    for (size_t j = 0; j < nj; j++)
                        for (size_t r = 0; r < jobs[j].rows; r++) jobs[j].y[r] = NAN;
                    flm_matvec_multi(tabs[k], jobs, nj, n, x, th);
                    for (size_t j = 0; j < nj; j++)
                        if (memcmp(jobs[j].y, want[j], jobs[j].rows * sizeof(float)) != 0)
                            fail_msg("matvec_multi (%s, %d threads, %zu jobs, n=%zu): job %zu (%s) differs from "
                                     "flm_matvec", tabs[k]->name, th, nj, n, j, flm_type_name(types[j]));
                }
        }
        for (size_t j = 0; j < 6; j++) {
            free((void *)jobs[j].W);
            free(jobs[j].y);
            free(want[j]);
        }
        free(x);
    }
}

/* The bundle FFN with quantized x (one quantization per call, per activation type): up/gate/down of mixed types,
 * gated SiLU and ungated ReLU, against a double-precision FFN on the dequantized weights and the float x. */
static void test_ffn_bundles_mixed(void **state) {
    (void)state;
    uint64_t rng = 21;
    const uint32_t d = 512, n = 96;
    static const uint32_t combos[][3] = {/* up, gate, down */
                                         {FLM_TYPE_Q4_1, FLM_TYPE_Q5_0, FLM_TYPE_Q8_0},
                                         {FLM_TYPE_Q4_K, FLM_TYPE_Q6_K, FLM_TYPE_Q4_K},
                                         {FLM_TYPE_Q5_0, FLM_TYPE_Q5_0, FLM_TYPE_Q6_K},
                                         {FLM_TYPE_F16, FLM_TYPE_Q4_0, FLM_TYPE_Q4_1}};
    const flm_kernels *tabs[2] = {flm_kernels_scalar(), flm_kernels_avx2()};
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++)
        for (int gated = 0; gated < 2; gated++) {
            flm_bundle_desc b = {.d_model = d, .up_type = combos[c][0], .gate_type = gated ? combos[c][1] : 0,
                                 .down_type = combos[c][2], .gated = gated,
                                 .act = gated ? FLM_ACT_SILU : FLM_ACT_RELU};
            size_t ub = flm_row_bytes(b.up_type, d), gb = gated ? flm_row_bytes(b.gate_type, d) : 0,
                   db = flm_row_bytes(b.down_type, d);
            b.up_off = 0, b.gate_off = ub, b.down_off = ub + gb, b.record_bytes = ub + gb + db;
            uint8_t *rec = malloc(n * b.record_bytes);
            assert_non_null(rec);
            for (uint32_t i = 0; i < n; i++) {
                uint8_t *r = rec + i * b.record_bytes;
                uint8_t *u = rand_blocks(b.up_type, d / flm_type_block_elems(b.up_type), &rng);
                uint8_t *dn = rand_blocks(b.down_type, d / flm_type_block_elems(b.down_type), &rng);
                memcpy(r + b.up_off, u, ub);
                memcpy(r + b.down_off, dn, db);
                free(u);
                free(dn);
                if (gated) {
                    uint8_t *g = rand_blocks(b.gate_type, d / flm_type_block_elems(b.gate_type), &rng);
                    memcpy(r + b.gate_off, g, gb);
                    free(g);
                }
            }
            float *x = rand_floats(d, &rng, 2.0f), *w = malloc(d * sizeof(float));
            double *want = calloc(d, sizeof(double)), *mag = calloc(d, sizeof(double));
            assert_true(w && want && mag);
            for (uint32_t i = 0; i < n; i++) {
                const uint8_t *r = rec + i * b.record_bytes;
                double up = 0, g = 0, h;
                tabs[0]->dequant[b.up_type](r + b.up_off, w, d);
                for (uint32_t j = 0; j < d; j++) up += (double)w[j] * x[j];
                if (gated) {
                    tabs[0]->dequant[b.gate_type](r + b.gate_off, w, d);
                    for (uint32_t j = 0; j < d; j++) g += (double)w[j] * x[j];
                    h = g / (1.0 + exp(-g)) * up;
                } else {
                    h = up > 0 ? up : 0;
                }
                tabs[0]->dequant[b.down_type](r + b.down_off, w, d);
                for (uint32_t j = 0; j < d; j++) want[j] += h * w[j], mag[j] += fabs(h * w[j]);
            }
            double scale = 0;
            for (uint32_t j = 0; j < d; j++) scale = fmax(scale, mag[j]);
            float *out = malloc(d * sizeof(float)), *out1 = malloc(d * sizeof(float)), *h = malloc(n * sizeof(float));
            float *acc = malloc(3 * d * sizeof(float));
            assert_true(out && out1 && h && acc);
            for (int k = 0; k < 2; k++) {
                if (!tabs[k]) continue;
                for (int th = 1; th <= 3; th++) {
                    flm_ffn_bundles(tabs[k], &b, rec, NULL, n, x, th == 1 ? out1 : out, h, acc, th, NULL);
                    const float *o = th == 1 ? out1 : out;
                    for (uint32_t j = 0; j < d; j++)
                        /* int8 x: ~1e-2 of the magnitudes; float sums besides */
                        if (!(fabs(o[j] - want[j]) <= 3e-2 * scale + 1e-6))
                            fail_msg("ffn %s/%s/%s %s (%s, %d threads) out[%u]: %.9g, double %.9g (scale %.3g)",
                                     flm_type_name(b.up_type), gated ? flm_type_name(b.gate_type) : "-",
                                     flm_type_name(b.down_type), gated ? "silu" : "relu", tabs[k]->name, th, j, o[j],
                                     want[j], scale);
                }
            }
            free(rec);
            free(x);
            free(w);
            free(want);
            free(mag);
            free(out);
            free(out1);
            free(h);
            free(acc);
        }
}

/* axpy of every type: y += a * dequant(row), to float rounding, scalar and AVX2. */
static void test_axpy_all_types(void **state) {
    (void)state;
    uint64_t rng = 4;
    const flm_kernels *tabs[2] = {flm_kernels_scalar(), flm_kernels_avx2()};
    for (size_t i = 0; i < N_TENSOR_TYPES; i++) {
        uint32_t t = tensor_types[i];
        const size_t n = 768;
        uint8_t *row = rand_blocks(t, n / flm_type_block_elems(t), &rng);
        float *w = malloc(n * sizeof(float)), *y0 = rand_floats(n, &rng, 2.0f), *y = malloc(n * sizeof(float));
        assert_true(w && y);
        flm_kernels_scalar()->dequant[t](row, w, n);
        const float a = -1.75f;
        for (int k = 0; k < 2; k++) {
            if (!tabs[k]) continue;
            memcpy(y, y0, n * sizeof(float));
            tabs[k]->axpy[t](row, a, y, n);
            for (size_t j = 0; j < n; j++) {
                double want = (double)y0[j] + (double)a * w[j];
                if (!(fabs(y[j] - want) <= 1e-6 * (fabs(y0[j]) + fabs((double)a * w[j])) + 1e-30))
                    fail_msg("%s axpy (%s) element %zu: %.9g want %.9g", flm_type_name(t), tabs[k]->name, j, y[j],
                             want);
            }
        }
        free(row);
        free(w);
        free(y0);
        free(y);
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * (c) real tensors from the downloaded models
 * ------------------------------------------------------------------------------------------------------------- */
static void test_real_tensors(void **state) {
    (void)state;
    need_oracle();
    static const char *models[] = {"smollm2-135m", "qwen2.5-coder-0.5b", "gemma-3-270m", "qwen2.5-coder-1.5b"};
    const char *home = getenv("HOME"), *req = getenv("FLASHLM_REQUIRE_MODELS");
    const bool require = req && strcmp(req, "1") == 0;
    bool seen[FLM_N_TYPES] = {0};
    size_t opened = 0;
    uint64_t rng = 2024;
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/.cache/flashlm/models/%s.gguf", home ? home : "", models[mi]);
        FILE *fp = fopen(path, "rb");
        if (!fp) {
            if (require) fail_msg("%s is absent and FLASHLM_REQUIRE_MODELS=1", path);
            print_message("skipping absent %s\n", path);
            continue;
        }
        fclose(fp);
        flm_gguf_file *g = NULL;
        flm_error err;
        if (flm_gguf_open(path, &g, &err) != FLM_OK) fail_msg("%s", err.msg);
        opened++;
        for (uint64_t ti = 0; ti < g->n_tensors; ti++) {
            const flm_gguf_tensor *t = &g->tensors[ti];
            if (t->type >= FLM_N_TYPES || seen[t->type]) continue;
            seen[t->type] = true;
            /* a slice of rows from the middle of the tensor, about 256 KiB at most */
            const size_t rb = flm_row_bytes(t->type, t->ne[0]), rows = t->n_elements / t->ne[0];
            size_t take = (256 << 10) / rb;
            if (take < 1) take = 1;
            if (take > rows) take = rows;
            size_t r0 = (rows - take) / 2;
            const uint8_t *data = t->data + r0 * rb;
            char what[300];
            snprintf(what, sizeof what, "%s: %s rows %zu..%zu", models[mi], t->name, r0, r0 + take - 1);
            check_against_oracle(t->type, data, take * rb / flm_type_block_bytes(t->type), what);
            /* the dot products on real weights, with a realistic activation vector */
            float *x = rand_floats(t->ne[0], &rng, 1.0f);
            for (size_t r = 0; r < take && r < 4; r++) check_dots(t->type, data + r * rb, x, t->ne[0], what, true);
            free(x);
            print_message("%s: %s ok\n", what, flm_type_name(t->type));
        }
        flm_gguf_close(g);
    }
    if (!opened) {
        print_message("skipped: no model under ~/.cache/flashlm/models/\n");
        skip();
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traits),
        cmocka_unit_test(test_dequant_oracle),
        cmocka_unit_test(test_quantize_oracle),
        cmocka_unit_test(test_act_quantize),
        cmocka_unit_test(test_act_quantize_simd),
        cmocka_unit_test(test_vec_dot),
        cmocka_unit_test(test_matvec_all_types),
        cmocka_unit_test(test_matvec_multi),
        cmocka_unit_test(test_ffn_bundles_mixed),
        cmocka_unit_test(test_axpy_all_types),
        cmocka_unit_test(test_real_tensors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
