/* kernels.h — L_compute: the numeric kernels, a scalar reference and SIMD variants chosen at run time. Internal.
 *
 * Rows are stored as in GGUF: a row of n elements of type t is flm_row_bytes(t, n) bytes (blocks of 32 or 256,
 * layouts and sizes in the traits table of core/types.h). Vectors x, y are float32. All functions take n as the
 * element count; for a quantized type n must be a multiple of its block size (callers check shapes at load time).
 *
 * Two dot products exist for every tensor type t:
 *   - dot[t](row, x, n): x is float32 (exact up to float rounding; used where x changes per row or is rarely hot);
 *   - vec_dot[t](row, xq, n): x was first quantized once per matrix-vector product into the type's vec_dot_type
 *     (q8_0 for q4_0/q5_0/q8_0, q8_1 for q4_1/q5_1, q8_k for the K-quants, float32 itself for f32/f16/bf16) by
 *     flm_act_quantize, and the kernel works in int8 arithmetic as ggml's ggml_vec_dot_* do. Its error is the int8
 *     rounding of x: about 1e-2 of |w|·|x| at worst, usually far less.
 * The SIMD variants must agree with the scalar reference to float rounding (tests/test_kernels.c and
 * tests/test_quants.c check it on random inputs). A kernel table always has every entry of every supported type:
 * a SIMD table starts as a copy of the scalar one and overrides what it accelerates. */
#ifndef FLM_COMPUTE_KERNELS_H
#define FLM_COMPUTE_KERNELS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/arena.h"
#include "compute/act.h"
#include "flashlm.h"

#define FLM_N_TYPES 31 /* table size: type ids are < 31 */

/* Software prefetch of weights streamed from memory (a decode's matrix-vector products, the FFN bundles of the
 * flash modes): a kernel that works on one row while the hardware prefetchers fetch the next waits for DRAM at
 * every row, its compute and its memory time adding up (measured on a 2-core Xeon: 24 ns per 256 q4_k weights
 * from DRAM, 12 ns from cache, 12 ns to stream the bytes alone). Asking for the bytes FLM_PREFETCH_BYTES ahead of
 * the kernel overlaps the two (14 ns). */
#ifndef FLM_PREFETCH_BYTES
#define FLM_PREFETCH_BYTES 8192
#endif

/* Prefetch (for reading, into all cache levels) the cache lines of bytes [off, off + bytes) of base that lie below
 * byte limit (the end of what the caller reads). A prefetch never faults; nothing at or past limit is asked for. */
static inline void flm_prefetch(const void *base, size_t off, size_t limit, size_t bytes) {
    if (off >= limit) return;
    if (limit - off < bytes) bytes = limit - off;
    const char *a = (const char *)base + off;
    for (size_t o = 0; o < bytes; o += 64) {
#if defined(__x86_64__) || defined(__i386__)
        __asm__ volatile("prefetcht0 %0" : : "m"(a[o])); /* GCC drops a loop of __builtin_prefetch as empty */
#else
        __builtin_prefetch(a + o, 0, 3);
#endif
    }
}

typedef float (*flm_dot_fn)(const void *row, const float *x, size_t n);          /* sum_i row[i]*x[i] */
typedef void (*flm_axpy_fn)(const void *row, float a, float *y, size_t n);       /* y[i] += a*row[i]  */
typedef void (*flm_dequant_fn)(const void *row, float *y, size_t n);             /* y[i]  = row[i]    */
typedef float (*flm_vec_dot_fn)(const void *row, const void *xq, size_t n);      /* sum_i row[i]*xq[i] */
/* The tiled form of vec_dot for a batch (the inner kernel of flm_matmat): for r < rows and b < n_x,
 *   Y[b * y_stride + r] = vec_dot(W + r * w_stride, xq + b * x_stride, n)   (W, xq as bytes)
 * bit for bit equal to the same table's vec_dot, each weight block unpacked once for several tokens
 * (quants_tile_x86.h; at vnni, the stored rows against 2 to 16 tokens for the 32-element types and 2 to 3 for
 * q6_k, quants_rows_vnni.h, and panels of 16 interleaved rows for more tokens and for q4_k: quants_panel_vnni.h). rows,
 * n_x >= 0; n as vec_dot. */
