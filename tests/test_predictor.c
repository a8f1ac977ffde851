/* test_predictor.c — the low-rank activation predictor (Knowl 2): training quality on a synthetic ReLU layer, the
 * balanced loss on rare activations, threshold calibration, predict against a naive computation, evaluation, and
 * the serialization (round trip, and refusal of every truncation and bad field without a crash). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sparsity/predictor.h"
#include "calibrate/train.h"
#include "compute/kernels.h"
#include "sparsity/sparsity.h"

/* ---------------------------------------------------------------------------------------------------------------
 * A synthetic ReLU FFN layer: W (M x N) = U diag(s) V^T (rank K, s_k = 4 / (1 + k)) + noise; per-neuron bias
 * b_i = -|W_i| * (lo + (hi - lo) u_i) so that each neuron fires with probability Phi(-(lo..hi)) for x ~ N(0, I);
 * Y = (W x + b > 0). The predictor sees x and W but not b.
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct layer {
    uint32_t N, M;
    size_t n;
    float *W, *b, *X;
    uint8_t *Y;
    double active;
} layer;

static float rand_normal(uint64_t *s) {
    double u1 = (tu_rand_u64(s) >> 11) * 0x1p-53, u2 = (tu_rand_u64(s) >> 11) * 0x1p-53;
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static void make_layer(layer *L, uint32_t N, uint32_t M, size_t n, uint32_t K, float noise, float lo, float hi,
                       float aniso, uint64_t seed) {
    uint64_t s = seed;
    L->N = N;
    L->M = M;
    L->n = n;
    L->W = malloc(sizeof(float) * M * N);
    L->b = malloc(sizeof(float) * M);
    L->X = malloc(sizeof(float) * n * N);
    L->Y = malloc(n * M);
    assert_true(L->W && L->b && L->X && L->Y);
    float *U = malloc(sizeof(float) * M * K), *V = malloc(sizeof(float) * N * K);
    assert_true(U && V);
    for (size_t i = 0; i < (size_t)M * K; i++) U[i] = rand_normal(&s) / sqrtf((float)K);
    for (size_t i = 0; i < (size_t)N * K; i++) V[i] = rand_normal(&s) / sqrtf((float)N);
    for (uint32_t i = 0; i < M; i++) {
        for (uint32_t j = 0; j < N; j++) {
            double acc = 0;
            for (uint32_t k = 0; k < K; k++) acc += U[i * K + k] * (4.0 / (1.0 + k)) * V[j * K + k];
            L->W[(size_t)i * N + j] = (float)acc + noise * rand_normal(&s) / sqrtf((float)N);
        }
    }
    for (size_t i = 0; i < n * N; i++) L->X[i] = rand_normal(&s) * (aniso > 0 ? aniso / (aniso + (float)(i % N)) : 1);
    /* pre-activations, then each neuron's bias from its empirical standard deviation */
    double *P = malloc(sizeof(double) * n * M);
    assert_non_null(P);
    for (size_t k = 0; k < n; k++)
        for (uint32_t i = 0; i < M; i++) {
            double z = 0;
            for (uint32_t j = 0; j < N; j++) z += (double)L->W[(size_t)i * N + j] * L->X[k * N + j];
            P[k * M + i] = z;
        }
    for (uint32_t i = 0; i < M; i++) {
        double nn = 0;
        for (size_t k = 0; k < n; k++) nn += P[k * M + i] * P[k * M + i];
        double u = (tu_rand_u64(&s) >> 11) * 0x1p-53;
        L->b[i] = (float)(-sqrt(nn / (double)n) * (lo + (hi - lo) * u));
    }
    size_t pos = 0;
    for (size_t k = 0; k < n; k++)
        for (uint32_t i = 0; i < M; i++) {
            L->Y[k * M + i] = P[k * M + i] + L->b[i] > 0;
            pos += L->Y[k * M + i];
        }
    free(P);
    L->active = (double)pos / ((double)n * M);
    free(U);
    free(V);
}

static void free_layer(layer *L) {
    free(L->W);
    free(L->b);
    free(L->X);
    free(L->Y);
}

static void print_metrics(const char *name, const flm_predictor_metrics *m) {
    print_message("    %-28s recall %.4f precision %.4f active true %.4f pred %.4f loss %.4f (train %llu, held out "
                  "%llu)\n", name, m->recall, m->precision, m->active_frac_true, m->active_frac_pred, m->loss,
                  (unsigned long long)m->n_train, (unsigned long long)m->n_holdout);
}

