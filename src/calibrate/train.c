/* train.c — the predictors' training (calibrate/train.h): f32 prediction, evaluation, threshold calibration,
 * truncated-SVD and bias initialisation, mini-batch Adam on a balanced BCE. Moved out of src/sparsity/predictor.c so
 * the runtime library needs no BLAS/LAPACK. Shapes (row-major): X n x N, Y n x M (bytes), A r x N, B M x r, c M, with
 * N = d_model, M = d_ffn, r = rank. */
#include "calibrate/train.h"

#include <cblas.h>
#include <limits.h>
#include <lapacke.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/util.h"
#include "compute/kernels.h"

#define LOGIT_STD_INIT 4.0f /* initial logits are rescaled to this (pooled within-neuron) standard deviation */
#define BIAS_MARGIN 1.0f    /* logit margin for neurons that never / always fire in the training split */
#define EVAL_BLOCK 256      /* samples per forward block in eval / calibrate */

/* ---------------------------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------------------------- */
static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-53; } /* [0, 1) */

static float rng_normal(uint64_t *s) { /* Box-Muller; one of the pair is discarded (init only, not hot) */
    double u1 = rng_uniform(s), u2 = rng_uniform(s);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static size_t rng_below(uint64_t *s, size_t n) { return (size_t)(rng_next(s) % (uint64_t)n); }

static void *xmalloc_floats(size_t count) { return malloc((count ? count : 1) * sizeof(float)); }

/* log(1 + e^z), stable for all z. */
static inline double softplus(double z) { return (z > 0 ? z : 0) + log1p(exp(-fabs(z))); }

static inline float sigmoidf(float z) { return 1.0f / (1.0f + expf(-z)); }

/* The k-th smallest (0-based) of a[0..n), n > k; reorders a so that a[0..k) <= result <= a[k+1..n). Three-way
 * partition with random pivots: linear on average, also with many equal values; a NaN compares "equal". */
static float select_kth(float *a, size_t n, size_t k) {
    uint64_t rs = 0x243f6a8885a308d3ull ^ n;
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        float pivot = a[lo + rng_below(&rs, hi - lo)];
        size_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            float v = a[i];
            if (v < pivot) {
                a[i++] = a[lt];
                a[lt++] = v;
            } else if (v > pivot) {
                a[i] = a[--gt];
                a[gt] = v;
            } else {
                i++;
            }
        }
        if (k < lt) hi = lt;
        else if (k >= gt) lo = gt;
        else return pivot;
    }
    return a[k];
}

static float max_of(const float *a, size_t n) {
    float m = -INFINITY;
    for (size_t i = 0; i < n; i++) m = a[i] > m ? a[i] : m;
    return m;
}

static float min_of(const float *a, size_t n) {
    float m = INFINITY;
    for (size_t i = 0; i < n; i++) m = a[i] < m ? a[i] : m;
    return m;
}

static bool all_finite(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return false;
    return true;
}

/* Row k of a data set viewed through an optional index list. */
static inline size_t row_of(const size_t *idx, size_t k) { return idx ? idx[k] : k; }

/* y[m] = W[m x k] v (W half precision, row-major) */
static void gemv_f16(const uint16_t *W, size_t m, size_t k, const float *v, float *y, bool accumulate) {
    for (size_t i = 0; i < m; i++) {
        const uint16_t *w = W + i * k;
        float s = 0.0f;
        for (size_t j = 0; j < k; j++) s += flm_f16_to_f32(w[j]) * v[j];
        y[i] = accumulate ? y[i] + s : s;
    }
}

size_t flm_predictor_predict(const flm_predictor *p, const float *x, uint32_t *ids, float *scratch) {
    const uint32_t N = p->d_model, M = p->d_ffn, r = p->rank;
    float *h = scratch, *z = scratch + r;
    memcpy(z, p->c, (size_t)M * sizeof(float));
    if (p->A) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)r, (int)N, 1.0f, p->A, (int)N, x, 1, 0.0f, h, 1);
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)M, (int)r, 1.0f, p->B, (int)r, h, 1, 1.0f, z, 1);
    } else {
        gemv_f16(p->A16, r, N, x, h, false);
        gemv_f16(p->B16, M, r, h, z, true);
    }
    const float t = p->threshold;
    size_t n = 0;
    for (uint32_t i = 0; i < M; i++) {
        ids[n] = i;
        n += z[i] > t; /* branch-free: the slot is overwritten when the neuron is not active */
    }
    return n;
}

