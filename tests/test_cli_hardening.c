/* test_cli_hardening.c — issue 12 as a user meets it: corrupt weights, interrupted writes, limits. Every case ends
 * in a clear message and a non-zero exit (or works), never a crash, a hang, garbage with exit 0 or a file left
 * behind. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "format/flm.h"
#include "flashlm_tools.h"
#include "format/gguf.h"
#include "write/gguf_write.h"
#include "testutil.h"

#define STORIES "models/stories260K/stories260K.gguf"
#define TEXT "text/tinystories_sample.txt"

/* Run the CLI with args (stderr joined); fail unless it exits want_rc and its output holds want_text. Returns the
 * output (malloc'd). */
static char *expect_out(const char *args, int want_rc, const char *want_text) { return tu_cli_expect(args, want_rc, want_text); }

static void expect(const char *args, int want_rc, const char *want_text) { free(expect_out(args, want_rc, want_text)); }

/* A tiny synthetic model of 3 layers: path.gguf and its conversion path.flm (calibrated when asked). */
static void tiny_model(const char *gguf, const char *flm, bool calibrate) {
    char args[8192];
    snprintf(args, sizeof args, "synth '%s' --d-model 32 --d-ffn 64 --layers 3 --heads 2 --vocab 259 --type q8_0 "
             "--calib 8 -f", gguf);
    expect(args, 0, NULL);
    snprintf(args, sizeof args, "convert '%s' '%s' --force", gguf, flm);
    expect(args, 0, "wrote");
    if (calibrate) {
        snprintf(args, sizeof args, "calibrate '%s' --text '%s'", flm, tu_data(TEXT));
        expect(args, 0, "calibrated");
    }
}

/* Write byte b at offset off of every record of layer l's FFN region (every = false: the first record only). */
static void poke_ffn(const char *flm, uint32_t l, uint64_t off, uint8_t b, bool every) {
    flm_file *f = NULL;
    flm_error err;
    assert_int_equal(flm_file_open(flm, &f, &err), FLM_OK);
    const flm_region *r = f->ffn[l];
    uint64_t base = r->offset, rb = r->record_bytes, n = every ? r->n_records : 1;
    flm_file_close(f);
    FILE *fp = fopen(flm, "r+b");
    assert_non_null(fp);
    for (uint64_t i = 0; i < n; i++) {
        assert_int_equal(fseek(fp, (long)(base + i * rb + off), SEEK_SET), 0);
        assert_int_equal(fputc(b, fp), b);
    }
    fclose(fp);
}

/* Issue 12 #2: a NaN weight (byte 0x7e at offset 1: the high byte of a q8_0 block's f16 scale) in a streamed FFN
 * region went through to empty tokens, "$$$$" or a perplexity of nan, with exit 0. Now every mode stops at the
 * token with the file, the region and `flashlm verify`. */
