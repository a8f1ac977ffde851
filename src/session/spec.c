/* spec.c — the speculative decoding engine of a session (session/spec.h; public: flm_session_speculate): drafting,
 * one batched verification per step, the acceptance rule, and keeping the target's and the draft's contexts in step
 * with the accepted text. The token loop around the steps (stops, limits, cancellation, the context shift) is the
 * session's (session.c, flm_session_generate). It was the CLI's (tools/spec.c) before.
 *
 * A step, with the target holding hist[0..H) and `last` (decided, not yet evaluated) next:
 *   1. the draft proposes d1..dN (a draft model from its own logits after hist + last, or the n-gram lookup);
 *   2. the target evaluates [last, d1, ..., dN] at positions H .. H + N in one flm_eval_batch with every row's logits:
 *      row i is the target's next-token distribution after d_i (row 0: after last);
 *   3. row i's token is the one plain decoding would take there: flm_sampler_sample_at with the noise key of its
 *      position (greedy: the argmax); d_i is accepted while it equals row i - 1's token, the first that differs is
 *      replaced by it, and when all are accepted row N gives one more. So the text is plain decoding's token for
 *      token, greedy or sampling with a seed (the drafts drew from the same noise: they agree with the target as
 *      often as their distributions allow);
 *   4. the target now holds hist + last + the accepted drafts; the rows after them are forgotten by the next step,
 *      which evaluates from there (flm_eval_batch with an earlier pos rewinds). The draft model keeps a record of the
 *      tokens it holds and re-evaluates from the first one that differs from the text (usually just the last
 *      accepted draft and the new token). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/util.h"
#include "session/spec.h"

/* A tree verification's walk takes the logits of the nodes it will likely visit in one classifier pass: the root and
 * the nodes whose path's draft probability (tscore) is at least this. A row in the batch costs a fraction
 * of a row alone (the classifier's weights are read once), so rows likely to be visited pay. */
#define SPEC_PATH_P 0.2f


struct spec {
    flm_ctx *target, *draft;
    flm_sampler *smp;
    flm_spec_params o;
    uint32_t n_vocab;
    int32_t n_ctx;       /* the target's context */
    int32_t draft_n_ctx; /* the draft's context (0: no draft model) */
    int32_t *hist;       /* [n_ctx + 1] (the session's): the tokens the target holds, then the step's `last` */
    int32_t n_hist;
    int32_t *dtok;       /* [draft_n_ctx]: the tokens the draft model holds */
    int32_t n_dtok;
    int32_t *batch;      /* [n_draft + 1]: last, d1 .. dN */
    float *rows;         /* [(n_draft + 1) * n_vocab]: the target's logits for the batch */
    uint64_t key_off;    /* the noise key of position i is i + key_off (spec_set_key_off) */
    flm_spec_stats st;
    /* adaptive draft length (o.adaptive): running estimates, ms */
    double acc_a, acc_n;          /* accepted and drafted tokens, decayed */
    double jacc_a, jacc_n;        /* the same for joined steps */
    double jc_draft, jc_verify;   /* a joined step's ms per drafted token (the self-draft: its passes' own wall time,
                                     flm_call_stats.pass_ms) and per verification (the call's wall time, the wait for
                                     the others' rows included), decayed; 0: not measured yet */
    double jv_rows, jv_c, jv_w;   /* the joined verifications' own rows and their rows' shares of the pass's compute
                                     ms and of its wait for flash reads (flm_call_stats), decayed */
    uint64_t n_jchoices;
    double c_draft;               /* ms per drafted token (0: not measured yet) */
    double c_verify[FLM_SPEC_DRAFT_MAX + 2]; /* ms of a verification pass of k rows (0: not measured yet) */
    uint64_t n_choices;
    /* tree drafts (o.tree): nodes, parents, path probabilities (FLM_SPEC_TREE_DRAFT(o.tree) of each: the nodes
     * drafted; the verification keeps o.tree of them) */
    int32_t *ttok, *tpar;
    float *tscore;
    /* tree pruning (tree_prune): the verification's ms against its rows (decayed sums of a linear fit), and how
     * many tokens the draft's path probabilities promise against how many are accepted (decayed) */
    double v_w, v_x, v_y, v_xx, v_xy;
    double k_num, k_den;
    double jk_num, jk_den; /* the same for joined tree steps (their trees are smaller: n_batch / n_seq nodes) */
    double c_level;   /* ms of one draft level (flm_eval_tree with draft), decayed */
    double ms_token;  /* ms per generated token of the tree steps, decayed */
    double jc_level, jms_token; /* the same for joined tree steps (a level: its pass's own ms) */
    /* the target's evaluations (t_eval): their own statistics, summed until spec_take_calls, and the last one's */
    uint32_t seq;     /* the target's sequence (spec_set_seq) */
    uint32_t n_batch; /* the target's batch (its plan's): a tree that fits one verifies lazily */
    bool out_flash;   /* the target's classifier is (partly) on flash (flm_plan_info.out_flash_bytes): its logits are
                         computed in the verification pass, for every node at once (one read of its rows a pass) */
    flm_call_stats calls, last_call;
};

void flm_spec_params_default(flm_spec_params *p) {
    memset(p, 0, sizeof *p);
    p->n_draft = 4;
}

void spec_free(spec *s) {
    if (!s) return;
    free(s->dtok);
    free(s->batch);
    free(s->rows);
    free(s->ttok);
    free(s->tpar);
    free(s->tscore);
    free(s);
}

