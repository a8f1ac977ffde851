/* cmd_chat.c — `flashlm chat`: a conversation with an instruction-tuned model, as llama.cpp's conversation mode.
 *
 * Each stdin line is one user turn. The conversation's bookkeeping is the library's session (flm_session_chat_turn):
 * it renders the conversation whole with the model's chat template and, as the KV cache keeps everything already
 * evaluated, evaluates only the text after what the cache holds: the rendered conversation must begin with exactly
 * the text evaluated so far (the earlier rendering plus the reply as it was generated). Where a template rewrites
 * history (e.g. Gemma trims a reply that ended in whitespace) it does not, and the whole conversation is the prompt
 * again (the tokens before the first difference kept).
 *
 * When the context fills: without --context-shift the reply is cut and further turns are refused until /reset; with
 * it, the older half of what follows the kept start (the system part by default) is forgotten (flm_kv_shift) and
 * the conversation goes on. The text the cache began with is still what new text is appended to, so a turn still
 * evaluates only its own tokens. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "flashlm.h"

static const char *CHAT_HELP =
    "usage: flashlm chat -m MODEL [options]\n"
    "\n"
    "Hold a conversation with an instruction-tuned model. Each line read from stdin is one user turn (a prompt\n"
    "\"> \" goes to stderr when stdin is a terminal); each reply is streamed to stdout and ends at the model's\n"
    "end-of-turn token or after -n tokens. The KV cache carries over between turns: only a turn's new tokens are\n"
    "evaluated. End with /exit or end of input (Ctrl-D); /reset starts a new conversation; /help (or /?) lists\n"
    "the commands. A command is the whole line; any other line that begins with / and a letter is refused as an\n"
    "unknown command, not sent: begin it with // to send it from its second / (\"//usr/bin\" sends \"/usr/bin\").\n"
    "A line that is not UTF-8 text, has a NUL byte or gives no tokens is refused too. When the context is full,\n"
    "turns are refused until /reset, unless --context-shift. After a refused line the exit status is 1.\n"
    "\n"
    "  -m, --model PATH     model file: .gguf or .flm (as for flashlm run)\n"
    "  -n, --n-predict N    at most N tokens per reply (default 512; -1: until the end of text or a full context)\n";
static const char *CHAT_HELP_MORE =
    "      --system TEXT    system prompt (default: the template's own, e.g. Qwen2.5's and SmolLM2's; none for\n"
    "                       Gemma and Llama; also -sys, --system-prompt)\n"
    "      --chat-template NAME  chat format instead of the one detected from the model's tokenizer.chat_template\n"
    "                       (or its architecture): " FLM_CHAT_TEMPLATE_NAMES "\n"
    "      --chat-template-file FILE  the chat format of the Jinja template in FILE, known by its family's markers\n"
    "                       (flashlm renders the family itself)\n"
    "      --context-shift  when the context is full, forget the older half of the conversation after the kept\n"
    "                       start (--keep) and go on (llama.cpp's context shift); a turn longer than the context\n"
    "                       then keeps only its end. A turn's text is still read only up to the context's tokens\n"
    "                       times the longest token's bytes (said at the refusal): a longer line is refused\n"
    "      --keep N         with --context-shift, the tokens kept at the start besides BOS (always kept); default\n"
    "                       (and -1): the system part, i.e. everything before the first user message's text\n"
    "  -v, --verbose        print the memory plan; after each reply, say on stderr which positions the turn\n"
    "                       evaluated\n"
    "  -h, --help           this help\n";

typedef struct {
    flm_chat_msg *m;
    size_t n, cap;
} msg_list;

static bool msgs_push(msg_list *l, const char *role, const char *content, size_t len) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        flm_chat_msg *m = realloc(l->m, cap * sizeof *m);
        if (!m) return false;
        l->m = m;
        l->cap = cap;
    }
    char *c = malloc(len + 1);
    if (!c) return false;
    memcpy(c, content, len);
    c[len] = 0;
    l->m[l->n].role = role; /* a static string */
    l->m[l->n].content = c;
    l->n++;
    return true;
}