static void test_nonfinite_weights(void **state) {
    (void)state;
    const char *g = tu_tmp("nan", ".gguf"), *f = tu_tmp("nan", ".flm");
    tiny_model(g, f, true);
    char args[8192], want[4200];
    /* the budget at which hybrid keeps exactly layer 0 resident (-c 64 -t 2): the smallest that does */
    char hybrid1[64] = "";
    for (int kib = 100; kib <= 1024 && !hybrid1[0]; kib += 2) {
        char *out = NULL;
        /* one layer buffer: with read-ahead's two, hybrid goes from no layer resident to two */
        snprintf(args, sizeof args, "run -m '%s' --mode hybrid --no-read-ahead --mem %dK -c 64 -t 2 -p hi -n 1 --stats 2>&1",
                 f, kib);
        tu_run_cli(args, &out);
        if (strstr(out, "(1 of 3 layers resident)"))
            snprintf(hybrid1, sizeof hybrid1, "hybrid --no-read-ahead --mem %dK -c 64 -t 2", kib);
        free(out);
    }
    assert_true(hybrid1[0]);
    snprintf(want, sizeof want, "%s: data corrupt in the FFN region of layer 1", f);
    poke_ffn(f, 1, 1, 0x7e, true);
    /* hybrid: without a budget every layer streams; with hybrid1 layer 0 stays resident, 1 and 2 stream */
    const char *modes[] = {"naive", "hybrid", hybrid1, "sparse"};
    for (int m = 0; m < 4; m++)
        for (int t = 0; t < 2; t++) {
            /* the checked reads (on by default) stop it at the record's sum, before its values are used; without
             * them the pass's finite check still refuses the output */
            snprintf(args, sizeof args, "run -m '%s' --mode %s -p 'Once upon a time' -n 8 --temp %s", f, modes[m],
                     t ? "0.8" : "0");
            expect(args, 1, "FFN region of layer 1, record 0");
            snprintf(args, sizeof args, "run -m '%s' --mode %s -p 'Once upon a time' -n 8 --temp %s --no-verify-reads",
                     f, modes[m], t ? "0.8" : "0");
            /* a layer the plan holds resident is read whole at open and checked against its region's sum (so at
             * hybrid's budgets the message can be that one); naive streams every layer: the finite check */
            char *out = expect_out(args, 1, "FFN region of layer 1");
            if (m == 0) {
                assert_non_null(strstr(out, want));
                assert_non_null(strstr(out, "flashlm verify"));
            }
            free(out);
        }
    snprintf(args, sizeof args, "perplexity -m '%s' --mode naive -f '%s' -c 32 --chunks 1 --no-verify-reads", f,
             tu_data(TEXT));
    expect(args, 1, want);
    /* ram mode checks each record's sum as it loads */
    snprintf(args, sizeof args, "run -m '%s' --mode ram -p hi -n 2", f);
    expect(args, 1, "FFN region of layer 1, record 0");
    /* verify names it too */
    snprintf(args, sizeof args, "verify '%s'", f);
    expect(args, 1, "FFN region of layer 1, record 0");

    /* a GGUF (never checksummed): a NaN in an f32 FFN weight of stories260K */
    size_t len;
    uint8_t *bytes = tu_read_file(tu_data(STORIES), &len);
    flm_gguf_file *gf = NULL;
    flm_error err;
    assert_int_equal(flm_gguf_open_buffer("stories", bytes, len, &gf, &err), FLM_OK);
    const flm_gguf_tensor *t = flm_gguf_find_tensor(gf, "blk.1.ffn_down.weight");
    assert_non_null(t);
    const float nan = NAN;
    memcpy(bytes + (t->data - (const uint8_t *)bytes), &nan, sizeof nan);
    flm_gguf_close(gf);
    const char *bad = tu_tmp("nan-stories", ".gguf");
    tu_write_file(bad, bytes, len);
    free(bytes);
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 8 --temp 0", bad);
    snprintf(want, sizeof want, "%s: the FFN output of layer 1 is not finite", bad);
    expect(args, 1, want);
    remove(bad);
    remove(g);
    remove(f);
}

/* true when a file named prefix* exists in dir */
static bool any_file_with_prefix(const char *dir, const char *prefix) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -q -F '%s'", dir, prefix);
    return system(cmd) == 0;
}

/* Issue 12 #3: an interrupted convert left OUT.flm.resident.tmp(.tmp) behind (up to 69 MB). Now the resident region
 * is written straight into OUT.flm.tmp (no file of its own) and SIGINT / SIGTERM remove OUT.flm.tmp: nothing is left,
 * whenever the signal comes. */
static void test_interrupted_convert(void **state) {
    (void)state;
    const char *src = tu_model("qwen2.5-coder-0.5b"); /* about 2 s to convert: a signal lands mid-way */
    if (!src) src = tu_model("smollm2-135m");
    if (!src) skip();
    char dir[4096], args[16384];
    snprintf(dir, sizeof dir, "%s", tu_tmp("sigdir", ""));
    snprintf(args, sizeof args, "mkdir -p '%s'", dir);
    assert_int_equal(system(args), 0);
    const char *sigs[] = {"INT", "TERM"};
    const char *delays[] = {"0.3", "1.0"};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < 2; d++) {
            snprintf(args, sizeof args, "'%s' convert '%s' '%s/o.flm' --force >/dev/null 2>&1 & pid=$!; sleep %s; "
                     "kill -%s $pid; wait $pid", FLM_CLI, src, dir, delays[d], sigs[s]);
            (void)system(args);
            if (any_file_with_prefix(dir, "o.flm."))
                fail_msg("convert interrupted by SIG%s after %s s left a temporary file in %s", sigs[s], delays[d],
                         dir);
        }
    snprintf(args, sizeof args, "rm -rf '%s'", dir);
    assert_int_equal(system(args), 0);
}