/* tmp: NULL, or flm_tile_tmp_bytes(n, n_x) bytes, 64-byte aligned, that the call may overwrite (the vnni panels'
 * packed rows; carved by the caller from its work area, one per concurrent call): without it a level that packs
 * runs its row-at-a-time form, the same bits. */
typedef void (*flm_vec_dot_tile_fn)(const void *W, size_t w_stride, size_t rows, const void *xq, size_t x_stride,
                                    size_t n_x, size_t n, float *Y, size_t y_stride, void *tmp);
/* The tiled form of axpy for a batch (the down rows of a block of FFN neurons, ffn_bundle.c): for t < n_y,
 *   Y[t * y_stride + i] += a[t * a_stride + r] * row_r[i]   for r = 0, 1, ..., rows - 1 in that order, i < n,
 * row_r = W + r * w_stride (bytes), bit for bit what rows * n_y calls of the same table's axpy make (r outer, t
 * inner; a zero coefficient adds an exact zero, as a skipped call). */
typedef void (*flm_axpy_tile_fn)(const void *W, size_t w_stride, size_t rows, const float *a, size_t a_stride,
                                 float *Y, size_t y_stride, size_t n_y, size_t n);
typedef void (*flm_from_float_fn)(const float *x, void *dst, size_t n);          /* dst = quantized x  */
/* Attention over an f16 KV cache, for one query head (compute/attention.c); K and V are n rows of halves, stride
 * elements apart, of which the first d are the head's:
 *   scores: out[t] = (sum_{i<d} q[i] * K[t][i]) * scale, t < n
 *   values: out[i] = sum_{t<n} w[t] * V[t][i], i < d (out is overwritten)
 * Each sum is taken in order (i = 0, 1, ... for scores; t = 0, 1, ... for values) in float, every product rounded
 * before it is added (no fused multiply-add): every table gives exactly the scalar loops' bits, and the same bits as
 * those loops over an f32 cache holding the same (f16-rounded) values. */
typedef void (*flm_attn_scores_fn)(const float *q, const uint16_t *K, size_t stride, size_t n, size_t d, float scale,
                                   float *out);
typedef void (*flm_attn_values_fn)(const float *w, const uint16_t *V, size_t stride, size_t n, size_t d, float *out);
/* The FFN activation (compute/act.h) over n floats: y[i] = act(x[i]) * u[i], or y[i] = act(x[i]) when u is NULL.
 * y may be x (in place); u does not overlap y unless it is y. The scalar table is flm_act_eval element by element
 * (libm's expf / tanhf / erff), the reference; the SIMD tables compute SiLU as x / (1 + e^-x) and tanh-GELU as
 * x / (1 + e^(-2 sqrt(2/pi) (x + 0.044715 x^3))) (= 0.5 x (1 + tanh(...))) with a polynomial e^t (Cephes' expf
 * scheme, about 1 ulp), within 1e-5 relative of the reference or 1e-7 |x| absolute where the reference's own
 * 1 + tanh cancels (tests/test_kernels.c); ReLU and squared ReLU bit for bit; erf-GELU stays the reference's.
 * Non-finite inputs give the reference's class (NaN -> NaN, +inf -> +inf, -inf -> NaN for SiLU / GELU, -0 or +0
 * where the reference gives a zero). An element's result does not depend on its position or on n. */
typedef void (*flm_act_fn)(flm_act a, float *y, const float *x, const float *u, size_t n);
/* dst[i] = src[i] rounded to IEEE half (nearest even) and back: flm_f16_to_f32(flm_f32_to_f16(src[i])) bit for bit
 * at every level (NaN quieted with its top payload bits, as vcvtps2ph). dst may be src. */
