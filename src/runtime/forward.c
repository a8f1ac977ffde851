/* forward.c — the forward pass (cf. llama2.c run.c `forward`): ONE pass for a batch of n >= 1 tokens at positions
 * pos .. pos + n - 1 (decoding is n = 1), assembled from the blocks of runtime/pass.h that the architecture's
 * descriptor (model/arch.h) selects. For each token t (x_t: d_model floats):
 *
 *   x_t  = E[token_t] * (sqrt(d_model) if EMBD_SCALE) (+ P[pos + t] if learned positions)   E row: memory or flash
 *          (OPT-350M: proj_in E[token_t], d_embd -> d_model, then + P[pos + t])
 *   for each layer (pre-LN; post-LN below):
 *     h_t       = norm(x_t) * attn_norm (+ attn_norm_b)          norm: RMSNorm, or LayerNorm with bias
 *     q, k, v   = Wq h_t + bq,  Wk h_t + bk,  Wv h_t + bv          biases where the model has them (Qwen2); a fused
 *                                                                 attn_qkv as row ranges, or head by head (Persimmon)
 *     q, k      = norm per head * q_norm, k_norm (+ biases)       Gemma 3: RMSNorm; Persimmon: LayerNorm
 *     q, k      = rope(q, k, pos + t)                              normal or NEOX order, on each head's first rope_dim
 *                                                                 dimensions (partial: Phi-2, Persimmon); local base
 *                                                                 on SWA layers; one k/v head for all: multi-query
 *     K, V[pos + t] = k, v                                         the KV cache, f16 (as llama.cpp) or f32
 *     a_t       = Wo attention(q, K[first..pos+t], V[...]) + bo    first = pos + t - n_swa + 1 on SWA layers, else 0
 *     x_t      += post_attn_norm ? rmsnorm(a_t) * post_attn_norm : a_t
 *     h_t       = norm(x_t) * ffn_norm (+ ffn_norm_b)             parallel archs: of x_t before the line above
 *                                                                 (and attn_norm when there is no ffn_norm)
 *     f_t       = down(act(gate h_t) * (up h_t))                  act: SiLU, tanh- or erf-GELU, ReLU, squared ReLU;
 *                                                                 ungated act(up h_t);
 *                                                                 by the mode's FFN source (ffn_source.h);
 *                                                                 FFN biases (OPT): up h_t + b_up, then f_t + b_down
 *     x_t      += post_ffn_norm ? rmsnorm(f_t) * post_ffn_norm : f_t
 *   logits_t = W_out (norm(x_t) * output_norm (+ output_norm_b)) (+ b_out)   every token's, or the last one's
 *              (OPT-350M: W_out proj_out x_t, d_model -> d_embd, no output norm)
 *
 * Post-LN (hp->norm_after, OPT-350M's do_layer_norm_before = false): the blocks read x_t itself, and the norms follow
 * the residual adds: x_t = norm(x_t + a_t) * attn_norm + attn_norm_b, then x_t = norm(x_t + f_t) * ffn_norm +
 * ffn_norm_b, where a_t and f_t are the attention and FFN of x_t; the output norm is optional.
 *
 * One token (n = 1) runs on the single-token scratch and its matrices as matrix-vector products (flm_matvec); a batch
 * runs on the batch scratch with matrix-matrix products (flm_matmat: each resident weight row read once for the
 * batch) and the FFN source's compute_batch (or its compute token by token: a source without one, the select hook).
 * A batch larger than the scratch holds, or a context without batch arrays, runs token by token.
 *
 * Every block is the backend's (runtime/backend.h: ctx->be.ops; the CPU backend runs the blocks below), so this
 * file reads as the sequence above, and a device is a backend, not an edit here.
 *
 * Corrupt weights: streamed FFN regions are not checksummed per token (flashlm verify does that), and a GGUF's
 * weights never are, so a NaN or Inf weight would flow into the logits and the sampler would print garbage with exit
 * 0. Each layer's attention and FFN outputs (d_model floats per token) and the logits are watched by the backend
 * (the CPU's: one pass of integer compares, nothing next to the matrix products), which keeps the first non-finite
 * one; its verdict is asked once per pass, and a non-finite output fails the pass with an error naming the file, the
 * layer and the region (FLM_ERR_CHECKSUM for .flm data, FLM_ERR_FORMAT for a GGUF's). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#include "core/types.h"
#include "runtime/hooks.h"
#include "runtime/pass.h"
#include "runtime/runtime.h"

static void add_bias(float *y, const flm_weight *b, uint32_t n) {
    if (!b->data) return;
    const float *v = b->data;
    for (uint32_t i = 0; i < n; i++) y[i] += v[i];
}

/* The norm of each of n_heads heads of head_dim floats, in place, with weight w[head_dim]: RMSNorm (Gemma's q/k norms),
 * or LayerNorm with bias b[head_dim] (Persimmon's; b->data may be NULL) */
