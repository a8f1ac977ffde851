/* cmd_perplexity.c — `flashlm perplexity`: teacher-forced perplexity of a text file, in any mode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flashlm.h"
#include "flashlm_tools.h"
#include "svg.h"

static const char *PPL_HELP =
    "usage: flashlm perplexity -m MODEL -f TEXT [options]\n"
    "\n"
    "Teacher-forced perplexity over chunks of -c tokens (the first of each chunk replaced by BOS, the second half of\n"
    "each chunk scored), as llama.cpp's perplexity tool computes it. Run it with different --mode values on the same\n"
    "text to compare dense and flash/sparse execution.\n"
    "\n"
    "  -m, --model PATH     .gguf or .flm\n"
    "  -f, --file TEXT      text file\n"
    "      --chunks N       evaluate at most N chunks (default: all)\n"
    "      --curve          a calibrated .flm: the quality curve (docs/SPARSITY.md). Dense, then every stored level\n"
    "                       with the predictor and with the true active sets (oracle), each over the same chunks,\n"
    "                       in memory: perplexity against the share of neurons and the MiB a token's sets take\n"
    "                       from flash when nothing is cached\n"
    "      --levels LIST    with --curve: only these stored levels (comma-separated eps, e.g. 0.0005,0.002,0.02)\n"
    "      --no-oracle      with --curve: the predictor's points only (an oracle point runs the FFN densely too)\n"
    "      --svg FILE       with --curve: also draw it (perplexity against MiB per token) as an SVG chart\n"
    "      --force          replace an existing --svg FILE\n"
    "\nshared options (here -c is the chunk length and defaults (and 0) to 128, at least 4):\n";

static void progress(void *user, int chunk, int n_chunks, double ppl) {
    (void)user;
    if (n_chunks > 0) fprintf(stderr, "[%d/%d] %.4f\n", chunk, n_chunks, ppl);
    else fprintf(stderr, "[%d] %.4f\n", chunk, ppl); /* to the end of a text read as a stream: no count ahead */
}

/* "0.0005,0.002" -> at most 8 values in (0, 1) */
static bool parse_levels(const char *s, float *out, uint32_t *n) {
    char buf[256];
    if (strlen(s) >= sizeof buf) return false;
    strcpy(buf, s);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= 8 || !cli_parse_float(t, 1e-9f, 0.999f, &out[*n])) return false;
        (*n)++;
    }
    return *n > 0;
}

static void curve_point_done(void *user, const flm_curve_point *q) {
    (void)user;
    if (q->eps == 0) fprintf(stderr, "flashlm: dense: perplexity %.4f (%.0f s)\n", q->ppl, q->seconds);
    else
        fprintf(stderr, "flashlm: eps %g %s: perplexity %.4f, %.1f%% of the neurons (%.0f s)\n", (double)q->eps,
                q->oracle ? "oracle" : "predictor", q->ppl, 100 * q->neuron_frac, q->seconds);
}

/* flashlm perplexity --curve: the table (and chart) of flm_sparsity_curve */
static int run_curve(const char *model, const char *file, const flm_params *p, long chunks, const float *levels,
                     uint32_t n_levels, bool no_oracle, const char *svg) {
    char model_buf[4096];
    model = cli_resolve_model(model, model_buf, sizeof model_buf);
    flm_curve_opts o;
    flm_curve_opts_default(&o);
    o.text_file = file; /* read as a stream, as far as the chunks asked for */
    o.chunk = p->n_ctx;
    o.max_chunks = (int)chunks;
    o.levels = n_levels ? levels : NULL;
    o.n_levels = n_levels;
    o.no_oracle = no_oracle;
    o.n_threads = p->n_threads;
    o.progress = cli_progress;
    o.on_point = curve_point_done;
    flm_curve_point pts[1 + 2 * 8];
    uint32_t n = 0;
    flm_error err;
    flm_status st = flm_sparsity_curve(model, NULL, &o, pts, 1 + 2 * 8, &n, &err);
    if (st) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        if (!n) return 1;
        fprintf(stderr, "flashlm: the %u points measured before the error follow\n", n);
    }
    printf("quality curve of %s on %s (-c %d): perplexity against what a token's FFN sets take from flash\n", model,
           file, o.chunk);
    printf("| point | eps | neurons | MiB/token | perplexity | vs dense | time |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
    for (uint32_t j = 0; j < n; j++) {
        const flm_curve_point *q = &pts[j];
        char eps[32] = "-";
        if (j) snprintf(eps, sizeof eps, "%g%s", (double)q->eps, q->is_default ? " (default)" : "");
        printf("| %s | %s | %.1f%% | %.1f | %.4f +/- %.4f | %+.2f%% | %.0f s |\n",
               j == 0 ? "dense" : q->oracle ? "oracle" : "predictor", eps, 100 * q->neuron_frac,
               q->bytes_per_token / 1048576.0, q->ppl, q->ppl_stderr, 100 * (q->ppl / pts[0].ppl - 1), q->seconds);
    }
    if (svg && n) {
        double xp[8], yp[8], xo[8], yo[8], xd = pts[0].bytes_per_token / 1048576.0, yd = pts[0].ppl;
        int np = 0, no = 0;
        for (uint32_t j = 1; j < n; j++) {
            if (pts[j].oracle) {
                xo[no] = pts[j].bytes_per_token / 1048576.0;
                yo[no++] = pts[j].ppl;
            } else {
                xp[np] = pts[j].bytes_per_token / 1048576.0;
                yp[np++] = pts[j].ppl;
            }
        }
        svg_line lines[3] = {{"predictor", xp, yp, np, false, true},
                             {"oracle (true active sets)", xo, yo, no, true, true},
                             {"dense", &xd, &yd, 1, false, true}};
        char title[512];
        snprintf(title, sizeof title, "%s: perplexity against MiB per token (-c %d)", model, o.chunk);
        if (!svg_line_chart(svg, title, "MiB of FFN bundles per token (no cache)", "perplexity", lines, 3)) {
            fprintf(stderr, "flashlm: cannot write %s: %s\n", svg, svg_error());
            return 1;
        }
        fprintf(stderr, "flashlm: wrote %s\n", svg);
    }
    return st ? 1 : 0;
}

