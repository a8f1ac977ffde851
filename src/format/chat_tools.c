/* chat_tools.c — OpenAI's function tools in a model's own tool-call format (see chat_template.h): the tools and the
 * tool turns of a conversation rewritten into plain messages that the chat format renders as the model's Jinja
 * template renders the original, the calls parsed out of a generated text, and a GBNF grammar whose sentences are
 * valid calls. One format so far, Qwen2.5's (Hermes-style; Qwen/Qwen2.5-*-Instruct tokenizer_config.json
 * chat_template): a "# Tools" block ending the system turn with one JSON line per tool inside <tools></tools>, each
 * call as "<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>" in the assistant's turn, each result as
 * "<tool_response>\nRESULT\n</tool_response>" in a user turn (consecutive results in one). JSON inside the prompt is
 * written as the template's tojson filter writes it (Python's json.dumps: ", " and ": " separators, keys in their
 * order, non-ASCII as it is). */
#include "format/chat_template.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/strbuf.h"


static const char QWEN_TOOLS_HEAD[] =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>";
static const char QWEN_TOOLS_TAIL[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>";
static const char QWEN_DEFAULT_SYSTEM[] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

flm_chat_tools flm_chat_tools_detect(const char *tmpl, size_t len) {
    if (!tmpl) return FLM_CHAT_TOOLS_NONE;
    bool call = false, tools = false, resp = false;
    for (size_t i = 0; i < len; i++) {
        if (tmpl[i] != '<') continue;
        if (!call && len - i >= 11 && !memcmp(tmpl + i, "<tool_call>", 11)) call = true;
        if (!tools && len - i >= 7 && !memcmp(tmpl + i, "<tools>", 7)) tools = true;
        if (!resp && len - i >= 15 && !memcmp(tmpl + i, "<tool_response>", 15)) resp = true;
    }
    return call && tools && resp ? FLM_CHAT_TOOLS_QWEN : FLM_CHAT_TOOLS_NONE;
}

/* A JSON string as Python's json.dumps(ensure_ascii=False) writes it. */
static void py_string(flm_strbuf *b, const char *s) {
    flm_sb_put(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[8];
        switch (*p) {
        case '"': flm_sb_put(b, "\\\""); break;
        case '\\': flm_sb_put(b, "\\\\"); break;
        case '\n': flm_sb_put(b, "\\n"); break;
        case '\r': flm_sb_put(b, "\\r"); break;
        case '\t': flm_sb_put(b, "\\t"); break;
        case '\b': flm_sb_put(b, "\\b"); break;
        case '\f': flm_sb_put(b, "\\f"); break;
        default:
            if (*p < 0x20) {
                snprintf(e, sizeof e, "\\u%04x", *p);
                flm_sb_put(b, e);
            } else {
                flm_sb_put_n(b, (const char *)p, 1);
            }
        }
    }
    flm_sb_put(b, "\"");
}

/* A number as Python writes it: an integral value within 2^53 as an integer, else the shortest repr that reads back. */
static void py_number(flm_strbuf *b, double v) {
    char s[40];
    if (!isfinite(v)) snprintf(s, sizeof s, v != v ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0) snprintf(s, sizeof s, "%.0f", v);
    else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(s, sizeof s, "%.*g", prec, v);
            if (strtod(s, NULL) == v) break;
        }
    }
    flm_sb_put(b, s);
}

/* Jinja's tojson (Python's json.dumps with ", " and ": "). */
static void py_json(flm_strbuf *b, const cJSON *v) {
    if (cJSON_IsNull(v)) flm_sb_put(b, "null");
    else if (cJSON_IsTrue(v)) flm_sb_put(b, "true");
    else if (cJSON_IsFalse(v)) flm_sb_put(b, "false");
    else if (cJSON_IsNumber(v)) py_number(b, v->valuedouble);
    else if (cJSON_IsString(v)) py_string(b, v->valuestring);
    else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        const bool obj = cJSON_IsObject(v);
        flm_sb_put(b, obj ? "{" : "[");
        for (const cJSON *e = v->child; e; e = e->next) {
            if (e != v->child) flm_sb_put(b, ", ");
            if (obj) {
                py_string(b, e->string ? e->string : "");
                flm_sb_put(b, ": ");
            }
            py_json(b, e);
        }
        flm_sb_put(b, obj ? "}" : "]");
    } else {
        flm_sb_put(b, "null");
    }
}

/* One call of an assistant message as the template writes it: "<tool_call>\n{"name": "NAME", "arguments": ARGS}\n
 * </tool_call>"; an OpenAI call {"function": {"name", "arguments": a JSON string}} (or the bare function), the
 * arguments string parsed so that tojson writes the object (as llama.cpp does), kept as a string when it is not JSON. */