static void head_norm(float *v, const flm_weight *w, const flm_weight *b, bool layer, uint32_t n_heads,
                      uint32_t head_dim, float eps) {
    if (!w->data) return;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        if (layer) flm_layernorm(x, x, w->data, b->data, head_dim, eps);
        else flm_rmsnorm(x, x, w->data, head_dim, eps);
    }
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

/* ---- the blocks (pass.h) ------------------------------------------------------------------------------------ */

void flm_pass_norm(const flm_pass *P, const flm_weight *w, const flm_weight *b, uint32_t dim, const float *in,
                   size_t in_stride, float *out, size_t out_stride) {
    const flm_hparams *hp = P->hp;
    const bool layer = hp->arch->norm == FLM_NORM_LAYER;
    for (uint32_t t = 0; t < P->n; t++) {
        const float *x = in + t * in_stride;
        float *y = out + t * out_stride;
        if (layer) flm_layernorm(y, x, w->data, b ? b->data : NULL, dim, hp->norm_eps);
        else flm_rmsnorm(y, x, w->data, dim, hp->norm_eps);
    }
}

void flm_pass_linear(const flm_pass *P, const flm_weight *W, const flm_weight *b, size_t rows, size_t cols,
                     const float *in, size_t in_stride, float *out, size_t out_stride) {
    if (P->n == 1) flm_matvec_ws(P->k, W->type, W->data, rows, cols, in, out, P->n_threads, P->be ? P->be->work : NULL);
    else flm_matmat(P->k, W->type, W->data, rows, cols, in, in_stride, P->n, out, out_stride, P->n_threads,
                    P->be ? P->be->work : NULL);
    if (b)
        for (uint32_t t = 0; t < P->n; t++) add_bias(out + t * out_stride, b, (uint32_t)rows);
}

void flm_pass_qkv(const flm_pass *P, const flm_layer_weights *L, const float *in, size_t in_stride, float *q, float *k,
                  float *v) {
    const flm_hparams *hp = P->hp;
    const size_t d = hp->d_model, hd = hp->head_dim, q_dim = (size_t)hp->n_heads * hd,
                 kv_dim = (size_t)hp->n_kv_heads * hd;
    if (!L->wqkv.data && P->n == 1) { /* one token: the three products in one parallel region, x quantized once */
        const flm_matvec_job jobs[3] = {{L->wq.type, L->wq.data, q_dim, q},
                                        {L->wk.type, L->wk.data, kv_dim, k},
                                        {L->wv.type, L->wv.data, kv_dim, v}};
        flm_matvec_multi_ws(P->k, jobs, 3, d, in, P->n_threads, P->be ? P->be->work : NULL);
        add_bias(q, &L->bq, (uint32_t)q_dim);
        add_bias(k, &L->bk, (uint32_t)kv_dim);
        add_bias(v, &L->bv, (uint32_t)kv_dim);
        return;
    }
    if (!L->wqkv.data) {
        flm_pass_linear(P, &L->wq, &L->bq, q_dim, d, in, in_stride, q, q_dim);
        flm_pass_linear(P, &L->wk, &L->bk, kv_dim, d, in, in_stride, k, kv_dim);
        flm_pass_linear(P, &L->wv, &L->bv, kv_dim, d, in, in_stride, v, kv_dim);
        return;
    }
    /* FLM_QKV_PER_HEAD (n_kv_heads == n_heads, checked at load): head h's q, k, v are rows (3h + j) * hd .. + hd */
    const size_t row_bytes = flm_row_bytes(L->wqkv.type, L->wqkv.n_in);
    float *out[3] = {q, k, v};
    for (uint32_t h = 0; h < hp->n_heads; h++)
        for (int j = 0; j < 3; j++) {
            const size_t first = ((size_t)h * 3 + (size_t)j) * hd;
            const flm_weight W = {L->wqkv.type, L->wqkv.n_in, hd, (const uint8_t *)L->wqkv.data + first * row_bytes};
            const flm_weight B = {FLM_TYPE_F32, hd, 1, L->bqkv.data ? (const float *)L->bqkv.data + first : NULL};
            flm_pass_linear(P, &W, &B, hd, d, in, in_stride, out[j] + (size_t)h * hd, j ? kv_dim : q_dim);
        }
}

