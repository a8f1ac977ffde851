/* budget.c — planning memory under --mem (docs/ARCHITECTURE.md, "Memory budget"). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "runtime/runtime.h"
#include "core/error.h"
#include "core/util.h"
#include "io/reader.h"


void flm_ffn_region_bytes(const flm_file *f, uint64_t *total, uint64_t *largest) {
    *total = *largest = 0;
    for (uint32_t l = 0; l < f->n_layers; l++) {
        uint64_t b = flm_align_up(f->ffn[l]->size, FLM_ALIGN);
        *total += b;
        if (b > *largest) *largest = b;
    }
}

uint64_t flm_compute_threads_bytes(int n_threads) {
    return n_threads > FLM_COMPUTE_THREADS_FREE ? (uint64_t)(n_threads - FLM_COMPUTE_THREADS_FREE) * FLM_THREAD_BYTES
                                                : 0;
}

uint64_t flm_reader_threads_bytes(const flm_params *p) {
    /* the workers of the threads back end: asked for, or what auto takes where io_uring cannot be set up (flash.c
     * replaces the estimate with flm_reader_memory once the reader exists); those past the allowance's */
    uint64_t n = 0;
    flm_io_kind io = p ? p->io : FLM_IO_KIND_AUTO;
    if (io == FLM_IO_KIND_THREADS || (io == FLM_IO_KIND_AUTO && !flm_reader_uring_works()))
        n = p && p->io_threads > 0 ? (uint64_t)p->io_threads : 32u;
    return n > FLM_READER_THREADS_FREE ? (n - FLM_READER_THREADS_FREE) * FLM_THREAD_BYTES : 0;
}

uint64_t flm_mem_plan_total(const flm_mem_plan *p) {
    return p->resident + p->kv + p->scratch + p->reader + p->stream + p->ffn_resident + p->predictors + p->cache;
}

double flm_mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

uint32_t flm_kv_elem_bytes(const flm_params *p) { return p->kv_f32 ? FLM_KV_F32 : FLM_KV_F16; }

uint32_t flm_n_seq_of(const flm_params *p) { return p && p->n_seq > 1 ? (uint32_t)p->n_seq : 1u; }

uint64_t flm_seq_scratch_bytes(const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, uint32_t n_seq) {
    if (n_seq <= 1) return 0;
#define ALIGNED(b) (((uint64_t)(b) + FLM_CARVE_ALIGN - 1) / FLM_CARVE_ALIGN * FLM_CARVE_ALIGN)
    const uint64_t T = flm_scratch_tree_nodes(n_ctx), row = ALIGNED((uint64_t)hp->n_vocab * 4);
    const uint64_t tree = ALIGNED(4 * T + T * T) + ALIGNED(4 * flm_seq_hidden_rows(n_ctx, n_batch) * hp->d_model) +
                          2 * FLM_CARVE_ALIGN;
#undef ALIGNED
    return (2ull * n_seq - 1) * row + FLM_CARVE_ALIGN + n_seq * tree;
}

/* Rows per read of the classifier on flash: its n_buf chunk buffers (two: one read while the other is multiplied)
 * together about budget / 64 (64 KiB .. 4 MiB), each a multiple of 64 rows (the units checked, FLM_OUT_UNIT_ROWS,
 * divide it) and at most the rows streamed. */
static uint32_t out_chunk_rows(uint64_t budget, uint64_t row, uint32_t rows, uint32_t n_buf) {
    uint64_t b = budget / 64;
    if (b < (64u << 10)) b = 64u << 10;
    if (b > (4u << 20)) b = 4u << 20;
    uint64_t n = b / n_buf / row / 64 * 64;
    if (n < 64) n = 64;
    return n < rows ? (uint32_t)n : rows;
}

static flm_status plan_try(const flm_file *f, const flm_hparams *hp, const flm_plan_request *rq, flm_mem_plan *p,
                           flm_error *err);

/* The plan with the classifier in memory; when that does not fit in a mode that streams, with the classifier on
 * flash past the self-draft's rows, then wholly on flash (plan_try's out_try). The first that fits is the plan; when
 * none does, the last one's refusal (every part listed). */
flm_status flm_budget_plan(const flm_file *f, const flm_hparams *hp, const flm_plan_request *rq, flm_mem_plan *p,
                           flm_error *err) {
    flm_status st = plan_try(f, hp, rq, p, err);
    const bool fits = !st && (!p->budget || flm_mem_plan_total(p) + p->spec <= p->budget);
    if (st != FLM_ERR_BUDGET || fits || rq->out_try || !rq->out_row || p->mode == FLM_MODE_RAM ||
        rq->mode == FLM_MODE_RAM || (rq->tied && !flm_file_tail_bytes(f)))
        return st;
    flm_plan_request r = *rq;
    for (r.out_try = 1; r.out_try <= 2; r.out_try++) {
        if (r.out_try == 1 && (rq->tied || rq->out_rows_draft == 0 || rq->out_rows_draft >= hp->n_vocab)) continue;
        flm_error e;
        st = plan_try(f, hp, &r, p, &e);
        if (st != FLM_ERR_BUDGET) {
            if (st && err) *err = e;
            return st;
        }
        if (err) *err = e;
    }
    return st;
}

