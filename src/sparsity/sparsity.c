#include "sparsity/sparsity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/util.h"

#define HDR_BYTES 32u
#define LAYER_BYTES (32u + 4u * FLM_AGG_K)
#define LEVEL_BYTES 28u

flm_status flm_predictor_region_serialize(const flm_predictor_region *s, uint8_t **out, size_t *len, flm_error *err) {
    uint32_t nl = s->n_levels ? s->n_levels : 1;
    size_t n = HDR_BYTES + 8u * nl;
    const bool orig = s->n_layers && s->layers[0].orig;
    for (uint32_t l = 0; l < s->n_layers; l++) {
        n += LAYER_BYTES + LEVEL_BYTES * nl + flm_predictor_serialized_bytes(&s->layers[l].pred);
        if (orig != (s->layers[l].orig != NULL))
            return flm_fail(err, FLM_ERR_ARG, "predictor region: layer %u %s an original neuron order, layer 0 %s", l,
                            orig ? "lacks" : "has", orig ? "has" : "lacks");
        if (orig) n += 4u * (size_t)s->layers[l].pred.d_ffn;
    }
    if (orig) n += 4;
    uint8_t *b = calloc(1, n);
    if (!b) return flm_fail(err, FLM_ERR_NOMEM, "out of memory for the predictor region");
    memcpy(b, "FSPR", 4);
    flm_put_u32(b + 4, orig ? 3 : 2);
    flm_put_u32(b + 8, s->n_layers);
    flm_put_f32(b + 12, s->target_sparsity);
    flm_put_u32(b + 16, FLM_AGG_K);
    flm_put_u32(b + 20, nl);
    flm_put_u32(b + 24, s->default_level);
    size_t o = HDR_BYTES;
    for (uint32_t k = 0; k < nl; k++, o += 8) {
        flm_put_f32(b + o, s->level_eps[k]);
        flm_put_f32(b + o + 4, s->level_loss[k]);
    }
    for (uint32_t l = 0; l < s->n_layers; l++) {
        const flm_predictor_layer *L = &s->layers[l];
        flm_put_u32(b + o, L->rule);
        flm_put_f32(b + o + 4, L->threshold);
        flm_put_f32(b + o + 8, L->active_frac);
        flm_put_f32(b + o + 12, L->recall);
        flm_put_f32(b + o + 16, L->precision);
        flm_put_f32(b + o + 20, L->pred_frac);
        for (int k = 0; k < FLM_AGG_K; k++) flm_put_f32(b + o + 32 + 4 * k, L->s_agg[k]);
        o += LAYER_BYTES;
        for (uint32_t k = 0; k < nl; k++, o += LEVEL_BYTES) {
            const flm_level *v = &L->levels[k];
            flm_put_f32(b + o, v->tau);
            flm_put_f32(b + o + 4, v->pred_threshold);
            flm_put_f32(b + o + 8, v->oracle_frac);
            flm_put_f32(b + o + 12, v->pred_frac);
            flm_put_f32(b + o + 16, v->kept);
            flm_put_f32(b + o + 20, v->recall);
            flm_put_f32(b + o + 24, v->precision);
        }
        flm_predictor_serialize(&L->pred, b + o);
        o += flm_predictor_serialized_bytes(&L->pred);
    }
    if (orig) {
        memcpy(b + o, "FSPO", 4);
        o += 4;
        for (uint32_t l = 0; l < s->n_layers; l++)
            for (uint32_t i = 0; i < s->layers[l].pred.d_ffn; i++, o += 4) flm_put_u32(b + o, s->layers[l].orig[i]);
    }
    *out = b;
    *len = n;
    return FLM_OK;
}

static bool frac_ok(float f) { return isfinite(f) && f >= 0.0f && f <= 1.0f; }

