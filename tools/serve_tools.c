/* serve_tools.c — OpenAI's tools in `flashlm serve` (tools/serve.h): the request's tools, tool_choice and tool turns
 * checked, the conversation rendered in the model's own tool format and the calls parsed out of the reply by the
 * library (flm_chat_tools_messages, flm_chat_parse_tool_calls, flm_chat_tool_grammar: src/format/chat_tools.c), and
 * the reply split into content and calls as it streams. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"

static char *dup_s(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

/* OpenAI's function names: [A-Za-z0-9_-], 1 to 64 (they go into the prompt and the grammar as they are). */
static bool valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return false;
    }
    return true;
}

int serve_parse_tools(const cJSON *root, bool chat, serve_req *r, char *msg, size_t cap) {
    static const char *const LEGACY[] = {"functions", "function_call"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, LEGACY[i]);
        if (v && !cJSON_IsNull(v)) {
            snprintf(msg, cap, "'%s' (OpenAI's deprecated function calling) is not supported: send 'tools' and "
                     "'tool_choice'", LEGACY[i]);
            return 400;
        }
    }
    r->parallel_tool_calls = true;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    if (cJSON_IsNull(tools)) tools = NULL;
    if (cJSON_IsNull(choice)) choice = NULL;
    if (cJSON_IsNull(par)) par = NULL;
    if (!chat && (tools || choice)) {
        snprintf(msg, cap, "'%s' is for /v1/chat/completions", tools ? "tools" : "tool_choice");
        return 400;
    }
    if (par) {
        if (!cJSON_IsBool(par)) { snprintf(msg, cap, "'parallel_tool_calls' must be a boolean"); return 400; }
        r->parallel_tool_calls = cJSON_IsTrue(par);
    }
    if (tools) {
        if (!cJSON_IsArray(tools)) { snprintf(msg, cap, "'tools' must be an array of function tools"); return 400; }
        if (!tools->child) { /* OpenAI's 400 too: an empty list offers nothing to call */
            snprintf(msg, cap, "'tools' is empty: give at least one function, or leave it out");
            return 400;
        }
        int i = 0;
        for (const cJSON *t = tools->child; t; t = t->next, i++) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function")) {
                snprintf(msg, cap, "tools[%d]: only {\"type\": \"function\", \"function\": {...}} tools are supported", i);
                return 400;
            }
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
            const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
            const cJSON *strict = cJSON_GetObjectItemCaseSensitive(fn, "strict");
            if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !valid_name(name->valuestring)) {
                snprintf(msg, cap, "tools[%d].function.name must be 1 to 64 letters, digits, '_', '-' or '.'", i);
                return 400;
            }
            static const char *const TOOL[] = {"type", "function"}, *const FN[] = {"name", "description",
                                                                                    "parameters", "strict"};
            char what[48];
            snprintf(what, sizeof what, "tools[%d]", i);
            if (!serve_fields_known(t, TOOL, 2, what, msg, cap)) return 400;
            snprintf(what, sizeof what, "tools[%d].function", i);
            if (!serve_fields_known(fn, FN, 4, what, msg, cap)) return 400;
            if ((desc && !cJSON_IsString(desc) && !cJSON_IsNull(desc)) ||
                (params && !cJSON_IsObject(params) && !cJSON_IsNull(params)) ||
                (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))) {
                snprintf(msg, cap, "tools[%d].function: 'description' must be a string, 'parameters' a JSON schema "
                         "(an object), 'strict' a boolean", i);
                return 400;
            }
            if (params && !cJSON_IsNull(params)) {
                /* a call's arguments are an object: a schema of anything else makes calls no parser takes; and a
                 * schema the grammar cannot follow is refused whatever tool_choice is (auto constrains calls too) */
                static const char *const NOT_OBJECT[] = {"enum", "const", "anyOf", "oneOf", "allOf", "$ref", "items",
                                                         NULL};
                const cJSON *pt = cJSON_GetObjectItemCaseSensitive(params, "type");
                bool obj = pt ? cJSON_IsString(pt) && !strcmp(pt->valuestring, "object") : true;
                for (int k = 0; obj && !pt && NOT_OBJECT[k]; k++)
                    obj = !cJSON_GetObjectItemCaseSensitive(params, NOT_OBJECT[k]);
                if (!obj) {
                    snprintf(msg, cap, "tools[%d].function.parameters must describe an object ({\"type\": "
                             "\"object\", \"properties\": ...}): a call's arguments are one", i);
                    return 400;
                }
                char *ps = cJSON_PrintUnformatted(params), *gbnf = NULL;
                if (!ps) goto oom;
                flm_error e = {0};
                flm_status st = flm_json_schema_to_gbnf(ps, strlen(ps), "args", &gbnf, NULL, &e);
                free(ps);
                free(gbnf);
                if (st == FLM_ERR_NOMEM) goto oom;
                if (st) {
                    snprintf(msg, cap, "tools[%d].function.parameters: %s", i, e.msg);
                    return 400;
                }
            }
            for (const cJSON *u = tools->child; u != t; u = u->next)
                if (!strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "function"),
                                                             "name")->valuestring, name->valuestring)) {
                    snprintf(msg, cap, "tools[%d]: a second function named '%s'", i, name->valuestring);
                    return 400;
                }
        }
        if (i > 0 && !(r->tools = cJSON_PrintUnformatted(tools))) goto oom;
    }
    r->tool_choice = r->tools ? SERVE_TOOL_AUTO : SERVE_TOOL_NONE;
    if (choice && !r->tools) { /* OpenAI's 400: a choice among no tools */
        snprintf(msg, cap, "'tool_choice' needs 'tools'");
        return 400;
    }
    if (choice) {
        if (cJSON_IsString(choice)) {
            const char *c = choice->valuestring;
            if (!strcmp(c, "none")) r->tool_choice = SERVE_TOOL_NONE;
            else if (!strcmp(c, "auto")) r->tool_choice = SERVE_TOOL_AUTO;
            else if (!strcmp(c, "required")) r->tool_choice = SERVE_TOOL_REQUIRED;
            else {
                snprintf(msg, cap, "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}, not '%.40s'", c);
                return 400;
            }
        } else {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice, "function"),
                                                                 "name");
            if (!cJSON_IsObject(choice) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
                !cJSON_IsString(name)) {
                snprintf(msg, cap, "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}");
                return 400;
            }
            r->tool_choice = SERVE_TOOL_NAMED;
            if (!(r->tool_name = dup_s(name->valuestring))) goto oom;
            bool found = false;
            for (const cJSON *t = tools ? tools->child : NULL; t && !found; t = t->next)
                found = !strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"),
                                                                 "name")->valuestring, name->valuestring);
            if (!found) {
                snprintf(msg, cap, "'tool_choice' names the function '%.64s', which is not in 'tools'", name->valuestring);
                return 400;
            }
        }
    }
    return 0;
