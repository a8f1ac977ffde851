/* cmd_serve.c — `flashlm serve`: an OpenAI-compatible HTTP server (libmicrohttpd, cJSON) over the library's sessions
 * (flm_session_*), and a chat page at / (tools/serve_page.html, embedded at build time).
 *
 * Threads: libmicrohttpd runs one thread per connection; it parses the request (tools/serve_req.c) and queues a job.
 * Each slot (--parallel N; default 1) is a worker thread with its own context (its own KV cache; the weights are
 * not shared between contexts: each slot opens the model with budget / N) and session; it takes jobs in order,
 * feeds the prompt (keeping the prefix its cache already holds) and generates, appending the response (server-sent
 * events when streaming) to the job's buffer, which the connection's thread sends. A connection that closes cancels
 * its job (queued: dropped; running: flm_session_cancel), so its slot serves the next request. A full queue (--queue)
 * answers 503. SIGINT or SIGTERM: running generations are cancelled, queued ones answered 503, the daemon stopped,
 * the contexts closed. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
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
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "cli.h"
#include "flashlm.h"
#include "serve.h"
#include "serve_page.h" /* SERVE_PAGE, SERVE_PAGE_LEN: generated from tools/serve_page.html (CMakeLists.txt) */

static const char *SERVE_HELP =
    "usage: flashlm serve -m MODEL [options]\n"
    "\n"
    "Serve the model over HTTP with OpenAI's API (POST /v1/chat/completions, POST /v1/completions, streaming or not;\n"
    "GET /v1/models), GET /health, GET /metrics (Prometheus text) and a chat page at /. The model is opened once per\n"
    "slot under the budget (--mem, shared by the slots); requests queue and run one at a time per slot.\n"
    "\n"
    "  -m, --model PATH     model file: .gguf or .flm, or a pulled model's name\n"
    "      --host ADDR      IPv4 address to listen on (default 127.0.0.1: this machine only)\n"
    "      --port N         TCP port (default 8080; 0: any free one, printed on stderr)\n"
    "      --api-key KEY    require \"Authorization: Bearer KEY\" on every endpoint but /health and the page\n"
    "      --parallel N     slots: N contexts, each with its own KV cache and budget / N (default 1)\n"
    "      --queue N        requests that may wait for a busy slot (default 16); beyond: 503\n"
    "      --max-body BYTES largest request body (default 1M); larger: 413\n"
    "      --chat-template NAME  chat format instead of the model's: " FLM_CHAT_TEMPLATE_NAMES "\n"
    "      --alias NAME     the model's id in the API (default: the file name without its extension)\n"
    "      --context-shift  when a reply fills the context, forget the older half after BOS and go on (as run's);\n"
    "                       default: the reply ends there (finish_reason \"length\")\n"
    "  -v, --verbose        print the library's debug messages\n"
    "  -h, --help           this help\n"
    "\n"
    "Speculative decoding (as flashlm run; per slot, inside the slot's share of --mem: a --draft model is opened in\n"
    "each slot):\n";

/* ---- jobs and slots --------------------------------------------------------------------------------------------- */

enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_STREAMING, JOB_DONE };

typedef struct job {
    serve_req req;
    char id[48];
    long created;
    int refs;                /* the connection and, once queued, the worker: freed at 0 (under srv.mu) */
    enum job_state state;
    bool gone;               /* the client closed the connection (or the server stops): cancel */
    int status;              /* HTTP status when failed (>= 400), with errmsg / errcode */
    char errmsg[FLM_ERROR_MSG_MAX];
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
    bool first_chunk;
} job;

