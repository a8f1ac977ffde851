/* act.h — FFN activation functions (float32). Internal.
 * SiLU (SwiGLU: Llama, Qwen2), ReLU (ReGLU, ReLU-fied and synthetic models), GELU with the tanh approximation
 * (GeGLU: Gemma; PyTorch's gelu(approximate="tanh")). */
#ifndef FLM_COMPUTE_ACT_H
#define FLM_COMPUTE_ACT_H
#include <math.h>

typedef enum flm_act {
    FLM_ACT_SILU = 0,      /* x * sigmoid(x) */
    FLM_ACT_RELU = 1,      /* max(x, 0) */
    FLM_ACT_GELU_TANH = 2, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
} flm_act;

/* act(x) */
static inline float flm_act_eval(flm_act a, float x) {
    switch (a) {
    case FLM_ACT_RELU: return x > 0.0f ? x : 0.0f;
    case FLM_ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(0.79788456080286535588f * x * (1.0f + 0.044715f * x * x)));
    default: return x / (1.0f + expf(-x));
    }
}

/* "silu", "relu", "gelu" */
static inline const char *flm_act_name(flm_act a) {
    return a == FLM_ACT_RELU ? "relu" : a == FLM_ACT_GELU_TANH ? "gelu" : "silu";
}

#endif
