/* test_flash.c — the .flm flash layout and the modes: stories260K converted and run in ram / naive / hybrid gives the
 * reference logits; budgets too small are refused with every part's size; corrupt files are caught by checksums. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flashlm.h"
#include "convert/convert.h"
#include "format/flm.h"
#include "core/util.h"
#include "testutil.h"

#define N_VOCAB 512
static char flm_path[4096];

static int setup(void **state) {
    (void)state;
    snprintf(flm_path, sizeof flm_path, "%s", tu_tmp("stories", ".flm"));
    flm_error err;
    if (flm_convert(tu_data("models/stories260K/stories260K.gguf"), flm_path, NULL, NULL, &err)) {
        fprintf(stderr, "convert: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(flm_path);
    return 0;
}

/* Run the 64 reference records through a context; return the max |logit - reference|. */
static double max_logit_error(flm_ctx *ctx) {
    size_t len;
    uint8_t *ref = tu_read_file(tu_data("reference/stories260K/expected_logits_prompt_once_upon_a_time_t0_n64.bin"),
                                &len);
    const size_t rec = 8 + 4 * N_VOCAB;
    assert_int_equal(len, 64 * rec);
    double worst = 0;
    for (int r = 0; r < 64; r++) {
        int32_t pos, tok;
        memcpy(&pos, ref + r * rec, 4);
        memcpy(&tok, ref + r * rec + 4, 4);
        const float *logits;
        flm_error err;
        if (flm_eval(ctx, tok, pos, &logits, &err)) fail_msg("eval: %s", err.msg);
        for (int i = 0; i < N_VOCAB; i++) {
            float want;
            memcpy(&want, ref + r * rec + 8 + 4 * i, 4);
            double d = fabs((double)logits[i] - want);
            if (d > worst) worst = d;
        }
    }
    free(ref);
    return worst;
}

static flm_ctx *open_flm2(flm_mode mode, uint64_t mem, bool no_read_ahead, flm_status want, flm_error *err) {
    flm_params p;
    flm_params_default(&p);
    p.no_read_ahead = no_read_ahead;
    p.kv_f32 = true; /* llama2.c computes attention in f32 */
    p.n_threads = 2;
    p.n_ctx = 128;
    p.mode = mode;
    p.mem_bytes = mem;
    flm_ctx *ctx = NULL;
    flm_status st = flm_open(flm_path, &p, &ctx, err);
    if (st != want) fail_msg("flm_open(mode %s, mem %llu): status %d (%s), want %d", flm_mode_name(mode),
                             (unsigned long long)mem, st, err->msg, want);
    return ctx;
}

static flm_ctx *open_flm(flm_mode mode, uint64_t mem, flm_status want, flm_error *err) {
    return open_flm2(mode, mem, false, want, err);
}

