/* curve.c — perplexity against bytes per token, dense / each level's predictor / each level's oracle
 * (docs/SPARSITY.md, "Quality curves"). */
#include "calibrate/curve.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "runtime/hooks.h"
#include "sparsity/sparsity.h"
#include "calibrate/calibrate.h"
#include "calibrate/train.h"

void flm_curve_opts_default(flm_curve_opts *o) {
    memset(o, 0, sizeof *o);
    o->chunk = 512;
}

typedef struct {
    const flm_kernels *k;
    int n_threads;
    flm_predictor_region *sp;
    uint32_t level;
    float **dn;       /* [n_layers][d_ffn] down-column norms (oracle) */
    float *scratch;   /* max rank + d_ffn floats */
    uint64_t n_sel;   /* neurons selected, summed over tokens and layers */
    uint64_t n_calls; /* (token, layer) pairs */
} curve_sel;

/* Every neuron, as the sparse mode runs the first token of a sequence (docs/SPARSITY.md). */
static uint32_t all_ids(uint32_t F, uint32_t *ids) {
    for (uint32_t i = 0; i < F; i++) ids[i] = i;
    return F;
}

static uint32_t sel_predictor(void *user, uint32_t l, int32_t pos, const float *x, const float *h, uint32_t *ids) {
    (void)h;
    curve_sel *s = user;
    const flm_predictor *p = &s->sp->layers[l].pred;
    const float t = s->sp->layers[l].levels[s->level].pred_threshold; /* the level's; the loaded one stays */
    uint32_t n;
    if (pos == 0) n = all_ids(p->d_ffn, ids);
    else if (!p->A16) { /* a version-1 region (f32 matrices) */
        flm_predictor q = *p;
        q.threshold = t;
        n = (uint32_t)flm_predictor_predict(&q, x, ids, s->scratch);
    } else { /* as the sparse mode predicts (runtime/sparse.c) */
        n = flm_predictor_predict_f16(s->k, p, p->A16, p->B16, t, x, s->scratch, ids, s->n_threads);
    }
    s->n_sel += n;
    s->n_calls++;
    return n;
}

/* the level's rule on the real activations: (h_i ||down_i||)^2 > tau^2 sum_j (h_j ||down_j||)^2 */
static uint32_t sel_oracle(void *user, uint32_t l, int32_t pos, const float *x, const float *h, uint32_t *ids) {
    (void)x;
    curve_sel *s = user;
    uint32_t F = s->sp->layers[l].pred.d_ffn, n;
    if (pos == 0) n = all_ids(F, ids);
    else n = flm_contrib_set(h, s->dn[l], F, s->sp->layers[l].levels[s->level].tau, s->scratch, ids);
    s->n_sel += n;
    s->n_calls++;
    return n;
}

typedef struct {
    const flm_curve_opts *o;
    char what[64];
    int base, total; /* chunks done before this point, chunks of all points */
} curve_progress;

static void on_chunk(void *user, int chunk, int n_chunks, double ppl) {
    (void)n_chunks;
    (void)ppl;
    curve_progress *cp = user;
    if (cp->o->progress) cp->o->progress(cp->o->user, cp->what, (uint64_t)(cp->base + chunk), (uint64_t)cp->total);
}

