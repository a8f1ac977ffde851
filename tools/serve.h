/* serve.h — `flashlm serve` (tools/cmd_serve.c): the OpenAI-compatible request parser (tools/serve_req.c), kept
 * apart from the HTTP server so that it can be fuzzed alone (tests/fuzz/fuzz_serve.c). */
#ifndef FLM_TOOLS_SERVE_H
#define FLM_TOOLS_SERVE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flashlm.h"

#define SERVE_MAX_MSGS 4096   /* messages per chat request */
#define SERVE_ERR_MAX 256

/* One parsed request of POST /v1/chat/completions (chat) or POST /v1/completions. Strings are malloc'd copies
 * (serve_req_free frees them). */
typedef struct serve_req {
    bool chat;
    char *model;               /* "model" (NULL when absent) */
    flm_chat_msg *msgs;        /* chat: "messages" (role and content malloc'd; content parts of type "text" joined) */
    size_t n_msgs;
    char *prompt;              /* completions: "prompt" (a string, or an array of one string) */
    int32_t *prompt_ids;       /* completions: "prompt" as token ids (an array of integers; llama-server's), or NULL;
                                  the ids are checked against the vocabulary by the server */
    size_t n_prompt_ids;
    bool return_tokens;        /* "return_tokens" (llama-server's /completion: the ids generated) */
    bool no_cache;             /* "cache_prompt": false (llama-server's): evaluate the whole prompt again */
    bool stream;               /* "stream" */
    int n_choices;             /* "n": choices, 1..SERVE_MAX_CHOICES (each a generation of its own; not with stream) */
    bool include_usage;        /* "stream_options": {"include_usage": true}: a last chunk with usage, no choices */
    bool return_progress;      /* llama-server's "return_progress": streamed, events of the prompt's evaluation */
    bool verbose;              /* llama-server's "verbose": the answer carries "__verbose" (the prompt as text) */
    bool timings_per_token;    /* llama-server's "timings_per_token": streamed, each token's chunk carries "timings" */
    char **fields;             /* llama-server's "response_fields" (/completion): only these fields of the answer,
                                  "a/b" taking b of object a to the top level as "a/b"; NULL: all */
    int n_fields;
    bool has_temp, has_top_p, has_seed;
    float temperature;         /* "temperature", 0..2 */
    float top_p;               /* "top_p", 0..1 */
    int top_k;                 /* "top_k" (not OpenAI's; llama-server's), 0..: 0 = off; -1 = absent */
    uint64_t seed;             /* "seed" (a non-negative integer) */
    bool seed_random;          /* "seed": -1 (llama-server's LLAMA_DEFAULT_SEED): a new seed, over serve --seed too */
    long max_tokens;           /* "max_tokens", "max_completion_tokens" or llama-server's "n_predict" (-1 there: no
                                  limit), >= 0; -1 = absent (until the model ends or the context is full) */
    char *stop[FLM_GEN_STOP_MAX]; /* "stop": a string or an array of strings (non-empty, <= FLM_GEN_STOP_LEN bytes) */
    int n_stop;
    float presence_penalty;    /* "presence_penalty", -2..2 (OpenAI's); 0 = off */
    float frequency_penalty;   /* "frequency_penalty", -2..2 */
    float repeat_penalty;      /* "repeat_penalty" (llama-server's), 0..10; 0 = absent */
    int repeat_last_n;         /* "repeat_last_n" (llama-server's), -1..; -2 = absent (64) */
    float min_p;               /* "min_p" (llama-server's), 0..1; -1 = absent (0: off) */
    flm_logit_bias *bias;      /* "logit_bias": {"id": bias} (OpenAI's) or [[id, bias], ...] (llama-server's); bias
                                  -100..100, or false (llama-server's: banned, -inf); ids checked by the server */
    size_t n_bias;
    char **bias_text;          /* "logit_bias" entries given as text (llama-server's): each of its tokens (tokenized
                                  plainly, no BOS, by the server) gets bias_text_val[i] */
    float *bias_text_val;
    size_t n_bias_text;
    bool logprobs;             /* chat: "logprobs": true; completions: "logprobs": N (N >= 0) or llama-server's
                                  "n_probs" > 0 */
    int top_logprobs;          /* chat: "top_logprobs" 0..20 (needs "logprobs": true); completions: N, 0..20 */
    bool post_sampling;        /* llama-server's "post_sampling_probs": the probabilities the tokens were drawn with
                                  ("prob", "top_probs"; flm_gen_params.post_sampling), not the model's log-probs */
    flm_grammar *grammar;      /* the constraint of "response_format" (json_object, json_schema), llama-server's
                                  "json_schema" or "grammar" (GBNF), compiled (flm_grammar_*); NULL: none */
    const char *grammar_from;  /* the field it came from (static), for messages */
    /* tools (tools/serve_tools.c) */
    char **tool_calls;         /* chat: per message, an assistant's "tool_calls" (a JSON array, printed), or NULL */
    bool tool_turns;           /* a "tool" message or an assistant message with tool_calls */
    char *tools;               /* "tools": OpenAI's function tools (a JSON array, printed), NULL when none */
    int tool_choice;           /* SERVE_TOOL_* ("auto" with tools, "none" without, unless given) */
    char *tool_name;           /* SERVE_TOOL_NAMED: the function it must call */
    bool parallel_tool_calls;  /* "parallel_tool_calls" (default true): required may make several calls */
    bool parse_tools;          /* set by serve_tools_prepare: the reply's calls become "tool_calls" */
} serve_req;
enum { SERVE_TOOL_NONE, SERVE_TOOL_AUTO, SERVE_TOOL_REQUIRED, SERVE_TOOL_NAMED };
#define SERVE_MAX_BIAS 1024    /* logit_bias entries per request */
#define SERVE_MAX_CHOICES 8    /* "n" at most; also prompts per request (llama-server's several prompts) */