void flm_pass_attention(const flm_pass *P, const flm_layer_weights *L, uint32_t kv_layer, float *q, float *k,
                        const float *v, float *out, size_t out_stride) {
    const flm_hparams *hp = P->hp;
    const size_t q_dim = (size_t)hp->n_heads * hp->head_dim, kv_dim = (size_t)hp->n_kv_heads * hp->head_dim;
    const bool rope = hp->arch->pos == FLM_POS_ROPE, neox = hp->arch->rope == FLM_ROPE_NEOX;
    const float theta = L->swa ? hp->rope_theta_local : hp->rope_theta;
    for (uint32_t t = 0; t < P->n; t++) {
        float *qt = q + t * q_dim, *kt = k + t * kv_dim;
        const uint32_t p = flm_pass_position(P, t), slot = flm_pass_slot(P, t);
        const flm_kv_cache *kv = P->row_kv ? P->row_kv[t] : P->kv;
        const bool layer = hp->arch->norm == FLM_NORM_LAYER;
        head_norm(qt, &L->q_norm, &L->q_norm_b, layer, hp->n_heads, hp->head_dim, hp->norm_eps);
        head_norm(kt, &L->k_norm, &L->k_norm_b, layer, hp->n_kv_heads, hp->head_dim, hp->norm_eps);
        if (rope) {
            flm_rope(qt, hp->n_heads, hp->head_dim, hp->rope_dim, p, theta, neox);
            flm_rope(kt, hp->n_kv_heads, hp->head_dim, hp->rope_dim, p, theta, neox);
        }
        flm_kv_store(P->k, kv, kv_layer, slot, kt, v + t * kv_dim); /* f16 (rounded, as llama.cpp's) unless --kv-f32 */
    }
    const flm_tree *T = P->tree; /* a joined pass: row by row, below */
    if (P->n > 1 && !P->row_kv) { /* a batch: blocked over the KV cache, the same bits as token by token below */
        const flm_att_tree at = T ? (flm_att_tree){T->base, T->n_nodes, T->depth, T->anc} : (flm_att_tree){0};
        if (flm_attention_batch(P->k, P->kv, kv_layer, (uint32_t)P->pos, P->n, L->swa ? hp->n_swa : 0, T ? &at : NULL,
                                q, q_dim, hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->attn_scale, out, out_stride,
                                P->n_threads, P->be ? P->be->work : NULL))
            return;
    }
    for (uint32_t t = 0; t < P->n; t++) {
        const uint32_t p = flm_pass_position(P, t), slot = flm_pass_slot(P, t);
        const uint32_t first = L->swa && p >= hp->n_swa ? p - hp->n_swa + 1 : 0;
        const uint8_t *mask = NULL;
        if (P->row_tree) T = P->row_tree[t]; /* a joined row: its own sequence's tree, or none */
        if (T) { /* the context's slots first .. base - 1, then the node's ancestors and itself */
            const uint32_t i = slot - T->base;
            for (uint32_t j = first; j <= slot; j++)
                T->mask[j - first] = j < T->base || T->anc[(size_t)i * T->n_nodes + (j - T->base)];
            mask = T->mask;
        }
        flm_attention(P->k, P->row_kv ? P->row_kv[t] : P->kv, kv_layer, first, slot, q + t * q_dim, hp->n_heads, hp->n_kv_heads, hp->head_dim,
                      hp->attn_scale, P->att, out + t * out_stride, P->n_threads, mask);
    }
}

void flm_pass_ffn_act(const flm_kernels *k, const flm_hparams *hp, size_t count, float *h, const float *u) {
    if (hp->gated)
        k->act(hp->act, h, h, u, count);
    else
        k->act(hp->act, h, u, NULL, count);
}

void flm_pass_ffn_dense(const flm_pass *P, const flm_layer_weights *L, const float *in, size_t in_stride, float *out,
                        size_t out_stride, float *H, float *U) {
    const flm_hparams *hp = P->hp;
    const size_t F = hp->d_ffn, d = hp->d_model;
    if (P->n == 1 && hp->gated) { /* one token: up and gate in one parallel region, x quantized once */
        const flm_matvec_job jobs[2] = {{L->ffn_up.type, L->ffn_up.data, F, U}, {L->ffn_gate.type, L->ffn_gate.data, F, H}};
        flm_matvec_multi_ws(P->k, jobs, 2, d, in, P->n_threads, P->be ? P->be->work : NULL);
        if (L->ffn_up_b.data) add_bias(U, &L->ffn_up_b, (uint32_t)F);
    } else {
        flm_pass_linear(P, &L->ffn_up, L->ffn_up_b.data ? &L->ffn_up_b : NULL, F, d, in, in_stride, U, F);
        if (hp->gated) flm_pass_linear(P, &L->ffn_gate, NULL, F, d, in, in_stride, H, F);
    }
    flm_pass_ffn_act(P->k, hp, (size_t)P->n * F, H, U);
    flm_pass_linear(P, &L->ffn_down, NULL, d, F, H, F, out, out_stride);
}

