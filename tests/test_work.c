/* test_work.c — the token path allocates nothing beyond the plan (docs/ARCHITECTURE.md, "Memory budget"):
 *   - a counting allocator in this test binary (the linker's --wrap of malloc, calloc, realloc, aligned_alloc and
 *     posix_memalign: CMakeLists.txt) sees no allocation by the library while a context evaluates a prompt
 *     batch with every row's logits, decodes, evaluates a tree with and without logits (lazy flm_tree_logits_n),
 *     accepts a path, runs a self-draft tree (mode hot), an embedding (flm_embed) and a flm_evaluate call, in ram,
 *     hot and hybrid (FFN streamed), and SmolLM2-135M
 *     in ram when pulled (at the CPU's best kernel level: the vnni panels' tmp too); and the compute
 *     calls' heap fallback (compute/work.h flm_work_heap_count) is never taken: the work area the plan counts holds
 *     the batch's quantized activations, the attention tiles and the bundle FFN's buffers;
 *   - one token's matrix-vector products past their 16 KiB stack buffer (a row of 32768 elements) take x's quantized
 *     copies from the work area (flm_matvec_ws, flm_matvec_multi_ws), not the heap;
 *   - from outside: `flashlm run` with batches and a self-draft tree, its peak RSS measured by wait4 (the process as a
 *     whole), stays within the budget + FLM_RSS_ALLOWANCE, on stories260K and SmolLM2-135M when pulled.
 * stories260K from tests/data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "testutil.h"
#include "compute/kernels.h"
#include "compute/work.h"
#include "core/arena.h"
#include "core/types.h"

#define MODEL "models/stories260K/stories260K.gguf"
#define TEXT "text/tinystories_sample.txt"
#define N_CTX 256
#define N_NODES 14

/* ---- the counting allocator (--wrap: the library's and this file's calls land here) ---- */
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t s);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
static volatile int g_watch;         /* counting on */
static volatile unsigned long g_allocs; /* allocations seen while counting */
void *__wrap_malloc(size_t n) {
    if (g_watch) g_allocs++;
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t s) {
    if (g_watch) g_allocs++;
    return __real_calloc(n, s);
}
void *__wrap_realloc(void *p, size_t n) {
    if (g_watch) g_allocs++;
    return __real_realloc(p, n);
}
void *__wrap_aligned_alloc(size_t a, size_t n) {
    if (g_watch) g_allocs++;
    return __real_aligned_alloc(a, n);
}
int __wrap_posix_memalign(void **p, size_t a, size_t n) {
    if (g_watch) g_allocs++;
    return __real_posix_memalign(p, a, n);
}

static const int32_t PARENT[N_NODES] = {-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 6, 9, 10};
static char g_hot[4096];

