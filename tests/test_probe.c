/* test_probe.c — flashlm probe-disk: measurements through flm_reader, the cost-model fit, the JSON file next to the
 * model and its defensive loader (src/probe/probe.h, src/io/io_cost.h). Timings are never compared or bounded (they vary under parallel
 * test load): only values that follow from the requests made are checked, and the fit on synthetic cells. */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "probe/probe.h"

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)

/* The file-size floor of the probe: small, so the suite stays fast. */
#define TEST_FILE_BYTES (32 * MiB)

static void check_cell_plausible(const flm_probe_cell *c, uint64_t align) {
    assert_true(c->requests > 0);
    assert_true(c->bytes > 0);
    assert_true(c->seconds > 0);
    assert_true(c->throughput_gbps > 0 && isfinite(c->throughput_gbps));
    assert_true(c->iops > 0 && isfinite(c->iops));
    assert_true(c->latency_us > 0 && isfinite(c->latency_us));
    assert_true(c->batch > 0);
    /* one extent = one device request of exactly the (aligned) request size: the planner merged nothing */
    uint64_t g = (c->request_bytes + align - 1) / align * align;
    assert_int_equal(c->bytes, c->requests * g);
}

static bool dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    assert_non_null(d);
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
    closedir(d);
    return empty;
}

/* A directory target: a 32 MiB test file is created, the full default matrix is measured in ~1.5 s, the file is
 * gone afterwards; every cell is measured with plausible values (no timing is compared). */
static void test_probe_directory(void **state) {
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tu_tmp("probe-dir", ""));
    assert_int_equal(mkdir(dir, 0755), 0);
    flm_probe_opts o;
    flm_probe_opts_default(&o);
    o.seconds = 1.5;
    o.size = TEST_FILE_BYTES;
    flm_probe_result r;
    flm_error err = {0};
    flm_status st = flm_probe_run(dir, &o, &r, &err);
    if (st != FLM_OK) fail_msg("probe failed: %s", err.msg);
    assert_true(dir_is_empty(dir)); /* the test file is deleted */
    assert_true(r.temp_file);
    assert_int_equal(r.file_bytes, TEST_FILE_BYTES);
    assert_true(r.align >= 4096 && (r.align & (r.align - 1)) == 0);
    /* 2 back ends x 5 depths x 5 sizes, plus sequential at 1, 4, 16 in flight */
    assert_int_equal(r.n_cells, 2 * (5 * 5 + 3));
    size_t n_measured = 0;
    for (size_t i = 0; i < r.n_cells; i++) {
        const flm_probe_cell *c = &r.cells[i];
        if (c->backend == FLM_IO_KIND_THREADS || r.uring_available) {
            if (!c->measured) fail_msg("cell %zu (%s, %llu B x %d) not measured", i, c->sequential ? "seq" : "random",
                                       (unsigned long long)c->request_bytes, c->in_flight);
        } else {
            assert_false(c->measured);
        }
        if (!c->measured) continue;
        n_measured++;
        check_cell_plausible(c, r.align);
    }
    assert_true(n_measured >= 5 * 5 + 3);
    static const flm_io_kind backends[] = {FLM_IO_KIND_THREADS, FLM_IO_KIND_URING};
    static const int depths[] = {1, 4, 16, 32, 64};
    for (int b = 0; b < 2; b++) {
        if (backends[b] == FLM_IO_KIND_URING && !r.uring_available) continue;
        for (int d = 0; d < 5; d++) {
            const flm_probe_cell *small = flm_probe_find(&r, backends[b], false, 4 * KiB, depths[d]);
            const flm_probe_cell *big = flm_probe_find(&r, backends[b], false, MiB, depths[d]);
            assert_non_null(small);
            assert_non_null(big);
            /* Speeds are not compared here: under `ctest -j` load any ordering of timings can flip (issue 8,
             * fault 7). Knowl 6's "larger requests give more throughput" is measured by `flashlm probe-disk` and
             * the benchmarks (bench/README.md), not asserted by a test. */
            assert_int_equal(small->request_bytes, 4 * KiB);
            assert_int_equal(big->request_bytes, MiB);
        }
    }
    /* the fit */
    assert_true(r.fit.valid);
    assert_int_equal(r.fit.backend, r.uring_available ? FLM_IO_KIND_URING : FLM_IO_KIND_THREADS);
    assert_int_equal(r.fit.small_bytes, 4 * KiB);
    assert_int_equal(r.fit.parallelism, r.uring_available ? 64 : 32);
    assert_true(r.fit.latency_us > 0 && r.fit.bandwidth_gbps > 0 && r.fit.speedup > 0);
    assert_true(r.fit.effective_latency_us >= 0 && r.fit.effective_latency_us <= r.fit.latency_us / r.fit.speedup);
    assert_true(r.fit.cost.latency_us == r.fit.effective_latency_us);
    assert_true(r.fit.cost.bandwidth_gbps == r.fit.bandwidth_gbps);

    /* saved next to a "model" and read back */
    char model[4096];
    snprintf(model, sizeof model, "%s", tu_tmp("probe-model", ".flm"));
    char *json = flm_probe_json_path(model);
    assert_non_null(json);
    st = flm_probe_save(&r, json, &err);
    if (st != FLM_OK) fail_msg("save failed: %s", err.msg);
    flm_io_cost c = {-1, -1};
    st = flm_probe_load_cost(model, &c, &err);
    if (st != FLM_OK) fail_msg("load failed: %s", err.msg);
    assert_true(c.latency_us == r.fit.cost.latency_us);
    assert_true(c.bandwidth_gbps == r.fit.cost.bandwidth_gbps);
    unlink(json);
    free(json);
    flm_probe_result_free(&r);
    rmdir(dir);
}

