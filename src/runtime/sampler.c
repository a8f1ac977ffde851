/* sampler.c — llama.cpp's sampling, so that a seed gives llama.cpp's text: the logit edits (logit_bias, llama.cpp's
 * repeat penalty, OpenAI's presence and frequency penalties), then llama.cpp's default chain top-k -> top-p -> min-p
 * -> temperature -> dist (top-p and min-p on the untempered distribution, the temperature last), the token drawn by
 * inverse CDF with one uniform per generated token from mt19937(seed), as llama.cpp's dist sampler draws it; the
 * log-probabilities of a token and its alternatives; and the classic acceptance rules of speculative decoding
 * (flm_sampler_accept, _accept_multi).
 *
 * The pipeline of one draw (flm_sampler_sample_at):
 *   1. edit:    the logits copied, logit_bias added, penalties over the last penalty_last_n tokens of the history
 *               (a token mask goes here: -inf for the tokens it forbids)
 *   2. greedy:  temp <= 0: the argmax of the edited logits (the lowest id on ties), no noise
 *   3. process: top-k, top-p, min-p on the edited logits, then the weights exp(logit / temp - max) of the kept ids,
 *               in llama.cpp's float arithmetic and candidate order (process() below)
 *   4. draw:    the uniform u of the key: the key's index k = key - origin (origin: the key of the first generated
 *               token, flm_sampler_set_origin; a session sets it at each generation's first position) picks the k-th
 *               double of mt19937(seed) through libstdc++'s uniform_real_distribution<double> (core/mt19937.h), i.e.
 *               the double llama.cpp's dist sampler draws for its k-th token; the token is the first kept one whose
 *               running sum of weights reaches u * their sum.
 * A token is thus a function of (seed, its key, its distribution): the same text however the logits were computed,
 * with or without speculative decoding (src/session/spec.c accepts a draft when it is the target's token at its
 * position, and drafts with the same u), and, on the same logits, the text llama.cpp's llama-server/llama-completion
 * give with --seed (test_sampler_llama.c checks it against a recording). llama-cli keeps one stream across a chat's
 * turns; a session starts it again at each generation. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt19937.h"
#include "flashlm.h"

/* The uniforms kept at once (uniform_at): a generation's keys move forward, a draft looks at most
 * FLM_SPEC_DRAFT_MAX ahead, and a key behind the window (a rewind by thousands) replays the stream from its start;
 * without a bound the cache grew by 8 bytes a generated token up to FLM_SAMPLER_STREAM_MAX (32 MiB). */
#define SAMPLER_U_WINDOW 4096u

/* mt19937's 32-bit seed: a seed below 2^32 as it is (llama.cpp's --seed is 32 bits: the same text), a larger one
 * folded (its halves XORed), so that seeds differing only above bit 31 do not silently give the same text. */
static uint32_t seed32(uint64_t seed) { return (uint32_t)(seed ^ (seed >> 32)); }

struct flm_sampler {
    flm_sampler_params p;
    size_t n_vocab;
    uint64_t rng;      /* the classic rules' xorshift64* stream (flm_sampler_sample_probs, _accept, _accept_multi) */
    uint64_t n_calls;  /* flm_sampler_sample's key: calls so far */
    uint64_t origin;   /* the key of the stream's first uniform (flm_sampler_set_origin) */
    flm_mt19937 mt;    /* llama.cpp's stream: mt19937(seed), u_base + n_u doubles drawn from it so far */
    double *u;         /* [SAMPLER_U_WINDOW]: the stream's doubles u_base .. u_base + n_u - 1 */
    uint64_t u_base;
    size_t n_u;
    flm_logit_bias *bias; /* p.bias copied (p.bias points here) */
    float *prob;
    int32_t *idx;
    float *work;       /* the edited logits */
    int32_t *pen_tok;  /* [penalty window]: the window's distinct tokens and their counts */
    int32_t *pen_cnt;
    size_t pen_cap;
};

void flm_sampler_params_default(flm_sampler_params *p) {
    memset(p, 0, sizeof *p);
    p->temp = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->seed = 42;
    p->repeat_penalty = 1.0f;
    p->penalty_last_n = 64;
}

