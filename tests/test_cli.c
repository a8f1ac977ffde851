/* test_cli.c — the command line as a user meets it: help, bad options, bad files, a missing required key. Each
 * failure must be a clear message naming the file and a non-zero exit, never a crash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm_tools.h"
#include "format/gguf.h"
#include "write/gguf_write.h"
#include "testutil.h"

#define MODEL "models/stories260K/stories260K.gguf"

static void expect(const char *args, int want_rc, const char *want_text) { free(tu_cli_expect(args, want_rc, want_text)); }

static void test_help(void **state) {
    (void)state;
    const char *cmds[] = {"run", "convert", "verify", "inspect", "bench", "perplexity"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char args[64];
        snprintf(args, sizeof args, "%s --help 2>&1", cmds[i]);
        expect(args, 0, "usage: flashlm");
    }
    expect("--help 2>&1", 0, "commands:");
    expect("2>&1", 2, "usage:");
    expect("frobnicate 2>&1", 2, "unknown command");
}

/* FLASHLM_KERNELS (the kernel levels): version names the level in use and the CPU's best; the reference level is
 * always there; a level above the CPU's is capped with a note; an unknown value is refused. */
static void test_kernels_env(void **state) {
    (void)state;
    setenv("FLASHLM_KERNELS", "scalar", 1);
    expect("version 2>&1", 0, "kernels scalar (this CPU's best: ");
    setenv("FLASHLM_KERNELS", "avx9", 1);
    expect("version 2>&1", 2, "FLASHLM_KERNELS=avx9: not a kernel level");
    setenv("FLASHLM_KERNELS", "vnni", 1); /* the highest level: used, or capped at the CPU's with a note */
    char *out = NULL;
    assert_int_equal(tu_run_cli("version 2>&1", &out), 0);
    if (!strstr(out, "kernels vnni (this CPU's best: vnni)") &&
        !strstr(out, "note: this CPU lacks the FLASHLM_KERNELS=vnni level"))
        fail_msg("FLASHLM_KERNELS=vnni flashlm version:\n%s", out);
    free(out);
    setenv("FLASHLM_KERNELS", "avxvnni", 1); /* the side branch: used, or the highest level below it, with a note */
    assert_int_equal(tu_run_cli("version 2>&1", &out), 0);
    if (!strstr(out, "kernels avxvnni (this CPU's best: ") &&
        !(strstr(out, "note: this CPU lacks the FLASHLM_KERNELS=avxvnni level") &&
          (strstr(out, "kernels avx2 (") || strstr(out, "kernels scalar ("))))
        fail_msg("FLASHLM_KERNELS=avxvnni flashlm version:\n%s", out);
    free(out);
    unsetenv("FLASHLM_KERNELS");
    expect("version 2>&1", 0, "kernels ");
}

/* FLASHLM_THREADS and FLASHLM_SPIN_US: the pool fell back to its defaults on a value it could not use, silently;
 * the CLI now refuses such a value by name, and the values the pool takes still run. */
static void test_pool_env(void **state) {
    (void)state;
    setenv("FLASHLM_THREADS", "openmp", 1);
    expect("version 2>&1", 2, "FLASHLM_THREADS=openmp: the only value is omp");
    setenv("FLASHLM_THREADS", "omp", 1);
    expect("version 2>&1", 0, "kernels ");
    unsetenv("FLASHLM_THREADS");
    const char *bad[] = {"abc", "-1", "5x", "1000001", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("FLASHLM_SPIN_US", bad[i], 1);
        expect("version 2>&1", 2, "not a whole number of microseconds in 0..1000000");
    }
    setenv("FLASHLM_SPIN_US", "0", 1);
    expect("version 2>&1", 0, "kernels ");
    setenv("FLASHLM_SPIN_US", "", 1); /* empty: the default, as unset */
    expect("version 2>&1", 0, "kernels ");
    unsetenv("FLASHLM_SPIN_US");
}

