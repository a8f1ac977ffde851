/* test_cli_hostile.c — the command line as a newcomer from llama.cpp and then an attacker meet it (the CLI pass of
 * 2026-12-03): llama.cpp's short flags, option errors that give the valid range, prompts given twice, grammar files
 * that never end, outputs into folders that do not exist. Every failure: a message naming the option or file and
 * what is wrong, a non-zero exit, nothing run first and nothing left behind. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include "core/util.h"
#include "format/flm.h"
#include "testutil.h"

#define MODEL "models/stories260K/stories260K.gguf"

static void expect(const char *args, int want_rc, const char *want_text) { free(tu_cli_expect(args, want_rc, want_text)); }

/* The output of `run -m stories260K ARGS -n 12 -p 'Once upon a time' --temp 1.5` (stdout only). */
static char *run_text(const char *extra) {
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "run -m '%s' -n 12 -p 'Once upon a time' --temp 1.5 %s 2>/dev/null", tu_data(MODEL),
             extra);
    assert_int_equal(tu_run_cli(args, &out), 0);
    return out;
}

/* llama.cpp's `-s SEED` was "unknown option"; now it is --seed. Option errors give the range a value must be in
 * (--temp, --top-k, --top-p, -c said only "bad ... value"); --mode's list names hot; --repeat-penalty 0 was taken as
 * "off" without a word (llama.cpp divides by it): refused. */
