/* spec_cli.c — speculative decoding on the command line (run, chat): the flags, the draft model opened inside the
 * memory budget before the target, the tokenizer check, and the statistics. The engine is tools/spec.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "spec.h"
#include "format/flm.h"
#include "runtime/runtime.h"

const char *CLI_SPEC_OPTS_HELP =
    "      --draft MODEL    speculative decoding: MODEL (a .gguf, .flm or pulled name sharing the target's\n"
    "                       tokenizer, e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b) runs in memory and proposes\n"
    "                       tokens; the target checks them in one batched pass. Greedy output is the same as\n"
    "                       without it; sampling keeps the target's distribution. --mem covers both models: the\n"
    "                       draft's memory comes first, the target gets the rest\n"
    "      --draft-n N      tokens proposed per step (default 4, at most 64)\n"
    "      --draft-ngram    speculative decoding without a draft model: propose the tokens that followed the\n"
    "                       last earlier occurrence of the current 3-, 2- or 1-token sequence in the prompt and\n"
    "                       the generated text (lookup decoding; for text that repeats: code, quotes, lists)\n";

void cli_spec_args_default(cli_spec_args *a) {
    memset(a, 0, sizeof *a);
    a->n_draft = 4;
}

int cli_parse_spec_opt(int argc, char **argv, int *i, cli_spec_args *a) {
    const char *o = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(o, "--draft-ngram")) { a->ngram = true; return 1; }
    if (strcmp(o, "--draft") && strcmp(o, "--draft-n")) return 0;
    if (!val) { cli_die("option %s needs a value", o); return -1; }
    (*i)++;
    if (!strcmp(o, "--draft")) { a->draft = val; return 1; }
    long v;
    if (!cli_parse_long(val, 1, CLI_SPEC_DRAFT_MAX, &v)) { cli_die("bad --draft-n value '%s' (1..64)", val); return -1; }
    a->n_draft = (int)v;
    a->n_draft_set = true;
    return 1;
}

int cli_spec_args_check(const cli_spec_args *a) {
    if (a->draft && a->ngram)
        return cli_die("%s", "--draft and --draft-ngram exclude each other: draft with a model or with the text");
    if (a->n_draft_set && !a->draft && !a->ngram)
        return cli_die("%s", "--draft-n needs --draft MODEL or --draft-ngram");
    return 0;
}

bool cli_spec_active(const cli_spec_args *a) { return a->draft || a->ngram; }

/* The model's weight bytes as flm_open's budget percentages count them: a .flm file's resident region and FFN regions
 * (from its region table: nothing else is read), a GGUF file's size. */
static int model_weight_bytes(const char *path, uint64_t *out) {
    flm_error err;
    if (flm_file_is_flm(path)) {
        flm_file *f = NULL;
        if (flm_file_open_ex(path, FLM_FILE_HEADER_ONLY, &f, &err)) {
            fprintf(stderr, "flashlm: %s\n", err.msg);
            return 1;
        }
        uint64_t ffn, largest;
        flm_ffn_region_bytes(f, &ffn, &largest);
        *out = f->resident->size + ffn;
        flm_file_close(f);
        return 0;
    }
    struct stat sb;
    if (stat(path, &sb) != 0) { /* flm_open says why, naming the file */
        *out = 0;
        return 0;
    }
    *out = (uint64_t)sb.st_size;
    return 0;
}

/* The bytes a context's plan holds: resident weights, FFN storage, KV cache, scratch and reader buffers. */
static uint64_t ctx_bytes(const flm_ctx *ctx, flm_stats *st) {
    flm_get_stats(ctx, st);
    return st->mem_resident + st->mem_ffn + st->mem_kv + st->mem_scratch;
}

/* Resolve --mem to bytes for the target (a percentage is of the target's weights). */
static int resolve_budget(cli_spec_session *ss, const char *target, const flm_params *p) {
    ss->budget = p->mem_bytes;
    if (!ss->budget && p->mem_percent > 0) {
        uint64_t w;
        if (model_weight_bytes(target, &w)) return 1;
        ss->budget = (uint64_t)((double)w * p->mem_percent / 100.0);
        if (w && !ss->budget) ss->budget = 1;
    }
    return 0;
}