typedef void (*flm_round_f16_fn)(float *dst, const float *src, size_t n);
/* Attention of a block of query rows against the same cache rows (compute/attention_batch.c: a batch's rows that
 * share a KV head); K and V are n rows of the cache, stride elements apart, of elem_bytes each (2: f16 halves, 4:
 * floats), of which the first d are the head's; q, w, out, o are arrays of n_rows row pointers:
 *   scores: out[r][t] = (sum_{i<d} q[r][i] * K[t][i]) * scale, r < n_rows, t < n
 *   values: o[r][i] += sum_{t<n} w[r][t] * V[t][i], r < n_rows, i < d (o holds a running sum: each element is added
 *           to in order t = 0, 1, ...)
 * each sum in order, every product rounded before it is added (no fused multiply-add), exactly as
 * flm_attn_scores_fn / flm_attn_values_fn (a values call on zeroed rows equals attn_values_f16's bits), while each
 * cache row is converted once for all the block's rows. Every table gives the scalar loops' bits. */
typedef void (*flm_attn_scores_tile_fn)(const float *const *q, size_t n_rows, const void *K, uint32_t elem_bytes,
                                        size_t stride, size_t n, size_t d, float scale, float *const *out);
typedef void (*flm_attn_values_tile_fn)(const float *const *w, size_t n_rows, const void *V, uint32_t elem_bytes,
                                        size_t stride, size_t n, size_t d, float *const *o);
/* dst[i] = src[i] as an IEEE half (nearest even): flm_f32_to_f16(src[i]) bit for bit at every level (NaN quieted
 * with its top payload bits, as vcvtps2ph). The f16 KV cache's store (flm_kv_store). */
typedef void (*flm_to_f16_fn)(uint16_t *dst, const float *src, size_t n);
/* Softmax of x[0..n) in place (attention's weights): m = max x, x[i] = e^(x[i] - m) / sum_j e^(x[j] - m). The
 * scalar table's is the float loop with libm's expf (the reference); the SIMD tables use the act kernel's polynomial
 * e^t, within 1e-6 + 3e-9 n relative of the exact softmax (tests/test_kernels.c test_softmax). Every level sums in
 * index order, and a -inf (a masked position) gets exactly 0 (so does any x[i] - m below -87 at the SIMD levels,
 * where the reference's expf is below 2^-125): masked positions anywhere in x leave the others' results bit for bit
 * those of the softmax over the unmasked ones alone. The result depends only on x and n (not on x's address). */
typedef void (*flm_softmax_fn)(float *x, size_t n);

typedef struct flm_kernels {
    const char *name;                    /* the level's name (flm_kernel_level_name) */
    flm_dot_fn dot[FLM_N_TYPES];         /* indexed by flm_type; NULL for unsupported types */
    flm_axpy_fn axpy[FLM_N_TYPES];
    flm_dequant_fn dequant[FLM_N_TYPES];
    flm_vec_dot_fn vec_dot[FLM_N_TYPES]; /* xq: x quantized by flm_act_quantize(t, ...) */
    flm_vec_dot_tile_fn vec_dot_tile[FLM_N_TYPES]; /* NULL where the level has none: flm_matmat then runs vec_dot
                                                      per (row, token), which is the reference */
    flm_axpy_tile_fn axpy_tile[FLM_N_TYPES];       /* NULL where the level has none: axpy per (row, token) */
    flm_from_float_fn act_quantize[FLM_N_TYPES]; /* indexed by activation type (q8_0, q8_1, q8_k): n floats
                                                    (whole blocks) into blocks; every table's output is the same
                                                    bytes (the scalar reference rounding, roundf) */
    flm_attn_scores_fn attn_scores_f16;          /* attention over an f16 KV cache (above) */
    flm_attn_values_fn attn_values_f16;
    flm_act_fn act;                              /* the FFN activation (above) */
    flm_round_f16_fn round_f16;                  /* f16 rounding of floats (attention's q and weights) */
    flm_attn_scores_tile_fn attn_scores_tile;   /* a batch's attention (above): rows of several queries */
    flm_attn_values_tile_fn attn_values_tile;
    flm_to_f16_fn to_f16;                        /* floats to halves (the f16 KV cache's store) */
    flm_softmax_fn softmax;                      /* attention's softmax (above) */
} flm_kernels;

