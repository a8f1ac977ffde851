/* serve_req.c — parse an OpenAI chat or text completion request (JSON, with cJSON) into a serve_req, checking every
 * field's type and range (tools/serve.h). Nothing here trusts the body: lengths come from the caller, cJSON parses
 * with that length, and every string is copied. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"

void serve_req_free(serve_req *r) {
    if (!r) return;
    free(r->model);
    for (size_t i = 0; i < r->n_msgs; i++) {
        free((char *)r->msgs[i].role);
        free((char *)r->msgs[i].content);
    }
    free(r->msgs);
    free(r->prompt);
    free(r->bias);
    for (size_t i = 0; i < r->n_bias_text; i++) free(r->bias_text[i]);
    free(r->bias_text);
    free(r->bias_text_val);
    for (int i = 0; i < r->n_fields; i++) free(r->fields[i]);
    free(r->fields);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    flm_grammar_free(r->grammar);
    if (r->tool_calls)
        for (size_t i = 0; i < r->n_msgs; i++) free(r->tool_calls[i]);
    free(r->tool_calls);
    free(r->tools);
    free(r->tool_name);
    memset(r, 0, sizeof *r);
}

static char *dup_str(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

/* A message's content: a string, or an array of parts {"type": "text", "text": "..."} joined with a newline between
 * the non-empty text so far and the next part, as llama.cpp's chat code joins them (other parts refused), or null (an
 * empty string). NULL with msg set on error. */
static char *content_text(const cJSON *c, size_t i, char *msg, size_t cap, int *status) {
    if (!c || cJSON_IsNull(c)) return dup_str(""); /* null, or absent beside tool_calls */
    if (cJSON_IsString(c)) return dup_str(c->valuestring);
    if (!cJSON_IsArray(c)) {
        snprintf(msg, cap, "messages[%zu].content must be a string or an array of text parts", i);
        *status = 400;
        return NULL;
    }
    size_t total = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
            !cJSON_IsString(text)) {
            snprintf(msg, cap, "messages[%zu].content: only parts {\"type\": \"text\", \"text\": string} are supported", i);
            *status = 400;
            return NULL;
        }
        total += strlen(text->valuestring) + 1;
    }
    char *out = malloc(total + 1);
    if (!out) return NULL;
    size_t at = 0;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(t);
        if (at > 0) out[at++] = '\n';
        memcpy(out + at, t, n);
        at += n;
    }
    out[at] = 0;
    return out;
}