static flm_status plan_try(const flm_file *f, const flm_hparams *hp, const flm_plan_request *rq, flm_mem_plan *p,
                           flm_error *err) {
    memset(p, 0, sizeof *p);
    const uint64_t region = f->resident->size;
    const uint64_t budget = rq->budget;
    p->resident = region;
    uint64_t ffn_total, max_layer;
    flm_ffn_region_bytes(f, &ffn_total, &max_layer);
    p->model_bytes = region + ffn_total; /* FFN counted with its 4 KiB padding */
    p->budget = budget;
    p->n_ctx = rq->n_ctx;
    p->kv_elem_bytes = rq->kv_elem_bytes;
    const uint32_t n_seq = flm_n_seq_of(rq->params); /* a KV cache and a logits row per sequence */
    p->kv = n_seq * flm_kv_cache_bytes(hp->n_layers, rq->n_ctx, hp->n_kv_heads * hp->head_dim, rq->kv_elem_bytes);
    /* activations, per-thread FFN accumulators, and the tokenizer's copies (~ pieces twice + hash + entries) */
    {
        flm_params bp = {.n_batch = (int)rq->n_batch, .n_threads = rq->n_threads};
        p->n_batch = flm_batch_size(&bp, hp, rq->n_ctx, budget);
    }
    p->scratch = flm_plan_scratch(hp, rq->n_ctx, p->n_batch, rq->n_threads, n_seq, true);
    /* reader bounce buffers: 1/16 of the budget, between 32 KiB and 8 MiB, plus its plan arrays and ring (~32 KiB;
     * flm_flash_open replaces the estimate with flm_reader_memory() once the reader exists) */
    uint64_t bounce = budget ? budget / 16 : (8u << 20);
    if (bounce < (32u << 10)) bounce = 32u << 10;
    if (bounce > (8u << 20)) bounce = 8u << 20;
    bounce = bounce / FLM_ALIGN * FLM_ALIGN;
    p->reader_bounce = (size_t)bounce;
    p->reader = bounce + (32u << 10) + flm_reader_threads_bytes(rq->params);
    if (f->sums && !(rq->params && rq->params->no_verify_reads)) /* checked reads: the record sums, the read checks */
        p->reader_checks = f->sums->size + 128ull * (f->n_layers + 1) + 3ull * 24 * hp->d_ffn;
    p->reader += p->reader_checks;
    uint64_t fixed = p->resident + p->kv + p->scratch + p->reader;
    flm_mode mode = rq->mode;
    const bool chosen = mode == FLM_MODE_AUTO; /* auto may fall back from sparse to hybrid below */
    if (!chosen)
        snprintf(p->reason, sizeof p->reason, "mode %s as asked", flm_mode_name(mode) ? flm_mode_name(mode) : "?");
    else if (!budget)
        snprintf(p->reason, sizeof p->reason, "no budget: every weight in memory");
    else if (fixed + ffn_total <= budget)
        snprintf(p->reason, sizeof p->reason, "the whole model fits the budget (%.2f of %.2f MiB)",
                 flm_mib(fixed + ffn_total), flm_mib(budget));
    else if (f->predictor)
        snprintf(p->reason, sizeof p->reason, "the model does not fit the budget (%.2f MiB in memory); it is "
                 "calibrated, its neuron caches fit and its predicted sets are smaller than what hybrid streams",
                 flm_mib(fixed + ffn_total));
    else
        snprintf(p->reason, sizeof p->reason, "%s does not fit the budget and is not calibrated, so it runs hybrid "
                 "(whole layers streamed); for the sparse mode, calibrate it once: flashlm calibrate %s --text FILE",
                 f->path, f->path);
    /* a file stored hottest first runs hot rather than hybrid: the same bytes read per pass, and a self-draft */
    bool hot_ordered = f->n_layers > 0;
    for (uint32_t l = 0; l < f->n_layers; l++) hot_ordered = hot_ordered && (f->ffn[l]->flags & FLM_FFN_HOT_ORDER);
    const flm_mode streamed = hot_ordered ? FLM_MODE_HOT : FLM_MODE_HYBRID;
    if (chosen && budget && fixed + ffn_total > budget && !f->predictor && hot_ordered)
        snprintf(p->reason, sizeof p->reason, "the model does not fit the budget (%.2f MiB in memory) and its neurons "
                 "are stored hottest first (flashlm calibrate): every layer keeps its hottest neurons, the rest is "
                 "read as one range per pass", flm_mib(fixed + ffn_total));
    if (chosen)
        mode = (!budget || fixed + ffn_total <= budget) ? FLM_MODE_RAM
               : f->predictor                         ? FLM_MODE_SPARSE
                                                      : streamed;
    p->mode = mode;
    const flm_ffn_source_ops *src = flm_ffn_source_of(mode);
    if (!src) return flm_fail(err, FLM_ERR_ARG, "%s: unknown mode %d", f->path, (int)mode);
    /* the token embedding: the streaming modes leave it in the file when it is the region's tail (one row a token
     * costs a 4 KiB read, against a whole layer's megabytes for the FFN storage it makes room for) */
    p->embd = rq->embd;
    p->embd_bytes = flm_file_tail_bytes(f) ? flm_file_tail_bytes(f) : (uint64_t)hp->n_vocab * rq->embd_row;
    if (rq->embd == FLM_EMBD_FLASH && (mode == FLM_MODE_RAM || !flm_file_tail_bytes(f)))
        p->embd = rq->tied ? FLM_EMBD_TIED : FLM_EMBD_MEMORY;
    if (rq->embd == FLM_EMBD_FLASH && rq->tied && !rq->out_try) p->embd = FLM_EMBD_TIED; /* the classifier's too */
    p->out_row = rq->out_row;
    p->out_bytes = (uint64_t)hp->n_vocab * rq->out_row;
    if (rq->out_try) { /* the classifier on flash, but the draft's rows (out_try 1); tied: the embedding with it */
        p->out_flash = true;
        p->out_rows_res = rq->out_try == 1 ? rq->out_rows_draft : 0;
        p->out_n_buf = rq->no_read_ahead ? 1 : 2; /* two: the next chunk is read while one is multiplied */
        p->out_chunk_rows = out_chunk_rows(budget, rq->out_row, hp->n_vocab - p->out_rows_res, p->out_n_buf);
        p->scratch += p->out_n_buf * ((uint64_t)p->out_chunk_rows * rq->out_row + FLM_ALIGN); /* the chunk buffers */
        if (!rq->tied) { /* it lies in the head: the rows on flash are not loaded, and their sums are made at load */
            const uint64_t on_flash = (uint64_t)(hp->n_vocab - p->out_rows_res) * rq->out_row;
            p->resident -= on_flash;
            p->out_unit_rows = FLM_OUT_UNIT_ROWS;
            const uint64_t units = (hp->n_vocab - p->out_rows_res + FLM_OUT_UNIT_ROWS - 1) / FLM_OUT_UNIT_ROWS;
            p->reader += 8 * units;
            p->reader_checks += 8 * units;
        }
    }
    if (p->embd == FLM_EMBD_FLASH) {
        p->resident -= p->embd_bytes;
        p->embd_row = rq->embd_row;
        p->scratch += FLM_EMBD_READ_ROWS * rq->embd_row; /* the buffer a pass's rows are read into */
    }
    p->n_stream_buffers = rq->no_read_ahead ? 1 : 2; /* the most the source may plan (ffn_stream.c) */
    if (mode == FLM_MODE_HOT && rq->draft_window > 0) { /* the self-draft's window (hot_plan) */
        double w = rq->draft_window < 0.9 ? rq->draft_window : 0.9;
        p->window_q16 = (uint32_t)(w * 65536.0 + 0.5);
    }
    flm_error serr;
    flm_status st = src->plan(f, hp, rq->n_ctx, p, &serr);
    /* auto: sparse must fit, and pay against hybrid with the same memory (runtime/sparse.c); else the
     * layer-streaming mode may still fit */
    if (!st && chosen && mode == FLM_MODE_SPARSE && rq->params) st = flm_sparse_plan_check(f, rq->params, p, rq->keep, &serr);
    if (st == FLM_ERR_BUDGET && chosen && mode == FLM_MODE_SPARSE) {
        flm_plan_request h = *rq;
        h.mode = streamed;
        st = flm_budget_plan(f, hp, &h, p, err);
        snprintf(p->reason, sizeof p->reason, "%.480s; running %s instead", serr.msg, flm_mode_name(streamed));
        return st;
    }
    if (st) {
        if (err) *err = serr;
        return st;
    }
    if (mode == FLM_MODE_HYBRID && p->embd == FLM_EMBD_FLASH && !p->out_flash && p->n_resident_layers == f->n_layers &&
        budget && flm_mem_plan_total(p) - FLM_EMBD_READ_ROWS * p->embd_row + p->embd_bytes <= budget) {
        p->embd = FLM_EMBD_MEMORY; /* every layer fits, and the embedding too: nothing is read per token */
        p->resident = region;
        p->scratch -= FLM_EMBD_READ_ROWS * p->embd_row;
        p->embd_row = 0;
    }
    if (mode == FLM_MODE_SPARSE) return FLM_OK; /* runtime/sparse.c sized the caches from p->cache and checked them */
    if (budget && flm_mem_plan_total(p) > budget) {
        char embd[192] = "";
        if (p->embd == FLM_EMBD_FLASH)
            snprintf(embd, sizeof embd, " (token embedding %.2f MiB left on flash)", flm_mib(p->embd_bytes));
        if (p->out_flash) {
            size_t n = strlen(embd);
            snprintf(embd + n, sizeof embd - n, " (classifier %.2f MiB on flash, %u of its rows in memory)",
                     flm_mib((uint64_t)(hp->n_vocab - p->out_rows_res) * p->out_row), p->out_rows_res);
        }
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