static char *write_random_file(uint64_t bytes) {
    char *path = strdup(tu_tmp("probe-file", ".bin"));
    uint8_t *buf = malloc(bytes);
    assert_non_null(buf);
    uint64_t s = 7;
    for (uint64_t i = 0; i < bytes / 8; i++) ((uint64_t *)buf)[i] = tu_rand_u64(&s);
    tu_write_file(path, buf, bytes);
    free(buf);
    return path;
}

/* A regular file target: read only, a subset of the matrix, one back end; then the buffered (no O_DIRECT) mode
 * reports itself. */
static void test_probe_file(void **state) {
    (void)state;
    char *path = write_random_file(TEST_FILE_BYTES);
    flm_probe_opts o;
    flm_probe_opts_default(&o);
    o.seconds = 0.3;
    o.sizes[0] = 4 * KiB;
    o.sizes[1] = MiB;
    o.n_sizes = 2;
    o.depths[0] = 1;
    o.depths[1] = 8;
    o.n_depths = 2;
    o.backends = FLM_PROBE_THREADS;
    flm_probe_result r;
    flm_error err = {0};
    flm_status st = flm_probe_run(path, &o, &r, &err);
    if (st != FLM_OK) fail_msg("probe failed: %s", err.msg);
    assert_false(r.temp_file);
    assert_false(r.uring_available);
    assert_int_equal(r.file_bytes, TEST_FILE_BYTES);
    assert_int_equal(r.n_cells, 2 * (2 + 1));
    for (size_t i = 0; i < r.n_cells; i++) {
        assert_true(r.cells[i].measured);
        assert_int_equal(r.cells[i].backend, FLM_IO_KIND_THREADS);
        check_cell_plausible(&r.cells[i], r.align);
    }
    assert_non_null(flm_probe_find(&r, FLM_IO_KIND_THREADS, true, FLM_PROBE_SEQ_BYTES, 8));
    assert_null(flm_probe_find(&r, FLM_IO_KIND_URING, false, 4 * KiB, 1));
    assert_true(r.fit.valid);
    assert_int_equal(r.fit.backend, FLM_IO_KIND_THREADS);
    assert_int_equal(r.fit.parallelism, 8); /* the largest measured below the engine's 32 threads */
    flm_probe_result_free(&r);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal((uint64_t)sb.st_size, TEST_FILE_BYTES); /* untouched */

    o.buffered = true;
    o.seconds = 0.1;
    st = flm_probe_run(path, &o, &r, &err);
    if (st != FLM_OK) fail_msg("buffered probe failed: %s", err.msg);
    assert_false(r.direct);
    for (size_t i = 0; i < r.n_cells; i++) assert_true(r.cells[i].measured);
    flm_probe_result_free(&r);
    unlink(path);
    free(path);
}

