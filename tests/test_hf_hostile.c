/* test_hf_hostile.c — hostile Hugging Face folders for `flashlm convert` (src/convert/hf.c, safetensors.c): token
 * pieces longer than the GGUF reader takes, tokenizer.json fields of the wrong type or ids given twice, bad
 * bos/eos_token_id and tie_word_embeddings, a huge num_hidden_layers, JSON with trailing data, NUL bytes, "\u0000"
 * escapes or duplicate keys, long merges.txt lines, a JSON file that is a folder, and tokenizer_config.json's chat
 * template and eos token. Each refusal names the file and the field, exits non-zero and leaves no output; each case
 * failed (converted with exit 0, or was cut short, or said only "read failed") before its fix. The fixtures are
 * copies of tests/data/hf-tiny, edited at test time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "format/gguf.h"
#include "testutil.h"

#pragma GCC diagnostic ignored "-Wformat-truncation" /* paths in fixed buffers: ours are short */

/* text with the first `from` replaced by `to` (malloc'd); from must occur */
static char *replace(const char *text, size_t len, const char *from, const char *to, size_t *out_len) {
    const char *at = strstr(text, from);
    assert_non_null(at);
    size_t nf = strlen(from), nt = strlen(to), pre = (size_t)(at - text);
    char *c = malloc(len - nf + nt + 1);
    assert_non_null(c);
    memcpy(c, text, pre);
    memcpy(c + pre, to, nt);
    memcpy(c + pre + nt, at + nf, len - pre - nf);
    c[len - nf + nt] = 0;
    *out_len = len - nf + nt;
    return c;
}

