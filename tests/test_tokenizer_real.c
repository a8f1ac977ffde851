/* test_tokenizer_real.c — the tokenizers of the real models against llama.cpp's ids.
 *
 * For each model in ~/.cache/flashlm/models/ (absent: skipped, or failed when FLASHLM_REQUIRE_MODELS=1), every line
 * of tests/data/reference/<model>/tokenize.jsonl (made with `llama-tokenize --ids`: special tokens parsed, BOS as
 * add_bos_token says) must give the same ids, and so must the prompts (and prompt + completion texts) of
 * greedy.jsonl; decoding the ids must give the text back (control tokens written as their text). Also: the
 * end-of-generation tokens, the GPT-2 tokenizer of tests/data/tokenizers/gpt2 (no model file needed), unknown
 * tokenizer models and pre-tokenizers, and the speed of tokenizing wiki.test.raw (printed, not asserted). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "format/gguf.h"
#include "write/gguf_write.h"
#include "format/tokenizer.h"
#include "testutil.h"

typedef struct {
    const char *file;   /* under ~/.cache/flashlm/models/ */
    const char *ref;    /* under tests/data/reference/ */
} model_ref;

static const model_ref MODELS[] = {
    {"smollm2-135m.gguf", "smollm2-135m-instruct-q4_1"},
    {"qwen2.5-coder-0.5b.gguf", "qwen2.5-coder-0.5b-instruct"},
    {"gemma-3-270m.gguf", "gemma-3-270m-q4_k_m"},
    {"qwen2.5-coder-1.5b.gguf", "qwen2.5-coder-1.5b-instruct-q4_k_m"},
};

static const char *model_path(const char *file) {
    static char buf[1024];
    const char *home = getenv("HOME");
    snprintf(buf, sizeof buf, "%s/.cache/flashlm/models/%s", home ? home : "", file);
    return buf;
}

/* Skip the test (fail under FLASHLM_REQUIRE_MODELS=1) when the model file is absent. Call before allocating. */
static void need_model(const char *file) {
    const char *path = model_path(file);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        const char *req = getenv("FLASHLM_REQUIRE_MODELS");
        if (req && strcmp(req, "1") == 0) fail_msg("%s is missing and FLASHLM_REQUIRE_MODELS=1", path);
        print_message("skipped: %s is absent\n", path);
        skip();
    }
    fclose(fp);
}

/* Open the model's tokenizer (need_model first). */
static flm_tokenizer *open_tok(const char *file) {
    need_model(file);
    const char *path = model_path(file);
    FILE *fp;
    flm_gguf_file *f = NULL;
    flm_tokenizer *t = NULL;
    flm_error err;
    void *map = MAP_FAILED;
    size_t size = 0;
    flm_status st = flm_gguf_open(path, &f, &err);
    if (st == FLM_ERR_UNSUPPORTED) {
        /* a tensor type this build cannot read yet: the metadata alone, from a private copy of the mapping whose
         * header says there are no tensors */
        fp = fopen(path, "rb");
        assert_non_null(fp);
        fseek(fp, 0, SEEK_END);
        size = (size_t)ftell(fp);
        map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fileno(fp), 0);
        fclose(fp);
        assert_true(map != MAP_FAILED && size > 24);
        memset((char *)map + 8, 0, 8); /* u64 tensor_count */
        st = flm_gguf_open_buffer(path, map, size, &f, &err);
    }
    if (st) fail_msg("%s", err.msg);
    if (flm_tokenizer_from_gguf(f, &t, &err)) fail_msg("%s", err.msg);
    flm_gguf_close(f);
    if (map != MAP_FAILED) munmap(map, size);
    return t;
}

/* The ids of a JSON array. */
static int32_t *json_ids(const cJSON *arr, size_t *n) {
    assert_true(cJSON_IsArray(arr));
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    assert_non_null(ids);
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        assert_true(cJSON_IsNumber(v));
        ids[i++] = (int32_t)v->valuedouble;
    }
    return ids;
}

