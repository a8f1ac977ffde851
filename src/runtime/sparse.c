/* sparse.c — the paper's method (Knowls 2-5): per layer, a predictor picks the token's active neurons; a neuron cache
 * holds the neurons of the last k tokens (the window) in a preallocated matrix; only the neurons not cached are read,
 * one bundle per neuron, through the coalescing reader; the FFN is computed over the rows of the predicted set. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/neuron_cache.h"
#include "core/types.h"
#include "core/util.h"
#include "runtime/runtime.h"
#include "sparsity/sparsity.h"
#include "core/error.h"
#include "compute/act.h"
#include "io/async_read.h"

struct flm_sparse {
    flm_predictor_region sp;          /* rules, thresholds, predictors (the PREDICTOR region) */
    flm_ncache **cache;       /* [n_layers] */
    flm_bundle_desc *desc;    /* [n_layers]: desc with the layer's CATS threshold */
    uint32_t window;          /* k */
    uint64_t cache_rows;      /* capacity summed over layers */
    uint32_t *ids;            /* [d_ffn] predicted set */
    uint32_t *true_ids;       /* [d_ffn] true set (oracle / verify) */
    float *pscratch;          /* predictor scratch: h [max rank], then z [d_ffn] */
    uint16_t **A16, **B16;    /* [n_layers]: the predictors' A and B in f16 (half the memory of the stored f32;
                                 the f32 copies are freed after conversion; c and the threshold stay f32) */
    float *z;                 /* [d_ffn] every neuron's h_i (oracle / verify) */
    float *tmp_out;           /* [d_model] partial FFN output (streamed neurons; oracle) */
    flm_extent *ext;          /* [3 * d_ffn] */
    uint8_t **full;           /* [n_layers]: every neuron's record, for oracle / verify; NULL otherwise */
    float **dn;               /* [n_layers]: every neuron's ||down_i||, for oracle / verify */
    uint8_t *sbuf;            /* stream buffer: SPARSE_STREAM_ROWS records, for sets larger than the cache */
    flm_async_read *ahead;    /* reads the next chunk of streamed records while one is computed (NULL: none) */
    uint8_t *bmask;           /* a batch: [n_batch][d_ffn], token t uses neuron i (its predicted set) */
    uint8_t *bmask_rows;      /* a batch: [n_batch][d_ffn], the same by position in the rows computed */
    uint32_t *brows;          /* a batch: [d_ffn] rows (cache rows or stream buffer records) being computed */
    float *bpart;             /* a batch: [n_batch][d_model] partial outputs (streamed neurons) */
    /* the last small batch per layer that entered the window as one set (draft verification): its first position,
     * its tokens, and each token's set as a bitset of d_ffn bits; trimmed to the accepted tokens when the next
     * evaluation goes back into it */
    int32_t *pend_start;      /* [n_layers] */
    uint32_t *pend_n;         /* [n_layers], 0: none */
    uint64_t *pend_bits;      /* [n_layers][SPARSE_SPEC_TOKENS][words] */
    uint32_t words;           /* 64-bit words per set: ceil(d_ffn / 64) */
    uint32_t n_batch;
    const float **b_up;       /* [n_layers] FFN biases (FLM_ARCH_FFN_BIAS, OPT): each layer's b_up by neuron (the
                                 model's resident f32); NULL without biases */
    float *bias_rows;         /* with biases: [d_ffn] b_up gathered by the row a neuron is computed from (a cache row,
                                 or a stream buffer record), per call: flm_ffn_bundles indexes up_bias by row */
    uint64_t *okey;           /* a file in co-activation order: [d_ffn] sort keys, and the set in the order the FFN */
    uint32_t *oids, *orows;   /* sums it (order_ids): [d_ffn] ids and their cache rows; NULL otherwise */
    uint64_t streamed;        /* neurons streamed past the cache (reported) */
    uint32_t level;           /* the level in use */
};

/* Records the stream buffer holds: neurons of a set larger than its layer's cache are read, computed and discarded
 * this many at a time (256 records of 3360 bytes, Qwen2.5 1.5B: 840 KiB, read as one coalesced batch). */
#define SPARSE_STREAM_ROWS 256u
/* Batches of at most this many tokens keep each token's set until the next evaluation (speculative verification). */
#define SPARSE_SPEC_TOKENS 16u

uint32_t flm_sparse_window(const flm_sparse *sp) { return sp ? sp->window : 0; }
uint64_t flm_sparse_cache_rows(const flm_sparse *sp) { return sp ? sp->cache_rows : 0; }
uint64_t flm_sparse_streamed(const flm_sparse *sp) { return sp ? sp->streamed : 0; }

static void sparse_free(flm_sparse *sp) {
    if (!sp) return;
    for (uint32_t l = 0; l < sp->sp.n_layers; l++) { /* before flm_predictor_region_free, which clears n_layers */
        if (sp->cache) flm_ncache_free(sp->cache[l]);
        if (sp->full) free(sp->full[l]);
        if (sp->dn) free(sp->dn[l]);
        if (sp->A16) free(sp->A16[l]);
        if (sp->B16) free(sp->B16[l]);
    }
    flm_predictor_region_free(&sp->sp);
    free(sp->cache);
    free(sp->full);
    free(sp->dn);
    flm_async_read_stop(sp->ahead); /* before the stream buffer it may be reading into */
    free(sp->sbuf);
    free(sp->bmask);
    free(sp->bmask_rows);
    free(sp->brows);
    free(sp->bpart);
    free(sp->pend_start);
    free(sp->pend_n);
    free(sp->pend_bits);
    free(sp->tmp_out);
    free(sp->b_up);
    free(sp->bias_rows);
    free(sp->okey);
    free(sp->oids);
    free(sp->orows);
    free(sp->desc);
    free(sp->ids);
    free(sp->true_ids);
    free(sp->pscratch);
    free(sp->A16);
    free(sp->B16);
    free(sp->z);
    free(sp->ext);
    free(sp);
}

/* Load every neuron's record and its down column's norm: the true active set needs all of them (analysis modes
 * only; this memory is outside the budget and reported as such). */
static flm_status load_full(flm_ffn_env *E, flm_sparse *sp, flm_error *err) {
    flm_flash *fl = E->flash;
    const flm_hparams *hp = &E->model->hp;
    sp->full = calloc(hp->n_layers, sizeof *sp->full);
    sp->dn = calloc(hp->n_layers, sizeof *sp->dn);
    float *col = malloc(hp->d_model * sizeof(float));
    flm_status st = sp->full && sp->dn && col ? FLM_OK : flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < hp->n_layers && !st; l++) {
        const flm_region *r = fl->file->ffn[l];
        const flm_bundle_desc *b = &sp->desc[l];
        if (posix_memalign((void **)&sp->full[l], FLM_ALIGN, flm_align_up(r->size, FLM_ALIGN)) ||
            !(sp->dn[l] = malloc(hp->d_ffn * sizeof(float)))) {
            st = flm_fail(err, FLM_ERR_NOMEM, "out of memory for the oracle's copy of layer %u", l);
            break;
        }
        flm_extent e = {r->offset, flm_align_up(r->size, FLM_ALIGN), sp->full[l]};
        if ((st = flm_reader_read(fl->reader, &e, 1, NULL, err))) break;
        for (uint32_t i = 0; i < hp->d_ffn; i++) {
            E->k->dequant[b->down_type](sp->full[l] + i * b->record_bytes + b->down_off, col, hp->d_model);
            double s2 = 0;
            for (uint32_t j = 0; j < hp->d_model; j++) s2 += (double)col[j] * col[j];
            sp->dn[l][i] = (float)sqrt(s2);
        }
    }
    free(col);
    return st;
}