static void test_probe_errors(void **state) {
    (void)state;
    flm_probe_result r;
    flm_error err = {0};
    char *small = write_random_file(MiB);
    assert_int_equal(flm_probe_run(small, NULL, &r, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "too small"));
    assert_int_equal(flm_probe_run(tu_tmp("probe-absent", ""), NULL, &r, &err), FLM_ERR_IO);
    flm_probe_opts o;
    flm_probe_opts_default(&o);
    o.sizes[0] = 3000; /* not a power of two */
    assert_int_equal(flm_probe_run(small, &o, &r, &err), FLM_ERR_ARG);
    flm_probe_opts_default(&o);
    o.depths[0] = 0;
    assert_int_equal(flm_probe_run(small, &o, &r, &err), FLM_ERR_ARG);
    flm_probe_opts_default(&o);
    o.seconds = -1;
    assert_int_equal(flm_probe_run(small, &o, &r, &err), FLM_ERR_ARG);
    assert_int_equal(flm_probe_run(NULL, NULL, &r, &err), FLM_ERR_ARG);
    assert_int_equal(flm_probe_run("/dev/null", NULL, &r, &err), FLM_ERR_ARG); /* not a file or a directory */
    unlink(small);
    free(small);
}

/* A hand-made result: the fit's arithmetic, exactly. */
static flm_probe_cell mkcell(flm_io_kind b, bool seq, uint64_t bytes, int inflight, double iops) {
    flm_probe_cell c = {.backend = b, .sequential = seq, .request_bytes = bytes, .in_flight = inflight,
                        .batch = inflight * 4, .measured = true, .seconds = 1.0, .iops = iops};
    c.requests = (uint64_t)iops;
    c.bytes = c.requests * bytes;
    c.throughput_gbps = iops * (double)bytes * 1e-9;
    c.latency_us = inflight / iops * 1e6;
    return c;
}

static flm_probe_result synthetic_result(flm_probe_cell *cells, size_t n) {
    flm_probe_result r = {0};
    r.path = strdup("/nowhere/model.flm");
    r.file_bytes = 1u << 30;
    r.align = 4096;
    r.direct = true;
    r.uring_available = true;
    r.seconds_budget = 60;
    r.wall_seconds = 61;
    r.seed = 1;
    r.cells = malloc(n * sizeof *cells);
    memcpy(r.cells, cells, n * sizeof *cells);
    r.n_cells = n;
    flm_probe_fit_cost(&r);
    return r;
}

