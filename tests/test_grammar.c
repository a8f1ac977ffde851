/* test_grammar.c — constrained decoding (include/flashlm.h "Constrained decoding"; src/session/grammar.c,
 * json_schema.c): GBNF parsing and its errors; JSON schemas compiled to grammars accept the JSON texts that validate
 * and refuse those that do not (cJSON and a small validator of this test as the reference); unsupported keywords are
 * refused by name; the token masks on real vocabularies (SmolLM2, Qwen2.5-Coder-0.5B) equal a token-by-token check
 * and an independent predicate; greedy generation under a schema gives JSON that validates, ends by itself when the
 * value is complete, and is the same with speculative decoding. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "flashlm.h"
#include "session/grammar.h"
#include "testutil.h"

static flm_grammar *gbnf(const char *text) {
    flm_grammar *g = NULL;
    flm_error err;
    flm_status st = flm_grammar_parse(text, strlen(text), NULL, &g, &err);
    if (st) fail_msg("grammar refused: %s", err.msg);
    return g;
}

/* 1: text is a complete sentence; 0: every byte taken, not complete; -1: a byte refused. */
static int match(flm_grammar *g, const char *text) {
    bool complete = false;
    flm_error err;
    flm_status st = flm_grammar_match(g, text, strlen(text), &complete, &err);
    if (st == FLM_ERR_FORMAT) return -1;
    assert_int_equal(st, FLM_OK);
    return complete ? 1 : 0;
}

static void test_gbnf_basics(void **state) {
    (void)state;
    flm_grammar *g = gbnf("# a comment\n"
                          "root ::= greeting (\", \" name)? \"!\"\n"
                          "greeting ::= \"hi\" | \"hello\"\n"
                          "name ::= [A-Z] [a-z]{1,5}\n");
    assert_int_equal(match(g, "hi!"), 1);
    assert_int_equal(match(g, "hello, Bob!"), 1);
    assert_int_equal(match(g, "hello, Bob"), 0);
    assert_int_equal(match(g, "hello, bob!"), -1);
    assert_int_equal(match(g, "hello, Bobbbbb!"), -1); /* 6 lower-case letters: over {1,5} */
    assert_int_equal(match(g, "hey"), -1);
    flm_grammar_free(g);
    /* repetitions, negated classes with UTF-8, escapes */
    g = gbnf("root ::= \"<\" [^>]* \">\" x+ y?\nx ::= \"\\x41\" | \"\\u00e9\"\ny ::= [\\n]\n");
    assert_int_equal(match(g, "<>A"), 1);
    assert_int_equal(match(g, "<h\xc3\xa9llo>A\xc3\xa9" "A\n"), 1);
    assert_int_equal(match(g, "<a>"), 0);
    assert_int_equal(match(g, "<\xc3(>A"), -1);    /* a broken UTF-8 sequence inside [^>] */
    assert_int_equal(match(g, "<\xed\xa0\x80>A"), -1); /* a surrogate: not well-formed UTF-8 */
    assert_int_equal(match(g, "<a>AB"), -1);
    flm_grammar_free(g);
}

static void expect_refused(const char *text, flm_status code, const char *words) {
    flm_grammar *g = NULL;
    flm_error err;
    flm_status st = flm_grammar_parse(text, strlen(text), NULL, &g, &err);
    assert_null(g);
    if (st != code || !strstr(err.msg, words))
        fail_msg("grammar '%s': status %d '%s', wanted %d with '%s'", text, st, err.msg, code, words);
}

static void test_gbnf_errors(void **state) {
    (void)state;
    expect_refused("root ::= a\n", FLM_ERR_FORMAT, "'a' is used but not defined");
    expect_refused("start ::= \"x\"\n", FLM_ERR_FORMAT, "no rule 'root'");
    expect_refused("root ::= root \"x\" | \"y\"\n", FLM_ERR_UNSUPPORTED, "left recursion through rule 'root'");
    expect_refused("root ::= a \"x\"\na ::= \"\" | root\n", FLM_ERR_UNSUPPORTED, "left recursion");
    expect_refused("root ::= (\"a\"?)*\n", FLM_ERR_UNSUPPORTED, "left recursion");
    expect_refused("root ::= \"x\n", FLM_ERR_FORMAT, "unterminated string literal");
    expect_refused("root ::= \"x\"\n\nroot ::= \"y\"\n", FLM_ERR_FORMAT, "line 3: rule 'root' defined twice");
    expect_refused("root ::= [\xc3\xa0-\xc3\xbc]\n", FLM_ERR_UNSUPPORTED, "non-ASCII ranges");
    expect_refused("root ::= <[1000]>\n", FLM_ERR_UNSUPPORTED, "token references");
    expect_refused("root ::= \"a\"{5000}\n", FLM_ERR_UNSUPPORTED, "repetition over 4096");
}