/* Encode as llama-tokenize does (add_special, parse_special). */
static int32_t *encode(const flm_tokenizer *t, const char *text, size_t *n) {
    unsigned flags = flm_tokenizer_special_flags(t) | FLM_TOKENIZE_PARSE_SPECIAL;
    size_t len = strlen(text);
    size_t need = flm_tokenizer_encode_ex(t, text, len, flags, NULL, 0);
    assert_true(need != SIZE_MAX);
    int32_t *ids = malloc((need + 1) * sizeof *ids);
    assert_non_null(ids);
    assert_int_equal(flm_tokenizer_encode_ex(t, text, len, flags, ids, need), need);
    *n = need;
    return ids;
}

/* Decode ids (after a leading BOS the model added), control tokens as their vocabulary text. */
static char *decode(const flm_tokenizer *t, const int32_t *ids, size_t n) {
    size_t cap = 64, len = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    size_t i0 = (n > 0 && flm_tokenizer_wants_bos(t) && ids[0] == flm_tokenizer_bos(t)) ? 1 : 0;
    for (size_t i = i0; i < n; i++) {
        size_t m;
        const char *p = flm_tokenizer_piece(t, i > 0 ? ids[i - 1] : -1, ids[i], &m);
        if (m == 0) {
            p = flm_tokenizer_vocab(t, ids[i]);
            m = strlen(p);
        }
        while (len + m + 1 > cap) {
            cap *= 2;
            s = realloc(s, cap);
            assert_non_null(s);
        }
        memcpy(s + len, p, m);
        len += m;
    }
    s[len] = 0;
    return s;
}

static char *format_ids(const int32_t *ids, size_t n) {
    char *s = malloc(12 * n + 3);
    size_t k = 0;
    s[k++] = '[';
    for (size_t i = 0; i < n; i++) k += (size_t)sprintf(s + k, i ? ",%d" : "%d", ids[i]);
    s[k++] = ']';
    s[k] = 0;
    return s;
}

/* Compare the encoding of text with want; print a difference. Returns true when equal. */
static bool check_ids(const flm_tokenizer *t, const char *what, const char *text, const int32_t *want,
                      size_t n_want) {
    size_t n;
    int32_t *got = encode(t, text, &n);
    bool same = n == n_want && memcmp(got, want, n * sizeof *got) == 0;
    if (!same) {
        char *g = format_ids(got, n), *w = format_ids(want, n_want);
        print_message("%s: ids differ for \"%s\"\n  got  %s\n  want %s\n", what, text, g, w);
        free(g);
        free(w);
    }
    free(got);
    return same;
}

static char *read_text(const char *path) {
    size_t len;
    uint8_t *b = tu_read_file(path, &len);
    char *s = realloc(b, len + 1);
    assert_non_null(s);
    s[len] = 0;
    return s;
}