flm_status spec_create(flm_ctx *target, flm_ctx *draft, flm_sampler *smp, int32_t *hist, const flm_spec_params *o,
                       spec **out, flm_error *err) {
    *out = NULL;
    if (!target || !smp || !o || !hist) return flm_fail(err, FLM_ERR_ARG, "speculative decoding: no target or sampler");
    if (o->n_draft < 1 || o->n_draft > FLM_SPEC_DRAFT_MAX)
        return flm_fail(err, FLM_ERR_ARG, "speculative decoding: %d draft tokens per step is outside 1..%d", o->n_draft,
                        FLM_SPEC_DRAFT_MAX);
    if (!draft && !o->ngram && !o->self_draft)
        return flm_fail(err, FLM_ERR_ARG, "speculative decoding needs a draft model, the n-gram lookup or a "
                         "self-draft");
    if ((draft != NULL) + o->ngram + o->self_draft > 1)
        return flm_fail(err, FLM_ERR_ARG, "speculative decoding: one draft source at a time (a draft model, the "
                        "n-gram lookup or the self-draft)");
    if (o->self_draft && (draft || !flm_has_self_draft(target)))
        return flm_fail(err, FLM_ERR_ARG, "a self-draft needs the target in mode hot with neurons streamed, and no "
                         "draft model");
    if (o->tree && (!o->self_draft || o->tree < 2 || o->tree > FLM_SPEC_DRAFT_MAX))
        return flm_fail(err, FLM_ERR_ARG, "a draft tree needs the self-draft and 2..%d nodes", FLM_SPEC_DRAFT_MAX);
    flm_model_info ti, di;
    flm_get_info(target, &ti);
    if (draft) {
        flm_get_info(draft, &di);
        if (di.n_vocab != ti.n_vocab)
            return flm_fail(err, FLM_ERR_ARG, "speculative decoding: the draft has %u logits per token, the target %u",
                            di.n_vocab, ti.n_vocab);
    }
    spec *s = calloc(1, sizeof *s);
    if (!s) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    s->target = target;
    s->draft = draft;
    s->smp = smp;
    s->o = *o;
    s->n_vocab = ti.n_vocab;
    s->n_ctx = (int32_t)ti.n_ctx;
    flm_plan_info tp;
    flm_get_plan(target, &tp);
    s->n_batch = tp.n_batch;
    s->out_flash = tp.out_flash_bytes > 0;
    s->draft_n_ctx = draft ? (int32_t)di.n_ctx : 0;
    const size_t V = ti.n_vocab, T = (size_t)o->tree, N = T > (size_t)o->n_draft ? T : (size_t)o->n_draft,
                 D = T ? (size_t)FLM_SPEC_TREE_DRAFT(o->tree) : 0; /* the nodes a tree drafts */
    s->hist = hist;
    s->dtok = draft ? malloc((size_t)s->draft_n_ctx * sizeof *s->dtok) : NULL;
    s->batch = malloc((N + 1) * sizeof *s->batch);
    s->rows = malloc((N + 1) * V * sizeof *s->rows);
    if (T) {
        s->ttok = malloc(D * sizeof *s->ttok);
        s->tpar = malloc(D * sizeof *s->tpar);
        s->tscore = malloc(D * sizeof *s->tscore);
    }
    if (T && (!s->ttok || !s->tpar || !s->tscore)) {
        spec_free(s);
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory for a draft tree of %zu nodes", D);
    }
    if (!s->hist || (draft && !s->dtok) || !s->batch || !s->rows) {
        spec_free(s);
        return flm_fail(err, FLM_ERR_NOMEM, "out of memory for the speculative decoding buffers (%.2f MiB)",
                        flm_spec_buffer_bytes(ti.n_vocab, ti.n_ctx, o, draft != NULL, flm_sampler_greedy(smp)) /
                            1048576.0);
    }
    *out = s;
    return FLM_OK;
}

flm_status flm_spec_check_vocab(const flm_ctx *target, const char *target_path, const flm_ctx *draft,
                                const char *draft_path, flm_error *err) {
#define NOT_SHARED "the draft model %s does not share the target model %s's tokenizer: "
    flm_model_info ti, di;
    flm_get_info(target, &ti);
    flm_get_info(draft, &di);
    uint32_t tn = flm_vocab_size(target), dn = flm_vocab_size(draft);
    if (ti.n_vocab != di.n_vocab || tn != dn)
        return flm_fail(err, FLM_ERR_ARG, NOT_SHARED "its vocabulary has %u tokens (%u logits), the target's %u (%u "
                        "logits)", draft_path, target_path, dn, di.n_vocab, tn, ti.n_vocab);
    if (ti.bos != di.bos || ti.eos != di.eos)
        return flm_fail(err, FLM_ERR_ARG, NOT_SHARED "BOS/EOS are %d/%d in the draft, %d/%d in the target", draft_path,
                        target_path, di.bos, di.eos, ti.bos, ti.eos);
    for (uint32_t i = 0; i < tn; i++) {
        const char *a = flm_token_text(target, (int32_t)i), *b = flm_token_text(draft, (int32_t)i);
        size_t la, lb;
        const char *pa = flm_token_piece(target, -1, (int32_t)i, &la),
                   *pb = flm_token_piece(draft, -1, (int32_t)i, &lb);
        bool eog_a = flm_token_is_eog(target, (int32_t)i), eog_b = flm_token_is_eog(draft, (int32_t)i);
        if (strcmp(a, b) != 0 || la != lb || memcmp(pa, pb, la) != 0 || eog_a != eog_b)
            return flm_fail(err, FLM_ERR_ARG, NOT_SHARED "token %u is \"%.40s\"%s in the draft, \"%.40s\"%s in the "
                            "target", draft_path, target_path, i, b, eog_b ? " (end of generation)" : "", a,
                            eog_a ? " (end of generation)" : "");
    }
    return FLM_OK;
#undef NOT_SHARED
}

void spec_set_sampler(spec *s, flm_sampler *smp) { s->smp = smp; }

void spec_set_key_off(spec *s, uint64_t key_off) { s->key_off = key_off; }

void spec_set_seq(spec *s, uint32_t seq) { s->seq = seq; }

void spec_take_calls(spec *s, flm_call_stats *sum, flm_call_stats *last) {
    *sum = s->calls;
    *last = s->last_call;
    memset(&s->calls, 0, sizeof s->calls);
    memset(&s->last_call, 0, sizeof s->last_call);
}

/* An evaluation on the target (flm_evaluate on the engine's sequence), its statistics kept for spec_take_calls.
 * t_draft, t_batch and t_tree are flm_eval_draft, flm_eval_batch and flm_eval_tree through it. */
static flm_status t_eval(spec *s, flm_eval_args a, const float **logits, flm_error *err) {
    a.seq = s->seq;
    flm_eval_out out;
    const flm_status st = flm_evaluate(s->target, &a, &out, err);
    flm_call_stats_add(&s->calls, &out.stats);
    s->last_call = out.stats;
    if (!st && logits) *logits = out.logits;
    return st;
}

static flm_status t_draft(spec *s, int32_t tok, int32_t pos, bool join, const float **logits, flm_error *err) {
    return t_eval(s, (flm_eval_args){.tokens = &tok, .n = 1, .pos = pos, .draft = true, .join = join}, logits, err);
}

static flm_status t_batch(spec *s, const int32_t *tokens, uint32_t n, int32_t pos, bool join, float *logits_all,
                          flm_error *err) {
    return t_eval(s, (flm_eval_args){.tokens = tokens, .n = n, .pos = pos, .join = join, .logits_all = logits_all,
                                     .logits = FLM_EVAL_LOGITS_ALL}, NULL, err);
}

static flm_status t_tree(spec *s, const int32_t *tokens, const int32_t *parent, uint32_t n, uint32_t first,
                         int32_t pos, bool draft, bool join, float *logits, flm_error *err) {
    return t_eval(s, (flm_eval_args){.tokens = tokens, .n = n, .pos = pos, .draft = draft, .parent = parent,
                                     .first = first, .logits_all = logits, .join = join,
                                     .logits = logits ? FLM_EVAL_LOGITS_ALL : FLM_EVAL_LOGITS_NONE}, NULL, err);
}

/* The logits of n nodes of the tree the target holds for this sequence (joined: its own, kept by the sequence), and
 * the path kept: flm_tree_logits_n / flm_tree_accept, or their sequence forms when the tree was joined. */
