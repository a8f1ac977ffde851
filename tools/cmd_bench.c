/* cmd_bench.c — `flashlm bench`: the paper's protocol (Knowl 7) for several modes in one run, side by side; optional
 * sweeps over the memory budget (the memory-latency trade-off) and over the sliding window k (Knowl 3's increment
 * s_agg(k+1) - s_agg(k)); JSON with per-token series and a machine description; SVG figures (tools/svg.c).
 *
 * Each run (one mode, one set of parameters) happens in a child process (fork) so that its peak RSS is its own; the
 * child sends back a fixed bench_result followed by n_series bench_tok records through a pipe. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "flashlm.h"
#include "flashlm_tools.h"
#include "svg.h"

#define BENCH_MAX_SERIES 4096 /* per-token records sent back per run */
#define BENCH_MAX_MODES 16
#define BENCH_MAX_SWEEP 32

/* One generated token's totals (summed over layers). */
typedef struct bench_tok {
    double io_ms, mem_ms, cmp_ms;
    uint64_t bytes, reads, predicted, loaded, reused;
} bench_tok;

typedef struct bench_result {
    int ok;
    char err[512];
    char mode[16], backend[16];
    int direct;
    int n_prompt, n_gen;                        /* n_gen: decoding tokens after the first (the statistics' base) */
    double prompt_ms, first_ms;                 /* the whole prompt; the first token after it */
    uint64_t prompt_bytes;                      /* bytes read for the whole prompt */
    int n_batch;                                /* the batch size the prompt ran with (-b, or @bN) */
    /* the median decoding token's split (the mean of the two middle tokens' splits when n_gen is even): the parts
     * add up to tot_med, which is the median of the per-token totals */
    double io_med, mem_med, cmp_med, tot_med;
    double tot_p10, tot_p90;
    double io_mean, mem_mean, cmp_mean, tot_mean; /* tot_mean = io_mean + mem_mean + cmp_mean */
    double bytes_per_tok, reads_per_tok, gbps;  /* bytes_per_tok = bytes_total / n_gen */
    double pred_per_tok, loaded_per_tok, reused_per_tok;
    uint64_t bytes_total;                       /* bytes read over the n_gen decoding tokens */
    uint64_t peak_rss, budget, model_bytes, cache_rows;
    uint32_t res_layers, n_layers, window;
    /* the model (flm_get_info) */
    char arch[16], kernels[16];
    uint32_t d_model, d_ffn, n_heads, n_kv_heads, head_dim, n_vocab, n_ctx_train, n_ctx;
    double norm_eps, rope_theta;
    /* speculative runs (MODE+self, MODE+ngram): generated tokens over wall time, not per-token records */
    int spec;                 /* 1: a speculative run */
    double gen_ms;            /* wall ms for the n_gen + 1 generated tokens */
    double tok_per_pass, accept_rate, draft_ms_tok, verify_ms_tok;
    /* ms per token the draft evaluated (flm_spec_stats.draft_ms / draft_tokens: a tree's level evaluates its
     * nodes in one pass, so a node costs less than the level) and those tokens per generated token; 0 without */
    double draft_ms_each, draft_per_tok;
    /* the reader's busy share (flm_stats.io_busy_ms): of the generation's wall time wall_ms (every generated token,
     * the first included), the busy_ms during which a read was in flight */
    double wall_ms, busy_ms, busy_share;
    int n_series;      /* per-token records: every generated token, the first included (<= BENCH_MAX_SERIES) */
    bench_tok *series; /* parent side only (the child's pointer value is meaningless) */
} bench_result;

/* One run: a mode with its parameters, under a label ("naive", "sparse-nobundle", "sparse k=4"). */
typedef struct bench_run {
    char label[80];
    flm_mode mode;
    flm_params params;
    int spec;        /* 0: plain decoding; 1: +self (flm_eval_draft); 2: +ngram */
    int tree;        /* +tree: the self-draft's tree of at most this many nodes (0: a chain) */
    int n_draft;     /* tokens proposed per step */
} bench_run;

typedef struct bench_opts {
    const char *model, *text, *json, *svg, *mem, *modes;
    bool force; /* --force: replace existing --json and --svg files */
    int prompt_tokens, gen_tokens;
    flm_params params;
    uint64_t mem_bytes;
    double mem_pct;
    int n_sweep_mem, n_sweep_win;
    bool mem_list; /* --mem B1,B2,...: the budget table (its budgets in sweep_mem) */
    char sweep_mem[BENCH_MAX_SWEEP][32]; /* budgets as given */
    uint64_t sweep_bytes[BENCH_MAX_SWEEP]; /* the same in bytes (flm_plan_budget_bytes) */
    uint64_t weight_bytes;                 /* the model's weights: what N% budgets are a share of */
    int sweep_win[BENCH_MAX_SWEEP];
    int argc;
    char **argv;
} bench_opts;

/* s_agg(k) from the calibration (the .flm's predictor region), neurons summed over layers. */
typedef struct calib_agg {
    int ok;
    uint32_t n_layers, d_ffn;
    double s_agg[FLM_CALIB_AGG_K]; /* k = 1 .. FLM_CALIB_AGG_K */
} calib_agg;

/* ---- statistics -------------------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(double *v, int n, double q) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double idx = q * (n - 1);
    int i = (int)idx;
    double f = idx - i;
    return i + 1 < n ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

static double tok_total(const bench_tok *t) { return t->io_ms + t->mem_ms + t->cmp_ms; }

static int cmp_tok_total(const void *a, const void *b, void *toks) {
    const bench_tok *t = toks;
    double x = tok_total(&t[*(const int *)a]), y = tok_total(&t[*(const int *)b]);
    return x < y ? -1 : x > y;
}

/* Summary statistics over the decoding tokens t[0..m) (the first token after the prompt excluded by the caller). */
static void summarize(const bench_tok *t, int m, bench_result *r) {
    r->n_gen = m;
    if (m <= 0) return;
    double io = 0, mem = 0, cmp = 0, pred = 0, load = 0, reuse = 0, reads = 0;
    uint64_t bytes = 0;
    double *tot = malloc((size_t)m * sizeof *tot);
    int *idx = malloc((size_t)m * sizeof *idx);
    for (int i = 0; i < m; i++) {
        io += t[i].io_ms; mem += t[i].mem_ms; cmp += t[i].cmp_ms;
        bytes += t[i].bytes; reads += (double)t[i].reads;
        pred += (double)t[i].predicted; load += (double)t[i].loaded; reuse += (double)t[i].reused;
        tot[i] = tok_total(&t[i]);
        idx[i] = i;
    }
    r->io_mean = io / m; r->mem_mean = mem / m; r->cmp_mean = cmp / m;
    r->tot_mean = r->io_mean + r->mem_mean + r->cmp_mean;
    r->bytes_total = bytes;
    r->bytes_per_tok = (double)bytes / m;
    r->reads_per_tok = reads / m;
    r->pred_per_tok = pred / m; r->loaded_per_tok = load / m; r->reused_per_tok = reuse / m;
    r->gbps = io > 0 ? (double)bytes / (io * 1e6) : 0;
    r->tot_p10 = quantile(tot, m, 0.1);
    r->tot_p90 = quantile(tot, m, 0.9);
    /* the median token(s), so that the split adds up to the median total */
    qsort_r(idx, (size_t)m, sizeof *idx, cmp_tok_total, (void *)t);
    const bench_tok *a = &t[idx[(m - 1) / 2]], *b = &t[idx[m / 2]];
    r->io_med = (a->io_ms + b->io_ms) / 2;
    r->mem_med = (a->mem_ms + b->mem_ms) / 2;
    r->cmp_med = (a->cmp_ms + b->cmp_ms) / 2;
    r->tot_med = r->io_med + r->mem_med + r->cmp_med;
    free(tot);
    free(idx);
}

/* The parameters a run opens its model with: a speculative row's buffers are held inside the budget, as `flashlm run`
 * holds them (flm_plan_split: the target gets the rest; mode auto's self-draft is the plan's own). Returns 0, or 1
 * after printing why the budget cannot hold them. */
static int run_params(const bench_opts *o, const bench_run *run, flm_params *p) {
    *p = run->params;
    p->mode = run->mode;
    cli_env_params(p, o->model);
    if (!run->spec) return 0;
    cli_spec_session ss;
    memset(&ss, 0, sizeof ss);
    cli_spec_args_default(&ss.a);
    ss.a.self_draft = run->spec == 1;
    ss.a.ngram = run->spec == 2;
    ss.a.tree = run->tree;
    ss.a.n_draft = run->n_draft;
    ss.a.greedy = true; /* bench samples greedily */
    ss.a.draft_window = p->draft_window;
    return cli_spec_open_draft(&ss, o->model, p, false);
}

/* The run's memory plan on stderr, one line (flm_plan: what flm_open will carry out; a refusal is the run's to
 * report). */
static void print_plan(const bench_opts *o, const bench_run *run) {
    flm_params p;
    if (run_params(o, run, &p)) return;
    p.log = NULL;
    flm_plan_info plan;
    flm_error err;
    if (!flm_plan(o->model, &p, &plan, &err)) cli_print_plan_line(run->label, &plan);
}

/* ---- one run, in a child process --------------------------------------------------------------------------- */

/* What a run's context says of itself once it is done (mode, reader, memory, layers); marks r done. */
static void context_result(const flm_stats *s, bench_result *r) {
    snprintf(r->mode, sizeof r->mode, "%s", s->mode);
    snprintf(r->backend, sizeof r->backend, "%s", s->io_backend);
    r->direct = s->direct_io;
    r->peak_rss = s->peak_rss;
    r->budget = s->mem_budget;
    r->model_bytes = s->model_bytes;
    r->res_layers = s->n_ffn_resident_layers;
    r->n_layers = s->n_layers;
    r->window = s->window;
    r->cache_rows = s->cache_rows;
    r->ok = 1;
}

/* --text FILE, before any run: a text the prompt can come from (the first 64 KiB a run reads of it hold text). A
 * folder, /dev/zero or an empty file ran every mode on random ids, exit 0. false after saying why. */
static bool text_ok(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "flashlm: --text %s: cannot open it: %s\n", path, strerror(errno));
        return false;
    }
    struct stat st;
    char buf[1 << 16];
    size_t n = fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode) ? 0 : fread(buf, 1, sizeof buf - 1, f);
    const char *why = S_ISDIR(st.st_mode) ? "it is a directory"
                      : ferror(f)         ? strerror(errno)
                      : n == 0            ? "it is empty"
                      : memchr(buf, 0, n) ? "a NUL byte in its first 64 KiB: not a text file"
                                          : NULL;
    fclose(f);
    if (why) fprintf(stderr, "flashlm: --text %s: %s\n", path, why);
    return !why;
}

