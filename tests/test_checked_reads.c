/* test_checked_reads.c — checked reads (issue 33, failure 8): every FFN record and token-embedding row read from a
 * .flm is hashed and compared with its record sum (docs/FORMAT.md, "Record sums") before it is used.
 *   - one byte of one FFN record corrupted in the file: every mode (ram, naive, hybrid, sparse, hot, auto) fails with
 *     FLM_ERR_CHECKSUM naming the layer and record, at open or at the token that reads it, and keeps refusing; the
 *     CLI exits non-zero with that message; `flashlm verify` names the same record;
 *   - a corrupted token-embedding row (a model whose embedding stays on flash): the error names the row;
 *   - a transient corruption (one request's byte flipped once: the reader's fault hook in both back ends, and an
 *     LD_PRELOAD shim under the CLI) is read again and the logits / text equal a clean run's; without checks the same
 *     flip changes them (the negative control: the check is what catches it);
 *   - a corruption that appears mid-generation: the token fails, the context refuses it until the file is right
 *     again, then evaluates it correctly;
 *   - a version-1 file (no record sums) is refused in the streaming modes with the way out named, and runs with
 *     --no-verify-reads and in ram mode; a file whose records were reordered (hot order) keeps matching sums. */
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flashlm.h"
#include "calibrate/calibrate.h"
#include "compute/ffn_bundle.h"
#include "compute/kernels.h"
#include "core/unit_hash.h"
#include "convert/convert.h"
#include "format/flm.h"
#include "write/flm_write.h"
#include "io/reader.h"
#include "runtime/runtime.h"
#include "synth/synth.h"
#include "testutil.h"
#include <xxhash.h>

#define MODEL "models/stories260K/stories260K.gguf"
#define BAD_LAYER 3u
#define BAD_REC 57u
#define N_TOK 6

static char g_flm[4096], g_bad[4096], g_v1[4096], g_tmp[4096], g_synth[4096], g_synth_flm[4096];
static char g_expect[128]; /* "FFN region of layer 3, record 57" */

/* File offset of byte k of record rec of layer l's FFN region. */
static uint64_t record_byte(const char *path, uint32_t l, uint32_t rec, uint64_t k) {
    flm_file *f = NULL;
    flm_error err;
    if (flm_file_open_ex(path, FLM_FILE_HEADER_ONLY, &f, &err)) fail_msg("%s", err.msg);
    uint64_t at = f->ffn[l]->offset + (uint64_t)rec * f->ffn[l]->record_bytes + k;
    flm_file_close(f);
    return at;
}

/* flashlm verify's check of path. */
static flm_status verify_path(const char *path, flm_error *err) {
    flm_file *f = NULL;
    flm_status st = flm_file_open_ex(path, FLM_FILE_HEADER_ONLY, &f, err);
    if (st) return st;
    st = flm_file_verify(f, NULL, NULL, err);
    flm_file_close(f);
    return st;
}

static void flip_copy(const char *src, const char *dst, uint64_t at) {
    size_t len;
    uint8_t *d = tu_read_file(src, &len);
    assert_true(at < len);
    d[at] ^= 0x5a;
    tu_write_file(dst, d, len);
    free(d);
}

/* Flip the byte at `at` of path in place (the file stays the same inode: an open reader sees it). */
static void flip_in_place(const char *path, uint64_t at) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)at), 1);
    b ^= 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)at), 1);
    fsync(fd);
    close(fd);
}

