/* ffn_ram.c — the FFN sources that hold every weight in memory (runtime/ffn_source.h):
 *   mapped  a GGUF's up/gate/down matrices, mapped with the file: three dense matvecs per layer
 *   ram     a .flm file's FFN regions, all read once at open: the bundle FFN over each layer's records */
#include "compute/act.h"
#include "core/util.h"
#include "runtime/pass.h"
#include "runtime/runtime.h"

/* ---- mapped (GGUF) ---------------------------------------------------------------------------------------------- */

static flm_status mapped_open(flm_ctx *ctx, flm_error *err) { return FLM_OK; } /* the model holds the mapping */

static flm_status mapped_compute(flm_ctx *ctx, uint32_t l, const float *in, float *out, flm_token_stats *tok,
                                 flm_error *err) {
    const flm_pass P = {.k = ctx->k, .hp = &ctx->model->hp, .n_threads = ctx->params.n_threads, .n = 1};
    flm_pass_ffn_dense(&P, &ctx->model->layers[l], in, ctx->model->hp.d_model, out, ctx->model->hp.d_model,
                       ctx->s.hb, ctx->s.hb2);
    return FLM_OK;
}

/* the batch: up and gate as matrix-matrix products into [n][d_ffn], the activation, then down */
static flm_status mapped_compute_batch(flm_ctx *ctx, uint32_t l, uint32_t n, const float *in, size_t in_stride,
                                       float *out, size_t out_stride, flm_token_stats *tok, flm_error *err) {
    const flm_pass P = {.k = ctx->k, .hp = &ctx->model->hp, .n_threads = ctx->params.n_threads, .n = n};
    flm_pass_ffn_dense(&P, &ctx->model->layers[l], in, in_stride, out, out_stride, ctx->s.bh, ctx->s.bh2);
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
        if (n == FLM_SELECT_ALL && h) return FLM_OK; /* every neuron: out is the dense FFN computed above */
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
    case FLM_MODE_HOT: return &flm_ffn_hot;
    default: return NULL;
    }
}