/* Train a rank-r predictor on the first n_fit samples of L (defaults but for the arguments; seed 7). */
static flm_predictor_metrics train_one(const layer *L, size_t n_fit, uint32_t rank, const float *init_W, int epochs,
                                       flm_predictor_balance bal, flm_predictor *out) {
    flm_predictor p;
    flm_error err;
    assert_int_equal(flm_predictor_init(&p, L->N, L->M, rank, &err), FLM_OK);
    flm_predictor_train_opts o;
    flm_predictor_train_opts_default(&o);
    o.init_W = init_W;
    o.epochs = epochs;
    o.balance = bal;
    o.seed = 7;
    flm_predictor_metrics m;
    flm_status st = flm_predictor_train(&p, L->X, L->Y, n_fit, &o, &m, &err);
    if (st != FLM_OK) fail_msg("train: %s", err.msg);
    assert_int_equal(m.n_train + m.n_holdout, n_fit);
    assert_int_equal(m.n_holdout, (uint64_t)(n_fit / 5));
    if (out) *out = p;
    else flm_predictor_free(&p);
    return m;
}

/* Four rank-r predictors of L trained on its first n_fit samples (80% train, 20% held out): random init and SVD
 * init, each without and with training (6 epochs, defaults). res[q]: held-out metrics at threshold 0; at95[q]: on
 * L's remaining samples (never seen), each with its threshold calibrated there to 95% recall, so the precision
 * compares the predictors at a common operating point. */
enum { RND, INI, TRN, SCR };
static void four_predictors(const layer *L, size_t n_fit, uint32_t rank, flm_predictor_metrics res[4],
                            flm_predictor_metrics at95[4]) {
    static const char *names[4] = {"random init", "SVD init", "SVD init + 6 epochs", "random init + 6 epochs"};
    const float *init[4] = {NULL, L->W, L->W, NULL};
    const int epochs[4] = {0, 0, 6, 6};
    const size_t n_new = L->n - n_fit;
    for (int q = 0; q < 4; q++) {
        flm_predictor p;
        flm_error err;
        res[q] = train_one(L, n_fit, rank, init[q], epochs[q], FLM_PRED_BALANCE_LAYER, &p);
        const float *Xn = L->X + n_fit * L->N;
        const uint8_t *Yn = L->Y + n_fit * L->M;
        assert_int_equal(flm_predictor_calibrate(&p, Xn, Yn, n_new, 0.95, &err), FLM_OK);
        assert_int_equal(flm_predictor_eval(&p, Xn, Yn, n_new, &at95[q], &err), FLM_OK);
        print_metrics(names[q], &res[q]);
        print_message("    %-28s precision %.4f at recall %.4f, threshold %.3f (unseen samples)\n", "",
                      at95[q].precision, at95[q].recall, (double)p.threshold);
        flm_predictor_free(&p);
    }
}

/* 1. A synthetic ReLU layer (d_model 128, d_ffn 512, rank-16 W + noise, ~6% active, x ~ N(0, I)), rank-32
 * predictors trained on 3000 samples; 1000 more samples, never seen, compare them at a common recall. */
static void test_train_relu_layer(void **state) {
    (void)state;
    layer L;
    const size_t n_fit = 3000;
    make_layer(&L, 128, 512, n_fit + 1000, 16, 0.3f, 1.3f, 1.9f, 0, 11);
    print_message("    active fraction %.4f\n", L.active);
    assert_true(L.active > 0.04 && L.active < 0.10);
    flm_predictor_metrics r[4], a[4];
    four_predictors(&L, n_fit, 32, r, a);
    /* Measured (seeds 11 / 7, 2 BLAS threads), held out at threshold 0: random init recall 0.069 precision 0.066;
     * SVD init 0.813 / 0.817 (loss 0.229); SVD + 6 epochs 0.975 / 0.489 (loss 0.124); random + 6 epochs 0.853 /
     * 0.237. Unseen samples, precision at recall 0.95: 0.058, 0.625, 0.580, 0.166. Asserts leave a margin. */
    assert_true(r[TRN].recall >= 0.93);
    assert_true(r[TRN].precision >= 0.40);
    assert_true(r[TRN].active_frac_pred < 3.0 * r[TRN].active_frac_true);
    /* training beats the initialisation alone on what it optimises (held-out balanced loss) and on recall */
    assert_true(r[TRN].loss < 0.8 * r[INI].loss);
    assert_true(r[TRN].recall > r[INI].recall + 0.05);
    /* the SVD initialisation alone already predicts well: W's rank is below the predictor's, and with x ~ N(0, I)
     * the truncated SVD is the best rank-32 linear map in the mean-square sense */
    assert_true(r[INI].recall > 0.70 && r[INI].precision > 0.70);
    /* both are far better than a random projection (chance precision is the active fraction) */
    assert_true(r[RND].precision < 2 * r[RND].active_frac_true);
    assert_true(a[RND].precision < 2 * a[RND].active_frac_true);
    assert_true(a[INI].precision > 5 * a[RND].precision && a[TRN].precision > 5 * a[RND].precision);
    assert_true(r[TRN].loss < 0.1 * r[RND].loss);
    /* training from random weights learns too, less well than from the SVD */
    assert_true(r[SCR].recall >= 0.75 && r[SCR].loss > r[TRN].loss && a[SCR].precision > 2 * a[RND].precision);
    /* at a common recall on unseen data, training keeps (does not much degrade) the SVD's precision here */
    assert_true(a[TRN].precision > 0.8 * a[INI].precision);
    free_layer(&L);
}