/* Every line of tokenize.jsonl and greedy.jsonl of model k. */
static void check_reference(int k) {
    flm_tokenizer *t = open_tok(MODELS[k].file);
    char rel[256];
    snprintf(rel, sizeof rel, "reference/%s/tokenize.jsonl", MODELS[k].ref);
    char *all = read_text(tu_data(rel));
    int n_lines = 0, n_ids = 0, n_round = 0;
    for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
        assert_true(cJSON_IsString(text));
        size_t n_want;
        int32_t *want = json_ids(cJSON_GetObjectItemCaseSensitive(j, "ids"), &n_want);
        n_lines++;
        n_ids += check_ids(t, MODELS[k].ref, text->valuestring, want, n_want);
        char *back = decode(t, want, n_want);
        if (strcmp(back, text->valuestring) == 0) n_round++;
        else print_message("%s: \"%s\" decodes to \"%s\"\n", MODELS[k].ref, text->valuestring, back);
        free(back);
        free(want);
        cJSON_Delete(j);
    }
    free(all);
    snprintf(rel, sizeof rel, "reference/%s/greedy.jsonl", MODELS[k].ref);
    all = read_text(tu_data(rel));
    int n_greedy = 0, n_greedy_ok = 0;
    for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        const cJSON *completion = cJSON_GetObjectItemCaseSensitive(j, "completion");
        assert_true(cJSON_IsString(prompt) && cJSON_IsString(completion));
        size_t n_want;
        int32_t *want = json_ids(cJSON_GetObjectItemCaseSensitive(j, "ids_prompt"), &n_want);
        n_greedy++;
        n_greedy_ok += check_ids(t, MODELS[k].ref, prompt->valuestring, want, n_want);
        free(want);
        size_t lp = strlen(prompt->valuestring), lc = strlen(completion->valuestring);
        char *both = malloc(lp + lc + 1);
        memcpy(both, prompt->valuestring, lp);
        memcpy(both + lp, completion->valuestring, lc + 1);
        want = json_ids(cJSON_GetObjectItemCaseSensitive(j, "ids_prompt_plus_completion"), &n_want);
        n_greedy++;
        n_greedy_ok += check_ids(t, MODELS[k].ref, both, want, n_want);
        free(want);
        free(both);
        cJSON_Delete(j);
    }
    free(all);
    print_message("%s: tokenize.jsonl %d/%d ids equal, %d/%d decode back; greedy.jsonl %d/%d ids equal\n",
                  MODELS[k].ref, n_ids, n_lines, n_round, n_lines, n_greedy_ok, n_greedy);
    assert_true(n_lines >= 10);
    assert_int_equal(n_ids, n_lines);
    assert_int_equal(n_greedy_ok, n_greedy);
    assert_int_equal(n_round, n_lines);
    flm_tokenizer_free(t);
}

static void test_smollm2(void **state) { (void)state; check_reference(0); }
static void test_qwen05(void **state) { (void)state; check_reference(1); }
static void test_gemma3(void **state) { (void)state; check_reference(2); }
static void test_qwen15(void **state) { (void)state; check_reference(3); }