void flm_pass_residual(const flm_pass *P, float *x, float *y, size_t y_stride, const flm_weight *post) {
    const uint32_t d = P->hp->d_model;
    if (post->data) flm_pass_norm(P, post, NULL, d, y, y_stride, y, y_stride);
    for (uint32_t t = 0; t < P->n; t++) {
        float *xt = x + (size_t)t * d;
        const float *yt = y + t * y_stride;
        for (uint32_t i = 0; i < d; i++) xt[i] += yt[i];
    }
}

/* ---- the pass ---------------------------------------------------------------------------------------------------- */

/* The activations of one pass: the single-token scratch (n = 1) or the batch scratch, token t's row at t * stride. */
typedef struct rows {
    float *x;    /* [n][d_model] residual stream */
    float *h;    /* [n][h_stride] block input (normed), then the attention's output; h_stride =
                    flm_hparams_row: max(d_model, q_dim, d_embd) */
    size_t h_stride;
    float *o;    /* [n][d_model] block output (attention, FFN) */
    float *q, *k, *v; /* [n][q_dim], [n][kv_dim] x 2 */
} rows;

/* x[t] = row token[t] of the embedding (memory or flash: up to FLM_EMBD_READ_ROWS rows in one read, dequantized
 * before the next read; every row is read before anything but the pass's activations changes), scaled by
 * sqrt(d_model) (EMBD_SCALE), projected by proj_in when the model has one (the rows, d_embd floats, are read into H,
 * rows hs apart, then X = proj_in H), plus the learned position row (FLM_POS_LEARNED; read into H).
 * Every step is the backend's (embed_rows, linear, residual). */
static flm_status embed(flm_ctx *ctx, const flm_pass *P, const int32_t *tokens, float *X, float *H, size_t hs,
                        flm_token_stats *tok, flm_error *err) {
    const flm_backend_ops *B = ctx->be.ops;
    const flm_model *m = ctx->model;
    const flm_hparams *hp = &m->hp;
    const uint32_t d = hp->d_model, n = P->n;
    const bool proj = m->proj_in.data != NULL;
    for (uint32_t t = 0; m->pos_embd.data && t < n; t++)
        if (flm_pass_position(P, t) >= m->pos_embd.n_out)
            return flm_fail(err, FLM_ERR_ARG, "position %lld is past the model's %llu learned positions",
                            (long long)flm_pass_position(P, t), (unsigned long long)m->pos_embd.n_out);
    const float scale = hp->arch->flags & FLM_ARCH_EMBD_SCALE ? sqrtf((float)d) : 0.0f;
    float *E = proj ? H : X;
    const size_t es = proj ? hs : d;
    if (m->tok_embd.data) {
        B->embed_rows(P, &m->tok_embd, NULL, tokens, scale, E, es);
    } else {
        flm_pass one = *P;
        one.n = 1;
        const uint64_t rb = ctx->flash->plan.embd_row;
        for (uint32_t t0 = 0; t0 < n;) { /* up to FLM_EMBD_READ_ROWS rows in one reader call */
            const uint32_t k = n - t0 < FLM_EMBD_READ_ROWS ? n - t0 : FLM_EMBD_READ_ROWS;
            const void *rows = NULL;
            flm_status st = flm_flash_embedding(&ctx->ffn_env, tokens + t0, k, &rows, tok, err);
            if (st) return st;
            for (uint32_t t = 0; t < k; t++)
                B->embed_rows(&one, &m->tok_embd, (const uint8_t *)rows + t * rb, NULL, scale, E + (t0 + t) * es, es);
            t0 += k;
        }
    }
    if (proj) B->linear(P, &m->proj_in, NULL, d, hp->d_embd, H, hs, X, d);
    if (m->pos_embd.data) {
        flm_pass one = *P;
        one.n = 1;
        const flm_weight none = {0};
        for (uint32_t t = 0; t < n; t++) {
            const int32_t p = (int32_t)flm_pass_position(P, t);
            B->embed_rows(&one, &m->pos_embd, NULL, &p, 0.0f, H, hs);
            B->residual(&one, X + (size_t)t * d, H, hs, &none);
        }
    }
    return FLM_OK;
}

