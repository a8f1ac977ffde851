/* session.c — a token stream through one context (include/flashlm.h, "Sessions"): prompts (appended, or a whole new
 * prompt that keeps the common prefix of what the KV cache holds), sampling with the session's sampler, stop strings
 * (text that could begin one is held back until it cannot), streaming through a callback, cancellation from another
 * thread (an atomic flag), the context shift, per-request statistics, speculative decoding (session/spec.h: the
 * engine decides a step's tokens, this loop takes them one at a time). What `flashlm run`, `chat` and `serve` share;
 * it was the CLI's (tools/cli_util.c) before. Writes nothing to stdout or stderr.
 *
 * Layer: above src/runtime (it calls the public runtime entry points only: flm_evaluate, flm_kv_shift, the
 * tokenizer, the chat templates, the statistics) and core (the clock, errors). */
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "flashlm.h"
#include "core/error.h"
#include "core/util.h"
#include "runtime/runtime.h"
#include "session/grammar.h"
#include "session/spec.h"

struct flm_session {
    flm_ctx *ctx;
    uint32_t seq;          /* the context's sequence (flm_session_create_seq) */
    bool shared;           /* the context holds several sequences: every call into it takes it (flm_seq_acquire),
                              evaluations join the others' (flm_eval_seq) */
    uint32_t n_batch;      /* the context's batch (rows per pass) */
    flm_call_stats calls;  /* the current prompt's or generation's evaluations: the sum of their own statistics
                              (flm_evaluate's, a speculative step's through spec_take_calls) */
    uint32_t n_ctx, n_vocab;
    flm_sampler *smp;
    int32_t *ids;          /* [n_ctx + 1]: the tokens at positions [0, n_past) (the speculative engine's history too:
                              a step writes the tokens it evaluates after n_past) */
    int32_t n_past;
    int32_t n_valid;       /* positions [0, n_valid) hold what evaluating ids[0..n_valid) from 0 gives (no shift
                              moved them): the prefix flm_session_prompt may keep */
    const float *logits;   /* the next-token logits after ids[n_past - 1] (NULL: none yet) */
    uint64_t key_off;      /* the sampler's noise key for position i is i + key_off: the positions context shifts
                              discarded since the text began (a new prompt starts again at 0) */
    flm_token_stats last;  /* statistics of the evaluation that gave logits */
    bool shift;
    int32_t n_keep;
    atomic_int cancel;
    flm_session_stats st;
    char *hold;            /* generated text not released yet (a stop string could begin in it) */
    size_t hold_len, hold_cap;
    spec *spec;            /* speculative decoding (flm_session_speculate), or NULL */
    char *conv;            /* a conversation (flm_session_chat_turn): the text the cache holds, NUL-terminated */
    size_t conv_len, conv_cap;
    bool conv_on;          /* conv describes the tokens held (a plain feed, prompt or rewind turns it off) */
    bool special_content;  /* flm_session_set_special_in_content: control tokens spelled in contents are parsed */
    gvocab *gv;            /* the vocabulary as grammars see it (built at the first constrained generation) */
    float *masked;         /* [n_vocab]: logits under a grammar's mask */
};

/* The session's turn on the context: take it (a context of several sequences: flm_seq_acquire on the session's
 * sequence); leave() gives it back. */
static void enter(flm_session *s) {
    if (s->shared) flm_seq_acquire(s->ctx, s->seq, NULL); /* cannot fail: seq was checked at creation */
}

static void leave(flm_session *s) {
    if (s->shared) flm_seq_release(s->ctx);
}

flm_status flm_session_create(flm_ctx *ctx, flm_session **out, flm_error *err) {
    return flm_session_create_seq(ctx, 0, out, err);
}

flm_status flm_session_create_seq(flm_ctx *ctx, uint32_t seq, flm_session **out, flm_error *err) {
    if (out) *out = NULL;
    if (!ctx || !out) return flm_fail(err, FLM_ERR_ARG, "flm_session_create: ctx and out must not be NULL");
    if (seq >= flm_n_seq(ctx))
        return flm_fail(err, FLM_ERR_ARG, "flm_session_create_seq: sequence %u, but the context holds %u "
                        "(flm_params.n_seq)", seq, flm_n_seq(ctx));
    flm_model_info info;
    flm_get_info(ctx, &info);
    flm_session *s = calloc(1, sizeof *s);
    if (!s) return flm_fail(err, FLM_ERR_NOMEM, "out of memory creating a session");
    s->ctx = ctx;
    s->seq = seq;
    s->shared = flm_n_seq(ctx) > 1;
    s->n_ctx = info.n_ctx;
    s->n_vocab = info.n_vocab;
    s->ids = malloc(((size_t)info.n_ctx + 1) * sizeof *s->ids);
    flm_sampler_params sp;
    flm_sampler_params_default(&sp);
    sp.temp = 0;
    s->smp = flm_sampler_create(&sp, info.n_vocab);
    if (!s->ids || !s->smp) {
        flm_session_free(s);
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory creating a session");
    }
    atomic_init(&s->cancel, 0);
    flm_plan_info plan; /* mode auto's speculative decoding, as the plan decided it (runtime/plan.c) */
    flm_get_plan(ctx, &plan);
    s->n_batch = plan.n_batch ? plan.n_batch : 1;
    if (plan.self_draft) {
        flm_spec_params sp;
        flm_spec_params_default(&sp);
        sp.self_draft = sp.adaptive = true;
        sp.tree = plan.draft_tree;
        sp.n_draft = plan.draft_depth;
        flm_status st = flm_session_speculate(s, &sp, NULL, err);
        if (st) {
            flm_session_free(s);
            return st;
        }
    }
    *out = s;
    return FLM_OK;
}