/* End of generation, BOS, lookups, the flags llama.cpp's add_special gives. */
static void test_special_tokens(void **state) {
    (void)state;
    need_model(MODELS[0].file);
    need_model(MODELS[2].file);
    flm_tokenizer *t = open_tok(MODELS[1].file); /* Qwen2.5 */
    int32_t im_end = flm_tokenizer_find(t, "<|im_end|>"), eot = flm_tokenizer_find(t, "<|endoftext|>");
    assert_int_equal(im_end, 151645);
    assert_int_equal(eot, 151643);
    assert_true(flm_tokenizer_is_eog(t, im_end));
    assert_true(flm_tokenizer_is_eog(t, eot));
    assert_true(flm_tokenizer_is_eog(t, flm_tokenizer_find(t, "<|file_sep|>"))); /* FIM separator */
    assert_false(flm_tokenizer_is_eog(t, flm_tokenizer_find(t, "<|im_start|>")));
    assert_false(flm_tokenizer_is_eog(t, 9707)); /* "Hello" */
    assert_false(flm_tokenizer_is_eog(t, -1));
    assert_false(flm_tokenizer_wants_bos(t));
    assert_int_equal(flm_tokenizer_find(t, "no such token"), -1);
    /* without PARSE_SPECIAL a control token's spelling is ordinary text */
    int32_t ids[32];
    size_t n = flm_tokenizer_encode_ex(t, "<|im_end|>", 10, 0, ids, 32);
    assert_true(n > 1);
    assert_int_equal(flm_tokenizer_encode_ex(t, "<|im_end|>", 10, FLM_TOKENIZE_PARSE_SPECIAL, ids, 32), 1);
    assert_int_equal(ids[0], im_end);
    /* control tokens decode to nothing, user-defined ones to their text */
    size_t m;
    flm_tokenizer_piece(t, -1, im_end, &m);
    assert_int_equal(m, 0);
    const char *p = flm_tokenizer_piece(t, -1, flm_tokenizer_find(t, "<tool_call>"), &m);
    assert_int_equal(m, 11);
    assert_memory_equal(p, "<tool_call>", 11);
    /* user-defined tokens are matched even without PARSE_SPECIAL (llama.cpp's tokenizer_st_partition) */
    assert_int_equal(flm_tokenizer_encode_ex(t, "<tool_call>", 11, 0, ids, 32), 1);
    assert_int_equal(ids[0], 151657);
    /* not NUL-terminated input: only len bytes count */
    assert_int_equal(flm_tokenizer_encode_ex(t, "Hello world", 5, 0, ids, 32), 1);
    assert_int_equal(ids[0], 9707);
    flm_tokenizer_free(t);

    t = open_tok(MODELS[2].file); /* Gemma 3 */
    assert_true(flm_tokenizer_wants_bos(t));
    assert_int_equal(flm_tokenizer_bos(t), 2);
    assert_true(flm_tokenizer_is_eog(t, 1)); /* <eos> */
    assert_true(flm_tokenizer_is_eog(t, flm_tokenizer_find(t, "<end_of_turn>")));
    assert_false(flm_tokenizer_is_eog(t, flm_tokenizer_find(t, "<start_of_turn>")));
    assert_int_equal(flm_tokenizer_n_vocab(t), 262144);
    /* no space prefix: "Hello" is not "▁Hello"; BOS first */
    n = flm_tokenizer_encode_ex(t, "Hello", 5, flm_tokenizer_special_flags(t), ids, 32);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 2);
    assert_string_equal(flm_tokenizer_vocab(t, ids[1]), "Hello");
    /* user-defined runs of spaces: the longest first (31), then the rest (4) */
    n = flm_tokenizer_encode_ex(t, "                                   ", 35, 0, ids, 32);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 167);
    assert_int_equal(ids[1], 140);
    /* after BOS a leading space stays (no space prefix to undo) */
    p = flm_tokenizer_piece(t, 2, 26352, &m); /* "▁Hello" */
    assert_int_equal(m, 6);
    assert_memory_equal(p, " Hello", 6);
    /* byte fallback: U+10000 (LINEAR B SYLLABLE B008 A) is not in the vocabulary: four byte tokens */
    static const char *const byte_names[] = {"<0xF0>", "<0x90>", "<0x80>", "<0x80>"};
    n = flm_tokenizer_encode_ex(t, "\xf0\x90\x80\x80", 4, 0, ids, 32);
    assert_int_equal(n, 4);
    for (int i = 0; i < 4; i++) {
        p = flm_tokenizer_piece(t, -1, ids[i], &m);
        assert_int_equal(m, 1);
        assert_int_equal((uint8_t)p[0], (uint8_t)"\xf0\x90\x80\x80"[i]);
        assert_string_equal(flm_tokenizer_vocab(t, ids[i]), byte_names[i]);
    }
    flm_tokenizer_free(t);

    t = open_tok(MODELS[0].file); /* SmolLM2 */
    assert_int_equal(flm_tokenizer_eos(t), 2);
    assert_true(flm_tokenizer_is_eog(t, 2)); /* <|im_end|> */
    assert_true(flm_tokenizer_is_eog(t, 0)); /* <|endoftext|> */
    assert_false(flm_tokenizer_is_eog(t, 1)); /* <|im_start|> */
    flm_tokenizer_free(t);
}

