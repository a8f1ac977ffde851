/* cmd_serve.c — `flashlm serve`: an OpenAI-compatible HTTP server (libmicrohttpd, cJSON) over the library's sessions
 * (flm_session_*), and a chat page at / (tools/serve_page.html, embedded at build time).
 *
 * Threads: libmicrohttpd runs one thread per connection; it parses the request (tools/serve_req.c) and queues a job.
 * Each slot (--parallel N; default 1) is a worker thread with a session on its own sequence of one shared context
 * (flm_params.n_seq = N: the weights held once, a KV cache per slot, one budget; the slots' passes take turns on
 * the context, flm_seq_acquire); with an explicit speculative option (--draft, --draft-ngram, --draft-self) each
 * slot opens its own context instead, with budget / N and its own draft model. A slot takes jobs in order,
 * feeds the prompt (keeping the prefix its cache already holds) and generates, appending the response (server-sent
 * events when streaming) to the job's buffer, which the connection's thread sends. A connection that closes cancels
 * its job (queued: dropped; running: flm_session_cancel), so its slot serves the next request. A full queue (--queue)
 * answers 503. SIGINT or SIGTERM: running generations are cancelled, queued ones answered 503, the daemon stopped,
 * the contexts closed. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "cli.h"
#include "flashlm.h"
#include "serve.h"
#include "serve_http.h"
#include "serve_page.h" /* SERVE_PAGE, SERVE_PAGE_LEN: generated from tools/serve_page.html (CMakeLists.txt) */

static const char *SERVE_HELP =
    "usage: flashlm serve -m MODEL [options]\n"
    "\n"
    "Serve the model over HTTP with OpenAI's API (POST /v1/chat/completions, POST /v1/completions, streaming or not;\n"
    "GET /v1/models, /v1/models/ID; the same without /v1), llama-server's (POST /completion, /tokenize, /detokenize,\n"
    "/apply-template; GET /props, /slots), GET /health, GET /metrics (Prometheus text) and a chat page at /. The model\n"
    "is opened once, its weights shared by the slots, each slot a sequence with its own KV cache, all under the one\n"
    "budget (--mem); requests queue and run one at a time per slot, the slots' passes taking turns.\n"
    "\n"
    "  -m, --model PATH     model file: .gguf or .flm, or a pulled model's name\n"
    "      --host ADDR[,ADDR...]  numeric IPv4/IPv6 addresses (or localhost) to listen on (default 127.0.0.1: this\n"
    "                       machine only)\n"
    "      --port N         TCP port (default 8080; 0: any free one, printed on stderr)\n"
    "      --api-key KEY    require \"Authorization: Bearer KEY\" (or \"x-api-key: KEY\") on every endpoint but /health\n"
    "                       and the page; any Host and Origin may then call\n"
    "      --cors ORIGIN    a web page of ORIGIN (\"http://host:port\"; \"localhost\": any loopback origin; \"*\": any)\n"
    "                       may call (CORS, preflight answered); repeat or separate with commas. Without --api-key\n"
    "                       only the page's own origin and these may POST, the Host must be localhost or an address\n"
    "                       listened on, and a POST must be application/json\n"
    "      --parallel N     slots: N sequences of one context, each with its own KV cache of -c / N tokens (default\n"
    "                       1); with --draft, --draft-ngram or --draft-self: N contexts of budget / N each\n"
    "      --queue N        requests that may wait for a busy slot (default 16); beyond: 503\n"
    "      --max-body BYTES largest request body (default 1M); larger: 413\n"
    "      --max-connections N  open connections (default 2048); beyond: 503 and closed\n"
    "      --header-timeout S   a request's headers must arrive within S seconds of the connection's start or of the\n"
    "                       previous answer (default 30; then 408, or an idle connection closed)\n"
    "      --body-timeout S a request's body must arrive within S seconds of its headers (default 60; then 408)\n"
    "      --timeout S      a connection with no traffic at all for S seconds is closed (default 600)\n"
    "      --chat-template NAME  chat format instead of the model's: " FLM_CHAT_TEMPLATE_NAMES "\n"
    "      --allow-special-in-content  a message's \"<|im_end|>\" is the control token (default: plain text)\n"
    "  -a, --alias NAME[,NAME...]  the model's names in the API (repeat or separate with commas); its id is the first\n"
    "                       in byte order, as llama-server's (default: the file name without its extension)\n"
    "      --tags TAG[,TAG...]  tags listed in GET /v1/models (informational)\n"
    "      --strict-model   a request naming a model that is not the id or an alias gets 404 (default: the served\n"
    "                       model answers any name)\n"
    "      --temp T, --seed N, --n-predict N  defaults for requests that do not give temperature, seed, max_tokens\n"
    "      --no-slots       GET /slots answers 501 (default: it lists the slots, as llama-server's; --slots)\n"
    "      --no-ui          no chat page at /\n"
    "      --metrics        GET /metrics answers (Prometheus text); default: 501, as llama-server's (the counters\n"
    "                       tell a caller what others asked and how much)\n"
    "      --context-shift  when a reply fills the context, forget the older half after BOS and go on (as run's);\n"
    "                       default: the reply ends there (finish_reason \"length\")\n"
    "  -v, --verbose        print the library's debug messages, and answer with llama-server's \"__verbose\" (the\n"
    "                       prompt as text and the native fields) unless a request says \"verbose\": false\n"
    "  -h, --help           this help\n"
    "\n"
    "Speculative decoding (as flashlm run; per slot, inside the slot's share of --mem: a --draft model is opened in\n"
    "each slot):\n";

/* OpenAI's system_fingerprint: the backend that answered (opaque to clients). */
#define SYSTEM_FINGERPRINT "flashlm-" FLM_VERSION_STRING

/* ---- jobs and slots --------------------------------------------------------------------------------------------- */

enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_STREAMING, JOB_DONE };

typedef struct job {
    serve_req req;
    bool native;             /* llama-server's /completion: its response fields, not OpenAI's */
    bool embed;              /* POST /v1/embeddings: emb_ids[i] (emb_n[i] tokens each) to embed */
    bool emb_base64;         /* "encoding_format": "base64" */
    int32_t **emb_ids;
    uint32_t *emb_n;
    size_t n_emb;
    char id[48];
    long created;
    int refs;                /* the connection and, once queued, the worker: freed at 0 (under srv.mu) */
    enum job_state state;
    bool gone;               /* the client closed the connection (or the server stops): cancel */
    int status;              /* HTTP status when failed (>= 400), with errmsg / errcode */
    char errmsg[FLM_ERROR_MSG_MAX + 256];
    const char *errcode;
    cli_buf out;             /* the response body produced so far */
    size_t sent;             /* bytes of out already handed to libmicrohttpd */
    struct slot *slot;       /* running on it */
    struct job *next;        /* the queue */
    int fd;                  /* the connection's socket, to notice a client that left */
    /* results */
    cli_buf text;            /* the reply (non-streaming) */
    flm_gen_result res;
    size_t n_prompt, n_reused;
    size_t n_evaluated;      /* the prompt's tokens the context holds so far (its evaluation's progress) */
    bool first_chunk;
    uint64_t seed;           /* the sampler's seed (given or drawn) */
    flm_sampler_params sp;   /* the sampler's settings (generation_settings; bias not kept) */
    int32_t *pids;           /* the prompt's tokens (what the slot's context is made to hold) */
    size_t n_pids;
    char *ptext;             /* their text, control tokens spelled out (llama-server's "prompt"; "__verbose") */
    int choice;              /* its index among the request's jobs (several prompts, "n" choices) */
    bool early;              /* return_progress: the stream began before the prompt was evaluated */
    double t_prompt;         /* when the prompt's evaluation began (ms, cli_now_ms) */
    bool first_of_prompt;    /* the first choice of its prompt (the usage counts a prompt once) */
    long err_n_prompt;       /* a prompt that does not fit: its tokens (llama-server's error fields), else -1 */
    int32_t *ids;            /* the tokens generated (native /completion's "tokens") */
    size_t n_ids, cap_ids;
    int slot_index;
    double prompt_ms, gen_ms;
    double live_gen_ms;      /* "timings_per_token": the generation's ms so far, over live_n tokens */
    long live_n;
    bool truncated;          /* the context filled or shifted */
    cJSON *lp;               /* "logprobs" (non-streaming, with logprobs): chat's {"content": [...]}, completions'
                                {"tokens", "token_logprobs", "top_logprobs", "text_offset"} */
    size_t lp_off;           /* completions' text_offset: bytes of the pieces so far */
    flm_ctx *ctx;            /* the slot's (the pieces of the alternatives) */
    serve_tool_stream ts;    /* with tools: the reply split into content and calls (tools/serve_tools.c) */
    cJSON *calls;            /* with tools, non-streaming: the message's "tool_calls" */
    bool tool_fail;          /* out of memory giving out content or calls */
} job;

typedef struct slot {
    int index;
    flm_ctx *ctx;           /* the shared context (its sequence `index`), or the slot's own (sequence 0) */
    uint32_t seq;
    flm_session *sess;
    flm_chat *tmpl;
    pthread_t thread;
    job *cur;
    long n_past;            /* tokens its cache holds (GET /slots) */
    cli_spec_session *spec; /* speculative decoding: the draft model, the budget's split (tools/spec_cli.c) */
} slot;

static struct server {
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* queue changes, job progress */
    job *head, *tail;
    int n_queued, queue_cap, n_running;
    bool stopping;
    slot *slots;
    int n_slots;
    const char *model_id;    /* the id in the API: the first alias in byte order (as llama-server's), or the file name */
    const char *model_path;
    uint64_t model_bytes;    /* the model file's size (GET /v1/models' meta.size) */
    uint32_t n_vocab, n_ctx_train, n_embd; /* the model's facts for GET /v1/models' meta */
    bool strict_model;       /* --strict-model: a request naming another model is 404 */
    bool slots_on, no_ui;    /* GET /slots (default on; --no-slots), --no-ui (no page at /) */
    bool metrics_on;         /* GET /metrics (--metrics; default off: 501, as llama-server's) */
    bool has_temp, has_seed; /* --temp, --seed: defaults for requests that do not say */
    float temp;
    uint64_t seed;
    long n_predict;          /* --n-predict: the default max_tokens (-1: none) */
    const char *api_key;
    size_t max_body;
    uint32_t n_ctx;
    uint64_t budget;
    uint64_t planned;        /* what the contexts' plans hold (flm_plan_info.total, every slot's) */
    uint64_t req_cap, req_held; /* memory for requests in flight (0: no --mem, no limit): what they may hold, what
                                   they hold (REQ_COST each, from its headers to its end) */
    long next_id;
    /* metrics */
    uint64_t requests, errors, prompt_tokens, reused_tokens, gen_tokens, bytes_read, cancelled;
    uint64_t passes, drafted, accepted; /* speculative decoding: target passes while generating, drafts */
    double gen_ms, prompt_ms, io_ms, compute_ms;
    uint64_t n_decode, n_tokens_max; /* model passes (prompt batches, generation steps); most tokens a slot held */
    double last_prompt_tps;
    int n_batch;             /* the prompt's batch (-b), for counting passes */
    double start_unix;
    double last_tps;
    bool shared;             /* the slots are sequences of one context (slots[0].ctx) */
} srv = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .slots_on = true};

/* A set of names (--alias, --tags): sorted in byte order and without repeats, as llama-server's std::set. */
#define SERVE_NAMES_MAX 32
typedef struct name_set {
    const char *v[SERVE_NAMES_MAX];
    int n;
    char buf[2048]; /* the names' copies */
    size_t used;
} name_set;
static name_set aliases, tags;

/* Add the comma-separated names of list (each stripped of spaces; empty ones skipped) to ns. false (with what on
 * stderr) when the set or its buffer is full. */
static bool name_set_add(name_set *ns, const char *list, const char *opt) {
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *a = p, *b = p + len;
        p = e ? e + 1 : b;
        while (a < b && isspace((unsigned char)*a)) a++;
        while (b > a && isspace((unsigned char)b[-1])) b--;
        if (a == b) continue;
        if (ns->used + (size_t)(b - a) + 1 > sizeof ns->buf || ns->n == SERVE_NAMES_MAX) {
            fprintf(stderr, "flashlm: %s: too many names (at most %d, %zu bytes in all)\n", opt, SERVE_NAMES_MAX,
                    sizeof ns->buf);
            return false;
        }
        char *copy = ns->buf + ns->used;
        memcpy(copy, a, (size_t)(b - a));
        copy[b - a] = 0;
        int at = 0, c = 1;
        while (at < ns->n && (c = strcmp(ns->v[at], copy)) < 0) at++;
        if (at < ns->n && c == 0) continue; /* a repeat */
        ns->used += (size_t)(b - a) + 1;
        memmove(ns->v + at + 1, ns->v + at, (size_t)(ns->n - at) * sizeof *ns->v);
        ns->v[at] = copy;
        ns->n++;
    }
    return true;
}

/* Whether name is one of the served model's: its id or an alias. */
static bool model_named(const char *name) {
    if (!strcmp(name, srv.model_id)) return true;
    for (int i = 0; i < aliases.n; i++)
        if (!strcmp(name, aliases.v[i])) return true;
    return false;
}

static void job_unref_locked(job *j) {
    if (--j->refs > 0) return;
    serve_req_free(&j->req);
    cli_buf_free(&j->out);
    cli_buf_free(&j->text);
    free(j->ids);
    free(j->pids);
    free(j->ptext);
    for (size_t i = 0; i < j->n_emb; i++) free(j->emb_ids[i]);
    free(j->emb_ids);
    free(j->emb_n);
    cJSON_Delete(j->lp);
    cJSON_Delete(j->calls);
    serve_tool_stream_free(&j->ts);
    free(j);
}

/* Whether the client is gone: its socket reports an error or a hang-up (a reset: the peer closed a connection our
 * writes reached). The end of its sending side alone (a read of 0 bytes) is not: a client may half-close after its
 * request (`nc -N`, RFC 9112 section 9.6) and still read the answer. A client that closes while nothing is written
 * to it is noticed at the next write (a stream's next token). */
static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = 0};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* Whether the client has closed its sending side (a read would give 0 bytes): it either half-closed or left. */
static bool client_eof(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & POLLRDHUP) return true;
    char c;
    return (p.revents & POLLIN) && recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Wait (srv.mu held) up to 50 ms for progress. */
static void wait_a_little(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&srv.cv, &srv.mu, &ts);
}

/* The client left or the server stops: drop the job from the queue, or cancel its generation (srv.mu held). */
static void job_abandon_locked(job *j) {
    if (j->gone) return;
    j->gone = true;
    if (j->state == JOB_QUEUED) {
        job **pp = &srv.head, *prev = NULL;
        while (*pp && *pp != j) { prev = *pp; pp = &(*pp)->next; }
        if (*pp) {
            *pp = j->next;
            if (srv.tail == j) srv.tail = prev;
            srv.n_queued--;
            j->state = JOB_DONE;
            job_unref_locked(j); /* the queue's reference */
        }
    } else if (j->state != JOB_DONE && j->slot) {
        flm_session_cancel(j->slot->sess);
    }
    srv.cancelled++;
}

/* ---- JSON output ------------------------------------------------------------------------------------------------ */

static bool out_add(job *j, const char *s) { return cli_buf_add(&j->out, s, strlen(s)); }

/* Print a cJSON object as "data: {...}\n\n" into the job's output; frees o. */
static bool out_event(job *j, cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    bool ok = s && out_add(j, "data: ") && out_add(j, s) && out_add(j, "\n\n");
    free(s);
    return ok;
}

static cJSON *usage_json(const job *j) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)j->res.n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(j->n_prompt + (size_t)j->res.n_gen));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)j->n_reused);
    return u;
}

static cJSON *chunk_base(const job *j) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", j->req.chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", srv.model_id);
    cJSON_AddStringToObject(o, "system_fingerprint", SYSTEM_FINGERPRINT);
    return o;
}

/* One choice of a chunk: chat's delta, or a completion's text. */
static cJSON *chunk_choice(const job *j, cJSON *o, const char *text, size_t len, const char *finish) {
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    char *t = malloc(len + 1);
    if (t) { memcpy(t, text, len); t[len] = 0; }
    if (j->req.chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (j->first_chunk) cJSON_AddStringToObject(d, "role", "assistant");
        if (len || !finish) cJSON_AddStringToObject(d, "content", t ? t : "");
    } else {
        cJSON_AddStringToObject(c, "text", t ? t : "");
        cJSON_AddNullToObject(c, "logprobs");
    }
    free(t);
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

/* A chat chunk whose one choice has this delta (taken) and no finish_reason. */
static cJSON *delta_chunk(const job *j, cJSON *delta) {
    cJSON *o = chunk_base(j), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), c);
    cJSON_AddNumberToObject(c, "index", 0);
    cJSON_AddItemToObject(c, "delta", delta);
    cJSON_AddNullToObject(c, "finish_reason");
    return o;
}

/* A chat stream's first chunk: the role alone (content null), as OpenAI and llama-server send it. */
static bool role_chunk(job *j) {
    if (!j->first_chunk) return true;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "role", "assistant");
    cJSON_AddNullToObject(d, "content");
    j->first_chunk = false;
    return out_event(j, delta_chunk(j, d));
}

/* ---- tools: the reply's content and calls (serve_tool_stream) into the response ---- */

static void tool_content(void *user, const char *text, size_t len) {
    job *j = user;
    if (!len) return;
    if (!j->req.stream) {
        if (!cli_buf_add(&j->text, text, len)) j->tool_fail = true;
        return;
    }
    if (!role_chunk(j)) j->tool_fail = true;
    cJSON *o = chunk_base(j);
    chunk_choice(j, o, text, len, NULL);
    if (!out_event(j, o)) j->tool_fail = true;
}

/* A call: non-streaming, into the message's tool_calls; streamed as OpenAI sends it (serve_tool_stream's incremental
 * mode), a delta with the call's index, id, type and name (arguments ""), then deltas with pieces of its arguments as
 * the model writes them. */
static void tool_call(void *user, int index, const char *name, const char *args) {
    job *j = user;
    cJSON *c = cJSON_CreateObject(), *f;
    if (j->req.stream) cJSON_AddNumberToObject(c, "index", index);
    if (name) {
        char id[96];
        snprintf(id, sizeof id, "call_%s_%d", j->id, index);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
    }
    f = cJSON_AddObjectToObject(c, "function");
    if (name) cJSON_AddStringToObject(f, "name", name);
    /* streamed, a delta with the name has arguments "" (OpenAI's first delta of a call) */
    cJSON_AddStringToObject(f, "arguments", j->req.stream && name ? "" : args ? args : "");
    if (!j->req.stream) {
        if (!j->calls) j->calls = cJSON_CreateArray();
        if (!j->calls || !cJSON_AddItemToArray(j->calls, c)) { cJSON_Delete(c); j->tool_fail = true; }
        return;
    }
    if (!role_chunk(j)) j->tool_fail = true;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), c);
    if (!out_event(j, delta_chunk(j, d))) j->tool_fail = true;
    if (name && args) { /* a whole call (a block of another shape, parsed when it closed): its arguments after */
        c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", index);
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "arguments", args);
        d = cJSON_CreateObject();
        cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), c);
        if (!out_event(j, delta_chunk(j, d))) j->tool_fail = true;
    }
}

static const char *finish_reason(const flm_gen_result *r) {
    return r->eog || r->stopped || r->complete ? "stop" : "length";
}

/* An OpenAI-shaped error body. A prompt that does not fit the context (code "context_length_exceeded") has
 * llama-server's type "exceed_context_size_error" and its fields n_prompt_tokens (when n_prompt >= 0) and n_ctx. */