static void msgs_truncate(msg_list *l, size_t n) {
    while (l->n > n) free((char *)l->m[--l->n].content);
}

/* Read one line (without its newline or a trailing \r) into *line (malloc'd, *cap bytes); false at EOF. A line of
 * more than max bytes is read to its end but not kept: *too_long (its text could not fit the context anyway; held
 * whole it was outside the memory budget). Such a line with a NUL byte past max is binary, not text: reading stops
 * there (*binary; `chat < /dev/zero` skipped its one endless line for ever). false too when out of memory (*oom). */
static bool read_line(char **line, size_t *cap, size_t *len, size_t max, bool *too_long, bool *binary, bool *oom) {
    size_t n = 0;
    int c = EOF;
    bool any = false;
    *too_long = *binary = *oom = false;
    while ((c = getc(stdin)) != EOF) {
        any = true;
        if (c == '\n') break;
        if (*too_long) {
            if (c == 0) { *binary = true; break; }
            continue;
        }
        if (n >= max) { *too_long = true; continue; }
        if (n + 2 > *cap) {
            size_t want = *cap ? *cap * 2 : 256;
            char *more = realloc(*line, want);
            if (!more) { *oom = true; return false; }
            *line = more;
            *cap = want;
        }
        (*line)[n++] = (char)c;
    }
    if (!any) return false;
    if (!*line && !(*line = malloc(*cap = 16))) { *oom = true; return false; }
    while (n > 0 && (*line)[n - 1] == '\r') n--;
    (*line)[n] = 0;
    *len = *too_long ? 0 : n;
    return true;
}

/* --context-shift: the cache forgets the conversation's older turns as it shifts; forget them here too, or a long
 * conversation keeps every message (and renders them all every turn: ~450 B of RSS per turn measured). While the
 * text is longer than the context can hold (max bytes: n_ctx x the longest token), the oldest user and assistant
 * messages after the first `first` (the system message) are dropped, when the rendering of the rest ends as the whole
 * one does past `done`; `done` (the text whose end the cache holds) becomes that rendering less the same end. Returns
 * the messages dropped. */
static size_t chat_forget(msg_list *msgs, cli_buf *done, const flm_chat *t, size_t first, size_t max) {
    size_t dropped = 0;
    while (done->len > max && msgs->n >= first + 4) {
        char *full = NULL, *kept = NULL;
        size_t full_len = 0, kept_len = 0;
        flm_error err;
        if (flm_chat_apply(t, msgs->m, msgs->n, false, &full, &full_len, &err)) break;
        bool ok = full_len >= done->len && !memcmp(full, done->p, done->len);
        size_t tail = ok ? full_len - done->len : 0;
        flm_chat_msg *rest = ok ? malloc(msgs->n * sizeof *rest) : NULL;
        if (rest) {
            memcpy(rest, msgs->m, first * sizeof *rest);
            memcpy(rest + first, msgs->m + first + 2, (msgs->n - first - 2) * sizeof *rest);
            ok = !flm_chat_apply(t, rest, msgs->n - 2, false, &kept, &kept_len, &err) && kept_len >= tail &&
                 kept_len - tail <= done->len && !memcmp(kept + kept_len - tail, full + done->len, tail);
        }
        if (rest && ok) {
            free((char *)msgs->m[first].content);
            free((char *)msgs->m[first + 1].content);
            memmove(msgs->m + first, msgs->m + first + 2, (msgs->n - first - 2) * sizeof *msgs->m);
            msgs->n -= 2;
            memcpy(done->p, kept, kept_len - tail);
            done->len = kept_len - tail;
            done->p[done->len] = 0;
            dropped += 2;
        }
        free(rest);
        free(full);
        free(kept);
        if (!rest || !ok) break;
    }
    return dropped;
}

