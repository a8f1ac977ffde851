/* tokenizer.c — the tokenizer interface: vocabulary and its hash, special tokens (llama.cpp's
 * tokenizer_st_partition), end-of-generation tokens, decoding, and the dispatch to SentencePiece (tokenizer_spm.c)
 * or byte-level BPE (tokenizer_bpe.c). The behaviour follows llama.cpp's src/llama-vocab.cpp, which made the
 * reference token ids the tests compare against. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "format/tokenizer_impl.h"

/* ---- vocabulary hash ----------------------------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* Slot of the string s[0..n), or of the empty slot where it would go. A slot holds id+1 in its low 32 bits and the
 * high 32 bits of the string's hash, compared before the string (most probes then touch no token text). */
static uint32_t find_slot(const flm_tokenizer *t, const char *s, size_t n) {
    uint32_t mask = t->n_slots - 1;
    uint64_t h = hash_bytes(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        uint64_t v = t->slots[i];
        if (v == 0) return i;
        if ((uint32_t)(v >> 32) != tag) continue;
        const tok_entry *e = &t->tok[(uint32_t)v - 1];
        if (e->len == n && memcmp(e->text, s, n) == 0) return i;
    }
}

int32_t flm_tok_lookup(const flm_tokenizer *t, const char *s, size_t n) {
    uint64_t v = t->slots[find_slot(t, s, n)];
    return v ? (int32_t)((uint32_t)v - 1) : -1;
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

/* ---- special-token trie -------------------------------------------------------------------------------------- */

static bool trie_add(flm_tokenizer *t, const char *s, uint32_t n, int32_t id) {
    uint32_t node = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        uint32_t c = node == 0 ? t->root[b] : t->trie[node].child;
        if (node != 0)
            while (c && t->trie[c].byte != b) c = t->trie[c].sibling;
        if (!c) {
            if (t->n_trie == t->cap_trie) {
                uint32_t cap = t->cap_trie ? 2 * t->cap_trie : 1024;
                trie_node *v = realloc(t->trie, cap * sizeof *v);
                if (!v) return false;
                t->trie = v;
                t->cap_trie = cap;
            }
            c = t->n_trie++;
            t->trie[c] = (trie_node){0, 0, -1, b};
            if (node == 0) {
                t->root[b] = c;
            } else {
                t->trie[c].sibling = t->trie[node].child;
                t->trie[node].child = c;
            }
        }
        node = c;
    }
    t->trie[node].id = id; /* a repeated string keeps the last id, as llama.cpp's token_to_id */
    return true;
}

/* ---- construction -------------------------------------------------------------------------------------------- */

/* Token texts llama.cpp treats as ending a generation (llama_vocab::impl::load, "auto-detect special tokens by
 * text"); they are made CONTROL tokens when they are not. The FIM pad/repo/file-separator tokens are EOG too. */
static const char *const EOG_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", /* DeepSeek */
    "<|fim_pad|>", "<fim-pad>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<|file_sep|>",
};
/* Other FIM tokens llama.cpp finds by text and makes CONTROL (not EOG). */
static const char *const FIM_TEXTS[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<|fim_suffix|>", "<fim-suffix>", "<|fim_middle|>", "<fim-middle>",
};

static bool is_llama3_pre(const char *pre) {
    static const char *const names[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                                        "midm-2.0", "lfm2", "tekken", "chameleon"};
    for (size_t i = 0; pre && i < sizeof names / sizeof *names; i++)
        if (strcmp(pre, names[i]) == 0) return true;
    return false;
}

