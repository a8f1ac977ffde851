/* json_schema.c — a JSON schema (a subset of draft 2020-12, the one OpenAI's structured outputs and pydantic use)
 * compiled to a GBNF grammar (session/grammar.c runs it) whose sentences are JSON texts that validate against the
 * schema. The rules follow llama.cpp's json-schema-to-grammar where they meet (primitive rules, properties in their
 * declared order, bounded whitespace); the code is this project's. What it does with each keyword is in
 * docs/STRUCTURED.md; a keyword it cannot guarantee is refused by name (FLM_ERR_UNSUPPORTED), never ignored. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "flashlm.h"
#include "core/error.h"

typedef struct {
    char *p;
    size_t n, cap;
    bool nomem;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->nomem) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) { b->nomem = true; return; }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_fmt(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A GBNF string literal of the bytes s[0..n): quotes, backslashes and control bytes escaped; UTF-8 passes as is. */
static void sb_lit(sbuf *b, const char *s, size_t n) {
    sb_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
        } else if (c < 0x20 || c == 0x7F) {
            sb_fmt(b, "\\x%02X", c);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_str(b, "\"");
}

#define DEFS_MAX 1024
#define ALTS_MAX 4096 /* alternatives of one enum / anyOf / oneOf: the grammar's parse stacks (GRAM_STACKS_MAX) */

typedef struct {
    sbuf out;
    const char *pfx;
    const cJSON *root;
    int n_rules;
    const cJSON *def_node[DEFS_MAX];
    int def_rule[DEFS_MAX];
    int n_defs;
    int depth;
    flm_error *err;
    flm_status st;
} sc;

