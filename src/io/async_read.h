/* async_read.h — one read in flight beside the computation: a thread that runs flm_reader_read on what it is given,
 * so the caller can compute while the bytes arrive (L_flash under L_compute, paper Knowl 1). Internal.
 *
 * One request at a time: submit, compute, wait. The extents (and their destinations) must stay valid and untouched
 * until wait returns. The reader serializes its calls, so the caller may still read synchronously meanwhile (that
 * read waits for the one in flight). */
#ifndef FLM_IO_ASYNC_READ_H
#define FLM_IO_ASYNC_READ_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "flashlm.h"
#include "io/reader.h"

typedef struct flm_async_read flm_async_read;

/* Start the thread (a 256 KiB stack: it only calls the reader). NULL when it cannot be created (out of memory, thread
 * limits): the caller then reads synchronously, with the same result. */
flm_async_read *flm_async_read_start(flm_reader *r);

/* Stop the thread after the read in flight (if any) has finished, and free a. Accepts NULL. */
void flm_async_read_stop(flm_async_read *a);

/* Start reading ext[0 .. n) (flm_reader_read's extents); tag is returned by wait. A request still pending is waited
 * for first and its result dropped. */
void flm_async_read_submit(flm_async_read *a, const flm_extent *ext, size_t n, uint64_t tag);
/* The same with flm_reader_read_unchecked: the caller checks the units itself before their first use. */
void flm_async_read_submit_unchecked(flm_async_read *a, const flm_extent *ext, size_t n, uint64_t tag);

/* Wait for the pending request. Returns false when there is none. Else *tag is its tag, *st its status (with err
 * filled when it failed, as flm_reader_read would) and io (may be NULL) accumulates its I/O statistics. */
bool flm_async_read_wait(flm_async_read *a, uint64_t *tag, flm_status *st, flm_error *err, flm_io_stats *io);

/* true while a submitted request is still being read (it has not finished); false when none is pending or the
 * pending one has finished (wait would return at once). Does not block; a, not NULL. */
bool flm_async_read_busy(flm_async_read *a);

/* Add the counters of d to to (flm_io_stats fields, histogram included). */
void flm_io_stats_add(flm_io_stats *to, const flm_io_stats *d);

#endif