/* Issue 12 #7: after the rename convert read the whole resident region again for its summary (killed in a tight
 * cgroup) and wrote it twice. The summary now comes from what was written, with the rates. */
static void test_convert_summary(void **state) {
    (void)state;
    const char *out = tu_tmp("summary", ".flm");
    char args[8192];
    snprintf(args, sizeof args, "convert '%s' '%s' --force", tu_data(STORIES), out);
    char *o = expect_out(args, 0, "MB/s written");
    assert_non_null(strstr(o, "MB/s of GGUF read"));
    assert_non_null(strstr(o, "5 layers of 172 records"));
    free(o);
    snprintf(args, sizeof args, "verify '%s'", out);
    expect(args, 0, "all checksums match");
    remove(out);
}

/* Run `flashlm args` (output discarded) and measure its peak RSS from outside: wait4's rusage (KiB -> bytes) of the
 * child, which covers the CLI's re-exec of itself too. Returns the exit status. */
static int run_rss(const char *args, uint64_t *peak) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "exec '%s' %s >/dev/null 2>&1", FLM_CLI, args);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    struct rusage ru;
    assert_int_equal(wait4(pid, &st, 0, &ru), pid);
    *peak = (uint64_t)ru.ru_maxrss * 1024;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Issue 12 #5: peak RSS above --mem by 3-6 MiB on small models, the allowance nowhere printed. The allowance is
 * FLM_RSS_ALLOWANCE (16 MiB, docs/ARCHITECTURE.md); `--stats` prints peak RSS against budget + allowance; and
 * here, measured from outside the process at the tightest budget each model and mode opens with, it holds at every
 * size: a 0.05 MiB synthetic model, stories260K (1 MiB), and SmolLM2 (105 MiB) when pulled. */
static void test_rss_within_budget_and_allowance(void **state) {
    (void)state;
    const char *g = tu_tmp("rss", ".gguf"), *tiny = tu_tmp("rss", ".flm"), *st = tu_tmp("rss-stories", ".flm");
    tiny_model(g, tiny, true);
    char args[8192];
    snprintf(args, sizeof args, "convert '%s' '%s' --force", tu_data(STORIES), st);
    expect(args, 0, "wrote");
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --tokens 512 --chunk 64", st, tu_data(TEXT));
    expect(args, 0, "calibrated");
    const char *smol_src = tu_model("smollm2-135m"), *smol = tu_tmp("rss-smollm2", ".flm");
    if (smol_src) {
        snprintf(args, sizeof args, "convert '%s' '%s' --force", smol_src, smol);
        expect(args, 0, "wrote");
    }
    const char *models[] = {tiny, st, smol_src ? smol : NULL};
    const char *modes[] = {"naive", "hybrid", "sparse"};
    for (int mi = 0; mi < 3; mi++) {
        if (!models[mi]) continue;
        for (int k = 0; k < 3; k++) {
            if (mi == 2 && k == 2) continue; /* SmolLM2 is not calibrated here (minutes) */
            /* the tightest budget that opens (within 1/64): doubling from 64 KiB, then bisection */
            uint64_t lo = 0, hi = 64 << 10, budget, peak = 0, hi_peak = 0;
            for (;;) {
                snprintf(args, sizeof args, "run -m '%s' --mode %s --mem %llu -c 256 -t 2 -p 'Once upon' -n 8 "
                         "--temp 0", models[mi], modes[k], (unsigned long long)hi);
                if (run_rss(args, &hi_peak) == 0) break;
                lo = hi;
                hi *= 2;
                assert_true(hi < (4ull << 30));
            }
            while (hi - lo > hi / 64) {
                budget = lo + (hi - lo) / 2;
                snprintf(args, sizeof args, "run -m '%s' --mode %s --mem %llu -c 256 -t 2 -p 'Once upon' -n 8 "
                         "--temp 0", models[mi], modes[k], (unsigned long long)budget);
                if (run_rss(args, &peak) == 0) { hi = budget; hi_peak = peak; }
                else lo = budget;
            }
            budget = hi;
            peak = hi_peak;
            print_message("%s %s: budget %.2f MiB, peak RSS %.2f MiB (+%.2f MiB; allowance %llu MiB)\n", models[mi],
                          modes[k], budget / 1048576.0, peak / 1048576.0, ((double)peak - (double)budget) / 1048576.0,
                          FLM_RSS_ALLOWANCE >> 20);
#ifndef FLM_SANITIZED_BUILD /* shadow memory is not the engine's */
            if (peak > budget + FLM_RSS_ALLOWANCE)
                fail_msg("%s --mode %s --mem %llu: peak RSS %llu bytes exceeds budget + allowance", models[mi],
                         modes[k], (unsigned long long)budget, (unsigned long long)peak);
#endif
        }
    }
    /* and --stats says so in the same units */
    snprintf(args, sizeof args, "run -m '%s' --mode naive --mem 8M -c 256 -p hi -n 4 --stats", st);
#ifndef FLM_SANITIZED_BUILD
    expect(args, 0, "allowance for the process itself is 16 MiB");
#else /* shadow memory lifts the peak past the allowance: the line still names it, in either wording */
    expect(args, 0, "allowance");
#endif
    /* --stats prints the totals only; --stats-tokens adds a row per token (4 generated + the prompt's) */
    char *o = expect_out(args, 0, "read requests by size");
    assert_null(strstr(o, "(p = prompt token)"));
    free(o);
    snprintf(args, sizeof args, "run -m '%s' --mode naive --mem 8M -c 256 -p hi -n 4 --stats-tokens", st);
    o = expect_out(args, 0, "(p = prompt token)");
    assert_non_null(strstr(o, "token   flash I/O ms"));
    free(o);
    remove(g);
    remove(tiny);
    remove(st);
    remove(smol);
}

