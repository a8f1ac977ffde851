/* test_scale_rss.c — the budget is a promise: on a model big enough for memory to matter (scale_common.h), peak RSS
 * stays within budget + the documented 16 MiB allowance in naive and hybrid mode, while ram mode exceeds it, so the
 * check can fail. A few tokens suffice: every buffer is allocated at open, and the per-token statistics live in a
 * ring allocated there too (nothing grows per token; test_faults checks that). */
#include "scale_common.h"

static void test_peak_rss_within_budget(void **state) {
    (void)state;
    double rss, budget, bpt, model_budget;
    run_cli("--mode ram", 4, &rss, &budget, &bpt);
    double ram_rss = rss;
    const char *modes[] = {"--mode naive --mem 50%", "--mode hybrid --mem 50%"};
    for (int i = 0; i < 2; i++) {
        run_cli(modes[i], 4, &rss, &model_budget, &bpt);
        printf("%-24s peak RSS %.1f MiB, budget %.1f MiB (+%.0f MiB allowance); ram mode: %.1f MiB\n", modes[i],
               rss / 1048576, model_budget / 1048576, ALLOWANCE / 1048576, ram_rss / 1048576);
        assert_true(model_budget > 0);
        if (RSS_CHECKED) assert_true(rss <= model_budget + ALLOWANCE);
    }
    /* the check can fail: everything in memory does not fit that budget + allowance */
    if (RSS_CHECKED) assert_true(ram_rss > model_budget + ALLOWANCE);
    else printf("sanitizer build: peak RSS includes shadow memory, not checked\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peak_rss_within_budget),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
