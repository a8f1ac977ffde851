#include <cblas.h>
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <sched.h>
#include <math.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "flashlm.h"
#include "flashlm_tools.h"

double cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

cli_size_str cli_size(uint64_t b) {
    cli_size_str r;
    if (b < 1024) snprintf(r.s, sizeof r.s, "%llu bytes", (unsigned long long)b);
    else if (b < (1ull << 20)) snprintf(r.s, sizeof r.s, "%.2f KiB", (double)b / 1024.0);
    else if (b < (1ull << 30)) snprintf(r.s, sizeof r.s, "%.2f MiB", (double)b / 1048576.0);
    else snprintf(r.s, sizeof r.s, "%.2f GiB", (double)b / 1073741824.0);
    return r;
}

/* An address-space limit (ulimit -v) is in force. */
static bool cli_address_space_limited(void) {
    struct rlimit rl;
    return getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY;
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
    if (errno == ERANGE && fabsf(v) <= FLT_MIN) errno = 0; /* an underflow ("1e-50") is that small value, not an error */
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

/* Progress of long work on stderr. On a terminal: one line redrawn in place. Otherwise (a log, a pipe): a line every
 * 5 s. Both give the rate's ETA, and each phase ends with a line giving its time. */
void cli_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)user;
    static char phase[96];
    static double t_start, t_last;
    double now = cli_now_ms();
    if (strncmp(phase, what, sizeof phase - 1) != 0) { /* a new phase */
        snprintf(phase, sizeof phase, "%s", what);
        t_start = now;
        t_last = now;
    }
    double el = (now - t_start) / 1e3;
    double eta = done && done < total ? el * (double)(total - done) / (double)done : 0;
    double pct = total ? 100.0 * (double)done / (double)total : 100.0;
    if (done >= total) {
        fprintf(stderr, "%sflashlm: %s: %llu/%llu done in %.1f s\n", isatty(2) ? "\r\033[K" : "", what,
                (unsigned long long)done, (unsigned long long)total, el);
        phase[0] = 0;
        return;
    }
    if (isatty(2)) {
        fprintf(stderr, "\r\033[Kflashlm: %s: %llu/%llu (%3.0f%%), %.0f s, ETA %.0f s", what,
                (unsigned long long)done, (unsigned long long)total, pct, el, eta);
    } else if (now - t_last >= 5000.0) {
        fprintf(stderr, "flashlm: %s: %llu/%llu (%.0f%%), %.0f s, ETA %.0f s\n", what, (unsigned long long)done,
                (unsigned long long)total, pct, el, eta);
        t_last = now;
    }
}

static int verbose_marker; /* log_user points here when debug messages are wanted */

static void log_to_stderr(void *user, flm_log_level level, const char *msg) {
    if (level == FLM_LOG_DEBUG && user != &verbose_marker) return;
    fprintf(stderr, "flashlm: %s%s\n", level == FLM_LOG_ERROR ? "error: " : "", msg);
}

static bool plan_verbose; /* cli_after_open prints the plan (run --stats, -v) */

void cli_log_verbose(flm_params *p, bool on) {
    p->log_user = on ? &verbose_marker : NULL;
    plan_verbose = on;
}

/* the budget per device: what each holds of the total, and of it the block its backend carves (KV cache,
 * activations) */
static void print_devices(const flm_plan_info *p) {
    for (uint32_t i = 0; i < p->n_devices && i < FLM_PLAN_DEVICES_MAX; i++) {
        const flm_plan_device *d = &p->device[i];
        char block[96] = "no block: the backend computes on another device";
        if (d->block)
            snprintf(block, sizeof block, "of it the backend's block %.2f MiB (KV cache, activations)",
                     cli_mib(d->block));
        fprintf(stderr, "flashlm: plan:   device %-9s %10.2f MiB  %s\n", d->name, cli_mib(d->bytes), block);
    }
}

