/*
 * reader.h — L_flash: reading scattered byte ranges of a weights file from flash. Internal.
 *
 * Source: "LLM in a flash" (shared/paper/llm-in-a-flash.txt). Knowl 1 splits per-token latency into
 * L_flash + L_memory + L_compute; this module is L_flash. Knowl 6: every read pays a fixed latency (OS, driver,
 * controller), so throughput grows with chunk size and with the number of reads in flight — the paper reads with
 * 32 threads and aims for chunks >= 32 KiB. Knowl 4: reading a little unneeded data to make one larger read can
 * beat several small ones. The page cache is bypassed (O_DIRECT) so that measured I/O is what flash delivers
 * (Knowl 7: "flash benchmarks disable operating-system file caching").
 *
 * The caller hands flm_reader_read() a list of extents (file range -> destination pointer). The reader
 *   1. plans: sorts the extents by offset, coalesces neighbours whose gap is cheaper to read than a separate
 *      request (cost model below), expands each request to the O_DIRECT alignment, and splits requests larger
 *      than max_request into the fewest pieces of balanced size;
 *   2. executes the requests on one of two back ends: a persistent pool of reader threads issuing pread(2), or
 *      io_uring with queue_depth reads in flight;
 *   3. copies each extent's bytes out of the (aligned) bounce buffer into its destination, except for a request
 *      that serves one extent alone whose offset, length and dst are all aligned: that one is read straight into
 *      dst ("zero copy", e.g. whole layers in the naive mode).
 *
 * Coalescing cost model (flm_io_cost): a request costs latency_us + bytes / bandwidth. Two neighbouring requests
 * separated by a gap of g bytes (after alignment expansion) are merged into one when reading the gap costs less
 * than the request it saves:
 *       g / bandwidth < latency   <=>   g < latency_us * bandwidth_gbps * 1000   (GB = 1e9 bytes, us = 1e-6 s)
 * The defaults (80 us, 2 GB/s) merge gaps below 160,000 bytes. A gap merge is only taken while the merged request
 * stays within max_request. Requests that touch or overlap once aligned (g <= 0) are always merged: reading them
 * as one range and splitting it at max_request never needs more requests than reading them apart.
 * An extent that is aligned (offset, length, dst) and at least max_request long is never merged with anything:
 * it is read zero-copy, in max_request pieces.
 *
 * O_DIRECT: the file is opened with O_DIRECT when opts.direct is set. The alignment is the file system's direct-I/O
 * alignment (statx STATX_DIOALIGN) rounded up to at least 4096 bytes. When the open or a direct read fails with
 * EINVAL (file systems without direct I/O), the reader logs one line (FLM_LOG_INFO, to opts.log) and falls back to buffered reads
 * followed by posix_fadvise(POSIX_FADV_DONTNEED) on the pages just read, so the page cache does not serve
 * weights for free on the next token (readahead is disabled with POSIX_FADV_RANDOM). On systems without O_DIRECT
 * the reader is always buffered (macOS: F_NOCACHE when available).
 *
 * Checked reads (flm_reader_set_checks): the caller may give the reader tables of checksums, one 64-bit XXH3 per
 * fixed-size unit of the file (a .flm FFN record, a token-embedding row: docs/FORMAT.md, "Record sums"). Every unit of
 * a table that lies wholly inside an extent is hashed as soon as its bytes are in the extent's destination — in the
 * completion path of the request that brought them (a reader thread, or the io_uring loop), while the data is still
 * in the cache and other reads are in flight; a unit split between two requests after the last of them — and
 * flm_reader_read returns only once every such unit matched. A mismatch is read again once (a fresh device read of
 * that unit) and checked again; a second mismatch is FLM_ERR_CHECKSUM naming the table and the unit. Units only
 * partly inside an extent are not checked (the caller reads whole units, or checks them with flm_reader_check).
 *
 * Errors: every failure is returned as an flm_status with a message in flm_error naming the file. A read that
 * hits end of file before all requested bytes arrived is FLM_ERR_IO "short read" (path, offset, length); a
 * failing read is FLM_ERR_IO with strerror. EINTR/EAGAIN and partial reads that are not at end of file are retried
 * for the remainder. On error the destinations hold unspecified data.
 *
 * Threading: a reader is not thread-safe (one caller at a time); it runs its own worker threads internally.
 */
#ifndef FLM_IO_READER_H
#define FLM_IO_READER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "flashlm.h"
#include "core/error.h"

