/* attention_batch.c — L_compute: attention for a batch of tokens (a prompt's batch, a verification batch or tree) as
 * blocked matrix products over the KV cache (attention.h flm_attention_batch), the same values as flm_attention per
 * token, bit for bit.
 *
 * One chunk of the pool = one KV head x one block of consecutive tokens (x one group of that KV head's query heads
 * when there are too few chunks for the threads). Its rows r = (token t, query head) form the block; with lo = the
 * smallest first_t and hi = the largest slot:
 *   1. S[r][j - lo] = (q_r . K[j]) * scale for j in lo..hi: k->attn_scores_tile, each key row converted once for all
 *      rows (q_r rounded to f16 first with an f16 cache, as flm_attention does); a row's scores outside its own
 *      first_t..slot_t are computed and not used;
 *   2. per row, on its own positions first_t..slot_t: the tree mask (-inf), flm_softmax, the f16 rounding of the
 *      weights (f16 cache, k->round_f16): the same calls on the same values as flm_attention;
 *   3. out_r = sum_j w_r[j] V[j] over first_t..slot_t in order of j: k->attn_values_tile over the positions every row
 *      of the block sees (max first_t .. min slot_t) for all rows at once, before that and after it per token.
 * Each score and each output element is thus the per-token path's sum, in its order (the kernels' contract); only
 * which rows share a loaded key or value changes. Chunks run largest first (the last tokens see the most positions).
 * Scratch: one slot per thread that can run a chunk at a time (taken and given back with an atomic flag), so it does
 * not grow with the batch; chunks have fewer rows where a long context would take the slots past 2 MiB (the scores of
 * one row over 32k positions: 128 KiB). The slots come from the caller's work area (compute/work.h), which the plan
 * sizes with flm_attention_batch_work. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "compute/attention.h"
#include "compute/kernels.h"
#include "compute/pool.h"
#include "compute/work.h"

#define BATT_ROWS 32    /* query rows a chunk aims at: each key and value row is converted once for them */
#define BATT_MIN_WORK (1u << 17) /* row x position x head_dim products below which one thread runs the batch */
#define BATT_SCRATCH (2u << 20) /* bytes of scratch a call aims to stay within (fewer rows per chunk beyond) */

typedef struct batt {
    const flm_kernels *k;
    const flm_kv_cache *c;
    uint32_t l, pos, n, window;
    const flm_att_tree *tree;
    const float *q;
    size_t q_stride;
    uint32_t n_kv, group, d; /* KV heads, query heads per KV head, head_dim */
    float scale;
    float *out;
    size_t out_stride;
    uint32_t tb, n_tb, hg, n_hg; /* tokens per block and blocks; query heads per group and groups */
    uint32_t max_rows, max_span; /* the largest chunk's rows and positions */
    size_t slot_bytes;
    uint8_t *scratch;   /* n_slots slots of slot_bytes */
    atomic_int *busy;   /* [n_slots] */
    int n_slots;
} batt;

/* The first position row t sees (its window's start, 0 for global attention). */
static uint32_t row_first(const batt *B, uint32_t t) {
    const uint32_t slot = B->pos + t;
    const uint32_t p = B->tree ? B->tree->base + (uint32_t)B->tree->depth[slot - B->tree->base] : slot;
    return B->window && p >= B->window ? p - B->window + 1 : 0;
}

static int take_slot(const batt *B) {
    for (;;)
        for (int i = 0; i < B->n_slots; i++) {
            int z = 0;
            if (atomic_compare_exchange_strong(&B->busy[i], &z, 1)) return i;
        }
}

