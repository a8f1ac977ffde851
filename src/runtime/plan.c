/* plan.c — the memory plan's one owner (docs/ARCHITECTURE.md, "Memory budget"): --mem resolved to bytes, the mode
 * `auto` runs and why, every part's bytes. flm_plan computes it from the file's headers; flm_open (context.c)
 * computes it with the same functions and carries it out; flm_plan_split shares one budget between a draft model and
 * a target. The parts themselves are sized by runtime/budget.c and the FFN sources' plan functions. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "core/error.h"
#include "core/files.h"
#include "core/util.h"
#include "core/types.h"
#include "compute/work.h"

_Static_assert((int)FLM_PLAN_EMBD_MEMORY == (int)FLM_EMBD_MEMORY && (int)FLM_PLAN_EMBD_FLASH == (int)FLM_EMBD_FLASH &&
                   (int)FLM_PLAN_EMBD_TIED == (int)FLM_EMBD_TIED && (int)FLM_PLAN_EMBD_UNSPLIT == (int)FLM_EMBD_UNSPLIT,
               "flm_plan_embd mirrors flm_embd_place");

uint64_t flm_plan_budget(const flm_params *p, uint64_t model_bytes) {
    if (p->mem_bytes) return p->mem_bytes;
    if (!(p->mem_percent > 0)) return 0;
    uint64_t b = (uint64_t)((double)model_bytes * p->mem_percent / 100.0);
    return b ? b : 1; /* a percentage is a budget, never "none" */
}

uint32_t flm_draft_vocab_rows(const flm_params *p, uint32_t n_vocab) {
    if (p->draft_vocab < 0) return n_vocab;
    const uint32_t dv = p->draft_vocab ? (uint32_t)p->draft_vocab
                        : n_vocab > 2u * FLM_DRAFT_VOCAB ? FLM_DRAFT_VOCAB : n_vocab;
    return dv < n_vocab ? dv : n_vocab;
}

uint32_t flm_plan_n_ctx(const flm_params *p, const flm_hparams *hp) {
    uint32_t n_ctx = (uint32_t)p->n_ctx;
    if (n_ctx == 0) n_ctx = hp->n_ctx_train < 2048 ? hp->n_ctx_train : 2048;
    return n_ctx ? n_ctx : 512;
}

/* bytes of one batch token's activations (flm_scratch_bytes's batch rows) */
static uint64_t batch_row_bytes(const flm_hparams *hp) {
    uint64_t q_dim = (uint64_t)hp->n_heads * hp->head_dim;
    uint64_t xb = flm_hparams_row(hp), kv_dim = (uint64_t)hp->n_kv_heads * hp->head_dim;
    return 4 * ((uint64_t)hp->d_model * 2 + xb + 2ull * hp->d_ffn + q_dim + 2 * kv_dim);
}

uint32_t flm_batch_size(const flm_params *p, const flm_hparams *hp, uint32_t n_ctx, uint64_t budget) {
    uint32_t b = p->n_batch > 0 ? (uint32_t)p->n_batch : 256u; /* one pass for most prompts: a pass reads every weight */
    if (p->n_batch <= 0 && budget) {
        uint64_t per = batch_row_bytes(hp) + 4ull * (uint64_t)(p->n_threads > 0 ? p->n_threads : 1) * hp->d_model;
        while (b > 1 && (uint64_t)b * per > budget / 64) b--;
    }
    if (b > n_ctx) b = n_ctx;
    return b ? b : 1;
}

uint32_t flm_scratch_tree_nodes(uint32_t n_ctx) { return n_ctx < FLM_TREE_MAX_NODES ? n_ctx : FLM_TREE_MAX_NODES; }

uint32_t flm_seq_hidden_rows(uint32_t n_ctx, uint32_t n_batch) {
    const uint32_t T = flm_scratch_tree_nodes(n_ctx), B = n_batch > 1 ? n_batch : 1;
    return T < B ? T : B;
}

