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

uint32_t flm_kv_elem_bytes(const flm_params *p) { return p->kv_f32 ? FLM_KV_F32 : FLM_KV_F16; }

flm_status flm_budget_plan(const flm_file *f, const flm_hparams *hp, const flm_plan_request *rq, flm_mem_plan *p,
                           flm_error *err) {
    memset(p, 0, sizeof *p);
    const uint64_t region = f->resident->size;
    uint64_t budget = rq->budget;
    p->resident = region;
    uint64_t ffn_total, max_layer;
    flm_ffn_region_bytes(f, &ffn_total, &max_layer);
    p->model_bytes = region + ffn_total; /* FFN counted with its 4 KiB padding */
    if (!budget && rq->percent > 0) budget = (uint64_t)((double)p->model_bytes * rq->percent / 100.0);
    p->budget = budget;
    p->n_ctx = rq->n_ctx;
    p->kv_elem_bytes = rq->kv_elem_bytes;
    p->kv = flm_kv_cache_bytes(hp->n_layers, rq->n_ctx, hp->n_kv_heads * hp->head_dim, rq->kv_elem_bytes);
    /* activations, per-thread FFN accumulators, and the tokenizer's copies (~ pieces twice + hash + entries) */
    {
        flm_params bp = {.n_batch = (int)rq->n_batch, .n_threads = rq->n_threads};
        p->n_batch = flm_batch_size(&bp, hp, rq->n_ctx, budget);
    }
    p->scratch = flm_scratch_bytes(hp, rq->n_ctx, p->n_batch) +
                 4ull * (uint64_t)rq->n_threads * p->n_batch * hp->d_model +
                 (uint64_t)hp->n_vocab * 96;
    /* reader bounce buffers: 1/16 of the budget, between 32 KiB and 8 MiB, plus its plan arrays and ring (~32 KiB;
     * flm_flash_open replaces the estimate with flm_reader_memory() once the reader exists) */
    uint64_t bounce = budget ? budget / 16 : (8u << 20);
    if (bounce < (32u << 10)) bounce = 32u << 10;
    if (bounce > (8u << 20)) bounce = 8u << 20;
    bounce = bounce / FLM_ALIGN * FLM_ALIGN;
    p->reader_bounce = (size_t)bounce;
    p->reader = bounce + (32u << 10);
    uint64_t fixed = p->resident + p->kv + p->scratch + p->reader;
    flm_mode mode = rq->mode;
    bool chosen = mode == FLM_MODE_AUTO; /* auto may fall back from sparse to hybrid below */
    if (mode == FLM_MODE_AUTO)
        mode = (!budget || fixed + ffn_total <= budget) ? FLM_MODE_RAM
               : f->predictor                         ? FLM_MODE_SPARSE
                                                      : FLM_MODE_HYBRID;
    p->mode = mode;
    const flm_ffn_source_ops *src = flm_ffn_source_of(mode);
    if (!src) return flm_fail(err, FLM_ERR_ARG, "%s: unknown mode %d", f->path, (int)mode);
    /* the token embedding: the streaming modes leave it in the file when it is the region's tail (one row a token
     * costs a 4 KiB read, against a whole layer's megabytes for the FFN storage it makes room for) */
    p->embd = rq->embd;
    p->embd_bytes = flm_file_tail_bytes(f) ? flm_file_tail_bytes(f) : (uint64_t)hp->n_vocab * rq->embd_row;
    if (rq->embd == FLM_EMBD_FLASH && (mode == FLM_MODE_RAM || !flm_file_tail_bytes(f))) p->embd = FLM_EMBD_MEMORY;
    if (p->embd == FLM_EMBD_FLASH) {
        p->resident = region - p->embd_bytes;
        p->embd_row = rq->embd_row;
        p->scratch += rq->embd_row; /* the buffer a row is read into */
    }
    p->n_stream_buffers = rq->no_read_ahead ? 1 : 2; /* the most the source may plan (ffn_stream.c) */
    flm_status st = src->plan(f, hp, rq->n_ctx, p, err);
    if (st == FLM_ERR_BUDGET && chosen && mode == FLM_MODE_SPARSE) { /* auto: the layer-streaming mode may still fit */
        flm_plan_request h = *rq;
        h.mode = FLM_MODE_HYBRID;
        h.budget = budget;
        h.percent = 0;
        return flm_budget_plan(f, hp, &h, p, err);
    }
    if (!st && mode == FLM_MODE_HYBRID && p->embd == FLM_EMBD_FLASH && p->n_resident_layers == f->n_layers &&
        budget && flm_mem_plan_total(p) - p->embd_row + p->embd_bytes <= budget) {
        p->embd = FLM_EMBD_MEMORY; /* every layer fits, and the embedding too: nothing is read per token */
        p->resident = region;
        p->scratch -= p->embd_row;
        p->embd_row = 0;
    }
    if (st || mode == FLM_MODE_SPARSE) return st; /* runtime/sparse.c sizes the caches from p->cache and checks them */
    if (budget && flm_mem_plan_total(p) > budget) {
        char embd[96] = "";
        if (p->embd == FLM_EMBD_FLASH)
            snprintf(embd, sizeof embd, " (token embedding %.2f MiB left on flash)", flm_mib(p->embd_bytes));
        return flm_fail(err, FLM_ERR_BUDGET,
                        "%s: a memory budget of %s is too small for mode %s: resident weights %.2f MiB%s + KV "
                        "cache %.2f MiB (-c %u, %s) + scratch %.2f MiB + reader %.2f MiB + FFN %s %.2f MiB = %.2f MiB "
                        "(the whole model is %.2f MiB)",
                        f->path, flm_size(budget).s, flm_mode_name(mode), flm_mib(p->resident), embd, flm_mib(p->kv),
                        rq->n_ctx, rq->kv_elem_bytes == FLM_KV_F16 ? "f16" : "f32", flm_mib(p->scratch),
                        flm_mib(p->reader), mode == FLM_MODE_RAM ? "(all layers)" : "(one streamed layer)",
                        flm_mib(p->stream + p->ffn_resident), flm_mib(flm_mem_plan_total(p)), flm_mib(p->model_bytes));
    }
    return FLM_OK;
}

