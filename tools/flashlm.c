/* flashlm — the command-line tool: run, inspect (and, as they land, convert, bench, ...).
 * Flags follow llama.cpp's names (-m -p -n -t -c --temp --top-k --top-p --seed). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "cli.h"

/* The paper's per-token table (Knowl 1): flash I/O, memory management, compute; over the generated tokens (the
 * session's generation figures: its evaluations' own statistics summed). */
static void print_stats(const flm_ctx *ctx, const flm_session *sess, bool per_token, bool spec) {
    flm_stats s;
    flm_get_stats(ctx, &s);
    flm_session_stats ss;
    flm_session_get_stats(sess, &ss);
    const flm_token_stats *g = &ss.gen;
    const uint64_t n = ss.n_gen_evaluated; /* generation only */
    const uint64_t n_before = s.n_tokens - n; /* the prompt's tokens: those evaluated before the generation */
    fprintf(stderr, "flashlm: mode %s, reader %s%s, budget %s", s.mode, s.io_backend,
            strcmp(s.io_backend, "none") ? (s.direct_io ? " (O_DIRECT)" : " (buffered)") : "",
            s.mem_budget ? cli_size(s.mem_budget).s : "none");
    char embd[64] = "";
    if (s.mem_embd_flash)
        snprintf(embd, sizeof embd, " (token embedding %.2f MiB on flash)", cli_mib(s.mem_embd_flash));
    fprintf(stderr, "; model %.2f MiB: resident %.2f MiB%s, FFN in memory %.2f MiB (%u of %u layers resident), KV %.2f "
            "MiB (%s, %u tokens), scratch %.2f MiB; peak RSS %.2f MiB", cli_mib(s.model_bytes),
            cli_mib(s.mem_resident), embd, cli_mib(s.mem_ffn), s.n_ffn_resident_layers, s.n_layers, cli_mib(s.mem_kv), s.kv_type, s.n_ctx,
            cli_mib(s.mem_scratch), cli_mib(s.peak_rss));
    /* the promise, in the same units: budget + the fixed allowance for the process itself (FLM_RSS_ALLOWANCE) */
    if (s.mem_budget && s.peak_rss <= s.mem_budget)
        fprintf(stderr, " (within the budget)\n");
    else if (s.mem_budget && s.peak_rss <= s.mem_budget + FLM_RSS_ALLOWANCE)
        fprintf(stderr, " = budget + %.2f MiB (the allowance for the process itself is %llu MiB)\n",
                cli_mib(s.peak_rss - s.mem_budget), FLM_RSS_ALLOWANCE >> 20);
    else if (s.mem_budget)
        fprintf(stderr, " = budget + %.2f MiB: MORE than the %llu MiB allowance (please report this)\n",
                cli_mib(s.peak_rss - s.mem_budget), FLM_RSS_ALLOWANCE >> 20);
    else
        fprintf(stderr, "\n");
    if (per_token) {
        fprintf(stderr, "\n  token   flash I/O ms   memory ms   compute ms   total ms   bytes read   reads  predicted  "
                "read  reused  cache rows\n");
        for (uint64_t i = s.n_tokens - s.n_tokens_kept; i < s.n_tokens; i++) { /* the kept (last) tokens */
            flm_token_stats t;
            if (!flm_get_token_stats(ctx, i, &t)) break;
            fprintf(stderr, "  %5llu%s %12.3f %11.3f %12.3f %10.3f %12llu %7llu %10llu %5llu %7llu %11llu\n",
                    (unsigned long long)i, i < n_before ? "p" : " ", t.io_ms, t.mem_ms, t.compute_ms,
                    t.io_ms + t.mem_ms + t.compute_ms, (unsigned long long)t.bytes_read, (unsigned long long)t.n_reads,
                    (unsigned long long)t.n_predicted, (unsigned long long)t.n_loaded, (unsigned long long)t.n_reused,
                    (unsigned long long)t.rows_used);
        }
        fprintf(stderr, "  (p = prompt token)\n");
    }
    if (s.total.n_reads) { /* request sizes, all tokens: the histogram of flm_stats.read_hist */
        fprintf(stderr, "flashlm: read requests by size (all tokens):");
        for (int b = 0; b < FLM_STATS_HIST; b++) {
            if (!s.read_hist[b]) continue;
            uint64_t lo = 512ull << b;
            if (lo >= (1u << 20)) fprintf(stderr, " %llu-%llu MiB x%llu", (unsigned long long)(lo >> 20),
                                          (unsigned long long)(lo >> 19), (unsigned long long)s.read_hist[b]);
            else fprintf(stderr, " %llu-%llu KiB x%llu", (unsigned long long)(lo >> 10),
                         (unsigned long long)(lo >> 9), (unsigned long long)s.read_hist[b]);
        }
        fprintf(stderr, "\n");
    }
    if (strcmp(s.io_backend, "none") || s.reads_verified) { /* whether what was read from flash was checked */
        if (s.reads_verified)
            fprintf(stderr, "flashlm: reads verified: every record read was checked against its record sum (XXH3): "
                    "%.2f MiB, %.1f ms of hashing (streamed FFN records: in the FFN kernels, right before use), %llu read again\n",
                    cli_mib(s.bytes_verified), s.verify_ms, (unsigned long long)s.n_verify_retries);
        else
            fprintf(stderr, "flashlm: reads NOT verified (--no-verify-reads)\n");
    }
    if (n == 0) return;
    double io = g->io_ms / n, mem = g->mem_ms / n, cmp = g->compute_ms / n;
    uint64_t bytes = g->bytes_read, reads = g->n_reads;
    double io_total = g->io_ms;
    if (!strcmp(s.mode, "sparse")) {
        double pred = (double)g->n_predicted / n;
        double loaded = (double)g->n_loaded / n;
        double reused = (double)g->n_reused / n;
        fprintf(stderr, "flashlm: sparse: window %u tokens, neuron cache %llu rows (%llu in use); per token: %.1f neurons "
                "predicted, %.1f read, %.1f reused from the window", s.window, (unsigned long long)s.cache_rows,
                (unsigned long long)s.total.rows_used, pred, loaded, reused);
        if (s.n_streamed)
            fprintf(stderr, "; %.1f neurons per token streamed past the cache (sets larger than the cache: more --mem "
                    "reads less)", (double)s.n_streamed / n);
        if (s.total.n_true)
            fprintf(stderr, "; predictor recall %.3f, precision %.3f", (double)s.total.n_true_pos / s.total.n_true,
                    s.total.n_predicted ? (double)s.total.n_true_pos / s.total.n_predicted : 1.0);
        fprintf(stderr, "\n");
    }
    /* with speculative decoding the target evaluates drafts it rejects too: per generated token is on its own line */
    fprintf(stderr, "flashlm: per %s token: flash I/O %.3f ms + memory %.3f ms + compute %.3f ms = %.3f ms; "
            "%.2f MiB in %.1f reads; %.2f GB read per s of I/O wait (reads overlap compute)\n",
            spec ? "target-evaluated" : "generated", io, mem, cmp, io + mem + cmp,
            cli_mib(bytes) / n, (double)reads / n, io_total > 0 ? (double)bytes / (io_total * 1e6) : 0.0);
}

