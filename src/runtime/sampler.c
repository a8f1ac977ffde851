/* sampler.c — greedy, temperature, top-k and top-p sampling (as llama.cpp's flags mean them). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"

struct flm_sampler {
    flm_sampler_params p;
    size_t n_vocab;
    uint64_t rng;
    float *prob;
    int32_t *idx;
};

void flm_sampler_params_default(flm_sampler_params *p) {
    p->temp = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->seed = 42;
}

flm_sampler *flm_sampler_create(const flm_sampler_params *p, size_t n_vocab) {
    if (n_vocab == 0) return NULL;
    flm_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed ? p->seed : 0x2545F4914F6CDD1Dull;
    s->prob = malloc(n_vocab * sizeof *s->prob);
    s->idx = malloc(n_vocab * sizeof *s->idx);
    if (!s->prob || !s->idx) {
        flm_sampler_free(s);
        return NULL;
    }
    return s;
}

void flm_sampler_free(flm_sampler *s) {
    if (!s) return;
    free(s->prob);
    free(s->idx);
    free(s);
}

static float rng_f32(uint64_t *state) { /* xorshift64*, uniform in [0, 1) */
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (float)((*state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}


static int cmp_desc(const void *a, const void *b, void *ctx) {
    const float *p = ctx;
    float pa = p[*(const int32_t *)a], pb = p[*(const int32_t *)b];
    if (pa != pb) return pa < pb ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* insertion into a small sorted prefix would be faster for tiny k; a full sort is simple and n_vocab-bounded */
static void sort_desc(int32_t *idx, size_t n, const float *prob) {
#if defined(__GLIBC__)
    qsort_r(idx, n, sizeof *idx, cmp_desc, (void *)prob);
#else
    /* portable fallback: shell sort with the same order */
    for (size_t gap = n / 2; gap > 0; gap /= 2)
        for (size_t i = gap; i < n; i++)
            for (size_t j = i; j >= gap && cmp_desc(&idx[j - gap], &idx[j], (void *)prob) > 0; j -= gap) {
                int32_t t = idx[j]; idx[j] = idx[j - gap]; idx[j - gap] = t;
            }
#endif
}

int32_t flm_sampler_sample(flm_sampler *s, const float *logits) {
    size_t n = s->n_vocab;
    if (s->p.temp <= 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < n; i++)
            if (logits[i] > logits[best]) best = i;
        return (int32_t)best;
    }
    float mx = logits[0];
    for (size_t i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        s->prob[i] = expf((logits[i] - mx) / s->p.temp);
        sum += s->prob[i];
        s->idx[i] = (int32_t)i;
    }
    for (size_t i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    size_t keep = n;
    if (s->p.top_k > 0 && (size_t)s->p.top_k < n) keep = (size_t)s->p.top_k;
    if (keep < n || s->p.top_p < 1.0f) {
        sort_desc(s->idx, n, s->prob);
        if (s->p.top_p < 1.0f) {
            double cum = 0;
            for (size_t i = 0; i < keep; i++) {
                cum += s->prob[s->idx[i]];
                if (cum >= s->p.top_p) { keep = i + 1; break; }
            }
        }
    }
    double mass = 0;
    for (size_t i = 0; i < keep; i++) mass += s->prob[s->idx[i]];
    double r = rng_f32(&s->rng) * mass, cum = 0;
    for (size_t i = 0; i < keep; i++) {
        cum += s->prob[s->idx[i]];
        if (r < cum) return s->idx[i];
    }
    return s->idx[keep - 1];
}
