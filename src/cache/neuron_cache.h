/*
 * neuron_cache.h — L_memory: one FFN layer's neuron cache with a sliding window. Internal.
 *
 * Source: "LLM in a flash" (shared/paper/llm-in-a-flash.txt). Knowl 3 (sliding window): DRAM holds the weights of
 * the neurons predicted active for the last k tokens; for a new token only the neurons not already held are read
 * from flash, and the neurons of the token that leaves the window are dropped. Knowl 5 (preallocated matrix): the
 * held neurons live in one matrix allocated once for R (= capacity) rows; a deleted row is overwritten by the last
 * occupied row so the occupied rows stay contiguous, new rows are appended; nothing is ever reallocated or copied
 * wholesale. Overview, cost and policy: docs/CACHE.md.
 *
 * Data structure (one flm_ncache per FFN layer):
 *   matrix      capacity rows of record_bytes bytes; row r at matrix + r * record_bytes holds one neuron's bundle
 *               exactly as on flash (up row | gate row | down column, see format/flm.h). Rows [0, rows_used) are
 *               occupied; compute reads them in place. Base aligned to FLM_NCACHE_ALIGN.
 *   row -> id   uint32_t[capacity]    neuron id held by each occupied row
 *   id -> row   int32_t[d_ffn]        row of each neuron, -1 when not cached
 *   refcount    uint32_t[d_ffn]       in how many of the window's token sets the neuron is (> 0 <=> cached)
 *   window      ring of k token sets  (preallocated: k x min(max_set, capacity) ids, plus k lengths)
 *
 * Invariant after every successful step: the cached neurons are exactly the union of the window's sets, and
 * refcount[i] is the number of window sets containing i.
 *
 * One step (flm_ncache_step) for a token with predicted-active set S_t:
 *   1. S_t enters: every neuron of S_t gets refcount + 1; those not cached are "missing".
 *   2. When the window already holds k sets, the oldest leaves: its neurons get refcount - 1; those reaching 0 are
 *      deleted (swap-delete: the last occupied row is copied over the deleted one). Because S_t was counted first,
 *      a neuron in both the leaving set and S_t is kept, not deleted and read again.
 *   3. Capacity: while rows_used + missing > capacity, the oldest set still in the window is dropped early in the
 *      same way (n_evicted_tokens). This always terminates: with an empty window rows_used + missing = |S_t|, and
 *      |S_t| > capacity is refused up front with FLM_ERR_BUDGET.
 *   4. The missing neurons are appended at rows rows_used, rows_used + 1, ... (in ascending id order); the caller
 *      reads each one's record_bytes bytes from flash into its row. All deletions happen before any append, so
 *      no row handed out for loading moves during the step.
 *   5. S_t is stored in the ring as the newest set.
 * The rows of S_t (rows[j] holds ids[j]) are then stable until the next step or reset: compute uses them in place.
 *
 * k = window: the number of tokens whose sets are held, the current one included. k = 0 and k = 1 both mean "no
 * window": after a step the cache holds S_t only (the --no-window ablation). Data already in the matrix is never
 * read again, so with k = 1 the overlap of S_t with S_{t-1} is still reused; to measure predictor-only loading
 * with no reuse at all, call flm_ncache_reset() before every step.
 *
 * Cost: per step O(|S_t| + |leaving sets|) bookkeeping plus one memcpy of record_bytes per deleted neuron that is
 * not in the last row (Knowl 5: O(c * record_bytes) for c deletions). No allocation happens after create: steps,
 * resets and checks use only the memory counted by flm_ncache_bytes().
 *
 * Errors: FLM_ERR_ARG (bad sizes at create; an id set that is not sorted, unique and < d_ffn, or larger than
 * max_set), FLM_ERR_BUDGET (|S_t| > capacity), FLM_ERR_NOMEM. A failing step leaves the cache unchanged.
 *
 * Threading: an flm_ncache is not thread-safe; different caches (layers) share nothing and may be used from
 * different threads at the same time.
 */
#ifndef FLM_CACHE_NEURON_CACHE_H
#define FLM_CACHE_NEURON_CACHE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "flashlm.h"

