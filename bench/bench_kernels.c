/* bench_kernels.c — micro-benchmark of flm_matvec on F16 weights (the decode hot path).
 *
 * For each shape (rows x n) and thread count it reports ms per matvec and the weight bytes streamed per second, in
 * two settings: "cold", cycling through enough copies of the matrix (>= 256 MiB) that every pass comes from DRAM
 * rather than the last-level cache, and "hot", the same matrix again and again (it may sit in L3).
 *
 * Usage: bench_kernels [seconds-per-case]   (default 0.5). FLM_KERNELS=scalar benchmarks the reference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compute/kernels.h"
#include "core/types.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs matvecs over `copies` matrices round-robin for about `secs`; returns seconds per matvec. */
static double time_matvec(const flm_kernels *k, uint8_t *const *W, size_t copies, size_t rows, size_t n,
                          const float *x, float *y, int threads, double secs) {
    for (size_t c = 0; c < copies; c++) flm_matvec(k, FLM_TYPE_F16, W[c], rows, n, x, y, threads); /* warm up */
    size_t iters = 0;
    double t0 = now_s(), t;
    do {
        for (size_t c = 0; c < copies; c++, iters++) flm_matvec(k, FLM_TYPE_F16, W[c], rows, n, x, y, threads);
        t = now_s() - t0;
    } while (t < secs);
    return t / (double)iters;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 0.5;
    const flm_kernels *k = flm_kernels_best();
    static const size_t shapes[][2] = {{5632, 2048}, {2048, 5632}}; /* rows x n: FFN up/gate, FFN down */
    static const int threads[] = {1, 2};
    printf("kernels: %s\n", k->name);
    printf("%-12s %-4s %-7s %10s %10s\n", "shape", "thr", "mode", "ms", "GB/s");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        size_t rows = shapes[s][0], n = shapes[s][1];
        size_t bytes = rows * flm_row_bytes(FLM_TYPE_F16, n);
        size_t copies = ((size_t)256 << 20) / bytes + 1;
        uint8_t **W = malloc(copies * sizeof *W);
        float *x = malloc(n * sizeof(float)), *y = malloc(rows * sizeof(float));
        if (!W || !x || !y) return 1;
        for (size_t c = 0; c < copies; c++) {
            W[c] = malloc(bytes);
            if (!W[c]) return 1;
            uint16_t *h = (uint16_t *)W[c];
            for (size_t i = 0; i < bytes / 2; i++)
                h[i] = flm_f32_to_f16((float)((i * 2654435761u + c) % 2001) * 1e-3f - 1.0f);
        }
        for (size_t i = 0; i < n; i++) x[i] = (float)(i % 17) * 0.1f - 0.8f;
        for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
            for (int hot = 0; hot < 2; hot++) {
                double sec = time_matvec(k, W, hot ? 1 : copies, rows, n, x, y, threads[ti], secs);
                char shape[32];
                snprintf(shape, sizeof shape, "%zux%zu", rows, n);
                printf("%-12s %-4d %-7s %10.3f %10.2f\n", shape, threads[ti], hot ? "hot" : "cold", sec * 1e3,
                       (double)bytes / sec * 1e-9);
            }
        }
        for (size_t c = 0; c < copies; c++) free(W[c]);
        free(W);
        free(x);
        free(y);
    }
    return 0;
}