static void run_mode(const bench_opts *o, const bench_run *run, bench_result *r, bench_tok **series) {
    memset(r, 0, sizeof *r);
    *series = NULL;
    flm_ctx *ctx = NULL;
    flm_error err;
    flm_params p;
    if (run_params(o, run, &p)) {
        snprintf(r->err, sizeof r->err, "the budget cannot hold the speculative decoding buffers beside the model");
        return;
    }
    if (flm_open(o->model, &p, &ctx, &err)) {
        snprintf(r->err, sizeof r->err, "%s", err.msg);
        return;
    }
    if (cli_after_open(ctx)) {
        snprintf(r->err, sizeof r->err, "the context cannot be used (see above)");
        flm_close(ctx);
        return;
    }
    bench_run eff = *run; /* auto runs as `flashlm run` would: the plan's self-draft (flm_session_create applies it) */
    flm_plan_info plan;
    flm_get_plan(ctx, &plan);
    if (run->mode == FLM_MODE_AUTO && !run->spec && plan.self_draft) {
        eff.spec = 1;
        eff.n_draft = plan.draft_depth;
        eff.tree = plan.draft_tree;
    }
    run = &eff;
    flm_model_info info;
    flm_get_info(ctx, &info);
    snprintf(r->arch, sizeof r->arch, "%s", info.arch ? info.arch : "");
    snprintf(r->kernels, sizeof r->kernels, "%s", info.kernels ? info.kernels : "");
    r->d_model = info.d_model; r->d_ffn = info.d_ffn; r->n_heads = info.n_heads; r->n_kv_heads = info.n_kv_heads;
    r->head_dim = info.head_dim; r->n_vocab = info.n_vocab; r->n_ctx_train = info.n_ctx_train; r->n_ctx = info.n_ctx;
    r->norm_eps = info.norm_eps; r->rope_theta = info.rope_theta;
    int n_prompt = o->prompt_tokens, n_gen = o->gen_tokens;
    if ((uint32_t)(n_prompt + n_gen) > info.n_ctx) {
        snprintf(r->err, sizeof r->err, "prompt + generated tokens (%d) exceed the context (%u): raise -c",
                 n_prompt + n_gen, info.n_ctx);
        flm_close(ctx);
        return;
    }
    int32_t *ids = calloc((size_t)n_prompt + 1, sizeof *ids);
    if (!ids) {
        snprintf(r->err, sizeof r->err, "out of memory");
        flm_close(ctx);
        return;
    }
    ids[0] = info.bos >= 0 ? info.bos : 1;
    int have = 1;
    if (o->text) { /* prompt from the text file (checked by cmd_bench: readable text): its first tokens */
        FILE *f = fopen(o->text, "rb");
        char *buf = f ? calloc(1, 1 << 16) : NULL;
        size_t n = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0, got = 0;
        if (f) fclose(f);
        int32_t *tmp = buf ? flm_tokenize_all(ctx, buf, true, &got) : NULL;
        free(buf);
        if (tmp) {
            have = (int)(got < (size_t)n_prompt ? got : (size_t)n_prompt);
            memcpy(ids, tmp, (size_t)have * sizeof *ids);
            free(tmp);
        }
        if (have < n_prompt) { /* the rest was random ids without a word: a prompt that is not the text */
            snprintf(r->err, sizeof r->err, "--text %s: its first %zu bytes give %d tokens, fewer than --prompt-tokens "
                     "%d", o->text, n, have, n_prompt);
            free(ids);
            flm_close(ctx);
            return;
        }
    }
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int i = have; i < n_prompt; i++) { /* deterministic filler when there is no (or too little) text */
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        ids[i] = 3 + (int32_t)(rng % (info.n_vocab > 4 ? info.n_vocab - 3 : 1));
    }
    flm_sampler_params sp;
    flm_sampler_params_default(&sp);
    sp.temp = 0;
    flm_sampler *smp = flm_sampler_create(&sp, info.n_vocab);
    const float *logits = NULL;
    double t0 = cli_now_ms();
    int pos = n_prompt;
    flm_eval_out out = {0}; /* every evaluation's own statistics (flm_evaluate) */
    if (n_prompt > 0) {
        const flm_eval_args a = {.tokens = ids, .n = (uint32_t)n_prompt};
        if (flm_evaluate(ctx, &a, &out, &err)) goto fail;
        logits = out.logits;
    }
    r->prompt_ms = cli_now_ms() - t0;
    r->prompt_bytes = out.stats.total.bytes_read;
    r->n_batch = (int)plan.n_batch;
    double w0 = cli_now_ms(); /* before the reset: the busy time counted from it lies within the wall time */
    flm_reset_stats(ctx); /* flm_stats.io_busy_ms: the reader's busy time over the generation's wall time (reads ahead
                             between the calls included: each call's own figures are summed below) */
    if (run->spec) { /* speculative: the whole generation timed; the target's statistics summed */
        flm_session *sess = NULL;
        flm_spec_params so;
        flm_spec_params_default(&so);
        so.n_draft = run->n_draft;
        so.ngram = run->spec == 2;
        so.self_draft = so.adaptive = run->spec == 1;
        so.tree = run->tree;
        if (flm_session_create(ctx, &sess, &err)) goto fail;
        /* the prompt again, through the session (its history must hold it; the prompt was timed above) */
        flm_status fst = flm_session_speculate(sess, &so, NULL, &err);
        if (!fst) fst = flm_session_feed(sess, ids, (size_t)n_prompt, &err);
        if (fst) { flm_session_free(sess); goto fail; }
        flm_gen_params gp;
        flm_gen_params_default(&gp);
        gp.max_tokens = n_gen + 1;
        flm_gen_result res;
        double g0 = cli_now_ms();
        fst = flm_session_generate(sess, &gp, NULL, NULL, &res, &err);
        r->gen_ms = cli_now_ms() - g0;
        flm_spec_stats ss;
        flm_session_spec_stats(sess, &ss);
        flm_session_stats sst; /* the generation's evaluations: their own statistics summed by the session */
        flm_session_get_stats(sess, &sst);
        flm_session_free(sess);
        if (fst) goto fail;
        const flm_token_stats *gt = &sst.gen;
        const double g = res.n_gen > 0 ? (double)res.n_gen : 1.0;
        r->spec = 1;
        r->n_prompt = n_prompt;
        r->n_gen = (int)res.n_gen;
        r->tot_med = r->tot_mean = r->gen_ms / g;
        r->tot_p10 = r->tot_p90 = r->tot_med;
        r->io_med = r->io_mean = gt->io_ms / g;
        r->mem_med = r->mem_mean = gt->mem_ms / g;
        r->cmp_med = r->cmp_mean = r->tot_med - r->io_med - r->mem_med;
        r->bytes_total = gt->bytes_read;
        r->bytes_per_tok = (double)gt->bytes_read / g;
        r->reads_per_tok = (double)gt->n_reads / g;
        r->gbps = gt->io_ms > 0 ? (double)gt->bytes_read / (gt->io_ms * 1e6) : 0;
        r->tok_per_pass = ss.n_passes ? (double)ss.n_gen / (double)ss.n_passes : 0;
        r->accept_rate = ss.n_drafted ? (double)ss.n_accepted / (double)ss.n_drafted : 0;
        r->draft_ms_tok = ss.draft_ms / g;
        r->verify_ms_tok = (r->gen_ms - ss.draft_ms - ss.draft_select_ms) / g;
        r->draft_ms_each = ss.draft_tokens ? ss.draft_ms / (double)ss.draft_tokens : 0;
        r->draft_per_tok = (double)ss.draft_tokens / g;
        r->wall_ms = res.ms;
        r->busy_ms = res.io_busy_ms;
        r->busy_share = res.ms > 0 ? res.io_busy_ms / res.ms : 0;
        flm_stats s;
        flm_get_stats(ctx, &s);
        context_result(&s, r);
        flm_sampler_free(smp);
        free(ids);
        flm_close(ctx);
        return;
    }
    bench_tok *t = calloc((size_t)(n_gen > 0 ? n_gen : 1), sizeof *t);
    if (!t) {
        snprintf(err.msg, sizeof err.msg, "out of memory");
        goto fail;
    }
    int32_t tok = flm_sampler_sample(smp, logits);
    int got = 0;
    for (; got < n_gen; got++, pos++) { /* each token's own statistics, from its call */
        const flm_eval_args a = {.tokens = &tok, .n = 1, .pos = pos};
        if (flm_evaluate(ctx, &a, &out, &err)) {
            free(t);
            goto fail;
        }
        const flm_token_stats *s = &out.stats.total;
        t[got] = (bench_tok){s->io_ms, s->mem_ms, s->compute_ms, s->bytes_read, s->n_reads, s->n_predicted,
                             s->n_loaded, s->n_reused};
        tok = flm_sampler_sample(smp, out.logits);
    }
    flm_stats gs;
    flm_get_stats(ctx, &gs); /* before the wall time ends: busy <= wall */
    r->wall_ms = cli_now_ms() - w0;
    r->busy_ms = gs.io_busy_ms;
    r->busy_share = r->wall_ms > 0 ? r->busy_ms / r->wall_ms : 0;
    r->n_prompt = n_prompt;
    r->tok_per_pass = 1;
    r->first_ms = got > 0 ? tok_total(&t[0]) : 0;
    summarize(t + 1, got > 1 ? got - 1 : 0, r);
    r->n_series = got < BENCH_MAX_SERIES ? got : BENCH_MAX_SERIES;
    *series = t;
    flm_stats s;
    flm_get_stats(ctx, &s);
    context_result(&s, r);
    flm_sampler_free(smp);
    free(ids);
    flm_close(ctx);
    return;
fail:
    snprintf(r->err, sizeof r->err, "%s", err.msg);
    flm_sampler_free(smp);
    free(ids);
    flm_close(ctx);
}

static bool write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        len -= (size_t)w;
    }
    return true;
}

/* Run fn(arg, fd) in a child process; return everything it wrote to fd (malloc'd, *len bytes), NULL when the child
 * could not be started. *status gets its wait status. */
