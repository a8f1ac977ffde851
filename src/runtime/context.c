/* context.c — opening a model into an flm_ctx; the public API's entry points. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "runtime/hooks.h"
#include "runtime/pass.h"
#include "runtime/runtime.h"
#include "sparsity/sparsity.h"
#include "core/error.h"
#include "core/util.h"

void flm_params_default(flm_params *p) {
    memset(p, 0, sizeof *p);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    p->n_threads = n > 0 ? (int)n : 1;
    p->n_ctx = 0;
    p->mode = FLM_MODE_AUTO;
    p->io = FLM_IO_KIND_AUTO;
    p->io_threads = 32;
}

static const char *MODE_NAMES[] = {"auto", "ram", "naive", "hybrid", "sparse", "hot"};

const char *flm_mode_name(flm_mode m) {
    return (unsigned)m < sizeof MODE_NAMES / sizeof *MODE_NAMES ? MODE_NAMES[m] : NULL;
}

bool flm_mode_parse(const char *s, flm_mode *out) {
    for (unsigned i = 0; i < sizeof MODE_NAMES / sizeof *MODE_NAMES; i++)
        if (!strcmp(s, MODE_NAMES[i])) { *out = (flm_mode)i; return true; }
    return false;
}

bool flm_parse_mem(const char *s, uint64_t *bytes, double *percent) {
    /* decimal digits with an optional fraction only: strtod alone would take hex ("0x10"), exponents, "inf", a sign
     * and leading blanks */
    size_t k = 0, frac = 0;
    while (s[k] >= '0' && s[k] <= '9') k++;
    if (!k) return false;
    if (s[k] == '.') {
        k++;
        while (s[k] >= '0' && s[k] <= '9') { k++; frac++; }
        if (!frac) return false;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end != s + k || !(v >= 0) || !isfinite(v)) return false;
    if (frac && !*end && v != floor(v)) return false; /* a fraction of a byte: "1.5" is not 1 byte */
    *bytes = 0;
    *percent = 0;
    if (!strcmp(end, "%")) {
        if (v <= 0 || v > 100000) return false;
        *percent = v;
        return true;
    }
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1024.0 * 1024; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
        default: return false;
        }
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (*end) return false;
    }
    if (v == 0) return true; /* 0: no budget */
    if (v * mul < 1 || v * mul > 9.0e18) return false;
    *bytes = (uint64_t)(v * mul);
    return true;
}

flm_status flm_scratch_init(flm_scratch *s, const flm_hparams *hp, uint32_t n_ctx, uint32_t n_batch, int n_threads,
                            flm_arena *a, flm_error *err) {
    size_t q_dim = (size_t)hp->n_heads * hp->head_dim;
    size_t xb = (size_t)flm_hparams_row(hp);
    memset(s, 0, sizeof *s);
#define CARVE(n) flm_arena_alloc(a, (uint64_t)(n) * sizeof(float), FLM_CARVE_ALIGN)
    s->x = CARVE(hp->d_model);
    s->xb = CARVE(xb);
    s->xb2 = CARVE(hp->d_model);
    s->hb = CARVE(hp->d_ffn);
    s->hb2 = CARVE(hp->d_ffn);
    s->q = CARVE(q_dim);
    s->k = CARVE((size_t)hp->n_kv_heads * hp->head_dim);
    s->v = CARVE((size_t)hp->n_kv_heads * hp->head_dim);
    s->att = CARVE((size_t)hp->n_heads * n_ctx);
    s->logits = CARVE(hp->n_vocab);
    bool batch_ok = true;
    if (n_batch > 1) {
        size_t kv_dim = (size_t)hp->n_kv_heads * hp->head_dim, B = n_batch;
        s->n_batch = n_batch;
        s->bx = CARVE(B * hp->d_model);
        s->bxb = CARVE(B * xb);
        s->bxb2 = CARVE(B * hp->d_model);
        s->bq = CARVE(B * q_dim);
        s->bk = CARVE(B * kv_dim);
        s->bv = CARVE(B * kv_dim);
        s->bh = CARVE(B * hp->d_ffn);
        s->bh2 = CARVE(B * hp->d_ffn);
        batch_ok = s->bx && s->bxb && s->bxb2 && s->bq && s->bk && s->bv && s->bh && s->bh2;
    }
#undef CARVE
    const uint64_t T = flm_scratch_tree_nodes(n_ctx), wb = flm_scratch_work_bytes(hp, n_ctx, n_batch, n_threads);
    s->tree = flm_arena_alloc(a, 4 * T + T * T + n_ctx, FLM_CARVE_ALIGN);
    s->out_rows = flm_arena_alloc(a, 4ull * FLM_OUTPUT_ROWS_MAX(n_batch) * ((uint64_t)hp->d_model + hp->d_embd),
                                  FLM_CARVE_ALIGN);
    s->embd_sum = flm_arena_alloc(a, 8ull * hp->d_model, FLM_CARVE_ALIGN);
    s->embd_row = flm_arena_alloc(a, 4ull * hp->d_model, FLM_CARVE_ALIGN);
    uint8_t *work = wb ? flm_arena_alloc(a, wb, FLM_CARVE_ALIGN) : NULL;
    s->work = (flm_arena){.base = work, .size = work ? wb : 0, .used = 0};
    if (!s->x || !s->xb || !s->xb2 || !s->hb || !s->hb2 || !s->q || !s->k || !s->v || !s->att || !s->logits ||
        !batch_ok || !s->tree || !s->out_rows || !s->embd_sum || !s->embd_row || (wb && !work)) {
        flm_scratch_free(s);
        return flm_fail(err, FLM_ERR_BUDGET, "the activations exceed the memory planned for them");
    }
    return FLM_OK;
}

void flm_scratch_free(flm_scratch *s) { memset(s, 0, sizeof *s); } /* the arrays belong to the arena */

flm_status flm_params_check(const flm_params *p, flm_error *err) {
    if (p->n_threads < 1 || p->n_threads > 1024 || p->n_ctx < 0 || !flm_mode_name(p->mode) || p->mem_percent < 0 ||
        p->n_batch < 0 || p->n_batch > 65536 || p->n_seq < 0 || p->n_seq > FLM_SEQ_MAX)
        return flm_fail(err, FLM_ERR_ARG, "bad parameters: threads %d (1..1024), context %d, batch %d (0..65536), "
                        "mode %d, sequences %d (0..%d)", p->n_threads, p->n_ctx, p->n_batch, (int)p->mode, p->n_seq,
                        FLM_SEQ_MAX);
    return FLM_OK;
}

/* Open a .flm file as its plan says: the plan first (runtime/plan.c: from the header and the resident region's GGUF
 * header, nothing loaded that the budget cannot hold), then the resident region (its tail too when the plan keeps
 * the token embedding in memory; without the classifier's rows the plan leaves on flash), the model, and
 * flm_flash_open carries out the rest. */