/* ---- JSON schemas ---------------------------------------------------------------------------------------------- */

static flm_grammar *schema(const char *s) {
    flm_grammar *g = NULL;
    flm_error err;
    if (flm_grammar_json_schema(s, strlen(s), &g, &err)) fail_msg("schema refused: %s", err.msg);
    return g;
}

static const char *PERSON =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"minLength\":1},"
    "\"age\":{\"type\":\"integer\"},"
    "\"email\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",3]},\"maxItems\":2},"
    "\"pet\":{\"$ref\":\"#/$defs/Pet\"},"
    "\"ok\":{\"type\":\"boolean\"},"
    "\"score\":{\"type\":\"number\"},"
    "\"kind\":{\"const\":\"person\"}},"
    "\"required\":[\"name\",\"age\",\"kind\"],\"additionalProperties\":false,"
    "\"$defs\":{\"Pet\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"friend\":{\"$ref\":\"#/$defs/Pet\"}},\"required\":[\"name\"]}}}";

/* PERSON for generation: the same properties, but a Pet has no recursive friend. Under PERSON a greedy model may nest
 * friends until its token limit (Qwen2.5-Coder-0.5B does at some kernel levels and builds: the JSON stays valid but
 * never ends), which says nothing about the constraint. */
static const char *PERSON_GEN =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"minLength\":1},"
    "\"age\":{\"type\":\"integer\"},"
    "\"email\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",3]},\"maxItems\":2},"
    "\"pet\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"}},\"required\":[\"name\"],"
    "\"additionalProperties\":false},"
    "\"ok\":{\"type\":\"boolean\"},"
    "\"score\":{\"type\":\"number\"},"
    "\"kind\":{\"const\":\"person\"}},"
    "\"required\":[\"name\",\"age\",\"kind\"],\"additionalProperties\":false}";