uint64_t flm_scratch_work_bytes(const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, int n_threads) {
    uint64_t dim = flm_hparams_row(hp); /* the widest input of a matrix product: d_model, q_dim, d_embd or d_ffn */
    if (hp->d_ffn > dim) dim = hp->d_ffn;
    /* flm_matmat: the batch's quantized activations and one tile tmp per thread (at most 64) */
    const uint64_t slots = n_threads < 1 ? 1 : n_threads > 64 ? 64 : (uint64_t)n_threads;
    const uint64_t mm =
        n_batch > 1 ? (uint64_t)n_batch * flm_act_bytes_max(dim) + 64 + slots * flm_tile_tmp_bytes(dim, n_batch) : 0;
    const uint64_t att = flm_attention_batch_work(n_ctx, n_batch, hp->n_heads, hp->n_kv_heads, hp->head_dim, n_threads);
    const uint64_t ffn = flm_ffn_bundles_work(hp->d_model, n_batch, n_threads);
    /* flm_matvec_ws / flm_matvec_multi_ws (one token): x's quantized copies past their 16 KiB stack buffer */
    const uint64_t mv = FLM_MATVEC_ACT_MAX * (uint64_t)flm_act_bytes_max(dim);
    uint64_t w = mm > att ? mm : att;
    if (mv > w) w = mv;
    return w > ffn ? w : ffn;
}

uint64_t flm_scratch_bytes(const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, int n_threads) {
    uint64_t q_dim = (uint64_t)hp->n_heads * hp->head_dim;
    uint64_t xb = flm_hparams_row(hp), kv_dim = (uint64_t)hp->n_kv_heads * hp->head_dim;
    uint64_t one = (uint64_t)hp->d_model * 2 + xb + 2ull * hp->d_ffn + q_dim + 2 * kv_dim; /* a token's rows */
    uint64_t batch = n_batch > 1 ? (uint64_t)n_batch * batch_row_bytes(hp) : 0;
    const uint64_t T = flm_scratch_tree_nodes(n_ctx);
    const uint64_t tree = 4 * T + T * T + n_ctx;
    const uint64_t out_rows = 4ull * FLM_OUTPUT_ROWS_MAX(n_batch) * ((uint64_t)hp->d_model + hp->d_embd);
    const uint64_t embd = 12ull * hp->d_model; /* flm_embed's double sum and float row */
    return 4 * (one + (uint64_t)hp->n_heads * n_ctx + hp->n_vocab) + batch + tree + out_rows + embd +
           flm_scratch_work_bytes(hp, n_ctx, n_batch, n_threads) + FLM_STATS_TOKENS * sizeof(flm_token_stats);
}

/* the scratch carved from the context's block: activations, statistics ring, other sequences' logits rows, and one
 * FLM_CARVE_ALIGN of alignment per carve */
static uint64_t block_scratch(const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, int n_threads, uint32_t n_seq) {
    return flm_scratch_bytes(hp, n_ctx, n_batch, n_threads) + flm_seq_scratch_bytes(hp, n_ctx, n_batch, n_seq) +
           (FLM_CTX_CARVES + (uint64_t)n_seq) * FLM_CARVE_ALIGN;
}

uint64_t flm_plan_scratch(const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, int n_threads, uint32_t n_seq,
                          bool flash) {
    uint64_t s = block_scratch(hp, n_ctx, n_batch, n_threads, n_seq) + flm_compute_threads_bytes(n_threads);
    if (flash) s += 4ull * (uint64_t)n_threads * n_batch * hp->d_model + (uint64_t)hp->n_vocab * 96;
    return s;
}

uint64_t flm_ctx_block_bytes(const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, int n_threads, uint32_t n_seq,
                             uint32_t kv_elem) {
    const uint64_t kv = flm_kv_cache_bytes(hp->n_layers, n_ctx, hp->n_kv_heads * hp->head_dim, kv_elem);
    return n_seq * kv + block_scratch(hp, n_ctx, n_batch, n_threads, n_seq);
}

