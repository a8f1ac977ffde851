/* ffn_ram.c — the FFN sources that hold every weight in memory (runtime/ffn_source.h):
 *   mapped  a GGUF's up/gate/down matrices, mapped with the file: three dense matvecs per layer
 *   ram     a .flm file's FFN regions, all read once at open: the bundle FFN over each layer's records */
#include "compute/act.h"
#include "core/util.h"
#include "runtime/hooks.h"
#include "runtime/pass.h"
#include "runtime/runtime.h"

/* ---- mapped (GGUF) ---------------------------------------------------------------------------------------------- */

static flm_status mapped_open(flm_ffn_env *E, flm_error *err) { return FLM_OK; } /* the model holds the mapping */

/* one token: up and gate (matvecs), the activation, then down; a batch: the same as matrix-matrix products into
 * [n][d_ffn] */
static flm_status mapped_compute(flm_ffn_env *E, const flm_ffn_call *c, flm_error *err) {
    const flm_pass P = {.be = E->be, .k = E->k, .hp = &E->model->hp, .n_threads = E->params->n_threads, .n = c->n};
    const bool one = c->n == 1;
    E->be->ops->ffn_dense(&P, &E->model->layers[c->layer], c->in, c->in_stride, c->out, c->out_stride,
                       one ? E->s->hb : E->s->bh, one ? E->s->hb2 : E->s->bh2);
    return FLM_OK;
}

static void no_state_close(flm_ffn_env *E) { E->state = NULL; }

const flm_ffn_source_ops flm_ffn_mapped = {"ram", NULL, mapped_open, mapped_compute, no_state_close, mapped_compute};

/* ---- ram (.flm) ------------------------------------------------------------------------------------------------- */

/* Every FFN region stays in memory. */
static flm_status ram_plan(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, flm_mem_plan *p, flm_error *err) {
    uint64_t total, largest;
    flm_ffn_region_bytes(f, &total, &largest);
    p->n_resident_layers = f->n_layers;
    p->ffn_resident = total;
    return FLM_OK;
}

static flm_status ram_open(flm_ffn_env *E, flm_error *err) {
    return flm_flash_load_layers(E, E->flash->plan.n_resident_layers, err);
}

static flm_status ram_compute(flm_ffn_env *E, const flm_ffn_call *c, flm_error *err) {
    const uint32_t l = c->layer;
    const flm_ffn_hooks *H = c->hooks;
    if (H && H->select) { /* analysis: the FFN over the neurons the hook picks */
        const float *h = NULL;
        if (H->need_h) {
            flm_flash_bundles(E, l, E->flash->layer_data[l], c->in, c->out);
            h = E->s->hb;
        }
        uint32_t n = H->select(H->select_user, l, c->pos, c->in, h, H->ids);
        if (n == FLM_SELECT_ALL && h) return FLM_OK; /* every neuron: out is the dense FFN computed above */
        E->be->ops->bundles(E->be, &E->flash->desc[l], E->flash->layer_data[l], H->ids, n, c->in, c->out,
                            E->s->hb2, E->flash->acc);
        return FLM_OK;
    }
    flm_flash_bundles(E, l, E->flash->layer_data[l], c->in, c->out);
    return FLM_OK;
}

static flm_status ram_compute_batch(flm_ffn_env *E, const flm_ffn_call *c, flm_error *err) {
    flm_flash_bundles_batch(E, c->layer, E->flash->layer_data[c->layer], c->n, c->in, c->in_stride, c->out,
                            c->out_stride);
    return FLM_OK;
}

/* the layers' records belong to E->flash (calibrate reads them): flm_flash_close frees them */
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
