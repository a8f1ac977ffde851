/* chat_template.c — detection and rendering of chat prompt formats (see chat_template.h). The formats follow the
 * Jinja templates the models ship (Hugging Face tokenizer_config.json chat_template) and llama.cpp's built-in
 * renderings of them (src/llama-chat.cpp, llm_chat_apply_template). */
#include "format/chat_template.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/strbuf.h"

static const char *const FORMAT_NAMES[] = {
    [FLM_CHAT_UNKNOWN] = "unknown", [FLM_CHAT_CHATML] = "chatml", [FLM_CHAT_LLAMA2] = "llama2",
    [FLM_CHAT_LLAMA3] = "llama3",   [FLM_CHAT_GEMMA] = "gemma",   [FLM_CHAT_PHI3] = "phi3",
    [FLM_CHAT_ZEPHYR] = "zephyr",   [FLM_CHAT_COMMAND_R] = "command-r",
};
#define N_FORMATS (sizeof FORMAT_NAMES / sizeof *FORMAT_NAMES)

const char *flm_chat_format_name(flm_chat_format f) {
    return (unsigned)f < N_FORMATS ? FORMAT_NAMES[f] : "unknown";
}

flm_chat_format flm_chat_format_parse(const char *name) {
    if (!name) return FLM_CHAT_UNKNOWN;
    for (unsigned f = 1; f < N_FORMATS; f++)
        if (!strcmp(name, FORMAT_NAMES[f])) return (flm_chat_format)f;
    return FLM_CHAT_UNKNOWN;
}

/* The first occurrence of the NUL-terminated needle in hay[0, len), or NULL. */
static const char *find(const char *hay, size_t len, const char *needle) {
    size_t n = strlen(needle);
    if (!hay || n == 0 || n > len) return NULL;
    for (size_t i = 0; i + n <= len; i++)
        if (hay[i] == needle[0] && !memcmp(hay + i, needle, n)) return hay + i;
    return NULL;
}

flm_chat_format flm_chat_detect(const char *tmpl, size_t len) {
    if (!tmpl || !len) return FLM_CHAT_UNKNOWN;
#define HAS(s) (find(tmpl, len, (s)) != NULL)
    /* llama.cpp's order: chatml first (a template may mention other markers in comments or tool sections). */
    if (HAS("<|im_start|>")) return FLM_CHAT_CHATML;
    if (HAS("[INST]")) return FLM_CHAT_LLAMA2;
    if (HAS("<|assistant|>") && HAS("<|end|>")) return FLM_CHAT_PHI3;
    if (HAS("<|user|>") && HAS("<|endoftext|>")) return FLM_CHAT_ZEPHYR;
    if (HAS("<start_of_turn>")) return FLM_CHAT_GEMMA;
    if (HAS("<|START_OF_TURN_TOKEN|>") && HAS("<|USER_TOKEN|>")) return FLM_CHAT_COMMAND_R;
    if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>")) return FLM_CHAT_LLAMA3;
#undef HAS
    return FLM_CHAT_UNKNOWN;
}

flm_chat_format flm_chat_from_arch(const char *arch) {
    if (!arch) return FLM_CHAT_UNKNOWN;
    if (!strcmp(arch, "gemma") || !strcmp(arch, "gemma2") || !strcmp(arch, "gemma3")) return FLM_CHAT_GEMMA;
    return FLM_CHAT_UNKNOWN;
}

flm_status flm_chat_default_system(const char *tmpl, size_t len, char **out_sys) {
    *out_sys = NULL;
    if (!tmpl) return FLM_OK;
    static const char MARK[] = "<|im_start|>system", END[] = "<|im_end|>";
    const char *end_all = tmpl + len;
    for (const char *p = find(tmpl, len, MARK); p; p = find(p + 1, (size_t)(end_all - p - 1), MARK)) {
        const char *s = p + sizeof MARK - 1;
        if (s < end_all && *s == '\n') s++;
        else if (end_all - s >= 2 && s[0] == '\\' && s[1] == 'n') s += 2;
        else continue;
        const char *e = find(s, (size_t)(end_all - s), END);
        if (!e) break;
        /* a plain literal: no quote (end of the Jinja string), no expression or statement */
        bool plain = e > s;
        for (const char *q = s; q < e && plain; q++)
            if (*q == '\'' && !(q > s && q[-1] == '\\')) plain = false;
            else if (*q == '"' && !(q > s && q[-1] == '\\')) plain = false;
            else if (*q == '{' || *q == '}' || *q == '\n') plain = false;
        if (!plain) continue;
        char *out = malloc((size_t)(e - s) + 1);
        if (!out) return FLM_ERR_NOMEM;
        size_t n = 0;
        for (const char *q = s; q < e; q++) {
            if (*q == '\\' && q + 1 < e) {
                char c = q[1];
                q++;
                out[n++] = c == 'n' ? '\n' : c == 't' ? '\t' : c; /* \' \" \\ -> the character itself */
            } else {
                out[n++] = *q;
            }
        }
        out[n] = 0;
        *out_sys = out;
        return FLM_OK;
    }
    return FLM_OK;
}

