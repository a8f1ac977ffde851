/* forward.c — the forward pass for one token (cf. llama2.c run.c `forward`), driven by the architecture's
 * descriptor (model/arch.h). Per layer, for the architectures known so far:
 *
 *   h   = rmsnorm(x) * attn_norm
 *   q,k,v = Wq h (+bq), Wk h (+bk), Wv h (+bv)         biases: Qwen2
 *   q,k = rmsnorm per head * q_norm, k_norm           Gemma 3
 *   q,k = rope(q, k, pos)                              normal (llama) or NEOX order; local base on SWA layers
 *   a   = Wo attention(q, K[first..pos], V[first..pos]) first = pos - n_swa + 1 on sliding-window layers
 *   x  += post_attn_norm ? rmsnorm(a) * post_attn_norm : a
 *   h   = rmsnorm(x) * ffn_norm
 *   f   = down(act(gate h) * (up h))                   SiLU, ReLU or tanh-GELU; by the mode's FFN source
 *                                                      (runtime/ffn_source.h: memory, flash, neuron cache)
 *   x  += post_ffn_norm ? rmsnorm(f) * post_ffn_norm : f
 *
 * then logits = output rmsnorm(x) * output_norm. Gemma scales the embedding row by sqrt(d_model).
 *
 * Corrupt weights: streamed FFN regions are not checksummed per token (flashlm verify does that), and a GGUF's
 * weights never are, so a NaN or Inf weight would flow into the logits and the sampler would print garbage with exit
 * 0. Each layer's attention and FFN outputs (d_model floats) and the logits are checked to be finite — one pass of
 * integer compares, nothing next to the matrix products — and a non-finite one stops the token with an error naming
 * the file, the layer and the region (FLM_ERR_CHECKSUM for .flm data, FLM_ERR_FORMAT for a GGUF's). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

#include "core/types.h"
#include "runtime/runtime.h"

static void add_bias(float *y, const flm_weight *b, uint32_t n) {
    if (!b->data) return;
    const float *v = b->data;
    for (uint32_t i = 0; i < n; i++) y[i] += v[i];
}

/* RMSNorm of each of n_heads heads of head_dim floats, in place, with weight w[head_dim] (Gemma's q/k norms) */
static void head_norm(float *v, const flm_weight *w, uint32_t n_heads, uint32_t head_dim, float eps) {
    if (!w->data) return;
    for (uint32_t h = 0; h < n_heads; h++) flm_rmsnorm(v + (size_t)h * head_dim, v + (size_t)h * head_dim, w->data,
                                                       head_dim, eps);
}

/* x += norm ? rmsnorm(y) * norm : y */
static void residual(float *x, float *y, const flm_weight *norm, uint32_t d, float eps) {
    if (norm->data) flm_rmsnorm(y, y, norm->data, d, eps);
    for (uint32_t i = 0; i < d; i++) x[i] += y[i];
}

/* true when none of v[0..n) is NaN or Inf (exponent bits all ones) */
static bool all_finite(const float *v, uint32_t n) {
    uint32_t bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return bad == 0;
}

/* The error for a non-finite output of `what` ("FFN", "attention", "output") in layer l (UINT32_MAX: none). */
static flm_status not_finite(const flm_ctx *ctx, const char *what, uint32_t l, flm_error *err) {
    const bool ffn = !strcmp(what, "FFN");
    char layer[32] = "";
    if (l != UINT32_MAX) snprintf(layer, sizeof layer, " of layer %u", l);
    if (ctx->flash) { /* name the region as flashlm verify does */
        const char *path = ctx->flash->file->path;
        char region[64];
        if (ffn) snprintf(region, sizeof region, "FFN region%s", layer);
        else snprintf(region, sizeof region, "resident region (the %s%s)", what, layer);
        bool streamed = ffn && !ctx->flash->layer_data[l]; /* read per token, never checksummed */
        return flm_fail(err, FLM_ERR_CHECKSUM, "%s: data corrupt in the %s: its output is not finite (NaN or Inf); "
                        "run `flashlm verify %s`%s", path, region, path,
                        streamed ? "" : " (if it finds nothing, the weights were not finite before conversion)");
    }
    const char *path = ctx->model->gguf ? ctx->model->gguf->path : "model";
    return flm_fail(err, FLM_ERR_FORMAT, "%s: the %s output%s is not finite (NaN or Inf): its weights hold "
                    "non-finite values (the file is corrupt)", path, what, layer);
}