/* One piece the caller wants: file bytes [offset, offset + length) are copied to dst[0 .. length).
 * Nothing needs to be aligned. length 0 is allowed (ignored, dst may be NULL). Extents may overlap each other and
 * come in any order; their dst ranges must not overlap (they may be written concurrently). */
typedef struct flm_extent {
    uint64_t offset;
    uint64_t length;
    void *dst;
} flm_extent;

typedef enum flm_io_backend {
    FLM_IO_AUTO,    /* io_uring when built with liburing and the kernel allows it, else threads */
    FLM_IO_THREADS, /* persistent pool of n_threads threads calling pread(2) */
    FLM_IO_URING,   /* io_uring with queue_depth reads in flight; FLM_ERR_UNSUPPORTED when unavailable */
} flm_io_backend;

/* flm_io_cost, the device cost model used by the planner (see the top of this file), is public: flashlm.h. */

typedef struct flm_reader_opts {
    flm_io_backend backend; /* default FLM_IO_AUTO */
    int n_threads;          /* threads back end: worker threads; default 32 (Knowl 6); <= 0 means default */
    int queue_depth;        /* io_uring back end: reads in flight; default 64; <= 0 means default */
    bool direct;            /* try O_DIRECT; default true */
    flm_io_cost cost;       /* coalescing cost model; latency_us < 0 or bandwidth_gbps <= 0 mean default,
                               latency_us = 0 turns gap merging off */
    uint64_t max_request;   /* bytes; larger requests are split; default 1 MiB; rounded down to the alignment,
                               at most bounce_bytes and 1 GiB; 0 means default */
    size_t bounce_bytes;    /* bytes of aligned scratch memory the reader may hold for unaligned extents; the reader
                               processes large lists in batches that fit; default 8 MiB; 0 means default */
    const flm_logger *log;  /* where the fallback notes go (may be called from a reader thread); it must outlive
                               the reader; NULL (default): dropped */
} flm_reader_opts;

/* Fill o with the defaults documented above. */
void flm_reader_opts_default(flm_reader_opts *o);

#define FLM_IO_HIST_BUCKETS 24
/* Counters accumulated by flm_reader_read (it adds to them; zero the struct to start). */
typedef struct flm_io_stats {
    uint64_t bytes_requested; /* sum of extent lengths asked for */
    uint64_t bytes_read;      /* bytes of the planned requests that arrived: includes alignment padding and
                                 coalesced gaps, each byte counted once (an O_DIRECT retry of a partial read
                                 re-reads from the last aligned boundary; those bytes are not counted again); less
                                 than the planned request bytes only where an aligned request ran into EOF */
    uint64_t n_requests;      /* device requests planned (a retry of a partial read is not a new request) */
    uint64_t n_extents;       /* extents passed in (including zero-length ones) */
    uint64_t hist[FLM_IO_HIST_BUCKETS]; /* requests by planned size: bucket b counts sizes in [2^(b+9), 2^(b+10))
                                           bytes, i.e. b=0: 512..1023 B, b=3: 4..8 KiB, b=11: 1..2 MiB; sizes below
                                           512 B count in bucket 0, sizes >= 8 GiB in bucket 23.
                                           The buckets sum to n_requests. */
    double ms;                /* wall-clock milliseconds spent in flm_reader_read */
    /* checked reads (flm_reader_set_checks) */
    uint64_t bytes_checked;   /* bytes of whole units hashed and compared with their sums (retries included) */
    uint64_t n_check_retries; /* units whose first check failed and were read again */
    double check_ms;          /* CPU milliseconds spent hashing, summed over the threads that hashed (reader threads
                                 and callers): the cost of checking, most of it beside the computation */
} flm_io_stats;

/* Histogram bucket of a request of `bytes` bytes (see flm_io_stats.hist). */
int flm_io_hist_bucket(uint64_t bytes);

typedef struct flm_reader flm_reader;

/* Open path for reading with the given options (NULL = defaults) and start the back end.
 * Errors: FLM_ERR_IO (open/fstat failed: strerror), FLM_ERR_NOMEM, FLM_ERR_UNSUPPORTED (backend FLM_IO_URING asked
 * for but not built in or refused by the kernel), FLM_ERR_ARG (NULL path/out), FLM_ERR_IO (thread creation).
 * FLM_IO_AUTO falls back to threads with a one-line note (FLM_LOG_INFO) when io_uring_queue_init fails. */
flm_status flm_reader_open(const char *path, const flm_reader_opts *opts, flm_reader **out, flm_error *err);