static void test_llama_flags(void **state) {
    (void)state;
    char *a = run_text("-s 7"), *b = run_text("--seed 7"), *c = run_text("--seed 8");
    assert_string_equal(a, b);
    assert_string_not_equal(a, c); /* the seed was used, not ignored */
    free(a);
    free(b);
    free(c);
    char args[4096];
    const struct { const char *opt, *want; } bad[] = {
        {"--temp -1", "bad --temp value '-1' (0..100; 0: greedy)"},
        {"--top-k x", "bad --top-k value 'x' (0..16777216; 0 or -1: off)"},
        {"--top-p 2", "bad --top-p value '2' (0..1; 1: off)"},
        {"-c -1", "bad -c value '-1' (0..1048576; 0: the default)"},
        {"--io-threads 0", "bad --io-threads value '0' (1..1024)"},
        {"--mode warp", "bad --mode 'warp' (auto|ram|naive|hybrid|sparse|hot)"},
        {"--repeat-penalty 0", "bad --repeat-penalty value '0' (above 0, up to 10; 1: off)"},
        {"-s -2", "bad --seed value '-2'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "run -m '%s' -p hi -n 1 %s 2>&1", tu_data(MODEL), bad[i].opt);
        expect(args, 2, bad[i].want);
    }
    snprintf(args, sizeof args, "chat -m '%s' -s x 2>&1 </dev/null", tu_data(MODEL));
    expect(args, 2, "bad --seed value 'x'");
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 1 -c 0 --repeat-penalty 1.1 2>&1", tu_data(MODEL));
    expect(args, 0, NULL);
}

/* --prompt-ids with -p or -f: one of them was dropped without a word (the ids won). A prompt file that is a folder
 * said only "cannot read text file 'DIR'". */
static void test_prompt_sources(void **state) {
    (void)state;
    char args[4096];
    snprintf(args, sizeof args, "run -m '%s' -p hi --prompt-ids 1,2 -n 1 2>&1", tu_data(MODEL));
    expect(args, 2, "--prompt-ids is the whole prompt: give it, or -p / -f, not both");
    snprintf(args, sizeof args, "run -m '%s' --prompt-ids 1,2 -f '%s' -n 1 2>&1", tu_data(MODEL), tu_data(MODEL));
    expect(args, 2, "--prompt-ids is the whole prompt");
    char dir[4000], want[4200];
    snprintf(dir, sizeof dir, "%s", tu_data("text")); /* tu_data's buffer is reused by the next call */
    snprintf(args, sizeof args, "run -m '%s' -f '%s' -n 1 2>&1", tu_data(MODEL), dir);
    snprintf(want, sizeof want, "cannot read text file '%s': it is a directory", dir);
    expect(args, 1, want);
}

/* -p and -f together: the last one given was the prompt, the other dropped without a word. Now refused, naming both. */
static void test_prompt_and_file(void **state) {
    (void)state;
    char args[8192];
    const char *f = tu_tmp("pf", ".txt");
    tu_write_file(f, "Once", 4);
    snprintf(args, sizeof args, "run -m '%s' -p hi -f '%s' -n 1 2>&1", tu_data(MODEL), f);
    expect(args, 2, "-p gives the prompt and -f");
    snprintf(args, sizeof args, "run -m '%s' -f '%s' -p hi -n 1 2>&1", tu_data(MODEL), f);
    expect(args, 2, "give one of them");
    snprintf(args, sizeof args, "run -m '%s' --prompt-ids '' -n 1 2>&1", tu_data(MODEL));
    expect(args, 1, "--prompt-ids gives no token ids"); /* not the tokenizer's fault */
    remove(f);
}

/* A copy of the fixture GGUF with one u32 hyper-parameter key set to v. */
static void gguf_with_u32(const char *out, const char *key, uint32_t v) {
    size_t n;
    uint8_t *d = tu_read_file(tu_data(MODEL), &n);
    const size_t kl = strlen(key);
    uint8_t pat[64];
    const uint64_t kl64 = kl;
    memcpy(pat, &kl64, 8);
    memcpy(pat + 8, key, kl);
    size_t at = 0;
    for (size_t i = 0; i + 8 + kl + 8 <= n && !at; i++)
        if (!memcmp(d + i, pat, 8 + kl)) at = i + 8 + kl;
    assert_true(at > 0);
    uint32_t type;
    memcpy(&type, d + at, 4);
    assert_int_equal(type, 4); /* GGUF_TYPE_UINT32 */
    memcpy(d + at + 4, &v, 4);
    tu_write_file(out, d, n);
    free(d);
}

/* A GGUF whose block count is below its blk.N tensors ran (and converted) without the last layer, and a RoPE
 * dimension of 0 ran with RoPE switched off: both gave other text with exit 0. Now both are refused naming the file
 * and what is wrong, and convert writes nothing. */
static void test_hparams_against_tensors(void **state) {
    (void)state;
    char args[8192], want[4300];
    const char *g = tu_tmp("bc", ".gguf"), *o = tu_tmp("bc", ".flm");
    gguf_with_u32(g, "llama.block_count", 4); /* stories260K has 5 layers */
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 2>&1", g);
    snprintf(want, sizeof want, "%s: tensor blk.4.", g);
    char *out = tu_cli_expect(args, 1, want);
    assert_non_null(strstr(out, "belongs to layer 4, but llama.block_count says 4 layers"));
    free(out);
    snprintf(args, sizeof args, "convert '%s' '%s' 2>&1", g, o);
    expect(args, 1, "belongs to layer 4");
    assert_int_equal(access(o, F_OK), -1);
    gguf_with_u32(g, "llama.rope.dimension_count", 0);
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 2>&1", g);
    expect(args, 1, "rope dimension 0 must be even, above 0");
    remove(g);
}

/* `run --grammar-file /dev/zero` (or -jf) read until memory ran out; a NUL byte in a grammar file ended the grammar
 * there, the rest dropped without a word. Now at most 1 MiB is read, and a NUL is refused with its offset. */
static void test_grammar_file_bounded(void **state) {
    (void)state;
    char args[4096];
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 1 --grammar-file /dev/zero 2>&1", tu_data(MODEL));
    expect(args, 1, "--grammar-file /dev/zero: longer than 1048576 bytes: not a grammar or JSON schema");
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 1 -jf /dev/zero 2>&1", tu_data(MODEL));
    expect(args, 1, "-jf /dev/zero: longer than 1048576 bytes");
    const char *g = tu_tmp("nul", ".gbnf");
    static const char gram[] = "root ::= \"a\"\0 | \"b\"";
    tu_write_file(g, gram, sizeof gram - 1);
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 1 --grammar-file '%s' 2>&1", tu_data(MODEL), g);
    expect(args, 1, "a NUL byte at offset 12: a grammar or JSON schema is text");
    tu_write_file(g, gram, 12); /* the same grammar without the NUL and what follows: runs */
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 3 --temp 0 --grammar-file '%s' 2>/dev/null", tu_data(MODEL), g);
    expect(args, 0, "hia");
    remove(g);
}

/* An output in a folder that does not exist: `run --stats-json /missing/s.json` generated everything, then failed
 * at its lock ("cannot create the lock /missing/s.json.lock"). Now refused before the model is opened, naming the
 * folder; convert and synth alike; nothing is left. */
static void test_output_folder_missing(void **state) {
    (void)state;
    char args[16384], dir[4096], out[4200];
    snprintf(dir, sizeof dir, "%s", tu_tmp("nodir", ""));
    snprintf(out, sizeof out, "%s/s.json", dir);
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 4 --stats-json '%s' 2>&1", tu_data(MODEL), out);
    char want[8600];
    snprintf(want, sizeof want, "%s: cannot write it: its folder %s: No such file or directory", out, dir);
    char *o = tu_cli_expect(args, 1, want);
    assert_null(strstr(o, "Once upon a time")); /* refused before anything ran */
    assert_null(strstr(o, "flashlm: model "));
    free(o);
    snprintf(out, sizeof out, "%s/m.flm", dir);
    snprintf(args, sizeof args, "convert '%s' '%s' 2>&1", tu_data(MODEL), out);
    expect(args, 1, "cannot write it: its folder");
    snprintf(out, sizeof out, "%s/m.gguf", dir);
    snprintf(args, sizeof args, "synth '%s' --d-model 64 --d-ffn 128 --layers 1 --heads 2 --vocab 300 2>&1", out);
    expect(args, 1, "cannot write it: its folder");
    struct stat st;
    assert_int_not_equal(stat(dir, &st), 0); /* nothing was made on the way */
    /* a folder that exists: written as before */
    snprintf(out, sizeof out, "%s", tu_tmp("stats", ".json"));
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 --stats-json '%s' 2>&1", tu_data(MODEL), out);
    expect(args, 0, "statistics written to");
    assert_int_equal(stat(out, &st), 0);
    assert_false(tu_temp_left(out));
    remove(out);
}

/* `calibrate --tokens 64` (the default --chunk is 128) recorded no whole chunk and said "the text gives 576 tokens;
 * at least 128 are needed", blaming a text long enough. Now the options are named, before anything runs; the model
 * is untouched. */
static void test_calibrate_tokens_chunk(void **state) {
    (void)state;
    char args[8192], model[4096];
    snprintf(model, sizeof model, "%s", tu_tmp("cal", ".flm"));
    snprintf(args, sizeof args, "convert '%s' '%s' 2>&1", tu_data(MODEL), model);
    expect(args, 0, "wrote");
    size_t len0, len1;
    uint8_t *before = tu_read_file(model, &len0);
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --tokens 64 2>&1", model,
             tu_data("text/tinystories_sample.txt"));
    expect(args, 2, "--tokens 64 is less than one chunk (--chunk 128): raise --tokens or lower --chunk");
    uint8_t *after = tu_read_file(model, &len1);
    assert_int_equal(len0, len1);
    assert_memory_equal(before, after, len0);
    assert_false(tu_temp_left(model));
    free(before);
    free(after);
    remove(model);
}