void flm_predictor_round_f16(flm_predictor *p) {
    size_t na = (size_t)p->rank * p->d_model, nb = (size_t)p->d_ffn * p->rank;
    for (size_t i = 0; p->A && i < na; i++) p->A[i] = flm_f16_to_f32(flm_f32_to_f16(p->A[i]));
    for (size_t i = 0; p->B && i < nb; i++) p->B[i] = flm_f16_to_f32(flm_f32_to_f16(p->B[i]));
}

/* Logits of nb samples (rows row_of(idx, k0 + k) of X, k < nb) without the bias: Z (nb x M) = (Xrows A^T) B^T.
 * When idx is NULL the rows are contiguous and used in place, else they are gathered into xb (nb x N). H: nb x r. */
static void forward_block(const flm_predictor *p, const float *X, const size_t *idx, size_t k0, size_t nb, float *xb,
                          float *H, float *Z) {
    const size_t N = p->d_model, M = p->d_ffn, r = p->rank;
    const float *xs;
    if (idx) {
        for (size_t k = 0; k < nb; k++) memcpy(xb + k * N, X + idx[k0 + k] * N, N * sizeof(float));
        xs = xb;
    } else {
        xs = X + k0 * N;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)r, (int)N, 1.0f, xs, (int)N, p->A, (int)N, 0.0f,
                H, (int)r);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)M, (int)r, 1.0f, H, (int)r, p->B, (int)r, 0.0f,
                Z, (int)M);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Evaluation and calibration (on rows selected by idx, or all n rows when idx is NULL)
 * ------------------------------------------------------------------------------------------------------------- */
static flm_status eval_rows(const flm_predictor *p, const float *X, const uint8_t *Y, const size_t *idx, size_t n,
                            flm_predictor_metrics *m, flm_error *err) {
    memset(m, 0, sizeof *m);
    const size_t N = p->d_model, M = p->d_ffn, r = p->rank;
    m->n_holdout = n;
    m->recall = m->precision = 1.0;
    if (n == 0) return FLM_OK;
    /* class weight of the reported loss: positives count n_neg / n_pos of this data */
    uint64_t pos = 0;
    for (size_t k = 0; k < n; k++) {
        const uint8_t *y = Y + row_of(idx, k) * M;
        for (size_t i = 0; i < M; i++) pos += y[i] != 0;
    }
    const uint64_t total = (uint64_t)n * M, neg = total - pos;
    const double w = pos ? (double)neg / (double)pos : 1.0;
    size_t blk = n < EVAL_BLOCK ? n : EVAL_BLOCK;
    float *xb = idx ? xmalloc_floats(blk * N) : NULL, *H = xmalloc_floats(blk * r), *Z = xmalloc_floats(blk * M);
    if ((idx && !xb) || !H || !Z) {
        free(xb);
        free(H);
        free(Z);
        return flm_fail(err, FLM_ERR_NOMEM, "predictor eval: cannot allocate scratch for %zu samples", blk);
    }
    uint64_t tp = 0, fp = 0;
    double loss = 0;
    const float t = p->threshold;
    for (size_t k0 = 0; k0 < n; k0 += blk) {
        size_t nb = n - k0 < blk ? n - k0 : blk;
        forward_block(p, X, idx, k0, nb, xb, H, Z);
        for (size_t k = 0; k < nb; k++) {
            const uint8_t *y = Y + row_of(idx, k0 + k) * M;
            const float *z = Z + k * M;
            uint64_t tpk = 0, fpk = 0;
            double lk = 0;
            for (size_t i = 0; i < M; i++) {
                float zi = z[i] + p->c[i];
                bool act = zi > t, yi = y[i] != 0;
                tpk += act && yi;
                fpk += act && !yi;
                lk += yi ? w * softplus(-(double)zi) : softplus((double)zi);
            }
            tp += tpk;
            fp += fpk;
            loss += lk;
        }
    }
    free(xb);
    free(H);
    free(Z);
    m->recall = pos ? (double)tp / (double)pos : 1.0;
    m->precision = (tp + fp) ? (double)tp / (double)(tp + fp) : 1.0;
    m->active_frac_true = (double)pos / (double)total;
    m->active_frac_pred = (double)(tp + fp) / (double)total;
    m->loss = loss / (w * (double)pos + (double)neg);
    return FLM_OK;
}

flm_status flm_predictor_eval(const flm_predictor *p, const float *X, const uint8_t *Y, size_t n,
                              flm_predictor_metrics *m, flm_error *err) {
    if (!p || !p->A || !m || (n && (!X || !Y))) {
        if (m) memset(m, 0, sizeof *m);
        return flm_fail(err, FLM_ERR_ARG, "predictor eval: NULL or uninitialised argument");
    }
    return eval_rows(p, X, Y, NULL, n, m, err);
}

