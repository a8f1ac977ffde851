/* work.c — the temporary buffers of compute calls (work.h). */
#include "compute/work.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "compute/kernels.h"
#include "core/types.h"

static _Atomic uint64_t heap_count;

flm_work_buf flm_work_get(flm_arena *ws, size_t bytes) {
    flm_work_buf b = {NULL, NULL};
    if (ws && (b.p = flm_arena_alloc(ws, bytes, 64))) return b;
    atomic_fetch_add_explicit(&heap_count, 1, memory_order_relaxed);
    b.p = b.heap = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    return b;
}

void flm_work_put(flm_arena *ws, uint64_t mark, flm_work_buf *b) {
    if (ws) ws->used = mark;
    if (b) {
        free(b->heap);
        b->heap = b->p = NULL;
    }
}

uint64_t flm_work_heap_count(void) { return atomic_load_explicit(&heap_count, memory_order_relaxed); }

size_t flm_act_bytes_max(size_t n) {
    size_t m = 0;
    for (uint32_t t = 0; t < FLM_N_TYPES; t++) {
        const flm_type_traits *tt = flm_type_traits_of(t);
        if (!tt || !tt->is_tensor || tt->vec_dot_type == FLM_TYPE_F32) continue; /* x itself */
        const size_t a = flm_act_bytes(t, n);
        if (a > m) m = a;
    }
    return (m + 63) & ~(size_t)63;
}

#define ROUND64(x) (((x) + 63) & ~(size_t)63)

/* The panels' need (p32, pk) covers the vnni rows kernels' too (quants_rows_vnni.h rows_tmp_bytes, at most 16
 * tokens: ROUND64(16 * 32 nb) + 128 nb <= ROUND64(640 nb) + 64). */
size_t flm_tile_tmp_bytes(size_t n, size_t n_x) {
    const size_t nb = n / 32, nk = n / 256;
    const size_t p32 = ROUND64(nb * (FLM_PANEL_BLOCK_BYTES + 16 * sizeof(float) * 2)) + ROUND64(n_x * nb * 4 + 4);
    const size_t pk = ROUND64(nk * FLM_PANEL_SB_BYTES_MAX) + ROUND64(n_x * nk * 16 + 4);
    return nb ? (p32 > pk ? p32 : pk) : 0;
}