static void test_every_mode_matches_reference(void **state) {
    (void)state;
    const flm_mode modes[] = {FLM_MODE_RAM, FLM_MODE_NAIVE, FLM_MODE_HYBRID, FLM_MODE_AUTO};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        flm_error err;
        /* 1.1 MiB: less than the 1.02 MiB file and the KV cache; hybrid keeps some layers (with one layer buffer:
         * read-ahead's second takes their room, tested in test_read_ahead), auto picks hybrid (1 MiB did, before
         * the scratch counted the tree, output-row and work buffers) */
        uint64_t mem = modes[i] == FLM_MODE_RAM ? 0 : (1u << 20) + (100u << 10);
        flm_ctx *ctx = open_flm2(modes[i], mem, modes[i] != FLM_MODE_NAIVE, FLM_OK, &err);
        double e = max_logit_error(ctx);
        flm_stats s;
        flm_get_stats(ctx, &s);
        printf("mode %-6s -> %-6s: max |logit - reference| %.3g, %llu bytes read in %llu reads, %u/%u layers resident\n",
               flm_mode_name(modes[i]), s.mode, e, (unsigned long long)s.total.bytes_read,
               (unsigned long long)s.total.n_reads, s.n_ffn_resident_layers, s.n_layers);
        assert_true(e <= 1e-4);
        assert_int_equal(s.n_tokens, 64);
        if (modes[i] == FLM_MODE_RAM) {
            assert_int_equal(s.total.bytes_read, 0); /* nothing streamed after load */
            assert_int_equal(s.n_ffn_resident_layers, 5);
        } else {
            /* naive streams all 5 layers every token; hybrid / auto keep some resident and stream the rest */
            assert_true(s.total.bytes_read > 0);
            if (modes[i] == FLM_MODE_NAIVE) assert_int_equal(s.n_ffn_resident_layers, 0);
            else {
                assert_string_equal(s.mode, "hybrid");
                assert_true(s.n_ffn_resident_layers > 0 && s.n_ffn_resident_layers < 5);
            }
            /* per-token bytes: exactly the streamed layers' (4 KiB-aligned) regions */
            flm_token_stats t;
            assert_true(flm_get_token_stats(ctx, 10, &t));
            flm_file *f = NULL;
            assert_int_equal(flm_file_open(flm_path, &f, &err), FLM_OK);
            uint64_t want = 0;
            for (uint32_t l = s.n_ffn_resident_layers; l < f->n_layers; l++)
                want += (f->ffn[l]->size + 4095) / 4096 * 4096;
            flm_file_close(f);
            assert_int_equal(t.bytes_read, want);
            assert_int_equal(s.total.bytes_read, 64 * want);
            assert_true(s.total.bytes_read == s.bytes_requested);
            uint64_t hist = 0;
            for (int b = 0; b < FLM_STATS_HIST; b++) hist += s.read_hist[b];
            assert_int_equal(hist, s.total.n_reads);
        }
        flm_close(ctx);
    }
}

/* The reader's busy time (flm_stats.io_busy_ms, flm_gen_result.io_busy_ms): 0 where nothing is read after load (ram),
 * else above 0 exactly when reads were counted, and never more than the wall time it is a share of (the clocks'
 * order only: no timing thresholds). A reset starts it again; a generation reports its own. */
static void test_busy_share(void **state) {
    (void)state;
    const flm_mode modes[] = {FLM_MODE_RAM, FLM_MODE_NAIVE, FLM_MODE_HYBRID};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        flm_error err;
        uint64_t mem = modes[i] == FLM_MODE_RAM ? 0 : (1u << 20) + (100u << 10);
        flm_ctx *ctx = open_flm(modes[i], mem, FLM_OK, &err);
        flm_stats s;
        flm_get_stats(ctx, &s);
        assert_true(s.io_busy_ms == 0); /* the load's reads are not counted */
        double t0 = flm_now_ms();
        flm_reset_stats(ctx);
        max_logit_error(ctx);
        flm_get_stats(ctx, &s);
        double wall = flm_now_ms() - t0;
        printf("mode %-6s: reader busy %.3f ms of %.3f ms (%.1f%%), %llu reads\n", s.mode, s.io_busy_ms, wall,
               100 * s.io_busy_ms / wall, (unsigned long long)s.total.n_reads);
        assert_true(s.io_busy_ms <= wall);
        if (modes[i] == FLM_MODE_RAM) {
            assert_int_equal(s.total.n_reads, 0);
            assert_true(s.io_busy_ms == 0);
        } else {
            assert_true(s.total.n_reads > 0);
            assert_true(s.io_busy_ms > 0);
        }
        /* a generation's own share */
        flm_session *sess = NULL;
        assert_int_equal(flm_session_create(ctx, &sess, &err), FLM_OK);
        const int32_t prompt[] = {1, 403, 407};
        assert_int_equal(flm_session_feed(sess, prompt, 3, &err), FLM_OK);
        flm_gen_params gp;
        flm_gen_params_default(&gp);
        gp.max_tokens = 8;
        flm_gen_result res;
        flm_reset_stats(ctx);
        assert_int_equal(flm_session_generate(sess, &gp, NULL, NULL, &res, &err), FLM_OK);
        flm_get_stats(ctx, &s);
        assert_true(res.io_busy_ms >= 0 && res.io_busy_ms <= res.ms);
        assert_true(res.io_busy_ms <= s.io_busy_ms + 1e-9); /* within the time since the reset */
        if (modes[i] == FLM_MODE_RAM) assert_true(res.io_busy_ms == 0);
        else assert_true(res.io_busy_ms > 0);
        flm_session_free(sess);
        flm_close(ctx);
    }
}