/* Read n extents (any order, overlapping allowed) and return when all have arrived or on the first error.
 * stats (may be NULL) is accumulated into, also on error (with the bytes actually read).
 * Errors: FLM_ERR_ARG (NULL dst with length > 0, offset + length beyond 2^62), FLM_ERR_NOMEM,
 * FLM_ERR_IO ("short read" when the file ends before an extent does; an I/O error with strerror).
 * Several threads may call it on one reader (a read-ahead thread and its caller): calls run one at a time. */
flm_status flm_reader_read(flm_reader *r, const flm_extent *ext, size_t n, flm_io_stats *stats, flm_error *err);
/* flm_reader_read without the checks of the units inside ext (checked reads): the caller hashes each unit before its
 * first use and calls flm_reader_check on the extents when one does not match (the FFN kernels: runtime/flash.c
 * flm_flash_ffn). Without tables, the same as flm_reader_read. */
flm_status flm_reader_read_unchecked(flm_reader *r, const flm_extent *ext, size_t n, flm_io_stats *stats,
                                     flm_error *err);

/* The reader's busy time: wall-clock nanoseconds, since open, during which a read call (flm_reader_read, _unchecked,
 * from any thread: the caller's or a read-ahead's) had taken the reader — from planning its requests until the last
 * of them arrived and was copied out (and checked), so at least one device request is in flight for all of it but
 * the planning and the last copies (microseconds). Calls run one at a time, so their times add without overlap; a
 * call still running counts up to now. Safe from any thread. 0 for NULL. Divided by the wall time of a generation,
 * the share of it during which the disk had work (runtime: flm_stats.io_busy_ms). */
uint64_t flm_reader_busy_ns(const flm_reader *r);
/* "io_uring" or "threads". */
const char *flm_reader_backend_name(const flm_reader *r);
/* true while reads go through O_DIRECT (false after a fallback, or when opened with direct = false). */
bool flm_reader_is_direct(const flm_reader *r);
/* Alignment in bytes (a power of two >= 4096) of offset, length and dst that lets an extent be read zero-copy. */
uint64_t flm_reader_align(const flm_reader *r);
/* Size of the file at open time, bytes. */
uint64_t flm_reader_file_size(const flm_reader *r);
/* Bytes the reader holds: bounce buffer, plan arrays, queue / ring, and FLM_THREAD_BYTES per worker thread past
 * FLM_READER_THREADS_FREE (what a thread's stack and state make resident; the first ones are in the process's
 * allowance: core/util.h). For the memory budget. */
size_t flm_reader_memory(const flm_reader *r);
/* Whether io_uring can be set up here (a ring is made and closed once; the answer is kept): the back end `auto`
 * takes, so the plan knows whether reader threads will exist. false without liburing. */
bool flm_reader_uring_works(void);
/* Stop the back end, free everything. NULL is fine. */
void flm_reader_close(flm_reader *r);

/* One table of unit checksums for checked reads: units i = 0 .. n_units - 1 are the file bytes
 * [offset + i * unit_bytes, offset + (i + 1) * unit_bytes), and sums[i] is XXH3_64bits (seed 0) of unit i. what and
 * unit name it in errors ("FFN region of layer 3", "record" -> "FFN region of layer 3, record 17"). */
typedef struct flm_check_table {
    uint64_t offset;
    uint64_t unit_bytes;  /* > 0 */
    uint64_t n_units;
    const uint64_t *sums; /* [n_units]; the caller's, valid while the reader uses the table */
    char what[48];
    char unit[16];
} flm_check_table;

/* Check every later read against tables t[0 .. n) (copied; their sums are not: they must outlive the reader or the
 * next call), replacing any earlier tables; n 0 turns checking off. Tables must not overlap each other.
 * Errors: FLM_ERR_ARG (a unit of 0 bytes, tables that overlap or end beyond 2^62), FLM_ERR_NOMEM. */
flm_status flm_reader_set_checks(flm_reader *r, const flm_check_table *t, size_t n, flm_error *err);
/* true when reads are checked (tables set). */
bool flm_reader_checks(const flm_reader *r);
/* Check extents whose destinations were already filled by earlier reads (e.g. a record read in parts): every whole
 * unit inside each extent is hashed and compared, a mismatch read again once, as flm_reader_read does. stats may be
 * NULL. Nothing to do without tables. Errors: FLM_ERR_CHECKSUM, FLM_ERR_IO (the second read), FLM_ERR_NOMEM. */
