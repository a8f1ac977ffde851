/* cmd_probe.c — `flashlm probe-disk`: measure the disk that holds a model (the paper's Figure 2 analogue, Knowl 6),
 * fit the read planner's cost model and save both as JSON next to the model (flashlm_tools.h, src/probe/probe.c,
 * docs/IO.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "flashlm.h"
#include "flashlm_tools.h"


static const char *PROBE_HELP =
    "usage: flashlm probe-disk [PATH] [options]\n"
    "\n"
    "Measure the storage that holds PATH through the engine's own read path (flm_reader, O_DIRECT, io_uring and\n"
    "thread-pool back ends): random-read throughput and mean latency per request for request sizes 4 KiB .. 1 MiB\n"
    "and 1, 4, 16, 32, 64 reads in flight, and sequential throughput with 4 MiB reads (\"LLM in a flash\", Knowl 6:\n"
    "throughput grows with the chunk size and with the reads in flight). Then fit the read planner's cost model\n"
    "(per-request latency, streaming bandwidth, effective per-request cost at the engine's parallelism) and save\n"
    "everything as JSON. `flashlm run` picks up MODEL.probe.json next to a model and plans its reads with it.\n"
    "\n"
    "  PATH                 a model file: random reads over it, read only (at least 16 MiB); or a directory: a\n"
    "                       temporary test file is written there, measured and deleted (default: .)\n"
    "      --out FILE       where to save the JSON (default: PATH.probe.json for a file, DIR/flashlm.probe.json for\n"
    "                       a directory; copy that one to MODEL.probe.json to use it for a model on that disk)\n"
    "      --seconds S      time budget of the measurements, split over the cells (default 60)\n"
    "      --size BYTES     directory: size of the test file, K/M/G suffixes (default 1G; at most half the free\n"
    "                       space)\n"
    "  -h, --help           this help\n"
    "\n"
    "Progress goes to stderr, the tables (markdown) to stdout. If the file system refuses O_DIRECT, reads are\n"
    "buffered and the page cache is dropped after each one; the output then says \"buffered\".\n";

static void fmt_size(char *buf, size_t n, uint64_t b) {
    if (b >= (1u << 20) && b % (1u << 20) == 0) snprintf(buf, n, "%llu MiB", (unsigned long long)(b >> 20));
    else if (b >= 1024 && b % 1024 == 0) snprintf(buf, n, "%llu KiB", (unsigned long long)(b >> 10));
    else snprintf(buf, n, "%llu B", (unsigned long long)b);
}

/* Distinct values in first-seen order. */
static size_t add_unique_int(int *v, size_t n, int x) {
    for (size_t i = 0; i < n; i++)
        if (v[i] == x) return n;
    v[n] = x;
    return n + 1;
}

/* One markdown table: rows = back end x (random sizes, sequential), columns = reads in flight; the value is the
 * throughput (GB/s) or the mean latency (us); "-" where not measured. */
static void print_table(const flm_probe_result *r, bool latency) {
    int depths[2 * FLM_PROBE_MAX_LIST];
    uint64_t sizes[2 * FLM_PROBE_MAX_LIST];
    size_t nd = 0, ns = 0;
    for (size_t i = 0; i < r->n_cells; i++) {
        nd = add_unique_int(depths, nd, r->cells[i].in_flight);
        if (r->cells[i].sequential) continue;
        size_t k = 0;
        while (k < ns && sizes[k] != r->cells[i].request_bytes) k++;
        if (k == ns) sizes[ns++] = r->cells[i].request_bytes;
    }
    printf("| back end | reads | request |");
    for (size_t d = 0; d < nd; d++) printf(" %d |", depths[d]);
    printf("\n|---|---|---:|");
    for (size_t d = 0; d < nd; d++) printf("---:|");
    printf("\n");
    static const flm_io_kind backends[] = {FLM_IO_KIND_URING, FLM_IO_KIND_THREADS};
    for (int b = 0; b < 2; b++) {
        bool any = false;
        for (size_t i = 0; i < r->n_cells; i++) any |= r->cells[i].measured && r->cells[i].backend == backends[b];
        if (!any) continue;
        for (size_t s = 0; s <= ns; s++) {
            bool seq = s == ns;
            uint64_t bytes = seq ? FLM_PROBE_SEQ_BYTES : sizes[s];
            char sz[32];
            fmt_size(sz, sizeof sz, bytes);
            printf("| %s | %s | %s |", backends[b] == FLM_IO_KIND_URING ? "io_uring" : "threads",
                   seq ? "sequential" : "random", sz);
            for (size_t d = 0; d < nd; d++) {
                const flm_probe_cell *c = flm_probe_find(r, backends[b], seq, bytes, depths[d]);
                if (!c) printf(" - |");
                else if (latency) printf(" %.1f |", c->latency_us);
                else printf(" %.3f |", c->throughput_gbps);
            }
            printf("\n");
        }
    }
}

