/* test_harden33.c — issue 33, "nothing lost, nothing unbounded, nothing silent": a file that appears at an output
 * path while a command runs (timed with the writer's FIFO hook, never a sleep), stale temporaries of writers killed
 * with SIGKILL, convert onto the files it reads, Hugging Face folders without a tokenizer or with more layers than
 * config.json says, NUL bytes in prompts, a prompt-less run, compute threads past the cores, and calibrate and
 * perplexity on texts far larger than their budget. Each case failed before its fix. Small models only. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "serve.h"
#include "testutil.h"

#pragma GCC diagnostic ignored "-Wformat-truncation" /* paths in fixed buffers: ours are short */
#define STORIES "models/stories260K/stories260K.gguf"

/* Run the CLI with args (stderr joined); fail unless it exits want_rc and its output holds want_text. */
static char *expect_out(const char *args, int want_rc, const char *want_text) { return tu_cli_expect(args, want_rc, want_text); }

static void expect(const char *args, int want_rc, const char *want_text) { free(expect_out(args, want_rc, want_text)); }

static uint64_t file_hash(const char *path) {
    size_t len = 0;
    uint8_t *b = tu_read_file(path, &len);
    uint64_t h = XXH64(b, len, 0);
    free(b);
    return h;
}

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

/* stories260K converted and calibrated (perplexity --curve needs the levels): its path (static). */
static const char *stories_calibrated(void) {
    static char flm[4096];
    if (!flm[0]) {
        snprintf(flm, sizeof flm, "%s", tu_tmp("stories-cal", ".flm"));
        char args[8192];
        snprintf(args, sizeof args, "convert '%s' '%s'", tu_data(STORIES), flm);
        expect(args, 0, "wrote");
        snprintf(args, sizeof args, "calibrate '%s' --text '%s' --chunk 16 --tokens 256", flm,
                 tu_data("text/tinystories_sample.txt"));
        expect(args, 0, NULL);
    }
    return flm;
}

/* Start `flashlm ARGS` with the writer's commit hook on a fresh FIFO (src/core/files.c: the commit reads the FIFO to
 * its end before its last check and rename). Returns the child's pid; *fd is the FIFO's write end, opened once the
 * writer waits in the hook, or -1 when the command ended first (its exit status in *status). */