static flm_status calibrate_rows(flm_predictor *p, const float *X, const uint8_t *Y, const size_t *idx, size_t n,
                                 double target, flm_error *err) {
    const size_t N = p->d_model, M = p->d_ffn, r = p->rank;
    uint64_t pos = 0;
    for (size_t k = 0; k < n; k++) {
        const uint8_t *y = Y + row_of(idx, k) * M;
        for (size_t i = 0; i < M; i++) pos += y[i] != 0;
    }
    if (pos == 0) return FLM_OK;
    if (pos > SIZE_MAX / sizeof(float))
        return flm_fail(err, FLM_ERR_NOMEM, "predictor calibrate: %llu active pairs", (unsigned long long)pos);
    size_t blk = n < EVAL_BLOCK ? n : EVAL_BLOCK;
    float *zp = xmalloc_floats((size_t)pos), *xb = idx ? xmalloc_floats(blk * N) : NULL;
    float *H = xmalloc_floats(blk * r), *Z = xmalloc_floats(blk * M);
    if (!zp || (idx && !xb) || !H || !Z) {
        free(zp);
        free(xb);
        free(H);
        free(Z);
        return flm_fail(err, FLM_ERR_NOMEM, "predictor calibrate: cannot allocate %llu floats",
                        (unsigned long long)pos);
    }
    size_t np = 0;
    for (size_t k0 = 0; k0 < n; k0 += blk) {
        size_t nb = n - k0 < blk ? n - k0 : blk;
        forward_block(p, X, idx, k0, nb, xb, H, Z);
        for (size_t k = 0; k < nb; k++) {
            const uint8_t *y = Y + row_of(idx, k0 + k) * M;
            for (size_t i = 0; i < M; i++)
                if (y[i]) zp[np++] = Z[k * M + i] + p->c[i];
        }
    }
    /* Keep the top ceil(target * P) positive logits: at most kmiss = floor((1 - target) * P) may fall at or below
     * the threshold. The threshold goes midway between the kmiss-th smallest positive logit and the one below it
     * (when they differ), else just below it. */
    size_t kmiss = (size_t)floor((1.0 - target) * (double)np + 1e-9);
    if (kmiss >= np) kmiss = np - 1;
    float hi = select_kth(zp, np, kmiss);
    float t = nextafterf(hi, -INFINITY);
    if (kmiss > 0) {
        float lo = max_of(zp, kmiss);
        float mid = 0.5f * (lo + hi);
        if (mid < hi) t = mid;
    }
    p->threshold = isfinite(t) ? t : p->threshold;
    free(zp);
    free(xb);
    free(H);
    free(Z);
    return FLM_OK;
}