static flm_status open_flm(flm_ctx *ctx, const char *path, const flm_params *p, flm_error *err) {
    flm_file *ff = NULL;
    flm_hparams hp;
    flm_mem_plan mp;
    flm_predictor_region *sparsity = NULL; /* auto's check parsed the predictor region: sparse_open takes it */
    uint64_t *out_sums = NULL;     /* a classifier on flash: the sums of its units, made as the head loads */
    /* the plan from the header and the resident region's GGUF header (what flm_plan reads), then what it keeps */
    flm_status st = flm_file_open_ex(path, FLM_FILE_HEADER_ONLY, &ff, err);
    if (st || (st = flm_plan_read_meta(ff, err)) || (st = flm_plan_check_head(path, ff, p, err)) ||
        (st = flm_hparams_from_gguf(ff->meta, &hp, err)))
        goto fail;
    if (ff->n_layers != hp.n_layers) { /* before ffn[0]: a file without FFN regions has none (hp.n_layers >= 1) */
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: %u FFN regions for %u layers", path, ff->n_layers, hp.n_layers);
        goto fail;
    }
    hp.gated = ff->ffn[0]->gate_type != FLM_GATE_NONE;
    if ((st = flm_plan_flm(ff, &hp, p, &mp, &sparsity, err))) goto fail;
    const flm_gguf_tensor *ow = flm_gguf_find_tensor(ff->meta, "output.weight");
    if (mp.out_flash && ow) { /* the classifier's rows on flash lie in the head: load it without them */
        const uint64_t lo = ff->meta->data_offset + ow->offset + (uint64_t)mp.out_rows_res * mp.out_row;
        const uint64_t hi = ff->meta->data_offset + ow->offset + ow->nbytes, unit = FLM_OUT_UNIT_ROWS * mp.out_row;
        if (!(out_sums = malloc(((hi - lo + unit - 1) / unit + 1) * sizeof *out_sums))) {
            st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        if ((st = flm_file_load_head_skip(ff, lo, hi, unit, out_sums, err))) goto fail;
    } else { /* the head (and the tail when the plan keeps the token embedding), checksummed */
        flm_file_close(ff);
        ff = NULL;
        if ((st = flm_file_open_ex(path, FLM_FILE_LAZY_TAIL, &ff, err)) ||
            (flm_file_tail_pending(ff) && mp.embd != FLM_EMBD_FLASH && (st = flm_file_load_tail(ff, err))))
            goto fail;
    }
    if ((st = flm_model_from_flm(ff, &ctx->model, err))) goto fail;
    ctx->params.n_ctx = (int)mp.n_ctx;
    ctx->params.n_batch = (int)mp.n_batch;
    ctx->k = flm_kernels_best();
    flm_plan_info_of(&mp, &ctx->model->hp, &ctx->plan);
    st = flm_flash_open(ctx, ff, &mp, sparsity, out_sums, err); /* owns ff, sparsity and out_sums now */
    if (st) return st;
    ctx->mem_resident = ctx->flash->plan.resident;
    /* the reader's real size, when larger than planned */
    ctx->plan.reader = ctx->flash->plan.reader;
    ctx->plan.total = flm_mem_plan_total(&ctx->flash->plan) + ctx->flash->plan.spec;
    return FLM_OK;
fail:
    if (sparsity) flm_predictor_region_free(sparsity);
    free(sparsity);
    free(out_sums);
    flm_file_close(ff);
    return st;
}

/* Open a GGUF file: every weight mapped; the plan checks that the budget holds the whole file. */
static flm_status open_gguf(flm_ctx *ctx, const char *path, const flm_params *p, flm_error *err) {
    flm_gguf_file *f = NULL;
    flm_status st = flm_plan_gguf_open(path, p, &f, err);
    if (st || (st = flm_model_from_gguf(f, &ctx->model, err))) return st;
    ctx->mem_resident = f->size;
    ctx->ffn = &flm_ffn_mapped; /* every weight mapped: the dense FFN */
    ctx->k = flm_kernels_best();
    ctx->ffn_env = (flm_ffn_env){.be = &ctx->be, .k = ctx->k, .model = ctx->model, .params = &ctx->params, .s = &ctx->s,
                                 .io = &ctx->io, .log = &ctx->log};
    if ((st = flm_plan_gguf(path, f->size, &ctx->model->hp, p, &ctx->plan, err))) return st;
    flm_gguf_prefault(f); /* ram mode: every weight in memory from the start, not faulted in by the first pass */
    ctx->params.n_ctx = (int)ctx->plan.n_ctx;
    ctx->params.n_batch = (int)ctx->plan.n_batch;
    return FLM_OK;
}

flm_status flm_open(const char *path, const flm_params *p, flm_ctx **out, flm_error *err) {
    return flm_open_backend(path, p, &flm_backend_cpu, out, err);
}

flm_status flm_open_backend(const char *path, const flm_params *p, const flm_backend_ops *be, flm_ctx **out,
                            flm_error *err) {
    *out = NULL;
    flm_params def;
    if (!p) { flm_params_default(&def); p = &def; }
    flm_status st = flm_params_check(p, err);
    if (st) return st;
    flm_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    ctx->params = *p;
    ctx->log = (flm_logger){p->log, p->log_user};
    ctx->be = (flm_backend){.ops = be, .k = flm_kernels_best(), .n_threads = p->n_threads};
    if ((st = flm_file_is_flm(path) ? open_flm(ctx, path, p, err) : open_gguf(ctx, path, p, err))) {
        flm_close(ctx);
        return st;
    }
    const flm_hparams *hp = &ctx->model->hp;
    const uint32_t n_ctx = (uint32_t)ctx->params.n_ctx;
    /* KV caches (one per sequence), activations, the other sequences' logits rows and the per-token statistics
     * ring: one block of the planned size on the backend's device (the plan's share for it), carved */
    const uint32_t kv_elem = flm_kv_elem_bytes(p), n_seq = flm_n_seq_of(p);
    uint64_t kv_bytes = flm_kv_cache_bytes(hp->n_layers, n_ctx, hp->n_kv_heads * hp->head_dim, kv_elem);
    const uint32_t n_batch = (uint32_t)ctx->params.n_batch;
    flm_plan_devices(&ctx->plan, hp, p, be->device);
    const uint64_t mem = ctx->plan.device[ctx->plan.n_devices - 1].block; /* the host's, or the backend's device's */
    ctx->n_seq = n_seq;
    if (!(ctx->seq = calloc(n_seq, sizeof *ctx->seq)) || pthread_mutex_init(&ctx->seq_mu, NULL)) {
        flm_close(ctx);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for %u sequences", path, n_seq);
    }
    ctx->seq_mu_init = true;
    if (n_seq > 1) {
        if (pthread_mutex_init(&ctx->join_mu, NULL)) {
            flm_close(ctx);
            return flm_fail(err, FLM_ERR_NOMEM, "%s: cannot make a mutex", path);
        }
        pthread_condattr_t ca;
        bool cv_ok = pthread_condattr_init(&ca) == 0;
        if (cv_ok) {
            cv_ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&ctx->join_cv, &ca) == 0;
            pthread_condattr_destroy(&ca);
        }
        if (!cv_ok) {
            pthread_mutex_destroy(&ctx->join_mu);
            flm_close(ctx);
            return flm_fail(err, FLM_ERR_NOMEM, "%s: cannot make a condition variable", path);
        }
        ctx->join_init = true;
        const size_t B = n_batch ? n_batch : 1;
        ctx->join_tok = malloc(B * sizeof *ctx->join_tok);
        ctx->join_pos = malloc(B * sizeof *ctx->join_pos);
        ctx->join_kv = malloc(B * sizeof *ctx->join_kv);
        ctx->join_slot = malloc(B * sizeof *ctx->join_slot);
        ctx->join_tree = malloc(B * sizeof *ctx->join_tree);
        ctx->join_trees = calloc(n_seq, sizeof *ctx->join_trees);
        ctx->join_x = malloc(B * sizeof *ctx->join_x);
        ctx->join_dst = malloc(B * sizeof *ctx->join_dst);
        ctx->join_expect = calloc(n_seq, 1);
        ctx->seq_busy_ms = calloc(n_seq, sizeof *ctx->seq_busy_ms);
        ctx->seq_left_ms = calloc(n_seq, sizeof *ctx->seq_left_ms);
        if (!ctx->join_tok || !ctx->join_pos || !ctx->join_kv || !ctx->join_slot || !ctx->join_tree ||
            !ctx->join_trees || !ctx->join_x || !ctx->join_dst || !ctx->join_expect || !ctx->seq_busy_ms ||
            !ctx->seq_left_ms) {
            flm_close(ctx);
            return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for %u sequences", path, n_seq);
        }
    }
    if (ctx->be.ops->mem_init(&ctx->be, &ctx->mem, mem, NULL)) {
        flm_close(ctx);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: cannot allocate %llu bytes for the KV cache and activations", path,
                        (unsigned long long)mem);
    }
    bool carved = true;
    for (uint32_t i = 0; i < n_seq && carved; i++) { /* sequence 0's cache is be.kv; the others wait in seq[] */
        void *kv_mem = flm_arena_alloc(&ctx->mem, kv_bytes, FLM_CARVE_ALIGN);
        if (!(carved = kv_mem != NULL)) break;
        ctx->be.ops->kv_init(&ctx->be, hp->n_layers, n_ctx, hp->n_kv_heads * hp->head_dim, kv_elem, kv_mem);
        ctx->seq[i].kv = ctx->be.kv;
    }
    if (carved) ctx->be.kv = ctx->seq[0].kv;
    if (!carved || (st = flm_scratch_init(&ctx->s, hp, n_ctx, n_batch, p->n_threads, &ctx->mem, err)) ||
        !(ctx->tokens = flm_arena_alloc(&ctx->mem, FLM_STATS_TOKENS * sizeof *ctx->tokens, FLM_CARVE_ALIGN))) {
        flm_close(ctx);
        return flm_fail(err, FLM_ERR_BUDGET, "%s: the KV cache and activations exceed the %llu bytes planned", path,
                        (unsigned long long)mem);
    }
    ctx->be.work = &ctx->s.work;
    ctx->seq[0].logits = ctx->s.logits;
    if (n_seq > 1 && !(ctx->join_logits = flm_arena_alloc(&ctx->mem, (uint64_t)n_seq * hp->n_vocab * sizeof(float),
                                                          FLM_CARVE_ALIGN))) {
        flm_close(ctx);
        return flm_fail(err, FLM_ERR_BUDGET, "%s: the logits rows of %u sequences exceed the %llu bytes planned", path,
                        n_seq, (unsigned long long)mem);
    }
    for (uint32_t i = 1; i < n_seq; i++)
        if (!(ctx->seq[i].logits = flm_arena_alloc(&ctx->mem, (uint64_t)hp->n_vocab * sizeof(float),
                                                   FLM_CARVE_ALIGN))) {
            flm_close(ctx);
            return flm_fail(err, FLM_ERR_BUDGET, "%s: the logits rows of %u sequences exceed the %llu bytes planned",
                            path, n_seq, (unsigned long long)mem);
        }
    const uint64_t T = flm_scratch_tree_nodes(n_ctx); /* each sequence's tree (flm_seq_scratch_bytes) */
    for (uint32_t i = 0; i < n_seq && n_seq > 1; i++)
        if (!(ctx->seq[i].tree_mem = flm_arena_alloc(&ctx->mem, 4 * T + T * T, FLM_CARVE_ALIGN)) ||
            !(ctx->seq[i].hidden = flm_arena_alloc(&ctx->mem, 4ull * flm_seq_hidden_rows(n_ctx, n_batch) * hp->d_model,
                                                   FLM_CARVE_ALIGN))) {
            flm_close(ctx);
            return flm_fail(err, FLM_ERR_BUDGET, "%s: the trees of %u sequences exceed the %llu bytes planned", path,
                            n_seq, (unsigned long long)mem);
        }
    ctx->params.io_cost_path = NULL; /* the caller's string is only read during open */
    ctx->io_busy_base = flm_ctx_io_busy_ns(ctx); /* the load's reads are not the statistics' */
    *out = ctx;
    return FLM_OK;
}

void flm_set_log_callback(flm_ctx *ctx, flm_log_fn fn, void *user) {
    if (!ctx) return;
    ctx->log = (flm_logger){fn, user};
    ctx->params.log = fn;
    ctx->params.log_user = user;
}

/* The current sequence's state back into seq[cur_seq] (park), and out of it (unpark). */
static void seq_park(flm_ctx *ctx) {
    flm_seq_state *q = &ctx->seq[ctx->cur_seq]; /* its tree_mem and hidden stay (the sequence's own) */
    q->kv = ctx->be.kv;
    q->logits = ctx->s.logits;
    q->next_pos = ctx->next_pos;
    q->tree_pos = ctx->tree_pos;
    q->tree_n = ctx->tree_n;
    q->tree_hidden = ctx->tree_hidden;
    q->tree_hidden_first = ctx->tree_hidden_first;
}

