/* hot.c — flm_hot_order (include/flashlm_tools.h): measure each FFN neuron's mean contribution on a text and store
 * every layer's neurons hottest first, so the hot mode's resident share of a layer is a prefix of its region and the
 * rest one contiguous range (runtime/ffn_hot.c; docs/SPECULATIVE.md).
 *
 * A neuron's contribution to a token is |h_i| * ||down_i||: the length of what it adds to the layer's output (h_i its
 * activation, down_i its down column). Its score is the sum over the text's tokens. The pass runs the model in ram
 * mode with the FFN select hook (runtime/hooks.h), which sees every neuron's activation and keeps them all (the output is
 * the dense model's). The order is written by flm_file_permute_ffn: lossless (Knowl 5).
 *
 * Under a memory budget (flm_hot_opts.mem_bytes / mem_percent) the model does not have to fit: it runs in hybrid
 * mode under the budget and a tap records every layer's FFN input to a temporary file beside the model
 * ("<path>.x.tmp", as calibrate's recording); then each layer's FFN region is read from the file once and the scores
 * are computed from the recorded inputs, blocks of neurons at a time (gate/up rows as floats, BLAS). What the
 * ordering holds (two FFN regions while writing, one layer's recorded inputs) is checked against the budget before
 * anything runs. */
#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "calibrate/calibrate.h"
#include "write/flm_write.h"
#include "compute/act.h"
#include "core/error.h"
#include "core/types.h"
#include "core/util.h"
#include "format/tokenizer.h"
#include "runtime/hooks.h"

typedef struct hot_acc {
    uint32_t n_layers, d_ffn;
    double *score;   /* [n_layers][d_ffn] */
    float *dnorm;    /* [n_layers][d_ffn]: ||down_i|| */
} hot_acc;

static uint32_t hot_select(void *user, uint32_t l, int32_t pos, const float *x, const float *h, uint32_t *ids) {
    (void)x;
    (void)pos;
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

/* The model in memory (ram mode): the select hook sees every neuron's activation. */
/* The text's tokens (*ids, malloc'd; no BOS) for the hot order: FLM_ERR_NOMEM, or FLM_ERR_ARG under 16 tokens. */
static flm_status hot_tokens(flm_ctx *ctx, const char *text, const char *text_file, const char *const *files,
                             uint32_t chunk, size_t max, int32_t **ids, size_t *n_tok, flm_error *err) {
    flm_status st = flm_calib_tokens(ctx, text, text_file, files, chunk, false, max, ids, n_tok, err);
    if (st) return st;
    if (*n_tok < 16)
        return flm_fail(err, FLM_ERR_ARG, "hot order: the text gives %zu tokens; at least 16 are needed", *n_tok);
    return FLM_OK;
}

static flm_status hot_order_ram(const char *path, const char *out_path, const char *text, const char *text_file,
                                const char *const *text_files, uint32_t max_tokens, uint32_t chunk, int n_threads,
                                flm_progress_fn progress, void *user, flm_error *err) {
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
    uint32_t *sel_ids = NULL;
    const flm_model *model = flm_ctx_model(ctx);
    const flm_hparams *hp = &model->hp;
    const flm_file *file = flm_ctx_file(ctx);
    if (!file) { st = flm_fail(err, FLM_ERR_ARG, "%s: hot order needs a .flm file", path); goto done; }
    if (model->layers[0].ffn_up_b.data) { /* before the measurement, not after (flm_file_permute_ffn's refusal) */
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: the FFN has biases: ordering its neurons is not supported yet",
                      path);
        goto done;
    }
    a.n_layers = hp->n_layers;
    a.d_ffn = hp->d_ffn;
    a.score = calloc((size_t)a.n_layers * a.d_ffn, sizeof *a.score);
    a.dnorm = malloc((size_t)a.n_layers * a.d_ffn * sizeof *a.dnorm);
    tmp = malloc(hp->d_model * sizeof *tmp);
    perm = calloc(a.n_layers, sizeof *perm);
    sel_ids = malloc(a.d_ffn * sizeof *sel_ids);
    if (!a.score || !a.dnorm || !tmp || !perm || !sel_ids) { st = flm_fail(err, FLM_ERR_NOMEM, "hot order: out of memory"); goto done; }
    for (uint32_t l = 0; l < a.n_layers; l++) {
        const flm_bundle_desc *b;
        const uint8_t *rec = flm_ffn_resident_records(ctx, l, &b);
        if (!rec || file->ffn[l]->n_records != a.d_ffn) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: layer %u's FFN region does not hold d_ffn = %u neurons", path, l,
                          a.d_ffn);
            goto done;
        }
        for (uint32_t i = 0; i < a.d_ffn; i++) {
            flm_ctx_kernels(ctx)->dequant[b->down_type](rec + (size_t)i * b->record_bytes + b->down_off, tmp, hp->d_model);
            double ss = 0;
            for (uint32_t j = 0; j < hp->d_model; j++) ss += (double)tmp[j] * tmp[j];
            a.dnorm[(size_t)l * a.d_ffn + i] = (float)sqrt(ss);
        }
    }
    size_t n_tok = 0;
    if ((st = hot_tokens(ctx, text, text_file, text_files, chunk, max_tokens, &ids, &n_tok, err))) goto done;
    const flm_ffn_hooks hooks = {.select = hot_select, .select_user = &a, .need_h = true, .ids = sel_ids};
    const int32_t bos = flm_tokenizer_wants_bos(model->tok) ? flm_tokenizer_bos(model->tok) : -1;
    const size_t total = n_tok < max_tokens ? n_tok : max_tokens;
    for (size_t t = 0; t < total && !st; t++) {
        size_t pos = t % chunk;
        const float *logits;
        const int32_t id = pos == 0 && bos >= 0 ? bos : ids[t];
        st = flm_eval_hooked(ctx, &id, 1, (int32_t)pos, &hooks, NULL, &logits, err);
        if (progress && (t % 16 == 15 || t + 1 == total)) progress(user, "measuring neurons", t + 1, total);
    }
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
    st = flm_file_permute_ffn_to(path, out_path ? out_path : path, (const uint32_t *const *)perm, err);
    if (!st && progress) progress(user, "writing the hot order", 1, 1);