/* A batch's masks, row list and partial outputs (sparse_compute_batch): 2 * n_batch * d_ffn + 4 * d_ffn +
 * 4 * n_batch * d_model bytes, and the sets of the last small batch per layer (n_layers * SPARSE_SPEC_TOKENS *
 * d_ffn bits); 0 without batches. */
static uint64_t batch_bytes(const flm_hparams *hp, uint32_t n_batch) {
    if (n_batch <= 1) return 0;
    uint64_t words = (hp->d_ffn + 63u) / 64u;
    return 2ull * n_batch * hp->d_ffn + 4ull * hp->d_ffn + 4ull * n_batch * hp->d_model +
           (uint64_t)hp->n_layers * (SPARSE_SPEC_TOKENS * words * 8u + 8u);
}

/* FFN biases (FLM_ARCH_FFN_BIAS): the rows' gathered b_up (bias_rows), max(d_ffn, SPARSE_STREAM_ROWS) floats, and
 * the layers' pointers; 0 without biases. */
static uint64_t bias_bytes(const flm_hparams *hp) {
    if (!(hp->arch->flags & FLM_ARCH_FFN_BIAS)) return 0;
    uint64_t n = hp->d_ffn > SPARSE_STREAM_ROWS ? hp->d_ffn : SPARSE_STREAM_ROWS;
    return 4ull * n + (uint64_t)hp->n_layers * sizeof(float *);
}

/* A file in co-activation order: the set reordered for the sums (compute_order), 16 bytes per neuron of d_ffn. Planned
 * for every sparse run (the plan does not read the predictor region); a few hundred KiB at most. */
static uint64_t order_bytes(const flm_hparams *hp) { return 16ull * hp->d_ffn; }

/* The bundle layout for computing n neurons ids[0 .. n) of layer l from rows rows[0 .. n) of some records (rows NULL:
 * records 0 .. n - 1): the layer's, or with FFN biases a copy (in *tmp) whose up_bias holds each neuron's b_up at its
 * row, as flm_ffn_bundles reads up_bias[row]. The gathered biases live until the next call. */
static const flm_bundle_desc *rows_desc(flm_sparse *sp, uint32_t l, const uint32_t *ids, const uint32_t *rows,
                                        uint32_t n, flm_bundle_desc *tmp) {
    if (!sp->b_up) return &sp->desc[l];
    const float *bu = sp->b_up[l];
    for (uint32_t i = 0; i < n; i++) sp->bias_rows[rows ? rows[i] : i] = bu[ids[i]];
    *tmp = sp->desc[l];
    tmp->up_bias = sp->bias_rows;
    return tmp;
}

/* The FFN part of the plan: the predictors, held at half precision, and what is left of the budget for the neuron
 * caches (split over the layers at open). */
static flm_status sparse_plan(const flm_file *f, const flm_hparams *hp, uint32_t n_ctx, flm_mem_plan *p,
                              flm_error *err) {
    if (!f->predictor)
        return flm_fail(err, FLM_ERR_ARG, "%s: --mode sparse needs predictors: run `flashlm calibrate %s --text "
                        "FILE` first", f->path, f->path);
    uint64_t budget = p->budget, ffn_total, max_layer;
    flm_ffn_region_bytes(f, &ffn_total, &max_layer);
    uint64_t fixed = p->resident + p->kv + p->scratch + p->reader;
    /* held at half precision (sparse_open), as version-2 regions store them (a version-1 region's f32 needs half).
     * A file in co-activation order holds each layer's original neuron order there too (4 bytes a neuron and a
     * 4-byte tag, version 3); the plan keeps room for it in every file, so that a model plans the same neuron cache
     * before and after the order (the same sets then split the same way between cache and stream buffer, and the
     * sums are bit for bit the same) */
    bool ordered = f->n_layers > 0;
    uint64_t order = 4;
    for (uint32_t l = 0; l < f->n_layers; l++) {
        ordered = ordered && (f->ffn[l]->flags & FLM_FFN_COACT_ORDER);
        order += 4ull * f->ffn[l]->n_records;
    }
    p->predictors = f->predictor->size + FLM_ALIGN + (ordered ? 0 : order);
    /* the stream buffer for sets larger than a layer's cache */
    uint64_t rec = 0;
    for (uint32_t l = 0; l < f->n_layers; l++) {
        uint64_t rb = f->ffn[l]->n_records ? f->ffn[l]->size / f->ffn[l]->n_records : 0;
        rec = rb > rec ? rb : rec;
    }
    p->stream = flm_align_up(SPARSE_STREAM_ROWS * rec, FLM_ALIGN) + batch_bytes(hp, p->n_batch) + bias_bytes(hp) +
                order_bytes(hp);
    fixed += p->stream;
    uint64_t used = fixed + p->predictors;
    p->cache = budget > used ? budget - used : 0;
    if (!budget) p->cache = ffn_total + (uint64_t)f->n_layers * (16u << 10); /* no budget: room for every neuron */
    if (budget && p->cache == 0)
        return flm_fail(err, FLM_ERR_BUDGET,
                        "%s: a memory budget of %.2f MiB leaves nothing for the neuron cache: resident weights "
                        "%.2f MiB + KV cache %.2f MiB (-c %u) + scratch %.2f MiB + reader %.2f MiB + predictors "
                        "%.2f MiB + stream buffer %.2f MiB = %.2f MiB", f->path, flm_mib(budget), flm_mib(p->resident),
                        flm_mib(p->kv), n_ctx, flm_mib(p->scratch), flm_mib(p->reader), flm_mib(p->predictors),
                        flm_mib(p->stream), flm_mib(used));
    /* at open the stored region is read and parsed (a second copy) before any cache exists: that transient
     * 2 x region must fit in what the predictors and caches will hold afterwards */
    if (budget && 2 * f->predictor->size > p->cache + p->predictors)
        return flm_fail(err, FLM_ERR_BUDGET,
                        "%s: a memory budget of %.2f MiB leaves %.2f MiB for predictors and neuron caches, less than "
                        "the %.2f MiB needed to load the predictors; raise --mem", f->path, flm_mib(budget),
                        flm_mib(p->cache + p->predictors), flm_mib(2 * f->predictor->size));
    return FLM_OK;
}

