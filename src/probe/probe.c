/* probe.c — flashlm probe-disk: random/sequential read measurements through flm_reader, the cost-model fit, and the
 * JSON file next to the model (see probe.h, docs/IO.md "Measuring the disk"). */
#include "probe/probe.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/files.h"
#include "flashlm_tools.h" /* the checked writer (write/out.c) */
#include "core/util.h"

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define DEFAULT_SECONDS 60.0
#define DEFAULT_SIZE GiB
#define DEFAULT_CELL_BYTES GiB
#define DEFAULT_DST_BYTES (64 * MiB)
#define DST_ALIGN MiB          /* >= any reader alignment (the reader caps it at 1 MiB) */
#define WRITE_CHUNK (4 * MiB)  /* test file: write unit; the file size is a multiple of it */
#define MIN_BATCH 8            /* extents per flm_reader_read call at least (QD1 cells) */
#define BATCH_PER_IN_FLIGHT 4  /* extents per call = 4 x in flight, so the tail of a batch matters little */

static const uint64_t DEFAULT_SIZES[] = {4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB};
static const int DEFAULT_DEPTHS[] = {1, 4, 16, 32, 64};

static double now_s(void) { return flm_now_ms() * 1e-3; }

/* splitmix64: offsets and test-file contents. */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static const char *backend_name(flm_io_kind b) { return b == FLM_IO_KIND_URING ? "io_uring" : "threads"; }

void flm_probe_opts_default(flm_probe_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->seconds = DEFAULT_SECONDS;
    o->size = DEFAULT_SIZE;
    o->n_sizes = sizeof DEFAULT_SIZES / sizeof *DEFAULT_SIZES;
    memcpy(o->sizes, DEFAULT_SIZES, sizeof DEFAULT_SIZES);
    o->n_depths = sizeof DEFAULT_DEPTHS / sizeof *DEFAULT_DEPTHS;
    memcpy(o->depths, DEFAULT_DEPTHS, sizeof DEFAULT_DEPTHS);
    o->backends = FLM_PROBE_BOTH;
    o->cell_bytes = DEFAULT_CELL_BYTES;
    o->dst_bytes = DEFAULT_DST_BYTES;
    o->seed = 1;
}

static flm_status normalise_opts(flm_probe_opts *o, const flm_probe_opts *in, flm_error *err) {
    flm_probe_opts d;
    flm_probe_opts_default(&d);
    *o = in ? *in : d;
    if (!(o->seconds >= 0) || o->seconds > 1e6)
        return flm_fail(err, FLM_ERR_ARG, "probe: bad time budget %g s", o->seconds);
    if (o->size == 0) o->size = d.size;
    if (o->n_sizes == 0) {
        o->n_sizes = d.n_sizes;
        memcpy(o->sizes, d.sizes, sizeof d.sizes);
    }
    if (o->n_depths == 0) {
        o->n_depths = d.n_depths;
        memcpy(o->depths, d.depths, sizeof d.depths);
    }
    if (o->n_sizes > FLM_PROBE_MAX_LIST || o->n_depths > FLM_PROBE_MAX_LIST)
        return flm_fail(err, FLM_ERR_ARG, "probe: at most %d request sizes and in-flight counts", FLM_PROBE_MAX_LIST);
    for (size_t i = 0; i < o->n_sizes; i++)
        if (o->sizes[i] < 512 || o->sizes[i] > 64 * MiB || (o->sizes[i] & (o->sizes[i] - 1)))
            return flm_fail(err, FLM_ERR_ARG, "probe: request size %llu is not a power of two in [512, 64 MiB]",
                            (unsigned long long)o->sizes[i]);
    for (size_t i = 0; i < o->n_depths; i++)
        if (o->depths[i] < 1 || o->depths[i] > 1024)
            return flm_fail(err, FLM_ERR_ARG, "probe: %d reads in flight is outside [1, 1024]", o->depths[i]);
    if (o->backends == 0) o->backends = FLM_PROBE_BOTH;
    if (o->backends & ~(unsigned)FLM_PROBE_BOTH) return flm_fail(err, FLM_ERR_ARG, "probe: bad back-end mask");
    if (o->cell_bytes == 0) o->cell_bytes = d.cell_bytes;
    if (o->dst_bytes == 0) o->dst_bytes = d.dst_bytes;
    if (o->dst_bytes < FLM_PROBE_SEQ_BYTES) o->dst_bytes = FLM_PROBE_SEQ_BYTES;
    o->dst_bytes = flm_align_up(o->dst_bytes, DST_ALIGN);
    if (o->seed == 0) o->seed = d.seed;
    return FLM_OK;
}

