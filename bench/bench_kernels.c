/* bench_kernels.c — micro-benchmark of flm_matvec per tensor type (the decode hot path).
 *
 * For each type, shape (rows x n) and thread count it reports ms per matvec and the weight bytes streamed per
 * second, in two settings: "cold", cycling through enough copies of the matrix (>= 160 MiB) that every pass comes
 * from DRAM rather than the last-level cache, and "hot", the same matrix again and again (it may sit in L3).
 * The matvec includes quantizing x into the type's activation type once, as the engine does.
 *
 * Usage: bench_kernels [seconds-per-case [type ...]]   (default 0.5 s, all types; e.g. bench_kernels 1 q4_k q6_k)
 * FLASHLM_KERNELS=scalar|avx2|avxvnni|avx512|vnni benchmarks that level (kernels.h). */
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
static double time_matvec(const flm_kernels *k, uint32_t t, uint8_t *const *W, size_t copies, size_t rows, size_t n,
                          const float *x, float *y, int threads, double secs) {
    for (size_t c = 0; c < copies; c++) flm_matvec(k, t, W[c], rows, n, x, y, threads); /* warm up */
    size_t iters = 0;
    double t0 = now_s(), el;
    do {
        for (size_t c = 0; c < copies; c++, iters++) flm_matvec(k, t, W[c], rows, n, x, y, threads);
        el = now_s() - t0;
    } while (el < secs);
    return el / (double)iters;
}

/* Random but valid weights: float types get values in [-1, 1]; quantized types random bytes with every f16 scale
 * field set to a small finite value (the scale fields' offsets are those of core/types.h). */
static void fill(uint32_t t, uint8_t *p, size_t bytes, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < bytes; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[i] = (uint8_t)s;
    }
    const flm_type_traits *tt = flm_type_traits_of(t);
    const uint16_t d = flm_f32_to_f16(0.01f);
    if (!tt->is_quantized) {
        for (size_t i = 0; i < bytes / tt->block_bytes; i++) {
            float v = (float)(p[i * tt->block_bytes] % 200) * 0.01f - 1.0f;
            if (t == FLM_TYPE_F32) memcpy(p + i * 4, &v, 4);
            else {
                uint16_t h = t == FLM_TYPE_F16 ? flm_f32_to_f16(v) : flm_f32_to_bf16(v);
                memcpy(p + i * 2, &h, 2);
            }
        }
        return;
    }
    int off[2] = {0, -1};
    switch (t) {
    case FLM_TYPE_Q4_1: case FLM_TYPE_Q5_1: case FLM_TYPE_Q4_K: case FLM_TYPE_Q5_K: off[1] = 2; break;
    case FLM_TYPE_Q2_K: off[0] = 80, off[1] = 82; break;
    case FLM_TYPE_Q3_K: off[0] = 108; break;
    case FLM_TYPE_Q6_K: off[0] = 208; break;
    default: break;
    }
    for (size_t b = 0; b < bytes / tt->block_bytes; b++)
        for (int k = 0; k < 2; k++)
            if (off[k] >= 0) memcpy(p + b * tt->block_bytes + off[k], &d, 2);
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 0.5;
    const flm_kernels *k = flm_kernels_best();
    static const uint32_t all[] = {FLM_TYPE_F32,  FLM_TYPE_F16,  FLM_TYPE_BF16, FLM_TYPE_Q8_0, FLM_TYPE_Q4_0,
                                   FLM_TYPE_Q4_1, FLM_TYPE_Q5_0, FLM_TYPE_Q5_1, FLM_TYPE_Q2_K, FLM_TYPE_Q3_K,
                                   FLM_TYPE_Q4_K, FLM_TYPE_Q5_K, FLM_TYPE_Q6_K};
    uint32_t types[sizeof all / sizeof all[0]];
    size_t nt = 0;
    if (argc > 2) {
        for (int a = 2; a < argc; a++) {
            size_t i = 0;
            while (i < sizeof all / sizeof all[0] && strcmp(argv[a], flm_type_name(all[i]))) i++;
            if (i == sizeof all / sizeof all[0]) {
                fprintf(stderr, "bench_kernels: unknown type '%s'\n", argv[a]);
                return 2;
            }
            types[nt++] = all[i];
        }
    } else {
        memcpy(types, all, sizeof all);
        nt = sizeof all / sizeof all[0];
    }
    /* rows x n: an FFN up/gate and an FFN down of Qwen2.5-1.5B (multiples of 256) */
    static const size_t shapes[][2] = {{8960, 1536}, {1536, 8960}};
    static const int threads[] = {1, 2};
    printf("kernels: %s\n", k->name);
    printf("%-6s %-12s %-4s %-5s %10s %10s\n", "type", "shape", "thr", "mode", "ms", "GB/s");
    for (size_t ti = 0; ti < nt; ti++) {
        const uint32_t t = types[ti];
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            size_t rows = shapes[s][0], n = shapes[s][1];
            size_t bytes = rows * flm_row_bytes(t, n);
            size_t copies = ((size_t)160 << 20) / bytes + 1;
            uint8_t **W = malloc(copies * sizeof *W);
            float *x = malloc(n * sizeof(float)), *y = malloc(rows * sizeof(float));
            if (!W || !x || !y) return 1;
            for (size_t c = 0; c < copies; c++) {
                W[c] = malloc(bytes);
                if (!W[c]) return 1;
                fill(t, W[c], bytes, c + 1);
            }
            for (size_t i = 0; i < n; i++) x[i] = (float)(i % 17) * 0.1f - 0.8f;
            for (size_t thi = 0; thi < sizeof threads / sizeof threads[0]; thi++) {
                for (int hot = 0; hot < 2; hot++) {
                    double sec = time_matvec(k, t, W, hot ? 1 : copies, rows, n, x, y, threads[thi], secs);
                    char shape[32];
                    snprintf(shape, sizeof shape, "%zux%zu", rows, n);
                    printf("%-6s %-12s %-4d %-5s %10.3f %10.2f\n", flm_type_name(t), shape, threads[thi],
                           hot ? "hot" : "cold", sec * 1e3, (double)bytes / sec * 1e-9);
                    fflush(stdout);
                }
            }
            for (size_t c = 0; c < copies; c++) free(W[c]);
            free(W);
            free(x);
            free(y);
        }
    }
    return 0;
}
