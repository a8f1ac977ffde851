#include "sparsity/sparsity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/util.h"

#define HDR_BYTES 32u
#define LAYER_BYTES (32u + 4u * FLM_AGG_K)


flm_status flm_sparsity_serialize(const flm_sparsity *s, uint8_t **out, size_t *len, flm_error *err) {
    size_t n = HDR_BYTES;
    for (uint32_t l = 0; l < s->n_layers; l++) n += LAYER_BYTES + flm_predictor_serialized_bytes(&s->layers[l].pred);
    uint8_t *b = calloc(1, n);
    if (!b) return flm_fail(err, FLM_ERR_NOMEM, "out of memory for the predictor region");
    memcpy(b, "FSPR", 4);
    flm_put_u32(b + 4, 1);
    flm_put_u32(b + 8, s->n_layers);
    flm_put_f32(b + 12, s->target_sparsity);
    flm_put_u32(b + 16, FLM_AGG_K);
    size_t o = HDR_BYTES;
    for (uint32_t l = 0; l < s->n_layers; l++) {
        const flm_layer_sparsity *L = &s->layers[l];
        flm_put_u32(b + o, L->rule);
        flm_put_f32(b + o + 4, L->threshold);
        flm_put_f32(b + o + 8, L->active_frac);
        flm_put_f32(b + o + 12, L->recall);
        flm_put_f32(b + o + 16, L->precision);
        flm_put_f32(b + o + 20, L->pred_frac);
        for (int k = 0; k < FLM_AGG_K; k++) flm_put_f32(b + o + 32 + 4 * k, L->s_agg[k]);
        o += LAYER_BYTES;
        flm_predictor_serialize(&L->pred, b + o);
        o += flm_predictor_serialized_bytes(&L->pred);
    }
    *out = b;
    *len = n;
    return FLM_OK;
}

static bool frac_ok(float f) { return isfinite(f) && f >= 0.0f && f <= 1.0f; }

flm_status flm_sparsity_deserialize(const uint8_t *buf, size_t len, const char *what, flm_sparsity *s,
                                    flm_error *err) {
    memset(s, 0, sizeof *s);
    if (len < HDR_BYTES || memcmp(buf, "FSPR", 4) != 0)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: bad magic or too short (%zu bytes)", what, len);
    if (flm_get_u32(buf + 4) != 1)
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: predictor region: version %u not supported", what,
                        flm_get_u32(buf + 4));
    uint32_t n_layers = flm_get_u32(buf + 8);
    if (n_layers == 0 || n_layers > 4096 || flm_get_u32(buf + 16) != FLM_AGG_K || !frac_ok(flm_get_f32(buf + 12)))
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: %u layers / %u aggregation points are invalid",
                        what, n_layers, flm_get_u32(buf + 16));
    s->layers = calloc(n_layers, sizeof *s->layers);
    if (!s->layers) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", what);
    s->n_layers = n_layers;
    s->target_sparsity = flm_get_f32(buf + 12);
    size_t o = HDR_BYTES;
    flm_status st = FLM_OK;
    for (uint32_t l = 0; l < n_layers && !st; l++) {
        flm_layer_sparsity *L = &s->layers[l];
        if (len - o < LAYER_BYTES) {
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
        bool ok = (L->rule == FLM_RULE_RELU || L->rule == FLM_RULE_CATS) && isfinite(L->threshold) &&
                  L->threshold >= 0 && frac_ok(L->active_frac) && frac_ok(L->recall) && frac_ok(L->precision) &&
                  frac_ok(L->pred_frac);
        for (int k = 0; k < FLM_AGG_K; k++) {
            L->s_agg[k] = flm_get_f32(p + 32 + 4 * k);
            ok = ok && frac_ok(L->s_agg[k]);
        }
        if (!ok) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: layer %u has an invalid rule or statistics", what,
                          l);
            break;
        }
        o += LAYER_BYTES;
        size_t used = 0;
        char name[256];
        snprintf(name, sizeof name, "%s: predictor of layer %u", what, l);
        st = flm_predictor_deserialize(&L->pred, buf + o, len - o, &used, name, err);
        o += used;
    }
    if (!st && o != len)
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region: %zu trailing bytes", what, len - o);
    if (st) flm_sparsity_free(s);
    return st;
}

void flm_sparsity_free(flm_sparsity *s) {
    if (!s) return;
    for (uint32_t l = 0; s->layers && l < s->n_layers; l++) flm_predictor_free(&s->layers[l].pred);
    free(s->layers);
    memset(s, 0, sizeof *s);
}