void flm_session_free(flm_session *s) {
    if (!s) return;
    spec_free(s->spec);
    gvocab_free(s->gv);
    free(s->masked);
    flm_sampler_free(s->smp);
    free(s->ids);
    free(s->hold);
    free(s->conv);
    free(s);
}

flm_ctx *flm_session_ctx(const flm_session *s) { return s ? s->ctx : NULL; }

/* Replace (at = 0) or extend (at = conv_len) the conversation's text; false when out of memory. */
static bool conv_put(flm_session *s, size_t at, const char *p, size_t n) {
    if (at + n + 1 > s->conv_cap) {
        size_t cap = s->conv_cap ? s->conv_cap : 1024;
        while (cap < at + n + 1) cap *= 2;
        char *q = realloc(s->conv, cap);
        if (!q) return false;
        s->conv = q;
        s->conv_cap = cap;
    }
    if (n) memmove(s->conv + at, p, n);
    s->conv_len = at + n;
    s->conv[s->conv_len] = 0;
    return true;
}

/* A generated token enters the context at n_past: its piece joins the conversation's text. */
static void conv_token(flm_session *s, int32_t tok) {
    if (!s->conv_on) return;
    size_t len;
    const char *p = flm_token_piece(s->ctx, s->n_past > 0 ? s->ids[s->n_past - 1] : -1, tok, &len);
    if (!conv_put(s, s->conv_len, p, len)) s->conv_on = false; /* out of memory: the next turn starts over */
}

flm_status flm_session_sampling(flm_session *s, const flm_sampler_params *p, flm_error *err) {
    flm_sampler *smp = flm_sampler_create(p, s->n_vocab);
    if (!smp) return flm_fail(err, FLM_ERR_NOMEM, "out of memory creating a sampler");
    flm_sampler_free(s->smp);
    s->smp = smp;
    if (s->spec) spec_set_sampler(s->spec, smp);
    return FLM_OK;
}

flm_status flm_session_speculate(flm_session *s, const flm_spec_params *p, flm_ctx *draft, flm_error *err) {
    if (!s) return flm_fail(err, FLM_ERR_ARG, "flm_session_speculate: no session");
    spec *sp = NULL;
    if (p) {
        flm_status st = spec_create(s->ctx, draft, s->smp, s->ids, p, &sp, err);
        if (!st) spec_set_seq(sp, s->seq);
        if (!st && s->n_past > 0) st = spec_prompted(sp, s->n_past, err); /* a draft model: the tokens held */
        if (st) {
            spec_free(sp);
            return st;
        }
    }
    spec_free(s->spec);
    s->spec = sp;
    return FLM_OK;
}

void flm_session_spec_stats(const flm_session *s, flm_spec_stats *st) {
    if (s && s->spec) *st = *spec_stats(s->spec);
    else memset(st, 0, sizeof *st);
}

void flm_session_set_shift(flm_session *s, bool on, int32_t n_keep) {
    s->shift = on;
    s->n_keep = n_keep;
}

int32_t flm_session_n_past(const flm_session *s) { return s->n_past; }

/* Forget positions >= n (flm_session_rewind, keeping a conversation's text). */
static void rewind_to(flm_session *s, int32_t n) {
    if (n < 0) n = 0;
    if (n == 0) s->key_off = 0;
    if (n >= s->n_past) return;
    s->n_past = n;
    if (s->n_valid > n) s->n_valid = n;
    s->logits = NULL; /* the next evaluation (at n) gives them again */
}

void flm_session_rewind(flm_session *s, int32_t n) {
    if (n < s->n_past) s->conv_on = false;
    rewind_to(s, n);
    /* a shared context's joined passes need not wait for this sequence until it evaluates again (a request that
     * failed or lost its client after its prompt is rewound, and never reaches generate's flm_seq_leave) */
    if (s->shared) flm_seq_leave(s->ctx, s->seq);
}

void flm_session_cancel(flm_session *s) {
    if (s) atomic_store(&s->cancel, 1);
}

void flm_session_get_stats(const flm_session *s, flm_session_stats *st) { *st = s->st; }
void flm_session_reset_stats(flm_session *s) {
    memset(&s->st, 0, sizeof s->st);
    if (s->spec) memset(spec_stats(s->spec), 0, sizeof(flm_spec_stats));
}

void flm_gen_params_default(flm_gen_params *p) {
    memset(p, 0, sizeof *p);
    p->max_tokens = -1;
}


/* The statistics the next sampled token reports (flm_gen_token.stats): a token's share of the call c whose logits
 * gave it (its times and counts over its tokens). */
static void note_last(flm_session *s, const flm_call_stats *c) {
    const uint64_t m = c->n_tokens ? c->n_tokens : 1;
    s->last = c->total;
    s->last.io_ms /= (double)m;
    s->last.mem_ms /= (double)m;
    s->last.compute_ms /= (double)m;
    s->last.bytes_read /= m;
    s->last.n_reads /= m;
    s->last.n_predicted /= m;
    s->last.n_loaded /= m;
    s->last.n_reused /= m;
    s->last.n_true /= m;
    s->last.n_true_pos /= m;
}

