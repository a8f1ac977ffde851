/* coact.c — flm_coact_order (include/flashlm_tools.h): store each layer's FFN neurons so that the neurons the
 * predictor flags together lie next to each other in the file, so that the sparse mode's reads of a token are fewer
 * and larger (PowerInfer-2 clusters co-activated neurons; the paper bundles per neuron). docs/SPARSITY.md,
 * "Co-activation order".
 *
 * What is measured: the sets the sparse mode reads, i.e. each layer's predicted set {i : z_i > threshold} (its own
 * predictor at the default level, false positives included), on the FFN inputs of a text: the model runs densely
 * (ram mode, batches) and a tap records every layer's FFN input; the predictors then run on them as matrix
 * products. The first token of each chunk is left out (the sparse mode runs it dense).
 *
 * The order: neuron i's predicted sets over the ordering's tokens form a bit vector a_i. For one token, the number of
 * separate runs of records its set makes in the file is half the number of neighbours (i, i + 1) of which exactly one
 * is in the set; summed over tokens that is sum_i |a_i XOR a_{i+1}| / 2 (the Hamming distance of neighbours). So the
 * order is a short path through the neurons under the Hamming distance: built greedily (nearest unplaced neighbour
 * of the last placed neuron, starting from the most often flagged one), then shortened by 2-opt moves within 64
 * places (3 sweeps); O(d_ffn^2 tokens / 64) word operations per layer and O(d_ffn tokens) bits of memory.
 * (Measured on the 4-layer OPT-shaped model of docs/SPARSITY.md: ordering on the sets past a window of 4 tokens, or
 * hottest first, gave more reads on held-out tokens than this.)
 *
 * What it does to the file: flm_file_permute_ffn_ex stores the records, the FFN biases (OPT) and the predictors'
 * per-neuron rows (B, c) in the new order, and the predictor region records each record's original neuron
 * (flm_predictor_layer.orig), so the sparse mode flags the same neurons as before (each under its new id) and sums
 * them in the original order: its logits are the unordered file's bit for bit. The regions are marked
 * FLM_FFN_COACT_ORDER (a hot order is replaced). */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "calibrate/calibrate.h"
#include "compute/kernels.h"
#include "core/error.h"
#include "core/types.h"
#include "core/util.h"
#include "format/tokenizer.h"
#include "runtime/hooks.h"
#include "sparsity/sparsity.h"
#include "write/flm_write.h"

/* Every layer's FFN input for every token, in memory: layer l's token t at X[l] + t * d. */
typedef struct {
    float **X;
    uint32_t *next;
    uint32_t n, d;
} coact_tap;

static void coact_tap_fn(void *user, uint32_t layer, const float *x) {
    coact_tap *t = user;
    if (t->next[layer] >= t->n) return;
    memcpy(t->X[layer] + (size_t)t->next[layer]++ * t->d, x, t->d * sizeof(float));
}

void flm_coact_opts_default(flm_coact_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_tokens = 1024;
    o->chunk = 128;
    o->n_threads = 2;
    o->held_out = 0.25f;
    o->window = 4;
    o->gap_bytes = 10000;
}