/* A copy of path as a version-1 file: the record-sums region left out of the header (its bytes stay, unreferenced). */
static void write_v1_copy(const char *path, const char *out) {
    flm_file *f = NULL;
    flm_error err;
    if (flm_file_open_ex(path, FLM_FILE_HEADER_ONLY, &f, &err)) fail_msg("%s", err.msg);
    flm_region *regions = calloc(f->n_regions, sizeof *regions);
    uint32_t n = 0;
    for (uint32_t i = 0; i < f->n_regions; i++)
        if (f->regions[i].kind != FLM_REGION_SUMS) regions[n++] = f->regions[i];
    assert_int_equal(n + 1, f->n_regions);
    size_t len;
    uint8_t *data = tu_read_file(path, &len);
    flm_build_header(data, f->header_bytes, regions, n, f->file_size);
    assert_int_equal(flm_get_u32(data + 8), 1); /* no SUMS region: version 1 */
    tu_write_file(out, data, len);
    free(data);
    free(regions);
    flm_file_close(f);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_flm, sizeof g_flm, "%s", tu_tmp("checked", ".flm"));
    snprintf(g_bad, sizeof g_bad, "%s", tu_tmp("checked-bad", ".flm"));
    snprintf(g_v1, sizeof g_v1, "%s", tu_tmp("checked-v1", ".flm"));
    snprintf(g_tmp, sizeof g_tmp, "%s", tu_tmp("checked-tmp", ".flm"));
    snprintf(g_synth, sizeof g_synth, "%s", tu_tmp("checked-synth", ".gguf"));
    snprintf(g_synth_flm, sizeof g_synth_flm, "%s", tu_tmp("checked-synth", ".flm"));
    snprintf(g_expect, sizeof g_expect, "FFN region of layer %u, record %u", BAD_LAYER, BAD_REC);
    flm_error err;
    if (flm_convert(tu_data(MODEL), g_flm, NULL, NULL, &err)) {
        fprintf(stderr, "convert: %s\n", err.msg);
        return -1;
    }
    size_t len;
    char *text = (char *)tu_read_file(tu_data("text/tinystories_sample.txt"), &len);
    if (len > 20000) text[20000] = 0;
    flm_calib_opts o;
    flm_calib_opts_default(&o);
    o.text = text;
    o.level = 0.02f;
    o.chunk = 64;
    o.max_tokens = 512;
    o.n_threads = 1;
    flm_status st = flm_calibrate(g_flm, &o, NULL, &err); /* predictors: sparse, and auto under a budget */
    free(text);
    if (st) { fprintf(stderr, "calibrate: %s\n", err.msg); return -1; }
    flm_synth_params sp;
    flm_synth_params_default(&sp); /* an untied classifier: the embedding stays on flash in the streaming modes */
    sp.d_model = 64;
    sp.d_ffn = 256;
    sp.n_layers = 2;
    sp.n_heads = 4;
    sp.n_kv_heads = 2;
    sp.n_vocab = 2000;
    sp.n_ctx = 256;
    sp.type = FLM_TYPE_Q8_0;
    sp.rank = 16;
    sp.n_threads = 1;
    if (flm_synth_write(g_synth, &sp, FLM_OUT_REPLACE, NULL, NULL, &err) || flm_convert(g_synth, g_synth_flm, NULL, NULL, &err)) {
        fprintf(stderr, "synth: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(g_flm);
    remove(g_bad);
    remove(g_v1);
    remove(g_tmp);
    remove(g_synth);
    remove(g_synth_flm);
    return 0;
}

static flm_params params_of(flm_mode mode, double pct, flm_io_kind io, bool no_verify) {
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = 64;
    p.mode = mode;
    p.mem_percent = pct;
    p.io = io;
    p.no_verify_reads = no_verify;
    p.window = mode == FLM_MODE_SPARSE ? 2 : 0; /* a short window: every token reads some neurons */
    return p;
}

/* Open path in mode (under the smallest of a few budgets that holds it, pct 0: none); NULL with *st, err set when
 * open fails otherwise. */
static flm_ctx *open_mode(const char *path, flm_mode mode, double pct, flm_io_kind io, bool no_verify,
                          flm_status *st, flm_error *err) {
    const double tries[] = {pct, pct * 1.5, pct * 2.5, pct * 4.0};
    for (int i = 0; i < (pct > 0 ? 4 : 1); i++) {
        flm_params p = params_of(mode, tries[i], io, no_verify);
        flm_ctx *ctx = NULL;
        *st = flm_open(path, &p, &ctx, err);
        if (*st == FLM_OK) return ctx;
        if (*st != FLM_ERR_BUDGET) return NULL;
    }
    return NULL;
}

static void prompt_ids(int32_t *ids) {
    for (int t = 0; t < N_TOK; t++) ids[t] = (int32_t)(1 + 37 * t) % 512;
}

/* The modes, and a budget (percent of the model) under which each streams something. */
static const struct {
    flm_mode mode;
    double pct;
} MODES[] = {{FLM_MODE_RAM, 0}, {FLM_MODE_NAIVE, 0}, {FLM_MODE_HYBRID, 60}, {FLM_MODE_SPARSE, 60},
             {FLM_MODE_HOT, 60}, {FLM_MODE_AUTO, 60}};

/* A byte of one record corrupted in the file: every mode refuses it, naming the layer and record, and keeps refusing. */
static void test_corrupt_record_every_mode(void **state) {
    (void)state;
    flip_copy(g_flm, g_bad, record_byte(g_flm, BAD_LAYER, BAD_REC, 5));
    flm_error err;
    assert_int_equal(verify_path(g_bad, &err), FLM_ERR_CHECKSUM); /* verify names the same record */
    assert_non_null(strstr(err.msg, g_expect));
    int32_t ids[N_TOK];
    prompt_ids(ids);
    for (size_t m = 0; m < sizeof MODES / sizeof *MODES; m++) {
        flm_status st;
        flm_ctx *ctx = open_mode(g_bad, MODES[m].mode, MODES[m].pct, FLM_IO_KIND_AUTO, false, &st, &err);
        if (!ctx) { /* the record was read at open (ram, resident layers, hot prefixes) */
            if (st != FLM_ERR_CHECKSUM || !strstr(err.msg, g_expect))
                fail_msg("mode %s: open: %d %s", flm_mode_name(MODES[m].mode), st, err.msg);
            continue;
        }
        const float *lg;
        int t = 0;
        for (; t < N_TOK && (st = flm_eval(ctx, ids[t], t, &lg, &err)) == FLM_OK; t++) {}
        if (st != FLM_ERR_CHECKSUM || !strstr(err.msg, g_expect) || !strstr(err.msg, "checksum mismatch"))
            fail_msg("mode %s: token %d: %d %s", flm_mode_name(MODES[m].mode), t, st, err.msg);
        flm_stats s;
        flm_get_stats(ctx, &s);
        assert_true(s.reads_verified);
        assert_int_equal(flm_eval(ctx, ids[t], t, &lg, &err), FLM_ERR_CHECKSUM); /* still refused */
        assert_non_null(strstr(err.msg, g_expect));
        flm_close(ctx);
    }
    /* sparse's --no-bundle ablation reads each record in three parts: checked once they are all in */
    flm_params p = params_of(FLM_MODE_SPARSE, 0, FLM_IO_KIND_AUTO, false);
    p.no_bundle = true;
    flm_ctx *ctx = NULL;
    if (flm_open(g_bad, &p, &ctx, &err)) fail_msg("open: %s", err.msg);
    const float *lg;
    assert_int_equal(flm_eval(ctx, ids[0], 0, &lg, &err), FLM_ERR_CHECKSUM); /* position 0 reads every record */
    assert_non_null(strstr(err.msg, g_expect));
    flm_close(ctx);
}

/* The CLI: a clear error naming the record and a non-zero exit in every mode (no budget: ram and hot read it at open,
 * the others at the first token); with --no-verify-reads it runs and --stats says the reads were not verified. */
static void test_corrupt_record_cli(void **state) {
    (void)state;
    flip_copy(g_flm, g_bad, record_byte(g_flm, BAD_LAYER, BAD_REC, 5));
    const char *modes[] = {"ram", "naive", "hybrid", "sparse", "hot", "auto"};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        char args[8192], *out = NULL;
        snprintf(args, sizeof args, "run -m '%s' --mode %s -c 64 -n 4 -p 'Once upon' --temp 0 2>&1", g_bad, modes[m]);
        int rc = tu_run_cli(args, &out);
        if (rc == 0 || !strstr(out, g_expect) || !strstr(out, "checksum mismatch"))
            fail_msg("mode %s: rc %d: %s", modes[m], rc, out);
        free(out);
    }
    char args[8192], *out = NULL;
    snprintf(args, sizeof args, "run -m '%s' --mode naive -c 64 -n 4 -p 'Once upon' --temp 0 --no-verify-reads --stats "
             "2>&1", g_bad);
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, "reads NOT verified (--no-verify-reads)"));
    free(out);
    snprintf(args, sizeof args, "verify '%s' 2>&1", g_bad);
    assert_int_not_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, g_expect));
    free(out);
}

