/* synth.c — `flashlm synth`: synthetic llama GGUF files with realistic FFN activation statistics. See synth.h and
 * docs/SYNTH.md (the construction, the numbers it was checked against).
 *
 * Outline of flm_synth_write:
 *   metadata + vocabulary -> tensor infos -> for each tensor, in file order: generate its rows (OpenMP over rows,
 *   each row from its own counter-based RNG stream, so the bytes do not depend on the thread count), quantize them
 *   into a tensor buffer, run the calibration tokens through it, hand it to a background thread that writes it
 *   (while the next tensor is made in the other buffer).
 * The calibration runs `calib_tokens` tokens through the forward pass's own blocks (runtime/pass.h: the norm,
 * linear, attention, FFN activation and residual blocks flm_forward is assembled from), one tensor at a time: it sees
 * each tensor right after it is made, so the scale of attn_output and ffn_down and the gate biases can be chosen from
 * the activations the real model will produce. Finished files are measured by the engine itself (flm_open and
 * flm_eval_hooked, with an FFN tap: flm_synth_measure). */
#include "synth/synth.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compute/attention.h"
#include "compute/kernels.h"
#include "format/gguf.h"
#include "write/gguf_write.h"
#include "runtime/pass.h"    /* the forward pass's blocks: calibration while writing */
#include "runtime/hooks.h"   /* the engine and its FFN tap: measurement */
#include "format/tokenizer.h"
#include "core/types.h"
#include "core/util.h"
#include "core/error.h"
#include "compute/act.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SYNTH_HAVE_F16C 1
#endif

#define SYNTH_MAX_VOCAB (1u << 20)
#define SYNTH_N_SPECIAL 259u /* <unk>, <s>, </s>, 256 byte tokens */

/* ---------------------------------------------------------------------------------------------------------------
 * Parameters
 * ------------------------------------------------------------------------------------------------------------- */
void flm_synth_params_default(flm_synth_params *p) {
    memset(p, 0, sizeof *p);
    p->d_model = 2048;
    p->d_ffn = 5632;
    p->n_layers = 28;
    p->n_heads = 32;
    p->n_kv_heads = 32;
    p->n_vocab = 32000;
    p->n_ctx = 2048;
    p->type = FLM_TYPE_F16;
    p->act = FLM_ACT_RELU;
    p->active = 0.05;
    p->rank = 64;
    p->noise = 0.1;
    p->decay = 0.5;
    p->tail = 2.0;
    p->calib_tokens = 64;
    p->seed = 1;
    p->norm_eps = 1e-5f;
    p->rope_theta = 10000.0f;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    p->n_threads = n > 0 ? (int)n : 1;
}

flm_status flm_synth_check(const flm_synth_params *p, flm_error *err) {
    if (!p) return flm_fail(err, FLM_ERR_ARG, "synth: no parameters");
#define BAD(...) return flm_fail(err, FLM_ERR_ARG, "synth: " __VA_ARGS__)
    if (p->d_model < 2 || p->d_model > (1u << 20)) BAD("d_model %u is out of range (2..1048576)", p->d_model);
    if (p->d_ffn < 1 || p->d_ffn > (1u << 20)) BAD("d_ffn %u is out of range (1..1048576)", p->d_ffn);
    if (p->n_layers < 1 || p->n_layers > 4096) BAD("the number of layers %u is out of range (1..4096)", p->n_layers);
    if (p->n_heads < 1 || p->n_heads > 4096) BAD("the number of heads %u is out of range (1..4096)", p->n_heads);
    if (p->d_model % p->n_heads) BAD("d_model %u is not a multiple of the number of heads %u", p->d_model, p->n_heads);
    if ((p->d_model / p->n_heads) % 2)
        BAD("head dimension d_model/heads = %u/%u = %u must be even (RoPE rotates pairs)", p->d_model, p->n_heads,
            p->d_model / p->n_heads);
    if (p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads)
        BAD("kv-heads %u must be at least 1 and divide heads %u", p->n_kv_heads, p->n_heads);
    if (p->n_vocab < SYNTH_N_SPECIAL || p->n_vocab > SYNTH_MAX_VOCAB)
        BAD("vocab %u is out of range (%u..%u: <unk>, <s>, </s> and the 256 byte tokens come first)", p->n_vocab,
            SYNTH_N_SPECIAL, SYNTH_MAX_VOCAB);
    if (p->n_ctx < 1 || p->n_ctx > (1u << 24)) BAD("context length %u is out of range (1..16777216)", p->n_ctx);
    const flm_type_traits *tt = flm_type_traits_of(p->type);
    const char *tn = tt ? tt->name : NULL;
    if (!tt || !tt->is_tensor || !tt->has_quantizer) {
        char list[160];
        size_t len = 0;
        list[0] = '\0';
        for (uint32_t t = 0; t < FLM_N_TYPES; t++) { /* the types synth can write: tensor types with a quantizer */
            const flm_type_traits *u = flm_type_traits_of(t);
            if (u && u->is_tensor && u->has_quantizer && len + 8 < sizeof list)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", u->name);
        }
        BAD("tensor type %u%s%s%s cannot be synthesized (types with a quantizer: %s)", p->type, tn ? " (" : "",
            tn ? tn : "", tn ? ")" : "", list);
    }
    size_t be = flm_type_block_elems(p->type);
    if (p->d_model % be || p->d_ffn % be)
        BAD("type %s stores rows in blocks of %zu: d_model %u and d_ffn %u must both be multiples of %zu", tn, be,
            p->d_model, p->d_ffn, be);
    if (p->act != FLM_ACT_RELU && p->act != FLM_ACT_SILU) BAD("activation %d is not relu or silu", (int)p->act);
    if (!(p->active > 0.0 && p->active <= 0.9)) BAD("active fraction %g is out of range (0, 0.9]", p->active);
    uint32_t max_rank = p->d_model - 1 < p->d_ffn ? p->d_model - 1 : p->d_ffn;
    if (p->rank > max_rank) BAD("rank %u exceeds min(d_model - 1, d_ffn) = %u", p->rank, max_rank);
    if (!(p->noise >= 0.0 && p->noise <= 1.0)) BAD("noise %g is out of range [0, 1]", p->noise);
    if (!(p->decay >= 0.0 && p->decay <= 4.0)) BAD("spectrum decay %g is out of range [0, 4]", p->decay);
    if (!(p->tail > 0.0 && p->tail <= 8.0)) BAD("tail exponent %g is out of range (0, 8]", p->tail);
    if (p->calib_tokens < 8 || p->calib_tokens > 1024)
        BAD("calibration tokens %u is out of range (8..1024)", p->calib_tokens);
    if (!(p->norm_eps > 0.0f && p->norm_eps < 1.0f)) BAD("norm epsilon %g is out of range (0, 1)", (double)p->norm_eps);
    if (!(p->rope_theta > 0.0f && isfinite(p->rope_theta))) BAD("RoPE base %g must be positive", (double)p->rope_theta);
    if (p->n_threads < 1 || p->n_threads > 1024) BAD("threads %d is out of range (1..1024)", p->n_threads);
    if (p->arch != FLM_SYNTH_ARCH_LLAMA && p->arch != FLM_SYNTH_ARCH_OPT) BAD("architecture %u is not llama or opt",
                                                                               p->arch);
    if (p->arch == FLM_SYNTH_ARCH_OPT && p->act != FLM_ACT_RELU)
        BAD("an OPT-shaped model has a ReLU FFN (act relu, not silu)");
    if (p->arch == FLM_SYNTH_ARCH_OPT && p->calib_tokens > p->n_ctx)
        BAD("calibration tokens %u exceed the %u learned positions (context length)", p->calib_tokens, p->n_ctx);
#undef BAD
    return FLM_OK;
}

/* Tensor data bytes of each kind (no padding). */
static uint64_t mat_bytes(uint32_t type, uint64_t rows, uint64_t n) { return (uint64_t)flm_row_bytes(type, n) * rows; }

