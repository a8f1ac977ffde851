/* report.c — flm_calib_run (include/flashlm_tools.h): flm_calibrate / flm_calibrate_levels with their result
 * (the internal flm_predictor_region) summarised into the public flm_calib_report. */
#include <stdlib.h>
#include <string.h>

#include "calibrate/calibrate.h"
#include "core/error.h"
#include "format/flm.h"
#include "sparsity/sparsity.h"

_Static_assert(FLM_CALIB_MAX_LEVELS == FLM_MAX_LEVELS, "flashlm_tools.h FLM_CALIB_MAX_LEVELS");
_Static_assert(FLM_CALIB_AGG_K == FLM_AGG_K, "flashlm_tools.h FLM_CALIB_AGG_K");

static flm_status summarise(const flm_predictor_region *s, flm_calib_report *r, flm_error *err) {
    memset(r, 0, sizeof *r);
    r->layers = calloc(s->n_layers ? s->n_layers : 1, sizeof *r->layers);
    if (!r->layers) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    r->relu = s->n_layers && s->layers[0].rule == FLM_RULE_RELU;
    r->n_layers = s->n_layers;
    r->n_levels = s->n_levels;
    r->default_level = s->default_level;
    for (uint32_t k = 0; k < s->n_levels && k < FLM_CALIB_MAX_LEVELS; k++) {
        flm_calib_level *L = &r->levels[k];
        L->eps = s->level_eps[k];
        L->loss = s->level_loss[k];
        L->dnll = s->level_dnll[k];
        L->loss_oracle = s->level_loss_oracle[k];
        L->dnll_oracle = s->level_dnll_oracle[k];
        double of = 0, pf = 0, kept = 0, rc = 0; /* means over layers, summed as the CLI always did */
        for (uint32_t l = 0; l < s->n_layers; l++) {
            of += s->layers[l].levels[k].oracle_frac / s->n_layers;
            pf += s->layers[l].levels[k].pred_frac / s->n_layers;
            kept += s->layers[l].levels[k].kept / s->n_layers;
            rc += s->layers[l].levels[k].recall / s->n_layers;
        }
        L->oracle_frac = of;
        L->pred_frac = pf;
        L->kept = kept;
        L->recall = rc;
    }
    for (uint32_t l = 0; l < s->n_layers; l++) {
        const flm_predictor_layer *S = &s->layers[l];
        flm_calib_layer *o = &r->layers[l];
        o->d_ffn = S->pred.d_ffn;
        o->rank = S->pred.rank;
        o->threshold = S->threshold;
        o->active_frac = S->active_frac;
        o->pred_frac = S->pred_frac;
        o->recall = S->recall;
        o->precision = S->precision;
        memcpy(o->s_agg, S->s_agg, sizeof o->s_agg);
    }
    return FLM_OK;
}

flm_status flm_calib_run(const char *path, const flm_calib_opts *o, bool levels_only, flm_calib_report *report,
                         flm_error *err) {
    if (report) memset(report, 0, sizeof *report);
    flm_predictor_region s;
    memset(&s, 0, sizeof s);
    int hot = FLM_CALIB_HOT_NONE;
    flm_status st = levels_only ? flm_calibrate_levels(path, o, report ? &s : NULL, err)
                                : flm_calibrate_ex(path, o, report ? &s : NULL, &hot, err);
    if (st == FLM_OK && report) st = summarise(&s, report, err);
    if (st == FLM_OK && report) report->hot_order = hot;
    if (report) flm_predictor_region_free(&s);
    return st;
}

flm_status flm_calib_read(const char *path, flm_calib_report *report, flm_error *err) {
    if (report) memset(report, 0, sizeof *report);
    if (!path || !report) return flm_fail(err, FLM_ERR_ARG, "flm_calib_read: NULL path or report");
    flm_file *f = NULL;
    void *region = NULL;
    flm_predictor_region sp;
    memset(&sp, 0, sizeof sp);
    flm_status st = flm_file_open(path, &f, err);
    if (st == FLM_OK && !f->predictor)
        st = flm_fail(err, FLM_ERR_ARG, "%s: not calibrated (run `flashlm calibrate %s --text FILE`)", path, path);
    if (st == FLM_OK) st = flm_file_read_region(f, f->predictor, &region, err);
    if (st == FLM_OK) st = flm_predictor_region_deserialize(region, f->predictor->size, path, &sp, err);
    if (st == FLM_OK && sp.n_layers != f->n_layers)
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: the calibration has %u layers, the model %u", path, sp.n_layers,
                      f->n_layers);
    if (st == FLM_OK) st = summarise(&sp, report, err);
    for (uint32_t l = 0; st == FLM_OK && l < f->n_layers; l++) report->layers[l].d_ffn = f->ffn[l]->n_records;
    flm_predictor_region_free(&sp);
    free(region);
    flm_file_close(f);
    return st;
}

void flm_calib_report_free(flm_calib_report *r) {
    if (!r) return;
    free(r->layers);
    memset(r, 0, sizeof *r);
}