static char *error_json_ex(int status, const char *msg, const char *code, long n_prompt) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    const bool ctx = code && !strcmp(code, "context_length_exceeded");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", status == 401 ? "authentication_error" : status >= 500 ? "server_error"
                                       : status == 404 ? "not_found_error" : ctx ? "exceed_context_size_error"
                                       : "invalid_request_error");
    if (ctx) {
        if (n_prompt >= 0) cJSON_AddNumberToObject(e, "n_prompt_tokens", (double)n_prompt);
        cJSON_AddNumberToObject(e, "n_ctx", srv.n_ctx);
    }
    cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static char *error_json(int status, const char *msg, const char *code) { return error_json_ex(status, msg, code, -1); }

/* llama-server's "timings" of a request (its front ends and tools read them). */
static cJSON *timings_json_at(const job *j, double gn, double gen_ms) {
    cJSON *t = cJSON_CreateObject();
    double pn = (double)(j->n_prompt - j->n_reused);
    cJSON_AddNumberToObject(t, "cache_n", (double)j->n_reused);
    cJSON_AddNumberToObject(t, "prompt_n", pn);
    cJSON_AddNumberToObject(t, "prompt_ms", j->prompt_ms);
    cJSON_AddNumberToObject(t, "prompt_per_token_ms", pn > 0 ? j->prompt_ms / pn : 0);
    cJSON_AddNumberToObject(t, "prompt_per_second", j->prompt_ms > 0 ? pn * 1e3 / j->prompt_ms : 0);
    cJSON_AddNumberToObject(t, "predicted_n", gn);
    cJSON_AddNumberToObject(t, "predicted_ms", gen_ms);
    /* the first token comes from the prompt's logits: the rate is over the n - 1 decode steps (llama-server's) */
    cJSON_AddNumberToObject(t, "predicted_per_token_ms", gn > 1 ? gen_ms / (gn - 1) : 0);
    cJSON_AddNumberToObject(t, "predicted_per_second", gn > 1 && gen_ms > 0 ? (gn - 1) * 1e3 / gen_ms : 0);
    return t;
}

static cJSON *timings_json(const job *j) { return timings_json_at(j, (double)j->res.n_gen, j->gen_ms); }

static const char *stop_type(const flm_gen_result *r) {
    return r->eog || r->complete ? "eos" : r->stopped ? "word" : r->limit || r->ctx_full ? "limit" : "none";
}


/* A sampler's settings under llama-server's names (its generation_settings / default_generation_settings params):
 * flashlm's, and llama-server's adaptive-p sampler, which flashlm does not have, as off (its defaults; a request
 * that sets adaptive_target is refused by name). */
static void sampler_json(cJSON *g, const flm_sampler_params *sp) {
    cJSON_AddNumberToObject(g, "temperature", sp->temp);
    cJSON_AddNumberToObject(g, "top_k", sp->top_k);
    cJSON_AddNumberToObject(g, "top_p", sp->top_p);
    cJSON_AddNumberToObject(g, "min_p", sp->min_p);
    cJSON_AddNumberToObject(g, "repeat_penalty", sp->repeat_penalty);
    cJSON_AddNumberToObject(g, "repeat_last_n", sp->penalty_last_n);
    cJSON_AddNumberToObject(g, "presence_penalty", sp->presence_penalty);
    cJSON_AddNumberToObject(g, "frequency_penalty", sp->frequency_penalty);
    cJSON_AddNumberToObject(g, "adaptive_target", -1.0);
    cJSON_AddNumberToObject(g, "adaptive_decay", 0.9);
}
/* llama-server's /completion object: a streamed token's (final = false) or the whole result's. */
static cJSON *native_json(const job *j, const char *text, size_t len, const int32_t *ids, size_t n_ids, bool final) {
    cJSON *o = cJSON_CreateObject();
    char *t = malloc(len + 1);
    if (t) { memcpy(t, text, len); t[len] = 0; }
    cJSON_AddNumberToObject(o, "index", j->choice); /* several prompts: each its own (llama-server's task index) */
    cJSON_AddStringToObject(o, "content", t ? t : "");
    cJSON *a = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = 0; i < n_ids; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    cJSON_AddNumberToObject(o, "id_slot", j->slot_index);
    cJSON_AddBoolToObject(o, "stop", final);
    if (final) {
        const serve_req *q = &j->req;
        cJSON_AddStringToObject(o, "model", srv.model_id);
        cJSON_AddNumberToObject(o, "tokens_predicted", (double)j->res.n_gen);
        cJSON_AddNumberToObject(o, "tokens_evaluated", (double)j->n_prompt);
        cJSON *g = cJSON_AddObjectToObject(o, "generation_settings");
        cJSON_AddNumberToObject(g, "n_predict", (double)(q->max_tokens >= 0 ? q->max_tokens : srv.n_predict));
        cJSON_AddNumberToObject(g, "seed", (double)j->seed);
        cJSON_AddNumberToObject(g, "n_ctx", srv.n_ctx);
        sampler_json(g, &j->sp);
        cJSON_AddStringToObject(o, "prompt", j->ptext ? j->ptext : "");
        cJSON_AddBoolToObject(o, "has_new_line", t && strchr(t, '\n'));
        cJSON_AddBoolToObject(o, "truncated", j->truncated);
        cJSON_AddStringToObject(o, "stop_type", stop_type(&j->res));
        cJSON_AddStringToObject(o, "stopping_word", j->res.stopped && j->res.stop_index >= 0 &&
                                                    j->res.stop_index < q->n_stop ? q->stop[j->res.stop_index] : "");
        cJSON_AddNumberToObject(o, "tokens_cached", (double)(j->n_prompt + (size_t)j->res.n_gen));
        cJSON_AddItemToObject(o, "timings", timings_json(j));
    }
    free(t);
    return o;
}

/* ---- logprobs (OpenAI's: the model's log-softmax at temperature 1, flm_logprobs) -------------------------------- */

/* A token's piece as a JSON string: valid UTF-8 as it is, else each byte of an incomplete or invalid sequence as
 * "\\xNN" (a byte-level token can end inside a character; the "bytes" array has the exact bytes). */
static cJSON *piece_string(const char *p, size_t n) {
    char *t = malloc(4 * n + 1);
    if (!t) return cJSON_CreateString("");
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)p[i];
        size_t want = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        bool ok = want > 0 && i + want <= n && !(c == 0);
        for (size_t k = 1; ok && k < want; k++) ok = ((unsigned char)p[i + k] & 0xC0) == 0x80;
        if (ok) { memcpy(t + o, p + i, want); o += want; i += want; }
        else { o += (size_t)sprintf(t + o, "\\x%02x", c); i++; }
    }
    t[o] = 0;
    cJSON *js = cJSON_CreateString(t);
    free(t);
    return js;
}

static cJSON *bytes_array(const char *p, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)p[i]));
    return a;
}

/* One token into a "logprobs" object (created when *lp is NULL): chat's content entry {token, logprob, bytes,
 * top_logprobs: [{token, logprob, bytes}]} (with post_sampling_probs llama-server's {token, prob, bytes, top_probs:
 * [{token, prob, bytes}]}), or completions' parallel arrays. */
static void lp_add(job *j, cJSON **lp, const flm_gen_token *t) {
    size_t n;
    const char *piece = flm_token_piece(j->ctx, t->prev, t->id, &n);
    const bool chat_style = j->req.chat || j->native; /* llama-server's completion_probabilities: the same entries */
    if (!*lp) {
        *lp = cJSON_CreateObject();
        if (chat_style) {
            cJSON_AddArrayToObject(*lp, "content");
            cJSON_AddNullToObject(*lp, "refusal");
        } else {
            cJSON_AddArrayToObject(*lp, "tokens");
            cJSON_AddArrayToObject(*lp, "token_logprobs");
            cJSON_AddArrayToObject(*lp, "top_logprobs");
            cJSON_AddArrayToObject(*lp, "text_offset");
        }
    }
    if (chat_style) {
        cJSON *e = cJSON_CreateObject(), *top = cJSON_CreateArray();
        if (j->native) cJSON_AddNumberToObject(e, "id", t->id);
        const bool post = j->req.post_sampling; /* llama-server's post_sampling_probs: probabilities */
        cJSON_AddItemToObject(e, "token", piece_string(piece, n));
        if (post) cJSON_AddNumberToObject(e, "prob", expf(t->logprob));
        else cJSON_AddNumberToObject(e, "logprob", t->logprob);
        cJSON_AddItemToObject(e, "bytes", bytes_array(piece, n));
        for (int k = 0; k < t->n_top; k++) {
            size_t m;
            const char *q = flm_token_piece(j->ctx, t->prev, t->top_id[k], &m);
            cJSON *a = cJSON_CreateObject();
            if (j->native) cJSON_AddNumberToObject(a, "id", t->top_id[k]);
            cJSON_AddItemToObject(a, "token", piece_string(q, m));
            if (post) cJSON_AddNumberToObject(a, "prob", expf(t->top_logprob[k]));
            else cJSON_AddNumberToObject(a, "logprob", t->top_logprob[k]);
            cJSON_AddItemToObject(a, "bytes", bytes_array(q, m));
            cJSON_AddItemToArray(top, a);
        }
        cJSON_AddItemToObject(e, post ? "top_probs" : "top_logprobs", top);
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "content"), e);
    } else {
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "tokens"), piece_string(piece, n));
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "token_logprobs"), cJSON_CreateNumber(t->logprob));
        cJSON *top = cJSON_CreateObject();
        for (int k = 0; k < t->n_top; k++) {
            size_t m;
            const char *q = flm_token_piece(j->ctx, t->prev, t->top_id[k], &m);
            cJSON *key = piece_string(q, m);
            if (!cJSON_GetObjectItemCaseSensitive(top, key->valuestring)) /* two ids, one text: the likelier */
                cJSON_AddNumberToObject(top, key->valuestring, t->top_logprob[k]);
            cJSON_Delete(key);
        }
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "top_logprobs"), top);
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "text_offset"), cJSON_CreateNumber((double)j->lp_off));
        j->lp_off += n;
    }
}

/* The text of n prompt tokens as llama-server shows a prompt: each token's piece, control tokens (BOS, "<|im_start|>")
 * spelled out, the first piece without the space a SentencePiece vocabulary puts before a text; bytes that are not
 * whole UTF-8 (token ids in) as piece_string writes them. malloc'd, NULL when out of memory. */
static char *ids_text(const flm_ctx *ctx, const int32_t *ids, size_t n) {
    int32_t bos = -1;
    if (flm_tokenize_ex(ctx, "", 0, FLM_TOKENIZE_BOS, &bos, 1) != 1) bos = -1;
    cli_buf b = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        size_t len;
        const char *p = flm_token_piece(ctx, i ? -1 : bos, ids[i], &len);
        if (!len) { p = flm_token_text(ctx, ids[i]); len = strlen(p); }
        ok = cli_buf_add(&b, p, len);
    }
    cJSON *str = ok ? piece_string(b.p ? b.p : "", b.len) : NULL;
    cli_buf_free(&b);
    char *out = str && cJSON_IsString(str) ? strdup(str->valuestring) : NULL;
    cJSON_Delete(str);
    return out;
}

/* Only the request's "response_fields" of o (llama-server's: "a/b" is member b of object a, put at the top level as
 * "a/b"; a missing one is left out); o itself when the request names none. Takes o. */
static cJSON *pick_fields(cJSON *o, const serve_req *q) {
    if (!q->n_fields || !o) return o;
    cJSON *r = cJSON_CreateObject();
    for (int i = 0; i < q->n_fields; i++) {
        const cJSON *v = o;
        char path[256];
        snprintf(path, sizeof path, "%s", q->fields[i]);
        for (char *tok = path, *next; v && tok; tok = next) {
            next = strchr(tok, '/');
            if (next) *next++ = 0;
            v = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, tok) : NULL;
        }
        if (v && !cJSON_GetObjectItemCaseSensitive(r, q->fields[i]))
            cJSON_AddItemToObject(r, q->fields[i], cJSON_Duplicate(v, true));
    }
    cJSON_Delete(o);
    return r;
}

/* An empty "logprobs" object (a reply of no tokens). */
static void lp_add_empty(job *j) {
    j->lp = cJSON_CreateObject();
    if (j->req.chat || j->native) {
        cJSON_AddArrayToObject(j->lp, "content");
        cJSON_AddNullToObject(j->lp, "refusal");
    } else {
        cJSON_AddArrayToObject(j->lp, "tokens");
        cJSON_AddArrayToObject(j->lp, "token_logprobs");
        cJSON_AddArrayToObject(j->lp, "top_logprobs");
        cJSON_AddArrayToObject(j->lp, "text_offset");
    }
}

/* ---- the worker ------------------------------------------------------------------------------------------------- */

typedef struct {
    job *j;
} gen_user;

static bool on_token(void *user, const flm_gen_token *t) {
    job *j = ((gen_user *)user)->j;
    pthread_mutex_lock(&srv.mu);
    bool go = !j->gone && !srv.stopping;
    if (j->req.timings_per_token && t->id >= 0) { /* the generation so far, for each token's "timings" */
        j->live_gen_ms += t->ms;
        j->live_n++;
    }
    if (go && j->native && t->id >= 0 && !t->eog && !j->req.stream && j->req.return_tokens) {
        if (j->n_ids == j->cap_ids) {
            size_t cap = j->cap_ids ? 2 * j->cap_ids : 64;
            int32_t *p = realloc(j->ids, cap * sizeof *p);
            if (p) { j->ids = p; j->cap_ids = cap; }
        }
        if (j->n_ids < j->cap_ids) j->ids[j->n_ids++] = t->id;
    }
    if (go && j->native && j->req.stream && (t->len || t->id >= 0) && !t->eog) {
        cJSON *o = native_json(j, t->text, t->len, &t->id, t->id >= 0 ? 1 : 0, false);
        if (j->req.logprobs && t->id >= 0) { /* llama-server's n_probs: this token's entry */
            cJSON *lp = NULL;
            lp_add(j, &lp, t);
            cJSON_AddItemToObject(o, "completion_probabilities", cJSON_DetachItemFromObject(lp, "content"));
            cJSON_Delete(lp);
        }
        if (j->req.timings_per_token && t->id >= 0)
            cJSON_AddItemToObject(o, "timings", timings_json_at(j, (double)j->live_n, j->live_gen_ms));
        go = out_event(j, o);
        pthread_cond_broadcast(&srv.cv);
    } else if (go && j->req.parse_tools && (t->len || t->id >= 0) && !t->eog) { /* content and calls apart */
        serve_tool_stream_feed(&j->ts, t->text, t->len, false, tool_content, tool_call, j);
        if (j->req.stream && j->req.logprobs && t->id >= 0) { /* this token's, in a chunk of its own */
            cJSON *lp = NULL, *o;
            lp_add(j, &lp, t);
            if (!role_chunk(j)) go = false;
            o = delta_chunk(j, cJSON_CreateObject());
            cJSON_AddItemToObject(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0), "logprobs", lp);
            if (!out_event(j, o)) go = false;
        }
        if (j->tool_fail || j->ts.oom) go = false;
        pthread_cond_broadcast(&srv.cv);
    } else if (go && j->req.stream && (t->len || t->id >= 0) && !t->eog) {
        if (j->req.chat && !role_chunk(j)) go = false; /* the role first, alone (content null) */
        cJSON *o = chunk_base(j);
        cJSON *ch = chunk_choice(j, o, t->text, t->len, NULL);
        j->first_chunk = false;
        if (j->req.logprobs && t->id >= 0) { /* this token's, in its chunk */
            cJSON *lp = NULL;
            lp_add(j, &lp, t);
            cJSON_DeleteItemFromObjectCaseSensitive(ch, "logprobs");
            cJSON_AddItemToObject(ch, "logprobs", lp);
        }
        if (j->req.timings_per_token && t->id >= 0) /* llama-server's: the request's timings so far */
            cJSON_AddItemToObject(o, "timings", timings_json_at(j, (double)j->live_n, j->live_gen_ms));
        if (t->id >= 0) { /* the engine's per-token statistics (extra fields, ignored by OpenAI clients) */
            cJSON *f = cJSON_AddObjectToObject(o, "flashlm");
            cJSON_AddNumberToObject(f, "token", t->id);
            cJSON_AddNumberToObject(f, "flash_ms", t->stats.io_ms);
            cJSON_AddNumberToObject(f, "memory_ms", t->stats.mem_ms);
            cJSON_AddNumberToObject(f, "compute_ms", t->stats.compute_ms);
            cJSON_AddNumberToObject(f, "bytes_read", (double)t->stats.bytes_read);
            cJSON_AddNumberToObject(f, "ms", t->ms);
        }
        if (!out_event(j, o)) go = false;
        pthread_cond_broadcast(&srv.cv);
    } else if (go && !j->req.stream && t->len && !cli_buf_add(&j->text, t->text, t->len)) {
        go = false;
    }
    if (go && !j->req.stream && j->req.logprobs && t->id >= 0 && !t->eog) lp_add(j, &j->lp, t);
    pthread_mutex_unlock(&srv.mu);
    return go;
}

/* A server-side failure (500: out of memory, a corrupt file, an I/O error) is logged too: the client's message alone
 * would leave the operator nothing to go on. */
static void log_failure(const job *j, int status, const char *msg) {
    if (status >= 500) fprintf(stderr, "flashlm: %s: error %d: %s\n", j->id, status, msg);
}

static void job_fail_locked(job *j, int status, const char *code, const char *msg) {
    log_failure(j, status, msg);
    j->status = status;
    j->errcode = code;
    snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
}

/* llama-server's "prompt_progress" event (return_progress): tokens of the prompt held so far; native events carry
 * their timings too (nothing generated yet). */
static void on_progress(void *user, size_t processed, size_t total, size_t cached) {
    job *j = user;
    double ms = processed > cached ? cli_now_ms() - j->t_prompt : 0;
    pthread_mutex_lock(&srv.mu);
    cJSON *o;
    if (j->native) {
        o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "index", j->choice);
        cJSON_AddStringToObject(o, "content", "");
        cJSON_AddArrayToObject(o, "tokens");
        cJSON_AddBoolToObject(o, "stop", false);
        cJSON_AddNumberToObject(o, "id_slot", j->slot_index);
        cJSON_AddNumberToObject(o, "tokens_predicted", 0);
        cJSON_AddNumberToObject(o, "tokens_evaluated", (double)total);
        cJSON *t = cJSON_AddObjectToObject(o, "timings");
        double pn = (double)(processed - cached);
        cJSON_AddNumberToObject(t, "cache_n", (double)cached);
        cJSON_AddNumberToObject(t, "prompt_n", pn);
        cJSON_AddNumberToObject(t, "prompt_ms", ms);
        cJSON_AddNumberToObject(t, "prompt_per_token_ms", pn > 0 ? ms / pn : 0);
        cJSON_AddNumberToObject(t, "prompt_per_second", ms > 0 ? pn * 1e3 / ms : 0);
        cJSON_AddNumberToObject(t, "predicted_n", 0);
        cJSON_AddNumberToObject(t, "predicted_ms", 0);
        cJSON_AddNumberToObject(t, "predicted_per_token_ms", 0);
        cJSON_AddNumberToObject(t, "predicted_per_second", 0);
    } else {
        o = chunk_base(j);
        cJSON_AddArrayToObject(o, "choices");
    }
    cJSON *p = cJSON_AddObjectToObject(o, "prompt_progress");
    cJSON_AddNumberToObject(p, "total", (double)total);
    cJSON_AddNumberToObject(p, "cache", (double)cached);
    cJSON_AddNumberToObject(p, "processed", (double)processed);
    cJSON_AddNumberToObject(p, "time_ms", ms);
    out_event(j, o);
    pthread_cond_broadcast(&srv.cv);
    pthread_mutex_unlock(&srv.mu);
}