/* The window: the largest k (<= 16) whose expected union of predicted sets (calibrated s_agg(k), averaged over
 * layers) is at most 1.5x what each layer's share of the cache budget (per_layer bytes) holds. A window somewhat
 * larger than the cache still pays: the cache then drops the oldest tokens' sets early, keeping as many recent ones
 * as fit (measured on the standard shape at --mem 50%: k = 1, 2, 3, 6, 16 read 84.6, 70.0, 67.7, 71.0, 71.9 MiB per
 * token). A cache that holds every neuron fits any window. --window / --no-window override. */
static uint32_t choose_window(const flm_predictor_region *s, const flm_params *pp, const flm_file *f,
                              uint64_t per_layer) {
    if (pp->no_window) return 1;
    if (pp->window > 0) return (uint32_t)pp->window;
    for (uint32_t kk = FLM_AGG_K; kk >= 1; kk--) {
        double need = 0, have = 0;
        for (uint32_t l = 0; l < s->n_layers; l++) {
            uint32_t F = f->ffn[l]->n_records;
            uint32_t cap = flm_ncache_capacity_for(per_layer, F, f->ffn[l]->record_bytes, kk, 0);
            need += s->layers[l].s_agg[kk - 1] * F;
            have += cap >= F ? 1e30 : cap;
        }
        if (need <= 1.5 * have) return kk;
    }
    return 1;
}

/* The smallest neuron-cache capacity over the layers for window k and per_layer bytes each (0: a layer cannot hold
 * one neuron), and that layer. */
static uint32_t min_capacity(const flm_file *f, uint64_t per_layer, uint32_t k, uint32_t *layer) {
    uint32_t best = UINT32_MAX;
    *layer = 0;
    for (uint32_t l = 0; l < f->n_layers; l++) {
        uint32_t cap = flm_ncache_capacity_for(per_layer, f->ffn[l]->n_records, f->ffn[l]->record_bytes, k, 0);
        if (cap < best) { best = cap; *layer = l; }
    }
    return best;
}

flm_status flm_sparse_plan_check(const flm_file *f, const flm_params *pp, const flm_mem_plan *p,
                                 flm_predictor_region **keep, flm_error *err) {
    if (!f->predictor || !p->budget) return FLM_OK; /* no budget: every neuron fits */
    void *region = NULL;
    flm_predictor_region s = {0};
    flm_status st = flm_file_read_region(f, f->predictor, &region, err);
    if (st) return st;
    st = flm_predictor_region_deserialize(region, f->predictor->size, f->path, &s, err);
    free(region);
    if (st) return st;
    if (s.n_layers != f->n_layers) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region has %u layers, the model %u", f->path, s.n_layers,
                      f->n_layers);
        goto done;
    }
    /* sparse pays only when its predicted sets are smaller than what hybrid would stream with the same memory. A
     * gated model calibrated for near-dense quality may flag almost every neuron (Qwen2.5 1.5B at --mem 50%: 98.6%
     * at its default level, 892 MiB read per token against hybrid's 603). */
    if (pp->sparse_level == 0.0f) {
        uint64_t ffn_total, largest;
        flm_ffn_region_bytes(f, &ffn_total, &largest);
        uint64_t kept = p->cache + p->predictors + p->stream;
        double hybrid_b = kept < ffn_total ? (double)(ffn_total - kept) : 0.0;
        double sparse_b = 0;
        for (uint32_t l = 0; l < s.n_layers; l++) sparse_b += (double)s.layers[l].pred_frac * (double)f->ffn[l]->size;
        if (sparse_b >= 0.9 * hybrid_b) {
            st = flm_fail(err, FLM_ERR_BUDGET, "%s: its predictors flag %.0f MiB of FFN weights per token at the "
                          "calibrated level, about what hybrid streams (%.0f MiB) (--mode sparse forces sparse)",
                          f->path, sparse_b / 1048576.0, hybrid_b / 1048576.0);
            goto done;
        }
    }
    /* every layer's cache must hold one neuron at the window sparse_open will choose */
    uint64_t per_layer = p->cache / f->n_layers;
    uint32_t l, cap = min_capacity(f, per_layer, choose_window(&s, pp, f, per_layer), &l);
    if (cap == 0)
        st = flm_fail(err, FLM_ERR_BUDGET, "%s: the memory budget leaves %.2f MiB per layer for the neuron cache, less "
                      "than one neuron (%llu bytes); raise --mem", f->path, (double)per_layer / 1048576.0,
                      (unsigned long long)f->ffn[l]->record_bytes);
done:
    if (!st && keep && (*keep = malloc(sizeof **keep))) **keep = s; /* sparse_open takes it: read once */
    else flm_predictor_region_free(&s);
    return st;
}

static void sparse_close(flm_ffn_env *E) {
    sparse_free(E->state);
    E->state = NULL;
}