void flm_mem_plan_log(const flm_mem_plan *p, const flm_hparams *hp, const flm_logger *log, flm_log_level level) {
    char head[64] = "none";
    if (p->budget) snprintf(head, sizeof head, "%.2f MiB", flm_mib(p->budget));
    flm_log(log, level, "plan: mode %s, budget %s, model %.2f MiB; planned %.2f MiB:", flm_mode_name(p->mode), head,
            flm_mib(p->model_bytes), flm_mib(flm_mem_plan_total(p)));
    flm_log(log, level, "plan:   resident weights %10.2f MiB  attention, norms, output, tokenizer%s",
            flm_mib(p->resident), p->embd == FLM_EMBD_FLASH ? "" : ", token embedding");
    switch (p->embd) {
    case FLM_EMBD_FLASH:
        flm_log(log, level, "plan:   token embedding  %10.2f MiB  on flash, not in memory: one %llu-byte row read per "
                "token", flm_mib(p->embd_bytes), (unsigned long long)p->embd_row);
        break;
    case FLM_EMBD_MEMORY:
        flm_log(log, level, "plan:   token embedding  %10.2f MiB  in memory (in the resident weights): mode %s keeps "
                "it", flm_mib(p->embd_bytes), flm_mode_name(p->mode));
        break;
    case FLM_EMBD_TIED:
        flm_log(log, level, "plan:   token embedding  %10.2f MiB  in memory (in the resident weights): it is also the "
                "output classifier", flm_mib(p->embd_bytes));
        break;
    case FLM_EMBD_UNSPLIT:
        flm_log(log, level, "plan:   token embedding  %10.2f MiB  in memory (in the resident weights): this file "
                "predates the split resident region; convert it again to leave the embedding on flash",
                flm_mib(p->embd_bytes));
        break;
    }
    flm_log(log, level, "plan:   KV cache         %10.2f MiB  %s, %u tokens x %u layers x %u keys and values",
            flm_mib(p->kv), p->kv_elem_bytes == FLM_KV_F16 ? "f16" : "f32 (--kv-f32)", p->n_ctx, hp->n_layers,
            hp->n_kv_heads * hp->head_dim);
    flm_log(log, level, "plan:   scratch          %10.2f MiB  activations (batches of %u tokens, -b), FFN accumulators, "
            "tokenizer, statistics", flm_mib(p->scratch), p->n_batch);
    flm_log(log, level, "plan:   reader           %10.2f MiB  bounce buffers (%.2f MiB), request queues",
            flm_mib(p->reader), flm_mib(p->reader_bounce));
    if (p->mode == FLM_MODE_SPARSE) {
        flm_log(log, level, "plan:   predictors       %10.2f MiB", flm_mib(p->predictors));
        flm_log(log, level, "plan:   neuron caches    %10.2f MiB  all layers (the rest of the budget)",
                flm_mib(p->cache));
    } else {
        char stream[96] = "";
        if (p->stream)
            snprintf(stream, sizeof stream, " + %s %.2f MiB",
                     p->n_stream_buffers == 2 ? "two streamed-layer buffers (read-ahead)" : "the streamed layers' buffer",
                     flm_mib(p->stream));
        flm_log(log, level, "plan:   FFN in memory    %10.2f MiB  %u of %u layers resident (%.2f MiB)%s",
                flm_mib(p->ffn_resident + p->stream), p->n_resident_layers, hp->n_layers, flm_mib(p->ffn_resident),
                stream);
    }
}
