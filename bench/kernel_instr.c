/* kernel_instr.c — one kernel, one level, for instruction counts: runs vec_dot of TYPE at LEVEL (kernels.h names)
 * over REPS rows of 4096 weights inside run_kernel(), the function to count. Measure it with
 *   valgrind --tool=callgrind --toggle-collect=run_kernel build/kernel_instr LEVEL TYPE [REPS]
 * and divide the instructions by REPS * 16 for instructions per 256 weights (the activation is quantized outside
 * run_kernel). With a fifth argument NX, it runs the level's tiled dot (vec_dot_tile) instead: REPS rows against NX
 * tokens, inside run_tile(); divide by REPS * 16 * NX for instructions per 256 weights and token:
 *   valgrind --tool=callgrind --toggle-collect=run_tile build/kernel_instr LEVEL TYPE REPS NX Valgrind 3.19 emulates no AVX-512: under it only scalar and avx2 exist (the levels above are
 * refused, exit 2). For those, bench/step_count.c counts the instructions natively by single-stepping:
 *   build/step_count build/kernel_instr LEVEL TYPE REPS   (with KI_STOP set it stops itself around run_kernel)
 * With TYPE an FFN activation (silu, relu, gelu, gelu_erf, relu2: compute/act.h) or round_f16, it runs the level's
 * act (gated) or round_f16 REPS times over the same 4096 floats in [-8, 8] inside run_act(); divide by REPS * 4096
 * for instructions per element:
 *   valgrind --tool=callgrind --toggle-collect=run_act build/kernel_instr LEVEL gelu 256 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/kernels.h"
#include "compute/work.h"
#include "core/types.h"

#define N 4096

__attribute__((noinline)) float run_kernel(flm_vec_dot_fn f, const uint8_t *W, size_t stride, const void *xq,
                                           int reps) {
    float s = 0.0f;
    for (int r = 0; r < reps; r++) s += f(W + (size_t)(r % 64) * stride, xq, N);
    return s;
}

__attribute__((noinline)) float run_tile(flm_vec_dot_tile_fn f, const uint8_t *W, size_t stride, const void *xq,
                                         size_t x_stride, size_t nx, int reps, float *Y, void *tmp) {
    for (int r = 0; r < reps; r += 64)
        f(W, stride, reps - r < 64 ? (size_t)(reps - r) : 64, xq, x_stride, nx, N, Y, 64, tmp);
    return Y[0];
}

__attribute__((noinline)) float run_act(const flm_kernels *k, int a, float *h, const float *x, const float *u,
                                        int reps) {
    for (int r = 0; r < reps; r++) {
        if (a < 0) k->round_f16(h, x, N);
        else k->act((flm_act)a, h, x, u, N);
    }
    return h[1];
}

/* TYPE as an activation name (0..4) or round_f16 (-1); -2 for anything else */
static int act_of(const char *name) {
    if (strcmp(name, "round_f16") == 0) return -1;
    for (int a = 0; a <= FLM_ACT_RELU2; a++)
        if (strcmp(name, flm_act_name((flm_act)a)) == 0) return a;
    return -2;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: kernel_instr LEVEL TYPE [REPS]\n");
        return 2;
    }
    const int l = flm_kernel_level_parse(argv[1]);
    const flm_kernels *k = l < 0 ? NULL : flm_kernels_for_level((flm_kernel_level)l);
    const int act = act_of(argv[2]);
    if (k && act > -2) {
        const int reps = argc > 3 ? atoi(argv[3]) : 256;
        float *h = malloc(N * sizeof(float)), *x = malloc(N * sizeof(float)), *u = malloc(N * sizeof(float));
        if (!h || !x || !u) return 1;
        for (size_t i = 0; i < N; i++) x[i] = (float)((int)(i * 7919 % 2001) - 1000) / 125.0f, u[i] = 1.0f;
        printf("%s %s: %g\n", k->name, argv[2], (double)run_act(k, act, h, x, u, reps));
        return 0;
    }
    uint32_t t = 0;
    while (t < FLM_N_TYPES && !(flm_type_name(t) && strcmp(flm_type_name(t), argv[2]) == 0)) t++;
    if (!k || t == FLM_N_TYPES || !k->vec_dot[t]) {
        fprintf(stderr, "kernel_instr: level %s or type %s unavailable\n", argv[1], argv[2]);
        return 2;
    }
    const int reps = argc > 3 ? atoi(argv[3]) : 1024;
    const size_t stride = flm_row_bytes(t, N);
    uint8_t *W = malloc(64 * stride);
    float *x = malloc(N * sizeof(float));
    const size_t nx = argc > 4 ? (size_t)atoi(argv[4]) : 0, ab = flm_act_bytes(t, N);
    if (argc > 4 && (nx < 1 || nx > 64 || !k->vec_dot_tile[t])) {
        fprintf(stderr, "kernel_instr: no tiled dot of %s at level %s (or NX outside 1..64)\n", argv[2], argv[1]);
        return 2;
    }
    uint8_t *xq = malloc(ab * (nx ? nx : 1));
    float *Y = malloc(64 * 64 * sizeof(float));
    if (!W || !x || !xq || !Y) return 1;
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < 64 * stride; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        W[i] = (uint8_t)s;
    }
    /* small finite f16 scales where the blocks keep them: rewrite every 2-byte field that decodes to inf/nan */
    for (size_t i = 0; i + 1 < 64 * stride; i += 2)
        if ((W[i + 1] & 0x7c) == 0x7c) W[i + 1] &= 0x3f;
    for (size_t i = 0; i < N; i++) x[i] = (float)((int)(i * 7919 % 2001) - 1000) / 1000.0f;
    flm_act_quantize(t, x, N, xq);
    for (size_t b = 1; b < nx; b++) memcpy(xq + b * ab, xq, ab);
    const bool stops = getenv("KI_STOP") != NULL; /* for bench/step_count.c: stopped just before and after */
    if (stops) raise(SIGSTOP);
    void *tmp = nx ? aligned_alloc(64, flm_tile_tmp_bytes(N, nx) + 64) : NULL; /* what flm_matmat carves */
    const float r = nx ? run_tile(k->vec_dot_tile[t], W, stride, xq, ab, nx, reps, Y, tmp)
                       : run_kernel(k->vec_dot[t], W, stride, xq, reps);
    if (stops) raise(SIGSTOP);
    printf("%s %s: %g\n", k->name, argv[2], (double)r);
    free(tmp);
    return 0;
}