/* A number field in [lo, hi]: 1 when present and valid (*out set), 0 when absent or null, -1 after setting msg. */
static int get_number(const cJSON *root, const char *name, double lo, double hi, bool integer, double *out, char *msg,
                      size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi ||
        (integer && v->valuedouble != floor(v->valuedouble))) {
        if (integer) /* %g would write 16777216 as 1.67772e+07 */
            snprintf(msg, cap, "'%s' must be an integer between %.0f and %.0f", name, lo, hi);
        else
            snprintf(msg, cap, "'%s' must be a number between %g and %g", name, lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    return 1;
}

/* The field of a valid JSON body[0, len) whose string holds an escaped NUL ("\u0000"), as a path ("messages[1].content",
 * "stop[0]", "prompt") in path[cap]; false when there is none. cJSON would hand such a string over cut at the NUL,
 * the rest dropped without a word. A key with one is named by its object's path and "(a key)". */
static bool nul_field(const char *b, size_t len, char *path, size_t cap) {
    enum { DEPTH = 32 };
    struct frame { bool obj, want_key; size_t index; char key[48]; } st[DEPTH];
    int depth = 0; /* frames st[0 .. depth), deeper ones counted only */
    int deep = 0;
    for (size_t i = 0; i < len; i++) {
        char c = b[i];
        if (c == '{' || c == '[') {
            if (depth < DEPTH) st[depth++] = (struct frame){c == '{', c == '{', 0, ""};
            else deep++;
        } else if (c == '}' || c == ']') {
            if (deep) deep--;
            else if (depth) depth--;
        } else if (c == ',' && depth && !deep) {
            if (st[depth - 1].obj) st[depth - 1].want_key = true;
            else st[depth - 1].index++;
        } else if (c == '"') {
            const bool is_key = depth && !deep && st[depth - 1].obj && st[depth - 1].want_key;
            size_t k = 0;
            bool nul = false;
            for (i++; i < len && b[i] != '"'; i++) {
                if (b[i] == '\\' && i + 1 < len) {
                    if (b[i + 1] == 'u' && i + 5 < len && !memcmp(b + i + 2, "0000", 4)) nul = true;
                    if (is_key && k + 1 < sizeof st[0].key) st[depth - 1].key[k++] = '\\'; /* shown as written */
                    i++;
                    if (is_key && k + 1 < sizeof st[0].key) st[depth - 1].key[k++] = b[i];
                } else if (is_key && k + 1 < sizeof st[0].key) st[depth - 1].key[k++] = b[i];
            }
            if (is_key) {
                st[depth - 1].key[k] = 0;
                st[depth - 1].want_key = false;
            }
            if (nul) {
                size_t n = 0;
                path[0] = 0;
                for (int d = 0; d < depth && n < cap; d++) {
                    if (st[d].obj) n += (size_t)snprintf(path + n, cap - n, "%s%s", n ? "." : "", st[d].key);
                    else n += (size_t)snprintf(path + n, cap - n, "[%zu]", st[d].index);
                }
                if (is_key && n < cap) snprintf(path + n, cap - n, " (a key)");
                if (!path[0]) snprintf(path, cap, "the body");
                return true;
            }
        }
    }
    return false;
}

/* The output constraint: "response_format" (OpenAI's {"type": "text" | "json_object" | "json_schema"}, the last with
 * "json_schema": {"name", "description", "schema", "strict"}; llama-server's "schema" beside "type" too), or
 * llama-server's "json_schema" (a schema) or "grammar" (GBNF text); at most one of them. The schema or grammar is
 * compiled here (a keyword the library does not support: 400 naming it). 0, or an HTTP status with msg set. */
static int parse_constraint(const cJSON *root, serve_req *r, char *msg, size_t cap) {
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(root, "json_schema");
    const cJSON *gr = cJSON_GetObjectItemCaseSensitive(root, "grammar");
    const cJSON *schema = NULL;
    const char *from = NULL, *gbnf = NULL;
    bool any_object = false;
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(type)) {
            snprintf(msg, cap, "'response_format' must be an object {\"type\": \"text\" | \"json_object\" | "
                     "\"json_schema\"}");
            return 400;
        }
        static const char *const RF[] = {"type", "json_schema", "schema"};
        if (!serve_fields_known(rf, RF, 3, "'response_format'", msg, cap)) return 400;
        const char *t = type->valuestring;
        if (!strcmp(t, "json_object")) {
            from = "response_format";
            schema = cJSON_GetObjectItemCaseSensitive(rf, "schema"); /* llama-server's: a schema beside the type */
            if (cJSON_IsNull(schema)) schema = NULL;
            any_object = !schema;
        } else if (!strcmp(t, "json_schema")) {
            from = "response_format.json_schema.schema";
            const cJSON *o = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
            if (!o) { /* llama-server's older form: {"type": "json_schema", "schema": {...}} */
                schema = cJSON_GetObjectItemCaseSensitive(rf, "schema");
                from = "response_format.schema";
            } else {
                if (!cJSON_IsObject(o)) {
                    snprintf(msg, cap, "'response_format.json_schema' must be an object {\"name\", \"schema\", "
                             "\"strict\"}");
                    return 400;
                }
                static const char *const JS[] = {"name", "description", "schema", "strict"};
                if (!serve_fields_known(o, JS, 4, "'response_format.json_schema'", msg, cap)) return 400;
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
                const cJSON *strict = cJSON_GetObjectItemCaseSensitive(o, "strict");
                const cJSON *desc = cJSON_GetObjectItemCaseSensitive(o, "description");
                if ((name && !cJSON_IsString(name)) || (desc && !cJSON_IsString(desc) && !cJSON_IsNull(desc)) ||
                    (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))) {
                    snprintf(msg, cap, "'response_format.json_schema': 'name' and 'description' must be strings, "
                             "'strict' a boolean");
                    return 400;
                }
                schema = cJSON_GetObjectItemCaseSensitive(o, "schema");
            }
            if (!cJSON_IsObject(schema)) {
                snprintf(msg, cap, "'%s' must be a JSON schema (an object)", from);
                return 400;
            }
        } else if (strcmp(t, "text")) {
            snprintf(msg, cap, "'response_format.type' must be text, json_object or json_schema, not '%.40s'", t);
            return 400;
        }
    }
    if (js && !cJSON_IsNull(js)) {
        if (from) { snprintf(msg, cap, "'json_schema' and '%s' both constrain the output: give one", from); return 400; }
        if (!cJSON_IsObject(js)) { snprintf(msg, cap, "'json_schema' must be a JSON schema (an object)"); return 400; }
        schema = js;
        from = "json_schema";
    }
    if (gr && !cJSON_IsNull(gr)) {
        if (from) { snprintf(msg, cap, "'grammar' and '%s' both constrain the output: give one", from); return 400; }
        if (!cJSON_IsString(gr)) { snprintf(msg, cap, "'grammar' must be a string (GBNF)"); return 400; }
        gbnf = gr->valuestring;
        from = "grammar";
    }
    if (!from) return 0;
    flm_error err;
    flm_status st;
    if (gbnf) {
        st = flm_grammar_parse(gbnf, strlen(gbnf), NULL, &r->grammar, &err);
    } else {
        char *text = any_object ? NULL : cJSON_PrintUnformatted(schema);
        if (!any_object && !text) { snprintf(msg, cap, "out of memory parsing the request"); return 500; }
        static const char OBJECT[] = "{\"type\": \"object\"}"; /* json_object: any JSON object */
        st = flm_grammar_json_schema(text ? text : OBJECT, text ? strlen(text) : sizeof OBJECT - 1, &r->grammar, &err);
        free(text);
    }
    if (st == FLM_ERR_NOMEM) { snprintf(msg, cap, "out of memory compiling '%s'", from); return 500; }
    if (st) { snprintf(msg, cap, "'%s': %s", from, err.msg); return 400; }
    r->grammar_from = from;
    return 0;
}

/* Every top-level field a completion request may carry, and what becomes of it: a field not in this table is
 * refused with a 400 naming it, so that nothing a client asks for is dropped without a word (docs/SERVE.md, "Request
 * fields"). FIELD_PARSED: read and checked by serve_parse_request / serve_parse_tools. FIELD_INERT: accepted, with no
 * effect on the reply by its definition (identifiers for the caller's own records, hints). FIELD_NEUTRAL: a sampler
 * of llama-server's that flashlm does not have, accepted only at the value that turns it off (what its front ends send
 * by default), refused otherwise. FIELD_WITH: a setting of such a sampler, with no effect while it is off.
 * FIELD_REFUSED: refused whenever present and not null (why). */
enum { FIELD_PARSED, FIELD_INERT, FIELD_NEUTRAL, FIELD_NEUTRAL_FALSE, FIELD_WITH, FIELD_REFUSED };
typedef struct field_rule {
    const char *name;
    int kind;
    double off;       /* FIELD_NEUTRAL: the value that turns the sampler off */
    const char *why;  /* FIELD_REFUSED / FIELD_NEUTRAL: the reason given */
} field_rule;

