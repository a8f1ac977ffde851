/* ffn_ram.c — the FFN sources that hold every weight in memory (runtime/ffn_source.h):
 *   mapped  a GGUF's up/gate/down matrices, mapped with the file: three dense matvecs per layer
 *   ram     a .flm file's FFN regions, all read once at open: the bundle FFN over each layer's records */
#include "compute/act.h"
#include "core/util.h"
#include "runtime/runtime.h"

void flm_ffn_dense(const flm_kernels *k, const flm_hparams *hp, const flm_weight *up, const flm_weight *gate,
                   const flm_weight *down, const float *in, float *out, float *hb, float *hb2, int n_threads) {
    flm_matvec(k, up->type, up->data, hp->d_ffn, hp->d_model, in, hb2, n_threads);
    if (hp->gated) {
        flm_matvec(k, gate->type, gate->data, hp->d_ffn, hp->d_model, in, hb, n_threads);
        for (uint32_t i = 0; i < hp->d_ffn; i++) hb[i] = flm_act_eval(hp->act, hb[i]) * hb2[i];
    } else {
        for (uint32_t i = 0; i < hp->d_ffn; i++) hb[i] = flm_act_eval(hp->act, hb2[i]);
    }
    flm_matvec(k, down->type, down->data, hp->d_model, hp->d_ffn, hb, out, n_threads);
}

/* ---- mapped (GGUF) ---------------------------------------------------------------------------------------------- */

static flm_status mapped_open(flm_ctx *ctx, flm_error *err) { return FLM_OK; } /* the model holds the mapping */

static flm_status mapped_compute(flm_ctx *ctx, uint32_t l, const float *in, float *out, flm_token_stats *tok,
                                 flm_error *err) {
    const flm_layer_weights *L = &ctx->model->layers[l];
    flm_ffn_dense(ctx->k, &ctx->model->hp, &L->ffn_up, &L->ffn_gate, &L->ffn_down, in, out, ctx->s.hb, ctx->s.hb2,
                  ctx->params.n_threads);
    return FLM_OK;
}

/* the batch: up and gate as matrix-matrix products into [n][d_ffn], the activation, then down */
static flm_status mapped_compute_batch(flm_ctx *ctx, uint32_t l, uint32_t n, const float *in, size_t in_stride,
                                       float *out, size_t out_stride, flm_token_stats *tok, flm_error *err) {
    const flm_layer_weights *L = &ctx->model->layers[l];
    const flm_hparams *hp = &ctx->model->hp;
    const flm_kernels *k = ctx->k;
    const int nt = ctx->params.n_threads;
    const size_t F = hp->d_ffn;
    float *H = ctx->s.bh, *U = ctx->s.bh2;
    flm_matmat(k, L->ffn_up.type, L->ffn_up.data, F, hp->d_model, in, in_stride, n, U, F, nt);
    if (hp->gated) {
        flm_matmat(k, L->ffn_gate.type, L->ffn_gate.data, F, hp->d_model, in, in_stride, n, H, F, nt);
        for (size_t i = 0; i < (size_t)n * F; i++) H[i] = flm_act_eval(hp->act, H[i]) * U[i];
    } else {
        for (size_t i = 0; i < (size_t)n * F; i++) H[i] = flm_act_eval(hp->act, U[i]);
    }
    flm_matmat(k, L->ffn_down.type, L->ffn_down.data, hp->d_model, F, H, F, n, out, out_stride, nt);
    return FLM_OK;
}

static void no_state_close(flm_ctx *ctx) { ctx->ffn_state = NULL; }

const flm_ffn_source_ops flm_ffn_mapped = {"ram", NULL, mapped_open, mapped_compute, no_state_close,
                                           mapped_compute_batch};

/* ---- ram (.flm) ------------------------------------------------------------------------------------------------- */

/* Every FFN region stays in memory. */
static flm_status ram_plan(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, flm_mem_plan *p, flm_error *err) {
    uint64_t total, largest;
    flm_ffn_region_bytes(f, &total, &largest);
    p->n_resident_layers = f->n_layers;
    p->ffn_resident = total;
    return FLM_OK;
}

static flm_status ram_open(flm_ctx *ctx, flm_error *err) {
    return flm_flash_load_layers(ctx, ctx->flash->plan.n_resident_layers, err);
}

static flm_status ram_compute(flm_ctx *ctx, uint32_t l, const float *in, float *out, flm_token_stats *tok,
                              flm_error *err) {
    if (ctx->ffn_select) { /* analysis: the FFN over the neurons the hook picks */
        const float *h = NULL;
        if (ctx->select_need_h) {
            flm_flash_bundles(ctx, l, ctx->flash->layer_data[l], in, out);
            h = ctx->s.hb;
        }
        uint32_t n = ctx->ffn_select(ctx->select_user, l, in, h, ctx->select_ids);
        flm_ffn_bundles(ctx->k, &ctx->flash->desc[l], ctx->flash->layer_data[l], ctx->select_ids, n, in, out,
                        ctx->s.hb2, ctx->flash->acc, ctx->params.n_threads);
        return FLM_OK;
    }
    flm_flash_bundles(ctx, l, ctx->flash->layer_data[l], in, out);
    return FLM_OK;
}

static flm_status ram_compute_batch(flm_ctx *ctx, uint32_t l, uint32_t n, const float *in, size_t in_stride,
                                    float *out, size_t out_stride, flm_token_stats *tok, flm_error *err) {
    flm_flash_bundles_batch(ctx, l, ctx->flash->layer_data[l], n, in, in_stride, out, out_stride);
    return FLM_OK;
}

/* the layers' records belong to ctx->flash (calibrate reads them): flm_flash_close frees them */
const flm_ffn_source_ops flm_ffn_ram = {"ram", ram_plan, ram_open, ram_compute, no_state_close, ram_compute_batch};

const flm_ffn_source_ops *flm_ffn_source_of(flm_mode mode) {
    switch (mode) {
    case FLM_MODE_RAM: return &flm_ffn_ram;
    case FLM_MODE_NAIVE: return &flm_ffn_naive;
    case FLM_MODE_HYBRID: return &flm_ffn_hybrid;
    case FLM_MODE_SPARSE: return &flm_ffn_sparse;
    default: return NULL;
    }
}