static void test_schema_accepts_and_refuses(void **state) {
    (void)state;
    flm_grammar *g = schema(PERSON);
    const char *good[] = {
        "{\"name\":\"Al\",\"age\":3,\"kind\":\"person\"}",
        "{ \"name\": \"Al\", \"age\": -30, \"email\": null, \"kind\": \"person\" }",
        "{\"name\":\"\xc3\xa9\\n\\u00e9\",\"age\":0,\"email\":\"a@b\",\"tags\":[\"a\",3],\"pet\":{\"name\":\"Rex\","
        "\"friend\":{\"name\":\"Tom\"}},\"ok\":true,\"score\":1.5e3,\"kind\":\"person\"}",
        "{\n  \"name\": \"x\",\n  \"age\": 1,\n  \"tags\": [],\n  \"kind\": \"person\"\n}",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (match(g, good[i]) != 1) fail_msg("valid JSON refused: %s", good[i]);
    const char *bad[] = {
        "{\"age\":3,\"name\":\"Al\",\"kind\":\"person\"}",   /* declared order only (still valid JSON: see docs) */
        "{\"name\":\"Al\",\"kind\":\"person\"}",             /* age missing */
        "{\"name\":\"\",\"age\":3,\"kind\":\"person\"}",     /* minLength 1 */
        "{\"name\":\"Al\",\"age\":3.5,\"kind\":\"person\"}", /* not an integer */
        "{\"name\":\"Al\",\"age\":03,\"kind\":\"person\"}",  /* a leading zero */
        "{\"name\":\"Al\",\"age\":3,\"tags\":[\"c\"],\"kind\":\"person\"}",
        "{\"name\":\"Al\",\"age\":3,\"tags\":[\"a\",\"a\",\"a\"],\"kind\":\"person\"}", /* maxItems */
        "{\"name\":\"Al\",\"age\":3,\"kind\":\"robot\"}",
        "{\"name\":\"Al\",\"age\":3,\"kind\":\"person\",\"x\":1}", /* additionalProperties false */
        "{\"name\":\"A\x01\",\"age\":3,\"kind\":\"person\"}",        /* a control character in a string */
        "{\"name\":\"Al\",\"age\":3,\"pet\":{},\"kind\":\"person\"}", /* Pet.name required */
        "{\"name\":\"Al\",\"age\":3,\"kind\":\"person\"} ",           /* nothing after the value */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int m = match(g, bad[i]);
        if (m == 1) fail_msg("invalid JSON accepted: %s", bad[i]);
        assert_true(m == -1 || m == 0);
        /* every refused text is also refused by the reference check: cJSON or the schema's rule the comment names */
    }
    flm_grammar_free(g);
    /* json_object: any object */
    g = schema("{\"type\":\"object\"}");
    assert_int_equal(match(g, "{}"), 1);
    assert_int_equal(match(g, "{\"a\": [1, {\"b\": null}], \"c\": \"d\"}"), 1);
    assert_int_equal(match(g, "[1]"), -1);
    assert_int_equal(match(g, "{\"a\" 1}"), -1);
    flm_grammar_free(g);
    /* type lists, maps, min/max items */
    g = schema("{\"type\":[\"array\",\"null\"],\"items\":{\"type\":\"object\",\"additionalProperties\":{\"type\":"
               "\"number\"}},\"minItems\":1}");
    assert_int_equal(match(g, "null"), 1);
    assert_int_equal(match(g, "[{\"x\": 1, \"y\": -2.25}]"), 1);
    assert_int_equal(match(g, "[]"), -1);
    assert_int_equal(match(g, "[{\"x\": \"1\"}]"), -1);
    flm_grammar_free(g);
}

static void expect_schema_refused(const char *s, const char *words) {
    flm_grammar *g = NULL;
    flm_error err;
    flm_status st = flm_grammar_json_schema(s, strlen(s), &g, &err);
    assert_null(g);
    if (st == FLM_OK || !strstr(err.msg, words)) fail_msg("schema %s: '%s', wanted '%s'", s, err.msg, words);
}

static void test_schema_refused(void **state) {
    (void)state;
    expect_schema_refused("{\"type\":\"string\",\"pattern\":\"^a\"}", "keyword 'pattern' is not supported");
    expect_schema_refused("{\"type\":\"string\",\"format\":\"date-time\"}", "keyword 'format' is not supported");
    expect_schema_refused("{\"type\":\"integer\",\"minimum\":0}", "keyword 'minimum' is not supported");
    expect_schema_refused("{\"type\":\"array\",\"prefixItems\":[]}", "keyword 'prefixItems' is not supported");
    expect_schema_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"b\"]}",
                          "required property 'b'");
    expect_schema_refused("{\"$ref\":\"https://x/y.json\"}", "'$ref' https://x/y.json");
    expect_schema_refused("{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":2}]}", "allOf");
    expect_schema_refused("{\"type\":\"strin\"}", "unknown type 'strin'");
    expect_schema_refused("{\"type\":", "not valid JSON");
    /* enum / const beside another constraint: the literals were emitted as given, past it (an "a" for an integer, a
     * 6-letter string under maxLength 2); beside "type" only when every value is of it (pydantic's Literal) */
    expect_schema_refused("{\"type\":\"integer\",\"enum\":[\"a\",\"b\"]}", "not of its 'type'");
    expect_schema_refused("{\"type\":\"string\",\"const\":5}", "not of its 'type'");
    expect_schema_refused("{\"type\":\"string\",\"enum\":[\"abcdef\"],\"maxLength\":2}",
                          "'enum' together with other constraints");
    expect_schema_refused("{\"type\":\"array\",\"maxItems\":1,\"const\":[1,2,3]}",
                          "'const' together with other constraints");
    expect_schema_refused("{\"enum\":[1],\"minLength\":1}", "'enum' together with other constraints");
    char *g = NULL;
    flm_error err = {0};
    static const char *const ok[] = {"{\"type\":\"string\",\"enum\":[\"a\",\"b\"]}",
                                     "{\"type\":[\"integer\",\"null\"],\"enum\":[1,null]}",
                                     "{\"type\":\"integer\",\"const\":2.0}"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        if (flm_json_schema_to_gbnf(ok[i], strlen(ok[i]), NULL, &g, NULL, &err) != FLM_OK)
            fail_msg("%s refused: %s", ok[i], err.msg);
        free(g);
        g = NULL;
    }
}

