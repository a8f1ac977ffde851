/* test_cli_ulimit.c — the CLI under a tight address-space limit (issue 12, #1): with `ulimit -v 180000` OpenBLAS'
 * worker threads, started before main, spun retrying an allocation and `flashlm version` hung at exit joining them;
 * `run` hung after printing everything; and any BLAS call (calibrate's training, the sparse predictor) spins forever
 * when OpenBLAS cannot map its 128 MiB work buffer. Now: the CLI always runs OpenBLAS single-threaded
 * (OPENBLAS_NUM_THREADS=1 even when the user set another value), and calibrate checks that the buffer fits first
 * (tools/cli_util.c cli_blas_reserve); the sparse mode predicts with the runtime's kernels and needs no BLAS. Every command must work or fail with a clear message;
 * never hang (exit 124 from timeout below). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "flashlm.h"
#include "testutil.h"

/* Run `flashlm <args>` under ulimit -v KiB with a 120 s timeout and the environment `env` (e.g.
 * "OPENBLAS_NUM_THREADS=4"); return the exit status (124: timed out) and the output in *out. */
static int run_limited(long kib, const char *env, const char *args, char **out) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "env -u OPENBLAS_NUM_THREADS %s timeout 120 sh -c \"ulimit -v %ld; exec '%s' %s\" 2>&1",
             env, kib, FLM_CLI, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0, n;
    char *buf = malloc(cap);
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) len += n;
    buf[len] = 0;
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect_ok(long kib, const char *env, const char *args, const char *want) {
    char *out;
    int rc = run_limited(kib, env, args, &out);
    if (rc != 0) fail_msg("%s flashlm %s under ulimit -v %ld: exit %d (124 = hung)\n%s", env, args, kib, rc, out);
    if (want && !strstr(out, want)) fail_msg("flashlm %s: output lacks '%s':\n%s", args, want, out);
    free(out);
}

/* Works, or fails (exit 1) saying the limit is why: never hangs, never crashes. */
static void expect_ok_or_limit(long kib, const char *args) {
    char *out;
    int rc = run_limited(kib, "", args, &out);
    if (rc != 0 && !(rc == 1 && strstr(out, "ulimit -v") && strstr(out, "raise the limit")))
        fail_msg("flashlm %s under ulimit -v %ld: exit %d (124 = hung), no clear message\n%s", args, kib, rc, out);
    free(out);
}

/* AddressSanitizer reserves terabytes of shadow address space: nothing starts under ulimit -v */
#ifdef FLM_SANITIZED_BUILD
#define SKIP_UNDER_ASAN() skip()
#else
#define SKIP_UNDER_ASAN() ((void)0)
#endif

static void test_version_and_help_under_ulimit(void **state) {
    (void)state;
    SKIP_UNDER_ASAN();
    expect_ok(180000, "", "version", "flashlm " FLM_VERSION_STRING);
    expect_ok(180000, "", "--help", "usage: flashlm COMMAND");
    /* the user's own thread count is overridden: 4 threads used to hang the same way */
    expect_ok(180000, "OPENBLAS_NUM_THREADS=4", "version", "flashlm " FLM_VERSION_STRING);
    expect_ok(180000, "OPENBLAS_NUM_THREADS=4 OMP_NUM_THREADS=4", "run --help", "usage: flashlm run");
}

/* A model run to its end (GGUF in memory; .flm in every streaming mode), calibrate, and sparse mode. */
static void test_commands_under_ulimit(void **state) {
    (void)state;
    SKIP_UNDER_ASAN();
    char args[4096];
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 8 --temp 0",
             tu_data("models/stories260K/stories260K.gguf"));
    expect_ok(180000, "OPENBLAS_NUM_THREADS=2", args, "generation");
    /* a tiny synthetic model, converted and calibrated without a limit */
    const char *g = tu_tmp("ulimit", ".gguf"), *f = tu_tmp("ulimit", ".flm");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "synth '%s' --d-model 32 --d-ffn 64 --layers 2 --heads 2 --vocab 259 --type q8_0 "
             "--calib 8 -f >/dev/null 2>&1 && '%s' convert '%s' '%s' --force >/dev/null 2>&1", g, FLM_CLI, g, f);
    assert_int_equal(tu_run_cli(cmd, NULL), 0);
    const char *modes[] = {"ram", "naive", "hybrid"};
    for (int m = 0; m < 3; m++) {
        snprintf(args, sizeof args, "run -m '%s' --mode %s -p hi -n 4 --temp 0", f, modes[m]);
        expect_ok(180000, "", args, "generation");
    }
    snprintf(args, sizeof args, "calibrate '%s' --text '%s' -t 2", f, tu_data("text/tinystories_sample.txt"));
    expect_ok_or_limit(180000, args);
    /* with room for OpenBLAS: calibrate works; the sparse mode works under the tight limit too (no BLAS) */
    expect_ok(400000, "", args, NULL);
    snprintf(args, sizeof args, "run -m '%s' --mode sparse -p hi -n 4 --temp 0", f);
    expect_ok(180000, "", args, "generation");
    remove(g);
    remove(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_and_help_under_ulimit),
        cmocka_unit_test(test_commands_under_ulimit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