/* A corrupted token-embedding row, on flash in the streaming modes: the error names the row. */
static void test_corrupt_embedding_row(void **state) {
    (void)state;
    flm_file *f = NULL;
    flm_error err;
    assert_int_equal(flm_file_open(g_synth_flm, &f, &err), FLM_OK);
    const flm_gguf_tensor *t = flm_gguf_find_tensor(f->meta, "token_embd.weight");
    assert_non_null(t);
    const int32_t tok = 517;
    uint64_t row = t->nbytes / t->ne[1];
    uint64_t at = f->resident->offset + f->meta->data_offset + t->offset + (uint64_t)tok * row + 7;
    flm_file_close(f);
    flip_copy(g_synth_flm, g_tmp, at);
    assert_int_equal(verify_path(g_tmp, &err), FLM_ERR_CHECKSUM);
    assert_non_null(strstr(err.msg, "token embedding, row 517"));
    flm_status st;
    flm_ctx *ctx = open_mode(g_tmp, FLM_MODE_NAIVE, 0, FLM_IO_KIND_AUTO, false, &st, &err);
    if (!ctx) fail_msg("open: %s", err.msg);
    flm_plan_info plan;
    flm_get_plan(ctx, &plan);
    assert_int_equal(plan.embd, FLM_PLAN_EMBD_FLASH);
    const float *lg;
    assert_int_equal(flm_eval(ctx, 3, 0, &lg, &err), FLM_OK); /* another row: fine */
    assert_int_equal(flm_eval(ctx, tok, 1, &lg, &err), FLM_ERR_CHECKSUM);
    assert_non_null(strstr(err.msg, "token embedding, row 517"));
    flm_close(ctx);
}

