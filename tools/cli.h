/* cli.h — shared pieces of the flashlm command-line tool (tools/). */
#ifndef FLM_TOOLS_CLI_H
#define FLM_TOOLS_CLI_H
#include <stdbool.h>
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
/* What the library leaves to its caller: log messages go to stderr ("flashlm: <message>"), and the I/O cost model
 * measured by `flashlm probe-disk` ("<model>.probe.json") is used when that file exists. Call before flm_open. */
void cli_env_params(struct flm_params *p, const char *model);
/* OpenBLAS starts its worker threads before main (reading OPENBLAS_NUM_THREADS); only calibrate's training uses
 * BLAS, and raises the count itself. Unless the user set the variable, set it to 1 and execute the program again
 * (argv as given to main), so no idle BLAS threads exist (under `ulimit -v` they spin retrying an allocation and
 * exit hangs joining them). Returns only when it did not re-execute. */
void cli_blas_single_thread(char **argv);
/* Help lines for those options. */
extern const char *CLI_MODEL_OPTS_HELP;

int cmd_bench(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int flm_cmd_synth(int argc, char **argv);

#endif