/* Read-ahead (runtime/ffn_stream.c): the next streamed layer is read while the current one is computed. It changes
 * when bytes arrive, never which: naive and hybrid give bit-identical logits and the same bytes per token with and
 * without it (--no-read-ahead), token by token, in a batch and after a rewind; its second layer buffer is planned
 * only when the budget holds it. */
static void run_mixed(flm_ctx *ctx, float *out) { /* 20 tokens one by one, a batch of 12, a rewind to 8 and 4 more */
    const int32_t toks[] = {1, 403, 407, 261, 378, 426, 285, 395, 300, 283, 261, 356, 480, 268, 322, 290, 258, 291, 344,
                            422, 276, 260, 431, 301, 363, 279, 440, 287, 334, 271, 300, 412};
    const float *logits;
    flm_error err;
    size_t k = 0;
    for (int t = 0; t < 20; t++, k++) {
        if (flm_eval(ctx, toks[t], t, &logits, &err)) fail_msg("eval: %s", err.msg);
        memcpy(out + k * N_VOCAB, logits, N_VOCAB * sizeof(float));
    }
    if (flm_eval_batch(ctx, toks + 20, 12, 20, false, &logits, &err)) fail_msg("batch: %s", err.msg);
    memcpy(out + k++ * N_VOCAB, logits, N_VOCAB * sizeof(float));
    for (int t = 8; t < 12; t++, k++) {
        if (flm_eval(ctx, toks[t + 20], t, &logits, &err)) fail_msg("eval: %s", err.msg);
        memcpy(out + k * N_VOCAB, logits, N_VOCAB * sizeof(float));
    }
}

