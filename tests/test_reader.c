/* test_reader.c — L_flash: the read planner and both reader back ends (src/io/reader.h). */
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/reader.h"
#include "io/async_read.h"
#include "core/util.h"

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define FILE_BYTES (8 * MiB + 1234) /* not a multiple of the alignment: the last request runs into EOF */

/* ---------------------------------------------------------------------------------------------------------------
 * Planner
 * ------------------------------------------------------------------------------------------------------------- */

static uint8_t file_byte(uint64_t off) { return (uint8_t)((off * 2654435761u) >> 13); }

/* Execute a plan against the virtual file file_byte(): copy each request's range into a scratch buffer, then
 * scatter (or check the zero-copy destination). Checks the plan's invariants on the way. */
static void run_plan_virtually(const flm_read_plan *p, uint64_t align, uint64_t max_request) {
    uint64_t prev = 0, bytes = 0;
    for (size_t i = 0; i < p->n_ops; i++) {
        const flm_read_op *op = &p->ops[i];
        assert_true(op->offset % align == 0);
        assert_true(op->length % align == 0);
        assert_true(op->length > 0 && op->length <= max_request);
        assert_true(op->need > 0 && op->need <= op->length);
        assert_true(op->offset >= prev); /* sorted */
        prev = op->offset;
        bytes += op->length;
        if (op->dst) {
            assert_int_equal(op->n_pieces, 0);
            assert_int_equal((uintptr_t)op->dst % align, 0);
            for (uint64_t k = 0; k < op->length; k++) ((uint8_t *)op->dst)[k] = file_byte(op->offset + k);
            continue;
        }
        assert_true(op->n_pieces > 0);
        uint8_t *buf = malloc(op->length);
        for (uint64_t k = 0; k < op->length; k++) buf[k] = file_byte(op->offset + k);
        uint64_t need_end = 0;
        for (size_t j = 0; j < op->n_pieces; j++) {
            const flm_read_piece *pc = &p->pieces[op->first_piece + j];
            assert_true(pc->length > 0 && pc->src + pc->length <= op->length);
            memcpy(pc->dst, buf + pc->src, pc->length);
            if (pc->src + pc->length > need_end) need_end = pc->src + pc->length;
        }
        assert_int_equal(need_end, op->need);
        free(buf);
    }
    assert_int_equal(bytes, p->bytes);
}

static void check_extents(const flm_extent *e, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (uint64_t k = 0; k < e[i].length; k++)
            if (((uint8_t *)e[i].dst)[k] != file_byte(e[i].offset + k))
                fail_msg("extent %zu (offset %llu length %llu): byte %llu wrong", i, (unsigned long long)e[i].offset,
                         (unsigned long long)e[i].length, (unsigned long long)k);
}

/* Plan, check invariants, execute virtually, verify every destination. */
static void plan_ok(flm_read_plan *p, const flm_extent *e, size_t n, double lat, double bw, uint64_t align,
                    uint64_t max_request) {
    flm_io_cost cost = {lat, bw};
    flm_error err = {0};
    for (size_t i = 0; i < n; i++)
        if (e[i].length) memset(e[i].dst, 0xEE, e[i].length);
    flm_status st = flm_read_plan_build(e, n, &cost, align, max_request, p, &err);
    if (st != FLM_OK) fail_msg("plan failed: %s", err.msg);
    run_plan_virtually(p, align, max_request);
    check_extents(e, n);
}

static uint8_t *arena_new(size_t bytes) {
    uint8_t *a = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    assert_non_null(a);
    return a;
}

static void test_plan_adjacent_merge(void **state) {
    (void)state;
    uint8_t *a = arena_new(64 * KiB);
    flm_read_plan p = {0};
    /* Touching extents merge even with gap merging turned off (latency 0). */
    flm_extent e[] = {{0, 1000, a + 1}, {1000, 2000, a + 2000}, {3000, 6000, a + 5000}};
    plan_ok(&p, e, 3, 0, 2, 4096, MiB);
    assert_int_equal(p.n_ops, 1);
    assert_int_equal(p.ops[0].offset, 0);
    assert_int_equal(p.ops[0].length, 12288);
    assert_int_equal(p.ops[0].need, 9000);
    assert_int_equal(p.n_pieces, 3);
    assert_null(p.ops[0].dst);
    /* Extents in different aligned blocks that touch once aligned merge as well. */
    flm_extent f[] = {{100, 10, a + 1}, {4096 + 50, 10, a + 100}};
    plan_ok(&p, f, 2, 0, 2, 4096, MiB);
    assert_int_equal(p.n_ops, 1);
    assert_int_equal(p.ops[0].length, 8192);
    flm_read_plan_free(&p);
    free(a);
}

