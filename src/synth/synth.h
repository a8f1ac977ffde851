/* synth.h — synthetic Llama-shaped GGUF models with random weights and realistic FFN activation statistics, for
 * benchmarking the flash path (`flashlm synth`). Internal. Design and measured numbers: docs/SYNTH.md.
 *
 * The files are standard llama GGUF files (llama.cpp loads the SiLU variant; the ReLU variant adds the one extension
 * key "flashlm.ffn_activation" = "relu"). The weights are random, so the text a model generates is meaningless: a
 * synthetic file measures the system (I/O, memory, kernels), never model quality.
 *
 * What is realistic is the FFN's activation sparsity (the property "LLM in a flash" exploits, Knowl 2): per layer,
 * neuron i fires (gate_i . x > 0) on a fraction p_i of tokens; the sorted p_i follow a Zipf-like power-law curve whose
 * mean is `active` (a few hot neurons, many that almost never fire); gate and up rows are low rank plus noise, so a
 * low-rank predictor of the FFN input can learn which neurons fire. The biases that set p_i are calibrated during
 * generation by running calibration tokens through the model as it is being written (docs/SYNTH.md, "Construction").
 * With arch FLM_SYNTH_ARCH_OPT the file is OPT-shaped instead (general.architecture "opt": LayerNorm with bias, learned
 * positions, biases, an ungated ReLU FFN); there the up biases set p_i (docs/SYNTH.md, "The OPT shape"). */
#ifndef FLM_MODEL_SYNTH_H
#define FLM_MODEL_SYNTH_H
#include <stdbool.h>
#include <stdint.h>
#include "flashlm.h"
#include "format/flm.h"
#include "model/model.h"
#include "compute/act.h"
#include "flashlm_tools.h"

/* flm_synth_params, flm_synth_activity and the functions that use them are public: include/flashlm_tools.h. */
_Static_assert(FLM_SYNTH_ACT_SILU == FLM_ACT_SILU && FLM_SYNTH_ACT_RELU == FLM_ACT_RELU, "flashlm_tools.h activations");

/* The target frequency curve: n per-neuron firing frequencies, sorted from hottest to coldest,
 * p_k = p_max (1 + u_k/u0)^-tail with u_k = (k + 0.5)/n, p_max = 0.5 + active/2, and u0 solved so that the mean is
 * active. out holds n values in (0, 1). Returns false when active is outside (0, 0.9] or tail <= 0. */
bool flm_synth_frequencies(double active, double tail, uint32_t n, double *out);

#endif