/* One request's byte flipped once (the reader's fault hook): read again, the logits equal a clean run's, one retry
 * counted; the same flip without checks changes the logits (or makes them non-finite). */
static void transient_case(flm_mode mode, double pct, flm_io_kind io) {
    int32_t ids[N_TOK];
    prompt_ids(ids);
    flm_status st;
    flm_error err;
    flm_ctx *clean = open_mode(g_flm, mode, pct, io, false, &st, &err);
    if (!clean) fail_msg("open: %s", err.msg);
    flm_plan_info plan;
    flm_get_plan(clean, &plan);
    const uint32_t V = tu_vocab(clean);
    float *want = malloc((size_t)N_TOK * V * sizeof(float));
    const float *lg;
    for (int t = 0; t < N_TOK; t++) {
        if (flm_eval(clean, ids[t], t, &lg, &err)) fail_msg("clean eval %d: %s", t, err.msg);
        memcpy(want + (size_t)t * V, lg, V * sizeof(float));
    }
    for (int checked = 1; checked >= 0; checked--) {
        flm_params p = params_of(mode, 0, io, !checked);
        p.mem_bytes = plan.budget; /* the same plan as the clean run's */
        flm_ctx *ctx = NULL;
        if (flm_open(g_flm, &p, &ctx, &err)) fail_msg("open: %s", err.msg);
        bool differs = false;
        for (int t = 0; t < N_TOK; t++) {
            const int at = 3;
            if (t == at) {
                flm_reset_stats(ctx);
                flm_reader_set_fault(ctx->flash->reader, FLM_FAULT_CORRUPT, 0); /* the token's first request */
            }
            st = flm_eval(ctx, ids[t], t, &lg, &err);
            if (checked && st) fail_msg("%s %s: eval %d: %s", flm_mode_name(mode), io == FLM_IO_KIND_URING ? "uring" :
                                        "threads", t, err.msg);
            if (st) { differs = true; break; } /* unchecked: non-finite data */
            for (uint32_t i = 0; i < V; i++)
                if (lg[i] != want[(size_t)t * V + i]) differs = true;
            if (t == at && checked) {
                flm_stats s;
                flm_get_stats(ctx, &s);
                assert_true(s.reads_verified);
                assert_int_equal(s.n_verify_retries, 1);
                assert_true(s.bytes_verified > 0);
            }
            if (checked) assert_false(differs);
        }
        if (!checked) assert_true(differs); /* the negative control: the flip reaches the computation */
        flm_close(ctx);
    }
    free(want);
    flm_close(clean);
}

static void test_transient_retried(void **state) {
    (void)state;
    const flm_io_kind ios[] = {FLM_IO_KIND_THREADS, FLM_IO_KIND_URING};
    for (int b = 0; b < 2; b++) {
        if (ios[b] == FLM_IO_KIND_URING && !flm_reader_uring_works()) continue;
        transient_case(FLM_MODE_NAIVE, 0, ios[b]);
        transient_case(FLM_MODE_HYBRID, 60, ios[b]);
        transient_case(FLM_MODE_SPARSE, 60, ios[b]);
        transient_case(FLM_MODE_HOT, 60, ios[b]);
    }
}

