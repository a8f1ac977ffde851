/* cmd_synth.c — `flashlm synth`: write a synthetic Llama-shaped GGUF model for benchmarks (flashlm_tools.h,
 * src/synth/synth.c, docs/SYNTH.md). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flashlm.h"
#include "flashlm_tools.h"

static const char *SYNTH_HELP =
    "usage: flashlm synth OUT.gguf [options]\n"
    "\n"
    "Write a Llama-shaped (or OPT-shaped: --arch opt) GGUF model with RANDOM weights, for benchmarks of the flash\n"
    "path.\n"
    "\n"
    "  The text such a model produces is meaningless. The file measures the system (flash I/O, memory, kernels),\n"
    "  never model quality: do not report accuracy or perplexity from it.\n"
    "\n"
    "What is realistic is the FFN's activation sparsity, the property flashlm exploits: in every layer each neuron\n"
    "fires on its own share of tokens, a few neurons are hot and most almost never fire (a power-law curve whose mean\n"
    "is --active), and gate/up rows are low rank plus noise, so a low-rank predictor can learn which neurons fire.\n"
    "See docs/SYNTH.md. With --act silu the file is a plain llama GGUF that llama.cpp loads; --act relu adds one key,\n"
    "flashlm.ffn_activation = \"relu\".\n"
    "\n"
    "shape (defaults: the standard benchmark model, about 3.1 GB in f16):\n"
    "      --arch A         llama | opt (default llama). opt: OPT's pre-LN layout (LayerNorm with bias, learned\n"
    "                       positions, biases on q/k/v/o and the FFN, ungated ReLU FFN relu(up . x + b_up)); the\n"
    "                       up biases set each neuron's firing frequency (--active); OPT 2.7B's shape is\n"
    "                       --d-model 2560 --d-ffn 10240 --heads 32 --layers 32\n"
    "      --d-model N      embedding width (default 2048)\n"
    "      --d-ffn N        FFN width: neurons per layer (default 5632)\n"
    "      --layers N       transformer blocks (default 28)\n"
    "      --heads N        attention heads; must divide --d-model (default 32)\n"
    "      --kv-heads N     key/value heads; must divide --heads (default: --heads)\n"
    "      --vocab N        vocabulary size, at least 259 (default 32000)\n"
    "      --ctx N          context length written to the metadata (default 2048)\n"
    "      --type T         f16 | f32 | bf16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 for every matrix; norms are f32\n"
    "                       (default f16). The q types need --d-model and --d-ffn to be multiples of 32\n"
    "activation statistics:\n"
    "      --act A          relu | silu (default relu)\n"
    "      --active F       mean fraction of FFN neurons active per token, (0, 0.9] (default 0.05)\n"
    "      --rank R         rank of the low-rank part of gate/up rows; 0 = none (default 64, or less when\n"
    "                       --d-model or --d-ffn is smaller)\n"
    "      --noise F        share of a gate/up row's energy outside the low-rank part, [0, 1] (default 0.1)\n"
    "      --decay F        singular values of the low-rank part fall like k^-F (default 0.5)\n"
    "      --tail S         power-law exponent of the sorted neuron frequencies (default 2)\n"
    "      --calib N        calibration tokens run through the model while it is written (default 64)\n"
    "      --seed S         random seed: the same options give the same file (default 1)\n"
    "other:\n"
    "  -t, --threads N      threads (default: all CPUs; does not change the file)\n"
    "  -f, --force          replace OUT.gguf if it exists\n"
    "      --check N        after writing, run N random tokens through the model and print the measured active\n"
    "                       fraction, hot-neuron share and rare neurons per layer (default 0: no check)\n"
    "  -h, --help           this help\n"
    "\n"
"The file is written to a unique OUT.gguf.tmp.XXXXXX and renamed when complete; nothing is left behind on error.\n";

static bool parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out) {
    long v;
    if (!cli_parse_long(s, (long)lo, (long)hi, &v)) return false;
    *out = (uint32_t)v;
    return true;
}

static bool parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

/* --type: a tensor type synth can write (one with a quantizer in the traits table), by its GGUF name. */
static bool parse_type(const char *s, uint32_t *out) {
    for (uint32_t t = 0; t < 256; t++) { /* GGUF type ids */
        const char *name = flm_type_name(t);
        if (name && flm_synth_type_ok(t) && !strcmp(s, name)) {
            *out = t;
            return true;
        }
    }
    return false;
}