/* ---- run ------------------------------------------------------------------------------------------------------ */

static const char *RUN_HELP =
    "usage: flashlm run -m MODEL [options]\n"
    "\n"
    "Generate text from a prompt.\n"
    "\n"
    "  -m, --model PATH     model file: .gguf (runs in memory) or .flm (made by flashlm convert; streams FFN\n"
    "                       weights from flash), or a model name (flashlm pull --list; pulled when needed)\n"
    "  -p, --prompt TEXT    prompt, as plain text: control tokens spelled in it stay text (default: empty, i.e.\n"
    "                       start from BOS, also for a model whose tokenizer adds none; a model without a BOS\n"
    "                       token needs a prompt). Its escapes \\n \\r \\t \\' \\\" \\\\ \\xHH are the bytes they name, as\n"
    "                       llama.cpp's (-e, --escape: the default; --no-escape takes backslashes as they are)\n"
    "  -f, --file FILE      read the prompt from FILE (- for standard input) instead of -p: any length; one\n"
    "                       final newline is dropped (as llama.cpp); its backslashes stay as they are (llama.cpp\n"
    "                       processes escapes in a file too, which changes code)\n"
    "      --prompt-ids IDS the prompt as token ids, comma-separated (\"2,17,33\"; no BOS added), instead of -p\n"
    "      --print-ids      print the generated ids (one line, comma-separated) instead of their text\n"
    "  -n, --n-predict N    tokens to generate (default 128; stops early at an end-of-generation token, and\n"
    "                       when the context (-c) is full, with a message, unless --context-shift); -1: until\n"
    "                       the end of text or a full context (for ever with --context-shift); also --predict\n";
static const char *RUN_HELP_MORE =
    "      --chat           wrap the prompt as one user turn in the model's chat template and print only the\n"
    "                       reply (for instruction-tuned models; flashlm chat holds a whole conversation)\n"
    "      --chat-template NAME  chat format instead of the model's: " FLM_CHAT_TEMPLATE_NAMES " (implies --chat)\n"
    "      --chat-template-file FILE  the chat format of the Jinja template in FILE, known by its family's markers\n"
    "                       (flashlm renders the family itself; implies --chat)\n"
    "      --system TEXT    system prompt for --chat (default: the template's own, if it has one; implies --chat;\n"
    "                       also -sys, --system-prompt)\n"
    "      --context-shift  when the context is full, forget the older half of what is not kept (--keep) and go\n"
    "                       on generating (llama.cpp's context shift; flm_kv_shift). Default: stop there\n"
    "      --keep N         with --context-shift, the prompt tokens kept at the start besides BOS (always kept);\n"
    "                       -1: the whole prompt (default 0: BOS only, as llama.cpp). A prompt longer than the\n"
    "                       context is refused (raise -c)\n"
    "      --stats          print the memory plan at open (one line per part: resident weights, token\n"
    "                       embedding, KV cache, scratch, reader, FFN storage) and the run's totals\n"
    "      --stats-tokens   --stats, and a row per token (flash I/O, memory, compute ms; bytes; reads)\n"
    "  -v, --verbose        print the library's debug messages (the memory plan at open)\n"
    "      --stats-json F   write all statistics as JSON to F (refused when it exists, unless --force; never onto\n"
    "                       the model, a link or a device)\n"
    "      --force          replace an existing --stats-json file\n"
    "  -h, --help           this help\n";
static const char *RUN_HELP_TAIL = "\nThe text goes to stdout as it is generated; speeds and statistics go to stderr.\n";

static int cmd_run_prompt(const char *model, const char *prompt, bool chat, const char *chat_name,
                          const char *system, long n_predict, bool per_token, bool verbose, const char *stats_json,
                          flm_params *params_in, const flm_sampler_params *sp_in, const cli_spec_args *sa,
                          const cli_shift_opts *shift);
/* --prompt-ids / --print-ids (issue 22: compare with other engines id for id) */
static const char *run_prompt_ids;
static bool run_print_ids;
static cli_spec_session run_spec; /* run's speculative decoding (large: a path buffer) */
static bool run_force;            /* --force: replace an existing --stats-json file */
static const char *run_prompt_file; /* -f FILE (- for standard input), or NULL */
static char *run_prompt_buf;        /* its text, once read */
static char *run_prompt_esc;        /* -p's text with its escapes processed (-e, the default), or NULL */
static flm_grammar *run_grammar;    /* --grammar / --json-schema, or NULL */

