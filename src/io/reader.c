/* reader.c — flm_reader: planned, aligned reads through a thread pool or io_uring (see reader.h). */
#include "io/reader.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef FLM_HAVE_URING
#include <liburing.h>
#endif

#include "core/error.h"
#include "core/util.h"

#define DEFAULT_THREADS 32
#define DEFAULT_QUEUE_DEPTH 64
#define DEFAULT_MAX_REQUEST (UINT64_C(1) << 20)
#define DEFAULT_BOUNCE ((size_t)8 << 20)
#define MAX_REQUEST_CAP (UINT64_C(1) << 30) /* below Linux's 0x7ffff000 per-read limit */
#define MIN_ALIGN 4096
#define MAX_THREADS 1024
#define MAX_QUEUE_DEPTH 4096
#define WORKER_STACK ((size_t)256 << 10)

#ifdef FLM_HAVE_URING
typedef struct uslot {
    size_t op;        /* index into the batch */
    uint64_t done;    /* bytes of the request that have arrived */
    uint64_t at;      /* start (within the request) of the read in flight */
    int fault;        /* injected fault for this request */
    bool first;       /* the next completion is the request's first */
    bool was_direct;  /* the read in flight went through O_DIRECT */
    bool buffered;    /* some of the request was read buffered: drop its pages afterwards */
} uslot;
#endif

struct flm_reader {
    char *path;
    int fd_direct; /* O_DIRECT descriptor, -1 when there is none */
    int fd_buf;    /* buffered descriptor, always open (fallback) */
    atomic_bool direct;
    atomic_bool fallback_noted;
    uint64_t align;
    uint64_t file_size;
    flm_reader_opts opts; /* normalised */
    flm_io_backend backend;
    bool broken; /* the io_uring ring failed: refuse further reads */

    uint8_t *bounce;
    size_t bounce_cap;
    flm_read_plan plan;
    uint8_t **bufs; /* per request of the plan: where it is read to */
    size_t bufs_cap;

    atomic_int fault_kind;
    atomic_uint_fast64_t fault_at, fault_count;

    pthread_mutex_t call_mu; /* one flm_reader_read at a time (a read-ahead thread and the caller may share it) */
    bool call_mu_ready;

    /* the batch in flight */
    const flm_read_op *ops;
    uint8_t *const *op_bufs;
    size_t n_ops;

    /* threads back end; everything below mu is guarded by it */
    pthread_t *threads;
    int n_threads;
    bool sync_ready;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    size_t next, done;
    bool stop, failed;
    uint64_t batch_bytes;
    flm_error batch_err;

#ifdef FLM_HAVE_URING
    struct io_uring ring;
    bool ring_ready;
    uslot *slots;
    int *free_slots;
#endif
};


void flm_reader_opts_default(flm_reader_opts *o) {
    if (!o) return;
    *o = (flm_reader_opts){
        .backend = FLM_IO_AUTO,
        .n_threads = DEFAULT_THREADS,
        .queue_depth = DEFAULT_QUEUE_DEPTH,
        .direct = true,
        .cost = {.latency_us = 80.0, .bandwidth_gbps = 2.0},
        .max_request = DEFAULT_MAX_REQUEST,
        .bounce_bytes = DEFAULT_BOUNCE,
    };
}