flm_status flm_sparsity_curve(const char *path, const char *text, const flm_curve_opts *o, flm_curve_point *pts,
                              uint32_t cap, uint32_t *n_pts, flm_error *err) {
    flm_curve_opts def;
    if (!o) {
        flm_curve_opts_default(&def);
        o = &def;
    }
    if (!path || (!text && !o->text_file) || !pts || !n_pts)
        return flm_fail(err, FLM_ERR_ARG, "curve: NULL argument");
    *n_pts = 0;
    if (o->chunk < 4) return flm_fail(err, FLM_ERR_ARG, "curve: chunk of %d tokens is too short", o->chunk);
    flm_params p;
    flm_params_default(&p);
    p.mode = FLM_MODE_RAM;
    p.n_ctx = o->chunk;
    if (o->n_threads > 0) p.n_threads = o->n_threads;
    flm_ctx *ctx = NULL;
    flm_predictor_region sp = {0};
    void *stored = NULL;
    float **dn = NULL, *scratch = NULL;
    uint32_t *sel_ids = NULL;
    flm_status st = flm_open(path, &p, &ctx, err);
    if (st) return st;
    const flm_hparams *hp = &flm_ctx_model(ctx)->hp;
    const flm_file *f = flm_ctx_file(ctx);
    const flm_kernels *kern = flm_ctx_kernels(ctx);
    const uint32_t L = hp->n_layers, F = hp->d_ffn, d = hp->d_model;
    uint32_t lv[FLM_MAX_LEVELS], nlv = 0;
    if (!f) {
        st = flm_fail(err, FLM_ERR_ARG, "%s: the curve needs a calibrated .flm: `flashlm convert %s OUT.flm`, then "
                      "`flashlm calibrate OUT.flm --text FILE`", path, path);
        goto done;
    }
    if (!f->predictor) {
        st = flm_fail(err, FLM_ERR_ARG, "%s: not calibrated: run `flashlm calibrate %s --text FILE` first", path,
                      path);
        goto done;
    }
    if ((st = flm_file_read_region(f, f->predictor, &stored, err)) ||
        (st = flm_predictor_region_deserialize(stored, f->predictor->size, path, &sp, err)))
        goto done;
    if (sp.n_layers != L || sp.layers[0].rule != FLM_RULE_CONTRIB) {
        st = flm_fail(err, FLM_ERR_ARG,
                      "%s: the curve needs a gated SiLU/GELU calibration (levels of energy); this one has rule %u",
                      path, sp.n_layers ? sp.layers[0].rule : 0u);
        goto done;
    }
    if (o->levels) {
        for (uint32_t j = 0; j < o->n_levels && nlv < FLM_MAX_LEVELS; j++) {
            int k = flm_predictor_region_find_level(&sp, o->levels[j]);
            if (k < 0) {
                st = flm_fail(err, FLM_ERR_ARG, "%s: level %g is not stored (calibrate lists the stored levels)", path,
                              (double)o->levels[j]);
                goto done;
            }
            lv[nlv++] = (uint32_t)k;
        }
    } else {
        for (uint32_t k = 0; k < sp.n_levels; k++) lv[nlv++] = k;
    }
    const int per = o->no_oracle ? 1 : 2;
    if (cap < 1 + (uint32_t)per * nlv) {
        st = flm_fail(err, FLM_ERR_ARG, "curve: room for %u points, %u needed", cap, 1 + (uint32_t)per * nlv);
        goto done;
    }
    uint32_t max_rank = 0;
    for (uint32_t l = 0; l < L; l++) max_rank = sp.layers[l].pred.rank > max_rank ? sp.layers[l].pred.rank : max_rank;
    if (!(scratch = malloc(((size_t)max_rank + F) * sizeof(float))) || !(dn = calloc(L, sizeof *dn)) ||
        !(sel_ids = malloc((size_t)F * sizeof *sel_ids))) {
        st = flm_fail(err, FLM_ERR_NOMEM, "curve: out of memory");
        goto done;
    }
    if (!o->no_oracle) { /* ||down_i|| per neuron, from the records in memory */
        float *col = scratch;
        for (uint32_t l = 0; l < L; l++) {
            const flm_bundle_desc *b;
            const uint8_t *rec = flm_ffn_resident_records(ctx, l, &b); /* opened in ram mode: every layer */
            if (!(dn[l] = malloc((size_t)F * sizeof(float)))) {
                st = flm_fail(err, FLM_ERR_NOMEM, "curve: out of memory");
                goto done;
            }
            for (uint32_t i = 0; i < F; i++) {
                kern->dequant[b->down_type](rec + (size_t)i * b->record_bytes + b->down_off, col, d);
                double s2 = 0;
                for (uint32_t j = 0; j < d; j++) s2 += (double)col[j] * col[j];
                dn[l][i] = (float)sqrt(s2);
            }
        }
    }
    const flm_bundle_desc *b0;
    flm_ffn_resident_records(ctx, 0, &b0);
    const double ffn_bytes = (double)L * F * (double)b0->record_bytes;
    curve_progress cp = {o, "quality curve", 0, 0};
    { /* the chunks every point evaluates, for the progress total (flm_perplexity checks the text itself) */
        size_t n_tok = 0; /* a text file: counted as far as the chunks asked for (all of it with max_chunks 0) */
        int32_t *ids = NULL;
        if ((st = flm_calib_tokens(ctx, text, o->text_file, NULL, 0, true,
                                   o->max_chunks > 0 ? (size_t)o->max_chunks * (size_t)o->chunk : 0, &ids, &n_tok,
                                   err)))
            goto done;
        free(ids);
        size_t nc = n_tok / (size_t)o->chunk;
        if (o->max_chunks > 0 && nc > (size_t)o->max_chunks) nc = (size_t)o->max_chunks;
        cp.total = (int)nc * (1 + per * (int)nlv);
    }
    curve_sel cs = {kern, flm_ctx_params(ctx)->n_threads, &sp, 0, dn, scratch, 0, 0};
    flm_ppl_result r;
    for (uint32_t j = 0; j <= (uint32_t)per * nlv; j++) {
        flm_curve_point *pt = &pts[j];
        memset(pt, 0, sizeof *pt);
        if (j > 0) {
            uint32_t k = lv[(j - 1) / (uint32_t)per];
            pt->oracle = per == 2 && (j - 1) % 2 == 1;
            pt->eps = sp.level_eps[k];
            pt->is_default = k == sp.default_level;
            cs.level = k;
            cs.n_sel = cs.n_calls = 0;
        }
        const flm_ffn_hooks hooks = {.select = pt->oracle ? sel_oracle : sel_predictor, .select_user = &cs,
                                     .need_h = pt->oracle, .ids = sel_ids};
        double t0 = flm_now_ms();
        if ((st = text ? flm_perplexity_hooked(ctx, text, o->chunk, o->max_chunks, on_chunk, &cp,
                                               j > 0 ? &hooks : NULL, &r, err)
                       : flm_perplexity_file_hooked(ctx, o->text_file, o->chunk, o->max_chunks, on_chunk, &cp,
                                                    j > 0 ? &hooks : NULL, &r, err)))
            goto done;
        cp.base += r.n_chunks;
        pt->seconds = (flm_now_ms() - t0) / 1e3;
        pt->ppl = r.ppl;
        pt->ppl_stderr = r.ppl * r.nll_stderr;
        pt->neuron_frac = j == 0 || !cs.n_calls ? 1.0 : (double)cs.n_sel / ((double)cs.n_calls * F);
        pt->bytes_per_token = pt->neuron_frac * ffn_bytes;
        *n_pts = j + 1;
        if (o->on_point) o->on_point(o->user, pt);
    }
done:
    if (ctx) flm_close(ctx);
    free(sel_ids);
    if (dn)
        for (uint32_t l = 0; l < L; l++) free(dn[l]);
    free(dn);
    free(scratch);
    free(stored);
    flm_predictor_region_free(&sp);
    return st;
}
