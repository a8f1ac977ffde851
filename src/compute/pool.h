/* pool.h — L_compute: the threads that split one matrix product (or attention, or a bundle FFN) into chunks.
 * Internal.
 *
 * One process-wide pool of worker threads, started on first use and grown to the largest n_threads asked for. A
 * call hands out chunk indices 0 .. n_chunks-1 one at a time (an atomic counter) to the caller and up to
 * n_threads - 1 workers, and returns once every chunk has run. Unlike an OpenMP parallel region it waits only for
 * the chunks that were taken: a worker that has not woken up yet (or has lost its core to another process) leaves
 * its share to the threads that are running, instead of holding every thread at the region's closing barrier. An
 * idle worker spins briefly (FLASHLM_SPIN_US microseconds, default 50: a decoding token's products follow each other
 * within microseconds), then sleeps on a futex until the next call.
 *
 * Which thread runs which chunk is not fixed, so each chunk must write its own outputs only; results are then the
 * same for any number of threads. A call made while the pool is busy (another thread's call, or a chunk calling
 * flm_pool_run) runs its chunks on the calling thread alone: same results, no deadlock.
 * FLASHLM_THREADS=omp runs the chunks in an OpenMP parallel for with schedule(dynamic, 1) instead (for comparing
 * the two). */
#ifndef FLM_COMPUTE_POOL_H
#define FLM_COMPUTE_POOL_H
#include <stddef.h>

/* Runs chunk `chunk` of a call; arg is the caller's. */
typedef void (*flm_pool_fn)(void *arg, size_t chunk);

/* Runs fn(arg, c) once for every c < n_chunks on up to n_threads threads (the caller and n_threads - 1 workers;
 * n_threads <= 1 or n_chunks <= 1: all on the caller) and returns when all have returned. Workers that cannot be
 * started leave their chunks to the caller. n_threads above 256 counts as 256. */
void flm_pool_run(int n_threads, size_t n_chunks, flm_pool_fn fn, void *arg);

#endif