static void test_plan_gap_cost(void **state) {
    (void)state;
    uint8_t *a = arena_new(64 * KiB);
    flm_read_plan p = {0};
    /* latency 10 us at 1 GB/s: gaps below 10,000 bytes merge. Aligned spans: [0,4096), [12288,16384) (gap 8192:
     * merges), [40960,45056) (gap 24576 from 16384: stays apart). */
    flm_extent e[] = {{0, 100, a + 1}, {12288 + 100, 100, a + 200}, {40960 + 5, 100, a + 400}};
    plan_ok(&p, e, 3, 10, 1, 4096, MiB);
    assert_int_equal(p.n_ops, 2);
    assert_int_equal(p.ops[0].offset, 0);
    assert_int_equal(p.ops[0].length, 16384);
    assert_int_equal(p.ops[0].n_pieces, 2);
    assert_int_equal(p.ops[1].offset, 40960);
    assert_int_equal(p.ops[1].length, 4096);
    /* The same with a higher latency (30 us: limit 30,000 bytes): one request. */
    plan_ok(&p, e, 3, 30, 1, 4096, MiB);
    assert_int_equal(p.n_ops, 1);
    assert_int_equal(p.ops[0].length, 45056);
    /* Unaligned planning (align 1): the gap is measured between the exact byte ranges. 100-byte gap, 1 us at
     * 1 GB/s = 1000 bytes: merge; 5000-byte gap: no merge. */
    flm_extent f[] = {{0, 100, a + 1}, {200, 100, a + 200}, {5300, 100, a + 400}};
    plan_ok(&p, f, 3, 1, 1, 1, MiB);
    assert_int_equal(p.n_ops, 2);
    assert_int_equal(p.ops[0].length, 300);
    assert_int_equal(p.ops[1].offset, 5300);
    assert_int_equal(p.ops[1].length, 100);
    assert_true(p.ops[1].dst == a + 400); /* a lone extent with align 1 is zero-copy */
    flm_read_plan_free(&p);
    free(a);
}

static void test_plan_max_request(void **state) {
    (void)state;
    uint8_t *a = arena_new(8 * MiB);
    flm_read_plan p = {0};
    /* One unaligned 3 MiB extent, max_request 1 MiB: span [0, 3 MiB + 4096) -> 4 balanced requests. */
    flm_extent e[] = {{100, 3 * MiB, a + 3}};
    plan_ok(&p, e, 1, 80, 2, 4096, MiB);
    assert_int_equal(p.n_ops, 4);
    uint64_t end = 0;
    for (size_t i = 0; i < p.n_ops; i++) {
        assert_int_equal(p.ops[i].offset, end);
        assert_true(p.ops[i].length <= MiB && p.ops[i].length >= MiB / 2);
        end += p.ops[i].length;
    }
    assert_int_equal(end, 3 * MiB + 4096);
    /* Aligned offset, length and dst: zero copy, split in max_request pieces straight into dst. */
    flm_extent z[] = {{MiB, 3 * MiB, a + 4096}};
    plan_ok(&p, z, 1, 80, 2, 4096, MiB);
    assert_int_equal(p.n_ops, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_true(p.ops[i].dst == a + 4096 + i * MiB);
        assert_int_equal(p.ops[i].length, MiB);
    }
    assert_int_equal(p.n_pieces, 0);
    /* A request that fits is never split: exactly max_request. */
    flm_extent x[] = {{0, MiB, a + 1}};
    plan_ok(&p, x, 1, 80, 2, 4096, MiB);
    assert_int_equal(p.n_ops, 1);
    /* Gap merges respect max_request: with a huge latency every gap is cheap, but [0,600K) + [700K,1100K) would
     * make a 1.1 MB request. */
    flm_extent g[] = {{0, 600 * KiB, a + 1}, {700 * KiB, 400 * KiB, a + 2 * MiB}};
    plan_ok(&p, g, 2, 1e6, 2, 4096, MiB);
    assert_int_equal(p.n_ops, 2);
    /* ... while touching extents merge past max_request and are split evenly (2 x 700K -> 2 requests). */
    flm_extent t[] = {{0, 700 * KiB, a + 1}, {700 * KiB, 700 * KiB, a + 2 * MiB}};
    plan_ok(&p, t, 2, 0, 2, 4096, MiB);
    assert_int_equal(p.n_ops, 2);
    assert_int_equal(p.ops[0].length, 700 * KiB);
    flm_read_plan_free(&p);
    free(a);
}