static flm_status put_call(flm_strbuf *b, const cJSON *call, size_t msg_i, size_t k, flm_error *err) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    if (!fn) fn = call;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    if (!cJSON_IsObject(fn) || !cJSON_IsString(name))
        return flm_fail(err, FLM_ERR_FORMAT, "messages[%zu].tool_calls[%zu]: a call needs function.name (a string)",
                        msg_i, k);
    flm_sb_put(b, "<tool_call>\n{\"name\": \"");
    flm_sb_put(b, name->valuestring);
    flm_sb_put(b, "\", \"arguments\": ");
    if (cJSON_IsString(args)) {
        cJSON *parsed = cJSON_Parse(args->valuestring);
        py_json(b, parsed ? parsed : args);
        cJSON_Delete(parsed);
    } else if (args) {
        py_json(b, args);
    } else {
        flm_sb_put(b, "{}");
    }
    flm_sb_put(b, "}\n</tool_call>");
    return FLM_OK;
}

static char *take(flm_strbuf *b) {
    if (b->oom) { free(b->p); return NULL; }
    if (!b->p) return calloc(1, 1);
    return b->p;
}

void flm_chat_tools_msgs_free(flm_chat_msg *m, size_t n) {
    if (!m) return;
    for (size_t i = 0; i < n; i++) free((char *)m[i].content);
    free(m);
}

flm_status flm_chat_tools_rewrite(const flm_chat_template *t, flm_chat_tools kind, const flm_chat_msg *msgs,
                                  const char *const *tool_calls, size_t n, const char *tools, flm_chat_msg **out,
                                  size_t *n_out, flm_error *err) {
    *out = NULL;
    *n_out = 0;
    if (kind != FLM_CHAT_TOOLS_QWEN)
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "the chat format %s has no tool-call format",
                        flm_chat_format_name(t->format));
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return flm_fail(err, FLM_ERR_ARG, "chat: message %zu has no %s", i, msgs[i].role ? "content" : "role");
    cJSON *tl = NULL;
    if (tools && *tools) {
        tl = cJSON_Parse(tools);
        if (!cJSON_IsArray(tl)) {
            cJSON_Delete(tl);
            return flm_fail(err, FLM_ERR_FORMAT, "tools: not a JSON array");
        }
    }
    flm_chat_msg *m = calloc(n + 1, sizeof *m);
    if (!m) {
        cJSON_Delete(tl);
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory rendering tools");
    }
    size_t k = 0, i = 0;
    flm_status st = FLM_OK;
    if (tl && cJSON_GetArraySize(tl) > 0) {
        flm_strbuf b = {0};
        if (n && !strcmp(msgs[0].role, "system")) {
            flm_sb_put(&b, msgs[0].content);
            i = 1;
        } else {
            flm_sb_put(&b, t->default_system ? t->default_system : QWEN_DEFAULT_SYSTEM);
        }
        flm_sb_put(&b, QWEN_TOOLS_HEAD);
        for (const cJSON *tool = tl->child; tool; tool = tool->next) {
            flm_sb_put(&b, "\n");
            py_json(&b, tool);
        }
        flm_sb_put(&b, QWEN_TOOLS_TAIL);
        m[k].role = "system";
        if (!(m[k].content = take(&b))) goto oom;
        k++;
    }
    for (; i < n; i++) {
        const char *role = msgs[i].role;
        flm_strbuf b = {0};
        if (!strcmp(role, "tool")) {
            for (; i < n && !strcmp(msgs[i].role, "tool"); i++) {
                if (b.len) flm_sb_put(&b, "\n");
                flm_sb_put(&b, "<tool_response>\n");
                flm_sb_put(&b, msgs[i].content);
                flm_sb_put(&b, "\n</tool_response>");
            }
            i--;
            role = "user";
        } else if (!strcmp(role, "assistant") && tool_calls && tool_calls[i]) {
            cJSON *calls = cJSON_Parse(tool_calls[i]);
            if (!cJSON_IsArray(calls)) {
                cJSON_Delete(calls);
                st = flm_fail(err, FLM_ERR_FORMAT, "messages[%zu].tool_calls: not a JSON array", i);
                goto fail;
            }
            flm_sb_put(&b, msgs[i].content);
            size_t c = 0;
            for (const cJSON *call = calls->child; call; call = call->next, c++) {
                if (b.len) flm_sb_put(&b, "\n");
                if ((st = put_call(&b, call, i, c, err))) break;
            }
            cJSON_Delete(calls);
            if (st) {
                free(b.p);
                goto fail;
            }
            role = "assistant";
        } else {
            flm_sb_put(&b, msgs[i].content);
            role = !strcmp(role, "system") ? "system" : !strcmp(role, "assistant") ? "assistant" : "user";
        }
        m[k].role = role;
        if (!(m[k].content = take(&b))) goto oom;
        k++;
    }
    cJSON_Delete(tl);
    *out = m;
    *n_out = k;
    return FLM_OK;
