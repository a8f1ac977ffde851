/* tokenizer_bpe.c — GPT-2 byte-level BPE, as llama.cpp's llm_tokenizer_bpe_session (src/llama-vocab.cpp).
 *
 * 1. Pre-tokenize: the pre-tokenizer's regexes (llama.cpp's llm_tokenizer_bpe constructor, per tokenizer.ggml.pre)
 *    are applied in turn; each splits every piece the previous one left into its matches and the text between them
 *    (unicode_regex_split keeps both). Each regex sees a piece as a whole string (a lookahead stops at its end).
 *    Matching is PCRE2 with PCRE2_UTF | PCRE2_UCP, so \p{L}, \p{N} and \s are Unicode's classes.
 * 2. Each piece's bytes are mapped to GPT-2's printable characters (bytes_to_unicode of GPT-2's encoder.py: the
 *    printable Latin-1 bytes 33..126, 161..172, 174..255 stand for themselves, the other 68 bytes in order for
 *    U+0100..U+0143), one symbol per byte.
 * 3. The adjacent pair (a, b) with the lowest rank in tokenizer.ggml.merges ("a b", rank = index) is merged, ties
 *    leftmost, until no pair of the word is a merge. Each symbol is then looked up in the vocabulary; a symbol that
 *    is not a token gives the tokens of its single bytes that are (llama.cpp does the same). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "format/tokenizer_impl.h"

#define MAX_REGEX 4

struct bpe_state {
    pcre2_code *re[MAX_REGEX];
    int n_re;
    bool ignore_merges;  /* llama3: a piece that is a token as a whole is taken as it is */
    bpe_merge *merges;
    uint32_t n_merges;
    uint32_t *slots;     /* open-addressing hash over merges: index+1, 0 = empty */
    uint32_t n_slots;    /* power of two */
    char *pool;          /* the merges' concatenated pairs */
};

/* ---- GPT-2's byte <-> character table ------------------------------------------------------------------------ */

static bool byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

/* The code point byte b stands for. */
static uint32_t byte_to_cpt(int b) {
    if (byte_is_printable(b)) return (uint32_t)b;
    uint32_t n = 0;
    for (int c = 0; c < b; c++) n += !byte_is_printable(c);
    return 256 + n;
}

/* UTF-8 of the character of byte b into out (2 bytes at most: all are below U+0800); returns the length. */
static size_t byte_to_utf8(int b, char *out) {
    uint32_t cp = byte_to_cpt(b);
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static char g_utf8[256][2];
static uint8_t g_utf8_len[256];
static int16_t g_cpt_byte[324]; /* code point -> byte, or -1 */

static void tables_fill(void) {
    for (int c = 0; c < 324; c++) g_cpt_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        g_utf8_len[b] = (uint8_t)byte_to_utf8(b, g_utf8[b]);
        g_cpt_byte[byte_to_cpt(b)] = (int16_t)b;
    }
}

static pthread_once_t g_tables_once = PTHREAD_ONCE_INIT;
static void tables_init(void) { pthread_once(&g_tables_once, tables_fill); }

/* Decode a vocabulary string of GPT-2 characters to bytes (out has room for len bytes); characters outside the
 * table are copied as they are. Returns the byte count. */
static uint32_t decode_gpt2(const char *s, uint32_t len, char *out) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < len;) {
        uint8_t c = (uint8_t)s[i];
        size_t cl = flm_utf8_len(c);
        if (i + cl > len) cl = len - i;
        uint32_t cp = 0xFFFFFFFFu;
        if (cl == 1 && c < 0x80) cp = c;
        else if (cl == 2 && ((uint8_t)s[i + 1] & 0xC0) == 0x80) cp = ((uint32_t)(c & 0x1F) << 6) | ((uint8_t)s[i + 1] & 0x3F);
        if (cp < 324 && g_cpt_byte[cp] >= 0) {
            out[k++] = (char)g_cpt_byte[cp];
        } else {
            memcpy(out + k, s + i, cl);
            k += (uint32_t)cl;
        }
        i += (uint32_t)cl;
    }
    return k;
}

/* ---- pre-tokenizers (the regexes of llama.cpp's llm_tokenizer_bpe, by tokenizer.ggml.pre) ----------------------- */