static void test_read_ahead(void **state) {
    (void)state;
    enum { N_OUT = 25 };
    const flm_mode modes[] = {FLM_MODE_NAIVE, FLM_MODE_HYBRID};
    uint64_t hybrid_mem = 0; /* the smallest budget at which hybrid keeps a layer next to its two buffers */
    for (uint64_t mem = 1u << 20; mem < (2u << 20) && !hybrid_mem; mem += 16u << 10) {
        flm_params p;
        flm_params_default(&p);
        p.n_ctx = 128;
        p.mode = FLM_MODE_HYBRID;
        p.mem_bytes = mem;
        flm_ctx *c = NULL;
        flm_error e;
        if (flm_open(flm_path, &p, &c, &e)) continue;
        flm_stats s;
        flm_get_stats(c, &s);
        if (s.n_ffn_resident_layers > 0 && s.n_ffn_resident_layers < 5) hybrid_mem = mem;
        flm_close(c);
    }
    assert_true(hybrid_mem > 0);
    for (int m = 0; m < 2; m++) {
        float *out[2];
        flm_stats s[2];
        for (int ahead = 0; ahead < 2; ahead++) {
            flm_params p;
            flm_params_default(&p);
            p.n_ctx = 128;
            p.mode = modes[m];
            p.mem_bytes = modes[m] == FLM_MODE_HYBRID ? hybrid_mem : 1u << 20;
            p.no_read_ahead = !ahead;
            flm_ctx *ctx = NULL;
            flm_error err;
            if (flm_open(flm_path, &p, &ctx, &err)) fail_msg("open: %s", err.msg);
            out[ahead] = malloc((size_t)N_OUT * N_VOCAB * sizeof(float));
            run_mixed(ctx, out[ahead]);
            flm_get_stats(ctx, &s[ahead]);
            flm_close(ctx);
        }
        printf("%s: %llu bytes read without read-ahead, %llu with; FFN memory %llu / %llu bytes, %u layers resident\n",
               flm_mode_name(modes[m]), (unsigned long long)s[0].total.bytes_read,
               (unsigned long long)s[1].total.bytes_read, (unsigned long long)s[0].mem_ffn,
               (unsigned long long)s[1].mem_ffn, s[1].n_ffn_resident_layers);
        assert_memory_equal(out[0], out[1], (size_t)N_OUT * N_VOCAB * sizeof(float));
        assert_true(s[1].n_ffn_resident_layers < 5);
        if (modes[m] == FLM_MODE_NAIVE) {
            assert_int_equal(s[0].total.bytes_read, s[1].total.bytes_read);
            assert_int_equal(s[0].total.n_reads, s[1].total.n_reads);
            assert_int_equal(s[1].mem_ffn, 2 * s[0].mem_ffn); /* the second layer buffer */
        } else { /* the second buffer may take a resident layer's place: bytes per token follow the plan */
            assert_true(s[1].n_ffn_resident_layers <= s[0].n_ffn_resident_layers);
            assert_true(s[1].n_ffn_resident_layers > 0);
        }
        assert_true(s[1].peak_rss > 0);
        free(out[0]);
        free(out[1]);
    }
    /* a budget that holds one layer buffer but not two: naive plans one and runs (no read-ahead) */
    flm_error err;
    flm_ctx *ctx = open_flm(FLM_MODE_NAIVE, 0, FLM_OK, &err);
    flm_stats s;
    flm_get_stats(ctx, &s);
    flm_close(ctx);
    const uint64_t one = s.mem_ffn / 2;
    uint64_t lo = 256u << 10, hi = 1u << 20; /* the smallest budget naive opens with, by bisection */
    while (hi - lo > 4096) {
        uint64_t mid = (lo + hi) / 2;
        flm_params p;
        flm_params_default(&p);
        p.kv_f32 = true;
        p.n_ctx = 128;
        p.mode = FLM_MODE_NAIVE;
        p.mem_bytes = mid;
        flm_ctx *c = NULL;
        if (flm_open(flm_path, &p, &c, &err) == FLM_OK) {
            hi = mid;
            flm_close(c);
        } else lo = mid;
    }
    ctx = open_flm(FLM_MODE_NAIVE, hi, FLM_OK, &err);
    flm_get_stats(ctx, &s);
    assert_int_equal(s.mem_ffn, one);
    float *o = malloc((size_t)N_OUT * N_VOCAB * sizeof(float));
    run_mixed(ctx, o);
    free(o);
    flm_close(ctx);
}

static void test_budget_too_small_is_refused(void **state) {
    (void)state;
    flm_error err;
    /* below the resident weights less the classifier, which a streaming mode may leave on flash (0.37 - 0.12 =
     * 0.25 MiB): refused before they are loaded, with their size and the model's */
    flm_ctx *ctx = open_flm(FLM_MODE_NAIVE, 200 * 1024, FLM_ERR_BUDGET, &err);
    assert_null(ctx);
    assert_non_null(strstr(err.msg, flm_path));
    assert_non_null(strstr(err.msg, "the resident weights alone"));
    assert_non_null(strstr(err.msg, "are 0.25 MiB"));
    assert_non_null(strstr(err.msg, "the whole model is 1.02 MiB"));
    /* above them but below the plan: the message names the file and gives each part's size, the classifier's
     * on flash too */
    ctx = open_flm(FLM_MODE_NAIVE, 700 * 1024, FLM_ERR_BUDGET, &err);
    assert_null(ctx);
    assert_non_null(strstr(err.msg, flm_path));
    assert_non_null(strstr(err.msg, "resident weights"));
    assert_non_null(strstr(err.msg, "KV cache"));
    assert_non_null(strstr(err.msg, "scratch"));
    ctx = open_flm(FLM_MODE_NAIVE, 300 * 1024, FLM_ERR_BUDGET, &err);
    assert_null(ctx);
    assert_non_null(strstr(err.msg, "classifier 0.12 MiB on flash"));
    /* ram mode needs the whole model: refused at 1 MiB */
    ctx = open_flm(FLM_MODE_RAM, 1u << 20, FLM_ERR_BUDGET, &err);
    assert_null(ctx);
    /* the CLI exits non-zero with that message */
    char args[8192], *out = NULL;
    snprintf(args, sizeof args, "run -m '%s' -n 4 -c 128 --mem 300K --mode naive 2>&1", flm_path);
    assert_int_not_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, "too small"));
    free(out);
}