flm_status flm_predictor_region_deserialize(const uint8_t *buf, size_t len, const char *what, flm_predictor_region *s,
                                            flm_error *err) {
    memset(s, 0, sizeof *s);
    if (len < HDR_BYTES || memcmp(buf, "FSPR", 4) != 0)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: bad magic or too short (%zu bytes)", what, len);
    uint32_t version = flm_get_u32(buf + 4);
    if (version != 1 && version != 2 && version != 3)
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: predictor region: version %u not supported", what, version);
    uint32_t n_layers = flm_get_u32(buf + 8);
    if (n_layers == 0 || n_layers > 4096 || flm_get_u32(buf + 16) != FLM_AGG_K || !frac_ok(flm_get_f32(buf + 12)))
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: %u layers / %u aggregation points are invalid",
                        what, n_layers, flm_get_u32(buf + 16));
    uint32_t nl = 1, def = 0;
    size_t o = HDR_BYTES;
    if (version >= 2) {
        nl = flm_get_u32(buf + 20);
        def = flm_get_u32(buf + 24);
        if (nl == 0 || nl > FLM_MAX_LEVELS || def >= nl || flm_get_u32(buf + 28) != 0)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: %u levels, default %u: invalid (1..%u levels)",
                            what, nl, def, FLM_MAX_LEVELS);
        if (len - o < 8u * nl)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: the level table is truncated", what);
        for (uint32_t k = 0; k < nl; k++, o += 8) {
            s->level_eps[k] = flm_get_f32(buf + o);
            s->level_loss[k] = flm_get_f32(buf + o + 4);
            if (!frac_ok(s->level_eps[k]) || isinf(s->level_loss[k])) {
                memset(s, 0, sizeof *s);
                return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: level %u is invalid", what, k);
            }
        }
    } else {
        s->level_loss[0] = NAN;
    }
    for (uint32_t k = 0; k < FLM_MAX_LEVELS; k++)
        s->level_loss_oracle[k] = s->level_dnll[k] = s->level_dnll_oracle[k] = NAN;
    s->layers = calloc(n_layers, sizeof *s->layers);
    if (!s->layers) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", what);
    s->n_layers = n_layers;
    s->n_levels = nl;
    s->default_level = def;
    s->target_sparsity = flm_get_f32(buf + 12);
    flm_status st = FLM_OK;
    for (uint32_t l = 0; l < n_layers && !st; l++) {
        flm_predictor_layer *L = &s->layers[l];
        size_t need = LAYER_BYTES + (version >= 2 ? (size_t)LEVEL_BYTES * nl : 0);
        if (len - o < need) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: layer %u is truncated", what, l);
            break;
        }
        const uint8_t *p = buf + o;
        L->rule = flm_get_u32(p);
        L->threshold = flm_get_f32(p + 4);
        L->active_frac = flm_get_f32(p + 8);
        L->recall = flm_get_f32(p + 12);
        L->precision = flm_get_f32(p + 16);
        L->pred_frac = flm_get_f32(p + 20);
        bool rule_ok = version == 1 ? (L->rule == FLM_RULE_RELU || L->rule == FLM_RULE_CATS)
                                    : (L->rule == FLM_RULE_RELU || L->rule == FLM_RULE_CONTRIB);
        bool ok = rule_ok && isfinite(L->threshold) && L->threshold >= 0 && frac_ok(L->active_frac) &&
                  frac_ok(L->recall) && frac_ok(L->precision) && frac_ok(L->pred_frac);
        for (int k = 0; k < FLM_AGG_K; k++) {
            L->s_agg[k] = flm_get_f32(p + 32 + 4 * k);
            ok = ok && frac_ok(L->s_agg[k]);
        }
        o += LAYER_BYTES;
        if (version >= 2) {
            for (uint32_t k = 0; k < nl; k++, o += LEVEL_BYTES) {
                flm_level *v = &L->levels[k];
                v->tau = flm_get_f32(buf + o);
                v->pred_threshold = flm_get_f32(buf + o + 4);
                v->oracle_frac = flm_get_f32(buf + o + 8);
                v->pred_frac = flm_get_f32(buf + o + 12);
                v->kept = flm_get_f32(buf + o + 16);
                v->recall = flm_get_f32(buf + o + 20);
                v->precision = flm_get_f32(buf + o + 24);
                ok = ok && isfinite(v->tau) && v->tau >= 0 && isfinite(v->pred_threshold) &&
                     frac_ok(v->oracle_frac) && frac_ok(v->pred_frac) && frac_ok(v->kept) && frac_ok(v->recall) &&
                     frac_ok(v->precision);
            }
        }
        if (!ok) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: layer %u has an invalid rule or statistics", what,
                          l);
            break;
        }
        size_t used = 0;
        char name[256];
        snprintf(name, sizeof name, "%s: predictor of layer %u", what, l);
        st = flm_predictor_deserialize(&L->pred, buf + o, len - o, &used, name, err);
        o += used;
        if (!st && version == 1) /* one level: what was stored */
            L->levels[0] = (flm_level){L->threshold, L->pred.threshold, L->active_frac, L->pred_frac, 1.0f,
                                       L->recall, L->precision};
    }
    if (!st && version == 3) { /* the original neuron order: a permutation per layer */
        if (len - o < 4 || memcmp(buf + o, "FSPO", 4) != 0)
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: version 3 without its neuron order", what);
        else
            o += 4;
        uint8_t *seen = NULL;
        for (uint32_t l = 0; l < n_layers && !st; l++) {
            flm_predictor_layer *L = &s->layers[l];
            const uint32_t F = L->pred.d_ffn;
            if ((len - o) / 4 < F) {
                st = flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: the neuron order of layer %u is truncated",
                              what, l);
                break;
            }
            free(seen);
            if (!(L->orig = malloc((size_t)F * sizeof *L->orig)) || !(seen = calloc(F, 1))) {
                st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", what);
                break;
            }
            for (uint32_t i = 0; i < F && !st; i++, o += 4) {
                uint32_t v = flm_get_u32(buf + o);
                if (v >= F || seen[v])
                    st = flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: the neuron order of layer %u is not a "
                                  "permutation (record %u)", what, l, i);
                else
                    seen[v] = 1;
                L->orig[i] = v;
            }
        }
        free(seen);
    }
    if (!st && o != len)
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: %zu trailing bytes", what, len - o);
    if (st) flm_predictor_region_free(s);
    return st;
}

