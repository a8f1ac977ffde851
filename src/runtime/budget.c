/* budget.c — planning memory under --mem (docs/ARCHITECTURE.md, "Memory budget"). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "runtime/runtime.h"
#include "core/error.h"
#include "core/util.h"


void flm_ffn_region_bytes(const flm_file *f, uint64_t *total, uint64_t *largest) {
    *total = *largest = 0;
    for (uint32_t l = 0; l < f->n_layers; l++) {
        uint64_t b = flm_align_up(f->ffn[l]->size, FLM_ALIGN);
        *total += b;
        if (b > *largest) *largest = b;
    }
}

uint64_t flm_mem_plan_total(const flm_mem_plan *p) {
    return p->resident + p->kv + p->scratch + p->reader + p->stream + p->ffn_resident + p->predictors + p->cache;
}

double flm_mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

flm_status flm_budget_plan(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, int n_threads, flm_mode mode,
                           uint64_t budget, double percent, flm_mem_plan *p, flm_error *err) {
    memset(p, 0, sizeof *p);
    p->resident = f->resident->size;
    uint64_t ffn_total, max_layer;
    flm_ffn_region_bytes(f, &ffn_total, &max_layer);
    p->model_bytes = p->resident + ffn_total; /* FFN counted with its 4 KiB padding */
    if (!budget && percent > 0) budget = (uint64_t)((double)p->model_bytes * percent / 100.0);
    p->budget = budget;
    p->kv = flm_kv_cache_bytes(hp->n_layers, n_ctx, hp->n_kv_heads * hp->head_dim);
    /* activations, per-thread FFN accumulators, and the tokenizer's copies (~ pieces twice + hash + entries) */
    p->scratch = flm_scratch_bytes(hp, n_ctx) + 4ull * (uint64_t)n_threads * hp->d_model + (uint64_t)hp->n_vocab * 96;
    /* reader bounce buffers: 1/16 of the budget, between 32 KiB and 8 MiB, plus its plan arrays and ring (~32 KiB;
     * flm_flash_open replaces the estimate with flm_reader_memory() once the reader exists) */
    uint64_t bounce = budget ? budget / 16 : (8u << 20);
    if (bounce < (32u << 10)) bounce = 32u << 10;
    if (bounce > (8u << 20)) bounce = 8u << 20;
    bounce = bounce / FLM_ALIGN * FLM_ALIGN;
    p->reader_bounce = (size_t)bounce;
    p->reader = bounce + (32u << 10);
    uint64_t fixed = p->resident + p->kv + p->scratch + p->reader;
    bool chosen = mode == FLM_MODE_AUTO; /* auto may fall back from sparse to hybrid below */
    if (mode == FLM_MODE_AUTO)
        mode = (!budget || fixed + ffn_total <= budget) ? FLM_MODE_RAM
               : f->predictor                         ? FLM_MODE_SPARSE
                                                      : FLM_MODE_HYBRID;
    p->mode = mode;
    const flm_ffn_source_ops *src = flm_ffn_source_of(mode);
    if (!src) return flm_fail(err, FLM_ERR_ARG, "%s: unknown mode %d", f->path, (int)mode);
    flm_status st = src->plan(f, hp, n_ctx, p, err);
    if (st == FLM_ERR_BUDGET && chosen && mode == FLM_MODE_SPARSE) /* auto: the layer-streaming mode may still fit */
        return flm_budget_plan(f, hp, n_ctx, n_threads, FLM_MODE_HYBRID, budget, 0, p, err);
    if (st || mode == FLM_MODE_SPARSE) return st; /* runtime/sparse.c sizes the caches from p->cache and checks them */
    if (budget && flm_mem_plan_total(p) > budget) {
        return flm_fail(err, FLM_ERR_BUDGET,
                        "%s: a memory budget of %s is too small for mode %s: resident weights %.2f MiB + KV cache "
                        "%.2f MiB (-c %u) + scratch %.2f MiB + reader %.2f MiB + FFN %s %.2f MiB = %.2f MiB "
                        "(the whole model is %.2f MiB)",
                        f->path, flm_size(budget).s, flm_mode_name(mode), flm_mib(p->resident), flm_mib(p->kv), n_ctx, flm_mib(p->scratch),
                        flm_mib(p->reader), mode == FLM_MODE_RAM ? "(all layers)" : "(one streamed layer)",
                        flm_mib(p->stream + p->ffn_resident), flm_mib(flm_mem_plan_total(p)), flm_mib(p->model_bytes));
    }
    return FLM_OK;
}