flm_status flm_chat_template_init(flm_chat_template *t, const char *name, const char *tmpl, size_t tmpl_len,
                                  const char *arch, flm_error *err) {
    memset(t, 0, sizeof *t);
    if (name) {
        t->format = flm_chat_format_parse(name);
        if (!t->format)
            return flm_fail(err, FLM_ERR_ARG, "unknown chat template '%s' (valid: %s)", name, FLM_CHAT_FORMAT_NAMES);
        t->origin = "--chat-template";
        return FLM_OK;
    }
    if (tmpl && tmpl_len) {
        t->format = flm_chat_detect(tmpl, tmpl_len);
        if (!t->format)
            return flm_fail(err, FLM_ERR_UNSUPPORTED,
                            "the model's chat template (tokenizer.chat_template, %zu bytes) is of no family flashlm "
                            "knows; choose one with --chat-template NAME (%s)", tmpl_len, FLM_CHAT_FORMAT_NAMES);
        t->origin = "the model's template";
        if (t->format == FLM_CHAT_CHATML) t->tools = flm_chat_tools_detect(tmpl, tmpl_len);
        if (t->format == FLM_CHAT_CHATML && flm_chat_default_system(tmpl, tmpl_len, &t->default_system))
            return flm_fail(err, FLM_ERR_NOMEM, "out of memory reading the chat template's system prompt");
        return FLM_OK;
    }
    t->format = flm_chat_from_arch(arch);
    if (t->format) {
        t->origin = "the architecture";
        return FLM_OK;
    }
    t->format = FLM_CHAT_CHATML;
    t->origin = "the default: the model has no chat template";
    return FLM_OK;
}

void flm_chat_template_free(flm_chat_template *t) {
    if (!t) return;
    free(t->default_system);
    t->default_system = NULL;
}

/* ---- rendering ---------------------------------------------------------------------------------------------- */


static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* s without leading and trailing ASCII whitespace (Jinja's trim / Python's str.strip() on ASCII text). */
static void put_trimmed(flm_strbuf *b, const char *s) {
    size_t n = strlen(s), i = 0;
    while (i < n && is_space(s[i])) i++;
    while (n > i && is_space(s[n - 1])) n--;
    flm_sb_put_n(b, s + i, n - i);
}

static bool is_role(const flm_chat_msg *m, const char *role) { return !strcmp(m->role, role); }

/* chatml (Qwen2.5, SmolLM2): every message as <|im_start|>ROLE\nCONTENT<|im_end|>\n, content untrimmed. */
static void render_chatml(flm_strbuf *b, const flm_chat_msg *m, size_t n, bool add_ass) {
    for (size_t i = 0; i < n; i++) {
        flm_sb_put(b, "<|im_start|>"); flm_sb_put(b, m[i].role); flm_sb_put(b, "\n"); flm_sb_put(b, m[i].content); flm_sb_put(b, "<|im_end|>\n");
    }
    if (add_ass) flm_sb_put(b, "<|im_start|>assistant\n");
}

/* Gemma 3 (google/gemma-3-*-it chat_template): no system role; a first system message becomes a prefix
 * "SYSTEM\n\n" of the first turn's content; "assistant" is "model"; contents are trimmed. */
static void render_gemma(flm_strbuf *b, const flm_chat_msg *m, size_t n, bool add_ass) {
    const char *sys = NULL;
    size_t start = 0;
    if (n && is_role(&m[0], "system")) { sys = m[0].content; start = 1; }
    for (size_t i = start; i < n; i++) {
        flm_sb_put(b, "<start_of_turn>");
        flm_sb_put(b, is_role(&m[i], "assistant") ? "model" : m[i].role);
        flm_sb_put(b, "\n");
        if (i == start && sys) { flm_sb_put(b, sys); flm_sb_put(b, "\n\n"); }
        put_trimmed(b, m[i].content);
        flm_sb_put(b, "<end_of_turn>\n");
    }
    if (add_ass) flm_sb_put(b, "<start_of_turn>model\n");
}