uint64_t flm_synth_tensor_bytes(const flm_synth_params *p) {
    if (flm_synth_check(p, NULL) != FLM_OK) return 0;
    uint64_t d = p->d_model, f = p->d_ffn, hd = d / p->n_heads, kv = hd * p->n_kv_heads;
    if (p->arch == FLM_SYNTH_ARCH_OPT) { /* no gate; norm weights and biases, q/k/v/o and FFN biases, positions */
        uint64_t layer = 4 * 4 * d + 4 * (2 * d + 2 * kv + f + d) + mat_bytes(p->type, d, d) * 2 +
                         mat_bytes(p->type, kv, d) * 2 + mat_bytes(p->type, f, d) + mat_bytes(p->type, d, f);
        return 2 * mat_bytes(p->type, p->n_vocab, d) + mat_bytes(p->type, p->n_ctx, d) + 2 * 4 * d +
               layer * p->n_layers;
    }
    uint64_t layer = 2 * 4 * d + mat_bytes(p->type, d, d) * 2 + mat_bytes(p->type, kv, d) * 2 +
                     mat_bytes(p->type, f, d) * 2 + mat_bytes(p->type, d, f);
    return 2 * mat_bytes(p->type, p->n_vocab, d) + 4 * d + layer * p->n_layers;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Random numbers: counter-based streams. Every row of every tensor has its own stream, keyed by (seed, stream kind,
 * layer, row), so the output does not depend on the number of threads or the order rows are made in.
 * ------------------------------------------------------------------------------------------------------------- */
enum {
    RNG_EMBD = 1, RNG_Q, RNG_K, RNG_V, RNG_O, RNG_GATE, RNG_GATE_V, RNG_UP, RNG_UP_V, RNG_DOWN, RNG_OUTPUT,
    RNG_PERM, RNG_CALIB, RNG_MEASURE, RNG_POS,
};

static inline uint64_t mix64(uint64_t z) { /* splitmix64's finalizer */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rng_stream(uint64_t seed, uint32_t kind, uint32_t layer, uint64_t row) {
    uint64_t s = mix64(seed + 0x9E3779B97F4A7C15ull);
    s = mix64(s ^ ((uint64_t)kind << 32 | layer));
    return mix64(s ^ row * 0xD1B54A32D192ED03ull);
}

static inline uint64_t rng_next(uint64_t *s) { return mix64(*s += 0x9E3779B97F4A7C15ull); } /* splitmix64 */

/* Uniform in [0, 1). */
static inline double rng_unif(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-53; }

/* Approximately standard normal: the sum of four 16-bit uniforms (Irwin-Hall, n = 4), centred and scaled to unit
 * variance. Bounded by +-3.46; its kurtosis is 2.7 instead of 3. One 64-bit draw per sample: ~1 ns. */
static inline float rng_normal(uint64_t *s) {
    uint64_t r = rng_next(s);
    int32_t sum = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) + (int32_t)((r >> 32) & 0xffff) +
                  (int32_t)(r >> 48);
    return ((float)sum - 131070.0f) * (float)(1.0 / 37837.22679); /* sd of the sum: sqrt((65536^2 - 1) / 3) */
}

/* Inverse of the standard normal CDF (Acklam's rational approximation, relative error < 1.2e-9). p in (0, 1). */
static double norm_ppf(double p) {
    static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                               1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                               6.680131188771972e+01, -1.328068155288572e+01};
    static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                               -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00};
    static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                               3.754408661907416e+00};
    if (p <= 0.0) return -40.0;
    if (p >= 1.0) return 40.0;
    if (p < 0.02425) {
        double q = sqrt(-2 * log(p));
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
               ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    }
    if (p > 1 - 0.02425) return -norm_ppf(1 - p);
    double q = p - 0.5, r = q * q;
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
           (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

/* ---------------------------------------------------------------------------------------------------------------
 * The frequency curve
 * ------------------------------------------------------------------------------------------------------------- */
static double curve_mean(double p_max, double tail, double u0, uint32_t n) {
    double s = 0;
    for (uint32_t k = 0; k < n; k++) s += pow(1.0 + ((k + 0.5) / n) / u0, -tail);
    return p_max * s / n;
}

bool flm_synth_frequencies(double active, double tail, uint32_t n, double *out) {
    if (!(active > 0.0 && active <= 0.9) || !(tail > 0.0) || n == 0) return false;
    double p_max = 0.5 + active / 2;
    /* the mean grows monotonically with u0 from 0 (u0 -> 0) to p_max (u0 -> inf): bisect on log u0 */
    double lo = -30, hi = 30;
    for (int it = 0; it < 100; it++) {
        double mid = 0.5 * (lo + hi);
        if (curve_mean(p_max, tail, exp(mid), n) < active) lo = mid; else hi = mid;
    }
    double u0 = exp(0.5 * (lo + hi));
    for (uint32_t k = 0; k < n; k++) {
        double v = p_max * pow(1.0 + ((k + 0.5) / n) / u0, -tail);
        out[k] = v < 1e-7 ? 1e-7 : v;
    }
    return true;
}

/* ---------------------------------------------------------------------------------------------------------------
 * The calibration batch: T tokens at positions 0..T-1 through the forward pass's own blocks (runtime/pass.h: norm,
 * linear, attention, FFN activation, residual), called one tensor at a time as the model is written
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct fwd {
    flm_hparams hp;               /* the model's (llama: RMSNorm, RoPE in adjacent pairs) */
    flm_pass P;                   /* n = T tokens from position 0; P.hp = &hp */
    flm_layer_weights L;          /* what the attention block reads of a layer: nothing (no q/k norms, global) */
    uint32_t T, d, d_ffn, q_dim, kv_dim, head_dim;
    float *x;     /* [T][d] residual stream */
    float *xn;    /* [T][d] normed input of the current block */
    float *q;     /* [T][q_dim] */
    float *k, *v; /* [T][kv_dim] */
    float *att;   /* [T][q_dim] attention output (input of attn_output) */
    float *o;     /* [T][d] block output */
    float *g;     /* [T][d_ffn] gate projection, then act(gate) * up */
    float *u;     /* [T][d_ffn] up projection */
    float *score; /* [n_heads * T] attention scratch */
    flm_kv_cache kv; /* one layer (every layer reuses it): n_ctx = T, f32 */
} fwd;

static void fwd_free(fwd *f) {
    free(f->x); free(f->xn); free(f->q); free(f->k); free(f->v); free(f->att); free(f->o); free(f->g); free(f->u);
    free(f->score);
    flm_kv_cache_free(&f->kv);
    memset(f, 0, sizeof *f);
}

static flm_status fwd_init(fwd *f, const flm_hparams *hp, uint32_t T, int nt, flm_error *err) {
    memset(f, 0, sizeof *f);
    f->hp = *hp;
    f->T = T;
    f->d = hp->d_model;
    f->d_ffn = hp->d_ffn;
    f->head_dim = hp->head_dim;
    f->q_dim = hp->n_heads * hp->head_dim;
    f->kv_dim = hp->n_kv_heads * hp->head_dim;
    f->x = calloc((size_t)T * f->d, sizeof(float));
    f->xn = calloc((size_t)T * f->d, sizeof(float));
    f->q = calloc((size_t)T * f->q_dim, sizeof(float));
    f->k = calloc((size_t)T * f->kv_dim, sizeof(float));
    f->v = calloc((size_t)T * f->kv_dim, sizeof(float));
    f->att = calloc((size_t)T * f->q_dim, sizeof(float));
    f->o = calloc((size_t)T * f->d, sizeof(float));
    f->g = calloc((size_t)T * f->d_ffn, sizeof(float));
    f->u = calloc((size_t)T * f->d_ffn, sizeof(float));
    f->score = calloc((size_t)hp->n_heads * T, sizeof(float));
    if (!f->x || !f->xn || !f->q || !f->k || !f->v || !f->att || !f->o || !f->g || !f->u || !f->score ||
        flm_kv_cache_init(&f->kv, 1, T, f->kv_dim, FLM_KV_F32, err) != FLM_OK) {
        fwd_free(f);
        return flm_fail(err, FLM_ERR_NOMEM, "synth: out of memory for %u calibration tokens", T);
    }
    f->P = (flm_pass){.k = flm_kernels_best(), .hp = &f->hp, .kv = &f->kv, .n_threads = nt < 1 ? 1 : nt, .n = T,
                      .pos = 0, .att = f->score};
    return FLM_OK;
}

/* Y[t] = W X[t] for t < T: the linear block on the tensor just made (W: rows x n of type, as stored). */
static void fwd_mm(fwd *f, uint32_t type, const void *W, size_t rows, size_t n, const float *X, float *Y) {
    const flm_weight w = {.type = type, .n_in = n, .n_out = rows, .data = W};
    flm_pass_linear(&f->P, &w, NULL, rows, n, X, n, Y, rows);
}

/* xn[t] = norm(x[t]) * w: the norm block */
static void fwd_norm(fwd *f, const float *w) {
    const flm_weight nw = {.type = FLM_TYPE_F32, .n_in = f->d, .n_out = 1, .data = w};
    flm_pass_norm(&f->P, &nw, NULL, f->d, f->x, f->d, f->xn, f->d);
}

