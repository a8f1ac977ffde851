/* calibrate.c — record, fix the rule and the levels, train predictors, choose the default level, store
 * (docs/SPARSITY.md). */
#include "calibrate/calibrate.h"
#include "write/flm_write.h"

#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/act.h"
#include "core/error.h"
#include "core/files.h"
#include "flashlm_tools.h" /* the checked writer (write/out.c) */
#include "core/types.h"
#include "runtime/hooks.h"
#include "sparsity/sparsity.h"
#include "calibrate/train.h"

/* eps: the share of each layer's FFN output energy the oracle drops, ascending */
int flm_calib_pwrite_all(int fd, const void *buf, size_t n, off_t off) {
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : ENOSPC;
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

static const float STD_LEVELS[] = {0.0002f, 0.0005f, 0.001f, 0.002f, 0.005f, 0.01f, 0.02f};
#define N_STD_LEVELS (sizeof STD_LEVELS / sizeof STD_LEVELS[0])

uint32_t flm_calib_standard_levels(float *eps, uint32_t cap) {
    uint32_t n = 0;
    for (; n < N_STD_LEVELS && n < cap; n++) eps[n] = STD_LEVELS[n];
    return n;
}

void flm_calib_opts_default(flm_calib_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_tokens = 4096;
    o->chunk = 128;
    o->max_loss = 0.01f; /* measured on wiki text, the loss was 1.6-1.9x the estimate on the calibration text's end */
    o->eval_tokens = 512;
    o->train_eps = 0.002f;
    o->target_recall = 0.95f;
    o->epochs = 6;
    o->n_threads = 2;
}

/* The recorded FFN inputs: in memory (X), or, under a budget, in a temporary file (fd): layer l's token t at float
 * (l * n + t) * d_model, written as the tap sees them and read back one layer at a time. */
typedef struct {
    float **X;      /* [n_layers][n * d_model], or NULL when spilled */
    uint32_t *next; /* [n_layers]: the row the layer's next input goes to (the forward pass calls the tap once per
                       token and layer, tokens in order, also in batches) */
    int fd;         /* the spill file, or -1 */
    const char *spill_path;
    uint32_t d_model, n; /* n: tokens recorded (rows per layer) */
    int err_no;     /* the first failed write's errno (0: none) */
} tap_data;

static void tap(void *user, uint32_t layer, const float *x) {
    tap_data *t = user;
    if (t->next[layer] >= t->n) return; /* cannot happen: as many calls as tokens */
    const uint32_t row = t->next[layer]++;
    if (t->fd < 0) {
        memcpy(t->X[layer] + (size_t)row * t->d_model, x, t->d_model * sizeof(float));
        return;
    }
    if (t->err_no) return;
    const size_t bytes = t->d_model * sizeof(float);
    t->err_no = flm_calib_pwrite_all(t->fd, x, bytes, (off_t)(((uint64_t)layer * t->n + row) * bytes));
}

/* Tokens [from, from + count) of layer l's recorded inputs: in place when in memory, else read into buf (count *
 * d_model floats) and dropped from the page cache. NULL after filling err. */
static const float *layer_x(const tap_data *t, uint32_t l, uint32_t from, uint32_t count, float *buf, flm_error *err) {
    if (t->fd < 0) return t->X[l] + (size_t)from * t->d_model;
    uint8_t *p = (uint8_t *)buf;
    size_t left = (size_t)count * t->d_model * sizeof(float);
    off_t off0 = (off_t)(((uint64_t)l * t->n + from) * t->d_model * sizeof(float)), off = off0;
    while (left) {
        ssize_t r = pread(t->fd, p, left, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            flm_fail(err, FLM_ERR_IO, "%s: cannot read back the recorded inputs of layer %u: %s", t->spill_path, l,
                     r < 0 ? strerror(errno) : "short read");
            return NULL;
        }
        p += r;
        left -= (size_t)r;
        off += r;
    }
#ifdef POSIX_FADV_DONTNEED
    posix_fadvise(t->fd, off0, off - off0, POSIX_FADV_DONTNEED);
#endif
    return buf;
}

/* ---- histograms over float keys ---------------------------------------------------------------------------------
 * A float's bit pattern, with the sign flipped for positives and all bits flipped for negatives, orders like the float;
 * its top 16 bits make 65536 bins of about 1/128 relative width. Each bin sums a count and an energy. */
#define HBINS 65536u
typedef struct {
    uint64_t cnt[HBINS];
    double e[HBINS];
    double total_e;
    uint64_t total_n;
} hist;

static inline uint32_t fkey(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static inline float fkey_inv(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void hist_add(hist *h, float key, double e) {
    uint32_t b = fkey(key) >> 16;
    h->cnt[b]++;
    h->e[b] += e;
    h->total_e += e;
    h->total_n++;
}

/* The lower edge t of the highest bin at which the values above it carry at least (1 - eps) of the energy, and the
 * count and energy of the bins from it up; "x > t' for t' just below t" then selects them. */
static float hist_cut(const hist *h, double eps, double *frac, double *kept) {
    double need = (1.0 - eps) * h->total_e, acc = 0;
    uint64_t n = 0;
    uint32_t b = HBINS;
    while (b > 0) {
        b--;
        acc += h->e[b];
        n += h->cnt[b];
        if (acc >= need && h->cnt[b]) break;
    }
    *frac = h->total_n ? (double)n / (double)h->total_n : 0;
    *kept = h->total_e > 0 ? acc / h->total_e : 1;
    if (*kept > 1) *kept = 1;
    return nextafterf(fkey_inv(b << 16), -INFINITY);
}

/* mean over tokens of |union of the last k predicted sets| / d_ffn, for k = 1..FLM_AGG_K; sets restart per chunk */
static void aggregate(const flm_predictor *p, const float *X, uint32_t n, uint32_t chunk, float *s_agg) {
    uint32_t d_ffn = p->d_ffn;
    int64_t *last = malloc(d_ffn * sizeof *last);
    uint32_t *ids = malloc(d_ffn * sizeof *ids);
    float *scratch = malloc(flm_predictor_scratch_floats(p) * sizeof(float));
    double sum[FLM_AGG_K] = {0};
    uint64_t counted = 0;
    if (!last || !ids || !scratch) goto done;
    for (uint32_t t = 0; t < n; t++) {
        uint32_t in_chunk = t % chunk;
        if (in_chunk == 0)
            for (uint32_t i = 0; i < d_ffn; i++) last[i] = INT64_MIN / 2;
        size_t m = flm_predictor_predict(p, X + (size_t)t * p->d_model, ids, scratch);
        for (size_t j = 0; j < m; j++) last[ids[j]] = t;
        if (in_chunk + 1 < FLM_AGG_K) continue; /* only tokens with a full window behind them */
        uint64_t hist_age[FLM_AGG_K] = {0};
        for (uint32_t i = 0; i < d_ffn; i++) {
            int64_t age = (int64_t)t - last[i];
            if (age >= 0 && age < FLM_AGG_K) hist_age[age]++;
        }
        uint64_t acc = 0;
        for (int k = 0; k < FLM_AGG_K; k++) {
            acc += hist_age[k];
            sum[k] += (double)acc / d_ffn;
        }
        counted++;
    }
done:
    for (int k = 0; k < FLM_AGG_K; k++) s_agg[k] = counted ? (float)(sum[k] / (double)counted) : 0.0f;
    free(last);
    free(ids);
    free(scratch);
}

/* ---- the held-out check: perplexity with the predictors of one level, in memory ---------------------------------- */

typedef struct {
    flm_predictor_region *sp;
    uint32_t level;
    float *scratch; /* predictor: max rank + d_ffn floats; oracle: d_ffn */
    float **dn;     /* [n_layers][d_ffn] down-column norms (the oracle) */
} sim_data;

/* the oracle: (h_i ||down_i||)^2 > tau^2 sum_j (h_j ||down_j||)^2 */
static uint32_t sim_select_oracle(void *user, uint32_t l, int32_t pos, const float *x, const float *h,
                                  uint32_t *ids) {
    (void)x;
    (void)pos;
    sim_data *s = user;
    return flm_contrib_set(h, s->dn[l], s->sp->layers[l].pred.d_ffn, s->sp->layers[l].levels[s->level].tau,
                           s->scratch, ids);
}

static uint32_t sim_select(void *user, uint32_t l, int32_t pos, const float *x, const float *h, uint32_t *ids) {
    (void)h;
    sim_data *s = user;
    flm_predictor *p = &s->sp->layers[l].pred;
    p->threshold = s->sp->layers[l].levels[s->level].pred_threshold;
    if (pos == 0) { /* as the sparse source does: the first token of a sequence runs dense */ for (uint32_t i = 0; i < p->d_ffn; i++) ids[i] = i; return p->d_ffn; }
    return (uint32_t)flm_predictor_predict(p, x, ids, s->scratch);
}

/* One pass over toks[0..n) (chunks of `chunk`, the first token of each replaced by BOS; every position after the
 * first of its chunk scored): the mean negative log-likelihood *nll and, against the dense pass's log-probabilities
 * ref (n x n_vocab floats: written when kl is NULL, read otherwise), the mean KL(dense || this pass) *kl, in nats.
 * The KL estimates the perplexity cost, exp(KL) - 1, with far less noise than the difference of two NLLs on a few
 * hundred tokens (measured on SmolLM2, 256 tokens: NLL differences swung by +-2% of perplexity between neighbouring
 * levels, even below zero). done/total drive the progress callback. */
static flm_status eval_pass(flm_ctx *ctx, const int32_t *toks, uint32_t n, uint32_t chunk, int32_t bos,
                            const flm_calib_opts *o, uint64_t *done, uint64_t total, float *ref, double *nll,
                            double *kl, const flm_ffn_hooks *hooks, flm_error *err) {
    double sum = 0, sum_kl = 0;
    uint64_t cnt = 0;
    uint32_t V = flm_ctx_model(ctx)->hp.n_vocab;
    for (uint32_t t = 0; t < n; t++) {
        uint32_t pos = t % chunk;
        const float *logits;
        const int32_t id = pos == 0 && bos >= 0 ? bos : toks[t];
        flm_status st = flm_eval_hooked(ctx, &id, 1, (int32_t)pos, hooks, NULL, &logits, err);
        if (st) return st;
        if (pos + 1 < chunk && t + 1 < n) {
            float mx = logits[0];
            for (uint32_t v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
            double z = 0;
            for (uint32_t v = 0; v < V; v++) z += exp((double)(logits[v] - mx));
            double lz = log(z) + mx;
            sum += lz - logits[toks[t + 1]];
            float *r = ref + (size_t)t * V;
            if (!kl) {
                for (uint32_t v = 0; v < V; v++) r[v] = (float)(logits[v] - lz);
            } else {
                double k = 0;
                for (uint32_t v = 0; v < V; v++) k += exp((double)r[v]) * ((double)r[v] - (logits[v] - lz));
                sum_kl += k > 0 ? k : 0;
            }
            cnt++;
        }
        if (o->progress && (++*done % 32 == 0 || *done == total)) o->progress(o->user, "checking levels", *done, total);
    }
    *nll = cnt ? sum / (double)cnt : 0;
    if (kl) *kl = cnt ? sum_kl / (double)cnt : 0;
    return FLM_OK;
}

/* The held-out check (docs/SPARSITY.md, "Choosing the default level"): a dense pass over eval_ids[0..n_eval), then
 * one per level with its predictors (and, with o->curve and dn non-NULL, one per level with the true active sets).
 * Fills sp's level_loss (exp(mean KL) - 1) and level_dnll (and their _oracle), and sets *def to the most
 * aggressive level within o->max_loss (0 if none is). scratch: max rank + d_ffn floats. Stops at the first level
 * past max_loss unless o->curve. Errors: those of flm_eval, FLM_ERR_NOMEM. */
static flm_status check_levels(flm_ctx *ctx, flm_predictor_region *sp, const int32_t *eval_ids, uint32_t n_eval,
                               int32_t bos, const flm_calib_opts *o, float *scratch, float **dn, uint32_t *def,
                               flm_error *err) {
    int passes = o->curve && dn ? 2 : 1;
    uint64_t done_tok = 0, total = (uint64_t)n_eval * ((uint64_t)passes * sp->n_levels + 1);
    const flm_hparams *hp = &flm_ctx_model(ctx)->hp;
    float *ref = malloc((size_t)n_eval * hp->n_vocab * sizeof(float));
    uint32_t *ids = malloc(hp->d_ffn * sizeof *ids);
    if (!ref || !ids) {
        free(ref);
        free(ids);
        return flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory for the held-out check");
    }
    double dense;
    flm_status st = eval_pass(ctx, eval_ids, n_eval, o->chunk, bos, o, &done_tok, total, ref, &dense, NULL, NULL, err);
    sim_data sd = {sp, 0, scratch, dn};
    *def = 0;
    for (int oracle = 0; oracle < passes && !st; oracle++) {
        const flm_ffn_hooks hooks = {.select = oracle ? sim_select_oracle : sim_select, .select_user = &sd,
                                     .need_h = oracle, .ids = ids};
        for (uint32_t k = 0; k < sp->n_levels; k++) {
            sd.level = k;
            double nll, kl;
            if ((st = eval_pass(ctx, eval_ids, n_eval, o->chunk, bos, o, &done_tok, total, ref, &nll, &kl, &hooks,
                                err)))
                break;
            float loss = (float)(exp(kl) - 1.0), dnll = (float)(exp(nll - dense) - 1.0);
            if (oracle) {
                sp->level_loss_oracle[k] = loss;
                sp->level_dnll_oracle[k] = dnll;
                continue;
            }
            sp->level_loss[k] = loss;
            sp->level_dnll[k] = dnll;
            if (loss <= o->max_loss) *def = k;
            else if (!o->curve) break; /* losses grow with eps: the rest would fail too */
        }
    }
    free(ref);
    free(ids);
    if (!st && o->progress && done_tok < total) /* stopped early: the phase ends here */
        o->progress(o->user, "checking levels", total, total);
    return st;
}

/* A context of one chunk on the .flm, in mode (ram for the checks; hybrid to record under a budget), under the
 * options' budget. */
static flm_status open_mode(const char *path, const flm_calib_opts *o, flm_mode mode, flm_ctx **ctx, flm_error *err) {
    flm_params p;
    flm_params_default(&p);
    p.mode = mode;
    p.n_ctx = (int)o->chunk;
    p.mem_bytes = o->mem_bytes;
    p.mem_percent = o->mem_percent;
    if (o->n_threads > 0) p.n_threads = o->n_threads;
    return flm_open(path, &p, ctx, err);
}

static flm_status open_ram(const char *path, const flm_calib_opts *o, flm_ctx **ctx, flm_error *err) {
    return open_mode(path, o, FLM_MODE_RAM, ctx, err);
}

static bool has_budget(const flm_calib_opts *o) { return o->mem_bytes || o->mem_percent > 0; }

/* The predictor ranks calibrate gives most layers and the last quarter of them. */
static void calib_ranks(const flm_hparams *hp, const flm_calib_opts *o, uint32_t *rank, uint32_t *rank_last) {
    uint32_t d = hp->d_model, F = hp->d_ffn, r = o->rank ? o->rank : (d / 2 < 128 ? d / 2 : 128);
    uint32_t maxr = d < F ? d : F;
    if (r > maxr) r = maxr;
    if (r < 1) r = 1;
    uint32_t rl = o->rank_last ? o->rank_last : 2 * r;
    if (rl > maxr) rl = maxr;
    *rank = r;
    *rank_last = rl;
}

uint64_t flm_calibrate_train_bytes(const flm_hparams *hp, const flm_calib_opts *o) {
    const uint64_t d = hp->d_model, F = hp->d_ffn, L = hp->n_layers, n = o->max_tokens, n_ho = n / 5;
    uint32_t rank, rank_last;
    calib_ranks(hp, o, &rank, &rank_last);
    const uint64_t maxr = rank > rank_last ? rank : rank_last, s = d < F ? d : F, bmax = 64 < n ? 64 : n;
    const uint64_t nP = maxr * (d + F) + F, zt = F * n < (1u << 22) ? F * n : (1u << 22);
    uint64_t b = 4 * (2 * F * d + L * F + d + 2 * n * F + n_ho * F + n_ho * maxr + n * d) + n * F + sizeof(hist);
    b += 4 * (4 * nP + bmax * (d + 2 * maxr + F) + 3 * F) + 8 * n + 8 * F; /* Adam: gradients, moments, the best */
    b += 4 * (s * s + 2 * s * maxr + s) + 4 * (n * maxr + zt + 256 * d + F) + 8 * F; /* SVD and bias init */
    if (hp->arch->flags & FLM_ARCH_FFN_BIAS) b += 4 * L * F; /* the layers' b_up, copied before streaming */
    for (uint64_t l = 0; l < L; l++) { /* every layer's predictor, f32 and f16 */
        uint64_t r = l >= L - (L + 3) / 4 ? rank_last : rank;
        b += (r * (d + F) + F) * 4 + r * (d + F) * 2;
    }
    return b;
}

/* ---- per layer: rule, levels, predictor ------------------------------------------------------------------------- */

typedef struct {
    float *Wg, *Wu, *dn;   /* F x d gate (or up) rows, F x d up rows, F down-column norms (into dn_all[l]) */
    float *Zg, *E;         /* n x F: gate pre-activations, then energies (h_i ||down_i||)^2 */
    float *Zp, *Hp;        /* n_ho x F predictor logits, n_ho x max rank */
    uint8_t *Y;            /* n_tr x F labels */
    float *col;            /* d: one down column */
    hist *h;
} layer_work;

/* Free the training buffers and clear w. */
static void layer_work_free(layer_work *w) {
    free(w->Wg);
    free(w->Wu);
    free(w->col);
    free(w->Zg);
    free(w->E);
    free(w->Zp);
    free(w->Hp);
    free(w->Y);
    free(w->h);
    *w = (layer_work){0};
}

/* Layer l: rule, levels and predictor from its recorded inputs X (n tokens), its FFN records rec (layout b) and its
 * up biases b_up [d_ffn] (NULL: none; OPT, Phi-2, Persimmon): the up projection's pre-activation is up . x + b_up. */
static flm_status calibrate_layer(const flm_hparams *hp, const flm_kernels *k, const uint8_t *rec,
                                  const flm_bundle_desc *b, const float *b_up, const flm_calib_opts *o, uint32_t l,
                                  const float *X, uint32_t n, uint32_t n_tr, flm_predictor_region *sp,
                                  uint32_t train_level, uint32_t rank, layer_work *w, flm_error *err) {
    const uint32_t d = hp->d_model, F = hp->d_ffn, n_ho = n - n_tr;
    flm_predictor_layer *S = &sp->layers[l];
    bool relu = flm_act_relu_family(hp->act); /* ReLU, squared ReLU: active exactly when the pre-activation is > 0 */
    uint32_t wt = b->gated ? b->gate_type : b->up_type;
    uint64_t woff = b->gated ? b->gate_off : b->up_off;
    for (uint32_t i = 0; i < F; i++) {
        const uint8_t *r = rec + (size_t)i * b->record_bytes;
        k->dequant[wt](r + woff, w->Wg + (size_t)i * d, d);
        if (b->gated && !relu) k->dequant[b->up_type](r + b->up_off, w->Wu + (size_t)i * d, d);
        k->dequant[b->down_type](r + b->down_off, w->col, d);
        double s2 = 0;
        for (uint32_t j = 0; j < d; j++) s2 += (double)w->col[j] * w->col[j];
        w->dn[i] = (float)sqrt(s2);
    }
    /* Zg = X W^T: n x F pre-activations of the gate (or up) projection */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)F, (int)d, 1.0f, X, (int)d, w->Wg, (int)d, 0.0f,
                w->Zg, (int)F);
    size_t nf = (size_t)n * F;
    if (b_up && !b->gated) /* ungated: Zg is the up projection, whose bias decides the activation */
        for (size_t j = 0; j < nf; j++) w->Zg[j] += b_up[j % F];
    flm_predictor_train_opts to;
    flm_predictor_train_opts_default(&to);
    to.init_W = w->Wg;
    to.epochs = o->epochs;
    to.n_threads = o->n_threads;
    flm_status st;
    if (relu) { /* the exact rule: active when the activation is positive; one level */
        S->rule = FLM_RULE_RELU;
        uint64_t active = 0;
        for (size_t j = 0; j < nf; j++) active += (w->Y[j] = w->Zg[j] > 0.0f);
        if ((st = flm_predictor_init(&S->pred, d, F, rank, err))) return st;
        to.target_recall = o->target_recall;
        flm_predictor_metrics m;
        if ((st = flm_predictor_train(&S->pred, X, w->Y, n, &to, &m, err))) return st;
        flm_predictor_round_f16(&S->pred);
        flm_level *v = &S->levels[0];
        *v = (flm_level){0.0f, S->pred.threshold, (float)((double)active / (double)nf), (float)m.active_frac_pred,
                         1.0f, (float)m.recall, (float)m.precision};
        return FLM_OK;
    }
    /* E = (h_i ||down_i||)^2, h_i = act(g_i) * u_i (gated) or act(u_i), then as a share of the token's sum */
    if (b->gated) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)F, (int)d, 1.0f, X, (int)d, w->Wu, (int)d,
                    0.0f, w->E, (int)F);
        if (b_up)
            for (size_t j = 0; j < nf; j++) w->E[j] += b_up[j % F];
    }
    for (size_t j = 0; j < nf; j++) {
        float a = flm_act_eval(hp->act, w->Zg[j]);
        float h = b->gated ? a * w->E[j] : a;
        float c = h * w->dn[j % F];
        w->E[j] = c * c;
    }
    /* each token's energies as shares of its own total: a token with massive activations (the first of a sequence,
     * often) would otherwise set every threshold (measured: SmolLM2 layer 11 kept one neuron) */
    for (uint32_t t = 0; t < n; t++) {
        float *e = w->E + (size_t)t * F;
        double sum = 0;
        for (uint32_t i = 0; i < F; i++) sum += e[i];
        float inv = sum > 0 ? (float)(1.0 / sum) : 0.0f;
        for (uint32_t i = 0; i < F; i++) e[i] *= inv;
    }
    S->rule = FLM_RULE_CONTRIB;
    /* the oracle's tau per level, over all recorded tokens */
    memset(w->h, 0, sizeof *w->h);
    for (size_t j = 0; j < nf; j++) hist_add(w->h, w->E[j], w->E[j]);
    for (uint32_t k = 0; k < sp->n_levels; k++) {
        double frac, kept;
        float t2 = hist_cut(w->h, sp->level_eps[k], &frac, &kept);
        S->levels[k].tau = t2 > 0 ? sqrtf(t2) : 0.0f;
        S->levels[k].oracle_frac = (float)frac;
    }
    /* labels of the training level on the first n_tr tokens; train */
    float t2_train = S->levels[train_level].tau * S->levels[train_level].tau;
    size_t ntf = (size_t)n_tr * F;
    for (size_t j = 0; j < ntf; j++) w->Y[j] = w->E[j] > t2_train;
    if ((st = flm_predictor_init(&S->pred, d, F, rank, err))) return st;
    flm_predictor_metrics m;
    if ((st = flm_predictor_train(&S->pred, X, w->Y, n_tr, &to, &m, err))) return st;
    flm_predictor_round_f16(&S->pred);
    /* held-out logits: Zp = (X_ho A^T) B^T + c */
    const flm_predictor *p = &S->pred;
    const float *Xho = X + (size_t)n_tr * d;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n_ho, (int)p->rank, (int)d, 1.0f, Xho, (int)d, p->A,
                (int)d, 0.0f, w->Hp, (int)p->rank);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n_ho, (int)F, (int)p->rank, 1.0f, w->Hp, (int)p->rank,
                p->B, (int)p->rank, 0.0f, w->Zp, (int)F);
    size_t nhf = (size_t)n_ho * F;
    const float *Eho = w->E + ntf;
    memset(w->h, 0, sizeof *w->h);
    for (size_t j = 0; j < nhf; j++) {
        w->Zp[j] += p->c[j % F];
        hist_add(w->h, w->Zp[j], Eho[j]);
    }
    for (uint32_t k = 0; k < sp->n_levels; k++) {
        flm_level *v = &S->levels[k];
        double frac, kept;
        v->pred_threshold = hist_cut(w->h, sp->level_eps[k], &frac, &kept);
        v->pred_frac = (float)frac;
        v->kept = (float)kept;
        uint64_t tp = 0, pos = 0, pred = 0;
        float t2 = v->tau * v->tau;
        for (size_t j = 0; j < nhf; j++) {
            bool a = Eho[j] > t2, q = w->Zp[j] > v->pred_threshold;
            pos += a;
            pred += q;
            tp += a && q;
        }
        v->recall = pos ? (float)((double)tp / (double)pos) : 1.0f;
        v->precision = pred ? (float)((double)tp / (double)pred) : 1.0f;
    }
    return FLM_OK;
}