/* 1b. The same with anisotropic inputs (x_j ~ N(0, (8 / (8 + j))^2), like the uneven scales of real hidden states)
 * and a full-rank W with a decaying spectrum: the truncated SVD of W ignores how x is distributed, training does
 * not, so it beats the initialisation at a common recall on unseen data. */
static void test_train_anisotropic(void **state) {
    (void)state;
    layer L;
    const size_t n_fit = 3000;
    make_layer(&L, 128, 512, n_fit + 1000, 128, 0.3f, 1.3f, 1.9f, 8, 15);
    print_message("    active fraction %.4f\n", L.active);
    flm_predictor_metrics r[4], a[4];
    four_predictors(&L, n_fit, 16, r, a);
    /* Measured (seeds 15 / 7): held out, SVD init recall 0.518 precision 0.524 (loss 0.564), SVD + 6 epochs 0.918 /
     * 0.344 (loss 0.216); unseen, precision at recall 0.95: random 0.056, SVD 0.167, SVD + training 0.298. */
    assert_true(r[TRN].recall >= 0.85);
    assert_true(r[TRN].loss < 0.5 * r[INI].loss);
    assert_true(a[TRN].precision > 1.4 * a[INI].precision);
    assert_true(a[INI].precision > 2 * a[RND].precision);
    free_layer(&L);
}

/* 4. Rare activations (~2% of pairs): the balanced loss keeps recall high where plain BCE gives it up. */
static void test_balanced_loss(void **state) {
    (void)state;
    layer L;
    make_layer(&L, 128, 512, 3000, 16, 0.3f, 1.9f, 2.3f, 0, 12);
    print_message("    active fraction %.4f\n", L.active);
    assert_true(L.active > 0.01 && L.active < 0.03);
    flm_predictor_metrics bl = train_one(&L, L.n, 16, L.W, 6, FLM_PRED_BALANCE_LAYER, NULL);
    flm_predictor_metrics bn = train_one(&L, L.n, 16, L.W, 6, FLM_PRED_BALANCE_NEURON, NULL);
    flm_predictor_metrics pl = train_one(&L, L.n, 16, L.W, 6, FLM_PRED_BALANCE_NONE, NULL);
    flm_predictor_metrics rbl = train_one(&L, L.n, 16, NULL, 6, FLM_PRED_BALANCE_LAYER, NULL);
    flm_predictor_metrics rpl = train_one(&L, L.n, 16, NULL, 6, FLM_PRED_BALANCE_NONE, NULL);
    print_metrics("SVD init, balanced (layer)", &bl);
    print_metrics("SVD init, balanced (neuron)", &bn);
    print_metrics("SVD init, plain BCE", &pl);
    print_metrics("random init, balanced", &rbl);
    print_metrics("random init, plain BCE", &rpl);
    /* Measured (seeds 12 / 7), held out: balanced per layer recall 0.982 precision 0.263, per neuron 0.980 / 0.263,
     * plain BCE 0.708 / 0.726; from random weights: balanced 0.741 / 0.073, plain BCE 0.120 / 0.539. */
    assert_true(bl.recall >= 0.90);
    assert_true(bn.recall >= 0.90);
    assert_true(bl.recall > pl.recall + 0.10);
    assert_true(rbl.recall >= 0.60);
    assert_true(rbl.recall > rpl.recall + 0.30);
    free_layer(&L);
}

/* Threshold calibration: target_recall sets a threshold reaching it on the held-out split. Warm start, progress. */
static int n_epoch_calls, n_init_calls;
static void progress(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)user;
    if (strcmp(what, "epoch") == 0) {
        n_epoch_calls++;
        assert_int_equal(done, (uint64_t)n_epoch_calls);
        assert_int_equal(total, 3);
    } else {
        assert_string_equal(what, "init");
        n_init_calls++;
    }
}