/* A copy of stories260K whose tokenizer.ggml.token_type is `type` for every token. */
static void write_vocab_typed(const char *out, int32_t type) {
    flm_error err;
    flm_gguf_file *src = NULL;
    assert_int_equal(flm_gguf_open(tu_data(STORIES), &src, &err), FLM_OK);
    flm_gguf_writer *w = NULL;
    assert_int_equal(flm_gguf_writer_create(out, FLM_OUT_REPLACE, &w, &err), FLM_OK);
    const flm_gguf_kv *tt = flm_gguf_find_kv(src, "tokenizer.ggml.token_type");
    assert_non_null(tt);
    int32_t *types = malloc(tt->arr_n * sizeof *types);
    for (uint64_t i = 0; i < tt->arr_n; i++) types[i] = type;
    assert_int_equal(flm_gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, tt->arr_n), FLM_OK);
    free(types);
    for (uint64_t i = 0; i < src->n_kv; i++)
        if (strcmp(src->kv[i].key, "tokenizer.ggml.token_type"))
            assert_int_equal(flm_gguf_writer_kv_copy(w, &src->kv[i]), FLM_OK);
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const flm_gguf_tensor *t = &src->tensors[i];
        assert_int_equal(flm_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne), FLM_OK);
    }
    assert_int_equal(flm_gguf_writer_begin(w, &err), FLM_OK);
    for (uint64_t i = 0; i < src->n_tensors; i++)
        assert_int_equal(flm_gguf_writer_write_tensor(w, src->tensors[i].data, src->tensors[i].nbytes, &err), FLM_OK);
    assert_int_equal(flm_gguf_writer_finish(w, &err), FLM_OK);
    flm_gguf_writer_free(w);
    flm_gguf_close(src);
}

