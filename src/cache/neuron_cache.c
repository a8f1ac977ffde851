/* neuron_cache.c — one FFN layer's neuron cache with a sliding window (Knowl 3, Knowl 5). See neuron_cache.h and
 * docs/CACHE.md. */
#include "cache/neuron_cache.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/util.h"

struct flm_ncache {
    uint32_t d_ffn;
    uint32_t capacity;     /* rows of the matrix */
    uint32_t window;       /* k >= 1 */
    uint32_t max_set;      /* largest n a step accepts */
    uint32_t slot;         /* ids stored per ring slot: min(max_set, capacity) (a larger set is refused anyway) */
    uint64_t record_bytes;

    uint8_t *matrix;       /* capacity * record_bytes, FLM_NCACHE_ALIGN-aligned */
    uint32_t rows_used;

    uint32_t *row_neuron;  /* [capacity] */
    int32_t *neuron_row;   /* [d_ffn], -1 when not cached */
    uint32_t *refcnt;      /* [d_ffn] */

    uint32_t *ring_ids;    /* [window * slot]: slot s holds ring_n[s] ids at ring_ids + s * slot */
    uint32_t *ring_n;      /* [window] */
    uint32_t ring_head;    /* slot of the oldest set */
    uint32_t ring_count;   /* sets in the window */

    uint8_t **out_load_rows; /* [slot] per-step outputs */
    uint32_t *out_load_ids;  /* [slot] */
    uint32_t *out_rows;      /* [slot] */

    void *meta;            /* one block holding every array above but the matrix */
};

/* ---------------------------------------------------------------------------------------------------------------
 * Sizes
 * ------------------------------------------------------------------------------------------------------------- */

typedef struct sizes {
    uint32_t d_ffn, capacity, window, max_set, slot;
    uint64_t record_bytes;
    uint64_t matrix_bytes;      /* rounded up to FLM_NCACHE_ALIGN */
    uint64_t off_load_rows, off_load_ids, off_rows, off_row_neuron, off_neuron_row, off_refcnt, off_ring_n,
        off_ring_ids, meta_bytes;
} sizes;

/* Normalize the arguments and lay out the allocations. Returns false when create must refuse them. */
static bool plan_sizes(uint32_t d_ffn, uint64_t record_bytes, uint32_t capacity, uint32_t window, uint32_t max_set,
                       sizes *z) {
    if (d_ffn == 0 || record_bytes == 0 || capacity == 0) return false;
    memset(z, 0, sizeof *z);
    z->d_ffn = d_ffn;
    z->record_bytes = record_bytes;
    z->capacity = capacity > d_ffn ? d_ffn : capacity;
    if (z->capacity > (uint32_t)INT32_MAX) return false; /* rows are stored as int32_t */
    z->window = window == 0 ? 1 : window;
    z->max_set = (max_set == 0 || max_set > d_ffn) ? d_ffn : max_set;
    z->slot = z->max_set < z->capacity ? z->max_set : z->capacity;

    if (record_bytes > (UINT64_MAX - FLM_NCACHE_ALIGN) / z->capacity) return false;
    z->matrix_bytes = flm_align_up(z->capacity * record_bytes, FLM_NCACHE_ALIGN);

    /* The metadata block: the pointer array first (8-byte alignment), then 4-byte arrays. Every term below is at
     * most 16 * 2^32 except the ring, which is checked. */
    uint64_t off = 0;
    z->off_load_rows = off, off += (uint64_t)z->slot * sizeof(uint8_t *);
    z->off_load_ids = off, off += 4ull * z->slot;
    z->off_rows = off, off += 4ull * z->slot;
    z->off_row_neuron = off, off += 4ull * z->capacity;
    z->off_neuron_row = off, off += 4ull * d_ffn;
    z->off_refcnt = off, off += 4ull * d_ffn;
    z->off_ring_n = off, off += 4ull * z->window;
    z->off_ring_ids = off;
    if ((uint64_t)z->slot > (UINT64_MAX / 8) / z->window) return false;
    uint64_t ring = 4ull * z->window * z->slot;
    if (ring > UINT64_MAX / 4 - off) return false;
    z->meta_bytes = off + ring;
    if (z->matrix_bytes > UINT64_MAX / 4 - z->meta_bytes) return false;
    if (z->matrix_bytes > SIZE_MAX || z->meta_bytes > SIZE_MAX) return false;
    return true;
}