void flm_plan_devices(flm_plan_info *o, const flm_hparams *hp, const flm_params *p, const char *device) {
    const uint64_t block = flm_ctx_block_bytes(hp, o->n_ctx, o->n_batch, p->n_threads, flm_n_seq_of(p),
                                               o->kv_elem_bytes);
    memset(o->device, 0, sizeof o->device);
    flm_plan_device *host = &o->device[0];
    snprintf(host->name, sizeof host->name, "host");
    if (!device || !strcmp(device, "host")) { /* the CPU backend: everything in host memory, the block too */
        o->n_devices = 1;
        host->bytes = o->total;
        host->block = block;
        return;
    }
    o->n_devices = 2; /* a backend with memory of its own holds its block there; the host the rest */
    flm_plan_device *dev = &o->device[1];
    snprintf(dev->name, sizeof dev->name, "%s", device);
    dev->bytes = dev->block = block;
    host->bytes = o->total - block;
}

/* A .flm file's weight bytes: the resident region and the FFN regions (4 KiB-padded). */
static uint64_t file_weight_bytes(const flm_file *f) {
    uint64_t ffn, largest;
    flm_ffn_region_bytes(f, &ffn, &largest);
    return f->resident->size + ffn;
}

/* Refuse a budget that cannot hold the `bytes` of the resident region about to be loaded: the plan would refuse it
 * anyway, after loading them, and under a hard memory limit of the budget + FLM_RSS_ALLOWANCE the process would be
 * killed first. */
static flm_status resident_fits(const char *path, const flm_file *f, uint64_t budget, uint64_t bytes,
                                flm_error *err) {
    if (!budget || bytes <= budget) return FLM_OK;
    return flm_fail(err, FLM_ERR_BUDGET, "%s: a memory budget of %s is too small: the resident weights alone "
                    "(attention, norms, embeddings, tokenizer) are %.2f MiB (the whole model is %.2f MiB)", path,
                    flm_size(budget).s, flm_mib(bytes), flm_mib(file_weight_bytes(f)));
}

flm_status flm_plan_check_head(const char *path, const flm_file *f, const flm_params *p, flm_error *err) {
    const flm_region *r = f->resident;
    uint64_t bytes = r->head_bytes && r->head_bytes < r->size ? r->head_bytes : r->size;
    /* a classifier in the head may stay on flash in a mode that streams (flm_budget_plan): not loaded */
    const flm_gguf_tensor *o = f->meta && p->mode != FLM_MODE_RAM ? flm_gguf_find_tensor(f->meta, "output.weight") : NULL;
    if (o && o->nbytes < bytes) bytes -= o->nbytes;
    return resident_fits(path, f, flm_plan_budget(p, file_weight_bytes(f)), bytes, err);
}

static uint64_t chain_bytes(uint32_t n_vocab, uint32_t n_ctx, int n_draft) {
    uint64_t V = n_vocab, N = n_draft > 0 ? (uint64_t)n_draft : 0; /* the history counted though the session has it */
    return 4 * (N + 1) * V + 4 * (2 * (uint64_t)n_ctx + 1 + N + 1);
}

/* What a draft tree of `tree` nodes adds: its logits rows beyond n_draft + 1, the nodes drafted (token, parent,
 * score: FLM_SPEC_TREE_DRAFT of them). */
static uint64_t tree_bytes(uint32_t n_vocab, int tree) {
    uint64_t V = n_vocab, T = tree > 0 ? (uint64_t)tree : 0, D = tree > 0 ? (uint64_t)FLM_SPEC_TREE_DRAFT(tree) : 0;
    return 4 * (T * V + D * 3);
}

uint64_t flm_spec_buffer_bytes(uint32_t n_vocab, uint32_t n_ctx, const flm_spec_params *p, bool with_draft_model,
                               bool greedy) {
    (void)with_draft_model, (void)greedy; /* drafts draw with the target's noise: no draft distributions are kept */
    if (!p) return 0;
    return chain_bytes(n_vocab, n_ctx, p->n_draft) + (p->tree ? tree_bytes(n_vocab, p->tree) : 0);
}