typedef void (*child_fn)(const void *arg, int fd);
static unsigned char *in_child(child_fn fn, const void *arg, size_t *len, int *status) {
    int fd[2];
    *len = 0;
    *status = 0;
    if (pipe(fd) != 0) return NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) { close(fd[0]); close(fd[1]); return NULL; }
    if (pid == 0) {
        close(fd[0]);
        fn(arg, fd[1]);
        _exit(0);
    }
    close(fd[1]);
    size_t cap = 1 << 16;
    unsigned char *buf = malloc(cap);
    while (buf) {
        if (*len == cap) {
            unsigned char *more = realloc(buf, cap *= 2);
            if (!more) { free(buf); buf = NULL; break; }
            buf = more;
        }
        ssize_t n = read(fd[0], buf + *len, cap - *len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        *len += (size_t)n;
    }
    close(fd[0]);
    waitpid(pid, status, 0);
    return buf;
}

typedef struct run_arg { const bench_opts *o; const bench_run *run; } run_arg;

static void run_child(const void *arg, int fd) {
    const run_arg *a = arg;
    bench_result r;
    bench_tok *series;
    run_mode(a->o, a->run, &r, &series);
    if (!write_all(fd, &r, sizeof r) || !write_all(fd, series, (size_t)r.n_series * sizeof *series)) _exit(1);
    free(series);
}

static void run_one(const bench_opts *o, const bench_run *run, bench_result *r) {
    fprintf(stderr, "flashlm bench: %s ...\n", run->label);
    run_arg a = {o, run};
    size_t len;
    int status;
    unsigned char *buf = in_child(run_child, &a, &len, &status);
    memset(r, 0, sizeof *r);
    if (buf && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        if (WIFSIGNALED(status))
            snprintf(r->err, sizeof r->err, "the benchmark process was killed by signal %d (%s)", WTERMSIG(status),
                     strsignal(WTERMSIG(status)));
        else
            snprintf(r->err, sizeof r->err, "the benchmark process failed (exit status %d)", WEXITSTATUS(status));
    } else if (buf && len >= sizeof *r) {
        memcpy(r, buf, sizeof *r);
        r->series = NULL;
        if (r->n_series < 0 || r->n_series > BENCH_MAX_SERIES ||
            len != sizeof *r + (size_t)r->n_series * sizeof *r->series) {
            memset(r, 0, sizeof *r);
            snprintf(r->err, sizeof r->err, "the benchmark process sent %zu bytes, a malformed result", len);
        } else if (r->n_series > 0) {
            r->series = malloc((size_t)r->n_series * sizeof *r->series);
            if (r->series) memcpy(r->series, buf + sizeof *r, (size_t)r->n_series * sizeof *r->series);
            else r->n_series = 0;
        }
    } else if (buf) {
        snprintf(r->err, sizeof r->err, "the benchmark process sent %zu bytes, a malformed result", len);
    } else {
        snprintf(r->err, sizeof r->err, "cannot start a process: %s", strerror(errno));
    }
    free(buf);
    if (!r->ok) fprintf(stderr, "flashlm bench: %s skipped: %s\n", run->label, r->err);
}

/* The calibration's s_agg(k), read in a child too: opening the .flm loads its resident region, which must not count
 * in the parent's (and so the later children's) peak RSS. */
static void calib_child(const void *arg, int fd) {
    const char *path = arg;
    calib_agg c = {0};
    flm_error err;
    flm_calib_report rep;
    if (flm_calib_read(path, &rep, &err) == FLM_OK && rep.n_layers > 0) {
        c.ok = 1;
        c.n_layers = rep.n_layers;
        c.d_ffn = rep.layers[0].d_ffn;
        for (uint32_t l = 0; l < rep.n_layers; l++)
            for (int k = 0; k < FLM_CALIB_AGG_K; k++)
                c.s_agg[k] += (double)rep.layers[l].s_agg[k] * rep.layers[l].d_ffn;
    }
    flm_calib_report_free(&rep);
    write_all(fd, &c, sizeof c);
}

static calib_agg read_calibration(const char *model) {
    calib_agg c = {0};
    size_t len;
    int status;
    unsigned char *buf = in_child(calib_child, model, &len, &status);
    if (buf && len == sizeof c) memcpy(&c, buf, sizeof c);
    free(buf);
    return c;
}

/* ---- options ----------------------------------------------------------------------------------------------- */

/* A --modes entry: a mode, or one of the ablation rows of the paper's Table 1 (sparse with one part taken away). */
static bool parse_mode_spec(const char *name, const bench_opts *o, bench_run *run) {
    memset(run, 0, sizeof *run);
    snprintf(run->label, sizeof run->label, "%s", name);
    run->params = o->params;
    char stem[80];
    const char *wsuf = strstr(name, "/w");
    float wshare = -1;
    if (wsuf) { /* MODE/wSHARE: the self-draft's window share (flm_params.draft_window) */
        if (!cli_parse_float(wsuf + 2, 0.0f, 0.9f, &wshare)) return false;
        snprintf(stem, sizeof stem, "%.*s", (int)(wsuf - name) < 79 ? (int)(wsuf - name) : 79, name);
        name = stem;
    }
    size_t nl = strlen(name);
    if (nl > 9 && !strcmp(name + nl - 9, "-noverify")) { /* MODE-noverify: reads not checked (--no-verify-reads) */
        snprintf(stem, sizeof stem, "%.*s", (int)(nl - 9) < 79 ? (int)(nl - 9) : 79, name);
        name = stem;
        run->params.no_verify_reads = true;
    }
    if (!strcmp(name, "predictor-only") || !strcmp(name, "sparse-nowindow")) {
        run->mode = FLM_MODE_SPARSE; run->params.no_window = true; run->params.no_bundle = true;
    } else if (!strcmp(name, "sparse-nobundle")) {
        run->mode = FLM_MODE_SPARSE; run->params.no_bundle = true;
    } else if (!strcmp(name, "naive-noahead") || !strcmp(name, "hybrid-noahead") || !strcmp(name, "sparse-noahead")) {
        run->mode = name[0] == 'n' ? FLM_MODE_NAIVE : name[0] == 'h' ? FLM_MODE_HYBRID : FLM_MODE_SPARSE;
        run->params.no_read_ahead = true;
    } else if (!strcmp(name, "sparse-oracle")) {
        run->mode = FLM_MODE_SPARSE; run->params.no_predictor = true;
    } else if (strstr(name, "+tree")) { /* MODE+tree[N][dD]: a self-draft tree of N nodes (default 24), depth D (8) */
        const char *plus = strchr(name, '+');
        char base[64];
        snprintf(base, sizeof base, "%.*s", (int)(plus - name) < 63 ? (int)(plus - name) : 63, name);
        if (!flm_mode_parse(base, &run->mode)) return false;
        run->spec = 1;
        char num[32];
        snprintf(num, sizeof num, "%s", plus + 5);
        char *dd = strchr(num, 'd');
        long nodes = 24, depth = 8;
        if (dd) {
            *dd = 0;
            if (!cli_parse_long(dd + 1, 1, CLI_SPEC_DRAFT_MAX, &depth)) return false;
        }
        if (*num && !cli_parse_long(num, 2, CLI_SPEC_DRAFT_MAX, &nodes)) return false;
        run->tree = (int)nodes;
        run->n_draft = (int)depth;
    } else if (strstr(name, "+self") || strstr(name, "+ngram")) { /* MODE+self[N], MODE+ngram[N] */
        const char *plus = strchr(name, '+');
        char base[64];
        snprintf(base, sizeof base, "%.*s", (int)(plus - name) < 63 ? (int)(plus - name) : 63, name);
        if (!flm_mode_parse(base, &run->mode)) return false;
        run->spec = !strncmp(plus, "+self", 5) ? 1 : 2;
        const char *num = plus + (run->spec == 1 ? 5 : 6);
        long nd = 4;
        if (*num && !cli_parse_long(num, 1, CLI_SPEC_DRAFT_MAX, &nd)) return false;
        run->n_draft = (int)nd;
    } else {
        char base[64];
        const char *at = strstr(name, "@b");
        snprintf(base, sizeof base, "%.*s", at ? (int)(at - name) : 63, name);
        if (!flm_mode_parse(base, &run->mode)) return false;
        if (at) { /* MODE@bN: the prompt in batches of N tokens (@b1: token by token) */
            long b;
            if (!cli_parse_long(at + 2, 1, 65536, &b)) return false;
            run->params.n_batch = (int)b;
            snprintf(run->label, sizeof run->label, "%s b=%ld", base, b);
        }
    }
    /* the draft window only where a self-draft runs (+self, and auto, which self-drafts when it runs hot): it costs
     * reads */
    if (run->spec == 1)
        run->params.draft_window = wshare >= 0 ? wshare : CLI_DRAFT_WINDOW_DEFAULT;
    else if (run->mode == FLM_MODE_AUTO && wshare >= 0) /* auto: the plan's default unless asked (0: none) */
        run->params.draft_window = wshare > 0 ? wshare : -1;
    else if (wshare >= 0) return false;
    if (run->spec) run->params.no_draft = true; /* a draft source of its own: auto holds no self-draft besides */
    return true;
}

/* Parse "--modes" into runs; false (after a message) on an unknown or empty entry. */
static bool parse_modes(const char *list, const bench_opts *o, bench_run *runs, int *n) {
    char buf[512];
    *n = 0;
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == BENCH_MAX_MODES) { cli_die("--modes: at most %s modes", "16"); return false; }
        if (!parse_mode_spec(tok, o, &runs[*n])) { cli_die("unknown mode '%s' in --modes", tok); return false; }
        (*n)++;
    }
    if (*n == 0) { cli_die("--modes '%s' names no mode", list); return false; }
    return true;
}

/* Parsing --mem B1,B2,... (through parse_sweep, as "mem=B1,B2,..."): errors name --mem and the list. */
static bool g_parsing_mem_list;

/* Print "flashlm: bad --sweep 'spec': why" (or "bad --mem 'list': why") and return 2. */
static int sweep_error(const char *spec, const char *why) {
    char msg[512];
    if (g_parsing_mem_list) snprintf(msg, sizeof msg, "bad --mem '%.200s': %.280s", spec + 4, why);
    else snprintf(msg, sizeof msg, "bad --sweep '%.200s': %.280s", spec, why);
    return cli_die("%s", msg);
}