static flm_status t_tree_logits(spec *s, bool join, const uint32_t *nodes, uint32_t n, float *logits,
                                flm_error *err) {
    return join ? flm_seq_tree_logits_n(s->target, s->seq, nodes, n, logits, err)
                : flm_tree_logits_n(s->target, nodes, n, logits, err);
}

static flm_status t_tree_accept(spec *s, bool join, int32_t pos, const uint32_t *path, uint32_t m, flm_error *err) {
    return join ? flm_seq_tree_accept(s->target, s->seq, pos, path, m, err)
                : flm_tree_accept(s->target, pos, path, m, err);
}

/* The token plain decoding takes at position pos from logits (the history hist[0..pos) written): the session's
 * sampler at the position's noise key. */
static int32_t pick(spec *s, const float *logits, int32_t pos) {
    return flm_sampler_sample_at(s->smp, logits, (uint64_t)pos + s->key_off, s->hist, (size_t)pos);
}

flm_spec_stats *spec_stats(spec *s) { return &s->st; }

/* Bring the draft model to hold seq[0..n) (n <= its context): evaluate from the first token it holds that differs
 * (at least the last one, so its logits are fresh) in one batched call; *logits gets the next-token logits. The
 * tokens count in the statistics when count (generation, not a prompt). */
static flm_status draft_sync(spec *s, const int32_t *seq, int32_t n, bool count, const float **logits,
                             flm_error *err) {
    int32_t v = 0;
    while (v < s->n_dtok && v < n && s->dtok[v] == seq[v]) v++;
    if (v >= n) v = n - 1;
    flm_status st = flm_eval_batch(s->draft, seq + v, (uint32_t)(n - v), v, NULL, logits, err);
    if (st) {
        s->n_dtok = v < s->n_dtok ? v : s->n_dtok; /* it holds positions < v, as before the call */
        return st;
    }
    memcpy(s->dtok + v, seq + v, (size_t)(n - v) * sizeof *seq);
    s->n_dtok = n;
    if (count) s->st.draft_tokens += (uint64_t)(n - v);
    return FLM_OK;
}

flm_status spec_prompted(spec *s, int32_t n, flm_error *err) {
    s->n_hist = n;
    if (!s->draft || n <= 0 || n > s->draft_n_ctx) return FLM_OK; /* now rather than in the first step */
    const float *dl;
    return draft_sync(s, s->hist, n, false, &dl, err);
}

/* Propose up to n tokens after seq[0..len) (seq = s->hist) into out with the draft model, each drawn from the draft's
 * logits with the noise of its position (pick: coupled with the target's draw there) and written to seq too; stops
 * after an end-of-generation token. Returns how many (0 when the draft's context has no room). */
static flm_status draft_propose(spec *s, const int32_t *seq, int32_t len, uint32_t n, int32_t *out,
                                uint32_t *n_out, flm_error *err) {
    *n_out = 0;
    if (len > s->draft_n_ctx) return FLM_OK;
    if ((int64_t)len + n - 1 > s->draft_n_ctx) n = (uint32_t)(s->draft_n_ctx - len + 1); /* d_n is not evaluated */
    double t0 = flm_now_ms();
    const float *logits;
    flm_status st = draft_sync(s, seq, len, true, &logits, err);
    uint32_t i = 0;
    for (; !st && i < n; i++) {
        const int32_t d = pick(s, logits, len + (int32_t)i);
        out[i] = s->hist[len + i] = d;
        if (i + 1 == n || flm_token_is_eog(s->draft, d)) { i++; break; }
        st = flm_eval(s->draft, d, len + (int32_t)i, &logits, err);
        if (!st) {
            s->dtok[len + i] = d;
            s->n_dtok = len + (int32_t)i + 1;
            s->st.draft_tokens++;
        }
    }
    s->st.draft_ms += flm_now_ms() - t0;
    *n_out = st ? 0 : i;
    return st;
}

/* Propose up to n tokens after seq[0..len) with the self-draft: the target's own pass over its resident neurons
 * (flm_eval_draft), from position len - 1 (seq[len - 1], the step's `last`, not yet evaluated), with the target's
 * exact keys and values for the positions before; each token drawn as draft_propose's. The approximate keys and values it
 * stores at len - 1 .. len + n - 2 are all overwritten by the verification batch, which starts at len - 1. *pass_ms
 * gets the draft passes' own ms (flm_call_stats.pass_ms summed: a joined pass's wait to begin left out). */
static flm_status self_propose(spec *s, const int32_t *seq, int32_t len, uint32_t n, bool joined, int32_t *out,
                               uint32_t *n_out, double *pass_ms, flm_error *err) {
    *n_out = 0;
    double t0 = flm_now_ms();
    int32_t tok = seq[len - 1];
    flm_status st = FLM_OK;
    uint32_t i = 0;
    *pass_ms = 0;
    for (; i < n; i++) {
        const float *logits;
        if ((st = t_draft(s, tok, len - 1 + (int32_t)i, joined, &logits, err))) break;
        *pass_ms += s->last_call.pass_ms;
        s->st.draft_tokens++;
        const int32_t d = pick(s, logits, len + (int32_t)i);
        out[i] = tok = s->hist[len + i] = d;
        if (flm_token_is_eog(s->target, d)) { i++; break; }
    }
    s->st.draft_ms += flm_now_ms() - t0;
    *n_out = st ? 0 : i;
    return st;
}

uint32_t spec_ngram_lookup(const int32_t *seq, size_t len, uint32_t max_n, int32_t *out, uint32_t cap) {
    if (cap == 0) return 0;
    for (uint32_t n = max_n; n >= 1; n--) {
        if (len < (size_t)n + 1) continue;
        const int32_t *tail = seq + len - n;
        for (size_t j = len - n; j-- > 0;) { /* the most recent earlier occurrence first */
            if (memcmp(seq + j, tail, n * sizeof *seq) != 0) continue;
            size_t from = j + n, m = len - from < cap ? len - from : cap;
            memcpy(out, seq + from, m * sizeof *seq);
            return (uint32_t)m;
        }
    }
    return 0;
}

/* The estimated ms of a verification pass of k rows: measured, or the nearest measured one (passes that read the
 * same bytes cost about the same until compute dominates; a wrong guess is corrected once that k is tried). */
static double verify_cost(const spec *s, int k) {
    if (s->c_verify[k] > 0) return s->c_verify[k];
    for (int d = 1; d <= FLM_SPEC_DRAFT_MAX + 1; d++) {
        if (k - d >= 1 && s->c_verify[k - d] > 0) return s->c_verify[k - d];
        if (k + d <= FLM_SPEC_DRAFT_MAX + 1 && s->c_verify[k + d] > 0) return s->c_verify[k + d];
    }
    return 0;
}

/* The draft length (0..max) with the most expected tokens per ms (see flm_spec_params.adaptive). Until a draft and a
 * pass have been timed it drafts max; every 8th step it tries one more or one less than its choice (exploration:
 * the estimates of the lengths it does not take would otherwise never change). */