/* After each batch of the prompt's evaluation (and before the first): its progress, streamed with return_progress;
 * a client that left or a server that stops cancels the rest (flm_session_prompt_progress checks between batches),
 * so that the slot is not held for a prompt nobody waits for. */
static void on_prompt_chunk(void *user, size_t processed, size_t total, size_t cached) {
    job *j = user;
    if (j->early) on_progress(user, processed, total, cached);
    pthread_mutex_lock(&srv.mu);
    j->n_evaluated = processed;
    if ((j->gone || srv.stopping) && j->slot) flm_session_cancel(j->slot->sess);
    pthread_mutex_unlock(&srv.mu);
}

/* Feed the prompt and generate (no lock held while the model runs). */
static void run_job(slot *s, job *j) {
    serve_req *q = &j->req;
    flm_error err;
    flm_sampler_params sp;
    flm_sampler_params_default(&sp);
    if (srv.has_temp) sp.temp = srv.temp;
    if (q->has_temp) sp.temp = q->temperature;
    if (q->has_top_p) sp.top_p = q->top_p;
    if (q->top_k >= 0) sp.top_k = q->top_k;
    sp.presence_penalty = q->presence_penalty;
    sp.frequency_penalty = q->frequency_penalty;
    if (q->repeat_penalty > 0) sp.repeat_penalty = q->repeat_penalty;
    if (q->repeat_last_n >= -1) sp.penalty_last_n = q->repeat_last_n;
    if (q->min_p >= 0) sp.min_p = q->min_p;
    sp.bias = q->bias;
    sp.n_bias = q->n_bias;
    flm_logit_bias *bias_all = NULL; /* with llama-server's text entries: the ids and each text's tokens */
    if (q->n_bias_text) {
        size_t n = q->n_bias;
        for (size_t i = 0; i < q->n_bias_text; i++) {
            size_t k = flm_tokenize_ex(s->ctx, q->bias_text[i], strlen(q->bias_text[i]), 0, NULL, 0);
            n += k == SIZE_MAX ? 0 : k;
        }
        bias_all = malloc((n ? n : 1) * sizeof *bias_all);
        if (bias_all) {
            if (q->n_bias) memcpy(bias_all, q->bias, q->n_bias * sizeof *bias_all);
            size_t m = q->n_bias;
            for (size_t i = 0; i < q->n_bias_text && m < n; i++) {
                int32_t *t = malloc((n - m) * sizeof *t);
                size_t k = t ? flm_tokenize_ex(s->ctx, q->bias_text[i], strlen(q->bias_text[i]), 0, t, n - m) : 0;
                for (size_t x = 0; x < k && m < n; x++) bias_all[m++] = (flm_logit_bias){.token = t[x], .bias = q->bias_text_val[i]};
                free(t);
            }
            sp.bias = bias_all;
            sp.n_bias = m;
        }
    }
    j->ctx = s->ctx;
    j->ts.tmpl = s->tmpl;
    j->ts.incremental = j->req.stream; /* a call's arguments streamed as they come, as OpenAI streams them */
    static _Atomic uint64_t seed_counter;
    sp.seed = q->has_seed ? q->seed : srv.has_seed ? srv.seed : (uint64_t)time(NULL) * 1000003u + atomic_fetch_add(&seed_counter, 1);
    j->seed = sp.seed;
    j->sp = sp;
    j->sp.bias = NULL;
    j->sp.n_bias = 0;
    j->slot_index = s->index;
    flm_session_reset_stats(s->sess);
    if (q->no_cache) flm_session_rewind(s->sess, 0); /* "cache_prompt": false */
    flm_status st = q->n_bias_text && !bias_all ? FLM_ERR_NOMEM : flm_session_sampling(s->sess, &sp, &err);
    if (st == FLM_ERR_NOMEM && !bias_all) snprintf(err.msg, sizeof err.msg, "out of memory");
    free(bias_all); /* the sampler keeps its own copy */
    uint32_t nv = flm_vocab_size(s->ctx);
    for (size_t i = 0; !st && i < q->n_bias; i++)
        if ((uint32_t)q->bias[i].token >= nv) {
            st = FLM_ERR_ARG;
            snprintf(err.msg, sizeof err.msg, "'logit_bias': token id %d is outside the vocabulary (0 to %u)",
                     q->bias[i].token, nv ? nv - 1 : 0);
        }
    for (size_t i = 0; !st && i < q->n_prompt_ids; i++)
        if ((uint32_t)q->prompt_ids[i] >= nv) {
            st = FLM_ERR_ARG;
            snprintf(err.msg, sizeof err.msg, "'prompt': token id %d is outside the vocabulary (0 to %u)",
                     q->prompt_ids[i], nv ? nv - 1 : 0);
        }
    if (!st) { /* the prompt's tokens (kept: their count when they do not fit, their text), then evaluated */
        if (q->n_prompt_ids) {
            if ((j->pids = malloc(q->n_prompt_ids * sizeof *j->pids))) {
                memcpy(j->pids, q->prompt_ids, q->n_prompt_ids * sizeof *j->pids);
                j->n_pids = q->n_prompt_ids;
            }
        } else if (q->chat) {
            st = flm_session_chat_tokens(s->sess, s->tmpl, q->msgs, q->n_msgs, &j->pids, &j->n_pids, &err);
        } else {
            size_t n = flm_tokenize_ex(s->ctx, q->prompt, strlen(q->prompt), FLM_TOKENIZE_ADD_SPECIAL, NULL, 0);
            if (n != SIZE_MAX && (j->pids = malloc((n ? n : 1) * sizeof *j->pids)))
                j->n_pids = flm_tokenize_ex(s->ctx, q->prompt, strlen(q->prompt), FLM_TOKENIZE_ADD_SPECIAL, j->pids, n);
        }
        if (!st && !j->pids) {
            st = FLM_ERR_NOMEM;
            snprintf(err.msg, sizeof err.msg, "out of memory tokenizing the prompt");
        }
        if (!st && q->stream && q->return_progress && j->n_pids < srv.n_ctx) { /* the stream starts now */
            pthread_mutex_lock(&srv.mu);
            j->state = JOB_STREAMING;
            j->early = true;
            pthread_cond_broadcast(&srv.cv);
            pthread_mutex_unlock(&srv.mu);
        }
        if (!st) { /* in pieces: a client that leaves meanwhile frees the slot after the piece under way. A piece is
                      -b tokens when their progress is streamed, else 4 batches: each piece's last row also goes
                      through the classifier (a read of it from flash in the streaming modes), ~1/4 of it per batch */
            const size_t nb = (size_t)(srv.n_batch > 0 ? srv.n_batch : 256);
            j->t_prompt = cli_now_ms();
            st = flm_session_prompt_progress(s->sess, j->pids, j->n_pids, j->early ? nb : 4 * nb, on_prompt_chunk, j,
                                             &j->n_reused, &err);
        }
        if (!st && (j->native || q->verbose)) j->ptext = ids_text(s->ctx, j->pids, j->n_pids);
    }
    flm_session_stats pss;
    flm_session_get_stats(s->sess, &pss);
    pthread_mutex_lock(&srv.mu);
    if (st == FLM_ERR_CANCELLED || (!st && (j->gone || srv.stopping))) { /* the client left (or the server stops)
                                                                            while its prompt was evaluated */
        const size_t done = st ? j->n_evaluated : j->n_pids, pn = done > j->n_reused ? done - j->n_reused : 0;
        const uint64_t nb = (uint64_t)(srv.n_batch > 0 ? srv.n_batch : 256);
        srv.prompt_tokens += pn;
        srv.reused_tokens += j->n_reused;
        srv.prompt_ms += pss.prompt_ms;
        srv.n_decode += (pn + nb - 1) / nb;
        const bool stopping = srv.stopping;
        pthread_mutex_unlock(&srv.mu);
        fprintf(stderr, "flashlm: slot %d: %s: prompt %zu of %zu tokens evaluated (%zu cached) in %.1f ms; "
                "cancelled: %s\n", s->index, j->id, done, j->n_pids, j->n_reused, pss.prompt_ms,
                stopping ? "the server stops" : "the client left");
        return;
    }
    if (st && j->early) { /* the stream has begun: the error is its last event */
        log_failure(j, st == FLM_ERR_ARG || st == FLM_ERR_CONTEXT ? 400 : 500, err.msg);
        char *e = error_json(st == FLM_ERR_ARG || st == FLM_ERR_CONTEXT ? 400 : 500, err.msg,
                             st == FLM_ERR_ARG || st == FLM_ERR_CONTEXT ? "invalid_prompt" : "internal_error");
        if (e) { out_add(j, "data: "); out_add(j, e); out_add(j, "\n\n"); }
        free(e);
        if (!j->native) out_add(j, "data: [DONE]\n\n");
        pthread_mutex_unlock(&srv.mu);
        flm_session_rewind(s->sess, 0);
        return;
    }
    if (st) {
        if (st == FLM_ERR_CONTEXT) { /* the wording clients map to a context-window error (litellm, llama.cpp's) */
            char m[FLM_ERROR_MSG_MAX + 160];
            snprintf(m, sizeof m, "the request exceeds the available context size: this model's maximum context "
                     "length is %u tokens (per slot); %s", srv.n_ctx, err.msg);
            job_fail_locked(j, 400, "context_length_exceeded", m);
            j->err_n_prompt = (long)j->n_pids;
        } else if (st == FLM_ERR_ARG)
            job_fail_locked(j, 400, "invalid_prompt", err.msg);
        else
            job_fail_locked(j, 500, "internal_error", err.msg);
        pthread_mutex_unlock(&srv.mu);
        flm_session_rewind(s->sess, 0);
        return;
    }
    j->n_prompt = (size_t)flm_session_n_past(s->sess);
    j->state = JOB_STREAMING;
    j->first_chunk = true;
    pthread_cond_broadcast(&srv.cv);
    pthread_mutex_unlock(&srv.mu);

    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = q->max_tokens >= 0 ? q->max_tokens : srv.n_predict;
    gp.utf8_whole = true;
    for (int i = 0; i < q->n_stop; i++) gp.stop[i] = q->stop[i];
    gp.n_stop = q->n_stop;
    gp.logprobs = q->logprobs;
    gp.top_logprobs = q->top_logprobs;
    gp.post_sampling = q->post_sampling;
    gp.grammar = q->grammar; /* response_format, json_schema, grammar (compiled by serve_parse_request) */
    if (q->timings_per_token) { /* the prompt's part of each token's timings */
        flm_session_stats ps;
        flm_session_get_stats(s->sess, &ps);
        j->prompt_ms = ps.prompt_ms;
    }
    gen_user u = {j};
    st = flm_session_generate(s->sess, &gp, on_token, &u, &j->res, &err);
    flm_session_stats ss;
    flm_session_get_stats(s->sess, &ss);
    flm_spec_stats sps;
    flm_session_spec_stats(s->sess, &sps);

    pthread_mutex_lock(&srv.mu);
    srv.prompt_tokens += j->n_prompt - j->n_reused;
    srv.prompt_ms += ss.prompt_ms;
    {
        uint64_t pn = j->n_prompt - j->n_reused, nb = (uint64_t)(srv.n_batch > 0 ? srv.n_batch : 256);
        uint64_t steps = sps.n_passes ? sps.n_passes : j->res.n_gen > 1 ? (uint64_t)j->res.n_gen - 1 : 0;
        srv.n_decode += (pn + nb - 1) / nb + steps;
        if (j->n_prompt + (uint64_t)j->res.n_gen > srv.n_tokens_max) srv.n_tokens_max = j->n_prompt + j->res.n_gen;
        if (ss.prompt_ms > 0 && pn) srv.last_prompt_tps = (double)pn * 1e3 / ss.prompt_ms;
    }
    srv.reused_tokens += j->n_reused;
    srv.gen_tokens += (uint64_t)j->res.n_gen;
    srv.gen_ms += ss.gen_ms;
    srv.bytes_read += ss.gen.bytes_read;
    srv.io_ms += ss.gen.io_ms;
    srv.compute_ms += ss.gen.compute_ms;
    srv.passes += sps.n_passes;
    srv.drafted += sps.n_drafted;
    srv.accepted += sps.n_accepted;
    if (ss.gen_ms > 0) srv.last_tps = (double)j->res.n_gen * 1e3 / ss.gen_ms;
    j->prompt_ms = ss.prompt_ms;
    j->gen_ms = ss.gen_ms;
    j->truncated = j->res.ctx_full || ss.n_shifts > 0;
    if (!st && q->parse_tools) { /* the rest of the reply: an unfinished call is text */
        serve_tool_stream_feed(&j->ts, "", 0, true, tool_content, tool_call, j);
        if (j->tool_fail || j->ts.oom) {
            st = FLM_ERR_NOMEM;
            snprintf(err.msg, sizeof err.msg, "out of memory giving out the reply's tool calls");
        }
    }
    const char *finish = j->ts.n_calls > 0 ? "tool_calls" : finish_reason(&j->res);
    if (st) {
        /* the request's grammar beyond the automaton's limits (too ambiguous past its start): the request's fault */
        const bool bad_grammar = st == FLM_ERR_UNSUPPORTED && q->grammar;
        char m[FLM_ERROR_MSG_MAX + 64];
        const char *field = !bad_grammar ? "" : q->grammar_from ? q->grammar_from : "grammar";
        snprintf(m, sizeof m, "%s%s%s%s", bad_grammar ? "'" : "", field, bad_grammar ? "': " : "", err.msg);
        if (j->req.stream) { /* headers are sent: the error goes in the stream */
            log_failure(j, bad_grammar ? 400 : 500, m);
            char *e = error_json(bad_grammar ? 400 : 500, m, bad_grammar ? "invalid_request" : "internal_error");
            if (e) { out_add(j, "data: "); out_add(j, e); out_add(j, "\n\n"); }
            free(e);
        } else {
            job_fail_locked(j, bad_grammar ? 400 : 500, bad_grammar ? "invalid_request" : "internal_error", m);
        }
        flm_session_rewind(s->sess, 0);
    } else if (j->native) {
        cJSON *o = native_json(j, j->req.stream ? "" : j->text.p ? j->text.p : "", j->req.stream ? 0 : j->text.len,
                               j->ids, j->n_ids, true);
        if (!j->req.stream && q->logprobs) {
            if (!j->lp) lp_add_empty(j);
            cJSON_AddItemToObject(o, "completion_probabilities", cJSON_DetachItemFromObject(j->lp, "content"));
        }
        o = pick_fields(o, q);
        if (j->req.stream) { /* the stream's end is its "stop": true, whatever response_fields keep */
            if (o && !cJSON_GetObjectItemCaseSensitive(o, "stop")) cJSON_AddBoolToObject(o, "stop", true);
            out_event(j, o);
        } else {
            char *s2 = cJSON_PrintUnformatted(o);
            cJSON_Delete(o);
            if (!s2 || !out_add(j, s2)) job_fail_locked(j, 500, "internal_error", "out of memory");
            free(s2);
        }
    } else if (j->req.stream) {
        cJSON *o = chunk_base(j);
        chunk_choice(j, o, "", 0, finish);
        if (q->verbose) cJSON_AddItemToObject(o, "__verbose", native_json(j, "", 0, NULL, 0, true));
        /* chat: a last chunk with the usage and no choices, always (llama-server's front ends read it); text
         * completions: that chunk when stream_options.include_usage asks for it (OpenAI's), else the usage on the
         * finishing chunk (llama-server's), so that a client reading choices[0] of every chunk does not break */
        if (!q->chat && !q->include_usage) {
            cJSON_AddItemToObject(o, "usage", usage_json(j));
            cJSON_AddItemToObject(o, "timings", timings_json(j));
            out_event(j, o);
        } else {
            out_event(j, o);
            o = chunk_base(j);
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", usage_json(j));
            cJSON_AddItemToObject(o, "timings", timings_json(j));
            out_event(j, o);
        }
    } else {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", j->id);
        cJSON_AddStringToObject(o, "object", q->chat ? "chat.completion" : "text_completion");
        cJSON_AddNumberToObject(o, "created", (double)j->created);
        cJSON_AddStringToObject(o, "model", srv.model_id);
        cJSON_AddStringToObject(o, "system_fingerprint", SYSTEM_FINGERPRINT);
        cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, c);
        cJSON_AddNumberToObject(c, "index", 0);
        const char *text = j->text.p ? j->text.p : "";
        if (q->chat) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            if (j->calls && !text[0]) cJSON_AddNullToObject(m, "content"); /* OpenAI's: only calls */
            else cJSON_AddStringToObject(m, "content", text);
            if (j->calls) {
                cJSON_AddItemToObject(m, "tool_calls", j->calls);
                j->calls = NULL;
            }
        } else {
            cJSON_AddStringToObject(c, "text", text);
        }
        if (q->logprobs) { /* every token sampled (an end-of-generation one not: it has no text) */
            if (!j->lp) lp_add_empty(j);
            cJSON_AddItemToObject(c, "logprobs", j->lp);
            j->lp = NULL;
        } else {
            cJSON_AddNullToObject(c, "logprobs");
        }
        cJSON_AddStringToObject(c, "finish_reason", finish);
        cJSON_AddItemToObject(o, "usage", usage_json(j));
        cJSON_AddItemToObject(o, "timings", timings_json(j));
        if (q->verbose) /* llama-server's: its native answer, the prompt as text among its fields */
            cJSON_AddItemToObject(o, "__verbose", native_json(j, text, strlen(text), j->ids, j->n_ids, true));
        cJSON *f = cJSON_AddObjectToObject(o, "flashlm");
        cJSON_AddNumberToObject(f, "prompt_ms", ss.prompt_ms);
        cJSON_AddNumberToObject(f, "generation_ms", ss.gen_ms);
        cJSON_AddNumberToObject(f, "flash_ms", ss.gen.io_ms);
        cJSON_AddNumberToObject(f, "compute_ms", ss.gen.compute_ms);
        cJSON_AddNumberToObject(f, "bytes_read", (double)ss.gen.bytes_read);
        char *s2 = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!s2 || !out_add(j, s2)) job_fail_locked(j, 500, "internal_error", "out of memory");
        free(s2);
    }
    if (j->req.stream && !j->native) out_add(j, "data: [DONE]\n\n"); /* /completion's stream ends with stop: true */
    bool gone = j->gone;
    pthread_mutex_unlock(&srv.mu);
    fprintf(stderr, "flashlm: slot %d: %s: prompt %zu tokens (%zu cached) in %.1f ms; %ld tokens in %.1f ms (%.2f "
            "tokens/s, %.2f MiB read from flash); %s\n", s->index, j->id, j->n_prompt, j->n_reused, ss.prompt_ms,
            j->res.n_gen, ss.gen_ms, ss.gen_ms > 0 ? j->res.n_gen * 1e3 / ss.gen_ms : 0.0, cli_mib(ss.gen.bytes_read),
            st ? "failed" : gone || j->res.cancelled ? "cancelled: the client left" : finish);
}

/* base64 (RFC 4648) of n bytes into a NUL-terminated malloc'd string. */
static char *base64(const unsigned char *p, size_t n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc((n + 2) / 3 * 4 + 1), *w = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *w++ = tab[v >> 18 & 63];
        *w++ = tab[v >> 12 & 63];
        *w++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
        *w++ = i + 2 < n ? tab[v & 63] : '=';
    }
    *w = 0;
    return o;
}

/* POST /v1/embeddings on slot s: each input through flm_embed (the slot's cache is then forgotten: the session
 * starts over), the answer as OpenAI's list of embeddings. */