static void test_gguf_rejects_flash_options(void **state) {
    (void)state;
    flm_params p;
    flm_params_default(&p);
    p.kv_f32 = true; /* llama2.c computes attention in f32 */
    p.mode = FLM_MODE_NAIVE;
    flm_ctx *ctx = NULL;
    flm_error err;
    assert_int_equal(flm_open(tu_data("models/stories260K/stories260K.gguf"), &p, &ctx, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "convert"));
    /* a budget a GGUF (all weights in memory) cannot keep is refused, not ignored */
    p.mode = FLM_MODE_AUTO;
    p.mem_percent = 50;
    assert_int_equal(flm_open(tu_data("models/stories260K/stories260K.gguf"), &p, &ctx, &err), FLM_ERR_BUDGET);
    assert_non_null(strstr(err.msg, "convert"));
    p.mem_percent = 0;
    p.mem_bytes = 64u << 20; /* enough */
    assert_int_equal(flm_open(tu_data("models/stories260K/stories260K.gguf"), &p, &ctx, &err), FLM_OK);
    flm_close(ctx);
}

/* ---- corrupt files --------------------------------------------------------------------------------------------- */

static void write_variant(const char *path, const uint8_t *data, size_t len) { tu_write_file(path, data, len); }

/* A .flm written to while a context streams from it (rewritten in place: the same file, new bytes and a new
 * modification time) was reported as "the file is corrupt", as if it had been damaged on disk. The reader now tells
 * the two apart: the next read of the changed record fails naming the record and saying the file changed while
 * running. The file is put back afterwards (the other tests share it). */
static void test_changed_while_running(void **state) {
    (void)state;
    flm_error err;
    flm_ctx *ctx = open_flm2(FLM_MODE_NAIVE, 1u << 20, true, FLM_OK, &err); /* every layer read per token */
    const float *logits;
    assert_int_equal(flm_eval(ctx, 1, 0, &logits, &err), FLM_OK);
    /* the first FFN region's offset, from the header's region table (docs/FORMAT.md) */
    FILE *f = fopen(flm_path, "r+b");
    assert_non_null(f);
    uint8_t fixed[64], e[64];
    assert_int_equal(fread(fixed, 1, 64, f), 64);
    uint64_t off = 0;
    for (uint32_t i = 0; i < flm_get_u32(fixed + 12) && !off; i++) {
        assert_int_equal(fseek(f, 64 + 64 * (long)i, SEEK_SET), 0);
        assert_int_equal(fread(e, 1, 64, f), 64);
        if (flm_get_u32(e) == 2 && flm_get_u32(e + 4) == 0) off = flm_get_u64(e + 8);
    }
    assert_true(off > 0);
    uint8_t b, nb;
    assert_int_equal(fseek(f, (long)off + 100, SEEK_SET), 0);
    assert_int_equal(fread(&b, 1, 1, f), 1);
    nb = (uint8_t)(b ^ 0x5a);
    assert_int_equal(fseek(f, (long)off + 100, SEEK_SET), 0);
    assert_int_equal(fwrite(&nb, 1, 1, f), 1);
    assert_int_equal(fflush(f), 0);
    /* a modification time the open did not see (a coarse clock could give the open's own) */
    struct timespec ts[2] = {{0, UTIME_OMIT}, {946684800, 0}};
    assert_int_equal(futimens(fileno(f), ts), 0);
    flm_status st = flm_eval(ctx, 2, 1, &logits, &err);
    assert_int_equal(st, FLM_ERR_CHECKSUM);
    if (!strstr(err.msg, "changed while running") || !strstr(err.msg, flm_path) || !strstr(err.msg, "layer 0"))
        fail_msg("%s", err.msg);
    flm_close(ctx);
    /* put the byte back: the file is whole again, and a fresh context reads it */
    assert_int_equal(fseek(f, (long)off + 100, SEEK_SET), 0);
    assert_int_equal(fwrite(&b, 1, 1, f), 1);
    assert_int_equal(fclose(f), 0);
    ctx = open_flm2(FLM_MODE_NAIVE, 1u << 20, true, FLM_OK, &err);
    assert_int_equal(flm_eval(ctx, 1, 0, &logits, &err), FLM_OK);
    assert_int_equal(flm_eval(ctx, 2, 1, &logits, &err), FLM_OK);
    flm_close(ctx);
}