void cli_print_plan(const flm_plan_info *p) {
    char head[64] = "none";
    if (p->budget) snprintf(head, sizeof head, "%.2f MiB", cli_mib(p->budget));
    fprintf(stderr, "flashlm: plan: mode %s, budget %s, model %.2f MiB; planned %.2f MiB:\n", flm_mode_name(p->mode),
            head, cli_mib(p->model_bytes), cli_mib(p->total));
    fprintf(stderr, "flashlm: plan:   why              %s\n", p->reason);
    fprintf(stderr, "flashlm: plan:   resident weights %10.2f MiB  attention, norms%s, tokenizer%s\n",
            cli_mib(p->resident), !p->out_flash_bytes ? ", output" : p->out_rows_resident ? ", output's first rows" : "",
            p->embd == FLM_PLAN_EMBD_FLASH ? "" : ", token embedding");
    switch (p->embd) {
    case FLM_PLAN_EMBD_FLASH:
        fprintf(stderr, "flashlm: plan:   token embedding  %10.2f MiB  on flash, not in memory: one %llu-byte row read "
                "per token\n", cli_mib(p->embd_bytes), (unsigned long long)p->embd_row);
        break;
    case FLM_PLAN_EMBD_MEMORY:
        if (p->gguf) break;
        fprintf(stderr, "flashlm: plan:   token embedding  %10.2f MiB  in memory (in the resident weights): mode %s "
                "keeps it\n", cli_mib(p->embd_bytes), flm_mode_name(p->mode));
        break;
    case FLM_PLAN_EMBD_TIED:
        fprintf(stderr, "flashlm: plan:   token embedding  %10.2f MiB  in memory (in the resident weights): it is "
                "also the output classifier\n", cli_mib(p->embd_bytes));
        break;
    case FLM_PLAN_EMBD_UNSPLIT:
        fprintf(stderr, "flashlm: plan:   token embedding  %10.2f MiB  in memory (in the resident weights): this file "
                "predates the split resident region; convert it again to leave the embedding on flash\n",
                cli_mib(p->embd_bytes));
        break;
    }
    if (p->out_flash_bytes)
        fprintf(stderr, "flashlm: plan:   classifier       %10.2f MiB  on flash, not in memory: read every pass, %.2f "
                "MiB a request (its first %u rows in memory)\n", cli_mib(p->out_flash_bytes), cli_mib(p->out_chunk),
                p->out_rows_resident);
    fprintf(stderr, "flashlm: plan:   KV cache         %10.2f MiB  %s, %u tokens x %u layers x %u keys and values\n",
            cli_mib(p->kv), p->kv_elem_bytes == 2 ? "f16" : "f32 (--kv-f32)", p->n_ctx, p->n_layers, p->kv_dim);
    fprintf(stderr, "flashlm: plan:   scratch          %10.2f MiB  activations (batches of %u tokens, -b), FFN "
            "accumulators, tokenizer, statistics, compute threads\n", cli_mib(p->scratch), p->n_batch);
    if (p->gguf) {
        fprintf(stderr, "flashlm: plan:   FFN in memory    %10.2f MiB  all layers, in the resident weights (a GGUF "
                "file)\n", 0.0);
        print_devices(p);
        return;
    }
    fprintf(stderr, "flashlm: plan:   reader           %10.2f MiB  bounce buffers (%.2f MiB), request queues, threads\n",
            cli_mib(p->reader), cli_mib(p->reader_bounce));
    if (p->mode == FLM_MODE_SPARSE) {
        fprintf(stderr, "flashlm: plan:   predictors       %10.2f MiB\n", cli_mib(p->predictors));
        fprintf(stderr, "flashlm: plan:   neuron caches    %10.2f MiB  all layers (the rest of the budget)\n",
                cli_mib(p->cache));
        fprintf(stderr, "flashlm: plan:   stream buffer    %10.2f MiB  neurons past a layer's cache, batches' sets\n",
                cli_mib(p->stream));
    } else if (p->mode == FLM_MODE_HOT) {
        char stream[96] = "";
        if (p->stream)
            snprintf(stream, sizeof stream, " + %s %.2f MiB",
                     p->n_stream_buffers == 2 ? "two range buffers (read-ahead)" : "the range buffer", cli_mib(p->stream));
        char win[160] = "";
        if (p->window)
            snprintf(win, sizeof win, " + a draft window of the %.1f%% most recently active streamed neurons "
                     "and the draft's correction (%.2f MiB)", 100.0 * p->window_share, cli_mib(p->window));
        fprintf(stderr, "flashlm: plan:   FFN in memory    %10.2f MiB  the hottest %.1f%% of every layer's neurons "
                "(%.2f MiB)%s%s\n", cli_mib(p->ffn_resident + p->stream), 100.0 * p->hot_share,
                cli_mib(p->ffn_resident - p->window), win, stream);
        if (p->stream)
            fprintf(stderr, "flashlm: plan:   (the other %.1f%% of each layer is read as one range per pass; a "
                    "self-draft, --draft-self, computes from the hot share%s)\n", 100.0 * (1.0 - p->hot_share),
                    p->window ? " and the window alone, and adds the mean of what the rest added lately" : " alone");
    } else {
        char stream[96] = "";
        if (p->stream)
            snprintf(stream, sizeof stream, " + %s %.2f MiB",
                     p->n_stream_buffers == 2 ? "two streamed-layer buffers (read-ahead)" : "the streamed layers' buffer",
                     cli_mib(p->stream));
        fprintf(stderr, "flashlm: plan:   FFN in memory    %10.2f MiB  %u of %u layers resident (%.2f MiB)%s\n",
                cli_mib(p->ffn_resident + p->stream), p->n_resident_layers, p->n_layers, cli_mib(p->ffn_resident),
                stream);
    }
    if (p->self_draft)
        fprintf(stderr, "flashlm: plan:   self-draft       %10.2f MiB  speculative decoding's buffers: a tree of %d "
                "nodes, %d deep (mode auto runs hot; --no-draft: none)\n", cli_mib(p->spec), p->draft_tree,
                p->draft_depth);
    print_devices(p);
}

void cli_print_plan_line(const char *label, const flm_plan_info *p) {
    char head[64] = "none";
    if (p->budget) snprintf(head, sizeof head, "%.2f MiB", cli_mib(p->budget));
    char spec[96] = "";
    if (p->self_draft)
        snprintf(spec, sizeof spec, " + self-draft %.2f (tree %d, depth %d)", cli_mib(p->spec), p->draft_tree,
                 p->draft_depth);
    fprintf(stderr, "flashlm: plan %s: mode %s, budget %s: resident %.2f + FFN %.2f + KV %.2f + scratch %.2f%s MiB = "
            "%.2f MiB (%s)\n", label, flm_mode_name(p->mode), head, cli_mib(p->resident),
            cli_mib(p->ffn_resident + p->stream + p->predictors + p->cache), cli_mib(p->kv),
            cli_mib(p->scratch + p->reader), spec, cli_mib(p->total), p->reason);
}

static int g_threads_asked;   /* -t N as given (0: not given) */
static bool g_threads_force;  /* --threads-force: keep -t N above the cores */

int cli_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void cli_env_params(flm_params *p, const char *model) {
    /* more compute threads than cores only take turns on them: each product waits for its slowest chunk, whose
     * thread waits for a core (-t 64 on 2 cores made a prompt 20x slower than -t 1; -t 512 never reached its first
     * token). Clamped, said once; --threads-force keeps the count. */
    const int cores = cli_cores();
    if (g_threads_asked > cores && p->n_threads == g_threads_asked && !g_threads_force) {
        static bool said;
        if (!said)
            fprintf(stderr, "flashlm: -t %d is more than the %d cores this process may run on: using %d "
                    "(--threads-force keeps %d; the threads would take turns on the cores)\n", g_threads_asked, cores,
                    cores, g_threads_asked);
        said = true;
        p->n_threads = cores;
    } else if (g_threads_asked > cores && p->n_threads == g_threads_asked) {
        static bool said_forced;
        if (!said_forced)
            fprintf(stderr, "flashlm: warning: -t %d with --threads-force on %d cores: the threads will take turns "
                    "(slower, not faster)\n", g_threads_asked, cores);
        said_forced = true;
    }
    p->log = log_to_stderr;
    p->log_user = NULL;
    static char probe[4096];
    struct stat sb;
    if (model && snprintf(probe, sizeof probe, "%s.probe.json", model) < (int)sizeof probe && stat(probe, &sb) == 0)
        p->io_cost_path = probe;
}