static const field_rule FIELD_RULES[] = {
    /* OpenAI's chat and text completions, honoured (parsed below) */
    {"model", FIELD_PARSED, 0, NULL}, {"messages", FIELD_PARSED, 0, NULL}, {"prompt", FIELD_PARSED, 0, NULL},
    {"stream", FIELD_PARSED, 0, NULL}, {"stream_options", FIELD_PARSED, 0, NULL}, {"n", FIELD_PARSED, 0, NULL},
    {"temperature", FIELD_PARSED, 0, NULL}, {"top_p", FIELD_PARSED, 0, NULL}, {"seed", FIELD_PARSED, 0, NULL},
    {"max_tokens", FIELD_PARSED, 0, NULL}, {"max_completion_tokens", FIELD_PARSED, 0, NULL},
    {"stop", FIELD_PARSED, 0, NULL}, {"presence_penalty", FIELD_PARSED, 0, NULL},
    {"frequency_penalty", FIELD_PARSED, 0, NULL}, {"logit_bias", FIELD_PARSED, 0, NULL},
    {"logprobs", FIELD_PARSED, 0, NULL}, {"top_logprobs", FIELD_PARSED, 0, NULL},
    {"response_format", FIELD_PARSED, 0, NULL}, {"tools", FIELD_PARSED, 0, NULL}, {"tool_choice", FIELD_PARSED, 0, NULL},
    {"parallel_tool_calls", FIELD_PARSED, 0, NULL}, {"functions", FIELD_PARSED, 0, NULL},
    {"function_call", FIELD_PARSED, 0, NULL}, {"echo", FIELD_NEUTRAL_FALSE, 0,
        "'echo' (the prompt repeated before the completion) is not supported: the prompt is the caller's own"},
    {"best_of", FIELD_NEUTRAL, 1, "'best_of' above 1 is not supported: ask for 'n' choices"},
    {"suffix", FIELD_REFUSED, 0, "'suffix' (insertion between a prompt and a suffix) is not supported"},
    /* OpenAI's, with no effect on the reply: the caller's identifiers and hints */
    {"user", FIELD_INERT, 0, NULL}, {"metadata", FIELD_INERT, 0, NULL}, {"prompt_cache_key", FIELD_INERT, 0, NULL},
    {"safety_identifier", FIELD_INERT, 0, NULL}, {"service_tier", FIELD_INERT, 0, NULL},
    {"prediction", FIELD_INERT, 0, NULL}, {"store", FIELD_NEUTRAL_FALSE, 0,
        "'store': true is not supported: this server keeps no completions"},
    {"modalities", FIELD_PARSED, 0, NULL},
    {"audio", FIELD_REFUSED, 0, "'audio' is not supported: the model answers in text only"},
    {"web_search_options", FIELD_REFUSED, 0, "'web_search_options' is not supported: the model has no web search"},
    {"reasoning_effort", FIELD_REFUSED, 0, "'reasoning_effort' is not supported: the model has no reasoning setting"},
    {"verbosity", FIELD_REFUSED, 0, "'verbosity' is not supported: the model has no verbosity setting"},
    /* llama-server's, honoured */
    {"n_predict", FIELD_PARSED, 0, NULL}, {"top_k", FIELD_PARSED, 0, NULL}, {"min_p", FIELD_PARSED, 0, NULL},
    {"repeat_penalty", FIELD_PARSED, 0, NULL}, {"repeat_last_n", FIELD_PARSED, 0, NULL},
    {"n_probs", FIELD_PARSED, 0, NULL}, {"cache_prompt", FIELD_PARSED, 0, NULL},
    {"return_tokens", FIELD_PARSED, 0, NULL}, {"verbose", FIELD_PARSED, 0, NULL},
    {"response_fields", FIELD_PARSED, 0, NULL}, {"return_progress", FIELD_PARSED, 0, NULL},
    {"post_sampling_probs", FIELD_PARSED, 0, NULL}, {"backend_sampling", FIELD_PARSED, 0, NULL},
    {"json_schema", FIELD_PARSED, 0, NULL}, {"grammar", FIELD_PARSED, 0, NULL},
    {"add_generation_prompt", FIELD_PARSED, 0, NULL}, {"continue_final_message", FIELD_PARSED, 0, NULL},
    {"timings_per_token", FIELD_PARSED, 0, NULL}, {"id_slot", FIELD_PARSED, 0, NULL},
    /* llama-server's samplers that flashlm does not have: only their "off" value */
    {"typical_p", FIELD_NEUTRAL, 1, "'typical_p' below 1 (locally typical sampling) is not supported"},
    {"mirostat", FIELD_NEUTRAL, 0, "'mirostat' is not supported"},
    {"dry_multiplier", FIELD_NEUTRAL, 0, "'dry_multiplier' (DRY repetition penalty) is not supported: use "
        "'repeat_penalty' or 'presence_penalty'"},
    {"xtc_probability", FIELD_NEUTRAL, 0, "'xtc_probability' (XTC sampling) is not supported"},
    {"dynatemp_range", FIELD_NEUTRAL, 0, "'dynatemp_range' (dynamic temperature) is not supported"},
    {"top_n_sigma", FIELD_NEUTRAL, -1, "'top_n_sigma' is not supported"},
    {"ignore_eos", FIELD_NEUTRAL_FALSE, 0, "'ignore_eos' is not supported: generation ends at the model's "
        "end-of-generation token"},
    {"mirostat_tau", FIELD_WITH, 0, NULL}, {"mirostat_eta", FIELD_WITH, 0, NULL}, {"dry_base", FIELD_WITH, 0, NULL},
    {"dry_allowed_length", FIELD_WITH, 0, NULL}, {"dry_penalty_last_n", FIELD_WITH, 0, NULL},
    {"dry_sequence_breakers", FIELD_WITH, 0, NULL}, {"xtc_threshold", FIELD_WITH, 0, NULL},
    {"dynatemp_exponent", FIELD_WITH, 0, NULL}, {"min_keep", FIELD_WITH, 0, NULL},
};