static int fail(sc *c, flm_status code, const char *fmt, ...) {
    if (c->st) return -1;
    char m[FLM_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    c->st = flm_fail(c->err, code, "JSON schema: %s", m);
    return -1;
}

static int new_rule(sc *c) { return c->n_rules++; }

/* "PFX-N ::= " */
static void rule_head(sc *c, int r) { sb_fmt(&c->out, "%s-r%d ::= ", c->pfx, r); }
static void rule_ref(sc *c, sbuf *b, int r) { sb_fmt(b, " %s-r%d ", c->pfx, r); }

/* The keywords this compiler honours (others are refused by name); annotations constrain nothing. */
static const char *const KNOWN[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
    "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "minLength", "maxLength",
    /* annotations */
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", NULL};

static bool known(const char *k) {
    for (int i = 0; KNOWN[i]; i++)
        if (!strcmp(KNOWN[i], k)) return true;
    return false;
}

static int compile(sc *c, const cJSON *s);

/* Keywords that narrow a value of a type; with enum or const they are refused (the literals are emitted as given). */
static const char *const CONSTRAINTS[] = {"properties", "required", "additionalProperties", "items", "minItems",
                                          "maxItems", "minLength", "maxLength", NULL};

/* Whether JSON value v has one of the types `type` names (a string, or an array of them; JSON Schema's
 * "integer": a number without a fraction). */
static bool literal_has_type(const cJSON *v, const cJSON *type) {
    if (cJSON_IsArray(type)) {
        const cJSON *t;
        cJSON_ArrayForEach(t, type) if (literal_has_type(v, t)) return true;
        return false;
    }
    if (!cJSON_IsString(type)) return false;
    const char *t = type->valuestring;
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    return false;
}

/* A literal alternative: the compact JSON text of v. */
static bool put_json_literal(sc *c, sbuf *b, const cJSON *v) {
    char *t = cJSON_PrintUnformatted(v);
    if (!t) { fail(c, FLM_ERR_NOMEM, "out of memory"); return false; }
    sb_lit(b, t, strlen(t));
    free(t);
    return true;
}

static bool get_count(sc *c, const cJSON *s, const char *key, long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return true;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 4096 || v->valuedouble != floor(v->valuedouble)) {
        fail(c, FLM_ERR_UNSUPPORTED, "'%s' must be an integer from 0 to 4096", key);
        return false;
    }
    *out = (long)v->valuedouble;
    return true;
}

/* "{m,n}" for a count pair (hi < 0: unbounded); "" for {0,} written as "*" by the caller. */
static void put_repeat(sbuf *b, long lo, long hi) {
    if (hi < 0) {
        if (lo == 0) sb_str(b, "*");
        else if (lo == 1) sb_str(b, "+");
        else sb_fmt(b, "{%ld,}", lo);
    } else if (lo == 0 && hi == 1) {
        sb_str(b, "?");
    } else {
        sb_fmt(b, "{%ld,%ld}", lo, hi);
    }
}

/* An object's members in their declared order, required or not: rules first_i (nothing written yet) and after_i
 * (something written). Returns the rule of first_0. */
static int object_rule(sc *c, const cJSON *s) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, FLM_ERR_FORMAT, "'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return fail(c, FLM_ERR_FORMAT, "'required' must be an array of names");
    if (add && !cJSON_IsBool(add) && !cJSON_IsObject(add))
        return fail(c, FLM_ERR_FORMAT, "'additionalProperties' must be a boolean or a schema");
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        if (!cJSON_IsString(r)) return fail(c, FLM_ERR_FORMAT, "'required' must be an array of names");
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return fail(c, FLM_ERR_UNSUPPORTED, "required property '%s' is not in 'properties'", r->valuestring);
    }
    int n = props ? cJSON_GetArraySize(props) : 0;
    int rule = new_rule(c);
    sbuf body = {0};
    if (n == 0) { /* a map: any keys (strings), values by additionalProperties; none with an empty 'properties' (the
                     declared ones, as below) unless additionalProperties is a schema */
        if ((add && cJSON_IsFalse(add)) || (props && !(add && cJSON_IsObject(add)))) {
            sb_str(&body, "\"{\" ");
            sb_fmt(&body, "%s-ws \"}\"", c->pfx);
        } else {
            int v = compile(c, add && cJSON_IsObject(add) ? add : NULL);
            if (v < 0) { free(body.p); return -1; }
            int m = new_rule(c);
            rule_head(c, m);
            sb_fmt(&c->out, "%s-string %s-ws \":\" %s-ws", c->pfx, c->pfx, c->pfx);
            rule_ref(c, &c->out, v);
            sb_str(&c->out, "\n");
            sb_fmt(&body, "\"{\" %s-ws (", c->pfx);
            rule_ref(c, &body, m);
            sb_fmt(&body, "(%s-ws \",\" %s-ws", c->pfx, c->pfx);
            rule_ref(c, &body, m);
            sb_fmt(&body, ")* %s-ws)? \"}\"", c->pfx);
        }
    } else {
        if (add && cJSON_IsObject(add) && cJSON_GetArraySize(add) > 0)
            return free(body.p), fail(c, FLM_ERR_UNSUPPORTED, "'additionalProperties' as a schema together with "
                                      "'properties'");
        /* additionalProperties absent or true: the output has only the declared properties (valid either way) */
        int n_opt = n;
        cJSON_ArrayForEach(r, req) n_opt--;
        if (n_opt >= ALTS_MAX)
            return free(body.p), fail(c, FLM_ERR_UNSUPPORTED, "'properties' has %d optional properties: at most %d "
                                      "(each is a parse stack the grammar follows at once)", n_opt, ALTS_MAX - 1);
        int *kv = malloc((size_t)n * sizeof *kv);
        bool *need = calloc((size_t)n, 1);
        if (!kv || !need) { free(kv); free(need); free(body.p); return fail(c, FLM_ERR_NOMEM, "out of memory"); }
        int i = 0;
        const cJSON *p;
        cJSON_ArrayForEach(p, props) {
            cJSON_ArrayForEach(r, req) if (!strcmp(r->valuestring, p->string)) need[i] = true;
            int v = compile(c, p);
            if (v < 0) { free(kv); free(need); free(body.p); return -1; }
            kv[i] = new_rule(c);
            rule_head(c, kv[i]);
            cJSON *key = cJSON_CreateString(p->string);
            if (!key || !put_json_literal(c, &c->out, key)) {
                cJSON_Delete(key); free(kv); free(need); free(body.p);
                return fail(c, FLM_ERR_NOMEM, "out of memory");
            }
            cJSON_Delete(key);
            sb_fmt(&c->out, " %s-ws \":\" %s-ws", c->pfx, c->pfx);
            rule_ref(c, &c->out, v);
            sb_str(&c->out, "\n");
            i++;
        }
        int first0 = c->n_rules;
        c->n_rules += 2 * (n + 1); /* first_i = first0 + i, after_i = first0 + n + 1 + i */
        for (i = n; i >= 0; i--) {
            int fi = first0 + i, ai = first0 + n + 1 + i;
            rule_head(c, fi);
            if (i < n) {
                rule_ref(c, &c->out, kv[i]);
                rule_ref(c, &c->out, first0 + n + 1 + i + 1);
                if (!need[i]) {
                    sb_str(&c->out, "|");
                    rule_ref(c, &c->out, fi + 1);
                }
            }
            sb_str(&c->out, "\n");
            rule_head(c, ai);
            if (i < n) {
                sb_fmt(&c->out, "%s-ws \",\" %s-ws", c->pfx, c->pfx);
                rule_ref(c, &c->out, kv[i]);
                rule_ref(c, &c->out, ai + 1);
                if (!need[i]) {
                    sb_str(&c->out, "|");
                    rule_ref(c, &c->out, ai + 1);
                }
            }
            sb_str(&c->out, "\n");
        }
        free(kv);
        free(need);
        sb_fmt(&body, "\"{\" %s-ws", c->pfx);
        rule_ref(c, &body, first0);
        sb_fmt(&body, "%s-ws \"}\"", c->pfx);
    }
    rule_head(c, rule);
    sb_put(&c->out, body.p ? body.p : "", body.n);
    sb_str(&c->out, "\n");
    bool oom = body.nomem;
    free(body.p);
    if (oom) return fail(c, FLM_ERR_NOMEM, "out of memory");
    return rule;
}

