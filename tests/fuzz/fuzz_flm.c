/* fuzz_flm.c — the .flm reader (src/format/flm.c: header, region table, resident region) on arbitrary bytes, then
 * what reads an opened file: verify, the model loader (flm_model_from_flm), the predictor region
 * (flm_predictor_region_deserialize), and, when the input asks for it, a context opened in ram, naive, hybrid or
 * sparse mode that evaluates two tokens (the budget plan, the FFN sources, the reader on a file that refuses O_DIRECT).
 *
 * Input: byte 0 is a control byte, the rest is the file.
 *   bit 0     recompute the header's and every region's xxh64 checksum (and the stored file size) before opening,
 *             so mutations get past the checksums to the checks behind them
 *   bits 1-3  0: no context; 1 ram, 2 naive, 3 hybrid, 4 sparse, 5 auto; 6-7: none
 *   bit 4     the context does not try O_DIRECT (flm_params.no_direct): both read paths on every kernel (a memfd
 *             refuses O_DIRECT before Linux 6.6 or so and takes it after, so without this bit the path would depend
 *             on the machine)
 * Seeds: tests/fuzz/make_seeds.sh (small converted and calibrated models). */
#include "fuzz_common.h"

#include <xxhash.h>

#include "core/util.h"
#include "flashlm.h"
#include "format/flm.h"
#include "model/model.h"
#include "sparsity/sparsity.h"

static void fix_checksums(uint8_t *p, size_t n) {
    if (n < FLM_HEADER_FIXED || memcmp(p, FLM_FILE_MAGIC, 8) != 0) return;
    flm_put_u64(p + 16, n);
    uint32_t n_regions = flm_get_u32(p + 12), hb = flm_get_u32(p + 32);
    if (hb < FLM_HEADER_FIXED || hb > n) return;
    for (uint32_t i = 0; i < n_regions; i++) {
        size_t e = FLM_HEADER_FIXED + (size_t)i * FLM_REGION_ENTRY_BYTES;
        if (e + FLM_REGION_ENTRY_BYTES > hb) break;
        uint64_t off = flm_get_u64(p + e + 8), sz = flm_get_u64(p + e + 16);
        if (off <= n && sz <= n - off) flm_put_u64(p + e + 24, XXH64(p + off, (size_t)sz, 0));
    }
    flm_put_u64(p + 24, XXH64(p + 32, hb - 32, 0));
}

static void run_context(const char *path, flm_mode mode, bool no_direct) {
    flm_params prm;
    flm_params_default(&prm);
    prm.n_threads = 1;
    prm.n_ctx = 4;
    prm.mode = mode;
    prm.io = FLM_IO_KIND_THREADS;
    prm.io_threads = 1;
    prm.no_direct = no_direct;
    flm_ctx *ctx = NULL;
    flm_error err;
    if (flm_open(path, &prm, &ctx, &err) != FLM_OK) {
        fz_check(err.msg[0] != 0, "an error without a message");
        return;
    }
    flm_model_info info;
    flm_get_info(ctx, &info);
    const float *logits = NULL;
    for (int32_t pos = 0; pos < 2; pos++) {
        int32_t tok = info.bos >= 0 ? info.bos : 0;
        if (flm_eval(ctx, tok, pos, &logits, &err) != FLM_OK) {
            fz_check(err.msg[0] != 0, "an eval error without a message");
            break;
        }
        fz_check(logits != NULL, "no logits");
    }
    flm_close(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unsigned ctl = data[0];
    size_t n = size - 1;
    uint8_t *file = malloc(n ? n : 1);
    if (!file) return 0;
    memcpy(file, data + 1, n);
    if (ctl & 1) fix_checksums(file, n);
    const char *path = fz_file(file, n);
    free(file);

    flm_file *f = NULL;
    flm_error err;
    if (flm_file_open(path, &f, &err) != FLM_OK) {
        fz_check(err.msg[0] != 0, "an error without a message");
        return 0;
    }
    fz_check(f->resident && f->meta, "opened without a resident region");
    for (uint32_t l = 0; l < f->n_layers; l++) fz_check(f->ffn[l] && f->ffn[l]->layer == l, "FFN table");
    (void)flm_file_verify(f, NULL, NULL, &err);
    flm_model *m = NULL;
    if (flm_model_from_flm(f, &m, &err) == FLM_OK) flm_model_free(m);
    if (f->predictor) {
        void *buf = NULL;
        if (flm_file_read_region(f, f->predictor, &buf, &err) == FLM_OK) {
            flm_predictor_region s;
            if (flm_predictor_region_deserialize(buf, (size_t)f->predictor->size, path, &s, &err) == FLM_OK)
                flm_predictor_region_free(&s);
            free(buf);
        }
    }
    flm_file_close(f);
    unsigned mode = ctl >> 1 & 7;
    static const flm_mode modes[] = {0, FLM_MODE_RAM, FLM_MODE_NAIVE, FLM_MODE_HYBRID, FLM_MODE_SPARSE, FLM_MODE_AUTO};
    if (mode >= 1 && mode <= 5) run_context(path, modes[mode], ctl >> 4 & 1);
    return 0;
}