typedef struct slot {
    int index;
    flm_ctx *ctx;
    flm_session *sess;
    flm_chat *tmpl;
    pthread_t thread;
    job *cur;
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
    const char *model_id;
    const char *api_key;
    size_t max_body;
    uint32_t n_ctx;
    uint64_t budget;
    long next_id;
    /* metrics */
    uint64_t requests, errors, prompt_tokens, reused_tokens, gen_tokens, bytes_read, cancelled;
    uint64_t passes, drafted, accepted; /* speculative decoding: target passes while generating, drafts */
    double gen_ms, prompt_ms, io_ms, compute_ms;
    double last_tps;
} srv = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void job_unref_locked(job *j) {
    if (--j->refs > 0) return;
    serve_req_free(&j->req);
    cli_buf_free(&j->out);
    cli_buf_free(&j->text);
    free(j);
}

/* Whether the client closed its end: poll the socket without reading. */
static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0;
    }
    return false;
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

static const char *finish_reason(const flm_gen_result *r) {
    return r->eog || r->stopped ? "stop" : "length";
}

/* An OpenAI-shaped error body. */
static char *error_json(int status, const char *msg, const char *code) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", status == 401 ? "authentication_error" : status >= 500 ? "server_error"
                                       : status == 404 ? "not_found_error" : "invalid_request_error");
    cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* ---- the worker ------------------------------------------------------------------------------------------------- */

typedef struct {
    job *j;
} gen_user;

