/* cmd_bench.c — `flashlm bench`: the paper's protocol (Knowl 7) for several modes in one run, side by side.
 * Each mode runs in a child process (fork) so that its peak RSS is its own; results come back through a pipe. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "flashlm.h"

typedef struct bench_result {
    int ok;
    char err[512];
    char mode[16], backend[16];
    int direct;
    int n_prompt, n_gen;
    double prompt_ms, first_ms;                     /* the whole prompt; the first token after it */
    double io_med, mem_med, cmp_med, tot_med;       /* per steady decoding token (after the first) */
    double tot_p10, tot_p90;
    double io_mean, mem_mean, cmp_mean, tot_mean;
    double bytes_per_tok, reads_per_tok, gbps;
    uint64_t peak_rss, budget, model_bytes;
    uint32_t res_layers, n_layers;
} bench_result;

typedef struct bench_opts {
    const char *model, *text, *json;
    int prompt_tokens, gen_tokens;
    flm_params params;
} bench_opts;

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

/* Run one mode in this (child) process. */
static void run_mode(const bench_opts *o, flm_mode mode, bench_result *r) {
    memset(r, 0, sizeof *r);
    flm_params p = o->params;
    p.mode = mode;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(o->model, &p, &ctx, &err)) {
        snprintf(r->err, sizeof r->err, "%s", err.msg);
        return;
    }
    flm_model_info info;
    flm_get_info(ctx, &info);
    int n_prompt = o->prompt_tokens, n_gen = o->gen_tokens;
    if ((uint32_t)(n_prompt + n_gen) > info.n_ctx) {
        snprintf(r->err, sizeof r->err, "prompt + generated tokens (%d) exceed the context (%u): raise -c",
                 n_prompt + n_gen, info.n_ctx);
        flm_close(ctx);
        return;
    }
    int32_t *ids = calloc((size_t)n_prompt + 1, sizeof *ids);
    ids[0] = info.bos >= 0 ? info.bos : 1;
    int have = 1;
    if (o->text) { /* prompt from the text file: its first tokens */
        FILE *f = fopen(o->text, "rb");
        if (f) {
            char *buf = calloc(1, 1 << 16);
            size_t n = fread(buf, 1, (1 << 16) - 1, f);
            fclose(f);
            buf[n] = 0;
            size_t cap = (size_t)n_prompt;
            int32_t *tmp = calloc(n + 8, sizeof *tmp);
            size_t got = flm_tokenize(ctx, buf, true, tmp, n + 8);
            have = (int)(got < cap ? got : cap);
            memcpy(ids, tmp, (size_t)have * sizeof *ids);
            free(tmp);
            free(buf);
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
    int pos = 0;
    for (; pos < n_prompt; pos++)
        if (flm_eval(ctx, ids[pos], pos, &logits, &err)) goto fail;
    r->prompt_ms = cli_now_ms() - t0;
    flm_reset_stats(ctx);
    int32_t tok = flm_sampler_sample(smp, logits);
    for (int i = 0; i < n_gen; i++, pos++) {
        if (flm_eval(ctx, tok, pos, &logits, &err)) goto fail;
        tok = flm_sampler_sample(smp, logits);
    }
    flm_stats s;
    flm_get_stats(ctx, &s);
    double *tot = calloc((size_t)n_gen, sizeof *tot), *io = calloc((size_t)n_gen, sizeof *io);
    double *mem = calloc((size_t)n_gen, sizeof *mem), *cmp = calloc((size_t)n_gen, sizeof *cmp);
    int m = 0;
    uint64_t bytes = 0, reads = 0;
    double io_sum = 0, mem_sum = 0, cmp_sum = 0;
    for (int i = 0; i < n_gen; i++) {
        flm_token_stats t;
        if (!flm_get_token_stats(ctx, (uint64_t)i, &t)) break;
        if (i == 0) { r->first_ms = t.io_ms + t.mem_ms + t.compute_ms; continue; }
        io[m] = t.io_ms; mem[m] = t.mem_ms; cmp[m] = t.compute_ms; tot[m] = t.io_ms + t.mem_ms + t.compute_ms;
        io_sum += t.io_ms; mem_sum += t.mem_ms; cmp_sum += t.compute_ms;
        bytes += t.bytes_read;
        reads += t.n_reads;
        m++;
    }
    r->n_prompt = n_prompt;
    r->n_gen = m;
    if (m > 0) {
        r->io_mean = io_sum / m; r->mem_mean = mem_sum / m; r->cmp_mean = cmp_sum / m;
        r->tot_mean = r->io_mean + r->mem_mean + r->cmp_mean;
        r->bytes_per_tok = (double)bytes / m;
        r->reads_per_tok = (double)reads / m;
        r->gbps = io_sum > 0 ? (double)bytes / (io_sum * 1e6) : 0;
        r->tot_p10 = quantile(tot, m, 0.1);
        r->tot_p90 = quantile(tot, m, 0.9);
        r->tot_med = quantile(tot, m, 0.5);
        r->io_med = quantile(io, m, 0.5);
        r->mem_med = quantile(mem, m, 0.5);
        r->cmp_med = quantile(cmp, m, 0.5);
    }
    free(tot); free(io); free(mem); free(cmp);
    snprintf(r->mode, sizeof r->mode, "%s", s.mode);
    snprintf(r->backend, sizeof r->backend, "%s", s.io_backend);
    r->direct = s.direct_io;
    r->peak_rss = s.peak_rss;
    r->budget = s.mem_budget;
    r->model_bytes = s.model_bytes;
    r->res_layers = s.n_ffn_resident_layers;
    r->n_layers = s.n_layers;
    r->ok = 1;
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

static bool run_in_child(const bench_opts *o, flm_mode mode, bench_result *r) {
    int fd[2];
    if (pipe(fd) != 0) return false;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        close(fd[0]);
        bench_result res;
        run_mode(o, mode, &res);
        ssize_t w = write(fd[1], &res, sizeof res);
        _exit(w == (ssize_t)sizeof res ? 0 : 1);
    }
    close(fd[1]);
    size_t got = 0;
    while (got < sizeof *r) {
        ssize_t n = read(fd[0], (char *)r + got, sizeof *r - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (got != sizeof *r) {
        memset(r, 0, sizeof *r);
        snprintf(r->err, sizeof r->err, "the benchmark process died (status %d)", status);
    }
    return true;
}

static const char *BENCH_HELP =
    "usage: flashlm bench -m MODEL [options]\n"
    "\n"
    "Measure per-token latency the way the paper does (one sequence; a prompt, then greedy decoding; reads bypass the\n"
    "page cache) for several modes, one after another in one run, each in its own process (so peak RSS is its own),\n"
    "and print markdown tables: latency split into flash I/O / memory / compute (medians over the decoding tokens,\n"
    "the first token after the prompt reported apart), bytes and reads per token, read throughput, speed-ups.\n"
    "\n"
    "  -m, --model PATH        .flm (all modes) or .gguf (ram only)\n"
    "      --mem BYTES|N%      memory budget for the streaming modes (default 50%)\n"
    "      --modes LIST        comma-separated, from ram, naive, hybrid, sparse and the ablations predictor-only\n"
    "                          (sparse without window and bundling), sparse-nobundle, sparse-oracle (true active\n"
    "                          sets) (default ram,naive,hybrid,sparse; a mode that does not fit is skipped)\n"
    "      --prompt-tokens N   prompt length (default 16)\n"
    "      --gen-tokens N      generated tokens (default 32)\n"
    "      --text FILE         take the prompt from this text (default: deterministic token ids)\n"
    "      --json FILE         also write the results as JSON\n"
    "  (-c defaults to prompt + generated tokens; --mode is set per run by --modes)\n";

int cmd_bench(int argc, char **argv) {
    bench_opts o = {0};
    flm_params_default(&o.params);
    o.prompt_tokens = 16;
    o.gen_tokens = 32;
    const char *modes = "ram,naive,hybrid,sparse", *mem = "50%";
    long v;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDVAL() do { if (!val) return cli_die("option %s needs a value (see flashlm bench --help)", a); i++; } while (0)
        if (!strcmp(a, "--mem")) { NEEDVAL(); mem = val; continue; }
        int used = cli_parse_model_opt(argc, argv, &i, &o.params);
        if (used < 0) return 2;
        if (used) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { printf("%s%s", BENCH_HELP, CLI_MODEL_OPTS_HELP); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEEDVAL(); o.model = val; }
        else if (!strcmp(a, "--modes")) { NEEDVAL(); modes = val; }
        else if (!strcmp(a, "--text")) { NEEDVAL(); o.text = val; }
        else if (!strcmp(a, "--json")) { NEEDVAL(); o.json = val; }
        else if (!strcmp(a, "--prompt-tokens")) {
            NEEDVAL(); if (!cli_parse_long(val, 1, 1 << 20, &v)) return cli_die("bad --prompt-tokens '%s'", val);
            o.prompt_tokens = (int)v;
        } else if (!strcmp(a, "--gen-tokens")) {
            NEEDVAL(); if (!cli_parse_long(val, 2, 1 << 20, &v)) return cli_die("bad --gen-tokens '%s' (>= 2)", val);
            o.gen_tokens = (int)v;
        } else return cli_die("unknown option '%s' (see flashlm bench --help)", a);
#undef NEEDVAL
    }
    if (!o.model) return cli_die("%s", "no model given: use -m MODEL (see flashlm bench --help)");
    if (access(o.model, R_OK) != 0) return cli_die("cannot read model '%s'", o.model), 1;
    if (!o.params.n_ctx) o.params.n_ctx = o.prompt_tokens + o.gen_tokens + 1;
    uint64_t mem_bytes;
    double mem_pct;
    if (!flm_parse_mem(mem, &mem_bytes, &mem_pct)) return cli_die("bad --mem '%s'", mem);

    bench_result res[16];
    const char *names[16];
    int n = 0;
    char list[512];
    snprintf(list, sizeof list, "%s", modes);
    for (char *tok = strtok(list, ","); tok && n < 16; tok = strtok(NULL, ",")) {
        flm_mode m;
        bench_opts oo = o;
        /* the ablation rows of the paper's Table 1 are sparse runs with one part taken away */
        if (!strcmp(tok, "predictor-only") || !strcmp(tok, "sparse-nowindow")) {
            m = FLM_MODE_SPARSE; oo.params.no_window = true; oo.params.no_bundle = true;
        } else if (!strcmp(tok, "sparse-nobundle")) {
            m = FLM_MODE_SPARSE; oo.params.no_bundle = true;
        } else if (!strcmp(tok, "sparse-oracle")) {
            m = FLM_MODE_SPARSE; oo.params.no_predictor = true;
        } else if (!flm_mode_parse(tok, &m)) return cli_die("unknown mode '%s' in --modes", tok);
        if (m != FLM_MODE_RAM) { oo.params.mem_bytes = mem_bytes; oo.params.mem_percent = mem_pct; }
        fprintf(stderr, "flashlm bench: %s ...\n", tok);
        run_in_child(&oo, m, &res[n]);
        names[n] = tok;
        if (!res[n].ok) fprintf(stderr, "flashlm bench: %s skipped: %s\n", tok, res[n].err);
        n++;
    }
    const bench_result *naive = NULL, *ram = NULL;
    for (int i = 0; i < n; i++) {
        if (res[i].ok && !strcmp(names[i], "naive")) naive = &res[i];
        if (res[i].ok && !strcmp(names[i], "ram")) ram = &res[i];
    }
    printf("\n%s: %d prompt tokens, %d generated; medians over decoding tokens after the first (p10-p90 of total)\n\n",
           o.model, o.prompt_tokens, o.gen_tokens);
    printf("| mode | flash I/O ms | memory ms | compute ms | total ms/token | p10-p90 ms | tokens/s | first token ms "
           "| vs naive | vs ram |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const bench_result *r = &res[i];
        if (!r->ok) { printf("| %s | skipped: %.80s |||||||||\n", names[i], r->err); continue; }
        printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f-%.2f | %.2f | %.2f | %s%.2fx | %s%.2fx |\n", names[i], r->io_med,
               r->mem_med, r->cmp_med, r->tot_med, r->tot_p10, r->tot_p90, r->tot_med > 0 ? 1e3 / r->tot_med : 0,
               r->first_ms, naive ? "" : "n/a ", naive && r->tot_med > 0 ? naive->tot_med / r->tot_med : 0,
               ram ? "" : "n/a ", ram && r->tot_med > 0 ? ram->tot_med / r->tot_med : 0);
    }
    printf("\n| mode | bytes read/token | reads/token | read throughput GB/s | reader | layers resident | peak RSS MiB "
           "| budget MiB |\n|---|---:|---:|---:|---|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const bench_result *r = &res[i];
        if (!r->ok) continue;
        char budget[32] = "none";
        if (r->budget) snprintf(budget, sizeof budget, "%.1f", cli_mib(r->budget));
        printf("| %s | %.0f (%.2f MiB) | %.1f | %.2f | %s%s | %u/%u | %.1f | %s |\n", names[i], r->bytes_per_tok,
               cli_mib((uint64_t)r->bytes_per_tok), r->reads_per_tok, r->gbps, r->backend,
               strcmp(r->backend, "none") ? (r->direct ? " O_DIRECT" : " buffered") : "", r->res_layers, r->n_layers,
               cli_mib(r->peak_rss), budget);
    }
    if (o.json) {
        FILE *f = fopen(o.json, "w");
        if (!f) { fprintf(stderr, "flashlm: cannot write %s\n", o.json); return 1; }
        fprintf(f, "{\n  \"model\": \"%s\",\n  \"prompt_tokens\": %d,\n  \"gen_tokens\": %d,\n  \"threads\": %d,\n"
                "  \"flashlm\": \"%s\",\n  \"modes\": [", o.model, o.prompt_tokens, o.gen_tokens, o.params.n_threads,
                FLM_VERSION_STRING);
        for (int i = 0; i < n; i++) {
            const bench_result *r = &res[i];
            fprintf(f, "%s\n    {\"requested\": \"%s\", \"ok\": %s", i ? "," : "", names[i], r->ok ? "true" : "false");
            if (r->ok)
                fprintf(f, ", \"mode\": \"%s\", \"io_backend\": \"%s\", \"direct_io\": %s, \"n_decode_tokens\": %d, "
                        "\"prompt_ms\": %.4f, \"first_token_ms\": %.4f, \"median\": {\"io_ms\": %.4f, \"mem_ms\": %.4f, "
                        "\"compute_ms\": %.4f, \"total_ms\": %.4f}, \"p10_total_ms\": %.4f, \"p90_total_ms\": %.4f, "
                        "\"mean\": {\"io_ms\": %.4f, \"mem_ms\": %.4f, \"compute_ms\": %.4f, \"total_ms\": %.4f}, "
                        "\"bytes_per_token\": %.1f, \"reads_per_token\": %.2f, \"read_gbps\": %.4f, \"peak_rss\": %llu, "
                        "\"budget\": %llu, \"model_bytes\": %llu, \"ffn_resident_layers\": %u, \"n_layers\": %u",
                        r->mode, r->backend, r->direct ? "true" : "false", r->n_gen, r->prompt_ms, r->first_ms,
                        r->io_med, r->mem_med, r->cmp_med, r->tot_med, r->tot_p10, r->tot_p90, r->io_mean, r->mem_mean,
                        r->cmp_mean, r->tot_mean, r->bytes_per_tok, r->reads_per_tok, r->gbps,
                        (unsigned long long)r->peak_rss, (unsigned long long)r->budget,
                        (unsigned long long)r->model_bytes, r->res_layers, r->n_layers);
            else {
                fprintf(f, ", \"error\": \"");
                for (const char *c = r->err; *c; c++) fputc(*c == '"' || *c == '\\' || (unsigned char)*c < 32 ? '\'' : *c, f);
                fprintf(f, "\"");
            }
            fprintf(f, "}");
        }
        fprintf(f, "\n  ]\n}\n");
        fclose(f);
    }
    return 0;
}