/* `chat < /dev/zero` ran for ever: a line too long for the context is refused and skipped to its end, and this one
 * has none. A too-long line with a NUL byte is binary: chat stops at once with exit 1; a short NUL line is still
 * refused as a turn and the conversation goes on. A read error on standard input is one too. */
static void test_chat_endless_binary_line(void **state) {
    (void)state;
    char args[8192];
    snprintf(args, sizeof args, "chat -m '%s' -n 2 -c 64 < /dev/zero 2>&1", tu_data(MODEL));
    expect(args, 1, "flashlm: standard input: a line of more than ");
    const char *in = tu_tmp("chat", ".txt");
    static const char lines[] = "a\0b\nOnce upon a time\n";
    tu_write_file(in, lines, sizeof lines - 1);
    snprintf(args, sizeof args, "chat -m '%s' -n 2 -c 64 --temp 0 < '%s' 2>&1", tu_data(MODEL), in);
    char *out = tu_cli_expect(args, 1, "this turn has a NUL byte at byte 1");
    assert_non_null(strstr(out, "1 replies"));
    free(out);
    remove(in);
    /* standard input that cannot be read (a folder) ended the chat as its end would, exit 0 */
    char dir[4000];
    snprintf(dir, sizeof dir, "%s", tu_data("text"));
    snprintf(args, sizeof args, "chat -m '%s' -n 2 < '%s' 2>&1", tu_data(MODEL), dir);
    expect(args, 1, "flashlm: cannot read standard input: Is a directory");
}

/* perplexity -c: 0 (the default elsewhere) and 1..3 loaded the model, then said "chunk of 0 tokens must be in [4,
 * context 2048]"; now 0 is the chunk's default (128) and fewer than 4 tokens are refused before anything loads. */