flm_status flm_tokenizer_create_spec(const flm_tokenizer_spec *sp, flm_tokenizer **out, flm_error *err) {
    *out = NULL;
    int kind;
    if (sp->model && strcmp(sp->model, "llama") == 0) kind = FLM_TOKENIZER_SPM;
    else if (sp->model && strcmp(sp->model, "gpt2") == 0) kind = FLM_TOKENIZER_BPE;
    else
        return flm_fail(err, FLM_ERR_UNSUPPORTED,
                        "tokenizer.ggml.model '%s' is not supported (only 'llama' and 'gpt2')",
                        sp->model ? sp->model : "(none)");
    uint32_t n_vocab = sp->n_vocab;
    if (n_vocab == 0 || n_vocab > (1u << 24))
        return flm_fail(err, FLM_ERR_FORMAT, "tokenizer: vocabulary size %u out of range [1, 2^24]", n_vocab);
    const int32_t special[] = {sp->bos, sp->eos, sp->eot, sp->eom, sp->fim_pad, sp->fim_rep, sp->fim_sep};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        if (special[i] >= (int32_t)n_vocab)
            return flm_fail(err, FLM_ERR_FORMAT, "tokenizer: special token id %d is not below the vocabulary size %u",
                            special[i], n_vocab);
    flm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return flm_fail(err, FLM_ERR_NOMEM, "tokenizer: out of memory");
    flm_status st = FLM_OK;
    t->kind = kind;
    t->n_vocab = n_vocab;
    t->bos = sp->bos < 0 ? -1 : sp->bos;
    t->eos = sp->eos < 0 ? -1 : sp->eos;
    /* defaults of llama.cpp's llama_vocab::impl::load, then the GGUF keys */
    t->add_bos = kind == FLM_TOKENIZER_SPM || is_llama3_pre(sp->pre);
    t->add_eos = false;
    t->add_space_prefix = kind == FLM_TOKENIZER_SPM;
    if (sp->add_bos >= 0) t->add_bos = sp->add_bos != 0;
    if (sp->add_eos >= 0) t->add_eos = sp->add_eos != 0;
    if (sp->add_space_prefix >= 0) t->add_space_prefix = sp->add_space_prefix != 0;
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    t->n_slots = 1;
    while (t->n_slots < 2 * n_vocab) t->n_slots <<= 1;
    t->tok = calloc(n_vocab, sizeof *t->tok);
    t->slots = calloc(t->n_slots, sizeof *t->slots);
    t->eog = calloc(n_vocab, 1);
    t->n_trie = 1; /* node 0: the root */
    t->cap_trie = 1024;
    t->trie = malloc(t->cap_trie * sizeof *t->trie);
    if (!t->tok || !t->slots || !t->eog || !t->trie) goto nomem;
    t->trie[0] = (trie_node){0, 0, -1, 0};
    for (uint32_t i = 0; i < n_vocab; i++) {
        tok_entry *e = &t->tok[i];
        uint32_t n = sp->lens[i];
        if (memchr(sp->pieces[i], 0, n)) {
            st = flm_fail(err, FLM_ERR_FORMAT, "tokenizer: token %u contains a NUL byte", i);
            goto fail;
        }
        e->text = malloc(n + 1);
        e->dec = malloc(n + 1);
        if (!e->text || !e->dec) goto nomem;
        memcpy(e->text, sp->pieces[i], n);
        e->text[n] = 0;
        e->len = n;
        e->score = sp->scores ? sp->scores[i] : 0.0f;
        e->type = sp->types ? sp->types[i]
                            : (kind == FLM_TOKENIZER_SPM && parse_byte_token(e->text, n) >= 0 ? FLM_TOK_BYTE
                                                                                              : FLM_TOK_NORMAL);
        /* the last of repeated strings wins, as llama.cpp */
        t->slots[find_slot(t, e->text, n)] = (hash_bytes(e->text, n) >> 32 << 32) | (i + 1);
    }
    /* end-of-generation tokens: by text (made CONTROL), then the ids the metadata names */
    for (size_t k = 0; k < sizeof EOG_TEXTS / sizeof *EOG_TEXTS; k++) {
        int32_t id = flm_tok_lookup(t, EOG_TEXTS[k], strlen(EOG_TEXTS[k]));
        if (id >= 0) {
            t->eog[id] = 1;
            t->tok[id].type = FLM_TOK_CONTROL;
        }
    }
    for (size_t k = 0; k < sizeof FIM_TEXTS / sizeof *FIM_TEXTS; k++) {
        int32_t id = flm_tok_lookup(t, FIM_TEXTS[k], strlen(FIM_TEXTS[k]));
        if (id >= 0) t->tok[id].type = FLM_TOK_CONTROL;
    }
    for (size_t i = 1; i < sizeof special / sizeof *special; i++) /* all but BOS */
        if (special[i] >= 0) t->eog[special[i]] = 1;
    /* decoded bytes (BPE NORMAL tokens: in flm_bpe_init) and the special-token trie */
    for (uint32_t i = 0; i < n_vocab; i++) {
        tok_entry *e = &t->tok[i];
        int b = parse_byte_token(e->text, e->len);
        e->dec_len = 0;
        if (e->type == FLM_TOK_USER) {
            memcpy(e->dec, e->text, e->len);
            e->dec_len = e->len;
        } else if (kind == FLM_TOKENIZER_SPM && e->type == FLM_TOK_BYTE && b >= 0) {
            e->dec[0] = (char)b;
            e->dec_len = 1;
        } else if (kind == FLM_TOKENIZER_SPM && (e->type == FLM_TOK_NORMAL || e->type == FLM_TOK_BYTE)) {
            uint32_t k = 0; /* "▁" (E2 96 81) -> ' ' */
            for (uint32_t j = 0; j < e->len; j++) {
                if (j + 2 < e->len && (uint8_t)e->text[j] == 0xE2 && (uint8_t)e->text[j + 1] == 0x96 &&
                    (uint8_t)e->text[j + 2] == 0x81) {
                    e->dec[k++] = ' ';
                    j += 2;
                } else {
                    e->dec[k++] = e->text[j];
                }
            }
            e->dec_len = k;
        } /* CONTROL, UNKNOWN, UNUSED and undefined types decode to nothing */
        e->dec[e->dec_len] = 0;
        if ((e->type == FLM_TOK_CONTROL || e->type == FLM_TOK_USER || e->type == FLM_TOK_UNKNOWN) && e->len > 0 &&
            !trie_add(t, e->text, e->len, (int32_t)i))
            goto nomem;
    }
    if (kind == FLM_TOKENIZER_SPM) {
        /* byte fallback: "<0xXX>", else the byte itself as a string (llama_vocab::byte_to_token) */
        for (int c = 0; c < 256; c++) {
            static const char hex[] = "0123456789ABCDEF";
            char buf[6] = {'<', '0', 'x', hex[c >> 4], hex[c & 15], '>'};
            char one = (char)c;
            int32_t id = flm_tok_lookup(t, buf, 6);
            if (id < 0 && c != 0) id = flm_tok_lookup(t, &one, 1);
            t->byte_id[c] = id;
        }
    } else if ((st = flm_bpe_init(t, sp->pre, sp->n_merges, sp->merges, sp->merge_lens, err)) != FLM_OK) {
        goto fail;
    }
    /* a vocabulary of only control, unknown and unused tokens decodes every token to nothing: generation would
     * print an empty text and succeed (issue 12) */
    bool any_text = false;
    for (uint32_t i = 0; i < n_vocab && !any_text; i++) any_text = t->tok[i].dec_len > 0;
    if (!any_text) {
        st = flm_fail(err, FLM_ERR_FORMAT, "tokenizer: none of the %u tokens decodes to text (every one is a control, "
                      "unknown or unused token): the model could only ever print nothing", n_vocab);
        goto fail;
    }
    *out = t;
    return FLM_OK;
nomem:
    st = flm_fail(err, FLM_ERR_NOMEM, "tokenizer: out of memory");
fail:
    flm_tokenizer_free(t);
    return st;
}