static const char RE_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
static const char RE_LLAMA3[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_DIGIT[] = "\\p{N}";

typedef struct {
    const char *const *names; /* NULL-terminated */
    const char *re[MAX_REGEX];
    bool ignore_merges;
} pre_type;

static const char *const N_GPT2[] = {"gpt2", "gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais", NULL};
static const char *const N_LLAMA3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                                       "midm-2.0", "lfm2", NULL};
static const char *const N_LLAMA3_MERGES[] = {"dbrx", "smaug-bpe", "chatglm-bpe", NULL};
static const char *const N_QWEN2[] = {"qwen2", "qwen2.5", "qwen-2.5", "deepseek-r1-qwen", "stablelm2", "megrez",
                                      NULL};
static const char *const N_SMOLLM[] = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                                       "minerva-7b", NULL};
static const char *const N_DEFAULT[] = {"default", "", NULL};

static const pre_type PRE_TYPES[] = {
    {N_GPT2, {RE_GPT2}, false},
    {N_LLAMA3, {RE_LLAMA3}, true},
    {N_LLAMA3_MERGES, {RE_LLAMA3}, false},
    {N_QWEN2, {RE_QWEN2}, false},
    {N_SMOLLM, {RE_DIGIT, RE_GPT2}, false},
    {N_DEFAULT, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, false},
};

static const pre_type *find_pre(const char *pre) {
    if (!pre) pre = "default";
    for (size_t i = 0; i < sizeof PRE_TYPES / sizeof *PRE_TYPES; i++)
        for (const char *const *n = PRE_TYPES[i].names; *n; n++)
            if (strcmp(*n, pre) == 0) return &PRE_TYPES[i];
    return NULL;
}

/* ---- merges -------------------------------------------------------------------------------------------------- */

static uint64_t hash_pair(const char *s, size_t n, size_t split) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)split;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* Rank of the merge (s[0..split), s[split..n)), or -1. */
static int64_t merge_rank(const bpe_state *b, const char *s, size_t n, size_t split) {
    if (!b->n_slots) return -1;
    uint32_t mask = b->n_slots - 1;
    for (uint32_t i = (uint32_t)hash_pair(s, n, split) & mask;; i = (i + 1) & mask) {
        uint32_t v = b->slots[i];
        if (v == 0) return -1;
        const bpe_merge *m = &b->merges[v - 1];
        if (m->len == n && m->split == split && memcmp(b->pool + m->off, s, n) == 0) return m->rank;
    }
}

void flm_bpe_free(bpe_state *b) {
    if (!b) return;
    for (int i = 0; i < b->n_re; i++) pcre2_code_free(b->re[i]);
    free(b->merges);
    free(b->slots);
    free(b->pool);
    free(b);
}