static void test_perplexity_chunk(void **state) {
    (void)state;
    char args[8192], text[4096];
    snprintf(text, sizeof text, "%s", tu_data("text/tinystories_sample.txt"));
    snprintf(args, sizeof args, "perplexity -m '%s' -f '%s' -c 0 --chunks 1 2>&1", tu_data(MODEL), text);
    expect(args, 0, "(1 chunks of 128)");
    snprintf(args, sizeof args, "perplexity -m '%s' -f '%s' -c 3 2>&1", tu_data(MODEL), text);
    char *out = tu_cli_expect(args, 2, "perplexity: -c 3: a chunk needs at least 4 tokens");
    assert_null(strstr(out, "flashlm: model ")); /* said before the model was opened */
    free(out);
}

/* bench --text: a folder, /dev/zero, an empty or too short file ran every mode on random ids (the filler for "no
 * text") and exited 0; a bench whose every run was skipped (a GGUF asked for naive) exited 0 with a table of
 * "skipped" rows. Now the text is checked before any run, a short one is each run's error, and nothing measured is
 * exit 1. */
static void test_bench_text_and_nothing_run(void **state) {
    (void)state;
    char args[8192], dir[4000], model[4096];
    snprintf(dir, sizeof dir, "%s", tu_data("text"));
    snprintf(model, sizeof model, "%s", tu_data(MODEL));
    const struct { const char *text, *want; } bad[] = {
        {"/dev/zero", "--text /dev/zero: a NUL byte in its first 64 KiB: not a text file"},
        {dir, ": it is a directory"},
        {"/nonexistent/t.txt", "--text /nonexistent/t.txt: cannot open it: No such file or directory"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "bench -m '%s' --modes ram --gen-tokens 2 --text '%s' 2>&1", model, bad[i].text);
        char *out = tu_cli_expect(args, 1, bad[i].want);
        assert_null(strstr(out, "flashlm bench: ram ...")); /* before any run */
        free(out);
    }
    const char *t = tu_tmp("short", ".txt");
    tu_write_file(t, "Once", 4);
    snprintf(args, sizeof args, "bench -m '%s' --modes ram --gen-tokens 2 --text '%s' 2>&1", model, t);
    char *out = tu_cli_expect(args, 1, "fewer than --prompt-tokens 16");
    assert_non_null(strstr(out, "no run measured anything"));
    free(out);
    snprintf(args, sizeof args, "bench -m '%s' --modes ram --gen-tokens 2 --prompt-tokens 2 --text '%s' 2>&1", model,
             t);
    expect(args, 0, "| ram |");
    remove(t);
    /* nothing measured: no --json or --svg written either (they had only the skipped rows) */
    const char *js = tu_tmp("nothing", ".json"), *svg = tu_tmp("nothing", ".svg");
    snprintf(args, sizeof args, "bench -m '%s' --modes naive --gen-tokens 2 --json '%s' --mem 50%%,40%% --svg '%s' "
             "2>&1", model, js, svg);
    expect(args, 1, "flashlm bench: no run measured anything (each one skipped: see why above); nothing written");
    assert_int_equal(access(js, F_OK), -1);
    assert_int_equal(access(svg, F_OK), -1);
}

/* Options the run does not use were dropped without a word: --keep without --context-shift, sparse's --window,
 * --sparse-level and ablations in another mode. Now each gets a note (the run goes on, as llama.cpp's would). */
static void test_unused_options_noted(void **state) {
    (void)state;
    char args[8192];
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 --keep 5 2>&1", tu_data(MODEL));
    expect(args, 0, "flashlm: note: --keep only matters with --context-shift, which is off");
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 --window 3 2>&1", tu_data(MODEL));
    expect(args, 0, "flashlm: note: --window is an option of mode sparse; this run is mode ram, which does not use it");
    snprintf(args, sizeof args, "chat -m '%s' -n 2 --no-bundle --keep 1 2>&1 </dev/null", tu_data(MODEL));
    char *out = tu_cli_expect(args, 0, "note: --no-bundle is an option of mode sparse");
    assert_non_null(strstr(out, "note: --keep only matters"));
    free(out);
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 --keep 1 --context-shift 2>&1", tu_data(MODEL));
    out = tu_cli_expect(args, 0, NULL);
    assert_null(strstr(out, "note:"));
    free(out);
}

/* --draft-self on a run that streams nothing said only "a self-draft needs the target in mode hot with neurons
 * streamed, and no draft model"; now it names the file, the mode it runs and what is missing (a budget). */
