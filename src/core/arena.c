/* arena.c — see arena.h. */
#include "core/arena.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/util.h"

int flm_arena_init(flm_arena *a, uint64_t size) {
    memset(a, 0, sizeof *a);
    if (size == 0) return 0;
    uint64_t bytes = flm_align_up(size, FLM_ARENA_ALIGN);
    if (bytes > SIZE_MAX) return -1;
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -1;
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
    if (a->base) munmap(a->base, (size_t)a->size);
    memset(a, 0, sizeof *a);
}