struct cJSON;
/* Whether every top-level field of the JSON object o is one of known[0, n_known); false with msg (cap bytes) naming
 * the first other one and the route (e.g. "/tokenize"), for a 400: a field is honoured or refused by name. */
bool serve_fields_known(const struct cJSON *o, const char *const *known, size_t n_known, const char *route, char *msg,
                        size_t cap);
/* Parse a request body (len bytes, not necessarily NUL-terminated) for the chat (chat = true) or the text
 * completions endpoint. Returns 0 and fills *r, or an HTTP status (400: malformed JSON, a field of the wrong type or
 * out of range, a missing required field, n outside 1..8; 500: out of memory) with a one-line message in msg (cap bytes)
 * and *r freed. A field not in serve_req.c's FIELD_RULES is refused by name (400). */
int serve_parse_request(const char *body, size_t len, bool chat, serve_req *r, char *msg, size_t cap);
/* A request's "verbose" when it does not say (serve --verbose sets it: llama-server's verbosity > 9 does the same). */
extern bool serve_verbose_default;
struct cJSON;
/* A request body (len bytes) parsed as JSON: NULL with a one-line message in msg when it is not UTF-8 (the byte
 * named), not JSON, or followed by anything but whitespace. Free with cJSON_Delete. */
struct cJSON *serve_parse_json(const char *body, size_t len, char *msg, size_t cap);
void serve_req_free(serve_req *r);

/* ---- tools (tools/serve_tools.c) ---- */
/* The request's "tools", "tool_choice", "parallel_tool_calls", and the deprecated "functions" / "function_call"
 * (refused by name) into r (chat: the endpoint; elsewhere tools are refused). 0, or 400 / 500 with msg. */
int serve_parse_tools(const struct cJSON *root, bool chat, serve_req *r, char *msg, size_t cap);
/* Message i's "tool_calls" (an assistant's: [{"id", "type": "function", "function": {"name", "arguments": a JSON
 * string}}]) checked and printed into *out (NULL when absent, null or empty). 0, or 400 / 500 with msg. */
int serve_parse_msg_tool_calls(const struct cJSON *m, size_t i, char **out, char *msg, size_t cap);
/* With the served chat format: a request with tools or tool turns and a template without a tool format is 400
 * naming 'tools'; the messages are rewritten in the model's format (flm_chat_tools_messages); tool_choice required
 * or named compiles the calls' grammar (with response_format too: 400); parse_tools set. 0, or 400 / 500 with msg. */
int serve_tools_prepare(serve_req *r, const flm_chat *tmpl, char *msg, size_t cap);

/* The reply split as it streams: content text, and each call block in the model's format as a call. The text that
 * may still begin a call is held back, and trailing whitespace until more content follows (dropped at the end when
 * there were calls). A block that opens as the format writes a call ({"name": "NAME", "arguments": {...) has its
 * arguments followed as JSON while they come, whitespace outside strings dropped (the same text streamed or not);
 * in incremental mode they are given out piece by piece as OpenAI streams them. Any other block is parsed whole when
 * it closes (flm_chat_parse_tool_calls): a call, or text when it is not one. */
typedef struct serve_tool_stream {
    const flm_chat *tmpl;
    bool incremental;          /* set by the caller: a streamed reply whose calls a grammar forces (tool_choice
                                  required or named: the call's name first, then its arguments as they come); an
                                  unforced call is given whole once it closes and parses, streamed or not, so both
                                  agree on what is a call */
    const char *tools;         /* set by the caller: the request's tools (a JSON array): a block calling a function
                                  not among them is text, as the model's prose (OpenAI returns declared calls only) */
    char *buf, *ws;            /* text not yet given out; whitespace held */
    size_t len, cap, n_ws, cap_ws;
    bool in_call;
    int n_calls;
    bool oom;
    int phase;                 /* in a call: 0 its opening not yet read, 1 in the arguments, 2 after them, 3 a block
                                  of another shape (parsed whole) */
    size_t at;                 /* phase 1 and 2: the bytes of buf read */
    int depth;                 /* phase 1: the arguments' nesting depth (0: they ended) */
    bool in_str, esc;          /* phase 1: inside a string, after a backslash */
    char name[72];             /* the call's name (phase 1 and 2) */
    char *args;                /* its arguments so far, whitespace outside strings dropped */
    size_t n_args, cap_args, args_out; /* args_out: given out already (incremental) */
} serve_tool_stream;
typedef void (*serve_content_fn)(void *user, const char *text, size_t len);
/* A call (index from 0): whole (name and arguments), or in incremental mode first (name, NULL), then (NULL, piece)
 * for each piece of its arguments. */
typedef void (*serve_call_fn)(void *user, int index, const char *name, const char *arguments);
/* Feed len bytes of the reply (final: the end; all is given out). */
void serve_tool_stream_feed(serve_tool_stream *t, const char *text, size_t len, bool final, serve_content_fn content,
                            serve_call_fn call, void *user);
void serve_tool_stream_free(serve_tool_stream *t);

#endif