flm_status flm_forward(flm_ctx *ctx, int32_t token, int32_t pos, flm_token_stats *tok, flm_error *err) {
    ctx->cur_pos = pos;
    const flm_model *m = ctx->model;
    const flm_hparams *hp = &m->hp;
    const flm_kernels *k = ctx->k;
    flm_scratch *s = &ctx->s;
    int nt = ctx->params.n_threads;
    const bool neox = hp->arch->rope == FLM_ROPE_NEOX;
    uint32_t d = hp->d_model, q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;

    /* token embedding: row `token` of token_embd, in memory or read from the file (the plan may leave it there) */
    if (m->tok_embd.data) {
        size_t row_bytes = flm_row_bytes(m->tok_embd.type, m->tok_embd.n_in);
        k->dequant[m->tok_embd.type]((const uint8_t *)m->tok_embd.data + (size_t)token * row_bytes, s->x, d);
    } else {
        flm_status st = flm_flash_embedding(ctx, token, s->x, tok, err); /* before anything changes: no half token */
        if (st) return st;
    }
    if (hp->arch->flags & FLM_ARCH_EMBD_SCALE) {
        const float sc = sqrtf((float)d);
        for (uint32_t i = 0; i < d; i++) s->x[i] *= sc;
    }

    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const flm_layer_weights *L = &m->layers[l];
        /* attention */
        flm_rmsnorm(s->xb, s->x, L->attn_norm.data, d, hp->norm_eps);
        float *kc = s->k, *vc = s->v; /* stored into the KV cache (f16 or f32) once complete */
        flm_matvec(k, L->wq.type, L->wq.data, q_dim, d, s->xb, s->q, nt);
        flm_matvec(k, L->wk.type, L->wk.data, kv_dim, d, s->xb, kc, nt);
        flm_matvec(k, L->wv.type, L->wv.data, kv_dim, d, s->xb, vc, nt);
        add_bias(s->q, &L->bq, q_dim);
        add_bias(kc, &L->bk, kv_dim);
        add_bias(vc, &L->bv, kv_dim);
        head_norm(s->q, &L->q_norm, hp->n_heads, hp->head_dim, hp->norm_eps);
        head_norm(kc, &L->k_norm, hp->n_kv_heads, hp->head_dim, hp->norm_eps);
        const float theta = L->swa ? hp->rope_theta_local : hp->rope_theta;
        flm_rope(s->q, hp->n_heads, hp->head_dim, hp->rope_dim, (uint32_t)pos, theta, neox);
        flm_rope(kc, hp->n_kv_heads, hp->head_dim, hp->rope_dim, (uint32_t)pos, theta, neox);
        flm_kv_store(&ctx->kv, l, (uint32_t)pos, kc, vc); /* f16 (rounded, as llama.cpp's KV cache) unless --kv-f32 */
        uint32_t first = L->swa && (uint32_t)pos >= hp->n_swa ? (uint32_t)pos - hp->n_swa + 1 : 0;
        flm_attention(k, &ctx->kv, l, first, (uint32_t)pos, s->q, hp->n_heads, hp->n_kv_heads, hp->head_dim,
                      hp->attn_scale, s->att, s->xb, nt);
        flm_matvec(k, L->wo.type, L->wo.data, d, q_dim, s->xb, s->xb2, nt);
        if (!all_finite(s->xb2, d)) return not_finite(ctx, "attention", l, err);
        residual(s->x, s->xb2, &L->post_attn_norm, d, hp->norm_eps);
        /* FFN */
        flm_rmsnorm(s->xb, s->x, L->ffn_norm.data, d, hp->norm_eps);
        if (ctx->ffn_tap) ctx->ffn_tap(ctx->tap_user, l, s->xb);
        flm_status st = ctx->ffn->compute(ctx, l, s->xb, s->xb2, tok, err); /* the mode's source (ffn_source.h) */
        if (st) return st;
        if (!all_finite(s->xb2, d)) return not_finite(ctx, "FFN", l, err);
        residual(s->x, s->xb2, &L->post_ffn_norm, d, hp->norm_eps);
    }
    flm_rmsnorm(s->x, s->x, m->output_norm.data, d, hp->norm_eps);
    flm_matvec(k, m->output.type, m->output.data, hp->n_vocab, d, s->x, s->logits, nt);
    if (!all_finite(s->logits, hp->n_vocab)) return not_finite(ctx, "output", UINT32_MAX, err);
    return FLM_OK;
}

