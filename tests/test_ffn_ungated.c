/* test_ffn_ungated.c — a plain (ungated) FFN, down(act(up x)), end to end: stories260K with every ffn_gate tensor
 * removed is a valid ungated model. Its GGUF runs the dense FFN; converted to .flm its FFN regions say "no gate" with
 * gate_type FLM_GATE_NONE (not 0, which is F32) and hold up | down records; ram and naive modes give the dense
 * reference's logits. A header whose layers disagree (one gated, one not) is refused. Issue 8, fault 3: before,
 * gate_type 0 meant both "no gate" and F32, and every model was taken as gated. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "convert/convert.h"
#include "flashlm.h"
#include "flashlm_tools.h"
#include "format/flm.h"
#include "format/gguf.h"
#include "write/gguf_write.h"
#include "testutil.h"

#define N_VOCAB 512
#define N_TOKENS 24
static char gguf_ungated[4096], gguf_gated[4096], flm_ungated[4096];

static bool is_gate(const char *name) { return strstr(name, ".ffn_gate.weight") != NULL; }

/* Write src without its ffn_gate tensors to dst. */
static int write_ungated(const char *src, const char *dst) {
    flm_error err;
    flm_gguf_file *g = NULL;
    flm_gguf_writer *w = NULL;
    if (flm_gguf_open(src, &g, &err)) return fprintf(stderr, "%s\n", err.msg), -1;
    flm_status st = flm_gguf_writer_create(dst, FLM_OUT_REPLACE, &w, &err);
    for (uint64_t i = 0; i < g->n_kv && !st; i++) st = flm_gguf_writer_kv_copy(w, &g->kv[i]);
    for (uint64_t i = 0; i < g->n_tensors && !st; i++) {
        const flm_gguf_tensor *t = &g->tensors[i];
        if (!is_gate(t->name)) st = flm_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
    }
    if (!st) st = flm_gguf_writer_begin(w, &err);
    for (uint64_t i = 0; i < g->n_tensors && !st; i++) {
        const flm_gguf_tensor *t = &g->tensors[i];
        if (!is_gate(t->name)) st = flm_gguf_writer_write_tensor(w, t->data, t->nbytes, &err);
    }
    if (!st) st = flm_gguf_writer_finish(w, &err);
    flm_gguf_writer_free(w);
    flm_gguf_close(g);
    return st ? -1 : 0;
}

static int setup(void **state) {
    (void)state;
    snprintf(gguf_gated, sizeof gguf_gated, "%s", tu_data("models/stories260K/stories260K.gguf"));
    snprintf(gguf_ungated, sizeof gguf_ungated, "%s", tu_tmp("ungated", ".gguf"));
    snprintf(flm_ungated, sizeof flm_ungated, "%s", tu_tmp("ungated", ".flm"));
    if (write_ungated(gguf_gated, gguf_ungated)) return -1;
    flm_error err;
    if (flm_convert(gguf_ungated, flm_ungated, NULL, NULL, &err)) return fprintf(stderr, "convert: %s\n", err.msg), -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(gguf_ungated);
    remove(flm_ungated);
    return 0;
}

static flm_ctx *open_model(const char *path, flm_mode mode, uint64_t mem) {
    flm_params p;
    flm_params_default(&p);
    p.kv_f32 = true;
    p.n_threads = 2;
    p.n_ctx = 64;
    p.mode = mode;
    p.mem_bytes = mem;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(path, &p, &ctx, &err)) fail_msg("flm_open(%s, %s): %s", path, flm_mode_name(mode), err.msg);
    return ctx;
}

/* Logits of N_TOKENS tokens (a fixed sequence) into out[N_TOKENS][N_VOCAB]. */
static void run(flm_ctx *ctx, float *out) {
    for (int t = 0; t < N_TOKENS; t++) {
        const float *logits;
        flm_error err;
        int32_t tok = 1 + (t * 37) % (N_VOCAB - 1);
        if (flm_eval(ctx, tok, t, &logits, &err)) fail_msg("eval: %s", err.msg);
        memcpy(out + (size_t)t * N_VOCAB, logits, N_VOCAB * sizeof(float));
    }
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > m) m = d;
    }
    return m;
}

