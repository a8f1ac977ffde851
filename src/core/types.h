/* types.h — the tensor type traits table (GGUF's ggml_type ids and block layouts). Internal, bottom layer:
 * compute/ and format/ include it, it includes nothing of theirs.
 *
 * Source: ggml/src/ggml-common.h (block_q4_0 ... block_q8_K, QK4_0 = QK8_0 = 32, QK_K = 256) and ggml.c's
 * type_traits table (type_name, blck_size, type_size, is_quantized, vec_dot_type). Every block size, row size and
 * type name in flashlm comes from flm_type_traits_of(); the wrappers below only read the table. f16 fields are
 * stored as raw IEEE half bits (uint16_t), little-endian as in the file. */
#ifndef FLM_CORE_TYPES_H
#define FLM_CORE_TYPES_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "flashlm.h"

#define FLM_QK 32   /* elements per block of the 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1) */
#define FLM_QK_K 256 /* elements per super-block of the K-quants (Q2_K ... Q6_K, Q8_K) */
#define FLM_K_SCALE_SIZE 12 /* bytes of packed 6-bit scales and mins in Q4_K / Q5_K */
#define FLM_TYPE_MAX_BLOCK_ELEMS 256 /* the largest block_elems in the table */

typedef struct { uint16_t d; uint8_t qs[FLM_QK / 2]; } flm_block_q4_0;                /* 18 bytes */
typedef struct { uint16_t d, m; uint8_t qs[FLM_QK / 2]; } flm_block_q4_1;             /* 20 bytes */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[FLM_QK / 2]; } flm_block_q5_0; /* 22 bytes */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[FLM_QK / 2]; } flm_block_q5_1; /* 24 bytes */
typedef struct { uint16_t d; int8_t qs[FLM_QK]; } flm_block_q8_0;                     /* 34 bytes */
typedef struct { uint16_t d, s; int8_t qs[FLM_QK]; } flm_block_q8_1;                  /* 36 bytes: s = d*sum(qs) */

/* Q2_K: scales[i] low nibble = scale, high nibble = min of 16-element group i; x = d*sc*q - dmin*m. */
typedef struct {
    uint8_t scales[FLM_QK_K / 16];
    uint8_t qs[FLM_QK_K / 4];
    uint16_t d, dmin;
} flm_block_q2_k; /* 84 bytes */

/* Q3_K: x = d * (sc - 32) * (q2 - (hmask bit ? 0 : 4)), 16 6-bit scales packed in 12 bytes. */
typedef struct {
    uint8_t hmask[FLM_QK_K / 8];
    uint8_t qs[FLM_QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} flm_block_q3_k; /* 110 bytes */

/* Q4_K: 8 sub-blocks of 32, 6-bit scale and min each (packed in scales[12]); x = d*sc*q - dmin*m. */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[FLM_K_SCALE_SIZE];
    uint8_t qs[FLM_QK_K / 2];
} flm_block_q4_k; /* 144 bytes */

/* Q5_K: Q4_K plus one high bit per element in qh. */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[FLM_K_SCALE_SIZE];
    uint8_t qh[FLM_QK_K / 8];
    uint8_t qs[FLM_QK_K / 2];
} flm_block_q5_k; /* 176 bytes */

/* Q6_K: x = d * scales[i/16] * (q - 32), q = 4 low bits in ql, 2 high bits in qh. */
typedef struct {
    uint8_t ql[FLM_QK_K / 2];
    uint8_t qh[FLM_QK_K / 4];
    int8_t scales[FLM_QK_K / 16];
    uint16_t d;
} flm_block_q6_k; /* 210 bytes */

/* Q8_K (activations): x = d * q; bsums[i] = sum of qs[16i .. 16i+15]. */
typedef struct {
    float d;
    int8_t qs[FLM_QK_K];
    int16_t bsums[FLM_QK_K / 16];
} flm_block_q8_k; /* 292 bytes */

/* One row of the traits table. */
typedef struct flm_type_traits {
    const char *name;       /* GGUF/ggml type name: "f32", "q4_k", ... */
    uint32_t block_elems;   /* elements per block: 1 for float types, 32 or 256 for quantized ones */
    uint32_t block_bytes;   /* bytes per block */
    bool is_quantized;      /* stored in blocks with scales (not a plain float type) */
    bool is_tensor;         /* may be a weight tensor's type (false for the activation-only q8_1, q8_k) */
    bool has_quantizer;     /* flm_quantize_row can write it (float types, q4_0, q4_1, q5_0, q5_1, q8_*) */
    uint32_t vec_dot_type;  /* the type x is quantized to for the dot product with a row of this type
                               (FLM_TYPE_F32: x stays float) */
} flm_type_traits;

/* The traits of type id `type`, or NULL for an id flashlm does not know. */
const flm_type_traits *flm_type_traits_of(uint32_t type);
/* true when type can be a weight tensor's type (known, not activation-only): loaders accept it, every kernel
 * table has dot/axpy/dequant/vec_dot for it. */
bool flm_type_supported(uint32_t type);
/* Elements per block (1 for float types, 32 or 256 for quantized ones); 0 for unknown types. */
size_t flm_type_block_elems(uint32_t type);
/* Bytes per block; 0 for unknown types. */
size_t flm_type_block_bytes(uint32_t type);
/* Bytes of a row of n elements, or 0 when n is not a multiple of the block size or the type is unknown.
 * Overflow-safe for n < 2^58. */
size_t flm_row_bytes(uint32_t type, uint64_t n);
/* Writes the supported tensor type names, comma-separated in id order ("f32, f16, q4_0, ..."), into buf (cap bytes,
 * always NUL-terminated, truncated at a name boundary when short; 128 bytes hold them all). Returns buf. */
const char *flm_type_supported_list(char *buf, size_t cap);

#endif
