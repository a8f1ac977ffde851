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
#include "core/unit_hash.h"
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

/* Checked reads: a run of n consecutive units first .. first + n - 1 of table `table`, whose bytes are at dst. */
typedef struct rcheck {
    uint8_t *dst;
    uint64_t first;
    uint32_t table;
    uint32_t n;
} rcheck;

struct flm_reader {
    char *path;
    int fd_direct; /* O_DIRECT descriptor, -1 when there is none */
    int fd_buf;    /* buffered descriptor, always open (fallback) */
    atomic_bool direct;
    atomic_bool fallback_noted;
    uint64_t align;
    uint64_t file_size;
    struct timespec mtime; /* the file's modification time when opened (mismatch: "changed while running") */
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

    /* checked reads (flm_reader_set_checks): the tables, sorted by offset; per read, the runs to check after each
     * request (op_chk[i] .. op_chk[i + 1]) and after the whole read (late: units split between requests); units that
     * failed their first check (fails, under fail_mu: reader threads add to it) */
    flm_check_table *tables;
    size_t n_tables;
    rcheck *chk, *late, *fails;
    size_t n_chk, chk_cap, n_late, late_cap, n_fails, fails_cap;
    size_t *op_chk;
    size_t op_chk_cap;
    bool fails_lost; /* a failure could not be recorded (out of memory) */
    pthread_mutex_t fail_mu;
    bool fail_mu_ready;
    atomic_uint_fast64_t chk_bytes, chk_ns; /* this read's hashing, from every thread */
    bool checking; /* this read checks its units (tables set, not flm_reader_read_unchecked) */

    pthread_mutex_t call_mu; /* one flm_reader_read at a time (a read-ahead thread and the caller may share it) */
    bool call_mu_ready;

