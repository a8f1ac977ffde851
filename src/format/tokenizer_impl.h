/* tokenizer_impl.h — what tokenizer.c (interface, vocabulary, special tokens), tokenizer_spm.c (SentencePiece BPE)
 * and tokenizer_bpe.c (GPT-2 byte-level BPE) share. Internal to src/format/tokenizer*.c. */
#ifndef FLM_FORMAT_TOKENIZER_IMPL_H
#define FLM_FORMAT_TOKENIZER_IMPL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/tokenizer.h"

#define FLM_NO_IDX SIZE_MAX /* "no symbol" in the linked symbol lists */

typedef struct {
    char *text;       /* vocabulary string, NUL-terminated */
    uint32_t len;
    char *dec;        /* the bytes the token decodes to (NUL-terminated, dec_len bytes) */
    uint32_t dec_len;
    float score;
    int32_t type;     /* FLM_TOK_* (after llama.cpp's overrides: EOG-looking tokens become CONTROL) */
} tok_entry;

/* One byte-level merge "a b" of tokenizer.ggml.merges: the pair's concatenation ab and where a ends. */
typedef struct {
    uint32_t off;     /* into bpe_state.pool */
    uint32_t len;     /* |a| + |b| */
    uint32_t split;   /* |a| */
    uint32_t rank;    /* index in tokenizer.ggml.merges: lower merges first */
} bpe_merge;

typedef struct bpe_state bpe_state; /* tokenizer_bpe.c */

/* A trie over the special tokens' strings (CONTROL, USER_DEFINED, UNKNOWN) for finding every occurrence in a text
 * in one pass. Node 0 is the root; children are first-child/next-sibling lists, the root's in a 256-entry table. */
typedef struct {
    uint32_t child, sibling; /* node index, 0 = none */
    int32_t id;              /* token ending here, or -1 */
    uint8_t byte;
} trie_node;

struct flm_tokenizer {
    int kind;                 /* FLM_TOKENIZER_SPM or FLM_TOKENIZER_BPE */
    uint32_t n_vocab;
    tok_entry *tok;
    uint64_t *slots;          /* open-addressing hash over tok[].text: hash tag << 32 | id+1, 0 = empty */
    uint32_t n_slots;         /* power of two */
    int32_t byte_id[256];     /* SPM: the token "<0xXX>"; BPE: the token of the byte's GPT-2 character; or -1 */
    int32_t bos, eos;
    bool add_bos, add_eos, add_space_prefix;
    uint8_t *eog;             /* n_vocab flags: 1 = ends a generation */
    trie_node *trie;
    uint32_t n_trie, cap_trie;
    uint32_t root[256];       /* the root's children by first byte, 0 = none */
    bpe_state *bpe;           /* kind == BPE */
};

enum { FLM_TOKENIZER_SPM = 1, FLM_TOKENIZER_BPE = 2 };

/* Output being built: ids beyond cap are counted, not written. */
typedef struct {
    int32_t *ids;
    size_t cap, n;
} tok_out;

static inline void tok_emit(tok_out *o, int32_t id) {
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

/* The id whose vocabulary string is the n bytes at s (the last such id when the vocabulary repeats a string, as
 * llama.cpp's token_to_id map keeps it), or -1. */
int32_t flm_tok_lookup(const flm_tokenizer *t, const char *s, size_t n);

/* Bytes in the UTF-8 sequence that starts with lead byte c (1 for continuation/invalid bytes). */
static inline size_t flm_utf8_len(uint8_t c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1;
}

/* SentencePiece BPE over one text fragment (already with its "▁" escapes): appends ids to o.
 * Returns false when out of memory. (tokenizer_spm.c) */
bool flm_spm_encode(const flm_tokenizer *t, const char *text, size_t len, tok_out *o);

/* Byte-level BPE: set up from the merges and pre-tokenizer name (t->tok already filled; sets t->bpe and the
 * decoded bytes of the NORMAL tokens). Errors: FLM_ERR_FORMAT (a merge longer than 2^16 bytes),
 * FLM_ERR_UNSUPPORTED (unknown pre-tokenizer), FLM_ERR_NOMEM. (tokenizer_bpe.c) */
flm_status flm_bpe_init(flm_tokenizer *t, const char *pre, uint32_t n_merges, const char *const *merges,
                        const uint32_t *merge_lens, flm_error *err);
void flm_bpe_free(bpe_state *b);
/* Pre-tokenize (regex split) and BPE-encode one raw text fragment; appends ids to o. false when out of memory. */
bool flm_bpe_encode(const flm_tokenizer *t, const char *text, size_t len, tok_out *o);

#endif
