/* arch.c — the architecture descriptors (see arch.h). */
#include "model/arch.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static const flm_arch archs[] = {
    /* Llama 1/2/3, SmolLM2, TinyLlama, stories260K: SwiGLU, RoPE on adjacent pairs */
    {.name = "llama", .flags = 0, .rope = FLM_ROPE_NORMAL, .act = FLM_ACT_SILU},
    /* Qwen2 / Qwen2.5: llama plus biases on q, k, v and NEOX RoPE (llama.cpp LLM_ARCH_QWEN2) */
    {.name = "qwen2", .flags = FLM_ARCH_QKV_BIAS, .rope = FLM_ROPE_NEOX, .act = FLM_ACT_SILU},
    /* Gemma 3: GeGLU (tanh GELU), q/k RMSNorm, post-attention and post-FFN norms, embedding scaled by
       sqrt(d_model), five sliding-window layers for every global one, local RoPE base 10000
       (llama.cpp LLM_ARCH_GEMMA3; norm weights in GGUF already include Gemma's +1) */
    {.name = "gemma3", .flags = FLM_ARCH_QK_NORM | FLM_ARCH_POST_NORMS | FLM_ARCH_EMBD_SCALE, .rope = FLM_ROPE_NEOX,
     .act = FLM_ACT_GELU_TANH, .swa_period = 6, .rope_base_local = 10000.0f},
    /* OPT (transformers' modeling_opt.py; pre-LN, OPT >= 1.3B and 125M): LayerNorm with bias, learned absolute
       positions (the offset of 2 folded by the converter, src/convert/hf.c), biases on q, k, v, the output and the
       FFN, ungated ReLU FFN. llama.cpp has no OPT converter: `flashlm convert HF_DIR` writes its GGUF. OPT-350M's
       post-LN and project_in/out are per-file data (flashlm.norm_after, proj_in/proj_out: model/model.h). */
    {.name = "opt", .flags = FLM_ARCH_QKV_BIAS | FLM_ARCH_O_BIAS | FLM_ARCH_FFN_BIAS, .norm = FLM_NORM_LAYER,
     .pos = FLM_POS_LEARNED, .act = FLM_ACT_RELU},
    /* Falcon 7B (transformers' modeling_falcon.py with parallel_attn, multi_query, no bias, no alibi; llama.cpp
       LLM_ARCH_FALCON): LayerNorm with bias, one norm feeding attention and FFN in parallel, fused attn_qkv of
       n_heads q heads then one k and one v head (head_count_kv 1: multi-query attention), NEOX RoPE, ungated FFN
       with exact (erf) GELU as transformers' "gelu" (llama.cpp's ggml_gelu is the tanh approximation; the two differ
       by up to 4.7e-4 per activation, at x = -2.7; with tanh the tiny reference model's logits are 2.3e-4 off
       instead of 6e-7: tests/test_hf_archs.c), no biases. Falcon 40B's second norm (attn_norm_2) is refused
       (model.c). */
    {.name = "falcon", .flags = FLM_ARCH_PARALLEL, .norm = FLM_NORM_LAYER, .rope = FLM_ROPE_NEOX,
     .act = FLM_ACT_GELU_ERF, .qkv = FLM_QKV_CONCAT},
    /* Phi-2 (transformers' modeling_phi.py; llama.cpp LLM_ARCH_PHI2): LayerNorm with bias, parallel attention and
       FFN from one norm, biases on q, k, v, the output, the FFN and the classifier, partial NEOX RoPE (the first
       rope.dimension_count = head_dim * partial_rotary_factor dimensions of each head), ungated tanh-GELU
       (gelu_new) */
    {.name = "phi2", .flags = FLM_ARCH_PARALLEL | FLM_ARCH_QKV_BIAS | FLM_ARCH_O_BIAS | FLM_ARCH_FFN_BIAS |
                               FLM_ARCH_OUT_BIAS,
     .norm = FLM_NORM_LAYER, .rope = FLM_ROPE_NEOX, .act = FLM_ACT_GELU_TANH, .qkv = FLM_QKV_CONCAT},
    /* Persimmon (transformers' modeling_persimmon.py; llama.cpp LLM_ARCH_PERSIMMON): sequential, LayerNorm with bias,
       fused attn_qkv interleaved per head with its bias, LayerNorm with bias on each head of q and k, partial NEOX
       RoPE, biases on the output and the FFN, ungated squared ReLU */
    {.name = "persimmon", .flags = FLM_ARCH_QK_NORM | FLM_ARCH_QKV_BIAS | FLM_ARCH_O_BIAS | FLM_ARCH_FFN_BIAS,
     .norm = FLM_NORM_LAYER, .rope = FLM_ROPE_NEOX, .act = FLM_ACT_RELU2, .qkv = FLM_QKV_PER_HEAD},
};

const flm_arch *flm_arch_find(const char *name) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (name && !strcmp(archs[i].name, name)) return &archs[i];
    return NULL;
}

static char arch_names[256];
static void arch_names_init(void) {
    size_t n = 0;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        n += (size_t)snprintf(arch_names + n, n < sizeof arch_names ? sizeof arch_names - n : 0, "%s%s", i ? ", " : "",
                              archs[i].name);
}

const char *flm_arch_names(void) { /* the table's names, ", "-separated, built once */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, arch_names_init);
    return arch_names;
}