/* x[t] = row tokens[t] of the embedding E (type, as stored). */
static void fwd_embed(fwd *f, uint32_t type, const void *E, const int32_t *tokens) {
    size_t stride = flm_row_bytes(type, f->d);
    for (uint32_t t = 0; t < f->T; t++)
        f->P.k->dequant[type]((const uint8_t *)E + (size_t)tokens[t] * stride, f->x + (size_t)t * f->d, f->d);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Vocabulary: <unk>, <s>, </s>, <0x00>..<0xFF>, then pieces made like BPE merges: single characters, then every
 * piece of length k extended by one lower-case letter (in English letter-frequency order), breadth first, so every
 * piece of two or more characters is the merge of a shorter piece and a letter (the tokenizer can reach it).
 * ------------------------------------------------------------------------------------------------------------- */
#define PIECE_MAX 24

typedef struct vocab {
    uint32_t n;
    char (*text)[PIECE_MAX]; /* NUL-terminated */
    const char **ptr;
    float *score;
    int32_t *type;
} vocab;

static void vocab_free(vocab *v) {
    free(v->text); free(v->ptr); free(v->score); free(v->type);
    memset(v, 0, sizeof *v);
}

static bool vocab_build(vocab *v, uint32_t n) {
    static const char letters[] = "etaoinshrdlcumwfgypbvkjxqz";
    static const char upper[] = "ETAOINSHRDLCUMWFGYPBVKJXQZ";
    static const char other[] = "0123456789.,!?'\"-:;()";
    memset(v, 0, sizeof *v);
    v->n = n;
    v->text = calloc(n, sizeof *v->text);
    v->ptr = calloc(n, sizeof *v->ptr);
    v->score = calloc(n, sizeof *v->score);
    v->type = calloc(n, sizeof *v->type);
    if (!v->text || !v->ptr || !v->score || !v->type) { vocab_free(v); return false; }
    snprintf(v->text[0], PIECE_MAX, "<unk>");
    snprintf(v->text[1], PIECE_MAX, "<s>");
    snprintf(v->text[2], PIECE_MAX, "</s>");
    v->type[0] = FLM_TOK_UNKNOWN;
    v->type[1] = v->type[2] = FLM_TOK_CONTROL;
    for (uint32_t b = 0; b < 256; b++) {
        snprintf(v->text[3 + b], PIECE_MAX, "<0x%02X>", b);
        v->type[3 + b] = FLM_TOK_BYTE;
    }
    uint32_t i = SYNTH_N_SPECIAL;
    /* level 1: single characters; "expandable" ones (U+2581 and letters) come first */
    const uint32_t first = i;
#define ADD(s) do { if (i < n) snprintf(v->text[i++], PIECE_MAX, "%s", (s)); } while (0)
    ADD("\xe2\x96\x81");
    for (const char *c = letters; *c; c++) { char s[2] = {*c, 0}; ADD(s); }
    for (const char *c = upper; *c; c++) { char s[2] = {*c, 0}; ADD(s); }
    uint32_t level_begin = first, level_end = i; /* pieces to extend */
    for (const char *c = other; *c; c++) { char s[2] = {*c, 0}; ADD(s); }
    /* further levels: parent + letter, breadth first */
    while (i < n) {
        uint32_t next_begin = i;
        for (uint32_t p = level_begin; p < level_end && i < n; p++) {
            size_t len = strlen(v->text[p]);
            if (len + 2 > PIECE_MAX) continue;
            for (const char *c = letters; *c && i < n; c++) {
                memcpy(v->text[i], v->text[p], len);
                v->text[i][len] = *c;
                v->text[i][len + 1] = 0;
                i++;
            }
        }
        level_begin = next_begin;
        level_end = i;
        if (level_end == level_begin) break; /* cannot happen for n <= SYNTH_MAX_VOCAB */
    }
#undef ADD
    for (uint32_t j = 0; j < n; j++) {
        v->ptr[j] = v->text[j];
        if (j >= first) {
            v->type[j] = FLM_TOK_NORMAL;
            v->score[j] = (float)first - (float)j; /* earlier (shorter, more frequent) pieces merge first */
        }
    }
    return i == n;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Row generators. Each fills one row of n floats from its RNG stream; gen_tensor quantizes them into the tensor
 * buffer, in parallel over rows.
 * ------------------------------------------------------------------------------------------------------------- */
typedef void (*row_fn)(const void *ctx, uint64_t row, uint64_t *rng, float *out, size_t n);

/* N(0, sd^2) entries (sd: row_sd[row] when given); column 0 set to row_col0[row] when given, else to col0 when
 * set_col0; row 0 all zero when zero_row0. */
typedef struct normal_spec {
    float sd;
    const float *row_sd;
    bool set_col0;
    float col0;
    const float *row_col0;
    bool zero_row0;
} normal_spec;

static void row_normal(const void *ctx, uint64_t row, uint64_t *rng, float *out, size_t n) {
    const normal_spec *s = ctx;
    if (s->zero_row0 && row == 0) {
        memset(out, 0, n * sizeof *out);
        return;
    }
    float sd = s->row_sd ? s->row_sd[row] : s->sd;
    for (size_t j = 0; j < n; j++) out[j] = sd * rng_normal(rng);
    if (s->row_col0) out[0] = s->row_col0[row];
    else if (s->set_col0) out[0] = s->col0;
}

/* Low rank plus noise: out = sum_k z_k V[k] + noise, z_k ~ N(0, 1), V = [rank][n] (rows already scaled by the
 * spectrum; column 0 of V is zero), noise ~ N(0, noise_sd^2) on columns 1..n-1. Column 0 is the bias weight:
 * 0 without ppf, else  |row| * sig * ppf[row] - row . mvec  (|row| over columns 1..n-1; see docs/SYNTH.md). */
typedef struct lowrank_spec {
    const flm_kernels *k;
    const float *V;
    uint32_t rank;
    float noise_sd;
    const double *ppf;   /* [rows] Phi^-1(p_i), or NULL */
    double sig;          /* calibration: sigma_c / (w0 * B) */
    const float *mvec;   /* calibration: m / (w0 * B), [n] with mvec[0] = 0; NULL = no mean correction */
} lowrank_spec;

static void row_lowrank(const void *ctx, uint64_t row, uint64_t *rng, float *out, size_t n) {
    const lowrank_spec *s = ctx;
    out[0] = 0.0f;
    for (size_t j = 1; j < n; j++) out[j] = s->noise_sd * rng_normal(rng);
    for (uint32_t r = 0; r < s->rank; r++) s->k->axpy[FLM_TYPE_F32](s->V + (size_t)r * n, rng_normal(rng), out, n);
    out[0] = 0.0f;
    if (!s->ppf) return;
    double ss = 0, gm = 0;
    for (size_t j = 1; j < n; j++) ss += (double)out[j] * out[j];
    if (s->mvec)
        for (size_t j = 1; j < n; j++) gm += (double)out[j] * s->mvec[j];
    out[0] = (float)(sqrt(ss) * s->sig * s->ppf[row] - gm);
}

/* ---------------------------------------------------------------------------------------------------------------
 * The generator
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct synth {
    const flm_synth_params *p;
    flm_gguf_writer *w;
    const flm_kernels *k;
    int nt;
    uint8_t *buf;          /* the tensor being made, stored type */
    uint8_t *spare;        /* the other tensor buffer: the one being written, or free */
    float *vec, *vec2;     /* norm vectors [d_model], alternating the same way */
    /* the write in flight (one at a time, in file order): a thread running flm_gguf_writer_write_tensor */
    pthread_t writer;
    bool writing;
    const void *w_data;
    uint64_t w_nbytes;
    flm_status w_st;
    flm_error w_err;
    float **rowbuf;        /* [nt][max(d_model, d_ffn)] */
    float *V;              /* [rank][d_model] */
    double *freq;          /* [d_ffn] sorted target frequencies */
    double *ppf;           /* [d_ffn] Phi^-1(p_i) of this layer's neurons */
    uint32_t *perm;        /* [d_ffn] */
    float *mvec;           /* [d_model] */
    float *q_sd, *q_c0;    /* [d_model] per-row sd and column-0 weight of attn_q (positional heads) */
    float *k_sd, *k_c0;    /* [d_model] the same for attn_k */
    int32_t *tokens;       /* [T] calibration tokens */
    fwd f;
    flm_progress_fn progress;
    void *user;
    uint64_t done, total;
} synth;

/* Store a float row as type. F16 goes through F16C when the CPU has it (8 values per instruction; rounding to nearest
 * even, as flm_f32_to_f16, so the bytes are the same); everything else through flm_quantize_row. */
#ifdef SYNTH_HAVE_F16C
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(const float *x, uint16_t *y, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = flm_f32_to_f16(x[i]);
}
#endif

static void store_row(uint32_t type, const float *x, void *dst, size_t n, bool f16c) {
#ifdef SYNTH_HAVE_F16C
    if (type == FLM_TYPE_F16 && f16c) {
        f32_to_f16_f16c(x, dst, n);
        return;
    }
#endif
    (void)f16c;
    flm_quantize_row(type, x, dst, n);
}

static bool have_f16c(void) {
#ifdef SYNTH_HAVE_F16C
    return flm_cpu_has_f16c();
#else
    return false;
#endif
}

/* Fill S->buf with rows x n of type from fn, in parallel. */
static void gen_tensor(synth *S, uint32_t type, uint64_t rows, uint64_t n, row_fn fn, const void *ctx, uint32_t kind,
                       uint32_t layer) {
    const size_t stride = flm_row_bytes(type, n);
    const ptrdiff_t nr = (ptrdiff_t)rows;
    uint8_t *buf = S->buf;
    float **rowbuf = S->rowbuf;
    uint64_t seed = S->p->seed;
    bool f16c = have_f16c();
#pragma omp parallel num_threads(S->nt)
    {
        float *tmp = rowbuf[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 64)
        for (ptrdiff_t r = 0; r < nr; r++) {
            uint64_t rng = rng_stream(seed, kind, layer, (uint64_t)r);
            fn(ctx, (uint64_t)r, &rng, tmp, n);
            store_row(type, tmp, buf + (size_t)r * stride, n, f16c);
        }
    }
}

static void *writer_main(void *arg) {
    synth *S = arg;
    S->w_st = flm_gguf_writer_write_tensor(S->w, S->w_data, S->w_nbytes, &S->w_err);
    return NULL;
}

/* Wait for the write in flight, if any; its status (and message into err). */
static flm_status wait_write(synth *S, flm_error *err) {
    if (!S->writing) return FLM_OK;
    pthread_join(S->writer, NULL);
    S->writing = false;
    if (S->w_st && err) *err = S->w_err;
    return S->w_st;
}

/* Write the next tensor in file order from data (S->buf or S->vec) in the background, after the previous write has
 * finished, and hand the caller the other buffer: generation of the next tensor overlaps the write of this one. */
static flm_status write_buf(synth *S, const void *data, uint64_t nbytes, flm_error *err) {
    flm_status st = wait_write(S, err);
    if (st) return st;
    if (S->progress && S->done) S->progress(S->user, "synth", S->done, S->total);
    S->w_data = data;
    S->w_nbytes = nbytes;
    S->w_st = FLM_OK;
    if (pthread_create(&S->writer, NULL, writer_main, S) != 0) {
        writer_main(S); /* no thread: write it here */
        if (S->w_st) {
            if (err) *err = S->w_err;
            return S->w_st;
        }
    } else {
        S->writing = true;
    }
    S->done += nbytes;
    if (data == S->buf) {
        uint8_t *t = S->buf; S->buf = S->spare; S->spare = t;
    } else if (data == S->vec) {
        float *t = S->vec; S->vec = S->vec2; S->vec2 = t;
    }
    return FLM_OK;
}

/* Write an F32 norm vector: weight w0 on dimension 0, 1 elsewhere. Leaves a copy in S->vec2 (the buffer being
 * written), for the calibration pass. */
static flm_status write_norm(synth *S, float w0, flm_error *err) {
    uint32_t d = S->p->d_model;
    for (uint32_t j = 0; j < d; j++) S->vec[j] = 1.0f;
    S->vec[0] = w0;
    return write_buf(S, S->vec, (uint64_t)d * 4, err);
}

/* Write an F32 vector of n floats, all v (OPT's norm weights 1 and zero biases), from S->vec (n <= d_model). */
static flm_status write_const(synth *S, uint32_t n, float v, flm_error *err) {
    for (uint32_t j = 0; j < n; j++) S->vec[j] = v;
    return write_buf(S, S->vec, (uint64_t)n * 4, err);
}

/* Mean over the calibration tokens of sum_{j >= 1} v[t][j]^2, v = [T][n]. */
static double mean_energy(const float *v, uint32_t T, size_t n, size_t from) {
    double s = 0;
    for (uint32_t t = 0; t < T; t++)
        for (size_t j = from; j < n; j++) s += (double)v[(size_t)t * n + j] * v[(size_t)t * n + j];
    return s / T;
}

static flm_status check_finite(const float *v, size_t n, const char *what, uint32_t layer, flm_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return flm_fail(err, FLM_ERR_FORMAT, "synth: calibration: non-finite %s in layer %u", what, layer);
    return FLM_OK;
}

/* The spectrum-scaled shared basis of one layer's gate or up rows: V[k] ~ N(0, s_k^2 c^2 / n) on columns 1..n-1,
 * s_k = (k+1)^-decay, c^2 = (1 - noise) / sum s_k^2, so that a row's low-rank part has energy (1 - noise) on average
 * (and the whole row energy 1: entries of standard deviation ~ 1/sqrt(d_model)). */
static void make_basis(synth *S, uint32_t kind, uint32_t layer, double noise) {
    const flm_synth_params *p = S->p;
    size_t n = p->d_model;
    double sum = 0;
    for (uint32_t k = 0; k < p->rank; k++) sum += pow(k + 1.0, -2.0 * p->decay);
    for (uint32_t k = 0; k < p->rank; k++) {
        uint64_t rng = rng_stream(p->seed, kind, layer, k);
        float sd = (float)(pow(k + 1.0, -p->decay) * sqrt((1.0 - noise) / sum) / sqrt((double)n));
        float *v = S->V + (size_t)k * n;
        v[0] = 0.0f;
        for (size_t j = 1; j < n; j++) v[j] = sd * rng_normal(&rng);
    }
}

static void add_kvs(synth *S, const vocab *v) {
    const flm_synth_params *p = S->p;
    flm_gguf_writer *w = S->w;
    uint32_t ftype = 0;
    switch (p->type) {
    case FLM_TYPE_F32: ftype = 0; break;   /* LLAMA_FTYPE_ALL_F32 */
    case FLM_TYPE_F16: ftype = 1; break;   /* LLAMA_FTYPE_MOSTLY_F16 */
    case FLM_TYPE_Q4_0: ftype = 2; break;  /* LLAMA_FTYPE_MOSTLY_Q4_0 */
    case FLM_TYPE_Q4_1: ftype = 3; break;  /* LLAMA_FTYPE_MOSTLY_Q4_1 */
    case FLM_TYPE_Q5_0: ftype = 8; break;  /* LLAMA_FTYPE_MOSTLY_Q5_0 */
    case FLM_TYPE_Q5_1: ftype = 9; break;  /* LLAMA_FTYPE_MOSTLY_Q5_1 */
    case FLM_TYPE_Q8_0: ftype = 7; break;  /* LLAMA_FTYPE_MOSTLY_Q8_0 */
    case FLM_TYPE_BF16: ftype = 32; break; /* LLAMA_FTYPE_MOSTLY_BF16 */
    }
    char name[128], desc[512];
    snprintf(name, sizeof name, "flashlm-synth d%u-f%u-l%u-%s-%s", p->d_model, p->d_ffn, p->n_layers,
             flm_type_name(p->type), p->act == FLM_ACT_RELU ? "relu" : "silu");
    snprintf(desc, sizeof desc,
             "Synthetic model written by flashlm synth: RANDOM weights, the text it produces is meaningless. It "
             "measures the system (I/O, memory, kernels), not model quality. FFN activation statistics: active %g, "
             "rank %u, noise %g, decay %g, tail %g, calibration tokens %u, seed %llu.",
             p->active, p->rank, p->rank ? p->noise : 1.0, p->decay, p->tail, p->calib_tokens,
             (unsigned long long)p->seed);
    const bool opt = p->arch == FLM_SYNTH_ARCH_OPT;
    if (opt) snprintf(name, sizeof name, "flashlm-synth opt d%u-f%u-l%u-%s", p->d_model, p->d_ffn, p->n_layers,
                      flm_type_name(p->type));
    flm_gguf_writer_kv_str(w, "general.architecture", opt ? "opt" : "llama");
    flm_gguf_writer_kv_str(w, "general.name", name);
    flm_gguf_writer_kv_str(w, "general.description", desc);
    flm_gguf_writer_kv_u32(w, "general.file_type", ftype);
    flm_gguf_writer_kv_u32(w, "general.quantization_version", 2);
    /* ARCH.*: the same keys under the architecture's name; OPT: LayerNorm epsilon, no RoPE keys (learned positions),
     * ReLU its own activation; llama: RMSNorm epsilon and RoPE */
    const char *arch = opt ? "opt" : "llama";
    char key[96];
#define ARCH_KEY(name) (snprintf(key, sizeof key, "%s." name, arch), key)
    flm_gguf_writer_kv_u32(w, ARCH_KEY("context_length"), p->n_ctx);
    flm_gguf_writer_kv_u32(w, ARCH_KEY("embedding_length"), p->d_model);
    flm_gguf_writer_kv_u32(w, ARCH_KEY("block_count"), p->n_layers);
    flm_gguf_writer_kv_u32(w, ARCH_KEY("feed_forward_length"), p->d_ffn);
    flm_gguf_writer_kv_u32(w, ARCH_KEY("attention.head_count"), p->n_heads);
    flm_gguf_writer_kv_u32(w, ARCH_KEY("attention.head_count_kv"), p->n_kv_heads);
    flm_gguf_writer_kv_u32(w, ARCH_KEY("vocab_size"), p->n_vocab);
    if (opt) {
        flm_gguf_writer_kv_f32(w, ARCH_KEY("attention.layer_norm_epsilon"), p->norm_eps);
    } else {
        flm_gguf_writer_kv_f32(w, ARCH_KEY("attention.layer_norm_rms_epsilon"), p->norm_eps);
        flm_gguf_writer_kv_f32(w, ARCH_KEY("rope.freq_base"), p->rope_theta);
        flm_gguf_writer_kv_u32(w, ARCH_KEY("rope.dimension_count"), p->d_model / p->n_heads);
        if (p->act == FLM_ACT_RELU) flm_gguf_writer_kv_str(w, "flashlm.ffn_activation", "relu");
    }
#undef ARCH_KEY
    flm_gguf_writer_kv_str(w, "tokenizer.ggml.model", "llama");
    flm_gguf_writer_kv_arr(w, "tokenizer.ggml.tokens", GGUF_VT_STRING, v->ptr, v->n);
    flm_gguf_writer_kv_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, v->score, v->n);
    flm_gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, v->type, v->n);
    flm_gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", 1);
    flm_gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", 2);
    flm_gguf_writer_kv_u32(w, "tokenizer.ggml.unknown_token_id", 0);
}