flm_sampler *flm_sampler_create(const flm_sampler_params *p, size_t n_vocab) {
    if (n_vocab == 0 || !p || (p->n_bias && !p->bias)) return NULL;
    flm_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed ? p->seed : 0x2545F4914F6CDD1Dull;
    flm_mt19937_seed(&s->mt, seed32(p->seed));
    s->prob = malloc(n_vocab * sizeof *s->prob);
    s->idx = malloc(n_vocab * sizeof *s->idx);
    s->work = malloc(n_vocab * sizeof *s->work);
    s->u = malloc(SAMPLER_U_WINDOW * sizeof *s->u);
    s->bias = p->n_bias ? malloc(p->n_bias * sizeof *s->bias) : NULL;
    if (!s->prob || !s->idx || !s->work || !s->u || (p->n_bias && !s->bias)) {
        flm_sampler_free(s);
        return NULL;
    }
    if (p->n_bias) memcpy(s->bias, p->bias, p->n_bias * sizeof *s->bias);
    s->p.bias = s->bias;
    return s;
}

void flm_sampler_free(flm_sampler *s) {
    if (!s) return;
    free(s->prob);
    free(s->idx);
    free(s->work);
    free(s->u);
    free(s->bias);
    free(s->pen_tok);
    free(s->pen_cnt);
    free(s);
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

/* ---- 1. the logit edits ---------------------------------------------------------------------------------------- */

static bool has_penalties(const flm_sampler *s) {
    const flm_sampler_params *p = &s->p;
    return p->penalty_last_n != 0 && ((p->repeat_penalty > 0 && p->repeat_penalty != 1.0f) ||
                                      p->presence_penalty != 0 || p->frequency_penalty != 0);
}

/* The logits with logit_bias and the penalties applied (s->work), or logits itself when nothing edits them. The
 * penalties look at the last penalty_last_n tokens of hist[0..n_hist) (all of them when -1; the prompt's included,
 * as llama.cpp's penalties sampler sees them), each distinct token c times there: repeat penalty r (llama.cpp): a
 * positive logit / r, a negative one * r; then OpenAI's l - c * frequency_penalty - presence_penalty. */
static const float *edit(flm_sampler *s, const float *logits, const int32_t *hist, size_t n_hist) {
    const flm_sampler_params *p = &s->p;
    const bool pen = has_penalties(s) && hist && n_hist > 0;
    if (!p->n_bias && !pen) return logits;
    const size_t n = s->n_vocab;
    memcpy(s->work, logits, n * sizeof *s->work);
    for (size_t b = 0; b < p->n_bias; b++)
        if (p->bias[b].token >= 0 && (size_t)p->bias[b].token < n) s->work[p->bias[b].token] += p->bias[b].bias;
    if (!pen) return s->work;
    size_t w = p->penalty_last_n < 0 || (size_t)p->penalty_last_n > n_hist ? n_hist : (size_t)p->penalty_last_n;
    if (w > s->pen_cap) {
        int32_t *t = realloc(s->pen_tok, w * sizeof *t);
        if (t) s->pen_tok = t;
        int32_t *c = t ? realloc(s->pen_cnt, w * sizeof *c) : NULL;
        if (c) s->pen_cnt = c;
        if (!t || !c) return s->work; /* out of memory: the bias only (cannot fail loudly here) */
        s->pen_cap = w;
    }
    /* count the window's distinct tokens (a window is short: quadratic in the distinct ones at worst) */
    size_t nd = 0;
    for (size_t i = n_hist - w; i < n_hist; i++) {
        const int32_t t = hist[i];
        if (t < 0 || (size_t)t >= n) continue;
        size_t j = 0;
        while (j < nd && s->pen_tok[j] != t) j++;
        if (j == nd) { s->pen_tok[nd] = t; s->pen_cnt[nd] = 0; nd++; }
        s->pen_cnt[j]++;
    }
    const float r = p->repeat_penalty > 0 ? p->repeat_penalty : 1.0f;
    for (size_t j = 0; j < nd; j++) {
        float *l = &s->work[s->pen_tok[j]];
        if (r != 1.0f) *l = *l > 0 ? *l / r : *l * r;
        *l -= (float)s->pen_cnt[j] * p->frequency_penalty + p->presence_penalty;
    }
    return s->work;
}

/* ---- 3. top-k, top-p, min-p, temperature (llama.cpp's chain) ---------------------------------------------------- */

/* llama.cpp's default chain after the edits (src/llama-sampler.cpp, common/sampling.cpp), step for step, in its float
 * arithmetic, so that the same logits and the same uniform give llama.cpp's token. The candidates start as every id in
 * id order, unsorted:
 *   top-k (k > 0):  the k largest logits, sorted (descending; the lower id first on ties);
 *   top-p (< 1):    sorted if not yet; softmax of the candidates' logits (no temperature; float sum in the current
 *                   order), the first i + 1 whose running float sum reaches top_p;
 *   min-p (> 0):    the logits >= the largest + logf(min_p): sorted, the prefix up to the first below; unsorted, the
 *                   ones above in their order;
 *   temperature:    each logit / temp (float);
 * then s->prob[id] = expf(logit / temp - the largest) (float, not normalized: the dist sampler's weights) and the ids
 * s->idx[0 .. keep) in the candidates' order. Returns keep (>= 1). */
static size_t process(flm_sampler *s, const float *logits) {
    const size_t n = s->n_vocab;
    const flm_sampler_params *p = &s->p;
    for (size_t i = 0; i < n; i++) s->idx[i] = (int32_t)i;
    size_t m = n;
    bool sorted = false;
    if (p->top_k > 0) {
        const size_t k = (size_t)p->top_k < n ? (size_t)p->top_k : n;
        if (k < n) select_top(s->idx, n, k, logits);
        sort_desc(s->idx, k, logits);
        m = k;
        sorted = true;
    }
    if (p->top_p < 1.0f) {
        float mx = logits[s->idx[0]];
        if (!sorted)
            for (size_t i = 1; i < m; i++) mx = logits[s->idx[i]] > mx ? logits[s->idx[i]] : mx;
        float z = 0.0f;
        for (size_t i = 0; i < m; i++) z += s->prob[s->idx[i]] = expf(logits[s->idx[i]] - mx);
        for (size_t i = 0; i < m; i++) s->prob[s->idx[i]] /= z;
        if (!sorted) sort_desc(s->idx, m, logits);
        sorted = true;
        float cum = 0.0f;
        for (size_t i = 0; i < m; i++) {
            cum += s->prob[s->idx[i]];
            if (cum >= p->top_p) { m = i + 1; break; }
        }
    }
    if (p->min_p > 0.0f) {
        if (sorted) {
            const float lim = logits[s->idx[0]] + logf(p->min_p);
            size_t i = 1;
            while (i < m && !(logits[s->idx[i]] < lim)) i++;
            m = i;
        } else {
            float mx = -FLT_MAX;
            for (size_t i = 0; i < m; i++) mx = logits[s->idx[i]] > mx ? logits[s->idx[i]] : mx;
            const float lim = mx + logf(p->min_p);
            size_t k = 0;
            for (size_t i = 0; i < m; i++)
                if (logits[s->idx[i]] >= lim) s->idx[k++] = s->idx[i];
            if (k > 0) m = k; /* none (NaN logits): llama.cpp keeps them all */
        }
    }
    float mx = logits[s->idx[0]] / p->temp;
    if (!sorted)
        for (size_t i = 1; i < m; i++) {
            const float x = logits[s->idx[i]] / p->temp;
            mx = x > mx ? x : mx;
        }
    for (size_t i = 0; i < m; i++) s->prob[s->idx[i]] = expf(logits[s->idx[i]] / p->temp - mx);
    return m;
}

/* ---- 4. the draw ------------------------------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x) { /* SplitMix64's finalizer (Steele et al. 2014): a bijection that mixes well */
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

/* A uniform in [0, 1) hashed from (seed, key, salt) (53 bits): the draws past FLM_SAMPLER_STREAM_MAX and the
 * second draws of flm_sampler_resample_at. */
static double hash_unif(uint64_t seed, uint64_t key, uint64_t salt) {
    const uint64_t h = mix64(mix64(seed + 0x9E3779B97F4A7C15ull) ^ (key * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull) ^
                             mix64(salt + 0x2545F4914F6CDD1Dull));
    return (double)(h >> 11) * 0x1p-53;
}

/* The uniform of key: the (key - origin)-th double (0-based) of llama.cpp's stream, mt19937(seed's low 32 bits)
 * through libstdc++'s uniform_real_distribution<double>(0, 1); cached, so a key costs its draws once. A key below
 * the origin or FLM_SAMPLER_STREAM_MAX past it, or a cache that cannot grow (out of memory), takes a hash of
 * (seed, key) instead. */
static double uniform_at(flm_sampler *s, uint64_t key) {
    const uint64_t k = key - s->origin;
    if (key < s->origin || k >= FLM_SAMPLER_STREAM_MAX) return hash_unif(s->p.seed, key, 0);
    if (k < s->u_base) { /* behind the window (a rewind far back): the stream again from its start */
        flm_mt19937_seed(&s->mt, seed32(s->p.seed));
        s->u_base = 0;
        s->n_u = 0;
    }
    while (k >= s->u_base + s->n_u) { /* a bounded window: the older half goes when it is full */
        if (s->n_u == SAMPLER_U_WINDOW) {
            memmove(s->u, s->u + SAMPLER_U_WINDOW / 2, SAMPLER_U_WINDOW / 2 * sizeof *s->u);
            s->u_base += SAMPLER_U_WINDOW / 2;
            s->n_u = SAMPLER_U_WINDOW / 2;
        }
        s->u[s->n_u++] = flm_mt19937_canonical(&s->mt);
    }
    return s->u[k - s->u_base];
}

/* llama.cpp's dist over ids[0..m) with weights w (s->prob, not normalized): the first id whose running double sum
 * reaches u * sum (a zero weight never: llama.cpp could take one only at u = 0 exactly); then, for drafts, the k - 1
 * ids whose stretch of that sum lies nearest the point u * sum (where a slightly different distribution's draw with
 * the same u would land), nearest first. Returns how many (0 when no weight is positive). */
static int pick(const int32_t *ids, size_t m, const float *w, double u, int k, int32_t *tok) {
    double sum = 0;
    for (size_t i = 0; i < m; i++) sum += w[ids[i]];
    if (!(sum > 0)) return 0;
    const double tgt = sum * u;
    double run = 0;
    size_t sel = SIZE_MAX, last = SIZE_MAX;
    for (size_t i = 0; i < m; i++) {
        if (!(w[ids[i]] > 0)) continue;
        run += w[ids[i]];
        last = i;
        if (run >= tgt) { sel = i; break; }
    }
    if (sel == SIZE_MAX) sel = last; /* rounding at the top of the sum */
    tok[0] = ids[sel];
    int nk = 1;
    if (k < 2) return nk;
    double dist[FLM_SAMPLER_DRAWS_MAX];
    run = 0;
    for (size_t i = 0; i < m; i++) {
        const double lo = run, x = w[ids[i]];
        run += x;
        if (i == sel || !(x > 0)) continue;
        const double d = lo > tgt ? lo - tgt : tgt - (lo + x);
        if (nk == k && !(d < dist[nk - 1])) continue;
        int j = nk < k ? nk++ : k - 1;
        while (j > 1 && dist[j - 1] > d) { dist[j] = dist[j - 1]; tok[j] = tok[j - 1]; j--; }
        dist[j] = d;
        tok[j] = ids[i];
    }
    return nk;
}

static int draws(flm_sampler *s, const float *logits, uint64_t key, double u, const int32_t *hist, size_t n_hist,
                 int k, int32_t *tok, float *prob) {
    if (k < 1) return 0;
    if (k > FLM_SAMPLER_DRAWS_MAX) k = FLM_SAMPLER_DRAWS_MAX;
    const size_t n = s->n_vocab;
    const float *l = edit(s, logits, hist, n_hist);
    if (s->p.temp <= 0.0f) { /* the k largest logits, the lowest id first on ties */
        int nk = 0;
        for (size_t i = 0; i < n; i++) {
            const float x = l[i];
            if (nk == k && !(x > l[tok[nk - 1]])) continue;
            int j = nk < k ? nk++ : k - 1;
            while (j > 0 && l[tok[j - 1]] < x) { tok[j] = tok[j - 1]; j--; }
            tok[j] = (int32_t)i;
        }
        if (prob)
            for (int j = 0; j < nk; j++) prob[j] = j == 0 ? 1.0f : 0.0f;
        return nk;
    }
    size_t keep = process(s, l);
    int nk = pick(s->idx, keep, s->prob, u < 0 ? uniform_at(s, key) : u, k, tok);
    if (nk == 0) { /* no kept token has a positive weight (non-finite logits): the first candidate */
        tok[0] = s->idx[0];
        nk = 1;
    }
    if (prob) {
        double mass = 0;
        for (size_t i = 0; i < keep; i++) mass += s->prob[s->idx[i]];
        for (int j = 0; j < nk; j++) prob[j] = mass > 0 ? (float)(s->prob[tok[j]] / mass) : 0.0f;
    }
    return nk;
}

int32_t flm_sampler_sample_at(flm_sampler *s, const float *logits, uint64_t key, const int32_t *hist, size_t n_hist) {
    int32_t t;
    draws(s, logits, key, -1, hist, n_hist, 1, &t, NULL);
    return t;
}

int32_t flm_sampler_resample_at(flm_sampler *s, const float *logits, uint64_t key, const int32_t *hist,
                                size_t n_hist) {
    int32_t t;
    draws(s, logits, key, hash_unif(s->p.seed, key, 1), hist, n_hist, 1, &t, NULL);
    return t;
}

void flm_sampler_set_origin(flm_sampler *s, uint64_t key) {
    if (key == s->origin) return;
    s->origin = key;
    s->u_base = 0; /* the stream from its start again */
    s->n_u = 0;
    flm_mt19937_seed(&s->mt, seed32(s->p.seed));
}

int flm_sampler_draws_at(flm_sampler *s, const float *logits, uint64_t key, const int32_t *hist, size_t n_hist, int k,
                         int32_t *tok, float *prob) {
    return draws(s, logits, key, -1, hist, n_hist, k, tok, prob);
}

int32_t flm_sampler_sample(flm_sampler *s, const float *logits) {
    return flm_sampler_sample_at(s, logits, s->n_calls++, NULL, 0);
}

void flm_sampler_probs(flm_sampler *s, const float *logits, float *probs) {
    size_t n = s->n_vocab;
    memset(probs, 0, n * sizeof *probs);
    const float *l = edit(s, logits, NULL, 0);
    if (s->p.temp <= 0.0f) {
        probs[argmax(l, n)] = 1.0f;
        return;
    }
    size_t keep = process(s, l);
    double mass = 0;
    for (size_t i = 0; i < keep; i++) mass += s->prob[s->idx[i]];
    for (size_t i = 0; i < keep; i++) probs[s->idx[i]] = (float)(s->prob[s->idx[i]] / mass);
}

float flm_sampler_top_probs(flm_sampler *s, const float *logits, const int32_t *hist, size_t n_hist, int32_t token,
                            int n_top, int32_t *top_id, float *top_p, int *n_got) {
    const size_t n = s->n_vocab;
    if (n_top < 0) n_top = 0;
    const float *l = edit(s, logits, hist, n_hist);
    if (s->p.temp <= 0.0f) { /* greedy: all the mass on the argmax */
        const int32_t a = (int32_t)argmax(l, n);
        if (n_top > 0) { top_id[0] = a; top_p[0] = 1.0f; }
        *n_got = n_top > 0 ? 1 : 0;
        return token == a ? 1.0f : 0.0f;
    }
    const size_t keep = process(s, l);
    double mass = 0;
    for (size_t i = 0; i < keep; i++) mass += s->prob[s->idx[i]];
    float pt = 0.0f;
    int nk = 0; /* the n_top most probable kept tokens with p > 0, the lowest id first on ties */
    for (size_t i = 0; i < keep; i++) {
        const int32_t id = s->idx[i];
        const float p = mass > 0 ? (float)(s->prob[id] / mass) : 0.0f;
        if (id == token) pt = p;
        if (!(p > 0) || n_top == 0) continue;
        if (nk == n_top && !(p > top_p[nk - 1] || (p == top_p[nk - 1] && id < top_id[nk - 1]))) continue;
        int j = nk < n_top ? nk++ : n_top - 1;
        while (j > 0 && (top_p[j - 1] < p || (top_p[j - 1] == p && top_id[j - 1] > id))) {
            top_id[j] = top_id[j - 1];
            top_p[j] = top_p[j - 1];
            j--;
        }
        top_id[j] = id;
        top_p[j] = p;
    }
    *n_got = nk;
    return pt;
}

/* ---- log-probabilities ------------------------------------------------------------------------------------------ */

float flm_logprobs(const float *logits, size_t n, int32_t token, int n_top, int32_t *top_id, float *top_lp) {
    if (!logits || n == 0) return -INFINITY;
    if (n_top < 0) n_top = 0;
    if ((size_t)n_top > n) n_top = (int)n;
    float mx = logits[0];
    for (size_t i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    const double lse = (double)mx + log(sum);
    int nk = 0; /* the n_top largest logits, the lowest id first on ties */
    for (size_t i = 0; i < n && n_top > 0; i++) {
        const float x = logits[i];
        if (nk == n_top && !(x > logits[top_id[nk - 1]])) continue;
        int j = nk < n_top ? nk++ : n_top - 1;
        while (j > 0 && logits[top_id[j - 1]] < x) { top_id[j] = top_id[j - 1]; j--; }
        top_id[j] = (int32_t)i;
    }
    for (int j = 0; j < nk; j++) top_lp[j] = (float)((double)logits[top_id[j]] - lse);
    return token >= 0 && (size_t)token < n ? (float)((double)logits[token] - lse) : -INFINITY;
}

/* Uniform in [0, 1) with 53 bits from the xorshift64* stream (the classic rules' RNG). */
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