static int cmd_run(int argc, char **argv) {
    const char *model = NULL, *prompt = "", *prompt_file = NULL, *stats_json = NULL, *chat_name = NULL, *system = NULL;
    bool stats = false, per_token = false, chat = false, verbose = false, text_given = false, escape = true,
         prompt_given = false;
    long n_predict = 128;
    flm_params params;
    flm_params_default(&params);
    flm_sampler_params sp;
    flm_sampler_params_default(&sp);
    cli_spec_args sa;
    cli_spec_args_default(&sa);
    cli_shift_opts shift = {false, CLI_KEEP_DEFAULT};
    cli_grammar_args grammar = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDVAL() do { if (!val) return cli_die("option %s needs a value (see flashlm run --help)", a); i++; } while (0)
        int used = cli_parse_model_opt(argc, argv, &i, &params);
        if (!used) used = cli_parse_gen_opt(argc, argv, &i, &n_predict, &sp);
        if (!used) used = cli_parse_spec_opt(argc, argv, &i, &sa);
        if (!used) used = cli_parse_shift_opt(argc, argv, &i, &shift);
        if (!used) used = cli_parse_grammar_opt(argc, argv, &i, &grammar);
        if (used < 0) return 2;
        if (used) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s%s%s%s%s\nshared options:\n%s%s", RUN_HELP, CLI_SAMPLING_OPTS_HELP, CLI_GRAMMAR_OPTS_HELP,
                   CLI_SPEC_OPTS_HELP, RUN_HELP_MORE, CLI_MODEL_OPTS_HELP, RUN_HELP_TAIL);
            return 0;
        }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEEDVAL(); model = val; }
        /* -p and -f: one prompt; given both, one would be dropped without a word (refused below) */
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { NEEDVAL(); prompt = val; prompt_given = text_given = true; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { NEEDVAL(); prompt_file = val; text_given = true; }
        else if (!strcmp(a, "-e") || !strcmp(a, "--escape")) { escape = true; }
        else if (!strcmp(a, "--no-escape")) { escape = false; }
        else if (!strcmp(a, "--prompt-ids")) { NEEDVAL(); run_prompt_ids = val; }
        else if (!strcmp(a, "--print-ids")) { run_print_ids = true; }
        else if (!strcmp(a, "--chat")) { chat = true; }
        else if (!strcmp(a, "--chat-template")) {
            NEEDVAL();
            if (!flm_chat_name_valid(val))
                return cli_die("unknown chat template '%s' (valid: " FLM_CHAT_TEMPLATE_NAMES ")", val);
            chat_name = val;
            chat = true;
        }
        else if (!strcmp(a, "--chat-template-file")) {
            NEEDVAL();
            if (cli_chat_template_file(val, &chat_name)) return 1;
            chat = true;
        }
        else if (!strcmp(a, "--system") || !strcmp(a, "-sys") || !strcmp(a, "--system-prompt")) {
            NEEDVAL();
            system = val;
            chat = true;
        }
        else if (!strcmp(a, "--stats")) { stats = true; }
        else if (!strcmp(a, "--stats-tokens")) { stats = per_token = true; }
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { verbose = true; }
        else if (!strcmp(a, "--stats-json")) { NEEDVAL(); stats_json = val; }
        else if (!strcmp(a, "--force")) { run_force = true; }
        else return cli_die("unknown option '%s' (see flashlm run --help)", a);
#undef NEEDVAL
    }
    if (!model) return cli_die("%s", "no model given: use -m MODEL (see flashlm run --help)");
    if (cli_spec_args_check(&sa)) return 2;
    if (prompt_given && prompt_file)
        return cli_die("-p gives the prompt and -f '%s' reads it from a file: give one of them", prompt_file);
    if (run_prompt_ids && text_given) /* one of them would be dropped without a word */
        return cli_die("%s", "--prompt-ids is the whole prompt: give it, or -p / -f, not both");
    if ((run_prompt_ids || run_print_ids) && (chat || sa.draft || sa.ngram))
        return cli_die("%s", "--prompt-ids and --print-ids do not go with --chat or drafting");
    if (escape && !prompt_file && strchr(prompt, '\\')) { /* -p "Q:\nA:" as llama.cpp reads it (-e, the default) */
        size_t len;
        if (!(run_prompt_esc = cli_unescape(prompt, &len))) return cli_die("%s", "out of memory");
        if (strlen(run_prompt_esc) != len) { /* as C text it would end there, the rest dropped without a word */
            free(run_prompt_esc);
            run_prompt_esc = NULL;
            return cli_die("%s", "-p: its \\x00 escape would end the prompt there: a prompt is text (--no-escape "
                           "takes backslashes as they are)");
        }
        prompt = run_prompt_esc;
    }
    /* bytes that are not UTF-8: the tokenizer drops them without a word (-p $'a\xffb' ran as "ab") */
    size_t bad = flm_utf8_check(prompt, strlen(prompt));
    if (bad != SIZE_MAX)
        return fprintf(stderr, "flashlm: -p: byte 0x%02X at offset %zu is not UTF-8: a prompt is text\n",
                       (unsigned char)prompt[bad], bad), 2;
    if (system && (bad = flm_utf8_check(system, strlen(system))) != SIZE_MAX)
        return fprintf(stderr, "flashlm: --system: byte 0x%02X at offset %zu is not UTF-8: a system prompt is text\n",
                       (unsigned char)system[bad], bad), 2;
    run_prompt_file = prompt_file; /* read once the model is open: bounded by its context (cli_prompt_max_bytes) */
    if (cli_grammar_load(&grammar, &run_grammar)) return 1; /* before the model: a bad grammar fails at once */
    int rc = cmd_run_prompt(model, prompt, chat, chat_name, system, n_predict, per_token, verbose || stats, stats_json, &params,
                            &sp, &sa, &shift);
    cli_spec_session_close(&run_spec); /* the draft model, after the target */
    free(run_prompt_buf);
    free(run_prompt_esc);
    flm_grammar_free(run_grammar);
    return rc;
}