/* The tokens the conversation starts with up to the first user message's text: BOS, the system turn (--system or
 * the template's default), and whatever the format puts before the user's text (for Gemma the system text is inside
 * the first user turn). What --context-shift keeps by default. 0 when it cannot be told (out of memory). */
static int32_t system_part(const flm_ctx *ctx, const flm_chat *t, const msg_list *sys, unsigned flags) {
    flm_chat_msg m[2] = {{"system", ""}, {"user", ""}};
    size_t n = 0;
    if (sys->n) m[n++] = sys->m[0];
    char *text[2] = {NULL, NULL};
    size_t len[2] = {0, 0};
    flm_error err;
    int32_t keep = 0;
    for (int i = 0; i < 2; i++) { /* two first turns that differ only in the user's text */
        m[n].role = "user";
        m[n].content = i ? "B" : "A";
        if (flm_chat_apply(t, m, n + 1, true, &text[i], &len[i], &err)) goto done;
    }
    size_t common = 0;
    while (common < len[0] && common < len[1] && text[0][common] == text[1][common]) common++;
    /* the ids of the common text, as far as they also begin the ids of a whole first turn */
    size_t n_p = 0, n_a = 0;
    int32_t *p = cli_tokenize(ctx, text[0], common, flags, &n_p);
    int32_t *a = p ? cli_tokenize(ctx, text[0], len[0], flags, &n_a) : NULL;
    while (a && (size_t)keep < n_p && (size_t)keep < n_a && p[keep] == a[keep]) keep++;
    free(p);
    free(a);
done:
    free(text[0]);
    free(text[1]);
    return keep;
}

/* The command line of `flashlm chat`. */
typedef struct chat_args {
    const char *model, *chat_name, *system;
    bool verbose;
    long n_predict;
    flm_params params;
    flm_sampler_params sp;
    cli_shift_opts shift;
} chat_args;

/* One conversation: the model, its session and template, the messages, and the counts the summary prints. */
typedef struct chat_state {
    flm_ctx *ctx;
    flm_chat *tmpl;
    flm_session *sess; /* the library's token loop, speculative or not */
    flm_model_info info;
    cli_gen gen;
    msg_list msgs;
    const char *system;
    bool verbose;
    long n_predict;
    size_t per_token, line_max; /* a turn's bytes: at most line_max, per_token bytes per token */
    int n_turns;
    size_t n_lines;             /* lines read from stdin, for messages */
    bool full;                  /* the context ran out: only /reset or /exit are accepted */
    bool refused;               /* a turn got no reply for want of context: exit status 1 */
    uint64_t n_prompt_tok, n_gen_tok;
    size_t n_forgotten;         /* messages dropped by chat_forget */
    double ms_prompt, ms_gen;
} chat_state;