oom:
    snprintf(msg, cap, "out of memory parsing the request");
    return 500;
}

int serve_parse_msg_tool_calls(const cJSON *m, size_t i, char **out, char *msg, size_t cap) {
    *out = NULL;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!tc || cJSON_IsNull(tc)) return 0;
    if (!cJSON_IsArray(tc)) { snprintf(msg, cap, "messages[%zu].tool_calls must be an array", i); return 400; }
    int k = 0;
    for (const cJSON *c = tc->child; c; c = c->next, k++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
        if (!cJSON_IsObject(c) || (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))) ||
            !cJSON_IsObject(fn) || !cJSON_IsString(name) || (args && !cJSON_IsString(args) && !cJSON_IsObject(args))) {
            snprintf(msg, cap, "messages[%zu].tool_calls[%d] must be {\"id\", \"type\": \"function\", \"function\": "
                     "{\"name\": string, \"arguments\": a JSON string}}", i, k);
            return 400;
        }
    }
    if (k == 0) return 0;
    if (!(*out = cJSON_PrintUnformatted(tc))) {
        snprintf(msg, cap, "out of memory parsing the request");
        return 500;
    }
    return 0;
}

int serve_tools_prepare(serve_req *r, const flm_chat *tmpl, char *msg, size_t cap) {
    if (!r->chat || (!r->tools && !r->tool_turns)) return 0;
    if (!flm_chat_tool_format(tmpl)) {
        snprintf(msg, cap, "'%s': the model's chat format (%s, %s) has no tool-call format (tools need a model whose "
                 "template has one, e.g. Qwen2.5's)", r->tools ? "tools" : "messages", flm_chat_name(tmpl),
                 flm_chat_origin(tmpl));
        return 400;
    }
    flm_error err;
    flm_chat_msg *m = NULL;
    size_t n = 0;
    const char *tools = r->tool_choice == SERVE_TOOL_NONE ? NULL : r->tools; /* none: the model is not told of them */
    flm_status st = flm_chat_tools_messages(tmpl, r->msgs, (const char *const *)r->tool_calls, r->n_msgs, tools, &m,
                                            &n, &err);
    if (st) {
        snprintf(msg, cap, "%s", err.msg);
        return st == FLM_ERR_NOMEM ? 500 : 400;
    }
    flm_chat_msg *nm = calloc(n ? n : 1, sizeof *nm);
    bool ok = nm != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        nm[i].role = dup_s(m[i].role);
        nm[i].content = dup_s(m[i].content);
        ok = nm[i].role && nm[i].content;
    }
    flm_chat_msgs_free(m, n);
    if (!ok) {
        for (size_t i = 0; nm && i < n; i++) {
            free((char *)nm[i].role);
            free((char *)nm[i].content);
        }
        free(nm);
        snprintf(msg, cap, "out of memory");
        return 500;
    }
    for (size_t i = 0; i < r->n_msgs; i++) {
        free((char *)r->msgs[i].role);
        free((char *)r->msgs[i].content);
        if (r->tool_calls) free(r->tool_calls[i]);
    }
    free(r->msgs);
    free(r->tool_calls);
    r->tool_calls = NULL;
    r->msgs = nm;
    r->n_msgs = n;
    if (r->tool_choice == SERVE_TOOL_REQUIRED || r->tool_choice == SERVE_TOOL_NAMED) {
        if (r->grammar) {
            snprintf(msg, cap, "'tool_choice' %s and '%s' both constrain the output: give one",
                     r->tool_choice == SERVE_TOOL_REQUIRED ? "required" : "(a function)", r->grammar_from);
            return 400;
        }
        char *gbnf = NULL;
        st = flm_chat_tool_grammar(tmpl, r->tools, r->tool_choice == SERVE_TOOL_NAMED ? r->tool_name : NULL,
                                   r->parallel_tool_calls && r->tool_choice == SERVE_TOOL_REQUIRED, &gbnf, &err);
        if (!st) st = flm_grammar_parse(gbnf, strlen(gbnf), NULL, &r->grammar, &err);
        free(gbnf);
        if (st) {
            snprintf(msg, cap, "'tools': %s", err.msg);
            return st == FLM_ERR_NOMEM ? 500 : 400;
        }
        r->grammar_from = "tool_choice";
    }
    r->parse_tools = r->tools && r->tool_choice != SERVE_TOOL_NONE;
    return 0;
}