/* Kernel levels, lowest first. Each level's table starts as a copy of a level below (its base: the one before it,
 * except avx512, whose base is avx2, and neon, whose base is scalar) and overrides only what it accelerates, so any
 * kernel a level lacks is the lower level's (and, in the end, the scalar reference's). Levels belong to one
 * instruction set (flm_kernel_level_isa): a build has the scalar level and its own architecture's. A CPU has every
 * level of its architecture up to its best except avxvnni, a side branch: AVX-VNNI (the 256-bit VEX form) comes with
 * Alder Lake and later Intel cores, with or without AVX-512, and not with some AVX-512 VNNI CPUs (Ice Lake, Zen 4). */
typedef enum flm_kernel_level {
    FLM_KERNELS_SCALAR = 0, /* "scalar": the reference, always available */
    FLM_KERNELS_AVX2,       /* "avx2": AVX2 + FMA + F16C (kernels_avx2.c, quants_avx2.c) */
    FLM_KERNELS_AVXVNNI,    /* "avxvnni": the avx2 set plus AVX-VNNI's vpdpbusd / vpdpwssd for the int8 products
                               (quants_avxvnni.c; the same bits as avx2) */
    FLM_KERNELS_AVX512,     /* "avx512": the avx2 set plus AVX-512 F/BW/VL (quants_avx512.c) */
    FLM_KERNELS_VNNI,       /* "vnni": the avx512 set plus AVX-512 VNNI (quants_vnni.c) */
    FLM_KERNELS_NEON,       /* "neon": 64-bit Arm Advanced SIMD, ARMv8.0-A (kernels_neon.c, quants_neon.c); its int8
                               dot products give the scalar reference's bits */
    FLM_KERNELS_DOTPROD,    /* "dotprod": the neon set with ARMv8.2-A SDOT for the int8 products
                               (quants_dotprod.c; the same bits as neon) */
    FLM_KERNELS_N_LEVELS
} flm_kernel_level;

/* The instruction set a level belongs to: "any" (scalar), "x86-64" or "aarch64"; NULL out of range. */
const char *flm_kernel_level_isa(flm_kernel_level level);
/* The level's name ("scalar", "avx2", "avxvnni", "avx512", "vnni", "neon", "dotprod"), NULL for an out-of-range
 * level. */
const char *flm_kernel_level_name(flm_kernel_level level);
/* The level named name (exactly one of the names above); -1 for any other string or NULL. */
int flm_kernel_level_parse(const char *name);
/* The highest level this build and CPU support (x86-64: cpuid via __builtin_cpu_supports, which also checks that
 * the OS saves the AVX / AVX-512 registers; aarch64: getauxval's HWCAP words, core/util.h flm_cpu_arm_caps).
 * Computed once. */
flm_kernel_level flm_kernels_cpu_level(void);
/* Whether this build and CPU have level (scalar, and every level of this build's instruction set up to
 * flm_kernels_cpu_level() but avxvnni, which needs its own cpuid bit); false out of range and for the levels of
 * another instruction set. */
bool flm_kernels_has_level(flm_kernel_level level);
/* The level the runtime uses when asked for `want`: the highest level this CPU has that is not above want (so a
 * level above the CPU's best gives its best, avxvnni on an AVX-512 CPU without AVX-VNNI gives avx2, and another
 * instruction set's level the highest of this one's below it in the enum: an x86 level on Arm gives scalar). */
flm_kernel_level flm_kernels_level_capped(flm_kernel_level want);
/* The table of one level, or NULL when this build or CPU lacks it (!flm_kernels_has_level). Tests and benchmarks select levels through this: it is the forcing FLASHLM_KERNELS uses. */
const flm_kernels *flm_kernels_for_level(flm_kernel_level level);