/* Parse the options into A (and the speculative ones into ss->a). Returns -1 to go on, else the exit status. */
static int chat_parse(int argc, char **argv, chat_args *A, cli_spec_session *ss) {
    A->n_predict = 512;
    flm_params_default(&A->params);
    flm_sampler_params_default(&A->sp);
    cli_spec_args_default(&ss->a);
    A->shift = (cli_shift_opts){false, CLI_KEEP_DEFAULT};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int used = cli_parse_model_opt(argc, argv, &i, &A->params);
        if (!used) used = cli_parse_gen_opt(argc, argv, &i, &A->n_predict, &A->sp);
        if (!used) used = cli_parse_spec_opt(argc, argv, &i, &ss->a);
        if (!used) used = cli_parse_shift_opt(argc, argv, &i, &A->shift);
        if (used < 0) return 2;
        if (used) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s%s%s%s\nshared options:\n%s", CHAT_HELP, CLI_SAMPLING_OPTS_HELP, CLI_SPEC_OPTS_HELP,
                   CHAT_HELP_MORE, CLI_MODEL_OPTS_HELP);
            return 0;
        }
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { A->verbose = true; continue; }
        bool takes = !strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--system") || !strcmp(a, "-sys") ||
                     !strcmp(a, "--system-prompt") ||
                     !strcmp(a, "--chat-template") || !strcmp(a, "--chat-template-file");
        if (!takes) return cli_die("unknown option '%s' (see flashlm chat --help)", a);
        if (!val) return cli_die("option %s needs a value (see flashlm chat --help)", a);
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) A->model = val;
        else if (!strcmp(a, "--system") || !strcmp(a, "-sys") || !strcmp(a, "--system-prompt")) A->system = val;
        else if (!strcmp(a, "--chat-template-file")) {
            if (cli_chat_template_file(val, &A->chat_name)) return 1;
        } else {
            if (!flm_chat_name_valid(val))
                return cli_die("unknown chat template '%s' (valid: " FLM_CHAT_TEMPLATE_NAMES ")", val);
            A->chat_name = val;
        }
    }
    if (!A->model) return cli_die("%s", "no model given: use -m MODEL (see flashlm chat --help)");
    size_t bad = A->system ? flm_utf8_check(A->system, strlen(A->system)) : SIZE_MAX;
    if (bad != SIZE_MAX) /* the tokenizer would drop it without a word */
        return fprintf(stderr, "flashlm: --system: byte 0x%02X at offset %zu is not UTF-8: a system prompt is text\n",
                       (unsigned char)A->system[bad], bad), 2;
    if (cli_spec_args_check(&ss->a)) return 2;
    return -1;
}

/* Open the draft model (if any), the model, its chat template and the session. Returns 0, or 1 with everything
 * opened closed again (the draft model's ss too). */
static int chat_open(chat_args *A, cli_spec_session *ss, chat_state *c) {
    flm_error err;
    /* speculative decoding: the draft model first, inside the budget; the target gets what it leaves */
    ss->a.greedy = A->sp.temp <= 0.0f;
    if (cli_spec_open_draft(ss, A->model, &A->params, A->verbose)) { cli_spec_session_close(ss); return 1; }
    if (flm_open(A->model, &A->params, &c->ctx, &err)) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        cli_spec_target_refused(ss, err.code);
        cli_spec_session_close(ss);
        return 1;
    }
    int bad = cli_after_open(c->ctx);
    if (!bad) cli_note_unused(c->ctx, &A->params, &A->shift);
    if (!bad) cli_spec_note_unused(ss, c->ctx);
    if (!bad) {
        flm_get_info(c->ctx, &c->info);
        fprintf(stderr, "flashlm: model %s (%s, %u layers, d_model %u), context %u tokens, kernels %s, %d threads\n",
                A->model, c->info.arch, c->info.n_layers, c->info.d_model, c->info.n_ctx, c->info.kernels,
                A->params.n_threads);
        bad = cli_chat_template_sys(c->ctx, A->chat_name, A->system, &c->tmpl);
    }
    for (size_t b = 0; !bad && b < A->sp.n_bias; b++)
        if ((uint32_t)A->sp.bias[b].token >= flm_vocab_size(c->ctx)) {
            fprintf(stderr, "flashlm: --logit-bias: token id %d is outside the vocabulary (%u tokens)\n",
                    (int)A->sp.bias[b].token, flm_vocab_size(c->ctx));
            bad = 1;
        }
    if (!bad && (flm_session_create(c->ctx, &c->sess, &err) || flm_session_sampling(c->sess, &A->sp, &err))) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        bad = 1;
    } else if (!bad) {
        flm_session_set_special_in_content(c->sess, cli_allow_special);
        bad = cli_spec_begin(ss, c->ctx, A->model, c->sess);
    }
    if (bad) {
        flm_session_free(c->sess);
        flm_chat_close(c->tmpl);
        flm_close(c->ctx);
        cli_spec_session_close(ss);
        return 1;
    }
    return 0;
}

/* What a line asks for besides a turn. */
enum { TURN_NEXT, TURN_END, TURN_FAIL, TURN_OOM, TURN_TAKE };