/* Evaluate ids[0..n) at positions pos .. (pos <= n_past), keeping the history and the last token's statistics. */
static flm_status eval_at(flm_session *s, const int32_t *ids, size_t n, int32_t pos, flm_error *err) {
    if (n == 0) return FLM_OK;
    if ((uint64_t)pos + n > s->n_ctx)
        return flm_fail(err, FLM_ERR_CONTEXT, "%zu tokens after position %d do not fit the context of %u tokens", n,
                        (int)pos, s->n_ctx);
    const float *logits = NULL;
    flm_status st = FLM_OK;
    /* shared: joined with the other sequences' evaluations (flm_evaluate with join), a batch's worth at a time so
     * that a long prompt lets the others' tokens through between its pieces; else the whole run in one call */
    const size_t piece = s->shared ? s->n_batch : n;
    for (size_t i = 0; i < n && !st;) {
        const size_t m = n - i < piece ? n - i : piece;
        const flm_eval_args a = {.tokens = ids + i, .n = (uint32_t)m, .pos = pos + (int32_t)i, .seq = s->seq,
                                 .join = s->shared};
        flm_eval_out out;
        st = flm_evaluate(s->ctx, &a, &out, err);
        flm_call_stats_add(&s->calls, &out.stats); /* what ran, also before an error */
        if (st) break;
        logits = out.logits;
        note_last(s, &out.stats); /* the last piece's share per token */
        i += m;
    }
    if (st) { /* the context holds positions < pos; a conversation's text no longer says what it holds */
        s->conv_on = false;
        flm_session_rewind(s, pos);
        return st;
    }
    memmove(s->ids + pos, ids, n * sizeof *ids);
    s->n_past = pos + (int32_t)n;
    if (s->n_valid >= pos) s->n_valid = s->n_past; /* contiguous with the valid prefix: still valid */
    s->logits = logits;
    return FLM_OK;
}

/* Prompt evaluation with its statistics. */
static flm_status feed_counted(flm_session *s, const int32_t *ids, size_t n, int32_t pos, flm_error *err) {
    memset(&s->calls, 0, sizeof s->calls);
    double t0 = flm_now_ms();
    flm_status st = eval_at(s, ids, n, pos, err);
    if (!st && s->spec) { /* a draft model follows */
        enter(s);
        st = spec_prompted(s->spec, s->n_past, err);
        leave(s);
        if (st) flm_session_rewind(s, pos);
    }
    s->st.prompt_ms += flm_now_ms() - t0;
    flm_token_stats_add(&s->st.prompt, &s->calls.total);
    if (!st) s->st.n_prompt += n;
    return st;
}

flm_status flm_session_feed(flm_session *s, const int32_t *ids, size_t n, flm_error *err) {
    atomic_store(&s->cancel, 0);
    s->conv_on = false;
    if (n == 0) return FLM_OK;
    if (!ids) return flm_fail(err, FLM_ERR_ARG, "flm_session_feed: ids NULL");
    return feed_counted(s, ids, n, s->n_past, err);
}

/* Make room for n more tokens: true when n_past + n <= n_ctx, or after a context shift made it so (discard half of
 * positions [n_keep, n_past), or more when n needs it, as llama.cpp's --context-shift). */
static bool room(flm_session *s, size_t n) {
    if ((uint64_t)s->n_past + n <= s->n_ctx) return true;
    if (!s->shift) return false;
    int32_t keep = s->n_keep < s->n_past ? (s->n_keep > 0 ? s->n_keep : 0) : s->n_past, left = s->n_past - keep;
    int64_t discard = left / 2, need = (int64_t)s->n_past + (int64_t)n - s->n_ctx;
    if (discard < need) discard = need;
    if (discard < 1 || discard > left) return false;
    enter(s);
    const flm_status sst = flm_kv_shift(s->ctx, keep, (int32_t)discard, NULL);
    leave(s);
    if (sst) return false; /* cannot happen: the arguments are in range */
    memmove(s->ids + keep, s->ids + keep + discard, (size_t)(s->n_past - keep - discard) * sizeof *s->ids);
    s->n_past -= (int32_t)discard;
    s->key_off += (uint64_t)discard;
    if (s->n_valid > keep) s->n_valid = keep; /* the moved keys were turned, not evaluated there */
    s->st.n_shifts++;
    s->st.n_discarded += (long)discard;
    return true;
}

static flm_status feed_shift(flm_session *s, const int32_t *ids, size_t n, flm_error *err) {
    while (n > 0) {
        if (!room(s, 1)) break;
        size_t m = s->n_ctx - (uint32_t)s->n_past;
        if (m > n) m = n;
        flm_status st = feed_counted(s, ids, m, s->n_past, err);
        if (st) return st;
        ids += m;
        n -= m;
    }
    if (n == 0 && room(s, 1)) return FLM_OK;
    return flm_fail(err, FLM_ERR_CONTEXT, "the context (%u tokens) is full and the %d kept tokens leave nothing to "
                    "discard", s->n_ctx, (int)s->n_keep);
}

flm_status flm_session_feed_shift(flm_session *s, const int32_t *ids, size_t n, flm_error *err) {
    atomic_store(&s->cancel, 0);
    s->conv_on = false;
    return feed_shift(s, ids, n, err);
}

/* flm_session_prompt's work, the rest evaluated chunk tokens at a time (0: at once) with fn told before the first and
 * after each (fn may be NULL). */
