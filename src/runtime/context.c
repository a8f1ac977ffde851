/* context.c — opening a model into an flm_ctx; the public API's entry points. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "util/error.h"

void flm_params_default(flm_params *p) {
    memset(p, 0, sizeof *p);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    p->n_threads = n > 0 ? (int)n : 1;
    p->n_ctx = 0;
}

uint64_t flm_scratch_bytes(const flm_hparams *hp, uint32_t n_ctx) {
    uint64_t q_dim = (uint64_t)hp->n_heads * hp->head_dim;
    uint64_t xb = q_dim > hp->d_model ? q_dim : hp->d_model;
    return 4 * ((uint64_t)hp->d_model * 2 + xb + 2ull * hp->d_ffn + q_dim + (uint64_t)hp->n_heads * n_ctx +
                hp->n_vocab);
}

flm_status flm_scratch_init(flm_scratch *s, const flm_hparams *hp, uint32_t n_ctx, flm_error *err) {
    size_t q_dim = (size_t)hp->n_heads * hp->head_dim;
    size_t xb = q_dim > hp->d_model ? q_dim : hp->d_model;
    memset(s, 0, sizeof *s);
    s->x = calloc(hp->d_model, sizeof(float));
    s->xb = calloc(xb, sizeof(float));
    s->xb2 = calloc(hp->d_model, sizeof(float));
    s->hb = calloc(hp->d_ffn, sizeof(float));
    s->hb2 = calloc(hp->d_ffn, sizeof(float));
    s->q = calloc(q_dim, sizeof(float));
    s->att = calloc((size_t)hp->n_heads * n_ctx, sizeof(float));
    s->logits = calloc(hp->n_vocab, sizeof(float));
    if (!s->x || !s->xb || !s->xb2 || !s->hb || !s->hb2 || !s->q || !s->att || !s->logits) {
        flm_scratch_free(s);
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory for activations");
    }
    return FLM_OK;
}

void flm_scratch_free(flm_scratch *s) {
    free(s->x); free(s->xb); free(s->xb2); free(s->hb); free(s->hb2); free(s->q); free(s->att); free(s->logits);
    memset(s, 0, sizeof *s);
}

flm_status flm_open(const char *path, const flm_params *p, flm_ctx **out, flm_error *err) {
    *out = NULL;
    flm_params def;
    if (!p) { flm_params_default(&def); p = &def; }
    if (p->n_threads < 1 || p->n_threads > 1024 || p->n_ctx < 0)
        return flm_fail(err, FLM_ERR_ARG, "bad parameters: threads %d (1..1024), context %d", p->n_threads, p->n_ctx);
    gguf_file *f = NULL;
    flm_status st = gguf_open(path, &f, err);
    if (st) return st;
    flm_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) { gguf_close(f); return flm_fail(err, FLM_ERR_NOMEM, "out of memory"); }
    ctx->params = *p;
    if ((st = flm_model_from_gguf(f, &ctx->model, err))) { free(ctx); return st; }
    const flm_hparams *hp = &ctx->model->hp;
    uint32_t n_ctx = (uint32_t)p->n_ctx;
    if (n_ctx == 0) n_ctx = hp->n_ctx_train < 2048 ? hp->n_ctx_train : 2048;
    if (n_ctx == 0) n_ctx = 512;
    ctx->params.n_ctx = (int)n_ctx;
    ctx->k = flm_kernels_best();
    if ((st = flm_kv_cache_init(&ctx->kv, hp->n_layers, n_ctx, hp->n_kv_heads * hp->head_dim, err)) ||
        (st = flm_scratch_init(&ctx->s, hp, n_ctx, err))) {
        flm_close(ctx);
        return st;
    }
    *out = ctx;
    return FLM_OK;
}

void flm_close(flm_ctx *ctx) {
    if (!ctx) return;
    flm_scratch_free(&ctx->s);
    flm_kv_cache_free(&ctx->kv);
    flm_model_free(ctx->model);
    free(ctx);
}

flm_status flm_eval(flm_ctx *ctx, int32_t token, int32_t pos, const float **logits, flm_error *err) {
    const flm_hparams *hp = &ctx->model->hp;
    if (token < 0 || (uint32_t)token >= hp->n_vocab)
        return flm_fail(err, FLM_ERR_ARG, "token id %d out of range [0, %u)", token, hp->n_vocab);
    if (pos < 0 || pos >= ctx->params.n_ctx)
        return flm_fail(err, FLM_ERR_ARG, "position %d is outside the context of %d tokens (raise -c)", pos,
                        ctx->params.n_ctx);
    if (pos != 0 && pos != ctx->next_pos)
        return flm_fail(err, FLM_ERR_ARG, "position %d out of order (expected %d or 0)", pos, ctx->next_pos);
    flm_status st = flm_forward(ctx, token, pos, err);
    if (st) return st;
    ctx->next_pos = pos + 1;
    *logits = ctx->s.logits;
    return FLM_OK;
}

void flm_get_info(const flm_ctx *ctx, flm_model_info *info) {
    const flm_hparams *hp = &ctx->model->hp;
    info->arch = ctx->model->arch;
    info->d_model = hp->d_model;
    info->d_ffn = hp->d_ffn;
    info->n_layers = hp->n_layers;
    info->n_heads = hp->n_heads;
    info->n_kv_heads = hp->n_kv_heads;
    info->head_dim = hp->head_dim;
    info->n_vocab = hp->n_vocab;
    info->n_ctx_train = hp->n_ctx_train;
    info->n_ctx = (uint32_t)ctx->params.n_ctx;
    info->norm_eps = hp->norm_eps;
    info->rope_theta = hp->rope_theta;
    info->bos = flm_tokenizer_bos(ctx->model->tok);
    info->eos = flm_tokenizer_eos(ctx->model->tok);
    info->kernels = ctx->k->name;
}

size_t flm_tokenize(const flm_ctx *ctx, const char *text, bool add_bos, int32_t *ids, size_t cap) {
    return flm_tokenizer_encode(ctx->model->tok, text, add_bos, ids, cap);
}

const char *flm_token_piece(const flm_ctx *ctx, int32_t prev, int32_t id, size_t *len) {
    return flm_tokenizer_piece(ctx->model->tok, prev, id, len);
}
