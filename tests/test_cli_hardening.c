/* test_cli_hardening.c — issue 12 as a user meets it: corrupt weights, interrupted writes, limits. Every case ends
 * in a clear message and a non-zero exit (or works), never a crash, a hang, garbage with exit 0 or a file left
 * behind. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "format/flm.h"
#include "format/gguf.h"
#include "testutil.h"

#define STORIES "models/stories260K/stories260K.gguf"
#define TEXT "text/tinystories_sample.txt"

/* Run the CLI with args (stderr joined); fail unless it exits want_rc and its output holds want_text. Returns the
 * output (malloc'd). */
static char *expect_out(const char *args, int want_rc, const char *want_text) {
    char *out = NULL;
    char full[8300];
    snprintf(full, sizeof full, "%s 2>&1", args);
    int rc = tu_run_cli(full, &out);
    if (rc != want_rc) fail_msg("flashlm %s: exit %d, want %d; output:\n%s", args, rc, want_rc, out);
    if (want_text && !strstr(out, want_text)) fail_msg("flashlm %s: output lacks '%s':\n%s", args, want_text, out);
    return out;
}

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
        snprintf(args, sizeof args, "calibrate '%s' --text '%s'", flm, tu_shared(TEXT));
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
        snprintf(args, sizeof args, "run -m '%s' --mode hybrid --mem %dK -c 64 -t 2 -p hi -n 1 --stats 2>&1", f, kib);
        tu_run_cli(args, &out);
        if (strstr(out, "(1 of 3 layers resident)"))
            snprintf(hybrid1, sizeof hybrid1, "hybrid --mem %dK -c 64 -t 2", kib);
        free(out);
    }
    assert_true(hybrid1[0]);
    snprintf(want, sizeof want, "%s: data corrupt in the FFN region of layer 1", f);
    poke_ffn(f, 1, 1, 0x7e, true);
    /* hybrid: without a budget every layer streams; with hybrid1 layer 0 stays resident, 1 and 2 stream */
    const char *modes[] = {"naive", "hybrid", hybrid1, "sparse"};
    for (int m = 0; m < 4; m++)
        for (int t = 0; t < 2; t++) {
            snprintf(args, sizeof args, "run -m '%s' --mode %s -p 'Once upon a time' -n 8 --temp %s", f, modes[m],
                     t ? "0.8" : "0");
            char *out = expect_out(args, 1, want);
            assert_non_null(strstr(out, "flashlm verify"));
            free(out);
        }
    snprintf(args, sizeof args, "perplexity -m '%s' --mode naive -f '%s' -c 32 --chunks 1", f, tu_shared(TEXT));
    expect(args, 1, want);
    /* ram mode reads the region whole at open and checks its checksum */
    snprintf(args, sizeof args, "run -m '%s' --mode ram -p hi -n 2", f);
    expect(args, 1, "FFN region of layer 1: checksum mismatch");
    /* verify names it too */
    snprintf(args, sizeof args, "verify '%s'", f);
    expect(args, 1, "FFN region of layer 1: checksum mismatch");

    /* a GGUF (never checksummed): a NaN in an f32 FFN weight of stories260K */
    size_t len;
    uint8_t *bytes = tu_read_file(tu_shared(STORIES), &len);
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
    snprintf(args, sizeof args, "convert '%s' '%s' --force", tu_shared(STORIES), out);
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
    snprintf(args, sizeof args, "convert '%s' '%s' --force", tu_shared(STORIES), st);
    expect(args, 0, "wrote");
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --tokens 512 --chunk 64", st, tu_shared(TEXT));
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
    expect(args, 0, "allowance for the process itself is 16 MiB");
    remove(g);
    remove(tiny);
    remove(st);
    remove(smol);
}

/* A copy of stories260K whose tokenizer.ggml.token_type is `type` for every token. */
static void write_vocab_typed(const char *out, int32_t type) {
    flm_error err;
    flm_gguf_file *src = NULL;
    assert_int_equal(flm_gguf_open(tu_shared(STORIES), &src, &err), FLM_OK);
    flm_gguf_writer *w = NULL;
    assert_int_equal(flm_gguf_writer_create(out, &w, &err), FLM_OK);
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
    uint8_t *g = tu_read_file(tu_shared(STORIES), &len);
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
    snprintf(args, sizeof args, "run -m '%s' --mem 1K -p hi -n 2", tu_shared(STORIES));
    expect(args, 1, "a memory budget of 1.00 KiB cannot hold");
    remove(tg);
    remove(tf);
    /* run -f FILE: a prompt of any length, from a file or standard input */
    const char *pf = tu_tmp("prompt", ".txt");
    tu_write_file(pf, "Once upon a time", 16);
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 12 --temp 0 2>/dev/null", tu_shared(STORIES));
    char *want = NULL;
    assert_int_equal(tu_run_cli(args, &want), 0);
    snprintf(args, sizeof args, "run -m '%s' -f '%s' -n 12 --temp 0 2>/dev/null", tu_shared(STORIES), pf);
    out = NULL;
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_string_equal(out, want);
    free(out);
    snprintf(args, sizeof args, "run -m '%s' -f - -n 12 --temp 0 2>/dev/null < '%s'", tu_shared(STORIES), pf);
    out = NULL;
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_string_equal(out, want);
    free(out);
    free(want);
    char *big = malloc(400001);
    for (int i = 0; i < 400000; i++) big[i] = "Once upon a time "[i % 17];
    tu_write_file(pf, big, 400000); /* beyond what one argument may hold */
    free(big);
    snprintf(args, sizeof args, "run -m '%s' -f '%s' -n 2", tu_shared(STORIES), pf);
    expect(args, 1, "exceeds the context");
    snprintf(args, sizeof args, "run -m '%s' -f /nonexistent/prompt.txt -n 2", tu_shared(STORIES));
    expect(args, 1, "/nonexistent/prompt.txt");
    remove(pf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nonfinite_weights),
        cmocka_unit_test(test_interrupted_convert),
        cmocka_unit_test(test_convert_summary),
        cmocka_unit_test(test_rss_within_budget_and_allowance),
        cmocka_unit_test(test_user_papercuts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
