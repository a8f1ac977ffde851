/* convert.h — `flashlm convert`: a GGUF model into the .flm flash layout (docs/FORMAT.md). Internal.
 * Sits above model/ (it loads the model to learn its architecture) and compute/ (it requantizes down columns);
 * format/ only parses and writes. */
#ifndef FLM_CONVERT_CONVERT_H
#define FLM_CONVERT_CONVERT_H
#include <stdint.h>
#include "flashlm.h"
#include "format/flm.h"

/* The type a down projection of type down_type is stored in, by columns, in the bundles: float types as they are
 * (exact); every quantized type as q8_0 along d_model. A quantized down matrix's blocks run along d_ffn, so a
 * neuron's column cannot be cut out of them; it is dequantized and requantized along d_model. q8_0 is chosen
 * because its error (1/254 of a block's largest magnitude) is far below that of the 4-6-bit source formats, so the
 * re-laid column adds almost nothing (measured: docs/FORMAT.md), and because its 32-element blocks fit every
 * d_model of the models we run (576, 640, 896: not multiples of the K-quants' 256). */
uint32_t flm_down_column_type(uint32_t down_type, uint32_t quantized_as);

/* Convert a GGUF model (any architecture and tensor type flm_model_from_gguf accepts) into dst. Writes "<dst>.tmp", fsyncs and renames
 * it onto dst only when complete; on any error removes the temporary file and leaves dst untouched.
 * Down columns of quantized matrices are re-quantized along d_model (flm_down_column_type), which changes their
 * values slightly; float types are copied exactly.
 * Errors: those of flm_gguf_open and flm_model_from_gguf, FLM_ERR_IO (write), FLM_ERR_NOMEM. */
flm_status flm_convert(const char *src, const char *dst, flm_progress_fn progress, void *user, flm_error *err);
/* What a conversion wrote (filled on success), so nothing has to be read back to report it. */
typedef struct flm_convert_info {
    uint64_t file_bytes;      /* the .flm */
    uint64_t src_bytes;       /* the GGUF */
    uint64_t resident_bytes;  /* the resident region's payload */
    uint64_t embd_bytes;      /* of which token_embd.weight's data, last (the tail: docs/FORMAT.md) */
    uint64_t ffn_bytes;       /* all FFN regions' payloads */
    uint32_t n_layers, n_records; /* FFN regions; records (neurons) per layer */
    uint64_t record_bytes;    /* bytes of one record of layer 0 */
    double seconds;           /* wall time, open to rename */
} flm_convert_info;

/* flm_convert with the type quantized down columns are stored in (quantized_as of flm_down_column_type): q8_0 (the
 * default), f16 (a near-exact copy of 4-6-bit source values at 2 bytes per element) or f32; info (may be NULL) gets
 * what was written. Every byte of the output is written once, sequentially (the resident GGUF too).
 * Errors: those of flm_convert, FLM_ERR_ARG for another type. */
flm_status flm_convert_ex(const char *src, const char *dst, uint32_t down_as, flm_progress_fn progress, void *user,
                          flm_convert_info *info, flm_error *err);

#endif
