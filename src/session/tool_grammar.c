/* tool_grammar.c — the grammar of a reply made only of tool calls in Qwen2.5's format (src/format/chat_tools.c
 * renders and parses that format): "<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>", one call or
 * several separated by newlines, ARGS compiled from the tool's "parameters" schema (json_schema.c). serve's
 * tool_choice required and named use it (flm_chat_tool_grammar, include/flashlm.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "flashlm.h"
#include "core/error.h"
#include "core/strbuf.h"
#include "session/grammar.h"


/* GBNF literal text of s (quotes, backslashes, control bytes escaped). */
static void gbnf_lit(flm_strbuf *b, const char *s) {
    flm_sb_put(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[8];
        if (*p == '"' || *p == '\\') {
            e[0] = '\\';
            e[1] = (char)*p;
            flm_sb_put_n(b, e, 2);
        } else if (*p == '\n') {
            flm_sb_put(b, "\\n");
        } else if (*p < 0x20 || *p == 0x7F) {
            snprintf(e, sizeof e, "\\x%02X", *p);
            flm_sb_put(b, e);
        } else {
            flm_sb_put_n(b, (const char *)p, 1);
        }
    }
    flm_sb_put(b, "\"");
}

flm_status gram_tool_calls(const char *tools, const char *only, bool parallel, char **out, flm_error *err) {
    *out = NULL;
    cJSON *tl = tools ? cJSON_Parse(tools) : NULL;
    if (!cJSON_IsArray(tl) || cJSON_GetArraySize(tl) == 0) {
        cJSON_Delete(tl);
        return flm_fail(err, FLM_ERR_FORMAT, "tools: not a non-empty JSON array");
    }
    flm_strbuf b = {0}, alts = {0};
    flm_status st = FLM_OK;
    int i = 0, n_alt = 0;
    for (const cJSON *tool = tl->child; tool; tool = tool->next, i++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsString(name)) {
            st = flm_fail(err, FLM_ERR_FORMAT, "tools[%d]: no function.name", i);
            break;
        }
        if (only && strcmp(only, name->valuestring)) continue;
        char rule[32], *gbnf = NULL, *ps = params && !cJSON_IsNull(params) ? cJSON_PrintUnformatted(params) : NULL;
        /* no parameters: OpenAI's "an empty parameter list" */
        static const char ANY[] = "{\"type\": \"object\", \"additionalProperties\": false}";
        snprintf(rule, sizeof rule, "args%d", i);
        st = flm_json_schema_to_gbnf(ps ? ps : ANY, ps ? strlen(ps) : sizeof ANY - 1, rule, &gbnf, NULL, err);
        free(ps);
        if (st) {
            char m[FLM_ERROR_MSG_MAX];
            snprintf(m, sizeof m, "%s", err ? err->msg : "");
            st = flm_fail(err, st, "tools[%d] (%.64s) parameters: %s", i, name->valuestring, m);
            break;
        }
        flm_sb_put(&b, gbnf);
        flm_sb_put(&b, "\n");
        free(gbnf);
        char head[160];
        snprintf(head, sizeof head, "call%d ::= ", i);
        flm_sb_put(&b, head);
        flm_strbuf lit = {0};
        flm_sb_put(&lit, "<tool_call>\n{\"name\": \"");
        flm_sb_put(&lit, name->valuestring);
        flm_sb_put(&lit, "\", \"arguments\": ");
        if (lit.oom) { b.oom = true; free(lit.p); break; }
        gbnf_lit(&b, lit.p);
        free(lit.p);
        snprintf(head, sizeof head, " args%d \"}\\n</tool_call>\"\n", i);
        flm_sb_put(&b, head);
        snprintf(head, sizeof head, "%scall%d", n_alt ? " | " : "", i);
        flm_sb_put(&alts, head);
        n_alt++;
    }
    cJSON_Delete(tl);
    if (!st && !n_alt) st = flm_fail(err, FLM_ERR_ARG, "no tool named '%.64s'", only ? only : "");
    if (!st) {
        flm_sb_put(&b, "calls ::= ");
        flm_sb_put(&b, alts.p ? alts.p : "");
        flm_sb_put(&b, parallel ? "\nroot ::= calls (\"\\n\" calls)*\n" : "\nroot ::= calls\n");
        if (b.oom || alts.oom) st = flm_fail(err, FLM_ERR_NOMEM, "out of memory building the tools' grammar");
    }
    free(alts.p);
    if (st) {
        free(b.p);
        return st;
    }
    *out = b.p;
    return FLM_OK;
}

flm_status flm_chat_tool_grammar(const flm_chat *c, const char *tools, const char *name, bool parallel, char **out,
                                 flm_error *err) {
    if (!c || !out) return flm_fail(err, FLM_ERR_ARG, "flm_chat_tool_grammar: NULL argument");
    *out = NULL;
    const char *f = flm_chat_tool_format(c);
    if (!f || strcmp(f, "qwen"))
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "the chat format %s has no tool-call format", flm_chat_name(c));
    return gram_tool_calls(tools, name, parallel, out, err);
}
