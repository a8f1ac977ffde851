/* test_harden.c — issue 23, "nothing overwritten, nothing unbounded": the checked writer of every output file
 * (src/core/files.c), two writers of one path, bounded prompt input, write errors on standard output, and the small
 * items found with them. Each case failed before its fix. Small models only (stories260K, synthetic): seconds. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include "core/util.h"
#include "flashlm.h"
#include "flashlm_tools.h"
#include "format/flm.h"
#include "testutil.h"

#pragma GCC diagnostic ignored "-Wformat-truncation" /* paths in fixed buffers: ours are short */
#define STORIES "models/stories260K/stories260K.gguf"

/* Run the CLI with args (stderr joined); fail unless it exits want_rc and its output holds want_text. Returns the
 * output (malloc'd). */
static char *expect_out(const char *args, int want_rc, const char *want_text) { return tu_cli_expect(args, want_rc, want_text); }

static void expect(const char *args, int want_rc, const char *want_text) { free(expect_out(args, want_rc, want_text)); }

static long long file_size(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 ? (long long)st.st_size : -1;
}

/* stories260K converted into a fresh .flm; its path (static). */
static const char *stories_flm(void) {
    static char flm[4096];
    if (!flm[0]) {
        snprintf(flm, sizeof flm, "%s", tu_tmp("stories", ".flm"));
        char args[8192];
        snprintf(args, sizeof args, "convert '%s' '%s'", tu_data(STORIES), flm);
        expect(args, 0, "wrote");
    }
    return flm;
}

/* 1. Every output option refuses the model being read, a device, a link and an existing file without --force. */
static void test_outputs_checked(void **state) {
    (void)state;
    const char *flm = stories_flm();
    long long size = file_size(flm);
    char args[8192];
    /* the model itself: before, `run --stats-json MODEL` exited 0 and the model was 1.7 KB of JSON */
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 --stats-json '%s' --force", flm, flm);
    expect(args, 1, "is the model being read");
    snprintf(args, sizeof args, "bench -m '%s' --modes ram --gen-tokens 2 --prompt-tokens 2 --json '%s' --force", flm,
             flm);
    expect(args, 1, "is the model being read");
    snprintf(args, sizeof args, "perplexity -m '%s' -f '%s' --curve --svg '%s' --force", flm,
             tu_data("text/tinystories_sample.txt"), flm);
    expect(args, 1, "is the model being read");
    assert_true(file_size(flm) == size);
    snprintf(args, sizeof args, "verify '%s'", flm);
    expect(args, 0, "all checksums match");
    /* a device, a link (to a file: it is neither replaced nor written through) */
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 --stats-json /dev/null", flm);
    expect(args, 1, "is a character device, not a regular file");
    const char *target = tu_tmp("target", ".json"), *link = tu_tmp("link", ".json");
    tu_write_file(target, "keep", 4);
    assert_int_equal(symlink(target, link), 0);
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 --stats-json '%s' --force", flm, link);
    expect(args, 1, "is a symbolic link");
    struct stat st;
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_true(file_size(target) == 4);
    /* an existing file: only with --force */
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 --stats-json '%s'", flm, target);
    expect(args, 1, "already exists; use --force");
    assert_true(file_size(target) == 4);
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 --stats-json '%s' --force", flm, target);
    expect(args, 0, "statistics written");
    size_t len;
    char *json = (char *)tu_read_file(target, &len);
    assert_non_null(strstr(json, "\"n_tokens\""));
    free(json);
    assert_false(tu_temp_left(target));
    snprintf(args, sizeof args, "bench -m '%s' --modes ram --gen-tokens 2 --prompt-tokens 2 --json '%s'", flm, target);
    expect(args, 1, "already exists; use --force");
    remove(link);
    remove(target);
}

/* 1. The writer itself: one writer per path (the lock), unique temporaries, no replacement without the flag even of
 * a file that appears while writing, and nothing left behind. */