static void run_embed(slot *s, job *j) {
    flm_model_info info;
    flm_get_info(s->ctx, &info);
    float *vec = malloc((size_t)info.d_model * sizeof *vec);
    cJSON *o = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddStringToObject(o, "model", srv.model_id);
    size_t total = 0;
    flm_status st = vec ? FLM_OK : FLM_ERR_NOMEM;
    flm_error err = {0};
    if (!vec) snprintf(err.msg, sizeof err.msg, "out of memory");
    double t0 = cli_now_ms();
    for (size_t i = 0; !st && i < j->n_emb; i++) {
        if (j->gone) break;
        if (j->emb_n[i] > info.n_ctx) {
            st = FLM_ERR_CONTEXT;
            snprintf(err.msg, sizeof err.msg, "input[%zu] has %u tokens", i, j->emb_n[i]);
            break;
        }
        if ((st = flm_seq_acquire(s->ctx, s->seq, &err))) break;
        st = flm_embed(s->ctx, j->emb_ids[i], j->emb_n[i], vec, &err);
        flm_seq_release(s->ctx);
        if (st) break;
        total += j->emb_n[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "object", "embedding");
        cJSON_AddNumberToObject(e, "index", (double)i);
        if (j->emb_base64) {
            char *b = base64((const unsigned char *)vec, (size_t)info.d_model * sizeof *vec); /* little-endian */
            cJSON_AddStringToObject(e, "embedding", b ? b : "");
            free(b);
        } else { /* the numbers as text (shortest exact for a float), not a cJSON node each (~100 bytes) */
            cli_buf t = {0};
            bool ok = cli_buf_add(&t, "[", 1);
            for (uint32_t c = 0; c < info.d_model && ok; c++) {
                char num[40];
                int m = isfinite(vec[c]) ? snprintf(num, sizeof num, "%s%.9g", c ? "," : "", (double)vec[c])
                                         : snprintf(num, sizeof num, "%snull", c ? "," : "");
                ok = cli_buf_add(&t, num, (size_t)m);
            }
            ok = ok && cli_buf_add(&t, "]", 1);
            cJSON *a = ok ? cJSON_CreateRaw(t.p) : NULL;
            cli_buf_free(&t);
            if (!a) {
                cJSON_Delete(e);
                st = FLM_ERR_NOMEM;
                snprintf(err.msg, sizeof err.msg, "out of memory");
                break;
            }
            cJSON_AddItemToObject(e, "embedding", a);
        }
        cJSON_AddItemToArray(data, e);
    }
    double ms = cli_now_ms() - t0;
    flm_session_rewind(s->sess, 0); /* flm_embed overwrote the cache from position 0 */
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)total);
    cJSON_AddNumberToObject(u, "total_tokens", (double)total);
    char *txt = st ? NULL : cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    free(vec);
    pthread_mutex_lock(&srv.mu);
    srv.prompt_tokens += total;
    srv.prompt_ms += ms;
    for (size_t i = 0; i < j->n_emb; i++) /* each input's prompt batches */
        srv.n_decode += (j->emb_n[i] + (uint64_t)(srv.n_batch > 0 ? srv.n_batch : 256) - 1) /
                        (uint64_t)(srv.n_batch > 0 ? srv.n_batch : 256);
    if (st == FLM_ERR_CONTEXT || st == FLM_ERR_ARG) {
        char m[FLM_ERROR_MSG_MAX + 160];
        snprintf(m, sizeof m, "the request exceeds the available context size: this model's maximum context length "
                 "is %u tokens (per slot); %s", info.n_ctx, err.msg);
        job_fail_locked(j, 400, st == FLM_ERR_CONTEXT ? "context_length_exceeded" : "invalid_request",
                        st == FLM_ERR_CONTEXT ? m : err.msg);
    } else if (st) {
        job_fail_locked(j, 500, "internal_error", err.msg);
    } else if (!j->gone && (!txt || !out_add(j, txt))) {
        job_fail_locked(j, 500, "internal_error", "out of memory");
    }
    pthread_mutex_unlock(&srv.mu);
    free(txt);
    fprintf(stderr, "flashlm: slot %d: %s: %zu inputs, %zu tokens embedded in %.1f ms%s\n", s->index, j->id,
            j->n_emb, total, ms, st ? ": failed" : "");
}

static void *worker(void *arg) {
    slot *s = arg;
    pthread_mutex_lock(&srv.mu);
    for (;;) {
        while (!srv.head && !srv.stopping) pthread_cond_wait(&srv.cv, &srv.mu);
        if (srv.stopping) break;
        job *j = srv.head;
        srv.head = j->next;
        if (!srv.head) srv.tail = NULL;
        srv.n_queued--;
        j->state = JOB_RUNNING;
        j->slot = s;
        s->cur = j;
        srv.n_running++;
        pthread_mutex_unlock(&srv.mu);
        if (j->embed) run_embed(s, j);
        else run_job(s, j);
        pthread_mutex_lock(&srv.mu);
        if (j->status >= 400) srv.errors++;
        j->state = JOB_DONE;
        j->slot = NULL;
        s->cur = NULL;
        srv.n_running--;
        s->n_past = (long)flm_session_n_past(s->sess);
        job_unref_locked(j); /* the worker's reference */
        pthread_cond_broadcast(&srv.cv);
    }
    pthread_mutex_unlock(&srv.mu);
    return NULL;
}

/* ---- HTTP ------------------------------------------------------------------------------------------------------- */

/* Memory a request holds while it is answered, counted from its body's length: the body, its JSON tree, the
 * rendered prompt, the tokens and the tokenizer's work (REQ_FACTOR bytes per body byte, as measured), plus
 * REQ_BASE for the rest (the job, the response's buffers). Under --mem the requests in flight may hold
 * srv.req_cap: the part of the budget the plan leaves, plus half of FLM_RSS_ALLOWANCE (the other half is the
 * program's own, docs/ARCHITECTURE.md); one that could never fit is 413, one that does not fit now 503. */
#define REQ_FACTOR 24 /* measured: 4 concurrent chat requests of 0.94 MiB (588920 tokens, refused after tokenizing:
                        longer than the context) raised SmolLM2's server's peak RSS by 19.3 bytes per body byte */
#define REQ_BASE ((uint64_t)64 << 10)
#define LP_ENTRY_BYTES 1024 /* a logprobs entry of a reply held to its end: its cJSON nodes (the object, token, logprob,
                               id and a number per byte, ~64 bytes each with their keys) and its text */
#define REQ_COST(len) (REQ_BASE + REQ_FACTOR * (uint64_t)(len))

typedef struct conn {
    cli_buf body;
    uint64_t held;   /* its share of srv.req_held (REQ_COST), given back when the request ends */
    bool grows;      /* under --mem without a Content-Length (chunked): held grows with the body as it arrives */
    bool http11;     /* an HTTP/1.1 request: may be sent an interim 100 (RFC 9110 section 15.2) */
    job *j;          /* the job whose response is being sent */
} conn;

/* ---- connections: their limit and timeouts ----------------------------------------------------------------------
 * libmicrohttpd runs a thread per connection and knows only an inactivity timeout, which a client sending a byte now
 * and then never reaches (slowloris). Each connection is recorded here (MHD_OPTION_NOTIFY_CONNECTION) with a phase
 * and a deadline: its request's headers (from the connection's start, or from the previous response's end on a
 * kept-alive connection) within --header-timeout, its body within --body-timeout; a watchdog thread shuts a late
 * connection's socket down (the first request answered 408), which ends its thread. No deadline while a request is
 * being answered (a generation takes what it takes; a client that leaves cancels it). Connections beyond
 * --max-connections are answered 503 and closed. */
enum conn_phase { PHASE_HEADERS, PHASE_BODY, PHASE_BUSY };

typedef struct conn_rec {
    int fd;
    enum conn_phase phase;
    double deadline;  /* CLOCK_MONOTONIC seconds; 0: none */
    bool over;        /* accepted beyond --max-connections */
    bool answered;    /* a response was sent on it (then an idle timeout closes it silently) */
    bool expired;
    struct conn_rec *prev, *next;
} conn_rec;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    conn_rec *head;
    int n, max;
    double header_s, body_s;
    bool stop;
    uint64_t timeouts, refused;
} conns = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                              enum MHD_ConnectionNotificationCode code) {
    (void)cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_rec *r = calloc(1, sizeof *r);
        if (!r) return;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        r->fd = ci ? ci->connect_fd : -1;
        pthread_mutex_lock(&conns.mu);
        r->over = conns.n >= conns.max;
        r->phase = PHASE_HEADERS;
        r->deadline = now_s() + conns.header_s;
        r->next = conns.head;
        if (conns.head) conns.head->prev = r;
        conns.head = r;
        conns.n++;
        pthread_mutex_unlock(&conns.mu);
        *socket_context = r;
    } else {
        conn_rec *r = *socket_context;
        if (!r) return;
        pthread_mutex_lock(&conns.mu); /* before libmicrohttpd closes the socket: the watchdog never sees a stale fd */
        if (r->prev) r->prev->next = r->next;
        else conns.head = r->next;
        if (r->next) r->next->prev = r->prev;
        conns.n--;
        pthread_mutex_unlock(&conns.mu);
        free(r);
        *socket_context = NULL;
    }
}

static conn_rec *conn_rec_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void conn_phase_set(struct MHD_Connection *c, enum conn_phase ph) {
    conn_rec *r = conn_rec_of(c);
    if (!r) return;
    pthread_mutex_lock(&conns.mu);
    r->phase = ph;
    r->deadline = ph == PHASE_HEADERS ? now_s() + conns.header_s : ph == PHASE_BODY ? now_s() + conns.body_s : 0;
    if (ph == PHASE_HEADERS) r->answered = true; /* after a response: waiting for the next request */
    pthread_mutex_unlock(&conns.mu);
}

static void *watchdog(void *arg) {
    (void)arg;
    static const char timeout[] = "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json"
                                  "\r\nContent-Length: 88\r\n\r\n{\"error\":{\"message\":\"request timeout\",\"type\":"
                                  "\"invalid_request_error\",\"code\":\"timeout\"}}";
    pthread_mutex_lock(&conns.mu);
    while (!conns.stop) {
        double t = now_s();
        for (conn_rec *r = conns.head; r; r = r->next) {
            if (r->expired || r->deadline <= 0 || t < r->deadline || r->fd < 0) continue;
            r->expired = true;
            conns.timeouts++;
            /* the first request's headers or a body that came too slowly: say so (nothing else is being written on
             * the socket in these phases); an idle kept-alive connection is closed silently (RFC 9112 section 9.5) */
            if (!r->answered || r->phase == PHASE_BODY)
                (void)!send(r->fd, timeout, sizeof timeout - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
            shutdown(r->fd, SHUT_RDWR); /* its thread's next read ends the connection */
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&conns.cv, &conns.mu, &ts);
    }
    pthread_mutex_unlock(&conns.mu);
    return NULL;
}

/* ---- who may call: Host, Origin, CORS, the key (tools/serve_http.c) --------------------------------------------- */

static serve_access access_cfg;

static const char *req_header(struct MHD_Connection *c, const char *name) {
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

/* A response to a request whose Origin may read it carries Access-Control-Allow-Origin (the Fetch standard's CORS
 * check), and Vary: Origin (a cache must not hand it to another origin). */
static void add_cors(struct MHD_Connection *c, struct MHD_Response *r) {
    const char *origin = req_header(c, "Origin");
    if (!origin) return;
    MHD_add_response_header(r, "Vary", "Origin");
    if (serve_origin_allowed(&access_cfg, origin, req_header(c, "Host")))
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
}

static enum MHD_Result send_text_ex(struct MHD_Connection *c, unsigned status, const char *type, const char *body,
                                    size_t len, bool close) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (close) MHD_add_response_header(r, "Connection", "close");
    add_cors(c, r);
    conn_phase_set(c, PHASE_BUSY);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type, const char *body,
                                 size_t len) {
    return send_text_ex(c, status, type, body, len, false);
}

static enum MHD_Result send_error_n(struct MHD_Connection *c, unsigned status, const char *code, const char *msg,
                                    bool close, long n_prompt) {
    char *s = error_json_ex((int)status, msg, code, n_prompt);
    pthread_mutex_lock(&srv.mu);
    srv.requests++;
    srv.errors++;
    pthread_mutex_unlock(&srv.mu);
    if (!s) return MHD_NO;
    enum MHD_Result r = send_text_ex(c, status, "application/json", s, strlen(s), close);
    free(s);
    return r;
}

static enum MHD_Result send_error_ex(struct MHD_Connection *c, unsigned status, const char *code, const char *msg,
                                     bool close) {
    return send_error_n(c, status, code, msg, close, -1);
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *code, const char *msg) {
    return send_error_ex(c, status, code, msg, false);
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return send_error(c, 500, "internal_error", "out of memory");
    pthread_mutex_lock(&srv.mu);
    srv.requests++;
    pthread_mutex_unlock(&srv.mu);
    enum MHD_Result r = send_text(c, status, "application/json", s, strlen(s));
    free(s);
    return r;
}

static uint64_t peak_rss(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? 0 : (uint64_t)ru.ru_maxrss * 1024;
}

static enum MHD_Result send_metrics(struct MHD_Connection *c) {
    cli_buf b = {0};
    char line[512];
    flm_stats fs = {0}; /* the shared context's joined passes (taken between passes, before srv.mu) */
    if (srv.shared && !flm_seq_acquire(srv.slots[0].ctx, 0, NULL)) {
        flm_get_stats(srv.slots[0].ctx, &fs);
        flm_seq_release(srv.slots[0].ctx);
    }
    pthread_mutex_lock(&srv.mu);
    srv.requests++;
#define METRIC(name, type, help, fmt, val)                                                                         \
    do {                                                                                                           \
        snprintf(line, sizeof line, "# HELP flashlm_" name " " help "\n# TYPE flashlm_" name " " type "\nflashlm_"  \
                 name " " fmt "\n", val);                                                                          \
        cli_buf_add(&b, line, strlen(line));                                                                       \
    } while (0)
    METRIC("requests_total", "counter", "HTTP requests answered (errors included).", "%" PRIu64, srv.requests);
    METRIC("request_errors_total", "counter", "Requests answered with a status >= 400.", "%" PRIu64, srv.errors);
    METRIC("requests_cancelled_total", "counter", "Requests whose client left before the end.", "%" PRIu64,
           srv.cancelled);
    METRIC("prompt_tokens_total", "counter", "Prompt tokens evaluated.", "%" PRIu64, srv.prompt_tokens);
    METRIC("prompt_tokens_reused_total", "counter", "Prompt tokens kept from a slot's KV cache.", "%" PRIu64,
           srv.reused_tokens);
    METRIC("tokens_generated_total", "counter", "Tokens generated.", "%" PRIu64, srv.gen_tokens);
    METRIC("generation_seconds_total", "counter", "Seconds spent generating.", "%.6f", srv.gen_ms / 1e3);
    METRIC("tokens_per_second", "gauge", "Generation speed of the last request.", "%.3f", srv.last_tps);
    METRIC("flash_bytes_read_total", "counter", "Bytes read from flash while generating.", "%" PRIu64,
           srv.bytes_read);
    METRIC("flash_io_seconds_total", "counter", "Seconds waiting for flash reads while generating.", "%.6f",
           srv.io_ms / 1e3);
    METRIC("compute_seconds_total", "counter", "Seconds computing while generating.", "%.6f", srv.compute_ms / 1e3);
    METRIC("spec_target_passes_total", "counter", "Target passes while generating speculatively.", "%" PRIu64,
           srv.passes);
    METRIC("spec_drafted_total", "counter", "Draft tokens proposed (speculative decoding).", "%" PRIu64, srv.drafted);
    METRIC("spec_accepted_total", "counter", "Draft tokens accepted (speculative decoding).", "%" PRIu64,
           srv.accepted);
    METRIC("requests_queued", "gauge", "Requests waiting for a slot.", "%d", srv.n_queued);
    METRIC("request_memory_bytes", "gauge", "Memory the requests in flight are counted to hold (REQ_COST each).",
           "%" PRIu64, srv.req_held);
    METRIC("request_memory_limit_bytes", "gauge",
           "What they may hold under --mem: the budget's unplanned part + half the RSS allowance (0: no limit).",
           "%" PRIu64, srv.req_cap);
    METRIC("requests_running", "gauge", "Requests being generated.", "%d", srv.n_running);
    METRIC("slots", "gauge", "Slots (--parallel).", "%d", srv.n_slots);
    METRIC("joined_passes_total", "counter", "Forward passes that joined several slots' tokens (continuous batching).",
           "%" PRIu64, fs.n_joined);
    METRIC("joined_rows_total", "counter", "Tokens (rows) of those passes: divided by the passes, the mean batch.",
           "%" PRIu64, fs.rows_joined);
    METRIC("peak_rss_bytes", "gauge", "Peak resident set size of the process.", "%" PRIu64, peak_rss());
    METRIC("memory_budget_bytes", "gauge", "The memory budget (--mem; 0: none).", "%" PRIu64, srv.budget);
    METRIC("context_tokens", "gauge", "Context length of each slot.", "%u", srv.n_ctx);
#undef METRIC
    /* the same under llama-server's names (its dashboards and tools read these) */
#define LMETRIC(name, type, help, fmt, val)                                                                        \
    do {                                                                                                           \
        snprintf(line, sizeof line, "# HELP llamacpp:" name " " help "\n# TYPE llamacpp:" name " " type              \
                 "\nllamacpp:" name " " fmt "\n", val);                                                             \
        cli_buf_add(&b, line, strlen(line));                                                                       \
    } while (0)
    LMETRIC("prompt_tokens_total", "counter", "Prompt tokens evaluated.", "%" PRIu64, srv.prompt_tokens);
    LMETRIC("prompt_tokens_cached_total", "counter", "Prompt tokens kept from a slot's cache.", "%" PRIu64,
            srv.reused_tokens);
    LMETRIC("prompt_seconds_total", "counter", "Seconds evaluating prompts.", "%.6f", srv.prompt_ms / 1e3);
    LMETRIC("tokens_predicted_total", "counter", "Tokens generated.", "%" PRIu64, srv.gen_tokens);
    LMETRIC("tokens_predicted_seconds_total", "counter", "Seconds generating.", "%.6f", srv.gen_ms / 1e3);
    LMETRIC("n_decode_total", "counter", "Model passes: prompt batches and generation steps.", "%" PRIu64,
            srv.n_decode);
    LMETRIC("n_tokens_max", "counter", "Most tokens a slot held after a request.", "%" PRIu64, srv.n_tokens_max);
    LMETRIC("spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", "%" PRIu64, srv.drafted);
    LMETRIC("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", "%" PRIu64, srv.accepted);
    LMETRIC("spec_decode_num_drafts_total", "counter", "Target passes verifying drafts.", "%" PRIu64, srv.passes);
    LMETRIC("prompt_tokens_seconds", "gauge", "Prompt tokens per second of the last request.", "%.3f",
            srv.last_prompt_tps);
    LMETRIC("predicted_tokens_seconds", "gauge", "Generation speed of the last request.", "%.3f", srv.last_tps);
    LMETRIC("requests_processing", "gauge", "Requests being generated.", "%d", srv.n_running);
    LMETRIC("requests_deferred", "gauge", "Requests waiting for a slot.", "%d", srv.n_queued);
    LMETRIC("n_busy_slots_per_decode", "gauge", "Slots running a request (each decodes alone).", "%d", srv.n_running);
#undef LMETRIC
    pthread_mutex_unlock(&srv.mu);
    enum MHD_Result r = MHD_NO;
    struct MHD_Response *resp = b.p ? MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_COPY) : NULL;
    if (resp) {
        char t[32];
        snprintf(t, sizeof t, "%.0f", srv.start_unix);
        MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
        MHD_add_response_header(resp, "Process-Start-Time-Unix", t); /* llama-server's: a restart resets counters */
        add_cors(c, resp);
        conn_phase_set(c, PHASE_BUSY);
        r = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
    }
    cli_buf_free(&b);
    return r;
}