static void print_report(const flm_probe_result *r, const char *out_path) {
    char sz[32];
    printf("# flashlm probe-disk: %s\n\n", r->path);
    if (r->temp_file)
        printf("- target: temporary test file of %.2f GiB in this directory (deleted)\n",
               (double)r->file_bytes / (1u << 30));
    else
        printf("- target: the file itself, %.2f GiB, read only\n", (double)r->file_bytes / (1u << 30));
    fmt_size(sz, sizeof sz, r->align);
    if (r->direct) printf("- reads: O_DIRECT (page cache bypassed), alignment %s\n", sz);
    else printf("- reads: **buffered** (O_DIRECT refused here; the page cache is dropped after each read)\n");
    if (r->uring_available) printf("- io_uring: available\n");
    else printf("- io_uring: not measured%s%s\n", r->uring_note[0] ? ": " : "", r->uring_note);
    printf("- time: %.1f s of measurements (budget %.0f s)\n", r->wall_seconds, r->seconds_budget);
    printf("\n## Read throughput, GB/s (columns: reads in flight)\n\n");
    print_table(r, false);
    printf("\n## Mean latency per request, us (Little's law: in flight x time / requests)\n\n");
    print_table(r, true);
    const flm_probe_fit *f = &r->fit;
    printf("\n## Fitted cost model (%s back end)\n\n", f->backend == FLM_IO_KIND_URING ? "io_uring" : "threads");
    if (!f->valid) {
        printf("Not enough measurements for a fit; the runtime keeps its defaults.\n");
    } else {
        fmt_size(sz, sizeof sz, f->small_bytes);
        printf("| quantity | value |\n|---|---:|\n");
        printf("| device latency (random %s, 1 in flight) | %.1f us |\n", sz, f->latency_us);
        printf("| streaming bandwidth (best sequential 4 MiB) | %.3f GB/s |\n", f->bandwidth_gbps);
        printf("| speed-up of %s reads at %d in flight | %.1fx |\n", sz, f->parallelism, f->speedup);
        printf("| effective per-request cost at %d in flight | %.2f us |\n", f->parallelism,
               f->effective_latency_us);
        printf("| planner reads through gaps below | %.0f bytes |\n",
               f->effective_latency_us * f->bandwidth_gbps * 1e3);
        printf("\nThe planner's cost (flm_io_cost) is {latency_us = %.2f, bandwidth_gbps = %.3f}.\n",
               f->cost.latency_us, f->cost.bandwidth_gbps);
    }
    if (out_path) printf("\nSaved to %s.\n", out_path);
}

int cmd_probe(int argc, char **argv) {
    const char *path = NULL, *out = NULL;
    flm_probe_opts o;
    flm_probe_opts_default(&o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(PROBE_HELP, stdout);
            return 0;
        } else if (!strcmp(a, "--out")) {
            if (!val) return cli_die("option %s needs a value (see flashlm probe-disk --help)", a);
            out = val;
            i++;
        } else if (!strcmp(a, "--seconds")) {
            if (!val) return cli_die("option %s needs a value (see flashlm probe-disk --help)", a);
            char *end;
            errno = 0;
            double s = strtod(val, &end);
            if (errno || end == val || *end || !(s > 0 && s <= 86400))
                return cli_die("bad --seconds value '%s' (more than 0, at most 86400)", val);
            o.seconds = s;
            i++;
        } else if (!strcmp(a, "--size")) {
            if (!val) return cli_die("option %s needs a value (see flashlm probe-disk --help)", a);
            uint64_t bytes = 0;
            double pct = 0;
            if (!flm_parse_mem(val, &bytes, &pct) || pct > 0 || bytes < FLM_PROBE_MIN_FILE)
                return cli_die("bad --size value '%s' (bytes with an optional K/M/G suffix, at least 16M)", val);
            o.size = bytes;
            i++;
        } else if (a[0] == '-' && a[1]) {
            return cli_die("unknown option '%s' (see flashlm probe-disk --help)", a);
        } else if (!path) {
            path = a;
        } else {
            return cli_die("more than one PATH ('%s'; see flashlm probe-disk --help)", a);
        }
    }
    if (!path) path = ".";
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "flashlm: %s: %s\n", path, strerror(errno));
        return 1;
    }
    if (out) { /* find out now that the result can be saved, not after a minute of measuring */
        flm_out *w = NULL; /* the checked writer's rules, and a temporary created and removed */
        flm_error err;
        if (flm_out_open(out, path, FLM_OUT_REPLACE, &w, &err)) {
            fprintf(stderr, "flashlm: cannot write the result: %s\n", err.msg);
            return 1;
        }
        flm_out_abort(w);
    }
    char *out_path = NULL;
    if (out) {
        out_path = strdup(out);
    } else if (S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path) + 32;
        if ((out_path = malloc(n))) snprintf(out_path, n, "%s/flashlm%s", path, FLM_PROBE_SUFFIX);
    } else {
        size_t n = strlen(path) + sizeof FLM_PROBE_SUFFIX;
        if ((out_path = malloc(n))) snprintf(out_path, n, "%s%s", path, FLM_PROBE_SUFFIX);
    }
    if (!out_path) {
        fprintf(stderr, "flashlm: out of memory\n");
        return 1;
    }
    o.progress = cli_progress;
    flm_probe_result r;
    flm_error err;
    if (flm_probe_run(path, &o, &r, &err) != FLM_OK) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        free(out_path);
        return 1;
    }
    int rc = 0;
    if (flm_probe_save(&r, out_path, &err) != FLM_OK) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        rc = 1;
    }
    print_report(&r, rc == 0 ? out_path : NULL);
    flm_probe_result_free(&r);
    free(out_path);
    return rc;
}