/* "flashlm: bad value 'val' for opt"; returns 2 (usage error). */
static int bad_value(const char *opt, const char *val) {
    fprintf(stderr, "flashlm: bad value '%s' for %s (see flashlm synth --help)\n", val, opt);
    return 2;
}

static void print_activity(const flm_synth_activity *a, double target) {
    printf("measured on %u random tokens (a neuron is active when gate . x > 0, ungated: up . x + b_up > 0); target "
           "mean active fraction %.4f\n"
           "  active: mean fraction of active neurons; token-sd, token-max: over tokens; hot-10%%: share of all\n"
           "  activations made by the 10%% most active neurons; rare: neurons active on <= 1%% of the tokens;\n"
           "  reuse-4: share of a token's active neurons also active on one of the 4 previous tokens\n\n",
           a->n_tokens, target);
    printf("  layer   active  token-sd  token-max  hot-10%%    rare  reuse-4\n");
    for (uint32_t l = 0; l < a->n_layers; l++)
        printf("  %5u   %.4f    %.4f     %.4f    %.3f   %.3f    %.3f\n", l, a->layer_active[l], a->layer_token_sd[l],
               a->layer_token_max[l], a->layer_hot_share[l], a->layer_rare[l], a->layer_reuse[l]);
    printf("  mean    %.4f                         %.3f   %.3f    %.3f\n", a->mean_active, a->mean_hot_share,
           a->mean_rare, a->mean_reuse);
    printf("  logits: %s; max relative difference from flm_eval %.3g\n", a->finite ? "all finite" : "NOT FINITE",
           a->max_logit_diff);
}