static void test_calibrate_warm_start(void **state) {
    (void)state;
    layer L;
    make_layer(&L, 64, 256, 1500, 8, 0.5f, 1.3f, 1.9f, 0, 13);
    flm_predictor p;
    flm_error err;
    assert_int_equal(flm_predictor_init(&p, L.N, L.M, 8, &err), FLM_OK);
    flm_predictor_train_opts o;
    flm_predictor_train_opts_default(&o);
    o.init_W = L.W;
    o.epochs = 3;
    o.progress = progress;
    o.target_recall = 0.99f;
    o.n_threads = 1;
    flm_predictor_metrics m;
    assert_int_equal(flm_predictor_train(&p, L.X, L.Y, L.n, &o, &m, &err), FLM_OK);
    assert_int_equal(n_epoch_calls, 3);
    assert_int_equal(n_init_calls, 2);
    print_metrics("target recall 0.99", &m);
    assert_true(m.recall >= 0.99);
    float t99 = p.threshold;
    /* a lower target gives a higher threshold and fewer predicted neurons */
    flm_predictor_metrics m2;
    assert_int_equal(flm_predictor_calibrate(&p, L.X, L.Y, L.n, 0.8, &err), FLM_OK);
    assert_true(p.threshold > t99);
    assert_int_equal(flm_predictor_eval(&p, L.X, L.Y, L.n, &m2, &err), FLM_OK);
    print_metrics("calibrated 0.8 (all data)", &m2);
    assert_true(m2.recall >= 0.8 && m2.recall < 0.85);
    assert_true(m2.precision > m.precision);
    assert_int_equal(flm_predictor_calibrate(&p, L.X, L.Y, L.n, 1.0, &err), FLM_OK);
    assert_int_equal(flm_predictor_eval(&p, L.X, L.Y, L.n, &m2, &err), FLM_OK);
    assert_true(m2.recall == 1.0);
    assert_int_equal(flm_predictor_calibrate(&p, L.X, L.Y, L.n, 0.0, &err), FLM_ERR_ARG);
    /* warm start: continue from the current weights; threshold goes back to 0 without a target */
    o.warm_start = true;
    o.target_recall = 0;
    o.progress = NULL;
    o.epochs = 1;
    assert_int_equal(flm_predictor_train(&p, L.X, L.Y, L.n, &o, &m2, &err), FLM_OK);
    assert_true(p.threshold == 0.0f);
    assert_true(m2.recall > 0.9);
    flm_predictor_free(&p);
    free_layer(&L);
}

/* Bad arguments are refused with FLM_ERR_ARG. */
static void test_bad_args(void **state) {
    (void)state;
    flm_predictor p;
    flm_error err;
    assert_int_equal(flm_predictor_init(&p, 0, 8, 1, &err), FLM_ERR_ARG);
    assert_int_equal(flm_predictor_init(&p, 8, 0, 1, &err), FLM_ERR_ARG);
    assert_int_equal(flm_predictor_init(&p, 8, 16, 0, &err), FLM_ERR_ARG);
    assert_int_equal(flm_predictor_init(&p, 8, 16, 9, &err), FLM_ERR_ARG);
    assert_int_equal(flm_predictor_init(&p, FLM_PREDICTOR_MAX_DIM + 1, 16, 1, &err), FLM_ERR_ARG);
    assert_null(p.A);
    flm_predictor_free(&p);
    flm_predictor_free(NULL);
    float X[4 * 8] = {0};
    uint8_t Y[4 * 16] = {0};
    assert_int_equal(flm_predictor_train(&p, X, Y, 4, NULL, NULL, &err), FLM_ERR_ARG); /* not initialised */
    assert_int_equal(flm_predictor_init(&p, 8, 16, 8, &err), FLM_OK);
    assert_int_equal(flm_predictor_train(&p, X, Y, 1, NULL, NULL, &err), FLM_ERR_ARG); /* too few samples */
    assert_int_equal(flm_predictor_train(&p, NULL, Y, 4, NULL, NULL, &err), FLM_ERR_ARG);
    flm_predictor_train_opts o;
    flm_predictor_train_opts_default(&o);
    o.holdout = 1.0f;
    assert_int_equal(flm_predictor_train(&p, X, Y, 4, &o, NULL, &err), FLM_ERR_ARG);
    flm_predictor_train_opts_default(&o);
    o.lr = NAN;
    assert_int_equal(flm_predictor_train(&p, X, Y, 4, &o, NULL, &err), FLM_ERR_ARG);
    flm_predictor_train_opts_default(&o);
    o.batch = 0;
    assert_int_equal(flm_predictor_train(&p, X, Y, 4, &o, NULL, &err), FLM_ERR_ARG);
    X[3] = INFINITY;
    assert_int_equal(flm_predictor_train(&p, X, Y, 4, NULL, NULL, &err), FLM_ERR_ARG);
    print_message("    %s\n", err.msg);
    X[3] = 0;
    /* degenerate but valid: all-zero data, no actives, zero init_W: trains without NaN, predicts nothing */
    float W[16 * 8] = {0};
    flm_predictor_train_opts_default(&o);
    o.init_W = W;
    o.holdout = 0.5f;
    flm_predictor_metrics m;
    assert_int_equal(flm_predictor_train(&p, X, Y, 4, &o, &m, &err), FLM_OK);
    assert_true(m.recall == 1.0 && m.active_frac_pred == 0.0);
    flm_predictor_free(&p);
}