static void test_bad_options(void **state) {
    (void)state;
    char args[4096];
    snprintf(args, sizeof args, "run -m '%s' --bogus 2>&1", tu_data(MODEL));
    expect(args, 2, "unknown option");
    snprintf(args, sizeof args, "run -m '%s' -n abc 2>&1", tu_data(MODEL));
    expect(args, 2, "bad -n");
    snprintf(args, sizeof args, "run -m '%s' -t 0 2>&1", tu_data(MODEL));
    expect(args, 2, "bad -t");
    snprintf(args, sizeof args, "run -m '%s' --temp -1 2>&1", tu_data(MODEL));
    expect(args, 2, "bad --temp");
    snprintf(args, sizeof args, "run -m '%s' --mem 12Q 2>&1", tu_data(MODEL));
    expect(args, 2, "bad --mem");
    snprintf(args, sizeof args, "run -m '%s' -p 'x' 2>&1 -n", tu_data(MODEL));
    expect(args, 2, "needs a value");
    expect("run 2>&1", 2, "no model");
    /* a prompt longer than the context is refused (as llama.cpp); a prompt and -n longer than it run until it is
     * full (tests/test_kv_shift.c checks what they print) */
    snprintf(args, sizeof args, "run -m '%s' -c 4 -n 20 -p 'Once upon a time' 2>&1", tu_data(MODEL));
    expect(args, 1, "the prompt (5 tokens) is longer than the context (4 tokens); raise -c");
    snprintf(args, sizeof args, "run -m '%s' -c 8 -n 20 -p 'Once upon a time' 2>&1", tu_data(MODEL));
    expect(args, 0, "context full (8 tokens): stopped; raise -c or pass --context-shift");
    snprintf(args, sizeof args, "run -m '%s' --keep x 2>&1", tu_data(MODEL));
    expect(args, 2, "bad --keep value 'x'");
    snprintf(args, sizeof args, "run -m '%s' --keep -2 2>&1", tu_data(MODEL));
    expect(args, 2, "bad --keep value '-2'");
}

static void test_bad_files(void **state) {
    (void)state;
    size_t len;
    uint8_t *g = tu_read_file(tu_data(MODEL), &len);
    const char *bad = tu_tmp("cli-bad", ".gguf");
    char args[4096];
    /* missing file */
    expect("run -m /nonexistent/model.gguf 2>&1", 1, "/nonexistent/model.gguf");
    /* truncated, wrong magic: named, non-zero, for run and inspect and convert */
    tu_write_file(bad, g, len / 3);
    snprintf(args, sizeof args, "run -m '%s' -n 2 2>&1", bad);
    expect(args, 1, bad);
    snprintf(args, sizeof args, "inspect '%s' 2>&1", bad);
    expect(args, 1, bad);
    snprintf(args, sizeof args, "convert '%s' '%s.flm' 2>&1", bad, bad);
    expect(args, 1, bad);
    g[0] = 'X';
    tu_write_file(bad, g, len);
    snprintf(args, sizeof args, "run -m '%s' -n 2 2>&1", bad);
    expect(args, 1, "magic");
    remove(bad);
    free(g);
}

/* Write a copy of stories260K to out without the key `drop` (NULL: none), adding the string KV set_key = set_val
 * first when set_key is not NULL. */