static long choose_n(spec *s, long max) {
    if (!s->o.adaptive || max <= 0) return max;
    if (s->c_draft <= 0 || verify_cost(s, 1) <= 0) return max;
    const double a = (s->acc_a + 1.0) / (s->acc_n + 2.0); /* acceptance, with a uniform prior */
    long best = 0;
    double best_rate = 0;
    for (long n = 0; n <= max; n++) {
        double e = a >= 1.0 ? (double)(n + 1) : (1.0 - pow(a, (double)(n + 1))) / (1.0 - a);
        double cost = (double)n * s->c_draft + verify_cost(s, (int)n + 1);
        double rate = cost > 0 ? e / cost : 0;
        if (rate > best_rate) { best_rate = rate; best = n; }
    }
    if (++s->n_choices % 8 == 0) best = best == 0 ? 1 : best == max ? best - 1 : best + 1;
    return best;
}

/* A joined step's draft length (0..max), a the joined drafts' acceptance (decayed, a uniform prior).
 * Drafts that cost passes (the self-draft, a draft model): with both costs measured, the length with the most
 * expected tokens per ms, as choose_n, over the joined calls' own wall times (a step in step with the others: their
 * draft passes and their verification are this sequence's too). The verification's time grows with its pass's
 * compute, which grows with the rows (each through every layer), less the time the pass waited for flash reads,
 * which more compute fills (the reads go on meanwhile). The sequences busy beside this one are taken to draft as it
 * does (they follow the same rule), so a draft adds a row of compute for each of them: with compute and wait the
 * pass's (this sequence's shares times the sequences) and rows the verifications' own, k drafts change the
 * compute by delta = compute * ((k + 1) / rows - 1), and the verification takes V + delta when delta <= 0, else
 * V + max(0, delta - wait). Every 16th step drafts one more than chosen (the acceptance would otherwise never be
 * measured again).
 * Drafts that cost no pass (the n-gram lookup): the k-th is proposed while its chance of being reached and
 * accepted, a^k, is at least SPEC_JOIN_MIN_GAIN; every 8th step that would propose none proposes one. */
#define SPEC_JOIN_MIN_GAIN 0.3
static long choose_n_joined(spec *s, long max) {
    if (max <= 0) return 0;
    const double a = (s->jacc_a + 1.0) / (s->jacc_n + 2.0);
    const uint64_t c = ++s->n_jchoices;
    long n = 0;
    if (!s->draft && !s->o.self_draft) {
        for (double p = a; n < max && p >= SPEC_JOIN_MIN_GAIN; p *= a) n++;
        if (n == 0 && c % 8 == 0) n = 1;
        return n;
    }
    if (s->jc_draft <= 0 || s->jc_verify <= 0 || s->jv_rows <= 0) return 1; /* until the costs are measured */
    const double m = (double)(flm_seq_busy(s->target, s->seq) + 1), compute = s->jv_c * m, wait = s->jv_w * m;
    double best_rate = 0;
    for (long k = 0; k <= max; k++) {
        const double e = a >= 1.0 ? (double)(k + 1) : (1.0 - pow(a, (double)(k + 1))) / (1.0 - a);
        const double delta = compute * ((double)(k + 1) / s->jv_rows - 1.0);
        double v = s->jc_verify + (delta <= 0 ? delta : delta > wait ? delta - wait : 0);
        if (v < 1e-3) v = 1e-3;
        const double rate = e / ((double)k * s->jc_draft + v);
        if (rate > best_rate) { best_rate = rate; n = k; }
    }
    if (c % 16 == 0) n = n < max ? n + 1 : n;
    return n;
}

/* Fold one measurement into an estimate: the first sets it, then an exponential average. */
static void ema(double *v, double x) { *v = *v > 0 ? 0.75 * *v + 0.25 * x : x; }

/* One step with the target holding hist[0..n_hist) and `last` next (n_hist < n_ctx): propose, verify in one pass,
 * accept. out[0..*m) gets the tokens decided (*m >= 1): the accepted drafts, then the target's own token; the target
 * then holds hist + last + the accepted drafts (s->n_hist), and s->rows row j holds the logits after out[j - 1]
 * (row 0: after last). max_new (>= 1) bounds *m. joined (a shared context while other sequences are busy): the
 * self-draft's passes join the other sequences' drafts and the verification joins their pass (flm_evaluate with
 * join); at most the batch's share of one sequence is drafted, a chain (the steps without a tree: a tree's are
 * tree_step's, joined or not), its length chosen by the joined drafts' acceptance (choose_n_joined), not by the
 * timings of passes alone. */
static flm_status step(spec *s, int32_t last, long max_new, bool joined, int32_t *out, uint32_t *m, flm_error *err) {
    const int32_t H = s->n_hist, L = H + 1;
    const size_t V = s->n_vocab;
    s->hist[H] = last;
    long n = s->o.n_draft;
    if (n > max_new - 1) n = max_new - 1;
    if (n > s->n_ctx - L) n = s->n_ctx - L; /* the batch [last, d1..dn] ends at position H + n < n_ctx */
    if (joined) {
        const long share = (long)(s->n_batch / (flm_n_seq(s->target) ? flm_n_seq(s->target) : 1)) - 1;
        if (n > share) n = share; /* every sequence's step fits one pass */
        n = choose_n_joined(s, n);
    } else {
        n = choose_n(s, n);
    }
    uint32_t nd = 0;
    flm_status st = FLM_OK;
    double t0 = flm_now_ms(), pass_ms = 0;
    const double draft_ms0 = s->st.draft_ms;
    if (n > 0 && s->draft) st = draft_propose(s, s->hist, L, (uint32_t)n, s->batch + 1, &nd, err);
    else if (n > 0 && s->o.self_draft)
        st = self_propose(s, s->hist, L, (uint32_t)n, joined, s->batch + 1, &nd, &pass_ms, err);
    else if (n > 0) nd = spec_ngram_lookup(s->hist, (size_t)L, SPEC_NGRAM_MAX, s->batch + 1, (uint32_t)n);
    if (st) return st;
    if (!s->draft && !s->o.self_draft) s->st.draft_select_ms += flm_now_ms() - t0;
    s->batch[0] = last;
    /* a joined self-draft's cost is its passes' own time: the wait for a pass to begin (behind the others'
     * verification, say) would be waited for by the verification all the same, and one long wait taken as the
     * drafts' cost would keep the sequence from drafting for a long time (it explores one step in 16) */
    if (nd > 0 && joined && pass_ms > 0) /* the self-draft's (the only joined one) */
        ema(&s->jc_draft, pass_ms / nd);
    else if (nd > 0 && s->st.draft_ms > draft_ms0)
        ema(joined ? &s->jc_draft : &s->c_draft, (s->st.draft_ms - draft_ms0) / nd);
    const double tv = flm_now_ms();
    if ((st = t_batch(s, s->batch, nd + 1, H, joined, s->rows, err))) return st;
    const double dv = flm_now_ms() - tv;
    ema(joined ? &s->jc_verify : &s->c_verify[nd + 1], dv); /* a joined pass's time is every sequence's */
    if (joined) {
        ema(&s->jv_rows, (double)(nd + 1));
        ema(&s->jv_c, s->last_call.total.compute_ms);
        ema(&s->jv_w, s->last_call.total.io_ms);
    }

    s->st.verify_ms[nd + 1] += dv;
    s->st.verify_n[nd + 1]++;
    s->st.n_passes++;
    s->st.n_steps++;
    s->st.n_drafted += nd;
    if (nd == 0) s->st.n_plain++;
    if (joined) {
        s->st.n_joined++;
        s->st.n_joined_drafted += nd;
    }
    t0 = flm_now_ms();
    /* row k's token is plain decoding's at position L + k (the drafts before it in the history); d_{k+1} is accepted
     * when it is that token; the first that is not is replaced by it; all accepted: row nd gives one more */
    memcpy(s->hist + L, s->batch + 1, nd * sizeof *s->hist);
    uint32_t k = 0;
    for (;; k++) {
        out[k] = pick(s, s->rows + k * V, L + (int32_t)k);
        if (k == nd || out[k] != s->batch[1 + k]) break;
    }
    s->st.draft_select_ms += flm_now_ms() - t0;
    s->st.n_accepted += k;
    if (joined) {
        s->st.n_joined_accepted += k;
        if (nd > 0) {
            s->jacc_a = 0.9 * s->jacc_a + (double)k;
            s->jacc_n = 0.9 * s->jacc_n + (double)k + (k < nd ? 1.0 : 0.0);
        }
    }
    /* the acceptance of one draft token: accepted ones over accepted ones and the first rejection (the drafts after
     * it were never tested); decayed, as the text changes */
    s->acc_a = 0.9 * s->acc_a + (double)k;
    s->acc_n = 0.9 * s->acc_n + (double)k + (k < nd ? 1.0 : 0.0);
    s->n_hist = L + (int32_t)k;
    *m = k + 1;
    return FLM_OK;
}