/* --sweep mem=V1,V2,... | window=K1,K2,...: returns 0, or 2 after an error message. */
static int parse_sweep(const char *spec, bench_opts *o) {
    const char *eq = strchr(spec, '=');
    if (!eq) return sweep_error(spec, "expected mem=BUDGET,BUDGET,... or window=K,K,...");
    size_t klen = (size_t)(eq - spec);
    bool mem = klen == 3 && !strncmp(spec, "mem", 3), win = klen == 6 && !strncmp(spec, "window", 6);
    if (!mem && !win) return sweep_error(spec, "unknown sweep (known: mem, window)");
    if ((mem && o->n_sweep_mem) || (win && o->n_sweep_win)) return sweep_error(spec, "this sweep is given twice");
    const char *v = eq + 1;
    if (!*v) return sweep_error(spec, "no values");
    int n = 0;
    for (;;) {
        const char *c = strchr(v, ',');
        size_t len = c ? (size_t)(c - v) : strlen(v);
        char item[sizeof o->sweep_mem[0]], why[160];
        if (len == 0) return sweep_error(spec, "an empty value (two commas, or a comma at an end)");
        if (len >= sizeof item) return sweep_error(spec, "a value is too long");
        if (n == BENCH_MAX_SWEEP) return sweep_error(spec, "more than 32 values");
        memcpy(item, v, len);
        item[len] = 0;
        if (mem) {
            uint64_t b;
            double pct;
            if (!flm_parse_mem(item, &b, &pct) || (b == 0 && pct <= 0)) {
                snprintf(why, sizeof why, "budget '%s' is not bytes (K/M/G suffixes) or N%% above 0", item);
                return sweep_error(spec, why);
            }
            snprintf(o->sweep_mem[n], sizeof o->sweep_mem[n], "%s", item);
        } else {
            long k;
            if (!cli_parse_long(item, 1, 4096, &k)) {
                snprintf(why, sizeof why, "window '%s' is not a whole number of tokens in 1..4096", item);
                return sweep_error(spec, why);
            }
            o->sweep_win[n] = (int)k;
        }
        n++;
        if (!c) break;
        v = c + 1;
    }
    if (mem) o->n_sweep_mem = n; else o->n_sweep_win = n;
    return 0;
}

/* ---- output: tables ---------------------------------------------------------------------------------------- */

static void print_main_tables(const bench_opts *o, const bench_run *runs, const bench_result *res, int n) {
    const bench_result *naive = NULL, *ram = NULL;
    for (int i = 0; i < n; i++) {
        if (res[i].ok && !strcmp(runs[i].label, "naive")) naive = &res[i];
        if (res[i].ok && !strcmp(runs[i].label, "ram")) ram = &res[i];
    }
    printf("\n%s: %d prompt tokens, %d generated; the median decoding token after the first, split into its parts "
           "(p10-p90 of total)\n\n", o->model, o->prompt_tokens, o->gen_tokens);
    printf("| mode | flash I/O ms | memory ms | compute ms | total ms/token | p10-p90 ms | tokens/s | first token ms "
           "| vs naive | vs ram |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const bench_result *r = &res[i];
        if (!r->ok) { printf("| %s | skipped: %s |||||||||\n", runs[i].label, r->err); continue; }
        char vs[2][32] = {"n/a", "n/a"}; /* speed-ups against naive and ram, when they ran */
        if (naive && r->tot_med > 0) snprintf(vs[0], sizeof vs[0], "%.2fx", naive->tot_med / r->tot_med);
        if (ram && r->tot_med > 0) snprintf(vs[1], sizeof vs[1], "%.2fx", ram->tot_med / r->tot_med);
        printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f-%.2f | %.2f | %.2f | %s | %s |\n", runs[i].label, r->io_med,
               r->mem_med, r->cmp_med, r->tot_med, r->tot_p10, r->tot_p90, r->tot_med > 0 ? 1e3 / r->tot_med : 0,
               r->first_ms, vs[0], vs[1]);
    }
    /* the prompt (prefill): its time is the time to first token */
    printf("\n| mode | batch (-b) | prompt tokens | time to first token ms | prompt tokens/s | MiB read for the prompt "
           "| vs token by token |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const bench_result *r = &res[i];
        if (!r->ok) continue;
        const bench_result *one = NULL; /* the same mode, token by token, in this run */
        for (int j = 0; j < n; j++)
            if (res[j].ok && res[j].n_batch == 1 && !strcmp(res[j].mode, r->mode)) one = &res[j];
        char vs[32] = "n/a";
        if (one && r->prompt_ms > 0) snprintf(vs, sizeof vs, "%.2fx", one->prompt_ms / r->prompt_ms);
        printf("| %s | %d | %d | %.1f | %.2f | %.1f | %s |\n", runs[i].label, r->n_batch, r->n_prompt, r->prompt_ms,
               r->prompt_ms > 0 ? r->n_prompt * 1e3 / r->prompt_ms : 0, cli_mib(r->prompt_bytes), vs);
    }
    bool any_spec = false;
    for (int i = 0; i < n; i++) any_spec |= res[i].ok && res[i].spec;
    if (any_spec) {
        const bench_result *hyb = NULL, *ram = NULL;
        for (int i = 0; i < n; i++) {
            if (res[i].ok && !strcmp(runs[i].label, "hybrid")) hyb = &res[i];
            if (res[i].ok && !strcmp(runs[i].label, "ram")) ram = &res[i];
        }
        printf("\n(speculative rows: the mean over the generated tokens of the whole generation's wall time, drafting "
               "included; greedy output equals plain decoding's; ms per drafted token: drafting's ms over the tokens "
               "the draft evaluated, a tree level's nodes in one pass, and its share of ram's ms/token)\n\n| mode | "
               "tokens/s | vs hybrid | tokens per target pass | drafts accepted | MiB read per token | draft ms/token "
               "| verify ms/token | drafted tokens per token | ms per drafted token | peak RSS MiB |\n"
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for (int i = 0; i < n; i++) {
            const bench_result *r = &res[i];
            if (!r->ok) continue;
            char vs[32] = "n/a";
            if (hyb && r->tot_med > 0) snprintf(vs, sizeof vs, "%.2fx", hyb->tot_med / r->tot_med);
            char each[48] = "–";
            if (r->spec && r->draft_ms_each > 0) {
                if (ram && ram->tot_med > 0)
                    snprintf(each, sizeof each, "%.2f (%.0f%% of ram's)", r->draft_ms_each,
                             100 * r->draft_ms_each / ram->tot_med);
                else
                    snprintf(each, sizeof each, "%.2f", r->draft_ms_each);
            }
            if (r->spec)
                printf("| %s | %.2f | %s | %.2f | %.1f%% | %.2f | %.2f | %.2f | %.2f | %s | %.1f |\n", runs[i].label,
                       1e3 / r->tot_med, vs, r->tok_per_pass, 100 * r->accept_rate, cli_mib((uint64_t)r->bytes_per_tok),
                       r->draft_ms_tok, r->verify_ms_tok, r->draft_per_tok, each, cli_mib(r->peak_rss));
            else
                printf("| %s | %.2f | %s | 1.00 | – | %.2f | – | %.2f | – | – | %.1f |\n", runs[i].label,
                       1e3 / r->tot_med, vs, cli_mib((uint64_t)r->bytes_per_tok), r->tot_med, cli_mib(r->peak_rss));
        }
    }
    printf("\n(reader busy: the share of the generation's wall time during which a read was in flight)\n\n"
           "| mode | bytes read/token | reads/token | GB read per s of I/O wait | reader busy | reader | layers resident "
           "| peak RSS MiB | budget MiB |\n|---|---:|---:|---:|---:|---|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const bench_result *r = &res[i];
        if (!r->ok) continue;
        char budget[32] = "none";
        if (r->budget) snprintf(budget, sizeof budget, "%.1f", cli_mib(r->budget));
        printf("| %s | %.0f (%.2f MiB) | %.1f | %.2f | %.1f%% | %s%s | %u/%u | %.1f | %s |\n", runs[i].label,
               r->bytes_per_tok, cli_mib((uint64_t)r->bytes_per_tok), r->reads_per_tok, r->gbps, 100 * r->busy_share,
               r->backend,
               strcmp(r->backend, "none") ? (r->direct ? " O_DIRECT" : " buffered") : "", r->res_layers, r->n_layers,
               cli_mib(r->peak_rss), budget);
    }
}

/* rows: budgets; columns: ms/token of each mode, then MiB read per token of each mode */
static void print_mem_sweep(const bench_opts *o, const bench_run *runs, int nm, const bench_result *res) {
    printf("\nmemory-latency trade-off: median ms/token and MiB read/token per budget\n\n| budget |");
    for (int m = 0; m < nm; m++) printf(" %s ms/token |", runs[m].label);
    for (int m = 0; m < nm; m++) printf(" %s MiB/token |", runs[m].label);
    printf("\n|---|");
    for (int m = 0; m < 2 * nm; m++) printf("---:|");
    printf("\n");
    for (int b = 0; b < o->n_sweep_mem; b++) {
        const bench_result *row = &res[b * nm], *any = NULL;
        for (int m = 0; m < nm; m++) if (row[m].ok && row[m].budget) any = &row[m];
        printf("| %s", o->sweep_mem[b]);
        if (any) printf(" (%s)", cli_size(any->budget).s);
        printf(" |");
        for (int m = 0; m < nm; m++)
            if (row[m].ok) printf(" %.2f |", row[m].tot_med); else printf(" skipped |");
        for (int m = 0; m < nm; m++)
            if (row[m].ok) printf(" %.3f |", cli_mib((uint64_t)row[m].bytes_per_tok)); else printf(" skipped |");
        printf("\n");
    }
}

/* A message fit for a markdown table cell: '|' and line breaks replaced. */
static void cell_text(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src);
    for (char *p = dst; *p; p++)
        if (*p == '|') *p = '/';
        else if (*p == '\n' || *p == '\r') *p = ' ';
}

/* One row of the budget table. */
static void budget_row(const char *budget, const char *label, const bench_result *r, const bench_result *ram) {
    if (!r->ok) {
        char why[sizeof r->err];
        cell_text(why, sizeof why, r->err);
        printf("| %s | %s | refused: %s | | | | | | | |\n", budget, label, why);
        return;
    }
    char vs[32] = "n/a";
    if (ram && ram->tot_med > 0) snprintf(vs, sizeof vs, "%.2fx", r->tot_med / ram->tot_med);
    printf("| %s | %s | %s | %.2f | %s | %.2f | %.2f | %.2f | %.1f%% | %.1f |\n", budget, label, r->mode, r->tot_med, vs,
           r->tok_per_pass, cli_mib((uint64_t)r->bytes_per_tok), r->io_med, 100 * r->busy_share, cli_mib(r->peak_rss));
}

