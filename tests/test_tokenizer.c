/* test_tokenizer.c — SentencePiece BPE from GGUF metadata: known ids, agreement with an independent re-implementation
 * of llama2.c's encoder over its own tokenizer file (tok512.bin), byte fallback, round trips, empty input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "flashlm.h"
#include "testutil.h"

static flm_ctx *ctx;

static int setup(void **state) {
    (void)state;
    flm_params p;
    flm_params_default(&p);
    p.n_ctx = 16;
    flm_error err;
    if (flm_open(tu_data("models/stories260K/stories260K.gguf"), &p, &ctx, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}
static int teardown(void **state) {
    (void)state;
    flm_close(ctx);
    return 0;
}

/* ---- llama2.c's encoder (run.c `encode`), written again here as an independent reference ---------------------- */
typedef struct { char **vocab; float *scores; int n; } ref_tok;

static ref_tok load_tok512(void) {
    size_t len;
    uint8_t *b = tu_read_file(tu_data("models/stories260K/tok512.bin"), &len);
    ref_tok t = {calloc(512, sizeof(char *)), calloc(512, sizeof(float)), 512};
    size_t o = 4; /* max_token_length */
    for (int i = 0; i < 512; i++) {
        int32_t n;
        assert_true(o + 8 <= len);
        memcpy(&t.scores[i], b + o, 4);
        memcpy(&n, b + o + 4, 4);
        o += 8;
        if (n < 0 || n > 64 || o + (size_t)n > len) fail_msg("tok512.bin: bad token length %d", n);
        n &= 0x7f;
        t.vocab[i] = calloc((size_t)n + 1, 1);
        memcpy(t.vocab[i], b + o, (size_t)n);
        o += (size_t)n;
    }
    free(b);
    return t;
}

static int ref_lookup(const ref_tok *t, const char *s) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->vocab[i], s)) return i;
    return -1;
}

static int ref_encode(const ref_tok *t, const char *text, int *out) {
    int n = 0;
    out[n++] = 1; /* BOS */
    if (text[0]) out[n++] = ref_lookup(t, " ");
    char buf[64];
    size_t bl = 0;
    for (const char *c = text; *c; c++) {
        if ((*c & 0xC0) != 0x80) bl = 0;
        buf[bl++] = *c;
        buf[bl] = 0;
        if ((*(c + 1) & 0xC0) == 0x80 && bl < 4) continue;
        int id = ref_lookup(t, buf);
        if (id >= 0) out[n++] = id;
        else for (size_t i = 0; i < bl; i++) out[n++] = (unsigned char)buf[i] + 3;
        bl = 0;
    }
    for (;;) {
        float best = -1e10f;
        int best_id = -1, best_idx = -1;
        char m[256];
        for (int i = 0; i < n - 1; i++) {
            if (i == 0) continue; /* never merge BOS */
            snprintf(m, sizeof m, "%s%s", t->vocab[out[i]], t->vocab[out[i + 1]]);
            int id = ref_lookup(t, m);
            if (id >= 0 && t->scores[id] > best) { best = t->scores[id]; best_id = id; best_idx = i; }
        }
        if (best_idx < 0) break;
        out[best_idx] = best_id;
        for (int i = best_idx + 1; i < n - 1; i++) out[i] = out[i + 1];
        n--;
    }
    return n;
}

static const char *TEXTS[] = {
    "Once upon a time",
    "",
    "a",
    " leading space",
    "two  spaces   and\nnewlines\n\n",
    "Lily said, \"I'm sorry, mom.\" Tom's dog (the big one) ran 123 km!",
    "caf\xc3\xa9 na\xc3\xafve \xe2\x98\x83 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80", /* café naïve ☃ 日本 😀 */
    "\t tab~`^|{}",
};

static void test_known_ids(void **state) {
    (void)state;
    int32_t ids[16];
    assert_int_equal(flm_tokenize(ctx, "Once upon a time", true, ids, 16), 5);
    int32_t want[] = {1, 403, 407, 261, 378};
    assert_memory_equal(ids, want, sizeof want);
    /* without BOS */
    assert_int_equal(flm_tokenize(ctx, "Once upon a time", false, ids, 16), 4);
    assert_int_equal(ids[0], 403);
    /* capacity too small: the needed count is still returned */
    assert_int_equal(flm_tokenize(ctx, "Once upon a time", true, ids, 2), 5);
}

