/* tokenizer_spm.c — SentencePiece-style BPE over one text fragment, as llama.cpp's llm_tokenizer_spm_session:
 * one symbol per UTF-8 character, then repeatedly merge the adjacent pair whose concatenation is a vocabulary
 * string with the highest score (ties: leftmost), then byte fallback for symbols that are not tokens. */
#include <stdlib.h>
#include <string.h>

#include "format/tokenizer_impl.h"

typedef struct { size_t prev, next, start, len; } spm_sym;              /* a doubly linked list over the text */
typedef struct { float score; size_t left, right, len; } spm_bigram; /* candidate merge */

static bool bigram_before(const spm_bigram *a, const spm_bigram *b) { /* max-heap: score desc, then left asc */
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct { spm_bigram *v; size_t n, cap; } spm_heap;

static bool heap_push(spm_heap *h, spm_bigram b) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        spm_bigram *v = realloc(h->v, cap * sizeof *v);
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

static spm_bigram heap_pop(spm_heap *h) {
    spm_bigram top = h->v[0], last = h->v[--h->n];
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

/* Queue the merge of symbols l and r when their concatenation is a token. false when out of memory. */
static bool try_bigram(const flm_tokenizer *t, const char *text, const spm_sym *s, size_t l, size_t r,
                       spm_heap *h) {
    if (l == FLM_NO_IDX || r == FLM_NO_IDX) return true;
    size_t len = s[l].len + s[r].len;
    int32_t id = flm_tok_lookup(t, text + s[l].start, len);
    if (id < 0) return true;
    return heap_push(h, (spm_bigram){t->tok[id].score, l, r, len});
}

bool flm_spm_encode(const flm_tokenizer *t, const char *text, size_t len, tok_out *o) {
    if (len == 0) return true;
    spm_sym *s = malloc(len * sizeof *s);
    spm_heap h = {0};
    bool ok = s != NULL;
    size_t n_sym = 0;
    for (size_t off = 0; ok && off < len;) {
        size_t cl = flm_utf8_len((uint8_t)text[off]);
        if (off + cl > len) cl = len - off;
        s[n_sym] = (spm_sym){n_sym == 0 ? FLM_NO_IDX : n_sym - 1, n_sym + 1, off, cl};
        n_sym++;
        off += cl;
    }
    if (ok) s[n_sym - 1].next = FLM_NO_IDX;
    for (size_t i = 1; ok && i < n_sym; i++) ok = try_bigram(t, text, s, i - 1, i, &h);
    while (ok && h.n) {
        spm_bigram b = heap_pop(&h);
        spm_sym *l = &s[b.left], *r = &s[b.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.len) continue; /* stale */
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next != FLM_NO_IDX) s[r->next].prev = b.left;
        ok = try_bigram(t, text, s, l->prev, b.left, &h) && try_bigram(t, text, s, b.left, l->next, &h);
    }
    for (size_t i = 0; ok && i != FLM_NO_IDX; i = s[i].next) {
        int32_t id = flm_tok_lookup(t, text + s[i].start, s[i].len);
        if (id >= 0) {
            tok_emit(o, id);
            continue;
        }
        for (size_t j = 0; j < s[i].len; j++) { /* byte fallback */
            int32_t bid = t->byte_id[(uint8_t)text[s[i].start + j]];
            if (bid >= 0) tok_emit(o, bid); /* no byte token: the byte is dropped (as unk) */
        }
    }
    free(h.v);
    free(s);
    return ok;
}