done:
    if (ctx) flm_close(ctx);
    if (perm)
        for (uint32_t l = 0; l < a.n_layers; l++) free(perm[l]);
    free(perm);
    free(ids);
    free(tmp);
    free(sel_ids);
    free(a.score);
    free(a.dnorm);
    return st;
}

/* Tokens recorded per layer into the spill file: layer l's token t at float (l * n + t) * d. */
typedef struct {
    uint32_t *next; /* [n_layers]: the next row */
    uint32_t n, d;
    int fd, err_no;
} hot_tap;

static void hot_tap_fn(void *user, uint32_t layer, const float *x) {
    hot_tap *t = user;
    if (t->err_no || t->next[layer] >= t->n) return;
    const uint32_t row = t->next[layer]++;
    const size_t bytes = (size_t)t->d * sizeof(float);
    t->err_no = flm_calib_pwrite_all(t->fd, x, bytes, (off_t)(((uint64_t)layer * t->n + row) * bytes));
}

#define HOT_BLOCK 64u /* neurons scored per BLAS call */

/* Bytes the budget path holds besides the hybrid context (which the plan keeps within the budget while recording,
 * and which is closed before the scoring): the scores, down norms and orders of every layer, and the larger of the
 * scoring's (one FFN region, one layer's recorded inputs: n x d floats, a block's gate/up rows and pre-activations)
 * and the writing's (flm_file_permute_ffn holds the old and the new region of a layer). */
static uint64_t hot_budget_bytes(const flm_file *f, const flm_hparams *hp, uint32_t n) {
    uint64_t region = 0;
    for (uint32_t l = 0; l < f->n_layers; l++)
        if (f->ffn[l]->size > region) region = f->ffn[l]->size;
    const uint64_t d = hp->d_model, F = hp->d_ffn, L = hp->n_layers, B = HOT_BLOCK;
    const uint64_t scoring = region + (uint64_t)n * d * 4 + B * (2 * d + 2 * (uint64_t)n) * 4 + d * 4 + F * 4;
    return (scoring > 2 * region ? scoring : 2 * region) + L * F * (8 + 4);
}