/* --mem B1,B2,...: one row per budget and mode (ram once, without a budget: the reference), a refused run as a row
 * that says why. */
static void print_budget_table(const bench_opts *o, const bench_run *runs, const bench_result *res, int n,
                               const bench_run *mruns, int nm, const bench_result *mres) {
    const bench_result *ram = NULL;
    for (int i = 0; i < n; i++) if (runs[i].mode == FLM_MODE_RAM && res[i].ok) ram = &res[i];
    printf("\n%s: ms/token against the memory budget, %d prompt tokens, %d generated (ms/token: the median decoding "
           "token; a speculative row, auto stored hottest first, the generation's wall time per token; x ram: ms/token "
           "over ram's; reader busy: the share of the generation's wall time during which a read was in flight)\n\n"
           "| budget | mode | ran as | ms/token | x ram | tokens per pass | MiB read per token | flash I/O ms/token "
           "| reader busy | peak RSS MiB |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
           o->model, o->prompt_tokens, o->gen_tokens);
    for (int i = 0; i < n; i++) budget_row("none", runs[i].label, &res[i], ram);
    for (int b = 0; b < o->n_sweep_mem; b++) {
        char budget[sizeof o->sweep_mem[0] + 48]; /* the budget as given (31 bytes at most) and its size */
        snprintf(budget, sizeof budget, "%s (%s)", o->sweep_mem[b], cli_size(o->sweep_bytes[b]).s);
        for (int m = 0; m < nm; m++) budget_row(budget, mruns[m].label, &mres[b * nm + m], ram);
    }
}

static double expected_loaded(const calib_agg *c, int k) { /* s_agg(k+1) - s_agg(k), neurons over all layers */
    return c->ok && k >= 1 && k < FLM_CALIB_AGG_K ? c->s_agg[k] - c->s_agg[k - 1] : NAN;
}

static void print_window_sweep(const bench_opts *o, const bench_result *res, const calib_agg *c) {
    printf("\nsliding window (sparse, --mem %s): per decoding token, neurons summed over layers\n\n"
           "| window k | ms/token | flash I/O ms | bytes read/token | neurons predicted | neurons loaded "
           "| neurons reused | calibration s_agg(k+1)-s_agg(k) |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n", o->mem);
    for (int i = 0; i < o->n_sweep_win; i++) {
        const bench_result *r = &res[i];
        int k = o->sweep_win[i];
        double e = expected_loaded(c, k);
        char exp_s[32] = "n/a";
        if (isfinite(e)) snprintf(exp_s, sizeof exp_s, "%.1f", e);
        if (!r->ok) { printf("| %d | skipped: %s |||||| %s |\n", k, r->err, exp_s); continue; }
        printf("| %d | %.2f | %.2f | %.0f (%.3f MiB) | %.1f | %.1f | %.1f | %s |\n", k, r->tot_med, r->io_med,
               r->bytes_per_tok, cli_mib((uint64_t)r->bytes_per_tok), r->pred_per_tok, r->loaded_per_tok,
               r->reused_per_tok, exp_s);
    }
}

/* ---- output: JSON ------------------------------------------------------------------------------------------ */

/* s escaped for a JSON string, without the quotes */
static void json_chars(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 32) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
}

static void json_str(FILE *f, const char *s) {
    if (!s) { fputs("null", f); return; }
    fputc('"', f);
    json_chars(f, s);
    fputc('"', f);
}

static void json_num(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.9g", x); else fputs("null", f);
}

static void json_series(FILE *f, const char *key, const bench_result *r, int field) {
    fprintf(f, "\"%s\": [", key);
    for (int i = 0; i < r->n_series; i++) {
        const bench_tok *t = &r->series[i];
        if (i) fputc(',', f);
        switch (field) {
        case 0: fprintf(f, "%.6g", tok_total(t)); break;
        case 1: fprintf(f, "%.6g", t->io_ms); break;
        case 2: fprintf(f, "%.6g", t->mem_ms); break;
        case 3: fprintf(f, "%.6g", t->cmp_ms); break;
        case 4: fprintf(f, "%llu", (unsigned long long)t->bytes); break;
        case 5: fprintf(f, "%llu", (unsigned long long)t->reads); break;
        case 6: fprintf(f, "%llu", (unsigned long long)t->predicted); break;
        case 7: fprintf(f, "%llu", (unsigned long long)t->loaded); break;
        default: fprintf(f, "%llu", (unsigned long long)t->reused); break;
        }
    }
    fputc(']', f);
}

static void json_result(FILE *f, const char *label, const bench_result *r, const char *ind) {
    fprintf(f, "{\"requested\": ");
    json_str(f, label);
    fprintf(f, ", \"ok\": %s", r->ok ? "true" : "false");
    if (!r->ok) {
        fprintf(f, ", \"error\": ");
        json_str(f, r->err);
        fputc('}', f);
        return;
    }
    fprintf(f, ", \"mode\": ");
    json_str(f, r->mode);
    fprintf(f, ", \"io_backend\": ");
    json_str(f, r->backend);
    fprintf(f, ", \"direct_io\": %s, \"n_prompt_tokens\": %d, \"n_decode_tokens\": %d,\n%s \"prompt_ms\": ",
            r->direct ? "true" : "false", r->n_prompt, r->n_gen, ind);
    json_num(f, r->prompt_ms);
    fprintf(f, ", \"first_token_ms\": ");
    json_num(f, r->first_ms);
    fprintf(f, ", \"prompt_bytes\": %llu, \"n_batch\": %d", (unsigned long long)r->prompt_bytes, r->n_batch);
    const double med[4] = {r->io_med, r->mem_med, r->cmp_med, r->tot_med};
    const double mean[4] = {r->io_mean, r->mem_mean, r->cmp_mean, r->tot_mean};
    const char *part[4] = {"io_ms", "mem_ms", "compute_ms", "total_ms"};
    for (int w = 0; w < 2; w++) {
        fprintf(f, ", \"%s\": {", w ? "mean" : "median");
        for (int i = 0; i < 4; i++) {
            fprintf(f, "%s\"%s\": ", i ? ", " : "", part[i]);
            json_num(f, (w ? mean : med)[i]);
        }
        fputc('}', f);
    }
    fprintf(f, ",\n%s \"p10_total_ms\": ", ind);
    json_num(f, r->tot_p10);
    fprintf(f, ", \"p90_total_ms\": ");
    json_num(f, r->tot_p90);
    fprintf(f, ", \"bytes_read_total\": %llu, \"bytes_per_token\": ", (unsigned long long)r->bytes_total);
    json_num(f, r->bytes_per_tok);
    fprintf(f, ", \"reads_per_token\": ");
    json_num(f, r->reads_per_tok);
    fprintf(f, ", \"read_gbps\": ");
    json_num(f, r->gbps);
    fprintf(f, ",\n%s \"gen_wall_ms\": ", ind);
    json_num(f, r->wall_ms);
    fprintf(f, ", \"io_busy_ms\": ");
    json_num(f, r->busy_ms);
    fprintf(f, ", \"io_busy_share\": ");
    json_num(f, r->busy_share);
    fprintf(f, ", \"tokens_per_pass\": ");
    json_num(f, r->tok_per_pass);
    fprintf(f, ", \"draft_tokens_per_token\": ");
    json_num(f, r->draft_per_tok);
    fprintf(f, ", \"draft_ms_per_draft_token\": ");
    json_num(f, r->draft_ms_each);
    fprintf(f, ",\n%s \"neurons_predicted_per_token\": ", ind);
    json_num(f, r->pred_per_tok);
    fprintf(f, ", \"neurons_loaded_per_token\": ");
    json_num(f, r->loaded_per_tok);
    fprintf(f, ", \"neurons_reused_per_token\": ");
    json_num(f, r->reused_per_tok);
    fprintf(f, ", \"window\": %u, \"cache_rows\": %llu,\n%s \"peak_rss\": %llu, \"budget\": %llu, "
            "\"model_bytes\": %llu, \"ffn_resident_layers\": %u, \"n_layers\": %u,\n%s \"tokens\": {\"n\": %d, ",
            r->window, (unsigned long long)r->cache_rows, ind, (unsigned long long)r->peak_rss,
            (unsigned long long)r->budget, (unsigned long long)r->model_bytes, r->res_layers, r->n_layers, ind,
            r->n_series);
    const char *keys[9] = {"total_ms", "io_ms", "mem_ms", "compute_ms", "bytes_read", "n_reads", "n_predicted",
                           "n_loaded", "n_reused"};
    for (int k = 0; k < 9; k++) {
        if (k) fprintf(f, ",\n%s   ", ind);
        json_series(f, keys[k], r, k);
    }
    fprintf(f, "}}");
}

/* CPU model from /proc/cpuinfo ("model name", or an ARM "Hardware"/"CPU part" line); "unknown" when absent. */
static void cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon || !(strncmp(line, "model name", 10) == 0 || strncmp(line, "Hardware", 8) == 0 ||
                        strncmp(line, "cpu model", 9) == 0))
            continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        v[strcspn(v, "\n")] = 0;
        snprintf(out, cap, "%s", v);
        break;
    }
    fclose(f);
}

static void json_machine(FILE *f) {
    char cpu[256], kernel[512] = "unknown";
    cpu_model(cpu, sizeof cpu);
    struct utsname u;
    if (uname(&u) == 0) snprintf(kernel, sizeof kernel, "%s %s %s %s", u.sysname, u.release, u.version, u.machine);
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    fprintf(f, "  \"machine\": {\"cpu\": ");
    json_str(f, cpu);
    fprintf(f, ", \"cores\": %ld, \"mem_bytes\": %llu, \"kernel\": ", sysconf(_SC_NPROCESSORS_ONLN),
            pages > 0 && psize > 0 ? (unsigned long long)pages * (unsigned long long)psize : 0ull);
    json_str(f, kernel);
    fprintf(f, "},\n");
}