/* The logits of the n tokens of P (rows of X, d_model floats; changed in place): the output norm when the model has
 * one, proj_out when it has one (into H, rows hs apart), the classifier (+ its bias) into logits (rows of n_vocab;
 * its first `rows` rows: a draft's vocabulary, output_rows) — from memory, or read from flash past the rows the plan
 * keeps (flm_flash_output; its I/O counted in tok, which may be NULL). Errors: a read's. */
static flm_status output(flm_ctx *ctx, const flm_pass *P, float *X, float *H, size_t hs, float *logits, uint32_t rows,
                         flm_token_stats *tok, flm_error *err) {
    const flm_backend_ops *B = ctx->be.ops;
    const flm_model *m = ctx->model;
    const flm_hparams *hp = &m->hp;
    const uint32_t d = hp->d_model;
    if (m->output_norm.data) B->norm(P, &m->output_norm, &m->output_norm_b, d, X, d, X, d);
    const float *in = X;
    size_t stride = d;
    if (m->proj_out.data) {
        B->linear(P, &m->proj_out, NULL, hp->d_embd, d, X, d, H, hs);
        in = H;
        stride = hs;
    }
    if (ctx->flash && ctx->flash->plan.out_flash) return flm_flash_output(ctx, P, in, stride, logits, rows, tok, err);
    B->linear(P, &m->output, &m->output_b, rows, hp->d_embd, in, stride, logits, hp->n_vocab);
    return FLM_OK;
}

/* The FFN block of layer l by the mode's source: the tap sees every token's input first (it only observes); one
 * token goes to compute; a batch to compute_batch, or token by token (a source without one; the select hook, which
 * chooses per token), each at its position. in rows are in_stride apart, out rows d_model. */
static flm_status ffn(flm_ctx *ctx, const flm_eval_req *rq, uint32_t l, uint32_t n, int32_t pos, const float *in,
                      size_t in_stride, float *out, flm_token_stats *tok, flm_error *err) {
    const uint32_t d = ctx->model->hp.d_model;
    const flm_ffn_hooks *H = rq->hooks;
    if (H && H->tap)
        for (uint32_t t = 0; t < n; t++) H->tap(H->tap_user, l, in + t * in_stride);
    flm_ffn_call c = {.layer = l, .n = n, .pos = pos, .in = in, .in_stride = in_stride, .out = out, .out_stride = d,
                      .draft = rq->draft, .hooks = H, .tok = tok};
    if (n == 1) return ctx->ffn->compute(&ctx->ffn_env, &c, err);
    if (ctx->ffn->compute_batch && !(H && H->select)) return ctx->ffn->compute_batch(&ctx->ffn_env, &c, err);
    c.n = 1;
    for (uint32_t t = 0; t < n; t++) {
        c.pos = pos + (int32_t)t;
        c.in = in + t * in_stride;
        c.out = out + (size_t)t * d;
        flm_status st = ctx->ffn->compute(&ctx->ffn_env, &c, err);
        if (st) return st;
    }
    return FLM_OK;
}

/* The output rows a pass computes: all, or for a draft pass the draft vocabulary (flm_params.draft_vocab). */
static uint32_t output_rows(const flm_ctx *ctx, bool draft) {
    const uint32_t V = ctx->model->hp.n_vocab;
    return draft ? flm_draft_vocab_rows(&ctx->params, V) : V;
}

/* Logits of ids >= rows (outside a draft's vocabulary): -inf, rows of V floats. */
static void mask_vocab(float *logits, uint32_t n, uint32_t rows, uint32_t V) {
    if (rows >= V) return;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = rows; i < V; i++) logits[(size_t)t * V + i] = -INFINITY;
}

/* The pass's finite verdict, asked once (flm_backend_ops.verdict): FLM_OK, or the error naming the first non-finite
 * output the backend noted. */
static flm_status verdict(flm_ctx *ctx, flm_error *err) {
    uint32_t l;
    int what;
    if (ctx->be.ops->verdict(&ctx->be, &l, &what)) return FLM_OK;
    return not_finite(ctx, what == FLM_WATCH_ATTENTION ? "attention" : what == FLM_WATCH_FFN ? "FFN" : "output", l,
                      err);
}