/* ---------------------------------------------------------------------------------------------------------------
 * The target: a model file, or a temporary test file in a directory
 * ------------------------------------------------------------------------------------------------------------- */

typedef struct target {
    char read_path[64 + 4096]; /* what the reader opens: the file, or /proc/self/fd/N of the unlinked test file */
    char *tmp_name;            /* the test file's name while it still has one (to unlink at the end), else NULL */
    int tmp_fd;                /* the test file, kept open while it is measured; -1 for a model file */
} target;

static void target_close(target *t) {
    if (t->tmp_fd >= 0) close(t->tmp_fd);
    if (t->tmp_name) unlink(t->tmp_name);
    free(t->tmp_name);
    t->tmp_fd = -1;
    t->tmp_name = NULL;
}

/* Create, fill (pseudo-random data: no holes, nothing a file system could compress or deduplicate), fsync and drop
 * from the page cache a test file of `size` bytes (capped at half the free space) in directory dir. */
static flm_status make_test_file(const char *dir, const flm_probe_opts *o, target *t, uint64_t *size_out,
                                 flm_error *err) {
    struct statvfs sv;
    if (statvfs(dir, &sv) != 0) return flm_fail(err, FLM_ERR_IO, "%s: cannot statvfs: %s", dir, strerror(errno));
    uint64_t free_bytes = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    uint64_t size = o->size;
    if (size > free_bytes / 2) size = free_bytes / 2;
    size = size / WRITE_CHUNK * WRITE_CHUNK;
    if (size < FLM_PROBE_MIN_FILE)
        return flm_fail(err, FLM_ERR_IO, "%s: not enough free space for a test file (%llu bytes free; need twice %llu)",
                        dir, (unsigned long long)free_bytes, (unsigned long long)FLM_PROBE_MIN_FILE);
    size_t n = strlen(dir) + 32;
    if (!(t->tmp_name = malloc(n))) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    snprintf(t->tmp_name, n, "%s/.flashlm-probe-XXXXXX", dir);
    t->tmp_fd = mkstemp(t->tmp_name);
    if (t->tmp_fd < 0) {
        flm_status st = flm_fail(err, FLM_ERR_IO, "%s: cannot create a test file: %s", dir, strerror(errno));
        free(t->tmp_name);
        t->tmp_name = NULL;
        return st;
    }
    /* Unlink it at once when the reader can reach it through /proc/self/fd: nothing is left behind on a kill. */
    snprintf(t->read_path, sizeof t->read_path, "/proc/self/fd/%d", t->tmp_fd);
    int probe_fd = open(t->read_path, O_RDONLY | O_CLOEXEC);
    if (probe_fd >= 0) {
        close(probe_fd);
        unlink(t->tmp_name);
        free(t->tmp_name);
        t->tmp_name = NULL;
    } else {
        snprintf(t->read_path, sizeof t->read_path, "%s", t->tmp_name);
    }
#if defined(__linux__)
    (void)posix_fallocate(t->tmp_fd, 0, (off_t)size); /* contiguous allocation where possible; write below anyway */
#endif
    uint8_t *buf = malloc(WRITE_CHUNK);
    if (!buf) return flm_fail(err, FLM_ERR_NOMEM, "out of memory for the test file buffer");
    uint64_t seed = o->seed ^ UINT64_C(0x5DEECE66D);
    for (uint64_t off = 0; off < size; off += WRITE_CHUNK) {
        if (o->progress && (off % (64 * MiB) == 0)) o->progress(o->progress_user, "writing test file", off, size);
        uint64_t *w = (uint64_t *)buf;
        for (size_t i = 0; i < WRITE_CHUNK / 8; i++) w[i] = rng_next(&seed);
        for (uint64_t done = 0; done < WRITE_CHUNK;) {
            ssize_t k = pwrite(t->tmp_fd, buf + done, (size_t)(WRITE_CHUNK - done), (off_t)(off + done));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                flm_status st = flm_fail(err, FLM_ERR_IO, "%s: cannot write the test file: %s", dir,
                                         k < 0 ? strerror(errno) : "no progress");
                free(buf);
                return st;
            }
            done += (uint64_t)k;
        }
    }
    free(buf);
    if (fdatasync(t->tmp_fd) != 0)
        return flm_fail(err, FLM_ERR_IO, "%s: cannot sync the test file: %s", dir, strerror(errno));
    if (o->progress) o->progress(o->progress_user, "writing test file", size, size);
    *size_out = size;
    return FLM_OK;
}

