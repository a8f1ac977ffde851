#include "core/types.h"

bool flm_type_supported(uint32_t type) { return flm_type_block_elems(type) != 0; }

size_t flm_type_block_elems(uint32_t type) {
    switch (type) {
    case FLM_TYPE_F32: case FLM_TYPE_F16: case FLM_TYPE_BF16: return 1;
    case FLM_TYPE_Q4_0: case FLM_TYPE_Q8_0: return FLM_QK;
    default: return 0;
    }
}

size_t flm_type_block_bytes(uint32_t type) {
    switch (type) {
    case FLM_TYPE_F32: return 4;
    case FLM_TYPE_F16: case FLM_TYPE_BF16: return 2;
    case FLM_TYPE_Q4_0: return sizeof(flm_block_q4_0);
    case FLM_TYPE_Q8_0: return sizeof(flm_block_q8_0);
    default: return 0;
    }
}

size_t flm_row_bytes(uint32_t type, uint64_t n) {
    size_t be = flm_type_block_elems(type);
    if (be == 0 || n % be != 0 || n >= ((uint64_t)1 << 58)) return 0;
    return (size_t)(n / be) * flm_type_block_bytes(type);
}

const char *flm_type_name(uint32_t type) {
    switch (type) {
    case FLM_TYPE_F32: return "f32";
    case FLM_TYPE_F16: return "f16";
    case FLM_TYPE_BF16: return "bf16";
    case FLM_TYPE_Q4_0: return "q4_0";
    case FLM_TYPE_Q8_0: return "q8_0";
    default: return NULL;
    }
}
