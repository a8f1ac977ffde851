/* predictor.c — the low-rank activation predictor (Knowl 2), the runtime's part: lifetime and serialization. See
 * predictor.h. Prediction in f32, training, evaluation and threshold calibration are the tools tier's
 * (src/calibrate/train.c: BLAS/LAPACK); the sparse mode predicts with the loaded f16 matrices (src/runtime/sparse.c).
 *
 * Shapes (row-major): A r x N, B M x r, c M, with N = d_model, M = d_ffn, r = rank. */
#include "sparsity/predictor.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/util.h"
#include "compute/kernels.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Lifetime
 * ------------------------------------------------------------------------------------------------------------- */
flm_status flm_predictor_init(flm_predictor *p, uint32_t d_model, uint32_t d_ffn, uint32_t rank, flm_error *err) {
    if (!p) return flm_fail(err, FLM_ERR_ARG, "predictor init: NULL predictor");
    memset(p, 0, sizeof *p);
    if (d_model == 0 || d_ffn == 0 || d_model > FLM_PREDICTOR_MAX_DIM || d_ffn > FLM_PREDICTOR_MAX_DIM)
        return flm_fail(err, FLM_ERR_ARG, "predictor init: d_model %u, d_ffn %u: each must be in 1..%u", d_model,
                        d_ffn, FLM_PREDICTOR_MAX_DIM);
    uint32_t mn = d_model < d_ffn ? d_model : d_ffn;
    if (rank == 0 || rank > mn)
        return flm_fail(err, FLM_ERR_ARG, "predictor init: rank %u must be in 1..min(d_model %u, d_ffn %u)", rank,
                        d_model, d_ffn);
    size_t na = (size_t)rank * d_model, nb = (size_t)d_ffn * rank;
    p->A = calloc(na, sizeof(float));
    p->B = calloc(nb, sizeof(float));
    p->c = calloc(d_ffn, sizeof(float));
    if (!p->A || !p->B || !p->c) {
        flm_predictor_free(p);
        return flm_fail(err, FLM_ERR_NOMEM, "predictor init: cannot allocate %zu bytes (d_model %u, d_ffn %u, rank %u)",
                        (na + nb + d_ffn) * sizeof(float), d_model, d_ffn, rank);
    }
    p->d_model = d_model;
    p->d_ffn = d_ffn;
    p->rank = rank;
    p->threshold = 0.0f;
    return FLM_OK;
}