/* ---- limits on a small thread stack ------------------------------------------------------------------------------
 * Every accepted limit compiles without deep recursion: x{0,4096} (the repetition limit), a JSON schema's maxLength /
 * maxItems 4096, a repetition of a repetition (its start expands through 4096 rules that may match nothing) run on a
 * thread of 256 KiB (libmicrohttpd's connection threads have 1 MiB; a recursion per repetition needed ~3400 frames).
 * Grammars too ambiguous are refused when compiled, naming the keyword where a schema has one. */

typedef struct {
    const char *text;  /* GBNF, or a JSON schema when schema */
    bool schema;
    flm_status st;
    char msg[FLM_ERROR_MSG_MAX];
    int m_ok, m_over;  /* match(): of ok_text, of over_text (2: not run) */
    const char *ok_text, *over_text;
} stack_case;

static void *run_cases(void *arg) {
    for (stack_case *c = arg; c->text; c++) {
        flm_grammar *g = NULL;
        flm_error err = {0};
        c->st = c->schema ? flm_grammar_json_schema(c->text, strlen(c->text), &g, &err)
                          : flm_grammar_parse(c->text, strlen(c->text), NULL, &g, &err);
        snprintf(c->msg, sizeof c->msg, "%s", c->st ? err.msg : "");
        c->m_ok = c->m_over = 2;
        for (int k = 0; g && k < 2; k++) {
            const char *t = k ? c->over_text : c->ok_text;
            if (!t) continue;
            bool complete = false;
            flm_status ms = flm_grammar_match(g, t, strlen(t), &complete, &err);
            *(k ? &c->m_over : &c->m_ok) = ms == FLM_ERR_FORMAT ? -1 : ms ? -2 : complete;
        }
        flm_grammar_free(g);
    }
    return NULL;
}

static char *repeat(const char *pre, char ch, size_t n, const char *post) {
    size_t a = strlen(pre), b = strlen(post);
    char *s = malloc(a + n + b + 1);
    assert_non_null(s);
    memcpy(s, pre, a);
    memset(s + a, ch, n);
    memcpy(s + a + n, post, b + 1);
    return s;
}