    /* busy time (flm_reader_busy_ns): the calls' durations, which never overlap (call_mu), and the start of the one
     * running; under busy_mu, so that a query from another thread sees a call either running or added, never both */
    pthread_mutex_t busy_mu;
    bool busy_mu_ready;
    uint64_t busy_ns, busy_since; /* busy_since: 0 when no call runs */

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

/* The byte FLM_FAULT_CORRUPT flips in request op's buffer: one the caller asked for (a zero-copy request's middle, or
 * its first piece's fourth byte: the high byte of a little-endian f32), so that a checked read sees it. */
static uint64_t fault_byte(const flm_reader *r, const flm_read_op *op) {
    if (op->dst) return (op->need / 2) | 3;
    if (op->n_pieces) {
        const flm_read_piece *p = &r->plan.pieces[op->first_piece];
        return p->src + (p->length > 3 ? 3 : 0);
    }
    return op->need - 1;
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
    if (op->dst || op->n_pieces == 0) return; /* a recheck's op has no pieces (and the plan may have none: NULL) */
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
    if (fault == FLM_FAULT_CORRUPT) buf[fault_byte(r, op)] ^= 0x5a;
    scatter(r, op, buf);
    return FLM_OK;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Checked reads: each unit of a table wholly inside an extent is hashed once its bytes are in the destination, in
 * the completion of the request that brought them (check_op) or, when two requests brought it, after the read
 * (finish_checks); a mismatch is read again once (recheck).
 * ------------------------------------------------------------------------------------------------------------- */

static bool grow_array(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static uint64_t table_end(const flm_check_table *t) { return t->offset + t->unit_bytes * t->n_units; }

/* The runs for the file bytes [s, s + len) of extent e that land at d: units wholly inside them go to the current
 * request's list (chk), a unit that starts inside them and ends past them (split between requests) to the late list
 * when the extent holds it whole. */
static bool plan_segment(flm_reader *r, uint64_t s, uint64_t len, uint8_t *d, const flm_extent *e) {
    const uint64_t end = s + len;
    size_t lo = 0, hi = r->n_tables; /* the first table ending after s */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (table_end(&r->tables[mid]) <= s) lo = mid + 1;
        else hi = mid;
    }
    for (size_t ti = lo; ti < r->n_tables && r->tables[ti].offset < end; ti++) {
        const flm_check_table *t = &r->tables[ti];
        const uint64_t ub = t->unit_bytes, a = s > t->offset ? s : t->offset, tend = table_end(t);
        const uint64_t b = end < tend ? end : tend;
        const uint64_t u0 = (a - t->offset + ub - 1) / ub;  /* the first unit starting at or after a */
        const uint64_t u_full = (b - t->offset) / ub;       /* units before it end by b */
        const uint64_t u_start = (b - t->offset + ub - 1) / ub; /* units before it start before b */
        if (u_full > u0) {
            for (uint64_t u = u0; u < u_full;) { /* runs of at most 2^32 - 1 units */
                uint64_t m = u_full - u > UINT32_MAX ? UINT32_MAX : u_full - u;
                if (!grow_array((void **)&r->chk, &r->chk_cap, r->n_chk + 1, sizeof *r->chk)) return false;
                r->chk[r->n_chk++] = (rcheck){d + (t->offset + u * ub - s), u, (uint32_t)ti, (uint32_t)m};
                u += m;
            }
        }
        for (uint64_t u = u_full > u0 ? u_full : u0; u < u_start; u++) { /* at most one: it ends past b */
            uint64_t us = t->offset + u * ub;
            if (us < e->offset || us + ub > e->offset + e->length) continue; /* not all of it is asked for */
            if (!grow_array((void **)&r->late, &r->late_cap, r->n_late + 1, sizeof *r->late)) return false;
            r->late[r->n_late++] = (rcheck){d + (us - s), u, (uint32_t)ti, 1};
        }
    }
    return true;
}

/* The checks of the planned read of ext[0 .. n). */
static flm_status plan_checks(flm_reader *r, const flm_extent *ext, flm_error *err) {
    r->n_chk = r->n_late = r->n_fails = 0;
    r->fails_lost = false;
    atomic_store(&r->chk_bytes, 0);
    atomic_store(&r->chk_ns, 0);
    const flm_read_plan *p = &r->plan;
    if (!grow_array((void **)&r->op_chk, &r->op_chk_cap, p->n_ops + 1, sizeof *r->op_chk))
        return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for the read checks", r->path);
    for (size_t i = 0; i < p->n_ops; i++) {
        const flm_read_op *op = &p->ops[i];
        r->op_chk[i] = r->n_chk;
        bool ok = true;
        if (op->dst) {
            ok = plan_segment(r, op->offset, op->need, op->dst, &ext[op->ext]);
        } else {
            for (size_t j = 0; ok && j < op->n_pieces; j++) {
                const flm_read_piece *pc = &p->pieces[op->first_piece + j];
                ok = plan_segment(r, op->offset + pc->src, pc->length, pc->dst, &ext[pc->ext]);
            }
        }
        if (!ok) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for the read checks", r->path);
    }
    r->op_chk[p->n_ops] = r->n_chk;
    return FLM_OK;
}

static void note_fail(flm_reader *r, uint8_t *dst, uint32_t table, uint64_t unit) {
    pthread_mutex_lock(&r->fail_mu);
    if (grow_array((void **)&r->fails, &r->fails_cap, r->n_fails + 1, sizeof *r->fails))
        r->fails[r->n_fails++] = (rcheck){dst, unit, table, 1};
    else
        r->fails_lost = true;
    pthread_mutex_unlock(&r->fail_mu);
}

/* CPU time of the calling thread: what hashing costs, whatever else the machine runs (a busy machine stretches wall
 * time, not this). */
static uint64_t now_ns(void) {
    struct timespec ts;
#ifdef CLOCK_THREAD_CPUTIME_ID
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Hash runs c[0 .. n) and note the units that do not match. */
static void check_runs(flm_reader *r, const rcheck *c, size_t n) {
    if (!n) return;
    uint64_t t0 = now_ns(), bytes = 0;
    for (size_t k = 0; k < n; k++) {
        const flm_check_table *t = &r->tables[c[k].table];
        for (uint32_t j = 0; j < c[k].n; j++) {
            const uint8_t *p = c[k].dst + (uint64_t)j * t->unit_bytes;
            if (flm_unit_hash(p, (size_t)t->unit_bytes) != t->sums[c[k].first + j])
                note_fail(r, (uint8_t *)p, c[k].table, c[k].first + j);
        }
        bytes += c[k].n * t->unit_bytes;
    }
    atomic_fetch_add(&r->chk_ns, now_ns() - t0);
    atomic_fetch_add(&r->chk_bytes, bytes);
}

/* Request number i of the plan arrived (and was scattered): check the units it completed. */
static void check_op(flm_reader *r, const flm_read_op *op) {
    if (!r->checking) return;
    size_t i = (size_t)(op - r->plan.ops);
    check_runs(r, r->chk + r->op_chk[i], r->op_chk[i + 1] - r->op_chk[i]);
}

#if defined(__APPLE__)
#define ST_MTIM(s) ((s).st_mtimespec)
#else
#define ST_MTIM(s) ((s).st_mtim)
#endif

/* Why a unit that was checked at conversion no longer matches: the file was written to since this reader opened it
 * (its size or modification time differ now: rewritten in place while running), or else it is corrupt. */
static const char *mismatch_cause(const flm_reader *r) {
    struct stat st;
    if (fstat(r->fd_buf, &st) == 0 &&
        ((uint64_t)st.st_size != r->file_size || ST_MTIM(st).tv_sec != r->mtime.tv_sec ||
         ST_MTIM(st).tv_nsec != r->mtime.tv_nsec))
        return "the file was written to after flashlm opened it: it changed while running; start again once it is "
               "complete";
    return "the file is corrupt";
}

static flm_status mismatch(const flm_reader *r, const rcheck *f, const char *how, flm_error *err) {
    const flm_check_table *t = &r->tables[f->table];
    return flm_fail(err, FLM_ERR_CHECKSUM, "%s: %s, %s %llu (file bytes %llu..%llu): checksum mismatch %s (%s)",
                    r->path, t->what, t->unit, (unsigned long long)f->first,
                    (unsigned long long)(t->offset + f->first * t->unit_bytes),
                    (unsigned long long)(t->offset + (f->first + 1) * t->unit_bytes), how, mismatch_cause(r));
}

/* Read failed unit f again (one synchronous request through the bounce memory, which no batch uses now) into its
 * destination and check it once more. */
static flm_status recheck(flm_reader *r, const rcheck *f, uint64_t *nread, flm_io_stats *stats, flm_error *err) {
    const flm_check_table *t = &r->tables[f->table];
    const uint64_t us = t->offset + f->first * t->unit_bytes, ue = us + t->unit_bytes;
    uint64_t done = 0;
    while (us + done < ue) { /* a unit larger than the bounce memory: in pieces */
        uint64_t at = us + done, o0 = flm_align_down(at, r->align);
        uint64_t o1 = flm_align_up(ue, r->align);
        if (o1 - o0 > r->bounce_cap) o1 = o0 + r->bounce_cap;
        flm_read_op op = {.offset = o0, .length = o1 - o0, .need = (ue < o1 ? ue : o1) - o0};
        flm_status st = exec_op(r, &op, r->bounce, nread, err);
        if (st) return st;
        memcpy(f->dst + done, r->bounce + (at - o0), (size_t)(o0 + op.need - at));
        done += o0 + op.need - at;
    }
    uint64_t t0 = now_ns();
    bool ok = flm_unit_hash(f->dst, (size_t)t->unit_bytes) == t->sums[f->first];
    if (stats) {
        stats->check_ms += (double)(now_ns() - t0) / 1e6;
        stats->bytes_checked += t->unit_bytes;
        stats->n_check_retries++;
    }
    return ok ? FLM_OK : mismatch(r, f, "on two reads", err);
}

/* After a read: the units split between requests, then every failed unit read again once. */
static flm_status finish_checks(flm_reader *r, uint64_t *nread, flm_io_stats *stats, flm_error *err) {
    check_runs(r, r->late, r->n_late);
    if (stats) {
        stats->bytes_checked += atomic_load(&r->chk_bytes);
        stats->check_ms += (double)atomic_load(&r->chk_ns) / 1e6;
    }
    if (r->fails_lost && r->n_fails) return mismatch(r, &r->fails[0], "(too many units to read again)", err);
    if (r->fails_lost)
        return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory while checking a read that did not match", r->path);
    for (size_t k = 0; k < r->n_fails; k++) {
        flm_status st = recheck(r, &r->fails[k], nread, stats, err);
        if (st) return st;
    }
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
        if (!skip && st == FLM_OK) check_op(r, op); /* hashed here, beside the other reads */

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
    if (n == 1) { /* no hand-off for a single request */
        flm_status st = exec_op(r, &ops[0], bufs[0], nread, err);
        if (st == FLM_OK) check_op(r, &ops[0]);
        return st;
    }
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
                    if (sl->fault == FLM_FAULT_CORRUPT) bufs[sl->op][fault_byte(r, op)] ^= 0x5a;
                    scatter(r, op, bufs[sl->op]);
                    check_op(r, op); /* hashed while the other reads are in flight */
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
 * *supported is set false when the file system reports that it has no direct I/O at all.
 * qemu-user (7.2, 8.x) passes the host kernel's result mask through but copies neither the DIO fields nor stx_mnt_id
 * (both read 0): a mask with STATX_MNT_ID, mount id 0 and zero DIO fields marks such an emulator (a kernel gives mount
 * id 0 at most to the boot-time rootfs), whose zero DIO fields say nothing: O_DIRECT is then tried, and an open or a
 * read that fails with EINVAL still falls back to buffered reads (so a misreading costs one failed attempt). */
static uint64_t dio_align(int fd, bool *supported) {
    uint64_t a = MIN_ALIGN;
    *supported = true;
#if defined(__linux__) && defined(STATX_DIOALIGN)
    struct statx sx;
    memset(&sx, 0, sizeof sx);
    unsigned want = STATX_DIOALIGN;
#ifdef STATX_MNT_ID
    want |= STATX_MNT_ID;
#endif
    if (statx(fd, "", AT_EMPTY_PATH, want, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
#ifdef STATX_MNT_ID
        if ((sx.stx_mask & STATX_MNT_ID) && sx.stx_mnt_id == 0 && sx.stx_dio_offset_align == 0 &&
            sx.stx_dio_mem_align == 0)
            return a; /* an emulator's unfilled fields (above) */
#endif
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
    r->mtime = ST_MTIM(st);
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
    if (pthread_mutex_init(&r->busy_mu, NULL)) {
        flm_reader_close(r);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: cannot create the reader's lock", path);
    }
    r->busy_mu_ready = true;
    if (pthread_mutex_init(&r->fail_mu, NULL)) {
        flm_reader_close(r);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: cannot create the reader's lock", path);
    }
    r->fail_mu_ready = true;
    atomic_init(&r->chk_bytes, 0);
    atomic_init(&r->chk_ns, 0);
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

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

/* A read call starts (under call_mu) or ends: the reader's busy time (flm_reader_busy_ns). */
static void busy_begin(flm_reader *r) {
    pthread_mutex_lock(&r->busy_mu);
    r->busy_since = mono_ns() | 1; /* never 0 (0: idle) */
    pthread_mutex_unlock(&r->busy_mu);
}

static void busy_end(flm_reader *r) {
    pthread_mutex_lock(&r->busy_mu);
    uint64_t now = mono_ns();
    if (r->busy_since && now > r->busy_since) r->busy_ns += now - r->busy_since;
    r->busy_since = 0;
    pthread_mutex_unlock(&r->busy_mu);
}

uint64_t flm_reader_busy_ns(const flm_reader *r) {
    if (!r) return 0;
    flm_reader *w = (flm_reader *)r; /* the lock only */
    pthread_mutex_lock(&w->busy_mu);
    uint64_t t = w->busy_ns, since = w->busy_since, now = since ? mono_ns() : 0;
    pthread_mutex_unlock(&w->busy_mu);
    return since && now > since ? t + (now - since) : t;
}

static flm_status read_call(flm_reader *r, const flm_extent *ext, size_t n, flm_io_stats *stats, bool checked,
                            flm_error *err) {
    if (!r || (n && !ext)) return flm_fail(err, FLM_ERR_ARG, "flm_reader_read: NULL reader or extent list");
    pthread_mutex_lock(&r->call_mu);
    r->checking = checked && r->n_tables;
    const bool busy = n > 0; /* an empty list reads nothing */
    if (busy) busy_begin(r);
    flm_status st = read_locked(r, ext, n, stats, err);
    if (busy) busy_end(r);
    r->checking = false;
    pthread_mutex_unlock(&r->call_mu);
    return st;
}

flm_status flm_reader_read(flm_reader *r, const flm_extent *ext, size_t n, flm_io_stats *stats, flm_error *err) {
    return read_call(r, ext, n, stats, true, err);
}

flm_status flm_reader_read_unchecked(flm_reader *r, const flm_extent *ext, size_t n, flm_io_stats *stats,
                                     flm_error *err) {
    return read_call(r, ext, n, stats, false, err);
}

static flm_status read_locked(flm_reader *r, const flm_extent *ext, size_t n, flm_io_stats *stats, flm_error *err) {
    double t0 = flm_now_ms();
    uint64_t plan_align = atomic_load(&r->direct) ? r->align : 1; /* buffered reads need no alignment */
    flm_status st = flm_read_plan_build(ext, n, &r->opts.cost, plan_align, r->opts.max_request, &r->plan, err);
    if (st == FLM_OK && r->plan.n_ops > r->bufs_cap) {
        uint8_t **b = realloc(r->bufs, r->plan.n_ops * sizeof *b);
        if (!b) st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for %zu requests", r->path, r->plan.n_ops);
        else {
            r->bufs = b;
            r->bufs_cap = r->plan.n_ops;
        }
    }
    if (st == FLM_OK && r->checking) st = plan_checks(r, ext, err);
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
    if (st == FLM_OK && r->checking) st = finish_checks(r, &nread, stats, err);
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
    size_t m = sizeof *r + strlen(r->path) + 1 + r->bounce_cap + flm_read_plan_bytes(&r->plan) +
               r->bufs_cap * sizeof *r->bufs + (size_t)r->n_threads * sizeof *r->threads +
               r->n_tables * sizeof *r->tables + (r->chk_cap + r->late_cap + r->fails_cap) * sizeof(rcheck) +
               r->op_chk_cap * sizeof *r->op_chk;
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
    flm_read_plan_free(&r->plan);
    free(r->bufs);
    free(r->bounce);
    free(r->path);
    if (r->call_mu_ready) pthread_mutex_destroy(&r->call_mu);
    if (r->busy_mu_ready) pthread_mutex_destroy(&r->busy_mu);
    if (r->fail_mu_ready) pthread_mutex_destroy(&r->fail_mu);
    free(r->tables);
    free(r->chk);
    free(r->late);
    free(r->fails);
    free(r->op_chk);
    free(r);
}

static int cmp_table(const void *a, const void *b) {
    const flm_check_table *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

flm_status flm_reader_set_checks(flm_reader *r, const flm_check_table *t, size_t n, flm_error *err) {
    if (!r || (n && !t)) return flm_fail(err, FLM_ERR_ARG, "flm_reader_set_checks: NULL reader or table list");
    flm_check_table *c = NULL;
    if (n) {
        if (!(c = malloc(n * sizeof *c))) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", r->path);
        memcpy(c, t, n * sizeof *c);
        qsort(c, n, sizeof *c, cmp_table);
        for (size_t i = 0; i < n; i++) {
            const flm_check_table *x = &c[i];
            bool bad = x->unit_bytes == 0 || (x->n_units && !x->sums) || x->offset > (UINT64_C(1) << 62) ||
                       x->n_units > ((UINT64_C(1) << 62) - x->offset) / x->unit_bytes;
            if (!bad && i > 0 && x->offset < table_end(&c[i - 1])) bad = true;
            if (bad) { /* the message before c (which x points into) is freed */
                flm_status st = flm_fail(err, FLM_ERR_ARG, "%s: check table '%s' (offset %llu, %llu units of %llu "
                                         "bytes) is empty of bytes, overlaps another or ends beyond 2^62", r->path,
                                         x->what, (unsigned long long)x->offset, (unsigned long long)x->n_units,
                                         (unsigned long long)x->unit_bytes);
                free(c);
                return st;
            }
        }
    }
    pthread_mutex_lock(&r->call_mu); /* not while a read (a read-ahead thread's) uses the old tables */
    free(r->tables);
    r->tables = c;
    r->n_tables = n;
    pthread_mutex_unlock(&r->call_mu);
    return FLM_OK;
}

bool flm_reader_checks(const flm_reader *r) { return r && r->n_tables > 0; }

flm_status flm_reader_check(flm_reader *r, const flm_extent *ext, size_t n, flm_io_stats *stats, flm_error *err) {
    if (!r || (n && !ext)) return flm_fail(err, FLM_ERR_ARG, "flm_reader_check: NULL reader or extent list");
    pthread_mutex_lock(&r->call_mu);
    flm_status st = FLM_OK;
    uint64_t nread = 0;
    if (r->n_tables) {
        r->n_chk = r->n_late = r->n_fails = 0;
        r->fails_lost = false;
        atomic_store(&r->chk_bytes, 0);
        atomic_store(&r->chk_ns, 0);
        for (size_t i = 0; i < n && !st; i++)
            if (ext[i].length && !plan_segment(r, ext[i].offset, ext[i].length, ext[i].dst, &ext[i]))
                st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for the read checks", r->path);
        if (!st) {
            check_runs(r, r->chk, r->n_chk);
            st = finish_checks(r, &nread, stats, err);
        }
        if (stats) stats->bytes_read += nread;
    }
    pthread_mutex_unlock(&r->call_mu);
    return st;
}