flm_status flm_predictor_calibrate(flm_predictor *p, const float *X, const uint8_t *Y, size_t n, double target_recall,
                                   flm_error *err) {
    if (!p || !p->A || (n && (!X || !Y)))
        return flm_fail(err, FLM_ERR_ARG, "predictor calibrate: NULL or uninitialised argument");
    if (!(target_recall > 0.0 && target_recall <= 1.0))
        return flm_fail(err, FLM_ERR_ARG, "predictor calibrate: target recall %g must be in (0, 1]", target_recall);
    return calibrate_rows(p, X, Y, NULL, n, target_recall, err);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Initialisation
 * ------------------------------------------------------------------------------------------------------------- */

/* Truncated SVD of W (M x N) through the eigendecomposition of its smaller Gram matrix (W^T W when N <= M, else
 * W W^T; ssyrk + ssyevr for the top r eigenpairs only): for the top r singular triplets (sigma_k, u_k, v_k),
 * A row k = sqrt(sigma_k) v_k^T and B column k = sqrt(sigma_k) u_k, so B A = U_r S_r V_r^T. The Gram matrix squares
 * the condition number, which only blurs singular values below ~1e-3 sigma_max: harmless for an initialisation.
 * Components with sigma_k <= 1e-6 sigma_max (a rank-deficient W) get small random vectors so training can use
 * them (zero A row and B column would receive zero gradients forever). Cost for M = 5632, N = 2048, r = 128:
 * ssyrk ~24 G multiply-adds, the tridiagonal reduction ~6 G flops. */
static flm_status svd_init(flm_predictor *p, const float *W, uint64_t *rng, flm_error *err) {
    const size_t N = p->d_model, M = p->d_ffn, r = p->rank;
    const bool gram_n = N <= M;        /* G = W^T W (N x N), eigenvectors v_k; else G = W W^T (M x M), u_k */
    const size_t s = gram_n ? N : M;   /* Gram size, >= r */
    float *G = xmalloc_floats(s * s), *ev = calloc(s, sizeof(float)), *Zv = xmalloc_floats(s * r);
    float *V = xmalloc_floats(s * r), *sig = calloc(r ? r : 1, sizeof(float));
    lapack_int *isuppz = malloc(2 * s * sizeof(lapack_int));
    flm_status st = FLM_OK;
    if (!G || !ev || !Zv || !V || !sig || !isuppz) {
        st = flm_fail(err, FLM_ERR_NOMEM, "predictor init: cannot allocate the %zu x %zu Gram matrix", s, s);
        goto done;
    }
    if (gram_n)
        cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)N, (int)M, 1.0f, W, (int)N, 0.0f, G, (int)N);
    else
        cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)M, (int)N, 1.0f, W, (int)N, 0.0f, G, (int)M);
    lapack_int found = 0;
    lapack_int info = LAPACKE_ssyevr(LAPACK_ROW_MAJOR, 'V', 'I', 'U', (lapack_int)s, G, (lapack_int)s, 0.0f, 0.0f,
                                     (lapack_int)(s - r + 1), (lapack_int)s, 0.0f, &found, ev, Zv, (lapack_int)r,
                                     isuppz);
    if (info != 0 || found != (lapack_int)r) {
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "predictor init: eigensolver (ssyevr) failed on init_W: info %d, %d of "
                      "%zu eigenpairs", (int)info, (int)found, r);
        goto done;
    }
    /* ssyevr returns ascending eigenvalues: reorder to descending, V (s x r) column k = k-th largest */
    for (size_t k = 0; k < r; k++) {
        double lam = ev[r - 1 - k];
        sig[k] = (float)sqrt(lam > 0 ? lam : 0);
        for (size_t j = 0; j < s; j++) V[j * r + k] = Zv[j * r + (r - 1 - k)];
    }
    const float smax = sig[0];
    const float floor_sig = smax > 0 ? smax * 1e-3f : 1.0f;
    if (gram_n) {
        /* A row k = sqrt(sig_k) v_k^T; B = W V diag(1 / sqrt(sig_k)) = U_r S^{1/2} */
        for (size_t k = 0; k < r; k++) {
            float sq = sqrtf(sig[k]);
            for (size_t j = 0; j < N; j++) p->A[k * N + j] = sq * V[j * r + k];
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)r, (int)N, 1.0f, W, (int)N, V, (int)r, 0.0f,
                    p->B, (int)r);
        for (size_t k = 0; k < r; k++) {
            float inv = sig[k] > smax * 1e-6f && sig[k] > 0 ? 1.0f / sqrtf(sig[k]) : 0.0f;
            for (size_t i = 0; i < M; i++) p->B[i * r + k] *= inv;
        }
    } else {
        /* B column k = sqrt(sig_k) u_k; A = diag(1 / sqrt(sig_k)) U^T W = S^{1/2} V_r^T */
        for (size_t i = 0; i < M; i++)
            for (size_t k = 0; k < r; k++) p->B[i * r + k] = sqrtf(sig[k]) * V[i * r + k];
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r, (int)N, (int)M, 1.0f, V, (int)r, W, (int)N, 0.0f,
                    p->A, (int)N);
        for (size_t k = 0; k < r; k++) {
            float inv = sig[k] > smax * 1e-6f && sig[k] > 0 ? 1.0f / sqrtf(sig[k]) : 0.0f;
            for (size_t j = 0; j < N; j++) p->A[k * N + j] *= inv;
        }
    }
    /* degenerate components: random unit directions scaled like a small singular value */
    for (size_t k = 0; k < r; k++) {
        if (sig[k] > smax * 1e-6f && sig[k] > 0) continue;
        float sq = sqrtf(floor_sig);
        for (size_t j = 0; j < N; j++) p->A[k * N + j] = sq * rng_normal(rng) / sqrtf((float)N);
        for (size_t i = 0; i < M; i++) p->B[i * r + k] = sq * rng_normal(rng) / sqrtf((float)M);
    }
    if (!all_finite(p->A, r * N) || !all_finite(p->B, M * r))
        st = flm_fail(err, FLM_ERR_UNSUPPORTED, "predictor init: the truncated SVD of init_W is not finite");
done:
    free(G);
    free(ev);
    free(Zv);
    free(V);
    free(sig);
    free(isuppz);
    return st;
}

static void random_init(flm_predictor *p, uint64_t *rng) {
    const size_t N = p->d_model, M = p->d_ffn, r = p->rank;
    const float sa = 1.0f / sqrtf((float)N), sb = 1.0f / sqrtf((float)r);
    for (size_t i = 0; i < r * N; i++) p->A[i] = sa * rng_normal(rng);
    for (size_t i = 0; i < M * r; i++) p->B[i] = sb * rng_normal(rng);
}