static int cmd_run_prompt(const char *model, const char *prompt, bool chat, const char *chat_name,
                          const char *system, long n_predict, bool per_token, bool verbose, const char *stats_json,
                          flm_params *params_in, const flm_sampler_params *sp_in, const cli_spec_args *sa,
                          const cli_shift_opts *shift) {
    flm_params params = *params_in;
    flm_sampler_params sp = *sp_in;
    char model_buf[4096];
    model = cli_resolve_model(model, model_buf, sizeof model_buf);
    /* the statistics' file: refused now (the model itself, a link, a device, an existing file without --force) */
    if (stats_json && !cli_may_write(stats_json, model, run_force)) return 1;

    flm_error err;
    flm_ctx *ctx = NULL;
    double t0 = cli_now_ms();
    cli_env_params(&params, model);
    cli_log_verbose(&params, per_token || verbose);
    /* speculative decoding: the draft model first, inside the budget; the target gets what it leaves */
    cli_spec_session *ss = &run_spec; /* closed by cmd_run, after the target */
    ss->a = *sa;
    ss->a.greedy = sp.temp <= 0.0f;
    if (cli_spec_open_draft(ss, model, &params, per_token || verbose)) return 1;
    if (flm_open(model, &params, &ctx, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        cli_spec_target_refused(ss, err.code);
        return 1;
    }
    if (cli_after_open(ctx)) { flm_close(ctx); return 1; }
    cli_note_unused(ctx, &params, shift);
    cli_spec_note_unused(ss, ctx);
    if (run_force && !stats_json)
        fprintf(stderr, "flashlm: note: --force only replaces an existing --stats-json file; none was given\n");
    double t_load = cli_now_ms() - t0;
    flm_model_info info;
    flm_get_info(ctx, &info);

    /* -f: the prompt's text, any length up to what the context can hold; read no further (`-f /dev/zero` held 8 GB) */
    char *prompt_buf = NULL; /* freed by cmd_run (run_prompt_buf) */
    if (run_prompt_file) {
        size_t per_token, max = cli_prompt_max_bytes(ctx, info.n_ctx, &per_token), len = 0;
        bool too_long = false;
        prompt_buf = cli_read_text_max(run_prompt_file, max, &len, &too_long);
        if (too_long)
            fprintf(stderr, "flashlm: the prompt (%s: more than %zu bytes, at most %zu bytes per token) is longer than "
                    "the context (%u tokens); raise -c\n", run_prompt_file, max, per_token, info.n_ctx);
        if (!prompt_buf) { flm_close(ctx); return 1; }
        const char *nul = memchr(prompt_buf, 0, len);
        if (nul) { /* as C text it would end there, the rest dropped without a word */
            fprintf(stderr, "flashlm: %s: a NUL byte at offset %zu: a prompt is text\n", run_prompt_file,
                    (size_t)(nul - prompt_buf));
            free(prompt_buf);
            flm_close(ctx);
            return 1;
        }
        size_t bad = flm_utf8_check(prompt_buf, len);
        if (bad != SIZE_MAX) { /* the tokenizer would drop it without a word */
            fprintf(stderr, "flashlm: %s: byte 0x%02X at offset %zu is not UTF-8: a prompt is text\n", run_prompt_file,
                    (unsigned char)prompt_buf[bad], bad);
            free(prompt_buf);
            flm_close(ctx);
            return 1;
        }
        if (len && prompt_buf[len - 1] == '\n') prompt_buf[--len] = 0; /* llama.cpp drops a file's final newline */
        prompt = run_prompt_buf = prompt_buf;
    }

    size_t n_prompt = 0;
    int32_t *ids = NULL;
    if (chat) { /* the prompt as one user turn (after the system prompt) in the chat format */
        flm_chat *tmpl = NULL;
        if (cli_chat_template_sys(ctx, chat_name, system, &tmpl)) { flm_close(ctx); return 1; }
        flm_chat_msg msgs[2] = {{"system", system ? system : ""}, {"user", prompt}};
        char *text = NULL;
        size_t len = 0, *spans = NULL, n_spans = 0; /* the contents: plain text unless --allow-special-in-content */
        if (cli_allow_special ? flm_chat_apply(tmpl, system ? msgs : msgs + 1, system ? 2 : 1, true, &text, &len, &err)
                              : flm_chat_apply_spans(tmpl, system ? msgs : msgs + 1, system ? 2 : 1, true, &text, &len,
                                                     &spans, &n_spans, &err)) {
            fprintf(stderr, "flashlm: %s\n", err.msg);
            flm_chat_close(tmpl);
            flm_close(ctx);
            return 1;
        }
        flm_chat_close(tmpl);
        const unsigned fl = FLM_TOKENIZE_PARSE_SPECIAL | (flm_add_bos(ctx) ? FLM_TOKENIZE_BOS : 0u);
        size_t cap = len + 16;
        ids = malloc(cap * sizeof *ids);
        size_t need = ids ? flm_tokenize_spans(ctx, text, len, fl, spans, n_spans, ids, cap) : SIZE_MAX;
        if (need != SIZE_MAX && need > cap) {
            int32_t *more = realloc(ids, need * sizeof *ids);
            need = more ? flm_tokenize_spans(ctx, text, len, fl, spans, n_spans, ids = more, need) : SIZE_MAX;
        }
        if (need == SIZE_MAX) { free(ids); ids = NULL; }
        n_prompt = ids ? need : 0;
        free(spans);
        free(text);
        if (!ids) { flm_close(ctx); return 1; }
    } else if (run_prompt_ids) { /* "2,17,33": the ids as they are (no BOS added) */
        size_t cap = 1;
        for (const char *c = run_prompt_ids; *c; c++) cap += *c == ',';
        ids = malloc(cap * sizeof *ids);
        const char *c = run_prompt_ids;
        while (ids && *c) {
            char *end;
            errno = 0;
            long v = strtol(c, &end, 10);
            if (end == c || errno || v < 0 || v >= (long)flm_vocab_size(ctx) || (*end && *end != ',')) {
                fprintf(stderr, "flashlm: --prompt-ids: '%s' is not a comma-separated list of ids below %u\n",
                        run_prompt_ids, flm_vocab_size(ctx));
                free(ids);
                flm_close(ctx);
                return 1;
            }
            ids[n_prompt++] = (int32_t)v;
            c = *end ? end + 1 : end;
        }
    } else if (!*prompt) { /* no prompt: start from BOS, also where the tokenizer adds none (SmolLM2) */
        ids = malloc(sizeof *ids);
        n_prompt = ids ? flm_tokenize_ex(ctx, "", 0, FLM_TOKENIZE_BOS, ids, 1) : 0;
        if (n_prompt == SIZE_MAX) { free(ids); ids = NULL; n_prompt = 0; } /* out of memory: said below */
        if (ids && n_prompt == 0) {
            fprintf(stderr, "flashlm: no prompt: generation starts from BOS, and this model's vocabulary has none; give "
                    "a prompt (-p, -f or --prompt-ids)\n");
            free(ids);
            flm_close(ctx);
            return 1;
        }
    } else {
        ids = flm_tokenize_all(ctx, prompt, true, &n_prompt);
    }
    const char *refuse = !ids ? "out of memory"
                         : n_prompt == 0 && run_prompt_ids ? "--prompt-ids gives no token ids (\"2,17,33\": one or more)"
                         : n_prompt == 0 ? "the prompt gives no tokens (this tokenizer drops all of its bytes)"
                         /* BOS alone, or the chat template's tokens alone: the text itself gave none */
                         : !run_prompt_ids && *prompt && cli_text_tokens(ctx, prompt, strlen(prompt)) == 0
                             ? "the prompt gives no tokens (this tokenizer drops all of its bytes)" : NULL;
    size_t bad_bias = sp.n_bias; /* the first --logit-bias id outside the vocabulary, said as chat says it */
    for (size_t b = 0; !refuse && b < sp.n_bias && bad_bias == sp.n_bias; b++)
        if ((uint32_t)sp.bias[b].token >= flm_vocab_size(ctx)) bad_bias = b;
    if (bad_bias < sp.n_bias) {
        fprintf(stderr, "flashlm: --logit-bias: token id %d is outside the vocabulary (%u tokens)\n",
                (int)sp.bias[bad_bias].token, flm_vocab_size(ctx));
        refuse = "";
    } else if (refuse) fprintf(stderr, "flashlm: %s\n", refuse);
    else if (n_prompt > info.n_ctx) /* as llama.cpp: an error, not a truncation */
        fprintf(stderr, "flashlm: the prompt (%zu tokens) is longer than the context (%u tokens); raise -c\n",
                n_prompt, info.n_ctx);
    flm_session *sess = NULL; /* the library's token loop, speculative or not */
    if (!refuse && n_prompt <= info.n_ctx &&
        (flm_session_create(ctx, &sess, &err) || flm_session_sampling(sess, &sp, &err)))
        fprintf(stderr, "flashlm: %s\n", err.msg);
    if (refuse || n_prompt > info.n_ctx || !sess || cli_spec_begin(ss, ctx, model, sess)) {
        flm_session_free(sess);
        free(ids);
        flm_close(ctx);
        return 1;
    }
    /* echo the prompt the way it decodes (a chat reply stands alone) */
    for (size_t i = 0; i < n_prompt && !chat && !run_print_ids; i++) {
        if (i == 0 && ids[0] == info.bos) continue; /* BOS prints nothing; without one the first token is text */
        size_t len;
        const char *p = flm_token_piece(ctx, i ? ids[i - 1] : -1, ids[i], &len);
        fwrite(p, 1, len, stdout);
    }
    fflush(stdout);
    int rc = 0;
    double t_prompt = 0, t_gen = 0;
    cli_gen gen = {.ctx = ctx, .sess = sess, .n_ctx = info.n_ctx, .last = -1, .print_ids = run_print_ids,
                   .grammar = run_grammar};
    /* --keep counts prompt tokens after BOS, as llama.cpp's n_keep; -1: the whole prompt */
    long keep = shift->keep == -1 ? (long)n_prompt : shift->keep < 0 ? 0 : shift->keep;
    keep += n_prompt && ids[0] == info.bos && shift->keep != -1;
    gen.shift = shift->on;
    gen.n_keep = (int32_t)(keep < (long)n_prompt ? keep : (long)n_prompt);
    cli_reply reply = {0};
    double t1 = cli_now_ms();
    if (cli_gen_feed(&gen, ids, n_prompt)) rc = 1;
    double t = cli_now_ms();
    t_prompt = t - t1;
    t1 = t;
    if (!rc && cli_gen_reply(&gen, n_predict, false, NULL, &reply)) rc = 1;
    long n_gen = reply.n_gen;
    t_gen = cli_now_ms() - t1;
    printf("\n");
    fflush(stdout);
    if (!rc && reply.ctx_full && !gen.shift)
        fprintf(stderr, "flashlm: context full (%u tokens): stopped; raise -c or pass --context-shift\n", info.n_ctx);
    else if (!rc && reply.ctx_full)
        fprintf(stderr, "flashlm: context full (%u tokens) and the %d kept tokens (--keep) leave nothing to discard: "
                "stopped; lower --keep or raise -c\n", info.n_ctx, gen.n_keep);
    if (gen.n_shifts)
        fprintf(stderr, "flashlm: context shift: %ld time%s, %ld tokens discarded in all (the first %d kept)\n",
                gen.n_shifts, gen.n_shifts > 1 ? "s" : "", gen.n_discarded, gen.n_keep);
    fprintf(stderr, "\nflashlm: model %s (%s, %u layers, d_model %u, d_ffn %u), kernels %s, %d threads, load %.1f ms\n",
            model, info.arch, info.n_layers, info.d_model, info.d_ffn, info.kernels, params.n_threads, t_load);
    fprintf(stderr, "flashlm: prompt     %4zu tokens in %8.2f ms = %8.2f tokens/s\n", n_prompt, t_prompt,
            t_prompt > 0 ? n_prompt * 1e3 / t_prompt : 0.0);
    fprintf(stderr, "flashlm: generation %4ld tokens in %8.2f ms = %8.2f tokens/s%s\n", n_gen, t_gen,
            t_gen > 0 ? n_gen * 1e3 / t_gen : 0.0, n_predict == 0 ? " (-n 0: the prompt only)" : "");
    print_stats(ctx, sess, per_token, ss->on);
    cli_spec_print_stats(ss, ctx, sess);
    if (stats_json && rc) /* a failed run's figures would read as a finished one's */
        fprintf(stderr, "flashlm: the run failed: no statistics written to %s\n", stats_json);
    else if (stats_json) {
        if (flm_write_stats_json(ctx, stats_json, run_force, &err)) { fprintf(stderr, "flashlm: %s\n", err.msg); rc = 1; }
        else fprintf(stderr, "flashlm: statistics written to %s\n", stats_json);
    }
    flm_session_free(sess);
    free(ids);
    flm_close(ctx);
    return rc;
}

/* ---- inspect -------------------------------------------------------------------------------------------------- */

static const char *INSPECT_HELP =
    "usage: flashlm inspect MODEL\n"
    "\n"
    "Print a model file's architecture, hyper-parameters, metadata and tensors (type, shape, bytes). A file with a\n"
    "problem is shown as far as it can be read, then the problem is named (exit status 1).\n";

static int cmd_inspect(int argc, char **argv) {
    if (argc != 1 || !strcmp(argv[0], "-h") || !strcmp(argv[0], "--help")) {
        if (argc > 1) fprintf(stderr, "flashlm inspect: one model file, not %d arguments\n\n", argc);
        fputs(INSPECT_HELP, argc == 1 ? stdout : stderr);
        return argc == 1 ? 0 : 2;
    }
    char model_buf[4096];
    argv[0] = (char *)cli_resolve_model(argv[0], model_buf, sizeof model_buf);
    flm_params p;
    flm_params_default(&p);
    cli_env_params(&p, argv[0]);
    flm_error err;
    char *text = NULL;
    bool runnable = false;
    flm_status st = flm_inspect(argv[0], &p, &text, &runnable, &err);
    if (text) fputs(text, stdout);
    free(text);
    if (st) {
        fflush(stdout);
        fprintf(stderr, "flashlm: %s\n", err.msg);
        return 1;
    }
    return runnable ? 0 : 1;
}

/* ---- convert / verify ------------------------------------------------------------------------------------------ */

static const char *CONVERT_HELP =
    "usage: flashlm convert SRC.gguf OUT.flm [--force] [--down-type q8_0|f16|f32]\n"
    "       flashlm convert HF_DIR OUT.flm|OUT.gguf [--type f32|f16|q8_0] [--tokenizer DIR | --no-tokenizer] [--force]\n"
    "                       [--down-type ...]\n"
    "\n"
    "HF_DIR: a Hugging Face model folder (config.json, model.safetensors or sharded with model.safetensors.index.json,\n"
    "tokenizer.json or vocab.json + merges.txt, or those in --tokenizer DIR): OPT (pre-LN), Falcon 7B, Phi-2 or\n"
    "Persimmon, written with llama.cpp's names for those architectures (opt, falcon, phi2, persimmon). Its matrices\n"
    "are written as --type (default f16; norms and biases f32) into OUT.gguf, or into OUT.flm through a temporary\n"
    "OUT.flm.hf.gguf. A folder without a tokenizer is refused unless --no-tokenizer (every token a placeholder: run\n"
    "it with --prompt-ids). Every tensor must belong to the model config.json describes (a num_hidden_layers below\n"
    "the weights' layers is refused), and OUT may not be one of the files read, even with --force.\n"
    "tokenizer_config.json beside the tokenizer gives the chat template (tokenizer.chat_template) and, when\n"
    "config.json has no eos_token_id, the end-of-text token (its eos_token).\n"
    "\n"
    "Write the flash layout (docs/FORMAT.md): a resident region (embeddings, attention, norms, output, metadata,\n"
    "tokenizer) and, per layer, one contiguous record per FFN neuron (up row | gate row | down column), 4 KiB-aligned\n"
    "regions with xxh64 checksums, each byte written once. Written to a unique OUT.flm.tmp.XXXXXX and renamed when\n"
    "complete (OUT.flm.lock is held meanwhile: a second convert to OUT.flm is refused while one runs);\n"
    "nothing is left on an error or an interrupt (SIGINT, SIGTERM, SIGHUP). Prints the MB/s written and read.\n"
    "An existing OUT.flm is only replaced with -f/--force.\n"
    "A quantized down projection is re-laid by columns as q8_0 (docs/FORMAT.md); --down-type f16 stores them\n"
    "near-exactly at about twice the bytes (to measure what q8_0 costs).\n";

static int cmd_convert(int argc, char **argv) {
    if (cli_is_help(argc, argv)) { fputs(CONVERT_HELP, stdout); return 0; }
    const char *paths[2] = {NULL, NULL};
    bool force = false, no_tok = false, type_set = false, down_set = false;
    int np = 0;
    uint32_t down_as = FLM_TYPE_Q8_0, hf_type = FLM_TYPE_F16;
    const char *tok_dir = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--force")) force = true;
        else if (!strcmp(argv[i], "--no-tokenizer")) no_tok = true;
        else if (!strcmp(argv[i], "--tokenizer")) {
            if (i + 1 >= argc || !argv[i + 1][0]) return cli_die("%s", "option --tokenizer needs a folder");
            tok_dir = argv[++i];
        } else if (!strcmp(argv[i], "--type")) {
            type_set = true;
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(v, "q8_0")) hf_type = FLM_TYPE_Q8_0;
            else if (!strcmp(v, "f16")) hf_type = FLM_TYPE_F16;
            else if (!strcmp(v, "f32")) hf_type = FLM_TYPE_F32;
            else return cli_die("bad --type '%s' (f32, f16 or q8_0)", v);
        }
        else if (!strcmp(argv[i], "--down-type")) {
            down_set = true;
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(v, "q8_0")) down_as = FLM_TYPE_Q8_0;
            else if (!strcmp(v, "f16")) down_as = FLM_TYPE_F16;
            else if (!strcmp(v, "f32")) down_as = FLM_TYPE_F32;
            else return cli_die("bad --down-type '%s' (q8_0, f16 or f32)", v);
        }
        else if (argv[i][0] == '-' && argv[i][1]) return cli_die("unknown option '%s' (see flashlm convert --help)", argv[i]);
        else if (np < 2) paths[np++] = argv[i];
        else return cli_die("convert takes SRC and OUT: '%s' is a third path (see flashlm convert --help)", argv[i]);
    }
    if (np != 2) { fputs(CONVERT_HELP, stderr); return 2; }
    char model_buf[4096];
    const char *src = cli_resolve_model(paths[0], model_buf, sizeof model_buf), *dst = paths[1];
    struct stat ss; /* the source first: a FIFO, a device or a missing file is said before anything about dst */
    if (stat(src, &ss) != 0) return fprintf(stderr, "flashlm: %s: cannot open: %s\n", src, strerror(errno)), 1;
    if (!S_ISREG(ss.st_mode) && !S_ISDIR(ss.st_mode)) /* a folder is a Hugging Face model's */
        return fprintf(stderr, "flashlm: %s: is %s, not a regular file: a model must be a file\n", src,
                       S_ISFIFO(ss.st_mode) ? "a FIFO (named pipe)" : S_ISCHR(ss.st_mode) ? "a character device"
                       : S_ISBLK(ss.st_mode) ? "a block device" : "a special file"), 1;
    if (!cli_may_write(dst, src, force)) return 1;
    char hf_gguf[4200] = "";
    flm_error err;
    struct stat sb;
    const bool hf = stat(paths[0], &sb) == 0 && S_ISDIR(sb.st_mode);
    size_t dn = strlen(dst);
    const bool to_gguf = dn >= 5 && !strcmp(dst + dn - 5, ".gguf");
    if (!hf && (tok_dir || no_tok || type_set)) /* never ignored: they only mean something for a folder */
        return fprintf(stderr, "flashlm: %s is only for a Hugging Face folder; %s is a model file\n",
                       tok_dir ? "--tokenizer" : no_tok ? "--no-tokenizer" : "--type", paths[0]), 2;
    if (!hf && to_gguf) /* convert writes the flash layout: a .flm named .gguf would mislead every later reader */
        return cli_die("%s: convert writes a .flm file from a model file (a GGUF input is already GGUF); name the "
                       "output OUT.flm", dst);
    if (hf && to_gguf && down_set)
        return cli_die("--down-type is for a .flm output; %s is a GGUF file", dst);
    if (hf && no_tok && tok_dir) return cli_die("%s", "--tokenizer and --no-tokenizer contradict each other");
    if (hf && flm_hf_check_output(paths[0], no_tok ? NULL : tok_dir ? tok_dir : paths[0], dst, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg); /* never onto a file the conversion reads */
        return 1;
    }
    if (hf) { /* a Hugging Face folder */
        if (to_gguf) snprintf(hf_gguf, sizeof hf_gguf, "%s", dst);
        else snprintf(hf_gguf, sizeof hf_gguf, "%s.hf.gguf", dst);
        if (!to_gguf && access(hf_gguf, F_OK) == 0) { /* the intermediate file: never someone else's */
            fprintf(stderr, "flashlm: %s exists: convert writes its intermediate GGUF there and removes it; move or "
                    "remove that file first\n", hf_gguf);
            return 1;
        }
        cli_remove_on_signal(NULL); /* the writer's temporaries (OUT.tmp.XXXXXX) go on SIGINT, SIGTERM, SIGHUP */
        unsigned hf_flags = (no_tok ? FLM_HF_NO_TOKENIZER : 0u) | (to_gguf && force ? FLM_OUT_REPLACE : 0u);
        if (flm_convert_hf(paths[0], tok_dir, hf_gguf, hf_type, hf_flags, &err)) { fprintf(stderr, "flashlm: %s\n", err.msg); return 1; }
        if (to_gguf) { fprintf(stderr, "flashlm: wrote %s\n", dst); return 0; }
        src = hf_gguf;
    }
    if (hf_gguf[0]) cli_remove_on_signal(hf_gguf); /* the intermediate GGUF too */
    else cli_remove_on_signal(NULL); /* the writer's temporary OUT.tmp.XXXXXX and lock OUT.lock */
    flm_convert_info ci;
    flm_status cst = flm_convert_ex(src, dst, down_as, force ? FLM_OUT_REPLACE : 0u, cli_progress, NULL, &ci, &err);
    if (hf_gguf[0]) unlink(hf_gguf);
    if (cst) { fprintf(stderr, "flashlm: %s\n", err.msg); return 1; }
    cli_temp_clear();
    /* the summary comes from what was written: nothing is read back */
    double s = ci.seconds > 0 ? ci.seconds : 1e-9;
    fprintf(stderr, "flashlm: wrote %s in %.1f s: %.2f MiB (resident %.2f MiB, token embedding last: %.2f MiB; FFN "
            "%.2f MiB in %u layers of %u records of %llu bytes); %.0f MB/s written, %.0f MB/s of GGUF read\n", dst,
            ci.seconds, cli_mib(ci.file_bytes), cli_mib(ci.resident_bytes), cli_mib(ci.embd_bytes),
            cli_mib(ci.ffn_bytes), ci.n_layers, ci.n_records, (unsigned long long)ci.record_bytes,
            (double)ci.file_bytes / s / 1e6, (double)ci.src_bytes / s / 1e6);
    return 0;
}