flm_status flm_tokenizer_create(uint32_t n_vocab, const char *const *pieces, const uint32_t *lens,
                                const float *scores, const int32_t *types, int32_t bos, int32_t eos,
                                bool add_space_prefix, flm_tokenizer **out, flm_error *err) {
    flm_tokenizer_spec sp = {
        .model = "llama", .n_vocab = n_vocab, .pieces = pieces, .lens = lens, .scores = scores, .types = types,
        .bos = bos, .eos = eos, .eot = -1, .eom = -1, .fim_pad = -1, .fim_rep = -1, .fim_sep = -1,
        .add_bos = -1, .add_eos = -1, .add_space_prefix = add_space_prefix ? 1 : 0,
    };
    return flm_tokenizer_create_spec(&sp, out, err);
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
    free(t->eog);
    free(t->trie);
    flm_bpe_free(t->bpe);
    free(t);
}

/* ---- encoding ------------------------------------------------------------------------------------------------ */

typedef struct { size_t pos; uint32_t len; int32_t id; } occurrence;

/* llama.cpp processes the special tokens longest first (ties: here the lower id), and each one's occurrences left to
 * right, taking an occurrence only when it lies in text no longer token already took. */
static int occ_order(const void *a, const void *b) {
    const occurrence *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}
static int occ_by_pos(const void *a, const void *b) {
    const occurrence *x = a, *y = b;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* SentencePiece over one raw fragment: optional space prefix, ' ' -> "▁". */
static bool spm_fragment(const flm_tokenizer *t, const char *text, size_t len, bool prefix, tok_out *o) {
    size_t spaces = prefix ? 1 : 0;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    if (spaces > (SIZE_MAX - len - 1) / 2) return false;
    char *norm = malloc(len + 2 * spaces + 1);
    if (!norm) return false;
    size_t k = 0;
    if (prefix) { memcpy(norm, "\xE2\x96\x81", 3); k = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(norm + k, "\xE2\x96\x81", 3); k += 3; }
        else norm[k++] = text[i];
    }
    bool ok = flm_spm_encode(t, norm, k, o);
    free(norm);
    return ok;
}