static bool on_token(void *user, const flm_gen_token *t) {
    job *j = ((gen_user *)user)->j;
    pthread_mutex_lock(&srv.mu);
    bool go = !j->gone && !srv.stopping;
    if (go && j->req.stream && (t->len || t->id >= 0) && !t->eog) {
        cJSON *o = chunk_base(j);
        chunk_choice(j, o, t->text, t->len, NULL);
        j->first_chunk = false;
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
    pthread_mutex_unlock(&srv.mu);
    return go;
}

static void job_fail_locked(job *j, int status, const char *code, const char *msg) {
    j->status = status;
    j->errcode = code;
    snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
}

/* Feed the prompt and generate (no lock held while the model runs). */
static void run_job(slot *s, job *j) {
    serve_req *q = &j->req;
    flm_error err;
    flm_sampler_params sp;
    flm_sampler_params_default(&sp);
    if (q->has_temp) sp.temp = q->temperature;
    if (q->has_top_p) sp.top_p = q->top_p;
    if (q->top_k >= 0) sp.top_k = q->top_k;
    static _Atomic uint64_t seed_counter;
    sp.seed = q->has_seed ? q->seed : (uint64_t)time(NULL) * 1000003u + atomic_fetch_add(&seed_counter, 1);
    flm_session_reset_stats(s->sess);
    flm_status st = flm_session_sampling(s->sess, &sp, &err);
    if (!st) {
        if (q->chat)
            st = flm_session_prompt_chat(s->sess, s->tmpl, q->msgs, q->n_msgs, &j->n_reused, &err);
        else
            st = flm_session_prompt_text(s->sess, q->prompt, strlen(q->prompt), FLM_TOKENIZE_ADD_SPECIAL,
                                         &j->n_reused, &err);
    }
    pthread_mutex_lock(&srv.mu);
    if (st) {
        if (st == FLM_ERR_CONTEXT || st == FLM_ERR_ARG)
            job_fail_locked(j, 400, st == FLM_ERR_CONTEXT ? "context_length_exceeded" : "invalid_prompt", err.msg);
        else
            job_fail_locked(j, 500, "internal_error", err.msg);
        pthread_mutex_unlock(&srv.mu);
        flm_session_rewind(s->sess, 0);
        return;
    }
    j->n_prompt = (size_t)flm_session_n_past(s->sess);
    if (j->gone || srv.stopping) { /* the client left while its prompt was evaluated */
        pthread_mutex_unlock(&srv.mu);
        return;
    }
    j->state = JOB_STREAMING;
    j->first_chunk = true;
    pthread_cond_broadcast(&srv.cv);
    pthread_mutex_unlock(&srv.mu);

    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = q->max_tokens;
    gp.utf8_whole = true;
    for (int i = 0; i < q->n_stop; i++) gp.stop[i] = q->stop[i];
    gp.n_stop = q->n_stop;
    gen_user u = {j};
    st = flm_session_generate(s->sess, &gp, on_token, &u, &j->res, &err);
    flm_session_stats ss;
    flm_session_get_stats(s->sess, &ss);
    flm_spec_stats sps;
    flm_session_spec_stats(s->sess, &sps);

    pthread_mutex_lock(&srv.mu);
    srv.prompt_tokens += j->n_prompt - j->n_reused;
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
    if (st) {
        if (j->req.stream) { /* headers are sent: the error goes in the stream */
            char *e = error_json(500, err.msg, "internal_error");
            if (e) { out_add(j, "data: "); out_add(j, e); out_add(j, "\n\n"); }
            free(e);
        } else {
            job_fail_locked(j, 500, "internal_error", err.msg);
        }
        flm_session_rewind(s->sess, 0);
    } else if (j->req.stream) {
        cJSON *o = chunk_base(j);
        chunk_choice(j, o, "", 0, finish_reason(&j->res));
        out_event(j, o);
        o = chunk_base(j); /* the usage chunk (stream_options.include_usage's), always sent */
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage_json(j));
        out_event(j, o);
    } else {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", j->id);
        cJSON_AddStringToObject(o, "object", q->chat ? "chat.completion" : "text_completion");
        cJSON_AddNumberToObject(o, "created", (double)j->created);
        cJSON_AddStringToObject(o, "model", srv.model_id);
        cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, c);
        cJSON_AddNumberToObject(c, "index", 0);
        const char *text = j->text.p ? j->text.p : "";
        if (q->chat) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", text);
        } else {
            cJSON_AddStringToObject(c, "text", text);
            cJSON_AddNullToObject(c, "logprobs");
        }
        cJSON_AddStringToObject(c, "finish_reason", finish_reason(&j->res));
        cJSON_AddItemToObject(o, "usage", usage_json(j));
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
    if (j->req.stream) out_add(j, "data: [DONE]\n\n");
    bool gone = j->gone;
    pthread_mutex_unlock(&srv.mu);
    fprintf(stderr, "flashlm: slot %d: %s: prompt %zu tokens (%zu cached) in %.1f ms; %ld tokens in %.1f ms (%.2f "
            "tokens/s, %.2f MiB read from flash); %s\n", s->index, j->id, j->n_prompt, j->n_reused, ss.prompt_ms,
            j->res.n_gen, ss.gen_ms, ss.gen_ms > 0 ? j->res.n_gen * 1e3 / ss.gen_ms : 0.0, cli_mib(ss.gen.bytes_read),
            st ? "failed" : gone || j->res.cancelled ? "cancelled: the client left" : finish_reason(&j->res));
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
        run_job(s, j);
        pthread_mutex_lock(&srv.mu);
        if (j->status >= 400) srv.errors++;
        j->state = JOB_DONE;
        j->slot = NULL;
        s->cur = NULL;
        srv.n_running--;
        job_unref_locked(j); /* the worker's reference */
        pthread_cond_broadcast(&srv.cv);
    }
    pthread_mutex_unlock(&srv.mu);
    return NULL;
}

/* ---- HTTP ------------------------------------------------------------------------------------------------------- */

typedef struct conn {
    cli_buf body;
    bool too_big;
    job *j;          /* the job whose response is being sent */
} conn;

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type, const char *body,
                                 size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *code, const char *msg) {
    char *s = error_json((int)status, msg, code);
    pthread_mutex_lock(&srv.mu);
    srv.requests++;
    srv.errors++;
    pthread_mutex_unlock(&srv.mu);
    if (!s) return MHD_NO;
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
    pthread_mutex_lock(&srv.mu);
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
    METRIC("requests_running", "gauge", "Requests being generated.", "%d", srv.n_running);
    METRIC("slots", "gauge", "Slots (--parallel).", "%d", srv.n_slots);
    METRIC("peak_rss_bytes", "gauge", "Peak resident set size of the process.", "%" PRIu64, peak_rss());
    METRIC("memory_budget_bytes", "gauge", "The memory budget (--mem; 0: none).", "%" PRIu64, srv.budget);
    METRIC("context_tokens", "gauge", "Context length of each slot.", "%u", srv.n_ctx);
#undef METRIC
    pthread_mutex_unlock(&srv.mu);
    enum MHD_Result r = b.p ? send_text(c, 200, "text/plain; version=0.0.4", b.p, b.len) : MHD_NO;
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
    conn *cn = *con_cls;
    if (!cn) return;
    cli_buf_free(&cn->body);
    free(cn);
    *con_cls = NULL;
}

