/* types.h — storage traits of the tensor types (GGUF's ggml_type layouts). Internal.
 * Source: ggml/src/ggml-common.h block definitions (QK4_0 = QK8_0 = 32). */
#ifndef FLM_CORE_TYPES_H
#define FLM_CORE_TYPES_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "flashlm.h"

#define FLM_QK 32 /* elements per Q4_0 / Q8_0 block */

typedef struct { uint16_t d; uint8_t qs[FLM_QK / 2]; } flm_block_q4_0; /* 18 bytes */
typedef struct { uint16_t d; int8_t qs[FLM_QK]; } flm_block_q8_0;      /* 34 bytes */

/* true when type is one flashlm can compute with. */
bool flm_type_supported(uint32_t type);
/* Elements per block (1 for float types, 32 for Q4_0/Q8_0); 0 for unsupported types. */
size_t flm_type_block_elems(uint32_t type);
/* Bytes per block; 0 for unsupported types. */
size_t flm_type_block_bytes(uint32_t type);
/* Bytes of a row of n elements, or 0 when n is not a multiple of the block size or the type is unsupported.
 * Overflow-safe for n < 2^58. */
size_t flm_row_bytes(uint32_t type, uint64_t n);

#endif
