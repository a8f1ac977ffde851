/* fuzz_sparsity.c — the predictor region deserializers (src/sparsity/sparsity.c flm_predictor_region_deserialize
 * and, per layer, src/sparsity/predictor.c flm_predictor_deserialize) on arbitrary bytes; a region that parses is then
 * used as the sparse mode uses it: each layer's predictor predicts once. Seeds: predictor regions cut from calibrated
 * models by tests/fuzz/make_seeds.sh. */
#include "fuzz_common.h"

#include "sparsity/sparsity.h"
#include "calibrate/train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    flm_predictor_region s;
    flm_error err;
    if (flm_predictor_region_deserialize(data, size, "fuzz", &s, &err) != FLM_OK) {
        fz_check(err.msg[0] != 0 && s.layers == NULL && s.n_layers == 0, "an error without a message or a reset");
        return 0;
    }
    for (uint32_t l = 0; l < s.n_layers; l++) {
        const flm_predictor *p = &s.layers[l].pred;
        fz_check(p->rank >= 1 && p->rank <= p->d_model && p->rank <= p->d_ffn, "layer %u rank %u", l, p->rank);
        float *x = malloc(p->d_model * sizeof *x), *scratch = malloc(flm_predictor_scratch_floats(p) * sizeof *x);
        uint32_t *ids = malloc(p->d_ffn * sizeof *ids);
        if (x && scratch && ids) {
            for (uint32_t i = 0; i < p->d_model; i++) x[i] = (float)((int)(i % 7) - 3) * 0.25f;
            size_t n = flm_predictor_predict(p, x, ids, scratch);
            fz_check(n <= p->d_ffn, "%zu predicted of %u", n, p->d_ffn);
            for (size_t i = 1; i < n; i++) fz_check(ids[i - 1] < ids[i] && ids[i] < p->d_ffn, "ids out of order");
        }
        free(x);
        free(scratch);
        free(ids);
    }
    flm_predictor_region_free(&s);
    return 0;
}
