/* types.c — the tensor type traits table. See types.h. Source: ggml.c type_traits, ggml-common.h. */
#include "core/types.h"

#include <stdio.h>

_Static_assert(sizeof(flm_block_q4_0) == 18, "block_q4_0 layout");
_Static_assert(sizeof(flm_block_q4_1) == 20, "block_q4_1 layout");
_Static_assert(sizeof(flm_block_q5_0) == 22, "block_q5_0 layout");
_Static_assert(sizeof(flm_block_q5_1) == 24, "block_q5_1 layout");
_Static_assert(sizeof(flm_block_q8_0) == 34, "block_q8_0 layout");
_Static_assert(sizeof(flm_block_q8_1) == 36, "block_q8_1 layout");
_Static_assert(sizeof(flm_block_q2_k) == 84, "block_q2_K layout");
_Static_assert(sizeof(flm_block_q3_k) == 110, "block_q3_K layout");
_Static_assert(sizeof(flm_block_q4_k) == 144, "block_q4_K layout");
_Static_assert(sizeof(flm_block_q5_k) == 176, "block_q5_K layout");
_Static_assert(sizeof(flm_block_q6_k) == 210, "block_q6_K layout");
_Static_assert(sizeof(flm_block_q8_k) == 292, "block_q8_K layout");

#define QUANT(nm, be, blk, tensor, quantizer, vdt) \
    {.name = nm, .block_elems = be, .block_bytes = sizeof(blk), .is_quantized = true, .is_tensor = tensor, \
     .has_quantizer = quantizer, .vec_dot_type = vdt}

static const flm_type_traits traits[] = {
    [FLM_TYPE_F32] = {.name = "f32", .block_elems = 1, .block_bytes = 4, .is_tensor = true, .has_quantizer = true,
                      .vec_dot_type = FLM_TYPE_F32},
    [FLM_TYPE_F16] = {.name = "f16", .block_elems = 1, .block_bytes = 2, .is_tensor = true, .has_quantizer = true,
                      .vec_dot_type = FLM_TYPE_F32},
    [FLM_TYPE_BF16] = {.name = "bf16", .block_elems = 1, .block_bytes = 2, .is_tensor = true, .has_quantizer = true,
                       .vec_dot_type = FLM_TYPE_F32},
    [FLM_TYPE_Q4_0] = QUANT("q4_0", FLM_QK, flm_block_q4_0, true, true, FLM_TYPE_Q8_0),
    [FLM_TYPE_Q4_1] = QUANT("q4_1", FLM_QK, flm_block_q4_1, true, true, FLM_TYPE_Q8_1),
    [FLM_TYPE_Q5_0] = QUANT("q5_0", FLM_QK, flm_block_q5_0, true, true, FLM_TYPE_Q8_0),
    [FLM_TYPE_Q5_1] = QUANT("q5_1", FLM_QK, flm_block_q5_1, true, true, FLM_TYPE_Q8_1),
    [FLM_TYPE_Q8_0] = QUANT("q8_0", FLM_QK, flm_block_q8_0, true, true, FLM_TYPE_Q8_0),
    [FLM_TYPE_Q8_1] = QUANT("q8_1", FLM_QK, flm_block_q8_1, false, true, FLM_TYPE_Q8_1),
    [FLM_TYPE_Q2_K] = QUANT("q2_k", FLM_QK_K, flm_block_q2_k, true, false, FLM_TYPE_Q8_K),
    [FLM_TYPE_Q3_K] = QUANT("q3_k", FLM_QK_K, flm_block_q3_k, true, false, FLM_TYPE_Q8_K),
    [FLM_TYPE_Q4_K] = QUANT("q4_k", FLM_QK_K, flm_block_q4_k, true, false, FLM_TYPE_Q8_K),
    [FLM_TYPE_Q5_K] = QUANT("q5_k", FLM_QK_K, flm_block_q5_k, true, false, FLM_TYPE_Q8_K),
    [FLM_TYPE_Q6_K] = QUANT("q6_k", FLM_QK_K, flm_block_q6_k, true, false, FLM_TYPE_Q8_K),
    [FLM_TYPE_Q8_K] = QUANT("q8_k", FLM_QK_K, flm_block_q8_k, false, true, FLM_TYPE_Q8_K),
};

const flm_type_traits *flm_type_traits_of(uint32_t type) {
    if (type >= sizeof traits / sizeof traits[0] || !traits[type].name) return NULL;
    return &traits[type];
}

bool flm_type_supported(uint32_t type) {
    const flm_type_traits *tt = flm_type_traits_of(type);
    return tt && tt->is_tensor;
}

size_t flm_type_block_elems(uint32_t type) {
    const flm_type_traits *tt = flm_type_traits_of(type);
    return tt ? tt->block_elems : 0;
}

size_t flm_type_block_bytes(uint32_t type) {
    const flm_type_traits *tt = flm_type_traits_of(type);
    return tt ? tt->block_bytes : 0;
}

size_t flm_row_bytes(uint32_t type, uint64_t n) {
    size_t be = flm_type_block_elems(type);
    if (be == 0 || n % be != 0 || n >= ((uint64_t)1 << 58)) return 0;
    return (size_t)(n / be) * flm_type_block_bytes(type);
}

const char *flm_type_name(uint32_t type) {
    const flm_type_traits *tt = flm_type_traits_of(type);
    return tt ? tt->name : NULL;
}

const char *flm_type_supported_list(char *buf, size_t cap) {
    if (!buf || cap == 0) return "";
    size_t len = 0;
    buf[0] = '\0';
    for (uint32_t t = 0; t < sizeof traits / sizeof traits[0]; t++) {
        if (!flm_type_supported(t)) continue;
        int w = snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", traits[t].name);
        if (w < 0 || (size_t)w >= cap - len) break; /* truncated: keep what fit */
        len += (size_t)w;
    }
    return buf;
}