/* Issue 12 #8: the small things a new user met. */
static void test_user_papercuts(void **state) {
    (void)state;
    char args[8192];
    /* a vocabulary of control / unknown / unused tokens only printed nothing and exited 0 */
    const int32_t kinds[] = {3, 2, 5};
    for (int k = 0; k < 3; k++) {
        const char *v = tu_tmp("ctrlvocab", ".gguf");
        write_vocab_typed(v, kinds[k]);
        snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 8", v);
        expect(args, 1, "none of the 512 tokens decodes to text");
        remove(v);
    }
    /* inspect shows what it can read of a damaged file, then names the problem (exit 1) */
    size_t len;
    uint8_t *g = tu_read_file(tu_data(STORIES), &len);
    const char *cut = tu_tmp("cut", ".gguf");
    tu_write_file(cut, g, 20000);
    snprintf(args, sizeof args, "inspect '%s'", cut);
    char *out = expect_out(args, 1, "tokenizer.ggml.bos_token_id");
    assert_non_null(strstr(out, "blk.4.ffn_down.weight"));
    assert_non_null(strstr(out, "runs past the end of the file"));
    free(out);
    tu_write_file(cut, g, 3000); /* inside the first key's array: the header is all there is */
    snprintf(args, sizeof args, "inspect '%s'", cut);
    expect(args, 1, "kv 0 'tokenizer.ggml.tokens'");
    free(g);
    /* a file that parses but cannot be run: its contents, and why */
    write_vocab_typed(cut, 3);
    snprintf(args, sizeof args, "inspect '%s'", cut);
    out = expect_out(args, 1, "cannot be run");
    assert_non_null(strstr(out, "general.architecture"));
    assert_non_null(strstr(out, "blk.0.attn_q.weight"));
    free(out);
    remove(cut);
    /* type names, never "(null)" */
    const char *tg = tu_tmp("types", ".gguf"), *tf = tu_tmp("types", ".flm");
    tiny_model(tg, tf, false);
    snprintf(args, sizeof args, "inspect '%s'", tf);
    out = expect_out(args, 0, "q8_0");
    assert_null(strstr(out, "(null)"));
    free(out);
    /* --mem: 0 documented; 1K printed as 1 KiB, not 0.00 MiB */
    expect("run --help", 0, "0 = no budget");
    snprintf(args, sizeof args, "run -m '%s' --mem 1K -p hi -n 2", tf);
    expect(args, 1, "a memory budget of 1.00 KiB is too small");
    snprintf(args, sizeof args, "run -m '%s' --mem 1K -p hi -n 2", tu_data(STORIES));
    expect(args, 1, "a memory budget of 1.00 KiB cannot hold");
    remove(tg);
    remove(tf);
    /* run -f FILE: a prompt of any length, from a file or standard input */
    const char *pf = tu_tmp("prompt", ".txt");
    tu_write_file(pf, "Once upon a time", 16);
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 12 --temp 0 2>/dev/null", tu_data(STORIES));
    char *want = NULL;
    assert_int_equal(tu_run_cli(args, &want), 0);
    snprintf(args, sizeof args, "run -m '%s' -f '%s' -n 12 --temp 0 2>/dev/null", tu_data(STORIES), pf);
    out = NULL;
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_string_equal(out, want);
    free(out);
    snprintf(args, sizeof args, "run -m '%s' -f - -n 12 --temp 0 2>/dev/null < '%s'", tu_data(STORIES), pf);
    out = NULL;
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_string_equal(out, want);
    free(out);
    free(want);
    char *big = malloc(400001);
    for (int i = 0; i < 400000; i++) big[i] = "Once upon a time "[i % 17];
    tu_write_file(pf, big, 400000); /* beyond what one argument may hold */
    free(big);
    snprintf(args, sizeof args, "run -m '%s' -f '%s' -n 2", tu_data(STORIES), pf);
    expect(args, 1, "is longer than the context");
    snprintf(args, sizeof args, "run -m '%s' -f /nonexistent/prompt.txt -n 2", tu_data(STORIES));
    expect(args, 1, "/nonexistent/prompt.txt");
    remove(pf);
}