/* With A and B set: rescale both by sqrt(alpha) so the pooled within-neuron standard deviation of the logits over
 * the training rows is LOGIT_STD_INIT (when rescale), and set c_i so neuron i's predicted active fraction on the
 * training rows equals its true one (pos[i] of n): the threshold sits midway between the pos[i]-th and
 * (pos[i]+1)-th largest unbiased logit (per-neuron quantiles, found with a linear-time selection). Returns the
 * logit standard deviation after rescaling through *logit_std. H: n x r scratch for X A^T. */
static flm_status bias_init(flm_predictor *p, const float *X, const size_t *idx, size_t n, const uint64_t *pos,
                            bool rescale, int nt, float *logit_std, flm_error *err) {
    const size_t N = p->d_model, M = p->d_ffn, r = p->rank;
    size_t blk = (size_t)1 << 22; /* floats in one neuron-major block of logits (16 MiB) */
    size_t nb = blk / n;
    if (nb < 1) nb = 1;
    if (nb > M) nb = M;
    size_t xblk = n < EVAL_BLOCK ? n : EVAL_BLOCK;
    float *H = xmalloc_floats(n * r), *Zt = xmalloc_floats(nb * n), *xb = xmalloc_floats(xblk * N);
    float *thr = xmalloc_floats(M);
    double *var = malloc(M * sizeof(double));
    flm_status st = FLM_OK;
    if (!H || !Zt || !xb || !thr || !var) {
        st = flm_fail(err, FLM_ERR_NOMEM, "predictor init: cannot allocate the bias scratch (%zu samples)", n);
        goto done;
    }
    for (size_t k0 = 0; k0 < n; k0 += xblk) { /* H = X A^T */
        size_t b = n - k0 < xblk ? n - k0 : xblk;
        for (size_t k = 0; k < b; k++) memcpy(xb + k * N, X + row_of(idx, k0 + k) * N, N * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, (int)r, (int)N, 1.0f, xb, (int)N, p->A, (int)N,
                    0.0f, H + k0 * r, (int)r);
    }
    for (size_t i0 = 0; i0 < M; i0 += nb) {
        size_t b = M - i0 < nb ? M - i0 : nb;
        /* Zt (b x n) = B[i0 .. i0+b) H^T: neuron-major, so each neuron's n logits are contiguous */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, (int)n, (int)r, 1.0f, p->B + i0 * r, (int)r, H,
                    (int)r, 0.0f, Zt, (int)n);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 16)
        for (size_t q = 0; q < b; q++) {
            float *v = Zt + q * n;
            size_t i = i0 + q;
            double s1 = 0, s2 = 0;
            for (size_t k = 0; k < n; k++) {
                s1 += v[k];
                s2 += (double)v[k] * v[k];
            }
            double mean = s1 / (double)n, vv = s2 / (double)n - mean * mean;
            var[i] = vv > 0 ? vv : 0;
            size_t kp = (size_t)pos[i];
            if (kp == 0) {
                thr[i] = max_of(v, n); /* + margin below */
            } else if (kp >= n) {
                thr[i] = min_of(v, n);
            } else {
                size_t j = n - kp; /* ascending index of the smallest logit that must be above the threshold */
                float hi = select_kth(v, n, j), lo = max_of(v, j);
                thr[i] = 0.5f * (lo + hi);
            }
        }
    }
    double pooled = 0;
    for (size_t i = 0; i < M; i++) pooled += var[i];
    pooled = sqrt(pooled / (double)M);
    float alpha = 1.0f;
    if (rescale && pooled > 0 && isfinite(pooled)) {
        alpha = (float)(LOGIT_STD_INIT / pooled);
        float sq = sqrtf(alpha);
        for (size_t i = 0; i < r * N; i++) p->A[i] *= sq;
        for (size_t i = 0; i < M * r; i++) p->B[i] *= sq;
    }
    for (size_t i = 0; i < M; i++) {
        float t = alpha * thr[i];
        if (pos[i] == 0) t += BIAS_MARGIN;
        else if (pos[i] >= n) t -= BIAS_MARGIN;
        p->c[i] = -t;
    }
    *logit_std = (float)(alpha * pooled);
    if (!(*logit_std > 0) || !isfinite(*logit_std)) *logit_std = 1.0f;
done:
    free(H);
    free(Zt);
    free(xb);
    free(thr);
    free(var);
    return st;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Training
 * ------------------------------------------------------------------------------------------------------------- */
