/* chat_template.h — chat prompt formats of instruction-tuned models. Internal; pure string code (no model).
 *
 * A GGUF file may carry its Hugging Face chat template as a Jinja source string (tokenizer.chat_template). flashlm
 * does not run Jinja: like llama.cpp's llm_chat_detect_template (llama.cpp src/llama-chat.cpp) it recognises the
 * template family by marker substrings and renders that family's format in C. Families (and their markers):
 *   chatml  "<|im_start|>"                     <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n
 *   llama2  "[INST]"                           [INST] <<SYS>>\nSYS\n<</SYS>>\n\nUSER [/INST] REPLY </s><s>[INST] ...
 *   phi3    "<|assistant|>" and "<|end|>"      <|ROLE|>\nCONTENT<|end|>\n ... <|assistant|>\n
 *   zephyr  "<|user|>" and "<|endoftext|>"     <|ROLE|>\nCONTENT<|endoftext|>\n ... <|assistant|>\n
 *   gemma   "<start_of_turn>"                  <start_of_turn>user\nSYS\n\nUSER<end_of_turn>\n<start_of_turn>model\n
 *   llama3  "<|start_header_id|>", "<|end_header_id|>"
 *                                              <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> ...
 * The rendered text never contains the leading BOS token the Jinja templates put first ({{ bos_token }}): the
 * tokenizer adds it (tokenizer.ggml.add_bos_token), as llama.cpp does. Later BOS/EOS inside llama2 histories are
 * spelled "<s>" / "</s>" and must be tokenized with special-token parsing.
 *
 * Default system prompts: some templates emit a fixed system turn when the conversation has none (Qwen2.5: "You are
 * Qwen, created by Alibaba Cloud. You are a helpful assistant."; SmolLM2: "You are a helpful AI assistant named
 * SmolLM, trained by Hugging Face"). flm_chat_default_system() extracts that text from the template source, and
 * rendering adds it exactly where the template would. */
#ifndef FLM_FORMAT_CHAT_TEMPLATE_H
#define FLM_FORMAT_CHAT_TEMPLATE_H
#include <stdbool.h>
#include <stddef.h>
#include "flashlm.h"

typedef enum flm_chat_format {
    FLM_CHAT_UNKNOWN = 0,
    FLM_CHAT_CHATML,
    FLM_CHAT_LLAMA2,
    FLM_CHAT_LLAMA3,
    FLM_CHAT_GEMMA,
    FLM_CHAT_PHI3,
    FLM_CHAT_ZEPHYR,
    FLM_CHAT_COMMAND_R,
    FLM_CHAT_N_FORMATS /* not a format: how many values there are (a new format goes before it) */
} flm_chat_format;

/* The names --chat-template accepts, for messages. */
#define FLM_CHAT_FORMAT_NAMES FLM_CHAT_TEMPLATE_NAMES

/* "chatml", "llama2", ...; "unknown" for FLM_CHAT_UNKNOWN or an out-of-range value. */
const char *flm_chat_format_name(flm_chat_format f);
/* The format named name (one of FLM_CHAT_FORMAT_NAMES, exact lower case), or FLM_CHAT_UNKNOWN. */
flm_chat_format flm_chat_format_parse(const char *name);
/* The family of a Jinja template source of len bytes (need not be NUL-terminated), by the marker substrings listed
 * above, tried in llama.cpp's order; FLM_CHAT_UNKNOWN when none match (or tmpl is NULL / empty). */
flm_chat_format flm_chat_detect(const char *tmpl, size_t len);
/* The format implied by a GGUF general.architecture when the file has no template ("gemma", "gemma2", "gemma3" ->
 * gemma, as Gemma GGUFs converted without tokenizer_config.json lack one); FLM_CHAT_UNKNOWN otherwise. */
flm_chat_format flm_chat_from_arch(const char *arch);
/* The system prompt a chatml-family template renders when the conversation has no system message: the literal
 * text between "<|im_start|>system" + newline (a real one or the two characters "\n" of a Jinja string literal)
 * and "<|im_end|>", in the first such place where it is a plain string literal (no quote, brace or expression).
 * Jinja escapes \n \t \' \" \\ inside it are decoded. *out gets a malloc'd NUL-terminated copy, or NULL when the
 * template has none. Errors: FLM_ERR_NOMEM. */
flm_status flm_chat_default_system(const char *tmpl, size_t len, char **out);

/* A model's tool-call format (chat_tools.c). */
typedef enum { FLM_CHAT_TOOLS_NONE = 0, FLM_CHAT_TOOLS_QWEN } flm_chat_tools;
/* FLM_CHAT_TOOLS_QWEN when a chatml template source carries Qwen2.5's tool format (the markers <tools>, <tool_call>
 * and <tool_response>), else NONE. */
flm_chat_tools flm_chat_tools_detect(const char *tmpl, size_t len);

/* A resolved chat format. */
typedef struct flm_chat_template {
    flm_chat_format format;
    flm_chat_tools tools;  /* the model's tool-call format (only from the model's own template) */
    char *default_system;  /* malloc'd, or NULL: the system turn added when the conversation has none */
    const char *origin;    /* static: how the format was chosen: "--chat-template", "the model's template",
                              "the architecture", "the default: the model has no chat template" */
} flm_chat_template;

/* Choose the format: name (from --chat-template; may be NULL) wins; else the model's template source tmpl
 * (tmpl_len bytes, may be NULL) by flm_chat_detect, with its default system prompt; else arch
 * (flm_chat_from_arch; may be NULL); else chatml, llama.cpp's default for models without a template.
 * Errors: FLM_ERR_ARG (name is not one of FLM_CHAT_FORMAT_NAMES; the message lists them), FLM_ERR_UNSUPPORTED (the
 * model has a template of no known family: the message says to choose one with --chat-template), FLM_ERR_NOMEM.
 * Free with flm_chat_template_free (also after an error). */
flm_status flm_chat_template_init(flm_chat_template *t, const char *name, const char *tmpl, size_t tmpl_len,
                                  const char *arch, flm_error *err);
void flm_chat_template_free(flm_chat_template *t);

/* flm_chat_msg (one conversation turn) is the public one, include/flashlm.h. */
/* Render n messages into the prompt text the template produces for them, followed by the assistant-turn opening
 * when add_assistant (Jinja's add_generation_prompt). The template's default system prompt is inserted first when
 * messages[0] is not a system message. *out gets a malloc'd NUL-terminated string (caller frees), *out_len its
 * length (may be NULL). Errors: FLM_ERR_ARG (a NULL role or content, an unknown format), FLM_ERR_NOMEM. */
flm_status flm_chat_render(const flm_chat_template *t, const flm_chat_msg *msgs, size_t n, bool add_assistant,
                           char **out, size_t *out_len, flm_error *err);

/* ---- tools (chat_tools.c; the public flm_chat_tools_messages, flm_chat_parse_tool_calls in include/flashlm.h say
 * what they do; the calls' grammar is the session's: src/session/tool_grammar.c) ---- */
flm_status flm_chat_tools_rewrite(const flm_chat_template *t, flm_chat_tools kind, const flm_chat_msg *msgs,
                                  const char *const *tool_calls, size_t n, const char *tools, flm_chat_msg **out,
                                  size_t *n_out, flm_error *err);
void flm_chat_tools_msgs_free(flm_chat_msg *m, size_t n);
flm_status flm_chat_tools_parse(flm_chat_tools kind, const char *text, size_t len, char **content,
                                flm_tool_call **calls, size_t *n_calls, flm_error *err);
void flm_chat_tools_calls_free(flm_tool_call *c, size_t n);

#endif