void cli_blas_single_thread(char **argv) {
    bool again = false;
    /* Always 1, whatever the environment says: OpenBLAS starts OPENBLAS_NUM_THREADS - 1 workers before main, and
     * under an address-space limit (ulimit -v) a worker that cannot get its buffer retries forever, so exit hung
     * joining it (issue 12). Nothing here gains from BLAS threads: the sparse predictor runs single-threaded best,
     * and calibrate's training raises the count to -t itself for the call (flm_predictor_train). */
    const char *blas = getenv("OPENBLAS_NUM_THREADS");
    if ((!blas || strcmp(blas, "1") != 0) && setenv("OPENBLAS_NUM_THREADS", "1", 1) == 0) again = true;
    /* OpenMP threads that wait at a barrier spin for ~300000 iterations by default (libgomp): on a machine whose
     * cores are shared with other work, a spinning thread holds the core the straggler needs, and a 2-thread decode
     * fell from 64 to 4 tokens/s under load (SmolLM2, this project's VM). A short spin keeps the fast hand-off on
     * an idle machine and yields the core otherwise. The user's own OMP_WAIT_POLICY / GOMP_SPINCOUNT win. The token
     * loop's products run on the library's own pool (FLASHLM_SPIN_US); OpenMP is left to calibrate, synth, the context
     * shift and FLASHLM_THREADS=omp. */
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT") && setenv("GOMP_SPINCOUNT", "10000", 1) == 0)
        again = true;
    if (again) execv("/proc/self/exe", argv); /* on failure (no /proc): go on with the defaults */
}

int cli_blas_reserve(const char *who) {
    static bool done;
    if (done || !cli_address_space_limited()) return 0;
    /* OpenBLAS maps a 128 MiB work buffer per thread on first use and, when the mapping fails, retries forever:
     * check that it (and some room after it) fits now, then make OpenBLAS take its buffer, which it keeps. */
    const size_t need = (size_t)144 << 20;
    void *p = mmap(NULL, need, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        struct rlimit rl;
        getrlimit(RLIMIT_AS, &rl);
        fprintf(stderr, "flashlm: %s uses OpenBLAS, whose 128 MiB work buffer does not fit under this process's "
                "address-space limit (ulimit -v %llu KiB); raise the limit%s\n", who,
                (unsigned long long)(rl.rlim_cur / 1024), strstr(who, "sparse") ? " or use --mode hybrid" : "");
        return 1;
    }
    munmap(p, need);
    const int n = 128; /* large enough to take OpenBLAS's buffered path, not its small-matrix one */
    float *a = calloc((size_t)3 * n * n, sizeof *a);
    if (!a) { fprintf(stderr, "flashlm: out of memory\n"); return 1; }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, a + n * n, n, 0.0f, a + 2 * n * n, n);
    free(a);
    done = true;
    return 0;
}

int cli_after_open(const flm_ctx *ctx) {
    flm_model_info in;
    flm_get_info(ctx, &in);
    flm_plan_info plan;
    flm_get_plan(ctx, &plan);
    if (plan_verbose && !plan.gguf) cli_print_plan(&plan); /* what the budget holds, one line per part */
    /* a context longer than the model was trained for: it runs (RoPE has no hard limit), but say so once */
    if (in.n_ctx_train && in.n_ctx > in.n_ctx_train)
        fprintf(stderr, "flashlm: warning: -c %u is longer than the %u tokens the model was trained on; positions "
                "beyond %u are untrained and the text will likely degrade there\n", in.n_ctx, in.n_ctx_train,
                in.n_ctx_train);
    return 0; /* (the sparse mode predicts with the runtime's own kernels: no BLAS buffer to reserve) */
}

void cli_note_unused(const flm_ctx *ctx, const flm_params *p, const cli_shift_opts *shift) {
    flm_plan_info plan;
    flm_get_plan(ctx, &plan);
    /* every option given that this run does not use, each named (not only the first) */
    const struct { bool given; const char *name; } sparse_only[] = {
        {p->window != 0, "--window"}, {p->sparse_level > 0, "--sparse-level"}, {p->no_window, "--no-window"},
        {p->no_bundle, "--no-bundle"}, {p->no_predictor, "--no-predictor"},
        {p->verify_predictor, "--verify-predictor"}, {p->window_keep_rejected, "--window-keep-rejected"}};
    for (size_t i = 0; plan.mode != FLM_MODE_SPARSE && i < sizeof sparse_only / sizeof *sparse_only; i++)
        if (sparse_only[i].given)
            fprintf(stderr, "flashlm: note: %s is an option of mode sparse; this run is mode %s, which does not use "
                    "it\n", sparse_only[i].name, flm_mode_name(plan.mode));
    const struct { bool given; const char *name; } flash_only[] = {
        {p->io != FLM_IO_KIND_AUTO, "--io"}, {p->io_threads != 32, "--io-threads"}, /* flm_params_default's */
        {p->no_direct, "--no-direct"}, {p->no_read_ahead, "--no-read-ahead"},
        {p->no_verify_reads, "--no-verify-reads"}};
    for (size_t i = 0; (plan.gguf || plan.mode == FLM_MODE_RAM) && i < sizeof flash_only / sizeof *flash_only; i++)
        if (flash_only[i].given)
            fprintf(stderr, "flashlm: note: %s is about reads from flash; this run is mode ram, which reads nothing "
                    "from flash after loading\n", flash_only[i].name);
    if (g_threads_force && g_threads_asked <= cli_cores())
        fprintf(stderr, "flashlm: note: --threads-force only matters with -t above the %d cores; %s\n", cli_cores(),
                g_threads_asked ? "-t is within them" : "no -t was given");
    if (shift && !shift->on && shift->keep != CLI_KEEP_DEFAULT)
        fprintf(stderr, "flashlm: note: --keep only matters with --context-shift, which is off: a full context stops "
                "generation\n");
}

bool cli_is_help(int argc, char **argv) {
    return argc >= 1 && (!strcmp(argv[0], "-h") || !strcmp(argv[0], "--help"));
}