static void test_matches_llama2c_encoder(void **state) {
    (void)state;
    ref_tok t = load_tok512();
    for (size_t k = 0; k < sizeof TEXTS / sizeof *TEXTS; k++) {
        int want[1024];
        int32_t got[1024];
        int nw = ref_encode(&t, TEXTS[k], want);
        size_t ng = flm_tokenize(ctx, TEXTS[k], true, got, 1024);
        if ((size_t)nw != ng) fail_msg("'%s': %zu tokens, llama2.c gives %d", TEXTS[k], ng, nw);
        for (int i = 0; i < nw; i++)
            if (got[i] != want[i]) fail_msg("'%s': token %d is %d, llama2.c gives %d", TEXTS[k], i, got[i], want[i]);
    }
    for (int i = 0; i < 512; i++) free(t.vocab[i]);
    free(t.vocab);
    free(t.scores);
}

static char *decode(const int32_t *ids, size_t n) {
    char *s = calloc(4096, 1);
    size_t len = 0;
    for (size_t i = 1; i < n; i++) {
        size_t m;
        const char *p = flm_token_piece(ctx, ids[i - 1], ids[i], &m);
        assert_true(len + m < 4096);
        memcpy(s + len, p, m);
        len += m;
    }
    return s;
}

static void test_round_trips(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof TEXTS / sizeof *TEXTS; k++) {
        int32_t ids[1024];
        size_t n = flm_tokenize(ctx, TEXTS[k], true, ids, 1024);
        char *back = decode(ids, n);
        assert_string_equal(back, TEXTS[k]);
        free(back);
    }
}

static void test_byte_fallback(void **state) {
    (void)state;
    /* "☃" (E2 98 83) is not in the 512-token vocabulary: it must become the three byte tokens <0xE2><0x98><0x83> */
    int32_t ids[16];
    size_t n = flm_tokenize(ctx, "\xe2\x98\x83", true, ids, 16);
    assert_true(n >= 4);
    assert_int_equal(ids[n - 3], 0xE2 + 3);
    assert_int_equal(ids[n - 2], 0x98 + 3);
    assert_int_equal(ids[n - 1], 0x83 + 3);
    /* invalid UTF-8 (a lone continuation byte, a truncated sequence) survives the round trip byte for byte */
    const char *bad = "x\x80y\xe2\x98";
    n = flm_tokenize(ctx, bad, true, ids, 16);
    char *back = decode(ids, n);
    assert_string_equal(back, bad);
    free(back);
}

static void test_empty(void **state) {
    (void)state;
    int32_t ids[4];
    assert_int_equal(flm_tokenize(ctx, "", true, ids, 4), 1);
    assert_int_equal(ids[0], 1);
    assert_int_equal(flm_tokenize(ctx, "", false, ids, 4), 0);
}

static void test_control_tokens_decode_to_nothing(void **state) {
    (void)state;
    size_t n = 99;
    flm_token_piece(ctx, 5, 1, &n); /* BOS */
    assert_int_equal(n, 0);
    flm_token_piece(ctx, 5, 2, &n); /* EOS */
    assert_int_equal(n, 0);
    flm_token_piece(ctx, 5, 100000, &n); /* out of range */
    assert_int_equal(n, 0);
}

/* flm_tokenize_ex: special tokens parsed only when asked; a space prefix after each special token (llama.cpp's SPM
 * is_prev_special); only len bytes read; EOS ends generation, BOS does not. */
static void test_tokenize_ex(void **state) {
    (void)state;
    int32_t ids[32], plain[32];
    /* "<s>" as text: ordinary characters */
    size_t n = flm_tokenize_ex(ctx, "<s>Once", 7, 0, ids, 32);
    assert_true(n > 2);
    assert_int_not_equal(ids[0], 1);
    /* parsed: BOS, then "Once" with its space prefix, as at the start of a text */
    n = flm_tokenize_ex(ctx, "<s>Once", 7, FLM_TOKENIZE_PARSE_SPECIAL, ids, 32);
    size_t m = flm_tokenize_ex(ctx, "Once", 4, 0, plain, 32);
    assert_int_equal(n, m + 1);
    assert_int_equal(ids[0], 1);
    assert_memory_equal(ids + 1, plain, m * sizeof *ids);
    /* with the model's special tokens (stories260K: add_bos_token) */
    n = flm_tokenize_ex(ctx, "Once upon a time, long ago", 16, FLM_TOKENIZE_ADD_SPECIAL, ids, 32);
    int32_t want[] = {1, 403, 407, 261, 378};
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want, sizeof want);
    assert_true(flm_token_is_eog(ctx, 2));
    assert_false(flm_token_is_eog(ctx, 1));
    assert_false(flm_token_is_eog(ctx, 403));
    assert_false(flm_token_is_eog(ctx, 1 << 20));
}