/* The commands, for /help and an unknown command's message. */
static const char *CHAT_COMMANDS =
    "commands: /exit ends, /reset starts a new conversation, /help (or /?) lists these; a command is the whole "
    "line; begin a line with // to send it from its second / (\"//etc\" sends \"/etc\")";

/* A line that is no turn: too long, with a NUL, not UTF-8, a command (/exit, /reset, /help, /?) or what looks like
 * one, empty, giving no tokens, or any while the context is full (TURN_NEXT, TURN_END); else TURN_TAKE, with *skip
 * the bytes before the turn's text (1 for a line escaped with //). */
static int chat_line(chat_state *c, const char *line, size_t line_len, bool too_long, size_t *skip) {
    *skip = 0;
    if (too_long) { /* as a turn that does not fit: refused, the conversation goes on */
        c->refused = true;
        if (c->gen.shift) /* the bound on what is read and held: --context-shift keeps a long turn's end, within it */
            fprintf(stderr, "flashlm: line %zu: this turn is longer than %zu bytes, the most a turn may be, also with "
                    "--context-shift (from the context of %u tokens at up to %zu bytes per token): not sent; raise "
                    "-c\n", c->n_lines, c->line_max, c->info.n_ctx, c->per_token);
        else
            fprintf(stderr, "flashlm: this turn (more than %zu bytes, at most %zu bytes per token) is longer than the "
                    "context (%u tokens); raise -c\n", c->line_max, c->per_token, c->info.n_ctx);
        return TURN_NEXT;
    }
    const char *nul = memchr(line, 0, line_len);
    if (nul) { /* as C text it would end there, the rest dropped without a word: refused, the conversation goes on */
        c->refused = true;
        fprintf(stderr, "flashlm: line %zu: this turn has a NUL byte at byte %zu: a prompt is text, not sent\n",
                c->n_lines, (size_t)(nul - line));
        return TURN_NEXT;
    }
    size_t bad = flm_utf8_check(line, line_len);
    if (bad != SIZE_MAX) { /* the tokenizer would drop the byte without a word: refused, the conversation goes on */
        c->refused = true;
        fprintf(stderr, "flashlm: line %zu: byte 0x%02X at byte %zu is not UTF-8: a prompt is text, not sent\n",
                c->n_lines, (unsigned char)line[bad], bad);
        return TURN_NEXT;
    }
    if (!strcmp(line, "/help") || !strcmp(line, "/?")) {
        fprintf(stderr, "flashlm: %s\n", CHAT_COMMANDS);
        return TURN_NEXT;
    }
    if (!strcmp(line, "/exit")) return TURN_END;
    if (!strcmp(line, "/reset")) {
        msgs_truncate(&c->msgs, c->system ? 1 : 0);
        flm_session_chat_reset(c->sess);
        c->gen.pos = 0;
        c->gen.last = -1;
        c->full = false;
        fprintf(stderr, "flashlm: new conversation\n");
        return TURN_NEXT;
    }
    size_t lead = strspn(line, " \t");
    const char *cmd = line + lead;
    if (cmd[0] == '/' && cmd[1] != '/' && (cmd[1] == '?' || (cmd[1] >= 'a' && cmd[1] <= 'z') ||
                                           (cmd[1] >= 'A' && cmd[1] <= 'Z'))) {
        /* "/hlep", "/reset now", " /exit": a command mistyped would otherwise be sent to the model as a turn */
        c->refused = true;
        fprintf(stderr, "flashlm: line %zu: '%.*s' is not a command%s: not sent; %s\n", c->n_lines,
                (int)(line_len > 80 ? 80 : line_len), line, lead ? " (a command is the whole line, without spaces)" : "",
                CHAT_COMMANDS);
        return TURN_NEXT;
    }
    if (line[0] == '/' && line[1] == '/') *skip = 1; /* "//..." sends "/..." */
    if (line_len == 0) return TURN_NEXT;
    if (c->full) {
        c->refused = true;
        fprintf(stderr, "flashlm: the context (%u tokens) is full: /reset starts a new conversation, /exit ends "
                "(or raise -c)\n", c->info.n_ctx);
        return TURN_NEXT;
    }
    size_t n_tok = cli_text_tokens(c->ctx, line + *skip, line_len - *skip);
    if (n_tok == SIZE_MAX) return TURN_OOM;
    if (n_tok == 0) { /* the turn would be the template's tokens alone */
        c->refused = true;
        fprintf(stderr, "flashlm: line %zu: this turn gives no tokens (this tokenizer drops all of its bytes): not "
                "sent\n", c->n_lines);
        return TURN_NEXT;
    }
    return TURN_TAKE;
}