static const char *VERIFY_HELP =
    "usage: flashlm verify MODEL.flm\n"
    "\n"
    "Read every region of a .flm file and check its checksum.\n";

static int cmd_verify(int argc, char **argv) {
    if (argc >= 1 && (!strcmp(argv[0], "-h") || !strcmp(argv[0], "--help"))) { fputs(VERIFY_HELP, stdout); return 0; }
    if (argc != 1) {
        if (argc > 1) fprintf(stderr, "flashlm verify: one model file, not %d arguments\n\n", argc);
        fputs(VERIFY_HELP, stderr);
        return 2;
    }
    char model_buf[4096];
    argv[0] = (char *)cli_resolve_model(argv[0], model_buf, sizeof model_buf);
    flm_error err;
    flm_verify_info vi;
    if (flm_verify(argv[0], cli_progress, NULL, &vi, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        return 1;
    }
    printf("%s: OK (%u regions, %.2f MiB, all checksums match)\n", argv[0], vi.n_regions, cli_mib(vi.file_bytes));
    return 0;
}

/* ---- plan: the memory plan without opening the model -------------------------------------------------------- */

static const char *PLAN_HELP =
    "usage: flashlm plan -m MODEL [options]\n"
    "\n"
    "Print the memory plan `flashlm run` would carry out with the same options, without loading the model: the\n"
    "budget in bytes, the mode (and why `auto` picks it), and every part it holds (resident weights, token\n"
    "embedding, KV cache, scratch, reader buffers, FFN layers or predictors and neuron caches). Only the file's\n"
    "headers are read (and, for auto under a budget, a calibrated model's predictor statistics). Exits 1 when the\n"
    "budget cannot hold the plan, saying how big each part is.\n"
    "\n"
    "options:\n"
    "  -m, --model PATH     model file (.gguf or .flm) or a pulled name\n"
    "      --no-draft       mode auto running hot: no self-draft (its buffers and window are then not held)\n"
    "      --draft-window S the self-draft's window share (0..0.9; default " CLI_STR(CLI_DRAFT_WINDOW_DEFAULT) ")\n";

static int cmd_plan(int argc, char **argv) {
    if (cli_is_help(argc, argv)) {
        printf("%s%s", PLAN_HELP, CLI_MODEL_OPTS_HELP);
        return 0;
    }
    flm_params params;
    flm_params_default(&params);
    const char *model = NULL;
    cli_spec_session ss; /* --no-draft and --draft-window: auto's self-draft as `run` applies them */
    memset(&ss, 0, sizeof ss);
    cli_spec_args_default(&ss.a);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_parse_model_opt(argc, argv, &i, &params);
        if (!r) r = cli_parse_spec_opt(argc, argv, &i, &ss.a);
        if (r < 0) return 2;
        if (r) continue;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) model = argv[++i];
        else return cli_die("unknown option '%s' (see flashlm plan --help)", a);
    }
    if (!model) return cli_die("%s", "no model given: use -m MODEL (see flashlm plan --help)");
    if (cli_spec_args_check(&ss.a)) return 2;
    if (cli_spec_active(&ss.a))
        return cli_die("%s", "flashlm plan prints one model's plan: --draft, --draft-ngram, --draft-self and "
                       "--draft-tree split the budget when `run --stats` opens the models (--no-draft and "
                       "--draft-window apply here)");
    char model_buf[4096];
    model = cli_resolve_model(model, model_buf, sizeof model_buf);
    cli_env_params(&params, model);
    if (cli_spec_open_draft(&ss, model, &params, false)) return 1;
    flm_plan_info plan;
    flm_error err;
    if (flm_plan(model, &params, &plan, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        return 1;
    }
    cli_print_plan(&plan);
    return 0;
}