static void test_plan_overlap(void **state) {
    (void)state;
    uint8_t *a = arena_new(64 * KiB);
    flm_read_plan p = {0};
    flm_extent e[] = {{1000, 8000, a + 1}, {2000, 1000, a + 9000}, {1000, 8000, a + 11000}, {8999, 1, a + 20000}};
    plan_ok(&p, e, 4, 0, 2, 4096, MiB);
    assert_int_equal(p.n_ops, 1);
    assert_int_equal(p.ops[0].offset, 0);
    assert_int_equal(p.ops[0].length, 12288);
    assert_int_equal(p.ops[0].need, 9000);
    assert_int_equal(p.n_pieces, 4);
    /* A big aligned (lone, zero-copy) extent with a small one inside: both are read, separately. */
    uint8_t *b = arena_new(4 * MiB);
    flm_extent f[] = {{0, 2 * MiB, b}, {5000, 100, a + 3}};
    plan_ok(&p, f, 2, 80, 2, 4096, MiB);
    assert_int_equal(p.n_ops, 3);
    flm_read_plan_free(&p);
    free(b);
    free(a);
}

static void test_plan_alignment(void **state) {
    (void)state;
    uint8_t *a = arena_new(64 * KiB);
    flm_read_plan p = {0};
    flm_extent e[] = {{5000, 100, a + 7}};
    plan_ok(&p, e, 1, 80, 2, 4096, MiB);
    assert_int_equal(p.n_ops, 1);
    assert_int_equal(p.ops[0].offset, 4096);
    assert_int_equal(p.ops[0].length, 4096);
    assert_int_equal(p.ops[0].need, 1004);
    assert_int_equal(p.pieces[0].src, 904);
    assert_null(p.ops[0].dst);
    /* Aligned and alone but small: still zero copy. Unaligned dst: bounce. */
    flm_extent z[] = {{8192, 8192, a + 4096}};
    plan_ok(&p, z, 1, 80, 2, 4096, MiB);
    assert_int_equal(p.n_ops, 1);
    assert_true(p.ops[0].dst == a + 4096);
    z[0].dst = a + 4097;
    plan_ok(&p, z, 1, 80, 2, 4096, MiB);
    assert_null(p.ops[0].dst);
    /* 512-byte alignment works the same way. */
    plan_ok(&p, e, 1, 80, 2, 512, 64 * KiB);
    assert_int_equal(p.ops[0].offset, 4608);
    assert_int_equal(p.ops[0].length, 512);
    flm_read_plan_free(&p);
    free(a);
}

static void test_plan_unsorted_and_args(void **state) {
    (void)state;
    uint8_t *a = arena_new(64 * KiB);
    flm_read_plan p = {0};
    flm_extent e[] = {{900000, 10, a + 1}, {0, 10, a + 100}, {500000, 10, a + 200}, {0, 0, NULL}};
    plan_ok(&p, e, 4, 0, 2, 4096, MiB);
    assert_int_equal(p.n_ops, 3);
    assert_int_equal(p.ops[0].offset, 0);
    assert_int_equal(p.ops[1].offset, 499712);
    assert_int_equal(p.ops[2].offset, 897024);
    assert_int_equal(p.bytes_used, 30);
    /* Empty list, bad arguments. */
    flm_error err = {0};
    assert_int_equal(flm_read_plan_build(e, 0, NULL, 4096, MiB, &p, &err), FLM_OK);
    assert_int_equal(p.n_ops, 0);
    assert_int_equal(flm_read_plan_build(e, 1, NULL, 3000, MiB, &p, &err), FLM_ERR_ARG);
    assert_int_equal(flm_read_plan_build(e, 1, NULL, 4096, 100, &p, &err), FLM_ERR_ARG);
    flm_extent bad[] = {{0, 10, NULL}};
    assert_int_equal(flm_read_plan_build(bad, 1, NULL, 4096, MiB, &p, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "no destination"));
    flm_extent huge[] = {{UINT64_MAX - 5, 10, a}};
    assert_int_equal(flm_read_plan_build(huge, 1, NULL, 4096, MiB, &p, &err), FLM_ERR_ARG);
    flm_read_plan_free(&p);
    free(a);
}