int cli_spec_open_draft(cli_spec_session *ss, const char *target, flm_params *params, bool verbose) {
    ss->verbose = verbose;
    if (!cli_spec_active(&ss->a)) return 0;
    if (resolve_budget(ss, target, params)) return 1;
    ss->target_budget = ss->budget;
    if (!ss->a.draft) return 0;
    ss->draft_path = flm_cli_resolve_model(ss->a.draft, ss->draft_buf, sizeof ss->draft_buf);
    flm_params dp;
    flm_params_default(&dp);
    dp.n_threads = params->n_threads;
    dp.n_ctx = params->n_ctx;
    dp.mode = FLM_MODE_RAM;
    dp.mem_bytes = ss->budget; /* the draft alone must fit the whole budget; what it takes is checked below */
    dp.kv_f32 = params->kv_f32;
    dp.io = params->io;
    dp.io_threads = params->io_threads;
    dp.no_direct = params->no_direct;
    cli_env_params(&dp, ss->draft_path);
    flm_error err;
    if (flm_open(ss->draft_path, &dp, &ss->draft, &err)) {
        fprintf(stderr, "flashlm: draft model: %s\n", err.msg);
        if (err.code == FLM_ERR_BUDGET)
            fprintf(stderr, "flashlm: --mem covers the draft and the target together; the draft is opened first\n");
        return 1;
    }
    flm_stats st;
    flm_model_info di;
    flm_get_info(ss->draft, &di);
    ss->draft_bytes = ctx_bytes(ss->draft, &st);
    uint32_t n_ctx = di.n_ctx > (uint32_t)params->n_ctx ? di.n_ctx : (uint32_t)params->n_ctx;
    ss->buf_bytes = cli_spec_buffer_bytes(di.n_vocab, n_ctx, ss->a.n_draft, true);
    uint64_t take = ss->draft_bytes + ss->buf_bytes;
    if (ss->budget && take >= ss->budget) {
        fprintf(stderr, "flashlm: --mem %s: the draft model %s takes %.2f MiB (weights %.2f, KV cache %.2f, scratch "
                "%.2f, speculative decoding buffers %.2f MiB): nothing is left of the budget for the target model %s; "
                "raise --mem or use a smaller draft\n", flm_size(ss->budget).s, ss->draft_path, cli_mib(take),
                cli_mib(st.mem_resident + st.mem_ffn), cli_mib(st.mem_kv), cli_mib(st.mem_scratch),
                cli_mib(ss->buf_bytes), target);
        return 1;
    }
    if (ss->budget) {
        params->mem_bytes = ss->budget - take;
        params->mem_percent = 0;
    }
    ss->target_budget = params->mem_bytes;
    if (verbose)
        fprintf(stderr, "flashlm: plan: draft %s (%s, ram): %.2f MiB (weights %.2f, KV cache %.2f, scratch %.2f) + "
                "speculative decoding buffers %.2f MiB%s%s\n", ss->draft_path, di.arch, cli_mib(ss->draft_bytes),
                cli_mib(st.mem_resident + st.mem_ffn), cli_mib(st.mem_kv), cli_mib(st.mem_scratch),
                cli_mib(ss->buf_bytes), ss->budget ? "; the target gets the rest of the budget: " : "",
                ss->budget ? flm_size(params->mem_bytes).s : "");
    return 0;
}

void cli_spec_target_refused(const cli_spec_session *ss, const flm_status code) {
    if (code == FLM_ERR_BUDGET && ss->draft && ss->budget)
        fprintf(stderr, "flashlm: (the target gets what the draft leaves of --mem %s: %s; the draft takes %.2f MiB)\n",
                flm_size(ss->budget).s, flm_size(ss->budget - ss->draft_bytes - ss->buf_bytes).s,
                cli_mib(ss->draft_bytes + ss->buf_bytes));
}