void flm_predictor_train_opts_default(flm_predictor_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->epochs = 6;
    o->lr = 0.02f;
    o->batch = 64;
    o->holdout = 0.2f;
    o->seed = 1;
    o->balance = FLM_PRED_BALANCE_LAYER;
    o->max_pos_weight = 100.0f;
    o->select_best = true;
}

static double rms_of(const float *a, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * a[i];
    return n ? sqrt(s / (double)n) : 0;
}

/* One Adam step on n parameters (bias-corrected step size lr_t). */
static void adam_step(float *w, const float *g, float *m1, float *m2, size_t n, float lr_t) {
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float a = m1[i] = b1 * m1[i] + (1.0f - b1) * gi;
        float v = m2[i] = b2 * m2[i] + (1.0f - b2) * gi * gi;
        w[i] -= lr_t * a / (sqrtf(v) + eps);
    }
}

/* Held-out loss of p; when it is below *best_loss, copy A | B | c into best and update *best_loss. */
static flm_status keep_if_better(const flm_predictor *p, const float *X, const uint8_t *Y, const size_t *hold,
                                 size_t n_hold, float *best, double *best_loss, flm_error *err) {
    flm_predictor_metrics hm;
    flm_status st = eval_rows(p, X, Y, hold, n_hold, &hm, err);
    if (st != FLM_OK) return st;
    if (hm.loss < *best_loss) {
        const size_t nA = (size_t)p->rank * p->d_model, nB = (size_t)p->d_ffn * p->rank;
        *best_loss = hm.loss;
        memcpy(best, p->A, nA * sizeof(float));
        memcpy(best + nA, p->B, nB * sizeof(float));
        memcpy(best + nA + nB, p->c, p->d_ffn * sizeof(float));
    }
    return FLM_OK;
}

static void report(const flm_predictor_train_opts *o, const char *what, uint64_t done, uint64_t total) {
    if (o->progress) o->progress(o->user, what, done, total);
}

