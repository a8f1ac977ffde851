/* fuzz_tokenizer.c — tokenizer encode and decode (src/format/tokenizer*.c) on arbitrary bytes, invalid UTF-8
 * included, for every tokenizer kind: SentencePiece ("llama"), GPT-2 byte-level BPE under each pre-tokenizer family
 * (gpt2, llama3 with and without ignore_merges, qwen2, smollm, default: the PCRE2 regexes), and the tokenizers built
 * from real GGUF metadata (flm_tokenizer_from_gguf): stories260K from tests/data and the pulled models (SmolLM2, Qwen2.5,
 * Gemma 3) when present. The small built-in vocabularies keep every kind covered without any model.
 *
 * Input: byte 0 picks the tokenizer (modulo their number), byte 1 the flags (ADD_BOS, PARSE_SPECIAL, ADD_EOS), the rest
 * is the text (also read as token ids for decoding). Checked: every id is in the vocabulary, the count does not depend
 * on the capacity given, the NUL-terminated entry point agrees, and byte-level BPE decodes back to exactly the input
 * bytes (without special-token parsing: it is lossless by construction). */
#include "fuzz_common.h"

#include "core/error.h"
#include "format/gguf.h"
#include "format/tokenizer.h"

#ifndef FLM_DATA_DIR
#define FLM_DATA_DIR "tests/data"
#endif

#define MAX_TOK 24
static flm_tokenizer *g_tok[MAX_TOK];
static bool g_lossless[MAX_TOK]; /* byte-level BPE: decode(encode(x)) == x, less the bytes it has no token for */
static bool g_byte_ok[MAX_TOK][256];
static const char *g_name[MAX_TOK];
static int g_n;

static size_t gpt2_char(int b, char *out);

static void add(flm_tokenizer *t, const char *name, bool lossless) {
    if (!t || g_n == MAX_TOK) return;
    for (int b = 0; b < 256; b++) { /* bytes whose GPT-2 character is a token (SmolLM2 lacks C0, C1, F5..FF) */
        char c[3] = {0};
        gpt2_char(b, c);
        g_byte_ok[g_n][b] = flm_tokenizer_find(t, c) >= 0;
    }
    g_tok[g_n] = t;
    g_name[g_n] = name;
    g_lossless[g_n++] = lossless;
}

/* GPT-2's byte -> character table (bytes_to_unicode), as UTF-8. */
static size_t gpt2_char(int b, char *out) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    uint32_t cp = (uint32_t)b;
    if (!printable) {
        cp = 256;
        for (int c = 0; c < b; c++) cp += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
    }
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* Built-in vocabularies: every byte, some merges and words, a user-defined and two control tokens. */
static const char *const WORDS[] = {"he", "ll", "llo", "hello", "wor", "world", "th", "the", "in", "ing", "12", "123",
                                    "é", "€", "日本", "'s", "  ", "\n\n", ".", "!", NULL};
static const char *const SPECIAL[] = {"<|user|>", "<|im_start|>", "<|im_end|>", NULL};