int flm_io_hist_bucket(uint64_t bytes) {
    int b = -9;
    while (bytes > 1) {
        bytes >>= 1;
        b++;
    }
    return b < 0 ? 0 : b >= FLM_IO_HIST_BUCKETS ? FLM_IO_HIST_BUCKETS - 1 : b;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Shared by both back ends
 * ------------------------------------------------------------------------------------------------------------- */

static void note_fallback(flm_reader *r) {
    if (!atomic_exchange(&r->fallback_noted, true))
        flm_log(r->opts.log, FLM_LOG_INFO, "%s: O_DIRECT not supported here (EINVAL); using buffered reads + "
                "POSIX_FADV_DONTNEED", r->path);
}

/* A direct read failed with EINVAL: continue buffered. */
static void fall_back(flm_reader *r) {
    atomic_store(&r->direct, false);
    note_fallback(r);
}

/* The fault to inject into the request being started (counts requests while a fault is armed). */
static int take_fault(flm_reader *r) {
    int kind = atomic_load(&r->fault_kind);
    if (kind == FLM_FAULT_NONE) return FLM_FAULT_NONE;
    uint64_t n = atomic_fetch_add(&r->fault_count, 1);
    if (n != atomic_load(&r->fault_at)) return FLM_FAULT_NONE;
    atomic_store(&r->fault_kind, FLM_FAULT_NONE); /* one shot */
    return kind;
}

/* A first read under an injected SHORT / PARTIAL fault delivers only about half of what the request needs. */
static uint64_t fault_truncate(int fault, const flm_read_op *op, uint64_t got) {
    uint64_t half = op->need / 2;
    if (fault == FLM_FAULT_PARTIAL && half == 0) half = 1; /* a partial read still makes progress */
    if ((fault == FLM_FAULT_SHORT || fault == FLM_FAULT_PARTIAL) && got > half) return half;
    return got;
}

/* Buffered reads leave the pages they read in the page cache; drop them so the next token pays for flash again.
 * Whole pages only are dropped by the kernel, so widen the range to page (alignment) boundaries. */
static void drop_cache(flm_reader *r, uint64_t off, uint64_t len) {
#if defined(POSIX_FADV_DONTNEED)
    if (len == 0) return;
    uint64_t a = flm_align_down(off, r->align), b = flm_align_up(off + len, r->align);
    (void)posix_fadvise(r->fd_buf, (off_t)a, (off_t)(b - a), POSIX_FADV_DONTNEED);
#else
    (void)r; (void)off; (void)len;
#endif
}

static void scatter(const flm_reader *r, const flm_read_op *op, const uint8_t *buf) {
    if (op->dst) return;
    const flm_read_piece *p = r->plan.pieces + op->first_piece;
    for (size_t i = 0; i < op->n_pieces; i++) memcpy(p[i].dst, buf + p[i].src, p[i].length);
}

static flm_status short_read(const flm_reader *r, const flm_read_op *op, uint64_t got, flm_error *err) {
    return flm_fail(err, FLM_ERR_IO,
                    "%s: short read at offset %llu, length %llu: the file ended after %llu bytes "
                    "(size %llu at open; truncated?)",
                    r->path, (unsigned long long)op->offset, (unsigned long long)op->need, (unsigned long long)got,
                    (unsigned long long)r->file_size);
}

static flm_status read_error(const flm_reader *r, const flm_read_op *op, int e, flm_error *err) {
    return flm_fail(err, FLM_ERR_IO, "%s: read at offset %llu, length %llu failed: %s", r->path,
                    (unsigned long long)op->offset, (unsigned long long)op->length, strerror(e));
}

/* Read one request synchronously into buf (pread loop), then scatter it. Adds device bytes to *nread. */
static flm_status exec_op(flm_reader *r, const flm_read_op *op, uint8_t *buf, uint64_t *nread, flm_error *err) {
    int fault = take_fault(r);
    bool first = true, buffered = false;
    uint64_t done = 0;
    /* The first read asks for the whole (aligned) request; a partial one is continued only up to `need`: the bytes
     * after it are alignment padding (typically past the end of the file). */
    while (done < op->need) {
        bool direct = atomic_load(&r->direct);
        /* O_DIRECT needs aligned offsets: after a partial read, re-read from the last aligned boundary. */
        uint64_t at = direct ? flm_align_down(done, r->align) : done;
        int fd = direct ? r->fd_direct : r->fd_buf;
        buffered |= !direct;
        ssize_t ret;
        if (first && (fault == FLM_FAULT_EIO || fault == FLM_FAULT_EINVAL || fault == FLM_FAULT_EINTR)) {
            ret = -1;
            errno = fault == FLM_FAULT_EIO ? EIO : fault == FLM_FAULT_EINVAL ? EINVAL : EINTR;
        } else if (!first && fault == FLM_FAULT_SHORT) {
            ret = 0;
        } else {
            ret = pread(fd, buf + at, (size_t)(op->length - at), (off_t)(op->offset + at));
            if (first && ret > 0) ret = (ssize_t)fault_truncate(fault, op, (uint64_t)ret);
        }
        first = false;
        if (ret < 0) {
            int e = errno;
            if (e == EINTR || e == EAGAIN) continue;
            if (e == EINVAL && direct) {
                fall_back(r);
                continue;
            }
            return read_error(r, op, e, err);
        }
        if (at + (uint64_t)ret <= done) break; /* no progress: end of file */
        /* count only the new bytes: an O_DIRECT retry re-reads [at, done) from the last aligned boundary */
        *nread += at + (uint64_t)ret - done;
        done = at + (uint64_t)ret;
    }
    if (buffered) drop_cache(r, op->offset, done);
    if (done < op->need) return short_read(r, op, done, err);
    scatter(r, op, buf);
    return FLM_OK;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Threads back end: a persistent pool takes requests from the batch under a mutex (requests are >= 4 KiB device
 * reads, so the lock is not the bottleneck) and reports completion through a condition variable.
 * ------------------------------------------------------------------------------------------------------------- */

static void *worker_main(void *arg) {
    flm_reader *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->next >= r->n_ops) pthread_cond_wait(&r->cv_work, &r->mu);
        if (r->stop) break;
        size_t i = r->next++;
        bool skip = r->failed;
        const flm_read_op *op = &r->ops[i];
        uint8_t *buf = r->op_bufs[i];
        pthread_mutex_unlock(&r->mu);

        flm_error e;
        uint64_t nread = 0;
        flm_status st = skip ? FLM_OK : exec_op(r, op, buf, &nread, &e);

        pthread_mutex_lock(&r->mu);
        r->batch_bytes += nread;
        if (st != FLM_OK && !r->failed) {
            r->failed = true;
            r->batch_err = e;
        }
        if (++r->done == r->n_ops) pthread_cond_signal(&r->cv_done);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static flm_status run_threads(flm_reader *r, const flm_read_op *ops, uint8_t *const *bufs, size_t n,
                              uint64_t *nread, flm_error *err) {
    if (n == 1) return exec_op(r, &ops[0], bufs[0], nread, err); /* no hand-off for a single request */
    pthread_mutex_lock(&r->mu);
    r->ops = ops;
    r->op_bufs = bufs;
    r->n_ops = n;
    r->next = r->done = 0;
    r->failed = false;
    r->batch_bytes = 0;
    if (n >= (size_t)r->n_threads) pthread_cond_broadcast(&r->cv_work);
    else
        for (size_t i = 0; i < n; i++) pthread_cond_signal(&r->cv_work);
    while (r->done < r->n_ops) pthread_cond_wait(&r->cv_done, &r->mu);
    r->n_ops = r->next = 0;
    *nread += r->batch_bytes;
    flm_status st = FLM_OK;
    if (r->failed) {
        st = r->batch_err.code;
        if (err) *err = r->batch_err;
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

static void stop_threads(flm_reader *r) {
    if (!r->sync_ready) return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv_work);
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->n_threads; i++) pthread_join(r->threads[i], NULL);
    r->n_threads = 0;
}

static flm_status start_threads(flm_reader *r, int n, flm_error *err) {
    r->threads = calloc((size_t)n, sizeof *r->threads);
    if (!r->threads) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for %d reader threads", r->path, n);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, WORKER_STACK);
    for (int i = 0; i < n; i++) {
        int e = pthread_create(&r->threads[i], &attr, worker_main, r);
        if (e) {
            pthread_attr_destroy(&attr);
            return flm_fail(err, FLM_ERR_IO, "%s: cannot start reader thread %d of %d: %s", r->path, i + 1, n,
                            strerror(e));
        }
        r->n_threads = i + 1;
    }
    pthread_attr_destroy(&attr);
    return FLM_OK;
}

/* ---------------------------------------------------------------------------------------------------------------
 * io_uring back end: up to queue_depth reads in flight from the calling thread; partial reads are resubmitted for
 * the remainder, scatter copies happen as requests complete.
 * ------------------------------------------------------------------------------------------------------------- */
#ifdef FLM_HAVE_URING

static void uring_prep(flm_reader *r, uslot *sl, const flm_read_op *op, uint8_t *buf) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring); /* never NULL: one SQE per slot at most */
    bool direct = atomic_load(&r->direct);
    sl->at = direct ? flm_align_down(sl->done, r->align) : sl->done;
    sl->was_direct = direct;
    sl->buffered |= !direct;
    io_uring_prep_read(sqe, direct ? r->fd_direct : r->fd_buf, buf + sl->at, (unsigned)(op->length - sl->at),
                       op->offset + sl->at);
    io_uring_sqe_set_data(sqe, sl);
}