/* POST /v1/chat/completions (chat) and /v1/completions. */
static enum MHD_Result handle_generate(struct MHD_Connection *c, conn *cn, bool chat) {
    serve_req req;
    char msg[SERVE_ERR_MAX];
    int status = serve_parse_request(cn->body.p ? cn->body.p : "", cn->body.len, chat, &req, msg, sizeof msg);
    if (status) return send_error(c, (unsigned)status, status == 400 ? "invalid_request" : "internal_error", msg);
    if (req.model && strcmp(req.model, srv.model_id)) {
        char m[SERVE_ERR_MAX + 64];
        snprintf(m, sizeof m, "the model '%.200s' does not exist: this server has '%s' (GET /v1/models)", req.model,
                 srv.model_id);
        serve_req_free(&req);
        return send_error(c, 404, "model_not_found", m);
    }
    job *j = calloc(1, sizeof *j);
    if (!j) {
        serve_req_free(&req);
        return send_error(c, 500, "internal_error", "out of memory");
    }
    j->req = req;
    j->refs = 2; /* the connection's, the queue's (then the worker's) */
    j->created = (long)time(NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    pthread_mutex_lock(&srv.mu);
    snprintf(j->id, sizeof j->id, "%s-%ld", chat ? "chatcmpl" : "cmpl", ++srv.next_id);
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
    /* wait for the prompt to be evaluated (then a stream starts) or, without streaming, for the whole reply */
    for (;;) {
        if (j->state == JOB_DONE || (j->req.stream && j->state == JOB_STREAMING) || j->gone) break;
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
        srv.requests--; /* send_error counts it */
        job_unref_locked(j);
        pthread_mutex_unlock(&srv.mu);
        return send_error(c, (unsigned)st, code, m);
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
    enum MHD_Result r = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return r;
}

static bool authorized(struct MHD_Connection *c) {
    if (!srv.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    h += 7;
    size_t n = strlen(srv.api_key), m = strlen(h);
    unsigned diff = n != m;
    for (size_t i = 0; i < n; i++) diff |= (unsigned)(srv.api_key[i] ^ (i < m ? h[i] : 0)); /* no early exit */
    return diff == 0;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    conn *cn = *con_cls;
    if (!cn) { /* the headers: check the body's announced size before reading it */
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > srv.max_body) cn->too_big = true;
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        if (!cn->too_big && cn->body.len + *upload_size > srv.max_body) {
            cn->too_big = true;
            cli_buf_free(&cn->body);
        }
        if (!cn->too_big && !cli_buf_add(&cn->body, upload_data, *upload_size)) cn->too_big = true;
        *upload_size = 0;
        return MHD_YES;
    }
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) {
        const char *ok = "{\"status\":\"ok\"}";
        pthread_mutex_lock(&srv.mu);
        srv.requests++;
        pthread_mutex_unlock(&srv.mu);
        return send_text(c, 200, "application/json", ok, strlen(ok));
    }
    bool chat = !strcmp(url, "/v1/chat/completions"), compl = !strcmp(url, "/v1/completions");
    bool known = chat || compl || !strcmp(url, "/v1/models") || !strcmp(url, "/metrics") || !strcmp(url, "/") ||
                 !strcmp(url, "/index.html");
    if (!known) {
        char m[300];
        snprintf(m, sizeof m, "no such endpoint: %.16s %.200s", method, url);
        return send_error(c, 404, "not_found", m);
    }
    bool page = !strcmp(url, "/") || !strcmp(url, "/index.html"); /* static, holds nothing: a browser cannot send
                                                                      the key to load it (llama-server's rule too) */
    if (!page && !authorized(c)) return send_error(c, 401, "invalid_api_key", "missing or wrong API key (Authorization: Bearer KEY)");
    if (cn->too_big) {
        char m[128];
        snprintf(m, sizeof m, "the request body is larger than --max-body (%zu bytes)", srv.max_body);
        return send_error(c, 413, "request_too_large", m);
    }
    if ((chat || compl) && !post) return send_error(c, 405, "method_not_allowed", "use POST");
    if (!(chat || compl) && !get) return send_error(c, 405, "method_not_allowed", "use GET");
    if (chat || compl) return handle_generate(c, cn, chat);
    pthread_mutex_lock(&srv.mu);
    srv.requests++;
    pthread_mutex_unlock(&srv.mu);
    if (!strcmp(url, "/metrics")) return send_metrics(c);
    if (!strcmp(url, "/v1/models")) {
        cJSON *o = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddItemToArray(data, m);
        cJSON_AddStringToObject(m, "id", srv.model_id);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", 0);
        cJSON_AddStringToObject(m, "owned_by", "flashlm");
        cJSON *meta = cJSON_AddObjectToObject(m, "meta");
        cJSON_AddNumberToObject(meta, "n_ctx", srv.n_ctx);
        cJSON_AddNumberToObject(meta, "slots", srv.n_slots);
        cJSON_AddNumberToObject(meta, "budget_bytes", (double)srv.budget);
        char *s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        enum MHD_Result r = s ? send_text(c, 200, "application/json", s, strlen(s)) : MHD_NO;
        free(s);
        return r;
    }
    return send_text(c, 200, "text/html; charset=utf-8", (const char *)SERVE_PAGE, SERVE_PAGE_LEN);
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
    const char *model = NULL, *host = "127.0.0.1", *chat_name = NULL, *alias = NULL;
    long port = 8080, parallel = 1, queue = 16;
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
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { verbose = true; continue; }
        if (!strcmp(a, "--context-shift")) { shift = true; continue; }
        bool takes = !strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--host") || !strcmp(a, "--port") ||
                     !strcmp(a, "--api-key") || !strcmp(a, "--parallel") || !strcmp(a, "--queue") ||
                     !strcmp(a, "--max-body") || !strcmp(a, "--chat-template") || !strcmp(a, "--alias");
        if (!takes) return cli_die("unknown option '%s' (see flashlm serve --help)", a);
        if (!val) return cli_die("option %s needs a value (see flashlm serve --help)", a);
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = val;
        else if (!strcmp(a, "--host")) host = val;
        else if (!strcmp(a, "--api-key")) {
            if (!*val) return cli_die("%s", "--api-key must not be empty");
            srv.api_key = val;
        } else if (!strcmp(a, "--alias")) alias = val;
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
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) return cli_die("bad --host '%s' (an IPv4 address)", host);
    char model_buf[4096], id_buf[256];
    model = flm_cli_resolve_model(model, model_buf, sizeof model_buf);
    model_id_of(model, id_buf, sizeof id_buf);
    srv.model_id = alias ? alias : id_buf;
    srv.max_body = (size_t)max_body;
    srv.queue_cap = (int)queue;
    cli_env_params(&params, model);
    cli_log_verbose(&params, verbose);