static flm_tokenizer *builtin(bool bpe, const char *pre, bool space_prefix) {
    static char store[256][16], words[32][24], spaced[32][32];
    const char *pieces[600];
    uint32_t lens[600];
    int32_t types[600];
    float scores[600];
    const char *merges[64];
    uint32_t merge_lens[64];
    static char mstore[64][32];
    uint32_t n = 0, nm = 0;
    pieces[n] = "<unk>"; types[n] = FLM_TOK_UNKNOWN; n++;
    pieces[n] = "<s>"; types[n] = FLM_TOK_CONTROL; n++;
    pieces[n] = "</s>"; types[n] = FLM_TOK_CONTROL; n++;
    for (int b = 0; b < 256; b++, n++) {
        if (bpe) store[b][gpt2_char(b, store[b])] = 0;
        else snprintf(store[b], sizeof store[b], "<0x%02X>", b);
        pieces[n] = store[b];
        types[n] = bpe ? FLM_TOK_NORMAL : FLM_TOK_BYTE;
    }
    for (int w = 0; WORDS[w]; w++) {
        char *s = words[w], *sp = spaced[w];
        size_t k = 0;
        for (const char *c = WORDS[w]; *c; c++) {
            if (bpe) k += gpt2_char((uint8_t)*c, s + k);
            else s[k++] = *c == ' ' ? '_' : *c;
        }
        s[k] = 0;
        pieces[n] = s; types[n] = FLM_TOK_NORMAL; n++;
        /* the word after a space: "Ġword" / "▁word" */
        if (bpe) snprintf(sp, sizeof spaced[w], "\xC4\xA0%.23s", s);
        else snprintf(sp, sizeof spaced[w], "\xE2\x96\x81%.23s", s);
        pieces[n] = sp; types[n] = FLM_TOK_NORMAL; n++;
        if (bpe && strlen(s) >= 2 && nm < 60) { /* merge "a b" of the word's first character and the rest */
            size_t first = ((uint8_t)s[0] & 0xE0) == 0xC0 ? 2 : 1;
            if (first < strlen(s)) {
                snprintf(mstore[nm], sizeof mstore[nm], "%.*s %.20s", (int)first, s, s + first);
                merges[nm] = mstore[nm];
                merge_lens[nm] = (uint32_t)strlen(mstore[nm]);
                nm++;
                snprintf(mstore[nm], sizeof mstore[nm], "\xC4\xA0 %.20s", s);
                merges[nm] = mstore[nm];
                merge_lens[nm] = (uint32_t)strlen(mstore[nm]);
                nm++;
            }
        }
    }
    pieces[n] = "\xE2\x96\x81"; types[n] = FLM_TOK_NORMAL; n++;
    for (int i = 0; SPECIAL[i]; i++, n++) {
        pieces[n] = SPECIAL[i];
        types[n] = i == 0 ? FLM_TOK_USER : FLM_TOK_CONTROL;
    }
    for (uint32_t i = 0; i < n; i++) {
        lens[i] = (uint32_t)strlen(pieces[i]);
        scores[i] = -(float)(i % 97) - (float)lens[i] * 0.25f;
    }
    flm_tokenizer_spec sp = {
        .model = bpe ? "gpt2" : "llama", .pre = pre, .n_vocab = n, .pieces = pieces, .lens = lens,
        .scores = scores, .types = types, .n_merges = nm, .merges = merges, .merge_lens = merge_lens,
        .bos = 1, .eos = 2, .eot = -1, .eom = -1, .fim_pad = -1, .fim_rep = -1, .fim_sep = -1,
        .add_bos = -1, .add_eos = -1, .add_space_prefix = space_prefix ? 1 : 0,
    };
    flm_tokenizer *t = NULL;
    flm_error err;
    if (flm_tokenizer_create_spec(&sp, &t, &err) != FLM_OK) {
        fprintf(stderr, "fuzz_tokenizer: built-in %s tokenizer: %s\n", bpe ? pre : "spm", err.msg);
        abort();
    }
    return t;
}