static void test_writer_api(void **state) {
    (void)state;
    const char *path = tu_tmp("w", ".bin");
    flm_out *a = NULL, *b = NULL;
    flm_error err;
    assert_int_equal(flm_out_open(path, NULL, 0, &a, &err), FLM_OK);
    assert_int_equal(flm_out_open(path, NULL, FLM_OUT_REPLACE, &b, &err), FLM_ERR_IO);
    assert_non_null(strstr(err.msg, "another flashlm is writing this file"));
    assert_null(b);
    assert_int_equal(write(flm_out_fd(a), "abc", 3), 3);
    assert_true(strncmp(flm_out_temp(a), path, strlen(path)) == 0);
    tu_write_file(path, "someone else's", 14); /* appears meanwhile: not replaced without FLM_OUT_REPLACE */
    assert_int_equal(flm_out_commit(a, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "already exists"));
    assert_true(file_size(path) == 14);
    assert_false(tu_temp_left(path));
    /* with it: replaced, and the lock is free again for the next writer */
    assert_int_equal(flm_out_open(path, NULL, FLM_OUT_REPLACE, &a, &err), FLM_OK);
    fputs("new", flm_out_stream(a));
    assert_int_equal(flm_out_commit(a, &err), FLM_OK);
    assert_true(file_size(path) == 3);
    assert_false(tu_temp_left(path));
    /* the source itself is refused unless FLM_OUT_SELF; an abort leaves nothing */
    assert_int_equal(flm_out_open(path, path, FLM_OUT_REPLACE, &a, &err), FLM_ERR_ARG);
    assert_int_equal(flm_out_open(path, path, FLM_OUT_REPLACE | FLM_OUT_SELF, &a, &err), FLM_OK);
    flm_out_abort(a);
    assert_true(file_size(path) == 3);
    assert_false(tu_temp_left(path));
    remove(path);
}

/* 2. Two converts to one output at once: before, both wrote OUT.tmp (no O_EXCL), one said "wrote" and verify found a
 * checksum mismatch. Now each has its own temporary and the second is refused while the first holds the lock: the
 * file verifies, every process either wrote it or said why not. A synthetic model of ~25 MB (0.1 s to convert) makes them overlap. */
static void test_concurrent_converts(void **state) {
    (void)state;
    const char *gguf = tu_tmp("big", ".gguf"), *out = tu_tmp("conc", ".flm");
    char args[8192];
    snprintf(args, sizeof args, "synth '%s' --d-model 256 --d-ffn 1024 --layers 6 --heads 4 --vocab 300 --type f32",
             gguf);
    expect(args, 0, NULL);
    for (int round = 0; round < 3; round++) {
        char log1[4096], log2[4096];
        snprintf(log1, sizeof log1, "%s", tu_tmp("c1", ".log"));
        snprintf(log2, sizeof log2, "%s", tu_tmp("c2", ".log"));
        snprintf(args, sizeof args, "'%s' convert '%s' '%s' --force >'%s' 2>&1 & '%s' convert '%s' '%s' --force "
                 ">'%s' 2>&1 & wait", FLM_CLI, gguf, out, log1, FLM_CLI, gguf, out, log2);
        assert_int_equal(system(args), 0);
        int wrote = 0;
        const char *logs[2] = {log1, log2};
        for (int k = 0; k < 2; k++) {
            size_t len;
            char *t = (char *)tu_read_file(logs[k], &len);
            if (strstr(t, "flashlm: wrote")) wrote++;
            else if (!strstr(t, "another flashlm is writing this file")) fail_msg("convert %d said:\n%s", k, t);
            free(t);
            remove(logs[k]);
        }
        assert_true(wrote >= 1);
        snprintf(args, sizeof args, "verify '%s'", out);
        expect(args, 0, "all checksums match");
        assert_false(tu_temp_left(out));
    }
    remove(out);
    remove(gguf);
}

/* 6. Write errors on standard output: before, `run > /dev/full` (and chat, inspect, pull --list) exited 0 in
 * silence, and with SIGPIPE ignored a closed pipe did not stop generation. */