/* popcount of a & b over w words (x86: a POPCNT clone chosen at load time, the inner loop of the ordering) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("popcnt", "default")))
#endif
static uint32_t and_count(const uint64_t *a, const uint64_t *b, uint32_t w) {
    uint32_t s = 0;
    for (uint32_t k = 0; k < w; k++) s += (uint32_t)__builtin_popcountll(a[k] & b[k]);
    return s;
}

/* The greedy path: order[0 .. F) from bits [F][w] (neuron-major) and each neuron's count cnt[F]. left: F scratch. */
static void greedy_path(const uint64_t *bits, const uint32_t *cnt, uint32_t F, uint32_t w, uint32_t *order,
                        uint32_t *left) {
    uint32_t start = 0;
    for (uint32_t i = 0; i < F; i++) {
        left[i] = i;
        if (cnt[i] > cnt[start]) start = i;
    }
    uint32_t n_left = F;
    left[start] = left[--n_left];
    order[0] = start;
    for (uint32_t k = 1; k < F; k++) {
        const uint32_t c = order[k - 1];
        const uint64_t *bc = bits + (size_t)c * w;
        uint32_t best = 0;
        int64_t best_d = INT64_MAX;
        for (uint32_t j = 0; j < n_left; j++) {
            const uint32_t i = left[j];
            int64_t dist = (int64_t)cnt[c] + cnt[i];
            if (dist - 2 * (int64_t)(cnt[c] < cnt[i] ? cnt[c] : cnt[i]) >= best_d) continue; /* cannot beat it */
            dist -= 2 * (int64_t)and_count(bc, bits + (size_t)i * w, w);
            if (dist < best_d || (dist == best_d && i < left[best])) {
                best_d = dist;
                best = j;
            }
        }
        order[k] = left[best];
        left[best] = left[--n_left];
    }
}

static inline int64_t hamming(const uint64_t *bits, const uint32_t *cnt, uint32_t w, uint32_t a, uint32_t b) {
    return (int64_t)cnt[a] + cnt[b] - 2 * (int64_t)and_count(bits + (size_t)a * w, bits + (size_t)b * w, w);
}

/* Local improvement of the path (2-opt within a window): reverse order[i + 1 .. j] when that shortens it, j at most
 * `win` past i; `passes` sweeps. */
static void two_opt(const uint64_t *bits, const uint32_t *cnt, uint32_t F, uint32_t w, uint32_t *o, uint32_t win,
                    int passes) {
    for (int pass = 0; pass < passes; pass++) {
        uint64_t moves = 0;
        for (uint32_t i = 0; i + 2 < F; i++) {
            const uint32_t a = o[i];
            int64_t dab = hamming(bits, cnt, w, a, o[i + 1]);
            for (uint32_t j = i + 2; j < F && j <= i + win; j++) {
                const uint32_t b = o[i + 1], c = o[j];
                int64_t before = dab, after = hamming(bits, cnt, w, a, c);
                if (j + 1 < F) {
                    before += hamming(bits, cnt, w, c, o[j + 1]);
                    after += hamming(bits, cnt, w, b, o[j + 1]);
                }
                if (after < before) {
                    for (uint32_t x = i + 1, y = j; x < y; x++, y--) {
                        uint32_t t = o[x];
                        o[x] = o[y];
                        o[y] = t;
                    }
                    dab = hamming(bits, cnt, w, a, o[i + 1]);
                    moves++;
                }
            }
        }
        if (!moves) break;
    }
}

/* Reads and bytes that the reader's planner (io/plan.c) makes of one token's records at positions pos[0 .. n)
 * (sorted, record_bytes each from the region's start, which is 4 KiB-aligned): each record's 4 KiB-aligned span,
 * merged with the previous group when they touch or the gap is below gap bytes (within max_request), groups split in
 * max_request pieces. */