/* Random extent lists against the virtual file, many parameter combinations. */
static void test_plan_random(void **state) {
    (void)state;
    uint64_t rng = 12345;
    size_t arena_bytes = 24 * MiB;
    uint8_t *a = arena_new(arena_bytes);
    flm_read_plan p = {0};
    flm_extent e[300];
    for (int round = 0; round < 60; round++) {
        size_t n = 1 + tu_rand_u64(&rng) % 300, used = 0;
        uint64_t align = (uint64_t)1 << (tu_rand_u64(&rng) % 14);
        uint64_t maxr = align * (1 + tu_rand_u64(&rng) % 64) * (tu_rand_u64(&rng) % 2 ? 1 : 64);
        double lat = (double)(tu_rand_u64(&rng) % 200);
        for (size_t i = 0; i < n; i++) {
            uint64_t len = tu_rand_u64(&rng) % 3 == 0 ? tu_rand_u64(&rng) % (64 * KiB) : tu_rand_u64(&rng) % 3000;
            uint64_t off = tu_rand_u64(&rng) % (4 * MiB);
            if (tu_rand_u64(&rng) % 4 == 0) { /* aligned */
                off &= ~(align - 1);
                len = (len + align - 1) & ~(align - 1);
                used = (used + align - 1) & ~(align - 1);
            }
            if (used + len > arena_bytes) len = 0;
            e[i] = (flm_extent){off, len, a + used};
            used += len + (tu_rand_u64(&rng) % 2);
        }
        plan_ok(&p, e, n, lat, 2, align, maxr);
    }
    flm_read_plan_free(&p);
    free(a);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Readers
 * ------------------------------------------------------------------------------------------------------------- */

static char g_path[4096];
static uint8_t *g_data; /* the file's bytes */

static int setup_file(void **state) {
    (void)state;
    snprintf(g_path, sizeof g_path, "%s", tu_tmp("reader", ".bin"));
    g_data = malloc(FILE_BYTES);
    uint64_t rng = 777;
    for (size_t i = 0; i < FILE_BYTES; i += 8) {
        uint64_t x = tu_rand_u64(&rng);
        memcpy(g_data + i, &x, FILE_BYTES - i < 8 ? FILE_BYTES - i : 8);
    }
    tu_write_file(g_path, g_data, FILE_BYTES);
    int fd = open(g_path, O_RDONLY);
    if (fd >= 0) {
        fsync(fd); /* clean pages, so that POSIX_FADV_DONTNEED can drop them */
        close(fd);
    }
    return 0;
}

static int teardown_file(void **state) {
    (void)state;
    unlink(g_path);
    free(g_data);
    return 0;
}

/* Open a reader or skip the test when the back end is not available here. */
static flm_reader *open_or_skip(flm_io_backend be, bool direct, int threads, size_t bounce, uint64_t max_request) {
    flm_reader_opts o;
    flm_reader_opts_default(&o);
    o.backend = be;
    o.direct = direct;
    if (threads) o.n_threads = threads;
    if (bounce) o.bounce_bytes = bounce;
    if (max_request) o.max_request = max_request;
    flm_reader *r = NULL;
    flm_error err = {0};
    flm_status st = flm_reader_open(g_path, &o, &r, &err);
    if (st == FLM_ERR_UNSUPPORTED && be == FLM_IO_URING) {
        print_message("skipping: %s\n", err.msg);
        return NULL;
    }
    if (st != FLM_OK) fail_msg("open: %s", err.msg);
    assert_string_equal(flm_reader_backend_name(r), be == FLM_IO_URING ? "io_uring" : "threads");
    if (!direct) assert_false(flm_reader_is_direct(r));
    assert_true(flm_reader_memory(r) >= o.bounce_bytes / 2);
    return r;
}

/* A random extent list: many small unaligned extents, some big aligned (zero-copy) ones, some aligned into
 * unaligned destinations, duplicates, and extents touching the end of the file. Destinations don't overlap. */
static size_t random_extents(uint64_t *rng, flm_extent *e, size_t cap, uint8_t *arena, size_t arena_bytes) {
    size_t n = 0, used = 0;
#define PUT(OFF, LEN, ALIGN_DST)                                                                                      \
    do {                                                                                                              \
        uint64_t o_ = (OFF), l_ = (LEN);                                                                              \
        used = (ALIGN_DST) ? (used + 4095) / 4096 * 4096 : used + 1 + tu_rand_u64(rng) % 7;                           \
        if (n < cap && used + l_ <= arena_bytes) {                                                                    \
            e[n++] = (flm_extent){o_, l_, arena + used};                                                              \
            used += l_;                                                                                               \
        }                                                                                                             \
    } while (0)
    size_t n_small = 200 + tu_rand_u64(rng) % 400;
    for (size_t i = 0; i < n_small; i++) {
        uint64_t len = 1 + tu_rand_u64(rng) % 6000;
        PUT(tu_rand_u64(rng) % (FILE_BYTES - len + 1), len, false);
    }
    for (int i = 0; i < 3; i++) { /* big aligned, aligned dst: zero copy (some > 1 MiB: split) */
        uint64_t len = (1 + tu_rand_u64(rng) % 600) * 4096;
        PUT(tu_rand_u64(rng) % ((FILE_BYTES - len) / 4096) * 4096, len, true);
    }
    for (int i = 0; i < 3; i++) { /* aligned file range, unaligned dst */
        uint64_t len = (1 + tu_rand_u64(rng) % 64) * 4096;
        PUT(tu_rand_u64(rng) % ((FILE_BYTES - len) / 4096) * 4096, len, false);
    }
    PUT(FILE_BYTES - 100, 100, false);      /* the file's tail: the aligned request runs past EOF */
    PUT(FILE_BYTES - 1234, 1234, true);     /* aligned start, ends at EOF */
    PUT(0, 4096, true);                     /* small aligned lone extent */
    if (n > 2) PUT(e[n / 2].offset, e[n / 2].length, false); /* a duplicate */
    PUT(e[0].offset + e[0].length / 2, e[0].length, false);  /* an overlap */
    PUT(12345, 0, false);                                    /* empty */
#undef PUT
    /* shuffle */
    for (size_t i = n; i > 1; i--) {
        size_t j = tu_rand_u64(rng) % i;
        flm_extent t = e[i - 1];
        e[i - 1] = e[j];
        e[j] = t;
    }
    return n;
}

/* Read `rounds` random lists, compare with the file, check the stats against an independent plan of each list
 * (max_request as the reader normalised it). */
static void read_and_verify(flm_reader *r, uint64_t max_request, uint64_t seed, int rounds) {
    size_t arena_bytes = 16 * MiB, cap = 1024;
    uint8_t *arena = arena_new(arena_bytes);
    flm_extent *e = malloc(cap * sizeof *e);
    uint64_t rng = seed;
    flm_io_stats stats = {0};
    uint64_t want_bytes = 0, want_extents = 0, want_requests = 0;
    flm_read_plan plan = {0};
    for (int round = 0; round < rounds; round++) {
        size_t n = random_extents(&rng, e, cap, arena, arena_bytes);
        memset(arena, 0xA5, arena_bytes);
        flm_error err = {0};
        /* What the reader should plan: the default cost model, its alignment (1 when buffered). */
        flm_reader_opts d;
        flm_reader_opts_default(&d);
        uint64_t align = flm_reader_is_direct(r) ? flm_reader_align(r) : 1;
        assert_int_equal(flm_read_plan_build(e, n, &d.cost, align, max_request, &plan, &err), FLM_OK);
        want_requests += plan.n_ops;
        flm_status st = flm_reader_read(r, e, n, &stats, &err);
        if (st != FLM_OK) fail_msg("read (round %d, %s): %s", round, flm_reader_backend_name(r), err.msg);
        for (size_t i = 0; i < n; i++)
            if (e[i].length && memcmp(e[i].dst, g_data + e[i].offset, e[i].length) != 0)
                fail_msg("round %d: extent %zu (offset %llu, length %llu) differs from the file", round, i,
                         (unsigned long long)e[i].offset, (unsigned long long)e[i].length);
        for (size_t i = 0; i < n; i++) want_bytes += e[i].length;
        want_extents += n;
    }
    assert_int_equal(stats.bytes_requested, want_bytes);
    assert_int_equal(stats.n_extents, want_extents);
    uint64_t hsum = 0;
    for (int b = 0; b < FLM_IO_HIST_BUCKETS; b++) hsum += stats.hist[b];
    assert_int_equal(hsum, stats.n_requests);
    assert_int_equal(stats.n_requests, want_requests);
    assert_true(stats.bytes_read >= stats.bytes_requested / 2); /* overlaps are read once */
    assert_true(stats.ms > 0);
    flm_read_plan_free(&plan);
    free(e);
    free(arena);
}

static void test_read_threads_direct(void **state) {
    (void)state;
    flm_reader *r = open_or_skip(FLM_IO_THREADS, true, 0, 0, 0);
    read_and_verify(r, MiB, 1, 6);
    flm_reader_close(r);
}

static void test_read_uring_direct(void **state) {
    (void)state;
    flm_reader *r = open_or_skip(FLM_IO_URING, true, 0, 0, 0);
    if (!r) skip();
    read_and_verify(r, MiB, 2, 6);
    flm_reader_close(r);
}

static void test_read_buffered(void **state) {
    (void)state;
    flm_reader *r = open_or_skip(FLM_IO_THREADS, false, 4, 0, 0);
    read_and_verify(r, MiB, 3, 3);
    flm_reader_close(r);
    r = open_or_skip(FLM_IO_URING, false, 0, 0, 0);
    if (r) {
        read_and_verify(r, MiB, 4, 3);
        flm_reader_close(r);
    }
}

/* Small bounce memory: many batches; small max_request: many splits. */
static void test_read_small_bounce(void **state) {
    (void)state;
    flm_io_backend be[] = {FLM_IO_THREADS, FLM_IO_URING};
    for (int i = 0; i < 2; i++) {
        flm_reader *r = open_or_skip(be[i], true, 3, 64 * KiB, 16 * KiB);
        if (!r) continue;
        assert_true(flm_reader_memory(r) < 2 * MiB);
        read_and_verify(r, 16 * KiB, 10 + (uint64_t)i, 2);
        flm_reader_close(r);
    }
}

/* Stats against a hand-made list: the numbers follow from the plan. */
static void test_read_stats(void **state) {
    (void)state;
    flm_io_backend be[] = {FLM_IO_THREADS, FLM_IO_URING};
    for (int i = 0; i < 2; i++) {
        flm_reader *r = open_or_skip(be[i], true, 0, 0, 0);
        if (!r) continue;
        uint8_t *a = arena_new(4 * MiB);
        flm_extent e[] = {{0, 4096, a}, {1 * MiB + 3, 10, a + 8192}, {2 * MiB, 2 * MiB, a + 2 * MiB}};
        flm_io_stats s = {0};
        flm_error err = {0};
        assert_int_equal(flm_reader_read(r, e, 3, &s, &err), FLM_OK);
        assert_int_equal(s.n_extents, 3);
        assert_int_equal(s.bytes_requested, 4096 + 10 + 2 * MiB);
        assert_int_equal(s.bytes_read, 4096 + 4096 + 2 * MiB);
        assert_int_equal(s.n_requests, 4);
        assert_int_equal(s.hist[3], 2);  /* 4 KiB */
        assert_int_equal(s.hist[11], 2); /* 1 MiB */
        assert_memory_equal(a + 2 * MiB, g_data + 2 * MiB, 2 * MiB);
        assert_memory_equal(a + 8192, g_data + MiB + 3, 10);
        /* an empty call adds nothing but time */
        assert_int_equal(flm_reader_read(r, NULL, 0, &s, &err), FLM_OK);
        assert_int_equal(s.n_requests, 4);
        free(a);
        flm_reader_close(r);
    }
    assert_int_equal(flm_io_hist_bucket(1), 0);
    assert_int_equal(flm_io_hist_bucket(512), 0);
    assert_int_equal(flm_io_hist_bucket(1023), 0);
    assert_int_equal(flm_io_hist_bucket(1024), 1);
    assert_int_equal(flm_io_hist_bucket(MiB), 11);
    assert_int_equal(flm_io_hist_bucket(UINT64_MAX), FLM_IO_HIST_BUCKETS - 1);
}

/* The busy time (flm_reader_busy_ns): 0 until a read, grows by each read by at most the read's own wall time (the
 * calls are timed inside the caller's span), not by an empty call; a read-ahead thread's read (async_read) counts the
 * same way; the counts hold in both back ends. No timing thresholds: only the order of the clocks. */
static void test_busy_time(void **state) {
    (void)state;
    flm_io_backend be[] = {FLM_IO_THREADS, FLM_IO_URING};
    for (int i = 0; i < 2; i++) {
        flm_reader *r = open_or_skip(be[i], true, 0, 0, 0);
        if (!r) continue;
        assert_int_equal(flm_reader_busy_ns(r), 0);
        uint8_t *a = arena_new(4 * MiB);
        flm_extent e[] = {{17, 3 * MiB, a}};
        flm_error err = {0};
        uint64_t before = flm_reader_busy_ns(r);
        double t0 = flm_now_ms();
        assert_int_equal(flm_reader_read(r, e, 1, NULL, &err), FLM_OK);
        double wall = flm_now_ms() - t0;
        uint64_t after = flm_reader_busy_ns(r);
        assert_true(after > before);
        assert_true((double)(after - before) / 1e6 <= wall + 1e-3);
        assert_int_equal(flm_reader_read(r, NULL, 0, NULL, &err), FLM_OK); /* nothing read: not busy */
        assert_int_equal(flm_reader_busy_ns(r), after);
        flm_async_read *ar = flm_async_read_start(r); /* a read on another thread */
        assert_non_null(ar);
        assert_false(flm_async_read_busy(ar)); /* nothing submitted */
        t0 = flm_now_ms();
        flm_async_read_submit(ar, e, 1, 7);
        uint64_t tag = 0;
        flm_status st = FLM_ERR_IO;
        flm_io_stats io = {0};
        assert_true(flm_async_read_wait(ar, &tag, &st, &err, &io));
        wall = flm_now_ms() - t0;
        assert_false(flm_async_read_busy(ar)); /* taken: none pending */
        assert_int_equal(tag, 7);
        assert_int_equal(st, FLM_OK);
        assert_true(io.n_requests > 0);
        uint64_t after2 = flm_reader_busy_ns(r);
        assert_true(after2 > after);
        assert_true((double)(after2 - after) / 1e6 <= wall + 1e-3);
        flm_async_read_stop(ar);
        free(a);
        flm_reader_close(r);
    }
    assert_int_equal(flm_reader_busy_ns(NULL), 0);
}

/* Fault injection: the 3rd request fails; the error is FLM_ERR_IO with a message; the reader keeps working. */
static void fault_case(flm_io_backend be, bool direct, int kind, const char *want) {
    flm_reader *r = open_or_skip(be, direct, 4, 0, 0);
    if (!r) return;
    uint8_t *a = arena_new(4 * MiB);
    flm_extent e[8]; /* 8 separate requests of ~300 KiB, unaligned */
    for (int i = 0; i < 8; i++) e[i] = (flm_extent){(uint64_t)i * MiB + 17, 300 * KiB, a + i * 400 * KiB + 1};
    flm_reader_set_fault(r, kind, 2);
    flm_error err = {0};
    flm_status st = flm_reader_read(r, e, 8, NULL, &err);
    if (want) {
        assert_int_equal(st, FLM_ERR_IO);
        assert_int_equal(err.code, FLM_ERR_IO);
        if (!strstr(err.msg, want) || !strstr(err.msg, g_path) || !strstr(err.msg, "offset"))
            fail_msg("%s/%d: unexpected message: %s", flm_reader_backend_name(r), kind, err.msg);
    } else {
        if (st != FLM_OK) fail_msg("%s/%d: %s", flm_reader_backend_name(r), kind, err.msg);
        for (int i = 0; i < 8; i++) assert_memory_equal(e[i].dst, g_data + e[i].offset, e[i].length);
    }
    /* one shot: the next read succeeds */
    st = flm_reader_read(r, e, 8, NULL, &err);
    if (st != FLM_OK) fail_msg("%s after fault %d: %s", flm_reader_backend_name(r), kind, err.msg);
    for (int i = 0; i < 8; i++) assert_memory_equal(e[i].dst, g_data + e[i].offset, e[i].length);
    if (kind == FLM_FAULT_EINVAL) assert_false(flm_reader_is_direct(r)); /* fell back */
    free(a);
    flm_reader_close(r);
}

static void test_faults(void **state) {
    (void)state;
    flm_io_backend be[] = {FLM_IO_THREADS, FLM_IO_URING};
    for (int i = 0; i < 2; i++) {
        fault_case(be[i], true, FLM_FAULT_SHORT, "short read");
        fault_case(be[i], true, FLM_FAULT_EIO, "Input/output error");
        fault_case(be[i], false, FLM_FAULT_SHORT, "short read");
        fault_case(be[i], false, FLM_FAULT_EIO, "Input/output error");
        fault_case(be[i], false, FLM_FAULT_EINVAL, "Invalid argument");
        fault_case(be[i], true, FLM_FAULT_EINVAL, NULL); /* direct -> buffered fallback, the read succeeds */
        for (int direct = 0; direct < 2; direct++) {     /* retried, the read succeeds */
            fault_case(be[i], direct, FLM_FAULT_PARTIAL, NULL);
            fault_case(be[i], direct, FLM_FAULT_EINTR, NULL);
        }
    }
}

/* Reading past the end of the file, and a file truncated after open: short read. */
static void test_past_eof(void **state) {
    (void)state;
    flm_io_backend be[] = {FLM_IO_THREADS, FLM_IO_URING};
    for (int i = 0; i < 2; i++) {
        for (int direct = 0; direct < 2; direct++) {
            flm_reader *r = open_or_skip(be[i], direct, 0, 0, 0);
            if (!r) continue;
            assert_int_equal(flm_reader_file_size(r), FILE_BYTES);
            uint8_t *a = arena_new(2 * MiB);
            flm_error err = {0};
            flm_extent e1[] = {{FILE_BYTES - 10, 20, a + 1}};
            assert_int_equal(flm_reader_read(r, e1, 1, NULL, &err), FLM_ERR_IO);
            assert_non_null(strstr(err.msg, "short read"));
            flm_extent e2[] = {{FILE_BYTES + 8192, 4096, a}};
            assert_int_equal(flm_reader_read(r, e2, 1, NULL, &err), FLM_ERR_IO);
            assert_non_null(strstr(err.msg, "short read"));
            flm_extent e3[] = {{0, 100, a + 3}, {8 * MiB, MiB, a + MiB}}; /* a big zero-copy one past EOF */
            assert_int_equal(flm_reader_read(r, e3, 2, NULL, &err), FLM_ERR_IO);
            assert_non_null(strstr(err.msg, "short read"));
            free(a);
            flm_reader_close(r);
        }
    }
    /* Truncated after open. */
    const char *path = tu_tmp("reader-trunc", ".bin");
    tu_write_file(path, g_data, 4 * MiB);
    for (int i = 0; i < 2; i++) {
        tu_write_file(path, g_data, 4 * MiB);
        flm_reader_opts o;
        flm_reader_opts_default(&o);
        o.backend = be[i];
        flm_reader *r = NULL;
        flm_error err = {0};
        flm_status st = flm_reader_open(path, &o, &r, &err);
        if (st == FLM_ERR_UNSUPPORTED) continue;
        assert_int_equal(st, FLM_OK);
        assert_int_equal(truncate(path, MiB + 5), 0);
        uint8_t *a = arena_new(2 * MiB);
        flm_extent e[] = {{MiB, 3 * 4096, a + 1}, {2 * MiB, MiB, a + MiB}};
        assert_int_equal(flm_reader_read(r, e, 2, NULL, &err), FLM_ERR_IO);
        if (!strstr(err.msg, "short read") || !strstr(err.msg, path)) fail_msg("message: %s", err.msg);
        free(a);
        flm_reader_close(r);
    }
    unlink(path);
}

/* Buffered reads drop the pages they read (POSIX_FADV_DONTNEED). Checked with mincore on a mapping. */
static void test_buffered_drops_cache(void **state) {
    (void)state;
#if defined(__linux__)
    int fd = open(g_path, O_RDONLY);
    assert_true(fd >= 0);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    size_t pages = (FILE_BYTES + 4095) / 4096;
    unsigned char *vec = malloc(pages);
    void *map = mmap(NULL, FILE_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(map != MAP_FAILED);
    assert_int_equal(mincore(map, FILE_BYTES, vec), 0);
    size_t resident = 0;
    for (size_t i = 0; i < pages; i++) resident += vec[i] & 1;
    if (resident > 0) { /* this file system keeps its pages (tmpfs): nothing to check */
        munmap(map, FILE_BYTES);
        close(fd);
        free(vec);
        skip();
    }
    flm_io_backend be[] = {FLM_IO_THREADS, FLM_IO_URING};
    for (int i = 0; i < 2; i++) {
        flm_reader *r = open_or_skip(be[i], false, 0, 0, 0);
        if (!r) continue;
        uint8_t *a = arena_new(4 * MiB);
        flm_extent e[] = {{100, 5000, a + 1}, {MiB + 7, 300 * KiB, a + MiB}, {3 * MiB, 2 * MiB, a + 2 * MiB}};
        flm_error err = {0};
        assert_int_equal(flm_reader_read(r, e, 3, NULL, &err), FLM_OK);
        assert_int_equal(mincore(map, FILE_BYTES, vec), 0);
        resident = 0;
        for (size_t p = 0; p < pages; p++) resident += vec[p] & 1;
        if (resident) fail_msg("%s: %zu pages stayed in the page cache after buffered reads",
                               flm_reader_backend_name(r), resident);
        free(a);
        flm_reader_close(r);
    }
    munmap(map, FILE_BYTES);
    close(fd);
    free(vec);
#else
    skip();
#endif
}

static void test_open_errors(void **state) {
    (void)state;
    flm_reader *r = (flm_reader *)1;
    flm_error err = {0};
    assert_int_equal(flm_reader_open("/nonexistent/flashlm/weights.bin", NULL, &r, &err), FLM_ERR_IO);
    assert_null(r);
    assert_non_null(strstr(err.msg, "/nonexistent/flashlm/weights.bin"));
    assert_int_equal(flm_reader_open(NULL, NULL, &r, &err), FLM_ERR_ARG);
    flm_reader_opts o;
    flm_reader_opts_default(&o);
    assert_int_equal(o.n_threads, 32);
    assert_true(o.direct);
    assert_int_equal(o.max_request, MiB);
    assert_int_equal(o.bounce_bytes, 8 * MiB);
    o.backend = (flm_io_backend)42;
    assert_int_equal(flm_reader_open(g_path, &o, &r, &err), FLM_ERR_ARG);
    /* AUTO opens something; NULL opts are the defaults. */
    assert_int_equal(flm_reader_open(g_path, NULL, &r, &err), FLM_OK);
    assert_true(flm_reader_align(r) >= 4096);
    flm_extent bad[] = {{0, 10, NULL}};
    assert_int_equal(flm_reader_read(r, bad, 1, NULL, &err), FLM_ERR_ARG);
    flm_reader_close(r);
    flm_reader_close(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_adjacent_merge),
        cmocka_unit_test(test_plan_gap_cost),
        cmocka_unit_test(test_plan_max_request),
        cmocka_unit_test(test_plan_overlap),
        cmocka_unit_test(test_plan_alignment),
        cmocka_unit_test(test_plan_unsorted_and_args),
        cmocka_unit_test(test_plan_random),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_read_threads_direct),
        cmocka_unit_test(test_read_uring_direct),
        cmocka_unit_test(test_read_buffered),
        cmocka_unit_test(test_read_small_bounce),
        cmocka_unit_test(test_read_stats),
        cmocka_unit_test(test_busy_time),
        cmocka_unit_test(test_faults),
        cmocka_unit_test(test_past_eof),
        cmocka_unit_test(test_buffered_drops_cache),
    };
    return cmocka_run_group_tests(tests, setup_file, teardown_file);
}
