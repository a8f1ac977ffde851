/* budget.c — planning memory under --mem (docs/ARCHITECTURE.md, "Memory budget"). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "runtime/runtime.h"
#include "core/error.h"
#include "core/util.h"


uint64_t flm_mem_plan_total(const flm_mem_plan *p) {
    return p->resident + p->kv + p->scratch + p->reader + p->stream + p->ffn_resident + p->predictors + p->cache;
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

flm_status flm_budget_plan(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, int n_threads, flm_mode mode,
                           uint64_t budget, double percent, flm_mem_plan *p, flm_error *err) {
    memset(p, 0, sizeof *p);
    p->resident = f->resident->size;
    uint64_t ffn_total = 0, max_layer = 0;
    for (uint32_t l = 0; l < f->n_layers; l++) {
        uint64_t b = flm_align_up(f->ffn[l]->size, FLM_ALIGN);
        ffn_total += b;
        if (b > max_layer) max_layer = b;
    }
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
    uint64_t avail = budget > fixed ? budget - fixed : 0;
    bool chosen = mode == FLM_MODE_AUTO; /* auto may fall back from sparse to hybrid below */
    if (mode == FLM_MODE_AUTO)
        mode = (!budget || fixed + ffn_total <= budget) ? FLM_MODE_RAM
               : f->predictor                         ? FLM_MODE_SPARSE
                                                      : FLM_MODE_HYBRID;
    p->mode = mode;
    if (mode == FLM_MODE_SPARSE) {
        if (!f->predictor)
            return flm_fail(err, FLM_ERR_ARG, "%s: --mode sparse needs predictors: run `flashlm calibrate %s --text "
                            "FILE` first", f->path, f->path);
        /* held at half precision (runtime/sparse.c): about half the stored f32 region, plus the f32 biases */
        p->predictors = f->predictor->size / 2 + 2ull * hp->d_ffn * f->n_layers + FLM_ALIGN;
        uint64_t used = fixed + p->predictors;
        p->cache = budget > used ? budget - used : 0;
        if (!budget) p->cache = ffn_total + (uint64_t)f->n_layers * (16u << 10); /* no budget: room for every neuron */
        bool fits = !budget || (p->cache > 0 && 2 * f->predictor->size <= p->cache + p->predictors);
        if (!fits && chosen) /* auto: the layer-streaming mode may still fit */
            return flm_budget_plan(f, hp, n_ctx, n_threads, FLM_MODE_HYBRID, budget, 0, p, err);
        if (budget && p->cache == 0)
            return flm_fail(err, FLM_ERR_BUDGET,
                            "%s: a memory budget of %.2f MiB leaves nothing for the neuron cache: resident weights "
                            "%.2f MiB + KV cache %.2f MiB (-c %u) + scratch %.2f MiB + reader %.2f MiB + predictors "
                            "%.2f MiB = %.2f MiB", f->path, mib(budget), mib(p->resident), mib(p->kv), n_ctx,
                            mib(p->scratch), mib(p->reader), mib(p->predictors), mib(used));
        /* at open the stored (f32) region is read and parsed before it is halved and before any cache exists: that
         * transient 2 x region must fit in what the predictors and caches will hold afterwards */
        if (budget && 2 * f->predictor->size > p->cache + p->predictors)
            return flm_fail(err, FLM_ERR_BUDGET,
                            "%s: a memory budget of %.2f MiB leaves %.2f MiB for predictors and neuron caches, less than "
                            "the %.2f MiB needed to load the predictors; raise --mem", f->path, mib(budget),
                            mib(p->cache + p->predictors), mib(2 * f->predictor->size));
        return FLM_OK; /* runtime/sparse.c sizes the caches from p->cache and checks them */
    }
    if (mode == FLM_MODE_RAM) {
        p->n_resident_layers = f->n_layers;
        p->ffn_resident = ffn_total;
    } else if (mode == FLM_MODE_NAIVE) {
        p->stream = max_layer;
    } else { /* hybrid: the first layers that fit next to one streaming buffer */
        p->stream = max_layer;
        uint64_t used = 0;
        uint32_t n = 0;
        while (n < f->n_layers && used + flm_align_up(f->ffn[n]->size, FLM_ALIGN) + (n + 1 < f->n_layers ? max_layer : 0) <= avail) {
            used += flm_align_up(f->ffn[n]->size, FLM_ALIGN);
            n++;
        }
        p->n_resident_layers = n;
        p->ffn_resident = used;
        if (n == f->n_layers) p->stream = 0;
    }
    if (budget && flm_mem_plan_total(p) > budget) {
        return flm_fail(err, FLM_ERR_BUDGET,
                        "%s: a memory budget of %.2f MiB is too small for mode %s: resident weights %.2f MiB + KV cache "
                        "%.2f MiB (-c %u) + scratch %.2f MiB + reader %.2f MiB + FFN %s %.2f MiB = %.2f MiB "
                        "(the whole model is %.2f MiB)",
                        f->path, mib(budget), flm_mode_name(mode), mib(p->resident), mib(p->kv), n_ctx, mib(p->scratch),
                        mib(p->reader), mode == FLM_MODE_RAM ? "(all layers)" : "(one streamed layer)",
                        mib(p->stream + p->ffn_resident), mib(flm_mem_plan_total(p)), mib(p->model_bytes));
    }
    return FLM_OK;
}