static void add_tensors(synth *S) {
    const flm_synth_params *p = S->p;
    uint64_t d = p->d_model, f = p->d_ffn, kv = (uint64_t)(d / p->n_heads) * p->n_kv_heads;
    char name[96];
#define T2(nm, n_in, n_out) do { uint64_t ne[2] = {(n_in), (n_out)}; \
        flm_gguf_writer_add_tensor(S->w, nm, p->type, 2, ne); } while (0)
#define T1(nm, n) do { uint64_t ne[1] = {(n)}; flm_gguf_writer_add_tensor(S->w, nm, FLM_TYPE_F32, 1, ne); } while (0)
    T2("token_embd.weight", d, p->n_vocab);
    if (p->arch == FLM_SYNTH_ARCH_OPT) { /* in the order synth_layer_opt writes them */
        static const char *const parts[] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                                            "ffn_up", "ffn_down"};
        T2("position_embd.weight", d, p->n_ctx);
        for (uint32_t l = 0; l < p->n_layers; l++)
            for (int i = 0; i < 8; i++) {
                const uint64_t out = i == 2 || i == 3 ? kv : i == 6 ? f : d, in = i == 7 ? f : d;
                snprintf(name, sizeof name, "blk.%u.%s.weight", l, parts[i]);
                if (i == 0 || i == 5) T1(name, d);
                else T2(name, in, out);
                snprintf(name, sizeof name, "blk.%u.%s.bias", l, parts[i]);
                T1(name, out);
            }
        T1("output_norm.weight", d);
        T1("output_norm.bias", d);
        T2("output.weight", d, p->n_vocab);
        return;
    }
    for (uint32_t l = 0; l < p->n_layers; l++) {
        snprintf(name, sizeof name, "blk.%u.attn_norm.weight", l); T1(name, d);
        snprintf(name, sizeof name, "blk.%u.attn_q.weight", l); T2(name, d, d);
        snprintf(name, sizeof name, "blk.%u.attn_k.weight", l); T2(name, d, kv);
        snprintf(name, sizeof name, "blk.%u.attn_v.weight", l); T2(name, d, kv);
        snprintf(name, sizeof name, "blk.%u.attn_output.weight", l); T2(name, d, d);
        snprintf(name, sizeof name, "blk.%u.ffn_norm.weight", l); T1(name, d);
        snprintf(name, sizeof name, "blk.%u.ffn_gate.weight", l); T2(name, d, f);
        snprintf(name, sizeof name, "blk.%u.ffn_up.weight", l); T2(name, d, f);
        snprintf(name, sizeof name, "blk.%u.ffn_down.weight", l); T2(name, f, d);
    }
    T1("output_norm.weight", d);
    T2("output.weight", d, p->n_vocab);