static bool encode_fragment(const flm_tokenizer *t, const char *text, size_t len, bool prev_special, tok_out *o) {
    if (t->kind == FLM_TOKENIZER_BPE) return flm_bpe_encode(t, text, len, o);
    return spm_fragment(t, text, len, t->add_space_prefix && prev_special, o);
}

/* Whether [p, q) overlaps one of the n sorted, disjoint spans plain[2i .. 2i + 1). */
static bool in_plain(const size_t *plain, size_t n, size_t p, size_t q) {
    size_t lo = 0, hi = n;
    while (lo < hi) { /* the first span that ends after p */
        size_t m = (lo + hi) / 2;
        if (plain[2 * m + 1] <= p) lo = m + 1;
        else hi = m;
    }
    return lo < n && plain[2 * lo] < q;
}

size_t flm_tokenizer_encode_ex(const flm_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t *ids,
                               size_t cap) {
    return flm_tokenizer_encode_spans(t, text, len, flags, NULL, 0, ids, cap);
}

size_t flm_tokenizer_encode_spans(const flm_tokenizer *t, const char *text, size_t len, unsigned flags,
                                  const size_t *plain, size_t n_plain, int32_t *ids, size_t cap) {
    tok_out o = {ids, cap, 0};
    if ((flags & FLM_TOKENIZE_ADD_BOS) && t->bos >= 0) tok_emit(&o, t->bos);
    bool parse = (flags & FLM_TOKENIZE_PARSE_SPECIAL) != 0;
    /* every occurrence of every special token that may be matched */
    occurrence *occ = NULL;
    size_t n_occ = 0, cap_occ = 0;
    bool ok = true;
    for (size_t p = 0; p < len && ok; p++) {
        uint32_t node = t->root[(uint8_t)text[p]];
        for (size_t q = p + 1; node; q++) {
            int32_t id = t->trie[node].id;
            if (id >= 0 && (t->tok[id].type == FLM_TOK_USER ||
                            (parse && !(n_plain && in_plain(plain, n_plain, p, q))))) {
                if (n_occ == cap_occ) {
                    size_t c = cap_occ ? 2 * cap_occ : 64;
                    occurrence *v = realloc(occ, c * sizeof *v);
                    if (!v) { ok = false; break; }
                    occ = v;
                    cap_occ = c;
                }
                occ[n_occ++] = (occurrence){p, (uint32_t)(q - p), id};
            }
            if (q >= len) break;
            uint32_t c = t->trie[node].child;
            while (c && t->trie[c].byte != (uint8_t)text[q]) c = t->trie[c].sibling;
            node = c;
        }
    }
    size_t n_taken = 0;
    if (ok && n_occ > 0) {
        /* take them in llama.cpp's order; taken[] marks the bytes already given to a special token */
        uint8_t *taken = calloc(len / 8 + 1, 1);
        if (!taken) {
            ok = false;
        } else {
            qsort(occ, n_occ, sizeof *occ, occ_order);
            for (size_t i = 0; i < n_occ; i++) {
                bool free_span = true;
                for (size_t b = occ[i].pos; b < occ[i].pos + occ[i].len && free_span; b++)
                    free_span = !(taken[b >> 3] & (1u << (b & 7)));
                if (!free_span) continue;
                for (size_t b = occ[i].pos; b < occ[i].pos + occ[i].len; b++) taken[b >> 3] |= (uint8_t)(1u << (b & 7));
                occ[n_taken++] = occ[i];
            }
            free(taken);
            qsort(occ, n_taken, sizeof *occ, occ_by_pos);
        }
    }
    /* the fragments in order: raw text between the special tokens, and the tokens */
    bool prev_special = true; /* SentencePiece: a space prefix at the start and after each special token */
    size_t at = 0;
    for (size_t i = 0; ok && i <= n_taken; i++) {
        size_t end = i < n_taken ? occ[i].pos : len;
        if (end > at) {
            ok = encode_fragment(t, text + at, end - at, prev_special, &o);
            prev_special = false;
        }
        if (i < n_taken) {
            tok_emit(&o, occ[i].id);
            prev_special = true;
            at = occ[i].pos + occ[i].len;
        }
    }
    free(occ);
    if (!ok) return SIZE_MAX;
    if ((flags & FLM_TOKENIZE_ADD_EOS) && t->eos >= 0) tok_emit(&o, t->eos);
    return o.n;
}