/* The page cache must not serve the probe's reads: O_DIRECT bypasses it; for buffered reads (fallback) drop what
 * is cached of the file now (clean pages only; mapped pages stay). */
static void drop_file_cache(const char *path) {
#if defined(POSIX_FADV_DONTNEED)
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
#else
    (void)path;
#endif
}

/* ---------------------------------------------------------------------------------------------------------------
 * Cells
 * ------------------------------------------------------------------------------------------------------------- */

/* Build the list of cells: back end (io_uring first), in flight, then the random sizes and the sequential cell. */
static flm_status plan_cells(const flm_probe_opts *o, flm_probe_result *r, flm_error *err) {
    size_t max = 2 * o->n_depths * (o->n_sizes + 1);
    if (!(r->cells = calloc(max, sizeof *r->cells))) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    static const flm_io_kind order[] = {FLM_IO_KIND_URING, FLM_IO_KIND_THREADS};
    for (int b = 0; b < 2; b++) {
        if (!(o->backends & (order[b] == FLM_IO_KIND_URING ? FLM_PROBE_URING : FLM_PROBE_THREADS))) continue;
        for (size_t d = 0; d < o->n_depths; d++) {
            for (size_t s = 0; s < o->n_sizes; s++)
                r->cells[r->n_cells++] = (flm_probe_cell){.backend = order[b], .request_bytes = o->sizes[s],
                                                          .in_flight = o->depths[d]};
            if (o->depths[d] <= FLM_PROBE_SEQ_MAX_IN_FLIGHT)
                r->cells[r->n_cells++] = (flm_probe_cell){.backend = order[b], .sequential = true,
                                                          .request_bytes = FLM_PROBE_SEQ_BYTES,
                                                          .in_flight = o->depths[d]};
        }
    }
    return FLM_OK;
}

/* Fill ext[0 .. n) with one batch of cell c. Random: n extents at random slots, one per stratum of the slot range
 * (distinct, spread over the whole file); slots are stride = round_up(size, align) + align bytes apart, so no two
 * extents touch even after alignment. Sequential: consecutive extents from *pos, wrapping at the end of the file. */
static void fill_batch(const flm_probe_cell *c, uint64_t file_bytes, uint64_t align, uint8_t *dst, flm_extent *ext,
                       size_t n, uint64_t *rng, uint64_t *pos) {
    uint64_t s = c->request_bytes, g = flm_align_up(s, align);
    if (c->sequential) {
        for (size_t i = 0; i < n; i++) {
            if (*pos + s > file_bytes) *pos = 0;
            ext[i] = (flm_extent){*pos, s, dst + i * g};
            *pos += s;
        }
        return;
    }
    uint64_t stride = g + align, m = (file_bytes - g) / stride + 1, per = m / n;
    for (size_t i = 0; i < n; i++) {
        uint64_t slot = (uint64_t)i * per + rng_next(rng) % per;
        ext[i] = (flm_extent){slot * stride, s, dst + i * g};
    }
}

/* Extents per call for cell c: BATCH_PER_IN_FLIGHT x in flight (at least MIN_BATCH), as far as the destination
 * memory and the file allow. 0 when the file cannot hold one extent. */
static size_t batch_size(const flm_probe_cell *c, const flm_probe_opts *o, uint64_t file_bytes, uint64_t align) {
    uint64_t g = flm_align_up(c->request_bytes, align);
    if (file_bytes < g) return 0;
    uint64_t n = (uint64_t)c->in_flight * (c->sequential ? 1 : BATCH_PER_IN_FLIGHT);
    if (!c->sequential && n < MIN_BATCH) n = MIN_BATCH;
    if (n * g > o->dst_bytes) n = o->dst_bytes / g;
    uint64_t fit = c->sequential ? file_bytes / g : (file_bytes - g) / (g + align) + 1;
    if (n > fit) n = fit;
    return (size_t)n;
}