static pid_t start_at_commit(const char *args, const char *log, int *fd, int *status) {
    char fifo[4096];
    snprintf(fifo, sizeof fifo, "%s", tu_tmp("commit", ".fifo"));
    assert_int_equal(mkfifo(fifo, 0600), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("FLASHLM_TEST_COMMIT_WAIT", fifo, 1);
        char cmd[9000];
        snprintf(cmd, sizeof cmd, "exec '%s' %s >'%s' 2>&1", FLM_CLI, args, log);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    *fd = -1;
    for (;;) { /* a non-blocking open succeeds once the reader (the hook) has the FIFO open: no timing involved */
        *fd = open(fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (*fd >= 0) break;
        if (waitpid(pid, status, WNOHANG) == pid) { unlink(fifo); return pid; }
        usleep(2000);
    }
    unlink(fifo);
    return pid;
}

static int finish(pid_t pid, int fd) {
    if (fd >= 0) close(fd); /* end of file: the hook returns and the commit goes on */
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* 1. A file created at the output path while the command runs (after the check before the work, before the rename)
 * is not replaced without --force. Before, run --stats-json, convert, synth and perplexity --svg passed
 * FLM_OUT_REPLACE whatever --force said, and the file was overwritten with exit 0. */
static void test_appearing_output(void **state) {
    (void)state;
    const char *flm = stories_flm();
    struct {
        const char *what, *suffix, *fmt;
    } cmds[] = {
        {"run --stats-json", ".json", "run -m '%s' -p hi -n 2 --stats-json '%s'"},
        {"convert", ".flm", "convert '%s' '%s'"},
        {"synth", ".gguf", "synth '%s' --d-model 64 --d-ffn 128 --layers 2 --heads 2 --vocab 300 --type f32"},
        {"perplexity --svg", ".svg", "perplexity -m '%s' -f '%s' -c 32 --chunks 1 --curve --no-oracle --svg '%s'"},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char out[4096], log[4096], args[8192];
        snprintf(out, sizeof out, "%s", tu_tmp("appear", cmds[i].suffix));
        snprintf(log, sizeof log, "%s", tu_tmp("appear", ".log"));
        if (i == 0) snprintf(args, sizeof args, cmds[i].fmt, flm, out);
        else if (i == 1) snprintf(args, sizeof args, cmds[i].fmt, tu_data(STORIES), out);
        else if (i == 2) snprintf(args, sizeof args, cmds[i].fmt, out);
        else snprintf(args, sizeof args, cmds[i].fmt, stories_calibrated(), tu_data("text/tinystories_sample.txt"), out);
        int fd, status = 0;
        pid_t pid = start_at_commit(args, log, &fd, &status);
        size_t len;
        if (fd < 0) {
            char *t = (char *)tu_read_file(log, &len);
            fail_msg("%s ended before its commit (status %d):\n%s", cmds[i].what, status, t);
        }
        tu_write_file(out, "someone else's", 14); /* appears now */
        int rc = finish(pid, fd);
        char *t = (char *)tu_read_file(log, &len);
        print_message("%s: exit %d: %s", cmds[i].what, rc, t);
        if (rc != 1 || !strstr(t, "already exists")) fail_msg("%s replaced a file that appeared: exit %d", cmds[i].what, rc);
        free(t);
        uint8_t *b = tu_read_file(out, &len);
        assert_int_equal(len, 14);
        assert_memory_equal(b, "someone else's", 14);
        free(b);
        assert_false(tu_temp_left(out));
        remove(out);
        remove(log);
    }
    /* with --force the same race replaces it */
    char out[4096], log[4096], args[8192];
    snprintf(out, sizeof out, "%s", tu_tmp("appear-force", ".flm"));
    snprintf(log, sizeof log, "%s", tu_tmp("appear-force", ".log"));
    snprintf(args, sizeof args, "convert '%s' '%s' --force", tu_data(STORIES), out);
    int fd, status;
    pid_t pid = start_at_commit(args, log, &fd, &status);
    assert_true(fd >= 0);
    tu_write_file(out, "someone else's", 14);
    assert_int_equal(finish(pid, fd), 0);
    snprintf(args, sizeof args, "verify '%s'", out);
    expect(args, 0, "all checksums match");
    remove(out);
    remove(log);
}

/* Stale temporaries: a writer killed with SIGKILL while its temporary is complete leaves OUT.tmp.XXXXXX; the next
 * writer of OUT removes it (it holds OUT.lock, so no live writer owns such a file). Before, they stayed forever. */
static void test_stale_temporaries(void **state) {
    (void)state;
    char out[4096], log[4096], args[8192], other[4200];
    snprintf(out, sizeof out, "%s", tu_tmp("stale", ".flm"));
    snprintf(log, sizeof log, "%s", tu_tmp("stale", ".log"));
    snprintf(args, sizeof args, "convert '%s' '%s'", tu_data(STORIES), out);
    int fd, status;
    pid_t pid = start_at_commit(args, log, &fd, &status);
    assert_true(fd >= 0);
    kill(pid, SIGKILL); /* the shell exec'd flashlm: pid is flashlm */
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(fd);
    assert_true(WIFSIGNALED(status));
    assert_true(tu_temp_left(out)); /* the dead writer's temporary (and lock file) */
    assert_int_equal(access(out, F_OK), -1);
    snprintf(other, sizeof other, "%s.tmp.keepme", out); /* not a writer's name: left alone */
    tu_write_file(other, "x", 1);
    snprintf(args, sizeof args, "convert '%s' '%s'", tu_data(STORIES), out);
    expect(args, 0, "wrote");
    assert_false(tu_temp_left(out) && access(other, F_OK) != 0);
    char pat[4300];
    snprintf(pat, sizeof pat, "ls '%s'.tmp.* '%s'.lock 2>/dev/null | grep -v keepme | wc -l", out, out);
    FILE *p = popen(pat, "r");
    int n = -1;
    assert_int_equal(fscanf(p, "%d", &n), 1);
    pclose(p);
    assert_int_equal(n, 0);
    assert_int_equal(access(other, F_OK), 0);
    remove(other);
    remove(out);
    remove(log);
}

/* ---- Hugging Face folders --------------------------------------------------------------------------------------- */

/* A writable copy of tests/data/hf-tiny/opt-125m-style (config.json with `from` replaced by `to` when given, and
 * model.safetensors), with the byte-level tokenizer.json of hf-tiny/tokenizer when with_tok. Returns it (static). */
static const char *hf_copy(bool with_tok, const char *from, const char *to) {
    static char dir[4096];
    char path[4300];
    snprintf(dir, sizeof dir, "%s", tu_tmp("hf33", ""));
    assert_int_equal(mkdir(dir, 0755), 0);
    const char *files[3] = {"opt-125m-style/config.json", "opt-125m-style/model.safetensors", "tokenizer/tokenizer.json"};
    for (int i = 0; i < (with_tok ? 3 : 2); i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "hf-tiny/%s", files[i]);
        size_t len;
        char *b = (char *)tu_read_file(tu_data(rel), &len);
        if (i == 0 && from) {
            char *at = strstr(b, from);
            assert_non_null(at);
            size_t nf = strlen(from), nt = strlen(to);
            char *c = malloc(len - nf + nt + 1);
            memcpy(c, b, (size_t)(at - b));
            memcpy(c + (at - b), to, nt);
            memcpy(c + (at - b) + nt, at + nf, len - (size_t)(at - b) - nf);
            len = len - nf + nt;
            free(b);
            b = c;
        }
        snprintf(path, sizeof path, "%s/%s", dir, strrchr(files[i], '/') + 1);
        tu_write_file(path, b, len);
        free(b);
    }
    return dir;
}

static void rm_folder(const char *dir) {
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* 2. convert HF_DIR onto one of the files it reads, even with --force, is refused and the file is unchanged. Before,
 * `convert HF_DIR HF_DIR/model.safetensors --force` replaced the weights with the .flm (the check compared the output
 * with the folder only). A hard link to the weights under another name is the same file. */
static void test_hf_output_is_input(void **state) {
    (void)state;
    char dir[4096], args[9000], path[4300], link_path[4300];
    snprintf(dir, sizeof dir, "%s", hf_copy(true, NULL, NULL));
    const char *names[] = {"model.safetensors", "config.json", "tokenizer.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        uint64_t h = file_hash(path);
        snprintf(args, sizeof args, "convert '%s' '%s' --type f32 --force", dir, path);
        expect(args, 1, "which the conversion reads");
        snprintf(args, sizeof args, "convert '%s' '%s' --type f32 --force --down-type q8_0", dir, path);
        expect(args, 1, "which the conversion reads");
        assert_true(file_hash(path) == h);
    }
    /* the GGUF output (written by flm_convert_hf itself) and a hard link under an innocent name */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(link_path, sizeof link_path, "%s/weights.gguf", dir);
    assert_int_equal(link(path, link_path), 0);
    uint64_t h = file_hash(path);
    snprintf(args, sizeof args, "convert '%s' '%s' --type f32 --force", dir, link_path);
    expect(args, 1, "which the conversion reads");
    assert_true(file_hash(path) == h);
    flm_error err;
    assert_int_equal(flm_convert_hf(dir, NULL, link_path, FLM_TYPE_F32, FLM_OUT_REPLACE, &err), FLM_ERR_ARG);
    assert_non_null(strstr(err.msg, "model.safetensors"));
    /* a tokenizer folder of its own */
    char tok[4096];
    snprintf(tok, sizeof tok, "%s", tu_data("hf-tiny/tokenizer"));
    snprintf(path, sizeof path, "%s/tokenizer.json", tok);
    assert_int_equal(flm_hf_check_output(dir, tok, path, &err), FLM_ERR_ARG);
    /* an ordinary output still converts */
    snprintf(path, sizeof path, "%s/out.flm", dir);
    snprintf(args, sizeof args, "convert '%s' '%s' --type f32", dir, path);
    expect(args, 0, "wrote");
    rm_folder(dir);
}

/* 3. No tokenizer: refused by name unless --no-tokenizer; a --tokenizer folder that does not exist, or has no
 * tokenizer, is refused. Before, both converted with exit 0 to a vocabulary of placeholders "[UNUSED_i]". */
static void test_hf_tokenizer_required(void **state) {
    (void)state;
    char dir[4096], args[9000], out[4096];
    snprintf(dir, sizeof dir, "%s", hf_copy(false, NULL, NULL));
    snprintf(out, sizeof out, "%s", tu_tmp("hf33-notok", ".flm"));
    snprintf(args, sizeof args, "convert '%s' '%s' --type f32", dir, out);
    expect(args, 1, "no tokenizer.json");
    assert_int_equal(access(out, F_OK), -1);
    snprintf(args, sizeof args, "convert '%s' '%s' --type f32 --tokenizer /no/such/dir", dir, out);
    expect(args, 1, "--tokenizer /no/such/dir");
    snprintf(args, sizeof args, "convert '%s' '%s' --type f32 --tokenizer '%s'", dir, out, dir); /* has none */
    expect(args, 1, "no tokenizer.json");
    snprintf(args, sizeof args, "convert '%s' '%s' --type f32 --tokenizer '%s' --no-tokenizer", dir, out,
             tu_data("hf-tiny/tokenizer"));
    expect(args, 2, "contradict");
    snprintf(args, sizeof args, "convert '%s' '%s' --tokenizer", dir, out);
    expect(args, 2, "--tokenizer needs a folder");
    assert_false(tu_temp_left(out));
    /* options that mean something only for a folder are refused for a model file, not ignored */
    snprintf(args, sizeof args, "convert '%s' '%s' --tokenizer '%s'", tu_data(STORIES), out, dir);
    expect(args, 2, "only for a Hugging Face folder");
    snprintf(args, sizeof args, "convert '%s' '%s' --type f32", tu_data(STORIES), out);
    expect(args, 2, "only for a Hugging Face folder");
    /* the explicit opt-in works; with a tokenizer folder too */
    snprintf(args, sizeof args, "convert '%s' '%s' --type f32 --no-tokenizer", dir, out);
    expect(args, 0, "wrote");
    remove(out);
    snprintf(args, sizeof args, "convert '%s' '%s' --type f32 --tokenizer '%s'", dir, out, tu_data("hf-tiny/tokenizer"));
    expect(args, 0, "wrote");
    remove(out);
    flm_error err;
    assert_int_equal(flm_convert_hf(dir, NULL, out, FLM_TYPE_F32, 0, &err), FLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "--no-tokenizer"));
    rm_folder(dir);
}

/* 4. A config.json that says fewer layers than the weights hold: the tensors left over are an error naming them.
 * Before, a 3-layer OPT with num_hidden_layers 2 converted to a 2-layer model, exit 0. */
static void test_hf_layers_left_over(void **state) {
    (void)state;
    char dir[4096], args[9000], out[4096];
    snprintf(dir, sizeof dir, "%s", hf_copy(true, "\"num_hidden_layers\": 3", "\"num_hidden_layers\": 2"));
    snprintf(out, sizeof out, "%s", tu_tmp("hf33-layers", ".gguf"));
    char *t = expect_out((snprintf(args, sizeof args, "convert '%s' '%s' --type f32", dir, out), args), 1,
                         "model.decoder.layers.2.");
    assert_non_null(strstr(t, "num_hidden_layers 2"));
    free(t);
    assert_int_equal(access(out, F_OK), -1);
    assert_false(tu_temp_left(out));
    rm_folder(dir);
    /* the right count converts */
    snprintf(dir, sizeof dir, "%s", hf_copy(true, NULL, NULL));
    snprintf(args, sizeof args, "convert '%s' '%s' --type f32", dir, out);
    expect(args, 0, "wrote");
    remove(out);
    rm_folder(dir);
}

/* `convert a.gguf x.gguf` wrote a .flm file named .gguf. */
static void test_convert_gguf_name(void **state) {
    (void)state;
    char args[8192], out[4096];
    snprintf(out, sizeof out, "%s", tu_tmp("named", ".gguf"));
    snprintf(args, sizeof args, "convert '%s' '%s'", tu_data(STORIES), out);
    expect(args, 2, "name the output OUT.flm");
    assert_int_equal(access(out, F_OK), -1);
}

/* 6. A NUL byte in a prompt: before, `run -f`, a chat line and a serve message's content were cut at it and the rest
 * dropped, exit 0. Now run refuses the file, chat refuses the turn (and exits 1 at the end), serve answers 400
 * naming the field. */
static void test_nul_in_prompt(void **state) {
    (void)state;
    const char *flm = stories_flm();
    const char *f = tu_tmp("nul", ".txt");
    tu_write_file(f, "Once upon\0 a time", 17);
    char args[8192];
    snprintf(args, sizeof args, "run -m '%s' -f '%s' -n 2", flm, f);
    expect(args, 1, "a NUL byte at offset 9: a prompt is text");
    snprintf(args, sizeof args, "chat -m '%s' -n 2 --chat-template chatml < '%s'", flm, f);
    expect(args, 1, "this turn has a NUL byte at byte 9");
    remove(f);
    static const struct {
        bool chat;
        const char *body, *field;
    } cases[] = {
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"user\", \"content\": "
               "\"a\\u0000b\"}]}", "messages[1].content: a NUL character"},
        {false, "{\"prompt\": \"x\\u0000y\", \"max_tokens\": 2}", "prompt: a NUL character"},
        {false, "{\"prompt\": \"x\", \"stop\": [\"a\", \"\\u0000\"]}", "stop[1]: a NUL character"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"\\u0000\"}]}]}",
         "messages[0].content[0].text: a NUL character"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        serve_req r;
        char msg[512];
        int status = serve_parse_request(cases[i].body, strlen(cases[i].body), cases[i].chat, &r, msg, sizeof msg);
        print_message("%s -> %d %s\n", cases[i].body, status, msg);
        assert_int_equal(status, 400);
        if (!strstr(msg, cases[i].field)) fail_msg("'%s' does not name '%s'", msg, cases[i].field);
    }
    /* an escaped backslash before "u0000" is text, not a NUL */
    const char *ok = "{\"prompt\": \"C:\\\\u0000 is a path\", \"max_tokens\": 2}";
    serve_req r;
    char msg[512];
    assert_int_equal(serve_parse_request(ok, strlen(ok), false, &r, msg, sizeof msg), 0);
    assert_non_null(strstr(r.prompt, "\\u0000 is a path"));
    serve_req_free(&r);
}

/* 6b. serve's "seed": -1 is llama-server's random seed (LLAMA_DEFAULT_SEED), which clients send for "none": before,
 * 400 "'seed' must be an integer between 0 and 9.0072e+15"; now a new seed, even over serve --seed. Integer bounds
 * are written whole (16777216, not 1.67772e+07). And serve takes llama-server's -np; run names a
 * --logit-bias id outside the vocabulary; a float option that underflows is taken as that small value. */
static void test_serve_seed_minus_one(void **state) {
    (void)state;
    serve_req r;
    char msg[512];
    const char *rnd = "{\"prompt\": \"x\", \"seed\": -1}";
    assert_int_equal(serve_parse_request(rnd, strlen(rnd), false, &r, msg, sizeof msg), 0);
    assert_true(r.seed_random);
    assert_false(r.has_seed);
    serve_req_free(&r);
    const char *big = "{\"prompt\": \"x\", \"seed\": 4294967296}";
    assert_int_equal(serve_parse_request(big, strlen(big), false, &r, msg, sizeof msg), 0);
    assert_true(r.has_seed);
    assert_false(r.seed_random);
    assert_true(r.seed == 4294967296ull);
    serve_req_free(&r);
    static const struct { const char *body, *msg; } bad[] = {
        {"{\"prompt\": \"x\", \"seed\": -2}", "'seed' must be an integer between -1 and 9007199254740991"},
        {"{\"prompt\": \"x\", \"seed\": 1.5}", "'seed' must be an integer between -1 and 9007199254740991"},
        {"{\"prompt\": \"x\", \"top_k\": 1e30}", "'top_k' must be an integer between -1 and 16777216"},
        {"{\"prompt\": \"x\", \"top_k\": -2}", "'top_k' must be an integer between -1 and 16777216"},
        {"{\"prompt\": \"x\", \"top_p\": 2}", "'top_p' must be a number between 0 and 1"},
    };
    /* top_k -1: off, as llama.cpp's k <= 0 (clients send vLLM's -1); before: 400, and run's --top-k -1 exit 2 */
    const char *k1 = "{\"prompt\": \"x\", \"top_k\": -1}";
    assert_int_equal(serve_parse_request(k1, strlen(k1), false, &r, msg, sizeof msg), 0);
    assert_int_equal(r.top_k, 0);
    serve_req_free(&r);
    /* llama-server's -np (--parallel): before, "unknown option '-np'" */
    char args[8192];
    snprintf(args, sizeof args, "serve -m '%s' -np 0", stories_flm());
    expect(args, 2, "bad --parallel '0' (1..64)");
    /* serve --seed -1: llama-server's default, a new seed per request (run takes it too); before: exit 2 */
    snprintf(args, sizeof args, "serve -m '%s' --seed -1 -np 0", stories_flm());
    expect(args, 2, "bad --parallel '0'");
    snprintf(args, sizeof args, "serve -m '%s' --seed -2", stories_flm());
    expect(args, 2, "bad --seed '-2' (a non-negative integer, or -1: a new one per request)");
    /* run said "a --logit-bias token id is outside the vocabulary", naming neither; chat names both */
    snprintf(args, sizeof args, "run -m '%s' -p Once -n 2 --logit-bias 5+1 --logit-bias 99999+1", stories_flm());
    expect(args, 1, "--logit-bias: token id 99999 is outside the vocabulary (512 tokens)");
    /* a value that underflows a float is in range (0..100), not "bad": --temp 1e-50 is greedy */
    snprintf(args, sizeof args, "run -m '%s' -p Once -n 4 --temp 1e-50 --top-p 1e-50 --top-k -1", stories_flm());
    expect(args, 0, "Once upon a time");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int status = serve_parse_request(bad[i].body, strlen(bad[i].body), false, &r, msg, sizeof msg);
        print_message("%s -> %d %s\n", bad[i].body, status, msg);
        assert_int_equal(status, 400);
        if (!strstr(msg, bad[i].msg)) fail_msg("'%s' is not '%s'", msg, bad[i].msg);
    }
}

/* 7. No prompt: --help says generation starts from BOS. Before, SmolLM2 (whose tokenizer adds no BOS) said "cannot
 * tokenize the prompt", exit 1. Now it starts from its BOS token, as stories260K does. */
static void test_no_prompt_starts_from_bos(void **state) {
    (void)state;
    char args[8192];
    snprintf(args, sizeof args, "run -m '%s' -n 3 --temp 0", stories_flm());
    expect(args, 0, "generation");
    const char *smol = tu_model("smollm2-135m");
    if (!smol) { print_message("SmolLM2 not pulled: its case skipped\n"); return; }
    snprintf(args, sizeof args, "run -m '%s' -n 3 --temp 0 -c 64", smol);
    char *out = expect_out(args, 0, "prompt        1 tokens");
    free(out);
}

/* Threads: -t above the cores made a prompt 20x slower (-t 64 on 2 cores) or never reached its first token (-t 512).
 * It is lowered to the cores with a note; --threads-force keeps it, with a warning. */
static void test_threads_clamped(void **state) {
    (void)state;
    const char *flm = stories_flm();
    cpu_set_t set;
    assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
    const int cores = CPU_COUNT(&set);
    char args[8192], want[256];
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 -t 512", flm);
    char *out = expect_out(args, 0, "is more than the");
    snprintf(want, sizeof want, "using %d (--threads-force keeps 512", cores);
    if (!strstr(out, want)) fail_msg("no '%s' in:\n%s", want, out);
    snprintf(want, sizeof want, ", %d threads, ", cores);
    if (!strstr(out, want)) fail_msg("not run on %d threads:\n%s", cores, out);
    free(out);
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 -t %d --threads-force", flm, cores + 1);
    out = expect_out(args, 0, "with --threads-force");
    snprintf(want, sizeof want, ", %d threads, ", cores + 1);
    if (!strstr(out, want)) fail_msg("not run on %d threads:\n%s", cores + 1, out);
    free(out);
    snprintf(args, sizeof args, "run -m '%s' -p hi -n 2 -t %d", flm, cores); /* at the cores: no note */
    out = expect_out(args, 0, NULL);
    assert_null(strstr(out, "is more than the"));
    free(out);
}

/* A calibrate that fails leaves the model exactly as it was. Before, the hot order replaced the model first and the
 * predictors were stored by a second replacement: with 1.1-1.5 MB free the first fit, the second did not, and the
 * model was left reordered with exit 1. Here a file-size limit (ulimit -f, SIGXFSZ ignored: EFBIG) lets a copy of the
 * model be written but not one with the predictors. */
static void test_calibrate_fails_atomically(void **state) {
    (void)state;
    char flm[4096], args[9000], cal_tmp[4200];
    snprintf(flm, sizeof flm, "%s", tu_tmp("atomic", ".flm"));
    snprintf(args, sizeof args, "convert '%s' '%s'", tu_data(STORIES), flm);
    expect(args, 0, "wrote");
    struct stat sb;
    assert_int_equal(stat(flm, &sb), 0);
    const uint64_t h = file_hash(flm);
    const long long kib = (long long)(sb.st_size + 1023) / 1024 + 1; /* the ordered copy fits, not the predictors */
    snprintf(args, sizeof args, "bash -c \"trap '' XFSZ; ulimit -f %lld; exec '%s' calibrate '%s' --text '%s' --chunk 16 "
             "--tokens 256\" 2>&1", kib, FLM_CLI, flm, tu_data("text/tinystories_sample.txt"));
    FILE *p = popen(args, "r");
    assert_non_null(p);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    print_message("calibrate under ulimit -f %lld KiB: status %d: %s\n", kib, rc, out);
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
    assert_null(strstr(out, "hottest first"));
    assert_true(file_hash(flm) == h); /* exactly as it was: not reordered */
    assert_false(flm_is_hot_ordered(flm));
    snprintf(cal_tmp, sizeof cal_tmp, "%s.cal.tmp", flm);
    assert_int_equal(access(cal_tmp, F_OK), -1);
    assert_false(tu_temp_left(flm));
    /* without the limit: ordered and calibrated in one replacement */
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --chunk 16 --tokens 256", flm,
             tu_data("text/tinystories_sample.txt"));
    expect(args, 0, "hottest first");
    assert_true(flm_is_hot_ordered(flm));
    assert_int_equal(access(cal_tmp, F_OK), -1);
    remove(flm);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_appearing_output),     cmocka_unit_test(test_stale_temporaries),
        cmocka_unit_test(test_hf_output_is_input),   cmocka_unit_test(test_hf_tokenizer_required),
        cmocka_unit_test(test_hf_layers_left_over),  cmocka_unit_test(test_convert_gguf_name),
        cmocka_unit_test(test_nul_in_prompt),        cmocka_unit_test(test_serve_seed_minus_one),        cmocka_unit_test(test_no_prompt_starts_from_bos),
        cmocka_unit_test(test_threads_clamped),      cmocka_unit_test(test_calibrate_fails_atomically),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