/* ---- the reply as it streams ---- */

static bool grow(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *q = realloc(*p, c);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* Content out, its trailing whitespace held until more content follows. */
static void give_content(serve_tool_stream *t, const char *s, size_t n, serve_content_fn content, void *user) {
    size_t e = n;
    while (e > 0 && is_ws(s[e - 1])) e--;
    if (e > 0) {
        if (t->n_ws) content(user, t->ws, t->n_ws);
        t->n_ws = 0;
        content(user, s, e);
    }
    if (n > e) {
        if (!grow(&t->ws, &t->cap_ws, t->n_ws + (n - e))) { t->oom = true; return; }
        memcpy(t->ws + t->n_ws, s + e, n - e);
        t->n_ws += n - e;
    }
}

static void drop(serve_tool_stream *t, size_t n) {
    memmove(t->buf, t->buf + n, t->len - n);
    t->len -= n;
}

/* The opening of a call as the format writes it, in p[0, n) (after the open tag): ws { ws "name" ws : ws "NAME" ws ,
 * ws "arguments" ws : ws {. 1 with the name and *args_at (the offset of the arguments' '{'), 0 when more text may
 * still make it one, -1 when it is not one. */
static int call_opening(const char *p, size_t n, char *name, size_t name_cap, size_t *args_at) {
    static const char *const PARTS[] = {"{", "\"name\"", ":", "\"", NULL, "\"", ",", "\"arguments\"", ":", "{"};
    size_t i = 0, nn = 0;
    for (size_t k = 0; k < sizeof PARTS / sizeof *PARTS; k++) {
        if (k != 4 && k != 5) /* whitespace may come before each part, but not inside the name's quotes */
            while (i < n && is_ws(p[i])) i++;
        if (!PARTS[k]) { /* the name: 1..64 of [A-Za-z0-9_.-] */
            while (i < n && ((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= 'A' && p[i] <= 'Z') ||
                             (p[i] >= '0' && p[i] <= '9') || p[i] == '_' || p[i] == '-' || p[i] == '.')) {
                if (nn + 1 >= name_cap || nn >= 64) return -1;
                name[nn++] = p[i++];
            }
            if (i == n) return 0;
            if (!nn) return -1;
            name[nn] = 0;
            continue;
        }
        size_t m = strlen(PARTS[k]);
        for (size_t c = 0; c < m; c++, i++) {
            if (i == n) return 0;
            if (p[i] != PARTS[k][c]) return -1;
        }
    }
    *args_at = i - 1;
    return 1;
}

/* Phase 1: read the arguments on from t->at, keeping them (whitespace outside strings dropped) until their depth
 * is back to 0 (then phase 2). */
static void follow_args(serve_tool_stream *t) {
    for (; t->at < t->len && t->phase == 1; t->at++) {
        char c = t->buf[t->at];
        if (t->in_str) {
            if (t->esc) t->esc = false;
            else if (c == '\\') t->esc = true;
            else if (c == '"') t->in_str = false;
        } else if (is_ws(c)) {
            continue;
        } else if (c == '"') {
            t->in_str = true;
        } else if (c == '{' || c == '[') {
            t->depth++;
        } else if (c == '}' || c == ']') {
            if (--t->depth == 0) t->phase = 2;
        }
        if (!grow(&t->args, &t->cap_args, t->n_args + 2)) { t->oom = true; return; }
        t->args[t->n_args++] = c;
        t->args[t->n_args] = 0;
    }
}

static void call_reset(serve_tool_stream *t) {
    t->in_call = false;
    t->phase = 0;
    t->n_args = t->args_out = 0;
    t->depth = 0;
    t->in_str = t->esc = false;
}

/* Whether tools (a JSON array of {"type": "function", "function": {"name"}}, NULL: no list to check) declares a
 * function called name. */
static bool tool_declared(const char *tools, const char *name) {
    if (!tools) return true;
    cJSON *tl = cJSON_Parse(tools);
    bool found = false;
    for (const cJSON *t = tl ? tl->child : NULL; t && !found; t = t->next) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        found = cJSON_IsString(n) && name && !strcmp(n->valuestring, name);
    }
    cJSON_Delete(tl);
    return found;
}