/* 0 when every top-level field of root is in FIELD_RULES and allowed at its value; else 400 with msg naming it. */
static int check_fields(const cJSON *root, char *msg, size_t cap) {
    const cJSON *f;
    cJSON_ArrayForEach(f, root) {
        for (const cJSON *g = root->child; g != f; g = g->next) /* cJSON keeps both; the lookups see the first */
            if (f->string && g->string && !strcmp(f->string, g->string)) {
                snprintf(msg, cap, "the field '%.64s' is given twice: one value would be dropped", f->string);
                return 400;
            }
        const field_rule *rule = NULL;
        for (size_t i = 0; i < sizeof FIELD_RULES / sizeof *FIELD_RULES && f->string; i++)
            if (!strcmp(FIELD_RULES[i].name, f->string)) { rule = &FIELD_RULES[i]; break; }
        if (!rule) {
            snprintf(msg, cap, "unknown field '%.64s': this server honours or refuses every field by name, and does "
                     "not know this one (docs/SERVE.md lists the fields; leave it out)", f->string ? f->string : "");
            return 400;
        }
        if (cJSON_IsNull(f)) continue;
        switch (rule->kind) {
        case FIELD_REFUSED: snprintf(msg, cap, "%s", rule->why); return 400;
        case FIELD_NEUTRAL:
            if (!cJSON_IsNumber(f) || f->valuedouble != rule->off) {
                snprintf(msg, cap, "%s (only %g, which turns it off, is accepted)", rule->why, rule->off);
                return 400;
            }
            break;
        case FIELD_NEUTRAL_FALSE:
            if (!cJSON_IsFalse(f)) { snprintf(msg, cap, "%s (only false is accepted)", rule->why); return 400; }
            break;
        case FIELD_INERT: /* no effect, but of OpenAI's type: a wrong one is a client's mistake to say */
            if (!strcmp(f->string, "metadata") || !strcmp(f->string, "prediction") ? !cJSON_IsObject(f)
                                                                                     : !cJSON_IsString(f)) {
                snprintf(msg, cap, "'%s' must be %s", f->string,
                         !strcmp(f->string, "metadata") || !strcmp(f->string, "prediction") ? "an object" : "a string");
                return 400;
            }
            break;
        default: break;
        }
    }
    return 0;
}

bool serve_fields_known(const struct cJSON *o, const char *const *known, size_t n_known, const char *route, char *msg,
                        size_t cap) {
    const cJSON *f;
    cJSON_ArrayForEach(f, o) {
        for (const cJSON *g = o->child; g != f; g = g->next)
            if (f->string && g->string && !strcmp(f->string, g->string)) {
                snprintf(msg, cap, "the field '%.64s' is given twice in %s: one value would be dropped", f->string,
                         route);
                return false;
            }
        size_t i = 0;
        while (i < n_known && f->string && strcmp(known[i], f->string)) i++;
        if (i == n_known) {
            snprintf(msg, cap, "unknown field '%.64s' for %s: it takes only the fields docs/SERVE.md lists for it",
                     f->string ? f->string : "", route);
            return false;
        }
    }
    return true;
}

/* What cJSON takes but RFC 8259 does not: a control character (U+0000..U+001F) unescaped inside a string (section
 * 7: "MUST be escaped"; a raw NUL would cut the string where cJSON stops), and numbers outside section 6's grammar
 * (a leading zero, a '+', a '.' without digits on both sides, an exponent without digits: cJSON hands them to strtod).
 * Returns false with *at (a byte offset) and *why; the rest of the grammar is cJSON's to check. */
static bool json_strict(const char *b, size_t len, size_t *at, const char **why) {
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        const unsigned char c = (unsigned char)b[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = false;
            else if (c < 0x20) {
                *at = i;
                *why = "a control character inside a string must be escaped (\\n, \\u0000, ...)";
                return false;
            }
            continue;
        }
        if (c == '"') { in_str = true; continue; }
        if (c == '+' || c == '.') { *at = i; *why = "a number must start with a digit or '-'"; return false; }
        if (c != '-' && (c < '0' || c > '9')) continue;
        size_t j = i + (c == '-');
        const size_t start = i;
        bool ok = j < len && b[j] >= '0' && b[j] <= '9';
        if (ok && b[j] == '0') j++;
        else while (ok && j < len && b[j] >= '0' && b[j] <= '9') j++;
        if (ok && j < len && b[j] == '.') {
            j++;
            ok = j < len && b[j] >= '0' && b[j] <= '9';
            while (ok && j < len && b[j] >= '0' && b[j] <= '9') j++;
        }
        if (ok && j < len && (b[j] == 'e' || b[j] == 'E')) {
            j++;
            if (j < len && (b[j] == '+' || b[j] == '-')) j++;
            ok = j < len && b[j] >= '0' && b[j] <= '9';
            while (ok && j < len && b[j] >= '0' && b[j] <= '9') j++;
        }
        if (ok && j < len && ((b[j] >= '0' && b[j] <= '9') || b[j] == '.' || b[j] == '+' || b[j] == '-' ||
                              b[j] == 'e' || b[j] == 'E'))
            ok = false; /* "03", "1.2.3", "1e5e5" */
        if (!ok) {
            *at = start;
            *why = "a number outside JSON's grammar (no leading zeros or '+'; digits on both sides of '.' and after "
                   "'e')";
            return false;
        }
        i = j - 1;
    }
    return true;
}

cJSON *serve_parse_json(const char *body, size_t len, char *msg, size_t cap) {
    const size_t bad = flm_utf8_check(body, len); /* UTF-8 (RFC 8259 section 8.1): well-formed */
    if (bad != SIZE_MAX) {
        snprintf(msg, cap, "the body is not valid UTF-8 (byte %zu: 0x%02X)", bad, (unsigned char)body[bad]);
        return NULL;
    }
    size_t at;
    const char *why;
    if (!json_strict(body, len, &at, &why)) {
        snprintf(msg, cap, "the body is not valid JSON (byte %zu: %s)", at, why);
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) { /* where, and why when it is cJSON's nesting limit (a valid body can pass it) */
        /* cJSON sets the parse end to where it failed (its global error pointer is not per thread) */
        const size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : len;
        size_t depth = 0, most = 0;
        bool in_str = false, esc = false;
        for (size_t i = 0; i < at && i < len; i++) {
            const char ch = body[i];
            if (in_str) {
                if (esc) esc = false;
                else if (ch == '\\') esc = true;
                else if (ch == '"') in_str = false;
            } else if (ch == '"') in_str = true;
            else if (ch == '[' || ch == '{') { if (++depth > most) most = depth; }
            else if ((ch == ']' || ch == '}') && depth) depth--;
        }
        if (most >= CJSON_NESTING_LIMIT)
            snprintf(msg, cap, "the body nests arrays and objects deeper than %d levels (byte %zu)",
                     (int)CJSON_NESTING_LIMIT, at);
        else
            snprintf(msg, cap, "the body is not valid JSON (byte %zu)", at);
        return NULL;
    }
    for (const char *p = end; p && p < body + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            snprintf(msg, cap, "the body is not valid JSON: text after its value (byte %zu)", (size_t)(p - body));
            cJSON_Delete(root);
            return NULL;
        }
    return root;
}