/* Run one cell on reader rd for about `share` seconds (or until o->cell_bytes). */
static flm_status run_cell(flm_reader *rd, flm_probe_cell *c, const flm_probe_opts *o, double share, uint8_t *dst,
                           flm_extent *ext, uint64_t *rng, flm_error *err) {
    uint64_t file_bytes = flm_reader_file_size(rd), align = flm_reader_align(rd);
    file_bytes -= file_bytes % align;
    size_t n = batch_size(c, o, file_bytes, align);
    c->batch = (int)n;
    if (n == 0) return FLM_OK; /* not measured: the file is too small for this request size */
    uint64_t pos = c->sequential ? (rng_next(rng) % (file_bytes / align)) * align : 0;
    flm_io_stats warm = {0}, stats = {0};
    double t0 = now_s();
    fill_batch(c, file_bytes, align, dst, ext, n, rng, &pos);
    flm_status st = flm_reader_read(rd, ext, n, &warm, err); /* warm-up: threads woken, ring and queues primed */
    while (st == FLM_OK) {
        fill_batch(c, file_bytes, align, dst, ext, n, rng, &pos);
        st = flm_reader_read(rd, ext, n, &stats, err);
        if (now_s() - t0 >= share || stats.bytes_read >= o->cell_bytes) break;
    }
    if (st != FLM_OK) return st;
    c->measured = stats.n_requests > 0 && stats.ms > 0;
    c->requests = stats.n_requests;
    c->bytes = stats.bytes_read;
    c->seconds = stats.ms * 1e-3;
    if (c->measured) {
        int inflight = c->in_flight < c->batch ? c->in_flight : c->batch;
        c->throughput_gbps = (double)c->bytes / c->seconds * 1e-9;
        c->iops = (double)c->requests / c->seconds;
        c->latency_us = (double)inflight / c->iops * 1e6;
    }
    return FLM_OK;
}

static void progress_cell(const flm_probe_opts *o, const flm_probe_cell *c, size_t done, size_t total) {
    if (!o->progress) return;
    char what[128], sz[32];
    if (c->request_bytes >= MiB) snprintf(sz, sizeof sz, "%llu MiB", (unsigned long long)(c->request_bytes / MiB));
    else snprintf(sz, sizeof sz, "%llu KiB", (unsigned long long)(c->request_bytes / KiB));
    snprintf(what, sizeof what, "probing %-8s %-10s %7s x %-4d", backend_name(c->backend),
             c->sequential ? "sequential" : "random", sz, c->in_flight);
    o->progress(o->progress_user, what, done, total);
}

