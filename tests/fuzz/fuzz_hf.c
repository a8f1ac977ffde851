/* fuzz_hf.c — a Hugging Face folder's config.json and tokenizer.json together (src/convert/hf.c, flm_convert_hf):
 * the input is split into the two files (bytes 0-1: config.json's length, little-endian; then config.json; the rest:
 * tokenizer.json), written into a folder that holds tests/data/hf-tiny's OPT model.safetensors, and converted to a
 * GGUF. Every combination of hyper-parameters (layers, widths, vocabulary size, heads, positions, flags), tokenizer
 * vocabulary, merges and added tokens must convert, or be refused with a message and leave no output behind; a
 * converted GGUF must open (the tokenizer built from what was written). Seeds: tests/fuzz/seeds/fuzz_hf (the tiny OPT's
 * config with the hf-tiny tokenizer, and variations). */
#include "fuzz_common.h"

#include <stdbool.h>
#include <sys/stat.h>

#include "flashlm.h"
#include "flashlm_tools.h"

static char g_dir[256];

static void cleanup(void) { /* the folder and what is in it */
    static const char *const names[] = {"config.json", "tokenizer.json", "model.safetensors", "out.gguf"};
    char p[512];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        remove(p);
    }
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(g_dir, sizeof g_dir, "/tmp/fuzz_hf.XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); exit(1); }
    atexit(cleanup);
    char src[4096], dst[512];
    snprintf(src, sizeof src, "%s/hf-tiny/opt-125m-style/model.safetensors", FLM_DATA_DIR);
    snprintf(dst, sizeof dst, "%s/model.safetensors", g_dir);
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    if (!in || !out) { fprintf(stderr, "fuzz_hf: cannot copy %s\n", src); exit(1); }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    fclose(in);
    if (fclose(out)) exit(1);
    return 0;
}

static void put(const char *name, const uint8_t *b, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f)) { fprintf(stderr, "fuzz_hf: cannot write %s\n", p); exit(1); }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) LLVMFuzzerInitialize(NULL, NULL); /* replay.c calls it; a plain run may not */
    if (size < 2) return 0;
    size_t nc = (size_t)data[0] | (size_t)data[1] << 8;
    if (nc > size - 2) nc = size - 2;
    put("config.json", data + 2, nc);
    put("tokenizer.json", data + 2 + nc, size - 2 - nc);
    char out[512];
    snprintf(out, sizeof out, "%s/out.gguf", g_dir);
    flm_error err;
    err.msg[0] = 0;
    flm_status st = flm_convert_hf(g_dir, NULL, out, FLM_TYPE_F32, FLM_OUT_REPLACE, &err);
    struct stat sb;
    if (st) {
        fz_check(err.msg[0], "an error without a message (status %d)", (int)st);
        fz_check(stat(out, &sb) != 0, "a refused conversion left %s", out);
        return 0;
    }
    fz_check(stat(out, &sb) == 0 && sb.st_size > 0, "converted, but no output");
    flm_params p;
    flm_params_default(&p);
    p.n_ctx = 16;
    p.n_threads = 1;
    flm_ctx *ctx = NULL;
    if (flm_open(out, &p, &ctx, &err) == FLM_OK) { /* what was written reads back, tokenizer included */
        int32_t ids[64];
        size_t n = flm_tokenize(ctx, "Hello world", false, ids, 64);
        fz_check(n != SIZE_MAX, "tokenize: out of memory");
        for (size_t i = 0; i < n && i < 64; i++) fz_check(ids[i] >= 0 && (uint32_t)ids[i] < flm_vocab_size(ctx), "id");
        flm_close(ctx);
    } else {
        fz_check(err.msg[0], "an open error without a message");
    }
    remove(out);
    return 0;
}