static void test_draft_self_says_why(void **state) {
    (void)state;
    char args[8192], flm[4096];
    snprintf(flm, sizeof flm, "%s", tu_tmp("self", ".flm"));
    snprintf(args, sizeof args, "convert '%s' '%s' 2>&1", tu_data(MODEL), flm);
    expect(args, 0, "wrote");
    char want[8300];
    snprintf(want, sizeof want, "flashlm: --draft-self: %s runs mode hot without a budget (--mem), so nothing is read",
             flm);
    snprintf(args, sizeof args, "run -m '%s' --draft-self -p x -n 2 2>&1", flm);
    expect(args, 1, want);
    snprintf(args, sizeof args, "run -m '%s' --draft-self --mode ram -p x -n 2 2>&1", flm);
    expect(args, 1, "runs mode ram, so nothing is read from flash for a self-draft to save");
    remove(flm);
}

/* A region entry's flags (docs/FORMAT.md: at most one order bit, other bits zero) were never checked: an FFN region
 * with unknown bits, or both orders, ran and passed `verify` (header checksum recomputed, as a newer writer or a
 * forger would). Now refused by name, everywhere the file is opened. */
static void test_ffn_flags_checked(void **state) {
    (void)state;
    char args[8192], flm[4096];
    snprintf(flm, sizeof flm, "%s", tu_tmp("flags", ".flm"));
    snprintf(args, sizeof args, "convert '%s' '%s' 2>&1", tu_data(MODEL), flm);
    expect(args, 0, "wrote");
    size_t len;
    uint8_t *p = tu_read_file(flm, &len);
    const uint64_t bad[] = {4, FLM_FFN_HOT_ORDER | FLM_FFN_COACT_ORDER, 1ull << 63};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        uint8_t *e = p + FLM_HEADER_FIXED + FLM_REGION_ENTRY_BYTES * 2; /* layer 1's FFN region (entry 0: resident) */
        assert_int_equal(flm_get_u32(e), FLM_REGION_FFN);
        assert_int_equal(flm_get_u32(e + 4), 1);
        uint64_t was = flm_get_u64(e + 56);
        flm_put_u64(e + 56, bad[k]);
        uint32_t hb = flm_get_u32(p + 32);
        flm_put_u64(p + 24, XXH64(p + 32, hb - 32, 0));
        tu_write_file(flm, p, len);
        char want[256];
        snprintf(want, sizeof want, "FFN region of layer 1: flags 0x%llx (known: 0x1 hot order or 0x2 co-activation "
                 "order, at most one)", (unsigned long long)bad[k]);
        snprintf(args, sizeof args, "verify '%s' 2>&1", flm);
        expect(args, 1, want);
        snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 --mode naive 2>&1", flm);
        expect(args, 1, want);
        flm_put_u64(e + 56, was);
    }
    /* a region whose types do not make its records (layer 1 said ungated): `plan` printed a plan, exit 0, for a
     * file run refuses; now both refuse it alike */
    uint8_t *e = p + FLM_HEADER_FIXED + FLM_REGION_ENTRY_BYTES * 2;
    const uint32_t gate = flm_get_u32(e + 36);
    flm_put_u32(e + 36, FLM_GATE_NONE);
    flm_put_u64(p + 24, XXH64(p + 32, flm_get_u32(p + 32) - 32, 0));
    tu_write_file(flm, p, len);
    const char *cmds[] = {"plan -m '%s' --mem 50%% 2>&1", "run -m '%s' -p hi -n 2 --mode naive 2>&1"};
    for (int c = 0; c < 2; c++) {
        snprintf(args, sizeof args, cmds[c], flm);
        expect(args, 1, "FFN region of layer 1: 172 records of");
    }
    flm_put_u32(e + 36, gate);
    flm_put_u64(p + 24, XXH64(p + 32, flm_get_u32(p + 32) - 32, 0));
    tu_write_file(flm, p, len); /* as converted: fine again */
    snprintf(args, sizeof args, "verify '%s' 2>&1", flm);
    expect(args, 0, "all checksums match");
    free(p);
    remove(flm);
}

/* A GGUF truncated while `convert` read it (a model rewritten in place): a bare "Bus error", exit 135, and convert's
 * half-written OUT.flm.tmp.XXXXXX (382 MB for Qwen2.5-Coder-0.5B) and OUT.flm.lock left behind. Now the SIGBUS
 * handler removes them, names the model and exits 1. The truncation is a race; here the test holds convert at its
 * commit (the writer's test hook FLASHLM_TEST_COMMIT_WAIT: the temporary complete, the lock held) and sends the
 * SIGBUS a truncated mapping raises. */