static void test_fit(void **state) {
    (void)state;
    flm_probe_cell cells[] = {
        mkcell(FLM_IO_KIND_URING, false, 4 * KiB, 1, 10000),     /* 100 us */
        mkcell(FLM_IO_KIND_URING, false, 4 * KiB, 64, 200000),   /* 20x */
        mkcell(FLM_IO_KIND_URING, false, MiB, 64, 2000),         /* 2.1 GB/s random: not the streaming figure */
        mkcell(FLM_IO_KIND_URING, true, 4 * MiB, 1, 500),        /* 2.097152 GB/s sequential */
        mkcell(FLM_IO_KIND_THREADS, false, 4 * KiB, 1, 1000),    /* ignored: io_uring was measured */
        mkcell(FLM_IO_KIND_THREADS, true, 4 * MiB, 1, 5000),
    };
    flm_probe_result r = synthetic_result(cells, sizeof cells / sizeof *cells);
    assert_true(r.fit.valid);
    assert_int_equal(r.fit.backend, FLM_IO_KIND_URING);
    assert_int_equal(r.fit.small_bytes, 4 * KiB);
    assert_int_equal(r.fit.parallelism, 64);
    assert_float_equal(r.fit.latency_us, 100.0, 1e-9);
    assert_float_equal(r.fit.speedup, 20.0, 1e-9);
    double bw = 500.0 * 4 * MiB * 1e-9;
    assert_float_equal(r.fit.bandwidth_gbps, bw, 1e-12);
    assert_float_equal(r.fit.effective_latency_us, 100.0 / 20.0 - 4096.0 / (bw * 1e3), 1e-9);
    assert_true(r.fit.cost.latency_us == r.fit.effective_latency_us);
    flm_probe_result_free(&r);

    /* threads only; the engine's 32 threads were not measured: the largest count below (16) is used; no sequential
     * cell: the best random throughput (4 KiB x 128 in flight) is the bandwidth */
    flm_probe_cell t[] = {
        mkcell(FLM_IO_KIND_THREADS, false, 4 * KiB, 4, 1000),
        mkcell(FLM_IO_KIND_THREADS, false, 4 * KiB, 16, 3000),
        mkcell(FLM_IO_KIND_THREADS, false, 4 * KiB, 128, 9000),
        mkcell(FLM_IO_KIND_THREADS, false, 64 * KiB, 16, 100),
    };
    r = synthetic_result(t, 4);
    assert_true(r.fit.valid);
    assert_int_equal(r.fit.backend, FLM_IO_KIND_THREADS);
    assert_int_equal(r.fit.parallelism, 16);
    assert_float_equal(r.fit.latency_us, 4000.0, 1e-9); /* smallest in-flight count measured: 4 / 1000 iops */
    assert_float_equal(r.fit.speedup, 3.0, 1e-9);
    assert_float_equal(r.fit.bandwidth_gbps, 9000 * 4096e-9, 1e-12);
    assert_float_equal(r.fit.effective_latency_us, 4000.0 / 3.0 - 4096.0 / (9000 * 4096e-9 * 1e3), 1e-9);
    flm_probe_result_free(&r);

    /* no speed-up from parallelism and a slow stream: the transfer time exceeds the request time, the cost clamps
     * at 0 (gap merging off) */
    flm_probe_cell z[] = {
        mkcell(FLM_IO_KIND_URING, false, 4 * KiB, 1, 1e6),
        mkcell(FLM_IO_KIND_URING, false, 4 * KiB, 64, 1e6),
        mkcell(FLM_IO_KIND_URING, true, 4 * MiB, 1, 1),
    };
    r = synthetic_result(z, 3);
    assert_true(r.fit.valid);
    assert_true(r.fit.effective_latency_us == 0.0 && r.fit.cost.latency_us == 0.0);
    flm_probe_result_free(&r);

    /* nothing measured: no fit, and the saved file has no "cost" */
    flm_probe_cell none = mkcell(FLM_IO_KIND_URING, false, 4 * KiB, 1, 1000);
    none.measured = false;
    r = synthetic_result(&none, 1);
    assert_false(r.fit.valid);
    const char *json = tu_tmp("probe-nofit", ".json");
    flm_error err = {0};
    assert_int_equal(flm_probe_save(&r, json, &err), FLM_OK);
    flm_io_cost c;
    assert_int_equal(flm_probe_load_cost_file(json, &c, &err), FLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "cost"));
    unlink(json);
    flm_probe_result_free(&r);
}

static void test_json_roundtrip(void **state) {
    (void)state;
    flm_probe_cell cells[] = {
        mkcell(FLM_IO_KIND_URING, false, 4 * KiB, 1, 12345.678),
        mkcell(FLM_IO_KIND_URING, false, 4 * KiB, 64, 98765.4321),
        mkcell(FLM_IO_KIND_URING, true, 4 * MiB, 1, 333.3333),
    };
    flm_probe_result r = synthetic_result(cells, 3);
    assert_true(r.fit.valid);
    char model[4096];
    snprintf(model, sizeof model, "%s", tu_tmp("probe-rt", ".flm"));
    char *json = flm_probe_json_path(model);
    assert_string_equal(json + strlen(model), ".probe.json");
    flm_error err = {0};
    flm_io_cost c = {0};
    assert_int_equal(flm_probe_load_cost(model, &c, &err), FLM_ERR_IO); /* absent: the caller keeps defaults */
    assert_int_equal(flm_probe_save(&r, json, &err), FLM_OK);
    assert_int_equal(flm_probe_load_cost(model, &c, &err), FLM_OK);
    assert_true(c.latency_us == r.fit.cost.latency_us); /* exact: cJSON prints doubles round-trip */
    assert_true(c.bandwidth_gbps == r.fit.cost.bandwidth_gbps);
    /* overwritten atomically, no temporary left behind */
    r.fit.cost.latency_us = 1.5;
    assert_int_equal(flm_probe_save(&r, json, &err), FLM_OK);
    assert_int_equal(flm_probe_load_cost_file(json, &c, &err), FLM_OK);
    assert_true(c.latency_us == 1.5);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", json, (long)getpid());
    assert_int_equal(access(tmp, F_OK), -1);
    /* a directory that does not exist: FLM_ERR_IO */
    assert_int_equal(flm_probe_save(&r, "/nonexistent-dir/x.probe.json", &err), FLM_ERR_IO);
    unlink(json);
    free(json);
    flm_probe_result_free(&r);
}

