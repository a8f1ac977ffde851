/*
 * probe.h — measuring the disk that holds a model: random-read throughput and latency by request size and reads in
 * flight, sequential throughput, and the planner's cost model fitted from them (`flashlm probe-disk`). The tools tier (src/probe/); the runtime reads the saved
 * fit through io/io_cost.h. Internal.
 *
 * Source: "LLM in a flash" (shared/paper/llm-in-a-flash.txt), Knowl 6: every read pays a fixed latency (OS, driver,
 * interrupt, controller), so random-read throughput grows with the chunk size and with the number of reads in
 * flight (the paper's Figure 2; it reads with 32 threads and chunks >= 32 KiB). The probe measures that curve on
 * the target machine, through the engine's own read path (flm_reader, O_DIRECT, both back ends), and turns it into
 * the flm_io_cost the read planner uses to decide which gaps to read through (src/io/reader.h, docs/IO.md).
 *
 * What is measured (a "cell" per back end x pattern x request size x reads in flight):
 *   - random: each flm_reader_read call reads `batch` extents of request_bytes at random aligned offsets spread
 *     over the file; extents are at least one alignment unit apart and the cost model has latency_us = 0, so the
 *     planner never merges two of them: one extent = one device request, read zero-copy into aligned memory.
 *     Reads in flight = n_threads (threads back end) or queue_depth (io_uring back end).
 *   - sequential: consecutive 4 MiB extents (one request each: max_request is 4 MiB) from a random start.
 * A cell runs whole batches until its share of the time budget is spent or it has read cell_bytes; the first
 * batch is a warm-up and is not counted. Throughput = device bytes / time in flm_reader_read; the mean latency
 * per request follows from Little's law: latency = in_flight x time / requests, with in_flight = min(asked, batch)
 * (it includes the reader's planning and the wait for the last request of each batch, so it is an upper bound).
 *
 * The fit (flm_probe_fit_cost): see the comment above that function and docs/IO.md "Measuring the disk".
 *
 * Results are saved as JSON (cJSON) next to the model, "<model>.probe.json"; flm_probe_load_cost (io/io_cost.h)
 * reads the fitted cost back for the runtime.
 */
#ifndef FLM_PROBE_PROBE_H
#define FLM_PROBE_PROBE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flashlm.h"
#include "io/io_cost.h"
#include "io/reader.h"

#define FLM_PROBE_SEQ_BYTES ((uint64_t)4 << 20) /* request size of the sequential cells */
#define FLM_PROBE_SEQ_MAX_IN_FLIGHT 16          /* sequential cells are run at the in-flight counts up to this */
#define FLM_PROBE_MAX_LIST 16                   /* at most this many request sizes / in-flight counts */
#define FLM_PROBE_MIN_FILE ((uint64_t)16 << 20) /* smaller files are refused: the device cache would serve them */

/* Which back ends to measure (bit mask). */
enum { FLM_PROBE_THREADS = 1, FLM_PROBE_URING = 2, FLM_PROBE_BOTH = 3 };

typedef struct flm_probe_opts {
    double seconds;            /* total time budget of the measurements (not counting writing a test file), s;
                                  default 60; split evenly over the cells still to run */
    uint64_t size;             /* directory target: bytes of the temporary test file; default 1 GiB; capped at half
                                  the free space; rounded down to 4 MiB; at least FLM_PROBE_MIN_FILE */
    uint64_t sizes[FLM_PROBE_MAX_LIST]; /* random request sizes, bytes, powers of two >= 512; n_sizes = 0: default
                                           4 KiB, 16 KiB, 64 KiB, 256 KiB, 1 MiB */
    size_t n_sizes;
    int depths[FLM_PROBE_MAX_LIST];     /* reads in flight, 1..1024; n_depths = 0: default 1, 4, 16, 32, 64 */
    size_t n_depths;
    unsigned backends;         /* FLM_PROBE_* mask; 0 = both */
    bool buffered;             /* testing: do not try O_DIRECT (reads are buffered + POSIX_FADV_DONTNEED) */
    uint64_t cell_bytes;       /* a cell stops after reading this many bytes; 0 = default 1 GiB */
    uint64_t dst_bytes;        /* destination memory for one batch, bytes; 0 = default 64 MiB (a batch is at least
                                  the in-flight count when this allows) */
    uint64_t seed;             /* random offsets; 0 = default 1 */
    /* progress (may be NULL): called before each cell (done = cells finished, total = all cells) and while
     * writing a test file (done/total in bytes); the same signature as cli_progress */
    void (*progress)(void *user, const char *what, uint64_t done, uint64_t total);
    void *progress_user;
} flm_probe_opts;

/* Fill o with the defaults above. */
void flm_probe_opts_default(flm_probe_opts *o);

