/* grammar.c — GBNF grammars (a subset of llama.cpp's grammars/README.md format) parsed into a byte-level
 * context-free grammar, and the pushdown automaton that runs it (session/grammar.h; docs/STRUCTURED.md).
 *
 * The grammar: rules; each rule a list of alternatives; each alternative a sequence of elements, an element being a
 * byte class (256 bits) or a reference to a rule. Text is UTF-8: a literal's characters become their bytes, a
 * negated class ("[^...]", ".") matches its ASCII complement or any well-formed multi-byte UTF-8 character (a rule of
 * byte classes, Unicode's table 3-7), so the automaton reads bytes and never a broken character. Repetitions
 * (*, +, ?, {m}, {m,}, {m,n}) become rules as in llama.cpp. Left recursion (also through rules that can match nothing)
 * is refused: the automaton expands rules top-down, as llama.cpp's does.
 *
 * The automaton: a configuration is a set of parse stacks (positions in the element array, the top the next element
 * to match, expanded until it is a byte class or the stack is empty: the sentence may end). Configurations are
 * interned (serialized, hashed with xxHash) as numbered states; each state's transitions per byte are computed on
 * first use and kept, so the automaton becomes a DFA on the fly, and a state's token mask is one walk of the
 * vocabulary's byte trie along them. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "flashlm.h"
#include "core/error.h"
#include "session/grammar.h"

enum { EL_END = 0, EL_CLASS = 1, EL_REF = 2 };
typedef struct {
    uint8_t type;
    int32_t v; /* class index or rule id */
} gel;

#define GRAM_RULES_MAX 65536
#define GRAM_ELEMS_MAX (1u << 22)
#define GRAM_REPEAT_MAX 4096     /* {m,n}: n at most */
#define GRAM_STATES_MAX 200000   /* states kept before the caches are cleared (at a generation's start) */
#define GRAM_STATES_HARD 1000000 /* within one generation */
#define GRAM_STACKS_MAX 4096     /* stacks per configuration */
#define GRAM_DEPTH_MAX 4096      /* positions per stack */
#define GRAM_EXPAND_MAX 65536    /* references expanded within one another without a byte read */
#define TR_UNKNOWN (-3)

typedef struct {
    uint32_t off, len;   /* serialized configuration in g->pool */
    uint64_t hash;
    int32_t *trans;      /* [256] (lazy): next state, GRAM_DEAD, or TR_UNKNOWN */
    uint32_t *mask;      /* token mask (lazy) */
    bool accept;
    int8_t complete;     /* -1 unknown */
} gstate;

typedef struct gframe {
    uint32_t len;        /* the stack's length when the reference (its top) was expanded */
    int32_t pos;         /* the reference's position (restored on the way out) */
    uint32_t base;       /* the stack's length under its alternatives */
    uint32_t alt;        /* the next alternative */
} gframe;

struct flm_grammar {
    gel *el;
    size_t n_el;
    uint32_t *alt_start; /* per alternative */
    uint32_t *rule_alt0, *rule_nalt;
    uint32_t n_rules, root;
    uint32_t (*cls)[8];
    size_t n_cls;
    /* the automaton */
    gstate *st;
    size_t n_st, cap_st;
    int32_t *pool;
    size_t pool_len, pool_cap;
    int32_t *ht;         /* open addressing: state ids, -1 empty */
    size_t ht_cap;
    int32_t start;
    const gvocab *mask_vocab;
    /* scratch */
    int32_t *buf;        /* stacks being built: [len][positions] records */
    size_t buf_len, buf_cap;
    int32_t *tmp;        /* one stack */
    struct gframe *frames; /* expand's walk */
    size_t cap_frames;
    size_t *recs;        /* record offsets for sorting */
    size_t n_recs, cap_recs;
    bool overflow;
    bool nomem;
};

/* ==== the vocabulary ============================================================================================ */

struct gvocab {
    uint32_t n_logits, n_tok;
    const char **piece;
    uint32_t *plen;
    uint8_t *is_eog;
    int32_t *eog;
    size_t n_eog;
    /* trie: node 0 is the root */
    uint8_t *nbyte;
    int32_t *child, *sib, *thead, *tnext;
    size_t n_nodes, cap_nodes;
    int32_t root_child[256];
};

void gvocab_free(gvocab *v) {
    if (!v) return;
    free(v->piece);
    free(v->plen);
    free(v->is_eog);
    free(v->eog);
    free(v->nbyte);
    free(v->child);
    free(v->sib);
    free(v->thead);
    free(v->tnext);
    free(v);
}

static int32_t trie_node(gvocab *v) {
    if (v->n_nodes == v->cap_nodes) {
        size_t cap = v->cap_nodes ? v->cap_nodes * 2 : 1 << 16;
        uint8_t *b = realloc(v->nbyte, cap);
        if (b) v->nbyte = b;
        int32_t *c = realloc(v->child, cap * sizeof *c);
        if (c) v->child = c;
        int32_t *s = realloc(v->sib, cap * sizeof *s);
        if (s) v->sib = s;
        int32_t *t = realloc(v->thead, cap * sizeof *t);
        if (t) v->thead = t;
        if (!b || !c || !s || !t) return -1;
        v->cap_nodes = cap;
    }
    int32_t n = (int32_t)v->n_nodes++;
    v->child[n] = v->sib[n] = v->thead[n] = -1;
    v->nbyte[n] = 0;
    return n;
}