#undef T1
#undef T2
}

/* Scales of the construction (docs/SYNTH.md). */
#define SYNTH_BIAS_SD 4.0f     /* embedding dim 0 (the bias channel) = 4 sd: the absmax of every Q8_0/Q4_0 block 0 */
#define SYNTH_QK_GAIN 2.0f     /* content heads: q, k rows of sd 2/sqrt(d): scores of sd ~4 (peaked, not uniform) */
#define SYNTH_QK_GAIN_POS 0.5f /* positional heads: a small content part (scores of sd ~0.25) */

/* Head roles. With two or more KV heads, every odd KV head (and the query heads reading it) is positional: q and k
 * get a constant part from the bias channel whose RoPE phases make the score depend on the distance alone,
 * beta * sum_j cos((t - s - delta) theta_j): a local window of the last 1..4 tokens (delta 0) or a previous-token
 * head (delta 1). The others are content heads: random q, k. Positional heads carry context from token to token, so
 * nearby tokens share part of their FFN input and of their active neurons (what windowing exploits, Knowl 3). */
static void head_roles(synth *S, uint32_t head_dim, float xa) {
    const flm_synth_params *p = S->p;
    static const float betas[] = {0.4f, 0.7f, 1.0f, 1.6f};
    const double sd_w = 1.0 / sqrt((double)p->d_model);
    const uint32_t group = p->n_heads / p->n_kv_heads;
    for (uint32_t g = 0; g < p->n_kv_heads; g++) {
        bool pos = p->n_kv_heads >= 2 && g % 2 == 1;
        uint32_t m = g / 2;
        float beta = betas[m % 4], delta = (float)((m + m / 4) % 2);
        float a = sqrtf(beta * sqrtf((float)head_dim)) / xa; /* |q_j| = |k_j| = a * xa: a^2 xa^2 / sqrt(hd) = beta */
        for (uint32_t j = 0; j < head_dim; j++) {
            size_t r = (size_t)g * head_dim + j;
            S->k_sd[r] = (float)((pos ? SYNTH_QK_GAIN_POS : SYNTH_QK_GAIN) * sd_w);
            S->k_c0[r] = 0.0f;
            if (pos) {
                float freq = 1.0f / powf(p->rope_theta, (float)(j & ~1u) / (float)head_dim); /* as flm_rope */
                S->k_c0[r] = a * (j % 2 ? sinf(delta * freq) : cosf(delta * freq));
            }
            for (uint32_t h = g * group; h < (g + 1) * group; h++) {
                size_t q = (size_t)h * head_dim + j;
                S->q_sd[q] = S->k_sd[r];
                S->q_c0[q] = pos && j % 2 == 0 ? a : 0.0f;
            }
        }
    }
}

/* One layer: the nine tensors in file order, each followed by its calibration step. */
static flm_status synth_layer(synth *S, uint32_t l, double e0, flm_error *err) {
    const flm_synth_params *p = S->p;
    fwd *f = &S->f;
    const uint32_t type = p->type, d = p->d_model, nf = p->d_ffn, T = f->T;
    const size_t stride_d = flm_row_bytes(type, d), stride_f = flm_row_bytes(type, nf);
    const double eta = 1.0 / p->n_layers; /* each block adds eta * e0 to the residual energy */
    const double sd_w = 1.0 / sqrt((double)d);
    const float B = SYNTH_BIAS_SD * (float)sd_w;
    flm_status st;

    /* attention: the norm's weight on the bias channel makes it ~ sqrt(d) after RMSNorm, as for the FFN below */
    double sr2a = mean_energy(f->x, T, d, 1) / (d - 1);
    if ((st = write_norm(S, (float)(sqrt((d - 1) * sr2a) / B), err))) return st;
    fwd_norm(f, S->vec2);
    double xa = 0;
    for (uint32_t t = 0; t < T; t++) xa += f->xn[(size_t)t * d] / T;
    head_roles(S, f->head_dim, (float)xa);
    normal_spec qs = {.row_sd = S->q_sd, .row_col0 = S->q_c0}, ks = {.row_sd = S->k_sd, .row_col0 = S->k_c0};
    normal_spec vs = {.sd = (float)sd_w, .set_col0 = true, .col0 = 0.0f};
    gen_tensor(S, type, f->q_dim, d, row_normal, &qs, RNG_Q, l);
    fwd_mm(f, type, S->buf, f->q_dim, d, f->xn, f->q);
    if ((st = write_buf(S, S->buf, stride_d * f->q_dim, err))) return st;
    gen_tensor(S, type, f->kv_dim, d, row_normal, &ks, RNG_K, l);
    fwd_mm(f, type, S->buf, f->kv_dim, d, f->xn, f->k);
    if ((st = write_buf(S, S->buf, stride_d * f->kv_dim, err))) return st;
    gen_tensor(S, type, f->kv_dim, d, row_normal, &vs, RNG_V, l);
    fwd_mm(f, type, S->buf, f->kv_dim, d, f->xn, f->v);
    if ((st = write_buf(S, S->buf, stride_d * f->kv_dim, err))) return st;
    flm_pass_attention(&f->P, &f->L, 0, f->q, f->k, f->v, f->att, f->q_dim);
    /* attn_output: row 0 zero (the bias channel passes the residual untouched); scaled to add eta * e0 */
    double ea = mean_energy(f->att, T, f->q_dim, 0);
    normal_spec os = {.sd = (float)sqrt(eta * e0 / ((d - 1) * (ea > 1e-30 ? ea : 1e-30))), .zero_row0 = true};
    gen_tensor(S, type, d, f->q_dim, row_normal, &os, RNG_O, l);
    fwd_mm(f, type, S->buf, d, f->q_dim, f->att, f->o);
    flm_pass_residual(&f->P, f->x, f->o, d, &f->L.post_attn_norm);
    if ((st = write_buf(S, S->buf, (uint64_t)flm_row_bytes(type, f->q_dim) * d, err))) return st;
    if ((st = check_finite(f->x, (size_t)T * d, "attention output", l, err))) return st;

    /* FFN input statistics of the residual r = x[1..d-1] over the calibration tokens:
     * s_r^2 = E|r|^2/(d-1), mean m (shrunk towards 0 by its sampling noise), sigma_c^2 = s_r^2 - |m|^2/(d-1). */
    double sr2 = mean_energy(f->x, T, d, 1) / (d - 1);
    double m2 = 0;
    for (uint32_t j = 1; j < d; j++) {
        double s = 0;
        for (uint32_t t = 0; t < T; t++) s += f->x[(size_t)t * d + j];
        S->mvec[j] = (float)(s / T);
        m2 += (s / T) * (s / T);
    }
    double noise_m2 = (sr2 * (d - 1) - m2) / (T > 1 ? T - 1 : 1); /* expected |m_hat - m|^2 */
    double shrink = m2 > 0 ? 1.0 - noise_m2 / m2 : 0.0;
    if (shrink < 0) shrink = 0;
    double sc2 = sr2 - shrink * m2 / (d - 1); /* James-Stein: |m|^2 ~ m2 - noise_m2 */
    if (sc2 < 1e-3 * sr2) sc2 = 1e-3 * sr2;
    /* ffn_norm: dimension 0 weight w0 makes the normed bias channel ~ sqrt(d-1) * s_r / rms ~ sqrt(d) */
    double w0 = sqrt((double)(d - 1) * sr2) / B;
    double wb = w0 * B;
    S->mvec[0] = 0.0f;
    for (uint32_t j = 1; j < d; j++) S->mvec[j] = (float)(S->mvec[j] * shrink / wb);
    if ((st = write_norm(S, (float)w0, err))) return st;
    fwd_norm(f, S->vec2);

    /* gate: low rank + noise; bias weight on dimension 0 sets P(gate_i . x > 0) = p_i */
    double noise = p->rank ? p->noise : 1.0;
    uint64_t prng = rng_stream(p->seed, RNG_PERM, l, 0);
    for (uint32_t i = 0; i < nf; i++) S->perm[i] = i;
    for (uint32_t i = nf; i > 1; i--) { /* Fisher-Yates */
        uint32_t j = (uint32_t)(rng_unif(&prng) * i);
        uint32_t t = S->perm[i - 1]; S->perm[i - 1] = S->perm[j]; S->perm[j] = t;
    }
    for (uint32_t i = 0; i < nf; i++) S->ppf[i] = norm_ppf(S->freq[S->perm[i]]);
    make_basis(S, RNG_GATE_V, l, noise);
    lowrank_spec gs = {.k = S->k, .V = S->V, .rank = p->rank, .noise_sd = (float)sqrt(noise / d), .ppf = S->ppf,
                       .sig = sqrt(sc2) / wb, .mvec = S->mvec};
    gen_tensor(S, type, nf, d, row_lowrank, &gs, RNG_GATE, l);
    fwd_mm(f, type, S->buf, nf, d, f->xn, f->g);
    if ((st = write_buf(S, S->buf, stride_d * nf, err))) return st;
    /* up: low rank + noise, no bias */
    make_basis(S, RNG_UP_V, l, noise);
    lowrank_spec us = {.k = S->k, .V = S->V, .rank = p->rank, .noise_sd = (float)sqrt(noise / d)};
    gen_tensor(S, type, nf, d, row_lowrank, &us, RNG_UP, l);
    fwd_mm(f, type, S->buf, nf, d, f->xn, f->u);
    if ((st = write_buf(S, S->buf, stride_d * nf, err))) return st;
    flm_pass_ffn_act(f->P.k, &f->hp, (size_t)T * nf, f->g, f->u); /* g = act(gate) * up */
    if ((st = check_finite(f->g, (size_t)T * nf, "FFN activation", l, err))) return st;
    /* down: row 0 zero; scaled to add eta * e0 */
    double eh = mean_energy(f->g, T, nf, 0);
    normal_spec ds = {.sd = (float)sqrt(eta * e0 / ((d - 1) * (eh > 1e-30 ? eh : 1e-30))), .zero_row0 = true};
    gen_tensor(S, type, d, nf, row_normal, &ds, RNG_DOWN, l);
    fwd_mm(f, type, S->buf, d, nf, f->g, f->o);
    flm_pass_residual(&f->P, f->x, f->o, d, &f->L.post_ffn_norm);
    if ((st = write_buf(S, S->buf, stride_f * d, err))) return st;
    return check_finite(f->x, (size_t)T * d, "FFN output", l, err);
}

