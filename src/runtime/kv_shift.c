/* kv_shift.c — the context shift (flm_kv_shift): drop a range of KV cache positions, move the later ones down and
 * re-rotate their keys to their new positions, as llama.cpp's context shift does (llama_memory_seq_rm +
 * llama_memory_seq_add, whose K-shift re-applies RoPE with the position delta).
 *
 * Keys are stored after RoPE: the key of position p is R(p) k, where R(p) turns pair i of each head's first rope_dim
 * dimensions by the angle a_i(p) = p * theta^(-2i/rope_dim) (compute/attention.h, flm_rope). A rotation composes by
 * adding angles, so moving a key from p to p - d needs only a turn of each pair by a_i(p - d) - a_i(p): no
 * pre-RoPE key is kept or recomputed. The forward pass computes a_i(p) in float as (float)p * freq_i; the turn used
 * here is the difference of those two float angles, taken in double, so a shifted key equals the key a fresh
 * evaluation at p - d stores, up to the rounding of the cache (f16: one rounding more). Values carry no position:
 * they are moved as they are. */
#include <math.h>
#include <string.h>

#include "compute/attention.h"
#include "compute/kernels.h"
#include "core/error.h"
#include "runtime/runtime.h"

/* Turn pairs (a, b) of one key row (n_heads heads of head_dim elements) by the angles whose cosines and sines are
 * c[i], s[i], i < rope_dim / 2; pair i is (2i, 2i + 1) (normal) or (i, i + rope_dim / 2) (NEOX). */
static void turn_row(const flm_kv_cache *kv, void *row, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim,
                     bool neox, const double *c, const double *s) {
    const uint32_t half = rope_dim / 2;
    for (uint32_t h = 0; h < n_heads; h++)
        for (uint32_t i = 0; i < half; i++) {
            size_t a = (size_t)h * head_dim + (neox ? i : 2 * i), b = (size_t)h * head_dim + (neox ? i + half : 2 * i + 1);
            double v0, v1;
            if (kv->elem_bytes == FLM_KV_F32) {
                float *f = row;
                v0 = f[a];
                v1 = f[b];
                f[a] = (float)(v0 * c[i] - v1 * s[i]);
                f[b] = (float)(v0 * s[i] + v1 * c[i]);
            } else {
                uint16_t *q = row;
                v0 = flm_f16_to_f32(q[a]);
                v1 = flm_f16_to_f32(q[b]);
                q[a] = flm_f32_to_f16((float)(v0 * c[i] - v1 * s[i]));
                q[b] = flm_f32_to_f16((float)(v0 * s[i] + v1 * c[i]));
            }
        }
}

/* cos and sin of a_i(to) - a_i(from) for i < rope_dim / 2, the angles as the forward pass computes them (flm_rope) */
static void turn_angles(uint32_t from, uint32_t to, float theta, uint32_t rope_dim, double *c, double *s) {
    for (uint32_t i = 0; i < rope_dim / 2; i++) {
        const float freq = 1.0f / powf(theta, (float)(2 * i) / (float)rope_dim);
        const double delta = (double)((float)to * freq) - (double)((float)from * freq);
        c[i] = cos(delta);
        s[i] = sin(delta);
    }
}

void flm_kv_shift_rows(const flm_backend *be, const flm_model *m, uint32_t from, uint32_t to0, uint32_t n_move,
                       int n_threads) {
    const flm_hparams *hp = &m->hp;
    const flm_kv_cache *kv = &be->kv;
    const size_t row = (size_t)kv->kv_dim * kv->elem_bytes;
    const uint32_t n_discard = from - to0;
    /* 1. move rows [from, from + n_move) down to [to0, to0 + n_move), every layer: keys and values */
    for (uint32_t l = 0; l < hp->n_layers && n_move; l++) {
        memmove(flm_kv_key(kv, l, to0), flm_kv_key(kv, l, from), n_move * row);
        memmove(flm_kv_value(kv, l, to0), flm_kv_value(kv, l, from), n_move * row);
    }
    /* 2. turn the moved keys from their old positions to their new ones, with each layer's RoPE base (the local one
     * on sliding-window layers) */
    const bool neox = hp->arch->rope == FLM_ROPE_NEOX;
    const bool two_bases = hp->rope_theta_local != hp->rope_theta;
    int nt = n_threads > 1 && n_move >= 64 ? n_threads : 1;
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t j = 0; j < (int64_t)n_move; j++) {
        const uint32_t to = to0 + (uint32_t)j, old = to + n_discard;
        double c[FLM_ATT_MAX_HEAD_DIM / 2], s[FLM_ATT_MAX_HEAD_DIM / 2];     /* global base */
        double cl[FLM_ATT_MAX_HEAD_DIM / 2], sl[FLM_ATT_MAX_HEAD_DIM / 2];   /* local base (sliding-window layers) */
        turn_angles(old, to, hp->rope_theta, hp->rope_dim, c, s);
        if (two_bases) turn_angles(old, to, hp->rope_theta_local, hp->rope_dim, cl, sl);
        for (uint32_t l = 0; l < hp->n_layers; l++) {
            const bool local = two_bases && m->layers[l].swa;
            turn_row(kv, flm_kv_key(kv, l, to), hp->n_kv_heads, hp->head_dim, hp->rope_dim, neox, local ? cl : c,
                     local ? sl : s);
        }
    }
}

flm_status flm_kv_shift(flm_ctx *ctx, int32_t n_keep, int32_t n_discard, flm_error *err) {
    if (!ctx) return flm_fail(err, FLM_ERR_ARG, "context shift: no context");
    ctx->tree_n = 0; /* a tree's nodes sit past n_past: forgotten */
    const int32_t n_past = ctx->next_pos;
    if (n_keep < 0 || n_discard < 0 || (int64_t)n_keep + n_discard > n_past)
        return flm_fail(err, FLM_ERR_ARG, "context shift: cannot keep %d and discard %d tokens: the context holds %d "
                        "(n_keep >= 0, n_discard >= 0, n_keep + n_discard <= %d)", n_keep, n_discard, n_past, n_past);
    if (n_discard == 0) return FLM_OK;
    const uint32_t from = (uint32_t)(n_keep + n_discard), n_move = (uint32_t)n_past - from;
    ctx->be.ops->kv_shift(&ctx->be, ctx->model, from, (uint32_t)n_keep, n_move, ctx->params.n_threads);
    ctx->next_pos = n_past - n_discard;
    return FLM_OK;
}