static const gvocab *sort_v; /* only during gvocab_build's qsort, under build_mu */
static int cmp_piece(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = sort_v->plen[x], ly = sort_v->plen[y], n = lx < ly ? lx : ly;
    int c = n ? memcmp(sort_v->piece[x], sort_v->piece[y], n) : 0;
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static pthread_mutex_t build_mu = PTHREAD_MUTEX_INITIALIZER;

flm_status gvocab_build(flm_ctx *ctx, gvocab **out, flm_error *err) {
    *out = NULL;
    flm_model_info info;
    flm_get_info(ctx, &info);
    gvocab *v = calloc(1, sizeof *v);
    if (!v) return flm_fail(err, FLM_ERR_NOMEM, "out of memory building the grammar's vocabulary");
    v->n_logits = info.n_vocab;
    uint32_t nv = flm_vocab_size(ctx);
    v->n_tok = nv < info.n_vocab ? nv : info.n_vocab;
    size_t nt = v->n_tok ? v->n_tok : 1;
    v->piece = calloc(nt, sizeof *v->piece);
    v->plen = calloc(nt, sizeof *v->plen);
    v->is_eog = calloc(nt, 1);
    v->tnext = malloc(nt * sizeof *v->tnext);
    v->eog = malloc(nt * sizeof *v->eog);
    int32_t *order = malloc(nt * sizeof *order), path[1024];
    for (int i = 0; i < 256; i++) v->root_child[i] = -1;
    if (!v->piece || !v->plen || !v->is_eog || !v->tnext || !v->eog || !order || trie_node(v) < 0) goto nomem;
    size_t n_order = 0;
    for (uint32_t id = 0; id < v->n_tok; id++) {
        size_t len;
        const char *p = flm_token_piece(ctx, -1, (int32_t)id, &len);
        v->piece[id] = p;
        v->plen[id] = (uint32_t)(len < 1000 ? len : 0); /* a piece over 1000 bytes: never allowed */
        v->tnext[id] = -1;
        if (flm_token_is_eog(ctx, (int32_t)id)) {
            v->is_eog[id] = 1;
            v->eog[v->n_eog++] = (int32_t)id;
        } else if (v->plen[id] > 0) { /* control tokens have no bytes: never allowed under a grammar */
            order[n_order++] = (int32_t)id;
        }
    }
    /* the trie from the pieces in byte order: each shares its prefix with the one before (no child search) */
    pthread_mutex_lock(&build_mu);
    sort_v = v;
    qsort(order, n_order, sizeof *order, cmp_piece);
    pthread_mutex_unlock(&build_mu);
    path[0] = 0;
    int32_t prev = -1;
    for (size_t i = 0; i < n_order; i++) {
        int32_t id = order[i];
        const char *p = v->piece[id];
        uint32_t len = v->plen[id], l = 0;
        if (prev >= 0) {
            uint32_t lp = v->plen[prev];
            while (l < len && l < lp && p[l] == v->piece[prev][l]) l++;
        }
        for (uint32_t k = l; k < len; k++) {
            int32_t node = path[k], c = trie_node(v);
            if (c < 0) goto nomem;
            uint8_t b = (uint8_t)p[k];
            v->nbyte[c] = b;
            v->sib[c] = v->child[node];
            v->child[node] = c;
            if (node == 0) v->root_child[b] = c;
            path[k + 1] = c;
        }
        int32_t node = path[len];
        v->tnext[id] = v->thead[node];
        v->thead[node] = id;
        prev = id;
    }
    free(order);
    *out = v;
    return FLM_OK;
nomem:
    free(order);
    gvocab_free(v);
    return flm_fail(err, FLM_ERR_NOMEM, "out of memory building the grammar's vocabulary");
}

/* ==== parsing GBNF ============================================================================================== */

typedef struct {
    gel *e;
    size_t n, cap;
} pseq;

typedef struct {
    char *name;
    pseq *alts;
    size_t n, cap;
    bool defined;
} prule;

typedef struct {
    const char *p, *end, *src;
    prule *r;
    size_t n_r, cap_r;
    uint32_t (*cls)[8];
    size_t n_cls, cap_cls;
    int32_t byte_cls[256];
    int32_t utf8_rule;
    flm_error *err;
    flm_status st;
    int depth;
} parser;

static int line_of(const parser *P) {
    int line = 1;
    for (const char *q = P->src; q < P->p && q < P->end; q++) line += *q == '\n';
    return line;
}

static bool perr(parser *P, flm_status code, const char *fmt, const char *a) {
    if (P->st) return false;
    char m[200];
    snprintf(m, sizeof m, fmt, a ? a : "");
    P->st = flm_fail(P->err, code, "grammar line %d: %s", line_of(P), m);
    return false;
}

static bool nomem(parser *P) {
    if (!P->st) P->st = flm_fail(P->err, FLM_ERR_NOMEM, "out of memory parsing a grammar");
    return false;
}

static bool seq_add(parser *P, pseq *s, uint8_t type, int32_t v) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        gel *e = realloc(s->e, cap * sizeof *e);
        if (!e) return nomem(P);
        s->e = e;
        s->cap = cap;
    }
    s->e[s->n++] = (gel){type, v};
    return true;
}

static pseq *rule_alt(parser *P, int32_t r) {
    prule *R = &P->r[r];
    if (R->n == R->cap) {
        size_t cap = R->cap ? R->cap * 2 : 4;
        pseq *a = realloc(R->alts, cap * sizeof *a);
        if (!a) { nomem(P); return NULL; }
        R->alts = a;
        R->cap = cap;
    }
    R->alts[R->n] = (pseq){0};
    return &R->alts[R->n++];
}

/* A rule by name (created undefined when new); name NULL: an anonymous rule. -1 on error. */
static int32_t rule_get(parser *P, const char *name, size_t len) {
    if (name)
        for (size_t i = 0; i < P->n_r; i++)
            if (P->r[i].name && strlen(P->r[i].name) == len && !memcmp(P->r[i].name, name, len)) return (int32_t)i;
    if (P->n_r >= GRAM_RULES_MAX) {
        perr(P, FLM_ERR_UNSUPPORTED, "more than %s rules", "65536");
        return -1;
    }
    if (P->n_r == P->cap_r) {
        size_t cap = P->cap_r ? P->cap_r * 2 : 32;
        prule *r = realloc(P->r, cap * sizeof *r);
        if (!r) { nomem(P); return -1; }
        P->r = r;
        P->cap_r = cap;
    }
    prule *R = &P->r[P->n_r];
    memset(R, 0, sizeof *R);
    if (name) {
        if (!(R->name = malloc(len + 1))) { nomem(P); return -1; }
        memcpy(R->name, name, len);
        R->name[len] = 0;
    } else {
        R->defined = true;
    }
    return (int32_t)P->n_r++;
}

static int32_t class_add(parser *P, const uint32_t bits[8]) {
    for (size_t i = 0; i < P->n_cls; i++)
        if (!memcmp(P->cls[i], bits, 32)) return (int32_t)i;
    if (P->n_cls == P->cap_cls) {
        size_t cap = P->cap_cls ? P->cap_cls * 2 : 64;
        uint32_t (*c)[8] = realloc(P->cls, cap * sizeof *c);
        if (!c) { nomem(P); return -1; }
        P->cls = c;
        P->cap_cls = cap;
    }
    memcpy(P->cls[P->n_cls], bits, 32);
    return (int32_t)P->n_cls++;
}