const char *CLI_MODEL_OPTS_HELP =
    "  -t, --threads N      compute threads (default: all CPUs); more than the cores this process may run on is\n"
    "                       lowered to them, with a note\n"
    "      --threads-force  keep -t N above the cores (the threads take turns on them)\n"
    "  -c, --ctx-size N     context length in tokens (default and 0: min(model's, 2048))\n"
    "  -b, --batch-size N   tokens per batched forward pass (prompts, draft verification; default 256): each\n"
    "                       weight is read once per batch; its activations count in the memory budget\n"
    "      --mem BYTES|N%   memory budget: bytes (K/M/G/T suffixes: powers of 1024) or percent of the model's\n"
    "                       weight bytes; resident weights + FFN storage + KV cache + scratch must fit, and peak\n"
    "                       RSS stays within it + 16 MiB for the process itself. 0 = no budget (the default)\n"
    "      --mode MODE      auto | ram | naive | hybrid | sparse | hot (default auto: ram if the model fits,\n"
    "                       else sparse when it is calibrated and pays, else hot with the self-draft when\n"
    "                       its neurons are stored hottest first, else hybrid; flashlm plan says which)\n"
    "                       naive: every layer's FFN read from flash for every token (the paper's baseline)\n"
    "                       hybrid: as many layers as fit stay in memory, the rest are read every token\n"
    "                       sparse: predictor + sliding window + neuron cache (needs flashlm calibrate)\n"
    "                       hot: every layer's hottest neurons stay in memory, the rest is read as one\n"
    "                       range per pass (a file flashlm calibrate stored hottest first)\n"
    "      --window K       sparse: tokens whose neurons stay cached (default: the most the budget allows)\n"
    "      --sparse-level EPS  sparse: run at this stored level instead of calibrate's default (the levels and\n"
    "                       their measured quality are printed by calibrate)\n"
    "      --no-window      sparse ablation: read every predicted neuron every token\n"
    "      --no-bundle      sparse ablation: read up, gate and down parts as separate requests\n"
    "      --no-read-ahead  ablation: read each streamed layer (naive/hybrid) or chunk of streamed neurons (sparse)\n"
    "                       when needed, not while the previous one is computed\n"
    "      --no-predictor   sparse ablation: use the true active set (an oracle; loads all gate rows, outside\n"
    "                       the budget)\n"
    "      --verify-predictor  also compute the true active set and report recall and precision\n"
    "      --window-keep-rejected  sparse: keep rejected draft tokens' neurons in the window (default: only the\n"
    "                       accepted tokens' stay)\n"
    "      --io KIND        reader back end: auto | uring | threads (default auto)\n"
    "      --io-threads N   reader threads (default 32)\n"
    "      --no-direct      buffered reads instead of O_DIRECT (the page cache is still dropped after reads)\n"
    "      --no-verify-reads  do not check reads from flash against the file's record sums (default: every FFN\n"
    "                       record and embedding row read is hashed and compared before use; a mismatch is read\n"
    "                       again once, then an error naming the layer and record); for measuring without it\n"
    "      --kv-f32         f32 keys, values and attention weights (default: an f16 KV cache, half the memory,\n"
    "                       as llama.cpp's)\n";

/* Why flm_parse_mem refused s, in words. */
static const char *cli_mem_problem(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || isnan(v)) return "not a number";
    if (v < 0) return "negative";
    if (errno == ERANGE || isinf(v)) return "too large";
    if (!strcmp(end, "%")) return "a percentage must be above 0 and at most 100000";
    double mul = 1;
    if (*end) {
        const char *u = strchr("kKmMgGtT", *end);
        if (!u || !*end) return "unknown unit (K, M, G or T)";
        mul = (double)(1ull << (10 * (1 + (int)(strchr("kmgt", (char)(*end | 0x20)) - "kmgt"))));
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (*end) return "unknown unit (K, M, G or T)";
    }
    if (v * mul > 9.0e18) return "too large: it overflows 64-bit byte counts (at most about 8 EiB)";
    if (v * mul < 1) return "less than one byte";
    return "not understood";
}

int cli_parse_model_opt(int argc, char **argv, int *i, struct flm_params *p) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    long v;
    bool takes = !strcmp(a, "-t") || !strcmp(a, "--threads") || !strcmp(a, "-c") || !strcmp(a, "--ctx-size") ||
                 !strcmp(a, "-b") || !strcmp(a, "--batch-size") ||
                 !strcmp(a, "--mem") || !strcmp(a, "--mode") || !strcmp(a, "--io") || !strcmp(a, "--io-threads") ||
                 !strcmp(a, "--window") || !strcmp(a, "--sparse-level");
    if (!strcmp(a, "--threads-force")) { g_threads_force = true; return 1; }
    if (!strcmp(a, "--no-direct")) { p->no_direct = true; return 1; }
    if (!strcmp(a, "--no-verify-reads")) { p->no_verify_reads = true; return 1; }
    if (!strcmp(a, "--kv-f32")) { p->kv_f32 = true; return 1; }
    if (!strcmp(a, "--no-window")) { p->no_window = true; return 1; }
    if (!strcmp(a, "--no-bundle")) { p->no_bundle = true; return 1; }
    if (!strcmp(a, "--no-read-ahead")) { p->no_read_ahead = true; return 1; }
    if (!strcmp(a, "--no-predictor")) { p->no_predictor = true; return 1; }
    if (!strcmp(a, "--verify-predictor")) { p->verify_predictor = true; return 1; }
    if (!strcmp(a, "--window-keep-rejected")) { p->window_keep_rejected = true; return 1; }
    if (!takes) return 0;
    if (!val) { cli_die("option %s needs a value", a); return -1; }
    (*i)++;
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (!cli_parse_long(val, 1, 1024, &v)) { cli_die("bad -t value '%s' (1..1024)", val); return -1; }
        p->n_threads = (int)v;
        g_threads_asked = (int)v; /* checked against the cores in cli_env_params, once --threads-force is known */
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        if (!cli_parse_long(val, 0, 1 << 20, &v)) {
            cli_die("bad -c value '%s' (0..1048576; 0: the default)", val);
            return -1;
        }
        p->n_ctx = (int)v;
    } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
        if (!cli_parse_long(val, 1, 65536, &v)) { cli_die("bad -b value '%s' (1..65536)", val); return -1; }
        p->n_batch = (int)v;
    } else if (!strcmp(a, "--mem")) {
        if (!flm_parse_mem(val, &p->mem_bytes, &p->mem_percent)) {
            fprintf(stderr, "flashlm: bad --mem value '%s': %s (bytes with an optional K/M/G/T suffix, N%% of the "
                    "model's weights, or 0 for no budget)\n", val, cli_mem_problem(val));
            return -1;
        }
    } else if (!strcmp(a, "--mode")) {
        if (!flm_mode_parse(val, &p->mode)) {
            cli_die("bad --mode '%s' (auto|ram|naive|hybrid|sparse|hot)", val);
            return -1;
        }
    } else if (!strcmp(a, "--io")) {
        if (!strcmp(val, "auto")) p->io = FLM_IO_KIND_AUTO;
        else if (!strcmp(val, "uring")) p->io = FLM_IO_KIND_URING;
        else if (!strcmp(val, "threads")) p->io = FLM_IO_KIND_THREADS;
        else { cli_die("bad --io '%s' (auto|uring|threads)", val); return -1; }
    } else if (!strcmp(a, "--sparse-level")) {
        float f;
        if (!cli_parse_float(val, 1e-6f, 0.99f, &f)) { cli_die("bad --sparse-level '%s' (0 .. 0.99)", val); return -1; }
        p->sparse_level = f;
    } else if (!strcmp(a, "--window")) {
        if (!cli_parse_long(val, 1, 4096, &v)) { cli_die("bad --window value '%s' (1..4096)", val); return -1; }
        p->window = (int)v;
    } else { /* --io-threads */
        if (!cli_parse_long(val, 1, 1024, &v)) { cli_die("bad --io-threads value '%s' (1..1024)", val); return -1; }
        p->io_threads = (int)v;
    }
    return 1;
}