/* 3. predict: ids in increasing order, equal to {i : z_i > threshold}; z against a naive double computation. */
static void test_predict_naive(void **state) {
    (void)state;
    uint64_t s = 99;
    const uint32_t shapes[][3] = {{1, 1, 1}, {7, 13, 3}, {64, 200, 16}, {130, 37, 37}, {96, 700, 48}};
    for (size_t q = 0; q < sizeof shapes / sizeof shapes[0]; q++) {
        flm_predictor p;
        flm_error err;
        uint32_t N = shapes[q][0], M = shapes[q][1], r = shapes[q][2];
        assert_int_equal(flm_predictor_init(&p, N, M, r, &err), FLM_OK);
        for (size_t i = 0; i < (size_t)r * N; i++) p.A[i] = tu_rand_f32(&s);
        for (size_t i = 0; i < (size_t)M * r; i++) p.B[i] = tu_rand_f32(&s);
        for (size_t i = 0; i < M; i++) p.c[i] = tu_rand_f32(&s);
        float *x = malloc(sizeof(float) * N), *scratch = malloc(sizeof(float) * flm_predictor_scratch_floats(&p));
        uint32_t *ids = malloc(sizeof(uint32_t) * M);
        double *z = malloc(sizeof(double) * M);
        for (int rep = 0; rep < 4; rep++) {
            for (size_t j = 0; j < N; j++) x[j] = tu_rand_f32(&s);
            p.threshold = rep == 0 ? 0.0f : tu_rand_f32(&s) * 2.0f;
            double zmax = 0;
            for (size_t i = 0; i < M; i++) {
                double acc = p.c[i];
                for (size_t k = 0; k < r; k++) {
                    double h = 0;
                    for (size_t j = 0; j < N; j++) h += (double)p.A[k * N + j] * x[j];
                    acc += (double)p.B[i * r + k] * h;
                }
                z[i] = acc;
                zmax = fmax(zmax, fabs(acc));
            }
            size_t cnt = flm_predictor_predict(&p, x, ids, scratch);
            const float *zs = scratch + r;
            size_t want = 0, ambiguous = 0;
            for (size_t i = 0; i < M; i++) {
                assert_true(fabs(zs[i] - z[i]) <= 1e-5 * (zmax + 1) * sqrt((double)N * r));
                bool act = zs[i] > p.threshold;
                if (act) {
                    assert_true(want < cnt);
                    assert_int_equal(ids[want], i);
                    want++;
                }
                if ((z[i] > p.threshold) != act) ambiguous++;
            }
            assert_int_equal(cnt, want);
            for (size_t k = 1; k < cnt; k++) assert_true(ids[k - 1] < ids[k]);
            assert_true(ambiguous <= 1);
        }
        free(x);
        free(scratch);
        free(ids);
        free(z);
        flm_predictor_free(&p);
    }
}