/* ---- main ----------------------------------------------------------------------------------------------------- */

static const char *MAIN_HELP =
    "usage: flashlm COMMAND [options]   (flashlm COMMAND --help for each)\n"
    "\n"
    "flashlm " FLM_VERSION_STRING " runs large language models whose weights stay on flash.\n"
    "\n"
    "commands:\n"
    "  run        generate text from a prompt (.gguf in memory, or .flm from flash)\n"
    "  chat       a conversation with an instruction-tuned model in its chat template\n"
    "  serve      an OpenAI-compatible HTTP server (chat and text completions, streaming) and a chat page\n"
    "  convert    write the flash layout (.flm) of a GGUF model\n"
    "  verify     check every checksum of a .flm file\n"
    "  calibrate  train the activation predictors of a .flm model on text (enables --mode sparse)\n"
    "  perplexity teacher-forced perplexity of a text (compare modes on the same text)\n"
    "  probe-disk measure the disk holding a model (random/sequential reads) and fit the I/O cost model\n"
    "  plan       print the memory plan of a model under --mem without loading it\n"
    "  bench      measure per-token latency of several modes side by side (the paper's tables)\n"
    "  synth      write a synthetic Llama-shaped GGUF of any size, for benchmarks (meaningless text)\n"
    "  inspect    print a model's architecture, hyper-parameters and tensors\n"
    "  pull       download a model by name (flashlm pull --list); any MODEL argument also takes a NAME\n"
    "  version    print the version\n";

