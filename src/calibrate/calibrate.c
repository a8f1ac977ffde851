/* calibrate.c — record, decide the activation rule, train predictors, store them (docs/SPARSITY.md). */
#include "calibrate/calibrate.h"

#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/types.h"
#include "runtime/runtime.h"
#include "sparsity/sparsity.h"
#include "core/error.h"
#include "compute/act.h"

void flm_calib_opts_default(flm_calib_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_tokens = 4096;
    o->chunk = 128;
    o->sparsity = 0.5f;
    o->target_recall = 0.95f;
    o->epochs = 6;
    o->n_threads = 2;
}

typedef struct {
    float **X;          /* [n_layers][max_tokens * d_model] */
    uint32_t d_model, cur;
} tap_data;

static void tap(void *user, uint32_t layer, const float *x) {
    tap_data *t = user;
    memcpy(t->X[layer] + (size_t)t->cur * t->d_model, x, t->d_model * sizeof(float));
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
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
        uint64_t hist[FLM_AGG_K] = {0};
        for (uint32_t i = 0; i < d_ffn; i++) {
            int64_t age = (int64_t)t - last[i];
            if (age >= 0 && age < FLM_AGG_K) hist[age]++;
        }
        uint64_t acc = 0;
        for (int k = 0; k < FLM_AGG_K; k++) {
            acc += hist[k];
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

flm_status flm_calibrate(const char *path, const flm_calib_opts *o, flm_sparsity *report, flm_error *err) {
    flm_calib_opts def;
    if (!o) { flm_calib_opts_default(&def); o = &def; }
    if (!o->text || o->chunk < 16 || o->max_tokens < 64 || !(o->sparsity >= 0.0f && o->sparsity < 1.0f))
        return flm_fail(err, FLM_ERR_ARG, "calibrate: bad options (chunk >= 16, tokens >= 64, 0 <= sparsity < 1)");
    /* the result is written next to the model: find out now, not after minutes of work */
    {
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *t = fopen(tmp, "wb");
        if (!t) return flm_fail(err, FLM_ERR_IO, "%s: cannot write next to the model: %s", tmp, strerror(errno));
        fclose(t);
        remove(tmp);
    }
    flm_params p;
    flm_params_default(&p);
    p.mode = FLM_MODE_RAM;
    p.n_ctx = (int)o->chunk;
    if (o->n_threads > 0) p.n_threads = o->n_threads;
    flm_ctx *ctx = NULL;
    flm_status st = flm_open(path, &p, &ctx, err);
    if (st) return st;
    flm_sparsity sp = {0};
    tap_data td = {0};
    uint32_t n_x = 0; /* entries of td.X */
    int32_t *ids = NULL;
    float *W = NULL, *Z = NULL, *mag = NULL;
    uint8_t *Y = NULL, *region = NULL;
    const flm_hparams *hp = &ctx->model->hp;
    const flm_bundle_desc *b0 = NULL;
    if (!flm_ffn_resident_records(ctx, 0, &b0)) { /* a GGUF has no bundles */
        st = flm_fail(err, FLM_ERR_ARG, "%s: calibrate needs a .flm file", path);
        goto done;
    }
    uint32_t L = hp->n_layers, d = hp->d_model, F = hp->d_ffn;
    /* 1. record the FFN inputs of every layer on the text */
    size_t n_tok = 0;
    ids = flm_tokenize_all(ctx, o->text, true, &n_tok);
    if (!ids) { st = flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory"); goto done; }
    uint32_t n = (uint32_t)(n_tok < o->max_tokens ? n_tok : o->max_tokens);
    n -= n % o->chunk; /* whole chunks */
    if (n < 64) {
        st = flm_fail(err, FLM_ERR_ARG, "calibrate: the text gives %zu tokens; at least %u are needed (chunks of %u)",
                      n_tok, o->chunk > 64 ? o->chunk : 64, o->chunk);
        goto done;
    }
    td.d_model = d;
    td.X = calloc(L, sizeof *td.X);
    n_x = L;
    if (!td.X) { st = flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory"); goto done; }
    for (uint32_t l = 0; l < L; l++)
        if (!(td.X[l] = malloc((size_t)n * d * sizeof(float)))) {
            st = flm_fail(err, FLM_ERR_NOMEM, "calibrate: cannot hold %u tokens x %u layers of FFN inputs", n, L);
            goto done;
        }
    flm_set_ffn_tap(ctx, tap, &td);
    int32_t bos = flm_tokenizer_bos(ctx->model->tok);
    for (uint32_t t = 0; t < n; t++) {
        uint32_t pos = t % o->chunk;
        int32_t tok = pos == 0 && bos >= 0 ? bos : ids[t];
        const float *logits;
        td.cur = t;
        if ((st = flm_eval(ctx, tok, (int32_t)pos, &logits, err))) goto done;
        if (o->progress && (t + 1) % o->chunk == 0) o->progress(o->user, "recording tokens", t + 1, n);
    }
    flm_set_ffn_tap(ctx, NULL, NULL);
    /* 2. per layer: activations, rule, predictor, aggregation statistics */
    sp.n_layers = L;
    sp.target_sparsity = hp->act == FLM_ACT_RELU ? 0.0f : o->sparsity;
    sp.layers = calloc(L, sizeof *sp.layers);
    W = malloc((size_t)F * d * sizeof(float));
    Z = malloc((size_t)n * F * sizeof(float));
    mag = malloc((size_t)n * F * sizeof(float));
    Y = malloc((size_t)n * F);
    if (!sp.layers || !W || !Z || !mag || !Y) { st = flm_fail(err, FLM_ERR_NOMEM, "calibrate: out of memory"); goto done; }
    uint32_t rank = o->rank ? o->rank : (d / 2 < 128 ? d / 2 : 128);
    uint32_t maxr = d < F ? d : F;
    if (rank > maxr) rank = maxr;
    if (rank < 1) rank = 1;
    uint32_t rank_last = o->rank_last ? o->rank_last : 2 * rank;
    if (rank_last > maxr) rank_last = maxr;
    for (uint32_t l = 0; l < L; l++) {
        flm_layer_sparsity *S = &sp.layers[l];
        const flm_bundle_desc *b = NULL;
        const uint8_t *rec = flm_ffn_resident_records(ctx, l, &b); /* opened in ram mode: every layer resident */
        if (!rec) { st = flm_fail(err, FLM_ERR_ARG, "%s: layer %u's FFN is not in memory", path, l); goto done; }
        uint32_t wt = b->gated ? b->gate_type : b->up_type;
        uint64_t woff = b->gated ? b->gate_off : b->up_off;
        for (uint32_t i = 0; i < F; i++)
            ctx->k->dequant[wt](rec + (size_t)i * b->record_bytes + woff, W + (size_t)i * d, d);
        /* Z = X W^T: n x F pre-activations of the gate (or up) projection */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)F, (int)d, 1.0f, td.X[l], (int)d, W, (int)d,
                    0.0f, Z, (int)F);
        size_t nf = (size_t)n * F;
        uint64_t active = 0;
        if (hp->act == FLM_ACT_RELU) {
            S->rule = FLM_RULE_RELU;
            S->threshold = 0.0f;
            for (size_t j = 0; j < nf; j++) active += (Y[j] = Z[j] > 0.0f);
        } else {
            S->rule = FLM_RULE_CATS;
            for (size_t j = 0; j < nf; j++) mag[j] = fabsf(flm_act_eval(FLM_ACT_SILU, Z[j]));
            float *sorted = Z; /* Z is not needed any more */
            memcpy(sorted, mag, nf * sizeof(float));
            size_t q = (size_t)((double)o->sparsity * (double)(nf - 1));
            qsort(sorted, nf, sizeof(float), cmp_float);
            S->threshold = o->sparsity > 0.0f ? sorted[q] : 0.0f;
            for (size_t j = 0; j < nf; j++) active += (Y[j] = mag[j] > S->threshold);
        }
        S->active_frac = (float)((double)active / (double)nf);
        uint32_t r = l >= L - (L + 3) / 4 ? rank_last : rank;
        if ((st = flm_predictor_init(&S->pred, d, F, r, err))) goto done;
        flm_predictor_train_opts to;
        flm_predictor_train_opts_default(&to);
        to.init_W = W;
        to.epochs = o->epochs;
        to.target_recall = o->target_recall;
        to.n_threads = o->n_threads;
        flm_predictor_metrics m;
        if ((st = flm_predictor_train(&S->pred, td.X[l], Y, n, &to, &m, err))) goto done;
        S->recall = (float)m.recall;
        S->precision = (float)m.precision;
        S->pred_frac = (float)m.active_frac_pred;
        aggregate(&S->pred, td.X[l], n, o->chunk, S->s_agg);
        if (o->progress) o->progress(o->user, "training predictors", l + 1, L);
    }
    /* 3. store */
    size_t len = 0;
    if ((st = flm_sparsity_serialize(&sp, &region, &len, err))) goto done;
    flm_close(ctx); /* the file is replaced below */
    ctx = NULL;
    if ((st = flm_file_put_region(path, FLM_REGION_PREDICTOR, region, len, err))) goto done;
done:
    if (ctx) flm_close(ctx);
    for (uint32_t l = 0; td.X && l < n_x; l++) free(td.X[l]);
    free(td.X);
    free(ids);
    free(W);
    free(Z);
    free(mag);
    free(Y);
    free(region);
    if (!st && report) *report = sp;
    else flm_sparsity_free(&sp);
    return st;
}