    /* one budget for all slots: each opens the model with an equal share */
    flm_error err;
    if (params.mem_bytes || params.mem_percent > 0) {
        flm_plan_info plan;
        flm_params one = params;
        if (parallel > 1 && params.mem_percent > 0) one.mode = FLM_MODE_AUTO;
        if (flm_plan(model, &one, &plan, &err) && !(parallel > 1 && err.code == FLM_ERR_BUDGET && plan.budget)) {
            fprintf(stderr, "flashlm: %s\n", err.msg);
            return 1;
        }
        srv.budget = plan.budget ? plan.budget : params.mem_bytes;
        if (parallel > 1) {
            params.mem_bytes = srv.budget / (uint64_t)parallel;
            params.mem_percent = 0;
        }
    }
    srv.n_slots = (int)parallel;
    srv.slots = calloc((size_t)parallel, sizeof *srv.slots);
    if (!srv.slots) { fprintf(stderr, "flashlm: out of memory\n"); return 1; }
    int rc = 0, n_open = 0, n_threads = 0;
    for (int i = 0; i < srv.n_slots; i++, n_open++) {
        slot *s = &srv.slots[i];
        s->index = i;
        /* speculative decoding as run's: the slot's draft model first, inside the slot's budget; the target gets
         * what it leaves (and mode auto running hot drafts with the model itself) */
        flm_params sp = params;
        s->spec = calloc(1, sizeof *s->spec);
        if (!s->spec) { fprintf(stderr, "flashlm: out of memory\n"); rc = 1; break; }
        s->spec->a = sa;
        if (cli_spec_open_draft(s->spec, model, &sp, verbose || i == 0)) { rc = 1; break; }
        if (flm_open(model, &sp, &s->ctx, &err)) {
            fprintf(stderr, "flashlm: %s%s\n", err.msg,
                    parallel > 1 && err.code == FLM_ERR_BUDGET ? " (each of the --parallel slots gets budget / N)" : "");
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
    struct MHD_Daemon *d = NULL;
    if (!rc) {
        d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, (uint16_t)port, NULL,
                             NULL, handler, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                             MHD_OPTION_NOTIFY_COMPLETED, request_done, NULL, MHD_OPTION_CONNECTION_LIMIT,
                             (unsigned)(queue + parallel + 64), MHD_OPTION_CONNECTION_TIMEOUT, 600u, MHD_OPTION_END);
        if (!d) {
            fprintf(stderr, "flashlm: cannot listen on %s:%ld: %s\n", host, port, strerror(errno));
            rc = 1;
        }
    }
    if (!rc) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        long bound = di ? di->port : port;
        const cli_spec_session *ss = srv.slots[0].spec;
        char spec_desc[4200] = "";
        if (ss->on)
            snprintf(spec_desc, sizeof spec_desc, "; speculative decoding: %s%s, up to %d per step",
                     ss->draft ? "draft " : ss->a.self_draft ? (ss->a.tree ? "self-draft tree" : "self-draft")
                                                              : "n-gram lookup",
                     ss->draft ? ss->draft_path : "", ss->a.n_draft);
        fprintf(stderr, "flashlm: serving %s on http://%s:%ld/ (%d slot%s, context %u tokens, budget %s%s%s); "
                "Ctrl-C stops\n", srv.model_id, host, bound, srv.n_slots, srv.n_slots > 1 ? "s" : "", srv.n_ctx,
                srv.budget ? cli_size(srv.budget).s : "none", srv.n_slots > 1 && srv.budget ? " split evenly" : "",
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
    if (d) MHD_stop_daemon(d);
    for (int i = 0; i < n_threads; i++) pthread_join(srv.slots[i].thread, NULL);
    if (!rc)
        fprintf(stderr, "flashlm: served %" PRIu64 " requests (%" PRIu64 " errors, %" PRIu64 " cancelled); %" PRIu64
                " prompt tokens (%" PRIu64 " reused), %" PRIu64 " generated\n", srv.requests, srv.errors,
                srv.cancelled, srv.prompt_tokens, srv.reused_tokens, srv.gen_tokens);
    for (int i = 0; i < srv.n_slots; i++) {
        if (i < n_open) {
            flm_session_free(srv.slots[i].sess);
            flm_chat_close(srv.slots[i].tmpl);
            flm_close(srv.slots[i].ctx);
        }
        if (srv.slots[i].spec) cli_spec_session_close(srv.slots[i].spec); /* the draft model, after the target */
        free(srv.slots[i].spec);
    }
    free(srv.slots);
    return rc;
}