static flm_status sparse_open(flm_ffn_env *E, flm_error *err) {
    flm_flash *fl = E->flash;
    const flm_hparams *hp = &E->model->hp;
    const flm_params *pp = E->params;
    uint32_t L = hp->n_layers, F = hp->d_ffn;
    flm_sparse *sp = calloc(1, sizeof *sp);
    if (!sp) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    E->state = sp;
    flm_status st;
    if (fl->sparsity) { /* the plan read and checked it (flm_sparse_plan_check) */
        sp->sp = *fl->sparsity;
        free(fl->sparsity);
        fl->sparsity = NULL;
    } else {
        void *region = NULL;
        if ((st = flm_file_read_region(fl->file, fl->file->predictor, &region, err))) return st;
        st = flm_predictor_region_deserialize(region, fl->file->predictor->size, fl->file->path, &sp->sp, err);
        free(region);
        if (st) return st;
    }
    if (sp->sp.n_layers != L)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region has %u layers, the model %u", fl->file->path,
                        sp->sp.n_layers, L);
    for (uint32_t l = 0; l < L; l++) {
        const flm_predictor *p = &sp->sp.layers[l].pred;
        if (p->d_model != hp->d_model || p->d_ffn != F)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor of layer %u is %u -> %u, the model %u -> %u",
                            fl->file->path, l, p->d_model, p->d_ffn, hp->d_model, F);
    }
    /* the level: calibrate's default, or --sparse-level */
    sp->level = sp->sp.default_level;
    if (pp->sparse_level > 0.0f) {
        int k = flm_predictor_region_find_level(&sp->sp, pp->sparse_level);
        if (k < 0) {
            char list[256] = "";
            for (uint32_t j = 0, o = 0; j < sp->sp.n_levels && o < sizeof list - 16; j++)
                o += (uint32_t)snprintf(list + o, sizeof list - o, "%s%g", j ? ", " : "", (double)sp->sp.level_eps[j]);
            return flm_fail(err, FLM_ERR_ARG, "%s: --sparse-level %g is not a calibrated level (levels: %s)",
                            fl->file->path, (double)pp->sparse_level, list);
        }
        sp->level = (uint32_t)k;
    }
    flm_predictor_region_use_level(&sp->sp, sp->level);
    /* predictors at half precision: version-2 records load as f16; a version-1 record's f32 is converted layer by
     * layer, each f32 copy freed as soon as it is converted */
    sp->A16 = calloc(L, sizeof *sp->A16);
    sp->B16 = calloc(L, sizeof *sp->B16);
    if (!sp->A16 || !sp->B16) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < L; l++) {
        flm_predictor *p = &sp->sp.layers[l].pred;
        if (p->A16) { /* take them over */
            sp->A16[l] = p->A16;
            sp->B16[l] = p->B16;
            p->A16 = p->B16 = NULL;
            continue;
        }
        size_t na = (size_t)p->rank * p->d_model, nb = (size_t)p->d_ffn * p->rank;
        if (!(sp->A16[l] = malloc(na * 2)) || !(sp->B16[l] = malloc(nb * 2)))
            return flm_fail(err, FLM_ERR_NOMEM, "out of memory for the predictors");
        for (size_t i = 0; i < na; i++) sp->A16[l][i] = flm_f32_to_f16(p->A[i]);
        for (size_t i = 0; i < nb; i++) sp->B16[l][i] = flm_f32_to_f16(p->B[i]);
        free(p->A);
        free(p->B);
        p->A = p->B = NULL;
    }
    uint32_t max_rank = 0;
    for (uint32_t l = 0; l < L; l++) max_rank = sp->sp.layers[l].pred.rank > max_rank ? sp->sp.layers[l].pred.rank : max_rank;
    sp->cache = calloc(L, sizeof *sp->cache);
    sp->desc = calloc(L, sizeof *sp->desc);
    sp->ids = malloc(F * sizeof *sp->ids);
    sp->true_ids = malloc(F * sizeof *sp->true_ids);
    sp->pscratch = malloc(((size_t)max_rank + F) * sizeof(float));
    sp->z = malloc(F * sizeof(float));
    sp->tmp_out = malloc(hp->d_model * sizeof(float));
    sp->ext = malloc(3 * (size_t)F * sizeof *sp->ext);
    uint64_t sbuf_bytes = fl->plan.stream - batch_bytes(hp, fl->plan.n_batch) - bias_bytes(hp) - order_bytes(hp);
    if (sp->sp.layers[0].orig) { /* stored in co-activation order: sums in the original order (compute_order) */
        sp->okey = malloc(F * sizeof *sp->okey);
        sp->oids = malloc(F * sizeof *sp->oids);
        sp->orows = malloc(F * sizeof *sp->orows);
        if (!sp->okey || !sp->oids || !sp->orows) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    }
    if (hp->arch->flags & FLM_ARCH_FFN_BIAS) { /* b_up by neuron, gathered by row per call (rows_desc) */
        sp->b_up = calloc(L, sizeof *sp->b_up);
        sp->bias_rows = malloc((F > SPARSE_STREAM_ROWS ? F : SPARSE_STREAM_ROWS) * sizeof(float));
        if (!sp->b_up || !sp->bias_rows) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
        for (uint32_t l = 0; l < L; l++) sp->b_up[l] = E->model->layers[l].ffn_up_b.data;
    }
    if (posix_memalign((void **)&sp->sbuf, FLM_ALIGN, sbuf_bytes ? sbuf_bytes : FLM_ALIGN)) sp->sbuf = NULL;
    if (fl->plan.n_batch > 1) {
        sp->n_batch = fl->plan.n_batch;
        sp->bmask = malloc((size_t)sp->n_batch * F);
        sp->bmask_rows = malloc((size_t)sp->n_batch * F);
        sp->brows = malloc(F * sizeof *sp->brows);
        sp->bpart = malloc((size_t)sp->n_batch * hp->d_model * sizeof(float));
        sp->words = (F + 63u) / 64u;
        sp->pend_start = calloc(L, sizeof *sp->pend_start);
        sp->pend_n = calloc(L, sizeof *sp->pend_n);
        sp->pend_bits = malloc((size_t)L * SPARSE_SPEC_TOKENS * sp->words * sizeof *sp->pend_bits);
        if (!sp->bmask || !sp->bmask_rows || !sp->brows || !sp->bpart || !sp->pend_start || !sp->pend_n ||
            !sp->pend_bits)
            return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    }
    if (!sp->cache || !sp->desc || !sp->ids || !sp->true_ids || !sp->pscratch || !sp->z || !sp->tmp_out || !sp->ext ||
        !sp->sbuf)
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    /* NULL (--no-read-ahead, or no thread): streamed chunks are read synchronously, 256 records at a time */
    sp->ahead = E->params->no_read_ahead ? NULL : flm_async_read_start(fl->reader);
    for (uint32_t l = 0; l < L; l++) { /* every neuron read is computed exactly, except under a version-1 CATS rule */
        sp->desc[l] = fl->desc[l];
        sp->desc[l].up_bias = NULL; /* cache rows are not neuron ids: FFN biases go by row (rows_desc) */
        sp->desc[l].threshold = sp->sp.layers[l].rule == FLM_RULE_CATS ? sp->sp.layers[l].threshold : 0.0f;
    }
    uint64_t per_layer = fl->plan.cache / L;
    uint32_t k = choose_window(&sp->sp, pp, fl->file, per_layer);
    sp->window = k;
    bool small_cache_logged = false;
    for (uint32_t l = 0; l < L; l++) {
        uint32_t cap = flm_ncache_capacity_for(per_layer, F, fl->desc[l].record_bytes, k, 0);
        if (!fl->plan.budget) cap = F; /* no budget: every neuron fits */
        if (cap == 0)
            return flm_fail(err, FLM_ERR_BUDGET, "%s: the memory budget leaves %.2f MiB per layer for the neuron "
                            "cache, less than one neuron (%llu bytes); raise --mem", fl->file->path,
                            (double)per_layer / 1048576.0, (unsigned long long)fl->desc[l].record_bytes);
        double mean = sp->sp.layers[l].s_agg[0] * F; /* a mean token's predicted set */
        if (cap < mean && !small_cache_logged) {
            flm_log(E->log, FLM_LOG_WARN, "%s: the neuron cache holds %u neurons per layer, fewer than the %.0f "
                    "layer %u predicts per token: the rest are streamed each token (slower; more --mem helps)",
                    fl->file->path, cap, mean, l);
            small_cache_logged = true;
        }
        if ((st = flm_ncache_create(F, fl->desc[l].record_bytes, cap, k, 0, &sp->cache[l], err))) return st;
        sp->cache_rows += cap;
    }
    if (pp->no_predictor || pp->verify_predictor) return load_full(E, sp, err);
    return FLM_OK;
}