/* One calibration of a file at a time: an exclusive advisory lock on the .flm, held until its region is replaced
 * (two runs would both write PATH.tmp and the one reporting success might not be the one in the file). Returns the
 * locked descriptor, or -1 with *st set. */
int flm_calib_lock(const char *path, flm_status *st, flm_error *err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO is refused below, not waited on */
    if (fd < 0) {
        *st = flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb = {0};
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        *st = flm_fail(err, FLM_ERR_IO, "%s: is %s, not a regular file: a model must be a file", path,
                       flm_file_kind(sb.st_mode));
        close(fd);
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        *st = flm_fail(err, FLM_ERR_IO, "%s: another `flashlm calibrate` is writing this file (%s); wait for it to "
                       "finish", path, errno == EWOULDBLOCK ? "it holds the lock" : strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* files in turns of chunk tokens (flm_calib_tokens): each file's first max tokens (flm_tokenize_file), interleaved */
static flm_status calib_tokens_turns(flm_ctx *ctx, const char *const *files, uint32_t chunk, bool add_bos, size_t max,
                                     int32_t **ids, size_t *n, flm_error *err) {
    size_t nf = 0, total = 0;
    while (files[nf]) nf++;
    int32_t **one = calloc(nf, sizeof *one);
    size_t *n_one = calloc(nf, sizeof *n_one), *at = calloc(nf, sizeof *at);
    flm_status st = one && n_one && at ? FLM_OK : flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory");
    for (size_t i = 0; i < nf && !st; i++)
        if (!(st = flm_tokenize_file(ctx, files[i], add_bos, max, &one[i], &n_one[i], err))) total += n_one[i];
    if (max && total > max) total = max;
    int32_t *v = st ? NULL : malloc((total ? total : 1) * sizeof *v);
    if (!st && !v) st = flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory for the texts' tokens");
    for (size_t k = 0, i = 0; !st && k < total; i = (i + 1) % nf) /* a turn: chunk tokens of file i, or its rest */
        for (uint32_t c = 0; c < chunk && at[i] < n_one[i] && k < total; c++) v[k++] = one[i][at[i]++];
    for (size_t i = 0; one && i < nf; i++) free(one[i]);
    free(one);
    free(n_one);
    free(at);
    if (st) return st;
    *ids = v;
    *n = total;
    return FLM_OK;
}

flm_status flm_calib_tokens(flm_ctx *ctx, const char *text, const char *text_file, const char *const *files,
                            uint32_t chunk, bool add_bos, size_t max, int32_t **ids, size_t *n, flm_error *err) {
    *ids = NULL;
    *n = 0;
    if (!flm_calib_has_text(text, text_file, files)) return flm_fail(err, FLM_ERR_ARG, "calibrate: no text given");
    if (!text && files && files[0]) {
        if (!chunk) return flm_fail(err, FLM_ERR_ARG, "calibrate: several texts need a chunk of at least 1 token");
        return calib_tokens_turns(ctx, files, chunk, add_bos, max, ids, n, err);
    }
    if (!text) return flm_tokenize_file(ctx, text_file, add_bos, max, ids, n, err);
    if (!(*ids = flm_tokenize_all(ctx, text, add_bos, n))) return flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory");
    return FLM_OK;
}

static flm_status calibrate_locked(const char *path, const flm_calib_opts *o, flm_predictor_region *report, int *hot,
                                   flm_error *err);
static flm_status levels_locked(const char *path, const flm_calib_opts *o, flm_predictor_region *report,
                                flm_error *err);

flm_status flm_calibrate(const char *path, const flm_calib_opts *o, flm_predictor_region *report, flm_error *err) {
    return flm_calibrate_ex(path, o, report, NULL, err);
}

flm_status flm_calibrate_ex(const char *path, const flm_calib_opts *o, flm_predictor_region *report, int *hot,
                            flm_error *err) {
    flm_status st = FLM_OK;
    if (hot) *hot = FLM_CALIB_HOT_NONE;
    int fd = flm_calib_lock(path, &st, err);
    if (fd < 0) return st;
    st = calibrate_locked(path, o, report, hot, err);
    close(fd); /* releases the lock */
    return st;
}

flm_status flm_calibrate_levels(const char *path, const flm_calib_opts *o, flm_predictor_region *report,
                                flm_error *err) {
    flm_status st = FLM_OK;
    int fd = flm_calib_lock(path, &st, err);
    if (fd < 0) return st;
    st = levels_locked(path, o, report, err);
    close(fd);
    return st;
}

/* One calibration's state across its steps (calibrate_locked): what each step leaves for the next and what
 * calib_run_free releases. */
typedef struct calib_run {
    const char *path;
    const flm_calib_opts *o;
    int *hot;
    char spill[4200], work_buf[4200];
    const char *work;       /* the file being calibrated: the model, or its hot-ordered copy (work_buf) */
    bool streaming;         /* under a budget: recorded in hybrid mode, nothing else held across the phases */
    flm_ctx *ctx;
    uint64_t budget;        /* --mem in bytes, as the plan resolved it (runtime/plan.c) */
    flm_hparams hp;         /* a copy: outlives ctx when streaming */
    const flm_kernels *kern;
    uint32_t L, d, F;
    bool relu;
    flm_predictor_region sp;
    tap_data td;
    int32_t *chunk_toks;
    uint32_t n_x;           /* entries of td.X */
    int32_t *ids;
    size_t n_tok;
    uint32_t n, n_eval;     /* tokens recorded; held out for the check */
    const int32_t *eval_ids;
    int32_t bos;
    uint32_t train_level, rank, rank_last, n_tr, max_rank, def;
    layer_work w;
    uint8_t *region;
    float *sim_scratch, *xbuf;
    float **dn_all;
    float *b_up_all;        /* FFN biases: [n_layers][d_ffn] b_up, NULL without */
    void *records;          /* streaming: one layer's FFN region, read from the file */
    flm_file *hdr;          /* streaming: the file's regions */
    uint32_t L_all;
} calib_run;

static flm_status calib_check_opts(const flm_calib_opts *o, flm_error *err) {
    if (!flm_calib_has_text(o->text, o->text_file, o->text_files) || o->chunk < 16 || o->max_tokens < 64 ||
        !(o->level >= 0.0f && o->level < 1.0f) || !(o->max_loss > 0.0f && o->max_loss < 1.0f) ||
        !(o->train_eps > 0.0f && o->train_eps < 1.0f) ||
        !(o->mem_percent >= 0))
        return flm_fail(err, FLM_ERR_ARG, "calibrate: bad options (chunk >= 16, tokens >= 64, 0 <= level < 1, "
                        "0 < max_loss < 1, 0 < train_eps < 1, mem_percent >= 0)");
    return FLM_OK;
}

/* Open the model (hybrid under a budget, else ram), copy what outlives the context (hyper-parameters, FFN biases). */
static flm_status calib_open(calib_run *c, flm_error *err) {
    flm_status st = open_mode(c->path, c->o, c->streaming ? FLM_MODE_HYBRID : FLM_MODE_RAM, &c->ctx, err);
    if (st) return st;
    flm_plan_info plan;
    flm_get_plan(c->ctx, &plan);
    c->budget = plan.budget;
    const flm_model *model = flm_ctx_model(c->ctx);
    c->hp = model->hp;
    c->kern = flm_ctx_kernels(c->ctx);
    if (!flm_ctx_file(c->ctx)) /* a GGUF has no bundles */
        return flm_fail(err, FLM_ERR_ARG, "%s: calibrate needs a .flm file", c->path);
    c->L = c->hp.n_layers, c->d = c->hp.d_model, c->F = c->hp.d_ffn;
    c->L_all = c->L;
    c->relu = flm_act_relu_family(c->hp.act);
    const uint32_t L = c->L, F = c->F;
    if (model->layers[0].ffn_up_b.data) { /* FFN biases: each layer's b_up, copied (the model may close) */
        if (!(c->b_up_all = malloc((size_t)L * F * sizeof(float))))
            return flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory");
        for (uint32_t l = 0; l < L; l++)
            memcpy(c->b_up_all + (size_t)l * F, model->layers[l].ffn_up_b.data, (size_t)F * sizeof(float));
    }
    return FLM_OK;
}

/* 0. tokens: the held-out check's from the end of the text, then those recorded; under a budget, training's memory
 * checked before anything is recorded. */
static flm_status calib_tokens(calib_run *c, flm_error *err) {
    const flm_calib_opts *o = c->o;
    const bool need_eval = !c->relu && o->level == 0.0f;
    flm_status st = flm_calib_tokens(c->ctx, o->text, o->text_file, o->text_files, o->chunk, true,
                                     (size_t)o->max_tokens + (need_eval ? o->eval_tokens : 0u), &c->ids, &c->n_tok,
                                     err);
    if (st) return st;
    const size_t n_tok = c->n_tok; /* a text file: read only as far as the tokens used (recorded, then held out) */
    c->n_eval = 0;
    if (need_eval) {
        size_t cap = n_tok / 4;
        c->n_eval = (uint32_t)(o->eval_tokens < cap ? o->eval_tokens : cap);
        c->n_eval -= c->n_eval % o->chunk;
        if (c->n_eval < 2 * o->chunk) c->n_eval = 0; /* too short to measure: the training level is the default */
    }
    size_t avail = n_tok - c->n_eval;
    uint32_t n = (uint32_t)(avail < o->max_tokens ? avail : o->max_tokens);
    n -= n % o->chunk; /* whole chunks */
    if (n < 64)
        return flm_fail(err, FLM_ERR_ARG, "calibrate: the text gives %zu tokens; at least %u are needed (chunks of %u)",
                        n_tok, o->chunk > 64 ? o->chunk : 64, o->chunk);
    c->n = n;
    c->eval_ids = c->ids + (n_tok - c->n_eval);
    if (c->streaming) { /* what training holds must fit the budget: find out before recording */
        flm_calib_opts on = *o;
        on.max_tokens = n;
        uint64_t need = flm_calibrate_train_bytes(&c->hp, &on);
        if (need > c->budget)
            return flm_fail(err, FLM_ERR_BUDGET, "%s: a memory budget of %s cannot hold calibrate's training: %.2f MiB "
                            "for %u tokens x %u neurons and the predictors of %u layers; raise --mem or lower --tokens "
                            "(or --rank)", c->path, flm_size(c->budget).s, flm_mib(need), n, c->F, c->L);
    }
    return FLM_OK;
}

/* 0b. the hot order (o->hot_tokens): after the checks above, which need no work, before anything is recorded (the
 * predictors are trained on the new order). The ordering opens the model itself: ours is closed meanwhile. */
static flm_status calib_hot_order(calib_run *c, flm_error *err) {
    const flm_calib_opts *o = c->o;
    if (!o->hot_tokens) return FLM_OK;
    if (flm_is_hot_ordered(c->path)) {
        if (c->hot) *c->hot = FLM_CALIB_HOT_KEPT;
        return FLM_OK;
    }
    flm_close(c->ctx);
    c->ctx = NULL;
    flm_hot_opts ho;
    flm_hot_opts_default(&ho);
    ho.max_tokens = o->hot_tokens;
    ho.text_file = o->text_file;
    ho.text_files = o->text_files;
    ho.chunk = o->chunk;
    ho.n_threads = o->n_threads;
    ho.mem_bytes = o->mem_bytes;
    ho.mem_percent = o->mem_percent;
    ho.progress = o->progress;
    ho.user = o->user;
    /* the ordered model goes to a copy beside it ("<path>.cal.tmp", ours while the calibration lock is held), which
     * is calibrated and renamed onto the model at the end: one replacement, or none on any error (a full disk after
     * the ordering left the model ordered but uncalibrated, exit 1) */
    ho.out_path = c->work_buf;
    flm_status st = flm_hot_order_unlocked(c->path, o->text, &ho, err);
    if (st == FLM_ERR_UNSUPPORTED) { /* FFN biases: calibrate in the old order */
        if (c->hot) *c->hot = FLM_CALIB_HOT_UNSUPPORTED;
    } else if (st) {
        return st;
    } else {
        if (c->hot) *c->hot = FLM_CALIB_HOT_DONE;
        c->work = c->work_buf;
    }
    return open_mode(c->work, o, c->streaming ? FLM_MODE_HYBRID : FLM_MODE_RAM, &c->ctx, err);
}

/* 1. record the FFN inputs of every layer on the text (in memory, or through the spill file under a budget) */
static flm_status calib_record(calib_run *c, flm_error *err) {
    const flm_calib_opts *o = c->o;
    const uint32_t L = c->L, n = c->n;
    tap_data *td = &c->td;
    td->d_model = c->d;
    td->n = n;
    if (!(td->next = calloc(L, sizeof *td->next))) return flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory");
    if (c->streaming) {
        td->fd = open(c->spill, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600); /* never through a link */
        if (td->fd < 0)
            return flm_fail(err, FLM_ERR_IO, "%s: cannot write the recorded inputs: %s", c->spill, strerror(errno));
    } else {
        td->X = calloc(L, sizeof *td->X);
        c->n_x = L;
        if (!td->X) return flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory");
        for (uint32_t l = 0; l < L; l++)
            if (!(td->X[l] = malloc((size_t)n * c->d * sizeof(float))))
                return flm_fail(err, FLM_ERR_NOMEM, "calibrate: cannot hold %u tokens x %u layers of FFN inputs "
                                "(calibrate --mem BYTES streams them through a file)", n, L);
    }
    const flm_ffn_hooks hooks = {.tap = tap, .tap_user = td};
    /* each chunk starts as the model's own sequences do: with BOS when its tokenizer adds one (as flm_perplexity);
     * Qwen2.5 adds none, and an <|endoftext|> forced in front changed its activations (the check's predictor cost
     * read +10% at a level where the sparse mode measured none) */
    const flm_model *model = flm_ctx_model(c->ctx);
    c->bos = flm_tokenizer_wants_bos(model->tok) ? flm_tokenizer_bos(model->tok) : -1;
    /* chunk by chunk (the first token of each replaced by BOS), in batches of -b tokens */
    if (!(c->chunk_toks = malloc((size_t)o->chunk * sizeof *c->chunk_toks)))
        return flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory");
    for (uint32_t t = 0; t < n;) {
        uint32_t m = n - t < o->chunk ? n - t : o->chunk, b = (uint32_t)flm_ctx_params(c->ctx)->n_batch;
        memcpy(c->chunk_toks, c->ids + t, (size_t)m * sizeof *c->chunk_toks);
        if (c->bos >= 0) c->chunk_toks[0] = c->bos;
        for (uint32_t j = 0; j < m; j += b) {
            const float *logits;
            flm_status st = flm_eval_hooked(c->ctx, c->chunk_toks + j, m - j < b ? m - j : b, (int32_t)j, &hooks, NULL,
                                            &logits, err);
            if (st) return st;
            if (td->err_no)
                return flm_fail(err, FLM_ERR_IO, "%s: cannot write the recorded inputs: %s", c->spill,
                                strerror(td->err_no));
            if (o->progress) o->progress(o->user, "recording tokens", t + (m - j < b ? m : j + b), n);
        }
        t += m;
    }
    if (c->streaming) { /* the model is not needed again before the check: its memory is training's now */
        flm_close(c->ctx);
        c->ctx = NULL;
        return flm_file_open_ex(c->work, FLM_FILE_HEADER_ONLY, &c->hdr, err);
    }
    return FLM_OK;
}

/* 2. the levels: one for ReLU models; else the standard ones with the training level and a forced one */
static flm_status calib_levels(calib_run *c, flm_error *err) {
    const flm_calib_opts *o = c->o;
    flm_predictor_region *sp = &c->sp;
    sp->n_layers = c->L;
    sp->layers = calloc(c->L, sizeof *sp->layers);
    if (!sp->layers) return flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory");
    c->train_level = 0;
    if (c->relu) {
        sp->n_levels = 1;
        sp->level_eps[0] = 0.0f;
    } else {
        sp->n_levels = flm_calib_standard_levels(sp->level_eps, FLM_MAX_LEVELS);
        float extra[2] = {o->train_eps, o->level};
        for (int e = 0; e < 2; e++) { /* the training level and a forced one join the list, kept ascending */
            if (extra[e] <= 0.0f || flm_predictor_region_find_level(sp, extra[e]) >= 0) continue;
            if (sp->n_levels == FLM_MAX_LEVELS) sp->n_levels--; /* drop the most aggressive standard level */
            uint32_t k = sp->n_levels;
            while (k > 0 && sp->level_eps[k - 1] > extra[e]) { sp->level_eps[k] = sp->level_eps[k - 1]; k--; }
            sp->level_eps[k] = extra[e];
            sp->n_levels++;
        }
        c->train_level = (uint32_t)flm_predictor_region_find_level(sp, o->train_eps);
    }
    for (uint32_t k = 0; k < FLM_MAX_LEVELS; k++)
        sp->level_loss[k] = sp->level_loss_oracle[k] = sp->level_dnll[k] = sp->level_dnll_oracle[k] = NAN;
    return FLM_OK;
}

/* 3. per layer: rule, levels, predictor (training's buffers in c->w) */
static flm_status calib_train(calib_run *c, flm_error *err) {
    const flm_calib_opts *o = c->o;
    const flm_hparams *hp = &c->hp;
    const uint32_t L = c->L, d = c->d, F = c->F, n = c->n;
    layer_work *w = &c->w;
    calib_ranks(hp, o, &c->rank, &c->rank_last);
    uint32_t n_tr = c->relu ? n : n - (n / 5) / o->chunk * o->chunk; /* the last fifth (whole chunks): thresholds */
    if (!c->relu && n_tr == n) n_tr = n - n / 5;
    c->n_tr = n_tr;
    const uint32_t n_ho = n - n_tr;
    c->max_rank = c->rank > c->rank_last ? c->rank : c->rank_last;
    w->Wg = malloc((size_t)F * d * sizeof(float));
    w->Wu = malloc((size_t)F * d * sizeof(float));
    c->dn_all = calloc(L, sizeof *c->dn_all);
    for (uint32_t l = 0; c->dn_all && l < L; l++)
        if (!(c->dn_all[l] = malloc((size_t)F * sizeof(float)))) { free(w->Wg); w->Wg = NULL; }
    w->col = malloc((size_t)d * sizeof(float));
    w->Zg = malloc((size_t)n * F * sizeof(float));
    w->E = malloc((size_t)n * F * sizeof(float));
    w->Zp = malloc(((size_t)n_ho * F + 1) * sizeof(float));
    w->Hp = malloc(((size_t)n_ho * c->max_rank + 1) * sizeof(float));
    w->Y = malloc((size_t)n * F);
    w->h = malloc(sizeof *w->h);
    if (c->streaming) c->xbuf = malloc((size_t)n * d * sizeof(float));
    if (!c->dn_all || !w->Wg || !w->Wu || !w->col || !w->Zg || !w->E || !w->Zp || !w->Hp || !w->Y || !w->h ||
        (c->streaming && !c->xbuf))
        return flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory for %u tokens x %u neurons", n, F);
    for (uint32_t l = 0; l < L; l++) {
        uint32_t r = l >= L - (L + 3) / 4 ? c->rank_last : c->rank;
        w->dn = c->dn_all[l];
        const uint8_t *rec;
        const flm_bundle_desc *b = NULL;
        flm_bundle_desc desc;
        const float *b_up = c->b_up_all ? c->b_up_all + (size_t)l * F : NULL;
        if (c->streaming) { /* the layer's FFN region from the file (checksummed), its layout from the header */
            const flm_region *reg = c->hdr->ffn[l];
            flm_bundle_layout bl = flm_bundle_layout_of(d, reg->up_type, reg->gate_type, reg->down_type, hp->gated);
            desc = (flm_bundle_desc){d, reg->up_type, reg->gate_type, reg->down_type, bl.up_off, bl.gate_off,
                                     bl.down_off, bl.record_bytes, hp->gated, hp->act, 0.0f, b_up, NULL, 0, NULL};
            b = &desc;
            free(c->records);
            c->records = NULL;
            flm_status st = flm_file_read_region(c->hdr, reg, &c->records, err);
            if (st) return st;
            rec = c->records;
        } else {
            rec = flm_ffn_resident_records(c->ctx, l, &b); /* opened in ram mode: every layer resident */
            if (!rec) return flm_fail(err, FLM_ERR_ARG, "layer %u's FFN is not in memory", l);
        }
        const float *X = layer_x(&c->td, l, 0, n, c->xbuf, err);
        if (!X) return FLM_ERR_IO;
        flm_status st = calibrate_layer(hp, c->kern, rec, b, b_up, o, l, X, n, n_tr, &c->sp, c->train_level, r, w, err);
        if (st) return st;
        if (o->progress) o->progress(o->user, "training predictors", l + 1, L);
    }
    free(c->records);
    c->records = NULL;
    return FLM_OK;
}

/* 4. the default level: forced, measured on held-out text, or the training level; then the union statistics */
static flm_status calib_default_level(calib_run *c, flm_error *err) {
    const flm_calib_opts *o = c->o;
    const uint32_t L = c->L, d = c->d, F = c->F, n = c->n;
    flm_predictor_region *sp = &c->sp;
    c->def = c->train_level;
    if (o->level > 0.0f && !c->relu) c->def = (uint32_t)flm_predictor_region_find_level(sp, o->level);
    if (c->n_eval && c->streaming) {
        /* the check runs the model in memory (ram mode), beside the reference logits: only when both fit what the
         * budget has left besides the predictors; training's buffers are not needed again */
        layer_work_free(&c->w);
        uint64_t preds = 0;
        for (uint32_t l = 0; l < L; l++)
            preds += ((uint64_t)sp->layers[l].pred.rank * (d + F) + F) * 6;
        if (open_ram(c->work, o, &c->ctx, err) == FLM_OK) {
            flm_stats s;
            flm_get_stats(c->ctx, &s);
            uint64_t held = s.mem_resident + s.mem_ffn + s.mem_kv + s.mem_scratch + preds +
                            (uint64_t)c->n_eval * c->hp.n_vocab * sizeof(float);
            if (held > c->budget) { flm_close(c->ctx); c->ctx = NULL; }
        } else {
            c->ctx = NULL; /* the budget cannot hold the model in memory: not measured */
        }
        if (!c->ctx) c->n_eval = 0;
    }
    if (c->n_eval) {
        uint32_t scratch_floats = c->max_rank + F;
        c->sim_scratch = malloc(scratch_floats * sizeof(float));
        if (!c->sim_scratch) return flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory");
        flm_status st = check_levels(c->ctx, sp, c->eval_ids, c->n_eval, c->bos, o, c->sim_scratch, c->dn_all, &c->def,
                                     err);
        if (st) return st;
    }
    sp->default_level = c->def;
    sp->target_sparsity = sp->level_eps[c->def];
    flm_predictor_region_use_level(sp, c->def);
    for (uint32_t l = 0; l < L; l++) {
        uint32_t na = n < 1024 ? n : 1024; /* the union statistics, on the last tokens recorded */
        na -= na % o->chunk;
        if (na == 0) na = n;
        const float *X = layer_x(&c->td, l, n - na, na, c->xbuf, err);
        if (!X) return FLM_ERR_IO;
        aggregate(&sp->layers[l].pred, X, na, o->chunk, sp->layers[l].s_agg);
    }
    return FLM_OK;
}

/* 5. store: the predictor region into the working file, then (a hot-ordered copy) the one rename onto the model */
static flm_status calib_store(calib_run *c, flm_error *err) {
    size_t len = 0;
    flm_status st = flm_predictor_region_serialize(&c->sp, &c->region, &len, err);
    if (st) return st;
    flm_close(c->ctx); /* the file is replaced below */
    c->ctx = NULL;
    if ((st = flm_file_put_region(c->work, FLM_REGION_PREDICTOR, c->region, len, err))) return st;
    if (c->work != c->path) { /* the one replacement of the model: its ordered, calibrated copy */
        if (rename(c->work, c->path) != 0)
            return flm_fail(err, FLM_ERR_IO, "%s: cannot rename onto %s: %s", c->work, c->path, strerror(errno));
        c->work = c->path;
        char dir[4200];
        snprintf(dir, sizeof dir, "%s", c->path);
        char *slash = strrchr(dir, '/');
        if (!slash) snprintf(dir, sizeof dir, ".");
        else if (slash == dir) dir[1] = 0;
        else *slash = 0;
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) { fsync(dfd); close(dfd); }
    }
    return FLM_OK;
}

/* Release everything c holds; on an error after the ordering, remove the ordered copy (the model is as it was). */
static void calib_run_free(calib_run *c) {
    if (c->work != c->path) unlink(c->work);
    if (c->ctx) flm_close(c->ctx);
    if (c->td.fd >= 0) {
        close(c->td.fd);
        remove(c->spill);
    }
    flm_file_close(c->hdr);
    free(c->records);
    free(c->xbuf);
    for (uint32_t l = 0; c->td.X && l < c->n_x; l++) free(c->td.X[l]);
    free(c->td.X);
    free(c->td.next);
    free(c->chunk_toks);
    free(c->ids);
    layer_work_free(&c->w);
    for (uint32_t l = 0; c->dn_all && l < c->L_all; l++) free(c->dn_all[l]);
    free(c->dn_all);
    free(c->b_up_all);
    free(c->region);
    free(c->sim_scratch);
}

static flm_status calibrate_locked(const char *path, const flm_calib_opts *o, flm_predictor_region *report, int *hot,
                                   flm_error *err) {
    flm_calib_opts dflt;
    if (!o) { flm_calib_opts_default(&dflt); o = &dflt; }
    flm_status st = calib_check_opts(o, err);
    if (st) return st;
    calib_run *c = calloc(1, sizeof *c);
    if (!c) return flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory");
    c->path = c->work = path;
    c->o = o;
    c->hot = hot;
    c->td.fd = -1;
    c->td.spill_path = c->spill;
    /* the result is written next to the model: find out now, not after minutes of work */
    snprintf(c->work_buf, sizeof c->work_buf, "%s.cal.tmp", path);
    unlink(c->work_buf); /* a calibrate killed meanwhile left it: ours now (the calibration lock is held) */
    snprintf(c->spill, sizeof c->spill, "%s.x.tmp", path); /* only while the model is locked (flm_calib_lock) */
    {   /* the checked writer's rules, a temporary created and removed (core/files.h) */
        flm_out *t = NULL;
        if ((st = flm_out_open(path, path, FLM_OUT_SELF | FLM_OUT_REPLACE, &t, err))) {
            free(c);
            return st;
        }
        flm_out_abort(t);
    }
    /* Under a budget the model is recorded in hybrid mode (streamed as far as the budget needs) and nothing else is
     * held across the phases; without one, in ram mode, one context for everything. */
    c->streaming = has_budget(o);
    if (!(st = calib_open(c, err)) && !(st = calib_tokens(c, err)) && !(st = calib_hot_order(c, err)) &&
        !(st = calib_record(c, err)) && !(st = calib_levels(c, err)) && !(st = calib_train(c, err)) &&
        !(st = calib_default_level(c, err)))
        st = calib_store(c, err);
    calib_run_free(c);
    if (!st && report) *report = c->sp;
    else flm_predictor_region_free(&c->sp);
    free(c);
    return st;
}

static flm_status levels_locked(const char *path, const flm_calib_opts *o, flm_predictor_region *report,
                                flm_error *err) {
    flm_calib_opts dflt;
    if (!o) { flm_calib_opts_default(&dflt); o = &dflt; }
    if (!flm_calib_has_text(o->text, o->text_file, o->text_files) || o->chunk < 16 ||
        !(o->max_loss > 0.0f && o->max_loss < 1.0f))
        return flm_fail(err, FLM_ERR_ARG, "calibrate --levels-only: bad options (chunk >= 16, 0 < max_loss < 1)");
    flm_ctx *ctx = NULL;
    flm_status st = open_ram(path, o, &ctx, err);
    if (st) return st;
    flm_predictor_region sp = {0};
    int32_t *ids = NULL;
    float *scratch = NULL;
    uint8_t *region = NULL;
    void *stored = NULL;
    const flm_hparams *hp = &flm_ctx_model(ctx)->hp;
    const flm_file *f = flm_ctx_file(ctx);
    if (!f || !f->predictor) {
        st = flm_fail(err, FLM_ERR_ARG, "%s: not calibrated: run `flashlm calibrate %s --text FILE` first", path, path);
        goto done;
    }
    if ((st = flm_file_read_region(f, f->predictor, &stored, err)) ||
        (st = flm_predictor_region_deserialize(stored, f->predictor->size, path, &sp, err)))
        goto done;
    if (sp.n_layers != hp->n_layers || sp.layers[0].rule == FLM_RULE_RELU || sp.n_levels < 2) {
        st = flm_fail(err, FLM_ERR_ARG, "%s: its calibration has one level: nothing to choose", path);
        goto done;
    }
    uint32_t max_rank = 0;
    for (uint32_t l = 0; l < sp.n_layers; l++) { /* f32 copies for BLAS */
        flm_predictor *q = &sp.layers[l].pred;
        size_t na = (size_t)q->rank * q->d_model, nb = (size_t)q->d_ffn * q->rank;
        max_rank = q->rank > max_rank ? q->rank : max_rank;
        if (q->A) continue;
        if (!(q->A = malloc(na * sizeof(float))) || !(q->B = malloc(nb * sizeof(float)))) {
            st = flm_fail(err, FLM_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < na; i++) q->A[i] = flm_f16_to_f32(q->A16[i]);
        for (size_t i = 0; i < nb; i++) q->B[i] = flm_f16_to_f32(q->B16[i]);
    }
    size_t n_tok = 0; /* a text file: only its first eval_tokens tokens are read */
    if ((st = flm_calib_tokens(ctx, o->text, o->text_file, o->text_files, o->chunk, true, o->eval_tokens, &ids,
                               &n_tok, err)))
        goto done;
    uint32_t n_eval = (uint32_t)(o->eval_tokens < n_tok ? o->eval_tokens : n_tok);
    n_eval -= n_eval % o->chunk;
    if (n_eval < 2 * o->chunk) {
        st = flm_fail(err, FLM_ERR_ARG, "calibrate --levels-only: the text gives %zu tokens, at least %u are needed",
                      n_tok, 2 * o->chunk);
        goto done;
    }
    const int32_t *eval_ids = ids + (n_tok - n_eval);
    /* each chunk starts as the model's own sequences do: with BOS when its tokenizer adds one (as flm_perplexity);
     * Qwen2.5 adds none, and an <|endoftext|> forced in front changed its activations (the check's predictor cost
     * read +10% at a level where the sparse mode measured none) */
    int32_t bos = flm_tokenizer_wants_bos(flm_ctx_model(ctx)->tok) ? flm_tokenizer_bos(flm_ctx_model(ctx)->tok) : -1;
    scratch = malloc(((size_t)max_rank + hp->d_ffn) * sizeof(float));
    if (!scratch) { st = flm_fail(err, FLM_ERR_NOMEM, "out of memory for the held-out check"); goto done; }
    for (uint32_t k = 0; k < FLM_MAX_LEVELS; k++) sp.level_loss[k] = sp.level_dnll[k] = NAN;
    uint32_t def = 0;
    if ((st = check_levels(ctx, &sp, eval_ids, n_eval, bos, o, scratch, NULL, &def, err))) goto done;
    sp.default_level = def;
    sp.target_sparsity = sp.level_eps[def];
    flm_predictor_region_use_level(&sp, def); /* s_agg stays the calibration's (measured at its default level) */
    size_t len = 0;
    if ((st = flm_predictor_region_serialize(&sp, &region, &len, err))) goto done;
    flm_close(ctx);
    ctx = NULL;
    st = flm_file_put_region(path, FLM_REGION_PREDICTOR, region, len, err);
done:
    if (ctx) flm_close(ctx);
    free(ids);
    free(scratch);
    free(region);
    free(stored);
    if (!st && report) *report = sp;
    else flm_predictor_region_free(&sp);
    return st;
}