/* The CLI under a shim that flips one byte of one pread once: the text equals a clean run's, one unit read again. */
static void test_transient_cli(void **state) {
    (void)state;
    const char *base = strrchr(g_flm, '/') ? strrchr(g_flm, '/') + 1 : g_flm;
    char args[8192], *want = NULL, *got = NULL;
    snprintf(args, sizeof args, "run -m '%s' --mode naive --io threads -c 64 -n 16 -p 'Once upon' --temp 0 "
             "2>/dev/null", g_flm);
    assert_int_equal(tu_run_cli(args, &want), 0);
    char errf[4096];
    snprintf(errf, sizeof errf, "%s", tu_tmp("checked-stderr", ".txt"));
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "env LD_PRELOAD='%s' ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0 "
             "FLM_SHIM_CORRUPT_FILE='/%s' FLM_SHIM_CORRUPT_AT=%llu '%s' run -m '%s' --mode naive --io threads -c 64 "
             "-n 16 -p 'Once upon' --temp 0 --stats 2>'%s'", FLM_SHIM_CORRUPT, base,
             (unsigned long long)record_byte(g_flm, BAD_LAYER, BAD_REC, 3), FLM_CLI, g_flm, errf);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0, n;
    got = malloc(cap);
    while ((n = fread(got + len, 1, cap - len - 1, p)) > 0) len += n;
    got[len] = 0;
    int rc = pclose(p);
    size_t elen;
    char *errs = (char *)tu_read_file(errf, &elen);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) fail_msg("rc %d: %s", rc, errs);
    assert_string_equal(got, want);
    if (!strstr(errs, ", 1 read again")) fail_msg("no retry reported: %s", errs);
    free(errs);
    remove(errf);
    free(want);
    free(got);
}

/* A record corrupted while the context runs: the token fails, the context refuses it until the file is right again,
 * then evaluates it correctly (positions before it kept). */
static void test_mid_generation(void **state) {
    (void)state;
    size_t len;
    uint8_t *d = tu_read_file(g_flm, &len);
    tu_write_file(g_tmp, d, len);
    free(d);
    int32_t ids[N_TOK];
    prompt_ids(ids);
    flm_status st;
    flm_error err;
    flm_ctx *clean = open_mode(g_flm, FLM_MODE_NAIVE, 0, FLM_IO_KIND_AUTO, false, &st, &err);
    flm_ctx *ctx = open_mode(g_tmp, FLM_MODE_NAIVE, 0, FLM_IO_KIND_AUTO, false, &st, &err);
    if (!clean || !ctx) fail_msg("open: %s", err.msg);
    const uint32_t V = tu_vocab(ctx);
    float *want = malloc(V * sizeof(float));
    const float *lg;
    const uint64_t at = record_byte(g_tmp, BAD_LAYER, BAD_REC, 5);
    for (int t = 0; t < N_TOK; t++) {
        if (flm_eval(clean, ids[t], t, &lg, &err)) fail_msg("clean: %s", err.msg);
        memcpy(want, lg, V * sizeof(float));
        if (t == 2) {
            flip_in_place(g_tmp, at);
            for (int k = 0; k < 2; k++) {
                assert_int_equal(flm_eval(ctx, ids[t], t, &lg, &err), FLM_ERR_CHECKSUM);
                assert_non_null(strstr(err.msg, g_expect));
                assert_int_equal(flm_n_past(ctx), t); /* positions before it kept */
            }
            flip_in_place(g_tmp, at); /* right again */
        }
        if (flm_eval(ctx, ids[t], t, &lg, &err)) fail_msg("eval %d: %s", t, err.msg);
        assert_memory_equal(lg, want, V * sizeof(float));
    }
    free(want);
    flm_close(ctx);
    flm_close(clean);
}