void flm_predictor_free(flm_predictor *p) {
    if (!p) return;
    free(p->A);
    free(p->B);
    free(p->c);
    free(p->A16);
    free(p->B16);
    memset(p, 0, sizeof *p);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Serialization
 * ------------------------------------------------------------------------------------------------------------- */
static uint64_t record_bytes(uint64_t N, uint64_t M, uint64_t r, uint32_t version) { /* no overflow: dims <= 2^20 */
    if (version == 1) return FLM_PREDICTOR_HEADER_BYTES + 4 * (r * (N + M) + M);
    return FLM_PREDICTOR_HEADER_BYTES + ((2 * r * (N + M) + 3) & ~(uint64_t)3) + 4 * M;
}

size_t flm_predictor_serialized_bytes(const flm_predictor *p) {
    return (size_t)record_bytes(p->d_model, p->d_ffn, p->rank, FLM_PREDICTOR_VERSION);
}

void flm_predictor_serialize(const flm_predictor *p, uint8_t *dst) {
    memcpy(dst, FLM_PREDICTOR_MAGIC, 4);
    flm_put_u32(dst + 4, FLM_PREDICTOR_VERSION);
    flm_put_u32(dst + 8, p->d_model);
    flm_put_u32(dst + 12, p->d_ffn);
    flm_put_u32(dst + 16, p->rank);
    flm_put_f32(dst + 20, p->threshold);
    flm_put_u32(dst + 24, 0);
    flm_put_u32(dst + 28, 0);
    uint8_t *d = dst + FLM_PREDICTOR_HEADER_BYTES;
    const size_t na = (size_t)p->rank * p->d_model, nb = (size_t)p->d_ffn * p->rank;
    for (size_t i = 0; i < na; i++, d += 2) flm_put_u16(d, p->A ? flm_f32_to_f16(p->A[i]) : p->A16[i]);
    for (size_t i = 0; i < nb; i++, d += 2) flm_put_u16(d, p->B ? flm_f32_to_f16(p->B[i]) : p->B16[i]);
    if ((na + nb) & 1) { flm_put_u16(d, 0); d += 2; }
    for (size_t i = 0; i < p->d_ffn; i++, d += 4) flm_put_f32(d, p->c[i]);
}

/* Read count floats from s into dst; the index of the first non-finite one, or count when all are finite. */
static size_t read_floats(float *dst, const uint8_t *s, size_t count) {
    for (size_t i = 0; i < count; i++, s += 4) {
        dst[i] = flm_get_f32(s);
        if (!isfinite(dst[i])) return i;
    }
    return count;
}

/* Read count halves from s into dst; the index of the first infinite or NaN one (exponent all ones), or count. */
static size_t read_halves(uint16_t *dst, const uint8_t *s, size_t count) {
    for (size_t i = 0; i < count; i++, s += 2) {
        dst[i] = flm_get_u16(s);
        if ((dst[i] & 0x7c00u) == 0x7c00u) return i;
    }
    return count;
}

flm_status flm_predictor_deserialize(flm_predictor *p, const uint8_t *src, size_t len, size_t *consumed,
                                     const char *what, flm_error *err) {
    if (consumed) *consumed = 0;
    if (!what) what = "predictor";
    if (!p) return flm_fail(err, FLM_ERR_ARG, "%s: NULL predictor", what);
    memset(p, 0, sizeof *p);
    if (!src && len) return flm_fail(err, FLM_ERR_ARG, "%s: NULL buffer of %zu bytes", what, len);
    if (len < FLM_PREDICTOR_HEADER_BYTES)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor record truncated: %zu bytes, the header alone needs %u",
                        what, len, FLM_PREDICTOR_HEADER_BYTES);
    if (memcmp(src, FLM_PREDICTOR_MAGIC, 4) != 0)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: bad predictor magic %02x %02x %02x %02x (expected \"FPRD\")", what,
                        src[0], src[1], src[2], src[3]);
    uint32_t version = flm_get_u32(src + 4);
    if (version != 1 && version != 2)
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: predictor version %u (this build reads versions 1 and 2)", what,
                        version);
    uint32_t N = flm_get_u32(src + 8), M = flm_get_u32(src + 12), r = flm_get_u32(src + 16);
    float thr = flm_get_f32(src + 20);
    uint32_t res0 = flm_get_u32(src + 24), res1 = flm_get_u32(src + 28);
    if (res0 || res1)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor reserved fields are not zero (0x%08x 0x%08x)", what, res0,
                        res1);
    if (N == 0 || N > FLM_PREDICTOR_MAX_DIM)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor d_model %u out of range 1..%u", what, N,
                        FLM_PREDICTOR_MAX_DIM);
    if (M == 0 || M > FLM_PREDICTOR_MAX_DIM)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor d_ffn %u out of range 1..%u", what, M,
                        FLM_PREDICTOR_MAX_DIM);
    uint32_t mn = N < M ? N : M;
    if (r == 0 || r > mn)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor rank %u out of range 1..min(d_model %u, d_ffn %u)", what, r,
                        N, M);
    if (!isfinite(thr))
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor threshold is not finite", what);
    uint64_t need = record_bytes(N, M, r, version);
    if (need > (uint64_t)len)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor record truncated: d_model %u, d_ffn %u, rank %u need %llu "
                        "bytes, %zu available", what, N, M, r, (unsigned long long)need, len);
    flm_status st = flm_predictor_init(p, N, M, r, err);
    if (st != FLM_OK) {
        if (st == FLM_ERR_NOMEM) return st;
        return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor shape rejected", what); /* unreachable: checked above */
    }
    const uint8_t *s = src + FLM_PREDICTOR_HEADER_BYTES;
    const size_t na = (size_t)r * N, nb = (size_t)M * r;
    if (version == 2) { /* keep the halves as stored */
        free(p->A);
        free(p->B);
        p->A = p->B = NULL;
        p->A16 = malloc(na * 2);
        p->B16 = malloc(nb * 2);
        if (!p->A16 || !p->B16) {
            flm_predictor_free(p);
            return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory for the predictor", what);
        }
        size_t bad = read_halves(p->A16, s, na);
        const char *part = "A";
        if (bad == na) {
            bad = read_halves(p->B16, s + 2 * na, nb);
            part = "B";
        }
        if (bad != (part[0] == 'A' ? na : nb)) {
            flm_predictor_free(p);
            return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor %s[%zu] is not finite", what, part, bad);
        }
        s += (2 * (na + nb) + 3) & ~(size_t)3;
        if ((na + nb) & 1 && flm_get_u16(s - 2) != 0) {
            flm_predictor_free(p);
            return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor padding is not zero", what);
        }
        size_t badc = read_floats(p->c, s, M);
        if (badc != M) {
            flm_predictor_free(p);
            return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor c[%zu] is not finite", what, badc);
        }
    } else {
        struct {
            const char *name;
            float *dst;
            size_t count;
        } parts[3] = {{"A", p->A, na}, {"B", p->B, nb}, {"c", p->c, M}};
        for (int q = 0; q < 3; q++) {
            size_t bad = read_floats(parts[q].dst, s, parts[q].count);
            if (bad != parts[q].count) {
                flm_predictor_free(p);
                return flm_fail(err, FLM_ERR_FORMAT, "%s: predictor %s[%zu] is not finite", what, parts[q].name, bad);
            }
            s += parts[q].count * 4;
        }
    }
    p->threshold = thr;
    if (consumed) *consumed = (size_t)need;
    return FLM_OK;
}

uint32_t flm_predictor_predict_f16(const flm_kernels *k, const flm_predictor *p, const uint16_t *A16,
                                   const uint16_t *B16, float threshold, const float *x, float *scratch,
                                   uint32_t *ids, int n_threads) {
    float *h = scratch, *z = scratch + p->rank;
    flm_matvec(k, FLM_TYPE_F16, A16, p->rank, p->d_model, x, h, n_threads);
    flm_matvec(k, FLM_TYPE_F16, B16, p->d_ffn, p->rank, h, z, n_threads);
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->d_ffn; i++) {
        z[i] += p->c[i];
        if (z[i] > threshold) ids[n++] = i;
    }
    return n;
}