flm_status flm_probe_run(const char *path, const flm_probe_opts *opts, flm_probe_result *out, flm_error *err) {
    if (!path || !out) return flm_fail(err, FLM_ERR_ARG, "flm_probe_run: NULL path or output");
    memset(out, 0, sizeof *out);
    flm_probe_opts o;
    flm_status st = normalise_opts(&o, opts, err);
    if (st) return st;
    struct stat sb;
    if (stat(path, &sb) != 0) return flm_fail(err, FLM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode))
        return flm_fail(err, FLM_ERR_ARG, "%s: not a regular file or a directory", path);
    if (S_ISREG(sb.st_mode) && (uint64_t)sb.st_size < FLM_PROBE_MIN_FILE)
        return flm_fail(err, FLM_ERR_ARG, "%s: %llu bytes is too small to measure the disk (at least %llu; the device "
                        "cache would serve it): probe its directory instead (flashlm probe-disk DIR --out FILE)",
                        path, (unsigned long long)sb.st_size, (unsigned long long)FLM_PROBE_MIN_FILE);
    if (!(out->path = strdup(path))) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    out->seconds_budget = o.seconds;
    out->seed = o.seed;
    out->direct = !o.buffered;

    target t = {.tmp_fd = -1};
    uint8_t *dst = NULL;
    flm_extent *ext = NULL;
    flm_reader *rd = NULL;
    if (S_ISDIR(sb.st_mode)) {
        out->temp_file = true;
        st = make_test_file(path, &o, &t, &out->file_bytes, err);
    } else {
        snprintf(t.read_path, sizeof t.read_path, "%s", path);
        out->file_bytes = (uint64_t)sb.st_size;
    }
    if (st == FLM_OK) st = plan_cells(&o, out, err);
    if (st == FLM_OK && (posix_memalign((void **)&dst, DST_ALIGN, (size_t)o.dst_bytes) != 0 ||
                         !(ext = calloc((size_t)(o.dst_bytes / 512), sizeof *ext)))) {
        dst = NULL;
        st = flm_fail(err, FLM_ERR_NOMEM, "out of memory for %llu bytes of read buffers",
                      (unsigned long long)o.dst_bytes);
    }
    if (st == FLM_OK) memset(dst, 0, (size_t)o.dst_bytes); /* fault the pages in now, not during the reads */
    if (st == FLM_OK) drop_file_cache(t.read_path);

    double t_start = now_s();
    uint64_t rng = o.seed;
    bool uring_failed = false;
    out->uring_available = (o.backends & FLM_PROBE_URING) != 0;
    for (size_t i = 0; st == FLM_OK && i < out->n_cells;) {
        /* one reader per (back end, in flight): the cells up to the next change of either */
        flm_probe_cell *c0 = &out->cells[i];
        size_t j = i;
        while (j < out->n_cells && out->cells[j].backend == c0->backend && out->cells[j].in_flight == c0->in_flight)
            j++;
        if (c0->backend == FLM_IO_KIND_URING && uring_failed) {
            i = j;
            continue;
        }
        flm_reader_opts ro;
        flm_reader_opts_default(&ro);
        ro.backend = c0->backend == FLM_IO_KIND_URING ? FLM_IO_URING : FLM_IO_THREADS;
        ro.n_threads = c0->in_flight;
        ro.queue_depth = c0->in_flight;
        ro.direct = !o.buffered;
        ro.cost = (flm_io_cost){.latency_us = 0.0, .bandwidth_gbps = 1.0}; /* no gap merging: one extent, one request */
        ro.max_request = FLM_PROBE_SEQ_BYTES;
        ro.bounce_bytes = (size_t)FLM_PROBE_SEQ_BYTES;
        flm_error e;
        flm_status ost = flm_reader_open(t.read_path, &ro, &rd, &e);
        if (ost == FLM_ERR_UNSUPPORTED && c0->backend == FLM_IO_KIND_URING) {
            uring_failed = true;
            out->uring_available = false;
            size_t k = strnlen(e.msg, sizeof out->uring_note - 1);
            memcpy(out->uring_note, e.msg, k);
            out->uring_note[k] = '\0';
            i = j;
            continue;
        }
        if (ost != FLM_OK) {
            if (err) *err = e;
            st = ost;
            break;
        }
        out->align = flm_reader_align(rd);
        if (!flm_reader_is_direct(rd)) out->direct = false;
        for (; st == FLM_OK && i < j; i++) {
            size_t left = out->n_cells - i;
            double share = (o.seconds - (now_s() - t_start)) / (double)left;
            progress_cell(&o, &out->cells[i], i, out->n_cells);
            st = run_cell(rd, &out->cells[i], &o, share > 0 ? share : 0, dst, ext, &rng, err);
        }
        if (!flm_reader_is_direct(rd)) out->direct = false;
        flm_reader_close(rd);
        rd = NULL;
        i = j;
    }
    if (st == FLM_OK && o.progress) o.progress(o.progress_user, "probing", out->n_cells, out->n_cells);
    out->wall_seconds = now_s() - t_start;
    free(ext);
    free(dst);
    target_close(&t);
    if (st != FLM_OK) {
        flm_probe_result_free(out);
        return st;
    }
    flm_probe_fit_cost(out);
    return FLM_OK;
}