static flm_status run_uring(flm_reader *r, const flm_read_op *ops, uint8_t *const *bufs, size_t n, uint64_t *nread,
                            flm_error *err) {
    if (r->broken) return flm_fail(err, FLM_ERR_IO, "%s: the io_uring ring failed earlier; reopen the file", r->path);
    int qd = r->opts.queue_depth, n_free = qd, inflight = 0;
    for (int i = 0; i < qd; i++) r->free_slots[i] = i;
    size_t next = 0;
    flm_status st = FLM_OK;
    while ((st == FLM_OK && next < n) || inflight > 0) {
        while (st == FLM_OK && next < n && n_free > 0) {
            uslot *sl = &r->slots[r->free_slots[--n_free]];
            *sl = (uslot){.op = next, .fault = take_fault(r), .first = true};
            uring_prep(r, sl, &ops[next], bufs[next]);
            next++;
            inflight++;
        }
        int ret = io_uring_submit_and_wait(&r->ring, 1);
        if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
            /* The ring is unusable; reads in flight may still land in their buffers, so never reuse it. */
            r->broken = true;
            return flm_fail(err, FLM_ERR_IO, "%s: io_uring submit failed: %s", r->path, strerror(-ret));
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&r->ring, head, cqe) {
            seen++;
            uslot *sl = io_uring_cqe_get_data(cqe);
            const flm_read_op *op = &ops[sl->op];
            int res = cqe->res;
            if (sl->first) {
                if (sl->fault == FLM_FAULT_EIO) res = -EIO;
                else if (sl->fault == FLM_FAULT_EINVAL) res = -EINVAL;
                else if (sl->fault == FLM_FAULT_EINTR) res = -EINTR;
                else if (res > 0) res = (int)fault_truncate(sl->fault, op, (uint64_t)res);
            } else if (sl->fault == FLM_FAULT_SHORT) {
                res = 0;
            }
            sl->first = false;
            if (res == -EINTR || res == -EAGAIN || (res == -EINVAL && sl->was_direct)) {
                if (res == -EINVAL) fall_back(r);
                uring_prep(r, sl, op, bufs[sl->op]);
                continue;
            }
            if (res < 0) {
                if (st == FLM_OK) st = read_error(r, op, -res, err);
            } else {
                if (sl->at + (uint64_t)res > sl->done) { /* progress; otherwise end of file */
                    *nread += sl->at + (uint64_t)res - sl->done; /* new bytes only (see exec_op) */
                    sl->done = sl->at + (uint64_t)res;
                    if (sl->done < op->need) { /* continue a partial read (bytes past `need` are padding) */
                        uring_prep(r, sl, op, bufs[sl->op]);
                        continue;
                    }
                }
                if (sl->buffered) drop_cache(r, op->offset, sl->done);
                if (sl->done < op->need) {
                    if (st == FLM_OK) st = short_read(r, op, sl->done, err);
                } else if (st == FLM_OK) {
                    scatter(r, op, bufs[sl->op]);
                }
            }
            r->free_slots[n_free++] = (int)(sl - r->slots);
            inflight--;
        }
        io_uring_cq_advance(&r->ring, seen);
    }
    return st;
}
#endif

