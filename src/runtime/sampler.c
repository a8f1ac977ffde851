/* sampler.c — greedy, temperature, top-k, top-p and min-p sampling (as llama.cpp's flags mean them) after the logit
 * edits (logit_bias, OpenAI's presence and frequency penalties, llama.cpp's repeat penalty), each token drawn by the
 * Gumbel-max trick from noise keyed by (seed, key) — the key is the token's position — so that a seed gives the same
 * text however the tokens were computed (speculative decoding included); the log-probabilities of a token and its
 * alternatives; and the classic acceptance rules of speculative decoding (flm_sampler_accept, _accept_multi).
 *
 * The pipeline of one draw (flm_sampler_sample_at):
 *   1. edit:    the logits copied, logit_bias added, penalties over the last penalty_last_n tokens of the history
 *               (a token mask goes here: -inf for the tokens it forbids)
 *   2. greedy:  temp <= 0: the argmax of the edited logits (the lowest id on ties), no noise
 *   3. process: softmax(logits / temp), then top-k, top-p, min-p: the kept ids and their probabilities p_i
 *   4. race:    the kept token with the smallest E_i / p_i, E_i = -log(1 - w_i) ~ Exp(1) and w_i uniform from a hash of
 *               (seed, key, i): an exponential race, i.e. Gumbel-max (argmax log p_i + G_i, G_i = -log E_i), which
 *               draws i with probability p_i / sum(p) exactly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"

struct flm_sampler {
    flm_sampler_params p;
    size_t n_vocab;
    uint64_t rng;      /* the classic rules' xorshift64* stream (flm_sampler_sample_probs, _accept, _accept_multi) */
    uint64_t n_calls;  /* flm_sampler_sample's key: calls so far */
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
    s->prob = malloc(n_vocab * sizeof *s->prob);
    s->idx = malloc(n_vocab * sizeof *s->idx);
    s->work = malloc(n_vocab * sizeof *s->work);
    s->bias = p->n_bias ? malloc(p->n_bias * sizeof *s->bias) : NULL;
    if (!s->prob || !s->idx || !s->work || (p->n_bias && !s->bias)) {
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

/* ---- 3. temperature, top-k, top-p, min-p ----------------------------------------------------------------------- */

/* Temperature, top-k, top-p and min-p (temp > 0): s->prob gets the softmax of logits / temp over every token, and the
 * ids s->idx[0 .. keep) are the tokens kept (most likely first when top-k, top-p or min-p cut; else all ids in
 * order). Returns keep (>= 1). */
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
    if (keep < n || s->p.top_p < 1.0f || s->p.min_p > 0.0f) {
        if (keep < n) select_top(s->idx, n, keep, s->prob); /* the keep most likely first: the order a full sort gives */
        if (keep < n || s->p.top_p < 1.0f) sort_desc(s->idx, keep, s->prob);
        if (s->p.top_p < 1.0f) {
            double cum = 0;
            for (size_t i = 0; i < keep; i++) {
                cum += s->prob[s->idx[i]];
                if (cum >= s->p.top_p) { keep = i + 1; break; }
            }
        }
        if (s->p.min_p > 0.0f) { /* llama.cpp's min-p: the tokens at least min_p times the most likely one */
            float pmax = 0;
            for (size_t i = 0; i < keep; i++) pmax = s->prob[s->idx[i]] > pmax ? s->prob[s->idx[i]] : pmax;
            const float lim = s->p.min_p * pmax;
            size_t k = 0;
            for (size_t i = 0; i < keep; i++)
                if (s->prob[s->idx[i]] >= lim) s->idx[k++] = s->idx[i]; /* order kept */
            keep = k;
        }
    }
    return keep;
}

/* ---- 4. the race ------------------------------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x) { /* SplitMix64's finalizer (Steele et al. 2014): a bijection that mixes well */
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

/* The noise's per-key hash and a token's uniform in (0, 1) (53 bits, never 0 or 1). */
static uint64_t key_hash(uint64_t seed, uint64_t key) {
    return mix64(mix64(seed + 0x9E3779B97F4A7C15ull) ^ (key * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull));
}
static double unif(uint64_t kh, int32_t tok) {
    return ((double)(mix64(kh ^ ((uint64_t)(uint32_t)tok * 0x9E3779B97F4A7C15ull)) >> 11) + 0.5) * 0x1p-53;
}

/* The race over ids[0..m) with weights prob (not necessarily normalized, all > 0 for the ids raced): the up to k ids
 * with the smallest E_i / p_i, E_i = -log(1 - w_i), in that order, into tok (k <= FLM_SAMPLER_DRAWS_MAX); returns how
 * many. E_i >= w_i, so an id whose w_i is at least the k-th best value times p_i cannot enter: one hash and a
 * multiply for most ids, a log for the few that may. The first id is distributed as p / sum(p); the k are
 * Gumbel-top-k, k draws without replacement. */
static int race(const int32_t *ids, size_t m, const float *prob, uint64_t kh, int k, int32_t *tok) {
    double val[FLM_SAMPLER_DRAWS_MAX];
    int nk = 0;
    double thr = INFINITY; /* the k-th best value once k are held */
    for (size_t i = 0; i < m; i++) {
        const int32_t id = ids[i];
        const double p = prob[id];
        if (!(p > 0)) continue;
        const double w = unif(kh, id);
        if (w >= thr * p) continue;
        const double v = -log1p(-w) / p;
        if (!(v < thr)) continue;
        int j = nk < k ? nk++ : k - 1; /* insert, dropping the worst when full */
        while (j > 0 && val[j - 1] > v) { val[j] = val[j - 1]; tok[j] = tok[j - 1]; j--; }
        val[j] = v;
        tok[j] = id;
        if (nk == k) thr = val[k - 1];
    }
    return nk;
}

static int draws(flm_sampler *s, const float *logits, uint64_t key, const int32_t *hist, size_t n_hist, int k,
                 int32_t *tok, float *prob) {
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
    double mass = 0;
    if (prob)
        for (size_t i = 0; i < keep; i++) mass += s->prob[s->idx[i]];
    int nk = race(s->idx, keep, s->prob, key_hash(s->p.seed, key), k, tok);
    if (nk == 0) { /* no kept token has a positive probability (non-finite logits): the most likely */
        tok[0] = s->idx[0];
        nk = 1;
    }
    if (prob)
        for (int j = 0; j < nk; j++) prob[j] = mass > 0 ? (float)(s->prob[tok[j]] / mass) : 0.0f;
    return nk;
}

int32_t flm_sampler_sample_at(flm_sampler *s, const float *logits, uint64_t key, const int32_t *hist, size_t n_hist) {
    int32_t t;
    draws(s, logits, key, hist, n_hist, 1, &t, NULL);
    return t;
}

int flm_sampler_draws_at(flm_sampler *s, const float *logits, uint64_t key, const int32_t *hist, size_t n_hist, int k,
                         int32_t *tok, float *prob) {
    return draws(s, logits, key, hist, n_hist, k, tok, prob);
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