static int setup(void **state) {
    (void)state;
    snprintf(g_hot, sizeof g_hot, "%s", tu_tmp("work-hot", ".flm"));
    flm_error err;
    if (flm_convert(tu_data(MODEL), g_hot, NULL, NULL, &err)) {
        fprintf(stderr, "convert: %s\n", err.msg);
        return -1;
    }
    size_t len;
    char *text = (char *)tu_read_file(tu_data(TEXT), &len);
    text[len < 20000 ? len : 20000] = 0;
    flm_status st = flm_hot_order(g_hot, text, 512, 128, 2, NULL, NULL, &err);
    free(text);
    if (st) {
        fprintf(stderr, "hot order: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(g_hot);
    return 0;
}

/* One round of the token path at position 0: a prompt batch (every row's logits), 4 decoded tokens, a tree with
 * logits, the same tree without (3 nodes' logits at once), a path accepted, and in mode hot a draft tree. */
static void round_trip(flm_ctx *ctx, bool hot, int32_t *ids, uint32_t n, float *rows) {
    flm_error err;
    const float *lg;
    const uint32_t V = tu_vocab(ctx);
    if (flm_eval_batch(ctx, ids, n, 0, rows, &lg, &err)) fail_msg("prompt: %s", err.msg);
    int32_t pos = (int32_t)n;
    for (int i = 0; i < 4; i++, pos++)
        if (flm_eval(ctx, ids[i], pos, &lg, &err)) fail_msg("decode: %s", err.msg);
    int32_t tok[N_NODES];
    for (int i = 0; i < N_NODES; i++) tok[i] = 3 + (i * 37) % (int32_t)(V - 3);
    if (flm_eval_tree(ctx, tok, PARENT, N_NODES, 0, pos, false, rows, &err)) fail_msg("tree: %s", err.msg);
    if (flm_eval_tree(ctx, tok, PARENT, N_NODES, 0, pos, false, NULL, &err)) fail_msg("lazy tree: %s", err.msg);
    const uint32_t nodes[3] = {0, 1, 3};
    if (flm_tree_logits_n(ctx, nodes, 3, rows, &err)) fail_msg("tree logits: %s", err.msg);
    if (flm_tree_accept(ctx, pos, nodes, 3, &err)) fail_msg("accept: %s", err.msg);
    pos += 3;
    if (hot) {
        if (flm_eval_tree(ctx, tok, PARENT, N_NODES, 0, pos, true, rows, &err)) fail_msg("draft tree: %s", err.msg);
        if (flm_eval(ctx, tok[0], pos, &lg, &err)) fail_msg("after the draft: %s", err.msg);
    }
    /* an embedding (serve's /v1/embeddings): its sum and row are the plan's, its passes the batch's; and one call
     * through flm_evaluate, whose statistics come back in its result */
    if (flm_embed(ctx, ids, n, rows, &err)) fail_msg("embedding: %s", err.msg);
    flm_eval_out out;
    if (flm_evaluate(ctx, &(flm_eval_args){.tokens = ids, .n = 3, .pos = (int32_t)n}, &out, &err))
        fail_msg("flm_evaluate: %s", err.msg);
}

static void check_no_alloc(const char *path, flm_mode mode, uint64_t mem, const char *what) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = N_CTX;
    p.n_batch = 32;
    p.mode = mode;
    p.mem_bytes = mem;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(path, &p, &ctx, &err)) fail_msg("open %s (%s): %s", path, what, err.msg);
    int32_t ids[40];
    const uint32_t V = tu_vocab(ctx), n = 30;
    for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)(3 + (i * 101) % (V - 3));
    float *rows = malloc((size_t)N_NODES * 3 * V * sizeof(float));
    assert_non_null(rows);
    round_trip(ctx, mode == FLM_MODE_HOT, ids, n, rows); /* first use: the pool's threads, the kernel table */
    const uint64_t heap0 = flm_work_heap_count();
    g_allocs = 0;
    g_watch = 1;
    round_trip(ctx, mode == FLM_MODE_HOT, ids, n, rows);
    g_watch = 0;
    print_message("%s: %lu allocations on the token path, %llu heap fallbacks of the compute calls\n", what,
                  g_allocs, (unsigned long long)(flm_work_heap_count() - heap0));
    assert_int_equal(g_allocs, 0);
    assert_int_equal(flm_work_heap_count(), heap0);
    /* the counter sees the library's allocations: tokenizing allocates its result */
    g_watch = 1;
    size_t m = 0;
    int32_t *t = flm_tokenize_all(ctx, "Once upon a time", true, &m);
    g_watch = 0;
    assert_non_null(t);
    assert_true(g_allocs > 0);
    free(t);
    free(rows);
    flm_close(ctx);
}