/* eval agrees with counting predict's answers one sample at a time. */
static void test_eval_matches_predict(void **state) {
    (void)state;
    layer L;
    make_layer(&L, 32, 96, 300, 4, 0.3f, 1.0f, 1.5f, 0, 14);
    flm_predictor p;
    flm_error err;
    assert_int_equal(flm_predictor_init(&p, L.N, L.M, 4, &err), FLM_OK);
    flm_predictor_train_opts o;
    flm_predictor_train_opts_default(&o);
    o.init_W = L.W;
    o.epochs = 2;
    assert_int_equal(flm_predictor_train(&p, L.X, L.Y, L.n, &o, NULL, &err), FLM_OK);
    p.threshold = -0.5f;
    flm_predictor_metrics m;
    assert_int_equal(flm_predictor_eval(&p, L.X, L.Y, L.n, &m, &err), FLM_OK);
    float *scratch = malloc(sizeof(float) * flm_predictor_scratch_floats(&p));
    uint32_t *ids = malloc(sizeof(uint32_t) * L.M);
    uint64_t tp = 0, fp = 0, pos = 0;
    for (size_t k = 0; k < L.n; k++) {
        size_t cnt = flm_predictor_predict(&p, L.X + k * L.N, ids, scratch);
        for (size_t q = 0; q < cnt; q++) {
            tp += L.Y[k * L.M + ids[q]] != 0;
            fp += L.Y[k * L.M + ids[q]] == 0;
        }
        for (size_t i = 0; i < L.M; i++) pos += L.Y[k * L.M + i] != 0;
    }
    double total = (double)L.n * L.M;
    assert_true(fabs(m.recall - (double)tp / pos) < 2e-3); /* sgemv vs sgemm rounding may flip a borderline pair */
    assert_true(fabs(m.precision - (double)tp / (tp + fp)) < 2e-3);
    assert_true(fabs(m.active_frac_true - pos / total) < 1e-12);
    assert_true(fabs(m.active_frac_pred - (tp + fp) / total) < 1e-3);
    assert_int_equal(m.n_holdout, L.n);
    assert_int_equal(m.n_train, 0);
    assert_true(m.loss > 0 && m.loss < 0.693);
    free(scratch);
    free(ids);
    flm_predictor_free(&p);
    free_layer(&L);
}

/* ---------------------------------------------------------------------------------------------------------------
 * 2. Serialization
 * ------------------------------------------------------------------------------------------------------------- */
static void fill_random(flm_predictor *p, uint64_t *s) {
    for (size_t i = 0; i < (size_t)p->rank * p->d_model; i++) p->A[i] = tu_rand_f32(s);
    for (size_t i = 0; i < (size_t)p->d_ffn * p->rank; i++) p->B[i] = tu_rand_f32(s) * 1e-6f; /* f16 subnormals too */
    for (size_t i = 0; i < p->d_ffn; i++) p->c[i] = tu_rand_f32(s) * 1e30f;
    p->threshold = -1.25f;
}

static void expect_same(const flm_predictor *a, const flm_predictor *b) {
    assert_int_equal(a->d_model, b->d_model);
    assert_int_equal(a->d_ffn, b->d_ffn);
    assert_int_equal(a->rank, b->rank);
    assert_memory_equal(&a->threshold, &b->threshold, sizeof(float));
    /* version-2 records hold A and B at half precision: b (read back) has them as A16, B16 */
    assert_null(b->A);
    assert_null(b->B);
    for (size_t i = 0; i < (size_t)a->rank * a->d_model; i++) assert_int_equal(b->A16[i], flm_f32_to_f16(a->A[i]));
    for (size_t i = 0; i < (size_t)a->d_ffn * a->rank; i++) assert_int_equal(b->B16[i], flm_f32_to_f16(a->B[i]));
    assert_memory_equal(a->c, b->c, sizeof(float) * a->d_ffn);
}

static void put32(uint8_t *d, uint32_t v) {
    for (int i = 0; i < 4; i++) d[i] = (uint8_t)(v >> (8 * i));
}

/* Deserialize buf and expect code; the predictor must come back zeroed on error. */
static void expect_code(const uint8_t *buf, size_t len, flm_status code, const char *label) {
    flm_predictor q;
    flm_error err = {0};
    size_t used = 12345;
    flm_status st = flm_predictor_deserialize(&q, buf, len, &used, "test.flm", &err);
    if (st != code) fail_msg("%s: got %d (%s), want %d", label, st, err.msg, code);
    if (st != FLM_OK) {
        assert_null(q.A);
        assert_int_equal(used, 0);
        assert_non_null(strstr(err.msg, "test.flm"));
    } else {
        flm_predictor_free(&q);
    }
}