/* Llama 3 (Meta-Llama-3-*-Instruct chat_template, BOS left to the tokenizer). */
static void render_llama3(flm_strbuf *b, const flm_chat_msg *m, size_t n, bool add_ass) {
    for (size_t i = 0; i < n; i++) {
        flm_sb_put(b, "<|start_header_id|>"); flm_sb_put(b, m[i].role); flm_sb_put(b, "<|end_header_id|>\n\n");
        put_trimmed(b, m[i].content);
        flm_sb_put(b, "<|eot_id|>");
    }
    if (add_ass) flm_sb_put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Llama 2 chat (Llama-2-*-chat-hf chat_template): user turns "<s>[INST] CONTENT [/INST]" (the first <s> left to
 * the tokenizer), the system prompt inside the first turn as "<<SYS>>\nSYS\n<</SYS>>\n\n", assistant turns
 * " CONTENT </s>"; contents stripped. The assistant opening is empty: the reply follows " [/INST]". */
static void render_llama2(flm_strbuf *b, const flm_chat_msg *m, size_t n) {
    const char *sys = NULL;
    size_t start = 0;
    if (n && is_role(&m[0], "system")) { sys = m[0].content; start = 1; }
    for (size_t i = start; i < n; i++) {
        if (is_role(&m[i], "assistant")) {
            flm_sb_put(b, " "); put_trimmed(b, m[i].content); flm_sb_put(b, " </s>");
            continue;
        }
        if (i > start) flm_sb_put(b, "<s>");
        flm_sb_put(b, "[INST] ");
        if (i == start && sys) {
            /* the template strips "<<SYS>>\n" + sys + "\n<</SYS>>\n\n" + content as one string */
            flm_strbuf c = {0};
            flm_sb_put(&c, "<<SYS>>\n"); flm_sb_put(&c, sys); flm_sb_put(&c, "\n<</SYS>>\n\n"); flm_sb_put(&c, m[i].content);
            if (c.oom) b->oom = true;
            else put_trimmed(b, c.p);
            free(c.p);
        } else {
            put_trimmed(b, m[i].content);
        }
        flm_sb_put(b, " [/INST]");
    }
}

/* Command R (CohereForAI/c4ai-command-r-*, llama.cpp's rendering): <|START_OF_TURN_TOKEN|><|ROLE_TOKEN|>CONTENT
 * <|END_OF_TURN_TOKEN|> with ROLE SYSTEM, USER or CHATBOT (assistant), contents trimmed, other roles left out; then
 * <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>. */
static void render_command_r(flm_strbuf *b, const flm_chat_msg *m, size_t n, bool add_ass) {
    for (size_t i = 0; i < n; i++) {
        const char *tok = is_role(&m[i], "system") ? "<|SYSTEM_TOKEN|>" : is_role(&m[i], "user") ? "<|USER_TOKEN|>"
                          : is_role(&m[i], "assistant") ? "<|CHATBOT_TOKEN|>" : NULL;
        if (!tok) continue;
        flm_sb_put(b, "<|START_OF_TURN_TOKEN|>"); flm_sb_put(b, tok); put_trimmed(b, m[i].content);
        flm_sb_put(b, "<|END_OF_TURN_TOKEN|>");
    }
    if (add_ass) flm_sb_put(b, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
}

/* Phi-3 and Zephyr (llama.cpp's renderings): <|ROLE|>\nCONTENT<END>\n, then <|assistant|>\n. */
static void render_tagged(flm_strbuf *b, const flm_chat_msg *m, size_t n, bool add_ass, const char *end) {
    for (size_t i = 0; i < n; i++) {
        flm_sb_put(b, "<|"); flm_sb_put(b, m[i].role); flm_sb_put(b, "|>\n"); flm_sb_put(b, m[i].content); flm_sb_put(b, end); flm_sb_put(b, "\n");
    }
    if (add_ass) flm_sb_put(b, "<|assistant|>\n");
}

flm_status flm_chat_render(const flm_chat_template *t, const flm_chat_msg *msgs, size_t n, bool add_assistant,
                           char **out, size_t *out_len, flm_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (n && !msgs) return flm_fail(err, FLM_ERR_ARG, "chat: %zu messages but no array", n);
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return flm_fail(err, FLM_ERR_ARG, "chat: message %zu has no %s", i, msgs[i].role ? "content" : "role");
    /* the template's default system prompt goes first when the conversation has none */
    const flm_chat_msg *m = msgs;
    flm_chat_msg *with_sys = NULL;
    if (t->default_system && (n == 0 || strcmp(msgs[0].role, "system"))) {
        with_sys = malloc((n + 1) * sizeof *with_sys);
        if (!with_sys) return flm_fail(err, FLM_ERR_NOMEM, "chat: out of memory rendering %zu messages", n);
        with_sys[0].role = "system";
        with_sys[0].content = t->default_system;
        if (n) memcpy(with_sys + 1, msgs, n * sizeof *msgs);
        m = with_sys;
        n++;
    }
    flm_strbuf b = {0};
    flm_sb_put(&b, ""); /* an empty conversation still gives an (empty) string */
    switch (t->format) {
    case FLM_CHAT_CHATML: render_chatml(&b, m, n, add_assistant); break;
    case FLM_CHAT_GEMMA: render_gemma(&b, m, n, add_assistant); break;
    case FLM_CHAT_LLAMA3: render_llama3(&b, m, n, add_assistant); break;
    case FLM_CHAT_LLAMA2: render_llama2(&b, m, n); break;
    case FLM_CHAT_PHI3: render_tagged(&b, m, n, add_assistant, "<|end|>"); break;
    case FLM_CHAT_ZEPHYR: render_tagged(&b, m, n, add_assistant, "<|endoftext|>"); break;
    case FLM_CHAT_COMMAND_R: render_command_r(&b, m, n, add_assistant); break;
    default:
        free(with_sys);
        free(b.p);
        return flm_fail(err, FLM_ERR_ARG, "chat: unknown chat format %d", (int)t->format);
    }
    free(with_sys);
    if (b.oom) {
        free(b.p);
        return flm_fail(err, FLM_ERR_NOMEM, "chat: out of memory rendering %zu messages", n);
    }
    *out = b.p;
    if (out_len) *out_len = b.len;
    return FLM_OK;
}