static void test_no_alloc_on_token_path(void **state) {
    (void)state;
    check_no_alloc(tu_data(MODEL), FLM_MODE_RAM, 0, "GGUF, ram");
    const char *smol = tu_model("smollm2-135m"); /* grouped heads of 64 (3 per KV head), a 49k vocabulary */
    if (smol) check_no_alloc(smol, FLM_MODE_RAM, 0, "SmolLM2-135M GGUF, ram");
    check_no_alloc(g_hot, FLM_MODE_RAM, 0, ".flm, ram");
    check_no_alloc(g_hot, FLM_MODE_HOT, 0, ".flm, hot");
    check_no_alloc(g_hot, FLM_MODE_HOT, tu_hot_budget_for_share(g_hot, 0.3, 0.6, N_CTX), ".flm, hot (streamed)");
    /* hybrid with a budget that streams some layers: the plan's smallest that opens, doubled */
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = N_CTX;
    p.n_batch = 32;
    p.mode = FLM_MODE_HYBRID;
    flm_plan_info info;
    flm_error err;
    if (flm_plan(g_hot, &p, &info, &err)) fail_msg("plan: %s", err.msg);
    check_no_alloc(g_hot, FLM_MODE_HYBRID, info.total - info.ffn_resident / 2, ".flm, hybrid (streamed)");
}

/* flm_matvec_ws and flm_matvec_multi_ws past their 16 KiB stack buffer (rows of 32768 elements: q8_0's quantized x
 * takes 34 KiB, q8_K's 36.5 KiB): with a work area of the size the plan gives one token's products
 * (FLM_MATVEC_ACT_MAX * flm_act_bytes_max), nothing is allocated; without one the buffer comes from the heap and is
 * counted (flm_work_heap_count); y is the same bit for bit, and equals flm_matvec's. */
static void test_matvec_work_area(void **state) {
    (void)state;
    const flm_kernels *k = flm_kernels_best();
    const size_t n = 32768, rows = 6;
    const uint32_t types[2] = {FLM_TYPE_Q8_0, FLM_TYPE_Q4_0};
    float *x = malloc(n * sizeof *x), *row = malloc(n * sizeof *row);
    uint8_t *W[2];
    float *want[2], *got[2];
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    for (int j = 0; j < 2; j++) {
        const size_t stride = flm_row_bytes(types[j], n);
        W[j] = malloc(rows * stride);
        want[j] = malloc(rows * sizeof(float));
        got[j] = malloc(rows * sizeof(float));
        for (size_t r = 0; r < rows; r++) {
            for (size_t i = 0; i < n; i++) row[i] = (float)(((i + 7 * r + j) * 40503u) % 997) / 498.5f - 1.0f;
            assert_true(flm_quantize_row(types[j], row, W[j] + r * stride, n));
        }
        flm_matvec(k, types[j], W[j], rows, n, x, want[j], 1); /* the heap path (counted) */
    }
    const size_t wb = FLM_MATVEC_ACT_MAX * flm_act_bytes_max(n);
    uint8_t *area = aligned_alloc(64, wb);
    assert_non_null(area);
    flm_arena ws = {.base = area, .size = wb, .used = 0};
    const flm_matvec_job jobs[2] = {{types[0], W[0], rows, got[0]}, {types[1], W[1], rows, got[1]}};
    const uint64_t heap0 = flm_work_heap_count();
    g_allocs = 0;
    g_watch = 1;
    flm_matvec_ws(k, types[0], W[0], rows, n, x, got[0], 2, &ws);
    g_watch = 0;
    assert_int_equal(g_allocs, 0);
    assert_int_equal(flm_work_heap_count(), heap0);
    assert_int_equal(ws.used, 0); /* given back */
    assert_memory_equal(got[0], want[0], rows * sizeof(float));
    memset(got[0], 0, rows * sizeof(float));
    g_watch = 1;
    flm_matvec_multi_ws(k, jobs, 2, n, x, 2, &ws);
    g_watch = 0;
    assert_int_equal(g_allocs, 0);
    assert_int_equal(flm_work_heap_count(), heap0);
    assert_int_equal(ws.used, 0);
    for (int j = 0; j < 2; j++) assert_memory_equal(got[j], want[j], rows * sizeof(float));
    /* no area: the heap, counted */
    flm_matvec_multi_ws(k, jobs, 2, n, x, 2, NULL);
    assert_true(flm_work_heap_count() > heap0);
    for (int j = 0; j < 2; j++) assert_memory_equal(got[j], want[j], rows * sizeof(float));
    free(area);
    for (int j = 0; j < 2; j++) {
        free(W[j]);
        free(want[j]);
        free(got[j]);
    }
    free(x);
    free(row);
}