static void plan_cost(const uint32_t *pos, uint32_t n, uint64_t rb, uint64_t gap, uint64_t max_request,
                      uint64_t *reads, uint64_t *bytes) {
    uint64_t g0 = 0, g1 = 0;
    bool open = false;
    for (uint32_t k = 0; k <= n; k++) {
        uint64_t a0 = 0, a1 = 0;
        if (k < n) {
            a0 = flm_align_down((uint64_t)pos[k] * rb, FLM_ALIGN);
            a1 = flm_align_up((uint64_t)(pos[k] + 1) * rb, FLM_ALIGN);
            if (open) {
                uint64_t e = a1 > g1 ? a1 : g1;
                if (a0 <= g1 || (a0 - g1 < gap && e - g0 <= max_request)) {
                    g1 = e;
                    continue;
                }
            }
        }
        if (open) {
            *reads += (g1 - g0 + max_request - 1) / max_request;
            *bytes += g1 - g0;
        }
        g0 = a0;
        g1 = a1;
        open = k < n;
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The held-out tokens' cost under an order (inv: neuron -> position): every predicted neuron read (window 0), or
 * those not flagged on the window previous tokens of the chunk. sets: token-major bitsets [n_ho][fw]. */
static void eval_order(const uint64_t *sets, uint32_t n_ho, uint32_t fw, uint32_t F, const uint8_t *first,
                       uint32_t window, const uint32_t *inv, uint64_t rb, uint64_t gap, uint32_t *pos, uint64_t *reads,
                       uint64_t *bytes) {
    for (uint32_t t = 0; t < n_ho; t++) {
        uint32_t n = 0;
        for (uint32_t wd = 0; wd < fw; wd++) {
            uint64_t m = sets[(size_t)t * fw + wd];
            for (uint32_t b = 1; b <= window && b <= t; b++) {
                if (first[t - b + 1]) break; /* the window starts with the chunk */
                m &= ~sets[(size_t)(t - b) * fw + wd];
            }
            for (; m; m &= m - 1) {
                uint32_t i = wd * 64u + (uint32_t)__builtin_ctzll(m);
                if (i < F) pos[n++] = inv[i];
            }
        }
        qsort(pos, n, sizeof *pos, cmp_u32);
        plan_cost(pos, n, rb, gap, UINT64_C(1) << 20, reads, bytes);
    }
}

flm_status flm_coact_order_unlocked(const char *path, const char *text, const flm_coact_opts *o,
                                    flm_coact_report *rep, flm_error *err) {
    double t_start = flm_now_ms();
    flm_params p;
    flm_params_default(&p);
    p.mode = FLM_MODE_RAM;
    p.n_ctx = (int)o->chunk;
    if (o->n_threads > 0) p.n_threads = o->n_threads;
    flm_ctx *ctx = NULL;
    flm_status st = flm_open(path, &p, &ctx, err);
    if (st) return st;
    coact_tap td = {0};
    flm_predictor_region sp = {0};
    void *region = NULL;
    uint8_t *out_region = NULL, *first = NULL;
    int32_t *ids = NULL, *chunk_toks = NULL;
    uint32_t **perm = NULL, *inv = NULL, *left = NULL, *cnt = NULL, *pos = NULL;
    uint64_t *bits = NULL, *sets = NULL, *rbytes = NULL;
    float *A = NULL, *B = NULL, *H = NULL, *Z = NULL;
    const flm_model *model = flm_ctx_model(ctx);
    const flm_hparams hp = model->hp;
    const flm_file *file = flm_ctx_file(ctx); /* until ctx closes */
    const uint32_t L = hp.n_layers, d = hp.d_model, F = hp.d_ffn;
    if (!file) { st = flm_fail(err, FLM_ERR_ARG, "%s: the co-activation order needs a .flm file", path); goto done; }
    if (!file->predictor) {
        st = flm_fail(err, FLM_ERR_ARG, "%s: the co-activation order follows the predictors' sets: run `flashlm "
                      "calibrate %s --text FILE` first", path, path);
        goto done;
    }
    if ((st = flm_file_read_region(file, file->predictor, &region, err)) ||
        (st = flm_predictor_region_deserialize(region, file->predictor->size, path, &sp, err)))
        goto done;
    if (sp.n_layers != L) {
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: predictor region has %u layers, the model %u", path, sp.n_layers, L);
        goto done;
    }
    flm_predictor_region_use_level(&sp, sp.default_level);
    for (uint32_t l = 0; l < L; l++)
        if (sp.layers[l].pred.d_model != d || sp.layers[l].pred.d_ffn != F || file->ffn[l]->n_records != F) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: layer %u's predictor or FFN region does not match d_model %u, "
                          "d_ffn %u", path, l, d, F);
            goto done;
        }
    /* 1. the text's FFN inputs, chunk by chunk from position 0 (BOS first when the model adds one), in batches */
    size_t n_tok = 0;
    if ((st = flm_calib_tokens(ctx, text, o->text_file, o->text_files, o->chunk, false, o->max_tokens, &ids, &n_tok,
                               err)))
        goto done;
    uint32_t n = (uint32_t)(n_tok < o->max_tokens ? n_tok : o->max_tokens);
    n -= n % o->chunk;
    uint32_t n_tr = (uint32_t)((double)n * (1.0 - o->held_out));
    n_tr -= n_tr % o->chunk;
    if (n_tr < o->chunk) {
        st = flm_fail(err, FLM_ERR_ARG, "co-activation order: the text gives %zu tokens; at least %u are needed (%u "
                      "whole chunks of %u to order on, after %.0f%% held out)", n_tok,
                      (uint32_t)ceil(o->chunk / (1.0 - o->held_out)), 1u, o->chunk, 100.0 * o->held_out);
        goto done;
    }
    const uint32_t n_ho = n - n_tr;
    td.n = n;
    td.d = d;
    td.X = calloc(L, sizeof *td.X);
    td.next = calloc(L, sizeof *td.next);
    chunk_toks = malloc((size_t)o->chunk * sizeof *chunk_toks);
    if (!td.X || !td.next || !chunk_toks) { st = flm_fail(err, FLM_ERR_NOMEM, "co-activation order: out of memory"); goto done; }
    for (uint32_t l = 0; l < L; l++)
        if (!(td.X[l] = malloc((size_t)n * d * sizeof(float)))) {
            st = flm_fail(err, FLM_ERR_NOMEM, "co-activation order: cannot hold %u tokens x %u layers of FFN inputs",
                          n, L);
            goto done;
        }
    const flm_ffn_hooks hooks = {.tap = coact_tap_fn, .tap_user = &td};
    const int32_t bos = flm_tokenizer_wants_bos(model->tok) ? flm_tokenizer_bos(model->tok) : -1;
    for (uint32_t t = 0; t < n; t += o->chunk) {
        const uint32_t b = (uint32_t)flm_ctx_params(ctx)->n_batch;
        memcpy(chunk_toks, ids + t, (size_t)o->chunk * sizeof *chunk_toks);
        if (bos >= 0) chunk_toks[0] = bos;
        for (uint32_t j = 0; j < o->chunk; j += b) {
            const float *logits;
            const uint32_t c = o->chunk - j < b ? o->chunk - j : b;
            if ((st = flm_eval_hooked(ctx, chunk_toks + j, c, (int32_t)j, &hooks, NULL, &logits, err))) goto done;
            if (o->progress) o->progress(o->user, "recording tokens", t + j + c, n);
        }
    }
    if (!(rbytes = malloc(L * sizeof *rbytes))) { st = flm_fail(err, FLM_ERR_NOMEM, "out of memory"); goto done; }
    for (uint32_t l = 0; l < L; l++) rbytes[l] = file->ffn[l]->record_bytes;
    flm_close(ctx); /* its memory is the ordering's now; the file is rewritten below */
    ctx = NULL;
    file = NULL;
    /* 2. per layer: the predicted sets, the order, its cost on the held-out tokens against the old one */
    const uint32_t w = (n_tr + 63) / 64, fw = (F + 63) / 64;
    uint32_t max_rank = 0;
    for (uint32_t l = 0; l < L; l++)
        if (sp.layers[l].pred.rank > max_rank) max_rank = sp.layers[l].pred.rank;
    perm = calloc(L, sizeof *perm);
    inv = malloc(F * sizeof *inv);
    left = malloc(F * sizeof *left);
    cnt = malloc(F * sizeof *cnt);
    pos = malloc(F * sizeof *pos);
    bits = malloc((size_t)F * w * sizeof *bits);
    sets = malloc(((size_t)n_ho * fw + 1) * sizeof *sets);
    first = malloc(n_ho + 1);
    A = malloc((size_t)max_rank * d * sizeof *A);
    B = malloc((size_t)F * max_rank * sizeof *B);
    H = malloc((size_t)o->chunk * max_rank * sizeof *H);
    Z = malloc((size_t)o->chunk * F * sizeof *Z);
    if (!perm || !inv || !left || !cnt || !pos || !bits || !sets || !first || !A || !B || !H || !Z) {
        st = flm_fail(err, FLM_ERR_NOMEM, "co-activation order: out of memory for %u tokens x %u neurons", n, F);
        goto done;
    }
    for (uint32_t t = 0; t < n_ho; t++) first[t] = (n_tr + t) % o->chunk == 0;
    flm_coact_report r = {.n_layers = L, .n_order = n_tr - n_tr / o->chunk, .n_held = n_ho - n_ho / o->chunk,
                          .window = o->window, .gap_bytes = o->gap_bytes};
    for (uint32_t l = 0; l < L; l++) {
        const flm_predictor *q = &sp.layers[l].pred;
        const uint32_t rk = q->rank;
        for (size_t i = 0; i < (size_t)rk * d; i++) A[i] = q->A ? q->A[i] : flm_f16_to_f32(q->A16[i]);
        for (size_t i = 0; i < (size_t)F * rk; i++) B[i] = q->B ? q->B[i] : flm_f16_to_f32(q->B16[i]);
        memset(bits, 0, (size_t)F * w * sizeof *bits);
        memset(sets, 0, ((size_t)n_ho * fw + 1) * sizeof *sets);
        for (uint32_t t0 = 0; t0 < n; t0 += o->chunk) { /* Z = (X A^T) B^T + c, a chunk at a time */
            const float *X = td.X[l] + (size_t)t0 * d;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)o->chunk, (int)rk, (int)d, 1.0f, X, (int)d, A,
                        (int)d, 0.0f, H, (int)rk);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)o->chunk, (int)F, (int)rk, 1.0f, H, (int)rk, B,
                        (int)rk, 0.0f, Z, (int)F);
            for (uint32_t j = 1; j < o->chunk; j++) { /* position 0 runs dense: not a predicted set */
                const uint32_t t = t0 + j;
                const float *z = Z + (size_t)j * F;
                for (uint32_t i = 0; i < F; i++) {
                    if (!(z[i] + q->c[i] > q->threshold)) continue;
                    if (t < n_tr) bits[(size_t)i * w + t / 64] |= UINT64_C(1) << (t % 64);
                    else sets[(size_t)(t - n_tr) * fw + i / 64] |= UINT64_C(1) << (i % 64);
                }
            }
        }
        for (uint32_t i = 0; i < F; i++) {
            uint32_t c = 0;
            for (uint32_t k = 0; k < w; k++) c += (uint32_t)__builtin_popcountll(bits[(size_t)i * w + k]);
            cnt[i] = c;
        }
        if (!(perm[l] = malloc(F * sizeof **perm))) { st = flm_fail(err, FLM_ERR_NOMEM, "out of memory"); goto done; }
        greedy_path(bits, cnt, F, w, perm[l], left);
        two_opt(bits, cnt, F, w, perm[l], 64, 3);
        const uint64_t rb = rbytes[l];
        for (int after = 0; after < 2; after++) {
            for (uint32_t i = 0; i < F; i++) inv[after ? perm[l][i] : i] = i;
            for (int win = 0; win < 2; win++) {
                uint64_t reads = 0, bytes = 0;
                eval_order(sets, n_ho, fw, F, first, win ? o->window : 0, inv, rb, o->gap_bytes, pos, &reads, &bytes);
                r.reads[win][after] += (double)reads / (r.n_held ? r.n_held : 1);
                r.mib[win][after] += (double)bytes / 1048576.0 / (r.n_held ? r.n_held : 1);
            }
        }
        if (o->progress) o->progress(o->user, "ordering neurons", l + 1, L);
    }
    /* 3. the predictors' per-neuron rows in the new order, then the file */
    for (uint32_t l = 0; l < L; l++) {
        flm_predictor *q = &sp.layers[l].pred;
        const uint32_t rk = q->rank, *pm = perm[l];
        float *c2 = malloc(F * sizeof *c2);
        void *b2 = malloc((size_t)F * rk * (q->B ? sizeof(float) : sizeof(uint16_t)));
        if (!c2 || !b2) {
            free(c2);
            free(b2);
            st = flm_fail(err, FLM_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (uint32_t i = 0; i < F; i++) {
            c2[i] = q->c[pm[i]];
            if (q->B) memcpy((float *)b2 + (size_t)i * rk, q->B + (size_t)pm[i] * rk, rk * sizeof(float));
            else memcpy((uint16_t *)b2 + (size_t)i * rk, q->B16 + (size_t)pm[i] * rk, rk * sizeof(uint16_t));
        }
        free(q->c);
        q->c = c2;
        if (q->B) { free(q->B); q->B = b2; }
        else { free(q->B16); q->B16 = b2; }
        /* the neuron each record was in the file before any co-activation order: the sparse mode sums in that order */
        uint32_t *o2 = malloc(F * sizeof *o2);
        if (!o2) { st = flm_fail(err, FLM_ERR_NOMEM, "out of memory"); goto done; }
        for (uint32_t i = 0; i < F; i++) o2[i] = sp.layers[l].orig ? sp.layers[l].orig[pm[i]] : pm[i];
        free(sp.layers[l].orig);
        sp.layers[l].orig = o2;
    }
    size_t len = 0;
    if ((st = flm_predictor_region_serialize(&sp, &out_region, &len, err))) goto done;
    if (o->progress) o->progress(o->user, "writing the co-activation order", 0, 1);
    if ((st = flm_file_permute_ffn_ex(path, o->out_path ? o->out_path : path, (const uint32_t *const *)perm,
                                      FLM_FFN_COACT_ORDER, true, out_region, len, err)))
        goto done;
    if (o->progress) o->progress(o->user, "writing the co-activation order", 1, 1);
    r.seconds = (flm_now_ms() - t_start) / 1e3;
    if (rep) *rep = r;
done:
    if (ctx) flm_close(ctx);
    for (uint32_t l = 0; td.X && l < L; l++) free(td.X[l]);
    free(td.X);
    free(td.next);
    for (uint32_t l = 0; perm && l < L; l++) free(perm[l]);
    free(perm);
    free(chunk_toks);
    free(ids);
    free(region);
    free(out_region);
    flm_predictor_region_free(&sp);
    free(inv);
    free(left);
    free(cnt);
    free(pos);
    free(bits);
    free(sets);
    free(first);
    free(rbytes);
    free(A);
    free(B);
    free(H);
    free(Z);
    return st;
}

flm_status flm_coact_order(const char *path, const flm_coact_opts *o, flm_coact_report *rep, flm_error *err) {
    flm_coact_opts dflt;
    if (!o) { flm_coact_opts_default(&dflt); o = &dflt; }
    if (!path || !flm_calib_has_text(o->text, o->text_file, o->text_files))
        return flm_fail(err, FLM_ERR_ARG, "co-activation order: no file or no text");
    if (o->chunk < 16 || o->max_tokens < o->chunk || !(o->held_out >= 0.0f && o->held_out < 1.0f))
        return flm_fail(err, FLM_ERR_ARG, "co-activation order: bad options (chunk >= 16, max_tokens >= chunk, "
                        "0 <= held_out < 1)");
    flm_status st = FLM_OK;
    int fd = flm_calib_lock(path, &st, err);
    if (fd < 0) return st;
    st = flm_coact_order_unlocked(path, o->text, o, rep, err);
    close(fd);
    return st;
}
