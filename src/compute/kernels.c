/* kernels.c — L_compute: scalar reference kernels, type conversions, quantizers, matvec, rmsnorm, softmax, and the
 * run-time choice of kernel table. See kernels.h. */
#include "compute/kernels.h"
#include "compute/work.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#ifdef _OPENMP
#endif
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "compute/attn_tile.h"
#include "compute/kernels_impl.h"
#include "compute/pool.h"
#include "compute/quants.h"
#include "core/types.h"
#include "core/util.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Conversions
 * ------------------------------------------------------------------------------------------------------------- */
static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float flm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in float */
        float v = (float)mant * 0x1p-24f;
        return bits_f32(sign | f32_bits(v));
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf, nan (payload kept) */
    return bits_f32(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

uint16_t flm_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { /* inf, or nan: quiet it and keep the top payload bits (as vcvtps2ph does) */
        if (ax == 0x7f800000u) return sign | 0x7c00;
        return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    }
    if (ax >= 0x47800000u) return sign | 0x7c00; /* >= 65536: overflow to inf */
    if (ax < 0x38800000u) {                      /* below 2^-14: a half subnormal (or zero) */
        if (ax < 0x33000000u) return sign;       /* <= 2^-25 rounds to zero (2^-25 is a tie, even is 0) */
        uint32_t e = ax >> 23;                   /* 102..112 */
        uint32_t m = (ax & 0x7fffff) | 0x800000; /* value = m * 2^(e-150) = (m >> (126-e)) units of 2^-24 */
        uint32_t shift = 126 - e;                /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++; /* may carry into the smallest normal: still right */
        return (uint16_t)(sign | q);
    }
    /* normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even (a carry may reach inf) */
    uint32_t h = (ax - ((uint32_t)(127 - 15) << 23)) >> 13;
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float flm_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t flm_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* nan: force quiet, stays nan */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);                  /* round to nearest even */
}

/* ---------------------------------------------------------------------------------------------------------------
 * Scalar reference kernels
 * ------------------------------------------------------------------------------------------------------------- */
static float dot_f32(const void *row, const float *x, size_t n) {
    const float *r = row;
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) sum += r[i] * x[i];
    return sum;
}

static float dot_f16(const void *row, const float *x, size_t n) {
    const uint16_t *r = row;
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) sum += flm_f16_to_f32(r[i]) * x[i];
    return sum;
}

static float dot_bf16(const void *row, const float *x, size_t n) {
    const uint16_t *r = row;
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) sum += flm_bf16_to_f32(r[i]) * x[i];
    return sum;
}

/* Q8_0: sum over blocks of d * sum_j q[j]*x[j]. */
static float dot_q8_0(const void *row, const float *x, size_t n) {
    const flm_block_q8_0 *b = row;
    float sum = 0.0f;
    for (size_t i = 0; i < n / FLM_QK; i++, x += FLM_QK) {
        float s = 0.0f;
        for (int j = 0; j < FLM_QK; j++) s += (float)b[i].qs[j] * x[j];
        sum += flm_f16_to_f32(b[i].d) * s;
    }
    return sum;
}

/* Q4_0: byte j holds element j (low nibble) and element j+16 (high nibble); value = d * (q - 8). */
static float dot_q4_0(const void *row, const float *x, size_t n) {
    const flm_block_q4_0 *b = row;
    float sum = 0.0f;
    for (size_t i = 0; i < n / FLM_QK; i++, x += FLM_QK) {
        float s = 0.0f;
        for (int j = 0; j < FLM_QK / 2; j++) {
            s += (float)((b[i].qs[j] & 0x0f) - 8) * x[j];
            s += (float)((b[i].qs[j] >> 4) - 8) * x[j + FLM_QK / 2];
        }
        sum += flm_f16_to_f32(b[i].d) * s;
    }
    return sum;
}

static void axpy_f32(const void *row, float a, float *y, size_t n) {
    const float *r = row;
    for (size_t i = 0; i < n; i++) y[i] += a * r[i];
}

static void axpy_f16(const void *row, float a, float *y, size_t n) {
    const uint16_t *r = row;
    for (size_t i = 0; i < n; i++) y[i] += a * flm_f16_to_f32(r[i]);
}

static void axpy_bf16(const void *row, float a, float *y, size_t n) {
    const uint16_t *r = row;
    for (size_t i = 0; i < n; i++) y[i] += a * flm_bf16_to_f32(r[i]);
}

static void axpy_q8_0(const void *row, float a, float *y, size_t n) {
    const flm_block_q8_0 *b = row;
    for (size_t i = 0; i < n / FLM_QK; i++, y += FLM_QK) {
        float ad = a * flm_f16_to_f32(b[i].d);
        for (int j = 0; j < FLM_QK; j++) y[j] += ad * (float)b[i].qs[j];
    }
}