static void seq_unpark(flm_ctx *ctx) {
    const flm_seq_state *n = &ctx->seq[ctx->cur_seq];
    ctx->be.kv = n->kv;
    ctx->s.logits = n->logits;
    ctx->next_pos = n->next_pos;
    ctx->tree_pos = n->tree_pos;
    ctx->tree_n = n->tree_n;
    ctx->tree_hidden = n->tree_hidden;
    ctx->tree_hidden_first = n->tree_hidden_first;
}

/* Keep the current sequence's state in seq[cur_seq], and make seq i's current. */
static void seq_switch(flm_ctx *ctx, uint32_t i) {
    if (i == ctx->cur_seq) return;
    seq_park(ctx);
    ctx->cur_seq = i;
    seq_unpark(ctx);
}

uint32_t flm_n_seq(const flm_ctx *ctx) { return ctx ? ctx->n_seq : 0; }

enum { JOIN_EXPECT_BACK = 1, JOIN_EXPECT_DRAFTING = 2, JOIN_EXPECT_LEFT = 3 }; /* ctx->join_expect's but 0 */

/* The joined passes no longer wait for seq (flm_eval_seq); wakes a leader waiting for it. */
static void seq_unexpect(flm_ctx *ctx, uint32_t seq) {
    pthread_mutex_lock(&ctx->join_mu);
    if (ctx->join_expect[seq]) {
        ctx->join_expect[seq] = 0;
        pthread_cond_broadcast(&ctx->join_cv);
    }
    pthread_mutex_unlock(&ctx->join_mu);
}

flm_status flm_seq_acquire(flm_ctx *ctx, uint32_t seq, flm_error *err) {
    if (!ctx || seq >= ctx->n_seq)
        return flm_fail(err, FLM_ERR_ARG, "sequence %u: the context holds %u (flm_params.n_seq)", seq,
                        ctx ? ctx->n_seq : 0);
    if (ctx->join_init) seq_unexpect(ctx, seq); /* a turn alone: the joined passes need not wait for it */
    pthread_mutex_lock(&ctx->seq_mu);
    seq_switch(ctx, seq);
    return FLM_OK;
}

void flm_seq_leave(flm_ctx *ctx, uint32_t seq) {
    if (!ctx || !ctx->join_init || seq >= ctx->n_seq) return;
    const double now = flm_now_ms();
    pthread_mutex_lock(&ctx->join_mu);
    /* a sequence that decoded beside others: its client's next request likely comes within ms (join_wait); one
     * that decoded alone is not waited for (one client's next request may come on any sequence) */
    bool others = false;
    for (uint32_t i = 0; i < ctx->n_seq; i++)
        others |= i != seq && ctx->seq_busy_ms[i] > 0 && now - ctx->seq_busy_ms[i] < FLM_SEQ_BUSY_MS;
    ctx->join_expect[seq] = others && ctx->seq_busy_ms[seq] > 0 ? JOIN_EXPECT_LEFT : 0;
    ctx->seq_left_ms[seq] = now;
    ctx->seq_busy_ms[seq] = 0;
    pthread_cond_broadcast(&ctx->join_cv);
    pthread_mutex_unlock(&ctx->join_mu);
}

/* seq evaluates now: busy for flm_seq_busy (a context of several sequences). */
static void seq_mark_busy(flm_ctx *ctx, uint32_t seq) {
    if (!ctx->join_init) return;
    const double now = flm_now_ms();
    pthread_mutex_lock(&ctx->join_mu);
    ctx->seq_busy_ms[seq] = now > 0 ? now : 1e-3;
    pthread_mutex_unlock(&ctx->join_mu);
}

uint32_t flm_seq_busy(flm_ctx *ctx, uint32_t seq) {
    if (!ctx || !ctx->join_init) return 0;
    const double now = flm_now_ms();
    uint32_t n = 0;
    pthread_mutex_lock(&ctx->join_mu);
    for (uint32_t i = 0; i < ctx->n_seq; i++)
        n += i != seq && ctx->seq_busy_ms[i] > 0 && now - ctx->seq_busy_ms[i] < FLM_SEQ_BUSY_MS;
    pthread_mutex_unlock(&ctx->join_mu);
    return n;
}

void flm_seq_release(flm_ctx *ctx) {
    if (ctx) pthread_mutex_unlock(&ctx->seq_mu);
}

void flm_close(flm_ctx *ctx) {
    if (!ctx) return;
    if (ctx->ffn) ctx->ffn->close(&ctx->ffn_env);
    flm_flash_close(ctx->flash);
    flm_scratch_free(&ctx->s);
    flm_kv_cache_free(&ctx->be.kv);
    if (ctx->be.ops) ctx->be.ops->mem_free(&ctx->be, &ctx->mem); /* the KV cache, the activations, the stats ring */
    flm_model_free(ctx->model);
    if (ctx->seq_mu_init) pthread_mutex_destroy(&ctx->seq_mu);
    if (ctx->join_init) {
        pthread_mutex_destroy(&ctx->join_mu);
        pthread_cond_destroy(&ctx->join_cv);
    }
    free(ctx->join_tok);
    free(ctx->join_pos);
    free(ctx->join_kv);
    free(ctx->join_slot);
    free(ctx->join_tree);
    free(ctx->join_trees);
    free(ctx->join_x);
    free(ctx->join_dst);
    free(ctx->join_expect);
    free(ctx->seq_busy_ms);
    free(ctx->seq_left_ms);
    free(ctx->seq);
    free(ctx);
}

/* Add one token's statistics to the ring and the totals. */
static void record_token(flm_ctx *ctx, const flm_token_stats *tok) {
    ctx->tokens[ctx->n_tokens % FLM_STATS_TOKENS] = *tok; /* the ring: nothing grows */
    ctx->n_tokens++;
    ctx->total.io_ms += tok->io_ms;
    ctx->total.mem_ms += tok->mem_ms;
    ctx->total.compute_ms += tok->compute_ms;
    ctx->total.bytes_read += tok->bytes_read;
    ctx->total.n_reads += tok->n_reads;
    ctx->total.n_predicted += tok->n_predicted;
    ctx->total.n_loaded += tok->n_loaded;
    ctx->total.n_reused += tok->n_reused;
    ctx->total.rows_used = tok->rows_used; /* a level, not a sum: the latest */
    ctx->total.n_true += tok->n_true;
    ctx->total.n_true_pos += tok->n_true_pos;
}

/* The checks flm_eval and flm_eval_batch share: n tokens from pos. */
static flm_status check_tokens(const flm_ctx *ctx, const int32_t *tokens, uint32_t n, int32_t pos, flm_error *err) {
    const flm_hparams *hp = &ctx->model->hp;
    if (!tokens || n == 0) return flm_fail(err, FLM_ERR_ARG, "no tokens to evaluate");
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= hp->n_vocab)
            return flm_fail(err, FLM_ERR_ARG, "token id %d out of range [0, %u)", tokens[i], hp->n_vocab);
    if (pos < 0 || (int64_t)pos + n > ctx->params.n_ctx)
        return flm_fail(err, FLM_ERR_ARG, "positions %d .. %lld are outside the context of %d tokens (raise -c)",
                        pos, (long long)pos + n - 1, ctx->params.n_ctx);
    if (pos > ctx->next_pos)
        return flm_fail(err, FLM_ERR_ARG, "position %d out of order (expected %d or earlier)", pos, ctx->next_pos);
    return FLM_OK;
}

/* Record a pass over m tokens: each gets an equal share of its statistics. */
static void record_batch(flm_ctx *ctx, const flm_token_stats *pt, uint32_t m) {
    const flm_token_stats tok = *pt;
    flm_token_stats share = tok;
    share.io_ms /= m;
    share.mem_ms /= m;
    share.compute_ms /= m;
    share.bytes_read /= m;
    share.n_reads /= m;
    share.n_predicted /= m;
    share.n_loaded /= m;
    share.n_reused /= m;
    share.n_true /= m;
    share.n_true_pos /= m;
    for (uint32_t j = 0; j < m; j++) {
        /* counts: the remainder goes one each to the first tokens, so the shares add up to the batch's own
         * (a batch of 8 tokens making 5 reads would otherwise count none: the totals cover every token) */
        flm_token_stats sj = share;
        sj.bytes_read += j < tok.bytes_read % m;
        sj.n_reads += j < tok.n_reads % m;
        sj.n_predicted += j < tok.n_predicted % m;
        sj.n_loaded += j < tok.n_loaded % m;
        sj.n_reused += j < tok.n_reused % m;
        sj.n_true += j < tok.n_true % m;
        sj.n_true_pos += j < tok.n_true_pos % m;
        record_token(ctx, &sj);
    }
}

static bool runs_hot(const flm_ctx *ctx) { return ctx->flash && ctx->flash->plan.mode == FLM_MODE_HOT; }

#define NEEDS_HOT "a self-draft needs mode hot (flashlm calibrate orders the neurons; --mode hot or auto under a " \
                  "budget runs it)"