flm_status flm_bpe_init(flm_tokenizer *t, const char *pre, uint32_t n_merges, const char *const *merges,
                        const uint32_t *merge_lens, flm_error *err) {
    tables_init();
    const pre_type *pt = find_pre(pre);
    if (!pt)
        return flm_fail(err, FLM_ERR_UNSUPPORTED,
                        "tokenizer.ggml.pre '%s' is not supported (known: gpt2, llama-bpe, qwen2, smollm, "
                        "deepseek-r1-qwen, default and their aliases)", pre);
    bpe_state *b = calloc(1, sizeof *b);
    if (!b) return flm_fail(err, FLM_ERR_NOMEM, "tokenizer: out of memory");
    t->bpe = b;
    b->ignore_merges = pt->ignore_merges;
    for (int i = 0; i < MAX_REGEX && pt->re[i]; i++) {
        int ec;
        PCRE2_SIZE eo;
        b->re[i] = pcre2_compile((PCRE2_SPTR)pt->re[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
        if (!b->re[i]) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return flm_fail(err, ec == PCRE2_ERROR_HEAPLIMIT || ec == PCRE2_ERROR_NOMEMORY ? FLM_ERR_NOMEM
                                                                                              : FLM_ERR_UNSUPPORTED,
                            "tokenizer: pre-tokenizer regex %d of '%s' does not compile at %zu: %s", i,
                            pre ? pre : "default", (size_t)eo, (const char *)msg);
        }
        b->n_re = i + 1;
        (void)pcre2_jit_compile(b->re[i], PCRE2_JIT_COMPLETE); /* without JIT (not built in): the interpreter */
    }
    /* merges: "a b", split at the first space after the first byte (llama.cpp: word.find(' ', 1)) */
    uint64_t pool_len = 0;
    for (uint32_t i = 0; i < n_merges; i++) pool_len += merge_lens[i];
    if (pool_len > UINT32_MAX)
        return flm_fail(err, FLM_ERR_FORMAT, "tokenizer.ggml.merges: %llu bytes in all, more than 4 GiB",
                        (unsigned long long)pool_len);
    b->merges = malloc((size_t)n_merges * sizeof *b->merges + 1);
    b->pool = malloc((size_t)pool_len + 1);
    b->n_slots = 1;
    while (b->n_slots < 2 * (uint64_t)n_merges + 2) b->n_slots <<= 1;
    b->slots = calloc(b->n_slots, sizeof *b->slots);
    if (!b->merges || !b->pool || !b->slots) return flm_fail(err, FLM_ERR_NOMEM, "tokenizer: out of memory");
    uint32_t off = 0;
    for (uint32_t i = 0; i < n_merges; i++) {
        const char *m = merges[i];
        uint32_t n = merge_lens[i];
        const char *sp = n > 1 ? memchr(m + 1, ' ', n - 1) : NULL;
        if (!sp) continue; /* no pair: llama.cpp keeps an empty pair, which never matches */
        uint32_t split = (uint32_t)(sp - m);
        uint32_t len = n - 1;
        if (split == 0 || split == len) continue;
        memcpy(b->pool + off, m, split);
        memcpy(b->pool + off + split, sp + 1, len - split);
        /* a repeated pair keeps its first (lowest) rank, as std::unordered_map::emplace */
        uint32_t mask = b->n_slots - 1, s = (uint32_t)hash_pair(b->pool + off, len, split) & mask;
        bool dup = false;
        for (; b->slots[s]; s = (s + 1) & mask) {
            const bpe_merge *e = &b->merges[b->slots[s] - 1];
            if (e->len == len && e->split == split && memcmp(b->pool + e->off, b->pool + off, len) == 0) {
                dup = true;
                break;
            }
        }
        if (dup) continue;
        b->merges[b->n_merges] = (bpe_merge){off, len, split, i};
        b->slots[s] = ++b->n_merges;
        off += len;
    }
    /* decoded bytes of the ordinary tokens, and each byte's token */
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        tok_entry *e = &t->tok[i];
        if (e->type == FLM_TOK_NORMAL) {
            e->dec_len = decode_gpt2(e->text, e->len, e->dec);
            e->dec[e->dec_len] = 0;
        }
    }
    for (int c = 0; c < 256; c++) t->byte_id[c] = flm_tok_lookup(t, g_utf8[c], g_utf8_len[c]);
    return FLM_OK;
}

/* ---- encoding ------------------------------------------------------------------------------------------------ */

typedef struct { size_t start, len; } span;
typedef struct { span *v; size_t n, cap; } span_list;

static bool span_push(span_list *l, size_t start, size_t len) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        span *v = realloc(l->v, cap * sizeof *v);
        if (!v) return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (span){start, len};
    return true;
}

/* Split text[p.start, +p.len) by re into matches and the text between them, appended to out. */
static bool regex_split(const pcre2_code *re, pcre2_match_data *md, const char *text, span p, span_list *out) {
    PCRE2_SPTR subj = (PCRE2_SPTR)(text + p.start);
    size_t off = 0, last = 0;
    while (off < p.len) {
        int rc = pcre2_match(re, subj, p.len, off, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            if (rc == PCRE2_ERROR_NOMEMORY || rc == PCRE2_ERROR_HEAPLIMIT) return false;
            break; /* a match limit: the rest stays one piece */
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* an empty match (none of the regexes has one): step over a character */
            off = ms + flm_utf8_len((uint8_t)text[p.start + ms]);
            continue;
        }
        if (ms > last && !span_push(out, p.start + last, ms - last)) return false;
        if (!span_push(out, p.start + ms, me - ms)) return false;
        last = off = me;
    }
    if (last < p.len && !span_push(out, p.start + last, p.len - last)) return false;
    return true;
}

typedef struct { size_t prev, next, start, len; } bpe_sym;
typedef struct { uint32_t rank; size_t left, right, len; } bpe_bigram;