/* GPT-2's own tokenizer from vocab.json + merges.txt (no model file needed): pre-tokenizer "gpt2". */
static void test_gpt2_files(void **state) {
    (void)state;
    char *vocab = read_text(tu_data("tokenizers/gpt2/vocab.json"));
    char *merges = read_text(tu_data("tokenizers/gpt2/merges.txt"));
    cJSON *v = cJSON_Parse(vocab);
    assert_non_null(v);
    uint32_t n = (uint32_t)cJSON_GetArraySize(v);
    assert_int_equal(n, 50257);
    const char **pieces = calloc(n, sizeof *pieces);
    uint32_t *lens = calloc(n, sizeof *lens);
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        int id = (int)e->valuedouble;
        assert_true(id >= 0 && (uint32_t)id < n);
        pieces[id] = e->string;
        lens[id] = (uint32_t)strlen(e->string);
    }
    for (uint32_t i = 0; i < n; i++) assert_non_null(pieces[i]);
    /* merges.txt: "a b" lines (a "#version" first line in some copies) */
    size_t cap = 60000, n_m = 0;
    const char **ml = malloc(cap * sizeof *ml);
    uint32_t *mlen = malloc(cap * sizeof *mlen);
    for (char *line = strtok(merges, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "#version", 8) == 0) continue;
        assert_true(n_m < cap);
        ml[n_m] = line;
        mlen[n_m++] = (uint32_t)strlen(line);
    }
    assert_int_equal(n_m, 50000);
    int32_t eot = 50256;
    flm_tokenizer_spec sp = {.model = "gpt2", .pre = "gpt2", .n_vocab = n, .pieces = pieces, .lens = lens,
                             .n_merges = (uint32_t)n_m, .merges = ml, .merge_lens = mlen, .bos = eot, .eos = eot,
                             .eot = -1, .eom = -1, .fim_pad = -1, .fim_rep = -1, .fim_sep = -1, .add_bos = -1,
                             .add_eos = -1, .add_space_prefix = -1};
    flm_tokenizer *t = NULL;
    flm_error err;
    if (flm_tokenizer_create_spec(&sp, &t, &err)) fail_msg("%s", err.msg);
    /* well-known GPT-2 ids */
    int32_t ids[64];
    assert_int_equal(flm_tokenizer_encode_ex(t, "Hello world", 11, 0, ids, 64), 2);
    assert_int_equal(ids[0], 15496);
    assert_int_equal(ids[1], 995);
    assert_int_equal(flm_tokenizer_encode_ex(t, "hello world", 11, 0, ids, 64), 2);
    assert_int_equal(ids[0], 31373);
    assert_int_equal(flm_tokenizer_encode_ex(t, "The", 3, 0, ids, 64), 1);
    assert_int_equal(ids[0], 464);
    assert_int_equal(flm_tokenizer_encode_ex(t, " the", 4, 0, ids, 64), 1);
    assert_int_equal(ids[0], 262);
    assert_int_equal(flm_tokenizer_encode_ex(t, "\n", 1, 0, ids, 64), 1);
    assert_int_equal(ids[0], 198);
    assert_false(flm_tokenizer_wants_bos(t)); /* gpt2 default */
    assert_true(flm_tokenizer_is_eog(t, 50256)); /* <|endoftext|>, found by its text */
    /* round trips, byte for byte, invalid UTF-8 included */
    static const char *texts[] = {
        "Hello world", "  two  spaces\n\n\ttab", "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80",
        "x\x80y\xe2\x98", "I'm sure they'll say it's fine", "3.14159 and 1,000,000", "",
    };
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        size_t m;
        int32_t *got = encode(t, texts[k], &m);
        char *back = decode(t, got, m);
        assert_string_equal(back, texts[k]);
        free(back);
        free(got);
    }
    flm_tokenizer_free(t);
    /* the other pre-tokenizers on the same vocabulary: how "12345 I'M" is cut */
    static const struct { const char *pre; size_t cuts[8]; } PRE[] = {
        {"qwen2", {1, 2, 3, 4, 5, 0}},            /* \p{N}: one digit a piece */
        {"deepseek-r1-qwen", {1, 2, 3, 4, 5, 0}}, /* = qwen2 */
        {"smollm", {1, 2, 3, 4, 5, 0}},           /* \p{N} first, then GPT-2's */
        {"llama-bpe", {3, 5, 0}},                 /* \p{N}{1,3} */
    };
    for (size_t k = 0; k < sizeof PRE / sizeof *PRE; k++) {
        sp.pre = PRE[k].pre;
        if (flm_tokenizer_create_spec(&sp, &t, &err)) fail_msg("%s: %s", PRE[k].pre, err.msg);
        size_t m = flm_tokenizer_encode_ex(t, "12345 I'M", 9, 0, ids, 64);
        assert_true(m <= 64);
        size_t at = 0, c = 0;
        for (size_t i = 0; i < m && at < 5; i++) { /* every cut must be a token boundary */
            size_t pl;
            flm_tokenizer_piece(t, -1, ids[i], &pl);
            at += pl;
            if (at != PRE[k].cuts[c]) fail_msg("%s: token %zu ends at byte %zu, want %zu", PRE[k].pre, i, at,
                                               PRE[k].cuts[c]);
            c++;
        }
        assert_int_equal(PRE[k].cuts[c], 0);
        char *back = decode(t, ids, m);
        assert_string_equal(back, "12345 I'M");
        free(back);
        flm_tokenizer_free(t);
    }
    /* an unknown pre-tokenizer is refused, naming it */
    sp.pre = "no-such-pre";
    assert_int_equal(flm_tokenizer_create_spec(&sp, &t, &err), FLM_ERR_UNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(err.msg, "no-such-pre"));
    cJSON_Delete(v);
    free(pieces);
    free(lens);
    free(ml);
    free(mlen);
    free(vocab);
    free(merges);
}