flm_status flm_reader_check(flm_reader *r, const flm_extent *ext, size_t n, flm_io_stats *stats, flm_error *err);

/* Test hook: fault injection, identical in both back ends. Counting from this call, device requests are numbered
 * 0, 1, 2, ...; request number after_n_requests fails once (later requests are not affected):
 *   FLM_FAULT_SHORT:   its first read returns half the bytes, every retry returns 0 (end of file) -> "short read"
 *   FLM_FAULT_EIO:     its first read fails with EIO -> FLM_ERR_IO "Input/output error"
 *   FLM_FAULT_EINVAL:  its first read fails with EINVAL -> a direct reader falls back to buffered reads and
 *                      succeeds (a buffered reader reports FLM_ERR_IO "Invalid argument")
 *   FLM_FAULT_PARTIAL: its first read returns half the bytes, retries are real -> the read succeeds
 *   FLM_FAULT_EINTR:   its first read fails with EINTR -> retried, the read succeeds
 *   FLM_FAULT_CORRUPT: one byte the caller asked for (the middle of a zero-copy request, else the fourth byte of
 *                      its first piece) arrives flipped, once (a transient corruption on the way from the device)
 *                      -> with checked reads the unit holding it is read again and the read succeeds
 * FLM_FAULT_NONE disarms. */
enum {
    FLM_FAULT_NONE = 0,
    FLM_FAULT_SHORT = 1,
    FLM_FAULT_EIO = 2,
    FLM_FAULT_EINVAL = 3,
    FLM_FAULT_PARTIAL = 4,
    FLM_FAULT_EINTR = 5,
    FLM_FAULT_CORRUPT = 6,
};
void flm_reader_set_fault(flm_reader *r, int fault_kind, uint64_t after_n_requests);

/* ---------------------------------------------------------------------------------------------------------------
 * Planning (src/io/plan.c), exposed for tests and for tools that want to report the I/O a layout costs.
 * ------------------------------------------------------------------------------------------------------------- */

/* One copy out of a request's buffer: buffer bytes [src, src + length) -> dst. */
typedef struct flm_read_piece {
    uint64_t src;
    uint64_t length;
    void *dst;
    size_t ext; /* the extent (index in the caller's list) the bytes belong to */
} flm_read_piece;

/* One device request. */
typedef struct flm_read_op {
    uint64_t offset;    /* file offset, a multiple of align */
    uint64_t length;    /* bytes to read, a multiple of align, <= max_request */
    uint64_t need;      /* bytes from offset that must arrive (end of the last extent byte this request serves);
                           a read ending at EOF before `need` bytes is a short read. 0 < need <= length */
    void *dst;          /* zero-copy: read straight into dst (aligned); NULL: read into a bounce buffer, then copy
                           pieces[first_piece .. first_piece + n_pieces) */
    size_t first_piece;
    size_t n_pieces;
    size_t ext;         /* zero-copy: the extent read into dst (index in the caller's list) */
} flm_read_op;

/* A plan: requests sorted by offset. The arrays are owned by the plan and reused by the next flm_read_plan_build on the
 * same plan; zero-initialise a plan before first use and release it with flm_read_plan_free. */
typedef struct flm_read_plan {
    flm_read_op *ops;
    size_t n_ops;
    flm_read_piece *pieces;
    size_t n_pieces;
    uint64_t bytes;      /* sum of ops[].length */
    uint64_t bytes_used; /* sum of extent lengths */
    /* storage, private */
    size_t ops_cap, pieces_cap, tmp_cap;
    void *tmp;
} flm_read_plan;

/* Plan the requests for n extents.
 *   cost:        the cost model (NULL = defaults; latency_us < 0 or bandwidth_gbps <= 0: that default);
 *                latency_us = 0 turns gap merging off
 *   align:       power of two; request offsets and lengths are multiples of it (1 = no alignment)
 *   max_request: bytes, >= align (rounded down to a multiple of align)
 * Errors: FLM_ERR_ARG (align not a power of two, max_request < align, an extent with NULL dst and length > 0, an
 * extent ending beyond 2^62), FLM_ERR_NOMEM. */
flm_status flm_read_plan_build(const flm_extent *ext, size_t n, const flm_io_cost *cost, uint64_t align,
                               uint64_t max_request, flm_read_plan *plan, flm_error *err);
/* Bytes held by the plan's arrays. */
size_t flm_read_plan_bytes(const flm_read_plan *plan);
void flm_read_plan_free(flm_read_plan *plan);

#endif