static void test_sigbus_cleans_up(void **state) {
    (void)state;
    char fifo[4096], out[4096], log[4096], cmd[16384];
    snprintf(fifo, sizeof fifo, "%s", tu_tmp("bus", ".fifo"));
    snprintf(out, sizeof out, "%s", tu_tmp("bus", ".flm"));
    snprintf(log, sizeof log, "%s", tu_tmp("bus", ".log"));
    assert_int_equal(mkfifo(fifo, 0600), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("FLASHLM_TEST_COMMIT_WAIT", fifo, 1);
        snprintf(cmd, sizeof cmd, "exec '%s' convert '%s' '%s' >'%s' 2>&1", FLM_CLI, tu_data(MODEL), out, log);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int fd = -1, status = 0;
    while ((fd = open(fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC)) < 0) { /* open once the hook waits on it */
        assert_int_not_equal(waitpid(pid, &status, WNOHANG), pid);
        usleep(2000);
    }
    assert_true(tu_temp_left(out)); /* the temporary and the lock, as a truncation mid-convert finds them */
    assert_int_equal(kill(pid, SIGBUS), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(fd);
    unlink(fifo);
    size_t len;
    char *text = (char *)tu_read_file(log, &len);
    text = realloc(text, len + 1);
    text[len] = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 1 ||
        !strstr(text, "the file ended while flashlm read it through a mapping (SIGBUS): it was truncated or rewritten "
                      "in place while in use"))
        fail_msg("convert on SIGBUS: status %d, output:\n%s", status, text);
    assert_non_null(strstr(text, tu_data(MODEL)));
    assert_false(tu_temp_left(out));
    struct stat st;
    assert_int_not_equal(stat(out, &st), 0);
    free(text);
    remove(log);
}

/* llama.cpp's -p takes escapes (-e, on by default): `-p 'Q:\nA:'` was the 6 bytes Q : \ n A : here and the 5 bytes
 * with a newline there, so the same command gave other tokens than llama.cpp's. Its -f drops one final newline
 * (a file written by an editor ends in one). Also its names --predict (-n) and -sys / --system-prompt (--system). */
static void test_llama_prompt_compat(void **state) {
    (void)state;
    char args[8192], *out = NULL;
    snprintf(args, sizeof args, "run -m '%s' -p 'Once\\nupon\\x41\\q' -n 0 2>/dev/null", tu_data(MODEL));
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_string_equal(out, "Once\nuponA\\q\n"); /* the prompt echoed: \n and \x41 processed, \q kept */
    free(out);
    snprintf(args, sizeof args, "run -m '%s' -p 'Once\\nupon' --no-escape -n 0 2>/dev/null", tu_data(MODEL));
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_string_equal(out, "Once\\nupon\n");
    free(out);
    snprintf(args, sizeof args, "run -m '%s' -p 'a\\x00b' -n 0 2>&1", tu_data(MODEL));
    expect(args, 2, "-p: its \\x00 escape would end the prompt there");
    /* -f: one final newline dropped, as llama.cpp: the same text as -p without it */
    const char *f = tu_tmp("nl", ".txt");
    tu_write_file(f, "Once upon a time\n", 17);
    char *a = NULL, *b = NULL;
    snprintf(args, sizeof args, "run -m '%s' -f '%s' -n 12 --temp 0 2>/dev/null", tu_data(MODEL), f);
    assert_int_equal(tu_run_cli(args, &a), 0);
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' --predict 12 --temp 0 2>/dev/null", tu_data(MODEL));
    assert_int_equal(tu_run_cli(args, &b), 0);
    assert_string_equal(a, b);
    free(a);
    free(b);
    remove(f);
    /* and the chat format line says the system prompt given is the one used (it named only the template's own) */
    snprintf(args, sizeof args, "run -m '%s' -sys 'Be brief' --system-prompt 'Be brief' -p hi -n 1 2>&1", tu_data(MODEL));
    expect(args, 0, "; system prompt from --system");
    /* llama-cli's shape, options first: said what to do instead of "unknown command '-m'" */
    snprintf(args, sizeof args, "-m '%s' -p hi 2>&1", tu_data(MODEL));
    expect(args, 2, "'-m' is an option, not a command: put the command first, e.g. `flashlm run -m ...`");
}

/* Invalid UTF-8 was dropped by the tokenizer without a word: --system $'\xff\xfe' ran as --system '', a chat line
 * "a\xffb" as "ab", run -p $'a\xffb' as "ab". Now refused: --system and -p before the model loads (exit 2); a chat
 * line is refused as a NUL line is (named by its line number) and the conversation goes on (exit 1). */
static void test_not_utf8_refused(void **state) {
    (void)state;
    char args[8192];
    snprintf(args, sizeof args, "chat -m '%s' -n 1 --system \"$(printf 'ok\\377\\376')\" </dev/null", tu_data(MODEL));
    expect(args, 2, "flashlm: --system: byte 0xFF at offset 2 is not UTF-8: a system prompt is text");
    snprintf(args, sizeof args, "run -m '%s' -n 1 -p \"$(printf 'a\\377b')\"", tu_data(MODEL));
    expect(args, 2, "flashlm: -p: byte 0xFF at offset 1 is not UTF-8: a prompt is text");
    snprintf(args, sizeof args, "run -m '%s' -n 1 -p hi --system \"$(printf '\\300\\200')\"", tu_data(MODEL));
    expect(args, 2, "flashlm: --system: byte 0xC0 at offset 0 is not UTF-8"); /* an overlong NUL */
    const char *in = tu_tmp("utf8", ".txt");
    static const char lines[] = "a\xff" "b\nOnce upon a time\n";
    tu_write_file(in, lines, sizeof lines - 1);
    snprintf(args, sizeof args, "chat -m '%s' -n 2 -c 64 --temp 0 < '%s'", tu_data(MODEL), in);
    char *out = tu_cli_expect(args, 1, "flashlm: line 1: byte 0xFF at byte 1 is not UTF-8: a prompt is text, not sent");
    assert_non_null(strstr(out, "1 replies"));
    free(out);
    /* well-formed multi-byte text is still a turn */
    static const char ok[] = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n";
    tu_write_file(in, ok, sizeof ok - 1);
    out = tu_cli_expect(args, 0, "1 replies");
    free(out);
    remove(in);
}

/* Chat's commands: "/help", "/unknown", "/reset extra" and " /exit" went to the model as user text without a word.
 * Now /help and /? list the commands; any other line beginning with / and a letter (after blanks) is refused (exit
 * 1) and not sent; "//" escapes a line that begins with /. /exit and /reset work as before. */
static void test_chat_commands(void **state) {
    (void)state;
    char args[8192];
    const char *in = tu_tmp("cmds", ".txt");
    static const char lines[] = "/help\n/?\n/unknown\n/reset extra\n /exit\n//Once upon a time\n/reset\n/exit\nafter\n";
    tu_write_file(in, lines, sizeof lines - 1);
    snprintf(args, sizeof args, "chat -m '%s' -n 2 -c 64 --temp 0 < '%s'", tu_data(MODEL), in);
    char *out = tu_cli_expect(args, 1, "flashlm: commands: /exit ends, /reset starts a new conversation, /help (or /?)");
    const char *want[] = {"line 3: '/unknown' is not a command: not sent; commands: /exit ends",
                          "line 4: '/reset extra' is not a command: not sent",
                          "line 5: ' /exit' is not a command (a command is the whole line, without spaces): not sent",
                          "new conversation", "1 replies"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strstr(out, want[i])) fail_msg("chat output lacks '%s':\n%s", want[i], out);
    const char *h = strstr(out, "flashlm: commands:");
    assert_non_null(strstr(h + 1, "flashlm: commands:")); /* /? as /help */
    free(out);
    /* only known commands and //: the exit status stays 0 */
    static const char fine[] = "/help\n//Once\n/reset\n/exit\n";
    tu_write_file(in, fine, sizeof fine - 1);
    out = tu_cli_expect(args, 0, "1 replies");
    free(out);
    snprintf(args, sizeof args, "chat --help");
    expect(args, 0, "begin it with // to send it from its second /");
    remove(in);
}

/* --chat-template-file on a FIFO blocked for ever (waiting for a writer): refused by name, as a model path is. */
static void test_template_file_fifo(void **state) {
    (void)state;
    char args[8192];
    const char *fifo = tu_tmp("tplfifo", "");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    snprintf(args, sizeof args, "chat -m '%s' --chat-template-file '%s' </dev/null", tu_data(MODEL), fifo);
    char want[4200];
    snprintf(want, sizeof want, "--chat-template-file %s: is a FIFO (named pipe), not a regular file", fifo);
    expect(args, 1, want);
    snprintf(args, sizeof args, "run -m '%s' -p hi --chat-template-file '%s'", tu_data(MODEL), fifo);
    expect(args, 1, want);
    remove(fifo);
}

/* A prompt whose text gives no tokens ran as BOS alone ("prompt 1 tokens", exit 0): the check for no tokens counted
 * BOS. Now the text's own tokens are counted, in run (also --chat) and for a chat line; -p '' still starts from BOS. */
static void test_prompt_no_text_tokens(void **state) {
    (void)state;
    char args[16384], hf[4000], tok[4000];
    snprintf(hf, sizeof hf, "%s", tu_data("hf-tiny/opt-125m-style"));
    snprintf(tok, sizeof tok, "%s", tu_data("hf-tiny/tokenizer"));
    const char *model = tu_tmp("notok", ".flm");
    char m[4000];
    snprintf(m, sizeof m, "%s", model);
    snprintf(args, sizeof args, "convert '%s' '%s' --tokenizer '%s'", hf, m, tok);
    free(tu_cli_expect(args, 0, NULL));
    snprintf(args, sizeof args, "run -m '%s' -p 'Hello world' -n 3", m);
    expect(args, 1, "flashlm: the prompt gives no tokens (this tokenizer drops all of its bytes)");
    snprintf(args, sizeof args, "run -m '%s' -p 'Hello world' --chat-template chatml -n 3", m);
    expect(args, 1, "flashlm: the prompt gives no tokens (this tokenizer drops all of its bytes)");
    snprintf(args, sizeof args, "run -m '%s' -p '' -n 3", m);
    expect(args, 0, "prompt        1 tokens"); /* no prompt: BOS, as before */
    const char *in = tu_tmp("notok", ".txt");
    tu_write_file(in, "Hello world\n", 12);
    snprintf(args, sizeof args, "chat -m '%s' --chat-template chatml -n 3 < '%s'", m, in);
    char *out = tu_cli_expect(args, 1, "flashlm: line 1: this turn gives no tokens (this tokenizer drops all of its "
                                       "bytes): not sent");
    assert_non_null(strstr(out, "0 replies"));
    free(out);
    remove(in);
    remove(m);
}

/* chat --context-shift refused a 100 KB line with the message of a turn longer than the context ("raise -c"), while
 * a 2 KB turn of more tokens than the context was shifted: the bound is on the bytes read and held, so the message
 * now says it holds with --context-shift too (and --help says so). */
static void test_chat_shift_line_bound(void **state) {
    (void)state;
    char args[8192];
    const char *in = tu_tmp("shiftline", ".txt");
    size_t n = 1u << 20;
    char *big = malloc(n + 1);
    assert_non_null(big);
    memset(big, 'a', n);
    big[n] = '\n';
    tu_write_file(in, big, n + 1);
    free(big);
    snprintf(args, sizeof args, "chat -m '%s' -n 2 -c 64 --temp 0 --context-shift < '%s'", tu_data(MODEL), in);
    char *out = tu_cli_expect(args, 1, "flashlm: line 1: this turn is longer than ");
    assert_non_null(strstr(out, "bytes, the most a turn may be, also with --context-shift (from the context of 64 "
                                "tokens at up to "));
    free(out);
    snprintf(args, sizeof args, "chat --help");
    expect(args, 0, "a longer line is refused");
    remove(in);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_flags),
        cmocka_unit_test(test_prompt_sources),
        cmocka_unit_test(test_prompt_and_file),
        cmocka_unit_test(test_hparams_against_tensors),
        cmocka_unit_test(test_grammar_file_bounded),
        cmocka_unit_test(test_output_folder_missing),
        cmocka_unit_test(test_calibrate_tokens_chunk),
        cmocka_unit_test(test_chat_endless_binary_line),
        cmocka_unit_test(test_perplexity_chunk),
        cmocka_unit_test(test_bench_text_and_nothing_run),
        cmocka_unit_test(test_unused_options_noted),
        cmocka_unit_test(test_draft_self_says_why),
        cmocka_unit_test(test_ffn_flags_checked),
        cmocka_unit_test(test_sigbus_cleans_up),
        cmocka_unit_test(test_llama_prompt_compat),
        cmocka_unit_test(test_not_utf8_refused),
        cmocka_unit_test(test_chat_commands),
        cmocka_unit_test(test_template_file_fifo),
        cmocka_unit_test(test_prompt_no_text_tokens),
        cmocka_unit_test(test_chat_shift_line_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