/* After a reply with the context shifted: the session's text of what the cache holds, the oldest turns forgotten. */
static int chat_forget_shifted(chat_state *c) {
    flm_error err;
    size_t held_len;
    const char *held = flm_session_chat_text(c->sess, &held_len);
    cli_buf done = {0};
    if (!cli_buf_add(&done, held, held_len)) return TURN_OOM;
    size_t dropped = chat_forget(&c->msgs, &done, c->tmpl, c->system ? 1 : 0, (size_t)c->info.n_ctx * c->per_token);
    c->n_forgotten += dropped;
    bool ok = !dropped || !flm_session_chat_set_text(c->sess, done.p, done.len, &err);
    cli_buf_free(&done);
    return ok ? TURN_NEXT : TURN_OOM;
}

/* One user turn: the session evaluates what follows the text its cache holds, then the reply is generated and
 * printed. Returns TURN_NEXT, TURN_FAIL (rc 1) or TURN_OOM. */
static int chat_turn(chat_state *c, const char *line, size_t line_len) {
    flm_error err;
    cli_gen *gen = &c->gen;
    const uint32_t n_ctx = c->info.n_ctx;
    size_t n_before = c->msgs.n;
    if (!msgs_push(&c->msgs, "user", line, line_len)) return TURN_OOM;
    /* the session renders the conversation and evaluates only what follows the text its cache holds (all of it when
     * the rendering rewrote that text) */
    double t0 = cli_now_ms();
    long shifts0 = gen->n_shifts;
    flm_chat_turn_info ti;
    flm_status tst = flm_session_chat_turn(c->sess, c->tmpl, c->msgs.m, c->msgs.n, &ti, &err);
    cli_gen_sync(gen);
    if (ti.rewrote)
        fprintf(stderr, "flashlm: the template rewrote earlier turns: evaluating the conversation again from the "
                "first token that differs\n");
    if (tst == FLM_ERR_CONTEXT && !gen->shift) {
        if (ti.from_start)
            fprintf(stderr, "flashlm: this turn (%zu tokens) and its reply do not fit the context of %u tokens; "
                    "raise -c\n", ti.n_new, n_ctx);
        else
            fprintf(stderr, "flashlm: the context (%u tokens) is full: this turn needs %zu more tokens after %d; "
                    "/reset starts a new conversation, /exit ends (or raise -c, or pass --context-shift)\n", n_ctx,
                    ti.n_new, gen->pos);
        msgs_truncate(&c->msgs, n_before);
        c->full = !ti.from_start;
        c->refused = true;
        return TURN_NEXT;
    }
    if (tst == FLM_ERR_CONTEXT) { /* the kept start leaves no room: as a full context */
        fprintf(stderr, "flashlm: the context (%u tokens) is full and the %d kept tokens (--keep) leave nothing to "
                "discard: /reset starts a new conversation, /exit ends (or lower --keep, raise -c)\n", n_ctx,
                gen->n_keep);
        msgs_truncate(&c->msgs, n_before);
        c->full = c->refused = true;
        return TURN_NEXT;
    }
    if (tst) {
        fprintf(stderr, "flashlm: %s\n", err.msg);
        return tst == FLM_ERR_NOMEM ? TURN_OOM : TURN_FAIL;
    }
    size_t n_ids = ti.n_new;
    int32_t pos0 = ti.pos0;
    double t1 = cli_now_ms();
    c->n_prompt_tok += n_ids;
    c->ms_prompt += t1 - t0;
    cli_buf reply = {0};
    cli_reply r;
    if (cli_gen_reply(gen, c->n_predict, true, &reply, &r)) { cli_buf_free(&reply); return TURN_FAIL; }
    c->ms_gen += cli_now_ms() - t1;
    c->n_gen_tok += (uint64_t)r.n_gen;
    c->n_turns++;
    if (!cli_stdout_put("\n", 1)) { cli_stdout_failed(); cli_buf_free(&reply); return TURN_FAIL; } /* a full disk, a
                                                                                                       closed pipe */
    if (c->verbose && gen->n_shifts == shifts0)
        fprintf(stderr, "flashlm: turn %d: prompt tokens at positions [%d, %d), reply of %ld tokens%s; the "
                "cache holds %d tokens\n", c->n_turns, pos0, pos0 + (int32_t)n_ids, r.n_gen,
                r.eog ? " (ended by the model)" : "", gen->pos);
    else if (c->verbose)
        fprintf(stderr, "flashlm: turn %d: %zu prompt tokens from position %d, reply of %ld tokens%s; the context "
                "shifted %ld time%s (%ld tokens discarded in all, the first %d kept); the cache holds %d tokens\n",
                c->n_turns, n_ids, pos0, r.n_gen, r.eog ? " (ended by the model)" : "", gen->n_shifts - shifts0,
                gen->n_shifts - shifts0 > 1 ? "s" : "", gen->n_discarded, gen->n_keep, gen->pos);
    bool pushed = msgs_push(&c->msgs, "assistant", reply.p ? reply.p : "", reply.len);
    cli_buf_free(&reply);
    if (!pushed) return TURN_OOM;
    if (gen->shift && gen->n_shifts && chat_forget_shifted(c) == TURN_OOM) return TURN_OOM;
    if (r.ctx_full) {
        c->full = true;
        if (gen->shift)
            fprintf(stderr, "flashlm: the context (%u tokens) is full and the %d kept tokens (--keep) leave nothing "
                    "to discard: the reply was cut; /reset starts a new conversation, /exit ends (or lower --keep, "
                    "raise -c)\n", n_ctx, gen->n_keep);
        else
            fprintf(stderr, "flashlm: the context (%u tokens) is full: the reply was cut; /reset starts a new "
                    "conversation, /exit ends (or raise -c, or pass --context-shift)\n", n_ctx);
    }
    return TURN_NEXT;
}

