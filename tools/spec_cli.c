/* spec_cli.c — speculative decoding on the command line (run, chat, serve): the flags, the draft model opened inside
 * the memory budget before the target, the tokenizer check, and the statistics. The engine is the library's session
 * (flm_session_speculate, src/session/spec.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char *CLI_SPEC_OPTS_HELP =
    "      --draft MODEL    speculative decoding: MODEL (a .gguf, .flm or pulled name sharing the target's\n"
    "                       tokenizer, e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b) runs in memory and proposes\n"
    "                       tokens; the target checks them in one batched pass. Greedy output is the same as\n"
    "                       without it; sampling keeps the target's distribution. --mem covers both models: the\n"
    "                       draft's memory comes first, the target gets the rest\n"
    "      --draft-n N      tokens proposed per step (default 4, at most 64)\n"
    "      --draft-ngram    speculative decoding without a draft model: propose the tokens that followed the\n"
    "                       last earlier occurrence of the current 3-, 2- or 1-token sequence in the prompt and\n"
    "                       the generated text (lookup decoding; for text that repeats: code, quotes, lists)\n"
    "      --draft-self     speculative decoding without a draft model: the model itself proposes, each FFN\n"
    "                       over the hottest neurons it keeps in memory (mode hot; nothing read), and checks\n"
    "                       the proposals in one pass that reads the rest of each layer once for all of them;\n"
    "                       the draft length (up to --draft-n) follows the measured costs. Mode auto turns it on\n"
    "                       when it runs hot (a file `flashlm calibrate` ordered, under a budget)\n"
    "      --draft-tree N   the self-draft proposes a tree of up to N nodes (2..64; each node's likeliest next\n"
    "                       tokens as children, --draft-n levels deep) and the target checks the whole tree in\n"
    "                       one pass with tree attention, keeping the longest branch it agrees with (implies\n"
    "                       --draft-self)\n"
    "      --draft-window S the share S (0..0.9) of the FFN memory the self-draft's window of recently active\n"
    "                       neurons takes from the hottest prefix (mode hot; default " CLI_STR(CLI_DRAFT_WINDOW_DEFAULT) ")\n"
    "      --no-draft       no speculative decoding, not even auto's self-draft\n";

void cli_spec_args_default(cli_spec_args *a) {
    memset(a, 0, sizeof *a);
    a->n_draft = 4;
    a->draft_window = CLI_DRAFT_WINDOW_DEFAULT;
}

int cli_parse_spec_opt(int argc, char **argv, int *i, cli_spec_args *a) {
    const char *o = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(o, "--draft-ngram")) { a->ngram = true; return 1; }
    if (!strcmp(o, "--draft-self")) { a->self_draft = true; return 1; }
    if (!strcmp(o, "--no-draft")) { a->no_draft = true; return 1; }
    if (strcmp(o, "--draft") && strcmp(o, "--draft-n") && strcmp(o, "--draft-tree") && strcmp(o, "--draft-window"))
        return 0;
    if (!val) { cli_die("option %s needs a value", o); return -1; }
    (*i)++;
    if (!strcmp(o, "--draft")) { a->draft = val; return 1; }
    if (!strcmp(o, "--draft-window")) {
        float w;
        if (!cli_parse_float(val, 0.0f, 0.9f, &w)) { cli_die("bad --draft-window value '%s' (0..0.9)", val); return -1; }
        a->draft_window = w;
        a->draft_window_set = true;
        return 1;
    }
    long v;
    if (!strcmp(o, "--draft-tree")) {
        if (!cli_parse_long(val, 2, CLI_SPEC_DRAFT_MAX, &v)) { cli_die("bad --draft-tree value '%s' (2..64)", val); return -1; }
        a->tree = (int)v;
        a->self_draft = true;
        return 1;
    }
    if (!cli_parse_long(val, 1, CLI_SPEC_DRAFT_MAX, &v)) { cli_die("bad --draft-n value '%s' (1..64)", val); return -1; }
    a->n_draft = (int)v;
    a->n_draft_set = true;
    return 1;
}

int cli_spec_args_check(const cli_spec_args *a) {
    if (a->draft && a->ngram)
        return cli_die("%s", "--draft and --draft-ngram exclude each other: draft with a model or with the text");
    if (a->no_draft && (a->draft || a->ngram || a->self_draft))
        return cli_die("%s", "--no-draft excludes --draft, --draft-ngram and --draft-self");
    if (a->self_draft && (a->draft || a->ngram))
        return cli_die("%s", "--draft-self excludes --draft and --draft-ngram: one draft source at a time");
    if (a->n_draft_set && !a->draft && !a->ngram && !a->self_draft)
        return cli_die("%s", "--draft-n needs --draft MODEL, --draft-ngram or --draft-self");
    if (a->draft_window_set && (a->draft || a->ngram || a->no_draft))
        return cli_die("%s", "--draft-window is the self-draft's (--draft-self, or mode auto running hot)");
    return 0;
}

bool cli_spec_active(const cli_spec_args *a) { return a->draft || a->ngram || a->self_draft; }

void cli_spec_note_unused(const cli_spec_session *ss, const flm_ctx *ctx) {
    flm_plan_info plan;
    flm_get_plan(ctx, &plan);
    if (ss->a.draft_window_set && !ss->a.self_draft && !plan.self_draft)
        fprintf(stderr, "flashlm: note: --draft-window is the self-draft's; this run has none (mode %s%s): it is not "
                "used\n", flm_mode_name(plan.mode), plan.gguf ? ", a GGUF file" : "");
}

/* The bytes a context's plan holds: resident weights, FFN storage, KV cache, scratch and reader buffers. */
static uint64_t ctx_bytes(const flm_ctx *ctx, flm_stats *st) {
    flm_get_stats(ctx, st);
    return st->mem_resident + st->mem_ffn + st->mem_kv + st->mem_scratch;
}

