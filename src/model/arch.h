/* arch.h — architectures as data: one descriptor per architecture the forward pass can run. Internal.
 *
 * Every architecture here is a pre-norm decoder-only transformer (OPT-350M's post-norm is a per-file key,
 * flashlm.norm_after: model/model.h) with the GGUF tensor names of llama.cpp
 * (blk.N.attn_q.weight, ...). What differs between them is data: the GGUF key prefix, which optional tensors exist,
 * the norm (RMSNorm or LayerNorm with bias), the positions (RoPE in either pair order, or learned absolute), the FFN
 * activation, extra norms, biases, the embedding scale, sequential or parallel attention and FFN, and local
 * (sliding-window) attention. The forward pass (runtime/forward.c) is assembled from blocks these fields select.
 * Adding an architecture means adding one descriptor here, plus whatever truly new block it needs in the forward pass.
 * Sources: llama.cpp src/llama-model.cpp (build graphs per arch), gguf-py constants (key and tensor names). */
#ifndef FLM_MODEL_ARCH_H
#define FLM_MODEL_ARCH_H
#include <stdbool.h>
#include <stdint.h>
#include "compute/act.h"

/* RoPE pair order. NORMAL rotates adjacent pairs (x[2i], x[2i+1]) (llama); NEOX rotates (x[i], x[i + rope_dim/2])
 * (GPT-NeoX, Qwen2, Gemma). */
typedef enum flm_rope_kind { FLM_ROPE_NORMAL = 0, FLM_ROPE_NEOX = 1 } flm_rope_kind;

/* The norm block (attention input, FFN input, output; post-norms). */
typedef enum flm_norm_kind {
    FLM_NORM_RMS = 0,   /* x / sqrt(mean(x^2) + eps) * w (llama, Qwen2, Gemma) */
    FLM_NORM_LAYER = 1, /* (x - mean(x)) / sqrt(var(x) + eps) * w + b, with blk.N.attn_norm.bias, ffn_norm.bias and
                           output_norm.bias (OPT, Falcon, Phi-2, Persimmon) */
} flm_norm_kind;

/* Where positions enter. */
typedef enum flm_pos_kind {
    FLM_POS_ROPE = 0,    /* RoPE on q and k (pair order: flm_arch.rope) */
    FLM_POS_LEARNED = 1, /* learned absolute positions: row pos of position_embd.weight [n_ctx_train rows of d_model]
                            is added to the token's embedding; no RoPE (OPT, GPT-2; OPT's offset of 2 must be folded
                            into the tensor by the converter) */
} flm_pos_kind;

/* FFN activations (flm_act) are defined with their kernels in compute/act.h. */

/* Optional parts of an architecture (flags). */
enum {
    FLM_ARCH_QKV_BIAS = 1u << 0,   /* blk.N.attn_{q,k,v}.bias (Qwen2) */
    FLM_ARCH_QK_NORM = 1u << 1,    /* blk.N.attn_{q,k}_norm.weight [head_dim]: each head of q and k normed before RoPE,
                                      by the architecture's norm (Gemma 3: RMSNorm; Persimmon: LayerNorm with
                                      attn_{q,k}_norm.bias) */
    FLM_ARCH_POST_NORMS = 1u << 2, /* blk.N.post_attention_norm / post_ffw_norm: RMSNorm of the attention and FFN
                                      outputs before they are added to the residual stream (Gemma 2/3) */
    FLM_ARCH_EMBD_SCALE = 1u << 3, /* the embedding row is multiplied by sqrt(d_model) (Gemma) */
    FLM_ARCH_O_BIAS = 1u << 4,     /* blk.N.attn_output.bias (OPT, Phi-2) */
    FLM_ARCH_PARALLEL = 1u << 5,   /* attention and FFN both read the layer's input: x += attn(norm(x)) +
                                      ffn(ffn_norm(x)) (GPT-J, Falcon, Phi-2), instead of the FFN reading x after the
                                      attention's residual; blk.N.ffn_norm is optional: without it (Falcon 7B, Phi-2)
                                      the FFN reads attn_norm's output too */
    FLM_ARCH_FFN_BIAS = 1u << 6,   /* blk.N.ffn_up.bias [d_ffn] and blk.N.ffn_down.bias [d_model], resident f32:
                                      f = down(act(up h + b_up)) + b_down (OPT, Phi-2, Persimmon); the FFN sources add
                                      b_up per neuron before the activation, the forward pass b_down after the FFN */
    FLM_ARCH_OUT_BIAS = 1u << 7,   /* output.bias [n_vocab]: logits = W_out h + b_out (Phi-2's lm_head) */
};

/* The rows of a fused blk.N.attn_qkv.weight [d_model -> q_dim + 2 kv_dim] (and of attn_qkv.bias), which llama.cpp's
 * falcon, phi2 and persimmon files may hold instead of attn_q, attn_k and attn_v. */
typedef enum flm_qkv_layout {
    FLM_QKV_CONCAT = 0,   /* every q row, then every k row, then every v row (Falcon as llama.cpp's converter writes it,
                             Phi-2's older files): bound as three row ranges of the one tensor, nothing copied */
    FLM_QKV_PER_HEAD = 1, /* per head h: its head_dim q rows, k rows, v rows (Persimmon: transformers' view(n_heads, 3,
                             head_dim), llama.cpp's reshape (head_dim, 3, n_heads)); needs n_kv_heads == n_heads; the
                             attention block projects it head by head */
} flm_qkv_layout;

typedef struct flm_arch {
    const char *name;        /* general.architecture, also the GGUF key prefix ("qwen2.embedding_length") */
    unsigned flags;          /* FLM_ARCH_* */
    flm_norm_kind norm;      /* RMSNorm (0, the default) or LayerNorm with bias */
    flm_pos_kind pos;        /* RoPE (0, the default) or learned absolute positions */
    flm_rope_kind rope;      /* RoPE pair order (FLM_POS_ROPE) */
    flm_act act;             /* default FFN activation (a file may override with flashlm.ffn_activation) */
    uint32_t swa_period;     /* 0: every layer attends globally; n: layer l is global when (l + 1) % n == 0 and
                                uses sliding-window attention otherwise (Gemma 3: 6) */
    float rope_base_local;   /* RoPE base of the sliding-window layers (Gemma 3: 10000); 0 = the global base */
    flm_qkv_layout qkv;      /* the row order of a fused attn_qkv, when a file has one */
} flm_arch;

/* The descriptor of general.architecture name, or NULL when flashlm does not know it. */
const flm_arch *flm_arch_find(const char *name);
/* Comma-separated names of every known architecture, for error messages ("llama, qwen2, gemma3"). */
const char *flm_arch_names(void);

#endif