static int32_t class_byte(parser *P, uint8_t b) {
    if (P->byte_cls[b] >= 0) return P->byte_cls[b];
    uint32_t bits[8] = {0};
    bits[b >> 5] |= 1u << (b & 31);
    return P->byte_cls[b] = class_add(P, bits);
}

static int32_t class_range(parser *P, uint8_t lo, uint8_t hi) {
    uint32_t bits[8] = {0};
    for (unsigned b = lo; b <= hi; b++) bits[b >> 5] |= 1u << (b & 31);
    return class_add(P, bits);
}

/* Any well-formed multi-byte UTF-8 character (Unicode 15, table 3-7), as one rule. */
static int32_t utf8_rule(parser *P) {
    if (P->utf8_rule >= 0) return P->utf8_rule;
    static const uint8_t rows[][8] = { /* lo, hi pairs per byte; 0,0 ends */
        {0xC2, 0xDF, 0x80, 0xBF},
        {0xE0, 0xE0, 0xA0, 0xBF, 0x80, 0xBF},
        {0xE1, 0xEC, 0x80, 0xBF, 0x80, 0xBF},
        {0xED, 0xED, 0x80, 0x9F, 0x80, 0xBF},
        {0xEE, 0xEF, 0x80, 0xBF, 0x80, 0xBF},
        {0xF0, 0xF0, 0x90, 0xBF, 0x80, 0xBF, 0x80, 0xBF},
        {0xF1, 0xF3, 0x80, 0xBF, 0x80, 0xBF, 0x80, 0xBF},
        {0xF4, 0xF4, 0x80, 0x8F, 0x80, 0xBF, 0x80, 0xBF},
    };
    int32_t r = rule_get(P, NULL, 0);
    if (r < 0) return -1;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        pseq *a = rule_alt(P, r);
        if (!a) return -1;
        for (int k = 0; k < 8 && rows[i][k]; k += 2) {
            int32_t c = class_range(P, rows[i][k], rows[i][k + 1]);
            if (c < 0 || !seq_add(P, a, EL_CLASS, c)) return -1;
        }
    }
    return P->utf8_rule = r;
}

static void skip_space(parser *P, bool newlines) {
    while (P->p < P->end) {
        char c = *P->p;
        if (c == '#') {
            while (P->p < P->end && *P->p != '\n') P->p++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
            P->p++;
        } else {
            break;
        }
    }
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class (an escape or a UTF-8 sequence): its code point, or -1 after an error. */
static long parse_char(parser *P) {
    if (P->p >= P->end) { perr(P, FLM_ERR_FORMAT, "unexpected end of the grammar%s", NULL); return -1; }
    unsigned char c = (unsigned char)*P->p++;
    if (c == '\\') {
        if (P->p >= P->end) { perr(P, FLM_ERR_FORMAT, "unexpected end after '\\'%s", NULL); return -1; }
        char e = *P->p++;
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            long v = 0;
            for (int i = 0; i < digits; i++) {
                int h = P->p < P->end ? hexval(*P->p) : -1;
                if (h < 0) { perr(P, FLM_ERR_FORMAT, "bad \\%s escape", e == 'x' ? "x" : e == 'u' ? "u" : "U"); return -1; }
                v = v * 16 + h;
                P->p++;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) { perr(P, FLM_ERR_FORMAT, "escape out of Unicode's range%s", NULL); return -1; }
            return v;
        }
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': return e;
        default: {
            char s[2] = {e, 0};
            perr(P, FLM_ERR_FORMAT, "unknown escape \\%s", s);
            return -1;
        }
        }
    }
    if (c < 0x80) return c;
    int n = c >= 0xF0 && c <= 0xF4 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 && c <= 0xDF ? 1 : -1;
    if (c >= 0xF5) n = -1;
    long v = n == 3 ? c & 7 : n == 2 ? c & 15 : c & 31;
    for (int i = 0; i < n; i++) {
        if (P->p >= P->end || ((unsigned char)*P->p & 0xC0) != 0x80) { n = -1; break; }
        v = (v << 6) | ((unsigned char)*P->p++ & 0x3F);
    }
    if (n < 0) { perr(P, FLM_ERR_FORMAT, "invalid UTF-8 in the grammar%s", NULL); return -1; }
    return v;
}

static int utf8_encode(long cp, uint8_t out[4]) {
    if (cp < 0x80) { out[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { out[0] = (uint8_t)(0xC0 | (cp >> 6)); out[1] = (uint8_t)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 63));
        out[2] = (uint8_t)(0x80 | (cp & 63));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 63));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 63));
    out[3] = (uint8_t)(0x80 | (cp & 63));
    return 4;
}

static bool add_codepoint(parser *P, pseq *s, long cp) {
    uint8_t b[4];
    int n = utf8_encode(cp, b);
    for (int i = 0; i < n; i++) {
        int32_t c = class_byte(P, b[i]);
        if (c < 0 || !seq_add(P, s, EL_CLASS, c)) return false;
    }
    return true;
}

/* "[...]" or "." (dot: negated and empty) after its opening; appends one element to s. */
static bool parse_class(parser *P, pseq *s, bool dot) {
    bool neg = false;
    uint32_t bits[8] = {0};
    long wide[64];
    int n_wide = 0;
    if (!dot) {
        if (P->p < P->end && *P->p == '^') { neg = true; P->p++; }
        while (P->p < P->end && *P->p != ']') {
            long lo = parse_char(P);
            if (lo < 0) return false;
            long hi = lo;
            if (P->p + 1 < P->end && *P->p == '-' && P->p[1] != ']') {
                P->p++;
                if ((hi = parse_char(P)) < 0) return false;
                if (hi < lo) return perr(P, FLM_ERR_FORMAT, "a class range ends before it starts%s", NULL);
            }
            if (hi >= 0x80) {
                if (neg || hi != lo || n_wide == 64)
                    return perr(P, FLM_ERR_UNSUPPORTED, "character classes: only single non-ASCII characters in a "
                                "positive class are supported (no non-ASCII ranges, none in [^...])%s", NULL);
                wide[n_wide++] = lo;
                continue;
            }
            for (long b = lo; b <= hi; b++) bits[b >> 5] |= 1u << (b & 31);
        }
        if (P->p >= P->end) return perr(P, FLM_ERR_FORMAT, "unterminated character class%s", NULL);
        P->p++;
    } else {
        neg = true;
    }
    if (neg) {
        for (int w = 0; w < 4; w++) bits[w] = ~bits[w];
        for (int w = 4; w < 8; w++) bits[w] = 0;
    }
    bool any_ascii = false;
    for (int w = 0; w < 8; w++) any_ascii |= bits[w] != 0;
    if (!neg && n_wide == 0) {
        if (!any_ascii) return perr(P, FLM_ERR_FORMAT, "an empty character class%s", NULL);
        int32_t c = class_add(P, bits);
        return c >= 0 && seq_add(P, s, EL_CLASS, c);
    }
    int32_t r = rule_get(P, NULL, 0);
    if (r < 0) return false;
    if (any_ascii) {
        int32_t c = class_add(P, bits);
        pseq *a = rule_alt(P, r);
        if (c < 0 || !a || !seq_add(P, a, EL_CLASS, c)) return false;
    }
    if (neg) {
        int32_t u = utf8_rule(P);
        pseq *a = u >= 0 ? rule_alt(P, r) : NULL;
        if (!a || !seq_add(P, a, EL_REF, u)) return false;
    }
    for (int i = 0; i < n_wide; i++) {
        pseq *a = rule_alt(P, r);
        if (!a || !add_codepoint(P, a, wide[i])) return false;
    }
    return seq_add(P, s, EL_REF, r);
}