static void axpy_q4_0(const void *row, float a, float *y, size_t n) {
    const flm_block_q4_0 *b = row;
    for (size_t i = 0; i < n / FLM_QK; i++, y += FLM_QK) {
        float ad = a * flm_f16_to_f32(b[i].d);
        for (int j = 0; j < FLM_QK / 2; j++) {
            y[j] += ad * (float)((b[i].qs[j] & 0x0f) - 8);
            y[j + FLM_QK / 2] += ad * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}

static void dequant_f32(const void *row, float *y, size_t n) { memcpy(y, row, n * sizeof(float)); }

static void dequant_f16(const void *row, float *y, size_t n) {
    const uint16_t *r = row;
    for (size_t i = 0; i < n; i++) y[i] = flm_f16_to_f32(r[i]);
}

static void dequant_bf16(const void *row, float *y, size_t n) {
    const uint16_t *r = row;
    for (size_t i = 0; i < n; i++) y[i] = flm_bf16_to_f32(r[i]);
}

static void dequant_q8_0(const void *row, float *y, size_t n) {
    const flm_block_q8_0 *b = row;
    for (size_t i = 0; i < n / FLM_QK; i++, y += FLM_QK) {
        float d = flm_f16_to_f32(b[i].d);
        for (int j = 0; j < FLM_QK; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

static void dequant_q4_0(const void *row, float *y, size_t n) {
    const flm_block_q4_0 *b = row;
    for (size_t i = 0; i < n / FLM_QK; i++, y += FLM_QK) {
        float d = flm_f16_to_f32(b[i].d);
        for (int j = 0; j < FLM_QK / 2; j++) {
            y[j] = (float)((b[i].qs[j] & 0x0f) - 8) * d;
            y[j + FLM_QK / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* The reference loops of flm_attn_scores_fn / flm_attn_values_fn (kernels.h): in order, product then sum. */
static void attn_scores_f16(const float *q, const uint16_t *K, size_t stride, size_t n, size_t d, float scale,
                            float *out) {
    for (size_t t = 0; t < n; t++) {
        const uint16_t *k = K + t * stride;
        float s = 0.0f;
        for (size_t i = 0; i < d; i++) s += q[i] * flm_f16_to_f32(k[i]);
        out[t] = s * scale;
    }
}

static void attn_values_f16(const float *w, const uint16_t *V, size_t stride, size_t n, size_t d, float *out) {
    memset(out, 0, d * sizeof *out);
    for (size_t t = 0; t < n; t++) {
        const uint16_t *v = V + t * stride;
        const float a = w[t];
        for (size_t i = 0; i < d; i++) out[i] += a * flm_f16_to_f32(v[i]);
    }
}

/* The reference of flm_act_fn: flm_act_eval, as the forward pass always ran it. */
static void act_f32(flm_act a, float *y, const float *x, const float *u, size_t n) {
    if (u)
        for (size_t i = 0; i < n; i++) y[i] = flm_act_eval(a, x[i]) * u[i];
    else
        for (size_t i = 0; i < n; i++) y[i] = flm_act_eval(a, x[i]);
}

static void round_f16(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = flm_f16_to_f32(flm_f32_to_f16(src[i]));
}

static void to_f16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = flm_f32_to_f16(src[i]);
}

/* the scalar table's softmax kernel (kernels.h flm_softmax_fn): the reference */
static void softmax_f32(float *x, size_t n) {
    if (n == 0) return;
    float max = x[0];
    for (size_t i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (size_t i = 0; i < n; i++) x[i] /= sum;
}

static flm_kernels scalar_kernels;
static pthread_once_t scalar_once = PTHREAD_ONCE_INIT;

static void scalar_init(void) {
    flm_kernels *k = &scalar_kernels;
    k->name = flm_kernel_level_name(FLM_KERNELS_SCALAR);
    k->dot[FLM_TYPE_F32] = dot_f32, k->dot[FLM_TYPE_F16] = dot_f16, k->dot[FLM_TYPE_BF16] = dot_bf16;
    k->dot[FLM_TYPE_Q8_0] = dot_q8_0, k->dot[FLM_TYPE_Q4_0] = dot_q4_0;
    k->axpy[FLM_TYPE_F32] = axpy_f32, k->axpy[FLM_TYPE_F16] = axpy_f16, k->axpy[FLM_TYPE_BF16] = axpy_bf16;
    k->axpy[FLM_TYPE_Q8_0] = axpy_q8_0, k->axpy[FLM_TYPE_Q4_0] = axpy_q4_0;
    k->dequant[FLM_TYPE_F32] = dequant_f32, k->dequant[FLM_TYPE_F16] = dequant_f16;
    k->dequant[FLM_TYPE_BF16] = dequant_bf16, k->dequant[FLM_TYPE_Q8_0] = dequant_q8_0;
    k->dequant[FLM_TYPE_Q4_0] = dequant_q4_0;
    flm_quants_fill_scalar(k); /* the other quantized types, and vec_dot of all */
    k->attn_scores_f16 = attn_scores_f16, k->attn_values_f16 = attn_values_f16;
    k->act = act_f32, k->round_f16 = round_f16, k->to_f16 = to_f16, k->softmax = softmax_f32;
    flm_attn_tile_fill_scalar(k); /* a batch's attention tiles (attn_tile.c) */
}

/* ---------------------------------------------------------------------------------------------------------------
 * Table selection
 * ------------------------------------------------------------------------------------------------------------- */
const flm_kernels *flm_kernels_scalar(void) {
    pthread_once(&scalar_once, scalar_init);
    return &scalar_kernels;
}

/* The levels (kernels.h flm_kernel_level): name and instruction set, in the enum's order; the names FLASHLM_KERNELS
 * takes and the CLI lists come from here. */
static const struct {
    const char *name, *isa;
} levels[FLM_KERNELS_N_LEVELS] = {
    [FLM_KERNELS_SCALAR] = {"scalar", "any"},   [FLM_KERNELS_AVX2] = {"avx2", "x86-64"},
    [FLM_KERNELS_AVXVNNI] = {"avxvnni", "x86-64"}, [FLM_KERNELS_AVX512] = {"avx512", "x86-64"},
    [FLM_KERNELS_VNNI] = {"vnni", "x86-64"},    [FLM_KERNELS_NEON] = {"neon", "aarch64"},
    [FLM_KERNELS_DOTPROD] = {"dotprod", "aarch64"},
};

const char *flm_kernel_level_name(flm_kernel_level level) {
    return (unsigned)level < FLM_KERNELS_N_LEVELS ? levels[level].name : NULL;
}

const char *flm_kernel_level_isa(flm_kernel_level level) {
    return (unsigned)level < FLM_KERNELS_N_LEVELS ? levels[level].isa : NULL;
}

int flm_kernel_level_parse(const char *name) {
    for (int l = 0; name && l < FLM_KERNELS_N_LEVELS; l++)
        if (strcmp(name, levels[l].name) == 0) return l;
    return -1;
}

static flm_kernel_level cpu_level_detect(void) {
#if defined(__x86_64__) && defined(FLM_HAVE_X86)
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && flm_cpu_has_f16c()))
        return FLM_KERNELS_SCALAR;
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl")))
        return flm_cpu_has_avxvnni() ? FLM_KERNELS_AVXVNNI : FLM_KERNELS_AVX2;
    if (!__builtin_cpu_supports("avx512vnni")) return FLM_KERNELS_AVX512;
    return FLM_KERNELS_VNNI;
#elif defined(__aarch64__) && defined(FLM_HAVE_ARM64)
    const flm_arm_caps c = flm_cpu_arm_caps();
    if (!c.neon) return FLM_KERNELS_SCALAR;
    return c.dotprod ? FLM_KERNELS_DOTPROD : FLM_KERNELS_NEON;
#else
    return FLM_KERNELS_SCALAR;
#endif
}

flm_kernel_level flm_kernels_cpu_level(void) {
    static _Atomic int cached = -1; /* racing first callers compute the same answer */
    int l = atomic_load_explicit(&cached, memory_order_relaxed);
    if (l < 0) {
        l = (int)cpu_level_detect();
        atomic_store_explicit(&cached, l, memory_order_relaxed);
    }
    return (flm_kernel_level)l;
}

bool flm_kernels_has_level(flm_kernel_level level) {
    if ((unsigned)level >= FLM_KERNELS_N_LEVELS || level > flm_kernels_cpu_level()) return false;
    if (level == FLM_KERNELS_SCALAR) return true;
    /* the CPU's best level is of this build's instruction set (or scalar); a level of another is never had */
    if (strcmp(levels[level].isa, levels[flm_kernels_cpu_level()].isa) != 0) return false;
#if defined(__x86_64__) && defined(FLM_HAVE_X86)
    if (level == FLM_KERNELS_AVXVNNI) return flm_cpu_has_avxvnni(); /* a side branch */
#endif
    return true;
}

flm_kernel_level flm_kernels_level_capped(flm_kernel_level want) {
    int l = (unsigned)want < FLM_KERNELS_N_LEVELS ? (int)want : FLM_KERNELS_N_LEVELS - 1;
    while (l > 0 && !flm_kernels_has_level((flm_kernel_level)l)) l--;
    return (flm_kernel_level)l;
}

#if defined(__x86_64__) && defined(FLM_HAVE_X86)
/* avxvnni = the avx2 table + quants_avxvnni.c; avx512 = the avx2 table + quants_avx512.c; vnni = the avx512 table
 * + quants_vnni.c (each level falls back to its base for whatever it does not override). Built only once the CPU is
 * known to have the level. */
static flm_kernels avxvnni_kernels, avx512_kernels, vnni_kernels;
static pthread_once_t avxvnni_once = PTHREAD_ONCE_INIT, avx512_once = PTHREAD_ONCE_INIT,
                      vnni_once = PTHREAD_ONCE_INIT;

static void avxvnni_init(void) {
    avxvnni_kernels = *flm_kernels_avx2_table();
    avxvnni_kernels.name = flm_kernel_level_name(FLM_KERNELS_AVXVNNI);
    flm_quants_fill_avxvnni(&avxvnni_kernels);
}

static void avx512_init(void) {
    avx512_kernels = *flm_kernels_avx2_table();
    avx512_kernels.name = flm_kernel_level_name(FLM_KERNELS_AVX512);
    flm_quants_fill_avx512(&avx512_kernels);
    flm_attn_tile_fill_avx512(&avx512_kernels); /* a batch's attention tiles (attn_tile_avx512.c) */
}

static void vnni_init(void) {
    pthread_once(&avx512_once, avx512_init);
    vnni_kernels = avx512_kernels;
    vnni_kernels.name = flm_kernel_level_name(FLM_KERNELS_VNNI);
    flm_quants_fill_vnni(&vnni_kernels);
}
#endif

#if defined(__aarch64__) && defined(FLM_HAVE_ARM64)
/* dotprod = the neon table + quants_dotprod.c (SDOT), built once the CPU is known to have it. */
static flm_kernels dotprod_kernels;
static pthread_once_t dotprod_once = PTHREAD_ONCE_INIT;

static void dotprod_init(void) {
    dotprod_kernels = *flm_kernels_neon_table();
    dotprod_kernels.name = "dotprod";
    flm_quants_fill_dotprod(&dotprod_kernels);
}
#endif

const flm_kernels *flm_kernels_for_level(flm_kernel_level level) {
    if (!flm_kernels_has_level(level)) return NULL;
    switch (level) {
    case FLM_KERNELS_SCALAR: return flm_kernels_scalar();
#if defined(__x86_64__) && defined(FLM_HAVE_X86)
    case FLM_KERNELS_AVX2: return flm_kernels_avx2_table();
    case FLM_KERNELS_AVXVNNI: pthread_once(&avxvnni_once, avxvnni_init); return &avxvnni_kernels;
    case FLM_KERNELS_AVX512: pthread_once(&avx512_once, avx512_init); return &avx512_kernels;
    case FLM_KERNELS_VNNI: pthread_once(&vnni_once, vnni_init); return &vnni_kernels;
#endif
#if defined(__aarch64__) && defined(FLM_HAVE_ARM64)
    case FLM_KERNELS_NEON: return flm_kernels_neon_table();
    case FLM_KERNELS_DOTPROD: pthread_once(&dotprod_once, dotprod_init); return &dotprod_kernels;
#endif
    default: return NULL;
    }
}

const flm_kernels *flm_kernels_avx2(void) { return flm_kernels_for_level(FLM_KERNELS_AVX2); }

const flm_kernels *flm_kernels_best(void) {
    /* Racing first callers all compute the same answer, so a relaxed atomic publish is enough. */
    static const flm_kernels *_Atomic cached = NULL;
    const flm_kernels *k = atomic_load_explicit(&cached, memory_order_relaxed);
    if (k) return k;
    const char *env = getenv("FLASHLM_KERNELS");
    if (!env) env = getenv("FLM_KERNELS"); /* the older name */
    const int want = flm_kernel_level_parse(env);
    k = flm_kernels_for_level(flm_kernels_level_capped(want >= 0 ? (flm_kernel_level)want : FLM_KERNELS_N_LEVELS));
    atomic_store_explicit(&cached, k, memory_order_relaxed);
    return k;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Quantizers
 * ------------------------------------------------------------------------------------------------------------- */
bool flm_quantize_row(uint32_t t, const float *x, void *dst, size_t n) {
    const flm_type_traits *tt = flm_type_traits_of(t);
    if (!tt || !tt->has_quantizer || n % tt->block_elems) return false;
    const size_t nb = n / tt->block_elems;
    switch (t) {
    case FLM_TYPE_F32: memcpy(dst, x, n * sizeof(float)); break;
    case FLM_TYPE_F16: for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = flm_f32_to_f16(x[i]); break;
    case FLM_TYPE_BF16: for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = flm_f32_to_bf16(x[i]); break;
    case FLM_TYPE_Q4_0: flm_quantize_q4_0(x, dst, nb); break;
    case FLM_TYPE_Q4_1: flm_quantize_q4_1(x, dst, nb); break;
    case FLM_TYPE_Q5_0: flm_quantize_q5_0(x, dst, nb); break;
    case FLM_TYPE_Q5_1: flm_quantize_q5_1(x, dst, nb); break;
    case FLM_TYPE_Q8_0: flm_quantize_q8_0(x, dst, nb); break;
    case FLM_TYPE_Q8_1: flm_quantize_q8_1(x, dst, nb); break;
    case FLM_TYPE_Q8_K: flm_quantize_q8_k(x, dst, nb); break;
    default: return false; /* has_quantizer without a case: the table and this switch disagree */
    }
    return true;
}

size_t flm_act_bytes(uint32_t t, size_t n) {
    const flm_type_traits *tt = flm_type_traits_of(t);
    if (!tt || !tt->is_tensor || n % tt->block_elems) return 0;
    /* q8_0 / q8_1 blocks, then per block d as float32, and q8_0's sum(qs) as int32 / q8_1's s as float32
     * (quants.h FLM_ACT_TAIL) */
    const size_t rb = flm_row_bytes(tt->vec_dot_type, n);
    if (tt->vec_dot_type == FLM_TYPE_Q8_0) return rb + n / 32 * 2 * sizeof(float);
    if (tt->vec_dot_type == FLM_TYPE_Q8_1) return rb + n / 32 * 2 * sizeof(float);
    return rb;
}

void flm_act_quantize(uint32_t t, const float *x, size_t n, void *dst) {
    const flm_type_traits *tt = flm_type_traits_of(t);
    assert(tt && tt->is_tensor);
    if (tt->vec_dot_type == FLM_TYPE_F32) memcpy(dst, x, n * sizeof(float));
    else flm_kernels_best()->act_quantize[tt->vec_dot_type](x, dst, n);
}

float flm_vec_dot(const flm_kernels *k, uint32_t t, const void *row, const void *xq, size_t n) {
    return k->vec_dot[t](row, xq, n);
}

/* ---------------------------------------------------------------------------------------------------------------
 * matvec, rmsnorm, softmax
 * ------------------------------------------------------------------------------------------------------------- */
/* Below this many weights a matvec runs serially: handing out chunks to the pool costs a few microseconds. */
#define FLM_MATVEC_MIN_PARALLEL 32768

/* flm_matmat with a tile kernel: the weight rows of one block (they stay in L2 while the tokens pass over them). */
#define FLM_TILE_ROW_BYTES (192 * 1024)

/* x quantized for the dot: up to this many bytes on the stack, more on the heap. */
#define FLM_ACT_STACK_BYTES 16384

/* Rows per chunk when a matrix-vector product is split over n_threads: about 8 chunks per thread, each at least
 * FLM_MATVEC_MIN_CHUNK bytes of weights. The threads take chunks one at a time (dynamic), so a thread that loses
 * its core to another process leaves its unstarted chunks to the others instead of holding up the whole product. */
#define FLM_MATVEC_CHUNKS_PER_THREAD 8
#define FLM_MATVEC_MIN_CHUNK (16 * 1024)
static size_t chunk_rows(size_t rows, size_t row_bytes, int n_threads) {
    size_t c = (rows + FLM_MATVEC_CHUNKS_PER_THREAD * (size_t)n_threads - 1) /
               (FLM_MATVEC_CHUNKS_PER_THREAD * (size_t)n_threads);
    const size_t min_rows = (FLM_MATVEC_MIN_CHUNK + row_bytes - 1) / (row_bytes ? row_bytes : 1);
    if (c < min_rows) c = min_rows;
    return c ? c : 1;
}

/* rows r of W against xq through fn (a flm_vec_dot_fn, or a flm_dot_fn when xq is the float x), in chunks of c */
typedef struct rows_job {
    flm_vec_dot_fn fn;
    const uint8_t *w;
    size_t stride, rows, n, c;
    const void *xq;
    float *y;
} rows_job;

/* rows [r0, r1) of W against xq, each row's bytes asked for FLM_PREFETCH_BYTES ahead of its dot (flm_prefetch) */
static void rows_range(flm_vec_dot_fn fn, const uint8_t *w, size_t stride, size_t r0, size_t r1, size_t n,
                       const void *xq, float *y) {
    const size_t limit = r1 * stride;
    flm_prefetch(w, r0 * stride, limit, FLM_PREFETCH_BYTES);
    for (size_t r = r0; r < r1; r++) {
        flm_prefetch(w, r * stride + FLM_PREFETCH_BYTES, limit, stride);
        y[r] = fn(w + r * stride, xq, n);
    }
}

static void rows_chunk(void *arg, size_t b) {
    const rows_job *J = arg;
    const size_t r1 = (b + 1) * J->c < J->rows ? (b + 1) * J->c : J->rows;
    rows_range(J->fn, J->w, J->stride, b * J->c, r1, J->n, J->xq, J->y);
}

static void matvec_rows(flm_vec_dot_fn fn, const uint8_t *w, size_t stride, size_t rows, size_t n, const void *xq,
                        float *y, int n_threads) {
    if (n_threads <= 1 || rows < 2 * (size_t)n_threads || rows * n < FLM_MATVEC_MIN_PARALLEL) {
        rows_range(fn, w, stride, 0, rows, n, xq, y);
        return;
    }
    rows_job J = {fn, w, stride, rows, n, chunk_rows(rows, stride, n_threads), xq, y};
    flm_pool_run(n_threads, (rows + J.c - 1) / J.c, rows_chunk, &J);
}

void flm_matvec(const flm_kernels *k, uint32_t t, const void *W, size_t rows, size_t n, const float *x, float *y,
                int n_threads) {
    flm_matvec_ws(k, t, W, rows, n, x, y, n_threads, NULL);
}

void flm_matvec_ws(const flm_kernels *k, uint32_t t, const void *W, size_t rows, size_t n, const float *x, float *y,
                   int n_threads, flm_arena *ws) {
    const flm_type_traits *tt = flm_type_traits_of(t);
    assert(tt && tt->is_tensor && t < FLM_N_TYPES && k->vec_dot[t]);
    const size_t stride = flm_row_bytes(t, n);
    if (tt->vec_dot_type == FLM_TYPE_F32) { /* float weights: x is used as it is */
        matvec_rows(k->vec_dot[t], W, stride, rows, n, x, y, n_threads);
        return;
    }
    const size_t ab = flm_act_bytes(t, n);
    _Alignas(64) uint8_t stack[FLM_ACT_STACK_BYTES];
    const uint64_t mark = flm_work_mark(ws);
    flm_work_buf wb = {NULL, NULL};
    if (ab > sizeof stack) wb = flm_work_get(ws, ab); /* the work area, else the heap (counted) */
    void *xq = ab <= sizeof stack ? stack : wb.p;
    if (!xq) { /* no memory for the quantized x: the float-x kernels need none */
        for (size_t r = 0; r < rows; r++) y[r] = k->dot[t]((const uint8_t *)W + r * stride, x, n);
        return;
    }
    flm_act_quantize(t, x, n, xq);
    matvec_rows(k->vec_dot[t], W, stride, rows, n, xq, y, n_threads);
    if (xq != stack) flm_work_put(ws, mark, &wb);
}

/* flm_matmat's chunks: a block of rb rows through the tile kernel, or c rows through vec_dot per token */
typedef struct tile_job {
    flm_vec_dot_tile_fn tile;
    const void *W;
    size_t stride, rows, rb;
    const uint8_t *xq;
    size_t ab, n_x, n;
    float *Y;
    size_t y_stride;
    uint8_t *tmp;            /* n_slots buffers of tmp_bytes (the tiles' tmp), or NULL */
    size_t tmp_bytes;
    _Atomic uint64_t free_slots; /* bit i: buffer i is free (a chunk takes one for its call, then gives it back) */
} tile_job;

static void tile_chunk(void *arg, size_t b) {
    tile_job *J = arg;
    const size_t r0 = b * J->rb, m = J->rows - r0 < J->rb ? J->rows - r0 : J->rb;
    /* at most as many chunks run at once as there are threads (= slots): a free slot is always found */
    uint64_t f = atomic_load_explicit(&J->free_slots, memory_order_acquire), bit = 0;
    while (f && !atomic_compare_exchange_weak_explicit(&J->free_slots, &f, f & (f - 1), memory_order_acq_rel,
                                                       memory_order_acquire)) {
    }
    if (f) bit = f & -f;
    void *tmp = bit ? J->tmp + (size_t)__builtin_ctzll(bit) * J->tmp_bytes : NULL;
    J->tile((const uint8_t *)J->W + r0 * J->stride, J->stride, m, J->xq, J->ab, J->n_x, J->n, J->Y + r0, J->y_stride,
            tmp);
    if (bit) atomic_fetch_or_explicit(&J->free_slots, bit, memory_order_release);
}

typedef struct mm_job {
    flm_vec_dot_fn fn;
    const void *W;
    size_t stride, rows;
    bool f32;
    const float *X;
    size_t x_stride;
    const uint8_t *xq;
    size_t ab, n_x, n;
    float *Y;
    size_t y_stride, c;
} mm_job;

static void mm_chunk(void *arg, size_t b) {
    const mm_job *J = arg;
    const size_t r1 = (b + 1) * J->c < J->rows ? (b + 1) * J->c : J->rows;
    for (size_t r = b * J->c; r < r1; r++) {
        const uint8_t *w = (const uint8_t *)J->W + r * J->stride;
        for (size_t t = 0; t < J->n_x; t++)
            J->Y[t * J->y_stride + r] =
                J->fn(w, J->f32 ? (const void *)(J->X + t * J->x_stride) : (const void *)(J->xq + t * J->ab), J->n);
    }
}

void flm_matmat(const flm_kernels *k, uint32_t t, const void *W, size_t rows, size_t n, const float *X,
                size_t x_stride, size_t n_x, float *Y, size_t y_stride, int n_threads, flm_arena *ws) {
    const flm_type_traits *tt = flm_type_traits_of(t);
    assert(tt && tt->is_tensor && t < FLM_N_TYPES && k->vec_dot[t]);
    if (n_x == 0) return;
    const size_t stride = flm_row_bytes(t, n);
    const bool f32 = tt->vec_dot_type == FLM_TYPE_F32;
    const size_t ab = f32 ? 0 : (flm_act_bytes(t, n) + 63) & ~(size_t)63;
    uint8_t *xq = NULL;
    const uint64_t mark = flm_work_mark(ws);
    flm_work_buf wb = {NULL, NULL};
    if (!f32 && (n_x == 1 || !(xq = (wb = flm_work_get(ws, ab * n_x)).p))) { /* one token, or no memory: matvec */
        for (size_t b = 0; b < n_x; b++) flm_matvec(k, t, W, rows, n, X + b * x_stride, Y + b * y_stride, n_threads);
        return;
    }
    for (size_t b = 0; b < n_x && xq; b++) flm_act_quantize(t, X + b * x_stride, n, xq + b * ab);
    const flm_vec_dot_fn fn = k->vec_dot[t];
    int nt = n_threads;
    if (nt <= 1 || rows < 2 * (size_t)nt || rows * n * n_x < FLM_MATVEC_MIN_PARALLEL) nt = 1;
    const flm_vec_dot_tile_fn tile = f32 ? NULL : k->vec_dot_tile[t];
    if (tile) {
        /* rows in blocks of about FLM_TILE_ROW_BYTES of weights (the block stays in L2 while the token groups of
         * the tile kernel pass over it), at least 4 blocks per thread, handed out one at a time: a thread that
         * loses its core to another process leaves its blocks to the others */
        size_t rb = FLM_TILE_ROW_BYTES / stride;
        const size_t per_thread = (rows + 4 * (size_t)nt - 1) / (4 * (size_t)nt);
        if (nt > 1 && rb > per_thread) rb = per_thread;
        if (rb < 4) rb = 4;
        rb = (rb + 15) & ~(size_t)15; /* whole panels of 16 rows (quants_panel_vnni.h) */
        /* one tmp per thread (at most 64) for the tiles that pack rows (flm_tile_tmp_bytes), from the work area */
        const size_t tb = flm_tile_tmp_bytes(n, n_x), slots = nt < 64 ? (size_t)nt : 64;
        flm_work_buf tw = {NULL, NULL};
        if (tb) tw = flm_work_get(ws, slots * tb);
        tile_job J = {tile, W, stride, rows, rb, xq, ab, n_x, n, Y, y_stride, tw.p, tb,
                      tw.p ? (slots == 64 ? ~UINT64_C(0) : (UINT64_C(1) << slots) - 1) : 0};
        flm_pool_run(nt, (rows + rb - 1) / rb, tile_chunk, &J);
        flm_work_put(ws, mark, &tw);
        flm_work_put(ws, mark, &wb);
        return;
    }
    mm_job J = {fn, W, stride, rows, f32, X, x_stride, xq, ab, n_x, n, Y, y_stride,
                nt > 1 ? chunk_rows(rows, stride, nt) : rows};
    flm_pool_run(nt, (rows + J.c - 1) / J.c, mm_chunk, &J);
    flm_work_put(ws, mark, &wb);
}

/* flm_matvec_multi's chunks: global rows [b * c, (b + 1) * c) of the jobs laid end to end */
typedef struct multi_job {
    const flm_matvec_job *jobs;
    size_t n_jobs;
    const void *const *x;
    const flm_vec_dot_fn *fn;
    const size_t *stride;
    size_t total, n, c;
} multi_job;

static void multi_chunk(void *arg, size_t b) {
    const multi_job *J = arg;
    size_t r0 = b * J->c, base = 0;
    const size_t r1 = r0 + J->c < J->total ? r0 + J->c : J->total;
    for (size_t j = 0; j < J->n_jobs && r0 < r1; base += J->jobs[j].rows, j++) {
        const size_t end = base + J->jobs[j].rows;
        if (r0 >= end) continue;
        const size_t e = end < r1 ? end : r1;
        rows_range(J->fn[j], J->jobs[j].W, J->stride[j], r0 - base, e - base, J->n, J->x[j], J->jobs[j].y);
        r0 = e;
    }
}

void flm_matvec_multi(const flm_kernels *k, const flm_matvec_job *jobs, size_t n_jobs, size_t n, const float *x,
                      int n_threads) {
    flm_matvec_multi_ws(k, jobs, n_jobs, n, x, n_threads, NULL);
}

void flm_matvec_multi_ws(const flm_kernels *k, const flm_matvec_job *jobs, size_t n_jobs, size_t n, const float *x,
                         int n_threads, flm_arena *ws) {
    /* x quantized once per distinct activation type (at most f32, q8_0, q8_1, q8_k) */
    enum { MAX_ACT = FLM_MATVEC_ACT_MAX };
    uint32_t act_type[MAX_ACT];
    const void *act[MAX_ACT];
    flm_work_buf heap[MAX_ACT] = {{0}}; /* past the stack: the work area, else the heap (counted) */
    const uint64_t mark = flm_work_mark(ws);
    _Alignas(64) uint8_t stack[FLM_ACT_STACK_BYTES];
    size_t n_act = 0, stack_used = 0, total = 0;
    const void *job_x[FLM_MATVEC_MAX_JOBS];
    flm_vec_dot_fn job_fn[FLM_MATVEC_MAX_JOBS];
    size_t job_stride[FLM_MATVEC_MAX_JOBS];
    assert(n_jobs <= FLM_MATVEC_MAX_JOBS);
    bool fallback = false; /* no memory for a quantized x: every job runs flm_matvec (which copes) */
    for (size_t j = 0; j < n_jobs && !fallback; j++) {
        const flm_type_traits *tt = flm_type_traits_of(jobs[j].type);
        assert(tt && tt->is_tensor && k->vec_dot[jobs[j].type]);
        const uint32_t vt = tt->vec_dot_type;
        size_t a = 0;
        while (a < n_act && act_type[a] != vt) a++;
        if (a == n_act) {
            act_type[n_act++] = vt;
            if (vt == FLM_TYPE_F32) {
                act[a] = x;
            } else {
                size_t ab = (flm_act_bytes(jobs[j].type, n) + 63) & ~(size_t)63;
                const bool on_stack = stack_used + ab <= sizeof stack;
                if (!on_stack) heap[a] = flm_work_get(ws, ab);
                void *buf = on_stack ? (void *)(stack + stack_used) : heap[a].p;
                if (!buf) fallback = true;
                else {
                    if (on_stack) stack_used += ab;
                    flm_act_quantize(jobs[j].type, x, n, buf);
                    act[a] = buf;
                }
            }
        }
        job_x[j] = act[a];
        job_fn[j] = k->vec_dot[jobs[j].type];
        job_stride[j] = flm_row_bytes(jobs[j].type, n);
        total += jobs[j].rows;
    }
    if (fallback) {
        for (size_t j = 0; j < n_jobs; j++)
            flm_matvec_ws(k, jobs[j].type, jobs[j].W, jobs[j].rows, n, x, jobs[j].y, 1, ws);
    } else {
        int nt = n_threads;
        if (nt <= 1 || total < 2 * (size_t)nt || total * n < FLM_MATVEC_MIN_PARALLEL) nt = 1;
        /* the jobs' rows laid end to end, in chunks the threads take one at a time (as matvec_rows) */
        multi_job J = {jobs, n_jobs, job_x, job_fn, job_stride, total, n, nt > 1 ? chunk_rows(total, job_stride[0], nt)
                                                                                  : total};
        flm_pool_run(nt, (total + J.c - 1) / J.c, multi_chunk, &J);
    }
    for (size_t a = 0; a < MAX_ACT; a++) flm_work_put(NULL, 0, &heap[a]);
    if (ws) ws->used = mark; /* what was carved from the area: given back */
}

void flm_rmsnorm(float *out, const float *x, const float *weight, size_t n, float eps) {
    float ss = 0.0f;
    for (size_t j = 0; j < n; j++) ss += x[j] * x[j];
    ss /= (float)n;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    for (size_t j = 0; j < n; j++) out[j] = weight[j] * (ss * x[j]);
}

void flm_layernorm(float *out, const float *x, const float *weight, const float *bias, size_t n, float eps) {
    float mean = 0.0f;
    for (size_t j = 0; j < n; j++) mean += x[j];
    mean /= (float)n;
    float var = 0.0f;
    for (size_t j = 0; j < n; j++) var += (x[j] - mean) * (x[j] - mean);
    var /= (float)n;
    const float inv = 1.0f / sqrtf(var + eps);
    for (size_t j = 0; j < n; j++) {
        float y = weight[j] * ((x[j] - mean) * inv);
        out[j] = bias ? y + bias[j] : y;
    }
}

void flm_softmax(const flm_kernels *k, float *x, size_t n) { k->softmax(x, n); }