/* The K most likely tokens of logits[0..V) and their probabilities at temperature 1 (softmax), most likely first. */
static int top_k_probs(const float *logits, size_t V, int K, int32_t *tok, float *prob) {
    int n = 0;
    for (size_t i = 0; i < V; i++) {
        const float x = logits[i];
        if (n == K && x <= logits[tok[n - 1]]) continue;
        int j = n < K ? n++ : K - 1;
        while (j > 0 && logits[tok[j - 1]] < x) { tok[j] = tok[j - 1]; j--; }
        tok[j] = (int32_t)i;
    }
    if (n == 0) return 0;
    const float mx = logits[tok[0]], lo = mx - 20.0f; /* the rest add under V * e^-20 of the sum */
    double sum = 0;
    for (size_t i = 0; i < V; i++)
        if (logits[i] > lo) sum += expf(logits[i] - mx);
    for (int j = 0; j < n; j++) prob[j] = (float)(exp((double)logits[tok[j]] - mx) / sum);
    return n;
}

typedef struct tree_cand {
    int32_t parent, tok;
    float score;
} tree_cand;

static int cand_cmp(const void *a, const void *b) {
    const tree_cand *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? 1 : -1;
    if (x->parent != y->parent) return x->parent - y->parent;
    return x->tok - y->tok;
}

/* The estimated ms of a verification pass of n rows: a line fitted to the passes measured (decayed), its slope
 * pulled toward mean / 32 (a pass of 32 rows costing twice one of a few) while few row counts were seen. */
static double tree_verify_ms(const spec *s, double n) {
    if (s->v_w <= 0) return 0;
    const double mx = s->v_x / s->v_w, my = s->v_y / s->v_w;
    const double sxx = s->v_xx - s->v_w * mx * mx, sxy = s->v_xy - s->v_w * mx * my, lambda = 4.0 * 64.0;
    const double b0 = my / 32.0, b = (sxy + lambda * b0) / (sxx + lambda);
    return my + b * (n - mx);
}

/* The estimated ms of a joined verification pass in which this sequence has n rows, the other busy sequences taken
 * to do as it does (choose_n_joined's model; m: the busy sequences, this one included): the pass's compute (its rows' share, measured, times the sequences)
 * changes by delta in proportion to the rows; a pass that waited for flash reads (wait) absorbs added compute up to
 * that wait and gains nothing from less. 0 until measured. */
static double joined_verify_ms(const spec *s, double m, double n) {
    if (s->jc_verify <= 0 || s->jv_rows <= 0) return 0;
    const double compute = s->jv_c * m, wait = s->jv_w * m;
    const double delta = compute * (n / s->jv_rows - 1.0);
    double v = s->jc_verify + (delta > 0 ? (delta > wait ? delta - wait : 0) : (delta + wait < 0 ? delta + wait : 0));
    return v < 1e-3 ? 1e-3 : v;
}

/* Keep at most M of the N drafted nodes (the root included), those that make the most expected tokens per ms: the
 * nodes by path probability (a node's never exceeds its parent's, and ties keep index order, so every prefix of that
 * order is a tree), expected tokens 1 + kappa * the sum of their probabilities (kappa: accepted over promised,
 * measured), cost: this step's draft ms + the verification's ms at that many rows (tree_verify_ms; joined:
 * joined_verify_ms, kappa the joined steps'). map[new] = old index; returns the nodes kept. The first passes, before
 * any is measured, keep the M most likely. */
static int32_t tree_prune(spec *s, int32_t N, int32_t M, double draft_ms, bool joined, int32_t *map) {
    for (int32_t i = 0; i < N; i++) map[i] = i;
    if (N <= 2 && N <= M) return N;
    int32_t ord[FLM_SPEC_DRAFT_MAX];
    int32_t n = 0;
    for (int32_t i = 1; i < N; i++) { /* insertion sort: score descending, index ascending */
        int32_t j = n++;
        while (j > 0 && (s->tscore[ord[j - 1]] < s->tscore[i])) { ord[j] = ord[j - 1]; j--; }
        ord[j] = i;
    }
    const int32_t most = n < M - 1 ? n : M - 1; /* nodes besides the root */
    int32_t best = most;
    const double busy = joined ? (double)(flm_seq_busy(s->target, s->seq) + 1) : 1.0; /* asked once */
    if (joined ? joined_verify_ms(s, busy, 1) > 0 : s->v_w > 0) {
        const double kappa = joined ? (s->jk_num + 1.0) / (s->jk_den + 1.0) : (s->k_num + 1.0) / (s->k_den + 1.0);
        double sum = 0, best_rate = 1.0 / (draft_ms + (joined ? joined_verify_ms(s, busy, 1) : tree_verify_ms(s, 1)));
        best = 0;
        for (int32_t m = 1; m <= most; m++) {
            sum += s->tscore[ord[m - 1]];
            const double v = joined ? joined_verify_ms(s, busy, m + 1) : tree_verify_ms(s, m + 1);
            double rate = (1.0 + kappa * sum) / (draft_ms + v);
            if (rate > best_rate) { best_rate = rate; best = m; }
        }
    }
    if (best == n) return N;
    uint8_t keep[FLM_SPEC_DRAFT_MAX] = {0};
    keep[0] = 1;
    for (int32_t m = 0; m < best; m++) keep[ord[m]] = 1;
    int32_t newi[FLM_SPEC_DRAFT_MAX], k = 0;
    for (int32_t i = 0; i < N; i++) {
        if (!keep[i] || (i > 0 && newi[s->tpar[i]] < 0)) { newi[i] = -1; continue; }
        newi[i] = k;
        map[k] = i;
        s->ttok[k] = s->ttok[i];
        s->tscore[k] = s->tscore[i];
        s->tpar[k] = i == 0 ? -1 : newi[s->tpar[i]];
        k++;
    }
    return k;
}