flm_status flm_predictor_train(flm_predictor *p, const float *X, const uint8_t *Y, size_t n,
                               const flm_predictor_train_opts *opts, flm_predictor_metrics *m, flm_error *err) {
    flm_predictor_train_opts defo;
    if (!opts) {
        flm_predictor_train_opts_default(&defo);
        opts = &defo;
    }
    const flm_predictor_train_opts *o = opts;
    if (m) memset(m, 0, sizeof *m);
    if (!p || !p->A || !p->B || !p->c || p->rank == 0)
        return flm_fail(err, FLM_ERR_ARG, "predictor train: the predictor is not initialised (flm_predictor_init)");
    if (!X || !Y) return flm_fail(err, FLM_ERR_ARG, "predictor train: NULL X or Y");
    if (o->epochs < 0 || o->batch < 1 || !(o->holdout >= 0.0f && o->holdout < 1.0f) ||
        (o->epochs > 0 && !(o->lr > 0.0f && isfinite(o->lr))) || (unsigned)o->balance > FLM_PRED_BALANCE_NONE ||
        (o->balance == FLM_PRED_BALANCE_NEURON && !(o->max_pos_weight >= 1.0f)) ||
        !(o->target_recall >= 0.0f && o->target_recall <= 1.0f) || o->n_threads < 0)
        return flm_fail(err, FLM_ERR_ARG, "predictor train: bad options (epochs %d, batch %d, lr %g, holdout %g, "
                        "balance %d, max_pos_weight %g, target_recall %g, n_threads %d)", o->epochs, o->batch,
                        (double)o->lr, (double)o->holdout, (int)o->balance, (double)o->max_pos_weight,
                        (double)o->target_recall, o->n_threads);
    const size_t N = p->d_model, M = p->d_ffn, r = p->rank;
    const size_t n_hold = (size_t)floor((double)o->holdout * (double)n);
    const size_t n_tr = n - n_hold;
    if (n > (size_t)INT_MAX)
        return flm_fail(err, FLM_ERR_ARG, "predictor train: %zu samples, at most %d supported", n, INT_MAX);
    if (n < 2 || n_tr < 2)
        return flm_fail(err, FLM_ERR_ARG, "predictor train: %zu samples (%zu held out) leave fewer than 2 to train on",
                        n, n_hold);
    if (n > SIZE_MAX / (N > M ? N : M))
        return flm_fail(err, FLM_ERR_ARG, "predictor train: %zu samples overflow the data size", n);
    if (!all_finite(X, n * N)) return flm_fail(err, FLM_ERR_ARG, "predictor train: X holds a non-finite value");
    if (o->init_W && !o->warm_start && !all_finite(o->init_W, M * N))
        return flm_fail(err, FLM_ERR_ARG, "predictor train: init_W holds a non-finite value");

    const int nt = o->n_threads > 0 ? o->n_threads : omp_get_max_threads();
    const int blas_prev = openblas_get_num_threads();
    /* not under `ulimit -v`: an OpenBLAS worker that cannot map its buffer retries forever (issue 12) */
    const bool raise_blas = o->n_threads > 0 && !flm_address_space_limited();
    if (raise_blas) openblas_set_num_threads(o->n_threads);

    flm_status st = FLM_OK;
    uint64_t rng = o->seed ^ 0x5851f42d4c957f2dull;
    const size_t bmax = (size_t)o->batch < n_tr ? (size_t)o->batch : n_tr;
    size_t *perm = malloc(n * sizeof(size_t));
    uint64_t *pos = calloc(M, sizeof(uint64_t));
    float *wpos = xmalloc_floats(M);
    float *xb = xmalloc_floats(bmax * N), *H = xmalloc_floats(bmax * r), *Z = xmalloc_floats(bmax * M);
    float *GB = xmalloc_floats(bmax * r);
    const size_t nA = r * N, nB = M * r, nP = nA + nB + M;
    float *grad = xmalloc_floats(nP), *m1 = calloc(nP, sizeof(float)), *m2 = calloc(nP, sizeof(float));
    const bool select = o->select_best && n_hold > 0 && o->epochs > 0;
    float *best = select ? xmalloc_floats(nP) : NULL;
    if (!perm || !pos || !wpos || !xb || !H || !Z || !GB || !grad || !m1 || !m2 || (select && !best)) {
        st = flm_fail(err, FLM_ERR_NOMEM, "predictor train: cannot allocate training state (%zu parameters)", nP);
        goto done;
    }
    /* random split: perm[0 .. n_tr) trains, perm[n_tr .. n) is held out */
    for (size_t i = 0; i < n; i++) perm[i] = i;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = rng_below(&rng, i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    size_t *tr = perm, *hold = perm + n_tr;

    /* per-neuron positive counts on the training split, and the positive-class weights of the balanced loss */
    for (size_t k = 0; k < n_tr; k++) {
        const uint8_t *y = Y + tr[k] * M;
        for (size_t i = 0; i < M; i++) pos[i] += y[i] != 0;
    }
    uint64_t pos_all = 0;
    for (size_t i = 0; i < M; i++) pos_all += pos[i];
    const double neg_all = (double)n_tr * (double)M - (double)pos_all;
    for (size_t i = 0; i < M; i++) {
        double w = 1.0;
        if (o->balance == FLM_PRED_BALANCE_LAYER && pos_all) w = neg_all / (double)pos_all;
        if (o->balance == FLM_PRED_BALANCE_NEURON && pos[i]) {
            w = ((double)n_tr - (double)pos[i]) / (double)pos[i];
            if (w > o->max_pos_weight) w = o->max_pos_weight;
        }
        wpos[i] = (float)w;
    }

    report(o, "init", 0, 1);
    float logit_std = 1.0f;
    if (!o->warm_start) {
        if (o->init_W) {
            if ((st = svd_init(p, o->init_W, &rng, err)) != FLM_OK) goto done;
        } else {
            random_init(p, &rng);
        }
        if ((st = bias_init(p, X, tr, n_tr, pos, true, nt, &logit_std, err)) != FLM_OK) goto done;
    } else {
        /* measure the logit scale only (for c's step size): run the bias pass on copies, keep p unchanged */
        float *c_save = xmalloc_floats(M);
        if (!c_save) {
            st = flm_fail(err, FLM_ERR_NOMEM, "predictor train: cannot allocate %zu floats", (size_t)M);
            goto done;
        }
        memcpy(c_save, p->c, M * sizeof(float));
        st = bias_init(p, X, tr, n_tr, pos, false, nt, &logit_std, err);
        memcpy(p->c, c_save, M * sizeof(float));
        free(c_save);
        if (st != FLM_OK) goto done;
    }
    p->threshold = 0.0f;
    report(o, "init", 1, 1);

    /* Adam with per-tensor step sizes relative to the initial scale (see lr in predictor.h) */
    const float lrA = o->lr * (float)rms_of(p->A, nA), lrB = o->lr * (float)rms_of(p->B, nB);
    const float lrc = o->lr * logit_std;
    const size_t steps_per_epoch = (n_tr + bmax - 1) / bmax;
    const uint64_t total_steps = (uint64_t)o->epochs * steps_per_epoch;
    float *gA = grad, *gB = grad + nA, *gc = grad + nA + nB;
    uint64_t step = 0;
    /* best-epoch selection: the weights (initial ones included) with the lowest held-out loss */
    double best_loss = INFINITY;
    int best_ep = 0;
    if (select && (st = keep_if_better(p, X, Y, hold, n_hold, best, &best_loss, err)) != FLM_OK) goto done;
    for (int ep = 0; ep < o->epochs; ep++) {
        for (size_t i = n_tr - 1; i > 0; i--) { /* reshuffle the training rows each epoch */
            size_t j = rng_below(&rng, i + 1), t = tr[i];
            tr[i] = tr[j];
            tr[j] = t;
        }
        for (size_t k0 = 0; k0 < n_tr; k0 += bmax) {
            const size_t b = n_tr - k0 < bmax ? n_tr - k0 : bmax;
            forward_block(p, X, tr, k0, b, xb, H, Z); /* xb: the batch rows, H = Xb A^T, Z = H B^T */
            /* G = dL/dz, in place of Z, for the balanced BCE
             *   L = -(1/b) sum_{k,i} [w_i y log sigmoid(z) + (1 - y) log(1 - sigmoid(z))]:
             *   dL/dz = (w_i y (sigmoid(z) - 1) + (1 - y) sigmoid(z)) / b */
            const float inv_b = 1.0f / (float)b;
            for (size_t k = 0; k < b; k++) {
                const uint8_t *y = Y + tr[k0 + k] * M;
                float *g = Z + k * M;
                for (size_t i = 0; i < M; i++) {
                    float s = sigmoidf(g[i] + p->c[i]);
                    g[i] = (y[i] ? wpos[i] * (s - 1.0f) : s) * inv_b;
                }
            }
            /* dc = column sums of G; dB = G^T H (M x r); GB = G B (b x r); dA = GB^T Xb (r x N) */
            memset(gc, 0, M * sizeof(float));
            for (size_t k = 0; k < b; k++)
                for (size_t i = 0; i < M; i++) gc[i] += Z[k * M + i];
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)M, (int)r, (int)b, 1.0f, Z, (int)M, H, (int)r,
                        0.0f, gB, (int)r);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)b, (int)r, (int)M, 1.0f, Z, (int)M, p->B,
                        (int)r, 0.0f, GB, (int)r);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r, (int)N, (int)b, 1.0f, GB, (int)r, xb, (int)N,
                        0.0f, gA, (int)N);
            /* cosine decay of the step size to 10%, Adam bias correction folded into the step */
            step++;
            double frac = total_steps > 1 ? (double)(step - 1) / (double)(total_steps - 1) : 0.0;
            double decay = 0.1 + 0.45 * (1.0 + cos(M_PI * frac));
            double corr = sqrt(1.0 - pow(0.999, (double)step)) / (1.0 - pow(0.9, (double)step));
            adam_step(p->A, gA, m1, m2, nA, (float)(lrA * decay * corr));
            adam_step(p->B, gB, m1 + nA, m2 + nA, nB, (float)(lrB * decay * corr));
            adam_step(p->c, gc, m1 + nA + nB, m2 + nA + nB, M, (float)(lrc * decay * corr));
        }
        if (select) {
            double before = best_loss;
            if ((st = keep_if_better(p, X, Y, hold, n_hold, best, &best_loss, err)) != FLM_OK) goto done;
            if (best_loss < before) best_ep = ep + 1;
        }
        report(o, "epoch", (uint64_t)ep + 1, (uint64_t)o->epochs);
    }
    if (select && best_ep != o->epochs) { /* restore the best */
        memcpy(p->A, best, nA * sizeof(float));
        memcpy(p->B, best + nA, nB * sizeof(float));
        memcpy(p->c, best + nA + nB, M * sizeof(float));
    }
    if (!all_finite(p->A, nA) || !all_finite(p->B, nB) || !all_finite(p->c, M)) {
        st = flm_fail(err, FLM_ERR_ARG, "predictor train: training diverged (non-finite weights); lower lr (%g)",
                      (double)o->lr);
        goto done;
    }
    const size_t *mrows = n_hold ? hold : tr;
    const size_t mn = n_hold ? n_hold : n_tr;
    if (o->target_recall > 0 && (st = calibrate_rows(p, X, Y, mrows, mn, o->target_recall, err)) != FLM_OK) goto done;
    if (m) {
        if ((st = eval_rows(p, X, Y, mrows, mn, m, err)) != FLM_OK) goto done;
        m->n_train = n_tr;
        m->n_holdout = n_hold;
    }
done:
    if (raise_blas) openblas_set_num_threads(blas_prev);
    free(perm);
    free(pos);
    free(wpos);
    free(xb);
    free(H);
    free(Z);
    free(GB);
    free(grad);
    free(m1);
    free(m2);
    free(best);
    return st;
}