/* Watch n rows of V logits, their first `rows` (FLM_WATCH_OUTPUT). */
static void watch_logits(flm_backend *be, const float *logits, uint32_t n, uint32_t rows, uint32_t V) {
    for (uint32_t t = 0; t < n; t++) be->ops->watch(be, logits + (size_t)t * V, rows, UINT32_MAX, FLM_WATCH_OUTPUT);
}

/* The pass over n tokens whose activations are R (n = 1: the single-token scratch; else the batch scratch). Every
 * block is the backend's; each layer's attention and FFN outputs and the logits are watched, and the backend's
 * verdict is asked once, by pass(). */
static flm_status pass_blocks(flm_ctx *ctx, const flm_eval_req *rq, const rows *R, flm_eval_res *res,
                              flm_error *err) {
    const int32_t *tokens = rq->tokens, pos = rq->pos;
    const uint32_t n = rq->n;
    float *logits_all = rq->logits == FLM_LOGITS_ALL ? rq->logits_all : NULL;
    flm_token_stats *tok = &res->stats;
    flm_backend *be = &ctx->be;
    const flm_backend_ops *B = be->ops;
    const flm_model *m = ctx->model;
    const flm_hparams *hp = &m->hp;
    flm_scratch *s = &ctx->s;
    const uint32_t d = hp->d_model, V = hp->n_vocab, q_dim = hp->n_heads * hp->head_dim;
    const bool parallel = hp->arch->flags & FLM_ARCH_PARALLEL;
    const size_t hs = R->h_stride;
    const flm_pass P = {.be = be, .k = ctx->k, .hp = hp, .kv = &be->kv, .n_threads = ctx->params.n_threads, .n = n,
                        .pos = pos, .att = s->att, .tree = rq->tree, .row_kv = rq->row_kv, .row_pos = rq->row_pos,
                        .row_slot = rq->row_slot, .row_tree = rq->row_tree};

    flm_status st = embed(ctx, &P, tokens, R->x, R->h, hs, tok, err);
    if (st) return st;
    /* pre-LN (the default): a block reads norm(x) from R->h; post-LN (norm_after): it reads x itself, and the norm
     * follows the residual add */
    const bool after = hp->norm_after;
    float *in = after ? R->x : R->h;
    const size_t in_stride = after ? d : hs;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const flm_layer_weights *L = &m->layers[l];
        /* attention */
        if (!after) B->norm(&P, &L->attn_norm, &L->attn_norm_b, d, R->x, d, R->h, hs);
        B->qkv(&P, L, in, in_stride, R->q, R->k, R->v);
        B->attention(&P, L, l, R->q, R->k, R->v, R->h, hs);
        B->linear(&P, &L->wo, &L->bo, d, q_dim, R->h, hs, R->o, d);
        B->watch(be, R->o, (size_t)n * d, l, FLM_WATCH_ATTENTION);
        /* FFN: its input from x after the attention's residual, or (parallel) before it */
        const flm_weight *fn = parallel && !L->ffn_norm.data ? &L->attn_norm : &L->ffn_norm;
        const flm_weight *fb = parallel && !L->ffn_norm.data ? &L->attn_norm_b : &L->ffn_norm_b;
        if (parallel) B->norm(&P, fn, fb, d, R->x, d, R->h, hs);
        B->residual(&P, R->x, R->o, d, &L->post_attn_norm);
        if (after) B->norm(&P, &L->attn_norm, &L->attn_norm_b, d, R->x, d, R->x, d);
        else if (!parallel) B->norm(&P, fn, fb, d, R->x, d, R->h, hs);
        if ((st = ffn(ctx, rq, l, n, pos, in, in_stride, R->o, tok, err))) return st;
        if (L->ffn_down_b.data) B->add_bias(&P, R->o, d, &L->ffn_down_b, d);
        B->watch(be, R->o, (size_t)n * d, l, FLM_WATCH_FFN);
        B->residual(&P, R->x, R->o, d, &L->post_ffn_norm);
        if (after) B->norm(&P, fn, fb, d, R->x, d, R->x, d);
    }
    /* logits: every token's (a batch), or the last one's; none for a prompt piece before the last (never read),
     * none for hidden states: the final states stay in R->x (flm_tree_logits) */
    if (rq->logits == FLM_LOGITS_HIDDEN) {
        res->hidden = R->x;
        return FLM_OK;
    }
    if (rq->logits == FLM_LOGITS_NONE) return FLM_OK;
    const uint32_t rows = output_rows(ctx, rq->draft);
    if (logits_all && n > 1) {
        if ((st = output(ctx, &P, R->x, R->h, hs, logits_all, rows, tok, err))) return st;
        watch_logits(be, logits_all, n, rows, V);
        mask_vocab(logits_all, n, rows, V);
        B->read(be, s->logits, logits_all + (size_t)(n - 1) * V, V * sizeof(float));
    } else {
        flm_pass last = P;
        last.n = 1;
        if ((st = output(ctx, &last, R->x + (size_t)(n - 1) * d, R->h, hs, s->logits, rows, tok, err))) return st;
        watch_logits(be, s->logits, 1, rows, V);
        mask_vocab(s->logits, 1, rows, V);
        if (logits_all) B->read(be, logits_all, s->logits, V * sizeof(float));
    }
    res->logits = s->logits;
    return FLM_OK;
}