static flm_status load_text(const char *path, const char *text, size_t len, flm_error *err) {
    tu_write_file(path, text, len);
    flm_io_cost c = {-7, -7};
    flm_status st = flm_probe_load_cost_file(path, &c, err);
    if (st != FLM_OK) assert_true(c.latency_us == -7 && c.bandwidth_gbps == -7); /* untouched on error */
    return st;
}

static void test_json_malformed(void **state) {
    (void)state;
    const char *path = tu_tmp("probe-bad", ".json");
    flm_error err = {0};
#define HEAD "{\"format\": \"flashlm-probe\", \"version\": 1, "
    static const char *bad[] = {
        "",
        "{",
        "not json at all",
        "[]",
        "null",
        "42",
        "\"flashlm-probe\"",
        "{\"format\": \"something-else\", \"version\": 1, \"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": 2}}",
        "{\"format\": 7, \"version\": 1, \"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": 2}}",
        "{\"version\": 1, \"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": 2}}",
        "{\"format\": \"flashlm-probe\", \"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": 2}}",
        HEAD "\"version\": 2}",
        "{\"format\": \"flashlm-probe\", \"version\": 2, \"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": 2}}",
        "{\"format\": \"flashlm-probe\", \"version\": \"1\", \"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": 2}}",
        HEAD "\"fit\": {}}",
        HEAD "\"cost\": null}",
        HEAD "\"cost\": [5, 2]}",
        HEAD "\"cost\": {}}",
        HEAD "\"cost\": {\"latency_us\": 5}}",
        HEAD "\"cost\": {\"bandwidth_gbps\": 2}}",
        HEAD "\"cost\": {\"latency_us\": \"5\", \"bandwidth_gbps\": 2}}",
        HEAD "\"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": true}}",
        HEAD "\"cost\": {\"latency_us\": -1, \"bandwidth_gbps\": 2}}",
        HEAD "\"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": 0}}",
        HEAD "\"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": -2}}",
        HEAD "\"cost\": {\"latency_us\": 1e999, \"bandwidth_gbps\": 2}}",
        HEAD "\"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": 1e999}}",
        HEAD "\"cost\": {\"latency_us\": 2e6, \"bandwidth_gbps\": 2}}",
        HEAD "\"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": 2e4}}",
        HEAD "\"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": 2}",    /* unterminated */
        HEAD "\"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": 2}}}",  /* trailing garbage */
        HEAD "\"cost\": {\"latency_us\": 5, \"bandwidth_gbps\": 2,}}",  /* trailing comma */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        flm_status st = load_text(path, bad[i], strlen(bad[i]), &err);
        if (st != FLM_ERR_FORMAT) fail_msg("case %zu (%s): status %d, expected FLM_ERR_FORMAT", i, bad[i], st);
        assert_non_null(strstr(err.msg, path)); /* the message names the file */
    }
    /* the good one, with extra members and whitespace, loads */
    const char *good =
        "\n " HEAD "\"extra\": [1, {\"x\": null}], \"cost\": {\"latency_us\": 0, \"bandwidth_gbps\": 3.5}}\n";
    assert_int_equal(load_text(path, good, strlen(good), &err), FLM_OK);

    /* deep nesting, binary junk, an embedded NUL */
    size_t deep_n = 200000;
    char *deep = malloc(deep_n);
    memset(deep, '[', deep_n);
    assert_int_equal(load_text(path, deep, deep_n, &err), FLM_ERR_FORMAT);
    memset(deep, '{', deep_n);
    assert_int_equal(load_text(path, deep, deep_n, &err), FLM_ERR_FORMAT);
    uint64_t s = 99;
    for (size_t i = 0; i < deep_n; i++) deep[i] = (char)tu_rand_u64(&s);
    assert_int_equal(load_text(path, deep, deep_n, &err), FLM_ERR_FORMAT);
    free(deep);
    const char nul[] = HEAD "\"cost\": {\"latency_us\": 5, \0\"bandwidth_gbps\": 2}}";
    assert_int_equal(load_text(path, nul, sizeof nul - 1, &err), FLM_ERR_FORMAT);

    /* every truncation of a real file: FLM_ERR_FORMAT (only the trailing newline may go) */
    flm_probe_cell cells[] = {
        mkcell(FLM_IO_KIND_URING, false, 4 * KiB, 1, 10000),
        mkcell(FLM_IO_KIND_URING, false, 4 * KiB, 64, 200000),
        mkcell(FLM_IO_KIND_URING, true, 4 * MiB, 1, 500),
    };
    flm_probe_result r = synthetic_result(cells, 3);
    const char *full = tu_tmp("probe-full", ".json");
    assert_int_equal(flm_probe_save(&r, full, &err), FLM_OK);
    flm_probe_result_free(&r);
    size_t len;
    uint8_t *text = tu_read_file(full, &len);
    assert_true(len > 100 && text[len - 1] == '\n');
    for (size_t cut = 0; cut < len; cut++) {
        flm_status st = load_text(path, (const char *)text, cut, &err);
        if (cut == len - 1) assert_int_equal(st, FLM_OK);
        else if (st != FLM_ERR_FORMAT) fail_msg("truncated at %zu of %zu: status %d", cut, len, st);
    }
    /* single-byte corruptions never crash (any status is fine) */
    for (size_t i = 0; i < len; i += 3) {
        uint8_t saved = text[i];
        text[i] = (uint8_t)(saved ^ 0x5A);
        flm_status st = load_text(path, (const char *)text, len, &err);
        assert_true(st == FLM_OK || st == FLM_ERR_FORMAT);
        text[i] = saved;
    }
    free(text);
    unlink(full);
    unlink(path);
    flm_io_cost c;
    assert_int_equal(flm_probe_load_cost_file(path, &c, &err), FLM_ERR_IO); /* absent */
    assert_int_equal(flm_probe_load_cost(NULL, &c, &err), FLM_ERR_ARG);