/* FLASHLM_KERNELS (kernels.h levels): an unknown value is refused; one this CPU lacks gives the highest level it has
 * below it, with a note. Returns false after printing the refusal. */
static bool check_kernels_env(void) {
    const char *env = getenv("FLASHLM_KERNELS");
    if (!env || !*env) return true; /* unset or empty: the CPU's best */
    bool known = false;
    const char *best, *used = flm_kernels_in_use(&best);
    char names[128] = "";
    size_t n = 0;
    for (int l = 0; flm_kernels_level_name(l); l++) { /* the library's list of levels */
        known = known || !strcmp(env, flm_kernels_level_name(l));
        n += (size_t)snprintf(names + n, n < sizeof names ? sizeof names - n : 0, "%s%s", l ? ", " : "",
                              flm_kernels_level_name(l));
    }
    if (!known) {
        fprintf(stderr, "flashlm: FLASHLM_KERNELS=%s: not a kernel level (%s)\n", env, names);
        return false;
    }
    if (strcmp(env, used) != 0)
        fprintf(stderr, "flashlm: note: this CPU lacks the FLASHLM_KERNELS=%s level (its best is %s): using %s\n", env,
                best, used);
    return true;
}

/* FLASHLM_THREADS and FLASHLM_SPIN_US (compute/pool.c, docs/ARCHITECTURE.md's table): the pool reads them and
 * falls back to its defaults on a value it cannot use; the CLI refuses such a value instead, by name, so that a typo
 * does not silently run something else. Returns false after printing the refusal. */