static flm_tokenizer *from_gguf(const char *path) {
    if (!path || access(path, R_OK) != 0) return NULL;
    flm_gguf_file *f = NULL;
    flm_tokenizer *t = NULL;
    flm_error err;
    if (flm_gguf_open(path, &f, &err) != FLM_OK || flm_tokenizer_from_gguf(f, &t, &err) != FLM_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
        abort();
    }
    flm_gguf_close(f);
    fprintf(stderr, "fuzz_tokenizer: tokenizer of %s\n", path);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    add(builtin(false, NULL, true), "spm", false);
    add(builtin(false, NULL, false), "spm-noprefix", false);
    static const char *const pres[] = {"gpt2", "llama-bpe", "dbrx", "qwen2", "smollm", "default"};
    for (size_t i = 0; i < sizeof pres / sizeof *pres; i++) add(builtin(true, pres[i], false), pres[i], true);
    add(from_gguf(FLM_DATA_DIR "/models/stories260K/stories260K.gguf"), "stories260K", false);
    static const char *const models[] = {"smollm2-135m", "qwen2.5-coder-0.5b", "gemma-3-270m"};
    static char paths[3][4096];
    for (int i = 0; i < 3; i++)
        add(from_gguf(fz_model(models[i], paths[i], sizeof paths[i])), models[i], i < 2);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || g_n == 0) return 0;
    int which = data[0] % g_n;
    const flm_tokenizer *t = g_tok[which];
    unsigned flags = (data[1] & 1 ? FLM_TOKENIZE_ADD_BOS : 0u) | (data[1] & 2 ? FLM_TOKENIZE_PARSE_SPECIAL : 0u) |
                     (data[1] & 4 ? FLM_TOKENIZE_ADD_EOS : 0u);
    const char *text = (const char *)data + 2;
    size_t len = size - 2;
    uint32_t nv = flm_tokenizer_n_vocab(t);

    /* first with too small a buffer: the count must be the same */
    int32_t small[4];
    size_t need = flm_tokenizer_encode_ex(t, text, len, flags, small, data[1] >> 6);
    fz_check(need != SIZE_MAX, "out of memory");
    int32_t *ids = malloc((need ? need : 1) * sizeof *ids);
    if (!ids) return 0;
    size_t n = flm_tokenizer_encode_ex(t, text, len, flags, ids, need);
    fz_check(n == need, "%s: %zu tokens, then %zu", g_name[which], need, n);
    for (size_t i = 0; i < (data[1] >> 6) && i < n; i++) fz_check(small[i] == ids[i], "prefix differs");

    /* decode; byte-level BPE gives the input back */
    char *dec = malloc(len + 64);
    size_t dl = 0;
    bool room = dec != NULL;
    for (size_t i = 0; i < n; i++) {
        fz_check(ids[i] >= 0 && (uint32_t)ids[i] < nv, "%s: id %d of %u", g_name[which], ids[i], nv);
        size_t pl = 0;
        const char *p = flm_tokenizer_piece(t, i ? ids[i - 1] : -1, ids[i], &pl);
        fz_check(p != NULL, "piece");
        if (room && dl + pl <= len + 64) memcpy(dec + dl, p, pl);
        else room = false;
        dl += pl;
        (void)flm_tokenizer_is_eog(t, ids[i]);
        (void)flm_tokenizer_vocab(t, ids[i]);
    }
    if (g_lossless[which] && !(flags & FLM_TOKENIZE_PARSE_SPECIAL)) {
        /* BOS / EOS are control tokens: they decode to nothing. A byte without a token is dropped, as llama.cpp's
         * llm_tokenizer_bpe_session does (its single-byte fallback finds nothing either). */
        char *want = malloc(len + 1);
        size_t wl = 0;
        for (size_t i = 0; want && i < len; i++)
            if (g_byte_ok[which][(uint8_t)text[i]]) want[wl++] = text[i];
        fz_check(!want || (room && dl == wl && memcmp(dec, want, wl) == 0),
                 "%s: %zu bytes (%zu with tokens) decode to %zu other bytes", g_name[which], len, wl, dl);
        free(want);
    }
    free(dec);
    free(ids);

    /* the NUL-terminated entry point agrees up to the first NUL */
    char *z = malloc(len + 1);
    if (z) {
        memcpy(z, text, len);
        z[len] = 0;
        size_t zl = strlen(z);
        int32_t a[64], b[64];
        size_t na = flm_tokenizer_encode(t, z, flags & FLM_TOKENIZE_ADD_BOS, a, 64);
        size_t nb = flm_tokenizer_encode_ex(t, z, zl, flags & FLM_TOKENIZE_ADD_BOS, b, 64);
        fz_check(na == nb, "%s: encode %zu tokens, encode_ex %zu", g_name[which], na, nb);
        for (size_t i = 0; i < na && i < 64; i++) fz_check(a[i] == b[i], "token %zu differs", i);
        (void)flm_tokenizer_find(t, z);
        free(z);
    }

    /* decode arbitrary ids, in range or not */
    fz_bytes c = {data + 2, len, 0};
    int32_t prev = -1;
    for (int i = 0; i < 16 && c.pos < c.n; i++) {
        int32_t id = (int32_t)(fz_u16(&c) | fz_u8(&c) << 16) - (int32_t)(nv / 64);
        size_t pl = 0;
        const char *p = flm_tokenizer_piece(t, prev, id, &pl);
        fz_check(p != NULL && (pl == 0 || (id >= 0 && (uint32_t)id < nv)), "piece of id %d", id);
        (void)flm_tokenizer_vocab(t, id);
        (void)flm_tokenizer_is_eog(t, id);
        prev = id;
    }
    return 0;
}
