/* work.h — the temporary buffers of one compute call (quantized activations, attention tiles), carved from a work
 * area the caller planned (the context's: flm_scratch.work, counted in the plan's scratch) instead of the heap.
 * Internal.
 *
 * A call takes a mark (flm_work_mark), carves what it needs (flm_work_get) and gives it all back (flm_work_put): the
 * area is a stack, so nested calls need the sum of what is held at once and sequential calls the largest. Without an
 * area (ws NULL: tools, tests, benchmarks), or when a request does not fit in what is left, the buffer comes from the
 * heap and flm_work_heap_count() counts it: the token path of a context never takes that branch
 * (tests/test_work.c). */
#ifndef FLM_COMPUTE_WORK_H
#define FLM_COMPUTE_WORK_H
#include <stddef.h>
#include <stdint.h>
#include "core/arena.h"

/* What flm_work_get handed out: the buffer, and what flm_work_put gives back. */
typedef struct flm_work_buf {
    void *p;       /* 64-byte aligned; NULL when neither the area nor the heap had the bytes */
    void *heap;    /* the heap block to free, or NULL (carved from the area) */
} flm_work_buf;

/* ws's fill level, to restore with flm_work_put (0 for no area) */
static inline uint64_t flm_work_mark(const flm_arena *ws) { return ws ? ws->used : 0; }
/* bytes (> 0) 64-byte aligned from ws, else from the heap (counted). */
flm_work_buf flm_work_get(flm_arena *ws, size_t bytes);
/* Give back everything carved from ws since mark, and free b's heap block (b may be NULL). */
void flm_work_put(flm_arena *ws, uint64_t mark, flm_work_buf *b);
/* Heap blocks flm_work_get has handed out in this process (a work area was absent or too small). */
uint64_t flm_work_heap_count(void);

/* The largest flm_act_bytes(t, n) over the weight types t (bytes n floats take quantized for any dot product),
 * rounded up to 64: the per-token size of a quantized activation buffer. */
size_t flm_act_bytes_max(size_t n);

/* The largest packed block a tiled dot may build (quants_panel_vnni.h checks its sizes against these): a block of
 * 32 elements of 16 rows, and a K-quant super-block of 16 rows (q6_k's, the larger). */
#define FLM_PANEL_BLOCK_BYTES 512
#define FLM_PANEL_SB_BYTES_MAX 5696

/* Bytes a tiled dot over n-element rows and n_x tokens may use as its tmp (kernels.h flm_vec_dot_tile_fn), at any
 * kernel level: the vnni panel of 16 rows (packed weights, scales and mins) and the tokens' offsets or block sums,
 * each 64-byte rounded. n, n_x >= 0; 0 when n has no whole block. */
size_t flm_tile_tmp_bytes(size_t n, size_t n_x);

#endif