/* The candidates one drafted level offers (their logits at s->rows, row u - lo for frontier node u in [lo, hi)): each
 * node's SPEC_TREE_K most likely tokens (greedy) or the first SPEC_TREE_K of its draft's race with the noise of the
 * children's position H + d + 1 (sampling: flm_sampler_draws_at, Gumbel-top-k), scored by the path's draft
 * probability. An
 * end-of-generation node offers none. Returns their count in cand. */
static int tree_level_cands(spec *s, int32_t H, long d, int32_t lo, int32_t hi, bool greedy, tree_cand *cand) {
    const size_t V = s->n_vocab;
    const int K = SPEC_TREE_K;
    int nc = 0;
    for (int32_t u = lo; u < hi; u++) {
        if (flm_token_is_eog(s->target, s->ttok[u])) continue;
        const float *lg = s->rows + (size_t)(u - lo) * V;
        int32_t tk[SPEC_TREE_K];
        float pr[SPEC_TREE_K];
        int nk;
        if (greedy) nk = top_k_probs(lg, V, K, tk, pr);
        else /* the draft's race at the children's position (the penalties see the history before the tree) */
            nk = flm_sampler_draws_at(s->smp, lg, (uint64_t)(H + d + 1) + s->key_off, s->hist, (size_t)H + 1, K, tk,
                                      pr);
        for (int j = 0; j < nk; j++) cand[nc++] = (tree_cand){u, tk[j], s->tscore[u] * pr[j]};
    }
    return nc;
}

/* The score a node needs to be among the best M - 1 of nodes 1..N - 1 (the root is always verified): 0 while there
 * are fewer, else the (M - 1)-th largest. */
static float tree_cut(const spec *s, int32_t N, int32_t M) {
    if (N - 1 < M - 1 || M < 2) return M < 2 ? INFINITY : 0.0f;
    float top[FLM_SPEC_DRAFT_MAX]; /* the M - 1 largest, descending */
    int32_t n = 0;
    for (int32_t i = 1; i < N; i++) {
        const float x = s->tscore[i];
        if (n == M - 1 && x <= top[n - 1]) continue;
        int32_t j = n < M - 1 ? n++ : M - 2;
        while (j > 0 && top[j - 1] < x) { top[j] = top[j - 1]; j--; }
        top[j] = x;
    }
    return top[M - 2];
}

/* Draft: the self-draft grows a tree from the root `last` (node 0, at position H) a level at a time, each level's
 * frontier in one flm_eval_tree with draft = true: the best SPEC_TREE_W candidates by path probability
 * (tree_level_cands) join while the tree has room (cap nodes) and the depth is below depth_max, and another level
 * pays by the measured costs (c_level against what the frontier can add). The verification takes M <= cap nodes
 * (tree_prune: the likeliest), so the draft grows past M where it can still change which: a candidate joins only if
 * it beats the M-th best node so far (tree_cut), and a level is drafted only if one of its frontier does (SpecExec:
 * the nodes a draft expands are those the verification's budget may keep). Greedy trees also hold the n-gram
 * lookup's continuation as a branch (merged where the draft agrees; always kept). *n_nodes gets the tree's size;
 * draft_tokens and draft_ms are counted. Errors: those of flm_eval_tree. */
static flm_status tree_draft(spec *s, int32_t H, int32_t last, int32_t cap, int32_t M, long depth_max, bool joined,
                             int32_t *n_nodes, double *draft_ms, flm_error *err) {
    const bool greedy = flm_sampler_greedy(s->smp);
    int32_t N = 1;
    s->ttok[0] = last;
    s->tpar[0] = -1;
    s->tscore[0] = 1.0f;
    /* the n-gram continuation (greedy): a branch from the root, as far as it is in the tree */
    int32_t ng[FLM_SPEC_DRAFT_MAX];
    uint32_t n_ng = 0;
    int32_t ng_node = 0;
    if (greedy && depth_max > 0)
        n_ng = spec_ngram_lookup(s->hist, (size_t)H + 1, SPEC_NGRAM_MAX, ng, (uint32_t)depth_max);
    flm_status st = FLM_OK;
    const double t0 = flm_now_ms();
    double own_ms = 0; /* joined: the levels' passes' own ms (their waits to begin are the others' drafts) */
    tree_cand cand[SPEC_TREE_W * SPEC_TREE_K + 1];
    /* a level's frontier: at most SPEC_TREE_W nodes, and no more than the logits rows (s->rows: max(tree, n_draft)
     * + 1 >= 3) hold */
    const int32_t rows = (s->o.tree > s->o.n_draft ? s->o.tree : s->o.n_draft) + 1,
                  width = rows < SPEC_TREE_W ? rows : SPEC_TREE_W;
    int32_t lo = 0, hi = 1;
    for (long d = 0; d < depth_max && lo < hi && N < cap; d++) {
        /* another level pays when the tokens it may add are worth its ms: stop once what the frontier's children
         * can add to the verified tree's path probability at most (each node's excess over the M-th best node, which
         * a child would displace; all of it while the tree has fewer than M) times the ms a token costs is below a
         * level's ms, or when no frontier node beats the M-th best (its children score no more than it: none would
         * be verified; the n-gram's branch excepted) */
        double front = 0;
        const float cut = tree_cut(s, N, M);
        bool useful = ng_node >= lo && ng_node < hi && (uint32_t)d < n_ng;
        for (int32_t u = lo; u < hi; u++) {
            if (s->tscore[u] > cut) front += s->tscore[u] - cut;
            useful |= s->tscore[u] > cut;
        }
        if (!useful) break;
        const double kappa = joined ? (s->jk_num + 1.0) / (s->jk_den + 1.0) : (s->k_num + 1.0) / (s->k_den + 1.0);
        /* joined: a level's pass holds up every busy sequence, so a token is worth the step's ms over all of their
         * tokens (this sequence's ms per token over the sequences), not this sequence's alone */
        const double c_level = joined ? s->jc_level : s->c_level,
                     ms_token = joined ? s->jms_token / (double)(flm_seq_busy(s->target, s->seq) + 1) : s->ms_token;
        if (c_level > 0 && ms_token > 0 && kappa * front * ms_token < c_level &&
            (d > 0 || ++s->n_choices % 8 != 0)) /* at the root: plain decoding, but every 8th step drafts anyway */
            break;
        const double tl = flm_now_ms();
        if ((st = t_tree(s, s->ttok, s->tpar, (uint32_t)hi, (uint32_t)lo, H, true, joined, s->rows, err)))
            return st;
        /* a level's cost: a joined one's own pass (its wait to begin is the others' drafts, which run anyway) */
        ema(joined ? &s->jc_level : &s->c_level, joined ? s->last_call.pass_ms : flm_now_ms() - tl);
        own_ms += s->last_call.pass_ms;
        s->st.draft_tokens += (uint64_t)(hi - lo);
        int nc = tree_level_cands(s, H, d, lo, hi, greedy, cand);
        if (ng_node >= 0 && (uint32_t)d < n_ng) { /* the n-gram's next token after its node: always in */
            bool merged = false;
            for (int i = 0; i < nc; i++)
                if (cand[i].parent == ng_node && cand[i].tok == ng[d]) { cand[i].score += 1.0f; merged = true; }
            if (!merged) cand[nc++] = (tree_cand){ng_node, ng[d], 1.0f}; /* first in the order, its own score 0 */
        }
        qsort(cand, (size_t)nc, sizeof *cand, cand_cmp);
        const int32_t first_new = N;
        int32_t next_ng = -1;
        for (int i = 0; i < nc && N - first_new < width && N < cap; i++) {
            const bool is_ng = ng_node >= 0 && (uint32_t)d < n_ng && cand[i].parent == ng_node && cand[i].tok == ng[d];
            if (!is_ng && cand[i].score < 0.02f) break; /* too unlikely to be worth a row */
            if (!is_ng && cand[i].score <= cut) break; /* never among the M verified (sorted: nor the rest) */
            s->ttok[N] = cand[i].tok;
            s->tpar[N] = cand[i].parent;
            s->tscore[N] = is_ng ? cand[i].score - 1.0f : cand[i].score;
            if (is_ng) {
                next_ng = N; /* the n-gram's branch: trusted as half its parent at least */
                if (s->tscore[N] < 0.5f * s->tscore[ng_node]) s->tscore[N] = 0.5f * s->tscore[ng_node];
            }
            N++;
        }
        /* the next level: the new nodes, in order of their parents (flm_eval_tree needs parents first: they are) */
        ng_node = next_ng;
        lo = first_new;
        hi = N;
    }
    *draft_ms = flm_now_ms() - t0;
    s->st.draft_ms += *draft_ms;
    if (joined) *draft_ms = own_ms;
    *n_nodes = N;
    return FLM_OK;
}