/* Streaming: hand libmicrohttpd what the worker has produced, waiting for more; the end when the job is done. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    job *j = cls;
    pthread_mutex_lock(&srv.mu);
    while (j->sent == j->out.len && j->state != JOB_DONE && !j->gone) {
        if (srv.stopping || client_gone(j->fd)) {
            job_abandon_locked(j);
            break;
        }
        wait_a_little();
    }
    ssize_t n;
    if (j->sent < j->out.len) {
        n = (ssize_t)(j->out.len - j->sent < max ? j->out.len - j->sent : max);
        memcpy(buf, j->out.p + j->sent, (size_t)n);
        j->sent += (size_t)n;
        if (j->sent == j->out.len) j->sent = j->out.len = 0; /* what was sent is not kept: a long stream holds only
                                                                its events not yet sent */
    } else if (j->gone) {
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else {
        n = MHD_CONTENT_READER_END_OF_STREAM; /* done, everything sent ("data: [DONE]" last) */
    }
    pthread_mutex_unlock(&srv.mu);
    return n;
}

static void stream_free(void *cls) {
    job *j = cls;
    pthread_mutex_lock(&srv.mu);
    if (j->state != JOB_DONE) job_abandon_locked(j);
    job_unref_locked(j); /* the connection's reference */
    pthread_mutex_unlock(&srv.mu);
}

static void request_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)toe;
    conn_phase_set(c, PHASE_HEADERS); /* kept alive: the next request's headers within --header-timeout */
    conn *cn = *con_cls;
    if (!cn) return;
    cli_buf_free(&cn->body);
    if (cn->held) {
        pthread_mutex_lock(&srv.mu);
        srv.req_held -= cn->held;
        pthread_mutex_unlock(&srv.mu);
    }
    free(cn);
    *con_cls = NULL;
}

static enum MHD_Result serve_job(struct MHD_Connection *c, conn *cn, job *j, const char *id_prefix);

/* Memory an answer holds beyond its request's REQ_COST (/tokenize's pieces, /detokenize's text, embeddings'
 * numbers, logprobs), reserved out of srv.req_cap as the request's is and given back at its end (request_done).
 * 0 when it fits (or without --mem); else 413 when it could never fit, 503 when not beside the requests in flight,
 * with msg naming what (`what`) needs how much. */
static int reserve_answer(conn *cn, uint64_t bytes, const char *what, char *msg, size_t cap) {
    if (!srv.req_cap || !bytes) return 0;
    if (cn->held + bytes > srv.req_cap) {
        snprintf(msg, cap, "%s needs about %s for its answer beside the request's %s; the memory budget (--mem %s) "
                 "leaves %s for requests: ask for less or raise --mem", what, cli_size(bytes).s,
                 cli_size(cn->held).s, cli_size(srv.budget).s, cli_size(srv.req_cap).s);
        return 413;
    }
    pthread_mutex_lock(&srv.mu);
    const uint64_t held = srv.req_held;
    const bool fits = held + bytes <= srv.req_cap;
    if (fits) {
        srv.req_held += bytes;
        cn->held += bytes;
    }
    pthread_mutex_unlock(&srv.mu);
    if (!fits)
        snprintf(msg, cap, "%s needs about %s for its answer; the requests in flight hold %s of the %s the memory "
                 "budget (--mem %s) leaves for requests: try again later", what, cli_size(bytes).s,
                 cli_size(held).s, cli_size(srv.req_cap).s, cli_size(srv.budget).s);
    return fits ? 0 : 503;
}

/* llama-server's prompt forms that hold more than one request or need the tokenizer, rewritten before parsing:
 * "prompt" an array whose first element is not a number holds several prompts (each a string, token ids, an object
 * {"prompt_string"} or a mixed sequence): one body each in bodies[]; a mixed sequence (ids and strings, its first an
 * id) becomes token ids (each string tokenized with control tokens parsed, BOS before a string that comes first).
 * 0 with *n = 0 when the body is used as it is, else *n malloc'd bodies; or 400 / 500 with msg. */
static int mixed_ids(cJSON *seq, cJSON **out, char *msg, size_t cap) {
    *out = cJSON_CreateArray();
    if (!*out) { snprintf(msg, cap, "out of memory"); return 500; }
    const flm_ctx *ctx = srv.slots[0].ctx;
    int k = 0;
    for (cJSON *e = seq->child; e; e = e->next, k++) {
        if (cJSON_IsNumber(e)) { cJSON_AddItemToArray(*out, cJSON_CreateNumber(e->valuedouble)); continue; }
        if (!cJSON_IsString(e)) {
            snprintf(msg, cap, "'prompt': a sequence holds token ids and strings only");
            return 400;
        }
        unsigned fl = FLM_TOKENIZE_PARSE_SPECIAL | (k == 0 ? FLM_TOKENIZE_ADD_SPECIAL : 0u);
        size_t len = strlen(e->valuestring), m = flm_tokenize_ex(ctx, e->valuestring, len, fl, NULL, 0);
        int32_t *ids = m == SIZE_MAX ? NULL : malloc((m ? m : 1) * sizeof *ids);
        if (!ids) { snprintf(msg, cap, "out of memory tokenizing the prompt"); return 500; }
        m = flm_tokenize_ex(ctx, e->valuestring, len, fl, ids, m);
        for (size_t i = 0; i < m; i++) cJSON_AddItemToArray(*out, cJSON_CreateNumber(ids[i]));
        free(ids);
    }
    return 0;
}

static bool has_string(const cJSON *a) {
    for (const cJSON *e = a->child; e; e = e->next)
        if (cJSON_IsString(e)) return true;
    return false;
}

/* llama-server's mixed sequence (json_is_array_of_mixed_numbers_strings): an array of token ids and strings, at
 * least one of each, nothing else: one prompt. */
static bool is_mixed(const cJSON *a) {
    bool num = false, str = false;
    if (!cJSON_IsArray(a)) return false;
    for (const cJSON *e = a->child; e; e = e->next) {
        if (cJSON_IsNumber(e)) num = true;
        else if (cJSON_IsString(e)) str = true;
        else return false;
    }
    return num && str;
}

static int split_prompts(const char *body, size_t len, char **bodies, int *n, char *msg, size_t cap) {
    *n = 0;
    char ignored[SERVE_ERR_MAX];
    cJSON *root = serve_parse_json(body, len, ignored, sizeof ignored);
    cJSON *p = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "prompt") : NULL;
    int st = 0;
    if (!cJSON_IsArray(p) || !p->child) goto done; /* the parser says what is wrong, if anything */
    if (is_mixed(p) || (cJSON_IsNumber(p->child) && has_string(p))) { /* one prompt of ids and strings */
        cJSON *ids;
        if ((st = mixed_ids(p, &ids, msg, cap))) { cJSON_Delete(ids); goto done; }
        cJSON_ReplaceItemInObjectCaseSensitive(root, "prompt", ids);
        if (!(bodies[0] = cJSON_PrintUnformatted(root))) { snprintf(msg, cap, "out of memory"); st = 500; goto done; }
        *n = 1;
        goto done;
    }
    if (cJSON_IsNumber(p->child)) goto done; /* token ids */
    int k = cJSON_GetArraySize(p);
    if (k == 1 && !is_mixed(p->child)) goto done; /* an array of one prompt: the parser takes it */
    if (k > SERVE_MAX_CHOICES) {
        snprintf(msg, cap, "'prompt': at most %d prompts in one request", SERVE_MAX_CHOICES);
        st = 400;
        goto done;
    }
    cJSON *all = cJSON_DetachItemFromObjectCaseSensitive(root, "prompt");
    for (cJSON *e = all->child; e && !st; e = e->next) {
        cJSON *one = NULL;
        if (cJSON_IsArray(e) && (is_mixed(e) || has_string(e))) st = mixed_ids(e, &one, msg, cap);
        else one = cJSON_Duplicate(e, true);
        if (!st) {
            cJSON_AddItemToObject(root, "prompt", one);
            one = NULL;
            if (!(bodies[*n] = cJSON_PrintUnformatted(root))) { snprintf(msg, cap, "out of memory"); st = 500; }
            else (*n)++;
            cJSON_DeleteItemFromObjectCaseSensitive(root, "prompt");
        }
        cJSON_Delete(one);
    }
    cJSON_Delete(all);
done:
    cJSON_Delete(root);
    if (st) {
        for (int i = 0; i < *n; i++) free(bodies[i]);
        *n = 0;
    }
    return st;
}

static enum MHD_Result serve_many(struct MHD_Connection *c, conn *cn, job **jobs, int k, bool chat, bool native);

/* POST /v1/chat/completions (chat), /v1/completions and llama-server's /completion (native). Several prompts
 * (llama-server's) or "n" choices: one job each, run on the slots as they come free, answered together. */
static enum MHD_Result handle_generate(struct MHD_Connection *c, conn *cn, bool chat, bool native) {
    char msg[SERVE_ERR_MAX];
    char *bodies[SERVE_MAX_CHOICES];
    int n_bodies = 0;
    int status = chat ? 0 : split_prompts(cn->body.p ? cn->body.p : "", cn->body.len, bodies, &n_bodies, msg,
                                          sizeof msg);
    if (status) return send_error(c, (unsigned)status, status == 400 ? "invalid_request" : "internal_error", msg);
    const int n_prompts = n_bodies ? n_bodies : 1;
    job *jobs[SERVE_MAX_CHOICES * SERVE_MAX_CHOICES];
    int k = 0, n_choices = 1;
    for (int p = 0; p < n_prompts && !status; p++) {
        for (int ch = 0; ch < n_choices && !status; ch++) {
            serve_req req;
            const char *b = n_bodies ? bodies[p] : cn->body.p ? cn->body.p : "";
            size_t bl = n_bodies ? strlen(bodies[p]) : cn->body.len;
            status = serve_parse_request(b, bl, chat, &req, msg, sizeof msg);
            if (!status && chat) status = serve_tools_prepare(&req, srv.slots[0].tmpl, msg, sizeof msg);
            if (!status && n_prompts > 1 && req.stream) {
                status = 400;
                snprintf(msg, sizeof msg, "several prompts with 'stream' are not supported (one per request)");
            }
            if (status) { serve_req_free(&req); break; }
            if (p == 0 && ch == 0) n_choices = req.n_choices;
            if (ch > 0 && req.has_seed) req.seed += (uint64_t)ch; /* each choice its own, reproducible, seed */
            if (!status && req.post_sampling && !chat && !native) {
                status = 400;
                snprintf(msg, sizeof msg, "'post_sampling_probs' needs /completion or /v1/chat/completions (their "
                         "\"prob\" and \"top_probs\"): /v1/completions' logprobs arrays hold log-probabilities only");
                serve_req_free(&req);
                break;
            }
            if (srv.strict_model && req.model && !model_named(req.model)) {
                char m[SERVE_ERR_MAX + 64];
                snprintf(m, sizeof m, "the model '%.200s' does not exist: this server has '%s' (GET /v1/models; "
                         "without --strict-model any name is answered by it)", req.model, srv.model_id);
                serve_req_free(&req);
                for (int i = 0; i < k; i++) { serve_req_free(&jobs[i]->req); free(jobs[i]); }
                for (int i = 0; i < n_bodies; i++) free(bodies[i]);
                return send_error(c, 404, "model_not_found", m);
            }
            job *j = calloc(1, sizeof *j);
            if (!j) {
                serve_req_free(&req);
                status = 500;
                snprintf(msg, sizeof msg, "out of memory");
                break;
            }
            j->req = req;
            j->native = native;
            j->choice = k;
            j->first_of_prompt = ch == 0;
            jobs[k++] = j;
        }
    }
    for (int i = 0; i < n_bodies; i++) free(bodies[i]);
    if (!status) { /* a reply's logprobs (not streamed) are held until its end: their memory reserved under --mem */
        uint64_t lp = 0;
        long most = 0;
        int top = 0;
        for (int i = 0; i < k; i++) {
            const serve_req *q = &jobs[i]->req;
            if (!q->logprobs || q->stream) continue;
            long mx = q->max_tokens >= 0 ? q->max_tokens : srv.n_predict >= 0 ? srv.n_predict : (long)srv.n_ctx;
            if (mx > (long)srv.n_ctx) mx = (long)srv.n_ctx;
            lp += (uint64_t)mx * (uint64_t)(1 + q->top_logprobs) * LP_ENTRY_BYTES;
            if (mx > most) most = mx;
            if (q->top_logprobs > top) top = q->top_logprobs;
        }
        char what[200], m2[SERVE_ERR_MAX + 256];
        snprintf(what, sizeof what, "'logprobs' with 'top_logprobs' %d over up to %ld tokens ('max_tokens'%s) in %d "
                 "choice%s (stream it, or lower them)", top, most, jobs[0]->req.max_tokens >= 0 ? "" : " absent: the "
                 "context", k, k == 1 ? "" : "s");
        if (lp && (status = reserve_answer(cn, lp, what, m2, sizeof m2))) {
            for (int i = 0; i < k; i++) { serve_req_free(&jobs[i]->req); free(jobs[i]); }
            return send_error(c, (unsigned)status, status == 413 ? "request_too_large" : "server_busy", m2);
        }
    }
    if (status) {
        for (int i = 0; i < k; i++) { serve_req_free(&jobs[i]->req); free(jobs[i]); }
        return send_error(c, (unsigned)status, status == 400 ? "invalid_request" : "internal_error", msg);
    }
    if (k == 1) return serve_job(c, cn, jobs[0], chat ? "chatcmpl" : "cmpl");
    return serve_many(c, cn, jobs, k, chat, native);
}

/* Several jobs of one request (not streamed): queued together, answered when all are done: llama-server's several
 * prompts as an array of their answers (native), or one OpenAI answer whose choices are the jobs' (index i), with the
 * usage summed (a prompt's tokens counted once). The first error, if any, is the answer. */
static enum MHD_Result serve_many(struct MHD_Connection *c, conn *cn, job **jobs, int k, bool chat, bool native) {
    (void)cn;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (k > srv.queue_cap + srv.n_slots) { /* more than an idle server holds: retrying cannot help */
        int n_choices = 0, n_prompts = 0;
        for (int i = 0; i < k; i++) {
            n_prompts += jobs[i]->first_of_prompt;
            n_choices += n_prompts == 1;
        }
        char m[SERVE_ERR_MAX];
        snprintf(m, sizeof m, "'n' (%d) times %d prompt%s ('prompt') is %d generations: this server holds at most "
                 "%d at once (--parallel %d slots + --queue %d); ask for fewer choices or prompts", n_choices,
                 n_prompts, n_prompts == 1 ? "" : "s", k, srv.queue_cap + srv.n_slots, srv.n_slots, srv.queue_cap);
        for (int i = 0; i < k; i++) { serve_req_free(&jobs[i]->req); free(jobs[i]); }
        return send_error(c, 400, "invalid_request", m);
    }
    pthread_mutex_lock(&srv.mu);
    long id = ++srv.next_id;
    if (srv.stopping || srv.n_queued + k > srv.queue_cap + (srv.n_slots - srv.n_running)) {
        bool stopping = srv.stopping;
        pthread_mutex_unlock(&srv.mu);
        for (int i = 0; i < k; i++) { serve_req_free(&jobs[i]->req); free(jobs[i]); }
        return send_error(c, 503, stopping ? "shutting_down" : "queue_full",
                          stopping ? "the server is shutting down" : "the queue is full: try again later");
    }
    for (int i = 0; i < k; i++) {
        job *j = jobs[i];
        j->refs = 2;
        j->err_n_prompt = -1;
        j->created = (long)time(NULL);
        j->fd = ci ? ci->connect_fd : -1;
        snprintf(j->id, sizeof j->id, "%s-%ld", chat ? "chatcmpl" : "cmpl", id);
        if (srv.tail) srv.tail->next = j;
        else srv.head = j;
        srv.tail = j;
        srv.n_queued++;
    }
    pthread_cond_broadcast(&srv.cv);
    bool gone = false;
    for (;;) {
        int done = 0;
        for (int i = 0; i < k; i++) done += jobs[i]->state == JOB_DONE || jobs[i]->gone;
        if (done == k) break;
        if (srv.stopping || client_gone(jobs[0]->fd)) {
            for (int i = 0; i < k; i++) job_abandon_locked(jobs[i]);
            gone = true;
            break;
        }
        wait_a_little();
    }
    srv.requests++;
    int err = -1;
    for (int i = 0; i < k && err < 0; i++)
        if (jobs[i]->status >= 400) err = i;
    char *out = NULL;
    if (!gone && err < 0) {
        if (native) {
            cli_buf b = {0};
            bool ok = cli_buf_add(&b, "[", 1);
            for (int i = 0; i < k; i++)
                ok = ok && (!i || cli_buf_add(&b, ",", 1)) && cli_buf_add(&b, jobs[i]->out.p ? jobs[i]->out.p : "{}",
                                                                       jobs[i]->out.len);
            ok = ok && cli_buf_add(&b, "]", 2);
            out = ok ? strdup(b.p) : NULL;
            cli_buf_free(&b);
        } else {
            cJSON *base = cJSON_ParseWithLength(jobs[0]->out.p ? jobs[0]->out.p : "", jobs[0]->out.len);
            cJSON *choices = cJSON_GetObjectItemCaseSensitive(base, "choices");
            cJSON *usage = cJSON_GetObjectItemCaseSensitive(base, "usage");
            double pt = 0, ct = 0;
            for (int i = 0; base && i < k; i++) {
                pt += jobs[i]->first_of_prompt ? (double)jobs[i]->n_prompt : 0;
                ct += (double)jobs[i]->res.n_gen;
                if (!i) continue;
                cJSON *o = cJSON_ParseWithLength(jobs[i]->out.p ? jobs[i]->out.p : "", jobs[i]->out.len);
                cJSON *cs = cJSON_GetObjectItemCaseSensitive(o, "choices");
                cJSON *c0 = cJSON_IsArray(cs) ? cJSON_DetachItemFromArray(cs, 0) : NULL;
                if (c0) {
                    cJSON_ReplaceItemInObjectCaseSensitive(c0, "index", cJSON_CreateNumber(i));
                    cJSON_AddItemToArray(choices, c0);
                }
                cJSON_Delete(o);
            }
            if (usage) {
                cJSON_ReplaceItemInObjectCaseSensitive(usage, "prompt_tokens", cJSON_CreateNumber(pt));
                cJSON_ReplaceItemInObjectCaseSensitive(usage, "completion_tokens", cJSON_CreateNumber(ct));
                cJSON_ReplaceItemInObjectCaseSensitive(usage, "total_tokens", cJSON_CreateNumber(pt + ct));
            }
            out = base ? cJSON_PrintUnformatted(base) : NULL;
            cJSON_Delete(base);
        }
    }
    char m[sizeof jobs[0]->errmsg];
    int st = err >= 0 ? jobs[err]->status : 0;
    const char *code = err >= 0 ? jobs[err]->errcode : NULL;
    long n_prompt = err >= 0 ? jobs[err]->err_n_prompt : -1;
    if (err >= 0) snprintf(m, sizeof m, "%s", jobs[err]->errmsg);
    bool stopping = srv.stopping;
    for (int i = 0; i < k; i++) job_unref_locked(jobs[i]);
    srv.requests--; /* the sender counts it */
    pthread_mutex_unlock(&srv.mu);
    if (err >= 0) return send_error_n(c, (unsigned)st, code, m, false, n_prompt);
    if (gone) return stopping ? send_error(c, 503, "shutting_down", "the server is shutting down") : MHD_NO;
    if (!out) return send_error(c, 500, "internal_error", "out of memory");
    pthread_mutex_lock(&srv.mu);
    srv.requests++;
    pthread_mutex_unlock(&srv.mu);
    enum MHD_Result r = send_text(c, 200, "application/json", out, strlen(out));
    free(out);
    return r;
}