static int array_rule(sc *c, const cJSON *s) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    long lo = 0, hi = -1;
    if (!get_count(c, s, "minItems", &lo) || !get_count(c, s, "maxItems", &hi)) return -1;
    if (cJSON_IsArray(items)) { /* a tuple (draft 4-2019's array form): exactly these items, in order, as
                                  llama.cpp's converter makes it (a subset of what the schema accepts) */
        long n = cJSON_GetArraySize(items);
        if (n < lo || (hi >= 0 && n > hi))
            return fail(c, FLM_ERR_UNSUPPORTED, "a tuple 'items' of %ld schemas outside minItems/maxItems", n);
        int *ir = n ? malloc((size_t)n * sizeof *ir) : NULL;
        if (n && !ir) return fail(c, FLM_ERR_NOMEM, "out of memory");
        long k = 0;
        for (const cJSON *e = items->child; e; e = e->next, k++) {
            if (!cJSON_IsObject(e) && !cJSON_IsTrue(e)) {
                free(ir);
                return fail(c, FLM_ERR_UNSUPPORTED, "'items'[%ld] must be a schema", k);
            }
            if ((ir[k] = compile(c, cJSON_IsObject(e) ? e : NULL)) < 0) { free(ir); return -1; }
        }
        int rule = new_rule(c);
        sbuf b = {0};
        sb_fmt(&b, "\"[\" %s-ws ", c->pfx);
        for (k = 0; k < n; k++) {
            if (k) sb_fmt(&b, " %s-ws \",\" %s-ws ", c->pfx, c->pfx);
            rule_ref(c, &b, ir[k]);
        }
        sb_fmt(&b, " %s-ws \"]\"", c->pfx);
        free(ir);
        rule_head(c, rule);
        sb_put(&c->out, b.p ? b.p : "", b.n);
        sb_str(&c->out, "\n");
        bool oom = b.nomem;
        free(b.p);
        if (oom) return fail(c, FLM_ERR_NOMEM, "out of memory");
        return rule;
    }
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items))
        return fail(c, FLM_ERR_UNSUPPORTED, "'items' must be a schema or an array of schemas (a tuple)");
    if (hi >= 0 && hi < lo) return fail(c, FLM_ERR_UNSUPPORTED, "maxItems is below minItems");
    int rule = new_rule(c);
    if (items && cJSON_IsFalse(items)) {
        if (lo > 0) return fail(c, FLM_ERR_UNSUPPORTED, "'items': false with minItems > 0");
        rule_head(c, rule);
        sb_fmt(&c->out, "\"[\" %s-ws \"]\"\n", c->pfx);
        return rule;
    }
    int it = compile(c, items && cJSON_IsObject(items) ? items : NULL);
    if (it < 0) return -1;
    sbuf b = {0};
    sb_fmt(&b, "\"[\" %s-ws ", c->pfx);
    if (hi != 0) {
        if (lo == 0) sb_str(&b, "(");
        rule_ref(c, &b, it);
        sb_fmt(&b, "(%s-ws \",\" %s-ws", c->pfx, c->pfx);
        rule_ref(c, &b, it);
        sb_str(&b, ")");
        put_repeat(&b, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
        sb_fmt(&b, " %s-ws", c->pfx);
        if (lo == 0) sb_str(&b, ")?");
    }
    sb_str(&b, " \"]\"");
    rule_head(c, rule);
    sb_put(&c->out, b.p ? b.p : "", b.n);
    sb_str(&c->out, "\n");
    bool oom = b.nomem;
    free(b.p);
    if (oom) return fail(c, FLM_ERR_NOMEM, "out of memory");
    return rule;
}