/* ---------------------------------------------------------------------------------------------------------------
 * Open / read / close
 * ------------------------------------------------------------------------------------------------------------- */

/* Direct-I/O alignment of the file: statx(STATX_DIOALIGN) where available, at least MIN_ALIGN.
 * *supported is set false when the file system reports that it has no direct I/O at all. */
static uint64_t dio_align(int fd, bool *supported) {
    uint64_t a = MIN_ALIGN;
    *supported = true;
#if defined(__linux__) && defined(STATX_DIOALIGN)
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
        if (sx.stx_dio_offset_align == 0) *supported = false;
        uint64_t m = sx.stx_dio_mem_align > sx.stx_dio_offset_align ? sx.stx_dio_mem_align : sx.stx_dio_offset_align;
        if (m > a && (m & (m - 1)) == 0 && m <= (UINT64_C(1) << 20)) a = m;
    }
#else
    (void)fd;
#endif
    return a;
}

static flm_status normalise_opts(flm_reader_opts *o, const flm_reader_opts *in, const char *path, flm_error *err) {
    flm_reader_opts d;
    flm_reader_opts_default(&d);
    *o = in ? *in : d;
    if (o->backend != FLM_IO_AUTO && o->backend != FLM_IO_THREADS && o->backend != FLM_IO_URING)
        return flm_fail(err, FLM_ERR_ARG, "%s: unknown I/O back end %d", path, (int)o->backend);
    if (o->n_threads <= 0) o->n_threads = d.n_threads;
    if (o->n_threads > MAX_THREADS) o->n_threads = MAX_THREADS;
    if (o->queue_depth <= 0) o->queue_depth = d.queue_depth;
    if (o->queue_depth > MAX_QUEUE_DEPTH) o->queue_depth = MAX_QUEUE_DEPTH;
    if (o->cost.latency_us < 0) o->cost.latency_us = d.cost.latency_us;
    if (!(o->cost.bandwidth_gbps > 0)) o->cost.bandwidth_gbps = d.cost.bandwidth_gbps;
    if (o->bounce_bytes == 0) o->bounce_bytes = d.bounce_bytes;
    if (o->max_request == 0) o->max_request = d.max_request;
    return FLM_OK;
}