flm_status flm_eval_run(flm_ctx *ctx, const flm_eval_req *rq, flm_eval_res *res, flm_error *err) {
    flm_status st = check_tokens(ctx, rq->tokens, rq->n, rq->pos, err);
    if (st) return st;
    if (rq->tree || rq->logits == FLM_LOGITS_HIDDEN || (rq->logits == FLM_LOGITS_ALL) != (rq->logits_all != NULL))
        return flm_fail(err, FLM_ERR_ARG, "evaluation request: a tree or hidden states (flm_eval_tree's), or "
                        "logits_all without FLM_LOGITS_ALL (or the reverse)");
    if (rq->draft && !runs_hot(ctx)) return flm_fail(err, FLM_ERR_ARG, NEEDS_HOT);
    if (rq->hooks && rq->hooks->select && (ctx->ffn != &flm_ffn_ram || !rq->hooks->ids))
        return flm_fail(err, FLM_ERR_ARG, "the FFN select hook needs a .flm opened in ram mode (and its ids array)");
    ctx->tree_n = 0;
    const int32_t pos0 = rq->pos;
    ctx->next_pos = pos0; /* positions >= pos are forgotten, whatever happens below */
    const uint32_t n = rq->n, V = ctx->model->hp.n_vocab, B = (uint32_t)ctx->params.n_batch;
    for (uint32_t i = 0; i < n;) {
        const uint32_t m = n - i < B ? n - i : B;
        flm_eval_req piece = *rq;
        piece.tokens = rq->tokens + i;
        piece.n = m;
        piece.pos = pos0 + (int32_t)i;
        if (rq->logits == FLM_LOGITS_ALL) piece.logits_all = rq->logits_all + (size_t)i * V;
        else if (i + m < n) piece.logits = FLM_LOGITS_NONE; /* only the last piece's last token's are returned */
        flm_eval_res r = {0};
        if ((st = flm_forward(ctx, &piece, &r, err))) {
            ctx->next_pos = pos0; /* the whole call is undone: the caller evaluates pos0 again */
            return st;
        }
        record_batch(ctx, &r.stats, m);
        flm_token_stats_add(&res->stats, &r.stats);
        res->n_tokens += m;
        res->n_passes++;
        res->logits = r.logits;
        ctx->next_pos = pos0 + (int32_t)(i + m);
        i += m;
    }
    return FLM_OK;
}

/* The current sequence (what an evaluation that does not join works on). */
static uint32_t cur_seq(const flm_ctx *ctx) { return ctx ? ctx->cur_seq : 0; }

flm_status flm_eval(flm_ctx *ctx, int32_t token, int32_t pos, const float **logits, flm_error *err) {
    const flm_eval_args a = {.tokens = &token, .n = 1, .pos = pos, .seq = cur_seq(ctx)};
    flm_eval_out out;
    flm_status st = flm_evaluate(ctx, &a, &out, err);
    if (!st) *logits = out.logits;
    return st;
}

bool flm_has_self_draft(const flm_ctx *ctx) { return ctx && runs_hot(ctx) && ctx->flash->plan.stream; }

flm_status flm_eval_draft(flm_ctx *ctx, int32_t token, int32_t pos, const float **logits, flm_error *err) {
    if (!ctx) return flm_fail(err, FLM_ERR_ARG, NEEDS_HOT);
    const flm_eval_args a = {.tokens = &token, .n = 1, .pos = pos, .seq = cur_seq(ctx), .draft = true};
    flm_eval_out out;
    flm_status st = flm_evaluate(ctx, &a, &out, err);
    if (!st) *logits = out.logits;
    return st;
}

flm_status flm_eval_hooked(flm_ctx *ctx, const int32_t *tokens, uint32_t n, int32_t pos, const flm_ffn_hooks *h,
                           float *logits_all, const float **logits, flm_error *err) {
    const flm_eval_req rq = {.tokens = tokens, .n = n, .pos = pos, .hooks = h, .logits_all = logits_all,
                             .logits = logits_all ? FLM_LOGITS_ALL : FLM_LOGITS_LAST};
    flm_eval_res res = {0};
    flm_status st = flm_eval_run(ctx, &rq, &res, err);
    if (!st && logits) *logits = logits_all ? logits_all + (size_t)(n - 1) * ctx->model->hp.n_vocab : res.logits;
    return st;
}

flm_status flm_eval_batch(flm_ctx *ctx, const int32_t *tokens, uint32_t n, int32_t pos, float *logits_all,
                          const float **logits, flm_error *err) {
    const flm_eval_args a = {.tokens = tokens, .n = n, .pos = pos, .seq = cur_seq(ctx), .logits_all = logits_all,
                             .logits = logits_all ? FLM_EVAL_LOGITS_ALL : FLM_EVAL_LOGITS_LAST};
    flm_eval_out out;
    flm_status st = flm_evaluate(ctx, &a, &out, err);
    if (!st && logits) *logits = out.logits;
    return st;
}

/* The shape of the tree parent[0..n): depth[i] and the ancestor rows anc[i * n .. + n) (node i's ancestors and
 * itself). Returns n, or the first node whose parent is not an earlier node (or -1), or (*swa set) whose path is
 * longer than the sliding window n_swa (0: none). */
static uint32_t tree_shape(const int32_t *parent, uint32_t n, uint32_t n_swa, int32_t *depth, uint8_t *anc,
                           bool *swa) {
    const size_t N = n;
    *swa = false;
    for (size_t i = 0; i < N; i++) {
        const int32_t p = parent[i];
        if (p < -1 || p >= (int32_t)i) return (uint32_t)i;
        depth[i] = p < 0 ? 0 : depth[p] + 1;
        if (p >= 0) memcpy(anc + i * N, anc + (size_t)p * N, N);
        else memset(anc + i * N, 0, N);
        anc[i * N + i] = 1;
        if (n_swa && (uint32_t)depth[i] >= n_swa) {
            *swa = true;
            return (uint32_t)i;
        }
    }
    return n;
}

/* A tree's final states from the pass's scratch rows into its sequence's own buffer (a context of several
 * sequences: another sequence's pass overwrites the scratch before this one's walk asks for its logits). */
static void keep_hidden(flm_ctx *ctx, uint32_t seq, const float *hidden, uint32_t rows) {
    float *h = ctx->seq[seq].hidden;
    if (!h || !hidden) return;
    if (rows > flm_seq_hidden_rows((uint32_t)ctx->params.n_ctx, ctx->s.n_batch)) h = NULL; /* never: one batch */
    else memcpy(h, hidden, (size_t)rows * ctx->model->hp.d_model * sizeof *h);
    if (seq == ctx->cur_seq) ctx->tree_hidden = h;
    else ctx->seq[seq].tree_hidden = h;
}

static flm_status eval_tree(flm_ctx *ctx, const int32_t *tokens, const int32_t *parent, uint32_t n_nodes,
                            uint32_t first, int32_t pos, bool draft, float *logits, flm_call_stats *cs,
                            flm_error *err);

/* ---- joined passes: several sequences' evaluations in one forward pass (flm_eval_seq) -------------------------- */

static flm_status tree_logits(flm_ctx *ctx, const uint32_t *nodes, uint32_t n, float *logits, flm_token_stats *tok,
                              flm_error *err);

/* A waiting evaluation (on its caller's stack until done). */
typedef struct flm_join_req {
    uint32_t seq, n;
    const int32_t *tokens;
    int32_t pos;
    float *logits_all; /* FLM_EVAL_LOGITS_ALL: the caller's n * n_vocab floats (a tree: n - first rows); NULL: the
                          last row's only (a tree: none, its nodes' final states kept for flm_seq_tree_logits_n) */
    const int32_t *parent; /* NULL: a causal run; else a tree (flm_eval_tree's parent), nodes [first, n) evaluated */
    uint32_t first;
    const uint32_t *some; /* a tree's FLM_EVAL_LOGITS_SOME: these n_some nodes' logits into logits_all, the final
                             states kept as without logits; NULL: none */
    uint32_t n_some;
    bool draft;        /* the self-draft (flm_eval_draft): joins only other drafts */
    bool fresh;        /* its sequence was not expected back when it came (a new generation, most likely) */
    const float *logits;
    flm_call_stats cs; /* its statistics (ms: the caller's) */
    flm_status st;
    flm_error err;
    bool done;
    struct flm_join_req *next;
} flm_join_req;

/* One request alone: its sequence made current, flm_eval_run as flm_eval_batch. */
static void join_alone(flm_ctx *ctx, flm_join_req *r) {
    seq_switch(ctx, r->seq);
    if (r->parent) { /* a tree: flm_eval_tree's evaluation, its final states kept as the sequence's */
        const uint64_t b0 = flm_ctx_io_busy_ns(ctx);
        const double t0 = flm_now_ms();
        r->cs = (flm_call_stats){0};
        r->st = eval_tree(ctx, r->tokens, r->parent, r->n, r->first, r->pos, r->draft, r->some ? NULL : r->logits_all,
                          &r->cs, &r->err);
        if (!r->st && (!r->logits_all || r->some) && ctx->n_seq > 1)
            keep_hidden(ctx, r->seq, ctx->tree_hidden, r->n - r->first);
        if (!r->st && r->some) r->st = tree_logits(ctx, r->some, r->n_some, r->logits_all, &r->cs.total, &r->err);
        r->cs.pass_ms = flm_now_ms() - t0;
        r->cs.io_busy_ms = (double)(flm_ctx_io_busy_ns(ctx) - b0) / 1e6;
        r->logits = NULL;
        return;
    }
    const flm_eval_req rq = {.tokens = r->tokens, .n = r->n, .pos = r->pos, .draft = r->draft,
                             .logits = r->logits_all ? FLM_LOGITS_ALL : FLM_LOGITS_LAST, .logits_all = r->logits_all};
    flm_eval_res res = {0};
    const uint64_t b0 = flm_ctx_io_busy_ns(ctx);
    const double t0 = flm_now_ms();
    r->st = flm_eval_run(ctx, &rq, &res, &r->err);
    r->cs.pass_ms = flm_now_ms() - t0;
    r->logits = r->logits_all ? r->logits_all + (size_t)(r->n - 1) * ctx->model->hp.n_vocab : res.logits;
    r->cs.total = res.stats;
    r->cs.n_tokens = res.n_tokens;
    r->cs.n_passes = res.n_passes;
    r->cs.io_busy_ms = (double)(flm_ctx_io_busy_ns(ctx) - b0) / 1e6;
}

/* The k requests (k >= 2, different sequences, rows <= the batch, all drafts or none) in one pass: every row through
 * the model at its sequence's cache and position (the linear layers and the FFN read once for all rows; drafts: the
 * self-draft's resident neurons), then the classifier over each request's last row (drafts: the draft vocabulary), its
 * logits copied to its sequence's row, and over every row of a request that wants them all. A request the checks
 * refuse, mode sparse (its FFN chooses neurons per position) or a context without batch arrays: each alone. Holds
 * seq_mu. */