static void batt_chunk(void *arg, size_t chunk) {
    const batt *B = arg;
    const flm_kv_cache *c = B->c;
    const uint32_t per_tb = B->n_kv * B->n_hg, d = B->d;
    const uint32_t tbi = B->n_tb - 1 - (uint32_t)(chunk / per_tb), rem = (uint32_t)(chunk % per_tb);
    const uint32_t h = rem / B->n_hg, g0 = rem % B->n_hg * B->hg;
    const uint32_t g1 = g0 + B->hg < B->group ? g0 + B->hg : B->group, nh = g1 - g0;
    const uint32_t t0 = tbi * B->tb, t1 = t0 + B->tb < B->n ? t0 + B->tb : B->n;
    const uint32_t R = (t1 - t0) * nh;
    const bool f16 = c->elem_bytes == FLM_KV_F16;
    uint32_t lo = UINT32_MAX, cl = 0;
    for (uint32_t t = t0; t < t1; t++) {
        const uint32_t f = row_first(B, t);
        if (f < lo) lo = f;
        if (f > cl) cl = f;
    }
    const uint32_t hi = B->pos + t1 - 1, ch = B->pos + t0, span = hi - lo + 1;

    const int slot = take_slot(B);
    uint8_t *mem = B->scratch + (size_t)slot * B->slot_bytes;
    const float **qp = (const float **)mem, **wp = qp + B->max_rows;
    float **sp = (float **)(wp + B->max_rows), **op = sp + B->max_rows;
    float *qh = (float *)(op + B->max_rows), *S = qh + (size_t)B->max_rows * d;

    for (uint32_t t = t0; t < t1; t++)
        for (uint32_t g = g0; g < g1; g++) {
            const size_t r = (size_t)(t - t0) * nh + (g - g0), hq = (size_t)h * B->group + g;
            const float *qr = B->q + t * B->q_stride + hq * d;
            if (f16) { /* q rounded to f16, as flm_attention multiplies it with the f16 K cache */
                float *x = qh + r * d;
                B->k->round_f16(x, qr, d);
                qp[r] = x;
            } else {
                qp[r] = qr;
            }
            sp[r] = S + r * span;
            op[r] = B->out + t * B->out_stride + hq * d;
            memset(op[r], 0, d * sizeof(float));
        }
    const size_t koff = (size_t)h * d;
    const void *K = (const uint8_t *)flm_kv_key(c, B->l, lo) + koff * c->elem_bytes;
    B->k->attn_scores_tile(qp, R, K, c->elem_bytes, c->kv_dim, span, d, B->scale, sp);

    const flm_att_tree *T = B->tree;
    for (uint32_t t = t0; t < t1; t++) {
        const uint32_t first = row_first(B, t), slot_t = B->pos + t, m = slot_t - first + 1;
        for (uint32_t g = 0; g < nh; g++) {
            float *a = sp[(size_t)(t - t0) * nh + g] + (first - lo);
            if (T) { /* the context's slots first .. base - 1, then the node's ancestors and itself */
                const uint8_t *anc = T->anc + (size_t)(slot_t - T->base) * T->n_nodes;
                for (uint32_t j = first; j <= slot_t; j++)
                    if (j >= T->base && !anc[j - T->base]) a[j - first] = -INFINITY;
            }
            flm_softmax(B->k, a, m);
            if (f16) B->k->round_f16(a, a, m); /* as llama.cpp */
        }
    }

#define VALUES(rows, nr, from, count)                                                                              \
    do {                                                                                                           \
        for (uint32_t r_ = 0; r_ < (nr); r_++) wp[(rows) + r_] = sp[(rows) + r_] + ((from) - lo);                 \
        B->k->attn_values_tile(wp + (rows), (nr), (const uint8_t *)flm_kv_value(c, B->l, (from)) +                 \
                                   koff * c->elem_bytes, c->elem_bytes, c->kv_dim, (count), d, op + (rows));       \
    } while (0)
    if (cl <= ch) { /* before the common positions, per token; all rows over cl..ch; after them, per token */
        for (uint32_t t = t0; t < t1; t++) {
            const uint32_t first = row_first(B, t);
            if (first < cl) VALUES((t - t0) * nh, nh, first, cl - first);
        }
        VALUES(0, R, cl, ch - cl + 1);
        for (uint32_t t = t0 + 1; t < t1; t++) VALUES((t - t0) * nh, nh, ch + 1, B->pos + t - ch);
    } else {
        for (uint32_t t = t0; t < t1; t++) {
            const uint32_t first = row_first(B, t);
            VALUES((t - t0) * nh, nh, first, B->pos + t - first + 1);
        }
    }
#undef VALUES
    atomic_store(&B->busy[slot], 0);
}

