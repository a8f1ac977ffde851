/* test_scale_sparse.c — on the synthetic ReLU model (scale_common.h) the predictor learns the synthetic activations
 * (recall stated below), and the sparse mode reads far less than naive within its budget. */
#include "scale_common.h"
#include "calibrate/calibrate.h"
#include "sparsity/sparsity.h"

/* Bytes naive mode reads per token: every layer's FFN region, 4 KiB-aligned (test_flash checks the engine reads
 * exactly this; computing it here saves a run that reads 50 MB per token). */
static double naive_bytes_per_token(void) {
    flm_file *f = NULL;
    flm_error err;
    if (flm_file_open(flm, &f, &err)) fail_msg("open: %s", err.msg);
    double b = 0;
    for (uint32_t l = 0; l < f->n_layers; l++) b += (double)((f->ffn[l]->size + 4095) / 4096 * 4096);
    flm_file_close(f);
    return b;
}

static void test_relu_predictor_and_sparse(void **state) {
    (void)state;
    size_t len;
    char *text = (char *)tu_read_file(tu_data("text/sentences.txt"), &len);
    flm_calib_opts o;
    flm_calib_opts_default(&o);
    o.text = text;
    o.max_tokens = 512;
    o.chunk = 64;
    o.rank = 32;
    o.n_threads = 1; /* under parallel test load, OpenMP threads waiting on each other cost 10x (112 s vs 10 s) */
    flm_predictor_region rep;
    flm_error err;
    if (flm_calibrate(flm, &o, &rep, &err)) fail_msg("calibrate: %s", err.msg);
    double recall = 0, prec = 0, act = 0, pred = 0;
    for (uint32_t l = 0; l < rep.n_layers; l++) {
        recall += rep.layers[l].recall / rep.n_layers;
        prec += rep.layers[l].precision / rep.n_layers;
        act += rep.layers[l].active_frac / rep.n_layers;
        pred += rep.layers[l].pred_frac / rep.n_layers;
    }
    printf("ReLU synthetic: active %.3f, predicted %.3f, held-out recall %.3f, precision %.3f\n", act, pred, recall,
           prec);
    /* stated: the predictor (rank 32) reaches the 0.95 recall it is calibrated for on held-out tokens, reading at most
     * 4x the truly active neurons */
    assert_true(recall >= 0.93);
    assert_true(pred <= 4 * act);
    flm_predictor_region_free(&rep);
    free(text);
    double rss, budget, b_sparse, b_naive = naive_bytes_per_token();
    run_cli("--mode sparse --mem 50%", 8, &rss, &budget, &b_sparse);
    printf("bytes per token: naive %.0f, sparse %.0f; sparse peak RSS %.1f MiB of budget %.1f MiB\n", b_naive,
           b_sparse, rss / 1048576, budget / 1048576);
    /* measured: 4.1 MiB vs 48 MiB per token at this budget (the window holds 1-2 tokens: the resident attention
     * weights take a large share of 50% in this small model) */
    assert_true(b_sparse > 0);
    assert_true(b_sparse * 5 < b_naive);
    if (RSS_CHECKED) assert_true(rss <= budget + ALLOWANCE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_relu_predictor_and_sparse),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
