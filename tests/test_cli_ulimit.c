/* test_cli_ulimit.c — the CLI exits under a tight address-space limit (issue 12, #1): with `ulimit -v 180000` OpenBLAS'
 * worker threads, started before main, spun retrying an allocation and `flashlm version` hung at exit joining them.
 * The CLI now runs with OPENBLAS_NUM_THREADS=1 unless the user set it (tools/cli.h, cli_blas_single_thread). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "flashlm.h"
#include "testutil.h"

/* Run `flashlm <args>` under ulimit -v 180000 (KiB) with a 60 s timeout, OPENBLAS_NUM_THREADS unset; return the exit
 * status (124: timed out) and the output in *out. */
static int run_limited(const char *args, char **out) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "env -u OPENBLAS_NUM_THREADS timeout 60 sh -c \"ulimit -v 180000; exec '%s' %s\" 2>&1",
             FLM_CLI, args);
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

static void test_version_and_help_under_ulimit(void **state) {
    (void)state;
#ifdef FLM_SANITIZED_BUILD
    skip(); /* AddressSanitizer reserves terabytes of shadow address space: nothing starts under ulimit -v */
#endif
    char *out;
    int rc = run_limited("version", &out);
    if (rc != 0) fail_msg("flashlm version under ulimit -v 180000: exit %d (124 = hung)\n%s", rc, out);
    assert_non_null(strstr(out, "flashlm " FLM_VERSION_STRING));
    free(out);
    rc = run_limited("--help", &out);
    if (rc != 0) fail_msg("flashlm --help under ulimit -v 180000: exit %d (124 = hung)\n%s", rc, out);
    assert_non_null(strstr(out, "usage: flashlm COMMAND"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_and_help_under_ulimit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