/* Mode auto chose hot with neurons streamed (mp, planned under the whole budget): it decodes with the self-draft, a
 * tree of FLM_AUTO_DRAFT_TREE nodes FLM_AUTO_DRAFT_DEPTH deep, whose buffers (for sampling, the larger) the budget
 * holds beside the model and whose window of recently active neurons takes flm_params.draft_window (default
 * FLM_AUTO_DRAFT_WINDOW) of the FFN memory: the model is planned again under budget - buffers, with the classifier's
 * rows past the draft's vocabulary on flash when that at least doubles the share of neurons in memory (an untied
 * classifier; the reason says so). When that does not fit (or no longer streams), mp stays as it was, without
 * speculative decoding, and its reason says so. */
static flm_status plan_self_draft(const flm_file *f, const flm_hparams *hp, const flm_params *p,
                                  const flm_plan_request *rq, flm_mem_plan *mp) {
    flm_spec_params sp;
    memset(&sp, 0, sizeof sp);
    sp.n_draft = FLM_AUTO_DRAFT_DEPTH;
    sp.tree = FLM_AUTO_DRAFT_TREE;
    sp.self_draft = true;
    /* a session per sequence, each with its buffers */
    const uint64_t spec = flm_n_seq_of(p) * flm_spec_buffer_bytes(hp->n_vocab, rq->n_ctx, &sp, false, false);
    flm_plan_request r2 = *rq;
    r2.budget = rq->budget > spec ? rq->budget - spec : 0;
    r2.draft_window = p->draft_window > 0 ? p->draft_window : p->draft_window < 0 ? 0 : FLM_AUTO_DRAFT_WINDOW;
    flm_mem_plan with;
    flm_error e2;
    size_t n = strlen(mp->reason);
    if (!r2.budget || flm_budget_plan(f, hp, &r2, &with, &e2) || with.mode != FLM_MODE_HOT || !with.stream) {
        snprintf(mp->reason + n, sizeof mp->reason - n, "; no room for the self-draft's buffers (%.2f MiB): no "
                 "speculative decoding", flm_mib(spec));
        return FLM_OK;
    }
    /* the classifier past the draft's rows on flash instead, when that at least doubles the share of neurons the
     * self-draft computes from: a pass reads about the same bytes either way (the classifier's rows instead of as many
     * FFN bytes), but at a share as low as --mem 35% of Qwen2.5-Coder-1.5B leaves (3.8% + 0.9% of each layer) the
     * draft is right too rarely (1.9 tokens per pass, 18.5% + 4.6% with it on flash: 2.8-3.1); at 50% (17.3% + 4.3%
     * against 32% + 8%) the two measured alike, and the classifier stays */
    if (!with.out_flash && !rq->tied && rq->out_rows_draft > 0 && rq->out_rows_draft < hp->n_vocab) {
        flm_plan_request r3 = r2;
        r3.out_try = 1;
        flm_mem_plan alt;
        flm_error e3;
        if (!flm_budget_plan(f, hp, &r3, &alt, &e3) && alt.mode == FLM_MODE_HOT && alt.stream &&
            (!alt.budget || flm_mem_plan_total(&alt) <= alt.budget) && alt.hot_q16 >= 2ull * with.hot_q16) {
            n = strlen(alt.reason);
            snprintf(alt.reason + n, sizeof alt.reason - n, "; the classifier past the self-draft's %u rows is read "
                     "from flash, so that %.1f%% of every layer's neurons stay in memory for the draft, not %.1f%%",
                     rq->out_rows_draft, alt.hot_q16 / 655.36, with.hot_q16 / 655.36);
            with = alt;
        }
    }
    *mp = with;
    mp->spec = spec;
    mp->self_draft = true;
    mp->draft_tree = sp.tree;
    mp->draft_depth = sp.n_draft;
    n = strlen(mp->reason);
    snprintf(mp->reason + n, sizeof mp->reason - n, "; it decodes with the self-draft (a tree of %d nodes, %d deep)",
             sp.tree, sp.n_draft);
    return FLM_OK;
}