static bool parse_alternates(parser *P, int32_t rule, bool nested);

/* The elements s->e[from..n) as one element (a rule when more than one). */
static bool as_one(parser *P, pseq *s, size_t from, gel *out) {
    if (s->n - from == 1) { *out = s->e[from]; return true; }
    int32_t r = rule_get(P, NULL, 0);
    pseq *a = r >= 0 ? rule_alt(P, r) : NULL;
    if (!a) return false;
    for (size_t i = from; i < s->n; i++)
        if (!seq_add(P, a, s->e[i].type, s->e[i].v)) return false;
    *out = (gel){EL_REF, r};
    return true;
}

/* A rule matching x repeated 0..k times (k >= 1), or 0.. when k < 0: r_1 ::= x | "", r_i ::= x r_(i-1) | "", built
 * innermost first in a loop (a recursion k deep overflowed a small thread stack: {0,4096} is accepted). */
static int32_t rule_upto(parser *P, gel x, long k) {
    int32_t inner = -1;
    for (long i = 1; i <= (k < 0 ? 1 : k); i++) {
        int32_t r = rule_get(P, NULL, 0);
        if (r < 0) return -1;
        pseq *a = rule_alt(P, r);
        if (!a || !seq_add(P, a, x.type, x.v)) return -1;
        if (k < 0) inner = r; /* 0..: x r | "" */
        if (inner >= 0 && !seq_add(P, a, EL_REF, inner)) return -1;
        if (!rule_alt(P, r)) return -1; /* the empty alternative */
        inner = r;
    }
    return inner;
}

/* Apply a postfix operator to s->e[from..n), if one follows. */
static bool parse_postfix(parser *P, pseq *s, size_t from) {
    if (P->p >= P->end) return true;
    char c = *P->p;
    long lo, hi;
    if (c == '*') { lo = 0; hi = -1; }
    else if (c == '+') { lo = 1; hi = -1; }
    else if (c == '?') { lo = 0; hi = 1; }
    else if (c == '{') {
        P->p++;
        skip_space(P, false);
        char *e;
        lo = strtol(P->p, &e, 10);
        if (e == P->p || lo < 0) return perr(P, FLM_ERR_FORMAT, "bad repetition {m,n}%s", NULL);
        P->p = e;
        skip_space(P, false);
        hi = lo;
        if (P->p < P->end && *P->p == ',') {
            P->p++;
            skip_space(P, false);
            if (P->p < P->end && *P->p == '}') hi = -1;
            else {
                hi = strtol(P->p, &e, 10);
                if (e == P->p || hi < lo) return perr(P, FLM_ERR_FORMAT, "bad repetition {m,n}%s", NULL);
                P->p = e;
                skip_space(P, false);
            }
        }
        if (P->p >= P->end || *P->p != '}') return perr(P, FLM_ERR_FORMAT, "bad repetition {m,n}%s", NULL);
        if (lo > GRAM_REPEAT_MAX || hi > GRAM_REPEAT_MAX)
            return perr(P, FLM_ERR_UNSUPPORTED, "a repetition over %s", "4096");
    } else {
        return true;
    }
    P->p++;
    if (s->n == from) return perr(P, FLM_ERR_FORMAT, "a repetition with nothing before it%s", NULL);
    gel x;
    if (!as_one(P, s, from, &x)) return false;
    s->n = from;
    for (long i = 0; i < lo; i++)
        if (!seq_add(P, s, x.type, x.v)) return false;
    if (hi == lo) return true;
    int32_t r = rule_upto(P, x, hi < 0 ? -1 : hi - lo);
    return r >= 0 && seq_add(P, s, EL_REF, r);
}

/* A sequence until '|', ')', the end, or (not nested) the end of the line. */
static bool parse_sequence(parser *P, pseq *s, bool nested) {
    for (;;) {
        skip_space(P, nested);
        if (P->p >= P->end) return true;
        char c = *P->p;
        size_t from = s->n;
        if (c == '|' || c == ')' || c == '\n') return true;
        if (c == '"') {
            P->p++;
            size_t start = s->n;
            while (P->p < P->end && *P->p != '"') {
                long cp = parse_char(P);
                if (cp < 0 || !add_codepoint(P, s, cp)) return false;
            }
            if (P->p >= P->end) return perr(P, FLM_ERR_FORMAT, "unterminated string literal%s", NULL);
            P->p++;
            if (s->n == start) { /* "" matches nothing: no element */
                skip_space(P, nested);
                if (P->p < P->end && strchr("*+?{", *P->p)) return perr(P, FLM_ERR_FORMAT, "a repetition of \"\"%s", NULL);
                continue;
            }
        } else if (c == '[') {
            P->p++;
            if (!parse_class(P, s, false)) return false;
        } else if (c == '.') {
            P->p++;
            if (!parse_class(P, s, true)) return false;
        } else if (c == '(') {
            P->p++;
            if (++P->depth > 200) return perr(P, FLM_ERR_UNSUPPORTED, "groups nested over 200 deep%s", NULL);
            int32_t r = rule_get(P, NULL, 0);
            if (r < 0 || !parse_alternates(P, r, true)) return false;
            P->depth--;
            skip_space(P, true);
            if (P->p >= P->end || *P->p != ')') return perr(P, FLM_ERR_FORMAT, "missing ')'%s", NULL);
            P->p++;
            if (!seq_add(P, s, EL_REF, r)) return false;
        } else if (is_name_char(c)) {
            const char *n0 = P->p;
            while (P->p < P->end && is_name_char(*P->p)) P->p++;
            size_t nlen = (size_t)(P->p - n0);
            const char *q = P->p;
            while (q < P->end && (*q == ' ' || *q == '\t')) q++;
            if (q + 3 <= P->end && !memcmp(q, "::=", 3)) { /* the next rule: this sequence ended on the line before */
                P->p = n0;
                if (nested) return perr(P, FLM_ERR_FORMAT, "a rule definition inside parentheses%s", NULL);
                return true;
            }
            int32_t r = rule_get(P, n0, nlen);
            if (r < 0 || !seq_add(P, s, EL_REF, r)) return false;
        } else if (c == '<') {
            return perr(P, FLM_ERR_UNSUPPORTED, "token references (<...>) are not supported%s", NULL);
        } else {
            char m[2] = {c, 0};
            return perr(P, FLM_ERR_FORMAT, "unexpected character '%s'", m);
        }
        if (!parse_postfix(P, s, from)) return false;
    }
}