char *cli_read_text_max(const char *path, size_t max, size_t *len_out, bool *too_long) {
    bool in = !strcmp(path, "-");
    *too_long = false;
    FILE *f = in ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "flashlm: cannot open text file '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (!in && fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) { /* fopen opens a folder; its reads fail */
        fprintf(stderr, "flashlm: cannot read text file '%s': it is a directory\n", path);
        fclose(f);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0, n;
    char *text = malloc(cap + 1);
    while (text && len <= max && (n = fread(text + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len > max) { *too_long = true; break; } /* one byte past the bound is enough to know */
        if (len == cap) {
            size_t want = cap * 2 < max + 1 ? cap * 2 : max + 1;
            char *more = realloc(text, want + 1);
            if (!more) { free(text); text = NULL; break; }
            text = more;
            cap = want;
        }
    }
    if (*too_long) {
        free(text);
        text = NULL;
    } else if (!text || ferror(f)) {
        fprintf(stderr, "flashlm: cannot read text file '%s': %s\n", in ? "(standard input)" : path,
                text ? strerror(errno) : "out of memory");
        free(text);
        text = NULL;
    } else {
        text[len] = 0;
        *len_out = len;
    }
    if (!in) fclose(f);
    return text;
}

char *cli_unescape(const char *s, size_t *len) {
    size_t n = strlen(s), o = 0;
    char *out = malloc(n + 1);
    if (!out) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) { out[o++] = s[i]; continue; }
        char c = s[++i];
        switch (c) {
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case '\'': case '"': case '\\': out[o++] = c; break;
        default:
            if (c == 'x' && i + 2 < n && isxdigit((unsigned char)s[i + 1]) && isxdigit((unsigned char)s[i + 2])) {
                char hex[3] = {s[i + 1], s[i + 2], 0};
                out[o++] = (char)strtol(hex, NULL, 16);
                i += 2;
            } else { /* not an escape: kept as it is, backslash included */
                out[o++] = '\\';
                out[o++] = c;
            }
        }
    }
    out[o] = 0;
    *len = o;
    return out;
}

size_t cli_prompt_max_bytes(const flm_ctx *ctx, uint32_t n_ctx, size_t *per_token) {
    size_t longest = 1;
    for (uint32_t id = 0, n = flm_vocab_size(ctx); id < n; id++) {
        size_t len, t = strlen(flm_token_text(ctx, (int32_t)id));
        flm_token_piece(ctx, -1, (int32_t)id, &len);
        if (t > longest) longest = t;
        if (len > longest) longest = len;
    }
    if (per_token) *per_token = longest;
    return (size_t)n_ctx * longest + 4096;
}

static const char *resolve_model(const char *arg, char *buf, size_t cap);

/* The one piece of process-wide state in the CLI: the temporary files to remove if the user interrupts a long write
 * (the library removes them on every error it sees; a signal it cannot see). Written before the count is raised,
 * so the handler only ever reads complete paths; it calls only async-signal-safe functions (unlink, signal,
 * raise). */
#define CLI_TEMP_MAX 4
static char temp_paths[CLI_TEMP_MAX][4096];
static volatile sig_atomic_t temp_count;

static void on_signal(int sig) {
    for (int i = 0; i < temp_count; i++) unlink(temp_paths[i]);
    flm_out_remove_temporaries(); /* the checked writer's (unique) temporaries and locks */
    signal(sig, SIG_DFL);
    raise(sig);
}

/* SIGBUS: a GGUF is read through a mapping (src/format/gguf.c), and a mapped file truncated under the process
 * (a model rewritten in place while `convert` or `run` reads it) ends it with SIGBUS: a bare "Bus error" (exit 135)
 * that left convert's half-written OUT.flm.tmp.XXXXXX (hundreds of MB) and its lock behind. The handler removes
 * them, says what happened, naming the model (cli_sigbus_file), and exits 1. The message is built beforehand: the
 * handler only calls unlink, write and _exit. */
static char sigbus_msg[4400];
static volatile sig_atomic_t sigbus_len;

static void on_sigbus(int sig) {
    (void)sig;
    for (int i = 0; i < temp_count; i++) unlink(temp_paths[i]);
    flm_out_remove_temporaries();
    if (sigbus_len > 0 && write(2, sigbus_msg, (size_t)sigbus_len) < 0) _exit(1);
    _exit(1);
}