/* A header-only GGUF: general.architecture = llama and one tensor `name` of type `type` with n_dims dims ne. */
static void write_header_only(const char *path, uint32_t type, uint32_t n_dims, const uint64_t *ne) {
    uint8_t b[512];
    size_t k = 0;
#define PUT(v, n) do { uint64_t v_ = (v); for (int i_ = 0; i_ < (n); i_++) b[k++] = (uint8_t)(v_ >> (8 * i_)); } while (0)
#define PUTS(str) do { PUT(strlen(str), 8); memcpy(b + k, str, strlen(str)); k += strlen(str); } while (0)
    memcpy(b, "GGUF", 4);
    k = 4;
    PUT(3, 4);       /* version */
    PUT(1, 8);       /* tensors */
    PUT(1, 8);       /* kvs */
    PUTS("general.architecture");
    PUT(8, 4);       /* string */
    PUTS("llama");
    PUTS("blk.0.ffn_up.weight");
    PUT(n_dims, 4);
    for (uint32_t d = 0; d < n_dims; d++) PUT(ne[d], 8);
    PUT(type, 4);
    PUT(0, 8);       /* offset */
    while (k % 32) b[k++] = 0;
#undef PUT
#undef PUTS
    tu_write_file(path, b, k);
}

/* Run the CLI with LD_PRELOAD=the O_DIRECT-refusing shim; returns the exit status, output (stderr too when
 * join_stderr, else stdout only) in *out. */