static void test_stdout_errors(void **state) {
    (void)state;
    if (access("/dev/full", W_OK) != 0) skip();
    const char *m = tu_data(STORIES);
    char args[8192];
    const char *hello = tu_tmp("hello", ".txt");
    tu_write_file(hello, "hello\n", 6);
    const char *cmds[] = {"run -m '%s' -p hi -n 8", "run -m '%s' -p hi -n 8 --print-ids", "inspect '%s'",
                          "pull --list", "chat -m '%s' -n 4 --chat-template chatml <'%s'"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char inner[4200], full[8400];
        snprintf(inner, sizeof inner, cmds[i], m, hello);
        snprintf(full, sizeof full, "%s 2>&1 >/dev/full", inner); /* stderr to the test, stdout to a full disk */
        char *out = NULL;
        int rc = tu_run_cli(full, &out);
        if (rc != 1 || !strstr(out, "cannot write the standard output"))
            fail_msg("flashlm %s >/dev/full: exit %d; want 1 and the write error:\n%s", inner, rc, out);
        free(out);
    }
    remove(hello);
    /* EPIPE with SIGPIPE ignored: generation stops at once (before: all 100000 tokens, minutes) */
    const char *log = tu_tmp("pipe", ".log");
    snprintf(args, sizeof args, "trap '' PIPE; timeout 120 '%s' run -m '%s' -p hi -n 100000 -c 256 --context-shift "
             "--temp 1 2>'%s' | head -c 8 >/dev/null", FLM_CLI, m, log);
    assert_int_equal(system(args), 0);
    size_t len;
    char *t = (char *)tu_read_file(log, &len);
    if (!strstr(t, "cannot write the standard output: Broken pipe")) fail_msg("run into a closed pipe said:\n%s", t);
    free(t);
    remove(log);
}

/* 5. Prompt input bounded by the context: before, `run -f /dev/zero --mem 100M` grew to 8 GB and never ended, and a
 * 20 MB chat line was held whole. Now at most n_ctx x (the longest vocabulary entry) bytes are read. */
static void test_prompt_bounded(void **state) {
    (void)state;
    char m[4096]; /* tu_data's buffer is reused */
    snprintf(m, sizeof m, "%s", tu_data(STORIES));
    char args[8192];
    snprintf(args, sizeof args, "timeout 60 '%s' run -m '%s' -f /dev/zero --mem 100M -n 4 2>&1", FLM_CLI, m);
    FILE *p = popen(args, "r");
    assert_non_null(p);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 1 || !strstr(out, "is longer than the context (2048 tokens); raise -c"))
        fail_msg("run -f /dev/zero: status %d; want exit 1 and the context error:\n%s", st, out);
    /* a 3 MB line in a chat: refused as a turn, the next line answered, exit 1 (a turn was refused) */
    const char *big = tu_tmp("line", ".txt");
    size_t len = 3u << 20;
    char *text = malloc(len + 8);
    assert_non_null(text);
    memset(text, 'a', len);
    memcpy(text + len, "\nhello\n", 7);
    tu_write_file(big, text, len + 7);
    free(text);
    snprintf(args, sizeof args, "chat -m '%s' -n 2 --chat-template chatml < '%s'", m, big);
    char *o = expect_out(args, 1, "this turn (more than");
    assert_non_null(strstr(o, "1 replies"));
    free(o);
    /* the bound scales with -c: the same file as a prompt fits no context of 64 tokens */
    snprintf(args, sizeof args, "run -m '%s' -f '%s' -c 64 -n 2", m, big);
    expect(args, 1, "is longer than the context (64 tokens)");
    remove(big);
    /* also seen: a directory named like a model is named as one, in a streaming mode too */
    const char *dir = tu_tmp("dir", ".flm");
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(args, sizeof args, "run -m '%s' --mode naive -p hi -n 2", dir);
    expect(args, 1, "is a directory, not a regular file");
    rmdir(dir);
    /* under the byte bound: read whole, then the usual token check (3.8 KB, ~900 tokens), or it runs */
    snprintf(args, sizeof args, "run -m '%s' -f '%s' -c 64 -n 2", m, tu_data("text/tinystories_sample.txt"));
    expect(args, 1, "tokens) is longer than the context (64 tokens)");
    const char *small = tu_tmp("small", ".txt");
    tu_write_file(small, "Once upon a time", 16);
    snprintf(args, sizeof args, "run -m '%s' -f '%s' -c 64 -n 2 --temp 0", m, small);
    expect(args, 0, "generation");
    remove(small);
}

/* Also seen: `verify` said "OK, all checksums match" of a .flm whose header counts disagree (the resident region's
 * block_count 4, five FFN regions), which `run` refuses. Now verify makes open's checks too. */