static int string_rule(sc *c, const cJSON *s) {
    long lo = 0, hi = -1;
    if (!get_count(c, s, "minLength", &lo) || !get_count(c, s, "maxLength", &hi)) return -1;
    if (hi >= 0 && hi < lo) return fail(c, FLM_ERR_UNSUPPORTED, "maxLength is below minLength");
    if (lo == 0 && hi < 0) return -2; /* the plain string rule */
    int rule = new_rule(c);
    rule_head(c, rule);
    if (hi == 0) {
        sb_str(&c->out, "\"\\\"\\\"\"\n"); /* "" */
        return rule;
    }
    sb_fmt(&c->out, "\"\\\"\" %s-char", c->pfx);
    put_repeat(&c->out, lo, hi);
    sb_str(&c->out, " \"\\\"\"\n");
    return rule;
}

/* One type's rule (by name) for schema s; -1 on error. */
static int type_rule(sc *c, const cJSON *s, const char *t) {
    if (!strcmp(t, "object")) return object_rule(c, s);
    if (!strcmp(t, "array")) return array_rule(c, s);
    int r;
    if (!strcmp(t, "string")) {
        if ((r = string_rule(c, s)) != -2) return r;
    } else if (strcmp(t, "number") && strcmp(t, "integer") && strcmp(t, "boolean") && strcmp(t, "null")) {
        return fail(c, FLM_ERR_FORMAT, "unknown type '%s'", t);
    }
    r = new_rule(c);
    rule_head(c, r);
    sb_fmt(&c->out, "%s-%s\n", c->pfx, t);
    return r;
}