static int run_nodirect(const char *args, bool join_stderr, char **out) {
    char full[8300];
    snprintf(full, sizeof full, "%s %s", args, join_stderr ? "2>&1" : "2>/dev/null");
    char cmd[8800];
    /* ASan builds: the shim is not the sanitizer runtime, which would insist on coming first */
    snprintf(cmd, sizeof cmd, "env LD_PRELOAD='%s' ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0 '%s' %s",
             FLM_SHIM_NODIRECT, FLM_CLI, full);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0, n;
    char *buf = malloc(cap);
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) len += n;
    buf[len] = 0;
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static size_t count(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Step 3 of issue 12: limits answered clearly. */
static void test_limits(void **state) {
    (void)state;
    char args[8192];
    const char *st = tu_data(STORIES);
    /* a context longer than the model's (stories260K: 2048): it runs, and says what that means */
    snprintf(args, sizeof args, "run -m '%s' -c 4096 -p 'Once upon a time' -n 4", st);
    expect(args, 0, "-c 4096 is longer than the 2048 tokens the model was trained on");
    snprintf(args, sizeof args, "run -m '%s' -c 2048 -p 'Once upon a time' -n 4", st);
    char *out = expect_out(args, 0, NULL);
    assert_null(strstr(out, "longer than"));
    free(out);
    snprintf(args, sizeof args, "run -m '%s' -c 2000000 -p hi -n 4", st);
    expect(args, 2, "bad -c");
    /* -n 0: the prompt is evaluated, nothing generated, and it says so */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 0", st);
    expect(args, 0, "(-n 0: the prompt only)");
    /* -n -1 (llama.cpp, issue 23): until the end of text or a full context; below -1 refused */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n -1 -c 24 --temp 0", st);
    expect(args, 0, "context full (24 tokens)");
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n -2", st);
    expect(args, 2, "bad -n");
    /* absurd thread counts */
    const char *bad_t[] = {"0", "-3", "100000", "1e3", "many"};
    for (int i = 0; i < 5; i++) {
        snprintf(args, sizeof args, "run -m '%s' -t %s -p hi -n 2", st, bad_t[i]);
        expect(args, 2, "bad -t value");
    }
    snprintf(args, sizeof args, "run -m '%s' -t 64 -p hi -n 2", st);
    out = expect_out(args, 0, NULL);
    if (sysconf(_SC_NPROCESSORS_ONLN) < 64) assert_non_null(strstr(out, "-t 64 is more than the"));
    free(out);
    /* --mem values that overflow or are not numbers: refused before anything is opened, saying why */
    const struct { const char *v, *why; } mem[] = {
        {"99999999999999999999", "too large"}, {"17179869184G", "too large"}, {"16E", "unknown unit"},
        {"1e30", "too large"}, {"-5", "negative"}, {"abc", "not a number"}, {"''", "not a number"},
        {"0.5", "less than one byte"}, {"200000%", "a percentage must be"}, {"5X", "unknown unit"},
    };
    for (size_t i = 0; i < sizeof mem / sizeof *mem; i++) {
        snprintf(args, sizeof args, "run -m '%s' --mem %s -p hi -n 2", st, mem[i].v);
        out = expect_out(args, 2, "bad --mem value");
        if (!strstr(out, mem[i].why)) fail_msg("--mem %s: no '%s' in:\n%s", mem[i].v, mem[i].why, out);
        free(out);
    }
    snprintf(args, sizeof args, "run -m '%s' --mem 0 -p hi -n 2", st); /* 0 = no budget */
    expect(args, 0, NULL);
    /* a header-only GGUF claiming shapes whose byte sizes overflow 64-bit arithmetic */
    const struct { uint32_t type, n_dims; uint64_t ne[4]; const char *want; } shapes[] = {
        {0, 1, {1ull << 62}, "overflows"},                      /* f32: 2^64 bytes */
        {0, 3, {1ull << 31, 1ull << 31, 4}, "overflows"},       /* 2^64 elements */
        {0, 2, {32, 1ull << 58}, "overflows"},                  /* 128-byte rows, 2^58 of them */
        {8, 2, {1ull << 40, 1ull << 30}, "overflows"},          /* q8_0 */
        {12, 2, {256, 1ull << 40}, "runs past the end of the file"}, /* fits 64 bits, not the file */
        {0, 4, {0xFFFFFFFFFFFFFFFFull, 1, 1, 1}, "overflows"},
    };
    const char *h = tu_tmp("hdr", ".gguf");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        write_header_only(h, shapes[i].type, shapes[i].n_dims, shapes[i].ne);
        const char *cmds[] = {"run -m '%s' -p hi -n 2", "inspect '%s'", "convert '%s' '%s.flm' --force"};
        for (int c = 0; c < 3; c++) {
            snprintf(args, sizeof args, cmds[c], h, h);
            out = expect_out(args, 1, shapes[i].want);
            assert_non_null(strstr(out, "blk.0.ffn_up.weight"));
            free(out);
        }
    }
    remove(h);

    /* a file system that refuses O_DIRECT: buffered reads, stated once, the same text */
    const char *g = tu_tmp("lim", ".gguf"), *f = tu_tmp("lim", ".flm");
    tiny_model(g, f, false);
    const char *modes[] = {"naive", "hybrid"}, *ios[] = {"uring", "threads"};
    for (int m = 0; m < 2; m++)
        for (int io = 0; io < 2; io++) {
            snprintf(args, sizeof args, "run -m '%s' --mode %s --io %s -p 'Once upon a time' -n 16 --temp 0 --stats", f,
                     modes[m], ios[io]);
            char *plain = expect_out(args, 0, "(O_DIRECT)");
            char *nd = NULL;
            int rc = run_nodirect(args, true, &nd);
            if (rc != 0) fail_msg("%s under the O_DIRECT-refusing shim: exit %d\n%s", args, rc, nd);
            if (count(nd, "O_DIRECT not supported here") != 1)
                fail_msg("%s: the fallback is not stated exactly once:\n%s", args, nd);
            assert_non_null(strstr(nd, "(buffered)"));
            free(plain);
            free(nd);
            /* the same text */
            char *t_plain = NULL, *t_nd = NULL;
            char a2[8300];
            snprintf(a2, sizeof a2, "%s 2>/dev/null", args);
            assert_int_equal(tu_run_cli(a2, &t_plain), 0);
            assert_int_equal(run_nodirect(args, false, &t_nd), 0);
            assert_string_equal(t_plain, t_nd);
            free(t_plain);
            free(t_nd);
        }

    /* two processes reading one .flm at once: both work and agree with a run alone */
    snprintf(args, sizeof args, "run -m '%s' --mode naive -p 'Once upon a time' -n 24 --temp 0 2>/dev/null", f);
    char *alone = NULL;
    assert_int_equal(tu_run_cli(args, &alone), 0);
    const char *o1 = tu_tmp("two", ".txt"), *o2 = tu_tmp("two", ".txt");
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "('%s' run -m '%s' --mode naive -p 'Once upon a time' -n 24 --temp 0 > '%s' 2>/dev/null & "
             "'%s' run -m '%s' --mode hybrid -p 'Once upon a time' -n 24 --temp 0 > '%s' 2>/dev/null & "
             "'%s' verify '%s' >/dev/null 2>&1 & wait %%1 && wait %%2 && wait %%3)", FLM_CLI, f, o1, FLM_CLI, f, o2,
             FLM_CLI, f);
    assert_int_equal(system(cmd), 0);
    size_t l1, l2;
    uint8_t *t1 = tu_read_file(o1, &l1), *t2 = tu_read_file(o2, &l2);
    assert_int_equal(l1, strlen(alone));
    assert_memory_equal(t1, alone, l1);
    assert_int_equal(l2, strlen(alone));
    assert_memory_equal(t2, alone, l2);
    free(t1);
    free(t2);
    free(alone);
    remove(o1);
    remove(o2);
    remove(g);
    remove(f);
}