/* The batch's FFN of layer l: the tap sees every token's input first (it only observes), then the source's
 * compute_batch, or token by token (a source without one; the select hook, which chooses per token). in/out rows are
 * xb / d_model floats apart. */
static flm_status ffn_batch(flm_ctx *ctx, uint32_t l, uint32_t n, int32_t pos, const float *in, size_t xb, float *out,
                            flm_token_stats *tok, flm_error *err) {
    const uint32_t d = ctx->model->hp.d_model;
    if (ctx->ffn_tap)
        for (uint32_t t = 0; t < n; t++) ctx->ffn_tap(ctx->tap_user, l, in + t * xb);
    if (ctx->ffn->compute_batch && !ctx->ffn_select)
        return ctx->ffn->compute_batch(ctx, l, n, in, xb, out, d, tok, err);
    for (uint32_t t = 0; t < n; t++) {
        ctx->cur_pos = pos + (int32_t)t;
        flm_status st = ctx->ffn->compute(ctx, l, in + t * xb, out + (size_t)t * d, tok, err);
        if (st) return st;
    }
    ctx->cur_pos = pos;
    return FLM_OK;
}

flm_status flm_forward_batch(flm_ctx *ctx, const int32_t *tokens, uint32_t n, int32_t pos, float *logits_all,
                             flm_token_stats *tok, flm_error *err) {
    const flm_model *m = ctx->model;
    const flm_hparams *hp = &m->hp;
    const uint32_t V = hp->n_vocab;
    flm_scratch *s = &ctx->s;
    if (n == 1 || s->n_batch < n) { /* one token (decoding), or no batch arrays: the single-token pass */
        for (uint32_t i = 0; i < n; i++) {
            flm_status st = flm_forward(ctx, tokens[i], pos + (int32_t)i, tok, err);
            if (st) return st;
            if (logits_all) memcpy(logits_all + (size_t)i * V, s->logits, V * sizeof(float));
        }
        return FLM_OK;
    }
    ctx->cur_pos = pos; /* the batch's first position (FFN sources see pos .. pos + n - 1) */
    const flm_kernels *k = ctx->k;
    const int nt = ctx->params.n_threads;
    const bool neox = hp->arch->rope == FLM_ROPE_NEOX;
    const uint32_t d = hp->d_model, q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;
    const size_t xb = q_dim > d ? q_dim : d; /* row stride of bxb */
    float *X = s->bx, *XB = s->bxb, *XB2 = s->bxb2;

    /* token embeddings: every row first (a failed read changes nothing) */
    for (uint32_t t = 0; t < n; t++) {
        float *x = X + (size_t)t * d;
        if (m->tok_embd.data) {
            size_t row_bytes = flm_row_bytes(m->tok_embd.type, m->tok_embd.n_in);
            k->dequant[m->tok_embd.type]((const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * row_bytes, x, d);
        } else {
            flm_status st = flm_flash_embedding(ctx, tokens[t], x, tok, err);
            if (st) return st;
        }
        if (hp->arch->flags & FLM_ARCH_EMBD_SCALE) {
            const float sc = sqrtf((float)d);
            for (uint32_t i = 0; i < d; i++) x[i] *= sc;
        }
    }
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const flm_layer_weights *L = &m->layers[l];
        /* attention: q, k, v for every token as matrix-matrix products, then each token attends causally */
        for (uint32_t t = 0; t < n; t++) flm_rmsnorm(XB + t * xb, X + (size_t)t * d, L->attn_norm.data, d, hp->norm_eps);
        flm_matmat(k, L->wq.type, L->wq.data, q_dim, d, XB, xb, n, s->bq, q_dim, nt);
        flm_matmat(k, L->wk.type, L->wk.data, kv_dim, d, XB, xb, n, s->bk, kv_dim, nt);
        flm_matmat(k, L->wv.type, L->wv.data, kv_dim, d, XB, xb, n, s->bv, kv_dim, nt);
        const float theta = L->swa ? hp->rope_theta_local : hp->rope_theta;
        for (uint32_t t = 0; t < n; t++) {
            float *q = s->bq + (size_t)t * q_dim, *kc = s->bk + (size_t)t * kv_dim, *vc = s->bv + (size_t)t * kv_dim;
            const uint32_t p = (uint32_t)pos + t;
            add_bias(q, &L->bq, q_dim);
            add_bias(kc, &L->bk, kv_dim);
            add_bias(vc, &L->bv, kv_dim);
            head_norm(q, &L->q_norm, hp->n_heads, hp->head_dim, hp->norm_eps);
            head_norm(kc, &L->k_norm, hp->n_kv_heads, hp->head_dim, hp->norm_eps);
            flm_rope(q, hp->n_heads, hp->head_dim, hp->rope_dim, p, theta, neox);
            flm_rope(kc, hp->n_kv_heads, hp->head_dim, hp->rope_dim, p, theta, neox);
            flm_kv_store(&ctx->kv, l, p, kc, vc);
        }
        for (uint32_t t = 0; t < n; t++) {
            const uint32_t p = (uint32_t)pos + t;
            uint32_t first = L->swa && p >= hp->n_swa ? p - hp->n_swa + 1 : 0;
            flm_attention(k, &ctx->kv, l, first, p, s->bq + (size_t)t * q_dim, hp->n_heads, hp->n_kv_heads,
                          hp->head_dim, hp->attn_scale, s->att, XB + t * xb, nt);
        }
        flm_matmat(k, L->wo.type, L->wo.data, d, q_dim, XB, xb, n, XB2, d, nt);
        if (!all_finite(XB2, n * d)) return not_finite(ctx, "attention", l, err);
        for (uint32_t t = 0; t < n; t++)
            residual(X + (size_t)t * d, XB2 + (size_t)t * d, &L->post_attn_norm, d, hp->norm_eps);
        /* FFN */
        for (uint32_t t = 0; t < n; t++) flm_rmsnorm(XB + t * xb, X + (size_t)t * d, L->ffn_norm.data, d, hp->norm_eps);
        flm_status st = ffn_batch(ctx, l, n, pos, XB, xb, XB2, tok, err);
        if (st) return st;
        if (!all_finite(XB2, n * d)) return not_finite(ctx, "FFN", l, err);
        for (uint32_t t = 0; t < n; t++)
            residual(X + (size_t)t * d, XB2 + (size_t)t * d, &L->post_ffn_norm, d, hp->norm_eps);
    }
    /* logits: every token's, or the last one's */
    if (logits_all) {
        for (uint32_t t = 0; t < n; t++)
            flm_rmsnorm(X + (size_t)t * d, X + (size_t)t * d, m->output_norm.data, d, hp->norm_eps);
        flm_matmat(k, m->output.type, m->output.data, V, d, X, d, n, logits_all, V, nt);
        if (!all_finite(logits_all, n * V)) return not_finite(ctx, "output", UINT32_MAX, err);
        memcpy(s->logits, logits_all + (size_t)(n - 1) * V, V * sizeof(float));
    } else {
        float *x = X + (size_t)(n - 1) * d;
        flm_rmsnorm(x, x, m->output_norm.data, d, hp->norm_eps);
        flm_matvec(k, m->output.type, m->output.data, V, d, x, s->logits, nt);
        if (!all_finite(s->logits, V)) return not_finite(ctx, "output", UINT32_MAX, err);
    }
    ctx->cur_pos = pos + (int32_t)n - 1;
    return FLM_OK;
}