flm_status flm_plan_flm(const flm_file *f, const flm_hparams *hp, const flm_params *p, flm_mem_plan *mp,
                        struct flm_predictor_region **keep, flm_error *err) {
    const uint64_t budget = flm_plan_budget(p, file_weight_bytes(f));
    /* the token embedding: the resident region's tail stays in the file unless ram mode or a tied classifier needs
     * it now (then the whole region must fit before it is loaded); the budget plan decides for the other modes */
    const flm_gguf_tensor *ow = flm_gguf_find_tensor(f->meta, "output.weight");
    const bool tied = !ow;
    bool pending = flm_file_tail_bytes(f) && flm_file_tail_pending(f);
    if (pending && p->mode == FLM_MODE_RAM) {
        flm_status st = resident_fits(f->path, f, budget, f->resident->size, err);
        if (st) return st;
        pending = false;
    }
    const flm_gguf_tensor *e = flm_gguf_find_tensor(f->meta, "token_embd.weight");
    if (!e) return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor 'token_embd.weight' is missing", f->path);
    flm_plan_request rq = {flm_plan_n_ctx(p, hp), (uint32_t)p->n_batch, p->n_threads, p->mode, budget, p, keep,
                           flm_kv_elem_bytes(p),
                           pending ? FLM_EMBD_FLASH : tied ? FLM_EMBD_TIED
                           : flm_file_tail_bytes(f) ? FLM_EMBD_MEMORY : FLM_EMBD_UNSPLIT,
                           flm_row_bytes(e->type, e->ne[0]), p->no_read_ahead,
                           p->mode == FLM_MODE_HOT && p->draft_window > 0 ? p->draft_window : 0, tied,
                           tied ? flm_row_bytes(e->type, e->ne[0]) : flm_row_bytes(ow->type, ow->ne[0]),
                           flm_draft_vocab_rows(p, hp->n_vocab), 0};
    if (!tied && (ow->ne[1] != hp->n_vocab || hp->d_embd != ow->ne[0])) rq.out_row = 0; /* checked at load */
    flm_status st = flm_budget_plan(f, hp, &rq, mp, err);
    if (st || p->mode != FLM_MODE_AUTO || p->no_draft || mp->mode != FLM_MODE_HOT || !mp->stream) return st;
    return plan_self_draft(f, hp, p, &rq, mp);
}

void flm_plan_info_of(const flm_mem_plan *mp, const flm_hparams *hp, flm_plan_info *o) {
    memset(o, 0, sizeof *o);
    o->mode = mp->mode;
    snprintf(o->reason, sizeof o->reason, "%s", mp->reason);
    o->budget = mp->budget + mp->spec; /* the parts were planned under budget - spec */
    o->model_bytes = mp->model_bytes;
    o->total = flm_mem_plan_total(mp) + mp->spec;
    o->resident = mp->resident;
    o->kv = mp->kv;
    o->scratch = mp->scratch;
    o->reader = mp->reader;
    o->ffn_resident = mp->ffn_resident;
    o->stream = mp->stream;
    o->predictors = mp->predictors;
    o->cache = mp->cache;
    o->spec = mp->spec;
    o->self_draft = mp->self_draft;
    o->draft_tree = mp->draft_tree;
    o->draft_depth = mp->draft_depth;
    o->embd = (flm_plan_embd)mp->embd;
    o->embd_bytes = mp->embd_bytes;
    o->embd_row = mp->embd_row;
    o->reader_bounce = mp->reader_bounce;
    o->n_layers = hp->n_layers;
    o->n_resident_layers = mp->n_resident_layers;
    o->hot_share = mp->mode == FLM_MODE_HOT ? mp->hot_q16 / 65536.0 * (1.0 - mp->window_q16 / 65536.0) : 0.0;
    o->window_share = mp->mode == FLM_MODE_HOT ? mp->hot_q16 / 65536.0 * (mp->window_q16 / 65536.0) : 0.0;
    o->window = mp->mode == FLM_MODE_HOT ? mp->window : 0;
    o->n_stream_buffers = mp->stream && mp->mode != FLM_MODE_SPARSE ? mp->n_stream_buffers : 0;
    o->n_ctx = mp->n_ctx;
    o->n_batch = mp->n_batch;
    o->kv_elem_bytes = mp->kv_elem_bytes;
    o->kv_dim = hp->n_kv_heads * hp->head_dim;
    o->n_vocab = hp->n_vocab;
    o->out_flash_bytes = mp->out_flash ? (uint64_t)(hp->n_vocab - mp->out_rows_res) * mp->out_row : 0;
    o->out_rows_resident = mp->out_flash ? mp->out_rows_res : hp->n_vocab;
    o->out_chunk = mp->out_flash ? (uint64_t)mp->out_chunk_rows * mp->out_row : 0;
}