oom:
    st = flm_fail(err, FLM_ERR_NOMEM, "out of memory rendering tools");
fail:
    cJSON_Delete(tl);
    flm_chat_tools_msgs_free(m, k);
    return st;
}

void flm_chat_tools_calls_free(flm_tool_call *c, size_t n) {
    if (!c) return;
    for (size_t i = 0; i < n; i++) {
        free(c[i].name);
        free(c[i].arguments);
    }
    free(c);
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* The call in a block's inside [s, e): {"name": string, "arguments": object (or a JSON string of one)}; false when it
 * is not one. */
static bool parse_call(const char *s, size_t n, flm_tool_call *out, bool *oom) {
    cJSON *o = cJSON_ParseWithLength(s, n);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    bool ok = cJSON_IsObject(o) && cJSON_IsString(name) && name->valuestring[0];
    cJSON *parsed = NULL;
    if (ok && cJSON_IsString(args)) ok = cJSON_IsObject(args = parsed = cJSON_Parse(args->valuestring));
    else if (ok && args) ok = cJSON_IsObject(args);
    if (ok) {
        size_t nl = strlen(name->valuestring);
        out->name = malloc(nl + 1);
        if (out->name) memcpy(out->name, name->valuestring, nl + 1);
        out->arguments = args ? cJSON_PrintUnformatted(args) : NULL;
        if (!args && (out->arguments = malloc(3))) memcpy(out->arguments, "{}", 3);
        if (!out->name || !out->arguments) {
            free(out->name);
            free(out->arguments);
            out->name = out->arguments = NULL;
            *oom = true;
            ok = false;
        }
    }
    cJSON_Delete(parsed);
    cJSON_Delete(o);
    return ok;
}

flm_status flm_chat_tools_parse(flm_chat_tools kind, const char *text, size_t len, char **content,
                                flm_tool_call **calls, size_t *n_calls, flm_error *err) {
    *content = NULL;
    *calls = NULL;
    *n_calls = 0;
    if (kind != FLM_CHAT_TOOLS_QWEN) return flm_fail(err, FLM_ERR_UNSUPPORTED, "no tool-call format");
    static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";
    const size_t lo = sizeof OPEN - 1, lc = sizeof CLOSE - 1;
    flm_strbuf b = {0};
    flm_tool_call *c = NULL;
    size_t nc = 0, cap = 0;
    bool oom = false;
    size_t p = 0;
    while (p < len && !oom) {
        const char *o = memmem(text + p, len - p, OPEN, lo);
        const char *e = o ? memmem(o + lo, (size_t)(text + len - (o + lo)), CLOSE, lc) : NULL;
        if (!o || !e) {
            flm_sb_put_n(&b, text + p, len - p);
            break;
        }
        flm_tool_call one = {0};
        if (!parse_call(o + lo, (size_t)(e - (o + lo)), &one, &oom)) { /* not a call: text */
            flm_sb_put_n(&b, text + p, (size_t)(e + lc - (text + p)));
            p = (size_t)(e + lc - text);
            continue;
        }
        if (nc == cap) {
            size_t nc2 = cap ? 2 * cap : 4;
            flm_tool_call *q = realloc(c, nc2 * sizeof *q);
            if (!q) {
                free(one.name);
                free(one.arguments);
                oom = true;
                break;
            }
            c = q;
            cap = nc2;
        }
        c[nc++] = one;
        flm_sb_put_n(&b, text + p, (size_t)(o - (text + p)));
        p = (size_t)(e + lc - text);
    }
    char *s = take(&b);
    if (oom || !s) {
        free(s);
        flm_chat_tools_calls_free(c, nc);
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory parsing tool calls");
    }
    if (nc) { /* the text around the calls, trimmed */
        size_t a = 0, z = strlen(s);
        while (a < z && is_ws(s[a])) a++;
        while (z > a && is_ws(s[z - 1])) z--;
        memmove(s, s + a, z - a);
        s[z - a] = 0;
    }
    *content = s;
    *calls = c;
    *n_calls = nc;
    return FLM_OK;
}