static void json_model(FILE *f, const bench_opts *o, const bench_result *info) {
    char probe[4096];
    snprintf(probe, sizeof probe, "%s.probe.json", o->model);
    fprintf(f, "  \"model\": {\"path\": ");
    json_str(f, o->model);
    fprintf(f, ", \"disk_probe\": ");
    json_str(f, access(probe, R_OK) == 0 ? probe : NULL);
    if (info) {
        fprintf(f, ", \"arch\": ");
        json_str(f, info->arch);
        fprintf(f, ", \"d_model\": %u, \"d_ffn\": %u, \"n_layers\": %u, \"n_heads\": %u, \"n_kv_heads\": %u, "
                "\"head_dim\": %u, \"n_vocab\": %u, \"n_ctx_train\": %u, \"n_ctx\": %u, \"norm_eps\": ", info->d_model,
                info->d_ffn, info->n_layers, info->n_heads, info->n_kv_heads, info->head_dim, info->n_vocab,
                info->n_ctx_train, info->n_ctx);
        json_num(f, info->norm_eps);
        fprintf(f, ", \"rope_theta\": ");
        json_num(f, info->rope_theta);
        fprintf(f, ", \"model_bytes\": %llu, \"kernels\": ", (unsigned long long)info->model_bytes);
        json_str(f, info->kernels);
    }
    fprintf(f, "},\n");
}

static void json_flags(FILE *f, const bench_opts *o) {
    const flm_params *p = &o->params;
    fprintf(f, "  \"flags\": {\"command\": \"flashlm bench");
    for (int i = 0; i < o->argc; i++) {
        fputc(' ', f);
        json_chars(f, o->argv[i]);
    }
    fprintf(f, "\", \"mem\": ");
    json_str(f, o->mem);
    fprintf(f, ", \"modes\": ");
    json_str(f, o->modes);
    fprintf(f, ", \"prompt_tokens\": %d, \"gen_tokens\": %d, \"threads\": %d, \"ctx\": %d, \"window\": %d, "
            "\"no_window\": %s, \"no_bundle\": %s, \"no_predictor\": %s, \"verify_predictor\": %s, \"io\": \"%s\", "
            "\"io_threads\": %d, \"direct\": %s, \"text\": ", o->prompt_tokens, o->gen_tokens, p->n_threads, p->n_ctx,
            p->window, p->no_window ? "true" : "false", p->no_bundle ? "true" : "false",
            p->no_predictor ? "true" : "false", p->verify_predictor ? "true" : "false",
            p->io == FLM_IO_KIND_URING ? "uring" : p->io == FLM_IO_KIND_THREADS ? "threads" : "auto", p->io_threads,
            p->no_direct ? "false" : "true");
    json_str(f, o->text);
    fprintf(f, ", \"sweep_mem\": [");
    for (int i = 0; i < o->n_sweep_mem; i++) { if (i) fputs(", ", f); json_str(f, o->sweep_mem[i]); }
    fprintf(f, "], \"sweep_window\": [");
    for (int i = 0; i < o->n_sweep_win; i++) fprintf(f, "%s%d", i ? ", " : "", o->sweep_win[i]);
    fprintf(f, "]},\n");
}

static int write_json(const bench_opts *o, const bench_run *runs, const bench_result *res, int n,
                      const bench_run *mruns, int nm, const bench_result *mres, const bench_result *wres,
                      const calib_agg *cal) {
    flm_out *w = NULL; /* the checked writer: a unique temporary renamed onto o->json */
    flm_error err;
    if (flm_out_open(o->json, o->model, o->force ? FLM_OUT_REPLACE : 0u, &w, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        return 1;
    }
    FILE *f = flm_out_stream(w);
    if (!f) { flm_out_abort(w); return cli_die("%s", "out of memory"), 1; }
    const bench_result *info = NULL; /* the model facts: from any run that opened it */
    for (int i = 0; i < n && !info; i++) if (res[i].ok) info = &res[i];
    for (int i = 0; i < o->n_sweep_mem * nm && !info; i++) if (mres[i].ok) info = &mres[i];
    for (int i = 0; i < o->n_sweep_win && !info; i++) if (wres[i].ok) info = &wres[i];
    fprintf(f, "{\n  \"flashlm\": \"%s\",\n", FLM_VERSION_STRING);
    json_machine(f);
    json_model(f, o, info);
    json_flags(f, o);
    fprintf(f, "  \"prompt_tokens\": %d,\n  \"gen_tokens\": %d,\n  \"threads\": %d,\n  \"modes\": [", o->prompt_tokens,
            o->gen_tokens, o->params.n_threads);
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s\n    ", i ? "," : "");
        json_result(f, runs[i].label, &res[i], "    ");
    }
    fprintf(f, "\n  ]");
    if (o->n_sweep_mem) {
        fprintf(f, ",\n  \"sweep_mem\": [");
        for (int b = 0; b < o->n_sweep_mem; b++) {
            fprintf(f, "%s\n    {\"budget\": ", b ? "," : "");
            json_str(f, o->sweep_mem[b]);
            fprintf(f, ", \"budget_bytes\": %llu", (unsigned long long)o->sweep_bytes[b]);
            fprintf(f, ", \"runs\": [");
            for (int m = 0; m < nm; m++) {
                fprintf(f, "%s\n      ", m ? "," : "");
                json_result(f, mruns[m].label, &mres[b * nm + m], "      ");
            }
            fprintf(f, "]}");
        }
        fprintf(f, "\n  ]");
    }
    if (o->n_sweep_win) {
        fprintf(f, ",\n  \"sweep_window\": {\"mem\": ");
        json_str(f, o->mem);
        fprintf(f, ", \"rows\": [");
        for (int i = 0; i < o->n_sweep_win; i++) {
            char label[40];
            snprintf(label, sizeof label, "sparse k=%d", o->sweep_win[i]);
            fprintf(f, "%s\n    {\"window\": %d, \"calibration_loaded_per_token\": ", i ? "," : "", o->sweep_win[i]);
            json_num(f, expected_loaded(cal, o->sweep_win[i]));
            fprintf(f, ", \"run\": ");
            json_result(f, label, &wres[i], "      ");
            fputc('}', f);
        }
        fprintf(f, "\n  ]}");
        if (cal->ok) {
            fprintf(f, ",\n  \"calibration\": {\"n_layers\": %u, \"d_ffn\": %u, \"s_agg_neurons\": [", cal->n_layers,
                    cal->d_ffn);
            for (int k = 0; k < FLM_CALIB_AGG_K; k++) { if (k) fputs(", ", f); json_num(f, cal->s_agg[k]); }
            fprintf(f, "]}");
        }
    }
    fprintf(f, "\n}\n");
    if (flm_out_commit(w, &err)) { fprintf(stderr, "flashlm: %s\n", err.msg); return 1; }
    return 0;
}

/* ---- output: SVG figures ----------------------------------------------------------------------------------- */

/* DIR/name in buf */
static void svg_path(char *buf, size_t cap, const bench_opts *o, const char *name) {
    snprintf(buf, cap, "%s/%s", o->svg, name);
}

/* The lines of one figure, with room for their points. */
typedef struct figure {
    int n;
    svg_line line[BENCH_MAX_MODES];
    double x[BENCH_MAX_MODES][BENCH_MAX_SERIES], y[BENCH_MAX_MODES][BENCH_MAX_SERIES];
} figure;

static int fig_line(figure *f, const char *name, bool dashed, bool markers) {
    int i = f->n++;
    f->line[i] = (svg_line){name, f->x[i], f->y[i], 0, dashed, markers};
    return i;
}

static void fig_point(figure *f, int i, double x, double y) {
    if (f->line[i].n == BENCH_MAX_SERIES) return;
    f->x[i][f->line[i].n] = x;
    f->y[i][f->line[i].n++] = y;
}

static int write_svgs(const bench_opts *o, const bench_run *runs, const bench_result *res, int n,
                      const bench_run *mruns, int nm, const bench_result *mres, const bench_result *wres,
                      const calib_agg *cal) {
    if (mkdir(o->svg, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "flashlm: cannot create %s: %s\n", o->svg, strerror(errno));
        return 1;
    }
    figure *fig = calloc(1, sizeof *fig);
    if (!fig) return cli_die("%s", "out of memory"), 1;
    const char *base = strrchr(o->model, '/') ? strrchr(o->model, '/') + 1 : o->model;
    char title[512], path[4096];
    bool ok = true;
    /* (a) the latency split of each mode's median decoding token */
    const char *cats[BENCH_MAX_MODES], *parts[3] = {"flash I/O", "memory", "compute"};
    double v[3 * BENCH_MAX_MODES];
    int nc = 0;
    for (int i = 0; i < n; i++) {
        if (!res[i].ok) continue;
        cats[nc] = runs[i].label;
        v[3 * nc] = res[i].io_med; v[3 * nc + 1] = res[i].mem_med; v[3 * nc + 2] = res[i].cmp_med;
        nc++;
    }
    snprintf(title, sizeof title, "Per-token latency, median decoding token (%s)", base);
    svg_path(path, sizeof path, o, "latency_breakdown.svg");
    ok = ok && svg_stacked_bars(path, title, "ms per token", cats, nc, parts, 3, v);
    /* (d) each generated token's latency: warm-up and noise */
    fig->n = 0;
    for (int i = 0; i < n; i++) {
        if (!res[i].ok) continue;
        int l = fig_line(fig, runs[i].label, false, false);
        for (int t = 0; t < res[i].n_series; t++) fig_point(fig, l, t + 1, tok_total(&res[i].series[t]));
    }
    snprintf(title, sizeof title, "Latency of each generated token (%s)", base);
    svg_path(path, sizeof path, o, "latency_over_time.svg");
    ok = ok && svg_line_chart(path, title, "generated token", "ms", fig->line, fig->n);
    /* (b) the memory-latency curve: x is the budget as a share of the model's weight bytes */
    if (o->n_sweep_mem) {
        fig->n = 0;
        for (int m = 0; m < nm; m++) {
            int l = fig_line(fig, mruns[m].label, false, true);
            for (int b = 0; b < o->n_sweep_mem; b++) {
                const bench_result *r = &mres[b * nm + m];
                if (r->ok && r->budget && r->model_bytes)
                    fig_point(fig, l, 100.0 * (double)r->budget / (double)r->model_bytes, r->tot_med);
            }
        }
        snprintf(title, sizeof title, "Memory-latency trade-off (%s)", base);
        svg_path(path, sizeof path, o, "memory_latency.svg");
        ok = ok && svg_line_chart(path, title, "memory budget, % of the model's weights", "ms per token (median)",
                                  fig->line, fig->n);
    }
    /* (c) neurons per token against the window k, measured and from the calibration (Knowl 3), as a share of all FFN
     * neurons */
    if (o->n_sweep_win) {
        const bench_result *any = NULL;
        for (int i = 0; i < o->n_sweep_win && !any; i++) if (wres[i].ok) any = &wres[i];
        double all = any ? (double)any->n_layers * any->d_ffn : cal->ok ? (double)cal->n_layers * cal->d_ffn : 0;
        double pct = all > 0 ? 100.0 / all : 1.0;
        fig->n = 0;
        int loaded = fig_line(fig, "measured: loaded per token", false, true);
        int pred = fig_line(fig, "measured: predicted per token", false, true);
        for (int i = 0; i < o->n_sweep_win; i++) {
            if (!wres[i].ok) continue;
            fig_point(fig, loaded, o->sweep_win[i], wres[i].loaded_per_tok * pct);
            fig_point(fig, pred, o->sweep_win[i], wres[i].pred_per_tok * pct);
        }
        if (cal->ok) {
            int inc = fig_line(fig, "calibration: s_agg(k+1) - s_agg(k)", true, false);
            int agg = fig_line(fig, "calibration: s_agg(k)", true, false);
            for (int k = 1; k <= FLM_CALIB_AGG_K; k++) {
                if (k < FLM_CALIB_AGG_K) fig_point(fig, inc, k, expected_loaded(cal, k) * pct);
                fig_point(fig, agg, k, cal->s_agg[k - 1] * pct);
            }
        }
        snprintf(title, sizeof title, "Neurons per token against the window k (%s, --mem %s)", base, o->mem);
        svg_path(path, sizeof path, o, "window.svg");
        ok = ok && svg_line_chart(path, title, "window k (tokens)", "% of all FFN neurons (every layer)", fig->line,
                                  fig->n);
    }
    free(fig);
    if (!ok) { fprintf(stderr, "flashlm: cannot write the figures in %s: %s\n", o->svg, svg_error()); return 1; }
    return 0;
}