static int ref_rule(sc *c, const char *ref) {
    const cJSON *node = NULL;
    if (!strcmp(ref, "#")) {
        node = c->root;
    } else if (!strncmp(ref, "#/$defs/", 8) || !strncmp(ref, "#/definitions/", 14)) {
        bool defs = ref[2] == '$';
        const char *name = ref + (defs ? 8 : 14);
        if (strchr(name, '/') || strchr(name, '~'))
            return fail(c, FLM_ERR_UNSUPPORTED, "'$ref' %s: only #/$defs/NAME, #/definitions/NAME and #", ref);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c->root, defs ? "$defs" : "definitions");
        node = d ? cJSON_GetObjectItemCaseSensitive(d, name) : NULL;
        if (!node) return fail(c, FLM_ERR_FORMAT, "'$ref' %s: no such definition", ref);
    } else {
        return fail(c, FLM_ERR_UNSUPPORTED, "'$ref' %s: only #/$defs/NAME, #/definitions/NAME and #", ref);
    }
    for (int i = 0; i < c->n_defs; i++)
        if (c->def_node[i] == node) return c->def_rule[i];
    if (c->n_defs == DEFS_MAX) return fail(c, FLM_ERR_UNSUPPORTED, "over %d definitions", DEFS_MAX);
    /* the rule's number first, so that a recursive definition refers to it */
    int r = new_rule(c);
    c->def_node[c->n_defs] = node;
    c->def_rule[c->n_defs++] = r;
    int body = compile(c, node);
    if (body < 0) return -1;
    rule_head(c, r);
    rule_ref(c, &c->out, body);
    sb_str(&c->out, "\n");
    return r;
}

