/* sampler.c — greedy, temperature, top-k and top-p sampling (as llama.cpp's flags mean them), and the acceptance rule
 * of speculative decoding (flm_sampler_accept). */
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

/* The lowest id among the largest logits (greedy). */
static size_t argmax(const float *logits, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* Restore the heap h[0 .. k) below i: every parent comes after its children in cmp_desc order (the root is the
 * worst). */
static void heap_sift(int32_t *h, size_t k, size_t i, const float *prob) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i; /* w: the worst (largest in cmp_desc) of i and its children */
        if (l < k && cmp_desc(&h[l], &h[w], (void *)prob) > 0) w = l;
        if (r < k && cmp_desc(&h[r], &h[w], (void *)prob) > 0) w = r;
        if (w == i) return;
        int32_t t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

/* Move the k first ids in cmp_desc order (most likely first, lower id on ties: a total order) to idx[0 .. k), in
 * any order, in O(n log k): a heap of the k best so far whose root is the worst of them. Speculative decoding asks
 * for a distribution per draft and per verified row, and a full sort of a 150k vocabulary costs ~15 ms. */
static void select_top(int32_t *idx, size_t n, size_t k, const float *prob) {
    if (k == 0) return;
    for (size_t i = k / 2; i-- > 0;) heap_sift(idx, k, i, prob);
    for (size_t i = k; i < n; i++)
        if (cmp_desc(&idx[i], &idx[0], (void *)prob) < 0) { /* better than the worst kept */
            int32_t t = idx[0]; idx[0] = idx[i]; idx[i] = t;
            heap_sift(idx, k, 0, prob);
        }
}

/* Temperature, top-k and top-p (temp > 0): s->prob gets the softmax of logits / temp over every token, and the ids
 * s->idx[0 .. keep) are the tokens kept (most likely first when top-k or top-p cut; else all ids in order). Returns
 * keep (>= 1). */
static size_t process(flm_sampler *s, const float *logits) {
    size_t n = s->n_vocab;
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
        if (keep < n) select_top(s->idx, n, keep, s->prob); /* the keep most likely first: the order a full sort gives */
        sort_desc(s->idx, keep, s->prob);
        if (s->p.top_p < 1.0f) {
            double cum = 0;
            for (size_t i = 0; i < keep; i++) {
                cum += s->prob[s->idx[i]];
                if (cum >= s->p.top_p) { keep = i + 1; break; }
            }
        }
    }
    return keep;
}

int32_t flm_sampler_sample(flm_sampler *s, const float *logits) {
    if (s->p.temp <= 0.0f) return (int32_t)argmax(logits, s->n_vocab);
    size_t keep = process(s, logits);
    double mass = 0;
    for (size_t i = 0; i < keep; i++) mass += s->prob[s->idx[i]];
    double r = rng_f32(&s->rng) * mass, cum = 0;
    for (size_t i = 0; i < keep; i++) {
        cum += s->prob[s->idx[i]];
        if (r < cum) return s->idx[i];
    }
    return s->idx[keep - 1];
}

void flm_sampler_probs(flm_sampler *s, const float *logits, float *probs) {
    size_t n = s->n_vocab;
    memset(probs, 0, n * sizeof *probs);
    if (s->p.temp <= 0.0f) {
        probs[argmax(logits, n)] = 1.0f;
        return;
    }
    size_t keep = process(s, logits);
    double mass = 0;
    for (size_t i = 0; i < keep; i++) mass += s->prob[s->idx[i]];
    for (size_t i = 0; i < keep; i++) probs[s->idx[i]] = (float)(s->prob[s->idx[i]] / mass);
}

/* Uniform in [0, 1) with 53 bits, from the same xorshift64* stream as rng_f32. */
static double rng_f64(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (double)((*state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

int32_t flm_sampler_sample_probs(flm_sampler *s, const float *probs) {
    size_t n = s->n_vocab;
    double mass = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(probs[i] >= 0.0f) || isinf(probs[i])) return -1; /* negative, NaN or infinite */
        mass += probs[i];
    }
    if (!(mass > 0)) return -1;
    double r = rng_f64(&s->rng) * mass, cum = 0;
    size_t last = 0;
    for (size_t i = 0; i < n; i++) {
        if (probs[i] <= 0.0f) continue;
        cum += probs[i];
        last = i;
        if (r < cum) return (int32_t)i;
    }
    return (int32_t)last; /* r at the very top of the mass (rounding) */
}

bool flm_sampler_accept(flm_sampler *s, const float *p, const float *q, int32_t token, int32_t *out) {
    size_t n = s->n_vocab;
    *out = token;
    bool valid = token >= 0 && (size_t)token < n;
    double pt = valid ? p[token] : 0, qt = !valid ? 0 : q ? q[token] : 1.0;
    /* accept with probability min(1, p/q): u < p/q, written as u * q < p (no division; q = 0 < p accepts) */
    if (pt > 0 && rng_f64(&s->rng) * qt < pt) return true;
    /* rejected: the residual max(0, p - q), normalized by sample_probs */
    for (size_t i = 0; i < n; i++) {
        double qi = q ? q[i] : (valid && i == (size_t)token ? 1.0 : 0.0);
        double r = (double)p[i] - qi;
        s->prob[i] = r > 0 ? (float)r : 0.0f;
    }
    int32_t t = flm_sampler_sample_probs(s, s->prob);
    if (t < 0) t = flm_sampler_sample_probs(s, p); /* p <= q everywhere (rounding): p itself */
    if (t < 0) t = (int32_t)argmax(p, n);          /* p unusable: its largest entry */
    *out = t;
    return false;
}

bool flm_sampler_greedy(const flm_sampler *s) { return s->p.temp <= 0.0f; }

int flm_sampler_accept_multi(flm_sampler *s, const float *p, const float *q, const int32_t *draws, int n_draws,
                             int32_t *out) {
    const size_t n = s->n_vocab;
    float *w = s->prob; /* the target's distribution, then the residual after each rejection */
    memcpy(w, p, n * sizeof *w);
    for (int k = 0; k < n_draws; k++) {
        const int32_t x = draws[k];
        if (x < 0 || (size_t)x >= n) continue;
        /* accept with probability min(1, w(x) / q(x)) */
        if (w[x] > 0 && rng_f64(&s->rng) * (double)q[x] < (double)w[x]) {
            *out = x;
            return k;
        }
        /* rejected: w = norm(max(0, w - q)) (SpecInfer's multi-step speculative sampling) */
        double sum = 0;
        for (size_t i = 0; i < n; i++) {
            double r = (double)w[i] - (double)q[i];
            w[i] = r > 0 ? (float)r : 0.0f;
            sum += w[i];
        }
        if (!(sum > 0)) { /* w <= q everywhere (rounding): nothing is left to correct; w = p again */
            memcpy(w, p, n * sizeof *w);
            break;
        }
        for (size_t i = 0; i < n; i++) w[i] = (float)(w[i] / sum);
    }
    int32_t t = flm_sampler_sample_probs(s, w);
    if (t < 0) t = flm_sampler_sample_probs(s, p);
    if (t < 0) t = (int32_t)argmax(p, n);
    *out = t;
    return -1;
}