/* The layout: every FFN region says "no gate", and its records are up row | down column only. */
static void test_layout_says_no_gate(void **state) {
    (void)state;
    flm_file *f = NULL;
    flm_error err;
    assert_int_equal(flm_file_open(flm_ungated, &f, &err), FLM_OK);
    assert_int_equal(f->n_layers, 5);
    for (uint32_t l = 0; l < f->n_layers; l++) {
        const flm_region *r = f->ffn[l];
        assert_int_equal(r->gate_type, FLM_GATE_NONE);
        flm_bundle_layout b = flm_bundle_layout_of(64, r->up_type, r->gate_type, r->down_type, false);
        assert_int_equal(b.gate_bytes, 0);
        assert_int_equal(r->record_bytes, b.up_bytes + b.down_bytes);
        assert_int_equal(r->record_bytes, 2 * 64 * 4); /* f32 up row + f32 down column, d_model 64 */
    }
    flm_file_close(f);
    /* the gated original keeps its real gate type: F32, which is 0 */
    char gated_flm[4096];
    snprintf(gated_flm, sizeof gated_flm, "%s", tu_tmp("gated", ".flm"));
    assert_int_equal(flm_convert(gguf_gated, gated_flm, NULL, NULL, &err), FLM_OK);
    assert_int_equal(flm_file_open(gated_flm, &f, &err), FLM_OK);
    assert_int_equal(f->ffn[0]->gate_type, FLM_TYPE_F32);
    assert_int_equal(f->ffn[0]->record_bytes, 3 * 64 * 4);
    flm_file_close(f);
    remove(gated_flm);
}

/* ram and naive modes of the ungated .flm equal its GGUF (dense FFN), which differs from the gated original. */
static void test_modes_match_dense_reference(void **state) {
    (void)state;
    float *dense = malloc(sizeof(float) * N_TOKENS * N_VOCAB), *got = malloc(sizeof(float) * N_TOKENS * N_VOCAB);
    assert_non_null(dense);
    assert_non_null(got);
    flm_ctx *ctx = open_model(gguf_ungated, FLM_MODE_AUTO, 0);
    run(ctx, dense);
    flm_close(ctx);

    ctx = open_model(gguf_gated, FLM_MODE_AUTO, 0);
    run(ctx, got);
    flm_close(ctx);
    double vs_gated = max_diff(dense, got, (size_t)N_TOKENS * N_VOCAB);
    print_message("ungated vs gated original: max |dlogit| %.3f\n", vs_gated);
    assert_true(vs_gated > 0.1); /* the gate is really gone: a different model */

    const flm_mode modes[] = {FLM_MODE_RAM, FLM_MODE_NAIVE};
    for (int i = 0; i < 2; i++) {
        ctx = open_model(flm_ungated, modes[i], modes[i] == FLM_MODE_RAM ? 0 : (1u << 20));
        run(ctx, got);
        flm_close(ctx);
        double d = max_diff(dense, got, (size_t)N_TOKENS * N_VOCAB);
        print_message("%s vs dense: max |dlogit| %.2e\n", flm_mode_name(modes[i]), d);
        assert_true(d < 1e-4); /* f32 weights copied exactly; only the summation order differs */
    }
    free(dense);
    free(got);
}

/* Patch layer 1's gate_type to F32 (0) in the header (re-checksummed): layers disagree, the open is refused. */
static void test_mixed_gating_refused(void **state) {
    (void)state;
    size_t len;
    uint8_t *buf = tu_read_file(flm_ungated, &len);
    uint32_t header_bytes;
    memcpy(&header_bytes, buf + 32, 4);
    /* region 0 is RESIDENT, region 2 is layer 1's FFN; gate_type at byte 36 of a 64-byte entry */
    uint8_t *e = buf + FLM_HEADER_FIXED + 2 * FLM_REGION_ENTRY_BYTES;
    uint32_t kind, layer, gate;
    memcpy(&kind, e, 4);
    memcpy(&layer, e + 4, 4);
    memcpy(&gate, e + 36, 4);
    assert_int_equal(kind, FLM_REGION_FFN);
    assert_int_equal(layer, 1);
    assert_int_equal(gate, FLM_GATE_NONE);
    memset(e + 36, 0, 4);
    uint64_t h = XXH64(buf + 32, header_bytes - 32, 0);
    memcpy(buf + 24, &h, 8);
    const char *bad = tu_tmp("mixed", ".flm");
    tu_write_file(bad, buf, len);
    free(buf);
    flm_params p;
    flm_params_default(&p);
    flm_ctx *ctx = NULL;
    flm_error err;
    assert_int_equal(flm_open(bad, &p, &ctx, &err), FLM_ERR_FORMAT);
    assert_null(ctx);
    assert_non_null(strstr(err.msg, "layer 1"));
    assert_non_null(strstr(err.msg, bad));
    remove(bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_says_no_gate),
        cmocka_unit_test(test_modes_match_dense_reference),
        cmocka_unit_test(test_mixed_gating_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
