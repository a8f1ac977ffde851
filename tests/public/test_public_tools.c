/* test_public_tools.c — the tools tier as a user links it: this program includes flashlm.h and flashlm_tools.h only
 * and links libflashlm_tools.a (both tiers in one object, internal symbols local) with OpenBLAS and LAPACKE. It
 * converts stories260K, verifies and inspects the result and reads its (absent) calibration through the public
 * calls the CLI uses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flashlm.h"
#include "flashlm_tools.h"
#include "testutil.h"

/* An internal name of the tools tier: were it global in libflashlm_tools.a, linking would fail. */
int flm_calibrate_levels(void);
int flm_calibrate_levels(void) { return 3; }

static void test_convert_verify_inspect(void **state) {
    (void)state;
    assert_int_equal(flm_calibrate_levels(), 3); /* ours */
    char dst[4096];
    snprintf(dst, sizeof dst, "%s/public_tools_%d.flm", FLM_TEST_TMPDIR, (int)getpid());
    flm_error err;
    flm_convert_info ci;
    if (flm_convert_ex(tu_data("models/stories260K/stories260K.gguf"), dst, FLM_TYPE_Q8_0, FLM_OUT_REPLACE, NULL, NULL, &ci, &err))
        fail_msg("convert: %s", err.msg);
    assert_true(ci.file_bytes > 0);
    assert_true(ci.n_layers > 0);
    flm_verify_info vi;
    assert_int_equal(flm_verify(dst, NULL, NULL, &vi, &err), FLM_OK);
    assert_int_equal(vi.file_bytes, ci.file_bytes);
    assert_int_equal(vi.n_regions, 2 + ci.n_layers); /* resident + one per layer + record sums, no predictors yet */
    char *text = NULL;
    bool runnable = false;
    assert_int_equal(flm_inspect(dst, NULL, &text, &runnable, &err), FLM_OK);
    assert_true(runnable);
    assert_non_null(text);
    assert_non_null(strstr(text, "not calibrated"));
    assert_non_null(strstr(text, "d_model"));
    free(text);
    flm_calib_report rep;
    assert_int_equal(flm_calib_read(dst, &rep, &err), FLM_ERR_ARG); /* not calibrated */
    assert_non_null(strstr(err.msg, "not calibrated"));
    flm_calib_report_free(&rep);
    assert_int_equal(flm_inspect("/nonexistent/model.gguf", NULL, &text, &runnable, &err), FLM_ERR_IO);
    assert_null(text);
    unlink(dst);
}

static void test_small_calls(void **state) {
    (void)state;
    assert_true(flm_synth_type_ok(FLM_TYPE_F16));
    assert_true(flm_synth_type_ok(FLM_TYPE_Q8_0));
    assert_false(flm_synth_type_ok(FLM_TYPE_Q8_K)); /* activations only */
    assert_false(flm_synth_type_ok(1000));
    flm_synth_params sp;
    flm_synth_params_default(&sp);
    flm_error err;
    assert_int_equal(flm_synth_check(&sp, &err), FLM_OK);
    assert_true(flm_synth_tensor_bytes(&sp) > ((uint64_t)3 << 30) / 2);
    sp.d_model = 2050;
    assert_int_equal(flm_synth_check(&sp, &err), FLM_ERR_ARG);
    flm_probe_opts po;
    flm_probe_opts_default(&po);
    assert_true(po.seconds > 0);
    flm_calib_opts co;
    flm_calib_opts_default(&co);
    assert_true(co.max_tokens > 0);
    flm_curve_opts cu;
    flm_curve_opts_default(&cu);
    assert_true(cu.chunk > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convert_verify_inspect),
        cmocka_unit_test(test_small_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