/* The budget path (see the file comment). spill: "<path>.x.tmp". */
static flm_status hot_order_budget(const char *path, const char *text, const flm_hot_opts *o, flm_error *err) {
    const uint32_t chunk = o->chunk;
    char spill[4200];
    snprintf(spill, sizeof spill, "%s.x.tmp", path);
    flm_params p;
    flm_params_default(&p);
    p.mode = FLM_MODE_HYBRID;
    p.n_ctx = (int)chunk;
    p.mem_bytes = o->mem_bytes;
    p.mem_percent = o->mem_percent;
    if (o->n_threads > 0) p.n_threads = o->n_threads;
    flm_ctx *ctx = NULL;
    flm_status st = flm_open(path, &p, &ctx, err);
    if (st) return st;
    hot_tap td = {.fd = -1};
    int32_t *ids = NULL, *chunk_toks = NULL;
    uint32_t **perm = NULL;
    double *score = NULL;
    float *dnorm = NULL, *X = NULL, *Wg = NULL, *Wu = NULL, *Zg = NULL, *Zu = NULL, *col = NULL;
    void *records = NULL;
    flm_file *hdr = NULL;
    const flm_hparams hp = flm_ctx_model(ctx)->hp; /* outlives ctx */
    const flm_kernels *k = flm_ctx_kernels(ctx);
    const uint32_t L = hp.n_layers, d = hp.d_model, F = hp.d_ffn;
    if (!flm_ctx_file(ctx)) { st = flm_fail(err, FLM_ERR_ARG, "%s: hot order needs a .flm file", path); goto done; }
    if (flm_ctx_model(ctx)->layers[0].ffn_up_b.data) {
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: the FFN has biases: ordering its neurons is not supported yet",
                      path);
        goto done;
    }
    flm_plan_info plan;
    flm_get_plan(ctx, &plan);
    size_t n_tok = 0;
    if ((st = hot_tokens(ctx, text, o->text_file, o->text_files, o->chunk, o->max_tokens, &ids, &n_tok, err)))
        goto done;
    const uint32_t n = (uint32_t)(n_tok < o->max_tokens ? n_tok : o->max_tokens);
    const uint64_t need = hot_budget_bytes(flm_ctx_file(ctx), &hp, n);
    if (need > plan.budget) {
        st = flm_fail(err, FLM_ERR_BUDGET, "%s: a memory budget of %s cannot hold the hot ordering: %.2f MiB (two FFN "
                      "regions of a layer while the new order is written, or one and %u tokens x %u floats of one "
                      "layer's recorded inputs); raise --mem or lower --hot-tokens", path, flm_size(plan.budget).s,
                      flm_mib(need), n, d);
        goto done;
    }
    td.n = n;
    td.d = d;
    if (!(td.next = calloc(L, sizeof *td.next)) || !(chunk_toks = malloc((size_t)chunk * sizeof *chunk_toks))) {
        st = flm_fail(err, FLM_ERR_NOMEM, "hot order: out of memory");
        goto done;
    }
    td.fd = open(spill, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600); /* never through a link */
    if (td.fd < 0) {
        st = flm_fail(err, FLM_ERR_IO, "%s: cannot write the recorded inputs: %s", spill, strerror(errno));
        goto done;
    }
    const flm_ffn_hooks hooks = {.tap = hot_tap_fn, .tap_user = &td};
    const flm_model *model = flm_ctx_model(ctx);
    const int32_t bos = flm_tokenizer_wants_bos(model->tok) ? flm_tokenizer_bos(model->tok) : -1;
    for (uint32_t t = 0; t < n;) { /* chunks from position 0, the first token BOS when the model adds one (as ram) */
        const uint32_t m = n - t < chunk ? n - t : chunk, b = (uint32_t)flm_ctx_params(ctx)->n_batch;
        memcpy(chunk_toks, ids + t, (size_t)m * sizeof *chunk_toks);
        if (bos >= 0) chunk_toks[0] = bos;
        for (uint32_t j = 0; j < m; j += b) {
            const float *logits;
            const uint32_t c = m - j < b ? m - j : b;
            if ((st = flm_eval_hooked(ctx, chunk_toks + j, c, (int32_t)j, &hooks, NULL, &logits, err))) goto done;
            if (td.err_no) {
                st = flm_fail(err, FLM_ERR_IO, "%s: cannot write the recorded inputs: %s", spill, strerror(td.err_no));
                goto done;
            }
            if (o->progress) o->progress(o->user, "measuring neurons", t + j + c, n);
        }
        t += m;
    }
    flm_close(ctx); /* its memory is the scoring's now */
    ctx = NULL;
    if ((st = flm_file_open_ex(path, FLM_FILE_HEADER_ONLY, &hdr, err))) goto done;
    score = calloc((size_t)L * F, sizeof *score);
    dnorm = malloc((size_t)F * sizeof *dnorm);
    X = malloc((size_t)n * d * sizeof *X);
    Wg = malloc((size_t)HOT_BLOCK * d * sizeof *Wg);
    Wu = malloc((size_t)HOT_BLOCK * d * sizeof *Wu);
    Zg = malloc((size_t)n * HOT_BLOCK * sizeof *Zg);
    Zu = malloc((size_t)n * HOT_BLOCK * sizeof *Zu);
    col = malloc((size_t)d * sizeof *col);
    perm = calloc(L, sizeof *perm);
    if (!score || !dnorm || !X || !Wg || !Wu || !Zg || !Zu || !col || !perm) {
        st = flm_fail(err, FLM_ERR_NOMEM, "hot order: out of memory");
        goto done;
    }
    for (uint32_t l = 0; l < L; l++) {
        const flm_region *reg = hdr->ffn[l];
        if (reg->n_records != F) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: layer %u's FFN region does not hold d_ffn = %u neurons", path, l, F);
            goto done;
        }
        const flm_bundle_layout bl = flm_bundle_layout_of(d, reg->up_type, reg->gate_type, reg->down_type, hp.gated);
        free(records);
        records = NULL;
        if ((st = flm_file_read_region(hdr, reg, &records, err))) goto done;
        { /* layer l's recorded inputs */
            uint8_t *q = (uint8_t *)X;
            size_t left = (size_t)n * d * sizeof(float);
            off_t off = (off_t)((uint64_t)l * n * d * sizeof(float));
            while (left) {
                ssize_t r = pread(td.fd, q, left, off);
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0) {
                    st = flm_fail(err, FLM_ERR_IO, "%s: cannot read back the recorded inputs of layer %u: %s", spill,
                                  l, r < 0 ? strerror(errno) : "short read");
                    goto done;
                }
                q += r;
                left -= (size_t)r;
                off += r;
            }
        }
        const uint32_t wt = hp.gated ? reg->gate_type : reg->up_type;
        const uint64_t woff = hp.gated ? bl.gate_off : bl.up_off;
        double *s = score + (size_t)l * F;
        for (uint32_t i0 = 0; i0 < F; i0 += HOT_BLOCK) {
            const uint32_t nb = F - i0 < HOT_BLOCK ? F - i0 : HOT_BLOCK;
            for (uint32_t i = 0; i < nb; i++) {
                const uint8_t *r = (const uint8_t *)records + (size_t)(i0 + i) * bl.record_bytes;
                k->dequant[wt](r + woff, Wg + (size_t)i * d, d);
                if (hp.gated) k->dequant[reg->up_type](r + bl.up_off, Wu + (size_t)i * d, d);
                k->dequant[reg->down_type](r + bl.down_off, col, d);
                double ss = 0;
                for (uint32_t j = 0; j < d; j++) ss += (double)col[j] * col[j];
                dnorm[i0 + i] = (float)sqrt(ss);
            }
            /* Zg = X Wg^T (n x nb), Zu = X Wu^T: the gate's (or up's) and the up projection's pre-activations */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nb, (int)d, 1.0f, X, (int)d, Wg, (int)d,
                        0.0f, Zg, (int)nb);
            if (hp.gated)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nb, (int)d, 1.0f, X, (int)d, Wu,
                            (int)d, 0.0f, Zu, (int)nb);
            for (uint32_t t = 0; t < n; t++)
                for (uint32_t i = 0; i < nb; i++) {
                    const float a = flm_act_eval(hp.act, Zg[(size_t)t * nb + i]);
                    const float h = hp.gated ? a * Zu[(size_t)t * nb + i] : a;
                    s[i0 + i] += fabsf(h) * dnorm[i0 + i];
                }
        }
        if (o->progress) o->progress(o->user, "scoring neurons", l + 1, L);
    }
    free(records);
    records = NULL;
    free(X);
    free(Wg);
    free(Wu);
    free(Zg);
    free(Zu);
    X = Wg = Wu = Zg = Zu = NULL;
    close(td.fd);
    td.fd = -1;
    unlink(spill);
    flm_file_close(hdr);
    hdr = NULL;
    for (uint32_t l = 0; l < L; l++) {
        if (!(perm[l] = malloc(F * sizeof **perm))) { st = flm_fail(err, FLM_ERR_NOMEM, "out of memory"); goto done; }
        for (uint32_t i = 0; i < F; i++) perm[l][i] = i;
        sort_key = score + (size_t)l * F;
        qsort(perm[l], F, sizeof **perm, by_score_desc);
    }
    if (o->progress) o->progress(o->user, "writing the hot order", 0, 1);
    st = flm_file_permute_ffn_to(path, o->out_path ? o->out_path : path, (const uint32_t *const *)perm, err);
    if (!st && o->progress) o->progress(o->user, "writing the hot order", 1, 1);