/* The true active set of layer l for input x (oracle): the level's rule applied to the layer's real weights. */
static uint32_t true_set(flm_ffn_env *E, flm_sparse *sp, uint32_t l, const float *x, uint32_t *ids) {
    flm_bundle_desc bd = sp->desc[l]; /* every record in neuron order: b_up by neuron as it is */
    bd.up_bias = sp->b_up ? sp->b_up[l] : NULL;
    const flm_bundle_desc *b = &bd;
    const flm_predictor_layer *S = &sp->sp.layers[l];
    uint32_t n = 0, F = E->model->hp.d_ffn;
    if (S->rule == FLM_RULE_CONTRIB) { /* (h_i ||down_i||)^2 > tau^2 sum_j (h_j ||down_j||)^2, every h_i computed */
        E->be->ops->bundles(E->be, b, sp->full[l], NULL, F, x, sp->tmp_out, sp->z, E->flash->acc);
        return flm_contrib_set(sp->z, sp->dn[l], F, S->threshold, sp->z, ids);
    }
    uint32_t t = b->gated ? b->gate_type : b->up_type;
    uint64_t off = b->gated ? b->gate_off : b->up_off;
    const float *bias = b->gated ? NULL : b->up_bias; /* the rule's pre-activation: up . x + b_up ungated */
    for (uint32_t i = 0; i < F; i++) {
        float g = E->k->dot[t](sp->full[l] + i * b->record_bytes + off, x, b->d_model) + (bias ? bias[i] : 0.0f);
        bool on = S->rule == FLM_RULE_RELU ? g > 0.0f : fabsf(flm_act_eval(FLM_ACT_SILU, g)) > S->threshold;
        if (on) ids[n++] = i;
    }
    return n;
}

/* The predictor (sparsity/predictor.h) with f16 weights: h = A x, z = B h + c, ids = {i : z_i > threshold}. */
static uint32_t predict_f16(flm_ffn_env *E, flm_sparse *sp, uint32_t l, const float *x) {
    const flm_predictor *p = &sp->sp.layers[l].pred;
    return flm_predictor_predict_f16(E->k, p, sp->A16[l], sp->B16[l], p->threshold, x, sp->pscratch, sp->ids,
                                     E->params->n_threads);
}

/* Neurons by descending logit; ties by the order of the sums (order_ids) so that the split does not depend on how
 * the records are stored. */
typedef struct {
    const float *z;
    const uint32_t *orig; /* the layer's original order, or NULL */
} logit_key;
static int cmp_desc_logit(const void *a, const void *b, void *u) {
    const logit_key *k = u;
    const uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    const float x = k->z[i], y = k->z[j];
    if (x < y) return 1;
    if (x > y) return -1;
    const uint32_t oi = k->orig ? k->orig[i] : i, oj = k->orig ? k->orig[j] : j;
    return oi < oj ? -1 : oi > oj;
}
static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}
static int cmp_by_key(const void *a, const void *b, void *key) {
    const uint32_t *k = key, x = k[*(const uint32_t *)a], y = k[*(const uint32_t *)b];
    return x < y ? -1 : x > y;
}
/* ids[0 .. n) of layer l in the order the FFN sums them: by id, or, in a file stored in co-activation order, by the
 * id each neuron had before (flm_predictor_layer.orig), so that the sums are bit for bit those of the file before the
 * order (the same neurons, added in the same order). `sorted`: ids are ascending already. */
static void order_ids(const flm_sparse *sp, uint32_t l, uint32_t *ids, uint32_t n, bool sorted) {
    const uint32_t *o = sp->sp.layers[l].orig;
    if (o) qsort_r(ids, n, sizeof *ids, cmp_by_key, (void *)o);
    else if (!sorted) qsort(ids, n, sizeof *ids, cmp_u32);
}
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
/* The order the FFN sums ids[0 .. n) (ascending: as the neuron cache takes them) with their rows (order_ids): *cids and
 * *crows get the same pairs by original id (sp->oids, sp->orows) in a file stored in co-activation order, else ids
 * and rows themselves. */
static void compute_order(flm_sparse *sp, uint32_t l, const uint32_t *ids, const uint32_t *rows, uint32_t n,
                          const uint32_t **cids, const uint32_t **crows) {
    const uint32_t *o = sp->sp.layers[l].orig;
    if (!o || !sp->okey) {
        *cids = ids;
        *crows = rows;
        return;
    }
    for (uint32_t j = 0; j < n; j++) sp->okey[j] = (uint64_t)o[ids[j]] << 32 | j;
    qsort(sp->okey, n, sizeof *sp->okey, cmp_u64);
    for (uint32_t k = 0; k < n; k++) {
        const uint32_t j = (uint32_t)sp->okey[k];
        sp->oids[k] = ids[j];
        sp->orows[k] = rows[j];
    }
    *cids = sp->oids;
    *crows = sp->orows;
}

/* The last small batch of layer l entered the window as one set (the union of its tokens' sets). When this
 * evaluation starts inside it (its later tokens were rejected drafts), the set is trimmed to the accepted tokens'
 * neurons; when it starts before it, the set leaves the window. */
static flm_status settle(flm_sparse *sp, uint32_t l, int32_t pos, flm_error *err) {
    if (!sp->pend_n || !sp->pend_n[l]) return FLM_OK;
    const uint32_t n = sp->pend_n[l];
    sp->pend_n[l] = 0;
    const int32_t a = pos - sp->pend_start[l]; /* tokens of the batch that stay */
    if (a >= (int32_t)n) return FLM_OK;
    if (a <= 0) {
        flm_ncache_unstep(sp->cache[l]);
        return FLM_OK;
    }
    const uint64_t *bits = sp->pend_bits + (size_t)l * SPARSE_SPEC_TOKENS * sp->words;
    uint32_t k = 0;
    for (uint32_t w = 0; w < sp->words; w++) {
        uint64_t any = 0;
        for (int32_t t = 0; t < a; t++) any |= bits[(size_t)t * sp->words + w];
        for (; any; any &= any - 1) sp->true_ids[k++] = w * 64u + (uint32_t)__builtin_ctzll(any);
    }
    return flm_ncache_trim_newest(sp->cache[l], sp->true_ids, k, err);
}

/* Stream the records of neurons ids[0 .. ns) of layer l through the stream buffer and call
 * fn(E, sp, records, j0, m, user) for each chunk ids[j0 .. j0 + m) (record j of the chunk at records + j *
 * record_bytes), in order. With the read-ahead thread the buffer's two halves alternate, chunks of
 * SPARSE_STREAM_ROWS / 2: the next chunk is read while the current one is computed; without it, chunks of
 * SPARSE_STREAM_ROWS are read and computed in turn. The reader coalesces neighbours by its cost model. I/O counts
 * as the time the computation waits. Errors: the read's, naming the region (nothing is left in flight). */
typedef void (*chunk_fn)(flm_ffn_env *E, flm_sparse *sp, const uint8_t *records, uint32_t j0, uint32_t m, void *user);