static bool bigram_before(const bpe_bigram *a, const bpe_bigram *b) { /* min-heap: rank asc, then left asc */
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

typedef struct {
    char *mw;           /* the word in GPT-2 characters */
    size_t cap_mw;
    bpe_sym *sym;
    size_t cap_sym;
    bpe_bigram *heap;
    size_t n_heap, cap_heap;
} bpe_work;

static bool heap_push(bpe_work *w, bpe_bigram b) {
    if (w->n_heap == w->cap_heap) {
        size_t cap = w->cap_heap ? 2 * w->cap_heap : 64;
        bpe_bigram *v = realloc(w->heap, cap * sizeof *v);
        if (!v) return false;
        w->heap = v;
        w->cap_heap = cap;
    }
    size_t i = w->n_heap++;
    while (i > 0 && bigram_before(&b, &w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = b;
    return true;
}

static bpe_bigram heap_pop(bpe_work *w) {
    bpe_bigram top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!bigram_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static bool try_merge(const bpe_state *b, bpe_work *w, size_t l, size_t r) {
    if (l == FLM_NO_IDX || r == FLM_NO_IDX) return true;
    const bpe_sym *s = w->sym;
    int64_t rank = merge_rank(b, w->mw + s[l].start, s[l].len + s[r].len, s[l].len);
    if (rank < 0) return true;
    return heap_push(w, (bpe_bigram){(uint32_t)rank, l, r, s[l].len + s[r].len});
}

/* Emit the tokens of one mapped symbol: the token, or the tokens of its single bytes (llama.cpp). */
static void emit_symbol(const flm_tokenizer *t, const char *s, size_t n, tok_out *o) {
    int32_t id = flm_tok_lookup(t, s, n);
    if (id >= 0) {
        tok_emit(o, id);
        return;
    }
    for (size_t j = 0; j < n; j++) {
        int32_t bid = flm_tok_lookup(t, s + j, 1);
        if (bid >= 0) tok_emit(o, bid);
    }
}

/* BPE of one pre-tokenized word (raw bytes). */
static bool bpe_word(const flm_tokenizer *t, bpe_work *w, const char *word, size_t n, tok_out *o) {
    const bpe_state *b = t->bpe;
    if (n == 1) { /* one byte: its character */
        int32_t id = t->byte_id[(uint8_t)word[0]];
        if (id >= 0) tok_emit(o, id);
        else emit_symbol(t, g_utf8[(uint8_t)word[0]], g_utf8_len[(uint8_t)word[0]], o);
        return true;
    }
    if (n > SIZE_MAX / 2 / sizeof *w->sym) return false;
    if (2 * n > w->cap_mw) {
        char *v = realloc(w->mw, 2 * n);
        if (!v) return false;
        w->mw = v;
        w->cap_mw = 2 * n;
    }
    if (n > w->cap_sym) {
        bpe_sym *v = realloc(w->sym, n * sizeof *v);
        if (!v) return false;
        w->sym = v;
        w->cap_sym = n;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)word[i];
        w->sym[i] = (bpe_sym){i == 0 ? FLM_NO_IDX : i - 1, i + 1 == n ? FLM_NO_IDX : i + 1, k, g_utf8_len[c]};
        memcpy(w->mw + k, g_utf8[c], g_utf8_len[c]);
        k += g_utf8_len[c];
    }
    if (b->ignore_merges) {
        int32_t id = flm_tok_lookup(t, w->mw, k);
        if (id >= 0) {
            tok_emit(o, id);
            return true;
        }
    }
    w->n_heap = 0;
    for (size_t i = 1; i < n; i++)
        if (!try_merge(b, w, i - 1, i)) return false;
    bpe_sym *s = w->sym;
    while (w->n_heap) {
        bpe_bigram g = heap_pop(w);
        bpe_sym *l = &s[g.left], *r = &s[g.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != g.len) continue; /* stale */
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next != FLM_NO_IDX) s[r->next].prev = g.left;
        if (!try_merge(b, w, l->prev, g.left) || !try_merge(b, w, g.left, l->next)) return false;
    }
    for (size_t i = 0; i != FLM_NO_IDX; i = s[i].next) emit_symbol(t, w->mw + s[i].start, s[i].len, o);
    return true;
}

bool flm_bpe_encode(const flm_tokenizer *t, const char *text, size_t len, tok_out *o) {
    const bpe_state *b = t->bpe;
    if (len == 0) return true;
    span_list cur = {0}, next = {0};
    bpe_work w = {0};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    bool ok = md != NULL && span_push(&cur, 0, len);
    for (int r = 0; ok && r < b->n_re; r++) {
        next.n = 0;
        for (size_t i = 0; ok && i < cur.n; i++) ok = regex_split(b->re[r], md, text, cur.v[i], &next);
        span_list tmp = cur;
        cur = next;
        next = tmp;
    }
    for (size_t i = 0; ok && i < cur.n; i++) ok = bpe_word(t, &w, text + cur.v[i].start, cur.v[i].len, o);
    pcre2_match_data_free(md);
    free(cur.v);
    free(next.v);
    free(w.mw);
    free(w.sym);
    free(w.heap);
    return ok;
}