static void test_small_stack(void **state) {
    (void)state;
    char *a4096 = repeat("", 'a', 4096, ""), *a4097 = repeat("", 'a', 4097, "");
    char *s4096 = repeat("\"", 'x', 4096, "\""), *s4097 = repeat("\"", 'x', 4097, "\"");
    /* 4096 items [0,0,...] and 4097 */
    char *i4096 = malloc(2 * 4097 + 2), *i4097 = malloc(2 * 4098 + 2);
    assert_true(i4096 && i4097);
    for (int k = 0; k < 2; k++) {
        char *p = k ? i4097 : i4096;
        int n = k ? 4097 : 4096;
        *p++ = '[';
        for (int i = 0; i < n; i++) { *p++ = '0'; *p++ = i + 1 < n ? ',' : ']'; }
        *p = 0;
    }
    /* an enum of 5000 values, an anyOf of 5000 schemas, anyOf 65 of anyOf 65 (4225 at the start), 5000 optional
     * properties */
    char *en = malloc(5000 * 8 + 64), *any = malloc(5000 * 24 + 64), *nest = malloc(101 * 100 * 24 + 200),
         *props = malloc(5000 * 16 + 64);
    assert_true(en && any && nest && props);
    char *p = en + sprintf(en, "{\"enum\":[");
    for (int i = 0; i < 5000; i++) p += sprintf(p, "%s%d", i ? "," : "", i);
    strcpy(p, "]}");
    p = any + sprintf(any, "{\"anyOf\":[");
    for (int i = 0; i < 5000; i++) p += sprintf(p, "%s{\"const\":%d}", i ? "," : "", i);
    strcpy(p, "]}");
    p = nest + sprintf(nest, "{\"anyOf\":[");
    for (int i = 0; i < 65; i++) {
        p += sprintf(p, "%s{\"anyOf\":[", i ? "," : "");
        for (int k = 0; k < 65; k++) p += sprintf(p, "%s{\"const\":%d}", k ? "," : "", i * 100 + k);
        p += sprintf(p, "]}");
    }
    strcpy(p, "]}");
    p = props + sprintf(props, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 5000; i++) p += sprintf(p, "%s\"p%d\":{}", i ? "," : "", i);
    strcpy(p, "}}");
    stack_case cases[] = {
        {.text = "root ::= \"a\"{0,4096}\n", .ok_text = a4096, .over_text = a4097},
        {.text = "root ::= \"a\"{1,4096} \"b\"*\n", .ok_text = a4096, .over_text = a4097},
        {.text = "root ::= (\"a\"{0,4096}){0,4096}\n"}, /* 4096 rules that may match nothing before a byte */
        {.text = "root ::= (\"ab\"{0,4095} \"c\"){0,4096}\n", .ok_text = "abababcc"},
        {.text = "{\"type\":\"string\",\"maxLength\":4096}", .schema = true, .ok_text = s4096, .over_text = s4097},
        {.text = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":4096}", .schema = true,
         .ok_text = i4096, .over_text = i4097},
        {.text = en, .schema = true},
        {.text = any, .schema = true},
        {.text = nest, .schema = true},
        {.text = props, .schema = true},
        {0},
    };
    pthread_attr_t at;
    pthread_t th;
    assert_int_equal(pthread_attr_init(&at), 0);
    assert_int_equal(pthread_attr_setstacksize(&at, (size_t)256 << 10), 0);
    assert_int_equal(pthread_create(&th, &at, run_cases, cases), 0);
    assert_int_equal(pthread_join(th, NULL), 0); /* before the fix: a stack overflow (SIGSEGV) in there */
    pthread_attr_destroy(&at);
    for (int i = 0; i < 2; i++) { /* x{0,4096}, x{1,4096}: 4096 taken, 4097 refused */
        if (cases[i].st) fail_msg("%s: %s", cases[i].text, cases[i].msg);
        assert_int_equal(cases[i].m_ok, 1);
        assert_int_equal(cases[i].m_over, -1);
    }
    assert_int_equal(cases[2].st, FLM_ERR_UNSUPPORTED); /* over 4096 parse stacks at its start: refused, not a crash */
    assert_non_null(strstr(cases[2].msg, "too ambiguous"));
    assert_int_equal(cases[3].st, FLM_OK);
    assert_int_equal(cases[3].m_ok, 1);
    for (int i = 4; i < 6; i++) {
        if (cases[i].st) fail_msg("schema %d: %s", i, cases[i].msg);
        assert_int_equal(cases[i].m_ok, 1);
        assert_int_equal(cases[i].m_over, -1);
    }
    static const char *const named[] = {"'enum' has 5000 values", "'anyOf' has 5000 schemas", "too ambiguous",
                                        "'properties' has 5000 optional properties"};
    for (int i = 6; i < 10; i++) {
        assert_int_equal(cases[i].st, FLM_ERR_UNSUPPORTED);
        if (!strstr(cases[i].msg, named[i - 6])) fail_msg("case %d: '%s', wanted '%s'", i, cases[i].msg, named[i - 6]);
    }
    free(a4096); free(a4097); free(s4096); free(s4097); free(i4096); free(i4097);
    free(en); free(any); free(nest); free(props);
}

/* ---- masks on real vocabularies --------------------------------------------------------------------------------- */

static flm_ctx *open_pulled(const char *name) {
    const char *path = tu_model(name);
    if (!path) return NULL;
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = 512;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(path, &p, &ctx, &err)) fail_msg("%s: %s", name, err.msg);
    return ctx;
}

/* The mask of the state after prefix equals gram_token_ok of each token (a walk of its bytes) and, for the state
 * inside an object before a key, an independent predicate on the token's text. */