/* Rows a joined request evaluates: its tokens, or a tree's nodes [first, n). */
static uint32_t join_rows(const flm_join_req *r) { return r->parent ? r->n - r->first : r->n; }

static void join_run(flm_ctx *ctx, flm_join_req **req, uint32_t k) {
    const flm_hparams *hp = &ctx->model->hp;
    uint32_t rows = 0;
    bool joinable = ctx->flash == NULL || ctx->flash->plan.mode != FLM_MODE_SPARSE, trees = false;
    const uint32_t T = flm_scratch_tree_nodes((uint32_t)ctx->params.n_ctx);
    seq_park(ctx);
    for (uint32_t i = 0; i < k && joinable; i++) {
        const flm_join_req *r = req[i];
        const flm_seq_state *q = &ctx->seq[r->seq];
        joinable = r->n >= 1 && r->pos >= 0 && r->pos <= q->next_pos && (int64_t)r->pos + r->n <= ctx->params.n_ctx;
        for (uint32_t t = 0; t < r->n && joinable; t++)
            joinable = r->tokens[t] >= 0 && (uint32_t)r->tokens[t] < hp->n_vocab;
        if (r->parent && joinable) { /* a tree: its shape into its sequence's tree; anything amiss: alone (errors) */
            int32_t *depth = (int32_t *)q->tree_mem;
            bool swa;
            for (uint32_t j = 0; j < r->n_some && joinable; j++)
                joinable = r->some[j] >= r->first && r->some[j] < r->n;
            joinable = joinable && q->tree_mem && r->first < r->n && r->n <= T &&
                       (r->first == 0 || (q->tree_n >= r->first && q->tree_pos == r->pos && q->next_pos == r->pos)) &&
                       tree_shape(r->parent, r->n, hp->n_swa, depth, q->tree_mem + 4 * (size_t)T, &swa) == r->n;
            ctx->join_trees[r->seq] = (flm_tree){(uint32_t)r->pos, r->n, depth, q->tree_mem + 4 * (size_t)T,
                                                 ctx->s.tree + 4 * (size_t)T + (size_t)T * T};
            trees = true;
        }
        rows += join_rows(r);
    }
    if (!joinable || k < 2 || rows > ctx->s.n_batch) {
        for (uint32_t i = 0; i < k; i++) join_alone(ctx, req[i]);
        return;
    }
    uint32_t row = 0;
    for (uint32_t i = 0; i < k; i++) {
        flm_join_req *r = req[i];
        flm_seq_state *q = &ctx->seq[r->seq];
        q->next_pos = r->pos; /* positions >= pos are forgotten, whatever happens below */
        q->tree_n = 0;
        q->tree_hidden = NULL;
        if (r->parent) { /* the nodes [first, n) at slots pos + i, positions pos + depth; [0, first) held */
            const flm_tree *tr = &ctx->join_trees[r->seq];
            q->tree_pos = r->pos;
            q->tree_n = r->first;
            for (uint32_t t = r->first; t < r->n; t++, row++) {
                ctx->join_tok[row] = r->tokens[t];
                ctx->join_pos[row] = r->pos + tr->depth[t];
                ctx->join_slot[row] = r->pos + (int32_t)t;
                ctx->join_kv[row] = &q->kv;
                ctx->join_tree[row] = tr;
            }
            continue;
        }
        for (uint32_t t = 0; t < r->n; t++, row++) {
            ctx->join_tok[row] = r->tokens[t];
            ctx->join_pos[row] = r->pos + (int32_t)t;
            ctx->join_slot[row] = r->pos + (int32_t)t;
            ctx->join_kv[row] = &q->kv;
            ctx->join_tree[row] = NULL;
        }
    }
    seq_unpark(ctx); /* the current sequence's forgotten positions and tree */
    const bool draft = req[0]->draft;
    const flm_eval_req rq = {.tokens = ctx->join_tok, .n = rows, .logits = FLM_LOGITS_HIDDEN, .draft = draft,
                             .row_kv = ctx->join_kv, .row_pos = ctx->join_pos,
                             .row_slot = trees ? ctx->join_slot : NULL, .row_tree = trees ? ctx->join_tree : NULL};
    flm_eval_res res = {0};
    flm_error e;
    const double t0 = flm_now_ms();
    const uint64_t b0 = flm_ctx_io_busy_ns(ctx);
    flm_status st = flm_forward(ctx, &rq, &res, &e);
    /* the classifier over every row that wants logits, all at once (flm_output_scatter: each weight read once for
     * all of them): each request's last row into its sequence's logits row, and every row of a request that wants
     * them all (a speculative step's verification) into the caller's buffer; join_logits is the scratch */
    const uint32_t d = hp->d_model, per = FLM_OUTPUT_ROWS_MAX(ctx->s.n_batch); /* rows per classifier call */
    uint32_t nx = 0;
    row = 0;
    for (uint32_t i = 0; i < k && !st; i++) {
        flm_join_req *r = req[i];
        const uint32_t nr = join_rows(r), from = r->logits_all ? 0 : nr - 1;
        if (r->parent && (!r->logits_all || r->some)) { /* a tree verified lazily: its final states kept for its
                                                           walk, the nodes it asked for now (SOME) with the others' */
            keep_hidden(ctx, r->seq, res.hidden + (size_t)row * d, nr);
            for (uint32_t j = 0; j < r->n_some; j++, nx++) {
                ctx->join_x[nx] = res.hidden + (size_t)(row + r->some[j] - r->first) * d;
                ctx->join_dst[nx] = r->logits_all + (size_t)j * hp->n_vocab;
            }
            row += nr;
            continue;
        }
        for (uint32_t t = from; t < nr; t++, nx++) {
            ctx->join_x[nx] = res.hidden + (size_t)(row + t) * d;
            ctx->join_dst[nx] = r->logits_all ? r->logits_all + (size_t)t * hp->n_vocab : ctx->seq[r->seq].logits;
        }
        row += nr;
    }
    for (uint32_t i = 0; i < nx && !st; i += per)
        st = flm_output_scatter(ctx, ctx->join_x + i, nx - i < per ? nx - i : per, draft, ctx->join_dst + i,
                                ctx->join_logits, (size_t)ctx->n_seq * hp->n_vocab, &res.stats, &e);
    const double pass_ms = flm_now_ms() - t0;
    res.stats.compute_ms = pass_ms - res.stats.io_ms - res.stats.mem_ms;
    const double busy = (double)(flm_ctx_io_busy_ns(ctx) - b0) / 1e6;
    if (!st) {
        record_batch(ctx, &res.stats, rows);
        ctx->n_joined++;
        ctx->rows_joined += rows;
    }
    seq_park(ctx);
    for (uint32_t i = 0; i < k; i++) {
        flm_join_req *r = req[i];
        flm_seq_state *q = &ctx->seq[r->seq];
        r->st = st;
        if (st) {
            r->err = e;
            q->tree_n = 0; /* a tree's nodes, held ones included, are forgotten (as flm_eval_tree's) */
            q->tree_hidden = NULL;
            continue;
        }
        const uint32_t nr = join_rows(r);
        if (r->parent) { /* the tree held apart at pos (flm_eval_tree's state): its logits given or kept lazily */
            q->next_pos = r->pos;
            q->tree_n = r->n;
            q->tree_hidden_first = r->first;
            if (r->logits_all && !r->some) q->tree_hidden = NULL;
            r->logits = NULL;
        } else {
            if (r->logits_all) /* its sequence's row: its last row's logits, as a request's alone */
                memcpy(q->logits, r->logits_all + (size_t)(r->n - 1) * hp->n_vocab,
                       (size_t)hp->n_vocab * sizeof(float));
            q->next_pos = r->pos + (int32_t)r->n;
            r->logits = q->logits;
        }
        flm_token_stats sh = res.stats; /* its rows' share of the pass */
        const double f = (double)nr / rows;
        sh.io_ms *= f;
        sh.mem_ms *= f;
        sh.compute_ms *= f;
        sh.bytes_read = (uint64_t)(sh.bytes_read * f);
        sh.n_reads = (uint64_t)(sh.n_reads * f);
        r->cs.total = sh;
        r->cs.n_tokens = nr;
        r->cs.n_passes = 1;
        r->cs.io_busy_ms = busy * f;
        r->cs.pass_ms = pass_ms; /* the whole pass: every sequence's rows wait for it */
    }
    seq_unpark(ctx);
}

/* The leader's wait (join_mu held, released while waiting): until every sequence expected back has a request
 * queued, the queue's rows fill a batch, or the wait's bound has passed (FLM_JOIN_WAIT_US .. FLM_JOIN_WAIT_MAX_US:
 * a share of the last pass's time). */