static void test_verify_validates_header(void **state) {
    (void)state;
    const char *flm = stories_flm(), *bad = tu_tmp("counts", ".flm");
    size_t n;
    uint8_t *p = tu_read_file(flm, &n);
    static const char key[] = "llama.block_count";
    uint8_t *at = NULL;
    for (size_t i = 0; i + sizeof key + 8 < n && !at; i++)
        if (!memcmp(p + i, key, sizeof key - 1)) at = p + i + sizeof key - 1;
    assert_non_null(at);
    assert_int_equal(flm_get_u32(at), 4); /* GGUF u32 */
    assert_int_equal(flm_get_u32(at + 4), 5);
    flm_put_u32(at + 4, 4);
    /* the checksums made right again: the resident region's (entry 0), its head's, then the header's */
    uint32_t hb = flm_get_u32(p + 32);
    uint8_t *e = p + FLM_HEADER_FIXED;
    uint64_t off = flm_get_u64(e + 8), sz = flm_get_u64(e + 16), head = flm_get_u64(e + 48);
    flm_put_u64(e + 24, XXH64(p + off, (size_t)sz, 0));
    if (head) flm_put_u64(e + 56, XXH64(p + off, (size_t)head, 0));
    flm_put_u64(p + 24, XXH64(p + 32, hb - 32, 0));
    tu_write_file(bad, p, n);
    free(p);
    char args[8192];
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2", bad);
    expect(args, 1, "5 FFN regions for 4 layers");
    snprintf(args, sizeof args, "verify '%s'", bad);
    char *o = expect_out(args, 1, "every checksum matches, but the file is not a model flashlm can open");
    assert_non_null(strstr(o, "5 FFN regions for 4 layers"));
    free(o);
    snprintf(args, sizeof args, "verify '%s'", flm);
    expect(args, 0, "all checksums match");
    remove(bad);
}

/* The header's reserved bytes 36..63 (docs/FORMAT.md: zero) were never looked at: a file that sets one, its header
 * checksum made right, opened as if they meant nothing. Now open refuses it by byte, and a clean file still runs. */
static void test_header_reserved_zero(void **state) {
    (void)state;
    const char *flm = stories_flm(), *bad = tu_tmp("reserved", ".flm");
    size_t n;
    uint8_t *p = tu_read_file(flm, &n);
    for (int i = 36; i < 64; i++) assert_int_equal(p[i], 0); /* what convert writes */
    p[50] = 0x7f;
    flm_put_u64(p + 24, XXH64(p + 32, flm_get_u32(p + 32) - 32, 0));
    tu_write_file(bad, p, n);
    free(p);
    char args[8192];
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2", bad);
    expect(args, 1, "header: reserved byte 50 is 0x7f, not zero");
    snprintf(args, sizeof args, "verify '%s'", bad);
    expect(args, 1, "reserved byte 50");
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 --temp 0", flm);
    expect(args, 0, "");
    remove(bad);
}

/* Also seen: `chat --context-shift` kept every message of a long conversation (RSS ~450 B per turn, and every turn
 * rendered them all). Now the messages the cache has shifted out are forgotten: 40 turns in a context of 64 tokens
 * hold a bounded tail of the conversation, and the prompts fed are the same as before. */
static void test_chat_shift_forgets(void **state) {
    (void)state;
    const char *turns = tu_tmp("turns", ".txt");
    char text[4096];
    size_t len = 0;
    for (int i = 0; i < 40; i++) len += (size_t)snprintf(text + len, sizeof text - len, "tell me a story %d\n", i);
    tu_write_file(turns, text, len);
    char args[8192];
    snprintf(args, sizeof args, "chat -m '%s' -c 64 --context-shift -n 4 --temp 0 --chat-template chatml < '%s'",
             tu_data(STORIES), turns);
    char *o = expect_out(args, 0, "40 replies");
    const char *s = strstr(o, "messages held, ");
    assert_non_null(s);
    while (s > o && s[-1] != ';') s--;
    unsigned held = 0, forgotten = 0;
    assert_int_equal(sscanf(s, " %u messages held, %u older ones forgotten", &held, &forgotten), 2);
    print_message("40 turns at -c 64: %u messages held, %u forgotten\n", held, forgotten);
    assert_true(forgotten > 0);
    assert_int_equal(held + forgotten, 80);
    assert_true(held < 40);
    free(o);
    remove(turns);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outputs_checked),
        cmocka_unit_test(test_writer_api),
        cmocka_unit_test(test_concurrent_converts),
        cmocka_unit_test(test_stdout_errors),
        cmocka_unit_test(test_prompt_bounded),
        cmocka_unit_test(test_verify_validates_header),
        cmocka_unit_test(test_header_reserved_zero),
        cmocka_unit_test(test_chat_shift_forgets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