/* One OPT layer (pre-LN): the sixteen tensors in file order (add_tensors), each followed by its calibration step.
 * LayerNorm weights 1 and biases 0; q, k, v, o and down biases 0 (present, as OPT's); content attention heads (no
 * RoPE: OPT's positions are the learned rows added at the embedding); up rows low rank plus noise as llama's, and the
 * up bias of neuron i set from its pre-activation's mean m_i and standard deviation s_i over the calibration tokens,
 * b_i = s_i Phi^-1(p_i) - m_i, so that relu(up_i . x + b_i) > 0 on a fraction p_i of tokens (docs/SYNTH.md). */
static flm_status synth_layer_opt(synth *S, uint32_t l, double e0, flm_error *err) {
    const flm_synth_params *p = S->p;
    fwd *f = &S->f;
    const uint32_t type = p->type, d = p->d_model, nf = p->d_ffn, T = f->T;
    const size_t stride_d = flm_row_bytes(type, d), stride_f = flm_row_bytes(type, nf);
    const double eta = 1.0 / p->n_layers, sd_w = 1.0 / sqrt((double)d);
    flm_status st;
    if ((st = write_const(S, d, 1.0f, err))) return st;
    fwd_norm(f, S->vec2);
    if ((st = write_const(S, d, 0.0f, err))) return st;
    normal_spec qk = {.sd = (float)(SYNTH_QK_GAIN * sd_w)}, vs = {.sd = (float)sd_w};
    gen_tensor(S, type, f->q_dim, d, row_normal, &qk, RNG_Q, l);
    fwd_mm(f, type, S->buf, f->q_dim, d, f->xn, f->q);
    if ((st = write_buf(S, S->buf, stride_d * f->q_dim, err)) || (st = write_const(S, f->q_dim, 0.0f, err)))
        return st;
    gen_tensor(S, type, f->kv_dim, d, row_normal, &qk, RNG_K, l);
    fwd_mm(f, type, S->buf, f->kv_dim, d, f->xn, f->k);
    if ((st = write_buf(S, S->buf, stride_d * f->kv_dim, err)) || (st = write_const(S, f->kv_dim, 0.0f, err)))
        return st;
    gen_tensor(S, type, f->kv_dim, d, row_normal, &vs, RNG_V, l);
    fwd_mm(f, type, S->buf, f->kv_dim, d, f->xn, f->v);
    if ((st = write_buf(S, S->buf, stride_d * f->kv_dim, err)) || (st = write_const(S, f->kv_dim, 0.0f, err)))
        return st;
    flm_pass_attention(&f->P, &f->L, 0, f->q, f->k, f->v, f->att, f->q_dim);
    double ea = mean_energy(f->att, T, f->q_dim, 0);
    normal_spec os = {.sd = (float)sqrt(eta * e0 / (d * (ea > 1e-30 ? ea : 1e-30)))};
    gen_tensor(S, type, d, f->q_dim, row_normal, &os, RNG_O, l);
    fwd_mm(f, type, S->buf, d, f->q_dim, f->att, f->o);
    flm_pass_residual(&f->P, f->x, f->o, d, &f->L.post_attn_norm);
    if ((st = write_buf(S, S->buf, (uint64_t)flm_row_bytes(type, f->q_dim) * d, err)) ||
        (st = write_const(S, d, 0.0f, err)))
        return st;
    if ((st = check_finite(f->x, (size_t)T * d, "attention output", l, err))) return st;
    /* FFN */
    if ((st = write_const(S, d, 1.0f, err))) return st;
    fwd_norm(f, S->vec2);
    if ((st = write_const(S, d, 0.0f, err))) return st;
    double noise = p->rank ? p->noise : 1.0;
    uint64_t prng = rng_stream(p->seed, RNG_PERM, l, 0);
    for (uint32_t i = 0; i < nf; i++) S->perm[i] = i;
    for (uint32_t i = nf; i > 1; i--) { /* Fisher-Yates */
        uint32_t j = (uint32_t)(rng_unif(&prng) * i);
        uint32_t t = S->perm[i - 1]; S->perm[i - 1] = S->perm[j]; S->perm[j] = t;
    }
    make_basis(S, RNG_UP_V, l, noise);
    lowrank_spec us = {.k = S->k, .V = S->V, .rank = p->rank, .noise_sd = (float)sqrt(noise / d)};
    gen_tensor(S, type, nf, d, row_lowrank, &us, RNG_UP, l);
    fwd_mm(f, type, S->buf, nf, d, f->xn, f->u);
    if ((st = write_buf(S, S->buf, stride_d * nf, err))) return st;
    /* the up bias (in the free tensor buffer, written from there): b_i = s_i Phi^-1(p_i) - m_i */
    float *b = (float *)S->buf;
    for (uint32_t i = 0; i < nf; i++) {
        double m = 0, v = 0;
        for (uint32_t t = 0; t < T; t++) m += f->u[(size_t)t * nf + i];
        m /= T;
        for (uint32_t t = 0; t < T; t++) {
            double e = f->u[(size_t)t * nf + i] - m;
            v += e * e;
        }
        double sd = sqrt(v / (T > 1 ? T - 1 : 1));
        b[i] = (float)(sd * norm_ppf(S->freq[S->perm[i]]) - m);
        for (uint32_t t = 0; t < T; t++) f->u[(size_t)t * nf + i] += b[i];
    }
    if ((st = write_buf(S, b, (uint64_t)nf * 4, err))) return st;
    flm_pass_ffn_act(f->P.k, &f->hp, (size_t)T * nf, f->g, f->u); /* g = relu(up . x + b) */
    if ((st = check_finite(f->g, (size_t)T * nf, "FFN activation", l, err))) return st;
    double eh = mean_energy(f->g, T, nf, 0);
    normal_spec ds = {.sd = (float)sqrt(eta * e0 / (d * (eh > 1e-30 ? eh : 1e-30)))};
    gen_tensor(S, type, d, nf, row_normal, &ds, RNG_DOWN, l);
    fwd_mm(f, type, S->buf, d, nf, f->g, f->o);
    flm_pass_residual(&f->P, f->x, f->o, d, &f->L.post_ffn_norm);
    if ((st = write_buf(S, S->buf, stride_f * d, err)) || (st = write_const(S, d, 0.0f, err))) return st;
    return check_finite(f->x, (size_t)T * d, "FFN output", l, err);
}

