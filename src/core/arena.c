/* arena.c — see arena.h. */
#include "core/arena.h"

#include <stdlib.h>
#include <string.h>

#include "core/util.h"

int flm_arena_init(flm_arena *a, uint64_t size) {
    memset(a, 0, sizeof *a);
    if (size == 0) return 0;
    uint64_t bytes = flm_align_up(size, FLM_ARENA_ALIGN);
    if (bytes > SIZE_MAX) return -1;
    void *p = NULL;
    if (posix_memalign(&p, FLM_ARENA_ALIGN, (size_t)bytes)) return -1;
    a->base = p;
    a->size = bytes;
    return 0;
}

void *flm_arena_alloc(flm_arena *a, uint64_t bytes, uint64_t align) {
    if (!a->base) return NULL;
    uint64_t at = flm_align_up(a->used, align ? align : 1);
    if (at > a->size || bytes > a->size - at) return NULL;
    a->used = at + bytes;
    return a->base + at;
}

void flm_arena_free(flm_arena *a) {
    free(a->base);
    memset(a, 0, sizeof *a);
}
