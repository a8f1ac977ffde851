#include "format/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef struct {
    char *text;     /* vocabulary string, NUL-terminated */
    uint32_t len;
    char *dec;      /* decoded bytes */
    uint32_t dec_len;
    float score;
    int32_t type;
} tok_entry;

struct flm_tokenizer {
    uint32_t n_vocab;
    tok_entry *tok;
    int32_t byte_id[256];   /* token of "<0xXX>", or -1 */
    uint32_t *slots;        /* open-addressing hash: id+1, 0 = empty */
    uint32_t n_slots;       /* power of two */
    int32_t bos, eos;
    bool add_space_prefix;
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int32_t lookup(const flm_tokenizer *t, const char *s, size_t n) {
    uint32_t mask = t->n_slots - 1;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        uint32_t v = t->slots[i];
        if (v == 0) return -1;
        const tok_entry *e = &t->tok[v - 1];
        if (e->len == n && memcmp(e->text, s, n) == 0) return (int32_t)(v - 1);
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xXX>" -> byte value, else -1 */
static int parse_byte_token(const char *s, size_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

flm_status flm_tokenizer_create(uint32_t n_vocab, const char *const *pieces, const uint32_t *lens,
                                const float *scores, const int32_t *types, int32_t bos, int32_t eos,
                                bool add_space_prefix, flm_tokenizer **out, flm_error *err) {
    *out = NULL;
    if (n_vocab == 0 || n_vocab > (1u << 24))
        return flm_fail(err, FLM_ERR_FORMAT, "tokenizer: vocabulary size %u out of range [1, 2^24]", n_vocab);
    if (bos >= (int32_t)n_vocab || eos >= (int32_t)n_vocab)
        return flm_fail(err, FLM_ERR_FORMAT, "tokenizer: BOS id %d or EOS id %d is not below the vocabulary size %u",
                        bos, eos, n_vocab);
    flm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return flm_fail(err, FLM_ERR_NOMEM, "tokenizer: out of memory");
    t->n_vocab = n_vocab;
    t->bos = bos < 0 ? -1 : bos;
    t->eos = eos < 0 ? -1 : eos;
    t->add_space_prefix = add_space_prefix;
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    t->n_slots = 1;
    while (t->n_slots < 2 * n_vocab) t->n_slots <<= 1;
    t->tok = calloc(n_vocab, sizeof *t->tok);
    t->slots = calloc(t->n_slots, sizeof *t->slots);
    if (!t->tok || !t->slots) goto nomem;
    for (uint32_t i = 0; i < n_vocab; i++) {
        tok_entry *e = &t->tok[i];
        uint32_t n = lens[i];
        if (memchr(pieces[i], 0, n)) {
            flm_tokenizer_free(t);
            return flm_fail(err, FLM_ERR_FORMAT, "tokenizer: token %u contains a NUL byte", i);
        }
        e->text = malloc(n + 1);
        e->dec = malloc(n + 1);
        if (!e->text || !e->dec) goto nomem;
        memcpy(e->text, pieces[i], n);
        e->text[n] = 0;
        e->len = n;
        e->score = scores ? scores[i] : 0.0f;
        int b = parse_byte_token(e->text, n);
        e->type = types ? types[i] : (b >= 0 ? FLM_TOK_BYTE : FLM_TOK_NORMAL);
        if (e->type == FLM_TOK_BYTE && b >= 0) {
            if (t->byte_id[b] < 0) t->byte_id[b] = (int32_t)i;
            e->dec[0] = (char)b;
            e->dec_len = 1;
        } else if (e->type == FLM_TOK_CONTROL || e->type == FLM_TOK_UNKNOWN || e->type == FLM_TOK_UNUSED) {
            e->dec_len = 0;
        } else { /* "▁" (E2 96 81) -> ' ' */
            uint32_t k = 0;
            for (uint32_t j = 0; j < n; j++) {
                if (j + 2 < n && (uint8_t)e->text[j] == 0xE2 && (uint8_t)e->text[j + 1] == 0x96 &&
                    (uint8_t)e->text[j + 2] == 0x81) {
                    e->dec[k++] = ' ';
                    j += 2;
                } else {
                    e->dec[k++] = e->text[j];
                }
            }
            e->dec_len = k;
        }
        e->dec[e->dec_len] = 0;
        /* first occurrence wins for duplicate strings */
        if (lookup(t, e->text, n) < 0) {
            uint32_t mask = t->n_slots - 1, s = (uint32_t)hash_bytes(e->text, n) & mask;
            while (t->slots[s]) s = (s + 1) & mask;
            t->slots[s] = i + 1;
        }
    }
    *out = t;
    return FLM_OK;
nomem:
    flm_tokenizer_free(t);
    return flm_fail(err, FLM_ERR_NOMEM, "tokenizer: out of memory");
}

void flm_tokenizer_free(flm_tokenizer *t) {
    if (!t) return;
    if (t->tok)
        for (uint32_t i = 0; i < t->n_vocab; i++) {
            free(t->tok[i].text);
            free(t->tok[i].dec);
        }
    free(t->tok);
    free(t->slots);
    free(t);
}

/* ---- encoding ------------------------------------------------------------------------------------------------ */

typedef struct { int32_t prev, next; uint32_t start, len; } sym;          /* a doubly linked list over the text */
typedef struct { float score; int32_t left, right; uint32_t len; } bigram; /* candidate merge */

static bool bigram_before(const bigram *a, const bigram *b) { /* max-heap order: score desc, then left asc */
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct { bigram *v; size_t n, cap; } heap;

static bool heap_push(heap *h, bigram b) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        bigram *v = realloc(h->v, cap * sizeof *v);
        if (!v) return false;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && bigram_before(&b, &h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = b;
    return true;
}

static bigram heap_pop(heap *h) {
    bigram top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && bigram_before(&h->v[c + 1], &h->v[c])) c++;
        if (!bigram_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

static void try_bigram(const flm_tokenizer *t, const char *text, const sym *s, int32_t l, int32_t r, heap *h,
                       bool *oom) {
    if (l < 0 || r < 0) return;
    uint32_t len = s[l].len + s[r].len;
    int32_t id = lookup(t, text + s[l].start, len);
    if (id < 0) return;
    bigram b = {t->tok[id].score, l, r, len};
    if (!heap_push(h, b)) *oom = true;
}

static size_t utf8_len(uint8_t c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1; /* stray continuation or invalid lead byte: one byte, which byte fallback handles */
}

static void emit(int32_t *ids, size_t cap, size_t *n, int32_t id) {
    if (*n < cap) ids[*n] = id;
    (*n)++;
}

size_t flm_tokenizer_encode(const flm_tokenizer *t, const char *text, bool add_bos, int32_t *ids, size_t cap) {
    size_t n_out = 0;
    if (add_bos && t->bos >= 0) emit(ids, cap, &n_out, t->bos);
    size_t tlen = strlen(text);
    if (tlen == 0) return n_out;
    /* normalise: optional space prefix, ' ' -> "▁" */
    size_t spaces = t->add_space_prefix ? 1 : 0;
    for (size_t i = 0; i < tlen; i++) spaces += text[i] == ' ';
    size_t nlen = tlen + (t->add_space_prefix ? 1 : 0) + 2 * spaces;
    char *norm = malloc(nlen + 1);
    sym *s = malloc((nlen + 1) * sizeof *s);
    heap h = {0};
    bool oom = (norm == NULL || s == NULL);
    if (!oom) {
        size_t k = 0;
        if (t->add_space_prefix) { memcpy(norm + k, "\xE2\x96\x81", 3); k += 3; }
        for (size_t i = 0; i < tlen; i++) {
            if (text[i] == ' ') { memcpy(norm + k, "\xE2\x96\x81", 3); k += 3; }
            else norm[k++] = text[i];
        }
        nlen = k;
        norm[nlen] = 0;
        int32_t n_sym = 0;
        for (size_t off = 0; off < nlen;) {
            size_t cl = utf8_len((uint8_t)norm[off]);
            if (off + cl > nlen) cl = nlen - off;
            s[n_sym] = (sym){n_sym - 1, n_sym + 1, (uint32_t)off, (uint32_t)cl};
            n_sym++;
            off += cl;
        }
        s[n_sym - 1].next = -1;
        for (int32_t i = 1; i < n_sym; i++) try_bigram(t, norm, s, i - 1, i, &h, &oom);
        while (h.n && !oom) {
            bigram b = heap_pop(&h);
            sym *l = &s[b.left], *r = &s[b.right];
            if (l->len == 0 || r->len == 0 || l->len + r->len != b.len || l->next != b.right) continue; /* stale */
            l->len += r->len;
            r->len = 0;
            l->next = r->next;
            if (r->next >= 0) s[r->next].prev = b.left;
            try_bigram(t, norm, s, l->prev, b.left, &h, &oom);
            try_bigram(t, norm, s, b.left, l->next, &h, &oom);
        }
        for (int32_t i = 0; i != -1 && !oom; i = s[i].next) {
            int32_t id = lookup(t, norm + s[i].start, s[i].len);
            if (id >= 0) {
                emit(ids, cap, &n_out, id);
                continue;
            }
            for (uint32_t j = 0; j < s[i].len; j++) { /* byte fallback */
                int32_t bid = t->byte_id[(uint8_t)norm[s[i].start + j]];
                if (bid >= 0) emit(ids, cap, &n_out, bid); /* no byte token: the byte is dropped (as unk) */
            }
        }
    }
    free(h.v);
    free(s);
    free(norm);
    return oom ? 0 : n_out;
}

const char *flm_tokenizer_piece(const flm_tokenizer *t, int32_t prev, int32_t id, size_t *len) {
    if (id < 0 || (uint32_t)id >= t->n_vocab) { *len = 0; return ""; }
    const tok_entry *e = &t->tok[id];
    const char *p = e->dec;
    size_t n = e->dec_len;
    if (prev == t->bos && t->bos >= 0 && n > 0 && p[0] == ' ' && e->type != FLM_TOK_BYTE) { p++; n--; }
    *len = n;
    return p;
}

const char *flm_tokenizer_vocab(const flm_tokenizer *t, int32_t id) {
    return (id < 0 || (uint32_t)id >= t->n_vocab) ? "" : t->tok[id].text;
}
uint32_t flm_tokenizer_n_vocab(const flm_tokenizer *t) { return t->n_vocab; }
int32_t flm_tokenizer_bos(const flm_tokenizer *t) { return t->bos; }
int32_t flm_tokenizer_eos(const flm_tokenizer *t) { return t->eos; }
