/* test_arena.c — core/arena.h: one block, carved with alignment, refusing what does not fit; and the FFN storage of
 * the streaming modes carved from one block of exactly the planned size. */
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "convert/convert.h"
#include "core/arena.h"
#include "runtime/runtime.h"

static void test_carve_and_refuse(void **state) {
    (void)state;
    flm_arena a;
    assert_int_equal(flm_arena_init(&a, 10000), 0);
    assert_int_equal(a.size, 12288); /* rounded up to 4096 */
    assert_int_equal((uintptr_t)a.base % FLM_ARENA_ALIGN, 0);
    uint8_t *p = flm_arena_alloc(&a, 100, 1);
    assert_ptr_equal(p, a.base);
    uint8_t *q = flm_arena_alloc(&a, 8, 64);
    assert_ptr_equal(q, a.base + 128); /* 100 rounded up to 64 */
    uint8_t *r = flm_arena_alloc(&a, 4096, 4096);
    assert_ptr_equal(r, a.base + 4096);
    memset(p, 1, 100); memset(r, 2, 4096);
    assert_null(flm_arena_alloc(&a, 4097, 4096)); /* 4096 left after 8192: one byte too many */
    assert_int_equal(a.used, 8192);               /* a refusal changes nothing */
    assert_non_null(flm_arena_alloc(&a, 4096, 4096));
    assert_null(flm_arena_alloc(&a, 1, 1));
    assert_non_null(flm_arena_alloc(&a, 0, 1));
    flm_arena_free(&a);
    assert_null(a.base);
    assert_null(flm_arena_alloc(&a, 1, 1)); /* empty */
    assert_int_equal(flm_arena_init(&a, 0), 0);
    assert_null(flm_arena_alloc(&a, 1, 1));
    flm_arena_free(&a);
}

/* hybrid on stories260K under 1 MiB: the resident layers and the stream buffer fill the FFN block exactly. */
static void test_ffn_storage_is_the_plan(void **state) {
    (void)state;
    const char *path = tu_tmp("arena", ".flm");
    flm_error err;
    assert_int_equal(flm_convert(tu_data("models/stories260K/stories260K.gguf"), path, NULL, NULL, &err), FLM_OK);
    const flm_mode modes[] = {FLM_MODE_RAM, FLM_MODE_NAIVE, FLM_MODE_HYBRID};
    for (int i = 0; i < 3; i++) {
        flm_params p;
        flm_params_default(&p);
        p.n_threads = 1;
        p.n_ctx = 32;
        p.mode = modes[i];
        p.mem_bytes = modes[i] == FLM_MODE_RAM ? 0 : (1u << 20);
        flm_ctx *ctx = NULL;
        if (flm_open(path, &p, &ctx, &err)) fail_msg("%s: %s", flm_mode_name(modes[i]), err.msg);
        const flm_flash *fl = ctx->flash;
        uint64_t planned = fl->plan.ffn_resident + fl->plan.stream;
        print_message("%s: %u resident layers, FFN storage %llu bytes planned, %llu carved\n",
                      flm_mode_name(modes[i]), fl->plan.n_resident_layers, (unsigned long long)planned,
                      (unsigned long long)fl->ffn_mem.used);
        assert_true(planned > 0);
        assert_int_equal(fl->ffn_mem.size, planned);
        assert_int_equal(fl->ffn_mem.used, planned);
        if (modes[i] == FLM_MODE_HYBRID) {
            assert_true(fl->plan.n_resident_layers > 0 && fl->plan.n_resident_layers < 5);
        }
        /* the KV cache, activations and statistics ring: one block, the KV cache at its start */
        /* f16 keys and values by default (--kv-f32 off): half the bytes of the f32 cache */
        assert_int_equal(ctx->be.kv.elem_bytes, FLM_KV_F16);
        uint64_t kv = flm_kv_cache_bytes(5, 32, ctx->model->hp.n_kv_heads * ctx->model->hp.head_dim, FLM_KV_F16);
        assert_int_equal(2 * kv, flm_kv_cache_bytes(5, 32, ctx->model->hp.n_kv_heads * ctx->model->hp.head_dim,
                                                    FLM_KV_F32));
        assert_ptr_equal((uint8_t *)ctx->be.kv.k, ctx->mem.base);
        assert_ptr_equal((uint8_t *)ctx->be.kv.v, ctx->mem.base + kv / 2);
        assert_true(ctx->mem.used >= kv + flm_scratch_bytes(&ctx->model->hp, 32, (uint32_t)ctx->params.n_batch, ctx->params.n_threads));
        assert_true(ctx->mem.used <= ctx->mem.size);
        assert_true((uint8_t *)ctx->tokens + FLM_STATS_TOKENS * sizeof *ctx->tokens <= ctx->mem.base + ctx->mem.used);
        const float *logits;
        assert_int_equal(flm_eval(ctx, 1, 0, &logits, &err), FLM_OK);
        flm_close(ctx);
    }
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_carve_and_refuse),
        cmocka_unit_test(test_ffn_storage_is_the_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