/* The rule of schema s (NULL or true: any JSON value). */
static int compile(sc *c, const cJSON *s) {
    if (c->st) return -1;
    if (++c->depth > 64) return fail(c, FLM_ERR_UNSUPPORTED, "the schema nests over 64 deep");
    int r = -1;
    if (!s || cJSON_IsTrue(s) || (cJSON_IsObject(s) && !s->child)) {
        r = new_rule(c);
        rule_head(c, r);
        sb_fmt(&c->out, "%s-value\n", c->pfx);
        goto out;
    }
    if (cJSON_IsFalse(s)) { fail(c, FLM_ERR_UNSUPPORTED, "the schema false (no value is valid)"); goto out; }
    if (!cJSON_IsObject(s)) { fail(c, FLM_ERR_FORMAT, "a schema must be an object or a boolean"); goto out; }
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        if (!known(k->string)) {
            fail(c, FLM_ERR_UNSUPPORTED, "keyword '%s' is not supported", k->string);
            goto out;
        }
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    int n_kinds = !!ref + !!any + !!one + !!all + !!en + !!cst;
    bool constrained = false; /* keywords that narrow a value besides the kinds above */
    for (int i = 0; CONSTRAINTS[i]; i++) constrained |= cJSON_GetObjectItemCaseSensitive(s, CONSTRAINTS[i]) != NULL;
    if (n_kinds > 1 || (n_kinds && (type || constrained))) {
        /* an enum or const whose every value has the "type" given is fine with it (pydantic writes both); with any
         * other constraint the literals would be emitted unchecked against it */
        bool typed_literal = n_kinds == 1 && (en || cst) && !constrained;
        if (typed_literal && type) {
            const cJSON *e = cst;
            if (en && cJSON_IsArray(en)) e = en->child;
            for (; e && typed_literal; e = en ? e->next : NULL) typed_literal = literal_has_type(e, type);
        }
        if (!typed_literal) {
            fail(c, FLM_ERR_UNSUPPORTED, "'%s' together with other constraints%s", ref ? "$ref" : any ? "anyOf" : one ?
                 "oneOf" : all ? "allOf" : en ? "enum" : "const",
                 n_kinds == 1 && (en || cst) && !constrained ? " (a value that is not of its 'type')" : "");
            goto out;
        }
    }
    if (ref) {
        if (!cJSON_IsString(ref)) { fail(c, FLM_ERR_FORMAT, "'$ref' must be a string"); goto out; }
        r = ref_rule(c, ref->valuestring);
        goto out;
    }
    if (all) {
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1) {
            fail(c, FLM_ERR_UNSUPPORTED, "'allOf' with other than one schema");
            goto out;
        }
        r = compile(c, all->child);
        goto out;
    }
    if (any || one) { /* oneOf as anyOf: the output matches at least one (exactly one when they do not overlap) */
        const cJSON *list = any ? any : one, *e;
        if (!cJSON_IsArray(list) || !cJSON_GetArraySize(list)) {
            fail(c, FLM_ERR_FORMAT, "'%s' must be a non-empty array of schemas", any ? "anyOf" : "oneOf");
            goto out;
        }
        int n = cJSON_GetArraySize(list), *alt, i = 0;
        if (n > ALTS_MAX) {
            fail(c, FLM_ERR_UNSUPPORTED, "'%s' has %d schemas: at most %d (each is a parse stack the grammar "
                 "follows at once)", any ? "anyOf" : "oneOf", n, ALTS_MAX);
            goto out;
        }
        if (!(alt = malloc((size_t)n * sizeof *alt))) { fail(c, FLM_ERR_NOMEM, "out of memory"); goto out; }
        cJSON_ArrayForEach(e, list) if ((alt[i++] = compile(c, e)) < 0) break;
        if (!c->st) {
            r = new_rule(c);
            rule_head(c, r);
            for (i = 0; i < n; i++) {
                if (i) sb_str(&c->out, "|");
                rule_ref(c, &c->out, alt[i]);
            }
            sb_str(&c->out, "\n");
        }
        free(alt);
        goto out;
    }
    if (en || cst) {
        if (en && (!cJSON_IsArray(en) || !cJSON_GetArraySize(en))) { fail(c, FLM_ERR_FORMAT, "'enum' must be a non-empty array"); goto out; }
        if (en && cJSON_GetArraySize(en) > ALTS_MAX) {
            fail(c, FLM_ERR_UNSUPPORTED, "'enum' has %d values: at most %d (each is a parse stack the grammar follows "
                 "at once)", cJSON_GetArraySize(en), ALTS_MAX);
            goto out;
        }
        sbuf b = {0};
        const cJSON *e;
        bool first = true, ok = true;
        if (cst) ok = put_json_literal(c, &b, cst);
        else
            cJSON_ArrayForEach(e, en) {
                if (!first) sb_str(&b, " | ");
                first = false;
                if (!(ok = put_json_literal(c, &b, e))) break;
            }
        if (ok) {
            r = new_rule(c);
            rule_head(c, r);
            sb_put(&c->out, b.p, b.n);
            sb_str(&c->out, "\n");
        }
        free(b.p);
        goto out;
    }
    if (!type) { /* an untyped schema: by its keywords */
        if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
            cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
            r = object_rule(c, s);
        else if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
                 cJSON_GetObjectItemCaseSensitive(s, "maxItems"))
            r = array_rule(c, s);
        else if (cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
            r = type_rule(c, s, "string");
        else { /* annotations only, or $defs: any value */
            r = new_rule(c);
            rule_head(c, r);
            sb_fmt(&c->out, "%s-value\n", c->pfx);
        }
        goto out;
    }
    if (cJSON_IsString(type)) {
        r = type_rule(c, s, type->valuestring);
    } else if (cJSON_IsArray(type) && cJSON_GetArraySize(type) > 0) {
        int n = cJSON_GetArraySize(type), *alt = malloc((size_t)n * sizeof *alt), i = 0;
        if (!alt) { fail(c, FLM_ERR_NOMEM, "out of memory"); goto out; }
        const cJSON *t;
        cJSON_ArrayForEach(t, type) {
            if (!cJSON_IsString(t)) { fail(c, FLM_ERR_FORMAT, "'type' must be a string or an array of strings"); break; }
            if ((alt[i++] = type_rule(c, s, t->valuestring)) < 0) break;
        }
        if (!c->st) {
            r = new_rule(c);
            rule_head(c, r);
            for (i = 0; i < n; i++) {
                if (i) sb_str(&c->out, "|");
                rule_ref(c, &c->out, alt[i]);
            }
            sb_str(&c->out, "\n");
        }
        free(alt);
    } else {
        fail(c, FLM_ERR_FORMAT, "'type' must be a string or a non-empty array of strings");
    }