/* --mem B1,B2,... --svg FILE: ms/token against the budget (as a share of the model's weights), one line per mode
 * (the paper's figure of latency against memory); ram, run without a budget, a dashed level line across. */
static int write_budget_svg(const bench_opts *o, const bench_run *runs, const bench_result *res, int n,
                            const bench_run *mruns, int nm, const bench_result *mres) {
    figure *fig = calloc(1, sizeof *fig);
    if (!fig) return cli_die("%s", "out of memory"), 1;
    const char *base = strrchr(o->model, '/') ? strrchr(o->model, '/') + 1 : o->model;
    double xlo = INFINITY, xhi = -INFINITY;
    for (int b = 0; b < o->n_sweep_mem; b++) {
        double x = o->weight_bytes ? 100.0 * (double)o->sweep_bytes[b] / (double)o->weight_bytes : NAN;
        if (isfinite(x)) { xlo = fmin(xlo, x); xhi = fmax(xhi, x); }
    }
    static char level_names[BENCH_MAX_MODES][120];
    for (int i = 0; i < n; i++) {
        if (!res[i].ok || !(xlo <= xhi)) continue;
        snprintf(level_names[i], sizeof level_names[i], "%.80s (no budget)", runs[i].label);
        int l = fig_line(fig, level_names[i], true, false);
        fig_point(fig, l, xlo, res[i].tot_med);
        fig_point(fig, l, xhi, res[i].tot_med);
    }
    for (int m = 0; m < nm; m++) {
        int l = fig_line(fig, mruns[m].label, false, true);
        for (int b = 0; b < o->n_sweep_mem; b++) {
            const bench_result *r = &mres[b * nm + m];
            if (r->ok && o->weight_bytes)
                fig_point(fig, l, 100.0 * (double)o->sweep_bytes[b] / (double)o->weight_bytes, r->tot_med);
        }
    }
    char title[512];
    snprintf(title, sizeof title, "Latency against the memory budget (%s, %d generated tokens)", base, o->gen_tokens);
    bool ok = svg_line_chart(o->svg, title, "memory budget, % of the model's weights", "ms per token", fig->line,
                             fig->n);
    free(fig);
    if (!ok) { fprintf(stderr, "flashlm: cannot write %s: %s\n", o->svg, svg_error()); return 1; }
    return 0;
}

/* ---- the command ------------------------------------------------------------------------------------------- */

/* --mem B1,B2,...: ram once without a budget, the other modes of --modes (default naive, hybrid, sparse when the model
 * is calibrated for it, auto) at each budget; the table, and --json / --svg FILE. */
static int bench_budgets(bench_opts *o) {
    flm_error err;
    flm_params wp = o->params; /* the model's weight bytes: a budget of 100% */
    wp.mem_bytes = 0;
    wp.mem_percent = 100;
    if (flm_plan_budget_bytes(o->model, &wp, &o->weight_bytes, &err)) return cli_die("%s", err.msg), 1;
    for (int b = 0; b < o->n_sweep_mem; b++) {
        flm_params bp = o->params;
        flm_parse_mem(o->sweep_mem[b], &bp.mem_bytes, &bp.mem_percent); /* validated by parse_sweep */
        if (flm_plan_budget_bytes(o->model, &bp, &o->sweep_bytes[b], &err)) return cli_die("%s", err.msg), 1;
    }
    const char *list = o->modes;
    char dflt[64] = "ram,naive,hybrid,auto";
    if (!list) { /* sparse when the model has its predictors (flm_plan says why not, without a budget) */
        flm_params sp = o->params;
        sp.mode = FLM_MODE_SPARSE;
        sp.mem_bytes = 0;
        sp.mem_percent = 0;
        cli_env_params(&sp, o->model);
        sp.log = NULL;
        flm_plan_info pi;
        if (flm_plan(o->model, &sp, &pi, &err) == FLM_OK) snprintf(dflt, sizeof dflt, "ram,naive,hybrid,sparse,auto");
        else fprintf(stderr, "flashlm bench: no sparse rows: %s\n", err.msg);
        list = o->modes = dflt;
    }
    bench_run all[BENCH_MAX_MODES], runs[BENCH_MAX_MODES], mruns[BENCH_MAX_MODES];
    int na = 0, n = 0, nm = 0;
    if (!parse_modes(list, o, all, &na)) return 2;
    for (int i = 0; i < na; i++) { /* ram is the reference without a budget; the others run at each budget */
        if (all[i].mode == FLM_MODE_RAM) runs[n++] = all[i];
        else mruns[nm++] = all[i];
    }
    bench_result res[BENCH_MAX_MODES];
    bench_result *mres = calloc((size_t)(o->n_sweep_mem * nm + 1), sizeof *mres); /* budget-major */
    if (!mres) return cli_die("%s", "out of memory");
    for (int i = 0; i < n; i++) run_one(o, &runs[i], &res[i]);
    for (int b = 0; b < o->n_sweep_mem; b++) {
        uint64_t bytes;
        double pct;
        flm_parse_mem(o->sweep_mem[b], &bytes, &pct);
        for (int m = 0; m < nm; m++) {
            bench_run r = mruns[m];
            r.params.mem_bytes = bytes;
            r.params.mem_percent = pct;
            snprintf(r.label, sizeof r.label, "%.40s @ %s", mruns[m].label, o->sweep_mem[b]);
            print_plan(o, &r);
            run_one(o, &r, &mres[b * nm + m]);
        }
    }
    print_budget_table(o, runs, res, n, mruns, nm, mres);
    fflush(stdout);
    calib_agg cal = {0};
    int rc = 0, ran = 0;
    for (int i = 0; i < n; i++) ran += res[i].ok != 0;
    for (int i = 0; i < o->n_sweep_mem * nm; i++) ran += mres[i].ok != 0;
    if (!ran) { /* as in cmd_bench: nothing measured is a failure */
        fprintf(stderr, "flashlm bench: no run measured anything (each one skipped: see why above); nothing "
                        "written\n");
        rc = 1;
    }
    if (o->json && ran) rc |= write_json(o, runs, res, n, mruns, nm, mres, NULL, &cal); /* none: nothing to show */
    if (o->svg && ran) rc |= write_budget_svg(o, runs, res, n, mruns, nm, mres);
    for (int i = 0; i < n; i++) free(res[i].series);
    for (int i = 0; i < o->n_sweep_mem * nm; i++) free(mres[i].series);
    free(mres);
    return rc;
}

static const char *BENCH_HELP =
    "usage: flashlm bench -m MODEL [options]\n"
    "\n"
    "Measure per-token latency the way the paper does (one sequence; a prompt, then greedy decoding; reads bypass the\n"
    "page cache) for several modes, one after another in one run, each in its own process (so peak RSS is its own),\n"
    "and print markdown tables: latency split into flash I/O / memory / compute (the median decoding token, the first\n"
    "token after the prompt reported apart), bytes and reads per token, read throughput, speed-ups.\n"
    "\n"
    "  -m, --model PATH        .flm (all modes) or .gguf (ram only)\n"
    "      --mem BYTES|N%      memory budget for the streaming modes and the window sweep (default 50%)\n"
    "      --mem B1,B2,...     a list of budgets (e.g. 100%,50%,35%,25%): one table of ms/token, tokens per pass,\n"
    "                          MiB read per token and the reader's busy share per mode and budget (ram once,\n"
    "                          without a budget; the modes default to naive, hybrid, sparse when calibrated for\n"
    "                          it, auto); a budget a mode cannot run under is a row saying why; --svg FILE then\n"
    "                          writes one figure, ms/token against the budget per mode\n"
    "      --modes LIST        comma-separated, from ram, naive, hybrid, sparse and the ablations predictor-only\n"
    "                          (sparse without window and bundling), sparse-nobundle, sparse-oracle (true active\n"
    "                          sets), naive-noahead, hybrid-noahead, sparse-noahead (no read-ahead);\n"
    "                          MODE-noverify: reads not checked against the record sums (--no-verify-reads)\n"
    "                          (default ram,naive,hybrid,sparse; a mode that does not fit is skipped);\n"
    "                          MODE@bN runs the prompt in batches of N tokens (@b1: token by token), e.g.\n"
    "                          --modes naive@b1,naive,sparse@b1,sparse for the prompt table's speed-ups;\n"
    "                          MODE+self[N] decodes speculatively with the self-draft (mode hot: the hottest\n"
    "                          neurons in memory draft N tokens, default 4), MODE+ngram[N] with n-gram lookup;\n"
    "                          MODE+self[N]/wS and auto/wS: the self-draft's window share S (--draft-window;\n"
    "                          default " CLI_STR(CLI_DRAFT_WINDOW_DEFAULT) ", /w0: none); auto runs what `flashlm\n"
    "                          plan` prints (on a file stored hottest first: hot with the self-draft)\n"
    "      --no-draft          auto rows without the self-draft (as run --no-draft)\n"
    "      --prompt-tokens N   prompt length (default 16); the prompt table reports its time (the time to first\n"
    "                          token), tokens/s and bytes read, against the same mode token by token\n"
    "      --gen-tokens N      generated tokens (default 32)\n"
    "      --text FILE         take the prompt from this text: its first 64 KiB must give --prompt-tokens tokens\n"
    "                          (default: deterministic token ids)\n"
    "      --sweep mem=B1,B2,...     also run the modes of --modes (default naive,hybrid,sparse) at each budget:\n"
    "                                the memory-latency table (budgets as for --mem, e.g. mem=30%,40%,50%,60%)\n"
    "      --sweep window=K1,K2,...  also run sparse at --mem with each window k: bytes and neurons read per\n"
    "                                token against the calibration's s_agg(k+1) - s_agg(k) (e.g. window=1,2,4,8,16)\n"
    "      --json FILE         also write the results as JSON: every run with its per-token series (up to 4096\n"
    "                          tokens), the machine, the model, the flags\n"
    "      --svg DIR           also write figures: latency_breakdown.svg, latency_over_time.svg, and with the sweeps\n"
    "                          memory_latency.svg, window.svg (with a --mem list: --svg FILE, the one figure)\n"
    "      --force             replace existing --json and --svg files (else they are refused before the runs)\n"
    "\nshared options (here -c defaults to prompt + generated tokens, --mem to 50%, and --mode is set per run by\n--modes):\n";