/* pass_blocks, then the backend's verdict once (also after an error: it clears the pass's notes) */
static flm_status pass(flm_ctx *ctx, const flm_eval_req *rq, const rows *R, flm_eval_res *res, flm_error *err) {
    flm_status st = pass_blocks(ctx, rq, R, res, err);
    if (st) {
        uint32_t l;
        int what;
        ctx->be.ops->verdict(&ctx->be, &l, &what);
        return st;
    }
    return verdict(ctx, err);
}

flm_status flm_output_rows(flm_ctx *ctx, const float *const *x, uint32_t n, float *logits, flm_error *err) {
    return flm_output_rows_ex(ctx, x, n, false, logits, NULL, err);
}

flm_status flm_output_rows_ex(flm_ctx *ctx, const float *const *x, uint32_t n, bool draft, float *logits,
                              flm_token_stats *tok, flm_error *err) {
    const flm_model *m = ctx->model;
    const flm_hparams *hp = &m->hp;
    flm_backend *be = &ctx->be;
    const flm_pass P = {.be = be, .k = ctx->k, .hp = hp, .kv = &be->kv, .n_threads = ctx->params.n_threads, .n = n};
    if (n > FLM_OUTPUT_ROWS_MAX(ctx->s.n_batch))
        return flm_fail(err, FLM_ERR_ARG, "output layer of %u rows: more than the %u planned", n,
                        FLM_OUTPUT_ROWS_MAX(ctx->s.n_batch));
    float *buf = ctx->s.out_rows; /* carved at open */
    for (uint32_t i = 0; i < n; i++) memcpy(buf + (size_t)i * hp->d_model, x[i], hp->d_model * sizeof(float));
    const uint32_t rows = output_rows(ctx, draft);
    flm_status st = output(ctx, &P, buf, buf + (size_t)n * hp->d_model, hp->d_embd, logits, rows, tok, err);
    if (st) {
        uint32_t l;
        int what;
        be->ops->verdict(be, &l, &what); /* clears the pass's notes */
        return st;
    }
    watch_logits(be, logits, n, rows, hp->n_vocab);
    mask_vocab(logits, n, rows, hp->n_vocab);
    return verdict(ctx, err);
}