static flm_status open_files(flm_reader *r, bool want_direct, flm_error *err) {
    r->fd_buf = open(r->path, O_RDONLY | O_CLOEXEC);
    if (r->fd_buf < 0) return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", r->path, strerror(errno));
    struct stat st;
    if (fstat(r->fd_buf, &st) != 0) return flm_fail(err, FLM_ERR_IO, "%s: cannot stat: %s", r->path, strerror(errno));
    r->file_size = (uint64_t)st.st_size;
#if defined(POSIX_FADV_RANDOM)
    (void)posix_fadvise(r->fd_buf, 0, 0, POSIX_FADV_RANDOM); /* no readahead behind our requests */
#endif
#if defined(F_NOCACHE)
    (void)fcntl(r->fd_buf, F_NOCACHE, 1); /* macOS: bypass the unified buffer cache */
#endif
    bool dio_ok;
    r->align = dio_align(r->fd_buf, &dio_ok);
#ifdef O_DIRECT
    if (want_direct) {
        if (!dio_ok) {
            note_fallback(r);
        } else {
            r->fd_direct = open(r->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
            if (r->fd_direct >= 0) atomic_store(&r->direct, true);
            else if (errno == EINVAL) note_fallback(r);
            else return flm_fail(err, FLM_ERR_IO, "%s: cannot open with O_DIRECT: %s", r->path, strerror(errno));
        }
    }
#else
    (void)want_direct;
    (void)dio_ok;
#endif
    return FLM_OK;
}

static flm_status start_backend(flm_reader *r, flm_error *err) {
    flm_io_backend want = r->opts.backend;
    if (want == FLM_IO_AUTO || want == FLM_IO_URING) {
#ifdef FLM_HAVE_URING
        int qd = r->opts.queue_depth;
        int e = io_uring_queue_init((unsigned)qd, &r->ring, 0);
        if (e == 0) {
            r->ring_ready = true;
            r->slots = calloc((size_t)qd, sizeof *r->slots);
            r->free_slots = calloc((size_t)qd, sizeof *r->free_slots);
            if (!r->slots || !r->free_slots)
                return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for %d io_uring slots", r->path, qd);
            r->backend = FLM_IO_URING;
            return FLM_OK;
        }
        if (want == FLM_IO_URING)
            return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: io_uring_queue_init(%d) failed: %s", r->path, qd,
                            strerror(-e));
        flm_log(r->opts.log, FLM_LOG_INFO, "io_uring unavailable (%s); using %d reader threads", strerror(-e),
                r->opts.n_threads);
#else
        if (want == FLM_IO_URING)
            return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: io_uring back end not built (liburing not found)", r->path);
#endif
    }
    r->backend = FLM_IO_THREADS;
    if (pthread_mutex_init(&r->mu, NULL) != 0)
        return flm_fail(err, FLM_ERR_IO, "%s: cannot create reader mutex", r->path);
    if (pthread_cond_init(&r->cv_work, NULL) != 0) {
        pthread_mutex_destroy(&r->mu);
        return flm_fail(err, FLM_ERR_IO, "%s: cannot create reader condition variable", r->path);
    }
    if (pthread_cond_init(&r->cv_done, NULL) != 0) {
        pthread_cond_destroy(&r->cv_work);
        pthread_mutex_destroy(&r->mu);
        return flm_fail(err, FLM_ERR_IO, "%s: cannot create reader condition variable", r->path);
    }
    r->sync_ready = true;
    return start_threads(r, r->opts.n_threads, err);
}