/* The scalar reference table (always available). */
const flm_kernels *flm_kernels_scalar(void);
/* The table the runtime uses, chosen once per process: the CPU's best level (flm_kernels_cpu_level), or the level
 * the environment variable FLASHLM_KERNELS names (scalar|avx2|avxvnni|avx512|vnni|neon|dotprod; the older FLM_KERNELS is read
 * when FLASHLM_KERNELS is unset), capped (flm_kernels_level_capped): asking for more than the CPU has gives the
 * highest level it has below the one asked for (the CLI prints a note; the library never prints). An unknown value is ignored (the CLI refuses it). */
const flm_kernels *flm_kernels_best(void);
/* The AVX2 table, or NULL if this build or CPU lacks it (for tests): flm_kernels_for_level(FLM_KERNELS_AVX2). */
const flm_kernels *flm_kernels_avx2(void);

/* y[r] = dot(W row r, x) for r in [0, rows): W is rows x n of type t, row stride flm_row_bytes(t, n).
 * x is quantized once into t's vec_dot_type (in a scratch buffer the caller never sees: a stack buffer up to 16 KiB,
 * else the heap — flm_matvec_ws: the work area ws first, compute/work.h; if that allocation fails it falls back to
 * the float-x dot[t], so it cannot fail), then each row
 * goes through vec_dot[t] — ggml's ggml_compute_forward_mul_mat scheme. y[r] equals
 * flm_vec_dot(k, t, row r, xq, n) bit for bit. Splits rows over n_threads threads of the pool (compute/pool.h), in
 * chunks of about 1/8 of a thread's share taken one at a time (n_threads <= 1, or a small matrix: serial).
 * n: any multiple of t's block size up to 2^30. */
void flm_matvec(const flm_kernels *k, uint32_t t, const void *W, size_t rows, size_t n, const float *x, float *y,
                int n_threads);
/* flm_matvec with x's quantized copy past 16 KiB carved from the work area ws (NULL: the heap, counted by
 * flm_work_heap_count): the token path's (a row of more than ~14k elements: a large model's d_ffn). */
void flm_matvec_ws(const flm_kernels *k, uint32_t t, const void *W, size_t rows, size_t n, const float *x, float *y,
                   int n_threads, flm_arena *ws);

/* A batch of matrix-vector products with one matrix (the matrix-matrix product of a batched forward pass):
 * y_b[r] = dot(W row r, x_b) for r < rows and b < n_x, where x_b = X + b * x_stride (n floats) and
 * y_b = Y + b * y_stride. Every x_b is quantized once into W's vec_dot_type (n_x * flm_act_bytes(t, n) bytes, each
 * rounded up to 64, from the work area ws: compute/work.h; the heap when ws is NULL or too small), then each row of W is read once for all n_x tokens: the weight traffic a batch shares. Where the table has
 * a vec_dot_tile[t], rows go in blocks (multiples of 16 rows) that stay in L2 (about 192 KiB of weights) and the tile kernel unpacks each
 * weight block once per few tokens; else vec_dot per (row, token). Every y_b[r] equals flm_matvec's bit for bit.
 * Rows split over n_threads threads of the pool (compute/pool.h). When the scratch cannot be allocated it runs flm_matvec token by token
 * (the same values). n as flm_matvec. */
void flm_matmat(const flm_kernels *k, uint32_t t, const void *W, size_t rows, size_t n, const float *X,
                size_t x_stride, size_t n_x, float *Y, size_t y_stride, int n_threads, flm_arena *ws);

/* One matrix of flm_matvec_multi: y[r] = dot(W row r, x) for r < rows, W of type `type`, rows of n elements. */
typedef struct flm_matvec_job {
    uint32_t type;
    const void *W;
    size_t rows;
    float *y;
} flm_matvec_job;
#define FLM_MATVEC_MAX_JOBS 8