/* Verify: the target evaluates the pruned tree of N nodes at H in one flm_eval_tree; the output layer only for the
 * nodes the walk visits (flm_tree_logits) when the tree fits one batch (*lazy), else every node's logits into
 * s->rows. The pass's ms feeds the verification cost model (v_*) and the statistics. Errors: those of
 * flm_eval_tree. */
/* The nodes a verification's walk will likely visit: the root and every node whose path's draft probability (tscore)
 * is at least SPEC_PATH_P and whose parent is taken, in node (level) order, pp[0..n) (n returned; 0 when only the
 * root is); brow[node] = its index in pp, -1: not taken. A node taken at index b >= its depth k (its k ancestors come
 * first). */
static uint32_t walk_nodes(const spec *s, int32_t N, uint32_t *pp, int32_t *brow) {
    uint32_t n_pp = 0;
    brow[0] = 0;
    pp[n_pp++] = 0;
    for (int32_t j = 1; j < N; j++) {
        brow[j] = -1;
        if (s->tpar[j] >= 0 && brow[s->tpar[j]] >= 0 && s->tscore[j] >= SPEC_PATH_P) {
            brow[j] = (int32_t)n_pp;
            pp[n_pp++] = (uint32_t)j;
        }
    }
    return n_pp > 1 ? n_pp : 0;
}

static flm_status tree_verify(spec *s, int32_t H, int32_t N, bool joined, bool *lazy, uint32_t *pp, int32_t *brow,
                              uint32_t *n_pp, flm_error *err) {
    const double tv = flm_now_ms();
    /* lazy when the tree fits one batch, but not with the classifier on flash: there each classifier pass reads its
     * rows again (143 MiB a pass for Qwen2.5-Coder-1.5B at --mem 25%), so every node's logits come with the pass */
    *lazy = (N == 1 || (uint32_t)N <= s->n_batch) && !s->out_flash;
    /* lazy: the logits of the nodes the walk will likely visit (walk_nodes) in one classifier pass: joined, with the
     * pass (FLM_EVAL_LOGITS_SOME: with the other sequences' nodes); alone, by the walk (flm_tree_logits_n: the
     * verification's cost line, tree_verify_ms, is the pass's own), the others' on demand */
    *n_pp = *lazy && N > 1 ? walk_nodes(s, N, pp, brow) : 0;
    flm_eval_args a = {.tokens = s->ttok, .n = (uint32_t)N, .pos = H, .parent = s->tpar, .join = joined,
                       .logits = *lazy ? FLM_EVAL_LOGITS_NONE : FLM_EVAL_LOGITS_ALL, .logits_all = *lazy ? NULL : s->rows};
    if (*n_pp && joined) {
        a.logits = FLM_EVAL_LOGITS_SOME;
        a.logits_all = s->rows;
        a.some = pp;
        a.n_some = *n_pp;
    }
    flm_status st = t_eval(s, a, NULL, err);
    if (st) return st;
    const double dv = flm_now_ms() - tv;
    s->st.verify_ms[N] += dv;
    s->st.verify_n[N]++;
    s->st.n_passes++;
    s->st.n_steps++;
    s->st.n_drafted += (uint64_t)(N - 1);
    if (N == 1) s->st.n_plain++;
    if (joined) { /* the pass is every sequence's: its own time and this sequence's rows' shares (joined_verify_ms) */
        s->st.n_joined++;
        s->st.n_joined_drafted += (uint64_t)(N - 1);
        ema(&s->jc_verify, s->last_call.pass_ms);
        ema(&s->jv_rows, (double)N);
        ema(&s->jv_c, s->last_call.total.compute_ms);
        ema(&s->jv_w, s->last_call.total.io_ms);
        return FLM_OK;
    }
    s->v_w = 0.95 * s->v_w + 1.0;
    s->v_x = 0.95 * s->v_x + N;
    s->v_y = 0.95 * s->v_y + dv;
    s->v_xx = 0.95 * s->v_xx + (double)N * N;
    s->v_xy = 0.95 * s->v_xy + (double)N * dv;
    return FLM_OK;
}

