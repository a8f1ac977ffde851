#include "compute/ffn_bundle.h"

#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif


/* bundles [i0, i1) into acc (d_model floats, overwritten) */
static void ffn_range(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *records, const uint32_t *rows,
                      size_t i0, size_t i1, const float *x, float *h, float *acc) {
    flm_dot_fn dot_up = k->dot[b->up_type], dot_gate = b->gated ? k->dot[b->gate_type] : NULL;
    flm_axpy_fn axpy_down = k->axpy[b->down_type];
    memset(acc, 0, b->d_model * sizeof(float));
    for (size_t i = i0; i < i1; i++) {
        const uint8_t *rec = records + (rows ? rows[i] : i) * b->record_bytes;
        /* a: the activation that decides; under a CATS threshold a neuron at or below it contributes nothing */
        float a = flm_act_eval(b->act, b->gated ? dot_gate(rec + b->gate_off, x, b->d_model) : dot_up(rec + b->up_off, x,
                                                                                                   b->d_model));
        float v = 0.0f;
        if (a != 0.0f && (b->threshold == 0.0f || fabsf(a) > b->threshold)) /* inactive ReLU neurons: no up row */
            v = b->gated ? a * dot_up(rec + b->up_off, x, b->d_model) : a;
        h[i] = v;
        if (v != 0.0f) axpy_down(rec + b->down_off, v, acc, b->d_model);
    }
}

void flm_ffn_bundles(const flm_kernels *k, const flm_bundle_desc *b, const uint8_t *records, const uint32_t *rows,
                     size_t n, const float *x, float *out, float *h, float *acc, int n_threads) {
    int nt = n_threads;
    if (nt < 1 || n < 64) nt = 1;
    if (nt == 1) {
        ffn_range(k, b, records, rows, 0, n, x, h, out);
        return;
    }
    #pragma omp parallel num_threads(nt)
    {
#ifdef _OPENMP
        int t = omp_get_thread_num(), T = omp_get_num_threads();
#else
        int t = 0, T = 1;
#endif
        size_t i0 = n * (size_t)t / (size_t)T, i1 = n * (size_t)(t + 1) / (size_t)T;
        ffn_range(k, b, records, rows, i0, i1, x, h, acc + (size_t)t * b->d_model);
        #pragma omp barrier
        /* reduce: each thread sums a slice of d_model over all partial accumulators */
        size_t d = b->d_model, j0 = d * (size_t)t / (size_t)T, j1 = d * (size_t)(t + 1) / (size_t)T;
        for (size_t j = j0; j < j1; j++) {
            float s = 0.0f;
            for (int u = 0; u < T; u++) s += acc[(size_t)u * d + j];
            out[j] = s;
        }
    }
}