/* A version-1 file: refused in the streaming modes (naming the way out), runs in ram and with --no-verify-reads. */
static void test_version1(void **state) {
    (void)state;
    write_v1_copy(g_flm, g_v1);
    flm_error err;
    assert_int_equal(verify_path(g_v1, &err), FLM_OK);
    flm_status st;
    const flm_mode streaming[] = {FLM_MODE_NAIVE, FLM_MODE_HYBRID, FLM_MODE_SPARSE, FLM_MODE_HOT};
    for (size_t m = 0; m < 4; m++) {
        flm_ctx *ctx = open_mode(g_v1, streaming[m], m ? 60 : 0, FLM_IO_KIND_AUTO, false, &st, &err);
        assert_null(ctx);
        assert_int_equal(st, FLM_ERR_UNSUPPORTED);
        assert_non_null(strstr(err.msg, "no record sums"));
        assert_non_null(strstr(err.msg, "--no-verify-reads"));
        ctx = open_mode(g_v1, streaming[m], m ? 60 : 0, FLM_IO_KIND_AUTO, true, &st, &err);
        if (!ctx) fail_msg("%s --no-verify-reads: %s", flm_mode_name(streaming[m]), err.msg);
        flm_stats s;
        flm_get_stats(ctx, &s);
        assert_false(s.reads_verified);
        flm_close(ctx);
    }
    flm_ctx *ctx = open_mode(g_v1, FLM_MODE_RAM, 0, FLM_IO_KIND_AUTO, false, &st, &err);
    if (!ctx) fail_msg("ram: %s", err.msg);
    flm_close(ctx);
}

/* Records stored in a new order (flm_file_permute_ffn, as `calibrate --hot-only` does): the sums follow them. */
static void test_permuted_sums(void **state) {
    (void)state;
    size_t len;
    uint8_t *d = tu_read_file(g_flm, &len);
    tu_write_file(g_tmp, d, len);
    free(d);
    flm_file *f = NULL;
    flm_error err;
    assert_int_equal(flm_file_open_ex(g_tmp, FLM_FILE_HEADER_ONLY, &f, &err), FLM_OK);
    uint32_t L = f->n_layers, n = f->ffn[0]->n_records;
    flm_file_close(f);
    uint32_t **perm = malloc(L * sizeof *perm);
    for (uint32_t l = 0; l < L; l++) {
        perm[l] = malloc(n * sizeof **perm);
        for (uint32_t i = 0; i < n; i++) perm[l][i] = (i * 7 + l) % n; /* 7 is prime to n (172) */
    }
    assert_int_equal(flm_file_permute_ffn(g_tmp, (const uint32_t *const *)perm, &err), FLM_OK);
    assert_int_equal(verify_path(g_tmp, &err), FLM_OK);
    flm_status st;
    flm_ctx *ctx = open_mode(g_tmp, FLM_MODE_NAIVE, 0, FLM_IO_KIND_AUTO, false, &st, &err);
    if (!ctx) fail_msg("open: %s", err.msg);
    const float *lg;
    for (int t = 0; t < 3; t++)
        if (flm_eval(ctx, 1 + t, t, &lg, &err)) fail_msg("eval: %s", err.msg);
    flm_close(ctx);
    for (uint32_t l = 0; l < L; l++) free(perm[l]);
    free(perm);
}

/* flm_unit_hash (the inlined, vectorised XXH3 the kernels and the reader check with) equals libxxhash's XXH3_64bits,
 * which the writer stores, on every length around xxHash's internal boundaries and at every alignment. */
static void test_unit_hash_is_xxh3(void **state) {
    (void)state;
    assert_true(flm_unit_hash("", 0) == UINT64_C(0x2D06800538D394C2)); /* xxHash's published value for no input */
    enum { CAP = 70000 };
    uint8_t *b = malloc(CAP + 64);
    uint64_t x = 88172645463325252u;
    for (size_t i = 0; i < CAP + 64; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[i] = (uint8_t)x;
    }
    const size_t lens[] = {1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 3360, 4096, 65537, CAP};
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++)
        for (size_t a = 0; a < 8; a++)
            if (flm_unit_hash(b + a, lens[k]) != XXH3_64bits(b + a, lens[k]))
                fail_msg("length %zu at offset %zu", lens[k], a);
    for (size_t n = 0; n <= 600; n++) assert_true(flm_unit_hash(b + 3, n) == XXH3_64bits(b + 3, n));
    free(b);
}

/* The checks fused into the FFN kernels (flm_bundle_desc.sums), on layer 1 of the converted model: with the right sums
 * the output is the unchecked call's bit for bit and every record is counted; a record with one byte flipped is
 * counted bad and left out (its h 0); records below check_from are not hashed. One token and a batch. */
