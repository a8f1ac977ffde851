/* matmat_rows.c — what a batched matrix product (flm_matmat, the joined decode step of `serve --parallel`) costs per
 * row count: ROWS x N weights of TYPE against NX activation rows, one thread, at the level FLASHLM_KERNELS names
 * (default: the CPU's best). Prints ms per call (the fastest round through the copies) and ms per call per activation row, the weights cycling through
 * enough copies (>= 160 MiB) that they come from DRAM, as a decode's do.
 *   matmat_rows TYPE ROWS N [SECONDS [NX ...]]     e.g. matmat_rows q8_0 151936 896 1 1 2 4 8 (NX 1..32)
 * With KI_STOP set it runs one call per NX between two SIGSTOPs instead (for bench/step_count.c, which counts the
 * instructions natively: valgrind 3.19 has no AVX-512), or under callgrind with --toggle-collect=run_matmat. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compute/kernels.h"
#include "compute/work.h"
#include "core/arena.h"
#include "core/types.h"

#define MAX_NX 32 /* activation rows at most: a verification pass of a draft tree (12-17 rows), a prompt's tile */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

__attribute__((noinline)) void run_matmat(const flm_kernels *k, uint32_t t, const void *W, size_t rows, size_t n,
                                          const float *X, size_t nx, float *Y, flm_arena *ws) {
    flm_matmat(k, t, W, rows, n, X, n, nx, Y, rows, 1, ws);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: matmat_rows TYPE ROWS N [SECONDS [NX ...]]\n");
        return 2;
    }
    uint32_t t = 0;
    while (t < FLM_N_TYPES && !(flm_type_name(t) && strcmp(flm_type_name(t), argv[1]) == 0)) t++;
    const flm_kernels *k = flm_kernels_best();
    const size_t rows = (size_t)atol(argv[2]), n = (size_t)atol(argv[3]);
    if (t == FLM_N_TYPES || !k->vec_dot[t] || !rows || !flm_act_bytes(t, n)) {
        fprintf(stderr, "matmat_rows: type %s or shape %zu x %zu unavailable\n", argv[1], rows, n);
        return 2;
    }
    const double secs = argc > 4 ? atof(argv[4]) : 1.0;
    const size_t bytes = rows * flm_row_bytes(t, n);
    const size_t copies = getenv("KI_STOP") ? 1 : (size_t)(160u << 20) / bytes + 1;
    uint8_t **W = malloc(copies * sizeof *W);
    float *X = malloc(MAX_NX * n * sizeof(float)), *Y = malloc(MAX_NX * rows * sizeof(float));
    flm_arena ws;
    if (!W || !X || !Y || flm_arena_init(&ws, 64u << 20) != 0) return 1;
    uint64_t s = 88172645463325252ull;
    for (size_t c = 0; c < copies; c++) {
        if (!(W[c] = malloc(bytes))) return 1;
        for (size_t i = 0; i < bytes; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            W[c][i] = (uint8_t)s;
        }
        for (size_t i = 0; i + 1 < bytes; i += 2) /* no inf / nan f16 scales */
            if ((W[c][i + 1] & 0x7c) == 0x7c) W[c][i + 1] &= 0x3f;
    }
    for (size_t i = 0; i < MAX_NX * n; i++) X[i] = (float)((int)(i * 7919 % 2001) - 1000) / 1000.0f;
    const int stops = getenv("KI_STOP") != NULL;
    for (int a = 5; a < argc || a == 5; a++) {
        const size_t nx = argc > 5 ? (size_t)atol(argv[a]) : 1;
        if (nx < 1 || nx > MAX_NX) {
            fprintf(stderr, "matmat_rows: NX %s is not 1..%d\n", argv[a], MAX_NX);
            return 2;
        }
        if (stops) {
            raise(SIGSTOP);
            run_matmat(k, t, W[0], rows, n, X, nx, Y, &ws);
            raise(SIGSTOP);
            printf("%s %s %zux%zu nx=%zu y0=%g\n", k->name, argv[1], rows, n, nx, (double)Y[0]);
            return 0;
        }
        for (size_t c = 0; c < copies; c++) run_matmat(k, t, W[c], rows, n, X, nx, Y, &ws);
        /* the fastest round through the copies: the least disturbed by other processes on a shared machine */
        double best = 1e30, t0 = now_s();
        do {
            const double r0 = now_s();
            for (size_t c = 0; c < copies; c++) run_matmat(k, t, W[c], rows, n, X, nx, Y, &ws);
            const double r = (now_s() - r0) / (double)copies;
            if (r < best) best = r;
        } while (now_s() - t0 < secs);
        const double ms = best * 1e3;
        printf("%s %s %zux%zu nx=%zu: %.3f ms/call  %.3f ms/row  (%.2f GB/s of weights)\n", k->name, argv[1], rows, n,
               nx, ms, ms / (double)nx, (double)bytes / (ms * 1e-3) * 1e-9);
    }
    for (size_t c = 0; c < copies; c++) free(W[c]);
    free(W), free(X), free(Y);
    flm_arena_free(&ws);
    return 0;
}