/* Out of memory is reported as such (SIZE_MAX, NULL), not as an empty or short encoding: under an address-space limit
 * a little above what the process maps now, a 16 MiB text (whose symbols need ~512 MiB) cannot be encoded.
 * Skipped under sanitizers (their shadow memory needs the address space). */
static void test_out_of_memory(void **state) {
    (void)state;
#if defined(FLM_SANITIZED_BUILD) || defined(FLM_EMULATED_BUILD) /* RLIMIT_AS would limit qemu-user itself */
    skip();
#else
    size_t len = 16u << 20;
    char *text = malloc(len + 1);
    assert_non_null(text);
    for (size_t i = 0; i < len; i++) text[i] = "ab "[i % 3];
    text[len] = 0;
    long pages = 0, page = sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%ld", &pages), 1);
    fclose(f);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
    lim = old;
    lim.rlim_cur = (rlim_t)pages * (rlim_t)page + (64u << 20);
    assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
    int32_t ids[8];
    size_t n = flm_tokenize(ctx, text, true, ids, 8);
    size_t n_all = 99;
    int32_t *all = flm_tokenize_all(ctx, text, true, &n_all);
    assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
    assert_true(n == SIZE_MAX);
    assert_null(all);
    /* with the limit gone the same text encodes */
    n = flm_tokenize(ctx, text, true, ids, 8);
    assert_true(n != SIZE_MAX && n > len / 4);
    free(text);
#endif
}

/* flm_utf8_check against an independent decoder: the sequence's bits put together and judged by the definition
 * (RFC 3629 section 4: the shortest form of a code point at most U+10FFFF, not a surrogate), over every sequence of
 * one to three bytes and a sample of four, each followed by 'a' (and alone: truncated). */
static size_t ref_utf8_len(const unsigned char *p, size_t n) {
    size_t k = p[0] < 0x80 ? 1 : (p[0] & 0xE0) == 0xC0 ? 2 : (p[0] & 0xF0) == 0xE0 ? 3 : (p[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (!k || k > n) return 0;
    uint32_t v = k == 1 ? p[0] : p[0] & (0x7Fu >> k);
    for (size_t j = 1; j < k; j++) {
        if ((p[j] & 0xC0) != 0x80) return 0;
        v = v << 6 | (p[j] & 0x3Fu);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < least[k] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    return k;
}

static void test_utf8_check(void **state) {
    (void)state;
    unsigned char b[6];
    uint64_t checked = 0;
    for (uint32_t x = 0; x < (1u << 24); x++) {
        const size_t n = x < 256 ? 1 : x < 65536 ? 2 : 3;
        for (size_t j = 0; j < n; j++) b[j] = (unsigned char)(x >> (8 * (n - 1 - j)));
        b[n] = 'a';
        for (size_t len = n; len <= n + 1; len++) {
            size_t want = SIZE_MAX, i = 0;
            while (i < len) {
                size_t k = ref_utf8_len(b + i, len - i);
                if (!k) { want = i; break; }
                i += k;
            }
            if (flm_utf8_check((const char *)b, len) != want)
                fail_msg("bytes %06x (%zu): %zu, the reference %zu", x, len, flm_utf8_check((const char *)b, len), want);
            checked++;
        }
    }
    for (uint32_t x = 0xF0000000u; x; x += 0x00010101u) { /* four bytes: lead bytes F0..FF, continuations sampled */
        for (int j = 0; j < 4; j++) b[j] = (unsigned char)(x >> (8 * (3 - j)));
        size_t k = ref_utf8_len(b, 4), want = k == 4 ? SIZE_MAX : 0;
        if (k && k < 4) { size_t i = k; while (i < 4 && ref_utf8_len(b + i, 4 - i)) i += ref_utf8_len(b + i, 4 - i); want = i < 4 ? i : SIZE_MAX; }
        if (flm_utf8_check((const char *)b, 4) != want)
            fail_msg("bytes %08x: %zu, the reference %zu", x, flm_utf8_check((const char *)b, 4), want);
        checked++;
        if (x > 0xFFFFFFFFu - 0x00010101u) break;
    }
    assert_true(checked > 30000000u);
    assert_int_equal(flm_utf8_check("", 0), SIZE_MAX);
    assert_int_equal(flm_utf8_check("\xF0\x9F\xA6\x9C", 4), SIZE_MAX); /* U+1F99C */
    assert_int_equal(flm_utf8_check("a\xED\xA0\x80", 4), 1);           /* a surrogate */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_check),
        cmocka_unit_test(test_known_ids),
        cmocka_unit_test(test_matches_llama2c_encoder),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_byte_fallback),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_control_tokens_decode_to_nothing),
        cmocka_unit_test(test_tokenize_ex),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