int cli_spec_begin(cli_spec_session *ss, flm_ctx **target, const char *target_path, flm_params *params,
                   flm_sampler *smp) {
    if (!cli_spec_active(&ss->a)) return 0;
    flm_error err;
    if (ss->draft && cli_spec_check_vocab(*target, target_path, ss->draft, ss->draft_path, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        return 1;
    }
    flm_model_info ti;
    flm_get_info(*target, &ti);
    flm_stats st;
    ss->target_bytes = ctx_bytes(*target, &st);
    if (!ss->draft && ss->budget) {
        /* the n-gram lookup's buffers come out of the budget too: when the target's plan left less than they need,
         * open it again with that much less */
        ss->buf_bytes = cli_spec_buffer_bytes(ti.n_vocab, ti.n_ctx, ss->a.n_draft, false);
        if (ss->target_bytes + ss->buf_bytes > ss->budget) {
            if (ss->buf_bytes >= ss->budget) {
                fprintf(stderr, "flashlm: --mem %s cannot hold the --draft-ngram buffers (%.2f MiB)\n",
                        flm_size(ss->budget).s, cli_mib(ss->buf_bytes));
                return 1;
            }
            if (ss->verbose)
                fprintf(stderr, "flashlm: plan: --draft-ngram buffers %.2f MiB: the target is opened again with a "
                        "budget of %s\n", cli_mib(ss->buf_bytes), flm_size(ss->budget - ss->buf_bytes).s);
            flm_close(*target);
            *target = NULL;
            params->mem_bytes = ss->target_budget = ss->budget - ss->buf_bytes;
            params->mem_percent = 0;
            if (flm_open(target_path, params, target, &err)) {
                fprintf(stderr, "flashlm: %s\n", err.msg);
                fprintf(stderr, "flashlm: (--draft-ngram takes %.2f MiB of --mem %s for its buffers)\n",
                        cli_mib(ss->buf_bytes), flm_size(ss->budget).s);
                return 1;
            }
            if (cli_after_open(*target)) return 1;
            ss->target_bytes = ctx_bytes(*target, &st);
        }
    }
    cli_spec_opts o = {.n_draft = ss->a.n_draft, .ngram = ss->a.ngram};
    if (cli_spec_create(*target, ss->draft, smp, &o, &ss->spec, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        return 1;
    }
    return 0;
}

void cli_spec_print_stats(const cli_spec_session *ss, const flm_ctx *target) {
    if (!ss->spec) return;
    cli_spec_stats s;
    cli_spec_get_stats(ss->spec, &s);
    fprintf(stderr, "flashlm: speculative decoding (%s%s, up to %d per step): %llu tokens generated in %llu target "
            "passes = %.2f tokens per pass; drafted %llu, accepted %llu (%.1f%%); %llu steps without a draft\n",
            ss->draft ? "draft " : "n-gram lookup", ss->draft ? ss->draft_path : "", ss->a.n_draft,
            (unsigned long long)s.n_gen, (unsigned long long)s.n_passes,
            s.n_passes ? (double)s.n_gen / (double)s.n_passes : 0.0, (unsigned long long)s.n_drafted,
            (unsigned long long)s.n_accepted, s.n_drafted ? 100.0 * (double)s.n_accepted / (double)s.n_drafted : 0.0,
            (unsigned long long)s.n_plain);
    double g = s.n_gen ? (double)s.n_gen : 1.0;
    fprintf(stderr, "flashlm: speculative: per generated token: target %.3f ms (%.2f tokens evaluated), %.2f MiB "
            "read, %.1f neurons loaded", s.target_ms / g, (double)s.target_tokens / g, cli_mib(s.bytes_read) / g,
            (double)s.n_loaded / g);
    if (ss->draft)
        fprintf(stderr, "; draft %.3f ms (%.2f tokens evaluated)", s.draft_ms / g, (double)s.draft_tokens / g);
    fprintf(stderr, "; choosing and accepting %.3f ms\n", s.draft_select_ms / g);
    if (ss->budget) {
        flm_stats st;
        flm_get_stats(target, &st);
        uint64_t other = ss->draft_bytes + ss->buf_bytes;
        fprintf(stderr, "flashlm: speculative: budget %s = %s %.2f MiB + target %.2f MiB planned (of %s); peak RSS "
                "%.2f MiB%s\n", flm_size(ss->budget).s, ss->draft ? "draft and buffers" : "n-gram buffers",
                cli_mib(other), cli_mib(ss->target_bytes), flm_size(ss->target_budget).s, cli_mib(st.peak_rss),
                st.peak_rss <= ss->budget ? " (within the budget)"
                : st.peak_rss <= ss->budget + FLM_RSS_ALLOWANCE ? " (within the budget + the 16 MiB allowance)"
                                                                 : " (MORE than the budget + the 16 MiB allowance)");
    } else if (ss->draft) {
        fprintf(stderr, "flashlm: speculative: memory: draft %.2f MiB + buffers %.2f MiB, target %.2f MiB (no "
                "budget)\n", cli_mib(ss->draft_bytes), cli_mib(ss->buf_bytes), cli_mib(ss->target_bytes));
    }
}

void cli_spec_session_close(cli_spec_session *ss) {
    cli_spec_free(ss->spec);
    ss->spec = NULL;
    flm_close(ss->draft);
    ss->draft = NULL;
}