static void test_serialize(void **state) {
    (void)state;
    uint64_t s = 5;
    flm_predictor a, b, c;
    flm_error err;
    assert_int_equal(flm_predictor_init(&a, 8, 12, 3, &err), FLM_OK);
    assert_int_equal(flm_predictor_init(&b, 5, 3, 3, &err), FLM_OK);
    fill_random(&a, &s);
    fill_random(&b, &s);
    b.threshold = 0.5f;
    size_t na = flm_predictor_serialized_bytes(&a), nb = flm_predictor_serialized_bytes(&b);
    assert_int_equal(na, 32 + 2 * (3 * (8 + 12)) + 4 * 12);
    assert_int_equal(nb, 32 + 2 * (3 * (5 + 3)) + 4 * 3);
    uint8_t *buf = malloc(na + nb);
    flm_predictor_serialize(&a, buf);
    flm_predictor_serialize(&b, buf + na);
    assert_memory_equal(buf, "FPRD\2\0\0\0\x08\0\0\0\x0c\0\0\0\x03\0\0\0", 20);
    /* two records back to back: walk them with consumed */
    size_t used = 0;
    assert_int_equal(flm_predictor_deserialize(&c, buf, na + nb, &used, "region", &err), FLM_OK);
    assert_int_equal(used, na);
    expect_same(&a, &c);
    flm_predictor_free(&c);
    assert_int_equal(flm_predictor_deserialize(&c, buf + na, nb, &used, "region", &err), FLM_OK);
    assert_int_equal(used, nb);
    expect_same(&b, &c);
    /* a predictor read back (f16) predicts the same ids as the original rounded to f16 */
    flm_predictor_round_f16(&b);
    float x[5] = {0.5f, -1, 2, 0.25f, -0.75f}, s1[8], s2[8];
    uint32_t i1[3], i2[3];
    size_t k1 = flm_predictor_predict(&b, x, i1, s1), k2 = flm_predictor_predict(&c, x, i2, s2);
    assert_int_equal(k1, k2);
    assert_memory_equal(i1, i2, k1 * sizeof(uint32_t));
    flm_predictor_free(&c);

    /* every truncation of the first record */
    for (size_t len = 0; len < na; len++) expect_code(buf, len, FLM_ERR_FORMAT, "truncated");
    expect_code(NULL, 0, FLM_ERR_FORMAT, "empty");
    expect_code(NULL, 10, FLM_ERR_ARG, "NULL buffer");

    uint8_t *t = malloc(na);
#define MUTATE(off, v, code, label)                                                                                   \
    do {                                                                                                              \
        memcpy(t, buf, na);                                                                                           \
        put32(t + (off), (v));                                                                                        \
        expect_code(t, na, code, label);                                                                              \
    } while (0)
    MUTATE(0, 0x44525046u ^ 1u, FLM_ERR_FORMAT, "magic");
    MUTATE(4, 3, FLM_ERR_UNSUPPORTED, "version 3");
    MUTATE(4, 1, FLM_ERR_FORMAT, "version 1: its f32 record is longer than the buffer");
    MUTATE(4, 0, FLM_ERR_UNSUPPORTED, "version 0");
    MUTATE(8, 0, FLM_ERR_FORMAT, "d_model 0");
    MUTATE(12, 0, FLM_ERR_FORMAT, "d_ffn 0");
    MUTATE(16, 0, FLM_ERR_FORMAT, "rank 0");
    MUTATE(16, 9, FLM_ERR_FORMAT, "rank > d_model");
    MUTATE(12, 2, FLM_ERR_FORMAT, "rank > d_ffn");
    MUTATE(8, FLM_PREDICTOR_MAX_DIM + 1, FLM_ERR_FORMAT, "huge d_model");
    MUTATE(12, 0xffffffffu, FLM_ERR_FORMAT, "huge d_ffn");
    MUTATE(16, 0xffffffffu, FLM_ERR_FORMAT, "huge rank");
    MUTATE(20, 0x7fc00000u, FLM_ERR_FORMAT, "NaN threshold");
    MUTATE(20, 0xff800000u, FLM_ERR_FORMAT, "-inf threshold");
    MUTATE(24, 1, FLM_ERR_FORMAT, "reserved 0");
    MUTATE(28, 0x80000000u, FLM_ERR_FORMAT, "reserved 1");
    MUTATE(32, 0x7f800000u, FLM_ERR_FORMAT, "inf in A");
    MUTATE(32 + 4 * 24, 0x7fc00001u, FLM_ERR_FORMAT, "NaN in B");
    MUTATE(na - 4, 0xff800000u, FLM_ERR_FORMAT, "-inf in c");
    MUTATE(8, 9, FLM_ERR_FORMAT, "d_model 9: record longer than the buffer");
    MUTATE(8, 6, FLM_OK, "d_model 6: a shorter record fits");
    MUTATE(8, 7, FLM_ERR_FORMAT, "d_model 7: an odd number of halves needs a zero pad, here a B value");
    MUTATE(32, 0x7c00u, FLM_ERR_FORMAT, "inf half in A");
    /* shapes whose size overflows 32 bits (and would overflow size_t on 32-bit hosts) are only length errors */
    memcpy(t, buf, na);
    put32(t + 8, FLM_PREDICTOR_MAX_DIM);
    put32(t + 12, FLM_PREDICTOR_MAX_DIM);
    put32(t + 16, FLM_PREDICTOR_MAX_DIM);
    expect_code(t, na, FLM_ERR_FORMAT, "2^20 cube");
    /* random header corruption: never a crash; OK only when the header still describes a record that fits */
    uint64_t rs = 77;
    for (int it = 0; it < 4000; it++) {
        memcpy(t, buf, na);
        int nflip = 1 + (int)(tu_rand_u64(&rs) % 3);
        for (int f = 0; f < nflip; f++) t[tu_rand_u64(&rs) % 32] ^= (uint8_t)(1u << (tu_rand_u64(&rs) % 8));
        flm_predictor q;
        size_t u = 0;
        flm_status st = flm_predictor_deserialize(&q, t, na, &u, "fuzz", &err);
        if (st == FLM_OK) {
            assert_true(u <= na);
            flm_predictor_free(&q);
        } else {
            assert_true(st == FLM_ERR_FORMAT || st == FLM_ERR_UNSUPPORTED);
        }
    }
#undef MUTATE
    free(t);
    free(buf);
    flm_predictor_free(&a);
    flm_predictor_free(&b);
}