static bool parse_alternates(parser *P, int32_t rule, bool nested) {
    for (;;) {
        pseq *a = rule_alt(P, rule);
        if (!a) return false;
        pseq tmp = *a;
        *a = (pseq){0};
        bool ok = parse_sequence(P, &tmp, nested);
        P->r[rule].alts[P->r[rule].n - 1] = tmp; /* the rule table may have moved while parsing */
        if (!ok) return false;
        skip_space(P, nested);
        if (P->p < P->end && *P->p == '|') {
            P->p++;
            skip_space(P, true);
            continue;
        }
        return true;
    }
}

static void parser_free(parser *P) {
    for (size_t i = 0; i < P->n_r; i++) {
        free(P->r[i].name);
        for (size_t k = 0; k < P->r[i].n; k++) free(P->r[i].alts[k].e);
        free(P->r[i].alts);
    }
    free(P->r);
    free(P->cls);
}

/* Nullable rules, then left recursion (a rule reachable from itself in a leftmost position). */
static bool check_left_recursion(parser *P, char **bad) {
    size_t n = P->n_r;
    bool *nul = calloc(n, 1);
    uint8_t *mark = calloc(n, 1);
    int32_t *stack = malloc(n * 2 * sizeof *stack);
    if (!nul || !mark || !stack) {
        free(nul); free(mark); free(stack);
        return nomem(P);
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < n; r++) {
            if (nul[r]) continue;
            for (size_t a = 0; a < P->r[r].n && !nul[r]; a++) {
                bool all = true;
                for (size_t k = 0; k < P->r[r].alts[a].n && all; k++) {
                    gel e = P->r[r].alts[a].e[k];
                    all = e.type == EL_REF && nul[e.v];
                }
                if (all) nul[r] = changed = true;
            }
        }
    }
    /* DFS over "r may begin with s"; mark 1 = on the path, 2 = done */
    bool ok = true;
    for (size_t r0 = 0; r0 < n && ok; r0++) {
        if (mark[r0]) continue;
        size_t sp = 0;
        stack[sp++] = (int32_t)r0; stack[sp++] = 0; /* rule, next (alt << 16 | elem) to look at */
        mark[r0] = 1;
        while (sp && ok) {
            int32_t r = stack[sp - 2], it = stack[sp - 1];
            int32_t a = it >> 16, k = it & 0xFFFF;
            if ((size_t)a >= P->r[r].n) { mark[r] = 2; sp -= 2; continue; }
            const pseq *s = &P->r[r].alts[a];
            bool stop = (size_t)k >= s->n || (k > 0 && !(s->e[k - 1].type == EL_REF && nul[s->e[k - 1].v]));
            if (stop) { stack[sp - 1] = (a + 1) << 16; continue; }
            stack[sp - 1] = (a << 16) | (k + 1);
            gel e = s->e[k];
            if (e.type != EL_REF) { stack[sp - 1] = (a + 1) << 16; continue; }
            if (mark[e.v] == 1) { ok = false; *bad = P->r[e.v].name; break; }
            if (mark[e.v] == 0) { mark[e.v] = 1; stack[sp++] = e.v; stack[sp++] = 0; }
        }
    }
    free(nul); free(mark); free(stack);
    return ok;
}

void flm_grammar_free(flm_grammar *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_st; i++) {
        free(g->st[i].trans);
        free(g->st[i].mask);
    }
    free(g->st);
    free(g->pool);
    free(g->ht);
    free(g->el);
    free(g->alt_start);
    free(g->rule_alt0);
    free(g->rule_nalt);
    free(g->cls);
    free(g->buf);
    free(g->tmp);
    free(g->frames);
    free(g->recs);
    free(g);
}