/* Walk and accept: from the root down, each node's token (pick: the token plain decoding takes at its position,
 * greedy or sampling, so the text is plain decoding's; map: a node's index when drafted) continues into
 * the child that holds it, or ends the step; flm_tree_accept keeps the path. out[0..k] get the tokens decided (*k
 * accepted drafts), row j of s->rows the logits after out[j - 1], hist the accepted drafts. Lazy: the nodes the walk
 * will likely visit get their logits first, in one classifier pass. Errors: those of flm_tree_logits(_n) and
 * flm_tree_accept. */
static flm_status tree_walk_accept(spec *s, int32_t H, int32_t N, bool joined, bool lazy, const int32_t *map,
                                   const uint32_t *pp, const int32_t *brow, uint32_t n_pp, int32_t *out,
                                   uint32_t *k_out, flm_error *err) {
    const size_t V = s->n_vocab;
    flm_status st;
    const double t0 = flm_now_ms();
    if (n_pp && !joined && (st = t_tree_logits(s, false, pp, n_pp, s->rows, err))) return st; /* alone: now */
    /* Lazy: the nodes the walk will likely visit (walk_nodes, their logits in rows
     * 0..n_pp - 1: one classifier pass for all of them; one node at a time reads the output weights once per node,
     * which on Qwen2.5-Coder-1.5B at --mem 50% cost ~70 ms per generated token). Node u taken at row brow[u] >= its
     * depth k; the walk copies it to row k, where a path's k-th logits go, over a row no later step needs (rows <
     * brow[u] hold nodes no deeper than k). Any other node's logits are asked for when the walk reaches it. */
    uint32_t path[FLM_SPEC_DRAFT_MAX + 1];
    uint32_t k = 0;
    int32_t u = 0;
    path[0] = 0;
    for (;;) {
        const float *lg = s->rows + (size_t)u * V;
        if (lazy) { /* row k: the logits after the k-th token of the path, where generate() reads them */
            if (n_pp && brow[u] >= 0) {
                if ((uint32_t)brow[u] != k)
                    memcpy(s->rows + (size_t)k * V, s->rows + (size_t)brow[u] * V, V * sizeof *s->rows);
            } else {
                const uint32_t node = (uint32_t)u;
                if ((st = t_tree_logits(s, joined, &node, 1, s->rows + (size_t)k * V, err))) return st;
            }
            lg = s->rows + (size_t)k * V;
        }
        const int32_t t = pick(s, lg, H + 1 + (int32_t)k); /* hist[H + 1 .. H + k]: the path so far */
        out[k] = t;
        int32_t c = -1;
        for (int32_t j = u + 1; j < N && c < 0; j++)
            if (s->tpar[j] == u && s->ttok[j] == t) c = j;
        if (c < 0) break;
        path[++k] = (uint32_t)c;
        s->hist[H + k] = t;
        u = c;
    }
    s->st.draft_select_ms += flm_now_ms() - t0;
    if ((st = t_tree_accept(s, joined, H, path, k + 1, err))) return st;
    for (uint32_t j = 1; j <= k; j++) {
        s->hist[H + j] = s->ttok[path[j]];
        if (!lazy && path[j] != j)
            memcpy(s->rows + (size_t)j * V, s->rows + (size_t)path[j] * V, V * sizeof *s->rows);
    }
    s->st.n_accepted += k;
    if (joined) s->st.n_joined_accepted += k;
    *k_out = k;
    return FLM_OK;
}

/* A tree step (o.tree): draft a tree (tree_draft), prune it to the nodes that pay (tree_prune), verify it in one pass
 * (tree_verify), walk and accept (tree_walk_accept), then update the acceptance and cost estimates. Same contract as
 * step(). */
static flm_status tree_step(spec *s, int32_t last, long max_new, bool joined, int32_t *out, uint32_t *m,
                            flm_error *err) {
    const int32_t H = s->n_hist;
    const double t_step = flm_now_ms();
    s->hist[H] = last;
    int32_t cap = FLM_SPEC_TREE_DRAFT(s->o.tree), M = s->o.tree; /* drafted, verified */
    if (cap > s->n_ctx - H) cap = s->n_ctx - H; /* slots H .. H + N - 1 */
    if (joined) { /* every sequence's tree fits one pass beside the others', and its draft grows to 3 times that */
        const uint32_t n_seq = flm_n_seq(s->target) ? flm_n_seq(s->target) : 1;
        const int32_t share = (int32_t)(s->n_batch / n_seq);
        if (M > share) M = share > 1 ? share : 1;
        if (cap > FLM_SPEC_TREE_DRAFT(M)) cap = FLM_SPEC_TREE_DRAFT(M);
    }
    if (M > cap) M = cap;
    long depth_max = s->o.n_draft;
    if (depth_max > max_new - 1) depth_max = max_new - 1;
    int32_t N;
    double step_draft_ms;
    flm_status st = tree_draft(s, H, last, cap, M, depth_max, joined, &N, &step_draft_ms, err);
    if (st) return st;
    int32_t map[FLM_SPEC_DRAFT_MAX];
    N = tree_prune(s, N, M, step_draft_ms, joined, map);
    double promised = 0;
    for (int32_t i = 1; i < N; i++) promised += s->tscore[i];
    bool lazy;
    uint32_t k, pp[FLM_SPEC_DRAFT_MAX + 1], n_pp;
    int32_t brow[FLM_SPEC_DRAFT_MAX + 1]; /* node -> its row among pp, -1: not taken */
    if ((st = tree_verify(s, H, N, joined, &lazy, pp, brow, &n_pp, err)) ||
        (st = tree_walk_accept(s, H, N, joined, lazy, map, pp, brow, n_pp, out, &k, err)))
        return st;
    s->acc_a = 0.9 * s->acc_a + (double)k;
    s->acc_n = 0.9 * s->acc_n + (double)k + 1.0;
    if (joined) {
        s->jk_num = 0.9 * s->jk_num + (double)k;
        s->jk_den = 0.9 * s->jk_den + promised;
    } else {
        s->k_num = 0.9 * s->k_num + (double)k;
        s->k_den = 0.9 * s->k_den + promised;
    }
    ema(joined ? &s->jms_token : &s->ms_token, (flm_now_ms() - t_step) / (double)(k + 1));
    s->n_hist = H + 1 + (int32_t)k;
    *m = k + 1;
    return FLM_OK;
}

flm_status spec_step(spec *s, int32_t H, int32_t last, long max_new, bool joined, int32_t *out, uint32_t *m,
                     const float **rows, flm_error *err) {
    *m = 0;
    *rows = NULL;
    if (H < 0 || H >= s->n_ctx || max_new < 1)
        return flm_fail(err, FLM_ERR_ARG, "speculative step at position %d (context %d), %ld tokens", (int)H,
                        (int)s->n_ctx, max_new);
    s->n_hist = H;
    flm_status st = s->o.tree ? tree_step(s, last, max_new, joined, out, m, err)
                              : step(s, last, max_new, joined, out, m, err);
    if (st) {
        s->n_hist = H;
        return st;
    }
    *rows = s->rows;
    return FLM_OK;
}
