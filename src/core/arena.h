/* arena.h — one block of memory, planned once and carved into buffers (zstd's workspace is the model). Internal.
 * Nothing carved from an arena can outgrow it: flm_arena_alloc refuses what does not fit instead of growing.
 * Buffers are not freed one by one; flm_arena_free releases the whole block. */
#ifndef FLM_CORE_ARENA_H
#define FLM_CORE_ARENA_H
#include <stddef.h>
#include <stdint.h>

typedef struct flm_arena {
    uint8_t *base;   /* FLM_ARENA_ALIGN-aligned; NULL for an empty arena */
    uint64_t size;   /* bytes planned (the block's size) */
    uint64_t used;   /* bytes carved so far, alignment padding included */
} flm_arena;

#define FLM_ARENA_ALIGN 4096u /* the block's alignment: O_DIRECT reads land in carved buffers */

/* Allocate one block of size bytes (rounded up to FLM_ARENA_ALIGN; 0 gives an empty arena that refuses every
 * allocation). The block is an anonymous mapping: zero-filled, and a page takes memory only once it is written (as
 * calloc's large blocks). Returns 0, or -1 when out of memory (a is then empty). */
int flm_arena_init(flm_arena *a, uint64_t size);
/* bytes from the arena, aligned to align (a power of two, at most FLM_ARENA_ALIGN); NULL when they do not fit in what
 * is left (the arena is unchanged). Zero until written. */
void *flm_arena_alloc(flm_arena *a, uint64_t bytes, uint64_t align);
/* Release the block; a is empty afterwards. */
void flm_arena_free(flm_arena *a);

#endif