/* Queue job j (its request filled in), wait for its answer and send it (streams: start the stream). */
static enum MHD_Result serve_job(struct MHD_Connection *c, conn *cn, job *j, const char *id_prefix) {
    j->refs = 2; /* the connection's, the queue's (then the worker's) */
    j->err_n_prompt = -1;
    j->created = (long)time(NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    pthread_mutex_lock(&srv.mu);
    snprintf(j->id, sizeof j->id, "%s-%ld", id_prefix, ++srv.next_id);
    if (srv.stopping || srv.n_queued >= srv.queue_cap + (srv.n_slots - srv.n_running)) { /* idle slots take one each */
        bool stopping = srv.stopping;
        j->refs = 1;
        job_unref_locked(j);
        pthread_mutex_unlock(&srv.mu);
        return send_error(c, 503, stopping ? "shutting_down" : "queue_full",
                          stopping ? "the server is shutting down" : "the queue is full: try again later");
    }
    if (srv.tail) srv.tail->next = j;
    else srv.head = j;
    srv.tail = j;
    srv.n_queued++;
    pthread_cond_broadcast(&srv.cv);
    /* wait for the prompt to be evaluated (then a stream starts) or, without streaming, for the whole reply. A
     * client whose sending side ended either half-closed (it waits for the answer) or left: an interim
     * "100 Continue" (which an HTTP/1.1 client must accept before the final response, RFC 9110 section 15.2) tells
     * them apart: a client that left answers it with a reset, which client_gone sees */
    bool probed = false;
    for (;;) {
        if (j->state == JOB_DONE || (j->req.stream && j->state == JOB_STREAMING) || j->gone) break;
        if (!probed && cn->http11 && client_eof(j->fd)) {
            static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
            probed = true;
            (void)!send(j->fd, cont, sizeof cont - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        }
        if (srv.stopping || client_gone(j->fd)) {
            job_abandon_locked(j);
            break;
        }
        wait_a_little();
    }
    srv.requests++;
    if (j->status >= 400) { /* answered with an error before anything was sent */
        char m[sizeof j->errmsg];
        snprintf(m, sizeof m, "%s", j->errmsg);
        int st = j->status;
        const char *code = j->errcode;
        long n_prompt = j->err_n_prompt;
        srv.requests--; /* send_error counts it */
        job_unref_locked(j);
        pthread_mutex_unlock(&srv.mu);
        return send_error_n(c, (unsigned)st, code, m, false, n_prompt);
    }
    if (j->gone) {
        bool stopping = srv.stopping;
        job_unref_locked(j);
        pthread_mutex_unlock(&srv.mu);
        if (stopping) return send_error(c, 503, "shutting_down", "the server is shutting down");
        return MHD_NO; /* the client left: close */
    }
    if (!j->req.stream) {
        enum MHD_Result r = send_text(c, 200, "application/json", j->out.p ? j->out.p : "{}", j->out.len);
        job_unref_locked(j);
        pthread_mutex_unlock(&srv.mu);
        return r;
    }
    pthread_mutex_unlock(&srv.mu);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, j,
                                                                  stream_free);
    if (!resp) {
        stream_free(j);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    add_cors(c, resp);
    enum MHD_Result r = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return r;
}

static bool authorized(struct MHD_Connection *c) {
    return serve_key_ok(srv.api_key, req_header(c, "Authorization"), req_header(c, "X-Api-Key"));
}

/* Every header of the request, for the framing check (duplicates included, as received). */
typedef struct {
    serve_hdr h[128];
    size_t n;
    bool overflow;
} hdr_list;

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    hdr_list *l = cls;
    if (l->n == sizeof l->h / sizeof l->h[0]) {
        l->overflow = true;
        return MHD_NO;
    }
    l->h[l->n++] = (serve_hdr){key, value};
    return MHD_YES;
}

/* OPTIONS: a CORS preflight (the Fetch standard): which methods and headers a page of an allowed origin may use;
 * nothing for another origin (the browser then refuses the request). */
static enum MHD_Result send_preflight(struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    const char *origin = req_header(c, "Origin");
    add_cors(c, r);
    if (origin && serve_origin_allowed(&access_cfg, origin, req_header(c, "Host"))) {
        const char *want = req_header(c, "Access-Control-Request-Headers");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                want && strlen(want) < 1024 ? want : "Authorization, Content-Type, X-Api-Key");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    MHD_add_response_header(r, "Allow", "GET, POST, OPTIONS");
    conn_phase_set(c, PHASE_BUSY);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* The first call, with the headers and before any of the body: refuse what must not be read (answered, then the
 * connection closed: libmicrohttpd reads nothing more of a request answered early). */
static enum MHD_Result check_headers(struct MHD_Connection *c, const char *method, const char *version, conn *cn) {
    conn_rec *rec = conn_rec_of(c);
    if (rec && rec->over) {
        pthread_mutex_lock(&conns.mu);
        conns.refused++;
        pthread_mutex_unlock(&conns.mu);
        char m[128];
        snprintf(m, sizeof m, "too many connections (--max-connections %d): try again later", conns.max);
        return send_error_ex(c, 503, "too_many_connections", m, true);
    }
    hdr_list l = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, collect_header, &l);
    char msg[400];
    if (l.overflow) return send_error_ex(c, 431, "invalid_request", "more than 128 request headers", true);
    int st = serve_check_framing(l.h, l.n, version && !strcmp(version, "HTTP/1.0"), msg, sizeof msg);
    if (st) return send_error_ex(c, (unsigned)st, "invalid_request", msg, true);
    if ((st = serve_check_host(&access_cfg, req_header(c, "Host"), msg, sizeof msg)))
        return send_error_ex(c, (unsigned)st, st == 403 ? "forbidden_host" : "invalid_request", msg, true);
    if (!strcmp(method, "OPTIONS")) return send_preflight(c);
    const char *cl = req_header(c, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > srv.max_body) {
        snprintf(msg, sizeof msg, "the request body is larger than --max-body (%zu bytes)", srv.max_body);
        return send_error_ex(c, 413, "request_too_large", msg, true);
    }
    if (srv.req_cap && strcmp(method, "GET")) { /* what the request will hold, out of the budget's room for requests
                                                   (a chunked body's length is not known: counted as it arrives) */
        const uint64_t len = cl ? strtoull(cl, NULL, 10) : 0, cost = REQ_COST(len);
        cn->grows = !cl;
        if (cost > srv.req_cap) {
            snprintf(msg, sizeof msg, "a request body of %" PRIu64 " bytes needs about %s while it is parsed, rendered "
                     "and tokenized; the memory budget (--mem %s) leaves %s for requests: send a shorter one or "
                     "raise --mem", len, cli_size(cost).s, cli_size(srv.budget).s, cli_size(srv.req_cap).s);
            return send_error_ex(c, 413, "request_too_large", msg, true);
        }
        pthread_mutex_lock(&srv.mu);
        const uint64_t held = srv.req_held;
        const bool fits = held + cost <= srv.req_cap;
        if (fits) srv.req_held += cost;
        pthread_mutex_unlock(&srv.mu);
        if (!fits) {
            snprintf(msg, sizeof msg, "the requests in flight hold %s of the %s the memory budget (--mem %s) leaves "
                     "for requests, and this one needs about %s: try again later", cli_size(held).s,
                     cli_size(srv.req_cap).s, cli_size(srv.budget).s, cli_size(cost).s);
            return send_error_ex(c, 503, "server_busy", msg, true);
        }
        cn->held = cost;
    }
    conn_phase_set(c, PHASE_BODY);
    return MHD_YES;
}

/* The model's entry in GET /v1/models: OpenAI's fields (id, object, created, owned_by) and llama-server's (aliases,
 * tags, meta with n_vocab, n_ctx_train, n_embd, size in bytes, and n_ctx per slot), with flashlm's slots and budget. */
static cJSON *model_json(void) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", srv.model_id);
    cJSON *al = cJSON_AddArrayToObject(m, "aliases"), *tg = cJSON_AddArrayToObject(m, "tags");
    if (!aliases.n) cJSON_AddItemToArray(al, cJSON_CreateString(srv.model_id)); /* the id is its own alias */
    for (int i = 0; i < aliases.n; i++) cJSON_AddItemToArray(al, cJSON_CreateString(aliases.v[i]));
    for (int i = 0; i < tags.n; i++) cJSON_AddItemToArray(tg, cJSON_CreateString(tags.v[i]));
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", srv.start_unix);
    cJSON_AddStringToObject(m, "owned_by", "flashlm");
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddNumberToObject(meta, "n_vocab", srv.n_vocab);
    cJSON_AddNumberToObject(meta, "n_ctx", srv.n_ctx);
    cJSON_AddNumberToObject(meta, "n_ctx_train", srv.n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_embd", srv.n_embd);
    cJSON_AddNumberToObject(meta, "size", (double)srv.model_bytes);
    cJSON_AddNumberToObject(meta, "slots", srv.n_slots);
    cJSON_AddNumberToObject(meta, "budget_bytes", (double)srv.budget);
    return m;
}

/* The body parsed as a JSON object, or NULL after answering 400. */
static cJSON *body_object(struct MHD_Connection *c, conn *cn, enum MHD_Result *r) {
    char msg[SERVE_ERR_MAX];
    cJSON *o = serve_parse_json(cn->body.p ? cn->body.p : "", cn->body.len, msg, sizeof msg);
    if (!cJSON_IsObject(o)) {
        if (o) snprintf(msg, sizeof msg, "the body must be a JSON object");
        cJSON_Delete(o);
        *r = send_error(c, 400, "invalid_request", msg);
        return NULL;
    }
    return o;
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char b = (unsigned char)s[i];
        size_t k = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] >> 6) != 2) return false;
        i += k;
    }
    return true;
}

/* The JSON string of p[0..n) (valid UTF-8), quoted, written at o unless o is NULL; its length either way. */
static size_t json_string_at(char *o, const char *p, size_t n) {
    size_t k = 0;
    if (o) o[k] = '"';
    k++;
    for (size_t i = 0; i < n; i++) {
        const unsigned char ch = (unsigned char)p[i];
        char e[8];
        size_t m = 1;
        e[0] = (char)ch;
        if (ch == '"' || ch == '\\') { e[0] = '\\'; e[1] = (char)ch; m = 2; }
        else if (ch == '\n') { e[0] = '\\'; e[1] = 'n'; m = 2; }
        else if (ch == '\t') { e[0] = '\\'; e[1] = 't'; m = 2; }
        else if (ch == '\r') { e[0] = '\\'; e[1] = 'r'; m = 2; }
        else if (ch < 0x20) m = (size_t)snprintf(e, sizeof e, "\\u%04x", ch);
        if (o) memcpy(o + k, e, m);
        k += m;
    }
    if (o) o[k] = '"';
    return k + 1;
}

/* /tokenize's answer {"tokens": [...]} for ids[0..n) (with pieces: {"id", "piece"} each, a piece a string when it
 * is whole UTF-8, else its bytes as numbers: llama-server's), written at o unless NULL; its length either way
 * (written directly, not as a cJSON tree: ~30 bytes a token rather than ~300). */
static size_t tokens_answer(const flm_ctx *ctx, const int32_t *ids, size_t n, bool pieces, char *o) {
    size_t k = 0;
    char num[48];
#define PUT(str, len) do { if (o) memcpy(o + k, (str), (len)); k += (len); } while (0)
    PUT("{\"tokens\":[", 11);
    for (size_t i = 0; i < n; i++) {
        int m = snprintf(num, sizeof num, "%s%s%d%s", i ? "," : "", pieces ? "{\"id\":" : "", ids[i],
                         pieces ? ",\"piece\":" : "");
        PUT(num, (size_t)m);
        if (!pieces) continue;
        size_t len;
        const char *p = flm_token_piece(ctx, i ? ids[i - 1] : -1, ids[i], &len);
        if (valid_utf8(p, len)) {
            k += json_string_at(o ? o + k : NULL, p, len);
        } else { /* the bytes */
            PUT("[", 1);
            for (size_t b = 0; b < len; b++) {
                m = snprintf(num, sizeof num, "%s%u", b ? "," : "", (unsigned char)p[b]);
                PUT(num, (size_t)m);
            }
            PUT("]", 1);
        }
        PUT("}", 1);
    }
    PUT("]}", 2);
#undef PUT
    return k;
}

/* Send a malloc'd body (taken: freed by libmicrohttpd after sending, not copied). */
static enum MHD_Result send_owned(struct MHD_Connection *c, unsigned status, char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    add_cors(c, r);
    conn_phase_set(c, PHASE_BUSY);
    pthread_mutex_lock(&srv.mu);
    srv.requests++;
    pthread_mutex_unlock(&srv.mu);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* POST /tokenize (llama-server's): {"content", "add_special" (BOS as the model adds it; default false),
 * "parse_special" (control tokens spelled out become them; default true), "with_pieces"} -> {"tokens": [...]}.
 * Under --mem the answer's memory is reserved first (reserve_answer: 413 / 503 naming it). */
static enum MHD_Result handle_tokenize(struct MHD_Connection *c, conn *cn) {
    enum MHD_Result r = MHD_NO;
    cJSON *o = body_object(c, cn, &r);
    if (!o) return r;
    {
        static const char *const KNOWN[] = {"content", "add_special", "parse_special", "with_pieces"};
        char fm[256];
        if (!serve_fields_known(o, KNOWN, sizeof KNOWN / sizeof *KNOWN, "/tokenize", fm, sizeof fm)) {
            cJSON_Delete(o);
            return send_error(c, 400, "invalid_request", fm);
        }
    }
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(o, "content");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(o, "add_special");
    const cJSON *parse = cJSON_GetObjectItemCaseSensitive(o, "parse_special");
    const cJSON *pieces = cJSON_GetObjectItemCaseSensitive(o, "with_pieces");
    if (!cJSON_IsString(content) || (add && !cJSON_IsBool(add)) || (parse && !cJSON_IsBool(parse)) ||
        (pieces && !cJSON_IsBool(pieces))) {
        cJSON_Delete(o);
        return send_error(c, 400, "invalid_request", "/tokenize takes 'content' (a string) and the booleans "
                          "'add_special', 'parse_special', 'with_pieces'");
    }
    const flm_ctx *ctx = srv.slots[0].ctx;
    const char *text = content->valuestring;
    const bool with_pieces = cJSON_IsTrue(pieces);
    unsigned flags = (cJSON_IsTrue(add) ? FLM_TOKENIZE_ADD_SPECIAL : 0) |
                     (!parse || cJSON_IsTrue(parse) ? FLM_TOKENIZE_PARSE_SPECIAL : 0);
    size_t n = flm_tokenize_ex(ctx, text, strlen(text), flags, NULL, 0);
    int32_t *ids = n == SIZE_MAX ? NULL : malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        cJSON_Delete(o);
        return send_error(c, 500, "internal_error", "out of memory");
    }
    flm_tokenize_ex(ctx, text, strlen(text), flags, ids, n);
    cJSON_Delete(o);
    const size_t len = tokens_answer(ctx, ids, n, with_pieces, NULL);
    char what[96], msg[SERVE_ERR_MAX + 256];
    snprintf(what, sizeof what, "/tokenize of %zu tokens%s", n, with_pieces ? " with 'with_pieces'" : "");
    int st = reserve_answer(cn, len + 1, what, msg, sizeof msg);
    char *out = st ? NULL : malloc(len + 1);
    if (out) tokens_answer(ctx, ids, n, with_pieces, out);
    free(ids);
    if (st) return send_error(c, (unsigned)st, st == 413 ? "request_too_large" : "server_busy", msg);
    if (!out) return send_error(c, 500, "internal_error", "out of memory");
    return send_owned(c, 200, out, len);
}

/* POST /detokenize: {"tokens": [ids]} -> {"content": text}; the answer's memory reserved as /tokenize's. */
static enum MHD_Result handle_detokenize(struct MHD_Connection *c, conn *cn) {
    enum MHD_Result r = MHD_NO;
    cJSON *o = body_object(c, cn, &r);
    if (!o) return r;
    {
        static const char *const KNOWN[] = {"tokens"};
        char fm[256];
        if (!serve_fields_known(o, KNOWN, sizeof KNOWN / sizeof *KNOWN, "/detokenize", fm, sizeof fm)) {
            cJSON_Delete(o);
            return send_error(c, 400, "invalid_request", fm);
        }
    }
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(o, "tokens"), *t;
    const flm_ctx *ctx = srv.slots[0].ctx;
    uint32_t nv = flm_vocab_size(ctx);
    bool ok = cJSON_IsArray(toks);
    if (ok)
        cJSON_ArrayForEach(t, toks) ok = ok && cJSON_IsNumber(t) && t->valuedouble >= 0 && t->valuedouble < nv &&
                                         t->valuedouble == floor(t->valuedouble);
    if (!ok) {
        cJSON_Delete(o);
        char m[128];
        snprintf(m, sizeof m, "/detokenize takes 'tokens': an array of token ids (0 to %u)", nv ? nv - 1 : 0);
        return send_error(c, 400, "invalid_request", m);
    }
    size_t text_len = 0, n = 0;
    int32_t prev = -1;
    cJSON_ArrayForEach(t, toks) { /* the text's length first: its memory is reserved before it is made */
        size_t len;
        flm_token_piece(ctx, prev, (int32_t)t->valuedouble, &len);
        text_len += len;
        prev = (int32_t)t->valuedouble;
        n++;
    }
    char what[96], msg[SERVE_ERR_MAX + 256];
    snprintf(what, sizeof what, "/detokenize of %zu tokens (%zu bytes of text)", n, text_len);
    /* the text, and the answer: at most 6 bytes a byte (\u00XX) */
    int st = reserve_answer(cn, text_len + 1 + 6 * (uint64_t)text_len + 16, what, msg, sizeof msg);
    if (st) {
        cJSON_Delete(o);
        return send_error(c, (unsigned)st, st == 413 ? "request_too_large" : "server_busy", msg);
    }
    cli_buf b = {0};
    prev = -1;
    ok = cli_buf_add(&b, "", 0);
    cJSON_ArrayForEach(t, toks) {
        size_t len;
        const char *p = flm_token_piece(ctx, prev, (int32_t)t->valuedouble, &len);
        ok = ok && cli_buf_add(&b, p, len);
        prev = (int32_t)t->valuedouble;
    }
    cJSON_Delete(o);
    /* the content as cJSON writes a string (invalid UTF-8 passes as it is, as before) */
    const size_t len = ok ? 12 + json_string_at(NULL, b.p, b.len) + 1 : 0;
    char *out = ok ? malloc(len + 1) : NULL;
    if (out) {
        memcpy(out, "{\"content\":", 11);
        size_t k = 11 + json_string_at(out + 11, b.p, b.len);
        out[k++] = '}';
        out[k] = 0;
        cli_buf_free(&b);
        return send_owned(c, 200, out, k);
    }
    cli_buf_free(&b);
    return send_error(c, 500, "internal_error", "out of memory");
}