static flm_status prompt_ids_chunked(flm_session *s, const int32_t *ids, size_t n, size_t chunk, flm_prompt_fn fn,
                                     void *user, size_t *n_reused, flm_error *err) {
    if (n_reused) *n_reused = 0;
    if (!ids || n == 0) return flm_fail(err, FLM_ERR_ARG, "the prompt is empty");
    if (n >= s->n_ctx)
        return flm_fail(err, FLM_ERR_CONTEXT, "the prompt (%zu tokens) does not fit the context (%u tokens) with "
                        "room for a reply", n, s->n_ctx);
    size_t common = 0;
    while (common < (size_t)s->n_valid && common < n && s->ids[common] == ids[common]) common++;
    if (common == n) common = n - 1; /* the last token again, for its logits */
    rewind_to(s, (int32_t)common);
    s->key_off = 0; /* the held prefix (common <= n_valid) was evaluated where it is: positions are the text's again */
    if (fn) fn(user, common, n, common);
    for (size_t k = common; k < n;) {
        if (chunk && atomic_load(&s->cancel)) { /* the caller gave up: the rest is not evaluated */
            s->st.n_reused += common;
            if (n_reused) *n_reused = common;
            return flm_fail(err, FLM_ERR_CANCELLED, "the prompt's evaluation was cancelled after %zu of its %zu tokens",
                            k, n);
        }
        size_t next = chunk && n - k > chunk ? k + chunk : n;
        flm_status st = feed_counted(s, ids + k, next - k, (int32_t)k, err);
        if (st) return st;
        k = next;
        if (fn) fn(user, k, n, common);
    }
    s->st.n_reused += common;
    if (n_reused) *n_reused = common;
    return FLM_OK;
}

static flm_status prompt_ids(flm_session *s, const int32_t *ids, size_t n, size_t *n_reused, flm_error *err) {
    return prompt_ids_chunked(s, ids, n, 0, NULL, NULL, n_reused, err);
}

flm_status flm_session_prompt_progress(flm_session *s, const int32_t *ids, size_t n, size_t chunk, flm_prompt_fn fn,
                                       void *user, size_t *n_reused, flm_error *err) {
    atomic_store(&s->cancel, 0);
    s->conv_on = false;
    return prompt_ids_chunked(s, ids, n, chunk, fn, user, n_reused, err);
}

flm_status flm_session_prompt(flm_session *s, const int32_t *ids, size_t n, size_t *n_reused, flm_error *err) {
    atomic_store(&s->cancel, 0);
    s->conv_on = false;
    return prompt_ids(s, ids, n, n_reused, err);
}

/* text[0..len) tokenized with flags into *out (malloc'd, *n ids), no control token matched in the n_plain ranges
 * plain (flm_tokenize_spans). Errors: FLM_ERR_NOMEM. */
static flm_status tokenize_spans(flm_session *s, const char *text, size_t len, unsigned flags, const size_t *plain,
                                 size_t n_plain, int32_t **out, size_t *n, flm_error *err) {
    *out = NULL;
    *n = 0;
    size_t cap = len + 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    size_t need = ids ? flm_tokenize_spans(s->ctx, text, len, flags, plain, n_plain, ids, cap) : SIZE_MAX;
    if (need != SIZE_MAX && need > cap) { /* byte fallback can give several tokens per byte */
        int32_t *more = realloc(ids, need * sizeof *ids);
        if (more) {
            ids = more;
            need = flm_tokenize_spans(s->ctx, text, len, flags, plain, n_plain, ids, need);
        } else {
            need = SIZE_MAX;
        }
    }
    if (need == SIZE_MAX) {
        free(ids);
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory tokenizing %zu bytes", len);
    }
    *out = ids;
    *n = need;
    return FLM_OK;
}

static flm_status tokenize_alloc(flm_session *s, const char *text, size_t len, unsigned flags, int32_t **out,
                                 size_t *n, flm_error *err) {
    return tokenize_spans(s, text, len, flags, NULL, 0, out, n, err);
}

void flm_session_set_special_in_content(flm_session *s, bool allow) { s->special_content = allow; }

/* Render msgs through t (with the assistant's opening) into *text, and the contents' byte ranges into *spans unless
 * the session parses control tokens in contents (then NULL). */
static flm_status render_chat(flm_session *s, const flm_chat *t, const flm_chat_msg *msgs, size_t n, char **text,
                              size_t *len, size_t **spans, size_t *n_spans, flm_error *err) {
    *spans = NULL;
    *n_spans = 0;
    if (s->special_content) return flm_chat_apply(t, msgs, n, true, text, len, err);
    return flm_chat_apply_spans(t, msgs, n, true, text, len, spans, n_spans, err);
}

flm_status flm_session_prompt_text(flm_session *s, const char *text, size_t len, unsigned flags, size_t *n_reused,
                                   flm_error *err) {
    if (n_reused) *n_reused = 0;
    if (!text) return flm_fail(err, FLM_ERR_ARG, "the prompt is NULL");
    int32_t *ids;
    size_t n;
    flm_status st = tokenize_alloc(s, text, len, flags, &ids, &n, err);
    if (!st) st = flm_session_prompt(s, ids, n, n_reused, err);
    free(ids);
    return st;
}

flm_status flm_session_chat_tokens(flm_session *s, const flm_chat *t, const flm_chat_msg *msgs, size_t n,
                                   int32_t **ids, size_t *n_ids, flm_error *err) {
    *ids = NULL;
    *n_ids = 0;
    char *text = NULL;
    size_t len = 0, *spans, n_spans;
    flm_status st = render_chat(s, t, msgs, n, &text, &len, &spans, &n_spans, err);
    if (st) return st;
    unsigned flags = FLM_TOKENIZE_PARSE_SPECIAL | (flm_add_bos(s->ctx) ? FLM_TOKENIZE_BOS : 0u);
    st = tokenize_spans(s, text, len, flags, spans, n_spans, ids, n_ids, err);
    free(spans);
    free(text);
    return st;
}

