/* forward.c — the llama forward pass for one token (cf. llama2.c run.c `forward`). */
#include <math.h>
#include <string.h>

#include "core/types.h"
#include "runtime/runtime.h"

static float silu(float x) { return x / (1.0f + expf(-x)); }

void flm_ffn_dense(const flm_kernels *k, const flm_hparams *hp, const flm_weight *up, const flm_weight *gate,
                   const flm_weight *down, const float *in, float *out, float *hb, float *hb2, int n_threads) {
    flm_matvec(k, up->type, up->data, hp->d_ffn, hp->d_model, in, hb2, n_threads);
    if (hp->gated) {
        flm_matvec(k, gate->type, gate->data, hp->d_ffn, hp->d_model, in, hb, n_threads);
        for (uint32_t i = 0; i < hp->d_ffn; i++) {
            float g = hp->act == FLM_ACT_RELU ? (hb[i] > 0.0f ? hb[i] : 0.0f) : silu(hb[i]);
            hb[i] = g * hb2[i];
        }
    } else {
        for (uint32_t i = 0; i < hp->d_ffn; i++)
            hb[i] = hp->act == FLM_ACT_RELU ? (hb2[i] > 0.0f ? hb2[i] : 0.0f) : silu(hb2[i]);
    }
    flm_matvec(k, down->type, down->data, hp->d_model, hp->d_ffn, hb, out, n_threads);
}

flm_status flm_forward(flm_ctx *ctx, int32_t token, int32_t pos, flm_token_stats *tok, flm_error *err) {
    const flm_model *m = ctx->model;
    const flm_hparams *hp = &m->hp;
    const flm_kernels *k = ctx->k;
    flm_scratch *s = &ctx->s;
    int nt = ctx->params.n_threads;
    uint32_t d = hp->d_model, q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;

    /* token embedding: row `token` of token_embd */
    size_t row_bytes = flm_row_bytes(m->tok_embd.type, m->tok_embd.n_in);
    k->dequant[m->tok_embd.type]((const uint8_t *)m->tok_embd.data + (size_t)token * row_bytes, s->x, d);

    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const flm_layer_weights *L = &m->layers[l];
        /* attention */
        flm_rmsnorm(s->xb, s->x, L->attn_norm.data, d, hp->norm_eps);
        float *kc = flm_kv_key(&ctx->kv, l, (uint32_t)pos), *vc = flm_kv_value(&ctx->kv, l, (uint32_t)pos);
        flm_matvec(k, L->wq.type, L->wq.data, q_dim, d, s->xb, s->q, nt);
        flm_matvec(k, L->wk.type, L->wk.data, kv_dim, d, s->xb, kc, nt);
        flm_matvec(k, L->wv.type, L->wv.data, kv_dim, d, s->xb, vc, nt);
        flm_rope(s->q, hp->n_heads, hp->head_dim, hp->rope_dim, (uint32_t)pos, hp->rope_theta);
        flm_rope(kc, hp->n_kv_heads, hp->head_dim, hp->rope_dim, (uint32_t)pos, hp->rope_theta);
        flm_attention(&ctx->kv, l, (uint32_t)pos, s->q, hp->n_heads, hp->n_kv_heads, hp->head_dim, s->att, s->xb,
                      nt);
        flm_matvec(k, L->wo.type, L->wo.data, d, q_dim, s->xb, s->xb2, nt);
        for (uint32_t i = 0; i < d; i++) s->x[i] += s->xb2[i];
        /* FFN */
        flm_rmsnorm(s->xb, s->x, L->ffn_norm.data, d, hp->norm_eps);
        if (ctx->ffn_tap) ctx->ffn_tap(ctx->tap_user, l, s->xb);
        if (ctx->flash) {
            flm_status st = flm_flash_ffn(ctx, l, s->xb, s->xb2, tok, err);
            if (st) return st;
        } else {
            flm_ffn_dense(k, hp, &L->ffn_up, &L->ffn_gate, &L->ffn_down, s->xb, s->xb2, s->hb, s->hb2, nt);
        }
        for (uint32_t i = 0; i < d; i++) s->x[i] += s->xb2[i];
    }
    flm_rmsnorm(s->x, s->x, m->output_norm.data, d, hp->norm_eps);
    flm_matvec(k, m->output.type, m->output.data, hp->n_vocab, d, s->x, s->logits, nt);
    return FLM_OK;
}