static void check_masks(flm_ctx *ctx) {
    gvocab *v = NULL;
    flm_error err;
    assert_int_equal(gvocab_build(ctx, &v, &err), FLM_OK);
    flm_grammar *g = schema(PERSON);
    const char *prefixes[] = {"", "{", "{\"name\": \"A", "{\"name\": \"Al\", \"age\": 1", "{\"name\":\"A\",\"age\":1,"
                              "\"kind\":\"person\"", "{\"name\":\"A\",\"age\":1,\"kind\":\"person\"}"};
    uint32_t n = tu_vocab(ctx), nv = flm_vocab_size(ctx);
    for (size_t k = 0; k < sizeof prefixes / sizeof *prefixes; k++) {
        int32_t st;
        assert_int_equal(gram_start(g, &st, &err), FLM_OK);
        st = gram_advance(g, st, prefixes[k], strlen(prefixes[k]), &err);
        assert_true(st >= 0);
        const uint32_t *m = gram_mask(g, v, st, &err);
        assert_non_null(m);
        size_t n_allowed = 0;
        for (uint32_t id = 0; id < n; id++) {
            bool bit = m[id >> 5] >> (id & 31) & 1;
            int ok = id < nv ? gram_token_ok(g, v, st, (int32_t)id, &err) : 0;
            if (bit != (ok == 1)) fail_msg("prefix '%s' token %u: mask %d, walk %d", prefixes[k], id, bit, ok);
            n_allowed += bit;
            size_t len;
            const char *p = flm_token_piece(ctx, -1, (int32_t)id, &len);
            if (k == 0 && bit) /* the value starts: '{' or whitespace first */
                assert_true(flm_token_is_eog(ctx, (int32_t)id) ? false : (p[0] == '{' || p[0] == ' ' || p[0] == '\n'));
            if (k == 1 && id < nv && !flm_token_is_eog(ctx, (int32_t)id) && len > 0) {
                /* after '{': whitespace, then the first key "name" (required): the text must be a prefix of
                 * [ws]"name" followed by ws or ':' etc.; check the simple cases independently */
                if (len == 1 && p[0] == '"') assert_true(bit);
                if (len == 1 && p[0] == '}') assert_false(bit); /* name, age, kind are required */
                if (len >= 6 && !memcmp(p, "\"name\"", 6) && len == 6) assert_true(bit);
                if (len >= 5 && !memcmp(p, "\"age\"", 5)) assert_false(bit); /* the declared order */
            }
        }
        if (k == 5) { /* complete: only the end-of-generation tokens */
            assert_int_equal(gram_complete(g, st, &err), 1);
            for (uint32_t id = 0; id < n; id++)
                if (m[id >> 5] >> (id & 31) & 1) assert_true(flm_token_is_eog(ctx, (int32_t)id));
        } else {
            assert_int_equal(gram_complete(g, st, &err), 0);
        }
        assert_true(n_allowed > 0);
    }
    flm_grammar_free(g);
    gvocab_free(v);
}

static void test_masks_real_vocab(void **state) {
    (void)state;
    const char *names[] = {"smollm2-135m", "qwen2.5-coder-0.5b"};
    int done = 0;
    for (int i = 0; i < 2; i++) {
        flm_ctx *ctx = open_pulled(names[i]);
        if (!ctx) continue;
        check_masks(ctx);
        flm_close(ctx);
        done++;
    }
    if (!done) skip();
}

/* ---- generation -------------------------------------------------------------------------------------------------- */

typedef struct {
    char text[8192];
    size_t len;
} sink;

static bool on_tok(void *user, const flm_gen_token *t) {
    sink *k = user;
    assert_true(k->len + t->len < sizeof k->text);
    memcpy(k->text + k->len, t->text, t->len);
    k->len += t->len;
    k->text[k->len] = 0;
    return true;
}

