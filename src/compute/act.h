/* act.h — FFN activation functions (float32). Internal.
 * SiLU (SwiGLU: Llama, Qwen2), ReLU (ReGLU, ReLU-fied and synthetic models, OPT), GELU with the tanh approximation
 * (GeGLU: Gemma; Phi-2's gelu_new; PyTorch's gelu(approximate="tanh")), exact GELU with erf (Falcon: transformers'
 * "gelu", torch.nn.functional.gelu), squared ReLU (Persimmon: transformers' "relu2"). ReLU and squared ReLU are zero
 * exactly where x <= 0: their active set is x > 0. */
#ifndef FLM_COMPUTE_ACT_H
#define FLM_COMPUTE_ACT_H
#include <math.h>

typedef enum flm_act {
    FLM_ACT_SILU = 0,      /* x * sigmoid(x) */
    FLM_ACT_RELU = 1,      /* max(x, 0) */
    FLM_ACT_GELU_TANH = 2, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    FLM_ACT_GELU_ERF = 3,  /* 0.5 x (1 + erf(x / sqrt(2))) */
    FLM_ACT_RELU2 = 4,     /* max(x, 0)^2 */
} flm_act;

/* true when act(x) == 0 exactly for x <= 0 and act(x) > 0 for x > 0 (ReLU, squared ReLU): the neurons with a positive
 * pre-activation are the exact active set */
static inline int flm_act_relu_family(flm_act a) { return a == FLM_ACT_RELU || a == FLM_ACT_RELU2; }

/* act(x) */
static inline float flm_act_eval(flm_act a, float x) {
    switch (a) {
    case FLM_ACT_RELU: return x > 0.0f ? x : 0.0f;
    case FLM_ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(0.79788456080286535588f * x * (1.0f + 0.044715f * x * x)));
    case FLM_ACT_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
    case FLM_ACT_RELU2: return x > 0.0f ? x * x : 0.0f;
    default: return x / (1.0f + expf(-x));
    }
}

/* "silu", "relu", "gelu" (tanh), "gelu_erf", "relu2" */
static inline const char *flm_act_name(flm_act a) {
    switch (a) {
    case FLM_ACT_RELU: return "relu";
    case FLM_ACT_GELU_TANH: return "gelu";
    case FLM_ACT_GELU_ERF: return "gelu_erf";
    case FLM_ACT_RELU2: return "relu2";
    default: return "silu";
    }
}

#endif