static uint64_t total_bytes(const sizes *z) { return z->matrix_bytes + z->meta_bytes + sizeof(flm_ncache); }

uint64_t flm_ncache_bytes(uint32_t d_ffn, uint64_t record_bytes, uint32_t capacity, uint32_t window,
                          uint32_t max_set) {
    sizes z;
    if (!plan_sizes(d_ffn, record_bytes, capacity, window, max_set, &z)) return UINT64_MAX;
    return total_bytes(&z);
}

uint32_t flm_ncache_capacity_for(uint64_t budget_bytes, uint32_t d_ffn, uint64_t record_bytes, uint32_t window,
                                 uint32_t max_set) {
    /* flm_ncache_bytes is nondecreasing in capacity: binary search for the last capacity that fits. */
    uint32_t lo = 0, hi = d_ffn; /* invariant: lo fits (0 trivially), everything above hi does not */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (flm_ncache_bytes(d_ffn, record_bytes, mid, window, max_set) <= budget_bytes) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Create / free
 * ------------------------------------------------------------------------------------------------------------- */

flm_status flm_ncache_create(uint32_t d_ffn, uint64_t record_bytes, uint32_t capacity, uint32_t window,
                             uint32_t max_set, flm_ncache **out, flm_error *err) {
    if (!out) return flm_fail(err, FLM_ERR_ARG, "neuron cache: out is NULL");
    *out = NULL;
    sizes z;
    if (!plan_sizes(d_ffn, record_bytes, capacity, window, max_set, &z))
        return flm_fail(err, FLM_ERR_ARG,
                        "neuron cache: bad sizes (d_ffn %u, record_bytes %llu, capacity %u, window %u, max_set %u): "
                        "each of d_ffn, record_bytes, capacity must be > 0 and the total size must fit in memory",
                        d_ffn, (unsigned long long)record_bytes, capacity, window, max_set);

    flm_ncache *c = calloc(1, sizeof *c);
    if (!c) return flm_fail(err, FLM_ERR_NOMEM, "neuron cache: out of memory (%zu bytes)", sizeof *c);
    c->matrix = aligned_alloc(FLM_NCACHE_ALIGN, (size_t)z.matrix_bytes);
    c->meta = malloc((size_t)z.meta_bytes);
    if (!c->matrix || !c->meta) {
        flm_ncache_free(c);
        return flm_fail(err, FLM_ERR_NOMEM, "neuron cache: out of memory (%llu bytes for %u rows of %llu bytes)",
                        (unsigned long long)total_bytes(&z), z.capacity, (unsigned long long)record_bytes);
    }
    c->d_ffn = z.d_ffn;
    c->capacity = z.capacity;
    c->window = z.window;
    c->max_set = z.max_set;
    c->slot = z.slot;
    c->record_bytes = z.record_bytes;

    uint8_t *m = c->meta;
    c->out_load_rows = (uint8_t **)(void *)(m + z.off_load_rows);
    c->out_load_ids = (uint32_t *)(void *)(m + z.off_load_ids);
    c->out_rows = (uint32_t *)(void *)(m + z.off_rows);
    c->row_neuron = (uint32_t *)(void *)(m + z.off_row_neuron);
    c->neuron_row = (int32_t *)(void *)(m + z.off_neuron_row);
    c->refcnt = (uint32_t *)(void *)(m + z.off_refcnt);
    c->ring_n = (uint32_t *)(void *)(m + z.off_ring_n);
    c->ring_ids = (uint32_t *)(void *)(m + z.off_ring_ids);

    /* Touch the metadata now (it is small and all of it is used); the matrix is left to the first loads. */
    memset(c->meta, 0, (size_t)z.meta_bytes);
    for (uint32_t i = 0; i < c->d_ffn; i++) c->neuron_row[i] = -1;
    *out = c;
    return FLM_OK;
}

void flm_ncache_free(flm_ncache *c) {
    if (!c) return;
    free(c->matrix);
    free(c->meta);
    free(c);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Step
 * ------------------------------------------------------------------------------------------------------------- */

/* Swap-delete neuron id (cached, refcount 0): copy the last occupied row over its row (Knowl 5). */
static void delete_neuron(flm_ncache *c, uint32_t id, flm_ncache_stats *s) {
    uint32_t r = (uint32_t)c->neuron_row[id];
    uint32_t last = c->rows_used - 1;
    if (r != last) {
        memcpy(c->matrix + (size_t)r * c->record_bytes, c->matrix + (size_t)last * c->record_bytes,
               (size_t)c->record_bytes);
        uint32_t moved = c->row_neuron[last];
        c->row_neuron[r] = moved;
        c->neuron_row[moved] = (int32_t)r;
        s->n_moved++;
    }
    c->neuron_row[id] = -1;
    c->rows_used = last;
    s->n_deleted++;
}

/* The oldest set leaves the window: decrement its neurons, delete those reaching 0. */
static void drop_oldest(flm_ncache *c, flm_ncache_stats *s) {
    const uint32_t *set = c->ring_ids + (size_t)c->ring_head * c->slot;
    uint32_t n = c->ring_n[c->ring_head];
    for (uint32_t j = 0; j < n; j++)
        if (--c->refcnt[set[j]] == 0) delete_neuron(c, set[j], s);
    c->ring_head = c->ring_head + 1 == c->window ? 0 : c->ring_head + 1;
    c->ring_count--;
}

static void clear_outputs(flm_ncache_stats *st, const uint32_t **load_ids, uint8_t *const **load_rows,
                          const uint32_t **rows) {
    if (st) memset(st, 0, sizeof *st);
    if (load_ids) *load_ids = NULL;
    if (load_rows) *load_rows = NULL;
    if (rows) *rows = NULL;
}

flm_status flm_ncache_step(flm_ncache *c, const uint32_t *ids, uint32_t n, flm_ncache_stats *st,
                           const uint32_t **load_ids, uint8_t *const **load_rows, const uint32_t **rows,
                           flm_error *err) {
    clear_outputs(st, load_ids, load_rows, rows);
    if (!c) return flm_fail(err, FLM_ERR_ARG, "neuron cache: cache is NULL");
    if (n > 0 && !ids) return flm_fail(err, FLM_ERR_ARG, "neuron cache: ids is NULL with n = %u", n);
    if (n > c->max_set)
        return flm_fail(err, FLM_ERR_ARG, "neuron cache: active set of %u neurons exceeds max_set %u", n, c->max_set);
    for (uint32_t j = 0; j < n; j++) {
        if (ids[j] >= c->d_ffn)
            return flm_fail(err, FLM_ERR_ARG, "neuron cache: active neuron id %u (index %u) >= d_ffn %u", ids[j], j,
                            c->d_ffn);
        if (j > 0 && ids[j] <= ids[j - 1])
            return flm_fail(err, FLM_ERR_ARG,
                            "neuron cache: active set not strictly ascending at index %u (%u after %u)", j, ids[j],
                            ids[j - 1]);
    }
    if (n > c->capacity)
        return flm_fail(err, FLM_ERR_BUDGET,
                        "neuron cache: the token's active set has %u neurons but the cache holds at most %u rows "
                        "(%llu bytes each); raise the memory budget or the predictor threshold",
                        n, c->capacity, (unsigned long long)c->record_bytes);

    flm_ncache_stats s = {0};
    s.n_active = n;

    /* 1. S_t enters first, so a neuron in both S_t and a leaving set keeps a count > 0 and is not deleted.
     *    Before the step, cached <=> refcount > 0, so the missing neurons are those whose count was 0. */
    uint32_t missing = 0;
    for (uint32_t j = 0; j < n; j++)
        if (c->refcnt[ids[j]]++ == 0) missing++;

    /* 2. The token k steps back leaves the window. */
    if (c->ring_count == c->window) drop_oldest(c, &s);

    /* 3. Early eviction, oldest first, until S_t's missing neurons fit. With an empty window rows_used + missing
     *    = n <= capacity, so the loop always ends with a fit (the ring_count test is only a guard). */
    while (c->rows_used + missing > c->capacity && c->ring_count > 0) {
        drop_oldest(c, &s);
        s.n_evicted_tokens++;
    }

    /* 4. Append the missing neurons (all deletions are done: no row moves from here on) and collect S_t's rows. */
    uint32_t m = 0;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t id = ids[j];
        if (c->neuron_row[id] < 0) {
            uint32_t r = c->rows_used++;
            c->neuron_row[id] = (int32_t)r;
            c->row_neuron[r] = id;
            c->out_load_ids[m] = id;
            c->out_load_rows[m] = c->matrix + (size_t)r * c->record_bytes;
            m++;
        }
        c->out_rows[j] = (uint32_t)c->neuron_row[id];
    }

    /* 5. S_t becomes the newest set of the window (ring_count < window here: step 2 made room). */
    uint32_t slot = (uint32_t)(((uint64_t)c->ring_head + c->ring_count) % c->window);
    if (n > 0) memcpy(c->ring_ids + (size_t)slot * c->slot, ids, (size_t)n * sizeof *ids);
    c->ring_n[slot] = n;
    c->ring_count++;

    s.n_loaded = m;
    s.n_reused = n - m;
    s.rows_used = c->rows_used;
    s.window_tokens = c->ring_count;
    if (st) *st = s;
    if (load_ids) *load_ids = c->out_load_ids;
    if (load_rows) *load_rows = c->out_load_rows;
    if (rows) *rows = c->out_rows;
    return FLM_OK;
}

bool flm_ncache_unstep(flm_ncache *c) {
    if (!c || c->ring_count == 0) return false;
    uint32_t slot = (uint32_t)(((uint64_t)c->ring_head + c->ring_count - 1) % c->window);
    const uint32_t *set = c->ring_ids + (size_t)slot * c->slot;
    flm_ncache_stats s = {0};
    /* Newest first in reverse id order: the appended rows are the last ones, so most deletions move nothing. */
    for (uint32_t j = c->ring_n[slot]; j-- > 0;)
        if (--c->refcnt[set[j]] == 0) delete_neuron(c, set[j], &s);
    c->ring_n[slot] = 0;
    c->ring_count--;
    return true;
}

flm_status flm_ncache_trim_newest(flm_ncache *c, const uint32_t *keep, uint32_t n, flm_error *err) {
    if (!c || c->ring_count == 0) return flm_fail(err, FLM_ERR_ARG, "neuron cache: no set in the window to trim");
    uint32_t slot = (uint32_t)(((uint64_t)c->ring_head + c->ring_count - 1) % c->window);
    uint32_t *set = c->ring_ids + (size_t)slot * c->slot;
    const uint32_t m = c->ring_n[slot];
    if (n > 0 && !keep) return flm_fail(err, FLM_ERR_ARG, "neuron cache: keep is NULL with n = %u", n);
    /* check first (both ascending): every kept id is in the set */
    for (uint32_t i = 0, j = 0; i < n; i++) {
        if (i > 0 && keep[i] <= keep[i - 1])
            return flm_fail(err, FLM_ERR_ARG, "neuron cache: kept set not strictly ascending at index %u", i);
        while (j < m && set[j] < keep[i]) j++;
        if (j == m || set[j] != keep[i])
            return flm_fail(err, FLM_ERR_ARG, "neuron cache: kept neuron %u is not in the newest set", keep[i]);
    }
    flm_ncache_stats s = {0};
    for (uint32_t i = 0, j = 0; j < m; j++) {
        if (i < n && keep[i] == set[j]) { i++; continue; }
        if (--c->refcnt[set[j]] == 0) delete_neuron(c, set[j], &s);
    }
    if (n > 0) memmove(set, keep, (size_t)n * sizeof *set);
    c->ring_n[slot] = n;
    return FLM_OK;
}

void flm_ncache_reset(flm_ncache *c) {
    if (!c) return;
    /* Every neuron with a count > 0 is cached, so clearing the cached ones clears all metadata. */
    for (uint32_t r = 0; r < c->rows_used; r++) {
        uint32_t id = c->row_neuron[r];
        c->neuron_row[id] = -1;
        c->refcnt[id] = 0;
    }
    c->rows_used = 0;
    c->ring_head = 0;
    c->ring_count = 0;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Accessors
 * ------------------------------------------------------------------------------------------------------------- */

uint8_t *flm_ncache_matrix(const flm_ncache *c) { return c->matrix; }
uint8_t *flm_ncache_row_ptr(const flm_ncache *c, uint32_t row) {
    return row < c->capacity ? c->matrix + (size_t)row * c->record_bytes : NULL;
}
uint32_t flm_ncache_rows_used(const flm_ncache *c) { return c->rows_used; }
int32_t flm_ncache_row_of(const flm_ncache *c, uint32_t neuron) {
    return neuron < c->d_ffn ? c->neuron_row[neuron] : -1;
}
uint32_t flm_ncache_neuron_of(const flm_ncache *c, uint32_t row) {
    return row < c->rows_used ? c->row_neuron[row] : UINT32_MAX;
}
uint32_t flm_ncache_refcount(const flm_ncache *c, uint32_t neuron) {
    return neuron < c->d_ffn ? c->refcnt[neuron] : 0;
}
uint32_t flm_ncache_window_tokens(const flm_ncache *c) { return c->ring_count; }
uint32_t flm_ncache_d_ffn(const flm_ncache *c) { return c->d_ffn; }
uint64_t flm_ncache_record_bytes(const flm_ncache *c) { return c->record_bytes; }
uint32_t flm_ncache_capacity(const flm_ncache *c) { return c->capacity; }
uint32_t flm_ncache_window(const flm_ncache *c) { return c->window; }
uint32_t flm_ncache_max_set(const flm_ncache *c) { return c->max_set; }

/* ---------------------------------------------------------------------------------------------------------------
 * Consistency check
 * ------------------------------------------------------------------------------------------------------------- */

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static bool bad(char *why, size_t why_len, const char *fmt, ...) {
    if (why && why_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return false;
}

static bool set_contains(const uint32_t *set, uint32_t n, uint32_t id) {
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (set[mid] == id) return true;
        if (set[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return false;
}

bool flm_ncache_check(const flm_ncache *c, char *why, size_t why_len) {
    if (why && why_len > 0) why[0] = '\0';
    if (!c) return bad(why, why_len, "cache is NULL");
    if (c->rows_used > c->capacity) return bad(why, why_len, "rows_used %u > capacity %u", c->rows_used, c->capacity);
    if (c->ring_count > c->window || c->ring_head >= c->window)
        return bad(why, why_len, "window ring: %u sets from slot %u, window %u", c->ring_count, c->ring_head,
                   c->window);
    for (uint32_t r = 0; r < c->rows_used; r++) {
        uint32_t id = c->row_neuron[r];
        if (id >= c->d_ffn) return bad(why, why_len, "row %u holds neuron %u >= d_ffn %u", r, id, c->d_ffn);
        if (c->neuron_row[id] != (int32_t)r)
            return bad(why, why_len, "row %u holds neuron %u but neuron %u maps to row %d", r, id, id,
                       c->neuron_row[id]);
    }
    for (uint32_t t = 0; t < c->ring_count; t++) {
        uint32_t s = (uint32_t)(((uint64_t)c->ring_head + t) % c->window);
        const uint32_t *set = c->ring_ids + (size_t)s * c->slot;
        if (c->ring_n[s] > c->slot) return bad(why, why_len, "window set %u has %u ids > %u", t, c->ring_n[s], c->slot);
        for (uint32_t j = 0; j < c->ring_n[s]; j++)
            if (set[j] >= c->d_ffn || (j > 0 && set[j] <= set[j - 1]))
                return bad(why, why_len, "window set %u: id %u at index %u is out of range or out of order", t, set[j],
                           j);
    }
    for (uint32_t i = 0; i < c->d_ffn; i++) {
        int32_t r = c->neuron_row[i];
        if (r < -1 || (r >= 0 && (uint32_t)r >= c->rows_used))
            return bad(why, why_len, "neuron %u maps to row %d, rows_used %u", i, r, c->rows_used);
        /* r >= 0 here means row_neuron[r] == i, by the loop over rows above unless that row holds another id */
        if (r >= 0 && c->row_neuron[r] != i)
            return bad(why, why_len, "neuron %u maps to row %d which holds neuron %u", i, r, c->row_neuron[r]);
        uint32_t count = 0;
        for (uint32_t t = 0; t < c->ring_count; t++) {
            uint32_t s = (uint32_t)(((uint64_t)c->ring_head + t) % c->window);
            count += set_contains(c->ring_ids + (size_t)s * c->slot, c->ring_n[s], i);
        }
        if (c->refcnt[i] != count)
            return bad(why, why_len, "neuron %u: refcount %u but it is in %u window sets", i, c->refcnt[i], count);
        if ((count > 0) != (r >= 0))
            return bad(why, why_len, "neuron %u: in %u window sets but %s", i, count,
                       r >= 0 ? "cached" : "not cached");
    }
    return true;
}
