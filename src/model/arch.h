/* arch.h — architectures as data: one descriptor per architecture the forward pass can run. Internal.
 *
 * Every architecture here is a pre-norm decoder-only transformer with the GGUF tensor names of llama.cpp
 * (blk.N.attn_q.weight, ...). What differs between them is data: the GGUF key prefix, which optional tensors exist,
 * the RoPE order, the FFN activation, extra norms, the embedding scale and local (sliding-window) attention.
 * Adding an architecture means adding one descriptor here, plus whatever truly new op it needs in the forward pass.
 * Sources: llama.cpp src/llama-model.cpp (build graphs per arch), gguf-py constants (key and tensor names). */
#ifndef FLM_MODEL_ARCH_H
#define FLM_MODEL_ARCH_H
#include <stdbool.h>
#include <stdint.h>
#include "compute/act.h"

/* RoPE pair order. NORMAL rotates adjacent pairs (x[2i], x[2i+1]) (llama); NEOX rotates (x[i], x[i + rope_dim/2])
 * (GPT-NeoX, Qwen2, Gemma). */
typedef enum flm_rope_kind { FLM_ROPE_NORMAL = 0, FLM_ROPE_NEOX = 1 } flm_rope_kind;

/* FFN activations (flm_act) are defined with their kernels in compute/act.h. */

/* Optional parts of an architecture (flags). */
enum {
    FLM_ARCH_QKV_BIAS = 1u << 0,   /* blk.N.attn_{q,k,v}.bias (Qwen2) */
    FLM_ARCH_QK_NORM = 1u << 1,    /* blk.N.attn_{q,k}_norm.weight: RMSNorm of each head of q and k before RoPE */
    FLM_ARCH_POST_NORMS = 1u << 2, /* blk.N.post_attention_norm / post_ffw_norm: RMSNorm of the attention and FFN
                                      outputs before they are added to the residual stream (Gemma 2/3) */
    FLM_ARCH_EMBD_SCALE = 1u << 3, /* the embedding row is multiplied by sqrt(d_model) (Gemma) */
};

typedef struct flm_arch {
    const char *name;        /* general.architecture, also the GGUF key prefix ("qwen2.embedding_length") */
    unsigned flags;          /* FLM_ARCH_* */
    flm_rope_kind rope;
    flm_act act;             /* default FFN activation (a file may override with flashlm.ffn_activation) */
    uint32_t swa_period;     /* 0: every layer attends globally; n: layer l is global when (l + 1) % n == 0 and
                                uses sliding-window attention otherwise (Gemma 3: 6) */
    float rope_base_local;   /* RoPE base of the sliding-window layers (Gemma 3: 10000); 0 = the global base */
} flm_arch;

/* The descriptor of general.architecture name, or NULL when flashlm does not know it. */
const flm_arch *flm_arch_find(const char *name);
/* Comma-separated names of every known architecture, for error messages ("llama, qwen2, gemma3"). */
const char *flm_arch_names(void);

#endif