void flm_predictor_region_use_level(flm_predictor_region *s, uint32_t k) {
    if (k >= s->n_levels) return;
    for (uint32_t l = 0; l < s->n_layers; l++) {
        flm_predictor_layer *L = &s->layers[l];
        L->threshold = L->levels[k].tau;
        L->active_frac = L->levels[k].oracle_frac;
        L->pred_frac = L->levels[k].pred_frac;
        L->pred.threshold = L->levels[k].pred_threshold;
        L->recall = L->levels[k].recall;
        L->precision = L->levels[k].precision;
    }
}

int flm_predictor_region_find_level(const flm_predictor_region *s, float eps) {
    for (uint32_t k = 0; k < s->n_levels; k++)
        if (fabsf(s->level_eps[k] - eps) <= 1e-6f * (fabsf(eps) + 1e-6f) + 1e-9f) return (int)k;
    return -1;
}

void flm_predictor_region_free(flm_predictor_region *s) {
    if (!s) return;
    for (uint32_t l = 0; s->layers && l < s->n_layers; l++) {
        flm_predictor_free(&s->layers[l].pred);
        free(s->layers[l].orig);
    }
    free(s->layers);
    memset(s, 0, sizeof *s);
}

uint32_t flm_contrib_set(const float *h, const float *dn, uint32_t F, float tau, float *e, uint32_t *ids) {
    double sum = 0;
    for (uint32_t i = 0; i < F; i++) {
        float c = h[i] * dn[i];
        e[i] = c * c;
        sum += e[i];
    }
    float t2 = (float)((double)tau * tau * sum);
    uint32_t n = 0;
    for (uint32_t i = 0; i < F; i++)
        if (e[i] > t2) ids[n++] = i;
    return n;
}