/* The predictor region, version 2: levels round-trip, a level can be chosen, every truncation is refused. */
static void test_sparsity_region(void **state) {
    (void)state;
    uint64_t rs = 9;
    flm_predictor_region a = {0}, b;
    flm_error err;
    a.n_layers = 2;
    a.n_levels = 3;
    a.default_level = 1;
    a.target_sparsity = 0.01f;
    float eps[3] = {0.001f, 0.01f, 0.1f};
    a.layers = calloc(2, sizeof *a.layers);
    for (uint32_t k = 0; k < 3; k++) {
        a.level_eps[k] = eps[k];
        a.level_loss[k] = k == 2 ? NAN : 0.01f * (float)k;
    }
    for (uint32_t l = 0; l < 2; l++) {
        flm_predictor_layer *L = &a.layers[l];
        L->rule = FLM_RULE_CONTRIB;
        assert_int_equal(flm_predictor_init(&L->pred, 8, 12, 3, &err), FLM_OK);
        fill_random(&L->pred, &rs);
        for (uint32_t k = 0; k < 3; k++)
            L->levels[k] = (flm_level){0.01f * (float)(k + 1), (float)k - 1.0f, 0.9f - 0.2f * (float)k,
                                       0.95f - 0.1f * (float)k, 0.99f, 0.9f, 0.5f};
        for (int k = 0; k < FLM_AGG_K; k++) L->s_agg[k] = 0.5f;
    }
    flm_predictor_region_use_level(&a, 1);
    assert_true(a.layers[1].pred.threshold == 0.0f && a.layers[1].threshold == 0.02f);
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(flm_predictor_region_serialize(&a, &buf, &len, &err), FLM_OK);
    assert_int_equal(flm_predictor_region_deserialize(buf, len, "r.flm", &b, &err), FLM_OK);
    assert_int_equal(b.n_levels, 3);
    assert_int_equal(b.default_level, 1);
    assert_true(isnan(b.level_loss[2]) && b.level_loss[1] == 0.01f);
    assert_int_equal(flm_predictor_region_find_level(&b, 0.1f), 2);
    assert_int_equal(flm_predictor_region_find_level(&b, 0.05f), -1);
    assert_memory_equal(&a.layers[1].levels[2], &b.layers[1].levels[2], sizeof(flm_level));
    flm_predictor_region_use_level(&b, 2);
    assert_true(b.layers[0].pred.threshold == 1.0f && b.layers[0].pred_frac == 0.75f);
    flm_predictor_region_free(&b);
    for (size_t n = 0; n < len; n += 7) {
        flm_status st = flm_predictor_region_deserialize(buf, n, "r.flm", &b, &err);
        assert_int_not_equal(st, FLM_OK);
        assert_non_null(strstr(err.msg, "r.flm"));
    }
    uint8_t *t = malloc(len);
    memcpy(t, buf, len);
    put32(t + 20, FLM_MAX_LEVELS + 1); /* too many levels */
    assert_int_equal(flm_predictor_region_deserialize(t, len, "r.flm", &b, &err), FLM_ERR_FORMAT);
    memcpy(t, buf, len);
    put32(t + 24, 3); /* default level out of range */
    assert_int_equal(flm_predictor_region_deserialize(t, len, "r.flm", &b, &err), FLM_ERR_FORMAT);
    free(t);
    free(buf);
    flm_predictor_region_free(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sparsity_region),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_predict_naive),
        cmocka_unit_test(test_serialize),
        cmocka_unit_test(test_eval_matches_predict),
        cmocka_unit_test(test_calibrate_warm_start),
        cmocka_unit_test(test_train_relu_layer),
        cmocka_unit_test(test_train_anisotropic),
        cmocka_unit_test(test_balanced_loss),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