/* Copy tests/data/hf-tiny/rel to dir/name, with `from` replaced by `to` when from is not NULL. */
static void copy_edit(const char *dir, const char *name, const char *rel, const char *from, const char *to) {
    char path[4300];
    size_t len;
    char *b = (char *)tu_read_file(tu_data(rel), &len);
    if (from) {
        size_t nl;
        char *c = replace(b, len, from, to, &nl);
        free(b);
        b = c;
        len = nl;
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    tu_write_file(path, b, len);
    free(b);
}

/* A fresh folder: the OPT-125M-style config.json and weights with the byte-level tokenizer.json; in the file named
 * `edit` (config.json or tokenizer.json, or NULL) `from` is replaced by `to`. Returns it (static). */
static const char *folder(const char *edit, const char *from, const char *to) {
    static char dir[4096];
    snprintf(dir, sizeof dir, "%s", tu_tmp("hfh", ""));
    assert_int_equal(mkdir(dir, 0755), 0);
    bool c = edit && !strcmp(edit, "config.json"), t = edit && !strcmp(edit, "tokenizer.json");
    copy_edit(dir, "config.json", "hf-tiny/opt-125m-style/config.json", c ? from : NULL, to);
    copy_edit(dir, "model.safetensors", "hf-tiny/opt-125m-style/model.safetensors", NULL, NULL);
    copy_edit(dir, "tokenizer.json", "hf-tiny/tokenizer/tokenizer.json", t ? from : NULL, to);
    return dir;
}

static void rm_folder(const char *dir) {
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* flm_convert_hf of dir must fail with a message holding want1 and want2 (either may be NULL), leaving no output */
static void refused(const char *dir, const char *want1, const char *want2) {
    char out[4096];
    snprintf(out, sizeof out, "%s", tu_tmp("hfh-out", ".gguf"));
    flm_error err;
    flm_status st = flm_convert_hf(dir, NULL, out, FLM_TYPE_F32, 0, &err);
    if (st == FLM_OK) fail_msg("%s converted; expected a refusal naming '%s'", dir, want1 ? want1 : "");
    if (want1 && !strstr(err.msg, want1)) fail_msg("message '%s' lacks '%s'", err.msg, want1);
    if (want2 && !strstr(err.msg, want2)) fail_msg("message '%s' lacks '%s'", err.msg, want2);
    assert_int_equal(access(out, F_OK), -1);
    assert_false(tu_temp_left(out));
}

/* flm_convert_hf of dir must succeed; returns the opened GGUF (the output is removed; the map stays valid) */
static flm_gguf_file *converted(const char *dir) {
    char out[4096];
    snprintf(out, sizeof out, "%s", tu_tmp("hfh-out", ".gguf"));
    flm_error err;
    flm_status st = flm_convert_hf(dir, NULL, out, FLM_TYPE_F32, 0, &err);
    if (st) fail_msg("%s: refused: %s", dir, err.msg);
    flm_gguf_file *f = NULL;
    if (flm_gguf_open(out, &f, &err)) fail_msg("%s", err.msg);
    remove(out);
    return f;
}

/* a folder edited as folder() must be refused naming the file and want */
static void case_refused(const char *edit, const char *from, const char *to, const char *want) {
    const char *dir = folder(edit, from, to);
    refused(dir, edit, want);
    rm_folder(dir);
}

static uint32_t gguf_u32(const flm_gguf_file *f, const char *key) {
    uint32_t v = 0;
    flm_error err;
    if (flm_gguf_get_u32(f, key, true, &v, &err)) fail_msg("%s", err.msg);
    return v;
}

/* 1. A vocab piece of 100000 bytes converted with exit 0 to a GGUF flashlm then refused; now refused at conversion
 * naming tokenizer.json and the token id. */
static void test_long_piece(void **state) {
    (void)state;
    size_t n = 100000;
    char *to = malloc(n + 64);
    strcpy(to, "\"vocab\": {\"");
    memset(to + strlen(to), 'x', n);
    strcpy(to + 11 + n, "\": 902}");
    case_refused("tokenizer.json", "\"vocab\": {}", to, "token 902");
    free(to);
}

/* 2. model.vocab, model.merges, added_tokens of the wrong type, and two vocab pieces with one id, converted with exit
 * 0; now refused naming the field. An empty vocab object, and added_tokens repeating a vocab token, still convert. */
static void test_tokenizer_fields(void **state) {
    (void)state;
    case_refused("tokenizer.json", "\"vocab\": {}", "\"vocab\": \"x\"", "model.vocab");
    case_refused("tokenizer.json", "\"merges\": []", "\"merges\": {}", "model.merges");
    case_refused("tokenizer.json", "\"added_tokens\": [", "\"added_tokens\": {\"a\": 1}, \"x\": [",
                 "added_tokens");
    case_refused("tokenizer.json", "\"vocab\": {}", "\"vocab\": {\"a\": 5, \"b\": 5}", "id 5");
    const char *dir = folder("tokenizer.json", "\"vocab\": {}", "\"vocab\": {\"<|endoftext|>\": 0, \"a\": 5}");
    flm_gguf_close(converted(dir));
    rm_folder(dir);
}

/* 3. bos/eos_token_id out of range, a string, negative or fractional were replaced by the default or truncated; now
 * refused naming config.json and the key. A list takes its first id, every element checked; null is "not given". */
static void test_token_ids(void **state) {
    (void)state;
    case_refused("config.json", "\"bos_token_id\": 2", "\"bos_token_id\": 5000", "bos_token_id");
    case_refused("config.json", "\"bos_token_id\": 2", "\"bos_token_id\": \"2\"", "bos_token_id");
    case_refused("config.json", "\"bos_token_id\": 2", "\"bos_token_id\": -1", "bos_token_id");
    case_refused("config.json", "\"bos_token_id\": 2", "\"bos_token_id\": 1.7", "bos_token_id");
    case_refused("config.json", "\"eos_token_id\": 2", "\"eos_token_id\": [0, 5000]", "eos_token_id");
    case_refused("config.json", "\"eos_token_id\": 2", "\"eos_token_id\": []", "eos_token_id");
    const char *dir = folder("config.json", "\"eos_token_id\": 2", "\"eos_token_id\": [7, 2]");
    flm_gguf_file *f = converted(dir);
    assert_int_equal(gguf_u32(f, "tokenizer.ggml.eos_token_id"), 7);
    flm_gguf_close(f);
    rm_folder(dir);
    dir = folder("config.json", "\"bos_token_id\": 2", "\"bos_token_id\": null");
    f = converted(dir);
    assert_int_equal(gguf_u32(f, "tokenizer.ggml.bos_token_id"), 2); /* OPT's default */
    flm_gguf_close(f);
    rm_folder(dir);
}

/* 4. tie_word_embeddings "false" (a string) was read as the default. */
static void test_tie(void **state) {
    (void)state;
    case_refused("config.json", "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": \"false\"",
                 "tie_word_embeddings");
}

/* 5. num_hidden_layers 16777215 allocated ~36 GB and said only "out of memory". */
static void test_layers(void **state) {
    (void)state;
    case_refused("config.json", "\"num_hidden_layers\": 3", "\"num_hidden_layers\": 16777215", "num_hidden_layers");
}

/* 6. JSON with trailing data, a NUL byte, a "\u0000" escape or (config.json) a key twice was accepted. */
static void test_json_text(void **state) {
    (void)state;
    case_refused("config.json", "\"word_embed_proj_dim\": 64\n}", "\"word_embed_proj_dim\": 64\n} x", "after");
    case_refused("config.json", "\"ffn_dim\": 256,", "\"ffn_dim\": 256, \"ffn_dim\": 256,", "'ffn_dim' appears twice");
    case_refused("tokenizer.json", "\"vocab\": {}", "\"vocab\": {\"a\\u0000b\": 5}", "\\u0000");
    case_refused("config.json", "\"dropout\": 0.1", "\"dropout\": \"\\u0000\"", "\\u0000");
    /* an escaped backslash before u0000 is no NUL */
    const char *dir = folder("tokenizer.json", "\"vocab\": {}", "\"vocab\": {\"a\\\\u0000b\": 5}");
    flm_gguf_close(converted(dir));
    rm_folder(dir);
    /* a NUL byte in config.json */
    dir = folder(NULL, NULL, NULL);
    char path[4300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len;
    char *b = (char *)tu_read_file(path, &len);
    char *nb = malloc(len + 2);
    memcpy(nb, b, len);
    nb[len] = 0;
    nb[len + 1] = '\n';
    tu_write_file(path, nb, len + 2);
    free(b);
    free(nb);
    refused(dir, "config.json", "NUL byte");
    rm_folder(dir);
}

/* Write dir/model.safetensors as the fixture's with its header (trailing spaces trimmed) edited: `from` replaced by
 * `to` (from NULL: nothing), then tail_len bytes of tail appended to the header. */
static void st_edit(const char *dir, const char *from, const char *to, const char *tail, size_t tail_len) {
    size_t len;
    uint8_t *b = tu_read_file(tu_data("hf-tiny/opt-125m-style/model.safetensors"), &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    size_t n = (size_t)hl;
    while (n && b[8 + n - 1] == ' ') n--;
    char *h = malloc(n + 1);
    memcpy(h, b + 8, n);
    h[n] = 0;
    if (from) {
        size_t nn;
        char *c = replace(h, n, from, to, &nn);
        free(h);
        h = c;
        n = nn;
    }
    size_t nh = n + tail_len, data = len - 8 - (size_t)hl;
    uint8_t *o = malloc(8 + nh + data);
    for (int i = 0; i < 8; i++) o[i] = (uint8_t)((uint64_t)nh >> (8 * i));
    memcpy(o + 8, h, n);
    memcpy(o + 8 + n, tail, tail_len);
    memcpy(o + 8 + nh, b + 8 + hl, data);
    char path[4300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    tu_write_file(path, o, 8 + nh + data);
    free(o);
    free(h);
    free(b);
}

/* 6. A safetensors header with trailing data, a NUL byte, or a tensor name with "\u0000" (cut short at the NUL, so
 * it matched the name before it) was accepted; trailing spaces (the format's padding) still are. */
static void test_safetensors_header(void **state) {
    (void)state;
    const char *dir = folder(NULL, NULL, NULL);
    st_edit(dir, NULL, NULL, "     ", 5);
    flm_gguf_close(converted(dir));
    st_edit(dir, NULL, NULL, " x", 2);
    refused(dir, "model.safetensors", "after the JSON value");
    st_edit(dir, NULL, NULL, "\0", 1);
    refused(dir, "model.safetensors", "NUL byte");
    st_edit(dir, "\"model.decoder.final_layer_norm.bias\"", "\"model.decoder.final_layer_norm.bias\\u0000x\"", "", 0);
    refused(dir, "model.safetensors", "\\u0000");
    rm_folder(dir);
}

/* 7. merges.txt lines were read 4095 bytes at a time: a longer merge was split (and refused as "not two pieces"). */
static void test_merges_txt(void **state) {
    (void)state;
    const char *dir = folder(NULL, NULL, NULL);
    char path[4300];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_int_equal(remove(path), 0);
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    tu_write_file(path, "{\"h\": 3}", 8);
    size_t n = 5000;
    char *m = malloc(n + 64);
    strcpy(m, "#version: 0.2\nh e\n");
    size_t at = strlen(m);
    memset(m + at, 'a', n);
    strcpy(m + at + n, " b\n");
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    tu_write_file(path, m, strlen(m));
    free(m);
    flm_gguf_file *f = converted(dir);
    const flm_gguf_kv *kv = flm_gguf_find_kv(f, "tokenizer.ggml.merges");
    assert_non_null(kv);
    assert_int_equal(kv->arr_n, 2);
    assert_int_equal(kv->arr_str[1].len, n + 2);
    flm_gguf_close(f);
    rm_folder(dir);
}

/* 8. A JSON file that is a folder said only "read failed". */
static void test_json_folder(void **state) {
    (void)state;
    char path[4300];
    const char *dir = folder(NULL, NULL, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    refused(dir, "model.safetensors.index.json", "not a regular file");
    rm_folder(dir);
    dir = folder(NULL, NULL, NULL);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_int_equal(remove(path), 0);
    assert_int_equal(mkdir(path, 0755), 0);
    refused(dir, "tokenizer.json", "not a regular file");
    rm_folder(dir);
}

/* 9. tokenizer_config.json was never read: its chat_template (a string, or a list: "default", else the first) is
 * now tokenizer.chat_template, and its eos_token sets the eos id when config.json names none. */
static void test_tokenizer_config(void **state) {
    (void)state;
    static const char tmpl[] = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                               "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
                               "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    char path[4300], text[2048];
    const char *dir = folder("config.json", "\"eos_token_id\": 2,", "");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    snprintf(text, sizeof text, "{\"eos_token\": {\"content\": \"<|endoftext|>\"}, \"chat_template\": \"%s\"}", tmpl);
    tu_write_file(path, text, strlen(text));
    flm_gguf_file *f = converted(dir);
    const flm_gguf_kv *kv = flm_gguf_find_kv(f, "tokenizer.chat_template");
    assert_non_null(kv);
    assert_int_equal(kv->type, GGUF_VT_STRING);
    assert_int_equal(kv->v.str.len, strlen("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                                           "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
                                           "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"));
    assert_int_equal(gguf_u32(f, "tokenizer.ggml.eos_token_id"), 0); /* <|endoftext|> */
    flm_gguf_close(f);
    /* the list form: the one named "default" */
    snprintf(text, sizeof text, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
             "{\"name\": \"default\", \"template\": \"DEF\"}]}");
    tu_write_file(path, text, strlen(text));
    f = converted(dir);
    kv = flm_gguf_find_kv(f, "tokenizer.chat_template");
    assert_non_null(kv);
    assert_int_equal(kv->v.str.len, 3);
    assert_memory_equal(kv->v.str.data, "DEF", 3);
    flm_gguf_close(f);
    /* a wrong type is refused by name */
    tu_write_file(path, "{\"chat_template\": 5}", 20);
    refused(dir, "tokenizer_config.json", "chat_template");
    tu_write_file(path, "{\"eos_token\": 5}", 16);
    refused(dir, "tokenizer_config.json", "eos_token");
    rm_folder(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_long_piece),         cmocka_unit_test(test_tokenizer_fields),
        cmocka_unit_test(test_token_ids),          cmocka_unit_test(test_tie),
        cmocka_unit_test(test_layers),             cmocka_unit_test(test_json_text),
        cmocka_unit_test(test_safetensors_header), cmocka_unit_test(test_merges_txt),
        cmocka_unit_test(test_json_folder),        cmocka_unit_test(test_tokenizer_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