/* `flashlm args`'s peak RSS from outside (wait4; KiB -> bytes). Returns the exit status. */
static int run_rss(const char *args, uint64_t *peak) {
    char cmd[20000];
    snprintf(cmd, sizeof cmd, "exec '%s' %s >/dev/null 2>&1", FLM_CLI, args);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    struct rusage ru;
    assert_int_equal(wait4(pid, &st, 0, &ru), pid);
    *peak = (uint64_t)ru.ru_maxrss * 1024;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* batches (-b 32 over a prompt of ~200 tokens) and a self-draft tree under a budget: peak RSS within budget +
 * allowance, and the plan (flm_plan, the same parameters) within the budget */
static void check_rss(const char *path, const char *mode, uint64_t budget, const char *extra) {
    /* a prompt of ~200 tokens: the sample text's first 800 bytes */
    size_t len;
    uint8_t *text = tu_read_file(tu_data(TEXT), &len);
    const char *prompt = tu_tmp("work-prompt", ".txt");
    tu_write_file(prompt, text, len < 800 ? len : 800);
    free(text);
    char args[16384];
    snprintf(args, sizeof args, "run -m '%s' --mode %s --mem %llu -c 512 -b 32 -t 2 -f '%s' -n 24 --temp 0 %s", path,
             mode, (unsigned long long)budget, prompt, extra);
    uint64_t peak = 0;
    const int rc = run_rss(args, &peak);
    if (rc != 0) {
        char more[16400], *out = NULL;
        snprintf(more, sizeof more, "%s 2>&1", args);
        tu_run_cli(more, &out);
        fail_msg("flashlm %s: exit %d: %s", args, rc, out ? out : "");
    }
    remove(prompt);
    print_message("%s --mode %s --mem %.2f MiB %s: peak RSS %.2f MiB\n", path, mode, budget / 1048576.0, extra,
                  peak / 1048576.0);
#ifndef FLM_SANITIZED_BUILD /* shadow memory is not the engine's */
    if (peak > budget + FLM_RSS_ALLOWANCE)
        fail_msg("%s: peak RSS %llu bytes exceeds the budget %llu + the allowance", args, (unsigned long long)peak,
                 (unsigned long long)budget);
#endif
}

static void test_rss_with_batches_and_trees(void **state) {
    (void)state;
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = 512;
    p.n_batch = 32;
    p.mode = FLM_MODE_HOT;
    flm_plan_info info;
    flm_error err;
    if (flm_plan(g_hot, &p, &info, &err)) fail_msg("plan: %s", err.msg);
    /* the self-draft needs neurons streamed: half the FFN out of the budget */
    check_rss(g_hot, "hot", tu_hot_budget_for_share(g_hot, 0.3, 0.6, 512), "--draft-self --draft-tree 12");
    check_rss(g_hot, "ram", info.total + (1u << 20), "");
    const char *smol = tu_model("smollm2-135m");
    if (!smol) return;
    p.mode = FLM_MODE_RAM;
    if (flm_plan(smol, &p, &info, &err)) fail_msg("plan: %s", err.msg);
    check_rss(smol, "ram", info.total + (4u << 20), "");
}

int main(void) {
    /* at the CPU's best kernel level: at vnni the panel tiles pack their rows into a tmp per thread that the caller
     * carves from the work area (compute/work.h flm_tile_tmp_bytes, counted by the plan) */
    /* the RSS check first: a child forked from this process counts this process's pages in its peak until it execs,
     * so the child is started while this process is small */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rss_with_batches_and_trees),
        cmocka_unit_test(test_no_alloc_on_token_path),
        cmocka_unit_test(test_matvec_work_area),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