/* ---- GGUF: every weight mapped ---------------------------------------------------------------------------------- */

flm_status flm_plan_gguf_open(const char *path, const flm_params *p, flm_gguf_file **out, flm_error *err) {
    *out = NULL;
    struct stat sb; /* a FIFO or a device: refused by name, never opened (an open would wait for a writer) */
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return flm_fail(err, FLM_ERR_IO, "%s: is %s, not a regular file: a model must be a file", path,
                        flm_file_kind(sb.st_mode));
    if (p->mode != FLM_MODE_AUTO && p->mode != FLM_MODE_RAM) {
        FILE *fp = fopen(path, "rb"); /* a missing file is that, not a GGUF in the wrong mode */
        if (!fp) return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        fclose(fp);
        return flm_fail(err, FLM_ERR_ARG, "%s: --mode %s needs a .flm file; convert it first with "
                        "`flashlm convert %s OUT.flm`", path, flm_mode_name(p->mode), path);
    }
    flm_status st = flm_gguf_open(path, out, err);
    if (st) {
        FILE *fp = fopen(path, "rb");
        char magic[4] = {0};
        bool is_gguf = fp && fread(magic, 1, 4, fp) == 4 && !memcmp(magic, "GGUF", 4);
        if (fp) fclose(fp);
        if (fp && !is_gguf) /* neither magic: say so rather than blame the GGUF header */
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: not a model file: neither a .flm (magic \"FLASHLM\") nor a "
                          "GGUF (magic \"GGUF\") file", path);
    }
    return st;
}

flm_status flm_plan_gguf(const char *path, uint64_t file_bytes, const flm_hparams *hp, const flm_params *p,
                         flm_plan_info *o, flm_error *err) {
    memset(o, 0, sizeof *o);
    o->mode = FLM_MODE_RAM;
    o->gguf = true;
    snprintf(o->reason, sizeof o->reason, "a GGUF file runs with every weight mapped in memory (`flashlm convert` "
             "makes a .flm that streams)");
    o->budget = flm_plan_budget(p, file_bytes);
    o->model_bytes = file_bytes;
    o->resident = file_bytes;
    o->n_ctx = flm_plan_n_ctx(p, hp);
    o->n_batch = flm_batch_size(p, hp, o->n_ctx, o->budget);
    o->kv_elem_bytes = flm_kv_elem_bytes(p);
    const uint32_t n_seq = flm_n_seq_of(p); /* a KV cache and a logits row per sequence */
    o->kv = n_seq * flm_kv_cache_bytes(hp->n_layers, o->n_ctx, hp->n_kv_heads * hp->head_dim, o->kv_elem_bytes);
    o->scratch = flm_plan_scratch(hp, o->n_ctx, o->n_batch, p->n_threads, n_seq, false);
    o->total = o->resident + o->kv + o->scratch;
    o->embd = FLM_PLAN_EMBD_MEMORY;
    o->n_layers = o->n_resident_layers = hp->n_layers;
    o->kv_dim = hp->n_kv_heads * hp->head_dim;
    o->n_vocab = hp->n_vocab;
    if (o->budget && o->total > o->budget)
        return flm_fail(err, FLM_ERR_BUDGET, "%s: a memory budget of %s cannot hold this GGUF model in memory "
                        "(weights %.2f MiB + KV cache %.2f MiB + scratch %.2f MiB); to stream its FFN weights, "
                        "convert it: `flashlm convert %s OUT.flm`", path, flm_size(o->budget).s, flm_mib(o->resident),
                        flm_mib(o->kv), flm_mib(o->scratch), path);
    return FLM_OK;
}