flm_status flm_output_scatter(flm_ctx *ctx, const float *const *x, uint32_t n, bool draft, float *const *dst,
                              float *scratch, size_t cap, flm_token_stats *tok, flm_error *err) {
    const flm_model *m = ctx->model;
    const flm_hparams *hp = &m->hp;
    const uint32_t V = hp->n_vocab, d = hp->d_model;
    if (n == 0) return FLM_OK;
    if (n > FLM_OUTPUT_ROWS_MAX(ctx->s.n_batch) || cap < V)
        return flm_fail(err, FLM_ERR_ARG, "output layer of %u rows into %zu floats of scratch: more than the %u rows "
                        "planned, or less than one row of %u logits", n, cap, FLM_OUTPUT_ROWS_MAX(ctx->s.n_batch), V);
    const uint32_t rows = output_rows(ctx, draft);
    uint64_t blk = cap / n;
    blk -= blk % 64;
    if (blk >= rows || blk < 256 || (ctx->flash && ctx->flash->plan.out_flash) || !m->output.data) {
        /* whole rows, as many at once as the scratch holds */
        const uint32_t per = (uint32_t)(cap / V);
        for (uint32_t i = 0; i < n; i += per) {
            const uint32_t k = n - i < per ? n - i : per;
            flm_status st = flm_output_rows_ex(ctx, x + i, k, draft, scratch, tok, err);
            if (st) return st;
            for (uint32_t j = 0; j < k; j++) memcpy(dst[i + j], scratch + (size_t)j * V, (size_t)V * sizeof(float));
        }
        return FLM_OK;
    }
    /* the classifier in blocks of blk of its rows, every token's row of a block at once (each weight read once),
     * each block's logits copied to the tokens' own rows: the same dots as output()'s, in the same kernels */
    flm_backend *be = &ctx->be;
    const flm_backend_ops *B = be->ops;
    const flm_pass P = {.be = be, .k = ctx->k, .hp = hp, .kv = &be->kv, .n_threads = ctx->params.n_threads, .n = n};
    float *X = ctx->s.out_rows, *H = X + (size_t)n * d; /* carved at open: [n][d_model + d_embd] */
    for (uint32_t i = 0; i < n; i++) memcpy(X + (size_t)i * d, x[i], d * sizeof(float));
    if (m->output_norm.data) B->norm(&P, &m->output_norm, &m->output_norm_b, d, X, d, X, d);
    const float *in = X;
    size_t stride = d;
    if (m->proj_out.data) {
        B->linear(&P, &m->proj_out, NULL, hp->d_embd, d, X, d, H, hp->d_embd);
        in = H;
        stride = hp->d_embd;
    }
    const size_t row_bytes = flm_row_bytes(m->output.type, m->output.n_in);
    for (uint32_t i0 = 0; i0 < rows; i0 += (uint32_t)blk) {
        const uint32_t nb = rows - i0 < blk ? rows - i0 : (uint32_t)blk;
        flm_weight w = m->output, b = m->output_b;
        w.n_out = nb;
        w.data = (const char *)m->output.data + (size_t)i0 * row_bytes;
        if (b.data) {
            b.n_out = nb;
            b.data = (const float *)b.data + i0;
        }
        B->linear(&P, &w, &b, nb, hp->d_embd, in, stride, scratch, nb);
        for (uint32_t t = 0; t < n; t++) memcpy(dst[t] + i0, scratch + (size_t)t * nb, (size_t)nb * sizeof(float));
    }
    for (uint32_t t = 0; t < n; t++) {
        watch_logits(be, dst[t], 1, rows, V);
        mask_vocab(dst[t], 1, rows, V);
    }
    return verdict(ctx, err);
}

flm_status flm_output_row(flm_ctx *ctx, const float *x, float *logits, flm_error *err) {
    return flm_output_rows(ctx, &x, 1, logits, err);
}

static flm_status forward_passes(flm_ctx *ctx, const flm_eval_req *rq, flm_eval_res *res, flm_error *err) {
    const flm_hparams *hp = &ctx->model->hp;
    flm_scratch *s = &ctx->s;
    const uint32_t V = hp->n_vocab, n = rq->n;
    const size_t hs = (size_t)flm_hparams_row(hp);
    if (n == 1 || s->n_batch < n) { /* one token (decoding), or more than the batch arrays hold: token by token */
        if (n > 1 && rq->logits == FLM_LOGITS_HIDDEN)
            return flm_fail(err, FLM_ERR_ARG, "hidden states of %u tokens: more than one batch holds (%u)", n,
                            s->n_batch);
        const rows one = {.x = s->x, .h = s->xb, .h_stride = hs, .o = s->xb2, .q = s->q, .k = s->k, .v = s->v};
        for (uint32_t i = 0; i < n; i++) {
            flm_eval_req t = *rq;
            t.tokens = rq->tokens + i;
            t.n = 1;
            t.pos = rq->pos + (int32_t)i;
            if (rq->logits == FLM_LOGITS_ALL) t.logits_all = rq->logits_all + (size_t)i * V;
            else if (rq->logits == FLM_LOGITS_LAST && i + 1 < n) t.logits = FLM_LOGITS_NONE; /* only the last's */
            flm_status st = pass(ctx, &t, &one, res, err);
            if (st) return st;
        }
        return FLM_OK;
    }
    const rows batch = {.x = s->bx, .h = s->bxb, .h_stride = hs, .o = s->bxb2, .q = s->bq, .k = s->bk, .v = s->bv};
    return pass(ctx, rq, &batch, res, err);
}

flm_status flm_forward(flm_ctx *ctx, const flm_eval_req *rq, flm_eval_res *res, flm_error *err) {
    /* the call's compute time: its wall time less the I/O and memory-management times its passes added */
    const double t0 = flm_now_ms(), io0 = res->stats.io_ms, mem0 = res->stats.mem_ms;
    const flm_status st = forward_passes(ctx, rq, res, err);
    res->stats.compute_ms += flm_now_ms() - t0 - (res->stats.io_ms - io0) - (res->stats.mem_ms - mem0);
    return st;
}