flm_status flm_session_prompt_chat(flm_session *s, const flm_chat *t, const flm_chat_msg *msgs, size_t n,
                                   size_t *n_reused, flm_error *err) {
    if (n_reused) *n_reused = 0;
    int32_t *ids;
    size_t n_ids;
    flm_status st = flm_session_chat_tokens(s, t, msgs, n, &ids, &n_ids, err);
    if (!st) st = flm_session_prompt(s, ids, n_ids, n_reused, err);
    free(ids);
    return st;
}

flm_status flm_session_chat_turn(flm_session *s, const flm_chat *t, const flm_chat_msg *msgs, size_t n,
                                 flm_chat_turn_info *info, flm_error *err) {
    flm_chat_turn_info tmp;
    if (!info) info = &tmp;
    memset(info, 0, sizeof *info);
    atomic_store(&s->cancel, 0);
    char *text = NULL;
    size_t len = 0, *spans, n_spans;
    flm_status st = render_chat(s, t, msgs, n, &text, &len, &spans, &n_spans, err);
    if (st) return st;
    /* the text the cache holds begins the rendering: only the rest; else the whole rendering from the start */
    const bool held = s->conv_on && s->n_past > 0;
    const bool append = held && s->conv_len <= len && !memcmp(text, s->conv, s->conv_len);
    info->from_start = !append;
    info->rewrote = held && !append;
    const size_t from = append ? s->conv_len : 0;
    const unsigned flags = FLM_TOKENIZE_PARSE_SPECIAL | (!append && flm_add_bos(s->ctx) ? FLM_TOKENIZE_BOS : 0u);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    size_t k = 0; /* the contents' ranges within text[from..): shifted, the first clipped */
    for (size_t i = 0; i < n_spans; i++) {
        if (spans[2 * i + 1] <= from) continue;
        spans[2 * k] = (spans[2 * i] > from ? spans[2 * i] : from) - from;
        spans[2 * k + 1] = spans[2 * i + 1] - from;
        k++;
    }
    st = tokenize_spans(s, text + from, len - from, flags, spans, k, &ids, &n_ids, err);
    free(spans);
    if (st) {
        free(text);
        return st;
    }
    info->pos0 = append ? s->n_past : 0;
    info->n_new = n_ids;
    if (!append && n_ids == 0) {
        st = flm_fail(err, FLM_ERR_ARG, "the conversation renders to no tokens");
    } else if (s->shift) { /* through the context whatever its length */
        if (!append) rewind_to(s, 0);
        st = feed_shift(s, ids, n_ids, err);
        if (st) s->conv_on = false;
    } else if (append) {
        if ((uint64_t)s->n_past + n_ids >= s->n_ctx)
            st = flm_fail(err, FLM_ERR_CONTEXT, "the context (%u tokens) is full: this turn needs %zu more tokens after "
                          "%d", s->n_ctx, n_ids, (int)s->n_past);
        else if (n_ids > 0)
            st = feed_counted(s, ids, n_ids, s->n_past, err);
    } else {
        size_t reused = 0;
        st = prompt_ids(s, ids, n_ids, &reused, err); /* FLM_ERR_CONTEXT: nothing evaluated */
        if (!st) {
            info->pos0 = (int32_t)reused;
            info->n_new = n_ids - reused;
        }
    }
    free(ids);
    if (!st) {
        if (conv_put(s, 0, text, len)) s->conv_on = true;
        else s->conv_on = false, st = flm_fail(err, FLM_ERR_NOMEM, "out of memory holding the conversation");
    }
    free(text);
    return st;
}

void flm_session_chat_reset(flm_session *s) {
    s->conv_on = false;
    s->conv_len = 0;
    rewind_to(s, 0);
}

const char *flm_session_chat_text(const flm_session *s, size_t *len) {
    if (len) *len = s->conv_on ? s->conv_len : 0;
    return s->conv_on && s->conv ? s->conv : "";
}

flm_status flm_session_chat_set_text(flm_session *s, const char *text, size_t len, flm_error *err) {
    if (!conv_put(s, 0, text, len)) return flm_fail(err, FLM_ERR_NOMEM, "out of memory holding the conversation");
    return FLM_OK;
}

/* ---- generation ------------------------------------------------------------------------------------------------ */

static bool hold_add(flm_session *s, const char *p, size_t n) {
    if (s->hold_len + n + 1 > s->hold_cap) {
        size_t cap = s->hold_cap ? s->hold_cap : 256;
        while (cap < s->hold_len + n + 1) cap *= 2;
        char *q = realloc(s->hold, cap);
        if (!q) return false;
        s->hold = q;
        s->hold_cap = cap;
    }
    if (n) memcpy(s->hold + s->hold_len, p, n);
    s->hold_len += n;
    return true;
}

/* Bytes at the end of p[0..n) that form an incomplete UTF-8 sequence (0..3). */
static size_t utf8_incomplete(const char *p, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)p[n - back];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return want > back ? back : 0;
    }
    return 0;
}

/* utf8_whole: the held bytes [0, n) made valid UTF-8, each byte that does not begin a whole sequence replaced by
 * U+FFFD (as a decoder with errors="replace" shows them); the held bytes after n follow. Returns the new n (2 bytes
 * longer a replacement), or 0 when memory runs out (nothing is released then; the caller fails). */