flm_status flm_reader_open(const char *path, const flm_reader_opts *opts, flm_reader **out, flm_error *err) {
    if (!path || !out) return flm_fail(err, FLM_ERR_ARG, "flm_reader_open: NULL path or output pointer");
    *out = NULL;
    flm_reader *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        free(r);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for the reader", path);
    }
    r->fd_direct = r->fd_buf = -1;
    if (pthread_mutex_init(&r->call_mu, NULL)) {
        free(r->path);
        free(r);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: cannot create the reader's lock", path);
    }
    r->call_mu_ready = true;
    atomic_init(&r->direct, false);
    atomic_init(&r->fallback_noted, false);
    atomic_init(&r->fault_kind, FLM_FAULT_NONE);
    atomic_init(&r->fault_at, 0);
    atomic_init(&r->fault_count, 0);

    flm_status st = normalise_opts(&r->opts, opts, path, err);
    if (st == FLM_OK) st = open_files(r, r->opts.direct, err);
    if (st == FLM_OK) {
        /* Bounce memory holds at least one request; requests are no larger than the bounce memory. */
        uint64_t bounce = flm_align_down(r->opts.bounce_bytes, r->align);
        if (bounce < r->align) bounce = r->align;
        uint64_t mr = r->opts.max_request;
        if (mr > MAX_REQUEST_CAP) mr = MAX_REQUEST_CAP;
        if (mr > bounce) mr = bounce;
        mr = flm_align_down(mr, r->align);
        if (mr < r->align) mr = r->align;
        r->opts.max_request = mr;
        r->opts.bounce_bytes = (size_t)bounce;
        r->bounce_cap = (size_t)bounce;
        r->bounce = aligned_alloc((size_t)r->align, r->bounce_cap);
        if (!r->bounce)
            st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for %zu bounce bytes", path, r->bounce_cap);
    }
    if (st == FLM_OK) st = start_backend(r, err);
    if (st != FLM_OK) {
        flm_reader_close(r);
        return st;
    }
    *out = r;
    return FLM_OK;
}

static flm_status read_locked(flm_reader *r, const flm_extent *ext, size_t n, flm_io_stats *stats, flm_error *err);

flm_status flm_reader_read(flm_reader *r, const flm_extent *ext, size_t n, flm_io_stats *stats, flm_error *err) {
    if (!r || (n && !ext)) return flm_fail(err, FLM_ERR_ARG, "flm_reader_read: NULL reader or extent list");
    pthread_mutex_lock(&r->call_mu);
    flm_status st = read_locked(r, ext, n, stats, err);
    pthread_mutex_unlock(&r->call_mu);
    return st;
}

static flm_status read_locked(flm_reader *r, const flm_extent *ext, size_t n, flm_io_stats *stats, flm_error *err) {
    double t0 = flm_now_ms();
    uint64_t plan_align = atomic_load(&r->direct) ? r->align : 1; /* buffered reads need no alignment */
    flm_status st = flm_plan_reads(ext, n, &r->opts.cost, plan_align, r->opts.max_request, &r->plan, err);
    if (st == FLM_OK && r->plan.n_ops > r->bufs_cap) {
        uint8_t **b = realloc(r->bufs, r->plan.n_ops * sizeof *b);
        if (!b) st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for %zu requests", r->path, r->plan.n_ops);
        else {
            r->bufs = b;
            r->bufs_cap = r->plan.n_ops;
        }
    }
    uint64_t nread = 0;
    const flm_read_op *ops = r->plan.ops;
    size_t n_ops = st == FLM_OK ? r->plan.n_ops : 0;
    /* Batches: consecutive requests whose bounce buffers fit in the bounce memory together. */
    for (size_t i = 0; st == FLM_OK && i < n_ops;) {
        size_t used = 0, j = i;
        for (; j < n_ops; j++) {
            if (ops[j].dst) {
                r->bufs[j] = ops[j].dst;
                continue;
            }
            size_t sz = (size_t)flm_align_up(ops[j].length, r->align);
            if (j > i && used + sz > r->bounce_cap) break; /* one request always fits: length <= max_request <= cap */
            r->bufs[j] = r->bounce + used;
            used += sz;
        }
#ifdef FLM_HAVE_URING
        if (r->backend == FLM_IO_URING) st = run_uring(r, ops + i, r->bufs + i, j - i, &nread, err);
        else
#endif
            st = run_threads(r, ops + i, r->bufs + i, j - i, &nread, err);
        i = j;
    }
    if (stats) {
        for (size_t i = 0; i < n; i++) stats->bytes_requested += ext[i].length;
        stats->n_extents += n;
        stats->bytes_read += nread;
        stats->n_requests += n_ops;
        for (size_t i = 0; i < n_ops; i++) stats->hist[flm_io_hist_bucket(ops[i].length)]++;
        stats->ms += flm_now_ms() - t0;
    }
    return st;
}