/* The conversation's closing lines on stderr: replies, speeds, speculative counts, context shifts. */
static void chat_summary(const chat_state *c, cli_spec_session *ss) {
    fprintf(stderr, "flashlm: %d replies; prompt %llu tokens in %.2f ms = %.2f tokens/s; generation %llu tokens in "
            "%.2f ms = %.2f tokens/s\n", c->n_turns, (unsigned long long)c->n_prompt_tok, c->ms_prompt,
            c->ms_prompt > 0 ? c->n_prompt_tok * 1e3 / c->ms_prompt : 0.0, (unsigned long long)c->n_gen_tok, c->ms_gen,
            c->ms_gen > 0 ? c->n_gen_tok * 1e3 / c->ms_gen : 0.0);
    cli_spec_print_stats(ss, c->ctx, c->sess);
    if (c->gen.n_shifts)
        fprintf(stderr, "flashlm: context shift: %ld time%s, %ld tokens discarded in all (the first %d kept); %zu "
                "messages held, %zu older ones forgotten\n", c->gen.n_shifts, c->gen.n_shifts > 1 ? "s" : "",
                c->gen.n_discarded, c->gen.n_keep, c->msgs.n, c->n_forgotten);
}

int cmd_chat(int argc, char **argv) {
    static chat_args A;
    static cli_spec_session ss; /* speculative decoding (large: a path buffer) */
    memset(&A, 0, sizeof A);
    memset(&ss, 0, sizeof ss);
    int rc = chat_parse(argc, argv, &A, &ss);
    if (rc >= 0) return rc;
    char model_buf[4096];
    A.model = cli_resolve_model(A.model, model_buf, sizeof model_buf); /* a pulled model's name */
    cli_env_params(&A.params, A.model); /* the log, the disk probe's cost model: as run's */
    cli_log_verbose(&A.params, A.verbose); /* -v: the memory plan too */
    static chat_state c;
    memset(&c, 0, sizeof c);
    if (chat_open(&A, &ss, &c)) return 1;
    c.system = A.system;
    c.verbose = A.verbose;
    c.n_predict = A.n_predict;
    bool tty = isatty(0);
    if (tty) fprintf(stderr, "flashlm: one line per turn; /reset starts a new conversation, /exit (or Ctrl-D) ends, "
                     "/help lists the commands\n");
    c.gen = (cli_gen){.ctx = c.ctx, .sess = c.sess, .n_ctx = c.info.n_ctx, .last = -1};
    char *line = NULL;
    size_t line_cap = 0, line_len;
    rc = 0;
    int what = TURN_NEXT;
    if (A.system && !msgs_push(&c.msgs, "system", A.system, strlen(A.system))) what = TURN_OOM;
    if (what == TURN_NEXT && A.shift.on) { /* what a context shift keeps: --keep N tokens after BOS, else the system
                                              part */
        c.gen.shift = true;
        bool bos = flm_add_bos(c.ctx);
        if (A.shift.keep >= 0) c.gen.n_keep = (int32_t)A.shift.keep + bos;
        else c.gen.n_keep = system_part(c.ctx, c.tmpl, &c.msgs,
                                        FLM_TOKENIZE_PARSE_SPECIAL | (bos ? FLM_TOKENIZE_BOS : 0u));
        if (A.verbose) fprintf(stderr, "flashlm: context shift on: the first %d tokens are kept\n", c.gen.n_keep);
    }
    if (what == TURN_NEXT) {
        flm_session_set_shift(c.sess, c.gen.shift, c.gen.n_keep);
        c.line_max = cli_prompt_max_bytes(c.ctx, c.info.n_ctx, &c.per_token);
    }
    while (what == TURN_NEXT) {
        if (tty) { fprintf(stderr, "> "); fflush(stderr); }
        bool too_long, binary, oom;
        if (!read_line(&line, &line_cap, &line_len, c.line_max, &too_long, &binary, &oom)) {
            what = oom ? TURN_OOM : TURN_END;
            if (!oom && ferror(stdin)) { /* not the end of input: `chat < DIR` ended as if it were, exit 0 */
                fprintf(stderr, "flashlm: cannot read standard input: %s\n", strerror(errno));
                what = TURN_FAIL;
            }
            break;
        }
        if (binary) { /* no end of line to skip to: the conversation cannot go on */
            fprintf(stderr, "flashlm: standard input: a line of more than %zu bytes with a NUL byte in it is not text; "
                    "stopped\n", c.line_max);
            what = TURN_FAIL;
            break;
        }
        c.n_lines++;
        size_t skip;
        what = chat_line(&c, line, line_len, too_long, &skip);
        if (what == TURN_TAKE) what = chat_turn(&c, line + skip, line_len - skip);
    }
    if (what == TURN_OOM) fprintf(stderr, "flashlm: out of memory\n");
    if (what == TURN_OOM || what == TURN_FAIL) rc = 1;
    chat_summary(&c, &ss);
    if (c.refused && !rc) rc = 1;
    free(line);
    msgs_truncate(&c.msgs, 0);
    free(c.msgs.m);
    flm_session_free(c.sess);
    flm_chat_close(c.tmpl);
    flm_close(c.ctx);
    cli_spec_session_close(&ss); /* the draft model, after the target */
    return rc;
}