const flm_probe_cell *flm_probe_find(const flm_probe_result *r, flm_io_kind backend, bool sequential,
                                     uint64_t request_bytes, int in_flight) {
    if (!r) return NULL;
    for (size_t i = 0; i < r->n_cells; i++) {
        const flm_probe_cell *c = &r->cells[i];
        if (c->measured && c->backend == backend && c->sequential == sequential && c->request_bytes == request_bytes &&
            c->in_flight == in_flight)
            return c;
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Fit (see probe.h)
 * ------------------------------------------------------------------------------------------------------------- */

void flm_probe_fit_cost(flm_probe_result *r) {
    if (!r) return;
    flm_probe_fit f = {0};
    r->fit = f;
    bool have_uring = false, have_threads = false;
    for (size_t i = 0; i < r->n_cells; i++) {
        if (!r->cells[i].measured) continue;
        if (r->cells[i].backend == FLM_IO_KIND_URING) have_uring = true;
        else have_threads = true;
    }
    if (!have_uring && !have_threads) return;
    f.backend = have_uring ? FLM_IO_KIND_URING : FLM_IO_KIND_THREADS;
    /* smallest random request size, and the smallest in-flight count measured with it */
    const flm_probe_cell *lat = NULL;
    for (size_t i = 0; i < r->n_cells; i++) {
        const flm_probe_cell *c = &r->cells[i];
        if (!c->measured || c->backend != f.backend || c->sequential) continue;
        if (!lat || c->request_bytes < lat->request_bytes ||
            (c->request_bytes == lat->request_bytes && c->in_flight < lat->in_flight))
            lat = c;
    }
    if (!lat) return;
    f.small_bytes = lat->request_bytes;
    f.latency_us = lat->latency_us;
    /* streaming bandwidth: the best sequential throughput; without sequential cells the best random one */
    double seq_bw = 0, rnd_bw = 0;
    for (size_t i = 0; i < r->n_cells; i++) {
        const flm_probe_cell *c = &r->cells[i];
        if (!c->measured || c->backend != f.backend) continue;
        double *b = c->sequential ? &seq_bw : &rnd_bw;
        if (c->throughput_gbps > *b) *b = c->throughput_gbps;
    }
    f.bandwidth_gbps = seq_bw > 0 ? seq_bw : rnd_bw;
    /* parallelism: the engine's default in-flight count, or the largest measured one below it (else the smallest
     * measured above it) */
    flm_reader_opts d;
    flm_reader_opts_default(&d);
    int want = f.backend == FLM_IO_KIND_URING ? d.queue_depth : d.n_threads;
    const flm_probe_cell *par = NULL;
    for (size_t i = 0; i < r->n_cells; i++) {
        const flm_probe_cell *c = &r->cells[i];
        if (!c->measured || c->backend != f.backend || c->sequential || c->request_bytes != f.small_bytes) continue;
        bool below = c->in_flight <= want, par_below = par && par->in_flight <= want;
        if (!par || (below && (!par_below || c->in_flight > par->in_flight)) ||
            (!below && !par_below && c->in_flight < par->in_flight))
            par = c;
    }
    f.parallelism = par->in_flight;
    f.speedup = par->iops / lat->iops;
    if (!(f.bandwidth_gbps > 0) || !(f.speedup > 0) || !(f.latency_us > 0)) return;
    double eff = f.latency_us / f.speedup - (double)f.small_bytes / (f.bandwidth_gbps * 1e3);
    f.effective_latency_us = eff > 0 ? eff : 0.0;
    f.cost = (flm_io_cost){.latency_us = f.effective_latency_us, .bandwidth_gbps = f.bandwidth_gbps};
    f.valid = true;
    r->fit = f;
}

/* ---------------------------------------------------------------------------------------------------------------
 * JSON
 * ------------------------------------------------------------------------------------------------------------- */


/* A number member, printed with the fewest digits (15..17) that read back as exactly x (cJSON's own printer accepts
 * a relative error of DBL_EPSILON, so a save / load round trip would not be exact); null when x is not finite. */
static bool add_num(cJSON *obj, const char *key, double x) {
    if (!isfinite(x)) return cJSON_AddNullToObject(obj, key) != NULL;
    char buf[48];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    return cJSON_AddRawToObject(obj, key, buf) != NULL;
}

/* Build the document; NULL when out of memory. */
static cJSON *to_json(const flm_probe_result *r) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    bool ok = cJSON_AddStringToObject(root, "format", FLM_PROBE_FORMAT) &&
              add_num(root, "version", FLM_PROBE_VERSION) &&
              cJSON_AddStringToObject(root, "path", r->path ? r->path : "") &&
              cJSON_AddBoolToObject(root, "temp_file", r->temp_file) &&
              add_num(root, "file_bytes", (double)r->file_bytes) &&
              add_num(root, "align", (double)r->align) &&
              cJSON_AddStringToObject(root, "io_mode", r->direct ? "O_DIRECT" : "buffered") &&
              cJSON_AddBoolToObject(root, "uring_available", r->uring_available) &&
              cJSON_AddStringToObject(root, "uring_note", r->uring_note) &&
              add_num(root, "seconds_budget", r->seconds_budget) &&
              add_num(root, "wall_seconds", r->wall_seconds) &&
              add_num(root, "seed", (double)r->seed);
    time_t now = time(NULL);
    struct tm tm;
    char when[32] = "";
    if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    ok = ok && cJSON_AddStringToObject(root, "created", when);
    cJSON *cells = ok ? cJSON_AddArrayToObject(root, "cells") : NULL;
    ok = cells != NULL;
    for (size_t i = 0; ok && i < r->n_cells; i++) {
        const flm_probe_cell *c = &r->cells[i];
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(cells, o)) {
            cJSON_Delete(o);
            ok = false;
            break;
        }
        ok = cJSON_AddStringToObject(o, "backend", backend_name(c->backend)) &&
             cJSON_AddStringToObject(o, "pattern", c->sequential ? "sequential" : "random") &&
             add_num(o, "request_bytes", (double)c->request_bytes) &&
             add_num(o, "in_flight", c->in_flight) &&
             add_num(o, "batch", c->batch) && cJSON_AddBoolToObject(o, "measured", c->measured) &&
             add_num(o, "requests", (double)c->requests) &&
             add_num(o, "bytes", (double)c->bytes) &&
             add_num(o, "seconds", c->seconds) &&
             add_num(o, "throughput_gbps", c->throughput_gbps) &&
             add_num(o, "iops", c->iops) && add_num(o, "latency_us", c->latency_us);
    }
    const flm_probe_fit *f = &r->fit;
    cJSON *fit = ok ? cJSON_AddObjectToObject(root, "fit") : NULL;
    ok = fit && cJSON_AddBoolToObject(fit, "valid", f->valid) &&
         cJSON_AddStringToObject(fit, "backend", backend_name(f->backend)) &&
         add_num(fit, "small_bytes", (double)f->small_bytes) &&
         add_num(fit, "latency_us", f->latency_us) &&
         add_num(fit, "bandwidth_gbps", f->bandwidth_gbps) &&
         add_num(fit, "parallelism", f->parallelism) &&
         add_num(fit, "speedup", f->speedup) &&
         add_num(fit, "effective_latency_us", f->effective_latency_us) &&
         add_num(fit, "gap_merge_bytes", f->effective_latency_us * f->bandwidth_gbps * 1e3);
    if (ok && f->valid) { /* what flm_probe_load_cost returns; absent when the fit failed */
        cJSON *cost = cJSON_AddObjectToObject(root, "cost");
        ok = cost && add_num(cost, "latency_us", f->cost.latency_us) &&
             add_num(cost, "bandwidth_gbps", f->cost.bandwidth_gbps);
    }
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

flm_status flm_probe_save(const flm_probe_result *r, const char *path, flm_error *err) {
    if (!r || !path) return flm_fail(err, FLM_ERR_ARG, "flm_probe_save: NULL result or path");
    cJSON *root = to_json(r);
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for the probe JSON", path);
    /* the checked writer (core/files.h): a unique temporary renamed onto path; a link or a device is refused */
    flm_out *w = NULL;
    flm_status st = flm_out_open(path, NULL, FLM_OUT_REPLACE, &w, err);
    FILE *fp = st ? NULL : flm_out_stream(w);
    if (!st && !fp) {
        flm_out_abort(w);
        st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    }
    if (!st) {
        size_t len = strlen(text);
        if (fwrite(text, 1, len, fp) != len || fputc('\n', fp) == EOF) {
            st = flm_fail(err, FLM_ERR_IO, "%s: cannot write: %s", flm_out_temp(w), strerror(errno));
            flm_out_abort(w);
        } else {
            st = flm_out_commit(w, err);
        }
    }
    cJSON_free(text);
    return st;
}


void flm_probe_result_free(flm_probe_result *r) {
    if (!r) return;
    free(r->path);
    free(r->cells);
    memset(r, 0, sizeof *r);
}