static void join_wait(flm_ctx *ctx) {
    uint64_t us = ctx->join_pass_us / FLM_JOIN_WAIT_DIV;
    if (us < FLM_JOIN_WAIT_US) us = FLM_JOIN_WAIT_US;
    if (us > FLM_JOIN_WAIT_MAX_US) us = FLM_JOIN_WAIT_MAX_US;
    const double left_ms = (double)us / 1000.0; /* a sequence that left: waited for until it left this long ago */
    /* a sequence whose last pass was a draft comes back with its next draft or its verification: a full pass run
     * without it would cost it (and the others' next full pass) a whole pass, so it is waited for longest */
    for (uint32_t s = 0; s < ctx->n_seq; s++)
        if (ctx->join_expect[s] == JOIN_EXPECT_DRAFTING) us = FLM_JOIN_WAIT_MAX_US;
    const double t0 = flm_now_ms();
    for (;;) {
        uint32_t missing = 0, rows = 0, queued = 0; /* queued: sequences (a sequence has one request at most) */
        bool drafts = false, fresh = false;
        for (const flm_join_req *r = ctx->join_head; r; r = r->next) {
            queued++;
            rows += join_rows(r);
            drafts |= r->draft;
            fresh |= r->fresh;
        }
        /* a sequence that left (its generation ended) is waited for by a full pass only, and only until it left
         * left_ms ago: its client's next request (it joins this pass instead of reading the model again alone) */
        const double now = flm_now_ms();
        double until = t0 + (double)us / 1000.0, left_until = 0;
        for (uint32_t s = 0; s < ctx->n_seq; s++) { /* queued ones: cleared */
            if (ctx->join_expect[s] != JOIN_EXPECT_LEFT) {
                missing += ctx->join_expect[s] != 0;
            } else if (!drafts && now < ctx->seq_left_ms[s] + left_ms) {
                const double u = ctx->seq_left_ms[s] + left_ms;
                left_until = u > left_until ? u : left_until;
                missing++;
            }
        }
        /* a new generation's first request: others sent at the same moment (clients starting together) come
         * within about a millisecond; a full pass waits FLM_JOIN_FRESH_US for them */
        const double fresh_until = !drafts && fresh ? t0 + FLM_JOIN_FRESH_US / 1000.0 : 0;
        if (rows >= ctx->s.n_batch || queued >= ctx->n_seq || (!missing && now >= fresh_until)) return;
        bool only_left = true;
        for (uint32_t s = 0; s < ctx->n_seq; s++)
            only_left &= ctx->join_expect[s] == 0 || ctx->join_expect[s] == JOIN_EXPECT_LEFT;
        if (only_left && left_until < until) until = left_until > fresh_until ? left_until : fresh_until;
        if (now >= until) {
            if (!only_left) memset(ctx->join_expect, 0, ctx->n_seq); /* late ones: not waited for until they join */
            return;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        const long ns = (long)((until - now) * 1e6);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec += ns % 1000000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&ctx->join_cv, &ctx->join_mu, &ts); /* a wake-up or the bound: the loop decides */
    }
}

/* flm_eval_seq's evaluation (flm_evaluate with join): *logits the sequence's row, *cs the call's statistics but ms. */
static flm_status eval_joined(flm_ctx *ctx, uint32_t seq, const int32_t *tokens, uint32_t n, int32_t pos, bool draft,
                              const int32_t *parent, uint32_t first, const uint32_t *some, uint32_t n_some,
                              float *logits_all, const float **logits, flm_call_stats *cs, flm_error *err) {
    if (!ctx || seq >= ctx->n_seq || !tokens || n == 0)
        return flm_fail(err, FLM_ERR_ARG, "flm_eval_seq: sequence %u of %u, %u tokens", seq, ctx ? ctx->n_seq : 0, n);
    flm_join_req me = {.seq = seq, .n = n, .tokens = tokens, .pos = pos, .logits_all = logits_all, .draft = draft,
                       .parent = parent, .first = first, .some = some, .n_some = n_some};
    if (ctx->n_seq == 1) { /* nothing to join */
        pthread_mutex_lock(&ctx->seq_mu);
        join_alone(ctx, &me);
        pthread_mutex_unlock(&ctx->seq_mu);
    } else {
        pthread_mutex_lock(&ctx->join_mu);
        if (ctx->join_tail) ctx->join_tail->next = &me;
        else ctx->join_head = &me;
        ctx->join_tail = &me;
        me.fresh = ctx->join_expect[seq] == 0 || ctx->join_expect[seq] == JOIN_EXPECT_LEFT;
        if (!ctx->join_expect[seq]) /* a new request on a sequence not expected: a client that left another one */
            for (uint32_t s = 0; s < ctx->n_seq; s++)
                if (ctx->join_expect[s] == JOIN_EXPECT_LEFT) {
                    ctx->join_expect[s] = 0;
                    break;
                }
        ctx->join_expect[seq] = 0;
        if (ctx->join_leading) pthread_cond_broadcast(&ctx->join_cv); /* a leader may be waiting for this one */
        while (!me.done) {
            if (ctx->join_leading) {
                pthread_cond_wait(&ctx->join_cv, &ctx->join_mu);
                continue;
            }
            /* lead: first wait (up to FLM_JOIN_WAIT_US) for the sequences expected back, those of the last pass
             * still generating, so that they join this pass instead of running a pass of their own after it; then
             * take the waiting requests of one kind in order, while their rows fit one batch and their sequences
             * differ (a long one alone): drafts first when any waits (a draft pass is the resident weights' only,
             * and the sequences drafting will verify next, so the others' full passes wait to join that) */
            ctx->join_leading = true;
            join_wait(ctx);
            flm_join_req *req[FLM_SEQ_MAX];
            uint32_t k = 0, rows = 0;
            bool drafts = false;
            for (const flm_join_req *r = ctx->join_head; r; r = r->next) drafts |= r->draft;
            flm_join_req **link = &ctx->join_head;
            for (flm_join_req *r = ctx->join_head; r && k < FLM_SEQ_MAX; r = *link) {
                if (r->draft != drafts) { /* the other kind: stays queued */
                    link = &r->next;
                    continue;
                }
                bool dup = false;
                for (uint32_t i = 0; i < k; i++) dup |= req[i]->seq == r->seq;
                if (k && (dup || rows + join_rows(r) > ctx->s.n_batch)) break;
                req[k++] = r;
                rows += join_rows(r);
                *link = r->next; /* out of the queue */
            }
            ctx->join_tail = NULL;
            for (flm_join_req *r = ctx->join_head; r; r = r->next) ctx->join_tail = r;
            pthread_mutex_unlock(&ctx->join_mu);
            pthread_mutex_lock(&ctx->seq_mu);
            const double t0 = flm_now_ms();
            if (k == 1) join_alone(ctx, req[0]);
            else join_run(ctx, req, k);
            const double pass_ms = flm_now_ms() - t0;
            pthread_mutex_unlock(&ctx->seq_mu);
            pthread_mutex_lock(&ctx->join_mu);
            ctx->join_pass_us = pass_ms > 0 ? (uint64_t)(pass_ms * 1000.0) : 0;
            for (uint32_t i = 0; i < k; i++) {
                req[i]->done = true;
                /* its next token will likely follow; after a draft, its next draft or its verification */
                ctx->join_expect[req[i]->seq] = req[i]->draft ? JOIN_EXPECT_DRAFTING : JOIN_EXPECT_BACK;
            }
            ctx->join_leading = false;
            pthread_cond_broadcast(&ctx->join_cv);
        }
        pthread_mutex_unlock(&ctx->join_mu);
    }
    *cs = me.cs;
    if (me.st) {
        if (err) *err = me.err;
        return me.st;
    }
    *logits = me.logits;
    return FLM_OK;
}

flm_status flm_eval_seq(flm_ctx *ctx, uint32_t seq, const int32_t *tokens, uint32_t n, int32_t pos,
                        const float **logits, flm_token_stats *stats, flm_error *err) {
    if (!logits) return flm_fail(err, FLM_ERR_ARG, "flm_eval_seq: logits NULL");
    const flm_eval_args a = {.tokens = tokens, .n = n, .pos = pos, .seq = seq, .join = true};
    flm_eval_out out;
    flm_status st = flm_evaluate(ctx, &a, &out, err);
    if (st) return st;
    *logits = out.logits;
    if (stats) flm_token_stats_add(stats, &out.stats.total);
    return FLM_OK;
}

flm_status flm_embed(flm_ctx *ctx, const int32_t *ids, uint32_t n, float *out, flm_error *err) {
    if (!ctx || !out) return flm_fail(err, FLM_ERR_ARG, "embedding: no context or no output");
    flm_status st = check_tokens(ctx, ids, n, 0, err);
    if (st) return st;
    const flm_model *m = ctx->model;
    const flm_hparams *hp = &m->hp;
    const uint32_t d = hp->d_model, B = ctx->s.n_batch ? ctx->s.n_batch : 1;
    float *row = ctx->s.embd_row; /* carved at open (the plan's scratch): nothing allocated here */
    double *sum = ctx->s.embd_sum;
    memset(sum, 0, (size_t)d * sizeof *sum);
    ctx->tree_n = 0;
    ctx->next_pos = 0;
    flm_backend *be = &ctx->be;
    const flm_pass P = {.be = be, .k = ctx->k, .hp = hp, .kv = &be->kv, .n_threads = ctx->params.n_threads, .n = 1};
    for (uint32_t i = 0; i < n && !st;) {
        /* one batched pass per piece (hidden states need the whole piece in one pass), a token alone at the end */
        const uint32_t k = n - i < B ? n - i : B;
        flm_eval_req rq = {.tokens = ids + i, .n = k, .pos = (int32_t)i, .logits = FLM_LOGITS_HIDDEN};
        flm_eval_res r = {0};
        if ((st = flm_forward(ctx, &rq, &r, err))) break;
        record_batch(ctx, &r.stats, k);
        for (uint32_t t = 0; t < k; t++) {
            const float *h = r.hidden + (size_t)t * d;
            if (m->output_norm.data) flm_pass_norm(&P, &m->output_norm, &m->output_norm_b, d, h, d, row, d);
            else memcpy(row, h, (size_t)d * sizeof *row);
            for (uint32_t c = 0; c < d; c++) sum[c] += row[c];
        }
        ctx->next_pos = (int32_t)(i + k);
        i += k;
    }
    if (!st) {
        double norm = 0;
        for (uint32_t c = 0; c < d; c++) norm += (sum[c] / n) * (sum[c] / n);
        norm = sqrt(norm);
        for (uint32_t c = 0; c < d; c++) out[c] = norm > 0 ? (float)(sum[c] / n / norm) : 0.0f;
        for (uint32_t c = 0; c < d && !st; c++)
            if (!isfinite(out[c])) st = flm_fail(err, FLM_ERR_FORMAT, "embedding: a non-finite final state");
    }
    if (st) ctx->next_pos = 0;
    return st;
}