const char *flm_reader_backend_name(const flm_reader *r) {
    return r && r->backend == FLM_IO_URING ? "io_uring" : "threads";
}

bool flm_reader_is_direct(const flm_reader *r) { return r && atomic_load(&((flm_reader *)r)->direct); }

uint64_t flm_reader_align(const flm_reader *r) { return r ? r->align : MIN_ALIGN; }

uint64_t flm_reader_file_size(const flm_reader *r) { return r ? r->file_size : 0; }

bool flm_reader_uring_works(void) {
#ifdef FLM_HAVE_URING
    static int known; /* 0: not probed, 1: works, -1: does not (benign race: every prober gets the same answer) */
    if (!known) {
        struct io_uring ring;
        int e = io_uring_queue_init(2, &ring, 0);
        if (e == 0) io_uring_queue_exit(&ring);
        known = e == 0 ? 1 : -1;
    }
    return known > 0;
#else
    return false;
#endif
}

size_t flm_reader_memory(const flm_reader *r) {
    if (!r) return 0;
    size_t m = sizeof *r + strlen(r->path) + 1 + r->bounce_cap + flm_plan_memory(&r->plan) +
               r->bufs_cap * sizeof *r->bufs + (size_t)r->n_threads * sizeof *r->threads;
    if (r->n_threads > FLM_READER_THREADS_FREE) /* the threads past the allowance's (core/util.h) */
        m += (size_t)(r->n_threads - FLM_READER_THREADS_FREE) * FLM_THREAD_BYTES;
#ifdef FLM_HAVE_URING
    if (r->ring_ready) {
        size_t qd = (size_t)r->opts.queue_depth;
        /* SQEs (64 B), CQEs (2 per SQE, 16 B), SQ index array, ring headers; then our slot arrays */
        m += qd * (64 + 2 * 16 + 4) + 2 * 4096 + qd * (sizeof *r->slots + sizeof *r->free_slots);
    }
#endif
    return m;
}

void flm_reader_set_fault(flm_reader *r, int fault_kind, uint64_t after_n_requests) {
    if (!r) return;
    atomic_store(&r->fault_kind, FLM_FAULT_NONE);
    atomic_store(&r->fault_count, 0);
    atomic_store(&r->fault_at, after_n_requests);
    atomic_store(&r->fault_kind, fault_kind);
}

void flm_reader_close(flm_reader *r) {
    if (!r) return;
    stop_threads(r);
    if (r->sync_ready) {
        pthread_cond_destroy(&r->cv_done);
        pthread_cond_destroy(&r->cv_work);
        pthread_mutex_destroy(&r->mu);
    }
    free(r->threads);
#ifdef FLM_HAVE_URING
    if (r->ring_ready) io_uring_queue_exit(&r->ring);
    free(r->slots);
    free(r->free_slots);
#endif
    if (r->fd_direct >= 0) close(r->fd_direct);
    if (r->fd_buf >= 0) close(r->fd_buf);
    flm_plan_free(&r->plan);
    free(r->bufs);
    free(r->bounce);
    free(r->path);
    if (r->call_mu_ready) pthread_mutex_destroy(&r->call_mu);
    free(r);
}