flm_status flm_grammar_parse(const char *text, size_t len, const char *root, flm_grammar **out, flm_error *err) {
    if (out) *out = NULL;
    if (!text || !out) return flm_fail(err, FLM_ERR_ARG, "flm_grammar_parse: text and out must not be NULL");
    if (!root) root = "root";
    parser P = {.p = text, .end = text + len, .src = text, .err = err, .utf8_rule = -1};
    for (int i = 0; i < 256; i++) P.byte_cls[i] = -1;
    if (memchr(text, 0, len)) {
        perr(&P, FLM_ERR_FORMAT, "a NUL byte in the grammar%s", NULL);
        return P.st;
    }
    for (;;) {
        skip_space(&P, true);
        if (P.p >= P.end) break;
        const char *n0 = P.p;
        while (P.p < P.end && is_name_char(*P.p)) P.p++;
        if (P.p == n0) { perr(&P, FLM_ERR_FORMAT, "expected a rule name%s", NULL); break; }
        size_t nlen = (size_t)(P.p - n0);
        skip_space(&P, false);
        if (P.p + 3 > P.end || memcmp(P.p, "::=", 3)) { perr(&P, FLM_ERR_FORMAT, "expected '::=' after a rule name%s", NULL); break; }
        P.p += 3;
        int32_t r = rule_get(&P, n0, nlen);
        if (r < 0) break;
        if (P.r[r].defined) {
            char nm[80];
            snprintf(nm, sizeof nm, "%.*s", (int)(nlen < 64 ? nlen : 64), n0);
            perr(&P, FLM_ERR_FORMAT, "rule '%s' defined twice", nm);
            break;
        }
        P.r[r].defined = true;
        skip_space(&P, false);
        if (!parse_alternates(&P, r, false)) break;
        skip_space(&P, false);
        if (P.p < P.end && *P.p != '\n') { perr(&P, FLM_ERR_FORMAT, "unexpected text after a rule%s", NULL); break; }
    }
    int32_t root_id = -1;
    if (!P.st) {
        for (size_t i = 0; i < P.n_r; i++)
            if (!P.r[i].defined) {
                P.p = P.end;
                perr(&P, FLM_ERR_FORMAT, "rule '%s' is used but not defined", P.r[i].name);
                break;
            }
    }
    if (!P.st) {
        for (size_t i = 0; i < P.n_r; i++)
            if (P.r[i].name && !strcmp(P.r[i].name, root)) root_id = (int32_t)i;
        if (root_id < 0) {
            P.p = P.end;
            perr(&P, FLM_ERR_FORMAT, "no rule '%s' (the start rule)", root);
        }
    }
    char *bad = NULL;
    if (!P.st && !check_left_recursion(&P, &bad) && !P.st) {
        P.p = P.end;
        perr(&P, FLM_ERR_UNSUPPORTED, "left recursion through rule '%s' (rewrite it right-recursive)",
             bad ? bad : "(a group or repetition)");
    }
    flm_grammar *g = NULL;
    if (!P.st) {
        size_t n_el = 0, n_alt = 0;
        for (size_t i = 0; i < P.n_r; i++) {
            n_alt += P.r[i].n;
            for (size_t k = 0; k < P.r[i].n; k++) n_el += P.r[i].alts[k].n + 1;
        }
        g = calloc(1, sizeof *g);
        if (g && n_el <= GRAM_ELEMS_MAX) {
            g->el = malloc((n_el + 1) * sizeof *g->el);
            g->alt_start = malloc((n_alt + 1) * sizeof *g->alt_start);
            g->rule_alt0 = malloc(P.n_r * sizeof *g->rule_alt0);
            g->rule_nalt = malloc(P.n_r * sizeof *g->rule_nalt);
            g->cls = malloc((P.n_cls + 1) * sizeof *g->cls);
        }
        if (g && n_el > GRAM_ELEMS_MAX) {
            P.p = P.end;
            perr(&P, FLM_ERR_UNSUPPORTED, "the grammar expands to over %s elements", "4194304");
        } else if (!g || !g->el || !g->alt_start || !g->rule_alt0 || !g->rule_nalt || !g->cls) {
            nomem(&P);
        } else {
            size_t e = 0, a = 0;
            for (size_t i = 0; i < P.n_r; i++) {
                g->rule_alt0[i] = (uint32_t)a;
                g->rule_nalt[i] = (uint32_t)P.r[i].n;
                for (size_t k = 0; k < P.r[i].n; k++) {
                    g->alt_start[a++] = (uint32_t)e;
                    if (P.r[i].alts[k].n) memcpy(g->el + e, P.r[i].alts[k].e, P.r[i].alts[k].n * sizeof *g->el);
                    e += P.r[i].alts[k].n;
                    g->el[e++] = (gel){EL_END, 0};
                }
            }
            g->n_el = e;
            g->n_rules = (uint32_t)P.n_r;
            g->root = (uint32_t)root_id;
            if (P.n_cls) memcpy(g->cls, P.cls, P.n_cls * sizeof *g->cls);
            g->n_cls = P.n_cls;
            g->start = -1;
        }
    }
    flm_status st = P.st;
    parser_free(&P);
    if (!st) { /* the start state now: a grammar too ambiguous from its first byte is refused here, not mid-reply */
        int32_t s0;
        st = gram_start(g, &s0, err);
    }
    if (st) {
        flm_grammar_free(g);
        return st;
    }
    *out = g;
    return FLM_OK;
}

/* ==== the automaton ============================================================================================= */

/* Append a stack record [len][positions] to the scratch buffer. */
static bool rec_add(flm_grammar *g, const int32_t *stk, size_t len) {
    if (g->n_recs >= GRAM_STACKS_MAX) { g->overflow = true; return false; }
    if (g->buf_len + len + 1 > g->buf_cap) {
        size_t cap = g->buf_cap ? g->buf_cap * 2 : 1024;
        while (cap < g->buf_len + len + 1) cap *= 2;
        int32_t *b = realloc(g->buf, cap * sizeof *b);
        if (!b) { g->nomem = true; return false; }
        g->buf = b;
        g->buf_cap = cap;
    }
    if (g->n_recs == g->cap_recs) {
        size_t cap = g->cap_recs ? g->cap_recs * 2 : 64;
        size_t *r = realloc(g->recs, cap * sizeof *r);
        if (!r) { g->nomem = true; return false; }
        g->recs = r;
        g->cap_recs = cap;
    }
    g->recs[g->n_recs++] = g->buf_len;
    g->buf[g->buf_len++] = (int32_t)len;
    memcpy(g->buf + g->buf_len, stk, len * sizeof *stk);
    g->buf_len += len;
    return true;
}

/* Expand stk[0..len) (g->tmp, capacity GRAM_DEPTH_MAX) until its top is a byte class or it is empty, adding each
 * result to the scratch records. stk is restored before returning. A walk of explicit frames (g->frames, at most
 * GRAM_EXPAND_MAX: then g->overflow), not a recursion: a chain of rules that may match nothing (x{0,4096} inside a
 * repetition, thousands of optional properties) nests that deep, past a small thread stack. */