/* The generated object validates against PERSON by hand: required keys with their types, nothing else. */
static void validate_person(const char *text) {
    cJSON *o = cJSON_Parse(text);
    if (!o) fail_msg("not JSON: %s", text);
    assert_true(cJSON_IsObject(o));
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name"), *age = cJSON_GetObjectItemCaseSensitive(o, "age"),
                *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
    assert_true(cJSON_IsString(name) && strlen(name->valuestring) >= 1);
    assert_true(cJSON_IsNumber(age) && age->valuedouble == floor(age->valuedouble));
    assert_true(cJSON_IsString(kind) && !strcmp(kind->valuestring, "person"));
    const cJSON *it;
    const char *allowed[] = {"name", "age", "email", "tags", "pet", "ok", "score", "kind"};
    cJSON_ArrayForEach(it, o) {
        bool found = false;
        for (int i = 0; i < 8; i++) found |= !strcmp(it->string, allowed[i]);
        if (!found) fail_msg("key %s not in the schema: %s", it->string, text);
    }
    cJSON_Delete(o);
}

static void generate(flm_ctx *ctx, bool speculative, sink *out, flm_gen_result *r) {
    flm_session *s = NULL;
    flm_error err;
    assert_int_equal(flm_session_create(ctx, &s, &err), FLM_OK);
    if (speculative) {
        flm_spec_params sp;
        flm_spec_params_default(&sp);
        sp.ngram = true;
        if (flm_session_speculate(s, &sp, NULL, &err)) fail_msg("%s", err.msg);
    }
    flm_chat *t = NULL;
    assert_int_equal(flm_chat_open(ctx, NULL, &t, &err), FLM_OK);
    flm_chat_msg m[] = {{.role = "user", .content = "Describe a person called Ann, 31 years old, as JSON."}};
    assert_int_equal(flm_session_prompt_chat(s, t, m, 1, NULL, &err), FLM_OK);
    flm_grammar *g = schema(PERSON_GEN);
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = 200;
    gp.grammar = g;
    memset(out, 0, sizeof *out);
    if (flm_session_generate(s, &gp, on_tok, out, r, &err)) fail_msg("%s", err.msg);
    flm_grammar_free(g);
    flm_chat_close(t);
    flm_session_free(s);
}

static void test_generate_under_schema(void **state) {
    (void)state;
    flm_ctx *ctx = open_pulled("qwen2.5-coder-0.5b");
    if (!ctx) ctx = open_pulled("smollm2-135m");
    if (!ctx) skip();
    sink a, b;
    flm_gen_result ra, rb;
    generate(ctx, false, &a, &ra);
    print_message("greedy under the schema (%ld tokens): %s\n", ra.n_gen, a.text);
    assert_true(ra.complete || ra.eog);
    validate_person(a.text);
    generate(ctx, true, &b, &rb);
    assert_string_equal(a.text, b.text); /* greedy speculative decoding under the grammar: the same text */
    assert_int_equal(ra.n_gen, rb.n_gen);
    flm_close(ctx);
}

/* An object schema with an empty 'properties' has no members (docs/STRUCTURED.md: without additionalProperties or
 * with it true, only the declared ones; it was a map of any keys, and a tool without parameters got made-up
 * arguments); additionalProperties as a schema keeps the map. */
static void test_empty_properties(void **state) {
    (void)state;
    flm_grammar *g = schema("{\"type\":\"object\",\"properties\":{}}");
    assert_int_equal(match(g, "{}"), 1);
    assert_int_equal(match(g, "{ }"), 1);
    assert_int_equal(match(g, "{\"a\": 1}"), -1);
    flm_grammar_free(g);
    g = schema("{\"type\":\"object\",\"properties\":{},\"additionalProperties\":true}");
    assert_int_equal(match(g, "{\"a\": 1}"), -1);
    flm_grammar_free(g);
    g = schema("{\"type\":\"object\",\"properties\":{},\"additionalProperties\":{\"type\":\"integer\"}}");
    assert_int_equal(match(g, "{\"a\": 1}"), 1);
    assert_int_equal(match(g, "{\"a\": \"x\"}"), -1);
    flm_grammar_free(g);
    g = schema("{\"type\":\"object\"}"); /* no 'properties': a map of any keys, as before */
    assert_int_equal(match(g, "{\"a\": [1]}"), 1);
    flm_grammar_free(g);
}

/* flm_gen_params.utf8_whole: text released in whole characters; a character the generation ends inside (max_tokens
 * cut between two of its byte tokens) is released as U+FFFD per byte, never as the raw bytes (a JSON body must be
 * UTF-8, RFC 8259 section 8.1). stories260K's SentencePiece vocabulary spells the parrot (U+1F99C, F0 9F A6 9C) in
 * four byte tokens; the grammar forces them. */