static size_t utf8_replace(flm_session *s, size_t n, bool *nomem) {
    size_t bad = 0;
    for (size_t i = 0; i < n;) {
        size_t k = flm_utf8_len((const unsigned char *)s->hold + i, n - i);
        if (!k) { bad++; k = 1; }
        i += k;
    }
    if (!bad) return n;
    const size_t len = s->hold_len + 2 * bad;
    char *h = malloc(len + 1);
    if (!h) { *nomem = true; return 0; }
    size_t out = 0;
    for (size_t i = 0; i < n;) {
        size_t k = flm_utf8_len((const unsigned char *)s->hold + i, n - i);
        if (!k) {
            memcpy(h + out, "\xEF\xBF\xBD", 3);
            out += 3;
            i++;
        } else {
            memcpy(h + out, s->hold + i, k);
            out += k;
            i += k;
        }
    }
    memcpy(h + out, s->hold + n, s->hold_len - n);
    free(s->hold);
    s->hold = h;
    s->hold_len = len;
    s->hold_cap = len + 1;
    return out;
}

/* How much of the held text may be released: up to the first stop string (*stop_at its index, else -1), else all
 * but the longest end that begins a stop string (and an incomplete UTF-8 sequence when asked). */
static size_t releasable(const flm_session *s, const flm_gen_params *gp, int *stop_at) {
    *stop_at = -1;
    size_t best = SIZE_MAX;
    for (int i = 0; i < gp->n_stop; i++) {
        const char *hit = memmem(s->hold, s->hold_len, gp->stop[i], strlen(gp->stop[i]));
        if (hit && (size_t)(hit - s->hold) < best) {
            best = (size_t)(hit - s->hold);
            *stop_at = i;
        }
    }
    if (*stop_at >= 0) return best;
    size_t keep = 0;
    for (int i = 0; i < gp->n_stop; i++) {
        size_t ls = strlen(gp->stop[i]);
        for (size_t k = ls - 1 < s->hold_len ? ls - 1 : s->hold_len; k > keep; k--)
            if (!memcmp(s->hold + s->hold_len - k, gp->stop[i], k)) {
                keep = k;
                break;
            }
    }
    size_t out = s->hold_len - keep;
    if (gp->utf8_whole) out -= utf8_incomplete(s->hold, out);
    return out;
}

/* Give fn the first n held bytes and drop them; false when fn says stop. */
static bool release(flm_session *s, flm_gen_fn fn, void *user, flm_gen_token *t, size_t n) {
    t->text = s->hold;
    t->len = n;
    bool go = fn ? fn(user, t) : true;
    memmove(s->hold, s->hold + n, s->hold_len - n);
    s->hold_len -= n;
    return go;
}

/* Under grammar g in state gst: *tok when it may come next, else a draw of the session's sampler from the logits with
 * every token the grammar refuses set to -inf (llama.cpp's order: sample, check, resample under the mask). */
static flm_status gram_pick(flm_session *s, flm_grammar *g, int32_t gst, const float *logits, int32_t *tok,
                            flm_error *err) {
    int ok = gram_token_ok(g, s->gv, gst, *tok, err);
    if (ok < 0) return err->code;
    if (ok) return FLM_OK;
    const uint32_t *m = gram_mask(g, s->gv, gst, err);
    if (!m) return err->code;
    int32_t first = -1;
    for (uint32_t i = 0; i < s->n_vocab; i++) {
        bool a = m[i >> 5] >> (i & 31) & 1;
        s->masked[i] = a ? logits[i] : -INFINITY;
        if (a && first < 0) first = (int32_t)i;
    }
    if (first < 0)
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "no token of the vocabulary can continue the grammar here");
    /* a second, independent uniform of the position's key (the first one, given that its token was refused, is not
     * uniform any more): "sample, check, resample" is exactly a draw from the masked distribution, and a seed still
     * reproduces it */
    int32_t t = flm_sampler_resample_at(s->smp, s->masked, (uint64_t)s->n_past + s->key_off, s->ids, (size_t)s->n_past);
    if (t < 0 || (uint32_t)t >= s->n_vocab || !(m[t >> 5] >> (t & 31) & 1)) t = first; /* NaN logits */
    *tok = t;
    return FLM_OK;
}