/* POST /apply-template (llama-server's): {"messages"} -> {"prompt": the text the chat template renders}. */
static enum MHD_Result handle_apply_template(struct MHD_Connection *c, conn *cn) {
    serve_req req;
    char msg[SERVE_ERR_MAX];
    int st = serve_parse_request(cn->body.p ? cn->body.p : "", cn->body.len, true, &req, msg, sizeof msg);
    if (!st) st = serve_tools_prepare(&req, srv.slots[0].tmpl, msg, sizeof msg);
    if (st) serve_req_free(&req);
    if (st) return send_error(c, (unsigned)st, st == 400 ? "invalid_request" : "internal_error", msg);
    char *text = NULL;
    flm_error err;
    flm_status fs = flm_chat_apply(srv.slots[0].tmpl, req.msgs, req.n_msgs, true, &text, NULL, &err);
    serve_req_free(&req);
    if (fs) return send_error(c, 500, "internal_error", err.msg);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "prompt", text);
    free(text);
    return send_json(c, 200, out);
}

/* POST /v1/chat/completions/input_tokens (llama-server's): a chat request -> {"input_tokens": the tokens its prompt
 * has} (the rendering and tokenization a completion would evaluate; nothing is evaluated). */
static enum MHD_Result handle_input_tokens(struct MHD_Connection *c, conn *cn) {
    serve_req req;
    char msg[SERVE_ERR_MAX];
    int st = serve_parse_request(cn->body.p ? cn->body.p : "", cn->body.len, true, &req, msg, sizeof msg);
    if (!st) st = serve_tools_prepare(&req, srv.slots[0].tmpl, msg, sizeof msg);
    if (st) serve_req_free(&req);
    if (st) return send_error(c, (unsigned)st, st == 400 ? "invalid_request" : "internal_error", msg);
    int32_t *ids = NULL;
    size_t n = 0;
    flm_error err;
    /* reads the session's settings and the tokenizer only: safe beside the slot's running generation */
    flm_status fs = flm_session_chat_tokens(srv.slots[0].sess, srv.slots[0].tmpl, req.msgs, req.n_msgs, &ids, &n,
                                            &err);
    serve_req_free(&req);
    free(ids);
    if (fs) return send_error(c, 500, "internal_error", err.msg);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "input_tokens", (double)n);
    return send_json(c, 200, out);
}

/* GET /props (llama-server's): the server's settings. */
static enum MHD_Result handle_props(struct MHD_Connection *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_path", srv.model_path);
    cJSON_AddStringToObject(o, "model_alias", srv.model_id);
    cJSON_AddNumberToObject(o, "total_slots", srv.n_slots);
    cJSON_AddStringToObject(o, "chat_template", flm_chat_name(srv.slots[0].tmpl));
    cJSON_AddStringToObject(o, "build_info", "flashlm " FLM_VERSION_STRING);
    cJSON *d = cJSON_AddObjectToObject(o, "default_generation_settings");
    cJSON_AddNumberToObject(d, "n_ctx", srv.n_ctx);
    cJSON *p = cJSON_AddObjectToObject(d, "params");
    flm_sampler_params sp;
    flm_sampler_params_default(&sp);
    if (srv.has_temp) sp.temp = srv.temp;
    sampler_json(p, &sp);
    cJSON_AddNumberToObject(p, "n_predict", (double)srv.n_predict);
    if (srv.has_seed) cJSON_AddNumberToObject(p, "seed", (double)srv.seed);
    else cJSON_AddNullToObject(p, "seed"); /* a new one per request unless the request gives one */
    cJSON_AddNumberToObject(o, "max_body_bytes", (double)srv.max_body);
    return send_json(c, 200, o);
}

/* GET /slots: each slot's context, whether it runs, the tokens its cache holds (no prompt text: other clients'). */
static enum MHD_Result handle_slots(struct MHD_Connection *c) {
    cJSON *a = cJSON_CreateArray();
    pthread_mutex_lock(&srv.mu);
    for (int i = 0; i < srv.n_slots; i++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddNumberToObject(s, "id", i);
        cJSON_AddNumberToObject(s, "n_ctx", srv.n_ctx);
        cJSON_AddBoolToObject(s, "is_processing", srv.slots[i].cur != NULL);
        cJSON_AddNumberToObject(s, "n_past", (double)srv.slots[i].n_past);
        cJSON_AddItemToArray(a, s);
    }
    pthread_mutex_unlock(&srv.mu);
    return send_json(c, 200, a);
}

/* POST /v1/embeddings (OpenAI's; llama-server's --embeddings --pooling mean): "input" a string, an array of
 * strings, an array of token ids or an array of those; "encoding_format" float (default) or base64; "model" as for
 * completions. Each input tokenized as /tokenize with add_special (BOS), embedded by a slot (flm_embed). */
static enum MHD_Result handle_embeddings(struct MHD_Connection *c, conn *cn) {
    enum MHD_Result r = MHD_NO;
    cJSON *o = body_object(c, cn, &r);
    if (!o) return r;
    {
        static const char *const KNOWN[] = {"input", "encoding_format", "model", "dimensions", "user"};
        char fm[256];
        if (!serve_fields_known(o, KNOWN, sizeof KNOWN / sizeof *KNOWN, "/v1/embeddings", fm, sizeof fm)) {
            cJSON_Delete(o);
            return send_error(c, 400, "invalid_request", fm);
        }
    }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(o, "input");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "encoding_format");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(o, "dimensions");
    const char *bad = NULL;
    if (fmt && !cJSON_IsNull(fmt) && !(cJSON_IsString(fmt) && (!strcmp(fmt->valuestring, "float") ||
                                                               !strcmp(fmt->valuestring, "base64"))))
        bad = "'encoding_format' must be \"float\" or \"base64\"";
    else if (dims && !cJSON_IsNull(dims))
        bad = "'dimensions' is not supported (the embedding has the model's d_model)";
    else if (model && !cJSON_IsNull(model) && !cJSON_IsString(model))
        bad = "'model' must be a string";
    else if (!in || !(cJSON_IsString(in) || (cJSON_IsArray(in) && cJSON_GetArraySize(in) >= 1 &&
                                              cJSON_GetArraySize(in) <= 2048)))
        bad = "'input' must be a string, token ids, or an array of 1 to 2048 of them";
    if (bad) {
        cJSON_Delete(o);
        return send_error(c, 400, "invalid_request", bad);
    }
    if (srv.strict_model && cJSON_IsString(model) && !model_named(model->valuestring)) {
        char m[SERVE_ERR_MAX + 64];
        snprintf(m, sizeof m, "the model '%.200s' does not exist: this server has '%s'", model->valuestring,
                 srv.model_id);
        cJSON_Delete(o);
        return send_error(c, 404, "model_not_found", m);
    }
    /* the inputs: one string or id list, or an array of them */
    bool one = cJSON_IsString(in) || (cJSON_IsArray(in) && cJSON_IsNumber(in->child));
    size_t n = one ? 1 : (size_t)cJSON_GetArraySize(in);
    job *j = calloc(1, sizeof *j);
    if (j) {
        j->embed = true;
        j->emb_base64 = cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "base64");
        j->emb_ids = calloc(n, sizeof *j->emb_ids);
        j->emb_n = calloc(n, sizeof *j->emb_n);
    }
    if (!j || !j->emb_ids || !j->emb_n) {
        if (j) { free(j->emb_ids); free(j->emb_n); free(j); }
        cJSON_Delete(o);
        return send_error(c, 500, "internal_error", "out of memory");
    }
    const flm_ctx *ctx = srv.slots[0].ctx;
    uint32_t nv = flm_vocab_size(ctx);
    char m[160] = "";
    const cJSON *item = one ? in : in->child;
    for (size_t i = 0; i < n && !m[0]; i++, item = item->next) {
        size_t k = 0;
        int32_t *ids = NULL;
        if (cJSON_IsString(item)) {
            const char *t = item->valuestring;
            k = flm_tokenize_ex(ctx, t, strlen(t), FLM_TOKENIZE_ADD_SPECIAL, NULL, 0);
            if (k != SIZE_MAX && k > 0 && (ids = malloc(k * sizeof *ids)))
                flm_tokenize_ex(ctx, t, strlen(t), FLM_TOKENIZE_ADD_SPECIAL, ids, k);
            if (k == 0 || !*t) snprintf(m, sizeof m, "input[%zu] is empty", i);
        } else if (cJSON_IsArray(item) && cJSON_GetArraySize(item) >= 1 && cJSON_GetArraySize(item) <= 1 << 20) {
            k = (size_t)cJSON_GetArraySize(item);
            if ((ids = malloc(k * sizeof *ids))) {
                size_t t = 0;
                const cJSON *x;
                cJSON_ArrayForEach(x, item) {
                    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= nv ||
                        x->valuedouble != floor(x->valuedouble)) {
                        snprintf(m, sizeof m, "input[%zu]: token ids must be integers from 0 to %u", i, nv - 1);
                        break;
                    }
                    ids[t++] = (int32_t)x->valuedouble;
                }
            }
        } else {
            snprintf(m, sizeof m, "input[%zu] must be a string or an array of token ids", i);
        }
        if (!m[0] && !ids) snprintf(m, sizeof m, "out of memory");
        j->emb_ids[i] = ids;
        j->emb_n[i] = (uint32_t)(k > UINT32_MAX ? UINT32_MAX : k);
        j->n_emb = i + 1;
    }
    cJSON_Delete(o);
    int st = m[0] ? (strcmp(m, "out of memory") ? 400 : 500) : 0;
    char msg[SERVE_ERR_MAX + 256];
    if (!st) { /* the answer: each input's numbers, as text (~17 bytes a number) held by the job's output, the reply
                  and libmicrohttpd's copy, twice while printed; base64: 4/3 of 4 bytes a number */
        flm_model_info info;
        flm_get_info(ctx, &info);
        const uint64_t per = j->emb_base64 ? (uint64_t)info.d_model * 4 * 4 / 3 + 8 : (uint64_t)info.d_model * 17;
        char what[96];
        snprintf(what, sizeof what, "/v1/embeddings of %zu inputs (%u numbers each)", n, info.d_model);
        if ((st = reserve_answer(cn, (uint64_t)n * (4 * per + 256), what, msg, sizeof msg))) m[0] = 1;
    } else {
        snprintf(msg, sizeof msg, "%s", m);
    }
    if (st) {
        pthread_mutex_lock(&srv.mu);
        j->refs = 1;
        job_unref_locked(j);
        pthread_mutex_unlock(&srv.mu);
        return send_error(c, (unsigned)st, st == 400 ? "invalid_request" : st == 413 ? "request_too_large" :
                          st == 503 ? "server_busy" : "internal_error", msg);
    }
    return serve_job(c, cn, j, "embd");
}

/* Routes: OpenAI's under /v1 and without it (llama.cpp's front ends call /chat/completions, /models), and
 * llama-server's own. */
enum route { R_NONE, R_HEALTH, R_CHAT, R_COMPL, R_NATIVE, R_MODELS, R_MODEL, R_METRICS, R_PAGE, R_TOKENIZE,
             R_DETOKENIZE, R_PROPS, R_SLOTS, R_EMBED, R_RESPONSES, R_TEMPLATE, R_INPUT_TOKENS };

static enum route route_of(const char *url, const char **model) {
    bool v1 = !strncmp(url, "/v1/", 4);
    const char *p = v1 ? url + 3 : url;
    if (!strcmp(p, "/health")) return R_HEALTH;
    if (!strcmp(p, "/chat/completions")) return R_CHAT;
    if (!strcmp(p, "/chat/completions/input_tokens")) return R_INPUT_TOKENS;
    if (!strcmp(p, "/completions")) return v1 ? R_COMPL : R_NATIVE; /* llama-server: /completions is its own */
    if (!strcmp(p, "/completion")) return R_NATIVE;
    if (!strcmp(p, "/models")) return R_MODELS;
    if (!strncmp(p, "/models/", 8) && p[8]) { *model = p + 8; return R_MODEL; }
    if (!strcmp(p, "/embeddings") || !strcmp(p, "/embedding")) return R_EMBED;
    if (!strcmp(p, "/responses")) return R_RESPONSES;
    if (v1) return R_NONE;
    if (!strcmp(p, "/metrics")) return R_METRICS;
    if (!strcmp(p, "/") || !strcmp(p, "/index.html")) return R_PAGE;
    if (!strcmp(p, "/tokenize")) return R_TOKENIZE;
    if (!strcmp(p, "/detokenize")) return R_DETOKENIZE;
    if (!strcmp(p, "/props")) return R_PROPS;
    if (!strcmp(p, "/slots")) return R_SLOTS;
    if (!strcmp(p, "/apply-template")) return R_TEMPLATE;
    return R_NONE;
}

/* Refuse a request while its body arrives (a chunked body grown past a limit): the answer written to the socket
 * (libmicrohttpd 0.9.75 queues no response before the body's end), then the connection closed (MHD_NO) rather
 * than the rest of the body read, however long it goes on. */
static enum MHD_Result refuse_body(struct MHD_Connection *c, unsigned status, const char *code, const char *msg) {
    char *s = error_json(status, msg, code);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    pthread_mutex_lock(&srv.mu);
    srv.requests++;
    srv.errors++;
    pthread_mutex_unlock(&srv.mu);
    if (s && ci) {
        char head[300];
        const size_t n = strlen(s);
        int h = snprintf(head, sizeof head, "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n%s\r\n", status,
                         status == 413 ? "Content Too Large" : status == 503 ? "Service Unavailable"
                                                                              : "Internal Server Error",
                         n, status == 503 ? "Retry-After: 1\r\n" : "");
        const int fd = ci->connect_fd;
        (void)!send(fd, head, (size_t)h, MSG_NOSIGNAL);
        (void)!send(fd, s, n, MSG_NOSIGNAL);
        shutdown(fd, SHUT_WR); /* the answer ends here; the client reads it before the close */
    }
    free(s);
    return MHD_NO;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)cls;
    conn *cn = *con_cls;
    if (!cn) { /* the headers: check them before reading the body */
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        cn->http11 = version && !strcmp(version, "HTTP/1.1");
        return check_headers(c, method, version, cn);
    }
    if (*upload_size) { /* a piece of the body */
        const uint64_t len = cn->body.len + *upload_size;
        if (len > srv.max_body) { /* only a chunked body gets here (a Content-Length was checked): refused now */
            char m[200];
            snprintf(m, sizeof m, "the request body (chunked) reached %" PRIu64 " bytes as received, over --max-body "
                     "(%zu bytes)", len, srv.max_body);
            return refuse_body(c, 413, "request_too_large", m);
        }
        if (cn->grows && REQ_COST(len) > cn->held) { /* a chunked body under --mem: its memory as it grows */
            char m[400];
            const uint64_t cost = REQ_COST(len);
            if (cost > srv.req_cap) {
                snprintf(m, sizeof m, "the request body (chunked) reached %" PRIu64 " bytes as received: the memory "
                         "budget (--mem %s) leaves %s for requests, a body of at most %" PRIu64 " bytes: send a "
                         "shorter one or raise --mem", len, cli_size(srv.budget).s, cli_size(srv.req_cap).s,
                         (srv.req_cap - REQ_BASE) / REQ_FACTOR);
                return refuse_body(c, 413, "request_too_large", m);
            }
            pthread_mutex_lock(&srv.mu);
            const uint64_t held = srv.req_held - cn->held;
            const bool fits = held + cost <= srv.req_cap;
            if (fits) {
                srv.req_held += cost - cn->held;
                cn->held = cost;
            }
            pthread_mutex_unlock(&srv.mu);
            if (!fits) {
                snprintf(m, sizeof m, "the request body (chunked) reached %" PRIu64 " bytes as received, needing about "
                         "%s; the other requests in flight hold %s of the %s the memory budget (--mem %s) leaves for "
                         "requests: try again later", len, cli_size(cost).s, cli_size(held).s,
                         cli_size(srv.req_cap).s, cli_size(srv.budget).s);
                return refuse_body(c, 503, "server_busy", m);
            }
        }
        if (!cli_buf_add(&cn->body, upload_data, *upload_size))
            return refuse_body(c, 500, "internal_error", "out of memory reading the request body");
        *upload_size = 0;
        return MHD_YES;
    }
    conn_phase_set(c, PHASE_BUSY);
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    const char *model = NULL;
    enum route rt = route_of(url, &model);
    if (rt == R_HEALTH) {
        const char *ok = "{\"status\":\"ok\"}";
        pthread_mutex_lock(&srv.mu);
        srv.requests++;
        pthread_mutex_unlock(&srv.mu);
        return send_text(c, 200, "application/json", ok, strlen(ok));
    }
    if (rt == R_NONE || (rt == R_PAGE && srv.no_ui)) {
        char m[300];
        snprintf(m, sizeof m, "no such endpoint: %.16s %.200s", method, url);
        return send_error(c, 404, "not_found", m);
    }
    /* the page is static and holds nothing: a browser cannot send the key to load it (llama-server's rule too) */
    if (rt != R_PAGE && !authorized(c))
        return send_error(c, 401, "invalid_api_key",
                          "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)");
    bool is_post = rt == R_CHAT || rt == R_COMPL || rt == R_NATIVE || rt == R_TOKENIZE || rt == R_DETOKENIZE ||
                   rt == R_EMBED || rt == R_RESPONSES || rt == R_TEMPLATE || rt == R_INPUT_TOKENS;
    if (is_post && !post) return send_error(c, 405, "method_not_allowed", "use POST");
    if (!is_post && !get) return send_error(c, 405, "method_not_allowed", "use GET");
    if (post) {
        char m[300];
        int st = serve_check_post(&access_cfg, req_header(c, "Origin"), req_header(c, "Host"),
                                  req_header(c, "Content-Type"), m, sizeof m);
        if (st) return send_error(c, (unsigned)st, st == 403 ? "forbidden_origin" : "unsupported_media_type", m);
    }
    switch (rt) {
    case R_CHAT: return handle_generate(c, cn, true, false);
    case R_COMPL: return handle_generate(c, cn, false, false);
    case R_NATIVE: return handle_generate(c, cn, false, true);
    case R_TOKENIZE: return handle_tokenize(c, cn);
    case R_DETOKENIZE: return handle_detokenize(c, cn);
    case R_TEMPLATE: return handle_apply_template(c, cn);
    case R_INPUT_TOKENS: return handle_input_tokens(c, cn);
    case R_EMBED: return handle_embeddings(c, cn);
    case R_RESPONSES:
        return send_error(c, 501, "not_implemented", "the Responses API (/v1/responses) is not implemented: use "
                          "/v1/chat/completions");
    case R_PROPS: return handle_props(c);
    case R_SLOTS:
        if (!srv.slots_on) return send_error(c, 501, "not_supported", "GET /slots is off (--no-slots)");
        return handle_slots(c);
    case R_METRICS:
        if (!srv.metrics_on)
            return send_error(c, 501, "not_supported", "GET /metrics is off: start flashlm serve with --metrics");
        return send_metrics(c);
    case R_MODELS: {
        cJSON *o = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(o, "data");
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddItemToArray(data, model_json());
        return send_json(c, 200, o);
    }
    case R_MODEL: {
        if (!model_named(model)) {
            char m[SERVE_ERR_MAX + 64];
            snprintf(m, sizeof m, "the model '%.200s' does not exist: this server has '%s'", model, srv.model_id);
            return send_error(c, 404, "model_not_found", m);
        }
        return send_json(c, 200, model_json());
    }
    default:
        pthread_mutex_lock(&srv.mu);
        srv.requests++;
        pthread_mutex_unlock(&srv.mu);
        return send_text(c, 200, "text/html; charset=utf-8", (const char *)SERVE_PAGE, SERVE_PAGE_LEN);
    }
}

/* ---- the command ------------------------------------------------------------------------------------------------ */