static void chunk_extents(const flm_ffn_env *E, flm_sparse *sp, uint32_t l, const uint32_t *ids, uint32_t m,
                          uint8_t *dst, flm_extent *ext) {
    const flm_region *r = E->flash->file->ffn[l];
    const uint64_t rb = sp->desc[l].record_bytes;
    for (uint32_t j = 0; j < m; j++) ext[j] = (flm_extent){r->offset + (uint64_t)ids[j] * rb, rb, dst + (size_t)j * rb};
}

/* With the read-ahead thread: start reading the first chunk (stream_chunks then continues with started = true), so
 * it arrives while the cached neurons are computed. */
static bool stream_start(flm_ffn_env *E, flm_sparse *sp, uint32_t l, const uint32_t *ids, uint32_t ns) {
    if (!sp->ahead || !ns) return false;
    const uint32_t chunk = SPARSE_STREAM_ROWS / 2, m0 = ns < chunk ? ns : chunk;
    chunk_extents(E, sp, l, ids, m0, sp->sbuf, sp->ext);
    flm_async_read_submit(sp->ahead, sp->ext, m0, 0);
    return true;
}

static flm_status stream_chunks(flm_ffn_env *E, flm_sparse *sp, uint32_t l, const uint32_t *ids, uint32_t ns,
                                bool started, chunk_fn fn, void *user, flm_token_stats *tok, flm_error *err) {
    flm_flash *fl = E->flash;
    const uint64_t rb = sp->desc[l].record_bytes;
    const uint32_t F = E->model->hp.d_ffn;
    const uint32_t chunk = sp->ahead ? SPARSE_STREAM_ROWS / 2 : SPARSE_STREAM_ROWS;
    uint8_t *half[2] = {sp->sbuf, sp->sbuf + (size_t)(SPARSE_STREAM_ROWS / 2) * rb};
    flm_extent *ext[2] = {sp->ext, sp->ext + F}; /* ext holds 3 d_ffn entries; a chunk at most d_ffn */
    if (!started) stream_start(E, sp, l, ids, ns);
    for (uint32_t j0 = 0, k = 0; j0 < ns; j0 += chunk, k++) {
        uint32_t m = ns - j0 < chunk ? ns - j0 : chunk;
        flm_io_stats io = {0};
        flm_status st = FLM_OK;
        double t0 = flm_now_ms();
        if (sp->ahead) {
            uint64_t tag;
            flm_async_read_wait(sp->ahead, &tag, &st, err, &io);
        } else {
            chunk_extents(E, sp, l, ids + j0, m, sp->sbuf, sp->ext);
            st = flm_reader_read(fl->reader, sp->ext, m, &io, err);
        }
        tok->io_ms += flm_now_ms() - t0;
        flm_io_stats_add(E->io, &io);
        tok->bytes_read += io.bytes_read;
        tok->n_reads += io.n_requests;
        if (st) return flm_flash_region_error(fl, l, st, err);
        const uint8_t *recs = sp->ahead ? half[k & 1] : sp->sbuf;
        uint32_t j1 = j0 + chunk;
        if (sp->ahead && j1 < ns) { /* the next chunk into the other half while this one is computed */
            uint32_t m1 = ns - j1 < chunk ? ns - j1 : chunk;
            chunk_extents(E, sp, l, ids + j1, m1, half[(k + 1) & 1], ext[(k + 1) & 1]);
            flm_async_read_submit(sp->ahead, ext[(k + 1) & 1], m1, k + 1);
        }
        fn(E, sp, recs, j0, m, user);
        tok->n_loaded += m;
        sp->streamed += m;
    }
    return FLM_OK;
}

/* one token's streamed chunk: out += FFN over the chunk's records */
typedef struct {
    const float *in;
    float *out;
    uint32_t l;
    const uint32_t *ids; /* the streamed neurons */
} token_chunk;

static void token_chunk_fn(flm_ffn_env *E, flm_sparse *sp, const uint8_t *records, uint32_t j0, uint32_t m, void *user) {
    token_chunk *c = user;
    flm_bundle_desc tmp;
    const flm_bundle_desc *b = rows_desc(sp, c->l, c->ids + j0, NULL, m, &tmp);
    E->be->ops->bundles(E->be, b, records, NULL, m, c->in, sp->tmp_out, E->s->hb, E->flash->acc);
    for (uint32_t i = 0; i < b->d_model; i++) c->out[i] += sp->tmp_out[i];
}