/* Several matrices against the same x (attention q/k/v, FFN gate/up): x is quantized once per distinct
 * vec_dot_type and all rows of all jobs are split over n_threads in ONE call of the pool (one hand-out instead of
 * n_jobs). Each y[r] equals flm_matvec's bit for bit. n_jobs <= FLM_MATVEC_MAX_JOBS; n as flm_matvec. */
void flm_matvec_multi(const flm_kernels *k, const flm_matvec_job *jobs, size_t n_jobs, size_t n, const float *x,
                      int n_threads);
/* flm_matvec_multi with the quantized copies that do not fit its 16 KiB stack buffer carved from ws, as
 * flm_matvec_ws (at most FLM_MATVEC_ACT_MAX of flm_act_bytes_max(n)). */
#define FLM_MATVEC_ACT_MAX 4
void flm_matvec_multi_ws(const flm_kernels *k, const flm_matvec_job *jobs, size_t n_jobs, size_t n, const float *x,
                         int n_threads, flm_arena *ws);

/* Bytes that n floats quantized for a dot with weight type t take: the row of n elements of t's vec_dot_type
 * (n * 4 for float weight types), followed for q8_0 / q8_1 by one float32 d per block (the f16 d converted), then
 * one int32 sum(qs) per block (q8_0) or one float32 s per block (q8_1): the SIMD kernels load four at a time
 * instead of converting per block, and q4_0/q5_0 dot their unsigned values and subtract offset * sum(qs);
 * 0 when t is unsupported or n is not a multiple of the block size. */
size_t flm_act_bytes(uint32_t t, size_t n);
/* Quantizes x[n] for dot products with rows of weight type t into dst (flm_act_bytes(t, n) bytes): q8_0/q8_1 blocks
 * as ggml's quantize_row_q8_0_ref / quantize_row_q8_1_ref (then their float32 scales), q8_k blocks with d = max|x|/127 (float) and
 * q = roundf(x/d) plus the 16-element sums; a plain copy for float weight types. Runs the best table's
 * act_quantize (every table writes the same bytes). n must be a multiple of t's block size. */
void flm_act_quantize(uint32_t t, const float *x, size_t n, void *dst);
/* row (n elements of weight type t) · x, where xq = flm_act_quantize(t, x, n): k->vec_dot[t](row, xq, n). */
float flm_vec_dot(const flm_kernels *k, uint32_t t, const void *row, const void *xq, size_t n);

/* Scalar conversions (IEEE half, bfloat16 with round-to-nearest-even). */
float flm_f16_to_f32(uint16_t h);
uint16_t flm_f32_to_f16(float f);
float flm_bf16_to_f32(uint16_t h);
uint16_t flm_f32_to_bf16(float f);

/* Quantize / convert a float row of n elements into type t (same rounding as ggml's reference quantizers
 * quantize_row_{q4_0,q4_1,q5_0,q5_1,q8_0,q8_1}_ref; q8_k as flm_act_quantize). dst holds flm_row_bytes(t, n)
 * bytes. Returns false (writing nothing) for a type without a quantizer (traits has_quantizer false: the K-quants
 * q2_k..q6_k) or an n that is not a multiple of the block size. */
bool flm_quantize_row(uint32_t t, const float *x, void *dst, size_t n);

/* Small float32 ops used by the forward pass (scalar; they are not the bottleneck). */
void flm_rmsnorm(float *out, const float *x, const float *weight, size_t n, float eps); /* out = x/rms(x)*w */
/* LayerNorm (OPT, GPT-2, Falcon, Phi-2): out = (x - mean(x)) / sqrt(var(x) + eps) * w + b, var the population
 * variance (divided by n, as torch.nn.LayerNorm); bias NULL: none. out may be x. */
void flm_layernorm(float *out, const float *x, const float *weight, const float *bias, size_t n, float eps);
/* Softmax of x[0..n) in place, stable, by k's softmax kernel (flm_softmax_fn above; flm_kernels_scalar(): the
 * reference). Attention (token by token and batched) calls this, with the pass's table, so both give the same bits. */
void flm_softmax(const flm_kernels *k, float *x, size_t n);

#endif