/* One measurement. */
typedef struct flm_probe_cell {
    flm_io_backend backend;  /* FLM_IO_THREADS or FLM_IO_URING */
    bool sequential;         /* false: random */
    uint64_t request_bytes;  /* bytes per extent asked for */
    int in_flight;           /* asked: n_threads / queue_depth */
    int batch;               /* extents per flm_reader_read call (in flight = min(in_flight, batch)) */
    bool measured;           /* false: skipped (back end unavailable, file too small for the batch) */
    uint64_t requests;       /* device requests timed (stats.n_requests) */
    uint64_t bytes;          /* device bytes timed (stats.bytes_read) */
    double seconds;          /* time in flm_reader_read, s */
    double throughput_gbps;  /* bytes / seconds / 1e9 */
    double iops;             /* requests / seconds */
    double latency_us;       /* mean per request, Little's law: min(in_flight, batch) / iops, microseconds */
} flm_probe_cell;

/* The fitted cost model (all from one back end: the one FLM_IO_AUTO gives the engine when it was measured). */
typedef struct flm_probe_fit {
    bool valid;                  /* false when the cells needed were not measured */
    flm_io_backend backend;      /* back end the fit is from */
    uint64_t small_bytes;        /* request size of the latency cells: the smallest measured (4 KiB) */
    double latency_us;           /* device latency: mean latency of small random reads, 1 in flight */
    double bandwidth_gbps;       /* streaming bandwidth: the best sequential throughput (GB/s, 1e9 B/s) */
    int parallelism;             /* the engine's default reads in flight for the back end (io_uring 64, threads 32),
                                    or the nearest measured in-flight count */
    double speedup;              /* small random reads: iops at `parallelism` / iops at 1 in flight */
    double effective_latency_us; /* per-request cost at `parallelism`: latency_us / speedup, less the transfer of
                                    small_bytes at bandwidth_gbps; >= 0 */
    flm_io_cost cost;            /* what the planner should use: {effective_latency_us, bandwidth_gbps} */
} flm_probe_fit;

typedef struct flm_probe_result {
    char *path;               /* what was probed (the file or the directory), malloc'd */
    bool temp_file;           /* a temporary test file was created (and deleted) in the directory `path` */
    uint64_t file_bytes;      /* size of the file read */
    uint64_t align;           /* reader alignment, bytes */
    bool direct;              /* every read went through O_DIRECT (false: buffered + DONTNEED) */
    bool uring_available;     /* the io_uring back end could be opened */
    char uring_note[160];     /* why not, when it was asked for and could not be opened */
    double seconds_budget;    /* opts.seconds */
    double wall_seconds;      /* measuring time (without writing the test file) */
    uint64_t seed;
    flm_probe_cell *cells;    /* n_cells, malloc'd; order: back end, in flight, then sizes (random, sequential) */
    size_t n_cells;
    flm_probe_fit fit;
} flm_probe_result;

/* Measure the storage holding `path`:
 *   - a regular file (a model): random and sequential reads over it, read only; at least FLM_PROBE_MIN_FILE bytes;
 *   - a directory: a temporary file of opts->size bytes (pseudo-random data, fsync'ed, dropped from the page cache)
 *     is created there, measured and deleted (it is unlinked right after creation where /proc/self/fd allows, so
 *     nothing is left behind even if the process is killed).
 * opts NULL = defaults. Fills *out (release with flm_probe_result_free; it is zeroed first) including the fit.
 * Errors: FLM_ERR_ARG (NULL path/out, bad options, a file too small, not a file or directory), FLM_ERR_IO (open,
 * write, read, not enough free space), FLM_ERR_NOMEM. A back end that cannot be opened (io_uring refused) is not an
 * error: its cells are marked not measured and uring_note says why. */
flm_status flm_probe_run(const char *path, const flm_probe_opts *opts, flm_probe_result *out, flm_error *err);

/* The cell of a measurement, or NULL when there is none (or it was not measured). */
const flm_probe_cell *flm_probe_find(const flm_probe_result *r, flm_io_backend backend, bool sequential,
                                     uint64_t request_bytes, int in_flight);

/* Fit the cost model from r->cells into r->fit (also done by flm_probe_run):
 *   backend         io_uring when it was measured (FLM_IO_AUTO picks it), else threads
 *   latency_us      latency of the smallest random request size at 1 in flight (or the smallest in-flight count)
 *   bandwidth_gbps  the best sequential throughput of that back end (none: the best random throughput)
 *   parallelism     the engine default for the back end (flm_reader_opts_default: queue_depth / n_threads), or the
 *                   largest measured in-flight count not above it
 *   speedup         iops(small, parallelism) / iops(small, 1)
 *   effective       max(0, latency_us / speedup - small_bytes / bandwidth): with P reads in flight a request's fixed
 *                   cost is shared by P, so the cost the planner weighs against streaming a gap is the time one more
 *                   small request adds at that parallelism (1 / iops) less the time its bytes take to stream
 *   cost            {effective, bandwidth_gbps}: the planner then reads through gaps below effective * bandwidth. */
void flm_probe_fit_cost(flm_probe_result *r);

/* Save r as JSON to path atomically (path.tmp.<pid>, fsync, rename). Errors: FLM_ERR_IO, FLM_ERR_NOMEM. */
flm_status flm_probe_save(const flm_probe_result *r, const char *path, flm_error *err);

/* Release what flm_probe_run allocated; r itself is not freed. NULL is fine. */
void flm_probe_result_free(flm_probe_result *r);

#endif