static void write_model_copy(const char *out, const char *drop, const char *set_key, const char *set_val) {
    flm_error err;
    flm_gguf_file *src = NULL;
    assert_int_equal(flm_gguf_open(tu_data(MODEL), &src, &err), FLM_OK);
    flm_gguf_writer *w = NULL;
    assert_int_equal(flm_gguf_writer_create(out, FLM_OUT_REPLACE, &w, &err), FLM_OK);
    if (set_key) assert_int_equal(flm_gguf_writer_kv_str(w, set_key, set_val), FLM_OK);
    for (uint64_t i = 0; i < src->n_kv; i++)
        if ((!drop || strcmp(src->kv[i].key, drop)) && (!set_key || strcmp(src->kv[i].key, set_key)))
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

/* A copy of the model without one required key: the message names the key. */
static void test_missing_required_key(void **state) {
    (void)state;
    const char *drop[] = {"llama.block_count", "llama.embedding_length", "tokenizer.ggml.tokens",
                          "general.architecture"};
    for (size_t d = 0; d < sizeof drop / sizeof *drop; d++) {
        const char *out = tu_tmp("nokey", ".gguf");
        write_model_copy(out, drop[d], NULL, NULL);
        char args[4096];
        snprintf(args, sizeof args, "run -m '%s' -n 2 2>&1", out);
        expect(args, 1, drop[d]);
        remove(out);
    }
}

/* A copy of the model whose general.architecture is one flashlm does not know: the message names it and the ones
 * flashlm runs. */
static void test_unknown_architecture(void **state) {
    (void)state;
    const char *out = tu_tmp("mamba", ".gguf");
    write_model_copy(out, NULL, "general.architecture", "mamba");
    char args[4096];
    snprintf(args, sizeof args, "run -m '%s' -n 2 2>&1", out);
    expect(args, 1, "architecture 'mamba' is not supported (supported: llama, qwen2, gemma3, opt, falcon, phi2, persimmon)");
    snprintf(args, sizeof args, "convert '%s' '%s.flm' 2>&1", out, out);
    expect(args, 1, "'mamba'");
    remove(out);
}

static void test_inspect(void **state) {
    (void)state;
    char args[4096];
    snprintf(args, sizeof args, "inspect '%s'", tu_data(MODEL));
    expect(args, 0, "blk.4.ffn_down.weight");
    expect(args, 0, "n_kv_heads  4");
}

/* A byte-level vocabulary turns one input byte into up to three tokens (' ' -> U+2581 -> 3 byte tokens): every
 * command that tokenizes text must size its buffers by the encoding, not by the text. */
static void test_byte_vocab_tokenizing(void **state) {
    (void)state;
    const char *model = tu_tmp("bytevocab", ".gguf"), *flm = tu_tmp("bytevocab", ".flm"), *text = tu_tmp("words", ".txt");
    char args[8192];
    snprintf(args, sizeof args, "synth '%s' --d-model 64 --d-ffn 128 --layers 1 --heads 2 --vocab 259 2>&1", model);
    expect(args, 0, NULL);
    snprintf(args, sizeof args, "convert '%s' '%s' 2>&1", model, flm);
    expect(args, 0, NULL);
    char words[1200] = "";
    for (int i = 0; i < 200; i++) strcat(words, "a b ");
    tu_write_file(text, words, strlen(words));
    snprintf(args, sizeof args, "run -m '%s' -p 'a b c d e f g h i j k l m n o p' -n 2 -c 128 2>&1", model);
    expect(args, 0, NULL);
    snprintf(args, sizeof args, "perplexity -m '%s' -f '%s' -c 16 2>&1", model, text);
    expect(args, 0, "perplexity");
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' --chunk 16 --tokens 256 2>&1", flm, text);
    expect(args, 0, "calibrated");
    remove(model);
    remove(flm);
    remove(text);
}

/* Outputs: never a device or the input itself; an existing file only with --force; nothing half-written. */
static void test_output_safety(void **state) {
    (void)state;
    char args[8192];
    const char *copy = tu_tmp("src", ".gguf"), *out = tu_tmp("out", ".flm");
    size_t len;
    uint8_t *g = tu_read_file(tu_data(MODEL), &len);
    tu_write_file(copy, g, len);
    snprintf(args, sizeof args, "convert '%s' /dev/null --force 2>&1", copy);
    expect(args, 1, "not a regular file");
    snprintf(args, sizeof args, "convert '%s' '%s' --force 2>&1", copy, copy);
    expect(args, 1, "is the model being read");
    size_t len2;
    uint8_t *g2 = tu_read_file(copy, &len2); /* the source is untouched */
    assert_int_equal(len2, len);
    assert_memory_equal(g, g2, len);
    snprintf(args, sizeof args, "convert '%s' '%s' 2>&1", copy, out);
    expect(args, 0, "wrote");
    expect(args, 1, "use --force");
    snprintf(args, sizeof args, "convert '%s' '%s' --force 2>&1", copy, out);
    expect(args, 0, "wrote");
    snprintf(args, sizeof args, "synth /dev/null --force --d-model 64 --d-ffn 128 --layers 1 --heads 2 --vocab 300 2>&1");
    expect(args, 1, "not a regular file");
    remove(copy);
    remove(out);
    free(g);
    free(g2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_kernels_env),
        cmocka_unit_test(test_pool_env),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_missing_required_key),
        cmocka_unit_test(test_inspect),
        cmocka_unit_test(test_unknown_architecture),
        cmocka_unit_test(test_byte_vocab_tokenizing),
        cmocka_unit_test(test_output_safety),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