/* An unknown tokenizer.ggml.model: FLM_ERR_UNSUPPORTED naming the file and the model string. */
static void test_unknown_model(void **state) {
    (void)state;
    const char *path = tu_tmp("tok-bert", ".gguf");
    flm_gguf_writer *w = NULL;
    flm_error err;
    assert_int_equal(flm_gguf_writer_create(path, FLM_OUT_REPLACE, &w, &err), FLM_OK);
    assert_int_equal(flm_gguf_writer_kv_str(w, "tokenizer.ggml.model", "bert"), FLM_OK);
    const char *toks[] = {"a", "b"};
    assert_int_equal(flm_gguf_writer_kv_arr(w, "tokenizer.ggml.tokens", GGUF_VT_STRING, toks, 2), FLM_OK);
    assert_int_equal(flm_gguf_writer_begin(w, &err), FLM_OK);
    assert_int_equal(flm_gguf_writer_finish(w, &err), FLM_OK);
    flm_gguf_writer_free(w);
    flm_gguf_file *f = NULL;
    assert_int_equal(flm_gguf_open(path, &f, &err), FLM_OK);
    flm_tokenizer *t = (flm_tokenizer *)&err; /* must be reset to NULL */
    assert_int_equal(flm_tokenizer_from_gguf(f, &t, &err), FLM_ERR_UNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(err.msg, "bert"));
    assert_non_null(strstr(err.msg, path));
    flm_gguf_close(f);
    remove(path);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Tokenizing wiki.test.raw (as perplexity runs do): the time is printed; the text must decode back. */
static void test_wiki_speed(void **state) {
    (void)state;
    need_model(MODELS[1].file);
    need_model(MODELS[2].file);
    char *text = read_text(tu_data("text/wiki.test.raw"));
    size_t len = strlen(text);
    for (int k = 1; k <= 2; k++) { /* Qwen2.5 (byte-level BPE), Gemma 3 (SentencePiece, 262k vocabulary) */
        flm_tokenizer *t = open_tok(MODELS[k].file);
        double t0 = now_s();
        size_t n = flm_tokenizer_encode_ex(t, text, len, flm_tokenizer_special_flags(t), NULL, 0);
        double dt = now_s() - t0;
        assert_true(n != SIZE_MAX && n > len / 8 && n < len);
        int32_t *ids = malloc(n * sizeof *ids);
        assert_non_null(ids);
        assert_int_equal(flm_tokenizer_encode_ex(t, text, len, flm_tokenizer_special_flags(t), ids, n), n);
        char *back = decode(t, ids, n);
        assert_true(strcmp(back, text) == 0);
        print_message("%s: wiki.test.raw, %zu bytes -> %zu tokens in %.3f s\n", MODELS[k].ref, len, n, dt);
        free(back);
        free(ids);
        flm_tokenizer_free(t);
    }
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2),        cmocka_unit_test(test_qwen05),
        cmocka_unit_test(test_gemma3),         cmocka_unit_test(test_qwen15),
        cmocka_unit_test(test_special_tokens), cmocka_unit_test(test_gpt2_files),
        cmocka_unit_test(test_unknown_model),  cmocka_unit_test(test_wiki_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