static bool check_pool_env(void) {
    const char *t = getenv("FLASHLM_THREADS");
    if (t && *t && strcmp(t, "omp") != 0) {
        fprintf(stderr, "flashlm: FLASHLM_THREADS=%s: the only value is omp (the pool's chunks under OpenMP); unset it "
                "for the pool's own workers\n", t);
        return false;
    }
    const char *s = getenv("FLASHLM_SPIN_US");
    if (s && *s) {
        char *end = NULL;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || *end || v < 0 || v > 1000000) {
            fprintf(stderr, "flashlm: FLASHLM_SPIN_US=%s: not a whole number of microseconds in 0..1000000 (an idle "
                    "worker's spin before it sleeps; default 50)\n", s);
            return false;
        }
    }
    return true;
}

static int dispatch(int argc, char **argv) {
    cli_blas_single_thread(argv);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        fputs(MAIN_HELP, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!check_kernels_env() || !check_pool_env()) return 2;
    if (!strcmp(cmd, "run")) return cmd_run(argc - 2, argv + 2);
    if (!strcmp(cmd, "chat")) return cmd_chat(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 2, argv + 2);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 2, argv + 2);
    if (!strcmp(cmd, "convert")) return cmd_convert(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 2, argv + 2);
    if (!strcmp(cmd, "plan")) return cmd_plan(argc - 2, argv + 2);
    if (!strcmp(cmd, "perplexity")) return cmd_perplexity(argc - 2, argv + 2);
    if (!strcmp(cmd, "calibrate")) return cmd_calibrate(argc - 2, argv + 2);
    if (!strcmp(cmd, "probe-disk")) return cmd_probe(argc - 2, argv + 2);
    if (!strcmp(cmd, "synth")) return cli_cmd_synth(argc - 2, argv + 2);
    if (!strcmp(cmd, "verify")) return cmd_verify(argc - 2, argv + 2);
    if (!strcmp(cmd, "pull")) return cmd_pull(argc - 2, argv + 2);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        if (argc > 2) return cli_die("version takes no arguments ('%s' given)", argv[2]);
        const char *lib, *best;
        int num = flm_version(&lib);
        const char *used = flm_kernels_in_use(&best);
        printf("flashlm %s\n", FLM_VERSION_STRING);
        if (num != FLM_VERSION_NUMBER) printf("(library %s)\n", lib);
        printf("kernels %s (this CPU's best: %s)\n", used, best);
        return 0;
    }
    if (cmd[0] == '-') /* llama-cli's way, options first: the command comes first here */
        fprintf(stderr, "flashlm: '%s' is an option, not a command: put the command first, e.g. `flashlm run %s ...` "
                "(as llama-cli) or `flashlm chat ...`\n\n%s", cmd, cmd, MAIN_HELP);
    else
        fprintf(stderr, "flashlm: unknown command '%s'\n\n%s", cmd, MAIN_HELP);
    return 2;
}

/* Every command's standard output is checked at exit: a write error (a full disk, a closed pipe) is an error. */
int main(int argc, char **argv) { return cli_exit(dispatch(argc, argv)); }