done:
    if (ctx) flm_close(ctx);
    if (td.fd >= 0) {
        close(td.fd);
        unlink(spill);
    }
    flm_file_close(hdr);
    if (perm)
        for (uint32_t l = 0; l < L; l++) free(perm[l]);
    free(perm);
    free(records);
    free(td.next);
    free(chunk_toks);
    free(ids);
    free(score);
    free(dnorm);
    free(X);
    free(Wg);
    free(Wu);
    free(Zg);
    free(Zu);
    free(col);
    return st;
}

void flm_hot_opts_default(flm_hot_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_tokens = 1024;
    o->chunk = 128;
    o->n_threads = 2;
}

flm_status flm_hot_order_unlocked(const char *path, const char *text, const flm_hot_opts *o, flm_error *err) {
    flm_hot_opts dflt;
    if (!o) { flm_hot_opts_default(&dflt); o = &dflt; }
    if (!path || !flm_calib_has_text(text, o->text_file, o->text_files))
        return flm_fail(err, FLM_ERR_ARG, "hot order: no file or no text");
    if (!(o->mem_percent >= 0)) return flm_fail(err, FLM_ERR_ARG, "hot order: mem_percent must be >= 0");
    flm_hot_opts c = *o;
    if (c.chunk < 2) c.chunk = 128;
    if (c.max_tokens < c.chunk) c.max_tokens = c.chunk;
    if (c.mem_bytes || c.mem_percent > 0) return hot_order_budget(path, text, &c, err);
    return hot_order_ram(path, c.out_path, text, c.text_file, c.text_files, c.max_tokens, c.chunk, c.n_threads,
                         c.progress, c.user, err);
}

flm_status flm_hot_order_ex(const char *path, const char *text, const flm_hot_opts *o, flm_error *err) {
    if (!path || !(text || (o && flm_calib_has_text(NULL, o->text_file, o->text_files))))
        return flm_fail(err, FLM_ERR_ARG, "hot order: no file or no text");
    flm_status st = FLM_OK;
    int fd = flm_calib_lock(path, &st, err); /* one calibrate (or ordering) of a file at a time */
    if (fd < 0) return st;
    st = flm_hot_order_unlocked(path, text, o, err);
    close(fd);
    return st;
}

flm_status flm_hot_order(const char *path, const char *text, uint32_t max_tokens, uint32_t chunk, int n_threads,
                         flm_progress_fn progress, void *user, flm_error *err) {
    flm_hot_opts o;
    flm_hot_opts_default(&o);
    o.max_tokens = max_tokens;
    o.chunk = chunk;
    o.n_threads = n_threads;
    o.progress = progress;
    o.user = user;
    return flm_hot_order_ex(path, text, &o, err);
}