void serve_tool_stream_feed(serve_tool_stream *t, const char *text, size_t len, bool final, serve_content_fn content,
                            serve_call_fn call, void *user) {
    const char *open, *close;
    if (!flm_chat_tool_tags(t->tmpl, &open, &close)) {
        content(user, text, len);
        return;
    }
    const size_t lo = strlen(open), lc = strlen(close);
    if (!grow(&t->buf, &t->cap, t->len + len + 1)) { t->oom = true; return; }
    memcpy(t->buf + t->len, text, len);
    t->len += len;
    for (;;) {
        if (!t->in_call) {
            const char *o = t->len ? memmem(t->buf, t->len, open, lo) : NULL;
            if (o) {
                give_content(t, t->buf, (size_t)(o - t->buf), content, user);
                drop(t, (size_t)(o - t->buf));
                call_reset(t);
                t->in_call = true;
                continue;
            }
            size_t keep = 0; /* the longest end of the text that begins the open tag */
            if (!final)
                for (size_t k = lo - 1 < t->len ? lo - 1 : t->len; k > 0 && !keep; k--)
                    if (!memcmp(t->buf + t->len - k, open, k)) keep = k;
            give_content(t, t->buf, t->len - keep, content, user);
            drop(t, t->len - keep);
            break;
        }
        if (t->phase == 0) { /* is it the format's own opening? */
            size_t args_at = 0;
            int r = call_opening(t->buf + lo, t->len - lo, t->name, sizeof t->name, &args_at);
            if (r == 1) {
                t->phase = 1;
                t->at = lo + args_at;
                if (t->incremental) call(user, t->n_calls, t->name, NULL);
            } else if (r < 0) {
                t->phase = 3;
            }
        }
        if (t->phase == 1) follow_args(t);
        if (t->oom) return;
        if (t->incremental && t->phase >= 1 && t->phase <= 2 && t->n_args > t->args_out) {
            call(user, t->n_calls, NULL, t->args + t->args_out);
            t->args_out = t->n_args;
        }
        /* the close tag: after the arguments (phase 2; inside them it may be text of a string), anywhere otherwise */
        size_t from = t->phase == 2 ? t->at : t->phase == 1 ? t->len : lo;
        const char *e = t->len > from ? memmem(t->buf + from, t->len - from, close, lc) : NULL;
        if (e) {
            size_t n = (size_t)(e + lc - t->buf);
            char *c = NULL;
            flm_tool_call *calls = NULL;
            size_t nc = 0;
            flm_error err;
            bool ok = flm_chat_parse_tool_calls(t->tmpl, t->buf, n, &c, &calls, &nc, &err) == FLM_OK && nc == 1 &&
                      tool_declared(t->tools, calls[0].name);
            if (t->incremental && t->phase == 2) /* given out already, as it came */
                t->n_calls++;
            else if (ok) /* the arguments as read (the same text as streamed), else as the library parsed them */
                call(user, t->n_calls++, calls[0].name, t->phase == 2 ? t->args : calls[0].arguments);
            else
                give_content(t, t->buf, n, content, user); /* not a call: text */
            free(c);
            flm_tool_calls_free(calls, nc);
            drop(t, n);
            call_reset(t);
            continue;
        }
        if (final) { /* an unfinished call: text, unless its beginning was given out already */
            if (t->incremental && (t->phase == 1 || t->phase == 2)) t->n_calls++;
            else give_content(t, t->buf, t->len, content, user);
            t->len = 0;
            call_reset(t);
        }
        break;
    }
    if (final && t->n_ws) {
        if (!t->n_calls) content(user, t->ws, t->n_ws);
        t->n_ws = 0;
    }
}

void serve_tool_stream_free(serve_tool_stream *t) {
    free(t->buf);
    free(t->ws);
    free(t->args);
    memset(t, 0, sizeof *t);
}