static void test_corrupt_files(void **state) {
    (void)state;
    size_t len;
    uint8_t *orig = tu_read_file(flm_path, &len);
    flm_file *f = NULL;
    flm_error err;
    assert_int_equal(flm_file_open(flm_path, &f, &err), FLM_OK);
    assert_int_equal(flm_file_verify(f, NULL, NULL, &err), FLM_OK);
    uint32_t n_regions = f->n_regions;
    flm_region regions[16];
    assert_true(n_regions <= 16);
    memcpy(regions, f->regions, n_regions * sizeof *regions);
    uint32_t header_bytes = f->header_bytes;
    flm_file_close(f);
    const char *bad = tu_tmp("corrupt", ".flm");
    uint8_t *buf = malloc(len);

    /* a flipped byte in the header's region table */
    memcpy(buf, orig, len);
    buf[FLM_HEADER_FIXED + 20] ^= 0x40;
    write_variant(bad, buf, len);
    assert_int_equal(flm_file_open(bad, &f, &err), FLM_ERR_CHECKSUM);
    assert_non_null(strstr(err.msg, "header"));
    assert_non_null(strstr(err.msg, bad));
    (void)header_bytes;

    /* a flipped byte in each region: the resident one fails at open, FFN ones at verify (naming the layer) */
    for (uint32_t i = 0; i < n_regions; i++) {
        memcpy(buf, orig, len);
        buf[regions[i].offset + regions[i].size / 2] ^= 0x01;
        write_variant(bad, buf, len);
        flm_status st = flm_file_open(bad, &f, &err);
        if (regions[i].kind == FLM_REGION_RESIDENT) {
            assert_int_equal(st, FLM_ERR_CHECKSUM);
            assert_non_null(strstr(err.msg, "resident"));
        } else {
            assert_int_equal(st, FLM_OK);
            assert_int_equal(flm_file_verify(f, NULL, NULL, &err), FLM_ERR_CHECKSUM);
            char want[64]; /* the record sums name themselves; FFN regions their layer (and the bad record) */
            if (regions[i].kind == FLM_REGION_SUMS) snprintf(want, sizeof want, "record-sums region");
            else snprintf(want, sizeof want, "layer %u", regions[i].layer);
            assert_non_null(strstr(err.msg, want));
            flm_file_close(f);
            /* ram mode reads every FFN region at open: it checks them too */
            flm_params p;
            flm_params_default(&p);
    p.kv_f32 = true; /* llama2.c computes attention in f32 */
            p.n_ctx = 16;
            p.mode = FLM_MODE_RAM;
            flm_ctx *ctx = NULL;
            assert_int_equal(flm_open(bad, &p, &ctx, &err), FLM_ERR_CHECKSUM);
            assert_non_null(strstr(err.msg, want));
        }
        /* the CLI's verify exits non-zero */
        char args[8192], *out = NULL;
        snprintf(args, sizeof args, "verify '%s' 2>&1", bad);
        assert_int_equal(tu_run_cli(args, &out), 1);
        assert_non_null(strstr(out, "checksum"));
        free(out);
    }

    /* truncated at several points */
    size_t cuts[] = {0, 7, 63, 64, 4095, 4096, (size_t)regions[1].offset + 10, len - 4096, len - 1};
    for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
        write_variant(bad, orig, cuts[c]);
        flm_status st = flm_file_open(bad, &f, &err);
        if (st == FLM_OK) fail_msg("truncated at %zu: opened", cuts[c]);
        assert_non_null(strstr(err.msg, bad));
    }

    /* wrong version, wrong magic */
    memcpy(buf, orig, len);
    buf[8] = 99;
    write_variant(bad, buf, len);
    assert_int_equal(flm_file_open(bad, &f, &err), FLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "version"));
    memcpy(buf, orig, len);
    buf[0] = 'X';
    write_variant(bad, buf, len);
    assert_int_equal(flm_file_open(bad, &f, &err), FLM_ERR_FORMAT);

    /* and the CLI runs none of them: clear error, non-zero exit */
    char args[8192], *out = NULL;
    snprintf(args, sizeof args, "run -m '%s' -n 2 2>&1", bad);
    assert_int_not_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, bad));
    free(out);
    remove(bad);
    free(buf);
    free(orig);
}

