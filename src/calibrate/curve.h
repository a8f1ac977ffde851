/* curve.h — the quality curve of a calibrated model: perplexity against the bytes a token's FFN sets take from flash,
 * dense, then each stored level with the predictor and with the true active sets (the oracle), so the loss from the
 * threshold and the loss from the predictor show apart (docs/SPARSITY.md, "Quality curves"). Internal; `flashlm
 * perplexity --curve` prints it. */
#ifndef FLM_CALIBRATE_CURVE_H
#define FLM_CALIBRATE_CURVE_H
#include <stdbool.h>
#include <stdint.h>
#include "flashlm.h"
#include "format/flm.h"
#include "flashlm_tools.h"

/* flm_curve_point, flm_curve_opts, flm_curve_opts_default and flm_sparsity_curve are public:
 * include/flashlm_tools.h. */

#endif