/* one token at position pos */
static flm_status sparse_token(flm_ffn_env *E, uint32_t l, int32_t pos, const float *in, float *out,
                               flm_token_stats *tok, flm_error *err) {
    flm_flash *fl = E->flash;
    flm_sparse *sp = E->state;
    flm_status sst = settle(sp, l, pos, err);
    if (sst) return sst;
    const flm_params *pp = E->params;
    const flm_predictor_layer *S = &sp->sp.layers[l];
    uint32_t n;
    /* 1. which neurons (compute). The first token of a sequence runs dense: its FFN outputs carry the massive
     * activations later tokens attend to (the attention sink), which predictors miss (measured on SmolLM2: held-out
     * perplexity +1.3% with the predictor at the first token, +0.5% without, at 99.7% of neurons predicted). */
    if (pos == 0) {
        n = E->model->hp.d_ffn;
        for (uint32_t i = 0; i < n; i++) sp->ids[i] = i;
    } else if (pp->no_predictor) {
        n = true_set(E, sp, l, in, sp->ids);
    } else {
        n = predict_f16(E, sp, l, in);
        if (pp->verify_predictor) {
            uint32_t nt = true_set(E, sp, l, in, sp->true_ids), tp = 0;
            for (uint32_t i = 0, j = 0; i < nt && j < n;) { /* both sorted */
                if (sp->true_ids[i] == sp->ids[j]) { tp++; i++; j++; }
                else if (sp->true_ids[i] < sp->ids[j]) i++;
                else j++;
            }
            tok->n_true += nt;
            tok->n_true_pos += tp;
        }
    }
    uint32_t cap = flm_ncache_capacity(sp->cache[l]), n_all = n;
    if (n > cap) { /* the most confident go through the cache; the rest, ids[cap .. n_all), are streamed below */
        if (!pp->no_predictor && pos != 0) {
            logit_key key = {sp->pscratch + S->pred.rank, S->orig};
            qsort_r(sp->ids, n, sizeof *sp->ids, cmp_desc_logit, &key);
        } else { /* position 0 predicted nothing: its ids stay in (the original) order */
            order_ids(sp, l, sp->ids, n, true);
        }
        n = cap;
        qsort(sp->ids, n, sizeof *sp->ids, cmp_u32); /* ascending, as the cache takes them */
        order_ids(sp, l, sp->ids + n, n_all - n, false); /* the streamed ones in the order of the sums */
    }
    /* 2. the window (memory management) */
    double t0 = flm_now_ms();
    if (pp->no_window) flm_ncache_reset(sp->cache[l]); /* predictor-only loading: nothing reused */
    flm_ncache_stats cs;
    const uint32_t *load_ids, *rows;
    uint8_t *const *load_rows;
    flm_status st = flm_ncache_step(sp->cache[l], sp->ids, n, &cs, &load_ids, &load_rows, &rows, err);
    double t1 = flm_now_ms();
    tok->mem_ms += t1 - t0;
    if (st) return st;
    /* 3. read the missing bundles (flash I/O) */
    const flm_region *r = fl->file->ffn[l];
    flm_bundle_desc tmp;
    const flm_bundle_desc *b = &sp->desc[l];
    if (cs.n_loaded) {
        flm_io_stats before = *E->io;
        if (!pp->no_bundle) {
            for (uint32_t j = 0; j < cs.n_loaded; j++)
                sp->ext[j] = (flm_extent){r->offset + (uint64_t)load_ids[j] * b->record_bytes, b->record_bytes,
                                          load_rows[j]};
            st = flm_reader_read(fl->reader, sp->ext, cs.n_loaded, E->io, err);
        } else { /* ablation: up, gate and down parts as separate requests, one matrix after the other */
            uint64_t part_off[3] = {b->up_off, b->gate_off, b->down_off};
            uint64_t part_len[3] = {b->gate_off - b->up_off, b->down_off - b->gate_off, b->record_bytes - b->down_off};
            for (int q = 0; q < 3 && !st; q++) {
                if (!part_len[q]) continue;
                for (uint32_t j = 0; j < cs.n_loaded; j++)
                    sp->ext[j] = (flm_extent){r->offset + (uint64_t)load_ids[j] * b->record_bytes + part_off[q],
                                              part_len[q], load_rows[j] + part_off[q]};
                st = flm_reader_read(fl->reader, sp->ext, cs.n_loaded, E->io, err);
            }
            if (!st && flm_reader_checks(fl->reader)) { /* each record whole now: checked against its sum */
                for (uint32_t j = 0; j < cs.n_loaded; j++)
                    sp->ext[j] = (flm_extent){r->offset + (uint64_t)load_ids[j] * b->record_bytes, b->record_bytes,
                                              load_rows[j]};
                st = flm_reader_check(fl->reader, sp->ext, cs.n_loaded, E->io, err);
            }
        }
        tok->io_ms += flm_now_ms() - t1;
        tok->bytes_read += E->io->bytes_read - before.bytes_read;
        tok->n_reads += E->io->n_requests - before.n_requests;
        if (st) { /* the appended rows hold bytes never read: take the token's set back out of the window */
            flm_ncache_unstep(sp->cache[l]);
            return flm_flash_region_error(fl, l, st, err);
        }
    }
    tok->n_predicted += n_all;
    tok->n_loaded += cs.n_loaded;
    tok->n_reused += cs.n_reused;
    tok->rows_used += cs.rows_used;
    /* 4. the FFN over the predicted set's rows (compute), while the first streamed chunk (if any) arrives */
    bool started = stream_start(E, sp, l, sp->ids + n, n_all - n);
    const uint32_t *cids, *crows;
    compute_order(sp, l, sp->ids, rows, n, &cids, &crows);
    E->be->ops->bundles(E->be, rows_desc(sp, l, cids, crows, n, &tmp), flm_ncache_matrix(sp->cache[l]), crows, n,
                        in, out, E->s->hb, fl->acc);
    /* 5. a set larger than the cache: the rest read into the stream buffer, computed, discarded */
    if (n_all > n) {
        token_chunk c = {in, out, l, sp->ids + n};
        return stream_chunks(E, sp, l, sp->ids + n, n_all - n, started, token_chunk_fn, &c, tok, err);
    }
    return FLM_OK;
}

/* a batch's streamed chunk: each token's output += the FFN over the chunk's records in its own set */
typedef struct {
    uint32_t n;
    const float *in;
    size_t in_stride;
    float *out;
    size_t out_stride;
    uint32_t l;
    const uint8_t *M;          /* [n][d_ffn] the tokens' sets */
    const uint32_t *stream_ids;
} batch_chunk;

static void batch_chunk_fn(flm_ffn_env *E, flm_sparse *sp, const uint8_t *records, uint32_t j0, uint32_t m, void *user) {
    batch_chunk *c = user;
    const uint32_t F = E->model->hp.d_ffn, d = E->model->hp.d_model;
    uint8_t *R = sp->bmask_rows;
    float *part = sp->bpart; /* [n][d_model] partial outputs */
    for (uint32_t t = 0; t < c->n; t++)
        for (uint32_t j = 0; j < m; j++) R[(size_t)t * m + j] = c->M[(size_t)t * F + c->stream_ids[j0 + j]];
    flm_bundle_desc tmp;
    E->be->ops->bundles_batch(E->be, rows_desc(sp, c->l, c->stream_ids + j0, NULL, m, &tmp), records, NULL, m, R,
                              m, c->n, c->in, c->in_stride, part, d, E->flash->acc);
    for (uint32_t t = 0; t < c->n; t++)
        for (uint32_t i = 0; i < d; i++) c->out[t * c->out_stride + i] += part[(size_t)t * d + i];
}

/* A batch of n tokens (prompt chunks, draft verification): each token's predicted set (the first token of a
 * sequence: every neuron), then the union U of the sets is read once and each token is computed over its own set.
 *   |U| <= the layer's cache: U enters the window as one step (only the neurons not cached are read), and the
 *     tokens are computed from the cache's rows.
 *   |U| >  the cache (a long prompt's union nears the whole layer): the window is left as it is (decoding after the
 *     prompt keeps it); the cached neurons of U are computed in place and the rest are read SPARSE_STREAM_ROWS at a
 *     time into the stream buffer. The reader merges neighbouring records whose gap costs less to read than a
 *     request (its cost model: the disk probe's latency x bandwidth, docs/IO.md), so a dense union is read as a few
 *     large sequential requests, a sparse one neuron by neuron.
 * The ablations (--no-window, --no-bundle, --no-predictor, --verify-predictor) run token by token. */
static flm_status sparse_compute(flm_ffn_env *E, const flm_ffn_call *c, flm_error *err) {
    return sparse_token(E, c->layer, c->pos, c->in, c->out, c->tok, err);
}