#undef HEAD
}

/* The CLI, once `probe-disk` is wired into tools/flashlm.c (skipped before). */
static void test_cli(void **state) {
    (void)state;
    char *out = NULL;
    int rc = tu_run_cli("probe-disk --help 2>&1", &out);
    bool wired = rc == 0 && strstr(out, "usage: flashlm probe-disk");
    free(out);
    if (!wired) {
        print_message("probe-disk is not wired into tools/flashlm.c yet: CLI test skipped\n");
        skip();
    }
    char dir[4096], json[4200], args[9000];
    snprintf(dir, sizeof dir, "%s", tu_tmp("probe-cli", ""));
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(json, sizeof json, "%s/out.json", dir);
    snprintf(args, sizeof args, "probe-disk '%s' --seconds 0.5 --size 16M --out '%s'", dir, json);
    rc = tu_run_cli(args, &out);
    if (rc != 0) fail_msg("flashlm %s: exit %d\n%s", args, rc, out);
    assert_non_null(strstr(out, "| threads | random | 4 KiB |"));
    assert_non_null(strstr(out, "| threads | sequential | 4 MiB |"));
    assert_non_null(strstr(out, "Fitted cost model"));
    free(out);
    flm_io_cost c;
    flm_error err = {0};
    assert_int_equal(flm_probe_load_cost_file(json, &c, &err), FLM_OK);
    unlink(json);
    assert_true(dir_is_empty(dir));
    rmdir(dir);
    assert_int_equal(tu_run_cli("probe-disk --seconds nope 2>/dev/null", NULL), 2);
    assert_int_equal(tu_run_cli("probe-disk --size 50% 2>/dev/null", NULL), 2);
    assert_int_equal(tu_run_cli("probe-disk /nonexistent/x 2>/dev/null", NULL), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_directory), cmocka_unit_test(test_probe_file),
        cmocka_unit_test(test_probe_errors),    cmocka_unit_test(test_fit),
        cmocka_unit_test(test_json_roundtrip),  cmocka_unit_test(test_json_malformed),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