/* Alignment of the matrix base in bytes (a page: enough for SIMD loads and for O_DIRECT reads straight into rows
 * when record_bytes is itself a multiple of the device's alignment). */
#define FLM_NCACHE_ALIGN 4096u

typedef struct flm_ncache flm_ncache;

/* What one step did. Counts are neurons (rows) unless named otherwise. */
typedef struct flm_ncache_stats {
    uint32_t n_active;         /* |S_t| */
    uint32_t n_reused;         /* neurons of S_t already cached before the step (no read) */
    uint32_t n_loaded;         /* neurons of S_t appended: the caller must read them (= |S_t| - n_reused) */
    uint32_t n_deleted;        /* rows deleted (the leaving token plus early evictions) */
    uint32_t n_moved;          /* rows copied by swap-delete (<= n_deleted): n_moved * record_bytes bytes memcpy'd */
    uint32_t n_evicted_tokens; /* token sets dropped early to fit capacity (0 when the window fits) */
    uint32_t rows_used;        /* occupied rows after the step */
    uint32_t window_tokens;    /* token sets in the window after the step, S_t included (<= max(window, 1)) */
} flm_ncache_stats;

/* Bytes that flm_ncache_create() allocates for these arguments: the matrix (capacity * record_bytes rounded up to
 * FLM_NCACHE_ALIGN), the metadata (8 * d_ffn + 4 * capacity bytes), the window ring (4 * k * min(max_set, capacity)
 * + 4 * k bytes) and per-step output arrays (16 * min(max_set, capacity) bytes), plus the object itself. Arguments
 * are normalized as in create (capacity and max_set clamped to d_ffn, max_set 0 = d_ffn, window 0 = 1). Returns
 * UINT64_MAX when create would refuse them (d_ffn, record_bytes or capacity 0) or the size overflows. */
uint64_t flm_ncache_bytes(uint32_t d_ffn, uint64_t record_bytes, uint32_t capacity, uint32_t window,
                          uint32_t max_set);

/* The largest capacity (<= d_ffn) whose flm_ncache_bytes() is <= budget_bytes; 0 when not even one row fits. */
uint32_t flm_ncache_capacity_for(uint64_t budget_bytes, uint32_t d_ffn, uint64_t record_bytes, uint32_t window,
                                 uint32_t max_set);

/* Create an empty cache for one FFN layer.
 *   d_ffn         neurons in the layer (ids are 0 .. d_ffn - 1); >= 1
 *   record_bytes  bytes of one neuron's bundle (flm_region.record_bytes); >= 1
 *   capacity      rows of the matrix (R_i in Knowl 5); >= 1; values above d_ffn are clamped to d_ffn
 *   window        k, the tokens whose sets are held (Knowl 3); 0 and 1 mean no window
 *   max_set       the largest |S_t| a step may pass; 0 or > d_ffn mean d_ffn
 * Errors: FLM_ERR_ARG (a zero size, out == NULL, a size that overflows), FLM_ERR_NOMEM. */
flm_status flm_ncache_create(uint32_t d_ffn, uint64_t record_bytes, uint32_t capacity, uint32_t window,
                             uint32_t max_set, flm_ncache **out, flm_error *err);
void flm_ncache_free(flm_ncache *c);

/* Advance the window by one token whose predicted-active set is ids[0 .. n) (strictly ascending, each < d_ffn,
 * n <= max_set; n = 0 is a token with no active neuron). On success:
 *   *st          what the step did (may be NULL)
 *   *load_ids    n_loaded neuron ids, ascending, the caller must read from flash          (may be NULL)
 *   *load_rows   n_loaded row pointers: load_ids[j]'s record_bytes bytes go to load_rows[j] (may be NULL);
 *                they are consecutive rows, so load_rows[j] = load_rows[0] + j * record_bytes
 *   *rows        n row indices, rows[j] holds ids[j], for compute (may be NULL)
 * The arrays are owned by the cache and valid until the next step, reset or free. The rows of the loaded neurons
 * hold stale bytes until the caller fills them; the cache never reads or writes row contents except to move a row.
 * Errors: FLM_ERR_ARG (c or ids NULL with n > 0, ids unsorted/duplicate/out of range, n > max_set),
 * FLM_ERR_BUDGET (n > capacity: the message gives both; the caller must raise the budget or shrink S_t). On error
 * the cache is unchanged and the outputs are set to NULL / zero. */
