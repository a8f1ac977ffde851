/* hot.c — flm_hot_order (include/flashlm_tools.h): measure each FFN neuron's mean contribution on a text and store
 * every layer's neurons hottest first, so the hot mode's resident share of a layer is a prefix of its region and the
 * rest one contiguous range (runtime/ffn_hot.c; docs/SPECULATIVE.md).
 *
 * A neuron's contribution to a token is |h_i| * ||down_i||: the length of what it adds to the layer's output (h_i its
 * activation, down_i its down column). Its score is the sum over the text's tokens. The pass runs the model in ram
 * mode with the FFN select hook (runtime.h), which sees every neuron's activation and keeps them all (the output is
 * the dense model's). The order is written by flm_file_permute_ffn: lossless (Knowl 5). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate/calibrate.h"
#include "core/error.h"
#include "format/tokenizer.h"
#include "runtime/runtime.h"

typedef struct hot_acc {
    uint32_t n_layers, d_ffn;
    double *score;   /* [n_layers][d_ffn] */
    float *dnorm;    /* [n_layers][d_ffn]: ||down_i|| */
} hot_acc;

static uint32_t hot_select(void *user, uint32_t l, const float *x, const float *h, uint32_t *ids) {
    (void)x;
    hot_acc *a = user;
    double *s = a->score + (size_t)l * a->d_ffn;
    const float *dn = a->dnorm + (size_t)l * a->d_ffn;
    (void)ids;
    for (uint32_t i = 0; i < a->d_ffn; i++) s[i] += fabsf(h[i]) * dn[i];
    return FLM_SELECT_ALL; /* the dense FFN: it only observes */
}

static const double *sort_key;
static int by_score_desc(const void *pa, const void *pb) {
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    if (sort_key[a] != sort_key[b]) return sort_key[a] > sort_key[b] ? -1 : 1;
    return a < b ? -1 : a > b; /* ties: the old order */
}

bool flm_is_hot_ordered(const char *path) {
    flm_file *f = NULL;
    flm_error e;
    if (flm_file_open_ex(path, FLM_FILE_HEADER_ONLY, &f, &e)) return false;
    bool hot = f->n_layers > 0;
    for (uint32_t l = 0; l < f->n_layers; l++) hot = hot && (f->ffn[l]->flags & FLM_FFN_HOT_ORDER);
    flm_file_close(f);
    return hot;
}

flm_status flm_hot_order(const char *path, const char *text, uint32_t max_tokens, uint32_t chunk, int n_threads,
                         flm_progress_fn progress, void *user, flm_error *err) {
    if (!path || !text) return flm_fail(err, FLM_ERR_ARG, "hot order: no file or no text");
    if (chunk < 2) chunk = 128;
    if (max_tokens < chunk) max_tokens = chunk;
    flm_params p;
    flm_params_default(&p);
    p.mode = FLM_MODE_RAM;
    p.n_ctx = (int)chunk;
    if (n_threads > 0) p.n_threads = n_threads;
    flm_ctx *ctx = NULL;
    flm_status st = flm_open(path, &p, &ctx, err);
    if (st) return st;
    hot_acc a = {0};
    int32_t *ids = NULL;
    uint32_t **perm = NULL;
    float *tmp = NULL;
    const flm_hparams *hp = &ctx->model->hp;
    if (!ctx->flash) { st = flm_fail(err, FLM_ERR_ARG, "%s: hot order needs a .flm file", path); goto done; }
    a.n_layers = hp->n_layers;
    a.d_ffn = hp->d_ffn;
    a.score = calloc((size_t)a.n_layers * a.d_ffn, sizeof *a.score);
    a.dnorm = malloc((size_t)a.n_layers * a.d_ffn * sizeof *a.dnorm);
    tmp = malloc(hp->d_model * sizeof *tmp);
    perm = calloc(a.n_layers, sizeof *perm);
    if (!a.score || !a.dnorm || !tmp || !perm) { st = flm_fail(err, FLM_ERR_NOMEM, "hot order: out of memory"); goto done; }
    for (uint32_t l = 0; l < a.n_layers; l++) {
        const flm_bundle_desc *b;
        const uint8_t *rec = flm_ffn_resident_records(ctx, l, &b);
        if (!rec || ctx->flash->file->ffn[l]->n_records != a.d_ffn) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: layer %u's FFN region does not hold d_ffn = %u neurons", path, l,
                          a.d_ffn);
            goto done;
        }
        for (uint32_t i = 0; i < a.d_ffn; i++) {
            ctx->k->dequant[b->down_type](rec + (size_t)i * b->record_bytes + b->down_off, tmp, hp->d_model);
            double ss = 0;
            for (uint32_t j = 0; j < hp->d_model; j++) ss += (double)tmp[j] * tmp[j];
            a.dnorm[(size_t)l * a.d_ffn + i] = (float)sqrt(ss);
        }
    }
    size_t n_tok = 0;
    ids = flm_tokenize_all(ctx, text, false, &n_tok);
    if (!ids) { st = flm_fail(err, FLM_ERR_NOMEM, "hot order: out of memory"); goto done; }
    if (n_tok < 16) {
        st = flm_fail(err, FLM_ERR_ARG, "hot order: the text gives %zu tokens; at least 16 are needed", n_tok);
        goto done;
    }
    if ((st = flm_set_ffn_select(ctx, hot_select, &a, true, err))) goto done;
    const int32_t bos = flm_tokenizer_wants_bos(ctx->model->tok) ? flm_tokenizer_bos(ctx->model->tok) : -1;
    const size_t total = n_tok < max_tokens ? n_tok : max_tokens;
    for (size_t t = 0; t < total && !st; t++) {
        size_t pos = t % chunk;
        const float *logits;
        st = flm_eval(ctx, pos == 0 && bos >= 0 ? bos : ids[t], (int32_t)pos, &logits, err);
        if (progress && (t % 16 == 15 || t + 1 == total)) progress(user, "measuring neurons", t + 1, total);
    }
    flm_set_ffn_select(ctx, NULL, NULL, false, NULL);
    if (st) goto done;
    for (uint32_t l = 0; l < a.n_layers; l++) {
        if (!(perm[l] = malloc(a.d_ffn * sizeof **perm))) { st = flm_fail(err, FLM_ERR_NOMEM, "out of memory"); goto done; }
        for (uint32_t i = 0; i < a.d_ffn; i++) perm[l][i] = i;
        sort_key = a.score + (size_t)l * a.d_ffn;
        qsort(perm[l], a.d_ffn, sizeof **perm, by_score_desc);
    }
    flm_close(ctx);
    ctx = NULL;
    if (progress) progress(user, "writing the hot order", 0, 1);
    st = flm_file_permute_ffn(path, (const uint32_t *const *)perm, err);
    if (!st && progress) progress(user, "writing the hot order", 1, 1);
done:
    if (ctx) flm_close(ctx);
    if (perm)
        for (uint32_t l = 0; l < a.n_layers; l++) free(perm[l]);
    free(perm);
    free(ids);
    free(tmp);
    free(a.score);
    free(a.dnorm);
    return st;
}