static bool expand(flm_grammar *g, int32_t *stk, size_t len) {
    size_t n = 0; /* frames: a reference being expanded, its stack's length and position, the next alternative */
    bool ok = true;
    for (;;) {
        while (len > 0 && g->el[stk[len - 1]].type == EL_END) len--; /* cannot happen: ENDs are never pushed */
        if (len == 0 || g->el[stk[len - 1]].type == EL_CLASS) {
            ok = rec_add(g, stk, len);
        } else if (n >= GRAM_EXPAND_MAX) {
            g->overflow = true;
            ok = false;
        } else {
            if (n == g->cap_frames) {
                size_t cap = g->cap_frames ? g->cap_frames * 2 : 256;
                gframe *f = realloc(g->frames, cap * sizeof *f);
                if (!f) { g->nomem = true; ok = false; }
                else { g->frames = f; g->cap_frames = cap; }
            }
            if (ok) {
                /* a reference: the continuation replaces it (or nothing when it ends its alternative), then each
                 * alternative */
                int32_t pos = stk[len - 1];
                size_t base = len - 1;
                if (g->el[pos + 1].type != EL_END) stk[base++] = pos + 1;
                g->frames[n++] = (gframe){(uint32_t)len, pos, (uint32_t)base, 0};
            }
        }
        /* the next alternative of the innermost frame left, or the end */
        for (;;) {
            if (n == 0) return ok;
            gframe *f = &g->frames[n - 1];
            int32_t rule = g->el[f->pos].v;
            if (!ok || f->alt >= g->rule_nalt[rule]) {
                stk[f->len - 1] = f->pos;
                n--;
                continue;
            }
            uint32_t s = g->alt_start[g->rule_alt0[rule] + f->alt++];
            if (g->el[s].type == EL_END) {
                len = f->base;
            } else {
                if (f->base >= GRAM_DEPTH_MAX) { g->overflow = true; ok = false; continue; }
                stk[f->base] = (int32_t)s;
                len = f->base + 1;
            }
            break;
        }
    }
}

static int cmp_rec_g(const flm_grammar *g, size_t a, size_t b) {
    const int32_t *x = g->buf + a, *y = g->buf + b;
    int32_t n = x[0] < y[0] ? x[0] : y[0];
    for (int32_t i = 1; i <= n; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sort the scratch records (shell sort: qsort has no context argument, and several sessions run at once). */
static void sort_recs(flm_grammar *g) {
    size_t n = g->n_recs, *r = g->recs;
    for (size_t gap = n / 2; gap > 0; gap /= 2)
        for (size_t i = gap; i < n; i++)
            for (size_t j = i; j >= gap && cmp_rec_g(g, r[j - gap], r[j]) > 0; j -= gap) {
                size_t t = r[j]; r[j] = r[j - gap]; r[j - gap] = t;
            }
}

static bool ht_grow(flm_grammar *g) {
    size_t cap = g->ht_cap ? g->ht_cap * 2 : 1024;
    int32_t *t = malloc(cap * sizeof *t);
    if (!t) return false;
    for (size_t i = 0; i < cap; i++) t[i] = -1;
    for (size_t i = 0; i < g->n_st; i++) {
        size_t h = (size_t)g->st[i].hash & (cap - 1);
        while (t[h] >= 0) h = (h + 1) & (cap - 1);
        t[h] = (int32_t)i;
    }
    free(g->ht);
    g->ht = t;
    g->ht_cap = cap;
    return true;
}

/* The state of the scratch records (sorted, duplicates dropped, interned); -2 on an error. */
static int32_t intern(flm_grammar *g, flm_error *err) {
    if (g->nomem) return flm_fail(err, FLM_ERR_NOMEM, "out of memory running a grammar"), -2;
    if (g->overflow)
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "the grammar is too ambiguous or nests too deep (over %d parse "
                        "stacks, %d levels or %d rules expanded within one another)", GRAM_STACKS_MAX,
                        GRAM_DEPTH_MAX, GRAM_EXPAND_MAX), -2;
    sort_recs(g);
    /* serialize: [n][len][pos...]... */
    size_t need = 1;
    for (size_t i = 0; i < g->n_recs; i++) need += 1 + (size_t)g->buf[g->recs[i]];
    if (g->pool_len + need > g->pool_cap) {
        size_t cap = g->pool_cap ? g->pool_cap * 2 : 4096;
        while (cap < g->pool_len + need) cap *= 2;
        int32_t *p = realloc(g->pool, cap * sizeof *p);
        if (!p) return flm_fail(err, FLM_ERR_NOMEM, "out of memory running a grammar"), -2;
        g->pool = p;
        g->pool_cap = cap;
    }
    int32_t *o = g->pool + g->pool_len;
    size_t k = 1, n = 0;
    bool accept = false;
    for (size_t i = 0; i < g->n_recs; i++) {
        if (i > 0 && cmp_rec_g(g, g->recs[i - 1], g->recs[i]) == 0) continue;
        const int32_t *r = g->buf + g->recs[i];
        memcpy(o + k, r, (1 + (size_t)r[0]) * sizeof *r);
        k += 1 + (size_t)r[0];
        n++;
        accept |= r[0] == 0;
    }
    o[0] = (int32_t)n;
    uint64_t h = XXH3_64bits(o, k * sizeof *o);
    if (g->ht_cap) {
        for (size_t i = (size_t)h & (g->ht_cap - 1);; i = (i + 1) & (g->ht_cap - 1)) {
            int32_t id = g->ht[i];
            if (id < 0) break;
            const gstate *s = &g->st[id];
            if (s->hash == h && s->len == k && !memcmp(g->pool + s->off, o, k * sizeof *o)) return id;
        }
    }
    if (g->n_st >= GRAM_STATES_HARD)
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "the grammar's automaton exceeds %d states", GRAM_STATES_HARD), -2;
    if ((g->n_st + 1) * 2 > g->ht_cap && !ht_grow(g))
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory running a grammar"), -2;
    if (g->n_st == g->cap_st) {
        size_t cap = g->cap_st ? g->cap_st * 2 : 256;
        gstate *s = realloc(g->st, cap * sizeof *s);
        if (!s) return flm_fail(err, FLM_ERR_NOMEM, "out of memory running a grammar"), -2;
        g->st = s;
        g->cap_st = cap;
    }
    int32_t id = (int32_t)g->n_st++;
    g->st[id] = (gstate){.off = (uint32_t)g->pool_len, .len = (uint32_t)k, .hash = h, .accept = accept, .complete = -1};
    g->pool_len += k;
    size_t i = (size_t)h & (g->ht_cap - 1);
    while (g->ht[i] >= 0) i = (i + 1) & (g->ht_cap - 1);
    g->ht[i] = id;
    return id;
}

static bool scratch_begin(flm_grammar *g) {
    g->buf_len = 0;
    g->n_recs = 0;
    g->overflow = g->nomem = false;
    if (!g->tmp && !(g->tmp = malloc((GRAM_DEPTH_MAX + 1) * sizeof *g->tmp))) return false;
    return true;
}