/* Issue 18: a model path that is a FIFO blocked `flashlm run` forever (the open waited for a writer). Every command
 * that opens a model refuses it by name, in every mode; `timeout` turns a hang into exit 124. A directory likewise. */
static void test_model_not_a_regular_file(void **state) {
    (void)state;
    const char *fifo = tu_tmp("fifo", ".gguf");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const char *cmds[] = {"run -m '%s' -p hi -n 2", "run -m '%s' -p hi -n 2 --mode naive --mem 50%%",
                          "run -m '%s' -p hi -n 2 --mode ram", "perplexity -m '%s' -f /dev/null", "inspect '%s'",
                          "verify '%s'", "convert '%s' /nonexistent/out.flm", "calibrate '%s' --text /dev/null"};
    char args[8192], inner[4096];
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        snprintf(inner, sizeof inner, cmds[i], fifo);
        snprintf(args, sizeof args, "timeout 60 '%s' %s 2>&1", FLM_CLI, inner); /* a hang: exit 124 */
        FILE *p = popen(args, "r");
        assert_non_null(p);
        char out[8192];
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = 0;
        int st = pclose(p);
        int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (rc != 1 || !strstr(out, fifo) || !strstr(out, "is a FIFO"))
            fail_msg("flashlm %s: exit %d; want exit 1 and a refusal naming %s as a FIFO:\n%s", inner, rc, fifo, out);
    }
    remove(fifo);
    const char *dir = tu_tmp("dir", ".gguf");
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2", dir);
    expect(args, 1, "is a directory, not a regular file");
    rmdir(dir);
}

/* Issue 18: a GGUF whose tokenizer.ggml.bos_token_id is outside the vocabulary ran without a word (BOS silently
 * dropped). Now it is an error naming the key and the value; an id inside the vocabulary still runs. */
static void patch_u32_key(const char *dst, const char *key, uint32_t value) {
    size_t len;
    uint8_t *g = tu_read_file(tu_data(STORIES), &len);
    size_t kl = strlen(key);
    uint8_t *at = NULL;
    for (size_t i = 0; i + kl + 8 <= len && !at; i++)
        if (!memcmp(g + i, key, kl)) at = g + i + kl;
    assert_non_null(at);
    uint32_t type;
    memcpy(&type, at, 4);
    assert_int_equal(type, 4); /* GGUF_TYPE_UINT32 */
    memcpy(at + 4, &value, 4);
    tu_write_file(dst, g, len);
    free(g);
}

static void test_special_id_out_of_range(void **state) {
    (void)state;
    const char *bad = tu_tmp("bos", ".gguf");
    char args[8192];
    patch_u32_key(bad, "tokenizer.ggml.bos_token_id", 512); /* stories260K's vocabulary: ids 0 to 511 */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 4", bad);
    char *out = expect_out(args, 1, "tokenizer.ggml.bos_token_id' = 512 is outside the vocabulary (512 tokens");
    assert_non_null(strstr(out, bad));
    free(out);
    patch_u32_key(bad, "tokenizer.ggml.eos_token_id", 4000000000u);
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 4", bad);
    expect(args, 1, "tokenizer.ggml.eos_token_id' = 4000000000 is outside the vocabulary");
    patch_u32_key(bad, "tokenizer.ggml.bos_token_id", 511); /* in range: runs */
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 4 --temp 0", bad);
    expect(args, 0, NULL);
    remove(bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nonfinite_weights),
        cmocka_unit_test(test_interrupted_convert),
        cmocka_unit_test(test_convert_summary),
        cmocka_unit_test(test_rss_within_budget_and_allowance),
        cmocka_unit_test(test_user_papercuts),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_model_not_a_regular_file),
        cmocka_unit_test(test_special_id_out_of_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