size_t flm_tokenizer_encode(const flm_tokenizer *t, const char *text, bool add_bos, int32_t *ids, size_t cap) {
    return flm_tokenizer_encode_ex(t, text, strlen(text), add_bos ? FLM_TOKENIZE_ADD_BOS : 0u, ids, cap);
}

/* ---- decoding and queries ------------------------------------------------------------------------------------ */

const char *flm_tokenizer_piece(const flm_tokenizer *t, int32_t prev, int32_t id, size_t *len) {
    if (id < 0 || (uint32_t)id >= t->n_vocab) { *len = 0; return ""; }
    const tok_entry *e = &t->tok[id];
    const char *p = e->dec;
    size_t n = e->dec_len;
    bool after_special = prev >= 0 && (uint32_t)prev < t->n_vocab &&
                         (prev == t->bos || t->tok[prev].type == FLM_TOK_CONTROL ||
                          t->tok[prev].type == FLM_TOK_UNKNOWN || t->tok[prev].type == FLM_TOK_USER);
    if (t->kind == FLM_TOKENIZER_SPM && t->add_space_prefix && after_special && n > 0 && p[0] == ' ' &&
        e->type == FLM_TOK_NORMAL) {
        p++;
        n--;
    }
    *len = n;
    return p;
}

const char *flm_tokenizer_vocab(const flm_tokenizer *t, int32_t id) {
    return (id < 0 || (uint32_t)id >= t->n_vocab) ? "" : t->tok[id].text;
}
uint32_t flm_tokenizer_n_vocab(const flm_tokenizer *t) { return t->n_vocab; }
int32_t flm_tokenizer_bos(const flm_tokenizer *t) { return t->bos; }
int32_t flm_tokenizer_eos(const flm_tokenizer *t) { return t->eos; }

int32_t flm_tokenizer_find(const flm_tokenizer *t, const char *piece) {
    return flm_tok_lookup(t, piece, strlen(piece));
}

bool flm_tokenizer_is_eog(const flm_tokenizer *t, int32_t id) {
    return id >= 0 && (uint32_t)id < t->n_vocab && t->eog[id];
}

bool flm_tokenizer_wants_bos(const flm_tokenizer *t) { return t->add_bos && t->bos >= 0; }
bool flm_tokenizer_wants_eos(const flm_tokenizer *t) { return t->add_eos && t->eos >= 0; }

unsigned flm_tokenizer_special_flags(const flm_tokenizer *t) {
    return (flm_tokenizer_wants_bos(t) ? FLM_TOKENIZE_ADD_BOS : 0u) |
           (flm_tokenizer_wants_eos(t) ? FLM_TOKENIZE_ADD_EOS : 0u);
}