static void cache_clear(flm_grammar *g) {
    for (size_t i = 0; i < g->n_st; i++) {
        free(g->st[i].trans);
        free(g->st[i].mask);
    }
    g->n_st = 0;
    g->pool_len = 0;
    for (size_t i = 0; i < g->ht_cap; i++) g->ht[i] = -1;
    g->start = -1;
}

flm_status gram_start(flm_grammar *g, int32_t *state, flm_error *err) {
    if (g->n_st > GRAM_STATES_MAX) cache_clear(g);
    if (g->start < 0) {
        if (!scratch_begin(g)) return flm_fail(err, FLM_ERR_NOMEM, "out of memory running a grammar");
        for (uint32_t a = 0; a < g->rule_nalt[g->root]; a++) {
            uint32_t s = g->alt_start[g->rule_alt0[g->root] + a];
            if (g->el[s].type == EL_END) {
                rec_add(g, g->tmp, 0);
            } else {
                g->tmp[0] = (int32_t)s;
                expand(g, g->tmp, 1);
            }
        }
        int32_t id = intern(g, err);
        if (id < 0) return err ? err->code : FLM_ERR_NOMEM;
        g->start = id;
    }
    *state = g->start;
    return FLM_OK;
}

/* The transition of st on byte b (computed and kept on first use); -2 on an error. */
static int32_t step(flm_grammar *g, int32_t st, uint8_t b, flm_error *err) {
    gstate *s = &g->st[st];
    if (!s->trans) {
        if (!(s->trans = malloc(256 * sizeof *s->trans)))
            return flm_fail(err, FLM_ERR_NOMEM, "out of memory running a grammar"), -2;
        for (int i = 0; i < 256; i++) s->trans[i] = TR_UNKNOWN;
    }
    if (s->trans[b] != TR_UNKNOWN) return s->trans[b];
    if (!scratch_begin(g)) return flm_fail(err, FLM_ERR_NOMEM, "out of memory running a grammar"), -2;
    const int32_t *p = g->pool + s->off;
    int32_t n = p[0];
    size_t k = 1;
    bool any = false;
    for (int32_t i = 0; i < n; i++) {
        int32_t len = p[k];
        const int32_t *stk = p + k + 1;
        k += 1 + (size_t)len;
        if (len == 0) continue;
        int32_t pos = stk[len - 1];
        const uint32_t *bits = g->cls[g->el[pos].v];
        if (!(bits[b >> 5] >> (b & 31) & 1)) continue;
        any = true;
        memcpy(g->tmp, stk, (size_t)len * sizeof *stk);
        size_t l = (size_t)len;
        if (g->el[pos + 1].type != EL_END) g->tmp[l - 1] = pos + 1;
        else l--;
        if (!expand(g, g->tmp, l) && (g->overflow || g->nomem)) break;
    }
    int32_t to = GRAM_DEAD;
    if (any) {
        to = intern(g, err);
        if (to < 0) return -2;
    }
    g->st[st].trans[b] = to; /* g->st may have moved */
    return to;
}

int32_t gram_advance(flm_grammar *g, int32_t st, const char *p, size_t n, flm_error *err) {
    for (size_t i = 0; i < n && st >= 0; i++) st = step(g, st, (uint8_t)p[i], err);
    return st;
}

bool gram_accepting(const flm_grammar *g, int32_t st) { return st >= 0 && g->st[st].accept; }

int gram_complete(flm_grammar *g, int32_t st, flm_error *err) {
    if (g->st[st].complete >= 0) return g->st[st].complete;
    int c = g->st[st].accept;
    for (int b = 0; b < 256 && c; b++) {
        int32_t t = step(g, st, (uint8_t)b, err);
        if (t == -2) return -1;
        if (t >= 0) c = 0;
    }
    g->st[st].complete = (int8_t)c;
    return c;
}

int gram_token_ok(flm_grammar *g, const gvocab *v, int32_t st, int32_t id, flm_error *err) {
    if (id < 0 || (uint32_t)id >= v->n_tok) return 0;
    if (v->is_eog[id]) return g->st[st].accept;
    if (v->plen[id] == 0) return 0;
    int32_t t = gram_advance(g, st, v->piece[id], v->plen[id], err);
    return t == -2 ? -1 : t >= 0;
}

/* The tokens of the trie below the siblings from c on, reached in state st: set their bits. */
static bool mask_walk(flm_grammar *g, const gvocab *v, int32_t c, int32_t st, uint32_t *m, flm_error *err) {
    for (; c >= 0; c = v->sib[c]) {
        int32_t t = step(g, st, v->nbyte[c], err);
        if (t == -2) return false;
        if (t < 0) continue;
        for (int32_t id = v->thead[c]; id >= 0; id = v->tnext[id]) m[id >> 5] |= 1u << (id & 31);
        if (v->child[c] >= 0 && !mask_walk(g, v, v->child[c], t, m, err)) return false;
    }
    return true;
}

const uint32_t *gram_mask(flm_grammar *g, const gvocab *v, int32_t st, flm_error *err) {
    if (g->mask_vocab != v) { /* masks of another vocabulary */
        for (size_t i = 0; i < g->n_st; i++) {
            free(g->st[i].mask);
            g->st[i].mask = NULL;
        }
        g->mask_vocab = v;
    }
    if (g->st[st].mask) return g->st[st].mask;
    size_t words = ((size_t)v->n_logits + 31) / 32;
    uint32_t *m = calloc(words ? words : 1, sizeof *m);
    if (!m) return flm_fail(err, FLM_ERR_NOMEM, "out of memory building a token mask"), NULL;
    if (!mask_walk(g, v, v->child[0], st, m, err)) {
        free(m);
        return NULL;
    }
    if (g->st[st].accept)
        for (size_t i = 0; i < v->n_eog; i++) m[v->eog[i] >> 5] |= 1u << (v->eog[i] & 31);
    g->st[st].mask = m;
    return m;
}

/* ==== public checks ============================================================================================= */

flm_status flm_grammar_match(flm_grammar *g, const char *text, size_t len, bool *complete, flm_error *err) {
    if (complete) *complete = false;
    if (!g || (!text && len)) return flm_fail(err, FLM_ERR_ARG, "flm_grammar_match: no grammar or text");
    int32_t st;
    flm_status s = gram_start(g, &st, err);
    if (s) return s;
    st = gram_advance(g, st, text, len, err);
    if (st == -2) return err ? err->code : FLM_ERR_NOMEM;
    if (complete) *complete = st >= 0 && g->st[st].accept;
    return st >= 0 ? FLM_OK : FLM_ERR_FORMAT;
}