/* flm_eval_tree, its statistics added to *cs (but io_busy_ms and ms). */
static flm_status eval_tree(flm_ctx *ctx, const int32_t *tokens, const int32_t *parent, uint32_t n_nodes,
                            uint32_t first, int32_t pos, bool draft, float *logits, flm_call_stats *cs,
                            flm_error *err) {
    if (!ctx || !parent || first >= n_nodes)
        return flm_fail(err, FLM_ERR_ARG, "tree evaluation: no parents, or no node to evaluate (first %u of %u nodes)",
                        first, n_nodes);
    flm_status st = check_tokens(ctx, tokens, n_nodes, pos, err);
    if (st) return st;
    if (!logits && n_nodes - first > 1 && n_nodes - first > ctx->s.n_batch)
        return flm_fail(err, FLM_ERR_ARG, "tree evaluation without logits: %u nodes, more than one batch holds (%u, "
                        "-b)", n_nodes - first, ctx->s.n_batch);
    if (draft && !runs_hot(ctx)) return flm_fail(err, FLM_ERR_ARG, NEEDS_HOT);
    if (ctx->flash && ctx->flash->plan.mode == FLM_MODE_SPARSE)
        return flm_fail(err, FLM_ERR_ARG, "tree evaluation: the FFN source chooses neurons per position (mode "
                        "sparse); evaluate a path at a time instead");
    if (first > 0 && (ctx->tree_n < first || ctx->tree_pos != pos || ctx->next_pos != pos))
        return flm_fail(err, FLM_ERR_ARG, "tree evaluation from node %u: the cache holds %u nodes of a tree at %d (the "
                        "earlier nodes must come first)", first, ctx->tree_n, ctx->tree_pos);
    const flm_hparams *hp = &ctx->model->hp;
    const size_t N = n_nodes;
    if (n_nodes > flm_scratch_tree_nodes((uint32_t)ctx->params.n_ctx))
        return flm_fail(err, FLM_ERR_ARG, "tree evaluation: %u nodes, more than a tree may have (%u: "
                        "FLM_TREE_MAX_NODES, at most the context)", n_nodes,
                        flm_scratch_tree_nodes((uint32_t)ctx->params.n_ctx));
    uint8_t *mem = ctx->s.tree; /* carved at open: depth [N], ancestors [N][N], a row's mask [n_ctx] */
    int32_t *depth = (int32_t *)mem;
    uint8_t *anc = mem + N * sizeof(int32_t), *mask = anc + N * N;
    bool swa;
    const uint32_t bad = tree_shape(parent, n_nodes, hp->n_swa, depth, anc, &swa);
    if (bad < n_nodes && swa)
        return flm_fail(err, FLM_ERR_ARG, "tree evaluation: a path of %d nodes is longer than the sliding window "
                        "(%u)", depth[bad] + 1, hp->n_swa);
    if (bad < n_nodes)
        return flm_fail(err, FLM_ERR_ARG, "tree evaluation: node %u's parent %d is not an earlier node (or -1)", bad,
                        parent[bad]);
    const flm_tree tree = {(uint32_t)pos, n_nodes, depth, anc, mask};
    ctx->next_pos = pos; /* the context's positions < pos stay; the tree's nodes are held apart (tree_n) */
    ctx->tree_pos = pos;
    ctx->tree_n = first;
    ctx->tree_hidden = NULL;
    const uint32_t V = hp->n_vocab, B = (uint32_t)ctx->params.n_batch;
    const float *hidden = NULL;
    for (uint32_t i = first; i < n_nodes;) {
        uint32_t m = n_nodes - i < B ? n_nodes - i : B;
        const flm_eval_req rq = {.tokens = tokens + i, .n = m, .pos = pos + (int32_t)i, .draft = draft, .tree = &tree,
                                 .logits = logits ? FLM_LOGITS_ALL : FLM_LOGITS_HIDDEN,
                                 .logits_all = logits ? logits + (size_t)(i - first) * V : NULL};
        flm_eval_res r = {0};
        if ((st = flm_forward(ctx, &rq, &r, err))) break;
        record_batch(ctx, &r.stats, m);
        flm_token_stats_add(&cs->total, &r.stats);
        cs->n_tokens += m;
        cs->n_passes++;
        hidden = r.hidden;
        i += m;
        ctx->tree_n = i;
    }
    ctx->next_pos = pos;
    ctx->tree_hidden = hidden;
    if (st || logits) ctx->tree_hidden = NULL;
    else ctx->tree_hidden_first = first;
    return st;
}

flm_status flm_eval_tree(flm_ctx *ctx, const int32_t *tokens, const int32_t *parent, uint32_t n_nodes, uint32_t first,
                         int32_t pos, bool draft, float *logits, flm_error *err) {
    if (!parent) /* flm_evaluate would take it for a causal run */
        return flm_fail(err, FLM_ERR_ARG, "tree evaluation: no parents, or no node to evaluate (first %u of %u nodes)",
                        first, n_nodes);
    const flm_eval_args a = {.tokens = tokens, .n = n_nodes, .pos = pos, .seq = cur_seq(ctx), .draft = draft,
                             .logits = logits ? FLM_EVAL_LOGITS_ALL : FLM_EVAL_LOGITS_NONE, .logits_all = logits,
                             .parent = parent, .first = first};
    flm_eval_out out;
    return flm_evaluate(ctx, &a, &out, err);
}

flm_status flm_evaluate(flm_ctx *ctx, const flm_eval_args *a, flm_eval_out *out, flm_error *err) {
    if (!ctx || !a || !out) return flm_fail(err, FLM_ERR_ARG, "flm_evaluate: ctx, args and out must not be NULL");
    memset(out, 0, sizeof *out);
    if (a->seq >= ctx->n_seq)
        return flm_fail(err, FLM_ERR_ARG, "flm_evaluate: sequence %u, but the context holds %u (flm_params.n_seq)",
                        a->seq, ctx->n_seq);
    if ((unsigned)a->logits > FLM_EVAL_LOGITS_SOME)
        return flm_fail(err, FLM_ERR_ARG, "flm_evaluate: logits %d is none of FLM_EVAL_LOGITS_LAST, NONE, ALL, SOME",
                        (int)a->logits);
    const bool some = a->logits == FLM_EVAL_LOGITS_SOME;
    if ((a->logits == FLM_EVAL_LOGITS_ALL || some) != (a->logits_all != NULL))
        return flm_fail(err, FLM_ERR_ARG, "flm_evaluate: logits_all %s with logits %s (FLM_EVAL_LOGITS_ALL and SOME "
                        "take the caller's buffer, the others none)", a->logits_all ? "given" : "NULL",
                        a->logits == FLM_EVAL_LOGITS_ALL    ? "ALL"
                        : a->logits == FLM_EVAL_LOGITS_NONE ? "NONE"
                        : some                              ? "SOME"
                                                            : "LAST");
    if (!a->parent && a->first)
        return flm_fail(err, FLM_ERR_ARG, "flm_evaluate: first %u without a tree (parent NULL)", a->first);
    if (some != (a->some != NULL || a->n_some != 0) || (some && (!a->parent || !a->some || !a->n_some)))
        return flm_fail(err, FLM_ERR_ARG, "flm_evaluate: FLM_EVAL_LOGITS_SOME takes a tree (parent) and its nodes "
                        "(some, n_some >= 1), the other logits neither (some %s, %u nodes, logits %d)",
                        a->some ? "given" : "NULL", a->n_some, (int)a->logits);
    for (uint32_t j = 0; some && j < a->n_some; j++)
        if (a->some[j] < a->first || a->some[j] >= a->n)
            return flm_fail(err, FLM_ERR_ARG, "flm_evaluate: FLM_EVAL_LOGITS_SOME's node %u is not one this call "
                            "evaluates ([%u, %u))", a->some[j], a->first, a->n);
    const double t0 = flm_now_ms();
    flm_status st;
    seq_mark_busy(ctx, a->seq);
    if (a->join) {
        if (a->parent ? a->logits == FLM_EVAL_LOGITS_LAST || a->first >= a->n
                      : a->logits == FLM_EVAL_LOGITS_NONE || (a->draft && a->logits != FLM_EVAL_LOGITS_LAST))
            return flm_fail(err, FLM_ERR_ARG, "flm_evaluate: a joined evaluation (join) takes logits the last "
                            "token's (FLM_EVAL_LOGITS_LAST) or every token's (FLM_EVAL_LOGITS_ALL; not with draft), a "
                            "joined tree every evaluated node's (ALL) or none (NONE: flm_seq_tree_logits_n), first < "
                            "n");
        if (a->draft && !runs_hot(ctx)) return flm_fail(err, FLM_ERR_ARG, NEEDS_HOT);
        st = eval_joined(ctx, a->seq, a->tokens, a->n, a->pos, a->draft, a->parent, a->first, a->some, a->n_some,
                         a->logits_all, &out->logits, &out->stats, err);
        out->stats.ms = flm_now_ms() - t0;
        return st;
    }
    if (a->seq != ctx->cur_seq)
        return flm_fail(err, FLM_ERR_ARG, "flm_evaluate: sequence %u is not the current one (%u): take it with "
                        "flm_seq_acquire, or join", a->seq, ctx->cur_seq);
    const uint64_t b0 = flm_ctx_io_busy_ns(ctx);
    if (a->parent) {
        if (a->logits == FLM_EVAL_LOGITS_LAST)
            return flm_fail(err, FLM_ERR_ARG, "flm_evaluate: a tree's logits are every evaluated node's "
                            "(FLM_EVAL_LOGITS_ALL), some (SOME) or none (FLM_EVAL_LOGITS_NONE: flm_tree_logits), not "
                            "the last's");
        st = eval_tree(ctx, a->tokens, a->parent, a->n, a->first, a->pos, a->draft, some ? NULL : a->logits_all,
                       &out->stats, err);
        if (!st && some) st = tree_logits(ctx, a->some, a->n_some, a->logits_all, &out->stats.total, err);
    } else {
        const flm_eval_req rq = {.tokens = a->tokens, .n = a->n, .pos = a->pos, .draft = a->draft,
                                 .logits = a->logits == FLM_EVAL_LOGITS_ALL    ? FLM_LOGITS_ALL
                                           : a->logits == FLM_EVAL_LOGITS_NONE ? FLM_LOGITS_NONE
                                                                               : FLM_LOGITS_LAST,
                                 .logits_all = a->logits_all};
        flm_eval_res res = {0};
        st = flm_eval_run(ctx, &rq, &res, err);
        out->stats.total = res.stats;
        out->stats.n_tokens = res.n_tokens;
        out->stats.n_passes = res.n_passes;
        if (!st && a->logits == FLM_EVAL_LOGITS_ALL)
            out->logits = a->logits_all + (size_t)(a->n - 1) * ctx->model->hp.n_vocab;
        else if (!st && a->logits == FLM_EVAL_LOGITS_LAST)
            out->logits = res.logits;
    }
    out->stats.io_busy_ms = (double)(flm_ctx_io_busy_ns(ctx) - b0) / 1e6;
    out->stats.ms = out->stats.pass_ms = flm_now_ms() - t0;
    return st;
}