/* ---- flm_plan ---------------------------------------------------------------------------------------------------- */

/* Parse the GGUF header at the start of f's resident region into f->meta (tensor data not read): the first 256 KiB,
 * then twice as much until the header fits. */
flm_status flm_plan_read_meta(flm_file *f, flm_error *err) {
    const flm_region *r = f->resident;
    int fd = open(f->path, O_RDONLY);
    if (fd < 0) return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", f->path, strerror(errno));
    char name[4096];
    snprintf(name, sizeof name, "%s (resident region)", f->path);
    uint64_t n = r->size < (256u << 10) ? r->size : (256u << 10), have = 0;
    uint8_t *buf = NULL;
    flm_status st;
    for (;;) {
        uint8_t *nb = realloc(buf, n ? (size_t)n : 1);
        if (!nb) { st = flm_fail(err, FLM_ERR_NOMEM, "out of memory"); break; }
        buf = nb;
        while (have < n) {
            ssize_t k = pread(fd, buf + have, (size_t)(n - have), (off_t)(r->offset + have));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            have += (uint64_t)k;
        }
        if (have < n) {
            st = flm_fail(err, FLM_ERR_IO, "%s: resident region: short read at offset %llu", f->path,
                          (unsigned long long)(r->offset + have));
            break;
        }
        st = flm_gguf_open_buffer_partial(name, buf, (size_t)n, r->size, &f->meta, err);
        if (!st || n == r->size) break;
        n = n * 2 < r->size ? n * 2 : r->size;
    }
    close(fd);
    if (st) { free(buf); return st; }
    f->resident_data = buf; /* the meta borrows it; flm_file_close frees both */
    return FLM_OK;
}

static flm_status plan_any(const char *path, const flm_params *pin, flm_plan_info *out, flm_error *err);

flm_status flm_plan(const char *path, const flm_params *pin, flm_plan_info *out, flm_error *err) {
    flm_status st = plan_any(path, pin, out, err);
    if (st) memset(out, 0, sizeof *out); /* a refused plan holds nothing */
    return st;
}

static flm_status plan_any(const char *path, const flm_params *pin, flm_plan_info *out, flm_error *err) {
    memset(out, 0, sizeof *out);
    flm_params def;
    if (!pin) { flm_params_default(&def); pin = &def; }
    flm_status st = flm_params_check(pin, err);
    if (st) return st;
    if (!flm_file_is_flm(path)) {
        flm_gguf_file *g = NULL;
        if ((st = flm_plan_gguf_open(path, pin, &g, err))) return st;
        flm_hparams hp;
        if (!(st = flm_hparams_from_gguf(g, &hp, err)) && !(st = flm_plan_gguf(path, g->size, &hp, pin, out, err)))
            flm_plan_devices(out, &hp, pin, flm_backend_cpu.device); /* flm_open's backend */
        flm_gguf_close(g);
        return st;
    }
    flm_file *f = NULL;
    if ((st = flm_file_open_ex(path, FLM_FILE_HEADER_ONLY, &f, err))) return st;
    flm_hparams hp;
    flm_mem_plan mp;
    if (!(st = flm_plan_read_meta(f, err)) && !(st = flm_plan_check_head(path, f, pin, err)) &&
        !(st = flm_hparams_from_gguf(f->meta, &hp, err))) {
        if (!(st = flm_model_check_regions(f, &hp, err))) { /* as flm_open: a region it refuses plans nothing */
            if (!(st = flm_plan_flm(f, &hp, pin, &mp, NULL, err))) {
                flm_plan_info_of(&mp, &hp, out);
                flm_plan_devices(out, &hp, pin, flm_backend_cpu.device); /* flm_open's backend */
            }
        }
    }
    flm_file_close(f);
    return st;
}

void flm_get_plan(const flm_ctx *ctx, flm_plan_info *out) { *out = ctx->plan; }

/* ---- a draft and a target under one budget ----------------------------------------------------------------------- */