int cmd_perplexity(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    long chunks = 0;
    bool curve = false, no_oracle = false, force = false;
    const char *svg = NULL;
    float levels[8];
    uint32_t n_levels = 0;
    flm_params p;
    flm_params_default(&p);
    p.n_ctx = 128;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int used = cli_parse_model_opt(argc, argv, &i, &p);
        if (used < 0) return 2;
        if (used) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { printf("%s%s", PPL_HELP, CLI_MODEL_OPTS_HELP); return 0; }
        if (!strcmp(a, "--curve")) { curve = true; continue; }
        if (!strcmp(a, "--no-oracle")) { no_oracle = true; continue; }
        if (!strcmp(a, "--force")) { force = true; continue; }
        if (!val) return cli_die("option %s needs a value (see flashlm perplexity --help)", a);
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = val;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = val;
        else if (!strcmp(a, "--chunks")) {
            if (!cli_parse_long(val, 1, 1 << 24, &chunks)) return cli_die("bad --chunks '%s' (1..16777216)", val);
        } else if (!strcmp(a, "--svg")) svg = val;
        else if (!strcmp(a, "--levels")) {
            if (!parse_levels(val, levels, &n_levels)) return cli_die("bad --levels '%s' (comma-separated eps)", val);
        } else return cli_die("unknown option '%s' (see flashlm perplexity --help)", a);
    }
    if (!model || !file) return cli_die("%s", "need -m MODEL and -f TEXT (see flashlm perplexity --help)");
    if (!curve && (n_levels || no_oracle || svg))
        return cli_die("%s", "--levels, --no-oracle and --svg go with --curve");
    /* the figure: refused now, not after the curve (the checked writer's rules, docs/SECURITY.md) */
    if (svg && !cli_may_write(svg, model, force)) return 1;
    svg_set_replace(force);
    /* -c is the chunk here: 0 is its default, as elsewhere; fewer than 4 tokens were refused only after the model
     * loaded, as "chunk of 1 tokens must be in [4, context 1]" */
    if (p.n_ctx == 0) p.n_ctx = 128;
    if (p.n_ctx < 4) {
        fprintf(stderr, "flashlm: perplexity: -c %d: a chunk needs at least 4 tokens (half of it is scored)\n", p.n_ctx);
        return 2;
    }
    if (curve) return run_curve(model, file, &p, chunks, levels, n_levels, no_oracle, svg);
    char model_buf[4096];
    model = cli_resolve_model(model, model_buf, sizeof model_buf);
    int chunk = p.n_ctx;
    flm_error err;
    flm_ctx *ctx = NULL;
    cli_env_params(&p, model);
    if (flm_open(model, &p, &ctx, &err)) { fprintf(stderr, "flashlm: %s\n", err.msg); return 1; }
    if (cli_after_open(ctx)) { flm_close(ctx); return 1; }
    cli_note_unused(ctx, &p, NULL);
    flm_ppl_result r;
    double t0 = cli_now_ms();
    int rc = 0;
    /* the text as a stream: one chunk's tokens at a time, nothing read past the last chunk (a 50 MB text or
     * /dev/zero costs what a short one does) */
    if (flm_perplexity_file(ctx, file, chunk, (int)chunks, progress, NULL, &r, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        rc = 1;
    } else {
        flm_stats s;
        flm_get_stats(ctx, &s);
        printf("%s: mode %s: perplexity %.4f +/- %.4f over %llu tokens (%d chunks of %d), %.1f s\n", model, s.mode,
               r.ppl, r.ppl * r.nll_stderr, (unsigned long long)r.n_scored, r.n_chunks, chunk,
               (cli_now_ms() - t0) / 1e3);
    }
    flm_close(ctx);
    return rc;
}