flm_status flm_session_generate(flm_session *s, const flm_gen_params *gp, flm_gen_fn fn, void *user,
                                flm_gen_result *r, flm_error *err) {
    flm_error err_local;
    if (!err) err = &err_local;
    flm_gen_result rr;
    if (!r) r = &rr;
    memset(r, 0, sizeof *r);
    r->stop_index = -1;
    flm_gen_params dflt;
    if (!gp) {
        flm_gen_params_default(&dflt);
        gp = &dflt;
    }
    if (gp->n_stop < 0 || gp->n_stop > FLM_GEN_STOP_MAX) {
        atomic_store(&s->cancel, 0);
        return flm_fail(err, FLM_ERR_ARG, "%d stop strings (at most %d)", gp->n_stop, FLM_GEN_STOP_MAX);
    }
    for (int i = 0; i < gp->n_stop; i++) {
        size_t ls = gp->stop[i] ? strlen(gp->stop[i]) : 0;
        if (ls == 0 || ls > FLM_GEN_STOP_LEN) {
            atomic_store(&s->cancel, 0);
            return flm_fail(err, FLM_ERR_ARG, "stop string %d is %s", i, ls ? "too long" : "empty");
        }
    }
    if (gp->logprobs && (gp->top_logprobs < 0 || gp->top_logprobs > FLM_GEN_TOP_LOGPROBS_MAX)) {
        atomic_store(&s->cancel, 0);
        return flm_fail(err, FLM_ERR_ARG, "top_logprobs %d is outside 0..%d", gp->top_logprobs,
                        FLM_GEN_TOP_LOGPROBS_MAX);
    }
    if (!s->logits) {
        atomic_store(&s->cancel, 0);
        return flm_fail(err, FLM_ERR_ARG, "nothing to generate after: feed a prompt first");
    }
    flm_grammar *gram = gp->grammar;
    int32_t gst = GRAM_DEAD;
    if (gram) {
        flm_status gs = FLM_OK;
        if (!s->gv) gs = gvocab_build(s->ctx, &s->gv, err);
        if (!gs && !s->masked && !(s->masked = malloc((size_t)s->n_vocab * sizeof *s->masked)))
            gs = flm_fail(err, FLM_ERR_NOMEM, "out of memory for a grammar's mask");
        if (!gs) gs = gram_start(gram, &gst, err);
        if (gs) {
            atomic_store(&s->cancel, 0);
            return gs;
        }
    }
    long max = gp->max_tokens < 0 ? LONG_MAX : gp->max_tokens;
    /* the first token generated takes the first uniform of the seed's stream, as llama.cpp's sampler made for a
     * request (drafts and verification key the positions after it the same way) */
    flm_sampler_set_origin(s->smp, (uint64_t)s->n_past + s->key_off);
    memset(&s->calls, 0, sizeof s->calls);
    double t0 = flm_now_ms(), t_prev = t0;
    const uint64_t busy0 = flm_ctx_io_busy_ns(s->ctx); /* the reader's busy time over the call (thread-safe) */
    s->hold_len = 0;
    flm_status st = FLM_OK;
    flm_gen_token t;
    memset(&t, 0, sizeof t);
    bool go = true;
    /* speculative decoding: a step's decided tokens queue[qi..qn), each sampled from qrows' row of its index; all but
     * the last are accepted drafts the context holds already (at n_past on) */
    int32_t queue[FLM_SPEC_DRAFT_MAX + 1];
    uint32_t qi = 0, qn = 0;
    const float *qrows = NULL;
    flm_spec_stats *ss = s->spec ? spec_stats(s->spec) : NULL;
    while (r->n_gen < max && s->logits) {
        if (atomic_load(&s->cancel)) { r->cancelled = true; break; }
        if (gram) { /* the grammar's sentence is complete and nothing may follow: the end */
            int c = gram_complete(gram, gst, err);
            if (c < 0) { st = err->code; break; }
            if (c) { r->complete = true; break; }
        }
        /* a token not held by the context needs a position in it: a context of n_ctx holds the prompt and the
         * reply together (OpenAI's and llama.cpp's count: prompt + completion <= n_ctx), so at a full one the
         * reply ends before a token is sampled that could never be evaluated (or a context shift makes room) */
        if (!(qi + 1 < qn) && !room(s, 1)) { r->ctx_full = true; break; }
        int32_t next;
        bool held = false; /* next is an accepted draft: evaluated by the step */
        if (qi < qn) {
            next = queue[qi++];
            held = qi < qn;
            if (gram) { /* a decided token the grammar refuses: a draw under the mask from its row instead, and
                           the drafts after it are dropped (the verification itself is unchanged) */
                int32_t t = next;
                if ((st = gram_pick(s, gram, gst, s->logits, &t, err))) break;
                if (t != next) {
                    next = t;
                    held = false;
                    qn = qi;
                }
            }
        } else {
            next = flm_sampler_sample_at(s->smp, s->logits, (uint64_t)s->n_past + s->key_off, s->ids,
                                         (size_t)s->n_past);
            if (gram && (st = gram_pick(s, gram, gst, s->logits, &next, err))) break;
        }
        t.prev = s->n_past > 0 ? s->ids[s->n_past - 1] : -1;
        if (gp->logprobs && gp->post_sampling) { /* the distribution next was drawn from: the sampler's, masked */
            const float *pl = s->logits;
            if (gram) {
                const uint32_t *m = gram_mask(gram, s->gv, gst, err);
                if (!m) { st = err->code; break; }
                for (uint32_t i = 0; i < s->n_vocab; i++)
                    s->masked[i] = m[i >> 5] >> (i & 31) & 1 ? s->logits[i] : -INFINITY;
                pl = s->masked;
            }
            float pt = flm_sampler_top_probs(s->smp, pl, s->ids, (size_t)s->n_past, next, gp->top_logprobs, t.top_id,
                                             t.top_logprob, &t.n_top);
            t.logprob = logf(pt);
            for (int k = 0; k < t.n_top; k++) t.top_logprob[k] = logf(t.top_logprob[k]);
        } else if (gp->logprobs) { /* s->logits gave next (a queued token's row too) */
            t.n_top = gp->top_logprobs < (int)s->n_vocab ? gp->top_logprobs : (int)s->n_vocab;
            t.logprob = flm_logprobs(s->logits, s->n_vocab, next, t.n_top, t.top_id, t.top_logprob);
        }
        r->n_gen++;
        if (ss) ss->n_gen++;
        double now = flm_now_ms();
        t.id = next;
        t.ms = now - t_prev;
        t.stats = s->last;
        t_prev = now;
        if (flm_token_is_eog(s->ctx, next)) {
            r->eog = true;
            t.eog = true;
            t.text = "";
            t.len = 0;
            if (fn) fn(user, &t); /* the last call: what it returns changes nothing */
            t.eog = false;
            break;
        }
        size_t len;
        const char *p = flm_token_piece(s->ctx, s->n_past > 0 ? s->ids[s->n_past - 1] : -1, next, &len);
        if (gram) {
            int32_t ns = gram_advance(gram, gst, p, len, err);
            if (ns == -2) { st = err->code; break; }
            if (ns < 0) { /* a token's bytes after this predecessor differ from its mask's (SentencePiece's space) */
                st = flm_fail(err, FLM_ERR_UNSUPPORTED, "token %d's text after token %d does not continue the "
                              "grammar", (int)next, (int)(s->n_past > 0 ? s->ids[s->n_past - 1] : -1));
                break;
            }
            gst = ns;
        }
        if (!hold_add(s, p, len)) { st = flm_fail(err, FLM_ERR_NOMEM, "out of memory"); break; }
        int stop_at;
        size_t out = releasable(s, gp, &stop_at);
        bool nomem = false;
        if (gp->utf8_whole) out = utf8_replace(s, out, &nomem);
        if (nomem) { st = flm_fail(err, FLM_ERR_NOMEM, "out of memory"); break; }
        go = release(s, fn, user, &t, out);
        /* every way out before the evaluation below leaves next out of the context (an accepted draft it holds is
         * forgotten by the next evaluation, which starts at n_past) */
        if (stop_at >= 0) {
            r->stopped = true;
            r->stop_index = stop_at;
            s->hold_len = 0; /* the stop string and what follows it are dropped */
            break;
        }
        if (!go) { r->cancelled = true; break; }
        if (r->n_gen >= max && !gp->feed_last) { r->limit = true; break; }
        if (held) { /* in the context already: take it, its row gives the next token */
            conv_token(s, next);
            s->ids[s->n_past] = next;
            if (s->n_valid == s->n_past) s->n_valid++;
            s->n_past++;
            s->logits = qrows + (size_t)qi * s->n_vocab;
            continue;
        }
        if (!room(s, 1)) { r->ctx_full = true; break; } /* full: a context shift, or stop */
        /* next and the drafts after it in one pass. In a shared context while another sequence is busy, the step
         * joins the others' passes (a chain: the self-draft's passes join their drafts, the verification their
         * pass; the others' tokens joined with this one in one pass give more than a turn alone); else it takes
         * the context alone. The step's tokens are those plain decoding takes, so the reply is the same either
         * way. */
        if (s->spec && r->n_gen < max) {
            uint32_t m = 0;
            const int32_t H = s->n_past;
            const bool joined = s->shared && flm_seq_busy(s->ctx, s->seq) > 0;
            spec_set_key_off(s->spec, s->key_off);
            if (!joined) enter(s); /* the step's passes, trees and logits in one turn */
            st = spec_step(s->spec, H, next, max - r->n_gen, joined, queue, &m, &qrows, err);
            if (!joined) leave(s);
            flm_call_stats step_calls, verify;
            spec_take_calls(s->spec, &step_calls, &verify);
            flm_call_stats_add(&s->calls, &step_calls);
            if (!st) note_last(s, &verify);
            if (st) { /* the context holds positions < H at most; its logits are gone */
                s->logits = NULL;
                s->conv_on = false;
                break;
            }
            conv_token(s, next);
            s->ids[H] = next;
            if (s->n_valid == H) s->n_valid++;
            s->n_past = H + 1;
            s->logits = qrows;
            qi = 0;
            qn = m;
            continue;
        }
        conv_token(s, next); /* before: n_past names its predecessor (a failure forgets the conversation) */
        st = eval_at(s, &next, 1, s->n_past, err);
        if (ss) ss->n_passes++;
        if (st) break;
    }
    if (!st && !r->eog && !r->stopped && !r->cancelled && !r->ctx_full && !r->complete && r->n_gen >= max)
        r->limit = true;
    if (s->hold_len && !r->stopped && !st) { /* the end: what was held back cannot begin a stop string any more */
        t.id = -1;
        t.prev = -1;
        t.logprob = 0;
        t.n_top = 0;
        t.stats = (flm_token_stats){0};
        t.ms = 0;
        bool nomem = false;
        size_t out = gp->utf8_whole ? utf8_replace(s, s->hold_len, &nomem) : s->hold_len;
        if (nomem) st = flm_fail(err, FLM_ERR_NOMEM, "out of memory");
        else release(s, fn, user, &t, out);
    }
    s->hold_len = 0;
    if (s->shared) flm_seq_leave(s->ctx, s->seq); /* the joined passes need not wait for this sequence now */
    const flm_call_stats *c = &s->calls; /* the generation's evaluations */
    flm_token_stats_add(&s->st.gen, &c->total);
    s->st.n_gen_evaluated += c->n_tokens;
    if (ss) { /* the target's share of the speculative counts */
        ss->target_tokens += c->n_tokens;
        ss->target_ms += c->total.io_ms + c->total.mem_ms + c->total.compute_ms;
        ss->bytes_read += c->total.bytes_read;
        ss->n_loaded += c->total.n_loaded;
    }
    r->io_busy_ms = (double)(flm_ctx_io_busy_ns(s->ctx) - busy0) / 1e6; /* read before the end: <= ms */
    r->ms = flm_now_ms() - t0;
    s->st.gen_ms += r->ms;
    s->st.n_gen += (uint64_t)r->n_gen;
    atomic_store(&s->cancel, 0);
    return st;
}
