/* cmd_calibrate.c — `flashlm calibrate`: activation rules and predictors, stored into the .flm file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flashlm.h"
#include "calibrate/calibrate.h"
#include "sparsity/sparsity.h"

static const char *CAL_HELP =
    "usage: flashlm calibrate MODEL.flm --text FILE [options]\n"
    "\n"
    "Run the model densely on the text, record each layer's FFN input and its true active neurons, fix the activation\n"
    "rule (ReLU FFNs: activation > 0; SiLU FFNs: |silu(gate . x)| above a per-layer threshold set for --sparsity),\n"
    "train one low-rank predictor per layer (balanced loss, Adam, SVD init, a held-out split), and store predictors\n"
    "and thresholds in the .flm file (a new checksummed region; the file is replaced atomically). Prints per-layer\n"
    "recall and precision on the held-out tokens. Afterwards `flashlm run --mode sparse` uses them.\n"
    "\n"
    "      --text FILE      calibration text (required)\n"
    "      --tokens N       tokens to record (default 4096)\n"
    "      --chunk N        tokens per sequence (default 128)\n"
    "      --rank R         predictor rank (default min(128, d_model/2)); the last quarter of layers gets 2R\n"
    "      --rank-last R    rank of the last quarter of layers\n"
    "      --sparsity S     SiLU models: share of neurons the thresholds zero (default 0.5)\n"
    "      --recall R       predictor threshold chosen for this held-out recall (default 0.95; 0 = logit 0)\n"
    "      --epochs N       training epochs (default 6)\n"
    "  -t, --threads N      threads\n";

int cmd_calibrate(int argc, char **argv) {
    if (cli_is_help(argc, argv)) { fputs(CAL_HELP, stdout); return 0; }
    const char *model = NULL, *text = NULL;
    flm_calib_opts o;
    flm_calib_opts_default(&o);
    long v;
    float f;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-') {
            if (model) return cli_die("unexpected argument '%s'", a);
            model = a;
            continue;
        }
        if (!val) return cli_die("option %s needs a value (see flashlm calibrate --help)", a);
        i++;
        if (!strcmp(a, "--text")) text = val;
        else if (!strcmp(a, "--tokens")) {
            if (!cli_parse_long(val, 64, 1 << 24, &v)) return cli_die("bad --tokens '%s' (>= 64)", val);
            o.max_tokens = (uint32_t)v;
        } else if (!strcmp(a, "--chunk")) {
            if (!cli_parse_long(val, 16, 1 << 16, &v)) return cli_die("bad --chunk '%s' (>= 16)", val);
            o.chunk = (uint32_t)v;
        } else if (!strcmp(a, "--rank")) {
            if (!cli_parse_long(val, 1, 1 << 16, &v)) return cli_die("bad --rank '%s'", val);
            o.rank = (uint32_t)v;
        } else if (!strcmp(a, "--rank-last")) {
            if (!cli_parse_long(val, 1, 1 << 16, &v)) return cli_die("bad --rank-last '%s'", val);
            o.rank_last = (uint32_t)v;
        } else if (!strcmp(a, "--sparsity")) {
            if (!cli_parse_float(val, 0.0f, 0.99f, &f)) return cli_die("bad --sparsity '%s' (0 .. 0.99)", val);
            o.sparsity = f;
        } else if (!strcmp(a, "--recall")) {
            if (!cli_parse_float(val, 0.0f, 1.0f, &f)) return cli_die("bad --recall '%s' (0 .. 1)", val);
            o.target_recall = f;
        } else if (!strcmp(a, "--epochs")) {
            if (!cli_parse_long(val, 0, 1000, &v)) return cli_die("bad --epochs '%s'", val);
            o.epochs = (int)v;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!cli_parse_long(val, 1, 1024, &v)) return cli_die("bad -t '%s'", val);
            o.n_threads = (int)v;
        } else return cli_die("unknown option '%s' (see flashlm calibrate --help)", a);
    }
    if (!model || !text) return cli_die("%s", "need MODEL.flm and --text FILE (see flashlm calibrate --help)");
    char model_buf[4096];
    model = flm_cli_resolve_model(model, model_buf, sizeof model_buf);
    if (cli_blas_reserve("calibrate")) return 1;
    char *buf = cli_read_text(text);
    if (!buf) return 1;
    o.text = buf;
    o.progress = cli_progress;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", model);
    cli_remove_on_signal(tmp);
    flm_error err;
    flm_sparsity rep;
    double t0 = flm_now_ms();
    if (flm_calibrate(model, &o, &rep, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        free(buf);
        return 1;
    }
    free(buf);
    printf("\n%s calibrated in %.1f s (%s)\n\n", model, (flm_now_ms() - t0) / 1e3,
           rep.layers[0].rule == FLM_RULE_RELU ? "ReLU: active = activation > 0"
                                               : "SiLU/CATS: active = |silu(gate.x)| > threshold");
    printf("| layer | rank | threshold | active (true) | predicted | recall | precision | s_agg(1) | s_agg(4) | "
           "s_agg(16) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (uint32_t l = 0; l < rep.n_layers; l++) {
        const flm_layer_sparsity *S = &rep.layers[l];
        printf("| %u | %u | %.4g | %.1f%% | %.1f%% | %.3f | %.3f | %.1f%% | %.1f%% | %.1f%% |\n", l, S->pred.rank,
               (double)S->threshold, 100.0 * S->active_frac, 100.0 * S->pred_frac, S->recall, S->precision,
               100.0 * S->s_agg[0], 100.0 * S->s_agg[3], 100.0 * S->s_agg[15]);
    }
    printf("\n(recall/precision on held-out tokens; s_agg(k): neurons predicted over k consecutive tokens)\n");
    flm_sparsity_free(&rep);
    return 0;
}