static void test_convert_bad_source_leaves_nothing(void **state) {
    (void)state;
    const char *src = tu_tmp("bad", ".gguf"), *dst = tu_tmp("bad", ".flm");
    size_t len;
    uint8_t *g = tu_read_file(tu_data("models/stories260K/stories260K.gguf"), &len);
    tu_write_file(src, g, len / 2); /* truncated source */
    free(g);
    flm_error err;
    assert_int_not_equal(flm_convert(src, dst, NULL, NULL, &err), FLM_OK);
    assert_non_null(strstr(err.msg, src));
    FILE *f = fopen(dst, "rb");
    assert_null(f);
    assert_false(tu_temp_left(dst)); /* no temporary, no lock */
    remove(src);
}

static void test_stats_json(void **state) {
    (void)state;
    const char *json = tu_tmp("stats", ".json");
    char args[8192], *out = NULL;
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 8 --temp 0 -c 128 --mem 1M --mode naive "
             "--stats-json '%s' 2>&1", flm_path, json);
    int rc = tu_run_cli(args, &out);
    if (rc) fail_msg("run failed: %s", out);
    free(out);
    size_t n;
    char *j = (char *)tu_read_file(json, &n);
    assert_non_null(strstr(j, "\"mode\": \"naive\""));
    assert_non_null(strstr(j, "\"io_ms\""));
    assert_non_null(strstr(j, "\"peak_rss\""));
    /* 5 prompt tokens + 8 generated, minus the last generated one which is never fed back = 12 evaluations */
    const char *p = strstr(j, "\"n_tokens\": ");
    assert_non_null(p);
    assert_int_equal(atoi(p + 12), 12);
    free(j);
    remove(json);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_mode_matches_reference),
        cmocka_unit_test(test_busy_share),
        cmocka_unit_test(test_read_ahead),
        cmocka_unit_test(test_budget_too_small_is_refused),
        cmocka_unit_test(test_gguf_rejects_flash_options),
        cmocka_unit_test(test_corrupt_files),
        cmocka_unit_test(test_changed_while_running),
        cmocka_unit_test(test_convert_bad_source_leaves_nothing),
        cmocka_unit_test(test_stats_json),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