int cmd_bench(int argc, char **argv) {
    bench_opts o = {0};
    flm_params_default(&o.params);
    o.prompt_tokens = 16;
    o.gen_tokens = 32;
    o.mem = "50%";
    o.argc = argc;
    o.argv = argv;
    long v;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDVAL() do { if (!val) return cli_die("option %s needs a value (see flashlm bench --help)", a); i++; } while (0)
        if (!strcmp(a, "--mem")) { NEEDVAL(); o.mem = val; continue; }
        int used = cli_parse_model_opt(argc, argv, &i, &o.params);
        if (used < 0) return 2;
        if (used) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { printf("%s%s", BENCH_HELP, CLI_MODEL_OPTS_HELP); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEEDVAL(); o.model = val; }
        else if (!strcmp(a, "--modes")) { NEEDVAL(); o.modes = val; }
        else if (!strcmp(a, "--text")) { NEEDVAL(); o.text = val; }
        else if (!strcmp(a, "--json")) { NEEDVAL(); o.json = val; }
        else if (!strcmp(a, "--svg")) { NEEDVAL(); o.svg = val; }
        else if (!strcmp(a, "--force")) { o.force = true; }
        else if (!strcmp(a, "--no-draft")) { o.params.no_draft = true; }
        else if (!strcmp(a, "--sweep")) { NEEDVAL(); if (parse_sweep(val, &o)) return 2; }
        else if (!strcmp(a, "--prompt-tokens")) {
            NEEDVAL(); if (!cli_parse_long(val, 1, 1 << 20, &v)) return cli_die("bad --prompt-tokens '%s' (1..1048576)", val);
            o.prompt_tokens = (int)v;
        } else if (!strcmp(a, "--gen-tokens")) {
            NEEDVAL(); /* each generated token's statistics are read back: the context keeps the last FLM_STATS_TOKENS */
            if (!cli_parse_long(val, 2, FLM_STATS_TOKENS, &v))
                return cli_die("bad --gen-tokens '%s' (2..256, the per-token statistics a context keeps)", val);
            o.gen_tokens = (int)v;
        } else return cli_die("unknown option '%s' (see flashlm bench --help)", a);
#undef NEEDVAL
    }
    if (!o.model) return cli_die("%s", "no model given: use -m MODEL (see flashlm bench --help)");
    char model_buf[4096];
    o.model = cli_resolve_model(o.model, model_buf, sizeof model_buf);
    if (strchr(o.mem, ',')) { /* a list: the budget table */
        if (o.n_sweep_mem || o.n_sweep_win)
            return cli_die("%s", "--mem with a list of budgets is a sweep of its own: no --sweep beside it");
        char spec[sizeof o.sweep_mem + 8];
        snprintf(spec, sizeof spec, "mem=%s", o.mem);
        g_parsing_mem_list = true;
        int bad = parse_sweep(spec, &o);
        g_parsing_mem_list = false;
        if (bad) return bad;
        o.mem_list = true;
    } else if (!flm_parse_mem(o.mem, &o.mem_bytes, &o.mem_pct)) return cli_die("bad --mem '%s'", o.mem);
    if (o.n_sweep_win && o.params.no_window)
        return cli_die("%s", "--sweep window contradicts --no-window (a window of 1 is --sweep window=1)");
    if (access(o.model, R_OK) != 0) return cli_die("cannot read model '%s'", o.model), 1;
    if (o.text && !text_ok(o.text)) return 1;
    if (!o.params.n_ctx) o.params.n_ctx = o.prompt_tokens + o.gen_tokens + 1;
    /* the outputs: refused now, not after the runs (the checked writer's rules: docs/SECURITY.md) */
    if (o.json && !cli_may_write(o.json, o.model, o.force)) return 1;
    svg_set_replace(o.force);
    if (o.mem_list && o.svg && !cli_may_write(o.svg, o.model, o.force)) return 1; /* one figure: a file */
    size_t svg_len = o.svg ? strlen(o.svg) : 0;
    if (o.svg && !o.mem_list && svg_len >= 4 && !strcasecmp(o.svg + svg_len - 4, ".svg"))
        return cli_die("--svg %s: without a --mem list bench writes several figures, so --svg names a folder (with "
                       "a list of budgets, e.g. --mem 100%%,50%%, it names the one figure's file)", o.svg);
    struct stat svg_st; /* a folder bench will make (write_svgs): its parent must take it; nothing in it to refuse */
    bool svg_new = o.svg && !o.mem_list && stat(o.svg, &svg_st) != 0 && errno == ENOENT;
    if (svg_new && !cli_may_write(o.svg, o.model, false)) return 1;
    for (int k = 0; o.svg && !o.mem_list && !svg_new && k < 4; k++) {
        static const char *const names[] = {"latency_breakdown.svg", "latency_over_time.svg", "memory_latency.svg",
                                            "window.svg"};
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", o.svg, names[k]);
        if (!cli_may_write(path, o.model, o.force)) return 1;
    }

    bench_run runs[BENCH_MAX_MODES], mruns[BENCH_MAX_MODES];
    int n = 0, nm = 0;
    if (o.mem_list) return bench_budgets(&o);
    if (!parse_modes(o.modes ? o.modes : "ram,naive,hybrid,sparse", &o, runs, &n)) return 2;
    if (o.n_sweep_mem && !parse_modes(o.modes ? o.modes : "naive,hybrid,sparse", &o, mruns, &nm)) return 2;
    bench_result res[BENCH_MAX_MODES], wres[BENCH_MAX_SWEEP];
    bench_result *mres = calloc((size_t)(o.n_sweep_mem * nm + 1), sizeof *mres); /* budget-major: mres[b * nm + m] */
    if (!mres) return cli_die("%s", "out of memory");
    if (!o.modes) o.modes = "ram,naive,hybrid,sparse";
    /* 1. the modes side by side at --mem (ram runs without a budget: it is the dense reference) */
    for (int i = 0; i < n; i++) {
        if (runs[i].mode != FLM_MODE_RAM) {
            runs[i].params.mem_bytes = o.mem_bytes;
            runs[i].params.mem_percent = o.mem_pct;
        }
        print_plan(&o, &runs[i]);
        run_one(&o, &runs[i], &res[i]);
    }
    print_main_tables(&o, runs, res, n);
    fflush(stdout);
    /* 2. the memory sweep */
    for (int b = 0; b < o.n_sweep_mem; b++) {
        uint64_t bytes;
        double pct;
        flm_parse_mem(o.sweep_mem[b], &bytes, &pct); /* validated by parse_sweep */
        for (int m = 0; m < nm; m++) {
            bench_run r = mruns[m];
            if (r.mode != FLM_MODE_RAM) { r.params.mem_bytes = bytes; r.params.mem_percent = pct; }
            snprintf(r.label, sizeof r.label, "%.40s @ %s", mruns[m].label, o.sweep_mem[b]);
            run_one(&o, &r, &mres[b * nm + m]);
        }
    }
    if (o.n_sweep_mem) print_mem_sweep(&o, mruns, nm, mres);
    fflush(stdout);
    /* 3. the window sweep */
    calib_agg cal = {0};
    if (o.n_sweep_win) cal = read_calibration(o.model);
    for (int i = 0; i < o.n_sweep_win; i++) {
        bench_run r;
        parse_mode_spec("sparse", &o, &r);
        snprintf(r.label, sizeof r.label, "sparse k=%d", o.sweep_win[i]);
        r.params.mem_bytes = o.mem_bytes;
        r.params.mem_percent = o.mem_pct;
        r.params.window = o.sweep_win[i];
        run_one(&o, &r, &wres[i]);
    }
    if (o.n_sweep_win) print_window_sweep(&o, wres, &cal);
    int rc = 0, ran = 0;
    for (int i = 0; i < n; i++) ran += res[i].ok != 0;
    for (int i = 0; i < o.n_sweep_mem * nm; i++) ran += mres[i].ok != 0;
    for (int i = 0; i < o.n_sweep_win; i++) ran += wres[i].ok != 0;
    if (!ran) { /* every row says "skipped": nothing was measured, which exit 0 hid from scripts */
        fprintf(stderr, "flashlm bench: no run measured anything (each one skipped: see why above); nothing "
                        "written\n");
        rc = 1;
    }
    if (o.json && ran) rc |= write_json(&o, runs, res, n, mruns, nm, mres, wres, &cal); /* none: nothing to show */
    if (o.svg && ran) rc |= write_svgs(&o, runs, res, n, mruns, nm, mres, wres, &cal);
    for (int i = 0; i < n; i++) free(res[i].series);
    for (int i = 0; i < o.n_sweep_mem * nm; i++) free(mres[i].series);
    for (int i = 0; i < o.n_sweep_win; i++) free(wres[i].series);
    free(mres);
    return rc;
}