flm_status flm_ncache_step(flm_ncache *c, const uint32_t *ids, uint32_t n, flm_ncache_stats *st,
                           const uint32_t **load_ids, uint8_t *const **load_rows, const uint32_t **rows,
                           flm_error *err);

/* Undo the loads of the last step after its reads failed: its set S_t leaves the window as the newest set (every
 * neuron of S_t gets refcount - 1; those reaching 0, among them every neuron the step appended, are deleted), so no
 * row whose bytes were never read stays marked as cached. Neurons the step evicted to make room are not restored
 * (they were correct and are read again when needed). The invariant holds afterwards; a retry of the same token
 * reads every neuron of S_t that is not cached. Returns false (and does nothing) when the window is empty.
 * O(|S_t|) plus one memcpy of record_bytes per moved row. */
bool flm_ncache_unstep(flm_ncache *c);

/* Replace the newest set of the window by keep[0 .. n), a subset of it (strictly ascending): the neurons of the newest
 * set that are not kept lose that set's count, and those whose count reaches 0 are deleted (swap-delete). Speculative
 * decoding: a batch of draft tokens entered the window as one set, the union of their sets, and only the accepted
 * tokens' neurons stay. Rows of kept neurons may move (as in any deletion). Errors: FLM_ERR_ARG (no set in the window,
 * keep not ascending or not a subset of the newest set); the cache is unchanged then. */
flm_status flm_ncache_trim_newest(flm_ncache *c, const uint32_t *keep, uint32_t n, flm_error *err);

/* Empty the cache and the window (a new sequence). O(rows_used); rows keep their bytes but are unoccupied. */
void flm_ncache_reset(flm_ncache *c);

/* The matrix: row r (r < rows_used) at flm_ncache_matrix(c) + r * record_bytes. */
uint8_t *flm_ncache_matrix(const flm_ncache *c);
/* Pointer to row r (r < capacity). */
uint8_t *flm_ncache_row_ptr(const flm_ncache *c, uint32_t row);
uint32_t flm_ncache_rows_used(const flm_ncache *c);
/* The row holding a neuron, -1 when it is not cached (or neuron >= d_ffn). */
int32_t flm_ncache_row_of(const flm_ncache *c, uint32_t neuron);
/* The neuron held by an occupied row; UINT32_MAX when row >= rows_used. */
uint32_t flm_ncache_neuron_of(const flm_ncache *c, uint32_t row);
/* In how many of the window's sets the neuron is (0 when not cached). */
uint32_t flm_ncache_refcount(const flm_ncache *c, uint32_t neuron);
/* Token sets in the window now (<= flm_ncache_window(c)). */
uint32_t flm_ncache_window_tokens(const flm_ncache *c);

/* The sizes after normalization (see create). */
uint32_t flm_ncache_d_ffn(const flm_ncache *c);
uint64_t flm_ncache_record_bytes(const flm_ncache *c);
uint32_t flm_ncache_capacity(const flm_ncache *c);
uint32_t flm_ncache_window(const flm_ncache *c); /* k, >= 1 */
uint32_t flm_ncache_max_set(const flm_ncache *c);

/* Consistency check (tests, debugging): rows_used <= capacity; row -> id and id -> row are inverse bijections
 * between [0, rows_used) and the cached neurons; every window set is ascending, unique and in range; refcount[i]
 * equals the number of window sets containing i, and is > 0 exactly for the cached neurons. Row contents are not
 * inspected (tests tag them). Returns true when consistent; otherwise false with the first problem in why (when
 * non-NULL). O(d_ffn * k * log max_set); allocates nothing. */
bool flm_ncache_check(const flm_ncache *c, char *why, size_t why_len);

#endif
