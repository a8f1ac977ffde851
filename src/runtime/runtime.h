/* runtime.h — the context behind the public flm_ctx, and the token loop's pieces. Internal. */
#ifndef FLM_RUNTIME_RUNTIME_H
#define FLM_RUNTIME_RUNTIME_H
#include "flashlm.h"
#include "compute/attention.h"
#include "compute/kernels.h"
#include "model/model.h"

/* Scratch activations of one token (llama2.c's RunState, without the KV cache). */
typedef struct flm_scratch {
    float *x;      /* residual stream [d_model] */
    float *xb;     /* normed input / attention output [max(d_model, q_dim)] */
    float *xb2;    /* [d_model] */
    float *hb;     /* FFN hidden [d_ffn] */
    float *hb2;    /* FFN hidden (up) [d_ffn] */
    float *q;      /* [q_dim] */
    float *att;    /* [n_heads * n_ctx] */
    float *logits; /* [n_vocab] */
} flm_scratch;

struct flm_ctx {
    flm_model *model;
    flm_params params;
    const flm_kernels *k;
    flm_kv_cache kv;
    flm_scratch s;
    int32_t next_pos; /* the position flm_eval expects next (or 0 to restart) */
};

/* Bytes of scratch for these hyper-parameters and context length. */
uint64_t flm_scratch_bytes(const flm_hparams *hp, uint32_t n_ctx);
flm_status flm_scratch_init(flm_scratch *s, const flm_hparams *hp, uint32_t n_ctx, flm_error *err);
void flm_scratch_free(flm_scratch *s);

/* Dense FFN of one layer on in[d_model] -> out[d_model], weights resident: out = down(act(gate in) * (up in)).
 * hb/hb2 are [d_ffn] scratch. */
void flm_ffn_dense(const flm_kernels *k, const flm_hparams *hp, const flm_weight *up, const flm_weight *gate,
                   const flm_weight *down, const float *in, float *out, float *hb, float *hb2, int n_threads);

/* One token through the model: fills ctx->s.logits. */
flm_status flm_forward(flm_ctx *ctx, int32_t token, int32_t pos, flm_error *err);

#endif