static void synth_free(synth *S) {
    wait_write(S, NULL);
    flm_gguf_writer_free(S->w);
    free(S->buf);
    free(S->spare);
    free(S->vec2);
    if (S->rowbuf)
        for (int i = 0; i < S->nt; i++) free(S->rowbuf[i]);
    free(S->rowbuf);
    free(S->q_sd); free(S->q_c0); free(S->k_sd); free(S->k_c0);
    free(S->vec); free(S->V); free(S->freq); free(S->ppf); free(S->perm); free(S->mvec); free(S->tokens);
    fwd_free(&S->f);
}

flm_status flm_synth_write(const char *path, const flm_synth_params *p, unsigned out_flags, flm_progress_fn progress,
                           void *user, flm_error *err) {
    flm_status st = flm_synth_check(p, err);
    if (st) return st;
    if (!path || !*path) return flm_fail(err, FLM_ERR_ARG, "synth: no output path");
    synth S = {.p = p, .k = flm_kernels_best(), .nt = p->n_threads, .progress = progress, .user = user};
    S.total = flm_synth_tensor_bytes(p);
    const uint32_t d = p->d_model, nf = p->d_ffn, T = p->calib_tokens;
    uint64_t max_tensor = mat_bytes(p->type, p->n_vocab, d);
    uint64_t ffn_tensor = mat_bytes(p->type, nf, d);
    if (ffn_tensor > max_tensor) max_tensor = ffn_tensor;
    if (mat_bytes(p->type, d, d) > max_tensor) max_tensor = mat_bytes(p->type, d, d);
    if (p->arch == FLM_SYNTH_ARCH_OPT && mat_bytes(p->type, p->n_ctx, d) > max_tensor)
        max_tensor = mat_bytes(p->type, p->n_ctx, d); /* position_embd */
    if ((uint64_t)p->d_ffn * 4 > max_tensor) max_tensor = (uint64_t)p->d_ffn * 4; /* OPT's up bias */
    size_t rowlen = d > nf ? d : nf;
    vocab v = {0};
    flm_hparams hp = {.d_model = d, .d_embd = d, .d_ffn = nf, .n_layers = p->n_layers, .n_heads = p->n_heads,
                      .n_kv_heads = p->n_kv_heads, .head_dim = d / p->n_heads, .n_vocab = p->n_vocab,
                      .n_ctx_train = p->n_ctx, .rope_dim = d / p->n_heads, .norm_eps = p->norm_eps,
                      .rope_theta = p->rope_theta, .rope_theta_local = p->rope_theta, .act = p->act,
                      .gated = true, .arch = flm_arch_find("llama"),
                      .attn_scale = 1.0f / sqrtf((float)(d / p->n_heads))};
    const bool opt = p->arch == FLM_SYNTH_ARCH_OPT;
    if (opt) { /* the calibration runs OPT's blocks: LayerNorm, no RoPE, ungated ReLU */
        hp.arch = flm_arch_find("opt");
        hp.gated = false;
    }
    if (max_tensor > SIZE_MAX / 2 || !(S.buf = malloc((size_t)max_tensor)) ||
        !(S.spare = malloc((size_t)max_tensor)) || !(S.vec2 = malloc(d * sizeof(float))) ||
        !(S.rowbuf = calloc((size_t)S.nt, sizeof *S.rowbuf)) || !(S.vec = malloc(d * sizeof(float))) ||
        !(S.V = calloc((size_t)(p->rank ? p->rank : 1) * d, sizeof(float))) ||
        !(S.freq = malloc(nf * sizeof(double))) || !(S.ppf = malloc(nf * sizeof(double))) ||
        !(S.perm = malloc(nf * sizeof(uint32_t))) || !(S.mvec = calloc(d, sizeof(float))) ||
        !(S.q_sd = malloc(d * sizeof(float))) || !(S.q_c0 = malloc(d * sizeof(float))) ||
        !(S.k_sd = malloc(d * sizeof(float))) || !(S.k_c0 = malloc(d * sizeof(float))) ||
        !(S.tokens = malloc(T * sizeof(int32_t)))) {
        synth_free(&S);
        return flm_fail(err, FLM_ERR_NOMEM, "synth: out of memory (the largest tensor is %llu bytes)",
                        (unsigned long long)max_tensor);
    }
    for (int i = 0; i < S.nt; i++)
        if (!(S.rowbuf[i] = malloc(rowlen * sizeof(float)))) {
            synth_free(&S);
            return flm_fail(err, FLM_ERR_NOMEM, "synth: out of memory");
        }
    if ((st = fwd_init(&S.f, &hp, T, S.nt, err))) { synth_free(&S); return st; }
    if (!vocab_build(&v, p->n_vocab)) {
        synth_free(&S);
        return flm_fail(err, FLM_ERR_NOMEM, "synth: out of memory for the vocabulary");
    }
    flm_synth_frequencies(p->active, p->tail, nf, S.freq);
    /* calibration tokens: BOS, then random non-special ids */
    uint64_t crng = rng_stream(p->seed, RNG_CALIB, 0, 0);
    S.tokens[0] = 1;
    for (uint32_t t = 1; t < T; t++) S.tokens[t] = 3 + (int32_t)(rng_unif(&crng) * (p->n_vocab - 3));

    if ((st = flm_gguf_writer_create(path, out_flags, &S.w, err))) { vocab_free(&v); synth_free(&S); return st; }
    add_kvs(&S, &v);
    add_tensors(&S);
    st = flm_gguf_writer_begin(S.w, err);
    vocab_free(&v);
    if (st) { synth_free(&S); return st; }
    if (S.progress) S.progress(S.user, "synth", 0, S.total);

    /* token embeddings: N(0, 1/d) with the bias channel B on dimension 0 (llama; OPT has real biases) */
    const double sd_w = 1.0 / sqrt((double)d);
    normal_spec es = {.sd = (float)sd_w, .set_col0 = !opt, .col0 = SYNTH_BIAS_SD * (float)sd_w};
    gen_tensor(&S, p->type, p->n_vocab, d, row_normal, &es, RNG_EMBD, 0);
    fwd_embed(&S.f, p->type, S.buf, S.tokens);
    if ((st = write_buf(&S, S.buf, mat_bytes(p->type, p->n_vocab, d), err))) { synth_free(&S); return st; }
    if (opt) { /* learned positions N(0, 1/(4d)), added to the calibration tokens at positions 0..T-1 */
        normal_spec ps = {.sd = (float)(0.5 * sd_w)};
        gen_tensor(&S, p->type, p->n_ctx, d, row_normal, &ps, RNG_POS, 0);
        float *row = S.f.o;
        for (uint32_t t = 0; t < T; t++) {
            S.f.P.k->dequant[p->type](S.buf + (size_t)t * flm_row_bytes(p->type, d), row, d);
            for (uint32_t j = 0; j < d; j++) S.f.x[(size_t)t * d + j] += row[j];
        }
        if ((st = write_buf(&S, S.buf, mat_bytes(p->type, p->n_ctx, d), err))) { synth_free(&S); return st; }
    }
    double e0 = mean_energy(S.f.x, T, d, opt ? 0 : 1);
    for (uint32_t l = 0; l < p->n_layers; l++)
        if ((st = (opt ? synth_layer_opt : synth_layer)(&S, l, e0, err))) { synth_free(&S); return st; }
    /* output: the norm ignores the bias channel (OPT: LayerNorm weight 1, bias 0); classifier N(0, 1/d) */
    normal_spec out = {.sd = (float)sd_w};
    if ((st = opt ? write_const(&S, d, 1.0f, err) : write_norm(&S, 0.0f, err)) ||
        (opt && (st = write_const(&S, d, 0.0f, err)))) {
        synth_free(&S);
        return st;
    }
    gen_tensor(&S, p->type, p->n_vocab, d, row_normal, &out, RNG_OUTPUT, 0);
    if ((st = write_buf(&S, S.buf, mat_bytes(p->type, p->n_vocab, d), err)) || (st = wait_write(&S, err)) ||
        (st = flm_gguf_writer_finish(S.w, err))) {
        synth_free(&S);
        return st;
    }
    if (S.progress) S.progress(S.user, "synth", S.total, S.total);
    synth_free(&S);
    return FLM_OK;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Measurement
 * ------------------------------------------------------------------------------------------------------------- */
void flm_synth_activity_free(flm_synth_activity *a) {
    if (!a) return;
    free(a->counts); free(a->layer_active); free(a->layer_hot_share); free(a->layer_rare); free(a->layer_reuse);
    free(a->layer_token_sd); free(a->layer_token_max);
    memset(a, 0, sizeof *a);
}

static int cmp_u32_desc(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Per-layer summaries from the counts. */
static flm_status summarize(flm_synth_activity *a) {
    uint32_t nf = a->d_ffn, T = a->n_tokens;
    uint32_t *sorted = malloc(nf * sizeof *sorted);
    if (!sorted) return FLM_ERR_NOMEM;
    uint32_t hot = nf / 10 ? nf / 10 : 1;
    for (uint32_t l = 0; l < a->n_layers; l++) {
        const uint32_t *c = a->counts + (size_t)l * nf;
        memcpy(sorted, c, nf * sizeof *sorted);
        qsort(sorted, nf, sizeof *sorted, cmp_u32_desc);
        uint64_t total = 0, top = 0, rare = 0;
        for (uint32_t i = 0; i < nf; i++) {
            total += sorted[i];
            if (i < hot) top += sorted[i];
            if ((double)sorted[i] <= 0.01 * T) rare++;
        }
        a->layer_active[l] = (double)total / ((double)nf * T);
        a->layer_hot_share[l] = total ? (double)top / (double)total : 0.0;
        a->layer_rare[l] = (double)rare / nf;
        a->mean_active += a->layer_active[l] / a->n_layers;
        a->mean_hot_share += a->layer_hot_share[l] / a->n_layers;
        a->mean_rare += a->layer_rare[l] / a->n_layers;
        a->mean_reuse += a->layer_reuse[l] / a->n_layers;
    }
    free(sorted);
    return FLM_OK;
}

/* What the FFN tap records while the engine runs the measurement tokens: per layer, the gate pre-activations of each
 * token's FFN input, counted in token order (the tap sees a layer's tokens in order, batch after batch). */
typedef struct measure {
    const flm_ctx *ctx;
    flm_synth_activity *a;
    int n_threads;
    float *g;            /* [d_ffn] gate . x of the token being counted */
    uint32_t *t;         /* [n_layers] tokens counted so far */
    int32_t *last;       /* [n_layers * d_ffn] the last token each neuron fired on */
    uint64_t *act_later; /* [n_layers] activations at tokens >= FLM_SYNTH_WINDOW */
    uint64_t *reused;    /* [n_layers] of which the neuron also fired in the previous FLM_SYNTH_WINDOW tokens */
    double *s1, *s2;     /* [n_layers] sums of the tokens' active fractions and their squares */
} measure;

static void measure_tap(void *user, uint32_t l, const float *x) {
    measure *M = user;
    flm_synth_activity *a = M->a;
    const flm_model *m = flm_ctx_model(M->ctx);
    const flm_hparams *hp = &m->hp;
    const flm_layer_weights *L = &m->layers[l];
    const flm_weight *W = hp->gated ? &L->ffn_gate : &L->ffn_up; /* ungated: up . x + b_up */
    const uint32_t nf = a->d_ffn;
    flm_matvec(flm_ctx_kernels(M->ctx), W->type, W->data, nf, hp->d_model, x, M->g, M->n_threads);
    if (!hp->gated && L->ffn_up_b.data)
        for (uint32_t i = 0; i < nf; i++) M->g[i] += ((const float *)L->ffn_up_b.data)[i];
    uint32_t *c = a->counts + (size_t)l * nf;
    int32_t *last = M->last + (size_t)l * nf;
    const int32_t t = (int32_t)M->t[l]++;
    uint32_t n_act = 0;
    for (uint32_t i = 0; i < nf; i++) {
        if (!isfinite(M->g[i])) a->finite = false;
        if (!(M->g[i] > 0.0f)) continue;
        c[i]++;
        n_act++;
        if (t >= FLM_SYNTH_WINDOW) {
            M->act_later[l]++;
            M->reused[l] += t - last[i] <= FLM_SYNTH_WINDOW;
        }
        last[i] = t;
    }
    double fr = (double)n_act / nf;
    M->s1[l] += fr;
    M->s2[l] += fr * fr;
    if (fr > a->layer_token_max[l]) a->layer_token_max[l] = fr;
}

static void measure_free(measure *M) {
    free(M->g); free(M->t); free(M->last); free(M->act_later); free(M->reused); free(M->s1); free(M->s2);
}

flm_status flm_synth_measure(const char *path, uint32_t n_tokens, uint64_t seed, int n_threads, bool check_engine,
                             flm_synth_activity *out, flm_error *err) {
    memset(out, 0, sizeof *out);
    if (n_tokens < 1 || n_tokens > 4096)
        return flm_fail(err, FLM_ERR_ARG, "synth measure: %u tokens is out of range (1..4096)", n_tokens);
    if (n_threads < 1) n_threads = 1;
    flm_params prm;
    flm_params_default(&prm);
    prm.kv_f32 = true; /* keys, values and attention weights in f32 */
    prm.n_threads = n_threads;
    prm.n_ctx = (int)n_tokens;
    prm.mode = FLM_MODE_RAM;
    flm_ctx *ctx = NULL;
    flm_status st = flm_open(path, &prm, &ctx, err);
    if (st) return st;
    const flm_hparams *hp = &flm_ctx_model(ctx)->hp;
    const uint32_t T = n_tokens, nf = hp->d_ffn, L = hp->n_layers, V = hp->n_vocab;
    if (!flm_ctx_model(ctx)->layers[0].ffn_up.data) {
        flm_close(ctx);
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "synth measure: %s: the FFN weights are not in memory", path);
    }
    int32_t *tokens = malloc(T * sizeof *tokens);
    float *logits = check_engine ? malloc((size_t)T * V * sizeof(float)) : NULL;
    measure M = {.ctx = ctx, .a = out, .n_threads = n_threads, .g = malloc(nf * sizeof(float)),
                 .t = calloc(L, sizeof(uint32_t)), .last = malloc((size_t)L * nf * sizeof(int32_t)),
                 .act_later = calloc(L, sizeof(uint64_t)), .reused = calloc(L, sizeof(uint64_t)),
                 .s1 = calloc(L, sizeof(double)), .s2 = calloc(L, sizeof(double))};
    flm_synth_activity *a = out;
    a->n_layers = L;
    a->d_ffn = nf;
    a->n_tokens = T;
    a->max_logit_diff = -1;
    a->finite = true;
    a->counts = calloc((size_t)L * nf, sizeof *a->counts);
    a->layer_active = calloc(L, sizeof(double));
    a->layer_hot_share = calloc(L, sizeof(double));
    a->layer_rare = calloc(L, sizeof(double));
    a->layer_reuse = calloc(L, sizeof(double));
    a->layer_token_sd = calloc(L, sizeof(double));
    a->layer_token_max = calloc(L, sizeof(double));
    if (!tokens || (check_engine && !logits) || !M.g || !M.t || !M.last || !M.act_later || !M.reused || !M.s1 ||
        !M.s2 || !a->counts || !a->layer_active || !a->layer_hot_share || !a->layer_rare || !a->layer_reuse ||
        !a->layer_token_sd || !a->layer_token_max) {
        st = flm_fail(err, FLM_ERR_NOMEM, "synth measure: out of memory");
        goto done;
    }
    for (size_t i = 0; i < (size_t)L * nf; i++) M.last[i] = INT32_MIN / 2;
    int32_t bos = flm_tokenizer_bos(flm_ctx_model(ctx)->tok);
    uint64_t rng = rng_stream(seed, RNG_MEASURE, 0, 0);
    for (uint32_t t = 0; t < T; t++) {
        int32_t lo = V > SYNTH_N_SPECIAL ? 3 : 0;
        tokens[t] = lo + (int32_t)(rng_unif(&rng) * (V - (uint32_t)lo));
    }
    if (bos >= 0) tokens[0] = bos;
    /* the engine's forward pass over the tokens (batched), the tap counting each layer's active neurons */
    const flm_ffn_hooks hooks = {.tap = measure_tap, .tap_user = &M};
    st = flm_eval_hooked(ctx, tokens, T, 0, &hooks, logits, NULL, err);
    if (st) goto done;
    for (uint32_t l = 0; l < L; l++) {
        a->layer_reuse[l] = M.act_later[l] ? (double)M.reused[l] / (double)M.act_later[l] : 0.0;
        a->layer_token_sd[l] = T > 1 ? sqrt(fmax(0.0, (M.s2[l] - M.s1[l] * M.s1[l] / T) / (T - 1))) : 0.0;
    }
    if (check_engine) { /* the batched pass against flm_eval token by token */
        double worst = 0;
        for (uint32_t t = 0; t < T && st == FLM_OK; t++) {
            const float *lg = NULL;
            if ((st = flm_eval(ctx, tokens[t], (int32_t)t, &lg, err))) break;
            double mx = 1, md = 0;
            for (uint32_t i = 0; i < V; i++) {
                if (!isfinite(lg[i]) || !isfinite(logits[(size_t)t * V + i])) a->finite = false;
                double av = fabs(lg[i]), dd = fabs((double)lg[i] - logits[(size_t)t * V + i]);
                if (av > mx) mx = av;
                if (dd > md || dd != dd) md = dd;
            }
            if (md / mx > worst || md != md) worst = md / mx;
        }
        if (st) goto done;
        a->max_logit_diff = worst;
    }
    if (summarize(a) != FLM_OK) st = flm_fail(err, FLM_ERR_NOMEM, "synth measure: out of memory");
done:
    flm_close(ctx);
    measure_free(&M);
    free(tokens);
    free(logits);
    if (st) flm_synth_activity_free(out);
    return st;
}