bool serve_verbose_default;

int serve_parse_request(const char *body, size_t len, bool chat, serve_req *r, char *msg, size_t cap) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->top_k = -1;
    r->max_tokens = -1;
    msg[0] = 0;
    int status = 400;
    cJSON *root = serve_parse_json(body, len, msg, cap);
    if (!root) return 400;
    if (!cJSON_IsObject(root)) {
        snprintf(msg, cap, "the body must be a JSON object");
        goto fail;
    }
    char field[256];
    if (nul_field(body, len, field, sizeof field)) { /* first: a key cut at its NUL would read as another */
        snprintf(msg, cap, "%s: a NUL character (\\u0000); text with one is refused (it would be cut there)", field);
        goto fail;
    }
    if (check_fields(root, msg, cap)) goto fail;
    /* fields of one route only: elsewhere they would be dropped without a word */
    static const struct { const char *name; bool chat; } ROUTE_ONLY[] = {
        {"messages", true}, {"top_logprobs", true}, {"add_generation_prompt", true},
        {"continue_final_message", true}, {"prompt", false}};
    for (size_t k = 0; k < sizeof ROUTE_ONLY / sizeof *ROUTE_ONLY; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, ROUTE_ONLY[k].name);
        if (x && !cJSON_IsNull(x) && ROUTE_ONLY[k].chat != chat) {
            snprintf(msg, cap, "'%s' is a field of %s, not of this route%s", ROUTE_ONLY[k].name,
                     chat ? "/v1/completions and /completion" : "/v1/chat/completions",
                     !strcmp(ROUTE_ONLY[k].name, "top_logprobs") ? " (here 'logprobs': N gives the N alternatives)"
                     : !strcmp(ROUTE_ONLY[k].name, "prompt") ? " (give 'messages')" : "");
            goto fail;
        }
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) { snprintf(msg, cap, "'model' must be a string"); goto fail; }
        if (!(r->model = dup_str(v->valuestring))) goto oom;
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "stream");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) { snprintf(msg, cap, "'stream' must be a boolean"); goto fail; }
        r->stream = cJSON_IsTrue(v);
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (v && !cJSON_IsNull(v)) {
        const cJSON *iu = cJSON_GetObjectItemCaseSensitive(v, "include_usage");
        if (!cJSON_IsObject(v) || (iu && !cJSON_IsBool(iu) && !cJSON_IsNull(iu))) {
            snprintf(msg, cap, "'stream_options' must be an object whose 'include_usage' is a boolean");
            goto fail;
        }
        static const char *const SO[] = {"include_usage"};
        if (!serve_fields_known(v, SO, 1, "'stream_options'", msg, cap)) goto fail;
        r->include_usage = cJSON_IsTrue(iu);
        if (!r->stream) { /* OpenAI's 400: its options would have nothing to apply to */
            snprintf(msg, cap, "'stream_options' is only allowed with 'stream': true");
            goto fail;
        }
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "modalities"); /* OpenAI's: the reply's kinds; text is the one here */
    if (v && !cJSON_IsNull(v)) {
        const cJSON *e;
        bool ok = cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0;
        cJSON_ArrayForEach(e, v) if (!cJSON_IsString(e) || strcmp(e->valuestring, "text")) ok = false;
        if (!ok) { snprintf(msg, cap, "'modalities' other than [\"text\"] are not supported: the model answers in text only"); goto fail; }
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "id_slot"); /* llama-server's: a slot; any gives the same reply here */
    if (v && !cJSON_IsNull(v) && (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < -1 ||
                                  v->valuedouble > 1e6)) {
        snprintf(msg, cap, "'id_slot' must be an integer, -1 for any slot");
        goto fail;
    }
    static const char *const BOOLS[] = {"verbose", "post_sampling_probs", "backend_sampling", "return_progress",
                                        "timings_per_token"};
    for (size_t k = 0; k < sizeof BOOLS / sizeof *BOOLS; k++) {
        v = cJSON_GetObjectItemCaseSensitive(root, BOOLS[k]);
        if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v)) { snprintf(msg, cap, "'%s' must be a boolean", BOOLS[k]); goto fail; }
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "verbose");
    r->verbose = cJSON_IsBool(v) ? cJSON_IsTrue(v) : serve_verbose_default;
    r->return_progress = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "return_progress"));
    r->timings_per_token = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "timings_per_token"));
    r->post_sampling = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "post_sampling_probs"));
    /* "backend_sampling" (llama-server's: sample on its GPU backend or its CPU): flashlm has the one sampler, so
     * either value gives the same tokens and probabilities; checked above, nothing to choose */
    v = cJSON_GetObjectItemCaseSensitive(root, "response_fields");
    if (v && !cJSON_IsNull(v)) {
        int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
        if (n < 0 || n > 64) { snprintf(msg, cap, "'response_fields' must be an array of at most 64 strings"); goto fail; }
        if (n && !(r->fields = calloc((size_t)n, sizeof *r->fields))) goto oom;
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (!cJSON_IsString(e) || !e->valuestring[0]) {
                snprintf(msg, cap, "'response_fields' must be an array of at most 64 strings");
                goto fail;
            }
            if (!(r->fields[r->n_fields] = dup_str(e->valuestring))) goto oom;
            r->n_fields++;
        }
    }
    double d;
    int got;
    if ((got = get_number(root, "temperature", 0, 2, false, &d, msg, cap)) < 0) goto fail;
    if (got) { r->has_temp = true; r->temperature = (float)d; }
    if ((got = get_number(root, "top_p", 0, 1, false, &d, msg, cap)) < 0) goto fail;
    if (got) { r->has_top_p = true; r->top_p = (float)d; }
    if ((got = get_number(root, "top_k", -1, 1 << 24, true, &d, msg, cap)) < 0) goto fail;
    if (got) r->top_k = d < 0 ? 0 : (int)d; /* llama-server's k <= 0 (vLLM's -1): off */
    if ((got = get_number(root, "seed", -1, 9007199254740991.0, true, &d, msg, cap)) < 0) goto fail;
    if (got && d < 0) r->seed_random = true; /* llama-server's -1: a random seed (clients send it for "none") */
    else if (got) { r->has_seed = true; r->seed = (uint64_t)d; }
    /* the limit's three names: one value; two names that disagree are refused (one would be dropped) */
    static const char *const LIMITS[] = {"max_tokens", "max_completion_tokens", "n_predict"};
    const char *limit_from = NULL;
    for (int i = 0; i < 3; i++) {
        if ((got = get_number(root, LIMITS[i], i == 2 ? -1 : 0, 1 << 24, true, &d, msg, cap)) < 0) goto fail;
        if (!got) continue;
        if (limit_from && r->max_tokens != (long)d) {
            snprintf(msg, cap, "'%s' (%ld) and '%s' (%ld) disagree: give one", limit_from, r->max_tokens, LIMITS[i],
                     (long)d);
            goto fail;
        }
        r->max_tokens = (long)d;
        limit_from = LIMITS[i];
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "return_tokens");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) { snprintf(msg, cap, "'return_tokens' must be a boolean"); goto fail; }
        r->return_tokens = cJSON_IsTrue(v);
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "cache_prompt");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) { snprintf(msg, cap, "'cache_prompt' must be a boolean"); goto fail; }
        r->no_cache = cJSON_IsFalse(v);
    }
    /* the logit edits (flm_sampler_params: OpenAI's penalties, llama-server's, logit_bias) */
    r->repeat_last_n = -2;
    r->min_p = -1;
    if ((got = get_number(root, "presence_penalty", -2, 2, false, &d, msg, cap)) < 0) goto fail;
    if (got) r->presence_penalty = (float)d;
    if ((got = get_number(root, "frequency_penalty", -2, 2, false, &d, msg, cap)) < 0) goto fail;
    if (got) r->frequency_penalty = (float)d;
    if ((got = get_number(root, "repeat_penalty", 0, 10, false, &d, msg, cap)) < 0) goto fail;
    if (got) r->repeat_penalty = (float)d;
    if ((got = get_number(root, "repeat_last_n", -1, 1 << 24, true, &d, msg, cap)) < 0) goto fail;
    if (got) r->repeat_last_n = (int)d;
    if ((got = get_number(root, "min_p", 0, 1, false, &d, msg, cap)) < 0) goto fail;
    if (got) r->min_p = (float)d;
    v = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (v && !cJSON_IsNull(v)) {
        const bool obj = cJSON_IsObject(v);
        if (!obj && !cJSON_IsArray(v)) {
            snprintf(msg, cap, "'logit_bias' must be an object {\"token id\": bias} or an array of [token id, bias]");
            goto fail;
        }
        int n = cJSON_GetArraySize(v);
        if (n > SERVE_MAX_BIAS) { snprintf(msg, cap, "'logit_bias': at most %d entries", SERVE_MAX_BIAS); goto fail; }
        if (n > 0 && !(r->bias = calloc((size_t)n, sizeof *r->bias))) goto oom;
        if (n > 0 && !(r->bias_text = calloc((size_t)n, sizeof *r->bias_text))) goto oom;
        if (n > 0 && !(r->bias_text_val = calloc((size_t)n, sizeof *r->bias_text_val))) goto oom;
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            const cJSON *tok = e, *val = e;
            long id = -1;
            const char *text = NULL; /* a text whose tokens get the bias (llama-server's) */
            if (obj) { /* "1234": bias, or "text": bias */
                char *end;
                errno = 0;
                id = strtol(e->string, &end, 10);
                if (!e->string[0] || *end || errno || id < 0 || id > INT32_MAX) {
                    const char *q = e->string;
                    while (*q == ' ') q++;
                    if (*q == '-' || (*q >= '0' && *q <= '9') || !e->string[0]) { /* a number, but not an id */
                        snprintf(msg, cap, "'logit_bias': key '%.40s' is not a token id (a non-negative integer)",
                                 e->string);
                        goto fail;
                    }
                    text = e->string;
                }
            } else { /* [id, bias] */
                if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2) {
                    snprintf(msg, cap, "'logit_bias': each entry must be [token id, bias]");
                    goto fail;
                }
                tok = e->child;
                val = e->child->next;
                if (cJSON_IsString(tok) && tok->valuestring[0]) text = tok->valuestring;
                else if (!cJSON_IsNumber(tok) || tok->valuedouble < 0 || tok->valuedouble > INT32_MAX ||
                    tok->valuedouble != floor(tok->valuedouble)) {
                    snprintf(msg, cap, "'logit_bias': a token id must be a non-negative integer");
                    goto fail;
                }
                else id = (long)tok->valuedouble;
            }
            float b;
            if (cJSON_IsFalse(val)) b = -INFINITY; /* llama-server's: never this token */
            else if (cJSON_IsNumber(val) && isfinite(val->valuedouble) && val->valuedouble >= -100 &&
                     val->valuedouble <= 100) b = (float)val->valuedouble;
            else {
                snprintf(msg, cap, "'logit_bias': %s%.40s: the bias must be a number between -100 and 100",
                         text ? "text " : "token ", text ? text : (snprintf(field, sizeof field, "%ld", id), field));
                goto fail;
            }
            if (text) {
                if (!(r->bias_text[r->n_bias_text] = dup_str(text))) goto oom;
                r->bias_text_val[r->n_bias_text++] = b;
                continue;
            }
            r->bias[r->n_bias].token = (int32_t)id;
            r->bias[r->n_bias].bias = b;
            r->n_bias++;
        }
    }
    /* logprobs: chat's boolean + top_logprobs; completions' integer (the alternatives), llama-server's n_probs */
    v = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (chat && v && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) { snprintf(msg, cap, "'logprobs' must be a boolean"); goto fail; }
        r->logprobs = cJSON_IsTrue(v);
    } else if (!chat && (got = get_number(root, "logprobs", 0, FLM_GEN_TOP_LOGPROBS_MAX, true, &d, msg, cap)) != 0) {
        if (got < 0) goto fail;
        r->logprobs = true;
        r->top_logprobs = (int)d;
    }
    if (chat && (got = get_number(root, "top_logprobs", 0, FLM_GEN_TOP_LOGPROBS_MAX, true, &d, msg, cap)) != 0) {
        if (got < 0) goto fail;
        if (!r->logprobs) { snprintf(msg, cap, "'top_logprobs' needs 'logprobs': true"); goto fail; }
        r->top_logprobs = (int)d;
    }
    if ((got = get_number(root, "n_probs", 0, FLM_GEN_TOP_LOGPROBS_MAX, true, &d, msg, cap)) < 0) goto fail;
    if (got && d > 0) { r->logprobs = true; r->top_logprobs = (int)d; }
    r->n_choices = 1;
    if ((got = get_number(root, "n", 1, SERVE_MAX_CHOICES, true, &d, msg, cap)) < 0) {
        snprintf(msg, cap, "'n' must be 1 to %d (choices per request)", SERVE_MAX_CHOICES);
        goto fail;
    }
    if (got) r->n_choices = (int)d;
    if (r->n_choices > 1 && r->stream) {
        snprintf(msg, cap, "'n' > 1 with 'stream' is not supported (ask for the choices without streaming)");
        goto fail;
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (v && !cJSON_IsNull(v)) {
        const cJSON *one = v, *item;
        bool arr = cJSON_IsArray(v);
        if (!arr && !cJSON_IsString(v)) { snprintf(msg, cap, "'stop' must be a string or an array of strings"); goto fail; }
        if (arr && cJSON_GetArraySize(v) > FLM_GEN_STOP_MAX) {
            snprintf(msg, cap, "'stop': at most %d strings", FLM_GEN_STOP_MAX);
            goto fail;
        }
        for (item = arr ? v->child : one; item; item = arr ? item->next : NULL) {
            if (!cJSON_IsString(item)) { snprintf(msg, cap, "'stop' must be a string or an array of strings"); goto fail; }
            size_t n = strlen(item->valuestring);
            if (n == 0 || n > FLM_GEN_STOP_LEN) {
                snprintf(msg, cap, "'stop': each string must have 1 to %d bytes", FLM_GEN_STOP_LEN);
                goto fail;
            }
            if (!(r->stop[r->n_stop] = dup_str(item->valuestring))) goto oom;
            r->n_stop++;
        }
    }
    if ((got = serve_parse_tools(root, chat, r, msg, cap)) != 0) {
        status = got;
        goto fail;
    }
    if ((got = parse_constraint(root, r, msg, cap)) != 0) {
        status = got;
        goto fail;
    }
    /* a stop string would cut a JSON value or a forced call short and the reply would still say "stop", which
     * promises the value whole (docs/STRUCTURED.md): refused rather than broken (a GBNF grammar is the client's own
     * language: its stop strings apply) */
    const bool json_value = r->grammar_from && strcmp(r->grammar_from, "grammar"); /* response_format, json_schema */
    if (r->n_stop > 0 && (json_value || r->tool_choice == SERVE_TOOL_REQUIRED || r->tool_choice == SERVE_TOOL_NAMED)) {
        snprintf(msg, cap, "'stop' cannot be used with %s: a stop string would cut the %s short",
                 !json_value ? "'tool_choice' required or naming a function"
                 : !strncmp(r->grammar_from, "response_format", 15) ? "'response_format'" : "'json_schema'",
                 json_value ? "JSON value" : "call");
        goto fail;
    }
    if (chat) {
        v = cJSON_GetObjectItemCaseSensitive(root, "messages");
        if (!v) { snprintf(msg, cap, "'messages' is required"); goto fail; }
        if (!cJSON_IsArray(v)) { snprintf(msg, cap, "'messages' must be an array"); goto fail; }
        int n = cJSON_GetArraySize(v);
        if (n < 1 || n > SERVE_MAX_MSGS) {
            snprintf(msg, cap, "'messages' must hold 1 to %d messages", SERVE_MAX_MSGS);
            goto fail;
        }
        if (!(r->msgs = calloc((size_t)n, sizeof *r->msgs))) goto oom;
        if (!(r->tool_calls = calloc((size_t)n, sizeof *r->tool_calls))) goto oom;
        const cJSON *m;
        cJSON_ArrayForEach(m, v) {
            size_t i = r->n_msgs;
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
            if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
                snprintf(msg, cap, "messages[%zu] must be an object with a string 'role'", i);
                goto fail;
            }
            const char *rs = role->valuestring;
            if (!strcmp(rs, "function")) {
                snprintf(msg, cap, "messages[%zu].role 'function' (OpenAI's deprecated function calling) is not "
                         "supported: send the result as role 'tool'", i);
                goto fail;
            }
            if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "developer") &&
                strcmp(rs, "tool")) {
                snprintf(msg, cap, "messages[%zu].role must be system, developer, user, assistant or tool", i);
                goto fail;
            }
            { /* a message's keys: each honoured, or refused by name */
                static const char *const MK[] = {"role", "content", "tool_calls", "tool_call_id", "name"};
                char where[40];
                snprintf(where, sizeof where, "messages[%zu]", i);
                if (!serve_fields_known(m, MK, 5, where, msg, cap)) goto fail;
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(m, "name"),
                            *tid = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
                if (nm && !cJSON_IsNull(nm) && (strcmp(rs, "tool") || !cJSON_IsString(nm))) {
                    snprintf(msg, cap, "messages[%zu].name: %s", i, strcmp(rs, "tool")
                             ? "a participant's name is not supported (the chat template has no place for it)"
                             : "must be a string (the function whose result this is)");
                    goto fail;
                }
                if (tid && !cJSON_IsNull(tid) && (strcmp(rs, "tool") || !cJSON_IsString(tid))) {
                    snprintf(msg, cap, "messages[%zu].tool_call_id: %s", i, strcmp(rs, "tool")
                             ? "only a 'tool' message answers a call" : "must be a string");
                    goto fail;
                }
            }
            if (!strcmp(rs, "assistant") && (got = serve_parse_msg_tool_calls(m, i, &r->tool_calls[i], msg, cap))) {
                status = got;
                goto fail;
            }
            if (r->tool_calls[i] || !strcmp(rs, "tool")) r->tool_turns = true;
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
            if (!content && !r->tool_calls[i]) { snprintf(msg, cap, "messages[%zu].content is required", i); goto fail; }
            status = 500;
            char *text = content_text(content, i, msg, cap, &status);
            if (!text) {
                if (status == 500) goto oom;
                goto fail;
            }
            status = 400;
            char *rc = dup_str(strcmp(rs, "developer") ? rs : "system");
            if (!rc) { free(text); goto oom; }
            r->msgs[i].role = rc;
            r->msgs[i].content = text;
            r->n_msgs++;
        }
        /* a final assistant message is continued (prefill, llama-server's); vLLM's spelling of that choice */
        const bool last_asst = !strcmp(r->msgs[r->n_msgs - 1].role, "assistant");
        if (last_asst && r->n_msgs >= 2 && !strcmp(r->msgs[r->n_msgs - 2].role, "assistant")) {
            snprintf(msg, cap, "'messages': two assistant messages at the end (the last one is continued as the "
                     "reply's beginning: join them into one)");
            goto fail;
        }
        const cJSON *agp = cJSON_GetObjectItemCaseSensitive(root, "add_generation_prompt");
        const cJSON *cfm = cJSON_GetObjectItemCaseSensitive(root, "continue_final_message");
        if ((agp && !cJSON_IsNull(agp) && !cJSON_IsBool(agp)) || (cfm && !cJSON_IsNull(cfm) && !cJSON_IsBool(cfm))) {
            snprintf(msg, cap, "'add_generation_prompt' and 'continue_final_message' must be booleans");
            goto fail;
        }
        if (cJSON_IsTrue(agp) && cJSON_IsTrue(cfm)) {
            snprintf(msg, cap, "'add_generation_prompt' and 'continue_final_message' cannot both be true");
            goto fail;
        }
        if (cJSON_IsTrue(cfm) && !last_asst) {
            snprintf(msg, cap, "'continue_final_message': the last message must be the assistant's (it is continued)");
            goto fail;
        }
        if (cJSON_IsFalse(agp) && !last_asst) {
            snprintf(msg, cap, "'add_generation_prompt': false is supported only with a final assistant message to "
                     "continue (else the reply would continue the user's turn)");
            goto fail;
        }
        if (cJSON_IsFalse(cfm) && last_asst) {
            snprintf(msg, cap, "'continue_final_message': false is not supported: a final assistant message is "
                     "continued (prefill)");
            goto fail;
        }
    } else {
        v = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        if (!v) { snprintf(msg, cap, "'prompt' is required"); goto fail; }
        if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 &&
            (cJSON_IsString(v->child) || cJSON_IsArray(v->child) || cJSON_IsObject(v->child)))
            v = v->child;
        if (cJSON_IsObject(v)) { /* llama-server's {"prompt_string": ..., "multimodal_data": [...]} */
            if (cJSON_GetObjectItemCaseSensitive(v, "multimodal_data")) {
                snprintf(msg, cap, "'prompt': multimodal_data is not supported (flashlm runs text models)");
                goto fail;
            }
            v = cJSON_GetObjectItemCaseSensitive(v, "prompt_string");
            if (!cJSON_IsString(v)) { snprintf(msg, cap, "'prompt': an object needs 'prompt_string', a string"); goto fail; }
        } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 1 && !cJSON_IsNumber(v->child)) {
            snprintf(msg, cap, "'prompt': several prompts in one request are not supported (send one per request)");
            goto fail;
        }
        if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0 && cJSON_IsNumber(v->child)) { /* token ids */
            int n = cJSON_GetArraySize(v);
            if (!(r->prompt_ids = malloc((size_t)n * sizeof *r->prompt_ids))) goto oom;
            const cJSON *t;
            cJSON_ArrayForEach(t, v) {
                if (!cJSON_IsNumber(t) || t->valuedouble < 0 || t->valuedouble > INT32_MAX ||
                    t->valuedouble != floor(t->valuedouble)) {
                    snprintf(msg, cap, "'prompt': token ids must be non-negative integers");
                    goto fail;
                }
                r->prompt_ids[r->n_prompt_ids++] = (int32_t)t->valuedouble;
            }
            if (!(r->prompt = dup_str(""))) goto oom;
        } else {
            if (!cJSON_IsString(v)) {
                snprintf(msg, cap, "'prompt' must be a string or an array of token ids (or an array of one of them)");
                goto fail;
            }
            if (!(r->prompt = dup_str(v->valuestring))) goto oom;
        }
    }
    cJSON_Delete(root);
    return 0;
oom:
    snprintf(msg, cap, "out of memory parsing the request");
    status = 500;
fail:
    cJSON_Delete(root);
    serve_req_free(r);
    return status;
}