void cli_sigbus_file(const char *path) {
    static char first[2048]; /* the first model named (the target; a draft model comes second) */
    if (path && !first[0]) snprintf(first, sizeof first, "%s", path);
    const bool two = path && strcmp(path, first) != 0;
    int n = snprintf(sigbus_msg, sizeof sigbus_msg, "\nflashlm: %s%s%s: the file ended while flashlm read it through "
                     "a mapping (SIGBUS): it was truncated or rewritten in place while in use (replace a model by "
                     "renaming a new file onto it); outputs being written were removed\n",
                     first[0] ? first : "a model file", two ? " or " : "", two ? path : "");
    sigbus_len = n < 0 ? 0 : n < (int)sizeof sigbus_msg ? n : (int)sizeof sigbus_msg - 1;
    static bool armed;
    if (armed) return;
    armed = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

static void arm_signals(void) {
    static bool armed;
    if (armed) return;
    armed = true;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    /* a file size limit (ulimit -f) fails the write with EFBIG instead of killing the process: the writer's error
     * path removes its temporary and the command says what happened, as on a full disk (ENOSPC) */
    signal(SIGXFSZ, SIG_IGN);
}

void cli_temp_register(const char *path) {
    arm_signals();
    if (temp_count >= CLI_TEMP_MAX || !path) return;
    snprintf(temp_paths[temp_count], sizeof temp_paths[0], "%s", path);
    temp_count = temp_count + 1;
}

void cli_temp_clear(void) { temp_count = 0; }

void cli_remove_on_signal(const char *path) {
    cli_temp_clear();
    arm_signals(); /* the checked writer's temporaries are removed on a signal too */
    if (path) cli_temp_register(path);
}

bool cli_may_write(const char *path, const char *src, bool force) {
    flm_error err;
    if (flm_out_check(path, src, force ? FLM_OUT_REPLACE : 0u, &err) == FLM_OK) return true;
    fprintf(stderr, "flashlm: %s\n", err.msg);
    return false;
}

/* ---- generation and chat ---------------------------------------------------------------------------------------- */

bool cli_buf_add(cli_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return false;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return true;
}

void cli_buf_free(cli_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

const char *CLI_SAMPLING_OPTS_HELP =
    "      --temp T         temperature; 0 = greedy (default 0.8)\n"
    "      --top-k K        top-k sampling; 0 or -1 = off (default 40)\n"
    "      --top-p P        top-p (nucleus) sampling; 1 = off (default 0.95)\n"
    "  -s, --seed S         mt19937's seed, drawn from as llama.cpp draws (top-k, top-p, min-p, then temperature):\n"
    "                       llama.cpp's text on the same logits, the same in every mode and with or without drafting\n"
    "                       (default 42; -1: a random one, printed; above 2^32-1, llama.cpp's range, folded to 32\n"
    "                       bits)\n"
    "      --min-p P        min-p sampling: drop tokens below P times the most likely one; 0 = off (default 0.05)\n"
    "      --repeat-penalty R  a token among the last --repeat-last-n: a positive logit / R, a negative one * R\n"
    "                       (llama.cpp's; default 1 = off)\n"
    "      --repeat-last-n N   the penalties' window: the last N tokens, prompt included; -1 = the context, 0 = off\n"
    "                       (default 64)\n"
    "      --presence-penalty P   OpenAI's: minus P for a token in the window (default 0)\n"
    "      --frequency-penalty F  OpenAI's: minus F times the token's count in the window (default 0)\n"
    "      --logit-bias ID(+|-)B  add B to token ID's logit (llama.cpp's -l; -inf bans it), repeatable\n"
    "      --allow-special-in-content  chat: a message's \"<|im_end|>\" is the control token (default: plain text)\n";

bool cli_allow_special; /* --allow-special-in-content */
static flm_logit_bias cli_bias[CLI_BIAS_MAX];

int cli_parse_gen_opt(int argc, char **argv, int *i, long *n_predict, flm_sampler_params *sp) {
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    long v;
    if (!strcmp(a, "--allow-special-in-content")) { cli_allow_special = true; return 1; }
    if (strcmp(a, "-n") && strcmp(a, "--n-predict") && strcmp(a, "--predict") && strcmp(a, "--temp") && strcmp(a, "--top-k") &&
        strcmp(a, "--top-p") && strcmp(a, "--seed") && strcmp(a, "-s") && strcmp(a, "--min-p") &&
        strcmp(a, "--repeat-penalty") &&
        strcmp(a, "--repeat-last-n") && strcmp(a, "--presence-penalty") && strcmp(a, "--frequency-penalty") &&
        strcmp(a, "--logit-bias") && strcmp(a, "-l"))
        return 0;
    if (!val) { cli_die("option %s needs a value", a); return -1; }
    (*i)++;
    if (!strcmp(a, "-n") || !strcmp(a, "--n-predict") || !strcmp(a, "--predict")) { /* llama.cpp's three names */
        /* -1 (llama.cpp): until the end of text, or the context is full (for ever with --context-shift) */
        if (!cli_parse_long(val, -1, 1 << 24, n_predict)) { cli_die("bad -n value '%s' (-1, or 0..16777216)", val); return -1; }
        if (*n_predict < 0) *n_predict = CLI_N_PREDICT_ALL;
    } else if (!strcmp(a, "--temp")) {
        if (!cli_parse_float(val, 0.0f, 100.0f, &sp->temp)) {
            cli_die("bad --temp value '%s' (0..100; 0: greedy)", val);
            return -1;
        }
    } else if (!strcmp(a, "--top-k")) {
        if (!cli_parse_long(val, -1, 1 << 24, &v)) {
            cli_die("bad --top-k value '%s' (0..16777216; 0 or -1: off)", val);
            return -1;
        }
        sp->top_k = v < 0 ? 0 : (int)v; /* llama.cpp's k <= 0: off */
    } else if (!strcmp(a, "--top-p")) {
        if (!cli_parse_float(val, 0.0f, 1.0f, &sp->top_p)) {
            cli_die("bad --top-p value '%s' (0..1; 1: off)", val);
            return -1;
        }
    } else if (!strcmp(a, "--min-p")) {
        if (!cli_parse_float(val, 0.0f, 1.0f, &sp->min_p)) { cli_die("bad --min-p value '%s' (0..1)", val); return -1; }
    } else if (!strcmp(a, "--repeat-penalty")) {
        /* 0 would divide the window's positive logits by zero (llama.cpp's does): refused, not taken as "off" */
        if (!cli_parse_float(val, 0.0f, 10.0f, &sp->repeat_penalty) || sp->repeat_penalty <= 0.0f) {
            cli_die("bad --repeat-penalty value '%s' (above 0, up to 10; 1: off)", val);
            return -1;
        }
    } else if (!strcmp(a, "--repeat-last-n")) {
        if (!cli_parse_long(val, -1, 1 << 24, &v)) { cli_die("bad --repeat-last-n value '%s' (-1..)", val); return -1; }
        sp->penalty_last_n = (int)v;
    } else if (!strcmp(a, "--presence-penalty")) {
        if (!cli_parse_float(val, -2.0f, 2.0f, &sp->presence_penalty)) {
            cli_die("bad --presence-penalty value '%s' (-2..2)", val);
            return -1;
        }
    } else if (!strcmp(a, "--frequency-penalty")) {
        if (!cli_parse_float(val, -2.0f, 2.0f, &sp->frequency_penalty)) {
            cli_die("bad --frequency-penalty value '%s' (-2..2)", val);
            return -1;
        }
    } else if (!strcmp(a, "--logit-bias") || !strcmp(a, "-l")) { /* llama.cpp's TOKEN_ID(+/-)BIAS, "-inf" bans */
        char *end;
        errno = 0;
        long id = strtol(val, &end, 10);
        float b = 0;
        bool ok = end != val && !errno && id >= 0 && id <= INT32_MAX && (*end == '+' || *end == '-');
        if (ok && !strcmp(end, "-inf")) b = -INFINITY;
        else if (ok) {
            char *e2;
            b = strtof(end, &e2);
            ok = *e2 == 0 && isfinite(b);
        }
        if (!ok) { cli_die("bad --logit-bias value '%s' (TOKEN_ID+BIAS, TOKEN_ID-BIAS or TOKEN_ID-inf)", val); return -1; }
        if (sp->n_bias >= CLI_BIAS_MAX) { cli_die("%s", "at most 256 --logit-bias"); return -1; }
        if (sp->bias != cli_bias) { /* the first: the table is ours */
            sp->bias = cli_bias;
            sp->n_bias = 0;
        }
        cli_bias[sp->n_bias].token = (int32_t)id;
        cli_bias[sp->n_bias].bias = b;
        sp->n_bias++;
    } else { /* --seed, -s (llama.cpp's short form) */
        char *end;
        errno = 0;
        if (!strcmp(val, "-1")) { /* llama.cpp: a random seed, said so the run can be repeated */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            sp->seed = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
            fprintf(stderr, "flashlm: --seed -1: seed %llu\n", (unsigned long long)sp->seed);
            return 1;
        }
        sp->seed = strtoull(val, &end, 10);
        if (errno || *end || end == val || val[0] == '-') {
            cli_die("bad --seed value '%s' (0..2^64-1, or -1 for a random seed; llama.cpp's seeds are 0..2^32-1, a "
                    "larger one is folded to 32 bits)", val);
            return -1;
        }
    }
    return 1;
}

int32_t *cli_tokenize(const flm_ctx *ctx, const char *text, size_t len, unsigned flags, size_t *n) {
    size_t cap = len + 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    size_t need = ids ? flm_tokenize_ex(ctx, text, len, flags, ids, cap) : SIZE_MAX;
    if (need != SIZE_MAX && need > cap) { /* byte fallback can give several tokens per byte */
        int32_t *more = realloc(ids, need * sizeof *ids);
        if (more) {
            ids = more;
            need = flm_tokenize_ex(ctx, text, len, flags, ids, need);
        } else {
            need = SIZE_MAX;
        }
    }
    if (need == SIZE_MAX) {
        free(ids);
        fprintf(stderr, "flashlm: out of memory tokenizing %zu bytes\n", len);
        return NULL;
    }
    *n = need;
    return ids;
}

/* The name cli_chat_template_file last gave (the library's static string, never an argv pointer: a later
 * --chat-template NAME does not match it) and its file, for the "chat format" line. */
static const char *chat_file_name, *chat_file_path;

int cli_chat_template(const flm_ctx *ctx, const char *name, flm_chat **t) { return cli_chat_template_sys(ctx, name, NULL, t); }

int cli_chat_template_sys(const flm_ctx *ctx, const char *name, const char *system, flm_chat **t) {
    flm_error err;
    if (flm_chat_open(ctx, name, t, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        return 1;
    }
    if (name && name == chat_file_name) /* the library says "--chat-template": it was given a name, found in FILE */
        fprintf(stderr, "flashlm: chat format %s (--chat-template-file %s: its markers; rendered by flashlm, not the "
                "file's Jinja)", flm_chat_name(*t), chat_file_path);
    else
        fprintf(stderr, "flashlm: chat format %s (%s)", flm_chat_name(*t), flm_chat_origin(*t));
    if (system) /* said as what runs: the template's default read as if it were used (with --system given) */
        fprintf(stderr, "; system prompt from --system%s", flm_chat_system_prompt(*t) ? " (not the template's own)" : "");
    else if (flm_chat_system_prompt(*t))
        fprintf(stderr, "; default system prompt \"%s\"", flm_chat_system_prompt(*t));
    fprintf(stderr, "\n");
    return 0;
}

void cli_gen_sync(cli_gen *g) {
    flm_session_stats st;
    flm_session_get_stats(g->sess, &st);
    g->pos = flm_session_n_past(g->sess);
    g->n_shifts = st.n_shifts;
    g->n_discarded = st.n_discarded;
}

/* Before a session call: the position chat may have set back (a new conversation), the shift options. */
static void gen_prepare(cli_gen *g) {
    if (g->pos < flm_session_n_past(g->sess)) flm_session_rewind(g->sess, g->pos);
    flm_session_set_shift(g->sess, g->shift, g->n_keep);
}

int cli_gen_feed(cli_gen *g, const int32_t *ids, size_t n) {
    flm_error err;
    if (n == 0) return 0;
    gen_prepare(g);
    flm_status st = flm_session_feed(g->sess, ids, n, &err);
    cli_gen_sync(g);
    if (st) {
        fprintf(stderr, "\nflashlm: %s\n", err.msg);
        return 1;
    }
    g->last = ids[n - 1];
    return 0;
}

/* Print a generated token's text (and keep it in text when not NULL); false when out of memory. */
typedef struct {
    cli_gen *g;
    cli_buf *text;
} emit_to;

bool cli_stdout_put(const void *p, size_t n);
static bool emit_text(emit_to *e, const char *p, size_t len) {
    if (!cli_stdout_put(p, len)) return false; /* a full disk, a closed pipe: stop generating */
    return !e->text || cli_buf_add(e->text, p, len);
}

/* The session's callback: the text as it comes, or (--print-ids) every sampled id. */
static bool emit_gen(void *user, const flm_gen_token *t) {
    emit_to *e = user;
    if (e->g->print_ids) {
        if (t->id >= 0) {
            char id[24];
            int n = snprintf(id, sizeof id, "%s%d", e->g->n_printed++ ? "," : "", (int)t->id);
            if (!cli_stdout_put(id, (size_t)n)) return false; /* a full disk, a closed pipe: stop */
        }
        return true;
    }
    if (t->id >= 0 && !t->eog) e->g->last = t->id;
    return emit_text(e, t->text, t->len);
}

/* ---- standard output: every write checked (issue 23: `run > /dev/full` exited 0) ---- */
static int stdout_errno; /* the first write error on standard output, 0 while none */
static bool stdout_said; /* and it was printed */

bool cli_stdout_put(const void *p, size_t n) {
    if (stdout_errno) return false;
    errno = 0;
    if ((n && fwrite(p, 1, n, stdout) != n) || fflush(stdout) != 0 || ferror(stdout)) {
        stdout_errno = errno ? errno : EIO;
        return false;
    }
    return true;
}

bool cli_stdout_failed(void) {
    if (!stdout_errno) return false;
    if (!stdout_said) {
        stdout_said = true;
        fprintf(stderr, "\nflashlm: cannot write the standard output: %s; stopped\n", strerror(stdout_errno));
    }
    return true;
}

int cli_exit(int rc) {
    if (!stdout_errno) {
        errno = 0;
        if (fflush(stdout) != 0 || ferror(stdout)) stdout_errno = errno ? errno : EIO;
    }
    return cli_stdout_failed() && rc == 0 ? 1 : rc;
}

int cli_gen_reply(cli_gen *g, long n_predict, bool feed_last, cli_buf *text, cli_reply *r) {
    memset(r, 0, sizeof *r);
    emit_to e = {g, text};
    flm_gen_params gp;
    flm_gen_params_default(&gp);
    gp.max_tokens = n_predict;
    gp.feed_last = feed_last;
    gp.grammar = g->grammar;
    gen_prepare(g);
    flm_gen_result res;
    flm_error err;
    flm_status st = n_predict > 0 ? flm_session_generate(g->sess, &gp, emit_gen, &e, &res, &err) : FLM_OK;
    if (n_predict <= 0) memset(&res, 0, sizeof res);
    cli_gen_sync(g);
    r->n_gen = res.n_gen;
    r->eog = res.eog;
    r->ctx_full = res.ctx_full;
    if (st) {
        if (!cli_stdout_failed()) fprintf(stderr, "\nflashlm: %s\n", err.msg);
        return 1;
    }
    if (res.cancelled) { /* only the callback stops it here: standard output failed, or out of memory */
        if (!cli_stdout_failed()) fprintf(stderr, "\nflashlm: out of memory\n");
        return 1;
    }
    return 0;
}

int cli_gen_feed_shift(cli_gen *g, const int32_t *ids, size_t n) {
    gen_prepare(g);
    flm_error err;
    flm_status st = flm_session_feed_shift(g->sess, ids, n, &err);
    cli_gen_sync(g);
    if (st == FLM_ERR_CONTEXT) return 2;
    if (st) {
        fprintf(stderr, "\nflashlm: %s\n", err.msg);
        return 1;
    }
    if (n) g->last = ids[n - 1];
    return 0;
}

int cli_parse_shift_opt(int argc, char **argv, int *i, cli_shift_opts *o) {
    const char *a = argv[*i];
    if (!strcmp(a, "--context-shift")) { o->on = true; return 1; }
    if (!strcmp(a, "--no-context-shift")) { o->on = false; return 1; }
    if (strcmp(a, "--keep")) return 0;
    if (*i + 1 >= argc) { cli_die("option %s needs a value", a); return -1; }
    const char *val = argv[++*i];
    if (!cli_parse_long(val, -1, 1 << 20, &o->keep)) { cli_die("bad --keep value '%s' (-1 or 0..1048576)", val); return -1; }
    return 1;
}

const char *cli_resolve_model(const char *arg, char *buf, size_t cap) {
    const char *path = resolve_model(arg, buf, cap);
    cli_sigbus_file(path); /* the file a SIGBUS would come from: the model, mapped when a GGUF */
    return path;
}

static const char *resolve_model(const char *arg, char *buf, size_t cap) {
    struct stat st;
    if (!arg || stat(arg, &st) == 0) return arg;
    if (!cli_pull_is_known(arg)) {
        if (errno == ENOENT && !strchr(arg, '/')) { /* a name rather than a path: say which names there are */
            fprintf(stderr, "flashlm: '%s' is no file here and no model `flashlm pull` knows; ", arg);
            cli_pull_print_known(stderr);
        }
        return arg;
    }
    return cli_pull(arg, NULL, buf, cap) == 0 ? buf : arg;
}

size_t cli_text_tokens(const flm_ctx *ctx, const char *text, size_t len) {
    int32_t first; /* the count is all that is wanted: one id written at most */
    return flm_tokenize_ex(ctx, text, len, 0, &first, 1);
}

int cli_chat_template_file(const char *path, const char **name) {
    if (!strcmp(path, "-")) { /* cli_read_text_max's stdin: chat's conversation (or run -f -) would be eaten by it */
        fprintf(stderr, "flashlm: --chat-template-file -: a template is read from a file, not standard input (which "
                "holds the conversation or the prompt)\n");
        return 1;
    }
    struct stat st; /* a FIFO or a device: refused by name, never opened (an open of a FIFO waits for a writer) */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        fprintf(stderr, "flashlm: --chat-template-file %s: is %s, not a regular file: a chat template must be a "
                "file\n", path, S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)" : S_ISDIR(st.st_mode) ? "a directory"
                : S_ISCHR(st.st_mode) ? "a character device" : S_ISBLK(st.st_mode) ? "a block device"
                : S_ISSOCK(st.st_mode) ? "a socket" : "a special file");
        return 1;
    }
    size_t len = 0;
    bool too_long = false;
    char *buf = cli_read_text_max(path, 1u << 20, &len, &too_long);
    if (too_long) fprintf(stderr, "flashlm: --chat-template-file %s: longer than 1 MiB: not a chat template\n", path);
    if (!buf) return 1;
    const char *nul = memchr(buf, 0, len);
    const char *f = nul ? NULL : flm_chat_format_of(buf, len);
    if (nul)
        fprintf(stderr, "flashlm: --chat-template-file %s: a NUL byte at offset %zu: a chat template is text\n", path,
                (size_t)(nul - buf));
    else if (!f)
        fprintf(stderr, "flashlm: --chat-template-file %s: a template of no chat format flashlm knows (it recognizes "
                "%s by their markers and renders them itself; it does not run Jinja): choose one with "
                "--chat-template NAME\n", path, FLM_CHAT_TEMPLATE_NAMES);
    free(buf);
    if (!f) return 1;
    *name = chat_file_name = f;
    chat_file_path = path;
    return 0;
}
