/* cmd_calibrate.c — `flashlm calibrate`: activation rules and predictors, stored into the .flm file. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "flashlm.h"
#include "flashlm_tools.h"

static const char *CAL_HELP =
    "usage: flashlm calibrate MODEL.flm --text FILE [options]\n"
    "\n"
    "Run the model densely on the text and record each layer's FFN input. Fix each layer's activation rule: ReLU\n"
    "FFNs: activation > 0. Gated SiLU/GELU FFNs (Llama, Qwen2, Gemma 3): a neuron counts when its contribution\n"
    "|act(gate.x) * (up.x)| * ||down|| is above the layer's threshold, and a level eps sets each layer's threshold so\n"
    "that the neurons below it carry eps of the layer's output energy. Train one low-rank predictor per layer\n"
    "(balanced loss, Adam, SVD init), and set its threshold for every level on held-out tokens. Then measure held-out\n"
    "perplexity at each level, in memory, and make the most aggressive level within --max-loss of dense the default.\n"
    "Stores predictors, thresholds and levels in the .flm file (a checksummed region; the file is replaced\n"
    "atomically). Afterwards `flashlm run --mode sparse` uses them (--sparse-level picks another stored level).\n"
    "\n"
    "First (unless --no-hot) it orders every layer's FFN neurons hottest first by their summed contribution\n"
    "|h_i| ||down_i|| on the text's first --hot-tokens tokens (lossless: the model computes the same function), so\n"
    "the hot mode keeps each layer's hottest neurons in memory, reads the rest as one range, and drafts from them\n"
    "(mode auto then runs hot with the self-draft under a budget the model does not fit, unless the sparse mode\n"
    "pays more). A file already stored hottest first keeps its order; --levels-only keeps it too. The ordering\n"
    "drops stored predictors; they are trained again right after, on an ordered copy (MODEL.cal.tmp) that replaces\n"
    "the model once, atomically, when calibrated: a calibrate that fails (a full disk) leaves the model as it was.\n"
    "\n"
    "      --text FILE      calibration text (required; - for standard input), read as a stream only as far as the\n"
    "                       tokens used: --tokens, then --eval-tokens held out for the check\n"
    "      --text FILE ...  repeated (up to 16 texts): the texts in turns, --chunk tokens of each at a time, so\n"
    "                       the hot order and the predictors see every kind (prose, code, ...); e.g. --text\n"
    "                       wiki.txt --text src.c --text novel.txt\n"
    "      --no-hot         keep the neurons' order (no hot ordering; the hot mode and the self-draft need it)\n"
    "      --hot-only       only order the neurons hottest first (seconds to minutes), no predictors\n"
    "      --hot            order the neurons hottest first (the default; kept for scripts)\n"
    "      --hot-tokens N   tokens the hot order is measured on (default 1024)\n"
    "      --coact-only     on a calibrated file: store each layer's neurons so that those its predictor flags\n"
    "                       together lie together (co-activation order, lossless; the sparse mode's reads become\n"
    "                       fewer and larger), measured on --coact-tokens tokens of --text (the model in memory);\n"
    "                       predictors and FFN biases follow the order. Replaces a hot order\n"
    "      --coact-tokens N tokens the co-activation order is measured on (default 1024; the last quarter held out\n"
    "                       to measure it)\n"
    "      --tokens N       tokens to record (default 4096): 80% train the predictors, 20% set their thresholds\n"
    "      --chunk N        tokens per sequence (default 128)\n"
    "      --rank R         predictor rank (default min(128, d_model/2)); the last quarter of layers gets 2R\n"
    "      --rank-last R    rank of the last quarter of layers\n"
    "      --max-loss P     default level: the most aggressive one whose held-out perplexity is within P of dense\n"
    "                       (default 0.01, i.e. +1%: text unlike the calibration text loses more)\n"
    "      --eval-tokens N  held-out tokens for that check (default 512)\n"
    "      --levels-only    keep the stored predictors; only choose the default level again on the end of\n"
    "                       --text (with --max-loss, --eval-tokens)\n"
    "      --curve          measure every level, with the predictor and with the true active sets (oracle)\n"
    "      --level EPS      make EPS the default level instead of measuring (0 < EPS < 1, e.g. 0.02)\n"
    "      --train-level EPS  the level whose active sets the predictors learn (default 0.002)\n"
    "      --recall R       ReLU FFNs: predictor threshold for this held-out recall (default 0.95)\n"
    "      --epochs N       training epochs (default 6)\n"
    "      --mem BYTES|N%   memory budget (as for run): the model is run in hybrid mode under it, the recorded FFN\n"
    "                       inputs go to MODEL.flm.x.tmp (layers x tokens x d_model floats; removed afterwards),\n"
    "                       each layer's weights are read from the file when it is trained, and the held-out check\n"
    "                       (which holds the model in memory) runs only if it fits. Training must fit too: about\n"
    "                       tokens x (10 d_ffn + 4 d_model) bytes + the predictors; a budget that cannot hold it is\n"
    "                       refused before anything runs. The hot ordering runs under it too (hybrid mode, the\n"
    "                       inputs recorded to the same file; it holds two FFN regions of a layer while writing).\n"
    "                       Default: none (the model and all recorded inputs in memory)\n"
    "  -t, --threads N      threads\n";

int cmd_calibrate(int argc, char **argv) {
    if (cli_is_help(argc, argv)) { fputs(CAL_HELP, stdout); return 0; }
    const char *model = NULL, *text = NULL;
    const char *texts[17] = {0};
    int n_texts = 0;
    flm_calib_opts o;
    flm_calib_opts_default(&o);
    bool levels_only = false, hot_only = false, hot_flag = false, no_hot = false, coact_only = false;
    uint32_t hot_tokens = 1024, coact_tokens = 1024;
    long v;
    float f;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-') {
            if (model) return cli_die("unexpected argument '%s'", a);
            model = a;
            continue;
        }
        if (!strcmp(a, "--curve")) { o.curve = true; continue; }
        if (!strcmp(a, "--levels-only")) { levels_only = true; continue; }
        if (!strcmp(a, "--hot-only")) { hot_only = true; continue; }
        if (!strcmp(a, "--hot")) { hot_flag = true; continue; }
        if (!strcmp(a, "--no-hot")) { no_hot = true; continue; }
        if (!strcmp(a, "--coact-only")) { coact_only = true; continue; }
        if (!val) return cli_die("option %s needs a value (see flashlm calibrate --help)", a);
        i++;
        if (!strcmp(a, "--text")) {
            if (n_texts == 16) return cli_die("%s", "at most 16 --text files");
            for (int t = 0; t < n_texts; t++)
                if (!strcmp(texts[t], val)) return cli_die("--text '%s' is given twice", val);
            texts[n_texts++] = val;
            text = texts[0];
        }
        else if (!strcmp(a, "--hot-tokens")) {
            if (!cli_parse_long(val, 16, 1 << 24, &v)) return cli_die("bad --hot-tokens '%s' (16..16777216)", val);
            hot_tokens = (uint32_t)v;
        }
        else if (!strcmp(a, "--coact-tokens")) {
            if (!cli_parse_long(val, 32, 1 << 24, &v)) return cli_die("bad --coact-tokens '%s' (32..16777216)", val);
            coact_tokens = (uint32_t)v;
        }
        else if (!strcmp(a, "--tokens")) {
            if (!cli_parse_long(val, 64, 1 << 24, &v)) return cli_die("bad --tokens '%s' (64..16777216)", val);
            o.max_tokens = (uint32_t)v;
        } else if (!strcmp(a, "--chunk")) {
            if (!cli_parse_long(val, 16, 1 << 16, &v)) return cli_die("bad --chunk '%s' (16..65536)", val);
            o.chunk = (uint32_t)v;
        } else if (!strcmp(a, "--rank")) {
            if (!cli_parse_long(val, 1, 1 << 16, &v)) return cli_die("bad --rank '%s' (1..65536)", val);
            o.rank = (uint32_t)v;
        } else if (!strcmp(a, "--rank-last")) {
            if (!cli_parse_long(val, 1, 1 << 16, &v)) return cli_die("bad --rank-last '%s' (1..65536)", val);
            o.rank_last = (uint32_t)v;
        } else if (!strcmp(a, "--max-loss")) {
            if (!cli_parse_float(val, 1e-6f, 0.99f, &f)) return cli_die("bad --max-loss '%s' (0 .. 0.99)", val);
            o.max_loss = f;
        } else if (!strcmp(a, "--eval-tokens")) {
            if (!cli_parse_long(val, 0, 1 << 20, &v)) return cli_die("bad --eval-tokens '%s' (0..1048576)", val);
            o.eval_tokens = (uint32_t)v;
        } else if (!strcmp(a, "--level")) {
            if (!cli_parse_float(val, 1e-6f, 0.99f, &f)) return cli_die("bad --level '%s' (0 .. 0.99)", val);
            o.level = f;
        } else if (!strcmp(a, "--train-level")) {
            if (!cli_parse_float(val, 1e-6f, 0.99f, &f)) return cli_die("bad --train-level '%s' (0 .. 0.99)", val);
            o.train_eps = f;
        } else if (!strcmp(a, "--recall")) {
            if (!cli_parse_float(val, 0.0f, 1.0f, &f)) return cli_die("bad --recall '%s' (0 .. 1)", val);
            o.target_recall = f;
        } else if (!strcmp(a, "--epochs")) {
            if (!cli_parse_long(val, 0, 1000, &v)) return cli_die("bad --epochs '%s' (0..1000)", val);
            o.epochs = (int)v;
        } else if (!strcmp(a, "--mem")) {
            if (!flm_parse_mem(val, &o.mem_bytes, &o.mem_percent))
                return cli_die("bad --mem value '%s' (bytes with an optional K/M/G/T suffix, or N%%)", val);
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!cli_parse_long(val, 1, 1024, &v)) return cli_die("bad -t '%s' (1..1024)", val);
            o.n_threads = (int)v;
        } else return cli_die("unknown option '%s' (see flashlm calibrate --help)", a);
    }
    if (!model || !text) return cli_die("%s", "need MODEL.flm and --text FILE (see flashlm calibrate --help)");
    char model_buf[4096];
    model = cli_resolve_model(model, model_buf, sizeof model_buf);
    if (cli_blas_reserve("calibrate")) return 1;
    /* the text is read as a stream by the library, only as far as the tokens it uses (a 50 MB text or /dev/zero
     * costs what a short one does); said now if it cannot be read at all */
    for (int t = 0; t < n_texts; t++)
        if (strcmp(texts[t], "-") && access(texts[t], R_OK) != 0) {
            fprintf(stderr, "flashlm: cannot open text file '%s': %s\n", texts[t], strerror(errno));
            return 1;
        }
    if (n_texts > 1 && o.curve) return cli_die("%s", "--curve measures on one --text (give one)");
    const char *const *text_files = n_texts > 1 ? texts : NULL; /* NULL-terminated (texts[n_texts] is NULL) */
    char *buf = NULL;
    o.text_file = text;
    o.text_files = text_files;
    o.progress = cli_progress;
    char spill[4200];
    snprintf(spill, sizeof spill, "%s.x.tmp", model); /* --mem: the recorded inputs */
    cli_remove_on_signal(spill); /* and the checked writer's temporary (flm_out_remove_temporaries) */
    char ordered[4200];
    snprintf(ordered, sizeof ordered, "%s.cal.tmp", model); /* the hot-ordered copy being calibrated */
    cli_temp_register(ordered);
    flm_error err;
    flm_calib_report rep;
    double t0 = cli_now_ms();
    if (no_hot && (hot_only || hot_flag)) {
        free(buf);
        return cli_die("%s", "--no-hot excludes --hot and --hot-only");
    }
    if ((hot_flag || hot_only) && levels_only) {
        free(buf);
        return cli_die("%s", "--hot and --levels-only exclude each other (ordering drops the predictors)");
    }
    if (coact_only) {
        if (hot_only || hot_flag || levels_only) {
            free(buf);
            return cli_die("%s", "--coact-only excludes --hot, --hot-only and --levels-only");
        }
        flm_coact_opts co;
        flm_coact_opts_default(&co);
        co.max_tokens = coact_tokens;
        co.chunk = o.chunk;
        co.n_threads = o.n_threads;
        co.progress = cli_progress;
        co.text_file = text;
        co.text_files = text_files;
        flm_coact_report cr;
        flm_status cs = flm_coact_order(model, &co, &cr, &err);
        free(buf);
        if (cs) {
            fprintf(stderr, "flashlm: %s\n", err.msg);
            return 1;
        }
        printf("%s: every layer's FFN neurons stored in co-activation order (ordered on %u predicted sets) in %.1f s\n\n"
               "measured on %u held-out sets, per token over %u layers (reads as the reader plans them: 4 KiB-aligned,\n"
               "gaps below %llu bytes read through):\n\n"
               "| neurons read | order | reads | MiB |\n|---|---|---:|---:|\n", model, cr.n_order, cr.seconds,
               cr.n_held, cr.n_layers, (unsigned long long)cr.gap_bytes);
        for (int win = 0; win < 2; win++)
            for (int after = 0; after < 2; after++) {
                char what[64];
                if (win) snprintf(what, sizeof what, "not flagged on the %u previous tokens", cr.window);
                else snprintf(what, sizeof what, "every predicted neuron");
                printf("| %s | %s | %.0f | %.2f |\n", what, after ? "co-activation" : "before", cr.reads[win][after],
                       cr.mib[win][after]);
            }
        return 0;
    }
    /* the hot order: the default, except with --levels-only (which keeps the stored predictors) and --no-hot */
    if (hot_only) {
        if (flm_is_hot_ordered(model)) {
            printf("%s: its FFN neurons are already stored hottest first (kept)\n", model);
            free(buf);
            return 0;
        }
        flm_hot_opts ho;
        flm_hot_opts_default(&ho);
        ho.max_tokens = hot_tokens;
        ho.chunk = o.chunk;
        ho.n_threads = o.n_threads;
        ho.mem_bytes = o.mem_bytes;
        ho.mem_percent = o.mem_percent;
        ho.progress = cli_progress;
        ho.text_file = text;
        ho.text_files = text_files;
        flm_status hs = flm_hot_order_ex(model, NULL, &ho, &err);
        free(buf);
        if (hs) {
            fprintf(stderr, "flashlm: %s\n", err.msg);
            return 1;
        }
        printf("%s: every layer's FFN neurons stored hottest first (measured on up to %u tokens%s) in %.1f s\n", model,
               hot_tokens, o.mem_bytes || o.mem_percent > 0 ? ", under the budget" : "", (cli_now_ms() - t0) / 1e3);
        return 0;
    }
    /* whole chunks are recorded: fewer tokens than one chunk recorded none, and the error blamed the text */
    if (!levels_only && o.max_tokens < o.chunk) {
        fprintf(stderr, "flashlm: --tokens %u is less than one chunk (--chunk %u): raise --tokens or lower --chunk\n",
                o.max_tokens, o.chunk);
        return 2;
    }
    o.hot_tokens = no_hot || levels_only ? 0 : hot_tokens;
    if (levels_only && !flm_is_hot_ordered(model))
        fprintf(stderr, "flashlm: (neurons not ordered: --levels-only keeps the stored predictors; `flashlm calibrate` "
                "without it orders them and trains again)\n");
    if (flm_calib_run(model, &o, levels_only, &rep, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        free(buf);
        return 1;
    }
    if (rep.hot_order == FLM_CALIB_HOT_DONE)
        printf("%s: every layer's FFN neurons stored hottest first (measured on up to %u tokens%s), then calibrated\n",
               model, hot_tokens, o.mem_bytes || o.mem_percent > 0 ? ", under the budget" : "");
    else if (rep.hot_order == FLM_CALIB_HOT_KEPT)
        printf("%s: its FFN neurons are already stored hottest first (kept)\n", model);
    else if (rep.hot_order == FLM_CALIB_HOT_UNSUPPORTED)
        printf("%s: (neurons not ordered: the FFN has biases, which the hot order does not support yet)\n", model);
    free(buf);
    bool relu = rep.relu;
    printf("\n%s calibrated in %.1f s (%s)\n\n", model, (cli_now_ms() - t0) / 1e3,
           relu ? "ReLU: active = activation > 0"
                : "gated: active = |act(gate.x) (up.x)| ||down|| > the layer's threshold for the level");
    if (!relu) {
        printf("| level eps | oracle neurons | oracle: perplexity cost (measured) | predicted neurons | energy kept | "
               "recall | predictor: perplexity cost (measured) |\n|---:|---:|---:|---:|---:|---:|---:|\n");
        for (uint32_t k = 0; k < rep.n_levels; k++) {
            const flm_calib_level *L = &rep.levels[k];
            double of = L->oracle_frac, pf = L->pred_frac, kept = L->kept, rc = L->recall;
            char loss[64], oloss[64];
            if (isnan(L->loss)) snprintf(loss, sizeof loss, "not measured");
            else snprintf(loss, sizeof loss, "%+.2f%% (%+.2f%%)", 100.0 * L->loss, 100.0 * L->dnll);
            if (isnan(L->loss_oracle)) snprintf(oloss, sizeof oloss, "–");
            else snprintf(oloss, sizeof oloss, "%+.2f%% (%+.2f%%)", 100.0 * L->loss_oracle,
                          100.0 * L->dnll_oracle);
            printf("| %g%s | %.1f%% | %s | %.1f%% | %.1f%% | %.3f | %s |\n", (double)L->eps,
                   k == rep.default_level ? " (default)" : "", 100 * of, oloss, 100 * pf, 100 * kept, rc, loss);
        }
        if (isnan(rep.levels[0].loss) && (o.mem_bytes || o.mem_percent > 0) && o.level == 0.0f)
            printf("\n(not measured: the held-out check holds the model in memory, which --mem leaves no room for; the\n"
                   "training level is the default. `flashlm calibrate --levels-only` measures the levels where it fits)\n");
        printf("\n(neurons: share of d_ffn per token, mean over layers; the predictor's on held-out recorded tokens.\n"
               "perplexity cost on the held-out tokens after the recorded ones: exp(mean KL(dense || sparse)) - 1, which picks the\n"
               "default against --max-loss %g; in brackets the perplexity ratio - 1 on the same tokens, noisier)\n\n",
               (double)o.max_loss);
    }
    printf("| layer | rank | threshold | active (true) | predicted | recall | precision | s_agg(1) | s_agg(4) | "
           "s_agg(16) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (uint32_t l = 0; l < rep.n_layers; l++) {
        const flm_calib_layer *S = &rep.layers[l];
        printf("| %u | %u | %.4g | %.1f%% | %.1f%% | %.3f | %.3f | %.1f%% | %.1f%% | %.1f%% |\n", l, S->rank,
               (double)S->threshold, 100.0 * S->active_frac, 100.0 * S->pred_frac, S->recall, S->precision,
               100.0 * S->s_agg[0], 100.0 * S->s_agg[3], 100.0 * S->s_agg[15]);
    }
    printf("\n(at the default level eps %g; recall/precision on held-out tokens; s_agg(k): neurons predicted over k\n"
           "consecutive tokens)\n", (double)rep.levels[rep.default_level].eps);
    flm_calib_report_free(&rep);
    return 0;
}