out:
    c->depth--;
    return c->st ? -1 : r;
}

/* The primitive rules (after llama.cpp's PRIMITIVE_RULES and SPACE_RULE; the whitespace is bounded so that a model
 * cannot spin in it). */
static void primitives(sc *c) {
    const char *p = c->pfx;
    sb_fmt(&c->out, "%s-ws ::= | \" \" | \"\\n\" [ \\t]{0,24}\n", p);
    sb_fmt(&c->out, "%s-boolean ::= \"true\" | \"false\"\n", p);
    sb_fmt(&c->out, "%s-null ::= \"null\"\n", p);
    sb_fmt(&c->out, "%s-int ::= \"-\"? ([0-9] | [1-9] [0-9]{1,15})\n", p);
    sb_fmt(&c->out, "%s-integer ::= %s-int\n", p, p);
    sb_fmt(&c->out, "%s-number ::= %s-int (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n", p, p);
    sb_fmt(&c->out, "%s-char ::= [^\"\\\\\\x00-\\x1F\\x7F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n", p);
    sb_fmt(&c->out, "%s-string ::= \"\\\"\" %s-char* \"\\\"\"\n", p, p);
    sb_fmt(&c->out, "%s-value ::= %s-object | %s-array | %s-string | %s-number | %s-boolean | %s-null\n", p, p, p, p,
           p, p, p);
    sb_fmt(&c->out, "%s-member ::= %s-string %s-ws \":\" %s-ws %s-value\n", p, p, p, p, p);
    sb_fmt(&c->out, "%s-object ::= \"{\" %s-ws (%s-member (%s-ws \",\" %s-ws %s-member)* %s-ws)? \"}\"\n", p, p, p, p,
           p, p, p);
    sb_fmt(&c->out, "%s-array ::= \"[\" %s-ws (%s-value (%s-ws \",\" %s-ws %s-value)* %s-ws)? \"]\"\n", p, p, p, p, p,
           p, p);
}

flm_status flm_json_schema_to_gbnf(const char *schema, size_t len, const char *name, char **out, size_t *out_len,
                                   flm_error *err) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!schema || !out) return flm_fail(err, FLM_ERR_ARG, "flm_json_schema_to_gbnf: schema and out must not be NULL");
    if (!name) name = "root";
    for (const char *q = name; *q; q++)
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '-'))
            return flm_fail(err, FLM_ERR_ARG, "flm_json_schema_to_gbnf: rule name '%s' (letters, digits, '-')", name);
    if (!*name || strlen(name) > 64) return flm_fail(err, FLM_ERR_ARG, "flm_json_schema_to_gbnf: rule name length");
    cJSON *root = cJSON_ParseWithLength(schema, len);
    if (!root) return flm_fail(err, FLM_ERR_FORMAT, "JSON schema: not valid JSON");
    sc c = {.pfx = name, .root = root, .err = err};
    primitives(&c);
    int r = compile(&c, root);
    if (r >= 0) {
        sb_fmt(&c.out, "%s ::=", name);
        rule_ref(&c, &c.out, r);
        sb_str(&c.out, "\n");
    }
    cJSON_Delete(root);
    if (!c.st && c.out.nomem) c.st = flm_fail(err, FLM_ERR_NOMEM, "out of memory compiling a JSON schema");
    if (c.st) {
        free(c.out.p);
        return c.st;
    }
    *out = c.out.p;
    if (out_len) *out_len = c.out.n;
    return FLM_OK;
}

flm_status flm_grammar_json_schema(const char *schema, size_t len, flm_grammar **out, flm_error *err) {
    if (out) *out = NULL;
    char *gbnf = NULL;
    size_t n = 0;
    flm_status st = flm_json_schema_to_gbnf(schema, len, "root", &gbnf, &n, err);
    if (st) return st;
    st = flm_grammar_parse(gbnf, n, "root", out, err);
    free(gbnf);
    return st;
}