flm_status flm_tree_logits(flm_ctx *ctx, uint32_t node, float *logits, flm_error *err) {
    if (!ctx || !logits || !ctx->tree_hidden || node < ctx->tree_hidden_first || node >= ctx->tree_n)
        return flm_fail(err, FLM_ERR_ARG, "tree logits: node %u was not evaluated by the last flm_eval_tree without "
                        "logits", node);
    const uint32_t d = ctx->model->hp.d_model;
    return flm_output_row(ctx, ctx->tree_hidden + (size_t)(node - ctx->tree_hidden_first) * d, logits, err);
}


/* flm_tree_logits_n, its classifier's reads from flash and its time added to tok (NULL: not counted), to the
 * context's totals and to its last token's record: io_ms, bytes_read, n_reads as a pass's, the rest of its wall time
 * as compute_ms (FLM_EVAL_LOGITS_SOME: part of the call that evaluated the tree). */
static flm_status tree_logits(flm_ctx *ctx, const uint32_t *nodes, uint32_t n, float *logits, flm_token_stats *tok,
                              flm_error *err) {
    if (!ctx || !logits || !nodes || n == 0 || !ctx->tree_hidden)
        return flm_fail(err, FLM_ERR_ARG, "tree logits: %u nodes asked, but no flm_eval_tree without logits holds "
                        "them", n);
    for (uint32_t i = 0; i < n; i++)
        if (nodes[i] < ctx->tree_hidden_first || nodes[i] >= ctx->tree_n)
            return flm_fail(err, FLM_ERR_ARG, "tree logits: node %u was not evaluated by the last flm_eval_tree "
                            "without logits", nodes[i]);
    const uint32_t d = ctx->model->hp.d_model;
    const float *x[FLM_TREE_LOGITS_MAX];
    const uint32_t per = FLM_OUTPUT_ROWS_MAX(ctx->s.n_batch); /* nodes per classifier pass (flm_output_rows') */
    for (uint32_t done = 0; done < n;) {
        const uint32_t m = n - done < per ? n - done : per;
        for (uint32_t i = 0; i < m; i++)
            x[i] = ctx->tree_hidden + (size_t)(nodes[done + i] - ctx->tree_hidden_first) * d;
        const double t0 = flm_now_ms();
        flm_token_stats d = {0};
        flm_status st = flm_output_rows_ex(ctx, x, m, false, logits + (size_t)done * ctx->model->hp.n_vocab,
                                           tok ? &d : NULL, err);
        if (tok) { /* the call's, the context's totals and its last token's record: they stay equal sums */
            d.compute_ms = flm_now_ms() - t0 - d.io_ms;
            flm_token_stats *last = ctx->n_tokens ? &ctx->tokens[(ctx->n_tokens - 1) % FLM_STATS_TOKENS] : NULL;
            flm_token_stats *to[3] = {tok, &ctx->total, last};
            for (int i = 0; i < 3; i++) {
                if (!to[i]) continue;
                to[i]->io_ms += d.io_ms;
                to[i]->compute_ms += d.compute_ms;
                to[i]->bytes_read += d.bytes_read;
                to[i]->n_reads += d.n_reads;
            }
        }
        if (st) return st;
        done += m;
    }
    return FLM_OK;
}

flm_status flm_tree_logits_n(flm_ctx *ctx, const uint32_t *nodes, uint32_t n, float *logits, flm_error *err) {
    return tree_logits(ctx, nodes, n, logits, NULL, err);
}

flm_status flm_tree_accept(flm_ctx *ctx, int32_t pos, const uint32_t *path, uint32_t m, flm_error *err) {
    if (!ctx || (m && !path) || ctx->tree_pos != pos || m > ctx->tree_n)
        return flm_fail(err, FLM_ERR_ARG, "tree accept: %u nodes at %d, but the cache holds %u nodes of a tree at %d",
                        m, pos, ctx ? ctx->tree_n : 0, ctx ? ctx->tree_pos : 0);
    for (uint32_t k = 0; k < m; k++)
        if (path[k] >= ctx->tree_n || path[k] < k || (k && path[k] <= path[k - 1]))
            return flm_fail(err, FLM_ERR_ARG, "tree accept: node %u at depth %u is not a node of the path (the cache "
                            "holds %u)", path[k], k, ctx->tree_n);
    for (uint32_t k = 0; k < m; k++) /* slot pos + k <= pos + path[k]; a later source pos + path[k'] > pos + k is
                                        never overwritten first */
        if (path[k] != k) ctx->be.ops->kv_copy(&ctx->be, (uint32_t)pos + k, (uint32_t)pos + path[k]);
    ctx->tree_n = 0;
    ctx->tree_hidden = NULL;
    ctx->next_pos = pos + (int32_t)m;
    return FLM_OK;
}

flm_status flm_seq_tree_logits_n(flm_ctx *ctx, uint32_t seq, const uint32_t *nodes, uint32_t n, float *logits,
                                 flm_error *err) {
    if (!ctx || seq >= ctx->n_seq)
        return flm_fail(err, FLM_ERR_ARG, "tree logits: sequence %u of %u", seq, ctx ? ctx->n_seq : 0);
    pthread_mutex_lock(&ctx->seq_mu);
    seq_switch(ctx, seq);
    const flm_status st = flm_tree_logits_n(ctx, nodes, n, logits, err);
    pthread_mutex_unlock(&ctx->seq_mu);
    return st;
}

flm_status flm_seq_tree_accept(flm_ctx *ctx, uint32_t seq, int32_t pos, const uint32_t *path, uint32_t m,
                               flm_error *err) {
    if (!ctx || seq >= ctx->n_seq)
        return flm_fail(err, FLM_ERR_ARG, "tree accept: sequence %u of %u", seq, ctx ? ctx->n_seq : 0);
    pthread_mutex_lock(&ctx->seq_mu);
    seq_switch(ctx, seq);
    const flm_status st = flm_tree_accept(ctx, pos, path, m, err);
    pthread_mutex_unlock(&ctx->seq_mu);
    return st;
}

int32_t flm_n_past(const flm_ctx *ctx) { return ctx->next_pos; }

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

/* add_bos: the model's special tokens as llama.cpp's add_special (BOS only when add_bos_token says so). */
static unsigned legacy_flags(const flm_ctx *ctx, bool add_bos) {
    return add_bos ? flm_tokenizer_special_flags(ctx->model->tok) : 0u;
}

size_t flm_tokenize(const flm_ctx *ctx, const char *text, bool add_bos, int32_t *ids, size_t cap) {
    return flm_tokenizer_encode_ex(ctx->model->tok, text, strlen(text), legacy_flags(ctx, add_bos), ids, cap);
}

size_t flm_tokenize_spans(const flm_ctx *ctx, const char *text, size_t len, unsigned flags, const size_t *plain,
                          size_t n_plain, int32_t *ids, size_t cap) {
    unsigned f = (flags & FLM_TOKENIZE_ADD_SPECIAL) ? flm_tokenizer_special_flags(ctx->model->tok) : 0u;
    if (flags & FLM_TOKENIZE_PARSE_SPECIAL) f |= FLM_TOKENIZE_PARSE_SPECIAL;
    if (flags & FLM_TOKENIZE_BOS) f |= FLM_TOKENIZE_ADD_BOS;
    return flm_tokenizer_encode_spans(ctx->model->tok, text, len, f, plain, n_plain, ids, cap);
}

size_t flm_tokenize_ex(const flm_ctx *ctx, const char *text, size_t len, unsigned flags, int32_t *ids, size_t cap) {
    return flm_tokenize_spans(ctx, text, len, flags, NULL, 0, ids, cap);
}

int32_t *flm_tokenize_all(const flm_ctx *ctx, const char *text, bool add_bos, size_t *n) {
    size_t len = strlen(text), cap = len + 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return NULL;
    unsigned flags = legacy_flags(ctx, add_bos);
    size_t need = flm_tokenizer_encode_ex(ctx->model->tok, text, len, flags, ids, cap);
    if (need == SIZE_MAX) { free(ids); return NULL; }
    if (need > cap) { /* byte fallback can give several tokens per byte */
        int32_t *more = realloc(ids, need * sizeof *ids);
        if (!more) { free(ids); return NULL; }
        ids = more;
        if (flm_tokenizer_encode_ex(ctx->model->tok, text, len, flags, ids, need) == SIZE_MAX) {
            free(ids);
            return NULL;
        }
    }
    *n = need;
    return ids;
}

bool flm_token_is_eog(const flm_ctx *ctx, int32_t id) { return flm_tokenizer_is_eog(ctx->model->tok, id); }

const char *flm_token_piece(const flm_ctx *ctx, int32_t prev, int32_t id, size_t *len) {
    return flm_tokenizer_piece(ctx->model->tok, prev, id, len);
}

const char *flm_kernels_level_name(int i) { return i < 0 ? NULL : flm_kernel_level_name((flm_kernel_level)i); }

const char *flm_kernels_in_use(const char **cpu_best) {
    if (cpu_best) *cpu_best = flm_kernel_level_name(flm_kernels_cpu_level());
    return flm_kernels_best()->name;
}