/* The target's weight bytes, as its plan counts them (a .flm's regions, a GGUF's size): the base of --mem N%. */
static flm_status weight_bytes(const char *path, uint64_t *out, flm_error *err) {
    *out = 0;
    if (flm_file_is_flm(path)) {
        flm_file *f = NULL;
        flm_status st = flm_file_open_ex(path, FLM_FILE_HEADER_ONLY, &f, err);
        if (st) return st;
        *out = file_weight_bytes(f);
        flm_file_close(f);
        return FLM_OK;
    }
    struct stat sb;
    if (stat(path, &sb) == 0) *out = (uint64_t)sb.st_size; /* else the target's plan says why, naming the file */
    return FLM_OK;
}

flm_status flm_plan_budget_bytes(const char *path, const flm_params *p, uint64_t *budget, flm_error *err) {
    *budget = 0;
    flm_params def;
    if (!p) { flm_params_default(&def); p = &def; }
    uint64_t w = 0;
    if (!p->mem_bytes && p->mem_percent > 0) {
        struct stat sb;
        if (!flm_file_is_flm(path) && stat(path, &sb) != 0) /* a model that is not there */
            return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        flm_status st = weight_bytes(path, &w, err);
        if (st) return st;
    }
    *budget = flm_plan_budget(p, w);
    return FLM_OK;
}

flm_status flm_plan_split(const char *target_path, const flm_params *target, const char *draft_path,
                          const flm_params *draft, uint64_t extra, flm_plan_pair *out, flm_error *err) {
    memset(out, 0, sizeof *out);
    flm_params tp, dp;
    if (target) tp = *target;
    else flm_params_default(&tp);
    if (draft) dp = *draft;
    else flm_params_default(&dp);
    uint64_t w = 0;
    flm_status st;
    if (!tp.mem_bytes && tp.mem_percent > 0 && (st = weight_bytes(target_path, &w, err))) return st;
    const uint64_t budget = flm_plan_budget(&tp, w);
    out->budget = budget;
    out->extra = extra;
    tp.mem_percent = dp.mem_percent = 0;
    if (draft_path) {
        dp.mem_bytes = budget; /* the draft alone must fit the whole budget; what it takes is checked below */
        flm_error e;
        if ((st = flm_plan(draft_path, &dp, &out->draft, &e))) {
            if (err) {
                *err = e;
                snprintf(err->msg, sizeof err->msg, "draft model: %.490s", e.msg);
            }
            return st;
        }
        const flm_plan_info *d = &out->draft;
        if (budget && d->total + extra >= budget)
            return flm_fail(err, FLM_ERR_BUDGET, "a memory budget of %s: the draft model %s takes %.2f MiB (weights "
                            "%.2f, KV cache %.2f, scratch %.2f) and %.2f MiB of buffers go with it: nothing is left "
                            "for the target model %s", flm_size(budget).s, draft_path, flm_mib(d->total + extra),
                            flm_mib(d->resident + d->ffn_resident + d->stream + d->predictors + d->cache),
                            flm_mib(d->kv), flm_mib(d->scratch + d->reader), flm_mib(extra), target_path);
        tp.mem_bytes = budget ? budget - d->total - extra : 0;
        st = flm_plan(target_path, &tp, &out->target, err);
        out->target.budget = tp.mem_bytes; /* what the target was given, also when its plan is refused */
        return st;
    }
    /* no draft model: the target keeps the whole budget when its plan leaves room for the buffers */
    tp.mem_bytes = budget;
    st = flm_plan(target_path, &tp, &out->target, err);
    out->target.budget = budget;
    if (st) return st;
    if (!budget || out->target.total + extra <= budget) return FLM_OK;
    if (extra >= budget)
        return flm_fail(err, FLM_ERR_BUDGET, "a memory budget of %s cannot hold %.2f MiB of buffers beside the model",
                        flm_size(budget).s, flm_mib(extra));
    tp.mem_bytes = budget - extra;
    st = flm_plan(target_path, &tp, &out->target, err);
    out->target.budget = tp.mem_bytes;
    return st;
}
