/* cmd_perplexity.c — `flashlm perplexity`: teacher-forced perplexity of a text file, in any mode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flashlm.h"

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
    "\nshared options (here -c is the chunk length and defaults to 128):\n";

static void progress(void *user, int chunk, int n_chunks, double ppl) {
    (void)user;
    fprintf(stderr, "[%d/%d] %.4f\n", chunk, n_chunks, ppl);
}

int cmd_perplexity(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    long chunks = 0;
    flm_params p;
    flm_params_default(&p);
    p.n_ctx = 128;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int used = cli_parse_model_opt(argc, argv, &i, &p);
        if (used < 0) return 2;
        if (used) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { printf("%s%s", PPL_HELP, CLI_MODEL_OPTS_HELP); return 0; }
        if (!val) return cli_die("option %s needs a value (see flashlm perplexity --help)", a);
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = val;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = val;
        else if (!strcmp(a, "--chunks")) {
            if (!cli_parse_long(val, 1, 1 << 24, &chunks)) return cli_die("bad --chunks '%s'", val);
        } else return cli_die("unknown option '%s' (see flashlm perplexity --help)", a);
    }
    if (!model || !file) return cli_die("%s", "need -m MODEL and -f TEXT (see flashlm perplexity --help)");
    char model_buf[4096];
    model = flm_cli_resolve_model(model, model_buf, sizeof model_buf);
    char *text = cli_read_text(file);
    if (!text) return 1;
    int chunk = p.n_ctx;
    flm_error err;
    flm_ctx *ctx = NULL;
    cli_env_params(&p, model);
    if (flm_open(model, &p, &ctx, &err)) { fprintf(stderr, "flashlm: %s\n", err.msg); free(text); return 1; }
    if (cli_after_open(ctx)) { flm_close(ctx); free(text); return 1; }
    flm_ppl_result r;
    double t0 = flm_now_ms();
    int rc = 0;
    if (flm_perplexity(ctx, text, chunk, (int)chunks, progress, NULL, &r, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        rc = 1;
    } else {
        flm_stats s;
        flm_get_stats(ctx, &s);
        printf("%s: mode %s: perplexity %.4f +/- %.4f over %llu tokens (%d chunks of %d), %.1f s\n", model, s.mode,
               r.ppl, r.ppl * r.nll_stderr, (unsigned long long)r.n_scored, r.n_chunks, chunk,
               (flm_now_ms() - t0) / 1e3);
    }
    flm_close(ctx);
    free(text);
    return rc;
}