static void test_fused_kernel_check(void **state) {
    (void)state;
    flm_status st;
    flm_error err;
    flm_ctx *ctx = open_mode(g_flm, FLM_MODE_NAIVE, 0, FLM_IO_KIND_AUTO, false, &st, &err);
    if (!ctx) fail_msg("open: %s", err.msg);
    const flm_flash *fl = ctx->flash;
    assert_true(fl->fused_checks);
    const uint32_t l = 1;
    const flm_region *r = fl->file->ffn[l];
    const flm_bundle_desc *b = &fl->desc[l];
    const size_t n = r->n_records, d = b->d_model, rb = (size_t)r->record_bytes;
    uint8_t *rec = malloc(n * rb);
    int fd = open(g_flm, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, rec, n * rb, (off_t)r->offset), (ssize_t)(n * rb));
    close(fd);
    const flm_kernels *k = flm_kernels_for_level(flm_kernels_cpu_level());
    enum { NX = 3 };
    float *x = malloc(NX * d * sizeof(float)), *want = malloc(NX * d * sizeof(float));
    float *got = malloc(NX * d * sizeof(float)), *h = malloc(n * sizeof(float)), *h2 = malloc(n * sizeof(float));
    float *acc = malloc(4 * NX * d * sizeof(float));
    for (size_t i = 0; i < NX * d; i++) x[i] = sinf(0.37f * (float)i);
    flm_ffn_check chk;
    flm_bundle_desc c = *b;
    c.sums = fl->sums.ffn[l]->sums;
    c.check = &chk;
    for (int threads = 1; threads <= 2; threads++) {
        for (size_t nx = 1; nx <= NX; nx += NX - 1) { /* one token, then a batch */
            for (size_t from = 0; from <= n / 2; from += n / 2) {
                c.check_from = from;
                atomic_init(&chk.bad, 0);
                atomic_init(&chk.bytes, 0);
                atomic_init(&chk.ns, 0);
                if (nx == 1) {
                    flm_ffn_bundles(k, b, rec, NULL, n, x, want, h, acc, threads, NULL);
                    flm_ffn_bundles(k, &c, rec, NULL, n, x, got, h2, acc, threads, NULL);
                } else {
                    flm_ffn_bundles_batch(k, b, rec, NULL, n, NULL, 0, nx, x, d, want, d, acc, threads, NULL);
                    flm_ffn_bundles_batch(k, &c, rec, NULL, n, NULL, 0, nx, x, d, got, d, acc, threads, NULL);
                }
                assert_memory_equal(want, got, nx * d * sizeof(float));
                assert_int_equal(atomic_load(&chk.bad), 0);
                assert_int_equal(atomic_load(&chk.bytes), (n - from) * rb);
            }
        }
    }
    rec[(n - 5) * rb + 7] ^= 0x10; /* record n - 5: counted bad and left out */
    c.check_from = 0;
    atomic_init(&chk.bad, 0);
    atomic_init(&chk.bytes, 0);
    flm_ffn_bundles(k, &c, rec, NULL, n, x, got, h2, acc, 1, NULL);
    assert_int_equal(atomic_load(&chk.bad), 1);
    assert_true(h2[n - 5] == 0.0f);
    assert_true(h[n - 5] != 0.0f); /* the clean run's: the record counted */
    atomic_init(&chk.bad, 0);
    flm_ffn_bundles_batch(k, &c, rec, NULL, n, NULL, 0, NX, x, d, got, d, acc, 2, NULL);
    assert_int_equal(atomic_load(&chk.bad), 1);
    c.check_from = n - 4; /* the flipped record is below: not hashed */
    atomic_init(&chk.bad, 0);
    flm_ffn_bundles(k, &c, rec, NULL, n, x, got, h2, acc, 1, NULL);
    assert_int_equal(atomic_load(&chk.bad), 0);
    free(rec), free(x), free(want), free(got), free(h), free(h2), free(acc);
    flm_close(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corrupt_record_every_mode),
        cmocka_unit_test(test_corrupt_record_cli),
        cmocka_unit_test(test_corrupt_embedding_row),
        cmocka_unit_test(test_transient_retried),
        cmocka_unit_test(test_transient_cli),
        cmocka_unit_test(test_mid_generation),
        cmocka_unit_test(test_version1),
        cmocka_unit_test(test_permuted_sums),
        cmocka_unit_test(test_unit_hash_is_xxh3),
        cmocka_unit_test(test_fused_kernel_check),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
