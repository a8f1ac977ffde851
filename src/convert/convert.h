/* convert.h — `flashlm convert`: a GGUF model into the .flm flash layout (docs/FORMAT.md). Internal.
 * Sits above model/ (it loads the model to learn its architecture) and compute/ (it requantizes down columns);
 * format/ only parses and writes. */
#ifndef FLM_CONVERT_CONVERT_H
#define FLM_CONVERT_CONVERT_H
#include <stdint.h>
#include "flashlm.h"
#include "format/flm.h"
#include "flashlm_tools.h"

/* The type a down projection of type down_type is stored in, by columns, in the bundles: float types as they are
 * (exact); every quantized type as q8_0 along d_model. A quantized down matrix's blocks run along d_ffn, so a
 * neuron's column cannot be cut out of them; it is dequantized and requantized along d_model. q8_0 is chosen
 * because its error (1/254 of a block's largest magnitude) is far below that of the 4-6-bit source formats, so the
 * re-laid column adds almost nothing (measured: docs/FORMAT.md), and because its 32-element blocks fit every
 * d_model of the models we run (576, 640, 896: not multiples of the K-quants' 256). */
uint32_t flm_down_column_type(uint32_t down_type, uint32_t quantized_as);

/* flm_convert, flm_convert_ex and flm_convert_info are public: include/flashlm_tools.h. */
#endif