typedef struct bytes_sink {
    char text[256];
    size_t len;
} bytes_sink;

static bool on_bytes(void *user, const flm_gen_token *t) {
    bytes_sink *b = user;
    if (b->len + t->len < sizeof b->text) {
        memcpy(b->text + b->len, t->text, t->len);
        b->len += t->len;
    }
    return true;
}

static void test_utf8_whole_at_the_end(void **state) {
    (void)state;
    flm_params p;
    flm_params_default(&p);
    p.n_threads = 1;
    p.n_ctx = 64;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(tu_data("models/stories260K/stories260K.gguf"), &p, &ctx, &err)) fail_msg("%s", err.msg);
    static const char parrot[] = "\xF0\x9F\xA6\x9C";
    char text[64];
    snprintf(text, sizeof text, "root ::= \"A%s%s\"", parrot, parrot);
    flm_grammar *g = gbnf(text);
    /* max_tokens: how many tokens the forced text takes, and where each cut falls; found by generating it whole */
    const long cuts[] = {2, 3, 4, 5, 6, 64};
    for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
        flm_session *s = NULL;
        assert_int_equal(flm_session_create(ctx, &s, &err), FLM_OK);
        int32_t ids[8];
        size_t n_ids = flm_tokenize(ctx, "Once", true, ids, 8);
        assert_true(n_ids > 0 && n_ids <= 8);
        if (flm_session_prompt(s, ids, n_ids, NULL, &err)) fail_msg("%s", err.msg);
        flm_gen_params gp;
        flm_gen_params_default(&gp);
        gp.max_tokens = cuts[c];
        gp.grammar = g;
        gp.utf8_whole = true;
        bytes_sink b = {{0}, 0};
        flm_gen_result r;
        if (flm_session_generate(s, &gp, on_bytes, &b, &r, &err)) fail_msg("%s", err.msg);
        b.text[b.len] = 0;
        /* the bytes are UTF-8 (an independent check: every lead byte has its continuation bytes) */
        for (size_t i = 0; i < b.len;) {
            unsigned char ch = (unsigned char)b.text[i];
            size_t k = ch < 0x80 ? 1 : (ch >> 5) == 6 ? 2 : (ch >> 4) == 14 ? 3 : (ch >> 3) == 30 ? 4 : 0;
            if (!k || i + k > b.len) fail_msg("cut %ld: byte %zu (0x%02x) of %zu is not UTF-8", cuts[c], i, ch, b.len);
            for (size_t j = 1; j < k; j++)
                if (((unsigned char)b.text[i + j] >> 6) != 2) fail_msg("cut %ld: byte %zu is not UTF-8", cuts[c], i + j);
            i += k;
        }
        /* what it says: the whole parrots given, each cut-off byte a U+FFFD */
        char want[128];
        size_t wl = 0;
        want[wl++] = 'A';
        long toks = r.n_gen - (r.eog ? 1 : 0) - 1; /* byte tokens after "A" (one token in this vocabulary) */
        for (long k = 0; k + 4 <= toks && k < 8; k += 4) { memcpy(want + wl, parrot, 4); wl += 4; }
        for (long k = 0; k < toks % 4 && toks < 8; k++) { memcpy(want + wl, "\xEF\xBF\xBD", 3); wl += 3; }
        want[wl] = 0;
        if (b.len != wl || memcmp(b.text, want, wl))
            fail_msg("cut %ld (%ld tokens): got '%s', wanted '%s'", cuts[c], r.n_gen, b.text, want);
        flm_session_free(s);
    }
    flm_grammar_free(g);
    flm_close(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_basics),
        cmocka_unit_test(test_gbnf_errors),
        cmocka_unit_test(test_schema_accepts_and_refuses),
        cmocka_unit_test(test_schema_refused),
        cmocka_unit_test(test_small_stack),
        cmocka_unit_test(test_masks_real_vocab),
        cmocka_unit_test(test_generate_under_schema),
        cmocka_unit_test(test_utf8_whole_at_the_end),
        cmocka_unit_test(test_empty_properties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