static flm_status sparse_compute_batch(flm_ffn_env *E, const flm_ffn_call *c, flm_error *err) {
    flm_flash *fl = E->flash;
    flm_sparse *sp = E->state;
    const flm_params *pp = E->params;
    const uint32_t l = c->layer, n = c->n;
    const int32_t pos0 = c->pos;
    const float *in = c->in;
    const size_t in_stride = c->in_stride, out_stride = c->out_stride;
    float *out = c->out;
    flm_token_stats *tok = c->tok;
    const uint32_t F = E->model->hp.d_ffn, d = E->model->hp.d_model;
    flm_status sst = settle(sp, l, pos0, err);
    if (sst) return sst;
    if (pp->no_window || pp->no_bundle || pp->no_predictor || pp->verify_predictor || n > sp->n_batch) {
        for (uint32_t t = 0; t < n; t++) {
            flm_status st = sparse_token(E, l, pos0 + (int32_t)t, in + t * in_stride, out + t * out_stride, tok, err);
            if (st) return st;
        }
        return FLM_OK;
    }
    /* 1. each token's set, and their union (compute) */
    uint8_t *M = sp->bmask;
    uint32_t nu = 0;
    { /* the predictors of all tokens as matrix-matrix products: H = A X [n][rank], Z = B H + c [n][d_ffn] */
        const flm_predictor *p = &sp->sp.layers[l].pred;
        float *H = E->s->bh2, *Z = E->s->bh; /* n_batch * d_ffn floats each, unused by the bundle kernels */
        flm_matmat(E->k, FLM_TYPE_F16, sp->A16[l], p->rank, p->d_model, in, in_stride, n, H, p->rank,
                   pp->n_threads, E->be->work);
        flm_matmat(E->k, FLM_TYPE_F16, sp->B16[l], F, p->rank, H, p->rank, n, Z, F, pp->n_threads, E->be->work);
        for (uint32_t t = 0; t < n; t++) {
            uint8_t *mt = M + (size_t)t * F;
            if (pos0 + (int32_t)t == 0) { /* the first token of a sequence runs dense (sparse_compute) */
                memset(mt, 1, F);
                tok->n_predicted += F;
                continue;
            }
            const float *z = Z + (size_t)t * F;
            uint32_t np = 0;
            for (uint32_t i = 0; i < F; i++) {
                mt[i] = z[i] + p->c[i] > p->threshold;
                np += mt[i];
            }
            tok->n_predicted += np;
        }
    }
    for (uint32_t i = 0; i < F; i++) {
        uint8_t any = 0;
        for (uint32_t t = 0; t < n; t++) any |= M[(size_t)t * F + i];
        if (any) sp->ids[nu++] = i;
    }
    const flm_bundle_desc *b = &sp->desc[l];
    uint8_t *R = sp->bmask_rows;
    const uint32_t cap = flm_ncache_capacity(sp->cache[l]);
    if (nu <= cap) {
        /* 2. the union enters the window (memory management), 3. its missing neurons are read (flash I/O) */
        double t0 = flm_now_ms();
        flm_ncache_stats cs;
        const uint32_t *load_ids, *rows;
        uint8_t *const *load_rows;
        flm_status st = flm_ncache_step(sp->cache[l], sp->ids, nu, &cs, &load_ids, &load_rows, &rows, err);
        double t1 = flm_now_ms();
        tok->mem_ms += t1 - t0;
        if (st) return st;
        if (cs.n_loaded) {
            const flm_region *r = fl->file->ffn[l];
            for (uint32_t j = 0; j < cs.n_loaded; j++)
                sp->ext[j] = (flm_extent){r->offset + (uint64_t)load_ids[j] * b->record_bytes, b->record_bytes,
                                          load_rows[j]};
            flm_io_stats before = *E->io;
            st = flm_reader_read(fl->reader, sp->ext, cs.n_loaded, E->io, err);
            tok->io_ms += flm_now_ms() - t1;
            tok->bytes_read += E->io->bytes_read - before.bytes_read;
            tok->n_reads += E->io->n_requests - before.n_requests;
            if (st) {
                flm_ncache_unstep(sp->cache[l]);
                return flm_flash_region_error(fl, l, st, err);
            }
        }
        tok->n_loaded += cs.n_loaded;
        tok->n_reused += cs.n_reused;
        tok->rows_used += cs.rows_used;
        if (n <= SPARSE_SPEC_TOKENS && !pp->window_keep_rejected) { /* keep the tokens' sets (settle) */
            uint64_t *bits = sp->pend_bits + (size_t)l * SPARSE_SPEC_TOKENS * sp->words;
            memset(bits, 0, (size_t)n * sp->words * sizeof *bits);
            for (uint32_t t = 0; t < n; t++)
                for (uint32_t i = 0; i < F; i++)
                    if (M[(size_t)t * F + i]) bits[(size_t)t * sp->words + i / 64] |= 1ull << (i % 64);
            sp->pend_start[l] = pos0;
            sp->pend_n[l] = n;
        }
        /* 4. every token over its own set, from the cache's rows (compute) */
        const uint32_t *cids, *crows;
        compute_order(sp, l, sp->ids, rows, nu, &cids, &crows);
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t j = 0; j < nu; j++) R[(size_t)t * nu + j] = M[(size_t)t * F + cids[j]];
        flm_bundle_desc tmp;
        E->be->ops->bundles_batch(E->be, rows_desc(sp, l, cids, crows, nu, &tmp), flm_ncache_matrix(sp->cache[l]),
                                  crows, nu, R, nu, n, in, in_stride, out, out_stride, fl->acc);
        return FLM_OK;
    }
    /* larger than the cache: the cached part in place, the rest streamed (the window is kept for decoding) */
    uint32_t nc = 0, ns = 0;
    uint32_t *stream_ids = sp->true_ids; /* [d_ffn] scratch: the neurons to stream */
    for (uint32_t j = 0; j < nu; j++) {
        int32_t row = flm_ncache_row_of(sp->cache[l], sp->ids[j]);
        if (row < 0) {
            stream_ids[ns++] = sp->ids[j];
            continue;
        }
        sp->brows[nc] = (uint32_t)row;
        sp->ids[nc++] = sp->ids[j]; /* the cached ones, compacted in place (nc <= j) */
    }
    const uint32_t *cids, *crows; /* the order of the sums (order_ids) */
    compute_order(sp, l, sp->ids, sp->brows, nc, &cids, &crows);
    order_ids(sp, l, stream_ids, ns, true);
    for (uint32_t t = 0; t < n; t++) {
        for (uint32_t j = 0; j < nc; j++) R[(size_t)t * nc + j] = M[(size_t)t * F + cids[j]];
        memset(out + t * out_stride, 0, d * sizeof(float));
    }
    bool started = stream_start(E, sp, l, stream_ids, ns); /* arrives while the cached part is computed */
    flm_bundle_desc tmp;
    if (nc)
        E->be->ops->bundles_batch(E->be, rows_desc(sp, l, cids, crows, nc, &tmp), flm_ncache_matrix(sp->cache[l]),
                                  crows, nc, R, nc, n, in, in_stride, out, out_stride, fl->acc);
    tok->n_reused += nc;
    batch_chunk bc = {n, in, in_stride, out, out_stride, l, M, stream_ids};
    return stream_chunks(E, sp, l, stream_ids, ns, started, batch_chunk_fn, &bc, tok, err);
}

const flm_ffn_source_ops flm_ffn_sparse = {"sparse", sparse_plan, sparse_open, sparse_compute, sparse_close,
                                           sparse_compute_batch};


const flm_sparse *flm_ctx_sparse(const flm_ctx *ctx) {
    return ctx->ffn == &flm_ffn_sparse ? ctx->ffn_env.state : NULL;
}