bool flm_attention_batch(const flm_kernels *k, const flm_kv_cache *c, uint32_t l, uint32_t pos, uint32_t n,
                         uint32_t window, const flm_att_tree *tree, const float *q, size_t q_stride, uint32_t n_heads,
                         uint32_t n_kv_heads, uint32_t head_dim, float scale, float *out, size_t out_stride,
                         int n_threads, flm_arena *ws) {
    if (!n) return true;
    if (head_dim > FLM_ATT_MAX_HEAD_DIM) return false; /* the tiles' row buffers (synth writes such a model) */
    batt B = {.k = k, .c = c, .l = l, .pos = pos, .n = n, .window = window, .tree = tree, .q = q,
              .q_stride = q_stride, .n_kv = n_kv_heads, .group = n_heads / n_kv_heads, .d = head_dim,
              .scale = scale, .out = out, .out_stride = out_stride};
    /* the work: sum over tokens of the positions each sees, times the heads and head_dim */
    uint64_t work = 0;
    for (uint32_t t = 0; t < n; t++) work += (uint64_t)(pos + t - row_first(&B, t) + 1);
    work *= (uint64_t)n_heads * head_dim;
    const int threads = n_threads > 1 && work >= BATT_MIN_WORK ? (n_threads < 256 ? n_threads : 256) : 1;
    const uint32_t want = threads > 1 ? 2u * (uint32_t)threads : 1u;
    B.tb = BATT_ROWS / B.group ? BATT_ROWS / B.group : 1;
    if (B.tb > n) B.tb = n;
    while (B.tb > 1 && n_kv_heads * ((n + B.tb - 1) / B.tb) < want) B.tb = (B.tb + 1) / 2;
    const uint32_t blocks = n_kv_heads * ((n + B.tb - 1) / B.tb);
    B.hg = B.group;
    if (blocks < want && B.group > 1) { /* still too few chunks: split each KV head's query heads too */
        uint32_t split = (want + blocks - 1) / blocks;
        if (split > B.group) split = B.group;
        B.hg = (B.group + split - 1) / split;
    }
    size_t n_chunks;
    for (;;) { /* the scratch within BATT_SCRATCH: fewer rows per chunk (a long context) */
        B.n_tb = (n + B.tb - 1) / B.tb;
        B.n_hg = (B.group + B.hg - 1) / B.hg;
        B.max_rows = B.tb * B.hg;
        B.max_span = 0;
        for (uint32_t b = 0; b < B.n_tb; b++) {
            const uint32_t t0 = b * B.tb, t1 = t0 + B.tb < n ? t0 + B.tb : n;
            uint32_t lo = UINT32_MAX;
            for (uint32_t t = t0; t < t1; t++) {
                const uint32_t f = row_first(&B, t);
                if (f < lo) lo = f;
            }
            if (pos + t1 - lo > B.max_span) B.max_span = pos + t1 - lo;
        }
        n_chunks = (size_t)n_kv_heads * B.n_tb * B.n_hg;
        B.n_slots = (size_t)threads < n_chunks ? threads : (int)n_chunks;
        B.slot_bytes = (4 * (size_t)B.max_rows * sizeof(float *) +
                        (size_t)B.max_rows * (head_dim + B.max_span) * sizeof(float) + 63) / 64 * 64;
        if ((size_t)B.n_slots * B.slot_bytes <= BATT_SCRATCH || (B.tb == 1 && B.hg == 1)) break;
        if (B.tb > 1) B.tb = (B.tb + 1) / 2;
        else B.hg = (B.hg + 1) / 2;
    }
    const uint64_t mark = flm_work_mark(ws);
    flm_work_buf sb = flm_work_get(ws, (size_t)B.n_slots * B.slot_bytes);
    flm_work_buf bb = flm_work_get(ws, (size_t)B.n_slots * sizeof *B.busy);
    B.scratch = sb.p;
    B.busy = bb.p;
    if (B.scratch && B.busy) {
        for (int i = 0; i < B.n_slots; i++) atomic_init(&B.busy[i], 0);
        flm_pool_run(threads, n_chunks, batt_chunk, &B);
    }
    flm_work_put(ws, mark, &sb);
    flm_work_put(ws, mark, &bb);
    return B.scratch && B.busy;
}

/* bytes of the slots of n_slots chunks of `rows` query rows over `span` positions (flm_attention_batch's sizing) */
static size_t slots_bytes(size_t n_slots, size_t rows, size_t head_dim, size_t span) {
    return n_slots * ((4 * rows * sizeof(float *) + rows * (head_dim + span) * sizeof(float) + 63) / 64 * 64);
}

size_t flm_attention_batch_work(uint32_t n_ctx, uint32_t n_batch, uint32_t n_heads, uint32_t n_kv_heads,
                                uint32_t head_dim, int n_threads) {
    if (n_batch <= 1 || !n_kv_heads) return 0;
    const size_t T = n_threads > 1 ? (n_threads < 256 ? (size_t)n_threads : 256) : 1;
    const uint32_t group = n_heads / n_kv_heads ? n_heads / n_kv_heads : 1;
    uint32_t tb = BATT_ROWS / group ? BATT_ROWS / group : 1;
    if (tb > n_batch) tb = n_batch;
    /* the first sizing (rows only shrink from it), else where the halving stops: within BATT_SCRATCH, or one row */
    const size_t first = slots_bytes(T, (size_t)tb * group, head_dim, n_ctx), last = slots_bytes(T, 1, head_dim, n_ctx);
    size_t s = first;
    if (s > BATT_SCRATCH) s = last > BATT_SCRATCH ? last : BATT_SCRATCH;
    if (s > first) s = first;
    return s + ((T * sizeof(atomic_int) + 63) & ~(size_t)63) + 2 * 64; /* the busy flags, the carves' alignment */
}