int cli_spec_open_draft(cli_spec_session *ss, const char *target, flm_params *params, bool verbose) {
    ss->verbose = verbose;
    if (!cli_spec_active(&ss->a)) { /* mode auto's self-draft is the plan's (flm_plan_info.self_draft) */
        params->no_draft = ss->a.no_draft;
        if (ss->a.draft_window_set) params->draft_window = ss->a.draft_window > 0 ? ss->a.draft_window : -1;
        return 0;
    }
    params->no_draft = true; /* another source than auto's: the plan holds no self-draft of its own */
    if (ss->a.self_draft && params->mode == FLM_MODE_AUTO)
        params->mode = FLM_MODE_HOT; /* --draft-self asked: what it drafts from */
    if (ss->a.self_draft) params->draft_window = ss->a.draft_window; /* the window pays only with a self-draft */
    flm_params dp;
    flm_params_default(&dp);
    if (ss->a.draft) {
        ss->draft_path = cli_resolve_model(ss->a.draft, ss->draft_buf, sizeof ss->draft_buf);
        dp.n_threads = params->n_threads;
        dp.n_ctx = params->n_ctx;
        dp.mode = FLM_MODE_RAM;
        dp.kv_f32 = params->kv_f32;
        dp.io = params->io;
        dp.io_threads = params->io_threads;
        dp.no_direct = params->no_direct;
        cli_env_params(&dp, ss->draft_path);
    }
    if (!ss->a.draft && !params->mem_bytes && !(params->mem_percent > 0)) return 0; /* n-gram lookup, no budget */
    /* the buffers speculative decoding holds beside the models: sized from the model that proposes (its vocabulary
     * and context; flm_plan reads them from the file's header) */
    flm_error err;
    flm_plan_info facts;
    flm_params fp = ss->a.draft ? dp : *params;
    fp.mem_bytes = 0;
    fp.mem_percent = 0;
    if (flm_plan(ss->a.draft ? ss->draft_path : target, &fp, &facts, &err)) {
        fprintf(stderr, "flashlm: %s%s\n", ss->a.draft ? "draft model: " : "", err.msg);
        return 1;
    }
    uint32_t n_ctx = facts.n_ctx > (uint32_t)params->n_ctx ? facts.n_ctx : (uint32_t)params->n_ctx;
    flm_spec_params sp;
    cli_spec_params(&ss->a, &sp);
    ss->buf_bytes = flm_spec_buffer_bytes(facts.n_vocab, ss->a.draft ? n_ctx : facts.n_ctx, &sp, ss->a.draft != NULL,
                                          ss->a.greedy);
    /* one budget for both (the library's split: runtime/plan.c) */
    flm_plan_pair pair;
    if (flm_plan_split(target, params, ss->a.draft ? ss->draft_path : NULL, &dp, ss->buf_bytes, &pair, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        if (err.code == FLM_ERR_BUDGET && ss->a.draft && !pair.draft.total)
            fprintf(stderr, "flashlm: --mem covers the draft and the target together; the draft is opened first\n");
        else if (err.code == FLM_ERR_BUDGET && ss->a.draft && pair.target.budget)
            fprintf(stderr, "flashlm: (the target gets what the draft leaves of --mem %s: %s; the draft takes %.2f "
                    "MiB)\n", cli_size(pair.budget).s, cli_size(pair.target.budget).s,
                    cli_mib(pair.draft.total + ss->buf_bytes));
        else if (err.code == FLM_ERR_BUDGET && !ss->a.draft)
            fprintf(stderr, "flashlm: (%s takes %.2f MiB of --mem %s for its buffers)\n",
                    ss->a.self_draft ? "--draft-self" : "--draft-ngram", cli_mib(ss->buf_bytes),
                    cli_size(pair.budget).s);
        return 1;
    }
    ss->budget = pair.budget;
    ss->target_budget = pair.target.budget;
    if (pair.budget) {
        params->mem_bytes = pair.target.budget;
        params->mem_percent = 0;
    }
    if (!ss->a.draft) {
        if (verbose && pair.budget && pair.target.budget < pair.budget)
            fprintf(stderr, "flashlm: plan: %s buffers %.2f MiB: the target gets a budget of %s\n",
                    ss->a.self_draft ? "--draft-self" : "--draft-ngram", cli_mib(ss->buf_bytes),
                    cli_size(pair.target.budget).s);
        return 0;
    }
    dp.mem_bytes = pair.draft.budget;
    if (flm_open(ss->draft_path, &dp, &ss->draft, &err)) {
        fprintf(stderr, "flashlm: draft model: %s\n", err.msg);
        return 1;
    }
    flm_stats st;
    flm_model_info di;
    flm_get_info(ss->draft, &di);
    ss->draft_bytes = ctx_bytes(ss->draft, &st);
    if (verbose)
        fprintf(stderr, "flashlm: plan: draft %s (%s, ram): %.2f MiB (weights %.2f, KV cache %.2f, scratch %.2f) + "
                "speculative decoding buffers %.2f MiB%s%s\n", ss->draft_path, di.arch, cli_mib(ss->draft_bytes),
                cli_mib(st.mem_resident + st.mem_ffn), cli_mib(st.mem_kv), cli_mib(st.mem_scratch),
                cli_mib(ss->buf_bytes), ss->budget ? "; the target gets the rest of the budget: " : "",
                ss->budget ? cli_size(params->mem_bytes).s : "");
    return 0;
}

void cli_spec_target_refused(const cli_spec_session *ss, const flm_status code) {
    if (code == FLM_ERR_BUDGET && ss->draft && ss->budget)
        fprintf(stderr, "flashlm: (the target gets what the draft leaves of --mem %s: %s; the draft takes %.2f MiB)\n",
                cli_size(ss->budget).s, cli_size(ss->budget - ss->draft_bytes - ss->buf_bytes).s,
                cli_mib(ss->draft_bytes + ss->buf_bytes));
}

void cli_spec_params(const cli_spec_args *a, flm_spec_params *p) {
    flm_spec_params_default(p);
    p->n_draft = a->n_draft;
    p->ngram = a->ngram && !a->draft;
    p->self_draft = a->self_draft;
    p->adaptive = a->self_draft;
    p->tree = a->tree;
}

int cli_spec_begin(cli_spec_session *ss, flm_ctx *target, const char *target_path, flm_session *sess) {
    flm_stats st;
    if (!cli_spec_active(&ss->a)) {
        flm_plan_info plan; /* mode auto running hot: the session decodes with the plan's self-draft */
        flm_get_plan(target, &plan);
        if (!plan.self_draft) return 0;
        ss->auto_self = ss->a.self_draft = ss->on = true;
        ss->a.tree = plan.draft_tree;
        ss->a.n_draft = plan.draft_depth;
        ss->buf_bytes = plan.spec;
        ss->budget = plan.budget;
        ss->target_budget = plan.budget - plan.spec;
        ss->target_bytes = ctx_bytes(target, &st);
        if (ss->verbose)
            fprintf(stderr, "flashlm: plan: mode auto runs hot, so it decodes speculatively with the self-draft (the "
                    "hottest and the recently active neurons in memory propose a tree of up to %d tokens, %d deep; its "
                    "buffers %.2f MiB are inside the budget; --no-draft turns it off)\n", ss->a.tree, ss->a.n_draft,
                    cli_mib(plan.spec));
        return 0;
    }
    flm_error err;
    if (ss->draft && flm_spec_check_vocab(target, target_path, ss->draft, ss->draft_path, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        return 1;
    }
    ss->target_bytes = ctx_bytes(target, &st); /* the budget was split before the target opened (cli_spec_open_draft) */
    if (ss->a.self_draft && !flm_has_self_draft(target)) { /* the library's message did not say which part is missing */
        flm_plan_info plan;
        flm_get_plan(target, &plan);
        fprintf(stderr, "flashlm: --draft-self: %s runs mode %s%s, so nothing is read from flash for a self-draft to "
                "save: it needs mode hot (or auto) and a --mem below what the model needs (%.2f MiB of weights)\n",
                target_path, flm_mode_name(plan.mode),
                plan.mode != FLM_MODE_HOT ? ""
                : plan.budget ? " with every neuron in memory under this budget" : " without a budget (--mem)",
                cli_mib(plan.model_bytes));
        return 1;
    }
    flm_spec_params o;
    cli_spec_params(&ss->a, &o);
    if (flm_session_speculate(sess, &o, ss->draft, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        return 1;
    }
    ss->on = true;
    return 0;
}

void cli_spec_print_stats(const cli_spec_session *ss, const flm_ctx *target, const flm_session *sess) {
    if (!ss->on) return;
    flm_spec_stats s;
    flm_session_spec_stats(sess, &s);
    fprintf(stderr, "flashlm: speculative decoding (%s%s, up to %d per step): %llu tokens generated in %llu target "
            "passes = %.2f tokens per pass; drafted %llu, accepted %llu (%.1f%%); %llu steps without a draft\n",
            ss->draft ? "draft " : ss->a.self_draft ? "self-draft" : "n-gram lookup", ss->draft ? ss->draft_path : "",
            ss->a.n_draft,
            (unsigned long long)s.n_gen, (unsigned long long)s.n_passes,
            s.n_passes ? (double)s.n_gen / (double)s.n_passes : 0.0, (unsigned long long)s.n_drafted,
            (unsigned long long)s.n_accepted, s.n_drafted ? 100.0 * (double)s.n_accepted / (double)s.n_drafted : 0.0,
            (unsigned long long)s.n_plain);
    double g = s.n_gen ? (double)s.n_gen : 1.0;
    fprintf(stderr, "flashlm: speculative: per generated token: target %.3f ms (%.2f tokens evaluated), %.2f MiB "
            "read, %.1f neurons loaded", s.target_ms / g, (double)s.target_tokens / g, cli_mib(s.bytes_read) / g,
            (double)s.n_loaded / g);
    if (ss->draft || ss->a.self_draft)
        fprintf(stderr, "; draft %.3f ms (%.2f tokens evaluated)", s.draft_ms / g, (double)s.draft_tokens / g);
    fprintf(stderr, "; choosing and accepting %.3f ms\n", s.draft_select_ms / g);
    fprintf(stderr, "flashlm: speculative: verification pass ms by rows (rows: mean ms x passes):");
    for (int k = 1; k <= CLI_SPEC_DRAFT_MAX + 1; k++)
        if (s.verify_n[k])
            fprintf(stderr, " %d: %.1f x %llu", k, s.verify_ms[k] / (double)s.verify_n[k],
                    (unsigned long long)s.verify_n[k]);
    fprintf(stderr, "\n");
    if (ss->budget) {
        flm_stats st;
        flm_get_stats(target, &st);
        uint64_t other = ss->draft_bytes + ss->buf_bytes;
        fprintf(stderr, "flashlm: speculative: budget %s = %s %.2f MiB + target %.2f MiB planned (of %s); peak RSS "
                "%.2f MiB%s\n", cli_size(ss->budget).s, ss->draft ? "draft and buffers" : ss->a.self_draft ? "self-draft buffers" : "n-gram buffers",
                cli_mib(other), cli_mib(ss->target_bytes), cli_size(ss->target_budget).s, cli_mib(st.peak_rss),
                st.peak_rss <= ss->budget ? " (within the budget)"
                : st.peak_rss <= ss->budget + FLM_RSS_ALLOWANCE ? " (within the budget + the 16 MiB allowance)"
                                                                 : " (MORE than the budget + the 16 MiB allowance)");
    } else if (ss->draft) {
        fprintf(stderr, "flashlm: speculative: memory: draft %.2f MiB + buffers %.2f MiB, target %.2f MiB (no "
                "budget)\n", cli_mib(ss->draft_bytes), cli_mib(ss->buf_bytes), cli_mib(ss->target_bytes));
    }
}

void cli_spec_session_close(cli_spec_session *ss) {
    ss->on = false;
    flm_close(ss->draft);
    ss->draft = NULL;
}