/* The model's id: the file name without directory and .gguf / .flm. */
static void model_id_of(const char *path, char *out, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, cap, "%s", b);
    size_t n = strlen(out);
    if (n > 5 && !strcmp(out + n - 5, ".gguf")) out[n - 5] = 0;
    else if (n > 4 && !strcmp(out + n - 4, ".flm")) out[n - 4] = 0;
}

int cmd_serve(int argc, char **argv) {
    const char *model = NULL, *host = "127.0.0.1", *chat_name = NULL;
    srv.n_predict = -1;
    long port = 8080, parallel = 1, queue = 16, max_conns = 2048, header_s = 30, body_s = 60, idle_s = 600;
    char cors_buf[4096] = "";
    uint64_t max_body = 1u << 20;
    bool verbose = false, shift = false;
    flm_params params;
    flm_params_default(&params);
    cli_spec_args sa;
    cli_spec_args_default(&sa);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int used = cli_parse_model_opt(argc, argv, &i, &params);
        if (!used) used = cli_parse_spec_opt(argc, argv, &i, &sa);
        if (used < 0) return 2;
        if (used) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s%s\nshared options:\n%s", SERVE_HELP, CLI_SPEC_OPTS_HELP, CLI_MODEL_OPTS_HELP);
            return 0;
        }
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { verbose = serve_verbose_default = true; continue; }
        if (!strcmp(a, "--context-shift")) { shift = true; continue; }
        if (!strcmp(a, "--strict-model")) { srv.strict_model = true; continue; }
        if (!strcmp(a, "--slots")) { srv.slots_on = true; continue; }
        if (!strcmp(a, "--no-slots")) { srv.slots_on = false; continue; }
        if (!strcmp(a, "--no-ui")) { srv.no_ui = true; continue; }
        if (!strcmp(a, "--metrics")) { srv.metrics_on = true; continue; }
        if (!strcmp(a, "--allow-special-in-content")) { cli_allow_special = true; continue; }
        bool takes = !strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--host") || !strcmp(a, "--port") ||
                     !strcmp(a, "--api-key") || !strcmp(a, "--parallel") || !strcmp(a, "--queue") ||
                     !strcmp(a, "--max-body") || !strcmp(a, "--chat-template") || !strcmp(a, "--alias") ||
                     !strcmp(a, "-a") || !strcmp(a, "--tags") ||
                     !strcmp(a, "--cors") || !strcmp(a, "--max-connections") || !strcmp(a, "--header-timeout") ||
                     !strcmp(a, "--body-timeout") || !strcmp(a, "--timeout") || !strcmp(a, "--cors-origins") ||
                     !strcmp(a, "--temp") || !strcmp(a, "--seed") || !strcmp(a, "--n-predict");
        if (!takes) return cli_die("unknown option '%s' (see flashlm serve --help)", a);
        if (!val) return cli_die("option %s needs a value (see flashlm serve --help)", a);
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = val;
        else if (!strcmp(a, "--host")) host = val;
        else if (!strcmp(a, "--api-key")) {
            if (!*val) return cli_die("%s", "--api-key must not be empty");
            srv.api_key = val;
        } else if (!strcmp(a, "--alias") || !strcmp(a, "-a")) {
            if (!name_set_add(&aliases, val, a)) return 2;
        } else if (!strcmp(a, "--tags")) {
            if (!name_set_add(&tags, val, a)) return 2;
        }
        else if (!strcmp(a, "--temp")) {
            char *end;
            double t = strtod(val, &end);
            if (*end || end == val || !(t >= 0 && t <= 2)) return cli_die("bad --temp '%s' (0..2)", val);
            srv.has_temp = true;
            srv.temp = (float)t;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(val, &end, 10);
            if (*end || end == val || errno || *val == '-')
                return cli_die("bad --seed '%s' (a non-negative integer)", val);
            srv.has_seed = true;
            srv.seed = v;
        } else if (!strcmp(a, "--n-predict")) {
            if (!cli_parse_long(val, -1, 1 << 24, &srv.n_predict)) return cli_die("bad --n-predict '%s' (-1..16M)", val);
        } else if (!strcmp(a, "--cors") || !strcmp(a, "--cors-origins")) {
            size_t have = strlen(cors_buf);
            if (have + strlen(val) + 2 > sizeof cors_buf) return cli_die("%s", "--cors: too many origins");
            snprintf(cors_buf + have, sizeof cors_buf - have, "%s%s", have ? "," : "", val);
        } else if (!strcmp(a, "--max-connections")) {
            if (!cli_parse_long(val, 1, 65536, &max_conns)) return cli_die("bad --max-connections '%s' (1..65536)", val);
        } else if (!strcmp(a, "--header-timeout")) {
            if (!cli_parse_long(val, 1, 86400, &header_s)) return cli_die("bad --header-timeout '%s' (1..86400 s)", val);
        } else if (!strcmp(a, "--body-timeout")) {
            if (!cli_parse_long(val, 1, 86400, &body_s)) return cli_die("bad --body-timeout '%s' (1..86400 s)", val);
        } else if (!strcmp(a, "--timeout")) {
            if (!cli_parse_long(val, 1, 86400, &idle_s)) return cli_die("bad --timeout '%s' (1..86400 s)", val);
        }
        else if (!strcmp(a, "--port")) {
            if (!cli_parse_long(val, 0, 65535, &port)) return cli_die("bad --port '%s' (0..65535)", val);
        } else if (!strcmp(a, "--parallel")) {
            if (!cli_parse_long(val, 1, 64, &parallel)) return cli_die("bad --parallel '%s' (1..64)", val);
        } else if (!strcmp(a, "--queue")) {
            if (!cli_parse_long(val, 0, 1 << 20, &queue)) return cli_die("bad --queue '%s' (0..1048576)", val);
        } else if (!strcmp(a, "--max-body")) {
            double pct = 0;
            if (!flm_parse_mem(val, &max_body, &pct) || pct > 0 || max_body == 0 || max_body > (1ull << 30))
                return cli_die("bad --max-body '%s' (bytes with an optional K/M/G suffix, at most 1G)", val);
        } else {
            if (!flm_chat_name_valid(val))
                return cli_die("unknown chat template '%s' (valid: " FLM_CHAT_TEMPLATE_NAMES ")", val);
            chat_name = val;
        }
    }
    if (!model) return cli_die("%s", "no model given: use -m MODEL (see flashlm serve --help)");
    if (cli_spec_args_check(&sa)) return 2;
    sa.greedy = false; /* requests choose their temperature: a tree keeps its drafts' distributions (budgeted) */
    /* the addresses: --host A[,B...], each numeric (IPv4 or IPv6) or localhost */
    char host_buf[1024];
    if (strlen(host) >= sizeof host_buf) return cli_die("%s", "--host: too long");
    snprintf(host_buf, sizeof host_buf, "%s", host);
    struct sockaddr_storage addrs[SERVE_HOSTS_MAX];
    int n_addrs = 0;
    for (char *save = NULL, *h = strtok_r(host_buf, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
        while (*h == ' ') h++;
        if (!strcmp(h, "localhost")) h = "127.0.0.1";
        if (n_addrs == SERVE_HOSTS_MAX) return cli_die("%s", "--host: at most 8 addresses");
        struct sockaddr_storage *ss = &addrs[n_addrs];
        memset(ss, 0, sizeof *ss);
        struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
        if (inet_pton(AF_INET, h, &a4->sin_addr) == 1) a4->sin_family = AF_INET;
        else if (inet_pton(AF_INET6, h, &a6->sin6_addr) == 1) a6->sin6_family = AF_INET6;
        else return cli_die("bad --host '%s' (numeric IPv4 or IPv6 addresses or localhost, separated by commas)", h);
        access_cfg.hosts[n_addrs++] = h;
    }
    if (!n_addrs) return cli_die("%s", "--host: no address");
    access_cfg.n_hosts = n_addrs;
    for (char *save = NULL, *o = strtok_r(cors_buf, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
        while (*o == ' ') o++;
        if (!*o) continue;
        if (access_cfg.n_cors == SERVE_CORS_MAX) return cli_die("%s", "--cors: at most 32 origins");
        access_cfg.cors[access_cfg.n_cors++] = o;
    }
    access_cfg.api_key = srv.api_key != NULL;
    conns.max = (int)max_conns;
    conns.header_s = (double)header_s;
    conns.body_s = (double)body_s;
    /* one descriptor per connection: raise the soft limit toward the hard one (the default 1024 is below
     * --max-connections) */
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)max_conns + 256) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (rlim_t)max_conns + 256 ? (rlim_t)max_conns + 256
                                                                                             : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    char model_buf[4096], id_buf[256];
    model = cli_resolve_model(model, model_buf, sizeof model_buf);
    model_id_of(model, id_buf, sizeof id_buf);
    srv.model_id = aliases.n ? aliases.v[0] : id_buf;
    struct stat st;
    if (!stat(model, &st)) srv.model_bytes = (uint64_t)st.st_size;
    srv.model_path = model;
    srv.start_unix = (double)time(NULL);
    srv.n_batch = params.n_batch;
    srv.max_body = (size_t)max_body;
    srv.queue_cap = (int)queue;
    cli_env_params(&params, model);
    cli_log_verbose(&params, verbose);

    /* one budget for all slots: one context holding a sequence per slot, or (explicit speculative decoding) each slot
     * opens the model with an equal share */
    const bool shared = parallel > 1 && !cli_spec_active(&sa);
    flm_error err;
    if (params.mem_bytes || params.mem_percent > 0) {
        if (flm_plan_budget_bytes(model, &params, &srv.budget, &err)) { /* --mem N% in bytes; each slot plans its own */
            fprintf(stderr, "flashlm: %s\n", err.msg);
            return 1;
        }
        if (parallel > 1 && !shared) {
            params.mem_bytes = srv.budget / (uint64_t)parallel;
            params.mem_percent = 0;
        }
    }
    /* -c is the context of all slots together, each slot holding -c / --parallel (llama-server's -c); without -c each
     * slot has the default context */
    if (params.n_ctx > 0 && parallel > 1) {
        if (params.n_ctx / parallel < 8) return cli_die("%s", "-c is too small for --parallel (-c is shared by the slots)");
        params.n_ctx = (int)(params.n_ctx / parallel);
    }
    if (shared) params.n_seq = (int)parallel;
    srv.shared = shared;
    srv.n_slots = (int)parallel;
    srv.slots = calloc((size_t)parallel, sizeof *srv.slots);
    if (!srv.slots) { fprintf(stderr, "flashlm: out of memory\n"); return 1; }
    int rc = 0, n_open = 0, n_threads = 0;
    for (int i = 0; i < srv.n_slots; i++, n_open++) {
        slot *s = &srv.slots[i];
        s->index = i;
        if (shared && i > 0) { /* the next sequence of slot 0's context */
            s->ctx = srv.slots[0].ctx;
            s->seq = (uint32_t)i;
            s->spec = calloc(1, sizeof *s->spec);
            if (!s->spec) { fprintf(stderr, "flashlm: out of memory\n"); rc = 1; break; }
            s->spec->a = sa;
            if (flm_chat_open(s->ctx, chat_name, &s->tmpl, &err) || flm_session_create_seq(s->ctx, s->seq, &s->sess, &err)) {
                fprintf(stderr, "flashlm: %s\n", err.msg);
                n_open++;
                rc = 1;
                break;
            }
            flm_session_set_special_in_content(s->sess, cli_allow_special);
            if (cli_spec_begin(s->spec, s->ctx, model, s->sess)) {
                n_open++;
                rc = 1;
                break;
            }
            continue;
        }
        /* speculative decoding as run's: the slot's draft model first, inside the slot's budget; the target gets
         * what it leaves (and mode auto running hot drafts with the model itself) */
        flm_params sp = params;
        s->spec = calloc(1, sizeof *s->spec);
        if (!s->spec) { fprintf(stderr, "flashlm: out of memory\n"); rc = 1; break; }
        s->spec->a = sa;
        if (cli_spec_open_draft(s->spec, model, &sp, verbose || i == 0)) { rc = 1; break; }
        if (flm_open(model, &sp, &s->ctx, &err)) {
            fprintf(stderr, "flashlm: %s%s\n", err.msg,
                    parallel > 1 && err.code == FLM_ERR_BUDGET
                        ? shared ? " (the budget holds the weights once and a KV cache per --parallel slot)"
                                 : " (each of the --parallel slots gets budget / N)" : "");
            cli_spec_target_refused(s->spec, err.code);
            rc = 1;
            break;
        }
        if ((i == 0 && cli_after_open(s->ctx)) || (i == 0 ? cli_chat_template(s->ctx, chat_name, &s->tmpl)
                                                        : flm_chat_open(s->ctx, chat_name, &s->tmpl, &err) != FLM_OK) ||
            flm_session_create(s->ctx, &s->sess, &err)) {
            if (i > 0 || s->tmpl) fprintf(stderr, "flashlm: %s\n", err.msg);
            n_open++;
            rc = 1;
            break;
        }
        flm_session_set_special_in_content(s->sess, cli_allow_special);
        if (cli_spec_begin(s->spec, s->ctx, model, s->sess)) {
            n_open++;
            rc = 1;
            break;
        }
    }
    if (!rc) {
        flm_model_info info;
        flm_get_info(srv.slots[0].ctx, &info);
        srv.n_ctx = info.n_ctx;
        srv.n_vocab = info.n_vocab;
        srv.n_ctx_train = info.n_ctx_train;
        srv.n_embd = info.d_model;
        for (int i = 0; i < srv.n_slots; i++) {
            if (i > 0 && srv.slots[i].ctx == srv.slots[0].ctx) continue;
            flm_plan_info pi;
            flm_get_plan(srv.slots[i].ctx, &pi);
            srv.planned += pi.total;
        }
        if (srv.budget) /* the budget's unplanned part and half the allowance (the other half: the program itself) */
            srv.req_cap = (srv.budget > srv.planned ? srv.budget - srv.planned : 0) + FLM_RSS_ALLOWANCE / 2;
        for (int i = 0; i < srv.n_slots; i++) /* keep BOS (and nothing more) when the context shifts */
            flm_session_set_shift(srv.slots[i].sess, shift, flm_add_bos(srv.slots[i].ctx) ? 1 : 0);
    }
    /* the signals are taken by sigwait below: block them in every thread (they inherit the mask) */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    for (int i = 0; !rc && i < srv.n_slots; i++, n_threads++)
        if (pthread_create(&srv.slots[i].thread, NULL, worker, &srv.slots[i])) {
            fprintf(stderr, "flashlm: cannot start a worker thread\n");
            rc = 1;
        }
    struct MHD_Daemon *d[SERVE_HOSTS_MAX] = {0};
    pthread_t wd;
    bool wd_started = false;
    long bound = port;
    char where[SERVE_HOSTS_MAX * 64] = "";
    if (!rc) {
        if (pthread_create(&wd, NULL, watchdog, NULL)) {
            fprintf(stderr, "flashlm: cannot start a thread\n");
            rc = 1;
        } else {
            wd_started = true;
        }
    }
    /* libmicrohttpd: a thread per connection (the handlers block while a request waits or streams), poll() (not
     * select(), limited to descriptors below 1024), 1 MiB stacks (the JSON parser's recursion, not 8 MiB each) */
    for (int i = 0; !rc && i < n_addrs; i++) {
        bool v6 = addrs[i].ss_family == AF_INET6;
        if (v6) ((struct sockaddr_in6 *)&addrs[i])->sin6_port = htons((uint16_t)bound);
        else ((struct sockaddr_in *)&addrs[i])->sin_port = htons((uint16_t)bound);
        d[i] = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
                                    (v6 ? MHD_USE_IPv6 : 0),
                                (uint16_t)bound, NULL, NULL, handler, NULL, MHD_OPTION_SOCK_ADDR,
                                (struct sockaddr *)&addrs[i], MHD_OPTION_NOTIFY_COMPLETED, request_done, NULL,
                                MHD_OPTION_NOTIFY_CONNECTION, notify_connection, NULL, MHD_OPTION_CONNECTION_LIMIT,
                                (unsigned)(max_conns + 64), MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)idle_s,
                                MHD_OPTION_THREAD_STACK_SIZE, (size_t)1 << 20, MHD_OPTION_END);
        if (!d[i]) {
            fprintf(stderr, "flashlm: cannot listen on %s port %ld: %s\n", access_cfg.hosts[i], bound, strerror(errno));
            rc = 1;
            break;
        }
        if (i == 0) { /* --port 0: the others take the port the first was given */
            const union MHD_DaemonInfo *di = MHD_get_daemon_info(d[0], MHD_DAEMON_INFO_BIND_PORT);
            if (di && di->port) bound = di->port;
        }
        size_t at = strlen(where);
        snprintf(where + at, sizeof where - at, "%shttp://%s%s%s:%ld/", i ? " and " : "", v6 ? "[" : "",
                 access_cfg.hosts[i], v6 ? "]" : "", bound);
    }
    if (!rc) {
        const cli_spec_session *ss = srv.slots[0].spec;
        char spec_desc[4200] = "";
        if (ss->on)
            snprintf(spec_desc, sizeof spec_desc, "; speculative decoding: %s%s, up to %d per step",
                     ss->draft ? "draft " : ss->a.self_draft ? (ss->a.tree ? "self-draft tree" : "self-draft")
                                                              : "n-gram lookup",
                     ss->draft ? ss->draft_path : "", ss->a.n_draft);
        fprintf(stderr, "flashlm: serving %s on %s (%d slot%s, context %u tokens%s, budget %s%s%s); "
                "Ctrl-C stops\n", srv.model_id, where, srv.n_slots, srv.n_slots > 1 ? "s" : "", srv.n_ctx,
                srv.n_slots > 1 ? " each" : "",
                srv.budget ? cli_size(srv.budget).s : "none", srv.n_slots > 1 && srv.budget ? shared ? " shared" : " split evenly" : "",
                spec_desc);
        int sig = 0;
        sigwait(&sigs, &sig);
        fprintf(stderr, "flashlm: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    /* stop: cancel what runs, answer what waits, then the daemon (its threads leave their waits), then the workers */
    pthread_mutex_lock(&srv.mu);
    srv.stopping = true;
    while (srv.head) job_abandon_locked(srv.head);
    for (int i = 0; i < n_threads; i++)
        if (srv.slots[i].cur) job_abandon_locked(srv.slots[i].cur);
    pthread_cond_broadcast(&srv.cv);
    pthread_mutex_unlock(&srv.mu);
    for (int i = 0; i < n_addrs; i++)
        if (d[i]) MHD_stop_daemon(d[i]);
    if (wd_started) {
        pthread_mutex_lock(&conns.mu);
        conns.stop = true;
        pthread_cond_broadcast(&conns.cv);
        pthread_mutex_unlock(&conns.mu);
        pthread_join(wd, NULL);
    }
    for (int i = 0; i < n_threads; i++) pthread_join(srv.slots[i].thread, NULL);
    if (!rc)
        fprintf(stderr, "flashlm: served %" PRIu64 " requests (%" PRIu64 " errors, %" PRIu64 " cancelled); %" PRIu64
                " prompt tokens (%" PRIu64 " reused), %" PRIu64 " generated\n", srv.requests, srv.errors,
                srv.cancelled, srv.prompt_tokens, srv.reused_tokens, srv.gen_tokens);
    for (int i = 0; i < srv.n_slots; i++) {
        if (i < n_open) {
            flm_session_free(srv.slots[i].sess);
            flm_chat_close(srv.slots[i].tmpl);
            if (!shared) flm_close(srv.slots[i].ctx);
        }
        if (srv.slots[i].spec) cli_spec_session_close(srv.slots[i].spec); /* the draft model, after the target */
        free(srv.slots[i].spec);
    }
    if (shared) flm_close(srv.slots[0].ctx); /* the shared context once, after its sessions */
    free(srv.slots);
    return rc;
}