int cli_cmd_synth(int argc, char **argv) {
    if (cli_is_help(argc, argv)) { fputs(SYNTH_HELP, stdout); return 0; }
    flm_synth_params p;
    flm_synth_params_default(&p);
    const char *out = NULL;
    bool kv_set = false, rank_set = false, force = false;
    uint32_t check = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        long v;
#define NEEDVAL() do { if (!val) return cli_die("option %s needs a value (see flashlm synth --help)", a); i++; } \
    while (0)
/* ranges are checked by flm_synth_check, which says what is wrong; here only "is it a number" */
#define U32(field) do { NEEDVAL(); if (!parse_u32(val, 0, UINT32_MAX, &(field))) return bad_value(a, val); } while (0)
#define DBL(field) do { NEEDVAL(); if (!parse_double(val, -1e300, 1e300, &(field))) return bad_value(a, val); } \
    while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(SYNTH_HELP, stdout); return 0; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--force")) force = true;
        else if (!strcmp(a, "--d-model")) U32(p.d_model);
        else if (!strcmp(a, "--arch")) {
            NEEDVAL();
            if (!strcmp(val, "llama")) p.arch = FLM_SYNTH_ARCH_LLAMA;
            else if (!strcmp(val, "opt")) p.arch = FLM_SYNTH_ARCH_OPT;
            else return cli_die("bad --arch '%s' (llama|opt)", val);
        }
        else if (!strcmp(a, "--d-ffn")) U32(p.d_ffn);
        else if (!strcmp(a, "--layers")) U32(p.n_layers);
        else if (!strcmp(a, "--heads")) U32(p.n_heads);
        else if (!strcmp(a, "--kv-heads")) { U32(p.n_kv_heads); kv_set = true; }
        else if (!strcmp(a, "--vocab")) U32(p.n_vocab);
        else if (!strcmp(a, "--ctx")) U32(p.n_ctx);
        else if (!strcmp(a, "--type")) {
            NEEDVAL();
            if (!parse_type(val, &p.type)) return cli_die("bad --type '%s' (f16|f32|bf16|q8_0|q4_0|q4_1|q5_0|q5_1)", val);
        } else if (!strcmp(a, "--act")) {
            NEEDVAL();
            if (!strcmp(val, "relu")) p.act = FLM_SYNTH_ACT_RELU;
            else if (!strcmp(val, "silu")) p.act = FLM_SYNTH_ACT_SILU;
            else return cli_die("bad --act '%s' (relu|silu)", val);
        } else if (!strcmp(a, "--active")) DBL(p.active);
        else if (!strcmp(a, "--rank")) { U32(p.rank); rank_set = true; }
        else if (!strcmp(a, "--noise")) DBL(p.noise);
        else if (!strcmp(a, "--decay")) DBL(p.decay);
        else if (!strcmp(a, "--tail")) DBL(p.tail);
        else if (!strcmp(a, "--calib")) U32(p.calib_tokens);
        else if (!strcmp(a, "--seed")) {
            NEEDVAL();
            char *end;
            errno = 0;
            p.seed = strtoull(val, &end, 10);
            if (errno || end == val || *end || val[0] == '-') return cli_die("bad --seed value '%s'", val);
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            NEEDVAL();
            if (!cli_parse_long(val, 1, 1024, &v)) return cli_die("bad -t value '%s' (1..1024)", val);
            p.n_threads = (int)v;
        } else if (!strcmp(a, "--check")) U32(check);
        else if (a[0] == '-' && a[1]) return cli_die("unknown option '%s' (see flashlm synth --help)", a);
        else if (!out) out = a;
        else return cli_die("more than one output file given ('%s'; see flashlm synth --help)", a);
#undef DBL
#undef U32
#undef NEEDVAL
    }
    if (!out) return cli_die("%s", "no output file given: flashlm synth OUT.gguf [options] (see --help)");
    if (!kv_set) p.n_kv_heads = p.n_heads;
    if (!rank_set) { /* the default rank shrinks to fit small shapes */
        if (p.d_model >= 1 && p.rank > p.d_model - 1) p.rank = p.d_model - 1;
        if (p.rank > p.d_ffn) p.rank = p.d_ffn;
    }

    flm_error err;
    if (flm_synth_check(&p, &err)) { fprintf(stderr, "flashlm: %s\n", err.msg); return 2; }
    uint64_t bytes = flm_synth_tensor_bytes(&p);
    fprintf(stderr, "flashlm: synth %s: %s, d_model %u, d_ffn %u, %u layers, %u/%u heads, vocab %u, %s, %s, active %g, "
            "rank %u, seed %" PRIu64 ": %.2f MiB of weights (random: the text it produces is meaningless)\n", out,
            p.arch == FLM_SYNTH_ARCH_OPT ? "opt" : "llama", p.d_model, p.d_ffn, p.n_layers, p.n_heads, p.n_kv_heads, p.n_vocab, flm_type_name(p.type),
            p.act == FLM_SYNTH_ACT_RELU ? "relu" : "silu", p.active, p.rank, p.seed, cli_mib(bytes));
    double t0 = cli_now_ms();
    if (!cli_may_write(out, NULL, force)) return 1;
    cli_remove_on_signal(NULL); /* the writer's temporary OUT.gguf.tmp.XXXXXX goes on a signal */
    if (flm_synth_write(out, &p, force ? FLM_OUT_REPLACE : 0u, cli_progress, NULL, &err)) { fprintf(stderr, "flashlm: %s\n", err.msg); return 1; }
    cli_remove_on_signal(NULL);
    double s = (cli_now_ms() - t0) / 1e3;
    fprintf(stderr, "flashlm: wrote %s in %.1f s (%.0f MiB/s)\n", out, s, s > 0 ? cli_mib(bytes) / s : 0.0);
    if (check) {
        flm_synth_activity act;
        if (flm_synth_measure(out, check, p.seed + 1, p.n_threads, true, &act, &err)) {
            fprintf(stderr, "flashlm: check: %s\n", err.msg);
            return 1;
        }
        print_activity(&act, p.active);
        bool ok = act.finite && act.max_logit_diff <= 1e-3;
        flm_synth_activity_free(&act);
        if (!ok) { fprintf(stderr, "flashlm: check failed\n"); return 1; }
    }
    return 0;
}
