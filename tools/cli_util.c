#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "flashlm.h"

double cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

double cli_mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

int cli_die(const char *fmt, const char *a) {
    fprintf(stderr, "flashlm: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    return 2;
}

bool cli_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_float(const char *s, float lo, float hi, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

void cli_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)user;
    if (!isatty(2)) {
        if (done == total)
            fprintf(stderr, "flashlm: %s: %llu/%llu done\n", what, (unsigned long long)done, (unsigned long long)total);
        return;
    }
    fprintf(stderr, "\rflashlm: %s: %llu/%llu (%3.0f%%)", what, (unsigned long long)done, (unsigned long long)total,
            total ? 100.0 * (double)done / (double)total : 100.0);
    if (done == total) fprintf(stderr, "\n");
}

bool cli_is_help(int argc, char **argv) {
    return argc >= 1 && (!strcmp(argv[0], "-h") || !strcmp(argv[0], "--help"));
}

const char *CLI_MODEL_OPTS_HELP =
    "  -t, --threads N      compute threads (default: all CPUs)\n"
    "  -c, --ctx-size N     context length in tokens (default: min(model's, 2048))\n"
    "      --mem BYTES|N%   memory budget (.flm): bytes (K/M/G suffixes) or percent of the model's weight bytes;\n"
    "                       resident weights + FFN storage + KV cache + scratch must fit (default: none)\n"
    "      --mode MODE      auto | ram | naive | hybrid | sparse (default auto: ram if the model fits, else\n"
    "                       sparse when it is calibrated, else hybrid)\n"
    "                       naive: every layer's FFN read from flash for every token (the paper's baseline)\n"
    "                       hybrid: as many layers as fit stay in memory, the rest are read every token\n"
    "                       sparse: predictor + sliding window + neuron cache (needs flashlm calibrate)\n"
    "      --window K       sparse: tokens whose neurons stay cached (default: the most the budget allows)\n"
    "      --no-window      sparse ablation: read every predicted neuron every token\n"
    "      --no-bundle      sparse ablation: read up, gate and down parts as separate requests\n"
    "      --no-predictor   sparse ablation: use the true active set (an oracle; loads all gate rows, outside\n"
    "                       the budget)\n"
    "      --verify-predictor  also compute the true active set and report recall and precision\n"
    "      --io KIND        reader back end: auto | uring | threads (default auto)\n"
    "      --io-threads N   reader threads (default 32)\n"
    "      --no-direct      buffered reads instead of O_DIRECT (the page cache is still dropped after reads)\n";

int cli_parse_model_opt(int argc, char **argv, int *i, struct flm_params *p) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    long v;
    bool takes = !strcmp(a, "-t") || !strcmp(a, "--threads") || !strcmp(a, "-c") || !strcmp(a, "--ctx-size") ||
                 !strcmp(a, "--mem") || !strcmp(a, "--mode") || !strcmp(a, "--io") || !strcmp(a, "--io-threads") ||
                 !strcmp(a, "--window");
    if (!strcmp(a, "--no-direct")) { p->no_direct = true; return 1; }
    if (!strcmp(a, "--no-window")) { p->no_window = true; return 1; }
    if (!strcmp(a, "--no-bundle")) { p->no_bundle = true; return 1; }
    if (!strcmp(a, "--no-predictor")) { p->no_predictor = true; return 1; }
    if (!strcmp(a, "--verify-predictor")) { p->verify_predictor = true; return 1; }
    if (!takes) return 0;
    if (!val) { cli_die("option %s needs a value", a); return -1; }
    (*i)++;
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (!cli_parse_long(val, 1, 1024, &v)) { cli_die("bad -t value '%s' (1..1024)", val); return -1; }
        p->n_threads = (int)v;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        if (!cli_parse_long(val, 0, 1 << 20, &v)) { cli_die("bad -c value '%s'", val); return -1; }
        p->n_ctx = (int)v;
    } else if (!strcmp(a, "--mem")) {
        if (!flm_parse_mem(val, &p->mem_bytes, &p->mem_percent)) {
            cli_die("bad --mem value '%s' (bytes with an optional K/M/G suffix, or N%%)", val);
            return -1;
        }
    } else if (!strcmp(a, "--mode")) {
        if (!flm_mode_parse(val, &p->mode)) {
            cli_die("bad --mode '%s' (auto|ram|naive|hybrid|sparse)", val);
            return -1;
        }
    } else if (!strcmp(a, "--io")) {
        if (!strcmp(val, "auto")) p->io = FLM_IO_KIND_AUTO;
        else if (!strcmp(val, "uring")) p->io = FLM_IO_KIND_URING;
        else if (!strcmp(val, "threads")) p->io = FLM_IO_KIND_THREADS;
        else { cli_die("bad --io '%s' (auto|uring|threads)", val); return -1; }
    } else if (!strcmp(a, "--window")) {
        if (!cli_parse_long(val, 1, 4096, &v)) { cli_die("bad --window value '%s' (1..4096)", val); return -1; }
        p->window = (int)v;
    } else { /* --io-threads */
        if (!cli_parse_long(val, 1, 1024, &v)) { cli_die("bad --io-threads value '%s'", val); return -1; }
        p->io_threads = (int)v;
    }
    return 1;
}

char *cli_read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "flashlm: cannot open text file '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    char *text = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
        text = malloc((size_t)n + 1);
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "flashlm: cannot read text file '%s'\n", path);
        free(text);
        text = NULL;
    } else {
        text[n] = 0;
    }
    fclose(f);
    return text;
}

/* The one piece of process-wide state in the CLI: the temporary file to remove if the user interrupts a long write
 * (the library removes it on every error it sees; a signal it cannot see). */
static char cleanup_path[4096];

static void on_signal(int sig) {
    if (cleanup_path[0]) unlink(cleanup_path);
    signal(sig, SIG_DFL);
    raise(sig);
}

void cli_remove_on_signal(const char *path) {
    snprintf(cleanup_path, sizeof cleanup_path, "%s", path ? path : "");
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
}

bool cli_may_write(const char *path, bool force) {
    struct stat st;
    if (force || stat(path, &st) != 0) return true;
    fprintf(stderr, "flashlm: %s already exists; use --force to replace it\n", path);
    return false;
}

const char *flm_cli_resolve_model(const char *arg, char *buf, size_t cap) {
    struct stat st;
    if (!arg || stat(arg, &st) == 0 || !flm_pull_is_known(arg)) return arg;
    return flm_pull(arg, NULL, buf, cap) == 0 ? buf : arg;
}
